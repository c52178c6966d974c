/* SPDX-License-Identifier: MIT */
/* Run-to-completion progress: waiters drive the provider in every wait mode, the progress thread's
 * hand-off, per-thread synchronous queues. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#include "exs/api/evq.h"
#include "exs/engine/engine.h"
#include "exs/util/counters.h"
#include "exs/util/job.h"
#include "exs/util/lockorder.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#define AH(n) IT_AH(n)

static const int modes[] = {EXS_WAIT_NOTIFY, EXS_WAIT_POLL, EXS_WAIT_ADAPTIVE};
static const char *const mode_names[] = {"notify", "poll", "adaptive"};

static uint64_t eng_counter(const char *name)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup("engine", name, &v) == 0, "engine counter %s missing", name);
    return v;
}

/* One event of q with a deadline of IT_TIMEOUT_MS, through exs_qdequeue only. */
static void dq1(exs_qhandle_t q, exs_event_t *ev, const char *what)
{
    double end = it_now_ms() + IT_TIMEOUT_MS;

    for (;;) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        int n = exs_qdequeue(q, ev, 1, &ts);

        if (n == 1)
            return;
        ck_assert_msg(n == 0 || errno == EINTR, "%s: exs_qdequeue = %d errno %d (%s)", what, n,
                      errno, strerror(errno));
        ck_assert_msg(it_now_ms() < end, "%s: no event within %d ms", what, IT_TIMEOUT_MS);
    }
}

/* rounds SEQPACKET ping-pongs over p through the public API, data checked. */
static void pingpong(struct it_pair *p, int rounds, int mode)
{
    struct it_buf *a = it_buf_new(256, 1), *b = it_buf_new(256, 1);
    exs_event_t ev;

    ck_assert_int_eq(exs_qsetwait(p->cq, mode, 20), 0);
    ck_assert_int_eq(exs_qsetwait(p->sq, mode, 20), 0);
    for (int i = 0; i < rounds; i++) {
        size_t len = 1 + (size_t)(i * 37) % 256;

        /* client -> server */
        IT_EXPECT_OK(exs_recv(p->sfd, b->p, 256, 0, p->sq, AH(2 * i), b->mh));
        it_fill(a->p, len, (uint32_t)i);
        IT_EXPECT_OK(exs_send(p->cfd, a->p, len, 0, p->cq, AH(2 * i), a->mh));
        dq1(p->sq, &ev, "server recv");
        ck_assert_msg(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_errno == 0 &&
                          ev.exs_evt_u.exs_evt_xfer.exs_evt_result == (ssize_t)len,
                      "round %d: recv event type %d errno %d result %zd", i, ev.exs_evt_type,
                      ev.exs_evt_errno, ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
        ck_assert_int_eq(it_check(b->p, len, (uint32_t)i), -1);
        dq1(p->cq, &ev, "client send");
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        /* server -> client */
        IT_EXPECT_OK(exs_recv(p->cfd, a->p, 256, 0, p->cq, AH(2 * i + 1), a->mh));
        it_fill(b->p, len, (uint32_t)i + 1000u);
        IT_EXPECT_OK(exs_send(p->sfd, b->p, len, 0, p->sq, AH(2 * i + 1), b->mh));
        dq1(p->cq, &ev, "client recv");
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)len);
        ck_assert_int_eq(it_check(a->p, len, (uint32_t)i + 1000u), -1);
        dq1(p->sq, &ev, "server send");
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
    }
    it_buf_free(a);
    it_buf_free(b);
}

/* A transfer of len bytes (pattern seed), client to server, that the progress thread
 * completes while this thread makes no exs_qdequeue: both events are seen on exs_qfd
 * first (when stands in the message), then taken and the data checked. */
static void transfer_seen_on_qfds(struct it_pair *p, size_t len, uint32_t seed, const char *when)
{
    struct it_buf *a = it_buf_new(len, 1), *b = it_buf_new(len, 1);
    struct pollfd pfd[2];
    double end;
    int seen = 0;

    pfd[0].fd = exs_qfd(p->sq);
    pfd[1].fd = exs_qfd(p->cq);
    pfd[0].events = pfd[1].events = POLLIN;
    it_fill(a->p, len, seed);
    IT_EXPECT_OK(exs_recv(p->sfd, b->p, len, MSG_WAITALL, p->sq, AH(1), b->mh));
    IT_EXPECT_OK(exs_send(p->cfd, a->p, len, 0, p->cq, AH(2), a->mh));
    end = it_now_ms() + IT_TIMEOUT_MS;
    while (seen != 3 && it_now_ms() < end) {
        pfd[0].revents = pfd[1].revents = 0;
        ck_assert_int_ge(poll(pfd, 2, 100), 0);
        seen |= (pfd[0].revents & POLLIN ? 1 : 0) | (pfd[1].revents & POLLIN ? 2 : 0);
    }
    ck_assert_msg(seen == 3, "%swithout exs_qdequeue: server event %d client event %d", when,
                  seen & 1, !!(seen & 2));
    it_expect_recv(p->sq, p->sfd, AH(1), (ssize_t)len, 0);
    it_expect_send(p->cq, p->cfd, AH(2), (ssize_t)len);
    ck_assert_int_eq(it_check(b->p, len, seed), -1);
    it_buf_free(a);
    it_buf_free(b);
}

/* With the progress thread kept away from the provider (test seam), a waiter in each
 * mode completes connection set-up, a ping-pong and the close by driving itself: the
 * progress thread found no work at all. */
