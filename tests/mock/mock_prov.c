/* SPDX-License-Identifier: MIT */
/* The mock provider: an in-memory, deterministic, single-threaded RC fabric for unit tests. */
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "exs/util/list.h"
#include "tests/mock/mock_prov.h"

struct mock_ctx;

struct mock_mr {
    struct exs_prov_mr super;
    struct exs_list link; /* in ctx->mrs */
    int local_only;       /* mem_alloc: no remote use, whatever the key */
    void *mem;            /* mem_alloc: the allocation to free */
};

struct mock_grant {
    struct exs_prov_grant super;
    struct exs_list link; /* in ep->grants */
    int held;             /* made under mock_grant_hold: not settled yet */
    int asked;            /* grant_settle said -EBUSY: a GRANT completion is owed */
};

struct mock_wr {
    struct exs_list link;
    int is_send;
    uint64_t wr_id;
    int opcode;
    unsigned flags;
    struct exs_prov_sge sge[MOCK_MAX_SGE];
    int num_sge;
    uint8_t *inl; /* SEND_INLINE: the payload copied at post time */
    uint32_t len;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    int inject; /* complete with inject_status */
    enum exs_prov_wc_status inject_status;
};

struct mock_cqe {
    struct exs_list link;
    struct exs_prov_cqe cqe;
    uint32_t retires; /* send slots freed when polled (1 + unsignaled before) */
};

struct mock_cm {
    struct exs_list link;
    struct exs_prov_cm_event ev;
};

struct mock_req;

struct mock_ep {
    struct exs_prov_ep super;
    struct mock_ctx *ctx;
    struct exs_list link; /* in fab.eps */
    enum exs_prov_ep_state state;
    struct mock_ep *peer;
    struct exs_list sq; /* send work requests not yet carried out */
    struct exs_list rq; /* posted receives */
    uint32_t rq_count;
    uint32_t sq_out;      /* send slots in use */
    uint32_t unsig;       /* successful unsignaled requests not yet retired */
    struct exs_list held; /* completions held back (reordering) */
    struct exs_list grants;
    uint32_t posted;    /* send work requests posted so far */
    uint32_t reads_out; /* RDMA_READs posted, completion not yet polled */
    uint32_t inject_at;
    enum exs_prov_wc_status inject_status;
    int rc_inject; /* mock_inject_recv_cqe: the next receive completion it causes */
    enum exs_prov_wc_opcode rc_opcode;
    unsigned rc_flags;
    int disc_queued; /* DISCONNECTED queued for this ep */
    int peer_closed; /* its peer destroyed its ep: DISCONNECTED says F_PEER_CLOSED */
    int had_addr;
    struct sockaddr_in local;
    struct mock_req *req; /* active side: its pending request */
};

struct mock_lis {
    struct exs_prov_listener super;
    struct mock_ctx *ctx;
    struct exs_list link; /* in fab.lis */
    struct sockaddr_in addr;
    int backlog;
    struct exs_list reqs;
    uint32_t nreq;
};

struct mock_req {
    struct exs_prov_conn_req super;
    struct exs_list link; /* in lis->reqs */
    struct mock_ep *active;
};

struct mock_ctx {
    struct exs_prov_ctx super;
    struct exs_list link; /* in fab.ctxs */
    int efd;
    int armed;
    struct exs_list cq;
    uint32_t cq_len, cq_cap, cq_reserved;
    struct exs_list cmq;
    struct exs_list mrs;
    uint32_t n_eps, n_lis;
    struct {
        uint32_t nth;
        int err;
    } fail[MOCK_FAIL_MAX];
    struct mock_stats st;
    int grant_hold; /* mock_grant_hold */
};

static struct {
    int init;
    struct exs_list ctxs, eps, lis;
    uint32_t seed; /* reordering on when != 0 */
    uint32_t rng;
    uint32_t rr;
    uint32_t key_ctr;
    uint16_t next_port;
    uint64_t violations;
    mock_tap_fn tap;
    void *tap_arg;
} fab;

#define MOCK_OF(_type, _p) exs_container_of(_p, struct _type, super)

static void fab_init(void)
{
    if (fab.init)
        return;
    exs_list_init(&fab.ctxs);
    exs_list_init(&fab.eps);
    exs_list_init(&fab.lis);
    fab.next_port = 20000;
    fab.key_ctr = 1;
    fab.init = 1;
}

