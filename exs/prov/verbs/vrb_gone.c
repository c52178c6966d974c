/* SPDX-License-Identifier: MIT */
/* Device removal (`rdma link delete`, a hot-unplugged HCA): the kernel's removal waits until
 * every process has closed the device, since rxe (like most drivers) cannot take a device
 * from under a process. The verbs provider therefore releases everything it holds on the
 * device when rdma_cm tells it the device is going, and the ctx lives on without one
 * (spec/provider.md, "Device removal"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

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
    pthread_mutex_lock(&ctx->lock);
    vrb_keep(ctx, &k);
    pthread_mutex_unlock(&ctx->lock);
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
    for (uint64_t s = sq_from; s < ep->sq_tail; s++) {
        const struct vrb_swr *w = &ep->sq[s % ep->sq_cap];

        vrb_flush_kept(ep, s, w->wr_id, w->opcode, &k);
        vrb_keep(ctx, &k);
    }
    for (uint64_t s = rq_from; s < ep->rq_tail; s++) {
        vrb_flush_kept(ep, VRB_RECV_BIT | s, ep->rq[s % ep->rq_cap].wr_id, 0, &k);
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
    if (ep->qp && ibv_destroy_qp(ep->qp))
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
                rdma_destroy_id(req->id);
                req->id = NULL;
            }
        }
        if (lis->id) {
            lis->id->context = NULL;
            rdma_destroy_id(lis->id);
            lis->id = NULL;
        }
    }
    if (ctx->watch_id) {
        rdma_destroy_id(ctx->watch_id);
        ctx->watch_id = NULL;
    }
    pthread_mutex_lock(&ctx->lock);
    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);
        struct exs_prov_cm_event ev;

        if (!ep->id)
            continue;
        ep->id->context = NULL;
        rdma_destroy_id(ep->id);
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
    pthread_mutex_unlock(&ctx->lock);
}

void exs__vrb_device_gone(struct vrb_ctx *ctx)
{
    struct exs_list *pos;
    struct ibv_context **any;
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

    pthread_mutex_lock(&ctx->lock);
    exs__vrb_cq_drain_locked(ctx);
    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);

        pthread_mutex_lock(&ep->lock);
        vrb_ep_gone_locked(ctx, ep);
        pthread_mutex_unlock(&ep->lock);
    }
    exs__vrb_qpc_close(&ctx->qpc);
    /* every event read is acked, else ibv_destroy_cq waits for it */
    while (ibv_get_cq_event(ctx->ch, &cq, &cq_ctx) == 0)
        ibv_ack_cq_events(cq, 1);
    if (ibv_destroy_cq(ctx->cq))
        EXS_WARN(PROV, "ctx %p: ibv_destroy_cq: %m", (void *)ctx);
    ctx->cq = NULL;
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->ch->fd, NULL);
    if (ibv_destroy_comp_channel(ctx->ch))
        EXS_WARN(PROV, "ctx %p: ibv_destroy_comp_channel: %m", (void *)ctx);
    ctx->ch = NULL;
    pthread_mutex_unlock(&ctx->lock);

    exs__vrb_mr_gone(ctx);
    if (ibv_dealloc_pd(ctx->pd))
        EXS_WARN(PROV, "ctx %p: ibv_dealloc_pd: %m", (void *)ctx);
    ctx->pd = NULL;
    /* librdmacm closes its device context once it knows the device is gone (it looks when
     * asked for the list) and the last hold on it, ours, is given back */
    any = rdma_get_devices(NULL);
    if (any)
        rdma_free_devices(any);
    rdma_free_devices(ctx->devlist);
    ctx->devlist = NULL;
    ctx->verbs = NULL;
    pthread_rwlock_unlock(&ctx->dev_lock);
    exs__vrb_wake(ctx);
}
