/* SPDX-License-Identifier: MIT */
/* Unsignaled small sends (spec/protocol.md §6.4) on the mock, attack review of issues 26,
 * 28: a connection that may be cut over (§9.2) ends a small send at its post and keeps a
 * copy of its bytes, so every send whose write was lost with the old path is replayed,
 * even once the application reused its buffer; and what a SEQPACKET send's success
 * promises the application (spec/api.md §6, exs_send(3)). */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

static struct pt_pair pp;

#define UC_NS   21 /* small sends at most */
#define UC_LEN  64 /* inline on the mock */
#define UC_RECV 1000u
static uint8_t uc_sb[UC_NS][UC_LEN], uc_rb[UC_NS * UC_LEN][UC_RECV];
static struct pt_op uc_s[UC_NS], uc_r[UC_NS * UC_LEN];
static int uc_nr;
static int uc_now; /* SEQPACKET sends with no op, as exs_send's at its post (send_now) */

static uint64_t uc_cnt(const char *set, const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup(set, name, &v), 0);
    return v;
}

/* A connected resumable pair of type (EXS_FALLBACK=any), credits for every send, a STREAM
 * sender with a send buffer for 64-byte sends (only its copies may go unsignaled),
 * unsignaled sends on, the fallback ctxs open. */
static void uc_open(int type)
{
    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    pt_params_resumable(&pp, type, 0);
    pp.pa.credits = pp.pb.credits = 64;
    if (type == SOCK_STREAM) {
        pp.pa.sndbuf = 4096;
        pp.pa.copy_max = UC_LEN;
    }
    pt_open(&pp, type);
    pt_connect(&pp);
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    pt_fb_open(&pp);
    exs__params.send_unsignaled = 1;
    pp.a.conn->batch_thresh = 0; /* each send its own write */
}

/* Send i (pattern offset off), unsignaled: an answer is taken to have come (quiet_armed:
 * a request-response exchange), its event at the post; then its buffer is overwritten,
 * as an application reusing it would. */
static void uc_send_quiet(int i, uint64_t off)
{
    uint64_t u0 = uc_cnt("proto", "sends_unsignaled");

    pp.a.conn->quiet_armed = 1;
    if (uc_now) {
        /* no op: exs__conn_send_now_begin/_post (seqpacket.c); uc_s[i] only records it */
        pt_fill(uc_sb[i], UC_LEN, off);
        ck_assert_int_eq(exs__conn_send_now_begin(pp.a.conn, UC_LEN), 1);
        ck_assert_int_eq(exs__conn_send_now_post(pp.a.conn, uc_sb[i], UC_LEN, 0), 1);
        exs__conn_unlock(pp.a.conn);
        memset(&uc_s[i], 0, sizeof(uc_s[i]));
        uc_s[i].done = 1;
        uc_s[i].op.result = UC_LEN;
    } else {
        pt_send_pattern(&uc_s[i], &pp.a, uc_sb[i], UC_LEN, off);
    }
    ck_assert_msg(uc_s[i].done, "send %d not done at its post", i);
    ck_assert_uint_eq(uc_cnt("proto", "sends_unsignaled"), u0 + 1);
    memset(uc_sb[i], 0xee, UC_LEN);
}

/* The keepalive answer of a (a NOP, a signaled control SEND), carried: its completion
 * retires the unsignaled writes posted before it (§6.4), so more may follow. */
static void uc_nop(void)
{
    pp.a.conn->keepalive.answer = 1;
    exs__conn_kick_locked(pp.a.conn);
    pt_fb_run(&pp);
    ck_assert_uint_eq(pp.a.conn->quiet_live, 0);
}

/* b receives until it has every byte a sent (*roff up to soff): none lost, twice or out
 * of order. */
static void uc_recv_all(uint64_t *roff, uint64_t soff)
{
    while (*roff < soff) {
        struct pt_op *r = &uc_r[uc_nr];

        ck_assert_int_lt(uc_nr, UC_NS * UC_LEN);
        pt_recv_post(r, &pp.b, uc_rb[uc_nr++], UC_RECV, 0);
        pt_fb_run(&pp);
        ck_assert_msg(r->done, "receive %d: nothing came (%llu of %llu bytes)", uc_nr,
                      (unsigned long long)*roff, (unsigned long long)soff);
        ck_assert_int_eq(r->op.err, 0);
        ck_assert_int_gt(r->op.result, 0);
        ck_assert_msg(pt_check(uc_rb[uc_nr - 1], (size_t)r->op.result, *roff),
                      "bytes at %llu are not the stream's", (unsigned long long)*roff);
        *roff += (uint64_t)r->op.result;
    }
    ck_assert_uint_eq(*roff, soff);
}

