/* SPDX-License-Identifier: MIT */
/* What the library keeps of a kernel socket between calls (api/kfd.c, spec/api.md "Kernel
 * sockets") never makes a call answer otherwise than the kernel would: the number closed,
 * reused by a file or by a socket the send cannot reach, or dup2'd over, gives EBADF /
 * ENOTSOCK at the call, writes and reads nothing, and another stream socket there starts
 * afresh; a send the kernel takes at once goes where send() would put it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/resource.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api.h"
#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* One byte sent on fd with exs_send completes (the descriptor's state is cached), and
 * peer reads it. */
static void send_one(exs_qhandle_t q, int fd, int peer, char c)
{
    char got = 0;

    IT_POST_SEND(fd, &c, 1, q, AH(1), EXS_MHANDLE_UNREGISTERED);
    it_expect_send(q, fd, AH(1), 1);
    ck_assert_int_eq(recv(peer, &got, 1, MSG_WAITALL), 1);
    ck_assert_int_eq(got, c);
}

/* A connected datagram-like pair of the given kind: *x the one dup2'd over the number. */
static void dgram_pair(int kind, int *x, int *y)
{
    if (kind == 0) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);

        *y = socket(AF_INET, SOCK_DGRAM, 0);
        ck_assert_int_ge(*y, 0);
        ck_assert_int_eq(bind(*y, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(getsockname(*y, (struct sockaddr *)&sa, &len), 0);
        *x = socket(AF_INET, SOCK_DGRAM, 0);
        ck_assert_int_ge(*x, 0);
        ck_assert_int_eq(connect(*x, (struct sockaddr *)&sa, sizeof(sa)), 0);
        len = sizeof(sa);
        ck_assert_int_eq(getsockname(*x, (struct sockaddr *)&sa, &len), 0);
        ck_assert_int_eq(connect(*y, (struct sockaddr *)&sa, sizeof(sa)), 0);
    } else {
        int sv[2];

        ck_assert_int_eq(socketpair(AF_UNIX, kind == 1 ? SOCK_SEQPACKET : SOCK_DGRAM, 0, sv), 0);
        *x = sv[0];
        *y = sv[1];
    }
}

/* Nothing to read on fd. */
static void expect_nothing(int fd)
{
    char c;

    ck_assert_int_eq(recv(fd, &c, 1, MSG_DONTWAIT), -1);
    ck_assert_int_eq(errno, EAGAIN);
}

