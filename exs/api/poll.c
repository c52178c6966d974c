/* SPDX-License-Identifier: MIT */
/* exs_poll: readiness of exs sockets and kernel descriptors, synchronous and as EXS_EVT_POLL. */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "exs/api/api.h"
#include "exs/api/api_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/*
 * A poll request (struct api_poll) looks at its entries:
 *   - at the call, on the caller's thread: ready (or timeout 0) ends it there;
 *   - then on the progress thread: a job registers it (list poll_active, progress lock
 *     only) and looks again, so nothing that happened between the two looks is missed;
 *   - after every round of progress that did something (the engine's round hook): every
 *     change of an exs socket's readiness comes from a completion, a connection event
 *     or a job (close), all of which run in such a round; the keepalive check, which runs
 *     from a timer, kicks too (exs__api_poll_kick);
 *   - when its epoll set of kernel entries turns readable (one io watcher on it;
 *     level-triggered, and the set holds exactly the interests poll(2) reports, so it is
 *     readable only when a look finds an entry ready: no spinning);
 *   - when its timer fires (timeout_ms > 0): ended with what is ready, possibly nothing.
 * Nothing polls in a loop. Ending writes every revents into the caller's array and posts
 * the one EXS_EVT_POLL into the slot reserved at the call. The synchronous form is the
 * same request on the thread's synchronous queue, waited for with exs_qdequeue; a signal
 * (EINTR) cancels it on the progress thread and the call returns -1/EINTR. Without any
 * exs socket in the array the synchronous form is poll(2) itself.
 */

_Static_assert(sizeof(exs_pollfd_t) == sizeof(struct pollfd) &&
                   offsetof(exs_pollfd_t, events) == offsetof(struct pollfd, events) &&
                   offsetof(exs_pollfd_t, revents) == offsetof(struct pollfd, revents),
               "exs_pollfd_t must be laid out like struct pollfd");

/* Largest nfds accepted (EINVAL above, as poll(2) past RLIMIT_NOFILE). */
#define POLL_NFDS_MAX (1u << 20)

/* What an entry is, decided at the call. */
enum poll_kind {
    POLL_IGNORE = 0, /* fd < 0: revents 0 */
    POLL_NVAL,       /* no such descriptor: POLLNVAL */
    POLL_SOCK,       /* an exs socket (socks[i] holds a reference) */
    POLL_KERNEL,     /* a kernel descriptor: poll(2) tells */
};

struct api_poll {
    exs_pollfd_t *fds;
    nfds_t nfds;
    unsigned char *kind;     /* enum poll_kind per entry */
    struct api_sock **socks; /* POLL_SOCK entries: the socket, with a reference */
    struct pollfd *kfds;     /* the POLL_KERNEL entries, for poll(2) with timeout 0 */
    nfds_t *kidx;            /* kfds[j] is fds[kidx[j]] */
    nfds_t nk;
    int nsock;
    int epfd; /* epoll set of the kernel entries (-1: none yet) */
    int timeout_ms;
    uint64_t deadline_ns; /* timeout_ms > 0: exs__now_ns() at which it ends */
    int sync;             /* the waiting caller frees it after the event */
    exs_ahandle_t ah;
    struct exs_evq *evq; /* slot reserved (NULL: none yet) */
    /* progress thread (lock held) */
    struct exs_job job; /* poll_start_job */
    struct exs_eng_timer timer;
    struct exs_eng_io io;
    int timer_on, io_on;
    int active;  /* in poll_active */
    int counted; /* in poll_npending */
    int done;    /* atomic: its event was posted */
    struct exs_list link;
};

static struct exs_list poll_active = EXS_LIST_INIT(poll_active); /* progress lock */
static int poll_nactive; /* atomic: entries of poll_active (the hook's fast exit) */
/* atomic: requests whose start job was posted and that have not ended (exs_cancel and
 * exs_fini look for them on the progress thread, after every start job posted before) */
static int poll_npending;
static int poll_live; /* atomic: requests allocated (exs__debug_poll_live) */

int exs__debug_poll_live(void)
{
    return __atomic_load_n(&poll_live, __ATOMIC_RELAXED);
}

/* ---- readiness ---- */

/* The revents of an exs socket for events (no lock held: takes the socket's, then its
 * conn's, never both at once: the conn's lock comes first in the lock order). */
static short poll_sock_revents(struct api_sock *s, short events)
{
    enum api_sock_state st;
    struct exs_conn *conn;
    int has_child, readable, writable, going, rdhup, reset;
    short rev = 0;

    api_sock_lock(s);
    st = s->state;
    conn = s->conn;
    has_child = !exs_list_empty(&s->ready);
    api_sock_unlock(s);
    switch (st) {
    case API_SOCK_LISTENING:
        return has_child ? (short)(events & POLLIN) : 0; /* exs_accept completes at once */
    case API_SOCK_NEW:
    case API_SOCK_BOUND:
        return POLLHUP; /* never connected (or the connect failed): as poll(2) on TCP */
    case API_SOCK_CONNECTING:
        return 0;
    case API_SOCK_CONNECTED:
        break;
    default:
        return POLLNVAL; /* exs_close was called on it meanwhile */
    }
    /* the conn of a connected socket lives as long as the socket (our reference) */
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    going = conn->state >= EXS_CONN_DOWN;
    if (s->type == SOCK_STREAM)
        readable = conn->rd_arrived != conn->rd_consumed; /* bytes no receive took yet */
    else
        readable = conn->pending_count > 0; /* messages no receive took yet */
    rdhup = conn->peer_shut;
    readable |= rdhup || going; /* a receive completes at once: end of stream or error */
    writable = conn->state == EXS_CONN_CONNECTED && conn->txshut == EXS_TXSHUT_OPEN;
    reset = going && !conn->peer_shut; /* ended without the peer's SHUTDOWN */
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    /* a send is refused with EAGAIN only past EXS_SOCK_MAX_OPS outstanding sends */
    writable &= exs__api_sock_outstanding(s, 0) < (int)exs__params.sock_max_ops;
    if (readable)
        rev |= POLLIN;
    if (writable)
        rev |= POLLOUT;
#ifdef POLLRDHUP
    if (rdhup)
        rev |= POLLRDHUP;
#endif
    rev &= events;
    if (going)
        rev |= POLLHUP;
    if (reset)
        rev |= POLLERR;
    return rev;
}

/* Look at every entry and write its revents; the number of ready entries, or -errno
 * (poll(2) on the kernel entries failed). */
static int poll_eval(struct api_poll *p)
{
    int n = 0;

    if (p->nk) {
        int r;

        for (nfds_t j = 0; j < p->nk; j++)
            p->kfds[j].revents = 0;
        do
            r = exs__nc_poll(p->kfds, p->nk, 0);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            r = -errno;
            EXS_ERR(API, "poll %p: poll(2) of %lu kernel descriptors: %m", (void *)p,
                    (unsigned long)p->nk);
            return r;
        }
        for (nfds_t j = 0; j < p->nk; j++)
            p->fds[p->kidx[j]].revents = p->kfds[j].revents;
    }
    for (nfds_t i = 0; i < p->nfds; i++) {
        exs_pollfd_t *f = &p->fds[i];

        switch (p->kind[i]) {
        case POLL_IGNORE:
            f->revents = 0;
            break;
        case POLL_NVAL:
            f->revents = POLLNVAL;
            break;
        case POLL_SOCK:
            f->revents = poll_sock_revents(p->socks[i], f->events);
            break;
        default:
            break; /* written above */
        }
        n += f->revents != 0;
    }
    return n;
}

