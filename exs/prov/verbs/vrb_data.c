/* SPDX-License-Identifier: MIT */
/* Verbs provider data path: post_send / post_recv onto the RC QP, work completions to cqes. */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

enum exs_prov_wc_status exs__vrb_wc_status(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return EXS_PROV_WC_SUCCESS;
    case IBV_WC_LOC_LEN_ERR:
        return EXS_PROV_WC_LOC_LEN_ERR;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_MW_BIND_ERR:
        return EXS_PROV_WC_LOC_PROT_ERR;
    case IBV_WC_WR_FLUSH_ERR:
        return EXS_PROV_WC_WR_FLUSH_ERR;
    case IBV_WC_REM_ACCESS_ERR:
        return EXS_PROV_WC_REM_ACCESS_ERR;
    case IBV_WC_REM_INV_REQ_ERR:
        return EXS_PROV_WC_REM_INV_REQ_ERR;
    case IBV_WC_REM_OP_ERR:
        return EXS_PROV_WC_REM_OP_ERR;
    case IBV_WC_RETRY_EXC_ERR:
        return EXS_PROV_WC_RETRY_EXC_ERR;
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return EXS_PROV_WC_RNR_RETRY_EXC_ERR;
    default:
        return EXS_PROV_WC_GENERAL_ERR;
    }
}

static struct vrb_ep *vrb_ep_lookup(struct vrb_ctx *ctx, uint32_t epid)
{
    struct exs_list *pos, *h = &ctx->ep_hash[epid % VRB_EP_HASH];

    exs_list_for_each(pos, h)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, hlink);

        if (ep->epid == epid)
            return ep;
    }
    return NULL;
}

/* ctx->lock held: the queue's head moves up to upto. Every write of a head is made under
 * ctx->lock (here), so this read of it is not racy; the posters read it without
 * ctx->lock (acquire): the release orders the consumer's reads of the slots before it,
 * so a poster reuses a slot only once its completion was read out. */
static void vrb_head_up(uint64_t *head, uint64_t upto)
{
    if (upto > *head)
        __atomic_store_n(head, upto, __ATOMIC_RELEASE);
}

void exs__vrb_retire(struct exs_prov_ep *e, uint64_t retire)
{
    struct vrb_ep *ep = vrb_ep_of(e);

    vrb_head_up((retire & VRB_RECV_BIT) ? &ep->rq_head : &ep->sq_head, retire & VRB_SEQ_MASK);
}

/* ctx->lock and ep->lock held; a completion of ep's send request at seq came: the requests
 * before it that were SIGNALED but posted unsignaled completed without one (RC completes
 * in order, and an error or a flush has a completion of its own), so theirs are made now,
 * kept in order; seq's own mark goes (its completion is the device's). Returns how many. */
static int vrb_synth_keep(struct vrb_ctx *ctx, struct vrb_ep *ep, uint64_t seq)
{
    int made = 0;

    for (uint64_t t = ep->sq_head; t <= seq && ep->synth_out; t++) {
        struct vrb_swr *s = &ep->sq[t & ep->sq_mask];
        struct vrb_kept k;

        if (!s->synth)
            continue;
        s->synth = 0;
        __atomic_store_n(&ep->synth_out, ep->synth_out - 1, __ATOMIC_RELAXED);
        if (t == seq)
            break;
        memset(&k, 0, sizeof(k));
        k.cqe.ep = &ep->base;
        k.cqe.wr_id = s->wr_id;
        k.cqe.status = EXS_PROV_WC_SUCCESS;
        k.cqe.opcode = exs__prov_wr_wc_opcode(s->opcode);
        if (s->opcode == EXS_PROV_WR_RDMA_READ)
            k.cqe.byte_len = s->len;
        k.retire = t + 1;
        /* the slot is retired when ctx_poll returns it */
        if (exs__vrb_ring_push(ctx, &k) == 0)
            made++;
        else
            EXS_ERR(PROV, "ctx %p: completion of ep %p (wr_id %llu) lost: no memory", (void *)ctx,
                    (void *)ep, (unsigned long long)s->wr_id);
    }
    return made;
}

