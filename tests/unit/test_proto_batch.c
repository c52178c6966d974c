/* SPDX-License-Identifier: MIT */
/* Sender batching over the mock provider: synchronization-ahead, elastic threshold, order, credits.
 */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

/* The WRITE WITH IMMEDIATEs a carried out (mock tap): length and immediate of each. */
#define MAX_WRITES 4096
static struct {
    struct exs_prov_ep *ep;
    int n;
    uint32_t len[MAX_WRITES];
    uint32_t imm[MAX_WRITES];
} tap;

static void bt_tap(void *arg, struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr,
                   const uint8_t *p, uint32_t len)
{
    (void)arg;
    (void)p;
    if (ep != tap.ep || wr->opcode != EXS_PROV_WR_RDMA_WRITE_WITH_IMM || tap.n >= MAX_WRITES)
        return;
    tap.len[tap.n] = len;
    tap.imm[tap.n++] = wr->imm_data;
}

static uint32_t bt_ring_b; /* b's ring size for the next bt_open (0: the default) */
static uint32_t bt_eager;  /* both sides' eager_max for the next bt_open (0: the default) */

/* Open and connect a pair of sock_type; a's batch_max (b keeps the default). */
static void bt_open(int sock_type, uint32_t batch_max, uint32_t credits)
{
    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    memset(&tap, 0, sizeof(tap));
    mock_set_reorder(0);
    pt_params(&pp.pa, sock_type);
    pt_params(&pp.pb, sock_type);
    pp.pa.batch_max = batch_max;
    if (credits)
        pp.pa.credits = pp.pb.credits = credits;
    if (bt_ring_b)
        pp.pb.ring_size = bt_ring_b;
    bt_ring_b = 0;
    if (bt_eager)
        pp.pa.eager_max = pp.pb.eager_max = bt_eager;
    bt_eager = 0;
    pt_open(&pp, sock_type);
    pt_connect(&pp);
    tap.ep = pp.a.conn->ep;
    mock_set_tap(bt_tap, NULL);
}

static void bt_teardown(void)
{
    mock_set_tap(NULL, NULL);
    pt_close_both(&pp);
}

/* The end of a test: every send and receive op released, then the pair closed. */
static void bt_end(struct pt_op *s, int ns, struct pt_op *r, int nr)
{
    for (int i = 0; i < ns; i++)
        pt_op_fini(&s[i]);
    for (int i = 0; i < nr; i++)
        pt_op_fini(&r[i]);
    bt_teardown();
}

#define BURST 10

/*
 * A burst of small sends while one is in flight: the first leaves at once, the other
 * nine wait (nothing more is posted) and leave as ONE write when the first completes;
 * every send and every receive completes, in order, with its own length and bytes.
 * Without batching this is ten writes. Looped: SEQPACKET, STREAM.
 */
START_TEST(bt_burst_one_write)
{
    int sp = _i == 0;
    static uint8_t sb[BURST][100], rb[BURST][100];
    struct pt_op s[BURST], r[BURST];
    struct exs_sock_stats st;
    uint32_t wr_out;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 8192, 0);
    wr_out = pp.a.conn->wr_out;
    pt_send_pattern(&s[0], &pp.a, sb[0], 100, 0);
    ck_assert_uint_eq(pp.a.conn->wr_out, wr_out + 1); /* posted by the call itself */
    ck_assert_uint_eq(pp.a.conn->ring_wr_out, 1);
    for (int i = 1; i < BURST; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, 100u * i);
    ck_assert_uint_eq(pp.a.conn->wr_out, wr_out + 1); /* gathered, not posted */
    pt_run(&pp);
    ck_assert_int_eq(tap.n, 2);
    ck_assert_uint_eq(tap.len[0], 100);
    ck_assert_uint_eq(exs_imm_tag(tap.imm[0]), 0);
    ck_assert_uint_eq(exs_imm_kind(tap.imm[1]), EXS_IMM_INDIRECT);
    if (sp) {
        ck_assert_uint_eq(exs_imm_tag(tap.imm[1]), BURST - 1);
        ck_assert_uint_eq(tap.len[1], (BURST - 1) * exs_wire_batch_rec_size(100));
    } else {
        ck_assert_uint_eq(exs_imm_tag(tap.imm[1]), 0); /* plain stream bytes */
        ck_assert_uint_eq(tap.len[1], (BURST - 1) * 100);
    }
    for (int i = 0; i < BURST; i++) {
        pt_assert_done(&s[i], 100, 0);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batches_sent, 1);
    ck_assert_uint_eq(st.msgs_batched, BURST - 1);
    ck_assert_uint_eq(st.indirect_xfers, 2);
    ck_assert_uint_eq(st.bytes_sent, BURST * 100);
    for (int i = 0; i < BURST; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 100, 0);
    pt_run(&pp);
    for (int i = 0; i < BURST; i++) {
        pt_assert_done(&r[i], 100, 0);
        ck_assert(pt_check(rb[i], 100, 100u * i));
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
    }
    bt_end(s, BURST, r, BURST);
}
END_TEST

