/* SPDX-License-Identifier: MIT */
/* Memory cache and registration cache (X-RDMA). The memory cache keeps RDMA-enabled memory as
 * equal-size registered regions, each between PROT_NONE guard pages, grown when short and
 * released when idle; backing and NUMA placement are chosen per context. The registration
 * cache keeps user-buffer registrations, found by address range, evicted LRU. Device work goes
 * through struct vrb_reg_ops, so all of this runs in unit tests without hardware. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "exs/prov/verbs/vrb_cache.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

#define VRB_HUGE_PAGE (2u << 20)
#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

static size_t vrb_align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

int exs__vrb_mc_backing_parse(const char *s)
{
    if (!s || !s[0] || strcmp(s, "anon") == 0)
        return VRB_MEM_ANON;
    if (strcmp(s, "huge") == 0)
        return VRB_MEM_HUGE;
    if (strcmp(s, "malloc") == 0)
        return VRB_MEM_MALLOC;
    return -1;
}

int exs__vrb_mc_init(struct vrb_mcache *mc, size_t region_size, enum vrb_mem_backing backing,
                     int numa_node, uint64_t idle_ms, const struct vrb_reg_ops *ops)
{
    if (!ops || !ops->reg || !ops->dereg)
        return -EINVAL;
    memset(&mc->cnt, 0, sizeof(mc->cnt));
    pthread_mutex_init(&mc->lock, NULL);
    exs_list_init(&mc->regions);
    mc->region_size = vrb_align_up(region_size ? region_size : (4u << 20), VRB_MC_PAGE);
    mc->backing = backing;
    mc->numa_node = numa_node;
    mc->idle_ns = idle_ms * 1000000ull;
    mc->min_regions = 1;
    mc->guard = 1; /* exs__vrb_mc_init callers may clear it (vrb_mcache_guard) */
    mc->ops = *ops;
    if (numa_node < 0)
        EXS_DBG(PROV, "mcache: device NUMA node unknown, memory not bound");
    return 0;
}

/* ---- regions ---- */

static void vrb_mc_bind(struct vrb_mcache *mc, void *p, size_t len)
{
#ifdef SYS_mbind
    unsigned long mask;

    if (mc->numa_node < 0 || mc->numa_node >= (int)(8 * sizeof(mask)))
        return;
    mask = 1ul << mc->numa_node;
    if (syscall(SYS_mbind, p, len, MPOL_PREFERRED, &mask, 8 * sizeof(mask), 0) != 0)
        EXS_DBG(PROV, "mcache: mbind to node %d: %m (memory left unbound)", mc->numa_node);
#else
    (void)mc;
    (void)p;
    (void)len;
#endif
}

/* The mapping: [guard | data | guard]; guards are PROT_NONE. */
static int vrb_mc_map(struct vrb_mcache *mc, struct vrb_mc_region *r)
{
    size_t sz = mc->region_size, g = VRB_MC_PAGE;

    r->backing = mc->backing;
    if (mc->backing == VRB_MEM_MALLOC) {
        void *p = NULL;

        if (posix_memalign(&p, g, sz + 2 * g))
            return -ENOMEM;
        r->map = p;
        r->map_len = sz + 2 * g;
        r->data = r->map + g;
        if (mc->guard && (mprotect(r->map, g, PROT_NONE) || mprotect(r->data + sz, g, PROT_NONE)))
            EXS_DBG(PROV, "mcache: guard pages: %m");
        return 0;
    }
    if (mc->backing == VRB_MEM_HUGE) {
        size_t len = sz + 4 * (size_t)VRB_HUGE_PAGE;
        uint8_t *res =
            mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        uint8_t *data;

        if (res == MAP_FAILED)
            return -ENOMEM;
        data = (uint8_t *)vrb_align_up((uintptr_t)res + VRB_HUGE_PAGE, VRB_HUGE_PAGE);
        r->map = res;
        r->map_len = len;
        r->data = data;
        if (mmap(data, vrb_align_up(sz, VRB_HUGE_PAGE), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_HUGETLB, -1, 0) != MAP_FAILED)
            return 0;
        EXS_DBG(PROV, "mcache: huge pages unavailable (%m), anonymous pages used");
        EXS_CNT_INC(mc->cnt.huge_fallbacks);
        r->backing = VRB_MEM_ANON;
        /* a failed MAP_FIXED may have dropped the reservation there: map it again */
        if (mmap(data, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                 0) == MAP_FAILED) {
            munmap(res, len);
            return -ENOMEM;
        }
        return 0;
    }
    r->map_len = sz + 2 * g;
    r->map = mmap(NULL, r->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->map == MAP_FAILED)
        return -ENOMEM;
    r->data = r->map + g;
    if (mprotect(r->data, sz, PROT_READ | PROT_WRITE)) {
        munmap(r->map, r->map_len);
        return -ENOMEM;
    }
    return 0;
}

