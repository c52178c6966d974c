/* SPDX-License-Identifier: MIT */
/* The protocol test driver: polls the mock ctxs and dispatches to the conns as the engine does. */
#include <check.h>
#include <endian.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "exs/util/membudget.h"

#define PT_MAX_STEPS 1000000L

static struct pt_side *pt_side_of(struct exs_conn *conn)
{
    return conn->owner;
}

void pt_on_established(struct exs_conn *conn, int err)
{
    struct pt_side *s = pt_side_of(conn);

    s->established++;
    s->est_err = err;
}

void pt_on_dead(struct exs_conn *conn)
{
    pt_side_of(conn)->dead++;
}

static const struct exs_conn_cb pt_cb = {
    .established = pt_on_established,
    .dead = pt_on_dead,
};

void pt_params(struct exs_conn_params *p, int sock_type)
{
    *p = (struct exs_conn_params){
        .sock_type = sock_type,
        .credits = 8,
        .ring_size = 4096,
        .eager_max = 1024,
        .xfer_mode = EXS_XFER_DYNAMIC,
        .max_reads = 4,
        .batch_max = 8192,
    };
}

void pt_params_resumable(struct pt_pair *pp, int sock_type, int shm)
{
    pt_params(&pp->pa, sock_type);
    pt_params(&pp->pb, sock_type);
    pp->pa.resumable = pp->pb.resumable = 1;
    pp->pa.shm = pp->pb.shm = shm;
}

void pt_open(struct pt_pair *pp, int sock_type)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};

    mock_set_tap(NULL, NULL); /* a failed test may have left one */
    if (!pp->pa.sock_type)
        pt_params(&pp->pa, sock_type);
    if (!pp->pb.sock_type)
        pt_params(&pp->pb, sock_type);
    ck_assert_int_eq(mock_ctx_open(NULL, &pp->a.ctx), 0);
    ck_assert_int_eq(mock_ctx_open(NULL, &pp->b.ctx), 0);
    ck_assert_int_eq(
        exs__prov_listen(pp->b.ctx, (struct sockaddr *)&sin, sizeof(sin), 16, pp, &pp->lis), 0);
}

/* The passive side's request handling, as exs/api/sock.c does it. */
static void pt_on_request(struct pt_pair *pp, const struct exs_prov_cm_event *ev)
{
    int reason = exs__conn_hello_check(ev->private_data, ev->private_data_len, pp->pb.sock_type);

    if (!reason && pp->b.conn)
        reason = EXS_WIRE_REJ_BACKLOG; /* one connection per pair */
    if (!reason && exs__conn_create(pp->b.ctx, &pp->pb, &pt_cb, &pp->b, &pp->b.conn))
        reason = EXS_WIRE_REJ_RESOURCES;
    if (!reason && exs__conn_accept(pp->b.conn, ev->req, ev->private_data)) {
        /* nothing was connected: the conn is IDLE and goes at once */
        exs__conn_destroy(pp->b.conn);
        pp->b.conn = NULL;
        return;
    }
    if (reason) {
        struct exs_wire_reject rej = {
            .magic = htobe16(EXS_WIRE_MAGIC), .version = EXS_WIRE_VERSION, .reason = reason};
        pp->reject_reason = reason;
        ck_assert_int_eq(exs__prov_reject(ev->req, &rej, sizeof(rej)), 0);
    }
}

static int pt_drain_cq(struct exs_prov_ctx *ctx)
{
    struct exs_prov_cqe cqe[16];
    int n, total = 0;

    /* as the engine polls, a batch at a time, handed to the conns together */
    while ((n = exs__prov_poll(ctx, cqe, 16)) > 0) {
        exs__conn_on_cqes(cqe, n);
        total += n;
    }
    return total;
}

/* eng_drain of exs/engine/engine.c: completions first, and again before each cm event. */
static int pt_drain(struct pt_pair *pp, struct exs_prov_ctx *ctx)
{
    struct exs_prov_cm_event ev;
    int n = pt_drain_cq(ctx);

    while (exs__prov_cm_poll(ctx, &ev) == 1) {
        n += pt_drain_cq(ctx) + 1;
        if (ev.type == EXS_PROV_CM_CONNECT_REQUEST)
            pt_on_request(pp, &ev);
        else if (ev.ep && ev.ep->user)
            exs__conn_on_cm(ev.ep->user, &ev);
    }
    return n;
}

int pt_dispatch_ctx(struct pt_pair *pp, struct exs_prov_ctx *ctx)
{
    return pt_drain(pp, ctx);
}

int pt_dispatch(struct pt_pair *pp)
{
    int n = 0, m;

    do {
        m = pt_drain(pp, pp->a.ctx) + pt_drain(pp, pp->b.ctx);
        n += m;
    } while (m);
    return n;
}

long pt_run(struct pt_pair *pp)
{
    long steps = 0;

    for (;;) {
        pt_dispatch(pp);
        if (!mock_step())
            break;
        ck_assert_msg(++steps < PT_MAX_STEPS, "the fabric never went idle");
    }
    return steps;
}