/* A lone send leaves at once, every time: sends one at a time, each after the previous
 * completed, are each posted by their own call and never batched. */
START_TEST(bt_lone_at_once)
{
    int sp = _i == 0;
    static uint8_t sb[5][64], rb[5][64];
    struct pt_op s[5], r[5];
    struct exs_sock_stats st;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 8192, 0);
    for (int i = 0; i < 5; i++) {
        uint32_t wr_out = pp.a.conn->wr_out;

        pt_send_pattern(&s[i], &pp.a, sb[i], 64, 64u * i);
        ck_assert_uint_eq(pp.a.conn->wr_out, wr_out + 1);
        ck_assert_int_eq(mock_step(), 1); /* the fabric carries it: nothing else waited */
        pt_run(&pp);
        pt_assert_done(&s[i], 64, 0);
        ck_assert_int_eq(tap.n, i + 1);
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batches_sent, 0);
    for (int i = 0; i < 5; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 64, 0);
    pt_run(&pp);
    for (int i = 0; i < 5; i++) {
        pt_assert_done(&r[i], 64, 0);
        ck_assert(pt_check(rb[i], 64, 64u * i));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    bt_teardown();
}
END_TEST

/* SEQPACKET: message boundaries and truncation inside one batched write; receives
 * posted before (some) and after (the rest) the batch arrived. */
START_TEST(bt_sp_boundaries_trunc)
{
    static const size_t lens[] = {1, 0, 7, 8, 9, 63, 64, 65, 200, 3, 1023};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    static uint8_t sb[N][1024], rb[N][64];
    struct pt_op s[N], r[N];
    struct exs_sock_stats st;

    bt_open(SOCK_SEQPACKET, 8192, 0);
    for (int i = 0; i < 3; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 64, 0);
    pt_run(&pp);
    for (int i = 0; i < N; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], lens[i], 1000u * i);
    pt_run(&pp);
    for (int i = 3; i < N; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 64, 0);
    pt_run(&pp);
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 1);
    ck_assert_uint_lt(st.indirect_xfers, N);
    for (int i = 0; i < N; i++) {
        size_t n = lens[i] < 64 ? lens[i] : 64;

        pt_assert_done(&s[i], (ssize_t)lens[i], 0);
        pt_assert_done(&r[i], (ssize_t)n, 0);
        ck_assert_int_eq(r[i].op.rflags, lens[i] > 64 ? MSG_TRUNC : 0);
        ck_assert(pt_check(rb[i], n, 1000u * i));
        for (size_t j = n; j < 64; j++)
            ck_assert_uint_eq(rb[i][j], 0);
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    bt_teardown();
}
END_TEST

/* STREAM: small and large sends mixed keep byte order (a large one makes the run
 * leave first); receives of 150 bytes cut across the batches' boundaries. */
START_TEST(bt_st_mixed_partial)
{
    static const size_t lens[] = {50, 70, 90, 3000, 40, 60, 80, 100, 2000, 30};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    static uint8_t sb[N][3000], rb[64][150];
    struct pt_op s[N], r[64];
    struct exs_sock_stats st;
    uint64_t off = 0, got = 0;
    int nr = 0;

    bt_open(SOCK_STREAM, 8192, 0);
    for (int i = 0; i < N; i++) {
        pt_send_pattern(&s[i], &pp.a, sb[i], lens[i], off);
        off += lens[i];
    }
    pt_run(&pp); /* all in the ring (4096 bytes), or waiting for room */
    while (got < off) {
        ck_assert_int_lt(nr, 64);
        pt_recv_post(&r[nr], &pp.b, rb[nr], 150, 0);
        pt_run(&pp);
        ck_assert_int_eq(r[nr].done, 1);
        ck_assert_int_gt(r[nr].op.result, 0);
        ck_assert(pt_check(rb[nr], (size_t)r[nr].op.result, got));
        got += (uint64_t)r[nr].op.result;
        nr++;
    }
    ck_assert_uint_eq(got, off);
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 1);
    for (int i = 0; i < N; i++) {
        pt_assert_done(&s[i], (ssize_t)lens[i], 0);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
    }
    for (int i = 0; i < nr; i++)
        pt_op_fini(&r[i]);
    bt_teardown();
}
END_TEST

