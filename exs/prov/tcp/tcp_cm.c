/* SPDX-License-Identifier: MIT */
/* Connection management of the tcp provider: endpoints, listen/connect/accept/reject/disconnect. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

static void tcp_ep_note_local_locked(struct tcp_ep *ep, int fd);

/* ---- connections (NIC) ---- */

static struct tcp_conn *tcp_conn_new(struct tcp_ctx *ctx, int fd, enum tcp_conn_state state)
{
    struct tcp_conn *conn = calloc(1, sizeof(*conn));
    struct epoll_event ev = { .events = 0 };
    int one = 1;

    if (!conn)
        return NULL;
    conn->ctx = ctx;
    conn->fd = fd;
    conn->state = state;
    exs_list_init(&conn->txq);
    exs_list_init(&conn->dirty_link);
    exs_list_init(&conn->rx_again_link);
    exs_list_init(&conn->timer_link);
    exs_list_init(&conn->hs_link);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ev.data.ptr = conn;
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        EXS_ERR(PROV, "conn: epoll_ctl add: %m");
        free(conn);
        return NULL;
    }
    exs_list_add_tail(&ctx->conns, &conn->link);
    exs__tcp_conn_update_events(conn);
    return conn;
}

static void tcp_conn_txq_clear(struct tcp_conn *conn)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(&conn->txq)) != NULL)
        exs__tcp_txf_free(conn->ctx, exs_list_entry(l, struct tcp_txf, link));
    conn->ack_txf = NULL;
}

/* NIC: the conn no longer waits for its CONN_REQ (it came, or the conn ends). */
void exs__tcp_conn_hs_leave(struct tcp_conn *conn)
{
    struct tcp_listener *lis = conn->lis;

    if (!conn->on_hs)
        return;
    exs_list_del(&conn->hs_link);
    lis->n_handshakes--;
    conn->on_hs = 0;
    if (lis->hs_wait) {
        /* a slot is free: accept again from the next turn (tcp_listener_hs_room) */
        lis->hs_wait = 0;
        lis->resume_at = 0;
        if (!lis->paused)
            exs__tcp_listener_watch(lis, 1);
    }
}

/* Close the socket now; the memory goes at the end of the loop turn. */
void exs__tcp_conn_close(struct tcp_conn *conn)
{
    if (conn->state == TCP_CONN_DEAD)
        return;
    exs__tcp_conn_hs_leave(conn);
    exs__tcp_conn_ack_undefer(conn);
    exs__tcp_rx_release(conn);
    tcp_conn_txq_clear(conn);
    if (conn->tx_dirty) {
        exs_list_del(&conn->dirty_link);
        conn->tx_dirty = 0;
    }
    if (conn->rx_again) {
        exs_list_del(&conn->rx_again_link);
        conn->rx_again = 0;
        __atomic_sub_fetch(&conn->ctx->rx_again_n, 1, __ATOMIC_RELAXED);
    }
    conn->rnr_at = conn->tx_at = conn->linger_at = 0;
    exs__tcp_conn_timer(conn);
    if (conn->fd >= 0) {
        epoll_ctl(conn->ctx->epfd, EPOLL_CTL_DEL, conn->fd, NULL);
        close(conn->fd);
        conn->fd = -1;
    }
    if (conn->ep && conn->ep->conn == conn)
        conn->ep->conn = NULL;
    conn->ep = NULL;
    conn->state = TCP_CONN_DEAD;
    exs_list_del(&conn->link);
    exs_list_add_tail(&conn->ctx->dead, &conn->link);
}

/* PENDING: the socket died. The request belongs to the consumer (its CONNECT_REQUEST
 * event is queued or delivered): it stays, marked, until reject frees it (accept of it
 * fails -ECONNRESET). */
static void tcp_conn_break(struct tcp_conn *conn)
{
    if (conn->fd >= 0) {
        epoll_ctl(conn->ctx->epfd, EPOLL_CTL_DEL, conn->fd, NULL);
        close(conn->fd);
        conn->fd = -1;
    }
    tcp_conn_txq_clear(conn);
    conn->broken = 1;
}

static void tcp_cm_event(struct tcp_ctx *ctx, enum exs_prov_cm_event_type type,
                         struct tcp_ep *ep, int status, const void *pd, uint32_t pdlen)
{
    struct exs_prov_cm_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.ep = &ep->base;
    ev.status = status;
    if (type == EXS_PROV_CM_DISCONNECTED && ep->peer_closed)
        ev.flags = EXS_PROV_CM_F_PEER_CLOSED;
    if (ep->conn) {
        ev.peer_addr = ep->conn->peer;
        ev.peer_addrlen = ep->conn->peerlen;
    }
    if (pdlen > EXS_PROV_PRIVATE_DATA_MAX)
        pdlen = EXS_PROV_PRIVATE_DATA_MAX;
    ev.private_data_len = pdlen;
    if (pdlen)
        memcpy(ev.private_data, pd, pdlen);
    exs__tcp_cm_push(ctx, &ev);
}