void pt_connect_to(struct pt_pair *pp, const struct sockaddr *addr, socklen_t len)
{
    struct sockaddr_storage ss;

    if (!addr) {
        ck_assert_int_eq(exs__prov_listener_addr(pp->lis, &ss, &len), 0);
        addr = (struct sockaddr *)&ss;
    }
    ck_assert_int_eq(exs__conn_create(pp->a.ctx, &pp->pa, &pt_cb, &pp->a, &pp->a.conn), 0);
    ck_assert_int_eq(exs__conn_connect(pp->a.conn, addr, len), 0);
}

void pt_connect(struct pt_pair *pp)
{
    pt_connect_to(pp, NULL, 0);
    pt_run(pp);
    ck_assert_int_eq(pp->a.established, 1);
    ck_assert_int_eq(pp->a.est_err, 0);
    ck_assert_ptr_nonnull(pp->b.conn);
    ck_assert_int_eq(pp->b.established, 1);
    ck_assert_int_eq(pp->b.est_err, 0);
}

void pt_close(struct pt_pair *pp)
{
    struct pt_side *s[2] = {&pp->a, &pp->b};

    for (int i = 0; i < 2; i++) {
        if (s[i]->conn) {
            exs__conn_destroy(s[i]->conn);
            s[i]->conn = NULL;
        }
    }
    if (pp->lis)
        exs__prov_listener_destroy(pp->lis);
    pp->lis = NULL;
    for (int i = 0; i < 2; i++) {
        exs__prov_ctx_close(s[i]->ctx);
        s[i]->ctx = NULL;
    }
    ck_assert_int_eq(exs__conn_live_count(), 0);
    /* every byte charged to the memory account went back with the last conn (§9.3) */
    ck_assert_uint_eq(exs__mem_used(), 0);
    ck_assert_uint_eq(mock_violations(), 0);
}

void pt_close_both(struct pt_pair *pp)
{
    if (pp->a.conn)
        exs__conn_close(pp->a.conn);
    if (pp->b.conn)
        exs__conn_close(pp->b.conn);
    pt_run(pp);
    ck_assert_int_eq(pp->a.dead, 1);
    ck_assert_int_eq(pp->b.dead, 1);
    ck_assert_uint_eq(pt_rnr(pp), 0);
    pt_close(pp);
    mock_set_reorder(0);
}

void pt_send_pattern(struct pt_op *o, struct pt_side *side, void *buf, size_t len, uint64_t off)
{
    pt_fill(buf, len, off);
    pt_op_init(o, side, EXS_OP_SEND, buf, len, 0);
    ck_assert_int_eq(pt_post(o), 0);
}

static void pt_op_done(struct exs_op *op)
{
    struct pt_op *o = exs_container_of(op, struct pt_op, op);

    o->done++;
    o->order = ++o->side->delivered;
}

void pt_op_init(struct pt_op *o, struct pt_side *side, enum exs_op_kind kind, void *buf, size_t len,
                int flags)
{
    memset(o, 0, sizeof(*o));
    o->side = side;
    o->op.kind = kind;
    o->op.buf = buf;
    o->op.len = len;
    o->op.flags = flags;
    o->op.done = pt_op_done;
    o->op.owner = o;
    if (len) {
        /* as exs_mregister: local access only; the protocol grants the peer what it needs */
        ck_assert_int_eq(exs__prov_mr_reg(side->ctx, buf, len, EXS_PROV_ACCESS_LOCAL_WRITE, &o->mr),
                         0);
        o->op.mr = o->mr;
        o->op.lkey = o->mr->lkey;
    }
}

int pt_post(struct pt_op *o)
{
    return exs__conn_post(o->side->conn, &o->op);
}

void pt_op_fini(struct pt_op *o)
{
    if (o->mr)
        exs__prov_mr_dereg(o->mr);
    o->mr = NULL;
}

static uint8_t pt_byte(uint64_t off)
{
    uint64_t x = off * 0x9e3779b97f4a7c15ull;

    return (uint8_t)(x >> 56 ^ off);
}

void pt_fill(void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;

    for (size_t i = 0; i < len; i++)
        p[i] = pt_byte(off + i);
}

int pt_check(const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;

    for (size_t i = 0; i < len; i++)
        if (p[i] != pt_byte(off + i))
            return 0;
    return 1;
}

