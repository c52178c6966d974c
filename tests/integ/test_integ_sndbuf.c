/* SPDX-License-Identifier: MIT */
/* The STREAM send buffer (spec/protocol.md §7.5, SO_SNDBUF): small sends complete once copied, in
 * order, and close still sends them. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/api/api_int.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#define SB_N     32  /* small sends */
#define SB_LEN   256 /* bytes each: SB_N x SB_LEN is 8 times the receiver's ring */
#define SB_RING  "1024"
#define SB_TOTAL (SB_N * SB_LEN)

static void sb_stats(int fd, struct exs_sock_stats *st)
{
    socklen_t len = sizeof(*st);

    memset(st, 0, sizeof(*st));
    IT_EXPECT_OK(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, st, &len));
}

/* A pair whose receiving side has a 1 KiB ring that never grows. */
static void sb_open(struct it_pair *p, const char *sndbuf)
{
    it_setenv("EXS_RING_SIZE", SB_RING);
    it_setenv("EXS_RING_MAX", SB_RING); /* no autotuning */
    if (sndbuf)
        it_setenv("EXS_SNDBUF", sndbuf);
    it_init();
    it_pair_open(p, SOCK_STREAM, 2 * SB_N + 8, 2 * SB_N + 8);
}

/* The receiver takes SB_TOTAL bytes in one MSG_WAITALL receive and checks them. */
static void sb_receive_all(struct it_pair *p, struct it_buf *rb, uint32_t seed)
{
    IT_EXPECT_OK(exs_recv(p->sfd, rb->p, SB_TOTAL, MSG_WAITALL, p->sq, IT_AH(0x4EC), rb->mh));
    it_expect_recv(p->sq, p->sfd, IT_AH(0x4EC), SB_TOTAL, 0);
    ck_assert_int_eq(it_check(rb->p, SB_TOTAL, seed), -1);
}

/* _i 0: with the send buffer, every small send completes while the receiver has taken
 * nothing and its ring holds only 4 of them; _i 1: without it (EXS_SNDBUF 0) sends
 * complete only as the ring takes them. Either way the bytes arrive intact. */
START_TEST(sndbuf_sends_complete_at_once)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct exs_sock_stats st;
    exs_event_t ev;
    int done = 0;

    sb_open(&p, _i ? "0" : NULL);
    sb = it_buf_new(SB_TOTAL, 1);
    rb = it_buf_new(SB_TOTAL, 1);
    it_fill(sb->p, SB_TOTAL, 11);
    for (int i = 0; i < SB_N; i++)
        IT_POST_SEND(p.cfd, sb->p + i * SB_LEN, SB_LEN, p.cq, IT_AH(100 + i), sb->mh);
    if (!_i) {
        for (int i = 0; i < SB_N; i++)
            it_expect_send(p.cq, p.cfd, IT_AH(100 + i), SB_LEN);
        sb_stats(p.cfd, &st);
        ck_assert_int_eq(st.sends_copied, SB_N);
        ck_assert_int_eq(st.bytes_sent, SB_TOTAL);
        ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), SB_N); /* each at its post */
    } else {
        while (it_try_event(p.cq, EXS_EVT_SEND, p.cfd, 500, &ev) == 1) {
            ck_assert_int_eq(ev.exs_evt_errno, 0);
            ck_assert(ev.exs_evt_ahandle == IT_AH(100 + done));
            done++;
        }
        ck_assert_msg(done <= 1024 / SB_LEN,
                      "%d zero-copy sends completed: more than the ring holds", done);
        sb_stats(p.cfd, &st);
        ck_assert_int_eq(st.sends_copied, 0);
    }
    sb_receive_all(&p, rb, 11);
    if (_i)
        for (int i = done; i < SB_N; i++)
            it_expect_send(p.cq, p.cfd, IT_AH(100 + i), SB_LEN);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* A send buffer of 16 sends: the first 16 complete at once, the rest wait and are copied
 * (or written zero-copy) as the receiver drains; every event in order, every byte right. */
