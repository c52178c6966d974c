/* SPDX-License-Identifier: MIT */
/* Kernel sockets: exs_sendfile with sendfile(2). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/api/kfd_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

static uint64_t kfd_sendfile_bytes; /* atomic: bytes moved by sendfile(2) */

unsigned long long exs__debug_kfd_sendfile_bytes(void)
{
    return __atomic_load_n(&kfd_sendfile_bytes, __ATOMIC_RELAXED);
}

/* ---- exs_sendfile: sendfile(2) ---- */

/* The posting thread, k->lock free, k->file_busy ours: move up to want bytes of in_fd
 * from offset with sendfile(2) (non-blocking: the socket's own O_NONBLOCK). Returns the
 * bytes moved; *stop_p: 0 all moved, EAGAIN the socket is full, -1 end of file, else
 * the errno that stopped it. */
static size_t kfd_sendfile_run(int fd, int in_fd, off_t offset, size_t want, int *stop_p)
{
    off_t off = offset;
    size_t sent = 0;

    *stop_p = 0;
    while (sent < want) {
        ssize_t n = sendfile(fd, in_fd, &off, want - sent);

        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n == 0) {
            *stop_p = -1;
            break;
        }
        if (errno == EINTR)
            continue;
        *stop_p = errno;
        break;
    }
    __atomic_fetch_add(&kfd_sendfile_bytes, (uint64_t)sent, __ATOMIC_RELAXED);
    return sent;
}

/* The posting thread, k->lock free: read what sendfile(2) left (the socket was full)
 * into op's buffer, so that the progress thread never reads the file. Short at the end
 * of the file or at a read error. */
static void kfd_sendfile_rest(struct kfd_op *op, int in_fd, off_t offset, size_t rest)
{
    struct api_bounce *b = op->bounce;
    size_t got = 0;

    b->buf = malloc(rest);
    if (!b->buf) {
        EXS_WARN(API, "sendfile: no memory for the %zu bytes left: a short count", rest);
        return;
    }
    while (got < rest) {
        ssize_t n = exs__nc_pread(in_fd, b->buf + got, rest - got, offset + (off_t)got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0)
                EXS_DBG(API, "sendfile: pread(%d): %m: a short count", in_fd);
            break;
        }
        got += (size_t)n;
    }
    b->len = got;
    op->buf = (char *)b->buf;
    op->len = got;
}

/* The posting thread is done writing (k locked again): queue the rest at the head, or
 * finish op; then a deferred exs_close, or the sends queued meanwhile. */
static void kfd_sendfile_end(struct kfd *k, struct kfd_op *op)
{
    k->file_busy = 0;
    if (!k->attached) {
        /* exs_fini dropped k meanwhile */
        k->n_send--;
        exs__api_kfd_to_end_locked(k, op);
        exs__api_kfd_op_drop(op);
        return;
    }
    if (k->close_op) {
        struct kfd_op *c = k->close_op;

        k->close_op = NULL;
        exs__api_kfd_op_finish_locked(k, op, -1, ECANCELED);
        exs__api_kfd_close_locked(k, c);
        return;
    }
    if (op->len)
        exs_list_add_head(&k->sendq, &op->link); /* before the sends queued meanwhile */
    else
        exs__api_kfd_op_finish_locked(k, op, 0, 0);
    exs__api_kfd_run_locked(k);
    exs__api_kfd_update_locked(k);
    exs__api_kfd_idle_locked(k);
}

/* Give the synchronous queue back unused (the copying path takes it again). */
static void kfd_sync_put(int sync, exs_qhandle_t q)
{
    int e = errno;

    (void)exs__api_sync_fail(sync, q, 0);
    errno = e;
}

/* exs_sendfile leaves k (locked, with its reference) without queuing op: k unlocked and
 * put, op dropped (the caller then takes the copying path or fails). */
