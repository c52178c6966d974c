/* SPDX-License-Identifier: MIT */
/* Device removal (`rdma link delete`, a hot-unplugged HCA): the kernel's removal waits until
 * every process has closed the device, since rxe (like most drivers) cannot take a device
 * from under a process. The verbs provider therefore releases everything it holds on the
 * device when rdma_cm tells it the device is going, and the ctx lives on without one
 * (spec/provider.md, "Device removal"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- librdmacm's device context ----
 * librdmacm opens every device once per process and closes a context only when it has
 * noticed the device is gone (when listing devices) and no list or cm id holds it. With
 * the last device removed it never notices (rdma-core 44: the listing fails with no
 * device, before it looks for removed ones), and its open context alone keeps the
 * kernel's removal waiting. So the provider counts its ctxs per device context; when the
 * last one has released everything on a removed device and librdmacm still holds it open,
 * the context's two descriptors (commands, asynchronous events) are replaced with
 * /dev/null (dup2: the numbers stay valid for librdmacm's own close later; anything it
 * still sent there fails). Nothing of the provider's remains on the device by then. */
struct vrb_devpin {
    struct ibv_context *vc;
    unsigned users;
};
static pthread_mutex_t vrb_devpin_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vrb_devpin vrb_devpins[16];

void exs__vrb_dev_hold(struct ibv_context *vc, int delta)
{
    struct vrb_devpin *free_slot = NULL;

    pthread_mutex_lock(&vrb_devpin_lock);
    for (unsigned i = 0; i < EXS_ARRAY_SIZE(vrb_devpins); i++) {
        struct vrb_devpin *d = &vrb_devpins[i];

        if (d->vc == vc && d->users) {
            d->users = (unsigned)((int)d->users + delta);
            if (!d->users)
                d->vc = NULL;
            pthread_mutex_unlock(&vrb_devpin_lock);
            return;
        }
        if (!d->users && !free_slot)
            free_slot = d;
    }
    if (delta > 0 && free_slot) {
        free_slot->vc = vc;
        free_slot->users = (unsigned)delta;
    }
    pthread_mutex_unlock(&vrb_devpin_lock);
}

/* The files behind the device context's descriptors, to tell them from whatever takes
 * the same numbers once librdmacm closed them. */
static void vrb_dev_note(struct vrb_ctx *ctx)
{
    ctx->gone_fd[0] = ctx->verbs->cmd_fd;
    ctx->gone_fd[1] = ctx->verbs->async_fd;
    for (int i = 0; i < 2; i++)
        if (ctx->gone_fd[i] < 0 || fstat(ctx->gone_fd[i], &ctx->gone_st[i]) != 0)
            ctx->gone_fd[i] = -1;
}

/* dev_lock held for writing, everything on the device released: give back this ctx's
 * holds (its device list; its count among the device context's users). */
static void vrb_dev_release(struct vrb_ctx *ctx)
{
    unsigned left = 1; /* not counted (more device contexts than slots): never the last */

    vrb_dev_note(ctx);
    pthread_mutex_lock(&vrb_devpin_lock);
    for (unsigned i = 0; i < EXS_ARRAY_SIZE(vrb_devpins); i++) {
        struct vrb_devpin *d = &vrb_devpins[i];

        if (d->vc == ctx->verbs && d->users) {
            left = --d->users;
            if (!left)
                d->vc = NULL;
        }
    }
    pthread_mutex_unlock(&vrb_devpin_lock);
    ctx->gone_last = !left;
    rdma_free_devices(ctx->devlist);
    ctx->devlist = NULL;
    ctx->gone_verbs = ctx->verbs;
    ctx->verbs = NULL;
}

/* librdmacm no longer lists the device: when this ctx was its last user here and the
 * context's descriptors still name the device's files, replace them (above). */
static void vrb_dev_unpin(struct vrb_ctx *ctx)
{
    int null = -1, done = 0;

    if (!ctx->gone_last)
        return;
    for (int i = 0; i < 2; i++) {
        struct stat st;

        if (ctx->gone_fd[i] < 0 || fstat(ctx->gone_fd[i], &st) != 0 ||
            st.st_dev != ctx->gone_st[i].st_dev || st.st_ino != ctx->gone_st[i].st_ino)
            continue; /* closed by librdmacm (the number may be another file's now) */
        if (null < 0)
            null = exs__nc_open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0 && dup2(null, ctx->gone_fd[i]) >= 0)
            done++;
    }
    if (null >= 0)
        exs__nc_close(null);
    EXS_INFO(PROV, "ctx %p: the removed device's context %s", (void *)ctx,
             done ? "was still open in librdmacm: its descriptors now point at /dev/null"
                  : "was closed by librdmacm");
}

