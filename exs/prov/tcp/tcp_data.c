/* SPDX-License-Identifier: MIT */
/* The tcp provider's data path: post_send/post_recv and the NIC's transmit and receive engines. */
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
#include "exs/util/util.h"

/* ---- helpers ---- */

static enum exs_prov_wc_opcode tcp_wr_wc_opcode(const struct tcp_wr *wr)
{
    switch (wr->opcode) {
    case EXS_PROV_WR_RDMA_WRITE:
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        return EXS_PROV_WC_RDMA_WRITE;
    case EXS_PROV_WR_RDMA_READ:
        return EXS_PROV_WC_RDMA_READ;
    default:
        return EXS_PROV_WC_SEND;
    }
}

static void tcp_wr_cqe(const struct tcp_ep *ep, const struct tcp_wr *wr,
                       enum exs_prov_wc_status st, struct exs_prov_cqe *cqe)
{
    memset(cqe, 0, sizeof(*cqe));
    cqe->wr_id = wr->wr_id;
    cqe->ep = (struct exs_prov_ep *)&ep->base;
    cqe->status = st;
    cqe->opcode = tcp_wr_wc_opcode(wr);
    cqe->byte_len = st == EXS_PROV_WC_SUCCESS ? wr->len : 0;
}

static void tcp_rwr_cqe(const struct tcp_ep *ep, const struct tcp_rwr *rwr,
                        enum exs_prov_wc_status st, struct exs_prov_cqe *cqe)
{
    memset(cqe, 0, sizeof(*cqe));
    cqe->wr_id = rwr->wr_id;
    cqe->ep = (struct exs_prov_ep *)&ep->base;
    cqe->status = st;
    cqe->opcode = EXS_PROV_WC_RECV;
}

/* iovecs for bytes [off, off+limit) of the segments; returns the count. */
static int tcp_iov_fill(struct iovec *iov, int max, const struct exs_prov_sge *seg, int nseg,
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

static void tcp_hdr_init(struct tcp_wire_hdr *h, uint8_t type, uint32_t len)
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
    size_t nsge, extra;
    int inl, state;

    if (EXS_UNLIKELY(!swr || (unsigned)swr->opcode > EXS_PROV_WR_RDMA_READ ||
                     swr->num_sge < 0 || (uint32_t)swr->num_sge > caps->max_sge ||
                     (swr->num_sge && !swr->sg_list)))
        return -EINVAL;
    for (int i = 0; i < swr->num_sge; i++)
        total += swr->sg_list[i].length;
    inl = (swr->flags & EXS_PROV_SEND_INLINE) && swr->opcode != EXS_PROV_WR_RDMA_READ;
    if (EXS_UNLIKELY(total > caps->max_msg_size || (inl && total > ep->base.attr.max_inline)))
        return -EINVAL;

    nsge = inl ? 1 : (size_t)swr->num_sge;
    extra = inl ? (size_t)total : 0;
    wr = malloc(sizeof(*wr) + nsge * sizeof(wr->sge[0]) + extra);
    if (!wr)
        return -ENOMEM;
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
        if (exs__tcp_mr_check_local(ctx, wr->sge, wr->num_sge,
                                    swr->opcode == EXS_PROV_WR_RDMA_READ
                                        ? EXS_PROV_ACCESS_LOCAL_WRITE : 0))
            wr->bad = 1;
    }

    pthread_mutex_lock(&ep->lock);
    state = ep->state;
    if (EXS_UNLIKELY(state == EXS_PROV_EP_IDLE || state == EXS_PROV_EP_CONNECTING)) {
        pthread_mutex_unlock(&ep->lock);
        free(wr);
        return -ENOTCONN;
    }
    if (EXS_UNLIKELY(state == EXS_PROV_EP_ERROR)) {
        tcp_wr_cqe(ep, wr, EXS_PROV_WC_WR_FLUSH_ERR, &cqe);
        EXS_CNT_INC(ctx->cnt.flushed_wrs);
        exs__tcp_cq_push(ctx, ep, &cqe);
        pthread_mutex_unlock(&ep->lock);
        free(wr);
        return 0;
    }
    if (EXS_UNLIKELY(ep->sq_used >= ep->base.attr.max_send_wr)) {
        pthread_mutex_unlock(&ep->lock);
        free(wr);
        return -ENOMEM;
    }
    ep->sq_used++;
    exs_list_add_tail(&ep->sq_pend, &wr->link);
    pthread_mutex_unlock(&ep->lock);
    EXS_DATA(PROV, "ep %p: post_send wr_id %llu opcode %d len %llu", (void *)ep,
             (unsigned long long)swr->wr_id, swr->opcode, (unsigned long long)total);
    exs__tcp_ep_work(ctx, ep);
    return 0;
}

