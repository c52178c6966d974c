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
#include "exs/api/evq_int.h"
#include "exs/api/kfd.h"
#include "exs/api/kfd_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/*
 * A struct kfd is made for a descriptor number at its first call and stays in the table
 * (kfd_tab) until exs_close or exs_fini, with what the library knows of the descriptor,
 * so that an operation that completes at once makes no system call and no allocation of
 * the library's own where it can (spec/api.md, "Kernel sockets"). The application may
 * close the descriptor after its last event without exs_close (or dup2 over it), and the
 * number may then name another file; the cache must never make a call answer otherwise
 * than the kernel would. So: a call checks the descriptor (kfd_verify_locked: fstat, a
 * socket, its device and inode; at the first look or when they changed also SO_TYPE,
 * SOCK_STREAM), except a send on a stream socket already checked, with no option set:
 * that is one plain send(), the check being the send itself (no probe: spec/api.md 5.14
 * says why, with what it leaves uncaught, a connected socket of another type reusing the
 * number). Any error, a send that must wait (before it is registered) and every call
 * while an option is set make the check again: the number naming no file gives EBADF, a
 * file that is not a stream socket ENOTSOCK, as before the cache; another stream socket
 * starts with no state (latched error, options) of the old one. The posting call of an
 * operation that fails so returns the errno (no event), as the check before the cache
 * did. A receive proves nothing (TCP and AF_UNIX sockets answer recvmsg alike), so each
 * receive is checked (one fstat). The state of a connection (the latched error) is
 * dropped when the queues empty, where the kfd itself went before the cache. The
 * descriptor's file status flags are never touched: every send and recv is made with
 * MSG_DONTWAIT (and MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE).
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
 * Locks: kfd_tab_lock (level SOCK_TAB) guards changes to the table; k->lock (level SOCK,
 * like a socket's) guards the queues and the registration and is held while the kernel
 * is called and while events are posted, so events leave in the order the operations
 * finish. A call finds its kfd without kfd_tab_lock (exs__api_kfd_get_locked2): it loads
 * the table's slot, locks the kfd found there and keeps it when it is still attached
 * and names that number (both change only under k->lock); anything else takes the
 * locked way. That is safe because neither goes away under a reader: a grown table
 * keeps its old array, and a struct kfd whose last reference goes is parked in kfd_free
 * (its lock still a lock, attached 0) and reused for the next kfd made; neither is ever
 * freed (exs_fini keeps them for the next exs_init).
 *
 * References (k->refs): the table's while attached, one per thread inside a call or
 * a callback on it. An epoll event names its kfd by descriptor and generation
 * (kfd_ep_cb finds it in the table), never by pointer, so a stale event is ignored.
 */

#define KFD_IOV_MAX 64 /* sends gathered in one sendmsg */

static pthread_mutex_t kfd_tab_lock = PTHREAD_MUTEX_INITIALIZER;
/* The table: kfd_tab and kfd_tab_len change under kfd_tab_lock; its slots are written
 * there with atomic stores, and read without the lock through kfd_tabv (atomic). */
struct kfd_tabv {
    struct kfd_tabv *old; /* the array this one replaced (kept: never freed) */
    int len;
    struct kfd *e[];
};
static struct kfd_tabv *kfd_tabv;
static struct kfd **kfd_tab;
static int kfd_tab_len;
/* Parked kfds (kfd_free_lock, a leaf: the last put may come with any lock held). */
static pthread_mutex_t kfd_free_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kfd *kfd_free;
static int kfd_live;     /* kfds with something pending (counted) + operations */
static int kfd_cached;   /* every struct kfd */
static uint32_t kfd_gen; /* kfd_tab_lock */

/* The epoll set of the descriptors that wait, and its libev watcher (made when a first
 * operation waits, gone at exs_fini). kfd_ep is written under kfd_tab_lock with atomic
 * stores, read with atomic loads. */
static int kfd_ep = -1;
static int kfd_waiting; /* atomic: kfds registered in kfd_ep (io_reg != 0) */
static struct exs_eng_io kfd_ep_io;
static struct exs_job kfd_ep_start_job, kfd_ep_stop_job;

int exs__debug_kfd_live(void)
{
    return __atomic_load_n(&kfd_live, __ATOMIC_RELAXED);
}

int exs__debug_kfd_cached(void)
{
    return __atomic_load_n(&kfd_cached, __ATOMIC_RELAXED);
}

/* ---- objects ---- */

static int kfd_ep_open(void);
static int kfd_reg_locked(struct kfd *k, int events);

void exs__api_kfd_put(struct kfd *k)
{
    if (__atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL))
        return;
    EXS_ASSERT(!k->attached && !k->io_reg && exs_list_empty(&k->sendq) &&
               exs_list_empty(&k->recvq) && exs_list_empty(&k->to_ops));
    /* parked, not freed: a reader may still lock it (kfd.c's opening comment) */
    EXS_MUTEX_LOCK(&kfd_free_lock, EXS_LOCK_LEAF);
    k->free_next = kfd_free;
    kfd_free = k;
    EXS_MUTEX_UNLOCK(&kfd_free_lock, EXS_LOCK_LEAF);
    __atomic_fetch_sub(&kfd_cached, 1, __ATOMIC_RELAXED);
}