/* ctx->lock held: may the completion of ep's request at seq be converted without
 * ep->lock? Only a success, of a slot that is outstanding and published: the poster wrote
 * the slot before its release of rq_tail / sq_posted (after the verbs post), and no other
 * thread reads or moves the head (ctx->lock). With no marked slot (synth_out 0; read
 * after the acquire, so a mark made before the post is seen) no completion is to be made
 * before it. Anything else (an error, a flush, marks, a completion polled before its
 * poster published the slot, a stale or foreign one) goes under ep->lock, which orders
 * it after the poster's whole post, and is checked there. */
static int vrb_wc_unlocked(struct vrb_ep *ep, const struct ibv_wc *wc, uint64_t seq)
{
    if (wc->status != IBV_WC_SUCCESS)
        return 0;
    if (wc->wr_id & VRB_RECV_BIT)
        return seq >= ep->rq_head && seq < __atomic_load_n(&ep->rq_tail, __ATOMIC_ACQUIRE);
    return seq >= ep->sq_head && seq < __atomic_load_n(&ep->sq_posted, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&ep->synth_out, __ATOMIC_RELAXED);
}

/* ep->lock held (or vrb_wc_unlocked): seq is one of the queue's outstanding slots. */
static int vrb_wc_in_window(const struct vrb_ep *ep, const struct ibv_wc *wc, uint64_t seq)
{
    if (wc->wr_id & VRB_RECV_BIT)
        return seq >= ep->rq_head && seq < ep->rq_tail;
    return seq >= ep->sq_head && seq < ep->sq_tail;
}

/* A window bind's completion (ctx->lock held): the provider's own, shown to ctx_poll's
 * caller only as the answer to a grant_settle that waited for it (EXS_PROV_WC_GRANT), and
 * not a retirement of the protocol's unsignaled requests (those stay counted until a
 * completion of their own, which errs on the safe side). */
static __attribute__((noinline)) int vrb_wc_internal(struct vrb_ep *ep, const struct ibv_wc *wc,
                                                     struct exs_prov_cqe *cqe, uint64_t *retire_p)
{
    struct vrb_grant *rel;
    int settled = 0;

    exs__lite_lock_st(&ep->lock);
    rel = exs__vrb_int_complete(ep, wc, &settled);
    exs__lite_unlock_st(&ep->lock);
    exs__vrb_grant_release(rel);
    if (!settled)
        return -1;
    /* a grant_settle that said -EBUSY is answered (no slot to retire) */
    memset(cqe, 0, sizeof(*cqe));
    cqe->ep = &ep->base;
    cqe->opcode = EXS_PROV_WC_GRANT;
    if (retire_p)
        *retire_p = 0;
    return 0;
}

/* The cqe of ep's request at seq, and its slot's retirement: into *retire_p, else the
 * head moves now (unless made: the cqe is then kept behind the completions made before
 * it, and its slot retired as it is returned). Unlocked (vrb_wc_unlocked) or under
 * ep->lock; inline in both, so that the success path (ok: a constant 1 there, the error
 * branches gone) makes no call. ok: wc->status == IBV_WC_SUCCESS. */
