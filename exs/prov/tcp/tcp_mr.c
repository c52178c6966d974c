/* SPDX-License-Identifier: MIT */
/* Memory regions and grants of the tcp provider: random keys, local and remote checks, the copy
 * fence. */
#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

static struct exs_list *tcp_mr_bucket(struct tcp_ctx *ctx, uint32_t key)
{
    return &ctx->mr_hash[key % TCP_MR_HASH];
}

/* Under mr_lock: the live key (mr or grant) numbered key, or NULL. */
static struct tcp_key *tcp_key_find(struct tcp_ctx *ctx, uint32_t key)
{
    struct exs_list *pos, *b = tcp_mr_bucket(ctx, key);

    exs_list_for_each(pos, b)
    {
        struct tcp_key *k = exs_list_entry(pos, struct tcp_key, link);

        if (k->key == key)
            return k;
    }
    return NULL;
}

/* [addr, addr+len) inside [base, base+length), without overflow. */
static int tcp_range_in(uint64_t base, uint64_t length, uint64_t addr, uint64_t len)
{
    return addr >= base && len <= length && addr - base <= length - len;
}

/* splitmix64: only when getrandom fails (seeded from the clock and the pid). */
static uint64_t tcp_key_prng(struct tcp_ctx *ctx)
{
    uint64_t z;

    if (!ctx->key_prng) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ctx->key_prng = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
                        ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)ctx;
    }
    z = (ctx->key_prng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Under mr_lock: a random key, never 0, not used by a live key of the ctx. The
 * pool is refilled from getrandom (the kernel's CSPRNG), 64 keys per call. */
static uint32_t tcp_key_new_locked(struct tcp_ctx *ctx)
{
    uint32_t key;

    do {
        if (!ctx->key_pool_n) {
            ssize_t n = getrandom(ctx->key_pool, sizeof(ctx->key_pool), GRND_NONBLOCK);

            if (n != (ssize_t)sizeof(ctx->key_pool)) {
                static int warned;

                if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                    EXS_WARN(PROV, "getrandom: %s; keys from a seeded generator",
                             n < 0 ? "failed" : "short");
                for (unsigned i = 0; i < EXS_ARRAY_SIZE(ctx->key_pool); i++)
                    ctx->key_pool[i] = (uint32_t)(tcp_key_prng(ctx) >> 16);
            }
            ctx->key_pool_n = EXS_ARRAY_SIZE(ctx->key_pool);
        }
        key = ctx->key_pool[--ctx->key_pool_n];
    } while (key == 0 || tcp_key_find(ctx, key));
    return key;
}

/* Under mr_lock: make k live under a fresh key. */
static void tcp_key_insert_locked(struct tcp_ctx *ctx, struct tcp_key *k)
{
    k->key = tcp_key_new_locked(ctx);
    k->live = 1;
    exs_list_add_tail(tcp_mr_bucket(ctx, k->key), &k->link);
}

/* Under mr_lock: no peer byte reaches k's memory once this returns. Waits only for
 * the copy running at this instant into k's memory (bounded: one non-blocking readv or
 * sendmsg); a WRITE being placed into other memory is not waited for. */
static void tcp_key_kill_locked(struct tcp_ctx *ctx, struct tcp_key *k)
{
    uint64_t gen = ctx->copy_gen;

    k->live = 0;
    exs_list_del(&k->link);
    while (ctx->copying && ctx->copy_gen == gen && (!ctx->copy_key || ctx->copy_key == k)) {
        ctx->copy_waiters++;
        pthread_cond_wait(&ctx->copy_cond, &ctx->mr_lock);
        ctx->copy_waiters--;
    }
}

/* Under mr_lock, after tcp_key_kill_locked: 1 when the caller frees the owner now,
 * 0 when NIC references remain (the last exs__tcp_key_put frees it). */
static int tcp_key_release_locked(struct tcp_key *k)
{
    if (k->users) {
        k->orphan = 1;
        return 0;
    }
    return 1;
}

static void tcp_key_free(struct tcp_key *k)
{
    if (k->ep)
        free(exs_container_of(k, struct tcp_grant, key));
    else
        free(exs_container_of(k, struct tcp_mr, key));
}

int exs__tcp_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    unsigned all =
        EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE | EXS_PROV_ACCESS_REMOTE_READ;
    struct tcp_mr *mr;

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
    pthread_mutex_lock(&ctx->mr_lock);
    tcp_key_insert_locked(ctx, &mr->key);
    mr->base.lkey = mr->key.key;
    mr->base.rkey = mr->key.key;
    pthread_mutex_unlock(&ctx->mr_lock);
    EXS_DBG(PROV, "mr %p: registered %p+%zu key 0x%x access 0x%x", (void *)mr, addr, length,
            mr->key.key, access);
    *mr_p = &mr->base;
    return 0;
}

/* Never waits for a peer: a WRITE being placed into the region is cut off (the rest
 * of its payload goes to a sink, the requester gets REM_ACCESS_ERR) and a READ
 * response not yet sent is answered with a NAK. */
int exs__tcp_mr_dereg(struct exs_prov_mr *m)
{
    struct tcp_mr *mr = (struct tcp_mr *)m;
    struct tcp_ctx *ctx;
    int now;

    if (!mr)
        return -EINVAL;
    ctx = tcp_ctx_of(mr->base.ctx);
    pthread_mutex_lock(&ctx->mr_lock);
    if (!mr->key.live) {
        pthread_mutex_unlock(&ctx->mr_lock);
        return -EINVAL;
    }
    if (mr->grants) {
        /* as verbs with memory windows bound to the region */
        pthread_mutex_unlock(&ctx->mr_lock);
        EXS_ERR(PROV, "mr %p: dereg with %u live grants", (void *)mr, mr->grants);
        return -EBUSY;
    }
    tcp_key_kill_locked(ctx, &mr->key);
    now = tcp_key_release_locked(&mr->key);
    pthread_mutex_unlock(&ctx->mr_lock);
    EXS_DBG(PROV, "mr %p: deregistered key 0x%x", (void *)mr, mr->key.key);
    if (now)
        free(mr);
    return 0;
}

int exs__tcp_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_mr *mr = (struct tcp_mr *)m;
    struct tcp_ctx *ctx;
    struct tcp_grant *g;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    int state;

    if (!ep || !mr || mr->base.ctx != e->ctx)
        return -EINVAL;
    ctx = ep->ctx;
    if ((access != EXS_PROV_ACCESS_REMOTE_WRITE && access != EXS_PROV_ACCESS_REMOTE_READ) ||
        !length || !(mr->base.access & EXS_PROV_ACCESS_LOCAL_WRITE) ||
        !tcp_range_in(mr->key.addr, mr->key.length, a, length))
        return -EINVAL;
    pthread_mutex_lock(&ep->lock);
    state = ep->state;
    pthread_mutex_unlock(&ep->lock);
    if (state != EXS_PROV_EP_CONNECTED)
        return -ENOTCONN;
    g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    exs__prov_grant_init(&g->base, e, m, a, length, access);
    g->key.addr = a;
    g->key.length = length;
    g->key.access = access;
    g->key.ep = ep;
    g->mr = mr;
    pthread_mutex_lock(&ctx->mr_lock);
    if (!mr->key.live) {
        pthread_mutex_unlock(&ctx->mr_lock);
        free(g);
        return -EINVAL;
    }
    tcp_key_insert_locked(ctx, &g->key);
    g->base.rkey = g->key.key;
    mr->grants++;
    exs_list_add_tail(&ep->grants, &g->ep_link);
    pthread_mutex_unlock(&ctx->mr_lock);
    EXS_TRACE(PROV, "ep %p: grant %p 0x%llx+%zu access 0x%x key 0x%x", (void *)ep, (void *)g,
              (unsigned long long)a, length, access, g->key.key);
    *grant_p = &g->base;
    return 0;
}

