/* SPDX-License-Identifier: MIT */
/* Lifetimes over the ES-API: init/fini, descriptors and addresses, close with outstanding receives,
 * peer close, peer death, 10,000 connect/close cycles. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* exs_init: ENOTSUP for an unknown version, idempotent; init/fini twice in one process. */
START_TEST(test_init_fini)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_version_t v;

    ck_assert_int_eq(setenv("EXS_PROVIDER", it_provider, 1), 0);
    errno = 0;
    v = exs_init(99);
    ck_assert_msg(v == -1 && errno == ENOTSUP,
                  "exs_init(99) = %d errno %d (%s), expected -1 ENOTSUP", v, errno,
                  strerror(errno));
    ck_assert_int_eq(exs__debug_live_objects(), 0);
    for (int round = 0; round < 2; round++) {
        it_init();
        v = exs_init(EXS_VERSION);
        ck_assert_msg(v == EXS_VERSION, "second exs_init(EXS_VERSION) = %d errno %d", v, errno);
        it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
        sb = it_buf_new(5000, 1);
        rb = it_buf_new(5000, 1);
        it_fill(sb->p, 5000, (uint32_t)round);
        IT_POST_RECV(p.sfd, rb->p, 5000, p.sq, AH(1), rb->mh);
        IT_POST_SEND(p.cfd, sb->p, 5000, p.cq, AH(1), sb->mh);
        it_expect_recv(p.sq, p.sfd, AH(1), 5000, 0);
        it_expect_send(p.cq, p.cfd, AH(1), 5000);
        ck_assert_int_lt(it_check(rb->p, 5000, (uint32_t)round), 0);
        it_pair_close(&p);
        it_fini(); /* frees the buffers, asserts no live object, exs_fini */
    }
}
END_TEST

/* exs sockets are real descriptors; getsockname / getpeername and the ACCEPT event's
 * address agree. */