START_TEST(test_kfdc_closed_and_files)
{
    exs_qhandle_t q;
    int a, b, n, f;
    char buf[4];

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    send_one(q, a, b, 'x'); /* trusted now */
    /* a synchronous send: the thread's queue (a descriptor) is made before a's number frees */
    ck_assert_int_eq(exs_send(a, "y", 1, 0, EXS_QHANDLE_INVALID, AH(1), EXS_MHANDLE_UNREGISTERED),
                     1);
    ck_assert_int_eq(recv(b, buf, 1, MSG_WAITALL), 1);
    n = a;
    ck_assert_int_eq(close(a), 0);
    /* the number names nothing */
    IT_EXPECT_FAIL(exs_send(n, "z", 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), EBADF);
    IT_EXPECT_FAIL(exs_send(n, "z", 1, 0, EXS_QHANDLE_INVALID, AH(2), EXS_MHANDLE_UNREGISTERED),
                   EBADF);
    IT_EXPECT_FAIL(exs_recv(n, buf, 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), EBADF);
    /* the descriptor's error before the arguments' (MSG_WAITALL is no send flag) */
    IT_EXPECT_FAIL(exs_send(n, "z", 1, MSG_WAITALL, q, AH(2), EXS_MHANDLE_UNREGISTERED), EBADF);
    /* a file */
    f = open("/dev/null", O_RDWR | O_CLOEXEC);
    ck_assert_int_ge(f, 0);
    ck_assert_int_eq(dup2(f, n), n);
    IT_EXPECT_FAIL(exs_send(n, "z", 1, 0, q, AH(3), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    IT_EXPECT_FAIL(exs_recv(n, buf, 1, 0, q, AH(3), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    /* a pipe */
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(dup2(p[1], n), n);
    IT_EXPECT_FAIL(exs_send(n, "z", 1, 0, q, AH(4), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    ck_assert_int_eq(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    ck_assert_int_eq(read(p[0], buf, 1), -1); /* nothing written into it */
    ck_assert_int_eq(errno, EAGAIN);
    close(p[0]);
    close(p[1]);
    close(f);
    close(n);
    ck_assert_int_eq(recv(b, buf, 1, MSG_DONTWAIT), 0); /* the end, no 'z' */
    it_expect_no_event(q, 50);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
    ck_assert_int_gt(exs__debug_kfd_cached(), 0);
    it_fini();
    ck_assert_int_eq(exs__debug_kfd_cached(), 0);
}
END_TEST

/* A socket of another kind dup2'd over a trusted TCP descriptor: connected UDP, AF_UNIX
 * seqpacket and datagram pairs. A send the kernel takes at once is not checked again
 * (spec/api.md 5.14: no probe, send() speed): it goes to the socket the number names now,
 * as send() would, and completes; a send it refuses is checked (ENOTSOCK, nothing
 * written); every receive is checked (ENOTSOCK, nothing read). Unconnected, the datagram
 * socket refuses the send: ENOTSOCK. */
START_TEST(test_kfdc_other_sockets)
{
    static const char *const names[] = {"udp", "unix seqpacket", "unix dgram"};
    exs_qhandle_t q;
    int a, b, x, y;
    char buf[8];

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    for (int kind = 0; kind < 3; kind++) {
        it_context("%s", names[kind]);
        send_one(q, a, b, 'a');
        send_one(q, a, b, 'b');
        dgram_pair(kind, &x, &y);
        int saved = dup(a);
        ck_assert_int_ge(saved, 0);
        ck_assert_int_eq(dup2(x, a), a);
        /* the send goes where send() would: one datagram on y */
        IT_POST_SEND(a, "c", 1, q, AH(2), EXS_MHANDLE_UNREGISTERED);
        it_expect_send(q, a, AH(2), 1);
        ck_assert_int_eq(
            exs_send(a, "d", 1, 0, EXS_QHANDLE_INVALID, AH(2), EXS_MHANDLE_UNREGISTERED), 1);
        ck_assert_int_eq(recv(y, buf, sizeof(buf), MSG_DONTWAIT), 1);
        ck_assert_int_eq(buf[0], 'c');
        ck_assert_int_eq(recv(y, buf, sizeof(buf), MSG_DONTWAIT), 1);
        ck_assert_int_eq(buf[0], 'd');
        expect_nothing(y);
        ck_assert_int_eq(send(y, "dg", 2, 0), 2);
        IT_EXPECT_FAIL(exs_recv(a, buf, sizeof(buf), 0, q, AH(3), EXS_MHANDLE_UNREGISTERED),
                       ENOTSOCK);
        ck_assert_int_eq(recv(x, buf, sizeof(buf), MSG_DONTWAIT), 2); /* still there */
        /* the receive's check found another socket: the number is checked again */
        IT_EXPECT_FAIL(exs_send(a, "e", 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
        expect_nothing(y);
        it_expect_no_event(q, 20);
        /* the TCP socket back at its number: trusted again after its check */
        ck_assert_int_eq(dup2(saved, a), a);
        close(saved);
        close(x);
        close(y);
    }
    send_one(q, a, b, 'e');
    expect_nothing(b);
    /* an unconnected datagram socket refuses the send: checked, ENOTSOCK, nothing sent */
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    ck_assert_int_ge(u, 0);
    int saved = dup(a);
    ck_assert_int_eq(dup2(u, a), a);
    IT_EXPECT_FAIL(exs_send(a, "f", 1, 0, q, AH(4), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    IT_EXPECT_FAIL(exs_send(a, "f", 1, 0, q, AH(4), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    it_expect_no_event(q, 20);
    ck_assert_int_eq(dup2(saved, a), a);
    close(saved);
    close(u);
    send_one(q, a, b, 'g');
    expect_nothing(b);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* Another TCP connection at the number after the first one failed (reset by its peer):
 * it starts afresh, the failure is not latched onto it. */
START_TEST(test_kfdc_other_tcp)
{
    exs_qhandle_t q;
    int a, b, c, d;
    char big[4096];
    exs_event_t ev;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    it_tcp_pair(&c, &d, 0, 0);
    send_one(q, a, b, 'a');
    it_tcp_reset(b);
    /* sends on a until the reset is seen */
    memset(big, 'r', sizeof(big));
    for (int i = 0;; i++) {
        ck_assert_int_lt(i, 1000);
        IT_POST_SEND(a, big, sizeof(big), q, AH(1), EXS_MHANDLE_UNREGISTERED);
        it_wait_event(q, EXS_EVT_SEND, a, &ev);
        if (ev.exs_evt_errno) {
            ck_assert(ev.exs_evt_errno == ECONNRESET || ev.exs_evt_errno == EPIPE);
            break;
        }
    }
    ck_assert_int_eq(dup2(c, a), a);
    close(c);
    send_one(q, a, d, 'n');
    send_one(q, a, d, 'm');
    char r = 0;
    IT_POST_RECV(a, &r, 1, q, AH(5), EXS_MHANDLE_UNREGISTERED);
    ck_assert_int_eq(send(d, "k", 1, 0), 1);
    it_expect_recv(q, a, AH(5), 1, 0);
    ck_assert_int_eq(r, 'k');
    close(a);
    close(d);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* A thread sending on one kernel socket (every send finds its kfd without the table's
 * lock) while the main thread makes kfds at ever higher numbers (the table grows, old
 * arrays stay for readers) and drops them with exs_close (parked kfds, reused by the
 * next): every send completes with its bytes, each number's send reaches its own peer,
 * and no kfd is left but the sender's. Under ASan, a kfd or table freed under a reader
 * would show. */
struct kfdc_race {
    int a, rounds, bad;
};

static void *kfdc_race_sender(void *arg)
{
    struct kfdc_race *r = arg;
    exs_qhandle_t q = exs_qcreate(4);
    exs_event_t ev;

    if (q == EXS_QHANDLE_INVALID)
        return r->bad++, NULL;
    for (int i = 0; i < r->rounds; i++) {
        if (exs_send(r->a, "s", 1, 0, q, AH(7), EXS_MHANDLE_UNREGISTERED) ||
            exs_qdequeue(q, &ev, 1, NULL) != 1 || ev.exs_evt_errno ||
            ev.exs_evt_u.exs_evt_xfer.exs_evt_result != 1) {
            r->bad++;
            break;
        }
    }
    exs_qdelete(q);
    return NULL;
}

START_TEST(test_kfdc_table_race)
{
    struct kfdc_race r = {.rounds = 3000};
    struct rlimit rl;
    exs_qhandle_t q;
    pthread_t th;
    int b, top;
    char buf[4096];

    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    top = (int)(rl.rlim_cur < 4096 ? rl.rlim_cur : 4096) - 16;
    ck_assert_int_gt(top, 200);
    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&r.a, &b, 0, 0);
    ck_assert_int_eq(pthread_create(&th, NULL, kfdc_race_sender, &r), 0);
    for (int i = 0, n = 100; i < 150; i++, n = n * 5 / 4 < top ? n * 5 / 4 : 100 + i) {
        int c, d;
        char got = 0;
        exs_event_t ev;

        it_tcp_pair(&c, &d, 0, 0);
        while (fcntl(n, F_GETFD) != -1 || n == c || n == d)
            n++; /* a free number */
        ck_assert_int_eq(dup2(c, n), n);
        close(c);
        for (int j = 0; j < 3; j++) {
            IT_POST_SEND(n, "n", 1, q, AH(1), EXS_MHANDLE_UNREGISTERED);
            it_expect_send(q, n, AH(1), 1);
            ck_assert_int_eq(recv(d, &got, 1, MSG_WAITALL), 1);
            ck_assert_int_eq(got, 'n');
        }
        IT_EXPECT_OK(exs_close(n, q, AH(2)));
        it_wait_event(q, EXS_EVT_CLOSE, n, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        close(d);
    }
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(r.bad, 0);
    for (int got = 0; got < r.rounds;) {
        ssize_t k = recv(b, buf, sizeof(buf), 0);

        ck_assert_int_gt(k, 0);
        for (ssize_t i = 0; i < k; i++)
            ck_assert_int_eq(buf[i], 's');
        got += (int)k;
    }
    expect_nothing(b);
    ck_assert_int_le(exs__debug_kfd_cached(), 1);
    close(r.a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
    it_fini();
    ck_assert_int_eq(exs__debug_kfd_cached(), 0);
}
END_TEST

/* A checked send is a plain send(): with SO_TIMESTAMPING asking for software transmit
 * timestamps, an exs_send that completes at once records one on the error queue, as
 * send() does (the probe it carried before spec/api.md 5.14's change, an SO_TIMESTAMPING
 * control message asking for none, suppressed it). */
START_TEST(test_kfdc_tx_timestamp)
{
    int a, b, v = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
    exs_qhandle_t q;
    int found = 0;

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    send_one(q, a, b, 'x'); /* checked: the next send goes at once */
    ck_assert_int_eq(setsockopt(a, SOL_SOCKET, SO_TIMESTAMPING, &v, sizeof(v)), 0);
    send_one(q, a, b, 'y');
    for (int tries = 0; tries < 50 && !found; tries++) {
        union {
            char buf[CMSG_SPACE(3 * sizeof(struct timespec)) + CMSG_SPACE(64)];
            struct cmsghdr align;
        } c;
        char data[256];
        struct iovec iov = {.iov_base = data, .iov_len = sizeof(data)};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = c.buf,
                            .msg_controllen = sizeof(c.buf)};
        struct pollfd pfd = {.fd = a};

        if (recvmsg(a, &mh, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
            ck_assert_int_eq(errno, EAGAIN);
            poll(&pfd, 1, 100); /* POLLERR once a timestamp is queued */
            continue;
        }
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
            if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SO_TIMESTAMPING) {
                struct timespec ts[3];

                memcpy(ts, CMSG_DATA(h), sizeof(ts));
                found = ts[0].tv_sec != 0 || ts[0].tv_nsec != 0;
            }
        }
    }
    ck_assert_msg(found, "no transmit timestamp for the exs_send");
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* An exs_send that completes at once and the exs_qdequeue that takes its event read no
 * clock, a timeout given or not (the event is there: exs_qdequeue's first look takes it
 * before a deadline is computed), and find the queue by handle, not by a reference. */
START_TEST(test_kfdc_dequeue_no_clock)
{
    static const struct timespec ts_1s = {1, 0};
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;
    char c = 'c', got[64];

    it_init();
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    send_one(q, a, b, 'x'); /* trusted now */
    it_clock_count(1);
    uint64_t c0 = it_clock_reads();
    for (int i = 0; i < 16; i++) {
        ck_assert_int_eq(exs_send(a, &c, 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), 0);
        ck_assert_int_eq(exs_qdequeue(q, &ev, i % 2 ? 1 : -1, i % 4 < 2 ? &ts_1s : NULL), 1);
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_eq(ev.exs_evt_fd, a);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(2));
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 1);
    }
    uint64_t c1 = it_clock_reads();
    it_clock_count(0);
    ck_assert_msg(c1 == c0, "%llu clock reads for 16 sends and their dequeues",
                  (unsigned long long)(c1 - c0));
    ck_assert_int_eq(recv(b, got, 16, MSG_WAITALL), 16);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* exs_send's first look (kfd.c, exs__api_kfd_send_fast) on a trusted kernel socket takes
 * only what it can finish: a libexs socket made on the number after the application
 * closed the kernel socket gets the send as a libexs socket (ENOTCONN before it is
 * connected), not as the kernel socket's (ENOTSOCK, found by the send() on its eventfd);
 * and every argument or queue error is the whole way's, with nothing written and the
 * registration released. */
START_TEST(test_kfdc_fast_look)
{
    struct it_buf *buf;
    exs_qhandle_t q, q1;
    exs_event_t ev;
    int a, b, n, s = -1, extra[64], nextra = 0;
    char got[64];

    it_init();
    q = it_qcreate(8);
    q1 = it_qcreate(1);
    buf = it_buf_new(64, 1);
    it_tcp_pair(&a, &b, 0, 0);
    send_one(q, a, b, 'x'); /* trusted now */
    /* a registered buffer: held while the send runs, released at once with its event */
    IT_POST_SEND(a, buf->p, 64, q, AH(1), buf->mh);
    it_expect_send(q, a, AH(1), 64);
    IT_EXPECT_OK(exs_mderegister(buf->mh));
    buf->mh = exs_mregister(buf->p, buf->len, 0);
    ck_assert_int_ge(buf->mh, 0);
    ck_assert_int_eq(recv(b, got, 64, MSG_WAITALL), 64);
    /* the whole way's errors, nothing written */
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, MSG_OOB, q, AH(2), buf->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(a, buf->p, 65, 0, q, AH(2), buf->mh), EINVAL); /* beyond mh */
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, 0, q, AH(2), EXS_MHANDLE_INVALID), EINVAL);
    IT_EXPECT_FAIL(exs_send(a, NULL, 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), EINVAL);
    IT_EXPECT_FAIL(exs_send(a, buf->p, 64, 0, 12345, AH(2), buf->mh), EINVAL);
    IT_EXPECT_FAIL(
        exs_send(a, buf->p, (size_t)SSIZE_MAX + 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED),
        EMSGSIZE);
    IT_POST_SEND(a, buf->p, 1, q1, AH(3), buf->mh); /* q1 full now */
    IT_EXPECT_FAIL(exs_send(a, buf->p, 1, 0, q1, AH(4), buf->mh), EAGAIN);
    /* neither holds the registration now: the first one was written at once */
    IT_EXPECT_OK(exs_mderegister(buf->mh));
    buf->mh = exs_mregister(buf->p, buf->len, 0);
    ck_assert_int_ge(buf->mh, 0);
    ck_assert_int_eq(exs_qdequeue(q1, &ev, 1, NULL), 1);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 1);
    ck_assert_int_eq(recv(b, got, 1, MSG_WAITALL), 1);
    expect_nothing(b);
    it_expect_no_event(q, 20);
    /* a libexs socket on the number (exs_socket's eventfd takes the lowest free one) */
    n = a;
    ck_assert_int_eq(close(a), 0);
    while (nextra < 64) {
        s = exs_socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(s, 0);
        if (s == n)
            break;
        extra[nextra++] = s;
    }
    ck_assert_int_eq(s, n);
    IT_EXPECT_FAIL(exs_send(n, "z", 1, 0, q, AH(5), EXS_MHANDLE_UNREGISTERED), ENOTCONN);
    IT_EXPECT_FAIL(exs_send(n, buf->p, 1, 0, q, AH(5), buf->mh), ENOTCONN);
    it_expect_no_event(q, 20);
    IT_EXPECT_OK(exs_close(n, EXS_QHANDLE_INVALID, AH(6)));
    for (int i = 0; i < nextra; i++)
        IT_EXPECT_OK(exs_close(extra[i], EXS_QHANDLE_INVALID, AH(6)));
    ck_assert_int_eq(recv(b, got, 1, MSG_DONTWAIT), 0); /* the end, no 'z' */
    close(b);
    it_buf_free(buf);
    it_kfd_settle(q);
    it_qdelete(q1);
    it_qdelete(q);
}
END_TEST

/* A thread asleep in exs_qdequeue wakes for a send that completes at once (its event is
 * posted inline, kfd.c: the sleeper makes the post go the whole way, which writes the
 * queue's descriptor), and exs_qfd is readable after one. */
struct kfdc_waiter {
    exs_qhandle_t q;
    int got;
    exs_event_t ev;
    struct timespec end;
};

static void *kfdc_wait(void *arg)
{
    static const struct timespec ts_10s = {10, 0};
    struct kfdc_waiter *w = arg;

    w->got = exs_qdequeue(w->q, &w->ev, 1, &ts_10s);
    clock_gettime(CLOCK_MONOTONIC, &w->end);
    return NULL;
}

START_TEST(test_kfdc_fast_wakes)
{
    struct kfdc_waiter w = {0};
    struct pollfd pfd;
    exs_qhandle_t q, qx;
    exs_event_t ev;
    pthread_t t;
    int a, b;
    char got[4];

    it_init();
    q = it_qcreate(8);
    qx = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    send_one(q, a, b, 'x'); /* trusted now */
    /* a sleeper (NOTIFY: no spin), woken by the send */
    IT_EXPECT_OK(exs_qsetwait(q, EXS_WAIT_NOTIFY, 0));
    w.q = q;
    ck_assert_int_eq(pthread_create(&t, NULL, kfdc_wait, &w), 0);
    usleep(200 * 1000); /* asleep by now (else it finds the event at its first look) */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(exs_send(a, "y", 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    double waited = (double)(w.end.tv_sec - t0.tv_sec) + (double)(w.end.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(w.got == 1 && waited < 3.0, "the sleeper got %d events %.3f s after the send",
                  w.got, waited);
    ck_assert_ptr_eq(w.ev.exs_evt_ahandle, AH(2));
    /* the queue's descriptor, exposed: readable after the send, not after the dequeue */
    pfd.fd = exs_qfd(qx);
    pfd.events = POLLIN;
    ck_assert_int_ge(pfd.fd, 0);
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    ck_assert_int_eq(exs_send(a, "z", 1, 0, qx, AH(3), EXS_MHANDLE_UNREGISTERED), 0);
    ck_assert_int_eq(poll(&pfd, 1, 0), 1);
    ck_assert_int_eq(exs_qdequeue(qx, &ev, 1, NULL), 1);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(3));
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    ck_assert_int_eq(recv(b, got, 2, MSG_WAITALL), 2);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(qx);
    it_qdelete(q);
}
END_TEST

/* Several threads send on one kernel socket and dequeue one shared queue at once, each
 * with up to KFDC_OUT sends outstanding, against a slow reader, so that some sends
 * complete in their call (exs_send's hot path) and others wait queued (partly written,
 * too) behind them: every message reaches the peer whole, each thread's in its posting
 * order, and every send has exactly one event. */
#define KFDC_T   4
#define KFDC_MSG 200
#define KFDC_OUT 8

struct kfdc_mt {
    int fd;
    exs_qhandle_t q;
    int rounds;
    int tid;
    int bad;   /* atomic */
    int *out;  /* atomic: sends outstanding, per thread */
    int *evts; /* atomic: events dequeued, per thread (by ahandle) */
    int *done; /* atomic: events dequeued, all */
};

static void kfdc_mt_fill(uint8_t *m, int tid, uint32_t seq)
{
    m[0] = (uint8_t)tid;
    memcpy(m + 1, &seq, sizeof(seq));
    for (int i = 5; i < KFDC_MSG; i++)
        m[i] = (uint8_t)(tid * 31 + seq + (uint32_t)i);
}

static void *kfdc_mt_sender(void *arg)
{
    static const struct timespec ts_1ms = {0, 1000000};
    struct kfdc_mt *c = arg;
    uint8_t *bufs = malloc((size_t)c->rounds * KFDC_MSG);
    int posted = 0, all = KFDC_T * c->rounds;
    exs_event_t ev;

    if (!bufs)
        return __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED), NULL;
    while (__atomic_load_n(c->done, __ATOMIC_RELAXED) < all &&
           !__atomic_load_n(&c->bad, __ATOMIC_RELAXED)) {
        if (posted < c->rounds && __atomic_load_n(&c->out[c->tid], __ATOMIC_RELAXED) < KFDC_OUT) {
            uint8_t *m = bufs + (size_t)posted * KFDC_MSG;

            kfdc_mt_fill(m, c->tid, (uint32_t)posted);
            __atomic_fetch_add(&c->out[c->tid], 1, __ATOMIC_RELAXED);
            if (exs_send(c->fd, m, KFDC_MSG, 0, c->q, AH(100 + c->tid), EXS_MHANDLE_UNREGISTERED)) {
                __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
                break;
            }
            posted++;
            continue;
        }
        int n = exs_qdequeue(c->q, &ev, 1, &ts_1ms);

        if (n == 0)
            continue;
        int t = (int)(uintptr_t)ev.exs_evt_ahandle - 100;
        if (n != 1 || ev.exs_evt_errno || ev.exs_evt_type != EXS_EVT_SEND ||
            ev.exs_evt_u.exs_evt_xfer.exs_evt_result != KFDC_MSG || t < 0 || t >= KFDC_T) {
            __atomic_store_n(&c->bad, 1, __ATOMIC_RELAXED);
            break;
        }
        __atomic_fetch_add(&c->evts[t], 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&c->out[t], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(c->done, 1, __ATOMIC_RELAXED);
    }
    /* the buffers stay until every event of this thread's sends came (to any thread) */
    while (__atomic_load_n(&c->evts[c->tid], __ATOMIC_RELAXED) < posted &&
           !__atomic_load_n(&c->bad, __ATOMIC_RELAXED))
        sched_yield();
    free(bufs);
    return NULL;
}

START_TEST(test_kfdc_fast_threads)
{
    struct kfdc_mt c[KFDC_T];
    int evts[KFDC_T] = {0}, out[KFDC_T] = {0}, done = 0, bad = 0;
    uint32_t next[KFDC_T] = {0};
    pthread_t th[KFDC_T];
    exs_qhandle_t q;
    int a, b, rounds = 2000;
    size_t total = (size_t)KFDC_T * (size_t)rounds * KFDC_MSG, got = 0;
    uint8_t *stream = malloc(total);

    ck_assert_ptr_nonnull(stream);
    it_init();
    q = it_qcreate(KFDC_T * KFDC_OUT);
    it_tcp_pair(&a, &b, 4096, 4096);
    int one = 1; /* no Nagle: small writes with a window this small wait for delayed ACKs */
    ck_assert_int_eq(setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), 0);
    for (int t = 0; t < KFDC_T; t++) {
        c[t] = (struct kfdc_mt){
            .fd = a, .q = q, .rounds = rounds, .tid = t, .out = out, .evts = evts, .done = &done};
        ck_assert_int_eq(pthread_create(&th[t], NULL, kfdc_mt_sender, &c[t]), 0);
    }
    /* a slow reader: the socket fills now and then, and sends wait queued */
    while (got < total) {
        ssize_t n = recv(b, stream + got, total - got < 1000 ? total - got : 1000, 0);

        ck_assert_int_gt(n, 0);
        got += (size_t)n;
        usleep(200);
    }
    for (int t = 0; t < KFDC_T; t++) {
        ck_assert_int_eq(pthread_join(th[t], NULL), 0);
        bad |= c[t].bad;
    }
    ck_assert_int_eq(bad, 0);
    for (int t = 0; t < KFDC_T; t++)
        ck_assert_int_eq(evts[t], rounds);
    for (size_t off = 0; off < total; off += KFDC_MSG) {
        uint8_t want[KFDC_MSG];
        int t = stream[off];
        uint32_t seq;

        ck_assert_int_lt(t, KFDC_T);
        memcpy(&seq, stream + off + 1, sizeof(seq));
        ck_assert_msg(seq == next[t], "thread %d: message %u where %u was due (offset %zu)", t, seq,
                      next[t], off);
        next[t]++;
        kfdc_mt_fill(want, t, seq);
        ck_assert_msg(!memcmp(want, stream + off, KFDC_MSG), "message at %zu not whole", off);
    }
    expect_nothing(b);
    it_expect_no_event(q, 20);
    free(stream);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

Suite *integ_kfdcache_suite(void)
{
    Suite *s = suite_create("integ_kfdcache");

    it_suite_add(s, "kfdcache", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){
                     test_kfdc_closed_and_files, test_kfdc_other_sockets, test_kfdc_other_tcp,
                     test_kfdc_table_race, test_kfdc_tx_timestamp, test_kfdc_dequeue_no_clock,
                     test_kfdc_fast_look, test_kfdc_fast_wakes, test_kfdc_fast_threads, NULL});
    return s;
}
