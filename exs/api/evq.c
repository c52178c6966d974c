/* SPDX-License-Identifier: MIT */
/* Event queues: the handle table, the reserved-slot event ring, and exs_qdequeue's waits. */
#include "exs/api/evq.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/evq_int.h"
#include "exs/api/kfd.h"
#include "exs/engine/engine.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* Programs compiled against an earlier header keep working: new event members must fit the
 * union as it was (the accept member, with its sockaddr_storage, sets its size). */
#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(exs_event_t) == 168, "exs_event_t changed size: an ABI break");
#endif

/*
 * Locking. Two levels, always taken in this order:
 *   evq_tab.lock           the handle table's writers: create / delete / destroy_all
 *                          (and across fork). One atomic word; held briefly (evq->lock
 *                          the only lock taken inside), so a waiting side yields. No
 *                          lookup takes it: evq_peek reads the slot (the table keeps
 *                          its arrays, old ones too, through exs_fini), and evq->st says
 *                          whether the queue found is q's, alive; exs__evq_get also
 *                          raises the queue's count unless it is 0 (parked), then asks st
 *                          again.
 *   evq->lock (a spin lock that yields, evq_int.h)  everything in one queue not
 *                          marked atomic; inside it only leaf locks (the log's).
 * A queue's memory is reference counted (evq->refs, atomic): the table holds one
 * reference until exs_qdelete, each exs__evq_get and each sleeping exs_qdequeue one
 * more (a spinning one holds none: it asks st at each look, evq_dequeue_rest); the last
 * one parks it (evq_free: descriptors and ring gone, the struct kept for readers without
 * a lock, reused by exs_qcreate, freed at exs_fini).
 * Reservations hold none: a reserved slot pins the queue by itself (evq->st counts the
 * slots ever reserved, evq->freed those given back; exs_qdelete sets the dead bit with a
 * CAS only while none is reserved, and exs_fini's kill leaves the table's reference to
 * the last one, evq->orphan).
 *
 * Descriptors. Each queue owns up to two eventfds whose counters are only ever 0 or 1
 * and are only written or read with evq->lock held, so they are exact copies of a
 * predicate over the queue state (evq_sync_fds) while someone can see them: once
 * exs_qfd was called on the queue, or while a thread sleeps on it (evq->sleepers > 0;
 * it brings them in line under the lock before it sleeps). Nobody else looks at them, so
 * until then they are not written at all:
 *   qfd  (exs_qfd)  readable iff events are queued (or the queue was deleted). Waiters
 *                   that need one event (nevents > 0) sleep on it.
 *   wfd  (private)  readable iff some threshold waiter (nevents < 0) can be satisfied
 *                   (or the queue was deleted). Created on the first threshold wait.
 * Waiters only poll these descriptors and never read them, so any number of threads
 * may sleep on one queue, and a wake-up is never consumed by the wrong thread: the
 * thread that empties the queue clears qfd under the lock.
 */

#define EVQ_DEPTH_MAX (1 << 20) /* largest depth accepted by exs_qcreate */

/* Handle = gen << 16 | (index + 1): never 0 or negative; gen is 15 bits. */
#define EVQ_IDX_BITS  EXS_EVQ_IDX_BITS
#define EVQ_IDX_MAX   EXS_EVQ_IDX_MAX
#define EVQ_GEN_MASK  0x7fff
#define EVQ_TAB_FIRST 16 /* initial table size */

#define EVQ_TAB_WRITER 0x80000000u /* evq_tab.lock: held */

static struct {
    unsigned lock; /* atomic: EVQ_TAB_WRITER or 0 */
    struct evq_slot *slots;
    int nslots;    /* allocated */
    int used;      /* slots 0 .. used - 1 have ever been handed out */
    int free_head; /* -1 when empty */
    int free_tail;
    int gen_base; /* generation of fresh slots (above every earlier one) */
} evq_tab = {
    .free_head = -1,
    .free_tail = -1,
};
/* atomic: the current array of slots (evq_int.h: exs__evq_peek reads it without a lock) */
struct evq_tabv *exs__evq_tv;

