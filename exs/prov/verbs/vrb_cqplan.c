/* SPDX-License-Identifier: MIT */
/* The verbs provider's completion queue budget: how far the ctx CQ must grow for an ep. */
#include <errno.h>

#include "exs/prov/verbs/vrb_cache.h"

int exs__vrb_cq_plan(uint64_t cap, uint64_t need, uint64_t n, uint64_t max_cqe, uint64_t *resize_p)
{
    uint64_t total = need + n, want;

    if (total < need || total > max_cqe)
        return -ENOBUFS;
    if (total <= cap) {
        *resize_p = 0;
        return 0;
    }
    want = cap * 2 > total ? cap * 2 : total;
    *resize_p = want < max_cqe ? want : max_cqe;
    return 0;
}
