/* SPDX-License-Identifier: MIT */
/* The cut-over with policy any (spec/protocol.md §9.2): SESSION tokens; a STREAM cut mid-transfer
 * continues over the fallback with every byte verified; what is not resumed ends cleanly. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/engine/engine.h"
#include "exs/prov/prov.h"
#include "exs/proto/proto.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "integ.h"
#include "tests/skip.h"

#define RS_MSG   (64u * 1024u) /* SEQPACKET message */
#define RS_NMSG  64u           /* messages of a transfer: 4 MiB */
#define RS_TOTAL (RS_MSG * RS_NMSG)

static char rs_prov[32];

/* Primary fault:tcp (or fault:verbs when the provider under test is verbs: a cut-over
 * from verbs to tcp, in the Soft-RoCE guest), fallback tcp (ports moved by 1000), policy
 * as given. 0, or 1 when the provider under test is neither (the test is then skipped). */
static int rs_init(const char *test, const char *policy)
{
    const char *saved = it_provider;
    const char *inner = strncmp(it_provider, "fault:", 6) == 0 ? it_provider + 6 : it_provider;

    if (strcmp(inner, "tcp") != 0 && strcmp(inner, "verbs") != 0) {
        test_skip(test, "needs the tcp or verbs provider under test (primary fault:tcp or "
                        "fault:verbs, fallback tcp)");
        return 1;
    }
    snprintf(rs_prov, sizeof(rs_prov), "fault:%s", inner);
    it_setenv("EXS_FALLBACK", policy);
    it_setenv("EXS_FALLBACK_PORT_OFFSET", "1000");
    it_provider = rs_prov;
    it_init();
    it_provider = saved;
    return 0;
}

static void rs_teardown(void)
{
    it_teardown();
    it_fault_params_reset();
}

/* The SESSION token of fd's connection, and its provider's name into *prov. */
static uint64_t fd_token(int fd, const char **prov)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    uint64_t t;

    ck_assert_msg(s != NULL, "fd %d: no socket (%d)", fd, err);
    ck_assert_ptr_nonnull(s->conn);
    EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
    t = s->conn->sess_token;
    EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
    *prov = exs__prov_name(s->conn->ctx);
    exs__api_sock_put(s);
    return t;
}

/* fd_token once it is not 0, waiting up to IT_TIMEOUT_MS for it. The active side learns
 * the token from the passive side's SESSION record (spec/protocol.md §9.2, Identity),
 * sent at the passive side's ESTABLISHED: over rdma_cm that follows the active side's
 * ESTABLISHED, so its CONNECT event may come before the record arrives. */
static uint64_t fd_token_wait(int fd, const char **prov)
{
    double deadline = it_now_ms() + IT_TIMEOUT_MS;
    uint64_t t;

    while (!(t = fd_token(fd, prov)) && it_now_ms() < deadline)
        it_sleep_ms(1);
    return t;
}

/* len bytes of pattern seed from fd a to fd b, every byte verified (stream receives are
 * repeated until all are in; SEQPACKET: one message). */
