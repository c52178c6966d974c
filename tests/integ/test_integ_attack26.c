/* SPDX-License-Identifier: MIT */
/* Session 26's attack review (h73) of the socket table, brought into the build by h74
 * (h73's tests/attack26/test_integ_hz_attack26.c and test_integ_fini_send.c, one suite).
 *
 * hz_finish_reincarnated (tcase hazard): both the last put of a socket and a sending
 * thread T can go on to finish it (api_int.h "Hazards", h71's 344a0f2): T stores NULL in
 * its record (exs__api_hz_clear's first step) before the put's look at the records, and
 * reads the socket's hazard word after the put marked it. The put, seeing no record,
 * claims the socket, destroys it and parks it; T is in exs__api_sock_hz_finish (its
 * membarrier, its look at the records) when another thread's exs_socket unparks the same
 * structure. T's claim must then fail (the structure's generation moved on): on h71 it
 * won, and sock_destroy ran on the new, live socket (its descriptor closed, its conn
 * destroyed, it parked while its owner used it). The test runs T's steps in that order
 * on one thread (exs__api_hz_clear split where T was preempted), the last put being the
 * library's own (exs_close). It passes when the new socket survives.
 *
 * send_at_fini (tcase fini_send): exs_fini freed the socket table's arrays and parked
 * sockets (exs__api_sock_close_all), which exs_send's first look (exs__api_sock_at: the
 * array, its length, the slot) and the hazard look read without a lock, and kfd.c's table
 * and parked kfds (a number exs_fini closed is a kernel one's to exs_send:
 * kfd_lookup_locked): a send racing exs_fini read freed memory (ASan: heap-use-after-free
 * in exs__api_sock_at, exs__api_sock_hz and kfd_lookup_locked, tcp and shm), as
 * exs_qdequeue's look at the queue table did (evq.c, b575548). A call racing exs_fini is
 * the application's mistake, but its answer should be an error, not a read of freed
 * memory. A looker on the other CPU sends on the last socket's number while the main
 * thread opens a socket and calls exs_fini, round after round (a number of rounds or a
 * deadline). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>

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

/* The opening of both hazard tests: T (this thread, its record hz) names p's client socket
 * s and lets go of it up to its read of the hazard word; the last put (the library's,
 * after the close) destroys and parks s; T reads the word (*w_p, marked); another
 * exs_socket unparks the same structure (the park list's head). Its number, or -1 to skip
 * (*live_p: the live count with it). */
static int at_reincarnate(struct it_pair *p, struct api_hz **hz_p, struct api_sock **s_p,
                          uint64_t *w_p, int *live_p)
{
    struct api_hz *hz = exs__api_hz_self ? exs__api_hz_self : exs__api_hz_new();
    struct api_sock *s;
    int live, nfd;
    double end;

    it_init();
    it_pair_open(p, SOCK_STREAM, 16, 16);
    if (!hz)
        return -1;
    /* T names the socket, as send_copy's caller does (exs__api_send_slow) */
    s = exs__api_sock_hz(p->cfd, hz);
    ck_assert_ptr_nonnull(s);
    /* T lets go: exs__api_hz_clear's store (its read of the hazard word comes below) */
    __atomic_store_n(&hz->s, NULL, __ATOMIC_RELEASE);
    /* the last put (the library's, after the close): no record names s, so it claims,
     * destroys and parks s */
    live = exs__api_sock_live();
    it_close(p->cfd, p->cq);
    p->cfd = -1;
    end = it_now_ms() + 20000;
    while (exs__api_sock_live() != live - 1 && it_now_ms() < end)
        (void)exs_qdequeue(p->cq, NULL, 0, 0); /* drive progress */
    ck_assert_msg(exs__api_sock_live() == live - 1, "no last put within 20 s");
    /* T's read of the hazard word (exs__api_hz_clear), after the put's mark and before its
     * claim (the put's membarrier and look lie between): the word as it was then, marked,
     * not claimed; so T goes on to exs__api_sock_hz_finish(s, w) ... */
    *w_p = __atomic_load_n(&s->hz, __ATOMIC_ACQUIRE);
    ck_assert_int_ne(*w_p & EXS_API_HZ_DEFER, 0);
    ck_assert_int_ne(*w_p & EXS_API_HZ_CLAIMED, 0);
    *w_p &= ~(uint64_t)EXS_API_HZ_CLAIMED;
    /* ... and is off its CPU there (its membarrier) while another thread opens a socket,
     * which unparks the same structure (the park list's head) */
    nfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(nfd, 0);
    ck_assert_msg(at_sock_at(nfd) == s, "the new socket is another structure: premise not met");
    ck_assert_int_eq(exs__api_sock_live(), live);
    *hz_p = hz;
    *s_p = s;
    *live_p = live;
    return nfd;
}

