/* SPDX-License-Identifier: MIT */
/* Work requests of the software providers (soft_wr.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/soft/soft_wr.h"

int exs__soft_rwr_new(const struct exs_prov_recv_wr *in, uint32_t max_sge,
                      struct exs_soft_rwr **rwr_p)
{
    struct exs_soft_rwr *rwr;
    uint64_t total = 0;

    if (!in || in->num_sge < 0 || (uint32_t)in->num_sge > max_sge || (in->num_sge && !in->sg_list))
        return -EINVAL;
    for (int i = 0; i < in->num_sge; i++)
        total += in->sg_list[i].length;
    rwr = malloc(sizeof(*rwr) + (size_t)in->num_sge * sizeof(rwr->sge[0]));
    if (!rwr)
        return -ENOMEM;
    rwr->wr_id = in->wr_id;
    rwr->num_sge = in->num_sge;
    rwr->bad = 0;
    rwr->len = total;
    if (in->num_sge)
        memcpy(rwr->sge, in->sg_list, (size_t)in->num_sge * sizeof(rwr->sge[0]));
    *rwr_p = rwr;
    return 0;
}
