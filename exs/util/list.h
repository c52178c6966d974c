/* SPDX-License-Identifier: MIT */
/* Intrusive doubly linked list (circular, with a head node). */
#ifndef EXS_UTIL_LIST_H
#define EXS_UTIL_LIST_H

#include <stddef.h>

struct exs_list {
    struct exs_list *prev, *next;
};

#define EXS_LIST_INIT(_name)                                                                       \
    {                                                                                              \
        &(_name), &(_name)                                                                         \
    }

#define exs_container_of(_ptr, _type, _member)                                                     \
    ((_type *)(void *)((char *)(_ptr)-offsetof(_type, _member)))

static inline void exs_list_init(struct exs_list *h)
{
    h->prev = h->next = h;
}
static inline int exs_list_empty(const struct exs_list *h)
{
    return h->next == h;
}

static inline void exs_list_insert_after(struct exs_list *pos, struct exs_list *n)
{
    n->prev = pos;
    n->next = pos->next;
    pos->next->prev = n;
    pos->next = n;
}

static inline void exs_list_add_tail(struct exs_list *h, struct exs_list *n)
{
    exs_list_insert_after(h->prev, n);
}

static inline void exs_list_add_head(struct exs_list *h, struct exs_list *n)
{
    exs_list_insert_after(h, n);
}

static inline void exs_list_del(struct exs_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

static inline struct exs_list *exs_list_pop_head(struct exs_list *h)
{
    struct exs_list *n;

    if (exs_list_empty(h))
        return NULL;
    n = h->next;
    exs_list_del(n);
    return n;
}

#define exs_list_entry(_ptr, _type, _member) exs_container_of(_ptr, _type, _member)

#define exs_list_for_each(_pos, _head)                                                             \
    for ((_pos) = (_head)->next; (_pos) != (_head); (_pos) = (_pos)->next)

#define exs_list_for_each_safe(_pos, _tmp, _head)                                                  \
    for ((_pos) = (_head)->next, (_tmp) = (_pos)->next; (_pos) != (_head);                         \
         (_pos) = (_tmp), (_tmp) = (_pos)->next)

#endif
