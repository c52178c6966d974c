/* SPDX-License-Identifier: MIT */
/* The shm provider's data path: posting into the ring, carrying out the peer's requests (one
 * copy, checked against the grant), taking the peer's answers, receiver-not-ready. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

_Static_assert(SHM_RING_MIN % SHM_SLOT == 0 && SHM_REC_HDR <= SHM_SLOT &&
                   sizeof(struct shm_rec) == SHM_REC_HDR &&
                   SHM_RING_MIN / 4 >= SHM_SLOT + SHM_RING_INLINE,
               "a record's header never wraps around the ring's end");

#if defined(__SANITIZE_THREAD__)
int exs__shm_tsan_token;
#endif

static uint32_t shm_roundup(uint32_t n)
{
    return (n + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
}

/* Helpers of the post path, inlined into each caller (the inline post folds their
 * constants: no fragment offset, one sge). */
#define SHM_INLINE static inline __attribute__((always_inline))

/* Reads of the peer's memory are taken once into locals: no later use reads it again. */
#define SHM_ONCE() __asm__ __volatile__("" ::: "memory")

/* (ring, its size: the connection's tx_ring or rx_ring and ring_bytes) */
static void shm_ring_put(uint8_t *ring, uint32_t size, uint64_t pos, const void *src, uint32_t len)
{
    uint32_t off = (uint32_t)(pos & (size - 1)), first = EXS_MIN(len, size - off);

    memcpy(ring + off, src, first);
    if (first < len)
        memcpy(ring, (const uint8_t *)src + first, len - first);
}

static void shm_ring_get(void *dst, const uint8_t *ring, uint32_t size, uint64_t pos, uint32_t len)
{
    uint32_t off = (uint32_t)(pos & (size - 1)), first = EXS_MIN(len, size - off);

    memcpy(dst, ring + off, first);
    if (first < len)
        memcpy((uint8_t *)dst + first, ring, len - first);
}

/* iovecs for bytes [off, off+limit) of n (addr, len) pairs; returns the count. */
static int shm_iov_slice(struct iovec *iov, int max, const struct shm_rsge *seg, int n,
                         uint64_t off, uint64_t limit)
{
    int k = 0;

    for (int i = 0; i < n && k < max && limit; i++) {
        uint64_t l = seg[i].len;

        if (off >= l) {
            off -= l;
            continue;
        }
        l = EXS_MIN(l - off, limit);
        iov[k].iov_base = (void *)(uintptr_t)(seg[i].addr + off);
        iov[k].iov_len = (size_t)l;
        k++;
        limit -= l;
        off = 0;
    }
    return k;
}

static int shm_sge_to_rsge(struct shm_rsge *r, const struct exs_prov_sge *sge, int n)
{
    int k = 0;

    for (int i = 0; i < n; i++)
        if (sge[i].length) {
            r[k].addr = sge[i].addr;
            r[k].len = sge[i].length;
            k++;
        }
    return k;
}

void exs__shm_conn_bell(struct shm_conn *conn)
{
    uint64_t one = 1;

    EXS_CNT_INC(conn->ctx->cnt.bells_tx);
    if (exs__nc_write(conn->bell, &one, sizeof(one)) < 0 && errno != EAGAIN)
        EXS_DBG(PROV, "shm conn %p: bell: %m", (void *)conn);
}

/* ---- completions of our requests ---- */

static enum exs_prov_wc_opcode shm_wc_opcode(uint8_t opcode)
{
    switch (opcode) {
    case EXS_PROV_WR_RDMA_WRITE:
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        return EXS_PROV_WC_RDMA_WRITE;
    case EXS_PROV_WR_RDMA_READ:
        return EXS_PROV_WC_RDMA_READ;
    default:
        return EXS_PROV_WC_SEND;
    }
}

/* nic_lock and ctx->lock held: wr (unlinked) is done with st; slots retire as on verbs. */
static void shm_wr_done_locked(struct shm_ep *ep, struct shm_wr *wr, enum exs_prov_wc_status st)
{
    if (st != EXS_PROV_WC_SUCCESS)
        ep->state = EXS_PROV_EP_ERROR; /* before anyone can poll the error */
    if (st != EXS_PROV_WC_SUCCESS || wr->signaled) {
        struct exs_prov_cqe *cqe = exs__shm_cq_nic_slot_locked(ep->ctx);

        cqe->wr_id = wr->wr_id;
        cqe->ep = &ep->base;
        cqe->status = st;
        cqe->opcode = shm_wc_opcode(wr->opcode);
        cqe->byte_len = st == EXS_PROV_WC_SUCCESS ? wr->len : 0;
        cqe->imm_data = 0;
        cqe->flags = 0;
        exs__shm_cq_nic_commit_locked(ep->ctx, ep, 0, cqe);
        ep->sq_used -= 1 + ep->sq_unretired;
        ep->sq_unretired = 0;
    } else {
        ep->sq_unretired++;
    }
    if (wr->opcode == EXS_PROV_WR_RDMA_READ && ep->reads_out)
        ep->reads_out--;
    exs__shm_wr_put_locked(ep, wr);
}

void exs__shm_wr_put_locked(struct shm_ep *ep, struct shm_wr *wr)
{
    exs__soft_pool_release_locked(&ep->wr_pool, wr, wr->pooled);
}

/* ---- posting ---- */

/* ctx->lock held: the peer's consumed position, checked; -EPROTO when it lies. */
static int shm_peer_tail_locked(struct shm_conn *conn, uint64_t *tail_p)
{
    uint64_t t = __atomic_load_n(&conn->peer->tail, __ATOMIC_ACQUIRE);

    SHM_TSAN_ACQUIRE();

    if (t - conn->peer_tail > conn->head - conn->peer_tail || t % SHM_SLOT)
        return -EPROTO;
    conn->peer_tail = t;
    *tail_p = t;
    return 0;
}

/* The record type and flags of wr (flags without INLINE and FRAG). */
static inline uint8_t shm_rec_type(const struct shm_wr *wr, uint8_t *flags)
{
    *flags = 0;
    switch (wr->opcode) {
    case EXS_PROV_WR_SEND_WITH_IMM:
        *flags = SHM_RF_IMM;
        /* fall through */
    case EXS_PROV_WR_SEND:
        return SHM_REC_SEND;
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        *flags = SHM_RF_IMM;
        /* fall through */
    case EXS_PROV_WR_RDMA_WRITE:
        return SHM_REC_WRITE;
    default:
        return SHM_REC_READ;
    }
}

/* The header of wr's record at conn->head, written in place: records start on a slot and
 * the ring is a whole number of slots, so its 32 bytes never wrap (no local copy). All but
 * its size, which publishes it (shm_publish_rec). */
SHM_INLINE void shm_rec_hdr(struct shm_conn *conn, const struct shm_ep *ep, const struct shm_wr *wr,
                            uint8_t flags, uint8_t nsge, uint32_t size)
{
    struct shm_rec *rec =
        (struct shm_rec *)(void *)(conn->tx_ring + (conn->head & conn->ring_mask));
    uint8_t f;

    rec->type = shm_rec_type(wr, &f);
    rec->flags = f | flags;
    rec->nsge = nsge;
    rec->rsvd = 0;
    rec->psn = ep->snd_nxt;
    rec->len = wr->len;
    rec->imm = wr->imm;
    rec->raddr = wr->raddr;
    rec->rkey = wr->rkey;
}

/* Publish the record of size bytes at conn->head (its header but the size and its payload
 * written): the next record's slot marked not written (its size 0: the room checks keep a
 * slot free beyond every record), then this one's size stored, sequentially consistent (a
 * sleeper's look: exs__shm_conn_kick); conn->head past it. The peer takes a record when
 * the size word at its position is not 0 (spec/provider-shm.md, "Records announce
 * themselves"). */
SHM_INLINE void shm_publish_rec(struct shm_conn *conn, const struct shm_ep *ep, uint32_t size,
                                uint32_t len)
{
    uint8_t *at = conn->tx_ring + (conn->head & conn->ring_mask);
    uint8_t *next = conn->tx_ring + ((conn->head + size) & conn->ring_mask);

    __atomic_store_n((uint32_t *)(void *)(next + offsetof(struct shm_rec, size)), 0,
                     __ATOMIC_RELAXED);
    SHM_TSAN_RELEASE();
    __atomic_store_n(&((struct shm_rec *)(void *)at)->size, size, __ATOMIC_SEQ_CST);
    conn->head += size;
    SHM_CNT_INC_OWNED(ep->ctx->cnt.recs_tx); /* (ctx->lock) */
    SHM_CNT_ADD_OWNED(ep->ctx->cnt.bytes_tx, len);
}

