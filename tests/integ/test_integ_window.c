/* SPDX-License-Identifier: MIT */
/* The seq-ack window (issue 13, spec/protocol.md §3.1): two sides that fill their windows at
 * once finish because of the NOP, and stall, provably, when the NOP is turned off. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "integ.h"
#include "tests/skip.h"

/* Credits per side (the window) and the messages each side sends: several windows. */
#define W_CREDITS  "8"
#define W_MSGS     24
#define W_LEN      64
/* A stall is declared when no send completes for this long. */
#define W_STALL_MS 3000
/* The NOP check runs about once a second: a generous bound for each completion. */
#define W_WAIT_MS  30000

/* EXS_WINDOW_TEST bits (exs/proto/proto_int.h): 1 no NOP, 2 no standalone ACK and no
 * credits in data immediates, 4 data never spends the last credit (X-RDMA's window). */
#define W_SEAM_WINDOW "6"
#define W_SEAM_NO_NOP "7"

static void get_stats(int fd, struct exs_sock_stats *st)
{
    socklen_t len = sizeof(*st);

    memset(st, 0, sizeof(*st));
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, st, &len), 0);
}

/* Both sides post W_MSGS sends of W_LEN bytes at once (message i of a side carries the
 * pattern of seed + i), nobody receives yet, so no ring space and no receive returns
 * credits: only the credit rules do. */
static void post_both(struct it_pair *p, struct it_buf *cb, struct it_buf *sb)
{
    for (int i = 0; i < W_MSGS; i++) {
        it_fill(cb->p + (size_t)i * W_LEN, W_LEN, 100 + (uint32_t)i);
        it_fill(sb->p + (size_t)i * W_LEN, W_LEN, 200 + (uint32_t)i);
    }
    for (int i = 0; i < W_MSGS; i++) {
        IT_POST_SEND(p->cfd, cb->p + (size_t)i * W_LEN, W_LEN, p->cq, IT_AH(1000 + i), cb->mh);
        IT_POST_SEND(p->sfd, sb->p + (size_t)i * W_LEN, W_LEN, p->sq, IT_AH(2000 + i), sb->mh);
    }
}

/* Receive W_MSGS * W_LEN bytes on fd and check them against the sender's patterns. */
static void recv_all(int fd, exs_qhandle_t q, struct it_buf *rb, uint32_t seed, int type)
{
    size_t got = 0, want = (size_t)W_MSGS * W_LEN;
    exs_event_t ev;
    int ah = 0;

    memset(rb->p, 0, want);
    while (got < want) {
        size_t ask = type == SOCK_SEQPACKET ? W_LEN : want - got;

        IT_POST_RECV(fd, rb->p + got, ask, q, IT_AH(3000 + ah), rb->mh);
        it_wait_event_at(q, EXS_EVT_RECV, fd, W_WAIT_MS, &ev, __FILE__, __LINE__);
        ck_assert_msg(ev.exs_evt_errno == 0 && ev.exs_evt_u.exs_evt_xfer.exs_evt_result > 0,
                      "receive %d: result %zd errno %d", ah,
                      (ssize_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result, ev.exs_evt_errno);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, IT_AH(3000 + ah));
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        ah++;
    }
    ck_assert_uint_eq(got, want);
    for (int i = 0; i < W_MSGS; i++)
        ck_assert_msg(it_check(rb->p + (size_t)i * W_LEN, W_LEN, seed + (uint32_t)i) == -1,
                      "message %d corrupt or out of order", i);
}

/* Count the sends of fd that complete (in order, without error) until none does for
 * W_STALL_MS or all did. */
static int sends_until_stall(exs_qhandle_t q, int fd, int base, int *next)
{
    exs_event_t ev;

    while (*next < W_MSGS && it_try_event(q, EXS_EVT_SEND, fd, W_STALL_MS, &ev)) {
        ck_assert_msg(ev.exs_evt_errno == 0, "send %d: errno %d", *next, ev.exs_evt_errno);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, IT_AH(base + *next));
        (*next)++;
    }
    return *next;
}

/* With X-RDMA's plain window (no standalone ACK, no credits in data, the last credit for
 * the NOP alone), both sides fill their windows at once and every send still completes,
 * in order and intact, because each side's window check sends a NOP (nops_sent). */
