/* SPDX-License-Identifier: MIT */
/* The per-connection protocol: handshake, credits, control records and the data paths. */
#ifndef EXS_PROTO_PROTO_H
#define EXS_PROTO_PROTO_H

#include <pthread.h>
#include <stdint.h>
#include <sys/exs.h>

#include "exs/proto/violation.h"
#include "exs/proto/wire.h"
#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/job.h"
#include "exs/util/lite_lock.h"
#include "exs/util/list.h"

/*
 * Threads: every function here takes conn->lock itself unless its name ends in
 * _locked. Callbacks (op->done, conn->cb) run with conn->lock held; they must not
 * call back into the conn. Completion and cm handlers run under the progress lock (the
 * progress thread or a driving waiter, spec/threading.md);
 * posting functions run on the caller's thread.
 */

struct exs_conn;
struct exs_reqtrace_tx;
struct exs_reqtrace;
struct exs_datapath;

/* ---- operations ---- */
enum exs_op_kind {
    EXS_OP_SEND = 1,
    EXS_OP_RECV,
    EXS_OP_SHUTDOWN, /* queued behind the sends: SHUTDOWN record after all earlier data */
};

/* Operation states: QUEUED (accepted, nothing posted), POSTED (on the wire or
 * waiting for the peer), DONE (result known; delivered when every earlier op of the
 * same direction is delivered). */
enum exs_op_state {
    EXS_OPS_QUEUED = 0,
    EXS_OPS_ADVERTISED, /* receive: an ADVERT for it went out */
    EXS_OPS_POSTED,
    EXS_OPS_DONE,
};

struct exs_op {
    struct exs_list link; /* in conn->sendq or conn->recvq */
    enum exs_op_kind kind;
    enum exs_op_state state;
    uint8_t *buf;
    size_t len;
    int flags;                    /* MSG_* given by the application */
    struct exs_prov_mr *mr;       /* local registration covering [buf, buf+len) (NULL if len 0) */
    uint32_t lkey;                /* its lkey */
    uint32_t rkey;                /* of grant, while there is one */
    struct exs_prov_grant *grant; /* the peer's one right over the buffer: REMOTE_WRITE from
                                   * its ADVERT, REMOTE_READ from its ANNOUNCE, until done */
    uint64_t seq;                 /* SEQPACKET: message number once assigned */
    uint32_t advert_id;
    uint32_t msg_len;           /* receive: length of the announced message it reads */
    size_t posted;              /* send: bytes handed to WRITEs so far; receive of an
                                 * announced message: bytes handed to its READs */
    uint32_t inflight;          /* its own work requests (send: WRITEs; receive: its
                                 * READs) whose completion was not yet seen: the op
                                 * is not handed back while it is non-zero */
    size_t filled;              /* receive: bytes placed so far (STREAM; SEQPACKET
                                 * pieces; announced: bytes its READs read) */
    uint32_t rd_piece;          /* receive of an announced message: bytes per READ
                                 * (frag_size when it was matched, §6.2) */
    uint32_t phase;             /* STREAM receive: P_A of its ADVERT */
    int cancel;                 /* exs_cancel / exs_close asked for it */
    int announced;              /* SEQPACKET send: ANNOUNCEd, completed by READ_DONE */
    int internal;               /* the library's own op (STREAM send buffer, §7.5): no
                                 * application waits for it, exs_cancel never matches it */
    struct exs_reqtrace_tx *rt; /* SEQPACKET send sampled for request tracing, else NULL */
    /* result */
    ssize_t result; /* bytes, or -1 */
    int err;        /* errno or 0 */
    int rflags;     /* MSG_TRUNC */
    /* owner */
    void (*done)(struct exs_op *op); /* called once, conn->lock held; frees op */
    void *owner;
};

/* ---- connection ---- */
/* The connection's states (spec/states.md, "Connection"): changed only by
 * conn_set_state(), which checks each transition against the table in conn.c and traces
 * it. States from DOWN on are "going away": nothing new is posted. */