static void rs_xfer(int a, exs_qhandle_t qa, int b, exs_qhandle_t qb, size_t len, uint32_t seed)
{
    struct it_buf *s = it_buf_new(len, 1), *r = it_buf_new(len, 1);
    size_t got = 0;
    exs_event_t ev;

    it_fill(s->p, len, seed);
    IT_POST_SEND(a, s->p, len, qa, IT_AH(seed), s->mh);
    while (got < len) {
        IT_POST_RECV(b, r->p + got, len - got, qb, IT_AH(seed), r->mh);
        it_wait_event(qb, EXS_EVT_RECV, b, &ev);
        ck_assert_msg(ev.exs_evt_errno == 0, "recv errno %d", ev.exs_evt_errno);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    it_expect_send(qa, a, IT_AH(seed), (ssize_t)len);
    ck_assert_int_eq(it_check(r->p, len, seed), -1);
    ck_assert(it_buf_guards_ok(r));
    it_buf_free(s);
    it_buf_free(r);
}

/* Policy any (_i 0, 1) gives both ends of a connection on the primary the same SESSION
 * token; policy connect (_i 2, 3) none. Several MiB flow both ways, every byte verified,
 * and an orderly close is no path failure. */
START_TEST(test_rs_session)
{
    int type = _i & 1 ? SOCK_STREAM : SOCK_SEQPACKET;
    int any = _i < 2;
    uint64_t sess0, fail0, tc, ts;
    const char *pc, *ps;
    struct it_pair p;

    if (rs_init("test_rs_session", any ? "any" : "connect"))
        return;
    ck_assert_int_eq(exs__engine_fallback_policy(), any ? EXS_ENG_FB_ANY : EXS_ENG_FB_CONNECT);
    sess0 = it_fallback_count("fallback_sessions");
    fail0 = it_fallback_count("fallback_resume_failures");
    it_pair_open(&p, type, 16, 16);
    /* the passive side has its token from its ESTABLISHED on (before its ACCEPT event);
     * the active side once the SESSION record arrived */
    ts = fd_token(p.sfd, &ps);
    tc = any ? fd_token_wait(p.cfd, &pc) : fd_token(p.cfd, &pc);
    ck_assert_str_eq(pc, rs_prov);
    ck_assert_str_eq(ps, rs_prov);
    if (any) {
        ck_assert_uint_ne(ts, 0);
        ck_assert_uint_eq(tc, ts);
    } else {
        ck_assert_uint_eq(tc, 0);
        ck_assert_uint_eq(ts, 0);
    }
    rs_xfer(p.cfd, p.cq, p.sfd, p.sq, type == SOCK_STREAM ? RS_TOTAL : RS_MSG, 1);
    rs_xfer(p.sfd, p.sq, p.cfd, p.cq, type == SOCK_STREAM ? RS_TOTAL : RS_MSG, 2);
    /* a SESSION record sent would have arrived before the data behind it */
    ck_assert_uint_eq(fd_token(p.cfd, &pc), tc);
    it_pair_close(&p);
    ck_assert_uint_eq(it_fallback_count("fallback_sessions") - sess0, any ? 2 : 0);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
}
END_TEST

/* Past what was delivered, r holds nothing but untouched bytes (0) or the bytes that
 * belong exactly there (those of s at the same offset): a write whose receive completion
 * then failed may have placed its data (RDMA semantics; the fault provider's injected
 * error on a receive completion does exactly that), but no byte lands anywhere else. */
static int rs_only_own_bytes(const uint8_t *r, const uint8_t *s, size_t from, size_t total)
{
    for (size_t k = from; k < total; k++)
        if (r[k] && r[k] != s[k])
            return 0;
    return 1;
}

/* The cuts that are not resumed: policy connect, SEQPACKET or STREAM, by a drop or an
 * error completion (SEQPACKET with policy any: test_rs_resume_seqpacket and
 * test_rs_cut_announced). */
static const struct {
    int type, wc, any;
} rs_cut_cases[] = {
    {SOCK_SEQPACKET, 0, 0},
    {SOCK_STREAM, 0, 0},
    {SOCK_STREAM, 1, 0},
};
#define RS_CUT_CASES (int)(sizeof(rs_cut_cases) / sizeof(rs_cut_cases[0]))

/* A transfer of 4 MiB cut mid-way by an injected drop or error completion, not resumed:
 * with policy any each end's path failure is counted once as not resumed; with policy
 * connect nothing is counted. Either way what arrived before the cut is intact and in
 * order (STREAM: a prefix of the stream; SEQPACKET: whole messages, in order, none
 * twice), no byte lands where it does not belong (rs_only_own_bytes), every operation
 * completes, the connection is over on both ends, and nothing leaks (it_teardown). */
START_TEST(test_rs_cut)
{
    int type = rs_cut_cases[_i].type;
    int wc = rs_cut_cases[_i].wc, any = rs_cut_cases[_i].any;
    struct it_buf *s, *r;
    uint64_t fail0;
    struct it_pair p;
    exs_event_t ev;
    char port[16];
    int failed = 0;

    it_context("%s, %s, policy %s", type == SOCK_STREAM ? "STREAM" : "SEQPACKET",
               wc ? "error completion" : "drop", any ? "any" : "connect");
    if (rs_init("test_rs_cut", any ? "any" : "connect"))
        return;
    it_pair_open(&p, type, 256, 256);
    fail0 = it_fallback_count("fallback_resume_failures");
    s = it_buf_new(RS_TOTAL, 1);
    r = it_buf_new(RS_TOTAL, 1);
    it_fill(s->p, RS_TOTAL, 7);
    memset(r->p, 0, RS_TOTAL);
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    it_fault_set("fault_port", port);
    if (wc) {
        it_fault_set("fault_wc_status", "0");
        it_fault_set("fault_wc_nth", "8");
    } else {
        it_fault_set("fault_drop_nth", "8");
    }
    if (type == SOCK_STREAM) {
        size_t got = 0;

        IT_POST_SEND(p.cfd, s->p, RS_TOTAL, p.cq, IT_AH(1), s->mh);
        while (got < RS_TOTAL) {
            IT_POST_RECV(p.sfd, r->p + got, RS_TOTAL - got, p.sq, IT_AH(2), r->mh);
            it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
            if (ev.exs_evt_errno) {
                failed++;
                break;
            }
            ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
            got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        }
        /* a prefix of the stream, nothing foreign after it */
        ck_assert_int_eq(it_check(r->p, got, 7), -1);
        ck_assert(rs_only_own_bytes(r->p, s->p, got, RS_TOTAL));
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        failed += ev.exs_evt_errno != 0;
    } else {
        uint32_t next = 0;

        for (uint32_t i = 0; i < RS_NMSG; i++)
            IT_POST_RECV(p.sfd, r->p + (size_t)i * RS_MSG, RS_MSG, p.sq, IT_AH(100 + i), r->mh);
        for (uint32_t i = 0; i < RS_NMSG; i++)
            IT_POST_SEND(p.cfd, s->p + (size_t)i * RS_MSG, RS_MSG, p.cq, IT_AH(200 + i), s->mh);
        /* receives complete in posting order: the delivered ones first, each whole */
        for (uint32_t i = 0; i < RS_NMSG; i++) {
            it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
            ck_assert_int_eq(IT_AHN(ev.exs_evt_ahandle), 100 + i);
            if (ev.exs_evt_errno) {
                failed++;
                continue;
            }
            ck_assert_msg(next == i, "message %u delivered after a failed receive", i);
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, RS_MSG);
            next++;
        }
        ck_assert_int_eq(it_check(r->p, (size_t)next * RS_MSG, 7), -1);
        ck_assert(rs_only_own_bytes(r->p, s->p, (size_t)next * RS_MSG, RS_TOTAL));
        for (uint32_t i = 0; i < RS_NMSG; i++) {
            it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
            failed += ev.exs_evt_errno != 0;
        }
    }
    it_fault_set("fault_drop_nth", "0");
    it_fault_set("fault_wc_nth", "0");
    ck_assert_msg(failed > 0, "the injected fault cut nothing");
    /* the connection is over on both ends: a new receive fails at once */
    IT_POST_RECV(p.cfd, r->p, 64, p.cq, IT_AH(3), r->mh);
    it_wait_event(p.cq, EXS_EVT_RECV, p.cfd, &ev);
    ck_assert_int_ne(ev.exs_evt_errno, 0);
    IT_POST_RECV(p.sfd, r->p, 64, p.sq, IT_AH(4), r->mh);
    it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
    ck_assert_int_ne(ev.exs_evt_errno, 0);
    /* each end counted once (both conns are in this process), before its operations
     * were completed */
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures") - fail0, any ? 2 : 0);
    it_buf_free(s);
    it_buf_free(r);
    it_pair_close(&p);
}
END_TEST

