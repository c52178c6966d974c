/* SPDX-License-Identifier: MIT */
/* Private structures of the shm provider: RC verbs between processes of one host over shared
 * memory rings, cross-memory-attach copies and a unix-socket rendezvous. */
#ifndef EXS_PROV_SHM_SHM_H
#define EXS_PROV_SHM_SHM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "exs/util/lite_lock.h"
#include "exs/prov/prov.h"
#include "exs/prov/soft/soft_cm.h"
#include "exs/prov/soft/soft_cq.h"
#include "exs/prov/soft/soft_keys.h"
#include "exs/prov/soft/soft_wr.h"
#include "exs/util/counters.h"
#include "exs/util/list.h"
#include "exs/util/util.h"
#include "exs/util/tsan.h"

/*
 * spec/provider-shm.md is the normative text. In short:
 *
 * A connection is one memfd (created, sized and sealed by the active side, passed with
 * SCM_RIGHTS over a unix SOCK_SEQPACKET socket that stays open for the connection's
 * life) holding, for each side s (0 active, 1 passive), one cache line written only by s
 * (struct shm_line) and one ring written only by s (its requests, read by the peer); the
 * rings' size is the smaller of the two sides' EXS_SHM_RING_KB (the REQ and the ACCEPT
 * carry it, checked before any mapping).
 * Requests (SEND, WRITE, READ) are records in the ring; the responder carries them out
 * in order, copying payload either from the ring (inline records, and the fragments of
 * larger SENDs and WRITEs, which the requester copies in while the responder copies the
 * previous one out) or with process_vm_readv / process_vm_writev between its own validated
 * memory and the requester's sges (READ), and then publishes in its line how many requests are done
 * (ack) or which one failed (nak). Nothing else crosses: the socket carries the handshake and
 * DISCONNECT, and its end of file (the kernel closes it when the peer process dies,
 * SIGKILL included) and a pidfd of the peer say the peer is gone.
 *
 * A producer that finds its ring empty SHM_HOT_WINDOW or more into a lap writes a PAD record
 * to the lap's end and goes on at the ring's start (the hot window: a ping-pong's records
 * stay on lines both cores have); the consumer checks it and skips to the next lap.
 *
 * Everything read from the shared memory is read once into a local and checked: a
 * lying peer ends its own connection (-EPROTO), never reaches memory a grant did not
 * give it and never makes this process crash or block.
 *
 * Locks: nic_lock (the NIC role: conns, listeners, sockets, rings as consumer) ->
 * ctx->lock (eps, their queues, completion and cm queues, ring as producer, keys) .
 * Payload from the ring (inline records, fragments) is copied by the nic_lock holder
 * under ctx->lock (at most 64 KiB per hold); process_vm_* copies run without ctx->lock,
 * inside the copy fence (ctx->keys, exs/prov/soft/soft_keys.c), which revoke and
 * mr_dereg wait for (one copy of at most SHM_COPY_CHUNK bytes), never for a peer.
 */

#define SHM_MAGIC        0x45585348u /* "EXSH" */
/* 2: the lines 256 bytes apart, the sleeping flags on lines of their own; 3: fragments;
 * 4: rings of 4 MiB; 5: the ring size chosen per connection (the REQ's ring_bytes, the
 * ACCEPT's agreed size); 6: a record says itself that it is written (its size, stored
 * last; the slot after it zeroed first), no head in the line; 7: the hot window (a PAD
 * record from an empty ring's position to the lap's end, shm_data.c) */
#define SHM_VERSION      7
#define SHM_SLOT         64u /* ring records are whole cache lines */
/* Ring sizes (EXS_SHM_RING_KB, whose bounds in exs/util/params.c are these): per direction,
 * a power of two; the connection's rings are the smaller of the two sides' choices. The
 * default: rings of 4 MiB (spec/provider-shm.md, Rings of 4 MiB); the smallest still holds
 * an inline record of the largest in a quarter ring (shm_data.c). */
#define SHM_RING_DEFAULT (1u << 22)
#define SHM_RING_MIN     (1u << 16)
#define SHM_RING_MAX     (1u << 28)
#define SHM_SEG_HDR      4096u /* the two lines and the two flags, then the rings */
#define SHM_LINE_STRIDE                                                                            \
    256u /* side s's line at s * 256: not one pair of the adjacent-line prefetch */
#define SHM_FLAG_OFF         1024u /* side s's sleeping flag at 1024 + s * 256, alone on its line */
/* a segment's bytes: the header, then ring 0 (the active side's requests) and ring 1, each
 * of ring bytes (the active side's choice; the connection uses the first agreed bytes of each) */
