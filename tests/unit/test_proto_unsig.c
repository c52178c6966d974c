/* SPDX-License-Identifier: MIT */
/* Unsignaled small sends (spec/protocol.md §6.4) over the mock provider: the event at post,
 * the order of events, the slots' retirement, errors and flushes, the drain's fence, the
 * off switch. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/conn.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/params.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

/* The process counters of proto (exsctl counters proto) */
#define un_cnt(_name) exs__proto_counter(#_name)

/* A connected pair of sock_type with unsignaled sends on (on) or off. A STREAM sender
 * has a send buffer for sends of up to 64 bytes when sndbuf (un_open: always): only its
 * copies may go unsignaled (a zero-copy send keeps its promise, §6.4). */
static void un_open_buf(int sock_type, int on, int sndbuf)
{
    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    exs__params.send_unsignaled = (uint64_t)on;
    pt_params(&pp.pa, sock_type);
    pt_params(&pp.pb, sock_type);
    if (sock_type == SOCK_STREAM && sndbuf) {
        pp.pa.sndbuf = 4096;
        pp.pa.copy_max = 64;
    }
    pt_open(&pp, sock_type);
    pt_connect(&pp);
}

static void un_open(int sock_type, int on)
{
    un_open_buf(sock_type, on, 1);
}

static void un_close(void)
{
    pt_close_both(&pp);
    exs__params.send_unsignaled = 0;
}

/*
 * A 64-byte send, after an answer came (the handshake's records), goes unsignaled: its
 * event is handed back by the post itself, before the fabric moved or any completion was
 * polled; nothing of it counts in wr_out or ring_wr_out; the bytes arrive. With the
 * switch off (EXS_SEND_UNSIGNALED=0) the same send waits for its completion (a STREAM
 * copy's send is done at its copy either way; its write is then counted in wr_out).
 * Looped: SEQPACKET on, STREAM on, SEQPACKET off, STREAM off. Loop 4: a zero-copy STREAM
 * send (no send buffer) with the switch on stays signaled (§6.4).
 */
START_TEST(un_event_at_post)
{
    int sp = _i % 2 == 0, on = _i < 2;
    static uint8_t sb[64], rb[64];
    struct pt_op s, r;
    struct exs_sock_stats st;
    uint64_t n0, wr_out;

    if (_i == 4) {
        /* a zero-copy STREAM sender (no send buffer), the switch on */
        sp = 0;
        on = 0;
        un_open_buf(SOCK_STREAM, 1, 0);
        ck_assert_uint_eq(pp.a.conn->p.sndbuf, 0);
    } else {
        un_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, on);
    }
    ck_assert_int_eq(pp.a.conn->quiet_armed, 1); /* the handshake's records came */
    n0 = un_cnt(sends_unsignaled);
    wr_out = pp.a.conn->wr_out;
    pt_send_pattern(&s, &pp.a, sb, 64, 7);
    if (on) {
        pt_assert_done(&s, 64, 0); /* before any step or poll */
        ck_assert_uint_eq(un_cnt(sends_unsignaled), n0 + 1);
        ck_assert_uint_eq(pp.a.conn->wr_out, wr_out);
        ck_assert_uint_eq(pp.a.conn->ring_wr_out, 0);
        ck_assert_uint_eq(pp.a.conn->quiet_armed, 0);
        pt_stats(&pp.a, &st);
        ck_assert_uint_eq(st.bytes_sent, 64);
    } else {
        ck_assert_int_eq(s.done, !sp && _i != 4); /* a copy is done at once */
        ck_assert_uint_eq(un_cnt(sends_unsignaled), n0);
        ck_assert_uint_eq(pp.a.conn->wr_out, wr_out + 1);
    }
    pt_recv_post(&r, &pp.b, rb, 64, 0);
    pt_run(&pp);
    pt_assert_done(&s, 64, 0);
    pt_assert_done(&r, 64, 0);
    ck_assert(pt_check(rb, 64, 7));
    ck_assert_uint_eq(pp.a.conn->wr_out, wr_out);
    pt_op_fini(&s);
    pt_op_fini(&r);
    un_close();
}
END_TEST

