/* SPDX-License-Identifier: MIT */
/* Counters: plain uint64_t fields in their owner's struct, described by a table so a
 * snapshot can be named, printed and exported without knowing the struct. */
#ifndef EXS_UTIL_COUNTERS_H
#define EXS_UTIL_COUNTERS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "list.h"

/* Relaxed atomic increment; counters tolerate no torn values but need no ordering. */
#define EXS_CNT_ADD(_field, _n) __atomic_fetch_add(&(_field), (uint64_t)(_n), __ATOMIC_RELAXED)
#define EXS_CNT_INC(_field)     EXS_CNT_ADD(_field, 1)
#define EXS_CNT_GET(_field)     __atomic_load_n(&(_field), __ATOMIC_RELAXED)

struct exs_counter_desc {
    const char *name; /* e.g. "frames_tx" */
    size_t offset;    /* offsetof(owner struct, field) of a uint64_t */
    const char *help;
};

#define EXS_COUNTER(_type, _field, _help)                                                          \
    {                                                                                              \
#_field, offsetof(_type, _field), _help                                                    \
    }

/* A named group of counters living at base (one per ctx, connection, cache, ...). */
struct exs_counter_set {
    const char *name; /* e.g. "prov.tcp.ctx" */
    const struct exs_counter_desc *desc;
    size_t count;
    const void *base;
    struct exs_list link; /* in the global registry */
};

/* Add / remove a set in the process-wide registry (thread-safe). */
void exs__counters_register(struct exs_counter_set *set);
void exs__counters_unregister(struct exs_counter_set *set);
/* Value of counter i of set. */
uint64_t exs__counters_value(const struct exs_counter_set *set, size_t i);
/* A counter by set name and counter name, summed over the sets of that name (several
 * provider contexts); -ENOENT when no such set has it. */
int exs__counters_lookup(const char *set_name, const char *counter, uint64_t *value_p);
/* "set counter value" lines for every registered set. */
void exs__counters_print(FILE *f);
/* fn(set name, counter, its value, arg) for every counter of every registered set, in
 * registration order, under the registry's lock (fn takes no lock of the library's). */
void exs__counters_each(void (*fn)(const char *set, const struct exs_counter_desc *d,
                                   uint64_t value, void *arg),
                        void *arg);

/* fork (exs/api/fork.c): the registry's lock held across fork(2) (phase: enum
 * exs_fork_phase), so the child's list is whole. */
void exs__counters_fork(int phase);

#endif
