/* SPDX-License-Identifier: MIT */
/* Private to the kernel-socket files (kfd.c, kfd_close.c, kfd_opt.c, kfd_file.c): the
 * per-descriptor state and what one file needs of another. kfd.c's opening comment describes them.
 */
#ifndef EXS_API_KFD_INT_H
#define EXS_API_KFD_INT_H

#include <pthread.h>

#include "exs/util/lite_lock.h"
#include <sys/types.h>

#include "exs/api/api_int.h"
#include "exs/util/list.h"

struct kfd_op {
    struct exs_list link; /* in k->sendq or k->recvq */
    int type;             /* EXS_EVT_SEND, RECV, SHUTDOWN or CLOSE */
    int flags;            /* recv: MSG_WAITALL */
    int how;              /* shutdown; KFD_HOW_FLUSH: no shutdown, only the mark */
    char *buf;
    size_t len;
    size_t done; /* bytes moved so far */
    size_t pre;  /* exs_sendfile: bytes sendfile(2) moved before buf (added to the result) */
    exs_ahandle_t ah;
    struct exs_evq *evq;       /* slot reserved */
    struct api_mreg *mreg;     /* held busy, or NULL (EXS_MHANDLE_UNREGISTERED) */
    struct api_bounce *bounce; /* exs_sendmsg / exs_recvmsg / exs_sendfile: buf is its */
    /* SO_ASYNC_*_TIMEOUT notices (k->lock): in k->to_ops while to.on */
    struct api_to to;
};

struct kfd {
    struct exs_lite_lock lock; /* first: what follows is cleared when a parked kfd is reused */
    int fd;                    /* lock (a reader may find a parked or reused kfd: kfd.c) */
    int refs;                  /* atomic */
    int attached;              /* lock (and kfd_tab_lock to change): in the table */
    struct kfd *free_next;     /* kfd_free_lock: parked (kfd.c) */
    struct exs_list sendq;     /* sends and shutdowns, posting order */
    struct exs_list recvq;     /* receives, posting order */
    int n_send, n_recv;
    int err;      /* lock: the connection failed (not EPIPE): every pending
                   * operation reports it */
    int io_want;  /* lock: EV_READ / EV_WRITE the queues wait for */
    int io_reg;   /* lock: what is registered in kfd_ep (EV_READ / EV_WRITE) */
    uint32_t gen; /* names this kfd in its epoll events */
    /* SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT (lock): dropped when the number
     * names another socket */
    int snd_timeo, rcv_timeo;
    /* What the library knows of the descriptor (lock; spec/api.md, "Kernel sockets"):
     * known: fd was a kernel SOCK_STREAM socket, the file dev/ino (fstat); a send on it
     * with no option set is not checked again (kfd.c). */
    int known;
    dev_t dev;
    ino_t ino;
    int counted; /* lock: counted in kfd_live (operations, an option or a sendfile) */
    /* lock: the operation its posting call runs now; when it ends because the number
     * names no stream socket any more it ends without an event, and the call returns
     * posting_err (EBADF, ENOTSOCK) as it would have without the cache */
    struct kfd_op *posting;
    int posting_err;
    struct exs_list to_ops; /* lock: operations registered for notices */
    int to_job_busy;        /* lock: to_job queued */
    struct exs_job to_job;  /* re-arms to_timer (holds a reference while queued) */
    struct exs_eng_timer to_timer;
    int to_timer_on; /* progress thread: armed (holds a reference) */
    /* lock: a posting thread runs exs_sendfile's sendfile(2) without the lock: sends
     * queued meanwhile wait (not written), an exs_close waits in close_op */
    int file_busy;
    struct kfd_op *close_op;
};

/* A SHUTDOWN op with this how shuts nothing down: its event says that every send queued
 * before it is written to the kernel (the exit's flush, exs__api_kfd_flush). */
#define KFD_HOW_FLUSH (-1)

/* kfd.c */
int exs__api_kfd_check(int fd);
int exs__api_kfd_verify_locked(struct kfd *k);
void exs__api_kfd_count_locked(struct kfd *k);
void exs__api_kfd_detach_locked(struct kfd *k);
struct kfd *exs__api_kfd_find(int fd);
void exs__api_kfd_close_locked(struct kfd *k, struct kfd_op *op);
struct kfd *exs__api_kfd_get_for_op(int fd, struct kfd_op *op, int *err_p);
struct kfd *exs__api_kfd_get_locked(int fd, int *err_p);
struct kfd *exs__api_kfd_get_locked2(int fd, int create, int *err_p);
void exs__api_kfd_idle_locked(struct kfd *k);
int exs__api_kfd_is_stream(int fd);
void exs__api_kfd_op_drop(struct kfd_op *op);
void exs__api_kfd_op_finish_locked(struct kfd *k, struct kfd_op *op, ssize_t result, int err);
struct kfd_op *exs__api_kfd_op_new(int type, int sync, exs_qhandle_t *q, exs_ahandle_t ah,
                                   int *err_p);
void exs__api_kfd_put(struct kfd *k);
void exs__api_kfd_ref(struct kfd *k);
void exs__api_kfd_run_locked(struct kfd *k);
void exs__api_kfd_submit(struct kfd *k, struct kfd_op *op);
void exs__api_kfd_update_locked(struct kfd *k);

/* k->lock (a futex mutex, inline: the send's hot path takes it). */
static inline void exs__api_kfd_lock(struct kfd *k)
{
    EXS_LITE_LOCK(&k->lock, EXS_LOCK_SOCK);
}

static inline void exs__api_kfd_unlock(struct kfd *k)
{
    EXS_LITE_UNLOCK(&k->lock, EXS_LOCK_SOCK);
}

/* kfd_opt.c: SO_ASYNC_*_TIMEOUT notices */
/* 1 while k keeps an option (k->lock held). */
static inline int exs__api_kfd_has_opts(const struct kfd *k)
{
    return k->snd_timeo || k->rcv_timeo;
}
void exs__api_kfd_to_end_locked(struct kfd *k, struct kfd_op *op);
int exs__api_kfd_to_start_locked(struct kfd *k, struct kfd_op *op);

#endif
