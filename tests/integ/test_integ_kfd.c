/* SPDX-License-Identifier: MIT */
/* ES-API calls on kernel TCP sockets (socket()/accept() descriptors), and signals reaching the
 * application's threads. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* ---- helpers ---- */

/* Byte i of the stream pattern. */
static uint8_t pat(size_t i)
{
    return (uint8_t)(i * 131u + (i >> 9) + 7u);
}

static void pat_fill(uint8_t *p, size_t len, size_t off)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pat(off + i);
}

/* The first offset in [0, len) where p differs from the pattern at off, or -1. */
static long pat_check(const uint8_t *p, size_t len, size_t off)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(off + i))
            return (long)i;
    return -1;
}

/* A reader thread: reads total bytes from fd with blocking recv in small pieces,
 * pausing now and then (a slow peer), and checks them against the pattern. */
struct reader {
    int fd;
    size_t total;
    size_t got;
    long bad; /* first bad stream offset, or -1 */
    int err;
    int slow;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    uint8_t buf[3000];
    int n = 0;

    r->bad = -1;
    while (r->got < r->total) {
        ssize_t k = recv(r->fd, buf, sizeof(buf), 0);

        if (k <= 0) {
            r->err = k < 0 ? errno : EPIPE;
            break;
        }
        long b = pat_check(buf, (size_t)k, r->got);
        if (b >= 0 && r->bad < 0)
            r->bad = (long)r->got + b;
        r->got += (size_t)k;
        if (r->slow && (++n % 8) == 0)
            usleep(1000);
    }
    return NULL;
}

/* ---- sends ---- */

/* 64 sends outstanding (from two registered buffers and unregistered ones) on a kernel
 * socket with a small send buffer, against a slow reader: every byte arrives in order,
 * send events come in posting order with the full length, the descriptor's flags are
 * unchanged, and nothing is kept after the last event. */
START_TEST(test_kfd_send_order)
{
    enum { NSEND = 64, CHUNK = 24 * 1024 + 17 };
    struct it_buf *reg[2];
    uint8_t *unreg;
    struct reader r = {.slow = 1};
    pthread_t th;
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b, fl0;

    it_init();
    q = it_qcreate(NSEND + 4);
    it_tcp_pair(&a, &b, 32768, 32768); /* as test_kfd_shutdown */
    fl0 = fcntl(a, F_GETFL);
    reg[0] = it_buf_new((size_t)CHUNK * NSEND / 2, 1);
    reg[1] = it_buf_new((size_t)CHUNK * NSEND / 2, 1);
    unreg = malloc((size_t)CHUNK * NSEND);
    ck_assert_ptr_nonnull(unreg);
    r.fd = b;
    r.total = (size_t)CHUNK * NSEND;
    for (int i = 0; i < NSEND; i++) {
        /* even sends from the two registered buffers in turn, odd ones unregistered */
        uint8_t *p =
            (i & 1) ? unreg + (size_t)i * CHUNK : reg[(i / 2) & 1]->p + (size_t)(i / 4) * CHUNK * 2;
        exs_mhandle_t mh = (i & 1) ? EXS_MHANDLE_UNREGISTERED : reg[(i / 2) & 1]->mh;

        pat_fill(p, CHUNK, (size_t)i * CHUNK);
        IT_POST_SEND(a, p, CHUNK, q, AH(i + 1), mh);
    }
    /* the reader starts late: sends wait for the kernel */
    it_sleep_ms(50);
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &r), 0);
    for (int i = 0; i < NSEND; i++) {
        it_context("send %d", i);
        it_wait_event(q, EXS_EVT_SEND, a, &ev);
        ck_assert_msg(ev.exs_evt_ahandle == AH(i + 1), "send event %d has ahandle %ld", i,
                      IT_AHN(ev.exs_evt_ahandle));
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, CHUNK);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_len, CHUNK);
    }
    pthread_join(th, NULL);
    ck_assert_int_eq(r.err, 0);
    ck_assert_msg(r.bad < 0, "stream corrupted at offset %ld", r.bad);
    ck_assert_uint_eq(r.got, r.total);
    ck_assert_int_eq(fcntl(a, F_GETFL), fl0);
    ck_assert_int_eq(fl0 & O_NONBLOCK, 0);
    /* a synchronous send on the same descriptor */
    pat_fill(unreg, 100, 0);
    ck_assert_int_eq(
        exs_send(a, unreg, 100, 0, EXS_QHANDLE_INVALID, AH(0), EXS_MHANDLE_UNREGISTERED), 100);
    ck_assert_int_eq(recv(b, unreg + 200, 100, MSG_WAITALL), 100);
    ck_assert_int_eq(pat_check(unreg + 200, 100, 0), -1);
    it_kfd_settle(q);
    close(a);
    close(b);
    free(unreg);
    it_qdelete(q);
}
END_TEST