void exs__api_kfd_ref(struct kfd *k)
{
    __atomic_fetch_add(&k->refs, 1, __ATOMIC_RELAXED);
}

/* 1 when fd is a kernel SOCK_STREAM socket. */
int exs__api_kfd_is_stream(int fd)
{
    int type = 0;
    socklen_t len = sizeof(type);

    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

/* A struct kfd for fd (parked or new), locked, its state cleared, not attached; NULL when
 * out of memory. */
static struct kfd *kfd_new(int fd)
{
    struct kfd *k;

    k = EXS_PARKED_POP(&kfd_free_lock, kfd_free, free_next);
    if (!k) {
        k = calloc(1, sizeof(*k));
        if (!k)
            return NULL;
    }
    exs__api_kfd_lock(k);
    /* everything after the lock, which a reader may hold or wait for meanwhile */
    memset((char *)k + sizeof(k->lock), 0, sizeof(*k) - sizeof(k->lock));
    k->fd = fd;
    exs_list_init(&k->sendq);
    exs_list_init(&k->recvq);
    exs_list_init(&k->to_ops);
    return k;
}

/* Room in the table for fd (kfd_tab_lock held): 0 or -ENOMEM. The old array stays for
 * the readers that loaded it (kfd_tab_old). */
static int kfd_tab_fit(int fd)
{
    struct kfd_tabv *t;
    int n;

    if (fd < kfd_tab_len)
        return 0;
    n = EXS_MAX(fd + 1, kfd_tab_len * 2);
    t = calloc(1, sizeof(*t) + (size_t)n * sizeof(t->e[0]));
    if (!t)
        return -ENOMEM;
    t->len = n;
    t->old = kfd_tabv;
    if (kfd_tab_len)
        memcpy(t->e, kfd_tab, (size_t)kfd_tab_len * sizeof(t->e[0]));
    kfd_tab = t->e;
    kfd_tab_len = n;
    __atomic_store_n(&kfd_tabv, t, __ATOMIC_RELEASE);
    return 0;
}

/* The kfd of fd with a reference, made when there is none (create); NULL with -ENOMEM,
 * or (no create) -ENOENT. */
static struct kfd *kfd_get(int fd, int create, int *err_p)
{
    struct kfd *k = NULL, *nk = NULL;

    for (;;) {
        int made = 0;

        EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (fd < kfd_tab_len && kfd_tab[fd]) {
            k = kfd_tab[fd];
            exs__api_kfd_ref(k);
        } else if (!create) {
            *err_p = -ENOENT;
        } else if (nk && kfd_tab_fit(fd)) {
            *err_p = -ENOMEM;
        } else if (nk) {
            /* nk->lock held: a reader that finds it sees it whole */
            k = nk;
            nk = NULL;
            k->gen = ++kfd_gen;
            k->refs = 2; /* the table's and the caller's */
            k->attached = 1;
            __atomic_store_n(&kfd_tab[fd], k, __ATOMIC_RELEASE);
            __atomic_fetch_add(&kfd_cached, 1, __ATOMIC_RELAXED);
            made = 1;
        }
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (made)
            exs__api_kfd_unlock(k);
        if (k || !create || nk)
            break;
        /* made with no table lock held: its lock comes before the table's */
        nk = kfd_new(fd);
        if (!nk) {
            *err_p = -ENOMEM;
            return NULL;
        }
    }
    if (nk) {
        /* another thread made fd's meanwhile, or no room: parked unused */
        exs__api_kfd_unlock(nk);
        EXS_MUTEX_LOCK(&kfd_free_lock, EXS_LOCK_LEAF);
        nk->free_next = kfd_free;
        kfd_free = nk;
        EXS_MUTEX_UNLOCK(&kfd_free_lock, EXS_LOCK_LEAF);
    }
    return k;
}

/* The kfd of fd with a reference, or NULL when the table has none (nothing made). */
struct kfd *exs__api_kfd_find(int fd)
{
    int err = 0;

    return kfd_get(fd, 0, &err);
}

/* Take k out of the table and out of kfd_ep (k->lock held; the caller holds a
 * reference, so the table's is never the last here). */
void exs__api_kfd_detach_locked(struct kfd *k)
{
    if (!k->attached)
        return;
    kfd_reg_locked(k, 0);
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    EXS_ASSERT(k->fd < kfd_tab_len && kfd_tab[k->fd] == k);
    __atomic_store_n(&kfd_tab[k->fd], NULL, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    k->attached = 0;
    k->known = 0;
    exs__api_kfd_count_locked(k);
    __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL);
}

/* 1 while k holds something beyond the cache: operations, an option, a sendfile. */
static int kfd_busy_locked(const struct kfd *k)
{
    return k->attached && (!exs_list_empty(&k->sendq) || !exs_list_empty(&k->recvq) ||
                           exs__api_kfd_has_opts(k) || k->file_busy);
}

/* Count k in kfd_live while it is busy (k->lock held): the leak checks see the cache
 * entries of idle descriptors only in exs__debug_kfd_cached. */
void exs__api_kfd_count_locked(struct kfd *k)
{
    int busy = kfd_busy_locked(k);

    if (busy == k->counted)
        return;
    k->counted = busy;
    if (busy)
        __atomic_fetch_add(&kfd_live, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_sub(&kfd_live, 1, __ATOMIC_RELAXED);
}

/* k's queues are empty (k->lock held): it leaves kfd_ep, and a failed connection's
 * latched error goes with the descriptor's check (the kernel answers the next call);
 * what the cache knows of a healthy socket stays. */
static void kfd_rest_locked(struct kfd *k)
{
    if (!k->attached)
        return;
    kfd_reg_locked(k, 0);
    if (k->err) {
        k->err = 0;
        k->known = 0;
    }
    exs__api_kfd_count_locked(k);
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
 * left it leaves kfd_ep first, so the application may close the descriptor as soon as it
 * sees this event. The posting call's own operation ending with an identity error
 * (k->posting) gets no event: the call returns the errno. */
/* Post op's event (result, or -1 with err) and free op (k->lock held). */
static void kfd_op_post_locked(struct kfd *k, struct kfd_op *op, ssize_t result, int err)
{
    exs_event_t ev = {
        .exs_evt_type = op->type,
        .exs_evt_errno = err,
        .exs_evt_fd = k->fd,
        .exs_evt_ahandle = op->ah,
    };
    struct exs_evq *evq = op->evq;

    if (op->type == EXS_EVT_SEND || op->type == EXS_EVT_RECV) {
        ev.exs_evt_u.exs_evt_xfer.exs_evt_buf = op->buf;
        ev.exs_evt_u.exs_evt_xfer.exs_evt_len = op->len;
    }
    ev.exs_evt_u.exs_evt_xfer.exs_evt_result = err ? -1 : result;
    if (op->bounce)
        exs__api_bounce_event(op->bounce, err ? -1 : result, 0, &ev);
    EXS_DATA(API, "kfd %d: event %d ah %p result %zd errno %d", k->fd, op->type, op->ah,
             (ssize_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result, err);
    /* release first: once the event is visible the application may count objects */
    kfd_op_free(op);
    exs__evq_post(evq, &ev);
}

void exs__api_kfd_op_finish_locked(struct kfd *k, struct kfd_op *op, ssize_t result, int err)
{
    exs__api_kfd_to_end_locked(k, op); /* no notice after this event */
    if (op->type == EXS_EVT_SEND)
        k->n_send--;
    else if (op->type == EXS_EVT_RECV)
        k->n_recv--;
    if (!err)
        result += (ssize_t)op->pre;
    if (exs_list_empty(&k->sendq) && exs_list_empty(&k->recvq) && op->type != EXS_EVT_CLOSE &&
        !k->file_busy)
        kfd_rest_locked(k);
    if (op == k->posting && (err == EBADF || err == ENOTSOCK) && !k->known) {
        k->posting_err = err;
        exs__api_kfd_op_drop(op);
        return;
    }
    kfd_op_post_locked(k, op, result, err);
}

/* Drop op without an event (exs_fini). */
void exs__api_kfd_op_drop(struct kfd_op *op)
{
    exs__evq_unreserve(op->evq);
    kfd_op_free(op);
}

/* ---- what the descriptor is (k->lock held) ---- */

/* A call on k's descriptor failed with err (not EAGAIN, EINTR): the errno its operations
 * get, EBADF, ENOTSOCK, ... when the number names no stream socket now, else err. */
static int kfd_refused_locked(struct kfd *k, int err)
{
    int e = exs__api_kfd_verify_locked(k);

    return e ? e : err;
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
        exs__api_kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, err);
    if (err == EPIPE)
        return;
    while ((n = exs_list_pop_head(&k->recvq)))
        exs__api_kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, err);
}

/* sendmsg failed with err (not EAGAIN, EINTR): the queued sends end with the error (the
 * descriptor's own when the number names no stream socket now). */
static void kfd_send_err_locked(struct kfd *k, int err)
{
    EXS_DBG(API, "kfd %d: sendmsg: %s", k->fd, strerror(err));
    kfd_fail_locked(k, kfd_refused_locked(k, err));
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
            r = op->how == KFD_HOW_FLUSH ? 0 : shutdown(k->fd, op->how);
            exs_list_del(&op->link);
            exs__api_kfd_op_finish_locked(k, op, 0, r ? errno : 0);
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
            n = exs__nc_sendmsg(k->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            k->io_want |= EV_WRITE;
            return;
        }
        if (n < 0) {
            kfd_send_err_locked(k, errno);
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
            exs__api_kfd_op_finish_locked(k, o, (ssize_t)o->len, 0);
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
            n = exs__nc_recv(k->fd, op->buf + op->done, op->len - op->done, MSG_DONTWAIT);
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
            err = kfd_refused_locked(k, err);
            if (!op->done || err == EBADF || err == ENOTSOCK) {
                kfd_fail_locked(k, err);
                continue;
            }
            /* part of a MSG_WAITALL receive came first: it reports its bytes, the
             * operations after it the error */
            k->err = err;
        }
        /* data, or the end of the stream (0, and 0 for each later receive) */
        exs_list_del(&op->link);
        exs__api_kfd_op_finish_locked(k, op, (ssize_t)op->done, 0);
    }
    k->io_want &= ~EV_READ;
}

void exs__api_kfd_run_locked(struct kfd *k)
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
    if (exs__params.test_engine_park)
        return; /* test seam: only the application's waiters run the queues */
    exs__engine_io_start(&kfd_ep_io, kfd_ep, EV_READ, kfd_ep_cb);
}

