/* SPDX-License-Identifier: MIT */
/* The event queue's own state, shared by evq.c (handles, posting, waiting) and evq_attr.c
 * (the wait mode and the UNH EXS queue attributes). Locking and descriptors: evq.c's
 * header comment. */
#ifndef EXS_API_EVQ_INT_H
#define EXS_API_EVQ_INT_H

#include <pthread.h>

#include "exs/api/lite_lock.h"
#include <stdint.h>

#include <sys/exs.h>

/* A thread sleeping in a threshold dequeue (nevents < 0); lives on its stack. wfd is
 * readable while the smallest threshold is met, so a waiter with a larger one spins
 * through ppoll until that waiter has taken its events (a short, rare window). */
struct evq_waiter {
    int want; /* events it needs queued before it wakes */
    struct evq_waiter *next;
    struct evq_waiter *prev;
};

/* evq->st: the handle, dead, and the count of slots ever reserved (32 bits, wrapping) */
#define EVQ_ST_RES_MASK     0xffffffffull
#define EVQ_ST_DEAD         (1ull << 32)
#define EVQ_ST_HANDLE_SHIFT 33

struct exs_evq {
    /* Read without the lock by a reservation and a lookup (evq.c: a queue's memory is
     * parked, never freed, before exs_fini): lock, st, depth and freed, which are written
     * with atomic stores; the rest is cleared when a parked queue is reused. */
    struct exs_lite_lock lock;
    uint64_t st;               /* atomic: EVQ_ST_*; reservations add 1 with a CAS, no lock */
    int depth;                 /* atomic store at creation */
    uint32_t freed;            /* atomic store under lock: slots given back (events taken, dropped,
                                * reservations abandoned); reserved = res - freed - queued */
    struct exs_evq *free_next; /* evq_free_lock: parked */
    int refs;                  /* atomic; the table's, gets and waiters */
    exs_qhandle_t handle;
    exs_event_t *ring; /* depth entries, oldest at ring[head] */
    int head;
    int queued; /* written under lock with atomic stores (spinners read it) */
    int orphan; /* lock: killed by exs_fini with slots reserved: the table's reference
                 * goes with the last of them */
    int dead;   /* atomic store under lock: exs_qdelete ran */
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
