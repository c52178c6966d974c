/* SPDX-License-Identifier: MIT */
/* Private structures and internal functions of the tcp provider (RC verbs emulated over TCP). */
#ifndef EXS_PROV_TCP_TCP_H
#define EXS_PROV_TCP_TCP_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "exs/prov/prov.h"
#include "exs/prov/soft/soft_cm.h"
#include "exs/prov/soft/soft_cq.h"
#include "exs/prov/soft/soft_keys.h"
#include "exs/prov/soft/soft_wr.h"
#include "exs/prov/tcp/tcp_wire.h"
#include "exs/util/tsan.h"
#include "exs/util/counters.h"
#include "exs/util/list.h"

/*
 * Threads and locks (spec/provider-tcp.md, "Progress" and "Implementation"):
 *
 *   nic_lock     the NIC role. Whoever holds it owns every socket, every tcp_conn,
 *                the transmit queues and the receive parsers ("NIC" below). It is
 *                held for one turn (tcp_nic_turn: epoll events, posted work,
 *                timers, flush, reap), for a command (connect, accept, reject,
 *                disconnect, ep_destroy, listen, listener_destroy: run by the
 *                caller's thread, exs__tcp_ctx_call) and for a direct write (a
 *                poster that wins trylock frames and writes its own request).
 *                Held by: the NIC thread (default mode) for its turns only, never
 *                while it sleeps; ctx_progress (MANUAL_PROGRESS); command callers;
 *                posters. Outermost lock of the provider: nic_lock -> ep->lock ->
 *                ctx->lock -> mr_lock. Nothing under it waits for a peer, and the
 *                provider never takes a lock of its consumer (api, proto, engine).
 *   ep->lock     the ep's state, its pending send list, receive queue and counts.
 *   ctx->lock    the completion queue, cm event queue, the list of eps with new
 *                work, armed. Taken after ep->lock, never before it.
 *   ctx->mr_lock the key hash (mrs and grants), the key pool, the grants of every
 *                ep, and the copy fence. Innermost.
 * No lock is held across a blocking call or while payload is copied (payload is
 * copied by the nic_lock holder, which waits for nobody).
 *
 * Copy fence (spec/provider-tcp.md, "Fencing"): the NIC copies peer bytes into a
 * remote key's memory (WRITE payload) or out of it (READ response), or into a receive's
 * regions (SEND payload), only between exs__tcp_copy_begin (_local for a receive), which
 * finds every key involved live, and exs__tcp_copy_end (the
 * key table and the fence are exs/prov/soft/soft_keys.c's, shared with shm, under mr_lock).
 * revoke and mr_dereg kill the key under mr_lock, then wait only for the copy
 * running at that instant (one non-blocking readv/sendmsg), never for the peer.
 */

#define TCP_RX_BUDGET      (1u << 20)        /* bytes read per connection per loop turn */
#define TCP_STG_LEN        4096              /* read-ahead of an UP connection at a frame start */
#define TCP_ACK_EVERY      16                /* requests between forced ACKs */
#define TCP_MAX_RD         16                /* RDMA_READs outstanding per ep */
#define TCP_CTRL_MAX(ctx)  ((ctx)->ctrl_max) /* responder frames queued before reading stops */
#define TCP_LINGER_NS      2000000000ull
#define TCP_TX_IOV         64
#define TCP_LOWAT_MIN      (256u << 10) /* payload left for SO_RCVLOWAT to be worth raising */
#define TCP_LOWAT_MAX      (1u << 20)   /* SO_RCVLOWAT at most (the kernel caps it too) */
#define TCP_RESP_COPY_MAX  65536        /* READ responses copied when they cannot leave at once */
#define TCP_BACKOFF_MIN_MS 100          /* accept out of descriptors: first pause */
#define TCP_BACKOFF_MAX_MS 1000         /* pauses double up to this */
#define TCP_LISTEN_QUEUE   65535        /* listen(2) backlog; the kernel caps it (somaxconn) */

struct tcp_ctx;
struct tcp_conn;
struct tcp_ep;

