/* SPDX-License-Identifier: MIT */
/* The Extended Sockets API (ES-API) over RDMA: the whole public surface of libexs. */
#ifndef SYS_EXS_H
#define SYS_EXS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EXS_API __attribute__((visibility("default")))

typedef int exs_version_t;
typedef int exs_qhandle_t;   /* event queue handle */
typedef int exs_mhandle_t;   /* memory registration handle */
typedef void *exs_ahandle_t; /* application cookie echoed in the event */

#define EXS_VERSION1        1
#define EXS_VERSION         EXS_VERSION1
#define EXS_QHANDLE_INVALID ((exs_qhandle_t)-1)
#define EXS_MHANDLE_INVALID ((exs_mhandle_t)-1)
#define EXS_MHANDLE_UNREGISTERED                                                                   \
    ((exs_mhandle_t)-2)     /* buffer not registered: the library copies or registers it */
#define EXS_EVTVEC_MAX 1024 /* largest |nevents| accepted by exs_qdequeue */

enum { /* exs_event_t.exs_evt_type */
       EXS_EVT_CONNECT = 1,
       EXS_EVT_ACCEPT,
       EXS_EVT_SEND,
       EXS_EVT_RECV,
       EXS_EVT_SENDMSG,
       EXS_EVT_RECVMSG,
       EXS_EVT_SENDFILE,
       EXS_EVT_POLL,
       EXS_EVT_SENDTIMEOUT,
       EXS_EVT_RECVTIMEOUT,
       EXS_EVT_SHUTDOWN,
       EXS_EVT_CLOSE
};

typedef struct {
    void *exs_evt_buf;  /* the buffer given to exs_send / exs_recv */
    size_t exs_evt_len; /* the length requested */
    ssize_t
        exs_evt_result; /* bytes transferred (0 on a stream receive = end of stream); -1 on error */
    int exs_evt_flags;  /* receive: MSG_TRUNC when a SOCK_SEQPACKET message was cut to fit */
} exs_evt_xfer_t;

typedef struct {
    int exs_evt_newfd;                    /* the accepted connection's descriptor */
    struct sockaddr_storage exs_evt_addr; /* the peer's address */
    socklen_t exs_evt_addrlen;
} exs_evt_accept_t;

/* -- issue 15: scatter/gather and file transfer types (exs_sendmsg, exs_recvmsg, exs_sendfile) --
 */
#define EXS_IOV_MAX      1024        /* most elements in one exs_sendmsg / exs_recvmsg list */
#define EXS_SENDFILE_MAX (16u << 20) /* most bytes one exs_sendfile moves (then a short count) */

/* One element of a scatter/gather list: [iov_base, iov_base + iov_len), covered by the
 * registration iov_mh or EXS_MHANDLE_UNREGISTERED. */
typedef struct {
    void *iov_base;
    size_t iov_len;
    exs_mhandle_t iov_mh;
} exs_iovec_t;

/* The list of exs_sendmsg / exs_recvmsg: msg_iovlen elements (1..EXS_IOV_MAX) at msg_iov.
 * The library copies the list when the call posts the operation. */
typedef struct {
    exs_iovec_t *msg_iov;
    size_t msg_iovlen;
} exs_msghdr_t;

/* SENDMSG, RECVMSG, SENDFILE events. The first four members sit where exs_evt_xfer_t has
 * its own. */
typedef struct {
    exs_iovec_t *exs_evt_iov; /* SENDMSG/RECVMSG: msg_iov as given (not read after posting);
                               * SENDFILE: NULL */
    size_t exs_evt_len;       /* the list's total length; SENDFILE: the count given */
    ssize_t exs_evt_result;   /* bytes transferred (0 on a stream receive = end of stream);
                               * -1 on error */
    int exs_evt_flags;        /* RECVMSG: MSG_TRUNC when a SOCK_SEQPACKET message was cut */
    int exs_evt_in_fd;        /* SENDFILE: in_fd; otherwise -1 */
    size_t exs_evt_iovlen;    /* SENDMSG/RECVMSG: msg_iovlen; SENDFILE: 0 */
    off_t exs_evt_offset;     /* SENDFILE: the offset given; otherwise 0 */
} exs_evt_xfermsg_t;