START_TEST(test_window_nop_unblocks)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct exs_sock_stats cst, sst;
    struct it_buf *cb, *sb, *rb;
    exs_event_t ev;
    struct it_pair p;
    uint64_t nops0 = 0, nops1 = 0;

    it_setenv("EXS_CREDITS", W_CREDITS);
    it_setenv("EXS_BATCH_MAX", "0"); /* one message, one credit */
    it_setenv("EXS_SNDBUF", "0");    /* STREAM sends zero-copy: they wait in the window */
    it_setenv("EXS_WINDOW_TEST", W_SEAM_WINDOW);
    it_init();
    exs__counters_lookup("proto", "nops_sent", &nops0);
    it_pair_open(&p, type, 2 * W_MSGS + 8, 2 * W_MSGS + 8);
    cb = it_buf_new((size_t)W_MSGS * W_LEN, 1);
    sb = it_buf_new((size_t)W_MSGS * W_LEN, 1);
    rb = it_buf_new((size_t)W_MSGS * W_LEN, 1);
    post_both(&p, cb, sb);
    for (int i = 0; i < W_MSGS; i++) {
        it_context("send %d", i);
        it_wait_event_at(p.cq, EXS_EVT_SEND, p.cfd, W_WAIT_MS, &ev, __FILE__, __LINE__);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, IT_AH(1000 + i));
        it_wait_event_at(p.sq, EXS_EVT_SEND, p.sfd, W_WAIT_MS, &ev, __FILE__, __LINE__);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, IT_AH(2000 + i));
    }
    get_stats(p.cfd, &cst);
    get_stats(p.sfd, &sst);
    ck_assert_msg(cst.nops_sent > 0 && sst.nops_sent > 0,
                  "nops_sent: client %llu, server %llu: something else returned the credits",
                  (unsigned long long)cst.nops_sent, (unsigned long long)sst.nops_sent);
    ck_assert_int_eq(exs__counters_lookup("proto", "nops_sent", &nops1), 0);
    ck_assert_uint_ge(nops1 - nops0, cst.nops_sent + sst.nops_sent);
    recv_all(p.sfd, p.sq, rb, 100, type);
    recv_all(p.cfd, p.cq, rb, 200, type);
    it_pair_close(&p);
    it_buf_free(cb);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* The same with the NOP turned off (seam bit 1): each side sends what its window allows
 * (at most the credits) and then nothing more completes: the deadlock the NOP breaks. */
START_TEST(test_window_no_nop_stalls)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct exs_sock_stats cst, sst;
    struct it_buf *cb, *sb;
    exs_event_t ev;
    struct it_pair p;
    int cn = 0, sn = 0;

    it_setenv("EXS_CREDITS", W_CREDITS);
    it_setenv("EXS_BATCH_MAX", "0");
    it_setenv("EXS_SNDBUF", "0"); /* STREAM sends zero-copy: they wait in the window */
    it_setenv("EXS_WINDOW_TEST", W_SEAM_NO_NOP);
    it_init();
    it_pair_open(&p, type, 2 * W_MSGS + 8, 2 * W_MSGS + 8);
    cb = it_buf_new((size_t)W_MSGS * W_LEN, 1);
    sb = it_buf_new((size_t)W_MSGS * W_LEN, 1);
    post_both(&p, cb, sb);
    sends_until_stall(p.cq, p.cfd, 1000, &cn);
    sends_until_stall(p.sq, p.sfd, 2000, &sn);
    /* the client's queue had W_STALL_MS more to show one while the server's was read */
    ck_assert_msg(!it_try_event(p.cq, EXS_EVT_SEND, p.cfd, 0, &ev),
                  "client send completed after the stall");
    printf("window_no_nop_stalls (%s): client %d, server %d of %d sends went before the "
           "stall\n",
           type == SOCK_STREAM ? "stream" : "seqpacket", cn, sn, W_MSGS);
    fflush(stdout);
    ck_assert_msg(cn >= 1 && cn < atoi(W_CREDITS) && sn >= 1 && sn < atoi(W_CREDITS),
                  "client %d, server %d sends before the stall: the window is %s", cn, sn,
                  W_CREDITS);
    get_stats(p.cfd, &cst);
    get_stats(p.sfd, &sst);
    ck_assert_uint_eq(cst.nops_sent, 0);
    ck_assert_uint_eq(sst.nops_sent, 0);
    ck_assert_uint_gt(cst.credit_stalls, 0);
    /* clean-up: the client's close cancels its queued sends; its SHUTDOWN returns
     * credits, so some of the server's may still go before its own close */
    it_close(p.cfd, p.cq);
    for (; cn < W_MSGS; cn++) {
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, ECANCELED);
    }
    p.cfd = -1;
    it_close(p.sfd, p.sq);
    for (; sn < W_MSGS; sn++)
        it_wait_event(p.sq, EXS_EVT_SEND, p.sfd, &ev);
    p.sfd = -1;
    it_pair_close(&p);
    it_buf_free(cb);
    it_buf_free(sb);
}
END_TEST

