/* SPDX-License-Identifier: MIT */
/* Listeners of the tcp provider: listen, accept sockets, the wait for CONN_REQ, back-off,
 * pause, reject and destroy (spec/provider-tcp.md, "Handshake"). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

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
    ctx->timer_rearm = 1; /* resume_at set: the turn re-arms the timerfd */
    EXS_CNT_INC(ctx->cnt.accept_backoffs);
    EXS_WARN(PROV, "listener %p: accept: %s; not accepting for %u ms", (void *)lis, strerror(err),
             lis->backoff_ms);
    exs__tcp_listener_watch(lis, 0);
}

/* ---- the hello: an accepted socket until its CONN_REQ (spec/provider-tcp.md, "Handshake") ---- */

/* How long an accepted socket has for its CONN_REQ: EXS_TCP_HELLO_MS (online: read at
 * each accept) plus the emulated one-way delay. */
static uint64_t tcp_hello_ns(const struct tcp_ctx *ctx)
{
    return __atomic_load_n(&exs__params.tcp_hello_ms, __ATOMIC_RELAXED) * 1000000u +
           ctx->emu_delay_ns;
}

static unsigned tcp_hello_max(void)
{
    uint64_t v = __atomic_load_n(&exs__params.tcp_hello_max, __ATOMIC_RELAXED);

    return v < 1 ? 1 : v > (1u << 20) ? 1u << 20 : (unsigned)v;
}

static void tcp_peer_str(const struct tcp_conn *conn, char *buf, size_t len)
{
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)&conn->peer;
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&conn->peer;
    char a[INET6_ADDRSTRLEN] = "?";

    if (conn->peer.ss_family == AF_INET) {
        inet_ntop(AF_INET, &in4->sin_addr, a, sizeof(a));
        snprintf(buf, len, "%s:%u", a, ntohs(in4->sin_port));
    } else if (conn->peer.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &in6->sin6_addr, a, sizeof(a));
        snprintf(buf, len, "[%s]:%u", a, ntohs(in6->sin6_port));
    } else {
        snprintf(buf, len, "?");
    }
}

/*
 * NIC: conn (WAIT_REQ) is no exs peer, or has not said so in time: reset it. SO_LINGER 0
 * makes close() send RST rather than FIN, so a plain TCP client (nc, an HTTP client, a
 * port scanner) learns at once that this is not its server instead of waiting for its own
 * timeout. Counted (hello_refused); the first of each listener is logged at info level,
 * the others at debug level (a scanner must not flood the log).
 */
