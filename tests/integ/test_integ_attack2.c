/* SPDX-License-Identifier: MIT */
/* Attack review of session 25 (issue 28's fast paths): one event queue shared by several
 * posting and taking threads (the queue's lock, the engine's rounds handing completions
 * straight from the provider), and a socket closed while another thread sends on it (the
 * send's single look-up of its socket). Each checks what the contract promises: every
 * operation's event exactly once, the bytes where they belong, nothing left behind. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <time.h>
#include <unistd.h>

#include "tests/integ/integ.h"

/* ---- one queue, two posters, two takers ---- */

#define MQ_PAIRS  2
#define MQ_N      1500u /* messages per pair */
#define MQ_WIN    24u   /* a poster's messages not yet received, at most */
#define MQ_LEN    200u
#define MQ_TAKERS 2

/* ahandle of pair p's message i: its send (kind 0) or its receive (kind 1) */
#define MQ_AH(p, kind, i) IT_AH(((unsigned long)(p) << 24) | ((unsigned long)(kind) << 23) | (i))

struct mq {
    exs_qhandle_t q; /* the shared queue: every data event of both pairs */
    struct it_pair pair[MQ_PAIRS];
    struct it_buf *sb[MQ_PAIRS], *rb[MQ_PAIRS];
    uint8_t seen[MQ_PAIRS][2][MQ_N]; /* atomic: events taken per operation */
    uint32_t recvd[MQ_PAIRS];        /* atomic: receive events taken */
    uint32_t taken;                  /* atomic: events taken in all */
    int stop;                        /* atomic: the takers stop */
    int bad;                         /* atomic: the first inconsistency (below) */
    char why[160];
};

static void mq_bad(struct mq *m, const char *fmt, long a, long b)
{
    if (__atomic_exchange_n(&m->bad, 1, __ATOMIC_ACQ_REL) == 0)
        snprintf(m->why, sizeof(m->why), fmt, a, b);
}

struct mq_poster {
    struct mq *m;
    int p;
    int err;
};

/* Pair p's MQ_N messages, MQ_WIN at most ahead of their receives: a receive then its send,
 * both on the shared queue. */
static void *mq_post(void *arg)
{
    struct mq_poster *a = arg;
    struct mq *m = a->m;
    struct it_pair *pr = &m->pair[a->p];

    for (uint32_t i = 0; i < MQ_N && !a->err; i++) {
        double t0 = it_now_ms();

        while (i >= MQ_WIN + __atomic_load_n(&m->recvd[a->p], __ATOMIC_ACQUIRE)) {
            if (it_now_ms() - t0 > IT_TIMEOUT_MS || __atomic_load_n(&m->bad, __ATOMIC_ACQUIRE)) {
                a->err = ETIMEDOUT;
                return NULL;
            }
            sched_yield();
        }
        if (exs_recv(pr->sfd, m->rb[a->p]->p + (size_t)i * MQ_LEN, MQ_LEN, 0, m->q,
                     MQ_AH(a->p, 1, i), m->rb[a->p]->mh) ||
            exs_send(pr->cfd, m->sb[a->p]->p + (size_t)i * MQ_LEN, MQ_LEN, 0, m->q,
                     MQ_AH(a->p, 0, i), m->sb[a->p]->mh))
            a->err = errno ? errno : EIO;
    }
    return NULL;
}

/* Takes events off the shared queue until told to stop: taker 0 sleeps in the library
 * (a timeout: the queue has a sleeper, posts take the locked way), taker 1 never waits
 * (timeout 0: exs_qdequeue's trylock). Each event is recorded once, checked. */
static void *mq_take(void *arg)
{
    struct mq *m = ((void **)arg)[0];
    long who = (long)(uintptr_t)((void **)arg)[1];
    struct timespec ts = {0, who ? 0 : 5 * 1000 * 1000};
    exs_event_t ev[8];

    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        int n = exs_qdequeue(m->q, ev, 8, &ts);

        if (n < 0) {
            mq_bad(m, "exs_qdequeue: %ld (errno %ld)", n, errno);
            return NULL;
        }
        for (int k = 0; k < n; k++) {
            long ah = IT_AHN(ev[k].exs_evt_ahandle);
            long p = ah >> 24, kind = (ah >> 23) & 1, i = ah & 0x7fffff;

            if (p >= MQ_PAIRS || i >= (long)MQ_N ||
                ev[k].exs_evt_type != (kind ? EXS_EVT_RECV : EXS_EVT_SEND)) {
                mq_bad(m, "a foreign event: ahandle %#lx type %ld", ah, ev[k].exs_evt_type);
                continue;
            }
            if (ev[k].exs_evt_errno || ev[k].exs_evt_u.exs_evt_xfer.exs_evt_result != MQ_LEN) {
                mq_bad(m, "event %#lx failed: result %ld", ah,
                       (long)ev[k].exs_evt_u.exs_evt_xfer.exs_evt_result);
                continue;
            }
            if (__atomic_add_fetch(&m->seen[p][kind][i], 1, __ATOMIC_ACQ_REL) != 1)
                mq_bad(m, "event %#lx taken twice (%ld)", ah, 2);
            if (kind)
                __atomic_add_fetch(&m->recvd[p], 1, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&m->taken, 1, __ATOMIC_ACQ_REL);
        }
    }
    return NULL;
}