/* After a cut: both ends close cleanly over the fallback, no RNR, no fabric violation;
 * the ns sends and the receives made are released. */
static void uc_close(int ns)
{
    struct mock_stats st;

    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_fb_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    for (int i = 0; i < ns; i++)
        pt_op_fini(&uc_s[i]);
    for (int i = 0; i < uc_nr; i++)
        pt_op_fini(&uc_r[i]);
    for (int i = 0; i < 2; i++) {
        mock_stats(pt_fb.ctx[i], &st);
        ck_assert_uint_eq(st.rnr, 0);
    }
    pt_close(&pp);
    pt_fb_close();
    exs__params.send_unsignaled = 0;
    ck_assert_uint_eq(mock_violations(), 0);
}

/*
 * Both ends resumable (EXS_FALLBACK=any), unsignaled sends on: small sends, each its own
 * inline write, go unsignaled (counted in sends_unsignaled, each send's event at its
 * post, its buffer overwritten right after), then the link dies, both ends cut over to
 * the fallback ctxs. Every byte arrives once and in order after the cut: the sends the
 * peer did not get go again from their copies. Loops (even: SEQPACKET, odd: STREAM):
 * 0-1: 3 sends, none carried before the cut;
 * 2-3: 3 carried (in the peer's ring at the cut), 3 more not: only those go again;
 * 4-5: 10 carried, a NOP (signaled) retires them, 10 more not carried: 20 copies for a
 *      ring of 16, the 4 oldest given up (acknowledged), the last 10 go again.
 * Without the copies, the sends not carried are lost (a message missing, the stream's
 * bytes wrong); replayed from the application's buffers, their bytes would be 0xee.
 * Then one more small send goes unsignaled without a copy (cut over once: no second cut).
 * 6-8: as 0, 2, 4 (SEQPACKET), every send with no op (exs__conn_send_now_begin/_post:
 * exs_send's send that ends at its post keeps its copy the same way).
 */
START_TEST(uc_cut_replays_small)
{
    int now = _i >= 6, type = _i % 2 && !now ? SOCK_STREAM : SOCK_SEQPACKET;
    int bytes = type == SOCK_STREAM, sc = now ? _i - 6 : _i / 2, ns = 0;
    int carried = sc == 0 ? 0 : sc == 1 ? 3 : 10, lost = sc == 0 ? 3 : sc == 1 ? 3 : 10;
    uint64_t u0, res0, rb0, roff = 0, soff = 0, unit = bytes ? UC_LEN : 1;

    uc_open(type);
    uc_now = now;
    u0 = uc_cnt("proto", "sends_unsignaled");
    res0 = uc_cnt("fallback", "fallback_resumes");
    rb0 = uc_cnt("fallback", "fallback_replayed_bytes");
    uc_nr = 0;
    for (int i = 0; i < carried; i++, soff += UC_LEN)
        uc_send_quiet(ns++, soff);
    if (carried) {
        pt_fb_run(&pp); /* carried, and in the peer's ring */
        ck_assert_uint_eq(exs__resume_arrived_locked(pp.b.conn), carried * unit);
    }
    if (sc == 2)
        uc_nop();
    for (int i = 0; i < lost; i++, soff += UC_LEN)
        uc_send_quiet(ns++, soff);
    ck_assert_uint_eq(uc_cnt("proto", "sends_unsignaled"), u0 + (uint64_t)ns);
    ck_assert_ptr_nonnull(pp.a.conn->resume.quiet);
    ck_assert_uint_eq(pp.a.conn->resume.quiet->n, (uint32_t)EXS_MIN(ns, 16));
    /* the copies given up: past the 4th send (loops 4-5) */
    ck_assert_uint_eq(pp.a.conn->resume.quiet->floor, ns > 16 ? (uint64_t)(ns - 16) * unit : 0);
    pt_dispatch(&pp); /* posted, nothing more carried: lost with the link */
    mock_drop(pp.b.conn->ep);
    pt_fb_run(&pp);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_eq(pp.a.conn->ctx, pt_fb.ctx[0]);
    ck_assert_uint_eq(uc_cnt("fallback", "fallback_resumes"), res0 + 2);
    ck_assert_uint_eq(uc_cnt("fallback", "fallback_replayed_bytes"), rb0 + lost * UC_LEN);
    uc_recv_all(&roff, soff);
    ck_assert_ptr_null(pp.a.conn->resume.replay); /* the copies sent again were handed back */
    /* cut over once: the copies went, and a small send now goes unsignaled without one */
    ck_assert_ptr_null(pp.a.conn->resume.quiet);
    uc_send_quiet(ns++, soff);
    soff += UC_LEN;
    ck_assert_ptr_null(pp.a.conn->resume.quiet);
    uc_recv_all(&roff, soff);
    for (int i = 0; i < ns; i++)
        pt_assert_done(&uc_s[i], UC_LEN, 0);
    uc_now = 0;
    uc_close(ns);
}
END_TEST

