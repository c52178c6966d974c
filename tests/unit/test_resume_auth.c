/* SPDX-License-Identifier: MIT */
/* The resume proof (spec/protocol.md §9.2, Proof) on the mock: a resume request naming a live
 * session is put on trial and never disturbs the connection before a valid AUTH; the active
 * side checks the passive side's MAC_B before it sends anything. */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/lockorder.h"
#include "exs/util/params.h"
#include "exs/util/sha256.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

#define ATT_RECVS 8
/* The other TCP connection: a raw ep on a ctx of its own (the driver never polls it). */
static struct att {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr;
    uint8_t mem[ATT_RECVS * 512 + 512] __attribute__((aligned(4096))); /* recvs, send area */
    struct exs_wire_resume_acc acc; /* the accept's private data */
    int accepted, rejected, ended;
    uint32_t recvs; /* SENDs that arrived */
    uint64_t wr_id;
} att;

static uint64_t ra_count(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("fallback", name, &v), 0);
    return v;
}

static uint64_t refused0, fail0, res0;

static void ra_setup(void)
{
    unit_pair_fresh(&pp, SOCK_STREAM, 1, 1);
    pt_connect(&pp);
    ck_assert_uint_ne(pp.b.conn->sess_token, 0);
    pt_fb_open(&pp);
    memset(&att, 0, sizeof(att));
    refused0 = ra_count("fallback_resume_refused");
    fail0 = ra_count("fallback_resume_failures");
    res0 = ra_count("fallback_resumes");
}

static void att_close(void)
{
    if (att.ep)
        exs__prov_ep_destroy(att.ep);
    if (att.mr)
        exs__prov_mr_dereg(att.mr);
    if (att.ctx)
        exs__prov_ctx_close(att.ctx);
    att.ep = NULL;
    att.mr = NULL;
    att.ctx = NULL;
}

static void ra_teardown(void)
{
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_fb_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    att_close();
    pt_close(&pp); /* asserts no conn is left */
    pt_fb_close();
    ck_assert_uint_eq(mock_violations(), 0);
    ck_assert_uint_eq(exs__conn_ring_bytes(), 0); /* a trial's ring went back too */
}

/* The attacker's ep, fresh (the previous one destroyed), its receives posted. */
static void att_open(void)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 16, .max_recv_wr = ATT_RECVS, .max_inline = 64};

    if (att.ep) {
        exs__prov_ep_destroy(att.ep);
        att.ep = NULL;
    }
    if (!att.ctx) {
        ck_assert_int_eq(mock_ctx_open(NULL, &att.ctx), 0);
        ck_assert_int_eq(exs__prov_mr_reg(att.ctx, att.mem, sizeof(att.mem),
                                          EXS_PROV_ACCESS_LOCAL_WRITE, &att.mr),
                         0);
    }
    ck_assert_int_eq(exs__prov_ep_create(att.ctx, &attr, &att.ep), 0);
    for (int i = 0; i < ATT_RECVS; i++) {
        struct exs_prov_sge sge = {(uintptr_t)att.mem + 512 * i, 512, att.mr->lkey};
        struct exs_prov_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1};

        ck_assert_int_eq(exs__prov_post_recv(att.ep, &wr), 0);
    }
    att.accepted = att.rejected = att.ended = 0;
    att.recvs = 0;
}

/* What reached the attacker: its connection's events and SENDs. */
static void att_poll(void)
{
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe;

    while (exs__prov_cm_poll(att.ctx, &ev) == 1) {
        if (ev.ep != att.ep)
            continue;
        if (ev.type == EXS_PROV_CM_ESTABLISHED) { /* as a connector: the accept's proof */
            if (ev.private_data_len >= sizeof(att.acc))
                memcpy(&att.acc, ev.private_data, sizeof(att.acc));
            att.accepted = 1;
        } else if (ev.type == EXS_PROV_CM_REJECTED) {
            att.rejected = 1;
        } else if (ev.type == EXS_PROV_CM_DISCONNECTED) {
            att.ended = 1;
        }
    }
    while (exs__prov_poll(att.ctx, &cqe, 1) == 1)
        if (cqe.ep == att.ep && cqe.status == EXS_PROV_WC_SUCCESS && cqe.opcode == EXS_PROV_WC_RECV)
            att.recvs++;
}

/* A resume request naming b's live session: the library's own hello (flag RESUME), the
 * token an observer of a resume hello learns, a nonce_A of its choosing. */