/* The provider name of fd's connection now. */
static const char *fd_prov(int fd)
{
    const char *prov;

    (void)fd_token(fd, &prov);
    return prov;
}

/* Attempts of a resumed cut (test_rs_resume, test_rs_resume_seqpacket); the last injects
 * its error completion on the sender's endpoint alone (rs_fault_port). */
#define RS_ATTEMPTS 8

/* Into port, the fault_port (fault provider) an attempt of a resumed cut selects on the
 * pair p: the listener's port (both endpoints: the active one connected to it, the passive
 * one has it as its local port), or with sender_only the active side's own local port,
 * which selects the sender's endpoint alone (the passive endpoint's local port is the
 * listener's and it connected to no port). An error completion there is always resumable:
 * what the sender saw completed arrived (§9.2, Positions); on the receiver's endpoint it
 * may fail a receive whose write the sender saw acknowledged, which is not. */
static void rs_fault_port(const struct it_pair *p, int sender_only, char *port, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    unsigned n = ntohs(p->addr.sin_port);

    if (sender_only) {
        int err = 0;
        struct api_sock *s = exs__api_sock_get(p->cfd, &err);

        ck_assert_msg(s != NULL, "fd %d: no socket (%d)", p->cfd, err);
        ck_assert_ptr_nonnull(s->conn);
        ck_assert_int_eq(exs__prov_ep_local_addr(s->conn->ep, &ss, &sl), 0);
        exs__api_sock_put(s);
        ck_assert_int_eq(ss.ss_family, AF_INET);
        n = ntohs(((const struct sockaddr_in *)&ss)->sin_port);
        ck_assert_uint_ne(n, ntohs(p->addr.sin_port));
    }
    snprintf(port, len, "%u", n);
}

/* After a resumed cut: one resume per end and no failure, both ends on tcp, and both
 * continue (RS_TOTAL each way, verified) and close cleanly. */
static void rs_after_resume(struct it_pair *p, uint64_t res0, uint64_t fail0)
{
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
    ck_assert_str_eq(fd_prov(p->cfd), "tcp");
    ck_assert_str_eq(fd_prov(p->sfd), "tcp");
    rs_xfer(p->cfd, p->cq, p->sfd, p->sq, RS_TOTAL, 11);
    rs_xfer(p->sfd, p->sq, p->cfd, p->cq, RS_TOTAL, 12);
    it_pair_close(p);
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
}

/* A STREAM transfer of 4 MiB cut mid-way by an injected drop (_i & 1 == 0) or error
 * completion (_i & 1), in ring (indirect, _i & 2 == 0) or direct mode, policy any: the
 * connection continues over the fallback (tcp): every byte arrives once and in order and
 * is verified, the send completes whole, each end counts one fallback_resumes and no
 * failure, both connections run on tcp afterwards, a new 4 MiB transfer each way is
 * verified, and both ends close cleanly with nothing leaked (it_teardown). A receive
 * completion failed by the fault after its write was acknowledged makes the resume
 * impossible (§9.2, Positions): such a run is repeated with the next fault position; the
 * last attempt's error completion is on the sender's endpoint (rs_fault_port), where the
 * resume is certain, so at least one resume is required. */
START_TEST(test_rs_resume)
{
    int wc = _i & 1, direct = (_i & 2) != 0;
    uint64_t res0, fail0, rep0;
    int resumed = 0;

    it_context("STREAM, %s, %s mode", wc ? "error completion" : "drop",
               direct ? "direct" : "indirect");
    it_setenv("EXS_XFER_MODE", direct ? "direct" : "indirect");
    if (rs_init("test_rs_resume", "any"))
        return;
    for (int attempt = 0; attempt < RS_ATTEMPTS && !resumed; attempt++) {
        struct it_buf *s = it_buf_new(RS_TOTAL, 1), *r = it_buf_new(RS_TOTAL, 1);
        int last = attempt == RS_ATTEMPTS - 1;
        struct it_pair p;
        exs_event_t ev;
        char port[16], nth[16];
        size_t got = 0;
        int failed = 0;

        it_pair_open(&p, SOCK_STREAM, 256, 256);
        res0 = it_fallback_count("fallback_resumes");
        fail0 = it_fallback_count("fallback_resume_failures");
        rep0 = it_fallback_count("fallback_replayed_bytes");
        it_fill(s->p, RS_TOTAL, 7 + (uint32_t)attempt);
        memset(r->p, 0, RS_TOTAL);
        rs_fault_port(&p, wc && last, port, sizeof(port));
        snprintf(nth, sizeof(nth), "%d", 6 + attempt);
        it_fault_set("fault_port", port);
        it_fault_set(wc ? "fault_wc_nth" : "fault_drop_nth", nth);
        IT_POST_SEND(p.cfd, s->p, RS_TOTAL, p.cq, IT_AH(1), s->mh);
        while (got < RS_TOTAL) {
            /* receives of 256 KiB: in direct mode, one write each */
            IT_POST_RECV(p.sfd, r->p + got, EXS_MIN(RS_TOTAL - got, (size_t)256 * 1024), p.sq,
                         IT_AH(2), r->mh);
            it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
            if (ev.exs_evt_errno) {
                failed = 1;
                break;
            }
            ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
            got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        }
        it_fault_set("fault_drop_nth", "0");
        it_fault_set("fault_wc_nth", "0");
        /* every byte that arrived is the stream's, in order, none twice */
        ck_assert_int_eq(it_check(r->p, got, 7 + (uint32_t)attempt), -1);
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        if (failed) {
            /* the fault failed a receive completion whose write the sender had seen
             * acknowledged: not resumable; ended cleanly, counted once per end */
            ck_assert_msg(wc, "a drop was not resumed");
            ck_assert_msg(!last, "an error completion on the sender's endpoint was not resumed");
            ck_assert_int_ne(ev.exs_evt_errno, 0);
            ck_assert_uint_eq(it_fallback_count("fallback_resume_failures") - fail0, 2);
            it_buf_free(s);
            it_buf_free(r);
            it_pair_close(&p);
            continue;
        }
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)RS_TOTAL);
        ck_assert(it_buf_guards_ok(r));
        /* it was cut and resumed, over tcp now; both ends continue */
        ck_assert_uint_ge(it_fallback_count("fallback_replayed_bytes"), rep0);
        rs_after_resume(&p, res0, fail0);
        it_buf_free(s);
        it_buf_free(r);
        resumed = 1;
    }
    ck_assert_msg(resumed, "no cut was resumed in %d attempts", RS_ATTEMPTS);
}
END_TEST

