/* SPDX-License-Identifier: MIT */
/* Synchronous ES-API calls (q == EXS_QHANDLE_INVALID): a whole exchange with the server in a
 * thread, half close, refused connect. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <time.h>
#include <unistd.h>

#include "tests/integ/integ.h"

#define SYNC_Q EXS_QHANDLE_INVALID
#define AH(n)  IT_AH(n)
#define BUFCAP (1u << 20)

/* The server thread: accept, echo every message until end of stream, close. It records
 * the first failure as text; the main thread asserts on it. */
struct echo_srv {
    pthread_t th;
    int lfd;
    int reg;    /* use a registered buffer */
    int rounds; /* messages echoed */
    int done;
    char err[256];
};

static void *echo_main(void *arg)
{
    struct echo_srv *s = arg;
    uint8_t *buf = malloc(BUFCAP);
    exs_mhandle_t mh = EXS_MHANDLE_UNREGISTERED;
    int nfd = -1;

    if (!buf) {
        snprintf(s->err, sizeof(s->err), "malloc failed");
        goto out;
    }
    if (s->reg) {
        mh = exs_mregister(buf, BUFCAP, 0);
        if (mh == EXS_MHANDLE_INVALID) {
            snprintf(s->err, sizeof(s->err), "server exs_mregister: errno %d", errno);
            goto out;
        }
    }
    errno = 0;
    nfd = exs_accept(s->lfd, SYNC_Q, AH(1));
    if (nfd < 0) {
        snprintf(s->err, sizeof(s->err), "sync exs_accept = %d errno %d (%s)", nfd, errno,
                 strerror(errno));
        goto out;
    }
    if (nfd == s->lfd) {
        snprintf(s->err, sizeof(s->err), "sync exs_accept returned the listener %d", nfd);
        goto out;
    }
    for (;;) {
        ssize_t n, m;

        errno = 0;
        n = exs_recv(nfd, buf, BUFCAP, 0, SYNC_Q, AH(2), mh);
        if (n == 0)
            break; /* end of stream */
        if (n < 0) {
            snprintf(s->err, sizeof(s->err), "server sync exs_recv #%d = %zd errno %d (%s)",
                     s->rounds, n, errno, strerror(errno));
            goto out;
        }
        errno = 0;
        m = exs_send(nfd, buf, (size_t)n, 0, SYNC_Q, AH(3), mh);
        if (m != n) {
            snprintf(s->err, sizeof(s->err),
                     "server sync exs_send #%d of %zd bytes = %zd errno %d (%s)", s->rounds, n, m,
                     errno, strerror(errno));
            goto out;
        }
        s->rounds++;
    }
    errno = 0;
    if (exs_close(nfd, SYNC_Q, AH(4)) != 0)
        snprintf(s->err, sizeof(s->err), "server sync exs_close: errno %d (%s)", errno,
                 strerror(errno));
    nfd = -1;
out:
    if (nfd >= 0)
        exs_close(nfd, SYNC_Q, AH(4));
    if (mh != EXS_MHANDLE_UNREGISTERED && mh != EXS_MHANDLE_INVALID) {
        if (exs_mderegister(mh) != 0 && !s->err[0])
            snprintf(s->err, sizeof(s->err), "server exs_mderegister: errno %d", errno);
    }
    free(buf);
    __atomic_store_n(&s->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void echo_join(struct echo_srv *s, int seconds)
{
    struct timespec dl;
    int rc;

    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += seconds;
    rc = pthread_timedjoin_np(s->th, NULL, &dl);
    ck_assert_msg(rc == 0, "server thread did not finish within %d s (rounds %d)", seconds,
                  s->rounds);
    ck_assert_msg(s->err[0] == 0, "server thread: %s", s->err);
}

/* connect, send, recv, close, all synchronous, against a synchronous echo server. */
static void sync_exchange(int reg)
{
    static const size_t sizes[] = {1, 64, 3000, 4095, 4096, 5000, 100000, 1u << 20};
    struct echo_srv srv = {.reg = reg};
    struct sockaddr_in addr;
    struct it_buf *sb, *rb;
    int cfd;

    it_init();
    srv.lfd = it_listen(SOCK_SEQPACKET, &addr);
    sb = it_buf_new(BUFCAP, reg);
    rb = it_buf_new(BUFCAP, reg);
    ck_assert_int_eq(pthread_create(&srv.th, NULL, echo_main, &srv), 0);
    it_watchdog_start(50, "a synchronous call of the exchange");

    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(cfd, 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), SYNC_Q, AH(10)));
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];
        ssize_t n;
        long bad;

        it_fill(sb->p, len, 0x51C0u + (uint32_t)i);
        memset(rb->p, IT_GUARD_BYTE, BUFCAP);
        errno = 0;
        n = exs_send(cfd, sb->p, len, 0, SYNC_Q, AH(11), sb->mh);
        ck_assert_msg(n == (ssize_t)len, "sync exs_send(%zu) = %zd errno %d (%s)", len, n, errno,
                      strerror(errno));
        errno = 0;
        n = exs_recv(cfd, rb->p, BUFCAP, 0, SYNC_Q, AH(12), rb->mh);
        ck_assert_msg(n == (ssize_t)len, "sync exs_recv of the %zu-byte echo = %zd errno %d (%s)",
                      len, n, errno, strerror(errno));
        bad = it_check(rb->p, len, 0x51C0u + (uint32_t)i);
        ck_assert_msg(bad < 0, "echo of %zu bytes: wrong byte at %ld", len, bad);
        ck_assert(it_all_bytes(rb->p + len, BUFCAP - len, IT_GUARD_BYTE));
    }
    IT_EXPECT_OK(exs_close(cfd, SYNC_Q, AH(13)));
    echo_join(&srv, 20);
    it_watchdog_stop();
    ck_assert_int_eq(srv.rounds, (int)(sizeof(sizes) / sizeof(sizes[0])));
    IT_EXPECT_OK(exs_close(srv.lfd, SYNC_Q, AH(14)));
}