void pt_assert_pairs_done(struct pt_op *s, struct pt_op *r, int n, const uint8_t *rb, size_t len)
{
    for (int i = 0; i < n; i++) {
        pt_assert_done(&s[i], (ssize_t)len, 0);
        pt_assert_done(&r[i], (ssize_t)len, 0);
        ck_assert(pt_check(rb + (size_t)i * len, len, (uint64_t)i * len));
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
}

uint64_t pt_rnr(struct pt_pair *pp)
{
    struct mock_stats a, b;

    mock_stats(pp->a.ctx, &a);
    mock_stats(pp->b.ctx, &b);
    return a.rnr + b.rnr;
}

void pt_recv_post(struct pt_op *o, struct pt_side *side, void *buf, size_t len, int flags)
{
    memset(buf, 0, len);
    pt_op_init(o, side, EXS_OP_RECV, buf, len, flags);
    ck_assert_int_eq(pt_post(o), 0);
}

void pt_stats(struct pt_side *side, struct exs_sock_stats *st)
{
    exs__conn_stats(side->conn, st);
}

/* ---- the fallback of a cut-over (spec/protocol.md §9.2) ---- */

struct pt_fb pt_fb;

static int pt_fb_resume_addr(struct exs_conn *conn, struct exs_prov_ctx **ctx_p,
                             struct sockaddr_storage *addr, socklen_t *len_p)
{
    (void)conn;
    *ctx_p = pt_fb.ctx[0];
    *len_p = sizeof(*addr);
    return exs__prov_listener_addr(pt_fb.lis, addr, len_p);
}

/* As exs/api/xfer.c: the op's buffer registered on the new path's ctx, the old
 * registration released (the pt_op keeps the new one for pt_op_fini). */
static int pt_fb_resume_mr(struct exs_conn *conn, struct exs_op *op, struct exs_prov_ctx *ctx)
{
    struct pt_op *o = exs_container_of(op, struct pt_op, op);
    struct exs_prov_mr *mr;
    int ret;

    (void)conn;
    if (!op->len)
        return 0;
    ret = exs__prov_mr_reg(ctx, op->buf, op->len, EXS_PROV_ACCESS_LOCAL_WRITE, &mr);
    if (ret)
        return ret;
    if (o->mr)
        exs__prov_mr_dereg(o->mr);
    o->mr = op->mr = mr;
    op->lkey = mr->lkey;
    return 0;
}

const struct exs_conn_cb pt_fb_cb = {
    .established = pt_on_established,
    .dead = pt_on_dead,
    .resume_addr = pt_fb_resume_addr,
    .resume_mr = pt_fb_resume_mr,
};

void pt_fb_open(struct pt_pair *pp)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};

    pt_fb.on_request = NULL;
    pt_fb.sock_type = pp->pb.sock_type;
    ck_assert_int_eq(mock_ctx_open(NULL, &pt_fb.ctx[0]), 0);
    ck_assert_int_eq(mock_ctx_open(NULL, &pt_fb.ctx[1]), 0);
    ck_assert_int_eq(
        exs__prov_listen(pt_fb.ctx[1], (struct sockaddr *)&sin, sizeof(sin), 16, pp, &pt_fb.lis),
        0);
    pp->a.conn->cb = &pt_fb_cb;
    pp->b.conn->cb = &pt_fb_cb;
}

/* A resume request, as exs/api/sock.c hands it (sock_on_request, sock_resume_request). */
static void pt_fb_request(const struct exs_prov_cm_event *ev)
{
    int reason;

    if (pt_fb.on_request && pt_fb.on_request(ev))
        return;
    reason = exs__conn_hello_check(ev->private_data, ev->private_data_len, pt_fb.sock_type);
    if (!reason)
        reason = exs__conn_resume_request(pt_fb.ctx[1], ev->req, ev->private_data,
                                          ev->private_data_len, pt_fb.sock_type);
    if (reason) {
        struct exs_wire_reject rej = {.magic = htobe16(EXS_WIRE_MAGIC),
                                      .version = EXS_WIRE_VERSION,
                                      .reason = (uint8_t)reason};

        ck_assert_int_eq(exs__prov_reject(ev->req, &rej, sizeof(rej)), 0);
    }
}

int pt_fb_drain(int i)
{
    struct exs_prov_cm_event ev;
    int total = pt_drain_cq(pt_fb.ctx[i]);

    while (exs__prov_cm_poll(pt_fb.ctx[i], &ev) == 1) {
        total += pt_drain_cq(pt_fb.ctx[i]) + 1;
        if (ev.type == EXS_PROV_CM_CONNECT_REQUEST)
            pt_fb_request(&ev);
        else if (ev.ep && ev.ep->user)
            exs__conn_on_cm(ev.ep->user, &ev);
    }
    return total;
}

void pt_fb_run(struct pt_pair *pp)
{
    for (long steps = 0;; steps++) {
        int m;

        do
            m = pt_dispatch(pp) + pt_fb_drain(0) + pt_fb_drain(1);
        while (m);
        if (!mock_step())
            break;
        ck_assert_msg(steps < PT_MAX_STEPS, "the fabric never went idle");
    }
}

void pt_fb_close(void)
{
    if (pt_fb.lis)
        exs__prov_listener_destroy(pt_fb.lis);
    pt_fb.lis = NULL;
    for (int i = 0; i < 2; i++) {
        if (pt_fb.ctx[i])
            exs__prov_ctx_close(pt_fb.ctx[i]);
        pt_fb.ctx[i] = NULL;
    }
}

void pt_pv_clear(struct exs_conn *conn)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    memset(&conn->pv, 0, sizeof(conn->pv));
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}