/* ---- life cycle ---- */

/* Free p: the sockets' references, the epoll set, the memory (not the slot). */
static void poll_free(struct api_poll *p)
{
    for (nfds_t i = 0; i < p->nfds; i++)
        if (p->socks[i])
            exs__api_sock_put(p->socks[i]);
    if (p->epfd >= 0)
        exs__nc_close(p->epfd);
    free(p->kind);
    free(p->socks);
    free(p->kfds);
    free(p->kidx);
    free(p);
    __atomic_fetch_sub(&poll_live, 1, __ATOMIC_RELAXED);
}

/* Look the entries up: each exs socket referenced, each kernel descriptor noted. NULL
 * with *err_p (ENOMEM). */
static struct api_poll *poll_new(exs_pollfd_t *fds, nfds_t nfds, int timeout_ms, int *err_p)
{
    struct api_poll *p = calloc(1, sizeof(*p));
    size_t n = nfds ? nfds : 1;

    if (!p) {
        *err_p = ENOMEM;
        return NULL;
    }
    __atomic_fetch_add(&poll_live, 1, __ATOMIC_RELAXED);
    p->epfd = -1;
    p->fds = fds;
    p->nfds = nfds;
    p->timeout_ms = timeout_ms;
    if (timeout_ms > 0)
        p->deadline_ns = exs__now_ns() + (uint64_t)timeout_ms * 1000000u;
    exs_list_init(&p->link);
    p->kind = calloc(n, sizeof(*p->kind));
    p->socks = calloc(n, sizeof(*p->socks));
    p->kfds = calloc(n, sizeof(*p->kfds));
    p->kidx = calloc(n, sizeof(*p->kidx));
    if (!p->kind || !p->socks || !p->kfds || !p->kidx) {
        p->nfds = 0;
        poll_free(p);
        *err_p = ENOMEM;
        return NULL;
    }
    for (nfds_t i = 0; i < nfds; i++) {
        int err = 0;

        fds[i].revents = 0;
        if (fds[i].fd < 0)
            continue;
        p->socks[i] = exs__api_sock_get(fds[i].fd, &err);
        if (p->socks[i]) {
            p->kind[i] = POLL_SOCK;
            p->nsock++;
        } else if (err == ENOTSOCK) {
            p->kind[i] = POLL_KERNEL;
            p->kfds[p->nk].fd = fds[i].fd;
            p->kfds[p->nk].events = fds[i].events;
            p->kidx[p->nk++] = i;
        } else {
            p->kind[i] = POLL_NVAL;
        }
    }
    return p;
}