/* Copy bytes [off, off+n) of the sges' payload into the ring at pos. */
SHM_INLINE void shm_ring_put_sges(uint8_t *ring, uint32_t size, uint64_t pos,
                                  const struct exs_prov_sge *sge, int nsge, uint64_t off,
                                  uint64_t n)
{
    if (nsge == 1 && off + n <= sge[0].length) { /* the common post: one sge, no loop */
        shm_ring_put(ring, size, pos, (const void *)(uintptr_t)(sge[0].addr + off), (uint32_t)n);
        return;
    }
    for (int i = 0; i < nsge && n; i++) {
        uint64_t l = sge[i].length;

        if (off >= l) {
            off -= l;
            continue;
        }
        l = EXS_MIN(l - off, n);
        shm_ring_put(ring, size, pos, (const void *)(uintptr_t)(sge[i].addr + off), (uint32_t)l);
        pos += l;
        n -= l;
        off = 0;
    }
}

/* ctx->lock held: a SEND or WRITE too large to be inline goes through the ring in fragments
 * of conn->frag_bytes (the last one shorter), each copied from the sges and published as soon
 * as it is written, so the peer copies one out while we copy the next in; wr->sent counts
 * what is written. 0 when all is (wr then takes its psn), -ENOSPC without room up to tail
 * for the next one (it waits in sq_pend, at the head). */
static int shm_frag_write(struct shm_conn *conn, struct shm_ep *ep, struct shm_wr *wr,
                          const struct exs_prov_sge *sge, uint64_t tail)
{
    while (wr->sent < wr->len) {
        uint32_t n = EXS_MIN(wr->len - wr->sent, conn->frag_bytes);
        uint32_t size = shm_roundup(SHM_REC_HDR + n);

        if (conn->head - tail + size + SHM_SLOT > conn->ring_bytes)
            return -ENOSPC;
        shm_rec_hdr(conn, ep, wr, SHM_RF_FRAG, 0, size);
        shm_ring_put_sges(conn->tx_ring, conn->ring_bytes, conn->head + SHM_REC_HDR, sge,
                          wr->num_sge, wr->sent, n);
        wr->sent += n;
        shm_publish_rec(conn, ep, size, n);
    }
    wr->psn = ep->snd_nxt++;
    return 0;
}

/* ctx->lock held: a READ's record at conn->head (its destination's sges, no payload); 0, or
 * -ENOSPC without room up to tail. Out of line: the inline records' path has no frame for
 * the sges. */
static __attribute__((noinline)) int shm_read_write(struct shm_conn *conn, struct shm_ep *ep,
                                                    struct shm_wr *wr,
                                                    const struct exs_prov_sge *sge, uint64_t tail)
{
    struct shm_rsge rs[SHM_MAX_SGE];
    int nrs = shm_sge_to_rsge(rs, sge, wr->num_sge);
    uint32_t size = shm_roundup(SHM_REC_HDR + (uint32_t)(nrs * sizeof(rs[0])));

    if (conn->head - tail + size + SHM_SLOT > conn->ring_bytes)
        return -ENOSPC;
    shm_rec_hdr(conn, ep, wr, 0, (uint8_t)nrs, size);
    if (nrs)
        shm_ring_put(conn->tx_ring, conn->ring_bytes, conn->head + SHM_REC_HDR, rs,
                     (uint32_t)(nrs * sizeof(rs[0])));
    wr->psn = ep->snd_nxt++;
    shm_publish_rec(conn, ep, size, wr->len);
    return 0;
}

/* ctx->lock held: the hot window (spec/provider-shm.md, "The hot window"). Our ring is
 * empty by the tail the caller has (the one last seen: a ping-pong's requester takes the
 * peer's tail with each answer, so no load of the peer's line for this), our position is
 * at least SHM_HOT_WINDOW into the lap, and the next record, of at most need bytes, fits
 * after a PAD with a slot free (need + a slot within the bytes before the position, so a
 * fragment never waits for the PAD to be taken): a PAD record from our position to the
 * lap's end, so the next record starts at ring offset 0. A ping-pong's records then stay
 * on the first lines of the ring, which both cores keep in cache, instead of walking the
 * ring (each record on lines neither core had, and the slot after it to zero). Announced
 * as any record (shm_publish_rec): the slot after it, offset 0, zeroed first (the ring is
 * empty: the consumer reads nothing before our position; a stale record there from an
 * earlier lap is never taken), then its size, sequentially consistent (the sleeping
 * handshake: the record after it may come later). Its other fields are 0: it is no request
 * (no psn, not counted in recs_tx, not acked). 1 when it was written. */
static __attribute__((noinline)) int shm_pad_write(struct shm_conn *conn, struct shm_ep *ep,
                                                   uint64_t tail, uint32_t need)
{
    uint32_t off = (uint32_t)(conn->head & conn->ring_mask);
    struct shm_rec *rec = (struct shm_rec *)(void *)(conn->tx_ring + off);

    if (conn->head != tail || off < need + SHM_SLOT)
        return 0;
    memset(rec, 0, offsetof(struct shm_rec, size));
    rec->type = SHM_REC_PAD;
    __atomic_store_n((uint32_t *)(void *)(conn->tx_ring + offsetof(struct shm_rec, size)), 0,
                     __ATOMIC_RELAXED);
    SHM_TSAN_RELEASE();
    __atomic_store_n(&rec->size, conn->ring_bytes - off, __ATOMIC_SEQ_CST);
    conn->head += conn->ring_bytes - off;
    SHM_CNT_INC_OWNED(ep->ctx->cnt.ring_pads); /* (ctx->lock) */
    return 1;
}

/* ctx->lock held: write wr as a record at conn->head, its payload from payload (a copy
 * taken at post time) or else from its sges (sge: wr->sge, or the poster's own list when
 * it goes into the ring at once); 0, or -ENOSPC without room up to tail. At a message's
 * start beyond the hot window, a PAD first when the ring is empty (shm_pad_write; one
 * compare on the way of a record within the window). */
SHM_INLINE int shm_rec_write(struct shm_conn *conn, struct shm_ep *ep, struct shm_wr *wr,
                             const struct exs_prov_sge *sge, const void *payload, uint64_t tail)
{
    uint32_t size;
    uint64_t pos;

    if (EXS_UNLIKELY((conn->head & conn->ring_mask) >= SHM_HOT_WINDOW) && !wr->sent)
        shm_pad_write(conn, ep, tail,
                      wr->opcode == EXS_PROV_WR_RDMA_READ
                          ? shm_roundup(SHM_REC_HDR + SHM_MAX_SGE * sizeof(struct shm_rsge))
                          : shm_roundup(SHM_REC_HDR + EXS_MIN(wr->len, conn->frag_bytes)));
    if (EXS_UNLIKELY(wr->opcode == EXS_PROV_WR_RDMA_READ))
        return shm_read_write(conn, ep, wr, sge, tail);
    if (!wr->inl && wr->len > SHM_RING_INLINE)
        return shm_frag_write(conn, ep, wr, sge, tail);
    size = shm_roundup(SHM_REC_HDR + wr->len);
    if (conn->head - tail + size + SHM_SLOT > conn->ring_bytes)
        return -ENOSPC;
    shm_rec_hdr(conn, ep, wr, SHM_RF_INLINE, 0, size);
    pos = conn->head + SHM_REC_HDR;
    if (payload)
        shm_ring_put(conn->tx_ring, conn->ring_bytes, pos, payload, wr->len);
    else
        shm_ring_put_sges(conn->tx_ring, conn->ring_bytes, pos, sge, wr->num_sge, 0, wr->len);
    wr->psn = ep->snd_nxt++;
    shm_publish_rec(conn, ep, size, wr->len);
    return 0;
}

/* ep->pend after a change to sq_pend or conn->kick (ctx->lock held) */
void exs__shm_ep_pend_locked(struct shm_ep *ep)
{
    int pend = !exs_list_empty(&ep->sq_pend) || (ep->conn && ep->conn->kick < 0);

    __atomic_store_n(&ep->pend, pend, __ATOMIC_RELAXED);
}

