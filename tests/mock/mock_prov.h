/* SPDX-License-Identifier: MIT */
/* The mock provider: the whole prov.h contract in memory, moved only when a test steps it. */
#ifndef EXS_TESTS_MOCK_PROV_H
#define EXS_TESTS_MOCK_PROV_H

#include <stdint.h>

#include "exs/prov/prov.h"

/*
 * One fabric per process joins every mock ctx: listeners are found by port, eps pair on
 * accept. Nothing moves on its own: post_send queues the work request, and each
 * mock_step() carries out one action (the head work request of one ep, or, with
 * reordering on, the delivery of one held completion to its ctx's completion queue).
 * Connection events are queued at once by the call that causes them.
 *
 * Checks, as spec/provider.md asks: local sges against the ctx's mrs (lkey, range,
 * LOCAL_WRITE for receive and READ targets: LOC_PROT_ERR), SEND longer than the receive
 * (LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at the sender), remote keys against the
 * responder's grants (the one ep, right and range) and mrs with remote rights
 * (REM_ACCESS_ERR, nothing written). A SEND or WRITE_WITH_IMM that finds no posted
 * receive is counted in mock_stats.rnr and fails at once with RNR_RETRY_EXC_ERR (the
 * protocol promises it never happens). An error completion moves the ep to ERROR and
 * flushes the rest with WR_FLUSH_ERR. The completion queue holds at most its capacity
 * (ep_create reserves max_send_wr + max_recv_wr or fails with -ENOBUFS); an entry beyond
 * it is counted as a violation.
 *
 * Single-threaded: every call (ops and the knobs below) from one thread.
 */

extern const struct exs_prov_ops mock_prov_ops;

/* Defaults of a mock ctx (attr->cq_size 0 takes MOCK_CQ_SIZE). */
#define MOCK_CQ_SIZE    4096u
#define MOCK_MAX_INLINE 256u
#define MOCK_MAX_SGE    4u
#define MOCK_MAX_WR     4096u
#define MOCK_MAX_PD     56u
#define MOCK_MAX_MSG    (1u << 30)

/* Open a mock ctx (attr may be NULL). */
int mock_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);

/* Carry out one action anywhere in the fabric: 1 when something moved, 0 when idle. */
int mock_step(void);
/* Step until idle; returns the number of steps (at most max; -1 when still busy). */
long mock_run_until_idle(long max);

/* Reordering: seed != 0 holds completions per ep and delivers them, like the work
 * requests, in a seeded random order across eps (each ep's own order is kept, as RC);
 * 0 turns it off (round robin, completions queued at once). */
void mock_set_reorder(uint32_t seed);

/* The nth (1 = next) send work request posted on ep from now on completes with status
 * (nothing moves; the ep goes to ERROR). */
void mock_inject_wr_error(struct exs_prov_ep *ep, uint32_t nth, enum exs_prov_wc_status status);

/* The receive completion that the next SEND or WRITE_WITH_IMM carried out from ep causes
 * at its peer says opcode and flags instead of what it is (a provider gone wrong: a
 * completion the protocol never causes). */
void mock_inject_recv_cqe(struct exs_prov_ep *ep, enum exs_prov_wc_opcode opcode, unsigned flags);

/* The link of ep dies: both eps go to ERROR, outstanding work flushes, and both get
 * DISCONNECTED with status -ECONNRESET. */
void mock_drop(struct exs_prov_ep *ep);

/* Make the nth (1 = next) call of an op on ctx fail with err (negative errno). */
enum mock_fail_op {
    MOCK_FAIL_MR_REG = 0, /* mr_reg and mr_get */
    MOCK_FAIL_MEM_ALLOC,
    MOCK_FAIL_EP_CREATE,
    MOCK_FAIL_GRANT,
    MOCK_FAIL_POST_RECV,
    MOCK_FAIL_MAX
};
void mock_fail(struct exs_prov_ctx *ctx, enum mock_fail_op op, uint32_t nth, int err);

struct mock_stats {
    uint64_t rnr;            /* SEND / WRITE_WITH_IMM that found no posted receive */
    uint64_t sends;          /* SEND and SEND_WITH_IMM carried out */
    uint64_t writes;         /* RDMA_WRITE and RDMA_WRITE_WITH_IMM carried out */
    uint64_t reads;          /* RDMA_READ carried out */
    uint64_t rem_access_err; /* remote accesses refused */
    uint64_t loc_err;        /* LOC_PROT_ERR and LOC_LEN_ERR */
    uint64_t flushed;        /* WR_FLUSH_ERR completions */
    uint64_t grants;         /* grants made */
    uint64_t revokes;        /* grants revoked */
    uint64_t revokes_held;   /* of them not settled (mock_grant_hold): the ep went to ERROR */
    uint32_t cq_max;         /* most entries the completion queue held at once */
    uint32_t reads_max;      /* most RDMA_READs of one ep posted and not yet polled */
};
/* The counters of ctx. */
void mock_stats(struct exs_prov_ctx *ctx, struct mock_stats *st);

/* Contract violations seen by any ctx since the process started (completion queue over
 * its capacity, ctx_close with objects left, ep_destroy with grants left, use of a
 * destroyed object): tests assert it stays 0. Each is logged to stderr. */
uint64_t mock_violations(void);

/* Every send work request carried out (after its checks passed) on any ctx is shown to
 * the tap, with its payload gathered (len bytes; READ: none). NULL turns it off. */
typedef void (*mock_tap_fn)(void *arg, struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr,
                            const uint8_t *payload, uint32_t len);
void mock_set_tap(mock_tap_fn fn, void *arg);

/* Grants made on ctx while hold is on are not settled (as a verbs window whose bind
 * waits behind sends the peer has not acknowledged): grant_settle says -EBUSY, and
 * revoke ends the ep (ERROR, as the verbs provider must). mock_grant_settle_all settles
 * every one of ctx's, queues an EXS_PROV_WC_GRANT completion for each that was asked
 * about, and returns how many it settled. */
void mock_grant_hold(struct exs_prov_ctx *ctx, int on);
int mock_grant_settle_all(struct exs_prov_ctx *ctx);

/* Receives currently posted on ep (for tests of credits). */
uint32_t mock_recv_posted(struct exs_prov_ep *ep);

#endif
