/* SPDX-License-Identifier: MIT */
/* Session 27 (h83): attack review of the session's per-message speed work.
 *
 * max_ops_exact_under_completions: a socket's outstanding-operation count (EXS_SOCK_MAX_OPS,
 * EAGAIN beyond) stays exact while the posts (the application's thread) and the
 * completions (the progress side, under the conn's lock) run at once: the client keeps up
 * to MAXOPS receives posted, each post accepted while fewer than MAXOPS of its own are
 * outstanding (a count that drifted up refuses one: EAGAIN), while a server thread sends
 * N messages; then, nothing in flight, MAXOPS receives are accepted and one more is
 * refused (a count that drifted down accepts it). The messages carry their number: the
 * k-th receive posted takes message k (receives taken at the message's arrival keep the
 * order). Attacks h78 (the ended count a plain add under the conn's lock) and h79 (a
 * waiting receive takes an eager message at its arrival).
 *
 * max_ops_exact_sends: the same for sends: the client keeps up to MAXOPS sends posted
 * while the server thread receives; then MAXOPS receives-less large sends fill the count
 * exactly (one more: EAGAIN).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "tests/integ/integ.h"

#include <sys/exs.h>

enum { A27_MAXOPS = 8, A27_N = 20000, A27_LEN = 64 };

struct a27_peer {
    int fd;
    int recv; /* the thread receives N messages, else sends N */
    int fail; /* atomic: a call failed (its errno) */
    int at;   /* the message it failed at */
};

/* The server's side: N synchronous sends (message k carries k), or N synchronous
 * receives, each checked to carry the next number. */
static void *a27_peer_thread(void *arg)
{
    struct a27_peer *a = arg;
    uint32_t msg[A27_LEN / 4];

    for (uint32_t k = 0; k < A27_N; k++) {
        int r;

        if (a->recv) {
            memset(msg, 0, sizeof(msg));
            r = exs_recv(a->fd, msg, sizeof(msg), 0, EXS_QHANDLE_INVALID, IT_AH(k),
                         EXS_MHANDLE_UNREGISTERED);
            if (r == (int)sizeof(msg) && msg[0] != k)
                r = -2;
        } else {
            msg[0] = k;
            r = exs_send(a->fd, msg, sizeof(msg), 0, EXS_QHANDLE_INVALID, IT_AH(k),
                         EXS_MHANDLE_UNREGISTERED);
        }
        if (r != (int)sizeof(msg)) {
            a->at = (int)k;
            __atomic_store_n(&a->fail, r == -2 ? -1 : errno ? errno : -3, __ATOMIC_RELEASE);
            return NULL;
        }
    }
    return NULL;
}

START_TEST(max_ops_exact_under_completions)
{
    struct it_pair p;
    struct it_buf *b;
    struct a27_peer peer = {.recv = 0};
    pthread_t th;
    uint32_t posted = 0, taken = 0;
    int out = 0;

    it_setenv("EXS_SOCK_MAX_OPS", "8");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new((size_t)A27_MAXOPS * A27_LEN, 1);
    peer.fd = p.sfd;
    ck_assert_int_eq(pthread_create(&th, NULL, a27_peer_thread, &peer), 0);
    while (taken < A27_N) {
        exs_event_t ev;

        /* top up: every post accepted while fewer than MAXOPS are ours outstanding */
        while (out < A27_MAXOPS && posted < A27_N) {
            uint32_t slot = posted % A27_MAXOPS;
            int rc = exs_recv(p.cfd, b->p + slot * A27_LEN, A27_LEN, 0, p.cq, IT_AH(posted),
                              b->mh);

            ck_assert_msg(rc == 0, "receive %u refused with %d of ours outstanding: %d errno %d",
                          posted, out, rc, errno);
            posted++;
            out++;
        }
        ck_assert_int_eq(__atomic_load_n(&peer.fail, __ATOMIC_ACQUIRE), 0);
        it_wait_event(p.cq, EXS_EVT_RECV, p.cfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_uint_eq((uintptr_t)ev.exs_evt_ahandle, taken);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, A27_LEN);
        ck_assert_uint_eq(*(const uint32_t *)ev.exs_evt_u.exs_evt_xfer.exs_evt_buf, taken);
        taken++;
        out--;
    }
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_msg(peer.fail == 0, "server send %d failed: %d", peer.at, peer.fail);
    /* nothing in flight: exactly MAXOPS receives accepted, one more refused */
    for (int i = 0; i < A27_MAXOPS; i++)
        IT_POST_RECV(p.cfd, b->p + i * A27_LEN, A27_LEN, p.cq, IT_AH(100000 + i), b->mh);
    IT_EXPECT_FAIL(exs_recv(p.cfd, b->p, A27_LEN, 0, p.cq, IT_AH(199999), b->mh), EAGAIN);
    for (int i = 0; i < A27_MAXOPS; i++)
        IT_POST_SEND(p.sfd, b->p, A27_LEN, p.sq, IT_AH(300000 + i), b->mh);
    for (int i = 0; i < A27_MAXOPS; i++)
        it_expect_recv(p.cq, p.cfd, IT_AH(100000 + i), A27_LEN, 0);
    for (int i = 0; i < A27_MAXOPS; i++)
        it_expect_send(p.sq, p.sfd, IT_AH(300000 + i), A27_LEN);
    it_expect_no_event(p.cq, 50);
    it_expect_no_event(p.sq, 0);
    it_pair_close(&p);
}
END_TEST

