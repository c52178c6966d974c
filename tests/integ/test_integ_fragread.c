/* SPDX-License-Identifier: MIT */
/* Fragmented RDMA READs (issue 13, spec/protocol.md §6.2): announced SEQPACKET messages are
 * read in pieces of EXS_FRAG_SIZE, whole and in order, and do not hold up the connection. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "integ.h"
#include "tests/skip.h"

static void get_stats(int fd, struct exs_sock_stats *st)
{
    socklen_t len = sizeof(*st);

    memset(st, 0, sizeof(*st));
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, st, &len), 0);
}

/* Wait (at most IT_TIMEOUT_MS) until a message arrived at fd that no receive took yet:
 * for a SEQPACKET socket POLLIN means exactly that, so an ANNOUNCE was handled and a
 * receive posted now takes its message at once (no ADVERT). */
static void wait_pending(int fd)
{
    exs_pollfd_t f = {.fd = fd, .events = POLLIN};
    int n = exs_poll(&f, 1, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL);

    ck_assert_msg(n == 1 && (f.revents & POLLIN) && !(f.revents & (POLLERR | POLLHUP)),
                  "fd %d: exs_poll = %d revents %#x errno %d: no message arrived within %d ms", fd,
                  n, (unsigned)f.revents, errno, IT_TIMEOUT_MS);
}

/* Drive q until fd has received n ADVERTs, within IT_TIMEOUT_MS. Events that arrive
 * meanwhile are stashed for later waits. */
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
        /* no CLOSE comes: this only moves other events to the stash */
        ck_assert(!it_try_event(q, EXS_EVT_CLOSE, fd, 5, &ev));
    }
}

#define R_BIG   (4u << 20)
#define R_SMALL 64u

/* A 4 MiB SEQPACKET message announced (no receive was posted, so no ADVERT) and a 64-byte
 * one behind it; the receiver posts its receives once the ANNOUNCE arrived and reads the
 * message in 64 pieces of 64 KiB (EXS_FRAG_SIZE): every byte arrives, the small message
 * after it, and the receiver counts one fragment per piece (the sender none: it wrote
 * nothing). _i 1: the receive is 3 MiB + 1 bytes: MSG_TRUNC, 49 pieces, nothing written
 * past the receive. */
START_TEST(test_fragread_big)
{
    size_t rlen = _i ? (3u << 20) + 1 : R_BIG, n = rlen;
    struct exs_sock_stats cst, sst;
    struct it_buf *sb, *rb, *sm, *rm;
    struct it_pair p;

    it_setenv("EXS_FRAG_SIZE", "65536");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(R_BIG, 1);
    rb = it_buf_new(R_BIG, 1);
    sm = it_buf_new(R_SMALL, 1);
    rm = it_buf_new(R_SMALL, 1);
    it_fill(sb->p, R_BIG, 81);
    it_fill(sm->p, R_SMALL, 82);
    memset(rb->p, 0, R_BIG);
    IT_POST_SEND(p.cfd, sb->p, R_BIG, p.cq, IT_AH(1), sb->mh);
    IT_POST_SEND(p.cfd, sm->p, R_SMALL, p.cq, IT_AH(2), sm->mh);
    wait_pending(p.sfd);
    IT_POST_RECV(p.sfd, rb->p, rlen, p.sq, IT_AH(3), rb->mh);
    IT_POST_RECV(p.sfd, rm->p, R_SMALL, p.sq, IT_AH(4), rm->mh);
    it_expect_recv(p.sq, p.sfd, IT_AH(3), (ssize_t)n, _i == 1);
    it_expect_recv(p.sq, p.sfd, IT_AH(4), R_SMALL, 0);
    it_expect_send(p.cq, p.cfd, IT_AH(1), R_BIG);
    it_expect_send(p.cq, p.cfd, IT_AH(2), R_SMALL);
    ck_assert_int_eq(it_check(rb->p, n, 81), -1);
    ck_assert_int_eq(it_check(rm->p, R_SMALL, 82), -1);
    if (rlen < R_BIG)
        ck_assert(it_all_bytes(rb->p + rlen, R_BIG - rlen, 0));
    ck_assert(it_buf_guards_ok(rb));
    get_stats(p.sfd, &sst);
    get_stats(p.cfd, &cst);
    ck_assert_uint_eq(sst.adverts_sent, 0); /* the message was announced, then read */
    ck_assert_uint_eq(sst.fragments, (n + 65535) / 65536);
    ck_assert_uint_ge(sst.direct_xfers, 1);
    ck_assert_uint_eq(cst.fragments, 0);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_buf_free(sm);
    it_buf_free(rm);
}
END_TEST

#define I_BIG   (8u << 20)
#define I_SMALL 8192u
#define I_SIG   64u

/* Not held up: the client's 8 MiB message is announced and the server reads it in
 * pieces of 16 KiB over a link capped at 25 Mbit/s per direction (tcp link emulation:
 * about 2.7 s for the READ responses). The server posts its receive once the ANNOUNCE
 * arrived (the READs go on its queue pair at once), then sends a 64-byte message
 * behind them: when the client has it, the client's provider has queued the responses
 * of the READs sent before it. The client then posts an 8 KiB receive; its ADVERT goes
 * on the link behind those responses: at most EXS_MAX_READS (16) pieces, 256 KiB, about
 * 85 ms. The server sends 8 KiB into that ADVERT, so the client's receive completes
 * before its big send (which completes on READ_DONE after the last piece). Read as one
 * READ the ADVERT waits behind all 8 MiB, and the READ_DONE is sent before the 8 KiB
 * write: the order flips (checked: the test fails with EXS_FRAG_SIZE 1 GiB). Asserted
 * on the order of the client's completions; the link cap makes the margin (over two
 * seconds) independent of the machine's load. tcp only (the emulation). */
