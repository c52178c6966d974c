/* SPDX-License-Identifier: MIT */
/* The verbs provider's caches without hardware: the memory cache, the registration cache and
 * the QP cache, with registration and QP destruction mocked through their callbacks. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/util.h"
#include "tests/unit/unit.h"

#ifdef EXS_HAVE_VERBS_PROV
#include "exs/prov/verbs/vrb_cache.h"
#include "exs/util/counters.h"

/* ---- mocks ---- */

struct mock_reg {
    int regs, deregs, fail_next;
    uint32_t next_key;
    uintptr_t last_addr;
    size_t last_len;
};

struct mock_handle {
    void *addr;
    size_t len;
};

static int mock_reg_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                       uint32_t *rkey_p)
{
    struct mock_reg *m = arg;
    struct mock_handle *h;

    if (m->fail_next) {
        m->fail_next = 0;
        return -ENOMEM;
    }
    h = malloc(sizeof(*h));
    ck_assert_ptr_nonnull(h);
    h->addr = addr;
    h->len = len;
    /* the memory must be usable: registration pins it */
    memset(addr, 0, 1);
    m->regs++;
    m->last_addr = (uintptr_t)addr;
    m->last_len = len;
    *handle_p = h;
    *lkey_p = ++m->next_key;
    *rkey_p = m->next_key | 0x80000000u;
    return 0;
}

static void mock_dereg_cb(void *arg, void *handle)
{
    struct mock_reg *m = arg;

    m->deregs++;
    free(handle);
}

static struct vrb_reg_ops mock_ops(struct mock_reg *m)
{
    struct vrb_reg_ops o = {.reg = mock_reg_cb, .dereg = mock_dereg_cb, .arg = m};

    memset(m, 0, sizeof(*m));
    return o;
}

#define REGION (64u * 1024u)

/* ---- memory cache ---- */

START_TEST(mc_grow_and_keys)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a, b, c;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 1000, &ops), 0);
    ck_assert_uint_eq(mc.cnt.regions, 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 100, &a), 0);
    ck_assert_int_eq(m.regs, 1);
    ck_assert_uint_eq(m.last_len, REGION);
    ck_assert_uint_eq(a.len, VRB_MC_PAGE);
    ck_assert_uint_eq(a.lkey, 1);
    ck_assert_uint_eq(a.rkey, 0x80000001u);
    ck_assert_uint_eq((uintptr_t)a.addr, m.last_addr);
    memset(a.addr, 0xab, a.len);
    /* the rest of the region serves the next ones, then a second region is added */
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION - VRB_MC_PAGE, &b), 0);
    ck_assert_int_eq(m.regs, 1);
    ck_assert_uint_eq((uintptr_t)b.addr, (uintptr_t)a.addr + VRB_MC_PAGE);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 1, &c), 0);
    ck_assert_int_eq(m.regs, 2);
    ck_assert_uint_eq(c.lkey, 2);
    ck_assert_uint_eq(mc.cnt.regions, 2);
    ck_assert_uint_eq(mc.cnt.regions_grown, 2);
    ck_assert_uint_eq(mc.cnt.bytes_held, 2 * REGION);
    ck_assert_uint_eq(mc.cnt.bytes_used, REGION + VRB_MC_PAGE);
    /* too long, and zero */
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION + 1, &c), -EINVAL);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 0, &c), -EINVAL);
    ck_assert_uint_eq(mc.cnt.alloc_fails, 2);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_free(&mc, &b);
    exs__vrb_mc_fini(&mc);
    ck_assert_int_eq(m.deregs, 2);
}
END_TEST

START_TEST(mc_reuse_first_fit)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a, b, c, d;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_MALLOC, -1, 1000, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 3 * VRB_MC_PAGE, &a), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, VRB_MC_PAGE, &b), 0);
    exs__vrb_mc_free(&mc, &a);
    /* a hole of 3 pages: 2 fit in it, 4 do not */
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 2 * VRB_MC_PAGE, &c), 0);
    ck_assert_ptr_eq(c.addr, a.addr);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 4 * VRB_MC_PAGE, &d), 0);
    ck_assert_uint_eq((uintptr_t)d.addr, (uintptr_t)b.addr + VRB_MC_PAGE);
    ck_assert_int_eq(m.regs, 1);
    ck_assert_uint_eq(mc.cnt.allocs, 4);
    ck_assert_uint_eq(mc.cnt.frees, 1);
    exs__vrb_mc_fini(&mc);
    ck_assert_int_eq(m.deregs, 1);
}
END_TEST

START_TEST(mc_shrink_idle)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a, b, c;

    /* idle time 0: a region left empty goes at once, but never the last one */
    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 0, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &a), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &b), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &c), 0);
    ck_assert_uint_eq(mc.cnt.regions, 3);
    exs__vrb_mc_free(&mc, &b);
    ck_assert_uint_eq(mc.cnt.regions, 2);
    ck_assert_uint_eq(mc.cnt.regions_shrunk, 1);
    ck_assert_int_eq(m.deregs, 1);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_free(&mc, &c);
    ck_assert_uint_eq(mc.cnt.regions, 1);
    ck_assert_uint_eq(mc.cnt.bytes_used, 0);
    exs__vrb_mc_fini(&mc);
    ck_assert_int_eq(m.deregs, 3);
}
END_TEST

