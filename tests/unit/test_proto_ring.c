/* SPDX-License-Identifier: MIT */
/* STREAM ring autotuning (spec/protocol.md §7.4): the grow/shrink/budget decision and ring switches
 * under traffic. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/lockorder.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

/* ---- the decision (a pure function) ---- */

static struct exs_ring_tune_in tune_in(void)
{
    return (struct exs_ring_tune_in){
        .size = 1u << 20,
        .init = 1u << 20,
        .max = 64u << 20,
        .budget = 1u << 30,
        .in_use = 1u << 20,
        .win_bytes = 1u << 20,
        .reader_waiting = 1,
        .idle_limit_us = 1000000,
    };
}

START_TEST(rt_grow_when_ring_limited)
{
    struct exs_ring_tune_in in = tune_in();
    uint32_t n;

    in.win_bytes = (3u << 18) - 1; /* less than three quarters of the ring: doubles */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 2u << 20);
    in.win_bytes = (1u << 19); /* exactly half the ring in a round trip: still limited */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 2u << 20);
    in.win_bytes = (1u << 19) - 1; /* less: the ring is not what limits */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
    ck_assert_uint_eq(n, in.size);
    in = tune_in();
    in.reader_waiting = 0; /* the application does not keep up: more ring would not help */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
}
END_TEST

/* The ring limited the whole round trip (three quarters of it or more arrived in one):
 * the sender may have much more, grow by EXS_RING_GROW_FAST at once (slow start) instead
 * of doubling; 1 MiB reaches 64 MiB in 3 steps instead of 6. */
START_TEST(rt_grow_fast_when_ring_full)
{
    struct exs_ring_tune_in in = tune_in();
    uint32_t n;
    int steps = 0;

    in.win_bytes = 3u << 18; /* exactly three quarters */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, EXS_RING_GROW_FAST << 20);
    in.win_bytes = 5u << 20; /* more than the ring: the same step, not sized from it */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, EXS_RING_GROW_FAST << 20);
    for (in.size = 1u << 20; in.size < in.max; steps++) {
        in.win_bytes = in.size;
        ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
        ck_assert_uint_gt(n, in.size);
        in.size = n;
    }
    ck_assert_uint_eq(in.size, 64u << 20);
    ck_assert_int_eq(steps, 3);
    in.size = 32u << 20; /* capped by max */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 64u << 20);
}
END_TEST

START_TEST(rt_grow_capped_by_max)
{
    struct exs_ring_tune_in in = tune_in();
    uint32_t n;

    in.size = 48u << 20;
    in.win_bytes = in.size;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 64u << 20); /* not 96 MiB */
    in.size = 64u << 20;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
    in = tune_in();
    in.max = (3u << 20) + 63; /* not a multiple of the slot: rounded down */
    in.size = 2u << 20;
    in.win_bytes = in.size;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 3u << 20);
    in.max = 0; /* off */
    in.size = in.init;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
    in.max = 8u << 30; /* above the wire's limit: the limit */
    in.size = EXS_WIRE_RING_SIZE_MAX;
    in.win_bytes = in.size;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
}
END_TEST

START_TEST(rt_budget_refuses)
{
    struct exs_ring_tune_in in = tune_in();
    uint32_t n;

    in.budget = 3u << 20;
    in.in_use = 1u << 20; /* + 2 MiB = 3 MiB: fits */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 2u << 20); /* the fast step (4 MiB) passes it: doubles */
    in.budget = 5u << 20;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
    ck_assert_uint_eq(n, 4u << 20); /* 1 + 4 MiB: the fast step fits */
    in.budget = 3u << 20;
    in.in_use = (1u << 20) + 64; /* one slot more: refused */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_REFUSED);
    ck_assert_uint_eq(n, in.size);
    in.budget = 0; /* no bound */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_GROW);
}
END_TEST

START_TEST(rt_shrink_when_idle)
{
    struct exs_ring_tune_in in = tune_in();
    uint32_t n;

    in.size = 8u << 20;
    in.win_bytes = 0;
    in.idle_us = 999999;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
    in.idle_us = 1000000;
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_SHRINK);
    ck_assert_uint_eq(n, in.init);
    in.idle_limit_us = 0; /* never */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
    in = tune_in();
    in.win_bytes = 0;
    in.idle_us = 5000000; /* at its initial size already */
    ck_assert_int_eq(exs__stream_ring_tune(&in, &n), EXS_RING_KEEP);
}
END_TEST

/* ---- ring switches under traffic (mock provider) ---- */

static struct pt_pair pp;