static void shm_ep_push(struct shm_ep *ep)
{
    struct shm_conn *conn = ep->conn;
    uint64_t tail, head0;

    /* ep->conn and ep->state change under ctx->lock (conn->state is the NIC's) */
    if (!conn || ep->state != EXS_PROV_EP_CONNECTED || exs_list_empty(&ep->sq_pend))
        return;
    if (shm_peer_tail_locked(conn, &tail)) {
        conn->kick = -1; /* the turn ends it: a protocol error */
        return;
    }
    head0 = conn->head;
    while (!exs_list_empty(&ep->sq_pend)) {
        struct shm_wr *wr = exs_list_entry(ep->sq_pend.next, struct shm_wr, link);

        if (wr->bad || (wr->fence && ep->reads_out) ||
            (wr->opcode == EXS_PROV_WR_RDMA_READ && ep->reads_out >= SHM_MAX_RD))
            break;
        if (shm_rec_write(conn, ep, wr, wr->sge, wr->inl ? &wr->sge[wr->num_sge] : NULL, tail)) {
            EXS_CNT_INC(ep->ctx->cnt.ring_full);
            break;
        }
        if (wr->opcode == EXS_PROV_WR_RDMA_READ)
            ep->reads_out++;
        exs_list_del(&wr->link);
        exs_list_add_tail(&ep->sq, &wr->link);
    }
    if (conn->head != head0) /* (fragments of one still waiting count) */
        exs__shm_conn_kick(conn);
}

void exs__shm_ep_push_locked(struct shm_ep *ep)
{
    shm_ep_push(ep);
    exs__shm_ep_pend_locked(ep);
}

/* ctx->lock held: wr (posted, ep CONNECTED with nothing waiting before it) written into
 * the ring at once from the poster's sges: no copy of its sges or inline payload into wr.
 * The peer's tail is read only when the one last seen leaves no room. 0, -ENOSPC (no
 * room: it waits in sq_pend), -EPROTO (the peer's tail lies: for the turn to end). */
static int shm_post_direct_locked(struct shm_conn *conn, struct shm_ep *ep, struct shm_wr *wr,
                                  const struct exs_prov_sge *sge)
{
    uint64_t tail = conn->peer_tail, head0 = conn->head;
    int ret, looked = 0;

    /* one site of the record's write (inline: the post's constants fold into it) */
    while ((ret = shm_rec_write(conn, ep, wr, sge, NULL, tail)) == -ENOSPC && !looked) {
        if (shm_peer_tail_locked(conn, &tail))
            return -EPROTO;
        looked = 1;
    }
    if (ret) {
        if (conn->head != head0) /* its first fragments: the peer may take them */
            exs__shm_conn_kick(conn);
        return ret;
    }
    if (wr->opcode == EXS_PROV_WR_RDMA_READ)
        ep->reads_out++;
    exs_list_add_tail(&ep->sq, &wr->link);
    exs__shm_conn_kick(conn);
    return 0;
}

int exs__shm_post_send(struct exs_prov_ep *e, const struct exs_prov_send_wr *swr)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx = ep->ctx;
    const struct exs_prov_caps *caps = &ctx->base.caps;
    struct shm_conn *conn;
    struct shm_wr *wr;
    uint64_t total = 0;
    size_t need;
    int inl, pooled, wake = 0;

    if (EXS_UNLIKELY(!swr || (unsigned)swr->opcode > EXS_PROV_WR_RDMA_READ || swr->num_sge < 0 ||
                     (uint32_t)swr->num_sge > caps->max_sge || (swr->num_sge && !swr->sg_list)))
        return -EINVAL;
    for (int i = 0; i < swr->num_sge; i++)
        total += swr->sg_list[i].length;
    inl = (swr->flags & EXS_PROV_SEND_INLINE) && swr->opcode != EXS_PROV_WR_RDMA_READ;
    if (EXS_UNLIKELY(total > caps->max_msg_size || (inl && total > ep->base.attr.max_inline)))
        return -EINVAL;
    need = sizeof(*wr) + (size_t)swr->num_sge * sizeof(wr->sge[0]) + (inl ? total : 0);
    pooled = need <= SHM_WR_POOL_LEN;

    /* filled and queued (or written into the ring) in one hold of ctx->lock, which also
     * guards the pool; malloc only when the pool has no block (or the request is larger) */
    exs__lite_lock(&ctx->lock);
    wr = pooled ? exs__soft_pool_get_locked(&ep->wr_pool) : NULL;
    if (!wr) {
        exs__lite_unlock(&ctx->lock);
        wr = malloc(pooled ? SHM_WR_POOL_LEN : need);
        if (!wr)
            return -ENOMEM;
        exs__lite_lock(&ctx->lock);
    }
    wr->pooled = (uint8_t)pooled;
    wr->wr_id = swr->wr_id;
    wr->opcode = (uint8_t)swr->opcode;
    wr->signaled = !!(swr->flags & EXS_PROV_SEND_SIGNALED);
    wr->fence = !!(swr->flags & EXS_PROV_SEND_FENCE);
    wr->inl = (uint8_t)inl;
    wr->bad = 0;
    wr->num_sge = swr->num_sge;
    wr->len = (uint32_t)total;
    wr->imm = swr->imm_data;
    wr->raddr = swr->remote_addr;
    wr->rkey = swr->rkey;
    wr->psn = 0;
    wr->sent = 0;
    if (!inl && exs__shm_check_local_locked(
                    ctx, swr->sg_list, swr->num_sge,
                    swr->opcode == EXS_PROV_WR_RDMA_READ ? EXS_PROV_ACCESS_LOCAL_WRITE : 0))
        wr->bad = 1;
    if (EXS_UNLIKELY(ep->state == EXS_PROV_EP_IDLE || ep->state == EXS_PROV_EP_CONNECTING)) {
        exs__shm_wr_put_locked(ep, wr);
        exs__lite_unlock(&ctx->lock);
        return -ENOTCONN;
    }
    if (EXS_UNLIKELY(ep->sq_used + ep->cq_sq >= ep->base.attr.max_send_wr)) {
        exs__shm_wr_put_locked(ep, wr);
        exs__lite_unlock(&ctx->lock);
        return -ENOMEM;
    }
    if (EXS_UNLIKELY(ep->state == EXS_PROV_EP_ERROR)) {
        exs__shm_flush_cqe_locked(ep, wr->wr_id, shm_wc_opcode(wr->opcode));
        exs__shm_wr_put_locked(ep, wr);
        exs__lite_unlock(&ctx->lock);
        return 0;
    }
    ep->sq_used++;
    conn = ep->conn;
    /* the common case: straight into the ring, in order behind nothing */
    if (conn && ep->state == EXS_PROV_EP_CONNECTED && !wr->bad && exs_list_empty(&ep->sq_pend) &&
        !(wr->fence && ep->reads_out) &&
        !(wr->opcode == EXS_PROV_WR_RDMA_READ && ep->reads_out >= SHM_MAX_RD)) {
        if (!shm_post_direct_locked(conn, ep, wr, swr->sg_list)) {
            exs__lite_unlock(&ctx->lock);
            return 0;
        }
        /* no room, or a lie: the push below finds it again (counts ring_full, or sets
         * conn->kick for the turn to end the connection) */
    }
    if (swr->num_sge)
        memcpy(wr->sge, swr->sg_list, (size_t)swr->num_sge * sizeof(wr->sge[0]));
    if (inl) {
        uint8_t *p = (uint8_t *)&wr->sge[wr->num_sge];

        for (int i = 0; i < swr->num_sge; i++) {
            memcpy(p, (const void *)(uintptr_t)swr->sg_list[i].addr, swr->sg_list[i].length);
            p += swr->sg_list[i].length;
        }
    }
    exs_list_add_tail(&ep->sq_pend, &wr->link);
    exs__shm_ep_push_locked(ep);
    /* a bad request or a lying peer is for the driver's turn */
    wake = wr->bad || (ep->conn && ep->conn->kick < 0);
    exs__lite_unlock(&ctx->lock);
    if (wake)
        exs__shm_ctx_wake(ctx);
    return 0;
}

/* ---- the receive ring (spec/provider-shm.md, "The receive ring") ---- */

