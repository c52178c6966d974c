/* SPDX-License-Identifier: MIT */
/* The event queue's own state, shared by evq.c (handles, posting, waiting) and evq_attr.c
 * (the wait mode and the UNH EXS queue attributes). Locking and descriptors: evq.c's
 * header comment. */
#ifndef EXS_API_EVQ_INT_H
#define EXS_API_EVQ_INT_H

#include <pthread.h>

#include "exs/api/evq.h"
#include "exs/util/lockorder.h"
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "exs/util/log.h"
#include "exs/util/util.h"

#include <sys/exs.h>

/*
 * An event queue's lock (evq->lock): a spin lock that yields. Taking a free one is one
 * CAS; giving it back is a plain release store, no locked instruction (the futex mutex of
 * lite_lock.h gives back with an exchange, to see whether a waiter sleeps in the kernel:
 * a post and a take paid two locked instructions each for it, now one; issue 28). A
 * waiter is not woken: it looks again, with a pause, then yielding its CPU, then napping
 * 50 us in the kernel between looks (exs__evq_lock_wait). That is sound because every
 * hold is short and waits for nothing but its CPU: the ring, the counts, the waiters'
 * list, and the queue's eventfds (non-blocking writes and reads, an eventfd's creation);
 * no other lock of the library is taken inside but the log's (spec/threading.md).
 * Memory: a zeroed one is free.
 */
struct exs_evq_lock {
    int v; /* atomic: 0 free, 1 held */
};

void exs__evq_lock_wait(struct exs_evq_lock *l);
/* Naps taken by waiters for a queue's lock (exs__evq_lock_wait; tests). */
extern unsigned long exs__evq_lock_naps __attribute__((visibility("hidden")));

static inline __attribute__((always_inline)) int exs__evq_trylock(struct exs_evq_lock *l)
{
    int c = 0;

    return __atomic_compare_exchange_n(&l->v, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static inline __attribute__((always_inline)) void exs__evq_lock(struct exs_evq_lock *l)
{
    if (!exs__evq_trylock(l))
        exs__evq_lock_wait(l);
}

static inline __attribute__((always_inline)) void exs__evq_unlock(struct exs_evq_lock *l)
{
    __atomic_store_n(&l->v, 0, __ATOMIC_RELEASE);
}

/* evq->lock taken and given back, with the lock-order checks (lockorder.h) */
#define EVQ_LOCK(_evq)                                                                             \
    do {                                                                                           \
        EXS_LOCK_ACQUIRE(EXS_LOCK_EVQ);                                                            \
        exs__evq_lock(&(_evq)->lock);                                                              \
    } while (0)
#define EVQ_UNLOCK(_evq)                                                                           \
    do {                                                                                           \
        exs__evq_unlock(&(_evq)->lock);                                                            \
        EXS_LOCK_RELEASE(EXS_LOCK_EVQ);                                                            \
    } while (0)

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
    struct exs_evq_lock lock;
    uint64_t st;    /* atomic: EVQ_ST_*; reservations add 1 with a CAS, no lock */
    int depth;      /* atomic store at creation */
    uint32_t freed; /* atomic store under lock: slots given back (events taken, dropped,
                     * reservations abandoned); reserved = res - freed - queued */
    int refs;       /* atomic; the table's, gets and waiters; 0: parked (a get
                     * may raise it only from 1 up) */
    /* Also read without the lock, by a wait that holds no reference (evq.c,
     * evq_dequeue_rest): reset with atomic stores when a parked queue is reused. */
    int queued;                /* written under lock with atomic stores (spinners read it) */
    int dead;                  /* atomic store under lock: exs_qdelete ran */
    int mode;                  /* atomic: EXS_WAIT_* */
    int spin_us;               /* atomic: adaptive spin, 0 = default */
    int spin_learn;            /* atomic: the queue waits as a new one does (ADAPTIVE with
                                * EXS_QWAIT_SPIN_US: exs__evq_wait_is_default), so its spin
                                * may grow up to EXS_QWAIT_SPIN_MAX_US by its waits (evq.c) */
    uint32_t spin_seen_ns;     /* atomic (relaxed; a heuristic): the learned spin's average */
    uint32_t spin_waits;       /* atomic (relaxed): waits that learned, for the probes */
    struct exs_evq *free_next; /* evq_free_lock: parked */
    exs_qhandle_t handle;
    exs_event_t *ring; /* depth entries, oldest at ring[head] */
    int head;
    int orphan; /* lock: killed by exs_fini with slots reserved: the table's reference
                 * goes with the last of them */
    int qfd;
    int qfd_on; /* qfd counter is 1 */
    int wfd;    /* -1 until the first threshold wait */
    int wfd_on;
    struct evq_waiter *waiters; /* threshold waiters */
    int want_min;               /* smallest want among them, INT_MAX when none */
    int private_;               /* a thread's synchronous-call queue (not counted live) */
    int exposed;                /* exs_qfd was called: qfd is kept exact */
    int sleepers;               /* threads about to sleep or asleep on qfd / wfd */
};

/* The operation block cache (op_cache.c): size zeroed bytes, from this thread's cache of
 * EXS_EVQ_OP_BLOCK-sized blocks when size fits; freed by exs__evq_op_free. */
void *exs__evq_op_alloc(size_t size);

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) ||                               \
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EXS_OP_CACHE_MAX 0 /* every block to free(): the sanitizers see each use after free */
#else
#define EXS_OP_CACHE_MAX 64
#endif

