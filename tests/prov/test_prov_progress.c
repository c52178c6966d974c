/* SPDX-License-Identifier: MIT */
/* tcp progress model: direct writes, commands in the caller, no lost wake-up, full sockets. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

/* Counters of a tcp ctx (tcp-only tests look inside the provider). */
static uint64_t tcp_cnt(struct exs_prov_ctx *c, size_t off)
{
    return __atomic_load_n((uint64_t *)((char *)&tcp_ctx_of(c)->cnt + off), __ATOMIC_RELAXED);
}
#define TCP_CNT(_c, _f) tcp_cnt((_c), offsetof(struct tcp_counters, _f))

/* ---- helpers: a pair this thread drives, its buffers, one-sided driving ---- */

#define PP_ROUNDS 200

/* Opens a pair in MANUAL_PROGRESS, both ctxs driven by this thread; returns 1 when the
 * test is skipped (test names a tcp-only test; NULL runs on every provider). */
static int manual_setup(struct pt_pair *p, const char *test)
{
    if (test && pt_skip_unless_tcp_itself(test))
        return 1;
    pt_self_drive = 1;
    pt_pair_setup(p, NULL, NULL);
    return 0;
}

static void manual_close(struct pt_pair *p)
{
    pt_pair_close(p);
    pt_self_drive = 0;
}

/* Four 64-byte buffers of the pair, allocated in this order: a's send and receive
 * buffers (b[0], b[1]), then b's (b[2], b[3]). */
enum { SA, RA, SB, RB };

static void bufs64(struct pt_pair *p, struct pt_buf *b[4])
{
    b[SA] = pt_pair_buf(p, 'a', 64, LW, 0);
    b[RA] = pt_pair_buf(p, 'a', 64, LW, 0);
    b[SB] = pt_pair_buf(p, 'b', 64, LW, 0);
    b[RB] = pt_pair_buf(p, 'b', 64, LW, 0);
}

/* PP_ROUNDS 64-byte SEND ping-pongs a -> b -> a, every completion expected; with
 * check, each message carries a pattern that its receiver checks. */