static void rg_setup(void)
{
    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    pt_open(&pp, SOCK_STREAM);
    pt_connect(&pp);
}

static void rg_teardown(void)
{
    pt_close_both(&pp);
    ck_assert_uint_eq(exs__conn_ring_bytes(), 0); /* every region went back */
}

/* Offer the peer of side a region of size bytes; the result of the offer. */
static int rg_offer(struct pt_side *side, uint32_t size)
{
    int ret;

    EXS_LITE_LOCK(&side->conn->lock, EXS_LOCK_CONN);
    ret = exs__stream_ring_offer_locked(side->conn, size, 0);
    EXS_LITE_UNLOCK(&side->conn->lock, EXS_LOCK_CONN);
    return ret;
}

#define RG_N 96
#define RG_R 1024
static uint8_t rg_sb[2][RG_N][3000], rg_rb[2][RG_R][3000];
static struct pt_op rg_s[2][RG_N], rg_r[2][RG_R];
static int rg_nr[2], rg_checked[2];
static uint64_t rg_roff[2];

static void rg_recv(int d, size_t len, int flags)
{
    struct pt_side *side[2] = {&pp.a, &pp.b};

    ck_assert_int_lt(rg_nr[d], RG_R);
    pt_recv_post(&rg_r[d][rg_nr[d]], side[!d], rg_rb[d][rg_nr[d]], len, flags);
    rg_nr[d]++;
}

static void rg_verify(int d)
{
    while (rg_checked[d] < rg_nr[d] && rg_r[d][rg_checked[d]].done) {
        struct pt_op *o = &rg_r[d][rg_checked[d]++];

        ck_assert_int_eq(o->op.err, 0);
        ck_assert_int_gt(o->op.result, 0);
        ck_assert(pt_check(o->op.buf, (size_t)o->op.result, rg_roff[d]));
        rg_roff[d] += (uint64_t)o->op.result;
    }
    for (int i = rg_checked[d]; i < rg_nr[d]; i++)
        ck_assert_int_eq(rg_r[d][i].done, 0);
}

/* Both directions stream much more than the rings while each receiver moves its ring
 * again and again (grow and shrink between 1 KiB and 16 KiB) with bytes still in it and
 * writes in flight, completions reordered: every byte arrives once, in order; every
 * retired region is freed once copied out; the old keys die. */
START_TEST(rg_switch_under_traffic)
{
    static const uint32_t sizes[] = {1024, 2048, 4096, 8192, 16384, 1536, 6144};
    struct pt_side *side[2] = {&pp.a, &pp.b};
    uint64_t soff[2] = {0, 0}, switches[2] = {0, 0};
    struct exs_sock_stats st;
    uint32_t seed = (uint32_t)_i + 1;

    memset(rg_nr, 0, sizeof(rg_nr));
    memset(rg_checked, 0, sizeof(rg_checked));
    memset(rg_roff, 0, sizeof(rg_roff));
    mock_set_reorder(seed * 2654435761u);
    srand(seed);
    for (int k = 0; k < RG_N; k += 8) {
        for (int d = 0; d < 2; d++) {
            for (int i = k; i < k + 8; i++) {
                size_t len = 1 + (size_t)(rand() % 3000);

                pt_send_pattern(&rg_s[d][i], side[d], rg_sb[d][i], len, soff[d]);
                soff[d] += len;
                if (rand() % 4 == 0) {
                    int ret = rg_offer(side[!d], sizes[rand() % 7]);

                    ck_assert_msg(ret == 0 || ret == -EBUSY || ret == -EAGAIN, "offer: %d", ret);
                    switches[d] += ret == 0;
                }
                if (rand() % 3 == 0)
                    pt_run(&pp);
            }
        }
        pt_run(&pp);
        for (int d = 0; d < 2; d++) {
            rg_verify(d);
            while (rg_roff[d] < soff[d]) {
                int waitall = rand() % 4 == 0;
                size_t len = 1 + (size_t)(rand() % 3000);

                if (waitall && len > soff[d] - rg_roff[d])
                    len = soff[d] - rg_roff[d];
                rg_recv(d, len, waitall ? MSG_WAITALL : 0);
                pt_run(&pp);
                rg_verify(d);
                ck_assert_int_eq(rg_checked[d], rg_nr[d]);
            }
        }
    }
    for (int d = 0; d < 2; d++) {
        ck_assert_uint_eq(rg_roff[d], soff[d]);
        for (int i = 0; i < RG_N; i++) {
            pt_assert_done(&rg_s[d][i], (ssize_t)rg_s[d][i].op.len, 0);
            pt_op_fini(&rg_s[d][i]);
        }
        for (int i = 0; i < rg_nr[d]; i++)
            pt_op_fini(&rg_r[d][i]);
        /* every offer was answered (the ring data of the last ones all arrived) */
        pt_stats(side[!d], &st);
        ck_assert_uint_gt(switches[d], 3);
        ck_assert_uint_eq(st.ring_resizes, switches[d]);
        ck_assert_uint_eq(st.ring_size, side[!d]->conn->p.ring_size);
        ck_assert_ptr_null(side[!d]->conn->autotune.old_mem); /* all copied out: retired */
        ck_assert_int_eq(side[!d]->conn->autotune.offered, 0);
    }
    ck_assert_uint_eq(pt_rnr(&pp), 0);
}
END_TEST

