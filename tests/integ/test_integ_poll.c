/* SPDX-License-Identifier: MIT */
/* exs_poll on exs sockets, kernel descriptors and both mixed; timeout notices; ordered receives. */
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
#include <time.h>
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
    /* the connecting side: writable once connected */
    exs_pollfd_t g = {.fd = cfd, .events = POLLOUT};
    IT_EXPECT_OK(exs_poll(&g, 1, -1, q, AH(0x9B)));
    it_expect_err(q, EXS_EVT_CONNECT, cfd, AH(0xC0), 0);
    /* both requests end, in either order */
    for (int k = 0; k < 2; k++) {
        it_wait_event(q, EXS_EVT_POLL, -1, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_nready, 1);
        if (ev.exs_evt_ahandle == AH(0x9B))
            ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_fds, &g);
        else
            ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_fds, &f);
    }
    ck_assert_int_eq(g.revents, POLLOUT);
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
    r = exs_poll(&f, 1, -1, EXS_QHANDLE_INVALID, NULL); /* the case's timeout bounds it */
    e = errno;
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

/* exs_cancel(-1, ah, 0) ends the asynchronous requests posted with ah: one EXS_EVT_POLL
 * each with ECANCELED, exactly once, the request freed; other requests are untouched. */
START_TEST(test_poll_cancel)
{
    struct it_pair p;
    exs_pollfd_t f, g, h;
    exs_event_t ev;
    int pp[2];

    it_init();
    it_pair_open(&p, SOCK_STREAM, 8, 8);
    ck_assert_int_eq(pipe(pp), 0);
    f = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    g = (exs_pollfd_t){.fd = p.cfd, .events = POLLIN};
    h = (exs_pollfd_t){.fd = pp[0], .events = POLLIN}; /* kernel descriptors only */
    IT_EXPECT_OK(exs_poll(&f, 1, -1, p.cq, AH(0x20)));
    IT_EXPECT_OK(exs_poll(&g, 1, -1, p.cq, AH(0x21)));
    /* at once: its start job may not have run yet */
    IT_EXPECT_OK(exs_cancel(-1, AH(0x20), 0));
    it_wait_event(p.cq, EXS_EVT_POLL, -1, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(0x20));
    ck_assert_int_eq(ev.exs_evt_errno, ECANCELED);
    ck_assert_int_eq(ev.exs_evt_fd, -1);
    ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_fds, &f);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_poll.exs_evt_nready, -1);
    ck_assert_int_eq(f.revents, 0);
    /* a registered kernel-only request, cancelled after it waited */
    IT_EXPECT_OK(exs_poll(&h, 1, -1, p.cq, AH(0x22)));
    it_expect_no_event(p.cq, 100);
    IT_EXPECT_OK(exs_cancel(-1, AH(0x22), 0));
    it_wait_event(p.cq, EXS_EVT_POLL, -1, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(0x22));
    ck_assert_int_eq(ev.exs_evt_errno, ECANCELED);
    /* exactly once: nothing more for them; the other request still waits */
    IT_EXPECT_OK(exs_cancel(-1, AH(0x20), 0));
    IT_EXPECT_OK(exs_cancel(-1, AH(0x22), 0));
    IT_EXPECT_FAIL(exs_cancel(-1, AH(0x21), 0x40), EINVAL);
    it_expect_no_event(p.cq, 200);
    ck_assert_int_eq(exs__debug_poll_live(), 1);
    send_bytes(p.sfd, p.sq, 4);
    expect_poll_evt(p.cq, AH(0x21), &g, 1, 1);
    ck_assert_int_eq(g.revents, POLLIN);
    ck_assert_int_eq(exs__debug_poll_live(), 0);
    close(pp[0]);
    close(pp[1]);
    it_pair_close(&p);
}
END_TEST

struct sync_poller {
    exs_pollfd_t f;
    int ret, err, done; /* done: atomic */
};

