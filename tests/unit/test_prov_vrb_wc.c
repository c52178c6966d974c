/* SPDX-License-Identifier: MIT */
/* The verbs provider's completion conversion without hardware (suite prov_vrb_cache, case
 * wc; verbs builds only): a ctx and an ep of the provider over a fake device (the verbs
 * data calls are inline calls through the context's ops: post_send, post_recv, poll_cq
 * and req_notify_cq are the fake's), so that stale and foreign completions, the success
 * path without the ep's lock, the locked paths, and posters racing the consumer (TSan) are
 * checked on any host (spec/threading.md, "Verbs completions"). */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/util.h"
#include "tests/unit/unit.h"

#ifdef EXS_HAVE_VERBS_PROV
#include "exs/prov/verbs/vrb.h"

/* ---- the fake device: one CQ; a signaled send and every receive complete at once ---- */

#define FK_CQ 4096

static struct {
    pthread_mutex_t lock; /* the device's own ordering: a completion follows its post */
    struct ibv_wc wc[FK_CQ];
    unsigned head, count;
    uint32_t imm;
    int send_cs, recv_cs, notify_cs; /* the cancel state each fake call last ran with */
    unsigned polls;                  /* poll_cq calls */
} fk;

/* The calling thread's cancel state (PTHREAD_CANCEL_ENABLE or _DISABLE), unchanged. */
static int fk_cancel_state(void)
{
    int cs;

    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cs); /* nocancel: ok (a test's probe) */
    pthread_setcancelstate(cs, NULL);                    /* nocancel: ok */
    return cs;
}

static void fk_push(uint64_t wr_id, enum ibv_wc_opcode op, uint32_t len, int imm)
{
    struct ibv_wc *w;

    pthread_mutex_lock(&fk.lock);
    ck_assert_uint_lt(fk.count, FK_CQ);
    w = &fk.wc[(fk.head + fk.count++) % FK_CQ];
    memset(w, 0, sizeof(*w));
    w->wr_id = wr_id;
    w->status = IBV_WC_SUCCESS;
    w->opcode = op;
    w->byte_len = len;
    if (imm) {
        w->wc_flags = IBV_WC_WITH_IMM;
        w->imm_data = htonl(++fk.imm);
    }
    pthread_mutex_unlock(&fk.lock);
}

static int fk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)qp;
    (void)bad;
    fk.send_cs = fk_cancel_state();
    for (; wr; wr = wr->next)
        if (wr->send_flags & IBV_SEND_SIGNALED)
            fk_push(wr->wr_id, IBV_WC_RDMA_WRITE, 0, 0);
    return 0;
}

static int fk_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)qp;
    (void)bad;
    fk.recv_cs = fk_cancel_state();
    for (; wr; wr = wr->next)
        fk_push(wr->wr_id, IBV_WC_RECV_RDMA_WITH_IMM, 64, 1);
    return 0;
}

static int fk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    int got = 0;

    (void)cq;
    pthread_mutex_lock(&fk.lock);
    fk.polls++;
    while (got < n && fk.count) {
        wc[got++] = fk.wc[fk.head];
        fk.head = (fk.head + 1) % FK_CQ;
        fk.count--;
    }
    pthread_mutex_unlock(&fk.lock);
    return got;
}

static int fk_req_notify(struct ibv_cq *cq, int solicited)
{
    (void)cq;
    (void)solicited;
    fk.notify_cs = fk_cancel_state();
    return 0;
}

struct fk_env {
    struct ibv_context vc;
    struct ibv_cq cq;
    struct ibv_qp qp;
    struct vrb_ctx *ctx;
    struct vrb_ep *ep;
};

#define FK_DEPTH 16u

