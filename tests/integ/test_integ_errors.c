/* SPDX-License-Identifier: MIT */
/* Every error path of the ES-API posting calls, one test per errno group: the call fails, posts
 * nothing and queues no event. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/util/util.h"
#include "tests/integ/integ.h"

#define AH(n) IT_AH(n)

/* A descriptor number that is not open. */
static int closed_fd(void)
{
    for (int fd = 900; fd < 2000; fd++) {
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF)
            return fd;
    }
    ck_abort_msg("no closed descriptor number found");
    return -1;
}

/* Send a marker message client -> server and check it is the next message the server
 * gets: the failed calls before sent nothing. */
static void check_marker(struct it_pair *p, long ah)
{
    struct it_buf *s = it_buf_new(100, 1), *r = it_buf_new(200, 1);
    long bad;

    it_fill(s->p, 100, 0xABCD0000u + (uint32_t)ah);
    IT_POST_RECV(p->sfd, r->p, 200, p->sq, AH(ah), r->mh);
    IT_POST_SEND(p->cfd, s->p, 100, p->cq, AH(ah), s->mh);
    it_expect_recv(p->sq, p->sfd, AH(ah), 100, 0);
    it_expect_send(p->cq, p->cfd, AH(ah), 100);
    bad = it_check(r->p, 100, 0xABCD0000u + (uint32_t)ah);
    ck_assert_msg(bad < 0, "marker message corrupted at %ld (a failed call sent data?)", bad);
    it_buf_free(s);
    it_buf_free(r);
}

/* EBADF: fd -1, a descriptor number that is not open, and a closed exs socket. */
START_TEST(test_ebadf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(9)};
    struct it_buf *b;
    exs_qhandle_t q;
    int bad[3], nbad = 2, s;

    it_init();
    q = it_qcreate(16);
    b = it_buf_new(64, 1);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bad[0] = -1;
    bad[1] = closed_fd();
    s = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(s, 0);
    IT_EXPECT_OK(exs_close(s, EXS_QHANDLE_INVALID, AH(0)));
    if (fcntl(s, F_GETFD) == -1 && errno == EBADF)
        bad[nbad++] = s;
    else
        printf("ebadf: descriptor %d reused after exs_close; closed-exs-socket case skipped\n", s);
    for (int i = 0; i < nbad; i++) {
        int fd = bad[i];

        IT_EXPECT_FAIL(exs_send(fd, b->p, 64, 0, q, AH(1), b->mh), EBADF);
        IT_EXPECT_FAIL(exs_recv(fd, b->p, 64, 0, q, AH(2), b->mh), EBADF);
        IT_EXPECT_FAIL(exs_send(fd, b->p, 64, 0, q, AH(1), EXS_MHANDLE_UNREGISTERED), EBADF);
        IT_EXPECT_FAIL(exs_recv(fd, b->p, 64, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), EBADF);
        IT_EXPECT_FAIL(exs_shutdown(fd, SHUT_WR, q, AH(3)), EBADF);
        IT_EXPECT_FAIL(exs_accept(fd, q, AH(4)), EBADF);
        IT_EXPECT_FAIL(exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, AH(5)), EBADF);
        IT_EXPECT_FAIL(exs_close(fd, q, AH(6)), EBADF);
    }
    it_expect_no_event(q, 200);
    it_qdelete(q);
}
END_TEST

/* ENOTSOCK: open descriptors that are neither exs nor kernel sockets (a pipe, /dev/null). */
START_TEST(test_enotsock)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(9)};
    struct it_buf *b;
    exs_qhandle_t q;
    int pfd[2], fds[3];

    it_init();
    q = it_qcreate(16);
    b = it_buf_new(64, 1);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(pipe(pfd), 0);
    fds[0] = pfd[0];
    fds[1] = pfd[1];
    fds[2] = open("/dev/null", O_RDWR);
    ck_assert_int_ge(fds[2], 0);
    for (int i = 0; i < 3; i++) {
        int fd = fds[i];

        IT_EXPECT_FAIL(exs_send(fd, b->p, 64, 0, q, AH(1), b->mh), ENOTSOCK);
        IT_EXPECT_FAIL(exs_recv(fd, b->p, 64, 0, q, AH(2), b->mh), ENOTSOCK);
        IT_EXPECT_FAIL(exs_shutdown(fd, SHUT_WR, q, AH(3)), ENOTSOCK);
        IT_EXPECT_FAIL(exs_accept(fd, q, AH(4)), ENOTSOCK);
        IT_EXPECT_FAIL(exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, AH(5)), ENOTSOCK);
        IT_EXPECT_FAIL(exs_close(fd, q, AH(6)), ENOTSOCK);
        ck_assert_msg(fcntl(fd, F_GETFD) != -1, "descriptor %d was closed by a failed call", fd);
    }
    it_expect_no_event(q, 200);
    close(pfd[0]);
    close(pfd[1]);
    close(fds[2]);
    it_qdelete(q);
}
END_TEST