#define SHM_RWR_BLK (sizeof(struct exs_soft_rwr) + SHM_RWR_POOL_SGE * sizeof(struct exs_prov_sge))

int exs__shm_rq_init(struct shm_ep *ep)
{
    uint32_t n = 1;

    while (n < ep->base.attr.max_recv_wr)
        n <<= 1;
    ep->rq = calloc(n, sizeof(*ep->rq));
    if (!ep->rq)
        return -ENOMEM;
    ep->rq_mask = n - 1;
    return 0;
}

void exs__shm_rq_fini(struct shm_ep *ep)
{
    for (uint32_t i = 0; ep->rq && i <= ep->rq_mask; i++)
        free(ep->rq[i].blk);
    free(ep->rq);
}

/* rq_lock: a store lock. Taken with one exchange; given back with a plain store (no locked
 * instruction: nobody sleeps on it). A poster that finds it held (another poster of the
 * ep, or the flush's sweep: holds of a few stores) looks again after a pause, then after
 * naps of growing length, so a holder that cannot run while its waiter can still runs. */
static void shm_rq_lock_wait(int *l)
{
    for (unsigned n = 0;; n++) {
        if (!__atomic_load_n(l, __ATOMIC_RELAXED) && !__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
            return;
        if (n < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            struct timespec ts = {0, 1000L << EXS_MIN(n - 64, 10u)};

            (void)exs__nc_nanosleep(&ts);
        }
    }
}

static inline void shm_rq_lock(struct shm_ep *ep)
{
    if (__atomic_exchange_n(&ep->rq_lock, 1, __ATOMIC_ACQUIRE))
        shm_rq_lock_wait(&ep->rq_lock);
}

static inline void shm_rq_unlock(struct shm_ep *ep)
{
    __atomic_store_n(&ep->rq_lock, 0, __ATOMIC_RELEASE);
}

struct exs_soft_rwr *exs__shm_rq_take_locked(struct shm_ep *ep)
{
    struct exs_soft_rwr *rwr;

    if (!exs__shm_rq_ready(ep))
        return NULL;
    rwr = ep->rq[ep->rq_tail & ep->rq_mask].rwr;
    ep->rq_tail++;
    /* the local key is checked when the receive is used, as hardware does at placement */
    rwr->bad = exs__soft_check_local_memo_locked(&ep->ctx->keys, &ep->rq_memo, rwr->sge,
                                                 rwr->num_sge, EXS_PROV_ACCESS_LOCAL_WRITE) != 0;
    return rwr;
}

void exs__shm_rq_back_locked(struct shm_ep *ep, struct exs_soft_rwr *rwr)
{
    EXS_ASSERT(ep->rq[(ep->rq_tail - 1) & ep->rq_mask].rwr == rwr);
    ep->rq_tail--;
}

void exs__shm_rq_sweep_locked(struct shm_ep *ep)
{
    uint32_t head;

    /* after this hold no poster puts a receive in the ring: one that took rq_lock before
     * it is in head; one after it sees rq_dead */
    shm_rq_lock(ep);
    ep->rq_dead = 1;
    head = ep->rq_head;
    shm_rq_unlock(ep);
    while (ep->rq_tail != head) {
        struct exs_soft_rwr *rwr = ep->rq[ep->rq_tail++ & ep->rq_mask].rwr;

        if (!ep->destroyed)
            exs__shm_flush_cqe_locked(ep, rwr->wr_id, EXS_PROV_WC_RECV);
        exs__shm_rwr_put_locked(rwr);
    }
}

/* Without ctx->lock: the receive checked, then written into the ring's next slot under
 * rq_lock and published by its head; the turn takes it under ctx->lock. */
int exs__shm_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *in)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx = ep->ctx;
    struct exs_soft_rwr *own = NULL, *rwr;
    struct shm_rq_slot *slot;
    uint64_t len;
    int ret;

    /* the common receive, one sge: checked and summed here, without the calls */
    if (EXS_LIKELY(in && in->num_sge == 1 && in->sg_list)) {
        len = in->sg_list[0].length;
    } else {
        ret = exs__soft_rwr_check(in, ctx->base.caps.max_sge, &len);
        if (ret)
            return ret;
        if (in->num_sge > (int)SHM_RWR_POOL_SGE) {
            own = malloc(sizeof(*own) + (size_t)in->num_sge * sizeof(own->sge[0]));
            if (!own)
                return -ENOMEM;
        }
    }
    shm_rq_lock(ep);
    if (ep->rq_posted - __atomic_load_n(&ep->rq_retired, __ATOMIC_ACQUIRE) >=
        ep->base.attr.max_recv_wr) {
        shm_rq_unlock(ep);
        free(own);
        return -ENOMEM;
    }
    if (EXS_UNLIKELY(ep->rq_dead)) {
        /* swept (death, close): completes WR_FLUSH_ERR at once, behind the sweep's */
        ep->rq_posted++;
        shm_rq_unlock(ep);
        free(own);
        exs__lite_lock(&ctx->lock);
        exs__shm_flush_cqe_locked(ep, in->wr_id, EXS_PROV_WC_RECV);
        exs__lite_unlock(&ctx->lock);
        return 0;
    }
    /* free: its last receive is retired (rq_posted - rq_retired < max_recv_wr <= slots) */
    slot = &ep->rq[ep->rq_head & ep->rq_mask];
    rwr = own;
    if (!rwr) {
        if (EXS_UNLIKELY(!slot->blk)) {
            slot->blk = malloc(SHM_RWR_BLK);
            if (!slot->blk) {
                shm_rq_unlock(ep);
                return -ENOMEM;
            }
        }
        rwr = slot->blk;
    }
    if (in->num_sge == 1) { /* exs__soft_rwr_fill's, for one sge */
        rwr->wr_id = in->wr_id;
        rwr->num_sge = 1;
        rwr->len = len;
        rwr->sge[0] = in->sg_list[0];
    } else {
        exs__soft_rwr_fill(rwr, in, len);
    }
    rwr->pooled = !own;
    slot->rwr = rwr;
    ep->rq_posted++;
    __atomic_store_n(&ep->rq_head, ep->rq_head + 1, __ATOMIC_RELEASE);
    shm_rq_unlock(ep);
    return 0;
}

/* ---- the requester's side: answers ---- */

static enum exs_prov_wc_status shm_syn_status(uint32_t syn)
{
    switch (syn) {
    case SHM_SYN_RNR_EXC:
        return EXS_PROV_WC_RNR_RETRY_EXC_ERR;
    case SHM_SYN_REM_ACCESS:
        return EXS_PROV_WC_REM_ACCESS_ERR;
    case SHM_SYN_REM_INV:
        return EXS_PROV_WC_REM_INV_REQ_ERR;
    default:
        return EXS_PROV_WC_REM_OP_ERR;
    }
}

static void shm_proto_error(struct shm_conn *conn, const char *what)
{
    EXS_CNT_INC(conn->ctx->cnt.protocol_errors);
    EXS_WARN(PROV, "shm conn %p (peer pid %d): %s: protocol error, connection ended", (void *)conn,
             (int)conn->pid, what);
    exs__shm_conn_end(conn, -EPROTO, 0, 1);
}

/* ctx->lock held across the steps of one service of a connection: the inline requests of
 * a turn and the answers after them take it once (at most SHM_HOLD_RECS requests per hold,
 * a fragment filling a hold, so a revoke waits for at most 64 KiB of copies); anything that may end
 * the connection, wait for a timer or copy with process_vm_* lets it go first. */
#define SHM_HOLD_RECS 16u

struct shm_hold {
    int locked;
    unsigned recs; /* inline requests carried out in this hold */
};

static void shm_hold_take(struct shm_ctx *ctx, struct shm_hold *h)
{
    if (!h->locked) {
        exs__lite_lock(&ctx->lock);
        h->locked = 1;
        h->recs = 0;
    }
}

static void shm_hold_drop(struct shm_ctx *ctx, struct shm_hold *h)
{
    if (h->locked) {
        exs__lite_unlock(&ctx->lock);
        h->locked = 0;
    }
}

/* Take the peer's ack and nak: complete our requests in order. > 0 when any completed.
 * Takes ctx->lock unless h holds it; h does not hold it on return. */