/* Under mr_lock: end g; 1 when the caller frees it now. */
static int tcp_grant_end_locked(struct tcp_ctx *ctx, struct tcp_grant *g)
{
    tcp_key_kill_locked(ctx, &g->key);
    exs_list_del(&g->ep_link);
    g->mr->grants--;
    return tcp_key_release_locked(&g->key);
}

void exs__tcp_revoke(struct exs_prov_grant *grant)
{
    struct tcp_grant *g = (struct tcp_grant *)grant;
    struct tcp_ctx *ctx;
    int now;

    if (!g)
        return;
    ctx = g->key.ep->ctx;
    pthread_mutex_lock(&ctx->mr_lock);
    EXS_ASSERT(g->key.live);
    now = tcp_grant_end_locked(ctx, g);
    pthread_mutex_unlock(&ctx->mr_lock);
    EXS_TRACE(PROV, "ep %p: revoked grant %p key 0x%x", (void *)g->key.ep, (void *)g, g->key.key);
    if (now)
        free(g);
}

/* ep_destroy: grants must be revoked before; any left is a consumer bug, logged and
 * revoked here (the consumer must not revoke it again). */
void exs__tcp_ep_revoke_all(struct tcp_ep *ep)
{
    struct tcp_ctx *ctx = ep->ctx;
    struct exs_list *l;

    pthread_mutex_lock(&ctx->mr_lock);
    while ((l = ep->grants.next) != &ep->grants) {
        struct tcp_grant *g = exs_list_entry(l, struct tcp_grant, ep_link);

        EXS_ERR(PROV, "ep %p: destroyed with grant %p (key 0x%x) not revoked", (void *)ep,
                (void *)g, g->key.key);
        if (tcp_grant_end_locked(ctx, g))
            free(g);
    }
    pthread_mutex_unlock(&ctx->mr_lock);
}

