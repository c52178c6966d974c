/* SPDX-License-Identifier: MIT */
/* Connections of the tcp provider: their life (new, fail, linger, close), the handshake
 * frames and the endpoint failures they cause (spec/provider-tcp.md). */
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
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

static void tcp_ep_note_local_locked(struct tcp_ep *ep, int fd);

/* ---- state machines (spec/provider-tcp.md, "States") ---- */

#define TCP_BIT(_s) (1u << (_s))

static const char *const tcp_conn_state_names[] = {
    [TCP_CONN_CONNECTING] = "CONNECTING",
    [TCP_CONN_WAIT_REPLY] = "WAIT_REPLY",
    [TCP_CONN_WAIT_REQ] = "WAIT_REQ",
    [TCP_CONN_PENDING] = "PENDING",
    [TCP_CONN_UP] = "UP",
    [TCP_CONN_LINGER] = "LINGER",
    [TCP_CONN_DEAD] = "DEAD",
};

/* A connection's allowed transitions: bit `to` of row `from`. DEAD is reachable from every
 * other state (exs__tcp_conn_close); nothing leaves it. */
static const unsigned tcp_conn_next[] = {
    [TCP_CONN_CONNECTING] = TCP_BIT(TCP_CONN_WAIT_REPLY) | TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_WAIT_REPLY] = TCP_BIT(TCP_CONN_UP) | TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_WAIT_REQ] = TCP_BIT(TCP_CONN_PENDING) | TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_PENDING] = TCP_BIT(TCP_CONN_UP) | TCP_BIT(TCP_CONN_LINGER) | TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_UP] = TCP_BIT(TCP_CONN_LINGER) | TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_LINGER] = TCP_BIT(TCP_CONN_DEAD),
    [TCP_CONN_DEAD] = 0,
};

static const char *const tcp_ep_state_names[] = {
    [EXS_PROV_EP_IDLE] = "IDLE",
    [EXS_PROV_EP_CONNECTING] = "CONNECTING",
    [EXS_PROV_EP_CONNECTED] = "CONNECTED",
    [EXS_PROV_EP_ERROR] = "ERROR",
};

/* An endpoint's allowed transitions. ERROR is reachable from every state and stays (a
 * failure of a failed ep is no change); CONNECTING goes back to IDLE only when connect
 * could not start (no memory), before any event. */
static const unsigned tcp_ep_next[] = {
    [EXS_PROV_EP_IDLE] = TCP_BIT(EXS_PROV_EP_CONNECTING) | TCP_BIT(EXS_PROV_EP_CONNECTED) |
                         TCP_BIT(EXS_PROV_EP_ERROR),
    [EXS_PROV_EP_CONNECTING] =
        TCP_BIT(EXS_PROV_EP_IDLE) | TCP_BIT(EXS_PROV_EP_CONNECTED) | TCP_BIT(EXS_PROV_EP_ERROR),
    [EXS_PROV_EP_CONNECTED] = TCP_BIT(EXS_PROV_EP_ERROR),
    [EXS_PROV_EP_ERROR] = TCP_BIT(EXS_PROV_EP_ERROR),
};

int exs__tcp_conn_state_legal(enum tcp_conn_state from, enum tcp_conn_state to)
{
    return (unsigned)from < EXS_ARRAY_SIZE(tcp_conn_next) &&
           (unsigned)to < EXS_ARRAY_SIZE(tcp_conn_state_names) &&
           (tcp_conn_next[from] & TCP_BIT(to)) != 0;
}

int exs__tcp_ep_state_legal(enum exs_prov_ep_state from, enum exs_prov_ep_state to)
{
    return (unsigned)from < EXS_ARRAY_SIZE(tcp_ep_next) &&
           (unsigned)to < EXS_ARRAY_SIZE(tcp_ep_state_names) &&
           (tcp_ep_next[from] & TCP_BIT(to)) != 0;
}

const char *exs__tcp_conn_state_str(enum tcp_conn_state s)
{
    return (unsigned)s < EXS_ARRAY_SIZE(tcp_conn_state_names) ? tcp_conn_state_names[s] : "?";
}

static const char *tcp_ep_state_str(enum exs_prov_ep_state s)
{
    return (unsigned)s < EXS_ARRAY_SIZE(tcp_ep_state_names) ? tcp_ep_state_names[s] : "?";
}

