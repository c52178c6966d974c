/* SPDX-License-Identifier: MIT */
/* The verbs provider's caches (X-RDMA): memory regions, user-buffer registrations, queue pairs.
 * Pure bookkeeping: the device work (register, deregister, destroy a QP) goes through callbacks,
 * so the logic is unit-tested without RDMA hardware (tests/unit/test_prov_vrb_cache.c). */
#ifndef EXS_PROV_VERBS_VRB_CACHE_H
#define EXS_PROV_VERBS_VRB_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "exs/util/counters.h"
#include "exs/util/list.h"

/* ---- registration callbacks shared by the memory and registration caches ---- */
struct vrb_reg_ops {
    /* Register [addr, addr+len): 0 and *handle_p / *lkey_p / *rkey_p, or -errno. */
    int (*reg)(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
               uint32_t *rkey_p);
    void (*dereg)(void *arg, void *handle);
    /* Registration cache only, optional: a fingerprint of the physical pages behind
     * [start, start+len) now (0), or -errno when it cannot be known. A cached registration
     * is used again only while its pages are the same: memory unmapped and mapped again at
     * the same address (free, then malloc) gets new pages the old registration does not
     * point at. */
    int (*ident)(void *arg, uintptr_t start, size_t len, uint64_t *id_p);
    void *arg;
};

/* ---- memory cache: RDMA-enabled memory as equal-size regions ---- */
enum vrb_mem_backing {
    VRB_MEM_ANON = 0, /* anonymous mmap */
    VRB_MEM_HUGE,     /* MAP_HUGETLB, falling back to anonymous pages */
    VRB_MEM_MALLOC,   /* posix_memalign */
};

#define VRB_MC_PAGE 4096u

struct vrb_mc_counters {
    uint64_t regions;        /* regions currently held */
    uint64_t regions_grown;  /* regions ever added */
    uint64_t regions_shrunk; /* idle regions released */
    uint64_t bytes_held;     /* bytes of the held regions */
    uint64_t bytes_used;     /* bytes handed out */
    uint64_t allocs;
    uint64_t frees;
    uint64_t alloc_fails;
    uint64_t huge_fallbacks; /* huge pages asked for, anonymous pages used */
};

struct vrb_mc_region {
    struct exs_list link; /* mc->regions */
    uint8_t *map;         /* whole mapping: guard | data | guard */
    size_t map_len;
    uint8_t *data; /* region_size bytes, registered */
    void *handle;  /* from reg_ops.reg */
    uint32_t lkey, rkey;
    uint32_t npages;
    uint32_t used;                /* pages handed out */
    uint64_t idle_since_ns;       /* when used dropped to 0 */
    enum vrb_mem_backing backing; /* what was really used */
    uint8_t *bitmap;              /* one byte per page: 0 free, else the run length marker */
};

struct vrb_mcache {
    pthread_mutex_t lock;
    struct exs_list regions;
    size_t region_size; /* multiple of VRB_MC_PAGE */
    enum vrb_mem_backing backing;
    int numa_node;        /* -1: unknown */
    uint64_t idle_ns;     /* shrink regions idle this long */
    unsigned min_regions; /* never shrink below */
    int guard;            /* PROT_NONE pages around each region */
    struct vrb_reg_ops ops;
    struct vrb_mc_counters cnt;
    struct exs_counter_set cset;
    int registered; /* cset in the registry */
};

/* A piece of cached memory: address, keys, and where it came from. */
struct vrb_mc_buf {
    void *addr;
    size_t len; /* rounded up to pages */
    uint32_t lkey, rkey;
    struct vrb_mc_region *region;
};

int exs__vrb_mc_init(struct vrb_mcache *mc, size_t region_size, enum vrb_mem_backing backing,
                     int numa_node, uint64_t idle_ms, const struct vrb_reg_ops *ops);
void exs__vrb_mc_fini(struct vrb_mcache *mc);
/* Memory of len bytes (<= region_size) from a registered region; grows by one region when
 * short. -EINVAL (0 or too long), -ENOMEM. */
int exs__vrb_mc_alloc(struct vrb_mcache *mc, size_t len, struct vrb_mc_buf *buf);
/* Give it back; regions idle longer than idle_ms (beyond min_regions) are released. */
void exs__vrb_mc_free(struct vrb_mcache *mc, struct vrb_mc_buf *buf);
/* Release idle regions now (now_ns: the current monotonic time). Returns the count. */
unsigned exs__vrb_mc_shrink(struct vrb_mcache *mc, uint64_t now_ns);
/* The device went away: deregister every region now (handles to NULL, the memory stays
 * mapped for its users; a region released later is only unmapped). */