static void evq_tab_wrlock(void)
{
    unsigned v = 0;

    EXS_LOCK_ACQUIRE(EXS_LOCK_EVQ_TAB);
    while (!__atomic_compare_exchange_n(&evq_tab.lock, &v, EVQ_TAB_WRITER, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        sched_yield();
        v = 0;
    }
}

static void evq_tab_unlock(void)
{
    __atomic_store_n(&evq_tab.lock, 0, __ATOMIC_RELEASE);
    EXS_LOCK_RELEASE(EXS_LOCK_EVQ_TAB);
}

static int evq_live;         /* atomic: application queues not yet freed */
static int evq_private_live; /* atomic: synchronous-call queues not yet freed */
/* Parked queues (evq_free_lock, a leaf: the last put may come with any lock held): a
 * queue whose last reference went keeps its memory (its lock, st, depth, freed) for the
 * readers without a lock that may still look at it, and is reused by the next
 * exs_qcreate; freed at exs_fini. */
static pthread_mutex_t evq_free_lock = PTHREAD_MUTEX_INITIALIZER;
static struct exs_evq *evq_parked;

static void evq_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* A waiter for a held evq->lock: EVQ_LOCK_SPINS looks with a pause between them (a hold
 * is some tens of nanoseconds, one with an eventfd's system call about a microsecond),
 * then EVQ_LOCK_YIELDS with its CPU given away between them, then naps in the kernel (a
 * futex wait while the lock stays held, ended by its timeout: nobody wakes it, the unlock
 * being a plain store) between looks, the first EVQ_LOCK_NAP_NS, each next one twice the
 * last up to EVQ_LOCK_NAP_MAX_NS: a holder that cannot run while its waiter is runnable
 * (both pinned to one CPU, the waiter of a higher real-time priority, where sched_yield
 * gives the CPU to nobody) runs then, and the waiter's looks take a small share of that
 * CPU however long the hold (a fixed 50 us nap took half of it: api_evq_attack2). */
#define EVQ_LOCK_SPINS      64
#define EVQ_LOCK_YIELDS     64
#define EVQ_LOCK_NAP_NS     50000
#define EVQ_LOCK_NAP_MAX_NS 1600000

unsigned long exs__evq_lock_naps; /* atomic: naps taken (tests) */

void exs__evq_lock_wait(struct exs_evq_lock *l)
{
    long nap = EVQ_LOCK_NAP_NS;

    for (unsigned n = 0;; n++) {
        if (__atomic_load_n(&l->v, __ATOMIC_RELAXED) == 0 && exs__evq_trylock(l))
            return;
        if (n < EVQ_LOCK_SPINS) {
            evq_cpu_relax();
        } else if (n < EVQ_LOCK_SPINS + EVQ_LOCK_YIELDS) {
            sched_yield();
        } else {
            struct timespec ts = {0, nap};

            __atomic_add_fetch(&exs__evq_lock_naps, 1, __ATOMIC_RELAXED);
            syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 1, &ts, NULL, 0);
            if (nap < EVQ_LOCK_NAP_MAX_NS)
                nap *= 2;
        }
    }
}

/* ---- eventfd helpers (called with evq->lock held) ---- */

static void evq_efd_set(struct exs_evq *evq, int fd)
{
    uint64_t one = 1;

    EXS_CNT_INC(exs__eng_cnt.evq_fd_writes);
    if (exs__nc_write(fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        EXS_WARN(API, "evq %d: eventfd %d write failed: %m", evq->handle, fd);
}

static void evq_efd_clear(struct exs_evq *evq, int fd)
{
    uint64_t v;

    /* EAGAIN: the application read qfd itself; the counter is 0 either way. */
    if (exs__nc_read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v) && errno != EAGAIN)
        EXS_WARN(API, "evq %d: eventfd %d read failed: %m", evq->handle, fd);
}

/* Bring both eventfd counters in line with the queue state, when someone can see them:
 * the application called exs_qfd, or a thread sleeps (or is about to) on them. Otherwise
 * they are left as they are and brought in line when that changes (exs_qfd, a sleeper
 * registering under evq->lock), so a thread that dequeues the events it produced
 * itself makes no system call for them. */
static void evq_sync_fds(struct exs_evq *evq)
{
    int on;

    if (!evq->exposed && evq->sleepers == 0)
        return;

    on = evq->dead || evq->queued > 0;
    if (on != evq->qfd_on) {
        if (on)
            evq_efd_set(evq, evq->qfd);
        else
            evq_efd_clear(evq, evq->qfd);
        evq->qfd_on = on;
    }
    if (evq->wfd < 0)
        return;
    on = evq->dead || evq->queued >= evq->want_min;
    if (on != evq->wfd_on) {
        if (on)
            evq_efd_set(evq, evq->wfd);
        else
            evq_efd_clear(evq, evq->wfd);
        evq->wfd_on = on;
    }
}

static void evq_set_queued(struct exs_evq *evq, int queued)
{
    __atomic_store_n(&evq->queued, queued, __ATOMIC_RELEASE);
}

/* ---- lifetime ---- */

/* The last reference went: the descriptors and the ring go, the queue is parked. */
static void evq_free(struct exs_evq *evq)
{
    EXS_DBG(API, "evq %d: freed", evq->handle);
    if (evq->wfd >= 0)
        exs__nc_close(evq->wfd);
    if (evq->qfd >= 0)
        exs__nc_close(evq->qfd);
    evq->wfd = evq->qfd = -1;
    free(evq->ring);
    evq->ring = NULL;
    __atomic_sub_fetch(evq->private_ ? &evq_private_live : &evq_live, 1, __ATOMIC_RELAXED);
    EXS_MUTEX_LOCK(&evq_free_lock, EXS_LOCK_LEAF);
    evq->free_next = evq_parked;
    evq_parked = evq;
    EXS_MUTEX_UNLOCK(&evq_free_lock, EXS_LOCK_LEAF);
}

/* A queue for exs_qcreate: parked or new, its state cleared, dead and with no handle in
 * st (no reservation or lookup takes it before the table gives it one); NULL when out of
 * memory. */
static struct exs_evq *evq_new(int depth)
{
    struct exs_evq *evq;

    evq = EXS_PARKED_POP(&evq_free_lock, evq_parked, free_next);
    if (!evq) {
        evq = calloc(1, sizeof(*evq));
        if (!evq)
            return NULL;
    }
    /* a reader without the lock may look at st, depth and freed, or lock it, meanwhile */
    EVQ_LOCK(evq);
    __atomic_store_n(&evq->st, EVQ_ST_DEAD, __ATOMIC_RELEASE);
    __atomic_store_n(&evq->depth, depth, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->freed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->queued, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->dead, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->mode, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_us, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_learn, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_seen_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_waits, 0, __ATOMIC_RELAXED);
    memset(&evq->free_next, 0, sizeof(*evq) - offsetof(struct exs_evq, free_next));
    EVQ_UNLOCK(evq);
    return evq;
}

#define evq_peek     exs__evq_peek
#define evq_st_is    exs__evq_st_is
#define evq_reserved exs__evq_reserved

/* evq is no longer q's live queue: deleted, or parked (and maybe reused since) */
static inline int evq_gone(struct exs_evq *evq, exs_qhandle_t q)
{
    return !evq_st_is(__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE), q);
}

/* n slots come back (evq->lock held): taken, dropped or abandoned. */
static void evq_give_back(struct exs_evq *evq, int n)
{
    __atomic_store_n(&evq->freed, evq->freed + (uint32_t)n, __ATOMIC_RELEASE);
}

void exs__evq_put(struct exs_evq *evq)
{
    if (__atomic_sub_fetch(&evq->refs, 1, __ATOMIC_ACQ_REL) == 0)
        evq_free(evq);
}

/* Mark a queue dead (evq->lock held, EVQ_ST_DEAD set): queued events are discarded,
 * every waiter wakes. */
static void evq_kill(struct exs_evq *evq)
{
    __atomic_store_n(&evq->dead, 1, __ATOMIC_RELEASE);
    evq_give_back(evq, evq->queued);
    evq->head = 0;
    evq_set_queued(evq, 0);
    evq_sync_fds(evq);
}

/* Slot of a handle, or NULL (evq_tab.lock held). */
static struct evq_slot *evq_tab_lookup(exs_qhandle_t q)
{
    int idx = (q & EVQ_IDX_MAX) - 1;
    int gen = q >> EVQ_IDX_BITS;
    struct evq_slot *slot;

    if (q <= 0 || idx < 0 || idx >= evq_tab.used)
        return NULL;
    slot = &evq_tab.slots[idx];
    if (slot->evq == NULL || slot->gen != gen)
        return NULL;
    return slot;
}

/* Give evq a handle (evq_tab.lock write-held). -ENOMEM: table full or no memory. */
static int evq_tab_insert(struct exs_evq *evq)
{
    struct evq_slot *slot;
    int idx;

    if (evq_tab.free_head >= 0) {
        idx = evq_tab.free_head;
        evq_tab.free_head = evq_tab.slots[idx].next_free;
        if (evq_tab.free_head < 0)
            evq_tab.free_tail = -1;
    } else {
        if (evq_tab.used == evq_tab.nslots) {
            int n = evq_tab.nslots ? evq_tab.nslots * 2 : EVQ_TAB_FIRST;
            struct evq_tabv *tv;

            n = EXS_MIN(n, EVQ_IDX_MAX);
            if (n <= evq_tab.nslots) {
                EXS_WARN(API, "evq table full: %d queues", evq_tab.nslots);
                return -ENOMEM;
            }
            tv = calloc(1, sizeof(*tv) + (size_t)n * sizeof(tv->e[0]));
            if (tv == NULL)
                return -ENOMEM;
            tv->len = n;
            tv->old = exs__evq_tv;
            if (evq_tab.nslots)
                memcpy(tv->e, evq_tab.slots, (size_t)evq_tab.nslots * sizeof(tv->e[0]));
            evq_tab.slots = tv->e;
            evq_tab.nslots = n;
            __atomic_store_n(&exs__evq_tv, tv, __ATOMIC_RELEASE);
        }
        idx = evq_tab.used++;
        evq_tab.slots[idx].gen = evq_tab.gen_base;
    }
    slot = &evq_tab.slots[idx];
    slot->next_free = -1;
    evq->handle = (slot->gen << EVQ_IDX_BITS) | (idx + 1);
    /* alive: reservations and lookups without the lock may take it from now on */
    __atomic_store_n(&evq->st, (uint64_t)evq->handle << EVQ_ST_HANDLE_SHIFT, __ATOMIC_RELEASE);
    __atomic_store_n(&slot->evq, evq, __ATOMIC_RELEASE);
    return 0;
}

/* Free a slot (evq_tab.lock write-held): its next handle gets a new generation, and it
 * goes to the tail of the free list so it is reused as late as possible. */
static void evq_tab_remove(struct evq_slot *slot)
{
    int idx = (int)(slot - evq_tab.slots);

    __atomic_store_n(&slot->evq, NULL, __ATOMIC_RELEASE);
    slot->gen = (slot->gen + 1) & EVQ_GEN_MASK;
    slot->next_free = -1;
    if (evq_tab.free_tail >= 0)
        evq_tab.slots[evq_tab.free_tail].next_free = idx;
    else
        evq_tab.free_head = idx;
    evq_tab.free_tail = idx;
}

/* exs__evq_hold, inline in evq_get (a call less per lookup). */
static inline __attribute__((always_inline)) int evq_hold(exs_qhandle_t q, struct exs_evq *evq,
                                                          struct exs_evq **evq_p)
{
    int refs;

    /* count unless parked (0); acquire also at 0: its last put's park is seen then */
    refs = __atomic_load_n(&evq->refs, __ATOMIC_ACQUIRE);
    while (refs && !__atomic_compare_exchange_n(&evq->refs, &refs, refs + 1, 1, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
        ;
    if (!refs)
        return -EINVAL;
    /* counted: still q's and alive (else deleted, or parked and reused under a new handle) */
    if (!evq_st_is(__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE), q)) {
        exs__evq_put(evq);
        return -EINVAL;
    }
    *evq_p = evq;
    return 0;
}

/* exs__evq_get, with evq_hold inline. */
static inline __attribute__((always_inline)) int evq_get(exs_qhandle_t q, struct exs_evq **evq_p)
{
    struct exs_evq *evq = evq_peek(q);

    if (!evq)
        return -EINVAL;
    return evq_hold(q, evq, evq_p);
}

int exs__evq_get(exs_qhandle_t q, struct exs_evq **evq_p)
{
    return evq_get(q, evq_p);
}

int exs__evq_hold(exs_qhandle_t q, struct exs_evq *evq, struct exs_evq **evq_p)
{
    return evq_hold(q, evq, evq_p);
}

exs_qhandle_t exs__evq_handle(const struct exs_evq *evq)
{
    return evq->handle;
}

int exs__evq_live_count(void)
{
    return __atomic_load_n(&evq_live, __ATOMIC_RELAXED);
}

int exs__evq_private_live_count(void)
{
    return __atomic_load_n(&evq_private_live, __ATOMIC_RELAXED);
}

/* The count of live operations is the reservations' (exs__evq_reserve_slot's running
 * count in st, less the slots freed and the events queued): every operation holds its
 * queue's slot from its post until its event is queued (or its post fails:
 * exs__evq_unreserve), so no global count with a locked add at each post and each end
 * is kept for it (issue 26: two locked instructions per operation fewer). The walk takes
 * the table's lock (no queue leaves meanwhile) and each queue's (reserved is read as at
 * exs__evq_destroy_all). A queue killed with operations outstanding (the orphan of
 * exs_fini) left the table: exs__evq_live_count still counts it until its last one. */
int exs__evq_ops_live(void)
{
    int n = 0;

    evq_tab_wrlock();
    for (int i = 0; i < evq_tab.used; i++) {
        struct exs_evq *evq = evq_tab.slots[i].evq;

        if (!evq)
            continue;
        EVQ_LOCK(evq);
        n += (int)evq_reserved(evq);
        EVQ_UNLOCK(evq);
    }
    evq_tab_unlock();
    return n;
}

int exs__evq_clean(exs_qhandle_t q)
{
    struct exs_evq *evq;
    int ret = 0;

    ret = exs__evq_get(q, &evq);
    if (ret < 0)
        return ret;
    EVQ_LOCK(evq);
    if (evq->dead) {
        ret = -EINVAL;
    } else if (evq_reserved(evq) > 0) {
        ret = -EBUSY;
    } else if (evq->queued > 0) {
        EXS_DBG(API, "evq %d: %d events of a failed call discarded", evq->handle, evq->queued);
        evq_give_back(evq, evq->queued);
        evq->head = 0;
        evq_set_queued(evq, 0);
        evq_sync_fds(evq);
    }
    EVQ_UNLOCK(evq);
    exs__evq_put(evq);
    return ret;
}

void exs__evq_destroy_all(void)
{
    int i;

    evq_tab_wrlock();
    for (i = 0; i < evq_tab.used; i++) {
        struct evq_slot *slot = &evq_tab.slots[i];
        struct exs_evq *evq = slot->evq;

        if (evq != NULL) {
            uint32_t reserved;

            EVQ_LOCK(evq);
            __atomic_fetch_or(&evq->st, EVQ_ST_DEAD, __ATOMIC_ACQ_REL);
            reserved = evq_reserved(evq); /* no reservation comes now */
            if (reserved > 0)
                EXS_WARN(API, "evq %d: destroyed with %u operations outstanding", evq->handle,
                         reserved);
            evq_kill(evq);
            /* the last of them drops the table's reference (exs__evq_post, unreserve) */
            evq->orphan = reserved > 0;
            EVQ_UNLOCK(evq);
            evq_tab_remove(slot);
            if (!reserved)
                exs__evq_put(evq);
        }
    }
    /* The emptied table stays, its arrays too (the old ones, and at exit as before it): a
     * look without the lock (evq_peek, exs_qdequeue's first) racing this may still read
     * them, and learns from the slot (NULL) or the queue's st that its queue is gone
     * (EINVAL); freed here, it read freed memory (api_evq_attack26). Handles given out
     * before stay invalid: each slot's gen moved on (evq_tab_remove), and the next
     * exs_init's queues reuse the slots (the table's memory: its largest size). */
    evq_tab_unlock();
    /* The parked queues stay (no ring, no descriptor: the structure alone), for the next
     * exs_qcreate: a wait that spins or looks without a reference (evq_dequeue_rest,
     * evq_dequeue_now) may still read their st and take their lock, and learns from st
     * that its queue is gone (EINVAL); freed here, it read freed memory and could lock
     * a word glibc had written (api_evq_attack3). */
}

/* ---- reservation and posting ---- */

int exs__evq_reserve(struct exs_evq *evq)
{
    return exs__evq_reserve_slot(evq, EXS_QHANDLE_INVALID);
}

int exs__evq_reserve_handle(exs_qhandle_t q, struct exs_evq **evq_p)
{
    return exs__evq_reserve_q(q, evq_p);
}

/* A slot of a dead queue came back (evq->lock held): 1 when it was the last of an
 * orphan's, whose table reference the caller then drops (after the unlock). */
static int evq_orphan_last(const struct exs_evq *evq)
{
    return evq->orphan && evq_reserved(evq) == 0;
}

void exs__evq_unreserve(struct exs_evq *evq)
{
    int last;

    EVQ_LOCK(evq);
    EXS_ASSERT(evq_reserved(evq) > 0);
    evq_give_back(evq, 1);
    last = evq_orphan_last(evq);
    EVQ_UNLOCK(evq);
    if (last)
        exs__evq_put(evq);
}

/* A post's first step (evq->lock held): the ring entry its event goes in, or NULL when
 * the queue is dead (only exs__evq_destroy_all kills a queue with reservations: the event
 * is dropped, and *last_p says whether it held an orphan's last slot). */
static __attribute__((noinline, cold)) exs_event_t *evq_post_dead(struct exs_evq *evq, int *last_p)
{
    evq_give_back(evq, 1);
    *last_p = evq_orphan_last(evq);
    return NULL;
}

static inline __attribute__((always_inline)) exs_event_t *evq_post_slot(struct exs_evq *evq,
                                                                        int *last_p)
{
    EXS_ASSERT(evq_reserved(evq) > 0);
    if (__builtin_expect(evq->dead, 0))
        return evq_post_dead(evq, last_p);
    return exs__evq_tail(evq);
}

/* A post's last step (evq->lock held, the entry written): the reserved slot becomes an
 * event (res - freed stays), waiters see it; then the orphan's reference when it was
 * the last. */
static void evq_post_end(struct exs_evq *evq, const exs_event_t *ev, int last)
{
    if (ev) {
        evq_set_queued(evq, evq->queued + 1);
        evq_sync_fds(evq);
        EXS_DATA(API, "evq %d: event type %d fd %d errno %d, %d queued", evq->handle,
                 ev->exs_evt_type, ev->exs_evt_fd, ev->exs_evt_errno, evq->queued);
    }
    EVQ_UNLOCK(evq);
    if (last)
        exs__evq_put(evq);
}

void exs__evq_post(struct exs_evq *evq, const exs_event_t *ev)
{
    exs_event_t *slot;
    int last = 0;

    EVQ_LOCK(evq);
    slot = evq_post_slot(evq, &last);
    if (slot)
        *slot = *ev;
    evq_post_end(evq, slot, last);
}

void exs__evq_post_xfer_locked(struct exs_evq *evq, EXS_EVQ_XFER_ARGS)
{
    exs_event_t *slot;
    int last = 0;

    slot = evq_post_slot(evq, &last);
    if (slot)
        exs__evq_xfer_fill(slot, EXS_EVQ_XFER_PASS);
    evq_post_end(evq, slot, last);
}

void exs__evq_post_xfer(struct exs_evq *evq, int type, int fd, exs_ahandle_t ah, void *buf,
                        size_t len, ssize_t result)
{
    exs__evq_post_xfer_now(evq, type, fd, ah, buf, len, result);
}

/*
 * ---- public: create, delete, descriptor, wait mode ----
 *
 * Behaviour where the ES-API text is silent (for spec/api.md):
 *   exs_qcreate   depth 1 .. 1 << 20, else EINVAL; ENOMEM when 65535 queues exist;
 *                 eventfd's errno (EMFILE, ENFILE) when out of descriptors. Works
 *                 without exs_init.
 *   exs_qdelete   EINVAL bad or stale handle; EBUSY while operations whose events are
 *                 still to come hold reserved slots. Queued, undelivered events are
 *                 discarded; threads blocked in exs_qdequeue return -1 / EINVAL.
 *   exs_qdequeue  argument errors (EINVAL) are checked before nevents == 0 returns 0:
 *                 |nevents| > EXS_EVTVEC_MAX, events NULL with nevents != 0, a timespec
 *                 with a negative field or tv_nsec >= 1e9, a bad handle, and a threshold
 *                 -nevents larger than the depth (it could never be met). EINTR only
 *                 from a sleep: EXS_WAIT_POLL (and the spin phase of ADAPTIVE) makes no
 *                 system call, so a signal there runs its handler and the wait goes on.
 *   exs_qfd       the library owns the descriptor: poll, select or epoll it, never read,
 *                 write or close it. It is closed when the queue is deleted (it polls
 *                 readable from exs_qdelete until then).
 *   exs_qsetwait  EINVAL for a mode other than EXS_WAIT_* or spin_us < 0; takes effect
 *                 at the next exs_qdequeue call.
 */

static exs_qhandle_t evq_create(int depth, int private_)
{
    struct exs_evq *evq;
    int ret;

    if (depth < 1 || depth > EVQ_DEPTH_MAX) {
        exs__err(EINVAL);
        return EXS_QHANDLE_INVALID;
    }
    evq = evq_new(depth);
    if (evq == NULL) {
        exs__err(ENOMEM);
        return EXS_QHANDLE_INVALID;
    }
    evq->private_ = private_;
    __atomic_add_fetch(private_ ? &evq_private_live : &evq_live, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->refs, 1, __ATOMIC_RELEASE); /* the table's (st still dead) */
    evq->handle = EXS_QHANDLE_INVALID;
    evq->wfd = -1;
    evq->want_min = INT_MAX;
    /* until exs_qsetwait: a short spin before sleeping (EXS_QWAIT_SPIN_US, spec/api.md
     * "Wait modes"), or NOTIFY */
    int spin_us = (int)__atomic_load_n(&exs__params.qwait_spin_us, __ATOMIC_RELAXED);

    __atomic_store_n(&evq->spin_us, spin_us, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_learn, spin_us != 0, __ATOMIC_RELAXED); /* the default's */
    __atomic_store_n(&evq->mode, spin_us ? EXS_WAIT_ADAPTIVE : EXS_WAIT_NOTIFY, __ATOMIC_RELAXED);
    evq->qfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (evq->qfd < 0) {
        ret = -errno;
        EXS_WARN(API, "evq: eventfd failed: %m");
        goto err_free;
    }
    evq->ring = calloc((size_t)depth, sizeof(*evq->ring));
    if (evq->ring == NULL) {
        ret = -ENOMEM;
        goto err_free;
    }
    evq_tab_wrlock();
    ret = evq_tab_insert(evq);
    evq_tab_unlock();
    if (ret < 0)
        goto err_free;
    EXS_DBG(API, "evq %d: created, depth %d, qfd %d", evq->handle, depth, evq->qfd);
    return evq->handle;

err_free:
    evq_free(evq);
    exs__err(-ret);
    return EXS_QHANDLE_INVALID;
}

exs_qhandle_t exs_qcreate(int depth)
{
    return evq_create(depth, 0);
}

exs_qhandle_t exs__evq_create_private(int depth)
{
    return evq_create(depth, 1);
}

int exs_qdelete(exs_qhandle_t q)
{
    struct evq_slot *slot;
    struct exs_evq *evq;
    int discarded;

    evq_tab_wrlock();
    slot = evq_tab_lookup(q);
    if (slot == NULL) {
        evq_tab_unlock();
        return exs__err(EINVAL);
    }
    evq = slot->evq;
    EVQ_LOCK(evq);
    /* dead only with no slot reserved: a reservation's CAS and this one race fairly */
    uint64_t st = __atomic_load_n(&evq->st, __ATOMIC_ACQUIRE);
    uint32_t reserved;

    while (!(reserved = evq_reserved(evq)) &&
           !__atomic_compare_exchange_n(&evq->st, &st, st | EVQ_ST_DEAD, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
        ;
    if (reserved > 0) {
        EXS_DBG(API, "evq %d: delete refused, %u operations outstanding", q, reserved);
        EVQ_UNLOCK(evq);
        evq_tab_unlock();
        return exs__err(EBUSY);
    }
    discarded = evq->queued;
    evq_kill(evq);
    EVQ_UNLOCK(evq);
    evq_tab_remove(slot);
    evq_tab_unlock();
    EXS_DBG(API, "evq %d: deleted, %d undelivered events discarded", q, discarded);
    /* Threads still in exs_qdequeue hold references; the last one frees it. */
    exs__evq_put(evq);
    return 0;
}

int exs_qfd(exs_qhandle_t q)
{
    struct exs_evq *evq;
    int ret, fd;

    ret = exs__evq_get(q, &evq);
    if (ret < 0)
        return exs__err(-ret);
    EVQ_LOCK(evq);
    fd = evq->qfd;
    if (!evq->exposed) {
        evq->exposed = 1;
        evq_sync_fds(evq);
    }
    EVQ_UNLOCK(evq);
    exs__evq_put(evq);
    return fd;
}

/* ---- dequeue ---- */

/* One event copied out of the ring: a send's or a receive's as far as its member,
 * exs_evt_xfer, goes (what exs__evq_post_xfer writes; the union's tail is not the
 * event's: 56 of the 168 bytes), any other whole. */
static inline __attribute__((always_inline)) void evq_copy1(exs_event_t *ev, const exs_event_t *e)
{
    if (e->exs_evt_type == EXS_EVT_SEND || e->exs_evt_type == EXS_EVT_RECV)
        memcpy(ev, e, offsetof(exs_event_t, exs_evt_u) + sizeof(exs_evt_xfer_t));
    else
        *ev = *e;
}

/* Copy n events out (evq->lock held, n <= queued), one by one (evq_copy1: a ping-pong's
 * dequeue of a send's and a receive's event copied 336 bytes with memcpy, 64
 * instructions, where their members are 112). */
static void evq_take(struct exs_evq *evq, exs_event_t *events, int n)
{
    int head = evq->head;

    for (int i = 0; i < n; i++) {
        evq_copy1(&events[i], &evq->ring[head]);
        head = head + 1 == evq->depth ? 0 : head + 1;
    }
    evq->head = head;
    evq_set_queued(evq, evq->queued - n);
    evq_give_back(evq, n);
    evq_sync_fds(evq);
}

/* evq_take of the one event at the head. The caller brings the descriptors in line
 * (evq_sync_fds). */
static inline __attribute__((always_inline)) void evq_take1(struct exs_evq *evq, exs_event_t *ev)
{
    evq_copy1(ev, &evq->ring[evq->head]);
    evq->head = evq->head + 1 == evq->depth ? 0 : evq->head + 1;
    evq_set_queued(evq, evq->queued - 1);
    evq_give_back(evq, 1);
}

/* Take n (> 0) events, the descriptors brought in line: one event (a ping-pong's wait
 * ends with one) without evq_take's call and its memcpy of a length known only at run
 * time (callgrind, 64 B SEQPACKET ping-pong over shm: ~30 instructions per wait). */
static inline __attribute__((always_inline)) void evq_take_n(struct exs_evq *evq,
                                                             exs_event_t *events, int n)
{
    if (n == 1) {
        evq_take1(evq, events);
        evq_sync_fds(evq);
    } else {
        evq_take(evq, events, n);
    }
}

static void evq_waiter_add(struct exs_evq *evq, struct evq_waiter *w)
{
    w->prev = NULL;
    w->next = evq->waiters;
    if (w->next != NULL)
        w->next->prev = w;
    evq->waiters = w;
    evq->want_min = EXS_MIN(evq->want_min, w->want);
}

static void evq_waiter_del(struct exs_evq *evq, struct evq_waiter *w)
{
    struct evq_waiter *it;

    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        evq->waiters = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    evq->want_min = INT_MAX;
    for (it = evq->waiters; it != NULL; it = it->next)
        evq->want_min = EXS_MIN(evq->want_min, it->want);
    evq_sync_fds(evq);
}

/* Wait for another turn of the spin loop after a failed trylock: a few pauses, so the
 * thread that holds the progress lock is not hammered by trylocks. */
static void evq_relax(void)
{
    for (int i = 0; i < 8; i++)
        evq_cpu_relax();
}

/* This thread's time per turn of evq_spin, as last measured (0: not yet). A read of the
 * clock is a system call where the clock source has no vDSO path (qemu under TCG, some
 * virtual machines): the spin reads it only as often as its deadline needs. */
static __thread uint64_t evq_spin_ns;

uint32_t exs__evq_spin_every(uint64_t spin_ns, uint64_t left_ns)
{
    uint64_t n = spin_ns ? left_ns / 4 / spin_ns : 0;

    return (uint32_t)EXS_MIN(EXS_MAX(n, (uint64_t)EVQ_SPIN_EVERY_MIN), EVQ_SPIN_EVERY_MAX);
}

uint64_t exs__evq_spin_limit(uint64_t seen_ns, uint64_t floor_ns, uint64_t ceil_ns, int probe,
                             int *sample)
{
    *sample = 0;
    if (ceil_ns <= floor_ns)
        return floor_ns;
    if (seen_ns >= ceil_ns / 4 * 3) { /* waits too long to spin through */
        *sample = probe;
        return probe ? ceil_ns : floor_ns;
    }
    *sample = 1;
    return EXS_MIN(EXS_MAX(2 * seen_ns, floor_ns), ceil_ns);
}

int exs__evq_wait_is_default(int mode, int spin_us)
{
    uint64_t def = __atomic_load_n(&exs__params.qwait_spin_us, __ATOMIC_RELAXED);

    return mode == EXS_WAIT_ADAPTIVE && spin_us > 0 && (uint64_t)spin_us == def;
}

uint64_t exs__evq_spin_learn(uint64_t seen_ns, uint64_t sample_ns)
{
    return sample_ns >= seen_ns ? seen_ns + (sample_ns - seen_ns) / 8
                                : seen_ns - (seen_ns - sample_ns) / 8;
}

/* Failed trylocks of the progress lock in a row after which a spinner yields its CPU. */
#define EVQ_SPIN_YIELD_BUSY 32u
/* Yields in a row, the lock never free between them, after which a spinner waits for the
 * lock instead (a futex sleep, woken by the holder's give-back): sched_yield hands the CPU
 * to nobody when the holder's virtual runtime is ahead of the spinner's (CFS) or its
 * priority below (real time), and the spin then lasts a scheduler tick or more. */
#define EVQ_SPIN_YIELDS     2u

/* A spinner looks at the kernel sockets' readiness (kfd_ep) every this many turns while
 * some wait for it: one epoll_wait(0) per EVQ_SPIN_KFD_EVERY turns, none while none waits. */
#define EVQ_SPIN_KFD_EVERY 16u

/* Spin, driving progress (trylock) between looks at the queue, without evq->lock, until
 * want events may be there, the queue died, or end (UINT64_MAX: none, and the clock is
 * never read). from: the clock when the spin begins (0: not read). No system call of
 * its own but the clock's, read after a quarter of the time left at the speed last
 * seen (exs__evq_spin_every), so a spin that ends by its events reads it rarely; and,
 * while operations on kernel sockets wait for readiness, a look at it every
 * EVQ_SPIN_KFD_EVERY turns (the progress thread's watcher of kfd_ep needs the progress
 * lock, which this spin takes at every turn: with a spinner holding it most of the time,
 * the kernel sockets' queues would wait for the loop thread to win a trylock race).
 * Returns how long it took to find the events (or the queue's end), estimated as its
 * turns at the speed last seen (0 while that is unknown), or UINT64_MAX when it ended by
 * end. */
static uint64_t evq_spin(struct exs_evq *evq, exs_qhandle_t q, int want, uint64_t from,
                         uint64_t end)
{
    uint64_t last = from;
    uint32_t i = 0,
             every = exs__evq_spin_every(from ? evq_spin_ns : 0, end > from ? end - from : 0);

    uint32_t busy = 0, yields = 0;

    for (uint32_t turn = 0;; turn++) {
        /* The progress lock held by another thread for EVQ_SPIN_YIELD_BUSY turns in a row:
         * its holder may be waiting for this very CPU (the progress thread woken on it,
         * both pinned to it): give the CPU away, or the spin lasts the scheduler's slice
         * (milliseconds) with nothing to find. Still held after EVQ_SPIN_YIELDS yields:
         * the yields gave the CPU to nobody; sleep on the lock (its round when it comes). */
        if (exs__engine_drive(EXS_ENG_DRIVE_TRY) != -EBUSY) {
            busy = yields = 0;
        } else if (++busy >= EVQ_SPIN_YIELD_BUSY) {
            busy = 0;
            if (++yields <= EVQ_SPIN_YIELDS) {
                EXS_CNT_INC(exs__eng_cnt.spin_yields);
                sched_yield();
            } else {
                yields = 0;
                EXS_CNT_INC(exs__eng_cnt.spin_waits);
                (void)exs__engine_drive(EXS_ENG_DRIVE_WAIT);
            }
        }
        /* kernel sockets waiting for readiness: this spinner runs their queues too */
        if (turn % EVQ_SPIN_KFD_EVERY == 0 && exs__api_kfd_waiting())
            exs__api_kfd_run_ready();
        if (__atomic_load_n(&evq->queued, __ATOMIC_ACQUIRE) >= want ||
            !evq_st_is(__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE), q))
            return (uint64_t)(turn + 1) * evq_spin_ns; /* no clock read: turns at the speed seen */
        if (++i >= every && end != UINT64_MAX) {
            uint64_t now = exs__now_ns();

            if (last && now > last)
                evq_spin_ns = EXS_MAX((now - last) / i, (uint64_t)1);
            if (now >= end)
                return UINT64_MAX;
            every = exs__evq_spin_every(evq_spin_ns, end - now);
            last = now;
            i = 0;
        }
        /* Pauses only while another thread holds the progress lock: after a drive of
         * its own the spinner looks again at once. A pause is ~140 cycles on recent x86
         * and, under qemu's TCG, an exit from the translated code (the guest's busy
         * ping-pong spent half its time on them). */
        if (busy)
            evq_relax();
    }
}

/* What a sleeping wait holds while it sleeps: its queue (the reference of exs_qdequeue),
 * its place as a sleeper (and as a threshold waiter), the providers' arm and the engine's
 * count of drivers. */
struct evq_sleep {
    struct exs_evq *evq;
    struct evq_waiter *w; /* registered, or NULL */
    const int *pfd_prov;
};

/* A thread cancelled in its sleep (ppoll, the library's one cancellation point:
 * spec/threading.md, "Thread cancellation") leaves as if its wait had returned: its
 * cleanup handler gives back what the sleep holds. */
static void evq_sleep_cancelled(void *arg)
{
    struct evq_sleep *sl = arg;

    EVQ_LOCK(sl->evq);
    if (sl->w)
        evq_waiter_del(sl->evq, sl->w);
    sl->evq->sleepers--;
    EVQ_UNLOCK(sl->evq);
    exs__engine_arm_end(sl->pfd_prov);
    exs__engine_driver_leave();
    exs__evq_put(sl->evq);
}

/* The sleep: ppoll, where a deferred cancel acts (nothing else of the library is one);
 * nothing locked here, everything held named by sl. */
static int evq_sleep(struct evq_sleep *sl, struct pollfd *pfd, nfds_t n, const struct timespec *ts)
{
    int ret;

    pthread_cleanup_push(evq_sleep_cancelled, sl);
    ret = ppoll(pfd, n, ts, NULL); /* nocancel: ok (the wait's cancellation point) */
    pthread_cleanup_pop(0);
    return ret;
}

/* The spin of a wait on a queue that learns (spin_learn): from floor (its spin_us) up to
 * EXS_QWAIT_SPIN_MAX_US by the queue's waits (exs__evq_spin_limit); *ceil: the ceiling
 * when this wait's outcome is to be learned, else left 0. Relaxed loads and stores:
 * threads waiting on one queue at once may lose each other's counts, which only moves
 * the average a little. */
static uint64_t evq_spin_learned(struct exs_evq *evq, uint64_t floor, uint64_t *ceil)
{
    uint64_t max = __atomic_load_n(&exs__params.qwait_spin_max_us, __ATOMIC_RELAXED) * 1000u;
    uint64_t spin;
    uint32_t n;
    int sample;

    if (max <= floor)
        return floor;
    n = __atomic_load_n(&evq->spin_waits, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&evq->spin_waits, n, __ATOMIC_RELAXED);
    spin = exs__evq_spin_limit(__atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED), floor, max,
                               n % EVQ_LEARN_PROBE_EVERY == 0, &sample);
    if (sample)
        *ceil = max;
    return spin;
}

/* A learning wait's sample (ns, at most the ceiling): into the queue's average. */
static void evq_spin_seen(struct exs_evq *evq, uint64_t sample)
{
    uint64_t seen = __atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED);

    __atomic_store_n(&evq->spin_seen_ns, (uint32_t)exs__evq_spin_learn(seen, sample),
                     __ATOMIC_RELAXED);
}

/*
 * Wait until want events are queued, then dequeue up to max of them. Returns the count
 * (0 when the deadline passed first), -EINTR (a signal interrupted the sleep), -EINVAL
 * (the queue was deleted meanwhile), or an error of eventfd / ppoll.
 *
 * The waiting thread drives progress itself (spec/threading.md): it drives, then looks
 * at the queue. POLL and the spin phase of ADAPTIVE drive with a trylock (when another
 * thread drives, just look again); NOTIFY (and ADAPTIVE after its spin) registers as a
 * sleeper (so posts to this queue write its descriptor), arms the provider under the
 * progress lock, and sleeps on both the provider's event fd and the queue's descriptor.
 */
static int evq_dequeue_wait(exs_qhandle_t q, struct exs_evq *evq, exs_event_t *events, int want,
                            int max, uint64_t t0, uint64_t deadline)
{
    int mode = __atomic_load_n(&evq->mode, __ATOMIC_RELAXED);
    struct evq_waiter w = {.want = want};
    int registered = 0, sleeper = 0, driven = 0, fresh = 0, armed = 0, held = 0, slept = 0, ret;
    int pfd_prov[EXS_ENG_MAX_CTX];
    uint64_t spin_end = 0, now, spin_ceil = 0, spun = UINT64_MAX;

    if (mode == EXS_WAIT_POLL) {
        spin_end = UINT64_MAX;
    } else if (mode == EXS_WAIT_ADAPTIVE) {
        int us = __atomic_load_n(&evq->spin_us, __ATOMIC_RELAXED);
        uint64_t spin = (uint64_t)(us ? (uint64_t)us : exs__params.qspin_us) * 1000u;

        if (!t0)
            t0 = exs__now_ns();
        if (__atomic_load_n(&evq->spin_learn, __ATOMIC_RELAXED))
            spin = evq_spin_learned(evq, spin, &spin_ceil);
        spin_end = t0 + spin;
    }

    /* Events already there are taken without driving when the process has no libexs
     * socket (its only operations are on kernel sockets, which complete in the posting
     * call or on the progress thread): no system call, no clock read of its own then. */
    if (!exs__api_sock_live() && __atomic_load_n(&evq->queued, __ATOMIC_ACQUIRE) >= want) {
        EVQ_LOCK(evq);
        ret = evq_gone(evq, q) ? -EINVAL : EXS_MIN(evq->queued, max);
        if (ret > 0)
            evq_take_n(evq, events, ret);
        EVQ_UNLOCK(evq);
        if (ret)
            return ret;
    }
    exs__engine_driver_enter(t0);
    /* POLL, and ADAPTIVE's spin: the first spin needs no lock (it looks at the queue's
     * atomic count); the lock is taken once, to take the events (or go on waiting). */
    now = t0 ? t0 : spin_end == UINT64_MAX && deadline == UINT64_MAX ? 0 : exs__now_ns();
    if (spin_end && now < spin_end) {
        uint64_t end = EXS_MIN(spin_end, deadline);

        spun = evq_spin(evq, q, want, now, now < end ? end : 0);
        driven = 1;
    } else if (!spin_end && want == 1 && now < deadline &&
               __atomic_load_n(&evq->queued, __ATOMIC_ACQUIRE) < want) {
        /* NOTIFY, nothing queued at a glance: the arm first, before the queue's lock
         * (the loop below would take the lock, look, give it back, arm, take it again:
         * now one hold, which looks again, finds a dead queue, or registers the
         * sleeper). Still no sleeper at the arm, as below; a threshold wait (its wfd,
         * its waiter) goes the loop's way. -EAGAIN: a round ran, the loop looks and
         * arms again. */
        driven = 1;
        fresh = 1; /* now is still the wait's reading */
        armed = exs__engine_arm(pfd_prov) == 0;
    }
    EVQ_LOCK(evq);
    for (;;) {
        struct pollfd pfd[2 + EXS_ENG_MAX_CTX]; /* queue, providers, kernel sockets */
        struct timespec ts, *tsp = NULL;
        int n;

        if (evq_gone(evq, q)) {
            ret = -EINVAL;
            break;
        }
        /* as above, after the first look: the events came meanwhile */
        if ((driven || !exs__api_sock_live()) && evq->queued >= want) {
            ret = EXS_MIN(evq->queued, max);
            evq_take_n(evq, events, ret);
            break;
        }
        /* the clock only where a deadline needs it (t0: the caller's reading; after the
         * sleeper's registration just above, the reading before it) */
        if (!driven && t0)
            now = t0;
        else if (!fresh)
            now = spin_end == UINT64_MAX && deadline == UINT64_MAX ? 0 : exs__now_ns();
        fresh = 0;
        /* No spin, nothing queued, time left: the arm before the sleep is the first
         * look at the providers (-EAGAIN and a round when one has work: it drives
         * then), so no drive of its own first: a sleeping wait's one hold of the
         * progress lock instead of two, and no empty round (bench/README.md). */
        if (!driven && now >= spin_end && now < deadline && evq->queued < want)
            driven = 1;
        if (!driven || (now < spin_end && now < deadline)) {
            uint64_t end = EXS_MIN(spin_end, deadline);

            /* Drive, then look: POLL and the first phase of ADAPTIVE spin here (no
             * system call of their own, so no EINTR); NOTIFY drives once. Past its
             * end, the first spin still drives EVQ_SPIN_EVERY_MIN times. */
            EVQ_UNLOCK(evq);
            if (now < spin_end)
                spun = evq_spin(evq, q, want, now, now < end ? end : 0);
            else
                exs__engine_drive(EXS_ENG_DRIVE_WAIT);
            driven = 1;
            EVQ_LOCK(evq);
            continue;
        }
        if (now >= deadline) {
            ret = 0;
            break;
        }
        /* About to sleep: the queue's descriptors (and a threshold waiter's place) must
         * outlive the sleep, so the wait holds a reference from now on; q's live queue
         * (just looked at under the lock) still has the table's, so the count is above 0. */
        if (!held) {
            __atomic_add_fetch(&evq->refs, 1, __ATOMIC_RELAXED);
            held = 1;
        }
        if (want > 1) {
            if (evq->wfd < 0) {
                evq->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
                if (evq->wfd < 0) {
                    ret = -errno;
                    EXS_WARN(API, "evq %d: eventfd failed: %m", evq->handle);
                    break;
                }
                evq->wfd_on = 0;
            }
            if (!registered) {
                evq_waiter_add(evq, &w);
                registered = 1;
            }
        }
        if (!armed) {
            /* Arm the providers first, as no sleeper yet: when one has work, the arm
             * drives it (one round, -EAGAIN) and the events that round posts to this
             * queue write no descriptor; look at the queue again then. A waiter woken
             * by its own descriptor, a kernel socket or nothing (no provider fd
             * readable) is still a sleeper here: it stops being one first, and
             * registers again (and looks) after the arm. */
            if (sleeper) {
                evq->sleepers--;
                sleeper = 0;
            }
            EVQ_UNLOCK(evq);
            n = exs__engine_arm(pfd_prov);
            EVQ_LOCK(evq);
            if (n == -EAGAIN)
                continue;
            armed = 1; /* exs__engine_arm_end on every way out */
        }
        if (!sleeper) {
            /* From now on every post to this queue writes its descriptor: look at the
             * queue once more under the lock, then sleep. Provider work since the arm
             * makes its event fd readable (spec/threading.md §4, race 2). */
            evq->sleepers++;
            sleeper = 1;
            evq_sync_fds(evq);
            fresh = 1;
            continue;
        }
        pfd[0].fd = want > 1 ? evq->wfd : evq->qfd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        EVQ_UNLOCK(evq);
        for (int i = 0; i < EXS_ENG_MAX_CTX; i++) {
            pfd[1 + i].fd = pfd_prov[i]; /* -1 (ignored by ppoll): no such context */
            pfd[1 + i].events = POLLIN;
            pfd[1 + i].revents = 0;
        }
        /* kernel sockets' readiness: this thread runs their queues itself when woken */
        pfd[1 + EXS_ENG_MAX_CTX].fd = exs__api_kfd_wait_fd();
        pfd[1 + EXS_ENG_MAX_CTX].events = POLLIN;
        pfd[1 + EXS_ENG_MAX_CTX].revents = 0;
        if (deadline != UINT64_MAX) {
            ts.tv_sec = (time_t)((deadline - now) / 1000000000u);
            ts.tv_nsec = (long)((deadline - now) % 1000000000u);
            tsp = &ts;
        }
        /* poll-type calls are never restarted after a signal handler, even with
         * SA_RESTART, so a signal always ends the wait with EINTR. */
        n = evq_sleep(&(struct evq_sleep){evq, registered ? &w : NULL, pfd_prov}, pfd,
                      2 + EXS_ENG_MAX_CTX, tsp);
        slept = 1;
        ret = n < 0 ? -errno : 0;
        exs__engine_arm_end(pfd_prov); /* awake: a driver may disarm the providers now */
        armed = 0;
        EVQ_LOCK(evq);
        if (ret < 0)
            break;
        if (n > 0 && (pfd[0].revents & POLLNVAL)) {
            EXS_WARN(API, "evq %d: eventfd %d was closed by the application", evq->handle,
                     pfd[0].fd);
            ret = -EBADF;
            break;
        }
        if (n > 0 && (pfd[1 + EXS_ENG_MAX_CTX].revents & POLLIN)) {
            EVQ_UNLOCK(evq);
            exs__api_kfd_run_ready();
            EVQ_LOCK(evq);
        }
        if (n > 0 && ((pfd[1].revents | pfd[2].revents) & POLLIN)) {
            int only = EXS_ENG_DRIVE_ONLY;

            /* Awake: no longer a sleeper while driving, so the events this drive
             * produces for this queue write no descriptor (the next sleep registers
             * again and looks at the queue first). It drives the contexts that
             * signalled: the others were armed with nothing pending. */
            for (int i = 0; i < EXS_ENG_MAX_CTX; i++)
                if (pfd[1 + i].revents & POLLIN)
                    only |= EXS_ENG_DRIVE_CTX(i);
            evq->sleepers--;
            sleeper = 0;
            EVQ_UNLOCK(evq);
            EXS_CNT_INC(exs__eng_cnt.wake_drives);
            exs__engine_drive(only);
            EVQ_LOCK(evq);
        }
    }
    if (registered)
        evq_waiter_del(evq, &w);
    if (sleeper)
        evq->sleepers--;
    /* a learning wait's sample (under the lock: the queue is still q's, not one reused
     * since): long (it slept), its spin's time to the events, or about its spin (the
     * events came after the spin's end, before a sleep) */
    if (spin_ceil && ret > 0)
        evq_spin_seen(evq, slept                ? spin_ceil
                           : spun != UINT64_MAX ? EXS_MIN(spun, spin_ceil)
                                                : spin_end - t0);
    EVQ_UNLOCK(evq);
    if (armed) /* armed, then found its events (or an error) before it slept */
        exs__engine_arm_end(pfd_prov);
    exs__engine_driver_leave();
    if (held)
        exs__evq_put(evq);
    return ret;
}

/* exs_qdequeue's first look (nevents != 0, arguments checked), made only when the
 * process has no libexs socket (nothing to drive before taking events: evq_dequeue_wait;
 * evq_dequeue_full tests it): when the events wanted are queued, they are taken under one
 * hold of evq->lock, found without the table's lock and with no reference (a queue's
 * memory stays: evq_peek) and no clock read: the count, or -EINVAL (no such queue, or a
 * threshold above its depth). -EAGAIN: the wait's way (exs_qdequeue), which looks again. */
static inline __attribute__((always_inline)) int evq_dequeue_now(exs_qhandle_t q,
                                                                 exs_event_t *events, int nevents)
{
    struct exs_evq *evq = evq_peek(q);
    int want = nevents > 0 ? 1 : -nevents, ret = -EAGAIN;

    if (!evq)
        return -EINVAL;
    EVQ_LOCK(evq);
    if (!evq_st_is(__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE), q) || want > evq->depth) {
        ret = -EINVAL;
    } else if (evq->queued >= want) {
        ret = nevents > 0 ? EXS_MIN(evq->queued, nevents) : want;
        evq_take_n(evq, events, ret);
    }
    EVQ_UNLOCK(evq);
    return ret;
}