static void mock_violation(const char *fmt, ...)
{
    va_list ap;

    fab.violations++;
    fprintf(stderr, "mock provider: contract violation: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Keys: a bijective mix of a process-wide counter, so unique and not sequential. */
static uint32_t mock_new_key(void)
{
    uint32_t x = fab.key_ctr++;

    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

static uint32_t mock_rand(void)
{
    /* xorshift32 */
    uint32_t x = fab.rng;

    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    fab.rng = x;
    return x;
}

static int mock_fail_now(struct mock_ctx *ctx, enum mock_fail_op op)
{
    if (!ctx->fail[op].nth)
        return 0;
    if (--ctx->fail[op].nth)
        return 0;
    return ctx->fail[op].err;
}

/* ---- queues and notification ---- */

static void ctx_notify(struct mock_ctx *ctx)
{
    uint64_t one = 1;

    if (ctx->armed && ctx->efd >= 0) {
        if (write(ctx->efd, &one, sizeof(one)) != sizeof(one))
            mock_violation("eventfd write failed");
        ctx->armed = 0;
    }
}

static void cq_push(struct mock_ctx *ctx, struct mock_cqe *c)
{
    if (ctx->cq_len >= ctx->cq_cap)
        mock_violation("completion queue full (%u), wr_id %llu", ctx->cq_cap,
                       (unsigned long long)c->cqe.wr_id);
    exs_list_add_tail(&ctx->cq, &c->link);
    ctx->cq_len++;
    if (ctx->cq_len > ctx->st.cq_max)
        ctx->st.cq_max = ctx->cq_len;
    ctx_notify(ctx);
}

static void cm_push(struct mock_ctx *ctx, const struct exs_prov_cm_event *ev)
{
    struct mock_cm *c = calloc(1, sizeof(*c));

    if (!c) {
        mock_violation("out of memory for a cm event");
        return;
    }
    c->ev = *ev;
    exs_list_add_tail(&ctx->cmq, &c->link);
    ctx_notify(ctx);
}

static void ep_event(struct mock_ep *ep, enum exs_prov_cm_event_type type, int status,
                     const void *pd, uint32_t pdlen)
{
    struct exs_prov_cm_event ev = {.type = type, .ep = &ep->super, .status = status};

    if (type == EXS_PROV_CM_DISCONNECTED && ep->peer_closed)
        ev.flags = EXS_PROV_CM_F_PEER_CLOSED;
    if (pdlen)
        memcpy(ev.private_data, pd, pdlen);
    ev.private_data_len = pdlen;
    cm_push(ep->ctx, &ev);
}

static enum exs_prov_wc_opcode wc_opcode_of(const struct mock_wr *wr)
{
    if (!wr->is_send)
        return EXS_PROV_WC_RECV;
    switch (wr->opcode) {
    case EXS_PROV_WR_RDMA_WRITE:
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        return EXS_PROV_WC_RDMA_WRITE;
    case EXS_PROV_WR_RDMA_READ:
        return EXS_PROV_WC_RDMA_READ;
    default:
        return EXS_PROV_WC_SEND;
    }
}

/* Queue a completion of ep (held back when reordering). */
static void ep_complete(struct mock_ep *ep, const struct exs_prov_cqe *cqe, int is_send)
{
    struct mock_cqe *c = calloc(1, sizeof(*c));

    if (!c) {
        mock_violation("out of memory for a completion");
        return;
    }
    c->cqe = *cqe;
    c->cqe.ep = &ep->super;
    if (is_send) {
        c->retires = 1 + ep->unsig;
        ep->unsig = 0;
    }
    if (cqe->status == EXS_PROV_WC_WR_FLUSH_ERR)
        ep->ctx->st.flushed++;
    if (fab.seed)
        exs_list_add_tail(&ep->held, &c->link);
    else
        cq_push(ep->ctx, c);
}

/* Complete a work request (taken off its queue) with status. */
static void wr_complete(struct mock_ep *ep, struct mock_wr *wr, enum exs_prov_wc_status status,
                        uint32_t byte_len)
{
    struct exs_prov_cqe cqe = {
        .wr_id = wr->wr_id,
        .status = status,
        .opcode = wc_opcode_of(wr),
        .byte_len = byte_len,
    };

    if (!wr->is_send)
        ep->rq_count--;
    if (wr->is_send && status == EXS_PROV_WC_SUCCESS && !(wr->flags & EXS_PROV_SEND_SIGNALED))
        ep->unsig++;
    else
        ep_complete(ep, &cqe, wr->is_send);
    free(wr->inl);
    free(wr);
}

/* ERROR: everything outstanding completes with WR_FLUSH_ERR, sends first. */
static void ep_error(struct mock_ep *ep)
{
    struct exs_list *n;

    ep->state = EXS_PROV_EP_ERROR;
    while ((n = exs_list_pop_head(&ep->sq)))
        wr_complete(ep, exs_list_entry(n, struct mock_wr, link), EXS_PROV_WC_WR_FLUSH_ERR, 0);
    while ((n = exs_list_pop_head(&ep->rq)))
        wr_complete(ep, exs_list_entry(n, struct mock_wr, link), EXS_PROV_WC_WR_FLUSH_ERR, 0);
}

static void ep_disconnect_one(struct mock_ep *ep, int status)
{
    if (ep->disc_queued)
        return;
    ep_error(ep);
    ep->disc_queued = 1;
    ep_event(ep, EXS_PROV_CM_DISCONNECTED, status, NULL, 0);
}

/* ---- memory ---- */

static struct mock_mr *mr_find_lkey(struct mock_ctx *ctx, uint32_t lkey)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ctx->mrs)
    {
        struct mock_mr *mr = exs_list_entry(pos, struct mock_mr, link);

        if (mr->super.lkey == lkey)
            return mr;
    }
    return NULL;
}

static int range_inside(uint64_t addr, uint64_t len, uint64_t start, uint64_t size)
{
    return addr >= start && len <= size && addr - start <= size - len;
}

/* Every sge of wr inside an mr of ctx (with LOCAL_WRITE when written). */
static int sges_ok(struct mock_ctx *ctx, const struct mock_wr *wr, int need_write)
{
    for (int i = 0; i < wr->num_sge; i++) {
        const struct exs_prov_sge *s = &wr->sge[i];
        struct mock_mr *mr;

        if (!s->length)
            continue;
        mr = mr_find_lkey(ctx, s->lkey);
        if (!mr || !range_inside(s->addr, s->length, (uintptr_t)mr->super.addr, mr->super.length))
            return 0;
        if (need_write && !(mr->super.access & EXS_PROV_ACCESS_LOCAL_WRITE))
            return 0;
    }
    return 1;
}

static uint32_t sges_len(const struct exs_prov_sge *sge, int n)
{
    uint64_t len = 0;

    for (int i = 0; i < n; i++)
        len += sge[i].length;
    return len > UINT32_MAX ? UINT32_MAX : (uint32_t)len;
}

static void gather(const struct mock_wr *wr, uint8_t *dst)
{
    if (wr->inl) {
        memcpy(dst, wr->inl, wr->len);
        return;
    }
    for (int i = 0; i < wr->num_sge; i++) {
        if (wr->sge[i].length)
            memcpy(dst, (const void *)(uintptr_t)wr->sge[i].addr, wr->sge[i].length);
        dst += wr->sge[i].length;
    }
}

static void scatter(const struct mock_wr *wr, const uint8_t *src, uint32_t len)
{
    for (int i = 0; i < wr->num_sge && len; i++) {
        uint32_t n = wr->sge[i].length < len ? wr->sge[i].length : len;

        if (n)
            memcpy((void *)(uintptr_t)wr->sge[i].addr, src, n);
        src += n;
        len -= n;
    }
}

/* The responder's memory for [addr, addr+len) under rkey with right, or NULL. Grants
 * count only on the responder ep they were made on; mrs need the right themselves. */
static uint8_t *remote_find(struct mock_ep *resp, uint32_t rkey, uint64_t addr, uint32_t len,
                            unsigned right)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &resp->grants)
    {
        struct mock_grant *g = exs_list_entry(pos, struct mock_grant, link);

        if (g->super.rkey != rkey)
            continue;
        if (g->super.access != right || !range_inside(addr, len, g->super.addr, g->super.length))
            return NULL;
        return (uint8_t *)(uintptr_t)addr;
    }
    exs_list_for_each(pos, &resp->ctx->mrs)
    {
        struct mock_mr *mr = exs_list_entry(pos, struct mock_mr, link);

        if (mr->super.rkey != rkey)
            continue;
        if (mr->local_only || !(mr->super.access & right) ||
            !range_inside(addr, len, (uintptr_t)mr->super.addr, mr->super.length))
            return NULL;
        return (uint8_t *)(uintptr_t)addr;
    }
    return NULL;
}

