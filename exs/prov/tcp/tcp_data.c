/* SPDX-License-Identifier: MIT */
/* The tcp provider's send side: post_send/post_recv, send-queue completions and the NIC's transmit
 * engine. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- helpers ---- */

void exs__tcp_wr_cqe(const struct tcp_ep *ep, const struct tcp_wr *wr, enum exs_prov_wc_status st,
                     struct exs_prov_cqe *cqe)
{
    memset(cqe, 0, sizeof(*cqe));
    cqe->wr_id = wr->wr_id;
    cqe->ep = (struct exs_prov_ep *)&ep->base;
    cqe->status = st;
    cqe->opcode = exs__prov_wr_wc_opcode(wr->opcode);
    cqe->byte_len = st == EXS_PROV_WC_SUCCESS ? wr->len : 0;
}

void exs__tcp_rwr_cqe(const struct tcp_ep *ep, const struct exs_soft_rwr *rwr,
                      enum exs_prov_wc_status st, struct exs_prov_cqe *cqe)
{
    memset(cqe, 0, sizeof(*cqe));
    cqe->wr_id = rwr->wr_id;
    cqe->ep = (struct exs_prov_ep *)&ep->base;
    cqe->status = st;
    cqe->opcode = EXS_PROV_WC_RECV;
}

/* iovecs for bytes [off, off+limit) of the segments; returns the count. */
int exs__tcp_iov_fill(struct iovec *iov, int max, const struct exs_prov_sge *seg, int nseg,
                      uint64_t off, uint64_t limit)
{
    int n = 0;

    for (int i = 0; i < nseg && n < max && limit; i++) {
        uint64_t l = seg[i].length;

        if (off >= l) {
            off -= l;
            continue;
        }
        l -= off;
        if (l > limit)
            l = limit;
        iov[n].iov_base = (void *)(uintptr_t)(seg[i].addr + off);
        iov[n].iov_len = (size_t)l;
        n++;
        limit -= l;
        off = 0;
    }
    return n;
}

void exs__tcp_hdr_init(struct tcp_wire_hdr *h, uint8_t type, uint32_t len)
{
    memset(h, 0, sizeof(*h));
    h->magic = htonl(TCP_WIRE_MAGIC);
    h->version = TCP_WIRE_VERSION;
    h->type = type;
    h->len = htonl(len);
}

/* ---- posting ---- */

