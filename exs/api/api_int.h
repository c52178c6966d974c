/* SPDX-License-Identifier: MIT */
/* Private declarations of the api layer: sockets, descriptor table, operations, memory. */
#ifndef EXS_API_API_INT_H
#define EXS_API_API_INT_H

#include <pthread.h>
#include <sys/exs.h>

#include "exs/api/api.h"
#include "exs/api/evq.h"
#include "exs/engine/engine.h"
#include "exs/proto/proto.h"
#include "exs/util/list.h"
#include "exs/util/lockorder.h"

/* Socket states (spec/states.md, "Socket"): change them only with api_sock_set_state(),
 * which checks each transition against the table in sock.c and traces it. Each posting
 * call's result in a state is in spec/api.md. */
enum api_sock_state {
    API_SOCK_NEW = 0,    /* exs_socket */
    API_SOCK_BOUND,      /* exs_bind */
    API_SOCK_LISTENING,  /* exs_listen */
    API_SOCK_CONNECTING, /* exs_connect accepted, or an accepted child not yet established */
    API_SOCK_CONNECTED,  /* connect event delivered / accepted */
    API_SOCK_CLOSING,    /* exs_close: gone from the descriptor table; close job queued or
                          * its conn closing (graceful: SHUTDOWN, then disconnect) */
    API_SOCK_ABORTING,   /* exs_fini (or a child whose listener closed): as CLOSING, but
                          * the conn is reset without SHUTDOWN */
    API_SOCK_FINISHING,  /* conn dead (or none): the finish job is queued; freed by the
                          * last reference */
    API_SOCK_STATE_COUNT
};

/* The socket table as a reader without its lock sees it (sock.c): slots written with
 * atomic stores; a grown table keeps its old array until exs_fini. */
struct sock_tabv {
    struct sock_tabv *old; /* the array this one replaced */
    int len;
    struct api_sock *e[];
};
extern struct sock_tabv *exs__api_sock_tabv __attribute__((visibility("hidden")));

/* 1 when fd names a libexs socket now (its slot in the socket table is taken): no lock,
 * no system call. A kernel socket's send looks at it first (kfd.c), since exs_socket and
 * an accept fill the slot before the number is returned. */
static inline int exs__api_sock_at(int fd)
{
    struct sock_tabv *t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);

    return t && (unsigned)fd < (unsigned)t->len && __atomic_load_n(&t->e[fd], __ATOMIC_RELAXED);
}

struct api_mreg;

/* exs_sendmsg / exs_recvmsg / exs_sendfile (msg.c): the transfer is an ordinary send or
 * receive of one library buffer (gathered into before a send, scattered from after a
 * receive); its event is filled by exs__api_bounce_event. Owned by its operation. */
struct api_bounce {
    int evt_type; /* EXS_EVT_SENDMSG, RECVMSG or SENDFILE */
    uint8_t *buf; /* malloc'd, len bytes (NULL when len is 0) */
    size_t len;
    struct exs_prov_mr *mr; /* exs socket: buf registered for the operation */
    exs_iovec_t *iov;       /* the list copied at post time (RECVMSG: scattered into) */
    size_t iovcnt;
    struct api_mreg **mregs; /* iovcnt entries: each element's registration held busy, or NULL */
    exs_iovec_t *uiov;       /* echoed in the event */
    size_t len_req;          /* echoed: total length / sendfile count */
    int in_fd;               /* echoed: SENDFILE */
    off_t offset;            /* echoed: SENDFILE */
};
/* Fill ev's type and union for an operation of b that ended with result (-1: error) and
 * rflags; a RECVMSG result is scattered into the list first. */
void exs__api_bounce_event(struct api_bounce *b, ssize_t result, int rflags, exs_event_t *ev);
/* Release what b holds (registrations, buffer) and free it. */
void exs__api_bounce_free(struct api_bounce *b);
/* exs_send / exs_recv of b's buffer on fd (exs or kernel socket): takes b in any case. */
int exs__api_xfer_bounce(int fd, int flags, exs_qhandle_t q, exs_ahandle_t ah, int recv,
                         struct api_bounce *b);

