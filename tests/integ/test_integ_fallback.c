/* SPDX-License-Identifier: MIT */
/* RDMA-to-TCP fallback: connects the primary provider fails are retried over tcp, listeners listen
 * on both, and the second context is driven, slept on and released like the first. */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/engine/engine.h"
#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "integ.h"
#include "tests/skip.h"

/* The port offset of the fallback listener when the primary is TCP underneath. */
#define FB_OFFSET     1000
#define FB_OFFSET_STR "1000"

static char fb_prov[32];

static void fb_count_reset(void);

/* The inner provider under test: tcp for tcp and fault:tcp, verbs for verbs. */
static const char *fb_inner(void)
{
    return strncmp(it_provider, "fault:", 6) == 0 ? it_provider + 6 : it_provider;
}

/* The fault provider over the one under test as the primary (a connect fault stands for
 * an RDMA connect that fails), tcp as the fallback; connect_nth: EXS_FAULT_CONNECT_NTH
 * (NULL: no connect fails by injection). */
static void fb_init(const char *policy, const char *connect_nth)
{
    const char *saved = it_provider;
    int tcp = strcmp(fb_inner(), "tcp") == 0;

    snprintf(fb_prov, sizeof(fb_prov), "fault:%s", fb_inner());
    it_setenv("EXS_FALLBACK", policy);
    /* both fault:tcp and tcp listen on TCP ports: the fallback's are moved */
    it_setenv("EXS_FALLBACK_PORT_OFFSET", tcp ? FB_OFFSET_STR : "0");
    if (connect_nth)
        it_setenv("EXS_FAULT_CONNECT_NTH", connect_nth);
    it_provider = fb_prov;
    it_init();
    it_provider = saved;
    fb_count_reset();
}

/* The tunables of this suite back to their defaults (also after a failed test). */
static void fb_teardown(void)
{
    it_teardown();
    ck_assert_int_eq(exs__params_set("fault_connect_nth", "0"), 0);
    ck_assert_int_eq(exs__params_set("fault_connect_sync", "0"), 0);
    ck_assert_int_eq(exs__params_set("emu_blackhole", "0"), 0);
}

/* Fallback counters since fb_init (they are process-wide). */
static const char *const fb_names[] = {"fallback_connects",    "fallback_refused",
                                       "fallback_unreachable", "fallback_timeout",
                                       "fallback_addr",        "fallback_listens"};
static uint64_t fb_base[sizeof(fb_names) / sizeof(fb_names[0])];

static uint64_t fb_count_abs(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("fallback", name, &v), 0);
    return v;
}

static void fb_count_reset(void)
{
    for (size_t i = 0; i < sizeof(fb_names) / sizeof(fb_names[0]); i++)
        fb_base[i] = fb_count_abs(fb_names[i]);
}

static uint64_t fb_count(const char *name)
{
    for (size_t i = 0; i < sizeof(fb_names) / sizeof(fb_names[0]); i++)
        if (strcmp(name, fb_names[i]) == 0)
            return fb_count_abs(name) - fb_base[i];
    ck_abort_msg("no counter %s", name);
    return 0;
}

static uint64_t eng_count(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("engine", name, &v), 0);
    return v;
}

/* The provider fd's connection runs on. */
static const char *fd_provider(int fd)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    const char *name;

    ck_assert_msg(s != NULL, "fd %d: no socket (%d)", fd, err);
    name = s->conn ? exs__prov_name(s->conn->ctx) : "(none)";
    exs__api_sock_put(s);
    return name;
}

/* len bytes of pattern seed from fd a (queue qa) to fd b (queue qb), through buffers
 * registered or not; for SOCK_STREAM the receives are repeated until every byte is in.
 * Every byte verified, the guards intact. */