/* Progress thread (also at exs_fini, when the engine stops): forget kfd_ep. */
static void kfd_ep_stop(struct exs_job *job)
{
    (void)job;
    exs__engine_io_stop(&kfd_ep_io);
    if (__atomic_load_n(&exs__fini_keep_memory, __ATOMIC_RELAXED))
        return; /* at exit: calls still running may use kfd_ep; the process's end closes it */
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    exs__nc_close(kfd_ep);
    __atomic_store_n(&kfd_ep, -1, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
}

/* Make kfd_ep (kfd_tab_lock held). -1 with errno. */
static int kfd_ep_open(void)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);

    if (ep < 0) {
        EXS_WARN(API, "kfd: epoll_create1: %m");
        return -1;
    }
    __atomic_store_n(&kfd_ep, ep, __ATOMIC_RELEASE);
    kfd_ep_start_job.fn = kfd_ep_start;
    exs__engine_post(&kfd_ep_start_job);
    return 0;
}

/* k->io_reg = events (k->lock held), counted in kfd_waiting while not 0. */
static void kfd_reg_set_locked(struct kfd *k, int events)
{
    if (!k->io_reg != !events)
        __atomic_add_fetch(&kfd_waiting, events ? 1 : -1, __ATOMIC_RELEASE);
    k->io_reg = events;
}

