/* SPDX-License-Identifier: MIT */
/* Credit unit tests over the mock provider: the last-credit rule, returns, stalls, no RNR. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

static void cr_begin(int sock_type, uint32_t credits, uint32_t ring, uint32_t seed)
{
    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(seed);
    pt_params(&pp.pa, sock_type);
    pt_params(&pp.pb, sock_type);
    pp.pa.credits = pp.pb.credits = credits;
    pp.pa.ring_size = pp.pb.ring_size = ring;
    pt_open(&pp, sock_type);
    pt_connect(&pp);
}

static void cr_end(void)
{
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    ck_assert_uint_eq(pt_rnr(&pp), 0);
    pt_close(&pp);
    mock_set_reorder(0);
}

/* After the traffic settles, every receive a peer consumed was posted again. */
static void assert_receives_restored(void)
{
    ck_assert_uint_eq(mock_recv_posted(pp.a.conn->ep), pp.pa.credits);
    ck_assert_uint_eq(mock_recv_posted(pp.b.conn->ep), pp.pb.credits);
}

#define FLOOD_N 200
static uint8_t fl_sb[2][FLOOD_N][64], fl_rb[2][FLOOD_N][64];
static struct pt_op fl_s[2][FLOOD_N], fl_r[2][FLOOD_N];

/* Both sides send at once with the fewest credits (2) and, first, no receive posted by
 * the application: without the last-credit rule both would spend their last credit on
 * data and wait forever for the other's credits. Everything arrives, in order. */
static void flood(int sock_type, int late_receives, uint32_t seed)
{
    struct pt_side *side[2] = {&pp.a, &pp.b};

    cr_begin(sock_type, 4, 1024, seed);
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < FLOOD_N; i++) {
            pt_fill(fl_sb[d][i], 64, (uint64_t)d << 40 | (uint64_t)i * 64);
            pt_op_init(&fl_s[d][i], side[d], EXS_OP_SEND, fl_sb[d][i], 1 + i % 64, 0);
            ck_assert_int_eq(pt_post(&fl_s[d][i]), 0);
        }
    }
    if (late_receives)
        pt_run(&pp);
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < FLOOD_N; i++) {
            memset(fl_rb[d][i], 0, 64);
            /* SEQPACKET: one message each; STREAM: exactly one send's bytes each (WAITALL) */
            pt_op_init(&fl_r[d][i], side[!d], EXS_OP_RECV, fl_rb[d][i], 1 + i % 64,
                       sock_type == SOCK_STREAM ? MSG_WAITALL : 0);
            ck_assert_int_eq(pt_post(&fl_r[d][i]), 0);
        }
    }
    pt_run(&pp);
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < FLOOD_N; i++) {
            ck_assert_int_eq(fl_s[d][i].done, 1);
            ck_assert_int_eq(fl_s[d][i].op.result, 1 + i % 64);
            ck_assert_int_eq(fl_r[d][i].done, 1);
            ck_assert_int_eq(fl_r[d][i].op.result, 1 + i % 64);
            ck_assert(
                pt_check(fl_rb[d][i], (size_t)(1 + i % 64), (uint64_t)d << 40 | (uint64_t)i * 64));
            pt_op_fini(&fl_s[d][i]);
            pt_op_fini(&fl_r[d][i]);
        }
    }
    assert_receives_restored();
    cr_end();
}

START_TEST(cr_last_credit_seqpacket)
{
    flood(SOCK_SEQPACKET, _i & 1, (uint32_t)(_i >> 1) * 97u);
}
END_TEST

START_TEST(cr_last_credit_stream)
{
    flood(SOCK_STREAM, _i & 1, (uint32_t)(_i >> 1) * 97u);
}
END_TEST

/* The receiver's application takes nothing for a while: the sender fills the ring,
 * then waits (credits come back, ring space does not); nothing is lost, no RNR, and it
 * all arrives once receives are posted. */
START_TEST(cr_ring_full_stall)
{
    static uint8_t sb[40][200], rb[40][200];
    struct pt_op s[40], r[40];
    struct exs_sock_stats st;
    uint64_t off = 0;

    cr_begin(SOCK_STREAM, 4, 1024, (uint32_t)_i * 31u);
    for (int i = 0; i < 40; i++) {
        pt_fill(sb[i], 200, off);
        off += 200;
        pt_op_init(&s[i], &pp.a, EXS_OP_SEND, sb[i], 200, 0);
        ck_assert_int_eq(pt_post(&s[i]), 0);
    }
    pt_run(&pp);
    /* 1024 ring bytes: sends 0..4 fit, the sixth is cut at the ring end */
    for (int i = 0; i < 40; i++)
        ck_assert_int_eq(s[i].done, i < 5);
    exs__conn_stats(pp.a.conn, &st);
    ck_assert_uint_eq(st.bytes_sent, 1000);
    for (int i = 0; i < 40; i++) {
        memset(rb[i], 0, 200);
        pt_op_init(&r[i], &pp.b, EXS_OP_RECV, rb[i], 200, MSG_WAITALL);
        ck_assert_int_eq(pt_post(&r[i]), 0);
    }
    pt_run(&pp);
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(s[i].done, 1);
        ck_assert_int_eq(s[i].op.result, 200);
        ck_assert_int_eq(r[i].done, 1);
        ck_assert_int_eq(r[i].op.result, 200);
        ck_assert(pt_check(rb[i], 200, (uint64_t)i * 200));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    assert_receives_restored();
    cr_end();
}
END_TEST

/* A one-way flow returns credits without any data going back: the receiver sends
 * standalone ACKs, so the sender never stalls for good. */