static void *sync_poller_main(void *arg)
{
    struct sync_poller *sp = arg;

    sp->ret = exs_poll(&sp->f, 1, -1, EXS_QHANDLE_INVALID, NULL);
    sp->err = errno;
    __atomic_store_n(&sp->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A synchronous exs_poll still waiting when exs_fini runs returns -1/ECANCELED, and its
 * request is freed. */
START_TEST(test_poll_sync_fini)
{
    struct sync_poller sp = {.ret = 99};
    struct sockaddr_in addr;
    struct timespec dl;
    pthread_t th;
    int lfd;

    it_init();
    lfd = it_listen(SOCK_STREAM, &addr); /* no connection comes: never readable */
    sp.f = (exs_pollfd_t){.fd = lfd, .events = POLLIN};
    ck_assert_int_eq(pthread_create(&th, NULL, sync_poller_main, &sp), 0);
    /* wait until it is registered (allocated; then it waits) */
    for (int i = 0; i < IT_TIMEOUT_MS / 10 && exs__debug_poll_live() == 0; i++)
        it_sleep_ms(10);
    ck_assert_int_eq(exs__debug_poll_live(), 1);
    it_sleep_ms(50); /* usually past the look at the call: the registered request */
    ck_assert_int_eq(__atomic_load_n(&sp.done, __ATOMIC_ACQUIRE), 0);
    exs_fini();
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += IT_TIMEOUT_MS / 1000;
    ck_assert_int_eq(pthread_timedjoin_np(th, NULL, &dl), 0);
    ck_assert_int_eq(sp.ret, -1);
    ck_assert_int_eq(sp.err, ECANCELED);
    ck_assert_int_eq(exs__debug_poll_live(), 0);
    ck_assert_int_eq(exs__debug_live_objects(), 0);
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

/* ---- SO_ASYNC_*_TIMEOUT, SO_ASYNC_RECV_ORDERED ---- */

static void set_int(int fd, int name, int v)
{
    IT_EXPECT_OK(exs_setsockopt(fd, SOL_SOCKET, name, &v, sizeof(v)));
}

/* Wait for the next notice of (q, type, fd): ahandle ah, count, elapsed >= count
 * intervals (notices are never early). */
static void expect_notice(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, unsigned count,
                          int ivl_ms, void *buf)
{
    exs_event_t ev;

    it_wait_event(q, type, fd, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, ah);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_timeout.exs_evt_buf, buf);
    ck_assert_uint_eq(ev.exs_evt_u.exs_evt_timeout.exs_evt_count, count);
    ck_assert_uint_ge(ev.exs_evt_u.exs_evt_timeout.exs_evt_elapsed_ms, count * (unsigned)ivl_ms);
}

/* The option values: int ms with EXS_TIMEOUT_ONCE, struct timeval, both levels, errors. */
START_TEST(test_to_options)
{
    struct timeval tv = {.tv_sec = 1, .tv_usec = 500};
    socklen_t len;
    int s, v, sv[2];

    it_init();
    s = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    len = sizeof(v);
    IT_EXPECT_OK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &v, &len));
    ck_assert_int_eq(v, 0); /* off by default */
    set_int(s, SO_ASYNC_SEND_TIMEOUT, 250 | EXS_TIMEOUT_ONCE);
    IT_EXPECT_OK(exs_getsockopt(s, SOL_EXS, SO_ASYNC_SEND_TIMEOUT, &v, &len));
    ck_assert_int_eq(v, 250 | EXS_TIMEOUT_ONCE);
    IT_EXPECT_OK(exs_setsockopt(s, SOL_EXS, SO_ASYNC_RECV_TIMEOUT, &tv, sizeof(tv)));
    IT_EXPECT_OK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_TIMEOUT, &v, &len));
    ck_assert_int_eq(v, 1001); /* rounded up to whole milliseconds */
    memset(&tv, 0, sizeof(tv));
    len = sizeof(tv);
    IT_EXPECT_OK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_TIMEOUT, &tv, &len));
    ck_assert_int_eq(len, sizeof(tv));
    ck_assert_int_eq(tv.tv_sec, 1);
    ck_assert_int_eq(tv.tv_usec, 1000);
    v = -1;
    IT_EXPECT_FAIL(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &v, sizeof(v)), EINVAL);
    v = EXS_TIMEOUT_ONCE; /* once, but no interval */
    IT_EXPECT_FAIL(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &v, sizeof(v)), EINVAL);
    tv = (struct timeval){.tv_sec = 0, .tv_usec = 1000000};
    IT_EXPECT_FAIL(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &tv, sizeof(tv)), EINVAL);
    tv = (struct timeval){.tv_sec = (time_t)1 << 40, .tv_usec = 0}; /* too long */
    IT_EXPECT_FAIL(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &tv, sizeof(tv)), EINVAL);
    set_int(s, SO_ASYNC_SEND_TIMEOUT, 0);
    len = sizeof(v);
    IT_EXPECT_OK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &v, &len));
    ck_assert_int_eq(v, 0);
    /* ordered receives: always on */
    IT_EXPECT_OK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &v, &len));
    ck_assert_int_eq(v, 1);
    set_int(s, SO_ASYNC_RECV_ORDERED, 1);
    set_int(s, SO_ASYNC_RECV_ORDERED, 0);
    IT_EXPECT_OK(exs_getsockopt(s, SOL_EXS, SO_ASYNC_RECV_ORDERED, &v, &len));
    ck_assert_int_eq(v, 1);
    v = 2;
    IT_EXPECT_FAIL(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &v, sizeof(v)), EINVAL);
    /* kernel stream sockets take them too (test_integ_kfd.c: kfd_timeouts); other
     * descriptors do not */
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    v = 100;
    IT_EXPECT_OK(exs_setsockopt(sv[0], SOL_SOCKET, SO_ASYNC_RECV_TIMEOUT, &v, sizeof(v)));
    len = sizeof(v);
    IT_EXPECT_OK(exs_getsockopt(sv[0], SOL_EXS, SO_ASYNC_RECV_TIMEOUT, &v, &len));
    ck_assert_int_eq(v, 100);
    set_int(sv[0], SO_ASYNC_RECV_TIMEOUT, 0); /* nothing is kept */
    ck_assert_int_eq(exs__debug_kfd_live(), 0);
    int dg = socket(AF_UNIX, SOCK_DGRAM, 0); /* not a stream socket */
    ck_assert_int_ge(dg, 0);
    IT_EXPECT_FAIL(exs_setsockopt(dg, SOL_SOCKET, SO_ASYNC_RECV_TIMEOUT, &v, sizeof(v)), ENOTSOCK);
    close(dg);
    close(sv[0]);
    close(sv[1]);
    exs_qhandle_t q = it_qcreate(2);
    it_close(s, q);
    it_qdelete(q);
}
END_TEST