/* -- issue 15: poll and timeout types (exs_poll, SO_ASYNC_*_TIMEOUT) -- */
#include <poll.h> /* POLLIN, POLLOUT, ..., nfds_t */

/* One descriptor of exs_poll: laid out like struct pollfd (events and revents take the
 * POLL* bits of <poll.h>); fd may be an exs socket or any kernel descriptor. */
typedef struct {
    int fd;        /* negative: ignored, revents 0 */
    short events;  /* requested POLLIN / POLLOUT / POLLPRI / POLLRDHUP */
    short revents; /* written by exs_poll: the ready ones, plus POLLHUP / POLLERR / POLLNVAL */
} exs_pollfd_t;

typedef struct {
    exs_pollfd_t *exs_evt_fds; /* the array given to exs_poll, revents filled in */
    nfds_t exs_evt_nfds;       /* its length */
    int exs_evt_nready;        /* entries with revents != 0 (0: the timeout passed) */
} exs_evt_poll_t;

/* EXS_EVT_SENDTIMEOUT / EXS_EVT_RECVTIMEOUT: a notice that a send / receive is still
 * outstanding (it stays so and gets its own event later). */
typedef struct {
    void *exs_evt_buf;           /* the operation's buffer */
    size_t exs_evt_len;          /* its length as posted */
    unsigned exs_evt_count;      /* notices of this operation so far, this one included */
    unsigned exs_evt_elapsed_ms; /* time since the operation was posted */
} exs_evt_timeout_t;

typedef struct {
    int exs_evt_type;              /* EXS_EVT_* */
    int exs_evt_errno;             /* 0, or the errno of a failed / cancelled operation */
    int exs_evt_fd;                /* the descriptor the operation was posted on */
    exs_ahandle_t exs_evt_ahandle; /* the ahandle given when posting */
    union {
        exs_evt_xfer_t exs_evt_xfer;     /* SEND, RECV */
        exs_evt_accept_t exs_evt_accept; /* ACCEPT */
        /* -- issue 15: SENDMSG/RECVMSG/SENDFILE members -- */
        exs_evt_xfermsg_t exs_evt_xfermsg; /* SENDMSG, RECVMSG, SENDFILE */
        /* -- issue 15: POLL/SENDTIMEOUT/RECVTIMEOUT members -- */
        exs_evt_poll_t exs_evt_poll;       /* POLL */
        exs_evt_timeout_t exs_evt_timeout; /* SENDTIMEOUT, RECVTIMEOUT */
    } exs_evt_u;
} exs_event_t;

/* ---- socket options ---- */
#define SOL_EXS 0x4558 /* extension level ("EX") */

enum {
    EXS_SO_KEEPALIVE_MS = 1, /* int: keepalive probe interval in ms (with SO_KEEPALIVE) */
    EXS_SO_XFER_MODE,        /* int: EXS_XFER_* */
    EXS_SO_STATS,            /* struct exs_sock_stats, get only */
    EXS_SO_ERROR_REASON,     /* char[]: why the peer's connection was reset, get only */
    EXS_SO_PATH,             /* char[]: the connection's provider and why, get only */
};
/* EXS_SO_ERROR_REASON: the protocol rule the peer broke, as one NUL-terminated line
 * "RULE RECORD: detail" (RULE a stable name of spec/protocol.md §10; "" when the peer broke
 * none), cut to *optlen; *optlen becomes the bytes written with the NUL. At most this
 * many bytes with the NUL: */
#define EXS_ERROR_REASON_MAX 160
/* EXS_SO_PATH: the provider the connection runs on and why it is there, one
 * NUL-terminated line "PROVIDER: reason" ("shm: same host", "tcp: peer has no shm",
 * "tcp: other host", ...; spec/provider-shm.md, Chosen by itself), cut to *optlen; *optlen
 * becomes the bytes written with the NUL. At most this many bytes with the NUL: */