/* The epoll set that turns readable when a kernel entry is ready: the same interests
 * as poll(2) (EPOLLERR / EPOLLHUP always). 0 or -errno. */
static int poll_epoll_make(struct api_poll *p)
{
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (p->epfd < 0) {
        int ret = -errno;

        EXS_ERR(API, "poll %p: epoll_create1: %m", (void *)p);
        return ret;
    }
    for (nfds_t j = 0; j < p->nk; j++) {
        struct epoll_event e = {.data.u64 = j};
        uint32_t mask = EPOLLIN | EPOLLPRI | EPOLLOUT;

#ifdef POLLRDHUP
        mask |= EPOLLRDHUP;
#endif
        /* one descriptor may appear twice: its interests are the union */
        for (nfds_t k = 0; k < p->nk; k++)
            if (p->kfds[k].fd == p->kfds[j].fd)
                e.events |= (uint32_t)(unsigned short)p->kfds[k].events & mask;
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->kfds[j].fd, &e) == 0 || errno == EEXIST)
            continue;
        if (errno == EPERM)
            continue; /* a regular file: always ready, the first look saw it */
        int ret = -errno;

        EXS_ERR(API, "poll %p: epoll_ctl add fd %d: %m", (void *)p, p->kfds[j].fd);
        return ret;
    }
    return 0;
}

/* End p: post its event (nready, or -1 with err) into its slot; an asynchronous p is
 * freed, a synchronous one is its caller's to free after the event. */
static void poll_finish(struct api_poll *p, int nready, int err)
{
    exs_event_t ev = {.exs_evt_type = EXS_EVT_POLL, .exs_evt_errno = err, .exs_evt_fd = -1};
    struct exs_evq *evq = p->evq;

    ev.exs_evt_ahandle = p->ah;
    ev.exs_evt_u.exs_evt_poll.exs_evt_fds = p->fds;
    ev.exs_evt_u.exs_evt_poll.exs_evt_nfds = p->nfds;
    ev.exs_evt_u.exs_evt_poll.exs_evt_nready = err ? -1 : nready;
    if (err)
        for (nfds_t i = 0; i < p->nfds; i++)
            p->fds[i].revents = 0;
    if (p->counted)
        __atomic_fetch_sub(&poll_npending, 1, __ATOMIC_RELAXED);
    if (!p->sync) {
        poll_free(p); /* before the event: once it is visible the application may count */
    } else {
        /* the sockets now (exs_fini waits for them to go); the memory is the waiter's */
        for (nfds_t i = 0; i < p->nfds; i++)
            if (p->socks[i]) {
                exs__api_sock_put(p->socks[i]);
                p->socks[i] = NULL;
            }
        __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    }
    exs__evq_post(evq, &ev);
}

