/* SPDX-License-Identifier: MIT */
/* Every exs_qdequeue form over real events: partial, threshold, zero, the three timeout kinds,
 * EINVAL, EINTR, and exs_qfd. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

static const struct timespec ts_poll = {0, 0};
static const struct timespec ts_10s = {10, 0};

/* Dequeue with a timespec and measure how long it took. */
static int dq(exs_qhandle_t q, exs_event_t *ev, int n, const struct timespec *ts, double *ms)
{
    double t0 = it_now_ms();
    int r = exs_qdequeue(q, ev, n, ts);
    int e = errno;

    if (ms)
        *ms = it_now_ms() - t0;
    errno = e;
    return r;
}

static void check_xfer(const exs_event_t *ev, int type, int fd, long ah, ssize_t result)
{
    ck_assert_msg(
        ev->exs_evt_type == type && ev->exs_evt_fd == fd && ev->exs_evt_ahandle == AH(ah) &&
            ev->exs_evt_errno == 0 && ev->exs_evt_u.exs_evt_xfer.exs_evt_result == result,
        "expected %s fd %d ah %ld result %zd errno 0; got %s fd %d ah %ld result %zd "
        "errno %d",
        it_evt_name(type), fd, ah, result, it_evt_name(ev->exs_evt_type), ev->exs_evt_fd,
        IT_AHN(ev->exs_evt_ahandle), ev->exs_evt_u.exs_evt_xfer.exs_evt_result, ev->exs_evt_errno);
}

/* A thread that posts n sends after a delay (exs_send from another thread). */
struct late_send {
    pthread_t th;
    int fd, n, delay_ms;
    exs_qhandle_t q;
    long ah0;
    const void *buf;
    size_t len;
    exs_mhandle_t mh;
    int rc, err;
};

static void *late_send_main(void *arg)
{
    struct late_send *ls = arg;

    it_sleep_ms(ls->delay_ms);
    for (int i = 0; i < ls->n; i++) {
        ls->rc = exs_send(ls->fd, ls->buf, ls->len, 0, ls->q, AH(ls->ah0 + i), ls->mh);
        if (ls->rc != 0) {
            ls->err = errno;
            break;
        }
    }
    return NULL;
}

static void late_send_start(struct late_send *ls, struct it_pair *p, struct it_buf *b, int n,
                            long ah0, int delay_ms)
{
    memset(ls, 0, sizeof(*ls));
    ls->fd = p->cfd;
    ls->q = p->cq;
    ls->n = n;
    ls->ah0 = ah0;
    ls->delay_ms = delay_ms;
    ls->buf = b->p;
    ls->len = 100;
    ls->mh = b->mh;
    ck_assert_int_eq(pthread_create(&ls->th, NULL, late_send_main, ls), 0);
}

static void late_send_join(struct late_send *ls)
{
    ck_assert_int_eq(pthread_join(ls->th, NULL), 0);
    ck_assert_msg(ls->rc == 0, "exs_send from another thread failed: errno %d (%s)", ls->err,
                  strerror(ls->err));
}

/* Post n receives on the server (ah0...) and n 100-byte sends on the client (ah0...). */
static void exchange(struct it_pair *p, struct it_buf *sb, struct it_buf *rb, int n, long ah0)
{
    for (int i = 0; i < n; i++)
        IT_POST_RECV(p->sfd, rb->p + (size_t)(ah0 + i) % 16 * 256, 256, p->sq, AH(ah0 + i), rb->mh);
    for (int i = 0; i < n; i++)
        IT_POST_SEND(p->cfd, sb->p, 100, p->cq, AH(ah0 + i), sb->mh);
}

/* nevents > 0: returns what is queued (up to nevents) without waiting for more, and
 * waits until at least one event is there. */
