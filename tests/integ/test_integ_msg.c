/* SPDX-License-Identifier: MIT */
/* exs_sendmsg, exs_recvmsg and exs_sendfile on exs sockets of both types and on kernel TCP
 * sockets: data, list checks, registrations, synchronous forms, file ranges, resets. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api.h"
#include "exs/util/params.h"
#include "tests/integ/integ.h"
#include "tests/skip.h"

#define AH(n) IT_AH(n)

/* ---- helpers ---- */

/* A reference byte string of len bytes (the pattern of seed), freed by the caller. */
static uint8_t *ref_new(size_t len, uint32_t seed)
{
    uint8_t *r = malloc(len ? len : 1);

    ck_assert_ptr_nonnull(r);
    it_fill(r, len, seed);
    return r;
}

/* Copy consecutive slices of src into the n elements of v (the sender's list). */
static void iov_fill(exs_iovec_t *v, size_t n, const uint8_t *src)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(v[i].iov_base, src, v[i].iov_len);
        src += v[i].iov_len;
    }
}

/* The first offset where the elements of v, read in list order for len bytes, differ
 * from src; -1 when they match. */
static long iov_cmp(const exs_iovec_t *v, size_t n, const uint8_t *src, size_t len)
{
    size_t off = 0;

    for (size_t i = 0; i < n && off < len; i++) {
        size_t take = v[i].iov_len < len - off ? v[i].iov_len : len - off;

        for (size_t j = 0; j < take; j++)
            if (((const uint8_t *)v[i].iov_base)[j] != src[off + j])
                return (long)(off + j);
        off += take;
    }
    return off == len ? -1 : (long)off;
}

/* Wait for the next event of (q, type, fd) and check: ahandle, errno 0, result (unless
 * IT_ANY_RESULT), the echoed list (iov, iovlen) and MSG_TRUNC (trunc). Returns the result. */
static ssize_t expect_msg_at(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, ssize_t result,
                             const exs_iovec_t *iov, size_t iovlen, int trunc, const char *file,
                             int line)
{
    const exs_evt_xfermsg_t *x;
    exs_event_t ev;

    it_wait_event_at(q, type, fd, IT_TIMEOUT_MS, &ev, file, line);
    x = &ev.exs_evt_u.exs_evt_xfermsg;
    ck_assert_msg(ev.exs_evt_ahandle == ah, "%s:%d: %s ahandle %ld, expected %ld", file, line,
                  it_evt_name(type), IT_AHN(ev.exs_evt_ahandle), IT_AHN(ah));
    ck_assert_msg(ev.exs_evt_errno == 0, "%s:%d: %s errno %d (%s)", file, line, it_evt_name(type),
                  ev.exs_evt_errno, strerror(ev.exs_evt_errno));
    if (result >= 0)
        ck_assert_msg(x->exs_evt_result == result, "%s:%d: %s result %zd, expected %zd", file, line,
                      it_evt_name(type), x->exs_evt_result, result);
    else
        ck_assert_msg(x->exs_evt_result > 0, "%s:%d: %s result %zd", file, line, it_evt_name(type),
                      x->exs_evt_result);
    /* the result sits where exs_evt_xfer_t has it */
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, x->exs_evt_result);
    if (type != EXS_EVT_SENDFILE) {
        ck_assert_msg(x->exs_evt_iov == iov, "%s:%d: exs_evt_iov %p, expected %p", file, line,
                      (void *)x->exs_evt_iov, (const void *)iov);
        ck_assert_uint_eq(x->exs_evt_iovlen, iovlen);
        ck_assert_int_eq(x->exs_evt_in_fd, -1);
    }
    ck_assert_msg(!!(x->exs_evt_flags & MSG_TRUNC) == !!trunc, "%s:%d: flags %#x, trunc %d", file,
                  line, (unsigned)x->exs_evt_flags, trunc);
    return x->exs_evt_result;
}
#define expect_msg(q, type, fd, ah, result, iov, n, trunc)                                         \
    expect_msg_at((q), (type), (fd), (ah), (result), (iov), (n), (trunc), __FILE__, __LINE__)

/* A temporary regular file of len bytes of the pattern of seed (unlinked, open O_RDWR). */
static int tmpfile_new(size_t len, uint32_t seed)
{
    char path[] = "/tmp/exs_msg_XXXXXX";
    int fd = mkstemp(path);
    uint8_t *r = ref_new(len, seed);
    size_t done = 0;

    ck_assert_int_ge(fd, 0);
    unlink(path);
    while (done < len) {
        ssize_t n = write(fd, r + done, len - done);

        ck_assert_int_gt(n, 0);
        done += (size_t)n;
    }
    free(r);
    return fd;
}

/* Blocking read of exactly len bytes from a kernel socket (a receive timeout of 20 s
 * bounds each read, so a lost byte fails the test instead of hanging it). */
static void read_full(int fd, uint8_t *p, size_t len)
{
    struct timeval tv = {.tv_sec = 20};
    size_t got = 0;

    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, 0);

        if (n < 0 && errno == EINTR)
            continue;
        ck_assert_msg(n > 0, "recv: %zd errno %d (%s) after %zu of %zu bytes", n, errno,
                      strerror(errno), got, len);
        got += (size_t)n;
    }
}

static void write_full(int fd, const uint8_t *p, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        ck_assert_msg(n > 0, "send: errno %d (%s)", errno, strerror(errno));
        done += (size_t)n;
    }
}

/* ---- exs sockets: exs_sendmsg -> exs_recv ---- */

/* SOCK_SEQPACKET: each exs_sendmsg is one message gathered in list order (registered,
 * unregistered and empty elements); the list may be reused as soon as the call returns. */