/* EINVAL for a queue handle that never existed (12345) or was deleted. */
START_TEST(test_einval_queue)
{
    struct it_pair p;
    struct it_buf *b;
    exs_qhandle_t dead, bad[2];
    int s;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new(64, 1);
    dead = it_qcreate(16);
    it_qdelete(dead);
    bad[0] = 12345;
    bad[1] = dead;
    s = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(s, 0);
    for (int i = 0; i < 2; i++) {
        exs_qhandle_t q = bad[i];
        exs_event_t ev;

        IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 64, 0, q, AH(1), b->mh), EINVAL);
        IT_EXPECT_FAIL(exs_recv(p.cfd, b->p, 64, 0, q, AH(2), b->mh), EINVAL);
        IT_EXPECT_FAIL(exs_recv(p.sfd, b->p, 64, 0, q, AH(2), b->mh), EINVAL);
        IT_EXPECT_FAIL(exs_accept(p.lfd, q, AH(4)), EINVAL);
        IT_EXPECT_FAIL(exs_connect(s, (struct sockaddr *)&p.addr, sizeof(p.addr), q, AH(5)),
                       EINVAL);
        IT_EXPECT_FAIL(exs_shutdown(p.cfd, SHUT_WR, q, AH(3)), EINVAL);
        IT_EXPECT_FAIL(exs_close(p.cfd, q, AH(6)), EINVAL);
        IT_EXPECT_FAIL(exs_qdequeue(q, &ev, 1, &(struct timespec){0, 0}), EINVAL);
        IT_EXPECT_FAIL(exs_qdelete(q), EINVAL);
    }
    /* The socket survived the failed close and shutdown; nothing was sent. */
    check_marker(&p, 100);
    it_expect_no_event(p.cq, 100);
    it_expect_no_event(p.sq, 0);
    IT_EXPECT_OK(exs_close(s, EXS_QHANDLE_INVALID, AH(0)));
    it_buf_free(b);
    it_pair_close(&p);
}
END_TEST

/* EINVAL for bad memory handles and buffers outside their handle's region. */
START_TEST(test_einval_mhandle)
{
    struct it_pair p;
    struct it_buf *b, *other;
    exs_mhandle_t gone;
    uint8_t *tmp = malloc(64);

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new(4096, 1);
    other = it_buf_new(4096, 1);
    gone = exs_mregister(tmp, 64, 0);
    ck_assert_int_ne(gone, EXS_MHANDLE_INVALID);
    IT_EXPECT_OK(exs_mderegister(gone));
    IT_EXPECT_FAIL(exs_mderegister(gone), EINVAL);
    IT_EXPECT_FAIL(exs_mderegister(777777), EINVAL);

    exs_mhandle_t badmh[] = {777777, EXS_MHANDLE_INVALID, gone};
    for (size_t i = 0; i < sizeof(badmh) / sizeof(badmh[0]); i++) {
        IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 64, 0, p.cq, AH(1), badmh[i]), EINVAL);
        IT_EXPECT_FAIL(exs_recv(p.cfd, b->p, 64, 0, p.cq, AH(2), badmh[i]), EINVAL);
        IT_EXPECT_FAIL(exs_recv(p.sfd, b->p, 64, 0, p.sq, AH(2), badmh[i]), EINVAL);
    }
    /* Partly or wholly outside the registered [p, p + 4096). */
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p + 4000, 200, 0, p.cq, AH(3), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 4097, 0, p.cq, AH(3), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p - 1, 10, 0, p.cq, AH(3), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, other->p, 10, 0, p.cq, AH(3), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.sfd, b->p + 4000, 200, 0, p.sq, AH(4), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.sfd, b->p - 1, 10, 0, p.sq, AH(4), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.sfd, other->p, 10, 0, p.sq, AH(4), b->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.cfd, b->p + 1, 4096, 0, p.cq, AH(4), b->mh), EINVAL);
    /* The whole region is fine. */
    IT_POST_RECV(p.sfd, b->p, 4096, p.sq, AH(5), b->mh);
    IT_POST_SEND(p.cfd, other->p + 96, 4000, p.cq, AH(5), other->mh);
    it_expect_recv(p.sq, p.sfd, AH(5), 4000, 0);
    it_expect_send(p.cq, p.cfd, AH(5), 4000);
    check_marker(&p, 100);
    it_expect_no_event(p.cq, 100);
    it_expect_no_event(p.sq, 0);
    free(tmp);
    it_pair_close(&p);
}
END_TEST

/* h47 (attack review of 1e7b084, the memory handle's hold inline in xfer_post, its second
 * look at the slot only): handles that name a live slot but not its registration. The
 * buffer is registered, deregistered and registered again (its new handle h2); then, on a
 * live pair, exs_send and exs_recv of that very buffer with: the first handle (stale: its
 * slot free or taken by h2); h2's slot under another generation; h2's generation with no
 * slot (index bits 0); h2's generation with the largest index (beyond the table); INT_MAX.
 * Each answers EINVAL and sends nothing (the marker message is the next the server gets);
 * h2 itself works. test_einval_mhandle's bad handles name no live slot at all. Seen
 * failing (the forged generation and the stale handle accepted) with mreg_at's compare of
 * the registration's handle taken out. */
