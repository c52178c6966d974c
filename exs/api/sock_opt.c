/* SPDX-License-Identifier: MIT */
/* ES-API sockets: names (exs_getsockname, exs_getpeername) and options (exs_setsockopt,
 * exs_getsockopt). */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/api/sock_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* ---- names and options ---- */

static int sock_name(int fd, struct sockaddr *addr, socklen_t *addrlen, int peer)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    if (!s)
        return exs__err(err);
    if (!addr || !addrlen) {
        err = EINVAL;
    } else {
        api_sock_lock(s);
        const struct sockaddr_storage *a = peer ? &s->peer : &s->local;
        socklen_t len = peer ? s->peer_len : s->local_len;

        if (peer && s->state != API_SOCK_CONNECTED)
            err = ENOTCONN;
        else {
            memcpy(addr, a, EXS_MIN(*addrlen, len));
            *addrlen = len;
        }
        api_sock_unlock(s);
    }
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}

int exs_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
    return sock_name(fd, addr, addrlen, 0);
}

int exs_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
    return sock_name(fd, addr, addrlen, 1);
}

/* SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT, at either level. */
static int sock_opt_is_timeo(int level, int optname)
{
    return (level == SOL_SOCKET || level == SOL_EXS) &&
           (optname == SO_ASYNC_SEND_TIMEOUT || optname == SO_ASYNC_RECV_TIMEOUT);
}

int exs_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen)
{
    int err = 0, v;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    if (!s)
        return err == ENOTSOCK ? exs__api_kfd_setsockopt(fd, level, optname, optval, optlen)
                               : exs__err(err);
    if (optval && optlen == sizeof(struct timeval) && sock_opt_is_timeo(level, optname)) {
        /* SO_ASYNC_*_TIMEOUT as a struct timeval: whole milliseconds, rounded up */
        struct timeval tv;
        uint64_t ms;

        memcpy(&tv, optval, sizeof(tv));
        if (tv.tv_sec < 0 || tv.tv_sec > EXS_TIMEOUT_MS_MAX / 1000 || tv.tv_usec < 0 ||
            tv.tv_usec >= 1000000) {
            err = EINVAL;
            goto out;
        }
        ms = (uint64_t)tv.tv_sec * 1000u + ((uint64_t)tv.tv_usec + 999u) / 1000u;
        if (ms > EXS_TIMEOUT_MS_MAX) {
            err = EINVAL;
            goto out;
        }
        v = (int)ms;
        optval = &v;
        optlen = sizeof(v);
    }
    if (level == SOL_SOCKET && optname == SO_LINGER) { /* exit.c */
        api_sock_lock(s);
        err = exs__api_linger_set(s, optval, optlen);
        api_sock_unlock(s);
        goto out;
    }
    if (!optval || optlen != sizeof(int)) {
        err = EINVAL;
        goto out;
    }
    memcpy(&v, optval, sizeof(v));
    api_sock_lock(s);
    if (sock_opt_is_timeo(level, optname)) {
        /* 0: off; else 1 .. EXS_TIMEOUT_MS_MAX ms, with EXS_TIMEOUT_ONCE or not; applies
         * to asynchronous operations posted afterwards */
        if (v < 0 || (v & ~(EXS_TIMEOUT_ONCE | EXS_TIMEOUT_MS_MAX)) ||
            (v && !(v & EXS_TIMEOUT_MS_MAX)))
            err = EINVAL;
        else /* read by posts without the lock (xfer.c) */
            __atomic_store_n(optname == SO_ASYNC_SEND_TIMEOUT ? &s->snd_timeo : &s->rcv_timeo, v,
                             __ATOMIC_RELAXED);
    } else if ((level == SOL_SOCKET || level == SOL_EXS) && optname == SO_ASYNC_RECV_ORDERED) {
        /* receive events always come in posting order (spec/api.md section 9): 1 is the only
         * behaviour, 0 is accepted (unordered delivery allows this order too) */
        if (v != 0 && v != 1)
            err = EINVAL;
    } else if (level == SOL_SOCKET && optname == SO_RCVBUF) {
        if (v < (int)EXS_RING_SLOT * 16 || (uint32_t)v > EXS_WIRE_RING_SIZE_MAX ||
            s->state > API_SOCK_BOUND)
            err = EINVAL;
        else {
            s->rcvbuf = ((uint32_t)v + EXS_RING_SLOT - 1) / EXS_RING_SLOT * EXS_RING_SLOT;
            s->rcvbuf_set = 1;
        }
    } else if (level == SOL_SOCKET && optname == SO_SNDBUF) {
        /* 0: every STREAM send zero-copy; else the send buffer (protocol §7.5) */
        if (v < 0 || (v && v < (int)EXS_SNDBUF_MIN) || (uint32_t)v > EXS_SNDBUF_MAX ||
            s->state > API_SOCK_BOUND)
            err = EINVAL;
        else
            s->sndbuf = ((uint32_t)v + EXS_RING_SLOT - 1) / EXS_RING_SLOT * EXS_RING_SLOT;
    } else if (level == SOL_SOCKET && optname == SO_KEEPALIVE) {
        s->keepalive = !!v;
    } else if (level == SOL_EXS && optname == EXS_SO_KEEPALIVE_MS) {
        if (v <= 0)
            err = EINVAL;
        else
            s->keepalive_ms = v;
    } else if (level == SOL_EXS && optname == EXS_SO_XFER_MODE) {
        if (v < EXS_XFER_DYNAMIC || v > EXS_XFER_INDIRECT_ONLY || s->state > API_SOCK_LISTENING)
            err = EINVAL;
        else
            s->xfer_mode = v;
    } else {
        err = ENOPROTOOPT;
    }
    api_sock_unlock(s);
out:
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}