#define SHM_SEG_BYTES(_ring) (SHM_SEG_HDR + 2u * (uint32_t)(_ring))
#define SHM_REC_HDR          32u
#define SHM_RING_INLINE      4096u /* payloads up to this ride in the ring */
#define SHM_MAX_SGE          16u
/* payload of a fragment (records of 64 KiB + 64): a quarter ring in smaller rings
 * (shm_conn.frag_bytes) */
#define SHM_FRAG_BYTES       65536u
/* a sleeping requester's doorbell each ring / SHM_KICK_DIV freed within a turn (half a
 * ring: the half still queued keeps the responder copying while the requester wakes up;
 * shm_take_requests) */
#define SHM_KICK_DIV         2u
#define SHM_REC_MAX          (SHM_REC_HDR + SHM_FRAG_BYTES)
#define SHM_MAX_WR           4096u
#define SHM_MAX_INLINE       256u
#define SHM_CQ_MAX           (1u << 22)
#define SHM_CQ_SIZE          65536u
#define SHM_PD_MAX           256u
#define SHM_MAX_RD           16u        /* READs outstanding per ep */
#define SHM_COPY_CHUNK       (1u << 20) /* one process_vm call; the fence is re-checked between */
#define SHM_TURN_RECS        256u       /* records carried out per connection per turn */
#define SHM_IDLE_LOOK        64u        /* a busy poller's idle turns per look at the descriptors */
#define SHM_PORT_LO          32768u
#define SHM_PORT_HI          60999u
/* The hot window (spec/provider-shm.md, "The hot window"): a producer that finds its ring
 * empty at a ring offset of at least this writes a PAD record to the lap's end, so its next
 * record starts at offset 0 and a ping-pong's records stay on the first lines of the ring */
#define SHM_HOT_WINDOW       16384u

/* record types */
enum { SHM_REC_SEND = 1, SHM_REC_WRITE = 2, SHM_REC_READ = 3, SHM_REC_PAD = 4 };
/* record flags */
enum { SHM_RF_IMM = 1u << 0, SHM_RF_INLINE = 1u << 1, SHM_RF_FRAG = 1u << 2 };
/* NAK syndromes (as the tcp provider's) */
enum { SHM_SYN_RNR_EXC = 1, SHM_SYN_REM_ACCESS = 2, SHM_SYN_REM_INV = 3, SHM_SYN_REM_OP = 4 };

/* A ring record header (then inline payload or nsge remote sges of 16 bytes). Host order. */
struct shm_rec {
    uint8_t type;
    uint8_t flags;
    uint8_t nsge;
    uint8_t rsvd;
    uint32_t psn;
    uint32_t len; /* payload bytes (READ: bytes to read) */
    uint32_t imm;
    uint64_t raddr; /* WRITE, READ */
    uint32_t rkey;  /* WRITE, READ */
    uint32_t size;  /* record bytes, a multiple of SHM_SLOT */
};

struct shm_rsge {
    uint64_t addr;
    uint64_t len;
};

/* The line a side writes (the peer only reads it). */
struct shm_line {
    uint64_t rsvd0;   /* 0 (version 5's head: the records announce themselves, shm_rec.size) */
    uint64_t tail;    /* bytes of the peer's ring consumed */
    uint32_t ack;     /* the peer's requests done: psn of the next not done */
    uint32_t nak_syn; /* 0, or the syndrome of request nak_psn (set once) */
    uint32_t nak_psn;
    uint32_t rsvd;
    uint8_t pad[SHM_SLOT - 32];
};

/* A side's sleeping flag, on a line of its own: written when the side goes to sleep or
 * wakes, read by the peer after each publication (a line that changes only then stays in
 * the peer's cache, where the hot line beside head, tail and ack would not). */
struct shm_flag {
    uint32_t sleeping; /* this side is about to sleep: write its bell after a change */
    uint8_t pad[SHM_SLOT - 4];
};

_Static_assert(SHM_FLAG_OFF + 2 * SHM_LINE_STRIDE <= SHM_SEG_HDR &&
                   sizeof(struct shm_line) == SHM_SLOT && sizeof(struct shm_flag) == SHM_SLOT,
               "the segment's header: two lines and two flags");

/* Handshake and DISCONNECT messages on the unix socket (one datagram each). */
enum { SHM_HS_REQ = 1, SHM_HS_ACCEPT = 2, SHM_HS_REJECT = 3, SHM_HS_DISC = 4 };
enum { SHM_HSF_CLOSED = 1u << 0 };

struct shm_hs {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint8_t flags;
    uint8_t rnr_retry;
    uint8_t rnr_timer_ms;
    uint8_t rsvd;
    uint16_t src_port;   /* REQ: the active side's port as it shows it (its ep_local_addr) */
    uint32_t seg_bytes;  /* REQ: the memfd's size, SHM_SEG_BYTES(ring_bytes) */
    uint32_t ring_bytes; /* REQ: each ring's room in the segment (the active side's choice);
                          * ACCEPT: the bytes of each both sides use, at most the REQ's */
    uint32_t pdlen;
    uint8_t pd[SHM_PD_MAX];
};
#define SHM_HS_FIXED (sizeof(struct shm_hs) - SHM_PD_MAX)