void exs__vrb_mc_unreg(struct vrb_mcache *mc);
/* "anon", "huge", "malloc" -> backing; -1 when unknown. */
int exs__vrb_mc_backing_parse(const char *s);

/* ---- registration cache for user buffers ---- */
struct vrb_rc_counters {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;
    uint64_t entries;
    uint64_t reg_fails;
    uint64_t stale;        /* cached registrations found pointing at pages no longer mapped */
    uint64_t unverifiable; /* registrations not kept: the pages could not be identified */
};

struct vrb_rc_entry {
    struct exs_list link; /* rc->lru: most recently used first */
    uintptr_t start, end; /* registered [start, end), page aligned */
    void *handle;
    uint32_t lkey, rkey;
    unsigned refs;  /* users holding it; never evicted while > 0 */
    uint64_t ident; /* ops.ident of the pages when registered */
    int cached;     /* in rc->lru; 0: dropped at the last put (stale or unverifiable) */
};

struct vrb_regcache {
    pthread_mutex_t lock;
    struct exs_list lru;
    unsigned max_entries;
    struct vrb_reg_ops ops;
    struct vrb_rc_counters cnt;
    struct exs_counter_set cset;
    int registered;
};

int exs__vrb_rc_init(struct vrb_regcache *rc, unsigned max_entries, const struct vrb_reg_ops *ops);
void exs__vrb_rc_fini(struct vrb_regcache *rc);
/* A registration covering [addr, addr+len) (page-expanded), held until put. */
int exs__vrb_rc_get(struct vrb_regcache *rc, const void *addr, size_t len,
                    struct vrb_rc_entry **e_p);
void exs__vrb_rc_put(struct vrb_regcache *rc, struct vrb_rc_entry *e);
/* The device went away: every cached entry unused is dropped, every other one deregistered
 * now (handle NULL; freed at its last put). e: one entry held outside the cache's list too
 * (an unverifiable one), or NULL. */
void exs__vrb_rc_unreg(struct vrb_regcache *rc, struct vrb_rc_entry *e);
/* Drop every unused registration overlapping [addr, addr+len) (memory about to be freed). */
void exs__vrb_rc_invalidate(struct vrb_regcache *rc, const void *addr, size_t len);

/* ---- grant registration cache (grant mode mw_mr, spec/provider.md "Grants") ----
 * Registrations of exactly one grant's range, local rights and MW_BIND only (no remote
 * right: only the window bound over one at a time gives one), kept after the grant's revoke
 * for the next grant of the same range of the same parent registration. An entry in use
 * (a window bound over it) is never evicted or deregistered by the cache; entries over a
 * parent are dropped before the parent is deregistered (exs__vrb_gc_drop), so an entry never
 * outlives the pages its parent pinned. */
struct vrb_gc_counters {
    uint64_t gc_hits;      /* grants given a cached registration */
    uint64_t gc_misses;    /* grants that registered */
    uint64_t gc_evictions; /* unused registrations deregistered, cache full (LRU) */
    uint64_t gc_drops;     /* deregistered with their parent (or the device) */
    uint64_t gc_uncached;  /* not kept: the cache full of registrations in use, or closed */
    uint64_t gc_entries;   /* registrations cached */
    uint64_t gc_bytes;     /* bytes they cover */
};

struct vrb_gc_entry {
    struct exs_list link; /* gc->lru, most recently used first (when cached) */
    const void *parent;   /* the registration the range lies in (its device handle) */
    uint32_t parent_key;  /* and its key: a later registration at the same address differs */
    uintptr_t addr;
    size_t len;
    void *handle;
    uint32_t lkey;
    int busy;   /* between get and put: never deregistered by the cache */
    int cached; /* in gc->lru; 0: deregistered at put */
};

struct vrb_gcache {
    pthread_mutex_t lock;
    struct exs_list lru;
    unsigned max_entries; /* 0: caching off (every put deregisters) */
    size_t max_bytes;
    int closed; /* the device went away: nothing is kept */
    struct vrb_reg_ops ops;
    struct vrb_gc_counters cnt;
    struct exs_counter_set cset;
    int registered;
};

void exs__vrb_gc_init(struct vrb_gcache *gc, unsigned max_entries, size_t max_bytes,
                      const struct vrb_reg_ops *ops);
/* Deregisters every entry (none may be in use) and unregisters the counters. */
void exs__vrb_gc_fini(struct vrb_gcache *gc);
/* A registration of exactly [addr, addr+len) inside parent (whose lkey is parent_key), in
 * use until put: a cached one (a hit) or a new one. -errno of ops.reg. */