/*
 * Two pairs (SEQPACKET) whose every data operation names one queue; a poster thread per
 * pair (a receive, then its send, MQ_WIN ahead at most) and two takers (one sleeping in
 * exs_qdequeue with a timeout, one polling with timeout 0) on that queue at once: each
 * of the 2 x 2 x MQ_N events is taken exactly once, none fails or is foreign, within a
 * deadline; each receive holds its own message (receives complete in posting order on
 * a connection). The queue's lock, its lock-free reservations and the engine's handing
 * of completions are all contended here.
 */
START_TEST(test_mpmc_shared_queue)
{
    static struct mq m;
    struct mq_poster po[MQ_PAIRS];
    pthread_t tp[MQ_PAIRS], tt[MQ_TAKERS];
    void *targ[MQ_TAKERS][2];
    const uint32_t want = MQ_PAIRS * 2 * MQ_N;
    double t0;

    memset(&m, 0, sizeof(m));
    it_init();
    m.q = it_qcreate(4 * MQ_PAIRS * MQ_WIN + 64);
    for (int p = 0; p < MQ_PAIRS; p++) {
        it_pair_open(&m.pair[p], SOCK_SEQPACKET, 16, 16);
        m.sb[p] = it_buf_new((size_t)MQ_N * MQ_LEN, 1);
        m.rb[p] = it_buf_new((size_t)MQ_N * MQ_LEN, 1);
        it_fill(m.sb[p]->p, (size_t)MQ_N * MQ_LEN, 40 + (uint32_t)p);
        memset(m.rb[p]->p, 0, (size_t)MQ_N * MQ_LEN);
    }
    for (long k = 0; k < MQ_TAKERS; k++) {
        targ[k][0] = &m;
        targ[k][1] = (void *)(uintptr_t)k;
        ck_assert_int_eq(pthread_create(&tt[k], NULL, mq_take, targ[k]), 0);
    }
    for (int p = 0; p < MQ_PAIRS; p++) {
        po[p] = (struct mq_poster){.m = &m, .p = p};
        ck_assert_int_eq(pthread_create(&tp[p], NULL, mq_post, &po[p]), 0);
    }
    for (int p = 0; p < MQ_PAIRS; p++)
        ck_assert_int_eq(it_join_within(tp[p], 4 * IT_TIMEOUT_MS, NULL), 1);
    t0 = it_now_ms();
    while (__atomic_load_n(&m.taken, __ATOMIC_ACQUIRE) < want &&
           !__atomic_load_n(&m.bad, __ATOMIC_ACQUIRE) && it_now_ms() - t0 < IT_TIMEOUT_MS)
        it_sleep_ms(1);
    __atomic_store_n(&m.stop, 1, __ATOMIC_RELEASE);
    for (int k = 0; k < MQ_TAKERS; k++)
        ck_assert_int_eq(it_join_within(tt[k], IT_TIMEOUT_MS, NULL), 1);
    ck_assert_msg(!m.bad, "%s", m.why);
    for (int p = 0; p < MQ_PAIRS; p++)
        ck_assert_msg(po[p].err == 0, "poster %d: %s", p, strerror(po[p].err));
    ck_assert_uint_eq(m.taken, want);
    for (int p = 0; p < MQ_PAIRS; p++) {
        for (uint32_t i = 0; i < MQ_N; i++)
            ck_assert_msg(m.seen[p][0][i] == 1 && m.seen[p][1][i] == 1,
                          "pair %d message %u: send taken %u times, receive %u", p, i,
                          m.seen[p][0][i], m.seen[p][1][i]);
        ck_assert_int_eq(it_check(m.rb[p]->p, (size_t)MQ_N * MQ_LEN, 40 + (uint32_t)p), -1);
        ck_assert(it_buf_guards_ok(m.rb[p]));
        it_pair_close(&m.pair[p]);
        it_buf_free(m.sb[p]);
        it_buf_free(m.rb[p]);
    }
    it_expect_no_event(m.q, 0);
    it_qdelete(m.q);
}
END_TEST