struct tcp_counters {
    uint64_t frames_tx;
    uint64_t frames_rx;
    uint64_t bytes_tx;
    uint64_t bytes_rx;
    uint64_t acks_tx;
    uint64_t acks_rx;
    uint64_t naks_tx;
    uint64_t naks_rx;
    uint64_t rnr_waits;
    uint64_t rnr_naks;
    uint64_t access_errors;
    uint64_t protocol_errors;
    uint64_t flushed_wrs;
    uint64_t conns_established;
    uint64_t conns_rejected;
    uint64_t conns_unreachable;
    uint64_t bogus_conns;
    uint64_t conns_reset;
    uint64_t cq_overflows;
    uint64_t wakeups;
    uint64_t direct_writes;
    uint64_t progress_turns;
    uint64_t tx_full;
    uint64_t tx_calls;
    uint64_t acks_deferred;
    uint64_t emu_holds;
    uint64_t timer_walks;
    uint64_t accept_calls;
    uint64_t accept_backoffs;
    uint64_t handshake_timeouts;
    uint64_t handshake_evictions;
    uint64_t handshake_waits;
    uint64_t notifies;
    uint64_t ack_kicks;
    uint64_t disarms;
    uint64_t rx_lowats;
    uint64_t hello_refused;
    uint64_t state_errors;
};

/* A frame on a connection's transmit queue. */
enum tcp_txf_kind {
    TCP_TXF_CTRL,      /* malloc'd; payload in buf; freed once sent */
    TCP_TXF_WR,        /* embedded in a tcp_wr; payload = the wr's sges or inline data */
    TCP_TXF_READ_RESP, /* malloc'd; payload = target memory of mr */
};

struct tcp_txf {
    struct exs_list link; /* conn->txq */
    enum tcp_txf_kind kind;
    struct tcp_wire_hdr hdr;        /* network order */
    const struct exs_prov_sge *seg; /* payload segments (addr, length) */
    int nseg;
    struct exs_prov_sge one;  /* storage when the payload is one segment */
    uint64_t total;           /* header + payload bytes */
    uint64_t off;             /* bytes already written */
    uint64_t ready_ns;        /* emulation: not before this time */
    int emu_ok;               /* emulation: cleared to start */
    struct exs_soft_key *key; /* READ_RESP: the key read (users held) */
    uint8_t buf[];            /* CTRL payload */
};

/* A posted send work request. */
enum tcp_wr_state {
    TCP_WR_PENDING, /* on ep->sq_pend (not yet seen by the NIC) */
    TCP_WR_QUEUED,  /* on ep->sq (NIC), frame on conn->txq or waiting for the fence */
    TCP_WR_SENT,    /* frame written; waiting for ACK / READ_RESP */
};

struct tcp_wr {
    struct exs_list link; /* ep->sq_pend, then ep->sq */
    uint64_t wr_id;
    uint8_t opcode; /* enum exs_prov_wr_opcode */
    uint8_t state;  /* enum tcp_wr_state */
    uint8_t bad;    /* local protection error found at post time */
    uint8_t signaled;
    uint8_t fence;
    uint8_t pooled; /* a block of ep->wr_pool (TCP_WR_POOL_LEN bytes) */
    int num_sge;
    uint32_t len; /* total payload (READ: length to read) */
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t psn;
    uint64_t post_ns;          /* emulation: enqueue time */
    struct tcp_txf txf;        /* must stay last but one */
    struct exs_prov_sge sge[]; /* num_sge entries, then inline data */
};

/* A posted send whose sges and inline data fit in this many bytes takes a block of its ep's
 * pool (the default largest inline send, 256 bytes, or 17 sges); a larger one is malloced
 * for itself. TCP_POOL_MAX blocks of each kind stay cached per ep. */
#define TCP_WR_POOL_LEN  (sizeof(struct tcp_wr) + sizeof(struct exs_prov_sge) + 256)
#define TCP_RWR_POOL_SGE 4
#define TCP_POOL_MAX     64

