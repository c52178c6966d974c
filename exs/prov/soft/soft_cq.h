/* SPDX-License-Identifier: MIT */
/* The completion queue of the software providers (tcp, shm): a ring of completions that
 * grows with the endpoints' reservations and shrinks after them, so that it always holds
 * every completion the live endpoints can produce (spec/provider-tcp.md, Completions).
 * The caller's lock guards it (each provider's ctx->lock). */
#ifndef EXS_PROV_SOFT_SOFT_CQ_H
#define EXS_PROV_SOFT_SOFT_CQ_H

#include <stdint.h>

#include "exs/prov/prov.h"

struct exs_soft_cq {
    struct exs_prov_cqe *q;
    uint32_t cap;      /* entries of q */
    uint32_t head;     /* the oldest entry */
    uint32_t count;    /* entries queued (written atomically: exs__soft_cq_peek) */
    uint32_t cap0;     /* the first size: it never shrinks below */
    uint64_t reserved; /* entries the endpoints reserved */
};

/* A ring of cap entries. 0 or -ENOMEM. */
int exs__soft_cq_init(struct exs_soft_cq *cq, uint32_t cap);
void exs__soft_cq_fini(struct exs_soft_cq *cq);
/* Room for n more completions (an endpoint's depths): the ring grows, up to max entries.
 * 0, -ENOBUFS beyond max, -ENOMEM. */
int exs__soft_cq_reserve(struct exs_soft_cq *cq, uint64_t n, uint64_t max);
/* n entries given back: once the reservations fit in a quarter of a grown ring, it
 * shrinks (to twice the reservations, not below its first size; no memory: it stays). */
void exs__soft_cq_unreserve(struct exs_soft_cq *cq, uint64_t n);
/* Queue a completion: 0, or -ENOSPC when full (cannot happen when every producer
 * reserved its room). */
int exs__soft_cq_push(struct exs_soft_cq *cq, const struct exs_prov_cqe *cqe);
/* The entry the next completion goes into, NULL when full: filled in place, then queued by
 * exs__soft_cq_commit (a producer that builds its completion there copies none). */
static inline struct exs_prov_cqe *exs__soft_cq_slot(struct exs_soft_cq *cq)
{
    uint32_t at = cq->head + cq->count; /* < 2 cap: no division on the data path */

    if (cq->count == cq->cap)
        return (struct exs_prov_cqe *)0;
    return &cq->q[at >= cq->cap ? at - cq->cap : at];
}

static inline void exs__soft_cq_commit(struct exs_soft_cq *cq)
{
    __atomic_store_n(&cq->count, cq->count + 1, __ATOMIC_RELAXED);
}

/* Take out the completions of ep, keeping the others in order (ep_destroy). */
void exs__soft_cq_drop_ep(struct exs_soft_cq *cq, const struct exs_prov_ep *ep);

/* Entries queued, read without the lock (a poller's look before taking it: a completion
 * queued meanwhile is seen by its next look, an arm counts under the lock). */
static inline uint32_t exs__soft_cq_peek(const struct exs_soft_cq *cq)
{
    return __atomic_load_n(&cq->count, __ATOMIC_RELAXED);
}

/* The oldest completion, NULL when none; exs__soft_cq_pop drops it. */
static inline struct exs_prov_cqe *exs__soft_cq_head(struct exs_soft_cq *cq)
{
    return cq->count ? &cq->q[cq->head] : (struct exs_prov_cqe *)0;
}

static inline void exs__soft_cq_pop(struct exs_soft_cq *cq)
{
    cq->head = cq->head + 1 == cq->cap ? 0 : cq->head + 1; /* (no division per completion) */
    /* an empty ring starts again at entry 0: the pages in use are those of the most
     * completions ever queued at once, not the whole ring as the head goes round */
    __atomic_store_n(&cq->count, cq->count - 1, __ATOMIC_RELAXED);
    if (!cq->count)
        cq->head = 0;
}

/* A receive's completion (counted against the endpoint's receive queue), or a send's. */
static inline int exs__soft_cqe_is_recv(const struct exs_prov_cqe *cqe)
{
    return cqe->opcode == EXS_PROV_WC_RECV || cqe->opcode == EXS_PROV_WC_RECV_RDMA_WITH_IMM;
}

#endif