START_TEST(mc_shrink_waits_for_idle_time)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a, b;
    uint64_t now;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 60000, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &a), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &b), 0);
    exs__vrb_mc_free(&mc, &b);
    ck_assert_uint_eq(mc.cnt.regions, 2); /* not idle long enough */
    now = exs__now_ns();
    ck_assert_uint_eq(exs__vrb_mc_shrink(&mc, now + 1000000000ull), 0);
    ck_assert_uint_eq(exs__vrb_mc_shrink(&mc, now + 61000000000ull), 1);
    ck_assert_uint_eq(mc.cnt.regions, 1);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_fini(&mc);
}
END_TEST

START_TEST(mc_huge_falls_back)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, 4u << 20, VRB_MEM_HUGE, 0, 1000, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 8192, &a), 0);
    memset(a.addr, 1, a.len);
    /* huge pages or, when the system has none reserved, anonymous pages */
    ck_assert_uint_le(mc.cnt.huge_fallbacks, 1);
    ck_assert_uint_eq((uintptr_t)a.addr % (2u << 20), 0);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_fini(&mc);
    ck_assert_int_eq(exs__vrb_mc_backing_parse("huge"), VRB_MEM_HUGE);
    ck_assert_int_eq(exs__vrb_mc_backing_parse("malloc"), VRB_MEM_MALLOC);
    ck_assert_int_eq(exs__vrb_mc_backing_parse("anon"), VRB_MEM_ANON);
    ck_assert_int_eq(exs__vrb_mc_backing_parse("nope"), -1);
}
END_TEST

START_TEST(mc_reg_failure)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 1000, &ops), 0);
    m.fail_next = 1;
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 10, &a), -ENOMEM);
    ck_assert_uint_eq(mc.cnt.regions, 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 10, &a), 0);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_fini(&mc);
}
END_TEST

/* Guard pages: a write just past a region faults at once (the test expects SIGSEGV). */
static void mc_guard_case(enum vrb_mem_backing backing, int after)
{
    static struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    static struct vrb_mcache mc;
    struct vrb_mc_buf a;
    volatile uint8_t *p;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, backing, -1, 1000, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &a), 0);
    p = a.addr;
    p[0] = 1;
    p[REGION - 1] = 1;
    /* AddressSanitizer turns SIGSEGV into a report and exit(1): let the fault be the
     * plain signal the test expects (this is a forked test process) */
    signal(SIGSEGV, SIG_DFL);
    if (after)
        p[REGION] = 1;
    else
        p[-1] = 1;
    ck_abort_msg("no fault outside the region");
}

START_TEST(mc_guard_after_anon)
{
    mc_guard_case(VRB_MEM_ANON, 1);
}
END_TEST

START_TEST(mc_guard_before_anon)
{
    mc_guard_case(VRB_MEM_ANON, 0);
}
END_TEST

START_TEST(mc_guard_after_malloc)
{
    mc_guard_case(VRB_MEM_MALLOC, 1);
}
END_TEST

/* ---- registration cache ---- */

START_TEST(rc_hit_miss_evict)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_regcache rc;
    struct vrb_rc_entry *e1, *e2, *e3, *e4;
    uint8_t *buf = aligned_alloc(4096, 8 * 4096);

    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(exs__vrb_rc_init(&rc, 2, &ops), 0);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 10, 100, &e1), 0);
    ck_assert_uint_eq(rc.cnt.misses, 1);
    ck_assert_uint_eq(e1->start, (uintptr_t)buf);
    ck_assert_uint_eq(e1->end, (uintptr_t)buf + 4096);
    /* a sub-range of a cached registration is a hit */
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 200, 50, &e2), 0);
    ck_assert_ptr_eq(e2, e1);
    ck_assert_uint_eq(rc.cnt.hits, 1);
    ck_assert_uint_eq(e1->refs, 2);
    exs__vrb_rc_put(&rc, e1);
    exs__vrb_rc_put(&rc, e2);
    /* a range crossing the end is a miss (registered as the pages it touches) */
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 2 * 4096 - 100, 200, &e2), 0);
    ck_assert_uint_eq(e2->start, (uintptr_t)buf + 4096);
    ck_assert_ptr_ne(e2, e1);
    ck_assert_uint_eq(rc.cnt.misses, 2);
    exs__vrb_rc_put(&rc, e2);
    /* touch e1 again: e2 becomes least recently used and goes first */
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 1, &e3), 0);
    ck_assert_ptr_eq(e3, e1);
    exs__vrb_rc_put(&rc, e3);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 5 * 4096, 4096, &e4), 0);
    ck_assert_uint_eq(rc.cnt.evictions, 1);
    ck_assert_uint_eq(rc.cnt.entries, 2);
    ck_assert_int_eq(m.deregs, 1);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 10, 1, &e3), 0);
    ck_assert_ptr_eq(e3, e1); /* still cached */
    exs__vrb_rc_put(&rc, e3);
    exs__vrb_rc_put(&rc, e4);
    exs__vrb_rc_fini(&rc);
    ck_assert_int_eq(m.regs, m.deregs);
    free(buf);
}
END_TEST