#define EXS_PATH_MAX         96
/* -- issue 15: SO_ASYNC_SEND_TIMEOUT, SO_ASYNC_RECV_TIMEOUT, SO_ASYNC_RECV_ORDERED -- */
/* Levels SOL_SOCKET and SOL_EXS alike (values outside Linux's SOL_SOCKET names). */
enum {
    SO_ASYNC_SEND_TIMEOUT = 0x4561, /* int ms (| EXS_TIMEOUT_ONCE) or struct timeval; 0: off */
    SO_ASYNC_RECV_TIMEOUT,          /* the same for receives */
    SO_ASYNC_RECV_ORDERED,          /* int: receive events in posting order (always 1) */
};
/* Or'ed into the int value of SO_ASYNC_*_TIMEOUT: one notice per operation, not one per
 * interval. The interval itself is at most EXS_TIMEOUT_MS_MAX ms. */
#define EXS_TIMEOUT_ONCE   0x40000000
#define EXS_TIMEOUT_MS_MAX 0x3fffffff

enum {                         /* EXS_SO_XFER_MODE values */
       EXS_XFER_DYNAMIC = 0,   /* the adaptive direct/indirect algorithm (default) */
       EXS_XFER_DIRECT_ONLY,   /* always wait for an ADVERT */
       EXS_XFER_INDIRECT_ONLY, /* never advertise: everything through the hidden ring */
};

struct exs_sock_stats {
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t direct_xfers;   /* WWI transfers into an advertised user buffer */
    uint64_t indirect_xfers; /* WWI transfers into the hidden ring */
    uint64_t mode_switches;  /* direct<->indirect phase changes seen by the sender */
    uint64_t adverts_sent;
    uint64_t adverts_received;
    uint64_t adverts_discarded; /* stale adverts dropped by the sender */
    uint64_t credit_stalls;     /* sends that waited for credits */
    uint64_t keepalive_probes;
    /* ---- end of version 1 (EXS_SOCK_STATS_V1_SIZE bytes); later fields are appended only ---- */
    uint64_t batches_sent; /* ring writes that carried several sends (batching) */
    uint64_t msgs_batched; /* sends that left inside such a write */
    uint64_t batch_thresh; /* the elastic batch threshold now, bytes (0: batching off) */
    /* adaptive stream algorithm (SOCK_STREAM) */
    uint64_t direct_time_us;   /* time this side's sender spent in direct phases */
    uint64_t indirect_time_us; /* time this side's sender spent in indirect phases */
    uint64_t drain_requests;   /* return-to-direct requests sent (receiver) + honoured (sender) */
    uint64_t ring_resizes;     /* receive ring size changes (autotuning) */
    uint64_t ring_size;        /* receive ring size now, bytes */
    uint64_t ring_fill;        /* bytes waiting in the receive ring now */
    /* robustness */
    uint64_t rnr_events;         /* receiver-not-ready events seen (must stay 0) */
    uint64_t fragments;          /* work requests that carried part of a larger transfer */
    uint64_t wr_queued;          /* work requests that waited behind the per-connection cap */
    uint64_t nops_sent;          /* NOPs that broke a full-window deadlock */
    uint64_t keepalive_timeouts; /* 1 once the peer was declared dead by keepalive */
    /* observability */
    uint64_t srtt_us;           /* smoothed round-trip time, us (0: not measured yet) */
    uint64_t ring_grow_refused; /* ring grows refused: the process's ring budget (autotuning) */
    uint64_t sends_copied;      /* STREAM sends copied into the send buffer (SO_SNDBUF) and
                                 * completed at once */
    uint64_t keepalive_answers; /* keepalive PINGs of the peer answered (feature ALIVE) */
};
/* exs_getsockopt(EXS_SO_STATS) fills min(*optlen, sizeof) bytes and sets *optlen to that
 * count; *optlen below the first version's size is EINVAL. */
