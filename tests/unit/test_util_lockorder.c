/* SPDX-License-Identifier: MIT */
/* The debug lock-order checker: inner locks pass, an outer lock taken under an inner one aborts. */
#include <check.h>
#include <signal.h>

#include "exs/util/lockorder.h"
#include "tests/skip.h"
#include "tests/unit/unit.h"

#ifdef EXS_LOCK_DEBUG
/* Outermost first, with a release out of order: allowed, and the stack empties. */
START_TEST(test_lockorder_inner_ok)
{
    ck_assert_int_eq(exs__lock_depth(), 0);
    EXS_LOCK_ACQUIRE(EXS_LOCK_PROGRESS);
    EXS_LOCK_ACQUIRE(EXS_LOCK_CONN);
    EXS_LOCK_ACQUIRE(EXS_LOCK_SOCK);
    ck_assert_int_eq(exs__lock_depth(), 3);
    EXS_LOCK_RELEASE(EXS_LOCK_CONN);
    EXS_LOCK_ACQUIRE(EXS_LOCK_EVQ);
    EXS_LOCK_RELEASE(EXS_LOCK_EVQ);
    EXS_LOCK_RELEASE(EXS_LOCK_SOCK);
    EXS_LOCK_RELEASE(EXS_LOCK_PROGRESS);
    ck_assert_int_eq(exs__lock_depth(), 0);
}
END_TEST

/* The progress lock taken while an event queue's lock is held: abort. */
START_TEST(test_lockorder_violation_aborts)
{
    EXS_LOCK_ACQUIRE(EXS_LOCK_EVQ);
    EXS_LOCK_ACQUIRE(EXS_LOCK_PROGRESS);
}
END_TEST

/* The same level twice (two connections' locks at once): abort. */
START_TEST(test_lockorder_same_level_aborts)
{
    EXS_LOCK_ACQUIRE(EXS_LOCK_CONN);
    EXS_LOCK_ACQUIRE(EXS_LOCK_CONN);
}
END_TEST
#else
START_TEST(test_lockorder_skip)
{
    test_skip("lockorder", "EXS_LOCK_DEBUG is off in this build (on in ASan/TSan builds)");
}
END_TEST
#endif

Suite *util_lockorder_suite(void)
{
    Suite *s = suite_create("util_lockorder");
    TCase *tc = tcase_create("lockorder");

#ifdef EXS_LOCK_DEBUG
    tcase_add_test(tc, test_lockorder_inner_ok);
    tcase_add_test_raise_signal(tc, test_lockorder_violation_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_lockorder_same_level_aborts, SIGABRT);
#else
    tcase_add_test(tc, test_lockorder_skip);
#endif
    suite_add_tcase(s, tc);
    return s;
}