static void vrb_flush_kept(struct vrb_ep *ep, uint64_t seq_bits, uint64_t wr_id, uint8_t opcode,
                           struct vrb_kept *k)
{
    memset(k, 0, sizeof(*k));
    k->cqe.ep = &ep->base;
    k->cqe.wr_id = wr_id;
    k->cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
    k->cqe.opcode = (seq_bits & VRB_RECV_BIT) ? EXS_PROV_WC_RECV : exs__prov_wr_wc_opcode(opcode);
    k->retire = (seq_bits & VRB_RECV_BIT) | ((seq_bits & VRB_SEQ_MASK) + 1);
}

static void vrb_keep(struct vrb_ctx *ctx, const struct vrb_kept *k)
{
    if (exs__vrb_ring_push(ctx, k))
        EXS_ERR(PROV, "ctx %p: flushed completion of ep %p (wr_id %llu) lost: no memory",
                (void *)ctx, (void *)k->cqe.ep, (unsigned long long)k->cqe.wr_id);
}

void exs__vrb_flush_push(struct vrb_ctx *ctx, struct vrb_ep *ep, uint64_t seq_bits, uint64_t wr_id,
                         uint8_t opcode)
{
    struct vrb_kept k;

    vrb_flush_kept(ep, seq_bits, wr_id, opcode, &k);
    exs__lite_lock_st(&ctx->lock);
    vrb_keep(ctx, &k);
    exs__lite_unlock_st(&ctx->lock);
    exs__vrb_wake(ctx);
}

/* ctx->lock and ep->lock held: what the device would have flushed of ep, kept in order
 * after the completions already kept; its QP destroyed. */
static void vrb_ep_gone_locked(struct vrb_ctx *ctx, struct vrb_ep *ep)
{
    uint64_t sq_from = ep->sq_head, rq_from = ep->rq_head;
    struct vrb_kept k;
    unsigned answers;

    /* completions kept but not returned yet retire their slots only when returned */
    for (uint32_t i = 0; i < ctx->ring_count; i++) {
        const struct vrb_kept *c = &ctx->ring[(ctx->ring_head + i) % ctx->ring_cap];

        if (c->cqe.ep != &ep->base || !c->retire)
            continue;
        if (c->retire & VRB_RECV_BIT)
            rq_from = EXS_MAX(rq_from, c->retire & VRB_SEQ_MASK);
        else
            sq_from = EXS_MAX(sq_from, c->retire & VRB_SEQ_MASK);
    }
    __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
    /* deferred requests have their slots: flushed below with the others */
    exs__vrb_held_drop_locked(ep);
    for (uint64_t s = ep->sq_head; s < ep->sq_tail; s++)
        ep->sq[s & ep->sq_mask].synth = 0;
    __atomic_store_n(&ep->synth_out, 0, __ATOMIC_RELAXED);
    for (uint64_t s = sq_from; s < ep->sq_tail; s++) {
        const struct vrb_swr *w = &ep->sq[s & ep->sq_mask];

        vrb_flush_kept(ep, s, w->wr_id, w->opcode, &k);
        vrb_keep(ctx, &k);
    }
    for (uint64_t s = rq_from; s < ep->rq_tail; s++) {
        vrb_flush_kept(ep, VRB_RECV_BIT | s, ep->rq[s & ep->rq_mask].wr_id, 0, &k);
        vrb_keep(ctx, &k);
    }
    answers = exs__vrb_grants_gone(ep);
    while (answers--) {
        /* a grant_settle that said -EBUSY is answered: its bind flushed */
        memset(&k, 0, sizeof(k));
        k.cqe.ep = &ep->base;
        k.cqe.opcode = EXS_PROV_WC_GRANT;
        vrb_keep(ctx, &k);
    }
    if (ep->qp && VRB_NC(ibv_destroy_qp(ep->qp)))
        EXS_WARN(PROV, "ep %p: ibv_destroy_qp: %m", (void *)ep);
    ep->qp = NULL;
}

/* cm_lock held: the cm ids on the device go (rdma_destroy_id returns at once: the event
 * that told the removal is acked), and each connection of an ep is ended. */
