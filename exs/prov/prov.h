/* SPDX-License-Identifier: MIT */
/* The provider interface: one ops table that mirrors reliable-connected verbs. */
#ifndef EXS_PROV_PROV_H
#define EXS_PROV_PROV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/*
 * Model (spec/provider.md is the normative text):
 *
 *   ctx       one per process and device: a protection domain, one completion
 *             queue shared by every endpoint of the context, one connection
 *             event queue, and ONE event descriptor that becomes readable when
 *             either queue gains an entry after ctx_arm().
 *   mr        a registered memory region of a ctx: lkey for local use in
 *             scatter/gather entries, rkey for the peer, access rights.
 *   ep        an endpoint: an RC queue pair (send queue + receive queue) whose
 *             completions go to the ctx's completion queue.
 *   listener  a passive endpoint bound to an address; connection requests
 *             arrive as EXS_PROV_CM_CONNECT_REQUEST events carrying a request
 *             handle that is accepted onto a fresh ep or rejected.
 *
 * Errors: every int-returning op returns 0 or a negative errno.
 * Thread safety: every op may be called from any thread; post_send and
 * post_recv on one ep may race with each other and with ctx_poll.
 * Output parameters end in _p and are set only on success.
 */

struct exs_prov_ops;

/* ---- capabilities ---- */
enum {
    EXS_PROV_CAP_WRITE_IMM = 1u << 0, /* RDMA_WRITE_WITH_IMM supported */
    EXS_PROV_CAP_READ = 1u << 1,      /* RDMA_READ supported */
    EXS_PROV_CAP_INLINE = 1u << 2,    /* EXS_PROV_SEND_INLINE supported */
    EXS_PROV_CAP_EMU_LINK = 1u << 3,  /* honours EXS_EMU_DELAY_US / EXS_EMU_RATE_MBPS */
    EXS_PROV_CAP_DEFER = 1u << 4,     /* honours EXS_PROV_SEND_DEFER (ep_flush) */
};

struct exs_prov_caps {
    uint32_t flags;            /* EXS_PROV_CAP_* */
    uint32_t max_inline;       /* largest total length accepted with SEND_INLINE */
    uint32_t max_sge;          /* largest num_sge in one work request */
    uint32_t max_send_wr;      /* largest ep_attr.max_send_wr */
    uint32_t max_recv_wr;      /* largest ep_attr.max_recv_wr */
    uint32_t max_private_data; /* bytes of private data on connect/accept/reject, >= 56 */
    uint64_t max_msg_size;     /* largest total length of one work request */
    uint32_t max_cqe;          /* capacity of the ctx completion queue */
};

/* ---- context ---- */
/*
 * Progress (spec/threading.md). By default (flags 0) a provider runs whatever it needs
 * to make progress on its own threads (the tcp provider's NIC thread). With
 * EXS_PROV_ATTR_MANUAL_PROGRESS the consumer drives it instead: the provider starts no
 * thread that moves data (a thread that only waits for the kernel's connection events,
 * like the verbs rdma_cm thread, may remain) and does its pending work inside
 * ctx_progress, called by whichever thread drives progress. Every other op behaves
 * exactly as in the default mode (same RC semantics, same completions).
 */
enum {
    EXS_PROV_ATTR_MANUAL_PROGRESS = 1u << 0,
};

struct exs_prov_attr {
    const char *device; /* provider-specific device name, NULL = default */
    uint32_t cq_size;   /* requested completion queue capacity, 0 = default */
    uint32_t flags;     /* EXS_PROV_ATTR_* */
};

#define EXS_PROV_DEVICE_MAX 80 /* bytes of exs_prov_ctx.device, with its NUL */

struct exs_prov_ctx {
    const struct exs_prov_ops *ops; /* set by the provider */
    struct exs_prov_caps caps;
    /* what the context runs on, for exsctl stat: "<device>:<port>" (verbs, set with
     * exs__prov_set_device), "" = nothing more than the provider (exs__prov_device) */
    char device[EXS_PROV_DEVICE_MAX];
    /* Optional, set by the provider at open: a count that is 0 whenever no cm event is
     * queued (read with acquire; written by the provider only), so that
     * exs__prov_cm_poll answers 0 without calling ctx_cm_poll (a busy poller asks at
     * every turn). NULL: ctx_cm_poll is always called. */
    const uint32_t *cm_queued;
};