static void xfer(int a, exs_qhandle_t qa, int b, exs_qhandle_t qb, size_t len, int reg,
                 uint32_t seed)
{
    struct it_buf *s = it_buf_new(len, reg), *r = it_buf_new(len, reg);
    size_t got = 0;
    exs_event_t ev;

    it_fill(s->p, len, seed);
    memset(r->p, 0, len);
    IT_POST_SEND(a, s->p, len, qa, IT_AH(seed), s->mh);
    while (got < len) {
        IT_POST_RECV(b, r->p + got, len - got, qb, IT_AH(seed), r->mh);
        it_wait_event(qb, EXS_EVT_RECV, b, &ev);
        ck_assert_msg(ev.exs_evt_errno == 0, "recv errno %d", ev.exs_evt_errno);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    ck_assert_uint_eq(got, len);
    it_expect_send(qa, a, IT_AH(seed), (ssize_t)len);
    ck_assert_int_eq(it_check(r->p, len, seed), -1);
    ck_assert(it_buf_guards_ok(r));
    it_buf_free(s);
    it_buf_free(r);
}

/* Both directions, small and large, registered and not. */
static void xfer_both_ways(struct it_pair *p, uint32_t seed)
{
    static const size_t lens[] = {1, 3000, 300000};

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        for (int reg = 0; reg < 2; reg++) {
            xfer(p->cfd, p->cq, p->sfd, p->sq, lens[i], reg, seed++);
            xfer(p->sfd, p->sq, p->cfd, p->cq, lens[i], reg, seed++);
        }
}

/* Every connect of the primary fails (injected: refused, then timed out): each socket
 * connects over tcp instead, its EXS_EVT_CONNECT reports success, both ends run on tcp,
 * data flows both ways with every byte verified, and the counters name each reason. A
 * connect the primary does not fail stays on the primary, through the same listener. */
START_TEST(test_fb_connect)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct it_pair p1, p2, p3;

    fb_init("connect", "1");
    ck_assert_ptr_nonnull(exs__engine_fallback_ctx());
    ck_assert_int_eq(exs__engine_fallback_policy(), EXS_ENG_FB_CONNECT);

    it_pair_open(&p1, type, 16, 16); /* 1st injection: rejected */
    ck_assert_str_eq(fd_provider(p1.cfd), "tcp");
    ck_assert_str_eq(fd_provider(p1.sfd), "tcp");
    ck_assert_uint_eq(fb_count("fallback_connects"), 1);
    ck_assert_uint_eq(fb_count("fallback_refused"), 1);
    ck_assert_uint_eq(fb_count("fallback_timeout"), 0);
    ck_assert_uint_ge(fb_count("fallback_listens"), 1);
    xfer_both_ways(&p1, 100);

    it_pair_open(&p2, type, 16, 16); /* 2nd injection: unreachable, timed out */
    ck_assert_str_eq(fd_provider(p2.cfd), "tcp");
    ck_assert_str_eq(fd_provider(p2.sfd), "tcp");
    ck_assert_uint_eq(fb_count("fallback_connects"), 2);
    ck_assert_uint_eq(fb_count("fallback_refused"), 1);
    ck_assert_uint_eq(fb_count("fallback_timeout"), 1);
    xfer_both_ways(&p2, 200);

    ck_assert_int_eq(exs__params_set("fault_connect_nth", "0"), 0);
    it_pair_open(&p3, type, 16, 16); /* no injection: the primary connects */
    ck_assert_str_eq(fd_provider(p3.cfd), fb_prov);
    ck_assert_str_eq(fd_provider(p3.sfd), fb_prov);
    ck_assert_uint_eq(fb_count("fallback_connects"), 2);
    xfer_both_ways(&p3, 300);
    /* the fallback connections still carry data beside it */
    xfer_both_ways(&p1, 400);

    it_pair_close(&p1);
    it_pair_close(&p2);
    it_pair_close(&p3);
}
END_TEST

/* The primary's connect call itself fails (the fault provider refusing at post time,
 * EXS_FAULT_CONNECT_SYNC): exs_connect does not fail but retries over tcp as for a failure
 * reported later, asynchronously (_i 0: it returns 0, EXS_EVT_CONNECT reports success)
 * and synchronously (_i 1: it returns 0 once connected over tcp); the reason is counted
 * as refused and data flows both ways with every byte verified. */