enum exs_conn_state {
    EXS_CONN_IDLE = 0,   /* resources allocated, receives posted, not yet connecting */
    EXS_CONN_CONNECTING, /* connect/accept issued, waiting for ESTABLISHED */
    EXS_CONN_CONNECTED,  /* data flows */
    EXS_CONN_CLOSING,    /* exs_close: SHUTDOWN queued or sent, waiting for its SEND */
    EXS_CONN_RESUMING,   /* the path failed mid-stream (policy any, spec/protocol.md §9.2):
                          * operations stay pending while the old endpoint drains and a new
                          * one is made over the fallback context */
    EXS_CONN_DOWN,       /* disconnect issued (close, abort or error): waiting for DISCONNECTED */
    EXS_CONN_REFUSING,   /* active side, the acceptor's hello was bad: disconnect issued,
                          * the connect fails with ECONNREFUSED once DISCONNECTED arrives */
    EXS_CONN_DRAINING,   /* DISCONNECTED seen: waiting for every posted work request to
                          * complete (flushed), so nothing that arrived is lost */
    EXS_CONN_DEAD,       /* every op completed, provider objects gone; only destroy remains */
    EXS_CONN_STATE_COUNT
};

/* The SHUTDOWN record of the send direction (§8), a sub-state of CONNECTED/CLOSING. */
enum exs_conn_txshut {
    EXS_TXSHUT_OPEN = 0, /* sends allowed */
    EXS_TXSHUT_QUEUED,   /* an exs_shutdown op was accepted behind the sends */
    EXS_TXSHUT_APPENDED, /* the record waits in ctrl_out */
    EXS_TXSHUT_POSTED,   /* its control SEND is on the wire */
    EXS_TXSHUT_DONE,     /* its SEND completed (or close gave up on it and resets) */
    EXS_TXSHUT_COUNT
};

/* §7.2 backoff: a direct phase begun by a DRAIN that ends before this many ring sizes
 * went directly doubles the arrivals required before the next request, up to
 * EXS_STREAM_DRAIN_NEED_MAX; a longer one resets it to EXS_STREAM_DRAIN_STREAK. */
/* Ring autotuning (§7.4): the minimum round trip is taken over samples of this long. */
#define EXS_RTT_MIN_WIN_US         (10u * 1000u * 1000u)
#define EXS_STREAM_DRAIN_WORTH     4u
#define EXS_STREAM_DRAIN_NEED_MAX  1024u
/* Ring autotuning (§7.4): the growth factor once the ring limited a whole round trip
 * (three quarters of it or more arrived in one); otherwise it doubles */
#define EXS_RING_GROW_FAST         4u
/* §7 linger: a linger that ended without an ADVERT skips the linger in the next 1, 2, 4 ...
 * direct phases, at most this many; one that an ADVERT ended resets it */
#define EXS_STREAM_LINGER_SKIP_MAX 64u
/* §7 linger: a sender with more sends queued than this does not linger (the walk that
 * counts them stays short) */
#define EXS_STREAM_LINGER_OPS_MAX  256u

/* The receiver's return to direct in an indirect phase (spec/protocol.md §7.2). */
enum exs_stream_drain {
    EXS_STREAM_DRAIN_IDLE = 0,  /* no request in this phase */
    EXS_STREAM_DRAIN_REQUESTED, /* DRAIN sent; no ADVERT until the sender's STOPPED answer */
    EXS_STREAM_DRAIN_STOPPED,   /* answered: advertise once the ring bytes up to stream.drain_pos
                                 * arrived and were copied out */
};

struct exs_conn_cb {
    /* connect/accept finished: err 0, ECONNREFUSED, ETIMEDOUT, ... */
    void (*established)(struct exs_conn *conn, int err);
    /* the conn reached DEAD (DISCONNECTED seen, all ops delivered) */
    void (*dead)(struct exs_conn *conn);
    /* The cut-over (spec/protocol.md §9.2); NULL: the conn is never cut over. */
    /* active side: the context and address of the new path. 0 or -errno. */
    int (*resume_addr)(struct exs_conn *conn, struct exs_prov_ctx **ctx_p,
                       struct sockaddr_storage *addr, socklen_t *len_p);
    /* op's buffer registered on ctx (the new path's): op->mr and op->lkey replaced, the
     * old registration released. 0 or -errno. */
    int (*resume_mr)(struct exs_conn *conn, struct exs_op *op, struct exs_prov_ctx *ctx);
};

