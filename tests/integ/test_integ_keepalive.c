/* SPDX-License-Identifier: MIT */
/* Keepalive and deadlines (issue 13): dead, frozen and silent peers are found by probes, idle
 * healthy connections are left alone, connects and stalled sends are bounded. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "integ.h"
#include "tests/skip.h"

/* Keepalive of the detection tests: interval x probes, as the issue asks. */
#define KA_INTV_MS  200
#define KA_PROBES   3
/* Upper bound of a detection: interval x probes + one interval is the design's (plus
 * the interval already running when the peer went); the rest is slack for a shared,
 * noisy machine. */
#define KA_BOUND_MS 6000

enum peer_mode {
    PEER_IDLE,      /* accept, then wait (to be stopped or killed by the parent) */
    PEER_BLACKHOLE, /* accept, then the link silently stops delivering (EXS_EMU_BLACKHOLE) */
};

struct peer {
    pid_t pid;
    int from_child;
    struct sockaddr_in addr;
};

/* The peer process: accept one SEQPACKET connection, report the port first and a byte
 * once the connection is up (and blackholed), then wait to be killed. No Check
 * assertion here: this process runs no test. */
static void peer_child(int to_parent, enum peer_mode mode) __attribute__((noreturn));
static void peer_child(int to_parent, enum peer_mode mode)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in addr;
    socklen_t len = sizeof(addr);
    exs_event_t ev;
    exs_qhandle_t q;
    char ok = 1;
    int lfd;

    if (exs_init(EXS_VERSION) != EXS_VERSION)
        _exit(3);
    q = exs_qcreate(8);
    lfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (q == EXS_QHANDLE_INVALID || lfd < 0 ||
        exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) || exs_listen(lfd, 8) ||
        exs_getsockname(lfd, (struct sockaddr *)&addr, &len) || exs_accept(lfd, q, NULL))
        _exit(4);
    if (write(to_parent, &addr.sin_port, sizeof(addr.sin_port)) < 0)
        _exit(5);
    if (exs_qdequeue(q, &ev, 1, NULL) != 1 || ev.exs_evt_errno)
        _exit(6);
    if (mode == PEER_BLACKHOLE && exs__params_set("emu_blackhole", "1"))
        _exit(7);
    if (write(to_parent, &ok, 1) < 0)
        _exit(8);
    for (;;)
        pause();
}

/* Fork the peer (before exs_init in this process) and read its port. */
static void peer_start(struct peer *p, enum peer_mode mode)
{
    int pipefd[2];

    ck_assert_int_eq(pipe(pipefd), 0);
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        close(pipefd[0]);
        peer_child(pipefd[1], mode);
    }
    close(pipefd[1]);
    p->from_child = pipefd[0];
    memset(&p->addr, 0, sizeof(p->addr));
    p->addr.sin_family = AF_INET;
    p->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(read(p->from_child, &p->addr.sin_port, sizeof(p->addr.sin_port)),
                     (ssize_t)sizeof(p->addr.sin_port));
}

/* The peer's byte: its side of the connection is up (and blackholed). */
static void peer_wait_ready(struct peer *p)
{
    struct pollfd pfd = {.fd = p->from_child, .events = POLLIN};
    char c;

    ck_assert_msg(poll(&pfd, 1, IT_TIMEOUT_MS) == 1, "the peer did not report its connection");
    ck_assert_int_eq(read(p->from_child, &c, 1), 1);
}

static void peer_stop(struct peer *p)
{
    int status;

    kill(p->pid, SIGKILL);
    ck_assert_int_eq(waitpid(p->pid, &status, 0), p->pid);
}

static void get_stats(int fd, struct exs_sock_stats *st)
{
    socklen_t len = sizeof(*st);

    memset(st, 0, sizeof(*st));
    IT_EXPECT_OK(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, st, &len));
    ck_assert_uint_eq(len, sizeof(*st));
}

/* Waits, with no event on q, until the socket fd has sent at least n keepalive probes
 * (a condition, not a time: on a starved host the intervals stretch). */