START_TEST(test_fb_connect_call_fails)
{
    struct it_pair p;
    exs_event_t ev;
    int rc;

    fb_init("connect", "1");
    ck_assert_int_eq(exs__params_set("fault_connect_sync", "1"), 0);
    if (_i == 0) {
        it_pair_open(&p, SOCK_STREAM, 16, 16);
    } else {
        memset(&p, 0, sizeof(p));
        p.type = SOCK_STREAM;
        p.sq = it_qcreate(16);
        p.cq = it_qcreate(16);
        p.lfd = it_listen(SOCK_STREAM, &p.addr);
        ck_assert_int_eq(exs_accept(p.lfd, p.sq, IT_AH(0xACC)), 0);
        p.cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(p.cfd, 0);
        errno = 0;
        rc = exs_connect(p.cfd, (struct sockaddr *)&p.addr, sizeof(p.addr), EXS_QHANDLE_INVALID,
                         NULL);
        ck_assert_msg(rc == 0, "synchronous exs_connect = %d errno %d (%s)", rc, errno,
                      strerror(errno));
        it_expect_err_at(p.sq, EXS_EVT_ACCEPT, p.lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
        p.sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
        ck_assert_int_ge(p.sfd, 0);
    }
    ck_assert_str_eq(fd_provider(p.cfd), "tcp");
    ck_assert_str_eq(fd_provider(p.sfd), "tcp");
    ck_assert_uint_eq(fb_count("fallback_connects"), 1);
    ck_assert_uint_eq(fb_count("fallback_refused"), 1);
    ck_assert_uint_eq(fb_count("fallback_timeout"), 0);
    xfer_both_ways(&p, 500);
    it_pair_close(&p);
}
END_TEST

/* Policy off (and auto, which is off when the primary is not verbs: here fault:X): no
 * fallback context, and a failed connect reports the primary's own errno. */
START_TEST(test_fb_policy_off)
{
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, fd;

    fb_init(_i ? "auto" : "off", "1");
    ck_assert_ptr_null(exs__engine_fallback_ctx());
    ck_assert_int_eq(exs__engine_fallback_policy(), EXS_ENG_FB_OFF);
    q = it_qcreate(8);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    for (int i = 0; i < 2; i++) {
        fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
        ck_assert_int_ge(fd, 0);
        IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(i)));
        it_wait_event(q, EXS_EVT_CONNECT, fd, &ev);
        /* the fault provider: rejected (1st), then unreachable with ETIMEDOUT (2nd) */
        ck_assert_int_eq(ev.exs_evt_errno, i ? ETIMEDOUT : ECONNREFUSED);
        it_close(fd, q);
    }
    ck_assert_uint_eq(fb_count("fallback_connects"), 0);
    ck_assert_uint_eq(fb_count("fallback_listens"), 0);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* A peer reachable by neither (a multicast address: the kernel refuses TCP to it): the
 * primary's failure (unreachable) is retried once over tcp, and the CONNECT event reports
 * the retry's failure; the socket can connect again, and does, over the fallback. */
