/* SPDX-License-Identifier: MIT */
/* Verbs provider remote access grants: type 2 memory windows bound to one QP, or a
 * registration per grant where windows are missing (spec/provider.md). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

#define VRB_RXE_VENDOR         0xffffffu /* rdma_rxe's vendor_id */
/* how long a grant waits for earlier binds to complete when the internal room is full */
#define VRB_GRANT_ROOM_WAIT_NS (3000ull * 1000 * 1000)
/* the grant registration cache (mw_mr): entries and bytes at most (EXS_VRB_GRANT_CACHE=N
 * sets the entries; 0 turns it off) */
#define VRB_GC_ENTRIES         256u
#define VRB_GC_BYTES           (256ull << 20)

struct vrb_grant {
    struct exs_prov_grant base;
    struct ibv_mw *mw;        /* VRB_GRANT_MW, VRB_GRANT_MW_MR */
    struct ibv_mr *sub;       /* VRB_GRANT_MR: exactly the range */
    struct vrb_gc_entry *gce; /* VRB_GRANT_MW_MR: exactly the range, from ctx->gc */
    uint64_t seq;             /* the bind's internal sequence */
    uint32_t nwr;             /* internal send queue entries it took (the bind, its fence READ) */
    uint64_t posted_ns;       /* when the bind was posted (diagnostics) */
    int bind_done;            /* its completion was seen, or it can no longer run (ep->lock) */
    int revoked;              /* revoke came before bind_done: released at the completion */
    int settle_wanted;        /* grant_settle said -EBUSY: the completion is shown (ep->lock) */
    struct exs_list link;     /* ep->grants (ep->lock) */
};

const char *exs__vrb_grant_mode_str(enum vrb_grant_mode mode)
{
    switch (mode) {
    case VRB_GRANT_MW:
        return "mw";
    case VRB_GRANT_MW_MR:
        return "mw_mr";
    case VRB_GRANT_MR:
        return "mr";
    }
    return "?";
}