/* The ADVERTs fd's connection holds (receives of the peer it may write into), or with
 * announced set the announced messages it holds, not read yet. */
static uint32_t fd_conn_count(int fd, int announced)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    uint32_t n;

    ck_assert_msg(s != NULL, "fd %d: no socket (%d)", fd, err);
    ck_assert_ptr_nonnull(s->conn);
    EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
    n = announced ? s->conn->pending_announced : s->conn->adv_count;
    EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
    exs__api_sock_put(s);
    return n;
}

/* SEQPACKET messages of the resume test. Direct mix: 100 B (eager), 16 KiB (direct, one
 * write) and 1 MiB (direct, in frag_size pieces) in turn, 4 MiB and more in all, into
 * receives of 1 MiB advertised before the first send. Ring mode: 100 B, 1000 B and
 * 3000 B (eager, batched when close together) in turn, each received by a receive of
 * its own length (not advertised) posted one after the other while the sender runs
 * ahead (fewer than EXS_SOCK_MAX_OPS), so the receiver's ring holds messages at the cut. */
#define RS_SP_NMSG      12u
#define RS_SP_NMSG_RING 900u
#define RS_SP_BUF       ((size_t)1024 * 1024)
#define RS_SP_BUF_RING  ((size_t)4096)

static size_t rs_sp_len(int ring, uint32_t i)
{
    static const size_t len[2][3] = {{100, 16 * 1024, RS_SP_BUF}, {100, 1000, 3000}};

    return len[ring][i % 3];
}

/* A SEQPACKET transfer (rs_sp_len) cut mid-way by an injected drop (_i & 1 == 0) or
 * error completion (_i & 1), direct mix (_i & 2 == 0) or ring mode, policy any, no
 * message announced at the cut (those: test_rs_cut_announced): the connection
 * continues over the fallback (tcp): every message arrives exactly once, in order,
 * whole and verified (eager ones still in the old ring delivered from it), every send
 * completes once and whole, each end counts one fallback_resumes and no failure, both
 * connections run on tcp afterwards, a 4 MiB message each way is verified, and both ends
 * close cleanly with nothing leaked (it_teardown). A receive completion failed by the
 * fault after its write was acknowledged makes the resume impossible (§9.2, Positions):
 * such a run is repeated with the next fault position; the last attempt's error
 * completion is on the sender's endpoint (rs_fault_port), where the resume is certain, so
 * at least one resume is required. */