/* ---- memory registration ---- */
enum {
    EXS_PROV_ACCESS_LOCAL_WRITE = 1u << 0,  /* local receive/READ target */
    EXS_PROV_ACCESS_REMOTE_WRITE = 1u << 1, /* peer may RDMA_WRITE(_WITH_IMM) into it */
    EXS_PROV_ACCESS_REMOTE_READ = 1u << 2,  /* peer may RDMA_READ from it */
};

struct exs_prov_mr {
    struct exs_prov_ctx *ctx;
    void *addr;      /* start of the registered range */
    size_t length;   /* bytes */
    uint32_t lkey;   /* for local sge entries */
    uint32_t rkey;   /* given to the peer for RDMA_WRITE/READ */
    unsigned access; /* EXS_PROV_ACCESS_* */
};

/* ---- remote access grants (spec/provider.md, "Grants") ----
 *
 * The only way a peer reaches local memory. A grant gives the peer of ONE ep
 * ONE right (REMOTE_WRITE or REMOTE_READ) over exactly [addr, addr+length) of a
 * local mr, until revoke. Its rkey is unpredictable, and fails with a remote
 * access error on any other ep (of this ctx or another), for the other right,
 * outside the range, and once revoked. verbs: a type 2 memory window bound to the
 * ep's QP; tcp: the same semantics emulated per connection. */
struct exs_prov_grant {
    struct exs_prov_ep *ep; /* the one endpoint whose peer may use rkey */
    struct exs_prov_mr *mr; /* the local registration the range lies in */
    uint64_t addr;          /* first byte granted */
    uint64_t length;        /* bytes granted */
    uint32_t rkey;          /* give this to the peer; valid on ep only */
    unsigned access;        /* exactly one of EXS_PROV_ACCESS_REMOTE_WRITE / _READ */
};

/* For providers: the generic part of a new grant (rkey is the provider's). */
static inline void exs__prov_grant_init(struct exs_prov_grant *g, struct exs_prov_ep *ep,
                                        struct exs_prov_mr *mr, uint64_t addr, uint64_t length,
                                        unsigned access)
{
    g->ep = ep;
    g->mr = mr;
    g->addr = addr;
    g->length = length;
    g->access = access;
}

/* ---- work requests ---- */
struct exs_prov_sge {
    uint64_t addr;   /* local virtual address */
    uint32_t length; /* bytes */
    uint32_t lkey;   /* key of an mr of this ctx containing [addr, addr+length); ignored with
                        SEND_INLINE */
};

enum exs_prov_wr_opcode {
    EXS_PROV_WR_SEND = 0,
    EXS_PROV_WR_SEND_WITH_IMM,
    EXS_PROV_WR_RDMA_WRITE,
    EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
    EXS_PROV_WR_RDMA_READ,
};

enum {
    EXS_PROV_SEND_SIGNALED = 1u << 0, /* generate a completion on success */
    EXS_PROV_SEND_INLINE = 1u << 1,   /* copy the data at post time; lkeys ignored */
    EXS_PROV_SEND_FENCE = 1u << 2,    /* wait for prior RDMA_READs before starting */
    /* (caps EXS_PROV_CAP_DEFER only) more requests on this ep follow at once: the provider
     * may hold this one back and hand it to the device with the next post_send on the ep
     * without DEFER, at ep_flush(ep), or at the ctx's next ctx_poll / ctx_arm, whichever
     * comes first (one doorbell for the batch); see ep_flush */
    EXS_PROV_SEND_DEFER = 1u << 3,
};

struct exs_prov_send_wr {
    uint64_t wr_id; /* returned in the completion */
    enum exs_prov_wr_opcode opcode;
    unsigned flags;                     /* EXS_PROV_SEND_* */
    const struct exs_prov_sge *sg_list; /* READ: local destination; others: local source */
    int num_sge;                        /* 0 .. caps.max_sge */
    uint32_t imm_data; /* *_WITH_IMM: delivered with the peer's receive completion (host order) */
    uint64_t remote_addr; /* RDMA_*: target address in the peer's mr */
    uint32_t rkey;        /* RDMA_*: the peer's mr rkey */
};

struct exs_prov_recv_wr {
    uint64_t wr_id;
    const struct exs_prov_sge *sg_list; /* where an incoming SEND's payload is scattered */
    int num_sge;
};

