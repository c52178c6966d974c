/* SPDX-License-Identifier: MIT */
/* Asynchronous exs_send/exs_recv/exs_shutdown/exs_close/exs_cancel on the application's kernel
 * stream sockets. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/*
 * A struct kfd exists for a descriptor number only while operations are pending on it
 * (spec/api.md, "Kernel sockets"): the application may close the descriptor after its
 * last event without exs_close, and the number may then name another socket. So the
 * kfd leaves the table (is "detached") before its last event is posted; a later call on
 * the number makes a new one. Two exceptions: an exs_sendfile writing with sendfile(2)
 * (file_busy) keeps it, and SO_ASYNC_*_TIMEOUT values (spec/api.md section 9.1) keep it
 * between operations, together with the socket's identity (fstat device and inode): a
 * call that finds the number naming another socket drops it first (kfd_stale_locked). The descriptor's file status flags are never touched:
 * every send and recv is made with MSG_DONTWAIT (and MSG_NOSIGNAL: a reset peer gives
 * EPIPE, not SIGPIPE).
 *
 * Who moves bytes: the posting thread tries at once (the new operation is at the head of
 * its queue); what the kernel cannot take or give now waits for readiness. The
 * descriptor is then registered (EPOLLOUT while a send waits, EPOLLIN while a receive
 * waits) in the library's own epoll set, kfd_ep, which the progress thread's libev loop
 * watches (one watcher for every kernel socket); its callback runs the queues of the
 * ready descriptors. Nothing blocks: every call is non-blocking, and the registration
 * is level-triggered, so readiness that came between an EAGAIN and the registration is
 * reported at once. Registrations change with epoll_ctl from any thread (no progress
 * lock needed), and the last one is removed (EPOLL_CTL_DEL) before the descriptor's last
 * event is posted: once the application sees it, no part of the library names the
 * descriptor any more (libev itself never sees it).
 *
 * Locks: kfd_tab_lock (level SOCK_TAB) guards the table; k->lock (level SOCK, like a
 * socket's) guards the queues and the registration and is held while the kernel is
 * called and while events are posted, so events leave in the order the operations
 * finish.
 *
 * References (k->refs): the table's while attached, one per thread inside a call or
 * a callback on it. An epoll event names its kfd by descriptor and generation
 * (kfd_ep_cb finds it in the table), never by pointer, so a stale event is ignored.
 */

#define KFD_IOV_MAX 64 /* sends gathered in one sendmsg */

struct kfd_op {
    struct exs_list link; /* in k->sendq or k->recvq */
    int type;             /* EXS_EVT_SEND, RECV, SHUTDOWN or CLOSE */
    int flags;            /* recv: MSG_WAITALL */
    int how;              /* shutdown */
    char *buf;
    size_t len;
    size_t done; /* bytes moved so far */
    size_t pre;  /* exs_sendfile: bytes sendfile(2) moved before buf (added to the result) */
    exs_ahandle_t ah;
    struct exs_evq *evq;       /* slot reserved */
    struct api_mreg *mreg;     /* held busy, or NULL (EXS_MHANDLE_UNREGISTERED) */
    struct api_bounce *bounce; /* exs_sendmsg / exs_recvmsg / exs_sendfile: buf is its */
    /* SO_ASYNC_*_TIMEOUT notices (k->lock): in k->to_ops while to.on */
    struct api_to to;
};

struct kfd {
    int fd;
    int refs;     /* atomic */
    int attached; /* lock (and kfd_tab_lock to change): in the table */
    pthread_mutex_t lock;
    struct exs_list sendq; /* sends and shutdowns, posting order */
    struct exs_list recvq; /* receives, posting order */
    int n_send, n_recv;
    int err;      /* lock: the connection failed (not EPIPE): every pending
                   * operation reports it */
    int io_want;  /* lock: EV_READ / EV_WRITE the queues wait for */
    int io_reg;   /* lock: what is registered in kfd_ep (EV_READ / EV_WRITE) */
    uint32_t gen; /* names this kfd in its epoll events */
    /* SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT (lock): while either is set the kfd
     * stays in the table between operations; dev/ino name the socket they were set on */
    int snd_timeo, rcv_timeo;
    dev_t dev;
    ino_t ino;
    struct exs_list to_ops; /* lock: operations registered for notices */
    int to_job_busy;        /* lock: to_job queued */
    struct exs_job to_job;  /* re-arms to_timer (holds a reference while queued) */
    struct exs_eng_timer to_timer;
    int to_timer_on; /* progress thread: armed (holds a reference) */
    /* lock: a posting thread runs exs_sendfile's sendfile(2) without the lock: sends
     * queued meanwhile wait (not written), an exs_close waits in close_op */
    int file_busy;
    struct kfd_op *close_op;
};

static pthread_mutex_t kfd_tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kfd **kfd_tab;
static int kfd_tab_len;
static int kfd_live;                /* kfds + their operations */
static uint64_t kfd_sendfile_bytes; /* atomic: bytes moved by sendfile(2) */
static uint32_t kfd_gen;            /* kfd_tab_lock */

/* The epoll set of the descriptors that wait, and its libev watcher (made at the first
 * kfd, gone at exs_fini). kfd_ep is written under kfd_tab_lock, read by holders of a
 * kfd (which exists only after kfd_ep does). */
static int kfd_ep = -1;
static struct exs_eng_io kfd_ep_io;
static struct exs_job kfd_ep_start_job, kfd_ep_stop_job;

