/* SPDX-License-Identifier: MIT */
/* Work requests of the software providers (tcp, shm): a posted receive, checked and
 * copied once at post time (soft_wr.c). */
#ifndef EXS_PROV_SOFT_SOFT_WR_H
#define EXS_PROV_SOFT_SOFT_WR_H

#include <stdint.h>

#include "exs/prov/prov.h"
#include "exs/util/list.h"

struct exs_soft_rwr {
    struct exs_list link; /* the endpoint's receive queue */
    uint64_t wr_id;
    int num_sge;
    int bad;      /* the local check failed: completes LOC_PROT_ERR when consumed */
    uint64_t len; /* the sges' lengths added up */
    struct exs_prov_sge sge[];
};

/* A copy of in (its sges, at most max_sge, and their total length; bad 0): 0, -EINVAL
 * (a negative or too large num_sge, sges missing), -ENOMEM. */
int exs__soft_rwr_new(const struct exs_prov_recv_wr *in, uint32_t max_sge,
                      struct exs_soft_rwr **rwr_p);

#endif