START_TEST(rc_in_use_not_evicted)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_regcache rc;
    struct vrb_rc_entry *e1, *e2;
    uint8_t *buf = aligned_alloc(4096, 4 * 4096);

    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(exs__vrb_rc_init(&rc, 1, &ops), 0);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 10, &e1), 0);
    /* e1 is held: the cache goes over its size rather than pull it */
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 2 * 4096, 10, &e2), 0);
    ck_assert_uint_eq(rc.cnt.evictions, 0);
    ck_assert_uint_eq(rc.cnt.entries, 2);
    exs__vrb_rc_put(&rc, e1);
    exs__vrb_rc_put(&rc, e2);
    /* invalidation drops unused registrations overlapping the range */
    exs__vrb_rc_invalidate(&rc, buf, 4096);
    ck_assert_uint_eq(rc.cnt.entries, 1);
    m.fail_next = 1;
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 10, &e1), -ENOMEM);
    ck_assert_uint_eq(rc.cnt.reg_fails, 1);
    exs__vrb_rc_fini(&rc);
    ck_assert_int_eq(m.regs, m.deregs);
    free(buf);
}
END_TEST

/* The page check: a registration is used again only while ident() says its pages are the
 * same ones; memory unmapped and mapped again at the same address is registered anew. */
static uint64_t mock_ident_val;
static int mock_ident_err;

static int mock_ident_cb(void *arg, uintptr_t start, size_t len, uint64_t *id_p)
{
    (void)arg;
    (void)start;
    (void)len;
    if (mock_ident_err)
        return mock_ident_err;
    *id_p = mock_ident_val;
    return 0;
}

/* A registration cache of 4 entries with the page check (ident: pages 1), and 4 pages of
 * memory to register (free them after the fini). */
static uint8_t *rc_open_ident(struct vrb_regcache *rc, struct vrb_reg_ops *ops)
{
    uint8_t *buf = aligned_alloc(4096, 4 * 4096);

    ck_assert_ptr_nonnull(buf);
    ops->ident = mock_ident_cb;
    mock_ident_err = 0;
    mock_ident_val = 1;
    ck_assert_int_eq(exs__vrb_rc_init(rc, 4, ops), 0);
    return buf;
}

START_TEST(rc_stale_pages_registered_again)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_regcache rc;
    struct vrb_rc_entry *e1, *e2, *e3;
    uint8_t *buf = rc_open_ident(&rc, &ops);

    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e1), 0);
    exs__vrb_rc_put(&rc, e1);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e2), 0); /* same pages: a hit */
    ck_assert_ptr_eq(e1, e2);
    ck_assert_uint_eq(rc.cnt.hits, 1);
    /* held, and the pages change under it: the next lookup registers again, the old
     * registration goes at its last put */
    mock_ident_val = 2;
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e3), 0);
    ck_assert_ptr_ne(e3, e2);
    ck_assert_uint_eq(rc.cnt.stale, 1);
    ck_assert_uint_eq(rc.cnt.misses, 2);
    ck_assert_uint_eq(rc.cnt.entries, 1);
    ck_assert_int_eq(m.regs, 2);
    ck_assert_int_eq(m.deregs, 0);
    exs__vrb_rc_put(&rc, e2);
    ck_assert_int_eq(m.deregs, 1);
    exs__vrb_rc_put(&rc, e3);
    /* not held, pages changed again: dropped at once on lookup */
    mock_ident_val = 3;
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e1), 0);
    ck_assert_uint_eq(rc.cnt.stale, 2);
    ck_assert_int_eq(m.deregs, 2);
    exs__vrb_rc_put(&rc, e1);
    exs__vrb_rc_fini(&rc);
    ck_assert_int_eq(m.regs, m.deregs);
    free(buf);
}
END_TEST

START_TEST(rc_unverifiable_not_kept)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_regcache rc;
    struct vrb_rc_entry *e1, *e2;
    uint8_t *buf = aligned_alloc(4096, 2 * 4096);

    ck_assert_ptr_nonnull(buf);
    ops.ident = mock_ident_cb;
    mock_ident_err = -EPERM; /* frame numbers hidden (no CAP_SYS_ADMIN) */
    ck_assert_int_eq(exs__vrb_rc_init(&rc, 4, &ops), 0);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e1), 0);
    ck_assert_uint_eq(rc.cnt.entries, 0);
    ck_assert_uint_eq(rc.cnt.unverifiable, 1);
    exs__vrb_rc_put(&rc, e1);
    ck_assert_int_eq(m.deregs, 1); /* used once, never again */
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e2), 0);
    ck_assert_uint_eq(rc.cnt.hits, 0);
    ck_assert_uint_eq(rc.cnt.misses, 2);
    /* invalidating a held registration takes it out now and deregisters it at its put */
    mock_ident_err = 0;
    exs__vrb_rc_put(&rc, e2);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &e1), 0);
    ck_assert_uint_eq(rc.cnt.entries, 1);
    exs__vrb_rc_invalidate(&rc, buf, 4096);
    ck_assert_uint_eq(rc.cnt.entries, 0);
    ck_assert_int_eq(m.deregs, 2);
    exs__vrb_rc_put(&rc, e1);
    ck_assert_int_eq(m.deregs, 3);
    exs__vrb_rc_fini(&rc);
    ck_assert_int_eq(m.regs, m.deregs);
    free(buf);
}
END_TEST

