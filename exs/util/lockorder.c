/* SPDX-License-Identifier: MIT */
/* The debug lock-order checker's per-thread stack of held lock levels. */
#include "exs/util/lockorder.h"

#ifdef EXS_LOCK_DEBUG
#include <stdio.h>

#include "exs/util/util.h"

#define LOCK_STACK_MAX 16

static __thread int lock_stack[LOCK_STACK_MAX];
static __thread int lock_depth;
static __thread unsigned long lock_takes[EXS_LOCK_LEAF + 1]; /* per level, ever */

void exs__lock_acquire(int level, const char *file, int line)
{
    if (lock_depth > 0 && lock_stack[lock_depth - 1] >= level) {
        fprintf(stderr, "exs: lock order: level %d taken at %s:%d while holding level %d\n", level,
                file, line, lock_stack[lock_depth - 1]);
        EXS_ASSERT(!"lock order violated");
    }
    EXS_ASSERT(lock_depth < LOCK_STACK_MAX);
    lock_stack[lock_depth++] = level;
    if (level > 0 && level <= EXS_LOCK_LEAF)
        lock_takes[level]++;
}

void exs__lock_release(int level)
{
    for (int i = lock_depth - 1; i >= 0; i--) {
        if (lock_stack[i] == level) {
            for (int j = i; j < lock_depth - 1; j++)
                lock_stack[j] = lock_stack[j + 1];
            lock_depth--;
            return;
        }
    }
    EXS_ASSERT(!"lock released that was not recorded");
}

int exs__lock_depth(void)
{
    return lock_depth;
}

unsigned long exs__lock_takes(int level)
{
    return level > 0 && level <= EXS_LOCK_LEAF ? lock_takes[level] : 0;
}
#else
/* ISO C forbids an empty translation unit. */
typedef int exs_lockorder_unused;
#endif