START_TEST(test_qdq_partial)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct late_send ls;
    exs_event_t ev[8];
    double ms;
    int r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);

    exchange(&p, sb, rb, 3, 0);
    for (int i = 0; i < 3; i++)
        it_expect_send(p.cq, p.cfd, AH(i), 100);
    it_sleep_ms(200); /* the three RECV events are queued by now */
    r = dq(p.sq, ev, 8, &ts_10s, &ms);
    ck_assert_msg(r == 3, "exs_qdequeue(8) with 3 events queued returned %d (errno %d)", r, errno);
    ck_assert_msg(ms < 5000, "exs_qdequeue(8) waited %.0f ms with 3 events queued", ms);
    for (int i = 0; i < 3; i++)
        check_xfer(&ev[i], EXS_EVT_RECV, p.sfd, i, 100);

    /* Fewer than queued: exactly nevents, the rest stays. */
    exchange(&p, sb, rb, 3, 3);
    for (int i = 3; i < 6; i++)
        it_expect_send(p.cq, p.cfd, AH(i), 100);
    it_sleep_ms(200);
    r = dq(p.sq, ev, 2, &ts_10s, NULL);
    ck_assert_int_eq(r, 2);
    check_xfer(&ev[0], EXS_EVT_RECV, p.sfd, 3, 100);
    check_xfer(&ev[1], EXS_EVT_RECV, p.sfd, 4, 100);
    r = dq(p.sq, ev, 8, &ts_poll, NULL);
    ck_assert_int_eq(r, 1);
    check_xfer(&ev[0], EXS_EVT_RECV, p.sfd, 5, 100);

    /* Waiting: the one event arrives 300 ms later. */
    IT_POST_RECV(p.sfd, rb->p, 256, p.sq, AH(6), rb->mh);
    late_send_start(&ls, &p, sb, 1, 6, 300);
    r = dq(p.sq, ev, 8, &ts_10s, &ms);
    late_send_join(&ls);
    ck_assert_msg(r == 1, "exs_qdequeue(8, 10 s) returned %d (errno %d) after %.0f ms", r, errno,
                  ms);
    ck_assert_msg(ms >= 250, "exs_qdequeue returned after %.0f ms, before the event", ms);
    check_xfer(&ev[0], EXS_EVT_RECV, p.sfd, 6, 100);
    it_expect_send(p.cq, p.cfd, AH(6), 100);
    it_pair_close(&p);
}
END_TEST

/* nevents < 0: waits for -nevents events and dequeues exactly that many. */
START_TEST(test_qdq_threshold)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct late_send ls;
    exs_event_t ev[8];
    double ms;
    int r, total;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);

    /* Four sends, dequeue -4 on both sides. */
    exchange(&p, sb, rb, 4, 0);
    r = dq(p.cq, ev, -4, &ts_10s, &ms);
    ck_assert_msg(r == 4, "exs_qdequeue(-4) returned %d (errno %d) after %.0f ms", r, errno, ms);
    for (int i = 0; i < 4; i++)
        check_xfer(&ev[i], EXS_EVT_SEND, p.cfd, i, 100);
    r = dq(p.sq, ev, -4, &ts_10s, NULL);
    ck_assert_int_eq(r, 4);
    for (int i = 0; i < 4; i++)
        check_xfer(&ev[i], EXS_EVT_RECV, p.sfd, i, 100);

    /* Two events now, two more 300 ms later: -4 does not return with two. */
    exchange(&p, sb, rb, 2, 4);
    for (int i = 6; i < 8; i++)
        IT_POST_RECV(p.sfd, rb->p + (size_t)i * 256, 256, p.sq, AH(i), rb->mh);
    late_send_start(&ls, &p, sb, 2, 6, 300);
    r = dq(p.cq, ev, -4, &ts_10s, &ms);
    late_send_join(&ls);
    ck_assert_msg(r == 4, "exs_qdequeue(-4) returned %d (errno %d) after %.0f ms", r, errno, ms);
    ck_assert_msg(ms >= 250, "exs_qdequeue(-4) returned after %.0f ms, before the 4th event", ms);
    for (int i = 0; i < 4; i++)
        check_xfer(&ev[i], EXS_EVT_SEND, p.cfd, 4 + i, 100);
    r = dq(p.sq, ev, -4, &ts_10s, NULL);
    ck_assert_int_eq(r, 4);
    for (int i = 0; i < 4; i++)
        check_xfer(&ev[i], EXS_EVT_RECV, p.sfd, 4 + i, 100);

    /* Only two events ever: -4 with a 300 ms timeout returns what it dequeued (0..2), not
     * an error, and no event is lost. */
    exchange(&p, sb, rb, 2, 8);
    for (int i = 8; i < 10; i++)
        it_expect_recv(p.sq, p.sfd, AH(i), 100, 0);
    it_sleep_ms(100);
    r = dq(p.cq, ev, -4, &(struct timespec){0, 300 * 1000000L}, &ms);
    ck_assert_msg(r >= 0 && r <= 2, "exs_qdequeue(-4, 300 ms) with 2 events returned %d errno %d",
                  r, errno);
    ck_assert_msg(ms >= 250 && ms < 5000, "exs_qdequeue(-4, 300 ms) took %.0f ms", ms);
    total = r;
    if (total < 2) {
        r = dq(p.cq, ev + total, 8, &ts_10s, NULL);
        ck_assert_int_ge(r, 1);
        total += r;
    }
    if (total < 2) {
        r = dq(p.cq, ev + total, 8, &ts_10s, NULL);
        ck_assert_int_ge(r, 1);
        total += r;
    }
    ck_assert_int_eq(total, 2);
    check_xfer(&ev[0], EXS_EVT_SEND, p.cfd, 8, 100);
    check_xfer(&ev[1], EXS_EVT_SEND, p.cfd, 9, 100);
    it_pair_close(&p);
}
END_TEST