/* The SO_ASYNC_*_TIMEOUT notices of one operation, the same for an exs socket's (struct
 * api_op, poll.c) and a kernel socket's (struct kfd_op, kfd.c); under the owner's lock
 * once the operation is registered. */
struct api_to {
    struct exs_list link; /* in the owner's to_ops while on */
    int on;               /* registered, notices still due */
    int slot;             /* an extra slot of evq is reserved for the next notice */
    int once;             /* EXS_TIMEOUT_ONCE */
    unsigned count;       /* notices posted */
    uint32_t ms;          /* interval */
    uint64_t post_ns;     /* posted at */
    uint64_t due_ns;      /* next notice due at */
};

/* An operation in flight: the protocol op plus what its event needs. */
struct api_op {
    struct exs_op op; /* first: the proto layer sees only this */
    int evt_type;     /* EXS_EVT_* */
    int fd;
    exs_ahandle_t ah;
    struct exs_evq *evq; /* slot reserved */
    struct api_sock *sock;
    struct api_mreg *mreg;      /* registration referenced, or NULL */
    struct exs_prov_mr *tmp_mr; /* EXS_MHANDLE_UNREGISTERED: registered for this op */
    struct api_bounce *bounce;  /* exs_sendmsg / exs_recvmsg / exs_sendfile, or NULL */
    struct exs_list link;       /* listener: in sock->accepts */
    /* SO_ASYNC_*_TIMEOUT (poll.c), set at posting when the socket had one; the rest
     * under the socket's lock */
    int to_armed;     /* it may get notices: op_done looks at to */
    struct api_to to; /* in sock->to_ops while to.on */
};

struct api_sock {
    int fd;                     /* the eventfd that is its descriptor */
    int fd_open;                /* fd not yet closed (exs_close closes it) */
    int refs;                   /* atomic: table, conn owner, children, callers in flight; 0: parked
                                 * (sock.c: a lookup without a lock may read it then) */
    uint64_t hz;                /* atomic: its lifetime's generation (EXS_API_HZ_GEN1 each
                                 * reuse; it survives parking) | EXS_API_HZ_DEFER (its last
                                 * reference went) | EXS_API_HZ_CLAIMED (a finisher took it):
                                 * api_int.h "Hazards" */
    struct api_sock *park_next; /* parked: the next one */
    int domain;
    int type;
    enum api_sock_state state;
    pthread_mutex_t lock; /* state, lists below; api_sock_lock (lock order:
                           * conn, listener, child socket) */
    int listener;         /* atomic: exs_listen made it one (its lock level) */
#ifdef EXS_LOCK_DEBUG
    int held_level; /* under lock: the level it was taken at */
#endif
    struct sockaddr_storage local, peer;
    socklen_t local_len, peer_len;
    /* options */
    uint32_t rcvbuf;
    int rcvbuf_set;  /* SO_RCVBUF given: no ring autotuning */
    uint32_t sndbuf; /* SO_SNDBUF: STREAM send buffer (protocol §7.5), 0 = off */
    int xfer_mode;
    int keepalive, keepalive_ms;
    /* connection */
    struct exs_conn *conn;
    struct api_op *connect_op; /* pending exs_connect */
    struct api_op *close_op;   /* pending exs_close event (may have evq NULL: sync) */
    /* outstanding operations (EXS_SOCK_MAX_OPS): the posted ones counted by the posts
     * (atomic adds: posts run in parallel), the ended ones by op_done alone, always under
     * the conn's lock (a plain add in an atomic store: no locked instruction);
     * exs__api_sock_outstanding */
    unsigned n_send, n_recv;
    unsigned n_send_done, n_recv_done;
    /* atomic, a hint: the registration exs_send's copy at the post last looked up
     * (xfer.c, mreg_covers); records are parked, never freed, before exs_fini */
    struct api_mreg *copy_mreg;
    /* atomic, a hint: the queue exs_send's copy at the post last reserved a slot in
     * (exs__evq_reserve_hint: st tells whether it is still the handle's) */
    struct exs_evq *copy_evq;
    /* listener */
    struct exs_eng_listener lis;
    int backlog;             /* bounds established children not yet accepted */
    int n_embryo;            /* children being established */
    struct exs_list ready;   /* established children waiting for exs_accept */
    struct exs_list accepts; /* pending exs_accept ops */
    int n_ready, n_accepts;  /* lengths of ready and accepts */
    /* requests waiting for room (sock.c, "the listener's queues"): a FIFO of struct
     * sock_deferred under lock; the job that starts those there is room for; the oldest
     * one's deadline (progress thread); the provider listeners told to stop taking
     * requests (progress thread) */
    struct exs_list deferred;
    int n_deferred;
    struct exs_job defer_job;
    int defer_job_busy; /* defer_job queued (lock) */
    struct exs_eng_timer defer_timer;
    int defer_timer_on;
    int defer_paused;
    struct api_sock *parent;          /* child: its listener until accepted */
    struct exs_list child_link;       /* in parent->ready */
    struct exs_job close_job;         /* sock_close: the listener or conn part */
    struct exs_job finish_job;        /* entering FINISHING: sock_finish_close_job */
    struct exs_eng_timer close_timer; /* a close that hangs (frozen peer) is aborted */
    /* the conn's periodic check (exs__conn_timer: handshake deadline, keepalive, send
     * stall), on the progress thread; ka_job starts it after exs_connect */
    struct exs_eng_timer conn_timer;
    struct exs_job ka_job;
    int ka_job_busy; /* ka_job queued (lock) */
    /* SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT (poll.c; under lock): interval ms (0:
     * off) | EXS_TIMEOUT_ONCE; the operations that may still get notices; their timer
     * (holds a socket reference while on) and the job that (re)arms it */
    int snd_timeo, rcv_timeo;
    struct exs_list to_ops;
    struct exs_eng_timer to_timer;
    int to_timer_on; /* progress thread */
    struct exs_job to_job;
    int to_job_busy; /* to_job queued (lock) */
    int to_posting;  /* armed ops being handed to the conn (lock):
                      * no notice meanwhile (the post may fail) */
    /* SO_LINGER (exit.c; under lock): set, and its l_onoff and l_linger (seconds) */
    int linger_set, linger_on, linger_s;
};