static int shm_take_answers(struct shm_conn *conn, struct shm_hold *h)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_ep *ep = conn->ep;
    uint32_t syn = conn->nak_seen ? 0 : __atomic_load_n(&conn->peer->nak_syn, __ATOMIC_ACQUIRE);
    uint32_t ack = __atomic_load_n(&conn->peer->ack, __ATOMIC_ACQUIRE);
    uint32_t npsn = syn ? __atomic_load_n(&conn->peer->nak_psn, __ATOMIC_RELAXED) : 0;
    const char *bad = NULL;
    uint64_t tail;
    int did = 0, end = 0;

    SHM_ONCE();
    if (ack == conn->acked && !syn) {
        shm_hold_drop(ctx, h);
        return 0;
    }
    SHM_TSAN_ACQUIRE();
    shm_hold_take(ctx, h);
    if (ack - conn->acked > ep->snd_nxt - conn->acked)
        bad = "ack beyond the requests sent";
    else if (syn && (syn > SHM_SYN_REM_OP || npsn != ack || npsn == ep->snd_nxt))
        bad = "nak of a request not outstanding";
    /* the peer's tail, in the line just read for its ack: the room a post sees without
     * reading the peer's line (shm_post_direct_locked) follows the answers */
    else if (shm_peer_tail_locked(conn, &tail))
        bad = "ring tail";
    while (!bad && conn->acked != ack) {
        struct shm_wr *wr = exs_list_entry(ep->sq.next, struct shm_wr, link);

        exs_list_del(&wr->link);
        shm_wr_done_locked(ep, wr, EXS_PROV_WC_SUCCESS);
        conn->acked++;
        did++;
    }
    if (!bad && syn) {
        struct shm_wr *wr = exs_list_entry(ep->sq.next, struct shm_wr, link);

        conn->nak_seen = 1;
        EXS_CNT_INC(ctx->cnt.naks_rx);
        exs_list_del(&wr->link);
        shm_wr_done_locked(ep, wr, shm_syn_status(syn));
        did++;
        if (syn == SHM_SYN_RNR_EXC) {
            /* the connection stays until a disconnect; our ep is in error, and what the
             * peer still sends is dropped (as tcp) */
            conn->zombie = 1;
            conn->rx_drop = 1;
            ep->state = EXS_PROV_EP_ERROR;
            exs__shm_ep_flush_locked(ep);
        } else {
            end = 1;
        }
    }
    /* (nothing waiting: the push would find sq_pend empty and leave pend as it is) */
    if (!bad && !end && did && !exs_list_empty(&ep->sq_pend))
        exs__shm_ep_push_locked(ep);
    shm_hold_drop(ctx, h);
    if (bad)
        shm_proto_error(conn, bad);
    else if (end)
        exs__shm_conn_end(conn, -ECONNABORTED, 0, 0);
    return did;
}

/* A bad request at the head of the send queue (its sges failed the local check): it
 * completes LOC_PROT_ERR once every request before it is done, and the connection ends. */
static int shm_bad_head(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_ep *ep = conn->ep;
    int bad = 0;

    exs__lite_lock(&ctx->lock);
    if (exs_list_empty(&ep->sq) && !exs_list_empty(&ep->sq_pend)) {
        struct shm_wr *wr = exs_list_entry(ep->sq_pend.next, struct shm_wr, link);

        if (wr->bad) {
            exs_list_del(&wr->link);
            shm_wr_done_locked(ep, wr, EXS_PROV_WC_LOC_PROT_ERR);
            exs__shm_ep_pend_locked(ep);
            bad = 1;
        }
    }
    exs__lite_unlock(&ctx->lock);
    if (bad)
        exs__shm_conn_end(conn, -ECONNABORTED, 0, 1);
    return bad;
}

/* ---- the responder's side: requests ---- */

static void shm_publish_nak(struct shm_conn *conn, uint32_t psn, uint32_t syn)
{
    EXS_CNT_INC(conn->ctx->cnt.naks_tx);
    SHM_TSAN_RELEASE();
    __atomic_store_n(&conn->mine->ack, conn->ack, __ATOMIC_RELEASE);
    __atomic_store_n(&conn->mine->nak_psn, psn, __ATOMIC_RELAXED);
    __atomic_store_n(&conn->mine->nak_syn, syn, __ATOMIC_SEQ_CST);
    exs__shm_conn_kick(conn);
}

/* Refuse the request (syndrome), ending the connection (-ECONNABORTED). */
static int shm_refuse(struct shm_conn *conn, uint32_t psn, uint32_t syn)
{
    shm_publish_nak(conn, psn, syn);
    exs__shm_conn_end(conn, -ECONNABORTED, 0, 0);
    return -1;
}

/* nic_lock and ctx->lock held: the receive rwr (taken off the queue) completes with st;
 * given back. */
static void shm_recv_done_locked(struct shm_conn *conn, struct exs_soft_rwr *rwr,
                                 enum exs_prov_wc_status st, enum exs_prov_wc_opcode op,
                                 uint32_t len, const struct shm_rec *rec)
{
    struct shm_ep *ep = conn->ep;
    struct exs_prov_cqe *cqe = exs__shm_cq_nic_slot_locked(conn->ctx);
    int imm = st == EXS_PROV_WC_SUCCESS && (rec->flags & SHM_RF_IMM), direct;

    cqe->wr_id = rwr->wr_id;
    cqe->ep = &ep->base;
    cqe->status = st;
    cqe->opcode = op;
    cqe->byte_len = st == EXS_PROV_WC_SUCCESS ? len : 0;
    cqe->imm_data = imm ? rec->imm : 0;
    cqe->flags = imm ? EXS_PROV_WC_WITH_IMM : 0;
    if (st != EXS_PROV_WC_SUCCESS)
        ep->state = EXS_PROV_EP_ERROR;
    direct = exs__shm_cq_nic_commit_locked(conn->ctx, ep, 1, cqe);
    exs__shm_rwr_put_locked(rwr);
    if (direct) /* (a queued one retires when polled) */
        exs__shm_rq_retire_locked(ep);
}

static void shm_recv_done(struct shm_conn *conn, struct exs_soft_rwr *rwr,
                          enum exs_prov_wc_status st, enum exs_prov_wc_opcode op, uint32_t len,
                          const struct shm_rec *rec)
{
    exs__lite_lock(&conn->ctx->lock);
    shm_recv_done_locked(conn, rwr, st, op, len, rec);
    exs__lite_unlock(&conn->ctx->lock);
}

/* A receive taken for a request that failed goes back to the head of the queue (the
 * connection ends and flushes it in order). */
static void shm_recv_back(struct shm_conn *conn, struct exs_soft_rwr *rwr)
{
    if (!rwr)
        return;
    exs__lite_lock(&conn->ctx->lock);
    exs__shm_rq_back_locked(conn->ep, rwr);
    exs__lite_unlock(&conn->ctx->lock);
}

/* No receive posted for the request: 0 holding (RNR), -1 refused (NAK published). */
static int shm_rnr(struct shm_conn *conn, const struct shm_rec *rec)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_ep *ep = conn->ep;
    uint32_t ms;

    if (conn->rnr_at && exs__now_ns() < conn->rnr_at) {
        exs__shm_timer_set(ctx, conn->rnr_at); /* the timer may have fired for another */
        return 0;
    }
    if (conn->peer_rnr_retry >= 7 || conn->rnr_tries < conn->peer_rnr_retry) {
        conn->rnr_tries++;
        EXS_CNT_INC(ctx->cnt.rnr_waits);
        ms = ep->base.attr.rnr_timer_ms ? ep->base.attr.rnr_timer_ms : ctx->rnr_timer_ms;
        ms = EXS_MAX(ms, (uint32_t)conn->peer_rnr_timer_ms);
        conn->rnr_at = exs__now_ns() + (ms ? ms * 1000000ull : 100000ull);
        exs__shm_timer_set(ctx, conn->rnr_at);
        return 0;
    }
    EXS_CNT_INC(ctx->cnt.rnr_naks);
    conn->rnr_at = 0;
    conn->rnr_tries = 0;
    conn->rx_drop = 1;
    shm_publish_nak(conn, rec->psn, SHM_SYN_RNR_EXC);
    return -1;
}

