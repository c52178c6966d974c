/* SPDX-License-Identifier: MIT */
/* The event queue's own state, shared by evq.c (handles, posting, waiting) and evq_attr.c
 * (the wait mode and the UNH EXS queue attributes). Locking and descriptors: evq.c's
 * header comment. */
#ifndef EXS_API_EVQ_INT_H
#define EXS_API_EVQ_INT_H

#include <pthread.h>

#include <sys/exs.h>

/* A thread sleeping in a threshold dequeue (nevents < 0); lives on its stack. wfd is
 * readable while the smallest threshold is met, so a waiter with a larger one spins
 * through ppoll until that waiter has taken its events (a short, rare window). */
struct evq_waiter {
    int want; /* events it needs queued before it wakes */
    struct evq_waiter *next;
    struct evq_waiter *prev;
};

struct exs_evq {
    pthread_mutex_t lock;
    int refs; /* atomic; the table, gets and reservations */
    exs_qhandle_t handle;
    int depth;
    exs_event_t *ring; /* depth entries, oldest at ring[head] */
    int head;
    int queued;   /* written under lock with atomic stores (spinners read it) */
    int reserved; /* slots promised to outstanding operations */
    int dead;     /* atomic store under lock: exs_qdelete ran */
    int qfd;
    int qfd_on; /* qfd counter is 1 */
    int wfd;    /* -1 until the first threshold wait */
    int wfd_on;
    struct evq_waiter *waiters; /* threshold waiters */
    int want_min;               /* smallest want among them, INT_MAX when none */
    int private_;               /* a thread's synchronous-call queue (not counted live) */
    int exposed;                /* exs_qfd was called: qfd is kept exact */
    int sleepers;               /* threads about to sleep or asleep on qfd / wfd */
    int mode;                   /* atomic: EXS_WAIT_* */
    int spin_us;                /* atomic: adaptive spin, 0 = default */
};

/* The operation block cache (op_cache.c): size zeroed bytes, from this thread's cache of
 * EXS_EVQ_OP_BLOCK-sized blocks when size fits; freed by exs__evq_op_free. */
void *exs__evq_op_alloc(size_t size);

#endif /* EXS_API_EVQ_INT_H */