/* Fail wr on ep (requester) with status: ep to ERROR, the rest flushed. */
static void exec_fail(struct mock_ep *ep, struct mock_wr *wr, enum exs_prov_wc_status status)
{
    if (status == EXS_PROV_WC_LOC_PROT_ERR || status == EXS_PROV_WC_LOC_LEN_ERR)
        ep->ctx->st.loc_err++;
    if (status == EXS_PROV_WC_REM_ACCESS_ERR)
        ep->ctx->st.rem_access_err++;
    wr_complete(ep, wr, status, 0);
    ep_error(ep);
}

/* Carry out the head send work request of ep. */
static void exec_send(struct mock_ep *ep)
{
    struct mock_wr *wr = exs_list_entry(exs_list_pop_head(&ep->sq), struct mock_wr, link);
    struct mock_ep *peer = ep->peer;
    struct mock_wr *rwr = NULL;
    uint8_t *payload = NULL, *dst;
    int is_read = wr->opcode == EXS_PROV_WR_RDMA_READ;
    int consumes = wr->opcode == EXS_PROV_WR_SEND || wr->opcode == EXS_PROV_WR_SEND_WITH_IMM ||
                   wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM;
    uint32_t len = wr->len;

    if (wr->inject) {
        exec_fail(ep, wr, wr->inject_status);
        return;
    }
    if (!wr->inl && !sges_ok(ep->ctx, wr, is_read)) {
        exec_fail(ep, wr, EXS_PROV_WC_LOC_PROT_ERR);
        return;
    }
    if (!peer || peer->state != EXS_PROV_EP_CONNECTED) {
        /* the responder is gone or in ERROR: nothing answers */
        exec_fail(ep, wr, EXS_PROV_WC_RETRY_EXC_ERR);
        return;
    }
    if (consumes) {
        if (exs_list_empty(&peer->rq)) {
            ep->ctx->st.rnr++; /* tests assert the count (mock_stats) */
            exec_fail(ep, wr, EXS_PROV_WC_RNR_RETRY_EXC_ERR);
            return;
        }
        rwr = exs_list_entry(peer->rq.next, struct mock_wr, link);
    }
    if (is_read || wr->opcode == EXS_PROV_WR_RDMA_WRITE ||
        wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM) {
        unsigned right = is_read ? EXS_PROV_ACCESS_REMOTE_READ : EXS_PROV_ACCESS_REMOTE_WRITE;

        dst = len ? remote_find(peer, wr->rkey, wr->raddr, len, right) : NULL;
        if (len && !dst) {
            exec_fail(ep, wr, EXS_PROV_WC_REM_ACCESS_ERR);
            return;
        }
    } else {
        dst = NULL;
    }
    if (rwr && wr->opcode != EXS_PROV_WR_RDMA_WRITE_WITH_IMM) {
        /* SEND: the receive's buffers must hold it */
        if (!sges_ok(peer->ctx, rwr, 1)) {
            exs_list_del(&rwr->link);
            exec_fail(peer, rwr, EXS_PROV_WC_LOC_PROT_ERR);
            exec_fail(ep, wr, EXS_PROV_WC_REM_OP_ERR);
            return;
        }
        if (sges_len(rwr->sge, rwr->num_sge) < len) {
            exs_list_del(&rwr->link);
            exec_fail(peer, rwr, EXS_PROV_WC_LOC_LEN_ERR);
            exec_fail(ep, wr, EXS_PROV_WC_REM_INV_REQ_ERR);
            return;
        }
    }
    if (!is_read && len) {
        payload = malloc(len);
        if (!payload) {
            mock_violation("out of memory for a payload");
            exec_fail(ep, wr, EXS_PROV_WC_GENERAL_ERR);
            return;
        }
        gather(wr, payload);
    }
    if (fab.tap) {
        struct exs_prov_send_wr sw = {
            .wr_id = wr->wr_id,
            .opcode = wr->opcode,
            .flags = wr->flags,
            .sg_list = wr->sge,
            .num_sge = wr->num_sge,
            .imm_data = wr->imm,
            .remote_addr = wr->raddr,
            .rkey = wr->rkey,
        };
        fab.tap(fab.tap_arg, &ep->super, &sw, payload, len);
    }
    if (is_read) {
        ep->ctx->st.reads++;
        if (len)
            scatter(wr, dst, len);
    } else if (wr->opcode == EXS_PROV_WR_RDMA_WRITE ||
               wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM) {
        ep->ctx->st.writes++;
        if (len)
            memcpy(dst, payload, len);
    } else {
        ep->ctx->st.sends++;
        scatter(rwr, payload, len);
    }
    free(payload);
    if (rwr) {
        struct exs_prov_cqe rc = {
            .wr_id = rwr->wr_id,
            .status = EXS_PROV_WC_SUCCESS,
            .opcode = wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM ? EXS_PROV_WC_RECV_RDMA_WITH_IMM
                                                                    : EXS_PROV_WC_RECV,
            .byte_len = len,
        };
        if (wr->opcode != EXS_PROV_WR_SEND) {
            rc.imm_data = wr->imm;
            rc.flags = EXS_PROV_WC_WITH_IMM;
        }
        if (ep->rc_inject) {
            ep->rc_inject = 0;
            rc.opcode = ep->rc_opcode;
            rc.flags = ep->rc_flags;
        }
        exs_list_del(&rwr->link);
        peer->rq_count--;
        ep_complete(peer, &rc, 0);
        free(rwr);
    }
    wr_complete(ep, wr, EXS_PROV_WC_SUCCESS, is_read ? len : 0);
}