struct exs_conn_params {
    int sock_type;      /* SOCK_STREAM or SOCK_SEQPACKET */
    uint32_t credits;   /* receives pre-posted for the peer (3..4095) */
    uint32_t ring_size; /* SO_RCVBUF, multiple of EXS_RING_SLOT */
    uint32_t eager_max; /* SEQPACKET eager threshold */
    int xfer_mode;      /* EXS_XFER_* */
    uint32_t max_reads; /* outstanding RDMA READs per connection */
    uint32_t batch_max; /* EXS_BATCH_MAX: largest batched ring write, bytes; 0 = no batching */
    int autotune;       /* STREAM: the ring may grow and shrink (§7.4); 0 after SO_RCVBUF */
    uint32_t sndbuf;    /* STREAM send buffer (§7.5), bytes; 0 = every send zero-copy */
    uint32_t copy_max;  /* STREAM sends up to this many bytes may be copied into it */
    int resumable;      /* hello feature RESUMABLE: may be cut over to the fallback (§9.2) */
    int shm;            /* hello feature SHM: the fallback is shm, switched to on one host
                         * (spec/provider-shm.md, Chosen by itself; needs resumable) */
};

/* Batched ring writes in flight at once per connection (each has its staging buffer). */
#define EXS_BATCH_SLOTS     4u
/* The elastic threshold never shrinks below this (nor above batch_max). */
#define EXS_BATCH_FLOOR     1024u
/* Largest batch_max accepted (EXS_BATCH_MAX). */
#define EXS_BATCH_MAX_LIMIT (1u << 20)

/* SO_SNDBUF / EXS_SNDBUF bounds (the STREAM send buffer, §7.5; 0 = off). */
#define EXS_SNDBUF_MIN 4096u
#define EXS_SNDBUF_MAX (64u << 20)

/* Ring slots: every eager message occupies a multiple of this (at least one slot), so a
 * receiver holds at most ring_size / EXS_RING_SLOT unconsumed messages. */
#define EXS_RING_SLOT 64u

struct exs_pending_msg; /* an arrived, unmatched SEQPACKET message */
struct exs_rsm_pend;    /* a resume request on trial (resume.c) */

enum {                       /* exs_conn.resume.keys */
       EXS_RSM_KEY_OWN = 1,  /* ours drawn and sent in our SESSION record */
       EXS_RSM_KEY_PEER = 2, /* the peer's taken from its SESSION record */
};

struct exs_advert {
    uint64_t addr;
    uint32_t len;
    uint32_t rkey;
    uint64_t seq;
    uint32_t id;
    uint32_t phase;
    int flags;
    uint32_t filled; /* STREAM WAITALL: bytes written into it so far */
};

/* The modules' parts of a connection: the state sections of their headers, each a
 * struct named for its module (spec/proto-layout.md). */
#define EXS_PROTO_STATE
#include "exs/proto/keepalive.h"
#include "exs/proto/resume.h"
#include "exs/proto/seqpkt.h"
#include "exs/proto/shm_switch.h"
#include "exs/proto/stream.h"
#undef EXS_PROTO_STATE

struct exs_conn {
    struct exs_lite_lock lock; /* a futex mutex (exs/util/lite_lock.h); zeroed: free */
    enum exs_conn_state state;
    int err; /* latched errno for later operations */
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    const struct exs_conn_cb *cb;
    void *owner;              /* the api socket */
    struct exs_job owner_job; /* the owner's, e.g. to destroy it under the progress lock */
    struct exs_conn_params p;
    const struct exs_datapath *dp; /* STREAM or SEQPACKET (conn.h), chosen at creation */