int exs__vrb_gc_get(struct vrb_gcache *gc, const void *parent, uint32_t parent_key, void *addr,
                    size_t len, struct vrb_gc_entry **e_p);
/* No window over it any more: kept for the next get, or deregistered. */
void exs__vrb_gc_put(struct vrb_gcache *gc, struct vrb_gc_entry *e);
/* parent is about to be deregistered: every entry over it is deregistered now (one in use,
 * which the caller's contract excludes, at its put). */
void exs__vrb_gc_drop(struct vrb_gcache *gc, const void *parent);
/* Deregister every unused entry (a registration failed: their pinned pages count against
 * the process's locked-memory limit). Returns how many. */
unsigned exs__vrb_gc_trim(struct vrb_gcache *gc);
/* The device went away: every unused entry deregistered, and nothing kept from now on. */
void exs__vrb_gc_close(struct vrb_gcache *gc);
void exs__vrb_gc_counters(struct vrb_gcache *gc, int on);

/* ---- queue pair cache ---- */
struct vrb_qpc_caps {
    uint32_t max_send_wr, max_recv_wr, max_inline, max_sge;
};

struct vrb_qpc_counters {
    uint64_t qp_cache_hits;
    uint64_t qp_cache_misses;
    uint64_t qp_cache_puts;      /* QPs taken back */
    uint64_t qp_cache_evictions; /* destroyed because the cache was full */
    uint64_t qp_cache_entries;
};

struct vrb_qpc_entry {
    struct exs_list link; /* newest first */
    void *qp;
    struct vrb_qpc_caps caps;
};

struct vrb_qpcache {
    pthread_mutex_t lock;
    struct exs_list list;
    unsigned max_entries; /* 0: caching off */
    void (*destroy)(void *arg, void *qp);
    void *arg;
    struct vrb_qpc_counters cnt;
    struct exs_counter_set cset;
    int registered;
};

void exs__vrb_qpc_init(struct vrb_qpcache *qc, unsigned max_entries,
                       void (*destroy)(void *arg, void *qp), void *arg);
/* Destroys every cached QP. */
void exs__vrb_qpc_fini(struct vrb_qpcache *qc);
/* A cached QP whose caps cover want (the smallest such), or NULL (a miss). */
void *exs__vrb_qpc_get(struct vrb_qpcache *qc, const struct vrb_qpc_caps *want,
                       struct vrb_qpc_caps *caps_p);
/* Destroy every cached QP and cache no more (the device went away): a later put destroys. */
void exs__vrb_qpc_close(struct vrb_qpcache *qc);
/* Keep qp (already in RESET) for reuse; the oldest is destroyed when the cache is full. */
void exs__vrb_qpc_put(struct vrb_qpcache *qc, void *qp, const struct vrb_qpc_caps *caps);

/* Register / unregister the counter sets of the caches ("prov.verbs.mcache", ...). */
void exs__vrb_cache_counters(struct vrb_mcache *mc, struct vrb_regcache *rc, struct vrb_qpcache *qc,
                             int on);

/* ---- completion queue budget ---- */
/* The ctx CQ holds every completion its eps can produce (spec/provider.md): reserving n more
 * entries in a CQ of cap entries, need of them reserved already, that can grow to max_cqe.
 * Returns 0 with *resize_p = 0 when it fits as it is, 0 with *resize_p = the size to resize
 * to (twice cap, at least need + n, at most max_cqe), or -ENOBUFS when need + n > max_cqe. */
int exs__vrb_cq_plan(uint64_t cap, uint64_t need, uint64_t n, uint64_t max_cqe, uint64_t *resize_p);

/* ---- QP attributes ---- */
/* The QP's local ACK timeout exponent (vrb_cqplan.c): the ep's own (ep_timeout), else
 * EXS_VRB_QP_TIMEOUT (param) when nonzero, else the one rdma_cm computed for the path
 * (cm_has: rdma_init_qp_attr set it; rsockets and perftest -R run with it) but at most
 * VRB_QP_TIMEOUT_CAP, else VRB_QP_TIMEOUT_FALLBACK. Never 0 (infinite: not offered). The
 * cap: a lost last packet waits for the timeout before it is resent, and that wait must stay
 * well inside keepalive's window (3 probes of 1 s by default): rxe's rdma_cm value, 19
 * (2.1 s), let keepalive end a verified transfer across a link with 1% loss. */
#define VRB_QP_TIMEOUT_FALLBACK 14 /* 4.096 us * 2^14: 67 ms */
#define VRB_QP_TIMEOUT_CAP      16 /* 268 ms */
uint8_t exs__vrb_qp_timeout(uint8_t ep_timeout, uint8_t param, int cm_has, uint8_t cm_timeout);

#endif