static void fk_open_depth(struct fk_env *e, uint32_t sdepth, uint32_t rdepth)
{
    struct vrb_ctx *ctx;
    struct vrb_ep *ep;

    memset(e, 0, sizeof(*e));
    memset(&fk.wc, 0, sizeof(fk.wc));
    fk.head = fk.count = 0;
    fk.imm = 0;
    fk.polls = 0;
    pthread_mutex_init(&fk.lock, NULL);
    e->vc.ops.post_send = fk_post_send;
    e->vc.ops.post_recv = fk_post_recv;
    e->vc.ops.poll_cq = fk_poll_cq;
    e->vc.ops.req_notify_cq = fk_req_notify;
    e->cq.context = &e->vc;
    e->qp.context = &e->vc;

    ctx = calloc(1, sizeof(*ctx));
    ck_assert_ptr_nonnull(ctx);
    pthread_mutex_init(&ctx->cm_lock, NULL);
    pthread_rwlock_init(&ctx->mr_lock, NULL);
    exs_list_init(&ctx->cm_sw);
    exs_list_init(&ctx->eps);
    for (unsigned i = 0; i < VRB_EP_HASH; i++)
        exs_list_init(&ctx->ep_hash[i]);
    for (unsigned i = 0; i < VRB_MR_HASH; i++)
        exs_list_init(&ctx->mr_hash[i]);
    ctx->evfd = ctx->epfd = -1;
    ctx->cq = &e->cq;
    exs__vrb_ctx_base_init(ctx);
    ctx->base.caps.max_sge = 4;
    ctx->base.caps.max_msg_size = 1u << 30;
    ctx->base.caps.max_inline = 64;

    ep = calloc(1, sizeof(*ep));
    ck_assert_ptr_nonnull(ep);
    ep->ctx = ctx;
    ep->base.ctx = &ctx->base;
    ep->base.attr.max_send_wr = sdepth;
    ep->base.attr.max_recv_wr = rdepth;
    ep->base.attr.max_inline = 64;
    /* the rings as exs__vrb_ep_create sizes them */
    ep->sq_mask = exs__vrb_slots(sdepth) - 1;
    ep->rq_mask = exs__vrb_slots(rdepth) - 1;
    ep->sq = calloc((size_t)ep->sq_mask + 1, sizeof(*ep->sq));
    ep->rq = calloc((size_t)ep->rq_mask + 1, sizeof(*ep->rq));
    ck_assert(ep->sq && ep->rq);
    ep->qp = &e->qp;
    ep->state = EXS_PROV_EP_CONNECTED;
    exs_list_init(&ep->grants);
    exs__vrb_ep_hash_add(ctx, ep);
    e->ctx = ctx;
    e->ep = ep;
}

static void fk_open(struct fk_env *e)
{
    fk_open_depth(e, FK_DEPTH, FK_DEPTH);
}

static void fk_close(struct fk_env *e)
{
    struct vrb_ep *ep = e->ep;

    exs__lite_lock_st(&ep->lock);
    exs__vrb_held_drop_locked(ep);
    exs__lite_unlock_st(&ep->lock);
    exs__lite_lock_st(&e->ctx->lock);
    exs_list_del(&ep->hlink);
    exs_list_del(&ep->link);
    exs__lite_unlock_st(&e->ctx->lock);
    free(ep->sq);
    free(ep->rq);
    free(ep);
    free(e->ctx->ring);
    pthread_mutex_destroy(&e->ctx->cm_lock);
    pthread_rwlock_destroy(&e->ctx->mr_lock);
    free(e->ctx);
    pthread_mutex_destroy(&fk.lock);
}

static uint8_t fk_buf[64];

static int fk_send(struct fk_env *e, uint64_t wr_id, unsigned flags)
{
    struct exs_prov_sge sge = {.addr = (uintptr_t)fk_buf, .length = 16, .lkey = 1};
    struct exs_prov_send_wr wr = {.wr_id = wr_id,
                                  .opcode = EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
                                  .flags = flags,
                                  .sg_list = &sge,
                                  .num_sge = 1,
                                  .imm_data = 7,
                                  .remote_addr = 4096,
                                  .rkey = 9};

    return exs__vrb_post_send(&e->ep->base, &wr);
}

static int fk_recv(struct fk_env *e, uint64_t wr_id)
{
    struct exs_prov_sge sge = {.addr = (uintptr_t)fk_buf, .length = 64, .lkey = 1};
    struct exs_prov_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};

    return exs__vrb_post_recv(&e->ep->base, &wr);
}