int exs__debug_kfd_live(void)
{
    return __atomic_load_n(&kfd_live, __ATOMIC_RELAXED);
}

unsigned long long exs__debug_kfd_sendfile_bytes(void)
{
    return __atomic_load_n(&kfd_sendfile_bytes, __ATOMIC_RELAXED);
}

/* ---- objects ---- */

static int kfd_ep_open(void);
static void kfd_reg_locked(struct kfd *k, int events);
static int kfd_has_opts(const struct kfd *k);
static void kfd_to_end_locked(struct kfd *k, struct kfd_op *op);

static void kfd_put(struct kfd *k)
{
    if (__atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL))
        return;
    EXS_ASSERT(!k->attached && !k->io_reg && exs_list_empty(&k->sendq) &&
               exs_list_empty(&k->recvq) && exs_list_empty(&k->to_ops));
    pthread_mutex_destroy(&k->lock);
    free(k);
    __atomic_fetch_sub(&kfd_live, 1, __ATOMIC_RELAXED);
}

static void kfd_ref(struct kfd *k)
{
    __atomic_fetch_add(&k->refs, 1, __ATOMIC_RELAXED);
}

/* 1 when fd is a kernel SOCK_STREAM socket. */
static int kfd_is_stream(int fd)
{
    int type = 0;
    socklen_t len = sizeof(type);

    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

/* The kfd of fd with a reference, made when there is none (create); NULL with -ENOMEM,
 * or (no create) -ENOENT. */
static struct kfd *kfd_get(int fd, int create, int *err_p)
{
    struct kfd *k = NULL;

    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    if (fd < kfd_tab_len && kfd_tab[fd]) {
        k = kfd_tab[fd];
        kfd_ref(k);
        goto out;
    }
    if (!create) {
        *err_p = -ENOENT;
        goto out;
    }
    if (fd >= kfd_tab_len) {
        int n = EXS_MAX(fd + 1, kfd_tab_len * 2);
        struct kfd **t = realloc(kfd_tab, (size_t)n * sizeof(*t));

        if (!t) {
            *err_p = -ENOMEM;
            goto out;
        }
        memset(t + kfd_tab_len, 0, (size_t)(n - kfd_tab_len) * sizeof(*t));
        kfd_tab = t;
        kfd_tab_len = n;
    }
    if (kfd_ep < 0 && kfd_ep_open()) {
        *err_p = -errno;
        goto out;
    }
    k = calloc(1, sizeof(*k));
    if (!k) {
        *err_p = -ENOMEM;
        goto out;
    }
    k->gen = ++kfd_gen;
    k->fd = fd;
    k->refs = 2; /* the table's and the caller's */
    k->attached = 1;
    pthread_mutex_init(&k->lock, NULL);
    exs_list_init(&k->sendq);
    exs_list_init(&k->recvq);
    exs_list_init(&k->to_ops);
    kfd_tab[fd] = k;
    __atomic_fetch_add(&kfd_live, 1, __ATOMIC_RELAXED);
out:
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    return k;
}

/* Take k out of the table and out of kfd_ep (k->lock held; the caller holds a
 * reference, so the table's is never the last here). */
static void kfd_detach_locked(struct kfd *k)
{
    if (!k->attached)
        return;
    kfd_reg_locked(k, 0);
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    EXS_ASSERT(k->fd < kfd_tab_len && kfd_tab[k->fd] == k);
    kfd_tab[k->fd] = NULL;
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    k->attached = 0;
    __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL);
}

static void kfd_lock(struct kfd *k)
{
    EXS_MUTEX_LOCK(&k->lock, EXS_LOCK_SOCK);
}

static void kfd_unlock(struct kfd *k)
{
    EXS_MUTEX_UNLOCK(&k->lock, EXS_LOCK_SOCK);
}

static void kfd_op_free(struct kfd_op *op)
{
    if (op->mreg)
        exs__api_mreg_release(op->mreg);
    if (op->bounce)
        exs__api_bounce_free(op->bounce);
    exs__evq_op_free(op, sizeof(*op));
    __atomic_fetch_sub(&kfd_live, 1, __ATOMIC_RELAXED);
}

/* Finish op (already off its queue; k->lock held): post its event. When k has nothing
 * left it leaves the table first, so the application may close the descriptor as soon
 * as it sees this event. */