/* NIC: ep to ERROR, flush everything in order (send queue, then receives);
 * with notify, one DISCONNECTED event. */
void exs__tcp_ep_fail(struct tcp_ep *ep, int status, int notify)
{
    exs__tcp_ep_fail_cqe(ep, status, notify, NULL);
}

/* As exs__tcp_ep_fail, queueing first (the error completion that caused it)
 * ahead of the flushes, in the same critical section: once the application
 * sees the error, the ep is in ERROR and nothing it posts can overtake. */
void exs__tcp_ep_fail_cqe(struct tcp_ep *ep, int status, int notify,
                          const struct exs_prov_cqe *first)
{
    struct tcp_ctx *ctx = ep->ctx;
    struct exs_list *lists[] = { &ep->sq, &ep->sq_wait, &ep->sq_pend };
    struct exs_prov_cqe cqe;
    struct exs_list *l;

    pthread_mutex_lock(&ep->lock);
    __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
    pthread_mutex_lock(&ctx->lock);
    if (first)
        exs__tcp_cq_push_locked(ctx, ep, first);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(lists); i++) {
        while ((l = exs_list_pop_head(lists[i])) != NULL) {
            struct tcp_wr *wr = exs_list_entry(l, struct tcp_wr, link);

            memset(&cqe, 0, sizeof(cqe));
            cqe.wr_id = wr->wr_id;
            cqe.ep = &ep->base;
            cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
            cqe.opcode = wr->opcode == EXS_PROV_WR_RDMA_READ ? EXS_PROV_WC_RDMA_READ
                         : wr->opcode >= EXS_PROV_WR_RDMA_WRITE ? EXS_PROV_WC_RDMA_WRITE
                                                                : EXS_PROV_WC_SEND;
            /* ep_destroy: discarded without completions */
            if (!ep->destroyed) {
                EXS_CNT_INC(ctx->cnt.flushed_wrs);
                exs__tcp_cq_push_locked(ctx, ep, &cqe);
            }
            free(wr);
        }
    }
    while ((l = exs_list_pop_head(&ep->rq)) != NULL) {
        struct tcp_rwr *rwr = exs_list_entry(l, struct tcp_rwr, link);

        memset(&cqe, 0, sizeof(cqe));
        cqe.wr_id = rwr->wr_id;
        cqe.ep = &ep->base;
        cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
        cqe.opcode = EXS_PROV_WC_RECV;
        if (!ep->destroyed) {
            EXS_CNT_INC(ctx->cnt.flushed_wrs);
            exs__tcp_cq_push_locked(ctx, ep, &cqe);
        }
        free(rwr);
    }
    ep->sq_used = 0;
    ep->sq_unretired = 0;
    ep->rq_count = 0;
    pthread_mutex_unlock(&ctx->lock);
    pthread_mutex_unlock(&ep->lock);
    ep->reads_out = 0;
    if (notify && !ep->disc_sent) {
        ep->disc_sent = 1;
        tcp_cm_event(ctx, EXS_PROV_CM_DISCONNECTED, ep, status, NULL, 0);
    }
}

/* Active side never got connected: ep to ERROR with one event of type. */
static void tcp_ep_unconnected(struct tcp_ep *ep, enum exs_prov_cm_event_type type, int status,
                               const void *pd, uint32_t pdlen)
{
    if (ep->disc_sent)
        return;
    exs__tcp_ep_fail(ep, status, 0);
    ep->disc_sent = 1;
    tcp_cm_event(ep->ctx, type, ep, status, pd, pdlen);
}

/*
 * NIC: end conn. status goes into the ep's DISCONNECTED (or UNREACHABLE) event.
 * syndrome != 0: send NAK(psn, syndrome) last. mode: 1 send DISCONNECT last (2: with
 * F_CLOSED, the endpoint is destroyed), 0 nothing more, -1 the socket is dead (close now).
 */
void exs__tcp_conn_fail(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                        int mode)
{
    exs__tcp_conn_fail_cqe(conn, status, syndrome, psn, mode, NULL);
}

