/* SPDX-License-Identifier: MIT */
/* Hostile peers of the tcp provider: raw sockets sending garbage, bad handshakes and bad frames. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/prov/tcp/tcp_wire.h"
#include "exs/util/params.h"
#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

/* A normal connection through the same listener still works (fresh eb). */
static void normal_connection_works(struct pt_pair *p)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *src = pt_pair_buf(p, 'a', 64, LW, 0x3C), *dst = pt_pair_buf(p, 'b', 64, LW, 0);
    struct exs_prov_cqe c;

    if (p->eb)
        pt_ep_close(&p->b, p->eb);
    ck_assert_int_eq(pt_ops->ep_create(p->b.ctx, &at, &p->eb), 0);
    p->b_up = 0;
    pt_pair_connect(p);
    ck_assert_int_eq(pt_post_recv(p->eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p->ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p->b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 64);
    ck_assert(pt_all_bytes(dst->p, 64, 0x3C));
    pt_expect_cqe(&p->a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
}

/* Send bytes before any handshake; the provider must drop the socket, tell the
 * application nothing, and keep serving. */
static void pre_handshake_case(const char *test, const void *bytes, size_t len, int keep_open)
{
    struct pt_pair p;
    int fd;

    if (pt_skip_unless_tcp(test))
        return;
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_connect(&p);
    (void)pt_raw_send(fd, bytes, len);
    pt_expect_no_cm(&p.b, 300);
    if (keep_open) {
        /* the half-open raw connection must not block a normal one */
        normal_connection_works(&p);
        close(fd);
        pt_expect_no_cm(&p.b, 200);
    } else {
        ck_assert_msg(pt_raw_closed_within(fd, 5000), "%s: provider kept the bad connection open",
                      test);
        close(fd);
        normal_connection_works(&p);
    }
    pt_pair_close(&p);
}

START_TEST(hostile_garbage)
{
    char junk[300];

    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (char)(i * 37 + 11);
    pre_handshake_case("hostile_garbage", junk, sizeof(junk), 0);
}
END_TEST

START_TEST(hostile_bad_magic)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN, 0, 0, 0, 0);
    uint8_t buf[TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN] = {0};

    h.magic = htonl(0x12345678);
    memcpy(buf, &h, sizeof(h));
    pre_handshake_case("hostile_bad_magic", buf, sizeof(buf), 0);
}
END_TEST

START_TEST(hostile_truncated_handshake)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN + 56, 0, 0, 0, 0);
    uint8_t buf[TCP_WIRE_HDR_LEN + 20] = {0};

    memcpy(buf, &h, sizeof(h));
    pre_handshake_case("hostile_truncated_handshake", buf, sizeof(buf), 1);
}
END_TEST

START_TEST(hostile_truncated_header)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN, 0, 0, 0, 0);

    pre_handshake_case("hostile_truncated_header", &h, 13, 1);
}
END_TEST

START_TEST(hostile_oversized_private_data)
{
    size_t n = TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN + 4096;
    uint8_t *buf = calloc(1, n);
    struct tcp_wire_hdr h =
        pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN + 100000, 0, 0, 0, 0);

    ck_assert_ptr_nonnull(buf);
    memcpy(buf, &h, sizeof(h));
    memset(buf + TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN, 0x61, 4096);
    pre_handshake_case("hostile_oversized_private_data", buf, n, 0);
    free(buf);
}
END_TEST

START_TEST(hostile_data_before_handshake)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 0xFFFFFFF0u, 0, 0x1000, 0x100, 0);

    pre_handshake_case("hostile_data_before_handshake", &h, sizeof(h), 0);
}
END_TEST

/* ---- the hello deadline: a plain TCP client gets a prompt reset ---- */

static uint64_t hello_refused(const struct pt_pair *p)
{
    return __atomic_load_n(&tcp_ctx_of(p->b.ctx)->cnt.hello_refused, __ATOMIC_RELAXED);
}

/* fd (a raw client) is reset by the provider, once. */
static void hello_expect_reset(const struct pt_pair *p, int fd, const char *what)
{
    int end = pt_raw_end_within(fd, PT_TIMEOUT_MS);

    ck_assert_msg(end == ECONNRESET, "%s: %s, expected a reset", what,
                  end > 0    ? strerror(end)
                  : end == 0 ? "EOF (a FIN)"
                             : "still open");
    ck_assert_uint_eq(hello_refused(p), 1);
    close(fd);
}