START_TEST(sndbuf_full_then_refilled)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct exs_sock_stats st;
    exs_event_t ev;
    int done;

    sb_open(&p, "4096");
    sb = it_buf_new(SB_TOTAL, 1);
    rb = it_buf_new(SB_TOTAL, 1);
    it_fill(sb->p, SB_TOTAL, 15);
    for (int i = 0; i < SB_N; i++)
        IT_POST_SEND(p.cfd, sb->p + i * SB_LEN, SB_LEN, p.cq, IT_AH(500 + i), sb->mh);
    for (done = 0; done < 4096 / SB_LEN; done++)
        it_expect_send(p.cq, p.cfd, IT_AH(500 + done), SB_LEN);
    /* then only what the ring (1 KiB) takes from the buffer frees room for more copies */
    while (it_try_event(p.cq, EXS_EVT_SEND, p.cfd, 300, &ev) == 1) {
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert(ev.exs_evt_ahandle == IT_AH(500 + done));
        done++;
    }
    ck_assert_msg(done <= (4096 + 1024) / SB_LEN,
                  "%d sends completed: more than the buffer and "
                  "the ring hold",
                  done);
    sb_receive_all(&p, rb, 15);
    for (int i = done; i < SB_N; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(500 + i), SB_LEN);
    sb_stats(p.cfd, &st);
    ck_assert_msg(st.sends_copied >= 4096 / SB_LEN && st.sends_copied <= SB_N, "sends_copied %llu",
                  (unsigned long long)st.sends_copied);
    ck_assert_int_eq(st.bytes_sent, SB_TOTAL);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* Copied and zero-copy sends mixed: events in posting order, bytes in order. */
START_TEST(sndbuf_mixed_order)
{
    static const size_t sizes[] = {100, 20000, 100, 100, 9000, 50, 64, 8192, 1, 30000, 7};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct exs_sock_stats st;
    size_t total = 0, off = 0;

    for (int i = 0; i < NS; i++)
        total += sizes[i];
    it_init();
    it_pair_open(&p, SOCK_STREAM, 32, 32);
    sb = it_buf_new(total, 1);
    rb = it_buf_new(total, 1);
    it_fill(sb->p, total, 12);
    for (int i = 0; i < NS; i++) {
        IT_POST_SEND(p.cfd, sb->p + off, sizes[i], p.cq, IT_AH(200 + i), sb->mh);
        off += sizes[i];
    }
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, total, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    for (int i = 0; i < NS; i++) /* it_expect_send checks the handle: posting order */
        it_expect_send(p.cq, p.cfd, IT_AH(200 + i), (ssize_t)sizes[i]);
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), (ssize_t)total, 0);
    ck_assert_int_eq(it_check(rb->p, total, 12), -1);
    sb_stats(p.cfd, &st);
    ck_assert_msg(st.sends_copied >= 1 && st.sends_copied <= 8, "sends_copied %llu",
                  (unsigned long long)st.sends_copied);
    ck_assert_int_eq(st.bytes_sent, total);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* exs_close right after copied sends the ring could not take yet: the peer still gets
 * every byte, then end of stream; the close completes without error. */
START_TEST(sndbuf_close_sends_copies)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_event_t ev;

    sb_open(&p, NULL);
    sb = it_buf_new(SB_TOTAL, 1);
    rb = it_buf_new(SB_TOTAL, 1);
    it_fill(sb->p, SB_TOTAL, 13);
    for (int i = 0; i < SB_N; i++)
        IT_POST_SEND(p.cfd, sb->p + i * SB_LEN, SB_LEN, p.cq, IT_AH(300 + i), sb->mh);
    for (int i = 0; i < SB_N; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(300 + i), SB_LEN);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), SB_N); /* no operation of them left */
    IT_EXPECT_OK(exs_close(p.cfd, p.cq, IT_AH(0xC105E)));
    sb_receive_all(&p, rb, 13);
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, 16, 0, p.sq, IT_AH(0xE0F), rb->mh));
    it_expect_recv(p.sq, p.sfd, IT_AH(0xE0F), 0, 0); /* end of stream, not a reset */
    it_wait_event(p.cq, EXS_EVT_CLOSE, p.cfd, &ev);
    ck_assert(ev.exs_evt_ahandle == IT_AH(0xC105E));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    p.cfd = -1;
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

static int sb_get(int fd)
{
    int v = -1;
    socklen_t len = sizeof(v);

    IT_EXPECT_OK(exs_getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &len));
    ck_assert_int_eq(len, sizeof(v));
    return v;
}

static void sb_set(int fd, int v, int err)
{
    if (err)
        IT_EXPECT_FAIL(exs_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)), err);
    else
        IT_EXPECT_OK(exs_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)));
}

/* SO_SNDBUF: default EXS_SNDBUF, bounds, rounding, only before connecting, inherited by
 * accepted sockets; 0 sends zero-copy (nothing copied). */