/*
 * A hostile RESUME against the copies (§9.2, Positions): 20 unsignaled sends, a NOP
 * between the 10th and the 11th retiring them, all carried: the 4 oldest copies were
 * given up, so a RESUME stating a position below the 5th send is refused (the bytes
 * are nowhere: -EPROTO, a violation), one at the 5th or later is taken. Looped:
 * SEQPACKET, STREAM.
 */
START_TEST(uc_resume_below_copies)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    uint64_t unit = _i ? UC_LEN : 1, soff = 0, floor = 4 * unit;
    struct exs_wire_resume r;
    int ns = 0;

    uc_open(type);
    for (int i = 0; i < 20; i++, soff += UC_LEN) {
        if (i == 10)
            uc_nop();
        uc_send_quiet(ns++, soff);
    }
    pt_fb_run(&pp);
    ck_assert_uint_eq(pp.a.conn->resume.quiet->floor, floor);
    ck_assert_uint_eq(exs__resume_low_locked(pp.a.conn), floor);
    exs__resume_record_locked(pp.b.conn, &r); /* what b would state: everything arrived */
    ck_assert_uint_eq(be64toh(_i ? r.rx_bytes : r.rx_msgs), 20 * unit);
    ck_assert_int_eq(exs__resume_check_locked(pp.a.conn, &r), 0);
    for (int k = 0; k < 3; k++) {
        uint64_t p = k == 0 ? floor : k == 1 ? floor - 1 : 0;

        if (_i)
            r.rx_bytes = htobe64(p);
        else
            r.rx_msgs = htobe64(p);
        ck_assert_int_eq(exs__resume_check_locked(pp.a.conn, &r), k ? -EPROTO : 0);
    }
    for (int i = 0; i < ns; i++)
        pt_op_fini(&uc_s[i]);
    pt_close_both(&pp);
    pt_fb_close();
    exs__params.send_unsignaled = 0;
}
END_TEST

/*
 * The receiver's position is a prefix of what arrived (§9.2, Positions). Three
 * unsignaled messages of 40, 64 and 100 bytes are carried, the receiver's first receive
 * completion is reported in error (as the fault provider's wc fault does: the write had
 * landed), the two behind it succeed. The receiver takes neither (resume.rx_gap), states
 * position 0, and the sender, which saw no completion of any (they ended at their post),
 * sends all three again from their copies: each arrives once, whole, in order. Taking the
 * two behind the failed one would state 2 messages (SEQPACKET) or 164 bytes (STREAM)
 * that are not the first ones, and the first would be lost. Looped: SEQPACKET, STREAM.
 */
START_TEST(uc_rx_error_prefix)
{
    static const size_t lens[3] = {40, 64, 100};
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    uint64_t roff = 0, soff = 0, res0;
    struct exs_prov_cqe cqe[16];
    int n, got = 0;

    uc_open(type);
    if (type == SOCK_STREAM)
        pp.a.conn->p.copy_max = 128;
    res0 = uc_cnt("fallback", "fallback_resumes");
    uc_nr = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t u0 = uc_cnt("proto", "sends_unsignaled");

        pp.a.conn->quiet_armed = 1;
        pt_send_pattern(&uc_s[i], &pp.a, uc_sb[i], lens[i], soff);
        ck_assert_int_eq(uc_s[i].done, 1);
        ck_assert_uint_eq(uc_cnt("proto", "sends_unsignaled"), u0 + 1);
        memset(uc_sb[i], 0xee, lens[i]);
        soff += lens[i];
    }
    while (mock_step()) /* carried; b's completions wait in its queue */
        ;
    n = exs__prov_poll(pp.b.ctx, cqe, 16);
    for (int i = 0; i < n; i++) {
        if ((cqe[i].wr_id & 7) != 1 || cqe[i].status != EXS_PROV_WC_SUCCESS)
            continue;
        if (!got++)
            cqe[i].status = EXS_PROV_WC_REM_OP_ERR; /* the first receive: reported failed */
    }
    ck_assert_int_eq(got, 3);
    exs__conn_on_cqes(cqe, n);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_RESUMING);
    ck_assert_int_eq(pp.b.conn->resume.rx_gap, 1);
    ck_assert_uint_eq(exs__resume_arrived_locked(pp.b.conn), 0);
    pt_fb_run(&pp);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(uc_cnt("fallback", "fallback_resumes"), res0 + 2);
    uc_recv_all(&roff, soff);
    if (type == SOCK_SEQPACKET)
        for (int i = 0; i < uc_nr; i++)
            ck_assert_int_eq(uc_r[i].op.result, (ssize_t)lens[i]);
    uc_close(3);
}
END_TEST

