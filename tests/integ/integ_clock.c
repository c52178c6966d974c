/* SPDX-License-Identifier: MIT */
/* The test binary's own clock_gettime: it counts the calling thread's reads of the clock
 * while it_clock_count(1) (a read is a system call where the clock source has no vDSO
 * path, as in the TCG guest of make check-rxe), then asks the C library's. */
#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

#include "tests/integ/integ.h"

static __thread int clk_on;
static __thread uint64_t clk_reads;

void it_clock_count(int on)
{
    clk_on = on;
}

uint64_t it_clock_reads(void)
{
    return clk_reads;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*next)(clockid_t, struct timespec *);
    int (*fn)(clockid_t, struct timespec *) = __atomic_load_n(&next, __ATOMIC_ACQUIRE);

    if (!fn) {
        fn = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
        __atomic_store_n(&next, fn, __ATOMIC_RELEASE);
    }
    if (clk_on)
        clk_reads++;
    return fn(id, ts);
}