static void kfd_op_finish_locked(struct kfd *k, struct kfd_op *op, ssize_t result, int err)
{
    exs_event_t ev = {
        .exs_evt_type = op->type,
        .exs_evt_errno = err,
        .exs_evt_fd = k->fd,
        .exs_evt_ahandle = op->ah,
    };
    struct exs_evq *evq = op->evq;

    kfd_to_end_locked(k, op); /* no notice after this event */
    if (op->type == EXS_EVT_SEND || op->type == EXS_EVT_RECV) {
        ev.exs_evt_u.exs_evt_xfer.exs_evt_buf = op->buf;
        ev.exs_evt_u.exs_evt_xfer.exs_evt_len = op->len;
    }
    if (op->type == EXS_EVT_SEND)
        k->n_send--;
    else if (op->type == EXS_EVT_RECV)
        k->n_recv--;
    if (!err)
        result += (ssize_t)op->pre;
    ev.exs_evt_u.exs_evt_xfer.exs_evt_result = err ? -1 : result;
    if (op->bounce)
        exs__api_bounce_event(op->bounce, err ? -1 : result, 0, &ev);
    if (exs_list_empty(&k->sendq) && exs_list_empty(&k->recvq) && op->type != EXS_EVT_CLOSE &&
        !kfd_has_opts(k) && !k->file_busy)
        kfd_detach_locked(k);
    EXS_DATA(API, "kfd %d: event %d ah %p result %zd errno %d", k->fd, op->type, op->ah,
             (ssize_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result, err);
    /* release first: once the event is visible the application may count objects */
    kfd_op_free(op);
    exs__evq_post(evq, &ev);
}

/* ---- SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT notices ----
 *
 * As on exs sockets (poll.c, spec/api.md section 9.1): an asynchronous send or receive
 * posted while k has a timeout for its direction is registered in k->to_ops with its
 * next due time and one reserved slot for its first notice. One engine timer per kfd
 * (to_timer, armed by to_job or by itself on the progress thread, holding a reference
 * while on) posts the notices under k->lock; an operation leaves k->to_ops under the same
 * lock before its event is posted, so no notice follows its operation's event. */

static void kfd_to_job_fn(struct exs_job *job);

/* 1 when k holds a socket option (it then stays in the table between operations). */
static int kfd_has_opts(const struct kfd *k)
{
    return k->snd_timeo || k->rcv_timeo;
}

/* Queue to_job, which re-arms the timer (k->lock held). */
static void kfd_to_kick_locked(struct kfd *k)
{
    if (k->to_job_busy)
        return;
    k->to_job_busy = 1;
    kfd_ref(k); /* the job's */
    k->to_job.fn = kfd_to_job_fn;
    exs__engine_post(&k->to_job);
}

/* An asynchronous send or receive is posted (k->lock held): register it for notices when
 * k has a timeout for its direction. 0, or EAGAIN when its queue cannot take the first
 * notice's slot too. */
static int kfd_to_start_locked(struct kfd *k, struct kfd_op *op)
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
static void kfd_to_end_locked(struct kfd *k, struct kfd_op *op)
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

    kfd_lock(k);
    next = exs__api_to_earliest(&k->to_ops);
    kfd_unlock(k);
    switch (exs__api_to_timer_set(&k->to_timer, &k->to_timer_on, next, kfd_to_timer_cb)) {
    case 1:
        kfd_ref(k); /* the timer's */
        break;
    case -1:
        kfd_put(k);
        break;
    default:
        break;
    }
}

static void kfd_to_job_fn(struct exs_job *job)
{
    struct kfd *k = exs_container_of(job, struct kfd, to_job);

    kfd_lock(k);
    k->to_job_busy = 0;
    kfd_unlock(k);
    kfd_ref(k); /* kfd_to_arm may drop the timer's */
    kfd_to_arm(k);
    kfd_put(k);
    kfd_put(k); /* the job's */
}

/* Progress thread: post the notices due (a queue with no free slot defers one by an
 * interval: nothing is queued beyond its depth). */
static void kfd_to_timer_cb(struct exs_eng_timer *t)
{
    struct kfd *k = exs_container_of(t, struct kfd, to_timer);
    struct exs_list *pos, *next;
    uint64_t now = exs__now_ns();

    kfd_lock(k);
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
    kfd_unlock(k);
    /* it fired, so it is off: re-armed, or its reference dropped */
    k->to_timer_on = 0;
    kfd_ref(k);
    kfd_to_arm(k);
    kfd_put(k); /* what was the timer's, unless re-armed: it then took its own */
    kfd_put(k);
}

/* Drop op without an event (exs_fini). */
static void kfd_op_drop(struct kfd_op *op)
{
    exs__evq_unreserve(op->evq);
    kfd_op_free(op);
}

/* ---- moving bytes (k->lock held) ---- */

/* An operation failed with err. The kernel reports a connection error (ECONNRESET,
 * ETIMEDOUT, ...) to one call only and then says EPIPE or end of stream; so it is
 * latched and every pending operation, in both directions, reports it. EPIPE (our own
 * SHUT_WR, or after such an error) only ends the sends. */
static void kfd_fail_locked(struct kfd *k, int err)
{
    struct exs_list *n;

    if (err != EPIPE)
        k->err = err;
    while ((n = exs_list_pop_head(&k->sendq)))
        kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, err);
    if (err == EPIPE)
        return;
    while ((n = exs_list_pop_head(&k->recvq)))
        kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, err);
}

/* Write what the kernel takes of the queued sends, in order, several per sendmsg;
 * run shutdowns when they reach the head. EAGAIN: wait for EV_WRITE. */
