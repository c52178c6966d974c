/* SPDX-License-Identifier: MIT */
/* The shm provider's addresses and listeners: ports as abstract unix socket names, which
 * addresses are this host's, accepting rendezvous sockets. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- addresses ---- */

/* The abstract unix name of a listener on port (one namespace per network namespace). */
socklen_t exs__shm_unix_name(struct sockaddr_un *un, unsigned port)
{
    int n;

    memset(un, 0, sizeof(*un));
    un->sun_family = AF_UNIX;
    n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "exs-shm.%u", port);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int exs__shm_addr_port(const struct sockaddr *sa, socklen_t len, unsigned *port_p)
{
    if (!sa)
        return -EINVAL;
    if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
        *port_p = ntohs(((const struct sockaddr_in *)sa)->sin_port);
    else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
        *port_p = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    else
        return -EAFNOSUPPORT;
    return 0;
}

/* 1 when addr is this host's: a wildcard, loopback, or an address of one of its interfaces. */
int exs__shm_addr_local(const struct sockaddr *sa)
{
    struct ifaddrs *ifa, *i;
    int found = 0;

    if (sa->sa_family == AF_INET) {
        uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);

        if (a == INADDR_ANY || (a >> 24) == 127)
            return 1;
    } else {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

        if (IN6_IS_ADDR_UNSPECIFIED(a) || IN6_IS_ADDR_LOOPBACK(a) ||
            (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127))
            return 1;
    }
    if (getifaddrs(&ifa) < 0)
        return 0;
    for (i = ifa; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family)
            continue;
        if (sa->sa_family == AF_INET)
            found = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
        else
            found = !memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                            &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
    freeifaddrs(ifa);
    return found;
}

void exs__shm_loopback(struct sockaddr_storage *ss, socklen_t *len, int family, unsigned port)
{
    memset(ss, 0, sizeof(*ss));
    if (family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

        s6->sin6_family = AF_INET6;
        s6->sin6_addr = in6addr_loopback;
        s6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

        s4->sin_family = AF_INET;
        s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        s4->sin_port = htons((uint16_t)port);
        *len = sizeof(*s4);
    }
}

/* ---- listeners ---- */

int exs__shm_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    struct shm_listener *lis;
    struct sockaddr_un un;
    unsigned port, tries;
    int fd, ret;

    ret = exs__shm_addr_port(addr, addrlen, &port);
    if (ret)
        return ret;
    if (!exs__shm_addr_local(addr))
        return -EADDRNOTAVAIL;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    for (tries = 0;; tries++) {
        unsigned p = port;

        if (!port) {
            uint32_t r = 0;

            if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
                r = (uint32_t)exs__now_ns();
            p = SHM_PORT_LO + r % (SHM_PORT_HI - SHM_PORT_LO + 1);
        }
        if (bind(fd, (struct sockaddr *)&un, exs__shm_unix_name(&un, p)) == 0) {
            port = p;
            break;
        }
        ret = -errno;
        if (port || ret != -EADDRINUSE || tries > 64) {
            exs__nc_close(fd);
            return ret;
        }
    }
    if (listen(fd, EXS_MAX(backlog, 4096)) < 0) {
        ret = -errno;
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
    memcpy(&lis->addr, addr, EXS_MIN((size_t)addrlen, sizeof(lis->addr)));
    lis->addrlen =
        addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    if (addr->sa_family == AF_INET)
        ((struct sockaddr_in *)&lis->addr)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)&lis->addr)->sin6_port = htons((uint16_t)port);
    exs_list_init(&lis->reqs);
    exs__shm_nic_lock(ctx);
    ret = exs__shm_epoll_add(ctx, fd, lis, SHM_TAG_LIS);
    if (!ret)
        exs_list_add_tail(&ctx->listeners, &lis->link);
    exs__shm_nic_unlock(ctx);
    if (ret) {
        exs__nc_close(fd);
        free(lis);
        return ret;
    }
    *lis_p = &lis->base;
    return 0;
}

int exs__shm_listener_addr(struct exs_prov_listener *l, struct sockaddr_storage *addr,
                           socklen_t *addrlen)
{
    struct shm_listener *lis = (struct shm_listener *)l;

    *addr = lis->addr;
    *addrlen = lis->addrlen;
    return 0;
}

