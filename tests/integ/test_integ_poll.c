/* SPDX-License-Identifier: MIT */
/* exs_poll on exs sockets, kernel descriptors and both mixed, synchronous and asynchronous. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* The pair's type for loop index i: 0 STREAM, 1 SEQPACKET. */
static int pair_type(int i)
{
    return i ? SOCK_SEQPACKET : SOCK_STREAM;
}

/* Synchronous exs_poll of one descriptor; returns the call's result, *rev its revents. */
static int poll1(int fd, short events, int timeout_ms, short *rev)
{
    exs_pollfd_t f = {.fd = fd, .events = events, .revents = (short)0x7777};
    int n = exs_poll(&f, 1, timeout_ms, EXS_QHANDLE_INVALID, NULL);

    *rev = f.revents;
    return n;
}

/* Wait for the EXS_EVT_POLL of q with ahandle ah; checks errno 0 and the array. */
static void expect_poll_evt(exs_qhandle_t q, exs_ahandle_t ah, exs_pollfd_t *fds, nfds_t nfds,
                            int nready)
{
    exs_event_t ev;

    it_wait_event(q, EXS_EVT_POLL, -1, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, ah);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_fd, -1);
    ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_fds, fds);
    ck_assert_uint_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_nfds, nfds);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_nready, nready);
}

/* Send len bytes of 'x' from fd on q and wait for the send event. */
static void send_bytes(int fd, exs_qhandle_t q, size_t len)
{
    static char buf[256];

    memset(buf, 'x', sizeof(buf));
    ck_assert_uint_le(len, sizeof(buf));
    IT_POST_SEND(fd, buf, len, q, AH(0x5E), EXS_MHANDLE_UNREGISTERED);
    it_expect_send(q, fd, AH(0x5E), (ssize_t)len);
}

/* Readable after the peer sent, writable while connected, timeout 0 and > 0. */
START_TEST(test_poll_sync_exs)
{
    struct it_pair p;
    char buf[256];
    short rev;
    double t0;
    int n;

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    /* connected, nothing arrived: writable, not readable */
    n = poll1(p.cfd, POLLIN | POLLOUT, 0, &rev);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(rev, POLLOUT);
    n = poll1(p.cfd, POLLIN, 0, &rev);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(rev, 0);
    /* timeout > 0 with nothing ready: 0, not before the interval */
    t0 = it_now_ms();
    n = poll1(p.cfd, POLLIN, 200, &rev);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(rev, 0);
    ck_assert_msg(it_now_ms() - t0 >= 190, "returned after %.0f ms", it_now_ms() - t0);
    /* the peer sends: readable */
    send_bytes(p.sfd, p.sq, 100);
    n = poll1(p.cfd, POLLIN, IT_TIMEOUT_MS, &rev);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(rev, POLLIN);
    /* the receive takes it at once; then not readable any more */
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(1), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.cq, p.cfd, AH(1), 100, 0);
    n = poll1(p.cfd, POLLIN, 0, &rev);
    ck_assert_int_eq(n, 0);
    it_pair_close(&p);
}
END_TEST

/* The asynchronous form: no event while nothing is ready, one event when it is. */
START_TEST(test_poll_async_exs)
{
    struct it_pair p;
    exs_pollfd_t f[2];
    char buf[256];

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    f[0] = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    f[1] = (exs_pollfd_t){.fd = p.sfd, .events = POLLIN};
    IT_EXPECT_OK(exs_poll(f, 2, -1, p.cq, AH(0x90)));
    it_expect_no_event(p.cq, 200);
    send_bytes(p.sfd, p.sq, 10);
    expect_poll_evt(p.cq, AH(0x90), f, 2, 1);
    ck_assert_int_eq(f[0].revents, POLLIN);
    ck_assert_int_eq(f[1].revents, 0);
    /* ready at the call: the event comes at once */
    IT_EXPECT_OK(exs_poll(f, 2, -1, p.cq, AH(0x91)));
    expect_poll_evt(p.cq, AH(0x91), f, 2, 1);
    ck_assert_int_eq(f[0].revents, POLLIN);
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(1), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.cq, p.cfd, AH(1), 10, 0);
    /* asynchronous timeout: an event with nothing ready, not before the interval */
    double t0 = it_now_ms();
    IT_EXPECT_OK(exs_poll(f, 2, 150, p.cq, AH(0x92)));
    expect_poll_evt(p.cq, AH(0x92), f, 2, 0);
    ck_assert_msg(it_now_ms() - t0 >= 140, "event after %.0f ms", it_now_ms() - t0);
    ck_assert_int_eq(f[0].revents, 0);
    ck_assert_int_eq(f[1].revents, 0);
    /* timeout 0, nothing ready: an event with nready 0 at once */
    IT_EXPECT_OK(exs_poll(f, 2, 0, p.cq, AH(0x93)));
    expect_poll_evt(p.cq, AH(0x93), f, 2, 0);
    it_pair_close(&p);
}
END_TEST

