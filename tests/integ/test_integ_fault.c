/* SPDX-License-Identifier: MIT */
/* Injected faults (the fault provider over the provider under test) end cleanly on the
 * connection they hit, leak nothing, and leave the other connections transferring. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "integ.h"

#define MSG_LEN  3000
/* A length no test waits out: a stall or freeze ended by an online change. */
#define FOREVER  "3600000"
/* How long a frozen or stalled connection is watched for anything getting through. */
#define QUIET_MS 300

static uint64_t fault_count(const char *kind)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("prov.fault", kind, &v), 0);
    return v;
}

/* One message client -> server on p through registered buffers s and r, its bytes
 * verified. */
static void xfer_bufs(struct it_pair *p, struct it_buf *s, struct it_buf *r, uint32_t seed)
{
    it_fill(s->p, MSG_LEN, seed);
    memset(r->p, 0, MSG_LEN);
    IT_POST_RECV(p->sfd, r->p, MSG_LEN, p->sq, IT_AH(seed), r->mh);
    IT_POST_SEND(p->cfd, s->p, MSG_LEN, p->cq, IT_AH(seed), s->mh);
    it_expect_send(p->cq, p->cfd, IT_AH(seed), MSG_LEN);
    it_expect_recv(p->sq, p->sfd, IT_AH(seed), MSG_LEN, 0);
    ck_assert_int_eq(it_check(r->p, MSG_LEN, seed), -1);
    ck_assert(it_buf_guards_ok(r));
}

/* The same with buffers of its own. */
static void xfer_ok(struct it_pair *p, uint32_t seed)
{
    struct it_buf *s = it_buf_new(MSG_LEN, 1), *r = it_buf_new(MSG_LEN, 1);

    xfer_bufs(p, s, r, seed);
    it_buf_free(s);
    it_buf_free(r);
}

