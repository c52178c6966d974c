/* SPDX-License-Identifier: MIT */
/* Grants: a key works on its one ep, for its one right, over its exact range, until revoke. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

#define TLEN 8192 /* target buffer */
#define GOFF 1024 /* granted range: [GOFF, GOFF + GLEN) of the target */
#define GLEN 2048

/* Watchdog for calls that must not wait for a peer. */
#define HANG_MS 10000

static struct exs_prov_grant *grant_ok(struct exs_prov_ep *ep, struct pt_buf *b, size_t off,
                                       size_t len, unsigned access)
{
    struct exs_prov_grant *g = NULL;
    int rc = pt_ops->grant(ep, b->mr, b->p + off, len, access, &g);

    ck_assert_msg(rc == 0, "grant(%zu+%zu, 0x%x) failed: %d", off, len, access, rc);
    ck_assert_ptr_nonnull(g);
    ck_assert_ptr_eq(g->ep, ep);
    ck_assert_ptr_eq(g->mr, b->mr);
    ck_assert_uint_eq(g->addr, pt_raddr(b, off));
    ck_assert_uint_eq(g->length, len);
    ck_assert_uint_eq(g->access, access);
    return g;
}

/* One op through ep (of host a) with a grant's key: the status it completed with. On error
 * the ep is in ERROR and a valid op behind it was flushed. */
static enum exs_prov_wc_status try_op_on(struct pt_pair *p, struct exs_prov_ep *ep,
                                         enum exs_prov_wr_opcode op, struct pt_buf *local,
                                         uint64_t raddr, uint32_t len, uint32_t rkey)
{
    struct exs_prov_cqe c;

    ck_assert_int_eq(pt_post_send(ep, 1, op, SIG, local, 0, len, 0, raddr, rkey), 0);
    pt_wait_cqe(&p->a, PT_TIMEOUT_MS, &c);
    ck_assert_uint_eq(c.wr_id, 1);
    if (c.status != EXS_PROV_WC_SUCCESS)
        ck_assert_int_eq(pt_ops->ep_state(ep), EXS_PROV_EP_ERROR);
    return c.status;
}

static enum exs_prov_wc_status try_op(struct pt_pair *p, enum exs_prov_wr_opcode op,
                                      struct pt_buf *local, uint64_t raddr, uint32_t len,
                                      uint32_t rkey)
{
    return try_op_on(p, p->ea, op, local, raddr, len, rkey);
}

/* ---- the key is good on its ep, for its right, over its range ---- */

START_TEST(grant_write_and_read_in_range)
{
    struct pt_pair p;
    struct pt_buf *tgt, *src, *dst;
    struct exs_prov_grant *gw, *gr;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A); /* local rights only: the grants open it */
    src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
    dst = pt_pair_buf(&p, 'a', TLEN, LW, 0x11);
    pt_pattern(src->p, TLEN, 9);
    gw = grant_ok(p.eb, tgt, GOFF, GLEN, RW);
    gr = grant_ok(p.eb, tgt, GOFF, GLEN, RR);
    ck_assert_uint_ne(gw->rkey, gr->rkey);
    /* the whole range, first and last byte included */
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_WRITE, src, gw->addr, GLEN, gw->rkey),
                     EXS_PROV_WC_SUCCESS);
    ck_assert_msg(pt_pattern_check(tgt->p + GOFF, GLEN, 9) < 0, "granted WRITE did not land");
    ck_assert(pt_all_bytes(tgt->p, GOFF, 0x5A));
    ck_assert(pt_all_bytes(tgt->p + GOFF + GLEN, TLEN - GOFF - GLEN, 0x5A));
    ck_assert(pt_buf_guards_ok(tgt));
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_READ, dst, gr->addr, GLEN, gr->rkey),
                     EXS_PROV_WC_SUCCESS);
    ck_assert_msg(pt_pattern_check(dst->p, GLEN, 9) < 0, "granted READ returned wrong data");
    /* a sub-range of the grant, and WRITE_WITH_IMM */
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_READ, dst, gr->addr + GLEN - 1, 1, gr->rkey),
                     EXS_PROV_WC_SUCCESS);
    {
        struct pt_buf *rb = pt_pair_buf(&p, 'b', 64, LW, 0);
        struct exs_prov_cqe c;

        ck_assert_int_eq(pt_post_recv(p.eb, 5, rb, 0, 64), 0);
        ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, SIG, src, 0, 16,
                                      0xABCD, gw->addr + 16, gw->rkey),
                         0);
        pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
        pt_expect_cqe(&p.b, 5, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
        ck_assert_uint_eq(c.imm_data, 0xABCD);
    }
    pt_ops->revoke(gw);
    pt_ops->revoke(gr);
    pt_pair_close(&p);
}
END_TEST

/* ---- every other use fails with REM_ACCESS_ERR and changes nothing ---- */

enum misuse {
    M_OTHER_RIGHT_READ,  /* a WRITE grant used for READ */
    M_OTHER_RIGHT_WRITE, /* a READ grant used for WRITE */
    M_BYTE_BEFORE,       /* starts one byte before the range */
    M_BYTE_AFTER,        /* ends one byte after the range */
    M_LONGER,            /* starts at the range, one byte longer */
    M_WRAP,              /* raddr + len wraps around 2^64 */
    M_REVOKED,           /* after revoke */
    M_OTHER_EP,          /* on another ep of the same ctx */
    M_OTHER_CTX,         /* on an ep of another ctx */
    M_MR_RKEY,           /* the mr's own rkey (registered for local access only) */
};