/*
 * What a send's event promises when the link dies right after it (spec/protocol.md §6.4,
 * "What the sender is promised"; spec/api.md §6 "When a send completes", §6b). A 64-byte
 * message after an answer, the link dropped before the fabric carried it. Loops:
 * 0 SEQPACKET with EXS_SEND_UNSIGNALED=1 (the default): the send goes unsignaled and
 *   reports success at its post, as a kernel send() does; the message is lost with the
 *   link, and that loss is not silent: the peer's receive fails (ECONNRESET), no data;
 * 1 SEQPACKET with 0, 2 zero-copy STREAM with 1, 3 with 0: the stronger promise holds:
 *   either the send fails, or the peer's receive gets the message whole (a zero-copy
 *   STREAM send is never unsignaled: "completes when all its bytes were written").
 * (h52 found loop 2 reporting success for a lost zero-copy STREAM send, and loop 0
 * contradicting the docs of then; the docs now say what loop 0 checks.)
 */
START_TEST(uc_success_means_delivered)
{
    static uint8_t sb[UC_LEN], rb[UC_RECV];
    struct pt_op s, r;
    uint64_t n0, quiet;

    int type = _i < 2 ? SOCK_SEQPACKET : SOCK_STREAM;

    unit_pair_fresh(&pp, type, 0, 0);
    pt_connect(&pp);
    ck_assert_uint_eq(pp.a.conn->p.sndbuf, 0); /* STREAM: zero-copy */
    exs__params.send_unsignaled = _i % 2 == 0;
    n0 = exs__proto_counter("sends_unsignaled");
    pt_send_pattern(&s, &pp.a, sb, UC_LEN, 5);
    mock_drop(pp.a.conn->ep); /* before the fabric carried it */
    pt_run(&pp);
    ck_assert_int_eq(s.done, 1);
    pt_recv_post(&r, &pp.b, rb, UC_RECV, 0);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    quiet = exs__proto_counter("sends_unsignaled") - n0;
    ck_assert_uint_eq(quiet, _i == 0); /* only loop 0's send may go unsignaled */
    if (quiet) {
        /* success at the post; the loss shows on the peer's side as a failure */
        ck_assert_int_eq(s.op.result, UC_LEN);
        ck_assert_msg(r.op.result == -1 || (r.op.result == UC_LEN && pt_check(rb, UC_LEN, 5)),
                      "receive result %zd errno %d: neither failed nor got the message",
                      r.op.result, r.op.err);
    } else if (s.op.result == UC_LEN)
        ck_assert_msg(r.op.result == UC_LEN && pt_check(rb, UC_LEN, 5),
                      "the send reported success (%zd) but the peer's receive got result %zd "
                      "errno %d: the message was lost",
                      s.op.result, r.op.result, r.op.err);
    else
        ck_assert_int_eq(s.op.result, -1);
    pt_op_fini(&s);
    pt_op_fini(&r);
    pt_close_both(&pp);
    exs__params.send_unsignaled = 0;
    ck_assert_uint_eq(mock_violations(), 0);
}
END_TEST

Suite *proto_unsig_cut_suite(void)
{
    Suite *s = suite_create("proto_unsig_cut");
    TCase *tc = tcase_create("unsig_cut");

    tcase_add_loop_test(tc, uc_cut_replays_small, 0, 9);
    suite_add_tcase(s, tc);
    tc = tcase_create("unsig_rx_error");
    tcase_add_loop_test(tc, uc_rx_error_prefix, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("unsig_hostile");
    tcase_add_loop_test(tc, uc_resume_below_copies, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("unsig_promise");
    tcase_add_loop_test(tc, uc_success_means_delivered, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