/* ---- completions ---- */
enum exs_prov_wc_status {
    EXS_PROV_WC_SUCCESS = 0,
    EXS_PROV_WC_LOC_LEN_ERR, /* incoming SEND larger than the receive buffer, or bad local length */
    EXS_PROV_WC_LOC_PROT_ERR, /* local sge not inside an mr of this ctx with the right access */
    EXS_PROV_WC_WR_FLUSH_ERR, /* flushed: the ep is in ERROR (disconnect, dead peer, prior error) */
    EXS_PROV_WC_REM_ACCESS_ERR,    /* peer refused an RDMA_WRITE/READ: key, bounds, rights,
                                      deregistered */
    EXS_PROV_WC_REM_INV_REQ_ERR,   /* peer found the request malformed (e.g. SEND too long for its
                                      buffer) */
    EXS_PROV_WC_REM_OP_ERR,        /* peer failed to carry out the operation */
    EXS_PROV_WC_RETRY_EXC_ERR,     /* transport retries exhausted: peer dead or unreachable */
    EXS_PROV_WC_RNR_RETRY_EXC_ERR, /* receiver not ready: no receive posted after rnr_retry retries
                                    */
    EXS_PROV_WC_GENERAL_ERR,
    EXS_PROV_WC_STATUS_MAX
};

enum exs_prov_wc_opcode {
    EXS_PROV_WC_SEND = 0,           /* SEND or SEND_WITH_IMM finished */
    EXS_PROV_WC_RDMA_WRITE,         /* RDMA_WRITE or RDMA_WRITE_WITH_IMM finished */
    EXS_PROV_WC_RDMA_READ,          /* RDMA_READ finished; data is in the local sges */
    EXS_PROV_WC_RECV,               /* a SEND(_WITH_IMM) consumed a posted receive */
    EXS_PROV_WC_RECV_RDMA_WITH_IMM, /* an RDMA_WRITE_WITH_IMM consumed a posted receive */
    EXS_PROV_WC_GRANT,              /* no work request of the caller (wr_id 0): a grant of ep whose
                                     * grant_settle said -EBUSY would now say 0 */
};

enum {
    EXS_PROV_WC_WITH_IMM = 1u << 0, /* imm_data is valid */
};

struct exs_prov_ep;

struct exs_prov_cqe {
    uint64_t wr_id;
    struct exs_prov_ep *ep; /* the endpoint the work request was posted on */
    enum exs_prov_wc_status status;
    enum exs_prov_wc_opcode
        opcode; /* valid on success; on error the provider still sets it when known */
    uint32_t
        byte_len; /* RECV*: bytes received (payload of SEND, length of WWI); READ: bytes read */
    uint32_t imm_data; /* valid when flags & EXS_PROV_WC_WITH_IMM (host order) */
    unsigned flags;    /* EXS_PROV_WC_* */
};

/* ---- endpoints and connection management ---- */
struct exs_prov_ep_attr {
    uint32_t max_send_wr; /* send queue depth (outstanding, incl. unsignaled not yet retired) */
    uint32_t max_recv_wr; /* receive queue depth */
    uint32_t max_inline;  /* requested inline size, <= caps.max_inline */
    uint8_t rnr_retry;    /* 0..7; 7 = retry forever (as verbs) */
    uint8_t rnr_timer_ms; /* pause between RNR retries, 0 = provider default */
    uint8_t timeout;      /* verbs local ACK timeout exponent (4.096 us * 2^timeout), 0 = default */
    uint8_t retry_cnt;    /* verbs transport retry count, 0 = default */
    void *user;           /* opaque owner pointer, never touched by the provider */
};

enum exs_prov_ep_state {
    EXS_PROV_EP_IDLE = 0,   /* created; receives may be posted, sends fail with -ENOTCONN */
    EXS_PROV_EP_CONNECTING, /* connect() or accept() in progress */
    EXS_PROV_EP_CONNECTED,  /* sends and receives flow */
    EXS_PROV_EP_ERROR, /* everything outstanding and later posted completes with WR_FLUSH_ERR */
};

struct exs_prov_ep {
    struct exs_prov_ctx *ctx;
    void *user;                   /* copied from ep_attr.user */
    struct exs_prov_ep_attr attr; /* granted attributes */
};

struct exs_prov_listener {
    struct exs_prov_ctx *ctx;
    void *user; /* opaque owner pointer */
};

/* A pending connection request, valid until accepted or rejected. */
struct exs_prov_conn_req {
    struct exs_prov_listener *listener;
};