/* As exs__tcp_conn_fail; first is the error completion queued ahead of the flushes. */
void exs__tcp_conn_fail_cqe(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                            int mode, const struct exs_prov_cqe *first)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_ep *ep = conn->ep;
    struct exs_list *pos, *tmp;
    struct tcp_txf *f;
    int abort = mode < 0;

    switch (conn->state) {
    case TCP_CONN_WAIT_REQ:
        EXS_CNT_INC(ctx->cnt.bogus_conns);
        exs__tcp_conn_close(conn);
        return;
    case TCP_CONN_PENDING:
        tcp_conn_break(conn);
        return;
    case TCP_CONN_CONNECTING:
    case TCP_CONN_WAIT_REPLY:
        exs__tcp_conn_close(conn);
        if (ep) {
            EXS_CNT_INC(ctx->cnt.conns_unreachable);
            tcp_ep_unconnected(ep, EXS_PROV_CM_UNREACHABLE, status, NULL, 0);
        }
        return;
    case TCP_CONN_UP:
        break;
    default:
        if (abort)
            exs__tcp_conn_close(conn);
        return;
    }
    /* A deferred ACK is owed for requests whose completions the consumer may already
     * have: it leaves before the end (a NAK acknowledges everything before it). */
    if (conn->ack_deferred) {
        exs__tcp_conn_ack_undefer(conn);
        if (!syndrome)
            exs__tcp_conn_ack_flush(conn);
    }

    EXS_DBG(PROV, "conn %p ep %p: ending, status %d syndrome %u mode %d", (void *)conn,
            (void *)ep, status, syndrome, mode);
    exs__tcp_rx_release(conn);
    exs_list_for_each_safe(pos, tmp, &conn->txq) {
        f = exs_list_entry(pos, struct tcp_txf, link);
        if (f->off) {
            if (f->off < f->total && f->kind == TCP_TXF_WR)
                abort = 1; /* cannot finish it without the flushed buffer */
            continue;
        }
        if (f->kind == TCP_TXF_WR)
            exs_list_del(&f->link); /* the wr is flushed below */
    }
    conn->ep = NULL;
    if (ep)
        ep->conn = NULL;
    if (abort) {
        exs__tcp_conn_close(conn);
    } else {
        conn->state = TCP_CONN_LINGER;
        conn->status = status;
        f = NULL;
        if (syndrome) {
            f = exs__tcp_txf_ctrl(conn, TCP_WIRE_NAK, 0);
            if (f) {
                f->hdr.syndrome = syndrome;
                f->hdr.psn = htonl(psn);
            }
        } else if (mode > 0) {
            f = exs__tcp_txf_ctrl(conn, TCP_WIRE_DISCONNECT, 0);
            if (f && mode == 2)
                f->hdr.flags = TCP_WIRE_F_CLOSED;
        }
        if (f)
            exs__tcp_txq_push(conn, f);
        exs__tcp_txq_push(conn, NULL);
        conn->rnr_at = 0;
        conn->linger_at = exs__now_ns() + TCP_LINGER_NS + ctx->emu_delay_ns;
        exs__tcp_conn_timer(conn);
        exs__tcp_conn_update_events(conn);
    }
    if (ep)
        exs__tcp_ep_fail_cqe(ep, status, 1, first);
}

/* NIC: an active connect finished (EPOLLOUT). */
void exs__tcp_conn_connected(struct tcp_conn *conn)
{
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err) {
        EXS_DBG(PROV, "conn %p ep %p: connect: %s", (void *)conn, (void *)conn->ep,
                strerror(err));
        exs__tcp_conn_fail(conn, -err, 0, 0, -1);
        return;
    }
    conn->state = TCP_CONN_WAIT_REPLY;
    exs__tcp_txq_push(conn, NULL);
    exs__tcp_conn_update_events(conn);
}

static struct tcp_txf *tcp_hs_frame(struct tcp_conn *conn, uint8_t type, struct tcp_ep *ep,
                                    const void *pd, uint32_t pdlen)
{
    uint32_t blk = type == TCP_WIRE_CONN_REJECT ? 0 : TCP_WIRE_CONN_LEN;
    struct tcp_txf *f = exs__tcp_txf_ctrl(conn, type, blk + pdlen);
    struct tcp_wire_conn *c;

    if (!f)
        return NULL;
    if (blk) {
        c = (struct tcp_wire_conn *)f->buf;
        c->rnr_retry = EXS_MIN(ep->base.attr.rnr_retry, ep->ctx->rnr_retry_max);
        c->rnr_timer_ms = ep->base.attr.rnr_timer_ms;
    }
    if (pdlen)
        memcpy(f->buf + blk, pd, pdlen);
    return f;
}