/*
 * Order of events: a small send behind a large one still on the wire (signaled, not
 * inline) is not done at post, since its event would precede the earlier send's; both
 * are handed back in posting order once the large one completes; when the link dies
 * instead, both fail. Looped: SEQPACKET (the large one announced), STREAM, SEQPACKET
 * with the link dropped.
 */
START_TEST(un_order_behind_signaled)
{
    int sp = _i != 1;
    static uint8_t big[3000], sb[64], rb[3000], rb2[64];
    struct pt_op s[2], r[2];

    un_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 1);
    pt_send_pattern(&s[0], &pp.a, big, sizeof(big), 0);
    pt_send_pattern(&s[1], &pp.a, sb, sizeof(sb), sizeof(big));
    ck_assert_int_eq(s[0].done, 0);
    ck_assert_int_eq(s[1].done, 0);
    if (_i == 2) {
        /* the link dies: the small send behind fails with the large one; had it gone
         * unsignaled it would have succeeded behind a failed send */
        mock_drop(pp.a.conn->ep);
        pt_run(&pp);
        ck_assert_int_eq(s[0].done, 1);
        ck_assert_int_eq(s[1].done, 1);
        ck_assert_int_eq(s[0].op.result, -1);
        ck_assert_int_eq(s[1].op.result, -1);
        ck_assert_uint_lt(s[0].order, s[1].order);
        pt_op_fini(&s[0]);
        pt_op_fini(&s[1]);
        un_close();
        return;
    }
    pt_recv_post(&r[0], &pp.b, rb, sizeof(rb), sp ? 0 : MSG_WAITALL);
    pt_recv_post(&r[1], &pp.b, rb2, sizeof(rb2), sp ? 0 : MSG_WAITALL);
    pt_run(&pp);
    pt_assert_done(&s[0], (ssize_t)sizeof(big), 0);
    pt_assert_done(&s[1], (ssize_t)sizeof(sb), 0);
    ck_assert_uint_lt(s[0].order, s[1].order);
    pt_assert_done(&r[0], (ssize_t)sizeof(rb), 0);
    pt_assert_done(&r[1], (ssize_t)sizeof(rb2), 0);
    ck_assert(pt_check(rb, sizeof(rb), 0));
    ck_assert(pt_check(rb2, sizeof(rb2), sizeof(big)));
    for (int i = 0; i < 2; i++) {
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    un_close();
}
END_TEST

#define ROUNDS 200