START_TEST(test_rs_resume_seqpacket)
{
    int wc = _i & 1, ring = (_i & 2) != 0;
    uint32_t nmsg = ring ? RS_SP_NMSG_RING : RS_SP_NMSG;
    size_t slot = ring ? RS_SP_BUF_RING : RS_SP_BUF;
    int resumed = 0;

    it_context("SEQPACKET, %s, %s", wc ? "error completion" : "drop",
               ring ? "ring mode" : "direct mix");
    if (rs_init("test_rs_resume_seqpacket", "any"))
        return;
    for (int attempt = 0; attempt < RS_ATTEMPTS && !resumed; attempt++) {
        struct it_buf *s = it_buf_new(slot * nmsg, 1), *r = it_buf_new(slot * nmsg, 1);
        int last = attempt == RS_ATTEMPTS - 1;
        uint8_t *seen = calloc(nmsg, 1);
        uint64_t res0, fail0, t0;
        uint32_t seed = 21 + (uint32_t)attempt;
        struct it_pair p;
        exs_event_t ev;
        char port[16], nth[16];
        int failed = 0;

        ck_assert_ptr_nonnull(seen);
        it_pair_open(&p, SOCK_SEQPACKET, 4096, 4096);
        res0 = it_fallback_count("fallback_resumes");
        fail0 = it_fallback_count("fallback_resume_failures");
        it_fill(s->p, slot * nmsg, seed);
        memset(r->p, 0, slot * nmsg);
        if (!ring) {
            for (uint32_t i = 0; i < nmsg; i++)
                IT_POST_RECV(p.sfd, r->p + i * slot, slot, p.sq, IT_AH(100 + i), r->mh);
            /* every receive advertised at the sender before the first send: no message
             * of the old path is announced */
            t0 = exs__now_ns();
            while (fd_conn_count(p.cfd, 0) < nmsg) {
                ck_assert_msg(exs__now_ns() - t0 < (uint64_t)2 * IT_TIMEOUT_MS * 1000000u,
                              "only %u of %u receives advertised", fd_conn_count(p.cfd, 0), nmsg);
                exs_qdequeue(p.sq, NULL, 0, NULL);
                exs_qdequeue(p.cq, NULL, 0, NULL);
                usleep(1000);
            }
        }
        rs_fault_port(&p, wc && last, port, sizeof(port));
        snprintf(nth, sizeof(nth), "%d", 6 + attempt);
        it_fault_set("fault_port", port);
        it_fault_set(wc ? "fault_wc_nth" : "fault_drop_nth", nth);
        for (uint32_t i = 0; i < nmsg; i++)
            IT_POST_SEND(p.cfd, s->p + i * slot, rs_sp_len(ring, i), p.cq, IT_AH(100000 + i),
                         s->mh);
        /* receives complete in posting order, each with its own message, whole */
        for (uint32_t i = 0; i < nmsg; i++) {
            if (ring)
                IT_POST_RECV(p.sfd, r->p + i * slot, rs_sp_len(ring, i), p.sq, IT_AH(100 + i),
                             r->mh);
            it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
            ck_assert_int_eq(IT_AHN(ev.exs_evt_ahandle), 100 + i);
            if (ev.exs_evt_errno) {
                failed++;
                if (ring)
                    break;
                continue;
            }
            ck_assert_msg(!failed, "message %u delivered after a failed receive", i);
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)rs_sp_len(ring, i));
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_flags & MSG_TRUNC, 0);
            ck_assert_msg(memcmp(r->p + i * slot, s->p + i * slot, rs_sp_len(ring, i)) == 0,
                          "message %u: content differs", i);
            ck_assert(rs_only_own_bytes(r->p + i * slot, s->p + i * slot, 0, slot));
        }
        /* every send completes once (an announced one at its READ_DONE: not
         * necessarily in posting order), whole unless the cut was not resumed */
        for (uint32_t i = 0; i < nmsg; i++) {
            uint32_t k;

            it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
            k = (uint32_t)IT_AHN(ev.exs_evt_ahandle) - 100000;
            ck_assert_uint_lt(k, nmsg);
            ck_assert_msg(!seen[k], "send %u completed twice", k);
            seen[k] = 1;
            if (!failed) {
                ck_assert_int_eq(ev.exs_evt_errno, 0);
                ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result,
                                 (ssize_t)rs_sp_len(ring, k));
            }
        }
        free(seen);
        it_fault_set("fault_drop_nth", "0");
        it_fault_set("fault_wc_nth", "0");
        if (failed) {
            /* a receive completion failed after its write was acknowledged: not
             * resumable; ended cleanly, counted once per end */
            ck_assert_msg(wc, "a drop was not resumed");
            ck_assert_msg(!last, "an error completion on the sender's endpoint was not resumed");
            ck_assert_uint_eq(it_fallback_count("fallback_resume_failures") - fail0, 2);
            it_buf_free(s);
            it_buf_free(r);
            it_pair_close(&p);
            continue;
        }
        ck_assert(it_buf_guards_ok(r));
        /* it was cut and resumed, over tcp now; both ends continue */
        rs_after_resume(&p, res0, fail0);
        it_buf_free(s);
        it_buf_free(r);
        resumed = 1;
    }
    ck_assert_msg(resumed, "no cut was resumed in %d attempts", RS_ATTEMPTS);
}
END_TEST

/* Messages of the announced cut: 1 MiB each (above the eager threshold; sent before any
 * receive is posted, so none is direct: all are announced), read in 4 KiB pieces. */
#define RS_AN_MSG  ((size_t)1024 * 1024)
#define RS_AN_NMSG 6u

/* A SEQPACKET cut, policy any, while the receiver holds announced messages it has not
 * read whole: RS_AN_NMSG sends of 1 MiB, all announced before the first receive is
 * posted; then the fault drops the link at the first (_i 0), the 40th (_i 1) or the
 * 400th (_i 2) send post from there, which are the READ pieces (frag_size 4 KiB: 256 of
 * them per message) and READ_DONEs of the receives posted meanwhile: the first READ, a
 * READ of message 0 with pieces in flight, or later (message 0 read whole, its READ_DONE
 * perhaps lost). The messages the receiver held are announced again on the new path
 * (§9.2, Replay, SEQPACKET): every receive gets its own message exactly once, in order,
 * whole and verified, every send completes once and whole, each end counts one resume
 * and no failure, both continue on tcp (4 MiB each way verified) and close cleanly, and
 * nothing leaks (it_teardown). Without the re-announce the cut ends the connection (the
 * receives fail). */