static void kfd_send_run_locked(struct kfd *k)
{
    struct exs_list *pos;

    if (k->file_busy)
        return; /* an exs_sendfile is writing: its poster runs the queue after it */
    while (!exs_list_empty(&k->sendq)) {
        struct kfd_op *op = exs_list_entry(k->sendq.next, struct kfd_op, link);
        struct iovec iov[KFD_IOV_MAX];
        struct msghdr mh = {.msg_iov = iov};
        ssize_t n;
        int r;

        if (op->type == EXS_EVT_SHUTDOWN) {
            /* every send before it is on the wire */
            r = shutdown(k->fd, op->how);
            exs_list_del(&op->link);
            kfd_op_finish_locked(k, op, 0, r ? errno : 0);
            continue;
        }
        mh.msg_iovlen = 0;
        for (pos = k->sendq.next; pos != &k->sendq && mh.msg_iovlen < KFD_IOV_MAX;
             pos = pos->next) {
            struct kfd_op *o = exs_list_entry(pos, struct kfd_op, link);

            if (o->type != EXS_EVT_SEND)
                break;
            iov[mh.msg_iovlen].iov_base = o->buf + o->done;
            iov[mh.msg_iovlen].iov_len = o->len - o->done;
            mh.msg_iovlen++;
        }
        do
            n = sendmsg(k->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            k->io_want |= EV_WRITE;
            return;
        }
        if (n < 0) {
            int err = errno;

            EXS_DBG(API, "kfd %d: sendmsg: %s", k->fd, strerror(err));
            kfd_fail_locked(k, err);
            continue;
        }
        /* n bytes left, the head's rest first */
        while (!exs_list_empty(&k->sendq)) {
            struct kfd_op *o = exs_list_entry(k->sendq.next, struct kfd_op, link);
            size_t take;

            if (o->type != EXS_EVT_SEND)
                break;
            take = EXS_MIN((size_t)n, o->len - o->done);
            o->done += take;
            n -= (ssize_t)take;
            if (o->done < o->len)
                break;
            exs_list_del(&o->link);
            kfd_op_finish_locked(k, o, (ssize_t)o->len, 0);
        }
    }
    k->io_want &= ~EV_WRITE;
}

/* Read into the queued receives, in order. EAGAIN: wait for EV_READ. */
static void kfd_recv_run_locked(struct kfd *k)
{
    while (!exs_list_empty(&k->recvq)) {
        struct kfd_op *op = exs_list_entry(k->recvq.next, struct kfd_op, link);
        ssize_t n;

        if (k->err) {
            kfd_fail_locked(k, k->err);
            return;
        }
        do
            n = recv(k->fd, op->buf + op->done, op->len - op->done, MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            k->io_want |= EV_READ;
            return;
        }
        if (n > 0) {
            op->done += (size_t)n;
            if ((op->flags & MSG_WAITALL) && op->done < op->len)
                continue;
        }
        if (n < 0) {
            int err = errno;

            EXS_DBG(API, "kfd %d: recv: %s", k->fd, strerror(err));
            if (!op->done) {
                kfd_fail_locked(k, err);
                continue;
            }
            /* part of a MSG_WAITALL receive came first: it reports its bytes, the
             * operations after it the error */
            k->err = err;
        }
        /* data, or the end of the stream (0, and 0 for each later receive) */
        exs_list_del(&op->link);
        kfd_op_finish_locked(k, op, (ssize_t)op->done, 0);
    }
    k->io_want &= ~EV_READ;
}

static void kfd_run_locked(struct kfd *k)
{
    if (k->err) {
        kfd_fail_locked(k, k->err);
        return;
    }
    kfd_send_run_locked(k);
    kfd_recv_run_locked(k);
}

/* ---- readiness: the kfd_ep epoll set ---- */

static void kfd_ep_cb(struct exs_eng_io *io, int revents);

/* Progress thread: watch kfd_ep (queued once kfd_ep exists). */
static void kfd_ep_start(struct exs_job *job)
{
    (void)job;
    exs__engine_io_start(&kfd_ep_io, kfd_ep, EV_READ, kfd_ep_cb);
}

/* Progress thread (also at exs_fini, when the engine stops): forget kfd_ep. */
static void kfd_ep_stop(struct exs_job *job)
{
    (void)job;
    exs__engine_io_stop(&kfd_ep_io);
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    close(kfd_ep);
    kfd_ep = -1;
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
}

/* Make kfd_ep (kfd_tab_lock held). -1 with errno. */
static int kfd_ep_open(void)
{
    kfd_ep = epoll_create1(EPOLL_CLOEXEC);
    if (kfd_ep < 0) {
        EXS_WARN(API, "kfd: epoll_create1: %m");
        return -1;
    }
    kfd_ep_start_job.fn = kfd_ep_start;
    exs__engine_post(&kfd_ep_start_job);
    return 0;
}

/* Register in kfd_ep what k waits for (k->lock held): events (EV_READ / EV_WRITE), 0
 * removes it. An error is the descriptor's (closed under us, not a socket any more):
 * the queues are run again, and the kernel's error ends the operations. */
static void kfd_reg_locked(struct kfd *k, int events)
{
    struct epoll_event ev = {
        .events = (events & EV_READ ? EPOLLIN : 0) | (events & EV_WRITE ? EPOLLOUT : 0),
        .data.u64 = (uint64_t)(uint32_t)k->fd | ((uint64_t)k->gen << 32),
    };
    int op = !events ? EPOLL_CTL_DEL : k->io_reg ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;

    if (events == k->io_reg)
        return;
    if (epoll_ctl(kfd_ep, op, k->fd, &ev) && events) {
        EXS_WARN(API, "kfd %d: epoll_ctl: %m", k->fd);
        k->io_reg = 0;
        return;
    }
    k->io_reg = events;
}

/* After running the queues (k->lock held): register what they wait for. */
static void kfd_update_locked(struct kfd *k)
{
    kfd_reg_locked(k, k->attached ? k->io_want : 0);
}