int exs__tcp_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *rwr_in)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_ctx *ctx = ep->ctx;
    struct exs_prov_cqe cqe;
    struct tcp_rwr *rwr;
    uint64_t total = 0;

    if (!rwr_in || rwr_in->num_sge < 0 || (uint32_t)rwr_in->num_sge > ctx->base.caps.max_sge ||
        (rwr_in->num_sge && !rwr_in->sg_list))
        return -EINVAL;
    for (int i = 0; i < rwr_in->num_sge; i++)
        total += rwr_in->sg_list[i].length;
    rwr = malloc(sizeof(*rwr) + (size_t)rwr_in->num_sge * sizeof(rwr->sge[0]));
    if (!rwr)
        return -ENOMEM;
    rwr->wr_id = rwr_in->wr_id;
    rwr->num_sge = rwr_in->num_sge;
    rwr->len = total;
    if (rwr_in->num_sge)
        memcpy(rwr->sge, rwr_in->sg_list, (size_t)rwr_in->num_sge * sizeof(rwr->sge[0]));
    rwr->bad = exs__tcp_mr_check_local(ctx, rwr->sge, rwr->num_sge,
                                       EXS_PROV_ACCESS_LOCAL_WRITE) != 0;

    pthread_mutex_lock(&ep->lock);
    if (ep->state == EXS_PROV_EP_ERROR) {
        tcp_rwr_cqe(ep, rwr, EXS_PROV_WC_WR_FLUSH_ERR, &cqe);
        EXS_CNT_INC(ctx->cnt.flushed_wrs);
        exs__tcp_cq_push(ctx, ep, &cqe);
        pthread_mutex_unlock(&ep->lock);
        free(rwr);
        return 0;
    }
    if (ep->rq_count >= ep->base.attr.max_recv_wr) {
        pthread_mutex_unlock(&ep->lock);
        free(rwr);
        return -ENOMEM;
    }
    ep->rq_count++;
    exs_list_add_tail(&ep->rq, &rwr->link);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* ---- completions (NIC) ---- */

/* Complete wr (on ep->sq) with st; retire slots as verbs does. */
static void tcp_ep_wr_done(struct tcp_ep *ep, struct tcp_wr *wr, enum exs_prov_wc_status st)
{
    struct exs_prov_cqe cqe;

    pthread_mutex_lock(&ep->lock);
    exs_list_del(&wr->link);
    if (st != EXS_PROV_WC_SUCCESS || wr->signaled) {
        tcp_wr_cqe(ep, wr, st, &cqe);
        exs__tcp_cq_push(ep->ctx, ep, &cqe);
        ep->sq_used -= 1 + ep->sq_unretired;
        ep->sq_unretired = 0;
    } else {
        ep->sq_unretired++;
    }
    pthread_mutex_unlock(&ep->lock);
    if (wr->opcode == EXS_PROV_WR_RDMA_READ && ep->reads_out)
        ep->reads_out--;
    free(wr);
}

/* Every framed request with psn before upto (exclusive) succeeded. */
static void tcp_ep_ack_before(struct tcp_ep *ep, uint32_t upto)
{
    struct exs_list *l;

    while ((l = ep->sq.next) != &ep->sq) {
        struct tcp_wr *wr = exs_list_entry(l, struct tcp_wr, link);

        if ((int32_t)(wr->psn - upto) >= 0)
            break;
        tcp_ep_wr_done(ep, wr, EXS_PROV_WC_SUCCESS);
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
    tcp_hdr_init(&f->hdr, type, len);
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
        exs__tcp_mr_put(ctx, f->mr);
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
        else if (conn->ctrl_queued < TCP_CTRL_MAX)
            ev = EPOLLIN;
        break;
    default:
        break;
    }
    if (conn->tx_blocked)
        ev |= EPOLLOUT;
    exs__tcp_conn_epoll(conn, ev);
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
        if (conn->ctrl_queued-- == TCP_CTRL_MAX)
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

void exs__tcp_conn_tx(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct iovec iov[TCP_TX_IOV];
    struct msghdr msg;
    int emu = exs__tcp_emu_on(ctx);
    uint64_t now = 0, hold = 0;
    ssize_t n, sent;

    if (conn->fd < 0 || conn->state == TCP_CONN_CONNECTING || conn->state == TCP_CONN_DEAD)
        return;
    conn->tx_blocked = 0;
    for (;;) {
        struct exs_list *pos;
        uint64_t budget = UINT64_MAX;
        size_t want = 0;
        int niov = 0;

        hold = 0;
        if (emu) {
            now = exs__now_ns();
            budget = exs__tcp_emu_budget(conn, now, &hold);
            if (!budget)
                break;
        }
        exs_list_for_each(pos, &conn->txq) {
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
                int k = tcp_iov_fill(&iov[niov], TCP_TX_IOV - niov, f->seg, f->nseg, off,
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
        if (!niov)
            break;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)niov;
        n = sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                conn->tx_blocked = 1;
                break;
            }
            EXS_DBG(PROV, "conn %p: send: %m", (void *)conn);
            exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, -1);
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
            break;
        }
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
    tcp_hdr_init(&f->hdr, type[wr->opcode], read ? 0 : wr->len);
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
    f->mr = NULL;
    f->ready_ns = 0;
    if (exs__tcp_emu_on(ep->ctx))
        exs__tcp_emu_stamp(ep->conn, f, wr->post_ns);
    wr->state = TCP_WR_QUEUED;
}