/* The next event of (q, type, fd): a failure (errno != 0). Returns its errno. */
static int expect_failed(exs_qhandle_t q, int type, int fd)
{
    exs_event_t ev;

    it_wait_event(q, type, fd, &ev);
    ck_assert_msg(ev.exs_evt_errno != 0, "%s on fd %d succeeded (result %zd); expected a failure",
                  it_evt_name(type), fd, ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
    return ev.exs_evt_errno;
}

/* A faulted connection a: close both sides (each CLOSE clean) and the queues. */
static void pair_close_after_fault(struct it_pair *a)
{
    it_pair_close(a);
}

/* ---- dropped connection ---- */

/* The first send on connection a disconnects it: both of its sides see the end, the send
 * and the receive fail with ECONNRESET, and connection b keeps carrying verified data. */
START_TEST(test_fault_drop)
{
    struct it_pair a, b;
    struct it_buf *s, *r;
    int e;

    it_fault_init();
    it_pair_open(&a, SOCK_SEQPACKET, 16, 16);
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    xfer_ok(&b, 1);
    s = it_buf_new(MSG_LEN, 1);
    r = it_buf_new(MSG_LEN, 1);
    it_fill(s->p, MSG_LEN, 2);

    it_fault_set_port(&a);
    it_fault_set("fault_drop_nth", "1");
    IT_POST_RECV(a.sfd, r->p, MSG_LEN, a.sq, IT_AH(2), r->mh);
    IT_POST_SEND(a.cfd, s->p, MSG_LEN, a.cq, IT_AH(2), s->mh);
    e = expect_failed(a.cq, EXS_EVT_SEND, a.cfd);
    ck_assert_msg(e == ECONNRESET, "send errno %d (%s)", e, strerror(e));
    e = expect_failed(a.sq, EXS_EVT_RECV, a.sfd);
    ck_assert_msg(e == ECONNRESET, "recv errno %d (%s)", e, strerror(e));
    it_fault_set("fault_drop_nth", "0");
    ck_assert_uint_eq(fault_count("drop"), 1);

    for (uint32_t i = 0; i < 8; i++)
        xfer_ok(&b, 10 + i);
    pair_close_after_fault(&a);
    xfer_ok(&b, 20);
    it_pair_close(&b);
}
END_TEST

/* ---- error completions, one test per status ---- */

START_TEST(test_fault_wc_status)
{
    int status = 1 + _i; /* EXS_PROV_WC_LOC_LEN_ERR .. EXS_PROV_WC_GENERAL_ERR */
    struct it_pair a, b;
    struct it_buf *s, *r;
    exs_event_t es, er;
    char st[16];

    ck_assert_int_lt(status, EXS_PROV_WC_STATUS_MAX);
    it_context("injected status %d (%s)", status,
               exs__prov_wc_status_str((enum exs_prov_wc_status)status));
    it_fault_init();
    it_pair_open(&a, SOCK_SEQPACKET, 16, 16);
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    xfer_ok(&b, 1);
    s = it_buf_new(MSG_LEN, 1);
    r = it_buf_new(MSG_LEN, 1);
    it_fill(s->p, MSG_LEN, 2);

    snprintf(st, sizeof(st), "%d", status);
    it_fault_set("fault_wc_status", st);
    it_fault_set_port(&a);
    it_fault_set("fault_wc_nth", "1");
    IT_POST_RECV(a.sfd, r->p, MSG_LEN, a.sq, IT_AH(2), r->mh);
    IT_POST_SEND(a.cfd, s->p, MSG_LEN, a.cq, IT_AH(2), s->mh);
    /* The first completion of a (the send's, or the receive's) fails and takes the
     * connection down: at least one of the two operations fails, and a receive that
     * completes holds the bytes sent. */
    it_wait_event(a.cq, EXS_EVT_SEND, a.cfd, &es);
    it_wait_event(a.sq, EXS_EVT_RECV, a.sfd, &er);
    ck_assert_msg(es.exs_evt_errno || er.exs_evt_errno, "both operations succeeded");
    if (!er.exs_evt_errno) {
        ck_assert_int_eq(er.exs_evt_u.exs_evt_xfer.exs_evt_result, MSG_LEN);
        ck_assert_int_eq(it_check(r->p, MSG_LEN, 2), -1);
    }
    it_fault_set("fault_wc_nth", "0");
    /* one per side of a that had a successful completion before the end reached it */
    ck_assert_uint_ge(fault_count("wc"), 1);
    ck_assert_uint_le(fault_count("wc"), 2);
    /* the connection is over on both sides: a new operation fails at once */
    IT_POST_SEND(a.cfd, s->p, 64, a.cq, IT_AH(3), s->mh);
    expect_failed(a.cq, EXS_EVT_SEND, a.cfd);
    IT_POST_RECV(a.sfd, r->p, 64, a.sq, IT_AH(3), r->mh);
    expect_failed(a.sq, EXS_EVT_RECV, a.sfd);

    for (uint32_t i = 0; i < 4; i++)
        xfer_ok(&b, 10 + i);
    pair_close_after_fault(&a);
    xfer_ok(&b, 20);
    it_pair_close(&b);
}
END_TEST

/* ---- failed registrations ---- */

/* Every registration fails while the fault is on: exs_mregister and a send of
 * unregistered memory with ENOMEM. Connection a then still works, and connection b
 * keeps going throughout (its memory is registered already). */
START_TEST(test_fault_reg)
{
    struct it_pair a, b;
    exs_mhandle_t mh;
    char *buf;

    it_fault_init();
    it_pair_open(&a, SOCK_SEQPACKET, 16, 16);
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    xfer_ok(&b, 1);
    buf = malloc(MSG_LEN);
    ck_assert_ptr_nonnull(buf);
    it_fill(buf, MSG_LEN, 5);

    it_fault_set("fault_reg_nth", "1");
    errno = 0;
    mh = exs_mregister(buf, MSG_LEN, 0);
    ck_assert_msg(mh == EXS_MHANDLE_INVALID && errno == ENOMEM,
                  "exs_mregister under a registration fault: errno %d (%s)", errno,
                  strerror(errno));
    ck_assert_uint_eq(fault_count("reg"), 1);
    /* an unregistered buffer is registered when the send is posted: that fails too */
    IT_EXPECT_FAIL(exs_send(a.cfd, buf, MSG_LEN, 0, a.cq, IT_AH(5), EXS_MHANDLE_UNREGISTERED),
                   ENOMEM);
    ck_assert_uint_eq(fault_count("reg"), 2);
    it_fault_set("fault_reg_nth", "0");

    /* connection a survives a failed registration: the send goes through now */
    {
        struct it_buf *r = it_buf_new(MSG_LEN, 1);

        IT_POST_RECV(a.sfd, r->p, MSG_LEN, a.sq, IT_AH(6), r->mh);
        IT_POST_SEND(a.cfd, buf, MSG_LEN, a.cq, IT_AH(6), EXS_MHANDLE_UNREGISTERED);
        it_expect_send(a.cq, a.cfd, IT_AH(6), MSG_LEN);
        it_expect_recv(a.sq, a.sfd, IT_AH(6), MSG_LEN, 0);
        ck_assert_int_eq(it_check(r->p, MSG_LEN, 5), -1);
    }
    for (uint32_t i = 0; i < 4; i++)
        xfer_ok(&b, 10 + i);
    it_pair_close(&a);
    it_pair_close(&b);
    free(buf);
}
END_TEST

/* ---- failed connects ---- */

/* The first failed connect is refused (ECONNREFUSED), the second unreachable
 * (ETIMEDOUT); the listener never saw them, and a third connect succeeds. */
START_TEST(test_fault_connect)
{
    struct it_pair b;
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, fd, sfd;
    static const int want[2] = {ECONNREFUSED, ETIMEDOUT};

    it_fault_init();
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    xfer_ok(&b, 1);
    q = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    ck_assert_int_eq(exs_accept(lfd, q, IT_AH(0xACC)), 0);

    it_fault_set("fault_connect_nth", "1");
    for (int i = 0; i < 2; i++) {
        fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(i)), 0);
        it_expect_err(q, EXS_EVT_CONNECT, fd, IT_AH(i), want[i]);
        it_close(fd, q);
        xfer_ok(&b, 2 + (uint32_t)i);
    }
    it_fault_set("fault_connect_nth", "0");
    ck_assert_uint_eq(fault_count("connect"), 2);
    /* the listener saw nothing of them, and serves the next one */
    it_expect_no_event(q, 100);
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_eq(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(9)), 0);
    it_expect_err(q, EXS_EVT_CONNECT, fd, IT_AH(9), 0);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    it_close(fd, q);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_pair_close(&b);
}
END_TEST

