/* SPDX-License-Identifier: MIT */
/* Session 27 (h78, issue 28): exs_recv and exs_send's whole way (a SEQPACKET send, or a
 * STREAM send the copy at the post does not take) use the socket named by the calling
 * thread's hazard record, without a reference (spec/api.md "Hazard records"; xfer.c
 * xfer_post). Each case holds the conn's lock, so that a thread T's post stops inside
 * exs__conn_post, and looks at T's record and the socket's count there:
 *
 * hz_recv_unreferenced, hz_seqpacket_send_unreferenced: the record names the socket and
 * the count is the one before the call (with a reference taken, as before, the record is
 * empty and the count one higher).
 * hz_timeo_referenced: an asynchronous receive on a socket with SO_ASYNC_RECV_TIMEOUT goes
 * with a reference (its notices' timer and job take references of their own, which must
 * never raise a count at 0): the record is empty, the count raised.
 * hz_sync_wait_unnamed: a synchronous receive's record lets go before the call waits for
 * its event (a record names a socket across one post only).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/api/api_int.h"
#include "exs/proto/conn.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#include <sys/exs.h>

struct hz27_arg {
    int fd;
    int recv;          /* exs_recv, else exs_send */
    exs_qhandle_t q;   /* EXS_QHANDLE_INVALID: a synchronous call */
    struct it_buf *b;  /* 64 bytes */
    struct api_hz *hz; /* atomic: T's record, published before the call (NULL: none) */
    int ready;         /* atomic: hz published */
    int ret, err;      /* the call's */
};

static void *hz27_thread(void *arg)
{
    struct hz27_arg *a = arg;
    struct api_hz *hz = exs__api_hz_self ? exs__api_hz_self : exs__api_hz_new();

    __atomic_store_n(&a->hz, hz, __ATOMIC_RELEASE);
    __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE);
    if (!hz)
        return NULL;
    a->ret = a->recv ? exs_recv(a->fd, a->b->p, 64, 0, a->q, IT_AH(7), a->b->mh)
                     : exs_send(a->fd, a->b->p, 64, 0, a->q, IT_AH(7), a->b->mh);
    a->err = a->ret < 0 ? errno : 0;
    return NULL;
}

static struct api_sock *hz27_sock(int fd)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    ck_assert_msg(s != NULL, "fd %d: no socket (%d)", fd, err);
    exs__api_sock_put(s); /* the pair keeps it */
    ck_assert_ptr_nonnull(s->conn);
    return s;
}

/* T waits for conn's lock (marked waited for) with its record naming s: a SEQPACKET send
 * that ends at its post (send_now, xfer.c) takes the lock before anything is counted. */
static int hz27_waits(struct exs_conn *conn, struct api_hz *hz, struct api_sock *s)
{
    return __atomic_load_n(&conn->lock.v, __ATOMIC_ACQUIRE) == 2 &&
           __atomic_load_n(&hz->s, __ATOMIC_ACQUIRE) == s;
}

/* T's post on fd stopped in exs__conn_post, or in exs__conn_send_now_begin (the conn's
 * lock held here): once its operation is counted (exs__api_sock_outstanding), or T waits
 * for the lock with its record naming s, T's record and the count are looked at. 1 when
 * done so; 0: T has no record (no membarrier: skip). */
static int hz27_look(struct it_pair *p, int fd, int recv, int *named_p, int *refs_p, int *base_p)
{
    struct api_sock *s = hz27_sock(fd);
    struct it_buf *b = it_buf_new(64, 1);
    struct hz27_arg a = {.fd = fd, .recv = recv, .q = fd == p->sfd ? p->sq : p->cq, .b = b};
    struct exs_conn *conn = s->conn;
    int ok;
    pthread_t th;
    double end;

    memset(b->p, 0x5a, 64);
    *base_p = __atomic_load_n(&s->refs, __ATOMIC_ACQUIRE);
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(pthread_create(&th, NULL, hz27_thread, &a), 0);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while (!__atomic_load_n(&a.ready, __ATOMIC_ACQUIRE) && it_now_ms() < end)
        sched_yield();
    ok = __atomic_load_n(&a.hz, __ATOMIC_ACQUIRE) != NULL;
    while (ok && exs__api_sock_outstanding(s, recv) == 0 && !hz27_waits(conn, a.hz, s) &&
           it_now_ms() < end)
        sched_yield();
    if (ok) {
        ck_assert_msg(exs__api_sock_outstanding(s, recv) == 1 || hz27_waits(conn, a.hz, s),
                      "T's post never counted, nor waits for the conn's lock");
        /* T is between its count and the end of exs__conn_post (this lock) */
        *named_p = __atomic_load_n(&a.hz->s, __ATOMIC_ACQUIRE) == s;
        *refs_p = __atomic_load_n(&s->refs, __ATOMIC_ACQUIRE);
    }
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    if (!ok) {
        it_buf_free(b);
        return 0;
    }
    ck_assert_msg(a.ret == 0, "T's post: %d (%s)", a.ret, strerror(a.err));
    ck_assert_ptr_null(__atomic_load_n(&a.hz->s, __ATOMIC_ACQUIRE)); /* let go */
    if (!__atomic_load_n(recv ? &s->rcv_timeo : &s->snd_timeo, __ATOMIC_RELAXED))
        ck_assert_int_eq(__atomic_load_n(&s->refs, __ATOMIC_ACQUIRE),
                         *base_p); /* (a notice
                                    * timer holds one) */
    /* the operation goes on as any other */
    if (recv) {
        struct it_buf *sb = it_buf_new(64, 1);
        int peer = fd == p->sfd ? p->cfd : p->sfd;
        exs_qhandle_t pq = fd == p->sfd ? p->cq : p->sq;

        memset(sb->p, 0xa5, 64);
        IT_POST_SEND(peer, sb->p, 64, pq, IT_AH(8), sb->mh);
        it_expect_send(pq, peer, IT_AH(8), 64);
        it_expect_recv(a.q, fd, IT_AH(7), 64, 0);
        ck_assert_int_eq(b->p[0], 0xa5);
        ck_assert_int_eq(b->p[63], 0xa5);
        it_buf_free(sb);
    } else {
        struct it_buf *rb = it_buf_new(64, 1);
        int peer = fd == p->sfd ? p->cfd : p->sfd;
        exs_qhandle_t pq = fd == p->sfd ? p->cq : p->sq;

        IT_POST_RECV(peer, rb->p, 64, pq, IT_AH(9), rb->mh);
        it_expect_send(a.q, fd, IT_AH(7), 64);
        it_expect_recv(pq, peer, IT_AH(9), 64, 0);
        ck_assert_int_eq(rb->p[0], 0x5a);
        it_buf_free(rb);
    }
    it_buf_free(b);
    return 1;
}