int exs_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
{
    int err = 0, v = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    if (!s)
        return err == ENOTSOCK ? exs__api_kfd_getsockopt(fd, level, optname, optval, optlen)
                               : exs__err(err);
    if (!optval || !optlen) {
        err = EINVAL;
        goto out;
    }
    if (level == SOL_EXS && optname == EXS_SO_STATS) {
        struct exs_sock_stats st = {0};
        socklen_t n = EXS_MIN(*optlen, (socklen_t)sizeof(st));

        /* The struct only grows at its end: a caller built against an older header
         * passes a shorter length and gets the prefix it knows (at least the ten
         * counters of the first version). */
        if (*optlen < EXS_SOCK_STATS_V1_SIZE) {
            err = EINVAL;
            goto out;
        }
        /* the conn lives as long as the socket (our reference); its lock is taken
         * without the socket's (conn locks come first) */
        api_sock_lock(s);
        struct exs_conn *conn = s->conn;
        api_sock_unlock(s);
        if (conn)
            exs__conn_stats(conn, &st);
        memcpy(optval, &st, n);
        *optlen = n;
        goto out;
    }
    if (level == SOL_EXS && (optname == EXS_SO_ERROR_REASON || optname == EXS_SO_PATH)) {
        char why[EXS_ERROR_REASON_MAX > EXS_PATH_MAX ? EXS_ERROR_REASON_MAX : EXS_PATH_MAX] = "";

        api_sock_lock(s); /* the conn as for EXS_SO_STATS */
        struct exs_conn *conn = s->conn;
        api_sock_unlock(s);
        if (*optlen < 1 || (optname == EXS_SO_PATH && !conn)) {
            err = *optlen < 1 ? EINVAL : ENOTCONN;
            goto out;
        }
        if (conn && optname == EXS_SO_PATH)
            exs__conn_path(conn, why, EXS_PATH_MAX);
        else if (conn)
            exs__pv_reason(conn, why, sizeof(why));
        *optlen = EXS_MIN(*optlen, (socklen_t)strlen(why) + 1);
        memcpy(optval, why, *optlen - 1);
        ((char *)optval)[*optlen - 1] = '\0';
        goto out;
    }
    if (level == SOL_SOCKET && optname == SO_LINGER) { /* exit.c */
        api_sock_lock(s);
        err = exs__api_linger_get(s, optval, optlen);
        api_sock_unlock(s);
        goto out;
    }
    api_sock_lock(s);
    if (sock_opt_is_timeo(level, optname)) {
        v = optname == SO_ASYNC_SEND_TIMEOUT ? s->snd_timeo : s->rcv_timeo;
        if (*optlen >= sizeof(struct timeval)) {
            /* the struct timeval form (EXS_TIMEOUT_ONCE is not part of it) */
            struct timeval tv = {.tv_sec = (v & EXS_TIMEOUT_MS_MAX) / 1000,
                                 .tv_usec = (v & EXS_TIMEOUT_MS_MAX) % 1000 * 1000};

            api_sock_unlock(s);
            memcpy(optval, &tv, sizeof(tv));
            *optlen = sizeof(tv);
            goto out;
        }
    } else if ((level == SOL_SOCKET || level == SOL_EXS) && optname == SO_ASYNC_RECV_ORDERED) {
        v = 1;
    } else if (level == SOL_SOCKET && optname == SO_RCVBUF)
        v = (int)s->rcvbuf;
    else if (level == SOL_SOCKET && optname == SO_SNDBUF)
        v = (int)s->sndbuf;
    else if (level == SOL_SOCKET && optname == SO_KEEPALIVE)
        v = s->keepalive;
    else if (level == SOL_SOCKET && optname == SO_TYPE)
        v = s->type;
    else if (level == SOL_SOCKET && optname == SO_ERROR)
        v = 0;
    else if (level == SOL_EXS && optname == EXS_SO_KEEPALIVE_MS)
        v = s->keepalive_ms;
    else if (level == SOL_EXS && optname == EXS_SO_XFER_MODE)
        v = s->xfer_mode;
    else
        err = ENOPROTOOPT;
    api_sock_unlock(s);
    if (!err) {
        if (*optlen < sizeof(int)) {
            err = EINVAL;
        } else {
            memcpy(optval, &v, sizeof(v));
            *optlen = sizeof(int);
        }
    }
out:
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}