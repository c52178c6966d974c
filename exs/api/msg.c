/* SPDX-License-Identifier: MIT */
/* exs_sendmsg, exs_recvmsg and exs_sendfile: scatter/gather lists and file ranges, each moved
 * through one library buffer by an ordinary send or receive. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/*
 * Design (spec/api.md, "Scatter/gather and file transfer"): the posting thread checks the
 * list, copies it, holds each element's registration busy and allocates one buffer of
 * the list's total length. exs_sendmsg gathers the elements into it at once; exs_sendfile
 * fills it with pread() of the file range, in the posting thread (the progress thread
 * never waits for a file). The operation is then an exs_send / exs_recv of that buffer
 * (on an exs socket or a kernel socket alike), so the protocol, ordering, cancel and
 * close rules are exactly those of exs_send / exs_recv. When a receive ends, its bytes
 * are scattered into the elements in list order just before the event is posted.
 */

void exs__api_bounce_free(struct api_bounce *b)
{
    if (b->mr) {
        int ret = exs__prov_mr_dereg(b->mr);

        if (ret)
            EXS_WARN(API, "msg: deregistration of a %zu-byte buffer: %s", b->len, strerror(-ret));
    }
    for (size_t i = 0; b->mregs && i < b->iovcnt; i++)
        if (b->mregs[i])
            exs__api_mreg_release(b->mregs[i]);
    free(b->mregs);
    free(b->iov);
    free(b->buf);
    free(b);
}

void exs__api_bounce_event(struct api_bounce *b, ssize_t result, int rflags, exs_event_t *ev)
{
    exs_evt_xfermsg_t *x = &ev->exs_evt_u.exs_evt_xfermsg;

    if (b->evt_type == EXS_EVT_RECVMSG && result > 0) {
        size_t left = EXS_MIN((size_t)result, b->len);
        const uint8_t *src = b->buf;

        for (size_t i = 0; i < b->iovcnt && left; i++) {
            size_t n = EXS_MIN(left, b->iov[i].iov_len);

            memcpy(b->iov[i].iov_base, src, n);
            src += n;
            left -= n;
        }
    }
    memset(&ev->exs_evt_u, 0, sizeof(ev->exs_evt_u));
    ev->exs_evt_type = b->evt_type;
    x->exs_evt_iov = b->uiov;
    x->exs_evt_len = b->len_req;
    x->exs_evt_result = result;
    x->exs_evt_flags = rflags;
    x->exs_evt_in_fd = b->in_fd;
    x->exs_evt_iovlen = b->evt_type == EXS_EVT_SENDFILE ? 0 : b->iovcnt;
    x->exs_evt_offset = b->offset;
}

/* Check msg and make its bounce (gathered when !recv): 0 or an errno. */
static int msg_bounce(const exs_msghdr_t *msg, int recv, struct api_bounce **b_p)
{
    struct api_bounce *b;
    size_t total = 0, n;

    if (!msg || !msg->msg_iov || !msg->msg_iovlen || msg->msg_iovlen > EXS_IOV_MAX)
        return EINVAL;
    n = msg->msg_iovlen;
    for (size_t i = 0; i < n; i++) {
        const exs_iovec_t *v = &msg->msg_iov[i];

        if ((!v->iov_base && v->iov_len) || total + v->iov_len < total ||
            total + v->iov_len > SSIZE_MAX)
            return EINVAL;
        total += v->iov_len;
    }
    if (recv && !total)
        return EINVAL;
    b = calloc(1, sizeof(*b));
    if (!b)
        return ENOMEM;
    b->evt_type = recv ? EXS_EVT_RECVMSG : EXS_EVT_SENDMSG;
    b->in_fd = -1;
    b->uiov = msg->msg_iov;
    b->len_req = total;
    b->len = total;
    b->iovcnt = n;
    b->iov = malloc(n * sizeof(*b->iov));
    b->mregs = calloc(n, sizeof(*b->mregs));
    b->buf = total ? malloc(total) : NULL;
    if (!b->iov || !b->mregs || (total && !b->buf)) {
        exs__api_bounce_free(b);
        return ENOMEM;
    }
    memcpy(b->iov, msg->msg_iov, n * sizeof(*b->iov));
    for (size_t i = 0; i < n; i++) {
        exs_iovec_t *v = &b->iov[i];

        if (v->iov_mh != EXS_MHANDLE_UNREGISTERED &&
            exs__api_mreg_hold(v->iov_mh, v->iov_base, v->iov_len, &b->mregs[i])) {
            EXS_DBG(API, "msg: element %zu: memory handle %d does not cover it", i, v->iov_mh);
            exs__api_bounce_free(b);
            return EINVAL;
        }
    }
    if (!recv) {
        uint8_t *dst = b->buf;

        for (size_t i = 0; i < n; i++) {
            if (b->iov[i].iov_len)
                memcpy(dst, b->iov[i].iov_base, b->iov[i].iov_len);
            dst += b->iov[i].iov_len;
        }
    }
    *b_p = b;
    return 0;
}