/* Progress thread: take p off the active list, its timer and watcher stopped. */
static void poll_unlink(struct api_poll *p)
{
    if (!p->active)
        return;
    p->active = 0;
    exs_list_del(&p->link);
    __atomic_fetch_sub(&poll_nactive, 1, __ATOMIC_RELAXED);
    if (p->timer_on)
        exs__engine_timer_stop(&p->timer);
    if (p->io_on)
        exs__engine_io_stop(&p->io);
    p->timer_on = p->io_on = 0;
}

/* Progress thread: look at p; end it when an entry is ready or the look failed. */
static int poll_check(struct api_poll *p)
{
    int n = poll_eval(p);

    if (n == 0)
        return 0;
    poll_unlink(p);
    poll_finish(p, n < 0 ? 0 : n, n < 0 ? -n : 0);
    return 1;
}

static void poll_round_hook(void);

static void poll_timer_cb(struct exs_eng_timer *t)
{
    struct api_poll *p = exs_container_of(t, struct api_poll, timer);
    int n;

    p->timer_on = 0;
    uint64_t now = exs__now_ns();
    if (now < p->deadline_ns) {
        /* early: a timer started outside the loop thread counts from the loop's cached
         * time, which may be behind; wait for the rest */
        exs__engine_timer_start(&p->timer, (p->deadline_ns - now + 999999) / 1000000,
                                poll_timer_cb);
        p->timer_on = 1;
        return;
    }
    n = poll_eval(p); /* what is ready now, or nothing */
    poll_unlink(p);
    poll_finish(p, n < 0 ? 0 : n, n < 0 ? -n : 0);
}

static void poll_io_cb(struct exs_eng_io *io, int revents)
{
    struct api_poll *p = exs_container_of(io, struct api_poll, io);

    if (revents & EV_ERROR) {
        p->io_on = 0; /* libev stopped it */
        poll_unlink(p);
        poll_finish(p, 0, EBADF);
        return;
    }
    poll_check(p);
}

/* Progress thread: register p, look again (anything since the caller's look), arm its
 * timer and watcher. */
static void poll_start_job(struct exs_job *job)
{
    struct api_poll *p = exs_container_of(job, struct api_poll, job);
    int ret;

    exs__engine_set_round_hook(poll_round_hook);
    exs_list_add_tail(&poll_active, &p->link);
    p->active = 1;
    __atomic_fetch_add(&poll_nactive, 1, __ATOMIC_RELAXED);
    if (poll_check(p))
        return;
    if (p->nk) {
        ret = poll_epoll_make(p);
        if (ret) {
            poll_unlink(p);
            poll_finish(p, 0, -ret);
            return;
        }
        exs__engine_io_start(&p->io, p->epfd, EV_READ, poll_io_cb);
        p->io_on = 1;
    }
    if (p->timeout_ms > 0) {
        exs__engine_timer_start(&p->timer, (uint64_t)p->timeout_ms, poll_timer_cb);
        p->timer_on = 1;
    }
}

/* Progress thread: look at every registered request (readiness may have changed). */
static void poll_round_hook(void)
{
    struct exs_list *pos, *next;

    if (!__atomic_load_n(&poll_nactive, __ATOMIC_RELAXED))
        return;
    for (pos = poll_active.next; pos != &poll_active; pos = next) {
        next = pos->next;
        poll_check(exs_list_entry(pos, struct api_poll, link));
    }
}

void exs__api_poll_kick(void)
{
    poll_round_hook();
}

/* Progress thread (exs__engine_call): a synchronous exs_poll was interrupted by a
 * signal: end it with EINTR unless it already ended. */
static void poll_cancel_fn(void *arg)
{
    struct api_poll *p = arg;

    if (__atomic_load_n(&p->done, __ATOMIC_ACQUIRE))
        return;
    poll_unlink(p);
    poll_finish(p, 0, EINTR);
}

struct poll_cancel_arg {
    exs_ahandle_t ah;
    int n;
};

/* Progress thread (exs__engine_call): end the asynchronous requests with this ahandle. */
static void poll_cancel_ah_fn(void *arg)
{
    struct poll_cancel_arg *a = arg;
    struct exs_list *pos, *next;

    for (pos = poll_active.next; pos != &poll_active; pos = next) {
        struct api_poll *p = exs_list_entry(pos, struct api_poll, link);

        next = pos->next;
        if (p->sync || p->ah != a->ah)
            continue;
        poll_unlink(p);
        poll_finish(p, 0, ECANCELED);
        a->n++;
    }
}