int exs__tcp_post_send(struct exs_prov_ep *e, const struct exs_prov_send_wr *swr)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_ctx *ctx = ep->ctx;
    const struct exs_prov_caps *caps = &ctx->base.caps;
    struct exs_prov_cqe cqe;
    struct tcp_wr *wr;
    uint64_t total = 0;
    size_t nsge, extra, need;
    int inl, state, pooled;

    if (EXS_UNLIKELY(!swr || (unsigned)swr->opcode > EXS_PROV_WR_RDMA_READ || swr->num_sge < 0 ||
                     (uint32_t)swr->num_sge > caps->max_sge || (swr->num_sge && !swr->sg_list)))
        return -EINVAL;
    for (int i = 0; i < swr->num_sge; i++)
        total += swr->sg_list[i].length;
    inl = (swr->flags & EXS_PROV_SEND_INLINE) && swr->opcode != EXS_PROV_WR_RDMA_READ;
    if (EXS_UNLIKELY(total > caps->max_msg_size || (inl && total > ep->base.attr.max_inline)))
        return -EINVAL;

    nsge = inl ? 1 : (size_t)swr->num_sge;
    extra = inl ? (size_t)total : 0;
    need = sizeof(*wr) + nsge * sizeof(wr->sge[0]) + extra;
    pooled = need <= ep->wr_pool.size;

    /* the request is filled and queued in one hold of the ep lock, which also guards the
     * pool; malloc only when the pool has no block (or the request is larger) */
    pthread_mutex_lock(&ep->lock);
    wr = pooled ? exs__soft_pool_get_locked(&ep->wr_pool) : NULL;
    if (!wr) {
        pthread_mutex_unlock(&ep->lock);
        wr = malloc(pooled ? ep->wr_pool.size : need);
        if (!wr)
            return -ENOMEM;
        pthread_mutex_lock(&ep->lock);
    }
    wr->pooled = (uint8_t)pooled;
    wr->wr_id = swr->wr_id;
    wr->opcode = (uint8_t)swr->opcode;
    wr->state = TCP_WR_PENDING;
    wr->signaled = !!(swr->flags & EXS_PROV_SEND_SIGNALED);
    wr->fence = !!(swr->flags & EXS_PROV_SEND_FENCE);
    wr->len = (uint32_t)total;
    wr->imm = swr->imm_data;
    wr->raddr = swr->remote_addr;
    wr->rkey = swr->rkey;
    wr->psn = 0;
    wr->bad = 0;
    wr->post_ns = exs__tcp_emu_on(ctx) ? exs__now_ns() : 0;
    if (inl) {
        uint8_t *p = (uint8_t *)&wr->sge[1];

        for (int i = 0; i < swr->num_sge; i++) {
            if (!swr->sg_list[i].length)
                continue;
            memcpy(p, (const void *)(uintptr_t)swr->sg_list[i].addr, swr->sg_list[i].length);
            p += swr->sg_list[i].length;
        }
        wr->sge[0].addr = (uint64_t)(uintptr_t)&wr->sge[1];
        wr->sge[0].length = (uint32_t)total;
        wr->sge[0].lkey = 0;
        wr->num_sge = 1;
    } else {
        if (nsge)
            memcpy(wr->sge, swr->sg_list, nsge * sizeof(wr->sge[0]));
        wr->num_sge = swr->num_sge;
        if (exs__tcp_mr_check_local(
                ctx, wr->sge, wr->num_sge,
                swr->opcode == EXS_PROV_WR_RDMA_READ ? EXS_PROV_ACCESS_LOCAL_WRITE : 0))
            wr->bad = 1;
    }

    state = ep->state;
    if (EXS_UNLIKELY(state == EXS_PROV_EP_IDLE || state == EXS_PROV_EP_CONNECTING)) {
        exs__tcp_wr_put_locked(ep, wr);
        pthread_mutex_unlock(&ep->lock);
        return -ENOTCONN;
    }
    if (EXS_UNLIKELY(ep->sq_used + __atomic_load_n(&ep->cq_sq, __ATOMIC_RELAXED) >=
                     ep->base.attr.max_send_wr)) {
        /* every slot is an outstanding request or a completion not yet polled */
        exs__tcp_wr_put_locked(ep, wr);
        pthread_mutex_unlock(&ep->lock);
        return -ENOMEM;
    }
    if (EXS_UNLIKELY(state == EXS_PROV_EP_ERROR)) {
        exs__tcp_wr_cqe(ep, wr, EXS_PROV_WC_WR_FLUSH_ERR, &cqe);
        EXS_CNT_INC(ctx->cnt.flushed_wrs);
        exs__tcp_cq_push(ctx, ep, &cqe);
        exs__tcp_wr_put_locked(ep, wr);
        pthread_mutex_unlock(&ep->lock);
        return 0;
    }
    ep->sq_used++;
    exs_list_add_tail(&ep->sq_pend, &wr->link);
    pthread_mutex_unlock(&ep->lock);
    EXS_DATA(PROV, "ep %p: post_send wr_id %llu opcode %d len %llu", (void *)ep,
             (unsigned long long)swr->wr_id, swr->opcode, (unsigned long long)total);
    exs__tcp_ep_work(ctx, ep);
    /* Write it from this thread when the NIC role is free (what would block stays
     * queued for EPOLLOUT); else the holder's next turn takes it (wakefd). */
    exs__tcp_ctx_kick(ctx);
    return 0;
}