START_TEST(test_msg_sendmsg_seqpacket)
{
    struct it_pair p;
    struct it_buf *e1, *e3, *e4, *r1, *r2;
    exs_iovec_t v[4], keep[4];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 4};
    size_t total = 100 + 0 + 3000 + 1;
    uint8_t *ref1 = ref_new(total, 11), *ref2 = ref_new(total, 12);

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    e1 = it_buf_new(100, 1);
    e3 = it_buf_new(3000, 0);
    e4 = it_buf_new(1, 1);
    r1 = it_buf_new(8192, 1);
    r2 = it_buf_new(8192, 0);
    v[0] = (exs_iovec_t){e1->p, 100, e1->mh};
    v[1] = (exs_iovec_t){e1->p + 50, 0, e1->mh};
    v[2] = (exs_iovec_t){e3->p, 3000, EXS_MHANDLE_UNREGISTERED};
    v[3] = (exs_iovec_t){e4->p, 1, e4->mh};
    memcpy(keep, v, sizeof(v));
    IT_POST_RECV(p.sfd, r1->p, 8192, p.sq, AH(1), r1->mh);
    IT_POST_RECV(p.sfd, r2->p, 8192, p.sq, AH(2), r2->mh);
    iov_fill(v, 4, ref1);
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(10)));
    /* the list is the caller's again: clobber it (the buffers stay untouched) */
    memset(v, 0xA5, sizeof(v));
    m.msg_iovlen = 0;
    expect_msg(p.cq, EXS_EVT_SENDMSG, p.cfd, AH(10), (ssize_t)total, v, 4, 0);
    memcpy(v, keep, sizeof(v));
    m.msg_iovlen = 4;
    iov_fill(v, 4, ref2);
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(11)));
    expect_msg(p.cq, EXS_EVT_SENDMSG, p.cfd, AH(11), (ssize_t)total, v, 4, 0);
    /* two messages, each whole */
    it_expect_recv(p.sq, p.sfd, AH(1), (ssize_t)total, 0);
    it_expect_recv(p.sq, p.sfd, AH(2), (ssize_t)total, 0);
    ck_assert_int_eq(memcmp(r1->p, ref1, total), 0);
    ck_assert_int_eq(memcmp(r2->p, ref2, total), 0);
    ck_assert(it_all_bytes(r1->p + total, 8192 - total, IT_GUARD_BYTE));
    ck_assert(it_buf_guards_ok(r1) && it_buf_guards_ok(r2));
    free(ref1);
    free(ref2);
    it_pair_close(&p);
}
END_TEST

/* SOCK_STREAM: the bytes of successive exs_sendmsg and exs_send calls arrive in order. */
START_TEST(test_msg_sendmsg_stream)
{
    enum { N = 3, LEN = 40000 };
    struct it_pair p;
    struct it_buf *s, *r;
    exs_iovec_t v[N];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = N};
    uint8_t *exp = malloc(3 * LEN);

    ck_assert_ptr_nonnull(exp);
    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    s = it_buf_new(3 * LEN, 1);
    r = it_buf_new(3 * LEN, 0);
    it_fill(s->p, 3 * LEN, 21);
    /* the first LEN bytes: 3 elements out of memory order; then one exs_send; then 2
     * elements. exp: what the stream must carry. */
    v[0] = (exs_iovec_t){s->p + 30000, 10000, s->mh};
    v[1] = (exs_iovec_t){s->p + 10000, 20000, EXS_MHANDLE_UNREGISTERED};
    v[2] = (exs_iovec_t){s->p, 10000, s->mh};
    memcpy(exp, s->p + 30000, 10000);
    memcpy(exp + 10000, s->p + 10000, 20000);
    memcpy(exp + 30000, s->p, 10000);
    memcpy(exp + LEN, s->p + LEN, 2 * LEN);
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(1)));
    IT_POST_SEND(p.cfd, s->p + LEN, LEN, p.cq, AH(2), s->mh);
    v[0] = (exs_iovec_t){s->p + 2 * LEN, 1, s->mh};
    v[1] = (exs_iovec_t){s->p + 2 * LEN + 1, LEN - 1, s->mh};
    m.msg_iovlen = 2;
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(3)));
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 3 * LEN, MSG_WAITALL, p.sq, AH(4), r->mh), 0);
    expect_msg(p.cq, EXS_EVT_SENDMSG, p.cfd, AH(1), LEN, v, N, 0);
    it_expect_send(p.cq, p.cfd, AH(2), LEN);
    expect_msg(p.cq, EXS_EVT_SENDMSG, p.cfd, AH(3), LEN, v, 2, 0);
    it_expect_recv(p.sq, p.sfd, AH(4), 3 * LEN, 0);
    ck_assert_int_eq(memcmp(r->p, exp, 3 * LEN), 0);
    ck_assert(it_buf_guards_ok(r));
    free(exp);
    it_pair_close(&p);
}
END_TEST

/* ---- exs sockets: exs_send -> exs_recvmsg ---- */

/* SOCK_SEQPACKET: a message is scattered over the list in order; what the message does
 * not reach stays as it was; a longer message is cut (MSG_TRUNC); the list may be
 * clobbered once the call returned. */
START_TEST(test_msg_recvmsg_seqpacket)
{
    struct it_pair p;
    struct it_buf *s, *e1, *e3, *e4, *decoy;
    exs_iovec_t v[4], keep[4];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 4};
    uint8_t *ref = ref_new(7000, 31);

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    s = it_buf_new(7000, 1);
    e1 = it_buf_new(1000, 1);
    e3 = it_buf_new(3000, 0);
    e4 = it_buf_new(2000, 1);
    decoy = it_buf_new(8000, 0);
    memcpy(s->p, ref, 7000);
    v[0] = (exs_iovec_t){e1->p, 1000, e1->mh};
    v[1] = (exs_iovec_t){e3->p, 0, EXS_MHANDLE_UNREGISTERED};
    v[2] = (exs_iovec_t){e3->p, 3000, EXS_MHANDLE_UNREGISTERED};
    v[3] = (exs_iovec_t){e4->p, 2000, e4->mh};
    memcpy(keep, v, sizeof(v));
    IT_EXPECT_OK(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(1)));
    /* clobber the list: the data must still land in the elements given */
    for (int i = 0; i < 4; i++)
        v[i] = (exs_iovec_t){decoy->p, 2000, EXS_MHANDLE_UNREGISTERED};
    IT_POST_SEND(p.cfd, s->p, 5000, p.cq, AH(2), s->mh);
    it_expect_send(p.cq, p.cfd, AH(2), 5000);
    expect_msg(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(1), 5000, v, 4, 0);
    ck_assert_int_eq(iov_cmp(keep, 4, ref, 5000), -1);
    ck_assert(it_all_bytes(e4->p + 1000, 1000, IT_GUARD_BYTE));
    ck_assert(it_all_bytes(decoy->p, 8000, IT_GUARD_BYTE));
    ck_assert(it_buf_guards_ok(e1) && it_buf_guards_ok(e3) && it_buf_guards_ok(e4));

    /* 7000 bytes into a 6000-byte list: cut, MSG_TRUNC */
    memcpy(v, keep, sizeof(v));
    memset(e4->p, IT_GUARD_BYTE, 2000);
    IT_EXPECT_OK(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(3)));
    IT_POST_SEND(p.cfd, s->p, 7000, p.cq, AH(4), s->mh);
    it_expect_send(p.cq, p.cfd, AH(4), 7000);
    expect_msg(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(3), 6000, v, 4, 1);
    ck_assert_int_eq(iov_cmp(keep, 4, ref, 6000), -1);
    ck_assert(it_buf_guards_ok(e1) && it_buf_guards_ok(e3) && it_buf_guards_ok(e4));
    free(ref);
    it_pair_close(&p);
}
END_TEST

/* SOCK_STREAM: a receive completes with 1..total bytes (the stream's next bytes, in list
 * order); MSG_WAITALL waits for the whole list. */
