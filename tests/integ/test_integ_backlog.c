/* SPDX-License-Identifier: MIT */
/* A listener's backlog as on Linux (issue 24, finding 7; spec/api.md, exs_listen): a request
 * over a full backlog waits for room instead of being refused, is refused after half of
 * connect_timeout_ms when no room comes, and is refused when the listener closes. */
#include <check.h>
#include <errno.h>
#include <string.h>
#include <sys/exs.h>

#include "exs/util/counters.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#define AH(n) IT_AH(n)

/* A listener counter (counter set "engine"); fails the test when it does not exist. */
static uint64_t bl_count(const char *name)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup("engine", name, &v) == 0, "no engine counter %s", name);
    return v;
}

/* Wait (bounded) until counter name reaches want. */
static void bl_wait_count(const char *name, uint64_t want)
{
    double t0 = it_now_ms();
    uint64_t v;

    while ((v = bl_count(name)) < want && it_now_ms() - t0 < IT_TIMEOUT_MS)
        it_sleep_ms(1);
    ck_assert_msg(v >= want, "counter %s is %llu after %d ms, expected %llu", name,
                  (unsigned long long)v, IT_TIMEOUT_MS, (unsigned long long)want);
}

/* A SEQPACKET client socket whose connect to addr is posted on q with ahandle ah. */
static int bl_connect(const struct sockaddr_in *addr, exs_qhandle_t q, long ah)
{
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);

    ck_assert_int_ge(fd, 0);
    IT_EXPECT_OK(exs_connect(fd, (const struct sockaddr *)addr, sizeof(*addr), q, AH(ah)));
    return fd;
}

/* The opening of every case: a listener with backlog 1 and one client connected and
 * established but not accepted, which fills it; then n clients whose requests wait (the
 * counter of deferred requests says they arrived). *deferred0: that counter before. */
static int bl_open(exs_qhandle_t q, struct sockaddr_in *addr, int *first, int *waiting, int n,
                   uint64_t *deferred0)
{
    exs_event_t ev;
    int lfd = it_listen(SOCK_SEQPACKET, addr);

    IT_EXPECT_OK(exs_listen(lfd, 1)); /* a listener only changes its backlog */
    *deferred0 = bl_count("listen_deferred");
    *first = bl_connect(addr, q, 1);
    it_wait_event(q, EXS_EVT_CONNECT, *first, &ev);
    ck_assert_msg(ev.exs_evt_errno == 0, "first connect: %s", strerror(ev.exs_evt_errno));
    for (int i = 0; i < n; i++)
        waiting[i] = bl_connect(addr, q, 10 + i);
    bl_wait_count("listen_deferred", *deferred0 + (uint64_t)n);
    return lfd;
}

/* Take one connection off lfd (an accept event with no error); returns its descriptor. */
static int bl_accept(int lfd, exs_qhandle_t q, long ah)
{
    exs_event_t ev;

    IT_EXPECT_OK(exs_accept(lfd, q, AH(ah)));
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    ck_assert_msg(ev.exs_evt_errno == 0, "accept: %s", strerror(ev.exs_evt_errno));
    ck_assert_int_ge(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd, 0);
    return ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
}

/* A request over the backlog waits (no connect event while the backlog is full) and is
 * established once an accept takes the connection that fills the backlog; the old code
 * refused it at once (ECONNREFUSED). */