int exs__tcp_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *rwr_in)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_ctx *ctx = ep->ctx;
    struct exs_prov_cqe cqe;
    struct exs_soft_rwr *rwr;
    uint64_t len;
    int pooled, ret = exs__soft_rwr_check(rwr_in, ctx->base.caps.max_sge, &len);

    if (ret)
        return ret;
    pooled = rwr_in->num_sge <= TCP_RWR_POOL_SGE;

    /* checked, filled and queued in one hold of the ep lock, which also guards the pool */
    pthread_mutex_lock(&ep->lock);
    rwr = pooled ? exs__soft_pool_get_locked(&ep->rwr_pool) : NULL;
    if (!rwr) {
        pthread_mutex_unlock(&ep->lock);
        rwr = malloc(pooled ? ep->rwr_pool.size
                            : sizeof(*rwr) + (size_t)rwr_in->num_sge * sizeof(rwr->sge[0]));
        if (!rwr)
            return -ENOMEM;
        pthread_mutex_lock(&ep->lock);
    }
    exs__soft_rwr_fill(rwr, rwr_in, len);
    rwr->pooled = (uint8_t)pooled; /* its local key: checked when taken (tcp_conn_take_recv) */
    if (ep->rq_count + __atomic_load_n(&ep->cq_rq, __ATOMIC_RELAXED) >= ep->base.attr.max_recv_wr) {
        /* every slot is a posted receive or a completion not yet polled */
        exs__tcp_rwr_put_locked(ep, rwr);
        pthread_mutex_unlock(&ep->lock);
        return -ENOMEM;
    }
    if (ep->state == EXS_PROV_EP_ERROR) {
        exs__tcp_rwr_cqe(ep, rwr, EXS_PROV_WC_WR_FLUSH_ERR, &cqe);
        EXS_CNT_INC(ctx->cnt.flushed_wrs);
        exs__tcp_cq_push(ctx, ep, &cqe);
        exs__tcp_rwr_put_locked(ep, rwr);
        pthread_mutex_unlock(&ep->lock);
        return 0;
    }
    ep->rq_count++;
    exs_list_add_tail(&ep->rq, &rwr->link);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* ---- completions (NIC) ---- */

/* Complete wr (on ep->sq) with st; retire slots as verbs does. */
void exs__tcp_ep_wr_done(struct tcp_ep *ep, struct tcp_wr *wr, enum exs_prov_wc_status st)
{
    struct exs_prov_cqe cqe;

    pthread_mutex_lock(&ep->lock);
    exs_list_del(&wr->link);
    if (st != EXS_PROV_WC_SUCCESS || wr->signaled) {
        exs__tcp_wr_cqe(ep, wr, st, &cqe);
        exs__tcp_cq_push(ep->ctx, ep, &cqe);
        ep->sq_used -= 1 + ep->sq_unretired;
        ep->sq_unretired = 0;
    } else {
        ep->sq_unretired++;
    }
    if (wr->opcode == EXS_PROV_WR_RDMA_READ && ep->reads_out)
        ep->reads_out--;
    exs__tcp_wr_put_locked(ep, wr);
    pthread_mutex_unlock(&ep->lock);
}

void exs__tcp_wr_put_locked(struct tcp_ep *ep, struct tcp_wr *wr)
{
    exs__soft_pool_release_locked(&ep->wr_pool, wr, wr->pooled);
}

void exs__tcp_rwr_put_locked(struct tcp_ep *ep, struct exs_soft_rwr *rwr)
{
    exs__soft_pool_release_locked(&ep->rwr_pool, rwr, rwr->pooled);
}

/* Every framed request with psn before upto (exclusive) succeeded. */
void exs__tcp_ep_ack_before(struct tcp_ep *ep, uint32_t upto)
{
    struct exs_list *l;

    while ((l = ep->sq.next) != &ep->sq) {
        struct tcp_wr *wr = exs_list_entry(l, struct tcp_wr, link);

        if ((int32_t)(wr->psn - upto) >= 0)
            break;
        exs__tcp_ep_wr_done(ep, wr, EXS_PROV_WC_SUCCESS);
    }
}

/* ---- transmit (NIC) ---- */