struct tcp_ep {
    struct exs_prov_ep base;
    struct tcp_ctx *ctx;
    pthread_mutex_t lock;
    int state;                     /* enum exs_prov_ep_state; written under lock */
    struct sockaddr_storage local; /* local address once connected (lock) */
    socklen_t local_len;           /* 0 until connected (lock) */
    struct exs_list sq_pend;       /* posted, not yet taken by the NIC (lock) */
    struct exs_list rq;            /* posted receives (lock) */
    uint32_t sq_used;              /* slots incl. unsignaled not yet retired (lock) */
    uint32_t sq_unretired;         /* completed unsignaled WRs holding a slot (lock) */
    uint32_t rq_count;             /* posted receives incl. one being filled (lock) */
    /* completions of this ep in the ctx ring, not yet polled (ctx->lock; read atomically
     * under lock): sq_used + cq_sq <= max_send_wr, rq_count + cq_rq <= max_recv_wr */
    uint32_t cq_sq, cq_rq;
    int on_work; /* on ctx->work_eps (ctx->lock) */
    struct exs_list work_link;
    /* blocks of posted sends and receives kept for the next post (lock): no malloc and
     * free per work request on the data path */
    struct exs_soft_pool wr_pool, rwr_pool;
    /* NIC (nic_lock) */
    struct exs_list sq;      /* framed by the NIC (queued or sent), oldest first */
    struct exs_list sq_wait; /* taken, not framed yet (fence, READ limit, bad sge) */
    /* the region the take's last key check of a receive found (exs_soft_local_memo) */
    struct exs_soft_local_memo rq_memo;
    struct tcp_conn *conn;
    uint32_t snd_nxt;   /* next request psn */
    unsigned reads_out; /* READs sent and not answered */
    int disc_sent;      /* DISCONNECTED queued */
    int peer_closed;    /* the peer closed its endpoint (DISCONNECT with F_CLOSED,
                         * EOF): DISCONNECTED says EXS_PROV_CM_F_PEER_CLOSED */
    int destroyed;
    struct exs_list link;   /* ctx->eps (ctx->lock) */
    struct exs_list grants; /* live tcp_grant of this ep (ctx->mr_lock) */
};

struct tcp_listener {
    struct exs_prov_listener base;
    struct tcp_ctx *ctx;
    int fd;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct exs_list reqs;       /* NIC: pending tcp_req */
    struct exs_list link;       /* ctx->listeners (NIC) */
    struct exs_list handshakes; /* NIC: WAIT_REQ conns, oldest first */
    unsigned n_handshakes;
    /* NIC: descriptor exhaustion back-off */
    uint64_t resume_at;  /* not watched until then; 0 = watched */
    uint32_t backoff_ms; /* last pause, 0 after a successful accept */
    int paused;          /* NIC: listener_pause: not watched until resumed */
    int hs_wait;         /* NIC: handshakes at the bound, none silent long
                          * enough to drop: not watched until one leaves or
                          * resume_at */
    int hello_logged;    /* NIC: a refused hello was logged at info level */
};

struct tcp_req {
    struct exs_prov_conn_req base;
    struct tcp_conn *conn;
    struct exs_list link; /* lis->reqs */
};

enum tcp_conn_state {
    TCP_CONN_CONNECTING, /* active: TCP connect in progress */
    TCP_CONN_WAIT_REPLY, /* active: CONN_REQ sent, waiting for ACCEPT / REJECT */
    TCP_CONN_WAIT_REQ,   /* passive: waiting for CONN_REQ */
    TCP_CONN_PENDING,    /* passive: CONNECT_REQUEST queued, waiting for accept / reject */
    TCP_CONN_UP,         /* bound to an ep, frames flow */
    TCP_CONN_LINGER,     /* detached: sending the last frames, then discarding until EOF */
    TCP_CONN_DEAD,       /* closed; freed at the end of the loop turn */
};

/* How exs__tcp_conn_fail ends an UP connection (the other states end as their row of the
 * table in spec/provider-tcp.md says, whatever the mode). */
enum tcp_conn_end {
    TCP_END_ABORT,      /* the socket is dead or unusable: close it now */
    TCP_END_QUIET,      /* LINGER: what is queued (and a NAK, with a syndrome) leaves, nothing
                         * more (the peer ended it, or broke the protocol) */
    TCP_END_DISCONNECT, /* LINGER, DISCONNECT last (disconnect; a local error) */
    TCP_END_CLOSED,     /* LINGER, DISCONNECT with F_CLOSED last (ep_destroy) */
};

/* Whether exs__tcp_ep_fail queues the ep's one DISCONNECTED event. */
enum tcp_fail_event {
    TCP_FAIL_SILENT,       /* no event (ep_destroy, or the caller queues its own) */
    TCP_FAIL_DISCONNECTED, /* one DISCONNECTED with the status (not twice: disc_sent) */
};