#define H47_GEN_SHIFT 20 /* exs/api/xfer.c's MREG_GEN_SHIFT: handle = gen << 20 | (index + 1) */
START_TEST(test_einval_mhandle_forged)
{
    const int idx_mask = (1 << H47_GEN_SHIFT) - 1;
    struct it_pair p;
    uint8_t *buf = malloc(4096);
    exs_mhandle_t h1, h2;
    int gen2;

    ck_assert_ptr_nonnull(buf);
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    h1 = exs_mregister(buf, 4096, 0);
    ck_assert_int_gt(h1, 0);
    IT_EXPECT_OK(exs_mderegister(h1));
    h2 = exs_mregister(buf, 4096, 0);
    ck_assert_int_gt(h2, 0);
    ck_assert_int_ne(h2, h1);
    gen2 = (int)((unsigned)h2 >> H47_GEN_SHIFT);
    {
        const exs_mhandle_t bad[] = {
            h1,
            (exs_mhandle_t)((((gen2 + 1) % 1024) << H47_GEN_SHIFT) | (h2 & idx_mask)),
            (exs_mhandle_t)(h2 & ~idx_mask),
            (exs_mhandle_t)((gen2 << H47_GEN_SHIFT) | idx_mask),
            INT_MAX,
        };

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            if (bad[i] == h2 || bad[i] <= 0)
                continue; /* (gen2 0: h2 & ~idx_mask is 0, not a forged handle) */
            IT_EXPECT_FAIL(exs_send(p.cfd, buf, 64, 0, p.cq, AH(1), bad[i]), EINVAL);
            IT_EXPECT_FAIL(exs_recv(p.cfd, buf, 64, 0, p.cq, AH(2), bad[i]), EINVAL);
            IT_EXPECT_FAIL(exs_recv(p.sfd, buf, 64, 0, p.sq, AH(2), bad[i]), EINVAL);
        }
    }
    check_marker(&p, 101);
    IT_POST_SEND(p.cfd, buf, 64, p.cq, AH(3), h2);
    {
        struct it_buf *r = it_buf_new(200, 1);

        IT_POST_RECV(p.sfd, r->p, 200, p.sq, AH(4), r->mh);
        it_expect_recv(p.sq, p.sfd, AH(4), 64, 0);
        it_expect_send(p.cq, p.cfd, AH(3), 64);
        it_buf_free(r);
    }
    it_expect_no_event(p.cq, 100);
    it_expect_no_event(p.sq, 0);
    IT_EXPECT_OK(exs_mderegister(h2));
    it_pair_close(&p);
    free(buf);
}
END_TEST

/* EINVAL for unknown flags, a zero-length receive and a NULL buffer; the allowed flags work. */
START_TEST(test_einval_args)
{
    static const int bad_send_flags[] = {MSG_WAITALL, MSG_OOB, MSG_PEEK,
                                         MSG_TRUNC,   MSG_EOR, 0x40000000};
    static const int bad_recv_flags[] = {MSG_NOSIGNAL, MSG_OOB, MSG_PEEK,
                                         MSG_TRUNC,    MSG_EOR, 0x40000000};
    struct it_pair p;
    struct it_buf *b, *r;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new(4096, 1);
    r = it_buf_new(4096, 1);
    for (size_t i = 0; i < sizeof(bad_send_flags) / sizeof(bad_send_flags[0]); i++) {
        IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 64, bad_send_flags[i], p.cq, AH(1), b->mh), EINVAL);
        IT_EXPECT_FAIL(
            exs_send(p.cfd, b->p, 64, bad_send_flags[i] | MSG_NOSIGNAL, p.cq, AH(1), b->mh),
            EINVAL);
    }
    for (size_t i = 0; i < sizeof(bad_recv_flags) / sizeof(bad_recv_flags[0]); i++) {
        IT_EXPECT_FAIL(exs_recv(p.sfd, r->p, 64, bad_recv_flags[i], p.sq, AH(2), r->mh), EINVAL);
        IT_EXPECT_FAIL(
            exs_recv(p.sfd, r->p, 64, bad_recv_flags[i] | MSG_WAITALL, p.sq, AH(2), r->mh), EINVAL);
    }
    IT_EXPECT_FAIL(exs_recv(p.sfd, r->p, 0, 0, p.sq, AH(3), r->mh), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.sfd, r->p, 0, 0, p.sq, AH(3), EXS_MHANDLE_UNREGISTERED), EINVAL);
    IT_EXPECT_FAIL(exs_send(p.cfd, NULL, 10, 0, p.cq, AH(4), EXS_MHANDLE_UNREGISTERED), EINVAL);
    IT_EXPECT_FAIL(exs_recv(p.sfd, NULL, 10, 0, p.sq, AH(4), EXS_MHANDLE_UNREGISTERED), EINVAL);
    it_expect_no_event(p.cq, 100);
    it_expect_no_event(p.sq, 0);

    /* Allowed: send MSG_NOSIGNAL, MSG_NOSIGNAL|MSG_DONTWAIT; recv MSG_WAITALL. */
    it_fill(b->p, 100, 7);
    IT_EXPECT_OK(exs_recv(p.sfd, r->p, 2048, MSG_WAITALL, p.sq, AH(10), r->mh));
    IT_EXPECT_OK(exs_recv(p.sfd, r->p + 2048, 2048, 0, p.sq, AH(11), r->mh));
    IT_EXPECT_OK(exs_send(p.cfd, b->p, 100, MSG_NOSIGNAL, p.cq, AH(10), b->mh));
    it_expect_recv(p.sq, p.sfd, AH(10), 100, 0);
    it_expect_send(p.cq, p.cfd, AH(10), 100);
    ck_assert_int_lt(it_check(r->p, 100, 7), 0);
    IT_EXPECT_OK(exs_send(p.cfd, b->p, 100, MSG_NOSIGNAL | MSG_DONTWAIT, p.cq, AH(11), b->mh));
    it_expect_recv(p.sq, p.sfd, AH(11), 100, 0);
    it_expect_send(p.cq, p.cfd, AH(11), 100);
    ck_assert_int_lt(it_check(r->p + 2048, 100, 7), 0);
    check_marker(&p, 100);
    it_pair_close(&p);
}
END_TEST