/* After the refused client: nothing reached the application, the next client is served,
 * nothing more was refused. */
static void hello_case_end(struct pt_pair *p)
{
    pt_expect_no_cm(&p->b, 100);
    normal_connection_works(p);
    ck_assert_uint_eq(hello_refused(p), 1);
    pt_pair_close(p);
    exs__params_set("tcp_hello_ms", exs__params_find("tcp_hello_ms")->defval);
}

/* A client that connects and says nothing (nc, a health check, a stalled client) is reset
 * at the hello deadline (EXS_TCP_HELLO_MS, short here) rather than left hanging; counted
 * and logged; the next, real, client is served. (The old provider closed it with a FIN
 * after 10 s.) */
START_TEST(hello_silent_client_reset)
{
    struct pt_pair p;
    double t0, ms;
    int fd;

    if (pt_skip_unless_tcp_itself("hello_silent_client_reset"))
        return;
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "300"), 0);
    pt_pair_open(&p, NULL, NULL);
    t0 = pt_now_ms();
    fd = pt_raw_connect(&p);
    hello_expect_reset(&p, fd, "silent client");
    ms = pt_now_ms() - t0;
    printf("hello_silent_client_reset: reset after %.0f ms\n", ms);
    ck_assert_msg(ms >= 250, "reset after %.0f ms, before the 300 ms deadline", ms);
    hello_case_end(&p);
}
END_TEST

/* A client that speaks another protocol (here a short HTTP request, shorter than a frame
 * header) is reset as soon as its first bytes show it is no exs peer: the deadline is an
 * hour, so only the early check can end it. (The old provider waited for a whole header.) */
START_TEST(hello_foreign_client_reset)
{
    static const char req[] = "GET / HTTP/1.0\r\n\r\n";
    struct pt_pair p;
    int fd;

    if (pt_skip_unless_tcp_itself("hello_foreign_client_reset"))
        return;
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "3600000"), 0);
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_connect(&p);
    ck_assert_int_eq(pt_raw_send(fd, req, sizeof(req) - 1), 0);
    hello_expect_reset(&p, fd, "foreign client");
    /* a CONN_REQ cut after its first bytes is not refused early: only the deadline ends it */
    {
        struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN, 0, 0, 0, 0);

        fd = pt_raw_connect(&p);
        ck_assert_int_eq(pt_raw_send(fd, &h, 11), 0);
        ck_assert_int_eq(pt_raw_end_within(fd, 300), -1);
        close(fd);
    }
    hello_case_end(&p);
}
END_TEST

/* The prefix check against every header byte that can decide it. */
START_TEST(hello_prefix_check)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN + 200, 0, 0, 0, 0);
    uint8_t b[TCP_WIRE_HDR_LEN];

    if (pt_skip_unless_tcp_itself("hello_prefix_check"))
        return;
    memcpy(b, &h, sizeof(b));
    for (uint32_t n = 0; n < TCP_WIRE_HDR_LEN; n++)
        ck_assert_msg(exs__tcp_hello_prefix_ok(b, n), "a valid CONN_REQ refused at %u bytes", n);
    for (uint32_t i = 0; i < 11; i++) {
        uint8_t bad[TCP_WIRE_HDR_LEN];

        memcpy(bad, b, sizeof(bad));
        bad[i] ^= i == 10 ? 0x02 : 0x40; /* byte 10: a length of 512 or more */
        ck_assert_msg(exs__tcp_hello_prefix_ok(bad, i), "refused before byte %u came", i);
        ck_assert_msg(!exs__tcp_hello_prefix_ok(bad, i + 1), "byte %u changed, not refused", i);
    }
    ck_assert(!exs__tcp_hello_prefix_ok((const uint8_t *)"GET ", 1));
    ck_assert(!exs__tcp_hello_prefix_ok((const uint8_t *)"\x16\x03\x01", 3)); /* TLS */
}
END_TEST

/* ---- frames after a valid handshake ---- */

struct raw_conn {
    int fd;
    struct pt_buf *tgt; /* 4096 B, LOCAL_WRITE | REMOTE_WRITE, filled with 0x5A */
    struct pt_buf *rbuf;
};