/* Frame what may go now: stops at a fence, the READ limit or a bad request. */
static void tcp_ep_tx_fill(struct tcp_ep *ep)
{
    struct tcp_conn *conn = ep->conn;
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
            exs_list_add_head(&ep->sq, &wr->link);
            tcp_ep_wr_done(ep, wr, EXS_PROV_WC_LOC_PROT_ERR);
            exs__tcp_conn_fail(conn, -ECONNABORTED, 0, 0, 1);
            return;
        }
        if (wr->fence && ep->reads_out)
            return;
        if (wr->opcode == EXS_PROV_WR_RDMA_READ) {
            if (ep->reads_out >= TCP_MAX_RD)
                return;
            ep->reads_out++;
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
    int overflow;

    if (ep->destroyed)
        return;
    pthread_mutex_lock(&ep->lock);
    overflow = __atomic_exchange_n(&ep->overflow, 0, __ATOMIC_RELAXED);
    while ((l = exs_list_pop_head(&ep->sq_pend)) != NULL) {
        exs_list_entry(l, struct tcp_wr, link)->state = TCP_WR_QUEUED;
        exs_list_add_tail(&ep->sq_wait, l);
    }
    pthread_mutex_unlock(&ep->lock);
    if (overflow && ep->state != EXS_PROV_EP_ERROR) {
        if (ep->conn)
            exs__tcp_conn_fail(ep->conn, -ENOSPC, 0, 0, 1);
        else
            exs__tcp_ep_fail(ep, -ENOSPC, 1);
        return;
    }
    tcp_ep_tx_fill(ep);
}

/* ---- receive (NIC) ---- */

static void tcp_conn_proto_err(struct tcp_conn *conn, const char *why)
{
    EXS_ERR(PROV, "conn %p ep %p: protocol error: %s (type %u psn %u len %u)", (void *)conn,
            (void *)conn->ep, why, conn->rh.type, conn->rh.psn, conn->rh.len);
    EXS_CNT_INC(conn->ctx->cnt.protocol_errors);
    exs__tcp_conn_fail(conn, -EPROTO, 0, 0, 0);
}

static void tcp_conn_ack_flush(struct tcp_conn *conn)
{
    struct tcp_txf *f;

    if (!conn->ack_count || conn->state != TCP_CONN_UP)
        return;
    conn->ack_count = 0;
    if (conn->ack_txf && !exs__tcp_emu_on(conn->ctx)) {
        conn->ack_txf->hdr.psn = htonl(conn->ack_psn);
        return;
    }
    f = exs__tcp_txf_ctrl(conn, TCP_WIRE_ACK, 0);
    if (!f)
        return;
    f->hdr.psn = htonl(conn->ack_psn);
    conn->ack_txf = f;
    exs__tcp_txq_push(conn, f);
}

static void tcp_conn_nak(struct tcp_conn *conn, uint8_t syn, int status)
{
    exs__tcp_conn_fail(conn, status, syn, conn->rh.psn, 0);
}

/* Give back what the receive state holds (conn failing or closing). */
void exs__tcp_rx_release(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;

    if (conn->rx_mr) {
        exs__tcp_mr_put(conn->ctx, conn->rx_mr);
        conn->rx_mr = NULL;
    }
    if (conn->rx_rwr) {
        if (ep) {
            pthread_mutex_lock(&ep->lock);
            exs_list_add_head(&ep->rq, &conn->rx_rwr->link);
            ep->rq_count++;
            pthread_mutex_unlock(&ep->lock);
        } else {
            free(conn->rx_rwr);
        }
        conn->rx_rwr = NULL;
    }
    conn->rx_wr = NULL;
    conn->rx_phase = TCP_RX_HDR;
    conn->rx_retry = 0;
    conn->rx_discard = 0;
    conn->hold_resp = 0;
    conn->hgot = 0;
    conn->rnr_at = 0;
}

/* The pause between RNR retries: this ep's timer (or the tunable), or the
 * requester's when that is longer. */
static uint32_t tcp_conn_rnr_ms(const struct tcp_conn *conn)
{
    const struct tcp_ep *ep = conn->ep;
    uint32_t ms = ep->base.attr.rnr_timer_ms ? ep->base.attr.rnr_timer_ms : ep->ctx->rnr_timer_ms;

    return EXS_MAX(ms, (uint32_t)conn->peer_rnr_timer_ms);
}

