/* SPDX-License-Identifier: MIT */
/* RESUMING bounded (spec/protocol.md §9.2, When and The wait), on the mock: a peer that closed
 * its endpoint is not a path failure, and at most resume_max connections wait for a new path,
 * the oldest giving up first, with no provider resource held while they wait. */
#include <check.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

#define RB_PAIRS 4 /* resume_max + 1 */
#define RB_MAX   3

static struct pt_pair rb[RB_PAIRS];
static struct pt_op rb_r[RB_PAIRS];
static uint8_t rb_buf[RB_PAIRS][64];

/* The passive side's owner gives a fallback (sock.c's resume_mr): it may be cut over; it
 * is never asked to, as no resume request comes (the active side has no fallback). */
static int rb_resume_mr(struct exs_conn *conn, struct exs_op *op, struct exs_prov_ctx *ctx)
{
    (void)conn;
    (void)op;
    (void)ctx;
    ck_abort_msg("no new path is made in these tests");
    return -EINVAL;
}

static const struct exs_conn_cb rb_cb = {
    .established = pt_on_established,
    .dead = pt_on_dead,
    .resume_mr = rb_resume_mr,
};

static uint64_t rb_count(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("fallback", name, &v), 0);
    return v;
}

/* Pair i connected, both ends resumable, b's owner with a fallback, a receive posted on b. */
static void rb_open(int i)
{
    unit_pair_fresh(&rb[i], SOCK_STREAM, 1, 1);
    pt_connect(&rb[i]);
    ck_assert_uint_ne(rb[i].b.conn->sess_token, 0);
    rb[i].b.conn->cb = &rb_cb;
    pt_recv_post(&rb_r[i], &rb[i].b, rb_buf[i], sizeof(rb_buf[i]), 0);
    pt_run(&rb[i]);
}

static int rb_state(struct exs_conn *conn)
{
    int st;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    st = conn->state;
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return st;
}

/* Close what is left of pairs 0..n-1 and free them (conns first: pt_close counts every
 * conn of the process). */
static void rb_close(int n)
{
    for (int i = 0; i < n; i++) {
        if (rb[i].a.conn && rb_state(rb[i].a.conn) != EXS_CONN_DEAD)
            exs__conn_close(rb[i].a.conn);
        if (rb[i].b.conn && rb_state(rb[i].b.conn) != EXS_CONN_DEAD)
            exs__conn_close(rb[i].b.conn);
        pt_run(&rb[i]);
        ck_assert_int_eq(rb[i].a.dead, 1);
        ck_assert_int_eq(rb[i].b.dead, 1);
        pt_op_fini(&rb_r[i]);
    }
    for (int i = 0; i < n; i++) {
        exs__conn_destroy(rb[i].a.conn);
        exs__conn_destroy(rb[i].b.conn);
        rb[i].a.conn = rb[i].b.conn = NULL;
    }
    for (int i = 0; i < n; i++)
        pt_close(&rb[i]);
}

/* The active side's process ends without a SHUTDOWN: its endpoint is destroyed (the
 * provider tells the peer it closed: EXS_PROV_CM_F_PEER_CLOSED) and its conn is gone. The
 * passive side, resumable with a fallback, ends at once as a connection that is not
 * resumable would: its receive with ECONNRESET, never RESUMING (the flushes that come
 * before the DISCONNECTED decide nothing), no failure counted, nothing waiting. Before
 * the change it waited in RESUMING for connect_timeout_ms. */