START_TEST(test_msg_recvmsg_stream)
{
    struct it_pair p;
    struct it_buf *s, *e1, *e2;
    exs_iovec_t v[3];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 3};
    uint8_t *ref = ref_new(9000, 41);
    size_t got = 0;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    s = it_buf_new(9000, 1);
    e1 = it_buf_new(3000, 1);
    e2 = it_buf_new(1500, 0);
    memcpy(s->p, ref, 9000);
    v[0] = (exs_iovec_t){e1->p, 1500, e1->mh};
    v[1] = (exs_iovec_t){e2->p, 1500, EXS_MHANDLE_UNREGISTERED};
    v[2] = (exs_iovec_t){e1->p + 1500, 1500, e1->mh};
    /* MSG_WAITALL: the 4500 bytes of two sends fill the list */
    ck_assert_int_eq(exs_recvmsg(p.sfd, &m, MSG_WAITALL, p.sq, AH(1)), 0);
    IT_POST_SEND(p.cfd, s->p, 2000, p.cq, AH(2), s->mh);
    IT_POST_SEND(p.cfd, s->p + 2000, 2500, p.cq, AH(3), s->mh);
    it_expect_send(p.cq, p.cfd, AH(2), 2000);
    it_expect_send(p.cq, p.cfd, AH(3), 2500);
    expect_msg(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(1), 4500, v, 3, 0);
    ck_assert_int_eq(iov_cmp(v, 3, ref, 4500), -1);
    /* without: each receive takes 1..4500 of the next 4500 bytes, the stream stays whole */
    memset(e1->p, 0, 3000);
    memset(e2->p, 0, 1500);
    IT_POST_SEND(p.cfd, s->p + 4500, 4500, p.cq, AH(4), s->mh);
    while (got < 4500) {
        uint8_t *tmp = malloc(4500);
        ssize_t n;
        long bad;

        ck_assert_ptr_nonnull(tmp);
        memset(tmp, 0, 4500);
        v[0] = (exs_iovec_t){tmp, 1000, EXS_MHANDLE_UNREGISTERED};
        v[1] = (exs_iovec_t){tmp + 1000, 3500, EXS_MHANDLE_UNREGISTERED};
        m.msg_iovlen = 2;
        ck_assert_int_eq(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(5)), 0);
        n = expect_msg(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(5), IT_ANY_RESULT, v, 2, 0);
        ck_assert_int_le(n, (ssize_t)(4500 - got));
        bad = iov_cmp(v, 2, ref + 4500 + got, (size_t)n);
        ck_assert_msg(bad == -1, "byte %ld of the receive at %zu differs", bad, got);
        free(tmp);
        got += (size_t)n;
    }
    it_expect_send(p.cq, p.cfd, AH(4), 4500);
    free(ref);
    it_pair_close(&p);
}
END_TEST

/* ---- list checks ---- */

/* Every bad list is EINVAL with nothing posted and no registration left held; a list of
 * exactly EXS_IOV_MAX elements is accepted. */
START_TEST(test_msg_einval)
{
    static exs_iovec_t big[EXS_IOV_MAX + 1];
    static uint8_t bytes[EXS_IOV_MAX + 1];
    struct it_pair p;
    struct it_buf *a, *b, *r;
    exs_iovec_t v[3];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 2}, bad;
    exs_event_t ev;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    a = it_buf_new(4096, 1);
    b = it_buf_new(4096, 1);
    r = it_buf_new(EXS_IOV_MAX + 64, 1);
    for (int recv = 0; recv < 2; recv++) {
        int (*call)(int, const exs_msghdr_t *, int, exs_qhandle_t, exs_ahandle_t) =
            recv ? exs_recvmsg : exs_sendmsg;
        int fd = recv ? p.sfd : p.cfd;
        exs_qhandle_t q = recv ? p.sq : p.cq;

        it_context("%s", recv ? "exs_recvmsg" : "exs_sendmsg");
        IT_EXPECT_FAIL(call(fd, NULL, 0, q, AH(1)), EINVAL);
        bad = (exs_msghdr_t){.msg_iov = NULL, .msg_iovlen = 1};
        IT_EXPECT_FAIL(call(fd, &bad, 0, q, AH(1)), EINVAL);
        bad = (exs_msghdr_t){.msg_iov = v, .msg_iovlen = 0};
        IT_EXPECT_FAIL(call(fd, &bad, 0, q, AH(1)), EINVAL);
        for (int i = 0; i <= EXS_IOV_MAX; i++)
            big[i] = (exs_iovec_t){&bytes[i], 1, EXS_MHANDLE_UNREGISTERED};
        bad = (exs_msghdr_t){.msg_iov = big, .msg_iovlen = EXS_IOV_MAX + 1};
        IT_EXPECT_FAIL(call(fd, &bad, 0, q, AH(1)), EINVAL);
        /* a NULL base with a length */
        v[0] = (exs_iovec_t){a->p, 10, a->mh};
        v[1] = (exs_iovec_t){NULL, 10, EXS_MHANDLE_UNREGISTERED};
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        /* a total that overflows */
        v[1] = (exs_iovec_t){b->p, SIZE_MAX - 5, EXS_MHANDLE_UNREGISTERED};
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        v[0] = (exs_iovec_t){a->p, SIZE_MAX / 2 + 1, EXS_MHANDLE_UNREGISTERED};
        v[1] = (exs_iovec_t){b->p, SIZE_MAX / 2 + 1, EXS_MHANDLE_UNREGISTERED};
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        /* the second element's handle does not cover it (the first's is held, then let go) */
        v[0] = (exs_iovec_t){a->p, 10, a->mh};
        v[1] = (exs_iovec_t){b->p, 10, a->mh};
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        v[1] = (exs_iovec_t){b->p + 4000, 200, b->mh}; /* runs past its registration */
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        v[1] = (exs_iovec_t){b->p, 10, 12345}; /* no such registration */
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        v[1] = (exs_iovec_t){b->p, 10, EXS_MHANDLE_INVALID};
        IT_EXPECT_FAIL(call(fd, &m, 0, q, AH(1)), EINVAL);
        /* flags outside those of exs_send / exs_recv */
        v[1] = (exs_iovec_t){b->p, 10, b->mh};
        IT_EXPECT_FAIL(call(fd, &m, MSG_OOB, q, AH(1)), EINVAL);
        /* not a socket at all */
        IT_EXPECT_FAIL(call(exs_qfd(q), &m, 0, q, AH(1)), ENOTSOCK);
    }
    /* a receive of nothing */
    v[0] = (exs_iovec_t){a->p, 0, a->mh};
    v[1] = (exs_iovec_t){NULL, 0, EXS_MHANDLE_UNREGISTERED};
    IT_EXPECT_FAIL(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(1)), EINVAL);
    it_context(" ");
    /* no registration is held: each deregisters (and registers again) */
    IT_EXPECT_OK(exs_mderegister(a->mh));
    IT_EXPECT_OK(exs_mderegister(b->mh));
    a->mh = exs_mregister(a->p, 4096, 0);
    b->mh = exs_mregister(b->p, 4096, 0);
    ck_assert_int_gt(a->mh, 0);
    ck_assert_int_gt(b->mh, 0);
    /* nothing was posted: the first events are those of exactly EXS_IOV_MAX elements */
    for (int i = 0; i < EXS_IOV_MAX; i++) {
        bytes[i] = (uint8_t)(i * 7 + 1);
        big[i] = (exs_iovec_t){&bytes[i], 1, EXS_MHANDLE_UNREGISTERED};
    }
    bad = (exs_msghdr_t){.msg_iov = big, .msg_iovlen = EXS_IOV_MAX};
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &bad, 0, p.cq, AH(2)));
    ck_assert_int_eq(exs_recv(p.sfd, r->p, EXS_IOV_MAX, MSG_WAITALL, p.sq, AH(3), r->mh), 0);
    it_wait_event(p.cq, -1, -1, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SENDMSG);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, EXS_IOV_MAX);
    it_wait_event(p.sq, -1, -1, &ev);
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
    ck_assert(ev.exs_evt_ahandle == AH(3));
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, EXS_IOV_MAX);
    ck_assert_int_eq(memcmp(r->p, bytes, EXS_IOV_MAX), 0);
    it_pair_close(&p);
}
END_TEST

