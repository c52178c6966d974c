/* SPDX-License-Identifier: MIT */
/* Memory regions and grants of the shm provider: random keys, local and remote checks, the copy
 * fence that revoke and mr_dereg wait for. */
#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

static struct exs_list *shm_bucket(struct shm_ctx *ctx, uint32_t key)
{
    return &ctx->mr_hash[key % SHM_MR_HASH];
}

static struct shm_key *shm_key_find(struct shm_ctx *ctx, uint32_t key)
{
    struct exs_list *pos, *b = shm_bucket(ctx, key);

    exs_list_for_each(pos, b)
    {
        struct shm_key *k = exs_list_entry(pos, struct shm_key, link);

        if (k->key == key)
            return k;
    }
    return NULL;
}

/* [addr, addr+len) inside [base, base+length), without overflow. */
static int shm_range_in(uint64_t base, uint64_t length, uint64_t addr, uint64_t len)
{
    return addr >= base && len <= length && addr - base <= length - len;
}

/* ctx->lock: a random key, never 0 and not live in ctx (getrandom, else the clock). */
static uint32_t shm_key_new_locked(struct shm_ctx *ctx)
{
    uint32_t key;

    do {
        if (!ctx->key_pool_n) {
            ssize_t n = getrandom(ctx->key_pool, sizeof(ctx->key_pool), GRND_NONBLOCK);

            if (n != (ssize_t)sizeof(ctx->key_pool)) {
                uint64_t z = exs__now_ns() ^ ((uint64_t)getpid() << 20) ^ (uintptr_t)ctx;

                for (unsigned i = 0; i < EXS_ARRAY_SIZE(ctx->key_pool); i++) {
                    z += 0x9E3779B97F4A7C15ull;
                    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
                    ctx->key_pool[i] = (uint32_t)((z ^ (z >> 27)) >> 16);
                }
            }
            ctx->key_pool_n = EXS_ARRAY_SIZE(ctx->key_pool);
        }
        key = ctx->key_pool[--ctx->key_pool_n];
    } while (key == 0 || shm_key_find(ctx, key));
    return key;
}

static void shm_key_insert_locked(struct shm_ctx *ctx, struct shm_key *k)
{
    k->key = shm_key_new_locked(ctx);
    k->live = 1;
    exs_list_add_tail(shm_bucket(ctx, k->key), &k->link);
}

/* ctx->lock: no peer byte reaches k's memory once this returns; waits only for the one
 * copy into or out of k running at this instant (at most SHM_COPY_CHUNK bytes). */
static void shm_key_kill_locked(struct shm_ctx *ctx, struct shm_key *k)
{
    uint64_t gen = ctx->copy_gen;

    k->live = 0;
    exs_list_del(&k->link);
    while (ctx->copying && ctx->copy_gen == gen && ctx->copy_key == k) {
        ctx->copy_waiters++;
        pthread_cond_wait(&ctx->copy_cond, &ctx->lock);
        ctx->copy_waiters--;
    }
}

int exs__shm_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    unsigned all =
        EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE | EXS_PROV_ACCESS_REMOTE_READ;
    struct shm_mr *mr;

    if ((access & ~all) || (!addr && length) ||
        (uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr)
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->base.ctx = c;
    mr->base.addr = addr;
    mr->base.length = length;
    mr->base.access = access;
    mr->key.addr = (uint64_t)(uintptr_t)addr;
    mr->key.length = length;
    mr->key.access = access;
    pthread_mutex_lock(&ctx->lock);
    shm_key_insert_locked(ctx, &mr->key);
    mr->base.lkey = mr->key.key;
    mr->base.rkey = mr->key.key;
    pthread_mutex_unlock(&ctx->lock);
    *mr_p = &mr->base;
    return 0;
}

int exs__shm_mr_dereg(struct exs_prov_mr *m)
{
    struct shm_mr *mr = (struct shm_mr *)m;
    struct shm_ctx *ctx;

    if (!mr)
        return -EINVAL;
    ctx = shm_ctx_of(mr->base.ctx);
    pthread_mutex_lock(&ctx->lock);
    if (!mr->key.live) {
        pthread_mutex_unlock(&ctx->lock);
        return -EINVAL;
    }
    if (mr->grants) {
        pthread_mutex_unlock(&ctx->lock);
        EXS_ERR(PROV, "mr %p: dereg with %u live grants", (void *)mr, mr->grants);
        return -EBUSY;
    }
    shm_key_kill_locked(ctx, &mr->key);
    pthread_mutex_unlock(&ctx->lock);
    free(mr);
    return 0;
}

