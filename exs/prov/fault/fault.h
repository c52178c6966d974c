/* SPDX-License-Identifier: MIT */
/* Module-private interface of the fault-injection provider that wraps another provider. */
#ifndef EXS_PROV_FAULT_FAULT_H
#define EXS_PROV_FAULT_FAULT_H

#include <pthread.h>
#include <stdint.h>

#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/list.h"

/* While a stall or freeze is in force, the event fd fires at least this often, so an
 * online change of its length takes effect while the consumer sleeps. */
#define FAULT_RECHECK_NS (50 * 1000000ull)

/* The kinds of fault (spec/provider-fault.md); each has its nth/ppm tunables, a
 * counter of the same name in the "prov.fault" set and its own random sequence. */
enum fault_kind {
    FAULT_DELAY = 0, /* a completion held for fault_delay_us */
    FAULT_STALL,     /* an ep delivers no completion for fault_stall_ms */
    FAULT_DROP,      /* a send post disconnects its ep */
    FAULT_WC,        /* a successful completion becomes an error; the ep then fails */
    FAULT_REG,       /* mr_reg / mr_get / mem_alloc fails with -ENOMEM */
    FAULT_CONNECT,   /* connect ends in REJECTED or UNREACHABLE */
    FAULT_FREEZE,    /* an ep neither sends nor delivers for fault_freeze_ms */
    FAULT_KIND_MAX
};

struct fault_counters {
    uint64_t delay;
    uint64_t stall;
    uint64_t drop;
    uint64_t wc;
    uint64_t reg;
    uint64_t connect;
    uint64_t freeze;
};

/* The choice of one kind: eligible calls counted from 1, a xorshift64* state. */
struct fault_sel {
    uint64_t calls;
    uint64_t rng;
};

/* A completion taken from the inner provider and not yet delivered. */
struct fault_held {
    struct exs_prov_cqe cqe; /* ep already the wrapper's */
    uint64_t release_ns;     /* not before (CLOCK_MONOTONIC) */
};

/* A connection event not yet delivered (inner ones translated, and injected ones). */
struct fault_cm {
    struct exs_prov_cm_event ev;
    struct exs_list link;
};

/* A send posted while its ep's link is frozen, replayed in order at the thaw. */
struct fault_post {
    struct exs_prov_send_wr wr;
    struct exs_prov_sge *sge; /* owned copy of wr.sg_list */
    void *data;               /* SEND_INLINE: the bytes, copied at post time */
    struct exs_list link;
};

struct fault_ctx {
    struct exs_prov_ctx base;
    struct exs_prov_ctx *inner;
    pthread_mutex_t lock; /* everything below */
    int epfd;             /* the event fd: inner event fd + timerfd */
    int timerfd;
    uint64_t timer_ns; /* when timerfd fires, 0 = disarmed */
    uint64_t seed;     /* the fault_seed the sequences started from */
    struct fault_sel sel[FAULT_KIND_MAX];
    unsigned wc_turn;        /* injections so far with fault_wc_status 0 */
    unsigned connect_turn;   /* connect injections so far */
    struct fault_held *held; /* held completions, oldest first */
    uint32_t held_cap, held_count;
    struct exs_list cmq; /* struct fault_cm, oldest first */
    struct exs_list eps; /* struct fault_ep */
    unsigned nblocked;   /* stalls + freezes in force */
    unsigned nfailed;    /* eps with an injected error completion */
    /* default progress mode: frozen sends go out at the thaw without the consumer
     * calling in, as the inner provider moves data on its own; a thread does it */
    int manual;       /* opened with EXS_PROV_ATTR_MANUAL_PROGRESS */
    int thaw_started; /* thaw_thread runs */
    int thaw_stop;
    pthread_t thaw_thread;
    pthread_cond_t thaw_cond; /* a freeze began, or stop */
    struct fault_counters cnt;
    struct exs_counter_set cset;
};

