/* SPDX-License-Identifier: MIT */
/* The handshake's hello is hostile until checked: a table of bad hellos against the check, and
 * bad hellos played over the wire (by a raw provider endpoint) to both sides of the library. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/prov/prov.h"
#include "integ.h"

/* A hello that passes the check: what a default peer of this type sends. */
static struct exs_wire_hello good_hello(int type)
{
    struct exs_wire_hello h = {
        .magic = htobe16(EXS_WIRE_MAGIC),
        .version = EXS_WIRE_VERSION,
        .sock_type = type == SOCK_STREAM ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET,
        .features = htobe16(EXS_WIRE_FEAT_ALL),
        .credits = htobe16(64),
        .ctrl_size = htobe32(EXS_WIRE_CTRL_MAX),
        .ring_size = htobe32(1u << 20),
        .ring_addr = htobe64(0x7f0000100000ull),
        .ring_rkey = htobe32(0x1234),
        .eager_max = htobe32(4096),
        .max_msg = 0,
    };
    return h;
}

enum hf { HF_CREDITS, HF_CTRL, HF_RING, HF_ADDR, HF_EAGER, HF_MAXMSG, HF_MAGIC, HF_VERSION };

static const struct bad_hello {
    const char *what;
    int type; /* socket type checked against */
    enum hf field;
    uint64_t value;
    int reason; /* expected, 0 = accepted */
} bad_hellos[] = {
    {"good stream", SOCK_STREAM, HF_CREDITS, 64, 0},
    {"good seqpacket", SOCK_SEQPACKET, HF_CREDITS, 64, 0},
    {"credits 3", SOCK_STREAM, HF_CREDITS, 3, 0},
    {"credits 2", SOCK_SEQPACKET, HF_CREDITS, 2, EXS_WIRE_REJ_HELLO},
    {"credits 4095", SOCK_STREAM, HF_CREDITS, 4095, 0},
    {"credits 0", SOCK_STREAM, HF_CREDITS, 0, EXS_WIRE_REJ_HELLO},
    {"credits 1", SOCK_SEQPACKET, HF_CREDITS, 1, EXS_WIRE_REJ_HELLO},
    {"credits 4096", SOCK_STREAM, HF_CREDITS, 4096, EXS_WIRE_REJ_HELLO},
    {"credits 65535", SOCK_SEQPACKET, HF_CREDITS, 65535, EXS_WIRE_REJ_HELLO},
    {"ctrl_size 511", SOCK_STREAM, HF_CTRL, 511, EXS_WIRE_REJ_HELLO},
    {"ctrl_size 0", SOCK_SEQPACKET, HF_CTRL, 0, EXS_WIRE_REJ_HELLO},
    {"ctrl_size 64k", SOCK_STREAM, HF_CTRL, 65536, 0},
    {"ctrl_size 64k+1", SOCK_STREAM, HF_CTRL, 65537, EXS_WIRE_REJ_HELLO},
    {"ctrl_size 4G-1", SOCK_STREAM, HF_CTRL, 0xffffffffu, EXS_WIRE_REJ_HELLO},
    {"stream ring_size 0", SOCK_STREAM, HF_RING, 0, EXS_WIRE_REJ_HELLO},
    {"seqpacket ring_size 0, eager", SOCK_SEQPACKET, HF_RING, 0, EXS_WIRE_REJ_HELLO},
    {"ring_size 100", SOCK_STREAM, HF_RING, 100, EXS_WIRE_REJ_HELLO},
    {"ring_size 1G+64", SOCK_STREAM, HF_RING, (1u << 30) + 64, EXS_WIRE_REJ_HELLO},
    {"ring_size 4G-64", SOCK_SEQPACKET, HF_RING, 0xffffffc0u, EXS_WIRE_REJ_HELLO},
    {"ring_size 1G", SOCK_STREAM, HF_RING, 1u << 30, 0},
    {"ring_addr 0", SOCK_STREAM, HF_ADDR, 0, EXS_WIRE_REJ_HELLO},
    {"ring_addr odd", SOCK_STREAM, HF_ADDR, 0x7f0000100001ull, EXS_WIRE_REJ_HELLO},
    {"ring_addr 32-aligned", SOCK_SEQPACKET, HF_ADDR, 0x7f0000100020ull, EXS_WIRE_REJ_HELLO},
    {"ring wraps", SOCK_STREAM, HF_ADDR, 0xffffffffffffffc0ull, EXS_WIRE_REJ_HELLO},
    {"eager_max > ring", SOCK_SEQPACKET, HF_EAGER, (1u << 20) + 1, EXS_WIRE_REJ_HELLO},
    {"eager_max = ring", SOCK_SEQPACKET, HF_EAGER, 1u << 20, 0},
    {"max_msg < eager_max", SOCK_SEQPACKET, HF_MAXMSG, 4095, EXS_WIRE_REJ_HELLO},
    {"max_msg = eager_max", SOCK_SEQPACKET, HF_MAXMSG, 4096, 0},
    {"bad magic", SOCK_STREAM, HF_MAGIC, 0x4559, EXS_WIRE_REJ_VERSION},
    {"bad version", SOCK_STREAM, HF_VERSION, EXS_WIRE_VERSION + 1, EXS_WIRE_REJ_VERSION},
};