/* A receive outstanding past the interval: a notice every interval, counted, never early;
 * then it completes normally and the notices stop. */
START_TEST(test_to_recv_repeat)
{
    struct it_pair p;
    char buf[64];
    double t0;

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    set_int(p.cfd, SO_ASYNC_RECV_TIMEOUT, 100);
    t0 = it_now_ms();
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(7), EXS_MHANDLE_UNREGISTERED);
    expect_notice(p.cq, EXS_EVT_RECVTIMEOUT, p.cfd, AH(7), 1, 100, buf);
    ck_assert_msg(it_now_ms() - t0 >= 100, "notice after %.0f ms", it_now_ms() - t0);
    expect_notice(p.cq, EXS_EVT_RECVTIMEOUT, p.cfd, AH(7), 2, 100, buf);
    expect_notice(p.cq, EXS_EVT_RECVTIMEOUT, p.cfd, AH(7), 3, 100, buf);
    send_bytes(p.sfd, p.sq, 20);
    /* notices posted meanwhile come first; the receive completes normally */
    for (;;) {
        exs_event_t ev;

        it_wait_event(p.cq, -1, p.cfd, &ev);
        if (ev.exs_evt_type == EXS_EVT_RECVTIMEOUT)
            continue;
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
        ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(7));
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 20);
        break;
    }
    it_expect_no_event(p.cq, 350); /* no notice after the completion */
    /* a receive that completes at once gets no notice */
    send_bytes(p.sfd, p.sq, 5);
    short rev;
    ck_assert_int_eq(poll1(p.cfd, POLLIN, IT_TIMEOUT_MS, &rev), 1); /* arrived */
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, AH(8), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.cq, p.cfd, AH(8), 5, 0);
    it_expect_no_event(p.cq, 250);
    it_pair_close(&p);
}
END_TEST

/* A send that cannot complete (the peer receives nothing) with EXS_TIMEOUT_ONCE: one
 * notice, then the send completes normally once the peer receives. */