START_TEST(test_fds_and_addresses)
{
    struct sockaddr_in laddr, caddr, a;
    socklen_t len;
    exs_qhandle_t sq, cq;
    exs_event_t ev;
    int lfd, cfd, nfd;

    it_init();
    sq = it_qcreate(16);
    cq = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &laddr);
    IT_EXPECT_OK(exs_accept(lfd, sq, AH(1)));
    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(cfd, 0);
    ck_assert_msg(fcntl(lfd, F_GETFD) != -1, "listener %d is not an open descriptor", lfd);
    ck_assert_msg(fcntl(cfd, F_GETFD) != -1, "socket %d is not an open descriptor", cfd);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&laddr, sizeof(laddr), cq, AH(2)));
    it_expect_err(cq, EXS_EVT_CONNECT, cfd, AH(2), 0);
    it_expect_err_at(sq, EXS_EVT_ACCEPT, lfd, AH(1), 0, &ev, __FILE__, __LINE__);
    nfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_msg(nfd >= 0 && fcntl(nfd, F_GETFD) != -1, "accepted descriptor %d is not open", nfd);
    ck_assert(nfd != lfd && nfd != cfd);

    /* Client's peer = the listener's address. */
    len = sizeof(a);
    memset(&a, 0, sizeof(a));
    IT_EXPECT_OK(exs_getpeername(cfd, (struct sockaddr *)&a, &len));
    ck_assert_msg(len == sizeof(a) && a.sin_family == AF_INET &&
                      a.sin_addr.s_addr == laddr.sin_addr.s_addr && a.sin_port == laddr.sin_port,
                  "getpeername(client) = len %u family %d %s:%u, listener is 127.0.0.1:%u",
                  (unsigned)len, a.sin_family, inet_ntoa(a.sin_addr), ntohs(a.sin_port),
                  ntohs(laddr.sin_port));
    /* Server side's local port = the listener's. */
    len = sizeof(a);
    memset(&a, 0, sizeof(a));
    IT_EXPECT_OK(exs_getsockname(nfd, (struct sockaddr *)&a, &len));
    ck_assert_msg(len == sizeof(a) && a.sin_family == AF_INET && a.sin_port == laddr.sin_port,
                  "getsockname(server side) = len %u family %d port %u, listener's port %u",
                  (unsigned)len, a.sin_family, ntohs(a.sin_port), ntohs(laddr.sin_port));
    /* The ACCEPT event's address = the server side's peer = 127.0.0.1 (across hosts: this
     * host's address), some port. */
    {
        const struct sockaddr_in *ea =
            (const struct sockaddr_in *)&ev.exs_evt_u.exs_evt_accept.exs_evt_addr;

        ck_assert_msg(ev.exs_evt_u.exs_evt_accept.exs_evt_addrlen == sizeof(struct sockaddr_in) &&
                          ea->sin_family == AF_INET &&
                          ea->sin_addr.s_addr == it_client_in().s_addr && ea->sin_port != 0,
                      "ACCEPT event address: len %u family %d %s:%u",
                      (unsigned)ev.exs_evt_u.exs_evt_accept.exs_evt_addrlen, ea->sin_family,
                      inet_ntoa(ea->sin_addr), ntohs(ea->sin_port));
        len = sizeof(a);
        memset(&a, 0, sizeof(a));
        IT_EXPECT_OK(exs_getpeername(nfd, (struct sockaddr *)&a, &len));
        ck_assert_msg(len == sizeof(a) && a.sin_family == AF_INET && a.sin_port == ea->sin_port &&
                          a.sin_addr.s_addr == ea->sin_addr.s_addr,
                      "getpeername(server side) port %u, ACCEPT event's port %u", ntohs(a.sin_port),
                      ntohs(ea->sin_port));
        /* Client's local address = what the server sees as its peer. */
        len = sizeof(caddr);
        memset(&caddr, 0, sizeof(caddr));
        IT_EXPECT_OK(exs_getsockname(cfd, (struct sockaddr *)&caddr, &len));
        ck_assert_msg(len == sizeof(caddr) && caddr.sin_family == AF_INET &&
                          caddr.sin_addr.s_addr == ea->sin_addr.s_addr &&
                          caddr.sin_port == ea->sin_port,
                      "getsockname(client) = len %u family %d %s:%u; the server sees port %u",
                      (unsigned)len, caddr.sin_family, inet_ntoa(caddr.sin_addr),
                      ntohs(caddr.sin_port), ntohs(ea->sin_port));
    }
    it_close(cfd, cq);
    it_close(nfd, sq);
    it_close(lfd, sq);
    it_qdelete(cq);
    it_qdelete(sq);
}
END_TEST

/* exs_close with receives outstanding: each completes with ECANCELED, in posting order,
 * before the socket's CLOSE event; the peer's receive sees end of stream. */