START_TEST(test_fb_both_fail)
{
    struct sockaddr_in nowhere = {.sin_family = AF_INET, .sin_port = htons(4000)};
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, fd;

    if (strcmp(fb_inner(), "tcp") != 0) {
        test_skip("test_fb_both_fail", "needs the tcp provider under test (primary fault:tcp)");
        return;
    }
    fb_init("connect", NULL);
    nowhere.sin_addr.s_addr = htonl(0xe0000001); /* 224.0.0.1 */
    q = it_qcreate(8);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(fd, 0);
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&nowhere, sizeof(nowhere), q, IT_AH(1)));
    it_wait_event(q, EXS_EVT_CONNECT, fd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, ENETUNREACH);
    ck_assert_uint_eq(fb_count("fallback_connects"), 1);
    ck_assert_uint_eq(fb_count("fallback_unreachable"), 1);
    /* again, to a listener, with the primary failing by injection */
    ck_assert_int_eq(exs__params_set("fault_connect_nth", "1"), 0);
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_wait_event(q, EXS_EVT_CONNECT, fd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_str_eq(fd_provider(fd), "tcp");
    ck_assert_uint_eq(fb_count("fallback_connects"), 2);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(3)));
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_str_eq(fd_provider(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd), "tcp");
    it_close(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd, q);
    it_close(fd, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* A peer that has only tcp (another process, EXS_PROVIDER=tcp, no fallback) listening
 * on port L: this process, whose primary finds nothing at L - offset, reaches it over
 * tcp at L. The port L - offset is held bound (not listening) by a kernel socket, so the
 * primary's connect is refused for certain. */
START_TEST(test_fb_tcp_only_peer)
{
    struct sockaddr_in addr = {.sin_family = AF_INET};
    int pipefd[2], status, hold = -1, fd;
    exs_qhandle_t q;
    exs_event_t ev;
    pid_t pid = -1;

    if (strcmp(fb_inner(), "tcp") != 0) {
        test_skip("test_fb_tcp_only_peer", "needs the tcp provider under test (primary fault:tcp)");
        return;
    }
    for (int tries = 0; tries < 20 && hold < 0; tries++) {
        struct sockaddr_in h = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

        ck_assert_int_eq(pipe(pipefd), 0);
        pid = fork(); /* before exs_init in this process */
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            char a_fd[16];

            close(pipefd[0]);
            snprintf(a_fd, sizeof(a_fd), "%d", pipefd[1]);
            setenv("EXS_PROVIDER", "tcp", 1);
            setenv("EXS_FALLBACK", "off", 1);
            execl("/proc/self/exe", "exs_integ_test", "--child-accept", a_fd, "1", (char *)NULL);
            _exit(7);
        }
        close(pipefd[1]);
        ck_assert_int_eq(read(pipefd[0], &addr.sin_port, sizeof(addr.sin_port)),
                         (ssize_t)sizeof(addr.sin_port));
        close(pipefd[0]);
        if (ntohs(addr.sin_port) > FB_OFFSET) {
            h.sin_port = htons((uint16_t)(ntohs(addr.sin_port) - FB_OFFSET));
            hold = socket(AF_INET, SOCK_STREAM, 0);
            ck_assert_int_ge(hold, 0);
            if (bind(hold, (struct sockaddr *)&h, sizeof(h)) == 0) {
                addr.sin_port = h.sin_port; /* where this process's primary looks */
                break;
            }
            close(hold);
            hold = -1;
        }
        /* that port is in use: another peer */
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    }
    ck_assert_int_ge(hold, 0);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fb_init("connect", NULL);
    it_context("peer pid %d", (int)pid);
    q = it_qcreate(8);
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(fd, 0);
    IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, NULL));
    it_wait_event(q, EXS_EVT_CONNECT, fd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_str_eq(fd_provider(fd), "tcp");
    ck_assert_uint_eq(fb_count("fallback_connects"), 1);
    ck_assert_uint_eq(fb_count("fallback_refused") + fb_count("fallback_unreachable"), 1);
    it_close(fd, q);
    it_qdelete(q);
    close(hold);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
}
END_TEST

/* With a connection on each context and nothing to do, the process sleeps: a thread
 * waiting in exs_qdequeue for 1 s, and then the progress thread alone for 1 s, run a
 * handful of progress rounds (a busy loop on either context's event fd would run
 * hundreds of thousands). Then the connections still work: the sleepers woke for them. */
