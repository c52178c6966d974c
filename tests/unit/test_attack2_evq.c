/* SPDX-License-Identifier: MIT */
/* Attack review of session 25 (issue 28's event queue lock): a thread waiting for a queue's
 * lock must not take the CPU from the thread that holds it. A real-time application thread
 * (SCHED_FIFO) that meets the lock held by an ordinary thread on its own CPU, and spins or
 * yields instead of sleeping, keeps the holder off that CPU (sched_yield lets only threads
 * of its own priority run) until the kernel's real-time throttle gives the holder its
 * 5 %: about a second per such meeting, forever with the throttle off. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "exs/api/evq.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "tests/thread_cpu.h"
#include "tests/unit/unit.h"

#include <sys/exs.h>

#define EA_HOLD_NS (50ull * 1000 * 1000) /* the holder's CPU time inside the lock */

static sem_t ea_go;  /* the waiter's start: the holder is inside the lock */
static int ea_armed; /* atomic: the next log line is the holder's, inside the lock */
static int ea_fired; /* the hook ran inside the hold */
static uint64_t ea_waiter_cpu_ns;
static int ea_waiter_ret;
static exs_qhandle_t ea_q;
static int ea_cpu;

/* The log's hook: runs in the thread that logs, inside exs__evq_clean's hold of the queue's
 * lock (its debug line about the events discarded). The waiter starts, and the holder
 * works on for EA_HOLD_NS of its own CPU time (load-independent). */
static void ea_hook(const char *line, size_t len)
{
    uint64_t t0;

    (void)line;
    (void)len;
    if (!__atomic_exchange_n(&ea_armed, 0, __ATOMIC_ACQ_REL))
        return;
    ea_fired = 1;
    sem_post(&ea_go);
    t0 = test_thread_cpu_ns();
    while (test_thread_cpu_ns() - t0 < EA_HOLD_NS)
        ;
}

/* The real-time waiter: once the holder is inside, a look at the queue (no wait), which
 * needs its lock; its own CPU time over that call recorded. */
static void *ea_waiter(void *arg)
{
    static const struct timespec zero = {0, 0};
    exs_event_t ev;
    uint64_t c0;

    (void)arg;
    test_pin_self(ea_cpu);
    while (sem_wait(&ea_go) < 0 && errno == EINTR)
        ;
    c0 = test_thread_cpu_ns();
    ea_waiter_ret = exs_qdequeue(ea_q, &ev, 1, &zero);
    ea_waiter_cpu_ns = test_thread_cpu_ns() - c0;
    return NULL;
}

static void *ea_holder(void *arg)
{
    (void)arg;
    test_pin_self(ea_cpu);
    __atomic_store_n(&ea_armed, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(exs__evq_clean(ea_q), 0); /* logs inside the lock: ea_hook */
    return NULL;
}

/*
 * An ordinary thread holds the queue's lock (exs__evq_clean, its log line's hook working
 * 50 ms of CPU inside the hold) when a SCHED_FIFO thread on the same CPU looks at the
 * queue: the waiter must sleep until the lock is free, not spend the holder's CPU: its
 * own CPU time over the look stays below half the hold's. Skipped where SCHED_FIFO is not
 * allowed.
 */
START_TEST(ea_rt_waiter_sleeps)
{
    struct sched_param sp = {.sched_priority = 1};
    pthread_attr_t attr;
    pthread_t w, h;
    cpu_set_t set;
    struct exs_evq *evq;
    exs_event_t ev;
    FILE *devnull;
    int ret;

    unit_env_clean();
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    for (ea_cpu = 0; !CPU_ISSET(ea_cpu, &set); ea_cpu++)
        ;
    devnull = fopen("/dev/null", "w");
    ck_assert_ptr_nonnull(devnull);
    exs__log_set_stream(devnull);
    exs__log_level = EXS_LOG_DBG;
    exs__log_set_hook(ea_hook);
    ea_q = exs_qcreate(16);
    ck_assert_int_ne(ea_q, EXS_QHANDLE_INVALID);
    /* one event queued: exs__evq_clean discards it, with a debug line, inside the lock */
    ck_assert_int_eq(exs__evq_get(ea_q, &evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    memset(&ev, 0, sizeof(ev));
    ev.exs_evt_type = EXS_EVT_SEND;
    exs__evq_post(evq, &ev);
    exs__evq_put(evq);
    ck_assert_int_eq(sem_init(&ea_go, 0, 0), 0);
    pthread_attr_init(&attr);
    pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
    pthread_attr_setschedparam(&attr, &sp);
    ret = pthread_create(&w, &attr, ea_waiter, NULL);
    pthread_attr_destroy(&attr);
    if (ret == EPERM) {
        fprintf(stderr, "ea_rt_waiter_sleeps: skipped: SCHED_FIFO not allowed\n");
        exs__log_set_hook(NULL);
        exs_qdelete(ea_q);
        return;
    }
    ck_assert_int_eq(ret, 0);
    ck_assert_int_eq(pthread_create(&h, NULL, ea_holder, NULL), 0);
    pthread_join(h, NULL);
    pthread_join(w, NULL);
    exs__log_set_hook(NULL);
    exs__log_set_stream(NULL);
    exs__log_level = EXS_LOG_ERR;
    fclose(devnull);
    ck_assert_msg(ea_fired, "the holder's log line inside the lock never came");
    ck_assert_int_ge(ea_waiter_ret, 0);
    ck_assert_msg(ea_waiter_cpu_ns < EA_HOLD_NS / 2,
                  "the real-time waiter spent %.1f ms of CPU waiting for a lock held %.0f ms "
                  "(its holder kept off its CPU)",
                  ea_waiter_cpu_ns / 1e6, EA_HOLD_NS / 1e6);
    ck_assert_int_eq(exs_qdelete(ea_q), 0);
    sem_destroy(&ea_go);
}
END_TEST

Suite *api_evq_attack2_suite(void)
{
    Suite *s = suite_create("api_evq_attack2");
    TCase *tc = tcase_create("rt_waiter");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, ea_rt_waiter_sleeps);
    suite_add_tcase(s, tc);
    return s;
}
