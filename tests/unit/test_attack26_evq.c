/* SPDX-License-Identifier: MIT */
/* Session 26 (h73), h68's note: exs_qdequeue's first look (evq_peek) finds a queue by
 * handle without the table's lock: it loads the table's array (exs__evq_tv), then its
 * length and the slot. exs_fini's destroy (exs__evq_destroy_all) freed the arrays, so a
 * look racing it read freed memory (ASan: heap-use-after-free in exs__evq_peek). A call
 * racing exs_fini is the application's mistake, but the answer must be EINVAL, not a read
 * of freed memory: the arrays now stay, emptied, for the next exs_init's queues (as the
 * parked queues do since fee5545). The looker runs on the other CPU while the main thread
 * creates a queue and destroys the table, round after round (a condition-bounded loop: a
 * number of rounds, or a deadline on a loaded machine). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "exs/api/evq.h"
#include "exs/util/log.h"
#include "tests/unit/unit.h"

#include <sys/exs.h>

#define EP_ROUNDS     20000
#define EP_DEADLINE_S 20

static exs_qhandle_t ep_q; /* atomic: the handle the looker tries */
static int ep_stop;        /* atomic */
static uint64_t ep_looks;  /* atomic: looks made */

static uint64_t ep_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

static void *ep_looker(void *p)
{
    struct timespec zero = {0, 0};
    exs_event_t ev;

    (void)p;
    while (!__atomic_load_n(&ep_stop, __ATOMIC_ACQUIRE)) {
        exs_qhandle_t q = __atomic_load_n(&ep_q, __ATOMIC_ACQUIRE);

        if (q > 0)
            (void)exs_qdequeue(q, &ev, 1, &zero); /* EAGAIN or EINVAL: either is right */
        __atomic_add_fetch(&ep_looks, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* A look at a queue racing exs_fini's destroy of the table reads no freed memory. */
START_TEST(ep_peek_at_fini)
{
    pthread_t t;
    uint64_t end = ep_now_s() + EP_DEADLINE_S;
    int r;

    exs__log_level = EXS_LOG_ERR;
    __atomic_store_n(&ep_stop, 0, __ATOMIC_RELAXED);
    ck_assert_int_eq(pthread_create(&t, NULL, ep_looker, NULL), 0);
    for (r = 0; r < EP_ROUNDS && ep_now_s() < end; r++) {
        exs_qhandle_t q = exs_qcreate(4);

        ck_assert_int_gt(q, 0);
        __atomic_store_n(&ep_q, q, __ATOMIC_RELEASE);
        /* the looker has looked at this table (not a sleep: a count, deadline-bounded) */
        for (uint64_t l = __atomic_load_n(&ep_looks, __ATOMIC_RELAXED) + 2;
             __atomic_load_n(&ep_looks, __ATOMIC_RELAXED) < l && ep_now_s() < end;)
            ;
        exs__evq_destroy_all(); /* exs_fini's step 5 */
    }
    __atomic_store_n(&ep_stop, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_int_gt(r, 0);
    ck_assert_int_eq(exs__evq_live_count(), 0);
}
END_TEST

Suite *api_evq_attack26_suite(void)
{
    Suite *s = suite_create("api_evq_attack26");
    TCase *tc = tcase_create("fini_peek");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ep_peek_at_fini);
    suite_add_tcase(s, tc);
    return s;
}