/* A receive for the request: 1 got it, 0 holding (RNR), -1 refused (NAK published). */
static int shm_take_recv(struct shm_conn *conn, const struct shm_rec *rec,
                         struct exs_soft_rwr **rwr_p)
{
    struct shm_ctx *ctx = conn->ctx;
    struct exs_soft_rwr *rwr;

    exs__lite_lock(&ctx->lock);
    rwr = exs__shm_rq_take_locked(conn->ep);
    exs__lite_unlock(&ctx->lock);
    if (!rwr)
        return shm_rnr(conn, rec);
    *rwr_p = rwr;
    conn->rnr_tries = 0;
    conn->rnr_at = 0;
    return 1;
}

/* Copy n bytes of the ring at pos into the receive's sges from message offset off. */
static void shm_ring_to_rwr(const struct exs_soft_rwr *rwr, const uint8_t *ring, uint32_t size,
                            uint64_t pos, uint64_t off, uint64_t n)
{
    for (int i = 0; i < rwr->num_sge && n; i++) {
        uint64_t l = rwr->sge[i].length;

        if (off >= l) {
            off -= l;
            continue;
        }
        l = EXS_MIN(l - off, n);
        shm_ring_get((void *)(uintptr_t)(rwr->sge[i].addr + off), ring, size, pos, (uint32_t)l);
        pos += l;
        n -= l;
        off = 0;
    }
}

/* A request whose payload is in the ring at pos (a SEND or a WRITE): inline (the whole
 * payload, off 0, n rec->len) or one fragment (bytes [off, off+n) of the message) carried
 * out in one hold of ctx->lock: the receive taken (first fragment; kept in conn->frag_rwr
 * until the last), the key checked (the whole range at the first, the fragment's at each:
 * a revoke between two fragments stops the message), the payload copied and, at the last,
 * the completion queued. The copy under the lock needs no fence: revoke and mr_dereg take
 * the lock, so they wait for this one copy, as they would for a fenced one; a hold carries
 * out at most SHM_HOLD_RECS requests' worth of SHM_RING_INLINE bytes. 1 done, 0 holding
 * (RNR), -1 the connection ended or dropping. */
static int shm_do_ring(struct shm_conn *conn, const struct shm_rec *rec, uint64_t pos, uint32_t off,
                       uint32_t n, struct shm_hold *h)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_ep *ep = conn->ep;
    struct exs_soft_rwr *rwr = NULL;
    enum exs_prov_wc_status st = EXS_PROV_WC_SUCCESS;
    uint32_t syn = 0;
    int first = off == 0, last = off + n == rec->len;

    if (h->locked && h->recs >= SHM_HOLD_RECS)
        shm_hold_drop(ctx, h); /* let posters and a revoke in */
    shm_hold_take(ctx, h);
    if (!first) {
        rwr = conn->frag_rwr;
        conn->frag_rwr = NULL;
        /* the receive's regions looked at again (the memo: compares while no region died):
         * one deregistered since the last fragment stops the message, nothing more placed
         * (until session 28 the later fragments went into it: fence28_shm_frag_send_mr_dereg) */
        if (rwr && rec->type == SHM_REC_SEND &&
            exs__soft_check_local_memo_locked(&ctx->keys, &ep->rq_memo, rwr->sge, rwr->num_sge,
                                              EXS_PROV_ACCESS_LOCAL_WRITE)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            st = EXS_PROV_WC_LOC_PROT_ERR;
            syn = SHM_SYN_REM_OP;
        }
    } else if (rec->type == SHM_REC_SEND || (rec->flags & SHM_RF_IMM)) {
        rwr = exs__shm_rq_take_locked(ep);
        if (!rwr) {
            shm_hold_drop(ctx, h);
            return shm_rnr(conn, rec);
        }
        conn->rnr_tries = 0;
        conn->rnr_at = 0;
        if (rwr->bad) {
            st = EXS_PROV_WC_LOC_PROT_ERR;
            syn = SHM_SYN_REM_OP;
        } else if (rec->type == SHM_REC_SEND && rec->len > rwr->len) {
            st = EXS_PROV_WC_LOC_LEN_ERR;
            syn = SHM_SYN_REM_INV;
        }
    }
    if (syn) {
        /* nothing placed */
    } else if (rec->type == SHM_REC_SEND) {
        shm_ring_to_rwr(rwr, conn->rx_ring, conn->ring_bytes, pos, off, n);
    } else if (rec->len) {
        if (!exs__soft_key_remote_locked(&ctx->keys, &ep->base, rec->rkey, rec->raddr + off,
                                         first ? rec->len : n, EXS_PROV_ACCESS_REMOTE_WRITE)) {
            if (rwr)
                exs__shm_rq_back_locked(ep, rwr);
            shm_hold_drop(ctx, h);
            EXS_CNT_INC(ctx->cnt.access_errors);
            return shm_refuse(conn, rec->psn, SHM_SYN_REM_ACCESS);
        }
        shm_ring_get((void *)(uintptr_t)(rec->raddr + off), conn->rx_ring, conn->ring_bytes, pos,
                     n);
    }
    if (rwr && (syn || last))
        shm_recv_done_locked(conn, rwr, st,
                             syn || rec->type == SHM_REC_SEND ? EXS_PROV_WC_RECV
                                                              : EXS_PROV_WC_RECV_RDMA_WITH_IMM,
                             syn ? 0 : rec->len, rec);
    else if (rwr)
        conn->frag_rwr = rwr; /* the next fragment's (the connection's end gives it back) */
    if (syn) {
        shm_hold_drop(ctx, h);
        return shm_refuse(conn, rec->psn, syn);
    }
    h->recs += n > SHM_RING_INLINE ? SHM_HOLD_RECS : 1; /* a fragment fills a hold */
    if (!(rec->flags & SHM_RF_FRAG))
        SHM_CNT_INC_OWNED(ctx->cnt.inline_rx); /* (nic_lock) */
    SHM_CNT_ADD_OWNED(ctx->cnt.bytes_rx, n);
    return 1;
}

/* One process_vm call for bytes [off, off+n) of local segment lseg and remote rs. */
static int shm_copy(struct shm_conn *conn, int to_peer, const struct shm_rsge *lseg, int nl,
                    const struct shm_rsge *rs, int nr, uint64_t off, uint64_t n)
{
    struct iovec liov[SHM_MAX_SGE], riov[SHM_MAX_SGE];
    int a = shm_iov_slice(liov, SHM_MAX_SGE, lseg, nl, off, n);
    int b = shm_iov_slice(riov, SHM_MAX_SGE, rs, nr, off, n);
    ssize_t got;

    SHM_CNT_INC_OWNED(conn->ctx->cnt.copies); /* (nic_lock) */
    got = to_peer ? process_vm_writev(conn->pid, liov, (unsigned long)a, riov, (unsigned long)b, 0)
                  : process_vm_readv(conn->pid, liov, (unsigned long)a, riov, (unsigned long)b, 0);
    if (got == (ssize_t)n)
        return 0;
    return got < 0 && errno == ESRCH ? -ESRCH : -EFAULT;
}

/* Move len bytes between our memory (lseg) and the peer's (rs: the request's payload, or
 * a READ's destination) in chunks; key (when not NULL) is fenced and re-checked between
 * chunks; into (when not NULL: lseg are its sges) is the receive copied into, whose
 * regions are fenced over each chunk (until session 28 a SEND of source pairs was copied
 * into its receive with no fence: mr_dereg returned while chunks still landed). (Inline
 * payload, from the ring, is shm_do_ring's.) 0, -EACCES (revoked or deregistered
 * meanwhile: the fence is down), -ESRCH, -EFAULT. */
static int shm_move(struct shm_conn *conn, int to_peer, const struct shm_rsge *lseg, int nl,
                    const struct shm_rsge *rs, int nr, uint32_t len, struct exs_soft_key *key,
                    const struct exs_soft_rwr *into)
{
    struct exs_soft_key *lkey = NULL;
    uint64_t off = 0, kills = UINT64_MAX;

    while (off < len) {
        uint64_t n = EXS_MIN((uint64_t)len - off, (uint64_t)SHM_COPY_CHUNK);
        int ret;

        if (off && key && exs__shm_fence_next(conn->ctx, key))
            return -EACCES;
        if (into && exs__shm_fence_local(conn->ctx, into->sge, into->num_sge, &lkey, &kills))
            return -EACCES;
        ret = shm_copy(conn, to_peer, lseg, nl, rs, nr, off, n);
        if (into)
            exs__shm_fence_end(conn->ctx);
        if (ret)
            return ret;
        off += n;
    }
    return 0;
}