/* Complete a handshake from a raw socket, accept it onto p->eb (with one receive
 * posted and a registered target region). */
static void raw_establish(struct pt_pair *p, struct raw_conn *rc)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN + 4, 0, 0, 0, 0);
    struct tcp_wire_conn cb = {.rnr_retry = 7, .rnr_timer_ms = 0};
    uint8_t buf[TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN + 4];
    struct tcp_wire_hdr ah;
    struct exs_prov_cm_event ev;
    uint8_t pd[TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX];

    rc->tgt = pt_pair_buf(p, 'b', 4096, LW | RW, 0x5A);
    rc->rbuf = pt_pair_buf(p, 'b', 64, LW, 0x22);
    ck_assert_int_eq(pt_post_recv(p->eb, 77, rc->rbuf, 0, 64), 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + TCP_WIRE_HDR_LEN, &cb, sizeof(cb));
    memcpy(buf + TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN, "RAW!", 4);
    rc->fd = pt_raw_connect(p);
    ck_assert_int_eq(pt_raw_send(rc->fd, buf, sizeof(buf)), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_uint_eq(ev.private_data_len, 4);
    ck_assert(memcmp(ev.private_data, "RAW!", 4) == 0);
    ck_assert_int_eq(pt_ops->accept(ev.req, p->eb, NULL, 0), 0);
    ck_assert_msg(pt_raw_recv(rc->fd, &ah, sizeof(ah), PT_TIMEOUT_MS) == 0, "no CONN_ACCEPT frame");
    ck_assert_uint_eq(ntohl(ah.magic), TCP_WIRE_MAGIC);
    ck_assert_uint_eq(ah.type, TCP_WIRE_CONN_ACCEPT);
    ck_assert_uint_ge(ntohl(ah.len), TCP_WIRE_CONN_LEN);
    ck_assert_uint_le(ntohl(ah.len), sizeof(pd));
    ck_assert_int_eq(pt_raw_recv(rc->fd, pd, ntohl(ah.len), PT_TIMEOUT_MS), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    p->b_up = 1;
}

/* After a hostile frame: eb DISCONNECTED (status want, or any when want == 1) and
 * ERROR, its receive flushed, the region and its neighbours untouched. */
static void expect_dropped(struct pt_pair *p, struct raw_conn *rc, int want)
{
    struct exs_prov_cm_event ev;

    pt_wait_cm(&p->b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    if (want != 1)
        ck_assert_msg(ev.status == want, "DISCONNECTED status %d, expected %d", ev.status, want);
    else
        ck_assert_msg(ev.status < 0, "DISCONNECTED status %d, expected an error", ev.status);
    ck_assert_int_eq(pt_ops->ep_state(p->eb), EXS_PROV_EP_ERROR);
    pt_expect_cqe(&p->b, 77, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_msg(pt_all_bytes(rc->tgt->p, rc->tgt->len, 0x5A), "target region modified");
    ck_assert_msg(pt_buf_guards_ok(rc->tgt), "bytes around the target region modified");
    ck_assert(pt_all_bytes(rc->rbuf->p, 64, 0x22));
    ck_assert_msg(pt_raw_closed_within(rc->fd, 5000), "provider kept the connection open");
    close(rc->fd);
}

START_TEST(hostile_raw_valid_write)
{
    /* Control: a well-formed WRITE from the raw peer lands (the frames below are built right). */
    struct pt_pair p;
    struct raw_conn rc;
    uint8_t buf[TCP_WIRE_HDR_LEN + 16];
    struct tcp_wire_hdr h;
    struct exs_prov_cqe c;

    if (pt_skip_unless_tcp("hostile_raw_valid_write"))
        return;
    pt_pair_open(&p, NULL, NULL);
    raw_establish(&p, &rc);
    h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 16, 0, pt_raddr(rc.tgt, 100), rc.tgt->mr->rkey, 0);
    memcpy(buf, &h, sizeof(h));
    memset(buf + TCP_WIRE_HDR_LEN, 0x99, 16);
    ck_assert_int_eq(pt_raw_send(rc.fd, buf, sizeof(buf)), 0);
    /* a SEND behind it: its receive completion says the WRITE before it was placed (the
     * target memory is read only after that completion, never while the NIC writes it) */
    h = pt_raw_hdr(TCP_WIRE_SEND, 0, 4, 1, 0, 0, 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + TCP_WIRE_HDR_LEN, "DONE", 4);
    ck_assert_int_eq(pt_raw_send(rc.fd, buf, TCP_WIRE_HDR_LEN + 4), 0);
    pt_expect_cqe(&p.b, 77, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 4);
    ck_assert(memcmp(rc.rbuf->p, "DONE", 4) == 0);
    ck_assert_msg(pt_all_bytes(rc.tgt->p + 100, 16, 0x99), "valid raw WRITE did not land");
    ck_assert(pt_all_bytes(rc.tgt->p, 100, 0x5A) &&
              pt_all_bytes(rc.tgt->p + 116, 4096 - 116, 0x5A));
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_CONNECTED);
    /* an orderly DISCONNECT frame ends it with status 0 */
    h = pt_raw_hdr(TCP_WIRE_DISCONNECT, 0, 0, 0, 0, 0, 0);
    ck_assert_int_eq(pt_raw_send(rc.fd, &h, sizeof(h)), 0);
    {
        struct exs_prov_cm_event ev;

        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_int_eq(ev.status, 0);
    }
    close(rc.fd);
    normal_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

static void hostile_frame_case(const char *test, int kind)
{
    struct pt_pair p;
    struct raw_conn rc;
    struct tcp_wire_hdr h;
    uint8_t *buf;
    size_t plen = 64;
    int want = -EPROTO;

    if (pt_skip_unless_tcp(test))
        return;
    pt_pair_open(&p, NULL, NULL);
    raw_establish(&p, &rc);
    switch (kind) {
    case 0: /* WRITE running past the region's end */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 64, 0, pt_raddr(rc.tgt, 4096 - 16), rc.tgt->mr->rkey, 0);
        want = 1; /* an access error, not necessarily a protocol error */
        break;
    case 1: /* WRITE starting before the region */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 64, 0, pt_raddr(rc.tgt, 0) - 32, rc.tgt->mr->rkey, 0);
        want = 1;
        break;
    case 2: /* WRITE whose address wraps */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 64, 0, UINT64_MAX - 8, rc.tgt->mr->rkey, 0);
        want = 1;
        break;
    case 3: /* WRITE with a huge length */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 0xFFFFFFF0u, 0, pt_raddr(rc.tgt, 0), rc.tgt->mr->rkey, 0);
        plen = 8192;
        break;
    case 4: /* bad opcode */
        h = pt_raw_hdr(0x7F, 0, 0, 0, 0, 0, 0);
        break;
    case 5: /* request out of sequence */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 64, 5, pt_raddr(rc.tgt, 0), rc.tgt->mr->rkey, 0);
        break;
    case 6: /* READ_RESP nobody asked for, aimed at the region */
        h = pt_raw_hdr(TCP_WIRE_READ_RESP, 0, 64, 0, pt_raddr(rc.tgt, 0), rc.tgt->mr->rkey, 0);
        break;
    case 7: /* unknown flag bits */
        h = pt_raw_hdr(TCP_WIRE_WRITE, 0x80, 64, 0, pt_raddr(rc.tgt, 0), rc.tgt->mr->rkey, 0);
        break;
    default: /* SEND longer than max_msg_size */
        h = pt_raw_hdr(TCP_WIRE_SEND, 0, 0xFFFFFFFFu, 0, 0, 0, 0);
        plen = 8192;
        break;
    }
    buf = malloc(TCP_WIRE_HDR_LEN + plen);
    ck_assert_ptr_nonnull(buf);
    memcpy(buf, &h, sizeof(h));
    memset(buf + TCP_WIRE_HDR_LEN, 0xCC, plen);
    (void)pt_raw_send(rc.fd, buf, TCP_WIRE_HDR_LEN + plen);
    free(buf);
    expect_dropped(&p, &rc, want);
    normal_connection_works(&p);
    pt_pair_close(&p);
}