struct shm_counters {
    uint64_t recs_tx;
    uint64_t recs_rx;
    uint64_t bytes_tx;
    uint64_t bytes_rx;
    uint64_t inline_rx;
    uint64_t copies;
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
    uint64_t hello_refused;
    uint64_t rendezvous_closed;
    uint64_t peer_deaths;
    uint64_t ring_full;
    uint64_t ring_pads;
    uint64_t bells_tx;
    uint64_t bells_rx;
    uint64_t turns;
    uint64_t collects;
    uint64_t sleeps;
    uint64_t ring_mem;
    uint64_t direct_cqes;
};

/* A counter written only by the holder of one lock (nic_lock: the responder's and the
 * turns'; ctx->lock: the producer's): a relaxed load and store, no locked read-modify-write
 * (on x86 a lock-prefixed add, which waits for the store buffer: behind a ring record's
 * stores to lines the peer reads, that is their transfer). Readers load it relaxed, as
 * any counter. */
#define SHM_CNT_ADD_OWNED(_field, _n)                                                              \
    __atomic_store_n(&(_field), __atomic_load_n(&(_field), __ATOMIC_RELAXED) + (uint64_t)(_n),     \
                     __ATOMIC_RELAXED)
#define SHM_CNT_INC_OWNED(_field) SHM_CNT_ADD_OWNED(_field, 1)

struct shm_ctx;
struct shm_ep;
struct shm_conn;

struct shm_wr {
    struct exs_list link; /* ep->sq_pend, then ep->sq */
    uint64_t wr_id;
    uint8_t opcode;
    uint8_t signaled;
    uint8_t fence;
    uint8_t bad;    /* local protection error found at post time */
    uint8_t inl;    /* payload copied at post time (after sge[num_sge]) */
    uint8_t pooled; /* a block of ep->wr_pool (SHM_WR_POOL_LEN bytes), else its own size */
    int num_sge;
    uint32_t len;
    uint32_t imm;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t psn;
    uint32_t sent; /* payload bytes written into the ring as fragments */
    struct exs_prov_sge sge[];
};

/* Pooled blocks (exs_soft_pool, per endpoint): a send request whose sges and inline
 * payload fit in SHM_WR_POOL_LEN, a receive with up to SHM_RWR_POOL_SGE sges; larger ones
 * are malloc'ed for themselves. */
#define SHM_WR_POOL_SGE 4
#define SHM_WR_POOL_LEN                                                                            \
    (sizeof(struct shm_wr) + SHM_WR_POOL_SGE * sizeof(struct exs_prov_sge) + SHM_MAX_INLINE)
#define SHM_RWR_POOL_SGE 4
#define SHM_POOL_MAX     64

/* A slot of the receive ring: blk, its own block (SHM_RWR_POOL_SGE sges, allocated at its
 * first use, kept until the ep goes), and rwr, the receive in it: blk, or one allocated for
 * itself (more sges; freed when done). A slot is reused once its receive is retired. */
struct shm_rq_slot {
    struct exs_soft_rwr *blk;
    struct exs_soft_rwr *rwr;
};

struct shm_ep {
    struct exs_prov_ep base;
    struct shm_ctx *ctx;
    int state;               /* enum exs_prov_ep_state (ctx->lock) */
    struct exs_list sq_pend; /* posted, not in the ring yet (ctx->lock) */
    struct exs_list sq;      /* in the ring, not done, oldest first (ctx->lock) */
    /* sq_pend not empty, or conn->kick < 0: what a turn takes ctx->lock for (stored under
     * ctx->lock by exs__shm_ep_pend_locked, looked at without it) */
    int pend;
    uint32_t sq_used, sq_unretired;
    uint32_t cq_sq; /* send completions queued, not polled (ctx->lock) */
    /* Posted receives (spec/provider-shm.md, "The receive ring"): a ring written by
     * post_recv under rq_lock alone (a store lock: taken with one exchange, given back with a
     * plain store), read by the turn under ctx->lock; the flush empties it under both. */
    int rq_lock;
    int rq_dead;        /* (rq_lock) the flush has swept it: a post completes at once */
    uint32_t rq_posted; /* (rq_lock) receives accepted, ever (the ring's, the flushed) */
    uint32_t rq_head;   /* (written under rq_lock, released) receives put in the ring */
    uint32_t rq_tail;   /* (ctx->lock) receives taken by the turn */
    /* (ctx->lock) the region the take's last key check found (its receives are mostly in
     * one region: a compare while no region is deregistered) */
    struct exs_soft_local_memo rq_memo;
    uint32_t rq_retired;    /* (written under ctx->lock, released) completions handed over or
                             * polled: rq_posted - rq_retired is what max_recv_wr bounds */
    uint32_t rq_mask;       /* ring slots - 1 (a power of two >= max_recv_wr) */
    struct shm_rq_slot *rq; /* the ring */
    struct shm_conn *conn;  /* (nic_lock and ctx->lock to change) */
    uint32_t snd_nxt;       /* psn of the next record written (ctx->lock) */
    unsigned reads_out;
    int disc_sent;
    int destroyed;
    struct exs_list link;   /* ctx->eps */
    struct exs_list grants; /* (ctx->lock) */
    /* send request blocks kept for reuse (ctx->lock): no malloc or free per message */
    struct exs_soft_pool wr_pool;
    struct sockaddr_storage local;
    socklen_t local_len;
};

