/* SPDX-License-Identifier: MIT */
/* EXS_PROV_SEND_DEFER and ep_flush (providers with EXS_PROV_CAP_DEFER): a batch reaches the
 * device together, every request still completes once, in order, also when one fails. */
#include <stdio.h>
#include <string.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

#define LW    EXS_PROV_ACCESS_LOCAL_WRITE
#define RW    EXS_PROV_ACCESS_REMOTE_WRITE
#define SIG   EXS_PROV_SEND_SIGNALED
#define DEFER EXS_PROV_SEND_DEFER
#define NB    8

static int defer_skip(const struct pt_pair *p, const char *test)
{
    if (p->a.ctx->caps.flags & EXS_PROV_CAP_DEFER)
        return 0;
    printf("%s: provider %s has no EXS_PROV_CAP_DEFER, skipped\n", test, pt_ops->name);
    return 1;
}

/* The verbs provider's counter name (0 when the provider has no such counter). */
static uint64_t defer_vrb_counter(const char *name)
{
    uint64_t v = 0;

    if (exs__counters_lookup("prov.verbs", name, &v) != 0)
        return 0;
    return v;
}

/* NB sends, all but the last deferred, half of them inline (the source overwritten as soon
 * as post_send returns: inline bytes are the caller's at the call): the peer receives each,
 * in order, with its bytes; each completes SUCCESS, in order; verbs hands them to the QP in
 * one ibv_post_send and asks the device for the last one's completion only. */
START_TEST(defer_batch_completes_each_in_order)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    uint64_t bells, saved;
    const uint32_t len = 48;

    pt_pair_setup(&p, NULL, NULL);
    if (defer_skip(&p, "defer_batch_completes_each_in_order")) {
        pt_pair_close(&p);
        return;
    }
    src = pt_pair_buf(&p, 'a', NB * 64, LW, 0);
    dst = pt_pair_buf(&p, 'b', NB * 64, LW, 0);
    for (int i = 0; i < NB; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, dst, i * 64, 64), 0);
    bells = defer_vrb_counter("doorbells");
    saved = defer_vrb_counter("signals_saved");
    for (int i = 0; i < NB; i++) {
        unsigned fl = SIG | (i + 1 < NB ? DEFER : 0u);

        if (i % 2 && len <= p.ea->attr.max_inline)
            fl |= EXS_PROV_SEND_INLINE;
        pt_pattern(src->p + i * 64, len, 40 + i);
        ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_SEND, fl, src, i * 64, len, 0, 0, 0), 0);
        if (fl & EXS_PROV_SEND_INLINE)
            memset(src->p + i * 64, 0xAB, len);
    }
    if (!strcmp(pt_ops->name, "verbs")) {
        ck_assert_msg(defer_vrb_counter("doorbells") == bells + 1,
                      "%d sends, %llu ibv_post_send calls (expected one batch)", NB,
                      (unsigned long long)(defer_vrb_counter("doorbells") - bells));
        ck_assert_uint_eq(defer_vrb_counter("signals_saved"), saved + NB - 1);
    }
    for (int i = 0; i < NB; i++) {
        struct exs_prov_cqe c;

        pt_expect_cqe(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, len);
        ck_assert_msg(pt_pattern_check(dst->p + i * 64, len, 40 + i) < 0,
                      "message %d: bytes differ", i);
    }
    for (int i = 0; i < NB; i++)
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_no_cqe(&p.a, 50);
    pt_pair_close(&p);
}
END_TEST

/* A deferred request waits for ep_flush, or for the ctx's next ctx_poll: never longer. */
START_TEST(defer_held_until_flush_or_poll)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    if (defer_skip(&p, "defer_held_until_flush_or_poll")) {
        pt_pair_close(&p);
        return;
    }
    src = pt_pair_buf(&p, 'a', 64, LW, 0x21);
    dst = pt_pair_buf(&p, 'b', 128, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, dst, 64, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 11, EXS_PROV_WR_SEND, SIG | DEFER, src, 0, 64, 0, 0, 0), 0);
    /* b polls, a does not: the request is still a's */
    pt_expect_no_cqe(&p.b, 300);
    pt_ops->ep_flush(p.ea);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_expect_cqe(&p.a, 11, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert_int_eq(pt_post_send(p.ea, 12, EXS_PROV_WR_SEND, SIG | DEFER, src, 0, 64, 0, 0, 0), 0);
    pt_expect_no_cqe(&p.b, 300);
    /* hands it over (its completion may already be there to return) */
    if (pt_ops->ctx_poll(p.a.ctx, &c, 1) == 1)
        ck_assert_msg(c.wr_id == 12 && c.status == EXS_PROV_WC_SUCCESS,
                      "completion wr_id %llu status %s", (unsigned long long)c.wr_id,
                      exs__prov_wc_status_str(c.status));
    else
        pt_expect_cqe(&p.a, 12, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_pair_close(&p);
}
END_TEST

/* In a batch whose second request fails at the peer (an unknown rkey): the first completes
 * SUCCESS (its completion made by the provider), the second REM_ACCESS_ERR, the others
 * WR_FLUSH_ERR: one completion per request, in order. */
START_TEST(defer_batch_error_midway)
{
    struct pt_pair p;
    struct pt_buf *src, *dst, *tgt;

    pt_pair_setup(&p, NULL, NULL);
    if (defer_skip(&p, "defer_batch_error_midway")) {
        pt_pair_close(&p);
        return;
    }
    src = pt_pair_buf(&p, 'a', 64, LW, 0x31);
    dst = pt_pair_buf(&p, 'b', 64 * 4, LW, 0);
    tgt = pt_pair_buf(&p, 'b', 64, LW | RW, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, dst, i * 64, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 0, EXS_PROV_WR_SEND, SIG | DEFER, src, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG | DEFER, src, 0, 64, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey ^ 0x5A5A0000u),
                     0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG | DEFER, src, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 100, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_expect_cqe(&p.a, 0, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_REM_ACCESS_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_no_cqe(&p.a, 50);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_defer_suite(void)
{
    Suite *s = suite_create("prov_defer");
    TCase *tc = pt_tcase("defer");

    tcase_add_test(tc, defer_batch_completes_each_in_order);
    tcase_add_test(tc, defer_held_until_flush_or_poll);
    tcase_add_test(tc, defer_batch_error_midway);
    suite_add_tcase(s, tc);
    return s;
}