/* An element's registration is held until the event: exs_mderegister says EBUSY. */
START_TEST(test_msg_registration_held)
{
    struct it_pair p;
    struct it_buf *e, *s;
    exs_iovec_t v[1];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 1};

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    e = it_buf_new(512, 1);
    s = it_buf_new(512, 1);
    it_fill(s->p, 512, 51);
    v[0] = (exs_iovec_t){e->p, 512, e->mh};
    IT_EXPECT_OK(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(1)));
    IT_EXPECT_FAIL(exs_mderegister(e->mh), EBUSY);
    IT_POST_SEND(p.cfd, s->p, 512, p.cq, AH(2), s->mh);
    it_expect_send(p.cq, p.cfd, AH(2), 512);
    expect_msg(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(1), 512, v, 1, 0);
    ck_assert_int_eq(it_check(e->p, 512, 51), -1);
    it_buf_free(e); /* deregisters: asserted */
    it_pair_close(&p);
}
END_TEST

/* exs_close ends a pending exs_recvmsg / exs_sendfile with ECANCELED before its CLOSE
 * event; on a kernel socket exs_cancel ends a pending exs_recvmsg. Registrations are let
 * go (it_buf_free deregisters, asserted) and nothing leaks (it_fini counts). */
START_TEST(test_msg_cancel_close)
{
    struct it_pair p;
    struct it_buf *e;
    exs_iovec_t v[2];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 2};
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    e = it_buf_new(4096, 1);
    v[0] = (exs_iovec_t){e->p, 2048, e->mh};
    v[1] = (exs_iovec_t){e->p + 2048, 2048, EXS_MHANDLE_UNREGISTERED};
    IT_EXPECT_OK(exs_recvmsg(p.sfd, &m, MSG_WAITALL, p.sq, AH(1)));
    IT_EXPECT_FAIL(exs_mderegister(e->mh), EBUSY);
    IT_EXPECT_OK(exs_close(p.sfd, p.sq, AH(2)));
    it_expect_err(p.sq, EXS_EVT_RECVMSG, p.sfd, AH(1), ECANCELED);
    it_wait_event(p.sq, EXS_EVT_CLOSE, p.sfd, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    p.sfd = -1;
    it_buf_free(e);
    it_pair_close(&p);

    /* kernel socket: exs_cancel */
    q = it_qcreate(8);
    it_tcp_pair(&a, &b, 0, 0);
    e = it_buf_new(4096, 1);
    v[0] = (exs_iovec_t){e->p, 2048, e->mh};
    v[1] = (exs_iovec_t){e->p + 2048, 2048, EXS_MHANDLE_UNREGISTERED};
    IT_EXPECT_OK(exs_recvmsg(a, &m, 0, q, AH(3)));
    IT_EXPECT_OK(exs_cancel(a, AH(3), 0));
    it_wait_event(q, EXS_EVT_RECVMSG, a, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(3));
    ck_assert_int_eq(ev.exs_evt_errno, ECANCELED);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, -1);
    it_buf_free(e);
    it_kfd_settle(q);
    close(a);
    close(b);
    it_qdelete(q);
}
END_TEST

/* ---- synchronous forms ---- */

/* q == EXS_QHANDLE_INVALID: exs_sendmsg / exs_recvmsg / exs_sendfile return the bytes. */
START_TEST(test_msg_sync)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct it_pair p;
    struct it_buf *s, *r, *e;
    exs_iovec_t v[2];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 2};
    uint8_t *ref = ref_new(6000, 61);
    int file = tmpfile_new(6000, 62);
    uint8_t *fref = ref_new(6000, 62);

    it_init();
    it_pair_open(&p, type, 16, 16);
    s = it_buf_new(6000, 1);
    r = it_buf_new(6000, 1);
    e = it_buf_new(6000, 0);
    /* sendmsg */
    v[0] = (exs_iovec_t){s->p, 2500, s->mh};
    v[1] = (exs_iovec_t){e->p, 3500, EXS_MHANDLE_UNREGISTERED};
    iov_fill(v, 2, ref);
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 6000, MSG_WAITALL, p.sq, AH(1), r->mh), 0);
    ck_assert_int_eq(exs_sendmsg(p.cfd, &m, 0, EXS_QHANDLE_INVALID, AH(2)), 6000);
    it_expect_recv(p.sq, p.sfd, AH(1), 6000, 0);
    ck_assert_int_eq(memcmp(r->p, ref, 6000), 0);
    /* recvmsg */
    memset(s->p, 0, 6000);
    memset(e->p, 0, 6000);
    memcpy(r->p, ref, 6000);
    IT_POST_SEND(p.sfd, r->p, 6000, p.sq, AH(3), r->mh);
    ck_assert_int_eq(exs_recvmsg(p.cfd, &m, MSG_WAITALL, EXS_QHANDLE_INVALID, AH(4)), 6000);
    ck_assert_int_eq(iov_cmp(v, 2, ref, 6000), -1);
    it_expect_send(p.sq, p.sfd, AH(3), 6000);
    /* sendfile */
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 5000, MSG_WAITALL, p.sq, AH(5), r->mh), 0);
    ck_assert_int_eq(exs_sendfile(p.cfd, file, 1000, 5000, EXS_QHANDLE_INVALID, AH(6)), 5000);
    it_expect_recv(p.sq, p.sfd, AH(5), 5000, 0);
    ck_assert_int_eq(memcmp(r->p, fref + 1000, 5000), 0);
    /* a failing synchronous call reports its errno */
    IT_EXPECT_FAIL(exs_sendfile(p.cfd, file, -1, 10, EXS_QHANDLE_INVALID, AH(7)), EINVAL);
    IT_EXPECT_FAIL(exs_sendmsg(p.cfd, NULL, 0, EXS_QHANDLE_INVALID, AH(7)), EINVAL);
    close(file);
    free(ref);
    free(fref);
    it_pair_close(&p);
}
END_TEST

