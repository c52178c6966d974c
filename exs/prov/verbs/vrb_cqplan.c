/* SPDX-License-Identifier: MIT */
/* Pure decisions of the verbs provider (no device): how far the ctx CQ must grow for an ep,
 * and which local ACK timeout a QP gets. */
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

uint8_t exs__vrb_qp_timeout(uint8_t ep_timeout, uint8_t param, int cm_has, uint8_t cm_timeout)
{
    if (ep_timeout)
        return ep_timeout;
    if (param)
        return param;
    if (cm_has && cm_timeout)
        return cm_timeout < VRB_QP_TIMEOUT_CAP ? cm_timeout : VRB_QP_TIMEOUT_CAP;
    return VRB_QP_TIMEOUT_FALLBACK;
}