static void vrb_mc_unmap(struct vrb_mcache *mc, struct vrb_mc_region *r)
{
    if (mc->backing == VRB_MEM_MALLOC) {
        mprotect(r->map, r->map_len, PROT_READ | PROT_WRITE);
        free(r->map);
    } else {
        munmap(r->map, r->map_len);
    }
}

static struct vrb_mc_region *vrb_mc_grow(struct vrb_mcache *mc)
{
    struct vrb_mc_region *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->npages = (uint32_t)(mc->region_size / VRB_MC_PAGE);
    r->bitmap = calloc(r->npages, 1);
    if (!r->bitmap || vrb_mc_map(mc, r)) {
        free(r->bitmap);
        free(r);
        return NULL;
    }
    vrb_mc_bind(mc, r->data, mc->region_size);
    if (mc->ops.reg(mc->ops.arg, r->data, mc->region_size, &r->handle, &r->lkey, &r->rkey)) {
        vrb_mc_unmap(mc, r);
        free(r->bitmap);
        free(r);
        return NULL;
    }
    exs_list_add_tail(&mc->regions, &r->link);
    EXS_CNT_INC(mc->cnt.regions);
    EXS_CNT_INC(mc->cnt.regions_grown);
    EXS_CNT_ADD(mc->cnt.bytes_held, mc->region_size);
    return r;
}

static void vrb_mc_release(struct vrb_mcache *mc, struct vrb_mc_region *r)
{
    exs_list_del(&r->link);
    if (r->handle)
        mc->ops.dereg(mc->ops.arg, r->handle);
    vrb_mc_unmap(mc, r);
    free(r->bitmap);
    free(r);
    __atomic_fetch_sub(&mc->cnt.regions, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&mc->cnt.bytes_held, mc->region_size, __ATOMIC_RELAXED);
}

void exs__vrb_mc_unreg(struct vrb_mcache *mc)
{
    struct exs_list *pos;

    pthread_mutex_lock(&mc->lock);
    exs_list_for_each(pos, &mc->regions)
    {
        struct vrb_mc_region *r = exs_list_entry(pos, struct vrb_mc_region, link);

        if (r->handle)
            mc->ops.dereg(mc->ops.arg, r->handle);
        r->handle = NULL;
    }
    pthread_mutex_unlock(&mc->lock);
}

void exs__vrb_mc_fini(struct vrb_mcache *mc)
{
    struct exs_list *l;

    if (!mc->regions.next)
        return;
    while ((l = mc->regions.next) != &mc->regions)
        vrb_mc_release(mc, exs_list_entry(l, struct vrb_mc_region, link));
    pthread_mutex_destroy(&mc->lock);
    mc->regions.next = NULL;
}

/* First fit of n pages in r: the first page index, or -1. */
static long vrb_mc_fit(const struct vrb_mc_region *r, uint32_t n)
{
    uint32_t run = 0;

    if (r->npages - r->used < n)
        return -1;
    for (uint32_t i = 0; i < r->npages; i++) {
        run = r->bitmap[i] ? 0 : run + 1;
        if (run == n)
            return (long)(i + 1 - n);
    }
    return -1;
}