static void pingpong(struct pt_pair *p, struct pt_buf *const b[4], int check)
{
    for (uint32_t i = 0; i < PP_ROUNDS; i++) {
        ck_assert_int_eq(pt_post_recv(p->eb, 1000 + i, b[RB], 0, 64), 0);
        ck_assert_int_eq(pt_post_recv(p->ea, 2000 + i, b[RA], 0, 64), 0);
        if (check)
            pt_pattern(b[SA]->p, 64, i);
        ck_assert_int_eq(
            pt_post_send(p->ea, 3000 + i, EXS_PROV_WR_SEND, SIG, b[SA], 0, 64, 0, 0, 0), 0);
        pt_expect_cqe(&p->b, 1000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        if (check) {
            ck_assert_int_eq(pt_pattern_check(b[RB]->p, 64, i), -1);
            pt_pattern(b[SB]->p, 64, i + 7);
        }
        ck_assert_int_eq(
            pt_post_send(p->eb, 4000 + i, EXS_PROV_WR_SEND, SIG, b[SB], 0, 64, 0, 0, 0), 0);
        pt_expect_wr(&p->a, 2000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        if (check)
            ck_assert_int_eq(pt_pattern_check(b[RA]->p, 64, i + 7), -1);
        pt_expect_wr(&p->a, 3000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        pt_expect_wr(&p->b, 4000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
}

/* Drives only b's ctx, one turn at a time, until b has a completion (into c) or, with
 * ev, a cm event (into ev), or PT_TIMEOUT_MS passed; returns how many it got (0 or 1). */
static int drive_b_until(struct pt_pair *p, struct exs_prov_cqe *c, struct exs_prov_cm_event *ev)
{
    double deadline = pt_now_ms() + PT_TIMEOUT_MS;
    int n = 0;

    while (n == 0 && pt_now_ms() < deadline) {
        ck_assert_int_ge(pt_ops->ctx_progress(p->b.ctx), 0);
        n = ev ? pt_ops->ctx_cm_poll(p->b.ctx, ev) : pt_ops->ctx_poll(p->b.ctx, c, 1);
        ck_assert_int_ge(n, 0);
        if (!n)
            pt_sleep_ms(1);
    }
    return n;
}

/* A 64-byte request a -> b (receive wr_id 1 into rb, SEND wr_id 3 from sa) once every
 * earlier frame is out, only b driven until the receive completes (into c); returns
 * b's acks_tx from before the request. */
static uint64_t request_to_b(struct pt_pair *p, struct pt_buf *sa, struct pt_buf *rb,
                             struct exs_prov_cqe *c)
{
    uint64_t acks0;

    ck_assert_int_eq(pt_post_recv(p->eb, 1, rb, 0, 64), 0);
    while (pt_drive_all() > 0) /* quiet: every earlier ACK is out */
        ;
    acks0 = TCP_CNT(p->b.ctx, acks_tx);
    ck_assert_int_eq(pt_post_send(p->ea, 3, EXS_PROV_WR_SEND, SIG, sa, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(drive_b_until(p, c, NULL), 1);
    return acks0;
}

/* A pair as manual_setup opens it, with a request a -> b that b received (into c) and
 * whose ACK it owes: request_to_b on two fresh 64-byte buffers; returns 1 when skipped. */
static int ack_owed_setup(struct pt_pair *p, const char *test, struct exs_prov_cqe *c,
                          uint64_t *acks0)
{
    struct pt_buf *sa, *rb;

    if (manual_setup(p, test))
        return 1;
    sa = pt_pair_buf(p, 'a', 64, LW, 0);
    rb = pt_pair_buf(p, 'b', 64, LW, 0);
    *acks0 = request_to_b(p, sa, rb, c);
    return 0;
}

/* A raw peer's SEND frame of len bytes of fill, header and payload. */
static void raw_send_msg(int fd, uint8_t fill, uint32_t len)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_SEND, 0, len, 0, 0, 0, 0);
    uint8_t payload[64];

    ck_assert_uint_le(len, sizeof(payload));
    memset(payload, fill, len);
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    ck_assert_int_eq(pt_raw_send(fd, payload, len), 0);
}

/* ---- ctx_progress and ctx_poll in one (exs__prov_progress_poll) ---- */

/* The fused call gives what ctx_progress then ctx_poll would: every receive, in order,
 * with its bytes, at most max per call, also when some of them were queued by plain
 * ctx_progress turns before (shm: its turn's completions go straight into the array only
 * while nothing older is queued; spec/provider.md, "Progress and poll in one"). tcp gets
 * the two calls (exs__prov_progress_poll's fallback). */
START_TEST(progress_poll_in_one)
{
    enum { K = 8 };
    struct pt_pair p;
    struct pt_buf *sa[K], *rb[K];
    struct exs_prov_cqe c[K];

    if (manual_setup(&p, NULL))
        return;
    for (int i = 0; i < K; i++) {
        sa[i] = pt_pair_buf(&p, 'a', 64, LW, 0);
        rb[i] = pt_pair_buf(&p, 'b', 64, LW, 0);
    }
    for (uint32_t r = 0; r < 4; r++) {
        for (int i = 0; i < K; i++)
            ck_assert_int_eq(pt_post_recv(p.eb, 100 * r + (uint64_t)i, rb[i], 0, 64), 0);
        for (int i = 0; i < K; i++) {
            pt_pattern(sa[i]->p, 64, 10 * r + (uint32_t)i);
            ck_assert_int_eq(
                pt_post_send(p.ea, 500 + (uint64_t)i, EXS_PROV_WR_SEND, SIG, sa[i], 0, 64, 0, 0, 0),
                0);
            /* rounds 1 and 3: plain turns of b between the sends (queued completions) */
            if (r & 1)
                for (int t = 0; t < 3; t++)
                    ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
        }
        pt_progress_poll_b(&p, c, K, r < 2 ? K : 3);
        for (int i = 0; i < K; i++) {
            ck_assert_uint_eq(c[i].wr_id, 100 * r + (uint64_t)i);
            ck_assert_int_eq(c[i].status, EXS_PROV_WC_SUCCESS);
            ck_assert_int_eq(c[i].opcode, EXS_PROV_WC_RECV);
            ck_assert_uint_eq(c[i].byte_len, 64);
            ck_assert_ptr_eq(c[i].ep, p.eb);
            ck_assert_int_eq(pt_pattern_check(rb[i]->p, 64, 10 * r + (uint32_t)i), -1);
        }
        for (int i = 0; i < K; i++)
            pt_expect_wr(&p.a, 500 + (uint64_t)i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    manual_close(&p);
}
END_TEST

/* ---- ping-pong in MANUAL_PROGRESS mode, one thread driving both ctxs ---- */

START_TEST(progress_pingpong_direct)
{
    struct pt_pair p;
    struct pt_buf *b[4];
    uint64_t da0, db0;

    if (manual_setup(&p, "progress_pingpong_direct"))
        return;
    ck_assert_int_eq(tcp_ctx_of(p.a.ctx)->has_thread, 0);
    ck_assert_int_eq(tcp_ctx_of(p.b.ctx)->has_thread, 0);
    bufs64(&p, b);
    da0 = TCP_CNT(p.a.ctx, direct_writes);
    db0 = TCP_CNT(p.b.ctx, direct_writes);
    pingpong(&p, b, 1);
    /* every post was framed and written by the posting thread, and nobody had to
     * be woken: no NIC thread exists, and the one driver never held the NIC role
     * while it posted */
    ck_assert_uint_eq(TCP_CNT(p.a.ctx, direct_writes) - da0, PP_ROUNDS);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, direct_writes) - db0, PP_ROUNDS);
    ck_assert_uint_eq(TCP_CNT(p.a.ctx, wakeups), 0);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, wakeups), 0);
    manual_close(&p);
}
END_TEST

/* A post writes its frame before it returns: the peer receives it while only the
 * peer's ctx is driven. */
START_TEST(progress_post_writes_in_caller)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;

    if (manual_setup(&p, "progress_post_writes_in_caller"))
        return;
    src = pt_pair_buf(&p, 'a', 256, LW, 0);
    dst = pt_pair_buf(&p, 'b', 256, LW, 0);
    pt_pattern(src->p, 256, 42);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 256), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 256, 0, 0, 0), 0);
    /* drive b only: a's ctx runs no turn from here on */
    ck_assert_msg(drive_b_until(&p, &c, NULL) == 1,
                  "the SEND did not arrive while only the receiver was driven");
    ck_assert_uint_eq(c.wr_id, 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(pt_pattern_check(dst->p, 256, 42), -1);
    pt_expect_wr(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    manual_close(&p);
}
END_TEST

/* Commands run in the caller's thread: with MANUAL_PROGRESS and nobody driving a,
 * disconnect returns, and its DISCONNECT frame reaches b while only b is driven. */
START_TEST(progress_command_in_caller)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;

    manual_setup(&p, NULL);
    ck_assert_int_eq(pt_ops->disconnect(p.ea), 0);
    ck_assert_msg(drive_b_until(&p, NULL, &ev) == 1, "no cm event at b while only b was driven");
    ck_assert_int_eq(ev.type, EXS_PROV_CM_DISCONNECTED);
    ck_assert_ptr_eq(ev.ep, p.eb);
    p.b_up = 0;
    manual_close(&p);
}
END_TEST