/* ---- frozen link, stalled completions, delays ---- */

/* The opening of the freeze and stall tests: connections a and b, b carrying verified
 * data; then the fault kind (freeze, stall) holds a's first transfer without end (until
 * fault_<kind>_ms changes) and a message of seed (IT_AH(seed), MSG_LEN bytes from *s into
 * *r) is posted on a, while b carries four more. */
static void held_open(struct it_pair *a, struct it_pair *b, struct it_buf **s, struct it_buf **r,
                      const char *kind, uint32_t seed)
{
    char name[32];

    it_fault_init();
    it_pair_open(a, SOCK_SEQPACKET, 16, 16);
    it_pair_open(b, SOCK_SEQPACKET, 16, 16);
    xfer_ok(b, 1);
    *s = it_buf_new(MSG_LEN, 1);
    *r = it_buf_new(MSG_LEN, 1);
    it_fill((*s)->p, MSG_LEN, seed);

    snprintf(name, sizeof(name), "fault_%s_ms", kind);
    it_fault_set(name, FOREVER);
    it_fault_set_port(a);
    snprintf(name, sizeof(name), "fault_%s_nth", kind);
    it_fault_set(name, "1");
    IT_POST_RECV(a->sfd, (*r)->p, MSG_LEN, a->sq, IT_AH(seed), (*r)->mh);
    IT_POST_SEND(a->cfd, (*s)->p, MSG_LEN, a->cq, IT_AH(seed), (*s)->mh);
    for (uint32_t i = 0; i < 4; i++)
        xfer_ok(b, 10 + i);
}