static inline __attribute__((always_inline)) void
vrb_wc_fill(struct vrb_ctx *ctx, struct vrb_ep *ep, const struct ibv_wc *wc, uint64_t seq,
            struct exs_prov_cqe *cqe, uint64_t *retire_p, int made, int ok)
{
    *cqe = (struct exs_prov_cqe){
        .ep = &ep->base,
        .status = ok ? EXS_PROV_WC_SUCCESS : exs__vrb_wc_status(wc->status),
    };
    if (wc->wr_id & VRB_RECV_BIT) {
        const struct vrb_rwr *r = &ep->rq[seq & ep->rq_mask];

        cqe->wr_id = r->wr_id;
        cqe->opcode = EXS_PROV_WC_RECV;
        if (ok) {
            if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
                cqe->opcode = EXS_PROV_WC_RECV_RDMA_WITH_IMM;
            cqe->byte_len = wc->byte_len;
            if (wc->wc_flags & IBV_WC_WITH_IMM) {
                cqe->imm_data = ntohl(wc->imm_data);
                cqe->flags |= EXS_PROV_WC_WITH_IMM;
            }
        } else if (wc->status == IBV_WC_LOC_QP_OP_ERR || wc->status == IBV_WC_LOC_PROT_ERR) {
            cqe->status = exs__vrb_mr_covers(ctx, r->sge, r->nsge, 1) ? EXS_PROV_WC_LOC_LEN_ERR
                                                                      : EXS_PROV_WC_LOC_PROT_ERR;
        }
        if (retire_p)
            *retire_p = VRB_RECV_BIT | (seq + 1);
        else
            vrb_head_up(&ep->rq_head, seq + 1);
    } else {
        const struct vrb_swr *s = &ep->sq[seq & ep->sq_mask];

        cqe->wr_id = s->wr_id;
        cqe->opcode = exs__prov_wr_wc_opcode(s->opcode);
        if (ok) {
            if (s->opcode == EXS_PROV_WR_RDMA_READ)
                cqe->byte_len = s->len;
        } else if (wc->status == IBV_WC_REM_OP_ERR) {
            /* rxe NAKs a SEND longer than the receive as a remote operation error; the
             * contract calls a SEND the peer could not place REM_INV_REQ_ERR */
            if (s->opcode == EXS_PROV_WR_SEND || s->opcode == EXS_PROV_WR_SEND_WITH_IMM)
                cqe->status = EXS_PROV_WC_REM_INV_REQ_ERR;
        } else if (wc->status == IBV_WC_LOC_QP_OP_ERR &&
                   !exs__vrb_mr_covers(ctx, s->sge, s->nsge, s->opcode == EXS_PROV_WR_RDMA_READ)) {
            cqe->status = EXS_PROV_WC_LOC_PROT_ERR;
        }
        /* retires the unsignaled requests posted before it, as hardware does */
        if (retire_p)
            *retire_p = seq + 1;
        else if (!made)
            vrb_head_up(&ep->sq_head, seq + 1);
    }
}

/* Everything but the unlocked success: under ep->lock, checked against the queue's
 * outstanding slots (a stale or foreign completion is dropped and counted), the
 * completions made before it first, an error ends the ep. Out of line: the success path
 * keeps a small frame. */
static __attribute__((noinline)) int vrb_wc_locked(struct vrb_ctx *ctx, struct vrb_ep *ep,
                                                   const struct ibv_wc *wc, uint64_t seq,
                                                   struct exs_prov_cqe *cqe, uint64_t *retire_p)
{
    int made = 0;

    exs__lite_lock_st(&ep->lock);
    EXS_CNT_INC(ctx->cnt.wc_locked);
    if (!vrb_wc_in_window(ep, wc, seq)) {
        exs__lite_unlock_st(&ep->lock);
        EXS_CNT_INC(ctx->cnt.stale_cqes);
        return -1;
    }
    if (!(wc->wr_id & VRB_RECV_BIT) && ep->synth_out)
        made = vrb_synth_keep(ctx, ep, seq);
    vrb_wc_fill(ctx, ep, wc, seq, cqe, retire_p, made, wc->status == IBV_WC_SUCCESS);
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR) {
            EXS_CNT_INC(ctx->cnt.wc_errors);
            EXS_DBG(PROV, "ep %p: completion error %s (vendor %#x) of %s wr_id %llu (%u bytes)",
                    (void *)ep, ibv_wc_status_str(wc->status), wc->vendor_err,
                    (wc->wr_id & VRB_RECV_BIT) ? "receive" : exs__prov_wc_opcode_str(cqe->opcode),
                    (unsigned long long)cqe->wr_id,
                    (wc->wr_id & VRB_RECV_BIT) ? 0u : ep->sq[seq & ep->sq_mask].len);
        }
        __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
    }
    exs__lite_unlock_st(&ep->lock);
    if (made && !retire_p) {
        /* behind the completions made for the requests before it */
        struct vrb_kept k = {.cqe = *cqe, .retire = seq + 1};

        exs__vrb_ring_keep(ctx, &k);
        return 1;
    }
    return 0;
}

int exs__vrb_wc_convert(struct vrb_ctx *ctx, const struct ibv_wc *wc, struct exs_prov_cqe *cqe,
                        uint64_t *retire_p)
{
    uint64_t seq = wc->wr_id & VRB_SEQ_MASK;
    struct vrb_ep *ep = vrb_ep_lookup(ctx, (uint32_t)(wc->wr_id >> VRB_EPID_SHIFT));

    if (!ep) {
        EXS_CNT_INC(ctx->cnt.stale_cqes);
        return -1;
    }
    if (wc->wr_id & VRB_INT_BIT)
        return vrb_wc_internal(ep, wc, cqe, retire_p);
    if (!vrb_wc_unlocked(ep, wc, seq))
        return vrb_wc_locked(ctx, ep, wc, seq, cqe, retire_p);
    vrb_wc_fill(ctx, ep, wc, seq, cqe, retire_p, 0, 1);
    return 0;
}