int exs_sendmsg(int fd, const exs_msghdr_t *msg, int flags, exs_qhandle_t q, exs_ahandle_t ah)
{
    struct api_bounce *b = NULL;
    int err = msg_bounce(msg, 0, &b);

    if (err)
        return exs__err(err);
    return exs__api_xfer_bounce(fd, flags, q, ah, 0, b);
}

int exs_recvmsg(int fd, const exs_msghdr_t *msg, int flags, exs_qhandle_t q, exs_ahandle_t ah)
{
    struct api_bounce *b = NULL;
    int err = msg_bounce(msg, 1, &b);

    if (err)
        return exs__err(err);
    return exs__api_xfer_bounce(fd, flags, q, ah, 1, b);
}

ssize_t exs_sendfile(int fd, int in_fd, off_t offset, size_t count, exs_qhandle_t q,
                     exs_ahandle_t ah)
{
    struct api_bounce *b;
    size_t want = EXS_MIN(count, (size_t)EXS_SENDFILE_MAX), got = 0;

    if (offset < 0 || in_fd < 0)
        return exs__err(in_fd < 0 ? EBADF : EINVAL);
    if (exs__api_initialized())
        want = EXS_MIN(want, (size_t)exs__engine_ctx()->caps.max_msg_size);
    /* a non-blocking kernel socket and a regular file: sendfile(2) (kfd.c) */
    {
        int taken = 0;
        ssize_t r = exs__api_kfd_sendfile(fd, in_fd, offset, count, want, q, ah, &taken);

        if (taken)
            return r;
    }
    b = calloc(1, sizeof(*b));
    if (!b)
        return exs__err(ENOMEM);
    b->evt_type = EXS_EVT_SENDFILE;
    b->in_fd = in_fd;
    b->offset = offset;
    b->len_req = count;
    b->buf = want ? malloc(want) : NULL;
    if (want && !b->buf) {
        exs__api_bounce_free(b);
        return exs__err(ENOMEM);
    }
    /* the range, read here (never on the progress thread); the file offset is not moved */
    while (got < want) {
        ssize_t n = exs__nc_pread(in_fd, b->buf + got, want - got, offset + (off_t)got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;

            EXS_DBG(API, "sendfile: pread(%d, %zu bytes at %lld): %s", in_fd, want - got,
                    (long long)(offset + (off_t)got), strerror(err));
            if (got)
                break; /* send what was read: a short count, like sendfile(2) */
            exs__api_bounce_free(b);
            return exs__err(err);
        }
        if (n == 0)
            break; /* end of file: a short count */
        got += (size_t)n;
    }
    b->len = got;
    if (!got) {
        free(b->buf);
        b->buf = NULL;
    }
    return exs__api_xfer_bounce(fd, 0, q, ah, 0, b);
}