/* Register in kfd_ep what k waits for (k->lock held): events (EV_READ / EV_WRITE), 0
 * removes it. 0, or the errno that keeps it from waiting (kfd_ep cannot be made, or
 * epoll_ctl refused the descriptor): the caller ends the operations with it. */
static int kfd_reg_locked(struct kfd *k, int events)
{
    struct epoll_event ev = {
        .events = (events & EV_READ ? EPOLLIN : 0) | (events & EV_WRITE ? EPOLLOUT : 0),
        .data.u64 = (uint64_t)(uint32_t)k->fd | ((uint64_t)k->gen << 32),
    };
    int op = !events ? EPOLL_CTL_DEL : k->io_reg ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    int ep = __atomic_load_n(&kfd_ep, __ATOMIC_ACQUIRE);

    if (events == k->io_reg)
        return 0;
    if (events && ep < 0) {
        /* the first wait: made now, not at the first call, so that a call's check sees
         * the descriptor numbers as the application left them */
        int err = 0;

        EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (kfd_ep < 0 && kfd_ep_open())
            err = errno;
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (err)
            return err;
        ep = __atomic_load_n(&kfd_ep, __ATOMIC_ACQUIRE);
    }
    if (epoll_ctl(ep, op, k->fd, &ev) && events) {
        int err = errno;

        EXS_WARN(API, "kfd %d: epoll_ctl: %m", k->fd);
        kfd_reg_set_locked(k, 0);
        return err;
    }
    kfd_reg_set_locked(k, events);
    return 0;
}