/* s's outstanding receives (recv) or sends: posted less ended, the ended count read first
 * (it never passes the posted one; a moment's overlap reads as 0). */
static inline int exs__api_sock_outstanding(const struct api_sock *s, int recv)
{
    unsigned done = __atomic_load_n(recv ? &s->n_recv_done : &s->n_send_done, __ATOMIC_ACQUIRE);
    unsigned posted = __atomic_load_n(recv ? &s->n_recv : &s->n_send, __ATOMIC_RELAXED);
    int n = (int)(posted - done);

    return n > 0 ? n : 0;
}

/* A socket's lock, at its level in the lock order: a listener's comes before its
 * children's (spec/threading.md). */
static inline void api_sock_lock(struct api_sock *s)
{
    int lvl = __atomic_load_n(&s->listener, __ATOMIC_RELAXED) ? EXS_LOCK_LISTENER : EXS_LOCK_SOCK;

    EXS_LOCK_ACQUIRE(lvl);
    pthread_mutex_lock(&s->lock);
#ifdef EXS_LOCK_DEBUG
    s->held_level = lvl;
#else
    (void)lvl;
#endif
}

static inline void api_sock_unlock(struct api_sock *s)
{
#ifdef EXS_LOCK_DEBUG
    int lvl = s->held_level;

    pthread_mutex_unlock(&s->lock);
    EXS_LOCK_RELEASE(lvl);
#else
    pthread_mutex_unlock(&s->lock);
#endif
}

/* descriptor table (sock.c) */
/* The socket behind fd with a reference (EBADF, ENOTSOCK otherwise); drop it with put. */
struct api_sock *exs__api_sock_get(int fd, int *err_p);
/* The same without telling EBADF from ENOTSOCK: NULL when fd is no libexs socket. */
struct api_sock *exs__api_sock_find(int fd);
/* exs__api_sock_find's second step: s, read from fd's slot at some moment without a
 * lock, with a reference when it is still the socket at fd; NULL (nothing held) when it
 * left fd since (its count 0: parked; or another slot's now). */