static const char *tcp_conn_end_str(enum tcp_conn_end mode)
{
    switch (mode) {
    case TCP_END_ABORT:
        return "abort";
    case TCP_END_QUIET:
        return "linger";
    case TCP_END_DISCONNECT:
        return "linger, DISCONNECT last";
    case TCP_END_CLOSED:
        return "linger, DISCONNECT F_CLOSED last";
    }
    return "?";
}

/*
 * NIC: the one place a connection's state changes. A transition outside the table is a
 * bug of the provider: it is logged and counted (state_errors), and instead of it the
 * connection is closed and its ep failed (-EPROTO, a DISCONNECTED event), so that no
 * peer can use it to reach a state the rest of the code does not expect. Returns 0, or
 * -EPROTO after such a failure (the caller stops: conn is DEAD).
 */
int exs__tcp_conn_set_state(struct tcp_conn *conn, enum tcp_conn_state to, const char *why)
{
    enum tcp_conn_state from = conn->state;
    struct tcp_ep *ep = conn->ep;

    if (EXS_UNLIKELY(!exs__tcp_conn_state_legal(from, to))) {
        EXS_CNT_INC(conn->ctx->cnt.state_errors);
        EXS_ERR(PROV, "conn %p ep %p: illegal state change %s -> %s (%s): closing it", (void *)conn,
                (void *)ep, exs__tcp_conn_state_str(from), exs__tcp_conn_state_str(to), why);
        if (from != TCP_CONN_DEAD) {
            exs__tcp_conn_close(conn);
            if (ep)
                exs__tcp_ep_fail(ep, -EPROTO, TCP_FAIL_DISCONNECTED);
        }
        return -EPROTO;
    }
    EXS_DBG(PROV, "conn %p ep %p fd %d: %s -> %s (%s)", (void *)conn, (void *)ep, conn->fd,
            exs__tcp_conn_state_str(from), exs__tcp_conn_state_str(to), why);
    conn->state = to;
    return 0;
}

/*
 * The one place an endpoint's state changes (ep->lock held; by the nic_lock holder).
 * Outside the table: logged, counted (state_errors) and the ep goes to ERROR instead
 * (legal from every state), returning -EPROTO: the caller, having dropped ep->lock,
 * fails the ep (exs__tcp_ep_fail) rather than going on.
 */
static int tcp_ep_set_state_locked(struct tcp_ep *ep, enum exs_prov_ep_state to, const char *why)
{
    enum exs_prov_ep_state from = (enum exs_prov_ep_state)ep->state;

    if (EXS_UNLIKELY(!exs__tcp_ep_state_legal(from, to))) {
        EXS_CNT_INC(ep->ctx->cnt.state_errors);
        EXS_ERR(PROV, "ep %p: illegal state change %s -> %s (%s): failing it", (void *)ep,
                tcp_ep_state_str(from), tcp_ep_state_str(to), why);
        __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
        return -EPROTO;
    }
    if (from != to)
        EXS_DBG(PROV, "ep %p: %s -> %s (%s)", (void *)ep, tcp_ep_state_str(from),
                tcp_ep_state_str(to), why);
    __atomic_store_n(&ep->state, to, __ATOMIC_RELAXED);
    return 0;
}

/* As tcp_ep_set_state_locked, taking ep->lock; outside the table the ep is failed here
 * (-EPROTO, a DISCONNECTED event) and -EPROTO returned. */
int exs__tcp_ep_set_state(struct tcp_ep *ep, enum exs_prov_ep_state to, const char *why)
{
    int ret;

    pthread_mutex_lock(&ep->lock);
    ret = tcp_ep_set_state_locked(ep, to, why);
    pthread_mutex_unlock(&ep->lock);
    if (ret)
        exs__tcp_ep_fail(ep, -EPROTO, TCP_FAIL_DISCONNECTED);
    return ret;
}

/* ---- connections (NIC) ---- */

struct tcp_conn *exs__tcp_conn_new(struct tcp_ctx *ctx, int fd, enum tcp_conn_state state)
{
    struct tcp_conn *conn = calloc(1, sizeof(*conn));
    struct epoll_event ev = {.events = 0};
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
static void tcp_conn_hs_leave(struct tcp_conn *conn)
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
    tcp_conn_hs_leave(conn);
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
        exs__nc_close(conn->fd);
        conn->fd = -1;
    }
    if (conn->ep && conn->ep->conn == conn)
        conn->ep->conn = NULL;
    conn->ep = NULL;
    exs__tcp_conn_set_state(conn, TCP_CONN_DEAD, "closed");
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
        exs__nc_close(conn->fd);
        conn->fd = -1;
    }
    tcp_conn_txq_clear(conn);
    conn->broken = 1;
}

