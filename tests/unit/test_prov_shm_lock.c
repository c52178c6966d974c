/* SPDX-License-Identifier: MIT */
/* The lite lock given back with a plain store when nobody waits (exs/util/lite_lock.h,
 * exs__lite_lock_st / exs__lite_unlock_st: shm's nic_lock, the engine's progress lock): a
 * waiter whose mark that store overwrote is not woken and must take the lock after its
 * nap; under contention every hold exclusive. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "exs/prov/shm/shm.h"
#include "tests/unit/unit.h"

static double lock_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct lock_arg {
    struct exs_lite_lock l;
    int got;    /* atomic: the waiter holds it */
    long count; /* under l */
    int rounds;
};

static void *lock_waiter(void *p)
{
    struct lock_arg *a = p;

    exs__lite_lock_st(&a->l);
    __atomic_store_n(&a->got, 1, __ATOMIC_RELEASE);
    exs__lite_unlock_st(&a->l);
    return NULL;
}

/* The lost wake, made on purpose: the lock held, a waiter marks it 2 and sleeps; the
 * holder's give-back is then the store of a holder that read 1 before the mark (0, no
 * wake). The waiter takes the lock after its nap, within the deadline. With an unbounded
 * futex sleep (the waiter's nap removed) it would sleep for good. */
START_TEST(shm_nic_lock_lost_wake)
{
    struct lock_arg a = {0};
    pthread_t th;
    double deadline;

    exs__lite_lock_st(&a.l);
    ck_assert_int_eq(pthread_create(&th, NULL, lock_waiter, &a), 0);
    deadline = lock_now_ms() + 10000;
    while (__atomic_load_n(&a.l.v, __ATOMIC_ACQUIRE) != 2 && lock_now_ms() < deadline)
        sched_yield();
    ck_assert_int_eq(__atomic_load_n(&a.l.v, __ATOMIC_ACQUIRE), 2);
    __atomic_store_n(&a.l.v, 0, __ATOMIC_RELEASE); /* the racing store: no wake */
    while (!__atomic_load_n(&a.got, __ATOMIC_ACQUIRE) && lock_now_ms() < deadline)
        sched_yield();
    ck_assert_msg(__atomic_load_n(&a.got, __ATOMIC_ACQUIRE), "the waiter never took the lock");
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(__atomic_load_n(&a.l.v, __ATOMIC_ACQUIRE), 0);
}
END_TEST

static void *lock_counter(void *p)
{
    struct lock_arg *a = p;

    for (int i = 0; i < a->rounds; i++) {
        exs__lite_lock_st(&a->l);
        long c = a->count; /* a plain read-modify-write: torn by any overlap */

        if ((i & 63) == 0)
            sched_yield(); /* a holder off its CPU: the others wait, marked */
        a->count = c + 1;
        exs__lite_unlock_st(&a->l);
    }
    return NULL;
}

/* Four threads, each taking the lock 20,000 times (a hold in 64 yielding): the count is
 * exact and the lock free at the end. */
START_TEST(shm_nic_lock_exclusive)
{
    struct lock_arg a = {.rounds = 20000};
    pthread_t th[4];

    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, lock_counter, &a), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_int_eq(a.count, 4L * a.rounds);
    ck_assert_int_eq(a.l.v, 0);
}
END_TEST

Suite *prov_shm_lock_suite(void)
{
    Suite *s = suite_create("prov_shm_lock");
    TCase *tc = tcase_create("nic_lock");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, shm_nic_lock_lost_wake);
    tcase_add_test(tc, shm_nic_lock_exclusive);
    suite_add_tcase(s, tc);
    return s;
}