struct api_sock *exs__api_sock_hold(int fd, struct api_sock *s);
void exs__api_sock_put(struct api_sock *s);

/* exs__api_sock_hold, inline (exs__api_sock_find_x). */
static inline __attribute__((always_inline)) struct api_sock *
exs__api_sock_hold_x(int fd, struct api_sock *s)
{
    /* acquire, also when it reads 0: the slot emptied before the last put is seen then */
    int refs = __atomic_load_n(&s->refs, __ATOMIC_ACQUIRE);

    while (refs && !__atomic_compare_exchange_n(&s->refs, &refs, refs + 1, 1, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
        ;
    if (!refs)
        return NULL; /* its last reference went: it left the table (parked) */
    /* after the count (acquire: a removal's slot store came before its put) */
    struct sock_tabv *t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);

    if (t && (unsigned)fd < (unsigned)t->len && __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE) == s)
        return s;
    exs__api_sock_put(s); /* it left fd meanwhile (or a parked one was reused) */
    return NULL;
}

/*
 * Hazards (sock.c, spec/threading.md "The socket table"): exs_send and exs_recv use the
 * socket at fd without a reference (two locked instructions less per call). A thread
 * names the socket in its own record (hz->s) before it checks that the table still has it
 * at fd with a count above 0; the last put of a socket marks it (EXS_API_HZ_DEFER) and looks at
 * every record after a full fence; whichever of the two comes second sees the other's
 * store. The fence of the side on every send is a compiler barrier: the last put's side
 * makes every running thread of the process pass a full barrier (membarrier(2), private
 * expedited; without it no record is made and sends take references). A socket
 * whose last put found a record naming it is finished (its conn destroyed, parked) by the
 * last thread to let go of it (exs__api_hz_clear), or by the put when none names it any
 * more; a claim (a compare-and-swap from the marked word, generation included) makes it
 * one, and never one of a later lifetime of the structure. A record names a socket only across one
 * post (send_copy or xfer_post, xfer.c, up to the hand-over to the conn: the conn's lock, the
 * queue's, the provider's post; never a synchronous call's wait); nobody waits for a record.
 */
#define EXS_API_HZ_DEFER   1u /* api_sock.hz: the lifetime's last put came */
#define EXS_API_HZ_CLAIMED 2u /* api_sock.hz: one finisher took the lifetime */
#define EXS_API_HZ_GEN1    4u /* api_sock.hz: one lifetime (the bits above: its generation) */

struct api_hz {
    struct api_sock *s;  /* atomic: the socket this thread uses without a reference */
    int used;            /* atomic: a live thread owns the record */
    struct api_hz *next; /* exs__api_hz_list: push only, records never freed */
};
extern __thread struct api_hz *exs__api_hz_self __attribute__((visibility("hidden")));
/* This thread's record (made at its first use; thread exit frees it for reuse), or NULL
 * (no membarrier, no memory). */
struct api_hz *exs__api_hz_new(void);
/* s's last put, or a thread letting go of s that saw EXS_API_HZ_DEFER in s->hz (its value
 * w): finish that lifetime of s unless a record still names s or another finisher took
 * it (a claim from w exactly: a later lifetime of the structure never matches). */
void exs__api_sock_hz_finish(struct api_sock *s, uint64_t w);

/* the fence between a record's store and the loads that follow it: a compiler barrier
 * (records exist only where membarrier does: the last put's side makes every running
 * thread pass a full barrier) */