static const char *const misuse_names[] = {
    "other right (read)", "other right (write)", "one byte before", "one byte after",
    "one byte longer",    "wrapping range",      "after revoke",    "another ep of the ctx",
    "another ctx",        "the mr's rkey",
};

/* A second connection between the pair's hosts: ea2 (on a) to eb2 (on b). */
static void second_conn(struct pt_pair *p, struct exs_prov_ep **ea2, struct exs_prov_ep **eb2)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_cm_event ev;

    ck_assert_int_eq(pt_ops->ep_create(p->a.ctx, &at, ea2), 0);
    ck_assert_int_eq(pt_ops->ep_create(p->b.ctx, &at, eb2), 0);
    ck_assert_int_eq(pt_ops->connect(*ea2, (struct sockaddr *)&p->addr, p->addrlen, NULL, 0), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_int_eq(pt_ops->accept(ev.req, *eb2, NULL, 0), 0);
    pt_wait_cm(&p->a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, *ea2);
    pt_wait_cm(&p->b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, *eb2);
}

static void misuse_case(enum misuse m)
{
    struct pt_pair p, q;
    struct pt_buf *tgt, *src, *dst;
    struct exs_prov_mr *mq = NULL;
    struct exs_prov_ep *ea2 = NULL, *eb2 = NULL;
    struct exs_prov_grant *g, *gq = NULL;
    enum exs_prov_wr_opcode op = EXS_PROV_WR_RDMA_WRITE;
    unsigned right = RW;
    uint64_t raddr;
    uint32_t len = GLEN, rkey;
    int use_q = m == M_OTHER_CTX;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
    src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
    dst = pt_pair_buf(&p, 'a', TLEN, LW, 0x11);
    pt_pattern(src->p, TLEN, 4);
    if (m == M_OTHER_RIGHT_WRITE)
        right = RR;
    if (m == M_OTHER_RIGHT_READ)
        op = EXS_PROV_WR_RDMA_READ;
    if (m == M_OTHER_EP) {
        /* the grant is for eb2's peer (ea2); ea presents it to eb */
        second_conn(&p, &ea2, &eb2);
        g = grant_ok(eb2, tgt, GOFF, GLEN, right);
    } else {
        g = grant_ok(p.eb, tgt, GOFF, GLEN, right);
    }
    raddr = g->addr;
    rkey = g->rkey;
    switch (m) {
    case M_BYTE_BEFORE:
        raddr -= 1;
        break;
    case M_BYTE_AFTER:
        raddr += 1;
        break;
    case M_LONGER:
        len += 1;
        break;
    case M_WRAP:
        raddr = UINT64_MAX - 15; /* raddr + len wraps into small addresses */
        len = 64;
        break;
    case M_REVOKED:
        pt_ops->revoke(g);
        g = NULL;
        break;
    case M_OTHER_CTX:
        /* the same memory, granted on a connection of two other ctxs */
        pt_pair_setup(&q, NULL, NULL);
        ck_assert_int_eq(pt_ops->mr_reg(q.b.ctx, tgt->p, TLEN, LW, &mq), 0);
        ck_assert_int_eq(pt_ops->grant(q.eb, mq, tgt->p, TLEN, RW, &gq), 0);
        raddr = gq->addr + GOFF;
        rkey = gq->rkey;
        ck_assert_msg(rkey != g->rkey, "keys of two ctxs collide");
        break;
    case M_MR_RKEY:
        rkey = tgt->mr->rkey;
        break;
    default:
        break;
    }
    {
        enum exs_prov_wc_status st =
            try_op(&p, op, op == EXS_PROV_WR_RDMA_READ ? dst : src, raddr, len, rkey);

        ck_assert_msg(st == EXS_PROV_WC_REM_ACCESS_ERR,
                      "%s: %s completed with '%s', expected 'remote access error'", misuse_names[m],
                      op == EXS_PROV_WR_RDMA_READ ? "RDMA_READ" : "RDMA_WRITE",
                      exs__prov_wc_status_str(st));
    }
    ck_assert_msg(pt_all_bytes(tgt->p, TLEN, 0x5A) && pt_buf_guards_ok(tgt), "%s: target modified",
                  misuse_names[m]);
    if (op == EXS_PROV_WR_RDMA_READ)
        ck_assert_msg(pt_all_bytes(dst->p, TLEN, 0x11), "%s: refused READ placed data",
                      misuse_names[m]);
    if (g)
        pt_ops->revoke(g);
    if (use_q) {
        pt_ops->revoke(gq);
        ck_assert_int_eq(pt_ops->mr_dereg(mq), 0);
        pt_pair_close(&q);
    }
    if (ea2) {
        pt_ep_close(&p.a, ea2);
        pt_ep_close(&p.b, eb2);
    }
    pt_pair_close(&p);
}

#define MISUSE_TEST(_name, _m)                                                                     \
    START_TEST(_name)                                                                              \
    {                                                                                              \
        misuse_case(_m);                                                                           \
    }                                                                                              \
    END_TEST

MISUSE_TEST(grant_other_right_read, M_OTHER_RIGHT_READ)
MISUSE_TEST(grant_other_right_write, M_OTHER_RIGHT_WRITE)
MISUSE_TEST(grant_byte_before, M_BYTE_BEFORE)
MISUSE_TEST(grant_byte_after, M_BYTE_AFTER)
MISUSE_TEST(grant_longer, M_LONGER)
MISUSE_TEST(grant_wrap, M_WRAP)
MISUSE_TEST(grant_after_revoke, M_REVOKED)
MISUSE_TEST(grant_other_ep, M_OTHER_EP)
MISUSE_TEST(grant_other_ctx, M_OTHER_CTX)
MISUSE_TEST(grant_local_mr_rkey, M_MR_RKEY)