static void vrb_ids_gone(struct vrb_ctx *ctx)
{
    struct exs_list *pos, *rp;

    exs_list_for_each(pos, &ctx->listeners)
    {
        struct vrb_listener *lis = exs_list_entry(pos, struct vrb_listener, link);

        exs_list_for_each(rp, &lis->reqs)
        {
            struct vrb_req *req = exs_list_entry(rp, struct vrb_req, link);

            req->broken = 1;
            if (req->id) {
                req->id->context = NULL;
                VRB_NC(rdma_destroy_id(req->id));
                req->id = NULL;
            }
        }
        if (lis->id) {
            lis->id->context = NULL;
            VRB_NC(rdma_destroy_id(lis->id));
            lis->id = NULL;
        }
    }
    if (ctx->watch_id) {
        VRB_NC(rdma_destroy_id(ctx->watch_id));
        ctx->watch_id = NULL;
    }
    exs__lite_lock_st(&ctx->lock);
    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);
        struct exs_prov_cm_event ev;

        if (!ep->id)
            continue;
        ep->id->context = NULL;
        VRB_NC(rdma_destroy_id(ep->id));
        ep->id = NULL;
        if (ep->disc_sent)
            continue;
        ep->disc_sent = 1;
        EXS_CNT_INC(ctx->cnt.disconnects);
        memset(&ev, 0, sizeof(ev));
        ev.type = ep->active && !ep->up ? EXS_PROV_CM_UNREACHABLE : EXS_PROV_CM_DISCONNECTED;
        ev.ep = &ep->base;
        ev.status = -ENODEV;
        exs__vrb_cm_push_locked(ctx, &ev);
    }
    exs__lite_unlock_st(&ctx->lock);
}

void exs__vrb_device_gone(struct vrb_ctx *ctx)
{
    struct exs_list *pos;
    struct ibv_cq *cq;
    void *cq_ctx;

    if (vrb_gone(ctx))
        return;
    EXS_WARN(PROV,
             "ctx %p: device %s removed: its connections end (ENODEV), everything on it is "
             "released",
             (void *)ctx, ibv_get_device_name(ctx->verbs->device));
    EXS_CNT_INC(ctx->cnt.device_removals);
    /* no registration, deregistration or grant runs meanwhile, and none after */
    pthread_rwlock_wrlock(&ctx->dev_lock);
    __atomic_store_n(&ctx->gone, 1, __ATOMIC_RELEASE);
    vrb_ids_gone(ctx);

    exs__lite_lock_st(&ctx->lock);
    exs__vrb_cq_drain_locked(ctx);
    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);

        exs__lite_lock_st(&ep->lock);
        vrb_ep_gone_locked(ctx, ep);
        exs__lite_unlock_st(&ep->lock);
    }
    exs__vrb_qpc_close(&ctx->qpc);
    /* every event read is acked, else ibv_destroy_cq waits for it */
    exs__vrb_cq_ack_all(ctx);
    while (vrb_get_cq_event(ctx->ch, &cq, &cq_ctx) == 0)
        ibv_ack_cq_events(cq, 1);
    if (VRB_NC(ibv_destroy_cq(ctx->cq)))
        EXS_WARN(PROV, "ctx %p: ibv_destroy_cq: %m", (void *)ctx);
    ctx->cq = NULL;
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->ch->fd, NULL);
    if (VRB_NC(ibv_destroy_comp_channel(ctx->ch)))
        EXS_WARN(PROV, "ctx %p: ibv_destroy_comp_channel: %m", (void *)ctx);
    ctx->ch = NULL;
    exs__lite_unlock_st(&ctx->lock);

    exs__vrb_mr_gone(ctx);
    exs__vrb_fence_release(ctx);
    if (VRB_NC(ibv_dealloc_pd(ctx->pd)))
        EXS_WARN(PROV, "ctx %p: ibv_dealloc_pd: %m", (void *)ctx);
    ctx->pd = NULL;
    vrb_dev_release(ctx);
    pthread_rwlock_unlock(&ctx->dev_lock);
    exs__vrb_gone_ask(ctx);
    exs__vrb_wake(ctx);
}

void exs__vrb_gone_ask(struct vrb_ctx *ctx)
{
    struct ibv_context **list;
    int listed = 0;

    if (!ctx->gone_verbs)
        return;
    list = VRB_NC(rdma_get_devices(NULL));
    for (int i = 0; list && list[i]; i++)
        listed |= list[i] == ctx->gone_verbs;
    if (list)
        rdma_free_devices(list);
    if (listed && ++ctx->gone_asks < 50)
        return; /* asked again in 100 ms */
    ctx->gone_verbs = NULL;
    if (!listed)
        vrb_dev_unpin(ctx);
}