/* EAGAIN when EXS_SOCK_MAX_OPS operations are outstanding in one direction. */
START_TEST(test_eagain_max_ops)
{
    enum { MAXOPS = 8, BIG = 65536 };
    struct it_pair p;
    struct it_buf *sb, *rb, *small;

    it_setenv("EXS_SOCK_MAX_OPS", "8");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 256, 256);
    sb = it_buf_new(BIG, 1);
    rb = it_buf_new((MAXOPS + 1) * (size_t)BIG, 1);
    small = it_buf_new(4096, 1);

    /* Receive direction of the client: MAXOPS receives outstanding, one more fails. */
    for (int i = 0; i < MAXOPS; i++)
        IT_POST_RECV(p.cfd, small->p + i * 256, 256, p.cq, AH(100 + i), small->mh);
    IT_EXPECT_FAIL(exs_recv(p.cfd, small->p, 256, 0, p.cq, AH(199), small->mh), EAGAIN);
    IT_EXPECT_FAIL(exs_recv(p.cfd, small->p, 256, 0, p.cq, AH(199), EXS_MHANDLE_UNREGISTERED),
                   EAGAIN);

    /* The send direction is counted apart: MAXOPS large sends (waiting for receives the
     * server has not posted) are accepted, one more fails. */
    it_fill(sb->p, BIG, 42);
    for (int i = 0; i < MAXOPS; i++)
        IT_POST_SEND(p.cfd, sb->p, BIG, p.cq, AH(200 + i), sb->mh);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, BIG, 0, p.cq, AH(299), sb->mh), EAGAIN);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 10, 0, p.cq, AH(299), sb->mh), EAGAIN);
    it_expect_no_event(p.cq, 100);

    /* The server takes the MAXOPS messages; then the client may send again. */
    for (int i = 0; i < MAXOPS; i++)
        IT_POST_RECV(p.sfd, rb->p + (size_t)i * BIG, BIG, p.sq, AH(300 + i), rb->mh);
    for (int i = 0; i < MAXOPS; i++) {
        it_expect_recv(p.sq, p.sfd, AH(300 + i), BIG, 0);
        ck_assert_int_lt(it_check(rb->p + (size_t)i * BIG, BIG, 42), 0);
    }
    for (int i = 0; i < MAXOPS; i++)
        it_expect_send(p.cq, p.cfd, AH(200 + i), BIG);
    IT_POST_SEND(p.cfd, sb->p, 1000, p.cq, AH(210), sb->mh);
    IT_POST_RECV(p.sfd, rb->p, BIG, p.sq, AH(310), rb->mh);
    it_expect_recv(p.sq, p.sfd, AH(310), 1000, 0);
    it_expect_send(p.cq, p.cfd, AH(210), 1000);

    /* The server sends one message: one client receive completes, one may be posted. */
    IT_POST_SEND(p.sfd, sb->p, 100, p.sq, AH(400), sb->mh);
    it_expect_recv(p.cq, p.cfd, AH(100), 100, 0);
    it_expect_send(p.sq, p.sfd, AH(400), 100);
    IT_POST_RECV(p.cfd, small->p, 256, p.cq, AH(108), small->mh);
    IT_EXPECT_FAIL(exs_recv(p.cfd, small->p, 256, 0, p.cq, AH(199), small->mh), EAGAIN);
    for (int i = 1; i <= MAXOPS; i++)
        IT_POST_SEND(p.sfd, sb->p, 100, p.sq, AH(400 + i), sb->mh);
    for (int i = 1; i <= MAXOPS; i++)
        it_expect_recv(p.cq, p.cfd, AH(100 + i), 100, 0);
    for (int i = 1; i <= MAXOPS; i++)
        it_expect_send(p.sq, p.sfd, AH(400 + i), 100);
    it_expect_no_event(p.cq, 100);
    it_expect_no_event(p.sq, 0);
    it_pair_close(&p);
}
END_TEST

/* STREAM: EAGAIN when EXS_SOCK_MAX_OPS sends are outstanding holds for a send short enough
 * to be copied at its post (exs_send's send_copy looks at no count: an outstanding send
 * keeps the conn's sendq_app above 0, so the copy is refused and the whole way counts). */
START_TEST(test_eagain_max_ops_stream)
{
    enum { MAXOPS = 4, BIG = 65536, RING = 4096 };
    struct it_pair p;
    struct it_buf *sb, *rb;
    size_t got = 0;

    it_setenv("EXS_SOCK_MAX_OPS", "4");
    it_setenv("EXS_RING_SIZE", "4096");
    it_setenv("EXS_RING_MAX", "4096"); /* no autotuning: the ring stays full */
    it_init();
    it_pair_open(&p, SOCK_STREAM, 64, 64);
    sb = it_buf_new(BIG, 1);
    rb = it_buf_new((size_t)MAXOPS * BIG + 64, 1);
    it_fill(sb->p, BIG, 7);
    /* MAXOPS sends far beyond the peer's 4 KiB ring, no receive there: they stay queued */
    for (int i = 0; i < MAXOPS; i++)
        IT_POST_SEND(p.cfd, sb->p, BIG, p.cq, AH(200 + i), sb->mh);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, AH(299), sb->mh), EAGAIN);
    IT_EXPECT_FAIL(exs_send(p.cfd, sb->p, 64, 0, p.cq, AH(299), EXS_MHANDLE_UNREGISTERED), EAGAIN);
    it_expect_no_event(p.cq, 50);
    /* the server takes every byte; the sends complete; a short send is accepted again */
    while (got < (size_t)MAXOPS * BIG) {
        exs_event_t ev;

        IT_POST_RECV(p.sfd, rb->p + got, (size_t)MAXOPS * BIG - got, p.sq, AH(300), rb->mh);
        it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
        ck_assert_int_eq(ev.exs_evt_errno, 0);
        ck_assert_int_gt(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, 0);
        got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    for (int i = 0; i < MAXOPS; i++)
        it_expect_send(p.cq, p.cfd, AH(200 + i), BIG);
    IT_POST_SEND(p.cfd, sb->p, 64, p.cq, AH(210), sb->mh);
    it_expect_send(p.cq, p.cfd, AH(210), 64);
    IT_POST_RECV(p.sfd, rb->p, 64, p.sq, AH(310), rb->mh);
    it_expect_recv(p.sq, p.sfd, AH(310), 64, 0);
    it_pair_close(&p);
}
END_TEST

