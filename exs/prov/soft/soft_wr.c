/* SPDX-License-Identifier: MIT */
/* Work requests of the software providers (soft_wr.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/soft/soft_wr.h"

int exs__soft_rwr_check(const struct exs_prov_recv_wr *in, uint32_t max_sge, uint64_t *len_p)
{
    uint64_t total = 0;

    if (!in || in->num_sge < 0 || (uint32_t)in->num_sge > max_sge || (in->num_sge && !in->sg_list))
        return -EINVAL;
    for (int i = 0; i < in->num_sge; i++)
        total += in->sg_list[i].length;
    *len_p = total;
    return 0;
}

void exs__soft_rwr_fill(struct exs_soft_rwr *rwr, const struct exs_prov_recv_wr *in, uint64_t len)
{
    rwr->wr_id = in->wr_id;
    rwr->num_sge = in->num_sge;
    rwr->bad = 0;
    rwr->pooled = 0;
    rwr->len = len;
    if (in->num_sge)
        memcpy(rwr->sge, in->sg_list, (size_t)in->num_sge * sizeof(rwr->sge[0]));
}

int exs__soft_rwr_new(const struct exs_prov_recv_wr *in, uint32_t max_sge,
                      struct exs_soft_rwr **rwr_p)
{
    struct exs_soft_rwr *rwr;
    uint64_t total;
    int ret = exs__soft_rwr_check(in, max_sge, &total);

    if (ret)
        return ret;
    rwr = malloc(sizeof(*rwr) + (size_t)in->num_sge * sizeof(rwr->sge[0]));
    if (!rwr)
        return -ENOMEM;
    exs__soft_rwr_fill(rwr, in, total);
    *rwr_p = rwr;
    return 0;
}

void exs__soft_pool_init(struct exs_soft_pool *p, size_t size, uint32_t max)
{
    p->head = NULL;
    p->n = 0;
    p->max = max;
    p->size = size < sizeof(void *) ? sizeof(void *) : size;
}

void exs__soft_pool_fini(struct exs_soft_pool *p)
{
    void *blk;

    while ((blk = exs__soft_pool_get_locked(p)) != NULL)
        free(blk);
}