START_TEST(hostile_write_past_end)
{
    hostile_frame_case("hostile_write_past_end", 0);
}
END_TEST

START_TEST(hostile_write_before_start)
{
    hostile_frame_case("hostile_write_before_start", 1);
}
END_TEST

START_TEST(hostile_write_wraps)
{
    hostile_frame_case("hostile_write_wraps", 2);
}
END_TEST

START_TEST(hostile_write_huge_length)
{
    hostile_frame_case("hostile_write_huge_length", 3);
}
END_TEST

START_TEST(hostile_bad_opcode)
{
    hostile_frame_case("hostile_bad_opcode", 4);
}
END_TEST

START_TEST(hostile_out_of_sequence)
{
    hostile_frame_case("hostile_out_of_sequence", 5);
}
END_TEST

START_TEST(hostile_unsolicited_read_resp)
{
    hostile_frame_case("hostile_unsolicited_read_resp", 6);
}
END_TEST

START_TEST(hostile_bad_flags)
{
    hostile_frame_case("hostile_bad_flags", 7);
}
END_TEST

START_TEST(hostile_send_too_long)
{
    hostile_frame_case("hostile_send_too_long", 8);
}
END_TEST

START_TEST(hostile_peer_vanishes_mid_frame)
{
    /* A WRITE header and half its payload, then the socket closes: DISCONNECTED, and
     * whatever partial data was placed stays inside the region. */
    struct pt_pair p;
    struct raw_conn rc;
    struct tcp_wire_hdr h;
    uint8_t buf[TCP_WIRE_HDR_LEN + 512];
    struct exs_prov_cm_event ev;

    if (pt_skip_unless_tcp("hostile_peer_vanishes_mid_frame"))
        return;
    pt_pair_open(&p, NULL, NULL);
    raw_establish(&p, &rc);
    h = pt_raw_hdr(TCP_WIRE_WRITE, 0, 1024, 0, pt_raddr(rc.tgt, 1024), rc.tgt->mr->rkey, 0);
    memcpy(buf, &h, sizeof(h));
    memset(buf + TCP_WIRE_HDR_LEN, 0xCC, 512);
    ck_assert_int_eq(pt_raw_send(rc.fd, buf, sizeof(buf)), 0);
    close(rc.fd);
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.eb);
    ck_assert_msg(ev.status < 0, "DISCONNECTED status %d, expected an error", ev.status);
    pt_expect_cqe(&p.b, 77, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(rc.tgt->p, 1024, 0x5A));
    ck_assert(pt_all_bytes(rc.tgt->p + 2048, 2048, 0x5A));
    ck_assert(pt_buf_guards_ok(rc.tgt));
    normal_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