enum tcp_rx_phase {
    TCP_RX_HDR,     /* collecting a header */
    TCP_RX_HOLD,    /* header parsed, waiting (RNR) */
    TCP_RX_PAYLOAD, /* placing payload into rx_seg */
    TCP_RX_CONN,    /* handshake payload into conn->hs */
};

struct tcp_conn {
    struct tcp_ctx *ctx;
    int fd;
    enum tcp_conn_state state;
    struct tcp_ep *ep;
    struct tcp_req *req;
    struct tcp_listener *lis;
    uint32_t events; /* current epoll mask */
    int status;      /* LINGER: why it ended */
    struct sockaddr_storage peer;
    socklen_t peerlen;
    /* receive */
    enum tcp_rx_phase rx_phase;
    int rx_retry;              /* the held header in rh is dispatched again */
    int rx_discard;            /* the current payload goes to a sink */
    int rx_drop;               /* after RNR_EXC: requests are consumed and dropped */
    int zombie;                /* requester got RNR_EXC: ep in ERROR, connection kept */
    int hold_resp;             /* holding a SEND/WRITE until READ responses left */
    unsigned resp_pending;     /* READ_RESPs still reading the region */
    struct tcp_txf *last_resp; /* the newest READ_RESP, while unsent */
    uint8_t hbuf[TCP_WIRE_HDR_LEN];
    uint32_t hgot;
    uint8_t *stg;              /* staging: TCP_STG_LEN bytes read ahead (UP only) */
    uint32_t stg_off, stg_len; /* bytes [stg_off, stg_len) not yet placed */
    int rx_again;              /* on ctx->rx_again: staged bytes to place next turn */
    int lowat;                 /* the socket's SO_RCVLOWAT as we set it (0: never, 1) */
    struct exs_list rx_again_link;
    struct tcp_wire_hdr rh; /* host order */
    const struct exs_prov_sge *rx_seg;
    int rx_nseg;
    struct exs_prov_sge rx_one;
    uint64_t rx_len; /* payload length of the current frame */
    uint64_t rx_off;
    struct exs_soft_key *rx_key; /* WRITE placement target (users held) */
    /* SEND and READ response placement: the region of the receive (the READ's destination)
     * the last fence check found (NULL: several) and region_kills then (UINT64_MAX: none yet
     * this frame) */
    struct exs_soft_key *rx_lkey;
    uint64_t rx_lkills;
    struct exs_soft_rwr *rx_rwr; /* receive being filled */
    struct tcp_wr *rx_wr;        /* READ being filled */
    uint32_t rcv_nxt;            /* next expected request psn */
    uint32_t ack_psn;
    unsigned ack_count; /* requests done and not yet acknowledged */
    unsigned rnr_tries;
    uint8_t peer_rnr_retry;
    uint8_t peer_rnr_timer_ms;
    uint8_t hs[TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX];
    /* transmit */
    struct exs_list txq;
    struct tcp_txf *ack_txf; /* queued ACK not yet started (coalesced) */
    int ack_deferred;        /* on ctx->ack_defer (MANUAL: ACK owed, deferred) */
    struct exs_list ack_link;
    unsigned ctrl_queued;
    int tx_dirty;
    struct exs_list dirty_link;
    uint64_t emu_next_ns;
    int shut_wr;    /* LINGER: SHUT_WR done */
    int tx_blocked; /* the socket is full: wait for EPOLLOUT */
    int broken;     /* PENDING: the socket died before accept / reject */
    /* timers */
    uint64_t rnr_at, tx_at, linger_at;
    int on_timer;
    struct exs_list timer_link;
    struct exs_list hs_link; /* lis->handshakes while WAIT_REQ */
    int on_hs;
    uint64_t hs_at;       /* on_hs: when it was accepted (ns) */
    struct exs_list link; /* ctx->conns or ctx->dead */
};

/* A command, run by the caller's thread with nic_lock held (exs__tcp_ctx_call). */
enum tcp_cmd_type {
    TCP_CMD_CONNECT,
    TCP_CMD_ACCEPT,
    TCP_CMD_REJECT,
    TCP_CMD_DISCONNECT,
    TCP_CMD_EP_DESTROY,
    TCP_CMD_LISTEN,
    TCP_CMD_LISTENER_DESTROY,
    TCP_CMD_LISTENER_PAUSE,
};