/* After running the queues (k->lock held): register what they wait for. */
void exs__api_kfd_update_locked(struct kfd *k)
{
    int err;

    /* an operation starts to wait: is the number still the socket it was? */
    if (k->attached && k->io_want && !k->io_reg && (err = exs__api_kfd_verify_locked(k))) {
        kfd_fail_locked(k, err);
        k->io_want = 0;
    }
    if ((err = kfd_reg_locked(k, k->attached ? k->io_want : 0))) {
        /* no readiness can be watched (no epoll set, no memory): they end now */
        kfd_fail_locked(k, err);
        k->io_want = 0;
        kfd_reg_locked(k, 0);
    }
    exs__api_kfd_count_locked(k);
}

/* Progress thread: kfd_ep is readable: run the queues of each ready descriptor. */
static void kfd_ep_cb(struct exs_eng_io *io, int revents)
{
    (void)io;
    (void)revents;
    exs__api_kfd_run_ready();
}

int exs__api_kfd_waiting(void)
{
    return __atomic_load_n(&kfd_waiting, __ATOMIC_ACQUIRE);
}

int exs__api_kfd_wait_fd(void)
{
    return __atomic_load_n(&kfd_ep, __ATOMIC_ACQUIRE);
}

void exs__api_kfd_run_ready(void)
{
    struct epoll_event evs[64];
    int n;

    if (__atomic_load_n(&kfd_ep, __ATOMIC_ACQUIRE) < 0)
        return;
    do
        n = exs__nc_epoll_wait(kfd_ep, evs, (int)EXS_ARRAY_SIZE(evs), 0);
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
            exs__api_kfd_ref(k);
        }
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (!k)
            continue; /* its operations ended meanwhile */
        exs__api_kfd_lock(k);
        if (k->attached) {
            exs__api_kfd_run_locked(k);
            exs__api_kfd_update_locked(k);
        }
        exs__api_kfd_unlock(k);
        exs__api_kfd_put(k);
    }
}

/* ---- calls ---- */

/* The opening of every call with an operation: a new operation with its event slot in *q;
 * a synchronous call's (sync) *q is made the thread's own queue first, which the call then
 * ends on (exs__api_call_end, or exs__api_sync_fail when op is NULL: *err_p set). */
struct kfd_op *exs__api_kfd_op_new(int type, int sync, exs_qhandle_t *q, exs_ahandle_t ah,
                                   int *err_p)
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

/* k (attached, locked) holds options but no operation: when fd no longer names the
 * socket they were set on (the application closed it and the number was reused, or it
 * names nothing), they are dropped (kfd_verify_locked). */
static void kfd_stale_locked(struct kfd *k)
{
    if (!exs__api_kfd_has_opts(k) || !exs_list_empty(&k->sendq) || !exs_list_empty(&k->recvq) ||
        k->file_busy)
        return;
    if (exs__api_kfd_verify_locked(k))
        k->snd_timeo = k->rcv_timeo = 0;
    exs__api_kfd_count_locked(k);
}

/* Without kfd_tab_lock: fd's kfd, attached and locked, with no reference of the caller's
 * (the table's keeps it while it is attached, and it stays attached while locked); NULL
 * when the slot holds none that is still fd's (kfd.c's opening comment). */
static struct kfd *kfd_lookup_locked(int fd)
{
    struct kfd_tabv *t = __atomic_load_n(&kfd_tabv, __ATOMIC_ACQUIRE);
    struct kfd *f =
        t && fd >= 0 && fd < t->len ? __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE) : NULL;

    if (!f)
        return NULL;
    exs__api_kfd_lock(f);
    if (f->attached && f->fd == fd) {
        kfd_stale_locked(f);
        return f;
    }
    exs__api_kfd_unlock(f);
    return NULL;
}

/* The kfd of fd (made when create), attached, locked, with a reference; NULL with an
 * errno (no create: ENOENT when there is none). */
struct kfd *exs__api_kfd_get_locked2(int fd, int create, int *err_p)
{
    struct kfd *f = kfd_lookup_locked(fd);

    if (f) {
        exs__api_kfd_ref(f); /* the table's is held: never the first */
        return f;
    }
    for (;;) {
        int ret = 0;
        struct kfd *k = kfd_get(fd, create, &ret);

        if (!k) {
            *err_p = -ret;
            return NULL;
        }
        exs__api_kfd_lock(k);
        if (k->attached) {
            kfd_stale_locked(k);
            return k;
        }
        /* exs_close or exs_fini took it meanwhile: the number starts afresh */
        exs__api_kfd_unlock(k);
        exs__api_kfd_put(k);
    }
}