/* After posting onto a QP in ERROR: a modify to ERR makes every driver flush what was
 * just posted (rxe's user-mapped receive queue is otherwise looked at only on its next
 * state change). */
static void vrb_kick_flush(struct vrb_ep *ep)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    if (ep->qp)
        (void)VRB_NC(ibv_modify_qp(ep->qp, &a, IBV_QP_STATE));
}

void exs__vrb_ep_kill_locked(struct vrb_ep *ep)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    int ret;

    if (!ep->qp) { /* released with the device */
        __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
        return;
    }
    exs__vrb_held_post_locked(ep); /* deferred requests go first: flushed with the rest */
    __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
    ret = VRB_NC(ibv_modify_qp(ep->qp, &a, IBV_QP_STATE));
    if (ret)
        EXS_ERR(PROV, "ep %p: QP to ERR: %s", (void *)ep, strerror(ret));
}

/* Inline: one call less on both posting paths. */
static inline __attribute__((always_inline)) int vrb_sge_convert(struct vrb_ctx *ctx,
                                                                 const struct exs_prov_sge *in,
                                                                 int n, struct ibv_sge *out,
                                                                 uint64_t *total_p)
{
    uint64_t total = 0;

    if (n < 0 || (uint32_t)n > ctx->base.caps.max_sge || (n && !in))
        return -EINVAL;
    for (int i = 0; i < n; i++) {
        out[i].addr = in[i].addr;
        out[i].length = in[i].length;
        out[i].lkey = in[i].lkey;
        total += in[i].length;
    }
    *total_p = total;
    return 0;
}

/* The request at slot seq (lock held): its wr_id, for the completion, and the first sges. */
static void vrb_swr_fill(struct vrb_ep *ep, uint64_t seq, const struct exs_prov_send_wr *wr,
                         uint64_t total)
{
    struct vrb_swr *s = &ep->sq[seq & ep->sq_mask];

    s->wr_id = wr->wr_id;
    s->len = (uint32_t)total;
    s->opcode = (uint8_t)wr->opcode;
    s->synth = 0;
    s->nsge = (wr->flags & EXS_PROV_SEND_INLINE) ? 0 : (uint8_t)EXS_MIN(wr->num_sge, VRB_SLOT_SGE);
    for (uint8_t i = 0; i < s->nsge; i++) /* mostly one: no memcpy call */
        s->sge[i] = wr->sg_list[i];
}

/* May wr wait in ep's batch (lock held)? Only on a live QP, with room for its sges, and
 * with storage for the batch (allocated at the first deferred request). */
static int vrb_can_hold(struct vrb_ep *ep, const struct exs_prov_send_wr *wr, int state)
{
    if (!(wr->flags & EXS_PROV_SEND_DEFER) || state != EXS_PROV_EP_CONNECTED || !ep->qp ||
        wr->num_sge > (int)VRB_HELD_SGE)
        return 0;
    if (!ep->held) {
        ep->held = calloc(VRB_HELD_MAX, sizeof(*ep->held));
        ep->held_inl = malloc((size_t)VRB_HELD_MAX * EXS_MAX(ep->base.attr.max_inline, 1u));
        if (!ep->held || !ep->held_inl) {
            free(ep->held);
            free(ep->held_inl);
            ep->held = NULL;
            ep->held_inl = NULL;
            return 0;
        }
    }
    return 1;
}

/* Keep w (built on the stack, its sges in sge) in ep's batch (lock held): sges and inline
 * bytes copied, as the caller may reuse them once post_send returns. */