    /* local buffers */
    uint8_t *ring;                     /* hidden receive ring, written by the peer */
    struct exs_prov_mr *ring_mem;      /* its memory (mem_alloc, local registration) */
    struct exs_prov_grant *ring_grant; /* the peer's REMOTE_WRITE over it (from ESTABLISHED) */
    struct exs_prov_mr *ctrl_mem;      /* rx_bufs then tx_bufs (mem_alloc) */
    uint8_t *rx_bufs;                  /* credits x EXS_WIRE_CTRL_MAX receive slots */
    struct exs_prov_mr *rx_mr;         /* = ctrl_mem */
    uint8_t *tx_bufs;                  /* control send slots */
    struct exs_prov_mr *tx_mr;         /* = ctrl_mem */
    uint32_t tx_slots, tx_free_top;
    uint32_t *tx_free; /* stack of free control send slots */
    struct exs_ctrl_tx {
        struct exs_op *op; /* exs_shutdown op completed by this send */
        int shut;          /* this send carried the SHUTDOWN record */
        uint64_t t_us;     /* when it was posted (round-trip time, §7.4) */
    } * tx_op;             /* per control send slot */

    /* peer, from its hello (ring_rkey from its RING record) */
    struct exs_wire_hello peer;
    int peer_ring_keyed; /* its RING record arrived: its ring may be written */

    /* credits (§3) */
    uint32_t credits;  /* messages we may still send */
    uint32_t owed;     /* receives re-posted, not yet reported to the peer */
    uint32_t rx_defer; /* a run's last receive, its re-post after its event (slot + 1; 0:
                          none; dispatch.c, conn_after_cqes_locked) */

    /* the peer's ring, as its writer */
    uint64_t wr_tail;     /* bytes used in the peer's ring (with skips) */
    uint64_t wr_consumed; /* bytes the peer reported consumed */

    /* our ring, as its reader */
    uint64_t rd_arrived;  /* bytes arrived (with skips) */
    uint64_t rd_consumed; /* bytes copied out (with skips) */
    uint64_t rd_reported; /* rd_consumed last sent in an ACK */

    /* sending side */
    struct exs_list sendq;        /* send and shutdown ops, posting order */
    struct exs_op *sendq_settled; /* this op and every one before it in sendq needs no
                                   * more sending (done, or posted: STREAM whole), so
                                   * send progress starts after it; NULL: at the head
                                   * (a RESUME's rewind clears it) */
    struct exs_op *dlv_run;       /* the last op of the run of internal ops at sendq's
                                   * head, known (exs__conn_deliver_locked); NULL: none */
    uint32_t sendq_app;           /* ops of the application in sendq (not internal):
                                   * 0 lets exs_send copy at the post (exs__conn_send_copy;
                                   * atomic stores: exs__conn_copy_likely reads it unlocked) */
    uint64_t tx_seq;              /* next message number to send */
    struct exs_advert *adverts;   /* received ADVERTs, a ring */
    uint32_t adv_cap, adv_head, adv_count;
    uint64_t mem_held;           /* malloc'd bytes charged to the memory account
                                  * (§9.3): arrays, ADVERTs, pending, memo */
    uint64_t mem_arrays;         /* ... of which the arrays made at creation and
                                  * the ADVERT queue's growth */
    enum exs_conn_txshut txshut; /* the SHUTDOWN record (conn_set_txshut) */
    struct exs_op *shut_op;      /* the exs_shutdown op of the record in ctrl_out */
    int active;                  /* this side connected (vs accepted) */
    uint32_t wr_out;             /* work requests posted, completion not yet seen */
    int disc_err;                /* DRAINING: the error DISCONNECTED carried */

    /* receiving side */
    struct exs_list recvq;   /* receive ops, posting order */
    struct exs_list pending; /* arrived unmatched messages */
    uint32_t pending_count;
    struct exs_list pending_free; /* entries kept for reuse (still charged to the memory
                                   * account), at most EXS_PENDING_KEEP */
    uint32_t pending_free_n;
    uint32_t pending_announced; /* of which announced */
    uint64_t rx_seq;            /* messages arrived */
    uint64_t rx_matched;        /* messages matched to receives */
    uint32_t next_advert_id;
    uint32_t reads;    /* RDMA READs in flight */
    uint64_t *rd_owed; /* READ_DONE records not yet appended (max_reads) */
    uint32_t rd_owed_count;
    int peer_shut;
    uint64_t peer_total; /* messages the peer sent in all (after SHUTDOWN) */