struct kfd *exs__api_kfd_get_locked(int fd, int *err_p)
{
    return exs__api_kfd_get_locked2(fd, 1, err_p);
}

/* exs__api_kfd_get_locked for a call holding op: NULL with an errno, op dropped. */
struct kfd *exs__api_kfd_get_for_op(int fd, struct kfd_op *op, int *err_p)
{
    struct kfd *k = exs__api_kfd_get_locked(fd, err_p);

    if (!k)
        exs__api_kfd_op_drop(op);
    return k;
}

/* k (locked) may have nothing pending any more: it leaves kfd_ep and the count of live
 * objects then (what the cache knows of the descriptor stays). */
void exs__api_kfd_idle_locked(struct kfd *k)
{
    if (k->attached && exs_list_empty(&k->sendq) && exs_list_empty(&k->recvq) && !k->file_busy)
        kfd_rest_locked(k);
    exs__api_kfd_count_locked(k);
}

/* Check the call's common conditions: 0 or an errno (EBADF: fd names nothing). */
int exs__api_kfd_check(int fd)
{
    if (!exs__api_kfd_is_stream(fd))
        return fd < 0 || fcntl(fd, F_GETFD) < 0 ? EBADF : ENOTSOCK;
    if (!exs__api_initialized())
        return EINVAL;
    return 0;
}

/* Queue op on k and run the queues (k locked with our reference): unlocks and puts. */
void exs__api_kfd_submit(struct kfd *k, struct kfd_op *op)
{
    exs_list_add_tail(op->type == EXS_EVT_RECV ? &k->recvq : &k->sendq, &op->link);
    exs__api_kfd_run_locked(k);
    exs__api_kfd_update_locked(k);
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
}

/* The rest of a send or receive whose call holds k (attached, locked) and a slot in evq,
 * after its first try (now: a send() was made, now_done bytes of it written, now_err its
 * error): the operation is made, queued and run. Unlocks k; returns as the call. */
static int kfd_xfer_rest_locked(struct kfd *k, struct exs_evq *evq, void *buf, size_t len,
                                int flags, int sync, exs_qhandle_t q, exs_ahandle_t ah, int recv,
                                struct api_mreg *m, struct api_bounce *b, int now, size_t now_done,
                                int now_err)
{
    struct kfd_op *op = exs__evq_op_alloc(sizeof(*op));
    exs_event_t ev;
    int err;

    if (!op) {
        exs__api_kfd_unlock(k);
        exs__evq_unreserve(evq);
        if (m)
            exs__api_mreg_release(m);
        if (b)
            exs__api_bounce_free(b);
        return exs__api_sync_fail(sync, q, ENOMEM);
    }
    op->type = recv ? EXS_EVT_RECV : EXS_EVT_SEND;
    op->ah = ah;
    op->evq = evq;
    exs_list_init(&op->link);
    __atomic_fetch_add(&kfd_live, 1, __ATOMIC_RELAXED);
    op->buf = buf;
    op->len = len;
    op->done = now_done;
    op->flags = flags & MSG_WAITALL;
    op->mreg = m;
    op->bounce = b;
    if (!sync && (err = exs__api_kfd_to_start_locked(k, op))) {
        exs__api_kfd_unlock(k);
        exs__api_kfd_op_drop(op); /* releases the registration and the bounce buffer */
        return exs__api_sync_fail(sync, q, err);
    }
    if (recv)
        k->n_recv++;
    else
        k->n_send++;
    k->posting = op;
    k->posting_err = 0;
    exs_list_add_tail(recv ? &k->recvq : &k->sendq, &op->link);
    if (now && !now_err) {
        k->io_want |= EV_WRITE; /* the socket is full: wait for room */
    } else {
        if (now_err)
            kfd_send_err_locked(k, now_err);
        exs__api_kfd_run_locked(k);
    }
    exs__api_kfd_update_locked(k);
    k->posting = NULL;
    err = k->posting_err;
    exs__api_kfd_unlock(k);
    if (err)
        return exs__api_sync_fail(sync, q, err); /* op ended without its event */
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    return sync ? (int)ev.exs_evt_u.exs_evt_xfer.exs_evt_result : 0;
}

/*
 * exs_send's first look (xfer.c), before anything else of the call: an asynchronous send
 * on a kernel socket already checked, with no option set and nothing queued before it,
 * as exs__api_kfd_xfer's trusted send makes it (one send(), its event posted into the slot
 * reserved, no operation made), with none of that call's other work. Anything else goes
 * the whole way, untouched (exs__api_send_slow, which answers every error); a send() that
 * does not complete at once goes on as in exs__api_kfd_xfer. Returns as exs_send.
 * The number is no libexs socket (exs_send looked at the socket table's slot first:
 * exs_socket and an accept fill it before the number is returned), and not one inherited
 * across fork (the child's table of kfds starts empty, and a number is marked inherited
 * only then).
 */
