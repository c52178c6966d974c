/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/util/util.h and util.c: assertions, errors, clocks, small macros. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/util/util.h"
#include "tests/unit/unit.h"

static int assert_true_count;

static int bump(void)
{
    return ++assert_true_count;
}

START_TEST(test_assert_pass)
{
    EXS_ASSERT(bump() == 1); /* evaluated exactly once */
    EXS_ASSERT(1 + 1 == 2);
    ck_assert_int_eq(assert_true_count, 1);
}
END_TEST

START_TEST(test_assert_fail)
{
    int fds[2], status, line;
    pid_t pid;
    char buf[512] = "", want[512];
    ssize_t n, got = 0;

    ck_assert_int_eq(pipe(fds), 0);
    line = __LINE__ + 5;
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        EXS_ASSERT(assert_true_count == 42);
        _exit(0);
    }
    close(fds[1]);
    while ((n = read(fds[0], buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(WTERMSIG(status), SIGABRT);
    snprintf(want, sizeof(want), "exs: assertion failed: assert_true_count == 42 (%s:%d %s)\n",
             __FILE__, line, __func__);
    ck_assert_ptr_nonnull(strstr(buf, want));
}
END_TEST

START_TEST(test_err_and_macros)
{
    int a[7];

    errno = 0;
    ck_assert_int_eq(exs__err(ECONNRESET), -1);
    ck_assert_int_eq(errno, ECONNRESET);
    ck_assert_uint_eq(EXS_ARRAY_SIZE(a), 7);
    ck_assert_int_eq(EXS_MIN(3, -4), -4);
    ck_assert_int_eq(EXS_MAX(3, -4), 3);
    ck_assert(EXS_LIKELY(1));
    ck_assert(!EXS_UNLIKELY(0));
}
END_TEST

START_TEST(test_clock)
{
    uint64_t t0 = exs__now_ns(), u0 = exs__now_us(), t1;

    usleep(2000);
    t1 = exs__now_ns();
    ck_assert_uint_ge(t1 - t0, 2000000);
    ck_assert_uint_lt(t1 - t0, 5000000000ull);
    ck_assert_uint_ge(exs__now_us(), u0 + 2000);
}
END_TEST

Suite *util_misc_suite(void)
{
    Suite *s = suite_create("util_misc");
    TCase *tc = tcase_create("misc");

    tcase_add_test(tc, test_assert_pass);
    tcase_add_test(tc, test_assert_fail);
    tcase_add_test(tc, test_err_and_macros);
    tcase_add_test(tc, test_clock);
    suite_add_tcase(s, tc);
    return s;
}