struct tcp_cmd {
    struct exs_list link;
    enum tcp_cmd_type type;
    struct tcp_ep *ep;
    struct tcp_req *req;
    struct tcp_listener *lis;
    const struct sockaddr *addr;
    socklen_t addrlen;
    const void *pd;
    uint32_t pdlen;
    int pause; /* LISTENER_PAUSE: 1 pause, 0 go on */
    int ret;
};

struct tcp_ctx {
    struct exs_prov_ctx base;
    pthread_mutex_t nic_lock; /* the NIC role (see the top of this file) */
    pthread_mutex_t lock;
    pthread_mutex_t mr_lock;
    /* mrs, grants, the key generator and the copy fence (mr_lock; the fence's key NULL:
     * any, a sendmsg of READ responses) */
    struct exs_soft_keys keys;
    int epfd;
    int wakefd;     /* in epfd: work queued for the next turn */
    int timerfd;    /* in epfd: the earliest provider deadline */
    int evfd;       /* default mode: the application's event fd */
    int manual;     /* EXS_PROV_ATTR_MANUAL_PROGRESS: no NIC thread,
                       ctx_event_fd is epfd, notifications go to
                       wakefd (read-only after open) */
    int has_thread; /* the NIC thread was started */
    pthread_t thread;
    int stop;     /* (lock) */
    int armed;    /* (lock) */
    int evfd_set; /* (lock) evfd written since ctx_arm last read it */
    /* completion queue ring (lock) */
    struct exs_soft_cq cq;     /* reserved: sum of max_send_wr + max_recv_wr of live eps */
    struct exs_list cm_events; /* exs_soft_cm_node (lock) */
    int cm_hint;               /* atomic: cm_events may be non-empty (exs__soft_cm_pop) */
    struct exs_list work_eps;  /* eps with new sends or lost completions (lock) */
    struct exs_list eps;       /* (lock) */
    /* NIC (nic_lock) */
    struct exs_list conns;
    struct exs_list dead;
    struct exs_list dirty;    /* conns with frames to write */
    struct exs_list rx_again; /* conns with staged bytes they may place now */
    unsigned rx_again_n;      /* (atomic) its length: a driver must not sleep */
    unsigned ctrl_max;        /* EXS_TCP_CTRL_MAX, at least 1 */
    struct exs_list timers;   /* conns with a deadline */
    struct exs_list listeners;
    struct exs_list ack_defer; /* conns owing a deferred ACK (spec: "ACK deferral") */
    int rx_turn;               /* a turn with epoll_wait runs (ACKs may be deferred) */
    unsigned acks_deferred;    /* length of ack_defer; atomic (read by ctx_arm) */
    uint64_t ack_defer_ns;     /* when the oldest deferred ACK was deferred */
    int ack_flush_now;         /* atomic: a consumer wants to sleep: next turn flushes */
    uint64_t timer_armed_ns;   /* the timerfd's deadline, 0 = disarmed or fired */
    int timers_due;            /* the timerfd fired: run the expired deadlines */
    int timer_rearm;           /* a deadline may now be earlier than the armed one */
    /* settings */
    uint64_t emu_delay_ns;
    uint64_t emu_rate_mbps;
    uint32_t rnr_timer_ms;
    uint8_t rnr_retry_max; /* EXS_TCP_RNR_RETRY caps every ep's rnr_retry */
    struct tcp_counters cnt;
    struct exs_counter_set cset;
};

/* ThreadSanitizer: the tests run both ends of a connection in one process, and the NIC's
 * socket calls are raw system calls (exs/util/nocancel.h) that TSan does not see, so the
 * order a frame gives (a WRITE placed, then its ACK sent; the ACK read, then the
 * completion) is lost to it and the application's later use of the memory looks like a
 * race. Each sendmsg releases and each read that returned bytes acquires one process-wide
 * token, as TSan's own socket interceptors would. (Over-synchronizes under TSan only;
 * nothing in other builds.) */
#if defined(__SANITIZE_THREAD__)
extern int exs__tcp_tsan_token;
#endif
#define TCP_TSAN_RELEASE() EXS_TSAN_RELEASE(&exs__tcp_tsan_token)
#define TCP_TSAN_ACQUIRE() EXS_TSAN_ACQUIRE(&exs__tcp_tsan_token)