static void att_req(struct exs_wire_resume_req *q, uint8_t nonce)
{
    memset(q, 0, sizeof(*q));
    exs__conn_hello(pp.a.conn, &q->hello);
    q->hello.hflags = EXS_WIRE_HELLO_F_RESUME;
    q->token = htobe64(pp.b.conn->sess_token);
    memset(q->nonce_a, nonce, sizeof(q->nonce_a));
}

/* Connect to b's fallback listener with q; run until everything settled. */
static void att_connect(const struct exs_wire_resume_req *q)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    att_open();
    ck_assert_int_eq(exs__prov_listener_addr(pt_fb.lis, &ss, &len), 0);
    ck_assert_int_eq(exs__prov_connect(att.ep, (struct sockaddr *)&ss, len, q, sizeof(*q)), 0);
    pt_fb_run(&pp);
    att_poll();
}

/* A SEND of len bytes from the attacker. */
static void att_send(const void *buf, uint32_t len)
{
    struct exs_prov_sge sge = {(uintptr_t)att.mem + ATT_RECVS * 512, len, att.mr->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = ++att.wr_id,
        .opcode = EXS_PROV_WR_SEND,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
    };

    memcpy(att.mem + ATT_RECVS * 512, buf, len);
    ck_assert_int_eq(exs__prov_post_send(att.ep, &wr), 0);
    pt_fb_run(&pp);
    att_poll();
}

/* An AUTH record over the attacker's nonce_A and the accept's nonce_B, keyed with key
 * (64 bytes; NULL: the attacker's guess, all zero). */
static void att_auth(struct exs_wire_auth *a, const struct exs_wire_resume_req *q,
                     const uint8_t *key)
{
    static const uint8_t guess[64];

    memset(a, 0, sizeof(*a));
    a->hdr.type = EXS_CTRL_AUTH;
    a->hdr.len = htobe16(EXS_WIRE_AUTH_LEN);
    exs__resume_mac(key ? key : guess, EXS_WIRE_AUTH_LABEL_A, q->nonce_a, att.acc.nonce_b, a->mac);
}

/* The live connection was not touched and serves: both ends CONNECTED on their first
 * path, nothing cut over or counted as failed, 3000 more bytes a -> b arrive verified. */
static void expect_untouched(void)
{
    static uint8_t sb[3000], rb[3000];
    struct pt_op s, r;

    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_eq(pp.a.conn->ctx, pp.a.ctx);
    ck_assert_ptr_eq(pp.b.conn->ctx, pp.b.ctx);
    ck_assert_int_eq(pp.b.conn->resume.over, 0);
    ck_assert_uint_eq(ra_count("fallback_resume_failures"), fail0);
    ck_assert_uint_eq(ra_count("fallback_resumes"), res0);
    pt_send_pattern(&s, &pp.a, sb, sizeof(sb), 0);
    pt_recv_post(&r, &pp.b, rb, sizeof(rb), MSG_WAITALL);
    pt_fb_run(&pp);
    pt_assert_done(&s, (ssize_t)sizeof(sb), 0);
    pt_assert_done(&r, (ssize_t)sizeof(rb), 0);
    ck_assert(pt_check(rb, sizeof(rb), 0));
    pt_op_fini(&s);
    pt_op_fini(&r);
}

/* A resume request naming b's live session from another connection, refused on trial
 * whatever it sends (each: counted once in fallback_resume_refused, the attacker's path
 * disconnected, the connection untouched and serving):
 *  0 an AUTH with a wrong proof (the attacker knows the token, not the keys)
 *  1 another record first (a RING record, as a first SEND would carry without the proof)
 *  2 a SEND too short to hold an AUTH (a NOP)
 *  3 nothing: the attacker disconnects
 *  4 a captured exchange replayed: an earlier trial of the same request whose AUTH the
 *    real peer would have sent (computed with the keys, never sent: that trial ends by
 *    disconnect), then the same hello and that AUTH on a new connection: nonce_B is new. */