/* RNR events are counted, per socket and in the process counter the teardown of every
 * integration test checks (it_fini): an RNR completion injected by the fault provider on
 * one connection is seen there, and resets that connection. */
START_TEST(test_window_rnr_counted)
{
    char port[16], st_s[16];
    struct exs_sock_stats cst, sst;
    struct it_buf *sb, *rb;
    exs_event_t es, er;
    uint64_t rnr = 0, wc = 0;
    struct it_pair p;

    it_fault_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(W_LEN, 1);
    rb = it_buf_new(W_LEN, 1);
    snprintf(port, sizeof(port), "%u", ntohs(p.addr.sin_port));
    snprintf(st_s, sizeof(st_s), "%d", (int)EXS_PROV_WC_RNR_RETRY_EXC_ERR);
    ck_assert_int_eq(exs__params_set("fault_port", port), 0);
    ck_assert_int_eq(exs__params_set("fault_wc_status", st_s), 0);
    ck_assert_int_eq(exs__params_set("fault_wc_nth", "1"), 0);
    IT_POST_RECV(p.sfd, rb->p, W_LEN, p.sq, IT_AH(1), rb->mh);
    IT_POST_SEND(p.cfd, sb->p, W_LEN, p.cq, IT_AH(2), sb->mh);
    it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &es);
    it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &er);
    ck_assert_int_eq(exs__params_set("fault_wc_nth", "0"), 0);
    ck_assert_msg(es.exs_evt_errno || er.exs_evt_errno, "both operations succeeded");
    get_stats(p.cfd, &cst);
    get_stats(p.sfd, &sst);
    ck_assert_int_eq(exs__counters_lookup("prov.fault", "wc", &wc), 0);
    ck_assert_int_eq(exs__counters_lookup("proto", "rnr_events", &rnr), 0);
    ck_assert_uint_ge(wc, 1);
    ck_assert_uint_eq(cst.rnr_events + sst.rnr_events, wc);
    ck_assert_uint_eq(rnr, wc);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    ck_assert_int_eq(exs__params_set("fault_port", "0"), 0);
    ck_assert_int_eq(exs__params_set("fault_wc_status", "0"), 0);
}
END_TEST

/* ---- fragmentation (spec/protocol.md §6.2) ---- */

/* Drive progress on q until fd has received n ADVERTs (so a send posted next goes
 * directly), within IT_TIMEOUT_MS. Nothing is expected on q meanwhile. */
static void wait_adverts(int fd, exs_qhandle_t q, uint64_t n)
{
    struct exs_sock_stats st;
    double t0 = it_now_ms();
    exs_event_t ev;

    for (;;) {
        get_stats(fd, &st);
        if (st.adverts_received >= n)
            return;
        ck_assert_msg(it_now_ms() - t0 < IT_TIMEOUT_MS, "fd %d: %llu adverts after %d ms", fd,
                      (unsigned long long)st.adverts_received, IT_TIMEOUT_MS);
        ck_assert_msg(!it_try_event(q, -1, -1, 5, &ev), "unexpected %s event",
                      it_evt_name(ev.exs_evt_type));
    }
}

#define F_FRAG 4096
#define F_BIG  (1u << 20)

/* One SEQPACKET message of F_BIG bytes into an advertised receive of rlen bytes (posted
 * first), with EXS_FRAG_SIZE 4096: it arrives whole (or cut, MSG_TRUNC), in order before
 * a small message sent after it, and the sender counts one fragment per 4096 bytes
 * written. _i: 0 fits, 1 truncated, 2 the receiver in indirect-only mode (announced and
 * READ: no fragments). */