/* A frozen link moves nothing either way while the endpoint stays up; the other
 * connection transfers meanwhile. When the freeze ends (an online change of its length)
 * the held message arrives intact. */
START_TEST(test_fault_freeze)
{
    struct it_pair a, b;
    struct it_buf *s, *r;

    held_open(&a, &b, &s, &r, "freeze", 7);
    it_expect_no_event(a.cq, QUIET_MS);
    it_expect_no_event(a.sq, 0);
    ck_assert(it_all_bytes(r->p, MSG_LEN, IT_GUARD_BYTE)); /* not a byte landed */
    it_fault_set("fault_freeze_nth", "0");
    /* a's sender froze at its first post; its receiver freezes too if it posted anything
     * (an ADVERT of the receive, when the adaptive mode chose to send one): once per
     * endpoint, never more */
    ck_assert_uint_ge(fault_count("freeze"), 1);
    ck_assert_uint_le(fault_count("freeze"), 2);

    it_fault_set("fault_freeze_ms", "0"); /* thaw */
    it_expect_send(a.cq, a.cfd, IT_AH(7), MSG_LEN);
    it_expect_recv(a.sq, a.sfd, IT_AH(7), MSG_LEN, 0);
    ck_assert_int_eq(it_check(r->p, MSG_LEN, 7), -1);
    xfer_ok(&a, 8);
    xfer_ok(&b, 20);
    it_pair_close(&a);
    it_pair_close(&b);
}
END_TEST

/* A stalled endpoint delivers no completion: the operation it holds does not finish
 * while the other connection transfers; when the stall ends (online) it finishes with
 * its bytes. */
START_TEST(test_fault_stall)
{
    struct it_pair a, b;
    struct it_buf *s, *r;
    exs_event_t ev;
    int got = 0;

    held_open(&a, &b, &s, &r, "stall", 9);
    /* the endpoint of a's first completion stalls: not both operations finish */
    got += it_try_event(a.cq, EXS_EVT_SEND, a.cfd, QUIET_MS, &ev);
    got += it_try_event(a.sq, EXS_EVT_RECV, a.sfd, 0, &ev);
    ck_assert_msg(got < 2, "both operations finished on a stalled connection");
    it_fault_set("fault_stall_nth", "0");
    ck_assert_uint_ge(fault_count("stall"), 1);

    it_fault_set("fault_stall_ms", "0"); /* the stall ends */
    if (!it_try_event(a.cq, EXS_EVT_SEND, a.cfd, 0, &ev))
        it_expect_send(a.cq, a.cfd, IT_AH(9), MSG_LEN);
    if (!it_try_event(a.sq, EXS_EVT_RECV, a.sfd, 0, &ev))
        it_expect_recv(a.sq, a.sfd, IT_AH(9), MSG_LEN, 0);
    ck_assert_int_eq(it_check(r->p, MSG_LEN, 9), -1);
    xfer_ok(&a, 10);
    xfer_ok(&b, 20);
    it_pair_close(&a);
    it_pair_close(&b);
}
END_TEST

/* Every completion of connection a held 100 ms: its messages still arrive intact and in
 * order, later than the delay (a lower bound: never failed by a slow machine), while b
 * transfers. */
START_TEST(test_fault_delay)
{
    struct it_pair a, b;
    struct it_buf *s, *r;
    double t0;

    it_fault_init();
    it_pair_open(&a, SOCK_SEQPACKET, 16, 16);
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    s = it_buf_new(MSG_LEN, 1);
    r = it_buf_new(MSG_LEN, 1);

    it_fault_set("fault_delay_us", "100000");
    it_fault_set_port(&a);
    it_fault_set("fault_delay_nth", "1");
    for (uint32_t i = 0; i < 4; i++) {
        it_fill(s->p, MSG_LEN, 30 + i);
        t0 = it_now_ms();
        IT_POST_RECV(a.sfd, r->p, MSG_LEN, a.sq, IT_AH(i), r->mh);
        IT_POST_SEND(a.cfd, s->p, MSG_LEN, a.cq, IT_AH(i), s->mh);
        xfer_ok(&b, 10 + i);
        it_expect_recv(a.sq, a.sfd, IT_AH(i), MSG_LEN, 0);
        ck_assert_msg(it_now_ms() - t0 >= 99, "a delayed receive finished after %.1f ms",
                      it_now_ms() - t0);
        it_expect_send(a.cq, a.cfd, IT_AH(i), MSG_LEN);
        ck_assert_int_eq(it_check(r->p, MSG_LEN, 30 + i), -1);
    }
    ck_assert_uint_ge(fault_count("delay"), 8);
    it_fault_set("fault_delay_nth", "0");
    xfer_ok(&a, 40);
    it_pair_close(&a);
    it_pair_close(&b);
}
END_TEST