void exs__tcp_txq_push(struct tcp_conn *conn, struct tcp_txf *txf)
{
    if (txf) {
        txf->off = 0;
        txf->emu_ok = 0;
        if (exs__tcp_emu_on(conn->ctx) && !txf->ready_ns)
            exs__tcp_emu_stamp(conn, txf, exs__now_ns());
        exs_list_add_tail(&conn->txq, &txf->link);
    }
    if (!conn->tx_dirty && !conn->tx_blocked && conn->fd >= 0) {
        conn->tx_dirty = 1;
        exs_list_add_tail(&conn->ctx->dirty, &conn->dirty_link);
    }
}

struct tcp_txf *exs__tcp_txf_ctrl(struct tcp_conn *conn, uint8_t type, uint32_t len)
{
    struct tcp_txf *f = calloc(1, sizeof(*f) + len);

    if (!f) {
        EXS_ERR(PROV, "conn %p: out of memory for a frame", (void *)conn);
        return NULL;
    }
    f->kind = TCP_TXF_CTRL;
    exs__tcp_hdr_init(&f->hdr, type, len);
    f->one.addr = (uint64_t)(uintptr_t)f->buf;
    f->one.length = len;
    f->seg = &f->one;
    f->nseg = len ? 1 : 0;
    f->total = TCP_WIRE_HDR_LEN + len;
    if (type == TCP_WIRE_ACK || type == TCP_WIRE_NAK)
        conn->ctrl_queued++;
    return f;
}

void exs__tcp_txf_free(struct tcp_ctx *ctx, struct tcp_txf *f)
{
    switch (f->kind) {
    case TCP_TXF_WR:
        break; /* lives in its wr */
    case TCP_TXF_READ_RESP:
        exs__tcp_key_put(ctx, f->key);
        free(f);
        break;
    default:
        free(f);
        break;
    }
}

void exs__tcp_conn_update_events(struct tcp_conn *conn)
{
    uint32_t ev = 0;

    switch (conn->state) {
    case TCP_CONN_CONNECTING:
        ev = EPOLLOUT;
        break;
    case TCP_CONN_WAIT_REPLY:
    case TCP_CONN_WAIT_REQ:
    case TCP_CONN_LINGER:
        ev = EPOLLIN;
        break;
    case TCP_CONN_UP:
        if (conn->rx_phase == TCP_RX_HOLD)
            ev = EPOLLRDHUP; /* the peer ending the connection ends the RNR wait */
        else if (conn->ctrl_queued < TCP_CTRL_MAX(conn->ctx))
            ev = EPOLLIN;
        break;
    default:
        break;
    }
    if (conn->tx_blocked)
        ev |= EPOLLOUT;
    if (exs__tcp_emu_blackholed(conn))
        ev = EPOLLET; /* the link delivers nothing: a reset or hang-up wakes us once */
    exs__tcp_conn_epoll(conn, ev);
    if (conn->lowat > 1)
        exs__tcp_conn_lowat(conn); /* no longer mid-payload (failed, lingering): back to 1 */
    if ((ev & EPOLLIN) && conn->stg_off != conn->stg_len)
        exs__tcp_conn_rx_again(conn); /* read ahead: epoll no longer sees those bytes */
}

/* A frame left completely. */
static void tcp_txf_sent(struct tcp_conn *conn, struct tcp_txf *f)
{
    struct tcp_ctx *ctx = conn->ctx;
    uint8_t type = f->hdr.type;

    EXS_CNT_INC(ctx->cnt.frames_tx);
    exs_list_del(&f->link);
    if (type == TCP_WIRE_ACK) {
        EXS_CNT_INC(ctx->cnt.acks_tx);
    } else if (type == TCP_WIRE_NAK) {
        EXS_CNT_INC(ctx->cnt.naks_tx);
    }
    if (type == TCP_WIRE_ACK || type == TCP_WIRE_NAK || type == TCP_WIRE_READ_RESP) {
        if (conn->ctrl_queued-- == TCP_CTRL_MAX(conn->ctx))
            exs__tcp_conn_update_events(conn);
    }
    if (f == conn->last_resp)
        conn->last_resp = NULL;
    if (f->kind == TCP_TXF_READ_RESP && --conn->resp_pending == 0 && conn->hold_resp) {
        /* a SEND/WRITE waited for the region to be read: retry it next turn */
        conn->hold_resp = 0;
        conn->rnr_at = 1;
        exs__tcp_conn_timer(conn);
    }
    if (f->kind == TCP_TXF_WR)
        exs_container_of(f, struct tcp_wr, txf)->state = TCP_WR_SENT;
    else
        exs__tcp_txf_free(ctx, f);
}