START_TEST(cr_returned_one_way)
{
    static uint8_t sb[100][32], rb[100][32];
    struct pt_op s[100], r[100];

    cr_begin(SOCK_SEQPACKET, 4, 8192, 0);
    for (int i = 0; i < 100; i++) {
        memset(rb[i], 0, 32);
        pt_op_init(&r[i], &pp.b, EXS_OP_RECV, rb[i], 32, 0);
        ck_assert_int_eq(pt_post(&r[i]), 0);
    }
    for (int i = 0; i < 100; i++) {
        pt_fill(sb[i], 32, (uint64_t)i << 8);
        pt_op_init(&s[i], &pp.a, EXS_OP_SEND, sb[i], 32, 0);
        ck_assert_int_eq(pt_post(&s[i]), 0);
    }
    pt_run(&pp);
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(s[i].done, 1);
        ck_assert_int_eq(r[i].op.result, 32);
        ck_assert(pt_check(rb[i], 32, (uint64_t)i << 8));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    assert_receives_restored();
    cr_end();
}
END_TEST

/* Control SENDs of each side, counted by the mock tap. */
static uint64_t ctrl_sends[2];

static void count_ctrl(void *arg, struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr,
                       const uint8_t *p, uint32_t len)
{
    (void)arg;
    (void)p;
    (void)len;
    if (wr->opcode == EXS_PROV_WR_SEND)
        ctrl_sends[ep == pp.b.conn->ep]++;
}

/* One message: the receiver returns its credit in an ACK, and then everything rests.
 * An ACK itself consumes a receive, so a side that answered every owed credit with an
 * ACK would ping-pong ACKs forever with the other (with credits 2 or 3, half of them is
 * one credit). */
START_TEST(cr_quiet_after_one_message)
{
    static const uint32_t credits[] = {3, 4, 8};
    static uint8_t sb[10], rb[10];
    struct pt_op s, r;
    long steps = 0;

    cr_begin(SOCK_SEQPACKET, credits[_i], 1024, 0);
    memset(ctrl_sends, 0, sizeof(ctrl_sends));
    mock_set_tap(count_ctrl, NULL);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    do {
        pt_dispatch(&pp);
        ck_assert_msg(++steps < 10000,
                      "credits %u: still busy after 10000 steps: %llu control SENDs from a, "
                      "%llu from b",
                      credits[_i], (unsigned long long)ctrl_sends[0],
                      (unsigned long long)ctrl_sends[1]);
    } while (mock_step());
    mock_set_tap(NULL, NULL);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(r.op.result, sizeof(rb));
    ck_assert_uint_le(ctrl_sends[0] + ctrl_sends[1], 2);
    pt_op_fini(&s);
    pt_op_fini(&r);
    cr_end();
}
END_TEST

/* A SEQPACKET ping-pong over a 1 KiB ring (64 B messages: 16 fill it): each side owes at
 * fewer credits than the ACK threshold (every reply carries them back), so only ring space consumed
 * and unreported makes an ACK due (spec/protocol.md §7). The control flush's quick test
 * (conn.h) must not take that for "nothing due": without the ACKs the writer's view of
 * the ring fills after 16 messages and the exchange stops. */
START_TEST(cr_ring_ack_in_ping_pong)
{
    static uint8_t sb[2][64], rb[2][64];
    struct pt_side *side[2] = {&pp.a, &pp.b};
    struct pt_op s, r;

    cr_begin(SOCK_SEQPACKET, 8, 1024, 0);
    memset(ctrl_sends, 0, sizeof(ctrl_sends));
    mock_set_tap(count_ctrl, NULL);
    for (int i = 0; i < 100; i++) {
        int d = i & 1; /* a to b, then b to a */

        pt_fill(sb[d], 64, (uint64_t)i << 8);
        memset(rb[d], 0, 64);
        pt_op_init(&r, side[!d], EXS_OP_RECV, rb[d], 64, 0);
        ck_assert_int_eq(pt_post(&r), 0);
        pt_op_init(&s, side[d], EXS_OP_SEND, sb[d], 64, 0);
        ck_assert_int_eq(pt_post(&s), 0);
        pt_run(&pp);
        ck_assert_msg(s.done && r.done,
                      "message %d (of 100) not through: %llu ACKs from a, %llu from b", i,
                      (unsigned long long)ctrl_sends[0], (unsigned long long)ctrl_sends[1]);
        ck_assert_int_eq(r.op.result, 64);
        ck_assert(pt_check(rb[d], 64, (uint64_t)i << 8));
        ck_assert_uint_lt(side[!d]->conn->owed, 4); /* below the credit threshold */
        pt_op_fini(&s);
        pt_op_fini(&r);
    }
    mock_set_tap(NULL, NULL);
    /* 50 messages of 64 B each way: a quarter of the ring (256 B) every 4 */
    ck_assert_uint_ge(ctrl_sends[0], 5);
    ck_assert_uint_ge(ctrl_sends[1], 5);
    cr_end();
}
END_TEST

Suite *proto_credits_suite(void)
{
    Suite *s = suite_create("proto_credits");
    TCase *tc = tcase_create("credits");

    tcase_add_loop_test(tc, cr_last_credit_seqpacket, 0, 6);
    tcase_add_loop_test(tc, cr_last_credit_stream, 0, 6);
    tcase_add_loop_test(tc, cr_ring_full_stall, 0, 3);
    tcase_add_test(tc, cr_returned_one_way);
    /* With credits 3 (and 2, then allowed) the two sides answered each other's ACK with
     * an ACK forever: the ACK threshold, half the credits, was one credit, and every ACK
     * consumes one. The threshold is now at least 2 and credits at least 3. */
    tcase_add_loop_test(tc, cr_quiet_after_one_message, 0, 3);
    tcase_add_test(tc, cr_ring_ack_in_ping_pong);
    suite_add_tcase(s, tc);
    return s;
}