int exs__shm_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_mr *mr = (struct shm_mr *)m;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    struct shm_ctx *ctx;
    struct shm_grant *g;

    if (!ep || !mr || mr->base.ctx != e->ctx)
        return -EINVAL;
    ctx = ep->ctx;
    if ((access != EXS_PROV_ACCESS_REMOTE_WRITE && access != EXS_PROV_ACCESS_REMOTE_READ) ||
        !length || !(mr->base.access & EXS_PROV_ACCESS_LOCAL_WRITE) ||
        !shm_range_in(mr->key.addr, mr->key.length, a, length))
        return -EINVAL;
    g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    exs__prov_grant_init(&g->base, e, m, a, length, access);
    g->key.addr = a;
    g->key.length = length;
    g->key.access = access;
    g->key.ep = ep;
    g->mr = mr;
    pthread_mutex_lock(&ctx->lock);
    if (ep->state != EXS_PROV_EP_CONNECTED || !mr->key.live) {
        int ret = ep->state != EXS_PROV_EP_CONNECTED ? -ENOTCONN : -EINVAL;

        pthread_mutex_unlock(&ctx->lock);
        free(g);
        return ret;
    }
    shm_key_insert_locked(ctx, &g->key);
    g->base.rkey = g->key.key;
    mr->grants++;
    exs_list_add_tail(&ep->grants, &g->ep_link);
    pthread_mutex_unlock(&ctx->lock);
    *grant_p = &g->base;
    return 0;
}

static void shm_grant_end_locked(struct shm_ctx *ctx, struct shm_grant *g)
{
    shm_key_kill_locked(ctx, &g->key);
    exs_list_del(&g->ep_link);
    g->mr->grants--;
}

void exs__shm_revoke(struct exs_prov_grant *grant)
{
    struct shm_grant *g = (struct shm_grant *)grant;
    struct shm_ctx *ctx;

    if (!g)
        return;
    ctx = g->key.ep->ctx;
    pthread_mutex_lock(&ctx->lock);
    EXS_ASSERT(g->key.live);
    shm_grant_end_locked(ctx, g);
    pthread_mutex_unlock(&ctx->lock);
    free(g);
}

void exs__shm_ep_revoke_all_locked(struct shm_ep *ep)
{
    struct exs_list *l;

    while ((l = ep->grants.next) != &ep->grants) {
        struct shm_grant *g = exs_list_entry(l, struct shm_grant, ep_link);

        EXS_ERR(PROV, "ep %p: destroyed with grant %p (key 0x%x) not revoked", (void *)ep,
                (void *)g, g->key.key);
        shm_grant_end_locked(ep->ctx, g);
        free(g);
    }
}

int exs__shm_check_local_locked(struct shm_ctx *ctx, const struct exs_prov_sge *sge, int n,
                                unsigned access)
{
    for (int i = 0; i < n; i++) {
        struct shm_key *k;

        if (!sge[i].length)
            continue;
        k = shm_key_find(ctx, sge[i].lkey);
        if (!k || k->ep || !shm_range_in(k->addr, k->length, sge[i].addr, sge[i].length) ||
            (k->access & access) != access)
            return -EACCES;
    }
    return 0;
}

static void shm_fence_raise_locked(struct shm_ctx *ctx, struct shm_key *k)
{
    ctx->copying = 1;
    ctx->copy_gen++;
    ctx->copy_key = k;
}

int exs__shm_fence_remote(struct shm_ctx *ctx, struct shm_ep *ep, uint32_t rkey, uint64_t addr,
                          uint64_t len, unsigned access, struct shm_key **key_p)
{
    struct shm_key *k;
    int ret = -EACCES;

    pthread_mutex_lock(&ctx->lock);
    k = shm_key_find(ctx, rkey);
    if (k && (k->ep ? k->ep == ep && k->access == access : (k->access & access) == access) &&
        shm_range_in(k->addr, k->length, addr, len)) {
        shm_fence_raise_locked(ctx, k);
        *key_p = k;
        ret = 0;
    }
    pthread_mutex_unlock(&ctx->lock);
    return ret;
}

int exs__shm_fence_next(struct shm_ctx *ctx, struct shm_key *k)
{
    int ret = 0;

    pthread_mutex_lock(&ctx->lock);
    /* the fence is still up over k, so k is still allocated: its kill waits for it */
    if (k->live) {
        ctx->copy_gen++;
    } else {
        ctx->copying = 0;
        ctx->copy_key = NULL;
        if (ctx->copy_waiters)
            pthread_cond_broadcast(&ctx->copy_cond);
        ret = -EACCES;
    }
    pthread_mutex_unlock(&ctx->lock);
    return ret;
}

void exs__shm_fence_end(struct shm_ctx *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    ctx->copying = 0;
    ctx->copy_key = NULL;
    if (ctx->copy_waiters)
        pthread_cond_broadcast(&ctx->copy_cond);
    pthread_mutex_unlock(&ctx->lock);
}