static int evq_dequeue_rest(exs_qhandle_t q, exs_event_t *events, int nevents,
                            const struct timespec *timeout);

/* exs_qdequeue the whole way: the argument checks, the first look, the wait. */
static __attribute__((noinline)) int evq_dequeue_full(exs_qhandle_t q, exs_event_t *events,
                                                      int nevents, const struct timespec *timeout)
{
    int ret;

    if (nevents > EXS_EVTVEC_MAX || nevents < -EXS_EVTVEC_MAX)
        return exs__err(EINVAL);
    if (nevents != 0 && events == NULL)
        return exs__err(EINVAL);
    if (timeout != NULL &&
        (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000))
        return exs__err(EINVAL);
    /* with libexs sockets, progress is driven first: the wait's way at once (which
     * answers a bad queue as the first look would) */
    if (nevents != 0 && !exs__api_sock_live() &&
        (ret = evq_dequeue_now(q, events, nevents)) != -EAGAIN)
        return ret < 0 ? exs__err(-ret) : ret;
    return evq_dequeue_rest(q, events, nevents, timeout);
}

/* exs_qdequeue's hot path with evq->lock held, when it cannot finish: the lock given
 * back, the whole way. */
static __attribute__((noinline, cold)) int evq_unlock_full(struct exs_evq *evq, exs_qhandle_t q,
                                                           exs_event_t *events, int nevents,
                                                           const struct timespec *timeout)
{
    EVQ_UNLOCK(evq);
    return evq_dequeue_full(q, events, nevents, timeout);
}