START_TEST(ra_refused)
{
    struct exs_wire_resume_req q;
    struct exs_wire_auth a;
    uint8_t nonce_b1[EXS_WIRE_NONCE_LEN];
    uint64_t want = 1;

    att_req(&q, 0x5a);
    att_connect(&q);
    ck_assert_int_eq(att.accepted, 1);
    ck_assert_uint_eq(att.acc.hello.magic, htobe16(EXS_WIRE_MAGIC));
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED); /* nothing touched yet */
    ck_assert_ptr_nonnull(pp.b.conn->resume.pend);
    switch (_i) {
    case 0:
        att_auth(&a, &q, NULL);
        att_send(&a, sizeof(a));
        break;
    case 1: {
        struct exs_wire_ring r = {.hdr = {.type = EXS_CTRL_RING, .len = htobe16(16)}};

        att_send(&r, sizeof(r));
        break;
    }
    case 2: {
        struct exs_wire_ctrl_hdr h = {.type = EXS_CTRL_NOP, .len = htobe16(8)};

        att_send(&h, sizeof(h));
        break;
    }
    case 3:
        exs__prov_disconnect(att.ep);
        pt_fb_run(&pp);
        att_poll();
        break;
    case 4:
        att_auth(&a, &q, pp.b.conn->resume.key); /* the real peer's proof for this nonce_B */
        memcpy(nonce_b1, att.acc.nonce_b, sizeof(nonce_b1));
        exs__prov_disconnect(att.ep);
        pt_fb_run(&pp);
        ck_assert_uint_eq(ra_count("fallback_resume_refused") - refused0, 1);
        att_connect(&q); /* the replay */
        ck_assert_int_eq(att.accepted, 1);
        ck_assert_int_ne(memcmp(nonce_b1, att.acc.nonce_b, sizeof(nonce_b1)), 0);
        att_send(&a, sizeof(a));
        want = 2;
        break;
    }
    ck_assert_uint_eq(ra_count("fallback_resume_refused") - refused0, want);
    ck_assert_int_eq(att.ended || !att.ep, 1);
    ck_assert_int_eq(att.recvs, 0); /* b sent nothing on the trial's path */
    expect_untouched();
}
END_TEST

/* A trial with no proof ends at its deadline (connect_timeout_ms from the accept, found
 * by the conn's timer): refused, counted, the connection untouched. Meanwhile a second
 * request for the same session is refused at once (one trial per session). */
START_TEST(ra_timeout)
{
    struct exs_wire_resume_req q;
    uint64_t saved = exs__params.connect_timeout_ms, next;
    struct timespec t0, t;

    att_req(&q, 1);
    att_connect(&q);
    ck_assert_int_eq(att.accepted, 1);
    /* a second request while the first is on trial */
    {
        struct att first = att;

        att.ep = NULL; /* keep the first connection open */
        att_connect(&q);
        ck_assert_int_eq(att.rejected, 1);
        exs__prov_ep_destroy(att.ep);
        att = first;
    }
    ck_assert_int_eq(exs__params_set("connect_timeout_ms", "50"), 0);
    next = exs__conn_timer(pp.b.conn, 0);
    ck_assert_uint_ge(next, 1);
    ck_assert_uint_le(next, 50); /* the trial's deadline is looked at in time */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (ra_count("fallback_resume_refused") == refused0) {
        exs__conn_timer(pp.b.conn, 0);
        clock_gettime(CLOCK_MONOTONIC, &t);
        ck_assert_msg(t.tv_sec - t0.tv_sec < 30, "the trial never timed out");
    }
    exs__params.connect_timeout_ms = saved;
    ck_assert_uint_eq(ra_count("fallback_resume_refused") - refused0, 1);
    pt_fb_run(&pp);
    att_poll();
    ck_assert_int_eq(att.ended, 1);
    ck_assert_ptr_null(pp.b.conn->resume.pend); /* reaped at the timer */
    expect_untouched();
}
END_TEST

/* A proved request (the keys known) whose SEND carries a second AUTH after the first: the
 * proof moved the connection, and the second AUTH is a protocol error of the peer that
 * proved it: the connection resets (ECONNRESET, a failed resume), never proved again. */
START_TEST(ra_auth_twice)
{
    static uint8_t rb[100];
    struct exs_wire_resume_req q;
    struct exs_wire_auth a[2];
    struct pt_op r;

    pt_recv_post(&r, &pp.b, rb, sizeof(rb), 0);
    att_req(&q, 2);
    att_connect(&q);
    ck_assert_int_eq(att.accepted, 1);
    att_auth(&a[0], &q, pp.b.conn->resume.key);
    a[1] = a[0];
    att_send(a, sizeof(a));
    ck_assert_uint_eq(ra_count("fallback_resume_refused"), refused0);
    /* b's, and a's: b failed a's path, and a's own resume then finds b gone */
    ck_assert_uint_eq(ra_count("fallback_resume_failures") - fail0, 2);
    ck_assert_int_ne(pp.b.conn->state, EXS_CONN_CONNECTED);
    pt_assert_done(&r, -1, ECONNRESET);
    pt_op_fini(&r);
}
END_TEST

/* The active side checks the passive side's MAC_B before anything goes on the new path: a
 * fallback listener that accepts a's resume without the keys (MAC_B wrong) gets nothing,
 * and a's resume fails as a refused one does (ECONNRESET, counted once). */