int exs__api_kfd_send_fast(int fd, const void *buf, size_t len, int flags, exs_qhandle_t q,
                           exs_ahandle_t ah, exs_mhandle_t mh)
{
    struct kfd_tabv *t = __atomic_load_n(&kfd_tabv, __ATOMIC_ACQUIRE);
    struct api_mreg *m = NULL;
    struct exs_evq *evq;
    struct kfd *k;
    ssize_t n;

    if (!t || (unsigned)fd >= (unsigned)t->len || (flags & ~(MSG_NOSIGNAL | MSG_DONTWAIT)) ||
        (!buf && len) || len > SSIZE_MAX || q == EXS_QHANDLE_INVALID)
        goto slow;
    k = __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE);
    if (!k || (mh != EXS_MHANDLE_UNREGISTERED && exs__api_mreg_hold(mh, buf, len, &m)))
        goto slow;
    exs__api_kfd_lock(k);
    /* fd's (attached: the table's reference keeps it while locked), trusted (as in
     * exs__api_kfd_xfer), nothing queued (so n_send is 0), and a slot */
    if (!k->attached || k->fd != fd || !k->known || exs__api_kfd_has_opts(k) || k->err ||
        k->file_busy || !exs_list_empty(&k->sendq) || !exs__params.sock_max_ops ||
        exs__evq_reserve_q(q, &evq)) {
        exs__api_kfd_unlock(k);
        if (m)
            exs__api_mreg_release(m);
        goto slow;
    }
    do
        n = exs__nc_send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)len) {
        EXS_DATA(API, "kfd %d: event %d ah %p result %zd errno 0", fd, EXS_EVT_SEND, ah, n);
        exs__evq_post_xfer_now(evq, EXS_EVT_SEND, fd, ah, (void *)(uintptr_t)buf, len, n);
        exs__api_kfd_unlock(k);
        if (m)
            exs__api_mreg_release(m);
        return 0;
    }
    return kfd_xfer_rest_locked(k, evq, (void *)(uintptr_t)buf, len, flags, 0, q, ah, 0, m, NULL, 1,
                                n > 0 ? (size_t)n : 0,
                                n < 0 && errno != EAGAIN && errno != EWOULDBLOCK ? errno : 0);
slow:
    return exs__api_send_slow(fd, buf, len, flags, q, ah, mh);
}

int exs__api_kfd_xfer(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
                      exs_mhandle_t mh, int recv, struct api_bounce *b)
{
    int allowed = recv ? (MSG_WAITALL | MSG_DONTWAIT) : (MSG_NOSIGNAL | MSG_DONTWAIT);
    int err, sync = q == EXS_QHANDLE_INVALID;
    struct api_mreg *m = NULL;
    struct exs_evq *evq;
    struct kfd *k;
    exs_event_t ev;

    /* a trusted descriptor is checked by the operation itself (kfd_verify_locked) */
    if (fd < 0) {
        err = EBADF;
        goto err_b;
    }
    if (!exs__api_initialized()) {
        err = exs__api_kfd_check(fd);
        goto err_b;
    }
    err = 0;
    if ((flags & ~allowed) || (!buf && len) || (recv && !len))
        err = EINVAL;
    else if (len > SSIZE_MAX)
        err = EMSGSIZE;
    else if (!b && mh != EXS_MHANDLE_UNREGISTERED && exs__api_mreg_hold(mh, buf, len, &m))
        err = EINVAL;
    if (err) {
        /* the descriptor's errors first (EBADF, ENOTSOCK), as before the cache */
        int e = exs__api_kfd_check(fd);

        err = e ? e : err;
        goto err_b;
    }
    if (sync)
        q = exs__api_sync_queue();
    if ((err = exs__evq_reserve_handle(q, &evq)))
        goto err_mreg;
    /* k attached and locked until the end of the call: the table's reference keeps it, the
     * call takes none of its own (no atomic operation on the way) */
    k = kfd_lookup_locked(fd);
    if (!k && (k = exs__api_kfd_get_locked(fd, &err)))
        __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL); /* never the last: attached */
    if (!k) {
        exs__evq_unreserve(evq);
        goto err_mreg;
    }
    int *count = recv ? &k->n_recv : &k->n_send;
    /* a send on a descriptor checked before, with no option set, is not checked again:
     * its send() is the check (spec/api.md 5.14) */
    int trusted = !recv && k->known && !exs__api_kfd_has_opts(k);

    if (!trusted && (err = exs__api_kfd_verify_locked(k)))
        goto err_k;
    if (*count >= (int)exs__params.sock_max_ops) {
        err = EAGAIN;
        goto err_k;
    }
    /* a send that completes at once: one send(), its event, nothing else (no operation
     * made, nothing of the descriptor's state touched) */
    int now = trusted && !b && !k->err && !k->file_busy && exs_list_empty(&k->sendq);
    int now_err = 0;
    size_t now_done = 0;

    if (now) {
        ssize_t n;

        do
            n = exs__nc_send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n == (ssize_t)len) {
            /* its event: no operation was made for it, only its slot reserved */
            EXS_DATA(API, "kfd %d: event %d ah %p result %zd errno 0", fd, EXS_EVT_SEND, ah, n);
            exs__evq_post_xfer(evq, EXS_EVT_SEND, fd, ah, buf, len, n);
            exs__api_kfd_unlock(k);
            if (m)
                exs__api_mreg_release(m);
            if (exs__api_call_end(sync, q, &ev))
                return -1;
            return sync ? (int)ev.exs_evt_u.exs_evt_xfer.exs_evt_result : 0;
        }
        if (n > 0)
            now_done = (size_t)n;
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            now_err = errno;
    }
    return kfd_xfer_rest_locked(k, evq, buf, len, flags, sync, q, ah, recv, m, b, now, now_done,
                                now_err);