START_TEST(test_fb_idle_sleeps)
{
    struct timespec one_s = {1, 0};
    struct it_pair fb, pr;
    uint64_t r0, r1, r2;
    exs_event_t ev;

    it_setenv("EXS_KEEPALIVE_INTV_MS", "0"); /* no timer traffic while idle */
    fb_init("connect", "1");
    it_pair_open(&fb, SOCK_SEQPACKET, 16, 16);
    ck_assert_str_eq(fd_provider(fb.cfd), "tcp");
    ck_assert_int_eq(exs__params_set("fault_connect_nth", "0"), 0);
    it_pair_open(&pr, SOCK_SEQPACKET, 16, 16);
    ck_assert_str_eq(fd_provider(pr.cfd), fb_prov);
    xfer(fb.cfd, fb.cq, fb.sfd, fb.sq, 3000, 1, 1);
    xfer(pr.cfd, pr.cq, pr.sfd, pr.sq, 3000, 1, 2);

    /* the wait sleeps at once: a queue's default wait spins 10 us first (spec/api.md "Wait
     * modes"), hundreds of rounds under qemu's TCG, bounded by the spin, not a busy loop */
    ck_assert_int_eq(exs_qsetwait(fb.cq, EXS_WAIT_NOTIFY, 0), 0);
    r0 = eng_count("rounds");
    ck_assert_int_eq(exs_qdequeue(fb.cq, &ev, 1, &one_s), 0);
    r1 = eng_count("rounds");
    it_sleep_ms(1000); /* no thread in the library: the progress thread alone */
    r2 = eng_count("rounds");
    printf("fb_idle_sleeps: %" PRIu64 " rounds in a 1 s wait, %" PRIu64 " in 1 s without\n",
           r1 - r0, r2 - r1);
    ck_assert_msg(r1 - r0 < 200, "%" PRIu64 " progress rounds during an idle 1 s wait", r1 - r0);
    ck_assert_msg(r2 - r1 < 200, "%" PRIu64 " progress rounds during an idle 1 s", r2 - r1);

    /* a receive waited for on each context, the send posted by the progress thread's
     * turn: the sleepers wake for both contexts */
    xfer(fb.sfd, fb.sq, fb.cfd, fb.cq, 3000, 0, 3);
    xfer(pr.sfd, pr.sq, pr.cfd, pr.cq, 3000, 0, 4);
    it_pair_close(&fb);
    it_pair_close(&pr);
}
END_TEST

/* A message client -> server on p that the progress thread alone must carry: this
 * thread makes no library call until both queues' descriptors (exs_qfd) are readable;
 * then the events are taken and the bytes checked. */
static void xfer_by_progress_thread(struct it_pair *p, size_t len, uint32_t seed)
{
    struct it_buf *a = it_buf_new(len, 1), *b = it_buf_new(len, 1);
    struct pollfd pfd[2] = {{.fd = exs_qfd(p->sq), .events = POLLIN},
                            {.fd = exs_qfd(p->cq), .events = POLLIN}};
    double end;
    int ready = 0;

    ck_assert(pfd[0].fd >= 0 && pfd[1].fd >= 0);
    it_fill(a->p, len, seed);
    /* MSG_WAITALL: a plain stream receive may complete with part of the send (at a
     * fragment, spec/protocol.md §6.2); on SOCK_SEQPACKET the flag changes nothing */
    ck_assert_int_eq(exs_recv(p->sfd, b->p, len, MSG_WAITALL, p->sq, IT_AH(seed), b->mh), 0);
    IT_POST_SEND(p->cfd, a->p, len, p->cq, IT_AH(seed), a->mh);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while (ready != 3 && it_now_ms() < end) {
        pfd[0].revents = pfd[1].revents = 0;
        ck_assert_int_ge(poll(pfd, 2, 100), 0);
        ready |= (pfd[0].revents & POLLIN ? 1 : 0) | (pfd[1].revents & POLLIN ? 2 : 0);
    }
    ck_assert_msg(ready == 3, "on %s, without a waiter: server event %d, client event %d",
                  fd_provider(p->cfd), ready & 1, !!(ready & 2));
    it_expect_recv(p->sq, p->sfd, IT_AH(seed), (ssize_t)len, 0);
    it_expect_send(p->cq, p->cfd, IT_AH(seed), (ssize_t)len);
    ck_assert_int_eq(it_check(b->p, len, seed), -1);
    it_buf_free(a);
    it_buf_free(b);
}

/* While the application waits for nothing (computes), the progress thread moves the
 * data of both contexts over a link with a delay: it watches both event descriptors. */
START_TEST(test_fb_progress_thread)
{
    struct it_pair fb, pr;

    /* frames arrive well after the posts, while every thread sleeps */
    it_setenv("EXS_EMU_DELAY_US", "20000");
    it_setenv("EXS_KEEPALIVE_INTV_MS", "0"); /* no timer wakes the progress thread */
    fb_init("connect", "1");
    it_pair_open(&fb, SOCK_STREAM, 16, 16);
    ck_assert_str_eq(fd_provider(fb.cfd), "tcp");
    ck_assert_int_eq(exs__params_set("fault_connect_nth", "0"), 0);
    it_pair_open(&pr, SOCK_STREAM, 16, 16);
    ck_assert_str_eq(fd_provider(pr.cfd), fb_prov);
    for (uint32_t i = 0; i < 4; i++) {
        it_context("round %u", i);
        /* a lease without a driver first: the progress thread takes the providers back */
        it_sleep_ms(20);
        xfer_by_progress_thread(&fb, 100000, 10 + i);
        it_sleep_ms(20);
        xfer_by_progress_thread(&pr, 100000, 20 + i);
    }
    it_pair_close(&fb);
    it_pair_close(&pr);
}
END_TEST