/* Consume the current frame's payload into a sink. */
static void tcp_conn_rx_discard(struct tcp_conn *conn)
{
    if (conn->rx_mr) {
        exs__tcp_mr_put(conn->ctx, conn->rx_mr);
        conn->rx_mr = NULL;
    }
    conn->rx_seg = NULL;
    conn->rx_nseg = 0;
    conn->rx_len = conn->rh.len;
    conn->rx_off = 0;
    conn->rx_discard = conn->rh.len != 0;
    conn->rx_phase = conn->rh.len ? TCP_RX_PAYLOAD : TCP_RX_HDR;
}

/* The held request is given up: the requester is gone or out of retries. Later
 * requests already in flight are consumed and dropped (as a responder drops
 * packets after a NAK); the connection itself lives on until a disconnect. */
static void tcp_conn_drop_held(struct tcp_conn *conn)
{
    conn->rnr_at = 0;
    conn->hold_resp = 0;
    conn->rnr_tries = 0;
    exs__tcp_conn_timer(conn);
    conn->rx_drop = 1;
    conn->ack_count = 0; /* the NAK (if any) acknowledges everything before it */
    tcp_conn_rx_discard(conn);
}

/* SEND or WRITE_WITH_IMM needs a receive: 1 got it, 0 holding (RNR), -1 dropped (NAK sent). */
static int tcp_conn_take_recv(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;
    struct tcp_ctx *ctx = conn->ctx;
    struct exs_list *l;
    struct tcp_txf *f;
    uint64_t ms;

    pthread_mutex_lock(&ep->lock);
    l = exs_list_pop_head(&ep->rq);
    if (l)
        ep->rq_count--;
    pthread_mutex_unlock(&ep->lock);
    if (l) {
        conn->rx_rwr = exs_list_entry(l, struct tcp_rwr, link);
        conn->rnr_tries = 0;
        return 1;
    }
    if (conn->peer_rnr_retry >= 7 || conn->rnr_tries < conn->peer_rnr_retry) {
        conn->rnr_tries++;
        EXS_CNT_INC(ctx->cnt.rnr_waits);
        ms = tcp_conn_rnr_ms(conn);
        conn->rx_phase = TCP_RX_HOLD;
        conn->rnr_at = exs__now_ns() + (ms ? ms * 1000000u : 100000u);
        exs__tcp_conn_timer(conn);
        exs__tcp_conn_update_events(conn);
        EXS_DBG(PROV, "ep %p: receiver not ready, psn %u, try %u", (void *)ep, conn->rh.psn,
                conn->rnr_tries);
        return 0;
    }
    EXS_CNT_INC(ctx->cnt.rnr_naks);
    EXS_DBG(PROV, "ep %p: receiver not ready, retries exhausted, psn %u", (void *)ep,
            conn->rh.psn);
    f = exs__tcp_txf_ctrl(conn, TCP_WIRE_NAK, 0);
    if (f) {
        f->hdr.syndrome = TCP_WIRE_SYN_RNR_EXC;
        f->hdr.psn = htonl(conn->rh.psn);
        exs__tcp_txq_push(conn, f);
    }
    tcp_conn_drop_held(conn);
    return -1;
}

/* NIC: the peer shut its side while a request was held: drop the request and
 * read on (a DISCONNECT behind it gives status 0, a bare EOF -ECONNRESET). */
void exs__tcp_conn_hold_hup(struct tcp_conn *conn)
{
    if (conn->state != TCP_CONN_UP || conn->rx_phase != TCP_RX_HOLD) {
        exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, -1);
        return;
    }
    tcp_conn_drop_held(conn);
    exs__tcp_conn_update_events(conn);
    exs__tcp_conn_rx(conn);
}

/* Receive completion of the frame just finished (or failed). */
static void tcp_conn_recv_done(struct tcp_conn *conn, enum exs_prov_wc_status st)
{
    struct tcp_ep *ep = conn->ep;
    struct tcp_rwr *rwr = conn->rx_rwr;
    struct exs_prov_cqe cqe;

    conn->rx_rwr = NULL;
    tcp_rwr_cqe(ep, rwr, st, &cqe);
    if (conn->rh.type == TCP_WIRE_WRITE)
        cqe.opcode = EXS_PROV_WC_RECV_RDMA_WITH_IMM;
    if (st == EXS_PROV_WC_SUCCESS) {
        cqe.byte_len = conn->rh.len;
        if (conn->rh.flags & TCP_WIRE_F_IMM) {
            cqe.imm_data = conn->rh.imm;
            cqe.flags = EXS_PROV_WC_WITH_IMM;
        }
    }
    pthread_mutex_lock(&ep->lock);
    exs__tcp_cq_push(conn->ctx, ep, &cqe);
    pthread_mutex_unlock(&ep->lock);
    free(rwr);
}