#define EXS_SOCK_STATS_V1_SIZE (10 * sizeof(uint64_t))

/* ---- event queue wait modes (extension) ---- */
enum {
    EXS_WAIT_NOTIFY = 0, /* sleep in the kernel until an event arrives (default) */
    EXS_WAIT_POLL,       /* busy poll: lowest latency, one core spinning */
    EXS_WAIT_ADAPTIVE,   /* spin for a while, then sleep (X-RDMA hybrid polling) */
};

/* ---- UNH EXS names (issue 27): the names of the UNH EXS library's API that sources
 * written for it use, with UNH's meaning where it is known; what the library cannot do
 * fails with a clear errno (spec/api.md, "UNH EXS names"). Extensions. ---- */
#ifndef AF_IB
#define AF_IB 27 /* InfiniBand native addressing: exs_socket says EAFNOSUPPORT */
#endif
#define EXS_WAIT_BUSY_POLL EXS_WAIT_POLL /* UNH's name of the busy-polling wait */
#define EXS_POLLIN         POLLIN        /* exs_poll events */
#define EXS_POLLOUT        POLLOUT
#define EXS_SHUT_WR        SHUT_WR /* exs_shutdown: end the sending side */
/* exs_mregister flags: the registration may be used by every socket and queue of the
 * process at once (every registration is; accepted for UNH's sources) */
#define EXS_MRF_SHARED     0x1
/* exs_cancel flags: the operations posted on fd with ahandle ah (the same as 0), or every
 * operation of fd whatever its ahandle */
#define EXS_CAF_AHANDLE    0x1
#define EXS_CAF_FILDES     0x2

/* Queue attributes: exs_qgetattr / exs_qsetattr */
enum {
    EXS_QATTR_DEPTH = 1, /* int: the depth given to exs_qcreate (set: EOPNOTSUPP) */
    EXS_QATTR_SIGNAL,    /* exs_signal_t: a signal when events arrive (enable: EOPNOTSUPP) */
    EXS_QATTR_EVENTS,    /* int: events queued now (get only: set is EINVAL) */
    EXS_QATTR_WAIT,      /* int: how exs_qdequeue waits, EXS_WAIT_* (as exs_qsetwait) */
    EXS_QATTR_WAIT_SPIN, /* int: EXS_WAIT_ADAPTIVE's spin, microseconds (exs_qsetwait's spin_us) */
};
enum { /* exs_signal_t.exs_sig_state */
       EXS_SIG_DISABLE = 0,
       EXS_SIG_ENABLE,
};
typedef struct {
    int exs_sig_state; /* EXS_SIG_ENABLE or EXS_SIG_DISABLE */
    int exs_sig_signo; /* the signal raised when an event is queued (enable only) */
} exs_signal_t;

/* The peer of an accepted connection: what EXS_EVT_ACCEPT's exs_evt_addr and
 * exs_evt_addrlen hold, as one object (exs_getpeername fills the same). */
typedef struct {
    struct sockaddr_storage exs_addr;
    socklen_t exs_addrlen;
} exs_acceptaddr_t;

/* A file transfer made of pieces taken in order, each memory (EXS_IOVEC) or a range of a
 * file (EXS_FDVEC), and its completion event. No call of this library takes one
 * (exs_sendfile moves one range, exs_sendmsg memory pieces); the types let UNH's sources
 * compile. */
enum { /* exs_xferfile_t.xf_type */
       EXS_IOVEC = 1,
       EXS_FDVEC,
};
typedef struct {
    int fdv_fd;       /* a regular file */
    off_t fdv_offset; /* where its range starts */
    size_t fdv_len;   /* its length */
} exs_fdvec_t;
typedef struct {
    int xf_type; /* EXS_IOVEC or EXS_FDVEC */
    union {
        exs_iovec_t xf_iov;
        exs_fdvec_t xf_fdv;
    } xf_u;
} exs_xferfile_t;
typedef struct {
    exs_xferfile_t *exs_evt_vec; /* the pieces as given */
    size_t exs_evt_veclen;       /* their count */
    ssize_t exs_evt_result;      /* bytes transferred; -1 on error */
} exs_evt_xferfile_t;