/* SEQPACKET: small, large (announced, read) and small again keep their order; the
 * large one makes the gathered run leave before it is announced. */
START_TEST(bt_sp_mixed_order)
{
    static const size_t lens[] = {10, 20, 30, 2000, 40, 50, 60};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    static uint8_t sb[N][2000], rb[N][2000];
    struct pt_op s[N], r[N];
    struct exs_sock_stats st;

    bt_open(SOCK_SEQPACKET, 8192, 0);
    for (int i = 0; i < N; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], lens[i], 1000u * i);
    pt_run(&pp);
    for (int i = 0; i < N; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 2000, 0);
    pt_run(&pp);
    for (int i = 0; i < N; i++) {
        pt_assert_done(&s[i], (ssize_t)lens[i], 0);
        pt_assert_done(&r[i], (ssize_t)lens[i], 0);
        ck_assert(pt_check(rb[i], lens[i], 1000u * i));
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    pt_stats(&pp.a, &st);
    /* 10 alone; {20, 30} leave before the large one is announced; {40, 50, 60} were
     * gathered behind that batched write */
    ck_assert_uint_eq(st.batches_sent, 2);
    ck_assert_uint_eq(st.msgs_batched, 5);
    bt_teardown();
}
END_TEST

/* STREAM MSG_WAITALL on bytes that came in batches: the receive waits for all of it. */
START_TEST(bt_st_waitall)
{
    static uint8_t sb[20][100], rb[1500];
    struct pt_op s[20], r;
    struct exs_sock_stats st;

    bt_open(SOCK_STREAM, 8192, 0);
    for (int i = 0; i < 10; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, 100u * i);
    pt_run(&pp);
    pt_recv_post(&r, &pp.b, rb, sizeof(rb), MSG_WAITALL);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 0); /* 1000 of 1500 */
    for (int i = 10; i < 20; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, 100u * i);
    pt_run(&pp);
    pt_assert_done(&r, 1500, 0);
    ck_assert(pt_check(rb, 1500, 0));
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 2);
    for (int i = 0; i < 20; i++) {
        pt_assert_done(&s[i], 100, 0);
        pt_op_fini(&s[i]);
    }
    pt_op_fini(&r);
    bt_teardown();
}
END_TEST

/* Batching off (EXS_BATCH_MAX 0): the burst of bt_burst_one_write is ten writes, as
 * before batching existed. */
START_TEST(bt_off)
{
    int sp = _i == 0;
    static uint8_t sb[BURST][100], rb[BURST][100];
    struct pt_op s[BURST], r[BURST];
    struct exs_sock_stats st;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 0, 0);
    for (int i = 0; i < BURST; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, 100u * i);
    pt_run(&pp);
    ck_assert_int_eq(tap.n, BURST);
    for (int i = 0; i < BURST; i++) {
        ck_assert_uint_eq(tap.len[i], 100);
        ck_assert_uint_eq(exs_imm_tag(tap.imm[i]), 0);
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batches_sent, 0);
    ck_assert_uint_eq(st.batch_thresh, 0);
    ck_assert_uint_eq(st.indirect_xfers, BURST);
    for (int i = 0; i < BURST; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 100, 0);
    pt_run(&pp);
    for (int i = 0; i < BURST; i++) {
        pt_assert_done(&s[i], 100, 0);
        pt_assert_done(&r[i], 100, 0);
        ck_assert(pt_check(rb[i], 100, 100u * i));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    bt_teardown();
}
END_TEST

/* Credits never overrun: 3 credits each way, 300 small sends at once, the receiver
 * taking them as they come; the mock counts any write that finds no receive (RNR),
 * and pt_close_both asserts there was none. */