/* A request (SEND / WRITE / READ_REQ) was carried out. */
static void tcp_conn_req_done(struct tcp_conn *conn)
{
    conn->ack_psn = conn->rcv_nxt++;
    if (++conn->ack_count >= TCP_ACK_EVERY)
        tcp_conn_ack_flush(conn);
}

static void tcp_conn_payload_done(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;

    conn->rx_phase = TCP_RX_HDR;
    if (conn->rx_discard) {
        conn->rx_discard = 0;
        return;
    }
    switch (conn->rh.type) {
    case TCP_WIRE_SEND:
        tcp_conn_recv_done(conn, EXS_PROV_WC_SUCCESS);
        tcp_conn_req_done(conn);
        break;
    case TCP_WIRE_WRITE:
        if (conn->rx_mr) {
            exs__tcp_mr_put(conn->ctx, conn->rx_mr);
            conn->rx_mr = NULL;
        }
        if (conn->rx_rwr)
            tcp_conn_recv_done(conn, EXS_PROV_WC_SUCCESS);
        tcp_conn_req_done(conn);
        break;
    case TCP_WIRE_READ_RESP: {
        struct tcp_wr *wr = conn->rx_wr;

        conn->rx_wr = NULL;
        tcp_ep_wr_done(ep, wr, EXS_PROV_WC_SUCCESS);
        tcp_ep_tx_fill(ep);
        break;
    }
    default:
        break;
    }
}

/* Find the framed and sent request psn on ep->sq; NULL when unknown. */
static struct tcp_wr *tcp_ep_find_psn(struct tcp_ep *ep, uint32_t psn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ep->sq) {
        struct tcp_wr *wr = exs_list_entry(pos, struct tcp_wr, link);

        if (wr->psn == psn)
            return wr->state == TCP_WR_SENT ? wr : NULL;
        if ((int32_t)(wr->psn - psn) > 0)
            return NULL;
    }
    return NULL;
}

/* An unanswered READ before psn means the peer skipped it. */
static int tcp_ep_read_before(struct tcp_ep *ep, uint32_t psn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ep->sq) {
        struct tcp_wr *wr = exs_list_entry(pos, struct tcp_wr, link);

        if ((int32_t)(wr->psn - psn) >= 0)
            break;
        if (wr->opcode == EXS_PROV_WR_RDMA_READ)
            return 1;
    }
    return 0;
}

static enum exs_prov_wc_status tcp_syn_status(uint8_t syn)
{
    switch (syn) {
    case TCP_WIRE_SYN_RNR_EXC:
        return EXS_PROV_WC_RNR_RETRY_EXC_ERR;
    case TCP_WIRE_SYN_REM_ACCESS:
        return EXS_PROV_WC_REM_ACCESS_ERR;
    case TCP_WIRE_SYN_REM_INV:
        return EXS_PROV_WC_REM_INV_REQ_ERR;
    default:
        return EXS_PROV_WC_REM_OP_ERR;
    }
}

/* Requester after NAK RNR_EXC: the ep goes to ERROR (everything flushed) but,
 * as with verbs, the connection stays until disconnect / ep_destroy; whatever
 * the peer still sends is consumed and dropped. 0 go on reading, -1 stop. */
static int tcp_conn_zombie(struct tcp_conn *conn)
{
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, &conn->txq) {
        struct tcp_txf *f = exs_list_entry(pos, struct tcp_txf, link);

        if (f->kind != TCP_TXF_WR)
            continue;
        if (f->off) {
            /* half written from a buffer about to be flushed: end it all */
            exs__tcp_conn_fail(conn, -ECONNABORTED, 0, 0, -1);
            return -1;
        }
        exs_list_del(&f->link);
    }
    conn->zombie = 1;
    exs__tcp_ep_fail(conn->ep, -ECONNABORTED, 0);
    return 0;
}

/* Replace an unsent READ_RESP by a copy of the data (the region is read now). */
static void tcp_txf_snapshot(struct tcp_conn *conn, struct tcp_txf *f)
{
    uint32_t len = (uint32_t)f->one.length;
    struct tcp_txf *c = malloc(sizeof(*c) + len);

    if (!c)
        return; /* keep the reference: later SEND/WRITEs wait for it */
    *c = *f;
    c->kind = TCP_TXF_CTRL;
    c->mr = NULL;
    memcpy(c->buf, (const void *)(uintptr_t)f->one.addr, len);
    c->one.addr = (uint64_t)(uintptr_t)c->buf;
    c->seg = &c->one;
    exs_list_insert_after(&f->link, &c->link);
    exs_list_del(&f->link);
    conn->last_resp = NULL;
    conn->resp_pending--;
    exs__tcp_txf_free(conn->ctx, f);
}

