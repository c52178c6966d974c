/* SPDX-License-Identifier: MIT */
/* UNH EXS sources compile (issue 27): every name of UNH's API that <sys/exs.h> gained is
 * used here, the supported ones work, the others fail with the errno spec/api.md ("UNH EXS
 * names") documents. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* The queue attributes: depth, events, wait mode, signal. */
START_TEST(test_unh_qattr)
{
    exs_signal_t sig = {.exs_sig_state = EXS_SIG_ENABLE, .exs_sig_signo = SIGUSR1};
    socklen_t len = sizeof(int);
    int a, b, v = 0;
    exs_qhandle_t q;
    exs_event_t ev;

    it_init();
    q = it_qcreate(16);
    IT_EXPECT_OK(exs_qgetattr(q, EXS_QATTR_DEPTH, &v, &len));
    ck_assert_int_eq(v, 16);
    ck_assert_int_eq(len, sizeof(int));
    v = 32;
    IT_EXPECT_FAIL(exs_qsetattr(q, EXS_QATTR_DEPTH, &v, sizeof(v)), EOPNOTSUPP);
    /* events queued now */
    it_tcp_pair(&a, &b, 0, 0);
    IT_POST_SEND(a, "abc", 3, q, AH(1), EXS_MHANDLE_UNREGISTERED);
    len = sizeof(int);
    IT_EXPECT_OK(exs_qgetattr(q, EXS_QATTR_EVENTS, &v, &len));
    ck_assert_int_eq(v, 1); /* a send a kernel socket takes at once has its event */
    IT_EXPECT_FAIL(exs_qsetattr(q, EXS_QATTR_EVENTS, &v, sizeof(v)), EINVAL);
    /* busy polling */
    v = EXS_WAIT_BUSY_POLL;
    IT_EXPECT_OK(exs_qsetattr(q, EXS_QATTR_WAIT, &v, sizeof(v)));
    v = -1;
    len = sizeof(int);
    IT_EXPECT_OK(exs_qgetattr(q, EXS_QATTR_WAIT, &v, &len));
    ck_assert_int_eq(v, EXS_WAIT_BUSY_POLL);
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, NULL), 1);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
    len = sizeof(int);
    IT_EXPECT_OK(exs_qgetattr(q, EXS_QATTR_EVENTS, &v, &len));
    ck_assert_int_eq(v, 0);
    v = 99;
    IT_EXPECT_FAIL(exs_qsetattr(q, EXS_QATTR_WAIT, &v, sizeof(v)), EINVAL);
    /* no signal notification */
    IT_EXPECT_FAIL(exs_qsetattr(q, EXS_QATTR_SIGNAL, &sig, sizeof(sig)), EOPNOTSUPP);
    sig.exs_sig_state = EXS_SIG_DISABLE;
    IT_EXPECT_OK(exs_qsetattr(q, EXS_QATTR_SIGNAL, &sig, sizeof(sig)));
    sig.exs_sig_state = -1;
    len = sizeof(sig);
    IT_EXPECT_OK(exs_qgetattr(q, EXS_QATTR_SIGNAL, &sig, &len));
    ck_assert_int_eq(sig.exs_sig_state, EXS_SIG_DISABLE);
    len = 1;
    IT_EXPECT_FAIL(exs_qgetattr(q, EXS_QATTR_DEPTH, &v, &len), EINVAL);
    IT_EXPECT_FAIL(exs_qgetattr(q, 0x7777, &v, &len), EINVAL);
    IT_EXPECT_FAIL(exs_qgetattr(EXS_QHANDLE_INVALID, EXS_QATTR_DEPTH, &v, &len), EINVAL);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* EXS_MRF_SHARED, EXS_POLLIN / EXS_POLLOUT, EXS_SHUT_WR, exs_acceptaddr_t and AF_IB. */