START_TEST(bt_credits)
{
    int sp = _i == 0;
    enum { N = 300 };
    static uint8_t sb[N][40], rb[N][40];
    static struct pt_op s[N], r[N];
    struct exs_sock_stats st;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 8192, 3);
    for (int i = 0; i < N; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 40, 40u * i);
    for (int i = 0; i < N; i++) {
        pt_recv_post(&r[i], &pp.b, rb[i], 40, MSG_WAITALL * !sp);
        if (i % 7 == 0)
            pt_run(&pp);
    }
    pt_run(&pp);
    ck_assert_uint_eq(pt_rnr(&pp), 0);
    for (int i = 0; i < N; i++) {
        pt_assert_done(&s[i], 40, 0);
        pt_assert_done(&r[i], 40, 0);
        ck_assert(pt_check(rb[i], 40, 40u * i));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 1);
    bt_teardown();
}
END_TEST

/* The elastic threshold: it starts at its floor, doubles while runs fill it with a
 * write in flight, never passes EXS_BATCH_MAX, and halves back when the load drops
 * (one send in flight, one gathered). */
START_TEST(bt_elastic)
{
    enum { N = 200 };
    static uint8_t sb[N][100];
    static struct pt_op s[N];
    static uint8_t rb[64 * 1024];
    struct pt_op r;
    struct exs_sock_stats st;
    uint64_t off = 0, got = 0;

    bt_open(SOCK_STREAM, 4096, 0);
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batch_thresh, EXS_BATCH_FLOOR);
    /* a burst: each call sees the first write still in flight */
    for (int i = 0; i < 30; i++) {
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, off);
        off += 100;
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batch_thresh, 2048); /* the run filled 1024 with a write in flight */
    for (int i = 30; i < 100; i++) {
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, off);
        off += 100;
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batch_thresh, 4096); /* and never more than EXS_BATCH_MAX */
    pt_run(&pp);
    pt_recv_post(&r, &pp.b, rb, off, MSG_WAITALL);
    pt_run(&pp);
    pt_assert_done(&r, (ssize_t)off, 0);
    ck_assert(pt_check(rb, off, 0));
    got = off;
    pt_op_fini(&r);
    /* light load: two sends at a time; each completion finds a run far below half */
    for (int i = 100; i < 120; i += 2) {
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, off);
        pt_send_pattern(&s[i + 1], &pp.a, sb[i + 1], 100, off + 100);
        off += 200;
        pt_run(&pp);
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batch_thresh, EXS_BATCH_FLOOR);
    pt_recv_post(&r, &pp.b, rb, off - got, MSG_WAITALL);
    pt_run(&pp);
    pt_assert_done(&r, (ssize_t)(off - got), 0);
    ck_assert(pt_check(rb, off - got, got));
    pt_op_fini(&r);
    for (int i = 0; i < 120; i++) {
        pt_assert_done(&s[i], 100, 0);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
    }
    bt_teardown();
}
END_TEST

/* Messages each larger than the threshold's floor: the first behind a write in flight
 * grows the threshold, so that later ones can share a write (SEQPACKET, eager below
 * 2048, messages of about 1500 bytes against a floor of 1024). */
START_TEST(bt_grows_for_large)
{
    enum { N = 8 };
    static uint8_t sb[N][1500], rb[N][1500];
    struct pt_op s[N], r[N];
    struct exs_sock_stats st;

    bt_ring_b = 65536;
    bt_eager = 2048;
    bt_open(SOCK_SEQPACKET, 8192, 0);
    for (int i = 0; i < N; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], 1500, 0);
    pt_run(&pp);
    for (int i = 0; i < N; i++) {
        pt_send_pattern(&s[i], &pp.a, sb[i], 1500 - i, 1000u * i);
        if (i == 1) {
            pt_stats(&pp.a, &st);
            ck_assert_uint_gt(st.batch_thresh, EXS_BATCH_FLOOR);
        }
    }
    pt_run(&pp);
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 1);
    for (int i = 0; i < N; i++) {
        pt_assert_done(&s[i], 1500 - i, 0);
        pt_assert_done(&r[i], 1500 - i, 0);
        ck_assert(pt_check(rb[i], 1500 - (size_t)i, 1000u * i));
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    bt_teardown();
}
END_TEST

/* Many small sends under reordering of completions across eps, both types: the bytes
 * and the order of every event hold (SEQPACKET receives posted as the sends go; STREAM
 * receives after, so that the bytes go through the ring). */