START_TEST(sndbuf_option)
{
    struct sockaddr_in addr;
    struct exs_sock_stats st;
    struct it_buf *b;
    exs_qhandle_t q;
    exs_event_t ev;
    int lfd, cfd, sfd;

    it_setenv("EXS_SNDBUF", "131072");
    it_init();
    q = it_qcreate(64);
    b = it_buf_new(4096, 1);
    lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    ck_assert_int_eq(sb_get(lfd), 131072);
    sb_set(lfd, 100, EINVAL); /* below 4096 (and not 0) */
    sb_set(lfd, -1, EINVAL);
    sb_set(lfd, (64 << 20) + 64, EINVAL);
    sb_set(lfd, 5000, 0);
    ck_assert_int_eq(sb_get(lfd), 5056); /* rounded up to 64 */
    it_close(lfd, q);

    lfd = it_listen(SOCK_STREAM, &addr);
    sb_set(lfd, 8192, EINVAL); /* listening: too late, as for SO_RCVBUF */
    it_close(lfd, q);
    /* the listener's value goes to the sockets it accepts */
    lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    sb_set(lfd, 8192, 0);
    {
        struct sockaddr_in any = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t alen = sizeof(addr);

        IT_EXPECT_OK(exs_bind(lfd, (struct sockaddr *)&any, sizeof(any)));
        IT_EXPECT_OK(exs_listen(lfd, 4));
        IT_EXPECT_OK(exs_getsockname(lfd, (struct sockaddr *)&addr, &alen));
    }
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    sb_set(cfd, 0, 0);
    ck_assert_int_eq(sb_get(cfd), 0);
    IT_EXPECT_OK(exs_connect(cfd, (struct sockaddr *)&addr, sizeof(addr), q, IT_AH(2)));
    it_expect_err(q, EXS_EVT_CONNECT, cfd, IT_AH(2), 0);
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(sfd, 0);
    ck_assert_int_eq(sb_get(sfd), 8192);
    sb_set(cfd, 4096, EINVAL); /* connected */
    /* the client copies nothing, the server does */
    IT_EXPECT_OK(exs_recv(sfd, b->p, 100, MSG_WAITALL, q, IT_AH(3), b->mh));
    IT_POST_SEND(cfd, b->p + 2048, 100, q, IT_AH(4), b->mh);
    it_expect_send(q, cfd, IT_AH(4), 100);
    it_expect_recv(q, sfd, IT_AH(3), 100, 0);
    IT_EXPECT_OK(exs_recv(cfd, b->p, 100, MSG_WAITALL, q, IT_AH(5), b->mh));
    IT_POST_SEND(sfd, b->p + 2048, 100, q, IT_AH(6), b->mh);
    it_expect_send(q, sfd, IT_AH(6), 100);
    it_expect_recv(q, cfd, IT_AH(5), 100, 0);
    sb_stats(cfd, &st);
    ck_assert_int_eq(st.sends_copied, 0);
    sb_stats(sfd, &st);
    ck_assert_int_eq(st.sends_copied, 1);
    it_close(cfd, q);
    it_close(sfd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_buf_free(b);
}
END_TEST

/* exs_cancel never reaches the library's copies: cancelling the handle of a completed
 * copied send finds nothing, and the bytes still arrive. */
START_TEST(sndbuf_cancel_spares_copies)
{
    struct it_pair p;
    struct it_buf *sb, *rb;

    sb_open(&p, NULL);
    sb = it_buf_new(SB_TOTAL, 1);
    rb = it_buf_new(SB_TOTAL, 1);
    it_fill(sb->p, SB_TOTAL, 14);
    for (int i = 0; i < SB_N; i++)
        IT_POST_SEND(p.cfd, sb->p + i * SB_LEN, SB_LEN, p.cq, IT_AH(400 + i), sb->mh);
    for (int i = 0; i < SB_N; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(400 + i), SB_LEN);
    for (int i = 0; i < SB_N; i++)
        IT_EXPECT_OK(exs_cancel(p.cfd, IT_AH(400 + i), 0));
    it_expect_no_event(p.cq, 100);
    sb_receive_all(&p, rb, 14);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* Sends that end at their post (spec/proto-layout.md, "A send that ends at its post"),
 * mixed with what must keep its order: a receive of the sender pending throughout, a
 * zero-copy send the ring cannot take yet (small sends behind it wait for its event and
 * are not taken at their post), a synchronous send (its result, no event). Events come in
 * posting order, the pending receive completes when the peer sends, every byte arrives. */
START_TEST(sndbuf_copy_at_post_order)
{
    enum { BIG = 20000, N1 = 6, N2 = 4, TOTAL = (N1 + 1 + N2) * SB_LEN + BIG };
    struct it_pair p;
    struct it_buf *sb, *rb, *cb;
    uint64_t c0;
    size_t off = 0;

    sb_open(&p, NULL);
    sb = it_buf_new(TOTAL, 1);
    rb = it_buf_new(TOTAL, 1);
    cb = it_buf_new(64, 1);
    it_fill(sb->p, TOTAL, 21);
    IT_EXPECT_OK(exs_recv(p.cfd, cb->p, 64, 0, p.cq, IT_AH(0x7EC), cb->mh));
    c0 = it_posts_copied(p.cfd, 0, NULL);
    for (int i = 0; i < N1; i++, off += SB_LEN)
        IT_POST_SEND(p.cfd, sb->p + off, SB_LEN, p.cq, IT_AH(600 + i), sb->mh);
    for (int i = 0; i < N1; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(600 + i), SB_LEN);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + N1);
    /* synchronous: the result at once */
    ck_assert_int_eq(exs_send(p.cfd, sb->p + off, SB_LEN, 0, EXS_QHANDLE_INVALID, NULL, sb->mh),
                     SB_LEN);
    off += SB_LEN;
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + N1 + 1);
    /* zero-copy, more than the buffer and the 1 KiB ring take before the receiver reads */
    IT_POST_SEND(p.cfd, sb->p + off, BIG, p.cq, IT_AH(700), sb->mh);
    off += BIG;
    for (int i = 0; i < N2; i++, off += SB_LEN)
        IT_POST_SEND(p.cfd, sb->p + off, SB_LEN, p.cq, IT_AH(710 + i), sb->mh);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + N1 + 1); /* behind the big one */
    it_expect_no_event(p.cq, 100);
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, TOTAL, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    it_expect_send(p.cq, p.cfd, IT_AH(700), BIG);
    for (int i = 0; i < N2; i++)
        it_expect_send(p.cq, p.cfd, IT_AH(710 + i), SB_LEN);
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), TOTAL, 0);
    ck_assert_int_eq(it_check(rb->p, TOTAL, 21), -1);
    /* the sender's receive was there all along */
    IT_POST_SEND(p.sfd, rb->p, 64, p.sq, IT_AH(0x5E), rb->mh);
    it_expect_send(p.sq, p.sfd, IT_AH(0x5E), 64);
    it_expect_recv(p.cq, p.cfd, IT_AH(0x7EC), 64, 0);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_buf_free(cb);
}
END_TEST