START_TEST(test_close_outstanding)
{
    struct it_pair p;
    struct it_buf *small, *big, *r;
    uint8_t *unreg = malloc(3000);
    exs_event_t ev;
    int nrecv = 0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    small = it_buf_new(100, 1);
    big = it_buf_new(65536, 1);
    r = it_buf_new(100, 1);
    ck_assert_ptr_nonnull(unreg);
    IT_POST_RECV(p.sfd, r->p, 100, p.sq, AH(9), r->mh);
    IT_POST_RECV(p.cfd, small->p, 100, p.cq, AH(0), small->mh);
    IT_POST_RECV(p.cfd, big->p, 65536, p.cq, AH(1), big->mh); /* advertised */
    IT_POST_RECV(p.cfd, unreg, 3000, p.cq, AH(2), EXS_MHANDLE_UNREGISTERED);
    it_sleep_ms(20);
    IT_EXPECT_OK(exs_close(p.cfd, p.cq, AH(100)));
    for (;;) {
        char what[64];

        snprintf(what, sizeof(what), "event %d after exs_close", nrecv);
        if (!it_try_event(p.cq, -1, p.cfd, IT_TIMEOUT_MS, &ev))
            ck_abort_msg("no %s within %d ms (expected %s)", what, IT_TIMEOUT_MS,
                         nrecv < 3 ? "RECV ECANCELED" : "CLOSE");
        if (ev.exs_evt_type == EXS_EVT_CLOSE)
            break;
        ck_assert_msg(ev.exs_evt_type == EXS_EVT_RECV, "%s: type %s", what,
                      it_evt_name(ev.exs_evt_type));
        ck_assert_msg(
            ev.exs_evt_ahandle == AH(nrecv) && ev.exs_evt_errno == ECANCELED &&
                ev.exs_evt_u.exs_evt_xfer.exs_evt_result == -1,
            "%s: RECV ah %ld errno %d (%s) result %zd, expected ah %d ECANCELED result -1", what,
            IT_AHN(ev.exs_evt_ahandle), ev.exs_evt_errno, strerror(ev.exs_evt_errno),
            ev.exs_evt_u.exs_evt_xfer.exs_evt_result, nrecv);
        nrecv++;
    }
    ck_assert_msg(nrecv == 3, "CLOSE came after %d cancelled receives, expected 3", nrecv);
    ck_assert_msg(ev.exs_evt_ahandle == AH(100) && ev.exs_evt_errno == 0, "CLOSE ah %ld errno %d",
                  IT_AHN(ev.exs_evt_ahandle), ev.exs_evt_errno);
    ck_assert(it_buf_guards_ok(small) && it_buf_guards_ok(big));
    it_expect_no_event(p.cq, 100);
    p.cfd = -1;
    /* The server's receive: end of stream. */
    it_expect_recv(p.sq, p.sfd, AH(9), 0, 0);
    free(unreg);
    it_pair_close(&p);
}
END_TEST

/* The peer closes (exs_close, or exs_shutdown SHUT_WR): pending and later receives
 * complete with result 0, errno 0. */
static void peer_eos(int use_shutdown)
{
    struct it_pair p;
    struct it_buf *r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    r = it_buf_new(3 * 65536, 1);
    IT_POST_RECV(p.sfd, r->p, 100, p.sq, AH(1), r->mh);
    IT_POST_RECV(p.sfd, r->p + 65536, 65536, p.sq, AH(2), r->mh);
    it_sleep_ms(20);
    if (use_shutdown) {
        IT_EXPECT_OK(exs_shutdown(p.cfd, SHUT_WR, p.cq, AH(50)));
        it_expect_err(p.cq, EXS_EVT_SHUTDOWN, p.cfd, AH(50), 0);
    } else {
        it_close(p.cfd, p.cq);
        p.cfd = -1;
    }
    it_expect_recv(p.sq, p.sfd, AH(1), 0, 0);
    it_expect_recv(p.sq, p.sfd, AH(2), 0, 0);
    IT_POST_RECV(p.sfd, r->p + 2 * 65536, 65536, p.sq, AH(3), r->mh);
    it_expect_recv(p.sq, p.sfd, AH(3), 0, 0);
    IT_POST_RECV(p.sfd, r->p, 10, p.sq, AH(4), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.sq, p.sfd, AH(4), 0, 0);
    ck_assert(it_all_bytes(r->p + 10, 3 * 65536 - 10, IT_GUARD_BYTE));
    it_pair_close(&p);
}

START_TEST(test_peer_close)
{
    peer_eos(0);
}
END_TEST

START_TEST(test_peer_shutdown)
{
    peer_eos(1);
}
END_TEST

/* Read exactly len bytes from fd within ms; 1 on success. */
static int read_within(int fd, void *buf, size_t len, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    size_t got = 0;
    double end = it_now_ms() + ms;

    while (got < len) {
        int left = (int)(end - it_now_ms());
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return 0;
        n = read(fd, (char *)buf + got, len - got);
        if (n <= 0)
            return 0;
        got += (size_t)n;
    }
    return 1;
}

