/* SPDX-License-Identifier: MIT */
/* Work requests of the software providers (tcp, shm): a posted receive, checked and
 * copied once at post time, and a pool of work request blocks (soft_wr.c). */
#ifndef EXS_PROV_SOFT_SOFT_WR_H
#define EXS_PROV_SOFT_SOFT_WR_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/prov.h"
#include "exs/util/list.h"

struct exs_soft_rwr {
    struct exs_list link; /* the endpoint's receive queue */
    uint64_t wr_id;
    int num_sge;
    uint8_t bad;    /* the local check failed: completes LOC_PROT_ERR when consumed */
    uint8_t pooled; /* a block of its endpoint's pool (exs_soft_pool), else its own size */
    uint64_t len;   /* the sges' lengths added up */
    struct exs_prov_sge sge[];
};

/* A copy of in (its sges, at most max_sge, and their total length; bad 0): 0, -EINVAL
 * (a negative or too large num_sge, sges missing), -ENOMEM. */
int exs__soft_rwr_new(const struct exs_prov_recv_wr *in, uint32_t max_sge,
                      struct exs_soft_rwr **rwr_p);

/* in checked (as exs__soft_rwr_new does): 0 and *len_p its sges' total, or -EINVAL. */
int exs__soft_rwr_check(const struct exs_prov_recv_wr *in, uint32_t max_sge, uint64_t *len_p);

/* in (checked) copied into rwr, which has room for its sges; bad and pooled 0. */
void exs__soft_rwr_fill(struct exs_soft_rwr *rwr, const struct exs_prov_recv_wr *in, uint64_t len);

/* Blocks of one size kept for reuse under their owner's lock (an endpoint's work requests):
 * a work request per message then costs no malloc and free on the data path. Every block
 * comes from malloc, so free() releases one wherever its pool is not at hand (flushes,
 * failures); the pool keeps at most max blocks and frees the rest. */
struct exs_soft_pool {
    void *head; /* the cached blocks, each starting with the next one's address */
    uint32_t n; /* cached */
    uint32_t max;
    size_t size; /* of every block, at least a pointer's */
};

void exs__soft_pool_init(struct exs_soft_pool *p, size_t size, uint32_t max);

/* (inline: a get and a release per message) */

/* A cached block, or NULL when none is (the caller mallocs p->size bytes). */
static inline void *exs__soft_pool_get_locked(struct exs_soft_pool *p)
{
    void *blk = p->head;

    if (blk) {
        memcpy(&p->head, blk, sizeof(void *));
        p->n--;
    }
    return blk;
}

/* blk (p->size bytes from malloc) kept for reuse, or freed when the pool is full. */
static inline void exs__soft_pool_put_locked(struct exs_soft_pool *p, void *blk)
{
    if (p->n >= p->max) {
        free(blk);
        return;
    }
    memcpy(blk, &p->head, sizeof(void *));
    p->head = blk;
    p->n++;
}

/* blk handed back: to the pool when pooled (one of its blocks), else freed (a block of
 * another size, malloc'd for itself). */
static inline void exs__soft_pool_release_locked(struct exs_soft_pool *p, void *blk, int pooled)
{
    if (pooled)
        exs__soft_pool_put_locked(p, blk);
    else
        free(blk);
}
/* Frees every cached block. */
void exs__soft_pool_fini(struct exs_soft_pool *p);

#endif