/* Progress thread: kfd_ep is readable: run the queues of each ready descriptor. */
static void kfd_ep_cb(struct exs_eng_io *io, int revents)
{
    struct epoll_event evs[64];
    int n;

    (void)io;
    (void)revents;
    do
        n = epoll_wait(kfd_ep, evs, (int)EXS_ARRAY_SIZE(evs), 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        EXS_WARN(API, "kfd: epoll_wait: %m");
    for (int i = 0; i < n; i++) {
        int fd = (int)(uint32_t)evs[i].data.u64;
        uint32_t gen = (uint32_t)(evs[i].data.u64 >> 32);
        struct kfd *k = NULL;

        EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (fd < kfd_tab_len && kfd_tab[fd] && kfd_tab[fd]->gen == gen) {
            k = kfd_tab[fd];
            kfd_ref(k);
        }
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (!k)
            continue; /* its operations ended meanwhile */
        kfd_lock(k);
        if (k->attached) {
            kfd_run_locked(k);
            kfd_update_locked(k);
        }
        kfd_unlock(k);
        kfd_put(k);
    }
}

/* ---- calls ---- */

/* The opening of every call with an operation: a new operation with its event slot in *q;
 * a synchronous call's (sync) *q is made the thread's own queue first, which the call then
 * ends on (exs__api_call_end, or exs__api_sync_fail when op is NULL: *err_p set). */
static struct kfd_op *kfd_op_new(int type, int sync, exs_qhandle_t *q, exs_ahandle_t ah, int *err_p)
{
    struct exs_evq *evq;
    struct kfd_op *op;

    if (sync)
        *q = exs__api_sync_queue();
    op = exs__evq_reserve_alloc(*q, sizeof(*op), &evq, err_p);
    if (!op)
        return NULL;
    op->type = type;
    op->ah = ah;
    op->evq = evq;
    exs_list_init(&op->link);
    __atomic_fetch_add(&kfd_live, 1, __ATOMIC_RELAXED);
    return op;
}

/* 1 when k (attached, locked) holds options but no operation, and fd no longer names the
 * socket they were set on (the application closed it and the number was reused; an
 * fstat that fails counts as another socket too): k is then detached. */
static int kfd_stale_locked(struct kfd *k)
{
    struct stat st;

    if (!kfd_has_opts(k) || !exs_list_empty(&k->sendq) || !exs_list_empty(&k->recvq) ||
        k->file_busy)
        return 0;
    if (fstat(k->fd, &st) == 0 && st.st_dev == k->dev && st.st_ino == k->ino)
        return 0;
    EXS_DBG(API, "kfd %d: another socket now: its options are dropped", k->fd);
    k->snd_timeo = k->rcv_timeo = 0;
    kfd_detach_locked(k);
    return 1;
}

/* The kfd of fd (made when create), attached, locked, with a reference; NULL with an
 * errno (no create: ENOENT when there is none). */
static struct kfd *kfd_get_locked2(int fd, int create, int *err_p)
{
    for (;;) {
        int ret = 0;
        struct kfd *k = kfd_get(fd, create, &ret);

        if (!k) {
            *err_p = -ret;
            return NULL;
        }
        kfd_lock(k);
        if (k->attached && !kfd_stale_locked(k))
            return k;
        /* its last event was just posted, or the number names another socket now: it
         * starts afresh */
        kfd_unlock(k);
        kfd_put(k);
    }
}

static struct kfd *kfd_get_locked(int fd, int *err_p)
{
    return kfd_get_locked2(fd, 1, err_p);
}

/* kfd_get_locked for a call holding op: NULL with an errno, op dropped. */
static struct kfd *kfd_get_for_op(int fd, struct kfd_op *op, int *err_p)
{
    struct kfd *k = kfd_get_locked(fd, err_p);

    if (!k)
        kfd_op_drop(op);
    return k;
}

/* k (locked) has nothing pending, holds no option and no exs_sendfile is writing: it
 * leaves the table (no state is kept). */
static void kfd_idle_locked(struct kfd *k)
{
    if (k->attached && exs_list_empty(&k->sendq) && exs_list_empty(&k->recvq) && !kfd_has_opts(k) &&
        !k->file_busy)
        kfd_detach_locked(k);
}

/* Check the call's common conditions: 0 or an errno. */
static int kfd_check(int fd)
{
    if (!kfd_is_stream(fd))
        return ENOTSOCK;
    if (!exs__api_initialized())
        return EINVAL;
    return 0;
}

/* Queue op on k and run the queues (k locked with our reference): unlocks and puts. */
static void kfd_submit(struct kfd *k, struct kfd_op *op)
{
    exs_list_add_tail(op->type == EXS_EVT_RECV ? &k->recvq : &k->sendq, &op->link);
    kfd_run_locked(k);
    kfd_update_locked(k);
    kfd_unlock(k);
    kfd_put(k);
}

int exs__api_kfd_xfer(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
                      exs_mhandle_t mh, int recv, struct api_bounce *b)
{
    int allowed = recv ? (MSG_WAITALL | MSG_DONTWAIT) : (MSG_NOSIGNAL | MSG_DONTWAIT);
    int err, sync = q == EXS_QHANDLE_INVALID;
    struct api_mreg *m = NULL;
    struct kfd_op *op;
    struct kfd *k;
    exs_event_t ev;

    if ((err = kfd_check(fd)))
        goto err_b;
    err = EINVAL;
    if ((flags & ~allowed) || (!buf && len) || (recv && !len))
        goto err_b;
    err = EMSGSIZE;
    if (len > SSIZE_MAX)
        goto err_b;
    err = EINVAL;
    if (!b && mh != EXS_MHANDLE_UNREGISTERED && exs__api_mreg_hold(mh, buf, len, &m))
        goto err_b;
    op = kfd_op_new(recv ? EXS_EVT_RECV : EXS_EVT_SEND, sync, &q, ah, &err);
    if (!op)
        goto err_mreg;
    op->buf = buf;
    op->len = len;
    op->flags = flags & MSG_WAITALL;
    op->mreg = m;
    op->bounce = b;
    b = NULL;
    k = kfd_get_for_op(fd, op, &err); /* on failure op and with it m and b are gone */
    if (!k)
        return exs__api_sync_fail(sync, q, err);
    int *count = recv ? &k->n_recv : &k->n_send;
    if (*count >= (int)exs__params.sock_max_ops) {
        kfd_unlock(k);
        kfd_put(k);
        err = EAGAIN;
        goto err_op;
    }
    if (!sync && (err = kfd_to_start_locked(k, op))) {
        kfd_unlock(k);
        kfd_put(k);
        goto err_op;
    }
    (*count)++;
    kfd_submit(k, op);
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    return sync ? (int)ev.exs_evt_u.exs_evt_xfer.exs_evt_result : 0;

err_op:
    kfd_op_drop(op); /* releases m and b */
    return exs__api_sync_fail(sync, q, err);
err_mreg:
    if (m)
        exs__api_mreg_release(m);
    if (b)
        exs__api_bounce_free(b);
    return exs__api_sync_fail(sync, q, err);
err_b:
    if (b)
        exs__api_bounce_free(b);
    return exs__err(err);
}

int exs__api_kfd_shutdown(int fd, int how, exs_qhandle_t q, exs_ahandle_t ah)
{
    int err, sync = q == EXS_QHANDLE_INVALID;
    struct kfd_op *op;
    struct kfd *k;
    exs_event_t ev;

    if ((err = kfd_check(fd)))
        return exs__err(err);
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
        return exs__err(EINVAL);
    op = kfd_op_new(EXS_EVT_SHUTDOWN, sync, &q, ah, &err);
    if (!op)
        return exs__api_sync_fail(sync, q, err);
    op->how = how;
    k = kfd_get_for_op(fd, op, &err);
    if (!k)
        return exs__api_sync_fail(sync, q, err);
    if (how == SHUT_RD) {
        /* not ordered with sends: at once (pending receives then see the end) */
        int r = shutdown(fd, SHUT_RD);

        kfd_op_finish_locked(k, op, 0, r ? errno : 0);
        kfd_run_locked(k);
        kfd_update_locked(k);
        kfd_unlock(k);
        kfd_put(k);
    } else {
        kfd_submit(k, op); /* after the sends queued before it */
    }
    return exs__api_call_end(sync, q, &ev);
}

/* exs_close of k (locked) with its CLOSE op: from here the number belongs to this close:
 * every operation ends cancelled (in posting order per direction; the descriptor leaves
 * kfd_ep first), then the descriptor is closed, then the CLOSE event. */
static void kfd_close_locked(struct kfd *k, struct kfd_op *op)
{
    struct exs_list *n;
    int err = 0;

    kfd_detach_locked(k);
    while ((n = exs_list_pop_head(&k->sendq)))
        kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, ECANCELED);
    while ((n = exs_list_pop_head(&k->recvq)))
        kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, ECANCELED);
    k->snd_timeo = k->rcv_timeo = 0;
    /* close() frees the descriptor whatever it returns (EINTR included) */
    if (close(k->fd) && errno != EINTR)
        err = errno;
    kfd_op_finish_locked(k, op, 0, err);
}

