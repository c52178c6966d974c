/* SPDX-License-Identifier: MIT */
/* Ring autotuning on a resumable STREAM (spec/protocol.md §7.4, §9.2): a cut while the ring grows
 * resumes whole, and the ring is tuned again over the new path. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "exs/api/api_int.h"
#include "exs/prov/prov.h"
#include "exs/proto/proto.h"
#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "integ.h"
#include "tests/skip.h"

#define RR_RING  (16u * 1024u)   /* the initial ring (EXS_RING_SIZE) */
#define RR_MAX   (1024u * 1024u) /* EXS_RING_MAX: room to grow after the cut */
#define RR_XFER  (4u * 1024u * 1024u)
#define RR_RECV  (256u * 1024u)
#define RR_MID   4  /* mid-transfer cut positions */
#define RR_TRIES 16 /* transfers that may be needed for a resize (a generous bound) */

static char rr_prov[32];

/* Primary fault:tcp (fault:verbs with the verbs provider under test), fallback tcp with
 * an emulated 2 ms delay (the ring is limited by the round trip), policy any,
 * indirect transfers into a small ring that autotuning grows. 1: skipped. */
static int rr_init(const char *test)
{
    const char *saved = it_provider;
    const char *inner = strncmp(it_provider, "fault:", 6) == 0 ? it_provider + 6 : it_provider;
    char v[32];

    if (strcmp(inner, "tcp") != 0 && strcmp(inner, "verbs") != 0) {
        test_skip(test, "needs the tcp or verbs provider under test (primary fault:tcp or "
                        "fault:verbs, fallback tcp)");
        return 1;
    }
    snprintf(rr_prov, sizeof(rr_prov), "fault:%s", inner);
    it_setenv("EXS_FALLBACK", "any");
    it_setenv("EXS_FALLBACK_PORT_OFFSET", "1000");
    it_setenv("EXS_XFER_MODE", "indirect");
    snprintf(v, sizeof(v), "%u", RR_RING);
    it_setenv("EXS_RING_SIZE", v);
    snprintf(v, sizeof(v), "%u", RR_MAX);
    it_setenv("EXS_RING_MAX", v);
    it_setenv("EXS_RING_IDLE_MS", "300");
    /* a round trip long against the processing of a loaded machine: a ring-limited
     * sender moves about a ring per round trip, the growth rule's half is far (as
     * integ_ring's growth tests; 0.5 ms was not always enough) */
    it_setenv("EXS_EMU_DELAY_US", "2000");
    it_provider = rr_prov;
    it_init();
    it_provider = saved;
    return 0;
}

static void rr_teardown(void)
{
    it_teardown();
    it_fault_params_reset();
}

static void rr_stats(int fd, struct exs_sock_stats *st)
{
    socklen_t len = sizeof(*st);

    IT_EXPECT_OK(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, st, &len));
    ck_assert_uint_eq(len, sizeof(*st));
}

/* The provider of fd's connection now. */
static const char *rr_fd_prov(int fd)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    const char *prov;

    ck_assert_msg(s != NULL, "fd %d: no socket (%d)", fd, err);
    ck_assert_ptr_nonnull(s->conn);
    prov = exs__prov_name(s->conn->ctx);
    exs__api_sock_put(s);
    return prov;
}

/* RR_XFER bytes of pattern seed from the client to the server, received in pieces of at
 * most RR_RECV, every byte verified once and in order; the send completes whole. With
 * drop_nth, the fault provider drops the connection at that send post of the transfer
 * (a cut mid-transfer) and the resume must make it whole. */
static size_t rr_recv_len = RR_RECV; /* smaller: the reader lags, the ring holds bytes */