START_TEST(test_sync_exchange_registered)
{
    sync_exchange(1);
}
END_TEST

START_TEST(test_sync_exchange_unregistered)
{
    sync_exchange(0);
}
END_TEST

/* Synchronous shutdown: the server's synchronous receive returns 0, its reply still
 * reaches the client. */
struct half_srv {
    pthread_t th;
    int lfd;
    int done;
    char err[256];
};

static void *half_main(void *arg)
{
    struct half_srv *s = arg;
    char buf[64];
    ssize_t n;
    int nfd;

    nfd = exs_accept(s->lfd, SYNC_Q, AH(1));
    if (nfd < 0) {
        snprintf(s->err, sizeof(s->err), "sync exs_accept errno %d (%s)", errno, strerror(errno));
        return NULL;
    }
    n = exs_recv(nfd, buf, sizeof(buf), 0, SYNC_Q, AH(2), EXS_MHANDLE_UNREGISTERED);
    if (n != 5 || memcmp(buf, "hello", 5) != 0) {
        snprintf(s->err, sizeof(s->err), "server recv #1 = %zd errno %d", n, errno);
        goto out;
    }
    n = exs_recv(nfd, buf, sizeof(buf), 0, SYNC_Q, AH(3), EXS_MHANDLE_UNREGISTERED);
    if (n != 0) {
        snprintf(s->err, sizeof(s->err),
                 "server recv after the client's SHUT_WR = %zd errno %d (%s), expected 0", n, errno,
                 strerror(errno));
        goto out;
    }
    n = exs_send(nfd, "bye", 3, 0, SYNC_Q, AH(4), EXS_MHANDLE_UNREGISTERED);
    if (n != 3)
        snprintf(s->err, sizeof(s->err), "server send after the client's SHUT_WR = %zd errno %d", n,
                 errno);
out:
    if (exs_close(nfd, SYNC_Q, AH(5)) != 0 && !s->err[0])
        snprintf(s->err, sizeof(s->err), "server sync exs_close errno %d", errno);
    return NULL;
}

START_TEST(test_sync_shutdown)
{
    struct half_srv srv = {0};
    struct sockaddr_in addr;
    struct timespec dl;
    char buf[64];
    ssize_t n;
    int cfd;

    it_init();
    srv.lfd = it_listen(SOCK_SEQPACKET, &addr);
    ck_assert_int_eq(pthread_create(&srv.th, NULL, half_main, &srv), 0);
    it_watchdog_start(30, "a synchronous call of the half-close exchange");
    cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(cfd, 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), SYNC_Q, AH(10)));
    n = exs_send(cfd, "hello", 5, 0, SYNC_Q, AH(11), EXS_MHANDLE_UNREGISTERED);
    ck_assert_msg(n == 5, "sync send = %zd errno %d", n, errno);
    IT_EXPECT_OK(exs_shutdown(cfd, SHUT_WR, SYNC_Q, AH(12)));
    n = exs_recv(cfd, buf, sizeof(buf), 0, SYNC_Q, AH(13), EXS_MHANDLE_UNREGISTERED);
    ck_assert_msg(n == 3 && memcmp(buf, "bye", 3) == 0, "client recv after SHUT_WR = %zd errno %d",
                  n, errno);
    n = exs_recv(cfd, buf, sizeof(buf), 0, SYNC_Q, AH(14), EXS_MHANDLE_UNREGISTERED);
    ck_assert_msg(n == 0, "client recv after the server closed = %zd errno %d (%s), expected 0", n,
                  errno, strerror(errno));
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    ck_assert_int_eq(pthread_timedjoin_np(srv.th, NULL, &dl), 0);
    ck_assert_msg(srv.err[0] == 0, "server thread: %s", srv.err);
    IT_EXPECT_OK(exs_close(cfd, SYNC_Q, AH(15)));
    IT_EXPECT_OK(exs_close(srv.lfd, SYNC_Q, AH(16)));
    it_watchdog_stop();
}
END_TEST

/* A synchronous connect to a port with no listener fails with ECONNREFUSED. */
START_TEST(test_sync_refused)
{
    struct sockaddr_in addr;
    int holder, fd;

    it_init();
    it_refusing_addr(&addr, &holder);
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(fd, 0);
    it_watchdog_start(20, "synchronous exs_connect to a refusing port");
    IT_EXPECT_FAIL(exs_connect(fd, (struct sockaddr *)&addr, sizeof(addr), SYNC_Q, AH(1)),
                   ECONNREFUSED);
    it_watchdog_stop();
    IT_EXPECT_OK(exs_close(fd, SYNC_Q, AH(2)));
    close(holder);
}
END_TEST

Suite *integ_sync_suite(void)
{
    Suite *s = suite_create("integ_sync");
    TCase *tc;

    tc = it_tcase("exchange", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_sync_exchange_registered);
    tcase_add_test(tc, test_sync_exchange_unregistered);
    tcase_add_test(tc, test_sync_shutdown);
    suite_add_tcase(s, tc);
    tc = it_tcase("refused", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_sync_refused);
    suite_add_tcase(s, tc);
    return s;
}