/* Before a sendmsg: check the keys of the queued READ responses and raise the copy
 * fence over them. A response whose key was revoked (or whose mr was deregistered)
 * and that has not started becomes a NAK with a remote access error in its place;
 * one already half sent cannot be finished, so the connection is cut. Returns 1
 * with the fence raised, 0 without, -1 when the connection was cut. *naked is set
 * when a response became a NAK (the connection then ends after it). */
static int tcp_conn_resp_fence(struct tcp_conn *conn, int *naked)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct exs_list *pos;
    int live = 0, cut = 0;

    pthread_mutex_lock(&ctx->mr_lock);
    exs_list_for_each(pos, &conn->txq)
    {
        struct tcp_txf *f = exs_list_entry(pos, struct tcp_txf, link);

        if (f->kind != TCP_TXF_READ_RESP)
            continue;
        if (f->key->live) {
            live = 1;
            continue;
        }
        if (f->off) {
            cut = 1;
            break;
        }
        exs__tcp_key_put_locked(ctx, f->key);
        f->key = NULL;
        f->kind = TCP_TXF_CTRL;
        f->hdr.type = TCP_WIRE_NAK;
        f->hdr.syndrome = TCP_WIRE_SYN_REM_ACCESS;
        f->hdr.len = 0;
        f->seg = NULL;
        f->nseg = 0;
        f->total = TCP_WIRE_HDR_LEN;
        if (f == conn->last_resp)
            conn->last_resp = NULL;
        conn->resp_pending--;
        *naked = 1;
    }
    if (live && !cut) /* READ responses of several keys may leave in one sendmsg */
        exs__soft_fence_raise_locked(&ctx->keys, NULL);
    pthread_mutex_unlock(&ctx->mr_lock);
    if (cut) {
        EXS_CNT_INC(ctx->cnt.access_errors);
        EXS_DBG(PROV, "conn %p ep %p: read response cut: key revoked", (void *)conn,
                (void *)conn->ep);
        exs__tcp_conn_fail(conn, -ECONNABORTED, 0, 0, TCP_END_ABORT);
        return -1;
    }
    return live;
}