static void wait_probes(exs_qhandle_t q, int fd, unsigned long long n, struct exs_sock_stats *st)
{
    double t0 = it_now_ms();

    for (;;) {
        get_stats(fd, st);
        if (st->keepalive_probes >= n)
            return;
        ck_assert_msg(it_now_ms() - t0 < 60000, "%llu of %llu probes in 60 s",
                      (unsigned long long)st->keepalive_probes, n);
        it_expect_no_event(q, 50);
    }
}

/* Descriptors come back to base (the tcp provider's socket of a connection given up may
 * linger for a while: up to its linger time plus slack). */
static void expect_fds(int base)
{
    double end = it_now_ms() + 10000;
    int n;

    while ((n = it_count_fds()) != base && it_now_ms() < end)
        it_sleep_ms(20);
    ck_assert_msg(n == base, "descriptors: %d, %d before the connection", n, base);
}

enum gone_how { GONE_BLACKHOLE, GONE_FROZEN, GONE_KILLED };

/* Connect to a peer, make it go (how), and check that the outstanding receive and send
 * complete with ETIMEDOUT within the keepalive bound, the socket stays until closed and
 * nothing is left behind. */
static void run_gone(enum gone_how how, const char *name)
{
    struct exs_sock_stats st;
    struct it_buf *rb, *sb;
    struct peer peer;
    exs_event_t ev;
    exs_qhandle_t q;
    int fd, fds0, expect_err = ETIMEDOUT;
    double t0, dt;

    if (how == GONE_BLACKHOLE && strcmp(it_provider, "tcp") != 0) {
        /* a frozen peer is found on every provider (its NIC answers for the stopped
         * process, its library does not: feature ALIVE, spec/protocol.md §9.1); the
         * blackhole is the tcp provider's link emulation */
        test_skip(name, "provider %s: the link emulation is the tcp provider's", it_provider);
        return;
    }
    peer_start(&peer, how == GONE_BLACKHOLE ? PEER_BLACKHOLE : PEER_IDLE);
    it_setenv("EXS_KEEPALIVE_INTV_MS", "200"); /* KA_INTV_MS */
    it_setenv("EXS_KEEPALIVE_PROBES", "3");    /* KA_PROBES */
    it_init();
    q = it_qcreate(8);
    rb = it_buf_new(64, 1);
    /* more than the peer's eager_max (EXS_EAGER_MAX, 8192): announced, so only the
     * peer's library (its READ) completes the send; an eager one completes once the
     * peer's NIC took it, which a frozen process's NIC does on RDMA hardware */
    sb = it_buf_new(65536, 1);
    fds0 = it_count_fds();
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(fd, 0);
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&peer.addr, sizeof(peer.addr), q, IT_AH(1)));
    it_expect_err(q, EXS_EVT_CONNECT, fd, IT_AH(1), 0);
    peer_wait_ready(&peer);

    switch (how) {
    case GONE_BLACKHOLE:
        break; /* the peer's link already delivers nothing */
    case GONE_FROZEN:
        ck_assert_int_eq(kill(peer.pid, SIGSTOP), 0);
        break;
    case GONE_KILLED:
        /* RDMA gives no reset when a peer dies; on tcp its kernel would: our side of
         * the emulated link goes silent first, so only keepalive can tell */
        if (strcmp(it_provider, "tcp") == 0)
            IT_EXPECT_OK(exs__params_set("emu_blackhole", "1"));
        else
            expect_err = 0; /* verbs: ETIMEDOUT, or the reset its cm may still send */
        peer_stop(&peer);
        break;
    }
    t0 = it_now_ms();
    IT_POST_RECV(fd, rb->p, rb->len, q, IT_AH(2), rb->mh);
    IT_POST_SEND(fd, sb->p, sb->len, q, IT_AH(3), sb->mh);
    it_wait_event_at(q, EXS_EVT_RECV, fd, KA_BOUND_MS + 4000, &ev, __FILE__, __LINE__);
    dt = it_now_ms() - t0;
    if (expect_err)
        ck_assert_msg(ev.exs_evt_errno == expect_err, "%s: receive ended with errno %d (%s)", name,
                      ev.exs_evt_errno, strerror(ev.exs_evt_errno));
    else
        ck_assert_msg(ev.exs_evt_errno == ETIMEDOUT || ev.exs_evt_errno == ECONNRESET,
                      "%s: receive ended with errno %d (%s)", name, ev.exs_evt_errno,
                      strerror(ev.exs_evt_errno));
    ck_assert_msg(dt <= KA_BOUND_MS, "%s: found after %.0f ms (bound %d)", name, dt, KA_BOUND_MS);
    it_expect_err(q, EXS_EVT_SEND, fd, IT_AH(3), expect_err ? expect_err : ev.exs_evt_errno);
    get_stats(fd, &st);
    printf("%s: outstanding operations ended (%s) %.0f ms after they were posted, "
           "%llu probes (interval %d ms x %d)\n",
           name, strerror(ev.exs_evt_errno), dt, (unsigned long long)st.keepalive_probes,
           KA_INTV_MS, KA_PROBES);
    fflush(stdout);
    if (expect_err == ETIMEDOUT) {
        /* nothing else ended it: keepalive did, after unanswered probes */
        ck_assert_uint_eq(st.keepalive_timeouts, 1);
        ck_assert_uint_ge(st.keepalive_probes, 1);
        ck_assert_msg(dt >= KA_INTV_MS, "%s: ended after %.0f ms, before one interval", name, dt);
    }
    /* the socket stays (like a reset one) until closed; a new receive ends at once */
    IT_POST_RECV(fd, rb->p, rb->len, q, IT_AH(4), rb->mh);
    it_wait_event(q, EXS_EVT_RECV, fd, &ev);
    ck_assert_int_ne(ev.exs_evt_errno, 0);
    it_close(fd, q);
    if (how != GONE_KILLED)
        peer_stop(&peer);
    IT_EXPECT_OK(exs__params_set("emu_blackhole", "0"));
    expect_fds(fds0);
    close(peer.from_child);
    it_qdelete(q);
    it_buf_free(rb);
    it_buf_free(sb);
}