/* EAGAIN when the event queue cannot take one more event: room is reserved per accepted
 * operation and held until the event is dequeued. */
START_TEST(test_eagain_queue_full)
{
    enum { DEPTH = 4 };
    struct it_pair p;
    struct it_buf *b, *s;
    exs_qhandle_t q3;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, DEPTH);
    q3 = it_qcreate(8);
    b = it_buf_new(8192, 1);
    s = it_buf_new(8192, 1);
    it_fill(s->p, 8192, 99);

    for (int i = 0; i < DEPTH; i++)
        IT_POST_RECV(p.cfd, b->p + i * 1024, 1024, p.cq, AH(i), b->mh);
    IT_EXPECT_FAIL(exs_recv(p.cfd, b->p + 4096, 1024, 0, p.cq, AH(90), b->mh), EAGAIN);
    IT_EXPECT_FAIL(exs_send(p.cfd, s->p, 100, 0, p.cq, AH(91), s->mh), EAGAIN);
    IT_EXPECT_FAIL(exs_shutdown(p.cfd, SHUT_WR, p.cq, AH(92)), EAGAIN);
    /* Another queue with room is fine for the same socket. */
    IT_POST_RECV(p.sfd, b->p + 6000, 1000, p.sq, AH(50), b->mh);
    IT_POST_SEND(p.cfd, s->p, 100, q3, AH(51), s->mh);
    it_expect_send(q3, p.cfd, AH(51), 100);
    it_expect_recv(p.sq, p.sfd, AH(50), 100, 0);

    /* The server sends DEPTH messages: the receives complete, their events stay queued. */
    for (int i = 0; i < DEPTH; i++)
        IT_POST_SEND(p.sfd, s->p, 10 + i, p.sq, AH(60 + i), s->mh);
    for (int i = 0; i < DEPTH; i++)
        it_expect_send(p.sq, p.sfd, AH(60 + i), 10 + i);
    it_sleep_ms(100);
    IT_EXPECT_FAIL(exs_recv(p.cfd, b->p + 4096, 1024, 0, p.cq, AH(93), b->mh), EAGAIN);
    /* Dequeuing one event makes room for one operation. */
    it_expect_recv(p.cq, p.cfd, AH(0), 10, 0);
    IT_POST_RECV(p.cfd, b->p + 4096, 1024, p.cq, AH(4), b->mh);
    IT_EXPECT_FAIL(exs_recv(p.cfd, b->p + 5120, 1024, 0, p.cq, AH(94), b->mh), EAGAIN);
    for (int i = 1; i < DEPTH; i++)
        it_expect_recv(p.cq, p.cfd, AH(i), 10 + i, 0);
    IT_POST_SEND(p.sfd, s->p, 77, p.sq, AH(70), s->mh);
    it_expect_send(p.sq, p.sfd, AH(70), 77);
    it_expect_recv(p.cq, p.cfd, AH(4), 77, 0);
    ck_assert_int_lt(it_check(b->p + 4096, 77, 99), 0);
    it_qdelete(q3);
    it_pair_close(&p);
}
END_TEST

/* ENOTCONN: send / receive on a socket that was never connected. */
START_TEST(test_enotconn)
{
    struct it_buf *b;
    exs_qhandle_t q;
    int s;

    it_init();
    q = it_qcreate(16);
    b = it_buf_new(64, 1);
    s = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(s, 0);
    IT_EXPECT_FAIL(exs_send(s, b->p, 64, 0, q, AH(1), b->mh), ENOTCONN);
    IT_EXPECT_FAIL(exs_recv(s, b->p, 64, 0, q, AH(2), b->mh), ENOTCONN);
    IT_EXPECT_FAIL(exs_send(s, b->p, 64, 0, q, AH(1), EXS_MHANDLE_UNREGISTERED), ENOTCONN);
    IT_EXPECT_FAIL(exs_recv(s, b->p, 64, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED), ENOTCONN);
    it_expect_no_event(q, 100);
    it_close(s, q);
    it_qdelete(q);
}
END_TEST

/* EPIPE: exs_send after exs_shutdown(SHUT_WR) completed, with and without MSG_NOSIGNAL;
 * the peer sees end of stream, the other direction still works. */
START_TEST(test_epipe)
{
    struct it_pair p;
    struct it_buf *b, *r;
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    b = it_buf_new(8192, 1);
    r = it_buf_new(4096, 1);
    IT_POST_RECV(p.sfd, r->p, 4096, p.sq, AH(1), r->mh);
    IT_EXPECT_OK(exs_shutdown(p.cfd, SHUT_WR, p.cq, AH(2)));
    it_expect_err(p.cq, EXS_EVT_SHUTDOWN, p.cfd, AH(2), 0);
    it_expect_recv(p.sq, p.sfd, AH(1), 0, 0);

    /* MSG_NOSIGNAL: EPIPE and no SIGPIPE (the default action would kill the test). */
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 100, MSG_NOSIGNAL, p.cq, AH(3), b->mh), EPIPE);
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 5000, MSG_NOSIGNAL, p.cq, AH(3), b->mh), EPIPE);
    ck_assert_int_eq(sigaction(SIGPIPE, &ign, &old), 0);
    IT_EXPECT_FAIL(exs_send(p.cfd, b->p, 100, 0, p.cq, AH(4), b->mh), EPIPE);
    ck_assert_int_eq(sigaction(SIGPIPE, &old, NULL), 0);
    it_expect_no_event(p.cq, 100);

    /* Half close: the server can still send to the client. */
    it_fill(b->p, 300, 5);
    IT_POST_RECV(p.cfd, r->p, 4096, p.cq, AH(5), r->mh);
    IT_POST_SEND(p.sfd, b->p, 300, p.sq, AH(6), b->mh);
    it_expect_recv(p.cq, p.cfd, AH(5), 300, 0);
    it_expect_send(p.sq, p.sfd, AH(6), 300);
    ck_assert_int_lt(it_check(r->p, 300, 5), 0);
    it_pair_close(&p);
}
END_TEST