void exs__tcp_conn_tx(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct iovec iov[TCP_TX_IOV];
    struct msghdr msg;
    int emu = exs__tcp_emu_on(ctx);
    uint64_t now = 0, hold = 0;
    ssize_t n, sent;
    int naked = 0;

    if (conn->fd < 0 || conn->state == TCP_CONN_CONNECTING || conn->state == TCP_CONN_DEAD)
        return;
    if (EXS_UNLIKELY(exs__tcp_emu_blackholed(conn))) {
        exs__tcp_conn_update_events(conn); /* frames stay queued */
        return;
    }
    conn->tx_blocked = 0;
    for (;;) {
        struct exs_list *pos;
        uint64_t budget = UINT64_MAX;
        size_t want = 0;
        int niov = 0, fence = 0;

        hold = 0;
        if (emu) {
            now = exs__now_ns();
            budget = exs__tcp_emu_budget(conn, now, &hold);
            if (!budget)
                break;
        }
        if (conn->resp_pending) {
            /* before the iovecs point into any region */
            fence = tcp_conn_resp_fence(conn, &naked);
            if (fence < 0)
                return;
        }
        exs_list_for_each(pos, &conn->txq)
        {
            struct tcp_txf *f = exs_list_entry(pos, struct tcp_txf, link);
            uint64_t off = f->off;

            if (niov >= TCP_TX_IOV - 1 || want >= budget)
                break;
            if (emu && !f->emu_ok) {
                hold = exs__tcp_emu_ready(conn, f, now);
                if (hold)
                    break;
                f->emu_ok = 1;
            }
            if (f == conn->ack_txf)
                conn->ack_txf = NULL; /* started: no more coalescing into it */
            if (off < TCP_WIRE_HDR_LEN) {
                iov[niov].iov_base = (uint8_t *)&f->hdr + off;
                iov[niov].iov_len = TCP_WIRE_HDR_LEN - off;
                want += iov[niov].iov_len;
                niov++;
                off = 0;
            } else {
                off -= TCP_WIRE_HDR_LEN;
            }
            if (f->total > TCP_WIRE_HDR_LEN) {
                int k = exs__tcp_iov_fill(&iov[niov], TCP_TX_IOV - niov, f->seg, f->nseg, off,
                                          f->total - TCP_WIRE_HDR_LEN - off);

                for (int i = 0; i < k; i++)
                    want += iov[niov + i].iov_len;
                niov += k;
            }
        }
        while (want > budget) {
            /* the rate allows only part of it */
            size_t excess = want - (size_t)budget;

            if (iov[niov - 1].iov_len > excess) {
                iov[niov - 1].iov_len -= excess;
                want -= excess;
            } else {
                want -= iov[niov - 1].iov_len;
                niov--;
            }
        }
        if (!niov) {
            if (fence)
                exs__tcp_copy_end(ctx);
            break;
        }
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)niov;
        TCP_TSAN_RELEASE();
        n = exs__nc_sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        EXS_CNT_INC(ctx->cnt.tx_calls);
        if (fence) {
            int e = errno;

            exs__tcp_copy_end(ctx);
            errno = e;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                conn->tx_blocked = 1;
                EXS_CNT_INC(ctx->cnt.tx_full);
                break;
            }
            EXS_DBG(PROV, "conn %p: send: %m", (void *)conn);
            exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, TCP_END_ABORT);
            return;
        }
        EXS_CNT_ADD(ctx->cnt.bytes_tx, n);
        if (emu)
            exs__tcp_emu_sent(conn, (uint64_t)n, now);
        sent = n;
        while (n > 0) {
            struct tcp_txf *f = exs_list_entry(conn->txq.next, struct tcp_txf, link);
            uint64_t left = f->total - f->off;

            if ((uint64_t)n < left) {
                f->off += (uint64_t)n;
                break;
            }
            n -= (ssize_t)left;
            f->off = f->total;
            tcp_txf_sent(conn, f);
        }
        if ((size_t)sent < want) {
            /* short write: the socket is full */
            conn->tx_blocked = 1;
            EXS_CNT_INC(ctx->cnt.tx_full);
            break;
        }
    }
    if (naked && conn->state == TCP_CONN_UP) {
        /* a READ was refused (key revoked): the requester's ep goes to ERROR, ours too */
        EXS_CNT_INC(ctx->cnt.access_errors);
        exs__tcp_conn_fail(conn, -ECONNABORTED, 0, 0, TCP_END_QUIET);
        return;
    }
    if (hold && !conn->tx_blocked) {
        conn->tx_at = hold;
        exs__tcp_conn_timer(conn);
    }
    if (conn->state == TCP_CONN_LINGER && exs_list_empty(&conn->txq) && !conn->shut_wr) {
        conn->shut_wr = 1;
        shutdown(conn->fd, SHUT_WR);
    }
    exs__tcp_conn_update_events(conn);
}

