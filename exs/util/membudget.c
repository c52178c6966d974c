/* SPDX-License-Identifier: MIT */
/* The process-wide memory account against EXS_MEM_BUDGET (spec/protocol.md §9.3). */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>

#include "exs/util/counters.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* Given back since the last trim before an account at 0 trims the heap: a trim walks
 * every arena, so connections that come and go one at a time do not pay it each time. */
#define MEM_TRIM_MIN (16ull << 20)

struct exs_mem_counters exs__mem;
static uint64_t mem_given; /* bytes given back since the last trim */

static const struct exs_counter_desc mem_counter_desc[] = {
    EXS_COUNTER(struct exs_mem_counters, mem_used,
                "bytes peers made the library hold now: rings, send buffers, control slots, "
                "batch staging, pending messages, ADVERTs, resume state (gauge)"),
    EXS_COUNTER(struct exs_mem_counters, mem_budget, "EXS_MEM_BUDGET, bytes; 0 = no bound (gauge)"),
    EXS_COUNTER(struct exs_mem_counters, mem_peak, "most bytes held at once (gauge)"),
    EXS_COUNTER(struct exs_mem_counters, mem_refused_conns,
                "connections refused because the budget was reached"),
    EXS_COUNTER(struct exs_mem_counters, mem_refused_growth,
                "ring grows refused because the budget was reached"),
    EXS_COUNTER(struct exs_mem_counters, mem_refused_other,
                "send buffers, batch staging and per-message tables refused because the budget "
                "was reached (a table refused ends its connection)"),
};

static struct exs_counter_set mem_cset = {
    .name = "mem",
    .desc = mem_counter_desc,
    .count = sizeof(mem_counter_desc) / sizeof(mem_counter_desc[0]),
    .base = &exs__mem,
};

static pthread_once_t mem_cset_once = PTHREAD_ONCE_INIT;

static void mem_cset_add(void)
{
    exs__counters_register(&mem_cset);
}

void exs__mem_cset_register(void)
{
    pthread_once(&mem_cset_once, mem_cset_add);
}

static uint64_t mem_budget(void)
{
    uint64_t b = __atomic_load_n(&exs__params.mem_budget, __ATOMIC_RELAXED);

    if (__atomic_load_n(&exs__mem.mem_budget, __ATOMIC_RELAXED) != b)
        __atomic_store_n(&exs__mem.mem_budget, b, __ATOMIC_RELAXED);
    return b;
}

int exs__mem_take(uint64_t n, enum exs_mem_kind kind, uint64_t slack)
{
    uint64_t budget = mem_budget();
    uint64_t cur = __atomic_load_n(&exs__mem.mem_used, __ATOMIC_RELAXED), peak;

    do {
        if (kind != EXS_MEM_FORCE && budget && (cur + n + slack > budget || cur + n < cur)) {
            switch (kind) {
            case EXS_MEM_CONN:
                EXS_CNT_INC(exs__mem.mem_refused_conns);
                break;
            case EXS_MEM_GROW:
                EXS_CNT_INC(exs__mem.mem_refused_growth);
                break;
            default:
                EXS_CNT_INC(exs__mem.mem_refused_other);
                break;
            }
            return -ENOBUFS;
        }
    } while (!__atomic_compare_exchange_n(&exs__mem.mem_used, &cur, cur + n, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    peak = __atomic_load_n(&exs__mem.mem_peak, __ATOMIC_RELAXED);
    while (cur + n > peak && !__atomic_compare_exchange_n(&exs__mem.mem_peak, &peak, cur + n, 1,
                                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return 0;
}

void exs__mem_give(uint64_t n)
{
    uint64_t before = __atomic_fetch_sub(&exs__mem.mem_used, n, __ATOMIC_RELAXED);
    uint64_t left = before - n;
    uint64_t given = __atomic_add_fetch(&mem_given, n, __ATOMIC_RELAXED);

    EXS_ASSERT(before >= n); /* given back more than was charged */

    /* the last connection's memory went back: so does the heap's free memory (glibc keeps
     * freed chunks of its arenas otherwise, and a peer's many small tables would stay in
     * the process's RSS after it left) */
    if (!left && given >= MEM_TRIM_MIN && __atomic_exchange_n(&mem_given, 0, __ATOMIC_RELAXED))
        malloc_trim(0);
}

uint64_t exs__mem_used(void)
{
    return __atomic_load_n(&exs__mem.mem_used, __ATOMIC_RELAXED);
}

void exs__mem_fork_child(void)
{
    __atomic_store_n(&exs__mem.mem_used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&mem_given, 0, __ATOMIC_RELAXED);
}