START_TEST(hz_recv_unreferenced)
{
    struct it_pair p;
    int named = 0, refs = 0, base = 0;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    if (!hz27_look(&p, p.sfd, 1, &named, &refs, &base)) {
        it_pair_close(&p);
        test_skip("hz_recv_unreferenced", "no membarrier(2): calls take references");
        return;
    }
    ck_assert_msg(named, "the receiving thread's record does not name the socket");
    ck_assert_msg(refs == base, "the receive took a reference (count %d, %d before)", refs, base);
    it_pair_close(&p);
}
END_TEST

START_TEST(hz_seqpacket_send_unreferenced)
{
    struct it_pair p;
    int named = 0, refs = 0, base = 0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    if (!hz27_look(&p, p.cfd, 0, &named, &refs, &base)) {
        it_pair_close(&p);
        test_skip("hz_seqpacket_send_unreferenced", "no membarrier(2): calls take references");
        return;
    }
    ck_assert_msg(named, "the sending thread's record does not name the socket");
    ck_assert_msg(refs == base, "the send took a reference (count %d, %d before)", refs, base);
    it_pair_close(&p);
}
END_TEST

START_TEST(hz_timeo_referenced)
{
    struct it_pair p;
    int named = 1, refs = 0, base = 0, v = 60000;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    IT_EXPECT_OK(exs_setsockopt(p.sfd, SOL_EXS, SO_ASYNC_RECV_TIMEOUT, &v, sizeof(v)));
    if (!hz27_look(&p, p.sfd, 1, &named, &refs, &base)) {
        it_pair_close(&p);
        test_skip("hz_timeo_referenced", "no membarrier(2): calls take references");
        return;
    }
    ck_assert_msg(!named, "a receive with timeout notices used the socket unreferenced");
    ck_assert_msg(refs > base, "the receive took no reference (count %d, %d before)", refs, base);
    it_pair_close(&p);
}
END_TEST

START_TEST(hz_sync_wait_unnamed)
{
    struct it_pair p;
    struct api_sock *s;
    struct it_buf *b, *sb;
    struct hz27_arg a = {0};
    pthread_t th;
    double end;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    s = hz27_sock(p.sfd);
    b = it_buf_new(64, 1);
    a = (struct hz27_arg){.fd = p.sfd, .recv = 1, .q = EXS_QHANDLE_INVALID, .b = b};
    ck_assert_int_eq(pthread_create(&th, NULL, hz27_thread, &a), 0);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while (!__atomic_load_n(&a.ready, __ATOMIC_ACQUIRE) && it_now_ms() < end)
        sched_yield();
    if (!__atomic_load_n(&a.hz, __ATOMIC_ACQUIRE)) {
        ck_assert_int_eq(pthread_join(th, NULL), 0);
        it_buf_free(b);
        it_pair_close(&p);
        test_skip("hz_sync_wait_unnamed", "no membarrier(2): calls take references");
        return;
    }
    /* posted (counted), then waiting for its event, which needs a send: the record must
     * let go meanwhile */
    while (!exs__api_sock_outstanding(s, 1) && it_now_ms() < end)
        sched_yield();
    ck_assert_int_eq(exs__api_sock_outstanding(s, 1), 1);
    while (__atomic_load_n(&a.hz->s, __ATOMIC_ACQUIRE) && it_now_ms() < end)
        sched_yield();
    ck_assert_msg(!__atomic_load_n(&a.hz->s, __ATOMIC_ACQUIRE),
                  "a synchronous receive's record names its socket while it waits");
    ck_assert_int_eq(exs__api_sock_outstanding(s, 1), 1); /* still waiting */
    sb = it_buf_new(64, 1);
    memset(sb->p, 0xa5, 64);
    IT_POST_SEND(p.cfd, sb->p, 64, p.cq, IT_AH(8), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(8), 64);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(a.ret, 64);
    ck_assert_int_eq(b->p[0], 0xa5);
    it_buf_free(sb);
    it_buf_free(b);
    it_pair_close(&p);
}
END_TEST

Suite *integ_hz27_suite(void)
{
    Suite *s = suite_create("integ_hz27");

    it_suite_add(s, "hz27", 60, 1,
                 (const TTest *const[]){hz_recv_unreferenced, hz_seqpacket_send_unreferenced,
                                        hz_timeo_referenced, hz_sync_wait_unnamed, NULL});
    return s;
}