/* ---- verbs, grant mode mw_mr: the registration under a window, kept for the next grant ---- */

static uint64_t gcache(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("prov.verbs.grantcache", name, &v), 0);
    return v;
}

/* A grant's registration of exactly its range is kept at revoke (it has no remote right of
 * its own) and serves the next grant of that range, here on another connection: the new key
 * works over the range, the revoked key does not, nor does the new key one byte past the
 * range; the registration goes with the parent's deregistration. */
START_TEST(grant_cache_range_reused)
{
    struct pt_pair p;
    struct pt_buf *tgt, *src;
    struct exs_prov_ep *ea2 = NULL, *eb2 = NULL;
    struct exs_prov_grant *g;
    uint64_t v, hits, ent, drops;
    uint32_t old_key;

    pt_pair_setup(&p, NULL, NULL);
    if (exs__counters_lookup("prov.verbs.grantcache", "gc_hits", &v) != 0) {
        printf("grant_cache_range_reused: provider %s has no grant cache, skipped\n", pt_ops->name);
        pt_pair_close(&p);
        return;
    }
    tgt = pt_buf_new(&p.b, TLEN, LW, 0x5A);
    src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
    ent = gcache("gc_entries");
    g = grant_ok(p.eb, tgt, GOFF, GLEN, RW);
    pt_pattern(src->p, TLEN, 3);
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_WRITE, src, g->addr, GLEN, g->rkey),
                     EXS_PROV_WC_SUCCESS);
    old_key = g->rkey;
    pt_ops->revoke(g);
    if (gcache("gc_entries") == ent) {
        printf("grant_cache_range_reused: grant mode without the cache, skipped\n");
        pt_buf_free(tgt);
        pt_pair_close(&p);
        return;
    }
    hits = gcache("gc_hits");
    second_conn(&p, &ea2, &eb2);
    g = grant_ok(eb2, tgt, GOFF, GLEN, RW);
    ck_assert_uint_eq(gcache("gc_hits"), hits + 1);
    ck_assert_uint_ne(g->rkey, old_key);
    pt_pattern(src->p, TLEN, 7);
    ck_assert_int_eq(try_op_on(&p, ea2, EXS_PROV_WR_RDMA_WRITE, src, g->addr, GLEN, g->rkey),
                     EXS_PROV_WC_SUCCESS);
    ck_assert(pt_pattern_check(tgt->p + GOFF, GLEN, 7) < 0);
    pt_pattern(src->p, TLEN, 8);
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_WRITE, src, g->addr, GLEN, old_key),
                     EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert_int_eq(try_op_on(&p, ea2, EXS_PROV_WR_RDMA_WRITE, src, g->addr + 1, GLEN, g->rkey),
                     EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert(pt_pattern_check(tgt->p + GOFF, GLEN, 7) < 0);
    ck_assert(pt_all_bytes(tgt->p, GOFF, 0x5A));
    ck_assert(pt_all_bytes(tgt->p + GOFF + GLEN, TLEN - GOFF - GLEN, 0x5A));
    ck_assert(pt_buf_guards_ok(tgt));
    pt_ops->revoke(g);
    ent = gcache("gc_entries");
    drops = gcache("gc_drops");
    pt_buf_free(tgt);
    ck_assert_uint_eq(gcache("gc_drops"), drops + 1);
    ck_assert_uint_eq(gcache("gc_entries"), ent - 1);
    pt_ep_close(&p.a, ea2);
    pt_ep_close(&p.b, eb2);
    pt_pair_close(&p);
}
END_TEST

/* A grant used (loop 0: READ, 1: WRITE), then revoked: the same operation with its key
 * fails and moves nothing (the key the last remote check found must not outlive its
 * revoke: without the clearing in soft_key_kill both loops succeed over shm). */