struct shm_listener {
    struct exs_prov_listener base;
    struct shm_ctx *ctx;
    int fd;
    int paused;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct exs_list reqs; /* pending shm_req (nic_lock) */
    struct exs_list link; /* ctx->listeners */
};

struct shm_req {
    struct exs_prov_conn_req base;
    struct shm_conn *conn;
    struct exs_list link;
};

enum shm_conn_state {
    SHM_CONN_WAIT_REPLY, /* active: REQ sent */
    SHM_CONN_WAIT_REQ,   /* passive: socket accepted, REQ not read yet */
    SHM_CONN_PENDING,    /* passive: CONNECT_REQUEST queued */
    SHM_CONN_UP,
    SHM_CONN_DEAD, /* ended; freed at the end of the turn */
};

struct shm_conn {
    struct shm_ctx *ctx;
    enum shm_conn_state state;
    int fd;              /* the unix socket */
    int pidfd;           /* the peer process, -1 when pidfd_open failed */
    int bell;            /* the peer ctx's eventfd */
    pid_t pid;           /* SO_PEERCRED */
    int side;            /* 0 active, 1 passive */
    uint8_t *seg;        /* the mapping, SHM_SEG_BYTES(seg_ring) */
    uint32_t seg_ring;   /* each ring's room in the segment (the REQ's ring_bytes) */
    uint32_t ring_bytes; /* the rings' size both sides use: a power of two, <= seg_ring */
    uint64_t ring_mask;  /* ring_bytes - 1 */
    uint32_t frag_bytes; /* payload of a fragment: SHM_FRAG_BYTES, at most a quarter ring */
    int ring_counted;    /* ring_mem counts this connection's rings */
    struct shm_line *mine, *peer;
    struct shm_flag *mine_flag, *peer_flag;
    uint8_t *tx_ring, *rx_ring;
    struct shm_ep *ep;
    struct shm_req *req;
    struct shm_listener *lis;
    int broken; /* PENDING: the peer went away before accept / reject */
    int dying;  /* UP: exs__shm_conn_peer_died is taking what the peer finished: a copy
                 * that fails again (-ESRCH) there only stops it (no recursion) */
    /* producer (ctx->lock) */
    uint64_t head;      /* our ring's published bytes */
    uint64_t peer_tail; /* the peer's consumed bytes, last seen (checked) */
    /* requester view of the peer's answers (nic_lock) */
    uint32_t acked; /* every request before it is complete */
    int nak_seen;
    /* consumer (nic_lock) */
    uint64_t tail;
    uint32_t rcv_nxt;
    uint32_t ack;                  /* published ack */
    int rx_drop;                   /* after RNR_EXC: requests are consumed and dropped */
    int zombie;                    /* our requester got RNR_EXC: ep in ERROR, connection kept */
    uint64_t rnr_at;               /* holding the record at tail until then (ns) */
    uint32_t frag_off;             /* payload bytes of the message in fragments taken */
    struct shm_rec frag_rec;       /* its first fragment's header (frag_off > 0) */
    struct exs_soft_rwr *frag_rwr; /* the receive it holds (SEND, WRITE with IMM) */
    unsigned rnr_tries;
    uint8_t peer_rnr_retry, peer_rnr_timer_ms;
    int sleeping; /* mine->sleeping is set */
    /* (nic_lock) tail and ack were published without the store-load fence a sleeping
     * peer's look needs: the fence and the look at its flag are owed, paid at the start of
     * the next turn or before we sleep (exs__shm_conn_pay_kick) */
    int fence_owed;
    int answers_due; /* (nic_lock) within a turn: requests taken, tail and ack to publish */
    int kick;        /* we changed something the peer waits for */
    struct sockaddr_storage peer_addr;
    socklen_t peer_addrlen;
    uint64_t hello_at; /* WAIT_REQ: closed when its REQ has not come by then (ns) */
    struct shm_hs hs;  /* the REQ (passive) */
    uint32_t hs_len;
    struct exs_list link; /* ctx->conns */
};