static uint64_t vrb_rand64(struct vrb_ctx *ctx)
{
    /* splitmix64 over a counter: thread safe without a lock */
    uint64_t z = __atomic_add_fetch(&ctx->rng, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void exs__vrb_grant_init(struct vrb_ctx *ctx)
{
    uint64_t f = ctx->dattr.device_cap_flags;
    int have_mw2 = (f & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
    const char *env = getenv("EXS_VRB_GRANT");
    const char *why;
    uint64_t seed;

    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = exs__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)ctx;
    ctx->rng = seed;
    if (!have_mw2) {
        ctx->grant_mode = VRB_GRANT_MR;
        why = "the device has no type 2 memory windows";
    } else if (ctx->dattr.vendor_id == VRB_RXE_VENDOR) {
        /* rxe (Linux 6.1) checks a window's range against the MR under it, not the
         * window: the MR must be exactly the range */
        ctx->grant_mode = VRB_GRANT_MW_MR;
        why = "rxe checks window ranges against their MR only";
    } else {
        ctx->grant_mode = VRB_GRANT_MW;
        why = "type 2 memory windows";
    }
    if (env && *env) {
        enum vrb_grant_mode m = 0;

        if (!strcmp(env, "mw"))
            m = VRB_GRANT_MW;
        else if (!strcmp(env, "mw_mr"))
            m = VRB_GRANT_MW_MR;
        else if (!strcmp(env, "mr"))
            m = VRB_GRANT_MR;
        if (!m)
            EXS_WARN(PROV, "EXS_VRB_GRANT=%s: unknown (mw, mw_mr, mr), ignored", env);
        else if (m != VRB_GRANT_MR && !have_mw2)
            EXS_WARN(PROV, "EXS_VRB_GRANT=%s: the device has no type 2 memory windows", env);
        else {
            ctx->grant_mode = m;
            why = "EXS_VRB_GRANT";
        }
    }
    /* rxe (Linux 6.1): a retry (timeout, RNR or sequence NAK) of a request posted before a
     * bind that already ran walks the send queue back over the done bind and runs it
     * again; the window is bound by then (and its key changed), so the second run fails,
     * and the QP sends nothing more, without an error completion. A bind that runs only
     * once everything before it was acknowledged is never walked over: the fence, a
     * LOCAL_INV (rxe runs one only at the head of the send queue) of a window of the ep's
     * own, bound again right after it. */
    ctx->bind_fence = ctx->grant_mode != VRB_GRANT_MR && ctx->dattr.vendor_id == VRB_RXE_VENDOR;
    env = getenv("EXS_VRB_BIND_FENCE");
    if (env && *env && ctx->grant_mode != VRB_GRANT_MR) {
        if (!strcmp(env, "0") || !strcmp(env, "1"))
            ctx->bind_fence = *env == '1';
        else
            EXS_WARN(PROV, "EXS_VRB_BIND_FENCE=%s: not 0 or 1, ignored", env);
    }
    {
        struct vrb_reg_ops ops = {
            .reg = exs__vrb_reg_bind_cb, .dereg = exs__vrb_dereg_bind_cb, .arg = ctx};
        unsigned n = VRB_GC_ENTRIES;

        env = getenv("EXS_VRB_GRANT_CACHE");
        if (env && *env) {
            char *end;
            unsigned long v = strtoul(env, &end, 10);

            if (*end || v > 65536)
                EXS_WARN(PROV, "EXS_VRB_GRANT_CACHE=%s: not 0-65536, ignored", env);
            else
                n = (unsigned)v;
        }
        exs__vrb_gc_init(&ctx->gc, ctx->grant_mode == VRB_GRANT_MW_MR ? n : 0, VRB_GC_BYTES, &ops);
        exs__vrb_gc_counters(&ctx->gc, 1);
    }
    ctx->int_room = ctx->grant_mode == VRB_GRANT_MR ? 0
                    : ctx->bind_fence               ? 3 * VRB_INT_ROOM + 1
                                                    : VRB_INT_ROOM;
    EXS_INFO(PROV, "verbs ctx %p: grants by %s (%s)%s", (void *)ctx,
             ctx->grant_mode == VRB_GRANT_MW      ? "type 2 memory window bound to the QP"
             : ctx->grant_mode == VRB_GRANT_MW_MR ? "type 2 memory window bound to the QP "
                                                    "over a registration of exactly the range"
                                                  : "a registration of exactly the range per "
                                                    "grant (not bound to one connection)",
             why, ctx->bind_fence ? "; binds fenced by a local invalidate" : "");
}

/* Release g's device objects: no key of it works after this. The window goes first: the
 * registration under it (no remote right of its own) is then free for the next grant of the
 * same range, or deregistered. */
static void vrb_grant_objs_release(struct vrb_ctx *ctx, struct vrb_grant *g)
{
    if (g->mw && VRB_NC(ibv_dealloc_mw(g->mw)))
        EXS_ERR(PROV, "ibv_dealloc_mw (rkey %#x) failed: %m", g->base.rkey);
    if (g->gce)
        exs__vrb_gc_put(&ctx->gc, g->gce);
    if (g->sub && VRB_NC(ibv_dereg_mr(g->sub)))
        EXS_ERR(PROV, "ibv_dereg_mr (grant rkey %#x) failed: %m", g->base.rkey);
    g->mw = NULL;
    g->gce = NULL;
    g->sub = NULL;
}

void exs__vrb_grant_release(struct vrb_grant *g)
{
    if (!g)
        return;
    vrb_grant_objs_release(vrb_ep_of(g->base.ep)->ctx, g);
    free(g);
}

static int vrb_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                     unsigned access, struct exs_prov_grant **grant_p)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx = ep->ctx;
    uint64_t a = (uint64_t)(uintptr_t)addr, ma;
    struct ibv_send_wr w, fw[2], *first, *bad = NULL;
    struct vrb_grant *g;
    uint32_t rkey, fkey = 0, nwr;
    int ibv_right, ret, state;

    if (!m || !grant_p || m->ctx != e->ctx || !length ||
        (access != EXS_PROV_ACCESS_REMOTE_WRITE && access != EXS_PROV_ACCESS_REMOTE_READ) ||
        !(m->access & EXS_PROV_ACCESS_LOCAL_WRITE))
        return -EINVAL;
    ma = (uint64_t)(uintptr_t)m->addr;
    if (a < ma || a - ma > m->length || length > m->length - (a - ma))
        return -EINVAL;
    state = __atomic_load_n(&ep->state, __ATOMIC_RELAXED);
    if (state != EXS_PROV_EP_CONNECTED)
        return -ENOTCONN;
    if (vrb_gone(ctx))
        return -ENODEV;
    ibv_right =
        access == EXS_PROV_ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
    g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    exs__prov_grant_init(&g->base, e, m, a, length, access);
    exs_list_init(&g->link);
    /* counted from here: mr_dereg refuses -EBUSY while the grant is being made too (the
     * grant cache's entry must not outlive m's registration) */
    exs__vrb_mr_grants_add(m, 1);
    if (ctx->grant_mode == VRB_GRANT_MR) {
        g->sub = VRB_NC(ibv_reg_mr(ctx->pd, addr, length, IBV_ACCESS_LOCAL_WRITE | ibv_right));
        if (!g->sub) {
            ret = errno ? -errno : -ENOMEM;
            EXS_DBG(PROV, "ep %p: grant: ibv_reg_mr(%p, %zu): %s", (void *)ep, addr, length,
                    strerror(-ret));
            goto err_free;
        }
        g->base.rkey = g->sub->rkey;
        g->bind_done = 1;
        exs__lite_lock_st(&ep->lock);
        exs_list_add_tail(&ep->grants, &g->link);
        exs__lite_unlock_st(&ep->lock);
        goto done;
    }

    memset(&w, 0, sizeof(w));
    if (ctx->grant_mode == VRB_GRANT_MW_MR) {
        /* exactly the range, cached per range of the registration it lies in */
        struct ibv_mr *parent = exs__vrb_mr_ibv(m);

        ret = parent ? exs__vrb_gc_get(&ctx->gc, parent, parent->lkey, addr, length, &g->gce)
                     : -EINVAL;
        if (ret) {
            EXS_DBG(PROV, "ep %p: grant: registration of %p+%zu: %s", (void *)ep, addr, length,
                    strerror(-ret));
            goto err_free;
        }
        w.bind_mw.bind_info.mr = g->gce->handle;
    } else {
        w.bind_mw.bind_info.mr = exs__vrb_mr_ibv(m);
        if (!w.bind_mw.bind_info.mr) {
            ret = -EINVAL;
            goto err_free;
        }
    }
    g->mw = VRB_NC(ibv_alloc_mw(ctx->pd, IBV_MW_TYPE_2));
    if (!g->mw) {
        ret = errno ? -errno : -ENOMEM;
        EXS_DBG(PROV, "ep %p: grant: ibv_alloc_mw: %s", (void *)ep, strerror(-ret));
        goto err_dereg;
    }
    /* the key's consumer byte: random, and never the one the window had */
    do
        rkey = (g->mw->rkey & ~0xffu) | (uint32_t)(vrb_rand64(ctx) & 0xff);
    while (rkey == g->mw->rkey);
    w.opcode = IBV_WR_BIND_MW;
    w.send_flags = IBV_SEND_SIGNALED;
    w.bind_mw.mw = g->mw;
    w.bind_mw.rkey = rkey;
    w.bind_mw.bind_info.addr = a;
    w.bind_mw.bind_info.length = length;
    w.bind_mw.bind_info.mw_access_flags = (unsigned)ibv_right;
    nwr = ctx->bind_fence ? 3 : 1;

    /* Room for the bind (and its fence): binds complete only once everything posted before
     * them was acknowledged, a round trip or a retransmission across a link, while the
     * protocol may have up to EXS_WIRE_ADVERTS_MAX + EXS_WIRE_ANNOUNCED_MAX grants out.
     * When the room is full, completions not polled yet give it back (reap); failing that,
     * wait for them (the peer's device acknowledges without its application), bounded:
     * a refused grant ends the connection. */
    for (uint64_t deadline = 0, pause_us = 20;;) {
        if (__atomic_load_n(&ep->int_out, __ATOMIC_RELAXED) + nwr > ep->int_room)
            exs__vrb_cq_reap(ctx);
        exs__lite_lock_st(&ep->lock);
        state = __atomic_load_n(&ep->state, __ATOMIC_RELAXED);
        if (state != EXS_PROV_EP_CONNECTED) {
            exs__lite_unlock_st(&ep->lock);
            ret = -ENOTCONN;
            goto err_dealloc;
        }
        if (ep->int_out + nwr <= ep->int_room)
            break; /* with ep->lock */
        exs__lite_unlock_st(&ep->lock);
        if (!deadline) {
            deadline = exs__now_ns() + VRB_GRANT_ROOM_WAIT_NS;
            EXS_CNT_INC(ctx->cnt.grant_room_waits);
        } else if (exs__now_ns() >= deadline) {
            EXS_DBG(PROV, "ep %p: grant: %u internal requests in flight, no room", (void *)ep,
                    ep->int_out);
            ret = -ENOMEM;
            goto err_dealloc;
        }
        {
            struct timespec ts = {0, (long)(pause_us * 1000)};

            exs__nc_nanosleep(&ts);
            pause_us = EXS_MIN(pause_us * 2, 1000);
        }
    }
    first = &w;
    nwr = 1;
    /* the consumer's deferred requests were posted before: they go first */
    exs__vrb_held_post_locked(ep);
    /* The fence makes the bind wait until every request before it completed. With none
     * outstanding (each one's completion converted: [sq_head, sq_tail) empty, and no bind
     * in flight but the fence window's first, which went before anything), it would wait
     * for nothing, and no retry can walk back over the bind: it goes alone
     * (spec/provider.md, "The bind fence"). A head read stale is older: the fence stays. */
    if (ep->fence_mw && ep->int_out == ep->fence_extra &&
        __atomic_load_n(&ep->sq_head, __ATOMIC_ACQUIRE) == ep->sq_tail) {
        EXS_CNT_INC(ctx->cnt.binds_unfenced);
    } else if (ep->fence_mw) {
        /* LOCAL_INV of the fence window (run by rxe only once everything before it
         * completed), the fence window bound again (a fresh key), then the grant's bind.
         * Unsignaled: the bind's completion retires them; an error completes them, with
         * the bind's wr_id. */
        memset(fw, 0, sizeof(fw));
        do
            fkey = (ep->fence_mw->rkey & ~0xffu) | (uint32_t)(vrb_rand64(ctx) & 0xff);
        while (fkey == ep->fence_mw->rkey);
        fw[0].opcode = IBV_WR_LOCAL_INV;
        fw[0].invalidate_rkey = ep->fence_mw->rkey;
        fw[0].next = &fw[1];
        fw[1].opcode = IBV_WR_BIND_MW;
        fw[1].bind_mw.mw = ep->fence_mw;
        fw[1].bind_mw.rkey = fkey;
        fw[1].bind_mw.bind_info.mr = ctx->fence_mr;
        fw[1].bind_mw.bind_info.addr = (uint64_t)(uintptr_t)ctx->fence_page;
        fw[1].bind_mw.bind_info.length = 1;
        fw[1].next = &w;
        first = fw;
        nwr = 3;
    }
    g->seq = ep->int_seq;
    g->nwr = nwr + ep->fence_extra;
    w.wr_id = ((uint64_t)ep->epid << VRB_EPID_SHIFT) | VRB_INT_BIT | (g->seq & VRB_SEQ_MASK);
    fw[0].wr_id = fw[1].wr_id = w.wr_id;
    ret = vrb_post_send(ep->ctx, ep->qp, first, &bad);
    if (ret) {
        exs__lite_unlock_st(&ep->lock);
        EXS_DBG(PROV, "ep %p: grant: ibv_post_send(BIND_MW): %s", (void *)ep, strerror(ret));
        ret = ret == ENOMEM ? -ENOMEM : -ret;
        goto err_dealloc;
    }
    /* the verbs library keeps the window's key as it was; the bind set a new one */
    g->mw->rkey = rkey;
    if (nwr == 3)
        ep->fence_mw->rkey = fkey;
    ep->fence_extra = 0;
    g->posted_ns = exs__now_ns();
    ep->int_seq++;
    ep->int_out += nwr;
    exs_list_add_tail(&ep->grants, &g->link);
    exs__lite_unlock_st(&ep->lock);
    g->base.rkey = rkey;
done:
    EXS_CNT_INC(ctx->cnt.grants);
    EXS_DATA(PROV, "ep %p: grant %s %#llx+%zu rkey %#x", (void *)ep,
             access == EXS_PROV_ACCESS_REMOTE_WRITE ? "write" : "read", (unsigned long long)a,
             length, g->base.rkey);
    *grant_p = &g->base;
    return 0;
err_dealloc:
    if (VRB_NC(ibv_dealloc_mw(g->mw)))
        EXS_ERR(PROV, "ep %p: ibv_dealloc_mw failed: %m", (void *)ep);
err_dereg:
    if (g->gce)
        exs__vrb_gc_put(&ctx->gc, g->gce);
err_free:
    exs__vrb_mr_grants_add(m, -1);
    free(g);
    EXS_CNT_INC(ctx->cnt.grant_fails);
    return ret;
}