START_TEST(test_ka_blackholed_link)
{
    run_gone(GONE_BLACKHOLE, "ka_blackholed_link");
}
END_TEST

START_TEST(test_ka_frozen_peer)
{
    run_gone(GONE_FROZEN, "ka_frozen_peer");
}
END_TEST

START_TEST(test_ka_killed_peer)
{
    run_gone(GONE_KILLED, "ka_killed_peer");
}
END_TEST

/* An idle, healthy connection with keepalive on stays up across many intervals, and
 * neither application sees anything of the probes. */
START_TEST(test_ka_idle_healthy)
{
    struct exs_sock_stats cs, ss;
    struct it_buf *rb, *sb;
    struct it_pair p;
    int v = 0;
    socklen_t len = sizeof(v);

    /* a wide dead window (2.1 s of silence): the peer only has to be scheduled within it,
     * however long the intervals stretch on a busy host */
    it_setenv("EXS_KEEPALIVE_INTV_MS", "100");
    it_setenv("EXS_KEEPALIVE_PROBES", "20");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 8, 8);
    IT_EXPECT_OK(exs_getsockopt(p.cfd, SOL_SOCKET, SO_KEEPALIVE, &v, &len));
    ck_assert_int_eq(v, 1); /* on by default */
    rb = it_buf_new(64, 1);
    sb = it_buf_new(64, 1);
    IT_POST_RECV(p.sfd, rb->p, rb->len, p.sq, IT_AH(1), rb->mh);
    /* an idle side probes every other interval: three probes each way */
    wait_probes(p.sq, p.cfd, 3, &cs);
    wait_probes(p.sq, p.sfd, 3, &ss);
    it_expect_no_event(p.cq, 0);
    get_stats(p.cfd, &cs);
    ck_assert_uint_eq(cs.keepalive_timeouts, 0);
    ck_assert_uint_eq(ss.keepalive_timeouts, 0);
    /* and the connection still carries data */
    it_fill(sb->p, sb->len, 7);
    IT_POST_SEND(p.cfd, sb->p, sb->len, p.cq, IT_AH(2), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(2), 64);
    it_expect_recv(p.sq, p.sfd, IT_AH(1), 64, 0);
    ck_assert_int_eq(it_check(rb->p, 64, 7), -1);
    it_buf_free(rb);
    it_buf_free(sb);
    it_pair_close(&p);
}
END_TEST