static int ra_fake_passive(const struct exs_prov_cm_event *ev)
{
    struct exs_wire_resume_acc acc;

    memset(&acc, 0, sizeof(acc));
    exs__conn_hello(pp.b.conn, &acc.hello);
    memset(acc.nonce_b, 0x77, sizeof(acc.nonce_b));
    memset(acc.mac_b, 0x99, sizeof(acc.mac_b));
    att_open();
    ck_assert_int_eq(exs__prov_accept(ev->req, att.ep, &acc, sizeof(acc)), 0);
    return 1;
}

START_TEST(ra_mac_b_wrong)
{
    static uint8_t rb[100];
    struct pt_op r;

    pt_recv_post(&r, &pp.a, rb, sizeof(rb), 0);
    pt_fb.on_request = ra_fake_passive;
    mock_drop(pp.a.conn->ep);
    pt_fb_run(&pp);
    att_poll();
    ck_assert_ptr_nonnull(att.ep);  /* a's request reached the fake listener */
    ck_assert_int_eq(att.recvs, 0); /* a sent nothing: no AUTH, no RING, no RESUME */
    ck_assert_int_ne(pp.a.conn->state, EXS_CONN_CONNECTED);
    pt_assert_done(&r, -1, ECONNRESET);
    pt_op_fini(&r);
    ck_assert_uint_eq(ra_count("fallback_resumes"), res0);
    ck_assert_uint_ge(ra_count("fallback_resume_failures") - fail0, 1); /* a's (b may follow) */
    pt_fb.on_request = NULL;
}
END_TEST

/* b's path fails after b sent its SESSION and before it took a's (lost with the path): b
 * knows its own key and not a's, so it could check no proof and refuses every request.
 * It is not resumable: it ends at once (its receive fails with ECONNRESET, counted once
 * in fallback_resume_failures), never RESUMING until connect_timeout_ms, and a, which
 * holds both keys when it took b's SESSION, has its request refused and ends too (counted
 * then: 2 in all). */
static int ra_b_half_keyed(void)
{
    struct exs_conn *b = pp.b.conn;

    return b && b->state == EXS_CONN_CONNECTED && (b->resume.keys & EXS_RSM_KEY_OWN) &&
           !(b->resume.keys & EXS_RSM_KEY_PEER);
}

START_TEST(ra_half_keyed)
{
    static uint8_t rb[100];
    uint64_t fail_0, res_0;
    struct pt_op r;
    int found = 0;

    unit_pair_fresh(&pp, SOCK_SEQPACKET, 1, 1);
    memset(&att, 0, sizeof(att));
    pt_connect_to(&pp, NULL, 0);
    for (long steps = 0; !found; steps++) {
        found = (pt_dispatch_ctx(&pp, pp.a.ctx), ra_b_half_keyed()) ||
                (pt_dispatch_ctx(&pp, pp.b.ctx), ra_b_half_keyed());
        if (!found)
            ck_assert_msg(mock_step() && steps < 100000, "b never held its key alone");
    }
    ck_assert_uint_ne(pp.b.conn->sess_token, 0);
    pt_fb_open(&pp);
    fail_0 = ra_count("fallback_resume_failures");
    res_0 = ra_count("fallback_resumes");
    pt_recv_post(&r, &pp.b, rb, sizeof(rb), 0);
    mock_drop(pp.b.conn->ep);
    pt_fb_run(&pp);
    ck_assert_int_ne(pp.b.conn->state, EXS_CONN_RESUMING);
    ck_assert_int_ne(pp.b.conn->state, EXS_CONN_CONNECTED);
    pt_assert_done(&r, -1, ECONNRESET);
    pt_op_fini(&r);
    ck_assert_int_ne(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_ne(pp.a.conn->state, EXS_CONN_RESUMING);
    ck_assert_uint_eq(ra_count("fallback_resumes"), res_0);
    ck_assert_uint_eq(ra_count("fallback_resume_failures") - fail_0, 1 + !!pp.a.conn->sess_token);
}
END_TEST

Suite *proto_resume_auth_suite(void)
{
    Suite *s = suite_create("proto_resume_auth");
    TCase *tc = tcase_create("resume_auth");

    tcase_add_checked_fixture(tc, ra_setup, ra_teardown);
    tcase_add_loop_test(tc, ra_refused, 0, 5);
    tcase_add_test(tc, ra_timeout);
    tcase_add_test(tc, ra_auth_twice);
    tcase_add_test(tc, ra_mac_b_wrong);
    suite_add_tcase(s, tc);
    tc = tcase_create("resume_half_keyed");
    tcase_add_checked_fixture(tc, NULL, ra_teardown);
    tcase_add_test(tc, ra_half_keyed);
    suite_add_tcase(s, tc);
    return s;
}