static inline __attribute__((always_inline)) void exs__api_hz_fence(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* hz lets go of s (named by exs__api_sock_hz); finishes s when its last put came meanwhile */
static inline __attribute__((always_inline)) void exs__api_hz_clear(struct api_hz *hz,
                                                                    struct api_sock *s)
{
    uint64_t w;

    __atomic_store_n(&hz->s, NULL, __ATOMIC_RELEASE);
    exs__api_hz_fence();
    w = __atomic_load_n(&s->hz, __ATOMIC_ACQUIRE);
    if (__builtin_expect(w & EXS_API_HZ_DEFER, 0))
        exs__api_sock_hz_finish(s, w);
}

/* The socket at fd, named by hz (no reference: exs__api_hz_clear lets go), or NULL. */
static inline __attribute__((always_inline)) struct api_sock *exs__api_sock_hz(int fd,
                                                                               struct api_hz *hz)
{
    struct sock_tabv *t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);
    struct api_sock *s;

    if (!t || (unsigned)fd >= (unsigned)t->len)
        return NULL;
    s = __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE);
    if (!s)
        return NULL;
    __atomic_store_n(&hz->s, s, __ATOMIC_RELAXED);
    exs__api_hz_fence();
    /* after the fence: the current array (a grown table's old one may still name s) and
     * the count (the slot is emptied before the table's put) */
    t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);
    if (t && __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE) == s &&
        __atomic_load_n(&s->refs, __ATOMIC_SEQ_CST))
        return s;
    exs__api_hz_clear(hz, s);
    return NULL;
}

/* exs__api_sock_find, inline: in every posting call (xfer_post) a call less. */
static inline __attribute__((always_inline)) struct api_sock *exs__api_sock_find_x(int fd)
{
    for (;;) {
        struct sock_tabv *t = __atomic_load_n(&exs__api_sock_tabv, __ATOMIC_ACQUIRE);
        struct api_sock *s;

        if (fd < 0 || !t || fd >= t->len)
            return NULL;
        s = __atomic_load_n(&t->e[fd], __ATOMIC_ACQUIRE);
        if (!s)
            return NULL;
        s = exs__api_sock_hold_x(fd, s);
        if (s)
            return s;
        /* it left fd after the slot was read: look again */
    }
}
/* Every socket in the table, each held by a reference, in an array to free (sock.c). */
int exs__api_sock_list(struct api_sock ***all_p, int *n_p);
const char *exs__api_sock_state_name(enum api_sock_state st);
int exs__api_default_xfer_mode(void);

/* operations (xfer.c) */
struct api_op *exs__api_op_new(struct api_sock *s, int evt_type, exs_qhandle_t q, exs_ahandle_t ah,
                               int *err_p);
void exs__api_op_event(struct api_op *op, const exs_event_t *ev);
void exs__api_op_abandon(struct api_op *op);
/* A cut-over (spec/protocol.md §9.2, conn->lock held): pop's buffer registered on ctx,
 * pop->mr and pop->lkey replaced, the registration on the old context released. 0 or
 * -errno. */
int exs__api_op_resume_mr(struct exs_op *pop, struct exs_prov_ctx *ctx);
/* Synchronous calls post on their thread's queue (xfer.c) and wait for the one event. */
exs_qhandle_t exs__api_sync_queue(void);
int exs__api_wait_sync(exs_qhandle_t q, exs_event_t *ev);
int exs__api_sync_fail(int sync, exs_qhandle_t q, int err);
int exs__api_call_end(int sync, exs_qhandle_t q, exs_event_t *ev);

/* exs_poll (poll.c), progress thread: look at the registered requests again (readiness
 * may have changed outside a round of progress, e.g. the keepalive check ended a conn). */
void exs__api_poll_kick(void);
/* exs_fini: end every registered request with ECANCELED (before the sockets close: the
 * requests hold references on them). */
void exs__api_poll_close_all(void);
/* In a forked child (fork.c): forget the parent's requests. */
void exs__api_poll_fork_child(void);
/* exs_cancel(-1, ah, flags): end the pending asynchronous exs_poll requests posted with ah
 * with ECANCELED. 0, or -1 with errno (EINVAL: flags, or before exs_init). */
int exs__api_poll_cancel(exs_ahandle_t ah, int flags);
/* Timeout notices (poll.c). At posting, before the op is handed to the conn: when the
 * socket has a timeout for this direction (asynchronous posts only), reserve the extra
 * slot of the first notice and register the op (0, or EAGAIN: the queue cannot take the
 * notice too). After a failed hand-over: unregister. In op_done, before its event:
 * unregister (the notices end before the completion) and free an unused slot. */
int exs__api_to_op_start(struct api_sock *s, struct api_op *op, int recv);
void exs__api_to_op_posted(struct api_sock *s); /* the hand-over of a started op ended */
void exs__api_to_op_end(struct api_op *op);
/* Progress thread: run a notice timer t for the earliest notice due at next (ns;
 * UINT64_MAX: none) or stop it; *on says whether it runs. +1: it started (its owner takes
 * a reference for it), -1: it stopped (the owner drops that reference), 0: neither. */
