/* SPDX-License-Identifier: MIT */
/* The connection event queue of the software providers (tcp, shm): events in the order
 * they happened, each in a node of its own (soft_cm.c). The caller's lock guards the list
 * (each provider's ctx->lock); the node is allocated before it is taken. */
#ifndef EXS_PROV_SOFT_SOFT_CM_H
#define EXS_PROV_SOFT_SOFT_CM_H

#include <pthread.h>

#include "exs/prov/prov.h"
#include "exs/util/list.h"

struct exs_soft_cm_node {
    struct exs_list link;
    struct exs_prov_cm_event ev;
};

/* A node holding a copy of ev; NULL when out of memory (logged: the event is lost). */
struct exs_soft_cm_node *exs__soft_cm_new(const void *ctx, const struct exs_prov_cm_event *ev);
/* The oldest event of q into *ev, taken under lock: 1, or 0 when q is empty. With hint
 * (NULL: none), a word the pusher sets (atomically, under lock, after adding) and this
 * clears when it leaves q empty: 0 there answers 0 without the lock (a busy poller's
 * look; an event pushed meanwhile is seen by its next look, an arm looks under the lock). */
int exs__soft_cm_pop(struct exs_list *q, pthread_mutex_t *lock, int *hint,
                     struct exs_prov_cm_event *ev);
/* exs__soft_cm_pop's two halves, for a provider whose lock is not a pthread mutex: under
 * its lock, the oldest node taken off (NULL when none; hint cleared when q is left empty);
 * then, without it, the node's event into *ev and the node freed (1, or 0 for NULL). */
struct exs_list *exs__soft_cm_take_locked(struct exs_list *q, int *hint);
int exs__soft_cm_give(struct exs_list *l, struct exs_prov_cm_event *ev);
/* Locked: drop the events naming ep (all but requests), and the requests of lis (either
 * may be NULL). */
void exs__soft_cm_drop_locked(struct exs_list *q, const struct exs_prov_ep *ep,
                              const struct exs_prov_listener *lis);
/* Free every node (the context is closing). */
void exs__soft_cm_free_all(struct exs_list *q);

#endif