/* One 64-byte message from one side to the other, received and checked. */
static void un_one(struct pt_side *from, struct pt_side *to, uint64_t off)
{
    static uint8_t sb[64], rb[64];
    struct pt_op s, r;

    pt_recv_post(&r, to, rb, 64, 0);
    pt_send_pattern(&s, from, sb, 64, off);
    pt_run(&pp);
    pt_assert_done(&s, 64, 0);
    pt_assert_done(&r, 64, 0);
    ck_assert(pt_check(rb, 64, off));
    pt_op_fini(&s);
    pt_op_fini(&r);
    ck_assert_int_eq(from->conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_le(from->conn->quiet_live, EXS_QUIET_MAX);
}

/*
 * A long ping-pong of small messages: each side's sends go unsignaled (the control
 * records returning credits are signaled and retire their slots); every message
 * arrives whole, every event comes once, no connection fails.
 */
START_TEST(un_pingpong_retires)
{
    uint64_t n0;

    un_open(SOCK_SEQPACKET, 1);
    n0 = un_cnt(sends_unsignaled);
    for (int i = 0; i < ROUNDS; i++) {
        un_one(&pp.a, &pp.b, (uint64_t)i);
        un_one(&pp.b, &pp.a, 1000u + (uint64_t)i);
    }
    ck_assert_uint_ge(un_cnt(sends_unsignaled) - n0, 2 * ROUNDS * 3 / 4);
    un_close();
}
END_TEST

/*
 * One way, an answer before each send (forced), and nothing signaled of the sender's
 * own: at least every EXS_QUIET_MAX-th write goes signaled so that the provider's
 * send-queue slots held by unsignaled requests retire (the mock refuses a post beyond
 * max_send_wr: the connection resets and the send fails); every message arrives whole.
 */
START_TEST(un_one_way_retires)
{
    uint64_t n0;

    un_open(SOCK_SEQPACKET, 1);
    n0 = un_cnt(sends_unsignaled);
    for (int i = 0; i < ROUNDS; i++) {
        pp.a.conn->quiet_armed = 1;
        un_one(&pp.a, &pp.b, (uint64_t)i);
    }
    /* most went unsignaled, and some did not (the retiring ones) */
    ck_assert_uint_ge(un_cnt(sends_unsignaled) - n0, ROUNDS * 3 / 4);
    ck_assert_uint_lt(un_cnt(sends_unsignaled) - n0, ROUNDS);
    un_close();
}
END_TEST

#define NQ 5

/*
 * The link dies with only unsignaled writes outstanding (posted, not yet carried out):
 * each is flushed with a completion that names no op (the ops were handed back at
 * post: none is finished twice, none touched again), the drain's fence comes after them
 * and the conns die; nothing leaks (pt_close). Looped: a dropped link, a close of both.
 */
START_TEST(un_flush_unsignaled)
{
    int drop = _i == 0;
    static uint8_t sb[NQ][64];
    struct pt_op s[NQ];
    struct mock_stats m0, m1;
    uint64_t f0;

    un_open(SOCK_SEQPACKET, 1);
    f0 = un_cnt(unsignaled_failed);
    for (int i = 0; i < NQ; i++) {
        pp.a.conn->quiet_armed = 1; /* as if an answer came between them */
        pt_send_pattern(&s[i], &pp.a, sb[i], 64, 64u * i);
        pt_assert_done(&s[i], 64, 0);
    }
    ck_assert_uint_eq(pp.a.conn->quiet_run, NQ);
    mock_stats(pp.a.ctx, &m0);
    if (drop) {
        mock_drop(pp.a.conn->ep);
        pt_run(&pp);
        ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DEAD);
        ck_assert_int_eq(pp.a.dead, 1);
        /* every unsignaled write flushed, then the fence */
        ck_assert_uint_eq(un_cnt(unsignaled_failed) - f0, NQ);
        mock_stats(pp.a.ctx, &m1);
        ck_assert_uint_eq(m1.flushed - m0.flushed, NQ + 1 + pp.a.conn->p.credits);
    }
    for (int i = 0; i < NQ; i++) {
        ck_assert_int_eq(s[i].done, 1);
        pt_op_fini(&s[i]);
    }
    un_close();
}
END_TEST

/*
 * The peer's error completion of an unsignaled write (a write the provider refuses) ends
 * the connection as a failed signaled write does, and finishes nothing again.
 */
START_TEST(un_error_unsignaled)
{
    static uint8_t sb[64];
    struct pt_op s;
    uint64_t f0;

    un_open(SOCK_SEQPACKET, 1);
    f0 = un_cnt(unsignaled_failed);
    mock_inject_wr_error(pp.a.conn->ep, 1, EXS_PROV_WC_REM_ACCESS_ERR);
    pt_send_pattern(&s, &pp.a, sb, 64, 0);
    pt_assert_done(&s, 64, 0);
    pt_run(&pp);
    ck_assert_uint_eq(un_cnt(unsignaled_failed) - f0, 1);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_ge(pp.a.conn->state, EXS_CONN_DOWN);
    pt_op_fini(&s);
    un_close();
}
END_TEST