/* ECONNREFUSED in the EXS_EVT_CONNECT event for a port with no listener. */
START_TEST(test_econnrefused)
{
    struct sockaddr_in addr;
    exs_qhandle_t q;
    int holder, s;

    it_init();
    q = it_qcreate(16);
    it_refusing_addr(&addr, &holder);
    s = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(s, 0);
    IT_EXPECT_OK(exs_connect(s, (struct sockaddr *)&addr, sizeof(addr), q, AH(7)));
    it_expect_err(q, EXS_EVT_CONNECT, s, AH(7), ECONNREFUSED);
    it_close(s, q);
    close(holder);
    it_qdelete(q);
}
END_TEST

/* An incompatible peer is refused cleanly in the handshake: a SOCK_STREAM socket that
 * connects to a SOCK_SEQPACKET listener gets ECONNREFUSED in its connect event, and the
 * listener stays usable (no accept event for it, a matching connect then works). */
START_TEST(test_refused_incompatible)
{
    struct sockaddr_in addr;
    exs_event_t ev;
    exs_qhandle_t q;
    int lfd, s, c, n;

    it_init();
    q = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, AH(1)));
    s = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    IT_EXPECT_OK(exs_connect(s, (struct sockaddr *)&addr, sizeof(addr), q, AH(2)));
    it_expect_err(q, EXS_EVT_CONNECT, s, AH(2), ECONNREFUSED);
    ck_assert_msg(!it_try_event(q, EXS_EVT_ACCEPT, lfd, 200, &ev), "the refused peer was accepted");
    c = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    IT_EXPECT_OK(exs_connect(c, (struct sockaddr *)&addr, sizeof(addr), q, AH(3)));
    it_wait_event(q, EXS_EVT_CONNECT, c, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    n = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    it_close(s, q);
    it_close(c, q);
    it_close(n, q);
    it_close(lfd, q);
    it_qdelete(q);
}
END_TEST

/* exs_socket: bad domain EAFNOSUPPORT; SOCK_DGRAM EPROTONOSUPPORT or EINVAL. */
START_TEST(test_socket_errors)
{
    int fd;

    it_init();
    IT_EXPECT_FAIL(exs_socket(AF_UNIX, SOCK_SEQPACKET, 0), EAFNOSUPPORT);
    IT_EXPECT_FAIL(exs_socket(12345, SOCK_SEQPACKET, 0), EAFNOSUPPORT);
    errno = 0;
    fd = exs_socket(AF_INET, SOCK_DGRAM, 0);
    ck_assert_msg(fd == -1 && (errno == EPROTONOSUPPORT || errno == EINVAL),
                  "exs_socket(AF_INET, SOCK_DGRAM) = %d errno %d (%s), expected -1 "
                  "EPROTONOSUPPORT or EINVAL",
                  fd, errno, strerror(errno));
    /* AF_INET6 is a supported domain (SOCK_STREAM is another issue's scope). */
    fd = exs_socket(AF_INET6, SOCK_SEQPACKET, 0);
    ck_assert_msg(fd >= 0, "exs_socket(AF_INET6, SOCK_SEQPACKET) errno %d (%s)", errno,
                  strerror(errno));
    IT_EXPECT_OK(exs_close(fd, EXS_QHANDLE_INVALID, AH(0)));
}
END_TEST

/* EBUSY: exs_mderegister of a handle a posted send or receive still uses. */
START_TEST(test_ebusy)
{
    struct it_pair p;
    struct it_buf *sb, *rb, *srv;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(65536, 1);
    rb = it_buf_new(65536, 1);
    srv = it_buf_new(65536, 1);
    IT_POST_RECV(p.cfd, rb->p, 65536, p.cq, AH(1), rb->mh);
    IT_EXPECT_FAIL(exs_mderegister(rb->mh), EBUSY);
    it_fill(sb->p, 65536, 3);
    IT_POST_SEND(p.cfd, sb->p, 65536, p.cq, AH(2), sb->mh); /* no receive at the server yet */
    IT_EXPECT_FAIL(exs_mderegister(sb->mh), EBUSY);
    it_expect_no_event(p.cq, 100);
    /* Complete both; then both handles deregister (it_buf_free asserts it). */
    IT_POST_SEND(p.sfd, srv->p, 10, p.sq, AH(3), srv->mh);
    it_expect_recv(p.cq, p.cfd, AH(1), 10, 0);
    it_expect_send(p.sq, p.sfd, AH(3), 10);
    it_buf_free(rb);
    IT_POST_RECV(p.sfd, srv->p, 65536, p.sq, AH(4), srv->mh);
    it_expect_recv(p.sq, p.sfd, AH(4), 65536, 0);
    it_expect_send(p.cq, p.cfd, AH(2), 65536);
    ck_assert_int_lt(it_check(srv->p, 65536, 3), 0);
    it_buf_free(sb);
    it_pair_close(&p);
}
END_TEST

/* Holds take no lock (exs/api/xfer.c): a hold races deregistrations and a growing table.
 * While a thread holds a handle, that registration stays registered under it (a
 * deregistration that wins is seen as handle 0); a handle held throughout always answers
 * EBUSY; a stale handle (its registration parked and reused by later ones) never holds. */