int exs__api_kfd_close(int fd, exs_qhandle_t q, exs_ahandle_t ah)
{
    int err, sync = q == EXS_QHANDLE_INVALID;
    struct kfd_op *op;
    struct kfd *k;
    exs_event_t ev;

    if ((err = kfd_check(fd)))
        return exs__err(err);
    op = kfd_op_new(EXS_EVT_CLOSE, sync, &q, ah, &err);
    if (!op)
        return exs__api_sync_fail(sync, q, err);
    k = kfd_get_for_op(fd, op, &err);
    if (!k)
        return exs__api_sync_fail(sync, q, err);
    if (k->file_busy && !k->close_op)
        k->close_op = op; /* after the exs_sendfile writing now (kfd_sendfile_end) */
    else
        kfd_close_locked(k, op);
    kfd_unlock(k);
    kfd_put(k);
    return exs__api_call_end(sync, q, &ev);
}

int exs__api_kfd_cancel(int fd, exs_ahandle_t ah, int flags)
{
    struct exs_list *qs[2], *pos, *next;
    struct kfd *k;
    int ret = 0;

    if (!kfd_is_stream(fd))
        return exs__err(ENOTSOCK);
    if (flags)
        return exs__err(EINVAL);
    k = kfd_get(fd, 0, &ret);
    if (!k)
        return 0; /* nothing pending */
    kfd_lock(k);
    qs[0] = &k->sendq;
    qs[1] = &k->recvq;
    /* Only what moved no byte yet: the stream stays whole. A cancelled operation's
     * event may come before those of earlier ones still pending. */
    for (int i = 0; i < 2 && k->attached; i++) {
        for (pos = qs[i]->next; pos != qs[i]; pos = next) {
            struct kfd_op *op = exs_list_entry(pos, struct kfd_op, link);

            next = pos->next;
            if (op->ah != ah || op->done || op->type == EXS_EVT_SHUTDOWN)
                continue;
            exs_list_del(&op->link);
            kfd_op_finish_locked(k, op, -1, ECANCELED);
        }
    }
    if (!k->attached || !exs_list_empty(&k->sendq) || !exs_list_empty(&k->recvq)) {
        /* a send behind the cancelled head may now be writable */
        if (k->attached)
            kfd_run_locked(k);
        kfd_update_locked(k);
    }
    kfd_unlock(k);
    kfd_put(k);
    return 0;
}