/* The peer closes: readable (end of stream) and hung up, synchronous and asynchronous. */
START_TEST(test_poll_hup)
{
    struct it_pair p;
    exs_pollfd_t f;
    short rev;
    int n;

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    f = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    IT_EXPECT_OK(exs_poll(&f, 1, -1, p.cq, AH(0x94)));
    it_close(p.sfd, p.sq);
    p.sfd = -1;
    expect_poll_evt(p.cq, AH(0x94), &f, 1, 1);
    ck_assert_msg(f.revents & POLLIN, "revents 0x%x", f.revents);
    /* hung up once the connection is gone (the SHUTDOWN may be seen first) */
    for (int k = 0; k < 1000; k++) {
        n = poll1(p.cfd, POLLIN | POLLOUT, IT_TIMEOUT_MS, &rev);
        ck_assert_int_eq(n, 1);
        if (rev & POLLHUP)
            break;
        it_sleep_ms(10);
    }
    ck_assert_msg(rev & POLLHUP, "revents 0x%x", rev);
    ck_assert_msg(rev & POLLIN, "revents 0x%x", rev);
    ck_assert_msg(!(rev & POLLOUT), "revents 0x%x: writable after the peer closed", rev);
    ck_assert_msg(!(rev & POLLERR), "revents 0x%x: a graceful close is no error", rev);
    it_pair_close(&p);
}
END_TEST