void exs__tcp_conn_refuse(struct tcp_conn *conn, const char *why)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_listener *lis = conn->lis;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    char peer[INET6_ADDRSTRLEN + 16];

    EXS_CNT_INC(ctx->cnt.hello_refused);
    EXS_CNT_INC(ctx->cnt.bogus_conns);
    tcp_peer_str(conn, peer, sizeof(peer));
    if (lis && !lis->hello_logged) {
        lis->hello_logged = 1;
        EXS_INFO(PROV,
                 "listener %p: connection from %s reset: %s (an exs tcp listener talks "
                 "to exs peers only; counter prov.tcp.hello_refused, later ones at debug "
                 "level)",
                 (void *)lis, peer, why);
    } else {
        EXS_DBG(PROV, "listener %p: connection from %s reset: %s", (void *)lis, peer, why);
    }
    if (conn->fd >= 0 && setsockopt(conn->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
        EXS_DBG(PROV, "conn %p: SO_LINGER: %m", (void *)conn);
    exs__tcp_conn_close(conn);
}

/* NIC timer: conn's hello deadline passed. What arrived in time is read first (a CONN_REQ
 * the turn has not read yet is not late); then it is refused if still waiting. */
void exs__tcp_conn_hello_late(struct tcp_conn *conn)
{
    exs__tcp_conn_rx(conn);
    if (conn->state != TCP_CONN_WAIT_REQ)
        return;
    EXS_CNT_INC(conn->ctx->cnt.handshake_timeouts);
    exs__tcp_conn_refuse(conn, "no connection request by the hello deadline");
}

/* The first n bytes of a header read from a WAIT_REQ socket may begin a CONN_REQ: magic,
 * version, type, no flags or syndrome, a length of 8 to 264 (checked as far as it came). */
int exs__tcp_hello_prefix_ok(const uint8_t *b, uint32_t n)
{
    static const uint8_t want[8] = {(uint8_t)(TCP_WIRE_MAGIC >> 24),
                                    (uint8_t)(TCP_WIRE_MAGIC >> 16),
                                    (uint8_t)(TCP_WIRE_MAGIC >> 8),
                                    (uint8_t)TCP_WIRE_MAGIC,
                                    TCP_WIRE_VERSION,
                                    TCP_WIRE_CONN_REQ,
                                    0,
                                    0};

    return memcmp(b, want, EXS_MIN(n, (uint32_t)sizeof(want))) == 0 && (n <= 8 || b[8] == 0) &&
           (n <= 9 || b[9] == 0) &&
           (n <= 10 || b[10] <= (TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX) >> 8);
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

    if (lis->n_handshakes < tcp_hello_max())
        return 1;
    old = exs_list_entry(lis->handshakes.next, struct tcp_conn, hs_link);
    now = exs__now_ns();
    judge = old->hs_at + tcp_hello_ns(ctx) / 10;
    if (ioctl(old->fd, FIONREAD, &unread) < 0)
        unread = 0;
    if (now >= judge && !unread) {
        EXS_CNT_INC(ctx->cnt.handshake_evictions);
        EXS_DBG(PROV, "listener %p: %u handshakes pending: dropping conn %p", (void *)lis,
                lis->n_handshakes, (void *)old);
        exs__tcp_conn_refuse(old, "silent while the listener is at EXS_TCP_HELLO_MAX");
        return 1;
    }
    EXS_CNT_INC(ctx->cnt.handshake_waits);
    lis->hs_wait = 1;
    lis->resume_at = unread || now >= judge ? now + 1000000u : judge;
    ctx->timer_rearm = 1; /* resume_at set: the turn re-arms the timerfd */
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
        fd = exs__nc_accept4(lis->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
        conn = exs__tcp_conn_new(lis->ctx, fd, TCP_CONN_WAIT_REQ);
        if (!conn) {
            exs__nc_close(fd);
            continue;
        }
        conn->lis = lis;
        conn->peer = ss;
        conn->peerlen = sl;
        exs_list_add_tail(&lis->handshakes, &conn->hs_link);
        conn->on_hs = 1;
        conn->hs_at = exs__now_ns();
        lis->n_handshakes++;
        conn->linger_at = exs__now_ns() + tcp_hello_ns(lis->ctx);
        exs__tcp_conn_timer(conn);
    }
}

/* ---- listeners ---- */

int exs__tcp_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    struct tcp_cmd cmd = {.type = TCP_CMD_LISTEN};
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
        exs__nc_close(fd);
        return ret;
    }
    lis = calloc(1, sizeof(*lis));
    if (!lis) {
        exs__nc_close(fd);
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
        exs__nc_close(fd);
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
        exs__tcp_conn_close(conn);
        return;
    }
    EXS_CNT_INC(conn->ctx->cnt.conns_rejected);
    f = exs__tcp_hs_frame(conn, TCP_WIRE_CONN_REJECT, NULL, pd, pdlen);
    if (exs__tcp_conn_set_state(conn, TCP_CONN_LINGER, "rejected")) {
        if (f)
            exs__tcp_txf_free(conn->ctx, f);
        return;
    }
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
    exs_list_for_each_safe(pos, tmp, &ctx->conns)
    {
        struct tcp_conn *conn = exs_list_entry(pos, struct tcp_conn, link);

        if (conn->lis == lis)
            exs__tcp_conn_close(conn); /* still in the handshake */
    }
    pthread_mutex_lock(&ctx->lock);
    exs__soft_cm_drop_locked(&ctx->cm_events, NULL, &lis->base);
    pthread_mutex_unlock(&ctx->lock);
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, lis->fd, NULL);
    exs_list_del(&lis->link);
}

void exs__tcp_listener_destroy(struct exs_prov_listener *l)
{
    struct tcp_listener *lis = (struct tcp_listener *)l;
    struct tcp_cmd cmd = {.type = TCP_CMD_LISTENER_DESTROY};

    if (!lis)
        return;
    cmd.lis = lis;
    exs__tcp_ctx_call(lis->ctx, &cmd);
    exs__nc_close(lis->fd);
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
    struct tcp_cmd cmd = {.type = TCP_CMD_LISTENER_PAUSE, .pause = !!pause};

    if (!lis)
        return -EINVAL;
    cmd.lis = lis;
    return exs__tcp_ctx_call(lis->ctx, &cmd);
}

/* NIC (nic_lock held, the caller's thread): run a command of the passive side. */
int exs__tcp_lis_cmd(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    int ret = 0;

    switch (cmd->type) {
    case TCP_CMD_REJECT:
        tcp_req_reject(cmd->req, cmd->pd, cmd->pdlen);
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
        tcp_listener_pause_nic(cmd->lis, cmd->pause);
        break;
    default:
        ret = -EINVAL;
        break;
    }
    return ret;
}
