/* SPDX-License-Identifier: MIT */
/* Process exit: open connections end as a kernel socket's would (queued data, then end of
 * stream), bounded by a linger time; SO_LINGER. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/*
 * A kernel TCP socket still open at exit() is closed by the kernel, which sends what was
 * queued and then a FIN: the peer reads every byte, then end of stream. A libexs
 * connection has no kernel to finish it, so at a normal exit (exit(), return from main:
 * an atexit handler registered by the first exs_init of the process) the library does it
 * (spec/api.md section 2, "Exit"):
 *
 *   1. every CONNECTED socket gets an exs_shutdown(SHUT_WR): queued behind its sends, so
 *      the SHUTDOWN record leaves once they are delivered;
 *   2. each one whose shutdown event came is closed gracefully (exs_close);
 *   3. the wait for those events ends at the socket's linger deadline: SO_LINGER's
 *      l_linger seconds when the socket set l_onoff, else EXS_EXIT_LINGER_MS; a socket
 *      with l_onoff and l_linger 0, or with linger 0, is not waited for;
 *   kernel sockets (kfd.c) with sends still queued in the library get a flush mark behind
 *      them and are waited for until it passes (EXS_EXIT_LINGER_MS): their bytes reach
 *      the kernel, which sends them and ends the socket with the process, as it does for
 *      bytes a plain send() gave it;
 *   4. exs_fini: whatever is left (not connected, not finished in time) is reset, as
 *      before (the peer sees ECONNRESET, as it does when the process is killed).
 *
 * The handler does nothing in a process that did not initialize the library itself (a
 * forked child that did not call exs_init: fork.c made it uninitialized; a child made by
 * a fork without handlers: the pid differs), nor after exs_fini. The work runs in a
 * thread of its own and the exiting thread waits for it at most the longest linger plus
 * EXS_CLOSE_TIMEOUT_MS and a second: exit() called where the library cannot go on (a
 * signal handler that interrupted a library call holding its locks) returns after that
 * bound instead of hanging; the connections are then reset by the process's end.
 */

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static pid_t exit_pid; /* the process whose exs_init registered the handler (atomic) */

/* The exit's work, shared by the exiting thread and the one doing it. */
struct exit_run {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    uint64_t bound_ns; /* lock: the exiting thread waits until then at most */
    int refs;          /* the handler and the thread: the last one frees it */
};

/* One socket lingering. */
struct exit_sock {
    int fd;
    int state;         /* EXIT_* */
    uint64_t deadline; /* exs__now_ns() */
    int kernel;        /* a kernel socket: only its queued sends are waited for */
};
enum { EXIT_SKIP, EXIT_SHUTTING, EXIT_CLOSING, EXIT_DONE };

static int exit_has_linger(struct api_sock *s, uint64_t *ms_p)
{
    if (s->linger_set && s->linger_on) {
        *ms_p = (uint64_t)s->linger_s * 1000u;
        return *ms_p > 0;
    }
    *ms_p = exs__params.exit_linger_ms;
    return *ms_p > 0;
}

/* Steps 1-3. Returns when every socket it waited for closed or passed its deadline. The
 * latest deadline (plus what exs_fini may take) goes to r's bound. */
static void exit_linger(struct exit_run *r)
{
    struct api_sock **all = NULL;
    struct exit_sock *e;
    exs_event_t evs[16];
    exs_qhandle_t q;
    int n = 0, nk, waiting = 0, *kfds = NULL;
    uint64_t last = 0;

    if (exs__api_sock_list(&all, &n))
        n = 0;
    nk = exs__api_kfd_fds(&kfds);
    if (nk < 0)
        nk = 0;
    if (n + nk == 0) {
        free(all);
        free(kfds);
        return;
    }
    e = calloc((size_t)(n + nk), sizeof(*e));
    /* two events a socket (shutdown, close), one a kernel socket (its flush); past the
     * deepest queue the rest reset */
    q = e ? exs_qcreate(EXS_MIN(2 * n + nk + 1, 1 << 20)) : EXS_QHANDLE_INVALID;
    for (int i = 0; i < n; i++) {
        struct api_sock *s = all[i];
        uint64_t ms = 0;
        int go;

        api_sock_lock(s);
        go = e && s->state == API_SOCK_CONNECTED && exit_has_linger(s, &ms);
        if (e)
            e[i].fd = s->fd;
        api_sock_unlock(s);
        if (go && q != EXS_QHANDLE_INVALID &&
            exs_shutdown(e[i].fd, SHUT_WR, q, (exs_ahandle_t)(uintptr_t)(i + 1)) == 0) {
            e[i].state = EXIT_SHUTTING;
            e[i].deadline = exs__now_ns() + ms * 1000000u;
            last = EXS_MAX(last, e[i].deadline);
            waiting++;
        }
        exs__api_sock_put(s);
    }
    /* Kernel sockets: the sends still queued in the library are written first, as the
     * kernel would have taken them at send(); the socket itself stays the application's
     * (the kernel ends it with the process). Bounded by EXS_EXIT_LINGER_MS. */
    for (int j = 0; e && q != EXS_QHANDLE_INVALID && j < nk && exs__params.exit_linger_ms; j++) {
        int i = n + j;

        e[i].fd = kfds[j];
        e[i].kernel = 1;
        if (exs__api_kfd_flush(kfds[j], q, (exs_ahandle_t)(uintptr_t)(i + 1)) == 0) {
            e[i].state = EXIT_SHUTTING;
            e[i].deadline = exs__now_ns() + (uint64_t)exs__params.exit_linger_ms * 1000000u;
            last = EXS_MAX(last, e[i].deadline);
            waiting++;
        }
    }
    free(kfds);
    n += nk;
    free(all);
    if (r && last) {
        pthread_mutex_lock(&r->lock);
        r->bound_ns =
            EXS_MAX(r->bound_ns, last + (exs__params.close_timeout_ms + 1000u) * 1000000u);
        pthread_cond_signal(&r->cond);
        pthread_mutex_unlock(&r->lock);
    }
    while (waiting > 0) {
        uint64_t now = exs__now_ns(), next = UINT64_MAX;
        struct timespec ts;
        int got;

        for (int i = 0; i < n; i++) {
            if (e[i].state != EXIT_SHUTTING && e[i].state != EXIT_CLOSING)
                continue;
            if (e[i].deadline <= now) {
                /* too late: exs_fini resets it (a close under way ends by itself) */
                EXS_INFO(API, "fd %d: exit linger over, %s", e[i].fd,
                         e[i].kernel                   ? "queued sends on a kernel socket dropped"
                         : e[i].state == EXIT_SHUTTING ? "queued sends not delivered: reset"
                                                       : "close not finished");
                e[i].state = EXIT_DONE;
                waiting--;
                continue;
            }
            next = EXS_MIN(next, e[i].deadline);
        }
        if (waiting == 0)
            break;
        ts.tv_sec = (time_t)((next - now) / 1000000000u);
        ts.tv_nsec = (long)((next - now) % 1000000000u);
        got = exs_qdequeue(q, evs, (int)EXS_ARRAY_SIZE(evs), &ts);
        if (got < 0 && errno != EINTR)
            break;
        for (int k = 0; k < got; k++) {
            int i = (int)(uintptr_t)evs[k].exs_evt_ahandle - 1;

            if (i < 0 || i >= n || e[i].state == EXIT_DONE)
                continue;
            if (evs[k].exs_evt_type == EXS_EVT_SHUTDOWN && e[i].state == EXIT_SHUTTING &&
                !e[i].kernel && exs_close(e[i].fd, q, evs[k].exs_evt_ahandle) == 0) {
                e[i].state = EXIT_CLOSING;
                continue;
            }
            e[i].state = EXIT_DONE; /* closed, or could not be closed: exs_fini's */
            waiting--;
        }
    }
    free(e);
    /* exs_fini deletes q with the rest */
}

