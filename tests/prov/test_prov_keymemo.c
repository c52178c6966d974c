/* SPDX-License-Identifier: MIT */
/* The local key of a receive checked at its take (shm: the ring's take; tcp: the take of a
 * queued receive), made cheap by the key table's region_kills (soft_keys.h): the check
 * remembered (shm: the region found, per endpoint; tcp: the generation at the post) holds
 * only while no region has died since.
 *
 * key_number_reused: a receive's region R (key K) serves a message (shm remembers R); an
 * unrelated region dies and a good receive still completes (the memo found again); then R
 * is deregistered and another region S at another address registered under the same key
 * number K (the table's key pool set by the test). A receive on R's memory under K, posted
 * before R's deregistration (taken after) or after S's registration (the same sge as the
 * first), must not write R's memory: it completes in error. */
#include <errno.h>
#include <string.h>

#include "exs/prov/shm/shm.h"
#include "exs/prov/tcp/tcp.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED
#define LEN 64u

/* The key table of a software provider's context, or NULL (another provider, or wrapped). */
static struct exs_soft_keys *km_keys(struct exs_prov_ctx *ctx)
{
    if (strcmp(pt_name, "shm") == 0)
        return &shm_ctx_of(ctx)->keys;
    if (strcmp(pt_name, "tcp") == 0)
        return &tcp_ctx_of(ctx)->keys;
    return NULL;
}

/* A receive of LEN bytes at addr under lkey. */
static int km_post_recv(struct exs_prov_ep *ep, uint64_t wr_id, const void *addr, uint32_t lkey)
{
    struct exs_prov_sge sge = {.addr = (uint64_t)(uintptr_t)addr, .length = LEN, .lkey = lkey};
    struct exs_prov_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};

    return pt_ops->post_recv(ep, &wr);
}

/* The next completion of h (bounded wait): its wr_id must be wr_id; its status. */
static enum exs_prov_wc_status km_cqe(struct pt_host *h, uint64_t wr_id)
{
    struct exs_prov_cqe c;

    ck_assert_msg(pt_try_cqe(h, PT_TIMEOUT_MS, &c), "no completion for wr %llu",
                  (unsigned long long)wr_id);
    ck_assert_msg(c.wr_id == wr_id, "completion of wr %llu, expected %llu",
                  (unsigned long long)c.wr_id, (unsigned long long)wr_id);
    return c.status;
}

/* One send of src's LEN bytes and the receive wr_id's status (the send's completion:
 * success when the receive succeeded, an error otherwise). */
static enum exs_prov_wc_status km_round(struct pt_pair *p, struct pt_buf *src, uint64_t wr_id)
{
    enum exs_prov_wc_status st;

    ck_assert_int_eq(pt_post_send(p->ea, 100 + wr_id, EXS_PROV_WR_SEND, SIG, src, 0, LEN, 0, 0, 0),
                     0);
    st = km_cqe(&p->b, wr_id);
    ck_assert_int_eq(km_cqe(&p->a, 100 + wr_id) == EXS_PROV_WC_SUCCESS, st == EXS_PROV_WC_SUCCESS);
    return st;
}

/* posted_before: the stale receive posted before R goes (taken after), else after S came. */
static void km_reuse(int posted_before)
{
    struct exs_soft_keys *t;
    struct pt_pair p;
    struct pt_buf *src, *r, *other, *s;
    uint32_t k;

    pt_pair_setup(&p, NULL, NULL);
    t = km_keys(p.b.ctx);
    src = pt_pair_buf(&p, 'a', LEN, 0, 'x');
    r = pt_pair_buf(&p, 'b', LEN, LW, 0x11);
    other = pt_pair_buf(&p, 'b', LEN, LW, 0x22);
    s = pt_buf_new(&p.b, LEN, LW | PT_NOREG, 0x33);
    k = r->mr->lkey;

    /* R serves a message (shm remembers R), again after an unrelated region died */
    ck_assert_int_eq(km_post_recv(p.eb, 1, r->p, k), 0);
    ck_assert_int_eq(km_round(&p, src, 1), EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(pt_ops->mr_dereg(other->mr), 0);
    other->mr = NULL;
    ck_assert_int_eq(km_post_recv(p.eb, 2, r->p, k), 0);
    ck_assert_int_eq(km_round(&p, src, 2), EXS_PROV_WC_SUCCESS);
    memset(r->p, 0x11, LEN);

    if (posted_before)
        ck_assert_int_eq(km_post_recv(p.eb, 3, r->p, k), 0);
    /* R goes; S comes under K (the next key the table hands out), elsewhere */
    ck_assert_int_eq(pt_ops->mr_dereg(r->mr), 0);
    r->mr = NULL;
    exs__soft_keys_lock(t);
    if (!t->pool_n)
        t->pool_n = 1;
    t->pool[t->pool_n - 1] = k;
    exs__soft_keys_unlock(t);
    ck_assert_int_eq(pt_ops->mr_reg(p.b.ctx, s->p, LEN, LW, &s->mr), 0);
    ck_assert_uint_eq(s->mr->lkey, k);
    if (!posted_before)
        ck_assert_int_eq(km_post_recv(p.eb, 3, r->p, k), 0);

    ck_assert_msg(km_round(&p, src, 3) != EXS_PROV_WC_SUCCESS,
                  "%s: a receive on a dead region's memory under its key, now another "
                  "region's, succeeded",
                  posted_before ? "posted before" : "posted after");
    ck_assert_msg(pt_all_bytes(r->p, LEN, 0x11), "the dead region's memory was written");
    ck_assert(pt_all_bytes(s->p, LEN, 0x33));
    ck_assert(pt_buf_guards_ok(r) && pt_buf_guards_ok(s));
    pt_buf_free(s);
    pt_pair_close(&p);
}

START_TEST(key_number_reused)
{
    if (strcmp(pt_name, "shm") != 0 && strcmp(pt_name, "tcp") != 0) {
        test_skip("key_number_reused", "the software key table; provider is %s", pt_name);
        return;
    }
    km_reuse(1);
    km_reuse(0);
}
END_TEST

Suite *prov_keymemo_suite(void)
{
    Suite *s = suite_create("prov_keymemo");
    TCase *tc = pt_tcase("key_memo");

    tcase_add_test(tc, key_number_reused);
    suite_add_tcase(s, tc);
    return s;
}