/* A peer whose library stopped while its NIC still acknowledges (what a frozen process
 * is on RDMA hardware and Soft-RoCE), emulated over any provider by the fault provider's
 * freeze: the client's endpoint sends nothing and delivers no completion, while the
 * server's sends still reach it and complete at the server. The server probes; its PINGs
 * complete (acknowledged below the client's library) and are never answered: it finds the
 * client dead within the bound, its outstanding receive ends with ETIMEDOUT. Without
 * feature ALIVE the acknowledged probes kept the client "alive" forever. */
START_TEST(test_ka_frozen_library)
{
    struct exs_sock_stats st;
    struct it_buf *cb, *sb;
    struct it_pair p;
    exs_event_t ev;
    int ms = KA_INTV_MS;
    uint64_t n = 0;
    double t0, dt, end;

    /* keepalive off until the client is frozen (no probe may be the frozen send), then
     * on for the server alone; the connections' timers look every 100 ms (a quarter of
     * the send deadline; no send waits here), so that applies at once */
    it_setenv("EXS_KEEPALIVE_INTV_MS", "0");
    it_setenv("EXS_KEEPALIVE_PROBES", "3"); /* KA_PROBES */
    it_setenv("EXS_SEND_TIMEOUT_MS", "400");
    it_fault_init();
    it_pair_open(&p, SOCK_SEQPACKET, 8, 8);
    cb = it_buf_new(65536, 1); /* at least eager_max: advertised */
    sb = it_buf_new(64, 1);
    it_fault_set("fault_freeze_ms", "3600000");
    it_fault_set_port(&p);
    it_fault_set("fault_freeze_nth", "1");
    /* the client's receive is advertised (§6): that SEND freezes the client's endpoint */
    IT_POST_RECV(p.cfd, cb->p, cb->len, p.cq, IT_AH(1), cb->mh);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while (exs__counters_lookup("prov.fault", "freeze", &n) == 0 && !n && it_now_ms() < end)
        it_sleep_ms(1);
    it_fault_set("fault_freeze_nth", "0");
    ck_assert_int_eq(exs__counters_lookup("prov.fault", "freeze", &n), 0);
    ck_assert_uint_eq(n, 1);
    IT_EXPECT_OK(exs_setsockopt(p.sfd, SOL_EXS, EXS_SO_KEEPALIVE_MS, &ms, sizeof(ms)));
    t0 = it_now_ms();
    IT_POST_RECV(p.sfd, sb->p, sb->len, p.sq, IT_AH(2), sb->mh);
    it_wait_event_at(p.sq, EXS_EVT_RECV, p.sfd, KA_BOUND_MS + 4000, &ev, __FILE__, __LINE__);
    dt = it_now_ms() - t0;
    get_stats(p.sfd, &st);
    printf("ka_frozen_library: the server's receive ended (%s) %.0f ms after it was posted, "
           "%llu probes (interval %d ms x %d)\n",
           strerror(ev.exs_evt_errno), dt, (unsigned long long)st.keepalive_probes, KA_INTV_MS,
           KA_PROBES);
    fflush(stdout);
    ck_assert_msg(ev.exs_evt_errno == ETIMEDOUT, "the receive ended with errno %d (%s)",
                  ev.exs_evt_errno, strerror(ev.exs_evt_errno));
    ck_assert_msg(dt <= KA_BOUND_MS, "found after %.0f ms (bound %d)", dt, KA_BOUND_MS);
    ck_assert_uint_eq(st.keepalive_timeouts, 1);
    ck_assert_uint_ge(st.keepalive_probes, 1);
    /* thaw: the client learns that its peer is gone */
    it_fault_set("fault_freeze_ms", "0");
    it_wait_event(p.cq, EXS_EVT_RECV, p.cfd, &ev);
    ck_assert_int_ne(ev.exs_evt_errno, 0);
    it_pair_close(&p);
    it_buf_free(cb);
    it_buf_free(sb);
}
END_TEST

