/* SPDX-License-Identifier: MIT */
/* The connection event queue of the software providers (soft_cm.h). */
#include <stdlib.h>

#include "exs/prov/soft/soft_cm.h"
#include "exs/util/log.h"

struct exs_soft_cm_node *exs__soft_cm_new(const void *ctx, const struct exs_prov_cm_event *ev)
{
    struct exs_soft_cm_node *n = malloc(sizeof(*n));

    if (!n) {
        EXS_ERR(PROV, "ctx %p: cm event %s lost: out of memory", ctx,
                exs__prov_cm_event_str(ev->type));
        return NULL;
    }
    n->ev = *ev;
    EXS_DBG(PROV, "ctx %p: cm event %s ep %p status %d", ctx, exs__prov_cm_event_str(ev->type),
            (void *)ev->ep, ev->status);
    return n;
}

struct exs_list *exs__soft_cm_take_locked(struct exs_list *q, int *hint)
{
    struct exs_list *l = exs_list_pop_head(q);

    if (hint && exs_list_empty(q))
        __atomic_store_n(hint, 0, __ATOMIC_RELAXED);
    return l;
}

int exs__soft_cm_give(struct exs_list *l, struct exs_prov_cm_event *ev)
{
    if (!l)
        return 0;
    *ev = exs_list_entry(l, struct exs_soft_cm_node, link)->ev;
    free(exs_list_entry(l, struct exs_soft_cm_node, link));
    return 1;
}

int exs__soft_cm_pop(struct exs_list *q, pthread_mutex_t *lock, int *hint,
                     struct exs_prov_cm_event *ev)
{
    struct exs_list *l;

    if (hint && !__atomic_load_n(hint, __ATOMIC_RELAXED))
        return 0;
    pthread_mutex_lock(lock);
    l = exs__soft_cm_take_locked(q, hint);
    pthread_mutex_unlock(lock);
    return exs__soft_cm_give(l, ev);
}

void exs__soft_cm_drop_locked(struct exs_list *q, const struct exs_prov_ep *ep,
                              const struct exs_prov_listener *lis)
{
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, q)
    {
        struct exs_soft_cm_node *n = exs_list_entry(pos, struct exs_soft_cm_node, link);
        int req = n->ev.type == EXS_PROV_CM_CONNECT_REQUEST;

        if ((ep && !req && n->ev.ep == ep) || (lis && req && n->ev.listener == lis)) {
            exs_list_del(&n->link);
            free(n);
        }
    }
}

void exs__soft_cm_free_all(struct exs_list *q)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(q)) != NULL)
        free(exs_list_entry(l, struct exs_soft_cm_node, link));
}