/* The copy failed: the peer died (-ESRCH) or lied about its memory. */
static int shm_copy_failed(struct shm_conn *conn, int ret)
{
    if (ret == -ESRCH)
        exs__shm_conn_peer_died(conn);
    else
        shm_proto_error(conn, "request names memory the peer does not have");
    return -1;
}

/* Carry out one request. 1 done, 0 holding (RNR), -1 the connection ended or dropping. */
static int shm_do_rec(struct shm_conn *conn, const struct shm_rec *rec, const struct shm_rsge *rs,
                      int nrs, uint64_t pos, uint32_t part, struct shm_hold *h)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_rsge lseg[SHM_MAX_SGE];
    struct exs_soft_rwr *rwr = NULL;
    struct exs_soft_key *key = NULL;
    const struct shm_rsge *src = rs;
    int ret, nl;

    if (rec->flags & (SHM_RF_INLINE | SHM_RF_FRAG))
        return shm_do_ring(conn, rec, pos, conn->frag_off, part, h);
    shm_hold_drop(ctx, h);
    if (rec->type == SHM_REC_SEND || (rec->flags & SHM_RF_IMM)) {
        ret = shm_take_recv(conn, rec, &rwr);
        if (ret <= 0)
            return ret;
        if (rwr->bad) {
            shm_recv_done(conn, rwr, EXS_PROV_WC_LOC_PROT_ERR, EXS_PROV_WC_RECV, 0, rec);
            return shm_refuse(conn, rec->psn, SHM_SYN_REM_OP);
        }
    }
    if (rec->type == SHM_REC_SEND) {
        if (rec->len > rwr->len) {
            shm_recv_done(conn, rwr, EXS_PROV_WC_LOC_LEN_ERR, EXS_PROV_WC_RECV, 0, rec);
            return shm_refuse(conn, rec->psn, SHM_SYN_REM_INV);
        }
        nl = 0;
        for (uint64_t left = rec->len; left && nl < rwr->num_sge; nl++) {
            lseg[nl].addr = rwr->sge[nl].addr;
            lseg[nl].len = EXS_MIN((uint64_t)rwr->sge[nl].length, left);
            left -= lseg[nl].len;
        }
        ret = shm_move(conn, 0, lseg, nl, src, nrs, rec->len, NULL, rwr);
        if (ret == -EACCES) {
            /* a region of the receive deregistered: as the receive found bad */
            EXS_CNT_INC(ctx->cnt.access_errors);
            shm_recv_done(conn, rwr, EXS_PROV_WC_LOC_PROT_ERR, EXS_PROV_WC_RECV, 0, rec);
            return shm_refuse(conn, rec->psn, SHM_SYN_REM_OP);
        }
        if (ret) {
            shm_recv_back(conn, rwr);
            return shm_copy_failed(conn, ret);
        }
        shm_recv_done(conn, rwr, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, rec->len, rec);
        SHM_CNT_ADD_OWNED(ctx->cnt.bytes_rx, rec->len);
        return 1;
    }
    /* WRITE (with or without a receive) or READ: the key, then one copy under the fence */
    if (rec->len) {
        unsigned acc =
            rec->type == SHM_REC_WRITE ? EXS_PROV_ACCESS_REMOTE_WRITE : EXS_PROV_ACCESS_REMOTE_READ;

        if (exs__shm_fence_remote(ctx, conn->ep, rec->rkey, rec->raddr, rec->len, acc, &key)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            shm_recv_back(conn, rwr);
            return shm_refuse(conn, rec->psn, SHM_SYN_REM_ACCESS);
        }
        lseg[0].addr = rec->raddr;
        lseg[0].len = rec->len;
        ret = shm_move(conn, rec->type == SHM_REC_READ, lseg, 1, src, nrs, rec->len, key, NULL);
        if (ret != -EACCES)
            exs__shm_fence_end(ctx);
        if (ret) {
            shm_recv_back(conn, rwr);
            if (ret == -EACCES) {
                EXS_CNT_INC(ctx->cnt.access_errors);
                return shm_refuse(conn, rec->psn, SHM_SYN_REM_ACCESS);
            }
            return shm_copy_failed(conn, ret);
        }
        SHM_CNT_ADD_OWNED(ctx->cnt.bytes_rx, rec->len);
    }
    if (rwr)
        shm_recv_done(conn, rwr, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, rec->len,
                      rec);
    return 1;
}

/* Check a record header read from the ring (a local copy) against what is available. */
static const char *shm_rec_check(const struct shm_conn *conn, const struct shm_rec *rec,
                                 uint64_t avail)
{
    uint32_t want;

    /* in the middle of a message in fragments: its next fragment, the same header */
    if (conn->frag_off && memcmp(rec, &conn->frag_rec, offsetof(struct shm_rec, size)) != 0)
        return "fragment out of its message";
    /* (at least a slot, whole slots, at most the largest record: the size it must have,
     * checked last, is all three) */
    if (rec->size > avail)
        return "record size";
    if (rec->psn != conn->rcv_nxt)
        return "record sequence";
    if (rec->type < SHM_REC_SEND || rec->type > SHM_REC_READ || rec->rsvd ||
        (rec->flags & ~(SHM_RF_IMM | SHM_RF_INLINE | SHM_RF_FRAG)) ||
        (rec->type == SHM_REC_READ && (rec->flags & (SHM_RF_IMM | SHM_RF_INLINE | SHM_RF_FRAG))))
        return "record type or flags";
    if (rec->len > conn->ctx->base.caps.max_msg_size)
        return "record length";
    if (rec->flags & SHM_RF_FRAG) {
        if (rec->nsge || (rec->flags & SHM_RF_INLINE) || rec->len <= SHM_RING_INLINE)
            return "fragment";
        want = shm_roundup(SHM_REC_HDR + EXS_MIN(rec->len - conn->frag_off, conn->frag_bytes));
    } else if (rec->flags & SHM_RF_INLINE) {
        if (rec->nsge || rec->len > SHM_RING_INLINE)
            return "inline record";
        want = shm_roundup(SHM_REC_HDR + rec->len);
    } else {
        if (rec->nsge > SHM_MAX_SGE)
            return "record sges";
        want = shm_roundup(SHM_REC_HDR + rec->nsge * (uint32_t)sizeof(struct shm_rsge));
    }
    return rec->size == want ? NULL : "record size";
}

/* Check a PAD record read from the ring (a local copy) at our position (spec/provider-shm.md,
 * "The hot window"): between messages, every field but type and size 0, and its size
 * exactly the bytes from our position to the lap's end (so a whole number of slots, not 0
 * and, our position never being a lap's start, at most the ring less a slot: the consumer
 * never reads beyond the ring, and goes on at the next lap's offset 0). The producer's
 * window is its own choice: a PAD at any position but a lap's start is taken. */
static const char *shm_pad_check(const struct shm_conn *conn, const struct shm_rec *rec)
{
    uint32_t off = (uint32_t)(conn->tail & conn->ring_mask);

    if (conn->frag_off)
        return "pad in the middle of a message";
    if (rec->flags || rec->nsge || rec->rsvd || rec->psn || rec->len || rec->imm || rec->raddr ||
        rec->rkey)
        return "pad fields";
    if (!off || rec->size != conn->ring_bytes - off)
        return "pad size";
    return NULL;
}