START_TEST(test_waiter_drives)
{
    struct it_pair p;
    uint64_t app0, thr0;

    it_setenv("EXS_TEST_ENGINE_PARK", "1");
    it_init();
    app0 = eng_counter("drives_app");
    thr0 = eng_counter("drives_thread");
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 100, modes[_i]);
    it_pair_close(&p);
    ck_assert_msg(eng_counter("drives_app") > app0, "%s: the application never drove",
                  mode_names[_i]);
    ck_assert_msg(eng_counter("drives_thread") == thr0,
                  "%s: the parked progress thread drove %llu times", mode_names[_i],
                  (unsigned long long)(eng_counter("drives_thread") - thr0));
}
END_TEST

/* A sleeping waiter (EXS_WAIT_NOTIFY) arms without driving first: its arm is the first
 * look at the providers, and an arm that finds work pending (-EAGAIN: a completion
 * already queued by a provider, e.g. a send the provider completed as it was posted, or
 * a round that stopped at its bound) drives it in the same hold of the progress lock.
 * With the progress thread parked (test seam), each send's event is waited for first,
 * while its completion may sit in the provider: a waiter that only re-armed on -EAGAIN
 * would arm again and again (counter arms) until something else drove (seen on tcp: a
 * second of spinning per wait). */
START_TEST(test_notify_arm_drives)
{
    struct it_pair p;
    struct it_buf *a, *b;
    exs_event_t ev;
    uint64_t arms0, arms;

    it_setenv("EXS_TEST_ENGINE_PARK", "1");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    a = it_buf_new(256, 1);
    b = it_buf_new(256, 1);
    ck_assert_int_eq(exs_qsetwait(p.cq, EXS_WAIT_NOTIFY, 0), 0);
    ck_assert_int_eq(exs_qsetwait(p.sq, EXS_WAIT_NOTIFY, 0), 0);
    arms0 = eng_counter("arms");
    for (int i = 0; i < 50; i++) {
        struct timespec ts = {2, 0};
        int n;

        IT_EXPECT_OK(exs_recv(p.sfd, b->p, 256, 0, p.sq, AH(i), b->mh));
        it_fill(a->p, 64, (uint32_t)i);
        IT_EXPECT_OK(exs_send(p.cfd, a->p, 64, 0, p.cq, AH(i), a->mh));
        /* the send's own event first, in one wait: no other thread drives */
        n = exs_qdequeue(p.cq, &ev, 1, &ts);
        ck_assert_msg(n == 1, "round %d: the send's event not there after one 2 s wait (%d)", i, n);
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
        dq1(p.sq, &ev, "server recv");
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
        ck_assert_int_eq(it_check(b->p, 64, (uint32_t)i), -1);
    }
    arms = eng_counter("arms") - arms0;
    printf("notify_arm_drives: %" PRIu64 " arms (%" PRIu64 " drove) in 100 waits\n", arms,
           eng_counter("arm_drives"));
    /* a few per wait (an arm, its round, the arm that sleeps); an arm that found work
     * without driving it would be asked again and again until something else drove */
    ck_assert_msg(arms < 100 * 8, "%" PRIu64 " arms in 100 waits", arms);
    it_buf_free(a);
    it_buf_free(b);
    it_pair_close(&p);
}
END_TEST

/* A sleeping wait (EXS_WAIT_NOTIFY) that finds nothing queued arms before it takes its
 * queue's lock: each arm is followed by one hold of evq->lock (to look, and register as a
 * sleeper unless the arm drove), and each sleep by one (to look after it), none before the
 * first arm. A wait whose first look took the lock, gave it back to arm and took it again
 * holds it once more. Counted by the lock-order checker (ASan, TSan builds). */
START_TEST(test_notify_wait_holds)
{
#ifdef EXS_LOCK_DEBUG
    struct it_pair p;
    exs_event_t ev;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    ck_assert_int_eq(exs_qsetwait(p.cq, EXS_WAIT_NOTIFY, 0), 0);
    for (int i = 0; i < 5; i++) {
        struct timespec ts = {0, 2000000}; /* nothing comes: the wait ends at its deadline */
        uint64_t arms0 = eng_counter("arms"), drove0 = eng_counter("arm_drives");
        uint64_t woke0 = eng_counter("wake_drives");
        unsigned long takes0 = exs__lock_takes(EXS_LOCK_EVQ), takes;
        uint64_t arms, drove, woke;

        ck_assert_int_eq(exs_qdequeue(p.cq, &ev, 1, &ts), 0);
        takes = exs__lock_takes(EXS_LOCK_EVQ) - takes0;
        arms = eng_counter("arms") - arms0;
        drove = eng_counter("arm_drives") - drove0;
        woke = eng_counter("wake_drives") - woke0;
        /* arms that drove were not followed by a sleep; the others by one each; a sleep
         * ended by a provider's event fd (spurious readability is allowed: prov.h; seen on
         * a loaded host) drives, and looks once more after that drive */
        ck_assert_msg(arms >= 1 && takes == 2 * arms - drove + woke,
                      "wait %d: %lu holds of the queue's lock for %" PRIu64 " arms (%" PRIu64
                      " drove, %" PRIu64 " woken by a provider), want %" PRIu64,
                      i, takes, arms, drove, woke, 2 * arms - drove + woke);
    }
    it_pair_close(&p);
#else
    test_skip("notify_wait_holds", "EXS_LOCK_DEBUG is off in this build (on in ASan/TSan builds)");
#endif
}
END_TEST

/* Busy-polling waiters on queues nobody polls make no eventfd write: the events they
 * produce are handed over in memory. */
START_TEST(test_poll_no_fd_writes)
{
    struct it_pair p;
    uint64_t w0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_POLL); /* settle */
    w0 = eng_counter("evq_fd_writes");
    pingpong(&p, 200, EXS_WAIT_POLL);
    ck_assert_msg(eng_counter("evq_fd_writes") == w0, "%llu eventfd writes for queues nobody polls",
                  (unsigned long long)(eng_counter("evq_fd_writes") - w0));
    it_pair_close(&p);
}
END_TEST

