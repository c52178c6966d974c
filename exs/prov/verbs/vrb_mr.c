/* SPDX-License-Identifier: MIT */
/* Verbs provider memory registration: ibv_reg_mr on the ctx's PD, and the registration
 * callbacks of the memory and registration caches. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

enum vrb_mr_kind {
    VRB_MR_OWN = 0, /* mr_reg: its own ibv_mr */
    VRB_MR_MCACHE,  /* mem_alloc: a piece of a memory-cache region (the region's lkey) */
    VRB_MR_BIG,     /* mem_alloc larger than a region: own mapping and ibv_mr */
    VRB_MR_RCACHE,  /* mr_get: an entry of the registration cache */
};

struct vrb_mr {
    struct exs_prov_mr base;
    struct ibv_mr *mr; /* VRB_MR_OWN, VRB_MR_BIG */
    enum vrb_mr_kind kind;
    struct vrb_mc_buf mc;     /* VRB_MR_MCACHE */
    struct vrb_rc_entry *rce; /* VRB_MR_RCACHE */
    size_t map_len;           /* VRB_MR_BIG: the mapping at base.addr */
    unsigned grants;          /* live grants over it (atomic): mr_dereg refuses -EBUSY */
    struct exs_list link;     /* ctx->mr_hash */
};

static void vrb_mr_hash_add(struct vrb_ctx *ctx, struct vrb_mr *mr)
{
    pthread_rwlock_wrlock(&ctx->mr_lock);
    exs_list_add_tail(&ctx->mr_hash[mr->base.lkey % VRB_MR_HASH], &mr->link);
    pthread_rwlock_unlock(&ctx->mr_lock);
}

static void vrb_mr_hash_del(struct vrb_ctx *ctx, struct vrb_mr *mr)
{
    pthread_rwlock_wrlock(&ctx->mr_lock);
    exs_list_del(&mr->link);
    pthread_rwlock_unlock(&ctx->mr_lock);
}

/* Fill in what the core sees of mr and make it known to the sge checks. */
static void vrb_mr_publish(struct vrb_ctx *ctx, struct vrb_mr *mr, void *addr, size_t length,
                           uint32_t lkey, uint32_t rkey, unsigned access, struct exs_prov_mr **mr_p)
{
    mr->base.ctx = &ctx->base;
    mr->base.addr = addr;
    mr->base.length = length;
    mr->base.lkey = lkey;
    mr->base.rkey = rkey;
    mr->base.access = access;
    vrb_mr_hash_add(ctx, mr);
    *mr_p = &mr->base;
}

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

int exs__vrb_mr_extra(const struct vrb_ctx *ctx)
{
    return ctx->grant_mode == VRB_GRANT_MW ? IBV_ACCESS_MW_BIND : 0;
}

struct ibv_mr *exs__vrb_mr_ibv(struct exs_prov_mr *m)
{
    struct vrb_mr *mr = (struct vrb_mr *)m;

    switch (mr->kind) {
    case VRB_MR_OWN:
    case VRB_MR_BIG:
        return mr->mr;
    case VRB_MR_MCACHE:
        return mr->mc.region ? mr->mc.region->handle : NULL;
    case VRB_MR_RCACHE:
        return mr->rce ? mr->rce->handle : NULL;
    }
    return NULL;
}

static int vrb_mr_reg(struct vrb_ctx *ctx, void *addr, size_t length, unsigned access,
                      struct exs_prov_mr **mr_p)
{
    struct vrb_mr *mr;

    if (vrb_gone(ctx))
        return -ENODEV;
    if ((!addr && length) ||
        (access & ~(unsigned)(EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                              EXS_PROV_ACCESS_REMOTE_READ)))
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->mr = VRB_NC(ibv_reg_mr(ctx->pd, addr, length, vrb_access(access) | exs__vrb_mr_extra(ctx)));
    if (!mr->mr && (errno == EFAULT || errno == EACCES || errno == EPERM || errno == EINVAL) &&
        (vrb_access(access) & IBV_ACCESS_LOCAL_WRITE)) {
        /* read-only pages (a string constant sent from): the device cannot write what the
         * process cannot; register what can be, a peer's WRITE then fails REM_ACCESS_ERR */
        EXS_DBG(PROV, "ctx %p: %p+%zu not writable, registered read-only", (void *)ctx, addr,
                length);
        mr->mr =
            VRB_NC(ibv_reg_mr(ctx->pd, addr, length, vrb_access(access) & IBV_ACCESS_REMOTE_READ));
    }
    if (!mr->mr) {
        int err = errno ? errno : ENOMEM;

        EXS_DBG(PROV, "ctx %p: ibv_reg_mr(%p, %zu): %s", (void *)ctx, addr, length, strerror(err));
        free(mr);
        return -err;
    }
    vrb_mr_publish(ctx, mr, addr, length, mr->mr->lkey, mr->mr->rkey, access, mr_p);
    return 0;
}

