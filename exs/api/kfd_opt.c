/* SPDX-License-Identifier: MIT */
/* Kernel sockets: SO_ASYNC_*_TIMEOUT notices, the options exs_setsockopt / exs_getsockopt
 * take, and the check of what a descriptor is. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/api/kfd_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* ---- SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT notices ----
 *
 * As on exs sockets (poll.c, spec/api.md section 9.1): an asynchronous send or receive
 * posted while k has a timeout for its direction is registered in k->to_ops with its
 * next due time and one reserved slot for its first notice. One engine timer per kfd
 * (to_timer, armed by to_job or by itself on the progress thread, holding a reference
 * while on) posts the notices under k->lock; an operation leaves k->to_ops under the same
 * lock before its event is posted, so no notice follows its operation's event. */

static void kfd_to_job_fn(struct exs_job *job);

/* Queue to_job, which re-arms the timer (k->lock held). */
static void kfd_to_kick_locked(struct kfd *k)
{
    if (k->to_job_busy)
        return;
    k->to_job_busy = 1;
    exs__api_kfd_ref(k); /* the job's */
    k->to_job.fn = kfd_to_job_fn;
    exs__engine_post(&k->to_job);
}

/* An asynchronous send or receive is posted (k->lock held): register it for notices when
 * k has a timeout for its direction. 0, or EAGAIN when its queue cannot take the first
 * notice's slot too. */
int exs__api_kfd_to_start_locked(struct kfd *k, struct kfd_op *op)
{
    int v = op->type == EXS_EVT_RECV ? k->rcv_timeo : k->snd_timeo;
    int ret;

    if (!v)
        return 0;
    ret = exs__evq_reserve(op->evq);
    if (ret)
        return ret == -EAGAIN ? EAGAIN : -ret;
    exs__api_to_begin(&op->to, v);
    op->to.on = 1;
    exs_list_add_tail(&k->to_ops, &op->to.link);
    kfd_to_kick_locked(k);
    return 0;
}

/* op ends or is dropped (k->lock held): unregistered, its unused notice slot returned. */
void exs__api_kfd_to_end_locked(struct kfd *k, struct kfd_op *op)
{
    if (exs__api_to_unlist(&op->to, &k->to_ops))
        kfd_to_kick_locked(k); /* the timer stops */
    if (op->to.slot) {
        op->to.slot = 0;
        exs__evq_unreserve(op->evq);
    }
}

static void kfd_to_timer_cb(struct exs_eng_timer *t);

/* Progress thread: arm the timer for the earliest notice due, or stop it (its reference
 * goes with it; this may free k). */
static void kfd_to_arm(struct kfd *k)
{
    uint64_t next;

    exs__api_kfd_lock(k);
    next = exs__api_to_earliest(&k->to_ops);
    exs__api_kfd_unlock(k);
    switch (exs__api_to_timer_set(&k->to_timer, &k->to_timer_on, next, kfd_to_timer_cb)) {
    case 1:
        exs__api_kfd_ref(k); /* the timer's */
        break;
    case -1:
        exs__api_kfd_put(k);
        break;
    default:
        break;
    }
}

static void kfd_to_job_fn(struct exs_job *job)
{
    struct kfd *k = exs_container_of(job, struct kfd, to_job);

    exs__api_kfd_lock(k);
    k->to_job_busy = 0;
    exs__api_kfd_unlock(k);
    exs__api_kfd_ref(k); /* kfd_to_arm may drop the timer's */
    kfd_to_arm(k);
    exs__api_kfd_put(k);
    exs__api_kfd_put(k); /* the job's */
}

/* Progress thread: post the notices due (a queue with no free slot defers one by an
 * interval: nothing is queued beyond its depth). */
static void kfd_to_timer_cb(struct exs_eng_timer *t)
{
    struct kfd *k = exs_container_of(t, struct kfd, to_timer);
    struct exs_list *pos, *next;
    uint64_t now = exs__now_ns();

    exs__api_kfd_lock(k);
    for (pos = k->to_ops.next; pos != &k->to_ops; pos = next) {
        struct kfd_op *op = exs_list_entry(pos, struct kfd_op, to.link);
        exs_event_t ev = {.exs_evt_fd = k->fd, .exs_evt_ahandle = op->ah};

        next = pos->next;
        if (!exs__api_to_due(&op->to, op->evq, now, &ev))
            continue;
        ev.exs_evt_type = op->type == EXS_EVT_RECV ? EXS_EVT_RECVTIMEOUT : EXS_EVT_SENDTIMEOUT;
        ev.exs_evt_u.exs_evt_timeout.exs_evt_buf = op->buf;
        ev.exs_evt_u.exs_evt_timeout.exs_evt_len = op->len;
        EXS_DBG(API, "kfd %d: timeout notice %u of ah %p", k->fd, op->to.count, op->ah);
        exs__evq_post(op->evq, &ev);
    }
    exs__api_kfd_unlock(k);
    /* it fired, so it is off: re-armed, or its reference dropped */
    k->to_timer_on = 0;
    exs__api_kfd_ref(k);
    kfd_to_arm(k);
    exs__api_kfd_put(k); /* what was the timer's, unless re-armed: it then took its own */
    exs__api_kfd_put(k);
}

/* SO_ASYNC_*_TIMEOUT as exs_setsockopt takes it (int ms | EXS_TIMEOUT_ONCE, or a struct
 * timeval rounded up to whole ms): 0 with *v_p, or EINVAL. */