/* MANUAL_PROGRESS: the ACK of a request read in a turn waits for the reply, and
 * both leave in one sendmsg; meanwhile the consumer cannot go to sleep. */
START_TEST(progress_ack_rides_with_reply)
{
    struct pt_pair p;
    struct pt_buf *b[4];
    struct exs_prov_cqe c;
    uint64_t acks0, calls0, frames0;

    if (manual_setup(&p, "progress_ack_rides_with_reply"))
        return;
    bufs64(&p, b);
    ck_assert_int_eq(pt_post_recv(p.ea, 2, b[RA], 0, 64), 0);
    /* b's consumer: one turn at a time until the receive completes */
    acks0 = request_to_b(&p, b[SA], b[RB], &c);
    ck_assert_uint_eq(c.wr_id, 1);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0); /* owed, not sent */
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, acks_deferred), 1);
    /* a consumer that would sleep now must run another turn first */
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
    calls0 = TCP_CNT(p.b.ctx, tx_calls);
    frames0 = TCP_CNT(p.b.ctx, frames_tx);
    ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_SEND, SIG, b[SB], 0, 64, 0, 0, 0), 0);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0 + 1);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, frames_tx), frames0 + 2);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, tx_calls), calls0 + 1);
    pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_wr(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_expect_wr(&p.b, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    manual_close(&p);
}
END_TEST

/* MANUAL_PROGRESS: a deferred ACK leaves before its consumer sleeps, even when nothing is
 * posted: ctx_arm refuses while it is owed, and the turn after that refusal sends it (a
 * sender waiting for it to free send queue slots is never stalled by a sleeper). */
START_TEST(progress_ack_deferred_until_sleep)
{
    struct pt_pair p;
    struct exs_prov_cqe c;
    uint64_t acks0;

    if (ack_owed_setup(&p, "progress_ack_deferred_until_sleep", &c, &acks0))
        return;
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0);
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
    ck_assert_int_eq(pt_ops->ctx_progress(p.b.ctx), 0);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0 + 1);
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), 0);
    pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    manual_close(&p);
}
END_TEST

/* MANUAL_PROGRESS: a consumer that busy-polls (turns, never ctx_arm) and posts nothing
 * still sends the deferred ACK after a bounded delay (20 us by the spec; the test waits
 * for it with a generous limit and asserts no duration). */
START_TEST(progress_ack_deferred_busy_poll_bounded)
{
    struct pt_pair p;
    struct exs_prov_cqe c;
    uint64_t acks0, t0;

    if (ack_owed_setup(&p, "progress_ack_deferred_busy_poll_bounded", &c, &acks0))
        return;
    t0 = exs__now_ns();
    while (TCP_CNT(p.b.ctx, acks_tx) == acks0 && exs__now_ns() - t0 < 10000000000ull)
        ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0 + 1);
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), 0);
    pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    manual_close(&p);
}
END_TEST

/* MANUAL_PROGRESS: a disconnect right after the receive completed still sends the
 * deferred ACK first: the peer's SEND succeeds, as on hardware. */
START_TEST(progress_ack_deferred_then_disconnect)
{
    struct pt_pair p;
    struct exs_prov_cqe c;
    uint64_t acks0;

    if (ack_owed_setup(&p, "progress_ack_deferred_then_disconnect", &c, &acks0))
        return;
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, acks_deferred), 1);
    ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
    pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    manual_close(&p);
}
END_TEST

/* MANUAL_PROGRESS: a post takes along only its own connection's deferred ACK; the
 * ACK another connection owes stays deferred (for that connection's own reply) and
 * leaves in the next turn, which the consumer cannot skip. */