/* 0 when every sge of non-zero length lies in an mr of ctx with the access bits. */
int exs__tcp_mr_check_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                            unsigned access)
{
    int ret = 0;

    pthread_mutex_lock(&ctx->mr_lock);
    for (int i = 0; i < n && !ret; i++) {
        struct tcp_key *k;

        if (!sge[i].length)
            continue;
        k = tcp_key_find(ctx, sge[i].lkey);
        if (!k || k->ep || !tcp_range_in(k->addr, k->length, sge[i].addr, sge[i].length) ||
            (k->access & access) != access)
            ret = -EACCES;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

/* NIC: a grant of ep (exact right, exact range) or an mr of the ctx (ctx-wide, as a
 * PD-wide verbs MR) covering the access. */
int exs__tcp_key_get_remote(struct tcp_ctx *ctx, struct tcp_ep *ep, uint32_t rkey, uint64_t addr,
                            uint64_t len, unsigned access, struct tcp_key **key_p)
{
    struct tcp_key *k;
    int ret = -EACCES;

    pthread_mutex_lock(&ctx->mr_lock);
    k = tcp_key_find(ctx, rkey);
    if (k && (k->ep ? k->ep == ep && k->access == access : (k->access & access) == access) &&
        tcp_range_in(k->addr, k->length, addr, len)) {
        k->users++;
        *key_p = k;
        ret = 0;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

void exs__tcp_key_put_locked(struct tcp_ctx *ctx, struct tcp_key *k)
{
    (void)ctx;
    EXS_ASSERT(k->users > 0);
    if (--k->users == 0 && k->orphan)
        tcp_key_free(k);
}

void exs__tcp_key_put(struct tcp_ctx *ctx, struct tcp_key *k)
{
    pthread_mutex_lock(&ctx->mr_lock);
    exs__tcp_key_put_locked(ctx, k);
    pthread_mutex_unlock(&ctx->mr_lock);
}

int exs__tcp_copy_begin(struct tcp_ctx *ctx, struct tcp_key *k)
{
    int ret = 0;

    pthread_mutex_lock(&ctx->mr_lock);
    if (k->live) {
        ctx->copying = 1;
        ctx->copy_gen++;
        ctx->copy_key = k;
    } else {
        ret = -EACCES;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

void exs__tcp_copy_end(struct tcp_ctx *ctx)
{
    pthread_mutex_lock(&ctx->mr_lock);
    ctx->copying = 0;
    if (ctx->copy_waiters)
        pthread_cond_broadcast(&ctx->copy_cond);
    pthread_mutex_unlock(&ctx->mr_lock);
}