/* ---- receives ---- */

struct writer {
    int fd;
    size_t total;
    int err;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    uint8_t buf[1500];
    size_t off = 0;

    while (off < w->total) {
        size_t n = w->total - off < sizeof(buf) ? w->total - off : sizeof(buf);

        pat_fill(buf, n, off);
        ssize_t k = send(w->fd, buf, n, MSG_NOSIGNAL);
        if (k < 0) {
            w->err = errno;
            return NULL;
        }
        off += (size_t)k;
        if ((off / 1500) % 16 == 0)
            usleep(500);
    }
    shutdown(w->fd, SHUT_WR); /* the end of the stream */
    return NULL;
}

/* Receives posted before the data arrives complete in posting order and their bytes
 * concatenate into the stream; MSG_WAITALL ones are full (but the one the end of the
 * stream cuts); then the end of stream completes every pending receive with 0. */
START_TEST(test_kfd_recv_order)
{
    enum { NRECV = 200, RLEN = 4000 };
    struct writer w;
    struct it_buf *buf;
    pthread_t th;
    exs_qhandle_t q;
    exs_event_t ev;
    size_t off = 0;
    int a, b, fl0;

    it_init();
    q = it_qcreate(NRECV + 8);
    it_tcp_pair(&a, &b, 0, 0);
    fl0 = fcntl(b, F_GETFL);
    buf = it_buf_new((size_t)NRECV * RLEN, 1);
    for (int i = 0; i < NRECV; i++)
        ck_assert_int_eq(exs_recv(b, buf->p + (size_t)i * RLEN, RLEN, (i % 3) ? 0 : MSG_WAITALL, q,
                                  AH(i + 1), buf->mh),
                         0);
    w.fd = a;
    w.total = (size_t)NRECV * RLEN / 2;
    w.err = 0;
    ck_assert_int_eq(pthread_create(&th, NULL, writer_main, &w), 0);
    for (int i = 0; off < w.total; i++) {
        ssize_t res;

        it_context("recv %d at %zu", i, off);
        ck_assert_int_lt(i, NRECV);
        it_wait_event(q, EXS_EVT_RECV, b, &ev);
        ck_assert_msg(ev.exs_evt_ahandle == AH(i + 1), "recv event %d has ahandle %ld", i,
                      IT_AHN(ev.exs_evt_ahandle));
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        res = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        ck_assert_int_gt(res, 0);
        ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_buf, buf->p + (size_t)i * RLEN);
        if (i % 3 == 0 && off + (size_t)res < w.total) /* MSG_WAITALL: full but at the end */
            ck_assert_int_eq(res, RLEN);
        ck_assert_int_eq(pat_check(buf->p + (size_t)i * RLEN, (size_t)res, off), -1);
        off += (size_t)res;
    }
    pthread_join(th, NULL);
    ck_assert_int_eq(w.err, 0);
    ck_assert_uint_eq(off, w.total);
    /* the end of the stream completes what is left with 0, in order */
    {
        exs_event_t e2;
        long last = 0;
        int n = 0;

        while (it_try_event(q, EXS_EVT_RECV, b, 2000, &e2)) {
            ck_assert_int_eq(e2.exs_evt_errno, 0);
            ck_assert_int_eq(e2.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
            ck_assert_int_gt(IT_AHN(e2.exs_evt_ahandle), last);
            last = IT_AHN(e2.exs_evt_ahandle);
            n++;
        }
        ck_assert_int_eq(last, NRECV);
        ck_assert_int_gt(n, 0);
    }
    ck_assert_int_eq(fcntl(b, F_GETFL), fl0);
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* ---- cancel, shutdown, close ---- */

/* exs_cancel of a pending receive gives its ECANCELED event, leaves the other one
 * pending, and the descriptor keeps working; nothing pending: 0. */
START_TEST(test_kfd_cancel)
{
    struct it_buf *buf;
    exs_qhandle_t q;
    int a, b;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    buf = it_buf_new(200, 0);
    IT_EXPECT_OK(exs_cancel(b, AH(9), 0)); /* nothing pending */
    IT_POST_RECV(b, buf->p, 100, q, AH(1), buf->mh);
    IT_POST_RECV(b, buf->p + 100, 100, q, AH(2), buf->mh);
    IT_EXPECT_FAIL(exs_cancel(b, AH(1), 0x40), EINVAL);
    IT_EXPECT_OK(exs_cancel(b, AH(1), 0));
    it_expect_err(q, EXS_EVT_RECV, b, AH(1), ECANCELED);
    it_expect_no_event(q, 100);
    /* the second receive gets the data */
    pat_fill(buf->p + 150, 10, 0);
    ck_assert_int_eq(send(a, buf->p + 150, 10, 0), 10);
    it_expect_recv(q, b, AH(2), 10, 0);
    ck_assert_int_eq(pat_check(buf->p + 100, 10, 0), -1);
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* exs_shutdown(SHUT_WR) runs after the sends queued before it: the peer reads every
 * byte, then the end of stream; events: the sends, then SHUTDOWN. */
START_TEST(test_kfd_shutdown)
{
    enum { LEN = 4 << 20 };
    struct reader r = {.slow = 0};
    struct it_buf *buf;
    pthread_t th;
    exs_qhandle_t q;
    exs_event_t ev;
    char c;
    int a, b;

    it_init();
    q = it_qcreate(8);
    /* smaller buffers make loopback TCP stall ~200 ms per window (its persist timer), which
     * the timeout of a loaded guest once hit */
    it_tcp_pair(&a, &b, 32768, 32768);
    buf = it_buf_new(LEN, 1);
    pat_fill(buf->p, LEN, 0);
    IT_POST_SEND(a, buf->p, LEN / 2, q, AH(1), buf->mh);
    IT_POST_SEND(a, buf->p + LEN / 2, LEN / 2, q, AH(2), buf->mh);
    IT_EXPECT_FAIL(exs_shutdown(a, 7, q, AH(3)), EINVAL);
    IT_EXPECT_OK(exs_shutdown(a, SHUT_WR, q, AH(3)));
    r.fd = b;
    r.total = LEN;
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &r), 0);
    it_wait_event(q, -1, a, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
    ck_assert(ev.exs_evt_ahandle == AH(1));
    it_wait_event(q, -1, a, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    it_wait_event(q, -1, a, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SHUTDOWN);
    ck_assert(ev.exs_evt_ahandle == AH(3));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    pthread_join(th, NULL);
    ck_assert_msg(r.bad < 0 && r.got == LEN, "got %zu bad %ld", r.got, r.bad);
    ck_assert_int_eq(recv(b, &c, 1, 0), 0); /* end of stream */
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* exs_close with operations pending: each ends with ECANCELED, then the CLOSE event;
 * the descriptor is closed. */
START_TEST(test_kfd_close_pending)
{
    enum { LEN = 4 << 20 };
    struct it_buf *buf, *rb;
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 4096, 4096);
    buf = it_buf_new(LEN, 1);
    rb = it_buf_new(100, 0);
    /* nobody reads: the sends wait for the kernel */
    IT_POST_SEND(a, buf->p, LEN / 2, q, AH(1), buf->mh);
    IT_POST_SEND(a, buf->p + LEN / 2, LEN / 2, q, AH(2), buf->mh);
    IT_POST_RECV(a, rb->p, 100, q, AH(3), rb->mh);
    it_expect_no_event(q, 100);
    IT_EXPECT_OK(exs_close(a, q, AH(4)));
    it_expect_err(q, EXS_EVT_SEND, a, AH(1), ECANCELED);
    it_expect_err(q, EXS_EVT_SEND, a, AH(2), ECANCELED);
    it_expect_err(q, EXS_EVT_RECV, a, AH(3), ECANCELED);
    it_wait_event(q, EXS_EVT_CLOSE, a, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(4));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    errno = 0;
    ck_assert_int_eq(fcntl(a, F_GETFD), -1);
    ck_assert_int_eq(errno, EBADF);
    /* a synchronous close of an idle kernel socket */
    ck_assert_int_eq(exs_close(b, EXS_QHANDLE_INVALID, AH(0)), 0);
    errno = 0;
    ck_assert_int_eq(fcntl(b, F_GETFD), -1);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* The application closes the descriptor itself after the last event; the number,
 * reused by a new socket, works afresh (no state was kept). */
START_TEST(test_kfd_reuse)
{
    struct it_buf *buf;
    exs_qhandle_t q;
    int a, b, a2, b2, fl0;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 32768, 32768); /* as test_kfd_shutdown */
    buf = it_buf_new(1 << 20, 1);
    fl0 = fcntl(b, F_GETFL);
    /* a receive that waits (the watcher is on), then completes */
    IT_POST_RECV(b, buf->p, 100, q, AH(1), buf->mh);
    it_expect_no_event(q, 50);
    pat_fill(buf->p + 1000, 100, 0);
    ck_assert_int_eq(send(a, buf->p + 1000, 100, 0), 100);
    it_expect_recv(q, b, AH(1), 100, 0);
    ck_assert_int_eq(fcntl(b, F_GETFL), fl0);
    close(b);
    close(a);
    /* the same numbers again */
    it_tcp_pair(&a2, &b2, 32768, 32768);
    if (a2 != b && b2 != b) {
        close(a2);
        close(b2);
        it_kfd_settle(q);
        it_qdelete(q);
        printf("SKIP test_kfd_reuse: descriptor %d was not reused\n", b);
        return;
    }
    {
        int nb = a2 == b ? a2 : b2, peer = a2 == b ? b2 : a2;
        uint8_t tmp[300];

        /* a send big enough to wait, and a receive */
        pat_fill(buf->p, 1 << 20, 0);
        IT_POST_SEND(nb, buf->p, 1 << 20, q, AH(2), buf->mh);
        IT_POST_RECV(nb, buf->p + 4096, 300, q, AH(3), buf->mh);
        pat_fill(tmp, 300, 5);
        ck_assert_int_eq(send(peer, tmp, 300, 0), 300);
        it_expect_recv(q, nb, AH(3), 300, 0);
        {
            struct reader r = {.fd = peer, .total = 1 << 20};

            reader_main(&r);
            ck_assert_msg(r.bad < 0 && r.got == (1u << 20), "got %zu bad %ld", r.got, r.bad);
        }
        it_expect_send(q, nb, AH(2), 1 << 20);
        close(a2);
        close(b2);
    }
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* A peer that resets: the pending operations complete with its error, and no SIGPIPE
 * ends the process (SIGPIPE at its default action here). */
START_TEST(test_kfd_reset)
{
    enum { LEN = 2 << 20 };
    struct sigaction old;
    struct it_buf *buf, *rb;
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;

    q = it_kfd_reset_open(&a, &b, &old);
    buf = it_buf_new(LEN, 1);
    rb = it_buf_new(100, 1);
    IT_POST_RECV(a, rb->p, 100, q, AH(1), rb->mh);
    IT_POST_SEND(a, buf->p, LEN / 2, q, AH(2), buf->mh);
    IT_POST_SEND(a, buf->p + LEN / 2, LEN / 2, q, AH(3), buf->mh);
    it_expect_no_event(q, 50);
    it_tcp_reset(b);
    it_wait_event(q, EXS_EVT_RECV, a, &ev);
    ck_assert_msg(ev.exs_evt_errno == ECONNRESET, "recv errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, -1);
    for (int i = 2; i <= 3; i++) {
        it_wait_event(q, EXS_EVT_SEND, a, &ev);
        ck_assert(ev.exs_evt_ahandle == AH(i));
        ck_assert_msg(ev.exs_evt_errno == ECONNRESET || ev.exs_evt_errno == EPIPE,
                      "send %d errno %d", i, ev.exs_evt_errno);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, -1);
    }
    /* a send after the reset fails in its event, still without SIGPIPE */
    IT_POST_SEND(a, buf->p, 10, q, AH(4), buf->mh);
    it_expect_err(q, EXS_EVT_SEND, a, AH(4), EPIPE);
    sigaction(SIGPIPE, &old, NULL);
    it_kfd_settle(q);
    close(a);
    it_qdelete(q);
}
END_TEST

/* A waiter that spins (EXS_WAIT_POLL; EXS_WAIT_ADAPTIVE with a spin longer than the wait)
 * takes the progress lock at every turn and never sleeps on the kernel sockets' epoll set:
 * with the progress thread kept off it (test seam EXS_TEST_ENGINE_PARK, which stands for
 * a loop thread that keeps losing the lock to the spinner), a send that must wait for
 * EPOLLOUT and a receive that must wait for EPOLLIN still complete, run by the spinner. */
START_TEST(test_kfd_spin_ready)
{
    enum { LEN = 4 << 20 };
    static const int modes[] = {EXS_WAIT_POLL, EXS_WAIT_ADAPTIVE};
    struct reader r = {.slow = 0};
    struct it_buf *buf;
    pthread_t th;
    exs_qhandle_t q;
    exs_event_t ev;
    char rb[16];
    int a, b;

    it_setenv("EXS_TEST_ENGINE_PARK", "1");
    it_init();
    q = it_qcreate(8);
    IT_EXPECT_OK(exs_qsetwait(q, modes[_i], 60 * 1000 * 1000));
    it_tcp_pair(&a, &b, 32768, 32768); /* as test_kfd_shutdown */
    buf = it_buf_new(LEN, 1);
    pat_fill(buf->p, LEN, 0);
    /* more than the socket buffers hold: the send waits for EPOLLOUT */
    IT_POST_SEND(a, buf->p, LEN, q, AH(1), buf->mh);
    r.fd = b;
    r.total = LEN;
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &r), 0);
    it_wait_event_at(q, EXS_EVT_SEND, a, 20000, &ev, __FILE__, __LINE__);
    ck_assert(ev.exs_evt_ahandle == AH(1));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, LEN);
    pthread_join(th, NULL);
    ck_assert_msg(r.bad < 0 && r.got == LEN, "got %zu bad %ld", r.got, r.bad);
    /* nothing to read yet: the receive waits for EPOLLIN */
    ck_assert_int_eq(exs_recv(a, rb, sizeof(rb), 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_eq(send(b, "spin", 4, 0), 4);
    it_wait_event_at(q, EXS_EVT_RECV, a, 20000, &ev, __FILE__, __LINE__);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 4);
    ck_assert_int_eq(memcmp(rb, "spin", 4), 0);
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* exs_fini with operations pending on kernel sockets drops them (no leak) and leaves the
 * descriptors open and unchanged; after exs_init again they work afresh. */
START_TEST(test_kfd_fini_pending)
{
    enum { LEN = 2 << 20 };
    uint8_t *big = malloc(LEN), rbuf[100];
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b, c, d, flb, flc;

    ck_assert_ptr_nonnull(big);
    it_init();
    q = exs_qcreate(8); /* not tracked: exs_fini below frees it */
    ck_assert_int_ne(q, EXS_QHANDLE_INVALID);
    it_tcp_pair(&a, &b, 0, 0);
    it_tcp_pair(&c, &d, 4096, 4096);
    flb = fcntl(b, F_GETFL);
    flc = fcntl(c, F_GETFL);
    memset(big, 0x5a, LEN);
    /* a receive that waits, and a send nobody reads */
    ck_assert_int_eq(exs_recv(b, rbuf, sizeof(rbuf), 0, q, AH(1), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_eq(exs_send(c, big, LEN, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_gt(exs__debug_kfd_live(), 0);
    exs_fini();
    ck_assert_int_eq(exs__debug_live_objects(), 0);
    ck_assert_int_eq(fcntl(b, F_GETFL), flb);
    ck_assert_int_eq(fcntl(c, F_GETFL), flc);
    /* again, on the same descriptor */
    ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION);
    q = exs_qcreate(8);
    ck_assert_int_ne(q, EXS_QHANDLE_INVALID);
    ck_assert_int_eq(exs_recv(b, rbuf, sizeof(rbuf), 0, q, AH(3), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_eq(send(a, "hello", 5, 0), 5);
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &(struct timespec){IT_TIMEOUT_MS / 1000, 0}), 1);
    ck_assert(ev.exs_evt_ahandle == AH(3));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 5);
    ck_assert_int_eq(memcmp(rbuf, "hello", 5), 0);
    it_kfd_settle(q);
    ck_assert_int_eq(exs_qdelete(q), 0);
    close(a);
    close(b);
    close(c);
    close(d);
    free(big);
}
END_TEST

/* Descriptors that are not kernel stream sockets stay ENOTSOCK; bad arguments EINVAL. */
START_TEST(test_kfd_errors)
{
    struct it_buf *buf;
    exs_qhandle_t q;
    int u, a, b;

    it_init();
    q = it_qcreate(4);
    buf = it_buf_new(64, 1);
    u = socket(AF_INET, SOCK_DGRAM, 0);
    ck_assert_int_ge(u, 0);
    IT_EXPECT_FAIL(exs_send(u, buf->p, 64, 0, q, AH(1), buf->mh), ENOTSOCK);
    IT_EXPECT_FAIL(exs_recv(u, buf->p, 64, 0, q, AH(1), buf->mh), ENOTSOCK);
    IT_EXPECT_FAIL(exs_shutdown(u, SHUT_WR, q, AH(1)), ENOTSOCK);
    IT_EXPECT_FAIL(exs_close(u, q, AH(1)), ENOTSOCK);
    IT_EXPECT_FAIL(exs_cancel(u, AH(1), 0), ENOTSOCK);
    close(u);
    it_tcp_pair(&a, &b, 0, 0);
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, MSG_OOB, q, AH(1), buf->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(a, buf->p, 0, 0, q, AH(1), buf->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(a, buf->p, 65, 0, q, AH(1), buf->mh), EINVAL); /* beyond mh */
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, 0, q, AH(1), EXS_MHANDLE_INVALID), EINVAL);
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, 0, 12345, AH(1), buf->mh), EINVAL);
    it_expect_no_event(q, 50);
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* ---- signals ---- */

/* One task's SigBlk mask and name (comm); 0 when it exited meanwhile. */
static int task_read(const char *tid, unsigned long long *blk, char *comm, size_t clen)
{
    char path[300], line[256];
    int found = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
    f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "SigBlk: %llx", blk) == 1) {
            found = 1;
            break;
        }
    fclose(f);
    ck_assert_msg(found, "no SigBlk line for task %s", tid);
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", tid);
    comm[0] = 0;
    f = fopen(path, "r");
    if (f) {
        if (!fgets(comm, (int)clen, f))
            comm[0] = 0;
        fclose(f);
    }
    comm[strcspn(comm, "\n")] = 0;
    return 1;
}