static void vrb_hold(struct vrb_ep *ep, const struct ibv_send_wr *w, const struct ibv_sge *sge)
{
    struct vrb_held *h;

    if (ep->held_n == VRB_HELD_MAX)
        exs__vrb_held_post_locked(ep);
    h = &ep->held[ep->held_n];
    h->w = *w;
    h->w.next = NULL;
    h->w.sg_list = w->num_sge ? h->sge : NULL;
    if (w->send_flags & IBV_SEND_INLINE) {
        uint8_t *dst = ep->held_inl + (size_t)ep->held_n * ep->base.attr.max_inline;
        uint32_t off = 0;

        for (int i = 0; i < w->num_sge; i++) {
            memcpy(dst + off, (const void *)(uintptr_t)sge[i].addr, sge[i].length);
            off += sge[i].length;
        }
        h->sge[0] = (struct ibv_sge){.addr = (uintptr_t)dst, .length = off};
        h->w.num_sge = w->num_sge ? 1 : 0;
    } else if (w->num_sge) {
        memcpy(h->sge, sge, (size_t)w->num_sge * sizeof(*sge));
    }
    /* held_n: written under ep->lock, read without it by held_post_all (atomic) */
    __atomic_store_n(&ep->held_n, ep->held_n + 1, __ATOMIC_RELAXED);
    if (ep->held_n == 1)
        __atomic_add_fetch(&ep->ctx->held_eps, 1, __ATOMIC_RELAXED);
    EXS_CNT_INC(ep->ctx->cnt.sends_deferred);
}

int exs__vrb_post_send(struct exs_prov_ep *e, const struct exs_prov_send_wr *wr)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx = ep->ctx;
    struct ibv_sge sge[VRB_MAX_SGE];
    struct ibv_send_wr w, *bad = NULL;
    uint64_t total, seq;
    int state, ret, hold;

    if (!wr || (unsigned)wr->opcode > EXS_PROV_WR_RDMA_READ)
        return -EINVAL;
    ret = vrb_sge_convert(ctx, wr->sg_list, wr->num_sge, sge, &total);
    if (ret)
        return ret;
    if (total > ctx->base.caps.max_msg_size)
        return -EINVAL;
    if ((wr->flags & EXS_PROV_SEND_INLINE) &&
        (wr->opcode == EXS_PROV_WR_RDMA_READ || total > ep->base.attr.max_inline))
        return -EINVAL;
    /* up to the opcode-specific union: what follows it (XRC's remote SRQ, bind_mw, tso)
     * is read by a driver only for XRC QPs and the BIND_MW and TSO opcodes, never posted
     * here (and a 128-byte memset was a sixth of this function's own instructions) */
    memset(&w, 0, offsetof(struct ibv_send_wr, qp_type));
    w.sg_list = wr->num_sge ? sge : NULL;
    w.num_sge = wr->num_sge;
    switch (wr->opcode) {
    case EXS_PROV_WR_SEND:
        w.opcode = IBV_WR_SEND;
        break;
    case EXS_PROV_WR_SEND_WITH_IMM:
        w.opcode = IBV_WR_SEND_WITH_IMM;
        w.imm_data = htonl(wr->imm_data);
        break;
    case EXS_PROV_WR_RDMA_WRITE:
        w.opcode = IBV_WR_RDMA_WRITE;
        break;
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.imm_data = htonl(wr->imm_data);
        break;
    case EXS_PROV_WR_RDMA_READ:
        w.opcode = IBV_WR_RDMA_READ;
        break;
    }
    if (wr->opcode >= EXS_PROV_WR_RDMA_WRITE) {
        w.wr.rdma.remote_addr = wr->remote_addr;
        w.wr.rdma.rkey = wr->rkey;
    }
    if (wr->flags & EXS_PROV_SEND_SIGNALED)
        w.send_flags |= IBV_SEND_SIGNALED;
    if (wr->flags & EXS_PROV_SEND_INLINE)
        w.send_flags |= IBV_SEND_INLINE;
    if (wr->flags & EXS_PROV_SEND_FENCE)
        w.send_flags |= IBV_SEND_FENCE;

    exs__lite_lock_st(&ep->lock);
    state = __atomic_load_n(&ep->state, __ATOMIC_RELAXED);
    if (state == EXS_PROV_EP_IDLE || state == EXS_PROV_EP_CONNECTING) {
        exs__lite_unlock_st(&ep->lock);
        return -ENOTCONN;
    }
    if (ep->sq_tail - __atomic_load_n(&ep->sq_head, __ATOMIC_ACQUIRE) >=
        ep->base.attr.max_send_wr) {
        exs__lite_unlock_st(&ep->lock);
        EXS_CNT_INC(ctx->cnt.sq_full);
        return -ENOMEM;
    }
    seq = ep->sq_tail;
    vrb_swr_fill(ep, seq, wr, total);
    w.wr_id = ((uint64_t)ep->epid << VRB_EPID_SHIFT) | (seq & VRB_SEQ_MASK);
    if (!ep->qp) {
        /* the device was removed: flushed, as a QP in error would */
        ep->sq_tail = seq + 1;
        exs__lite_unlock_st(&ep->lock);
        exs__vrb_flush_push(ctx, ep, seq, wr->wr_id, (uint8_t)wr->opcode);
        return 0;
    }
    hold = vrb_can_hold(ep, wr, state);
    if (ep->held_n && !hold && wr->num_sge > (int)VRB_HELD_SGE)
        exs__vrb_held_post_locked(ep); /* the batch first, then this one on its own */
    if (hold || ep->held_n) {
        /* it joins the batch (behind deferred ones: so does a request that does not
         * defer), which goes out now unless it defers */
        vrb_hold(ep, &w, sge);
        ep->sq_tail = seq + 1;
        if (!hold)
            exs__vrb_held_post_locked(ep);
        exs__lite_unlock_st(&ep->lock);
        return 0;
    }
    EXS_CNT_INC(ctx->cnt.doorbells);
    ret = vrb_post_send(ep->ctx, ep->qp, &w, &bad);
    if (ret) {
        exs__lite_unlock_st(&ep->lock);
        EXS_DBG(PROV, "ep %p: ibv_post_send: %s", (void *)ep, strerror(ret));
        return ret == ENOMEM ? -ENOMEM : -ret;
    }
    ep->sq_tail = seq + 1;
    /* nothing is held (else it would have joined the batch): every slot is posted */
    __atomic_store_n(&ep->sq_posted, seq + 1, __ATOMIC_RELEASE);
    if (state == EXS_PROV_EP_ERROR)
        vrb_kick_flush(ep);
    exs__lite_unlock_st(&ep->lock);
    EXS_DATA(PROV, "ep %p: post_send wr_id %llu opcode %d len %llu", (void *)ep,
             (unsigned long long)wr->wr_id, (int)wr->opcode, (unsigned long long)total);
    return 0;
}