int exs__api_poll_cancel(exs_ahandle_t ah, int flags)
{
    struct poll_cancel_arg a = {.ah = ah};

    if (!exs__api_initialized() || flags)
        return exs__err(EINVAL);
    /* a request posted before this call has its start job queued before this one (the
     * jobs run in order): it is registered by the time the function runs */
    if (__atomic_load_n(&poll_npending, __ATOMIC_ACQUIRE))
        exs__engine_call(poll_cancel_ah_fn, &a);
    EXS_DBG(API, "poll: exs_cancel(-1, %p): %d requests cancelled", ah, a.n);
    return 0;
}

static void poll_close_all_fn(void *arg)
{
    struct exs_list *n;

    (void)arg;
    while ((n = poll_active.next) != &poll_active) {
        struct api_poll *p = exs_list_entry(n, struct api_poll, link);

        poll_unlink(p);
        poll_finish(p, 0, ECANCELED);
    }
}

void exs__api_poll_close_all(void)
{
    /* npending, not nactive: a start job still queued runs before this call's */
    if (__atomic_load_n(&poll_npending, __ATOMIC_ACQUIRE))
        exs__engine_call(poll_close_all_fn, NULL);
}

/* Post p's start job (counted as pending until its event). */
static void poll_start(struct api_poll *p)
{
    p->counted = 1;
    __atomic_fetch_add(&poll_npending, 1, __ATOMIC_RELEASE);
    p->job.fn = poll_start_job;
    exs__engine_post(&p->job);
}

/* ---- the call ---- */

/* Reserve p's slot in q. 0 or the errno for the application. */
static int poll_reserve(struct api_poll *p, exs_qhandle_t q)
{
    return exs__evq_reserve_handle(q, &p->evq);
}

/* The synchronous form once p must wait: on the thread's queue, until its event. */
static int poll_wait_sync_nc(struct api_poll *p)
{
    exs_qhandle_t q = exs__api_sync_queue();
    exs_event_t ev;
    int err, cancelled = 0;

    if (q == EXS_QHANDLE_INVALID) {
        poll_free(p);
        return exs__err(EINVAL);
    }
    err = poll_reserve(p, q);
    if (err) {
        poll_free(p);
        return exs__err(err);
    }
    p->sync = 1;
    poll_start(p);
    for (;;) {
        int n = exs_qdequeue(q, &ev, 1, NULL);

        if (n == 1)
            break;
        if (n < 0 && errno == EINTR) {
            if (!cancelled)
                exs__engine_call(poll_cancel_fn, p); /* the event is posted when it returns */
            cancelled = 1;
            continue;
        }
        if (n < 0) {
            /* the queue is gone: exs_fini ended p (ECANCELED) before it destroyed the
             * queues, and nothing else names p any more */
            int e = errno;

            if (!__atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) {
                /* cannot happen (only exs_fini destroys the queue): leave p */
                EXS_WARN(API, "poll %p: synchronous wait failed: %s", (void *)p, strerror(e));
                return exs__err(e);
            }
            EXS_DBG(API, "poll %p: queue gone at exs_fini", (void *)p);
            poll_free(p);
            return exs__err(ECANCELED);
        }
    }
    poll_free(p);
    if (ev.exs_evt_errno)
        return exs__err(ev.exs_evt_errno);
    return ev.exs_evt_u.exs_evt_poll.exs_evt_nready;
}

/* ... with cancellation off: p names the caller's array (spec/threading.md, "Thread
 * cancellation": a synchronous call is no cancellation point) */
static int poll_wait_sync(struct api_poll *p)
{
    int cs = exs__nc_begin(), ret = poll_wait_sync_nc(p);

    exs__nc_end(cs);
    return ret;
}

int exs_poll(exs_pollfd_t *fds, nfds_t nfds, int timeout_ms, exs_qhandle_t q, exs_ahandle_t ah)
{
    struct api_poll *p;
    int err = 0, n, sync = q == EXS_QHANDLE_INVALID;

    if (!exs__api_initialized())
        return exs__err(EINVAL);
    if ((!fds && nfds) || nfds > POLL_NFDS_MAX)
        return exs__err(EINVAL);
    if (timeout_ms < -1)
        timeout_ms = -1; /* as poll(2): any negative value waits without a limit */
    p = poll_new(fds, nfds, timeout_ms, &err);
    if (!p)
        return exs__err(err);
    p->ah = ah;
    if (sync && !p->nsock) {
        /* kernel descriptors only: poll(2) is the whole answer (EINTR included) */
        poll_free(p);
        return exs__nc_poll((struct pollfd *)(void *)fds, nfds, timeout_ms);
    }
    n = poll_eval(p);
    if (n < 0) {
        poll_free(p);
        return exs__err(-n);
    }
    if (sync) {
        if (n > 0 || timeout_ms == 0) {
            poll_free(p);
            return n;
        }
        return poll_wait_sync(p);
    }
    err = poll_reserve(p, q);
    if (err) {
        poll_free(p);
        return exs__err(err);
    }
    if (n > 0 || timeout_ms == 0) {
        poll_finish(p, n, 0);
        return 0;
    }
    poll_start(p);
    return 0;
}

