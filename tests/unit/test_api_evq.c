/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/api/evq.c: handles, reservations, exs_qdequeue's forms, waits and threads. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include "exs/api/evq.h"
#include "exs/api/evq_int.h"
#include "exs/util/lite_lock.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/unit/unit.h"

static const int wait_modes[] = {EXS_WAIT_NOTIFY, EXS_WAIT_POLL, EXS_WAIT_ADAPTIVE};

#define ASSERT_NO_QUEUES() ck_assert_int_eq(exs__evq_live_count(), 0)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static uint64_t elapsed_ms(uint64_t start_ns)
{
    return (exs__now_ns() - start_ns) / 1000000u;
}

/* Reserve and post one event whose fd and ahandle identify it. */
static void post_one(exs_qhandle_t q, int fd, intptr_t tag)
{
    struct exs_evq *evq;
    exs_event_t ev;

    ck_assert_int_eq(exs__evq_get(q, &evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    memset(&ev, 0, sizeof(ev));
    ev.exs_evt_type = EXS_EVT_SEND;
    ev.exs_evt_fd = fd;
    ev.exs_evt_ahandle = (exs_ahandle_t)tag;
    exs__evq_post(evq, &ev);
    exs__evq_put(evq);
}

static int qfd_readable(exs_qhandle_t q)
{
    struct pollfd pfd = {.fd = exs_qfd(q), .events = POLLIN};

    ck_assert_int_ge(pfd.fd, 0);
    ck_assert_int_ge(poll(&pfd, 1, 0), 0);
    return (pfd.revents & POLLIN) != 0;
}

static const struct timespec ts_zero = {0, 0};

/* ---- handles ---- */

START_TEST(test_create_delete)
{
    exs_qhandle_t a = exs_qcreate(1), b = exs_qcreate(16);

    ck_assert_int_gt(a, 0);
    ck_assert_int_gt(b, 0);
    ck_assert_int_ne(a, b);
    ck_assert_int_eq(exs__evq_live_count(), 2);
    ck_assert_int_eq(exs_qdelete(a), 0);
    ck_assert_int_eq(exs__evq_live_count(), 1);
    ck_assert_int_eq(exs_qdelete(b), 0);
    errno = 0;
    ck_assert_int_eq(exs_qdelete(a), -1);
    ck_assert_int_eq(errno, EINVAL);
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_bad_depth)
{
    static const int bad[] = {0, -1, INT_MIN, (1 << 20) + 1, INT_MAX};
    exs_qhandle_t q;

    for (size_t i = 0; i < EXS_ARRAY_SIZE(bad); i++) {
        errno = 0;
        ck_assert_int_eq(exs_qcreate(bad[i]), EXS_QHANDLE_INVALID);
        ck_assert_int_eq(errno, EINVAL);
    }
    /* The largest depth is accepted (the ring is allocated, not touched). */
    q = exs_qcreate(1 << 20);
    ck_assert_int_gt(q, 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_bad_handles)
{
    static const exs_qhandle_t bad[] = {
        EXS_QHANDLE_INVALID, 0, -2, 1, 2, 12345, 0x10001, INT_MAX, INT_MIN};
    struct exs_evq *evq = NULL;
    exs_event_t ev;

    for (size_t i = 0; i < EXS_ARRAY_SIZE(bad); i++) {
        errno = 0;
        ck_assert_int_eq(exs_qdelete(bad[i]), -1);
        ck_assert_int_eq(errno, EINVAL);
        errno = 0;
        ck_assert_int_eq(exs_qfd(bad[i]), -1);
        ck_assert_int_eq(errno, EINVAL);
        errno = 0;
        ck_assert_int_eq(exs_qsetwait(bad[i], EXS_WAIT_NOTIFY, 0), -1);
        ck_assert_int_eq(errno, EINVAL);
        errno = 0;
        ck_assert_int_eq(exs_qdequeue(bad[i], &ev, 1, &ts_zero), -1);
        ck_assert_int_eq(errno, EINVAL);
        errno = 0;
        ck_assert_int_eq(exs_qdequeue(bad[i], &ev, 0, NULL), -1);
        ck_assert_int_eq(errno, EINVAL);
        ck_assert_int_eq(exs__evq_get(bad[i], &evq), -EINVAL);
        ck_assert_ptr_null(evq);
    }
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_stale_handle)
{
    exs_qhandle_t old = exs_qcreate(4), q, seen[200];
    exs_event_t ev;

    ck_assert_int_gt(old, 0);
    ck_assert_int_eq(exs_qdelete(old), 0);
    /* A stale handle never reaches a newer queue, even one in the same table slot. */
    for (int i = 0; i < 200; i++) {
        q = exs_qcreate(4);
        ck_assert_int_gt(q, 0);
        ck_assert_int_ne(q, old);
        for (int j = 0; j < i; j++)
            ck_assert_int_ne(q, seen[j]);
        seen[i] = q;
        post_one(q, 1, 1);
        errno = 0;
        ck_assert_int_eq(exs_qdequeue(old, &ev, 1, &ts_zero), -1);
        ck_assert_int_eq(errno, EINVAL);
        ck_assert_int_eq(exs_qdelete(old), -1);
        ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &ts_zero), 1);
        ck_assert_int_eq(exs_qdelete(q), 0);
        old = q;
    }
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_destroy_all)
{
    exs_qhandle_t a = exs_qcreate(2), b = exs_qcreate(2), c;
    struct exs_evq *evq;
    exs_event_t ev;

    memset(&ev, 0, sizeof(ev));
    ck_assert_int_eq(exs__evq_get(b, &evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    exs__evq_put(evq);
    post_one(a, 3, 3);
    exs__log_level = EXS_LOG_ERR; /* the warning about b is expected */
    exs__evq_destroy_all();
    /* b survives until its outstanding operation delivers (the event is dropped). */
    ck_assert_int_eq(exs__evq_live_count(), 1);
    ck_assert_int_eq(exs_qdelete(a), -1);
    ck_assert_int_eq(exs_qfd(b), -1);
    exs__evq_post(evq, &ev);
    ASSERT_NO_QUEUES();
    /* The table works again and old handles stay invalid. */
    c = exs_qcreate(2);
    ck_assert_int_gt(c, 0);
    ck_assert_int_ne(c, a);
    ck_assert_int_ne(c, b);
    ck_assert_int_eq(exs_qfd(a), -1);
    ck_assert_int_eq(exs_qdelete(c), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* ---- reservation ---- */

START_TEST(test_reserve_depth)
{
    exs_qhandle_t q = exs_qcreate(4);
    struct exs_evq *evq;
    exs_event_t ev[4];

    ck_assert_int_eq(exs__evq_get(q, &evq), 0);
    ck_assert_int_eq(exs__evq_handle(evq), q);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(exs__evq_reserve(evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), -EAGAIN);
    /* Unreserve returns the slot. */
    exs__evq_unreserve(evq);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), -EAGAIN);
    /* Posting moves a slot from reserved to queued: still full. */
    memset(ev, 0, sizeof(ev));
    exs__evq_post(evq, &ev[0]);
    exs__evq_post(evq, &ev[0]);
    ck_assert_int_eq(exs__evq_reserve(evq), -EAGAIN);
    /* Dequeuing frees the slot. */
    ck_assert_int_eq(exs_qdequeue(q, ev, 1, &ts_zero), 1);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), -EAGAIN);
    for (int i = 0; i < 3; i++)
        exs__evq_unreserve(evq);
    ck_assert_int_eq(exs_qdequeue(q, ev, 4, &ts_zero), 1);
    exs__evq_put(evq);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* exs__evq_ops_live (the leak checks' count of operations) is the queues' reserved slots
 * summed: a slot counts from its reservation until its event is queued or it is given
 * back, in every queue of the table. */
START_TEST(test_ops_live)
{
    exs_qhandle_t q1 = exs_qcreate(4), q2 = exs_qcreate(4);
    struct exs_evq *e1, *e2;
    exs_event_t ev;

    ck_assert_int_eq(exs__evq_ops_live(), 0);
    ck_assert_int_eq(exs__evq_get(q1, &e1), 0);
    ck_assert_int_eq(exs__evq_get(q2, &e2), 0);
    ck_assert_int_eq(exs__evq_reserve(e1), 0);
    ck_assert_int_eq(exs__evq_reserve(e1), 0);
    ck_assert_int_eq(exs__evq_reserve(e2), 0);
    ck_assert_int_eq(exs__evq_ops_live(), 3);
    exs__evq_unreserve(e1); /* a post that failed */
    ck_assert_int_eq(exs__evq_ops_live(), 2);
    memset(&ev, 0, sizeof(ev));
    exs__evq_post(e1, &ev); /* ended: its event is queued */
    ck_assert_int_eq(exs__evq_ops_live(), 1);
    ck_assert_int_eq(exs_qdequeue(q1, &ev, 1, &ts_zero), 1);
    ck_assert_int_eq(exs__evq_ops_live(), 1);
    exs__evq_post(e2, &ev);
    ck_assert_int_eq(exs__evq_ops_live(), 0);
    exs__evq_put(e1);
    exs__evq_put(e2);
    ck_assert_int_eq(exs_qdelete(q1), 0);
    ck_assert_int_eq(exs_qdelete(q2), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_delete_busy)
{
    exs_qhandle_t q = exs_qcreate(4);
    struct exs_evq *evq;
    exs_event_t ev;

    ck_assert_int_eq(exs__evq_get(q, &evq), 0);
    ck_assert_int_eq(exs__evq_reserve(evq), 0);
    exs__evq_put(evq);
    errno = 0;
    ck_assert_int_eq(exs_qdelete(q), -1);
    ck_assert_int_eq(errno, EBUSY);
    /* Still fully usable; once delivered, delete discards the undelivered event. */
    memset(&ev, 0, sizeof(ev));
    exs__evq_post(evq, &ev);
    post_one(q, 1, 1);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &ts_zero), -1);
    ASSERT_NO_QUEUES();
}
END_TEST

/* ---- dequeue forms ---- */

START_TEST(test_fifo)
{
    exs_qhandle_t q = exs_qcreate(8);
    exs_event_t ev[8];
    intptr_t next_post = 0, next_get = 0;

    /* Many laps of the ring, in uneven chunks. */
    for (int round = 0; round < 200; round++) {
        int np = 1 + round % 8, nd = 1 + (round * 5) % 8, n;

        while (np-- > 0 && next_post - next_get < 8) {
            post_one(q, 7, next_post);
            next_post++;
        }
        n = exs_qdequeue(q, ev, nd, &ts_zero);
        ck_assert_int_eq(n, (int)EXS_MIN(nd, next_post - next_get));
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(ev[i].exs_evt_type, EXS_EVT_SEND);
            ck_assert_int_eq(ev[i].exs_evt_fd, 7);
            ck_assert_int_eq((intptr_t)ev[i].exs_evt_ahandle, next_get);
            next_get++;
        }
    }
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* Several events in one dequeue, across the ring's end: a send's and a receive's come out
 * with their transfer member, any other type whole (an ACCEPT's address lies beyond the
 * transfer member: evq_take copies event by event, as far as each type goes). */
START_TEST(test_take_types)
{
    exs_qhandle_t q = exs_qcreate(4);
    exs_event_t ev[4], in[4];
    struct exs_evq *evq;

    /* head at 3: the next four events wrap the ring */
    for (int i = 0; i < 3; i++)
        post_one(q, 1, i);
    ck_assert_int_eq(exs_qdequeue(q, ev, 3, &ts_zero), 3);
    memset(in, 0, sizeof(in));
    for (int i = 0; i < 4; i++) {
        in[i].exs_evt_type = i % 2 ? EXS_EVT_ACCEPT : i ? EXS_EVT_RECV : EXS_EVT_SEND;
        in[i].exs_evt_fd = 10 + i;
        in[i].exs_evt_errno = i;
        in[i].exs_evt_ahandle = (exs_ahandle_t)(intptr_t)(100 + i);
    }
    in[0].exs_evt_u.exs_evt_xfer.exs_evt_buf = &ev[0];
    in[0].exs_evt_u.exs_evt_xfer.exs_evt_len = 64;
    in[0].exs_evt_u.exs_evt_xfer.exs_evt_result = 64;
    in[2].exs_evt_u.exs_evt_xfer.exs_evt_len = 32;
    in[2].exs_evt_u.exs_evt_xfer.exs_evt_result = 7;
    in[2].exs_evt_u.exs_evt_xfer.exs_evt_flags = MSG_TRUNC;
    for (int i = 1; i < 4; i += 2) {
        in[i].exs_evt_u.exs_evt_accept.exs_evt_newfd = 20 + i;
        memset(&in[i].exs_evt_u.exs_evt_accept.exs_evt_addr, 0xa0 + i,
               sizeof(in[i].exs_evt_u.exs_evt_accept.exs_evt_addr));
        in[i].exs_evt_u.exs_evt_accept.exs_evt_addrlen = 16;
    }
    ck_assert_int_eq(exs__evq_get(q, &evq), 0);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(exs__evq_reserve(evq), 0);
        exs__evq_post(evq, &in[i]);
    }
    exs__evq_put(evq);
    memset(ev, 0x5a, sizeof(ev));
    ck_assert_int_eq(exs_qdequeue(q, ev, 4, &ts_zero), 4);
    for (int i = 0; i < 4; i++) {
        size_t n =
            i % 2 ? sizeof(ev[i]) : offsetof(exs_event_t, exs_evt_u) + sizeof(exs_evt_xfer_t);

        ck_assert_msg(memcmp(&ev[i], &in[i], n) == 0, "event %d differs", i);
    }
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* h47 (attack review of 966b48e, evq_take copying event by event as far as each type goes):
 * every type other than SEND and RECV comes out whole, its union filled to the last byte,
 * across the ring's end: SENDMSG, RECVMSG, SENDFILE (exs_evt_xfermsg: its in_fd, iovlen and
 * offset lie beyond exs_evt_xfer_t), POLL, SENDTIMEOUT, RECVTIMEOUT, SHUTDOWN, CLOSE, CONNECT;
 * in dequeues of several (evq_take) and of one (evq_take1). test_take_types covers SEND,
 * RECV and ACCEPT. Seen failing ('SENDMSG event differs') with the copy as far as
 * exs_evt_xfer_t for every type up to RECVMSG. */
START_TEST(test_take_types_whole)
{
    static const int types[] = {EXS_EVT_SENDMSG,  EXS_EVT_RECVMSG,     EXS_EVT_SENDFILE,
                                EXS_EVT_POLL,     EXS_EVT_SENDTIMEOUT, EXS_EVT_RECVTIMEOUT,
                                EXS_EVT_SHUTDOWN, EXS_EVT_CLOSE,       EXS_EVT_CONNECT};
    static const char *const names[] = {"SENDMSG",  "RECVMSG",     "SENDFILE",
                                        "POLL",     "SENDTIMEOUT", "RECVTIMEOUT",
                                        "SHUTDOWN", "CLOSE",       "CONNECT"};
    const int n = (int)(sizeof(types) / sizeof(types[0]));
    exs_qhandle_t q = exs_qcreate(4);
    exs_event_t in, out[4];
    struct exs_evq *evq;
    int k = 0;

    /* head at 3: what follows wraps the ring */
    for (int i = 0; i < 3; i++)
        post_one(q, 1, i);
    ck_assert_int_eq(exs_qdequeue(q, out, 3, &ts_zero), 3);
    while (k < n) {
        int batch = EXS_MIN(n - k, k % 2 ? 1 : 3); /* 3, then 1, ... */

        ck_assert_int_eq(exs__evq_get(q, &evq), 0);
        for (int i = 0; i < batch; i++) {
            memset(&in, 0xc0 + k + i, sizeof(in));
            in.exs_evt_type = types[k + i];
            in.exs_evt_fd = 30 + k + i;
            in.exs_evt_errno = 0;
            ck_assert_int_eq(exs__evq_reserve(evq), 0);
            exs__evq_post(evq, &in);
        }
        exs__evq_put(evq);
        memset(out, 0x11, sizeof(out));
        ck_assert_int_eq(exs_qdequeue(q, out, 4, &ts_zero), batch);
        for (int i = 0; i < batch; i++) {
            memset(&in, 0xc0 + k + i, sizeof(in));
            in.exs_evt_type = types[k + i];
            in.exs_evt_fd = 30 + k + i;
            in.exs_evt_errno = 0;
            /* field by field (no padding compared) */
            ck_assert_msg(out[i].exs_evt_type == in.exs_evt_type &&
                              out[i].exs_evt_fd == in.exs_evt_fd && out[i].exs_evt_errno == 0 &&
                              out[i].exs_evt_ahandle == in.exs_evt_ahandle &&
                              memcmp(&out[i].exs_evt_u, &in.exs_evt_u, sizeof(in.exs_evt_u)) == 0,
                          "%s event differs", names[k + i]);
        }
        k += batch;
    }
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

static volatile size_t op_cache_size_unknown = 77;

/* A block of size bytes dirtied, freed and taken again: 0 when it came back all zero. */
static inline __attribute__((always_inline)) int op_cache_reuse_zeroed(size_t size)
{
    unsigned char *m = exs__evq_op_alloc_x(size);
    int bad = !m;

    if (m) {
        memset(m, 0xef, size);
        exs__evq_op_free_x(m, size);
        m = exs__evq_op_alloc_x(size);
        bad |= !m;
        for (size_t i = 0; m && i < size; i++)
            bad |= m[i] != 0;
        if (m)
            exs__evq_op_free_x(m, size);
    }
    return bad;
}

/* The operation block cache's inline paths (evq_int.h): in a fresh thread the first free
 * goes the whole way (exs__evq_op_free arms the thread's list), later ones inline; blocks
 * come back last in, first out, zeroed (whole, at constant sizes with a tail after the
 * 16-byte stores and at a size the compiler does not know); a size above EXS_EVQ_OP_BLOCK
 * bypasses the list.
 * Under a sanitizer the list is off (every block to free()): only the zeroing is checked. */
static void *op_cache_thread(void *arg)
{
    const size_t size = 200;
    unsigned char *a, *b, *c, *d, *big;
    int *fail = arg;

    a = exs__evq_op_alloc_x(size);
    b = exs__evq_op_alloc_x(size);
    if (!a || !b)
        return (*fail = 1, NULL);
    memset(a, 0xab, size);
    memset(b, 0xcd, size);
    exs__evq_op_free_x(a, size); /* arms the list */
    exs__evq_op_free_x(b, size); /* inline */
    c = exs__evq_op_alloc_x(size);
    d = exs__evq_op_alloc_x(size);
    if (!c || !d)
        return (*fail = 2, NULL);
#if EXS_OP_CACHE_MAX > 0
    if (c != b || d != a)
        *fail = 3;
#endif
    for (size_t i = 0; i < size; i++)
        if (c[i] || d[i])
            *fail = 4;
    /* a reused block zeroed whole at sizes the compiler knows, by 16-byte stores and the
     * tail after them (exs__evq_op_zero), and at one it does not (libc's memset) */
    if (op_cache_reuse_zeroed(203) || op_cache_reuse_zeroed(EXS_EVQ_OP_BLOCK) ||
        op_cache_reuse_zeroed(op_cache_size_unknown))
        *fail = 6;
    big = exs__evq_op_alloc_x(EXS_EVQ_OP_BLOCK + 1);
    if (!big || big[0] || big[EXS_EVQ_OP_BLOCK])
        *fail = 5;
    exs__evq_op_free_x(big, EXS_EVQ_OP_BLOCK + 1);
    exs__evq_op_free_x(c, size);
    exs__evq_op_free_x(d, size);
    return NULL;
}

START_TEST(test_op_cache)
{
    pthread_t t;
    int fail = 0;

    ck_assert_int_eq(pthread_create(&t, NULL, op_cache_thread, &fail), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_msg(fail == 0, "op cache: check %d failed", fail);
}
END_TEST

START_TEST(test_positive_partial)
{
    exs_qhandle_t q = exs_qcreate(16);
    exs_event_t ev[10];
    struct timespec ts = {5, 0};

    for (int i = 0; i < 3; i++)
        post_one(q, 1, i);
    /* Up to nevents: whatever is there, without waiting for more. */
    ck_assert_int_eq(exs_qdequeue(q, ev, 10, &ts), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq((intptr_t)ev[i].exs_evt_ahandle, i);
    ck_assert_int_eq(exs_qdequeue(q, ev, 10, &ts_zero), 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_threshold)
{
    exs_qhandle_t q = exs_qcreate(16);
    exs_event_t ev[8];
    struct timespec ts = {0, 100 * 1000000L};
    uint64_t t0;

    post_one(q, 1, 0);
    post_one(q, 1, 1);
    /* Not met: nothing is dequeued, by poll or after a timeout. */
    ck_assert_int_eq(exs_qdequeue(q, ev, -3, &ts_zero), 0);
    t0 = exs__now_ns();
    ck_assert_int_eq(exs_qdequeue(q, ev, -3, &ts), 0);
    ck_assert_uint_ge(elapsed_ms(t0), 90);
    ck_assert_uint_lt(elapsed_ms(t0), 5000);
    ck_assert(qfd_readable(q));
    /* Met: exactly -nevents, in order. */
    post_one(q, 1, 2);
    post_one(q, 1, 3);
    post_one(q, 1, 4);
    ck_assert_int_eq(exs_qdequeue(q, ev, -3, &ts_zero), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq((intptr_t)ev[i].exs_evt_ahandle, i);
    ck_assert_int_eq(exs_qdequeue(q, ev, -2, NULL), 2);
    ck_assert_int_eq((intptr_t)ev[0].exs_evt_ahandle, 3);
    ck_assert_int_eq((intptr_t)ev[1].exs_evt_ahandle, 4);
    ck_assert(!qfd_readable(q));
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

START_TEST(test_bad_args)
{
    exs_qhandle_t q = exs_qcreate(16);
    static exs_event_t ev[EXS_EVTVEC_MAX + 1];
    static const struct timespec bad_ts[] = {{-1, 0}, {0, -1}, {0, 1000000000L}};
    static const int bad_n[] = {EXS_EVTVEC_MAX + 1, -EXS_EVTVEC_MAX - 1, INT_MAX, INT_MIN};

    /* nevents == 0 returns 0 at once, whatever events is. */
    ck_assert_int_eq(exs_qdequeue(q, NULL, 0, NULL), 0);
    ck_assert_int_eq(exs_qdequeue(q, ev, 0, NULL), 0);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(bad_n); i++) {
        errno = 0;
        ck_assert_int_eq(exs_qdequeue(q, ev, bad_n[i], &ts_zero), -1);
        ck_assert_int_eq(errno, EINVAL);
    }
    errno = 0;
    ck_assert_int_eq(exs_qdequeue(q, NULL, 1, &ts_zero), -1);
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_int_eq(exs_qdequeue(q, NULL, -1, &ts_zero), -1);
    ck_assert_int_eq(errno, EINVAL);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(bad_ts); i++) {
        errno = 0;
        ck_assert_int_eq(exs_qdequeue(q, ev, 1, &bad_ts[i]), -1);
        ck_assert_int_eq(errno, EINVAL);
    }
    /* A threshold above the depth could never be met. */
    errno = 0;
    ck_assert_int_eq(exs_qdequeue(q, ev, -17, NULL), -1);
    ck_assert_int_eq(errno, EINVAL);
    /* The limits themselves are fine. */
    ck_assert_int_eq(exs_qdequeue(q, ev, EXS_EVTVEC_MAX, &ts_zero), 0);
    ck_assert_int_eq(exs_qdequeue(q, ev, -16, &ts_zero), 0);
    /* exs_qsetwait */
    errno = 0;
    ck_assert_int_eq(exs_qsetwait(q, -1, 0), -1);
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_ADAPTIVE + 1, 0), -1);
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_ADAPTIVE, -1), -1);
    ck_assert_int_eq(errno, EINVAL);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(wait_modes); i++)
        ck_assert_int_eq(exs_qsetwait(q, wait_modes[i], 10), 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* Until exs_qsetwait, a queue waits as EXS_WAIT_ADAPTIVE with EXS_QWAIT_SPIN_US's spin
 * (default 10 us, spec/api.md "Wait modes"); 0 makes new queues NOTIFY. The spin reads and
 * sets through EXS_QATTR_WAIT_SPIN, which leaves the mode as it is. */
START_TEST(test_qwait_default)
{
    socklen_t len = sizeof(int);
    int v = -1;
    exs_qhandle_t q, q2;

    unsetenv("EXS_QWAIT_SPIN_US");
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), 0); /* as exs_init loads them */
    q = exs_qcreate(8);
    ck_assert_int_ge(q, 0);
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT, &v, &len), 0);
    ck_assert_int_eq(v, EXS_WAIT_ADAPTIVE);
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT_SPIN, &v, &len), 0);
    ck_assert_int_eq(v, 10);
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_POLL, 7), 0);
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT_SPIN, &v, &len), 0);
    ck_assert_int_eq(v, 7);
    v = 25;
    ck_assert_int_eq(exs_qsetattr(q, EXS_QATTR_WAIT_SPIN, &v, sizeof(v)), 0);
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT, &v, &len), 0);
    ck_assert_int_eq(v, EXS_WAIT_POLL); /* the mode stays */
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT_SPIN, &v, &len), 0);
    ck_assert_int_eq(v, 25);
    v = -1;
    errno = 0;
    ck_assert_int_eq(exs_qsetattr(q, EXS_QATTR_WAIT_SPIN, &v, sizeof(v)), -1);
    ck_assert_int_eq(errno, EINVAL);
    /* EXS_QWAIT_SPIN_US=0: new queues sleep at once; queues made before keep theirs */
    ck_assert_int_eq(exs__params_set("qwait_spin_us", "0"), 0);
    q2 = exs_qcreate(8);
    ck_assert_int_ge(q2, 0);
    ck_assert_int_eq(exs_qgetattr(q2, EXS_QATTR_WAIT, &v, &len), 0);
    ck_assert_int_eq(v, EXS_WAIT_NOTIFY);
    ck_assert_int_eq(exs_qgetattr(q2, EXS_QATTR_WAIT_SPIN, &v, &len), 0);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(exs__params_set("qwait_spin_us", "10"), 0);
    ck_assert_int_eq(exs_qgetattr(q, EXS_QATTR_WAIT_SPIN, &v, &len), 0);
    ck_assert_int_eq(v, 25);
    ck_assert_int_eq(exs__params_set("qwait_spin_us", "1000001"), -EINVAL);
    ck_assert_int_eq(exs_qdelete(q2), 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    exs__params_reset();
    ASSERT_NO_QUEUES();
}
END_TEST