/* ctx_fork (prov.h): nic_lock held across the fork; the child closes every socket. */
void exs__tcp_ctx_fork(struct exs_prov_ctx *c, int phase);

static inline struct tcp_ctx *tcp_ctx_of(struct exs_prov_ctx *c)
{
    return (struct tcp_ctx *)c;
}

static inline struct tcp_ep *tcp_ep_of(struct exs_prov_ep *e)
{
    return (struct tcp_ep *)e;
}

extern struct exs_prov_ops exs__prov_tcp_ops;

/*
 * What the provider's files share. A function used by one file only is static there; what
 * is declared below is used across files, because the NIC's concerns call each other (a
 * frame read ends a connection, its end flushes the ep, the flush queues completions, a
 * command opens a connection that the next turn reads):
 *  - the ops entry points (ep_create ... post_send, mr_reg ... revoke), named here for the
 *    ops table in tcp_ctx.c only;
 *  - the NIC's services: the completion and cm queues, kicks, epoll and deadlines
 *    (tcp_ctx.c); keys and the copy fence (tcp_mr.c); connections' life and the state
 *    machines (tcp_conn.c); listeners and the hello (tcp_lis.c); endpoints and commands
 *    (tcp_cm.c); framing and transmit (tcp_data.c); receive (tcp_rx.c); link emulation
 *    (tcp_emu.c);
 *  - for the tests (tests/prov, tests/unit): the state tables (conn_state_legal,
 *    ep_state_legal, conn_state_str), hello_prefix_ok, hdr_init.
 */

/* tcp_ctx.c */
int exs__tcp_epoll_add_listener(struct tcp_listener *lis);
void exs__tcp_listener_watch(struct tcp_listener *lis, int on);
/* Run cmd in the caller's thread under nic_lock; its result, or -ESHUTDOWN once
 * ctx_close began. The caller holds no provider lock. */
int exs__tcp_ctx_call(struct tcp_ctx *ctx, struct tcp_cmd *cmd);
void exs__tcp_cq_push(struct tcp_ctx *ctx, struct tcp_ep *ep, const struct exs_prov_cqe *cqe);
void exs__tcp_cq_push_locked(struct tcp_ctx *ctx, struct tcp_ep *ep,
                             const struct exs_prov_cqe *cqe);
void exs__tcp_cm_push(struct tcp_ctx *ctx, const struct exs_prov_cm_event *ev);
/* Queue ep on ctx->work_eps (ctx->lock taken inside). */
void exs__tcp_ep_work(struct tcp_ctx *ctx, struct tcp_ep *ep);
/* After queueing work, with no provider lock held: take the NIC role with trylock
 * and do the work in this thread (a direct write), or, when another thread holds
 * it, write wakefd so that a turn runs after the holder's (spec/provider-tcp.md,
 * "Progress": no lost wake-up). */
void exs__tcp_ctx_kick(struct tcp_ctx *ctx);
void exs__tcp_conn_epoll(struct tcp_conn *conn, uint32_t events);
/* After setting or clearing conn's rnr_at / tx_at / linger_at: (un)list it and, when
 * a deadline may now come before the armed one, have the turn re-arm the timerfd. */
void exs__tcp_conn_timer(struct tcp_conn *conn);

/* tcp_mr.c */
int exs__tcp_mr_reg(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p);
int exs__tcp_mr_dereg(struct exs_prov_mr *mr);
int exs__tcp_grant(struct exs_prov_ep *ep, struct exs_prov_mr *mr, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p);
void exs__tcp_revoke(struct exs_prov_grant *grant);
void exs__tcp_ep_revoke_all(struct tcp_ep *ep);
int exs__tcp_mr_check_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                            unsigned access);
/* NIC: the key for a remote access of ep, with a user reference, or -EACCES. */
int exs__tcp_key_get_remote(struct tcp_ctx *ctx, struct tcp_ep *ep, uint32_t rkey, uint64_t addr,
                            uint64_t len, unsigned access, struct exs_soft_key **key_p);
void exs__tcp_key_put(struct tcp_ctx *ctx, struct exs_soft_key *key);
void exs__tcp_key_put_locked(struct tcp_ctx *ctx, struct exs_soft_key *key);
/* NIC: 0 and the fence raised when key is live (-EACCES when revoked); then copy
 * and lower it with exs__tcp_copy_end. */