#define SIGBIT(_s) (1ull << ((_s)-1))

/* Every thread but this one blocks SIGALRM and SIGINT; the library's own (named exs-*:
 * the progress thread, provider threads) keep SIGSEGV deliverable. A thread that is
 * still starting has every signal blocked (the C library unblocks them in the new
 * thread), so the check is repeated until the library's threads are up (bounded). */
START_TEST(test_sig_threads_blocked)
{
    pid_t self = (pid_t)syscall(SYS_gettid);
    char why[400] = "";
    int settled = 0;

    it_init();
    for (int round = 0; round < 200 && !settled; round++) {
        struct dirent *de;
        DIR *d = opendir("/proc/self/task");
        int lib = 0, starting = 0;

        ck_assert_ptr_nonnull(d);
        while ((de = readdir(d))) {
            unsigned long long blk = 0;
            char comm[64];

            if (de->d_name[0] == '.' || atoi(de->d_name) == self)
                continue;
            if (!task_read(de->d_name, &blk, comm, sizeof(comm)))
                continue;
            ck_assert_msg(blk & SIGBIT(SIGALRM), "task %s (%s) does not block SIGALRM (%llx)",
                          de->d_name, comm, blk);
            ck_assert_msg(blk & SIGBIT(SIGINT), "task %s (%s) does not block SIGINT (%llx)",
                          de->d_name, comm, blk);
            if (strncmp(comm, "exs-", 4) != 0)
                continue; /* not the library's (or not named yet) */
            lib++;
            if (blk & SIGBIT(SIGSEGV)) {
                starting++;
                snprintf(why, sizeof(why), "task %s (%s) blocks SIGSEGV (%llx)", de->d_name, comm,
                         blk);
            }
        }
        closedir(d);
        if (!lib)
            snprintf(why, sizeof(why), "no exs-* thread");
        settled = lib > 0 && !starting;
        if (!settled)
            it_sleep_ms(10);
    }
    ck_assert_msg(settled, "%s", why);
}
END_TEST

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* A process-wide SIGALRM (setitimer, handler with sa_flags 0) interrupts a waiting
 * exs_qdequeue with EINTR: the library's threads do not take it. */