/* Act on a complete header of an UP connection: 0 go on reading, -1 stop. */
static int tcp_conn_rx_request(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_wire_hdr *h = &conn->rh;
    struct tcp_ep *ep = conn->ep;
    int req = h->type == TCP_WIRE_SEND || h->type == TCP_WIRE_WRITE ||
              h->type == TCP_WIRE_READ_REQ;
    struct tcp_wr *wr;
    int r;

    if ((req && (conn->rx_drop || conn->zombie)) ||
        (conn->zombie && (h->type == TCP_WIRE_ACK || h->type == TCP_WIRE_NAK ||
                          h->type == TCP_WIRE_READ_RESP))) {
        /* dropped requests; answers to requests already flushed */
        tcp_conn_rx_discard(conn);
        return 0;
    }
    if ((h->type == TCP_WIRE_SEND || h->type == TCP_WIRE_WRITE) && conn->resp_pending) {
        /* RC order: a READ before this request reads the region first */
        conn->hold_resp = 1;
        conn->rx_phase = TCP_RX_HOLD;
        exs__tcp_conn_update_events(conn);
        return -1;
    }
    switch (h->type) {
    case TCP_WIRE_SEND:
        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (!conn->rx_rwr) {
            r = tcp_conn_take_recv(conn);
            if (r <= 0)
                return r == 0 ? -1 : 0;
        }
        if (conn->rx_rwr->bad) {
            tcp_conn_recv_done(conn, EXS_PROV_WC_LOC_PROT_ERR);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_OP, -ECONNABORTED);
            return -1;
        }
        if (h->len > conn->rx_rwr->len) {
            EXS_DBG(PROV, "ep %p: send of %u bytes into a receive of %llu", (void *)ep, h->len,
                    (unsigned long long)conn->rx_rwr->len);
            tcp_conn_recv_done(conn, EXS_PROV_WC_LOC_LEN_ERR);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_INV, -ECONNABORTED);
            return -1;
        }
        conn->rx_seg = conn->rx_rwr->sge;
        conn->rx_nseg = conn->rx_rwr->num_sge;
        break;
    case TCP_WIRE_WRITE:
        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (h->len && !conn->rx_mr &&
            exs__tcp_mr_get_remote(ctx, h->rkey, h->raddr, h->len, EXS_PROV_ACCESS_REMOTE_WRITE,
                                   &conn->rx_mr)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            EXS_DBG(PROV, "ep %p: write 0x%llx+%u rkey 0x%x refused", (void *)ep,
                    (unsigned long long)h->raddr, h->len, h->rkey);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_ACCESS, -ECONNABORTED);
            return -1;
        }
        if ((h->flags & TCP_WIRE_F_IMM) && !conn->rx_rwr) {
            r = tcp_conn_take_recv(conn);
            if (r <= 0)
                return r == 0 ? -1 : 0; /* holding keeps rx_mr: the region stays */
        }
        conn->rx_one.addr = h->raddr;
        conn->rx_one.length = h->len;
        conn->rx_seg = &conn->rx_one;
        conn->rx_nseg = 1;
        break;
    case TCP_WIRE_READ_REQ: {
        struct tcp_txf *f;
        struct tcp_mr *mr = NULL;

        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (h->imm > ctx->base.caps.max_msg_size)
            return tcp_conn_proto_err(conn, "read longer than max_msg_size"), -1;
        if (h->imm &&
            exs__tcp_mr_get_remote(ctx, h->rkey, h->raddr, h->imm, EXS_PROV_ACCESS_REMOTE_READ,
                                   &mr)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            EXS_DBG(PROV, "ep %p: read 0x%llx+%u rkey 0x%x refused", (void *)ep,
                    (unsigned long long)h->raddr, h->imm, h->rkey);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_ACCESS, -ECONNABORTED);
            return -1;
        }
        f = calloc(1, sizeof(*f));
        if (!f) {
            if (mr)
                exs__tcp_mr_put(ctx, mr);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_OP, -ENOMEM);
            return -1;
        }
        f->kind = TCP_TXF_READ_RESP;
        tcp_hdr_init(&f->hdr, TCP_WIRE_READ_RESP, h->imm);
        f->hdr.psn = htonl(h->psn);
        f->one.addr = h->raddr;
        f->one.length = h->imm;
        f->seg = &f->one;
        f->nseg = h->imm ? 1 : 0;
        f->total = TCP_WIRE_HDR_LEN + (uint64_t)h->imm;
        f->mr = mr;
        if (!mr)
            f->kind = TCP_TXF_CTRL;
        else
            conn->resp_pending++;
        conn->ctrl_queued++;
        /* the response acknowledges everything before it */
        conn->rcv_nxt++;
        conn->ack_count = 0;
        exs__tcp_txq_push(conn, f);
        if (mr) {
            /* read the region now if the socket takes it; else copy small reads so
             * later WRITEs need not wait for the response to leave */
            conn->last_resp = f;
            exs__tcp_conn_tx(conn);
            if (conn->state != TCP_CONN_UP)
                return -1;
            if (conn->last_resp == f && !f->off && h->imm <= TCP_RESP_COPY_MAX)
                tcp_txf_snapshot(conn, f);
        }
        if (conn->ctrl_queued >= TCP_CTRL_MAX) {
            exs__tcp_conn_update_events(conn);
            return -1;
        }
        return 0;
    }
    case TCP_WIRE_READ_RESP:
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || wr->opcode != EXS_PROV_WR_RDMA_READ || h->len != wr->len ||
            tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "read response without a matching read"), -1;
        tcp_ep_ack_before(ep, h->psn);
        conn->rx_wr = wr;
        conn->rx_seg = wr->sge;
        conn->rx_nseg = wr->num_sge;
        break;
    case TCP_WIRE_ACK:
        EXS_CNT_INC(ctx->cnt.acks_rx);
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || wr->opcode == EXS_PROV_WR_RDMA_READ || tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "ack for an unknown sequence"), -1;
        tcp_ep_ack_before(ep, h->psn + 1);
        tcp_ep_tx_fill(ep);
        return 0;
    case TCP_WIRE_NAK:
        EXS_CNT_INC(ctx->cnt.naks_rx);
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "nak for an unknown sequence"), -1;
        EXS_DBG(PROV, "ep %p: nak psn %u syndrome %u", (void *)ep, h->psn, h->syndrome);
        tcp_ep_ack_before(ep, h->psn);
        tcp_ep_wr_done(ep, wr, tcp_syn_status(h->syndrome));
        if (h->syndrome == TCP_WIRE_SYN_RNR_EXC)
            return tcp_conn_zombie(conn);
        exs__tcp_conn_fail(conn, -ECONNABORTED, 0, 0, 0);
        return -1;
    case TCP_WIRE_DISCONNECT:
        EXS_DBG(PROV, "ep %p: peer disconnected", (void *)ep);
        exs__tcp_conn_fail(conn, 0, 0, 0, 0);
        return -1;
    default:
        return tcp_conn_proto_err(conn, "unexpected frame type"), -1;
    }
    conn->rx_len = h->len;
    conn->rx_off = 0;
    conn->rx_phase = TCP_RX_PAYLOAD;
    if (!h->len)
        tcp_conn_payload_done(conn);
    return 0;
}