int exs__tcp_copy_begin(struct tcp_ctx *ctx, struct exs_soft_key *key);
void exs__tcp_copy_end(struct tcp_ctx *ctx);
/* NIC: the same for local memory (a SEND placed into its receive's sges, a READ response
 * into the READ's destination): 0 and the fence
 * raised when every region of sge[0..n) is live with LOCAL_WRITE, else -EACCES. *lkey and
 * *kills remember the region found (NULL: several) and region_kills then: while no region
 * died since, the next copy of the frame checks nothing more (*kills UINT64_MAX: none). */
int exs__tcp_copy_begin_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                              struct exs_soft_key **lkey, uint64_t *kills);

/* tcp_conn.c */
struct tcp_conn *exs__tcp_conn_new(struct tcp_ctx *ctx, int fd, enum tcp_conn_state state);
struct tcp_txf *exs__tcp_hs_frame(struct tcp_conn *conn, uint8_t type, struct tcp_ep *ep,
                                  const void *pd, uint32_t pdlen);
/* The state machines (spec/provider-tcp.md, "States"): the one place each state changes,
 * checked against the transition table, logged; -EPROTO (and the object failed) outside it. */
int exs__tcp_conn_set_state(struct tcp_conn *conn, enum tcp_conn_state to, const char *why);
int exs__tcp_ep_set_state(struct tcp_ep *ep, enum exs_prov_ep_state to, const char *why);
int exs__tcp_conn_state_legal(enum tcp_conn_state from, enum tcp_conn_state to);
int exs__tcp_ep_state_legal(enum exs_prov_ep_state from, enum exs_prov_ep_state to);
const char *exs__tcp_conn_state_str(enum tcp_conn_state s);
int exs__tcp_ep_established(struct tcp_ep *ep, const void *pd, uint32_t pdlen);
void exs__tcp_ep_unconnected(struct tcp_ep *ep, enum exs_prov_cm_event_type type, int status,
                             const void *pd, uint32_t pdlen);
int exs__tcp_conn_hs_frame(struct tcp_conn *conn);
void exs__tcp_conn_connected(struct tcp_conn *conn);
void exs__tcp_conn_fail(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                        enum tcp_conn_end mode);
void exs__tcp_conn_fail_cqe(struct tcp_conn *conn, int status, uint8_t syndrome, uint32_t psn,
                            enum tcp_conn_end mode, const struct exs_prov_cqe *first);
void exs__tcp_ep_fail(struct tcp_ep *ep, int status, enum tcp_fail_event notify);
void exs__tcp_ep_fail_cqe(struct tcp_ep *ep, int status, enum tcp_fail_event notify,
                          const struct exs_prov_cqe *first);
void exs__tcp_conn_close(struct tcp_conn *conn);