/* nevents == 0 returns 0 at once, whatever the timeout, and takes nothing. */
START_TEST(test_qdq_zero)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_event_t ev[2];
    double ms;
    int r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);

    /* Empty queue. */
    r = dq(p.cq, ev, 0, &ts_10s, &ms);
    ck_assert_msg(r == 0 && ms < 1000, "exs_qdequeue(0, 10 s) on an empty queue: %d after %.0f ms",
                  r, ms);
    it_watchdog_start(10, "exs_qdequeue(q, ev, 0, NULL) on an empty queue");
    r = dq(p.cq, ev, 0, NULL, &ms);
    it_watchdog_stop();
    ck_assert_msg(r == 0 && ms < 1000, "exs_qdequeue(0, NULL): %d after %.0f ms", r, ms);

    /* One event queued: still 0, and the event stays. */
    exchange(&p, sb, rb, 1, 0);
    it_expect_recv(p.sq, p.sfd, AH(0), 100, 0);
    it_sleep_ms(100);
    r = dq(p.cq, ev, 0, &ts_10s, &ms);
    ck_assert_msg(r == 0 && ms < 1000, "exs_qdequeue(0) with an event: %d after %.0f ms", r, ms);
    r = dq(p.cq, ev, 0, &ts_poll, NULL);
    ck_assert_int_eq(r, 0);
    r = dq(p.cq, ev, 2, &ts_poll, NULL);
    ck_assert_int_eq(r, 1);
    check_xfer(&ev[0], EXS_EVT_SEND, p.cfd, 0, 100);
    it_pair_close(&p);
}
END_TEST

