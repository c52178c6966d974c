/* SPDX-License-Identifier: MIT */
/* Report a test that cannot run here as skipped; tests/run-checks.sh counts the SKIP lines. */
#ifndef EXS_TESTS_SKIP_H
#define EXS_TESTS_SKIP_H

#include <stdarg.h>
#include <stdio.h>

/* Print "SKIP <test>: <reason>" as one flushed line, then return from the test without
 * asserting anything. Check still counts the test as run and passed; run-checks.sh
 * subtracts one pass per SKIP line and prints it in its "N skipped" total. Call it once
 * per test (per loop iteration of a loop test), only for a test that checks nothing. */
__attribute__((format(printf, 2, 3))) static inline void test_skip(const char *test,
                                                                   const char *reason, ...)
{
    va_list ap;

    flockfile(stdout);
    printf("SKIP %s: ", test);
    va_start(ap, reason);
    vprintf(reason, ap);
    va_end(ap);
    printf("\n");
    funlockfile(stdout);
    fflush(stdout);
}

#endif