/*
 * Every endpoint of a connection has room for the unsignaled writes that may still hold
 * a send-queue slot (EXS_QUIET_MAX) besides the signaled ones: the first endpoint (made
 * at open) as much as one made for a later path (exs__conn_path_make), so that a provider
 * that refuses a post beyond max_send_wr never resets a connection whose writes stayed
 * within the credits. Both sides, both socket types.
 */
START_TEST(un_sq_room)
{
    un_open(_i ? SOCK_STREAM : SOCK_SEQPACKET, 1);
    for (int side = 0; side < 2; side++) {
        struct exs_conn *c = side ? pp.b.conn : pp.a.conn;

        ck_assert_uint_ge(c->ep->attr.max_send_wr,
                          c->p.credits + c->p.max_reads + c->tx_slots + 8 + EXS_QUIET_MAX);
    }
    un_close();
}
END_TEST

/*
 * exs_send's SEQPACKET send that ends at its post, with no op (spec/proto-layout.md, "A
 * SEQPACKET send that ends at its post"): _i 0, taken: numbered, counted (posts_fast,
 * sends_unsignaled, exs_conn.posts_copied), the credit spent, nothing in flight, the bytes
 * in the peer's next receive; then refused (no answer since). _i 1..: one condition fails
 * and exs__conn_send_now_begin refuses with nothing changed and the lock given back
 * (taken again after): 1 the switch off, 2 no answer came, 3 no credit, 4 a send queued in
 * sendq, 5 a ring write in flight, 6 a control record waiting, 7 the eager limit, 8 more
 * than the provider's inline bytes, 9 the sending side shut, 10 request tracing, 11
 * batching's threshold above its floor, 12 a STREAM conn.
 */