/* One work completion of ep's queue through exs__vrb_wc_convert, as ctx_poll calls it. */
static int fk_convert(struct fk_env *e, uint32_t epid, uint64_t bits, enum ibv_wc_status st,
                      struct exs_prov_cqe *cqe)
{
    struct ibv_wc wc = {.wr_id = ((uint64_t)epid << VRB_EPID_SHIFT) | bits, .status = st};
    int r;

    wc.opcode = (bits & VRB_RECV_BIT) ? IBV_WC_RECV : IBV_WC_RDMA_WRITE;
    exs__lite_lock_st(&e->ctx->lock);
    r = exs__vrb_wc_convert(e->ctx, &wc, cqe, NULL);
    exs__lite_unlock_st(&e->ctx->lock);
    return r;
}

/* A completion that names no ep, or a slot outside its queue's outstanding ones (before the
 * head, at or past the tail), is dropped and counted, on either queue, whatever its
 * status: the success path does not take it. */
START_TEST(wc_stale_and_foreign_dropped)
{
    struct fk_env e;
    struct exs_prov_cqe c;
    uint64_t stale;

    fk_open(&e);
    ck_assert_int_eq(fk_recv(&e, 100), 0);
    ck_assert_int_eq(fk_send(&e, 200, EXS_PROV_SEND_SIGNALED), 0);
    /* the fake completed both: take them (slots 0 retired: heads at 1) */
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, &c, 1), 1);
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, &c, 1), 1);
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, &c, 1), 0);
    ck_assert_int_eq(fk_recv(&e, 101), 0); /* outstanding: recv slot 1, its wc queued */
    stale = e.ctx->cnt.stale_cqes;
    ck_assert_int_eq(fk_convert(&e, e.ep->epid + 1, VRB_RECV_BIT | 1, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, 0, 0, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, VRB_RECV_BIT | 0, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, VRB_RECV_BIT | 2, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, VRB_RECV_BIT | VRB_SEQ_MASK, IBV_WC_SUCCESS, &c),
                     -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, 0, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, 1, IBV_WC_SUCCESS, &c), -1);
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, 5, IBV_WC_WR_FLUSH_ERR, &c), -1);
    ck_assert_uint_eq(e.ctx->cnt.stale_cqes, stale + 8);
    /* the queues are untouched: the real one still converts, in order */
    ck_assert_uint_eq(e.ep->rq_head, 1);
    ck_assert_uint_eq(e.ep->sq_head, 1);
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, &c, 1), 1);
    ck_assert_uint_eq(c.wr_id, 101);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    fk_close(&e);
}
END_TEST

/* Successful completions in the window are converted without the ep's lock (counter
 * wc_locked stays), with what the consumer needs (wr_id, opcode, length, immediate), and
 * their slots come back (a full queue's worth, twice). */
START_TEST(wc_success_path_takes_no_ep_lock)
{
    struct fk_env e;
    struct exs_prov_cqe c[4];
    uint64_t locked;

    fk_open(&e);
    locked = e.ctx->cnt.wc_locked;
    for (uint64_t i = 0; i < 2 * FK_DEPTH; i++) {
        ck_assert_int_eq(fk_recv(&e, 1000 + i), 0);
        ck_assert_int_eq(fk_send(&e, 2000 + i, EXS_PROV_SEND_SIGNALED), 0);
        ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, c, 4), 2);
        ck_assert_uint_eq(c[0].wr_id, 1000 + i);
        ck_assert_int_eq(c[0].status, EXS_PROV_WC_SUCCESS);
        ck_assert_int_eq(c[0].opcode, EXS_PROV_WC_RECV_RDMA_WITH_IMM);
        ck_assert_uint_eq(c[0].byte_len, 64);
        ck_assert(c[0].flags & EXS_PROV_WC_WITH_IMM);
        ck_assert_uint_eq(c[0].imm_data, i + 1);
        ck_assert_ptr_eq(c[0].ep, &e.ep->base);
        ck_assert_uint_eq(c[1].wr_id, 2000 + i);
        ck_assert_int_eq(c[1].opcode, EXS_PROV_WC_RDMA_WRITE);
    }
    ck_assert_uint_eq(e.ep->sq_head, 2 * FK_DEPTH);
    ck_assert_uint_eq(e.ep->rq_head, 2 * FK_DEPTH);
    ck_assert_msg(e.ctx->cnt.wc_locked == locked, "%llu successful completions took the ep's lock",
                  (unsigned long long)(e.ctx->cnt.wc_locked - locked));
    fk_close(&e);
}
END_TEST