START_TEST(grant_use_after_revoke)
{
    const enum exs_prov_wr_opcode op = _i ? EXS_PROV_WR_RDMA_WRITE : EXS_PROV_WR_RDMA_READ;
    struct pt_pair p;
    struct pt_buf *tgt, *loc;
    struct exs_prov_grant *g;
    uint64_t raddr;
    uint32_t rkey;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
    loc = pt_pair_buf(&p, 'a', TLEN, LW, 0x11);
    g = grant_ok(p.eb, tgt, GOFF, GLEN, _i ? RW : RR);
    raddr = g->addr;
    rkey = g->rkey;
    ck_assert_int_eq(try_op(&p, op, loc, raddr, 64, rkey), EXS_PROV_WC_SUCCESS);
    ck_assert(_i ? pt_all_bytes(tgt->p + GOFF, 64, 0x11) : pt_all_bytes(loc->p, 64, 0x5A));
    memset(loc->p, 0x22, 64);
    pt_ops->revoke(g);
    ck_assert_int_eq(try_op(&p, op, loc, raddr, 64, rkey), EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert(_i ? pt_all_bytes(tgt->p + GOFF, 64, 0x11) : pt_all_bytes(loc->p, 64, 0x22));
    pt_pair_close(&p);
}
END_TEST

/* h47 (attack review of 79acfab, the soft providers' one-entry cache of the key the last
 * remote check found): every refusal also after a successful use of the grant, which left
 * the key in that cache. Loop 0: the key presented over another connection of the same ctx
 * (the grant is eb2's, its peer ea2 used it first); 1: the other right (a READ with a WRITE
 * grant); 2: one byte past the range; 3: one byte longer. The checks of ep, right and range
 * must apply to a key found in the cache as to one found in the hash (seen failing, all
 * four loops over shm and tcp, with the cache's hit returning the key unchecked). */
START_TEST(grant_misuse_after_use)
{
    static const char *const what[] = {"another connection of the ctx", "the other right",
                                       "one byte past the range", "one byte longer"};
    struct pt_pair p;
    struct pt_buf *tgt, *src, *dst;
    struct exs_prov_ep *ea2 = NULL, *eb2 = NULL;
    struct exs_prov_grant *g;
    enum exs_prov_wc_status st;
    uint64_t raddr;
    uint32_t len = 64;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
    src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
    dst = pt_pair_buf(&p, 'a', TLEN, LW, 0x11);
    pt_pattern(src->p, TLEN, 9);
    if (_i == 0)
        second_conn(&p, &ea2, &eb2);
    g = grant_ok(_i == 0 ? eb2 : p.eb, tgt, GOFF, GLEN, RW);
    /* the legitimate use: the key is the one the last remote check found */
    ck_assert_int_eq(
        try_op_on(&p, _i == 0 ? ea2 : p.ea, EXS_PROV_WR_RDMA_WRITE, src, g->addr, 64, g->rkey),
        EXS_PROV_WC_SUCCESS);
    ck_assert(pt_pattern_check(tgt->p + GOFF, 64, 9) < 0);
    memset(tgt->p + GOFF, 0x5A, 64);
    raddr = g->addr;
    if (_i == 2)
        raddr = g->addr + GLEN - 63;
    if (_i == 3)
        len = GLEN + 1;
    st = try_op(&p, _i == 1 ? EXS_PROV_WR_RDMA_READ : EXS_PROV_WR_RDMA_WRITE, _i == 1 ? dst : src,
                raddr, len, g->rkey);
    ck_assert_msg(st == EXS_PROV_WC_REM_ACCESS_ERR,
                  "%s after a use: completed with '%s', expected 'remote access error'", what[_i],
                  exs__prov_wc_status_str(st));
    ck_assert_msg(pt_all_bytes(tgt->p, TLEN, 0x5A) && pt_buf_guards_ok(tgt),
                  "%s after a use: target modified", what[_i]);
    if (_i == 1)
        ck_assert_msg(pt_all_bytes(dst->p, TLEN, 0x11), "refused READ placed data");
    pt_ops->revoke(g);
    if (ea2) {
        pt_ep_close(&p.a, ea2);
        pt_ep_close(&p.b, eb2);
    }
    pt_pair_close(&p);
}
END_TEST

/* h47 (attack review of 79acfab): a revoke on the application's thread while the
 * provider's own thread (default progress) carries out a stream of the peer's WRITEs with
 * the key, the key in the cache of the last remote check: once revoke returns no byte of a
 * later WRITE lands (soft_key_kill's promise, the cache included). Each round: a grant of
 * GLEN, WR_N WRITEs of 64 B at successive offsets posted at once, a revoke after the
 * first's completion (the rest on their way), a copy of the target, then every
 * completion: the target must still be the copy, and the completions a run of successes
 * followed by failures (never a success after a refusal). A race: it passes by
 * construction when every WRITE was carried out before the revoke (rounds counted as
 * 'raced' when some were refused); seen failing over shm with the clearing of the cached
 * key in soft_key_kill taken out. Soft providers only (a verbs revoke is the NIC's). */
enum { RACE_ROUNDS = 40, WR_N = 32 };
START_TEST(grant_revoke_racing_writes)
{
    struct pt_pair p;
    struct pt_buf *tgt, *src;
    unsigned char *copy;
    int raced = 0;

    if (strcmp(pt_ops->name, "tcp") != 0 && strcmp(pt_ops->name, "shm") != 0) {
        printf("grant_revoke_racing_writes: provider %s, soft providers only, skipped\n",
               pt_ops->name);
        return;
    }
    copy = malloc(TLEN);
    ck_assert_ptr_nonnull(copy);
    for (int r = 0; r < RACE_ROUNDS; r++) {
        struct exs_prov_grant *g;
        struct exs_prov_cqe c;
        int refused = 0;

        pt_pair_setup(&p, NULL, NULL);
        tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
        src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
        pt_pattern(src->p, TLEN, r + 1);
        g = grant_ok(p.eb, tgt, GOFF, GLEN, RW);
        for (int i = 0; i < WR_N; i++)
            ck_assert_int_eq(pt_post_send(p.ea, (uint64_t)i, EXS_PROV_WR_RDMA_WRITE, SIG, src,
                                          (size_t)i * 64, 64, 0, g->addr + (uint64_t)i * 64,
                                          g->rkey),
                             0);
        pt_wait_cqe(&p.a, PT_TIMEOUT_MS, &c);
        ck_assert_uint_eq(c.wr_id, 0);
        ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
        pt_ops->revoke(g);
        memcpy(copy, tgt->p, TLEN);
        for (int i = 1; i < WR_N; i++) {
            pt_wait_cqe(&p.a, PT_TIMEOUT_MS, &c);
            ck_assert_uint_eq(c.wr_id, (uint64_t)i);
            if (c.status != EXS_PROV_WC_SUCCESS)
                refused = 1;
            else
                ck_assert_msg(!refused, "round %d: WRITE %d succeeded after a refused one", r, i);
        }
        raced += refused;
        ck_assert_msg(memcmp(copy, tgt->p, TLEN) == 0,
                      "round %d: a WRITE landed after revoke returned", r);
        ck_assert(pt_buf_guards_ok(tgt));
        pt_pair_close(&p);
    }
    free(copy);
    printf("grant_revoke_racing_writes(%s): %d of %d rounds had WRITEs refused after the "
           "revoke\n",
           pt_ops->name, raced, RACE_ROUNDS);
}
END_TEST

START_TEST(grant_left_at_ep_destroy)
{
    /* A consumer bug: ep_destroy with a live grant. The provider logs and revokes it, so
     * the mr can be deregistered and nothing leaks (ASan). */
    struct pt_pair p;
    struct pt_buf *tgt;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0);
    (void)grant_ok(p.eb, tgt, 0, 64, RW);
    (void)grant_ok(p.eb, tgt, 64, 64, RR);
    pt_pair_close(&p); /* destroys eb, then deregisters tgt (checked there) */
}
END_TEST

