/* SPDX-License-Identifier: MIT */
/* Verbs provider memory registration: ibv_reg_mr on the ctx's PD, and the registration
 * callbacks of the memory and registration caches. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"

struct vrb_mr {
    struct exs_prov_mr base;
    struct ibv_mr *mr;
    struct exs_list link; /* ctx->mr_hash */
};

int exs__vrb_mr_covers(struct vrb_ctx *ctx, const struct exs_prov_sge *sge, int n, int need_lw)
{
    int ok = 1;

    pthread_rwlock_rdlock(&ctx->mr_lock);
    for (int i = 0; i < n && ok; i++) {
        struct exs_list *pos, *h = &ctx->mr_hash[sge[i].lkey % VRB_MR_HASH];
        int found = 0;

        if (!sge[i].length)
            continue;
        exs_list_for_each(pos, h)
        {
            struct vrb_mr *mr = exs_list_entry(pos, struct vrb_mr, link);
            uint64_t a = (uint64_t)(uintptr_t)mr->base.addr;

            if (mr->base.lkey == sge[i].lkey && sge[i].addr >= a &&
                sge[i].addr + sge[i].length <= a + mr->base.length &&
                (!need_lw || (mr->base.access & EXS_PROV_ACCESS_LOCAL_WRITE))) {
                found = 1;
                break;
            }
        }
        ok = found;
    }
    pthread_rwlock_unlock(&ctx->mr_lock);
    return ok;
}

static int vrb_access(unsigned access)
{
    int a = 0;

    if (access & EXS_PROV_ACCESS_LOCAL_WRITE)
        a |= IBV_ACCESS_LOCAL_WRITE;
    if (access & EXS_PROV_ACCESS_REMOTE_WRITE)
        a |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE; /* verbs requires LOCAL_WRITE */
    if (access & EXS_PROV_ACCESS_REMOTE_READ)
        a |= IBV_ACCESS_REMOTE_READ;
    return a;
}

int exs__vrb_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    struct vrb_mr *mr;

    if ((!addr && length) ||
        (access & ~(unsigned)(EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                              EXS_PROV_ACCESS_REMOTE_READ)))
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->mr = ibv_reg_mr(ctx->pd, addr, length, vrb_access(access));
    if (!mr->mr && (errno == EFAULT || errno == EACCES || errno == EPERM || errno == EINVAL) &&
        (vrb_access(access) & IBV_ACCESS_LOCAL_WRITE)) {
        /* read-only pages (a string constant sent from): the device cannot write what the
         * process cannot; register what can be, a peer's WRITE then fails REM_ACCESS_ERR */
        EXS_DBG(PROV, "ctx %p: %p+%zu not writable, registered read-only", (void *)ctx, addr,
                length);
        mr->mr = ibv_reg_mr(ctx->pd, addr, length, vrb_access(access) & IBV_ACCESS_REMOTE_READ);
    }
    if (!mr->mr) {
        int err = errno ? errno : ENOMEM;

        EXS_DBG(PROV, "ctx %p: ibv_reg_mr(%p, %zu): %s", (void *)ctx, addr, length, strerror(err));
        free(mr);
        return -err;
    }
    mr->base.ctx = c;
    mr->base.addr = addr;
    mr->base.length = length;
    mr->base.lkey = mr->mr->lkey;
    mr->base.rkey = mr->mr->rkey;
    mr->base.access = access;
    pthread_rwlock_wrlock(&ctx->mr_lock);
    exs_list_add_tail(&ctx->mr_hash[mr->base.lkey % VRB_MR_HASH], &mr->link);
    pthread_rwlock_unlock(&ctx->mr_lock);
    *mr_p = &mr->base;
    return 0;
}

int exs__vrb_mr_dereg(struct exs_prov_mr *m)
{
    struct vrb_mr *mr = (struct vrb_mr *)m;
    struct vrb_ctx *ctx;
    int ret;

    if (!mr)
        return -EINVAL;
    ctx = vrb_ctx_of(mr->base.ctx);
    pthread_rwlock_wrlock(&ctx->mr_lock);
    exs_list_del(&mr->link);
    pthread_rwlock_unlock(&ctx->mr_lock);
    ret = ibv_dereg_mr(mr->mr);
    if (ret) {
        pthread_rwlock_wrlock(&ctx->mr_lock);
        exs_list_add_tail(&ctx->mr_hash[mr->base.lkey % VRB_MR_HASH], &mr->link);
        pthread_rwlock_unlock(&ctx->mr_lock);
        return -ret;
    }
    free(mr);
    return 0;
}

int exs__vrb_reg_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                    uint32_t *rkey_p)
{
    struct vrb_ctx *ctx = arg;
    struct ibv_mr *mr =
        ibv_reg_mr(ctx->pd, addr, len,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

    if (!mr)
        return errno ? -errno : -ENOMEM;
    *handle_p = mr;
    *lkey_p = mr->lkey;
    *rkey_p = mr->rkey;
    return 0;
}

void exs__vrb_dereg_cb(void *arg, void *handle)
{
    (void)arg;
    if (ibv_dereg_mr(handle))
        EXS_WARN(PROV, "ibv_dereg_mr failed");
}