/* ---- the device removed (spec/provider.md, "Device removal") ---- */

/* Every region is deregistered at once, also those handed out (their memory stays mapped
 * and writable for its holder); a free or the fini later deregisters nothing twice. */
START_TEST(mc_unreg_device_gone)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_mc_buf a, b;

    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 0, &ops), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, REGION, &a), 0);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 100, &b), 0);
    ck_assert_int_eq(m.regs, 2);
    exs__vrb_mc_unreg(&mc);
    ck_assert_int_eq(m.deregs, 2);
    memset(a.addr, 0x5a, a.len);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_free(&mc, &b);
    exs__vrb_mc_unreg(&mc);
    exs__vrb_mc_fini(&mc);
    ck_assert_int_eq(m.deregs, 2);
}
END_TEST

/* Unused entries go, held ones (also one the cache does not list: unverifiable) are
 * deregistered now and freed at their put without a second deregistration. */
START_TEST(rc_unreg_device_gone)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_regcache rc;
    struct vrb_rc_entry *held, *unused, *unlisted;
    uint8_t *buf = rc_open_ident(&rc, &ops);

    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf, 100, &held), 0);
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 4096, 100, &unused), 0);
    exs__vrb_rc_put(&rc, unused);
    mock_ident_err = -EPERM;
    ck_assert_int_eq(exs__vrb_rc_get(&rc, buf + 2 * 4096, 100, &unlisted), 0);
    ck_assert_uint_eq(rc.cnt.entries, 2);
    ck_assert_int_eq(m.regs, 3);
    exs__vrb_rc_unreg(&rc, unlisted);
    ck_assert_int_eq(m.deregs, 3);
    ck_assert_uint_eq(rc.cnt.entries, 1);
    ck_assert_ptr_null(held->handle);
    ck_assert_ptr_null(unlisted->handle);
    exs__vrb_rc_unreg(&rc, unlisted); /* again: nothing more */
    exs__vrb_rc_put(&rc, unlisted);
    exs__vrb_rc_put(&rc, held);
    exs__vrb_rc_fini(&rc);
    ck_assert_int_eq(m.deregs, 3);
    free(buf);
}
END_TEST

/* ---- QP cache ---- */

static int destroyed[16];
static int ndestroyed;

static void mock_destroy(void *arg, void *qp)
{
    (void)arg;
    ck_assert_int_lt(ndestroyed, 16);
    destroyed[ndestroyed++] = (int)(intptr_t)qp;
}

static struct vrb_qpc_caps caps(uint32_t s, uint32_t r, uint32_t i)
{
    struct vrb_qpc_caps c = {.max_send_wr = s, .max_recv_wr = r, .max_inline = i, .max_sge = 4};

    return c;
}

START_TEST(qpc_reuse_smallest_fit)
{
    struct vrb_qpcache qc;
    struct vrb_qpc_caps want = caps(64, 64, 64), got;

    ndestroyed = 0;
    exs__vrb_qpc_init(&qc, 4, mock_destroy, NULL);
    ck_assert_ptr_null(exs__vrb_qpc_get(&qc, &want, &got));
    ck_assert_uint_eq(qc.cnt.qp_cache_misses, 1);
    exs__vrb_qpc_put(&qc, (void *)1, &(struct vrb_qpc_caps){1024, 1024, 256, 4});
    exs__vrb_qpc_put(&qc, (void *)2, &(struct vrb_qpc_caps){64, 64, 64, 4});
    exs__vrb_qpc_put(&qc, (void *)3, &(struct vrb_qpc_caps){32, 32, 64, 4});
    ck_assert_uint_eq(qc.cnt.qp_cache_entries, 3);
    /* the smallest QP that covers the request */
    ck_assert_ptr_eq(exs__vrb_qpc_get(&qc, &want, &got), (void *)2);
    ck_assert_uint_eq(got.max_send_wr, 64);
    ck_assert_ptr_eq(exs__vrb_qpc_get(&qc, &want, &got), (void *)1);
    ck_assert_uint_eq(got.max_send_wr, 1024);
    /* 3 is too small for 64 */
    ck_assert_ptr_null(exs__vrb_qpc_get(&qc, &want, &got));
    want = caps(16, 16, 0);
    ck_assert_ptr_eq(exs__vrb_qpc_get(&qc, &want, &got), (void *)3);
    ck_assert_uint_eq(qc.cnt.qp_cache_hits, 3);
    ck_assert_uint_eq(qc.cnt.qp_cache_misses, 2);
    ck_assert_uint_eq(qc.cnt.qp_cache_entries, 0);
    exs__vrb_qpc_fini(&qc);
    ck_assert_int_eq(ndestroyed, 0);
}
END_TEST