static void tcp_cm_event(struct tcp_ctx *ctx, enum exs_prov_cm_event_type type, struct tcp_ep *ep,
                         int status, const void *pd, uint32_t pdlen)
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
 * with TCP_FAIL_DISCONNECTED, one DISCONNECTED event. */
void exs__tcp_ep_fail(struct tcp_ep *ep, int status, enum tcp_fail_event notify)
{
    exs__tcp_ep_fail_cqe(ep, status, notify, NULL);
}

/* As exs__tcp_ep_fail, queueing first (the error completion that caused it)
 * ahead of the flushes, in the same critical section: once the application
 * sees the error, the ep is in ERROR and nothing it posts can overtake. */
void exs__tcp_ep_fail_cqe(struct tcp_ep *ep, int status, enum tcp_fail_event notify,
                          const struct exs_prov_cqe *first)
{
    struct tcp_ctx *ctx = ep->ctx;
    struct exs_list *lists[] = {&ep->sq, &ep->sq_wait, &ep->sq_pend};
    struct exs_prov_cqe cqe;
    struct exs_list *l;

    pthread_mutex_lock(&ep->lock);
    tcp_ep_set_state_locked(ep, EXS_PROV_EP_ERROR, status ? strerror(-status) : "ended");
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
            cqe.opcode = exs__prov_wr_wc_opcode(wr->opcode);
            /* ep_destroy: discarded without completions */
            if (!ep->destroyed) {
                EXS_CNT_INC(ctx->cnt.flushed_wrs);
                exs__tcp_cq_push_locked(ctx, ep, &cqe);
            }
            free(wr);
        }
    }
    while ((l = exs_list_pop_head(&ep->rq)) != NULL) {
        struct exs_soft_rwr *rwr = exs_list_entry(l, struct exs_soft_rwr, link);

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
void exs__tcp_ep_unconnected(struct tcp_ep *ep, enum exs_prov_cm_event_type type, int status,
                             const void *pd, uint32_t pdlen)
{
    if (ep->disc_sent)
        return;
    exs__tcp_ep_fail(ep, status, TCP_FAIL_SILENT);
    ep->disc_sent = 1;
    tcp_cm_event(ep->ctx, type, ep, status, pd, pdlen);
}

/*
 * NIC: end conn. status goes into the ep's DISCONNECTED (or UNREACHABLE) event.
 * syndrome != 0: send NAK(psn, syndrome) last; how the rest ends: enum tcp_conn_end.
 */
void exs__tcp_conn_fail(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                        enum tcp_conn_end mode)
{
    exs__tcp_conn_fail_cqe(conn, status, syndrome, psn, mode, NULL);
}

/* As exs__tcp_conn_fail; first is the error completion queued ahead of the flushes. */
void exs__tcp_conn_fail_cqe(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                            enum tcp_conn_end mode, const struct exs_prov_cqe *first)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_ep *ep = conn->ep;
    struct exs_list *pos, *tmp;
    struct tcp_txf *f;
    int abort = mode == TCP_END_ABORT;

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
            exs__tcp_ep_unconnected(ep, EXS_PROV_CM_UNREACHABLE, status, NULL, 0);
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

    EXS_DBG(PROV, "conn %p ep %p: ending, status %d syndrome %u, %s", (void *)conn, (void *)ep,
            status, syndrome, tcp_conn_end_str(mode));
    exs__tcp_rx_release(conn);
    exs_list_for_each_safe(pos, tmp, &conn->txq)
    {
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
        /* An abortive end is a reset on the wire: closed plainly, a socket with nothing
         * unread would end with a FIN, and the peer would take that EOF for our endpoint
         * closed for good (EXS_PROV_CM_F_PEER_CLOSED: never cut over), where this is a
         * path cut mid-frame (a disconnect for the cut-over of spec/protocol.md §9.2). An
         * endpoint closed for good keeps its EOF. */
        if (mode != TCP_END_CLOSED && conn->fd >= 0) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};

            (void)setsockopt(conn->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            EXS_CNT_INC(ctx->cnt.conns_reset);
        }
        exs__tcp_conn_close(conn);
    } else {
        if (exs__tcp_conn_set_state(conn, TCP_CONN_LINGER, tcp_conn_end_str(mode)))
            return;
        conn->status = status;
        f = NULL;
        if (syndrome) {
            f = exs__tcp_txf_ctrl(conn, TCP_WIRE_NAK, 0);
            if (f) {
                f->hdr.syndrome = syndrome;
                f->hdr.psn = htonl(psn);
            }
        } else if (mode == TCP_END_DISCONNECT || mode == TCP_END_CLOSED) {
            f = exs__tcp_txf_ctrl(conn, TCP_WIRE_DISCONNECT, 0);
            if (f && mode == TCP_END_CLOSED)
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
        exs__tcp_ep_fail_cqe(ep, status, TCP_FAIL_DISCONNECTED, first);
}

/* NIC: an active connect finished (EPOLLOUT). */
void exs__tcp_conn_connected(struct tcp_conn *conn)
{
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err) {
        EXS_DBG(PROV, "conn %p ep %p: connect: %s", (void *)conn, (void *)conn->ep, strerror(err));
        exs__tcp_conn_fail(conn, -err, 0, 0, TCP_END_ABORT);
        return;
    }
    if (exs__tcp_conn_set_state(conn, TCP_CONN_WAIT_REPLY, "TCP connected, CONN_REQ goes"))
        return;
    exs__tcp_txq_push(conn, NULL);
    exs__tcp_conn_update_events(conn);
}

