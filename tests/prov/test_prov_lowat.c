/* SPDX-License-Identifier: MIT */
/* The tcp provider's SO_RCVLOWAT: the rest of a large payload wakes the reader once, and
 * the socket reads every byte again between payloads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

#define LEN   (1u << 20)
#define FIRST (128u << 10)
#define MORE  (256u << 10)

static uint64_t tcp_counter(const char *name)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup("prov.tcp", name, &v) == 0,
                  "counter prov.tcp.%s not registered", name);
    return v;
}

static uint64_t lowats(void)
{
    return tcp_counter("rx_lowats");
}

/* A peer sends a 1 MiB SEND's header and first 128 KiB, then 256 KiB more, then the
 * rest. The provider places what it finds (perhaps nothing: the header may come alone)
 * and, the socket drained half-way, raises SO_RCVLOWAT; the next 256 KiB, less than the
 * payload still owes, stay in the socket (not read); the rest completes the receive with every
 * byte right. Then a 64-byte SEND completes too: the socket wakes for any byte again. */
START_TEST(lowat_rest_of_payload)
{
    struct pt_pair p;
    struct pt_buf *tgt, *small;
    struct tcp_wire_hdr h;
    struct exs_prov_cqe c;
    uint8_t *payload = malloc(LEN);
    uint8_t tiny[64];
    uint64_t n0, rx0, rx;
    double deadline;
    int fd;

    ck_assert_ptr_nonnull(payload);
    if (pt_skip_unless_tcp("lowat_rest_of_payload")) {
        free(payload);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    tgt = pt_pair_buf(&p, 'b', LEN, EXS_PROV_ACCESS_LOCAL_WRITE, 0x5A);
    small = pt_pair_buf(&p, 'b', sizeof(tiny), EXS_PROV_ACCESS_LOCAL_WRITE, 0x5A);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, tgt, 0, LEN), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, small, 0, sizeof(tiny)), 0);
    pt_pattern(payload, LEN, 11);
    memset(payload + FIRST, 0x99, MORE);
    n0 = lowats();
    rx0 = tcp_counter("bytes_rx");

    h = pt_raw_hdr(TCP_WIRE_SEND, 0, LEN, 0, 0, 0, 0);
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    ck_assert_int_eq(pt_raw_send(fd, payload, FIRST), 0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (lowats() == n0 && pt_now_ms() < deadline)
        pt_sleep_ms(2);
    ck_assert_msg(lowats() > n0, "SO_RCVLOWAT not raised with most of a 1 MiB payload due");

    /* less than the payload still owes: not a byte of it is read (the target is not
     * looked at here: the NIC writes it later, through the socket, which a thread
     * sanitizer cannot see as an order). What is left of the first 128 KiB may still be
     * read now: the raise came after a short read, perhaps before all of it was in (the
     * receive window's size is the kernel's), and the kernel wakes the reader when its
     * window closes. So the bound is the header and the first 128 KiB, counted from before
     * the header was sent. */
    ck_assert_int_eq(pt_raw_send(fd, payload + FIRST, MORE), 0);
    pt_expect_no_cqe(&p.b, 100);
    rx = tcp_counter("bytes_rx") - rx0;
    ck_assert_msg(rx <= sizeof(h) + FIRST,
                  "%llu bytes of the next 256 KiB read before the rest of the payload came",
                  (unsigned long long)(rx - sizeof(h) - FIRST));

    ck_assert_int_eq(pt_raw_send(fd, payload + FIRST + MORE, LEN - FIRST - MORE), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, LEN);
    ck_assert_int_eq(memcmp(tgt->p, payload, LEN), 0);
    ck_assert(pt_buf_guards_ok(tgt));

    /* between payloads every byte wakes the reader again */
    memset(tiny, 0x42, sizeof(tiny));
    h = pt_raw_hdr(TCP_WIRE_SEND, 0, sizeof(tiny), 1, 0, 0, 0);
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    ck_assert_int_eq(pt_raw_send(fd, tiny, sizeof(tiny)), 0);
    pt_expect_cqe(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, sizeof(tiny));
    ck_assert_int_eq(memcmp(small->p, tiny, sizeof(tiny)), 0);

    close(fd);
    pt_pair_close(&p);
    free(payload);
}
END_TEST

Suite *prov_lowat_suite(void)
{
    Suite *s = suite_create("prov_lowat");
    TCase *tc = pt_tcase("lowat");

    tcase_add_test(tc, lowat_rest_of_payload);
    suite_add_tcase(s, tc);
    return s;
}