int exs__vrb_mc_alloc(struct vrb_mcache *mc, size_t len, struct vrb_mc_buf *buf)
{
    struct vrb_mc_region *r = NULL;
    struct exs_list *pos;
    uint32_t n;
    long at = -1;

    if (!len || len > mc->region_size) {
        EXS_CNT_INC(mc->cnt.alloc_fails);
        return -EINVAL;
    }
    n = (uint32_t)(vrb_align_up(len, VRB_MC_PAGE) / VRB_MC_PAGE);
    pthread_mutex_lock(&mc->lock);
    exs_list_for_each(pos, &mc->regions)
    {
        r = exs_list_entry(pos, struct vrb_mc_region, link);
        at = vrb_mc_fit(r, n);
        if (at >= 0)
            break;
    }
    if (at < 0) {
        r = vrb_mc_grow(mc);
        at = r ? 0 : -1;
    }
    if (at < 0) {
        pthread_mutex_unlock(&mc->lock);
        EXS_CNT_INC(mc->cnt.alloc_fails);
        return -ENOMEM;
    }
    memset(r->bitmap + at, 1, n);
    r->used += n;
    pthread_mutex_unlock(&mc->lock);
    buf->addr = r->data + (size_t)at * VRB_MC_PAGE;
    buf->len = (size_t)n * VRB_MC_PAGE;
    buf->lkey = r->lkey;
    buf->rkey = r->rkey;
    buf->region = r;
    EXS_CNT_INC(mc->cnt.allocs);
    EXS_CNT_ADD(mc->cnt.bytes_used, buf->len);
    return 0;
}

unsigned exs__vrb_mc_shrink_locked(struct vrb_mcache *mc, uint64_t now_ns);
unsigned exs__vrb_mc_shrink_locked(struct vrb_mcache *mc, uint64_t now_ns)
{
    struct exs_list *pos, *tmp;
    unsigned n = 0;

    exs_list_for_each_safe(pos, tmp, &mc->regions)
    {
        struct vrb_mc_region *r = exs_list_entry(pos, struct vrb_mc_region, link);

        if (EXS_CNT_GET(mc->cnt.regions) <= mc->min_regions)
            break;
        if (r->used || now_ns - r->idle_since_ns < mc->idle_ns)
            continue;
        vrb_mc_release(mc, r);
        EXS_CNT_INC(mc->cnt.regions_shrunk);
        n++;
    }
    return n;
}

unsigned exs__vrb_mc_shrink(struct vrb_mcache *mc, uint64_t now_ns)
{
    unsigned n;

    pthread_mutex_lock(&mc->lock);
    n = exs__vrb_mc_shrink_locked(mc, now_ns);
    pthread_mutex_unlock(&mc->lock);
    return n;
}

void exs__vrb_mc_free(struct vrb_mcache *mc, struct vrb_mc_buf *buf)
{
    struct vrb_mc_region *r = buf->region;
    size_t at;
    uint32_t n;
    uint64_t now = exs__now_ns();

    if (!r)
        return;
    at = (size_t)((uint8_t *)buf->addr - r->data) / VRB_MC_PAGE;
    n = (uint32_t)(buf->len / VRB_MC_PAGE);
    pthread_mutex_lock(&mc->lock);
    memset(r->bitmap + at, 0, n);
    r->used -= n;
    if (!r->used)
        r->idle_since_ns = now;
    exs__vrb_mc_shrink_locked(mc, now);
    pthread_mutex_unlock(&mc->lock);
    EXS_CNT_INC(mc->cnt.frees);
    __atomic_fetch_sub(&mc->cnt.bytes_used, buf->len, __ATOMIC_RELAXED);
    buf->region = NULL;
}

/* ---- registration cache ---- */

int exs__vrb_rc_init(struct vrb_regcache *rc, unsigned max_entries, const struct vrb_reg_ops *ops)
{
    if (!ops || !ops->reg || !ops->dereg)
        return -EINVAL;
    memset(&rc->cnt, 0, sizeof(rc->cnt));
    pthread_mutex_init(&rc->lock, NULL);
    exs_list_init(&rc->lru);
    rc->max_entries = max_entries ? max_entries : 1;
    rc->ops = *ops;
    return 0;
}

/* Take e out of the cache; it is deregistered now, or at its last put when still held. */
static void vrb_rc_drop(struct vrb_regcache *rc, struct vrb_rc_entry *e)
{
    if (e->cached) {
        exs_list_del(&e->link);
        e->cached = 0;
        __atomic_fetch_sub(&rc->cnt.entries, 1, __ATOMIC_RELAXED);
    }
    if (e->refs)
        return;
    if (e->handle)
        rc->ops.dereg(rc->ops.arg, e->handle);
    free(e);
}