/* A completion polled before its poster published the slot (sq_posted / rq_tail not
 * moved yet: the device completed it while post_send still ran) is converted under the
 * ep's lock, not dropped; an error completion too (the ep goes to ERROR). */
START_TEST(wc_early_and_error_completions_locked)
{
    struct fk_env e;
    struct exs_prov_cqe c;
    uint64_t locked, stale;

    fk_open(&e);
    ck_assert_int_eq(fk_send(&e, 300, 0), 0);
    ck_assert_int_eq(fk_send(&e, 301, 0), 0);
    ck_assert_int_eq(fk_recv(&e, 400), 0);
    pthread_mutex_lock(&fk.lock);
    fk.count = 0; /* the fake's receive completion: made by hand below */
    pthread_mutex_unlock(&fk.lock);
    /* as if post_send had not stored sq_posted yet */
    __atomic_store_n(&e.ep->sq_posted, 1, __ATOMIC_RELEASE);
    locked = e.ctx->cnt.wc_locked;
    stale = e.ctx->cnt.stale_cqes;
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, 1, IBV_WC_SUCCESS, &c), 0);
    ck_assert_uint_eq(c.wr_id, 301);
    ck_assert_uint_eq(e.ctx->cnt.wc_locked, locked + 1);
    ck_assert_uint_eq(e.ep->sq_head, 2); /* it retires the unsignaled one before it */
    ck_assert_int_eq(fk_convert(&e, e.ep->epid, VRB_RECV_BIT | 0, IBV_WC_LOC_LEN_ERR, &c), 0);
    ck_assert_uint_eq(c.wr_id, 400);
    ck_assert_int_eq(c.status, EXS_PROV_WC_LOC_LEN_ERR);
    ck_assert_uint_eq(e.ctx->cnt.wc_locked, locked + 2);
    ck_assert_uint_eq(e.ctx->cnt.stale_cqes, stale);
    ck_assert_int_eq(exs__vrb_ep_state(&e.ep->base), EXS_PROV_EP_ERROR);
    fk_close(&e);
}
END_TEST

/* Two SIGNALED requests of one batch (DEFER, ep_flush): the first goes unsignaled and its
 * completion is made before the second's; the made one holds its slot until returned. */
START_TEST(wc_batch_made_completion_in_order)
{
    struct fk_env e;
    struct exs_prov_cqe c[4];

    fk_open(&e);
    ck_assert_int_eq(fk_send(&e, 500, EXS_PROV_SEND_SIGNALED | EXS_PROV_SEND_DEFER), 0);
    ck_assert_int_eq(fk_send(&e, 501, EXS_PROV_SEND_SIGNALED | EXS_PROV_SEND_DEFER), 0);
    exs__vrb_ep_flush(&e.ep->base);
    ck_assert_uint_eq(e.ep->synth_out, 1);
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, c, 1), 1);
    ck_assert_uint_eq(c[0].wr_id, 500);
    ck_assert_uint_eq(e.ep->sq_head, 1); /* 501 is kept: its slot still taken */
    ck_assert_int_eq(exs__prov_verbs_ops.ctx_poll(&e.ctx->base, c, 4), 1);
    ck_assert_uint_eq(c[0].wr_id, 501);
    ck_assert_uint_eq(e.ep->sq_head, 2);
    ck_assert_uint_eq(e.ep->synth_out, 0);
    fk_close(&e);
}
END_TEST

/* Queues whose depths are not powers of two (5 sends, 3 receives): their rings have the
 * next power of two of slots (a slot is seq & mask), so full queues, filled and drained
 * across the rings' wrap again and again, give every completion its own request back. */