/* Finite timeouts expire after at least the interval (in each wait mode). */
START_TEST(test_timeout)
{
    exs_qhandle_t q = exs_qcreate(4);
    exs_event_t ev[2];
    struct timespec ts = {0, 150 * 1000000L};
    uint64_t t0;

    ck_assert_int_eq(exs_qsetwait(q, wait_modes[_i], 0), 0);
    t0 = exs__now_ns();
    ck_assert_int_eq(exs_qdequeue(q, ev, 2, &ts_zero), 0);
    ck_assert_uint_lt(elapsed_ms(t0), 2000);
    t0 = exs__now_ns();
    ck_assert_int_eq(exs_qdequeue(q, ev, 2, &ts), 0);
    ck_assert_uint_ge(elapsed_ms(t0), 135);
    ck_assert_uint_lt(elapsed_ms(t0), 5000);
    t0 = exs__now_ns();
    ck_assert_int_eq(exs_qdequeue(q, ev, -2, &ts), 0);
    ck_assert_uint_ge(elapsed_ms(t0), 135);
    ck_assert_uint_lt(elapsed_ms(t0), 5000);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* The busy wait's clock interval (exs__evq_spin_every): a quarter of the time left at
 * the speed last measured, within its bounds; unknown speed: the smallest interval. */
START_TEST(test_spin_every)
{
    ck_assert_uint_eq(exs__evq_spin_every(0, 1000000000u), EVQ_SPIN_EVERY_MIN);
    ck_assert_uint_eq(exs__evq_spin_every(100, 0), EVQ_SPIN_EVERY_MIN);
    ck_assert_uint_eq(exs__evq_spin_every(100, 1000), EVQ_SPIN_EVERY_MIN); /* 2 turns */
    ck_assert_uint_eq(exs__evq_spin_every(100, 10000), 25);
    ck_assert_uint_eq(exs__evq_spin_every(100, 1000000), EVQ_SPIN_EVERY_MAX); /* 2500 */
    ck_assert_uint_eq(exs__evq_spin_every(1, UINT64_MAX), EVQ_SPIN_EVERY_MAX);
}
END_TEST

/* The learned spin (exs__evq_spin_limit, exs__evq_spin_learn; spec/api.md "Wait modes"),
 * as a queue's waits would drive it: a wait spins limit(average); its events come after
 * `due` ns; if that is within the spin it samples due, else it sleeps and samples the
 * ceiling. Returns how many of the n waits slept; *spun: the last wait's spin. */
static int learn_run(uint64_t *seen, uint32_t *waits, uint64_t due, int n, uint64_t *spun)
{
    const uint64_t floor_ns = 10000, ceil_ns = 100000;
    int slept = 0;

    for (int i = 0; i < n; i++) {
        int sample;
        uint64_t lim = exs__evq_spin_limit(*seen, floor_ns, ceil_ns,
                                           ++*waits % EVQ_LEARN_PROBE_EVERY == 0, &sample);

        ck_assert_uint_ge(lim, floor_ns);
        ck_assert_uint_le(lim, ceil_ns);
        slept += due > lim;
        if (sample)
            *seen = exs__evq_spin_learn(*seen, due > lim ? ceil_ns : due);
        *spun = lim;
    }
    return slept;
}

START_TEST(test_spin_learn)
{
    uint64_t seen = 0, spun = 0;
    uint32_t waits = 0;
    int sample;

    ck_assert_uint_eq(exs__evq_spin_learn(0, 800), 100);
    ck_assert_uint_eq(exs__evq_spin_learn(800, 0), 700);
    ck_assert_uint_eq(exs__evq_spin_learn(800, 800), 800);
    /* {average, floor, ceiling, probe, spin, learned}: nothing learned yet: the floor,
     * learned; a ceiling at or below the floor: always the floor, nothing learned; twice
     * the average, within the bounds, below three quarters of the ceiling; past that the
     * floor, not learned, but a probe spins to the ceiling and is learned */
    static const uint64_t cases[][6] = {
        {0, 10000, 100000, 0, 10000, 1},      {90000, 10000, 10000, 1, 10000, 0},
        {90000, 10000, 5000, 0, 10000, 0},    {30000, 10000, 100000, 0, 60000, 1},
        {74999, 10000, 100000, 1, 100000, 1}, {75000, 10000, 100000, 0, 10000, 0},
        {75000, 10000, 100000, 1, 100000, 1},
    };
    for (size_t i = 0; i < EXS_ARRAY_SIZE(cases); i++) {
        const uint64_t *c = cases[i];

        ck_assert_uint_eq(exs__evq_spin_limit(c[0], c[1], c[2], (int)c[3], &sample), c[4]);
        ck_assert_int_eq(sample, (int)c[5]);
    }
    /* a ping-pong whose answers come 3 us after the wait: the floor spins through */
    ck_assert_int_eq(learn_run(&seen, &waits, 3000, 100, &spun), 0);
    ck_assert_uint_eq(spun, 10000);
    /* answers 30 us after the wait (a 10 us spin misses every one): a few sleeps, then
     * none; the spin settles at about twice the wait */
    seen = 0;
    waits = 0;
    ck_assert_int_le(learn_run(&seen, &waits, 30000, 8, &spun), 4);
    ck_assert_int_eq(learn_run(&seen, &waits, 30000, 100, &spun), 0);
    ck_assert_uint_ge(spun, 58000);
    ck_assert_uint_le(spun, 62000);
    /* waits of a millisecond: the spin goes back to the floor, and only one wait in
     * EVQ_LEARN_PROBE_EVERY spins to the ceiling (a probe) */
    ck_assert_int_eq(learn_run(&seen, &waits, 1000000, 100, &spun), 100);
    for (int i = 0, probes = 0; i <= 8 * (int)EVQ_LEARN_PROBE_EVERY; i++) {
        if (i == 8 * (int)EVQ_LEARN_PROBE_EVERY) {
            ck_assert_int_eq(probes, 8);
            break;
        }
        learn_run(&seen, &waits, 1000000, 1, &spun);
        probes += spun == 100000;
        ck_assert(spun == 100000 || spun == 10000);
    }
    /* short again (30 us): the probes find it, and the waits stop sleeping */
    ck_assert_int_lt(learn_run(&seen, &waits, 30000, 64, &spun), 64);
    ck_assert_int_eq(learn_run(&seen, &waits, 30000, 32, &spun), 0);
}
END_TEST

/* The learning on a real queue: a wait that slept samples the ceiling (the average goes
 * an eighth of the way there), a wait that timed out samples nothing, a wait mode or spin
 * of the application's own stops the learning (set back to the default's, it learns
 * again), and so does a ceiling at the floor (EXS_QWAIT_SPIN_MAX_US=10). */
static void wait_asleep(exs_qhandle_t q, struct exs_evq *evq);

START_TEST(test_spin_learn_queue)
{
    exs_qhandle_t q, q2;
    struct exs_evq *evq, *evq2;
    struct timespec ts = {0, 1000000};
    exs_event_t ev;
    int v;

    unsetenv("EXS_QWAIT_SPIN_US");
    unsetenv("EXS_QWAIT_SPIN_MAX_US");
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), 0);
    q = exs_qcreate(8);
    ck_assert_int_ge(q, 0);
    ck_assert_int_eq(exs__evq_get(q, &evq), 0);
    ck_assert_int_eq(evq->spin_learn, 1);
    ck_assert_uint_eq(evq->spin_seen_ns, 0);
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &ts), 0); /* timed out: no sample */
    ck_assert_uint_eq(__atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED), 0);
    wait_asleep(q, evq);
    ck_assert_uint_eq(__atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED), 100000 / 8);
    wait_asleep(q, evq);
    ck_assert_uint_eq(__atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED),
                      exs__evq_spin_learn(100000 / 8, 100000));
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_ADAPTIVE, 11), 0);
    ck_assert_int_eq(evq->spin_learn, 0);
    wait_asleep(q, evq);
    ck_assert_uint_eq(__atomic_load_n(&evq->spin_seen_ns, __ATOMIC_RELAXED),
                      exs__evq_spin_learn(100000 / 8, 100000));
    /* set back to what a new queue reads (the default): it learns again */
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_ADAPTIVE, 10), 0);
    ck_assert_int_eq(evq->spin_learn, 1);
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_POLL, 10), 0);
    ck_assert_int_eq(evq->spin_learn, 0);
    v = 10;
    ck_assert_int_eq(exs_qsetattr(q, EXS_QATTR_WAIT_SPIN, &v, sizeof(v)), 0); /* POLL stays */
    ck_assert_int_eq(evq->spin_learn, 0);
    ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_ADAPTIVE, 0), 0); /* EXS_QSPIN_US: fixed */
    ck_assert_int_eq(evq->spin_learn, 0);
    ck_assert_int_eq(exs_qsetattr(q, EXS_QATTR_WAIT_SPIN, &v, sizeof(v)), 0);
    ck_assert_int_eq(evq->spin_learn, 1);
    exs__evq_put(evq);
    ck_assert_int_eq(exs__params_set("qwait_spin_max_us", "10"), 0);
    q2 = exs_qcreate(8);
    ck_assert_int_ge(q2, 0);
    ck_assert_int_eq(exs__evq_get(q2, &evq2), 0);
    wait_asleep(q2, evq2);
    ck_assert_uint_eq(__atomic_load_n(&evq2->spin_seen_ns, __ATOMIC_RELAXED), 0);
    exs__evq_put(evq2);
    ck_assert_int_eq(exs__params_set("qwait_spin_max_us", "1000001"), -EINVAL);
    ck_assert_int_eq(exs_qdelete(q2), 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    exs__params_reset();
    ASSERT_NO_QUEUES();
}
END_TEST