/* An offer still unanswered, or a retired region still holding bytes, when the
 * connection closes: every region goes back (teardown checks the process count). */
START_TEST(rg_close_with_offer_out)
{
    static uint8_t sb[2000];
    struct pt_op s;

    pt_send_pattern(&s, &pp.a, sb, sizeof(sb), 0);
    pt_run(&pp);
    pt_assert_done(&s, 2000, 0);
    ck_assert_int_eq(rg_offer(&pp.b, 8192), 0);
    if (_i == 1) {
        pt_run(&pp); /* answered: the old region holds the 2000 bytes nobody received */
        ck_assert_ptr_nonnull(pp.b.conn->autotune.old_mem);
        ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    }
    ck_assert_uint_gt(exs__conn_ring_bytes(), 0);
    pt_op_fini(&s);
}
END_TEST

/* The idle shrink comes on time (§7.4): while autotuning is on, the ring's periodic look
 * asks to run again within EXS_RING_IDLE_MS even at the initial size (the ring may grow
 * before the next check, and nothing re-arms it then); none when autotuning or idle
 * shrinking is off. */
START_TEST(rg_timer_watches_initial_ring)
{
    struct exs_conn *c = pp.b.conn;
    uint64_t now = exs__now_us();

    exs__params.ring_idle_ms = 200;
    EXS_LITE_LOCK(&c->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(c->p.ring_size, c->ring_init); /* not grown */
    c->p.autotune = 1;
    ck_assert_uint_eq(exs__stream_ring_timer_locked(c, now), 200);
    exs__params.ring_idle_ms = 0;
    ck_assert_uint_eq(exs__stream_ring_timer_locked(c, now), 0);
    exs__params.ring_idle_ms = 200;
    c->p.autotune = 0;
    ck_assert_uint_eq(exs__stream_ring_timer_locked(c, now), 0);
    EXS_LITE_UNLOCK(&c->lock, EXS_LOCK_CONN);
}
END_TEST

/* Ring-limited is judged per minimum round trip (§7.4): a window of 100 ms that moved a
 * whole ring is no reason to grow when the path's round trip is 1 ms (the smoothed one
 * and the window stretched by a busy machine); the same bytes per 100 ms round trip are. */
static int rg_tune_offers(uint64_t rtt_min_us, uint64_t window_us)
{
    struct exs_conn *c = pp.b.conn;
    int offered;

    EXS_LITE_LOCK(&c->lock, EXS_LOCK_CONN);
    c->p.autotune = 1;
    c->stats.srtt_us = window_us;
    c->autotune.rtt_min = rtt_min_us;
    c->autotune.rtt_min_t = exs__now_us();
    c->autotune.win_t0 = exs__now_us() - window_us;
    c->autotune.win_bytes = c->p.ring_size;
    exs__stream_recv_progress_locked(c);
    offered = c->autotune.offered;
    EXS_LITE_UNLOCK(&c->lock, EXS_LOCK_CONN);
    return offered;
}

START_TEST(rg_tune_per_min_rtt)
{
    static uint8_t sb[3000], rb[3000];
    struct pt_op s, r;

    exs__params.ring_max = 1u << 24;
    exs__params.ring_budget = 0;
    pt_recv_post(&r, &pp.b, rb, sizeof(rb), 0); /* the reader waits: it keeps up */
    pt_run(&pp);
    ck_assert_int_eq(rg_tune_offers(1000, 100000), 0);
    ck_assert_int_eq(rg_tune_offers(100000, 100000), 1);
    pt_send_pattern(&s, &pp.a, sb, sizeof(sb), 0);
    pt_run(&pp);
    pt_assert_done(&s, 3000, 0);
    pt_assert_done(&r, 3000, 0);
    ck_assert_int_eq(pt_check(rb, sizeof(rb), 0), 1);
    ck_assert_uint_eq(pp.b.conn->stats.ring_resizes, 1);
    pt_op_fini(&s);
    pt_op_fini(&r);
}
END_TEST

/* Offers that cannot be made: a second one while one is out, sizes out of bounds,
 * SEQPACKET, a peer whose hello lacks the feature. */
START_TEST(rg_offer_refused)
{
    ck_assert_int_eq(rg_offer(&pp.b, 1000), -EINVAL);
    ck_assert_int_eq(rg_offer(&pp.b, EXS_WIRE_RESIZE_MIN - 64), -EINVAL);
    ck_assert_int_eq(rg_offer(&pp.b, EXS_WIRE_RING_SIZE_MAX + 64), -EINVAL);
    ck_assert_int_eq(rg_offer(&pp.b, 8192), 0);
    ck_assert_int_eq(rg_offer(&pp.b, 16384), -EBUSY);
    pt_run(&pp);
    ck_assert_int_eq(rg_offer(&pp.b, 16384), 0); /* answered, nothing left in the old one */
    pt_run(&pp);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->peer.features &= ~EXS_WIRE_FEAT_RESIZE; /* as an old peer's hello */
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.a.conn, 8192, 0), -EOPNOTSUPP);
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
}
END_TEST