struct shm_ctx {
    struct exs_prov_ctx base;
    /* the NIC role: a futex lock (one CAS to take, inline; an idle busy round takes it
     * once, and pthread_mutex_lock and _unlock cost some 57 instructions a pair there),
     * given back with a plain store when nobody waits (exs__shm_nic_unlock); zeroed is
     * free. Taken and given back only through exs__shm_nic_lock / _trylock / _unlock. */
    struct exs_lite_lock nic_lock;
    /* eps, queues, the producer's side of the rings, keys: a futex lock too (a 64 B round
     * trip takes it some ten times) */
    struct exs_lite_lock lock;
    struct exs_soft_keys keys; /* mrs, grants, the copy fence (ctx->lock) */
    int epfd;
    int bell; /* our doorbell: peers write it when we sleep */
    int timerfd;
    int evfd; /* notification of the consumer */
    int manual;
    int has_thread;
    pthread_t thread;
    int stop;
    int armed, evfd_set; /* armed: atomic (exs__shm_turn looks without ctx->lock) */
    /* cm_events may be non-empty (exs__soft_cm_pop): set under ctx->lock at a push,
     * cleared by the take that empties the list; also the context's cm_queued (prov.h),
     * so a busy turn's exs__prov_cm_poll makes no call while it reads 0 */
    int cm_hint;
    struct exs_soft_cq cq;
    struct exs_list cm_events;
    struct exs_list eps;
    unsigned pend_eps; /* eps with sends waiting for ring room (ctx->lock) */
    /* ctx_progress_poll's array (nic_lock: set by the holder around its turn): the turn's
     * completions go there while the queue is empty (exs__shm_cq_nic_slot_locked) */
    struct exs_prov_cqe *sink;
    int sink_max, sink_n;
    /* NIC (nic_lock) */
    struct exs_list conns;
    struct exs_list listeners;
    uint64_t timer_armed_ns;
    unsigned turn_seq;   /* working turns of ctx_progress: descriptors every 8th */
    unsigned idle_turns; /* idle turns of ctx_progress since the last look */
    int collect_now;     /* an arm was taken, or the last look found some: the next reads */
    uint32_t rnr_timer_ms;
    uint8_t rnr_retry_max;
    uint32_t ring_bytes; /* this side's choice of ring size (EXS_SHM_RING_KB) */
    struct shm_counters cnt;
    struct exs_counter_set cset;
};

/* ThreadSanitizer: one segment is mapped twice when both sides are in one process (the
 * tests), so a publication and the load that sees it are at two addresses and TSan finds
 * no order between the copy before one and the read after the other. Each publication
 * releases and each look at the peer's line acquires one process-wide token. (Over-
 * synchronizes under TSan only; nothing in other builds.) */
#if defined(__SANITIZE_THREAD__)
extern int exs__shm_tsan_token;
#endif
#define SHM_TSAN_RELEASE() EXS_TSAN_RELEASE(&exs__shm_tsan_token)
#define SHM_TSAN_ACQUIRE() EXS_TSAN_ACQUIRE(&exs__shm_tsan_token)

/* The NIC lock (spec/provider-shm.md, "The NIC lock's give-back"): a lite lock given back
 * with a plain store when nobody waits (lite_lock.h, exs__lite_unlock_st). */
#define exs__shm_nic_lock(_ctx)    exs__lite_lock_st(&(_ctx)->nic_lock)
#define exs__shm_nic_trylock(_ctx) exs__lite_trylock(&(_ctx)->nic_lock)
#define exs__shm_nic_unlock(_ctx)  exs__lite_unlock_st(&(_ctx)->nic_lock)

static inline struct shm_ctx *shm_ctx_of(struct exs_prov_ctx *c)
{
    return (struct shm_ctx *)c;
}

static inline struct shm_ep *shm_ep_of(struct exs_prov_ep *e)
{
    return (struct shm_ep *)e;
}

extern struct exs_prov_ops exs__prov_shm_ops;

/* shm_ctx.c */
void exs__shm_cq_push_locked(struct shm_ctx *ctx, struct shm_ep *ep,
                             const struct exs_prov_cqe *cqe);
/* ctx->lock held: an armed consumer's event fd made readable (a completion or cm event). */
void exs__shm_notify_locked(struct shm_ctx *ctx);
/* ctx->lock held: the entry of the next completion, filled in place (every field), then
 * queued by exs__shm_cq_commit_locked. Never full: every ep reserved what it can produce
 * and posts refuse beyond it. */
