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

/* Credits per side (the window) and the messages each side sends: several windows. */
#define W_CREDITS "8"
#define W_MSGS    24
#define W_LEN     64
/* A stall is declared when no send completes for this long. */
#define W_STALL_MS 3000
/* The NOP check runs about once a second: a generous bound for each completion. */
#define W_WAIT_MS 30000

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
                      "receive %d: result %zd errno %d", ah, (ssize_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result,
                      ev.exs_evt_errno);
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
           "stall\n", type == SOCK_STREAM ? "stream" : "seqpacket", cn, sn, W_MSGS);
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
    char prov[32], port[16], st_s[16];
    const char *saved = it_provider;
    struct exs_sock_stats cst, sst;
    struct it_buf *sb, *rb;
    exs_event_t es, er;
    uint64_t rnr = 0, wc = 0;
    struct it_pair p;

    if (strncmp(it_provider, "fault:", 6) == 0)
        snprintf(prov, sizeof(prov), "%s", it_provider);
    else
        snprintf(prov, sizeof(prov), "fault:%s", it_provider);
    it_provider = prov;
    it_init();
    it_provider = saved;
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

Suite *integ_window_suite(void)
{
    Suite *s = suite_create("integ_window");
    TCase *tc;

    tc = it_tcase("window_nop", 120);
    tcase_add_loop_test(tc, test_window_nop_unblocks, 0, 2);
    tcase_add_loop_test(tc, test_window_no_nop_stalls, 0, 2);
    suite_add_tcase(s, tc);
    tc = it_tcase("window_rnr", 60);
    tcase_add_test(tc, test_window_rnr_counted);
    suite_add_tcase(s, tc);
    return s;
}