START_TEST(progress_post_acks_own_conn_only)
{
    struct pt_pair p;
    struct exs_prov_ep *eb1;
    struct exs_prov_ep_attr attr = pt_default_attr();
    struct pt_buf *sa, *rb, *rb2, *sb;
    struct tcp_wire_hdr ack;
    struct exs_prov_cqe c;
    uint64_t acks0, calls0;
    int fd, got = 0;

    if (manual_setup(&p, "progress_post_acks_own_conn_only"))
        return;
    /* a second connection of b's ctx, to a raw peer */
    eb1 = p.eb;
    ck_assert_int_eq(pt_ops->ep_create(p.b.ctx, &attr, &p.eb), 0);
    fd = pt_raw_establish(&p);
    {
        struct exs_prov_ep *eb2 = p.eb;

        p.eb = eb1;
        sa = pt_pair_buf(&p, 'a', 64, LW, 0);
        rb = pt_pair_buf(&p, 'b', 64, LW, 0);
        rb2 = pt_pair_buf(&p, 'b', 64, LW, 0);
        sb = pt_pair_buf(&p, 'b', 64, LW, 0);
        ck_assert_int_eq(pt_post_recv(p.eb, 1, rb, 0, 64), 0);
        ck_assert_int_eq(pt_post_recv(eb2, 2, rb2, 0, 64), 0);
        while (pt_drive_all() > 0)
            ;
        acks0 = TCP_CNT(p.b.ctx, acks_tx);
        /* one request on each connection */
        ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, sa, 0, 64, 0, 0, 0), 0);
        raw_send_msg(fd, 0x33, 16);
        for (double deadline = pt_now_ms() + PT_TIMEOUT_MS; got < 2 && pt_now_ms() < deadline;) {
            ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
            while (got < 2 && pt_ops->ctx_poll(p.b.ctx, &c, 1) == 1) {
                ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
                got++;
            }
        }
        ck_assert_int_eq(got, 2);
        ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0); /* both owed, deferred */
        /* the reply on the first connection carries its ACK, in one sendmsg */
        calls0 = TCP_CNT(p.b.ctx, tx_calls);
        ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_SEND, SIG, sb, 0, 64, 0, 0, 0), 0);
        ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0 + 1);
        ck_assert_uint_eq(TCP_CNT(p.b.ctx, tx_calls), calls0 + 1);
        /* the second connection's ACK is still owed: no sleeping before the next turn */
        ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
        ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
        ck_assert_uint_eq(TCP_CNT(p.b.ctx, acks_tx), acks0 + 2);
        ck_assert_int_eq(pt_raw_recv(fd, &ack, sizeof(ack), PT_TIMEOUT_MS), 0);
        ck_assert_uint_eq(ack.type, TCP_WIRE_ACK);
        ck_assert_uint_eq(ntohl(ack.psn), 0);
        pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        close(fd);
        pt_ep_close(&p.b, eb2);
    }
    manual_close(&p);
}
END_TEST

/* ---- many posters, one driver: no lost wake-up ---- */

#define RACE_POSTERS 4
#define RACE_MSGS    4000 /* in all */

struct race {
    struct pt_pair *p;
    struct pt_buf *src[RACE_POSTERS];
    int id;
    uint64_t done;   /* send completions (atomic) */
    uint64_t posted; /* (atomic) */
    int stalled;     /* the driver slept 10 s with work outstanding */
    int failed;      /* a completion was not a success */
};

struct race_poster {
    struct race *r;
    int id;
};

/* Poster id sends messages id, id + RACE_POSTERS, ... each once every earlier one
 * completed: the posting thread changes at every message, and each post races with
 * the driver's turn that delivered the previous completion. Nothing else moves, so a
 * post whose wake-up was lost stays queued and the driver sleeps. */