/* NIC: a complete CONN_REQ / CONN_ACCEPT / CONN_REJECT is in conn->rh / conn->hs. */
int exs__tcp_conn_hs_frame(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_ep *ep = conn->ep;
    uint32_t len = conn->rh.len;
    struct exs_prov_cm_event ev;
    struct tcp_req *req;

    conn->rx_phase = TCP_RX_HDR;
    conn->hgot = 0;
    switch (conn->rh.type) {
    case TCP_WIRE_CONN_REQ:
        if (conn->hs[0] > 7) {
            EXS_CNT_INC(ctx->cnt.bogus_conns);
            exs__tcp_conn_close(conn);
            return -1;
        }
        req = calloc(1, sizeof(*req));
        if (!req) {
            exs__tcp_conn_close(conn);
            return -1;
        }
        conn->peer_rnr_retry = conn->hs[0];
        conn->peer_rnr_timer_ms = conn->hs[1];
        req->base.listener = &conn->lis->base;
        req->conn = conn;
        conn->req = req;
        exs__tcp_conn_hs_leave(conn);
        exs_list_add_tail(&conn->lis->reqs, &req->link);
        conn->state = TCP_CONN_PENDING;
        conn->linger_at = 0;
        exs__tcp_conn_timer(conn);
        exs__tcp_conn_update_events(conn);
        memset(&ev, 0, sizeof(ev));
        ev.type = EXS_PROV_CM_CONNECT_REQUEST;
        ev.listener = &conn->lis->base;
        ev.req = &req->base;
        ev.peer_addr = conn->peer;
        ev.peer_addrlen = conn->peerlen;
        ev.private_data_len = len - TCP_WIRE_CONN_LEN;
        memcpy(ev.private_data, conn->hs + TCP_WIRE_CONN_LEN, ev.private_data_len);
        exs__tcp_cm_push(ctx, &ev);
        return -1;
    case TCP_WIRE_CONN_ACCEPT:
        if (conn->hs[0] > 7) {
            EXS_CNT_INC(ctx->cnt.protocol_errors);
            exs__tcp_conn_fail(conn, -EPROTO, 0, 0, -1);
            return -1;
        }
        conn->peer_rnr_retry = conn->hs[0];
        conn->peer_rnr_timer_ms = conn->hs[1];
        conn->state = TCP_CONN_UP;
        pthread_mutex_lock(&ep->lock);
        tcp_ep_note_local_locked(ep, conn->fd);
        __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTED, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ep->lock);
        EXS_CNT_INC(ctx->cnt.conns_established);
        tcp_cm_event(ctx, EXS_PROV_CM_ESTABLISHED, ep, 0, conn->hs + TCP_WIRE_CONN_LEN,
                     len - TCP_WIRE_CONN_LEN);
        exs__tcp_conn_update_events(conn);
        return 0;
    case TCP_WIRE_CONN_REJECT:
        exs__tcp_conn_close(conn);
        EXS_CNT_INC(ctx->cnt.conns_rejected);
        tcp_ep_unconnected(ep, EXS_PROV_CM_REJECTED, -ECONNREFUSED, conn->hs, len);
        return -1;
    default:
        return -1;
    }
}

/* NIC: out of descriptors (or memory): the pending connection stays in the kernel's
 * backlog and the socket stays readable, so retrying at once would spin. Stop watching
 * the listener for a pause (100 ms, doubling to 1 s while it lasts; one log line per
 * pause), then try again (tcp_nic_timers). */
static void tcp_listener_backoff(struct tcp_listener *lis, int err)
{
    struct tcp_ctx *ctx = lis->ctx;

    lis->backoff_ms =
        lis->backoff_ms ? EXS_MIN(lis->backoff_ms * 2, TCP_BACKOFF_MAX_MS) : TCP_BACKOFF_MIN_MS;
    lis->resume_at = exs__now_ns() + (uint64_t)lis->backoff_ms * 1000000u;
    exs__tcp_timer_moved(ctx);
    EXS_CNT_INC(ctx->cnt.accept_backoffs);
    EXS_WARN(PROV, "listener %p: accept: %s; not accepting for %u ms", (void *)lis, strerror(err),
             lis->backoff_ms);
    exs__tcp_listener_watch(lis, 0);
}

/* NIC: room for one more socket waiting for its CONN_REQ? The number is bounded: at the
 * bound the oldest one is closed if it is silent (nothing to read) and has waited a tenth
 * of the handshake timeout, which bounds the descriptors half-open connections hold.
 * Otherwise the sockets are a burst of live clients whose requests are on their way (a
 * loaded client may take a while to send them) or not read yet: evicting them would reset
 * good clients, so the listener is not watched until one of them leaves the handshake or
 * the oldest may be judged, and new clients wait in the kernel's listen queue meanwhile. */
static int tcp_listener_hs_room(struct tcp_listener *lis)
{
    struct tcp_ctx *ctx = lis->ctx;
    struct tcp_conn *old;
    uint64_t now, judge;
    int unread = 0;

    if (lis->n_handshakes < ctx->handshake_max)
        return 1;
    old = exs_list_entry(lis->handshakes.next, struct tcp_conn, hs_link);
    now = exs__now_ns();
    judge = old->hs_at + ctx->handshake_ns / 10;
    if (ioctl(old->fd, FIONREAD, &unread) < 0)
        unread = 0;
    if (now >= judge && !unread) {
        EXS_CNT_INC(ctx->cnt.handshake_evictions);
        EXS_CNT_INC(ctx->cnt.bogus_conns);
        EXS_DBG(PROV, "listener %p: %u handshakes pending: dropping conn %p", (void *)lis,
                lis->n_handshakes, (void *)old);
        exs__tcp_conn_close(old);
        return 1;
    }
    EXS_CNT_INC(ctx->cnt.handshake_waits);
    lis->hs_wait = 1;
    lis->resume_at = unread || now >= judge ? now + 1000000u : judge;
    exs__tcp_timer_moved(ctx);
    exs__tcp_listener_watch(lis, 0);
    return 0;
}