/* ---- functions ---- */
EXS_API exs_version_t exs_init(exs_version_t version);
EXS_API void exs_fini(void); /* extension */

EXS_API exs_qhandle_t exs_qcreate(int depth);
EXS_API int exs_qdelete(exs_qhandle_t q);
EXS_API int exs_qdequeue(exs_qhandle_t q, exs_event_t *events, int nevents,
                         const struct timespec *timeout);
EXS_API int exs_qfd(exs_qhandle_t q); /* extension */
/* Extension: how exs_qdequeue waits on q; spin_us bounds the spin of EXS_WAIT_ADAPTIVE
 * (0 = the default, tunable EXS_QSPIN_US). */
EXS_API int exs_qsetwait(exs_qhandle_t q, int mode, int spin_us);
/* Extension (UNH EXS): an attribute EXS_QATTR_* of q, like exs_getsockopt / exs_setsockopt. */
EXS_API int exs_qgetattr(exs_qhandle_t q, int attr, void *val, socklen_t *len);
EXS_API int exs_qsetattr(exs_qhandle_t q, int attr, const void *val, socklen_t len);

EXS_API exs_mhandle_t exs_mregister(void *addr, size_t len, int flags);
EXS_API int exs_mderegister(exs_mhandle_t mh);

EXS_API int exs_socket(int domain, int type, int protocol);
EXS_API int exs_bind(int fd, const struct sockaddr *addr, socklen_t addrlen);
EXS_API int exs_listen(int fd, int backlog);
EXS_API int exs_accept(int fd, exs_qhandle_t q, exs_ahandle_t ah);
EXS_API int exs_connect(int fd, const struct sockaddr *addr, socklen_t addrlen, exs_qhandle_t q,
                        exs_ahandle_t ah);
EXS_API int exs_send(int fd, const void *buf, size_t len, int flags, exs_qhandle_t q,
                     exs_ahandle_t ah, exs_mhandle_t mh);
EXS_API int exs_recv(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
                     exs_mhandle_t mh);
EXS_API int exs_shutdown(int fd, int how, exs_qhandle_t q, exs_ahandle_t ah);
EXS_API int exs_close(int fd, exs_qhandle_t q, exs_ahandle_t ah);
EXS_API int exs_cancel(int fd, exs_ahandle_t ah, int flags);
/* Extensions: the local / peer address of an exs socket (like getsockname/getpeername). */
EXS_API int exs_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen);
EXS_API int exs_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen);
EXS_API int exs_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen);
EXS_API int exs_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen);
/* -- issue 15: exs_sendmsg, exs_recvmsg, exs_sendfile -- */
EXS_API int exs_sendmsg(int fd, const exs_msghdr_t *msg, int flags, exs_qhandle_t q,
                        exs_ahandle_t ah);
EXS_API int exs_recvmsg(int fd, const exs_msghdr_t *msg, int flags, exs_qhandle_t q,
                        exs_ahandle_t ah);
EXS_API ssize_t exs_sendfile(int fd, int in_fd, off_t offset, size_t count, exs_qhandle_t q,
                             exs_ahandle_t ah);
/* -- issue 15: exs_poll -- */
/* Readiness of nfds descriptors (exs sockets and kernel descriptors, mixed). q ==
 * EXS_QHANDLE_INVALID: wait up to timeout_ms (-1: no limit) and return the number of
 * ready entries, 0 on timeout, -1 with errno (EINTR: a signal). Otherwise: return 0 at
 * once and post one EXS_EVT_POLL event with ahandle ah to q when an entry is ready or
 * the timeout passed; fds is written then and must stay untouched until the event. */
EXS_API int exs_poll(exs_pollfd_t *fds, nfds_t nfds, int timeout_ms, exs_qhandle_t q,
                     exs_ahandle_t ah);

#ifdef __cplusplus
}
#endif

#endif