enum exs_prov_cm_event_type {
    EXS_PROV_CM_CONNECT_REQUEST = 1, /* listener: req, peer addr, private data */
    EXS_PROV_CM_ESTABLISHED,  /* ep: connected; active side gets the acceptor's private data */
    EXS_PROV_CM_REJECTED,     /* ep (active side): peer rejected; private data of the reject */
    EXS_PROV_CM_UNREACHABLE,  /* ep (active side): no listener / route; status = -errno */
    EXS_PROV_CM_DISCONNECTED, /* ep: the connection ended (either side, or peer died); status = 0 or
                                 -errno */
};

/* exs_prov_cm_event.flags (spec/provider.md, "Why a connection ended") */
enum {
    /* DISCONNECTED: the peer closed its endpoint for good (its ep_destroy, or its process
     * ended and its kernel closed the connection), as far as the provider can tell: an
     * orderly end by the peer, not a failure of the path. Absent: the provider cannot
     * tell, or the path failed (a reset, an error, the peer's disconnect). */
    EXS_PROV_CM_F_PEER_CLOSED = 1u << 0,
};

#define EXS_PROV_PRIVATE_DATA_MAX 256

struct exs_prov_cm_event {
    enum exs_prov_cm_event_type type;
    struct exs_prov_ep *ep;             /* all but CONNECT_REQUEST */
    struct exs_prov_listener *listener; /* CONNECT_REQUEST */
    struct exs_prov_conn_req *req;      /* CONNECT_REQUEST */
    int status;                         /* 0 or -errno */
    unsigned flags;                     /* EXS_PROV_CM_F_* */
    struct sockaddr_storage peer_addr;
    socklen_t peer_addrlen;
    uint32_t private_data_len;
    uint8_t private_data[EXS_PROV_PRIVATE_DATA_MAX];
};

/* ---- the ops table ---- */
struct exs_prov_ops {
    const char *name; /* "tcp" | "verbs" | "fault:tcp" | "fault:verbs": equals EXS_PROVIDER */