/* ---- stepping ---- */

static void held_deliver(struct mock_ep *ep)
{
    struct exs_list *n = exs_list_pop_head(&ep->held);

    if (n)
        cq_push(ep->ctx, exs_list_entry(n, struct mock_cqe, link));
}

int mock_step(void)
{
    struct exs_list *pos;
    uint32_t n = 0, k;

    fab_init();
    exs_list_for_each(pos, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(pos, struct mock_ep, link);

        n += !exs_list_empty(&ep->sq) + !exs_list_empty(&ep->held);
    }
    if (!n)
        return 0;
    k = fab.seed ? mock_rand() % n : fab.rr++ % n;
    exs_list_for_each(pos, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(pos, struct mock_ep, link);

        if (!exs_list_empty(&ep->sq) && !k--) {
            exec_send(ep);
            return 1;
        }
        if (!exs_list_empty(&ep->held) && !k--) {
            held_deliver(ep);
            return 1;
        }
    }
    return 0;
}

long mock_run_until_idle(long max)
{
    long n = 0;

    while (mock_step())
        if (++n >= max)
            return -1;
    return n;
}

void mock_set_reorder(uint32_t seed)
{
    struct exs_list *pos;

    fab_init();
    fab.seed = seed;
    fab.rng = seed ? seed : 1;
    if (seed)
        return;
    exs_list_for_each(pos, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(pos, struct mock_ep, link);

        while (!exs_list_empty(&ep->held))
            held_deliver(ep);
    }
}

void mock_inject_wr_error(struct exs_prov_ep *e, uint32_t nth, enum exs_prov_wc_status status)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);

    ep->inject_at = ep->posted + nth;
    ep->inject_status = status;
}

void mock_inject_recv_cqe(struct exs_prov_ep *e, enum exs_prov_wc_opcode opcode, unsigned flags)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);

    ep->rc_inject = 1;
    ep->rc_opcode = opcode;
    ep->rc_flags = flags;
}

void mock_drop(struct exs_prov_ep *e)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);

    if (ep->peer)
        ep_disconnect_one(ep->peer, -ECONNRESET);
    ep_disconnect_one(ep, -ECONNRESET);
}

void mock_fail(struct exs_prov_ctx *c, enum mock_fail_op op, uint32_t nth, int err)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);

    ctx->fail[op].nth = nth;
    ctx->fail[op].err = err;
}

void mock_stats(struct exs_prov_ctx *c, struct mock_stats *st)
{
    *st = MOCK_OF(mock_ctx, c)->st;
}

uint64_t mock_violations(void)
{
    return fab.violations;
}

void mock_set_tap(mock_tap_fn fn, void *arg)
{
    fab.tap = fn;
    fab.tap_arg = arg;
}

uint32_t mock_recv_posted(struct exs_prov_ep *e)
{
    return MOCK_OF(mock_ep, e)->rq_count;
}

/* ---- context ---- */

int mock_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    struct mock_ctx *ctx;

    fab_init();
    if (attr && attr->cq_size > MOCK_MAX_WR * 16)
        return -EINVAL;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->efd < 0) {
        free(ctx);
        return -errno;
    }
    ctx->super.ops = &mock_prov_ops;
    ctx->cq_cap = attr && attr->cq_size ? attr->cq_size : MOCK_CQ_SIZE;
    ctx->super.caps = (struct exs_prov_caps){
        .flags = EXS_PROV_CAP_WRITE_IMM | EXS_PROV_CAP_READ | EXS_PROV_CAP_INLINE,
        .max_inline = MOCK_MAX_INLINE,
        .max_sge = MOCK_MAX_SGE,
        .max_send_wr = MOCK_MAX_WR,
        .max_recv_wr = MOCK_MAX_WR,
        .max_private_data = MOCK_MAX_PD,
        .max_msg_size = MOCK_MAX_MSG,
        .max_cqe = ctx->cq_cap,
    };
    exs_list_init(&ctx->cq);
    exs_list_init(&ctx->cmq);
    exs_list_init(&ctx->mrs);
    exs_list_add_tail(&fab.ctxs, &ctx->link);
    *ctx_p = &ctx->super;
    return 0;
}

static void mock_ep_destroy(struct exs_prov_ep *e);
static void mock_listener_destroy(struct exs_prov_listener *l);

