/* SPDX-License-Identifier: MIT */
/* Memory regions and grants of the tcp provider: the key table and the copy fence of
 * exs/prov/soft/soft_keys.c under mr_lock; the NIC's references of the keys it places
 * into or reads from. */
#include <errno.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

int exs__tcp_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    return exs__soft_mr_reg(&tcp_ctx_of(c)->keys, c, addr, length, access, mr_p);
}

/* Never waits for a peer: a WRITE being placed into the region is cut off (the rest
 * of its payload goes to a sink, the requester gets REM_ACCESS_ERR) and a READ
 * response not yet sent is answered with a NAK. */
int exs__tcp_mr_dereg(struct exs_prov_mr *m)
{
    if (!m)
        return -EINVAL;
    return exs__soft_mr_dereg(&tcp_ctx_of(m->ctx)->keys, m);
}

int exs__tcp_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    int state;

    if (!ep || !m || m->ctx != e->ctx)
        return -EINVAL;
    pthread_mutex_lock(&ep->lock);
    state = ep->state;
    pthread_mutex_unlock(&ep->lock);
    if (state != EXS_PROV_EP_CONNECTED)
        return -ENOTCONN;
    return exs__soft_grant(&ep->ctx->keys, e, m, addr, length, access, NULL, &ep->grants, grant_p);
}

void exs__tcp_revoke(struct exs_prov_grant *grant)
{
    if (grant)
        exs__soft_revoke(&tcp_ctx_of(grant->ep->ctx)->keys, grant);
}

/* ep_destroy: grants must be revoked before; any left is a consumer bug, logged and
 * revoked here (the consumer must not revoke it again). */
void exs__tcp_ep_revoke_all(struct tcp_ep *ep)
{
    struct tcp_ctx *ctx = ep->ctx;

    pthread_mutex_lock(&ctx->mr_lock);
    exs__soft_revoke_all_locked(&ctx->keys, &ep->grants);
    pthread_mutex_unlock(&ctx->mr_lock);
}

/* 0 when every sge of non-zero length lies in an mr of ctx with the access bits. */
int exs__tcp_mr_check_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                            unsigned access)
{
    int ret;

    pthread_mutex_lock(&ctx->mr_lock);
    ret = exs__soft_check_local_locked(&ctx->keys, sge, n, access);
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

/* NIC: a grant of ep (exact right, exact range) or an mr of the ctx (ctx-wide, as a
 * PD-wide verbs MR) covering the access. */
int exs__tcp_key_get_remote(struct tcp_ctx *ctx, struct tcp_ep *ep, uint32_t rkey, uint64_t addr,
                            uint64_t len, unsigned access, struct exs_soft_key **key_p)
{
    struct exs_soft_key *k;

    pthread_mutex_lock(&ctx->mr_lock);
    k = exs__soft_key_remote_locked(&ctx->keys, &ep->base, rkey, addr, len, access);
    if (k)
        k->users++;
    pthread_mutex_unlock(&ctx->mr_lock);
    if (!k)
        return -EACCES;
    *key_p = k;
    return 0;
}

void exs__tcp_key_put_locked(struct tcp_ctx *ctx, struct exs_soft_key *k)
{
    (void)ctx;
    exs__soft_key_put_locked(k);
}

void exs__tcp_key_put(struct tcp_ctx *ctx, struct exs_soft_key *k)
{
    pthread_mutex_lock(&ctx->mr_lock);
    exs__soft_key_put_locked(k);
    pthread_mutex_unlock(&ctx->mr_lock);
}

int exs__tcp_copy_begin(struct tcp_ctx *ctx, struct exs_soft_key *k)
{
    int ret = 0;

    pthread_mutex_lock(&ctx->mr_lock);
    if (k->live)
        exs__soft_fence_raise_locked(&ctx->keys, k);
    else
        ret = -EACCES;
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

void exs__tcp_copy_end(struct tcp_ctx *ctx)
{
    pthread_mutex_lock(&ctx->mr_lock);
    exs__soft_fence_lower_locked(&ctx->keys);
    pthread_mutex_unlock(&ctx->mr_lock);
}

int exs__tcp_copy_begin_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                              struct exs_soft_key **lkey, uint64_t *kills)
{
    int ret;

    pthread_mutex_lock(&ctx->mr_lock);
    ret =
        exs__soft_fence_local_locked(&ctx->keys, sge, n, EXS_PROV_ACCESS_LOCAL_WRITE, lkey, kills);
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}