/* A listener is readable while an established connection waits for exs_accept. */
START_TEST(test_poll_listener)
{
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_pollfd_t f;
    exs_event_t ev;
    short rev;
    int lfd, cfd, n;

    it_init();
    q = it_qcreate(8);
    lfd = it_listen(pair_type(_i), &addr);
    n = poll1(lfd, POLLIN, 0, &rev);
    ck_assert_int_eq(n, 0);
    f = (exs_pollfd_t){.fd = lfd, .events = POLLIN};
    IT_EXPECT_OK(exs_poll(&f, 1, -1, q, AH(0x95)));
    cfd = exs_socket(AF_INET, pair_type(_i), 0);
    ck_assert_int_ge(cfd, 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, AH(0xC0)));
    it_expect_err(q, EXS_EVT_CONNECT, cfd, AH(0xC0), 0);
    expect_poll_evt(q, AH(0x95), &f, 1, 1);
    ck_assert_int_eq(f.revents, POLLIN);
    n = poll1(lfd, POLLIN, IT_TIMEOUT_MS, &rev);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(rev, POLLIN);
    IT_EXPECT_OK(exs_accept(lfd, q, AH(0xACC)));
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, AH(0xACC), 0, &ev, __FILE__, __LINE__);
    n = poll1(lfd, POLLIN, 0, &rev);
    ck_assert_int_eq(n, 0); /* taken */
    it_close(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd, q);
    it_close(cfd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* Invalid descriptors: POLLNVAL (counted), negative ones ignored, as poll(2). */
START_TEST(test_poll_nval)
{
    exs_qhandle_t q;
    exs_pollfd_t f[3];
    int pfd[2], s;

    it_init();
    q = it_qcreate(4);
    s = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(pipe(pfd), 0); /* two numbers that are free once closed */
    close(pfd[0]);
    close(pfd[1]);
    f[0] = (exs_pollfd_t){.fd = pfd[0], .events = POLLIN};
    f[1] = (exs_pollfd_t){.fd = -5, .events = POLLIN};
    f[2] = (exs_pollfd_t){.fd = s, .events = POLLIN | POLLOUT};
    ck_assert_int_eq(exs_poll(f, 3, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL), 2);
    ck_assert_int_eq(f[0].revents, POLLNVAL);
    ck_assert_int_eq(f[1].revents, 0);
    ck_assert_int_eq(f[2].revents, POLLHUP); /* never connected */
    IT_EXPECT_OK(exs_poll(f, 2, -1, q, AH(0x96)));
    expect_poll_evt(q, AH(0x96), f, 2, 1);
    ck_assert_int_eq(f[0].revents, POLLNVAL);
    it_close(s, q);
    /* the closed exs socket's number is invalid now */
    f[0] = (exs_pollfd_t){.fd = s, .events = POLLIN};
    ck_assert_int_eq(exs_poll(f, 1, 0, EXS_QHANDLE_INVALID, NULL), 1);
    ck_assert_int_eq(f[0].revents, POLLNVAL);
    IT_EXPECT_FAIL(exs_poll(NULL, 1, 0, EXS_QHANDLE_INVALID, NULL), EINVAL);
    IT_EXPECT_FAIL(exs_poll(f, 1, 0, (exs_qhandle_t)12345, NULL), EINVAL);
    it_qdelete(q);
}
END_TEST

/* Kernel descriptors: the kernel's readiness, synchronous and asynchronous. */
START_TEST(test_poll_kernel)
{
    exs_qhandle_t q;
    exs_pollfd_t f;
    int sv[2];
    char c;

    it_init();
    q = it_qcreate(4);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    f = (exs_pollfd_t){.fd = sv[0], .events = POLLIN};
    ck_assert_int_eq(exs_poll(&f, 1, 0, EXS_QHANDLE_INVALID, NULL), 0);
    ck_assert_int_eq(f.revents, 0);
    IT_EXPECT_OK(exs_poll(&f, 1, -1, q, AH(0x97)));
    it_expect_no_event(q, 200);
    ck_assert_int_eq(write(sv[1], "a", 1), 1);
    expect_poll_evt(q, AH(0x97), &f, 1, 1);
    ck_assert_int_eq(f.revents, POLLIN);
    ck_assert_int_eq(exs_poll(&f, 1, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL), 1);
    ck_assert_int_eq(read(sv[0], &c, 1), 1);
    /* asynchronous, the peer hangs up */
    IT_EXPECT_OK(exs_poll(&f, 1, -1, q, AH(0x98)));
    it_expect_no_event(q, 100);
    close(sv[1]);
    expect_poll_evt(q, AH(0x98), &f, 1, 1);
    ck_assert_msg(f.revents & POLLHUP, "revents 0x%x", f.revents);
    close(sv[0]);
    it_qdelete(q);
}
END_TEST

/* exs sockets and kernel descriptors in one array. */
START_TEST(test_poll_mixed)
{
    struct it_pair p;
    exs_pollfd_t f[2];
    int sv[2];
    char buf[64];
    short rev;

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    f[0] = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    f[1] = (exs_pollfd_t){.fd = sv[0], .events = POLLIN};
    /* the kernel side becomes ready */
    IT_EXPECT_OK(exs_poll(f, 2, -1, p.cq, AH(0x99)));
    it_expect_no_event(p.cq, 100);
    ck_assert_int_eq(write(sv[1], "a", 1), 1);
    expect_poll_evt(p.cq, AH(0x99), f, 2, 1);
    ck_assert_int_eq(f[0].revents, 0);
    ck_assert_int_eq(f[1].revents, POLLIN);
    ck_assert_int_eq(read(sv[0], buf, 1), 1);
    /* the exs side becomes ready */
    IT_EXPECT_OK(exs_poll(f, 2, -1, p.cq, AH(0x9A)));
    it_expect_no_event(p.cq, 100);
    send_bytes(p.sfd, p.sq, 5);
    expect_poll_evt(p.cq, AH(0x9A), f, 2, 1);
    ck_assert_int_eq(f[0].revents, POLLIN);
    ck_assert_int_eq(f[1].revents, 0);
    /* synchronous, both ready */
    ck_assert_int_eq(write(sv[1], "b", 1), 1);
    ck_assert_int_eq(exs_poll(f, 2, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL), 2);
    ck_assert_int_eq(f[0].revents, POLLIN);
    ck_assert_int_eq(f[1].revents, POLLIN);
    ck_assert_int_eq(read(sv[0], buf, 1), 1);
    /* synchronous wait on the kernel side while an exs socket is in the array */
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(1), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.cq, p.cfd, AH(1), 5, 0);
    ck_assert_int_eq(exs_poll(f, 2, 0, EXS_QHANDLE_INVALID, NULL), 0);
    ck_assert_int_eq(write(sv[1], "c", 1), 1);
    ck_assert_int_eq(exs_poll(f, 2, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL), 1);
    ck_assert_int_eq(f[1].revents, POLLIN);
    (void)rev;
    close(sv[0]);
    close(sv[1]);
    it_pair_close(&p);
}
END_TEST

