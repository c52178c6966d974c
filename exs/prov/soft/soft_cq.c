/* SPDX-License-Identifier: MIT */
/* The software providers' completion queue (soft_cq.h). */
#include <errno.h>
#include <stdlib.h>

#include "exs/prov/soft/soft_cq.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

int exs__soft_cq_init(struct exs_soft_cq *cq, uint32_t cap)
{
    cq->q = calloc(cap, sizeof(*cq->q));
    cq->cap = cq->cap0 = cap;
    cq->head = cq->count = 0;
    cq->reserved = 0;
    return cq->q ? 0 : -ENOMEM;
}

void exs__soft_cq_fini(struct exs_soft_cq *cq)
{
    free(cq->q);
    cq->q = NULL;
}

/* Move the queued completions into a ring of cap entries (cap >= count). */
static int soft_cq_resize(struct exs_soft_cq *cq, uint32_t cap)
{
    struct exs_prov_cqe *q = malloc((size_t)cap * sizeof(*q));

    if (!q)
        return -ENOMEM;
    for (uint32_t i = 0; i < cq->count; i++)
        q[i] = cq->q[(cq->head + i) % cq->cap];
    free(cq->q);
    cq->q = q;
    cq->head = 0;
    EXS_DBG(PROV, "completion queue %p resized from %u to %u entries", (void *)cq, cq->cap, cap);
    cq->cap = cap;
    return 0;
}

int exs__soft_cq_reserve(struct exs_soft_cq *cq, uint64_t n, uint64_t max)
{
    uint64_t want = cq->reserved + n;
    int ret;

    if (want > max)
        return -ENOBUFS;
    if (want > cq->cap) {
        ret = soft_cq_resize(cq, (uint32_t)EXS_MIN(EXS_MAX(want, (uint64_t)cq->cap * 2), max));
        if (ret)
            return ret;
    }
    cq->reserved = want;
    return 0;
}

void exs__soft_cq_unreserve(struct exs_soft_cq *cq, uint64_t n)
{
    uint64_t cap;

    cq->reserved -= n;
    if (cq->cap <= cq->cap0 || cq->reserved * 4 > cq->cap)
        return;
    cap = EXS_MAX(EXS_MAX(cq->reserved * 2, (uint64_t)cq->cap0), (uint64_t)cq->count);
    if (cap < cq->cap)
        (void)soft_cq_resize(cq, (uint32_t)cap); /* no memory: keep the big ring */
}

int exs__soft_cq_push(struct exs_soft_cq *cq, const struct exs_prov_cqe *cqe)
{
    struct exs_prov_cqe *slot = exs__soft_cq_slot(cq);

    if (EXS_UNLIKELY(!slot))
        return -ENOSPC;
    *slot = *cqe;
    exs__soft_cq_commit(cq);
    return 0;
}

void exs__soft_cq_drop_ep(struct exs_soft_cq *cq, const struct exs_prov_ep *ep)
{
    uint32_t keep = 0;

    for (uint32_t i = 0; i < cq->count; i++) {
        struct exs_prov_cqe *q = &cq->q[(cq->head + i) % cq->cap];

        if (q->ep != ep)
            cq->q[(cq->head + keep++) % cq->cap] = *q;
    }
    __atomic_store_n(&cq->count, keep, __ATOMIC_RELAXED);
    if (!keep)
        cq->head = 0;
}