/* Decode and check a complete header; dispatch it. 0 go on, -1 stop. */
static int tcp_conn_rx_hdr(struct tcp_conn *conn)
{
    struct tcp_wire_hdr *h = &conn->rh;
    const struct tcp_wire_hdr *w = (const void *)conn->hbuf;
    uint64_t max = conn->ctx->base.caps.max_msg_size;
    const char *bad = NULL;

    h->magic = ntohl(w->magic);
    h->version = w->version;
    h->type = w->type;
    h->flags = w->flags;
    h->syndrome = w->syndrome;
    h->len = ntohl(w->len);
    h->psn = ntohl(w->psn);
    h->raddr = be64toh(w->raddr);
    h->rkey = ntohl(w->rkey);
    h->imm = ntohl(w->imm);
    conn->hgot = 0; /* consumed; a held frame is retried from conn->rh */
    EXS_CNT_INC(conn->ctx->cnt.frames_rx);

    if (h->magic != TCP_WIRE_MAGIC)
        bad = "bad magic";
    else if (h->version != TCP_WIRE_VERSION)
        bad = "bad version";
    else if (h->type < 1 || h->type > TCP_WIRE_TYPE_MAX)
        bad = "bad frame type";
    else if (h->flags & ~TCP_WIRE_F_ALL)
        bad = "bad flags";
    else if (h->type == TCP_WIRE_NAK ? (h->syndrome < 1 || h->syndrome > TCP_WIRE_SYN_MAX)
                                     : h->syndrome != 0)
        bad = "bad syndrome";
    else {
        switch (h->type) {
        case TCP_WIRE_CONN_REQ:
        case TCP_WIRE_CONN_ACCEPT:
            if (h->len < TCP_WIRE_CONN_LEN || h->len > TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX)
                bad = "bad handshake length";
            break;
        case TCP_WIRE_CONN_REJECT:
            if (h->len > TCP_WIRE_PD_MAX)
                bad = "bad handshake length";
            break;
        case TCP_WIRE_SEND:
        case TCP_WIRE_WRITE:
        case TCP_WIRE_READ_RESP:
            if (h->len > max)
                bad = "payload longer than max_msg_size";
            break;
        default:
            if (h->len)
                bad = "payload on a frame without one";
            break;
        }
    }
    if (!bad) {
        int hs = h->type <= TCP_WIRE_CONN_REJECT;

        switch (conn->state) {
        case TCP_CONN_WAIT_REQ:
            if (h->type != TCP_WIRE_CONN_REQ)
                bad = "expected a connection request";
            break;
        case TCP_CONN_WAIT_REPLY:
            if (h->type != TCP_WIRE_CONN_ACCEPT && h->type != TCP_WIRE_CONN_REJECT)
                bad = "expected accept or reject";
            break;
        case TCP_CONN_UP:
            if (hs)
                bad = "handshake frame on an established connection";
            break;
        default:
            bad = "frame in a bad state";
            break;
        }
        if (!bad && hs) {
            conn->rx_phase = TCP_RX_CONN;
            conn->rx_len = h->len;
            conn->rx_off = 0;
            if (!h->len)
                return exs__tcp_conn_hs_frame(conn);
            return 0;
        }
    }
    if (bad) {
        if (conn->state == TCP_CONN_UP) {
            tcp_conn_proto_err(conn, bad);
        } else {
            EXS_CNT_INC(conn->ctx->cnt.protocol_errors);
            EXS_DBG(PROV, "conn %p: handshake: %s", (void *)conn, bad);
            exs__tcp_conn_fail(conn, -EPROTO, 0, 0, 0);
        }
        return -1;
    }
    return tcp_conn_rx_request(conn);
}