/* ---- the state tables (spec/provider-tcp.md, "States") ---- */

/* The transition tables are the spec's: every pair checked, in and out. */
START_TEST(states_tables)
{
    static const char *conn_ok[] = {
        "CONNECTING WAIT_REPLY", "CONNECTING DEAD", "WAIT_REPLY UP", "WAIT_REPLY DEAD",
        "WAIT_REQ PENDING",      "WAIT_REQ DEAD",   "PENDING UP",    "PENDING LINGER",
        "PENDING DEAD",          "UP LINGER",       "UP DEAD",       "LINGER DEAD",
    };
    /* IDLE CONNECTING CONNECTED ERROR */
    static const int ep_ok[4][4] = {{0, 1, 1, 1}, {1, 0, 1, 1}, {0, 0, 0, 1}, {0, 0, 0, 1}};
    int legal = 0;

    if (pt_skip_unless_tcp_itself("states_tables"))
        return;
    for (int from = TCP_CONN_CONNECTING; from <= TCP_CONN_DEAD; from++) {
        for (int to = TCP_CONN_CONNECTING; to <= TCP_CONN_DEAD; to++) {
            char pair[64];
            int want = 0;

            snprintf(pair, sizeof(pair), "%s %s", exs__tcp_conn_state_str(from),
                     exs__tcp_conn_state_str(to));
            for (size_t i = 0; i < sizeof(conn_ok) / sizeof(conn_ok[0]); i++)
                want |= strcmp(pair, conn_ok[i]) == 0;
            ck_assert_msg(exs__tcp_conn_state_legal(from, to) == want, "conn %s: %d", pair, !want);
            legal += want;
        }
    }
    ck_assert_int_eq(legal, (int)(sizeof(conn_ok) / sizeof(conn_ok[0])));
    ck_assert(!exs__tcp_conn_state_legal(TCP_CONN_DEAD + 1, TCP_CONN_DEAD));
    for (int from = 0; from < 4; from++)
        for (int to = 0; to < 4; to++)
            ck_assert_msg(exs__tcp_ep_state_legal(from, to) == ep_ok[from][to], "ep %d -> %d", from,
                          to);
}
END_TEST