START_TEST(qpc_full_evicts_oldest)
{
    struct vrb_qpcache qc;
    struct vrb_qpc_caps c = caps(64, 64, 64);

    ndestroyed = 0;
    exs__vrb_qpc_init(&qc, 2, mock_destroy, NULL);
    exs__vrb_qpc_put(&qc, (void *)1, &c);
    exs__vrb_qpc_put(&qc, (void *)2, &c);
    exs__vrb_qpc_put(&qc, (void *)3, &c);
    ck_assert_int_eq(ndestroyed, 1);
    ck_assert_int_eq(destroyed[0], 1);
    ck_assert_uint_eq(qc.cnt.qp_cache_evictions, 1);
    ck_assert_uint_eq(qc.cnt.qp_cache_entries, 2);
    ck_assert_uint_eq(qc.cnt.qp_cache_puts, 3);
    /* the newest comes back first */
    ck_assert_ptr_eq(exs__vrb_qpc_get(&qc, &c, &c), (void *)3);
    exs__vrb_qpc_fini(&qc);
    ck_assert_int_eq(ndestroyed, 2);
    ck_assert_int_eq(destroyed[1], 2);
}
END_TEST

START_TEST(qpc_off_destroys)
{
    struct vrb_qpcache qc;
    struct vrb_qpc_caps c = caps(8, 8, 0);

    ndestroyed = 0;
    exs__vrb_qpc_init(&qc, 0, mock_destroy, NULL);
    exs__vrb_qpc_put(&qc, (void *)7, &c);
    ck_assert_int_eq(ndestroyed, 1);
    ck_assert_ptr_null(exs__vrb_qpc_get(&qc, &c, &c));
    exs__vrb_qpc_fini(&qc);
}
END_TEST

/* Closed (the device removed): every cached QP is destroyed at once, a QP given back later is
 * destroyed, not kept. */
START_TEST(qpc_close_device_gone)
{
    struct vrb_qpcache qc;
    struct vrb_qpc_caps c = caps(8, 8, 0);

    ndestroyed = 0;
    exs__vrb_qpc_init(&qc, 4, mock_destroy, NULL);
    exs__vrb_qpc_put(&qc, (void *)1, &c);
    exs__vrb_qpc_put(&qc, (void *)2, &c);
    exs__vrb_qpc_close(&qc);
    ck_assert_int_eq(ndestroyed, 2);
    ck_assert_uint_eq(qc.cnt.qp_cache_entries, 0);
    exs__vrb_qpc_put(&qc, (void *)3, &c);
    ck_assert_int_eq(ndestroyed, 3);
    ck_assert_int_eq(destroyed[2], 3);
    ck_assert_ptr_null(exs__vrb_qpc_get(&qc, &c, &c));
    exs__vrb_qpc_fini(&qc);
    ck_assert_int_eq(ndestroyed, 3);
}
END_TEST

START_TEST(counters_visible)
{
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_mcache mc;
    struct vrb_regcache rc;
    struct vrb_qpcache qc;
    struct vrb_mc_buf a;
    struct vrb_qpc_caps c = caps(8, 8, 0);
    uint64_t v = 0;

    memset(&mc, 0, sizeof(mc));
    memset(&rc, 0, sizeof(rc));
    memset(&qc, 0, sizeof(qc));
    ck_assert_int_eq(exs__vrb_mc_init(&mc, REGION, VRB_MEM_ANON, -1, 1000, &ops), 0);
    ck_assert_int_eq(exs__vrb_rc_init(&rc, 4, &ops), 0);
    exs__vrb_qpc_init(&qc, 4, mock_destroy, NULL);
    exs__vrb_cache_counters(&mc, &rc, &qc, 1);
    ck_assert_int_eq(exs__vrb_mc_alloc(&mc, 10, &a), 0);
    ck_assert_ptr_null(exs__vrb_qpc_get(&qc, &c, &c));
    ck_assert_int_eq(exs__counters_lookup("prov.verbs.mcache", "regions", &v), 0);
    ck_assert_uint_eq(v, 1);
    ck_assert_int_eq(exs__counters_lookup("prov.verbs.qpcache", "qp_cache_misses", &v), 0);
    ck_assert_uint_eq(v, 1);
    ck_assert_int_eq(exs__counters_lookup("prov.verbs.regcache", "hits", &v), 0);
    ck_assert_uint_eq(v, 0);
    exs__vrb_cache_counters(&mc, &rc, &qc, 0);
    ck_assert_int_eq(exs__counters_lookup("prov.verbs.mcache", "regions", &v), -ENOENT);
    exs__vrb_mc_free(&mc, &a);
    exs__vrb_mc_fini(&mc);
    exs__vrb_rc_fini(&rc);
    exs__vrb_qpc_fini(&qc);
}
END_TEST

/* ---- grant registration cache ---- */