#if EXS_OP_CACHE_MAX > 0
struct exs_op_block {
    struct exs_op_block *next;
};

/* A thread's list, one __thread object: in the shared library each function that
 * touches thread-local storage calls __tls_get_addr, once per object it reaches (the
 * three separate variables cost exs__evq_op_free two calls per operation). */
struct exs_op_cache_thr {
    struct exs_op_block *head;
    unsigned n;
    int armed; /* this thread set op_cache_key */
};
extern __thread struct exs_op_cache_thr exs__op_cache __attribute__((visibility("hidden")));
#endif

/* A cached block zeroed for an operation of size bytes. A size known here (the posting
 * calls': sizeof their op) is zeroed by 16-byte stores in line: 21 stores for an api_op's
 * 312 bytes, where libc's memset cost about 40 instructions with its call (callgrind, 64 B
 * STREAM sender); gcc makes a constant-size memset an inline rep stos, slower still. Any
 * other size: libc's memset (the size hidden from the compiler for that reason). */
static inline __attribute__((always_inline)) void exs__evq_op_zero(void *mem, size_t size)
{
    typedef uint64_t exs_zero16 __attribute__((vector_size(16), aligned(8), may_alias));
    char *p = mem;
    size_t i = 0;

    if (!__builtin_constant_p(size)) {
        __asm__("" : "+r"(size));
        memset(mem, 0, size);
        return;
    }
#pragma GCC unroll 32
    for (; i + 16 <= size; i += 16)
        *(exs_zero16 *)(void *)(p + i) = (exs_zero16){0, 0};
    for (; i < size; i++)
        p[i] = 0;
}

/* exs__evq_op_alloc's and exs__evq_op_free's common cases inline (a block from or back to
 * this thread's list: no call); anything else calls them. */
static inline __attribute__((always_inline)) void *exs__evq_op_alloc_x(size_t size)
{
#if EXS_OP_CACHE_MAX > 0
    struct exs_op_cache_thr *c = &exs__op_cache;
    struct exs_op_block *b = c->head;

    if (size <= EXS_EVQ_OP_BLOCK && b) {
        c->head = b->next;
        c->n--;
        exs__evq_op_zero(b, size);
        return b;
    }
#endif
    return exs__evq_op_alloc(size);
}

static inline __attribute__((always_inline)) void exs__evq_op_free_x(void *mem, size_t size)
{
#if EXS_OP_CACHE_MAX > 0
    struct exs_op_cache_thr *c = &exs__op_cache;
    struct exs_op_block *b = mem;

    if (size <= EXS_EVQ_OP_BLOCK && c->n < EXS_OP_CACHE_MAX && c->armed) {
        b->next = c->head;
        c->head = b;
        c->n++;
        return;
    }
#endif
    exs__evq_op_free(mem, size);
}

/* ---- the send path's part, inline (kfd.c's exs__api_kfd_send_fast, evq.c) ---- */

#define EXS_EVQ_IDX_BITS 16                            /* handle = gen << 16 | (index + 1) */
#define EXS_EVQ_IDX_MAX  ((1 << EXS_EVQ_IDX_BITS) - 1) /* slots 0 .. EXS_EVQ_IDX_MAX - 1 */

struct evq_slot {
    struct exs_evq *evq; /* NULL when free; atomic stores (exs__evq_peek reads it unlocked) */
    int gen;             /* generation of the handle the slot gives out next / now */
    int next_free;       /* free list link (FIFO, so indices are reused late) */
};