static inline struct exs_prov_cqe *exs__shm_cq_slot_locked(struct shm_ctx *ctx)
{
    struct exs_prov_cqe *slot = exs__soft_cq_slot(&ctx->cq);

    EXS_ASSERT(slot);
    return slot;
}
static inline void exs__shm_cq_commit_locked(struct shm_ctx *ctx, struct shm_ep *ep, int recv)
{
    exs__soft_cq_commit(&ctx->cq);
    if (!recv) /* (a receive's is counted by its ring: rq_retired when polled) */
        ep->cq_sq++;
    if (ctx->armed)
        exs__shm_notify_locked(ctx);
}
/* nic_lock and ctx->lock held: the slot of a completion the turn makes (a receive or a
 * request of ours done): the next entry of ctx_progress_poll's array while nothing is
 * queued (every queued completion is older: the caller takes the queue's after the
 * array's), else the queue's. Committed by exs__shm_cq_nic_commit_locked. */
static inline struct exs_prov_cqe *exs__shm_cq_nic_slot_locked(struct shm_ctx *ctx)
{
    if (ctx->sink_n < ctx->sink_max && !exs__soft_cq_peek(&ctx->cq))
        return &ctx->sink[ctx->sink_n];
    return exs__shm_cq_slot_locked(ctx);
}
static inline int exs__shm_cq_nic_commit_locked(struct shm_ctx *ctx, struct shm_ep *ep, int recv,
                                                const struct exs_prov_cqe *slot)
{
    if (ctx->sink_n < ctx->sink_max && slot == &ctx->sink[ctx->sink_n]) {
        /* handed over: not queued, so not counted in cq_sq (a receive retires at once: the caller
         * retires it below), and no notification (its consumer is the caller, in this call) */
        ctx->sink_n++;
        SHM_CNT_INC_OWNED(ctx->cnt.direct_cqes); /* (nic_lock) */
        return 1;
    }
    exs__shm_cq_commit_locked(ctx, ep, recv);
    return 0;
}
void exs__shm_cm_push(struct shm_ctx *ctx, const struct exs_prov_cm_event *ev);
/* ctx->lock held: queue a WR_FLUSH_ERR completion of ep. */
void exs__shm_flush_cqe_locked(struct shm_ep *ep, uint64_t wr_id, enum exs_prov_wc_opcode op);
int exs__shm_epoll_add(struct shm_ctx *ctx, int fd, void *ptr, unsigned tag);
void exs__shm_epoll_del(struct shm_ctx *ctx, int fd);
/* One turn of the NIC role (nic_lock held): socket events when collect (2: the NIC
 * thread's turn, which also takes back its sleeping flags), then every connection's ring.
 * Returns > 0 when it did something. */
int exs__shm_turn(struct shm_ctx *ctx, int collect);
/* Wake whoever drives (the NIC thread, or a MANUAL sleeper): work was queued. */
void exs__shm_ctx_wake(struct shm_ctx *ctx);
void exs__shm_timer_set(struct shm_ctx *ctx, uint64_t at_ns);

enum { SHM_TAG_CONN = 0, SHM_TAG_LIS = 1, SHM_TAG_PID = 2, SHM_TAG_CTX = 3, SHM_TAG_MASK = 3 };

/* shm_mr.c */
int exs__shm_mr_reg(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p);
int exs__shm_mr_dereg(struct exs_prov_mr *mr);
int exs__shm_grant(struct exs_prov_ep *ep, struct exs_prov_mr *mr, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p);
void exs__shm_revoke(struct exs_prov_grant *grant);
void exs__shm_ep_revoke_all_locked(struct shm_ep *ep);
static inline int exs__shm_check_local_locked(struct shm_ctx *ctx, const struct exs_prov_sge *sge,
                                              int n, unsigned access)
{
    return exs__soft_check_local_locked(&ctx->keys, sge, n, access);
}
/* NIC: raise the copy fence over a live key of ep covering [addr, addr+len) with access;
 * -EACCES when there is none. ctx->lock not held. */
int exs__shm_fence_remote(struct shm_ctx *ctx, struct shm_ep *ep, uint32_t rkey, uint64_t addr,
                          uint64_t len, unsigned access, struct exs_soft_key **key_p);
/* Between two chunks of one copy, the fence still up: 0 to go on, or -EACCES when the key
 * was killed meanwhile (the fence is then down: no exs__shm_fence_end). */
int exs__shm_fence_next(struct shm_ctx *ctx, struct exs_soft_key *key);
void exs__shm_fence_end(struct shm_ctx *ctx);
/* NIC: before a chunk of a copy into local memory (a SEND's payload into its receive's
 * sges): 0 and the fence raised over their region(s), or -EACCES (a region deregistered;
 * the fence down). *lkey, *kills: as exs__soft_fence_local_locked's, kept across the
 * chunks of the copy (*kills UINT64_MAX before the first). */