/* ---- SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT notices ----
 *
 * An asynchronous send or receive posted while its socket has a timeout for that
 * direction is registered in sock->to_ops with its next due time. One engine timer per
 * socket (to_timer, armed for the earliest due time by to_job or by itself, on the
 * progress thread) posts the notices. Slots: the post reserves one extra slot in the
 * op's queue for its first notice (EAGAIN when the queue cannot take it: the contract
 * "an accepted operation's events are never dropped" covers the notice); each later
 * notice reserves its slot when due, and when the queue is full it is deferred by one
 * interval instead (it is a hint; nothing is dropped that was promised). The notices
 * and the completion are ordered under the socket's lock: op_done unregisters the op
 * before it posts the completion, and the timer posts only registered ops' notices, so
 * no notice follows its operation's event. */

static void to_job_fn(struct exs_job *job);

/* Queue to_job, which re-arms the timer (socket lock held). */
static void to_kick_locked(struct api_sock *s)
{
    if (s->to_job_busy)
        return;
    s->to_job_busy = 1;
    __atomic_fetch_add(&s->refs, 1, __ATOMIC_RELAXED); /* the job's reference */
    s->to_job.fn = to_job_fn;
    exs__engine_post(&s->to_job);
}

int exs__api_to_op_start(struct api_sock *s, struct api_op *op, int recv)
{
    int v, ret;

    api_sock_lock(s);
    v = recv ? s->rcv_timeo : s->snd_timeo;
    api_sock_unlock(s);
    if (!v)
        return 0;
    ret = exs__evq_reserve(op->evq);
    if (ret)
        return ret == -EAGAIN ? EAGAIN : EINVAL;
    op->to_armed = 1;
    exs__api_to_begin(&op->to, v);
    api_sock_lock(s);
    op->to.on = 1;
    exs_list_add_tail(&s->to_ops, &op->to.link);
    s->to_posting++;
    to_kick_locked(s);
    api_sock_unlock(s);
    return 0;
}

void exs__api_to_op_posted(struct api_sock *s)
{
    api_sock_lock(s);
    s->to_posting--;
    api_sock_unlock(s);
}

void exs__api_to_op_end(struct api_op *op)
{
    struct api_sock *s = op->sock;
    int slot;

    if (!op->to_armed)
        return;
    api_sock_lock(s);
    if (exs__api_to_unlist(&op->to, &s->to_ops))
        to_kick_locked(s); /* the timer stops */
    slot = op->to.slot;
    op->to.slot = 0;
    api_sock_unlock(s);
    if (slot)
        exs__evq_unreserve(op->evq);
}

static void to_timer_cb(struct exs_eng_timer *t);

/* Progress thread: arm the timer for the earliest notice due, or stop it (it holds a
 * reference on the socket while on; this may drop the last one). */
static void to_arm(struct api_sock *s)
{
    uint64_t next;

    api_sock_lock(s);
    next = exs__api_to_earliest(&s->to_ops);
    api_sock_unlock(s);
    switch (exs__api_to_timer_set(&s->to_timer, &s->to_timer_on, next, to_timer_cb)) {
    case 1:
        __atomic_fetch_add(&s->refs, 1, __ATOMIC_RELAXED); /* the timer's reference */
        break;
    case -1:
        exs__api_sock_put(s);
        break;
    default:
        break;
    }
}

void exs__api_to_begin(struct api_to *to, int v)
{
    uint64_t now = exs__now_ns();

    to->slot = 1;
    to->once = !!(v & EXS_TIMEOUT_ONCE);
    to->ms = (uint32_t)(v & EXS_TIMEOUT_MS_MAX);
    to->post_ns = now;
    to->due_ns = now + (uint64_t)to->ms * 1000000u;
}