static void mock_ctx_close(struct exs_prov_ctx *c)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    struct exs_list *pos, *tmp, *n;

    exs_list_for_each_safe(pos, tmp, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(pos, struct mock_ep, link);

        if (ep->ctx == ctx) {
            mock_violation("ctx_close with an ep left");
            mock_ep_destroy(&ep->super);
        }
    }
    exs_list_for_each_safe(pos, tmp, &fab.lis)
    {
        struct mock_lis *lis = exs_list_entry(pos, struct mock_lis, link);

        if (lis->ctx == ctx) {
            mock_violation("ctx_close with a listener left");
            mock_listener_destroy(&lis->super);
        }
    }
    while ((n = exs_list_pop_head(&ctx->mrs))) {
        struct mock_mr *mr = exs_list_entry(n, struct mock_mr, link);

        mock_violation("ctx_close with an mr left (%zu bytes)", mr->super.length);
        free(mr->mem);
        free(mr);
    }
    while ((n = exs_list_pop_head(&ctx->cq)))
        free(exs_list_entry(n, struct mock_cqe, link));
    while ((n = exs_list_pop_head(&ctx->cmq)))
        free(exs_list_entry(n, struct mock_cm, link));
    exs_list_del(&ctx->link);
    close(ctx->efd);
    free(ctx);
}

static int mock_ctx_event_fd(struct exs_prov_ctx *c)
{
    return MOCK_OF(mock_ctx, c)->efd;
}

static int mock_ctx_arm(struct exs_prov_ctx *c)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    uint64_t v;

    if (read(ctx->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        return -errno;
    if (!exs_list_empty(&ctx->cq) || !exs_list_empty(&ctx->cmq))
        return -EAGAIN;
    ctx->armed = 1;
    return 0;
}

static int mock_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    int n = 0;

    while (n < max && !exs_list_empty(&ctx->cq)) {
        struct mock_cqe *m = exs_list_entry(exs_list_pop_head(&ctx->cq), struct mock_cqe, link);
        struct mock_ep *ep = MOCK_OF(mock_ep, m->cqe.ep);

        ctx->cq_len--;
        ep->sq_out -= m->retires;
        if (m->retires && m->cqe.opcode == EXS_PROV_WC_RDMA_READ)
            ep->reads_out--;
        cqe[n++] = m->cqe;
        free(m);
    }
    return n;
}

static int mock_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    struct exs_list *n = exs_list_pop_head(&ctx->cmq);

    if (!n)
        return 0;
    *ev = exs_list_entry(n, struct mock_cm, link)->ev;
    free(exs_list_entry(n, struct mock_cm, link));
    return 1;
}

/* ---- memory registration ---- */

static int mr_new(struct mock_ctx *ctx, void *addr, size_t length, unsigned access,
                  struct mock_mr **mr_p)
{
    struct mock_mr *mr;

    if (access & ~(unsigned)(EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                             EXS_PROV_ACCESS_REMOTE_READ))
        return -EINVAL;
    if (!addr && length)
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    mr->super.ctx = &ctx->super;
    mr->super.addr = addr;
    mr->super.length = length;
    mr->super.lkey = mock_new_key();
    mr->super.rkey = mock_new_key();
    mr->super.access = access;
    exs_list_add_tail(&ctx->mrs, &mr->link);
    *mr_p = mr;
    return 0;
}

static int mock_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                       struct exs_prov_mr **mr_p)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    struct mock_mr *mr;
    int ret = mock_fail_now(ctx, MOCK_FAIL_MR_REG);

    if (!ret)
        ret = mr_new(ctx, addr, length, access, &mr);
    if (ret)
        return ret;
    *mr_p = &mr->super;
    return 0;
}

static void mr_remove(struct mock_mr *mr)
{
    struct exs_list *pos, *p2, *tmp;

    exs_list_for_each(pos, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(pos, struct mock_ep, link);

        exs_list_for_each_safe(p2, tmp, &ep->grants)
        {
            struct mock_grant *g = exs_list_entry(p2, struct mock_grant, link);

            /* kept (its owner may still revoke it), but a violation */
            if (g->super.mr == &mr->super)
                mock_violation("mr deregistered with a grant left");
        }
    }
    exs_list_del(&mr->link);
    free(mr->mem);
    free(mr);
}

static int mock_mr_dereg(struct exs_prov_mr *m)
{
    mr_remove(exs_container_of(m, struct mock_mr, super));
    return 0;
}

static int mock_mem_alloc(struct exs_prov_ctx *c, size_t len, struct exs_prov_mr **mr_p)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    size_t size = (len + 4095) / 4096 * 4096;
    struct mock_mr *mr;
    void *mem;
    int ret = mock_fail_now(ctx, MOCK_FAIL_MEM_ALLOC);

    if (ret)
        return ret;
    if (!len)
        return -EINVAL;
    mem = aligned_alloc(4096, size);
    if (!mem)
        return -ENOMEM;
    /* contents undefined: make a reader of stale bytes visible */
    memset(mem, 0xa5, size);
    ret = mr_new(ctx, mem, len, EXS_PROV_ACCESS_LOCAL_WRITE, &mr);
    if (ret) {
        free(mem);
        return ret;
    }
    mr->local_only = 1;
    mr->mem = mem;
    *mr_p = &mr->super;
    return 0;
}

static void mock_mem_free(struct exs_prov_mr *m)
{
    mr_remove(exs_container_of(m, struct mock_mr, super));
}

static void mock_mr_put(struct exs_prov_mr *m)
{
    mr_remove(exs_container_of(m, struct mock_mr, super));
}

/* ---- grants ---- */

static int mock_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                      unsigned access, struct exs_prov_grant **grant_p)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);
    struct mock_grant *g;
    int ret = mock_fail_now(ep->ctx, MOCK_FAIL_GRANT);

    if (ret)
        return ret;
    if ((access != EXS_PROV_ACCESS_REMOTE_WRITE && access != EXS_PROV_ACCESS_REMOTE_READ) ||
        !length || m->ctx != e->ctx || !(m->access & EXS_PROV_ACCESS_LOCAL_WRITE) ||
        !range_inside((uintptr_t)addr, length, (uintptr_t)m->addr, m->length))
        return -EINVAL;
    if (ep->state != EXS_PROV_EP_CONNECTED)
        return -ENOTCONN;
    g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->super.ep = e;
    g->super.mr = m;
    g->super.addr = (uintptr_t)addr;
    g->super.length = length;
    g->super.rkey = mock_new_key();
    g->super.access = access;
    g->held = ep->ctx->grant_hold;
    exs_list_add_tail(&ep->grants, &g->link);
    ep->ctx->st.grants++;
    *grant_p = &g->super;
    return 0;
}

