/* SPDX-License-Identifier: MIT */
/* The completion queue never overflows: eps reserve room for all they can produce. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

#define LW EXS_PROV_ACCESS_LOCAL_WRITE

/* Many eps at full receive depth on a ctx whose queue starts small, all disconnected at
 * once: every flush completion arrives, exactly once. */
START_TEST(cq_mass_disconnect_all_flushes_arrive)
{
    enum { NEPS = 16, DEPTH = 128 };
    struct pt_host a, b;
    struct exs_prov_listener *lis;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct exs_prov_ep *ea[NEPS], *eb[NEPS];
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *rb;
    uint8_t *seen = calloc(NEPS * DEPTH, 1);
    int got = 0;

    ck_assert_ptr_nonnull(seen);
    pt_host_open(&a);
    pt_host_open_cq(&b, 64); /* far less than NEPS * DEPTH */
    lis = pt_listen(&b, &addr, &addrlen);
    rb = pt_buf_new(&b, 64, LW, 0);
    at.max_recv_wr = DEPTH;
    at.max_send_wr = 8;
    for (int i = 0; i < NEPS; i++) {
        struct exs_prov_cm_event ev;

        ck_assert_int_eq(pt_ops->ep_create(a.ctx, &at, &ea[i]), 0);
        ck_assert_int_eq(pt_ops->ep_create(b.ctx, &at, &eb[i]), 0);
        for (int j = 0; j < DEPTH; j++)
            ck_assert_int_eq(pt_post_recv(eb[i], (uint64_t)i * DEPTH + j, rb, 0, 64), 0);
        ck_assert_int_eq(pt_ops->connect(ea[i], (struct sockaddr *)&addr, addrlen, NULL, 0), 0);
        pt_wait_cm(&b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
        ck_assert_int_eq(pt_ops->accept(ev.req, eb[i], NULL, 0), 0);
        pt_wait_cm(&a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
        pt_wait_cm(&b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    }
    for (int i = 0; i < NEPS; i++)
        ck_assert_int_eq(pt_ops->disconnect(ea[i]), 0);
    while (got < NEPS * DEPTH) {
        struct exs_prov_cqe c;
        uint64_t id;

        if (!pt_try_cqe(&b, 10000, &c))
            ck_abort_msg("%d of %d flush completions arrived", got, NEPS * DEPTH);
        ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
        id = c.wr_id;
        ck_assert_uint_lt(id, NEPS * DEPTH);
        ck_assert_ptr_eq(c.ep, eb[id / DEPTH]);
        ck_assert_msg(!seen[id], "wr_id %llu completed twice", (unsigned long long)id);
        seen[id] = 1;
        got++;
    }
    pt_expect_no_cqe(&b, 50);
    for (int i = 0; i < NEPS; i++) {
        pt_ops->ep_destroy(ea[i]);
        pt_ops->ep_destroy(eb[i]);
    }
    pt_ops->listener_destroy(lis);
    pt_buf_free(rb);
    pt_host_close(&a);
    pt_host_close(&b);
    free(seen);
}
END_TEST

/* That completions not yet polled hold their slots (so the queue cannot overflow) is
 * checked on every provider by test_prov_keep.c, keep_armed_completions_hold_slots. */

/* ep_create fails -ENOBUFS once the queue cannot grow to hold another ep; destroying
 * an ep gives its share back. */
START_TEST(cq_ep_create_enobufs)
{
    enum { MAXEPS = 20000 };
    struct pt_host h;
    struct exs_prov_ep **eps = calloc(MAXEPS, sizeof(*eps));
    struct exs_prov_ep_attr at = pt_default_attr();
    int n = 0, rc = 0;

    ck_assert_ptr_nonnull(eps);
    pt_host_open(&h);
    at.max_send_wr = h.ctx->caps.max_send_wr;
    at.max_recv_wr = h.ctx->caps.max_recv_wr;
    while (n < MAXEPS && (rc = pt_ops->ep_create(h.ctx, &at, &eps[n])) == 0)
        n++;
    printf("cq_ep_create_enobufs: %d eps of %u + %u before %d (max_cqe %u)\n", n, at.max_send_wr,
           at.max_recv_wr, rc, h.ctx->caps.max_cqe);
    ck_assert_msg(rc == -ENOBUFS, "ep_create %d: %d, expected -ENOBUFS", n, rc);
    ck_assert_int_ge(n, 1);
    ck_assert_uint_le((uint64_t)n * (at.max_send_wr + at.max_recv_wr), h.ctx->caps.max_cqe);
    pt_ops->ep_destroy(eps[--n]);
    ck_assert_int_eq(pt_ops->ep_create(h.ctx, &at, &eps[n]), 0);
    n++;
    while (n)
        pt_ops->ep_destroy(eps[--n]);
    pt_host_close(&h);
    free(eps);
}
END_TEST

static uint64_t cq_vrb_counter(const char *name)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup("prov.verbs", name, &v) == 0,
                  "counter prov.verbs.%s not registered", name);
    return v;
}

/* Arm h until it says nothing is pending (taking what it found). */
static void cq_arm_settle(struct pt_host *h)
{
    for (int i = 0; i < 1000; i++) {
        struct exs_prov_cqe c;
        struct exs_prov_cm_event ev;

        if (pt_ops->ctx_arm(h->ctx) == 0)
            return;
        while (pt_ops->ctx_poll(h->ctx, &c, 1) == 1)
            ;
        while (pt_ops->ctx_cm_poll(h->ctx, &ev) == 1)
            ;
    }
    ck_abort_msg("ctx_arm never returned 0");
}

/* verbs: ctx_arm reads the completion channel (a system call on rxe) only when a
 * completion was taken from the CQ since its request for notification, or since a read
 * that found nothing: an idle context armed again and again reads nothing, and the
 * standing request still makes the event fd readable for the next completion
 * (spec/provider.md, verbs provider mapping, ctx_arm). */
START_TEST(cq_arm_reads_channel_only_after_completion)
{
    struct pt_pair p;
    struct pt_buf *sb, *rb;
    struct pollfd pfd;
    uint64_t reads, skips;

    if (strcmp(pt_ops->name, "verbs") != 0) {
        printf("cq_arm_reads_channel_only_after_completion: verbs only, skipped\n");
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    sb = pt_pair_buf(&p, 'a', 64, LW, 1);
    rb = pt_pair_buf(&p, 'b', 64, LW, 0);
    cq_arm_settle(&p.b);
    cq_arm_settle(&p.b); /* a read that found nothing, or a request renewed */
    reads = cq_vrb_counter("cq_event_reads");
    skips = cq_vrb_counter("cq_event_skips");
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), 0);
    ck_assert_msg(cq_vrb_counter("cq_event_reads") == reads,
                  "an idle ctx_arm read the completion channel %llu times in 8 calls",
                  (unsigned long long)(cq_vrb_counter("cq_event_reads") - reads));
    ck_assert_uint_ge(cq_vrb_counter("cq_event_skips"), skips + 8);
    /* the request still stands: a completion makes the event fd readable */
    ck_assert_int_eq(pt_post_recv(p.eb, 1, rb, 0, 64), 0);
    ck_assert_int_eq(
        pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, sb, 0, 64, 0, 0, 0), 0);
    pfd = (struct pollfd){.fd = pt_ops->ctx_event_fd(p.b.ctx), .events = POLLIN};
    ck_assert_msg(poll(&pfd, 1, PT_TIMEOUT_MS) == 1, "no wake-up for the completion");
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    /* taken: the next arm reads the event (and requests again) */
    reads = cq_vrb_counter("cq_event_reads");
    cq_arm_settle(&p.b);
    ck_assert_uint_ge(cq_vrb_counter("cq_event_reads"), reads + 1);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
}
END_TEST