/* A pair (sb_open) with a 4 KiB send buffer filled from seed and a 4 KiB receive buffer,
 * both registered; returns the sends of cfd copied at their post so far. */
static uint64_t sb_open_copy(struct it_pair *p, struct it_buf **sb, struct it_buf **rb,
                             uint32_t seed)
{
    sb_open(p, NULL);
    *sb = it_buf_new(4096, 1);
    *rb = it_buf_new(4096, 1);
    it_fill((*sb)->p, 4096, seed);
    return it_posts_copied(p->cfd, 0, NULL);
}

/* A send that would end at its post fails as before: a handle that does not cover the
 * buffer (past its end, before its start) or no handle (EINVAL;
 * the registration's last bytes exactly are taken), a full queue (EAGAIN, nothing sent), after
 * exs_shutdown (EPIPE), on a closed descriptor (EBADF); none is counted as copied, and a send after
 * a refused one still works. */
START_TEST(sndbuf_copy_at_post_errors)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_qhandle_t q1;
    uint64_t c0;

    c0 = sb_open_copy(&p, &sb, &rb, 22);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p + 4096 - 32, 64, 0, p.cq, IT_AH(1), sb->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p - 32, 64, 0, p.cq, IT_AH(1), sb->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, IT_AH(1), sb->mh + 1000), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, MSG_WAITALL, p.cq, IT_AH(1), sb->mh), EINVAL);
    q1 = it_qcreate(1);
    IT_POST_SEND(p.cfd, sb->p, 64, q1, IT_AH(2), sb->mh);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p + 64, 64, 0, q1, IT_AH(3), sb->mh), EAGAIN);
    it_expect_send(q1, p.cfd, IT_AH(2), 64);
    IT_POST_SEND(p.cfd, sb->p + 64, 64, q1, IT_AH(4), sb->mh);
    it_expect_send(q1, p.cfd, IT_AH(4), 64);
    it_qdelete(q1);
    /* the registration's last bytes exactly: taken */
    IT_POST_SEND(p.cfd, sb->p + 4096 - 64, 64, p.cq, IT_AH(9), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(9), 64);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + 3);
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, 192, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), 192, 0);
    ck_assert_int_eq(it_check(rb->p, 128, 22), -1);
    ck_assert_int_eq(memcmp(rb->p + 128, sb->p + 4096 - 64, 64), 0);
    IT_EXPECT_OK(exs_shutdown(p.cfd, SHUT_WR, p.cq, IT_AH(5)));
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, IT_AH(6), sb->mh), EPIPE);
    it_expect_err(p.cq, EXS_EVT_SHUTDOWN, p.cfd, IT_AH(5), 0);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, IT_AH(7), sb->mh), EPIPE);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + 3);
    it_close(p.cfd, p.cq);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, IT_AH(8), sb->mh), EBADF);
    p.cfd = -1;
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* The registration a send that ends at its post is checked against (xfer.c, mreg_covers:
 * the one its socket's hint names when that one carries the handle, else the table's):
 * a handle deregistered after a copied send, its record registered again under a new
 * handle, is refused (EINVAL), as is a live handle of another registration that does not
 * cover the buffer, and the handle deregistered last; the live handles each work in turn
 * on one socket. Exactly the four good sends are copied at their post and their bytes
 * arrive in order. Seen failing (the stale handle's send taken) with the handle compares
 * of the hint and of the record after addr and len taken out. */
START_TEST(sndbuf_copy_at_post_handles)
{
    struct it_pair p;
    struct it_buf *rb;
    uint8_t *a = malloc(4096), *b = malloc(4096);
    exs_mhandle_t h1, h2, h3;
    uint64_t c0;

    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    sb_open(&p, NULL);
    rb = it_buf_new(4096, 1);
    it_fill(a, 4096, 31);
    it_fill(b, 4096, 32);
    c0 = it_posts_copied(p.cfd, 0, NULL);
    h1 = exs_mregister(a, 4096, 0);
    ck_assert_int_gt(h1, 0);
    IT_POST_SEND(p.cfd, a, 64, p.cq, IT_AH(1), h1);
    it_expect_send(p.cq, p.cfd, IT_AH(1), 64);
    IT_EXPECT_OK(exs_mderegister(h1));
    h2 = exs_mregister(a, 4096, 0); /* the parked record of h1, most likely */
    ck_assert_int_gt(h2, 0);
    ck_assert_int_ne(h2, h1);
    IT_EXPECT_FAIL(exs_send(p.cfd, a + 64, 64, 0, p.cq, IT_AH(2), h1), EINVAL);
    IT_POST_SEND(p.cfd, a + 64, 64, p.cq, IT_AH(3), h2);
    it_expect_send(p.cq, p.cfd, IT_AH(3), 64);
    h3 = exs_mregister(b, 4096, 0);
    ck_assert_int_gt(h3, 0);
    IT_POST_SEND(p.cfd, b, 64, p.cq, IT_AH(4), h3);
    it_expect_send(p.cq, p.cfd, IT_AH(4), 64);
    IT_EXPECT_FAIL(exs_send(p.cfd, a + 128, 64, 0, p.cq, IT_AH(5), h3), EINVAL);
    IT_POST_SEND(p.cfd, a + 128, 64, p.cq, IT_AH(6), h2);
    it_expect_send(p.cq, p.cfd, IT_AH(6), 64);
    IT_EXPECT_OK(exs_mderegister(h2));
    IT_EXPECT_FAIL(exs_send(p.cfd, a + 192, 64, 0, p.cq, IT_AH(7), h2), EINVAL);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + 4);
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, 256, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), 256, 0);
    ck_assert_int_eq(memcmp(rb->p, a, 64), 0);
    ck_assert_int_eq(memcmp(rb->p + 64, a + 64, 64), 0);
    ck_assert_int_eq(memcmp(rb->p + 128, b, 64), 0);
    ck_assert_int_eq(memcmp(rb->p + 192, a + 128, 64), 0);
    it_expect_no_event(p.cq, 50);
    IT_EXPECT_OK(exs_mderegister(h3));
    it_pair_close(&p);
    it_buf_free(rb);
    free(a);
    free(b);
}
END_TEST

