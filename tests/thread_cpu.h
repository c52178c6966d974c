/* SPDX-License-Identifier: MIT */
/* Tests that judge by CPU time, not by the clock: a thread's own CPU time, and a pin of a
 * thread to one CPU (a holder and a waiter made to share it). */
#ifndef EXS_TESTS_THREAD_CPU_H
#define EXS_TESTS_THREAD_CPU_H

#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t test_thread_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void test_pin_self(int cpu)
{
    cpu_set_t set;

    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

#endif