/* The peer is gone (EOF, reset, error). */
static void tcp_conn_dead(struct tcp_conn *conn, int err)
{
    EXS_DBG(PROV, "conn %p ep %p: peer gone: %s", (void *)conn, (void *)conn->ep,
            err ? strerror(err) : "eof");
    if (conn->state == TCP_CONN_LINGER) {
        exs__tcp_conn_close(conn);
        return;
    }
    exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, -1);
}

void exs__tcp_conn_rx(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    uint64_t budget = TCP_RX_BUDGET;
    struct iovec iov[TCP_TX_IOV];
    static __thread uint8_t sink[16384];
    ssize_t n;

    while (budget && conn->fd >= 0) {
        if (conn->state == TCP_CONN_LINGER) {
            n = recv(conn->fd, sink, sizeof(sink), MSG_DONTWAIT);
        } else if (conn->state == TCP_CONN_PENDING || conn->state == TCP_CONN_CONNECTING ||
                   conn->state == TCP_CONN_DEAD) {
            break;
        } else if (conn->rx_phase == TCP_RX_HOLD) {
            break;
        } else if (conn->rx_phase == TCP_RX_HDR) {
            if (conn->rx_retry) {
                /* a held header retried (RNR) */
                conn->rx_retry = 0;
                if (tcp_conn_rx_request(conn) < 0)
                    break;
                continue;
            }
            n = recv(conn->fd, conn->hbuf + conn->hgot, TCP_WIRE_HDR_LEN - conn->hgot,
                     MSG_DONTWAIT);
        } else if (conn->rx_phase == TCP_RX_CONN) {
            n = recv(conn->fd, conn->hs + conn->rx_off, conn->rx_len - conn->rx_off,
                     MSG_DONTWAIT);
        } else if (conn->rx_discard) {
            n = recv(conn->fd, sink, EXS_MIN(sizeof(sink), conn->rx_len - conn->rx_off),
                     MSG_DONTWAIT);
        } else {
            int k = tcp_iov_fill(iov, TCP_TX_IOV, conn->rx_seg, conn->rx_nseg, conn->rx_off,
                                 conn->rx_len - conn->rx_off);

            n = readv(conn->fd, iov, k);
        }
        if (n == 0) {
            tcp_conn_dead(conn, 0);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            tcp_conn_dead(conn, errno);
            return;
        }
        EXS_CNT_ADD(ctx->cnt.bytes_rx, n);
        budget = (uint64_t)n >= budget ? 0 : budget - (uint64_t)n;
        if (conn->state == TCP_CONN_LINGER)
            continue;
        if (conn->rx_phase == TCP_RX_HDR) {
            conn->hgot += (uint32_t)n;
            if (conn->hgot == TCP_WIRE_HDR_LEN && tcp_conn_rx_hdr(conn) < 0)
                break;
        } else if (conn->rx_phase == TCP_RX_CONN) {
            conn->rx_off += (uint64_t)n;
            if (conn->rx_off == conn->rx_len && exs__tcp_conn_hs_frame(conn) < 0)
                break;
        } else {
            conn->rx_off += (uint64_t)n;
            if (conn->rx_off == conn->rx_len)
                tcp_conn_payload_done(conn);
        }
    }
    if (conn->state == TCP_CONN_UP)
        tcp_conn_ack_flush(conn);
}

/* NIC: the RNR pause of conn ended: retry the held frame. */
void exs__tcp_conn_rnr_resume(struct tcp_conn *conn)
{
    if (conn->state != TCP_CONN_UP || conn->rx_phase != TCP_RX_HOLD)
        return;
    conn->rx_phase = TCP_RX_HDR;
    conn->rx_retry = 1;
    exs__tcp_conn_update_events(conn);
    exs__tcp_conn_rx(conn);
}