/* The queue a send that ends at its post reserves its event's slot in
 * (exs__evq_reserve_hint: the queue its socket's hint names when that queue's state says
 * it is still the handle's live queue, else the table's): a queue deleted after a copied
 * send, its memory made a new queue, is refused by its old handle (EINVAL) and the new
 * queue gets its own event; the hint follows each queue used in turn; a full queue
 * (depth 1, its event not taken) answers EAGAIN, then takes a send again once emptied.
 * Exactly the five good sends are copied at their post, each event on its own queue only,
 * and the bytes arrive in order. Seen failing (the old handle's send taken, its event on
 * the new queue) with the reservation's check that st names q taken out. */
START_TEST(sndbuf_copy_at_post_queues)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    exs_qhandle_t q1, q2, q3;
    uint64_t c0;

    c0 = sb_open_copy(&p, &sb, &rb, 41);
    q1 = it_qcreate(4);
    IT_POST_SEND(p.cfd, sb->p, 64, q1, IT_AH(1), sb->mh);
    it_expect_send(q1, p.cfd, IT_AH(1), 64);
    it_qdelete(q1);
    q2 = it_qcreate(4); /* q1's parked queue, most likely */
    ck_assert_int_ne(q2, q1);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p + 64, 64, 0, q1, IT_AH(2), sb->mh), EINVAL);
    IT_POST_SEND(p.cfd, sb->p + 64, 64, q2, IT_AH(3), sb->mh);
    it_expect_send(q2, p.cfd, IT_AH(3), 64);
    IT_POST_SEND(p.cfd, sb->p + 128, 64, p.cq, IT_AH(4), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(4), 64);
    q3 = it_qcreate(1);
    IT_POST_SEND(p.cfd, sb->p + 192, 64, q3, IT_AH(5), sb->mh);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p + 256, 64, 0, q3, IT_AH(6), sb->mh), EAGAIN);
    it_expect_send(q3, p.cfd, IT_AH(5), 64);
    IT_POST_SEND(p.cfd, sb->p + 256, 64, q3, IT_AH(7), sb->mh);
    it_expect_send(q3, p.cfd, IT_AH(7), 64);
    ck_assert_uint_eq(it_posts_copied(p.cfd, 0, NULL), c0 + 5);
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, 320, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), 320, 0);
    ck_assert_int_eq(it_check(rb->p, 320, 41), -1);
    it_expect_no_event(q2, 50);
    it_expect_no_event(q3, 0);
    it_expect_no_event(p.cq, 0);
    it_qdelete(q2);
    it_qdelete(q3);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
}
END_TEST