static void gc_open(struct vrb_gcache *gc, const struct vrb_reg_ops *ops, unsigned entries,
                    size_t bytes)
{
    memset(gc, 0, sizeof(*gc));
    exs__vrb_gc_init(gc, entries, bytes, ops);
    exs__vrb_gc_counters(gc, 1);
}

static uint64_t gc_cnt(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("prov.verbs.grantcache", name, &v), 0);
    return v;
}

/* The next grant of the same range of the same parent gets the registration back, without
 * registering; any other range, length, parent or parent key registers its own. */
START_TEST(gc_same_range_reused)
{
    static char buf[4 * VRB_MC_PAGE];
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_gcache gc;
    struct vrb_gc_entry *a, *b, *c, *d;
    uint64_t v;
    int p1 = 1, p2 = 2;

    gc_open(&gc, &ops, 8, 1u << 20);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 100, 1000, &a), 0);
    ck_assert_int_eq(m.regs, 1);
    ck_assert_uint_eq(m.last_addr, (uintptr_t)(buf + 100)); /* exactly the range */
    ck_assert_uint_eq(m.last_len, 1000);
    exs__vrb_gc_put(&gc, a);
    ck_assert_int_eq(m.deregs, 0);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 100, 1000, &b), 0);
    ck_assert_ptr_eq(b, a);
    ck_assert_int_eq(m.regs, 1);
    ck_assert_uint_eq(gc_cnt("gc_hits"), 1);
    /* in use: the same range again is a registration of its own */
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 100, 1000, &c), 0);
    ck_assert_ptr_ne(c, b);
    exs__vrb_gc_put(&gc, c);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 100, 999, &d), 0); /* other length */
    ck_assert_ptr_ne(d, b);
    exs__vrb_gc_put(&gc, d);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 101, 1000, &d), 0); /* other start */
    exs__vrb_gc_put(&gc, d);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p2, 9, buf + 100, 1000, &d), 0); /* other parent */
    exs__vrb_gc_put(&gc, d);
    /* the same parent address with another key: a registration made there since */
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 10, buf + 100, 1000, &d), 0);
    exs__vrb_gc_put(&gc, d);
    ck_assert_int_eq(m.regs, 6);
    ck_assert_uint_eq(gc_cnt("gc_misses"), 6);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 6);
    ck_assert_uint_eq(gc_cnt("gc_bytes"), 5000 + 999);
    exs__vrb_gc_put(&gc, b);
    exs__vrb_gc_fini(&gc);
    ck_assert_int_eq(m.deregs, 6);
    ck_assert_int_eq(exs__counters_lookup("prov.verbs.grantcache", "gc_hits", &v), -ENOENT);
}
END_TEST

/* Bounded in entries and in bytes: the least recently used unused entry goes; one in use (a
 * window bound over it) never does: a registration that finds no room is not kept. */
START_TEST(gc_bounded_in_use_not_evicted)
{
    static char buf[8 * VRB_MC_PAGE];
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_gcache gc;
    struct vrb_gc_entry *e[4], *x;
    int p = 0;

    gc_open(&gc, &ops, 2, 3 * VRB_MC_PAGE);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf, VRB_MC_PAGE, &e[0]), 0);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + VRB_MC_PAGE, VRB_MC_PAGE, &e[1]), 0);
    /* both in use: the third is not kept, deregistered at its put */
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 2 * VRB_MC_PAGE, VRB_MC_PAGE, &e[2]), 0);
    ck_assert_int_eq(m.deregs, 0);
    exs__vrb_gc_put(&gc, e[2]);
    ck_assert_int_eq(m.deregs, 1);
    ck_assert_uint_eq(gc_cnt("gc_uncached"), 1);
    ck_assert_uint_eq(gc_cnt("gc_evictions"), 0);
    /* e[0] unused, e[1] in use: a new range evicts e[0] */
    exs__vrb_gc_put(&gc, e[0]);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 3 * VRB_MC_PAGE, VRB_MC_PAGE, &e[3]), 0);
    ck_assert_int_eq(m.deregs, 2);
    ck_assert_uint_eq(gc_cnt("gc_evictions"), 1);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 2);
    /* bytes: 2 pages held; 2 more do not fit beside them, the unused one goes first */
    exs__vrb_gc_put(&gc, e[3]);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 4 * VRB_MC_PAGE, 2 * VRB_MC_PAGE, &x), 0);
    ck_assert_int_eq(m.deregs, 3);
    ck_assert_uint_eq(gc_cnt("gc_bytes"), 3 * VRB_MC_PAGE);
    exs__vrb_gc_put(&gc, x);
    /* longer than the cache holds: used once */
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf, 4 * VRB_MC_PAGE, &x), 0);
    exs__vrb_gc_put(&gc, x);
    ck_assert_int_eq(m.deregs, 4);
    exs__vrb_gc_put(&gc, e[1]);
    exs__vrb_gc_fini(&gc);
    ck_assert_int_eq(m.deregs, m.regs);
}
END_TEST

/* A parent deregistered: its unused entries are deregistered at once, one in use at its put;
 * other parents' stay. Closing (device gone) deregisters everything unused and keeps nothing
 * after. Caching off (0 entries): every put deregisters. A failed registration leaves nothing. */