/* NIC: accept incoming sockets (none while paused: an event polled before the pause). */
void exs__tcp_listener_ready(struct tcp_listener *lis)
{
    if (lis->paused)
        return;
    for (int i = 0; i < 16; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        struct tcp_conn *conn;
        int fd;

        EXS_CNT_INC(lis->ctx->cnt.accept_calls);
        if (!tcp_listener_hs_room(lis))
            return;
        fd = accept4(lis->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;

            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                tcp_listener_backoff(lis, err);
                return;
            }
            if (err == EINTR || err == ECONNABORTED)
                continue;
            if (err != EAGAIN && err != EWOULDBLOCK)
                EXS_ERR(PROV, "listener %p: accept: %s", (void *)lis, strerror(err));
            return;
        }
        lis->backoff_ms = 0;
        conn = tcp_conn_new(lis->ctx, fd, TCP_CONN_WAIT_REQ);
        if (!conn) {
            close(fd);
            continue;
        }
        conn->lis = lis;
        conn->peer = ss;
        conn->peerlen = sl;
        exs_list_add_tail(&lis->handshakes, &conn->hs_link);
        conn->on_hs = 1;
        conn->hs_at = exs__now_ns();
        lis->n_handshakes++;
        conn->linger_at = exs__now_ns() + lis->ctx->handshake_ns;
        exs__tcp_conn_timer(conn);
    }
}

/* ---- endpoints ---- */

int exs__tcp_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    const struct exs_prov_caps *caps = &c->caps;
    struct tcp_ep *ep;
    int ret;

    if (!attr || !attr->max_send_wr || attr->max_send_wr > caps->max_send_wr ||
        !attr->max_recv_wr || attr->max_recv_wr > caps->max_recv_wr ||
        attr->max_inline > caps->max_inline || attr->rnr_retry > 7)
        return -EINVAL;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    pthread_mutex_lock(&ctx->lock);
    ret = exs__tcp_cq_reserve_locked(ctx, (uint64_t)attr->max_send_wr + attr->max_recv_wr);
    pthread_mutex_unlock(&ctx->lock);
    if (ret) {
        EXS_ERR(PROV, "ep_create: completion queue: no room for %u + %u completions (%s)",
                attr->max_send_wr, attr->max_recv_wr, strerror(-ret));
        free(ep);
        return ret;
    }
    ep->base.ctx = c;
    ep->base.user = attr->user;
    ep->base.attr = *attr;
    ep->ctx = ctx;
    __atomic_store_n(&ep->state, EXS_PROV_EP_IDLE, __ATOMIC_RELAXED);
    pthread_mutex_init(&ep->lock, NULL);
    exs_list_init(&ep->sq_pend);
    exs_list_init(&ep->rq);
    exs_list_init(&ep->sq);
    exs_list_init(&ep->sq_wait);
    exs_list_init(&ep->work_link);
    exs_list_init(&ep->grants);
    pthread_mutex_lock(&ctx->lock);
    exs_list_add_tail(&ctx->eps, &ep->link);
    pthread_mutex_unlock(&ctx->lock);
    *ep_p = &ep->base;
    return 0;
}

/* Remember the local address of the connection's socket (ep->lock held). */
static void tcp_ep_note_local_locked(struct tcp_ep *ep, int fd)
{
    ep->local_len = sizeof(ep->local);
    if (getsockname(fd, (struct sockaddr *)&ep->local, &ep->local_len) < 0)
        ep->local_len = 0;
}

int exs__tcp_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr,
                           socklen_t *addrlen)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    int ret = -ENOTCONN;

    pthread_mutex_lock(&ep->lock);
    if (ep->local_len) {
        *addr = ep->local;
        *addrlen = ep->local_len;
        ret = 0;
    }
    pthread_mutex_unlock(&ep->lock);
    return ret;
}

enum exs_prov_ep_state exs__tcp_ep_state(struct exs_prov_ep *e)
{
    return (enum exs_prov_ep_state)__atomic_load_n(&tcp_ep_of(e)->state, __ATOMIC_RELAXED);
}