START_TEST(hz_finish_reincarnated)
{
    struct it_pair p;
    struct api_hz *hz;
    struct api_sock *s;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    uint64_t w;
    int live, nfd;

    nfd = at_reincarnate(&p, &hz, &s, &w, &live);
    if (nfd < 0) {
        it_pair_close(&p);
        test_skip("hz_finish_reincarnated", "no membarrier(2): sends take references");
        return;
    }
    /* T resumes: its look at the records finds none naming s; its claim */
    exs__api_sock_hz_finish(s, w);
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

/* The same stale finisher T, when the structure's second lifetime has ended too and is
 * left to a record (h73's note: a claim that is a CAS of the mark alone, DEFER to
 * CLAIMED, is still open to this): U (this thread's record again) names the new socket,
 * its last put (exs_close) sees the record and leaves it; U lets go up to its read of the
 * word. In a real interleaving T's look at the records came before U named the socket
 * (one thread cannot split exs__api_sock_hz_finish there), so T's claim must not take the
 * second lifetime at all: the new socket is neither claimed nor parked by T, and U
 * finishes it once. */
START_TEST(hz_finish_second_lifetime)
{
    struct it_pair p;
    struct api_hz *hz;
    struct api_sock *s;
    uint64_t w, w2;
    int live, nfd;
    double end;

    nfd = at_reincarnate(&p, &hz, &s, &w, &live);
    if (nfd < 0) {
        it_pair_close(&p);
        test_skip("hz_finish_second_lifetime", "no membarrier(2): sends take references");
        return;
    }
    /* U names the new socket, which then closes: its last put leaves it to U */
    ck_assert_ptr_eq(exs__api_sock_hz(nfd, hz), s);
    ck_assert_int_eq(exs_close(nfd, EXS_QHANDLE_INVALID, 0), 0);
    end = it_now_ms() + 20000;
    while (!(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_DEFER) && it_now_ms() < end)
        (void)exs_qdequeue(p.cq, NULL, 0, 0); /* drive progress */
    w2 = __atomic_load_n(&s->hz, __ATOMIC_ACQUIRE);
    ck_assert_msg(w2 & EXS_API_HZ_DEFER, "no last put within 20 s");
    ck_assert_int_eq(w2 & EXS_API_HZ_CLAIMED, 0);
    ck_assert_int_eq(exs__api_sock_live(), live); /* left to U */
    /* U lets go: its store (its read of the word comes below) */
    __atomic_store_n(&hz->s, NULL, __ATOMIC_RELEASE);
    /* T resumes with the first lifetime's word */
    exs__api_sock_hz_finish(s, w);
    ck_assert_msg(!(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_CLAIMED) &&
                      exs__api_sock_live() == live,
                  "a finisher of the first lifetime took the second (live %d, %d)",
                  exs__api_sock_live(), live);
    /* U's read of the word, and its finish: once */
    w2 = __atomic_load_n(&s->hz, __ATOMIC_ACQUIRE);
    exs__api_sock_hz_finish(s, w2);
    ck_assert_int_ne(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_CLAIMED, 0);
    ck_assert_int_eq(exs__api_sock_live(), live - 1);
    exs__api_sock_hz_finish(s, w2);
    ck_assert_int_eq(exs__api_sock_live(), live - 1);
    it_pair_close(&p);
}
END_TEST

#define SF_ROUNDS     300
#define SF_DEADLINE_S 30

static int sf_fd = -1;                                 /* atomic */
static int sf_stop;                                    /* atomic */
static uint64_t sf_looks;                              /* atomic */
static exs_mhandle_t sf_mh = EXS_MHANDLE_UNREGISTERED; /* atomic: the registration to send from */
static exs_qhandle_t sf_q = EXS_QHANDLE_INVALID;       /* atomic: the queue its events go to */
static char sf_buf[64];

static void *sf_looker(void *p)
{
    (void)p;
    while (!__atomic_load_n(&sf_stop, __ATOMIC_ACQUIRE)) {
        int fd = __atomic_load_n(&sf_fd, __ATOMIC_ACQUIRE);
        exs_qhandle_t q = __atomic_load_n(&sf_q, __ATOMIC_ACQUIRE);
        exs_event_t ev[16];
        struct timespec zero = {0, 0};

        if (fd >= 0) /* ENOTCONN, EBADF, ENOTSOCK, EAGAIN...: any error is right */
            (void)exs_send(fd, sf_buf, sizeof(sf_buf), 0, q, (exs_ahandle_t)-1,
                           __atomic_load_n(&sf_mh, __ATOMIC_ACQUIRE));
        if (q != EXS_QHANDLE_INVALID) /* room for the next sends (or EINVAL) */
            (void)exs_qdequeue(q, ev, 16, &zero);
        __atomic_add_fetch(&sf_looks, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Rounds of exs_init, open (the socket to send on: *fd_p, its queue, a registration if
 * any), the looker's two looks, exs_fini, until SF_ROUNDS or the deadline; the rounds. */
static int sf_rounds(void (*open)(void))
{
    pthread_t t;
    struct timespec now;
    time_t end;
    int r;

    ck_assert_int_eq(setenv("EXS_PROVIDER", it_provider, 1), 0);
    clock_gettime(CLOCK_MONOTONIC, &now);
    end = now.tv_sec + SF_DEADLINE_S;
    __atomic_store_n(&sf_stop, 0, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_create(&t, NULL, sf_looker, NULL), 0);
    for (r = 0; r < SF_ROUNDS && now.tv_sec < end; r++) {
        ck_assert_int_eq(exs_init(EXS_VERSION), EXS_VERSION);
        open();
        /* the looker has looked (a count, deadline-bounded: no sleep) */
        for (uint64_t l = __atomic_load_n(&sf_looks, __ATOMIC_RELAXED) + 2;
             __atomic_load_n(&sf_looks, __ATOMIC_RELAXED) < l && now.tv_sec < end;)
            clock_gettime(CLOCK_MONOTONIC, &now);
        exs_fini();
        it_forget_queues();
        clock_gettime(CLOCK_MONOTONIC, &now);
    }
    __atomic_store_n(&sf_stop, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    return r;
}

static void sf_open_socket(void)
{
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ge(fd, 0);
    __atomic_store_n(&sf_fd, fd, __ATOMIC_RELEASE);
}

/* a connected STREAM pair, the client's sends from a registration into the client's queue
 * (the pair's queues and sockets are exs_fini's to end) */
static void sf_open_pair_reg(void)
{
    struct it_pair p;
    exs_mhandle_t mh;

    it_pair_open(&p, SOCK_STREAM, 64, 64);
    mh = exs_mregister(sf_buf, sizeof(sf_buf), 0);
    ck_assert_int_ge(mh, 0);
    __atomic_store_n(&sf_mh, mh, __ATOMIC_RELEASE);
    __atomic_store_n(&sf_q, p.cq, __ATOMIC_RELEASE);
    __atomic_store_n(&sf_fd, p.cfd, __ATOMIC_RELEASE);
}

#if defined(__SANITIZE_THREAD__)
/* it uses a number racing its close and reuse on purpose (the application's mistake it
 * plays): ThreadSanitizer reports that as a race on the descriptor (the library's fstat
 * against the close or the next eventfd), which is the premise; what it checks, no freed
 * memory read, is AddressSanitizer's */
#define SF_SKIP_TSAN(name)                                                                         \
    do {                                                                                           \
        test_skip(name, "ThreadSanitizer: a descriptor number raced on purpose");                  \
        return;                                                                                    \
    } while (0)
#else
#define SF_SKIP_TSAN(name) ((void)0)
#endif

/* exs_send's look at the socket table racing exs_fini reads no freed memory. */
START_TEST(send_at_fini)
{
    SF_SKIP_TSAN("send_at_fini");
    ck_assert_int_gt(sf_rounds(sf_open_socket), 0);
}
END_TEST

/* exs_send's look at a registration (the socket's hint, then the registration table:
 * mreg_covers, without a lock) racing exs_fini reads no freed memory: exs_fini freed the
 * records and the table (xfer.c exs__api_mreg_destroy_all) outside the exit path (ASan:
 * heap-use-after-free in exs_send, before the lead's fix; the records are now parked and
 * the table kept, as the sockets' and queues'). */
START_TEST(send_reg_at_fini)
{
    int r;

    SF_SKIP_TSAN("send_reg_at_fini");
    r = sf_rounds(sf_open_pair_reg);
    __atomic_store_n(&sf_mh, EXS_MHANDLE_UNREGISTERED, __ATOMIC_RELEASE);
    __atomic_store_n(&sf_q, EXS_QHANDLE_INVALID, __ATOMIC_RELEASE);
    ck_assert_int_gt(r, 0);
}
END_TEST

Suite *integ_attack26_suite(void)
{
    Suite *s = suite_create("integ_attack26");

    it_suite_add(s, "hazard", 60, 1,
                 (const TTest *const[]){hz_finish_reincarnated, hz_finish_second_lifetime, NULL});
    it_suite_add(s, "fini_send", 120, 1,
                 (const TTest *const[]){send_at_fini, send_reg_at_fini, NULL});
    return s;
}