static void kfd_sendfile_leave(struct kfd *k, struct kfd_op *op)
{
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
    exs__api_kfd_op_drop(op);
}

ssize_t exs__api_kfd_sendfile(int fd, int in_fd, off_t offset, size_t count, size_t want,
                              exs_qhandle_t q, exs_ahandle_t ah, int *taken_p)
{
    int err = 0, stop, fl, sync = q == EXS_QHANDLE_INVALID;
    struct api_bounce *b;
    struct kfd_op *op;
    struct stat st;
    struct kfd *k;
    exs_event_t ev;
    size_t sent;

    *taken_p = 0;
    /* only where sendfile(2) cannot block and reads what pread would: a non-blocking
     * kernel stream socket (the application's own flag), a regular file */
    if (!want || !exs__api_initialized() || !exs__api_kfd_is_stream(fd))
        return 0;
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || !(fl & O_NONBLOCK) || fstat(in_fd, &st) || !S_ISREG(st.st_mode))
        return 0;
    b = calloc(1, sizeof(*b));
    if (!b)
        return 0; /* the copying path reports it */
    b->evt_type = EXS_EVT_SENDFILE;
    b->in_fd = in_fd;
    b->offset = offset;
    b->len_req = count;
    op = exs__api_kfd_op_new(EXS_EVT_SEND, sync, &q, ah, &err);
    if (!op)
        exs__api_bounce_free(b);
    else
        op->bounce = b;
    k = op ? exs__api_kfd_get_for_op(fd, op, &err) : NULL; /* without k, op and b are gone */
    if (!k) {
        *taken_p = 1;
        return exs__api_sync_fail(sync, q, err);
    }
    if (!exs_list_empty(&k->sendq) || k->file_busy || k->close_op || k->err ||
        k->n_send >= (int)exs__params.sock_max_ops) {
        /* sends ahead of it (or a failed connection): the copying path queues behind */
        exs__api_kfd_idle_locked(k);
        kfd_sendfile_leave(k, op);
        kfd_sync_put(sync, q);
        return 0;
    }
    if (!sync && (err = exs__api_kfd_to_start_locked(k, op))) {
        exs__api_kfd_idle_locked(k);
        kfd_sendfile_leave(k, op);
        *taken_p = 1;
        return exs__api_sync_fail(sync, q, err);
    }
    k->n_send++;
    k->file_busy = 1;
    exs__api_kfd_count_locked(k);
    exs__api_kfd_unlock(k);
    sent = kfd_sendfile_run(fd, in_fd, offset, want, &stop);
    if (!sent && stop > 0 && stop != EAGAIN) {
        /* refused (EINVAL, ENOSYS for this file, EBADF, ...): the copying path, which
         * reports the errors pread and send give */
        EXS_DBG(API, "kfd %d: sendfile(2) from %d: %s: copying instead", fd, in_fd, strerror(stop));
        exs__api_kfd_lock(k);
        k->file_busy = 0;
        k->n_send--;
        exs__api_kfd_to_end_locked(k, op);
        if (k->close_op) {
            struct kfd_op *c = k->close_op;

            k->close_op = NULL;
            exs__api_kfd_close_locked(k, c);
        } else if (k->attached) {
            exs__api_kfd_run_locked(k);
            exs__api_kfd_update_locked(k);
            exs__api_kfd_idle_locked(k);
        }
        kfd_sendfile_leave(k, op);
        kfd_sync_put(sync, q);
        return 0;
    }
    op->pre = sent;
    if (stop == EAGAIN)
        kfd_sendfile_rest(op, in_fd, offset + (off_t)sent, want - sent);
    else if (stop > 0)
        EXS_DBG(API, "kfd %d: sendfile(2): %s after %zu bytes: a short count", fd, strerror(stop),
                sent);
    exs__api_kfd_lock(k);
    kfd_sendfile_end(k, op);
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
    *taken_p = 1;
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    return sync ? (ssize_t)ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result : 0;
}