START_TEST(test_frag_seqpacket)
{
    size_t rlen = _i == 1 ? 300001 : F_BIG, n = rlen < F_BIG ? rlen : F_BIG;
    struct exs_sock_stats cst;
    struct it_buf *sb, *rb, *sm, *rm;
    struct it_pair p;

    it_setenv("EXS_FRAG_SIZE", "4096");
    if (_i == 2)
        it_setenv("EXS_XFER_MODE", "indirect");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(F_BIG, 1);
    rb = it_buf_new(F_BIG, 1);
    sm = it_buf_new(64, 1);
    rm = it_buf_new(64, 1);
    it_fill(sb->p, F_BIG, 41);
    it_fill(sm->p, 64, 42);
    memset(rb->p, 0, F_BIG);
    IT_POST_RECV(p.sfd, rb->p, rlen, p.sq, IT_AH(1), rb->mh);
    IT_POST_RECV(p.sfd, rm->p, 64, p.sq, IT_AH(2), rm->mh);
    if (_i != 2)
        wait_adverts(p.cfd, p.cq, 1); /* the big message goes directly, in pieces */
    IT_POST_SEND(p.cfd, sb->p, F_BIG, p.cq, IT_AH(3), sb->mh);
    IT_POST_SEND(p.cfd, sm->p, 64, p.cq, IT_AH(4), sm->mh);
    it_expect_recv(p.sq, p.sfd, IT_AH(1), (ssize_t)n, _i == 1);
    it_expect_recv(p.sq, p.sfd, IT_AH(2), 64, 0);
    it_expect_send(p.cq, p.cfd, IT_AH(3), F_BIG);
    it_expect_send(p.cq, p.cfd, IT_AH(4), 64);
    ck_assert_int_eq(it_check(rb->p, n, 41), -1);
    ck_assert_int_eq(it_check(rm->p, 64, 42), -1);
    if (rlen < F_BIG)
        ck_assert(it_all_bytes(rb->p + rlen, F_BIG - rlen, 0));
    get_stats(p.cfd, &cst);
    if (_i == 2) {
        ck_assert_uint_eq(cst.fragments, 0);
    } else {
        ck_assert_uint_eq(cst.fragments, (n + F_FRAG - 1) / F_FRAG);
        ck_assert_uint_ge(cst.direct_xfers, 1);
    }
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_buf_free(sm);
    it_buf_free(rm);
}
END_TEST

/* STREAM bytes with EXS_FRAG_SIZE 4096: into a MSG_WAITALL receive posted first (direct
 * pieces, _i 0) or into the ring before any receive is posted (indirect pieces, _i 1):
 * every byte arrives in order and no write is larger than 4096 bytes (fragments counted:
 * at least one per 4096 bytes). */
START_TEST(test_frag_stream)
{
    const size_t len = 512 * 1024;
    struct exs_sock_stats cst;
    struct it_buf *sb, *rb;
    exs_event_t ev;
    struct it_pair p;
    size_t got = 0;

    it_setenv("EXS_FRAG_SIZE", "4096");
    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 64);
    sb = it_buf_new(len, 1);
    rb = it_buf_new(len, 1);
    it_fill(sb->p, len, 51);
    memset(rb->p, 0, len);
    if (_i == 0) {
        int rc = exs_recv(p.sfd, rb->p, len, MSG_WAITALL, p.sq, IT_AH(1), rb->mh);

        ck_assert_int_eq(rc, 0);
        /* the ADVERT must be there before the send, or the bytes go into the ring */
        wait_adverts(p.cfd, p.cq, 1);
    }
    IT_POST_SEND(p.cfd, sb->p, len, p.cq, IT_AH(2), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(2), (ssize_t)len);
    for (int k = 0; got < len; k++) {
        if (_i == 1 || k > 0)
            IT_POST_RECV(p.sfd, rb->p + got, len - got, p.sq, IT_AH(10 + k), rb->mh);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    ck_assert_uint_eq(got, len);
    ck_assert_int_eq(it_check(rb->p, len, 51), -1);
    get_stats(p.cfd, &cst);
    ck_assert_msg(cst.fragments >= len / F_FRAG, "fragments %llu for %zu bytes",
                  (unsigned long long)cst.fragments, len);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* Interleaving: a 4 MiB SEQPACKET message from the client (EXS_FRAG_SIZE 16 KiB: 256
 * pieces, at most 15 ahead with 16 credits) is on a link capped at 50 Mbit/s (tcp link
 * emulation: 670 ms for it) when the client posts an 8 KiB receive and the server sends
 * it an 8 KiB message: the client's ADVERT or its READ of the announced message goes on
 * the queue pair the pieces use. With fragmentation it goes between pieces (after at most
 * 240 KiB, about 40 ms), so the client's receive completes before its big send; in one
 * 4 MiB write it could only go after it (checked: the test fails with EXS_FRAG_SIZE 1 GiB).
 * Checked by the order of the client's completions; the link cap makes the margin (over
 * half a second) independent of the machine's load. tcp only (the emulation). */