static void rr_xfer(struct it_pair *p, uint32_t seed, const char *drop_nth)
{
    struct it_buf *s = it_buf_new(RR_XFER, 1), *r = it_buf_new(RR_XFER, 1);
    char port[16];
    exs_event_t ev;
    size_t got = 0;

    it_fill(s->p, RR_XFER, seed);
    memset(r->p, 0, RR_XFER);
    if (drop_nth) {
        snprintf(port, sizeof(port), "%u", ntohs(p->addr.sin_port));
        it_fault_set("fault_port", port);
        it_fault_set("fault_drop_nth", drop_nth);
    }
    IT_POST_SEND(p->cfd, s->p, RR_XFER, p->cq, IT_AH(seed), s->mh);
    while (got < RR_XFER) {
        IT_POST_RECV(p->sfd, r->p + got, EXS_MIN(RR_XFER - got, rr_recv_len), p->sq,
                     IT_AH(seed + 1), r->mh);
        it_wait_event(p->sq, EXS_EVT_RECV, p->sfd, &ev);
        ck_assert_msg(ev.exs_evt_errno == 0, "recv errno %d after %zu bytes", ev.exs_evt_errno,
                      got);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    it_fault_set("fault_drop_nth", "0");
    it_expect_send(p->cq, p->cfd, IT_AH(seed), (ssize_t)RR_XFER);
    ck_assert_int_eq(it_check(r->p, RR_XFER, seed), -1);
    ck_assert(it_buf_guards_ok(r));
    it_buf_free(s);
    it_buf_free(r);
}

/* The receiver (fd) offers its peer a ring of size bytes itself (§7.4's switch, as
 * autotuning makes it): 0, or -EBUSY while a change is under way. */
static int rr_offer(int fd, uint32_t size)
{
    int err = 0, ret;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    ck_assert_ptr_nonnull(s);
    EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
    ret = exs__stream_ring_offer_locked(s->conn, size, 0);
    EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
    exs__api_sock_put(s);
    return ret;
}

/* 1 when the server's ring has an offer out (a shrink autotuning made while idle). */
static int rr_offer_out(int fd)
{
    int err = 0, out;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    ck_assert_ptr_nonnull(s);
    EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
    out = s->conn->autotune.offered;
    EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
    exs__api_sock_put(s);
    return out;
}

/* Transfers until autotuning resized the server's ring past `than` resizes (a grow under
 * traffic, or the idle shrink of a grown ring after it), a bounded number of times. The
 * resize count then. Whether the growth rule sees a ring-limited sender depends on the
 * round trip against the processing (rxe, a loaded host: often not), so the test does
 * not count on it: when the ring is at its initial size after a transfer, the test offers
 * a grow itself (§7.4's switch, as autotuning makes it; not counted as autotuning's), and
 * a grown ring idle for EXS_RING_IDLE_MS is offered back by autotuning's timer whatever
 * the load; that offer is answered with the writer's next writes. */
static uint64_t rr_resize_past(struct it_pair *p, uint64_t than, uint32_t seed)
{
    struct exs_sock_stats st;
    uint64_t own = 0; /* the test's own resizes */

    for (int i = 0; i < RR_TRIES; i++) {
        rr_xfer(p, seed + 2 * (uint32_t)i, NULL);
        rr_stats(p->sfd, &st);
        if (st.ring_resizes > than + own)
            return st.ring_resizes;
        if (st.ring_size <= RR_RING) {
            int ret = rr_offer(p->sfd, (uint32_t)st.ring_size * 4);

            ck_assert_msg(ret == 0 || ret == -EBUSY, "offer: %d", ret);
            own += ret == 0; /* switched to with the writes of the next transfer */
            continue;
        }
        /* grown: wait (bounded, generously) for the idle shrink's offer */
        int seen = 0;

        for (double end = it_now_ms() + 3 * IT_TIMEOUT_MS; !seen && it_now_ms() < end;) {
            rr_stats(p->sfd, &st);
            seen = st.ring_resizes > than + own || rr_offer_out(p->sfd);
            if (!seen)
                it_sleep_ms(20);
        }
        if (!seen)
            break; /* no autotuning on this connection */
    }
    rr_stats(p->sfd, &st);
    ck_assert_msg(st.ring_resizes > than + own,
                  "ring never resized past %" PRIu64 " (%" PRIu64 " by the test; size %" PRIu64
                  ", srtt %" PRIu64 " us, refused %" PRIu64 ", indirect %" PRIu64
                  ", direct %" PRIu64 ")",
                  than + own, own, st.ring_size, st.srtt_us, st.ring_grow_refused,
                  st.indirect_xfers, st.direct_xfers);
    return st.ring_resizes;
}

/* Wait (bounded) until n more resumes were counted than base. */
static void rr_wait_resumes(uint64_t base, uint64_t n)
{
    for (int w = 0; w < 1000 && it_fallback_count("fallback_resumes") - base < n; w++)
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000000}, NULL);
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - base, n);
}

