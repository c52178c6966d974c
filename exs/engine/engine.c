/* SPDX-License-Identifier: MIT */
/* The progress thread: a libev loop over the provider's event descriptor plus a job queue. */
#include <errno.h>
#include <ev.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "exs/engine/engine.h"
#include "exs/util/list.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

#define ENG_CQE_BATCH 64

static struct {
    struct exs_prov_ctx *ctx;
    struct ev_loop      *loop;
    ev_io                prov_io;
    ev_async             wake;
    pthread_t            thread;
    pthread_mutex_t      lock; /* jobs, stopping */
    struct exs_list      jobs;
    int                  stopping;
    int                  running;
} eng = { .lock = PTHREAD_MUTEX_INITIALIZER };

static __thread int eng_is_progress_thread;

struct exs_prov_ctx *exs__engine_ctx(void)
{
    return eng.ctx;
}

int exs__engine_on_thread(void)
{
    return eng_is_progress_thread;
}

static void eng_dispatch_cm(const struct exs_prov_cm_event *ev)
{
    if (ev->type == EXS_PROV_CM_CONNECT_REQUEST) {
        struct exs_eng_listener *lis = ev->listener->user;

        lis->on_request(lis, ev);
        return;
    }
    if (ev->ep && ev->ep->user)
        exs__conn_on_cm(ev->ep->user, ev);
}

/* Hand every queued completion to its connection; returns how many. */
static int eng_drain_cq(void)
{
    struct exs_prov_cqe cqe[ENG_CQE_BATCH];
    int n, total = 0;

    while ((n = exs__prov_poll(eng.ctx, cqe, ENG_CQE_BATCH)) > 0) {
        for (int i = 0; i < n; i++)
            exs__conn_on_cqe(cqe[i].ep->user, &cqe[i]);
        total += n;
    }
    return total;
}

/* Drain completions and connection events until both queues are empty and the event
 * descriptor is armed again. Completions go first, and the queue is emptied again just
 * before each connection event: a DISCONNECTED must not overtake the completions of the
 * data and the SHUTDOWN that the peer sent before it. */
static void eng_drain(void)
{
    struct exs_prov_cm_event ev;

    for (;;) {
        int n, m = 0;

        if (exs__prov_progress(eng.ctx) < 0)
            EXS_ERR(ENG, "provider progress failed");
        n = eng_drain_cq();

        while (exs__prov_cm_poll(eng.ctx, &ev) == 1) {
            eng_drain_cq();
            eng_dispatch_cm(&ev);
            m++;
        }
        if (n > 0 || m > 0)
            continue;
        if (exs__prov_arm(eng.ctx) != -EAGAIN)
            break;
    }
}

static void eng_run_jobs(void)
{
    for (;;) {
        struct exs_list *n;

        pthread_mutex_lock(&eng.lock);
        n = exs_list_pop_head(&eng.jobs);
        pthread_mutex_unlock(&eng.lock);
        if (!n)
            break;
        struct exs_job *job = exs_list_entry(n, struct exs_job, link);

        job->queued = 0;
        job->fn(job); /* may free the job's object */
    }
}

static void eng_prov_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    eng_drain();
    eng_run_jobs();
}

static void eng_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    (void)w;
    (void)revents;
    eng_run_jobs();
    eng_drain();
    pthread_mutex_lock(&eng.lock);
    int stop = eng.stopping && exs_list_empty(&eng.jobs);
    pthread_mutex_unlock(&eng.lock);
    if (stop)
        ev_break(loop, EVBREAK_ALL);
}

static void *eng_main(void *arg)
{
    (void)arg;
    eng_is_progress_thread = 1;
    eng_drain();
    ev_run(eng.loop, 0);
    return NULL;
}

