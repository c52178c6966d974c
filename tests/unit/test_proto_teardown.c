/* SPDX-License-Identifier: MIT */
/* Protocol teardown unit tests over the mock provider: close, abort, resets, errors, refusals. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/util/log.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

/* Loop tests run with completions in order (_i 0) and reordered (seeds). */
static void td_begin(int i, int sock_type)
{
    unit_env_clean();
    exs__log_level = EXS_LOG_ERR; /* the failures below are expected: keep the output clean */
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(i ? (uint32_t)i * 7919u : 0);
    pt_open(&pp, sock_type);
}

/* Both conns must be DEAD (or gone): destroy everything, check for leaks. */
static void td_end(void)
{
    pt_run(&pp);
    if (pp.a.conn)
        ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DEAD);
    if (pp.b.conn)
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DEAD);
    ck_assert_uint_eq(pt_rnr(&pp), 0);
    pt_close(&pp);
    mock_set_reorder(0);
}

static void op_post(struct pt_op *o, struct pt_side *s, enum exs_op_kind k, uint8_t *buf,
                    size_t len, uint64_t off)
{
    if (k == EXS_OP_SEND)
        pt_fill(buf, len, off);
    else if (len)
        memset(buf, 0, len);
    pt_op_init(o, s, k, buf, len, 0);
    ck_assert_int_eq(pt_post(o), 0);
}

/* Orderly close, one side first (order 0: active first; 1: passive first): the closer's
 * outstanding receive is cancelled, the other side reads end of stream after the data,
 * its sends afterwards fail with EPIPE, and both conns die exactly once. */
static void close_in_order(int first_b, int seed, int sock_type)
{
    static uint8_t sb[500], rb[1000], rc[1000], rd[1000], late[10];
    struct pt_side *c = first_b ? &pp.b : &pp.a, *o = first_b ? &pp.a : &pp.b;
    struct pt_op s, r, cr, eof, l;

    td_begin(seed, sock_type);
    pt_connect(&pp);
    op_post(&s, c, EXS_OP_SEND, sb, sizeof(sb), 5);
    op_post(&r, o, EXS_OP_RECV, rb, sizeof(rb), 0);
    op_post(&cr, c, EXS_OP_RECV, rc, sizeof(rc), 0); /* never satisfied */
    pt_run(&pp);
    pt_assert_done(&s, 500, 0);
    pt_assert_done(&r, 500, 0);
    ck_assert(pt_check(rb, 500, 5));
    exs__conn_close(c->conn);
    pt_op_init(&l, c, EXS_OP_SEND, late, sizeof(late), 0);
    ck_assert_int_eq(pt_post(&l), -EBADF); /* the closer takes nothing more */
    pt_op_fini(&l);
    /* SEQPACKET: nothing of the small receive was on the wire, so it goes at once;
     * STREAM advertised it, so it goes once the disconnect took the ADVERT's buffer back */
    if (sock_type == SOCK_SEQPACKET)
        pt_assert_done(&cr, -1, ECANCELED);
    pt_run(&pp);
    pt_assert_done(&cr, -1, ECANCELED);
    op_post(&eof, o, EXS_OP_RECV, rd, sizeof(rd), 0);
    pt_run(&pp);
    pt_assert_done(&eof, 0, 0);
    pt_op_init(&l, o, EXS_OP_SEND, late, sizeof(late), 0);
    ck_assert_int_eq(pt_post(&l), 0);
    pt_run(&pp);
    pt_assert_done(&l, -1, EPIPE);
    ck_assert_int_eq(c->dead, 1);
    ck_assert_int_eq(o->dead, 1);
    exs__conn_close(o->conn);
    pt_run(&pp);
    ck_assert_int_eq(c->dead, 1);
    ck_assert_int_eq(o->dead, 1);
    pt_op_fini(&s);
    pt_op_fini(&r);
    pt_op_fini(&cr);
    pt_op_fini(&eof);
    pt_op_fini(&l);
    td_end();
}