static void exit_run_put(struct exit_run *r)
{
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL))
        return;
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static void *exit_main(void *arg)
{
    struct exit_run *r = arg;

    exit_linger(r);
    __atomic_store_n(&exs__fini_keep_memory, 1, __ATOMIC_RELAXED);
    exs_fini();
    pthread_mutex_lock(&r->lock);
    r->done = 1;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    exit_run_put(r);
    return NULL;
}

/* with cancellation off (spec/threading.md, "Thread cancellation"): its waits name r */
static void exit_handle(void);

static void exit_handler(void)
{
    int cs = exs__nc_begin();

    exit_handle();
    exs__nc_end(cs);
}

static void exit_handle(void)
{
    struct exit_run *r;
    pthread_condattr_t ca;
    pthread_t t;
    int done;

    if (!exs__api_initialized() || __atomic_load_n(&exit_pid, __ATOMIC_RELAXED) != getpid())
        return;
    r = calloc(1, sizeof(*r));
    if (!r) {
        exit_linger(NULL);
        __atomic_store_n(&exs__fini_keep_memory, 1, __ATOMIC_RELAXED);
        exs_fini();
        return;
    }
    r->refs = 2;
    /* until the sockets' deadlines are known: the default linger, then exs_fini's wait */
    r->bound_ns = exs__now_ns() +
                  (exs__params.exit_linger_ms + exs__params.close_timeout_ms + 1000u) * 1000000u;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&t, NULL, exit_main, r)) {
        r->refs = 1;
        exit_main(r); /* no thread: here, unbounded */
        return;
    }
    pthread_mutex_lock(&r->lock);
    while (!r->done) {
        struct timespec until = {.tv_sec = (time_t)(r->bound_ns / 1000000000u),
                                 .tv_nsec = (long)(r->bound_ns % 1000000000u)};

        if (pthread_cond_timedwait(&r->cond, &r->lock, &until) == ETIMEDOUT && /* nocancel: ok */
            exs__now_ns() >= r->bound_ns)
            break;
    }
    done = r->done;
    pthread_mutex_unlock(&r->lock);
    if (done) {
        pthread_join(t, NULL); /* nocancel: ok; gone before the process's own exit handlers run */
    } else {
        EXS_WARN(API, "exit: the library did not finish in time: connections reset");
        pthread_detach(t);
    }
    exit_run_put(r);
}

static void exit_register(void)
{
    if (atexit(exit_handler))
        EXS_WARN(API, "atexit: connections open at exit will be reset");
}

void exs__api_exit_setup(void)
{
    __atomic_store_n(&exit_pid, getpid(), __ATOMIC_RELAXED);
    pthread_once(&exit_once, exit_register);
}

/* ---- SO_LINGER ---- */

int exs__api_linger_set(struct api_sock *s, const void *optval, socklen_t optlen)
{
    struct linger l;

    if (!optval || optlen < sizeof(l))
        return EINVAL;
    memcpy(&l, optval, sizeof(l));
    if (l.l_linger < 0)
        return EINVAL;
    s->linger_set = 1;
    s->linger_on = l.l_onoff != 0;
    s->linger_s = l.l_linger;
    return 0;
}

int exs__api_linger_get(struct api_sock *s, void *optval, socklen_t *optlen)
{
    struct linger l = {.l_onoff = s->linger_on, .l_linger = s->linger_s};

    if (*optlen < sizeof(l))
        return EINVAL;
    memcpy(optval, &l, sizeof(l));
    *optlen = sizeof(l);
    return 0;
}