/* The process budget: an offer that would pass it is refused, with nothing allocated. */
START_TEST(rg_offer_budget)
{
    uint64_t before = exs__conn_ring_bytes();

    exs__params.ring_budget = before + 4096;
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 8192, 1), -ENOBUFS);
    ck_assert_uint_eq(exs__conn_ring_bytes(), before);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 4096, 1), 0);
    ck_assert_uint_eq(exs__conn_ring_bytes(), before + 4096);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pt_run(&pp);
    ck_assert_uint_eq(exs__conn_ring_bytes(), before); /* the old 4 KiB went */
}
END_TEST

/* The memory budget (§9.3): past it a grow is refused (counted) with nothing allocated,
 * and so is a new connection; what the live ones hold is unchanged. */
START_TEST(rg_mem_budget)
{
    static const struct exs_conn_cb cb;
    uint64_t used = exs__mem_used(), grows = exs__mem.mem_refused_growth;
    uint64_t conns = exs__mem.mem_refused_conns;
    struct exs_conn *c = NULL;

    ck_assert_uint_gt(used, 2 * 4096); /* two rings at least */
    exs__params.ring_budget = 0;
    exs__params.mem_budget = used + 4096;
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 8192, 1), -ENOBUFS);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(exs__mem.mem_refused_growth, grows + 1);
    ck_assert_uint_eq(exs__mem_used(), used);
    ck_assert_int_eq(exs__conn_create(pp.a.ctx, &pp.pa, &cb, NULL, &c), -ENOBUFS);
    ck_assert_ptr_null(c);
    ck_assert_uint_eq(exs__mem.mem_refused_conns, conns + 1);
    ck_assert_uint_eq(exs__mem_used(), used);
    exs__params.mem_budget = 0;
    ck_assert_int_eq(exs__conn_create(pp.a.ctx, &pp.pa, &cb, NULL, &c), 0);
    ck_assert_uint_gt(exs__mem_used(), used);
    exs__conn_destroy(c);
    ck_assert_uint_eq(exs__mem_used(), used);
}
END_TEST

/* §7 sender step 2, hysteresis (EXS_STREAM_DIRECT_LINGER): a sender in a direct phase
 * whose ADVERTs ran out writes the ring only once its writes in flight completed (the
 * ADVERT of the next receive usually comes meanwhile); 0: at once (the published rule).
 * Either way the data arrives, in order. _i: the linger setting. */