START_TEST(test_backlog_waits)
{
    struct sockaddr_in addr;
    exs_event_t ev;
    exs_qhandle_t q;
    uint64_t d0;
    int lfd, first, second, a1, a2;

    it_init();
    q = it_qcreate(64);
    lfd = bl_open(q, &addr, &first, &second, 1, &d0);
    ck_assert_msg(!it_try_event(q, EXS_EVT_CONNECT, second, 0, &ev),
                  "the waiting connect completed (errno %d) with the backlog full",
                  ev.exs_evt_errno);
    a1 = bl_accept(lfd, q, 2); /* room: the waiting request starts */
    it_wait_event(q, EXS_EVT_CONNECT, second, &ev);
    ck_assert_msg(ev.exs_evt_errno == 0, "waiting connect: %s", strerror(ev.exs_evt_errno));
    a2 = bl_accept(lfd, q, 3);
    ck_assert_uint_eq(bl_count("listen_deferred"), d0 + 1);
    it_close(first, q);
    it_close(second, q);
    it_close(a1, q);
    it_close(a2, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* A request that never gets room is refused (ECONNREFUSED, counted) half of
 * connect_timeout_ms after it came, before the connecting side's own deadline; the
 * connection that fills the backlog is still accepted afterwards. */
START_TEST(test_backlog_wait_times_out)
{
    const int conn_ms = 2000;
    struct sockaddr_in addr;
    exs_qhandle_t q;
    uint64_t d0, t0;
    double start;
    int lfd, first, second, a1;

    it_setenv("EXS_CONNECT_TIMEOUT_MS", "2000");
    /* one attempt: with the default policy a verbs connect refused by the listener falls
     * back to its tcp listener and waits there again (a second timeout counted) */
    it_setenv("EXS_FALLBACK", "off");
    it_init();
    q = it_qcreate(64);
    t0 = bl_count("listen_defer_timeouts");
    start = it_now_ms();
    lfd = bl_open(q, &addr, &first, &second, 1, &d0);
    it_expect_err(q, EXS_EVT_CONNECT, second, AH(10), ECONNREFUSED);
    ck_assert_msg(it_now_ms() - start >= conn_ms / 2, "refused after %.0f ms, before %d ms",
                  it_now_ms() - start, conn_ms / 2);
    ck_assert_uint_eq(bl_count("listen_defer_timeouts"), t0 + 1);
    a1 = bl_accept(lfd, q, 2);
    it_close(first, q);
    it_close(second, q);
    it_close(a1, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* Closing the listener refuses the requests waiting for room (reason 5, ECONNREFUSED at
 * once, not at the wait's end), and frees them (it_fini: no live object; ASan: no leak). */
START_TEST(test_backlog_close_refuses_waiting)
{
    struct sockaddr_in addr;
    exs_qhandle_t q;
    uint64_t d0, t0;
    int lfd, first, waiting[3];

    it_init();
    q = it_qcreate(64);
    t0 = bl_count("listen_defer_timeouts");
    lfd = bl_open(q, &addr, &first, waiting, 3, &d0);
    it_close(lfd, q);
    for (int i = 0; i < 3; i++) {
        /* the close's refusal, not the wait's end (15 s by default): no timeout counted */
        it_expect_err(q, EXS_EVT_CONNECT, waiting[i], AH(10 + i), ECONNREFUSED);
    }
    ck_assert_uint_eq(bl_count("listen_defer_timeouts"), t0);
    it_close(first, q);
    for (int i = 0; i < 3; i++)
        it_close(waiting[i], q);
    it_qdelete(q);
}
END_TEST

/* With listen_defer_max waiting, the provider listener stops taking requests (tcp: the
 * client waits in the kernel's listen queue) rather than refusing; accepts make room, it
 * goes on, and every client is established. */
START_TEST(test_backlog_pause)
{
    struct sockaddr_in addr;
    exs_event_t ev;
    exs_qhandle_t q;
    uint64_t d0, p0, f0;
    int lfd, first, waiting[5], acc[6];

    if (!strstr(it_provider, "tcp")) {
        test_skip("test_backlog_pause", "provider %s cannot pause a listener", it_provider);
        return;
    }
    it_setenv("EXS_LISTEN_DEFER_MAX", "4");
    it_init();
    q = it_qcreate(64);
    p0 = bl_count("listen_pauses");
    f0 = bl_count("listen_defer_full");
    lfd = bl_open(q, &addr, &first, waiting, 4, &d0);
    bl_wait_count("listen_pauses", p0 + 1);
    /* paused: this one's request is not taken until room frees */
    waiting[4] = bl_connect(&addr, q, 14);
    for (int i = 0; i < 6; i++)
        acc[i] = bl_accept(lfd, q, 20 + i);
    it_close(first, q);
    for (int i = 0; i < 5; i++) {
        it_wait_event(q, EXS_EVT_CONNECT, waiting[i], &ev);
        ck_assert_msg(ev.exs_evt_errno == 0, "client %d: %s", i, strerror(ev.exs_evt_errno));
        it_close(waiting[i], q);
    }
    ck_assert_uint_eq(bl_count("listen_defer_full"), f0);
    ck_assert_uint_eq(bl_count("listen_pauses"), p0 + 1);
    for (int i = 0; i < 6; i++)
        it_close(acc[i], q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

Suite *integ_backlog_suite(void)
{
    Suite *s = suite_create("integ_backlog");

    it_suite_add(s, "backlog", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_backlog_waits, test_backlog_wait_times_out,
                                        test_backlog_close_refuses_waiting, test_backlog_pause,
                                        NULL});
    return s;
}