int exs__api_to_timer_set(struct exs_eng_timer *t, int *on, uint64_t next,
                          void (*cb)(struct exs_eng_timer *t));
/* An operation's notices begin (the caller reserved the first one's slot, and registers it
 * in its owner's to_ops): v is the SO_ASYNC_*_TIMEOUT value of its direction. */
void exs__api_to_begin(struct api_to *to, int v);
/* to leaves its owner's list head (when it is on it): 1 when the list is then empty (the
 * owner's timer is to stop). Owner's lock held. */
int exs__api_to_unlist(struct api_to *to, const struct exs_list *head);
/* The earliest due time of the notices registered in the list head (struct api_to by
 * link), or UINT64_MAX when there is none. Owner's lock held. */
uint64_t exs__api_to_earliest(const struct exs_list *head);
/* The notice timer fired at now: 1 when to's notice is due and has its slot, with ev's
 * timeout count and elapsed time filled (the caller fills the rest and posts it); its
 * next one is due an interval later, or (once) to leaves the list. 0: not due yet, or the
 * queue is full (deferred by an interval). Owner's lock held. */
int exs__api_to_due(struct api_to *to, struct exs_evq *evq, uint64_t now, exs_event_t *ev);

/* exs_cancel's flags (xfer.c, kfd.c): 0 or one of EXS_CAF_AHANDLE, EXS_CAF_FILDES. */
static inline int exs__api_cancel_flags_bad(int flags)
{
    return flags != 0 && flags != EXS_CAF_AHANDLE && flags != EXS_CAF_FILDES;
}

/* life cycle (sock.c, init.c) */
/* exs_init: the fork handlers (fork.c) and the exit handler (exit.c), registered once. */
void exs__api_fork_setup(void);
void exs__api_exit_setup(void);
/* SO_LINGER (exit.c; s->lock held): a struct linger. 0 or an errno (EINVAL). */
int exs__api_linger_set(struct api_sock *s, const void *optval, socklen_t optlen);
int exs__api_linger_get(struct api_sock *s, void *optval, socklen_t *optlen);
/* fork(2) (fork.c; phase: enum exs_fork_phase): the descriptor table's lock held across
 * it; in the child its sockets become inherited descriptors (exs__api_fork_stale). */
void exs__api_sock_fork(int phase);
/* Inherited descriptors of a forked child (fork.c): mark fd (child, one thread); 1 when
 * fd is one (still the same eventfd; no system call unless fd was marked); the child's
 * copy of fd closed and forgotten. */
void exs__api_fork_stale_mark(int fd);
int exs__api_fork_stale(int fd);
void exs__api_fork_stale_close(int fd);
/* init.c: init_lock held across fork(2) (PREPARE returns 1 when the library is
 * initialized); in the child the library is no longer initialized. */
int exs__api_init_fork(int phase);
/* In a forked child (fork.c): forget the parent's registrations and operations. */
void exs__api_xfer_fork_child(void);
void exs__api_sock_close_all(void);
/* The libexs sockets not yet freed (atomic; sock.c): read inline, exs_qdequeue's first
 * look asks it each time. */
extern int exs__api_sock_nlive __attribute__((visibility("hidden")));
static inline int exs__api_sock_live(void)
{
    return __atomic_load_n(&exs__api_sock_nlive, __ATOMIC_RELAXED);
}
int exs__api_mreg_live(void);
struct api_mreg;
/* The handle m is registered under now, 0 once deregistered (tests: a hold keeps it). */
int exs__api_mreg_handle(const struct api_mreg *m);
void exs__api_mreg_destroy_all(void);
int exs__api_initialized(void);
/* exs_fini at process exit (exit.c): other threads of the application may still be inside
 * a call, reading the tables, queues, kernel-socket states and registrations that their
 * fast paths read without a lock; their memory is then kept (emptied, reachable) instead
 * of freed, and the process's end returns it. */
extern int exs__fini_keep_memory;

#endif