START_TEST(test_to_send_once)
{
    struct it_pair p;
    /* SEQPACKET: announced (the peer reads it into a receive); STREAM: larger than the
     * peer's ring */
    size_t len = _i ? 256 * 1024 : 3 * 1024 * 1024;
    struct it_buf *sb, *rb;
    exs_event_t ev;
    size_t got = 0;

    it_init();
    it_pair_open(&p, pair_type(_i), 8, 8);
    sb = it_buf_new(len, 1);
    rb = it_buf_new(len, 1);
    it_fill(sb->p, len, 11);
    set_int(p.cfd, SO_ASYNC_SEND_TIMEOUT, 80 | EXS_TIMEOUT_ONCE);
    IT_POST_SEND(p.cfd, sb->p, len, p.cq, AH(9), sb->mh);
    expect_notice(p.cq, EXS_EVT_SENDTIMEOUT, p.cfd, AH(9), 1, 80, sb->p);
    it_expect_no_event(p.cq, 400); /* once: no second notice, and the send is still out */
    while (got < len) {
        IT_POST_RECV(p.sfd, rb->p + got, len - got, p.sq, AH(10), rb->mh);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    ck_assert_int_eq(it_check(rb->p, len, 11), -1);
    it_expect_send(p.cq, p.cfd, AH(9), (ssize_t)len);
    it_expect_no_event(p.cq, 200);
    it_buf_free(sb);
    it_buf_free(rb);
    it_pair_close(&p);
}
END_TEST

/* exs_sendmsg is a send: its notice is EXS_EVT_SENDTIMEOUT (STREAM, larger than the
 * peer's ring, the peer receives nothing until the notice). */
START_TEST(test_to_sendmsg)
{
    struct it_pair p;
    size_t len = 3 * 1024 * 1024, got = 0;
    struct it_buf *sb, *rb;
    exs_iovec_t v[2];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 2};
    exs_event_t ev;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 8, 8);
    sb = it_buf_new(len, 1);
    rb = it_buf_new(len, 1);
    it_fill(sb->p, len, 12);
    v[0] = (exs_iovec_t){sb->p, len / 2, sb->mh};
    v[1] = (exs_iovec_t){sb->p + len / 2, len - len / 2, EXS_MHANDLE_UNREGISTERED};
    set_int(p.cfd, SO_ASYNC_SEND_TIMEOUT, 80 | EXS_TIMEOUT_ONCE);
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(11)));
    it_wait_event(p.cq, -1, p.cfd, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SENDTIMEOUT);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(11));
    ck_assert_uint_eq(ev.exs_evt_u.exs_evt_timeout.exs_evt_count, 1);
    while (got < len) {
        IT_POST_RECV(p.sfd, rb->p + got, len - got, p.sq, AH(12), rb->mh);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    ck_assert_int_eq(it_check(rb->p, len, 12), -1);
    it_wait_event(p.cq, EXS_EVT_SENDMSG, p.cfd, &ev);
    ck_assert_ptr_eq(ev.exs_evt_ahandle, AH(11));
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, (ssize_t)len);
    it_buf_free(sb);
    it_buf_free(rb);
    it_pair_close(&p);
}
END_TEST

/* The notice's slot: reserved at posting (EAGAIN when the queue cannot take it); a
 * repeat that finds the queue full waits for the next interval, never overflows it. */