void exs__vrb_rc_unreg(struct vrb_regcache *rc, struct vrb_rc_entry *e)
{
    struct exs_list *pos, *tmp;

    pthread_mutex_lock(&rc->lock);
    exs_list_for_each_safe(pos, tmp, &rc->lru)
    {
        struct vrb_rc_entry *c = exs_list_entry(pos, struct vrb_rc_entry, link);

        if (!c->refs) {
            vrb_rc_drop(rc, c);
        } else if (c->handle) {
            rc->ops.dereg(rc->ops.arg, c->handle);
            c->handle = NULL;
        }
    }
    if (e && e->handle) {
        rc->ops.dereg(rc->ops.arg, e->handle);
        e->handle = NULL;
    }
    pthread_mutex_unlock(&rc->lock);
}

/* 1 when e's pages are still the ones it registered (or no ident callback). */
static int vrb_rc_valid(struct vrb_regcache *rc, struct vrb_rc_entry *e)
{
    uint64_t id;

    if (!rc->ops.ident)
        return 1;
    return rc->ops.ident(rc->ops.arg, e->start, e->end - e->start, &id) == 0 && id == e->ident;
}

void exs__vrb_rc_fini(struct vrb_regcache *rc)
{
    struct exs_list *l;

    if (!rc->lru.next)
        return;
    while ((l = rc->lru.next) != &rc->lru)
        vrb_rc_drop(rc, exs_list_entry(l, struct vrb_rc_entry, link));
    pthread_mutex_destroy(&rc->lock);
    rc->lru.next = NULL;
}

int exs__vrb_rc_get(struct vrb_regcache *rc, const void *addr, size_t len,
                    struct vrb_rc_entry **e_p)
{
    uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(VRB_MC_PAGE - 1);
    uintptr_t end = vrb_align_up((uintptr_t)addr + (len ? len : 1), VRB_MC_PAGE);
    struct exs_list *pos, *tmp;
    struct vrb_rc_entry *e;
    int ret;

    if (!addr)
        return -EINVAL;
    pthread_mutex_lock(&rc->lock);
    exs_list_for_each(pos, &rc->lru)
    {
        e = exs_list_entry(pos, struct vrb_rc_entry, link);
        if (e->start <= start && end <= e->end) {
            if (!vrb_rc_valid(rc, e)) {
                EXS_CNT_INC(rc->cnt.stale);
                vrb_rc_drop(rc, e);
                break;
            }
            exs_list_del(&e->link);
            exs_list_add_head(&rc->lru, &e->link);
            e->refs++;
            pthread_mutex_unlock(&rc->lock);
            EXS_CNT_INC(rc->cnt.hits);
            *e_p = e;
            return 0;
        }
    }
    EXS_CNT_INC(rc->cnt.misses);
    /* make room: least recently used first, never one in use */
    for (pos = rc->lru.prev, tmp = pos->prev;
         pos != &rc->lru && EXS_CNT_GET(rc->cnt.entries) >= rc->max_entries;
         pos = tmp, tmp = pos->prev) {
        e = exs_list_entry(pos, struct vrb_rc_entry, link);
        if (e->refs)
            continue;
        vrb_rc_drop(rc, e);
        EXS_CNT_INC(rc->cnt.evictions);
    }
    e = calloc(1, sizeof(*e));
    if (!e) {
        pthread_mutex_unlock(&rc->lock);
        return -ENOMEM;
    }
    e->start = start;
    e->end = end;
    ret = rc->ops.reg(rc->ops.arg, (void *)start, end - start, &e->handle, &e->lkey, &e->rkey);
    if (ret) {
        pthread_mutex_unlock(&rc->lock);
        free(e);
        EXS_CNT_INC(rc->cnt.reg_fails);
        return ret;
    }
    e->refs = 1;
    if (rc->ops.ident && rc->ops.ident(rc->ops.arg, start, end - start, &e->ident) != 0) {
        /* the pages cannot be told apart later: use it once, never again */
        EXS_CNT_INC(rc->cnt.unverifiable);
    } else {
        e->cached = 1;
        exs_list_add_head(&rc->lru, &e->link);
        EXS_CNT_INC(rc->cnt.entries);
    }
    pthread_mutex_unlock(&rc->lock);
    *e_p = e;
    return 0;
}

void exs__vrb_rc_put(struct vrb_regcache *rc, struct vrb_rc_entry *e)
{
    pthread_mutex_lock(&rc->lock);
    EXS_ASSERT(e->refs > 0);
    e->refs--;
    if (!e->refs && !e->cached)
        vrb_rc_drop(rc, e);
    pthread_mutex_unlock(&rc->lock);
}