static void tcp_ep_destroy_nic(struct tcp_ctx *ctx, struct tcp_ep *ep)
{
    struct tcp_conn *conn = ep->conn;
    struct exs_list *pos, *tmp;
    uint32_t keep = 0;

    ep->destroyed = 1;
    ep->disc_sent = 1; /* no more events */
    if (conn) {
        if (conn->state == TCP_CONN_UP)
            exs__tcp_conn_fail(conn, 0, 0, 0, 2); /* closed for good: F_CLOSED */
        else
            exs__tcp_conn_close(conn);
    }
    exs__tcp_ep_fail(ep, 0, 0); /* empties the queues */

    pthread_mutex_lock(&ctx->lock);
    if (ep->on_work) {
        exs_list_del(&ep->work_link);
        ep->on_work = 0;
    }
    for (uint32_t i = 0; i < ctx->cq_count; i++) {
        struct exs_prov_cqe *q = &ctx->cq[(ctx->cq_head + i) % ctx->cq_cap];

        if (q->ep != &ep->base)
            ctx->cq[(ctx->cq_head + keep++) % ctx->cq_cap] = *q;
    }
    ctx->cq_count = keep;
    exs__tcp_cq_unreserve_locked(ctx, (uint64_t)ep->base.attr.max_send_wr + ep->base.attr.max_recv_wr);
    exs_list_for_each_safe(pos, tmp, &ctx->cm_events) {
        struct tcp_cm_node *n = exs_list_entry(pos, struct tcp_cm_node, link);

        if (n->ev.ep == &ep->base && n->ev.type != EXS_PROV_CM_CONNECT_REQUEST) {
            exs_list_del(&n->link);
            free(n);
        }
    }
    exs_list_del(&ep->link);
    pthread_mutex_unlock(&ctx->lock);
}

void exs__tcp_ep_destroy(struct exs_prov_ep *e)
{
    struct tcp_ep *ep;
    struct tcp_cmd cmd = { .type = TCP_CMD_EP_DESTROY };

    if (!e)
        return;
    ep = tcp_ep_of(e);
    cmd.ep = ep;
    exs__tcp_ep_revoke_all(ep);
    if (exs__tcp_ctx_call(ep->ctx, &cmd) == -ESHUTDOWN)
        return;
    pthread_mutex_destroy(&ep->lock);
    free(ep);
}

/* ---- listeners ---- */

int exs__tcp_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    struct tcp_cmd cmd = { .type = TCP_CMD_LISTEN };
    struct tcp_listener *lis;
    int one = 1, ret, fd;

    if (!addr || addrlen < sizeof(sa_family_t) || addrlen > sizeof(struct sockaddr_storage))
        return -EINVAL;
    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* The kernel's queue is as long as the system allows (net.core.somaxconn caps it),
     * whatever the consumer's backlog: the consumer bounds its own queues and, when they
     * are full, pauses the listener (listener_pause), and then the clients wait here. */
    (void)backlog;
    if (bind(fd, addr, addrlen) < 0 || listen(fd, TCP_LISTEN_QUEUE) < 0) {
        ret = -errno;
        EXS_DBG(PROV, "listen: %m");
        close(fd);
        return ret;
    }
    lis = calloc(1, sizeof(*lis));
    if (!lis) {
        close(fd);
        return -ENOMEM;
    }
    lis->base.ctx = c;
    lis->base.user = user;
    lis->ctx = ctx;
    lis->fd = fd;
    lis->addrlen = sizeof(lis->addr);
    getsockname(fd, (struct sockaddr *)&lis->addr, &lis->addrlen);
    exs_list_init(&lis->reqs);
    exs_list_init(&lis->handshakes);
    cmd.lis = lis;
    ret = exs__tcp_ctx_call(ctx, &cmd);
    if (ret) {
        close(fd);
        free(lis);
        return ret;
    }
    *lis_p = &lis->base;
    return 0;
}

int exs__tcp_listener_addr(struct exs_prov_listener *l, struct sockaddr_storage *addr,
                           socklen_t *addrlen)
{
    struct tcp_listener *lis = (struct tcp_listener *)l;

    if (!lis || !addr || !addrlen)
        return -EINVAL;
    *addr = lis->addr;
    *addrlen = lis->addrlen;
    return 0;
}

static void tcp_req_reject(struct tcp_req *req, const void *pd, uint32_t pdlen)
{
    struct tcp_conn *conn = req->conn;
    struct tcp_txf *f;

    exs_list_del(&req->link);
    free(req);
    conn->req = NULL;
    conn->lis = NULL;
    if (conn->broken) {
        conn->state = TCP_CONN_LINGER;
        exs__tcp_conn_close(conn);
        return;
    }
    EXS_CNT_INC(conn->ctx->cnt.conns_rejected);
    f = tcp_hs_frame(conn, TCP_WIRE_CONN_REJECT, NULL, pd, pdlen);
    conn->state = TCP_CONN_LINGER;
    if (f)
        exs__tcp_txq_push(conn, f);
    exs__tcp_txq_push(conn, NULL);
    conn->linger_at = exs__now_ns() + TCP_LINGER_NS + conn->ctx->emu_delay_ns;
    exs__tcp_conn_timer(conn);
    exs__tcp_conn_update_events(conn);
}