START_TEST(un_send_now)
{
    static uint8_t sb[64], rb[64], qb[64];
    struct pt_op s, r, q;
    uint64_t seq, tail, posts, fast, quiet;
    uint32_t credits, len = 64;
    int queued = 0;

    if (_i == 10 && !EXS_REQTRACE_ON)
        return; /* tracing compiled out (make TRACE=0) */
    un_open(_i == 12 ? SOCK_STREAM : SOCK_SEQPACKET, _i != 1);
    struct exs_conn *c = pp.a.conn;

    ck_assert_int_eq(c->quiet_armed, 1);
    credits = c->credits;
    switch (_i) {
    case 2:
        c->quiet_armed = 0;
        break;
    case 3:
        c->credits = 0;
        break;
    case 4: /* an op in sendq (taken out again before anything runs) */
        pt_op_init(&q, &pp.a, EXS_OP_SEND, qb, sizeof(qb), 0);
        exs_list_add_tail(&c->sendq, &q.op.link);
        queued = 1;
        break;
    case 5:
        c->ring_wr_out = 1;
        break;
    case 6:
        c->ctrl_len = 1;
        break;
    case 7:
        len = EXS_MIN(c->p.eager_max, c->peer.eager_max);
        break;
    case 8:
        len = c->ep->attr.max_inline + 1;
        break;
    case 9:
        c->txshut = EXS_TXSHUT_QUEUED;
        break;
    case 10:
        exs__params.trace_sample_mask = 1;
        break;
    case 11:
        c->batch_thresh = 2 * EXS_MIN(EXS_BATCH_FLOOR, c->p.batch_max);
        break;
    }
    seq = c->tx_seq;
    tail = c->wr_tail;
    posts = c->posts_copied;
    fast = un_cnt(posts_fast);
    quiet = un_cnt(sends_unsignaled);
    if (_i) {
        ck_assert_int_eq(exs__conn_send_now_begin(c, len), 0);
        /* nothing changed, and the lock is free */
        ck_assert_uint_eq(c->tx_seq, seq);
        ck_assert_uint_eq(c->wr_tail, tail);
        ck_assert_uint_eq(c->posts_copied, posts);
        ck_assert_uint_eq(un_cnt(sends_unsignaled), quiet);
        EXS_LITE_LOCK(&c->lock, EXS_LOCK_CONN);
        EXS_LITE_UNLOCK(&c->lock, EXS_LOCK_CONN);
        c->ring_wr_out = 0;
        c->ctrl_len = 0;
        c->txshut = EXS_TXSHUT_OPEN;
        c->credits = credits;
        c->quiet_armed = 1;
        exs__params.trace_sample_mask = 0;
        if (_i == 11)
            c->batch_thresh = EXS_MIN(EXS_BATCH_FLOOR, c->p.batch_max);
        if (queued) {
            exs_list_del(&q.op.link);
            pt_op_fini(&q);
        }
        un_close();
        return;
    }
    pt_fill(sb, sizeof(sb), 9);
    uint32_t q_run = c->quiet_run, q_live = c->quiet_live, sq_out = c->sq_out;
    ck_assert_int_eq(exs__conn_send_now_begin(c, len), 1);
    ck_assert_int_eq(exs__conn_send_now_post(c, sb, len, 0), 1);
    exs__conn_unlock(c);
    /* posted straight to the provider, its slot counted as exs__conn_post_send_locked
     * counts an unsignaled one: nothing queued, no signaled request more */
    ck_assert_uint_eq(c->quiet_run, q_run + 1);
    ck_assert_uint_eq(c->quiet_live, q_live + 1);
    ck_assert_uint_eq(c->sq_out, sq_out);
    ck_assert_uint_eq(c->wrq_count, 0);
    ck_assert_uint_eq(c->tx_seq, seq + 1);
    ck_assert_uint_gt(c->wr_tail, tail);
    ck_assert_uint_eq(c->posts_copied, posts + 1);
    ck_assert_uint_eq(un_cnt(posts_fast), fast + 1);
    ck_assert_uint_eq(un_cnt(sends_unsignaled), quiet + 1);
    ck_assert_uint_eq(c->credits, credits - 1);
    ck_assert_uint_eq(c->ring_wr_out, 0);
    ck_assert_int_eq(c->quiet_armed, 0);
    ck_assert(exs_list_empty(&c->sendq));
    /* no answer came since: the next one takes the whole way */
    ck_assert_int_eq(exs__conn_send_now_begin(c, len), 0);
    pt_recv_post(&r, &pp.b, rb, sizeof(rb), 0);
    pt_run(&pp);
    pt_assert_done(&r, 64, 0);
    ck_assert(pt_check(rb, 64, 9));
    /* the receiver's sequence agrees: a send of the whole way after it arrives next */
    pt_send_pattern(&s, &pp.a, sb, 64, 21);
    pt_recv_post(&q, &pp.b, rb, sizeof(rb), 0);
    pt_run(&pp);
    pt_assert_done(&s, 64, 0);
    pt_assert_done(&q, 64, 0);
    ck_assert(pt_check(rb, 64, 21));
    pt_op_fini(&s);
    pt_op_fini(&r);
    pt_op_fini(&q);
    un_close();
}
END_TEST

Suite *proto_unsig_suite(void)
{
    Suite *s = suite_create("proto_unsig");
    TCase *tc = tcase_create("unsig");

    tcase_add_loop_test(tc, un_event_at_post, 0, 5);
    tcase_add_loop_test(tc, un_order_behind_signaled, 0, 3);
    tcase_add_test(tc, un_pingpong_retires);
    tcase_add_test(tc, un_one_way_retires);
    tcase_add_loop_test(tc, un_flush_unsignaled, 0, 2);
    tcase_add_test(tc, un_error_unsignaled);
    tcase_add_loop_test(tc, un_sq_room, 0, 2);
    tcase_add_loop_test(tc, un_send_now, 0, 13);
    suite_add_tcase(s, tc);
    return s;
}