/* Keepalive answered by the peer's library (feature ALIVE): one side probes (200 ms x
 * ANS_PROBES), the other has keepalive off and only answers. _i 0: the client probes, _i
 * 1: the server. An idle, healthy connection stays up for ANS_PROBES + 4 probes although
 * only receives prove the peer alive: every PING was answered by the other side's library
 * (without the answers the prober declares the peer dead after ANS_PROBES unanswered
 * ones), neither application sees anything, then data flows both ways and the close is
 * clean. The dead window (about 2.2 s) only asks the peer to be scheduled within it. */
#define ANS_PROBES 10
START_TEST(test_ka_idle_answered)
{
    struct sockaddr_in addr;
    struct exs_sock_stats ps, as;
    struct it_buf *cb, *sb, *crb, *srb;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, cfd, sfd, off = 0, pfd, afd;

    it_setenv("EXS_KEEPALIVE_INTV_MS", "200"); /* KA_INTV_MS */
    it_setenv("EXS_KEEPALIVE_PROBES", "10");   /* ANS_PROBES */
    it_init();
    q = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(cfd, 0);
    /* the answering side: keepalive off (a listener's children take its setting) */
    IT_EXPECT_OK(exs_setsockopt(_i ? cfd : lfd, SOL_SOCKET, SO_KEEPALIVE, &off, sizeof(off)));
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_expect_err(q, EXS_EVT_CONNECT, cfd, IT_AH(2), 0);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(1), 0, &ev, __FILE__, __LINE__);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(sfd, 0);
    pfd = _i ? sfd : cfd;
    afd = _i ? cfd : sfd;
    wait_probes(q, pfd, ANS_PROBES + 4, &ps);
    get_stats(afd, &as);
    printf("ka_idle_answered (%s probes): %llu probes, %llu answers (interval %d ms x "
           "%d)\n",
           _i ? "server" : "client", (unsigned long long)ps.keepalive_probes,
           (unsigned long long)as.keepalive_answers, KA_INTV_MS, ANS_PROBES);
    fflush(stdout);
    ck_assert_uint_eq(ps.keepalive_timeouts, 0);
    ck_assert_uint_eq(as.keepalive_timeouts, 0);
    /* answered one for one (nothing else goes while idle), so at least as many answers
     * as probes less the last */
    ck_assert_msg(as.keepalive_answers + 1 >= ps.keepalive_probes, "%llu probes, %llu answers",
                  (unsigned long long)ps.keepalive_probes,
                  (unsigned long long)as.keepalive_answers);
    ck_assert_uint_eq(as.keepalive_probes, 0);
    ck_assert_uint_eq(ps.keepalive_answers, 0);
    /* the connection still carries data, both ways */
    cb = it_buf_new(64, 1);
    sb = it_buf_new(64, 1);
    crb = it_buf_new(64, 1);
    srb = it_buf_new(64, 1);
    it_fill(cb->p, 64, 5);
    it_fill(sb->p, 64, 6);
    IT_POST_RECV(sfd, srb->p, srb->len, q, IT_AH(3), srb->mh);
    IT_POST_RECV(cfd, crb->p, crb->len, q, IT_AH(4), crb->mh);
    IT_POST_SEND(cfd, cb->p, cb->len, q, IT_AH(5), cb->mh);
    IT_POST_SEND(sfd, sb->p, sb->len, q, IT_AH(6), sb->mh);
    it_expect_send(q, cfd, IT_AH(5), 64);
    it_expect_send(q, sfd, IT_AH(6), 64);
    it_expect_recv(q, sfd, IT_AH(3), 64, 0);
    it_expect_recv(q, cfd, IT_AH(4), 64, 0);
    ck_assert_int_eq(it_check(srb->p, 64, 5), -1);
    ck_assert_int_eq(it_check(crb->p, 64, 6), -1);
    it_close(cfd, q);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_buf_free(cb);
    it_buf_free(sb);
    it_buf_free(crb);
    it_buf_free(srb);
}
END_TEST

/* SO_KEEPALIVE 0 turns probes off for a socket (and the children of a listener); with
 * the tunable off, EXS_SO_KEEPALIVE_MS still turns them on for one socket. */