START_TEST(grant_mem_free_with_live_grant)
{
    /* tcp (the default mem_alloc): mem_free of memory with a live grant fails to
     * deregister (-EBUSY), so the memory must stay allocated: the peer's WRITE still lands
     * in live memory (ASan would see a write into freed memory otherwise). */
    struct pt_pair p;
    struct pt_buf *src;
    struct exs_prov_mr *mr = NULL;
    struct exs_prov_grant *g = NULL;

    if (pt_skip_unless_tcp("grant_mem_free_with_live_grant"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 4096, LW, 0x3C);
    ck_assert_int_eq(pt_ops->mem_alloc(p.b.ctx, 4096, &mr), 0);
    ck_assert_int_eq(pt_ops->grant(p.eb, mr, mr->addr, 4096, RW, &g), 0);
    pt_ops->mem_free(mr); /* a consumer bug: logged, the memory is kept */
    ck_assert_int_eq(try_op(&p, EXS_PROV_WR_RDMA_WRITE, src, g->addr, 4096, g->rkey),
                     EXS_PROV_WC_SUCCESS);
    ck_assert(pt_all_bytes(mr->addr, 4096, 0x3C));
    pt_ops->revoke(g);
    pt_ops->mem_free(mr); /* now it goes */
    pt_pair_close(&p);
}
END_TEST

/* ---- keys ---- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

START_TEST(grant_keys_distinct_unpredictable)
{
    enum { N = 1000 };
    struct pt_pair p;
    struct pt_buf *tgt;
    struct exs_prov_grant **g = calloc(N, sizeof(*g));
    uint32_t *k = calloc(N, sizeof(*k)), *s = calloc(N, sizeof(*s));
    int steady = 0, small = 0;

    ck_assert(g && k && s);
    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0);
    for (int i = 0; i < N; i++) {
        g[i] = grant_ok(p.eb, tgt, (size_t)i % TLEN, 1, (i & 1) ? RR : RW);
        k[i] = s[i] = g[i]->rkey;
        ck_assert_uint_ne(k[i], tgt->mr->rkey);
    }
    qsort(s, N, sizeof(*s), cmp_u32);
    for (int i = 1; i < N; i++)
        ck_assert_msg(s[i] != s[i - 1], "key 0x%x given twice", s[i]);
    /* not a counter: consecutive keys do not step by a constant, nor by small steps */
    for (int i = 2; i < N; i++) {
        if (k[i] - k[i - 1] == k[i - 1] - k[i - 2])
            steady++;
        if ((uint32_t)(k[i] - k[i - 1]) < 65536u || (uint32_t)(k[i - 1] - k[i]) < 65536u)
            small++;
    }
    if (pt_is_tcp()) {
        ck_assert_msg(steady < 10, "keys step by a constant (%d of %d)", steady, N - 2);
        ck_assert_msg(small < 50, "consecutive keys are close (%d of %d)", small, N - 2);
    } else {
        /* verbs: a key is the driver's index of the window (given out in sequence) << 8 |
         * a consumer byte, the provider's to draw; consecutive keys are close by design and
         * step by a constant when two byte differences agree (1 in 256) */
        int seen[256] = {0}, distinct = 0;

        for (int i = 0; i < N; i++)
            distinct += !seen[k[i] & 0xff]++;
        ck_assert_msg(steady < 25, "key bytes step by a constant (%d of %d)", steady, N - 2);
        ck_assert_msg(distinct >= 200, "only %d distinct key bytes in %d keys", distinct, N);
    }
    for (int i = 0; i < N; i++)
        pt_ops->revoke(g[i]);
    pt_pair_close(&p);
    free(g);
    free(k);
    free(s);
}
END_TEST

/* ---- argument checks ---- */