/* ---- exs_sendfile ---- */

/* Asynchronous: the range's bytes, the file offset unchanged; a range past the end is a
 * short count (0 at or after it); bad arguments fail with nothing sent. */
START_TEST(test_msg_sendfile)
{
    enum { FLEN = 100000 };
    struct it_pair p;
    struct it_buf *r, *mk;
    uint8_t *fref = ref_new(FLEN, 71);
    int file = tmpfile_new(FLEN, 71), dir;
    exs_event_t ev;
    const exs_evt_xfermsg_t *x = &ev.exs_evt_u.exs_evt_xfermsg;

    it_init();
    it_pair_open(&p, SOCK_STREAM, 16, 16);
    r = it_buf_new(FLEN, 0);
    mk = it_buf_new(4, 1);
    memcpy(mk->p, "MARK", 4);
    ck_assert_int_eq(lseek(file, 777, SEEK_SET), 777);

    IT_EXPECT_OK((int)exs_sendfile(p.cfd, file, 1000, 50000, p.cq, AH(1)));
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 50000, MSG_WAITALL, p.sq, AH(2), r->mh), 0);
    it_wait_event(p.cq, EXS_EVT_SENDFILE, p.cfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert(ev.exs_evt_ahandle == AH(1));
    ck_assert_int_eq(x->exs_evt_result, 50000);
    ck_assert_int_eq(x->exs_evt_in_fd, file);
    ck_assert_int_eq(x->exs_evt_offset, 1000);
    ck_assert_uint_eq(x->exs_evt_len, 50000);
    ck_assert_ptr_null(x->exs_evt_iov);
    it_expect_recv(p.sq, p.sfd, AH(2), 50000, 0);
    ck_assert_int_eq(memcmp(r->p, fref + 1000, 50000), 0);

    /* past the end: 10000 bytes, then 0 and 0; then a marker: nothing else came */
    IT_EXPECT_OK((int)exs_sendfile(p.cfd, file, 90000, 50000, p.cq, AH(3)));
    IT_EXPECT_OK((int)exs_sendfile(p.cfd, file, FLEN, 10, p.cq, AH(4)));
    IT_EXPECT_OK((int)exs_sendfile(p.cfd, file, 2 * FLEN, 10, p.cq, AH(5)));
    IT_POST_SEND(p.cfd, mk->p, 4, p.cq, AH(6), mk->mh);
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 10004, MSG_WAITALL, p.sq, AH(7), r->mh), 0);
    expect_msg(p.cq, EXS_EVT_SENDFILE, p.cfd, AH(3), 10000, NULL, 0, 0);
    expect_msg(p.cq, EXS_EVT_SENDFILE, p.cfd, AH(4), 0, NULL, 0, 0);
    expect_msg(p.cq, EXS_EVT_SENDFILE, p.cfd, AH(5), 0, NULL, 0, 0);
    it_expect_send(p.cq, p.cfd, AH(6), 4);
    it_expect_recv(p.sq, p.sfd, AH(7), 10004, 0);
    ck_assert_int_eq(memcmp(r->p, fref + 90000, 10000), 0);
    ck_assert_int_eq(memcmp(r->p + 10000, "MARK", 4), 0);
    ck_assert_int_eq(lseek(file, 0, SEEK_CUR), 777);

    /* bad arguments: nothing posted */
    IT_EXPECT_FAIL((int)exs_sendfile(p.cfd, -1, 0, 10, p.cq, AH(8)), EBADF);
    IT_EXPECT_FAIL((int)exs_sendfile(p.cfd, 12345, 0, 10, p.cq, AH(8)), EBADF);
    IT_EXPECT_FAIL((int)exs_sendfile(p.cfd, file, -5, 10, p.cq, AH(8)), EINVAL);
    IT_EXPECT_FAIL((int)exs_sendfile(-1, file, 0, 10, p.cq, AH(8)), EBADF);
    dir = open("/", O_RDONLY | O_DIRECTORY);
    ck_assert_int_ge(dir, 0);
    IT_EXPECT_FAIL((int)exs_sendfile(p.cfd, dir, 0, 10, p.cq, AH(8)), EISDIR);
    close(dir);
    it_expect_no_event(p.cq, 0);
    close(file);
    free(fref);
    it_pair_close(&p);
}
END_TEST

/* One call moves at most EXS_SENDFILE_MAX bytes (a short count, like sendfile(2)); a loop
 * on the result sends the whole file. SOCK_SEQPACKET: each call's bytes are one message. */
START_TEST(test_msg_sendfile_large)
{
    size_t flen = EXS_SENDFILE_MAX + 5000, got = 0;
    struct it_pair p;
    uint8_t *rbuf = malloc(flen), *fref = malloc(flen);
    int file = tmpfile_new(flen, 81);
    exs_event_t ev;

    ck_assert_ptr_nonnull(rbuf);
    ck_assert_ptr_nonnull(fref);
    if (strcmp(it_provider, "tcp") && strcmp(it_provider, "fault:tcp")) {
        /* rxe's largest message (8 MiB) is below EXS_SENDFILE_MAX: the first call's count
         * and the 16 MiB receive are the tcp provider's */
        test_skip("test_msg_sendfile_large", "provider %s: largest message below 16 MiB",
                  it_provider);
        free(rbuf);
        free(fref);
        close(file);
        return;
    }
    ck_assert_int_eq(pread(file, fref, flen, 0), (ssize_t)flen);
    it_init();
    it_pair_open(&p, _i ? SOCK_SEQPACKET : SOCK_STREAM, 16, 16);
    ck_assert_int_eq(exs_recv(p.sfd, rbuf, EXS_SENDFILE_MAX, _i ? 0 : MSG_WAITALL, p.sq, AH(1),
                              EXS_MHANDLE_UNREGISTERED),
                     0);
    ck_assert_int_eq(exs_recv(p.sfd, rbuf + EXS_SENDFILE_MAX, 5000, _i ? 0 : MSG_WAITALL, p.sq,
                              AH(2), EXS_MHANDLE_UNREGISTERED),
                     0);
    while (got < flen) {
        ssize_t n = exs_sendfile(p.cfd, file, (off_t)got, flen - got, EXS_QHANDLE_INVALID, 0);

        ck_assert_msg(n > 0, "exs_sendfile at %zu: %zd errno %d", got, n, errno);
        ck_assert_int_le(n, EXS_SENDFILE_MAX);
        if (!got)
            ck_assert_int_eq(n, EXS_SENDFILE_MAX);
        got += (size_t)n;
    }
    ck_assert_uint_eq(got, flen);
    it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, EXS_SENDFILE_MAX);
    it_expect_recv(p.sq, p.sfd, AH(2), 5000, 0);
    ck_assert_int_eq(memcmp(rbuf, fref, flen), 0);
    close(file);
    free(rbuf);
    free(fref);
    it_pair_close(&p);
}
END_TEST