/* A transition outside the tables fails the object cleanly (never a crash, never the
 * illegal state): the ep goes to ERROR with its receives flushed and one DISCONNECTED,
 * the connection is closed (the peer sees its end), and the listener serves on. */
START_TEST(states_illegal_fails_cleanly)
{
    struct pt_pair p;
    struct pt_buf *dst;
    struct exs_prov_cm_event ev;
    struct exs_prov_ep_attr at;
    struct tcp_ctx *tb;
    struct tcp_conn *conn;
    int ret;

    if (pt_skip_unless_tcp_itself("states_illegal_fails_cleanly"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 5, dst, 0, 64), 0);
    tb = tcp_ctx_of(p.b.ctx);
    pthread_mutex_lock(&tb->nic_lock);
    ret = exs__tcp_ep_set_state(tcp_ep_of(p.eb), EXS_PROV_EP_CONNECTING, "test: illegal");
    pthread_mutex_unlock(&tb->nic_lock);
    ck_assert_int_eq(ret, -EPROTO);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, 5000, &ev);
    ck_assert_int_eq(ev.status, -EPROTO);
    pt_expect_cqe(&p.b, 5, EXS_PROV_WC_WR_FLUSH_ERR, EXS_PROV_WC_RECV, NULL);
    ck_assert_uint_eq(tb->cnt.state_errors, 1);

    /* a connection: UP -> PENDING closes it; the peer's ep learns it */
    pthread_mutex_lock(&tb->nic_lock);
    conn = tcp_ep_of(p.eb)->conn;
    ret = conn ? exs__tcp_conn_set_state(conn, TCP_CONN_PENDING, "test: illegal") : -ENOENT;
    pthread_mutex_unlock(&tb->nic_lock);
    ck_assert_int_eq(ret, -EPROTO);
    pt_wait_cm(&p.a, EXS_PROV_CM_DISCONNECTED, 5000, &ev);
    ck_assert_uint_eq(tb->cnt.state_errors, 2);
    tb->cnt.state_errors = 0; /* pt_ctx_close asserts none */
    p.a_up = p.b_up = 0;
    pt_ops->ep_destroy(p.ea);
    at = pt_default_attr();
    ck_assert_int_eq(pt_ops->ep_create(p.a.ctx, &at, &p.ea), 0);
    normal_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_hostile_suite(void)
{
    Suite *s = suite_create("prov_hostile");
    TCase *tc = pt_tcase("handshake");

    tcase_add_test(tc, hostile_garbage);
    tcase_add_test(tc, hostile_bad_magic);
    tcase_add_test(tc, hostile_truncated_handshake);
    tcase_add_test(tc, hostile_truncated_header);
    tcase_add_test(tc, hostile_oversized_private_data);
    tcase_add_test(tc, hostile_data_before_handshake);
    suite_add_tcase(s, tc);
    tc = pt_tcase("frames");
    tcase_add_test(tc, hostile_raw_valid_write);
    tcase_add_test(tc, hostile_write_past_end);
    tcase_add_test(tc, hostile_write_before_start);
    tcase_add_test(tc, hostile_write_wraps);
    tcase_add_test(tc, hostile_write_huge_length);
    tcase_add_test(tc, hostile_bad_opcode);
    tcase_add_test(tc, hostile_out_of_sequence);
    tcase_add_test(tc, hostile_unsolicited_read_resp);
    tcase_add_test(tc, hostile_bad_flags);
    tcase_add_test(tc, hostile_send_too_long);
    tcase_add_test(tc, hostile_peer_vanishes_mid_frame);
    suite_add_tcase(s, tc);
    tc = pt_tcase("hello");
    tcase_add_test(tc, hello_silent_client_reset);
    tcase_add_test(tc, hello_foreign_client_reset);
    tcase_add_test(tc, hello_prefix_check);
    suite_add_tcase(s, tc);
    tc = pt_tcase("states");
    tcase_add_test(tc, states_tables);
    tcase_add_test(tc, states_illegal_fails_cleanly);
    suite_add_tcase(s, tc);
    return s;
}