void exs__vrb_rc_invalidate(struct vrb_regcache *rc, const void *addr, size_t len)
{
    uintptr_t s = (uintptr_t)addr, t = (uintptr_t)addr + len;
    struct exs_list *pos, *tmp;

    pthread_mutex_lock(&rc->lock);
    exs_list_for_each_safe(pos, tmp, &rc->lru)
    {
        struct vrb_rc_entry *e = exs_list_entry(pos, struct vrb_rc_entry, link);

        if (e->start < t && s < e->end)
            vrb_rc_drop(rc, e);
    }
    pthread_mutex_unlock(&rc->lock);
}

/* ---- grant registration cache ---- */

void exs__vrb_gc_init(struct vrb_gcache *gc, unsigned max_entries, size_t max_bytes,
                      const struct vrb_reg_ops *ops)
{
    memset(&gc->cnt, 0, sizeof(gc->cnt));
    pthread_mutex_init(&gc->lock, NULL);
    exs_list_init(&gc->lru);
    gc->max_entries = max_entries;
    gc->max_bytes = max_bytes;
    gc->closed = 0;
    gc->ops = *ops;
}

/* Out of the cache (gc->lock); deregistered now unless in use (then at its put). */
static void vrb_gc_unlink(struct vrb_gcache *gc, struct vrb_gc_entry *e)
{
    if (e->cached) {
        exs_list_del(&e->link);
        e->cached = 0;
        EXS_CNT_ADD(gc->cnt.gc_entries, -1);
        EXS_CNT_ADD(gc->cnt.gc_bytes, -(uint64_t)e->len);
    }
    if (e->busy)
        return;
    if (e->handle)
        gc->ops.dereg(gc->ops.arg, e->handle);
    free(e);
}

void exs__vrb_gc_fini(struct vrb_gcache *gc)
{
    struct exs_list *l;

    if (!gc->lru.next)
        return;
    exs__vrb_gc_counters(gc, 0);
    pthread_mutex_lock(&gc->lock);
    gc->closed = 1;
    while ((l = gc->lru.next) != &gc->lru) {
        struct vrb_gc_entry *e = exs_list_entry(l, struct vrb_gc_entry, link);

        if (e->busy) /* a grant not released: its put deregisters it */
            EXS_ERR(PROV, "grant cache: %#lx+%zu still in use at the end", (unsigned long)e->addr,
                    e->len);
        vrb_gc_unlink(gc, e);
    }
    pthread_mutex_unlock(&gc->lock);
}

/* Room for one more entry of len bytes (gc->lock): least recently used first, never one
 * in use. 1 when there is room. */
static int vrb_gc_room(struct vrb_gcache *gc, size_t len)
{
    struct exs_list *pos, *tmp;

    if (gc->closed || !gc->max_entries || len > gc->max_bytes)
        return 0;
    for (pos = gc->lru.prev, tmp = pos->prev;
         pos != &gc->lru && (EXS_CNT_GET(gc->cnt.gc_entries) >= gc->max_entries ||
                             EXS_CNT_GET(gc->cnt.gc_bytes) + len > gc->max_bytes);
         pos = tmp, tmp = pos->prev) {
        struct vrb_gc_entry *e = exs_list_entry(pos, struct vrb_gc_entry, link);

        if (e->busy)
            continue;
        vrb_gc_unlink(gc, e);
        EXS_CNT_INC(gc->cnt.gc_evictions);
    }
    return EXS_CNT_GET(gc->cnt.gc_entries) < gc->max_entries &&
           EXS_CNT_GET(gc->cnt.gc_bytes) + len <= gc->max_bytes;
}