START_TEST(gc_drop_parent_close_off)
{
    static char buf[4 * VRB_MC_PAGE];
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_gcache gc;
    struct vrb_gc_entry *a, *b, *c, *d;
    int p1 = 1, p2 = 2;

    memset(&gc, 0, sizeof(gc));
    exs__vrb_gc_drop(&gc, &p1); /* not initialized yet: nothing to do */
    exs__vrb_gc_init(&gc, 8, 1u << 20, &ops);
    exs__vrb_gc_counters(&gc, 1);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf, 100, &a), 0);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf + 100, 100, &b), 0);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p2, 9, buf, 100, &c), 0);
    exs__vrb_gc_put(&gc, a);
    exs__vrb_gc_put(&gc, c);
    exs__vrb_gc_drop(&gc, &p1);
    ck_assert_int_eq(m.deregs, 1); /* a; b is in use */
    ck_assert_uint_eq(gc_cnt("gc_drops"), 2);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 1);
    exs__vrb_gc_put(&gc, b);
    ck_assert_int_eq(m.deregs, 2);
    /* p1's range again: registered anew */
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf, 100, &a), 0);
    ck_assert_int_eq(m.regs, 4);
    exs__vrb_gc_close(&gc);
    ck_assert_int_eq(m.deregs, 3); /* c */
    exs__vrb_gc_put(&gc, a);
    ck_assert_int_eq(m.deregs, 4);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p2, 9, buf, 100, &d), 0);
    exs__vrb_gc_put(&gc, d);
    ck_assert_int_eq(m.deregs, 5);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 0);
    ck_assert_uint_eq(gc_cnt("gc_bytes"), 0);
    exs__vrb_gc_fini(&gc);
    exs__vrb_gc_fini(&gc); /* twice (device gone, then the ctx closed) */

    ops = mock_ops(&m);
    memset(&gc, 0, sizeof(gc));
    exs__vrb_gc_init(&gc, 0, 1u << 20, &ops);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf, 100, &a), 0);
    exs__vrb_gc_put(&gc, a);
    ck_assert_int_eq(m.deregs, 1);
    m.fail_next = 1;
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p1, 9, buf, 100, &a), -ENOMEM);
    exs__vrb_gc_fini(&gc);
    ck_assert_int_eq(m.regs, m.deregs);
}
END_TEST

/* A registration refused for memory (the locked-memory limit, which the cached entries' pinned
 * pages count against): the unused entries are deregistered and the registration tried once
 * more; entries in use stay. */
START_TEST(gc_trim_on_enomem)
{
    static char buf[4 * VRB_MC_PAGE];
    struct mock_reg m;
    struct vrb_reg_ops ops = mock_ops(&m);
    struct vrb_gcache gc;
    struct vrb_gc_entry *a, *b, *c;
    int p = 0;

    gc_open(&gc, &ops, 8, 1u << 20);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf, 100, &a), 0);
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 100, 100, &b), 0);
    exs__vrb_gc_put(&gc, a);
    m.fail_next = 1;
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 200, 100, &c), 0);
    ck_assert_int_eq(m.deregs, 1); /* a; b is in use */
    ck_assert_uint_eq(gc_cnt("gc_evictions"), 1);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 2);
    /* nothing unused to give back: the failure stands */
    m.fail_next = 1;
    ck_assert_int_eq(exs__vrb_gc_get(&gc, &p, 9, buf + 300, 100, &a), -ENOMEM);
    ck_assert_uint_eq(exs__vrb_gc_trim(&gc), 0);
    exs__vrb_gc_put(&gc, b);
    exs__vrb_gc_put(&gc, c);
    ck_assert_uint_eq(exs__vrb_gc_trim(&gc), 2);
    ck_assert_uint_eq(gc_cnt("gc_entries"), 0);
    exs__vrb_gc_fini(&gc);
    ck_assert_int_eq(m.deregs, m.regs);
}
END_TEST

/* ---- completion queue budget ---- */

START_TEST(cq_plan_fits_without_resize)
{
    uint64_t r = 99;

    ck_assert_int_eq(exs__vrb_cq_plan(1024, 0, 1024, 32767, &r), 0);
    ck_assert_uint_eq(r, 0);
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 1000, 24, 32767, &r), 0);
    ck_assert_uint_eq(r, 0);
}
END_TEST

START_TEST(cq_plan_grows_double_or_to_need)
{
    uint64_t r = 0;

    /* one entry over: twice the queue */
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 1024, 1, 32767, &r), 0);
    ck_assert_uint_eq(r, 2048);
    /* far over: exactly what is needed */
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 100, 9000, 32767, &r), 0);
    ck_assert_uint_eq(r, 9100);
    /* doubling would pass the device's limit: the limit */
    ck_assert_int_eq(exs__vrb_cq_plan(20000, 20000, 10000, 32767, &r), 0);
    ck_assert_uint_eq(r, 32767);
}
END_TEST