static void mock_revoke(struct exs_prov_grant *gr)
{
    struct mock_grant *g = exs_container_of(gr, struct mock_grant, super);
    struct mock_ep *ep = MOCK_OF(mock_ep, gr->ep);

    ep->ctx->st.revokes++;
    if (g->held) { /* as verbs with a window whose bind has not completed */
        ep->ctx->st.revokes_held++;
        ep_error(ep);
    }
    exs_list_del(&g->link);
    free(g);
}

static int mock_grant_settle(struct exs_prov_grant *gr)
{
    struct mock_grant *g = exs_container_of(gr, struct mock_grant, super);

    if (!g->held)
        return 0;
    g->asked = 1;
    return -EBUSY;
}

void mock_grant_hold(struct exs_prov_ctx *c, int on)
{
    MOCK_OF(mock_ctx, c)->grant_hold = on;
}

int mock_grant_settle_all(struct exs_prov_ctx *c)
{
    struct exs_list *p, *q;
    int n = 0;

    exs_list_for_each(p, &fab.eps)
    {
        struct mock_ep *ep = exs_list_entry(p, struct mock_ep, link);

        if (ep->ctx != MOCK_OF(mock_ctx, c))
            continue;
        exs_list_for_each(q, &ep->grants)
        {
            struct mock_grant *g = exs_list_entry(q, struct mock_grant, link);
            struct exs_prov_cqe cqe = {.opcode = EXS_PROV_WC_GRANT};

            if (!g->held)
                continue;
            g->held = 0;
            n++;
            if (g->asked)
                ep_complete(ep, &cqe, 0);
            g->asked = 0;
        }
    }
    return n;
}

/* ---- endpoints ---- */

static int mock_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                          struct exs_prov_ep **ep_p)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    struct mock_ep *ep;
    int ret = mock_fail_now(ctx, MOCK_FAIL_EP_CREATE);

    if (ret)
        return ret;
    if (!attr->max_send_wr || attr->max_send_wr > MOCK_MAX_WR || !attr->max_recv_wr ||
        attr->max_recv_wr > MOCK_MAX_WR || attr->max_inline > MOCK_MAX_INLINE ||
        attr->rnr_retry > 7)
        return -EINVAL;
    if (ctx->cq_reserved + attr->max_send_wr + attr->max_recv_wr > ctx->cq_cap)
        return -ENOBUFS;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    ep->super.ctx = c;
    ep->super.user = attr->user;
    ep->super.attr = *attr;
    ep->ctx = ctx;
    ep->state = EXS_PROV_EP_IDLE;
    exs_list_init(&ep->sq);
    exs_list_init(&ep->rq);
    exs_list_init(&ep->held);
    exs_list_init(&ep->grants);
    ctx->cq_reserved += attr->max_send_wr + attr->max_recv_wr;
    ctx->n_eps++;
    exs_list_add_tail(&fab.eps, &ep->link);
    *ep_p = &ep->super;
    return 0;
}

static void drop_cqes(struct exs_list *q, struct mock_ep *ep, uint32_t *len)
{
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, q)
    {
        struct mock_cqe *m = exs_list_entry(pos, struct mock_cqe, link);

        if (m->cqe.ep == &ep->super) {
            exs_list_del(&m->link);
            if (len)
                (*len)--;
            free(m);
        }
    }
}

static void mock_ep_destroy(struct exs_prov_ep *e)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);
    struct mock_ctx *ctx = ep->ctx;
    struct exs_list *pos, *tmp, *n;

    if (ep->peer) {
        ep->peer->peer_closed = 1; /* closed for good, not a path failure */
        ep_disconnect_one(ep->peer, 0);
        ep->peer->peer = NULL;
    }
    if (ep->req)
        ep->req->active = NULL;
    while ((n = exs_list_pop_head(&ep->grants))) {
        mock_violation("ep_destroy with a grant left");
        free(exs_list_entry(n, struct mock_grant, link));
    }
    while ((n = exs_list_pop_head(&ep->sq))) {
        free(exs_list_entry(n, struct mock_wr, link)->inl);
        free(exs_list_entry(n, struct mock_wr, link));
    }
    while ((n = exs_list_pop_head(&ep->rq)))
        free(exs_list_entry(n, struct mock_wr, link));
    drop_cqes(&ep->held, ep, NULL);
    drop_cqes(&ctx->cq, ep, &ctx->cq_len);
    exs_list_for_each_safe(pos, tmp, &ctx->cmq)
    {
        struct mock_cm *m = exs_list_entry(pos, struct mock_cm, link);

        if (m->ev.ep == e) {
            exs_list_del(&m->link);
            free(m);
        }
    }
    ctx->cq_reserved -= e->attr.max_send_wr + e->attr.max_recv_wr;
    ctx->n_eps--;
    exs_list_del(&ep->link);
    free(ep);
}

static enum exs_prov_ep_state mock_ep_state(struct exs_prov_ep *e)
{
    return MOCK_OF(mock_ep, e)->state;
}

static int mock_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr,
                              socklen_t *addrlen)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);

    if (!ep->had_addr)
        return -ENOTCONN;
    memset(addr, 0, sizeof(*addr));
    memcpy(addr, &ep->local, sizeof(ep->local));
    *addrlen = sizeof(ep->local);
    return 0;
}

static void ep_take_addr(struct mock_ep *ep)
{
    ep->local.sin_family = AF_INET;
    ep->local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ep->local.sin_port = htons(fab.next_port++);
    ep->had_addr = 1;
}