/* A fallback connection whose link goes silent is found dead by keepalive: the pending
 * receive ends with ETIMEDOUT, and closing it releases everything (the teardown's live
 * check; ASan for the provider's objects). */
START_TEST(test_fb_keepalive_release)
{
    struct it_pair p;
    char buf[64];

    it_setenv("EXS_KEEPALIVE_INTV_MS", "200");
    it_setenv("EXS_KEEPALIVE_PROBES", "3");
    fb_init("connect", "1");
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    ck_assert_str_eq(fd_provider(p.cfd), "tcp");
    xfer(p.cfd, p.cq, p.sfd, p.sq, 3000, 1, 7);
    IT_POST_RECV(p.cfd, buf, sizeof(buf), p.cq, IT_AH(1), EXS_MHANDLE_UNREGISTERED);
    ck_assert_int_eq(exs__params_set("emu_blackhole", "1"), 0);
    it_expect_err(p.cq, EXS_EVT_RECV, p.cfd, IT_AH(1), ETIMEDOUT);
    ck_assert_int_eq(exs__params_set("emu_blackhole", "0"), 0);
    it_pair_close(&p);
}
END_TEST

/* exs_fini with fallback connections open and operations pending releases them (no
 * live object; ASan for the provider's), and a new exs_init falls back again. */
START_TEST(test_fb_fini_open)
{
    struct sockaddr_in addr;
    exs_qhandle_t q;
    exs_event_t evs[2];
    char buf[64];
    int lfd, fd;

    for (int round = 0; round < 2; round++) {
        it_context("round %d", round);
        if (round == 0) {
            fb_init("connect", "1");
        } else {
            ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION); /* the same environment */
            fb_count_reset();
        }
        ck_assert_ptr_nonnull(exs__engine_fallback_ctx());
        q = exs_qcreate(16); /* not tracked: exs_fini frees it */
        ck_assert_int_ne(q, EXS_QHANDLE_INVALID);
        lfd = it_listen(SOCK_STREAM, &addr);
        fd = exs_socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(fd, 0);
        IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
        IT_EXPECT_OK(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
        /* both events (the queue is not the helpers': they cannot wait on it) */
        ck_assert_int_eq(exs_qdequeue(q, evs, -2, &(struct timespec){IT_TIMEOUT_MS / 1000, 0}), 2);
        for (int i = 0; i < 2; i++) {
            ck_assert_int_eq(evs[i].exs_evt_errno, 0);
            if (evs[i].exs_evt_type == EXS_EVT_ACCEPT)
                ck_assert_str_eq(fd_provider(evs[i].exs_evt_u.exs_evt_accept.exs_evt_newfd), "tcp");
            else
                ck_assert_int_eq(evs[i].exs_evt_type, EXS_EVT_CONNECT);
        }
        ck_assert_str_eq(fd_provider(fd), "tcp");
        ck_assert_uint_eq(fb_count("fallback_connects"), 1);
        IT_POST_RECV(fd, buf, sizeof(buf), q, IT_AH(3), EXS_MHANDLE_UNREGISTERED);
        exs_fini();
        ck_assert_int_eq(exs__debug_live_objects(), 0);
    }
    /* the teardown's exs_fini needs an initialized library */
    ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION);
}
END_TEST

/* A busy wait (EXS_WAIT_POLL) of a process with a fallback context leaves that context
 * for every 16th round while it has been idle (it cost three locks at every turn of a
 * verbs busy wait), then for longer, up to every EXS_ENG_FB_EVERY_MAX-th, and a connection over it
 * still carries data both ways in busy waits, every byte verified, and wakes its context back into
 * every round. */