/* ---- close while another thread sends ---- */

#define CS_LEN 64u
#define CS_MAX 200000u

/* Sends outstanding on the client's queue (depth 64) at most once the close is due. */
#define CS_ROOM 48u

struct cs {
    struct it_pair *p;
    struct it_buf *b;
    uint32_t posted; /* atomic: sends accepted (exs_send 0) */
    uint32_t taken;  /* atomic: their events taken (cs_take) */
    int close_due;   /* atomic: the close found the queue full (EAGAIN) */
    int err;         /* errno of the first refused send */
};

/* Small sends on cfd (copied at their post: each event at once) until one is refused for
 * another reason than a full queue (EAGAIN: the same send again). Once the close found the
 * queue full, the sender leaves it room (no more than CS_ROOM outstanding: it still sends
 * while the close is posted), or on a loaded host it may refill every slot the test's
 * thread frees before the close's next try, for all of CS_MAX sends. */
static void *cs_send(void *arg)
{
    struct cs *c = arg;

    for (uint32_t i = 0; i < CS_MAX;) {
        if (__atomic_load_n(&c->close_due, __ATOMIC_ACQUIRE) &&
            i - __atomic_load_n(&c->taken, __ATOMIC_ACQUIRE) >= CS_ROOM) {
            sched_yield();
            continue;
        }
        if (exs_send(c->p->cfd, c->b->p + (i % 64) * CS_LEN, CS_LEN, 0, c->p->cq, IT_AH(i + 1),
                     c->b->mh)) {
            if (errno == EAGAIN) {
                sched_yield();
                continue;
            }
            c->err = errno;
            return NULL;
        }
        __atomic_store_n(&c->posted, ++i, __ATOMIC_RELEASE);
    }
    c->err = -1; /* never refused */
    return NULL;
}

#define CS_RX ((size_t)256 * 1024)
static const struct timespec cs_now = {0, 0}; /* a look, no wait */
static struct cs *cs_cur;                     /* (the round's, for messages) */
static size_t *cs_got;
static uint32_t cs_ok; /* send events without error: the first ones (spec/api.md §8) */
static double cs_t0;

/* The receiving side: one receive of CS_RX outstanding on sfd, posted again when it
 * completes with bytes (their count into *got); *eof once the stream's end came. */
static void cs_recv(struct it_pair *p, struct it_buf *rb, size_t *got, int *eof, int *armed)
{
    exs_event_t ev;

    while (*armed && exs_qdequeue(p->sq, &ev, 1, &cs_now) == 1) {
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        *armed = 0;
        if (ev.exs_evt_u.exs_evt_xfer.exs_evt_result == 0)
            *eof = 1;
        *got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    if (!*armed && !*eof) {
        IT_POST_RECV(p->sfd, rb->p, CS_RX, p->sq, IT_AH(0x4EC), rb->mh);
        *armed = 1;
    }
}

/* The client queue's events now (no wait): sends in posting order, the close's once. */
static void cs_take(struct it_pair *p, int round, uint32_t *events, int *closed)
{
    exs_event_t ev;

    while (exs_qdequeue(p->cq, &ev, 1, &cs_now) == 1) {
        if (ev.exs_evt_type == EXS_EVT_CLOSE) {
            ck_assert(ev.exs_evt_ahandle == IT_AH(0xC105E));
            ck_assert_msg(ev.exs_evt_errno == 0, "round %d: close: %s after %u sends (%u events)",
                          round, strerror(ev.exs_evt_errno),
                          __atomic_load_n(&cs_cur->posted, __ATOMIC_ACQUIRE), *events);
            ck_assert_int_eq(++*closed, 1);
            continue;
        }
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SEND);
        ck_assert_msg(IT_AHN(ev.exs_evt_ahandle) == (long)*events + 1,
                      "round %d: send event %ld where %u was due", round,
                      IT_AHN(ev.exs_evt_ahandle), *events + 1);
        /* a send still outstanding at the close (not finished at its post: the send
         * buffer was full) completes with ECANCELED, in posting order: after every send
         * that completed, never before one (spec/api.md §8, Closing a connected socket) */
        ck_assert_msg(
            ev.exs_evt_errno == 0 ? cs_ok == *events : ev.exs_evt_errno == ECANCELED,
            "round %d: send %u of %u accepted: %s (result %ld) after %u without error, close "
            "%d, got %zu, %.0f ms",
            round, *events + 1, __atomic_load_n(&cs_cur->posted, __ATOMIC_ACQUIRE),
            strerror(ev.exs_evt_errno), (long)ev.exs_evt_u.exs_evt_xfer.exs_evt_result, cs_ok,
            *closed, *cs_got, it_now_ms() - cs_t0);
        cs_ok += ev.exs_evt_errno == 0;
        ++*events;
        __atomic_store_n(&cs_cur->taken, *events, __ATOMIC_RELEASE);
    }
}