/* exs_qdequeue's hot path with evq->lock held: n (> 1) events taken, the lock given back. */
static __attribute__((noinline)) int evq_take_unlock(struct exs_evq *evq, exs_event_t *events,
                                                     int n)
{
    evq_take(evq, events, n);
    EVQ_UNLOCK(evq);
    return n;
}

/*
 * The events wanted are queued, the arguments are good, the process has no libexs socket
 * (nothing to drive first: evq_dequeue_wait), evq->lock is free at once and nobody
 * watches the queue's descriptors (no exs_qfd, no sleeper: nothing to write): the events
 * are taken under one hold of the lock, the queue found by handle without the table's
 * lock or a reference (evq_peek), with no clock read, in a leaf function (every other
 * call a tail call: no frame). Anything else goes the whole way (evq_dequeue_full), which
 * answers every error.
 */
int exs_qdequeue(exs_qhandle_t q, exs_event_t *events, int nevents, const struct timespec *timeout)
{
    struct exs_evq *evq;
    int want, n;

    /* a process with libexs sockets drives progress first: the whole way at once */
    if (exs__api_sock_live() || nevents == 0 || nevents > EXS_EVTVEC_MAX ||
        nevents < -EXS_EVTVEC_MAX || !events ||
        (timeout && (timeout->tv_sec < 0 || (unsigned long)timeout->tv_nsec >= 1000000000ul)) ||
        !(evq = evq_peek(q)))
        return evq_dequeue_full(q, events, nevents, timeout);
    if (!exs__evq_trylock(&evq->lock))
        return evq_dequeue_full(q, events, nevents, timeout);
    EXS_LOCK_ACQUIRE(EXS_LOCK_EVQ);
    want = nevents > 0 ? 1 : -nevents;
    if (!evq_st_is(__atomic_load_n(&evq->st, __ATOMIC_ACQUIRE), q) || want > evq->depth ||
        evq->queued < want || evq->exposed || evq->sleepers)
        return evq_unlock_full(evq, q, events, nevents, timeout);
    n = nevents > 0 ? EXS_MIN(evq->queued, nevents) : want;
    if (n > 1)
        return evq_take_unlock(evq, events, n);
    evq_take1(evq, events); /* no descriptor to bring in line: nobody watches them */
    EVQ_UNLOCK(evq);
    return 1;
}