/* The slot arrays: a grown table keeps its old array for readers without the lock
 * (exs__evq_peek), and exs_fini keeps them all, emptied, for the next exs_init. */
struct evq_tabv {
    struct evq_tabv *old;
    int len;
    struct evq_slot e[];
};
extern struct evq_tabv *exs__evq_tv __attribute__((visibility("hidden"))); /* atomic */

/* The queue in q's slot without a lock (it may be dead, parked or another's: st says). */
static inline __attribute__((always_inline)) struct exs_evq *exs__evq_peek(exs_qhandle_t q)
{
    struct evq_tabv *t = __atomic_load_n(&exs__evq_tv, __ATOMIC_ACQUIRE);
    int idx = (q & EXS_EVQ_IDX_MAX) - 1;

    if (q <= 0 || !t || (unsigned)idx >= (unsigned)t->len) /* idx -1: q has no index */
        return NULL;
    return __atomic_load_n(&t->e[idx].evq, __ATOMIC_ACQUIRE);
}

/* st names the live queue q. */
static inline int exs__evq_st_is(uint64_t st, exs_qhandle_t q)
{
    return !(st & EVQ_ST_DEAD) && (st >> EVQ_ST_HANDLE_SHIFT) == (uint64_t)q;
}

/* Slots reserved now (evq->lock held; only grows meanwhile). */
static inline uint32_t exs__evq_reserved(const struct exs_evq *evq)
{
    return (uint32_t)__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE) - evq->freed -
           (uint32_t)evq->queued;
}

/* A slot for one event in evq, with one CAS on evq->st and no lock: -EINVAL when the
 * queue is dead (or, q != EXS_QHANDLE_INVALID, st does not name the live queue q: the
 * caller found evq by q without a lock, exs__evq_peek), -EAGAIN when queued + reserved ==
 * depth. A slot pins the queue: exs_qdelete refuses (EBUSY) while one is reserved, and
 * exs_fini's kill leaves the queue to the last of them (evq->orphan). res is read before
 * freed, and freed only grows: a full queue was full when freed was read, a slot taken
 * was free when the CAS took it. */