/* The engine's rounds take the provider's work and its completions in one call
 * (exs__prov_progress_poll): over shm the completions a turn makes reach their
 * connections without going through the provider's queue (prov.shm direct_cqes counts
 * them: at least the two receives of each round trip; before, the round called
 * ctx_progress then ctx_poll, and none was). Over tcp the same ping-pong runs through the
 * two calls (the wrapper's fallback), its data checked as everywhere. */
START_TEST(test_round_hands_cqes)
{
    struct it_pair p;
    uint64_t d0 = 0, d1 = 0;
    const int rounds = 200;
    int shm = strcmp(it_provider, "shm") == 0;

    it_setenv("EXS_TEST_ENGINE_PARK", "1"); /* the waiters drive: their rounds */
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_POLL); /* settle */
    if (shm)
        ck_assert_int_eq(exs__counters_lookup("prov.shm", "direct_cqes", &d0), 0);
    pingpong(&p, rounds, EXS_WAIT_POLL);
    if (shm) {
        ck_assert_int_eq(exs__counters_lookup("prov.shm", "direct_cqes", &d1), 0);
        ck_assert_msg(d1 - d0 >= 2u * rounds, "%llu completions handed over in %d round trips",
                      (unsigned long long)(d1 - d0), rounds);
    }
    it_pair_close(&p);
}
END_TEST

/* Blocking waits (EXS_WAIT_NOTIFY) on the tcp provider: a waiter that woke drives with
 * nobody else asleep on the provider's event fd, so it takes its arm back (ctx_disarm)
 * and the completions its drive queues write no event fd; before, every wake-up wrote one
 * (and the next arm read it back): two system calls per wake-up (spec/threading.md §3). */
START_TEST(test_notify_disarms)
{
    struct it_pair p;
    uint64_t n0 = 0, n1 = 0, d0 = 0, d1 = 0;
    const int rounds = 200;

    if (strcmp(it_provider, "tcp") != 0) {
        test_skip("test_notify_disarms", "provider %s: ctx_disarm is the tcp provider's",
                  it_provider);
        return;
    }
    it_setenv("EXS_TEST_ENGINE_PARK", "1"); /* this thread is the only one on the fds */
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_NOTIFY); /* settle */
    ck_assert_int_eq(exs__counters_lookup("prov.tcp", "notifies", &n0), 0);
    ck_assert_int_eq(exs__counters_lookup("prov.tcp", "disarms", &d0), 0);
    pingpong(&p, rounds, EXS_WAIT_NOTIFY);
    ck_assert_int_eq(exs__counters_lookup("prov.tcp", "notifies", &n1), 0);
    ck_assert_int_eq(exs__counters_lookup("prov.tcp", "disarms", &d1), 0);
    ck_assert_msg(d1 - d0 >= (uint64_t)rounds, "%llu disarms in %d round trips",
                  (unsigned long long)(d1 - d0), rounds);
    ck_assert_msg(n1 - n0 < (uint64_t)rounds / 4,
                  "%llu event fd writes in %d round trips with nobody asleep on it",
                  (unsigned long long)(n1 - n0), rounds);
    it_pair_close(&p);
}
END_TEST

/* The application stops calling exs_qdequeue after busy-polling (drivers came and went):
 * the progress thread takes the provider back within its lease and the transfer
 * completes, visible on exs_qfd of both queues without any dequeue. */
START_TEST(test_progress_while_computing)
{
    struct it_pair p;
    exs_event_t ev;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 64);
    pingpong(&p, 0, EXS_WAIT_POLL);
    /* a few dequeues in POLL mode first, so the hand-off is exercised */
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(exs_qdequeue(p.cq, &ev, 1, &(struct timespec){0, 0}), 0);
    transfer_seen_on_qfds(&p, 1 << 20, 7, "");
    it_pair_close(&p);
}
END_TEST

/* A job that does nothing: it only wakes the progress thread. */
static void idle_nop_job(struct exs_job *job)
{
    (void)job;
}

static struct exs_job idle_job = {.fn = idle_nop_job};

/* 30 ms into the wait, wake the progress thread once (a job), so that it sees a driver
 * waiting and runs its lease, whatever it was doing before the wait began. */
static void *idle_poke(void *arg)
{
    (void)arg;
    it_sleep_ms(30);
    exs__engine_post(&idle_job);
    return NULL;
}

/* A thread waiting a long time with nothing to do: the lease stops (no wake-up every
 * lease_us while a server idles in exs_qdequeue), and when that waiter leaves, the
 * progress thread is woken and takes the provider back: a transfer then completes
 * without any exs_qdequeue, seen on exs_qfd. */
START_TEST(test_idle_wait_then_compute)
{
    struct it_pair p;
    exs_event_t ev;
    uint64_t idle0;
    pthread_t t;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 64);
    idle0 = eng_counter("lease_idles");
    ck_assert_int_eq(pthread_create(&t, NULL, idle_poke, NULL), 0);
    /* 300 ms with nothing to do: many leases (1 ms by default) after the poke */
    ck_assert_int_eq(exs_qdequeue(p.sq, &ev, 1, &(struct timespec){0, 300000000}), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_msg(eng_counter("lease_idles") > idle0,
                  "the lease kept running while the same thread waited 300 ms");
    transfer_seen_on_qfds(&p, 1 << 16, 9, "after an idle wait, ");
    it_pair_close(&p);
}
END_TEST

/* An event queued before exs_qfd was first called on its queue (its post wrote no
 * descriptor): the descriptor is readable as soon as exs_qfd returns, and not once the
 * queue is empty. Receives complete in order, so once the second receive's event is on
 * q2, the first's is on q1. */