START_TEST(test_unh_calls)
{
    static char buf[4096];
    struct it_pair p;
    exs_acceptaddr_t peer;
    exs_pollfd_t pfd[2];
    exs_mhandle_t mh;
    exs_event_t ev;
    char got[8];

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    mh = exs_mregister(buf, sizeof(buf), EXS_MRF_SHARED);
    ck_assert_int_ne(mh, EXS_MHANDLE_INVALID);
    ck_assert_int_eq(exs_mregister(buf, sizeof(buf), 0x40), EXS_MHANDLE_INVALID);
    memcpy(buf, "shared", 6);
    IT_POST_SEND(p.cfd, buf, 6, p.cq, AH(1), mh);
    it_expect_send(p.cq, p.cfd, AH(1), 6);
    /* readiness with UNH's poll names: poll returns once either is ready, and the send
     * space of cfd may come back after the message reached sfd, so each is asked until
     * it is seen */
    double t0 = it_now_ms();

    for (int seen = 0; seen != 3;) {
        int n = 0, k;

        ck_assert_msg(it_now_ms() < t0 + IT_TIMEOUT_MS, "not both ready in time: seen %d", seen);
        if (!(seen & 1))
            pfd[n++] = (exs_pollfd_t){.fd = p.sfd, .events = EXS_POLLIN};
        if (!(seen & 2))
            pfd[n++] = (exs_pollfd_t){.fd = p.cfd, .events = EXS_POLLOUT};
        k = exs_poll(pfd, n, IT_TIMEOUT_MS, EXS_QHANDLE_INVALID, NULL);
        ck_assert_msg(k >= 0 && k <= n, "exs_poll: %d (errno %d), seen %d", k, errno, seen);
        for (int i = 0; i < n; i++) {
            ck_assert_msg(pfd[i].revents == 0 || pfd[i].revents == pfd[i].events,
                          "fd %d revents %#x", pfd[i].fd, (unsigned)pfd[i].revents);
            if (pfd[i].revents)
                seen |= pfd[i].fd == p.sfd ? 1 : 2;
        }
    }
    IT_POST_RECV(p.sfd, got, sizeof(got), p.sq, AH(2), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.sq, p.sfd, AH(2), 6, 0);
    ck_assert_int_eq(memcmp(got, "shared", 6), 0);
    /* the accepted peer's address */
    peer.exs_addrlen = sizeof(peer.exs_addr);
    IT_EXPECT_OK(exs_getpeername(p.sfd, (struct sockaddr *)&peer.exs_addr, &peer.exs_addrlen));
    ck_assert_int_eq(peer.exs_addr.ss_family, AF_INET);
    ck_assert_int_eq(peer.exs_addrlen, sizeof(struct sockaddr_in));
    /* the end of the sending side */
    ck_assert_int_eq(exs_shutdown(p.cfd, EXS_SHUT_WR, p.cq, AH(3)), 0);
    it_wait_event(p.cq, EXS_EVT_SHUTDOWN, p.cfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    IT_POST_RECV(p.sfd, got, sizeof(got), p.sq, AH(4), EXS_MHANDLE_UNREGISTERED);
    it_expect_recv(p.sq, p.sfd, AH(4), 0, 0);
    IT_EXPECT_OK(exs_mderegister(mh));
    it_pair_close(&p);
    /* InfiniBand native addresses: not this library's */
    IT_EXPECT_FAIL(exs_socket(AF_IB, SOCK_STREAM, 0), EAFNOSUPPORT);
}
END_TEST

/* exs_cancel by ahandle (EXS_CAF_AHANDLE) and by descriptor (EXS_CAF_FILDES) on a kernel
 * socket; on an exs socket the flags are taken alike (its advertised receives cannot be
 * cancelled: exs_cancel(3)). */
START_TEST(test_unh_cancel)
{
    char r1[4], r2[4], r3[4];
    struct it_pair p;
    exs_qhandle_t q;
    int a, b;

    it_init();
    q = it_qcreate(16);
    it_tcp_pair(&a, &b, 0, 0);
    IT_POST_RECV(b, r1, sizeof(r1), q, AH(1), EXS_MHANDLE_UNREGISTERED);
    IT_POST_RECV(b, r2, sizeof(r2), q, AH(2), EXS_MHANDLE_UNREGISTERED);
    IT_POST_RECV(b, r3, sizeof(r3), q, AH(3), EXS_MHANDLE_UNREGISTERED);
    IT_EXPECT_FAIL(exs_cancel(b, AH(2), EXS_CAF_AHANDLE | EXS_CAF_FILDES), EINVAL);
    IT_EXPECT_OK(exs_cancel(b, AH(2), EXS_CAF_AHANDLE));
    it_expect_err(q, EXS_EVT_RECV, b, AH(2), ECANCELED);
    IT_EXPECT_OK(exs_cancel(b, NULL, EXS_CAF_FILDES));
    it_expect_err(q, EXS_EVT_RECV, b, AH(1), ECANCELED);
    it_expect_err(q, EXS_EVT_RECV, b, AH(3), ECANCELED);
    it_expect_no_event(q, 20);
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    IT_EXPECT_FAIL(exs_cancel(p.sfd, AH(2), EXS_CAF_AHANDLE | EXS_CAF_FILDES), EINVAL);
    IT_EXPECT_OK(exs_cancel(p.sfd, AH(2), EXS_CAF_AHANDLE));
    IT_EXPECT_OK(exs_cancel(p.sfd, NULL, EXS_CAF_FILDES));
    IT_EXPECT_OK(exs_cancel(-1, AH(9), EXS_CAF_AHANDLE)); /* exs_poll requests: none */
    it_pair_close(&p);
    close(a);
    close(b);
    it_kfd_settle(q);
    it_qdelete(q);
}
END_TEST

/* The transfer-vector types: they compile and keep their pieces. */
START_TEST(test_unh_types)
{
    static char mem[16];
    exs_xferfile_t vec[2] = {
        {.xf_type = EXS_IOVEC,
         .xf_u.xf_iov = {.iov_base = mem,
                         .iov_len = sizeof(mem),
                         .iov_mh = EXS_MHANDLE_UNREGISTERED}},
        {.xf_type = EXS_FDVEC, .xf_u.xf_fdv = {.fdv_fd = 0, .fdv_offset = 512, .fdv_len = 100}},
    };
    exs_evt_xferfile_t done = {.exs_evt_vec = vec, .exs_evt_veclen = 2, .exs_evt_result = 116};
    exs_fdvec_t fdv = vec[1].xf_u.xf_fdv;

    ck_assert_int_ne(EXS_IOVEC, EXS_FDVEC);
    ck_assert_int_ne(EXS_SIG_ENABLE, EXS_SIG_DISABLE);
    ck_assert_int_eq(EXS_SHUT_WR, SHUT_WR);
    ck_assert_int_ne(EXS_CAF_AHANDLE, EXS_CAF_FILDES);
    ck_assert_int_eq(fdv.fdv_offset, 512);
    ck_assert_uint_eq(done.exs_evt_veclen, 2);
    ck_assert_uint_eq(done.exs_evt_vec[0].xf_u.xf_iov.iov_len + fdv.fdv_len,
                      (size_t)done.exs_evt_result);
}
END_TEST

Suite *integ_unh_suite(void)
{
    Suite *s = suite_create("integ_unh");

    it_suite_add(s, "unh", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_unh_qattr, test_unh_calls, test_unh_cancel,
                                        test_unh_types, NULL});
    return s;
}