/* ---- every kind at once ---- */

#define CHAOS_PAIRS 8
#define CHAOS_MSGS  40

/* Connections transferring while every kind of fault (but registrations and connects)
 * hits at random, from a fixed seed: every operation ends, with its bytes verified or
 * with an error (then its connection is done with), none hangs or is lost, and closing
 * everything leaves nothing behind. */
START_TEST(test_fault_chaos)
{
    struct it_pair p[CHAOS_PAIRS];
    struct it_buf *sb[CHAOS_PAIRS], *rb[CHAOS_PAIRS];
    int dead[CHAOS_PAIRS] = {0}, ndead = 0, nok = 0;
    uint64_t injected = 0;
    static const char *const kinds[] = {"delay", "stall", "drop", "wc", "freeze"};
    /* loop 0: SEQPACKET 3000 B (eager into the ring); 1: STREAM 64 KiB with MSG_WAITALL
     * (direct placement and the ring) */
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    size_t len = _i ? 65536 : MSG_LEN;
    int rflags = _i ? MSG_WAITALL : 0;

    it_fault_init();
    for (int i = 0; i < CHAOS_PAIRS; i++) {
        it_pair_open(&p[i], type, 16, 16);
        sb[i] = it_buf_new(len, 1);
        rb[i] = it_buf_new(len, 1);
    }
    it_fault_set("fault_seed", "20261124");
    it_fault_set("fault_delay_ppm", "50000");
    it_fault_set("fault_delay_us", "2000");
    it_fault_set("fault_stall_ppm", "5000");
    it_fault_set("fault_stall_ms", "20");
    it_fault_set("fault_freeze_ppm", "5000");
    it_fault_set("fault_freeze_ms", "20");
    it_fault_set("fault_drop_ppm", "4000");
    it_fault_set("fault_wc_ppm", "4000");
    for (uint32_t m = 0; m < CHAOS_MSGS; m++) {
        for (int i = 0; i < CHAOS_PAIRS; i++) {
            if (dead[i])
                continue;
            it_fill(sb[i]->p, len, m * 100 + (uint32_t)i);
            memset(rb[i]->p, 0, len);
            {
                int rc = exs_recv(p[i].sfd, rb[i]->p, len, rflags, p[i].sq, IT_AH(m), rb[i]->mh);

                ck_assert_msg(rc == 0, "exs_recv: errno %d (%s)", errno, strerror(errno));
            }
            IT_POST_SEND(p[i].cfd, sb[i]->p, len, p[i].cq, IT_AH(m), sb[i]->mh);
        }
        for (int i = 0; i < CHAOS_PAIRS; i++) {
            exs_event_t es, er;

            if (dead[i])
                continue;
            it_context("pair %d message %u", i, m);
            it_wait_event(p[i].cq, EXS_EVT_SEND, p[i].cfd, &es);
            it_wait_event(p[i].sq, EXS_EVT_RECV, p[i].sfd, &er);
            if (!er.exs_evt_errno) {
                ck_assert_int_eq(er.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)len);
                ck_assert_int_eq(it_check(rb[i]->p, len, m * 100 + (uint32_t)i), -1);
            }
            if (es.exs_evt_errno || er.exs_evt_errno) {
                dead[i] = 1;
                ndead++;
            } else {
                nok++;
            }
        }
    }
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        injected += fault_count(kinds[k]);
    it_fault_params_reset();
    ck_assert_msg(injected > 0 && nok > 0, "%" PRIu64 " faults, %d messages through", injected,
                  nok);
    /* a pair with no fault that ends it still works; every pair closes cleanly */
    for (int i = 0; i < CHAOS_PAIRS; i++) {
        if (!dead[i]) {
            exs_event_t ev;

            it_fill(sb[i]->p, len, 7777);
            ck_assert_int_eq(
                exs_recv(p[i].sfd, rb[i]->p, len, rflags, p[i].sq, IT_AH(7777), rb[i]->mh), 0);
            IT_POST_SEND(p[i].cfd, sb[i]->p, len, p[i].cq, IT_AH(7777), sb[i]->mh);
            it_expect_send(p[i].cq, p[i].cfd, IT_AH(7777), (ssize_t)len);
            it_expect_err_at(p[i].sq, EXS_EVT_RECV, p[i].sfd, IT_AH(7777), 0, &ev, __FILE__,
                             __LINE__);
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)len);
            ck_assert_int_eq(it_check(rb[i]->p, len, 7777), -1);
        }
        it_pair_close(&p[i]);
    }
    fprintf(stderr,
            "chaos: %d messages through, %d connections ended by faults, %" PRIu64 " faults\n", nok,
            ndead, injected);
}
END_TEST

