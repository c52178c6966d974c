/* SPDX-License-Identifier: MIT */
/* Kernel sockets: the calls that end operations early or for good, exs_shutdown,
 * exs_close and exs_cancel on a kernel descriptor (the model: kfd.c's header comment). */
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/kfd.h"
#include "exs/api/kfd_int.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* The start of exs_shutdown and exs_close on kernel socket fd: the checks, the operation
 * (type, how) in *op_p and fd's kfd, locked with a reference; NULL with the call's return
 * value in *ret_p. */
static struct kfd *kfd_call_begin(int fd, int type, int how, int sync, exs_qhandle_t *q,
                                  exs_ahandle_t ah, struct kfd_op **op_p, int *ret_p)
{
    struct kfd *k;
    int err;

    if ((err = exs__api_kfd_check(fd))) {
        *ret_p = exs__err(err);
        return NULL;
    }
    if (type == EXS_EVT_SHUTDOWN && how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
        *ret_p = exs__err(EINVAL);
        return NULL;
    }
    *op_p = exs__api_kfd_op_new(type, sync, q, ah, &err);
    if (!*op_p) {
        *ret_p = exs__api_sync_fail(sync, *q, err);
        return NULL;
    }
    (*op_p)->how = how;
    k = exs__api_kfd_get_for_op(fd, *op_p, &err);
    if (!k)
        *ret_p = exs__api_sync_fail(sync, *q, err);
    return k;
}

int exs__api_kfd_shutdown(int fd, int how, exs_qhandle_t q, exs_ahandle_t ah)
{
    int ret, sync = q == EXS_QHANDLE_INVALID;
    struct kfd_op *op;
    struct kfd *k;
    exs_event_t ev;

    k = kfd_call_begin(fd, EXS_EVT_SHUTDOWN, how, sync, &q, ah, &op, &ret);
    if (!k)
        return ret;
    if (how == SHUT_RD) {
        /* not ordered with sends: at once (pending receives then see the end) */
        int r = shutdown(fd, SHUT_RD);

        exs__api_kfd_op_finish_locked(k, op, 0, r ? errno : 0);
        exs__api_kfd_run_locked(k);
        exs__api_kfd_update_locked(k);
        exs__api_kfd_unlock(k);
        exs__api_kfd_put(k);
    } else {
        exs__api_kfd_submit(k, op); /* after the sends queued before it */
    }
    return exs__api_call_end(sync, q, &ev);
}

/* exs_close of k (locked) with its CLOSE op: from here the number belongs to this close:
 * every operation ends cancelled (in posting order per direction; the descriptor leaves
 * kfd_ep first), then the descriptor is closed, then the CLOSE event. */
void exs__api_kfd_close_locked(struct kfd *k, struct kfd_op *op)
{
    struct exs_list *n;
    int err = 0;

    exs__api_kfd_detach_locked(k);
    while ((n = exs_list_pop_head(&k->sendq)))
        exs__api_kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, ECANCELED);
    while ((n = exs_list_pop_head(&k->recvq)))
        exs__api_kfd_op_finish_locked(k, exs_list_entry(n, struct kfd_op, link), -1, ECANCELED);
    k->snd_timeo = k->rcv_timeo = 0;
    /* close() frees the descriptor whatever it returns (EINTR included) */
    if (exs__nc_close(k->fd) && errno != EINTR)
        err = errno;
    exs__api_kfd_op_finish_locked(k, op, 0, err);
}

int exs__api_kfd_close(int fd, exs_qhandle_t q, exs_ahandle_t ah)
{
    int ret, sync = q == EXS_QHANDLE_INVALID;
    struct kfd_op *op;
    struct kfd *k;
    exs_event_t ev;

    k = kfd_call_begin(fd, EXS_EVT_CLOSE, 0, sync, &q, ah, &op, &ret);
    if (!k)
        return ret;
    if (k->file_busy && !k->close_op)
        k->close_op = op; /* after the exs_sendfile writing now (kfd_sendfile_end) */
    else
        exs__api_kfd_close_locked(k, op);
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
    return exs__api_call_end(sync, q, &ev);
}

int exs__api_kfd_cancel(int fd, exs_ahandle_t ah, int flags)
{
    struct exs_list *qs[2], *pos, *next;
    struct kfd *k;

    if (!exs__api_kfd_is_stream(fd))
        return exs__err(ENOTSOCK);
    if (exs__api_cancel_flags_bad(flags))
        return exs__err(EINVAL);
    k = exs__api_kfd_find(fd);
    if (!k)
        return 0; /* nothing pending */
    exs__api_kfd_lock(k);
    qs[0] = &k->sendq;
    qs[1] = &k->recvq;
    /* Only what moved no byte yet: the stream stays whole. A cancelled operation's
     * event may come before those of earlier ones still pending. */
    for (int i = 0; i < 2 && k->attached; i++) {
        for (pos = qs[i]->next; pos != qs[i]; pos = next) {
            struct kfd_op *op = exs_list_entry(pos, struct kfd_op, link);

            next = pos->next;
            if ((op->ah != ah && flags != EXS_CAF_FILDES) || op->done ||
                op->type == EXS_EVT_SHUTDOWN)
                continue;
            exs_list_del(&op->link);
            exs__api_kfd_op_finish_locked(k, op, -1, ECANCELED);
        }
    }
    if (!k->attached || !exs_list_empty(&k->sendq) || !exs_list_empty(&k->recvq)) {
        /* a send behind the cancelled head may now be writable */
        if (k->attached)
            exs__api_kfd_run_locked(k);
        exs__api_kfd_update_locked(k);
    }
    exs__api_kfd_unlock(k);
    exs__api_kfd_put(k);
    return 0;
}

/* At exit (exit.c): a mark queued behind the sends pending on fd. Its EXS_EVT_SHUTDOWN
 * event on q comes once they are all written to the kernel, which then delivers them as
 * it does for every socket a process leaves open; nothing is shut down. 0: queued;
 * ENOENT: no send pending; or an errno (the queue is full, no memory). */
int exs__api_kfd_flush(int fd, exs_qhandle_t q, exs_ahandle_t ah)
{
    struct kfd_op *op;
    struct kfd *k;
    int err = 0;

    op = exs__api_kfd_op_new(EXS_EVT_SHUTDOWN, 0, &q, ah, &err);
    if (!op)
        return err;
    op->how = KFD_HOW_FLUSH;
    k = exs__api_kfd_find(fd);
    if (k)
        exs__api_kfd_lock(k);
    if (!k || !k->attached || exs_list_empty(&k->sendq)) {
        if (k) {
            exs__api_kfd_unlock(k);
            exs__api_kfd_put(k);
        }
        exs__api_kfd_op_drop(op);
        return ENOENT;
    }
    exs__api_kfd_submit(k, op);
    return 0;
}