struct tcp_txf *exs__tcp_hs_frame(struct tcp_conn *conn, uint8_t type, struct tcp_ep *ep,
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
            exs__tcp_conn_refuse(conn, "rnr_retry above 7 in the connection request");
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
        tcp_conn_hs_leave(conn);
        if (exs__tcp_conn_set_state(conn, TCP_CONN_PENDING, "CONN_REQ read")) {
            conn->req = NULL;
            free(req);
            return -1;
        }
        exs_list_add_tail(&conn->lis->reqs, &req->link);
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
            exs__tcp_conn_fail(conn, -EPROTO, 0, 0, TCP_END_ABORT);
            return -1;
        }
        conn->peer_rnr_retry = conn->hs[0];
        conn->peer_rnr_timer_ms = conn->hs[1];
        if (exs__tcp_conn_set_state(conn, TCP_CONN_UP, "CONN_ACCEPT read") ||
            exs__tcp_ep_established(ep, conn->hs + TCP_WIRE_CONN_LEN, len - TCP_WIRE_CONN_LEN))
            return -1;
        exs__tcp_conn_update_events(conn);
        return 0;
    case TCP_WIRE_CONN_REJECT:
        exs__tcp_conn_close(conn);
        EXS_CNT_INC(ctx->cnt.conns_rejected);
        exs__tcp_ep_unconnected(ep, EXS_PROV_CM_REJECTED, -ECONNREFUSED, conn->hs, len);
        return -1;
    default:
        return -1;
    }
}

/* Remember the local address of the connection's socket (ep->lock held). */
static void tcp_ep_note_local_locked(struct tcp_ep *ep, int fd)
{
    ep->local_len = sizeof(ep->local);
    if (getsockname(fd, (struct sockaddr *)&ep->local, &ep->local_len) < 0)
        ep->local_len = 0;
}

/* NIC: ep's connection (ep->conn, now UP) is established: CONNECTED, and its ESTABLISHED
 * event with the peer's private data (the active side) or none (the passive side).
 * -EPROTO when the ep may not become CONNECTED (spec/provider-tcp.md, "States"): the
 * connection and the ep are failed instead. */
int exs__tcp_ep_established(struct tcp_ep *ep, const void *pd, uint32_t pdlen)
{
    int ret;

    pthread_mutex_lock(&ep->lock);
    ret = tcp_ep_set_state_locked(ep, EXS_PROV_EP_CONNECTED, "connection up");
    if (!ret)
        tcp_ep_note_local_locked(ep, ep->conn->fd);
    pthread_mutex_unlock(&ep->lock);
    if (ret) {
        exs__tcp_conn_fail(ep->conn, -EPROTO, 0, 0, TCP_END_ABORT);
        return ret;
    }
    EXS_CNT_INC(ep->ctx->cnt.conns_established);
    tcp_cm_event(ep->ctx, EXS_PROV_CM_ESTABLISHED, ep, 0, pd, pdlen);
    return 0;
}