START_TEST(test_sig_alarm_eintr)
{
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    struct itimerval it = {.it_interval = {0, 50000}, .it_value = {0, 50000}};
    struct itimerval off = {{0, 0}, {0, 0}};
    exs_qhandle_t q;
    exs_event_t ev;
    int r, e;

    it_init();
    q = it_qcreate(4);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ck_assert_int_eq(sigaction(SIGALRM, &sa, &old), 0);
    alarms = 0;
    ck_assert_int_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
    r = exs_qdequeue(q, &ev, -1, NULL);
    e = errno;
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    ck_assert_msg(r == -1 && e == EINTR, "exs_qdequeue: %d errno %d, expected -1 EINTR", r, e);
    ck_assert_int_gt(alarms, 0);
    it_qdelete(q);
}
END_TEST

/* ---- SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT on kernel sockets ---- */

static void kset(int fd, int name, int v)
{
    IT_EXPECT_OK(exs_setsockopt(fd, SOL_EXS, name, &v, sizeof(v)));
}

static int kget(int fd, int name)
{
    int v = -1;
    socklen_t len = sizeof(v);

    IT_EXPECT_OK(exs_getsockopt(fd, SOL_SOCKET, name, &v, &len));
    ck_assert_int_eq(len, sizeof(int));
    return v;
}