/* A thread waits synchronously for an exs socket the peer makes readable later. */
struct waiter {
    int fd;
    int n;
    short rev;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;

    w->n = poll1(w->fd, POLLIN, 3 * IT_TIMEOUT_MS, &w->rev);
    return NULL;
}

START_TEST(test_poll_sync_wakeup)
{
    struct it_pair p;
    struct waiter w = {.n = -2};
    pthread_t th;
    char buf[64];

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    w.fd = p.cfd;
    ck_assert_int_eq(pthread_create(&th, NULL, waiter_main, &w), 0);
    it_sleep_ms(100); /* let it sleep (not asserted: the wake-up works either way) */
    send_bytes(p.sfd, p.sq, 7);
    pthread_join(th, NULL);
    ck_assert_int_eq(w.n, 1);
    ck_assert_int_eq(w.rev, POLLIN);
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(1), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.cq, p.cfd, AH(1), 7, 0);
    it_pair_close(&p);
}
END_TEST

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* A SIGALRM interrupts a synchronous exs_poll that waits on an exs socket: -1/EINTR. */
START_TEST(test_poll_eintr)
{
    struct it_pair p;
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    struct itimerval it = {.it_interval = {0, 50000}, .it_value = {0, 50000}};
    struct itimerval off = {{0, 0}, {0, 0}};
    exs_pollfd_t f;
    int r, e;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 8, 8);
    f = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ck_assert_int_eq(sigaction(SIGALRM, &sa, &old), 0);
    alarms = 0;
    ck_assert_int_eq(setitimer(ITIMER_REAL, &it, NULL), 0);
    it_watchdog_start(30, "exs_poll waiting for a SIGALRM");
    r = exs_poll(&f, 1, -1, EXS_QHANDLE_INVALID, NULL);
    e = errno;
    it_watchdog_stop();
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    ck_assert_msg(r == -1 && e == EINTR, "exs_poll: %d errno %d, expected -1 EINTR", r, e);
    ck_assert_int_gt(alarms, 0);
    /* the socket and the thread's synchronous queue still work */
    send_bytes(p.sfd, p.sq, 3);
    ck_assert_int_eq(exs_poll(&f, 1, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL), 1);
    ck_assert_int_eq(f.revents, POLLIN);
    it_pair_close(&p);
}
END_TEST

/* The event's slot is reserved at the call: a full queue refuses with EAGAIN. */
START_TEST(test_poll_queue_full)
{
    struct it_pair p;
    exs_pollfd_t f = {.events = POLLIN}, g = {.events = POLLIN};

    it_init();
    it_pair_open(&p, SOCK_STREAM, 8, 8);
    exs_qhandle_t q = it_qcreate(1);
    f.fd = g.fd = p.cfd;
    IT_EXPECT_OK(exs_poll(&f, 1, -1, q, AH(1)));
    IT_EXPECT_FAIL(exs_poll(&g, 1, -1, q, AH(2)), EAGAIN);
    IT_EXPECT_FAIL(exs_poll(&g, 1, 0, q, AH(2)), EAGAIN);
    send_bytes(p.sfd, p.sq, 1);
    expect_poll_evt(q, AH(1), &f, 1, 1);
    /* the slot is free again once the event was taken */
    IT_EXPECT_OK(exs_poll(&g, 1, 0, q, AH(3)));
    expect_poll_evt(q, AH(3), &g, 1, 1);
    it_qdelete(q);
    it_pair_close(&p);
}
END_TEST

Suite *integ_poll_suite(void)
{
    Suite *s = suite_create("integ_poll");

    it_suite_add(s, "poll_exs", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_poll_sync_exs, test_poll_async_exs, test_poll_hup,
                                        test_poll_listener, test_poll_mixed, test_poll_sync_wakeup,
                                        NULL});
    it_suite_add(s, "poll_misc", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_poll_nval, test_poll_kernel, test_poll_eintr,
                                        test_poll_queue_full, NULL});
    return s;
}