int exs__vrb_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    int ret;

    pthread_rwlock_rdlock(&ctx->dev_lock);
    ret = vrb_mr_reg(ctx, addr, length, access, mr_p);
    pthread_rwlock_unlock(&ctx->dev_lock);
    return ret;
}

void exs__vrb_mr_gone(struct vrb_ctx *ctx)
{
    exs__vrb_gc_close(&ctx->gc); /* before the registrations its entries lie in */
    pthread_rwlock_wrlock(&ctx->mr_lock);
    for (unsigned i = 0; i < VRB_MR_HASH; i++) {
        struct exs_list *pos;

        exs_list_for_each(pos, &ctx->mr_hash[i])
        {
            struct vrb_mr *mr = exs_list_entry(pos, struct vrb_mr, link);

            if (mr->kind == VRB_MR_RCACHE) {
                exs__vrb_rc_unreg(&ctx->rc, mr->rce); /* entries outside the cache's list */
            } else if (mr->mr) {
                if (VRB_NC(ibv_dereg_mr(mr->mr)))
                    EXS_WARN(PROV, "ctx %p: ibv_dereg_mr: %m", (void *)ctx);
                mr->mr = NULL;
            }
        }
    }
    pthread_rwlock_unlock(&ctx->mr_lock);
    exs__vrb_rc_unreg(&ctx->rc, NULL);
    exs__vrb_mc_unreg(&ctx->mc);
}

void exs__vrb_mr_grants_add(struct exs_prov_mr *m, int delta)
{
    __atomic_add_fetch(&((struct vrb_mr *)m)->grants, (unsigned)delta, __ATOMIC_RELAXED);
}

int exs__vrb_mr_dereg(struct exs_prov_mr *m)
{
    struct vrb_mr *mr = (struct vrb_mr *)m;
    struct vrb_ctx *ctx;
    int ret = 0;

    if (!mr)
        return -EINVAL;
    if (mr->kind != VRB_MR_OWN)
        return -EINVAL;
    if (__atomic_load_n(&mr->grants, __ATOMIC_RELAXED)) {
        EXS_DBG(PROV, "mr %p: %u grants live, not deregistered", (void *)mr, mr->grants);
        return -EBUSY;
    }
    ctx = vrb_ctx_of(mr->base.ctx);
    pthread_rwlock_rdlock(&ctx->dev_lock);
    vrb_mr_hash_del(ctx, mr);
    if (mr->mr) { /* NULL: released with the device */
        exs__vrb_gc_drop(&ctx->gc, mr->mr);
        ret = VRB_NC(ibv_dereg_mr(mr->mr));
    }
    if (ret)
        vrb_mr_hash_add(ctx, mr);
    pthread_rwlock_unlock(&ctx->dev_lock);
    if (ret)
        return -ret;
    free(mr);
    return 0;
}

/* ---- the library's own memory: from the memory cache ---- */