static void *race_poster_main(void *arg)
{
    struct race_poster *rp = arg;
    struct race *r = rp->r;
    struct pt_buf *b = r->src[rp->id];

    for (uint32_t seq = (uint32_t)rp->id; seq < RACE_MSGS; seq += RACE_POSTERS) {
        uint32_t *w = (uint32_t *)(void *)b->p;
        int rc;

        for (unsigned spin = 0; __atomic_load_n(&r->done, __ATOMIC_ACQUIRE) < seq; spin++) {
            if (__atomic_load_n(&r->stalled, __ATOMIC_RELAXED) ||
                __atomic_load_n(&r->failed, __ATOMIC_RELAXED))
                return NULL;
            /* spin a little, to post while the driver is still in its turn, then give
             * the two cores to the others */
            if (spin > 20000)
                sched_yield();
        }
        w[0] = (uint32_t)rp->id;
        w[1] = seq;
        rc = pt_post_send(r->p->ea, seq, EXS_PROV_WR_SEND, SIG | EXS_PROV_SEND_INLINE, b, 0, 8, 0,
                          0, 0);
        if (rc != 0) {
            __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        __atomic_add_fetch(&r->posted, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* a's only driver: progress, poll, arm, sleep on the event fd. */
static void *race_driver_main(void *arg)
{
    struct race *r = arg;
    struct exs_prov_ctx *ctx = r->p->a.ctx;
    const uint64_t total = RACE_MSGS;

    while (__atomic_load_n(&r->done, __ATOMIC_RELAXED) < total) {
        struct exs_prov_cqe c[32];
        int did = pt_ops->ctx_progress(ctx), n = pt_ops->ctx_poll(ctx, c, 32);

        for (int i = 0; i < n; i++)
            if (c[i].status != EXS_PROV_WC_SUCCESS ||
                c[i].wr_id != __atomic_load_n(&r->done, __ATOMIC_RELAXED) + (uint64_t)i)
                __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&r->done, (uint64_t)n, __ATOMIC_RELEASE);
        if (did || n || pt_ops->ctx_arm(ctx) == -EAGAIN)
            continue;
        struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(ctx), .events = POLLIN};

        /* a generous bound: only a lost wake-up sleeps that long with work queued */
        if (poll(&pfd, 1, 10000) == 0 && __atomic_load_n(&r->posted, __ATOMIC_RELAXED) >
                                             __atomic_load_n(&r->done, __ATOMIC_RELAXED)) {
            __atomic_store_n(&r->stalled, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    return NULL;
}

START_TEST(progress_no_lost_wakeup)
{
    struct pt_pair p;
    struct race r;
    struct race_poster rp[RACE_POSTERS];
    pthread_t pt[RACE_POSTERS], drv;
    struct pt_buf *dst;
    struct exs_prov_ep_attr attr = pt_default_attr();
    uint64_t got = 0, total = RACE_MSGS;
    struct exs_prov_cqe c;
    int posted_rx = 0;

    if (pt_skip_unless_tcp_itself("progress_no_lost_wakeup"))
        return;
    pt_self_drive = 1;
    attr.max_send_wr = 32;
    attr.max_recv_wr = 64;
    pt_pair_setup(&p, &attr, &attr);
    memset(&r, 0, sizeof(r));
    r.p = &p;
    for (int i = 0; i < RACE_POSTERS; i++)
        r.src[i] = pt_pair_buf(&p, 'a', 8, LW, 0);
    dst = pt_pair_buf(&p, 'b', 64 * 8, LW, 0);
    for (; posted_rx < 64; posted_rx++)
        ck_assert_int_eq(
            pt_post_recv(p.eb, (uint64_t)posted_rx, dst, (size_t)(posted_rx % 64) * 8, 8), 0);
    /* from here a is driven by race_driver_main only: b is driven by this thread */
    ck_assert_int_eq(pthread_create(&drv, NULL, race_driver_main, &r), 0);
    for (int i = 0; i < RACE_POSTERS; i++) {
        rp[i].r = &r;
        rp[i].id = i;
        ck_assert_int_eq(pthread_create(&pt[i], NULL, race_poster_main, &rp[i]), 0);
    }
    while (got < total && !__atomic_load_n(&r.stalled, __ATOMIC_RELAXED)) {
        double deadline = pt_now_ms() + 15000;
        int n = 0;

        while (!n && pt_now_ms() < deadline && !__atomic_load_n(&r.stalled, __ATOMIC_RELAXED)) {
            ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
            n = pt_ops->ctx_poll(p.b.ctx, &c, 1);
            if (!n) {
                struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(p.b.ctx), .events = POLLIN};

                if (pt_ops->ctx_arm(p.b.ctx) == 0)
                    poll(&pfd, 1, 50);
            }
        }
        if (!n)
            break;
        ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
        ck_assert_uint_eq(c.byte_len, 8);
        {
            const uint32_t *w = (const uint32_t *)(const void *)(dst->p + (c.wr_id % 64) * 8);

            /* in posting order, each from its poster, none lost or repeated */
            ck_assert_uint_eq(w[1], got);
            ck_assert_uint_eq(w[0], got % RACE_POSTERS);
        }
        got++;
        ck_assert_int_eq(
            pt_post_recv(p.eb, (uint64_t)posted_rx, dst, (size_t)(posted_rx % 64) * 8, 8), 0);
        posted_rx++;
    }
    for (int i = 0; i < RACE_POSTERS; i++)
        pthread_join(pt[i], NULL);
    /* b keeps being driven, as by an application that waits on its event fd, until a
     * has every completion (the last ACK leaves in b's next turn) */
    while (__atomic_load_n(&r.done, __ATOMIC_ACQUIRE) < total &&
           !__atomic_load_n(&r.stalled, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&r.failed, __ATOMIC_RELAXED)) {
        struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(p.b.ctx), .events = POLLIN};

        ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
        if (pt_ops->ctx_arm(p.b.ctx) == 0)
            poll(&pfd, 1, 50);
    }
    pthread_join(drv, NULL);
    printf("progress_no_lost_wakeup: %llu messages, %llu direct writes, %llu wake-ups\n",
           (unsigned long long)got, (unsigned long long)TCP_CNT(p.a.ctx, direct_writes),
           (unsigned long long)TCP_CNT(p.a.ctx, wakeups));
    fflush(stdout);
    ck_assert_msg(!r.stalled, "a's driver slept 10 s with %llu sends posted and %llu done",
                  (unsigned long long)r.posted, (unsigned long long)r.done);
    ck_assert_int_eq(r.failed, 0);
    ck_assert_uint_eq(got, total);
    ck_assert_uint_eq(r.done, total);
    pt_pair_close(&p);
    pt_self_drive = 0;
}
END_TEST

/* ---- a post while another thread holds the NIC role ---- */

/* Hold the NIC role as another thread's turn would, post a SEND on ea, release. */
static void post_while_role_held(struct pt_pair *p, struct pt_buf *src, uint64_t wr_id)
{
    struct tcp_ctx *ctx = tcp_ctx_of(p->a.ctx);
    uint64_t w0 = TCP_CNT(p->a.ctx, wakeups);

    pthread_mutex_lock(&ctx->nic_lock);
    ck_assert_int_eq(pt_post_send(p->ea, wr_id, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pthread_mutex_unlock(&ctx->nic_lock);
    ck_assert_uint_eq(TCP_CNT(p->a.ctx, wakeups), w0 + 1);
}

/* A 64-byte receive (wr_id 1) at b, and a's source holding pattern seed: dst and src. */
static void role_busy_prepare(struct pt_pair *p, struct pt_buf **src, struct pt_buf **dst,
                              uint32_t seed)
{
    *src = pt_pair_buf(p, 'a', 64, LW, 0);
    *dst = pt_pair_buf(p, 'b', 64, LW, 0);
    pt_pattern((*src)->p, 64, seed);
    ck_assert_int_eq(pt_post_recv(p->eb, 1, *dst, 0, 64), 0);
}

/* The SEND posted while the role was held (wr_id 2) arrived whole and completed. */
static void role_busy_check(struct pt_pair *p, struct pt_buf *dst, uint32_t seed)
{
    pt_expect_cqe(&p->b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    ck_assert_int_eq(pt_pattern_check(dst->p, 64, seed), -1);
    pt_expect_cqe(&p->a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
}

/* MANUAL_PROGRESS: the post is not lost: the event fd is readable, ctx_arm refuses to
 * let the driver sleep, and the next turn sends it. */
START_TEST(progress_role_busy_manual)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct pollfd pfd;
    struct exs_prov_cqe c;

    if (manual_setup(&p, "progress_role_busy_manual"))
        return;
    role_busy_prepare(&p, &src, &dst, 3);
    while (pt_ops->ctx_progress(p.a.ctx) > 0)
        ;
    ck_assert_int_eq(pt_ops->ctx_poll(p.a.ctx, &c, 1), 0);
    ck_assert_int_eq(pt_ops->ctx_arm(p.a.ctx), 0);
    post_while_role_held(&p, src, 2);
    pfd.fd = pt_ops->ctx_event_fd(p.a.ctx);
    pfd.events = POLLIN;
    ck_assert_msg(poll(&pfd, 1, 0) == 1, "event fd not readable with a post waiting for a turn");
    ck_assert_int_eq(pt_ops->ctx_arm(p.a.ctx), -EAGAIN);
    ck_assert_int_eq(pt_ops->ctx_progress(p.a.ctx), 1);
    role_busy_check(&p, dst, 3);
    manual_close(&p);
}
END_TEST

/* Default mode: the NIC thread, asleep with nothing else to do, is woken and sends it. */
START_TEST(progress_role_busy_thread)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;

    if (pt_skip_unless_tcp_itself("progress_role_busy_thread"))
        return;
    if (pt_manual) {
        test_skip("progress_role_busy_thread", "the default mode's NIC thread; run is --manual");
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    ck_assert_int_eq(tcp_ctx_of(p.a.ctx)->has_thread, 1);
    role_busy_prepare(&p, &src, &dst, 4);
    post_while_role_held(&p, src, 2);
    role_busy_check(&p, dst, 4);
    pt_pair_close(&p);
}
END_TEST

/* ---- a full socket: the rest leaves on EPOLLOUT, in order ---- */

#define FULL_WRS 96
#define FULL_LEN (256 * 1024)

START_TEST(progress_full_socket)
{
    struct pt_pair p;
    struct exs_prov_ep_attr attr = pt_default_attr();
    struct pt_buf *src;
    uint8_t *payload;
    uint64_t full0;
    int fd;

    if (pt_skip_unless_tcp_itself("progress_full_socket"))
        return;
    attr.max_send_wr = 128;
    pt_pair_open(&p, &attr, &attr);
    fd = pt_raw_establish(&p);
    src = pt_pair_buf(&p, 'b', FULL_LEN, LW, 0);
    pt_pattern(src->p, FULL_LEN, 5);
    full0 = TCP_CNT(p.b.ctx, tx_full);
    /* 24 MiB while the raw peer reads nothing: more than the socket buffers hold */
    for (uint32_t i = 0; i < FULL_WRS; i++)
        ck_assert_int_eq(
            pt_post_send(p.eb, 100 + i, EXS_PROV_WR_SEND, SIG, src, 0, FULL_LEN, i, 0, 0), 0);
    {
        double deadline = pt_now_ms() + PT_TIMEOUT_MS;

        while (TCP_CNT(p.b.ctx, tx_full) == full0 && pt_now_ms() < deadline)
            pt_sleep_ms(1);
    }
    ck_assert_msg(TCP_CNT(p.b.ctx, tx_full) > full0, "the socket never filled up");
    pt_expect_no_cqe(&p.b, 100);
    /* now read: every frame whole and in order, the tail sent as the socket drained */
    payload = malloc(FULL_LEN);
    ck_assert_ptr_nonnull(payload);
    for (uint32_t i = 0; i < FULL_WRS; i++) {
        struct tcp_wire_hdr h;

        ck_assert_int_eq(pt_raw_recv(fd, &h, sizeof(h), 20000), 0);
        ck_assert_uint_eq(h.type, TCP_WIRE_SEND);
        ck_assert_uint_eq(ntohl(h.psn), i);
        ck_assert_uint_eq(ntohl(h.len), FULL_LEN);
        ck_assert_int_eq(pt_raw_recv(fd, payload, FULL_LEN, 20000), 0);
        ck_assert_int_eq(pt_pattern_check(payload, FULL_LEN, 5), -1);
    }
    free(payload);
    {
        struct tcp_wire_hdr ack = pt_raw_hdr(TCP_WIRE_ACK, 0, 0, FULL_WRS - 1, 0, 0, 0);

        ck_assert_int_eq(pt_raw_send(fd, &ack, sizeof(ack)), 0);
    }
    for (uint32_t i = 0; i < FULL_WRS; i++)
        pt_expect_cqe(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    close(fd);
    pt_pair_close(&p);
}
END_TEST

/* ---- a held request whose peer hung up: nobody spins ---- */

struct idle_driver {
    struct exs_prov_ctx *ctx;
    int stop;        /* (atomic) */
    uint64_t turns;  /* ctx_progress calls (atomic) */
    uint64_t sleeps; /* polls that slept on the event fd (atomic) */
    struct exs_prov_cqe cqe[16];
    int ncqe;
    struct exs_prov_cm_event cm[4];
    int ncm;
};

/* A consumer's thread that drives ctx as an application would: progress, poll,
 * arm, sleep on the event fd (bounded, so that it notices stop). */
static void *idle_driver_main(void *arg)
{
    struct idle_driver *d = arg;

    while (!__atomic_load_n(&d->stop, __ATOMIC_RELAXED)) {
        struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(d->ctx), .events = POLLIN};
        int did = pt_ops->ctx_progress(d->ctx);

        struct exs_prov_cqe c;
        struct exs_prov_cm_event ev;

        __atomic_add_fetch(&d->turns, 1, __ATOMIC_RELAXED);
        if (did < 0)
            abort();
        while (pt_ops->ctx_poll(d->ctx, &c, 1) == 1) {
            if (d->ncqe < 16)
                d->cqe[d->ncqe] = c;
            d->ncqe++;
            did = 1;
        }
        while (pt_ops->ctx_cm_poll(d->ctx, &ev) == 1) {
            if (d->ncm < 4)
                d->cm[d->ncm] = ev;
            d->ncm++;
            did = 1;
        }
        if (did || pt_ops->ctx_arm(d->ctx) == -EAGAIN)
            continue;
        poll(&pfd, 1, 50);
        __atomic_add_fetch(&d->sleeps, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Run a driver of ctx for ms milliseconds; d gets what it saw. */
static void drive_for(struct idle_driver *d, struct exs_prov_ctx *ctx, int ms)
{
    pthread_t t;

    memset(d, 0, sizeof(*d));
    d->ctx = ctx;
    ck_assert_int_eq(pthread_create(&t, NULL, idle_driver_main, d), 0);
    pt_sleep_ms(ms);
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
}

enum hup_kind { HUP_SHUT_WR, HUP_CLOSE, HUP_RESET };

/* Bound on a driver's turns in 500 ms with nothing to do but a held request (RNR
 * retry every 200 ms) and the end of one connection: a spinning driver runs hundreds
 * of thousands (this counts turns, it does not time anything). */
#define HUP_MAX_TURNS 1000

/*
 * MANUAL_PROGRESS: a SEND is held at b (no receive posted, rnr_retry 7 = forever) and
 * the peer hangs up. The hang-up cannot be masked out of the epoll set, so unless the
 * turn acts on it the event fd stays readable and the consumer's thread, sleeping on
 * it, never sleeps. It must end the wait: the held request is dropped, the connection
 * ends (DISCONNECTED -ECONNRESET: the peer left without a DISCONNECT) and the driver
 * goes back to sleeping.
 */
static void hold_hup(enum hup_kind kind)
{
    struct pt_pair p;
    struct exs_prov_ep_attr attr = pt_default_attr();
    struct idle_driver d;
    struct pt_buf *rb;
    uint64_t waits0;
    int fd;

    pt_self_drive = 1;
    attr.rnr_timer_ms = 200; /* a slow RNR retry: few legitimate turns */
    pt_pair_open(&p, &attr, &attr);
    fd = pt_raw_establish(&p);
    rb = pt_pair_buf(&p, 'b', 64, LW, 0);
    drive_for(&d, p.b.ctx, 300);
    ck_assert_uint_lt(d.turns, HUP_MAX_TURNS); /* the driver sleeps when idle */
    waits0 = TCP_CNT(p.b.ctx, rnr_waits);
    raw_send_msg(fd, 0x5a, 64);
    for (double deadline = pt_now_ms() + PT_TIMEOUT_MS;
         TCP_CNT(p.b.ctx, rnr_waits) == waits0 && pt_now_ms() < deadline;)
        ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
    ck_assert_msg(TCP_CNT(p.b.ctx, rnr_waits) > waits0, "the SEND was never held");
    if (kind == HUP_SHUT_WR) {
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    } else {
        if (kind == HUP_RESET) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};

            ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
        }
        close(fd);
        fd = -1;
    }
    drive_for(&d, p.b.ctx, 500);
    printf("progress_hold_hup %d: %llu turns in 500 ms, %llu sleeps\n", (int)kind,
           (unsigned long long)d.turns, (unsigned long long)d.sleeps);
    fflush(stdout);
    ck_assert_msg(d.turns < HUP_MAX_TURNS, "the driver spun: %llu turns in 500 ms",
                  (unsigned long long)d.turns);
    /* a loaded machine may end the connection only after those 500 ms: drive on (the
     * spin bound above is what those 500 ms measure) */
    for (double deadline = pt_now_ms() + PT_TIMEOUT_MS; !d.ncm && pt_now_ms() < deadline;) {
        struct idle_driver more;

        drive_for(&more, p.b.ctx, 100);
        for (int i = 0; i < more.ncm && d.ncm < (int)EXS_ARRAY_SIZE(d.cm); i++)
            d.cm[d.ncm++] = more.cm[i];
        d.ncqe += more.ncqe;
    }
    /* the hang-up was not lost: the connection ended, the held SEND was dropped */
    ck_assert_int_eq(d.ncm, 1);
    ck_assert_int_eq(d.cm[0].type, EXS_PROV_CM_DISCONNECTED);
    ck_assert_ptr_eq(d.cm[0].ep, p.eb);
    ck_assert_int_eq(d.cm[0].status, -ECONNRESET);
    ck_assert_int_eq(d.ncqe, 0);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    p.b_up = 0;
    /* a receive posted now flushes: nothing of the dropped SEND reaches it */
    ck_assert_int_eq(pt_post_recv(p.eb, 9, rb, 0, 64), 0);
    pt_expect_cqe(&p.b, 9, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(rb->p, 64, 0));
    if (fd >= 0)
        close(fd);
    pt_pair_close(&p);
    pt_self_drive = 0;
}

START_TEST(progress_hold_hup_shut_wr)
{
    if (pt_skip_unless_tcp_itself("progress_hold_hup_shut_wr"))
        return;
    hold_hup(HUP_SHUT_WR);
}
END_TEST

START_TEST(progress_hold_hup_close)
{
    if (pt_skip_unless_tcp_itself("progress_hold_hup_close"))
        return;
    hold_hup(HUP_CLOSE);
}
END_TEST

START_TEST(progress_hold_hup_reset)
{
    if (pt_skip_unless_tcp_itself("progress_hold_hup_reset"))
        return;
    hold_hup(HUP_RESET);
}
END_TEST

/* ---- deadlines are walked only when one is due ---- */

#define TW_SILENT 64 /* sockets that never send their CONN_REQ: each has a deadline */

/* Connections with a deadline (here: accepted sockets waiting for their CONN_REQ, 10 s)
 * do not make every turn or post walk the deadline list: a ping-pong runs without a
 * single walk, since nothing is due (the timerfd is armed for the earliest deadline). */
START_TEST(progress_timer_walk_only_when_due)
{
    struct pt_pair p;
    struct pt_buf *b[4];
    int fds[TW_SILENT];
    uint64_t wa0, wb0;

    if (manual_setup(&p, "progress_timer_walk_only_when_due"))
        return;
    for (int i = 0; i < TW_SILENT; i++) {
        fds[i] = pt_raw_connect(&p);
        pt_drive_all(); /* accept as they come: the backlog is small */
    }
    for (double deadline = pt_now_ms() + PT_TIMEOUT_MS;
         TCP_CNT(p.b.ctx, accept_calls) < TW_SILENT && pt_now_ms() < deadline;)
        pt_drive_all();
    while (pt_drive_all() > 0)
        ;
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, accept_calls), TW_SILENT);
    bufs64(&p, b);
    wa0 = TCP_CNT(p.a.ctx, timer_walks);
    wb0 = TCP_CNT(p.b.ctx, timer_walks);
    pingpong(&p, b, 0);
    printf("progress_timer_walk_only_when_due: %llu + %llu walks in %d rounds\n",
           (unsigned long long)(TCP_CNT(p.a.ctx, timer_walks) - wa0),
           (unsigned long long)(TCP_CNT(p.b.ctx, timer_walks) - wb0), PP_ROUNDS);
    fflush(stdout);
    ck_assert_uint_eq(TCP_CNT(p.a.ctx, timer_walks), wa0);
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, timer_walks), wb0);
    for (int i = 0; i < TW_SILENT; i++)
        close(fds[i]);
    manual_close(&p);
}
END_TEST

/* The deadline still fires when due: a silent socket is closed at the handshake
 * timeout, by a walk the timerfd started. */
START_TEST(progress_timer_fires_when_due)
{
    struct pt_pair p;
    uint64_t w0, t0;
    int fd;

    if (manual_setup(&p, "progress_timer_fires_when_due"))
        return;
    /* before the socket arrives */
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "200"), 0);
    w0 = TCP_CNT(p.b.ctx, timer_walks);
    t0 = TCP_CNT(p.b.ctx, handshake_timeouts);
    fd = pt_raw_connect(&p);
    for (double deadline = pt_now_ms() + PT_TIMEOUT_MS;
         TCP_CNT(p.b.ctx, handshake_timeouts) == t0 && pt_now_ms() < deadline;) {
        struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(p.b.ctx), .events = POLLIN};

        if (pt_ops->ctx_progress(p.b.ctx) == 0 && pt_ops->ctx_arm(p.b.ctx) == 0)
            poll(&pfd, 1, 100);
    }
    ck_assert_uint_eq(TCP_CNT(p.b.ctx, handshake_timeouts), t0 + 1);
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, timer_walks), w0 + 1);
    ck_assert_int_eq(pt_raw_closed_within(fd, PT_TIMEOUT_MS), 1);
    close(fd);
    manual_close(&p);
    exs__params_set("tcp_hello_ms", exs__params_find("tcp_hello_ms")->defval);
}
END_TEST