START_TEST(test_rs_cut_announced)
{
    static const char *const nth[] = {"1", "40", "400"};
    struct it_buf *s, *r;
    uint64_t res0, fail0, t0;
    uint8_t seen[RS_AN_NMSG] = {0};
    struct it_pair p;
    exs_event_t ev;
    char port[16];

    it_context("drop at send post %s after the announces", nth[_i]);
    it_setenv("EXS_FRAG_SIZE", "4096");
    if (rs_init("test_rs_cut_announced", "any"))
        return;
    it_pair_open(&p, SOCK_SEQPACKET, 256, 256);
    res0 = it_fallback_count("fallback_resumes");
    fail0 = it_fallback_count("fallback_resume_failures");
    s = it_buf_new(RS_AN_MSG * RS_AN_NMSG, 1);
    r = it_buf_new(RS_AN_MSG * RS_AN_NMSG, 1);
    it_fill(s->p, RS_AN_MSG * RS_AN_NMSG, 5 + (uint32_t)_i);
    memset(r->p, 0, RS_AN_MSG * RS_AN_NMSG);
    for (uint32_t i = 0; i < RS_AN_NMSG; i++)
        IT_POST_SEND(p.cfd, s->p + (size_t)i * RS_AN_MSG, RS_AN_MSG, p.cq, IT_AH(200 + i), s->mh);
    t0 = exs__now_ns();
    while (fd_conn_count(p.sfd, 1) < RS_AN_NMSG) {
        ck_assert_msg(exs__now_ns() - t0 < (uint64_t)2 * IT_TIMEOUT_MS * 1000000u,
                      "only %u of %u messages announced", fd_conn_count(p.sfd, 1), RS_AN_NMSG);
        exs_qdequeue(p.sq, NULL, 0, NULL);
        exs_qdequeue(p.cq, NULL, 0, NULL);
        usleep(1000);
    }
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    it_fault_set("fault_port", port);
    it_fault_set("fault_drop_nth", nth[_i]);
    for (uint32_t i = 0; i < RS_AN_NMSG; i++)
        IT_POST_RECV(p.sfd, r->p + (size_t)i * RS_AN_MSG, RS_AN_MSG, p.sq, IT_AH(100 + i), r->mh);
    /* receives complete in posting order, each with its own message, whole, once */
    for (uint32_t i = 0; i < RS_AN_NMSG; i++) {
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_int_eq(IT_AHN(ev.exs_evt_ahandle), 100 + i);
        ck_assert_msg(ev.exs_evt_errno == 0, "receive %u: errno %d", i, ev.exs_evt_errno);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)RS_AN_MSG);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_flags & MSG_TRUNC, 0);
        ck_assert_msg(
            memcmp(r->p + (size_t)i * RS_AN_MSG, s->p + (size_t)i * RS_AN_MSG, RS_AN_MSG) == 0,
            "message %u: content differs", i);
    }
    /* every send completes once (at its READ_DONE), whole */
    for (uint32_t i = 0; i < RS_AN_NMSG; i++) {
        uint32_t k;

        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        k = (uint32_t)IT_AHN(ev.exs_evt_ahandle) - 200;
        ck_assert_uint_lt(k, RS_AN_NMSG);
        ck_assert_msg(!seen[k], "send %u completed twice", k);
        seen[k] = 1;
        ck_assert_msg(ev.exs_evt_errno == 0, "send %u: errno %d", k, ev.exs_evt_errno);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)RS_AN_MSG);
    }
    it_fault_set("fault_drop_nth", "0");
    ck_assert(it_buf_guards_ok(r));
    it_buf_free(s);
    it_buf_free(r);
    /* it was cut and resumed, over tcp now; both ends continue */
    rs_after_resume(&p, res0, fail0);
}
END_TEST

/* A resume that cannot be made (the listener, and with it the fallback listener, closed
 * before the cut: the new path's connect is refused) ends the connection cleanly: the
 * active side's send with ECONNRESET (refused), the passive side, which waited in
 * RESUMING for a new path, with ETIMEDOUT after connect_timeout_ms (without the cut-over
 * it would see ECONNRESET at once); each end counts one failure and no resume; nothing
 * leaks (it_teardown). _i 1: the passive side is closed while it waits (RESUMING, or
 * before it saw the failure): the close ends it at once, uncounted, so only the active
 * side's failure counts (without the cut-over both would). */
START_TEST(test_rs_resume_fails)
{
    struct it_buf *s, *r;
    uint64_t res0, fail0;
    struct it_pair p;
    exs_event_t ev;
    char port[16];
    int e;

    it_setenv("EXS_CONNECT_TIMEOUT_MS", "2000");
    it_setenv("EXS_SNDBUF", "0"); /* the send waits on the wire, not in the buffer */
    if (rs_init("test_rs_resume_fails", "any"))
        return;
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    res0 = it_fallback_count("fallback_resumes");
    fail0 = it_fallback_count("fallback_resume_failures");
    it_close(p.lfd, p.sq);
    p.lfd = -1;
    s = it_buf_new(RS_TOTAL, 1);
    r = it_buf_new(RS_TOTAL, 1);
    it_fill(s->p, RS_TOTAL, 5);
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    it_fault_set("fault_port", port);
    it_fault_set("fault_drop_nth", "4");
    IT_POST_SEND(p.cfd, s->p, RS_TOTAL, p.cq, IT_AH(2), s->mh);
    it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
    e = ev.exs_evt_errno;
    ck_assert_msg(e == ECONNRESET, "send errno %d (%s)", e, strerror(e));
    if (_i == 1) {
        it_close(p.sfd, p.sq);
        p.sfd = -1;
        it_fault_set("fault_drop_nth", "0");
        ck_assert_uint_eq(it_fallback_count("fallback_resume_failures") - fail0, 1);
        ck_assert_uint_eq(it_fallback_count("fallback_resumes"), res0);
        it_buf_free(s);
        it_buf_free(r);
        it_pair_close(&p);
        return;
    }
    /* bytes that arrived before the cut are handed out first, then the error */
    do {
        IT_POST_RECV(p.sfd, r->p, RS_TOTAL, p.sq, IT_AH(1), r->mh);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        e = ev.exs_evt_errno;
    } while (!e && ev.exs_evt_u.exs_evt_xfer.exs_evt_result > 0);
    it_fault_set("fault_drop_nth", "0");
    ck_assert_msg(e == ETIMEDOUT, "recv errno %d (%s)", e, strerror(e));
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures") - fail0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resumes"), res0);
    it_buf_free(s);
    it_buf_free(r);
    it_pair_close(&p);
}
END_TEST