/* The next notice of (q, type, fd): ahandle ah, count, never early, buf as posted. */
static void kfd_expect_notice(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, unsigned count,
                              unsigned ivl_ms, const void *buf)
{
    exs_event_t ev;

    it_wait_event(q, type, fd, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, ah);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_timeout.exs_evt_buf, buf);
    ck_assert_uint_eq(ev.exs_evt_u.exs_evt_timeout.exs_evt_count, count);
    ck_assert_uint_ge(ev.exs_evt_u.exs_evt_timeout.exs_evt_elapsed_ms, count * ivl_ms);
}

/* The completion of (q, type, fd) after any notices: its result. */
static ssize_t kfd_expect_done(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah)
{
    exs_event_t ev;

    for (;;) {
        it_wait_event(q, -1, fd, &ev);
        if (ev.exs_evt_type != EXS_EVT_SENDTIMEOUT && ev.exs_evt_type != EXS_EVT_RECVTIMEOUT)
            break;
        ck_assert_ptr_eq(ev.exs_evt_ahandle, ah);
    }
    ck_assert_int_eq(ev.exs_evt_type, type);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, ah);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    return ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
}

/* A receive outstanding past the interval gets a notice per interval (counted, never
 * early), then its own event and no notice after it; the option stays with the socket
 * for the next receive; set to 0 with nothing pending, nothing is kept. */