static void tcp_wr_frame(struct tcp_ep *ep, struct tcp_wr *wr)
{
    struct tcp_txf *f = &wr->txf;
    static const uint8_t type[] = {
        [EXS_PROV_WR_SEND] = TCP_WIRE_SEND,
        [EXS_PROV_WR_SEND_WITH_IMM] = TCP_WIRE_SEND,
        [EXS_PROV_WR_RDMA_WRITE] = TCP_WIRE_WRITE,
        [EXS_PROV_WR_RDMA_WRITE_WITH_IMM] = TCP_WIRE_WRITE,
        [EXS_PROV_WR_RDMA_READ] = TCP_WIRE_READ_REQ,
    };
    int read = wr->opcode == EXS_PROV_WR_RDMA_READ;

    f->kind = TCP_TXF_WR;
    exs__tcp_hdr_init(&f->hdr, type[wr->opcode], read ? 0 : wr->len);
    wr->psn = ep->snd_nxt++;
    f->hdr.psn = htonl(wr->psn);
    if (wr->opcode == EXS_PROV_WR_SEND_WITH_IMM || wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM) {
        f->hdr.flags = TCP_WIRE_F_IMM;
        f->hdr.imm = htonl(wr->imm);
    }
    if (wr->opcode >= EXS_PROV_WR_RDMA_WRITE) {
        f->hdr.raddr = htobe64(wr->raddr);
        f->hdr.rkey = htonl(wr->rkey);
    }
    if (read)
        f->hdr.imm = htonl(wr->len);
    f->seg = wr->sge;
    f->nseg = read ? 0 : wr->num_sge;
    f->total = TCP_WIRE_HDR_LEN + (read ? 0 : wr->len);
    f->key = NULL;
    f->ready_ns = 0;
    if (exs__tcp_emu_on(ep->ctx))
        exs__tcp_emu_stamp(ep->conn, f, wr->post_ns);
    wr->state = TCP_WR_QUEUED;
}

/* Frame what may go now: stops at a fence, the READ limit or a bad request. */
void exs__tcp_ep_tx_fill(struct tcp_ep *ep)
{
    struct tcp_conn *conn = ep->conn;
    struct exs_prov_cqe cqe;
    struct exs_list *l;

    if (!conn || conn->state != TCP_CONN_UP)
        return;
    while ((l = ep->sq_wait.next) != &ep->sq_wait) {
        struct tcp_wr *wr = exs_list_entry(l, struct tcp_wr, link);

        if (wr->bad) {
            if (!exs_list_empty(&ep->sq))
                return; /* complete in order: after everything before it */
            EXS_DBG(PROV, "ep %p: wr_id %llu: local protection error", (void *)ep,
                    (unsigned long long)wr->wr_id);
            exs_list_del(&wr->link);
            exs__tcp_wr_cqe(ep, wr, EXS_PROV_WC_LOC_PROT_ERR, &cqe);
            exs__tcp_conn_fail_cqe(conn, -ECONNABORTED, 0, 0, TCP_END_DISCONNECT, &cqe);
            free(wr);
            return;
        }
        if (wr->fence && ep->reads_out)
            return;
        if (wr->opcode == EXS_PROV_WR_RDMA_READ) {
            if (ep->reads_out >= TCP_MAX_RD)
                return;
            ep->reads_out++;
        }
        if (conn->ack_deferred) {
            /* the ACK this side owes rides in front of the request, in one sendmsg */
            exs__tcp_conn_ack_undefer(conn);
            exs__tcp_conn_ack_flush(conn);
        }
        exs_list_del(&wr->link);
        exs_list_add_tail(&ep->sq, &wr->link);
        tcp_wr_frame(ep, wr);
        exs__tcp_txq_push(conn, &wr->txf);
    }
}

/* NIC: take newly posted sends of ep and frame them. */
void exs__tcp_ep_take(struct tcp_ep *ep)
{
    struct exs_list *l;

    if (ep->destroyed)
        return;
    pthread_mutex_lock(&ep->lock);
    while ((l = exs_list_pop_head(&ep->sq_pend)) != NULL) {
        exs_list_entry(l, struct tcp_wr, link)->state = TCP_WR_QUEUED;
        exs_list_add_tail(&ep->sq_wait, l);
    }
    pthread_mutex_unlock(&ep->lock);
    exs__tcp_ep_tx_fill(ep);
}
