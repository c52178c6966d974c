/* SPDX-License-Identifier: MIT */
/* A small mutex: the progress lock, a connection's, an event queue's, a kfd's. */
#ifndef EXS_UTIL_LITE_LOCK_H
#define EXS_UTIL_LITE_LOCK_H

#include "exs/util/lockorder.h"

/*
 * A futex mutex (0 free, 1 held, 2 held and maybe waited for): taking a free lock is one
 * CAS, giving it back one exchange, inline, where pthread_mutex_lock and _unlock cost some
 * 55 instructions a pair (issue 27: an exs_send on a kernel socket and its dequeue take
 * three). Not recursive, no owner check; a waiter sleeps in the kernel (FUTEX_WAIT), never
 * spins. The lock-order checks are those of EXS_MUTEX_LOCK. Memory: a zeroed one is free.
 */
struct exs_lite_lock {
    int v;
};

void exs__lite_lock_wait(struct exs_lite_lock *l);
void exs__lite_lock_wake(struct exs_lite_lock *l);

static inline __attribute__((always_inline)) void exs__lite_lock(struct exs_lite_lock *l)
{
    int c = 0;

    if (!__atomic_compare_exchange_n(&l->v, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        exs__lite_lock_wait(l);
}

/* 1 when l was free and is now taken (no wait); the caller makes EXS_LOCK_ACQUIRE's check. */
static inline __attribute__((always_inline)) int exs__lite_trylock(struct exs_lite_lock *l)
{
    int c = 0;

    return __atomic_compare_exchange_n(&l->v, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static inline __attribute__((always_inline)) void exs__lite_unlock(struct exs_lite_lock *l)
{
    if (__atomic_exchange_n(&l->v, 0, __ATOMIC_RELEASE) == 2)
        exs__lite_lock_wake(l);
}

/*
 * The same lock given back with a plain store when nobody marked it (exs__lite_unlock_st:
 * the word read 1, then 0 stored, releasing; no locked instruction), else as
 * exs__lite_unlock. A waiter's mark (2) made between that read and the store is lost and
 * nobody wakes it, so every waiter of such a lock sleeps at most EXS_LITE_NAP_NS at a time
 * and looks again (exs__lite_lock_st): a lost wake costs it one nap, never the lock. One
 * lock is taken either way, never both (the progress lock, shm's nic_lock).
 */
#define EXS_LITE_NAP_NS 100000L
void exs__lite_lock_nap(struct exs_lite_lock *l);

static inline __attribute__((always_inline)) void exs__lite_lock_st(struct exs_lite_lock *l)
{
    int c = 0;

    if (!__atomic_compare_exchange_n(&l->v, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        exs__lite_lock_nap(l);
}

static inline __attribute__((always_inline)) void exs__lite_unlock_st(struct exs_lite_lock *l)
{
    if (__atomic_load_n(&l->v, __ATOMIC_RELAXED) == 1)
        __atomic_store_n(&l->v, 0, __ATOMIC_RELEASE);
    else
        exs__lite_unlock(l); /* marked: the exchange, and a waiter woken */
}

#define EXS_LITE_LOCK(_l, _lvl)                                                                    \
    do {                                                                                           \
        EXS_LOCK_ACQUIRE(_lvl);                                                                    \
        exs__lite_lock(_l);                                                                        \
    } while (0)
#define EXS_LITE_UNLOCK(_l, _lvl)                                                                  \
    do {                                                                                           \
        exs__lite_unlock(_l);                                                                      \
        EXS_LOCK_RELEASE(_lvl);                                                                    \
    } while (0)

#endif