/* ---- reproducibility ---- */

#define REPRO_CALLS 400

/* The indices (1-based) of the registrations that failed among REPRO_CALLS, on a fresh
 * context of the fault provider, with the seed given. Returns how many failed. */
static int repro_run(const char *seed, unsigned char *failed)
{
    const struct exs_prov_ops *ops = exs__prov_find(it_fault_provider());
    struct exs_prov_ctx *ctx;
    static char buf[4096];
    uint64_t before = 0, after = 0;
    int n = 0;

    ck_assert_ptr_nonnull(ops);
    it_fault_set("fault_seed", seed);
    ck_assert_int_eq(exs__prov_ctx_open(ops, NULL, &ctx), 0);
    (void)exs__counters_lookup("prov.fault", "reg", &before);
    for (int i = 0; i < REPRO_CALLS; i++) {
        struct exs_prov_mr *mr = NULL;
        int rc = exs__prov_mr_reg(ctx, buf, sizeof(buf), EXS_PROV_ACCESS_LOCAL_WRITE, &mr);

        failed[i] = rc != 0;
        if (rc) {
            ck_assert_int_eq(rc, -ENOMEM);
            n++;
        } else {
            ck_assert_int_eq(exs__prov_mr_dereg(mr), 0);
        }
    }
    ck_assert_int_eq(exs__counters_lookup("prov.fault", "reg", &after), 0);
    ck_assert_uint_eq(after - before, (uint64_t)n);
    exs__prov_ctx_close(ctx);
    return n;
}

/* Same seed, same faults at the same call indices; another seed, other indices; every
 * Nth hits exactly the multiples of N. */
START_TEST(test_fault_reproducible)
{
    unsigned char f1[REPRO_CALLS], f2[REPRO_CALLS], f3[REPRO_CALLS];
    int n1, n2, n3;

    it_fault_init(); /* names the provider; the contexts below are the test's own */
    it_fault_set("fault_reg_ppm", "250000");
    n1 = repro_run("42", f1);
    n2 = repro_run("42", f2);
    n3 = repro_run("43", f3);
    ck_assert_msg(n1 > REPRO_CALLS / 8 && n1 < REPRO_CALLS / 2, "%d of %d failed at 25%%", n1,
                  REPRO_CALLS);
    ck_assert_int_eq(n1, n2);
    ck_assert_msg(memcmp(f1, f2, sizeof(f1)) == 0, "seed 42 twice: other call indices");
    ck_assert_msg(memcmp(f1, f3, sizeof(f1)) != 0 || n1 != n3, "seeds 42 and 43: same faults");

    it_fault_set("fault_reg_ppm", "0");
    it_fault_set("fault_reg_nth", "7");
    n1 = repro_run("42", f1);
    ck_assert_int_eq(n1, REPRO_CALLS / 7);
    for (int i = 0; i < REPRO_CALLS; i++)
        ck_assert_msg(f1[i] == ((i + 1) % 7 == 0), "call %d: failed %d", i + 1, f1[i]);
}
END_TEST

