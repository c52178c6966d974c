/* SPDX-License-Identifier: MIT */
/* Session 26's attack review (h73) of h71's hazard records (344a0f2: exs_send's copy at the
 * post uses the socket without a reference; the last put marks it hz_defer, makes every
 * thread pass a barrier and looks at the records; a thread letting go reads hz_defer and
 * finishes the socket when it is set; hz_claim, an exchange, makes one finisher).
 *
 * NOT BUILT on main (it needs h71's struct api_hz and exs__api_sock_hz*): copy it into
 * tests/integ/ and add integ_hz_attack26_suite to tests/integ's suite list on a tree with
 * 344a0f2 (h73's scratch worktree did: see the report).
 *
 * hz_finish_reincarnated: both the last put and a sending thread T can go on to finish the
 * socket, legitimately in the memory model: T stores NULL in its record (exs__api_hz_clear's
 * first step) before the put's look at the records, and reads hz_defer after the put's
 * store of it. The put, seeing no record, claims the socket, destroys it and parks it; T,
 * having read hz_defer 1, is in exs__api_sock_hz_finish (its membarrier, its look at the
 * records) when another thread's exs_socket unparks the same structure, which clears
 * hz_defer and hz_claim. T's exchange on hz_claim then wins, and sock_destroy runs on the
 * new, live socket: its descriptor closed, its conn destroyed, it parked while its owner
 * uses it (a use after free of the socket's state, and its number freed for reuse).
 * The test runs T's steps in that order on one thread (exs__api_hz_clear split at the
 * point where T was preempted), the last put being the library's own (exs_close). It
 * passes when the new socket survives. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "exs/api/api_int.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#include <sys/exs.h>

static struct api_sock *at_sock_at(int fd)
{
    struct sock_tabv *t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);

    return t && (unsigned)fd < (unsigned)t->len ? __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE)
                                                : NULL;
}

START_TEST(hz_finish_reincarnated)
{
    struct it_pair p;
    struct api_hz *hz;
    struct api_sock *s, *s2;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int live, defer, fd, nfd;
    double end;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    hz = exs__api_hz_self ? exs__api_hz_self : exs__api_hz_new();
    if (!hz) {
        it_pair_close(&p);
        test_skip("hz_finish_reincarnated", "no membarrier(2): sends take references");
        return;
    }
    fd = p.cfd;
    /* T names the socket, as send_copy's caller does (exs__api_send_slow) */
    s = exs__api_sock_hz(fd, hz);
    ck_assert_ptr_nonnull(s);
    /* T lets go: exs__api_hz_clear's store (its read of hz_defer comes below) */
    __atomic_store_n(&hz->s, NULL, __ATOMIC_RELEASE);
    /* the last put (the library's, after the close): no record names s, so it claims,
     * destroys and parks s */
    live = exs__api_sock_live();
    it_close(fd, p.cq);
    p.cfd = -1;
    end = it_now_ms() + 20000;
    while (exs__api_sock_live() != live - 1 && it_now_ms() < end)
        (void)exs_qdequeue(p.cq, NULL, 0, 0); /* drive progress */
    ck_assert_msg(exs__api_sock_live() == live - 1, "no last put within 20 s");
    /* T's read of hz_defer (exs__api_hz_clear), after the put's store: 1, so T goes on to
     * exs__api_sock_hz_finish(s) ... */
    defer = __atomic_load_n(&s->hz_defer, __ATOMIC_ACQUIRE);
    ck_assert_int_ne(defer, 0);
    /* ... and is off its CPU there (its membarrier) while another thread opens a socket,
     * which unparks the same structure (the park list's head) */
    nfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(nfd, 0);
    s2 = at_sock_at(nfd);
    ck_assert_msg(s2 == s, "the new socket is another structure: premise not met");
    ck_assert_int_eq(exs__api_sock_live(), live);
    /* T resumes: its look at the records finds none naming s; its claim */
    if (defer)
        exs__api_sock_hz_finish(s);
    /* the new socket, which nobody closed, is still the library's */
    ck_assert_msg(exs__api_sock_live() == live,
                  "the new socket was destroyed by a finisher of the old one (live %d, %d)",
                  exs__api_sock_live(), live);
    ck_assert_ptr_eq(at_sock_at(nfd), s);
    ck_assert_int_eq(exs_getsockname(nfd, (struct sockaddr *)&ss, &sl), 0);
    ck_assert_int_eq(exs_close(nfd, EXS_QHANDLE_INVALID, 0), 0);
    it_pair_close(&p);
}
END_TEST

Suite *integ_hz_attack26_suite(void)
{
    Suite *s = suite_create("integ_hz_attack26");
    TCase *tc = tcase_create("hazard");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hz_finish_reincarnated);
    suite_add_tcase(s, tc);
    return s;
}