int exs__vrb_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p)
{
    struct vrb_ctx *ctx = vrb_ep_of(e)->ctx;
    int ret;

    pthread_rwlock_rdlock(&ctx->dev_lock);
    ret = vrb_grant(e, m, addr, length, access, grant_p);
    pthread_rwlock_unlock(&ctx->dev_lock);
    return ret;
}

static void vrb_revoke(struct vrb_grant *g)
{
    struct vrb_ep *ep = vrb_ep_of(g->base.ep);

    EXS_CNT_INC(ep->ctx->cnt.revokes);
    exs__vrb_mr_grants_add(g->base.mr, -1);
    exs__lite_lock_st(&ep->lock);
    if (!g->bind_done) {
        /* its completion may be in the CQ, not polled yet */
        exs__lite_unlock_st(&ep->lock);
        exs__vrb_cq_reap(ep->ctx);
        exs__lite_lock_st(&ep->lock);
    }
    if (!g->bind_done) {
        /* The bind waits in the send queue behind requests the peer holds up: once it
         * runs, the key would live until its completion is polled. End the connection
         * instead: a QP in ERR accepts nothing, and a type 2 window works on its QP
         * only. The window is released when the bind completes (or flushes). */
        g->revoked = 1;
        EXS_CNT_INC(ep->ctx->cnt.revokes_early);
        EXS_DBG(
            PROV,
            "ep %p: rkey %#x revoked %llu us after its bind was posted, before its "
            "completion (%u binds, %llu requests outstanding): ep to error",
            (void *)ep, g->base.rkey, (unsigned long long)((exs__now_ns() - g->posted_ns) / 1000),
            ep->int_out,
            (unsigned long long)(ep->sq_tail - __atomic_load_n(&ep->sq_head, __ATOMIC_RELAXED)));
        exs__vrb_ep_kill_locked(ep);
        exs__lite_unlock_st(&ep->lock);
        return;
    }
    exs_list_del(&g->link);
    exs__lite_unlock_st(&ep->lock);
    /* ibv_dealloc_mw / ibv_dereg_mr are synchronous: the key is dead when they return */
    exs__vrb_grant_release(g);
}

