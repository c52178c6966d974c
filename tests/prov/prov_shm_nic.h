/* SPDX-License-Identifier: MIT */
/* The shm tests' hold of a context's nic_lock (test_prov_shm.c, test_prov_attack26.c). */
#ifndef TESTS_PROV_PROV_SHM_NIC_H
#define TESTS_PROV_PROV_SHM_NIC_H

#include <sched.h>

#include "exs/prov/shm/shm.h"

/* Taken by trylock and yields, given back by exchange: no sleep on the word, so it holds
 * whether the provider gives the lock back by exchange or (h70's exs__lite_unlock_st) by a
 * plain store that may overwrite a sleeper's mark. */
static inline void nic_hold(struct shm_ctx *ctx)
{
    while (!exs__lite_trylock(&ctx->nic_lock))
        sched_yield();
}

static inline void nic_drop(struct shm_ctx *ctx)
{
    exs__lite_unlock(&ctx->nic_lock);
}

#endif
