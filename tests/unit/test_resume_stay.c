/* SPDX-License-Identifier: MIT */
/* A connection that stays on its path (provider-shm.md, the switch declined) can never be cut
 * over (spec/protocol.md §9.2): the copies of its unsignaled sends (§6.4, resume.quiet) go at
 * that moment, their memory given back to the budget, not at close. */
#include <check.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

static uint64_t st_cnt(const char *set, const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup(set, name, &v), 0);
    return v;
}

/* b (passive) sent its SHM_SWITCH, the active side's answer (DECLINED: the mock has no shm
 * listener) not yet taken. */
static int st_b_switching(void)
{
    struct exs_conn *b = pp.b.conn;

    return b && b->state == EXS_CONN_CONNECTED && b->shmsw.sw && !b->shmsw.declined;
}

/*
 * Both ends resumable with shm on, SEQPACKET: b's SHM_SWITCH goes out; before a's DECLINED
 * comes back, b sends a small message unsignaled (ended at its post), which allocates b's
 * ring of copies and charges it to the memory budget. a's DECLINED then makes b stay on
 * its path for good (shm_declined_at_peer): b's copies are freed there and then (the
 * budget's use and b's mem_held drop by the ring's chunk), later small sends keep no copy,
 * and the message arrived whole.
 */
START_TEST(st_declined_frees_copies)
{
    static uint8_t sb[64], sb2[64], rb[2][100];
    uint64_t held0, aheld0, used0, chunk, dec0;
    struct pt_op s, s2, r[2];

    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    pt_params_resumable(&pp, SOCK_SEQPACKET, 1);
    pt_open(&pp, SOCK_SEQPACKET);
    exs__params.send_unsignaled = 1;
    pt_connect_to(&pp, NULL, 0);
    for (long steps = 0; !st_b_switching(); steps++) {
        if ((pt_dispatch_ctx(&pp, pp.a.ctx), st_b_switching()) ||
            (pt_dispatch_ctx(&pp, pp.b.ctx), st_b_switching()))
            break;
        ck_assert_msg(mock_step() && steps < 100000, "b never sent SHM_SWITCH alone");
    }
    dec0 = st_cnt("shm_path", "shm_declined_at_peer");
    ck_assert_ptr_null(pp.b.conn->resume.quiet);
    held0 = pp.b.conn->mem_held;
    aheld0 = pp.a.conn->mem_held;
    used0 = exs__mem_used();
    /* a small message of b, unsignaled: its copy's ring is allocated, charged */
    pp.b.conn->quiet_armed = 1;
    pt_send_pattern(&s, &pp.b, sb, sizeof(sb), 3);
    ck_assert_msg(s.done, "b's send did not end at its post");
    ck_assert_ptr_nonnull(pp.b.conn->resume.quiet);
    chunk = exs__mem_chunk(sizeof(*pp.b.conn->resume.quiet));
    ck_assert_uint_eq(pp.b.conn->mem_held, held0 + chunk);
    ck_assert_uint_eq(exs__mem_used(), used0 + chunk);
    pt_recv_post(&r[0], &pp.a, rb[0], sizeof(rb[0]), 0);
    pt_run(&pp);
    /* a declined, b stays for good: its copies are gone, the budget has them back */
    ck_assert_uint_eq(st_cnt("shm_path", "shm_declined_at_peer") - dec0, 1);
    ck_assert_int_eq(pp.b.conn->resume.over, 1);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_null(pp.b.conn->resume.quiet);
    ck_assert_uint_eq(pp.b.conn->mem_held, held0);
    /* (what a took meanwhile for its receive is a's) */
    ck_assert_uint_eq(exs__mem_used() - used0, pp.a.conn->mem_held - aheld0);
    ck_assert_int_eq(r[0].done, 1);
    ck_assert_int_eq(r[0].op.result, (ssize_t)sizeof(sb));
    ck_assert(pt_check(rb[0], sizeof(sb), 3));
    /* a later small send may still go unsignaled, without a copy */
    pp.b.conn->quiet_armed = 1;
    pt_send_pattern(&s2, &pp.b, sb2, sizeof(sb2), 9);
    ck_assert_int_eq(s2.done, 1);
    ck_assert_ptr_null(pp.b.conn->resume.quiet);
    pt_recv_post(&r[1], &pp.a, rb[1], sizeof(rb[1]), 0);
    pt_run(&pp);
    ck_assert_int_eq(r[1].done, 1);
    ck_assert(pt_check(rb[1], sizeof(sb2), 9));
    pt_op_fini(&s);
    pt_op_fini(&s2);
    pt_op_fini(&r[0]);
    pt_op_fini(&r[1]);
    pt_close_both(&pp);
    exs__params.send_unsignaled = 0;
    ck_assert_uint_eq(mock_violations(), 0);
}
END_TEST

Suite *proto_resume_stay_suite(void)
{
    Suite *s = suite_create("proto_resume_stay");
    TCase *tc = tcase_create("resume_stay");

    tcase_add_test(tc, st_declined_frees_copies);
    suite_add_tcase(s, tc);
    return s;
}