static void hello_set(struct exs_wire_hello *h, enum hf field, uint64_t v)
{
    switch (field) {
    case HF_CREDITS:
        h->credits = htobe16((uint16_t)v);
        break;
    case HF_CTRL:
        h->ctrl_size = htobe32((uint32_t)v);
        break;
    case HF_RING:
        h->ring_size = htobe32((uint32_t)v);
        break;
    case HF_ADDR:
        h->ring_addr = htobe64(v);
        break;
    case HF_EAGER:
        h->eager_max = htobe32((uint32_t)v);
        break;
    case HF_MAXMSG:
        h->max_msg = htobe32((uint32_t)v);
        break;
    case HF_MAGIC:
        h->magic = htobe16((uint16_t)v);
        break;
    case HF_VERSION:
        h->version = (uint8_t)v;
        break;
    }
}

/* Finding 6 of issue 10 and the rest of §2's rules, one row each. */
START_TEST(test_hello_check_table)
{
    for (size_t i = 0; i < sizeof(bad_hellos) / sizeof(bad_hellos[0]); i++) {
        const struct bad_hello *b = &bad_hellos[i];
        struct exs_wire_hello h = good_hello(b->type);
        int got;

        hello_set(&h, b->field, b->value);
        got = exs__conn_hello_check(&h, sizeof(h), b->type);
        ck_assert_msg(got == b->reason, "%s: hello check says %d, expected %d", b->what, got,
                      b->reason);
    }
    /* short and missing private data */
    struct exs_wire_hello h = good_hello(SOCK_STREAM);

    ck_assert_int_eq(exs__conn_hello_check(&h, EXS_WIRE_HELLO_LEN - 1, SOCK_STREAM),
                     EXS_WIRE_REJ_VERSION);
    ck_assert_int_eq(exs__conn_hello_check(NULL, 0, SOCK_STREAM), EXS_WIRE_REJ_VERSION);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_SEQPACKET), EXS_WIRE_REJ_SOCK_TYPE);
}
END_TEST

/* ---- a raw provider endpoint in this process plays the hostile peer ---- */

struct raw {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_listener *lis;
};

static void raw_open(struct raw *r)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 16, .max_recv_wr = 16, .rnr_retry = 7};

    memset(r, 0, sizeof(*r));
    ck_assert_int_eq(exs__prov_open_default(&(struct exs_prov_attr){0}, &r->ctx), 0);
    ck_assert_int_eq(exs__prov_ep_create(r->ctx, &attr, &r->ep), 0);
}

static void raw_close(struct raw *r)
{
    if (r->ep)
        exs__prov_ep_destroy(r->ep);
    if (r->lis)
        exs__prov_listener_destroy(r->lis);
    exs__prov_ctx_close(r->ctx);
}

/* Wait for the next cm event of the raw context (any type); asserts its type. */
static void raw_wait_cm(struct raw *r, enum exs_prov_cm_event_type type,
                        struct exs_prov_cm_event *ev)
{
    double end = it_now_ms() + IT_TIMEOUT_MS;
    int n;

    while ((n = exs__prov_cm_poll(r->ctx, ev)) == 0 && it_now_ms() < end)
        it_sleep_ms(1);
    ck_assert_msg(n == 1, "raw peer: no cm event within %d ms", IT_TIMEOUT_MS);
    ck_assert_msg(ev->type == type, "raw peer: cm event %d, expected %d", ev->type, type);
}

/* The passive side: a connect whose hello announces a STREAM ring of 0 bytes is refused
 * with reason 6 before any connection is built, and the listener keeps serving. */