enum { MREG_RACE_ROUNDS = 5000, MREG_RACE_CHURN = 300 };
static char mreg_race_buf[4096];
static int mreg_race_h, mreg_race_stop, mreg_race_violations, mreg_race_holds;

static void *mreg_race_holder(void *arg)
{
    int stale = *(int *)arg;

    while (!__atomic_load_n(&mreg_race_stop, __ATOMIC_ACQUIRE)) {
        int h = __atomic_load_n(&mreg_race_h, __ATOMIC_ACQUIRE);
        struct api_mreg *m, *ms;

        if (exs__api_mreg_hold(stale, mreg_race_buf, 64, &ms) == 0) {
            exs__api_mreg_release(ms);
            __atomic_add_fetch(&mreg_race_violations, 1, __ATOMIC_RELAXED);
        }
        if (exs__api_mreg_hold(h, mreg_race_buf + 8, 64, &m))
            continue; /* deregistered before the hold: EINVAL is right */
        __atomic_add_fetch(&mreg_race_holds, 1, __ATOMIC_RELAXED);
        for (int k = 0; k < 400; k++) /* held a while: a deregistration may try meanwhile */
            if (exs__api_mreg_handle(m) != h)
                __atomic_add_fetch(&mreg_race_violations, 1, __ATOMIC_RELAXED);
        exs__api_mreg_release(m);
    }
    return NULL;
}

START_TEST(test_mreg_hold_race)
{
    static char other[MREG_RACE_CHURN][64];
    int h[MREG_RACE_CHURN];
    struct api_mreg *held;
    int stale, kept, ebusy = 0, won = 0;
    pthread_t t;

    it_init();
    stale = exs_mregister(mreg_race_buf, sizeof(mreg_race_buf), 0);
    ck_assert_int_gt(stale, 0);
    IT_EXPECT_OK(exs_mderegister(stale));
    kept = exs_mregister(mreg_race_buf, sizeof(mreg_race_buf), 0);
    ck_assert_int_gt(kept, 0);
    ck_assert_int_eq(exs__api_mreg_hold(kept, mreg_race_buf, 16, &held), 0);
    mreg_race_h = exs_mregister(mreg_race_buf, sizeof(mreg_race_buf), 0);
    ck_assert_int_gt(mreg_race_h, 0);
    mreg_race_stop = mreg_race_violations = mreg_race_holds = 0;
    ck_assert_int_eq(pthread_create(&t, NULL, mreg_race_holder, &stale), 0);
    /* no premise on scheduling: the rounds start once the holder holds, and go on (past
     * MREG_RACE_ROUNDS, yielding) until a deregistration has won too */
    while (!__atomic_load_n(&mreg_race_holds, __ATOMIC_RELAXED))
        sched_yield();
    for (int r = 0; r < MREG_RACE_ROUNDS || !won; r++) {
        int cur = __atomic_load_n(&mreg_race_h, __ATOMIC_RELAXED);

        if (r >= MREG_RACE_ROUNDS)
            sched_yield(); /* let the holder let go */

        /* the holder's handle: deregistered when free, then registered again */
        if (exs_mderegister(cur) == 0) {
            won++;
            cur = exs_mregister(mreg_race_buf, sizeof(mreg_race_buf), 0);
            ck_assert_int_gt(cur, 0);
            __atomic_store_n(&mreg_race_h, cur, __ATOMIC_RELEASE);
        } else {
            ck_assert_int_eq(errno, EBUSY);
            ebusy++;
        }
        errno = 0;
        ck_assert_int_eq(exs_mderegister(kept), -1);
        ck_assert_int_eq(errno, EBUSY);
        if (r % 1000 || r > MREG_RACE_ROUNDS)
            continue;
        /* churn: the table grows (64 -> 512) and parked registrations are reused */
        for (int i = 0; i < MREG_RACE_CHURN; i++) {
            h[i] = exs_mregister(other[i], sizeof(other[i]), 0);
            ck_assert_int_gt(h[i], 0);
        }
        for (int i = 0; i < MREG_RACE_CHURN; i++)
            IT_EXPECT_OK(exs_mderegister(h[i]));
    }
    __atomic_store_n(&mreg_race_stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    ck_assert_int_eq(mreg_race_violations, 0);
    ck_assert_int_gt(won, 0);
    ck_assert_int_gt(mreg_race_holds, 0);
    exs__api_mreg_release(held);
    IT_EXPECT_OK(exs_mderegister(kept));
    IT_EXPECT_OK(exs_mderegister(mreg_race_h));
    fprintf(stderr, "test_mreg_hold_race: %d deregistrations won, %d answered EBUSY, %d holds\n",
            won, ebusy, mreg_race_holds);
}
END_TEST

/* exs__api_sock_find's second step (exs__api_sock_hold) given a socket read from a slot
 * before the socket went: it is parked (count 0) and not held; reused by the next socket
 * at another number, it is not held for the old number either, and its count is left as
 * it was. Without the check of the slot the stale pointer is held; without the count's
 * 0 test a parked socket is counted (and ended twice); freed instead of parked, ASan sees
 * the read of a freed socket. */
START_TEST(test_sock_hold_stale)
{
    struct api_sock *s, *s2;
    uint64_t end;
    int a, b, k;

    it_init();
    a = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(a, 0);
    s = exs__api_sock_find(a);
    ck_assert_ptr_nonnull(s);
    exs__api_sock_put(s); /* s: what a lookup read from a's slot */
    IT_EXPECT_OK(exs_close(a, EXS_QHANDLE_INVALID, AH(0)));
    end = exs__now_ns() + (uint64_t)IT_TIMEOUT_MS * 1000000;
    while (__atomic_load_n(&s->refs, __ATOMIC_ACQUIRE) && exs__now_ns() < end)
        sched_yield(); /* the close's last reference goes on the progress thread */
    ck_assert_int_eq(__atomic_load_n(&s->refs, __ATOMIC_ACQUIRE), 0);
    ck_assert_ptr_null(exs__api_sock_hold(a, s));
    ck_assert_int_eq(s->refs, 0);
    ck_assert_ptr_null(exs__api_sock_find(a));
    /* a's number taken by a kernel descriptor: the next socket, s again (parked last), gets
     * another number */
    k = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(k, 0);
    if (k != a) {
        ck_assert_int_eq(dup2(k, a), a);
        close(k);
    }
    b = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    ck_assert_int_ge(b, 0);
    ck_assert_int_ne(b, a);
    s2 = exs__api_sock_find(b);
    ck_assert_ptr_eq(s2, s);
    ck_assert_ptr_null(exs__api_sock_hold(a, s));
    ck_assert_int_eq(s->refs, 2); /* the table's and s2's */
    exs__api_sock_put(s2);
    IT_EXPECT_OK(exs_close(b, EXS_QHANDLE_INVALID, AH(0)));
    close(a);
}
END_TEST

/* exs__api_sock_find takes no lock (sock.c): a finder thread looks up descriptor numbers
 * while this thread creates and closes sockets (their numbers are reused; the table grows
 * from 64 and parked sockets are reused). A socket found is the one at that number
 * (s->fd), counted (refs > 0) and in its lifetime. Without the check of the slot after the
 * count, a reused parked socket is returned for a number it left (s->fd differs); with
 * the memory freed instead of parked, ASan sees the finder read a freed socket. */
enum { SFIND_ROUNDS = 3000, SFIND_CHURN = 100 };
static int sfind_fd = -1, sfind_stop, sfind_violations, sfind_found;

static void *sfind_finder(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&sfind_stop, __ATOMIC_ACQUIRE)) {
        int base = __atomic_load_n(&sfind_fd, __ATOMIC_ACQUIRE);

        for (int fd = base - 2; fd <= base + 2; fd++) {
            struct api_sock *s = exs__api_sock_find(fd);

            if (!s)
                continue;
            __atomic_add_fetch(&sfind_found, 1, __ATOMIC_RELAXED);
            if (s->fd != fd || __atomic_load_n(&s->refs, __ATOMIC_RELAXED) <= 0)
                __atomic_add_fetch(&sfind_violations, 1, __ATOMIC_RELAXED);
            exs__api_sock_put(s);
        }
    }
    return NULL;
}

