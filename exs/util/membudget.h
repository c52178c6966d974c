/* SPDX-License-Identifier: MIT */
/* The process-wide memory account: every byte a peer can make the library hold, against
 * EXS_MEM_BUDGET (spec/protocol.md §10). Atomic counters, no lock. */
#ifndef EXS_UTIL_MEMBUDGET_H
#define EXS_UTIL_MEMBUDGET_H

#include <stddef.h>
#include <stdint.h>

/* What a charge is for: it decides which refusal counter a refusal counts in. */
enum exs_mem_kind {
    EXS_MEM_CONN,  /* a new connection's memory: refused past the budget (mem_refused_conns) */
    EXS_MEM_GROW,  /* a ring grow (§7.4): refused past the budget (mem_refused_growth) */
    EXS_MEM_OTHER, /* a buffer or table a peer makes a live connection take: refused past
                    * the budget (mem_refused_other) */
    EXS_MEM_FORCE, /* never refused: memory that replaces what was just given back (a
                    * resume's new path) or a ring shrink */
};

/* The set "mem" (exsctl stat --counters): gauges and refusals. */
struct exs_mem_counters {
    uint64_t mem_used;           /* bytes charged now */
    uint64_t mem_budget;         /* EXS_MEM_BUDGET as last seen (0: no bound) */
    uint64_t mem_peak;           /* most bytes charged at once */
    uint64_t mem_refused_conns;  /* connections refused: the budget was reached */
    uint64_t mem_refused_growth; /* ring grows refused: the budget was reached */
    uint64_t mem_refused_other;  /* send buffers, batch staging, tables refused */
};

extern struct exs_mem_counters exs__mem;

/* Charge n bytes. Refused (-ENOBUFS, counted by kind) unless EXS_MEM_FORCE when the bytes
 * charged plus n plus slack (room a caller wants left for later, e.g. a new connection
 * leaves room for a connection's tables) pass the budget. 0 or -ENOBUFS. */
int exs__mem_take(uint64_t n, enum exs_mem_kind kind, uint64_t slack);
/* Give back n bytes charged earlier. When the account drops to 0 after a large amount
 * was given back, free heap memory goes back to the system (malloc_trim). */
void exs__mem_give(uint64_t n);
/* Bytes charged now. */
uint64_t exs__mem_used(void);
/* What malloc(n) takes from the heap (its chunk), what the account charges for it. */
static inline uint64_t exs__mem_chunk(size_t n)
{
    return n + 8 <= 32 ? 32 : (n + 8 + 15) & ~(uint64_t)15;
}
/* What a provider region of n bytes (page-aligned) takes. */
static inline uint64_t exs__mem_pages(size_t n)
{
    return (n + 4095) & ~(uint64_t)4095;
}
/* Register the set "mem" (once). */
void exs__mem_cset_register(void);

/* In a forked child (exs/api/fork.c): the parent's charges are not the child's. */
void exs__mem_fork_child(void);

#endif
