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
/* Increment of a counter that one thread at a time writes (its owner's lock held) and any
 * thread may read: a relaxed load and store, no locked instruction (a shard, below). */
#define EXS_CNT_INC_1W(_field)                                                                     \
    __atomic_store_n(&(_field), __atomic_load_n(&(_field), __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED)

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
    struct exs_list link;  /* in the global registry, or (a shard) in its total's parts */
    struct exs_list parts; /* shards of this set (exs__counters_part_add); zeroed: none */
};

/* Add / remove a set in the process-wide registry (thread-safe). */
void exs__counters_register(struct exs_counter_set *set);
void exs__counters_unregister(struct exs_counter_set *set);
/* Value of counter i of set: its own field plus its shards' (the registry's lock held
 * when it has any). */
uint64_t exs__counters_value(const struct exs_counter_set *set, size_t i);
/*
 * Shards: a set's counts kept apart per owner (a connection's, counted under its own
 * lock with EXS_CNT_INC_1W: no locked add on the shared field), added to the total set
 * wherever it is read (value, lookup, each, print), never listed on their own. part has
 * total's descriptors (the same struct); part_del folds its values into fold_into (the
 * total's base, written only here and by EXS_CNT_* atomics) and takes it out, so the
 * total never goes back. Thread-safe (the registry's lock).
 */
void exs__counters_part_add(struct exs_counter_set *total, struct exs_counter_set *part);
void exs__counters_part_del(struct exs_counter_set *part, void *fold_into);
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