Suite *prov_progress_suite(void)
{
    Suite *s = suite_create("prov_progress");
    TCase *tc = pt_tcase("progress");

    tcase_add_test(tc, progress_pingpong_direct);
    tcase_add_test(tc, progress_poll_in_one);
    tcase_add_test(tc, progress_post_writes_in_caller);
    tcase_add_test(tc, progress_command_in_caller);
    tcase_add_test(tc, progress_ack_rides_with_reply);
    tcase_add_test(tc, progress_ack_deferred_until_sleep);
    tcase_add_test(tc, progress_ack_deferred_busy_poll_bounded);
    tcase_add_test(tc, progress_ack_deferred_then_disconnect);
    tcase_add_test(tc, progress_post_acks_own_conn_only);
    tcase_add_test(tc, progress_role_busy_manual);
    tcase_add_test(tc, progress_role_busy_thread);
    tcase_add_test(tc, progress_no_lost_wakeup);
    tcase_add_test(tc, progress_full_socket);
    tcase_add_test(tc, progress_hold_hup_shut_wr);
    tcase_add_test(tc, progress_hold_hup_close);
    tcase_add_test(tc, progress_hold_hup_reset);
    tcase_add_test(tc, progress_timer_walk_only_when_due);
    tcase_add_test(tc, progress_timer_fires_when_due);
    suite_add_tcase(s, tc);
    return s;
}