int exs__api_to_unlist(struct api_to *to, const struct exs_list *head)
{
    if (!to->on)
        return 0;
    to->on = 0;
    exs_list_del(&to->link);
    return exs_list_empty(head);
}

uint64_t exs__api_to_earliest(const struct exs_list *head)
{
    uint64_t next = UINT64_MAX;
    const struct exs_list *pos;

    for (pos = head->next; pos != head; pos = pos->next) {
        const struct api_to *to = exs_list_entry(pos, struct api_to, link);

        if (to->due_ns < next)
            next = to->due_ns;
    }
    return next;
}

int exs__api_to_due(struct api_to *to, struct exs_evq *evq, uint64_t now, exs_event_t *ev)
{
    uint64_t ivl = (uint64_t)to->ms * 1000000u;

    if (to->due_ns > now)
        return 0;
    if (!to->slot) {
        if (exs__evq_reserve(evq)) {
            to->due_ns = now + ivl; /* the queue is full: the next interval */
            return 0;
        }
        to->slot = 1;
    }
    to->slot = 0;
    to->count++;
    ev->exs_evt_u.exs_evt_timeout.exs_evt_count = to->count;
    ev->exs_evt_u.exs_evt_timeout.exs_evt_elapsed_ms = (unsigned)((now - to->post_ns) / 1000000u);
    if (to->once) {
        to->on = 0;
        exs_list_del(&to->link);
    } else {
        to->due_ns += ivl;
        if (to->due_ns <= now)
            to->due_ns = now + ivl; /* late: no burst of notices */
    }
    return 1;
}

int exs__api_to_timer_set(struct exs_eng_timer *t, int *on, uint64_t next,
                          void (*cb)(struct exs_eng_timer *t))
{
    int was = *on;
    uint64_t now;

    if (was)
        exs__engine_timer_stop(t);
    if (next != UINT64_MAX) {
        now = exs__now_ns();
        *on = 1;
        exs__engine_timer_start(t, next > now ? (next - now + 999999u) / 1000000u : 1u, cb);
        return was ? 0 : 1;
    }
    *on = 0;
    return was ? -1 : 0;
}

static void to_job_fn(struct exs_job *job)
{
    struct api_sock *s = exs_container_of(job, struct api_sock, to_job);

    api_sock_lock(s);
    s->to_job_busy = 0;
    api_sock_unlock(s);
    to_arm(s);
    exs__api_sock_put(s); /* the job's reference */
}

/* Progress thread: post the notices due. */
static void to_timer_cb(struct exs_eng_timer *t)
{
    struct api_sock *s = exs_container_of(t, struct api_sock, to_timer);
    struct exs_list *pos, *next;
    uint64_t now = exs__now_ns();

    api_sock_lock(s);
    for (pos = s->to_ops.next; !s->to_posting && pos != &s->to_ops; pos = next) {
        struct api_op *op = exs_list_entry(pos, struct api_op, to.link);
        exs_event_t ev = {.exs_evt_fd = op->fd, .exs_evt_ahandle = op->ah};

        next = pos->next;
        if (!exs__api_to_due(&op->to, op->evq, now, &ev))
            continue;
        /* by direction: exs_sendmsg / exs_sendfile are sends too */
        ev.exs_evt_type = op->op.kind == EXS_OP_SEND ? EXS_EVT_SENDTIMEOUT : EXS_EVT_RECVTIMEOUT;
        ev.exs_evt_u.exs_evt_timeout.exs_evt_buf = op->op.buf;
        ev.exs_evt_u.exs_evt_timeout.exs_evt_len = op->op.len;
        exs__evq_post(op->evq, &ev);
    }
    api_sock_unlock(s);
    to_arm(s); /* still on (it fired): re-armed, or stopped with its reference */
}

/* A forked child (fork.c, the progress lock was held across the fork): the parent's
 * requests are dropped unused; the child's copies of their epoll sets are closed. */
void exs__api_poll_fork_child(void)
{
    struct exs_list *n;

    exs_list_for_each(n, &poll_active)
    {
        struct api_poll *p = exs_list_entry(n, struct api_poll, link);

        exs__forsake(p);
        if (p->epfd >= 0)
            exs__nc_close(p->epfd);
        p->epfd = -1;
    }
    exs_list_init(&poll_active);
    poll_nactive = poll_npending = poll_live = 0;
}