    /* control records waiting for a SEND */
    uint8_t ctrl_out[EXS_WIRE_CTRL_MAX];
    uint32_t ctrl_len;

    struct exs_stream_state stream; /* STREAM (spec/protocol.md §7; stream.c) */

    /* sender batching (spec/protocol.md §6.1, §7.1) */
    uint32_t ring_wr_out;   /* ring (INDIRECT) writes posted, not completed */
    uint32_t batch_thresh;  /* elastic threshold, bytes (0: batching off) */
    int batch_now;          /* exs_close: a gathered run leaves at once */
    uint64_t cqe_stamp;     /* completions handled (batch wait cache) */
    struct exs_batch_wait { /* the run last held back by synchronization-
                             * ahead, valid while nothing but appended
                             * sends changed (batch.c) */
        struct exs_op *first, *last;
        uint32_t n, bytes, thresh, ring_wr_out;
        uint64_t cqe_stamp;
    } bwait;
    struct exs_prov_mr *batch_mem; /* EXS_BATCH_SLOTS staging buffers of batch_max
                                    * bytes, allocated at the first batch */
    struct exs_batch_slot {
        struct exs_op *first; /* first op of the batch in sendq, NULL: free */
        uint32_t nops;        /* ops it carries */
    } batch_slot[EXS_BATCH_SLOTS];

    /* STREAM send buffer (spec/protocol.md §7.5, stage.c): small sends are copied into it
     * and completed at once; internal ops in sendq carry the copies */
    struct exs_prov_mr *stg_mem; /* p.sndbuf bytes, allocated at the first copy */
    uint64_t stg_head;           /* buffer position released so far */
    uint64_t stg_tail;           /* buffer position allocated so far */
    struct exs_op *stg_last;     /* the newest internal send op, NULL: none */
    uint32_t stg_cap;            /* the most bytes one internal op gathers (exs__stage_cap),
                                  * set with stg_mem */
    int stg_pending;             /* a send that may be copied waits (no room
                                  * yet, or an earlier send waits): refill */
    void *stg_free;              /* internal ops kept for reuse (stage.c): no calloc and
                                  * free per copied run; NULL: none */
    uint32_t stg_free_n;         /* how many; (uint32_t)-1 once released: none kept */
    /* cost cuts taken (conn->lock; plain counts, not process counters: a locked add per
     * message is what they save): STREAM posts handed back by delivery alone, runs of
     * data-write completions that took the send side's kick alone, receive posts that
     * took the receive side's (proto-layout.md) */
    uint64_t posts_staged_fast;
    uint64_t posts_copied; /* exs_send's sends ended at the post, no op (exs__conn_send_copy,
                            * exs__conn_send_now_post) */
    uint64_t kicks_tx;
    uint64_t kicks_rx;
    uint64_t rx_posts_idle; /* SEQPACKET receives posted with nothing to place: no pass */
    uint64_t rx_taken;      /* SEQPACKET eager messages a waiting receive took at their arrival */
    uint64_t rx_handed;     /* of those, receives handed back at the arrival too */

    /* keepalive and deadlines (spec/protocol.md §9), progress thread only */
    uint64_t dl_start_ns;                 /* connect / accept began (handshake deadline) */
    int hs_down;                          /* went DOWN before ESTABLISHED (failure, close,
                                           * abort): the handshake deadline still ends it */
    struct exs_keepalive_state keepalive; /* keepalive (spec/protocol.md §9.1; keepalive.c) */
    uint64_t tx_moved;                    /* data writes completed (send stall check) */
    uint64_t tx_moved_seen;               /* tx_moved when tx_stall_ns was set */
    uint64_t tx_stall_ns;                 /* queued sends without progress since; 0: none */