START_TEST(grant_bad_arguments)
{
    struct pt_pair p;
    struct pt_buf *tgt, *ro;
    struct exs_prov_grant *g = NULL;
    const unsigned bad_access[] = {0, LW, RW | RR, LW | RW, RW | 0x100};

    pt_pair_open(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, LW, 0);
    /* not connected yet */
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, 64, RW, &g), -ENOTCONN);
    ck_assert_ptr_null(g);
    pt_pair_connect(&p);
    for (size_t i = 0; i < sizeof(bad_access) / sizeof(bad_access[0]); i++)
        ck_assert_msg(pt_ops->grant(p.eb, tgt->mr, tgt->p, 64, bad_access[i], &g) == -EINVAL,
                      "access 0x%x accepted", bad_access[i]);
    /* outside the mr, zero length, wrapping */
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, TLEN + 1, RW, &g), -EINVAL);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p - 1, 16, RW, &g), -EINVAL);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p + TLEN, 1, RW, &g), -EINVAL);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, 0, RW, &g), -EINVAL);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p + 16, SIZE_MAX - 8, RW, &g), -EINVAL);
    ck_assert_ptr_null(g);
    /* an mr without LOCAL_WRITE */
    ro = pt_pair_buf(&p, 'b', 64, 0, 0);
    ck_assert_int_eq(pt_ops->grant(p.eb, ro->mr, ro->p, 64, RR, &g), -EINVAL);
    ck_assert_ptr_null(g);
    /* after the connection ended */
    ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
    {
        struct exs_prov_cm_event ev;

        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    }
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, 64, RW, &g), -ENOTCONN);
    ck_assert_ptr_null(g);
    pt_pair_close(&p);
}
END_TEST

/* ---- tcp: revoke / mr_dereg never wait for a peer stalled half-way ---- */

struct hang_call {
    struct exs_prov_grant *g;
    struct exs_prov_mr *mr;
    int ret;
    int done; /* atomic */
};