int exs__vrb_gc_get(struct vrb_gcache *gc, const void *parent, uint32_t parent_key, void *addr,
                    size_t len, struct vrb_gc_entry **e_p)
{
    struct exs_list *pos;
    struct vrb_gc_entry *e;
    uint32_t rkey;
    int ret;

    pthread_mutex_lock(&gc->lock);
    exs_list_for_each(pos, &gc->lru)
    {
        e = exs_list_entry(pos, struct vrb_gc_entry, link);
        if (e->parent == parent && e->parent_key == parent_key && e->addr == (uintptr_t)addr &&
            e->len == len && !e->busy) {
            exs_list_del(&e->link);
            exs_list_add_head(&gc->lru, &e->link);
            e->busy = 1;
            pthread_mutex_unlock(&gc->lock);
            EXS_CNT_INC(gc->cnt.gc_hits);
            *e_p = e;
            return 0;
        }
    }
    EXS_CNT_INC(gc->cnt.gc_misses);
    e = calloc(1, sizeof(*e));
    if (!e) {
        pthread_mutex_unlock(&gc->lock);
        return -ENOMEM;
    }
    e->parent = parent;
    e->parent_key = parent_key;
    e->addr = (uintptr_t)addr;
    e->len = len;
    e->busy = 1;
    if (vrb_gc_room(gc, len)) {
        e->cached = 1;
        exs_list_add_head(&gc->lru, &e->link);
        EXS_CNT_INC(gc->cnt.gc_entries);
        EXS_CNT_ADD(gc->cnt.gc_bytes, len);
    }
    pthread_mutex_unlock(&gc->lock);
    /* the registration outside the lock: other grants go on meanwhile (a busy entry is
     * neither found nor evicted, and drop leaves it to its put) */
    ret = gc->ops.reg(gc->ops.arg, addr, len, &e->handle, &e->lkey, &rkey);
    if (ret == -ENOMEM && exs__vrb_gc_trim(gc))
        ret = gc->ops.reg(gc->ops.arg, addr, len, &e->handle, &e->lkey, &rkey);
    if (ret) {
        e->handle = NULL;
        pthread_mutex_lock(&gc->lock);
        e->busy = 0;
        vrb_gc_unlink(gc, e);
        pthread_mutex_unlock(&gc->lock);
        return ret;
    }
    *e_p = e;
    return 0;
}

void exs__vrb_gc_put(struct vrb_gcache *gc, struct vrb_gc_entry *e)
{
    pthread_mutex_lock(&gc->lock);
    EXS_ASSERT(e->busy);
    e->busy = 0;
    if (!e->cached) {
        EXS_CNT_INC(gc->cnt.gc_uncached);
        vrb_gc_unlink(gc, e);
    }
    pthread_mutex_unlock(&gc->lock);
}

void exs__vrb_gc_drop(struct vrb_gcache *gc, const void *parent)
{
    struct exs_list *pos, *tmp;

    if (!gc->lru.next)
        return;
    pthread_mutex_lock(&gc->lock);
    exs_list_for_each_safe(pos, tmp, &gc->lru)
    {
        struct vrb_gc_entry *e = exs_list_entry(pos, struct vrb_gc_entry, link);

        if (e->parent != parent)
            continue;
        EXS_CNT_INC(gc->cnt.gc_drops);
        vrb_gc_unlink(gc, e);
    }
    pthread_mutex_unlock(&gc->lock);
}

unsigned exs__vrb_gc_trim(struct vrb_gcache *gc)
{
    struct exs_list *pos, *tmp;
    unsigned n = 0;

    if (!gc->lru.next)
        return 0;
    pthread_mutex_lock(&gc->lock);
    exs_list_for_each_safe(pos, tmp, &gc->lru)
    {
        struct vrb_gc_entry *e = exs_list_entry(pos, struct vrb_gc_entry, link);

        if (e->busy)
            continue;
        vrb_gc_unlink(gc, e);
        EXS_CNT_INC(gc->cnt.gc_evictions);
        n++;
    }
    pthread_mutex_unlock(&gc->lock);
    return n;
}

void exs__vrb_gc_close(struct vrb_gcache *gc)
{
    struct exs_list *pos, *tmp;

    if (!gc->lru.next)
        return;
    pthread_mutex_lock(&gc->lock);
    gc->closed = 1;
    exs_list_for_each_safe(pos, tmp, &gc->lru)
    {
        EXS_CNT_INC(gc->cnt.gc_drops);
        vrb_gc_unlink(gc, exs_list_entry(pos, struct vrb_gc_entry, link));
    }
    pthread_mutex_unlock(&gc->lock);
}

/* ---- counters ---- */