static int vrb_mem_alloc(struct vrb_ctx *ctx, size_t len, struct exs_prov_mr **mr_p)
{
    struct vrb_mr *mr;
    uint32_t lkey;
    void *addr;
    int ret;

    if (!len)
        return -EINVAL;
    if (vrb_gone(ctx))
        return -ENODEV;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    if (len <= ctx->mc.region_size) {
        ret = exs__vrb_mc_alloc(&ctx->mc, len, &mr->mc);
        if (ret) {
            free(mr);
            return ret;
        }
        mr->kind = VRB_MR_MCACHE;
        addr = mr->mc.addr;
        lkey = mr->mc.lkey;
    } else {
        /* larger than a cache region: a mapping of its own, registered for local use */
        mr->kind = VRB_MR_BIG;
        mr->map_len = (len + VRB_MC_PAGE - 1) & ~(size_t)(VRB_MC_PAGE - 1);
        addr = mmap(NULL, mr->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (addr == MAP_FAILED) {
            free(mr);
            return -ENOMEM;
        }
        mr->mr = VRB_NC(ibv_reg_mr(ctx->pd, addr, mr->map_len,
                                   IBV_ACCESS_LOCAL_WRITE | exs__vrb_mr_extra(ctx)));
        if (!mr->mr) {
            ret = errno ? -errno : -ENOMEM;
            munmap(addr, mr->map_len);
            free(mr);
            return ret;
        }
        lkey = mr->mr->lkey;
    }
    /* rkey 0: local use only */
    vrb_mr_publish(ctx, mr, addr, len, lkey, 0, EXS_PROV_ACCESS_LOCAL_WRITE, mr_p);
    return 0;
}

int exs__vrb_mem_alloc(struct exs_prov_ctx *c, size_t len, struct exs_prov_mr **mr_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    int ret;

    pthread_rwlock_rdlock(&ctx->dev_lock);
    ret = vrb_mem_alloc(ctx, len, mr_p);
    pthread_rwlock_unlock(&ctx->dev_lock);
    return ret;
}

/* A consumer bug: memory freed while a grant over it lives. The memory is kept (the peer's
 * key still reaches it, and must not reach whatever it would be used for next); a later
 * call, after revoke, frees it. */
static int vrb_mr_granted(struct vrb_mr *mr, const char *what)
{
    unsigned n = __atomic_load_n(&mr->grants, __ATOMIC_RELAXED);

    if (!n)
        return 0;
    EXS_ERR(PROV, "mr %p: %s with %u live grants: kept until they are revoked", (void *)mr, what,
            n);
    return 1;
}

void exs__vrb_mem_free(struct exs_prov_mr *m)
{
    struct vrb_mr *mr = (struct vrb_mr *)m;
    struct vrb_ctx *ctx = vrb_ctx_of(mr->base.ctx);

    if (vrb_mr_granted(mr, "mem_free"))
        return;

    pthread_rwlock_rdlock(&ctx->dev_lock);
    vrb_mr_hash_del(ctx, mr);
    if (mr->kind == VRB_MR_MCACHE) {
        exs__vrb_mc_free(&ctx->mc, &mr->mc);
    } else {
        if (mr->mr)
            exs__vrb_gc_drop(&ctx->gc, mr->mr);
        if (mr->mr && VRB_NC(ibv_dereg_mr(mr->mr)))
            EXS_WARN(PROV, "ctx %p: ibv_dereg_mr of %zu bytes failed", (void *)ctx, mr->map_len);
        munmap(mr->base.addr, mr->map_len);
    }
    pthread_rwlock_unlock(&ctx->dev_lock);
    free(mr);
}

/* ---- user buffers of one operation: through the registration cache ---- */

int exs__vrb_mr_get(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    struct vrb_rc_entry *e;
    struct vrb_mr *mr;

    int ret = 0;

    if (!exs__params.vrb_regcache_max || !addr || !length)
        return exs__vrb_mr_reg(c, addr, length, access, mr_p);
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    pthread_rwlock_rdlock(&ctx->dev_lock);
    if (vrb_gone(ctx)) {
        ret = -ENODEV;
    } else if (exs__vrb_rc_get(&ctx->rc, addr, length, &e) != 0) {
        /* e.g. read-only pages: the cache registers with every right, mr_reg adapts */
        ret = vrb_mr_reg(ctx, addr, length, access, mr_p);
    } else {
        mr->kind = VRB_MR_RCACHE;
        mr->rce = e;
        vrb_mr_publish(ctx, mr, addr, length, e->lkey, e->rkey, access, mr_p);
        mr = NULL;
    }
    pthread_rwlock_unlock(&ctx->dev_lock);
    free(mr);
    return ret;
}

void exs__vrb_mr_put(struct exs_prov_mr *m)
{
    struct vrb_mr *mr = (struct vrb_mr *)m;
    struct vrb_ctx *ctx = vrb_ctx_of(mr->base.ctx);

    if (vrb_mr_granted(mr, "mr_put"))
        return;

    if (mr->kind != VRB_MR_RCACHE) {
        int ret = exs__vrb_mr_dereg(m);

        if (ret)
            EXS_ERR(PROV, "mr %p: mr_put: deregistration failed: %s (kept)", (void *)mr,
                    strerror(-ret));
        return;
    }
    pthread_rwlock_rdlock(&ctx->dev_lock);
    vrb_mr_hash_del(ctx, mr);
    exs__vrb_rc_put(&ctx->rc, mr->rce);
    pthread_rwlock_unlock(&ctx->dev_lock);
    free(mr);
}

/* The pages behind [start, start+len): a hash of their frame numbers from
 * /proc/self/pagemap. The kernel shows frame numbers only to CAP_SYS_ADMIN; without it
 * (all zero) the pages cannot be told apart and -EPERM says so. */
int exs__vrb_ident_cb(void *arg, uintptr_t start, size_t len, uint64_t *id_p)
{
    struct vrb_ctx *ctx = arg;
    uint64_t ent[512], h = 0xcbf29ce484222325ull;
    size_t pages = (len + VRB_MC_PAGE - 1) / VRB_MC_PAGE, done = 0;

    if (ctx->pagemap_fd < 0)
        return -EPERM;
    while (done < pages) {
        size_t n = EXS_MIN(pages - done, EXS_ARRAY_SIZE(ent));
        off_t off = (off_t)((start / VRB_MC_PAGE + done) * sizeof(uint64_t));
        ssize_t r = exs__nc_pread(ctx->pagemap_fd, ent, n * sizeof(uint64_t), off);

        if (r != (ssize_t)(n * sizeof(uint64_t)))
            return -EIO;
        for (size_t i = 0; i < n; i++) {
            uint64_t pfn = ent[i] & ((1ull << 55) - 1);

            if (!(ent[i] >> 63) || !pfn)
                return -EPERM; /* not present, or frame numbers hidden */
            h = (h ^ pfn) * 0x100000001b3ull;
        }
        done += n;
    }
    *id_p = h;
    return 0;
}

/* The caches' registration callbacks: ibv_reg_mr with flags on the ctx's PD. */
static int vrb_reg_flags(struct vrb_ctx *ctx, void *addr, size_t len, int flags, void **handle_p,
                         uint32_t *lkey_p, uint32_t *rkey_p)
{
    struct ibv_mr *mr;

    if (vrb_gone(ctx))
        return -ENODEV;
    mr = VRB_NC(ibv_reg_mr(ctx->pd, addr, len, flags));
    if (!mr)
        return errno ? -errno : -ENOMEM;
    *handle_p = mr;
    *lkey_p = mr->lkey;
    *rkey_p = mr->rkey;
    return 0;
}

/* Memory-cache regions: local access only. A peer is given an rkey only for a registration
 * of its own connection's ring (mr_reg over that piece), never for a whole region holding
 * other connections' memory. */
int exs__vrb_reg_local_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                          uint32_t *rkey_p)
{
    return vrb_reg_flags(arg, addr, len, IBV_ACCESS_LOCAL_WRITE | exs__vrb_mr_extra(arg), handle_p,
                         lkey_p, rkey_p);
}

/* Registration-cache entries: every right, since one entry serves sends and receives. */
int exs__vrb_reg_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                    uint32_t *rkey_p)
{
    return vrb_reg_flags(arg, addr, len,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             exs__vrb_mr_extra(arg),
                         handle_p, lkey_p, rkey_p);
}

void exs__vrb_dereg_cb(void *arg, void *handle)
{
    struct vrb_ctx *ctx = arg;

    if (!handle)
        return;
    exs__vrb_gc_drop(&ctx->gc, handle);
    if (VRB_NC(ibv_dereg_mr(handle)))
        EXS_WARN(PROV, "ibv_dereg_mr failed");
}

/* Grant-cache entries: no remote right (only the window bound over one gives one). */
int exs__vrb_reg_bind_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                         uint32_t *rkey_p)
{
    return vrb_reg_flags(arg, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, handle_p,
                         lkey_p, rkey_p);
}

void exs__vrb_dereg_bind_cb(void *arg, void *handle)
{
    (void)arg;
    if (handle && VRB_NC(ibv_dereg_mr(handle)))
        EXS_ERR(PROV, "ibv_dereg_mr (grant registration) failed: %m");
}