static void tcp_listener_destroy_nic(struct tcp_ctx *ctx, struct tcp_listener *lis)
{
    struct exs_list *pos, *tmp;

    while (!exs_list_empty(&lis->reqs))
        tcp_req_reject(exs_list_entry(lis->reqs.next, struct tcp_req, link), NULL, 0);
    exs_list_for_each_safe(pos, tmp, &ctx->conns) {
        struct tcp_conn *conn = exs_list_entry(pos, struct tcp_conn, link);

        if (conn->lis == lis)
            exs__tcp_conn_close(conn); /* still in the handshake */
    }
    pthread_mutex_lock(&ctx->lock);
    exs_list_for_each_safe(pos, tmp, &ctx->cm_events) {
        struct tcp_cm_node *n = exs_list_entry(pos, struct tcp_cm_node, link);

        if (n->ev.listener == &lis->base) {
            exs_list_del(&n->link);
            free(n);
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, lis->fd, NULL);
    exs_list_del(&lis->link);
}

void exs__tcp_listener_destroy(struct exs_prov_listener *l)
{
    struct tcp_listener *lis = (struct tcp_listener *)l;
    struct tcp_cmd cmd = { .type = TCP_CMD_LISTENER_DESTROY };

    if (!lis)
        return;
    cmd.lis = lis;
    exs__tcp_ctx_call(lis->ctx, &cmd);
    close(lis->fd);
    free(lis);
}

/* NIC: stop or go on accepting sockets (a back-off in progress watches it again when it
 * ends, unless paused). */
static void tcp_listener_pause_nic(struct tcp_listener *lis, int pause)
{
    if (lis->paused == pause)
        return;
    lis->paused = pause;
    if (lis->resume_at)
        return;
    exs__tcp_listener_watch(lis, !pause);
    if (!pause)
        exs__tcp_listener_ready(lis);
}

int exs__tcp_listener_pause(struct exs_prov_listener *l, int pause)
{
    struct tcp_listener *lis = (struct tcp_listener *)l;
    struct tcp_cmd cmd = { .type = TCP_CMD_LISTENER_PAUSE, .pdlen = !!pause };

    if (!lis)
        return -EINVAL;
    cmd.lis = lis;
    return exs__tcp_ctx_call(lis->ctx, &cmd);
}

/* ---- connect / accept / reject / disconnect ---- */

static int tcp_ep_check_connect(struct tcp_ep *ep, const void *pd, uint32_t pdlen)
{
    int ret = 0;

    if (pdlen > TCP_WIRE_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    pthread_mutex_lock(&ep->lock);
    if (ep->state != EXS_PROV_EP_IDLE)
        ret = -EISCONN;
    pthread_mutex_unlock(&ep->lock);
    return ret;
}

int exs__tcp_connect(struct exs_prov_ep *e, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_cmd cmd = { .type = TCP_CMD_CONNECT, .ep = ep, .addr = addr, .addrlen = addrlen,
                           .pd = pd, .pdlen = pdlen };
    int ret;

    if (!addr || addrlen < sizeof(sa_family_t) || addrlen > sizeof(struct sockaddr_storage))
        return -EINVAL;
    ret = tcp_ep_check_connect(ep, pd, pdlen);
    return ret ? ret : exs__tcp_ctx_call(ep->ctx, &cmd);
}

static int tcp_connect_nic(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    struct tcp_ep *ep = cmd->ep;
    struct tcp_conn *conn;
    struct tcp_txf *f;
    int fd, err = 0;

    if (ep->state != EXS_PROV_EP_IDLE || ep->conn)
        return -EISCONN;
    fd = socket(cmd->addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&ep->lock);
    __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTING, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ep->lock);
    if (connect(fd, cmd->addr, cmd->addrlen) < 0 && errno != EINPROGRESS)
        err = errno;
    if (err) {
        close(fd);
        EXS_DBG(PROV, "ep %p: connect: %s", (void *)ep, strerror(err));
        EXS_CNT_INC(ctx->cnt.conns_unreachable);
        tcp_ep_unconnected(ep, EXS_PROV_CM_UNREACHABLE, -err, NULL, 0);
        return 0;
    }
    conn = tcp_conn_new(ctx, fd, TCP_CONN_CONNECTING);
    if (!conn) {
        close(fd);
        pthread_mutex_lock(&ep->lock);
        __atomic_store_n(&ep->state, EXS_PROV_EP_IDLE, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ep->lock);
        return -ENOMEM;
    }
    memcpy(&conn->peer, cmd->addr, cmd->addrlen);
    conn->peerlen = cmd->addrlen;
    conn->ep = ep;
    ep->conn = conn;
    f = tcp_hs_frame(conn, TCP_WIRE_CONN_REQ, ep, cmd->pd, cmd->pdlen);
    if (!f) {
        exs__tcp_conn_close(conn);
        pthread_mutex_lock(&ep->lock);
        __atomic_store_n(&ep->state, EXS_PROV_EP_IDLE, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ep->lock);
        return -ENOMEM;
    }
    exs__tcp_txq_push(conn, f);
    return 0;
}

int exs__tcp_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                    uint32_t pdlen)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_cmd cmd = { .type = TCP_CMD_ACCEPT, .ep = ep, .req = (struct tcp_req *)r,
                           .pd = pd, .pdlen = pdlen };
    int ret;

    if (!r || !e)
        return -EINVAL;
    ret = tcp_ep_check_connect(ep, pd, pdlen);
    if (ret)
        return ret;
    if (e->ctx != r->listener->ctx)
        return -EINVAL;
    return exs__tcp_ctx_call(ep->ctx, &cmd);
}