START_TEST(test_to_queue_full)
{
    struct it_pair p;
    exs_qhandle_t q;
    exs_event_t ev[4];
    char buf[64], buf2[64];
    int n;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 8, 8);
    q = it_qcreate(2);
    set_int(p.cfd, SO_ASYNC_RECV_TIMEOUT, 100);
    IT_POST_RECV(p.cfd, buf, sizeof(buf), q, AH(1), EXS_MHANDLE_UNREGISTERED);
    /* two slots taken: the receive's and its first notice's */
    IT_EXPECT_FAIL(exs_recv(p.cfd, buf2, sizeof(buf2), 0, q, AH(2), EXS_MHANDLE_UNREGISTERED),
                   EAGAIN);
    /* without the option the same queue takes one more receive than with it */
    set_int(p.cfd, SO_ASYNC_RECV_TIMEOUT, 0);
    /* the first notice fills the queue (1 queued + 1 reserved); later ones must wait:
     * wait for it without taking it, give the repeats three intervals to overflow */
    struct pollfd qp = {.fd = exs_qfd(q), .events = POLLIN};
    ck_assert_int_ge(qp.fd, 0);
    ck_assert_int_eq(poll(&qp, 1, IT_TIMEOUT_MS), 1);
    it_sleep_ms(350);
    n = exs_qdequeue(q, ev, 4, &(struct timespec){0, 0});
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ev[0].exs_evt_type, EXS_EVT_RECVTIMEOUT);
    ck_assert_uint_eq(ev[0].exs_evt_u.exs_evt_timeout.exs_evt_count, 1);
    /* room again: the next notice comes (the option's later change does not stop it) */
    it_wait_event(q, EXS_EVT_RECVTIMEOUT, p.cfd, &ev[0]);
    ck_assert_uint_eq(ev[0].exs_evt_u.exs_evt_timeout.exs_evt_count, 2);
    send_bytes(p.sfd, p.sq, 3);
    for (;;) {
        it_wait_event(q, -1, p.cfd, &ev[0]);
        if (ev[0].exs_evt_type != EXS_EVT_RECVTIMEOUT)
            break;
    }
    ck_assert_int_eq(ev[0].exs_evt_type, EXS_EVT_RECV);
    ck_assert_int_eq(ev[0].exs_evt_u.exs_evt_xfer.exs_evt_result, 3);
    /* option off: a depth-2 queue takes two receives */
    IT_POST_RECV(p.cfd, buf, sizeof(buf), q, AH(3), EXS_MHANDLE_UNREGISTERED);
    IT_POST_RECV(p.cfd, buf2, sizeof(buf2), q, AH(4), EXS_MHANDLE_UNREGISTERED);
    send_bytes(p.sfd, p.sq, 64);
    send_bytes(p.sfd, p.sq, 64);
    it_expect_recv(q, p.cfd, AH(3), IT_ANY_RESULT, 0);
    it_expect_recv(q, p.cfd, AH(4), IT_ANY_RESULT, 0);
    it_qdelete(q);
    it_pair_close(&p);
}
END_TEST

/* SO_ASYNC_RECV_ORDERED: receive events in posting order even when a later receive is
 * filled first (a small eager message behind a large announced / advertised one). */
START_TEST(test_recv_ordered)
{
    enum { N = 6 };
    struct it_pair p;
    size_t big = 200 * 1024;
    struct it_buf *rb[N], *sb[N];
    size_t len[N];
    exs_event_t ev;
    int v = 1;

    it_init();
    it_pair_open(&p, pair_type(_i), 16, 16);
    IT_EXPECT_OK(exs_setsockopt(p.sfd, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &v, sizeof(v)));
    for (int k = 0; k < N; k++) {
        len[k] = (k % 2) ? 64 : big;
        rb[k] = it_buf_new(len[k], 1);
        sb[k] = it_buf_new(len[k], 1);
        it_fill(sb[k]->p, len[k], (uint32_t)k + 1);
        /* STREAM: MSG_WAITALL, so that each receive takes exactly its send's bytes (a
         * plain stream receive may complete with part of them, e.g. at a fragment) */
        ck_assert_int_eq(
            exs_recv(p.sfd, rb[k]->p, len[k], _i ? 0 : MSG_WAITALL, p.sq, AH(100 + k), rb[k]->mh),
            0);
    }
    for (int k = 0; k < N; k++)
        IT_POST_SEND(p.cfd, sb[k]->p, len[k], p.cq, AH(200 + k), sb[k]->mh);
    for (int k = 0; k < N; k++) {
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_msg(ev.exs_evt_ahandle == AH(100 + k), "receive event %d has ahandle %ld", k,
                      IT_AHN(ev.exs_evt_ahandle));
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)len[k]);
        ck_assert_int_eq(it_check(rb[k]->p, len[k], (uint32_t)k + 1), -1);
    }
    for (int k = 0; k < N; k++)
        it_expect_send(p.cq, p.cfd, AH(200 + k), (ssize_t)len[k]);
    for (int k = 0; k < N; k++) {
        it_buf_free(rb[k]);
        it_buf_free(sb[k]);
    }
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
                                        test_poll_queue_full, test_to_options, NULL});
    it_suite_add(s, "poll_cancel", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_poll_cancel, test_poll_sync_fini, NULL});
    it_suite_add(
        s, "async_timeouts", IT_CASE_TIMEOUT, 2,
        (const TTest *const[]){test_to_recv_repeat, test_to_send_once, test_recv_ordered, NULL});
    it_suite_add(s, "async_timeout_queue", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_to_queue_full, test_to_sendmsg, NULL});
    return s;
}