START_TEST(rg_direct_linger)
{
    static uint8_t sb[2][3000], rb[2][3000];
    struct pt_op s[2], r[2];
    struct exs_sock_stats st;

    exs__params.stream_direct_min = 0;
    exs__params.stream_direct_linger = (uint64_t)_i;
    pt_recv_post(&r[0], &pp.b, rb[0], 3000, 0);
    pt_run(&pp);                                      /* its ADVERT is at the sender */
    pt_send_pattern(&s[0], &pp.a, sb[0], 3000, 0);    /* direct, in flight */
    pt_send_pattern(&s[1], &pp.a, sb[1], 2000, 3000); /* no ADVERT left */
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.direct_xfers, 1);
    if (_i) { /* waits for the direct write */
        ck_assert_uint_eq(st.indirect_xfers, 0);
        ck_assert_uint_eq(st.mode_switches, 0);
        ck_assert(PHASE_IS_DIRECT(pp.a.conn->stream.ps));
    } else { /* the ring at once: a switch */
        ck_assert_uint_eq(st.indirect_xfers, 1);
        ck_assert_uint_eq(st.mode_switches, 1);
    }
    pt_run(&pp); /* the direct write completes: with no ADVERT come, the ring */
    pt_assert_done(&r[0], 3000, 0);
    ck_assert(pt_check(rb[0], 3000, 0));
    pt_assert_done(&s[0], 3000, 0);
    pt_assert_done(&s[1], 2000, 0);
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.indirect_xfers, 1);
    ck_assert_uint_eq(st.mode_switches, 1);
    /* a linger that no ADVERT ended skips the linger in the next direct phase */
    ck_assert_uint_eq(pp.a.conn->stream.linger_skip, (_i ? 1u : 0u));
    pt_recv_post(&r[1], &pp.b, rb[1], 3000, 0);
    pt_run(&pp);
    pt_assert_done(&r[1], 2000, 0);
    ck_assert(pt_check(rb[1], 2000, 3000));
    for (int i = 0; i < 2; i++) {
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
}
END_TEST

/* §7 linger, only while the sends waiting are no more than the writes in flight: with
 * more, the receives are fewer than the sends and the ring goes at once (one send in
 * flight, one waiting: it lingers until a third is queued). */
START_TEST(rg_direct_linger_count)
{
    static uint8_t sb[3][3000], rb[2][3000];
    struct pt_op s[3], r[2];
    struct exs_sock_stats st;

    exs__params.stream_direct_min = 0;
    exs__params.stream_direct_linger = 1;
    pt_recv_post(&r[0], &pp.b, rb[0], 3000, 0);
    pt_run(&pp);
    pt_send_pattern(&s[0], &pp.a, sb[0], 3000, 0);    /* direct, in flight */
    pt_send_pattern(&s[1], &pp.a, sb[1], 2000, 3000); /* 1 waiting, 1 in flight: lingers */
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.indirect_xfers, 0);
    ck_assert_int_eq(pp.a.conn->stream.lingering, 1);
    pt_send_pattern(&s[2], &pp.a, sb[2], 1000, 5000); /* 2 waiting, 1 in flight: the ring */
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.direct_xfers, 1);
    ck_assert_uint_ge(st.indirect_xfers, 1); /* s2 may follow s1 once its write completed */
    ck_assert_uint_eq(st.mode_switches, 1);
    ck_assert_int_eq(pp.a.conn->stream.lingering, 0);
    ck_assert_uint_eq(pp.a.conn->stream.linger_skip, 0); /* not a failed linger */
    pt_run(&pp);
    pt_assert_done(&r[0], 3000, 0);
    ck_assert(pt_check(rb[0], 3000, 0));
    pt_recv_post(&r[1], &pp.b, rb[1], 3000, 0);
    pt_run(&pp);
    pt_assert_done(&r[1], 3000, 0);
    ck_assert(pt_check(rb[1], 3000, 3000));
    for (int i = 0; i < 3; i++) {
        pt_assert_done(&s[i], (ssize_t)s[i].op.len, 0);
        pt_op_fini(&s[i]);
    }
    for (int i = 0; i < 2; i++)
        pt_op_fini(&r[i]);
}
END_TEST

Suite *proto_ring_suite(void)
{
    Suite *s = suite_create("proto_ring");
    TCase *tc = tcase_create("tune");

    tcase_add_test(tc, rt_grow_when_ring_limited);
    tcase_add_test(tc, rt_grow_fast_when_ring_full);
    tcase_add_test(tc, rt_grow_capped_by_max);
    tcase_add_test(tc, rt_budget_refuses);
    tcase_add_test(tc, rt_shrink_when_idle);
    suite_add_tcase(s, tc);
    tc = tcase_create("switch");
    tcase_add_checked_fixture(tc, rg_setup, rg_teardown);
    tcase_add_loop_test(tc, rg_switch_under_traffic, 0, 6);
    tcase_add_loop_test(tc, rg_close_with_offer_out, 0, 2);
    tcase_add_test(tc, rg_offer_refused);
    tcase_add_test(tc, rg_offer_budget);
    tcase_add_test(tc, rg_mem_budget);
    tcase_add_test(tc, rg_timer_watches_initial_ring);
    tcase_add_test(tc, rg_tune_per_min_rtt);
    tcase_add_loop_test(tc, rg_direct_linger, 0, 2);
    tcase_add_test(tc, rg_direct_linger_count);
    suite_add_tcase(s, tc);
    return s;
}