START_TEST(test_hello_bad_connect_refused)
{
    struct sockaddr_in addr;
    struct exs_wire_hello h = good_hello(SOCK_STREAM);
    struct exs_wire_reject rej;
    struct exs_prov_cm_event ev;
    struct raw r;
    exs_qhandle_t q;
    int lfd;

    it_init();
    q = it_qcreate(8);
    lfd = it_listen(SOCK_STREAM, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    raw_open(&r);
    hello_set(&h, HF_RING, 0);
    ck_assert_int_eq(exs__prov_connect(r.ep, (struct sockaddr *)&addr, sizeof(addr), &h, sizeof(h)),
                     0);
    raw_wait_cm(&r, EXS_PROV_CM_REJECTED, &ev);
    ck_assert_uint_ge(ev.private_data_len, sizeof(rej));
    memcpy(&rej, ev.private_data, sizeof(rej));
    ck_assert_uint_eq(be16toh(rej.magic), EXS_WIRE_MAGIC);
    ck_assert_uint_eq(rej.reason, EXS_WIRE_REJ_HELLO);
    raw_close(&r);
    it_expect_no_event(q, 50); /* nothing was accepted */

    /* a good client still gets in */
    struct it_pair p = {0};
    int cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    exs_event_t cev;

    ck_assert_int_ge(cfd, 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    p.sfd = cev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    it_wait_event(q, EXS_EVT_CONNECT, cfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    it_close(cfd, q);
    it_close(p.sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* The active side: an accept whose hello announces a STREAM ring of 0 bytes (finding 6:
 * a division by zero on the first send) makes exs_connect fail with ECONNREFUSED; a send
 * on the socket then fails instead of crashing or stalling. Each bad field once. */
START_TEST(test_hello_bad_accept_refused)
{
    static const struct {
        enum hf field;
        uint64_t value;
    } bad[] = {
        {HF_RING, 0},  {HF_RING, 100},        {HF_CREDITS, 1},
        {HF_CTRL, 64}, {HF_ADDR, 0x10000001}, {HF_EAGER, 1u << 21},
    };

    it_init();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sockaddr_storage laddr;
        socklen_t llen = sizeof(laddr);
        struct sockaddr_in sin = {.sin_family = AF_INET};
        struct exs_wire_hello h = good_hello(SOCK_STREAM);
        struct exs_prov_cm_event ev;
        char buf[64] = {0};
        exs_qhandle_t q = it_qcreate(8);
        exs_event_t cev;
        struct raw r;
        int fd;

        it_context("bad field %d value %llu", (int)bad[i].field, (unsigned long long)bad[i].value);
        raw_open(&r);
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(
            exs__prov_listen(r.ctx, (struct sockaddr *)&sin, sizeof(sin), 4, NULL, &r.lis), 0);
        ck_assert_int_eq(exs__prov_listener_addr(r.lis, &laddr, &llen), 0);
        fd = exs_socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(fd, 0);
        IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&laddr, llen, q, IT_AH(1)));
        raw_wait_cm(&r, EXS_PROV_CM_CONNECT_REQUEST, &ev);
        /* the library's own hello passes the check */
        ck_assert_int_eq(exs__conn_hello_check(ev.private_data, ev.private_data_len, SOCK_STREAM),
                         0);
        hello_set(&h, bad[i].field, bad[i].value);
        ck_assert_int_eq(exs__prov_accept(ev.req, r.ep, &h, sizeof(h)), 0);
        it_wait_event(q, EXS_EVT_CONNECT, fd, &cev);
        ck_assert_int_eq(cev.exs_evt_errno, ECONNREFUSED);
        IT_EXPECT_FAIL(exs_send(fd, buf, sizeof(buf), 0, q, IT_AH(2), EXS_MHANDLE_UNREGISTERED),
                       ENOTCONN);
        it_close(fd, q);
        raw_close(&r);
        it_qdelete(q);
    }
}
END_TEST

Suite *integ_hello_suite(void)
{
    Suite *s = suite_create("integ_hello");
    TCase *tc = it_tcase("hello", 60);

    tcase_add_test(tc, test_hello_check_table);
    tcase_add_test(tc, test_hello_bad_connect_refused);
    tcase_add_test(tc, test_hello_bad_accept_refused);
    suite_add_tcase(s, tc);
    return s;
}
