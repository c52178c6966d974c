/* SPDX-License-Identifier: MIT */
/* Out-of-line helpers of util.h: the assertion failure path. */
#include <stdio.h>
#include <stdlib.h>

#include "exs/util/util.h"

void exs__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "exs: assertion failed: %s (%s:%d %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