START_TEST(td_close_active_first)
{
    close_in_order(0, _i, SOCK_SEQPACKET);
    close_in_order(0, _i, SOCK_STREAM);
}
END_TEST

START_TEST(td_close_passive_first)
{
    close_in_order(1, _i, SOCK_SEQPACKET);
    close_in_order(1, _i, SOCK_STREAM);
}
END_TEST

START_TEST(td_close_both_at_once)
{
    td_begin(_i, SOCK_STREAM);
    pt_connect(&pp);
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    td_end();
}
END_TEST

/* Abort: no SHUTDOWN, the peer's receives fail with ECONNRESET. */
START_TEST(td_abort)
{
    static uint8_t rb[100], ra[100];
    struct pt_op r, ar;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    op_post(&ar, &pp.a, EXS_OP_RECV, ra, sizeof(ra), 0);
    pt_run(&pp);
    exs__conn_abort(pp.a.conn);
    pt_run(&pp);
    pt_assert_done(&r, -1, ECONNRESET);
    pt_assert_done(&ar, -1, ECONNRESET);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    pt_op_fini(&r);
    pt_op_fini(&ar);
    td_end();
}
END_TEST

/* The link dies while a SEQPACKET message waits to be read and a STREAM send is half
 * in the ring: sends fail with ECONNRESET; what arrived eagerly is still delivered,
 * then ECONNRESET. */
START_TEST(td_peer_drop_mid_transfer_seqpacket)
{
    static uint8_t small[300], big[8000], r1[400], r2[8000];
    struct pt_op s1, s2, rr1, rr2;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&s1, &pp.a, EXS_OP_SEND, small, sizeof(small), 1); /* eager */
    op_post(&s2, &pp.a, EXS_OP_SEND, big, sizeof(big), 2);     /* announced */
    pt_run(&pp);
    pt_assert_done(&s1, 300, 0);
    ck_assert_int_eq(s2.done, 0);
    mock_drop(pp.a.conn->ep);
    pt_run(&pp);
    pt_assert_done(&s2, -1, ECONNRESET);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    op_post(&rr1, &pp.b, EXS_OP_RECV, r1, sizeof(r1), 0);
    op_post(&rr2, &pp.b, EXS_OP_RECV, r2, sizeof(r2), 0);
    pt_run(&pp);
    pt_assert_done(&rr1, 300, 0);
    ck_assert(pt_check(r1, 300, 1));
    pt_assert_done(&rr2, -1, ECONNRESET);
    pt_op_fini(&s1);
    pt_op_fini(&s2);
    pt_op_fini(&rr1);
    pt_op_fini(&rr2);
    td_end();
}
END_TEST