/* ---- waking ---- */

struct waiter_arg {
    exs_qhandle_t q;
    int nevents;
    const struct timespec *timeout;
    exs_event_t ev[4];
    int ret;
    int err;
    int done; /* atomic */
    pthread_t self;
};

static void *waiter_main(void *p)
{
    struct waiter_arg *a = p;

    a->ret = exs_qdequeue(a->q, a->ev, a->nevents, a->timeout);
    a->err = a->ret < 0 ? errno : 0;
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void waiter_start(struct waiter_arg *a, exs_qhandle_t q, int nevents,
                         const struct timespec *timeout)
{
    memset(a, 0, sizeof(*a));
    a->q = q;
    a->nevents = nevents;
    a->timeout = timeout;
    ck_assert_int_eq(pthread_create(&a->self, NULL, waiter_main, a), 0);
}

static int waiter_done(struct waiter_arg *a)
{
    return __atomic_load_n(&a->done, __ATOMIC_ACQUIRE);
}

/* One wait of another thread on q that sleeps: the event is posted only once the waiter
 * is a sleeper (seen under the queue's lock: it has looked at the queue for the last time
 * and goes to ppoll), so the wait ends by its wake-up, never in its spin. */
static void wait_asleep(exs_qhandle_t q, struct exs_evq *evq)
{
    struct waiter_arg a;
    int asleep = 0;

    waiter_start(&a, q, 1, NULL);
    for (int i = 0; !asleep && i < 20000; i++) {
        EVQ_LOCK(evq);
        asleep = evq->sleepers > 0;
        EVQ_UNLOCK(evq);
        if (!asleep)
            sleep_ms(1);
    }
    ck_assert_msg(asleep, "the waiter never slept");
    post_one(q, 9, 7);
    pthread_join(a.self, NULL);
    ck_assert_int_eq(a.ret, 1);
}

/* A post from another thread wakes a dequeue blocked without a timeout. */
START_TEST(test_wake)
{
    exs_qhandle_t q = exs_qcreate(8);
    struct waiter_arg a;

    ck_assert_int_eq(exs_qsetwait(q, wait_modes[_i], 0), 0);
    waiter_start(&a, q, 4, NULL);
    sleep_ms(50);
    ck_assert(!waiter_done(&a));
    post_one(q, 9, 42);
    pthread_join(a.self, NULL);
    ck_assert_int_eq(a.ret, 1);
    ck_assert_int_eq(a.ev[0].exs_evt_fd, 9);
    ck_assert_int_eq((intptr_t)a.ev[0].exs_evt_ahandle, 42);
    /* The threshold form sleeps through posts below its threshold. */
    waiter_start(&a, q, -3, NULL);
    post_one(q, 9, 1);
    sleep_ms(30);
    post_one(q, 9, 2);
    sleep_ms(30);
    ck_assert(!waiter_done(&a));
    post_one(q, 9, 3);
    pthread_join(a.self, NULL);
    ck_assert_int_eq(a.ret, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq((intptr_t)a.ev[i].exs_evt_ahandle, i + 1);
    ck_assert(!qfd_readable(q));
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* exs_qdelete wakes blocked dequeuers with EINVAL (in each mode, both forms). */
START_TEST(test_delete_wakes)
{
    exs_qhandle_t q = exs_qcreate(8);
    struct waiter_arg a, b;

    ck_assert_int_eq(exs_qsetwait(q, wait_modes[_i], 0), 0);
    waiter_start(&a, q, 1, NULL);
    waiter_start(&b, q, -2, NULL);
    post_one(q, 1, 1); /* one of them may take it; the other is still blocked */
    sleep_ms(50);
    ck_assert_int_eq(exs_qdelete(q), 0);
    pthread_join(a.self, NULL);
    pthread_join(b.self, NULL);
    ck_assert(a.ret == -1 || a.ret == 1);
    ck_assert(a.ret == 1 || a.err == EINVAL);
    ck_assert_int_eq(b.ret, -1);
    ck_assert_int_eq(b.err, EINVAL);
    ASSERT_NO_QUEUES();
}
END_TEST

static volatile sig_atomic_t sigusr1_count;

static void on_sigusr1(int sig)
{
    (void)sig;
    sigusr1_count++;
}

/* A signal ends a sleeping wait with EINTR even under SA_RESTART (NOTIFY, ADAPTIVE). */
START_TEST(test_eintr)
{
    static const int modes[] = {EXS_WAIT_NOTIFY, EXS_WAIT_ADAPTIVE};
    static const int forms[] = {1, -2};
    struct timespec ts = {20, 0}; /* a safety net: the test fails rather than hangs */
    struct sigaction sa;
    exs_qhandle_t q = exs_qcreate(8);
    struct waiter_arg a;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    ck_assert_int_eq(exs_qsetwait(q, modes[_i / 2], 0), 0);
    post_one(q, 1, 1); /* below the threshold of the -2 form */
    if (forms[_i % 2] > 0) {
        exs_event_t ev;

        ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &ts_zero), 1);
    }
    waiter_start(&a, q, forms[_i % 2], &ts);
    /* Signal every 50 ms until it returns: one signal may land before the sleep. */
    do {
        sleep_ms(50);
        pthread_kill(a.self, SIGUSR1);
    } while (!waiter_done(&a));
    pthread_join(a.self, NULL);
    ck_assert_int_eq(a.ret, -1);
    ck_assert_int_eq(a.err, EINTR);
    ck_assert_int_gt(sigusr1_count, 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* exs_qfd polls readable exactly while events are queued. */
START_TEST(test_qfd)
{
    exs_qhandle_t q = exs_qcreate(8);
    exs_event_t ev[4];
    int fd = exs_qfd(q);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(exs_qfd(q), fd);
    ck_assert(!qfd_readable(q));
    post_one(q, 1, 1);
    ck_assert(qfd_readable(q));
    post_one(q, 1, 2);
    ck_assert(qfd_readable(q));
    ck_assert_int_eq(exs_qdequeue(q, ev, 1, &ts_zero), 1);
    ck_assert(qfd_readable(q));
    ck_assert_int_eq(exs_qdequeue(q, ev, 4, &ts_zero), 1);
    ck_assert(!qfd_readable(q));
    ck_assert_int_eq(exs_qdequeue(q, ev, -1, &ts_zero), 0);
    ck_assert(!qfd_readable(q));
    /* Reservations alone do not make it readable. */
    {
        struct exs_evq *evq;

        ck_assert_int_eq(exs__evq_get(q, &evq), 0);
        ck_assert_int_eq(exs__evq_reserve(evq), 0);
        ck_assert(!qfd_readable(q));
        exs__evq_unreserve(evq);
        exs__evq_put(evq);
    }
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* ---- many threads ---- */

#define MP_PRODUCERS 4
#define MP_CONSUMERS 2
#define MP_EVENTS    100000 /* in all */
#define MP_PER_PROD  (MP_EVENTS / MP_PRODUCERS)

struct mp_ctx {
    exs_qhandle_t q;
    int taken;           /* atomic: events dequeued so far */
    unsigned char *seen; /* atomic bytes: per event, times dequeued */
    int bad_order;       /* atomic */
    int errors;          /* atomic */
};

struct mp_thread {
    struct mp_ctx *ctx;
    int id;
    pthread_t self;
};

static void *mp_producer(void *p)
{
    struct mp_thread *t = p;
    struct exs_evq *evq;
    exs_event_t ev;

    if (exs__evq_get(t->ctx->q, &evq) < 0) {
        __atomic_add_fetch(&t->ctx->errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    memset(&ev, 0, sizeof(ev));
    ev.exs_evt_type = EXS_EVT_RECV;
    ev.exs_evt_fd = t->id;
    for (intptr_t seq = 0; seq < MP_PER_PROD; seq++) {
        int ret;

        while ((ret = exs__evq_reserve(evq)) == -EAGAIN)
            sched_yield();
        if (ret < 0) {
            __atomic_add_fetch(&t->ctx->errors, 1, __ATOMIC_RELAXED);
            break;
        }
        ev.exs_evt_ahandle = (exs_ahandle_t)seq;
        /* both forms of the post: the whole event, and a transfer's, in place in the ring
         * (the send path's inline post, evq_int.h) */
        if (seq & 1)
            exs__evq_post_xfer(evq, EXS_EVT_RECV, t->id, (exs_ahandle_t)seq, NULL, 0, 0);
        else
            exs__evq_post(evq, &ev);
    }
    exs__evq_put(evq);
    return NULL;
}

static void *mp_consumer(void *p)
{
    struct mp_thread *t = p;
    struct mp_ctx *ctx = t->ctx;
    struct timespec ts = {0, 20 * 1000000L};
    intptr_t last[MP_PRODUCERS];
    exs_event_t ev[64];

    for (int i = 0; i < MP_PRODUCERS; i++)
        last[i] = -1;
    while (__atomic_load_n(&ctx->taken, __ATOMIC_ACQUIRE) < MP_EVENTS) {
        /* Alternate the forms: up to 64, and a threshold of 3 (met or timed out). */
        int n = exs_qdequeue(ctx->q, ev, (t->id & 1) ? -3 : 64, &ts);

        if (n < 0) {
            __atomic_add_fetch(&ctx->errors, 1, __ATOMIC_RELAXED);
            break;
        }
        for (int i = 0; i < n; i++) {
            int prod = ev[i].exs_evt_fd;
            intptr_t seq = (intptr_t)ev[i].exs_evt_ahandle;

            if (prod < 0 || prod >= MP_PRODUCERS || seq < 0 || seq >= MP_PER_PROD) {
                __atomic_add_fetch(&ctx->errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            /* What one consumer sees of one producer is increasing. */
            if (seq <= last[prod])
                __atomic_add_fetch(&ctx->bad_order, 1, __ATOMIC_RELAXED);
            last[prod] = seq;
            __atomic_add_fetch(&ctx->seen[prod * MP_PER_PROD + seq], 1, __ATOMIC_RELAXED);
        }
        __atomic_add_fetch(&ctx->taken, n, __ATOMIC_RELEASE);
    }
    return NULL;
}

START_TEST(test_mpmc)
{
    struct mp_ctx ctx;
    struct mp_thread prod[MP_PRODUCERS], cons[MP_CONSUMERS];
    struct timespec ts = {0, 100 * 1000000L};
    exs_event_t ev;

    memset(&ctx, 0, sizeof(ctx));
    ctx.q = exs_qcreate(256);
    ctx.seen = calloc(MP_EVENTS, 1);
    ck_assert_ptr_nonnull(ctx.seen);
    ck_assert_int_eq(exs_qsetwait(ctx.q, wait_modes[_i], 0), 0);
    for (int i = 0; i < MP_CONSUMERS; i++) {
        cons[i] = (struct mp_thread){.ctx = &ctx, .id = i};
        ck_assert_int_eq(pthread_create(&cons[i].self, NULL, mp_consumer, &cons[i]), 0);
    }
    for (int i = 0; i < MP_PRODUCERS; i++) {
        prod[i] = (struct mp_thread){.ctx = &ctx, .id = i};
        ck_assert_int_eq(pthread_create(&prod[i].self, NULL, mp_producer, &prod[i]), 0);
    }
    for (int i = 0; i < MP_PRODUCERS; i++)
        pthread_join(prod[i].self, NULL);
    for (int i = 0; i < MP_CONSUMERS; i++)
        pthread_join(cons[i].self, NULL);
    ck_assert_int_eq(ctx.errors, 0);
    ck_assert_int_eq(ctx.bad_order, 0);
    ck_assert_int_eq(ctx.taken, MP_EVENTS);
    for (int i = 0; i < MP_EVENTS; i++)
        ck_assert_msg(ctx.seen[i] == 1, "event %d seen %d times", i, ctx.seen[i]);
    ck_assert_int_eq(exs_qdequeue(ctx.q, &ev, 1, &ts), 0);
    ck_assert(!qfd_readable(ctx.q));
    free(ctx.seen);
    ck_assert_int_eq(exs_qdelete(ctx.q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* ---- without the table's lock (issue 27) ---- */

/* A queue's memory is parked and reused by the next exs_qcreate: a reservation (found by
 * handle without a lock, evq_peek) and a dequeue by the old handle never reach the new
 * queue; st names the queue it is. */
START_TEST(test_parked_reuse)
{
    exs_qhandle_t old = exs_qcreate(4), q;
    struct exs_evq *evq, *e2;
    exs_event_t ev;

    ck_assert_int_gt(old, 0);
    ck_assert_int_eq(exs__evq_get(old, &evq), 0);
    exs__evq_put(evq);
    ck_assert_int_eq(exs_qdelete(old), 0);
    q = exs_qcreate(4); /* the same memory, the same table slot, another handle */
    ck_assert_int_gt(q, 0);
    ck_assert_int_ne(q, old);
    ck_assert_int_eq(exs__evq_get(q, &e2), 0);
    exs__evq_put(e2);
    ck_assert_ptr_eq(e2, evq);
    post_one(q, 5, 5);
    ck_assert_int_eq(exs__evq_reserve_handle(old, &e2), EINVAL);
    errno = 0;
    ck_assert_int_eq(exs_qdequeue(old, &ev, 1, &ts_zero), -1);
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_int_eq(exs_qdequeue(old, &ev, -1, NULL), -1);
    ck_assert_int_eq(errno, EINVAL);
    /* q's own: its event, and all of its depth for reservations */
    ck_assert_int_eq(exs_qdequeue(q, &ev, 1, &ts_zero), 1);
    ck_assert_int_eq(ev.exs_evt_fd, 5);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(exs__evq_reserve_handle(q, &e2), 0);
    ck_assert_int_eq(exs__evq_reserve_handle(q, &e2), EAGAIN);
    for (int i = 0; i < 4; i++)
        exs__evq_unreserve(e2);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* exs__evq_get takes no lock (evq.c): given the handle of a deleted queue (or its memory,
 * read from the slot before: exs__evq_hold) it fails, both while the queue is parked (it
 * does not count it: without the count's 0 test the queue would be parked twice and
 * handed to two later queues) and once its memory serves another handle (without the
 * check of st after the count it would return it). */
START_TEST(test_get_parked_reused)
{
    exs_qhandle_t old = exs_qcreate(4), q, q2;
    struct exs_evq *evq, *e;

    ck_assert_int_gt(old, 0);
    ck_assert_int_eq(exs__evq_get(old, &evq), 0);
    exs__evq_put(evq);
    ck_assert_int_eq(exs_qdelete(old), 0);
    ck_assert_int_eq(exs__evq_get(old, &e), -EINVAL);       /* parked */
    ck_assert_int_eq(exs__evq_hold(old, evq, &e), -EINVAL); /* read from the slot before */
    q = exs_qcreate(4);
    q2 = exs_qcreate(4);
    ck_assert_int_gt(q, 0);
    ck_assert_int_gt(q2, 0);
    ck_assert_int_eq(exs__evq_get(q, &e), 0);
    exs__evq_put(e);
    ck_assert_ptr_eq(e, evq); /* the parked memory, once */
    ck_assert_int_eq(exs__evq_get(q2, &e), 0);
    exs__evq_put(e);
    ck_assert_ptr_ne(e, evq);
    ck_assert_int_eq(exs__evq_get(old, &e), -EINVAL); /* the memory is q's now */
    ck_assert_int_eq(exs__evq_hold(old, evq, &e), -EINVAL);
    ck_assert_int_eq(exs__evq_hold(q, evq, &e), 0);
    exs__evq_put(e);
    ck_assert_int_eq(exs_qdelete(q2), 0);
    ck_assert_int_eq(exs_qdelete(q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* A spinning exs_qdequeue (POLL) holds no reference on its queue (issue 28): it asks st
 * at each look. Its queue deleted and the memory reused at once by a new queue (parked:
 * nothing holds it), the wait still ends with EINVAL: it neither takes the new queue's
 * event (the look under the lock) nor spins on until its timeout when the new queue gets
 * none (the spin's look). */
#define SPIN_REUSE_ROUNDS 20

START_TEST(test_spin_deleted_reused)
{
    struct timespec ts = {5, 0}; /* longer than any round: a wait that misses the delete
                                  * returns 0 (or the new queue's event) and fails */
    int reused = 0;

    for (int r = 0; r < SPIN_REUSE_ROUNDS; r++) {
        exs_qhandle_t q = exs_qcreate(4), q2;
        struct exs_evq *evq, *e2;
        struct waiter_arg a;
        exs_event_t ev;

        ck_assert_int_gt(q, 0);
        ck_assert_int_eq(exs_qsetwait(q, EXS_WAIT_POLL, 0), 0);
        ck_assert_int_eq(exs__evq_get(q, &evq), 0);
        exs__evq_put(evq);
        waiter_start(&a, q, 1, &ts);
        for (int i = 0; i < 20 && !waiter_done(&a); i++)
            sched_yield(); /* most rounds: the waiter spins meanwhile (not required) */
        ck_assert_int_eq(exs_qdelete(q), 0);
        q2 = exs_qcreate(4);
        ck_assert_int_gt(q2, 0);
        ck_assert_int_eq(exs__evq_get(q2, &e2), 0);
        exs__evq_put(e2);
        reused += e2 == evq;
        if (r & 1)
            post_one(q2, 7, r);
        pthread_join(a.self, NULL);
        ck_assert_int_eq(a.ret, -1);
        ck_assert_int_eq(a.err, EINVAL);
        ck_assert_int_eq(exs_qdequeue(q2, &ev, 1, &ts_zero), r & 1); /* still there */
        ck_assert_int_eq(exs_qdelete(q2), 0);
    }
    /* the spinner held no reference: each deleted queue was parked at once, and the
     * next queue took its memory (the last parked, the first reused) */
    ck_assert_int_eq(reused, SPIN_REUSE_ROUNDS);
    ASSERT_NO_QUEUES();
}
END_TEST

/* exs_fini kills a queue with a slot still reserved: its memory is not parked (so not
 * reused by the next exs_qcreate) until that slot's event comes, which is dropped. */
START_TEST(test_orphan_not_reused)
{
    exs_qhandle_t a = exs_qcreate(2), b;
    struct exs_evq *evq, *e2;
    exs_event_t ev;

    memset(&ev, 0, sizeof(ev));
    ev.exs_evt_type = EXS_EVT_SEND;
    ev.exs_evt_fd = 9;
    ck_assert_int_eq(exs__evq_reserve_handle(a, &evq), 0);
    exs__log_level = EXS_LOG_ERR; /* the warning about a is expected */
    exs__evq_destroy_all();
    ck_assert_int_eq(exs__evq_live_count(), 1);
    b = exs_qcreate(2);
    ck_assert_int_gt(b, 0);
    ck_assert_int_eq(exs__evq_get(b, &e2), 0);
    exs__evq_put(e2);
    ck_assert_ptr_ne(e2, evq);
    exs__evq_post(evq, &ev); /* a's last slot: dropped, a parked */
    ck_assert_int_eq(exs__evq_live_count(), 1);
    ck_assert_int_eq(exs_qdequeue(b, &ev, 1, &ts_zero), 0);
    ck_assert_int_eq(exs_qdelete(b), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* Reservations (one CAS, no lock) race exs_qdelete: a delete never succeeds while a slot
 * is reserved, and no reservation succeeds after it. */
struct race_ctx {
    exs_qhandle_t q; /* atomic */
    int deleted;     /* atomic: q's exs_qdelete returned 0 */
    int stop;        /* atomic */
    int bad;         /* atomic: a reservation held across a successful delete */
    long reserved;   /* atomic */
    long round;      /* atomic: the deleter's round; one reservation in each */
};

static inline void race_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
#endif
}

static void *race_reserver(void *arg)
{
    struct race_ctx *c = arg;
    long done = -1; /* the round of the last reservation */

    while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        exs_qhandle_t q = __atomic_load_n(&c->q, __ATOMIC_ACQUIRE);
        long round = __atomic_load_n(&c->round, __ATOMIC_ACQUIRE);
        struct exs_evq *evq;

        /* one reservation a round, so the deleter's wait for it is bounded (one that
         * reserved again at once could hold the queue nearly all the time: on a loaded
         * machine the delete would never find it free) */
        if (round == done || exs__evq_reserve_handle(q, &evq)) {
            sched_yield();
            continue;
        }
        done = round;
        __atomic_add_fetch(&c->reserved, 1, __ATOMIC_RELAXED);
        for (int i = 0; i < 512; i++) /* held a while: pauses, not yields (a yield beside */
            race_pause();             /* busy threads may cost a time slice each) */
        if (__atomic_load_n(&c->deleted, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&c->q, __ATOMIC_ACQUIRE) == q)
            __atomic_store_n(&c->bad, 1, __ATOMIC_RELEASE);
        exs__evq_unreserve(evq);
    }
    return NULL;
}

START_TEST(test_reserve_delete_race)
{
    struct race_ctx c = {0};
    pthread_t t;
    long busy = 0;

    c.q = exs_qcreate(4);
    ck_assert_int_gt(c.q, 0);
    ck_assert_int_eq(pthread_create(&t, NULL, race_reserver, &c), 0);
    /* 300 rounds, and on (bounded) until the reserver has reserved once: on a loaded
     * machine it may not run at all during the first 300 */
    for (int i = 0; i < 300 || (!__atomic_load_n(&c.reserved, __ATOMIC_RELAXED) && i < 300000);
         i++) {
        exs_qhandle_t q = c.q, n;
        struct exs_evq *evq;

        while (exs_qdelete(q) != 0) {
            ck_assert_int_eq(errno, EBUSY);
            busy++;
            sched_yield();
        }
        __atomic_store_n(&c.deleted, 1, __ATOMIC_RELEASE);
        ck_assert_int_eq(exs__evq_reserve_handle(q, &evq), EINVAL);
        for (int j = 0; j < 256; j++)
            race_pause();
        n = exs_qcreate(4);
        ck_assert_int_gt(n, 0);
        __atomic_store_n(&c.deleted, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&c.q, n, __ATOMIC_RELEASE);
        __atomic_add_fetch(&c.round, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&c.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    ck_assert_int_eq(c.bad, 0);
    ck_assert_int_gt(c.reserved, 0);
    ck_assert_int_eq(exs_qdelete(c.q), 0);
    ASSERT_NO_QUEUES();
}
END_TEST

/* The small locks: threads contending for one, a holder yielding its CPU now and then,
 * lose no update, and it is free at the end. The futex mutex of the send path's locks
 * (lite_lock.h: the others wait in the kernel) and an event queue's lock (evq_int.h: a
 * spin lock that yields, given back by a plain store: the others spin, then yield). */
#define LITE_THREADS 4
#define LITE_ROUNDS  20000

struct lite_ctx {
    int evq; /* which lock: evq_lock, else lite_lock */
    struct exs_lite_lock lite_lock;
    struct exs_evq_lock evq_lock;
    long count; /* the lock */
};

static void *lite_worker(void *arg)
{
    struct lite_ctx *c = arg;

    for (int i = 0; i < LITE_ROUNDS; i++) {
        if (c->evq)
            exs__evq_lock(&c->evq_lock);
        else
            exs__lite_lock(&c->lite_lock);
        long v = c->count;
        if (i % 64 == 0)
            sched_yield(); /* held across a yield */
        c->count = v + 1;
        if (c->evq)
            exs__evq_unlock(&c->evq_lock);
        else
            exs__lite_unlock(&c->lite_lock);
    }
    return NULL;
}

static void lite_contend(struct lite_ctx *c)
{
    pthread_t t[LITE_THREADS];

    for (int i = 0; i < LITE_THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, lite_worker, c), 0);
    for (int i = 0; i < LITE_THREADS; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(c->count, (long)LITE_THREADS * LITE_ROUNDS);
}

START_TEST(test_lite_lock)
{
    struct lite_ctx c = {.evq = 0};

    lite_contend(&c);
    ck_assert_int_eq(c.lite_lock.v, 0);
}
END_TEST

START_TEST(test_evq_lock)
{
    struct lite_ctx c = {.evq = 1};

    lite_contend(&c);
    ck_assert_int_eq(c.evq_lock.v, 0);
    ck_assert(exs__evq_trylock(&c.evq_lock));
    ck_assert(!exs__evq_trylock(&c.evq_lock));
    exs__evq_unlock(&c.evq_lock);
}
END_TEST

/* A waiter for a queue's lock held long (here: until the waiter naps) naps in the kernel
 * between looks, after its spins and yields, so a holder that cannot run while its
 * waiter is runnable still runs; it takes the lock once it is given back. */
struct evq_nap_ctx {
    struct exs_evq_lock lock;
    int got; /* atomic */
};

static void *evq_nap_taker(void *arg)
{
    struct evq_nap_ctx *c = arg;

    exs__evq_lock(&c->lock);
    __atomic_store_n(&c->got, 1, __ATOMIC_RELEASE);
    exs__evq_unlock(&c->lock);
    return NULL;
}

START_TEST(test_evq_lock_naps)
{
    struct evq_nap_ctx c = {{0}, 0};
    unsigned long naps0 = __atomic_load_n(&exs__evq_lock_naps, __ATOMIC_RELAXED);
    uint64_t start = exs__now_ns();
    pthread_t t;

    exs__evq_lock(&c.lock);
    ck_assert_int_eq(pthread_create(&t, NULL, evq_nap_taker, &c), 0);
    while (__atomic_load_n(&exs__evq_lock_naps, __ATOMIC_RELAXED) < naps0 + 2) {
        ck_assert_msg(elapsed_ms(start) < 20000, "the waiter never napped");
        sched_yield();
    }
    ck_assert_int_eq(__atomic_load_n(&c.got, __ATOMIC_ACQUIRE), 0);
    exs__evq_unlock(&c.lock);
    pthread_join(t, NULL);
    ck_assert_int_eq(c.got, 1);
    ck_assert_int_eq(c.lock.v, 0);
}
END_TEST

Suite *api_evq_suite(void)
{
    Suite *s = suite_create("api_evq");
    TCase *tc;

    tc = tcase_create("handles");
    tcase_add_test(tc, test_create_delete);
    tcase_add_test(tc, test_bad_depth);
    tcase_add_test(tc, test_bad_handles);
    tcase_add_test(tc, test_stale_handle);
    tcase_add_test(tc, test_qwait_default);
    tcase_add_test(tc, test_destroy_all);
    suite_add_tcase(s, tc);

    tc = tcase_create("reserve");
    tcase_add_test(tc, test_reserve_depth);
    tcase_add_test(tc, test_op_cache);
    tcase_add_test(tc, test_ops_live);
    tcase_add_test(tc, test_delete_busy);
    suite_add_tcase(s, tc);

    tc = tcase_create("dequeue");
    tcase_add_test(tc, test_fifo);
    tcase_add_test(tc, test_take_types);
    tcase_add_test(tc, test_take_types_whole);
    tcase_add_test(tc, test_positive_partial);
    tcase_add_test(tc, test_threshold);
    tcase_add_test(tc, test_bad_args);
    tcase_add_test(tc, test_qfd);
    suite_add_tcase(s, tc);

    tc = tcase_create("wait");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_timeout, 0, (int)EXS_ARRAY_SIZE(wait_modes));
    tcase_add_test(tc, test_spin_every);
    tcase_add_test(tc, test_spin_learn);
    tcase_add_test(tc, test_spin_learn_queue);
    tcase_add_loop_test(tc, test_wake, 0, (int)EXS_ARRAY_SIZE(wait_modes));
    tcase_add_loop_test(tc, test_delete_wakes, 0, (int)EXS_ARRAY_SIZE(wait_modes));
    tcase_add_loop_test(tc, test_eintr, 0, 4);
    suite_add_tcase(s, tc);

    tc = tcase_create("threads");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_mpmc, 0, (int)EXS_ARRAY_SIZE(wait_modes));
    suite_add_tcase(s, tc);

    tc = tcase_create("lockfree");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_parked_reuse);
    tcase_add_test(tc, test_get_parked_reused);
    tcase_add_test(tc, test_spin_deleted_reused);
    tcase_add_test(tc, test_orphan_not_reused);
    tcase_add_test(tc, test_reserve_delete_race);
    tcase_add_test(tc, test_lite_lock);
    tcase_add_test(tc, test_evq_lock);
    tcase_add_test(tc, test_evq_lock_naps);
    suite_add_tcase(s, tc);
    return s;
}