/* Timeouts: {0,0} polls, a finite interval expires with 0, NULL waits for the event. */
START_TEST(test_qdq_timeouts)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct late_send ls;
    exs_event_t ev[4];
    double ms;
    int r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);

    r = dq(p.cq, ev, 4, &ts_poll, &ms);
    ck_assert_msg(r == 0 && ms < 1000, "poll of an empty queue: %d after %.0f ms", r, ms);
    r = dq(p.cq, ev, -1, &ts_poll, &ms);
    ck_assert_msg(r == 0 && ms < 1000, "poll (-1) of an empty queue: %d after %.0f ms", r, ms);
    r = dq(p.cq, ev, 4, &(struct timespec){0, 300 * 1000000L}, &ms);
    ck_assert_msg(r == 0, "300 ms on an empty queue returned %d (errno %d)", r, errno);
    ck_assert_msg(ms >= 250 && ms < 5000, "300 ms timeout took %.0f ms", ms);
    r = dq(p.cq, ev, 4, &(struct timespec){1, 0}, &ms);
    ck_assert_msg(r == 0 && ms >= 950 && ms < 6000, "1 s timeout: %d after %.0f ms", r, ms);

    /* {0,0} with an event queued takes it. */
    exchange(&p, sb, rb, 1, 0);
    it_expect_recv(p.sq, p.sfd, AH(0), 100, 0);
    it_sleep_ms(100);
    r = dq(p.cq, ev, 4, &ts_poll, NULL);
    ck_assert_int_eq(r, 1);
    check_xfer(&ev[0], EXS_EVT_SEND, p.cfd, 0, 100);

    /* NULL with an event queued returns at once. */
    exchange(&p, sb, rb, 1, 1);
    it_expect_recv(p.sq, p.sfd, AH(1), 100, 0);
    it_sleep_ms(100);
    it_watchdog_start(10, "exs_qdequeue(NULL timeout) with an event queued");
    r = dq(p.cq, ev, 4, NULL, &ms);
    it_watchdog_stop();
    ck_assert_msg(r == 1 && ms < 1000, "NULL timeout with an event queued: %d after %.0f ms", r,
                  ms);
    check_xfer(&ev[0], EXS_EVT_SEND, p.cfd, 1, 100);

    /* NULL waits until the event arrives (300 ms later). */
    IT_POST_RECV(p.sfd, rb->p, 256, p.sq, AH(2), rb->mh);
    late_send_start(&ls, &p, sb, 1, 2, 300);
    it_watchdog_start(10, "exs_qdequeue(NULL timeout) waiting for a send 300 ms later");
    r = dq(p.sq, ev, 4, NULL, &ms);
    it_watchdog_stop();
    late_send_join(&ls);
    ck_assert_msg(r == 1 && ms >= 250, "NULL timeout: %d after %.0f ms", r, ms);
    check_xfer(&ev[0], EXS_EVT_RECV, p.sfd, 2, 100);
    it_watchdog_start(10, "exs_qdequeue(-1, NULL timeout)");
    r = dq(p.cq, ev, -1, NULL, &ms);
    it_watchdog_stop();
    ck_assert_int_eq(r, 1);
    check_xfer(&ev[0], EXS_EVT_SEND, p.cfd, 2, 100);
    it_pair_close(&p);
}
END_TEST