int exs__shm_fence_local(struct shm_ctx *ctx, const struct exs_prov_sge *sge, int n,
                         struct exs_soft_key **lkey, uint64_t *kills);

/* shm_cm.c */
int exs__shm_ep_create(struct exs_prov_ctx *ctx, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p);
void exs__shm_ep_destroy(struct exs_prov_ep *ep);
enum exs_prov_ep_state exs__shm_ep_state(struct exs_prov_ep *ep);
int exs__shm_ep_local_addr(struct exs_prov_ep *ep, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
int exs__shm_listen(struct exs_prov_ctx *ctx, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p);
int exs__shm_listener_addr(struct exs_prov_listener *lis, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
void exs__shm_listener_destroy(struct exs_prov_listener *lis);
int exs__shm_listener_pause(struct exs_prov_listener *lis, int pause);
int exs__shm_connect(struct exs_prov_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen);
int exs__shm_accept(struct exs_prov_conn_req *req, struct exs_prov_ep *ep, const void *pd,
                    uint32_t pdlen);
int exs__shm_reject(struct exs_prov_conn_req *req, const void *pd, uint32_t pdlen);
int exs__shm_disconnect(struct exs_prov_ep *ep);
void exs__shm_listener_ready(struct shm_listener *lis);
/* NIC: conn is WAIT_REQ; closed (counted hello_refused) when its deadline passed and its REQ
 * has not come. 1 when it was closed. */
int exs__shm_conn_hello_late(struct shm_conn *conn, uint64_t now);
void exs__shm_conn_readable(struct shm_conn *conn, uint32_t events);
void exs__shm_conn_peer_died(struct shm_conn *conn);
/* End conn (nic_lock held): the ep to ERROR with everything flushed and DISCONNECTED
 * (status, flags) queued; DISCONNECT sent first when send_disc. */
void exs__shm_conn_end(struct shm_conn *conn, int status, unsigned flags, int send_disc);
void exs__shm_conn_free(struct shm_conn *conn);
/* ctx->lock held: complete the ep's queues with WR_FLUSH_ERR (send queue, then receives). */
void exs__shm_ep_flush_locked(struct shm_ep *ep);

/* shm_cm.c: shared with shm_lis.c */
struct sockaddr_un;
int exs__shm_hs_send(int fd, uint8_t type, uint8_t flags, const struct shm_ctx *ctx,
                     const struct shm_ep *ep, const void *pd, uint32_t pdlen, const int *fds,
                     int nfds, unsigned sport, uint32_t ring_bytes);
/* A ring size a peer announced (REQ: the room of each ring; ACCEPT: the size agreed): a
 * power of two within [SHM_RING_MIN, max]. */
static inline int exs__shm_ring_ok(uint32_t ring_bytes, uint32_t max)
{
    return ring_bytes >= SHM_RING_MIN && ring_bytes <= max && !(ring_bytes & (ring_bytes - 1));
}
struct shm_conn *exs__shm_conn_new(struct shm_ctx *ctx, int fd, int side);
/* SO_PEERCRED: our user only; the peer's pid and a pidfd watched for its exit. */
int exs__shm_conn_peer(struct shm_conn *conn);
/* conn is DEAD (freed by the next turn): detached from its ep, descriptors closed. */
void exs__shm_conn_detach(struct shm_conn *conn);
void exs__shm_req_free(struct shm_conn *conn);

/* shm_lis.c */
socklen_t exs__shm_unix_name(struct sockaddr_un *un, unsigned port);
int exs__shm_addr_port(const struct sockaddr *sa, socklen_t len, unsigned *port_p);
/* 1 when sa is this host's: a wildcard, loopback, or an address of one of its interfaces. */
int exs__shm_addr_local(const struct sockaddr *sa);
void exs__shm_loopback(struct sockaddr_storage *ss, socklen_t *len, int family, unsigned port);

/* shm_data.c */
int exs__shm_post_send(struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr);
int exs__shm_post_recv(struct exs_prov_ep *ep, const struct exs_prov_recv_wr *wr);
/* ctx->lock held: write the ep's waiting sends into the ring while it has room. */
void exs__shm_ep_push_locked(struct shm_ep *ep);
/* nic_lock held: carry out the peer's requests and take its answers to ours. > 0 when
 * something happened; the connection may have ended. */
int exs__shm_conn_service(struct shm_conn *conn);
/* The size word of the record slot at our position in the peer's ring (conn UP): 0 until
 * the peer's next record there is written (spec/provider-shm.md, "Records announce
 * themselves"). Load it atomically; what it says is checked with the record. */
static inline uint32_t *exs__shm_rx_stamp(const struct shm_conn *conn)
{
    return (uint32_t *)(void *)(conn->rx_ring + (conn->tail & conn->ring_mask) +
                                offsetof(struct shm_rec, size));
}
/* 1 when a turn may have something to do on conn (UP): the peer wrote a record or
 * published answers, or the ep has waiting posts. A load of the next record's size word,
 * two of the peer's line and one of ep->pend, no lock: an idle busy-polling turn does no
 * more per connection. */
static inline int exs__shm_conn_stirred(const struct shm_conn *conn)
{
    const struct shm_ep *ep = conn->ep;

    return !ep || __atomic_load_n(&ep->pend, __ATOMIC_RELAXED) ||
           __atomic_load_n(exs__shm_rx_stamp(conn), __ATOMIC_RELAXED) ||
           __atomic_load_n(&conn->peer->ack, __ATOMIC_RELAXED) != conn->acked ||
           (!conn->nak_seen && __atomic_load_n(&conn->peer->nak_syn, __ATOMIC_RELAXED));
}
/* 1 when conn has work a turn would do now (read with the sleeping flag set). */
int exs__shm_conn_busy(struct shm_conn *conn);
/* Write the peer's bell (exs__shm_conn_kick found it asleep). */
void exs__shm_conn_bell(struct shm_conn *conn);
/* After a change the peer waits for: write its bell when it sleeps. A look at its flag
 * inline, the write out of line (a message costs two looks, no call). */
static inline void exs__shm_conn_kick(struct shm_conn *conn)
{
    /* after a sequentially consistent publication (a record's size, ack, tail, nak): see
     * shm_prepare_sleep */
    if (conn->bell >= 0 && __atomic_load_n(&conn->peer_flag->sleeping, __ATOMIC_SEQ_CST))
        exs__shm_conn_bell(conn);
}
/* The consumer's answers (tail, ack) go out with release stores, and the fence between
 * them and the look at the peer's flag (exs__shm_conn_kick) comes at the start of our next
 * turn or before we sleep: a locked store there waited for the peer's copy of our line to
 * be taken back (it reads our line every turn), before the application could answer.
 * Under TSan, which does not follow fences, the answers are sequentially consistent
 * stores and the look comes at once, as the producer's. */
#if defined(__SANITIZE_THREAD__)
#define SHM_FENCE_LATER 0
#else
#define SHM_FENCE_LATER 1
#endif
/* (nic_lock) The owed fence and look, if any (spec/provider-shm.md, "The owed fence"). */
static inline void exs__shm_conn_pay_kick(struct shm_conn *conn)
{
#if SHM_FENCE_LATER
    if (conn->fence_owed) {
        conn->fence_owed = 0;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        exs__shm_conn_kick(conn);
    }
#else
    (void)conn;
#endif
}
void exs__shm_ep_pend_locked(struct shm_ep *ep);
/* ctx->lock held: a work request given back (to its ep's pool, or freed). */
void exs__shm_wr_put_locked(struct shm_ep *ep, struct shm_wr *wr);
/* ctx->lock held: a receive's memory given back (one of its own freed; a slot's block
 * stays with the slot). */
static inline void exs__shm_rwr_put_locked(struct exs_soft_rwr *rwr)
{
    if (!rwr->pooled)
        free(rwr);
}
/* ---- the receive ring (spec/provider-shm.md, "The receive ring") ---- */
/* ctx->lock held: a posted receive not taken yet is in the ring. */
static inline int exs__shm_rq_ready(const struct shm_ep *ep)
{
    return __atomic_load_n(&ep->rq_head, __ATOMIC_ACQUIRE) != ep->rq_tail;
}
/* ctx->lock held: the oldest receive not taken, taken (its local key checked now: bad), or
 * NULL. */
struct exs_soft_rwr *exs__shm_rq_take_locked(struct shm_ep *ep);
/* ctx->lock held: rwr, the last receive taken, back at the head of the ring. */
void exs__shm_rq_back_locked(struct shm_ep *ep, struct exs_soft_rwr *rwr);
/* ctx->lock held: a receive of ep is retired (its completion handed over or polled): its
 * slot and its room in max_recv_wr are the poster's again. */
static inline void exs__shm_rq_retire_locked(struct shm_ep *ep)
{
    __atomic_store_n(&ep->rq_retired, ep->rq_retired + 1, __ATOMIC_RELEASE);
}
/* ctx->lock held: the ring emptied for good, each receive flushed in order (freed without
 * a completion when the ep is destroyed); later posts complete WR_FLUSH_ERR at once. */
void exs__shm_rq_sweep_locked(struct shm_ep *ep);
int exs__shm_rq_init(struct shm_ep *ep);
void exs__shm_rq_fini(struct shm_ep *ep);

#endif
