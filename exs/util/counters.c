/* SPDX-License-Identifier: MIT */
/* The process-wide registry of counter sets: lookup by name and printing. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "exs/util/counters.h"
#include "exs/util/util.h"

static pthread_mutex_t counters_lock = PTHREAD_MUTEX_INITIALIZER;
static struct exs_list counters_sets = EXS_LIST_INIT(counters_sets);

void exs__counters_register(struct exs_counter_set *set)
{
    pthread_mutex_lock(&counters_lock);
    exs_list_add_tail(&counters_sets, &set->link);
    pthread_mutex_unlock(&counters_lock);
}

/* Safe on a set already unregistered (its link points at itself) or never
 * registered but zero-initialised. */
void exs__counters_unregister(struct exs_counter_set *set)
{
    pthread_mutex_lock(&counters_lock);
    if (set->link.next)
        exs_list_del(&set->link);
    pthread_mutex_unlock(&counters_lock);
}

static uint64_t field_get(const void *base, size_t off)
{
    return EXS_CNT_GET(*(const uint64_t *)(const void *)((const char *)base + off));
}

uint64_t exs__counters_value(const struct exs_counter_set *set, size_t i)
{
    uint64_t v = field_get(set->base, set->desc[i].offset);
    const struct exs_list *pos;

    if (set->parts.next)
        for (pos = set->parts.next; pos != &set->parts; pos = pos->next)
            v += field_get(exs_list_entry(pos, struct exs_counter_set, link)->base,
                           set->desc[i].offset);
    return v;
}

void exs__counters_part_add(struct exs_counter_set *total, struct exs_counter_set *part)
{
    pthread_mutex_lock(&counters_lock);
    if (!total->parts.next)
        exs_list_init(&total->parts);
    exs_list_add_tail(&total->parts, &part->link);
    pthread_mutex_unlock(&counters_lock);
}

void exs__counters_part_del(struct exs_counter_set *part, void *fold_into)
{
    pthread_mutex_lock(&counters_lock);
    if (part->link.next) {
        for (size_t i = 0; i < part->count; i++)
            EXS_CNT_ADD(*(uint64_t *)(void *)((char *)fold_into + part->desc[i].offset),
                        field_get(part->base, part->desc[i].offset));
        exs_list_del(&part->link);
        part->link.next = part->link.prev = NULL;
    }
    pthread_mutex_unlock(&counters_lock);
}

int exs__counters_lookup(const char *set_name, const char *counter, uint64_t *value_p)
{
    struct exs_list *pos;
    uint64_t sum = 0;
    int rc = -ENOENT;

    pthread_mutex_lock(&counters_lock);
    /* Sets of one name (one per provider context, say) add up. */
    exs_list_for_each(pos, &counters_sets)
    {
        const struct exs_counter_set *set = exs_list_entry(pos, struct exs_counter_set, link);

        if (strcmp(set->name, set_name) != 0)
            continue;
        for (size_t i = 0; i < set->count; i++) {
            if (strcmp(set->desc[i].name, counter) == 0) {
                sum += exs__counters_value(set, i);
                rc = 0;
                break;
            }
        }
    }
    pthread_mutex_unlock(&counters_lock);
    if (!rc)
        *value_p = sum;
    return rc;
}

void exs__counters_each(void (*fn)(const char *set, const struct exs_counter_desc *d,
                                   uint64_t value, void *arg),
                        void *arg)
{
    struct exs_list *pos;

    pthread_mutex_lock(&counters_lock);
    exs_list_for_each(pos, &counters_sets)
    {
        const struct exs_counter_set *set = exs_list_entry(pos, struct exs_counter_set, link);

        for (size_t i = 0; i < set->count; i++)
            fn(set->name, &set->desc[i], exs__counters_value(set, i), arg);
    }
    pthread_mutex_unlock(&counters_lock);
}

static void print_one(const char *set, const struct exs_counter_desc *d, uint64_t value, void *arg)
{
    fprintf(arg, "%s %s %" PRIu64 "\n", set, d->name, value);
}

void exs__counters_print(FILE *f)
{
    exs__counters_each(print_one, f);
}

void exs__counters_fork(int phase)
{
    exs__mutex_fork(&counters_lock, phase);
}