/* ---- connection management ---- */

static int mock_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                       int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct mock_ctx *ctx = MOCK_OF(mock_ctx, c);
    struct sockaddr_in sin;
    struct exs_list *pos;
    struct mock_lis *lis;

    if (addrlen < sizeof(sin) || addr->sa_family != AF_INET || backlog < 1)
        return -EINVAL;
    memcpy(&sin, addr, sizeof(sin));
    if (!sin.sin_port)
        sin.sin_port = htons(fab.next_port++);
    exs_list_for_each(pos, &fab.lis)
    {
        if (exs_list_entry(pos, struct mock_lis, link)->addr.sin_port == sin.sin_port)
            return -EADDRINUSE;
    }
    lis = calloc(1, sizeof(*lis));
    if (!lis)
        return -ENOMEM;
    lis->super.ctx = c;
    lis->super.user = user;
    lis->ctx = ctx;
    lis->addr = sin;
    lis->backlog = backlog;
    exs_list_init(&lis->reqs);
    exs_list_add_tail(&fab.lis, &lis->link);
    ctx->n_lis++;
    *lis_p = &lis->super;
    return 0;
}

static int mock_listener_addr(struct exs_prov_listener *l, struct sockaddr_storage *addr,
                              socklen_t *addrlen)
{
    struct mock_lis *lis = MOCK_OF(mock_lis, l);

    memset(addr, 0, sizeof(*addr));
    memcpy(addr, &lis->addr, sizeof(lis->addr));
    *addrlen = sizeof(lis->addr);
    return 0;
}

static void req_free(struct mock_lis *lis, struct mock_req *req)
{
    exs_list_del(&req->link);
    lis->nreq--;
    if (req->active)
        req->active->req = NULL;
    free(req);
}

static int mock_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct mock_req *req = MOCK_OF(mock_req, r);
    struct mock_lis *lis = MOCK_OF(mock_lis, r->listener);

    if (pdlen > MOCK_MAX_PD)
        return -EINVAL;
    if (req->active) {
        req->active->state = EXS_PROV_EP_ERROR;
        ep_event(req->active, EXS_PROV_CM_REJECTED, 0, pd, pdlen);
    }
    req_free(lis, req);
    return 0;
}

static void mock_listener_destroy(struct exs_prov_listener *l)
{
    struct mock_lis *lis = MOCK_OF(mock_lis, l);
    struct exs_list *pos, *tmp, *n;

    while ((n = exs_list_pop_head(&lis->reqs))) {
        exs_list_add_head(&lis->reqs, n); /* req_free unlinks it */
        mock_reject(&exs_list_entry(n, struct mock_req, link)->super, NULL, 0);
    }
    exs_list_for_each_safe(pos, tmp, &lis->ctx->cmq)
    {
        struct mock_cm *m = exs_list_entry(pos, struct mock_cm, link);

        if (m->ev.listener == l) {
            exs_list_del(&m->link);
            free(m);
        }
    }
    lis->ctx->n_lis--;
    exs_list_del(&lis->link);
    free(lis);
}

static int mock_connect(struct exs_prov_ep *e, const struct sockaddr *addr, socklen_t addrlen,
                        const void *pd, uint32_t pdlen)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);
    struct mock_lis *lis = NULL;
    struct sockaddr_in sin;
    struct exs_list *pos;
    struct mock_req *req;

    if (addrlen < sizeof(sin) || addr->sa_family != AF_INET || pdlen > MOCK_MAX_PD)
        return -EINVAL;
    if (ep->state != EXS_PROV_EP_IDLE || ep->had_addr)
        return -EISCONN;
    memcpy(&sin, addr, sizeof(sin));
    ep_take_addr(ep);
    ep->state = EXS_PROV_EP_CONNECTING;
    exs_list_for_each(pos, &fab.lis)
    {
        struct mock_lis *l = exs_list_entry(pos, struct mock_lis, link);

        if (l->addr.sin_port == sin.sin_port)
            lis = l;
    }
    if (!lis || lis->nreq >= (uint32_t)lis->backlog) {
        ep->state = EXS_PROV_EP_ERROR;
        ep_event(ep, EXS_PROV_CM_UNREACHABLE, -ECONNREFUSED, NULL, 0);
        return 0;
    }
    req = calloc(1, sizeof(*req));
    if (!req)
        return -ENOMEM;
    req->super.listener = &lis->super;
    req->active = ep;
    ep->req = req;
    exs_list_add_tail(&lis->reqs, &req->link);
    lis->nreq++;

    struct exs_prov_cm_event ev = {
        .type = EXS_PROV_CM_CONNECT_REQUEST,
        .listener = &lis->super,
        .req = &req->super,
        .peer_addrlen = sizeof(ep->local),
        .private_data_len = pdlen,
    };
    memcpy(&ev.peer_addr, &ep->local, sizeof(ep->local));
    if (pdlen)
        memcpy(ev.private_data, pd, pdlen);
    cm_push(lis->ctx, &ev);
    return 0;
}

static int mock_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                       uint32_t pdlen)
{
    struct mock_req *req = MOCK_OF(mock_req, r);
    struct mock_lis *lis = MOCK_OF(mock_lis, r->listener);
    struct mock_ep *ep = MOCK_OF(mock_ep, e), *act = req->active;

    if (pdlen > MOCK_MAX_PD)
        return -EINVAL;
    if (ep->state != EXS_PROV_EP_IDLE || ep->had_addr)
        return -EISCONN;
    req_free(lis, req);
    if (!act)
        return -ECONNABORTED; /* the active side went away meanwhile */
    ep->local = lis->addr;
    ep->had_addr = 1;
    ep->peer = act;
    act->peer = ep;
    ep->state = act->state = EXS_PROV_EP_CONNECTED;
    ep_event(act, EXS_PROV_CM_ESTABLISHED, 0, pd, pdlen);
    ep_event(ep, EXS_PROV_CM_ESTABLISHED, 0, NULL, 0);
    return 0;
}

