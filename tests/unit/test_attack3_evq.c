/* SPDX-License-Identifier: MIT */
/* Attack review of session 25 (h68), issue 28's wait without a reference: spec/api.md says
 * that at exs_fini "threads blocked in exs_qdequeue return -1/EINVAL". A spinning wait
 * (POLL, or ADAPTIVE's spin) holds no reference on its queue since 6517e9a; exs_fini's
 * destroy (exs__evq_destroy_all) drops the table's reference, the queue is parked, and
 * evq_parked_free frees the parked memory the spinner still reads (evq->queued, evq->st)
 * and then locks (evq->lock, whose word free() overwrites): a use after free (ASan), or a
 * waiter that never returns (the lock word non-zero: its wait naps forever). Both threads
 * run on one CPU, so that the destroy runs whole while the spinner is off its CPU (on two
 * CPUs the spinner mostly sees the dead bit and leaves before the free: the race is lost
 * only when it is preempted then, as under load). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "exs/api/evq.h"
#include "exs/util/log.h"
#include "tests/unit/unit.h"

#include <sys/exs.h>

#define EF_ROUNDS     8
#define EF_SPIN_CPU   (2ull * 1000 * 1000) /* the waiter's CPU time: it spins */
#define EF_DEADLINE_S 20                   /* bound of every condition wait */

struct ef_waiter {
    exs_qhandle_t q;
    int ret, err;
    pthread_t self;
};

static void *ef_main(void *p)
{
    struct ef_waiter *w = p;
    struct timespec ts = {EF_DEADLINE_S * 3, 0}; /* longer than the test: a wait that
                                                  * misses the destroy does not return */
    exs_event_t ev;

    w->ret = exs_qdequeue(w->q, &ev, 1, &ts);
    w->err = w->ret < 0 ? errno : 0;
    return NULL;
}

static uint64_t ef_thread_cpu_ns(pthread_t t)
{
    clockid_t c;
    struct timespec ts;

    if (pthread_getcpuclockid(t, &c) || clock_gettime(c, &ts))
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ef_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

/* A POLL waiter spinning on its queue when exs_fini's destroy runs returns -1/EINVAL. */
START_TEST(ef_spinner_at_fini)
{
    cpu_set_t one, all;
    int cpu = sched_getcpu();

    ck_assert_int_ge(cpu, 0);
    ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0); /* inherited by waiters */
    for (int r = 0; r < EF_ROUNDS; r++) {
        struct ef_waiter w = {0};
        struct timespec dl;
        uint64_t end = ef_now_s() + EF_DEADLINE_S;
        int ret;

        w.q = exs_qcreate(4);
        ck_assert_int_gt(w.q, 0);
        ck_assert_int_eq(exs_qsetwait(w.q, EXS_WAIT_POLL, 0), 0);
        ck_assert_int_eq(pthread_create(&w.self, NULL, ef_main, &w), 0);
        /* the waiter is in its spin once it has spent CPU time (not a fixed sleep) */
        while (ef_thread_cpu_ns(w.self) < EF_SPIN_CPU && ef_now_s() < end)
            sched_yield();
        ck_assert_msg(ef_thread_cpu_ns(w.self) >= EF_SPIN_CPU, "the waiter never spun");
        exs__log_level = EXS_LOG_ERR;
        exs__evq_destroy_all(); /* exs_fini's step 5 */
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += EF_DEADLINE_S;
        ret = pthread_timedjoin_np(w.self, NULL, &dl);
        ck_assert_msg(ret == 0,
                      "round %d: the spinning waiter did not return %d s after exs_fini's "
                      "destroy of its queue",
                      r, EF_DEADLINE_S);
        ck_assert_int_eq(w.ret, -1);
        ck_assert_int_eq(w.err, EINVAL);
    }
    ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);
    ck_assert_int_eq(exs__evq_live_count(), 0);
}
END_TEST

Suite *api_evq_attack3_suite(void)
{
    Suite *s = suite_create("api_evq_attack3");
    TCase *tc = tcase_create("fini_spinner");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ef_spinner_at_fini);
    suite_add_tcase(s, tc);
    return s;
}