/* exs_qdequeue past its first look (arguments checked): its own frame, so that the first
 * look needs none of the wait's. */
static __attribute__((noinline)) int evq_dequeue_rest(exs_qhandle_t q, exs_event_t *events,
                                                      int nevents, const struct timespec *timeout)
{
    struct exs_evq *evq;
    uint64_t deadline = UINT64_MAX, t0 = 0;
    int ret, want, max;

    /* Beyond ~290 years from boot the deadline would overflow: that is forever. */
    if (timeout != NULL && (uint64_t)timeout->tv_sec < (UINT64_MAX / 2) / 1000000000u) {
        t0 = exs__now_ns();
        deadline = t0 + (uint64_t)timeout->tv_sec * 1000000000u + (uint64_t)timeout->tv_nsec;
    }
    /* no reference: the wait takes one only to sleep (evq_dequeue_wait); until then the
     * queue's memory stays (parked at worst) and the wait asks st whether it is still
     * q's, at each look (issue 28: a locked add and sub per dequeue fewer) */
    evq = evq_peek(q);
    if (!evq || evq_gone(evq, q))
        return exs__err(EINVAL);
    if (nevents == 0) {
        exs__engine_drive(0);
        return 0;
    }
    want = nevents > 0 ? 1 : -nevents;
    max = nevents > 0 ? nevents : -nevents;
    if (want > __atomic_load_n(&evq->depth, __ATOMIC_RELAXED)) /* it could never be met */
        ret = -EINVAL;
    else
        ret = evq_dequeue_wait(q, evq, events, want, max, t0, deadline);
    return ret < 0 ? exs__err(-ret) : ret;
}