START_TEST(td_peer_drop_mid_transfer_stream)
{
    static uint8_t big[10000], rb[10000], rb2[100];
    struct pt_op s, r, r2;

    td_begin(_i, SOCK_STREAM);
    pt_connect(&pp);
    op_post(&s, &pp.a, EXS_OP_SEND, big, sizeof(big), 3);
    pt_run(&pp); /* the ring (4096) is full, the rest waits */
    ck_assert_int_eq(s.done, 0);
    mock_drop(pp.b.conn->ep);
    pt_run(&pp);
    pt_assert_done(&s, -1, ECONNRESET);
    op_post(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    op_post(&r2, &pp.b, EXS_OP_RECV, rb2, sizeof(rb2), 0);
    pt_run(&pp);
    pt_assert_done(&r, 4096, 0); /* the ring's bytes, then the error */
    ck_assert(pt_check(rb, 4096, 3));
    pt_assert_done(&r2, -1, ECONNRESET);
    pt_op_fini(&s);
    pt_op_fini(&r);
    pt_op_fini(&r2);
    td_end();
}
END_TEST

/* A work request fails (the peer refused the key): the connection resets, every
 * outstanding operation on both sides fails with ECONNRESET, nothing hangs. */
START_TEST(td_error_completion_mid_transfer)
{
    static uint8_t sb[3][2000], rb[3][2000];
    struct pt_op s[3], r[3];

    td_begin(_i, SOCK_STREAM);
    pt_connect(&pp);
    op_post(&s[0], &pp.a, EXS_OP_SEND, sb[0], 2000, 0);
    op_post(&r[0], &pp.b, EXS_OP_RECV, rb[0], 2000, 0);
    pt_run(&pp);
    pt_assert_done(&s[0], 2000, 0);
    pt_assert_done(&r[0], 2000, 0);
    ck_assert(pt_check(rb[0], 2000, 0));
    op_post(&r[1], &pp.b, EXS_OP_RECV, rb[1], 2000, 0);
    mock_inject_wr_error(pp.a.conn->ep, 1, EXS_PROV_WC_REM_ACCESS_ERR);
    op_post(&s[1], &pp.a, EXS_OP_SEND, sb[1], 2000, 2000);
    op_post(&s[2], &pp.a, EXS_OP_SEND, sb[2], 2000, 4000);
    op_post(&r[2], &pp.a, EXS_OP_RECV, rb[2], 2000, 0);
    pt_run(&pp);
    pt_assert_done(&s[1], -1, ECONNRESET);
    pt_assert_done(&s[2], -1, ECONNRESET);
    pt_assert_done(&r[1], -1, ECONNRESET);
    pt_assert_done(&r[2], -1, ECONNRESET);
    for (size_t j = 0; j < 2000; j++)
        ck_assert_uint_eq(rb[1][j], 0);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    for (int i = 0; i < 3; i++) {
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    td_end();
}
END_TEST

/* exs_close with an announced send still waiting to be read: it completes with
 * ECANCELED once the disconnect released its buffer, never before. */
START_TEST(td_close_with_send_on_the_wire)
{
    static uint8_t big[8000];
    struct pt_op s;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&s, &pp.a, EXS_OP_SEND, big, sizeof(big), 0);
    pt_run(&pp);
    exs__conn_close(pp.a.conn);
    ck_assert_int_eq(s.done, 0); /* the peer may still read it */
    pt_run(&pp);
    pt_assert_done(&s, -1, ECANCELED);
    exs__conn_close(pp.b.conn);
    pt_op_fini(&s);
    td_end();
}
END_TEST

static int match_all(struct exs_op *op, void *arg)
{
    (void)op;
    (void)arg;
    return 1;
}

/* Cancel: a queued receive goes at once; an advertised one cannot be taken back. */
START_TEST(td_cancel)
{
    static uint8_t rb[2][8000], sb[8000];
    struct pt_op r[2], s;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&r[0], &pp.b, EXS_OP_RECV, rb[0], sizeof(rb[0]), 0);
    pt_run(&pp); /* advertised */
    ck_assert_int_eq(exs__conn_cancel(pp.b.conn, match_all, NULL), 0);
    ck_assert_int_eq(r[0].done, 0);
    op_post(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 9);
    pt_run(&pp);
    pt_assert_done(&r[0], 8000, 0);
    ck_assert(pt_check(rb[0], 8000, 9));
    op_post(&r[1], &pp.b, EXS_OP_RECV, rb[1], 100, 0); /* small: not advertised */
    ck_assert_int_eq(exs__conn_cancel(pp.b.conn, match_all, NULL), 1);
    pt_assert_done(&r[1], -1, ECANCELED);
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_op_fini(&s);
    pt_op_fini(&r[0]);
    pt_op_fini(&r[1]);
    td_end();
}
END_TEST

/* No listener: the connect fails with ECONNREFUSED and the conn dies. */
START_TEST(td_connect_unreachable)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(1)};

    td_begin(_i, SOCK_STREAM);
    ck_assert_int_eq(
        exs__conn_create(pp.a.ctx, &pp.pa, &(struct exs_conn_cb){0}, &pp.a, &pp.a.conn), 0);
    exs__conn_destroy(pp.a.conn);
    pp.a.conn = NULL;
    pt_connect_to(&pp, (struct sockaddr *)&sin, sizeof(sin));
    pt_run(&pp);
    ck_assert_int_eq(pp.a.established, 1);
    ck_assert_int_eq(pp.a.est_err, ECONNREFUSED);
    td_end();
}
END_TEST