static int tcp_accept_nic(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    struct tcp_req *req = cmd->req;
    struct tcp_conn *conn = req->conn;
    struct tcp_ep *ep = cmd->ep;
    struct tcp_txf *f;

    if (ep->state != EXS_PROV_EP_IDLE || ep->conn)
        return -EISCONN;
    if (conn->broken) {
        /* the request stays the consumer's: its reject frees it */
        EXS_DBG(PROV, "req %p: accept: the peer is gone", (void *)req);
        return -ECONNRESET;
    }
    f = tcp_hs_frame(conn, TCP_WIRE_CONN_ACCEPT, ep, cmd->pd, cmd->pdlen);
    if (!f)
        return -ENOMEM;
    exs_list_del(&req->link);
    free(req);
    conn->req = NULL;
    conn->lis = NULL;
    conn->ep = ep;
    ep->conn = conn;
    conn->state = TCP_CONN_UP;
    exs__tcp_txq_push(conn, f);
    pthread_mutex_lock(&ep->lock);
    tcp_ep_note_local_locked(ep, conn->fd);
    __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTED, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ep->lock);
    EXS_CNT_INC(ctx->cnt.conns_established);
    tcp_cm_event(ctx, EXS_PROV_CM_ESTABLISHED, ep, 0, NULL, 0);
    exs__tcp_conn_update_events(conn);
    return 0;
}

int exs__tcp_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct tcp_cmd cmd = { .type = TCP_CMD_REJECT, .req = (struct tcp_req *)r, .pd = pd,
                           .pdlen = pdlen };

    if (!r || pdlen > TCP_WIRE_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    return exs__tcp_ctx_call(((struct tcp_listener *)r->listener)->ctx, &cmd);
}

int exs__tcp_disconnect(struct exs_prov_ep *e)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_cmd cmd = { .type = TCP_CMD_DISCONNECT, .ep = ep };

    if (!e)
        return -EINVAL;
    return exs__tcp_ctx_call(ep->ctx, &cmd);
}

static int tcp_disconnect_nic(struct tcp_ep *ep)
{
    struct tcp_conn *conn = ep->conn;

    if (!conn)
        return ep->state == EXS_PROV_EP_ERROR ? 0 : -EINVAL;
    if (conn->state == TCP_CONN_UP) {
        exs__tcp_conn_fail(conn, 0, 0, 0, 1);
        return 0;
    }
    /* still connecting: give up */
    exs__tcp_conn_close(conn);
    exs__tcp_ep_fail(ep, 0, 1);
    return 0;
}

/* NIC (nic_lock held, the caller's thread): run one command. */
void exs__tcp_cmd_run(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    int ret = 0;

    switch (cmd->type) {
    case TCP_CMD_CONNECT:
        ret = tcp_connect_nic(ctx, cmd);
        break;
    case TCP_CMD_ACCEPT:
        ret = tcp_accept_nic(ctx, cmd);
        break;
    case TCP_CMD_REJECT:
        tcp_req_reject(cmd->req, cmd->pd, cmd->pdlen);
        break;
    case TCP_CMD_DISCONNECT:
        ret = tcp_disconnect_nic(cmd->ep);
        break;
    case TCP_CMD_EP_DESTROY:
        tcp_ep_destroy_nic(ctx, cmd->ep);
        break;
    case TCP_CMD_LISTEN:
        ret = exs__tcp_epoll_add_listener(cmd->lis);
        if (!ret)
            exs_list_add_tail(&ctx->listeners, &cmd->lis->link);
        break;
    case TCP_CMD_LISTENER_DESTROY:
        tcp_listener_destroy_nic(ctx, cmd->lis);
        break;
    case TCP_CMD_LISTENER_PAUSE:
        tcp_listener_pause_nic(cmd->lis, (int)cmd->pdlen);
        break;
    }
    cmd->ret = ret;
}