/* A pair over the fallback context (refused on the primary), both queues waiting as mode. */
static void fb_pair_waiting(struct it_pair *p, int mode)
{
    fb_init("connect", "1");
    ck_assert_ptr_nonnull(exs__engine_fallback_ctx());
    it_pair_open(p, SOCK_SEQPACKET, 16, 16);
    ck_assert_str_eq(fd_provider(p->cfd), "tcp");
    ck_assert_int_eq(exs_qsetwait(p->cq, mode, 0), 0);
    ck_assert_int_eq(exs_qsetwait(p->sq, mode, 0), 0);
}

START_TEST(test_fb_busy_skips_idle)
{
    struct it_pair p1;
    exs_event_t ev;
    uint64_t s0, s1;

    fb_pair_waiting(&p1, EXS_WAIT_POLL);
    s0 = eng_count("fb_skips");
    ck_assert_int_eq(exs_qdequeue(p1.cq, &ev, 1, &(struct timespec){0, 100 * 1000 * 1000}), 0);
    s1 = eng_count("fb_skips");
    ck_assert_msg(s1 > s0, "a 100 ms busy wait polled the idle fallback context at every round");
    /* each idle look doubled the interval: by now it is the longest */
    ck_assert_uint_eq(exs__engine_fb_every(), EXS_ENG_FB_EVERY_MAX);
    xfer_both_ways(&p1, 500);
    it_pair_close(&p1);
}
END_TEST

/* A waiter that sleeps (EXS_WAIT_NOTIFY) with nothing pending runs no progress round
 * before it sleeps: its arm is the first look at every context (-EAGAIN, with one round
 * in the same hold of the progress lock, when one has work), so the idle fallback costs
 * it nothing; and connections over the fallback still move: a readable fallback wakes
 * the sleeper, whose drive looks at it. (With a drive before each arm, as before, each
 * of these waits ran a round: 400 or more.) */
START_TEST(test_fb_wait_skips_idle)
{
    struct it_pair p1;
    exs_event_t ev;
    uint64_t r0, r1;

    fb_pair_waiting(&p1, EXS_WAIT_NOTIFY);
    r0 = eng_count("rounds");
    for (int i = 0; i < 400; i++)
        ck_assert_int_eq(exs_qdequeue(p1.cq, &ev, 1, &(struct timespec){0, 1000 * 1000}), 0);
    r1 = eng_count("rounds");
    printf("fb_wait_skips_idle: %" PRIu64 " progress rounds in 400 idle sleeping waits\n", r1 - r0);
    /* the progress thread may take a round when a gap between two waits outlasts the
     * hysteresis (a loaded host): far fewer than one per wait */
    ck_assert_msg(r1 - r0 < 200, "%" PRIu64 " progress rounds in 400 idle sleeping waits", r1 - r0);
    xfer_both_ways(&p1, 500);
    it_pair_close(&p1);
}
END_TEST

Suite *integ_fallback_suite(void)
{
    Suite *s = suite_create("integ_fallback");
    TCase *tc;

    tc = it_tcase("connect", IT_CASE_TIMEOUT);
    tcase_add_checked_fixture(tc, NULL, fb_teardown);
    tcase_add_loop_test(tc, test_fb_connect, 0, 2);
    tcase_add_loop_test(tc, test_fb_connect_call_fails, 0, 2);
    tcase_add_loop_test(tc, test_fb_policy_off, 0, 2);
    tcase_add_test(tc, test_fb_both_fail);
    tcase_add_test(tc, test_fb_tcp_only_peer);
    suite_add_tcase(s, tc);
    tc = it_tcase("lifetime", IT_CASE_TIMEOUT);
    tcase_add_checked_fixture(tc, NULL, fb_teardown);
    tcase_add_test(tc, test_fb_idle_sleeps);
    tcase_add_test(tc, test_fb_progress_thread);
    tcase_add_test(tc, test_fb_keepalive_release);
    tcase_add_test(tc, test_fb_fini_open);
    tcase_add_test(tc, test_fb_busy_skips_idle);
    tcase_add_test(tc, test_fb_wait_skips_idle);
    suite_add_tcase(s, tc);
    return s;
}