static const struct exs_counter_desc vrb_mc_desc[] = {
    EXS_COUNTER(struct vrb_mc_counters, regions, "regions held"),
    EXS_COUNTER(struct vrb_mc_counters, regions_grown, "regions added"),
    EXS_COUNTER(struct vrb_mc_counters, regions_shrunk, "idle regions released"),
    EXS_COUNTER(struct vrb_mc_counters, bytes_held, "bytes of held regions"),
    EXS_COUNTER(struct vrb_mc_counters, bytes_used, "bytes handed out"),
    EXS_COUNTER(struct vrb_mc_counters, allocs, "allocations"),
    EXS_COUNTER(struct vrb_mc_counters, frees, "frees"),
    EXS_COUNTER(struct vrb_mc_counters, alloc_fails, "failed allocations"),
    EXS_COUNTER(struct vrb_mc_counters, huge_fallbacks, "huge pages refused, anonymous used"),
};

static const struct exs_counter_desc vrb_rc_desc[] = {
    EXS_COUNTER(struct vrb_rc_counters, hits, "lookups served by a cached registration"),
    EXS_COUNTER(struct vrb_rc_counters, misses, "lookups that registered"),
    EXS_COUNTER(struct vrb_rc_counters, evictions, "registrations evicted (LRU)"),
    EXS_COUNTER(struct vrb_rc_counters, entries, "registrations cached"),
    EXS_COUNTER(struct vrb_rc_counters, reg_fails, "registrations that failed"),
    EXS_COUNTER(struct vrb_rc_counters, stale, "cached registrations whose pages had changed"),
    EXS_COUNTER(struct vrb_rc_counters, unverifiable, "registrations not kept: pages unknown"),
};

static const struct exs_counter_desc vrb_qpc_desc[] = {
    EXS_COUNTER(struct vrb_qpc_counters, qp_cache_hits, "eps given a cached QP"),
    EXS_COUNTER(struct vrb_qpc_counters, qp_cache_misses, "eps that created a QP"),
    EXS_COUNTER(struct vrb_qpc_counters, qp_cache_puts, "QPs taken back in RESET"),
    EXS_COUNTER(struct vrb_qpc_counters, qp_cache_evictions, "QPs destroyed, cache full"),
    EXS_COUNTER(struct vrb_qpc_counters, qp_cache_entries, "QPs cached"),
};

static const struct exs_counter_desc vrb_gc_desc[] = {
    EXS_COUNTER(struct vrb_gc_counters, gc_hits, "grants given a cached registration"),
    EXS_COUNTER(struct vrb_gc_counters, gc_misses, "grants that registered their range"),
    EXS_COUNTER(struct vrb_gc_counters, gc_evictions, "unused registrations evicted (LRU)"),
    EXS_COUNTER(struct vrb_gc_counters, gc_drops, "dropped with their parent or the device"),
    EXS_COUNTER(struct vrb_gc_counters, gc_uncached, "deregistered at revoke: not kept"),
    EXS_COUNTER(struct vrb_gc_counters, gc_entries, "registrations cached"),
    EXS_COUNTER(struct vrb_gc_counters, gc_bytes, "bytes they cover"),
};

static void vrb_cset(struct exs_counter_set *s, int *reg, const char *name,
                     const struct exs_counter_desc *d, size_t n, const void *base, int on)
{
    if (on && !*reg) {
        s->name = name;
        s->desc = d;
        s->count = n;
        s->base = base;
        exs__counters_register(s);
        *reg = 1;
    } else if (!on && *reg) {
        exs__counters_unregister(s);
        *reg = 0;
    }
}

void exs__vrb_cache_counters(struct vrb_mcache *mc, struct vrb_regcache *rc, struct vrb_qpcache *qc,
                             int on)
{
    if (mc)
        vrb_cset(&mc->cset, &mc->registered, "prov.verbs.mcache", vrb_mc_desc,
                 EXS_ARRAY_SIZE(vrb_mc_desc), &mc->cnt, on);
    if (rc)
        vrb_cset(&rc->cset, &rc->registered, "prov.verbs.regcache", vrb_rc_desc,
                 EXS_ARRAY_SIZE(vrb_rc_desc), &rc->cnt, on);
    if (qc)
        vrb_cset(&qc->cset, &qc->registered, "prov.verbs.qpcache", vrb_qpc_desc,
                 EXS_ARRAY_SIZE(vrb_qpc_desc), &qc->cnt, on);
}

void exs__vrb_gc_counters(struct vrb_gcache *gc, int on)
{
    vrb_cset(&gc->cset, &gc->registered, "prov.verbs.grantcache", vrb_gc_desc,
             EXS_ARRAY_SIZE(vrb_gc_desc), &gc->cnt, on);
}