err_k:
    exs__api_kfd_unlock(k);
    exs__evq_unreserve(evq);
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

/* The descriptors the table holds (a kfd each), in *fds_p (malloc'd); their count, or -1
 * when out of memory. */
int exs__api_kfd_fds(int **fds_p)
{
    int n = 0, *fds;

    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    for (int fd = 0; fd < kfd_tab_len; fd++)
        n += kfd_tab[fd] != NULL;
    fds = malloc((size_t)EXS_MAX(n, 1) * sizeof(*fds));
    n = 0;
    for (int fd = 0; fds && fd < kfd_tab_len; fd++)
        if (kfd_tab[fd])
            fds[n++] = fd;
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    *fds_p = fds;
    return fds ? n : -1;
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
                exs__api_kfd_ref(k);
            }
        EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
        if (!k)
            break;
        exs__api_kfd_lock(k);
        while ((n = exs_list_pop_head(&k->sendq)) || (n = exs_list_pop_head(&k->recvq))) {
            struct kfd_op *op = exs_list_entry(n, struct kfd_op, link);

            exs__api_kfd_to_end_locked(k, op);
            exs__api_kfd_op_drop(op);
        }
        k->n_send = k->n_recv = 0;
        k->snd_timeo = k->rcv_timeo = 0;
        exs__api_kfd_detach_locked(k);
        exs__api_kfd_unlock(k);
        exs__api_kfd_put(k);
    }
    /* The emptied table stays, its arrays too (the old ones), and the parked kfds: a look
     * without the lock racing this (kfd_lookup_locked: the array, the slot, the kfd's
     * lock) may still read them, and learns from the slot (NULL) or the kfd (detached)
     * that the number is no longer the library's; freed here, it read freed memory
     * (integ_attack26 send_at_fini, tcp). The next exs_init's kfds reuse them. */
    EXS_MUTEX_LOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
    if (kfd_ep >= 0) {
        /* the engine's stop runs it: the watcher goes, then kfd_ep */
        kfd_ep_stop_job.fn = kfd_ep_stop;
        exs__engine_post(&kfd_ep_stop_job);
    }
    EXS_MUTEX_UNLOCK(&kfd_tab_lock, EXS_LOCK_SOCK_TAB);
}

/* A forked child (fork.c): the parent's operations on kernel sockets are its own (the
 * sockets are the application's, shared, and stay open); their state, the cached checks
 * included, is dropped unused, and the child's copy of the epoll set closed (never
 * changed: the set is the parent's too). */
void exs__api_kfd_fork_child(void)
{
    exs__forsake(kfd_tabv); /* the old arrays and every kfd are reachable from these */
    exs__forsake(kfd_free);
    kfd_tabv = NULL;
    kfd_tab = NULL;
    kfd_tab_len = 0;
    kfd_free = NULL;
    pthread_mutex_init(&kfd_free_lock, NULL);
    kfd_live = 0;
    kfd_cached = 0;
    kfd_waiting = 0;
    pthread_mutex_init(&kfd_tab_lock, NULL);
    if (kfd_ep >= 0)
        exs__nc_close(kfd_ep);
    kfd_ep = -1;
    memset(&kfd_ep_io, 0, sizeof(kfd_ep_io));
    memset(&kfd_ep_start_job, 0, sizeof(kfd_ep_start_job));
    memset(&kfd_ep_stop_job, 0, sizeof(kfd_ep_stop_job));
}