START_TEST(wc_ring_depth_not_pow2)
{
    enum { SD = 5, RD = 3, ROUNDS = 9 };
    struct fk_env e;
    struct exs_prov_cqe c[SD + RD];
    uint64_t next_s = 0, next_r = 0;

    ck_assert_uint_eq(exs__vrb_slots(1), 1);
    ck_assert_uint_eq(exs__vrb_slots(5), 8);
    ck_assert_uint_eq(exs__vrb_slots(64), 64);
    ck_assert_uint_eq(exs__vrb_slots(1u << 31), 1u << 31);
    ck_assert_uint_eq(exs__vrb_slots((1u << 31) + 1), 0);
    fk_open_depth(&e, SD, RD);
    for (int round = 0; round < ROUNDS; round++) {
        int got = 0;

        for (int i = 0; i < RD; i++)
            ck_assert_int_eq(fk_recv(&e, 1000 + (uint64_t)round * RD + (uint64_t)i), 0);
        ck_assert_int_eq(fk_recv(&e, 1), -ENOMEM); /* the queue is full at its depth */
        for (int i = 0; i < SD; i++)
            ck_assert_int_eq(
                fk_send(&e, 5000 + (uint64_t)round * SD + (uint64_t)i, EXS_PROV_SEND_SIGNALED), 0);
        ck_assert_int_eq(fk_send(&e, 1, EXS_PROV_SEND_SIGNALED), -ENOMEM);
        while (got < SD + RD) {
            int n = exs__prov_verbs_ops.ctx_poll(&e.ctx->base, c, SD + RD);

            ck_assert_int_gt(n, 0);
            for (int i = 0; i < n; i++) {
                ck_assert_int_eq(c[i].status, EXS_PROV_WC_SUCCESS);
                if (c[i].wr_id >= 5000)
                    ck_assert_uint_eq(c[i].wr_id, 5000 + next_s++);
                else
                    ck_assert_uint_eq(c[i].wr_id, 1000 + next_r++);
            }
            got += n;
        }
    }
    ck_assert_uint_eq(next_s, (uint64_t)SD * ROUNDS);
    ck_assert_uint_eq(next_r, (uint64_t)RD * ROUNDS);
    fk_close(&e);
}
END_TEST

/* ---- posters racing the consumer (run it under TSan: make SAN=thread) ---- */

#define FK_RACE_N 4000u

struct fk_race {
    struct fk_env *e;
    int done;        /* atomic: the consumer has everything */
    int poster_done; /* atomic */
    const char *fail;
};

static int fk_retry(struct fk_race *r, int (*post)(struct fk_env *, uint64_t, unsigned),
                    uint64_t id, unsigned flags)
{
    uint64_t until = exs__now_ns() + 20000000000ull;
    int ret;

    while ((ret = post(r->e, id, flags)) == -ENOMEM && exs__now_ns() < until)
        sched_yield();
    return ret;
}

static int fk_recv3(struct fk_env *e, uint64_t id, unsigned flags)
{
    (void)flags;
    return fk_recv(e, id);
}

static void *fk_poster(void *arg)
{
    struct fk_race *r = arg;

    for (uint64_t i = 0; i < FK_RACE_N && !r->fail; i++) {
        /* every 4th pair of sends goes as one batch: a made completion before the second */
        unsigned defer = (i % 8) < 2 ? EXS_PROV_SEND_DEFER : 0;

        if (fk_retry(r, fk_recv3, (1ull << 32) | i, 0) ||
            fk_retry(r, fk_send, (2ull << 32) | i, EXS_PROV_SEND_SIGNALED | defer)) {
            r->fail = "post refused (no room for 20 s)";
            break;
        }
        if ((i % 8) == 1)
            exs__vrb_ep_flush(&r->e->ep->base);
    }
    __atomic_store_n(&r->poster_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The progress thread's other caller: ctx_arm keeps what it finds, retiring when returned. */
static void *fk_armer(void *arg)
{
    struct fk_race *r = arg;

    while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE))
        if (exs__prov_verbs_ops.ctx_arm(&r->e->ctx->base) == 0)
            sched_yield();
    return NULL;
}