START_TEST(test_qfd_late)
{
    struct it_pair p;
    struct it_buf *a, *b;
    struct pollfd pfd = {.events = POLLIN};
    exs_qhandle_t q1, q2;
    exs_event_t ev;
    uint64_t w0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    q1 = it_qcreate(4);
    q2 = it_qcreate(4);
    a = it_buf_new(64, 1);
    b = it_buf_new(128, 1);
    ck_assert_int_eq(exs_qsetwait(q2, EXS_WAIT_POLL, 0), 0);
    ck_assert_int_eq(exs_qsetwait(p.cq, EXS_WAIT_POLL, 0), 0);
    w0 = eng_counter("evq_fd_writes");
    IT_EXPECT_OK(exs_recv(p.sfd, b->p, 64, 0, q1, AH(1), b->mh));
    IT_EXPECT_OK(exs_recv(p.sfd, b->p + 64, 64, 0, q2, AH(2), b->mh));
    IT_EXPECT_OK(exs_send(p.cfd, a->p, 64, 0, p.cq, AH(3), a->mh));
    IT_EXPECT_OK(exs_send(p.cfd, a->p, 64, 0, p.cq, AH(4), a->mh));
    dq1(q2, &ev, "second receive");
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
    ck_assert_msg(eng_counter("evq_fd_writes") == w0,
                  "%llu descriptor writes for queues nobody polls",
                  (unsigned long long)(eng_counter("evq_fd_writes") - w0));
    pfd.fd = exs_qfd(q1);
    ck_assert_int_ge(pfd.fd, 0);
    ck_assert_msg(poll(&pfd, 1, 0) == 1, "exs_qfd not readable with an event queued");
    it_expect_recv(q1, p.sfd, AH(1), 64, 0);
    pfd.revents = 0;
    ck_assert_msg(poll(&pfd, 1, 0) == 0, "exs_qfd readable with the queue empty");
    it_expect_send(p.cq, p.cfd, AH(3), 64);
    it_expect_send(p.cq, p.cfd, AH(4), 64);
    it_buf_free(a);
    it_buf_free(b);
    it_qdelete(q1);
    it_qdelete(q2);
    it_pair_close(&p);
}
END_TEST

/* ---- many threads on one queue, several queues at once ---- */

#define MT_THREADS 3
#define MT_MSGS    600
#define MT_LEN     512

struct mt_pair {
    struct it_pair p;
    struct it_buf *rbuf; /* MT_MSGS slots of MT_LEN */
    struct it_buf *sbuf;
    int mode;
    int got; /* atomic: receive events taken */
    unsigned char seen[MT_MSGS + MT_THREADS];
    int bad; /* atomic: a wrong event or wrong data */
    int sends_done;
};

/* Takes receive events one at a time, without a timeout (a lost wake-up hangs it: the
 * watchdog fails the test), until it takes one of the MT_THREADS stop messages. */