static void *hang_thread(void *arg)
{
    struct hang_call *hc = arg;

    if (hc->g)
        pt_ops->revoke(hc->g);
    else
        hc->ret = pt_ops->mr_dereg(hc->mr);
    __atomic_store_n(&hc->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Run revoke / mr_dereg on a thread; fail when it has not returned within HANG_MS. */
static int call_with_watchdog(struct hang_call *hc)
{
    pthread_t t;
    double deadline = pt_now_ms() + HANG_MS;

    ck_assert_int_eq(pthread_create(&t, NULL, hang_thread, hc), 0);
    while (!__atomic_load_n(&hc->done, __ATOMIC_ACQUIRE) && pt_now_ms() < deadline)
        pt_sleep_ms(5);
    ck_assert_msg(__atomic_load_n(&hc->done, __ATOMIC_ACQUIRE),
                  "%s blocked for %d ms waiting for a silent peer", hc->g ? "revoke" : "mr_dereg",
                  HANG_MS);
    pthread_join(t, NULL);
    return hc->ret;
}

/* A raw peer's request h and the first n bytes of its payload (0x99), then silence: once
 * the NIC of p's b side is done with them, they are at landed (placed half-way). */
static void raw_half_sent(struct pt_pair *p, int fd, const struct tcp_wire_hdr *h, uint8_t *payload,
                          size_t n, const uint8_t *landed)
{
    uint64_t rx0 = pt_raw_rx_bytes();

    memset(payload, 0x99, n);
    ck_assert_int_eq(pt_raw_send(fd, h, sizeof(*h)), 0);
    ck_assert_int_eq(pt_raw_send(fd, payload, n), 0);
    pt_raw_rx_settle(&p->b, rx0, sizeof(*h) + n);
    ck_assert_msg(pt_all_bytes(landed, n, 0x99), "the first bytes did not land");
}

/* The raw peer got a NAK syn for psn 0 and p's b ep, disconnected, is in ERROR. */
static void raw_nak_ended(struct pt_pair *p, int fd, uint8_t syn)
{
    struct tcp_wire_hdr nak;
    struct exs_prov_cm_event ev;

    ck_assert_msg(pt_raw_recv(fd, &nak, sizeof(nak), PT_TIMEOUT_MS) == 0, "no NAK");
    ck_assert_uint_eq(nak.type, TCP_WIRE_NAK);
    ck_assert_uint_eq(nak.syndrome, syn);
    ck_assert_uint_eq(ntohl(nak.psn), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    ck_assert_int_lt(ev.status, 0);
    ck_assert_int_eq(pt_ops->ep_state(p->eb), EXS_PROV_EP_ERROR);
}

static void stall_case(const char *test, int use_grant)
{
    enum { WLEN = 4096, FIRST = 10 };
    struct pt_pair p;
    struct pt_buf *tgt;
    struct hang_call hc = {0};
    struct tcp_wire_hdr h;
    uint8_t *payload = malloc(WLEN);
    uint32_t rkey;
    uint64_t raddr;
    int fd;

    ck_assert_ptr_nonnull(payload);
    if (pt_skip_unless_tcp(test)) {
        free(payload);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    tgt = pt_pair_buf(&p, 'b', TLEN, use_grant ? LW : LW | RW, 0x5A);
    if (use_grant) {
        hc.g = grant_ok(p.eb, tgt, GOFF, WLEN, RW);
        rkey = hc.g->rkey;
    } else {
        hc.mr = tgt->mr;
        rkey = tgt->mr->rkey;
    }
    raddr = pt_raddr(tgt, GOFF);
    /* a WRITE header and the first FIRST bytes of its payload, then silence (read only
     * once the NIC is done with them: no completion says so, the WRITE is half-way) */
    h = pt_raw_hdr(TCP_WIRE_WRITE, 0, WLEN, 0, raddr, rkey, 0);
    raw_half_sent(&p, fd, &h, payload, FIRST, tgt->p + GOFF);
    /* the peer is silent half-way through its WRITE: this must return at once */
    ck_assert_int_eq(call_with_watchdog(&hc), 0);
    if (!use_grant)
        tgt->mr = NULL;
    /* the rest arrives late: discarded, and the peer is told REM_ACCESS */
    memset(payload, 0x77, WLEN);
    (void)pt_raw_send(fd, payload + FIRST, WLEN - FIRST);
    raw_nak_ended(&p, fd, TCP_WIRE_SYN_REM_ACCESS);
    close(fd);
    pt_sleep_ms(50); /* let the NIC drain the socket into its sink */
    ck_assert_msg(pt_all_bytes(tgt->p + GOFF + FIRST, TLEN - GOFF - FIRST, 0x5A) &&
                      pt_all_bytes(tgt->p, GOFF, 0x5A) && pt_buf_guards_ok(tgt),
                  "bytes landed after %s returned", use_grant ? "revoke" : "mr_dereg");
    pt_pair_close(&p);
    free(payload);
}

START_TEST(grant_revoke_peer_stalled)
{
    stall_case("grant_revoke_peer_stalled", 1);
}
END_TEST

START_TEST(grant_mr_dereg_peer_stalled)
{
    stall_case("grant_mr_dereg_peer_stalled", 0);
}
END_TEST

/* A SEND from a raw peer that stops half-way through its payload, when the receive's
 * region is deregistered: mr_dereg returns at once (the provider contract is RC's; the
 * ES-API never deregisters a region in use), not one byte of the rest lands in the
 * region, the receive completes LOC_PROT_ERR and the requester gets NAK REM_OP. Before
 * the SEND placement took the copy fence, the rest was read into the dead region and the
 * receive completed successfully. */
START_TEST(grant_mr_dereg_send_half_placed)
{
    enum { SLEN = 6144, FIRST = 10 };
    struct pt_pair p;
    struct pt_buf *dst;
    struct hang_call hc = {0};
    struct tcp_wire_hdr h;
    struct exs_prov_sge sge;
    struct exs_prov_recv_wr rw;
    uint8_t *payload = malloc(SLEN);
    uint64_t rx0;
    int fd;

    ck_assert_ptr_nonnull(payload);
    if (pt_skip_unless_tcp("grant_mr_dereg_send_half_placed")) {
        free(payload);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    dst = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
    sge = (struct exs_prov_sge){pt_raddr(dst, GOFF), SLEN, dst->mr->lkey};
    rw = (struct exs_prov_recv_wr){.wr_id = 7, .sg_list = &sge, .num_sge = 1};
    ck_assert_int_eq(pt_ops->post_recv(p.eb, &rw), 0);
    /* a SEND header and the first FIRST bytes of its payload, then silence */
    h = pt_raw_hdr(TCP_WIRE_SEND, 0, SLEN, 0, 0, 0, 0);
    raw_half_sent(&p, fd, &h, payload, FIRST, dst->p + GOFF);
    /* the placement is half-way: the deregistration must not wait for the peer */
    hc.mr = dst->mr;
    ck_assert_int_eq(call_with_watchdog(&hc), 0);
    dst->mr = NULL;
    /* the rest arrives after mr_dereg returned: read (into a sink), never placed */
    memset(payload, 0x77, SLEN);
    rx0 = pt_raw_rx_bytes();
    (void)pt_raw_send(fd, payload + FIRST, SLEN - FIRST);
    pt_raw_rx_settle(&p.b, rx0, SLEN - FIRST);
    ck_assert_msg(pt_all_bytes(dst->p + GOFF + FIRST, TLEN - GOFF - FIRST, 0x5A) &&
                      pt_all_bytes(dst->p, GOFF, 0x5A) && pt_buf_guards_ok(dst),
                  "bytes landed after mr_dereg returned");
    pt_expect_cqe(&p.b, 7, EXS_PROV_WC_LOC_PROT_ERR, -1, NULL);
    raw_nak_ended(&p, fd, TCP_WIRE_SYN_REM_OP);
    close(fd);
    pt_pair_close(&p);
    free(payload);
}
END_TEST

/* A READ response of a grant, half sent because the peer does not read it, when the
 * grant is revoked: revoke returns at once, and not one byte of the range is read after
 * it (the connection is cut: the rest of the response can never be sent). */
START_TEST(grant_revoke_read_response_half_sent)
{
    enum { RLEN = 32 << 20 };
    struct pt_pair p;
    struct pt_buf *src;
    struct hang_call hc = {0};
    struct tcp_wire_hdr h;
    uint8_t *buf = malloc(1 << 16);
    uint64_t got = 0, late = 0;
    int fd;

    ck_assert_ptr_nonnull(buf);
    if (pt_skip_unless_tcp("grant_revoke_read_response_half_sent")) {
        free(buf);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    src = pt_pair_buf(&p, 'b', RLEN, LW, 0x11);
    hc.g = grant_ok(p.eb, src, 0, RLEN, RR);
    h = pt_raw_hdr(TCP_WIRE_READ_REQ, 0, 0, 0, hc.g->addr, hc.g->rkey, RLEN);
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    /* read a little of the response, then stop reading: the provider's socket fills */
    ck_assert_int_eq(pt_raw_recv(fd, buf, TCP_WIRE_HDR_LEN + 4096, PT_TIMEOUT_MS), 0);
    ck_assert_uint_eq(((struct tcp_wire_hdr *)buf)->type, TCP_WIRE_READ_RESP);
    pt_sleep_ms(100);
    ck_assert_int_eq(call_with_watchdog(&hc), 0);
    /* the memory changes after revoke: none of the new bytes may reach the peer */
    memset(src->p, 0x77, RLEN);
    for (;;) {
        ssize_t n = pt_raw_recv(fd, buf, 1, 10000) == 0 ? 1 : -1;

        if (n < 0)
            break;
        n = recv(fd, buf + 1, (1 << 16) - 1, MSG_DONTWAIT);
        n = n < 0 ? 1 : n + 1;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == 0x77)
                late++;
        }
        got += (uint64_t)n;
    }
    printf("grant_revoke_read_response_half_sent: %llu more bytes after revoke, %llu late\n",
           (unsigned long long)got, (unsigned long long)late);
    ck_assert_msg(late == 0, "%llu bytes read from the range after revoke returned",
                  (unsigned long long)late);
    ck_assert_msg(got < RLEN, "the whole response was sent (%llu bytes)", (unsigned long long)got);
    {
        struct exs_prov_cm_event ev;

        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_int_lt(ev.status, 0);
    }
    close(fd);
    pt_pair_close(&p);
    free(buf);
}
END_TEST

/* A READ response queued behind a stalled one, not started when its grant is revoked: it
 * becomes a NAK REM_ACCESS for its psn in its place; the response before it is unharmed. */
START_TEST(grant_revoke_read_response_queued)
{
    enum { R1 = 32 << 20, R2 = 128 << 10 };
    struct pt_pair p;
    struct pt_buf *s1, *s2;
    struct exs_prov_grant *g1;
    struct hang_call hc = {0};
    struct tcp_wire_hdr h[2], r;
    uint8_t *buf = malloc(R1);
    uint64_t rx0;
    int fd;

    ck_assert_ptr_nonnull(buf);
    if (pt_skip_unless_tcp("grant_revoke_read_response_queued")) {
        free(buf);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    s1 = pt_pair_buf(&p, 'b', R1, LW, 0x11);
    s2 = pt_pair_buf(&p, 'b', R2, LW, 0x22);
    g1 = grant_ok(p.eb, s1, 0, R1, RR);
    hc.g = grant_ok(p.eb, s2, 0, R2, RR);
    h[0] = pt_raw_hdr(TCP_WIRE_READ_REQ, 0, 0, 0, g1->addr, g1->rkey, R1);
    h[1] = pt_raw_hdr(TCP_WIRE_READ_REQ, 0, 0, 1, hc.g->addr, hc.g->rkey, R2);
    rx0 = pt_raw_rx_bytes();
    ck_assert_int_eq(pt_raw_send(fd, h, sizeof(h)), 0);
    /* the first response fills the socket; the second waits behind it, not started */
    ck_assert_int_eq(pt_raw_recv(fd, &r, sizeof(r), PT_TIMEOUT_MS), 0);
    ck_assert_uint_eq(r.type, TCP_WIRE_READ_RESP);
    ck_assert_uint_eq(ntohl(r.len), R1);
    pt_raw_rx_settle(&p.b, rx0, sizeof(h)); /* both requests taken */
    ck_assert_int_eq(call_with_watchdog(&hc), 0);
    memset(s2->p, 0x77, R2);
    /* the first response arrives whole; then a NAK for the second */
    ck_assert_int_eq(pt_raw_recv(fd, buf, R1, 10000), 0);
    ck_assert_msg(pt_all_bytes(buf, R1, 0x11), "first response damaged");
    ck_assert_int_eq(pt_raw_recv(fd, &r, sizeof(r), PT_TIMEOUT_MS), 0);
    ck_assert_msg(r.type == TCP_WIRE_NAK, "frame type %u after the first response, expected NAK",
                  r.type);
    ck_assert_uint_eq(r.syndrome, TCP_WIRE_SYN_REM_ACCESS);
    ck_assert_uint_eq(ntohl(r.psn), 1);
    {
        struct exs_prov_cm_event ev;

        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_int_lt(ev.status, 0);
    }
    pt_ops->revoke(g1);
    close(fd);
    pt_pair_close(&p);
    free(buf);
}
END_TEST

Suite *prov_grant_suite(void)
{
    Suite *s = suite_create("prov_grant");
    TCase *tc = pt_tcase("valid");

    tcase_add_test(tc, grant_write_and_read_in_range);
    tcase_add_test(tc, grant_keys_distinct_unpredictable);
    tcase_add_test(tc, grant_bad_arguments);
    tcase_add_test(tc, grant_left_at_ep_destroy);
    tcase_add_test(tc, grant_mem_free_with_live_grant);
    suite_add_tcase(s, tc);
    tc = pt_tcase("refused");
    tcase_add_test(tc, grant_other_right_read);
    tcase_add_test(tc, grant_other_right_write);
    tcase_add_test(tc, grant_byte_before);
    tcase_add_test(tc, grant_byte_after);
    tcase_add_test(tc, grant_longer);
    tcase_add_test(tc, grant_wrap);
    tcase_add_test(tc, grant_after_revoke);
    tcase_add_loop_test(tc, grant_use_after_revoke, 0, 2);
    tcase_add_test(tc, grant_cache_range_reused);
    tcase_add_test(tc, grant_other_ep);
    tcase_add_test(tc, grant_other_ctx);
    tcase_add_test(tc, grant_local_mr_rkey);
    tcase_add_loop_test(tc, grant_misuse_after_use, 0, 4);
    tcase_add_test(tc, grant_revoke_racing_writes);
    suite_add_tcase(s, tc);
    tc = pt_tcase("no_wait");
    tcase_add_test(tc, grant_revoke_peer_stalled);
    tcase_add_test(tc, grant_mr_dereg_peer_stalled);
    tcase_add_test(tc, grant_mr_dereg_send_half_placed);
    tcase_add_test(tc, grant_revoke_read_response_half_sent);
    tcase_add_test(tc, grant_revoke_read_response_queued);
    suite_add_tcase(s, tc);
    return s;
}