START_TEST(wc_posters_race_consumer)
{
    struct fk_env e;
    struct fk_race r = {.e = &e};
    pthread_t tp, ta;
    uint64_t next[2] = {0, 0}, until = exs__now_ns() + 60000000000ull;
    struct exs_prov_cqe c[8];

    fk_open(&e);
    ck_assert_int_eq(pthread_create(&tp, NULL, fk_poster, &r), 0);
    ck_assert_int_eq(pthread_create(&ta, NULL, fk_armer, &r), 0);
    while ((next[0] < FK_RACE_N || next[1] < FK_RACE_N) && exs__now_ns() < until) {
        int n = exs__prov_verbs_ops.ctx_poll(&e.ctx->base, c, 8);

        for (int i = 0; i < n; i++) {
            int q = (int)(c[i].wr_id >> 32) - 1;

            ck_assert_int_eq(c[i].status, EXS_PROV_WC_SUCCESS);
            ck_assert_msg(q == 0 || q == 1, "wr_id %llx", (unsigned long long)c[i].wr_id);
            /* each queue's completions once each, in order */
            ck_assert_uint_eq(c[i].wr_id & 0xffffffffu, next[q]);
            next[q]++;
        }
        if (!n)
            sched_yield();
    }
    __atomic_store_n(&r.done, 1, __ATOMIC_RELEASE);
    pthread_join(tp, NULL);
    pthread_join(ta, NULL);
    ck_assert_msg(!r.fail, "%s", r.fail ? r.fail : "");
    ck_assert_uint_eq(next[0], FK_RACE_N);
    ck_assert_uint_eq(next[1], FK_RACE_N);
    ck_assert_uint_eq(e.ctx->cnt.stale_cqes, 0);
    ck_assert_uint_eq(e.ep->rq_head, FK_RACE_N);
    ck_assert_uint_eq(e.ep->sq_head, FK_RACE_N);
    fk_close(&e);
}
END_TEST

/* Which device calls run with cancellation off (spec/threading.md, "Thread cancellation"):
 * the ones that enter the kernel. rxe's post_send and req_notify_cq write() a command (off);
 * its post_recv only writes the user-mapped queue (left on: two atomic updates of the
 * cancel word fewer per receive re-posted); siw's and an unknown software device's
 * post_recv may write() (off); a hardware device's calls do not (on). */
START_TEST(wc_cancel_off_where_kernel)
{
    static const struct {
        const char *name;
        int soft, send_off, recv_off;
    } dev[] = {{"rxe0", 1, 1, 0},     {"rxe_eth0", 0, 1, 0}, {"siw0", 1, 1, 1},
               {"roce_sw0", 1, 1, 1}, {"mlx5_0", 0, 0, 0},   {NULL, 0, 0, 0}};
    struct fk_env e;

    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
        int want_send = dev[i].send_off ? PTHREAD_CANCEL_DISABLE : PTHREAD_CANCEL_ENABLE;
        int want_recv = dev[i].recv_off ? PTHREAD_CANCEL_DISABLE : PTHREAD_CANCEL_ENABLE;

        fk_open(&e);
        e.ctx->post_kernel = exs__vrb_post_kernel_of(dev[i].name, dev[i].soft);
        fk.send_cs = fk.recv_cs = fk.notify_cs = -1;
        ck_assert_int_eq(fk_recv(&e, 100), 0);
        ck_assert_int_eq(fk_send(&e, 200, EXS_PROV_SEND_SIGNALED), 0);
        ck_assert_int_eq(vrb_req_notify_cq(e.ctx, &e.cq), 0);
        ck_assert_msg(fk.send_cs == want_send && fk.notify_cs == want_send &&
                          fk.recv_cs == want_recv,
                      "%s: post_send %d, req_notify %d, post_recv %d", dev[i].name, fk.send_cs,
                      fk.notify_cs, fk.recv_cs);
        /* the caller's own state is back as it was */
        ck_assert_int_eq(fk_cancel_state(), PTHREAD_CANCEL_ENABLE);
        fk_close(&e);
    }
}
END_TEST

/* The engine's round is one call into verbs (ctx_progress_poll; verbs has no progress of
 * its own): it answers 0 and hands what ctx_poll would, oldest first, at most max; an
 * empty one is one poll of the CQ. */