static void *mt_taker(void *arg)
{
    struct mt_pair *m = arg;

    for (;;) {
        exs_event_t ev;
        int n = exs_qdequeue(m->p.sq, &ev, 1, NULL);
        long k;

        if (n < 0 && errno == EINTR)
            continue;
        if (n != 1) {
            __atomic_store_n(&m->bad, 1, __ATOMIC_RELAXED);
            break;
        }
        k = IT_AHN(ev.exs_evt_ahandle);
        if (ev.exs_evt_type != EXS_EVT_RECV || k < 0 || k >= MT_MSGS + MT_THREADS ||
            ev.exs_evt_errno != 0 || ev.exs_evt_u.exs_evt_xfer.exs_evt_result != MT_LEN ||
            __atomic_exchange_n(&m->seen[k], 1, __ATOMIC_RELAXED) ||
            it_check(m->rbuf->p + (size_t)k * MT_LEN, MT_LEN, (uint32_t)k) != -1) {
            __atomic_store_n(&m->bad, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (k >= MT_MSGS)
            break; /* a stop message */
        __atomic_add_fetch(&m->got, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void *mt_sender(void *arg)
{
    struct mt_pair *m = arg;

    for (int k = 0; k < MT_MSGS + MT_THREADS; k++) {
        exs_event_t ev;
        int r;

        it_fill(m->sbuf->p + (size_t)k * MT_LEN, MT_LEN, (uint32_t)k);
        while ((r = exs_send(m->p.cfd, m->sbuf->p + (size_t)k * MT_LEN, MT_LEN, 0, m->p.cq, AH(k),
                             m->sbuf->mh)) < 0 &&
               errno == EAGAIN) {
            struct timespec ts = {0, 50 * 1000 * 1000};

            if (exs_qdequeue(m->p.cq, &ev, 1, &ts) == 1) {
                if (ev.exs_evt_type != EXS_EVT_SEND || ev.exs_evt_errno)
                    __atomic_store_n(&m->bad, 1, __ATOMIC_RELAXED);
                m->sends_done++;
            }
        }
        if (r < 0) {
            __atomic_store_n(&m->bad, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    while (m->sends_done < MT_MSGS + MT_THREADS) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        exs_event_t ev;
        int n = exs_qdequeue(m->p.cq, &ev, 1, &ts);

        if (n == 1) {
            if (ev.exs_evt_type != EXS_EVT_SEND || ev.exs_evt_errno)
                __atomic_store_n(&m->bad, 1, __ATOMIC_RELAXED);
            m->sends_done++;
        } else if (n < 0 && errno != EINTR)
            break;
        if (__atomic_load_n(&m->bad, __ATOMIC_RELAXED))
            break;
    }
    return NULL;
}

/* Two pairs, each with MT_THREADS threads taking receive events from one queue (no
 * timeout) while a sender thread posts; every message arrives once, intact, in the wait
 * mode _i, and every taker wakes for its stop message. */
START_TEST(test_many_waiters)
{
    struct mt_pair m[2];
    pthread_t takers[2][MT_THREADS], senders[2];

    it_setenv("EXS_SOCK_MAX_OPS", "1024");
    it_init();
    for (int j = 0; j < 2; j++) {
        memset(&m[j], 0, sizeof(m[j]));
        it_pair_open(&m[j].p, SOCK_SEQPACKET, 2 * MT_MSGS, 64);
        m[j].mode = modes[_i];
        ck_assert_int_eq(exs_qsetwait(m[j].p.sq, modes[_i], 20), 0);
        ck_assert_int_eq(exs_qsetwait(m[j].p.cq, modes[_i], 20), 0);
        m[j].rbuf = it_buf_new((size_t)(MT_MSGS + MT_THREADS) * MT_LEN, 1);
        m[j].sbuf = it_buf_new((size_t)(MT_MSGS + MT_THREADS) * MT_LEN, 1);
        for (int k = 0; k < MT_MSGS + MT_THREADS; k++)
            IT_EXPECT_OK(exs_recv(m[j].p.sfd, m[j].rbuf->p + (size_t)k * MT_LEN, MT_LEN, 0,
                                  m[j].p.sq, AH(k), m[j].rbuf->mh));
    }
    it_watchdog_start(120, "many waiters");
    for (int j = 0; j < 2; j++) {
        for (int t = 0; t < MT_THREADS; t++)
            ck_assert_int_eq(pthread_create(&takers[j][t], NULL, mt_taker, &m[j]), 0);
        ck_assert_int_eq(pthread_create(&senders[j], NULL, mt_sender, &m[j]), 0);
    }
    for (int j = 0; j < 2; j++) {
        pthread_join(senders[j], NULL);
        for (int t = 0; t < MT_THREADS; t++)
            pthread_join(takers[j][t], NULL);
    }
    it_watchdog_stop();
    for (int j = 0; j < 2; j++) {
        ck_assert_msg(!m[j].bad, "pair %d (%s): a wrong, duplicated or corrupt event", j,
                      mode_names[_i]);
        ck_assert_msg(m[j].got == MT_MSGS, "pair %d (%s): %d of %d receive events", j,
                      mode_names[_i], m[j].got, MT_MSGS);
        ck_assert_msg(m[j].sends_done == MT_MSGS + MT_THREADS, "pair %d (%s): %d of %d send events",
                      j, mode_names[_i], m[j].sends_done, MT_MSGS + MT_THREADS);
        it_buf_free(m[j].rbuf);
        it_buf_free(m[j].sbuf);
        it_pair_close(&m[j].p);
    }
}
END_TEST

/* ---- a wake-up without provider activity ---- */

struct sleeper {
    exs_qhandle_t q;
    exs_event_t ev;
    int n, err;
};

static void *sleeper_main(void *arg)
{
    struct sleeper *sl = arg;

    do {
        sl->n = exs_qdequeue(sl->q, &sl->ev, 1, NULL);
        sl->err = errno;
    } while (sl->n < 0 && sl->err == EINTR);
    return NULL;
}

/* A thread asleep on a queue (no timeout) wakes for an event that another thread
 * produces without any provider activity (the close of a socket that never connected
 * runs as jobs only): the sleeper's descriptor is written for it. */
START_TEST(test_wake_by_job)
{
    struct sleeper sl = {0};
    pthread_t th;
    int fd;

    it_init();
    sl.q = it_qcreate(4);
    ck_assert_int_eq(exs_qsetwait(sl.q, _i ? EXS_WAIT_ADAPTIVE : EXS_WAIT_NOTIFY, 10), 0);
    fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    it_watchdog_start(30, "a sleeper woken by a job's event");
    ck_assert_int_eq(pthread_create(&th, NULL, sleeper_main, &sl), 0);
    it_sleep_ms(100); /* let it fall asleep (the test is valid either way) */
    IT_EXPECT_OK(exs_close(fd, sl.q, AH(5)));
    pthread_join(th, NULL);
    it_watchdog_stop();
    ck_assert_msg(sl.n == 1, "exs_qdequeue = %d errno %d", sl.n, sl.err);
    ck_assert_int_eq(sl.ev.exs_evt_type, EXS_EVT_CLOSE);
    ck_assert_int_eq(sl.ev.exs_evt_fd, fd);
    it_qdelete(sl.q);
}
END_TEST

/* ---- who holds the progress lock ---- */

static int holder_in, holder_entered, holder_release;

static void holder_job(struct exs_job *job)
{
    double t0 = it_now_ms();

    (void)job;
    __atomic_store_n(&holder_in, exs__engine_on_thread() ? 1 : 2, __ATOMIC_SEQ_CST);
    __atomic_store_n(&holder_entered, 1, __ATOMIC_SEQ_CST);
    /* keep the progress lock until the test thread looked (30 s at most) */
    while (!__atomic_load_n(&holder_release, __ATOMIC_SEQ_CST) && it_now_ms() - t0 < 30000)
        sched_yield();
}

/* The engine knows per thread whether it holds the progress lock (eng.holder, compared
 * with pthread_self: no thread-local variable): a job, which runs under the lock, is told
 * yes; the application thread, while that job holds it, is told no, and its busy drive
 * finds the lock taken (-EBUSY) instead of taking itself for a nested dispatch (0). */
START_TEST(test_holder_per_thread)
{
    struct exs_job job = {.fn = holder_job};
    double t0;
    int on, drove;

    it_init();
    __atomic_store_n(&holder_in, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&holder_entered, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&holder_release, 0, __ATOMIC_SEQ_CST);
    ck_assert_int_eq(exs__engine_on_thread(), 0);
    exs__engine_post(&job); /* the progress thread runs it: this thread drives not */
    t0 = it_now_ms();
    while (!__atomic_load_n(&holder_entered, __ATOMIC_SEQ_CST) && it_now_ms() - t0 < 30000)
        it_sleep_ms(1);
    ck_assert_msg(__atomic_load_n(&holder_entered, __ATOMIC_SEQ_CST), "the job never ran");
    on = exs__engine_on_thread();
    drove = exs__engine_drive(EXS_ENG_DRIVE_TRY);
    __atomic_store_n(&holder_release, 1, __ATOMIC_SEQ_CST);
    ck_assert_int_eq(__atomic_load_n(&holder_in, __ATOMIC_SEQ_CST), 1);
    ck_assert_int_eq(on, 0);
    ck_assert_int_eq(drove, -EBUSY);
    /* released: this thread's drive takes the lock, and then it is not held */
    t0 = it_now_ms();
    while (exs__engine_drive(EXS_ENG_DRIVE_TRY) == -EBUSY && it_now_ms() - t0 < 30000)
        it_sleep_ms(1);
    ck_assert_int_eq(exs__engine_on_thread(), 0);
}
END_TEST

/* ---- synchronous calls from several threads ---- */

#define SY_THREADS 4
#define SY_ROUNDS  100

struct sy_thread {
    struct it_pair p;
    struct it_buf *a, *b;
    int failed_round; /* -1: all good */
    int err;
    exs_event_t bad_ev;
};

static void *sy_main(void *arg)
{
    struct sy_thread *t = arg;

    t->failed_round = -1;
    for (int i = 0; i < SY_ROUNDS; i++) {
        size_t len = 64 + (size_t)i;
        exs_event_t ev;

        IT_EXPECT_OK(exs_recv(t->p.sfd, t->b->p, 4096, 0, t->p.sq, AH(i), t->b->mh));
        it_fill(t->a->p, len, (uint32_t)i);
        errno = 0;
        if (exs_send(t->p.cfd, t->a->p, len, 0, EXS_QHANDLE_INVALID, 0, t->a->mh) != (int)len) {
            t->err = errno;
            t->failed_round = i;
            break;
        }
        dq1(t->p.sq, &ev, "recv of a synchronous send");
        if (ev.exs_evt_u.exs_evt_xfer.exs_evt_result != (ssize_t)len ||
            it_check(t->b->p, len, (uint32_t)i) != -1) {
            t->bad_ev = ev;
            t->failed_round = i;
            break;
        }
    }
    return NULL;
}

/* Threads make synchronous sends at once; each thread's queue lives until it exits. */
START_TEST(test_sync_threads)
{
    struct sy_thread t[SY_THREADS];
    pthread_t th[SY_THREADS];
    int base;

    it_init();
    for (int i = 0; i < SY_THREADS; i++) {
        memset(&t[i], 0, sizeof(t[i]));
        it_pair_open(&t[i].p, SOCK_SEQPACKET, 64, 64);
        t[i].a = it_buf_new(4096, 1);
        t[i].b = it_buf_new(4096, 1);
    }
    base = exs__evq_private_live_count();
    it_watchdog_start(120, "synchronous sends from threads");
    for (int i = 0; i < SY_THREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, sy_main, &t[i]), 0);
    for (int i = 0; i < SY_THREADS; i++)
        pthread_join(th[i], NULL);
    it_watchdog_stop();
    for (int i = 0; i < SY_THREADS; i++)
        ck_assert_msg(t[i].failed_round < 0,
                      "thread %d failed in round %d: errno %d (%s); event %s errno %d result %zd",
                      i, t[i].failed_round, t[i].err, strerror(t[i].err),
                      it_evt_name(t[i].bad_ev.exs_evt_type), t[i].bad_ev.exs_evt_errno,
                      t[i].bad_ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
    ck_assert_msg(exs__evq_private_live_count() == base,
                  "%d synchronous-call queues left after their threads exited (baseline %d)",
                  exs__evq_private_live_count(), base);
    /* the main thread's queue: made once, reused, freed by exs_fini */
    for (int i = 0; i < 2; i++) {
        exs_event_t ev;

        IT_EXPECT_OK(exs_recv(t[0].p.sfd, t[0].b->p, 4096, 0, t[0].p.sq, AH(1000 + i), t[0].b->mh));
        ck_assert_int_eq(exs_send(t[0].p.cfd, t[0].a->p, 8, 0, EXS_QHANDLE_INVALID, 0, t[0].a->mh),
                         8);
        dq1(t[0].p.sq, &ev, "recv of a synchronous send");
    }
    ck_assert_int_eq(exs__evq_private_live_count(), base + 1);
    for (int i = 0; i < SY_THREADS; i++) {
        it_buf_free(t[i].a);
        it_buf_free(t[i].b);
        it_pair_close(&t[i].p);
    }
    it_fini();
    ck_assert_int_eq(exs__evq_private_live_count(), 0);
}
END_TEST

/* ---- EINTR from every sleeping mode ---- */

static void on_usr1(int sig)
{
    (void)sig;
}

struct kicker {
    pthread_t target;
    int stop; /* atomic */
};

static void *kicker_main(void *arg)
{
    struct kicker *k = arg;

    it_sleep_ms(100);
    while (!__atomic_load_n(&k->stop, __ATOMIC_ACQUIRE)) {
        pthread_kill(k->target, SIGUSR1);
        it_sleep_ms(50);
    }
    return NULL;
}

/* A sleeping wait (NOTIFY, or ADAPTIVE past its spin) ends with EINTR on a signal. */
START_TEST(test_sleep_eintr)
{
    struct sigaction sa = {.sa_handler = on_usr1}, old;
    struct kicker k = {.target = pthread_self()};
    int mode = _i ? EXS_WAIT_ADAPTIVE : EXS_WAIT_NOTIFY;
    exs_event_t ev;
    pthread_t th;
    exs_qhandle_t q;
    int r, e;

    it_init();
    q = it_qcreate(16);
    ck_assert_int_eq(exs_qsetwait(q, mode, 10), 0);
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGUSR1, &sa, &old), 0);
    ck_assert_int_eq(pthread_create(&th, NULL, kicker_main, &k), 0);
    r = exs_qdequeue(q, &ev, 1, &(struct timespec){30, 0});
    e = errno;
    __atomic_store_n(&k.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    sigaction(SIGUSR1, &old, NULL);
    ck_assert_msg(r == -1 && e == EINTR, "%s: %d errno %d (%s), expected -1 EINTR",
                  mode_names[mode == EXS_WAIT_NOTIFY ? 0 : 2], r, e, strerror(e));
    it_qdelete(q);
}
END_TEST

/* A busy wait (EXS_WAIT_POLL) with a deadline reads the clock only as often as the
 * deadline needs: a quarter of the time left at the speed of its last turns, not every 16
 * turns (a read is a system call in the TCG guest: 24 per 64 B message in bench-rxe's
 * profile). 200 ms with nothing to come: the reads stay far below the progress rounds
 * driven meanwhile, and the wait still ends at its deadline. */
START_TEST(test_poll_spin_clock)
{
    struct it_pair p;
    exs_event_t ev;
    uint64_t r0, r1, c0, c1;
    double t0, ms;
    int n;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_POLL); /* settle */
    r0 = eng_counter("rounds");
    t0 = it_now_ms();
    it_clock_count(1);
    c0 = it_clock_reads();
    n = exs_qdequeue(p.cq, &ev, 1, &(struct timespec){0, 200 * 1000 * 1000});
    c1 = it_clock_reads();
    it_clock_count(0);
    ms = it_now_ms() - t0;
    r1 = eng_counter("rounds");
    ck_assert_int_eq(n, 0);
    ck_assert_msg(ms >= 199.0, "the wait ended after %.1f ms, before its deadline", ms);
    ck_assert_msg(c1 - c0 <= (r1 - r0) / 64 + 40,
                  "%llu reads of the clock in a 200 ms busy wait of %llu progress rounds",
                  (unsigned long long)(c1 - c0), (unsigned long long)(r1 - r0));
    it_pair_close(&p);
}
END_TEST

/* An idle process's progress thread sleeps: once nothing is left, its drain ends in an arm
 * and the rounds stop. A provider may answer "call again" from turns that did not look at
 * everything (shm's busy turns read the descriptors every 64th idle turn) and 0 from the
 * one that did; the drain arms after the round that found nothing. When it waited for a
 * whole drive (8 rounds) that found nothing, it never armed over shm and spun forever
 * (every integ test over shm then timed out). Waits for 100 ms without a round, up to
 * IT_TIMEOUT_MS (keepalive and timers may run a round now and then). */
START_TEST(test_idle_loop_sleeps)
{
    struct it_pair p;
    double end;
    uint64_t r0, r1;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_NOTIFY);
    end = it_now_ms() + IT_TIMEOUT_MS;
    for (;;) {
        r0 = eng_counter("rounds");
        it_sleep_ms(100);
        r1 = eng_counter("rounds");
        if (r1 == r0)
            break;
        ck_assert_msg(it_now_ms() < end,
                      "the progress thread never slept: %llu rounds in the last 100 ms, still "
                      "at it after %d ms",
                      (unsigned long long)(r1 - r0), IT_TIMEOUT_MS);
    }
    pingpong(&p, 2, EXS_WAIT_NOTIFY); /* and wakes up again */
    it_pair_close(&p);
}
END_TEST

/* A data write no longer than the endpoint's max_inline goes inline (copied into the work
 * request: no DMA read of the buffer), a longer one does not; the data arrive either way
 * (pingpong checks them). Providers without inline sends skip. */
START_TEST(test_small_writes_inline)
{
    struct it_pair p;
    uint64_t w0 = 0, w1 = 0, w2 = 0;
    const int rounds = 8; /* pingpong's lengths 1 + 37 i: 1 .. 260, 4 of them <= 128 */

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    if (strcmp(it_provider, "tcp") && strcmp(it_provider, "shm") && strcmp(it_provider, "verbs")) {
        test_skip("test_small_writes_inline", "provider %s: inline sends not known", it_provider);
        it_pair_close(&p);
        return;
    }
    pingpong(&p, 1, EXS_WAIT_POLL); /* settle (the first round's ADVERTs) */
    ck_assert_int_eq(exs__counters_lookup("proto", "writes_inline", &w0), 0);
    pingpong(&p, rounds, EXS_WAIT_POLL);
    ck_assert_int_eq(exs__counters_lookup("proto", "writes_inline", &w1), 0);
    /* two messages a round, 4 rounds of <= 128 bytes */
    ck_assert_msg(w1 - w0 >= 8, "%llu inline writes for 8 messages of at most 128 bytes",
                  (unsigned long long)(w1 - w0));
    /* 4 KiB messages: none inline */
    {
        struct it_buf *a = it_buf_new(4096, 1), *b = it_buf_new(4096, 1);
        exs_event_t ev;

        IT_EXPECT_OK(exs_recv(p.sfd, b->p, 4096, 0, p.sq, AH(1), b->mh));
        it_fill(a->p, 4096, 77);
        IT_EXPECT_OK(exs_send(p.cfd, a->p, 4096, 0, p.cq, AH(2), a->mh));
        dq1(p.sq, &ev, "server recv 4 KiB");
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 4096);
        ck_assert_int_eq(it_check(b->p, 4096, 77), -1);
        dq1(p.cq, &ev, "client send 4 KiB");
        ck_assert_int_eq(exs__counters_lookup("proto", "writes_inline", &w2), 0);
        ck_assert_msg(w2 == w1, "a 4 KiB write went inline");
        it_buf_free(a);
        it_buf_free(b);
    }
    it_pair_close(&p);
}
END_TEST

/* Small sends of a ping-pong go unsignaled (spec/protocol.md §6.4): counted in proto's
 * sends_unsignaled, their events and data as always (pingpong checks them), nothing
 * failed; with EXS_SEND_UNSIGNALED=0 (loop 1) none does. A connection that can be cut
 * over (a tcp one beside shm, policy any) never does: those providers skip. */
START_TEST(test_small_sends_unsignaled)
{
    struct it_pair p;
    uint64_t u0 = 0, u1 = 0, f0 = 0, f1 = 0;
    int off = _i == 1;

    if (off)
        it_setenv("EXS_SEND_UNSIGNALED", "0");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    if (strcmp(it_provider, "tcp") && strcmp(it_provider, "shm") && strcmp(it_provider, "verbs")) {
        test_skip("test_small_sends_unsignaled", "provider %s: inline sends not known",
                  it_provider);
        it_pair_close(&p);
        return;
    }
    pingpong(&p, 1, EXS_WAIT_POLL); /* settle (the first round's ADVERTs) */
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u0), 0);
    ck_assert_int_eq(exs__counters_lookup("proto", "unsignaled_failed", &f0), 0);
    pingpong(&p, 16, EXS_WAIT_POLL);
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u1), 0);
    ck_assert_int_eq(exs__counters_lookup("proto", "unsignaled_failed", &f1), 0);
    ck_assert_uint_eq(f1, f0);
    if (off)
        ck_assert_msg(u1 == u0, "%llu unsignaled sends with EXS_SEND_UNSIGNALED=0",
                      (unsigned long long)(u1 - u0));
    else /* 32 messages, 8 of them longer than max_inline (128 here) */
        ck_assert_msg(u1 - u0 >= 16, "%llu unsignaled sends of 32 messages",
                      (unsigned long long)(u1 - u0));
    it_pair_close(&p);
}
END_TEST