/* The provider's largest message bounds both: a longer list is EMSGSIZE (nothing
 * posted), a longer sendfile range a short count (tcp: EXS_TCP_MAX_MSG made small). */
START_TEST(test_msg_max_msg)
{
    struct it_pair p;
    struct it_buf *s, *r;
    exs_iovec_t v[2];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 2};
    uint8_t *fref = ref_new(10000, 101);
    int file = tmpfile_new(10000, 101);
    exs_event_t ev;

    if (strcmp(it_provider, "tcp") && strcmp(it_provider, "fault:tcp")) {
        test_skip("test_msg_max_msg", "EXS_TCP_MAX_MSG is a tcp provider tunable");
        close(file);
        free(fref);
        return;
    }
    it_setenv("EXS_TCP_MAX_MSG", "4096");
    it_init();
    it_pair_open(&p, _i ? SOCK_STREAM : SOCK_SEQPACKET, 16, 16);
    s = it_buf_new(5000, 1);
    r = it_buf_new(4096, 1);
    v[0] = (exs_iovec_t){s->p, 4000, s->mh};
    v[1] = (exs_iovec_t){s->p + 4000, 97, EXS_MHANDLE_UNREGISTERED};
    IT_EXPECT_FAIL(exs_sendmsg(p.cfd, &m, 0, p.cq, AH(1)), EMSGSIZE);
    IT_EXPECT_FAIL(exs_recvmsg(p.sfd, &m, 0, p.sq, AH(1)), EMSGSIZE);
    ck_assert_int_eq(exs_recv(p.sfd, r->p, 4096, _i ? MSG_WAITALL : 0, p.sq, AH(2), r->mh), 0);
    IT_EXPECT_OK((int)exs_sendfile(p.cfd, file, 100, 9000, p.cq, AH(3)));
    it_wait_event(p.cq, -1, -1, &ev); /* the first event: nothing else was posted */
    ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_SENDFILE);
    ck_assert(ev.exs_evt_ahandle == AH(3));
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, 4096);
    it_expect_recv(p.sq, p.sfd, AH(2), 4096, 0);
    ck_assert_int_eq(memcmp(r->p, fref + 100, 4096), 0);
    close(file);
    free(fref);
    it_pair_close(&p);
}
END_TEST

/* ---- kernel sockets ---- */

/* exs_send, exs_sendmsg, exs_sendfile and a synchronous exs_sendmsg on a kernel TCP socket
 * reach a plain peer in posting order; exs_recvmsg (async and sync) reads a plain peer's
 * bytes into the list. */
START_TEST(test_msg_kfd)
{
    struct it_buf *s, *e;
    exs_iovec_t v[3];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 3};
    uint8_t *ref = ref_new(20000, 91), *fref = ref_new(30000, 92), *in = malloc(80000);
    int file = tmpfile_new(30000, 92), a, b;
    exs_qhandle_t q;

    ck_assert_ptr_nonnull(in);
    it_init();
    q = it_qcreate(16);
    it_tcp_pair(&a, &b, 0, 0);
    s = it_buf_new(20000, 1);
    e = it_buf_new(20000, 0);
    memcpy(s->p, ref, 1000);
    v[0] = (exs_iovec_t){s->p + 1000, 4000, s->mh};
    v[1] = (exs_iovec_t){e->p, 0, EXS_MHANDLE_UNREGISTERED};
    v[2] = (exs_iovec_t){e->p, 6000, EXS_MHANDLE_UNREGISTERED};
    iov_fill(v, 3, ref + 1000);
    IT_POST_SEND(a, s->p, 1000, q, AH(1), s->mh);
    IT_EXPECT_OK(exs_sendmsg(a, &m, 0, q, AH(2)));
    IT_EXPECT_OK((int)exs_sendfile(a, file, 5000, 25000, q, AH(3)));
    memcpy(e->p + 6000, ref + 11000, 9000);
    v[0] = (exs_iovec_t){e->p + 6000, 9000, EXS_MHANDLE_UNREGISTERED};
    m.msg_iovlen = 1;
    /* synchronous: posted behind the three, returns once its bytes are written */
    ck_assert_int_eq(exs_sendmsg(a, &m, 0, EXS_QHANDLE_INVALID, AH(4)), 9000);
    read_full(b, in, 1000 + 10000 + 25000 + 9000);
    ck_assert_int_eq(memcmp(in, ref, 11000), 0);
    ck_assert_int_eq(memcmp(in + 11000, fref + 5000, 25000), 0);
    ck_assert_int_eq(memcmp(in + 36000, ref + 11000, 9000), 0);
    it_expect_send(q, a, AH(1), 1000);
    expect_msg(q, EXS_EVT_SENDMSG, a, AH(2), 10000, v, 3, 0);
    expect_msg(q, EXS_EVT_SENDFILE, a, AH(3), 25000, NULL, 0, 0);

    /* receives */
    memset(s->p, 0, 20000);
    memset(e->p, 0, 20000);
    v[0] = (exs_iovec_t){s->p, 2000, s->mh};
    v[1] = (exs_iovec_t){e->p, 3000, EXS_MHANDLE_UNREGISTERED};
    m.msg_iovlen = 2;
    IT_EXPECT_OK(exs_recvmsg(a, &m, MSG_WAITALL, q, AH(5)));
    write_full(b, ref, 1500);
    write_full(b, ref + 1500, 3500);
    expect_msg(q, EXS_EVT_RECVMSG, a, AH(5), 5000, v, 2, 0);
    ck_assert_int_eq(iov_cmp(v, 2, ref, 5000), -1);
    write_full(b, ref + 5000, 100);
    for (int got = 0; got < 100;) {
        int n;

        v[0] = (exs_iovec_t){s->p + got, 60, s->mh};
        v[1] = (exs_iovec_t){e->p, 100, EXS_MHANDLE_UNREGISTERED};
        n = exs_recvmsg(a, &m, 0, EXS_QHANDLE_INVALID, AH(6));
        ck_assert_msg(n >= 1 && n <= 100 - got, "exs_recvmsg: %d errno %d", n, errno);
        if (n > 60) /* the second element's part, moved behind the first's */
            memmove(s->p + got + 60, e->p, (size_t)n - 60);
        got += n;
    }
    ck_assert_int_eq(memcmp(s->p, ref + 5000, 100), 0);
    /* a synchronous sendfile */
    ck_assert_int_eq(exs_sendfile(a, file, 0, 30000, EXS_QHANDLE_INVALID, AH(7)), 30000);
    read_full(b, in, 30000);
    ck_assert_int_eq(memcmp(in, fref, 30000), 0);
    it_kfd_settle(q);
    close(a);
    close(b);
    close(file);
    free(ref);
    free(fref);
    free(in);
    it_qdelete(q);
}
END_TEST