START_TEST(test_kfd_to_recv)
{
    struct timeval tv;
    exs_qhandle_t q;
    socklen_t len;
    char buf[64];
    int a, b;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_TIMEOUT), 0);
    kset(b, SO_ASYNC_RECV_TIMEOUT, 100);
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_TIMEOUT), 100);
    ck_assert_int_eq(kget(b, SO_ASYNC_SEND_TIMEOUT), 0);
    len = sizeof(tv);
    IT_EXPECT_OK(exs_getsockopt(b, SOL_EXS, SO_ASYNC_RECV_TIMEOUT, &tv, &len));
    ck_assert_int_eq(len, sizeof(tv));
    ck_assert_int_eq(tv.tv_sec, 0);
    ck_assert_int_eq(tv.tv_usec, 100000);
    IT_POST_RECV(b, buf, sizeof(buf), q, AH(1), EXS_MHANDLE_UNREGISTERED);
    kfd_expect_notice(q, EXS_EVT_RECVTIMEOUT, b, AH(1), 1, 100, buf);
    kfd_expect_notice(q, EXS_EVT_RECVTIMEOUT, b, AH(1), 2, 100, buf);
    ck_assert_int_eq(send(a, "abc", 3, 0), 3);
    ck_assert_int_eq(kfd_expect_done(q, EXS_EVT_RECV, b, AH(1)), 3);
    it_expect_no_event(q, 300); /* no notice after the completion */
    /* kept with the socket between operations */
    ck_assert_int_eq(exs__debug_kfd_live(), 1);
    IT_POST_RECV(b, buf, sizeof(buf), q, AH(2), EXS_MHANDLE_UNREGISTERED);
    kfd_expect_notice(q, EXS_EVT_RECVTIMEOUT, b, AH(2), 1, 100, buf);
    ck_assert_int_eq(send(a, "de", 2, 0), 2);
    ck_assert_int_eq(kfd_expect_done(q, EXS_EVT_RECV, b, AH(2)), 2);
    ck_assert_int_eq(memcmp(buf, "de", 2), 0);
    /* a synchronous receive gets no notice (its event would be its queue's) */
    ck_assert_int_eq(send(a, "f", 1, 0), 1);
    ck_assert_int_eq(
        exs_recv(b, buf, sizeof(buf), 0, EXS_QHANDLE_INVALID, NULL, EXS_MHANDLE_UNREGISTERED), 1);
    /* off: no state is left */
    kset(b, SO_ASYNC_RECV_TIMEOUT, 0);
    it_kfd_settle(q);
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_TIMEOUT), 0);
    close(a);
    close(b);
}
END_TEST