/* The pair of a verbs-only test in default progress (else 0: skipped), a's 64-byte send
 * buffer and b's receive buffer of rlen bytes, b armed and settled. */
static int cq_verbs_pair(const char *test, struct pt_pair *p, struct pt_buf **sb,
                         struct pt_buf **rb, size_t rlen)
{
    if (strcmp(pt_ops->name, "verbs") != 0 || pt_manual) {
        printf("%s: verbs, default progress only, skipped\n", test);
        return 0;
    }
    pt_pair_setup(p, NULL, NULL);
    *sb = pt_pair_buf(p, 'a', 64, LW, 1);
    *rb = pt_pair_buf(p, 'b', rlen, LW, 0);
    cq_arm_settle(&p->b);
    return 1;
}

/* Wait for h's event fd to become readable. */
static void cq_wait_event(struct pt_host *h, uint64_t i)
{
    struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(h->ctx), .events = POLLIN};

    ck_assert_msg(poll(&pfd, 1, PT_TIMEOUT_MS) == 1, "no wake-up for completion %llu",
                  (unsigned long long)i);
}

/* verbs: the completion events ctx_arm reads are acked in batches (ibv_ack_cq_events takes
 * a mutex and signals a condition; spec/provider.md, verbs provider mapping, ctx_arm), and
 * those still unacked are acked before the CQ goes (ibv_destroy_cq waits for every event
 * read: the close would hang). */