/* Registration failures while a connection opens. Every Nth registration fails, N
 * growing from 1 with the sequence restarted each time (a new fault_seed): while the
 * Nth is one of the connecting side's, exs_connect fails at once with ENOMEM; the first
 * N past them hits the accepting side, which refuses that connection (ECONNREFUSED at
 * the client) and keeps its exs_accept posted for the next one. Connection b transfers
 * throughout. */
START_TEST(test_fault_reg_connect)
{
    struct it_pair b;
    struct sockaddr_in addr;
    struct it_buf *bs, *br;
    exs_qhandle_t q, cq;
    exs_event_t ev;
    int lfd, fd, sfd, rc, n;
    char nth[16], seed[16];

    it_fault_init();
    it_pair_open(&b, SOCK_SEQPACKET, 16, 16);
    bs = it_buf_new(MSG_LEN, 1);
    br = it_buf_new(MSG_LEN, 1);
    q = it_qcreate(16);
    cq = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    ck_assert_int_eq(exs_accept(lfd, q, IT_AH(0xACC)), 0);
    for (n = 1; n < 16; n++) {
        snprintf(nth, sizeof(nth), "%d", n);
        snprintf(seed, sizeof(seed), "%d", 100 + n);
        it_fault_set("fault_seed", seed);
        it_fault_set("fault_reg_nth", nth);
        fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
        ck_assert_int_ge(fd, 0);
        errno = 0;
        rc = exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), cq, IT_AH(n));
        if (rc == 0) {
            it_expect_err(cq, EXS_EVT_CONNECT, fd, IT_AH(n), ECONNREFUSED);
            it_close(fd, cq);
            break;
        }
        ck_assert_msg(errno == ENOMEM, "exs_connect: errno %d (%s)", errno, strerror(errno));
        it_close(fd, cq);
        xfer_bufs(&b, bs, br, (uint32_t)n);
    }
    ck_assert_msg(n > 1 && n < 16, "the connecting side made %d registrations", n - 1);
    ck_assert_uint_eq(fault_count("reg"), (uint64_t)n);
    it_fault_set("fault_reg_nth", "0");
    it_expect_no_event(q, 100); /* the refused connection never reached exs_accept */

    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_eq(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), cq, IT_AH(99)), 0);
    it_expect_err(cq, EXS_EVT_CONNECT, fd, IT_AH(99), 0);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    xfer_ok(&b, 50);
    it_close(fd, cq);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_qdelete(cq);
    it_pair_close(&b);
}
END_TEST

Suite *integ_fault_suite(void)
{
    Suite *s = suite_create("fault");
    TCase *tc = tcase_create("fault");
    TCase *wc = tcase_create("fault_wc");

    tcase_set_timeout(tc, IT_CASE_TIMEOUT);
    tcase_add_checked_fixture(tc, NULL, it_fault_teardown);
    tcase_add_test(tc, test_fault_drop);
    tcase_add_test(tc, test_fault_reg);
    tcase_add_test(tc, test_fault_connect);
    tcase_add_test(tc, test_fault_freeze);
    tcase_add_test(tc, test_fault_stall);
    tcase_add_test(tc, test_fault_delay);
    tcase_add_loop_test(tc, test_fault_chaos, 0, 2);
    tcase_add_test(tc, test_fault_reproducible);
    tcase_add_test(tc, test_fault_reg_connect);
    suite_add_tcase(s, tc);
    tcase_set_timeout(wc, IT_CASE_TIMEOUT);
    tcase_add_checked_fixture(wc, NULL, it_fault_teardown);
    tcase_add_loop_test(wc, test_fault_wc_status, 0, EXS_PROV_WC_STATUS_MAX - 1);
    suite_add_tcase(s, wc);
    return s;
}
