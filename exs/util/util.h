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
#define EXS_ASSERT(_e)                                                               \
    ((_e) ? (void)0 : exs__assert_fail(#_e, __FILE__, __LINE__, __func__))

/* Monotonic clock in nanoseconds / microseconds. */
static inline uint64_t exs__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t exs__now_us(void) { return exs__now_ns() / 1000u; }

/* pthread_create for the library's own threads (engine, tcp NIC, verbs CM): the new
 * thread blocks every asynchronous signal (all but SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGTRAP, SIGSYS and SIGABRT), so SIGALRM, SIGINT and the like reach the application's
 * threads and interrupt their waits (spec/api.md), and is named name ("exs-..." , at
 * most 15 characters: top -H and /proc/self/task/N/comm show it). 0 or -errno. */
int exs__thread_create(pthread_t *thread, const char *name, void *(*fn)(void *arg), void *arg);

/* The ES-API boundary: set errno and return -1 (rsocket ERR()). */
static inline int exs__err(int err)
{
    errno = err;
    return -1;
}

#endif