/* EXS_TIMEOUT_ONCE on a send the kernel cannot take (nobody reads): one notice, then the
 * send completes normally once the peer reads, every byte in order; exs_close drops the
 * option with the descriptor. */
START_TEST(test_kfd_to_send_once)
{
    enum { LEN = 32 << 20 }; /* more than the kernel buffers hold */
    struct reader r = {0};
    uint8_t *big = malloc(LEN);
    exs_qhandle_t q;
    pthread_t th;
    int a, b;

    ck_assert_ptr_nonnull(big);
    pat_fill(big, LEN, 0);
    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    kset(a, SO_ASYNC_SEND_TIMEOUT, 80 | EXS_TIMEOUT_ONCE);
    ck_assert_int_eq(kget(a, SO_ASYNC_SEND_TIMEOUT), 80 | EXS_TIMEOUT_ONCE);
    IT_POST_SEND(a, big, LEN, q, AH(3), EXS_MHANDLE_UNREGISTERED);
    kfd_expect_notice(q, EXS_EVT_SENDTIMEOUT, a, AH(3), 1, 80, big);
    it_expect_no_event(q, 400); /* once: no second notice, and the send is still out */
    r.fd = b;
    r.total = LEN;
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &r), 0);
    ck_assert_int_eq(kfd_expect_done(q, EXS_EVT_SEND, a, AH(3)), LEN);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_uint_eq(r.got, LEN);
    ck_assert_int_eq(r.bad, -1);
    it_expect_no_event(q, 200);
    it_close(a, q); /* the descriptor goes, and its options with it */
    it_kfd_settle(q);
    close(b);
    free(big);
}
END_TEST

/* The application closes a descriptor with an option set (without exs_close) and the
 * number then names another socket: the option is not applied to it, and the old state
 * is dropped. */
START_TEST(test_kfd_to_reuse)
{
    exs_qhandle_t q;
    char buf[16];
    int a, b, c, d;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    kset(b, SO_ASYNC_RECV_TIMEOUT, 50);
    kset(b, SO_ASYNC_SEND_TIMEOUT, 50);
    it_tcp_pair(&c, &d, 0, 0);
    ck_assert_int_eq(dup2(d, b), b); /* closes b's socket: the number names d's now */
    close(d);
    close(a);
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_TIMEOUT), 0);
    IT_POST_RECV(b, buf, sizeof(buf), q, AH(4), EXS_MHANDLE_UNREGISTERED);
    it_expect_no_event(q, 300); /* no notice: the new socket has no timeout */
    ck_assert_int_eq(send(c, "x", 1, 0), 1);
    it_expect_recv(q, b, AH(4), 1, 0);
    it_kfd_settle(q); /* nothing of the old socket is left */
    close(b);
    close(c);
}
END_TEST

