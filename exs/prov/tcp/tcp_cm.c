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
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- endpoints ---- */

int exs__tcp_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    struct tcp_ep *ep;
    int ret;

    ret = exs__prov_ep_attr_check(&c->caps, attr);
    if (ret)
        return ret;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    pthread_mutex_lock(&ctx->lock);
    ret = exs__soft_cq_reserve(&ctx->cq, (uint64_t)attr->max_send_wr + attr->max_recv_wr,
                               ctx->base.caps.max_cqe);
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
    exs__soft_pool_init(&ep->wr_pool, TCP_WR_POOL_LEN, TCP_POOL_MAX);
    exs__soft_pool_init(
        &ep->rwr_pool, sizeof(struct exs_soft_rwr) + TCP_RWR_POOL_SGE * sizeof(struct exs_prov_sge),
        TCP_POOL_MAX);
    pthread_mutex_lock(&ctx->lock);
    exs_list_add_tail(&ctx->eps, &ep->link);
    pthread_mutex_unlock(&ctx->lock);
    *ep_p = &ep->base;
    return 0;
}

int exs__tcp_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr, socklen_t *addrlen)
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

    ep->destroyed = 1;
    ep->disc_sent = 1; /* no more events */
    if (conn) {
        if (conn->state == TCP_CONN_UP)
            exs__tcp_conn_fail(conn, 0, 0, 0, TCP_END_CLOSED); /* closed for good: F_CLOSED */
        else
            exs__tcp_conn_close(conn);
    }
    exs__tcp_ep_fail(ep, 0, TCP_FAIL_SILENT); /* empties the queues */

    pthread_mutex_lock(&ctx->lock);
    if (ep->on_work) {
        exs_list_del(&ep->work_link);
        ep->on_work = 0;
    }
    exs__soft_cq_drop_ep(&ctx->cq, &ep->base);
    exs__soft_cq_unreserve(&ctx->cq,
                           (uint64_t)ep->base.attr.max_send_wr + ep->base.attr.max_recv_wr);
    exs__soft_cm_drop_locked(&ctx->cm_events, &ep->base, NULL);
    exs_list_del(&ep->link);
    pthread_mutex_unlock(&ctx->lock);
}

void exs__tcp_ep_destroy(struct exs_prov_ep *e)
{
    struct tcp_ep *ep;
    struct tcp_cmd cmd = {.type = TCP_CMD_EP_DESTROY};

    if (!e)
        return;
    ep = tcp_ep_of(e);
    cmd.ep = ep;
    exs__tcp_ep_revoke_all(ep);
    if (exs__tcp_ctx_call(ep->ctx, &cmd) == -ESHUTDOWN)
        return;
    exs__soft_pool_fini(&ep->wr_pool);
    exs__soft_pool_fini(&ep->rwr_pool);
    pthread_mutex_destroy(&ep->lock);
    free(ep);
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
    struct tcp_cmd cmd = {.type = TCP_CMD_CONNECT,
                          .ep = ep,
                          .addr = addr,
                          .addrlen = addrlen,
                          .pd = pd,
                          .pdlen = pdlen};
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
    if (exs__tcp_ep_set_state(ep, EXS_PROV_EP_CONNECTING, "connect")) {
        exs__nc_close(fd);
        return -EPROTO;
    }
    if (exs__nc_connect(fd, cmd->addr, cmd->addrlen) < 0 && errno != EINPROGRESS)
        err = errno;
    if (err) {
        exs__nc_close(fd);
        EXS_DBG(PROV, "ep %p: connect: %s", (void *)ep, strerror(err));
        EXS_CNT_INC(ctx->cnt.conns_unreachable);
        exs__tcp_ep_unconnected(ep, EXS_PROV_CM_UNREACHABLE, -err, NULL, 0);
        return 0;
    }
    conn = exs__tcp_conn_new(ctx, fd, TCP_CONN_CONNECTING);
    if (!conn) {
        exs__nc_close(fd);
        exs__tcp_ep_set_state(ep, EXS_PROV_EP_IDLE, "connect: no memory");
        return -ENOMEM;
    }
    memcpy(&conn->peer, cmd->addr, cmd->addrlen);
    conn->peerlen = cmd->addrlen;
    conn->ep = ep;
    ep->conn = conn;
    f = exs__tcp_hs_frame(conn, TCP_WIRE_CONN_REQ, ep, cmd->pd, cmd->pdlen);
    if (!f) {
        exs__tcp_conn_close(conn);
        exs__tcp_ep_set_state(ep, EXS_PROV_EP_IDLE, "connect: no memory");
        return -ENOMEM;
    }
    exs__tcp_txq_push(conn, f);
    return 0;
}

int exs__tcp_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                    uint32_t pdlen)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_cmd cmd = {
        .type = TCP_CMD_ACCEPT, .ep = ep, .req = (struct tcp_req *)r, .pd = pd, .pdlen = pdlen};
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
    f = exs__tcp_hs_frame(conn, TCP_WIRE_CONN_ACCEPT, ep, cmd->pd, cmd->pdlen);
    if (!f)
        return -ENOMEM;
    exs_list_del(&req->link);
    free(req);
    conn->req = NULL;
    conn->lis = NULL;
    conn->ep = ep;
    ep->conn = conn;
    if (exs__tcp_conn_set_state(conn, TCP_CONN_UP, "accepted")) {
        exs__tcp_txf_free(ctx, f);
        return -EPROTO;
    }
    exs__tcp_txq_push(conn, f);
    if (exs__tcp_ep_established(ep, NULL, 0))
        return -EPROTO;
    exs__tcp_conn_update_events(conn);
    return 0;
}

int exs__tcp_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct tcp_cmd cmd = {
        .type = TCP_CMD_REJECT, .req = (struct tcp_req *)r, .pd = pd, .pdlen = pdlen};

    if (!r || pdlen > TCP_WIRE_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    return exs__tcp_ctx_call(((struct tcp_listener *)r->listener)->ctx, &cmd);
}

int exs__tcp_disconnect(struct exs_prov_ep *e)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct tcp_cmd cmd = {.type = TCP_CMD_DISCONNECT, .ep = ep};

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
        exs__tcp_conn_fail(conn, 0, 0, 0, TCP_END_DISCONNECT);
        return 0;
    }
    /* still connecting: give up */
    exs__tcp_conn_close(conn);
    exs__tcp_ep_fail(ep, 0, TCP_FAIL_DISCONNECTED);
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
    case TCP_CMD_DISCONNECT:
        ret = tcp_disconnect_nic(cmd->ep);
        break;
    case TCP_CMD_EP_DESTROY:
        tcp_ep_destroy_nic(ctx, cmd->ep);
        break;
    case TCP_CMD_REJECT:
    case TCP_CMD_LISTEN:
    case TCP_CMD_LISTENER_DESTROY:
    case TCP_CMD_LISTENER_PAUSE:
        ret = exs__tcp_lis_cmd(ctx, cmd);
        break;
    }
    cmd->ret = ret;
}