static inline __attribute__((always_inline)) int exs__evq_reserve_slot(struct exs_evq *evq,
                                                                       exs_qhandle_t q)
{
    uint64_t st = __atomic_load_n(&evq->st, __ATOMIC_ACQUIRE);

    for (;;) {
        uint32_t res = (uint32_t)st;

        if ((st & EVQ_ST_DEAD) || (q != EXS_QHANDLE_INVALID && !exs__evq_st_is(st, q)))
            return -EINVAL;
        if (res - __atomic_load_n(&evq->freed, __ATOMIC_ACQUIRE) >=
            (uint32_t)__atomic_load_n(&evq->depth, __ATOMIC_RELAXED))
            return -EAGAIN;
        if (__atomic_compare_exchange_n(&evq->st, &st,
                                        (st & ~EVQ_ST_RES_MASK) | (uint32_t)(res + 1), 1,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 0;
    }
}

/* exs__evq_reserve_handle (evq.h), inline. */
static inline __attribute__((always_inline)) int exs__evq_reserve_q(exs_qhandle_t q,
                                                                    struct exs_evq **evq_p)
{
    struct exs_evq *evq = exs__evq_peek(q);
    int ret;

    if (!evq)
        return EINVAL;
    ret = exs__evq_reserve_slot(evq, q);
    if (ret)
        return ret == -EAGAIN ? EAGAIN : EINVAL;
    *evq_p = evq;
    return 0;
}

/* exs__evq_reserve_q with a hint: *hint_p, the queue a reservation for q found before
 * (or NULL), is tried first, so the handle table is not read when it is still q's. A
 * queue's memory is parked, never freed (exs_fini keeps the parked ones too), and the
 * reservation's CAS on st proves that st names the live queue q when the slot is taken:
 * a hint that is no longer q's (deleted, parked, reused under another handle) only answers
 * EINVAL, and the table's queue is tried then (and becomes the hint). A full queue q
 * answers EAGAIN either way. */
static inline __attribute__((always_inline)) int
exs__evq_reserve_hint(exs_qhandle_t q, struct exs_evq **hint_p, struct exs_evq **evq_p)
{
    struct exs_evq *evq = __atomic_load_n(hint_p, __ATOMIC_RELAXED);
    int ret;

    if (evq) {
        ret = exs__evq_reserve_slot(evq, q);
        if (ret != -EINVAL) {
            if (ret)
                return EAGAIN;
            *evq_p = evq;
            return 0;
        }
    }
    ret = exs__evq_reserve_q(q, evq_p);
    if (!ret)
        __atomic_store_n(hint_p, *evq_p, __ATOMIC_RELAXED);
    return ret;
}

/* A posting call's first step, inline: look q up, reserve one slot in it (which pins
 * *evq_p) and allocate size zeroed bytes for the operation that will post into it. NULL
 * with *err_p = EINVAL (no such live queue), EAGAIN (full) or ENOMEM; nothing is reserved
 * then. */
static inline __attribute__((always_inline)) void *
exs__evq_reserve_alloc(exs_qhandle_t q, size_t size, struct exs_evq **evq_p, int *err_p)
{
    void *mem;
    int ret = exs__evq_reserve_q(q, evq_p);

    if (ret) {
        *err_p = ret;
        return NULL;
    }
    mem = exs__evq_op_alloc_x(size);
    if (!mem) {
        exs__evq_unreserve(*evq_p);
        *err_p = ENOMEM;
    }
    return mem;
}

/* The ring entry after the queued events (evq->lock held). */
static inline exs_event_t *exs__evq_tail(struct exs_evq *evq)
{
    int tail = evq->head + evq->queued;

    return &evq->ring[tail >= evq->depth ? tail - evq->depth : tail];
}

/* A send's or receive's event (EXS_EVT_SEND or EXS_EVT_RECV) written into a ring entry:
 * the header and the transfer member, all exs_qdequeue copies of it (the union's tail is
 * not the event's). err: exs_evt_errno; flags: exs_evt_flags. */
#define EXS_EVQ_XFER_ARGS                                                                          \
    int type, int err, int fd, int flags, exs_ahandle_t ah, void *buf, size_t len, ssize_t result
#define EXS_EVQ_XFER_PASS type, err, fd, flags, ah, buf, len, result

static inline __attribute__((always_inline)) void exs__evq_xfer_fill(exs_event_t *e,
                                                                     EXS_EVQ_XFER_ARGS)
{
    e->exs_evt_type = type;
    e->exs_evt_errno = err;
    e->exs_evt_fd = fd;
    e->exs_evt_ahandle = ah;
    e->exs_evt_u.exs_evt_xfer.exs_evt_buf = buf;
    e->exs_evt_u.exs_evt_xfer.exs_evt_len = len;
    e->exs_evt_u.exs_evt_xfer.exs_evt_result = result;
    e->exs_evt_u.exs_evt_xfer.exs_evt_flags = flags;
}

/* exs__evq_post_xfer_x with evq->lock held (evq.c): every case; unlocks. */
void exs__evq_post_xfer_locked(struct exs_evq *evq, EXS_EVQ_XFER_ARGS);

/* A send's or receive's event posted in the slot reserved in evq, inline: the event goes
 * into the ring under one hold of the lock; a dead queue (exs_fini's orphan) and one whose
 * descriptors someone watches (exs_qfd called, a sleeper) go the whole way (evq.c). The
 * kernel-socket send that completes at once (kfd.c) and an exs socket's operation ending
 * (xfer.c, op_done) post this way. */
static inline __attribute__((always_inline)) void exs__evq_post_xfer_x(struct exs_evq *evq,
                                                                       EXS_EVQ_XFER_ARGS)
{
    EVQ_LOCK(evq);
    if (__builtin_expect(evq->dead | evq->exposed | evq->sleepers, 0)) {
        exs__evq_post_xfer_locked(evq, EXS_EVQ_XFER_PASS);
        return;
    }
    /* no check of the reservation here (exs__evq_post's has it): the caller holds one, by
     * construction, and reading st, freed and queued again cost every send 5 instructions */
    exs__evq_xfer_fill(exs__evq_tail(evq), EXS_EVQ_XFER_PASS);
    __atomic_store_n(&evq->queued, evq->queued + 1, __ATOMIC_RELEASE);
    EXS_DATA(API, "evq %d: event type %d fd %d errno %d, %d queued", evq->handle, type, fd, err,
             evq->queued);
    EVQ_UNLOCK(evq);
}

/* exs__evq_post_xfer (evq.h), inline: a transfer that succeeded. */
static inline __attribute__((always_inline)) void
exs__evq_post_xfer_now(struct exs_evq *evq, int type, int fd, exs_ahandle_t ah, void *buf,
                       size_t len, ssize_t result)
{
    exs__evq_post_xfer_x(evq, type, 0, fd, 0, ah, buf, len, result);
}

#endif /* EXS_API_EVQ_INT_H */