void exs__vrb_revoke(struct exs_prov_grant *gr)
{
    struct vrb_grant *g = (struct vrb_grant *)gr;
    struct vrb_ctx *ctx;

    if (!g)
        return;
    ctx = vrb_ep_of(g->base.ep)->ctx;
    pthread_rwlock_rdlock(&ctx->dev_lock);
    vrb_revoke(g);
    pthread_rwlock_unlock(&ctx->dev_lock);
}

/* The bind completes once every request posted before it did, so behind sends the peer
 * has not acknowledged yet: a round trip and more on a long link, seconds when the
 * link drops packets. The consumer asks here before it ends a grant, and holds what
 * the grant covers until the answer is 0 (spec/provider.md, "Grants"). */
int exs__vrb_grant_settle(struct exs_prov_grant *gr)
{
    struct vrb_grant *g = (struct vrb_grant *)gr;
    struct vrb_ep *ep = vrb_ep_of(g->base.ep);
    int done;

    exs__lite_lock_st(&ep->lock);
    done = g->bind_done;
    exs__lite_unlock_st(&ep->lock);
    if (done)
        return 0;
    exs__vrb_cq_reap(ep->ctx); /* its completion may be in the CQ, not polled yet */
    exs__lite_lock_st(&ep->lock);
    done = g->bind_done;
    if (!done && !g->settle_wanted) {
        g->settle_wanted = 1;
        EXS_CNT_INC(ep->ctx->cnt.settle_waits);
        EXS_DBG(PROV, "ep %p: rkey %#x: its bind not completed %llu us after posting: held",
                (void *)ep, g->base.rkey,
                (unsigned long long)((exs__now_ns() - g->posted_ns) / 1000));
    }
    exs__lite_unlock_st(&ep->lock);
    return done ? 0 : -EBUSY;
}