START_TEST(test_frag_interleave)
{
    const size_t big = 4u << 20, small = 8192;
    struct it_buf *sb, *rb, *ss, *rs;
    struct exs_sock_stats cst;
    exs_event_t ev;
    struct it_pair p;

    if (strcmp(it_provider, "tcp") != 0) {
        test_skip("frag_interleave", "provider %s: the link cap is the tcp provider's",
                  it_provider);
        return;
    }
    it_setenv("EXS_FRAG_SIZE", "16384");
    it_setenv("EXS_CREDITS", "16");
    it_setenv("EXS_EMU_RATE_MBPS", "50");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(big, 1);
    rb = it_buf_new(big, 1);
    ss = it_buf_new(small, 1);
    rs = it_buf_new(small, 1);
    it_fill(sb->p, big, 61);
    it_fill(ss->p, small, 62);
    IT_POST_RECV(p.sfd, rb->p, big, p.sq, IT_AH(1), rb->mh);
    wait_adverts(p.cfd, p.cq, 1); /* the big message goes directly, in pieces */
    IT_POST_SEND(p.cfd, sb->p, big, p.cq, IT_AH(2), sb->mh);
    IT_POST_RECV(p.cfd, rs->p, small, p.cq, IT_AH(4), rs->mh);
    IT_POST_SEND(p.sfd, ss->p, small, p.sq, IT_AH(3), ss->mh);
    it_wait_event_at(p.cq, -1, p.cfd, W_WAIT_MS, &ev, __FILE__, __LINE__);
    ck_assert_msg(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_ahandle == IT_AH(4),
                  "the client's first completion is %s ah %ld, not its small receive",
                  it_evt_name(ev.exs_evt_type), IT_AHN(ev.exs_evt_ahandle));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)small);
    it_expect_send(p.cq, p.cfd, IT_AH(2), (ssize_t)big);
    it_expect_send(p.sq, p.sfd, IT_AH(3), (ssize_t)small);
    it_expect_recv(p.sq, p.sfd, IT_AH(1), (ssize_t)big, 0);
    ck_assert_int_eq(it_check(rs->p, small, 62), -1);
    ck_assert_int_eq(it_check(rb->p, big, 61), -1);
    get_stats(p.cfd, &cst);
    ck_assert_uint_eq(cst.fragments, big / 16384);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_buf_free(ss);
    it_buf_free(rs);
}
END_TEST

/* ---- the work-request cap (spec/protocol.md §6.3) ---- */

#define Q_MSGS 60

/* Length of message i of the cap test: eager, direct in pieces, and in between. */
static size_t q_len(int i)
{
    static const size_t lens[] = {100, 200000, 5000, 64, 70000, 1};

    return lens[i % 6];
}

/* EXS_WR_MAX 2 and EXS_FRAG_SIZE 4096: both sides send Q_MSGS messages of mixed sizes to
 * each other at once (receives posted first) while control records (ADVERTs, ACKs, READ
 * requests) share the two slots: every message arrives intact and in order, every send
 * completes in order, and work requests waited in the queue (wr_queued). */