START_TEST(wc_progress_poll_is_the_poll)
{
    struct fk_env e;
    struct exs_prov_cqe c[4];
    int n = -1;

    fk_open(&e);
    ck_assert_ptr_nonnull(exs__prov_verbs_ops.ctx_progress_poll);
    ck_assert_int_eq(exs__prov_progress_poll(&e.ctx->base, c, 4, &n), 0);
    ck_assert_int_eq(n, 0);
    ck_assert_uint_eq(fk.polls, 1);
    for (uint64_t i = 0; i < 3; i++)
        ck_assert_int_eq(fk_recv(&e, 100 + i), 0);
    ck_assert_int_eq(exs__prov_progress_poll(&e.ctx->base, c, 2, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(c[0].wr_id, 100);
    ck_assert_uint_eq(c[1].wr_id, 101);
    ck_assert_int_eq(exs__prov_progress_poll(&e.ctx->base, c, 4, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_uint_eq(c[0].wr_id, 102);
    ck_assert_int_eq(c[0].status, EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(exs__prov_progress_poll(&e.ctx->base, c, 4, &n), 0);
    ck_assert_int_eq(n, 0);
    fk_close(&e);
}
END_TEST

/* exs__prov_cm_poll reads the context's count of queued cm events (cm_queued) and calls
 * ctx_cm_poll only when it is not 0 (a count of 0 answers 0, whatever is queued): a
 * queued event is still found, in order, and the count follows the queue. */
START_TEST(wc_cm_queued_follows_events)
{
    struct fk_env e;
    struct exs_prov_cm_event ev = {0}, got;
    static const uint32_t zero;

    fk_open(&e);
    ck_assert_ptr_eq(e.ctx->base.cm_queued, &e.ctx->cm_sw_n);
    ck_assert_int_eq(exs__prov_cm_poll(&e.ctx->base, &got), 0);
    ev.type = EXS_PROV_CM_ESTABLISHED;
    ev.ep = &e.ep->base;
    exs__lite_lock_st(&e.ctx->lock);
    exs__vrb_cm_push_locked(e.ctx, &ev);
    ev.type = EXS_PROV_CM_DISCONNECTED;
    exs__vrb_cm_push_locked(e.ctx, &ev);
    exs__lite_unlock_st(&e.ctx->lock);
    ck_assert_uint_eq(*e.ctx->base.cm_queued, 2);
    /* the wrapper trusts the count: a count of 0 is not looked behind (no call) */
    e.ctx->base.cm_queued = &zero;
    ck_assert_int_eq(exs__prov_cm_poll(&e.ctx->base, &got), 0);
    e.ctx->base.cm_queued = &e.ctx->cm_sw_n;
    ck_assert_int_eq(exs__prov_cm_poll(&e.ctx->base, &got), 1);
    ck_assert_int_eq(got.type, EXS_PROV_CM_ESTABLISHED);
    ck_assert_uint_eq(*e.ctx->base.cm_queued, 1);
    ck_assert_int_eq(exs__prov_cm_poll(&e.ctx->base, &got), 1);
    ck_assert_int_eq(got.type, EXS_PROV_CM_DISCONNECTED);
    ck_assert_ptr_eq(got.ep, &e.ep->base);
    ck_assert_uint_eq(*e.ctx->base.cm_queued, 0);
    ck_assert_int_eq(exs__prov_cm_poll(&e.ctx->base, &got), 0);
    fk_close(&e);
}
END_TEST

TCase *prov_vrb_wc_tcase(void)
{
    TCase *tc = tcase_create("wc");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, wc_stale_and_foreign_dropped);
    tcase_add_test(tc, wc_success_path_takes_no_ep_lock);
    tcase_add_test(tc, wc_early_and_error_completions_locked);
    tcase_add_test(tc, wc_batch_made_completion_in_order);
    tcase_add_test(tc, wc_ring_depth_not_pow2);
    tcase_add_test(tc, wc_posters_race_consumer);
    tcase_add_test(tc, wc_cancel_off_where_kernel);
    tcase_add_test(tc, wc_progress_poll_is_the_poll);
    tcase_add_test(tc, wc_cm_queued_follows_events);
    return tc;
}

#endif