START_TEST(cq_events_acked_in_batches)
{
    struct pt_pair p;
    struct pt_buf *sb, *rb;
    uint64_t reads, acks;

    if (!cq_verbs_pair("cq_events_acked_in_batches", &p, &sb, &rb, 64))
        return;
    reads = cq_vrb_counter("cq_event_reads");
    acks = cq_vrb_counter("cq_event_acks");
    for (uint64_t i = 0; i < 16; i++) {
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, rb, 0, 64), 0);
        ck_assert_int_eq(pt_post_send(p.ea, 200 + i, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, sb,
                                      0, 64, 0, 0, 0),
                         0);
        cq_wait_event(&p.b, i);
        pt_expect_cqe(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        pt_expect_cqe(&p.a, 200 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        cq_arm_settle(&p.b); /* reads the event, requests again */
    }
    ck_assert_uint_ge(cq_vrb_counter("cq_event_reads"), reads + 16);
    ck_assert_msg(cq_vrb_counter("cq_event_acks") == acks,
                  "%llu ibv_ack_cq_events calls for 16 events (fewer than a batch)",
                  (unsigned long long)(cq_vrb_counter("cq_event_acks") - acks));
    /* the contexts close: without the ack of the events still unacked, ibv_destroy_cq
     * waits for ever (the test's timeout) */
    pt_pair_close(&p);
}
END_TEST

/* verbs: completions ctx_arm's poll took and kept are returned by the next ctx_poll alone,
 * without a poll of the CQ, which that arm left empty just before (spec/provider.md,
 * verbs provider mapping, ctx_poll); what came since is returned by the next call. */
START_TEST(cq_kept_returned_alone)
{
    struct pt_pair p;
    struct pt_buf *sb, *rb;
    struct exs_prov_cqe c[4];
    int n;

    if (!cq_verbs_pair("cq_kept_returned_alone", &p, &sb, &rb, 128))
        return;
    ck_assert_int_eq(pt_post_recv(p.eb, 11, rb, 0, 64), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 12, rb, 64, 64), 0);
    ck_assert_int_eq(
        pt_post_send(p.ea, 21, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, sb, 0, 64, 0, 0, 0), 0);
    cq_wait_event(&p.b, 21);
    /* the arm's poll takes receive 11 and keeps it */
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
    ck_assert_int_eq(
        pt_post_send(p.ea, 22, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, sb, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 21, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    /* acknowledged: b's receive 12 completed before its ACK went */
    pt_expect_cqe(&p.a, 22, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    n = pt_ops->ctx_poll(p.b.ctx, c, 4);
    ck_assert_msg(n == 1, "ctx_poll returned %d completions: the kept one and the CQ's", n);
    ck_assert_uint_eq(c[0].wr_id, 11);
    pt_expect_cqe(&p.b, 12, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_pair_close(&p);
}
END_TEST

/* verbs: a successful completion is converted without its ep's lock, a flushed one under
 * it (counter wc_locked; spec/threading.md, "Verbs completions"). The test thread posts
 * and polls, so no completion is polled before its post was published. With --manual a
 * driver thread arms (and so polls) too: skipped. */
START_TEST(cq_success_completions_take_no_ep_lock)
{
    struct pt_pair p;
    struct pt_buf *sb, *rb;
    uint64_t locked;

    if (strcmp(pt_ops->name, "verbs") != 0 || pt_manual) {
        printf("cq_success_completions_take_no_ep_lock: verbs, default progress only, "
               "skipped\n");
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    sb = pt_pair_buf(&p, 'a', 64, LW, 1);
    rb = pt_pair_buf(&p, 'b', 64, LW, 0);
    locked = cq_vrb_counter("wc_locked");
    for (uint64_t i = 0; i < 100; i++) {
        ck_assert_int_eq(pt_post_recv(p.eb, 1000 + i, rb, 0, 64), 0);
        ck_assert_int_eq(pt_post_send(p.ea, 2000 + i, EXS_PROV_WR_SEND_WITH_IMM,
                                      EXS_PROV_SEND_SIGNALED, sb, 0, 64, (uint32_t)i, 0, 0),
                         0);
        pt_expect_cqe(&p.b, 1000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        pt_expect_cqe(&p.a, 2000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    ck_assert_msg(cq_vrb_counter("wc_locked") == locked,
                  "%llu of 200 successful completions took the ep's lock",
                  (unsigned long long)(cq_vrb_counter("wc_locked") - locked));
    /* a flushed receive is converted under the lock */
    ck_assert_int_eq(pt_post_recv(p.ea, 77, sb, 0, 64), 0);
    ck_assert_int_eq(pt_ops->disconnect(p.ea), 0);
    pt_expect_wr(&p.a, 77, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_uint_gt(cq_vrb_counter("wc_locked"), locked);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_cq_suite(void)
{
    Suite *s = suite_create("prov_cq");
    TCase *tc = pt_tcase("reserve");

    tcase_add_test(tc, cq_mass_disconnect_all_flushes_arrive);
    tcase_add_test(tc, cq_ep_create_enobufs);
    tcase_add_test(tc, cq_arm_reads_channel_only_after_completion);
    tcase_add_test(tc, cq_events_acked_in_batches);
    tcase_add_test(tc, cq_kept_returned_alone);
    tcase_add_test(tc, cq_success_completions_take_no_ep_lock);
    suite_add_tcase(s, tc);
    return s;
}