/* A second thread's record naming a socket (sndbuf_copy_at_post_hazard): named at
 * step 1, let go of at step 3. */
struct sbh_arg {
    int fd;
    int step; /* atomic: 1 named (or failed: s NULL), 2 let go now, 3 let go */
    struct api_sock *s;
};

static void *sbh_holder(void *arg)
{
    struct sbh_arg *a = arg;
    struct api_hz *hz = exs__api_hz_self ? exs__api_hz_self : exs__api_hz_new();

    a->s = hz ? exs__api_sock_hz(a->fd, hz) : NULL;
    __atomic_store_n(&a->step, 1, __ATOMIC_RELEASE);
    if (!a->s)
        return NULL;
    while (__atomic_load_n(&a->step, __ATOMIC_ACQUIRE) != 2)
        sched_yield();
    exs__api_hz_clear(hz, a->s);
    __atomic_store_n(&a->step, 3, __ATOMIC_RELEASE);
    return NULL;
}

/* A socket named by hazard records (api_int.h "Hazards": exs_send's copy at the post uses
 * the socket without a reference) outlives its last reference until every thread naming
 * it lets go: this thread and a second one name cfd's socket as send_copy does
 * (exs__api_sock_hz); cfd is closed and its last put awaited (deadline), which leaves the
 * socket to the records: not parked (the live count keeps it), unclaimed; this thread
 * lets go (exs__api_hz_clear): still kept, the other record names it; the other thread
 * lets go: finished (the count drops by one, claimed once). Then a record finds nothing
 * at the closed number. Seen failing (the socket parked while named) with
 * exs__api_sock_hz_finish's look at the records taken out. */