    /* ring autotuning (spec/protocol.md §7.4), STREAM. ring, ring_mem, ring_grant and
     * p.ring_size above are the region the peer writes now. As the ring's owner: */
    uint32_t ring_init;                 /* p.ring_size at creation (shrink target) */
    struct exs_autotune_state autotune; /* ring autotuning (spec/protocol.md §7.4; stream_ring.c) */
    struct exs_seqpkt_state
        seqpkt; /* SEQPACKET (spec/protocol.md §6, §9.2; seqpacket.c, seqpkt_ann.c) */
    /* the work-request cap (spec/protocol.md §6.3) */
    uint32_t sq_out; /* signaled send work requests at the provider, not completed */
    /* unsignaled writes (spec/protocol.md §6.4, conn.c) */
    uint32_t quiet_run;      /* posted since the last signaled send work request */
    uint32_t quiet_live;     /* that may still hold a provider slot (<= EXS_QUIET_MAX): all
                              * but quiet_run retire once no signaled one is outstanding */
    int quiet_armed;         /* a receive completed since the last one (an answer came) */
    struct exs_op *quiet_op; /* the op whose write just went unsignaled: its caller
                              * finishes it (exs__conn_quiet_done_locked) */
    uint32_t wrq_count;      /* of wrq */
    struct exs_list wrq;     /* send work requests beyond EXS_WR_MAX, in order */

    struct exs_sock_stats stats;
    /* its shard of the process counters "proto" (conn.c; EXS_PROTO_CNT_INC, conn->lock):
     * a plain count per message instead of a locked add on the shared field; the set
     * reads the sum over the live conns plus what the freed ones folded in */
    struct exs_proto_counters {
        uint64_t rnr_events;        /* receiver-not-ready completions: must stay 0 (§3.1) */
        uint64_t nops_sent;         /* NOPs sent by the window check */
        uint64_t writes_inline;     /* data writes posted EXS_PROV_SEND_INLINE (<= max_inline) */
        uint64_t posts_fast;        /* sends put on the wire by the post's fast path */
        uint64_t sends_unsignaled;  /* data writes posted unsignaled, op done at post (§6.4) */
        uint64_t unsignaled_failed; /* error or flush completions of unsignaled writes */
    } cnt;
    struct exs_counter_set cnt_set; /* cnt as a shard of the set (exs__counters_part_add) */
    struct exs_reqtrace *rt;        /* request tracing state (reqtrace.c), NULL: none */
    uint64_t created_ns;            /* exs__now_ns() at create (exsctl stat: age) */
    /* cut-over (spec/protocol.md §9.2, resume.c) */
    uint64_t sess_token;     /* the SESSION token (0: none, not resumable) */
    int resume_noted;        /* its path failure was counted */
    uint64_t resume_tx_done; /* STREAM: bytes of sends whose every write
                              * completed, a prefix of tx_seq; SEQPACKET:
                              * one past the highest message completed
                              * (RESUME check) */
    struct exs_resume_state
        resume; /* the cut-over (spec/protocol.md §9.2; resume.c, resume_sess.c) */
    /* the first protocol violation of the peer, kept as the connection's reason
     * (violation.c; EXS_SO_ERROR_REASON, exsctl stat) */
    struct exs_pv_state pv;
    /* shared memory chosen by itself (spec/provider-shm.md; shm_switch.c) */
    struct exs_shmsw_state shmsw;
};

/* A connection's state for the control endpoint (exsctl stat), one consistent snapshot. */
struct exs_conn_info {
    const char *state;           /* conn state name (static string) */
    const char *phase;           /* STREAM sender: "direct" / "indirect"; else "" */
    uint32_t credits;            /* messages we may still send */
    uint32_t peer_credits;       /* the peer's receives (our initial credits) */
    uint32_t wr_out;             /* work requests posted, not completed */
    uint32_t pending;            /* arrived messages not yet matched to a receive */
    uint32_t adverts_held;       /* ADVERTs received, not used yet */
    uint32_t wr_queued;          /* send work requests waiting behind EXS_WR_MAX */
    uint64_t age_ms;             /* since the conn was created */
    const char *device;          /* its context's exs__prov_device: "tcp", "mlx5_0:1" */
    struct exs_sock_stats stats; /* as exs__conn_stats */
    uint64_t posts_copied;       /* exs_send's sends ended at the post, no op (STREAM copies,
                                  * SEQPACKET eager writes) */
};