/* The batch's ibv_post_send refused bad (and left those after it): the ep ends, and they
 * are posted again into the QP in ERR, which flushes each in order with the others. */
static void vrb_held_refused_locked(struct vrb_ep *ep, struct ibv_send_wr *bad, int err)
{
    struct ibv_send_wr *bad2 = NULL;

    EXS_ERR(PROV, "ep %p: ibv_post_send of deferred requests: %s: the endpoint ends", (void *)ep,
            strerror(err));
    exs__vrb_ep_kill_locked(ep);
    for (struct ibv_send_wr *w = bad; w; w = w->next)
        w->send_flags |= IBV_SEND_SIGNALED;
    if (ep->qp && vrb_post_send(ep->ctx, ep->qp, bad, &bad2) != 0)
        EXS_ERR(PROV,
                "ep %p: deferred requests refused by the QP in ERR too: their completions "
                "are lost",
                (void *)ep);
}

void exs__vrb_held_post_locked(struct vrb_ep *ep)
{
    struct vrb_ctx *ctx = ep->ctx;
    struct ibv_send_wr *bad = NULL;
    uint32_t n = ep->held_n, anchor = 0;
    uint64_t seq0 = ep->sq_tail - n;
    int ret;

    if (!n)
        return;
    for (uint32_t i = 0; i < n; i++) {
        ep->held[i].w.next = i + 1 < n ? &ep->held[i + 1].w : NULL;
        if (ep->held[i].w.send_flags & IBV_SEND_SIGNALED)
            anchor = i;
    }
    /* every SIGNALED one before the last SIGNALED one: its completion comes with that one's */
    for (uint32_t i = 0; i < anchor; i++) {
        if (ep->held[i].w.send_flags & IBV_SEND_SIGNALED) {
            ep->held[i].w.send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
            ep->sq[(seq0 + i) & ep->sq_mask].synth = 1;
            __atomic_store_n(&ep->synth_out, ep->synth_out + 1, __ATOMIC_RELAXED);
            EXS_CNT_INC(ctx->cnt.signals_saved);
        }
    }
    __atomic_store_n(&ep->held_n, 0, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ctx->held_eps, 1, __ATOMIC_RELAXED);
    EXS_CNT_INC(ctx->cnt.doorbells);
    ret = vrb_post_send(ep->ctx, ep->qp, &ep->held[0].w, &bad);
    if (ret)
        vrb_held_refused_locked(ep, bad ? bad : &ep->held[0].w, ret);
    else if (__atomic_load_n(&ep->state, __ATOMIC_RELAXED) == EXS_PROV_EP_ERROR)
        vrb_kick_flush(ep);
    /* after the marks and the post: a completion seen below it is converted unlocked */
    __atomic_store_n(&ep->sq_posted, ep->sq_tail, __ATOMIC_RELEASE);
}