START_TEST(sndbuf_copy_at_post_hazard)
{
    struct it_pair p;
    struct api_hz *hz;
    struct api_sock *s;
    struct sbh_arg a = {0};
    pthread_t th;
    int live, fd;
    double end;

    sb_open(&p, NULL);
    hz = exs__api_hz_self ? exs__api_hz_self : exs__api_hz_new();
    if (!hz) {
        it_pair_close(&p);
        test_skip("sndbuf_copy_at_post_hazard", "no membarrier(2): sends take references");
        return;
    }
    fd = a.fd = p.cfd;
    s = exs__api_sock_hz(fd, hz);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(pthread_create(&th, NULL, sbh_holder, &a), 0);
    end = it_now_ms() + 20000;
    while (!__atomic_load_n(&a.step, __ATOMIC_ACQUIRE) && it_now_ms() < end)
        sched_yield();
    ck_assert_ptr_eq(a.s, s);
    live = exs__api_sock_live();
    it_close(fd, p.cq);
    p.cfd = -1;
    while (!(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_DEFER) && it_now_ms() < end)
        (void)exs_qdequeue(p.cq, NULL, 0, 0); /* drive progress */
    ck_assert_msg(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_DEFER,
                  "no last put within 20 s");
    ck_assert_int_eq(__atomic_load_n(&s->refs, __ATOMIC_ACQUIRE), 0);
    ck_assert_int_eq(exs__api_sock_live(), live); /* not parked while named */
    ck_assert_int_eq(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_CLAIMED, 0);
    exs__api_hz_clear(hz, s);
    ck_assert_int_eq(exs__api_sock_live(), live); /* the other record still names it */
    ck_assert_int_eq(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_CLAIMED, 0);
    __atomic_store_n(&a.step, 2, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(a.step, 3);
    ck_assert_int_ne(__atomic_load_n(&s->hz, __ATOMIC_ACQUIRE) & EXS_API_HZ_CLAIMED, 0);
    ck_assert_int_eq(exs__api_sock_live(), live - 1);
    ck_assert_ptr_null(exs__api_sock_hz(fd, hz));
    ck_assert_ptr_null(__atomic_load_n(&hz->s, __ATOMIC_ACQUIRE));
    it_pair_close(&p);
}
END_TEST

/* Two threads sending on one socket at once. Each message starts with its sender's
 * number and its index; every 40th of thread 1 is larger than copy_max (zero-copy: the
 * small sends behind it wait for its event, taking the whole way), the rest are copied at
 * the post. The order of the send events must be the order of the messages in the stream,
 * whichever thread and path each took (every send's event is posted under the conn's
 * lock, in stream order). */
#define SBT_N     300
#define SBT_SMALL 64
#define SBT_BIG   12000

struct sbt_arg {
    struct it_pair *p;
    struct it_buf *b; /* SBT_N slots of SBT_BIG bytes */
    int t;
    int err; /* errno of a failed send, or 0 */
};

static size_t sbt_len(int t, int i)
{
    return t == 1 && i % 40 == 39 ? SBT_BIG : SBT_SMALL;
}

static void *sbt_sender(void *arg)
{
    struct sbt_arg *a = arg;

    for (int i = 0; i < SBT_N; i++) {
        uint8_t *m = a->b->p + (size_t)i * SBT_BIG;
        size_t len = sbt_len(a->t, i);

        memset(m, 0x40 + a->t, len);
        m[0] = (uint8_t)a->t;
        memcpy(m + 1, &i, sizeof(i));
        if (exs_send(a->p->cfd, m, len, 0, a->p->cq, IT_AH((a->t << 16) | i), a->b->mh) < 0) {
            a->err = errno;
            break;
        }
    }
    return NULL;
}

START_TEST(sndbuf_copy_at_post_threads)
{
    struct it_pair p;
    struct sbt_arg a[2];
    pthread_t th[2];
    struct it_buf *rb;
    size_t total = 0, off = 0;
    exs_event_t ev;

    for (int t = 0; t < 2; t++)
        for (int i = 0; i < SBT_N; i++)
            total += sbt_len(t, i);
    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 2 * SBT_N + 8);
    rb = it_buf_new(total, 1);
    for (int t = 0; t < 2; t++) {
        a[t] = (struct sbt_arg){.p = &p, .b = it_buf_new((size_t)SBT_N * SBT_BIG, 1), .t = t};
        ck_assert_int_eq(pthread_create(&th[t], NULL, sbt_sender, &a[t]), 0);
    }
    for (int t = 0; t < 2; t++) {
        ck_assert_int_eq(pthread_join(th[t], NULL), 0);
        ck_assert_int_eq(a[t].err, 0);
    }
    IT_EXPECT_OK(exs_recv(p.sfd, rb->p, total, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
    it_expect_recv(p.sq, p.sfd, IT_AH(0x4EC), (ssize_t)total, 0);
    /* walk the stream: each message's send event comes next, whole */
    for (int n = 0; n < 2 * SBT_N; n++) {
        int t = rb->p[off], i;

        ck_assert_int_le(t, 1);
        memcpy(&i, rb->p + off + 1, sizeof(i));
        ck_assert_int_lt(i, SBT_N);
        it_wait_event(p.cq, EXS_EVT_SEND, p.cfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_msg(IT_AHN(ev.exs_evt_ahandle) == ((t << 16) | i),
                      "message %d of the stream is thread %d's #%d, its event names %ld", n, t, i,
                      IT_AHN(ev.exs_evt_ahandle));
        ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)sbt_len(t, i));
        off += sbt_len(t, i);
    }
    ck_assert_uint_eq(off, total);
    ck_assert_uint_gt(it_posts_copied(p.cfd, 0, NULL), 0);
    it_pair_close(&p);
    it_buf_free(rb);
    it_buf_free(a[0].b);
    it_buf_free(a[1].b);
}
END_TEST

/* Sends copied at their post carried across a cut-over (spec/protocol.md §9.2): the primary
 * path (fault:tcp) disconnects at the Nth send post while small sends, copied at their post
 * until the cut (exs_conn.posts_copied), are on their way; the connection resumes over the fallback
 * (tcp, policy any) and the peer gets every byte once, in order: the send buffer's runs are
 * replayed from it. A cut that cannot be resumed ends the attempt (the next one drops
 * later); at least one resume is required. tcp only. */
START_TEST(sndbuf_copy_at_post_cut)
{
    enum { N = 64, LEN = 256, TOTAL = N * LEN };
    int resumed = 0;

    if (strcmp(it_provider, "tcp") != 0 && strcmp(it_provider, "fault:tcp") != 0) {
        test_skip("sndbuf_copy_at_post_cut", "needs the tcp provider (primary fault:tcp)");
        return;
    }
    it_setenv("EXS_FALLBACK", "any");
    it_setenv("EXS_FALLBACK_PORT_OFFSET", "1000");
    it_fault_init();
    for (int attempt = 0; attempt < 8 && !resumed; attempt++) {
        struct it_buf *sb = it_buf_new(TOTAL, 1), *rb = it_buf_new(TOTAL, 1);
        uint64_t res0 = it_fallback_count("fallback_resumes"), c0;
        struct it_pair p;
        exs_event_t ev;
        char nth[16];

        it_pair_open(&p, SOCK_STREAM, 2 * N + 8, 2 * N + 8);
        c0 = it_posts_copied(p.cfd, 0, NULL);
        it_fill(sb->p, TOTAL, 30 + (uint32_t)attempt);
        IT_EXPECT_OK(exs_recv(p.sfd, rb->p, TOTAL, MSG_WAITALL, p.sq, IT_AH(0x4EC), rb->mh));
        it_fault_set_port(&p);
        snprintf(nth, sizeof(nth), "%d", 2 + attempt);
        it_fault_set("fault_drop_nth", nth);
        for (int i = 0; i < N; i++)
            IT_POST_SEND(p.cfd, sb->p + i * LEN, LEN, p.cq, IT_AH(800 + i), sb->mh);
        for (int i = 0; i < N; i++)
            it_expect_send(p.cq, p.cfd, IT_AH(800 + i), LEN);
        /* the first posts are copied at their post (CONNECTED, the buffer empty); how many
         * more depends on when the cut and the resume come (a post while RESUMING goes the
         * whole way): at least one, never more than N */
        ck_assert_uint_gt(it_posts_copied(p.cfd, 0, NULL), c0);
        ck_assert_uint_le(it_posts_copied(p.cfd, 0, NULL), c0 + N);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        it_fault_set("fault_drop_nth", "0");
        if (!ev.exs_evt_errno) {
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, TOTAL);
            ck_assert_int_eq(it_check(rb->p, TOTAL, 30 + (uint32_t)attempt), -1);
            resumed = it_fallback_count("fallback_resumes") > res0;
        }
        it_pair_close(&p);
        it_buf_free(sb);
        it_buf_free(rb);
    }
    ck_assert_msg(resumed, "no cut was resumed in 8 attempts");
}
END_TEST

Suite *integ_sndbuf_suite(void)
{
    Suite *s = suite_create("integ_sndbuf");
    TCase *tc = it_tcase("sndbuf", 60);

    tcase_add_loop_test(tc, sndbuf_sends_complete_at_once, 0, 2);
    tcase_add_test(tc, sndbuf_full_then_refilled);
    tcase_add_test(tc, sndbuf_mixed_order);
    tcase_add_test(tc, sndbuf_close_sends_copies);
    tcase_add_test(tc, sndbuf_option);
    tcase_add_test(tc, sndbuf_cancel_spares_copies);
    tcase_add_test(tc, sndbuf_copy_at_post_order);
    tcase_add_test(tc, sndbuf_copy_at_post_errors);
    tcase_add_test(tc, sndbuf_copy_at_post_handles);
    tcase_add_test(tc, sndbuf_copy_at_post_queues);
    tcase_add_test(tc, sndbuf_copy_at_post_hazard);
    tcase_add_test(tc, sndbuf_copy_at_post_threads);
    suite_add_tcase(s, tc);
    tc = tcase_create("sndbuf_cut");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, it_fault_teardown);
    tcase_add_test(tc, sndbuf_copy_at_post_cut);
    suite_add_tcase(s, tc);
    return s;
}