START_TEST(max_ops_exact_sends)
{
    enum { BIG = 65536 };
    struct it_pair p;
    struct it_buf *b, *big, *rb;
    struct a27_peer peer = {.recv = 1};
    pthread_t th;
    uint32_t posted = 0, done = 0;
    int out = 0;

    it_setenv("EXS_SOCK_MAX_OPS", "8");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new((size_t)A27_MAXOPS * A27_LEN, 1);
    big = it_buf_new(BIG, 1);
    peer.fd = p.sfd;
    ck_assert_int_eq(pthread_create(&th, NULL, a27_peer_thread, &peer), 0);
    while (done < A27_N) {
        exs_event_t ev;

        while (out < A27_MAXOPS && posted < A27_N) {
            uint32_t slot = posted % A27_MAXOPS;
            int rc;

            *(uint32_t *)(void *)(b->p + slot * A27_LEN) = posted;
            rc = exs_send(p.cfd, b->p + slot * A27_LEN, A27_LEN, 0, p.cq, IT_AH(posted), b->mh);
            ck_assert_msg(rc == 0, "send %u refused with %d of ours outstanding: %d errno %d",
                          posted, out, rc, errno);
            posted++;
            out++;
        }
        ck_assert_int_eq(__atomic_load_n(&peer.fail, __ATOMIC_ACQUIRE), 0);
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_uint_eq((uintptr_t)ev.exs_evt_ahandle, done);
        done++;
        out--;
    }
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_msg(peer.fail == 0, "server receive %d failed: %d", peer.at, peer.fail);
    /* nothing in flight: MAXOPS large sends (no receive at the server: they stay) are
     * accepted, one more refused */
    for (int i = 0; i < A27_MAXOPS; i++)
        IT_POST_SEND(p.cfd, big->p, BIG, p.cq, IT_AH(100000 + i), big->mh);
    IT_EXPECT_FAIL(exs_send(p.cfd, big->p, BIG, 0, p.cq, IT_AH(199999), big->mh), EAGAIN);
    rb = it_buf_new((size_t)A27_MAXOPS * BIG, 1);
    for (int i = 0; i < A27_MAXOPS; i++)
        IT_POST_RECV(p.sfd, rb->p + (size_t)i * BIG, BIG, p.sq, IT_AH(300000 + i), rb->mh);
    for (int i = 0; i < A27_MAXOPS; i++)
        it_expect_recv(p.sq, p.sfd, IT_AH(300000 + i), BIG, 0);
    for (int i = 0; i < A27_MAXOPS; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(100000 + i), BIG);
    it_expect_no_event(p.cq, 50);
    it_expect_no_event(p.sq, 0);
    it_pair_close(&p);
}
END_TEST

Suite *integ_attack27_suite(void)
{
    Suite *s = suite_create("integ_attack27");

    it_suite_add(s, "max_ops", 240, 1,
                 (const TTest *const[]){max_ops_exact_under_completions, max_ops_exact_sends,
                                        NULL});
    return s;
}