/* fork (fork.c). PREPARE/PARENT: the table's lock, for writing, held across the fork.
 * CHILD: every queue is the parent's (its events are the parent's operations'): the
 * handles become invalid as after exs_fini (fresh ones start above every old
 * generation), the child's copies of their descriptors are closed, the queues are left
 * unused. */
void exs__evq_fork(int phase)
{
    int gen_max;

    if (phase == EXS_FORK_PREPARE) {
        evq_tab_wrlock();
        return;
    }
    if (phase == EXS_FORK_PARENT) {
        evq_tab_unlock();
        return;
    }
    gen_max = evq_tab.gen_base;
    for (int i = 0; i < evq_tab.used; i++) {
        struct exs_evq *evq = evq_tab.slots[i].evq;

        gen_max = EXS_MAX(gen_max, evq_tab.slots[i].gen);
        if (!evq)
            continue;
        if (evq->qfd >= 0)
            exs__nc_close(evq->qfd);
        if (evq->wfd >= 0)
            exs__nc_close(evq->wfd);
        evq->qfd = evq->wfd = -1;
        exs__forsake(evq);
    }
    exs__forsake(exs__evq_tv); /* the old arrays are reachable from it */
    exs__forsake(evq_parked);
    evq_parked = NULL;
    pthread_mutex_init(&evq_free_lock, NULL);
    exs__evq_tv = NULL;
    evq_tab.slots = NULL;
    evq_tab.nslots = evq_tab.used = 0;
    evq_tab.free_head = evq_tab.free_tail = -1;
    evq_tab.gen_base = (gen_max + 1) & EVQ_GEN_MASK;
    evq_live = evq_private_live = 0;
    /* only this thread is left: the lock the parent's forking thread held is free */
    __atomic_store_n(&evq_tab.lock, 0, __ATOMIC_RELEASE);
    EXS_LOCK_RELEASE(EXS_LOCK_EVQ_TAB);
}