START_TEST(test_wr_cap)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct it_buf *cb, *sb, *crb, *srb;
    struct exs_sock_stats cst, sst;
    size_t total = 0, off;
    struct it_pair p;

    for (int i = 0; i < Q_MSGS; i++)
        total += q_len(i);
    it_setenv("EXS_WR_MAX", "2");
    it_setenv("EXS_FRAG_SIZE", "4096");
    it_init();
    it_pair_open(&p, type, 4 * Q_MSGS, 4 * Q_MSGS);
    cb = it_buf_new(total, 1);
    sb = it_buf_new(total, 1);
    crb = it_buf_new(total, 1);
    srb = it_buf_new(total, 1);
    it_fill(cb->p, total, 71);
    it_fill(sb->p, total, 72);
    memset(crb->p, 0, total);
    memset(srb->p, 0, total);
    if (type == SOCK_SEQPACKET) {
        off = 0;
        for (int i = 0; i < Q_MSGS; i++) {
            IT_POST_RECV(p.sfd, srb->p + off, q_len(i), p.sq, IT_AH(100 + i), srb->mh);
            IT_POST_RECV(p.cfd, crb->p + off, q_len(i), p.cq, IT_AH(300 + i), crb->mh);
            off += q_len(i);
        }
    } else {
        ck_assert_int_eq(exs_recv(p.sfd, srb->p, total, MSG_WAITALL, p.sq, IT_AH(100), srb->mh), 0);
        ck_assert_int_eq(exs_recv(p.cfd, crb->p, total, MSG_WAITALL, p.cq, IT_AH(300), crb->mh), 0);
    }
    off = 0;
    for (int i = 0; i < Q_MSGS; i++) {
        IT_POST_SEND(p.cfd, cb->p + off, q_len(i), p.cq, IT_AH(200 + i), cb->mh);
        IT_POST_SEND(p.sfd, sb->p + off, q_len(i), p.sq, IT_AH(400 + i), sb->mh);
        off += q_len(i);
    }
    for (int i = 0; i < Q_MSGS; i++) {
        it_context("message %d", i);
        it_expect_send(p.cq, p.cfd, IT_AH(200 + i), (ssize_t)q_len(i));
        it_expect_send(p.sq, p.sfd, IT_AH(400 + i), (ssize_t)q_len(i));
        if (type == SOCK_SEQPACKET) {
            it_expect_recv(p.sq, p.sfd, IT_AH(100 + i), (ssize_t)q_len(i), 0);
            it_expect_recv(p.cq, p.cfd, IT_AH(300 + i), (ssize_t)q_len(i), 0);
        }
    }
    if (type == SOCK_STREAM) {
        it_expect_recv(p.sq, p.sfd, IT_AH(100), (ssize_t)total, 0);
        it_expect_recv(p.cq, p.cfd, IT_AH(300), (ssize_t)total, 0);
    }
    ck_assert_int_eq(it_check(srb->p, total, 71), -1);
    ck_assert_int_eq(it_check(crb->p, total, 72), -1);
    get_stats(p.cfd, &cst);
    get_stats(p.sfd, &sst);
    ck_assert_msg(cst.wr_queued > 0 && sst.wr_queued > 0, "wr_queued: client %llu, server %llu",
                  (unsigned long long)cst.wr_queued, (unsigned long long)sst.wr_queued);
    ck_assert_uint_gt(cst.fragments, 0);
    it_pair_close(&p);
    it_buf_free(cb);
    it_buf_free(sb);
    it_buf_free(crb);
    it_buf_free(srb);
}
END_TEST

/* EXS_WR_MAX 1: a close while work requests wait in the queue ends them (flushed, never
 * posted): every operation completes, nothing leaks (the teardown counts objects). */
START_TEST(test_wr_cap_close)
{
    struct it_buf *sb;
    exs_event_t ev;
    struct it_pair p;
    int ok = 0, failed = 0;

    it_setenv("EXS_WR_MAX", "1");
    it_setenv("EXS_FRAG_SIZE", "4096");
    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 64);
    sb = it_buf_new(1 << 20, 1);
    for (int i = 0; i < 16; i++)
        IT_POST_SEND(p.cfd, sb->p, 65536, p.cq, IT_AH(10 + i), sb->mh);
    ck_assert_int_eq(exs_close(p.sfd, p.sq, IT_AH(1)), 0); /* the peer goes: a reset */
    it_wait_event(p.sq, EXS_EVT_CLOSE, p.sfd, &ev);
    p.sfd = -1;
    for (int i = 0; i < 16; i++) {
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, IT_AH(10 + i));
        if (ev.exs_evt_errno)
            failed++;
        else
            ok++;
    }
    ck_assert_int_eq(ok + failed, 16);
    it_pair_close(&p);
    it_buf_free(sb);
}
END_TEST

Suite *integ_window_suite(void)
{
    Suite *s = suite_create("integ_window");
    TCase *tc;

    tc = it_tcase("window_nop", 120);
    tcase_add_loop_test(tc, test_window_nop_unblocks, 0, 2);
    tcase_add_loop_test(tc, test_window_no_nop_stalls, 0, 2);
    suite_add_tcase(s, tc);
    tc = it_tcase("frag", 120);
    tcase_add_loop_test(tc, test_frag_seqpacket, 0, 3);
    tcase_add_loop_test(tc, test_frag_stream, 0, 2);
    tcase_add_test(tc, test_frag_interleave);
    suite_add_tcase(s, tc);
    tc = it_tcase("wr_cap", 120);
    tcase_add_loop_test(tc, test_wr_cap, 0, 2);
    tcase_add_test(tc, test_wr_cap_close);
    suite_add_tcase(s, tc);
    tc = it_tcase("window_rnr", 60);
    tcase_add_test(tc, test_window_rnr_counted);
    suite_add_tcase(s, tc);
    return s;
}