void exs__vrb_ep_flush(struct exs_prov_ep *e)
{
    struct vrb_ep *ep = vrb_ep_of(e);

    exs__lite_lock_st(&ep->lock);
    exs__vrb_held_post_locked(ep);
    exs__lite_unlock_st(&ep->lock);
}

void exs__vrb_held_post_all_locked(struct vrb_ctx *ctx)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);

        if (!__atomic_load_n(&ep->held_n, __ATOMIC_RELAXED))
            continue;
        exs__lite_lock_st(&ep->lock);
        exs__vrb_held_post_locked(ep);
        exs__lite_unlock_st(&ep->lock);
    }
}

void exs__vrb_held_drop_locked(struct vrb_ep *ep)
{
    if (ep->held_n)
        __atomic_sub_fetch(&ep->ctx->held_eps, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&ep->held_n, 0, __ATOMIC_RELAXED);
    free(ep->held);
    free(ep->held_inl);
    ep->held = NULL;
    ep->held_inl = NULL;
}

int exs__vrb_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *wr)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct ibv_sge sge[VRB_MAX_SGE];
    struct ibv_recv_wr w, *bad = NULL;
    uint64_t total, seq;
    int ret;

    if (!wr)
        return -EINVAL;
    ret = vrb_sge_convert(ep->ctx, wr->sg_list, wr->num_sge, sge, &total);
    if (ret)
        return ret;
    memset(&w, 0, sizeof(w));
    w.sg_list = wr->num_sge ? sge : NULL;
    w.num_sge = wr->num_sge;
    exs__lite_lock_st(&ep->lock);
    if (ep->rq_tail - __atomic_load_n(&ep->rq_head, __ATOMIC_ACQUIRE) >=
        ep->base.attr.max_recv_wr) {
        exs__lite_unlock_st(&ep->lock);
        return -ENOMEM;
    }
    seq = ep->rq_tail;
    {
        struct vrb_rwr *r = &ep->rq[seq & ep->rq_mask];

        r->wr_id = wr->wr_id;
        r->nsge = (uint8_t)EXS_MIN(wr->num_sge, VRB_SLOT_SGE);
        for (uint8_t i = 0; i < r->nsge; i++) /* mostly one: no memcpy call */
            r->sge[i] = wr->sg_list[i];
    }
    w.wr_id = ((uint64_t)ep->epid << VRB_EPID_SHIFT) | VRB_RECV_BIT | (seq & VRB_SEQ_MASK);
    if (!ep->qp) {
        __atomic_store_n(&ep->rq_tail, seq + 1, __ATOMIC_RELEASE);
        exs__lite_unlock_st(&ep->lock);
        exs__vrb_flush_push(ep->ctx, ep, VRB_RECV_BIT | seq, wr->wr_id, 0);
        return 0;
    }
    ret = vrb_post_recv(ep->ctx, ep->qp, &w, &bad);
    if (ret) {
        exs__lite_unlock_st(&ep->lock);
        EXS_DBG(PROV, "ep %p: ibv_post_recv: %s", (void *)ep, strerror(ret));
        return ret == ENOMEM ? -ENOMEM : -ret;
    }
    /* after the slot and the post: its completion is converted unlocked once seen below */
    __atomic_store_n(&ep->rq_tail, seq + 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&ep->state, __ATOMIC_RELAXED) == EXS_PROV_EP_ERROR)
        vrb_kick_flush(ep);
    exs__lite_unlock_st(&ep->lock);
    return 0;
}
