/* SPDX-License-Identifier: MIT */
/* The engine: one provider context, the progress lock, and a progress thread running a libev loop. */
#ifndef EXS_ENGINE_ENGINE_H
#define EXS_ENGINE_ENGINE_H

#include <ev.h>
#include <stdint.h>

#include "exs/proto/proto.h"
#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/job.h"

/*
 * Progress is a role held through the progress lock (spec/threading.md): its holder
 * drains the provider's completion and connection event queues, handing each completion
 * to its connection (exs__conn_on_cqe) and each connection event to its connection or
 * listener, and runs jobs other threads queue. Application threads that wait
 * (exs_qdequeue, synchronous calls) take it and drive; the progress thread (a libev
 * loop) takes it outside its blocking poll, and watches the provider only while no
 * application thread is waiting. Everything that frees a connection or a listener runs
 * under it, so no provider event can name a freed object. "On the progress thread" in
 * comments means "with the progress lock held".
 */

/* Engine counters (set "engine"), relaxed atomic increments. */
struct exs_eng_counters {
    uint64_t drives_app;     /* drives by application threads that found work */
    uint64_t drives_thread;  /* drives by the progress thread that found work */
    uint64_t lease_handoffs; /* the progress thread took the provider back */
    uint64_t lease_idles;    /* leases stopped: the same drivers waited a whole lease */
    uint64_t evq_fd_writes;  /* event queue eventfd writes (api/evq.c) */
};
extern struct exs_eng_counters exs__eng_cnt;

/* A listening endpoint owned by the api layer. */
struct exs_eng_listener {
    struct exs_prov_listener *pl;
    /* progress thread: a connection request (ev->req, peer address, private data);
     * must accept or reject ev->req before returning */
    void (*on_request)(struct exs_eng_listener *lis, const struct exs_prov_cm_event *ev);
};

/* Open the provider and start the progress thread. Errors: provider errors, -ENOMEM. */
int  exs__engine_start(void);
/* Stop the thread and close the provider (every conn and listener must be gone). */
void exs__engine_stop(void);
struct exs_prov_ctx *exs__engine_ctx(void);

/* Run job->fn(job) on the progress thread soon (from any thread, also from the progress
 * thread itself: then after the current dispatch). Cannot fail: the job lives in the
 * object it works on (exs/util/job.h); it must not be queued already. */
void exs__engine_post(struct exs_job *job);
/* Run fn(arg) on the progress thread and wait for it (not from the progress thread). */
void exs__engine_call(void (*fn)(void *arg), void *arg);
/* 1 when this thread holds the progress lock. */
int  exs__engine_on_thread(void);
/* 1 when the provider was opened with EXS_PROV_ATTR_MANUAL_PROGRESS. */
int  exs__engine_manual(void);

/* Drive progress from an application thread: take the progress lock (with
 * EXS_ENG_DRIVE_TRY only if free), run the provider, completions, cm events and jobs
 * until nothing is left or a bound is reached, release. Returns how much it did (>= 0),
 * or -EBUSY (TRY and another thread holds the lock: it is driving). Returns 0 at once
 * when the engine is not running or this thread already holds the lock. Never waits
 * for a remote, only for another holder's turn. */
#define EXS_ENG_DRIVE_TRY 1
int  exs__engine_drive(int flags);
/* Before a waiter sleeps: under the progress lock, arm the provider. 0: sleep (*fd_p is
 * the provider's event fd, readable when there is work; -1 when the engine is not
 * running); -EAGAIN: work is pending (completions or jobs), drive again. */
int  exs__engine_arm(int *fd_p);
/* Count the application threads inside a wait (they drive, so the progress thread
 * stops watching the provider until they are all gone for one lease). */
void exs__engine_driver_enter(void);
void exs__engine_driver_leave(void);

/* A function the progress lock's holder calls after each round of progress that did
 * something (completions, connection events, jobs): readiness may have changed
 * (exs_poll, api/poll.c). Set once; NULL: none. It must not drive. */
void exs__engine_set_round_hook(void (*fn)(void));

/* A one-shot timer of the progress loop. Start and stop with the progress lock held
 * (from a job or a callback); cb runs on the progress thread. */
struct exs_eng_timer {
    ev_timer w;
    void   (*cb)(struct exs_eng_timer *t);
};
void exs__engine_timer_start(struct exs_eng_timer *t, uint64_t ms,
                             void (*cb)(struct exs_eng_timer *t));
void exs__engine_timer_stop(struct exs_eng_timer *t);

/* A descriptor watched by the progress loop (the control endpoint, api/ctl.c; the
 * library's epoll set of the application's kernel sockets, api/kfd.c). Start, change and
 * stop with the progress lock held; cb runs on the progress thread with the lock held,
 * with EV_READ / EV_WRITE in revents (EV_ERROR when libev found the descriptor invalid:
 * it stopped the watcher itself). events: EV_READ | EV_WRITE. Stop it before the
 * descriptor is closed. */
struct exs_eng_io {
    ev_io w;
    void (*cb)(struct exs_eng_io *io, int revents);
};
void exs__engine_io_start(struct exs_eng_io *io, int fd, int events,
                          void (*cb)(struct exs_eng_io *io, int revents));
void exs__engine_io_stop(struct exs_eng_io *io);

int  exs__engine_listen(struct exs_eng_listener *lis, const struct sockaddr *addr,
                        socklen_t addrlen, int backlog);
/* Progress thread only. */
void exs__engine_listener_destroy(struct exs_eng_listener *lis);

#endif