static int kfd_timeo_parse(const void *optval, socklen_t optlen, int *v_p)
{
    int v;

    if (!optval)
        return EINVAL;
    if (optlen == sizeof(struct timeval)) {
        struct timeval tv;
        uint64_t ms;

        memcpy(&tv, optval, sizeof(tv));
        if (tv.tv_sec < 0 || tv.tv_sec > EXS_TIMEOUT_MS_MAX / 1000 || tv.tv_usec < 0 ||
            tv.tv_usec >= 1000000)
            return EINVAL;
        ms = (uint64_t)tv.tv_sec * 1000u + ((uint64_t)tv.tv_usec + 999u) / 1000u;
        if (ms > EXS_TIMEOUT_MS_MAX)
            return EINVAL;
        *v_p = (int)ms;
        return 0;
    }
    if (optlen != sizeof(int))
        return EINVAL;
    memcpy(&v, optval, sizeof(v));
    if (v < 0 || (v & ~(EXS_TIMEOUT_ONCE | EXS_TIMEOUT_MS_MAX)) || (v && !(v & EXS_TIMEOUT_MS_MAX)))
        return EINVAL;
    *v_p = v;
    return 0;
}

static int kfd_opt_is_timeo(int level, int optname)
{
    return (level == SOL_SOCKET || level == SOL_EXS) &&
           (optname == SO_ASYNC_SEND_TIMEOUT || optname == SO_ASYNC_RECV_TIMEOUT);
}

static int kfd_opt_is_ordered(int level, int optname)
{
    return (level == SOL_SOCKET || level == SOL_EXS) && optname == SO_ASYNC_RECV_ORDERED;
}

int exs__api_kfd_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen)
{
    struct kfd *k;
    int err, v = 0;

    if ((err = exs__api_kfd_check(fd)))
        return exs__err(err);
    if (kfd_opt_is_ordered(level, optname)) {
        /* receive events always come in posting order (section 9) */
        if (!optval || optlen != sizeof(int))
            return exs__err(EINVAL);
        memcpy(&v, optval, sizeof(v));
        return v == 0 || v == 1 ? 0 : exs__err(EINVAL);
    }
    if (!kfd_opt_is_timeo(level, optname))
        return exs__err(optval && optlen == sizeof(int) ? ENOPROTOOPT : EINVAL);
    if ((err = kfd_timeo_parse(optval, optlen, &v)))
        return exs__err(err);
    k = exs__api_kfd_get_locked(fd, &err);
    if (!k)
        return exs__err(err);
    if ((err = exs__api_kfd_verify_locked(k))) {
        /* the socket they are for (its device and inode) */
        exs__api_kfd_unlock(k);
        exs__api_kfd_put(k);
        return exs__err(err);
    }
    if (optname == SO_ASYNC_SEND_TIMEOUT)
        k->snd_timeo = v;
    else
        k->rcv_timeo = v;
    /* nothing pending and nothing set: no state is kept */
    exs__api_kfd_idle_locked(k);
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
    return 0;
}

int exs__api_kfd_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
{
    struct kfd *k;
    int err, v = 0;

    if ((err = exs__api_kfd_check(fd)))
        return exs__err(err);
    if (!optval || !optlen || *optlen < sizeof(int))
        return exs__err(EINVAL);
    if (kfd_opt_is_ordered(level, optname)) {
        v = 1;
    } else if (kfd_opt_is_timeo(level, optname)) {
        k = exs__api_kfd_get_locked2(fd, 0, &err);
        if (k) {
            v = optname == SO_ASYNC_SEND_TIMEOUT ? k->snd_timeo : k->rcv_timeo;
            exs__api_kfd_unlock(k);
            exs__api_kfd_put(k);
        }
        if (*optlen >= sizeof(struct timeval)) {
            struct timeval tv = {.tv_sec = (v & EXS_TIMEOUT_MS_MAX) / 1000,
                                 .tv_usec = (v & EXS_TIMEOUT_MS_MAX) % 1000 * 1000};

            memcpy(optval, &tv, sizeof(tv));
            *optlen = sizeof(tv);
            return 0;
        }
    } else {
        return exs__err(ENOPROTOOPT);
    }
    memcpy(optval, &v, sizeof(v));
    *optlen = sizeof(int);
    return 0;
}

/* ---- what the descriptor is (kfd.c's opening comment) ---- */

/* Check what k's number names now (fstat; another device or inode, or the first check:
 * SO_TYPE too): 0 when a kernel stream socket (another one than before
 * starts with none of the old one's state), else the errno a call gets (EBADF, ENOTSOCK,
 * ...; k->known is then 0). */
int exs__api_kfd_verify_locked(struct kfd *k)
{
    int type = 0;
    socklen_t len = sizeof(type);
    struct stat st;

    if (fstat(k->fd, &st)) {
        k->known = 0;
        return errno;
    }
    if (k->known && st.st_dev == k->dev && st.st_ino == k->ino)
        return 0;
    if (k->known || exs__api_kfd_has_opts(k))
        EXS_DBG(API, "kfd %d: another file now: no state of the old one is kept", k->fd);
    k->known = 0;
    k->err = 0;
    k->snd_timeo = k->rcv_timeo = 0;
    if (!S_ISSOCK(st.st_mode))
        return ENOTSOCK;
    if (getsockopt(k->fd, SOL_SOCKET, SO_TYPE, &type, &len))
        return errno;
    if (type != SOCK_STREAM)
        return ENOTSOCK;
    k->dev = st.st_dev;
    k->ino = st.st_ino;
    k->known = 1;
    return 0;
}
