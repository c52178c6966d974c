/* SPDX-License-Identifier: MIT */
/* Memory regions and grants of the shm provider: the key table and the copy fence of
 * exs/prov/soft/soft_keys.c under ctx->lock; the fence held across the chunks of one copy. */
#include <errno.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

int exs__shm_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    return exs__soft_mr_reg(&shm_ctx_of(c)->keys, c, addr, length, access, mr_p);
}

int exs__shm_mr_dereg(struct exs_prov_mr *m)
{
    if (!m)
        return -EINVAL;
    return exs__soft_mr_dereg(&shm_ctx_of(m->ctx)->keys, m);
}

/* ctx->lock: a grant is made on a connected ep only. */
static int shm_ep_ready_locked(struct exs_prov_ep *e)
{
    return shm_ep_of(e)->state == EXS_PROV_EP_CONNECTED;
}

int exs__shm_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p)
{
    struct shm_ep *ep = shm_ep_of(e);

    if (!ep || !m || m->ctx != e->ctx)
        return -EINVAL;
    return exs__soft_grant(&ep->ctx->keys, e, m, addr, length, access, shm_ep_ready_locked,
                           &ep->grants, grant_p);
}

void exs__shm_revoke(struct exs_prov_grant *grant)
{
    if (grant)
        exs__soft_revoke(&shm_ctx_of(grant->ep->ctx)->keys, grant);
}

void exs__shm_ep_revoke_all_locked(struct shm_ep *ep)
{
    exs__soft_revoke_all_locked(&ep->ctx->keys, &ep->grants);
}

int exs__shm_fence_remote(struct shm_ctx *ctx, struct shm_ep *ep, uint32_t rkey, uint64_t addr,
                          uint64_t len, unsigned access, struct exs_soft_key **key_p)
{
    struct exs_soft_key *k;

    exs__lite_lock(&ctx->lock);
    k = exs__soft_key_remote_locked(&ctx->keys, &ep->base, rkey, addr, len, access);
    if (k)
        exs__soft_fence_raise_locked(&ctx->keys, k);
    exs__lite_unlock(&ctx->lock);
    if (!k)
        return -EACCES;
    *key_p = k;
    return 0;
}

int exs__shm_fence_next(struct shm_ctx *ctx, struct exs_soft_key *k)
{
    int ret = 0;

    exs__lite_lock(&ctx->lock);
    /* the fence is still up over k, so k is still allocated: its kill waits for it */
    if (k->live) {
        exs__soft_fence_raise_locked(&ctx->keys, k); /* a new copy: a kill waits for it */
    } else {
        exs__soft_fence_lower_locked(&ctx->keys);
        ret = -EACCES;
    }
    exs__lite_unlock(&ctx->lock);
    return ret;
}

void exs__shm_fence_end(struct shm_ctx *ctx)
{
    exs__lite_lock(&ctx->lock);
    exs__soft_fence_lower_locked(&ctx->keys);
    exs__lite_unlock(&ctx->lock);
}

int exs__shm_fence_local(struct shm_ctx *ctx, const struct exs_prov_sge *sge, int n,
                         struct exs_soft_key **lkey, uint64_t *kills)
{
    int ret;

    exs__lite_lock(&ctx->lock);
    ret =
        exs__soft_fence_local_locked(&ctx->keys, sge, n, EXS_PROV_ACCESS_LOCAL_WRITE, lkey, kills);
    exs__lite_unlock(&ctx->lock);
    return ret;
}