static int mock_disconnect(struct exs_prov_ep *e)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);

    if (ep->state == EXS_PROV_EP_IDLE)
        return -ENOTCONN;
    if (ep->req) {
        ep->req->active = NULL;
        ep->req = NULL;
    }
    if (ep->peer)
        ep_disconnect_one(ep->peer, 0);
    ep_disconnect_one(ep, 0);
    return 0;
}

/* ---- data path ---- */

static int wr_copy_sges(struct mock_wr *w, const struct exs_prov_sge *sge, int num_sge)
{
    if (num_sge < 0 || num_sge > (int)MOCK_MAX_SGE || (num_sge && !sge))
        return -EINVAL;
    if (num_sge)
        memcpy(w->sge, sge, (size_t)num_sge * sizeof(*sge));
    w->num_sge = num_sge;
    return 0;
}

/* A work request with its own copy of the scatter/gather list. */
static int wr_new(const struct exs_prov_sge *sg, int n, struct mock_wr **w_p)
{
    struct mock_wr *w = calloc(1, sizeof(*w));
    int ret;

    if (!w)
        return -ENOMEM;
    ret = wr_copy_sges(w, sg, n);
    if (ret) {
        free(w);
        return ret;
    }
    *w_p = w;
    return 0;
}

static int mock_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *wr)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);
    struct mock_wr *w;
    int ret = mock_fail_now(ep->ctx, MOCK_FAIL_POST_RECV);

    if (ret)
        return ret;
    if (ep->rq_count >= e->attr.max_recv_wr)
        return -ENOMEM;
    ret = wr_new(wr->sg_list, wr->num_sge, &w);
    if (ret)
        return ret;
    w->wr_id = wr->wr_id;
    ep->rq_count++;
    if (ep->state == EXS_PROV_EP_ERROR)
        wr_complete(ep, w, EXS_PROV_WC_WR_FLUSH_ERR, 0);
    else
        exs_list_add_tail(&ep->rq, &w->link);
    return 0;
}

static int mock_post_send(struct exs_prov_ep *e, const struct exs_prov_send_wr *wr)
{
    struct mock_ep *ep = MOCK_OF(mock_ep, e);
    struct mock_wr *w;
    uint32_t len;
    int ret;

    if (wr->opcode < EXS_PROV_WR_SEND || wr->opcode > EXS_PROV_WR_RDMA_READ || wr->num_sge < 0 ||
        wr->num_sge > (int)MOCK_MAX_SGE)
        return -EINVAL;
    len = sges_len(wr->sg_list, wr->num_sge);
    if (len > MOCK_MAX_MSG)
        return -EINVAL;
    if ((wr->flags & EXS_PROV_SEND_INLINE) &&
        (len > e->attr.max_inline || wr->opcode == EXS_PROV_WR_RDMA_READ))
        return -EINVAL;
    if (ep->state == EXS_PROV_EP_IDLE || ep->state == EXS_PROV_EP_CONNECTING)
        return -ENOTCONN;
    if (ep->sq_out >= e->attr.max_send_wr)
        return -ENOMEM;
    ret = wr_new(wr->sg_list, wr->num_sge, &w);
    if (ret)
        return ret;
    w->is_send = 1;
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->flags = wr->flags;
    w->len = len;
    w->imm = wr->imm_data;
    w->raddr = wr->remote_addr;
    w->rkey = wr->rkey;
    if ((wr->flags & EXS_PROV_SEND_INLINE) && len) {
        w->inl = malloc(len);
        if (!w->inl) {
            free(w);
            return -ENOMEM;
        }
        /* the payload is taken now: the caller may reuse its buffer on return */
        uint8_t *d = w->inl;
        for (int i = 0; i < wr->num_sge; i++) {
            memcpy(d, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
            d += wr->sg_list[i].length;
        }
    }
    ep->sq_out++;
    if (wr->opcode == EXS_PROV_WR_RDMA_READ && ++ep->reads_out > ep->ctx->st.reads_max)
        ep->ctx->st.reads_max = ep->reads_out;
    if (++ep->posted == ep->inject_at) {
        w->inject = 1;
        w->inject_status = ep->inject_status;
    }
    if (ep->state == EXS_PROV_EP_ERROR)
        wr_complete(ep, w, EXS_PROV_WC_WR_FLUSH_ERR, 0);
    else
        exs_list_add_tail(&ep->sq, &w->link);
    return 0;
}

const struct exs_prov_ops mock_prov_ops = {
    .name = "mock",
    .ctx_open = mock_ctx_open,
    .ctx_close = mock_ctx_close,
    .ctx_event_fd = mock_ctx_event_fd,
    .ctx_arm = mock_ctx_arm,
    .ctx_poll = mock_ctx_poll,
    .ctx_cm_poll = mock_ctx_cm_poll,
    .mr_reg = mock_mr_reg,
    .mr_dereg = mock_mr_dereg,
    .mem_alloc = mock_mem_alloc,
    .mem_free = mock_mem_free,
    .mr_get = mock_mr_reg,
    .mr_put = mock_mr_put,
    .grant = mock_grant,
    .revoke = mock_revoke,
    .grant_settle = mock_grant_settle,
    .ep_create = mock_ep_create,
    .ep_destroy = mock_ep_destroy,
    .ep_state = mock_ep_state,
    .ep_local_addr = mock_ep_local_addr,
    .listen = mock_listen,
    .listener_addr = mock_listener_addr,
    .listener_destroy = mock_listener_destroy,
    .connect = mock_connect,
    .accept = mock_accept,
    .reject = mock_reject,
    .disconnect = mock_disconnect,
    .post_recv = mock_post_recv,
    .post_send = mock_post_send,
};