void exs__api_kfd_close_all(void)
{
    for (;;) {
        struct kfd *k = NULL;
        struct exs_list *n;

        EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        for (int fd = 0; fd < kfd_tab_len && !k; fd++)
            if (kfd_tab[fd]) {
                k = kfd_tab[fd];
                kfd_ref(k);
            }
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (!k)
            break;
        kfd_lock(k);
        while ((n = exs_list_pop_head(&k->sendq)) || (n = exs_list_pop_head(&k->recvq))) {
            struct kfd_op *op = exs_list_entry(n, struct kfd_op, link);

            kfd_to_end_locked(k, op);
            kfd_op_drop(op);
        }
        k->n_send = k->n_recv = 0;
        k->snd_timeo = k->rcv_timeo = 0;
        kfd_detach_locked(k);
        kfd_unlock(k);
        kfd_put(k);
    }
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    free(kfd_tab);
    kfd_tab = NULL;
    kfd_tab_len = 0;
    if (kfd_ep >= 0) {
        /* the engine's stop runs it: the watcher goes, then kfd_ep */
        kfd_ep_stop_job.fn = kfd_ep_stop;
        exs__engine_post(&kfd_ep_stop_job);
    }
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
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
    struct stat st;
    struct kfd *k;
    int err, v = 0;

    if ((err = kfd_check(fd)))
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
    if (fstat(fd, &st)) {
        err = errno;
        EXS_DBG(API, "kfd %d: fstat: %m", fd);
        return exs__err(err);
    }
    k = kfd_get_locked(fd, &err);
    if (!k)
        return exs__err(err);
    k->dev = st.st_dev;
    k->ino = st.st_ino;
    if (optname == SO_ASYNC_SEND_TIMEOUT)
        k->snd_timeo = v;
    else
        k->rcv_timeo = v;
    /* nothing pending and nothing set: no state is kept */
    kfd_idle_locked(k);
    kfd_unlock(k);
    kfd_put(k);
    return 0;
}