/* A reader thread draining a kernel socket with blocking recv (slowly, in small pieces). */
struct reader {
    int fd;
    uint8_t *buf;
    size_t len;
    size_t got;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;

    while (r->got < r->len) {
        size_t want = r->len - r->got < 3000 ? r->len - r->got : 3000;
        ssize_t n = recv(r->fd, r->buf + r->got, want, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        r->got += (size_t)n;
        if ((r->got / 3000) % 50 == 0)
            usleep(1000);
    }
    return NULL;
}

/* exs_sendfile on a kernel socket the application made non-blocking: the bytes go with
 * sendfile(2) (counted), what the small socket buffers cannot take at once is queued
 * first, and a send posted behind it follows it on the wire; the file offset and the
 * socket's flags are unchanged. A blocking socket takes the copying path; a file
 * sendfile(2) refuses (not open for reading) falls back to it (EBADF, nothing posted). */
START_TEST(test_msg_kfd_sendfile)
{
    /* 512 KiB: 32 times the socket buffers (3 MiB took over 10 s in the Soft-RoCE guest) */
    enum { FLEN = 1 << 19, TAIL = 5000 };
    uint8_t *fref = ref_new(FLEN, 94), *tail = ref_new(TAIL, 95);
    struct reader rd = {.len = FLEN - 1000 + TAIL};
    int file = tmpfile_new(FLEN, 94), a, b, fl, wfile;
    unsigned long long zc0;
    char path[] = "/tmp/exs-sendfile-XXXXXX";
    exs_qhandle_t q;
    pthread_t th;

    it_init();
    q = it_qcreate(16);
    it_tcp_pair(&a, &b, 16384, 16384);
    fl = fcntl(a, F_GETFL);
    ck_assert_int_eq(fcntl(a, F_SETFL, fl | O_NONBLOCK), 0); /* the application's choice */
    fl = fcntl(a, F_GETFL);
    ck_assert_int_eq(lseek(file, 7, SEEK_SET), 7);
    rd.fd = b;
    rd.buf = malloc(rd.len);
    ck_assert_ptr_nonnull(rd.buf);
    zc0 = exs__debug_kfd_sendfile_bytes();
    /* nobody reads yet: the socket fills, the rest is queued */
    IT_EXPECT_OK((int)exs_sendfile(a, file, 1000, FLEN - 1000, q, AH(1)));
    ck_assert_uint_gt(exs__debug_kfd_sendfile_bytes(), zc0);
    IT_POST_SEND(a, tail, TAIL, q, AH(2), EXS_MHANDLE_UNREGISTERED);
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
    expect_msg(q, EXS_EVT_SENDFILE, a, AH(1), FLEN - 1000, NULL, 0, 0);
    it_expect_send(q, a, AH(2), TAIL);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_uint_eq(rd.got, rd.len);
    ck_assert_int_eq(memcmp(rd.buf, fref + 1000, FLEN - 1000), 0);
    ck_assert_int_eq(memcmp(rd.buf + FLEN - 1000, tail, TAIL), 0);
    ck_assert_int_eq(lseek(file, 0, SEEK_CUR), 7);
    ck_assert_int_eq(fcntl(a, F_GETFL), fl);
    /* synchronous, past the end of the file: a short count */
    zc0 = exs__debug_kfd_sendfile_bytes();
    ck_assert_int_eq(exs_sendfile(a, file, FLEN - 300, 1000, EXS_QHANDLE_INVALID, AH(3)), 300);
    ck_assert_uint_eq(exs__debug_kfd_sendfile_bytes(), zc0 + 300);
    read_full(b, rd.buf, 300);
    ck_assert_int_eq(memcmp(rd.buf, fref + FLEN - 300, 300), 0);
    /* refused by sendfile(2): the copying path reports pread's error */
    wfile = mkstemp(path);
    ck_assert_int_ge(wfile, 0);
    ck_assert_int_eq(write(wfile, "abcdef", 6), 6);
    close(wfile);
    wfile = open(path, O_WRONLY); /* a regular file, not open for reading */
    ck_assert_int_ge(wfile, 0);
    unlink(path);
    IT_EXPECT_FAIL((int)exs_sendfile(a, wfile, 0, 6, q, AH(4)), EBADF);
    ck_assert_uint_eq(exs__debug_kfd_sendfile_bytes(), zc0 + 300);
    close(wfile);
    /* blocking: the copying path (sendfile(2) could block the caller) */
    ck_assert_int_eq(fcntl(a, F_SETFL, fl & ~O_NONBLOCK), 0);
    IT_EXPECT_OK((int)exs_sendfile(a, file, 0, 4000, q, AH(5)));
    read_full(b, rd.buf, 4000);
    ck_assert_int_eq(memcmp(rd.buf, fref, 4000), 0);
    expect_msg(q, EXS_EVT_SENDFILE, a, AH(5), 4000, NULL, 0, 0);
    ck_assert_uint_eq(exs__debug_kfd_sendfile_bytes(), zc0 + 300);
    it_kfd_settle(q);
    close(a);
    close(b);
    close(file);
    free(rd.buf);
    free(fref);
    free(tail);
    it_qdelete(q);
}
END_TEST

/* A large exs_sendmsg through small kernel buffers: partial writes are retried, in order. */
START_TEST(test_msg_kfd_partial)
{
    enum { LEN = 2 << 20 };
    struct it_buf *s1, *s2;
    exs_iovec_t v[3];
    exs_msghdr_t m = {.msg_iov = v, .msg_iovlen = 3};
    uint8_t *ref = ref_new(2 * LEN, 93);
    struct reader rd = {.len = 2 * LEN};
    struct timeval tv = {.tv_sec = 20};
    pthread_t th;
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;

    it_init();
    q = it_qcreate(16);
    /* smaller buffers make loopback TCP stall ~200 ms per window (its persist timer), which
     * the timeout of a loaded guest once hit */
    it_tcp_pair(&a, &b, 32768, 32768);
    ck_assert_int_eq(setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    rd.fd = b;
    rd.buf = malloc(2 * LEN);
    ck_assert_ptr_nonnull(rd.buf);
    s1 = it_buf_new(LEN, 1);
    s2 = it_buf_new(LEN, 0);
    v[0] = (exs_iovec_t){s1->p, LEN / 2, s1->mh};
    v[1] = (exs_iovec_t){s2->p, LEN, EXS_MHANDLE_UNREGISTERED};
    v[2] = (exs_iovec_t){s1->p + LEN / 2, LEN / 2, s1->mh};
    iov_fill(v, 3, ref);
    IT_EXPECT_OK(exs_sendmsg(a, &m, 0, q, AH(1)));
    ck_assert_int_eq(pthread_create(&th, NULL, reader_main, &rd), 0);
    it_wait_event_at(q, EXS_EVT_SENDMSG, a, 45000, &ev, __FILE__, __LINE__);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, 2 * LEN);
    pthread_join(th, NULL);
    ck_assert_uint_eq(rd.got, 2 * LEN);
    ck_assert_int_eq(memcmp(rd.buf, ref, 2 * LEN), 0);
    it_kfd_settle(q);
    close(a);
    close(b);
    free(rd.buf);
    free(ref);
    it_qdelete(q);
}
END_TEST

/* The plain peer resets: a pending exs_recvmsg and a pending large exs_sendmsg end with
 * the error in their events; nothing is left (it_fini counts the objects). */
START_TEST(test_msg_kfd_reset)
{
    enum { LEN = 2 << 20 };
    struct sigaction old;
    struct it_buf *s, *r;
    exs_iovec_t sv[2], rv[2];
    exs_msghdr_t sm = {.msg_iov = sv, .msg_iovlen = 2}, rm = {.msg_iov = rv, .msg_iovlen = 2};
    exs_qhandle_t q;
    exs_event_t ev;
    int a, b;

    q = it_kfd_reset_open(&a, &b, &old);
    s = it_buf_new(LEN, 1);
    r = it_buf_new(100, 1);
    rv[0] = (exs_iovec_t){r->p, 50, r->mh};
    rv[1] = (exs_iovec_t){r->p + 50, 50, EXS_MHANDLE_UNREGISTERED};
    sv[0] = (exs_iovec_t){s->p, LEN / 2, s->mh};
    sv[1] = (exs_iovec_t){s->p + LEN / 2, LEN / 2, EXS_MHANDLE_UNREGISTERED};
    IT_EXPECT_OK(exs_recvmsg(a, &rm, 0, q, AH(1)));
    IT_EXPECT_OK(exs_sendmsg(a, &sm, 0, q, AH(2)));
    it_tcp_reset(b);
    it_wait_event(q, EXS_EVT_RECVMSG, a, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(1));
    ck_assert_msg(ev.exs_evt_errno == ECONNRESET, "recvmsg errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, -1);
    it_wait_event(q, EXS_EVT_SENDMSG, a, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    ck_assert_msg(ev.exs_evt_errno == ECONNRESET || ev.exs_evt_errno == EPIPE, "sendmsg errno %d",
                  ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, -1);
    /* the registrations were let go */
    it_buf_free(r);
    it_buf_free(s);
    sigaction(SIGPIPE, &old, NULL);
    it_kfd_settle(q);
    close(a);
    it_qdelete(q);
}
END_TEST

/* ---- exs sockets: the connection is reset under pending operations ---- */

/* The fault provider drops connection p at its first send (as a peer reset would): the
 * pending exs_sendmsg and exs_recvmsg fail with ECONNRESET in their events, their
 * registrations are let go and nothing leaks (it_fini counts). */
START_TEST(test_msg_reset)
{
    struct it_pair p;
    struct it_buf *s, *r;
    exs_iovec_t sv[2], rv[2];
    exs_msghdr_t sm = {.msg_iov = sv, .msg_iovlen = 2}, rm = {.msg_iov = rv, .msg_iovlen = 2};
    exs_event_t ev;

    it_setenv("EXS_SNDBUF", "0"); /* STREAM: the send waits for its write, not the buffer */
    it_fault_init();
    it_pair_open(&p, _i ? SOCK_STREAM : SOCK_SEQPACKET, 16, 16);
    s = it_buf_new(3000, 1);
    r = it_buf_new(3000, 1);
    it_fault_set_port(&p);
    it_fault_set("fault_drop_nth", "1");
    rv[0] = (exs_iovec_t){r->p, 1000, r->mh};
    rv[1] = (exs_iovec_t){r->p + 1000, 2000, EXS_MHANDLE_UNREGISTERED};
    sv[0] = (exs_iovec_t){s->p, 1000, EXS_MHANDLE_UNREGISTERED};
    sv[1] = (exs_iovec_t){s->p + 1000, 2000, s->mh};
    IT_EXPECT_OK(exs_recvmsg(p.sfd, &rm, MSG_WAITALL, p.sq, AH(1)));
    IT_EXPECT_OK(exs_sendmsg(p.cfd, &sm, 0, p.cq, AH(2)));
    it_wait_event(p.cq, EXS_EVT_SENDMSG, p.cfd, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(2));
    ck_assert_msg(ev.exs_evt_errno == ECONNRESET, "sendmsg errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, -1);
    it_wait_event(p.sq, EXS_EVT_RECVMSG, p.sfd, &ev);
    ck_assert(ev.exs_evt_ahandle == AH(1));
    ck_assert_msg(ev.exs_evt_errno == ECONNRESET, "recvmsg errno %d", ev.exs_evt_errno);
    ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result, -1);
    it_fault_set("fault_drop_nth", "0");
    it_buf_free(s);
    it_buf_free(r);
    it_pair_close(&p);
}
END_TEST

Suite *integ_msg_suite(void)
{
    Suite *s = suite_create("integ_msg");
    TCase *tc;

    it_suite_add(s, "msg_exs", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_msg_sendmsg_seqpacket, test_msg_sendmsg_stream,
                                        test_msg_recvmsg_seqpacket, test_msg_recvmsg_stream,
                                        test_msg_einval, test_msg_registration_held,
                                        test_msg_cancel_close, test_msg_sendfile, NULL});
    it_suite_add(
        s, "msg_sync", IT_CASE_TIMEOUT, 2,
        (const TTest *const[]){test_msg_sync, test_msg_sendfile_large, test_msg_max_msg, NULL});
    it_suite_add(s, "msg_kfd", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_msg_kfd, test_msg_kfd_partial, test_msg_kfd_reset,
                                        test_msg_kfd_sendfile, NULL});
    tc = tcase_create("msg_reset");
    tcase_set_timeout(tc, IT_CASE_TIMEOUT);
    tcase_add_checked_fixture(tc, NULL, it_fault_teardown);
    tcase_add_loop_test(tc, test_msg_reset, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