/* ---- the rendezvous deadline: an accepted socket until its REQ ---- */

/* How long an accepted socket has for its REQ: EXS_TCP_HELLO_MS, as the tcp provider's
 * hello (read at each accept). */
static uint64_t shm_hello_ns(void)
{
    return __atomic_load_n(&exs__params.tcp_hello_ms, __ATOMIC_RELAXED) * 1000000u;
}

int exs__shm_conn_hello_late(struct shm_conn *conn, uint64_t now)
{
    struct shm_ctx *ctx = conn->ctx;

    if (now < conn->hello_at) {
        exs__shm_timer_set(ctx, conn->hello_at); /* the timer may have fired for another */
        return 0;
    }
    /* a REQ that came in time but was not read yet (a ring-only turn) is not late */
    exs__shm_conn_readable(conn, 0);
    if (conn->state != SHM_CONN_WAIT_REQ)
        return 1;
    EXS_CNT_INC(ctx->cnt.hello_refused);
    EXS_CNT_INC(ctx->cnt.bogus_conns);
    EXS_DBG(PROV, "shm listener %p: pid %d sent no request by the deadline; closed",
            (void *)conn->lis, (int)conn->pid);
    exs__shm_conn_detach(conn);
    return 1;
}

void exs__shm_listener_ready(struct shm_listener *lis)
{
    struct shm_ctx *ctx = lis->ctx;

    for (int i = 0; i < 64 && !lis->paused; i++) {
        int fd = exs__nc_accept4(lis->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct shm_conn *conn;

        if (fd < 0)
            return;
        conn = exs__shm_conn_new(ctx, fd, 1);
        if (!conn) {
            exs__nc_close(fd);
            return;
        }
        conn->state = SHM_CONN_WAIT_REQ;
        conn->lis = lis;
        conn->hello_at = exs__now_ns() + shm_hello_ns();
        exs__shm_timer_set(ctx, conn->hello_at);
        if (exs__shm_conn_peer(conn) < 0 || exs__shm_epoll_add(ctx, fd, conn, SHM_TAG_CONN) < 0) {
            EXS_CNT_INC(ctx->cnt.bogus_conns);
            exs__shm_conn_detach(conn);
        }
    }
}

void exs__shm_listener_destroy(struct exs_prov_listener *l)
{
    struct shm_listener *lis = (struct shm_listener *)l;
    struct shm_ctx *ctx = lis->ctx;
    struct exs_list *pos, *tmp;

    exs__shm_nic_lock(ctx);
    exs__shm_epoll_del(ctx, lis->fd);
    exs__nc_close(lis->fd);
    exs_list_for_each_safe(pos, tmp, &ctx->conns)
    {
        struct shm_conn *conn = exs_list_entry(pos, struct shm_conn, link);

        if (conn->lis != lis)
            continue;
        if (conn->req) {
            if (!conn->broken && conn->fd >= 0)
                (void)exs__shm_hs_send(conn->fd, SHM_HS_REJECT, 0, ctx, NULL, NULL, 0, NULL, 0, 0,
                                       0);
            exs__shm_req_free(conn);
        }
        conn->lis = NULL;
        exs__shm_conn_detach(conn);
    }
    /* the listener's CONNECT_REQUEST events not yet polled */
    exs__lite_lock(&ctx->lock);
    exs__soft_cm_drop_locked(&ctx->cm_events, NULL, l);
    exs__lite_unlock(&ctx->lock);
    exs_list_del(&lis->link);
    exs__shm_nic_unlock(ctx);
    free(lis);
}

int exs__shm_listener_pause(struct exs_prov_listener *l, int pause)
{
    struct shm_listener *lis = (struct shm_listener *)l;
    struct shm_ctx *ctx = lis->ctx;

    exs__shm_nic_lock(ctx);
    if (pause && !lis->paused)
        exs__shm_epoll_del(ctx, lis->fd);
    else if (!pause && lis->paused)
        (void)exs__shm_epoll_add(ctx, lis->fd, lis, SHM_TAG_LIS);
    lis->paused = !!pause;
    if (!pause)
        exs__shm_listener_ready(lis);
    exs__shm_nic_unlock(ctx);
    return 0;
}