/* The forked peer: its own exs_init, connect, report, wait for the word, die by SIGKILL.
 * Exit codes name the step that failed. */
static void doomed_child(int rfd, int wfd)
{
    struct sockaddr_in addr = {.sin_family = AF_INET};
    struct timespec ts = {10, 0};
    exs_event_t ev;
    exs_qhandle_t q;
    char c;
    int fd;

    if (!read_within(rfd, &addr.sin_port, sizeof(addr.sin_port), 10000))
        _exit(10);
    addr.sin_addr = it_listen_in(); /* the parent's it_listen */
    if (exs_init(EXS_VERSION) != EXS_VERSION)
        _exit(11);
    q = exs_qcreate(16);
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (q == EXS_QHANDLE_INVALID || fd < 0)
        _exit(12);
    if (exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, AH(1)) != 0)
        _exit(13);
    if (exs_qdequeue(q, &ev, 1, &ts) != 1 || ev.exs_evt_type != EXS_EVT_CONNECT ||
        ev.exs_evt_errno != 0)
        _exit(14);
    if (write(wfd, "C", 1) != 1)
        _exit(15);
    if (!read_within(rfd, &c, 1, 10000))
        _exit(16);
    raise(SIGKILL);
    _exit(17);
}

/* Wait (bounded) for the child; returns its status or -1. */
static int reap_within(pid_t pid, int ms)
{
    double end = it_now_ms() + ms;
    int st;

    while (it_now_ms() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid)
            return st;
        it_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* The peer process dies (SIGKILL after its connect completed): the pending receive and a
 * later one complete with ECONNRESET, result -1. */
START_TEST(test_peer_killed)
{
    int to_child[2], from_child[2];
    struct sockaddr_in laddr;
    exs_qhandle_t q;
    exs_event_t ev;
    struct it_buf *r;
    pid_t pid;
    char c;
    int lfd, nfd, st;

    ck_assert_int_eq(pipe(to_child), 0);
    ck_assert_int_eq(pipe(from_child), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork(); /* before any exs_init in this process */
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(to_child[1]);
        close(from_child[0]);
        doomed_child(to_child[0], from_child[1]);
    }
    close(to_child[0]);
    close(from_child[1]);

    it_init();
    q = it_qcreate(16);
    r = it_buf_new(65536, 1);
    lfd = it_listen(SOCK_SEQPACKET, &laddr);
    IT_EXPECT_OK(exs_accept(lfd, q, AH(1)));
    ck_assert_int_eq(write(to_child[1], &laddr.sin_port, sizeof(laddr.sin_port)),
                     (ssize_t)sizeof(laddr.sin_port));
    if (!it_try_event(q, EXS_EVT_ACCEPT, lfd, IT_TIMEOUT_MS, &ev)) {
        st = reap_within(pid, 100);
        ck_abort_msg("no ACCEPT from the child (child status %#x: exit %d, signal %d)", st,
                     st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                     st >= 0 && WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    }
    ck_assert_msg(ev.exs_evt_errno == 0, "ACCEPT errno %d", ev.exs_evt_errno);
    nfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(nfd, 0);
    if (!read_within(from_child[0], &c, 1, IT_TIMEOUT_MS)) {
        st = reap_within(pid, 100);
        ck_abort_msg("child did not report its CONNECT (status %#x: exit %d)", st,
                     st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    IT_POST_RECV(nfd, r->p, 65536, q, AH(2), r->mh);
    it_sleep_ms(20);
    ck_assert_int_eq(write(to_child[1], "G", 1), 1);
    st = reap_within(pid, IT_TIMEOUT_MS);
    ck_assert_msg(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
                  "child did not die by SIGKILL (status %#x)", st);
    it_expect_err(q, EXS_EVT_RECV, nfd, AH(2), ECONNRESET);
    IT_EXPECT_OK(exs_recv(nfd, r->p, 100, 0, q, AH(3), r->mh));
    it_expect_err(q, EXS_EVT_RECV, nfd, AH(3), ECONNRESET);
    close(to_child[1]);
    close(from_child[0]);
    it_close(nfd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* What the cycles test is doing now (printed by the watchdog if a call never returns). */
static char cycle_step[160] = "cycles: not started";

#define STEP(...) snprintf(cycle_step, sizeof(cycle_step), __VA_ARGS__)

static void wait_cycle(exs_qhandle_t q, int type, int fd, long i, exs_event_t *ev)
{
    STEP("cycle %ld: waiting for %s (fd %d)", i, it_evt_name(type), fd);
    if (!it_try_event(q, type, fd, IT_TIMEOUT_MS, ev))
        ck_abort_msg("cycle %ld: no %s event (fd %d) within %d ms", i, it_evt_name(type), fd,
                     IT_TIMEOUT_MS);
    ck_assert_msg(ev->exs_evt_errno == 0 && ev->exs_evt_ahandle == AH(i),
                  "cycle %ld: %s event errno %d (%s) ah %ld", i, it_evt_name(type),
                  ev->exs_evt_errno, strerror(ev->exs_evt_errno), IT_AHN(ev->exs_evt_ahandle));
}

/* One async cycle: accept + connect, then both sides close (order alternating). */
static void one_cycle(exs_qhandle_t sq, exs_qhandle_t cq, int lfd, const struct sockaddr_in *addr,
                      long i)
{
    exs_event_t ev;
    int cfd, nfd, rc;

    STEP("cycle %ld: exs_accept / exs_socket / exs_connect", i);
    rc = exs_accept(lfd, sq, AH(i));
    ck_assert_msg(rc == 0, "cycle %ld: exs_accept errno %d (%s)", i, errno, strerror(errno));
    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_msg(cfd >= 0, "cycle %ld: exs_socket errno %d (%s)", i, errno, strerror(errno));
    rc = exs_connect(cfd, (const struct sockaddr *)addr, sizeof(*addr), cq, AH(i));
    ck_assert_msg(rc == 0, "cycle %ld: exs_connect errno %d (%s)", i, errno, strerror(errno));
    wait_cycle(cq, EXS_EVT_CONNECT, cfd, i, &ev);
    wait_cycle(sq, EXS_EVT_ACCEPT, lfd, i, &ev);
    nfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_msg(nfd >= 0, "cycle %ld: newfd %d", i, nfd);
    STEP("cycle %ld: exs_close of client fd %d and server fd %d (%s first)", i, cfd, nfd,
         i % 2 == 0 ? "client" : "server");
    if (i % 2 == 0) {
        ck_assert_msg(exs_close(cfd, cq, AH(i)) == 0, "cycle %ld: exs_close(client) errno %d", i,
                      errno);
        ck_assert_msg(exs_close(nfd, sq, AH(i)) == 0, "cycle %ld: exs_close(server) errno %d", i,
                      errno);
    } else {
        ck_assert_msg(exs_close(nfd, sq, AH(i)) == 0, "cycle %ld: exs_close(server) errno %d", i,
                      errno);
        ck_assert_msg(exs_close(cfd, cq, AH(i)) == 0, "cycle %ld: exs_close(client) errno %d", i,
                      errno);
    }
    wait_cycle(cq, EXS_EVT_CLOSE, cfd, i, &ev);
    wait_cycle(sq, EXS_EVT_CLOSE, nfd, i, &ev);
}

/* 10,000 async connect/close cycles: no descriptor, thread or library object leaks.
 * EXS_TEST_CYCLES lowers the count where a cycle is slow (Soft-RoCE under emulation). */
START_TEST(test_connect_close_cycles)
{
    const char *env = getenv("EXS_TEST_CYCLES");
    const int CYCLES = env && atoi(env) > 0 ? atoi(env) : 10000;
    int fds0, tasks0;
    int fds1, tasks1, fds2, tasks2, live;
    struct sockaddr_in addr;
    exs_qhandle_t sq, cq;
    double t0, dt;
    int lfd;

    /* descriptors are counted: no control endpoint, whose clients (an exsctl stat of
     * another job on this host) come and go on their own */
    it_setenv("EXS_CTL_ENABLE", "0");
    /* rdma-core keeps process-wide descriptors (device files) open once opened: one
     * init/fini round first, so only what libexs itself leaves behind is counted */
    ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION);
    exs_fini();
    fds0 = it_count_fds();
    tasks0 = it_count_tasks_expect(1); /* the test's own thread, once fini's threads are gone */
    it_init();
    sq = it_qcreate(64);
    cq = it_qcreate(64);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    one_cycle(sq, cq, lfd, &addr, 0); /* warm-up: lazily created threads and descriptors */
    /* the warm-up's last descriptors may still be closing: the fewest seen over a moment */
    fds1 = it_count_fds();
    for (int i = 0; i < 30; i++) {
        it_sleep_ms(10);
        int now_fds = it_count_fds();

        fds1 = now_fds < fds1 ? now_fds : fds1;
    }
    tasks1 = it_count_tasks();
    t0 = it_now_ms();
    it_watchdog_start(30, cycle_step); /* 30 s without a completed cycle */
    for (long i = 1; i <= CYCLES; i++) {
        one_cycle(sq, cq, lfd, &addr, i);
        it_watchdog_kick();
        if (i % 1000 == 0) {
            printf("connect_close_cycles: %ld cycles after %.0f ms\n", i, it_now_ms() - t0);
            fflush(stdout);
        }
    }
    it_watchdog_stop();
    dt = it_now_ms() - t0;
    /* the last cycle's descriptors go as its closes finish: wait for them (bounded) */
    fds2 = it_count_fds();
    for (double dl = it_now_ms() + 5000; fds2 > fds1 && it_now_ms() < dl; fds2 = it_count_fds())
        it_sleep_ms(10);
    tasks2 = it_count_tasks_expect(tasks1);
    printf("connect_close_cycles: %d cycles in %.0f ms (%.1f us each), provider %s\n", CYCLES, dt,
           dt * 1000 / CYCLES, it_provider);
    fflush(stdout);
    /* none left behind (fewer than after the warm-up is no leak: a closing descriptor of
     * the warm-up may still have been counted there) */
    ck_assert_msg(fds2 <= fds1, "descriptors: %d after the first cycle, %d after %d more", fds1,
                  fds2, CYCLES);
    ck_assert_msg(tasks2 == tasks1, "threads: %d after the first cycle, %d after %d more", tasks1,
                  tasks2, CYCLES);
    it_close(lfd, sq);
    it_qdelete(sq);
    it_qdelete(cq);
    live = exs__debug_live_objects();
    ck_assert_msg(live == 0, "exs__debug_live_objects() == %d after all closes completed", live);
    it_fini();
    ck_assert_msg(it_count_fds() == fds0, "descriptors: %d before exs_init, %d after exs_fini",
                  fds0, it_count_fds());
    tasks2 = it_count_tasks_expect(tasks0);
    ck_assert_msg(tasks2 == tasks0, "threads: %d before exs_init, %d after exs_fini", tasks0,
                  tasks2);
}
END_TEST

Suite *integ_lifecycle_suite(void)
{
    Suite *s = suite_create("integ_lifecycle");
    TCase *tc;

    tc = it_tcase("init", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_init_fini);
    tcase_add_test(tc, test_fds_and_addresses);
    suite_add_tcase(s, tc);
    tc = it_tcase("close", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_close_outstanding);
    tcase_add_test(tc, test_peer_close);
    tcase_add_test(tc, test_peer_shutdown);
    tcase_add_test(tc, test_peer_killed);
    suite_add_tcase(s, tc);
    tc = it_tcase("cycles", 300);
    tcase_add_test(tc, test_connect_close_cycles);
    suite_add_tcase(s, tc);
    return s;
}