int exs__engine_start(void)
{
    int ret;

    exs_list_init(&eng.jobs);
    ret = exs__prov_open_default(&(struct exs_prov_attr){.flags = EXS_PROV_ATTR_MANUAL_PROGRESS},
                                 &eng.ctx);
    if (ret)
        return ret;
    eng.loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!eng.loop) {
        ret = -ENOMEM;
        goto err_close;
    }
    ev_io_init(&eng.prov_io, eng_prov_cb, exs__prov_ctx_event_fd(eng.ctx), EV_READ);
    ev_io_start(eng.loop, &eng.prov_io);
    ev_async_init(&eng.wake, eng_async_cb);
    ev_async_start(eng.loop, &eng.wake);
    eng.stopping = 0;
    ret = -pthread_create(&eng.thread, NULL, eng_main, NULL);
    if (ret)
        goto err_loop;
    eng.running = 1;
    EXS_INFO(ENG, "engine started on provider %s", exs__prov_name(eng.ctx));
    return 0;

err_loop:
    ev_loop_destroy(eng.loop);
    eng.loop = NULL;
err_close:
    exs__prov_ctx_close(eng.ctx);
    eng.ctx = NULL;
    return ret;
}

void exs__engine_stop(void)
{
    if (!eng.running)
        return;
    pthread_mutex_lock(&eng.lock);
    eng.stopping = 1;
    pthread_mutex_unlock(&eng.lock);
    ev_async_send(eng.loop, &eng.wake);
    pthread_join(eng.thread, NULL);
    eng_run_jobs();
    ev_loop_destroy(eng.loop);
    eng.loop = NULL;
    exs__prov_ctx_close(eng.ctx);
    eng.ctx = NULL;
    eng.running = 0;
}

void exs__engine_post(struct exs_job *job)
{
    pthread_mutex_lock(&eng.lock);
    EXS_ASSERT(!job->queued);
    job->queued = 1;
    exs_list_add_tail(&eng.jobs, &job->link);
    pthread_mutex_unlock(&eng.lock);
    ev_async_send(eng.loop, &eng.wake);
}

struct eng_call {
    struct exs_job  job;
    void          (*fn)(void *arg);
    void           *arg;
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    int             done;
};

static void eng_call_job(struct exs_job *job)
{
    struct eng_call *c = exs_container_of(job, struct eng_call, job);

    c->fn(c->arg);
    pthread_mutex_lock(&c->lock);
    c->done = 1;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void exs__engine_call(void (*fn)(void *arg), void *arg)
{
    struct eng_call c = { .job = { .fn = eng_call_job }, .fn = fn, .arg = arg };

    EXS_ASSERT(!eng_is_progress_thread);
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cond, NULL);
    exs__engine_post(&c.job);
    pthread_mutex_lock(&c.lock);
    while (!c.done)
        pthread_cond_wait(&c.cond, &c.lock);
    pthread_mutex_unlock(&c.lock);
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.lock);
}

static void eng_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct exs_eng_timer *t = exs_container_of(w, struct exs_eng_timer, w);

    (void)loop;
    (void)revents;
    t->cb(t);
}

void exs__engine_timer_start(struct exs_eng_timer *t, uint64_t ms,
                             void (*cb)(struct exs_eng_timer *t))
{
    EXS_ASSERT(eng_is_progress_thread);
    t->cb = cb;
    ev_timer_init(&t->w, eng_timer_cb, (double)ms / 1000.0, 0.);
    ev_timer_start(eng.loop, &t->w);
}

void exs__engine_timer_stop(struct exs_eng_timer *t)
{
    EXS_ASSERT(eng_is_progress_thread);
    if (t->cb)
        ev_timer_stop(eng.loop, &t->w);
}

int exs__engine_listen(struct exs_eng_listener *lis, const struct sockaddr *addr,
                       socklen_t addrlen, int backlog)
{
    return exs__prov_listen(eng.ctx, addr, addrlen, backlog, lis, &lis->pl);
}

void exs__engine_listener_destroy(struct exs_eng_listener *lis)
{
    EXS_ASSERT(eng_is_progress_thread);
    if (lis->pl)
        exs__prov_listener_destroy(lis->pl);
    lis->pl = NULL;
}