int exs__api_kfd_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen)
{
    struct kfd *k;
    int err, v = 0;

    if ((err = kfd_check(fd)))
        return exs__err(err);
    if (!optval || !optlen || *optlen < sizeof(int))
        return exs__err(EINVAL);
    if (kfd_opt_is_ordered(level, optname)) {
        v = 1;
    } else if (kfd_opt_is_timeo(level, optname)) {
        k = kfd_get_locked2(fd, 0, &err);
        if (k) {
            v = optname == SO_ASYNC_SEND_TIMEOUT ? k->snd_timeo : k->rcv_timeo;
            kfd_unlock(k);
            kfd_put(k);
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

/* ---- exs_sendfile: sendfile(2) ---- */

/* The posting thread, k->lock free, k->file_busy ours: move up to want bytes of in_fd
 * from offset with sendfile(2) (non-blocking: the socket's own O_NONBLOCK). Returns the
 * bytes moved; *stop_p: 0 all moved, EAGAIN the socket is full, -1 end of file, else
 * the errno that stopped it. */
static size_t kfd_sendfile_run(int fd, int in_fd, off_t offset, size_t want, int *stop_p)
{
    off_t off = offset;
    size_t sent = 0;

    *stop_p = 0;
    while (sent < want) {
        ssize_t n = sendfile(fd, in_fd, &off, want - sent);

        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n == 0) {
            *stop_p = -1;
            break;
        }
        if (errno == EINTR)
            continue;
        *stop_p = errno;
        break;
    }
    __atomic_fetch_add(&kfd_sendfile_bytes, (uint64_t)sent, __ATOMIC_RELAXED);
    return sent;
}

/* The posting thread, k->lock free: read what sendfile(2) left (the socket was full)
 * into op's buffer, so that the progress thread never reads the file. Short at the end
 * of the file or at a read error. */
static void kfd_sendfile_rest(struct kfd_op *op, int in_fd, off_t offset, size_t rest)
{
    struct api_bounce *b = op->bounce;
    size_t got = 0;

    b->buf = malloc(rest);
    if (!b->buf) {
        EXS_WARN(API, "sendfile: no memory for the %zu bytes left: a short count", rest);
        return;
    }
    while (got < rest) {
        ssize_t n = pread(in_fd, b->buf + got, rest - got, offset + (off_t)got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0)
                EXS_DBG(API, "sendfile: pread(%d): %m: a short count", in_fd);
            break;
        }
        got += (size_t)n;
    }
    b->len = got;
    op->buf = (char *)b->buf;
    op->len = got;
}

/* The posting thread is done writing (k locked again): queue the rest at the head, or
 * finish op; then a deferred exs_close, or the sends queued meanwhile. */
static void kfd_sendfile_end(struct kfd *k, struct kfd_op *op)
{
    k->file_busy = 0;
    if (!k->attached) {
        /* exs_fini dropped k meanwhile */
        k->n_send--;
        kfd_to_end_locked(k, op);
        kfd_op_drop(op);
        return;
    }
    if (k->close_op) {
        struct kfd_op *c = k->close_op;

        k->close_op = NULL;
        kfd_op_finish_locked(k, op, -1, ECANCELED);
        kfd_close_locked(k, c);
        return;
    }
    if (op->len)
        exs_list_add_head(&k->sendq, &op->link); /* before the sends queued meanwhile */
    else
        kfd_op_finish_locked(k, op, 0, 0);
    kfd_run_locked(k);
    kfd_update_locked(k);
    kfd_idle_locked(k);
}

/* Give the synchronous queue back unused (the copying path takes it again). */
static void kfd_sync_put(int sync, exs_qhandle_t q)
{
    int e = errno;

    (void)exs__api_sync_fail(sync, q, 0);
    errno = e;
}

/* exs_sendfile leaves k (locked, with its reference) without queuing op: k unlocked and
 * put, op dropped (the caller then takes the copying path or fails). */
static void kfd_sendfile_leave(struct kfd *k, struct kfd_op *op)
{
    kfd_unlock(k);
    kfd_put(k);
    kfd_op_drop(op);
}

ssize_t exs__api_kfd_sendfile(int fd, int in_fd, off_t offset, size_t count, size_t want,
                              exs_qhandle_t q, exs_ahandle_t ah, int *taken_p)
{
    int err = 0, stop, fl, sync = q == EXS_QHANDLE_INVALID;
    struct api_bounce *b;
    struct kfd_op *op;
    struct stat st;
    struct kfd *k;
    exs_event_t ev;
    size_t sent;

    *taken_p = 0;
    /* only where sendfile(2) cannot block and reads what pread would: a non-blocking
     * kernel stream socket (the application's own flag), a regular file */
    if (!want || !exs__api_initialized() || !kfd_is_stream(fd))
        return 0;
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || !(fl & O_NONBLOCK) || fstat(in_fd, &st) || !S_ISREG(st.st_mode))
        return 0;
    b = calloc(1, sizeof(*b));
    if (!b)
        return 0; /* the copying path reports it */
    b->evt_type = EXS_EVT_SENDFILE;
    b->in_fd = in_fd;
    b->offset = offset;
    b->len_req = count;
    op = kfd_op_new(EXS_EVT_SEND, sync, &q, ah, &err);
    if (!op)
        exs__api_bounce_free(b);
    else
        op->bounce = b;
    k = op ? kfd_get_for_op(fd, op, &err) : NULL; /* without k, op and b are gone */
    if (!k) {
        *taken_p = 1;
        return exs__api_sync_fail(sync, q, err);
    }
    if (!exs_list_empty(&k->sendq) || k->file_busy || k->close_op || k->err ||
        k->n_send >= (int)exs__params.sock_max_ops) {
        /* sends ahead of it (or a failed connection): the copying path queues behind */
        kfd_idle_locked(k);
        kfd_sendfile_leave(k, op);
        kfd_sync_put(sync, q);
        return 0;
    }
    if (!sync && (err = kfd_to_start_locked(k, op))) {
        kfd_idle_locked(k);
        kfd_sendfile_leave(k, op);
        *taken_p = 1;
        return exs__api_sync_fail(sync, q, err);
    }
    k->n_send++;
    k->file_busy = 1;
    kfd_unlock(k);
    sent = kfd_sendfile_run(fd, in_fd, offset, want, &stop);
    if (!sent && stop > 0 && stop != EAGAIN) {
        /* refused (EINVAL, ENOSYS for this file, EBADF, ...): the copying path, which
         * reports the errors pread and send give */
        EXS_DBG(API, "kfd %d: sendfile(2) from %d: %s: copying instead", fd, in_fd, strerror(stop));
        kfd_lock(k);
        k->file_busy = 0;
        k->n_send--;
        kfd_to_end_locked(k, op);
        if (k->close_op) {
            struct kfd_op *c = k->close_op;

            k->close_op = NULL;
            kfd_close_locked(k, c);
        } else if (k->attached) {
            kfd_run_locked(k);
            kfd_update_locked(k);
            kfd_idle_locked(k);
        }
        kfd_sendfile_leave(k, op);
        kfd_sync_put(sync, q);
        return 0;
    }
    op->pre = sent;
    if (stop == EAGAIN)
        kfd_sendfile_rest(op, in_fd, offset + (off_t)sent, want - sent);
    else if (stop > 0)
        EXS_DBG(API, "kfd %d: sendfile(2): %s after %zu bytes: a short count", fd, strerror(stop),
                sent);
    kfd_lock(k);
    kfd_sendfile_end(k, op);
    kfd_unlock(k);
    kfd_put(k);
    *taken_p = 1;
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    return sync ? (ssize_t)ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result : 0;
}

/* A forked child (fork.c): the parent's operations on kernel sockets are its own (the
 * sockets are the application's, shared, and stay open); their state is dropped
 * unused, and the child's copy of the epoll set closed (never changed: the set is the
 * parent's too). */
void exs__api_kfd_fork_child(void)
{
    exs__forsake(kfd_tab);
    kfd_tab = NULL;
    kfd_tab_len = 0;
    kfd_live = 0;
    pthread_mutex_init(&kfd_tab_lock, NULL);
    if (kfd_ep >= 0)
        close(kfd_ep);
    kfd_ep = -1;
    memset(&kfd_ep_io, 0, sizeof(kfd_ep_io));
    memset(&kfd_ep_start_job, 0, sizeof(kfd_ep_start_job));
    memset(&kfd_ep_stop_job, 0, sizeof(kfd_ep_stop_job));
}