/* Slots and errors: a receive with a timeout takes two slots of its queue (EAGAIN when
 * it cannot); values are checked as on exs sockets; other options are not kernel
 * sockets' to set here; exs_fini with a registered operation leaves nothing. */
START_TEST(test_kfd_to_slots)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = 1};
    exs_qhandle_t q;
    char buf[16], buf2[16];
    int a, b, v, p[2];

    it_init();
    q = it_qcreate(2);
    it_tcp_pair(&a, &b, 0, 0);
    IT_EXPECT_OK(exs_setsockopt(b, SOL_SOCKET, SO_ASYNC_RECV_TIMEOUT, &tv, sizeof(tv)));
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_TIMEOUT), 1); /* rounded up */
    kset(b, SO_ASYNC_RECV_TIMEOUT, 5000);
    IT_POST_RECV(b, buf, sizeof(buf), q, AH(5), EXS_MHANDLE_UNREGISTERED);
    IT_EXPECT_FAIL(exs_recv(b, buf2, sizeof(buf2), 0, q, AH(6), EXS_MHANDLE_UNREGISTERED), EAGAIN);
    ck_assert_int_eq(send(a, "0123", 4, 0), 4);
    it_expect_recv(q, b, AH(5), 4, 0);
    /* without the option the same queue takes two receives */
    kset(b, SO_ASYNC_RECV_TIMEOUT, 0);
    IT_POST_RECV(b, buf, sizeof(buf), q, AH(5), EXS_MHANDLE_UNREGISTERED);
    IT_POST_RECV(b, buf2, sizeof(buf2), q, AH(6), EXS_MHANDLE_UNREGISTERED);
    ck_assert_int_eq(send(a, "0123456789abcdef0123", 20, 0), 20);
    it_expect_recv(q, b, AH(5), IT_ANY_RESULT, 0);
    it_expect_recv(q, b, AH(6), IT_ANY_RESULT, 0);
    v = -1;
    IT_EXPECT_FAIL(exs_setsockopt(b, SOL_EXS, SO_ASYNC_SEND_TIMEOUT, &v, sizeof(v)), EINVAL);
    v = EXS_TIMEOUT_ONCE;
    IT_EXPECT_FAIL(exs_setsockopt(b, SOL_EXS, SO_ASYNC_SEND_TIMEOUT, &v, sizeof(v)), EINVAL);
    v = 1;
    IT_EXPECT_FAIL(exs_setsockopt(b, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)), ENOPROTOOPT);
    IT_EXPECT_OK(exs_setsockopt(b, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &v, sizeof(v)));
    ck_assert_int_eq(kget(b, SO_ASYNC_RECV_ORDERED), 1);
    ck_assert_int_eq(pipe(p), 0);
    v = 100;
    IT_EXPECT_FAIL(exs_setsockopt(p[0], SOL_EXS, SO_ASYNC_SEND_TIMEOUT, &v, sizeof(v)), ENOTSOCK);
    close(p[0]);
    close(p[1]);
    it_kfd_settle(q);
    it_qdelete(q);
    /* exs_fini while a receive is registered for notices: nothing leaks */
    q = exs_qcreate(8); /* not tracked: exs_fini frees it */
    ck_assert_int_ne(q, EXS_QHANDLE_INVALID);
    kset(b, SO_ASYNC_RECV_TIMEOUT, 20);
    ck_assert_int_eq(exs_recv(b, buf, sizeof(buf), 0, q, AH(7), EXS_MHANDLE_UNREGISTERED), 0);
    exs_event_t ev;
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &(struct timespec){IT_TIMEOUT_MS / 1000, 0}), 1);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECVTIMEOUT);
    ck_assert(ev.exs_evt_ahandle == AH(7));
    exs_fini(); /* the receive is still registered for notices */
    ck_assert_int_eq(exs__debug_live_objects(), 0);
    close(a);
    close(b);
}
END_TEST

Suite *integ_kfd_suite(void)
{
    Suite *s = suite_create("integ_kfd");

    it_suite_add(s, "kfd_send", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_kfd_send_order, NULL});
    it_suite_add(s, "kfd_recv", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_kfd_recv_order, NULL});
    it_suite_add(s, "kfd_ops", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_kfd_cancel, test_kfd_shutdown, test_kfd_close_pending,
                                        test_kfd_reuse, test_kfd_reset, test_kfd_errors,
                                        test_kfd_fini_pending, NULL});
    it_suite_add(s, "kfd_spin", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_kfd_spin_ready, NULL});
    it_suite_add(s, "kfd_timeouts", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_kfd_to_recv, test_kfd_to_send_once, test_kfd_to_reuse,
                                        test_kfd_to_slots, NULL});
    it_suite_add(s, "signals", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_sig_threads_blocked, test_sig_alarm_eintr, NULL});
    return s;
}