/*
 * A STREAM socket closed by one thread while another sends small messages on it (each
 * copied at its post: exs_send finds the socket once and finishes there; a full queue's
 * EAGAIN is retried): the sender's sends are refused from some point on (EBADF: the
 * descriptor is gone; ENOTSOCK: its number reused by a descriptor that is no socket), every send
 * that was accepted has exactly one SEND event, in posting order, without error but for a tail of
 * ECANCELED (sends still outstanding at the close: the send buffer was full), and the completed
 * ones' bytes arrive (the peer reads the stream to its end: every completed send's bytes, at most
 * every accepted send's), the CLOSE event comes once, and nothing is left (it_pair_close: no stray
 * event, the queues deleted). Repeated with the close at different points.
 */
START_TEST(test_close_during_sends)
{
    it_init();
    for (int round = 0; round < 8; round++) {
        struct it_pair p;
        struct cs c = {0};
        struct it_buf *rb = it_buf_new(CS_RX, 1);
        pthread_t th;
        uint32_t events = 0;
        int closed = 0, close_posted = 0, eof = 0, armed = 0;
        size_t got = 0;
        double t0 = it_now_ms();

        it_pair_open(&p, SOCK_STREAM, 64, 64);
        c.p = &p;
        c.b = it_buf_new(64 * CS_LEN, 1);
        cs_cur = &c;
        cs_got = &got;
        cs_ok = 0;
        cs_t0 = t0;
        ck_assert_int_eq(pthread_create(&th, NULL, cs_send, &c), 0);
        /* the close lands at a different point each round */
        while (!close_posted) {
            ck_assert_msg(it_now_ms() - t0 < IT_TIMEOUT_MS, "round %d: no close", round);
            cs_take(&p, round, &events, &closed);
            cs_recv(&p, rb, &got, &eof, &armed);
            if (__atomic_load_n(&c.posted, __ATOMIC_ACQUIRE) < 16u * (uint32_t)(round + 1))
                continue;
            if (exs_close(p.cfd, p.cq, IT_AH(0xC105E)) == 0) {
                close_posted = 1;
            } else {
                ck_assert_int_eq(errno, EAGAIN);
                __atomic_store_n(&c.close_due, 1, __ATOMIC_RELEASE);
            }
        }
        while (!it_join_within(th, 1, NULL)) {
            ck_assert_msg(it_now_ms() - t0 < IT_TIMEOUT_MS, "round %d: sender stuck", round);
            cs_take(&p, round, &events, &closed);
            cs_recv(&p, rb, &got, &eof, &armed);
        }
        /* EBADF; ENOTSOCK once the number was given to a descriptor the library opened
         * meanwhile (an eventfd: numbers are reused, as close(2)'s are) */
        ck_assert_msg(c.err == EBADF || c.err == ENOTSOCK,
                      "round %d: the sender's sends ended with %d (%s)", round, c.err,
                      c.err > 0 ? strerror(c.err) : "never refused");
        while (events < c.posted || !closed || !eof) {
            ck_assert_msg(it_now_ms() - t0 < IT_TIMEOUT_MS,
                          "round %d: %u of %u send events, close %d, %zu bytes, eof %d", round,
                          events, c.posted, closed, got, eof);
            cs_take(&p, round, &events, &closed);
            cs_recv(&p, rb, &got, &eof, &armed);
            sched_yield();
        }
        ck_assert_uint_eq(events, c.posted);
        /* every completed send's bytes, and at most every accepted one's (a cancelled
         * send may have been written, in part too, before the close) */
        ck_assert_uint_ge(got, (size_t)cs_ok * CS_LEN);
        ck_assert_uint_le(got, (size_t)c.posted * CS_LEN);
        it_buf_free(rb);
        p.cfd = -1;
        it_pair_close(&p);
        it_buf_free(c.b);
    }
}
END_TEST

Suite *integ_attack2_suite(void)
{
    Suite *s = suite_create("integ_attack2");

    it_suite_add(s, "mpmc", IT_CASE_TIMEOUT * 2, 1,
                 (const TTest *const[]){test_mpmc_shared_queue, NULL});
    it_suite_add(s, "close_sending", IT_CASE_TIMEOUT * 2, 1,
                 (const TTest *const[]){test_close_during_sends, NULL});
    return s;
}