START_TEST(rb_peer_closed_not_resuming)
{
    uint64_t fail0, evict0;
    struct exs_conn *a;

    rb_open(0);
    fail0 = rb_count("fallback_resume_failures");
    evict0 = rb_count("fallback_resume_evicted");
    a = rb[0].a.conn;
    EXS_LITE_LOCK(&a->lock, EXS_LOCK_CONN);
    exs__conn_revoke_all_locked(a);
    exs__prov_ep_destroy(a->ep);
    a->ep = NULL;
    exs__conn_end_locked(a, ECONNRESET, "the process ended");
    EXS_LITE_UNLOCK(&a->lock, EXS_LOCK_CONN);
    pt_run(&rb[0]);
    ck_assert_int_eq(rb[0].b.conn->resume.over, 0); /* never RESUMING */
    ck_assert_int_eq(rb_state(rb[0].b.conn), EXS_CONN_DEAD);
    ck_assert_int_eq(rb[0].b.dead, 1);
    pt_assert_done(&rb_r[0], -1, ECONNRESET);
    ck_assert_uint_eq(rb_count("fallback_resume_failures"), fail0);
    ck_assert_uint_eq(rb_count("fallback_resume_evicted"), evict0);
    rb_close(1);
}
END_TEST

/* The same link dropped instead (a path failure, no PEER_CLOSED): the passive side waits
 * in RESUMING, holding no endpoint and no grant (its old endpoint went once drained). */
START_TEST(rb_path_failure_resumes)
{
    struct mock_stats st;

    rb_open(0);
    mock_drop(rb[0].b.conn->ep);
    pt_run(&rb[0]);
    ck_assert_int_eq(rb_state(rb[0].b.conn), EXS_CONN_RESUMING);
    ck_assert_ptr_null(rb[0].b.conn->ep);
    mock_stats(rb[0].b.ctx, &st);
    ck_assert_uint_eq(st.grants, st.revokes);
    ck_assert_int_eq(rb_r[0].done, 0); /* waits for the new path */
    rb_close(1);
}
END_TEST

/* resume_max + 1 connections cut one after the other: the oldest gives up (ETIMEDOUT,
 * counted as evicted and as a failure) when the last one begins to wait; the others wait
 * on, none holding an endpoint. Before the change all four waited, each with its endpoint. */
START_TEST(rb_cap_evicts_oldest)
{
    uint64_t evict0, fail0;

    for (int i = 0; i < RB_PAIRS; i++)
        rb_open(i);
    exs__params.resume_max = RB_MAX;
    evict0 = rb_count("fallback_resume_evicted");
    for (int i = 0; i < RB_PAIRS; i++) {
        mock_drop(rb[i].b.conn->ep);
        fail0 = rb_count("fallback_resume_failures");
        pt_run(&rb[i]);
        ck_assert_int_eq(rb[i].a.dead, 1); /* no fallback: ended, counted */
        ck_assert_uint_eq(rb_count("fallback_resume_failures") - fail0, i < RB_MAX ? 1 : 2);
        ck_assert_int_eq(rb_state(rb[i].b.conn), EXS_CONN_RESUMING);
        ck_assert_ptr_null(rb[i].b.conn->ep);
    }
    ck_assert_uint_eq(rb_count("fallback_resume_evicted") - evict0, 1);
    ck_assert_int_eq(rb_state(rb[0].b.conn), EXS_CONN_DEAD);
    ck_assert_int_eq(rb[0].b.dead, 1);
    pt_assert_done(&rb_r[0], -1, ETIMEDOUT);
    for (int i = 1; i < RB_PAIRS; i++) {
        ck_assert_int_eq(rb_state(rb[i].b.conn), EXS_CONN_RESUMING);
        ck_assert_int_eq(rb_r[i].done, 0);
    }
    /* one leaves (closed): room for one more without an eviction */
    exs__conn_close(rb[1].b.conn);
    pt_run(&rb[1]);
    ck_assert_int_eq(rb_state(rb[1].b.conn), EXS_CONN_DEAD);
    ck_assert_uint_eq(rb_count("fallback_resume_evicted") - evict0, 1);
    rb_close(RB_PAIRS);
}
END_TEST

Suite *proto_resume_bound_suite(void)
{
    Suite *s = suite_create("proto_resume_bound");
    TCase *tc = tcase_create("bound");

    tcase_add_test(tc, rb_peer_closed_not_resuming);
    tcase_add_test(tc, rb_path_failure_resumes);
    tcase_add_test(tc, rb_cap_evicts_oldest);
    suite_add_tcase(s, tc);
    return s;
}