START_TEST(test_ka_off)
{
    struct sockaddr_in addr;
    struct exs_sock_stats cs, ss;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, cfd, sfd, off = 0, ms = 100, tunable_off = _i == 1;

    it_setenv("EXS_KEEPALIVE_INTV_MS", tunable_off ? "0" : "100");
    it_init();
    q = it_qcreate(8);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(cfd, 0);
    if (tunable_off) {
        /* only the client's own interval */
        IT_EXPECT_OK(exs_setsockopt(cfd, SOL_EXS, EXS_SO_KEEPALIVE_MS, &ms, sizeof(ms)));
    } else {
        IT_EXPECT_OK(exs_setsockopt(lfd, SOL_SOCKET, SO_KEEPALIVE, &off, sizeof(off)));
        IT_EXPECT_OK(exs_setsockopt(cfd, SOL_SOCKET, SO_KEEPALIVE, &off, sizeof(off)));
    }
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_expect_err(q, EXS_EVT_CONNECT, cfd, IT_AH(2), 0);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(1), 0, &ev, __FILE__, __LINE__);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(sfd, 0);
    if (tunable_off)
        wait_probes(q, cfd, 2, &cs); /* the client probes with its own interval */
    else
        it_expect_no_event(q, 1000); /* 10 intervals */
    get_stats(cfd, &cs);
    get_stats(sfd, &ss);
    if (tunable_off) {
        ck_assert_uint_eq(ss.keepalive_probes, 0);
    } else {
        ck_assert_uint_eq(cs.keepalive_probes, 0);
        ck_assert_uint_eq(ss.keepalive_probes, 0);
    }
    it_close(cfd, q);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* A peer that accepts the TCP connection and never answers the connection request (a
 * kernel listener nobody accepts on): exs_connect fails with ETIMEDOUT after
 * EXS_CONNECT_TIMEOUT_MS, the socket can connect again, nothing is left behind. */
START_TEST(test_connect_deadline)
{
    struct sockaddr_in silent = {.sin_family = AF_INET}, addr;
    socklen_t len = sizeof(silent);
    exs_event_t ev;
    exs_qhandle_t q;
    int kfd, fd, lfd, fds0;
    double t0, dt;

    if (strcmp(it_provider, "tcp") != 0) {
        test_skip("connect_deadline",
                  "provider %s: a kernel TCP listener is no peer of its "
                  "connection manager",
                  it_provider);
        return;
    }
    kfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(kfd, 0);
    silent.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(kfd, (struct sockaddr *)&silent, sizeof(silent)), 0);
    ck_assert_int_eq(listen(kfd, 8), 0);
    ck_assert_int_eq(getsockname(kfd, (struct sockaddr *)&silent, &len), 0);

    it_setenv("EXS_CONNECT_TIMEOUT_MS", "300");
    it_init();
    q = it_qcreate(8);
    fds0 = it_count_fds();
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(fd, 0);
    t0 = it_now_ms();
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&silent, sizeof(silent), q, IT_AH(1)));
    it_expect_err(q, EXS_EVT_CONNECT, fd, IT_AH(1), ETIMEDOUT);
    dt = it_now_ms() - t0;
    printf("connect_deadline: ETIMEDOUT after %.0f ms (EXS_CONNECT_TIMEOUT_MS 300)\n", dt);
    fflush(stdout);
    ck_assert_msg(dt >= 250, "connect failed after %.0f ms, before its deadline", dt);
    ck_assert_msg(dt <= 5000, "connect failed after %.0f ms", dt);
    /* the socket is usable again: it connects to a real listener */
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(2)));
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(3)));
    it_expect_err(q, EXS_EVT_CONNECT, fd, IT_AH(3), 0);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(2), 0, &ev, __FILE__, __LINE__);
    it_close(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd, q);
    it_close(fd, q);
    it_close(lfd, q);
    expect_fds(fds0);
    it_qdelete(q);
    close(kfd);
}
END_TEST

/* A peer that never reads its ring (its application posts no receive) holds the
 * sender's data forever: once the queued sends made no progress for
 * EXS_SEND_TIMEOUT_MS, the connection is reset with ETIMEDOUT, although the peer
 * answers every keepalive probe; the process keeps serving its other connections. */
