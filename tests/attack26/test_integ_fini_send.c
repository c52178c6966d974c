/* SPDX-License-Identifier: MIT */
/* Session 26 (h73): exs_fini frees the socket table's arrays (exs__api_sock_close_all),
 * which exs_send's first look (exs__api_sock_at: the array, its length, the slot) reads
 * without a lock; a send racing exs_fini reads freed memory (ASan: heap-use-after-free),
 * as exs_qdequeue's look at the queue table did (api_evq_attack26, fixed in evq.c). A call
 * racing exs_fini is the application's mistake, but its answer should be an error, not a
 * read of freed memory. Left for the owner of sock.c (kfd.c's tables may have the same
 * shape): this test shows it. NOT BUILT (it fails under ASan on main): copy it into
 * tests/integ/ and add integ_attack26_suite to tests/integ/main.c and integ.h; h73 saw
 * heap-use-after-free in exs__api_sock_at (exs_send) on tcp and shm, 2 of 2. A looker on the other
 * CPU sends on the last socket's number while the main thread opens a socket and calls exs_fini,
 * round after round (a number of rounds or a deadline). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "tests/integ/integ.h"

#include <sys/exs.h>

#define SF_ROUNDS     300
#define SF_DEADLINE_S 30

static int sf_fd = -1;    /* atomic */
static int sf_stop;       /* atomic */
static uint64_t sf_looks; /* atomic */

static void *sf_looker(void *p)
{
    char b = 0;

    (void)p;
    while (!__atomic_load_n(&sf_stop, __ATOMIC_ACQUIRE)) {
        int fd = __atomic_load_n(&sf_fd, __ATOMIC_ACQUIRE);

        if (fd >= 0) /* ENOTCONN, EBADF, ENOTSOCK...: any error is right */
            (void)exs_send(fd, &b, 1, 0, EXS_QHANDLE_INVALID, (exs_ahandle_t)-1,
                           EXS_MHANDLE_UNREGISTERED);
        __atomic_add_fetch(&sf_looks, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* exs_send's look at the socket table racing exs_fini reads no freed memory. */
START_TEST(send_at_fini)
{
    pthread_t t;
    struct timespec now;
    time_t end;
    int r;

    ck_assert_int_eq(setenv("EXS_PROVIDER", it_provider, 1), 0);
    clock_gettime(CLOCK_MONOTONIC, &now);
    end = now.tv_sec + SF_DEADLINE_S;
    ck_assert_int_eq(pthread_create(&t, NULL, sf_looker, NULL), 0);
    for (r = 0; r < SF_ROUNDS && now.tv_sec < end; r++) {
        int fd;

        ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION);
        fd = exs_socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(fd, 0);
        __atomic_store_n(&sf_fd, fd, __ATOMIC_RELEASE);
        /* the looker has looked at this table (a count, deadline-bounded: no sleep) */
        for (uint64_t l = __atomic_load_n(&sf_looks, __ATOMIC_RELAXED) + 2;
             __atomic_load_n(&sf_looks, __ATOMIC_RELAXED) < l && now.tv_sec < end;)
            clock_gettime(CLOCK_MONOTONIC, &now);
        exs_fini();
        clock_gettime(CLOCK_MONOTONIC, &now);
    }
    __atomic_store_n(&sf_stop, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_int_gt(r, 0);
}
END_TEST

Suite *integ_attack26_suite(void)
{
    Suite *s = suite_create("integ_attack26");
    TCase *tc = tcase_create("fini_send");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, send_at_fini);
    suite_add_tcase(s, tc);
    return s;
}
