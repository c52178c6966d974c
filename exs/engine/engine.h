/* SPDX-License-Identifier: MIT */
/* The verbs engine: one provider context and a progress thread running a libev loop. */
#ifndef EXS_ENGINE_ENGINE_H
#define EXS_ENGINE_ENGINE_H

#include <ev.h>
#include <stdint.h>

#include "exs/proto/proto.h"
#include "exs/prov/prov.h"
#include "exs/util/job.h"

/*
 * The progress thread drains the provider's completion and connection event queues,
 * handing each completion to its connection (exs__conn_on_cqe) and each connection
 * event to its connection or listener, and runs jobs other threads queue. Everything
 * that frees a connection or a listener runs there, so no provider event can name a
 * freed object.
 */

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
/* 1 when called on the progress thread. */
int  exs__engine_on_thread(void);

/* A one-shot timer of the progress loop. Start and stop on the progress thread only
 * (from a job or a callback); cb runs there. */
struct exs_eng_timer {
    ev_timer w;
    void   (*cb)(struct exs_eng_timer *t);
};
void exs__engine_timer_start(struct exs_eng_timer *t, uint64_t ms,
                             void (*cb)(struct exs_eng_timer *t));
void exs__engine_timer_stop(struct exs_eng_timer *t);

int  exs__engine_listen(struct exs_eng_listener *lis, const struct sockaddr *addr,
                        socklen_t addrlen, int backlog);
/* Progress thread only. */
void exs__engine_listener_destroy(struct exs_eng_listener *lis);

#endif