START_TEST(cq_plan_refuses_beyond_device_max)
{
    uint64_t r = 7;

    ck_assert_int_eq(exs__vrb_cq_plan(32767, 32767, 1, 32767, &r), -ENOBUFS);
    ck_assert_uint_eq(r, 7); /* untouched on failure */
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 0, 32768, 32767, &r), -ENOBUFS);
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 30000, 2767, 32767, &r), 0);
    ck_assert_uint_eq(r, 32767);
    ck_assert_int_eq(exs__vrb_cq_plan(1024, 30000, 2768, 32767, &r), -ENOBUFS);
    /* a sum that wraps is refused, not taken for a small one */
    ck_assert_int_eq(exs__vrb_cq_plan(1024, UINT64_MAX - 1, 4, UINT64_MAX, &r), -ENOBUFS);
}
END_TEST

/* The QP's local ACK timeout (vrb_cqplan.c, used by vrb_cm.c): the ep's own, else
 * EXS_VRB_QP_TIMEOUT, else what rdma_cm computed for the path (19 on rxe) capped at 16, else 14;
 * never 0. */
START_TEST(qp_timeout_pick)
{
    /* default (parameter 0): rdma_cm's value, at most the cap */
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 0, 1, 15), 15);
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 0, 1, 19), 16);
    ck_assert_uint_eq(VRB_QP_TIMEOUT_CAP, 16);
    /* the parameter, when set, wins over rdma_cm's, uncapped */
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 14, 1, 19), 14);
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 19, 1, 15), 19);
    /* the ep's own wins over both */
    ck_assert_uint_eq(exs__vrb_qp_timeout(18, 14, 1, 19), 18);
    ck_assert_uint_eq(exs__vrb_qp_timeout(18, 0, 1, 19), 18);
    /* rdma_cm gave none (not in its mask, or 0 = infinite): the fallback, never 0 */
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 0, 0, 19), VRB_QP_TIMEOUT_FALLBACK);
    ck_assert_uint_eq(exs__vrb_qp_timeout(0, 0, 1, 0), VRB_QP_TIMEOUT_FALLBACK);
    ck_assert_uint_eq(VRB_QP_TIMEOUT_FALLBACK, 14);
}
END_TEST

Suite *prov_vrb_cache_suite(void)
{
    Suite *s = suite_create("prov_vrb_cache");
    TCase *tc = tcase_create("mcache");

    tcase_add_test(tc, mc_grow_and_keys);
    tcase_add_test(tc, mc_reuse_first_fit);
    tcase_add_test(tc, mc_shrink_idle);
    tcase_add_test(tc, mc_shrink_waits_for_idle_time);
    tcase_add_test(tc, mc_huge_falls_back);
    tcase_add_test(tc, mc_reg_failure);
    tcase_add_test_raise_signal(tc, mc_guard_after_anon, SIGSEGV);
    tcase_add_test_raise_signal(tc, mc_guard_before_anon, SIGSEGV);
    tcase_add_test_raise_signal(tc, mc_guard_after_malloc, SIGSEGV);
    suite_add_tcase(s, tc);
    tc = tcase_create("regcache");
    tcase_add_test(tc, rc_hit_miss_evict);
    tcase_add_test(tc, rc_in_use_not_evicted);
    tcase_add_test(tc, rc_stale_pages_registered_again);
    tcase_add_test(tc, rc_unverifiable_not_kept);
    tcase_add_test(tc, mc_unreg_device_gone);
    tcase_add_test(tc, rc_unreg_device_gone);
    suite_add_tcase(s, tc);
    tc = tcase_create("qpcache");
    tcase_add_test(tc, qpc_reuse_smallest_fit);
    tcase_add_test(tc, qpc_full_evicts_oldest);
    tcase_add_test(tc, qpc_off_destroys);
    tcase_add_test(tc, qpc_close_device_gone);
    tcase_add_test(tc, counters_visible);
    suite_add_tcase(s, tc);
    tc = tcase_create("grantcache");
    tcase_add_test(tc, gc_same_range_reused);
    tcase_add_test(tc, gc_bounded_in_use_not_evicted);
    tcase_add_test(tc, gc_drop_parent_close_off);
    tcase_add_test(tc, gc_trim_on_enomem);
    suite_add_tcase(s, tc);
    tc = tcase_create("cqplan");
    tcase_add_test(tc, cq_plan_fits_without_resize);
    tcase_add_test(tc, cq_plan_grows_double_or_to_need);
    tcase_add_test(tc, cq_plan_refuses_beyond_device_max);
    suite_add_tcase(s, tc);
    tc = tcase_create("qpattr");
    tcase_add_test(tc, qp_timeout_pick);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, prov_vrb_wc_tcase()); /* completion conversion: test_prov_vrb_wc.c */
    return s;
}

#else /* no verbs provider in this build */

START_TEST(no_verbs_provider)
{
    /* built without rdma-core: the caches are not compiled */
}
END_TEST

Suite *prov_vrb_cache_suite(void)
{
    Suite *s = suite_create("prov_vrb_cache");
    TCase *tc = tcase_create("skipped");

    tcase_add_test(tc, no_verbs_provider);
    suite_add_tcase(s, tc);
    return s;
}

#endif