/* Socket type mismatch: the passive side rejects (reason 2), the active side hears
 * ECONNREFUSED. */
START_TEST(td_connect_rejected)
{
    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    pt_params(&pp.pa, SOCK_STREAM);
    pt_params(&pp.pb, SOCK_SEQPACKET);
    pt_open(&pp, SOCK_STREAM);
    pt_connect_to(&pp, NULL, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.reject_reason, EXS_WIRE_REJ_SOCK_TYPE);
    ck_assert_int_eq(pp.a.established, 1);
    ck_assert_int_eq(pp.a.est_err, ECONNREFUSED);
    ck_assert_ptr_null(pp.b.conn);
    td_end();
}
END_TEST

/* The passive side cannot create its endpoint: rejected with reason 4. */
START_TEST(td_accept_no_resources)
{
    td_begin(0, SOCK_SEQPACKET);
    mock_fail(pp.b.ctx, MOCK_FAIL_EP_CREATE, 1, -ENOBUFS);
    pt_connect_to(&pp, NULL, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.reject_reason, EXS_WIRE_REJ_RESOURCES);
    ck_assert_int_eq(pp.a.est_err, ECONNREFUSED);
    td_end();
}
END_TEST

/* Close while the connect is in flight: the conn dies, nothing is established. */
START_TEST(td_close_while_connecting)
{
    static uint8_t b[8];
    struct pt_op o;

    td_begin(_i, SOCK_STREAM);
    pt_connect_to(&pp, NULL, 0);
    pt_op_init(&o, &pp.a, EXS_OP_SEND, b, sizeof(b), 0);
    ck_assert_int_eq(pt_post(&o), -ENOTCONN); /* not yet */
    pt_op_fini(&o);
    exs__conn_close(pp.a.conn);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead + pp.a.established, 1);
    if (pp.a.established)
        ck_assert_int_ne(pp.a.est_err, 0);
    if (pp.b.conn) {
        exs__conn_close(pp.b.conn);
        pt_run(&pp);
    }
    td_end();
}
END_TEST

/* Every resource a conn needs can fail: the error comes back, nothing leaks. */
START_TEST(td_create_failures)
{
    static const enum mock_fail_op ops[] = {MOCK_FAIL_MEM_ALLOC, MOCK_FAIL_MEM_ALLOC,
                                            MOCK_FAIL_EP_CREATE};
    static const uint32_t nth[] = {1, 2, 1};
    struct exs_conn *c = NULL;

    td_begin(0, SOCK_STREAM);
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        mock_fail(pp.a.ctx, ops[i], nth[i], -ENOMEM);
        ck_assert_int_eq(exs__conn_create(pp.a.ctx, &pp.pa, &(struct exs_conn_cb){0}, &pp.a, &c),
                         -ENOMEM);
        ck_assert_ptr_null(c);
        ck_assert_int_eq(exs__conn_live_count(), 0);
    }
    td_end();
}
END_TEST

/* The completion queue serves only the conns it can hold: one more is refused with
 * ENOBUFS before anything is posted, and nothing leaks. */
START_TEST(td_cq_full_refuses_conn)
{
    struct exs_prov_attr attr = {.cq_size = 200};
    struct exs_conn_params p;
    struct exs_prov_ctx *ctx;
    struct exs_conn *c[8];
    struct mock_stats st;
    int n = 0, ret;

    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    pt_params(&p, SOCK_STREAM);
    ck_assert_int_eq(mock_ctx_open(&attr, &ctx), 0);
    while ((ret = exs__conn_create(ctx, &p, &(struct exs_conn_cb){0}, NULL, &c[n])) == 0)
        ck_assert_int_lt(++n, 8);
    ck_assert_int_eq(ret, -ENOBUFS);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(exs__conn_live_count(), n);
    mock_stats(ctx, &st);
    ck_assert_uint_le(st.cq_max, 200);
    while (n)
        exs__conn_destroy(c[--n]);
    exs__prov_ctx_close(ctx);
    ck_assert_int_eq(exs__conn_live_count(), 0);
    ck_assert_uint_eq(mock_violations(), 0);
}
END_TEST