/* A resumable STREAM whose receive ring autotuning grew (ring_resizes >= 1 before the
 * cut) is cut by an injected drop: mid-transfer (_i 0-3: at the 3rd, 8th, 21st or 55th
 * send post of the transfer, while the ring may be in any state of a resize; at the 8th
 * and 55th into receives of 4 KiB that leave ring bytes unread), or at the
 * very post of the receiver's RESIZE offer on an idle connection (_i 4: the cut finds
 * the offer out, it
 * dies with the old path, the new path's ring has the size of the current one). Each
 * resumes over tcp: every byte arrives once and in order, the send completes whole, one
 * resume per end and no failure; the ring is resized again over the new path; both
 * ends close cleanly with nothing leaked (it_teardown). Without autotuning on resumable
 * connections there is no resize before the cut. */
START_TEST(test_rr_cut_while_tuning)
{
    struct exs_sock_stats st;
    uint64_t res0, fail0, before;
    struct it_pair p;

    static const char *const nth[RR_MID] = {"3", "8", "21", "55"};

    it_context("cut %s%s", _i < RR_MID ? "mid-transfer at send post " : "at a RESIZE offer",
               _i < RR_MID ? nth[_i] : "");
    if (rr_init("test_rr_cut_while_tuning"))
        return;
    it_pair_open(&p, SOCK_STREAM, 256, 256);
    res0 = it_fallback_count("fallback_resumes");
    fail0 = it_fallback_count("fallback_resume_failures");
    before = rr_resize_past(&p, 0, 100);
    ck_assert_uint_ge(before, 1);
    if (_i < RR_MID) {
        rr_recv_len = _i & 1 ? 4096 : RR_RECV; /* odd: receives of 4 KiB, the ring fills */
        rr_xfer(&p, 200, nth[_i]);
        rr_recv_len = RR_RECV;
    } else {
        int err = 0;
        struct api_sock *s = exs__api_sock_get(p.sfd, &err);
        char port[16];
        uint64_t resizes;
        uint32_t size;
        int ret;

        ck_assert_ptr_nonnull(s);
        snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
        it_fault_set("fault_port", port);
        EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
        size = s->conn->p.ring_size;
        /* a shrink back (as autotuning offers when idle) may be under way: wait for it */
        for (int w = 0; w < 500 && (s->conn->autotune.offered || s->conn->autotune.old_mem); w++) {
            EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
            nanosleep(&(struct timespec){.tv_nsec = 20 * 1000000}, NULL);
            EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
            size = s->conn->p.ring_size;
        }
        resizes = s->conn->stats.ring_resizes;
        it_fault_set("fault_drop_nth", "1"); /* the next send post: the offer's */
        ret = exs__stream_ring_offer_locked(s->conn, size < RR_MAX ? size * 2 : size / 2, 0);
        EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
        ck_assert_msg(ret == 0, "offer: %d", ret);
        rr_wait_resumes(res0, 2);
        it_fault_set("fault_drop_nth", "0");
        rr_stats(p.sfd, &st);
        /* the offer died with the old path (never switched to); the new ring has the
         * size of the current one, unless an idle shrink over the new path came since */
        if (st.ring_resizes == resizes)
            ck_assert_uint_eq(st.ring_size, size);
        EXS_LITE_LOCK(&s->conn->lock, EXS_LOCK_CONN);
        ck_assert_ptr_null(s->conn->autotune.next_mem);
        EXS_LITE_UNLOCK(&s->conn->lock, EXS_LOCK_CONN);
        exs__api_sock_put(s);
        rr_xfer(&p, 300, NULL);
    }
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
    ck_assert_str_eq(rr_fd_prov(p.cfd), "tcp");
    ck_assert_str_eq(rr_fd_prov(p.sfd), "tcp");
    /* autotuning goes on over the new path */
    rr_stats(p.sfd, &st);
    (void)rr_resize_past(&p, st.ring_resizes, 400);
    rr_stats(p.sfd, &st);
    ck_assert_uint_ge(st.ring_size, RR_RING);
    ck_assert_uint_le(st.ring_size, RR_MAX);
    ck_assert_uint_eq(st.rnr_events, 0);
    it_pair_close(&p);
    ck_assert_uint_eq(it_fallback_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(it_fallback_count("fallback_resume_failures"), fail0);
}
END_TEST

Suite *integ_resume_ring_suite(void)
{
    Suite *s = suite_create("integ_resume_ring");
    TCase *tc = it_tcase("resume_ring", 240);

    tcase_add_checked_fixture(tc, NULL, rr_teardown);
    tcase_add_loop_test(tc, test_rr_cut_while_tuning, 0, RR_MID + 1);
    suite_add_tcase(s, tc);
    return s;
}