struct vrb_grant *exs__vrb_int_complete(struct vrb_ep *ep, const struct ibv_wc *wc, int *settled)
{
    uint64_t seq = wc->wr_id & VRB_SEQ_MASK;
    struct exs_list *pos;

    exs_list_for_each(pos, &ep->grants)
    {
        struct vrb_grant *g = exs_list_entry(pos, struct vrb_grant, link);

        if (!g->mw || g->bind_done || g->seq != seq)
            continue;
        g->bind_done = 1;
        *settled = g->settle_wanted;
        ep->int_out -= EXS_MIN(ep->int_out, g->nwr);
        if (wc->status != IBV_WC_SUCCESS) {
            if (wc->status != IBV_WC_WR_FLUSH_ERR) {
                EXS_CNT_INC(ep->ctx->cnt.wc_errors);
                EXS_WARN(PROV, "ep %p: window bind failed: %s (vendor %#x)", (void *)ep,
                         ibv_wc_status_str(wc->status), wc->vendor_err);
            }
            __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
        }
        if (g->revoked) {
            exs_list_del(&g->link);
            return g;
        }
        return NULL;
    }
    EXS_CNT_INC(ep->ctx->cnt.stale_cqes);
    return NULL;
}

void exs__vrb_fence_arm(struct vrb_ep *ep)
{
    struct vrb_ctx *ctx = ep->ctx;
    struct ibv_send_wr w, *bad = NULL;
    uint32_t key;
    int ret;

    if (!ctx->bind_fence || ep->fence_mw || !ep->qp)
        return;
    if (!ctx->fence_mr) {
        if (posix_memalign(&ctx->fence_page, 4096, 4096)) {
            ctx->fence_page = NULL;
            goto fail;
        }
        memset(ctx->fence_page, 0, 4096);
        ctx->fence_mr = VRB_NC(ibv_reg_mr(ctx->pd, ctx->fence_page, 4096,
                                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
        if (!ctx->fence_mr) {
            free(ctx->fence_page);
            ctx->fence_page = NULL;
            goto fail;
        }
    }
    ep->fence_mw = VRB_NC(ibv_alloc_mw(ctx->pd, IBV_MW_TYPE_2));
    if (!ep->fence_mw)
        goto fail;
    do
        key = (ep->fence_mw->rkey & ~0xffu) | (uint32_t)(vrb_rand64(ctx) & 0xff);
    while (key == ep->fence_mw->rkey);
    /* the first bind of the fence window: nothing is posted yet, so nothing can be retried
     * behind it; no rights (length 1 of a page of zeros, bound to this QP only) */
    memset(&w, 0, sizeof(w));
    w.opcode = IBV_WR_BIND_MW;
    w.wr_id = ((uint64_t)ep->epid << VRB_EPID_SHIFT) | VRB_INT_BIT | VRB_SEQ_MASK;
    w.bind_mw.mw = ep->fence_mw;
    w.bind_mw.rkey = key;
    w.bind_mw.bind_info.mr = ctx->fence_mr;
    w.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)ctx->fence_page;
    w.bind_mw.bind_info.length = 1;
    exs__lite_lock_st(&ep->lock);
    ret = vrb_post_send(ep->ctx, ep->qp, &w, &bad);
    if (!ret) {
        ep->fence_mw->rkey = key;
        ep->int_out++;
        ep->fence_extra = 1; /* retired by the first grant's completion */
    }
    exs__lite_unlock_st(&ep->lock);
    if (!ret)
        return;
    VRB_NC(ibv_dealloc_mw(ep->fence_mw));
    ep->fence_mw = NULL;
fail:
    EXS_WARN(PROV, "ep %p: no fence window (%m): its window binds go unfenced", (void *)ep);
}

void exs__vrb_fence_release(struct vrb_ctx *ctx)
{
    exs__vrb_gc_fini(&ctx->gc); /* the device or the ctx goes: nothing kept from here */
    if (ctx->fence_mr && VRB_NC(ibv_dereg_mr(ctx->fence_mr)))
        EXS_ERR(PROV, "ctx %p: ibv_dereg_mr (fence page) failed: %m", (void *)ctx);
    ctx->fence_mr = NULL;
    free(ctx->fence_page);
    ctx->fence_page = NULL;
}

static void vrb_fence_drop(struct vrb_ep *ep)
{
    if (ep->fence_mw && VRB_NC(ibv_dealloc_mw(ep->fence_mw)))
        EXS_ERR(PROV, "ep %p: ibv_dealloc_mw (fence window) failed: %m", (void *)ep);
    ep->fence_mw = NULL;
    ep->fence_extra = 0;
}

unsigned exs__vrb_grants_gone(struct vrb_ep *ep)
{
    struct exs_list *pos, *tmp;
    unsigned answers = 0;

    exs_list_for_each_safe(pos, tmp, &ep->grants)
    {
        struct vrb_grant *g = exs_list_entry(pos, struct vrb_grant, link);

        vrb_grant_objs_release(ep->ctx, g);
        if (!g->bind_done) {
            /* its bind flushes with the QP: as int_complete would see it */
            g->bind_done = 1;
            answers += g->settle_wanted ? 1u : 0u;
            if (g->revoked) {
                exs_list_del(&g->link);
                free(g);
            }
        }
    }
    ep->int_out = 0;
    vrb_fence_drop(ep);
    return answers;
}

void exs__vrb_grants_drop(struct vrb_ep *ep)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(&ep->grants)) != NULL) {
        struct vrb_grant *g = exs_list_entry(l, struct vrb_grant, link);

        if (!g->revoked) {
            EXS_ERR(PROV, "ep %p: grant rkey %#x not revoked before ep_destroy; released",
                    (void *)ep, g->base.rkey);
            exs__vrb_mr_grants_add(g->base.mr, -1);
        }
        exs__vrb_grant_release(g);
    }
    ep->int_out = 0;
    vrb_fence_drop(ep);
}