/* The ring grant fails as the connection is established: that side resets, both
 * conns die, nothing leaks. */
START_TEST(td_ring_grant_fails)
{
    td_begin(_i, SOCK_STREAM);
    mock_fail(pp.a.ctx, MOCK_FAIL_GRANT, 1, -ENOMEM);
    pt_connect_to(&pp, NULL, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    td_end();
}
END_TEST

/* A receive's grant fails when it is to be advertised: the conn resets and the
 * receive fails with ECONNRESET. */
START_TEST(td_advert_grant_fails)
{
    static uint8_t rb[8000];
    struct pt_op r;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    mock_fail(pp.b.ctx, MOCK_FAIL_GRANT, 1, -ENOMEM);
    op_post(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    pt_run(&pp);
    pt_assert_done(&r, -1, ECONNRESET);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    pt_op_fini(&r);
    td_end();
}
END_TEST

/* Every grant the protocol made was revoked by the end. */
START_TEST(td_grants_all_revoked)
{
    static uint8_t sb[3][8000], rb[3][8000];
    struct pt_op s[3], r[3];
    struct mock_stats st;

    td_begin(_i, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&r[0], &pp.b, EXS_OP_RECV, rb[0], 8000, 0); /* advertised */
    pt_run(&pp);
    op_post(&s[0], &pp.a, EXS_OP_SEND, sb[0], 8000, 0); /* direct */
    op_post(&s[1], &pp.a, EXS_OP_SEND, sb[1], 8000, 0); /* announced, read */
    pt_run(&pp);
    op_post(&r[1], &pp.b, EXS_OP_RECV, rb[1], 8000, 0);
    op_post(&s[2], &pp.a, EXS_OP_SEND, sb[2], 8000, 0); /* announced, never read */
    op_post(&r[2], &pp.a, EXS_OP_RECV, rb[2], 8000, 0); /* advertised, never filled */
    pt_run(&pp);
    for (int i = 0; i < 2; i++) {
        pt_assert_done(&s[i], 8000, 0);
        pt_assert_done(&r[i], 8000, 0);
    }
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    pt_assert_done(&s[2], -1, ECANCELED);
    pt_assert_done(&r[2], -1, ECANCELED);
    for (int i = 0; i < 2; i++) {
        mock_stats(i ? pp.b.ctx : pp.a.ctx, &st);
        ck_assert_uint_gt(st.grants, 1);
        ck_assert_uint_eq(st.revokes, st.grants);
    }
    for (int i = 0; i < 3; i++) {
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    td_end();
}
END_TEST

/* An op the owner frees as soon as it is handed back (as the api does), with what it
 * was handed back with kept aside. */
struct late_rec {
    int done;
    ssize_t result;
    int err;
};

static void late_op_done(struct exs_op *op)
{
    struct pt_op *o = exs_container_of(op, struct pt_op, op);
    struct late_rec *rec = o->op.owner;

    rec->done++;
    rec->result = op->result;
    rec->err = op->err;
    pt_op_fini(o);
    free(o);
}

static struct pt_op *late_op_post(struct pt_side *s, enum exs_op_kind k, uint8_t *buf, size_t len,
                                  struct late_rec *rec)
{
    struct pt_op *o = calloc(1, sizeof(*o));

    ck_assert_ptr_nonnull(o);
    if (k == EXS_OP_SEND)
        pt_fill(buf, len, 0);
    pt_op_init(o, s, k, buf, len, 0);
    o->op.done = late_op_done;
    o->op.owner = rec;
    ck_assert_int_eq(pt_post(o), 0);
    return o;
}

/* Step the fabric until side's ctx carried out one more work request of this kind
 * (writes or reads); its completion then waits on the ctx, not yet dispatched. */
static void late_step_until(struct pt_side *s, int reads)
{
    struct mock_stats st;
    uint64_t before, now;

    mock_stats(s->ctx, &st);
    before = reads ? st.reads : st.writes;
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_eq(mock_step(), 1);
        mock_stats(s->ctx, &st);
        now = reads ? st.reads : st.writes;
        if (now > before)
            return;
    }
    ck_abort_msg("the work request was never carried out");
}

/*
 * A work request of an op completed successfully, the connection went DOWN (abort) and
 * the op was cancelled before that completion was dispatched. The op may not be handed
 * back while the provider still holds its work request (its owner frees it, and its
 * buffer, at once): it completes with ECANCELED when the completion is seen. Cases:
 * _i 0 SEQPACKET eager write into the ring, 1 STREAM eager write, 2 SEQPACKET direct
 * write into an advertised receive, 3 STREAM direct write, 4 SEQPACKET RDMA READ of an
 * announced message (the receive is the op), 5 SEQPACKET batched write of two sends.
 * _i 6..11: the same with the mock holding completions back: the held one arrives after
 * DISCONNECTED, in DRAINING.
 */
START_TEST(td_cancel_before_late_completion)
{
    static uint8_t sb[3][8000], rb[8000];
    int c = _i % 6, held = _i >= 6;
    int st_type = (c == 1 || c == 3) ? SOCK_STREAM : SOCK_SEQPACKET;
    struct late_rec rec[2] = {{0}};
    struct pt_side *s = c == 4 ? &pp.b : &pp.a;
    int nrec = c == 5 ? 2 : 1;
    struct pt_op peer;

    td_begin(0, st_type);
    pt_connect(&pp);
    if (held)
        mock_set_reorder(7919u * (uint32_t)_i);
    switch (c) {
    case 0:
    case 1:
        late_op_post(&pp.a, EXS_OP_SEND, sb[0], 100, &rec[0]);
        late_step_until(&pp.a, 0);
        break;
    case 2:
    case 3:
        op_post(&peer, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
        pt_run(&pp); /* advertised */
        late_op_post(&pp.a, EXS_OP_SEND, sb[0], sizeof(sb[0]), &rec[0]);
        late_step_until(&pp.a, 0);
        break;
    case 4:
        op_post(&peer, &pp.a, EXS_OP_SEND, sb[0], sizeof(sb[0]), 0);
        pt_run(&pp); /* announced, waits at b */
        late_op_post(&pp.b, EXS_OP_RECV, rb, sizeof(rb), &rec[0]);
        late_step_until(&pp.b, 1);
        break;
    default:
        op_post(&peer, &pp.a, EXS_OP_SEND, sb[0], 100, 0);     /* alone: a ring write */
        late_op_post(&pp.a, EXS_OP_SEND, sb[1], 100, &rec[0]); /* gathered behind it */
        late_op_post(&pp.a, EXS_OP_SEND, sb[2], 100, &rec[1]);
        late_step_until(&pp.a, 0);
        pt_dispatch_ctx(&pp, pp.a.ctx); /* its completion: the two leave as one write */
        while (!peer.done) {
            ck_assert_int_eq(mock_step(), 1); /* held: until it is delivered */
            pt_dispatch_ctx(&pp, pp.a.ctx);
        }
        ck_assert_uint_eq(pp.a.conn->stats.batches_sent, 1);
        late_step_until(&pp.a, 0);
        break;
    }
    exs__conn_abort(s->conn);
    ck_assert_int_eq(s->conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(exs__conn_cancel(s->conn, match_all, NULL), 0);
    for (int i = 0; i < nrec; i++)
        ck_assert_int_eq(rec[i].done, 0); /* its completion is still to come */
    if (held) {
        pt_dispatch(&pp);
        ck_assert_int_eq(s->conn->state, EXS_CONN_DRAINING);
        for (int i = 0; i < nrec; i++)
            ck_assert_int_eq(rec[i].done, 0);
    }
    pt_run(&pp);
    for (int i = 0; i < nrec; i++) {
        ck_assert_int_eq(rec[i].done, 1);
        ck_assert_int_eq(rec[i].result, -1);
        ck_assert_int_eq(rec[i].err, ECANCELED);
    }
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    if (c >= 2) {
        ck_assert_int_eq(peer.done, 1);
        pt_op_fini(&peer);
    }
    td_end();
}
END_TEST

/* A batched write flushed by the disconnect: the sends cancelled from DOWN on complete
 * with ECANCELED when its flush is seen, before the connection's end. */
START_TEST(td_cancel_batched_write_flushed)
{
    static uint8_t sb[3][100];
    struct late_rec rec[2] = {{0}};
    struct exs_prov_cqe cqe[16];
    struct pt_op first;
    int n;

    td_begin(0, SOCK_SEQPACKET);
    pt_connect(&pp);
    op_post(&first, &pp.a, EXS_OP_SEND, sb[0], sizeof(sb[0]), 0);    /* alone: a ring write */
    late_op_post(&pp.a, EXS_OP_SEND, sb[1], sizeof(sb[1]), &rec[0]); /* gathered behind it */
    late_op_post(&pp.a, EXS_OP_SEND, sb[2], sizeof(sb[2]), &rec[1]);
    late_step_until(&pp.a, 0);
    pt_dispatch_ctx(&pp, pp.a.ctx); /* its completion: the two leave as one write */
    ck_assert_int_eq(first.done, 1);
    ck_assert_uint_eq(pp.a.conn->stats.batches_sent, 1);
    exs__conn_abort(pp.a.conn); /* the batched write was not carried out: it flushes */
    ck_assert_int_eq(exs__conn_cancel(pp.a.conn, match_all, NULL), 0);
    ck_assert_int_eq(rec[0].done + rec[1].done, 0);
    /* the completions alone, as the engine polls them, before the cm event */
    while ((n = exs__prov_poll(pp.a.ctx, cqe, 16)) > 0)
        exs__conn_on_cqes(cqe, n);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DOWN);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(rec[i].done, 1);
        ck_assert_int_eq(rec[i].result, -1);
        ck_assert_int_eq(rec[i].err, ECANCELED);
    }
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    pt_op_fini(&first);
    td_end();
}
END_TEST

Suite *proto_teardown_suite(void)
{
    Suite *s = suite_create("proto_teardown");
    TCase *tc = tcase_create("teardown");

    tcase_add_loop_test(tc, td_close_active_first, 0, 3);
    tcase_add_loop_test(tc, td_close_passive_first, 0, 3);
    tcase_add_loop_test(tc, td_close_both_at_once, 0, 3);
    tcase_add_loop_test(tc, td_abort, 0, 3);
    tcase_add_loop_test(tc, td_peer_drop_mid_transfer_seqpacket, 0, 3);
    tcase_add_loop_test(tc, td_peer_drop_mid_transfer_stream, 0, 3);
    tcase_add_loop_test(tc, td_error_completion_mid_transfer, 0, 3);
    tcase_add_loop_test(tc, td_close_with_send_on_the_wire, 0, 3);
    tcase_add_loop_test(tc, td_cancel, 0, 3);
    tcase_add_loop_test(tc, td_cancel_before_late_completion, 0, 12);
    tcase_add_test(tc, td_cancel_batched_write_flushed);
    tcase_add_loop_test(tc, td_connect_unreachable, 0, 2);
    tcase_add_test(tc, td_connect_rejected);
    tcase_add_test(tc, td_accept_no_resources);
    tcase_add_loop_test(tc, td_close_while_connecting, 0, 3);
    tcase_add_test(tc, td_create_failures);
    tcase_add_test(tc, td_cq_full_refuses_conn);
    tcase_add_loop_test(tc, td_ring_grant_fails, 0, 3);
    tcase_add_loop_test(tc, td_advert_grant_fails, 0, 3);
    tcase_add_loop_test(tc, td_grants_all_revoked, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}