/* Create a conn with its endpoint, ring and pre-posted receives (state IDLE).
 * Errors: -ENOMEM, provider errors. */
int exs__conn_create(struct exs_prov_ctx *ctx, const struct exs_conn_params *p,
                     const struct exs_conn_cb *cb, void *owner, struct exs_conn **conn_p);
/* Free everything; the conn must be DEAD or IDLE. Progress thread only (ep_destroy). */
void exs__conn_destroy(struct exs_conn *conn);
/* 1 when nothing of the connection remains to wait for (DEAD, or IDLE: never connected). */
int exs__conn_is_dead(struct exs_conn *conn);

/* Handshake: our hello for connect/accept private data. */
void exs__conn_hello(struct exs_conn *conn, struct exs_wire_hello *hello);
/* Check a peer hello; 0 or the exs_wire_reject_reason to refuse it with. */
int exs__conn_hello_check(const void *pd, uint32_t len, int sock_type);

/* Active and passive connection set-up (caller's thread). */
int exs__conn_connect(struct exs_conn *conn, const struct sockaddr *addr, socklen_t len);
/* peer_pd: the connection request's private data, already checked. */
int exs__conn_accept(struct exs_conn *conn, struct exs_prov_conn_req *req, const void *peer_pd);

/* Listener side of a cut-over (spec/protocol.md §9.2), progress thread: a resume request
 * (its hello checked, feature bit 7 and flag RESUME) came in on ctx with private data pd
 * (len bytes: exs_wire_resume_req). The passive connection its token names (sock_type)
 * puts it on trial without being disturbed: a new path is made on the side and accepted
 * with the passive side's proof; only the peer's valid AUTH record on it makes the
 * connection leave its old path for the new one. 0: req is taken (accepted; the caller
 * never touches it again); else the reject reason for the caller to refuse req with
 * (EXS_WIRE_REJ_RESUME: unknown token, not resumable, a request already on trial, too
 * many on trial in the process, no resources). */
int exs__conn_resume_request(struct exs_prov_ctx *ctx, struct exs_prov_conn_req *req,
                             const void *pd, uint32_t len, int sock_type);