/* EINVAL: |nevents| > EXS_EVTVEC_MAX, a bad or deleted handle; EXS_EVTVEC_MAX itself is fine. */
START_TEST(test_qdq_einval)
{
    exs_event_t *ev = calloc(EXS_EVTVEC_MAX + 1, sizeof(*ev));
    exs_qhandle_t q, dead;

    ck_assert_ptr_nonnull(ev);
    ck_assert_int_ge(EXS_EVTVEC_MAX, 1024);
    it_init();
    /* Depth EXS_EVTVEC_MAX: a threshold above the depth could never be met (the library
     * may refuse it with EINVAL), which is not what this test is about. */
    q = it_qcreate(EXS_EVTVEC_MAX);
    dead = it_qcreate(16);
    it_qdelete(dead);
    IT_EXPECT_FAIL(exs_qdequeue(q, ev, EXS_EVTVEC_MAX + 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(q, ev, -(EXS_EVTVEC_MAX + 1), &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(q, ev, INT_MAX, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(q, ev, INT_MIN, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(q, ev, EXS_EVTVEC_MAX + 1, &ts_10s), EINVAL);
    ck_assert_int_eq(exs_qdequeue(q, ev, EXS_EVTVEC_MAX, &ts_poll), 0);
    ck_assert_int_eq(exs_qdequeue(q, ev, -EXS_EVTVEC_MAX, &ts_poll), 0);
    IT_EXPECT_FAIL(exs_qdequeue(12345, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(dead, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(EXS_QHANDLE_INVALID, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdelete(dead), EINVAL);
    it_qdelete(q);
    free(ev);
}
END_TEST

/* The same answers with libexs sockets live, where exs_qdequeue drives progress first and
 * goes straight to its wait (evq_dequeue_rest): a bad, deleted or invalid handle, and a
 * threshold above the queue's depth, are EINVAL there too (no wait, no event taken); a
 * good queue still answers. */
START_TEST(test_qdq_einval_live)
{
    exs_event_t ev[4];
    exs_qhandle_t dead, small;
    struct it_pair p;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    dead = it_qcreate(16);
    it_qdelete(dead);
    small = it_qcreate(2);
    IT_EXPECT_FAIL(exs_qdequeue(12345, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(dead, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(dead, ev, 1, &ts_10s), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(EXS_QHANDLE_INVALID, ev, 1, &ts_poll), EINVAL);
    IT_EXPECT_FAIL(exs_qdequeue(dead, ev, 0, NULL), EINVAL);
    /* a threshold of 3 on a queue of depth 2 could never be met: refused, not awaited */
    IT_EXPECT_FAIL(exs_qdequeue(small, ev, -3, &ts_10s), EINVAL);
    ck_assert_int_eq(exs_qdequeue(small, ev, -2, &ts_poll), 0);
    ck_assert_int_eq(exs_qdequeue(p.cq, ev, 4, &ts_poll), 0);
    it_qdelete(small);
    it_pair_close(&p);
}
END_TEST

static void on_usr1(int sig)
{
    (void)sig;
}

struct kicker {
    pthread_t target;
    int delay_ms;
};

static void *kicker_main(void *arg)
{
    struct kicker *k = arg;

    it_sleep_ms(k->delay_ms);
    pthread_kill(k->target, SIGUSR1);
    return NULL;
}

/* A signal (handler installed without SA_RESTART) interrupts the wait: -1 EINTR. */
START_TEST(test_qdq_eintr)
{
    struct sigaction sa = {.sa_handler = on_usr1}, old;
    struct kicker k = {.target = pthread_self(), .delay_ms = 200};
    exs_event_t ev;
    pthread_t th;
    exs_qhandle_t q;
    double ms;
    int r, e;

    it_init();
    q = it_qcreate(16);
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGUSR1, &sa, &old), 0);
    ck_assert_int_eq(pthread_create(&th, NULL, kicker_main, &k), 0);
    r = dq(q, &ev, 1, &(struct timespec){5, 0}, &ms);
    e = errno;
    pthread_join(th, NULL);
    sigaction(SIGUSR1, &old, NULL);
    ck_assert_msg(r == -1 && e == EINTR,
                  "exs_qdequeue interrupted by a signal: %d errno %d (%s) after %.0f ms, "
                  "expected -1 EINTR",
                  r, e, strerror(e), ms);
    ck_assert_msg(ms < 4000, "EINTR came after %.0f ms (signal sent at 200 ms)", ms);
    it_qdelete(q);
}
END_TEST

/* exs_qfd polls readable exactly while events are queued. */
START_TEST(test_qfd)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_event_t ev[2];
    struct pollfd pfd;
    int r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);
    pfd.fd = exs_qfd(p.sq);
    pfd.events = POLLIN;
    ck_assert_msg(pfd.fd >= 0, "exs_qfd = %d errno %d (%s)", pfd.fd, errno, strerror(errno));
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    exchange(&p, sb, rb, 1, 0);
    r = poll(&pfd, 1, IT_TIMEOUT_MS);
    ck_assert_msg(r == 1 && (pfd.revents & POLLIN), "exs_qfd not readable with an event: %d", r);
    ck_assert_int_eq(dq(p.sq, ev, 2, &ts_poll, NULL), 1);
    check_xfer(&ev[0], EXS_EVT_RECV, p.sfd, 0, 100);
    ck_assert_msg(poll(&pfd, 1, 0) == 0, "exs_qfd still readable after the queue was emptied");
    it_expect_send(p.cq, p.cfd, AH(0), 100);
    it_pair_close(&p);
}
END_TEST

Suite *integ_qdequeue_suite(void)
{
    Suite *s = suite_create("integ_qdequeue");
    TCase *tc;

    tc = it_tcase("forms", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_qdq_partial);
    tcase_add_test(tc, test_qdq_threshold);
    tcase_add_test(tc, test_qdq_zero);
    tcase_add_test(tc, test_qdq_timeouts);
    suite_add_tcase(s, tc);
    tc = it_tcase("errors", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_qdq_einval);
    tcase_add_test(tc, test_qdq_einval_live);
    tcase_add_test(tc, test_qdq_eintr);
    suite_add_tcase(s, tc);
    tc = it_tcase("qfd", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_qfd);
    suite_add_tcase(s, tc);
    return s;
}