/* The peer resets the connection while the client's last send went unsignaled (its
 * event came at the post, its write may still be on the way): the client's connection
 * ends (a receive fails), its close completes (the drain does not wait for a completion
 * that never comes), nothing leaks (it_fini). */
START_TEST(test_unsignaled_then_reset)
{
    struct it_pair p;
    struct it_buf *a;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    uint64_t u0 = 0, u1 = 0;
    exs_event_t ev;

    it_init();
    a = it_buf_new(64, 1);
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    pingpong(&p, 2, EXS_WAIT_POLL); /* the client's last receive armed it */
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u0), 0);
    it_fill(a->p, 64, 5);
    IT_EXPECT_OK(exs_send(p.cfd, a->p, 64, 0, p.cq, AH(900), a->mh));
    dq1(p.cq, &ev, "client send");
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(exs__counters_lookup("proto", "sends_unsignaled", &u1), 0);
    if (!strcmp(it_provider, "tcp") || !strcmp(it_provider, "shm"))
        ck_assert_msg(u1 > u0, "the send after an answer was not unsignaled");
    ck_assert_int_eq(exs_setsockopt(p.sfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    it_close_at(p.sfd, p.sq, __FILE__, __LINE__);
    p.sfd = -1;
    IT_EXPECT_OK(exs_recv(p.cfd, a->p, 64, 0, p.cq, AH(901), a->mh));
    dq1(p.cq, &ev, "client recv after the reset");
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
    ck_assert_msg(ev.exs_evt_errno != 0 || ev.exs_evt_u.exs_evt_xfer.exs_evt_result == 0,
                  "receive after the peer's reset: errno %d result %zd", ev.exs_evt_errno,
                  ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
    it_buf_free(a);
    it_pair_close(&p);
}
END_TEST

Suite *integ_progress_suite(void)
{
    Suite *s = suite_create("integ_progress");

    it_suite_add(s, "waiter_drives", IT_CASE_TIMEOUT, 3,
                 (const TTest *const[]){test_waiter_drives, NULL});
    it_suite_add(s, "notify_arm_drives", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_notify_arm_drives, NULL});
    it_suite_add(s, "notify_wait_holds", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_notify_wait_holds, NULL});
    it_suite_add(s, "fd_writes", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_poll_no_fd_writes, NULL});
    it_suite_add(s, "round_hands_cqes", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_round_hands_cqes, NULL});
    it_suite_add(s, "notify_disarms", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_notify_disarms, NULL});
    it_suite_add(s, "qfd_late", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_qfd_late, NULL});
    it_suite_add(
        s, "computing", IT_CASE_TIMEOUT, 1,
        (const TTest *const[]){test_progress_while_computing, test_idle_wait_then_compute, NULL});
    it_suite_add(s, "many_waiters", 2 * IT_CASE_TIMEOUT + 60, 3,
                 (const TTest *const[]){test_many_waiters, NULL});
    it_suite_add(s, "holder", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_holder_per_thread, NULL});
    it_suite_add(s, "wake_by_job", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_wake_by_job, NULL});
    it_suite_add(s, "sync_threads", 2 * IT_CASE_TIMEOUT + 60, 1,
                 (const TTest *const[]){test_sync_threads, NULL});
    it_suite_add(s, "sleep_eintr", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_sleep_eintr, NULL});
    it_suite_add(s, "idle_sleeps", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_idle_loop_sleeps, NULL});
    it_suite_add(s, "speed", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_poll_spin_clock, test_small_writes_inline, NULL});
    it_suite_add(s, "unsignaled", IT_CASE_TIMEOUT, 2,
                 (const TTest *const[]){test_small_sends_unsignaled, NULL});
    it_suite_add(s, "unsignaled_reset", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_unsignaled_then_reset, NULL});
    return s;
}
