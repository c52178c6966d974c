/* SPDX-License-Identifier: MIT */
/* The key table of the software providers (tcp, shm): random keys for regions and grants,
 * the local and remote checks, the copy fence (soft_keys.h). */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "exs/util/lite_lock.h"
#include "exs/prov/soft/soft_keys.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

void exs__soft_keys_init(struct exs_soft_keys *t, pthread_mutex_t *lock)
{
    t->lock = lock;
    t->lite = NULL;
    t->last_local = NULL;
    t->last_remote = NULL;
    pthread_cond_init(&t->copy_cond, NULL);
    for (int i = 0; i < EXS_SOFT_KEY_HASH; i++)
        exs_list_init(&t->hash[i]);
}

void exs__soft_keys_init_lite(struct exs_soft_keys *t, struct exs_lite_lock *lite)
{
    exs__soft_keys_init(t, NULL);
    t->lite = lite;
}

void exs__soft_keys_lock(struct exs_soft_keys *t)
{
    if (t->lite)
        exs__lite_lock(t->lite);
    else
        pthread_mutex_lock(t->lock);
}

void exs__soft_keys_unlock(struct exs_soft_keys *t)
{
    if (t->lite)
        exs__lite_unlock(t->lite);
    else
        pthread_mutex_unlock(t->lock);
}

/* Locked: sleep until a copy ends (the lock let go meanwhile, taken again; the caller
 * looks at the fence again). A futex lock has no condition variable: the waiter sleeps on
 * copy_ends as it was under the lock, which exs__soft_fence_lower_locked moves. */