/* Carry out the peer's requests; > 0 when any was. */
static int shm_take_requests(struct shm_conn *conn, struct shm_hold *h)
{
    struct shm_rsge rs[SHM_MAX_SGE];
    struct shm_rec rec;
    const char *bad = NULL;
    uint64_t sum, kicked = conn->tail;
    uint32_t part;
    int did = 0, ret = 1, more;

    for (unsigned i = 0; i < SHM_TURN_RECS && conn->state == SHM_CONN_UP; i++) {
        /* the record at our position is written when its size word is not 0 (the size
         * checked is the one in the copy below) */
        if (!__atomic_load_n(exs__shm_rx_stamp(conn), __ATOMIC_ACQUIRE))
            break;
        SHM_TSAN_ACQUIRE();
        /* (a header never wraps: one fixed-size copy, no call) */
        memcpy(&rec, conn->rx_ring + (conn->tail & conn->ring_mask), sizeof(rec));
        SHM_ONCE();
        if (EXS_UNLIKELY(rec.type == SHM_REC_PAD)) { /* the hot window: on to the next lap */
            bad = shm_pad_check(conn, &rec);
            if (bad)
                break;
            conn->tail += rec.size;
            did++;
            continue;
        }
        /* (the writer keeps a slot free beyond each record: at most a ring less a slot) */
        bad = shm_rec_check(conn, &rec, conn->ring_bytes - SHM_SLOT);
        if (bad)
            break;
        sum = 0;
        if (rec.nsge) {
            shm_ring_get(rs, conn->rx_ring, conn->ring_bytes, conn->tail + SHM_REC_HDR,
                         rec.nsge * (uint32_t)sizeof(rs[0]));
            SHM_ONCE();
            for (int k = 0; k < rec.nsge; k++) {
                sum += rs[k].len;
                if (rs[k].len > rec.len || sum > rec.len)
                    break;
            }
        }
        if (!(rec.flags & (SHM_RF_INLINE | SHM_RF_FRAG)) && rec.type != SHM_REC_READ &&
            sum != rec.len) {
            bad = "record sges and length disagree";
            break;
        }
        if (rec.type == SHM_REC_READ && sum != rec.len) {
            bad = "read destination and length disagree";
            break;
        }
        /* a fragment: its part of the message, and whether more follow */
        part = rec.len;
        more = 0;
        if (EXS_UNLIKELY(rec.flags & SHM_RF_FRAG)) {
            part = EXS_MIN(rec.len - conn->frag_off, conn->frag_bytes);
            more = conn->frag_off + part < rec.len;
        }
        if (conn->rx_drop) {
            ret = 1; /* after RNR_EXC: consumed and dropped */
        } else {
            ret = shm_do_rec(conn, &rec, rs, rec.nsge, conn->tail + SHM_REC_HDR, part, h);
            if (ret <= 0) {
                if (ret == 0 || conn->state != SHM_CONN_UP)
                    break;
                continue; /* RNR_EXC: the held request is dropped on the next pass */
            }
            if (!more) {
                conn->ack = rec.psn + 1;
                SHM_CNT_INC_OWNED(conn->ctx->cnt.recs_rx); /* (nic_lock) */
            }
        }
        conn->tail += rec.size;
        did++;
        if (more) {
            if (!conn->frag_off)
                conn->frag_rec = rec;
            conn->frag_off += part;
            /* the room at once: the requester writes the next fragments while we copy
             * these out. A sleeping requester gets its doorbell each half ring freed
             * (SHM_KICK_DIV), not only at the end of the turn: waiting for the end made
             * the two copies take turns (1 MiB in, then 1 MiB out: 90-115 Gbit/s on a
             * quiet host, the same as one process_vm_readv), a doorbell within the turn
             * keeps both cores copying (180-250 Gbit/s). Each half ring rather than each
             * quarter (h69): a requester woken for a quarter filled it and slept again,
             * one sleep and wake-up per MiB with rings of 4 MiB; per half ring, half as
             * many, and the half still queued (2 MiB, some 30 us of copying) covers its
             * wake-up (1 MiB STREAM --mode direct: 1.75 -> 0.99 context switches and 43
             * -> 39 us of CPU per MiB, both processes) */
            SHM_TSAN_RELEASE();
            __atomic_store_n(&conn->mine->tail, conn->tail, __ATOMIC_SEQ_CST);
            if (conn->tail - kicked >= conn->ring_bytes / SHM_KICK_DIV) {
                kicked = conn->tail;
                exs__shm_conn_kick(conn);
            }
            continue;
        }
        conn->frag_off = 0;
        conn->rcv_nxt++;
    }
    if (bad || conn->state != SHM_CONN_UP)
        shm_hold_drop(conn->ctx, h);
    if (bad) {
        shm_proto_error(conn, bad);
        return 1;
    }
    if (conn->state != SHM_CONN_UP)
        return did + (ret < 0);
    /* (with ctx->lock held when the last requests were inline: the answers next) tail and
     * ack published by the caller once ctx->lock is given back (shm_publish_answers) */
    if (did || ret < 0)
        conn->answers_due = 1;
    return did;
}

/* The answers of a turn that took requests: the tail released, then the ack (a sleeper's
 * look reads the ack before the tail: shm_prepare_sleep). After ctx->lock is given back:
 * the lock's locked exchange would wait for our line to be taken back from the peer, who
 * reads it every turn. The fence before the look at the peer's flag is owed to our next
 * turn or sleep (SHM_FENCE_LATER, exs__shm_conn_pay_kick); under TSan the ack is
 * sequentially consistent and the look comes now (one locked store, not two). */
static void shm_publish_answers(struct shm_conn *conn)
{
    /* also when the answers' turn ended the connection (a lie in the peer's line): the
     * segment stays mapped until the connection is freed after the turn, and a peer that
     * takes what we finished (its DISCONNECT's and its death's paths) reads them there; the
     * look is for a connection still UP only (an ended one's peer hears the socket) */
    conn->answers_due = 0;
    SHM_TSAN_RELEASE();
    __atomic_store_n(&conn->mine->tail, conn->tail, __ATOMIC_RELEASE);
#if SHM_FENCE_LATER
    __atomic_store_n(&conn->mine->ack, conn->ack, __ATOMIC_RELEASE);
    conn->fence_owed = conn->state == SHM_CONN_UP;
#else
    __atomic_store_n(&conn->mine->ack, conn->ack, __ATOMIC_SEQ_CST);
    if (conn->state == SHM_CONN_UP)
        exs__shm_conn_kick(conn);
#endif
}

int exs__shm_conn_service(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_hold h = {0, 0};
    int did = 0, lied;

    if (conn->state != SHM_CONN_UP || !conn->ep)
        return 0;
    /* the send queue's waiting posts and a lie found by a post need ctx->lock; most turns
     * have neither (posts write into the ring themselves): a look at ep->pend, no lock */
    if (__atomic_load_n(&conn->ep->pend, __ATOMIC_RELAXED)) {
        exs__lite_lock(&ctx->lock);
        lied = conn->kick < 0;
        if (!lied && !exs_list_empty(&conn->ep->sq_pend))
            exs__shm_ep_push_locked(conn->ep);
        lied = conn->kick < 0;
        exs__lite_unlock(&ctx->lock);
        if (lied) {
            shm_proto_error(conn, "ring tail");
            return 1;
        }
    }
    /* a turn woken by answers alone (the requester's) skips the requests' loop */
    if (__atomic_load_n(exs__shm_rx_stamp(conn), __ATOMIC_RELAXED))
        did += shm_take_requests(conn, &h);
    if (conn->state == SHM_CONN_UP)
        did += shm_take_answers(conn, &h);
    shm_hold_drop(ctx, &h);
    if (conn->answers_due)
        shm_publish_answers(conn);
    if (conn->state == SHM_CONN_UP && __atomic_load_n(&conn->ep->pend, __ATOMIC_RELAXED))
        did += shm_bad_head(conn);
    return did;
}

int exs__shm_conn_busy(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;
    uint32_t rec = __atomic_load_n(exs__shm_rx_stamp(conn), __ATOMIC_SEQ_CST);
    int busy = 0;

    if (!conn->ep)
        return 0;
    if (!conn->nak_seen && __atomic_load_n(&conn->peer->nak_syn, __ATOMIC_SEQ_CST))
        return 1;
    if (__atomic_load_n(&conn->peer->ack, __ATOMIC_SEQ_CST) != conn->acked)
        return 1;
    exs__lite_lock(&ctx->lock);
    if (rec && !conn->rx_drop)
        busy = !conn->rnr_at || exs__shm_rq_ready(conn->ep) || exs__now_ns() >= conn->rnr_at;
    else if (rec)
        busy = 1;
    if (!busy && !exs_list_empty(&conn->ep->sq_pend)) {
        struct shm_wr *wr = exs_list_entry(conn->ep->sq_pend.next, struct shm_wr, link);
        uint64_t t = __atomic_load_n(&conn->peer->tail, __ATOMIC_SEQ_CST);

        busy = wr->bad || t != conn->peer_tail;
    }
    exs__lite_unlock(&ctx->lock);
    return busy;
}
