/* SPDX-License-Identifier: MIT */
/* Small helpers shared by every layer: time, errors, assertions, bit tricks. */
#ifndef EXS_UTIL_UTIL_H
#define EXS_UTIL_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "exs/util/lockorder.h"

#define EXS_ARRAY_SIZE(_a) (sizeof(_a) / sizeof((_a)[0]))
#define EXS_MIN(_a, _b)    ((_a) < (_b) ? (_a) : (_b))
#define EXS_MAX(_a, _b)    ((_a) > (_b) ? (_a) : (_b))
#define EXS_LIKELY(_x)     __builtin_expect(!!(_x), 1)
#define EXS_UNLIKELY(_x)   __builtin_expect(!!(_x), 0)

void exs__assert_fail(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn));

/* Invariants only; user input is validated in api/ with errnos. */
#define EXS_ASSERT(_e) ((_e) ? (void)0 : exs__assert_fail(#_e, __FILE__, __LINE__, __func__))

/* The three moments of fork(2) at which the library's pthread_atfork handlers run
 * (exs/api/fork.c, spec/api.md section 2, "fork"): before it in the forking thread, then
 * after it in the parent, or in the child (its only thread, the forking one). */
enum exs_fork_phase { EXS_FORK_PREPARE, EXS_FORK_PARENT, EXS_FORK_CHILD };

/* Memory a forked child abandons (the parent's sockets, connections, contexts, tables:
 * exs/api/fork.c): never used or freed again, but kept reachable from here so a leak
 * checker at the child's exit does not report the parent's objects. Child only. */
void exs__forsake(const void *p);

/* A leaf mutex across fork(2): PREPARE locks it, PARENT unlocks it, CHILD makes it anew
 * (unlocked: the child's only thread held it, under the parent's thread id). */
void exs__mutex_fork(pthread_mutex_t *m, int phase);

/* Monotonic clock in nanoseconds / microseconds. */
static inline uint64_t exs__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t exs__now_us(void)
{
    return exs__now_ns() / 1000u;
}

/* pthread_create for the library's own threads (engine, tcp NIC, verbs CM): the new
 * thread blocks every asynchronous signal (all but SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS and SIGABRT), so SIGALRM, SIGINT and the like reach the application's
 * threads and interrupt their waits (spec/api.md), and is named name ("exs-..." , at
 * most 15 characters: top -H and /proc/self/task/N/comm show it). 0 or -errno. */
int exs__thread_create(pthread_t *thread, const char *name, void *(*fn)(void *arg), void *arg);

/* The ES-API boundary: set errno and return -1 (rsocket ERR()). */
/* The value of hexadecimal digit c, or -1. */
static inline int exs__hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static inline int exs__err(int err)
{
    errno = err;
    return -1;
}

#endif