START_TEST(bt_reordered)
{
    int sp = _i % 2 == 0;
    enum { N = 120 };
    static uint8_t sb[N][300], rb[2 * N][300];
    static struct pt_op s[N], r[2 * N];
    struct exs_sock_stats st;
    uint64_t off = 0, got = 0;
    int nr = 0;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 8192, 0);
    mock_set_reorder(1234 + (uint32_t)_i);
    for (int i = 0; i < N; i++) {
        size_t len = (size_t)(i * 37 % 300);

        pt_send_pattern(&s[i], &pp.a, sb[i], len, sp ? 1000u * i : off);
        off += len;
        if (sp)
            pt_recv_post(&r[nr], &pp.b, rb[nr], 300, 0), nr++;
        if (i % 5 == 4)
            pt_run(&pp);
    }
    pt_run(&pp);
    while (!sp && got < off) {
        ck_assert_int_lt(nr, 2 * N);
        pt_recv_post(&r[nr], &pp.b, rb[nr], 300, 0);
        pt_run(&pp);
        ck_assert_int_eq(r[nr].done, 1);
        ck_assert_int_gt(r[nr].op.result, 0);
        ck_assert(pt_check(rb[nr], (size_t)r[nr].op.result, got));
        got += (uint64_t)r[nr].op.result;
        nr++;
    }
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(s[i].done, 1);
        ck_assert_int_eq(s[i].op.err, 0);
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
    }
    for (int i = 0; i < nr; i++) {
        ck_assert_int_eq(r[i].done, 1);
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
        if (sp) {
            ck_assert_int_eq(r[i].op.result, i * 37 % 300);
            ck_assert(pt_check(rb[i], (size_t)r[i].op.result, 1000u * i));
        }
    }
    pt_stats(&pp.a, &st);
    ck_assert_uint_ge(st.batches_sent, 1);
    bt_end(s, N, r, nr);
}
END_TEST

/* exs_close right after a burst: the gathered sends still leave (as they would have
 * without batching), before the SHUTDOWN: the peer reads every message, then the end. */
START_TEST(bt_close_sends_gathered)
{
    int sp = _i == 0;
    static uint8_t sb[5][100], rb[6][600];
    struct pt_op s[5], r[6];
    struct exs_sock_stats st;

    bt_open(sp ? SOCK_SEQPACKET : SOCK_STREAM, 8192, 0);
    for (int i = 0; i < 5; i++)
        pt_send_pattern(&s[i], &pp.a, sb[i], 100, 100u * i);
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batches_sent, 0); /* four gathered behind the first */
    exs__conn_close(pp.a.conn);
    pt_stats(&pp.a, &st);
    ck_assert_uint_eq(st.batches_sent, 1);
    pt_run(&pp);
    if (sp) {
        for (int i = 0; i < 6; i++)
            pt_recv_post(&r[i], &pp.b, rb[i], 100, 0);
        pt_run(&pp);
        for (int i = 0; i < 5; i++) {
            pt_assert_done(&r[i], 100, 0);
            ck_assert(pt_check(rb[i], 100, 100u * i));
        }
        pt_assert_done(&r[5], 0, 0); /* end of stream */
    } else {
        pt_recv_post(&r[0], &pp.b, rb[0], 500, MSG_WAITALL);
        pt_recv_post(&r[1], &pp.b, rb[1], 100, 0);
        pt_run(&pp);
        pt_assert_done(&r[0], 500, 0);
        ck_assert(pt_check(rb[0], 500, 0));
        pt_assert_done(&r[1], 0, 0); /* end of stream */
    }
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(s[i].done, 1); /* closed: reported cancelled, in order */
        ck_assert_uint_eq(s[i].order, (uint64_t)i + 1);
        pt_op_fini(&s[i]);
    }
    for (int i = 0; i < (sp ? 6 : 2); i++)
        pt_op_fini(&r[i]);
    bt_teardown();
}
END_TEST

Suite *proto_batch_suite(void)
{
    Suite *s = suite_create("proto_batch");
    TCase *tc = tcase_create("batch");

    tcase_add_loop_test(tc, bt_burst_one_write, 0, 2);
    tcase_add_loop_test(tc, bt_lone_at_once, 0, 2);
    tcase_add_test(tc, bt_sp_boundaries_trunc);
    tcase_add_test(tc, bt_st_mixed_partial);
    tcase_add_test(tc, bt_sp_mixed_order);
    tcase_add_test(tc, bt_st_waitall);
    tcase_add_loop_test(tc, bt_off, 0, 2);
    tcase_add_loop_test(tc, bt_credits, 0, 2);
    tcase_add_test(tc, bt_elastic);
    tcase_add_test(tc, bt_grows_for_large);
    tcase_add_loop_test(tc, bt_reordered, 0, 4);
    tcase_add_loop_test(tc, bt_close_sends_gathered, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