START_TEST(test_sock_find_race)
{
    static int other[SFIND_CHURN];
    pthread_t t;

    it_init();
    sfind_stop = sfind_violations = sfind_found = 0;
    sfind_fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(sfind_fd, 0);
    ck_assert_int_eq(pthread_create(&t, NULL, sfind_finder, NULL), 0);
    /* no premise on scheduling: the rounds go on (yielding) until the finder found one */
    for (int r = 0; r < SFIND_ROUNDS || !__atomic_load_n(&sfind_found, __ATOMIC_RELAXED); r++) {
        int fd = __atomic_load_n(&sfind_fd, __ATOMIC_RELAXED), nfd;

        if (r >= SFIND_ROUNDS)
            sched_yield();
        IT_EXPECT_OK(exs_close(fd, EXS_QHANDLE_INVALID, AH(0)));
        nfd = exs_socket(AF_INET, r & 1 ? SOCK_STREAM : SOCK_SEQPACKET, 0);
        ck_assert_int_ge(nfd, 0);
        __atomic_store_n(&sfind_fd, nfd, __ATOMIC_RELEASE);
        if (r % 500)
            continue;
        /* churn: more numbers at once (the table grows), then all parked */
        for (int i = 0; i < SFIND_CHURN; i++) {
            other[i] = exs_socket(AF_INET, SOCK_STREAM, 0);
            ck_assert_int_ge(other[i], 0);
        }
        for (int i = 0; i < SFIND_CHURN; i++)
            IT_EXPECT_OK(exs_close(other[i], EXS_QHANDLE_INVALID, AH(0)));
    }
    __atomic_store_n(&sfind_stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    IT_EXPECT_OK(exs_close(sfind_fd, EXS_QHANDLE_INVALID, AH(0)));
    ck_assert_int_eq(sfind_violations, 0);
    fprintf(stderr, "test_sock_find_race: %d lookups found a socket\n", sfind_found);
}
END_TEST

Suite *integ_errors_suite(void)
{
    Suite *s = suite_create("integ_errors");

    it_suite_add(s, "ebadf", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_ebadf, NULL});
    it_suite_add(s, "enotsock", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_enotsock, NULL});
    it_suite_add(s, "einval", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_einval_queue, test_einval_mhandle,
                                        test_einval_mhandle_forged, test_einval_args, NULL});
    it_suite_add(s, "eagain", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_eagain_max_ops, test_eagain_max_ops_stream,
                                        test_eagain_queue_full, NULL});
    it_suite_add(s, "enotconn", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_enotconn, NULL});
    it_suite_add(s, "epipe", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_epipe, NULL});
    it_suite_add(s, "econnrefused", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_econnrefused, test_refused_incompatible, NULL});
    it_suite_add(s, "socket", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_socket_errors, test_sock_hold_stale,
                                        test_sock_find_race, NULL});
    it_suite_add(s, "ebusy", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_ebusy, test_mreg_hold_race, NULL});
    return s;
}