/* A link gone silent (both ends frozen by the fault provider) under policy any: each end's
 * keepalive gives up (200 ms x 3), which is a path failure: the silent path is abandoned
 * (not drained) and the connection resumes over the fallback: the send that waited on the
 * frozen link completes, its bytes arrive verified, each end counts one resume, and
 * nothing leaks. */
START_TEST(test_rs_keepalive)
{
    struct it_buf *s, *r;
    uint64_t res0, fail0;
    struct it_pair p;
    exs_event_t ev;
    char port[16];

    it_setenv("EXS_KEEPALIVE_INTV_MS", "200");
    it_setenv("EXS_KEEPALIVE_PROBES", "3");
    it_setenv("EXS_SNDBUF", "0"); /* the STREAM send waits on the wire, not in the buffer */
    if (rs_init("test_rs_keepalive", "any"))
        return;
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    rs_xfer(p.cfd, p.cq, p.sfd, p.sq, 100000, 3);
    res0 = it_fallback_count("fallback_resumes");
    fail0 = it_fallback_count("fallback_resume_failures");
    s = it_buf_new(4096, 1);
    r = it_buf_new(4096, 1);
    it_fill(s->p, 4096, 4);
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    it_fault_set("fault_port", port);
    it_fault_set("fault_freeze_ms", "3600000");
    it_fault_set("fault_freeze_nth", "1");
    IT_POST_RECV(p.sfd, r->p, 4096, p.sq, IT_AH(1), r->mh);
    IT_POST_SEND(p.cfd, s->p, 4096, p.cq, IT_AH(2), s->mh);
    it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
    ck_assert_msg(ev.exs_evt_errno == 0, "send errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 4096);
    it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
    ck_assert_msg(ev.exs_evt_errno == 0, "recv errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 4096);
    ck_assert_int_eq(it_check(r->p, 4096, 4), -1);
    it_fault_set("fault_freeze_nth", "0");
    it_fault_set("fault_freeze_ms", "0"); /* thaw what is left */
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
    ck_assert_str_eq(fd_prov(p.cfd), "tcp");
    ck_assert_str_eq(fd_prov(p.sfd), "tcp");
    it_buf_free(s);
    it_buf_free(r);
    it_pair_close(&p);
}
END_TEST

/* A hello that passes the check, as a default STREAM peer with policy any sends it. */
static struct exs_wire_hello rs_hello(uint8_t hflags, uint16_t features)
{
    struct exs_wire_hello h = {
        .magic = htobe16(EXS_WIRE_MAGIC),
        .version = EXS_WIRE_VERSION,
        .sock_type = EXS_WIRE_SOCK_STREAM,
        .features = htobe16(features),
        .credits = htobe16(64),
        .ctrl_size = htobe32(EXS_WIRE_CTRL_MAX),
        .ring_size = htobe32(1u << 20),
        .ring_addr = htobe64(0x7f0000100000ull),
        .eager_max = htobe32(4096),
        .hflags = hflags,
    };
    return h;
}

/* The hello's resume flag (§9.2): only with feature bit 7 (else reason 6); a listener,
 * which holds no connection waiting for a new path, refuses a resume request with reason
 * 7 and never offers it to exs_accept: the exs_accept posted before it gets the ordinary
 * client that connects after it. Any provider. */
START_TEST(test_rs_resume_hello_refused)
{
    struct exs_wire_hello h = rs_hello(EXS_WIRE_HELLO_F_RESUME, EXS_WIRE_FEAT_ALL);
    struct exs_prov_ep_attr attr = {.max_send_wr = 16, .max_recv_wr = 16, .rnr_retry = 7};
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_cm_event ev;
    struct exs_wire_reject rej;
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_event_t cev;
    double end;
    char buf[16] = "after a resume", got[16];
    int lfd, cfd, sfd, n;

    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), EXS_WIRE_REJ_HELLO);
    h = rs_hello(EXS_WIRE_HELLO_F_RESUME, EXS_WIRE_FEAT_ALL | EXS_WIRE_FEAT_RESUMABLE);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), 0);
    h = rs_hello(0x80, EXS_WIRE_FEAT_ALL); /* an unknown flag is ignored */
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), 0);

    it_init();
    q = it_qcreate(8);
    lfd = it_listen(SOCK_STREAM, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    ck_assert_int_eq(exs__prov_open_default(&(struct exs_prov_attr){0}, &ctx), 0);
    ck_assert_int_eq(exs__prov_ep_create(ctx, &attr, &ep), 0);
    h = rs_hello(EXS_WIRE_HELLO_F_RESUME, EXS_WIRE_FEAT_ALL | EXS_WIRE_FEAT_RESUMABLE);
    ck_assert_int_eq(exs__prov_connect(ep, (struct sockaddr *)&addr, sizeof(addr), &h, sizeof(h)),
                     0);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while ((n = exs__prov_cm_poll(ctx, &ev)) == 0 && it_now_ms() < end)
        it_sleep_ms(1);
    ck_assert_msg(n == 1, "raw peer: no cm event within %d ms", IT_TIMEOUT_MS);
    ck_assert_int_eq(ev.type, EXS_PROV_CM_REJECTED);
    ck_assert_uint_ge(ev.private_data_len, sizeof(rej));
    memcpy(&rej, ev.private_data, sizeof(rej));
    ck_assert_uint_eq(be16toh(rej.magic), EXS_WIRE_MAGIC);
    ck_assert_uint_eq(rej.reason, EXS_WIRE_REJ_RESUME);
    exs__prov_ep_destroy(ep);
    exs__prov_ctx_close(ctx);

    /* the accept posted before the resume request takes the next ordinary client */
    cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(cfd, 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    sfd = cev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(sfd, 0);
    it_wait_event(q, EXS_EVT_CONNECT, cfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    memset(got, 0, sizeof(got));
    IT_EXPECT_OK(
        exs_recv(sfd, got, sizeof(got), MSG_WAITALL, q, IT_AH(3), EXS_MHANDLE_UNREGISTERED));
    IT_EXPECT_OK(exs_send(cfd, buf, sizeof(buf), 0, q, IT_AH(4), EXS_MHANDLE_UNREGISTERED));
    it_wait_event(q, EXS_EVT_RECV, sfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    ck_assert_mem_eq(got, buf, sizeof(buf));
    it_wait_event(q, EXS_EVT_SEND, cfd, &cev);
    ck_assert_int_eq(cev.exs_evt_errno, 0);
    it_close(cfd, q);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* A request-response exchange of 64 B messages (SEQPACKET, _i 0; STREAM with its send
 * buffer, _i 1), each side's small sends unsignaled (spec/protocol.md §6.4: done at the
 * post, each buffer overwritten right after its send event), the link dropped at the Nth
 * send post (N from 40 on: a write the peer never gets, most often an unsignaled one,
 * whose op was handed back at its post): both ends resume over tcp and every message
 * comes back once, whole and in order, the sends the peer did not get sent again from
 * their copies (§9.2, Replay). Without the copies the exchange stops at the lost one. */
#define RS_PP_LEN 64u
#define RS_PP_N   300u
START_TEST(test_rs_unsig_pingpong)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET, wa = _i ? MSG_WAITALL : 0;
    struct it_buf *cs, *cr, *sr;
    uint64_t res0, fail0, u0, u1, rep0;
    struct it_pair p;
    exs_event_t ev;
    char port[16];

    it_context("%s ping-pong, unsignaled sends, a drop", _i ? "STREAM" : "SEQPACKET");
    if (rs_init("test_rs_unsig_pingpong", "any"))
        return;
    cs = it_buf_new(RS_PP_LEN, 1);
    cr = it_buf_new(RS_PP_LEN, 1);
    sr = it_buf_new(RS_PP_LEN, 1);
    it_pair_open(&p, type, 256, 256);
    res0 = it_fallback_count("fallback_resumes");
    fail0 = it_fallback_count("fallback_resume_failures");
    rep0 = it_fallback_count("fallback_replayed_bytes");
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u0), 0);
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    it_fault_set("fault_port", port);
    it_fault_set("fault_drop_nth", "40");
    for (uint32_t i = 0; i < RS_PP_N; i++) {
        it_context("%s ping-pong, message %u", _i ? "STREAM" : "SEQPACKET", i);
        if (i == 60)
            it_fault_set("fault_drop_nth", "0"); /* one cut (the new path is tcp anyway) */
        IT_EXPECT_OK(exs_recv(p.sfd, sr->p, RS_PP_LEN, wa, p.sq, IT_AH(2), sr->mh));
        IT_EXPECT_OK(exs_recv(p.cfd, cr->p, RS_PP_LEN, wa, p.cq, IT_AH(3), cr->mh));
        it_fill(cs->p, RS_PP_LEN, 500 + i);
        IT_POST_SEND(p.cfd, cs->p, RS_PP_LEN, p.cq, IT_AH(1), cs->mh);
        it_expect_send(p.cq, p.cfd, IT_AH(1), (ssize_t)RS_PP_LEN);
        memset(cs->p, 0xee, RS_PP_LEN); /* the application reuses its buffer */
        it_expect_recv(p.sq, p.sfd, IT_AH(2), (ssize_t)RS_PP_LEN, 0);
        ck_assert_int_eq(it_check(sr->p, RS_PP_LEN, 500 + i), -1);
        IT_POST_SEND(p.sfd, sr->p, RS_PP_LEN, p.sq, IT_AH(4), sr->mh);
        it_expect_send(p.sq, p.sfd, IT_AH(4), (ssize_t)RS_PP_LEN);
        memset(sr->p, 0xdd, RS_PP_LEN);
        it_wait_event(p.cq, EXS_EVT_RECV, p.cfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)RS_PP_LEN);
        ck_assert_int_eq(it_check(cr->p, RS_PP_LEN, 500 + i), -1);
    }
    it_fault_set("fault_drop_nth", "0");
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u1), 0);
    ck_assert_msg(u1 - u0 > RS_PP_N, "only %" PRIu64 " of %u sends went unsignaled", u1 - u0,
                  2 * RS_PP_N);
    ck_assert_uint_gt(it_fallback_count("fallback_replayed_bytes"), rep0);
    rs_after_resume(&p, res0, fail0);
    it_buf_free(cs);
    it_buf_free(cr);
    it_buf_free(sr);
}
END_TEST

Suite *integ_resume_suite(void)
{
    Suite *s = suite_create("integ_resume");
    TCase *tc = it_tcase("resume", IT_CASE_TIMEOUT);

    tcase_add_checked_fixture(tc, NULL, rs_teardown);
    tcase_add_loop_test(tc, test_rs_session, 0, 4);
    tcase_add_loop_test(tc, test_rs_cut, 0, RS_CUT_CASES);
    tcase_add_loop_test(tc, test_rs_resume, 0, 4);
    tcase_add_loop_test(tc, test_rs_resume_seqpacket, 0, 4);
    tcase_add_loop_test(tc, test_rs_cut_announced, 0, 3);
    tcase_add_loop_test(tc, test_rs_resume_fails, 0, 2);
    tcase_add_test(tc, test_rs_keepalive);
    tcase_add_test(tc, test_rs_resume_hello_refused);
    tcase_add_loop_test(tc, test_rs_unsig_pingpong, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