/* Progress thread: provider events for this conn. */
void exs__conn_on_cqe(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
/* A polled array of n completions (any conns): each run of consecutive completions of
 * one conn is handled under one lock with one progress pass at its end (cqe->ep->user
 * is the conn). Same effect as exs__conn_on_cqe on each, with less work per completion. */
void exs__conn_on_cqes(const struct exs_prov_cqe *cqe, int n);
void exs__conn_on_cm(struct exs_conn *conn, const struct exs_prov_cm_event *ev);

/* Operations (caller's thread). Errors: -ENOTCONN, -EPIPE, -ECONNRESET (latched). On
 * success the op belongs to the conn until op->done. */
int exs__conn_post(struct exs_conn *conn, struct exs_op *op);
/* exs_send's copy at the post (spec/proto-layout.md, "A send that ends at its post"): a
 * STREAM send of len bytes that the send buffer (§7.5) takes and finishes at once goes in
 * without an op. exs__conn_copy_likely, without a lock: may it (0 < len <= copy_max, set at
 * creation; no send of the application in sendq, as last stored)? A caller that would
 * undo work on a refusal asks it first; every caller of exs__conn_send_copy asks it first
 * (the length is not looked at again). exs__conn_send_copy takes conn->lock and copies
 * the bytes when it may now (CONNECTED, the sending side open, a send buffer with room, no
 * send of the application in sendq, no request tracing): 1, the lock still held, the
 * posting side's work done (the send is finished; its event, which the caller posts before
 * exs__conn_unlock, follows every earlier send's); else 0, the lock given back and
 * nothing changed (the send takes exs__conn_post). */
static inline int exs__conn_copy_likely(const struct exs_conn *conn, size_t len)
{
    return len - 1 < conn->p.copy_max && !__atomic_load_n(&conn->sendq_app, __ATOMIC_RELAXED);
}
int exs__conn_send_copy(struct exs_conn *conn, const void *buf, size_t len);
/* exs_send's SEQPACKET send that ends at its post (spec/proto-layout.md, "A SEQPACKET
 * send that ends at its post"): a message of 0 < len bytes below the eager limit written
 * inline and unsignaled into the peer's ring with no op, done at once.
 * exs__conn_now_likely, without a lock: no send of the application in sendq, as last
 * stored. exs__conn_send_now_begin takes conn->lock and answers whether it may now (the
 * post's fast path with nothing in sendq, the write unsignaled, no request tracing): 1,
 * the lock held and nothing changed (the caller may still give up: exs__conn_unlock); else
 * 0, the lock given back. exs__conn_send_now_post then writes it: 1 done (its event, which
 * the caller posts before exs__conn_unlock, follows every earlier send's); 0 the provider
 * refused, nothing changed; the lock held either way. A send refused takes exs__conn_post. */
static inline int exs__conn_now_likely(const struct exs_conn *conn)
{
    return !__atomic_load_n(&conn->sendq_app, __ATOMIC_RELAXED);
}
int exs__conn_send_now_begin(struct exs_conn *conn, size_t len);
int exs__conn_send_now_post(struct exs_conn *conn, const void *buf, size_t len, int flags);
static inline void exs__conn_unlock(struct exs_conn *conn)
{
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}
/* Cancel ops matching owner-side ahandle via the predicate; returns how many completed
 * at once. From DOWN on, an op with work requests of its own outstanding (inflight) is
 * only marked: it completes with ECANCELED once their completions have been seen. */
int exs__conn_cancel(struct exs_conn *conn, int (*match)(struct exs_op *op, void *arg), void *arg);
/* Close: cancel everything outstanding, send SHUTDOWN if connected, disconnect. The
 * conn reaches DEAD later (cb->dead). */
void exs__conn_close(struct exs_conn *conn);
/* Abort at once (exs_fini): disconnect without SHUTDOWN. */
void exs__conn_abort(struct exs_conn *conn);
void exs__conn_abort_locked(struct exs_conn *conn); /* from a conn callback */

/* Progress thread: the conn's periodic check (spec/protocol.md §9). CONNECTING: the
 * handshake deadline (EXS_CONNECT_TIMEOUT_MS from connect / accept): past it the conn
 * dies and cb->established gets ETIMEDOUT. CONNECTED, CLOSING: keepalive with interval
 * ka_ms (0: off; a probe after a silent interval, the peer dead after
 * EXS_KEEPALIVE_PROBES unanswered intervals) and the send stall deadline
 * (EXS_SEND_TIMEOUT_MS); either kills the conn at once with ETIMEDOUT (every operation
 * completes, the endpoint and the grants are released) and calls cb->dead. Returns the
 * milliseconds until the next check is due, 0 when none is (the conn is past them, or
 * every check is off). */
uint64_t exs__conn_timer(struct exs_conn *conn, uint64_t ka_ms);

/* Statistics snapshot. */
void exs__conn_stats(struct exs_conn *conn, struct exs_sock_stats *st);
/* Snapshot for the control endpoint (takes the conn lock). */
void exs__conn_info(struct exs_conn *conn, struct exs_conn_info *info);
/* The connection's path and why it is there (EXS_SO_PATH, exsctl stat): one line
 * "<provider>: <reason>" (spec/provider-shm.md, Chosen by itself) into buf, cut to len;
 * returns the bytes with the NUL. Takes conn->lock. */
int exs__conn_path(struct exs_conn *conn, char *buf, size_t len);

/* The process counters of the protocol (set "proto", struct exs_proto_counters in struct
 * exs_conn): what the freed conns counted; the set's values add every live conn's shard
 * (conn->cnt), so exsctl and metrics read the exact sum. */
extern struct exs_proto_counters exs__proto_cnt;
/* Counter name of the set "proto" now, exact: the freed conns' and every live one's. */
uint64_t exs__proto_counter(const char *name);

/* Live conns (leak checks). */
int exs__conn_live_count(void);
/* In a forked child (exs/api/fork.c): the parent's connections are not the child's (the
 * live count, the ring budget and the resume registry start empty). */
void exs__proto_fork_child(void);

#endif