START_TEST(test_fragread_not_held_up)
{
    struct it_buf *sb, *rb, *sm, *rm, *sig, *rsig, *ss, *rs;
    struct exs_sock_stats sst;
    exs_event_t ev;
    struct it_pair p;

    if (strcmp(it_provider, "tcp") != 0) {
        test_skip("fragread_not_held_up", "provider %s: the link cap is the tcp provider's",
                  it_provider);
        return;
    }
    it_setenv("EXS_FRAG_SIZE", "16384");
    it_setenv("EXS_MAX_READS", "16");
    it_setenv("EXS_EMU_RATE_MBPS", "25");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(I_BIG, 1);
    rb = it_buf_new(I_BIG, 1);
    sm = it_buf_new(R_SMALL, 1);
    rm = it_buf_new(R_SMALL, 1);
    sig = it_buf_new(I_SIG, 1);
    rsig = it_buf_new(I_SIG, 1);
    ss = it_buf_new(I_SMALL, 1);
    rs = it_buf_new(I_SMALL, 1);
    it_fill(sb->p, I_BIG, 91);
    it_fill(sm->p, R_SMALL, 92);
    it_fill(sig->p, I_SIG, 93);
    it_fill(ss->p, I_SMALL, 94);
    /* the client: a receive for the signal (eager: below EXS_EAGER_MAX, not advertised),
     * the big message (announced: the server has no receive) and a small one behind */
    IT_POST_RECV(p.cfd, rsig->p, I_SIG, p.cq, IT_AH(3), rsig->mh);
    IT_POST_SEND(p.cfd, sb->p, I_BIG, p.cq, IT_AH(1), sb->mh);
    IT_POST_SEND(p.cfd, sm->p, R_SMALL, p.cq, IT_AH(2), sm->mh);
    /* the server: its receive takes the announced message at once (READs posted), then
     * the signal leaves behind those READs */
    wait_pending(p.sfd);
    IT_POST_RECV(p.sfd, rb->p, I_BIG, p.sq, IT_AH(10), rb->mh);
    IT_POST_RECV(p.sfd, rm->p, R_SMALL, p.sq, IT_AH(11), rm->mh);
    IT_POST_SEND(p.sfd, sig->p, I_SIG, p.sq, IT_AH(12), sig->mh);
    it_expect_recv(p.cq, p.cfd, IT_AH(3), I_SIG, 0);
    /* the client's ADVERT now queues behind the READ responses on its link */
    IT_POST_RECV(p.cfd, rs->p, I_SMALL, p.cq, IT_AH(4), rs->mh);
    wait_adverts(p.sfd, p.sq, 1);
    IT_POST_SEND(p.sfd, ss->p, I_SMALL, p.sq, IT_AH(13), ss->mh);
    it_wait_event_at(p.cq, -1, p.cfd, IT_TIMEOUT_MS, &ev, __FILE__, __LINE__);
    ck_assert_msg(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_ahandle == IT_AH(4),
                  "the client's next completion is %s ah %ld, not its 8 KiB receive",
                  it_evt_name(ev.exs_evt_type), IT_AHN(ev.exs_evt_ahandle));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)I_SMALL);
    it_expect_send(p.cq, p.cfd, IT_AH(1), (ssize_t)I_BIG);
    it_expect_send(p.cq, p.cfd, IT_AH(2), (ssize_t)R_SMALL);
    it_expect_recv(p.sq, p.sfd, IT_AH(10), (ssize_t)I_BIG, 0);
    it_expect_recv(p.sq, p.sfd, IT_AH(11), (ssize_t)R_SMALL, 0);
    it_expect_send(p.sq, p.sfd, IT_AH(12), (ssize_t)I_SIG);
    it_expect_send(p.sq, p.sfd, IT_AH(13), (ssize_t)I_SMALL);
    ck_assert_int_eq(it_check(rb->p, I_BIG, 91), -1);
    ck_assert_int_eq(it_check(rm->p, R_SMALL, 92), -1);
    ck_assert_int_eq(it_check(rsig->p, I_SIG, 93), -1);
    ck_assert_int_eq(it_check(rs->p, I_SMALL, 94), -1);
    get_stats(p.sfd, &sst);
    ck_assert_uint_eq(sst.adverts_sent, 0); /* the big message was read, not written */
    ck_assert_uint_eq(sst.fragments, I_BIG / 16384);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_buf_free(sm);
    it_buf_free(rm);
    it_buf_free(sig);
    it_buf_free(rsig);
    it_buf_free(ss);
    it_buf_free(rs);
}
END_TEST

Suite *integ_fragread_suite(void)
{
    Suite *s = suite_create("integ_fragread");
    TCase *tc;

    tc = it_tcase("fragread", 120);
    tcase_add_loop_test(tc, test_fragread_big, 0, 2);
    tcase_add_test(tc, test_fragread_not_held_up);
    suite_add_tcase(s, tc);
    return s;
}