struct fault_ep {
    struct exs_prov_ep base;
    struct exs_prov_ep *inner;
    struct fault_ctx *ctx;
    struct exs_list link;   /* in ctx->eps */
    uint64_t stall_ns;      /* stalled since (0 = not) */
    uint64_t freeze_ns;     /* frozen since (0 = not) */
    uint32_t held;          /* completions of this ep in ctx->held */
    int failed;             /* an error completion was injected: the rest flush */
    int connect_failed;     /* a connect fault ended it: state ERROR */
    int replaying;          /* a thread is posting the frozen sends */
    uint16_t peer_port;     /* active side: the port connected to (host order) */
    struct exs_list posts;  /* struct fault_post, while frozen */
    struct exs_list grants; /* struct fault_grant alive */
};

struct fault_mr {
    struct exs_prov_mr base;
    struct exs_prov_mr *inner;
    uint32_t grants; /* live grants over it (atomic) */
};

struct fault_grant {
    struct exs_prov_grant base;
    struct exs_prov_grant *inner;
    struct exs_list link; /* in its ep's grants */
};

struct fault_req {
    struct exs_prov_conn_req base;
    struct exs_prov_conn_req *inner;
    struct exs_list link; /* in its listener's reqs */
};

struct fault_lis {
    struct exs_prov_listener base;
    struct exs_prov_listener *inner;
    struct exs_list reqs; /* struct fault_req handed out, not yet answered */
};

static inline struct fault_ctx *fault_ctx_of(struct exs_prov_ctx *c)
{
    return exs_container_of(c, struct fault_ctx, base);
}
static inline struct fault_ep *fault_ep_of(struct exs_prov_ep *e)
{
    return exs_container_of(e, struct fault_ep, base);
}
static inline struct fault_mr *fault_mr_of(struct exs_prov_mr *m)
{
    return exs_container_of(m, struct fault_mr, base);
}
static inline struct fault_lis *fault_lis_of(struct exs_prov_listener *l)
{
    return exs_container_of(l, struct fault_lis, base);
}

/* fault_ctx.c: the context's ops */
int exs__fault_ctx_open(const struct exs_prov_ops *ops, const char *inner_name,
                        const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
void exs__fault_ctx_close(struct exs_prov_ctx *c);
int exs__fault_ctx_event_fd(struct exs_prov_ctx *c);
void exs__fault_ctx_fork(struct exs_prov_ctx *c, int phase);
int exs__fault_ctx_arm(struct exs_prov_ctx *c);
int exs__fault_ctx_progress(struct exs_prov_ctx *c);
int exs__fault_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max);
int exs__fault_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev);

/* fault_ctx.c: shared with fault_ops.c */
uint64_t exs__fault_now_ns(void);
/* Keep a completion for later delivery (ctx->lock held). -ENOMEM. */
int exs__fault_hold_locked(struct fault_ctx *ctx, const struct fault_held *h);
/* Whether this eligible call of kind k on ep (NULL: not about one) gets the fault;
 * counts it (ctx->lock held). With fault_port set, a call on an ep of another
 * connection is not eligible. */
int exs__fault_pick_locked(struct fault_ctx *ctx, enum fault_kind k, struct fault_ep *ep);
/* Make the event fd readable by deadline at the latest (ctx->lock held). */
void exs__fault_timer_locked(struct fault_ctx *ctx, uint64_t deadline_ns);
/* Queue an event for ctx_cm_poll (ctx->lock held). */
void exs__fault_cm_push_locked(struct fault_ctx *ctx, struct fault_cm *cm);
/* Forget everything queued for ep / listener (ctx->lock held): ep_destroy, listener_destroy. */
void exs__fault_purge_ep_locked(struct fault_ctx *ctx, struct fault_ep *ep);
void exs__fault_purge_lis_locked(struct fault_ctx *ctx, struct fault_lis *lis);
/* Replay the sends of eps whose freeze ended; > 0 when something was posted. */
int exs__fault_thaw(struct fault_ctx *ctx);
/* A freeze began (ctx->lock held): in the default progress mode, make sure the thaw
 * thread runs and looks. */
void exs__fault_frozen_locked(struct fault_ctx *ctx);

/* fault_ops.c: memory, endpoints, connections, posts */
int exs__fault_post_replay(struct fault_ep *ep, struct fault_post *p);
void exs__fault_post_free(struct fault_post *p);

#endif