/* tcp_lis.c */
int exs__tcp_listen(struct exs_prov_ctx *ctx, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p);
int exs__tcp_listener_addr(struct exs_prov_listener *lis, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
void exs__tcp_listener_destroy(struct exs_prov_listener *lis);
int exs__tcp_listener_pause(struct exs_prov_listener *lis, int pause);
void exs__tcp_listener_ready(struct tcp_listener *lis);
int exs__tcp_lis_cmd(struct tcp_ctx *ctx, struct tcp_cmd *cmd);
/* The hello (spec/provider-tcp.md, "Handshake"): a WAIT_REQ socket that is no exs peer, or
 * late, is reset (RST) and counted (hello_refused); its deadline passed (timer); whether
 * the n header bytes read so far may begin a CONN_REQ. */
void exs__tcp_conn_refuse(struct tcp_conn *conn, const char *why);
void exs__tcp_conn_hello_late(struct tcp_conn *conn);
int exs__tcp_hello_prefix_ok(const uint8_t *b, uint32_t n);

/* tcp_cm.c */
int exs__tcp_ep_create(struct exs_prov_ctx *ctx, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p);
void exs__tcp_ep_destroy(struct exs_prov_ep *ep);
enum exs_prov_ep_state exs__tcp_ep_state(struct exs_prov_ep *ep);
int exs__tcp_ep_local_addr(struct exs_prov_ep *ep, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
int exs__tcp_connect(struct exs_prov_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen);
int exs__tcp_accept(struct exs_prov_conn_req *req, struct exs_prov_ep *ep, const void *pd,
                    uint32_t pdlen);
int exs__tcp_reject(struct exs_prov_conn_req *req, const void *pd, uint32_t pdlen);
int exs__tcp_disconnect(struct exs_prov_ep *ep);
void exs__tcp_cmd_run(struct tcp_ctx *ctx, struct tcp_cmd *cmd);

/* tcp_data.c */
int exs__tcp_post_send(struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr);
int exs__tcp_post_recv(struct exs_prov_ep *ep, const struct exs_prov_recv_wr *wr);
void exs__tcp_wr_cqe(const struct tcp_ep *ep, const struct tcp_wr *wr, enum exs_prov_wc_status st,
                     struct exs_prov_cqe *cqe);
void exs__tcp_rwr_cqe(const struct tcp_ep *ep, const struct exs_soft_rwr *rwr,
                      enum exs_prov_wc_status st, struct exs_prov_cqe *cqe);
int exs__tcp_iov_fill(struct iovec *iov, int max, const struct exs_prov_sge *seg, int nseg,
                      uint64_t off, uint64_t limit);
void exs__tcp_hdr_init(struct tcp_wire_hdr *h, uint8_t type, uint32_t len);
void exs__tcp_ep_wr_done(struct tcp_ep *ep, struct tcp_wr *wr, enum exs_prov_wc_status st);
/* wr, off every list, back to ep->wr_pool (or freed); ep->lock held. */
void exs__tcp_wr_put_locked(struct tcp_ep *ep, struct tcp_wr *wr);
void exs__tcp_rwr_put_locked(struct tcp_ep *ep, struct exs_soft_rwr *rwr);
void exs__tcp_ep_ack_before(struct tcp_ep *ep, uint32_t upto);
void exs__tcp_ep_tx_fill(struct tcp_ep *ep);
void exs__tcp_ep_take(struct tcp_ep *ep);
void exs__tcp_conn_update_events(struct tcp_conn *conn);
void exs__tcp_conn_tx(struct tcp_conn *conn);
struct tcp_txf *exs__tcp_txf_ctrl(struct tcp_conn *conn, uint8_t type, uint32_t len);
void exs__tcp_txq_push(struct tcp_conn *conn, struct tcp_txf *txf);
void exs__tcp_txf_free(struct tcp_ctx *ctx, struct tcp_txf *txf);

/* tcp_rx.c */
void exs__tcp_conn_rx(struct tcp_conn *conn);
/* Staged bytes of conn wait while it may read: the next turn places them (tcp_rx.c). */
void exs__tcp_conn_rx_again(struct tcp_conn *conn);
/* NIC turn: place the staged bytes of the connections that wait for it. */
void exs__tcp_nic_rx_again(struct tcp_ctx *ctx);
void exs__tcp_conn_ack_flush(struct tcp_conn *conn);
/* Raise SO_RCVLOWAT to the payload still due (the socket was drained half-way through a
 * large payload) or bring it back to 1 (spec/provider-tcp.md, "Implementation"). */
void exs__tcp_conn_lowat(struct tcp_conn *conn);
void exs__tcp_conn_ack_undefer(struct tcp_conn *conn);
void exs__tcp_conn_rnr_resume(struct tcp_conn *conn);
void exs__tcp_conn_hold_hup(struct tcp_conn *conn);
void exs__tcp_rx_release(struct tcp_conn *conn);

/* tcp_emu.c */
int exs__tcp_emu_on(const struct tcp_ctx *ctx);
/* 1 while EXS_EMU_BLACKHOLE stops conn's link: nothing is written or read. */
int exs__tcp_emu_blackholed(const struct tcp_conn *conn);
void exs__tcp_emu_stamp(struct tcp_conn *conn, struct tcp_txf *txf, uint64_t enq_ns);
uint64_t exs__tcp_emu_ready(struct tcp_conn *conn, struct tcp_txf *txf, uint64_t now);
uint64_t exs__tcp_emu_budget(struct tcp_conn *conn, uint64_t now, uint64_t *until_p);
void exs__tcp_emu_sent(struct tcp_conn *conn, uint64_t n, uint64_t now);

#endif