START_TEST(test_send_stall_deadline)
{
    struct exs_sock_stats st;
    struct it_pair p, other;
    struct it_buf *sb, *rb;
    exs_event_t ev;
    int n = 0, timed_out = 0, type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    double t0, dt = 0;

    it_setenv("EXS_SEND_TIMEOUT_MS", "400");
    it_setenv("EXS_KEEPALIVE_INTV_MS", "100");
    it_setenv("EXS_KEEPALIVE_PROBES", "20"); /* a dead window the answering peer meets */
    it_setenv("EXS_RING_SIZE", "4096");
    it_setenv("EXS_SNDBUF", "4096"); /* STREAM: four sends fit the send buffer, the rest wait */
    it_init();
    it_pair_open(&p, type, 8, 64);
    sb = it_buf_new(1024, 1);
    rb = it_buf_new(1024, 1);
    /* more than the ring and the credits hold: the rest waits for the peer */
    t0 = it_now_ms();
    for (int i = 0; i < 40; i++)
        IT_POST_SEND(p.cfd, sb->p, sb->len, p.cq, IT_AH(100 + i), sb->mh);
    for (int i = 0; i < 40; i++) {
        it_wait_event_at(p.cq, EXS_EVT_SEND, p.cfd, 10000, &ev, __FILE__, __LINE__);
        if (ev.exs_evt_errno == 0) {
            n++;
            ck_assert_msg(!timed_out, "send %d completed after one timed out", i);
        } else {
            ck_assert_msg(ev.exs_evt_errno == ETIMEDOUT, "send %d: errno %d (%s)", i,
                          ev.exs_evt_errno, strerror(ev.exs_evt_errno));
            if (!timed_out)
                dt = it_now_ms() - t0;
            timed_out++;
        }
    }
    ck_assert_msg(timed_out > 0, "every send completed: the peer read nothing, yet %d went", n);
    printf("send_stall_deadline (%s): %d sends went, %d ended ETIMEDOUT after %.0f ms "
           "(EXS_SEND_TIMEOUT_MS 400)\n",
           type == SOCK_STREAM ? "stream" : "seqpacket", n, timed_out, dt);
    fflush(stdout);
    ck_assert_msg(dt >= 350, "the stall was declared after %.0f ms, before its deadline", dt);
    get_stats(p.cfd, &st);
    ck_assert_uint_eq(st.keepalive_timeouts, 0); /* the peer answered its probes */

    /* the process still serves another connection */
    it_pair_open(&other, type, 8, 8);
    it_fill(sb->p, 64, 3);
    IT_POST_RECV(other.sfd, rb->p, 64, other.sq, IT_AH(1), rb->mh);
    IT_POST_SEND(other.cfd, sb->p, 64, other.cq, IT_AH(2), sb->mh);
    it_expect_send(other.cq, other.cfd, IT_AH(2), 64);
    it_expect_recv(other.sq, other.sfd, IT_AH(1), 64, 0);
    ck_assert_int_eq(it_check(rb->p, 64, 3), -1);
    it_pair_close(&other);
    /* the stalled peer learns of the reset */
    it_close(p.cfd, p.cq);
    p.cfd = -1;
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

Suite *integ_keepalive_suite(void)
{
    Suite *s = suite_create("integ_keepalive");
    TCase *tc;

    tc = it_tcase("keepalive_gone", 60);
    tcase_add_test(tc, test_ka_blackholed_link);
    tcase_add_test(tc, test_ka_frozen_peer);
    tcase_add_test(tc, test_ka_killed_peer);
    suite_add_tcase(s, tc);
    tc = tcase_create("keepalive_frozen_library");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, it_fault_teardown);
    tcase_add_test(tc, test_ka_frozen_library);
    suite_add_tcase(s, tc);
    tc = it_tcase("keepalive_idle", 30);
    tcase_add_test(tc, test_ka_idle_healthy);
    tcase_add_loop_test(tc, test_ka_idle_answered, 0, 2);
    tcase_add_loop_test(tc, test_ka_off, 0, 2);
    suite_add_tcase(s, tc);
    tc = it_tcase("deadlines", 60);
    tcase_add_test(tc, test_connect_deadline);
    tcase_add_loop_test(tc, test_send_stall_deadline, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