static void soft_copy_wait(struct exs_soft_keys *t)
{
    uint32_t seen;

    if (!t->lite) {
        int cs = exs__nc_begin(); /* a cancellation point, with the lock: off */

        pthread_cond_wait(&t->copy_cond, t->lock); /* nocancel: ok (off) */
        exs__nc_end(cs);
        return;
    }
    seen = __atomic_load_n(&t->copy_ends, __ATOMIC_RELAXED);
    exs__lite_unlock(t->lite);
    syscall(SYS_futex, &t->copy_ends, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    exs__lite_lock(t->lite);
}

void exs__soft_keys_fini(struct exs_soft_keys *t)
{
    while (t->grant_cache) {
        struct exs_soft_grant *g = t->grant_cache;

        t->grant_cache = (struct exs_soft_grant *)(void *)g->key.link.next;
        free(g);
    }
    t->grant_cached = 0;
    pthread_cond_destroy(&t->copy_cond);
}

/* Locked: a revoked grant's block, kept for the next grant or freed. */
static void soft_grant_recycle_locked(struct exs_soft_keys *t, struct exs_soft_grant *g)
{
    if (t->grant_cached >= EXS_SOFT_GRANT_CACHE) {
        free(g);
        return;
    }
    g->key.link.next = (struct exs_list *)(void *)t->grant_cache;
    t->grant_cache = g;
    t->grant_cached++;
}

static struct exs_list *soft_bucket(struct exs_soft_keys *t, uint32_t key)
{
    return &t->hash[key % EXS_SOFT_KEY_HASH];
}

/* The live key numbered key, or NULL. */
static struct exs_soft_key *soft_key_find(struct exs_soft_keys *t, uint32_t key)
{
    struct exs_list *pos, *b = soft_bucket(t, key);

    exs_list_for_each(pos, b)
    {
        struct exs_soft_key *k = exs_list_entry(pos, struct exs_soft_key, link);

        if (k->key == key)
            return k;
    }
    return NULL;
}

/* splitmix64: only when getrandom fails (seeded from the clock and the pid). */
static uint64_t soft_key_prng(struct exs_soft_keys *t)
{
    uint64_t z;

    if (!t->prng) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        t->prng = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16) ^
                  (uint64_t)(uintptr_t)t;
    }
    z = (t->prng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A random key, never 0, not used by a live key of the table. The pool is refilled from
 * getrandom (the kernel's CSPRNG), 64 keys per call. */
static uint32_t soft_key_new(struct exs_soft_keys *t)
{
    uint32_t key;

    do {
        if (!t->pool_n) {
            ssize_t n = getrandom(t->pool, sizeof(t->pool), GRND_NONBLOCK);

            if (n != (ssize_t)sizeof(t->pool)) {
                static int warned;

                if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                    EXS_WARN(PROV, "getrandom: %s; keys from a seeded generator",
                             n < 0 ? "failed" : "short");
                for (unsigned i = 0; i < EXS_ARRAY_SIZE(t->pool); i++)
                    t->pool[i] = (uint32_t)(soft_key_prng(t) >> 16);
            }
            t->pool_n = EXS_ARRAY_SIZE(t->pool);
        }
        key = t->pool[--t->pool_n];
    } while (key == 0 || soft_key_find(t, key));
    return key;
}

/* Make k live under a fresh key. */
static void soft_key_insert(struct exs_soft_keys *t, struct exs_soft_key *k)
{
    k->key = soft_key_new(t);
    k->live = 1;
    exs_list_add_tail(soft_bucket(t, k->key), &k->link);
}

static void soft_key_free(struct exs_soft_key *k)
{
    if (k->ep)
        free(exs_container_of(k, struct exs_soft_grant, key));
    else
        free(exs_container_of(k, struct exs_soft_mr, key));
}

/* No peer byte reaches k's memory once this returns. Waits only for the copy running at
 * this instant into or out of k's memory (bounded: one non-blocking socket call, or one
 * process_vm call of at most a chunk); a copy of other memory is not waited for. 1 when
 * the caller frees k's owner now, 0 when NIC references remain (the last put frees it). */
static int soft_key_kill(struct exs_soft_keys *t, struct exs_soft_key *k)
{
    uint64_t gen = t->copy_gen;

    k->live = 0;
    exs_list_del(&k->link);
    if (!k->ep) /* every remembered local check is looked at again */
        __atomic_store_n(&t->region_kills, t->region_kills + 1, __ATOMIC_RELEASE);
    if (t->last_local == k)
        t->last_local = NULL;
    if (t->last_remote == k)
        t->last_remote = NULL;
    while (t->copying && t->copy_gen == gen && (!t->copy_key || t->copy_key == k)) {
        t->copy_waiters++;
        soft_copy_wait(t);
        t->copy_waiters--;
    }
    if (k->users) {
        k->orphan = 1;
        return 0;
    }
    return 1;
}

int exs__soft_mr_reg(struct exs_soft_keys *t, struct exs_prov_ctx *ctx, void *addr, size_t length,
                     unsigned access, struct exs_prov_mr **mr_p)
{
    unsigned all =
        EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE | EXS_PROV_ACCESS_REMOTE_READ;
    struct exs_soft_mr *mr;

    if ((access & ~all) || (!addr && length) ||
        (uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr)
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->base.ctx = ctx;
    mr->base.addr = addr;
    mr->base.length = length;
    mr->base.access = access;
    mr->key.addr = (uint64_t)(uintptr_t)addr;
    mr->key.length = length;
    mr->key.access = access;
    exs__soft_keys_lock(t);
    soft_key_insert(t, &mr->key);
    mr->base.lkey = mr->key.key;
    mr->base.rkey = mr->key.key;
    exs__soft_keys_unlock(t);
    EXS_DBG(PROV, "mr %p: registered %p+%zu key 0x%x access 0x%x", (void *)mr, addr, length,
            mr->key.key, access);
    *mr_p = &mr->base;
    return 0;
}

int exs__soft_mr_dereg(struct exs_soft_keys *t, struct exs_prov_mr *m)
{
    struct exs_soft_mr *mr = (struct exs_soft_mr *)m;
    int now;

    exs__soft_keys_lock(t);
    if (!mr->key.live) {
        exs__soft_keys_unlock(t);
        return -EINVAL;
    }
    if (mr->grants) {
        /* as verbs with memory windows bound to the region */
        exs__soft_keys_unlock(t);
        EXS_ERR(PROV, "mr %p: dereg with %u live grants", (void *)mr, mr->grants);
        return -EBUSY;
    }
    now = soft_key_kill(t, &mr->key);
    exs__soft_keys_unlock(t);
    EXS_DBG(PROV, "mr %p: deregistered key 0x%x", (void *)mr, mr->key.key);
    if (now)
        free(mr);
    return 0;
}

int exs__soft_grant(struct exs_soft_keys *t, struct exs_prov_ep *ep, struct exs_prov_mr *m,
                    void *addr, size_t length, unsigned access,
                    int (*ready_locked)(struct exs_prov_ep *ep), struct exs_list *ep_grants,
                    struct exs_prov_grant **grant_p)
{
    struct exs_soft_mr *mr = (struct exs_soft_mr *)m;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    struct exs_soft_grant *g;
    int ret = 0;

    if ((access != EXS_PROV_ACCESS_REMOTE_WRITE && access != EXS_PROV_ACCESS_REMOTE_READ) ||
        !length || !(mr->base.access & EXS_PROV_ACCESS_LOCAL_WRITE) ||
        !exs__soft_range_in(mr->key.addr, mr->key.length, a, length))
        return -EINVAL;
    /* a cached block under the lock, or calloc without it */
    exs__soft_keys_lock(t);
    g = t->grant_cache;
    if (g) {
        t->grant_cache = (struct exs_soft_grant *)(void *)g->key.link.next;
        t->grant_cached--;
        memset(g, 0, sizeof(*g));
    } else {
        exs__soft_keys_unlock(t);
        g = calloc(1, sizeof(*g));
        if (!g)
            return -ENOMEM;
        exs__soft_keys_lock(t);
    }
    exs__prov_grant_init(&g->base, ep, m, a, length, access);
    g->key.addr = a;
    g->key.length = length;
    g->key.access = access;
    g->key.ep = ep;
    g->mr = mr;
    if (ready_locked && !ready_locked(ep))
        ret = -ENOTCONN;
    else if (!mr->key.live)
        ret = -EINVAL;
    if (ret) {
        soft_grant_recycle_locked(t, g);
        exs__soft_keys_unlock(t);
        return ret;
    }
    soft_key_insert(t, &g->key);
    g->base.rkey = g->key.key;
    mr->grants++;
    exs_list_add_tail(ep_grants, &g->ep_link);
    exs__soft_keys_unlock(t);
    EXS_TRACE(PROV, "ep %p: grant %p 0x%llx+%zu access 0x%x key 0x%x", (void *)ep, (void *)g,
              (unsigned long long)a, length, access, g->key.key);
    *grant_p = &g->base;
    return 0;
}

/* End g; 1 when the caller frees it now. */
static int soft_grant_end(struct exs_soft_keys *t, struct exs_soft_grant *g)
{
    int now = soft_key_kill(t, &g->key);

    exs_list_del(&g->ep_link);
    g->mr->grants--;
    return now;
}

void exs__soft_revoke(struct exs_soft_keys *t, struct exs_prov_grant *grant)
{
    struct exs_soft_grant *g = (struct exs_soft_grant *)grant;
    int now;

    struct exs_prov_ep *ep = g->key.ep;
    uint32_t key = g->key.key;

    exs__soft_keys_lock(t);
    EXS_ASSERT(g->key.live);
    now = soft_grant_end(t, g);
    if (now)
        soft_grant_recycle_locked(t, g); /* (orphaned: the last NIC reference frees it) */
    exs__soft_keys_unlock(t);
    EXS_TRACE(PROV, "ep %p: revoked grant %p key 0x%x", (void *)ep, (void *)g, key);
}

void exs__soft_revoke_all_locked(struct exs_soft_keys *t, struct exs_list *ep_grants)
{
    struct exs_list *l;

    while ((l = ep_grants->next) != ep_grants) {
        struct exs_soft_grant *g = exs_list_entry(l, struct exs_soft_grant, ep_link);

        EXS_ERR(PROV, "ep %p: destroyed with grant %p (key 0x%x) not revoked", (void *)g->key.ep,
                (void *)g, g->key.key);
        if (soft_grant_end(t, g))
            free(g);
    }
}

int exs__soft_check_local_slow_locked(struct exs_soft_keys *t, const struct exs_prov_sge *sge,
                                      int n, unsigned access)
{
    for (int i = 0; i < n; i++) {
        struct exs_soft_key *k;

        if (!sge[i].length)
            continue;
        k = soft_key_find(t, sge[i].lkey);
        if (!k || k->ep || !exs__soft_range_in(k->addr, k->length, sge[i].addr, sge[i].length) ||
            (k->access & access) != access)
            return -EACCES;
        t->last_local = k;
    }
    return 0;
}

int exs__soft_check_local_memo_slow_locked(struct exs_soft_keys *t, struct exs_soft_local_memo *m,
                                           const struct exs_prov_sge *sge, int n, unsigned access)
{
    const struct exs_soft_key *k;
    int ret = exs__soft_check_local_locked(t, sge, n, access);

    /* last_local: NULL or a live region (the one that passed the sge, when n is 1) */
    k = t->last_local;
    if (!ret && k) {
        m->addr = k->addr;
        m->length = k->length;
        m->key = k->key;
        m->access = k->access;
        m->kills = t->region_kills;
    }
    return ret;
}

struct exs_soft_key *exs__soft_key_find_locked(struct exs_soft_keys *t, uint32_t rkey)
{
    return soft_key_find(t, rkey);
}

void exs__soft_fence_raise_locked(struct exs_soft_keys *t, struct exs_soft_key *k)
{
    t->copying = 1;
    t->copy_gen++;
    t->copy_key = k;
}

int exs__soft_fence_local_locked(struct exs_soft_keys *t, const struct exs_prov_sge *sge, int n,
                                 unsigned access, struct exs_soft_key **lkey, uint64_t *kills)
{
    if (*kills != t->region_kills) {
        /* first copy, or a region died since: every sge looked up again */
        uint32_t one = 0;
        int ret = exs__soft_check_local_locked(t, sge, n, access);

        if (ret)
            return ret;
        /* one region (a region's key is its lkey): the one last_local holds now */
        *lkey = (struct exs_soft_key *)(uintptr_t)t->last_local;
        for (int i = 0; i < n && *lkey; i++) {
            if (!sge[i].length)
                continue;
            if (one && sge[i].lkey != one)
                *lkey = NULL; /* several: the fence covers any key */
            one = sge[i].lkey;
        }
        *kills = t->region_kills;
    }
    exs__soft_fence_raise_locked(t, *lkey);
    return 0;
}

void exs__soft_fence_lower_locked(struct exs_soft_keys *t)
{
    t->copying = 0;
    t->copy_key = NULL;
    if (t->copy_waiters && t->lite) {
        __atomic_store_n(&t->copy_ends, t->copy_ends + 1, __ATOMIC_RELAXED);
        syscall(SYS_futex, &t->copy_ends, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    } else if (t->copy_waiters) {
        pthread_cond_broadcast(&t->copy_cond);
    }
}

void exs__soft_key_put_locked(struct exs_soft_key *k)
{
    EXS_ASSERT(k->users > 0);
    if (--k->users == 0 && k->orphan)
        soft_key_free(k);
}
