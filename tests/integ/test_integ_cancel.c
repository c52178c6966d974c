/* SPDX-License-Identifier: MIT */
/* Thread cancellation inside the library (spec/threading.md §9), beyond integ_attack's
 * cancel_* cases: a threshold sleeper cancelled (its waiter entry and queue reference
 * given back by the sleep's cleanup handler), and a synchronous exs_poll, which is no
 * cancellation point (its request names the caller's array). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tests/integ/integ.h"

/* Wait until thread *tid_p (set by the thread, atomic) is asleep in ppoll. */
static void cancel_wait_ppoll(const int *tid_p, const char *what)
{
    double end = it_now_ms() + IT_TIMEOUT_MS;
    int tid;

    while (!(tid = __atomic_load_n(tid_p, __ATOMIC_ACQUIRE)) ||
           it_thread_syscall(getpid(), tid) != SYS_ppoll) {
        ck_assert_msg(it_now_ms() < end, "%s never slept in ppoll", what);
        it_sleep_ms(1);
    }
}

/* The threads' state, on the heap: a cancelled thread's frame keeps ASan's redzones
 * (google/sanitizers#1399), so the thread functions take no local's address. */
struct cancel_thr {
    exs_qhandle_t q;
    int tid;  /* atomic */
    int done; /* atomic: the call returned */
    int ret;
    exs_event_t ev[2];
    exs_pollfd_t pfd;
};

static void *threshold_fn(void *arg)
{
    struct cancel_thr *c = arg;

    __atomic_store_n(&c->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
    c->ret = exs_qdequeue(c->q, c->ev, -2, NULL);
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/*
 * A thread asleep in a threshold wait (nevents -2: a registered waiter and the queue's
 * threshold descriptor) is cancelled: it ends there (the sleep is a cancellation point),
 * and the cleanup handler gives back its waiter entry, its sleeper count, the arm, the
 * driver count and the queue's reference: another threshold wait on the queue then gets
 * both events, and the queue is deleted with nothing left (the teardown's leak check).
 * Fails without the handler: the queue's reference stays (exs__debug_live_objects() == 1
 * at the teardown) and the engine counts the dead thread as a driver.
 */
START_TEST(test_cancel_threshold_sleeper)
{
    struct cancel_thr *c = calloc(1, sizeof(*c));
    struct it_buf *sb, *rb[2];
    exs_event_t ev[2];
    struct it_pair p;
    pthread_t t;
    void *ret = NULL;

    ck_assert_ptr_nonnull(c);
    it_init();
    sb = it_buf_new(64, 1);
    rb[0] = it_buf_new(64, 1);
    rb[1] = it_buf_new(64, 1);
    it_pair_open(&p, SOCK_SEQPACKET, 8, 8);
    c->q = it_qcreate(4);
    IT_EXPECT_OK(exs_qsetwait(c->q, EXS_WAIT_NOTIFY, 0));
    ck_assert_int_eq(pthread_create(&t, NULL, threshold_fn, c), 0);
    cancel_wait_ppoll(&c->tid, "the threshold waiter");
    ck_assert_int_eq(pthread_cancel(t), 0);
    ck_assert_msg(it_join_within(t, IT_TIMEOUT_MS, &ret), "the sleeping wait was not cancelled");
    ck_assert_ptr_eq(ret, PTHREAD_CANCELED);
    ck_assert_int_eq(__atomic_load_n(&c->done, __ATOMIC_ACQUIRE), 0);
    /* two receives on the queue, two messages: one threshold wait takes both */
    it_fill(sb->p, 64, 61);
    for (int i = 0; i < 2; i++)
        IT_POST_RECV(p.sfd, rb[i]->p, 64, c->q, IT_AH(10 + i), rb[i]->mh);
    for (int i = 0; i < 2; i++) {
        IT_POST_SEND(p.cfd, sb->p, 64, p.cq, IT_AH(20 + i), sb->mh);
        it_expect_send(p.cq, p.cfd, IT_AH(20 + i), 64);
    }
    ck_assert_int_eq(exs_qdequeue(c->q, ev, -2, &(struct timespec){IT_TIMEOUT_MS / 1000, 0}), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(ev[i].exs_evt_type, EXS_EVT_RECV);
        ck_assert_int_eq(ev[i].exs_evt_errno, 0);
        ck_assert_int_eq(it_check(rb[i]->p, 64, 61), -1);
    }
    it_qdelete(c->q);
    it_buf_free(sb);
    it_buf_free(rb[0]);
    it_buf_free(rb[1]);
    it_pair_close(&p);
    free(c);
}
END_TEST

static void *sync_poll_fn(void *arg)
{
    struct cancel_thr *c = arg;

    __atomic_store_n(&c->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
    c->ret = exs_poll(&c->pfd, 1, -1, EXS_QHANDLE_INVALID, NULL);
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    pthread_testcancel(); /* where the pending cancel acts */
    return NULL;
}

/*
 * A synchronous exs_poll on a libexs socket, asleep (its wait's ppoll), is cancelled: it
 * is no cancellation point, so it returns when the socket becomes readable (1, POLLIN),
 * and the cancel acts at the thread's own pthread_testcancel after it. Fails without the
 * synchronous wait's cancellation off: the cancel acts in the wait, the call never returns
 * (done stays 0) and its request is left naming the dead thread's array.
 */
START_TEST(test_cancel_sync_poll)
{
    struct cancel_thr *c = calloc(1, sizeof(*c));
    struct it_buf *sb, *rb;
    struct it_pair p;
    pthread_t t;
    void *ret = NULL;

    ck_assert_ptr_nonnull(c);
    it_init();
    sb = it_buf_new(64, 1);
    rb = it_buf_new(64, 1);
    it_pair_open(&p, SOCK_SEQPACKET, 8, 8);
    c->pfd.fd = p.sfd;
    c->pfd.events = POLLIN;
    ck_assert_int_eq(pthread_create(&t, NULL, sync_poll_fn, c), 0);
    cancel_wait_ppoll(&c->tid, "the synchronous exs_poll");
    ck_assert_int_eq(pthread_cancel(t), 0);
    it_fill(sb->p, 64, 62);
    IT_POST_SEND(p.cfd, sb->p, 64, p.cq, IT_AH(1), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(1), 64);
    ck_assert_msg(it_join_within(t, IT_TIMEOUT_MS, &ret), "the polling thread never ended");
    ck_assert_ptr_eq(ret, PTHREAD_CANCELED);
    ck_assert_msg(__atomic_load_n(&c->done, __ATOMIC_ACQUIRE) == 1,
                  "the synchronous exs_poll was cancelled inside the library");
    ck_assert_int_eq(c->ret, 1);
    ck_assert(c->pfd.revents & POLLIN);
    IT_POST_RECV(p.sfd, rb->p, 64, p.sq, IT_AH(2), rb->mh);
    it_expect_recv(p.sq, p.sfd, IT_AH(2), 64, 0);
    ck_assert_int_eq(it_check(rb->p, 64, 62), -1);
    it_buf_free(sb);
    it_buf_free(rb);
    it_pair_close(&p);
    free(c);
}
END_TEST

Suite *integ_cancel_suite(void)
{
    Suite *s = suite_create("integ_cancel");

    it_suite_add(s, "threshold", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_cancel_threshold_sleeper, NULL});
    it_suite_add(s, "sync_poll", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_cancel_sync_poll, NULL});
    return s;
}