    /* context and its event descriptor */
    int (*ctx_open)(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
    void (*ctx_close)(struct exs_prov_ctx *ctx); /* all eps, listeners and mrs must be gone */
    int (*ctx_event_fd)(struct exs_prov_ctx *ctx);
    /* Request notification: the event fd becomes readable once a completion or
     * cm event is queued. Consumes any earlier notification. Returns -EAGAIN
     * when entries are already queued (poll them instead of sleeping).
     * MANUAL_PROGRESS: also -EAGAIN while ctx_progress has work it can do now
     * (queued posts or commands); after 0, the event fd becomes readable as soon as
     * ctx_progress has work (frames arrived, a socket became writable, a provider
     * timer expired, another thread queued work): the sleeper then calls
     * ctx_progress, ctx_poll and ctx_cm_poll. Spurious readability is allowed. */
    int (*ctx_arm)(struct exs_prov_ctx *ctx);
    /* Take back an earlier ctx_arm: nobody sleeps on the event fd any more (the caller
     * knows: spec/threading.md §3, "Disarm"), so entries queued from now on need not
     * make it readable until the next ctx_arm. Optional (default: nothing; the event
     * fd then becomes readable as before, which only costs a wake-up nobody waits for). */
    void (*ctx_disarm)(struct exs_prov_ctx *ctx);
    /* Do the provider's pending work without blocking: transmit what was posted,
     * read and process what arrived, run expired provider timers, run queued
     * connection commands. Any thread, any mode; concurrent callers are serialized
     * (a caller may wait for another one's turn, never for a peer). Returns > 0 when
     * it did something (completions or cm events may now be queued) or did not look at
     * everything this time ("call again": a busy turn may skip its system calls, a bounded
     * number of times in a row), 0 only after a turn that looked at everything and found
     * nothing to do, or a negative errno. Optional (default: returns 0); a provider
     * without it must not be opened with MANUAL_PROGRESS (-EOPNOTSUPP). */
    int (*ctx_progress)(struct exs_prov_ctx *ctx);
    /* Up to max completions, oldest first; returns the count (0 = none). */
    int (*ctx_poll)(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe, int max);
    /* ctx_progress, then ctx_poll into cqe (at most max, oldest first) in one call: returns
     * what ctx_progress would, *n_p the completions written (0 when ctx_poll failed). A
     * provider may hand the completions its turn makes straight to the caller, without
     * queueing them and taking them back (spec/provider.md, "Progress and poll in one").
     * Optional: exs__prov_progress_poll makes the two calls without it. */
    int (*ctx_progress_poll)(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe, int max, int *n_p);
    /* One cm event: 1 when *ev was filled, 0 when none is queued. */
    int (*ctx_cm_poll)(struct exs_prov_ctx *ctx, struct exs_prov_cm_event *ev);
    /* fork(2) (spec/provider.md, "Fork"), phase an enum exs_fork_phase. PREPARE, in the
     * forking thread before the fork: keep the context's kernel descriptors and the lists
     * that hold them from changing (take the lock under which they are made and
     * recorded); PARENT, after it in the parent: let go. CHILD, in the child (one thread,
     * the forking one, which got the PREPARE locks with the memory): close the child's
     * copy of every kernel descriptor of the context and unregister its counter sets;
     * nothing else: no shutdown, epoll_ctl, write or any call that acts on what the child
     * shares with the parent, no free (the context is abandoned, never used again).
     * Optional (default: nothing; the child then keeps copies that hold the parent's
     * connections and listeners open in the kernel as long as it lives). */
    void (*ctx_fork)(struct exs_prov_ctx *ctx, int phase);

    /* memory registration */
    int (*mr_reg)(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                  struct exs_prov_mr **mr_p);
    int (*mr_dereg)(struct exs_prov_mr *mr);
    /* The library's own memory (rings, control buffers): len bytes, page aligned, contents
     * undefined, with an mr of local access only (lkey valid; give no rkey out: register a
     * sub-range with mr_reg for that). The verbs provider serves it from its memory cache; the
     * default allocates and registers. Free with mem_free before ctx_close. */
    int (*mem_alloc)(struct exs_prov_ctx *ctx, size_t len, struct exs_prov_mr **mr_p);
    void (*mem_free)(struct exs_prov_mr *mr);
    /* A registration of user memory for one operation (EXS_MHANDLE_UNREGISTERED), access
     * as mr_reg; the verbs provider keeps it in its registration cache after mr_put. The
     * default is mr_reg / mr_dereg. */
    int (*mr_get)(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                  struct exs_prov_mr **mr_p);
    void (*mr_put)(struct exs_prov_mr *mr);

    /* Grant the peer of ep one remote right over [addr, addr+length) of mr (which
     * must hold LOCAL_WRITE; length >= 1). ep must be CONNECTED (-ENOTCONN). The
     * rkey may be sent to the peer in any later post_send on ep: operations the
     * peer issues after receiving it find it valid. Errors: -EINVAL (range not in
     * mr, access not exactly one remote right), -ENOTCONN, -ENOMEM. */
    int (*grant)(struct exs_prov_ep *ep, struct exs_prov_mr *mr, void *addr, size_t length,
                 unsigned access, struct exs_prov_grant **grant_p);
    /* End a grant at once, without waiting for the peer: when revoke returns no
     * further byte of the peer lands in the range or is read from it. A transfer in
     * progress is cut off (its remaining bytes are discarded) and fails at the peer
     * with REM_ACCESS_ERR. Every grant of an ep is revoked before ep_destroy. */
    void (*revoke)(struct exs_prov_grant *grant);
    /* Whether revoke(grant) would now end the grant and nothing else: 0 yes; -EBUSY
     * when the provider's own setting up of the key may still wait behind requests
     * the peer holds up (verbs: the window's bind, not yet completed), so that revoke
     * could keep its promise only by ending the endpoint. After -EBUSY, ep gets one
     * completion with opcode EXS_PROV_WC_GRANT once the answer would be 0. Local,
     * never waits; NULL (tcp, shm: a key is set up when grant returns) means 0. */
    int (*grant_settle)(struct exs_prov_grant *grant);

    /* endpoints */
    /* Reserves room in the ctx completion queue for every completion the ep can
     * produce (max_send_wr + max_recv_wr), so the queue never overflows; the queue
     * grows up to caps.max_cqe. Errors: -EINVAL, -ENOMEM, -ENOBUFS (completion
     * queue cannot hold another ep of this size). */
    int (*ep_create)(struct exs_prov_ctx *ctx, const struct exs_prov_ep_attr *attr,
                     struct exs_prov_ep **ep_p);
    /* Destroys the ep; implies disconnect. Outstanding work is discarded
     * without completions; call after DISCONNECTED and draining for a clean end. */
    void (*ep_destroy)(struct exs_prov_ep *ep);
    enum exs_prov_ep_state (*ep_state)(struct exs_prov_ep *ep);
    /* The local address of a connected (or once connected) ep; -ENOTCONN before. */
    int (*ep_local_addr)(struct exs_prov_ep *ep, struct sockaddr_storage *addr, socklen_t *addrlen);

    /* connection management */
    int (*listen)(struct exs_prov_ctx *ctx, const struct sockaddr *addr, socklen_t addrlen,
                  int backlog, void *user, struct exs_prov_listener **lis_p);
    /* The bound address (port 0 resolved). */
    int (*listener_addr)(struct exs_prov_listener *lis, struct sockaddr_storage *addr,
                         socklen_t *addrlen);
    void (*listener_destroy)(struct exs_prov_listener *lis); /* pending requests are rejected */
    /* Stop (pause 1) or go on (pause 0) taking new connection requests on lis, so that
     * clients wait below the provider (and retry there) while the consumer has no room
     * for them. Requests the provider had taken before still arrive as CONNECT_REQUEST
     * events (at most the provider's own handshake bound); requests already delivered
     * stay valid. Progress thread or any thread, never waits for a peer. Optional
     * (default -EOPNOTSUPP: the provider cannot, and requests keep arriving). tcp: stops
     * accept()ing on the listening socket (the kernel's listen queue holds the clients,
     * its SYN retries beyond it). */
    int (*listener_pause)(struct exs_prov_listener *lis, int pause);
    int (*connect)(struct exs_prov_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
                   const void *private_data, uint32_t private_data_len);
    int (*accept)(struct exs_prov_conn_req *req, struct exs_prov_ep *ep, const void *private_data,
                  uint32_t private_data_len);
    int (*reject)(struct exs_prov_conn_req *req, const void *private_data,
                  uint32_t private_data_len);
    int (*disconnect)(struct exs_prov_ep *ep);

    /* data path */
    int (*post_recv)(struct exs_prov_ep *ep, const struct exs_prov_recv_wr *wr);
    int (*post_send)(struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr);
    /* Hand the requests posted on ep with EXS_PROV_SEND_DEFER and still held to the device,
     * in their order, together. post_send checked and counted each when it was posted (its
     * errors, its -ENOMEM); whatever happens after, each still completes (success, error
     * or WR_FLUSH_ERR), in order. Within requests handed over together, a SIGNALED one
     * followed by another SIGNALED one may reach the device unsignaled: its completion is
     * then made by the provider, in order, when the later one's comes (RC completes in
     * order), so it may come later than the device finished it, never later than the
     * batch's last signaled request. Never waits for a peer. Optional (default: nothing,
     * and a provider without EXS_PROV_CAP_DEFER holds nothing back). */
    void (*ep_flush)(struct exs_prov_ep *ep);
};

/* ---- registry (prov.c) ---- */

/* Record "<name>:<port>" as ctx's device. 0, or -ENAMETOOLONG (ctx->device stays ""). */
int exs__prov_set_device(struct exs_prov_ctx *ctx, const char *name, unsigned port);

/* The ops table named name ("tcp", "verbs"), or NULL. */
const struct exs_prov_ops *exs__prov_find(const char *name);
/* Open a context of the provider chosen by EXS_PROVIDER (default: verbs when an
 * active RDMA device exists, else tcp). Errors: -ENOENT unknown name, provider errors. */
int exs__prov_open_default(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
/* Open a context of the tcp provider: the fallback of another one (spec/provider.md,
 * Fallback). Errors: provider errors. */
int exs__prov_open_fallback(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
/* The shm provider's context beside a tcp primary (spec/provider-shm.md, Chosen by itself):
 * the engine's second context when EXS_SHM is not off. */
int exs__prov_open_shm(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
/* The process behind the shm listener that a connect of ctx (the shm provider's) to addr
 * would reach: its pid and uid (SO_PEERCRED of a rendezvous socket connected and closed
 * at once, without a request). -EOPNOTSUPP when ctx is not shm's, else 0 or -errno of the
 * connect (-ECONNREFUSED: no listener on the port). */
int exs__prov_shm_peer(const struct exs_prov_ctx *ctx, const struct sockaddr *addr,
                       socklen_t addrlen, uint32_t *pid_p, uint32_t *uid_p);
/* Names for logs and tests. */
const char *exs__prov_wc_status_str(enum exs_prov_wc_status status);
const char *exs__prov_wc_opcode_str(enum exs_prov_wc_opcode opcode);
const char *exs__prov_cm_event_str(enum exs_prov_cm_event_type type);
/* Points every NULL op at a stub returning -EOPNOTSUPP. */
void exs__prov_fill_defaults(struct exs_prov_ops *ops);
/* Shared by the providers (one definition of what every provider checks or maps). */
/* ep_create's attribute check against the context's caps: 0, or -EINVAL (no attr, a
 * queue depth of 0 or above caps, max_inline above caps, rnr_retry above 7). */
int exs__prov_ep_attr_check(const struct exs_prov_caps *caps, const struct exs_prov_ep_attr *attr);
/* The completion opcode of a send work request's opcode (SEND and SEND_WITH_IMM: SEND;
 * RDMA_WRITE and RDMA_WRITE_WITH_IMM: RDMA_WRITE; RDMA_READ: RDMA_READ), as verbs. */
enum exs_prov_wc_opcode exs__prov_wr_wc_opcode(enum exs_prov_wr_opcode opcode);

/* ---- inline wrappers: the only way code outside exs/prov/ calls a provider ----
 * (a check in `make check`, scripts/check-prov-door.sh, fails on any other use). */
static inline int exs__prov_ctx_open(const struct exs_prov_ops *ops,
                                     const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    return ops->ctx_open(attr, ctx_p);
}

static inline int exs__prov_ctx_event_fd(struct exs_prov_ctx *ctx)
{
    return ctx->ops->ctx_event_fd(ctx);
}

static inline void exs__prov_ctx_close(struct exs_prov_ctx *ctx)
{
    ctx->ops->ctx_close(ctx);
}

static inline const char *exs__prov_name(const struct exs_prov_ctx *ctx)
{
    return ctx->ops->name;
}

/* The device and port ctx runs on ("mlx5_0:1"), or, without one, the provider's name
 * ("tcp"). */
static inline const char *exs__prov_device(const struct exs_prov_ctx *ctx)
{
    return ctx->device[0] ? ctx->device : ctx->ops->name;
}

static inline int exs__prov_poll(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe, int max)
{
    return ctx->ops->ctx_poll(ctx, cqe, max);
}

static inline int exs__prov_cm_poll(struct exs_prov_ctx *ctx, struct exs_prov_cm_event *ev)
{
    /* an event queued meanwhile is found by the next call, or makes ctx_arm -EAGAIN */
    if (ctx->cm_queued && !__atomic_load_n(ctx->cm_queued, __ATOMIC_ACQUIRE))
        return 0;
    return ctx->ops->ctx_cm_poll(ctx, ev);
}

static inline void exs__prov_ctx_fork(struct exs_prov_ctx *ctx, int phase)
{
    ctx->ops->ctx_fork(ctx, phase);
}

/* A provider's ctx_fork in the child: close the child's copies of n descriptors (each
 * one that is >= 0; nothing is written to them) and set them to -1. */
void exs__prov_fork_close(int *const *fds, size_t n);
/* A provider's ctx_fork around the fork: the lock under which the context makes and lists
 * its descriptors is taken before (EXS_FORK_PREPARE) and released after in the parent, so
 * the child finds the lists whole. 1 when the phase is done; 0 in the child, which then
 * closes its copies (and its inherited lock is the caller's to forget). */
int exs__prov_fork_lock(pthread_mutex_t *lock, int phase);

static inline int exs__prov_arm(struct exs_prov_ctx *ctx)
{
    return ctx->ops->ctx_arm(ctx);
}

static inline void exs__prov_disarm(struct exs_prov_ctx *ctx)
{
    ctx->ops->ctx_disarm(ctx);
}

static inline int exs__prov_progress(struct exs_prov_ctx *ctx)
{
    return ctx->ops->ctx_progress(ctx);
}

/* ctx_progress then ctx_poll (prov.h, ctx_progress_poll): the provider's fused call, or
 * the two. */
static inline int exs__prov_progress_poll(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe,
                                          int max, int *n_p)
{
    int p, n;

    if (ctx->ops->ctx_progress_poll)
        return ctx->ops->ctx_progress_poll(ctx, cqe, max, n_p);
    p = ctx->ops->ctx_progress(ctx);
    n = ctx->ops->ctx_poll(ctx, cqe, max);
    *n_p = n > 0 ? n : 0;
    return p;
}

static inline int exs__prov_mr_reg(struct exs_prov_ctx *ctx, void *addr, size_t length,
                                   unsigned access, struct exs_prov_mr **mr_p)
{
    return ctx->ops->mr_reg(ctx, addr, length, access, mr_p);
}

static inline int exs__prov_mr_dereg(struct exs_prov_mr *mr)
{
    return mr->ctx->ops->mr_dereg(mr);
}

static inline int exs__prov_mem_alloc(struct exs_prov_ctx *ctx, size_t len,
                                      struct exs_prov_mr **mr_p)
{
    return ctx->ops->mem_alloc(ctx, len, mr_p);
}

static inline void exs__prov_mem_free(struct exs_prov_mr *mr)
{
    mr->ctx->ops->mem_free(mr);
}

static inline int exs__prov_mr_get(struct exs_prov_ctx *ctx, void *addr, size_t length,
                                   unsigned access, struct exs_prov_mr **mr_p)
{
    return ctx->ops->mr_get(ctx, addr, length, access, mr_p);
}

static inline void exs__prov_mr_put(struct exs_prov_mr *mr)
{
    mr->ctx->ops->mr_put(mr);
}

static inline int exs__prov_grant(struct exs_prov_ep *ep, struct exs_prov_mr *mr, void *addr,
                                  size_t length, unsigned access, struct exs_prov_grant **grant_p)
{
    return ep->ctx->ops->grant(ep, mr, addr, length, access, grant_p);
}

static inline void exs__prov_revoke(struct exs_prov_grant *grant)
{
    grant->ep->ctx->ops->revoke(grant);
}

static inline int exs__prov_grant_settle(struct exs_prov_grant *grant)
{
    int (*settle)(struct exs_prov_grant *) = grant->ep->ctx->ops->grant_settle;

    return settle ? settle(grant) : 0;
}

static inline int exs__prov_ep_create(struct exs_prov_ctx *ctx, const struct exs_prov_ep_attr *attr,
                                      struct exs_prov_ep **ep_p)
{
    return ctx->ops->ep_create(ctx, attr, ep_p);
}

static inline void exs__prov_ep_destroy(struct exs_prov_ep *ep)
{
    ep->ctx->ops->ep_destroy(ep);
}

static inline enum exs_prov_ep_state exs__prov_ep_state(struct exs_prov_ep *ep)
{
    return ep->ctx->ops->ep_state(ep);
}

static inline int exs__prov_ep_local_addr(struct exs_prov_ep *ep, struct sockaddr_storage *addr,
                                          socklen_t *addrlen)
{
    return ep->ctx->ops->ep_local_addr(ep, addr, addrlen);
}

static inline int exs__prov_listen(struct exs_prov_ctx *ctx, const struct sockaddr *addr,
                                   socklen_t addrlen, int backlog, void *user,
                                   struct exs_prov_listener **lis_p)
{
    return ctx->ops->listen(ctx, addr, addrlen, backlog, user, lis_p);
}

static inline int exs__prov_listener_addr(struct exs_prov_listener *lis,
                                          struct sockaddr_storage *addr, socklen_t *addrlen)
{
    return lis->ctx->ops->listener_addr(lis, addr, addrlen);
}

static inline void exs__prov_listener_destroy(struct exs_prov_listener *lis)
{
    lis->ctx->ops->listener_destroy(lis);
}

static inline int exs__prov_connect(struct exs_prov_ep *ep, const struct sockaddr *addr,
                                    socklen_t addrlen, const void *pd, uint32_t pdlen)
{
    return ep->ctx->ops->connect(ep, addr, addrlen, pd, pdlen);
}

static inline int exs__prov_listener_pause(struct exs_prov_listener *lis, int pause)
{
    return lis->ctx->ops->listener_pause(lis, pause);
}

static inline int exs__prov_accept(struct exs_prov_conn_req *req, struct exs_prov_ep *ep,
                                   const void *pd, uint32_t pdlen)
{
    return ep->ctx->ops->accept(req, ep, pd, pdlen);
}

static inline int exs__prov_reject(struct exs_prov_conn_req *req, const void *pd, uint32_t pdlen)
{
    return req->listener->ctx->ops->reject(req, pd, pdlen);
}

static inline int exs__prov_disconnect(struct exs_prov_ep *ep)
{
    return ep->ctx->ops->disconnect(ep);
}

static inline int exs__prov_post_send(struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr)
{
    return ep->ctx->ops->post_send(ep, wr);
}

static inline int exs__prov_post_recv(struct exs_prov_ep *ep, const struct exs_prov_recv_wr *wr)
{
    return ep->ctx->ops->post_recv(ep, wr);
}

static inline void exs__prov_ep_flush(struct exs_prov_ep *ep)
{
    ep->ctx->ops->ep_flush(ep);
}

#endif
