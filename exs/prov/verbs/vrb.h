/* SPDX-License-Identifier: MIT */
/* Private structures of the verbs provider (libibverbs + librdmacm). */
#ifndef EXS_PROV_VERBS_VRB_H
#define EXS_PROV_VERBS_VRB_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "exs/prov/prov.h"
#include "exs/prov/verbs/vrb_cache.h"
#include "exs/util/counters.h"
#include "exs/util/lite_lock.h"
#include "exs/util/list.h"
#include "exs/util/nocancel.h"

/*
 * Model (spec/provider.md, "verbs provider mapping"):
 *   ctx   device (ibv_context from rdma_get_devices), one PD, ONE CQ shared by every ep, one
 *         completion channel, one rdma_cm event channel, an eventfd for software events; the
 *         event fd is an epoll fd over the three.
 *   ep    an RC QP created by us (not rdma_create_qp: the QP cache needs QPs that outlive
 *         cm ids), moved through INIT/RTR/RTS with rdma_init_qp_attr + ibv_modify_qp.
 *   wr_id of every posted verbs work request = epid << 40 | recv << 39 | internal << 38 |
 *         sequence, so a completion finds its ep (or is dropped when the ep is gone) and
 *         retires the unsignaled requests before it; internal requests (window binds) have
 *         their own sequence and room and never reach ctx_poll.
 *   grant a type 2 memory window bound to the ep's QP (vrb_grant.c), over a registration
 *         of exactly the range where the device checks a window's range against its MR only
 *         (rxe), or a registration per grant where type 2 windows are missing.
 * Locks: ctx->cm_lock (cm events, ids, listeners, requests) > ctx->lock (CQ, completion
 *         ring, ep hash, software cm events, the queues' heads) > ep->lock (posting; a
 *         completion's conversion takes it only off the success path).
 */

#define VRB_PD_MAX      56u          /* user private data, each way (the rdma_cm REQ limit) */
#define VRB_PD_MAGIC    0x9e5du      /* REP / REJ private data header: magic, length */
#define VRB_PD_HDR      14u          /* magic 2, flags 1, length 1, goodbye port 2, token 8 */
#define VRB_BYE_WAIT_NS 300000000ull /* a DREQ without goodbye: wait this long for it */
#define VRB_EP_HASH     256u
#define VRB_ACKS        128 /* completion events read per ibv_ack_cq_events */
#define VRB_MAX_SGE     32u
#define VRB_EPID_SHIFT  40
#define VRB_RECV_BIT    (1ull << 39)
#define VRB_INT_BIT     (1ull << 38) /* an internal request (window bind) */
#define VRB_SEQ_MASK    (VRB_INT_BIT - 1)
#define VRB_INT_ROOM    32u /* send queue entries per ep for internal requests, beyond max_send_wr */
#define VRB_RESOLVE_MS  2000

enum vrb_kind { VRB_K_EP = 1, VRB_K_LIS, VRB_K_REQ, VRB_K_WATCH };

/* cm_id->context points at one of these, embedded in an ep, listener or request. */
struct vrb_cmobj {
    enum vrb_kind kind;
};

struct vrb_counters {
    uint64_t conns_established;
    uint64_t conns_rejected;
    uint64_t conns_unreachable;
    uint64_t disconnects;
    uint64_t cm_events;
    uint64_t wc_errors;
    uint64_t stale_cqes; /* completions of destroyed eps, dropped */
    uint64_t cq_resizes;
    uint64_t sq_full;
    uint64_t connect_ns_total; /* connect() to ESTABLISHED, active side */
    uint64_t connects_timed;
    uint64_t grants;
    uint64_t revokes;
    uint64_t revokes_early; /* revoked before the bind executed: the ep was ended */
    uint64_t settle_waits;  /* grant_settle answered -EBUSY (bind not completed yet) */
    uint64_t grant_fails;
    uint64_t grant_room_waits; /* grant waited for binds before it to complete (room) */
    uint64_t binds_unfenced;   /* fenced mode: binds posted alone, nothing outstanding */
    uint64_t ep_nobufs;        /* ep_create refused: the completion queue cannot hold the ep */
    uint64_t device_removals;  /* the device went away: everything on it released */
    uint64_t cq_event_reads;   /* ctx_arm read the completion channel (ibv_get_cq_event) */
    uint64_t cq_event_skips;   /* ctx_arm left it unread: no completion since the request */
    uint64_t cq_event_acks;    /* ibv_ack_cq_events calls (events acked in batches) */
    uint64_t doorbells;        /* ibv_post_send calls of the consumer's send requests */
    uint64_t sends_deferred;   /* send requests held back (EXS_PROV_SEND_DEFER) */
    uint64_t signals_saved;    /* SIGNALED requests posted unsignaled: completion made here */
    uint64_t wc_locked;        /* completions converted under their ep's lock (not the
                                  success path: errors, flushes, made ones, early ones) */
};

/* How grants are made (ctx->grant_mode; spec/provider.md, "verbs provider mapping"). */
enum vrb_grant_mode {
    VRB_GRANT_MW = 1, /* type 2 window bound to the QP, over the caller's mr */
    VRB_GRANT_MW_MR,  /* type 2 window bound to the QP, over a registration of exactly the range */
    VRB_GRANT_MR,     /* a registration of exactly the range and right (no window) */
};

/* Kept per outstanding work request: the user's wr_id, and the first sges, to tell a local
 * protection error from a length error when a device reports only "local QP operation
 * error" (rxe does). */
#define VRB_SLOT_SGE 4

struct vrb_swr {
    uint64_t wr_id;
    uint32_t len;
    uint8_t opcode; /* enum exs_prov_wr_opcode */
    uint8_t nsge;   /* 0 for inline sends */
    uint8_t synth;  /* SIGNALED, posted unsignaled: its completion is made by the provider
                       when a later request's completion comes (RC completes in order) */
    struct exs_prov_sge sge[VRB_SLOT_SGE];
};

struct vrb_rwr {
    uint64_t wr_id;
    uint8_t nsge;
    struct exs_prov_sge sge[VRB_SLOT_SGE];
};

#define VRB_MR_HASH 256u

/* A send request held back (EXS_PROV_SEND_DEFER) until the ep's batch is handed to the
 * QP (ep->lock): the verbs request and what it points at, inline bytes copied. */
#define VRB_HELD_MAX 16u /* requests in one batch: a fuller batch goes out first */
#define VRB_HELD_SGE 4u  /* requests with more sges are not held */
struct vrb_held {
    struct ibv_send_wr w;
    struct ibv_sge sge[VRB_HELD_SGE];
};

struct vrb_ctx;
struct vrb_grant;

struct vrb_ep {
    struct exs_prov_ep base;
    struct vrb_cmobj cmo;
    struct vrb_ctx *ctx;
    struct exs_lite_lock lock; /* posting (a futex lock, zeroed is free; see ctx->lock) */
    int state;                 /* enum exs_prov_ep_state (atomic) */
    uint32_t epid;
    struct ibv_qp *qp;
    struct vrb_qpc_caps qcaps; /* what the QP was created with */
    struct rdma_cm_id *id;     /* cm_lock */
    int active;                /* connect() side */
    int loopback;              /* addresses of the device are shown as 127.0.0.1 */
    int up;                    /* ESTABLISHED was reported (cm_lock) */
    int disc_sent;             /* DISCONNECTED was reported (cm_lock) */
    uint64_t connect_ns;
    uint8_t cpd[VRB_PD_MAX]; /* the REQ's private data, connect() to ROUTE_RESOLVED */
    uint32_t cpd_len;
    /* goodbye channel (cm_lock): tells an orderly disconnect from a dead peer */
    uint64_t tok; /* ours, given to the peer */
    uint64_t peer_tok;
    struct sockaddr_in peer_bye; /* the peer context's goodbye socket */
    int bye_ok;                  /* the peer will say goodbye before an orderly end */
    int got_bye;
    int peer_closed;           /* its goodbye was VRB_DG_CLOSED: its endpoint was destroyed */
    int local_disc;            /* we ended it */
    uint64_t disc_at;          /* DISCONNECTED held until then for a goodbye */
    struct exs_list disc_link; /* ctx->disc_wait */
    struct sockaddr_storage local;
    socklen_t local_len;
    /* send queue: slots [sq_head, sq_tail) are outstanding. The queues are a single
     * consumer ring each (spec/threading.md, "verbs completions"): the tails and the
     * slots are written by the posters under lock; the heads only under ctx->lock, by
     * whoever converts or returns completions (wc_convert, retire), and read by the
     * posters without it (atomic: release by the consumer, acquire by the posters).
     * sq_posted: the slots before it were handed to the QP (lock; release): a
     * successful completion of a slot in [sq_head, sq_posted) (rq: [rq_head, rq_tail))
     * is converted without lock. Each ring has a power of two of slots, at least the
     * queue's depth (vrb_slots): slot seq & mask, no division (a 64-bit div per post and
     * per completion: tens of cycles natively, a helper call under qemu's TCG). */
    struct vrb_swr *sq;
    uint32_t sq_mask;
    uint64_t sq_head, sq_tail, sq_posted;
    /* receive queue */
    struct vrb_rwr *rq;
    uint32_t rq_mask;
    uint64_t rq_head, rq_tail;
    /* internal requests (lock): window binds posted and not completed */
    uint32_t int_room; /* send queue entries for them (0: grants need none) */
    uint32_t int_out;
    uint64_t int_seq;
    struct ibv_mw *fence_mw; /* bound to the QP at RTS, invalidated and bound again before
                                each grant's bind (ctx->bind_fence; lock) */
    uint32_t fence_extra;    /* internal entries of fence requests no grant accounts for yet */
    struct exs_list grants;  /* vrb_grant not yet freed (lock) */
    /* send requests posted with EXS_PROV_SEND_DEFER, not handed to the QP yet (lock); their
     * slots are taken [sq_tail - held_n, sq_tail). held_inl: VRB_HELD_MAX x max_inline */
    struct vrb_held *held;
    uint8_t *held_inl;
    uint32_t held_n;
    uint32_t synth_out;    /* slots with synth set, outstanding (written under lock,
                              read without it by wc_convert: atomic) */
    struct exs_list hlink; /* ctx->ep_hash (ctx->lock) */
    struct exs_list link;  /* ctx->eps (ctx->lock) */
};

struct vrb_listener {
    struct exs_prov_listener base;
    struct vrb_cmobj cmo;
    struct vrb_ctx *ctx;
    struct rdma_cm_id *id;
    int loopback;
    struct exs_list reqs; /* pending vrb_req (cm_lock) */
    struct exs_list link; /* ctx->listeners (cm_lock) */
};

struct vrb_req {
    struct exs_prov_conn_req base;
    struct vrb_cmobj cmo;
    struct vrb_listener *lis;
    struct rdma_cm_id *id;
    int broken; /* the active side gave up */
    uint8_t resp_res, init_depth;
    struct exs_list link; /* lis->reqs */
};

/* A completion taken from the CQ, kept for ctx_poll: its slot is retired when returned. */
struct vrb_kept {
    struct exs_prov_cqe cqe;
    uint64_t retire; /* VRB_RECV_BIT | (sequence + 1) of its ep's queue */
};

struct vrb_cm_node {
    struct exs_list link;
    struct exs_prov_cm_event ev;
};

struct vrb_ctx {
    struct exs_prov_ctx base;
    /* a futex lock (exs/util/lite_lock.h, the _st pair: one CAS to take, a plain store
     * to give back when nobody marked it, inline; zeroed is free): every ctx_poll takes
     * it, empty ones too (a busy poller's every turn), and ep->lock (the same kind) each
     * post; pthread_mutex_lock and _unlock cost ~57 instructions a pair. Neither is
     * recursive, used with a condition variable or tried; every taker of either uses
     * exs__lite_lock_st (a waiter whose mark a store-give-back missed naps at most
     * EXS_LITE_NAP_NS, then looks again). */
    struct exs_lite_lock lock;
    pthread_mutex_t cm_lock;
    struct ibv_context *verbs; /* owned by librdmacm (rdma_get_devices) */
    struct ibv_context **devlist;
    struct ibv_device_attr dattr;
    uint8_t port;
    struct in_addr loop_addr; /* the device's IPv4 address (0 = none) */
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    int cq_cap;
    uint64_t cq_need; /* sum of the eps' queue depths (lock) */
    struct rdma_event_channel *cmch;
    int evfd;         /* software events (eventfd) */
    int wake_pending; /* atomic: evfd written since ctx_arm last read it */
    int cq_armed;     /* ctx->lock: notification requested, its event not read yet */
    int cq_seen;      /* ctx->lock: a completion was taken from the CQ (or the CQ resized)
                       * since that request: only then can its event have come */
    int cq_unacked;   /* ctx->lock: events read and not acked yet: acked VRB_ACKS at a time
                       * (ibv_ack_cq_events takes a mutex and signals a condition), all
                       * of them before the CQ is destroyed */
    int epfd;         /* the application's event fd */
    int stopfd;       /* stops the cm thread */
    pthread_t cm_thread;
    int cm_thread_on;
    int udpfd;         /* goodbye datagrams (the cm thread reads) */
    uint16_t udp_port; /* network order */
    uint64_t tok_base;
    struct exs_list disc_wait; /* eps holding DISCONNECTED (cm_lock) */
    /* completions polled from the CQ but not yet returned (lock); their work requests keep
     * their queue slots until ctx_poll returns them */
    struct vrb_kept *ring;
    uint32_t ring_cap, ring_head, ring_count;
    struct exs_list cm_sw; /* vrb_cm_node (lock) */
    uint32_t cm_sw_n;      /* nodes on cm_sw: written under lock, read without (atomic) */
    uint32_t held_eps;     /* eps holding deferred send requests (atomic; ctx_poll and
                              ctx_arm hand them to their QPs) */
    struct exs_list ep_hash[VRB_EP_HASH];
    struct exs_list eps;
    struct exs_list listeners; /* cm_lock */
    pthread_rwlock_t mr_lock;
    struct exs_list mr_hash[VRB_MR_HASH]; /* vrb_mr by lkey (mr_lock) */
    uint32_t next_epid;
    /* settings */
    uint8_t qp_timeout, retry_cnt, rnr_retry;
    uint32_t max_inline;
    struct vrb_counters cnt;
    struct exs_counter_set cset;
    struct vrb_qpcache qpc;
    struct vrb_mcache mc;
    struct vrb_regcache rc;
    struct vrb_gcache gc; /* grant mode mw_mr: registrations of grants' exact ranges, kept */
    int pagemap_fd;       /* /proc/self/pagemap for the registration cache's page check, or -1 */
    enum vrb_grant_mode grant_mode;
    /* window binds go behind a local invalidate of the ep's fence window (rxe runs a
     * LOCAL_INV only once everything posted before it completed), so that a bind runs only
     * once everything before it was acknowledged (rxe: a retry re-runs a bind that already
     * ran, and the QP stalls; spec/provider.md, "Grants") */
    int bind_fence;
    uint32_t int_room;       /* internal send queue entries per ep (binds and fences) */
    struct ibv_mr *fence_mr; /* one page the fence windows are bound over (cm_lock) */
    void *fence_page;
    uint64_t rng; /* key bytes: a splitmix64 counter, seeded from getrandom (atomic) */
    /* Device removal (vrb_gone.c, spec/provider.md "Device removal"): a cm id bound to the
     * device's address, so that its DEVICE_REMOVAL arrives even with no ep or listener;
     * gone_pending is set by the cm event (cm_lock) and acted on once the event is acked;
     * gone (atomic) once everything on the device was released: no verbs call is made on
     * it after. dev_lock: held for reading across every registration, deregistration
     * and grant (their verbs calls), for writing by the release. */
    struct rdma_cm_id *watch_id; /* cm_lock */
    struct vrb_cmobj watch_cmo;
    int gone_pending;
    int gone;
    /* librdmacm still listed the device after it was released (it notices a device gone
     * only when it lists them): the cm thread asks again until it does not (cm_lock) */
    struct ibv_context *gone_verbs;
    unsigned gone_asks;
    int gone_last;  /* the last ctx of this process on the device */
    int gone_fd[2]; /* the device context's command and event descriptors */
    struct stat gone_st[2];
    pthread_rwlock_t dev_lock;
    /* which of the device's calls enter the kernel (VRB_PK_*: a software device, rxe or
     * siw, write()s a command, a cancellation point): they run with cancellation off
     * (vrb_post_send, vrb_post_recv, vrb_req_notify_cq) */
    int post_kernel;
};

static inline int vrb_gone(const struct vrb_ctx *ctx)
{
    return __atomic_load_n(&ctx->gone, __ATOMIC_ACQUIRE);
}

static inline struct vrb_ctx *vrb_ctx_of(struct exs_prov_ctx *c)
{
    return (struct vrb_ctx *)c;
}

static inline struct vrb_ep *vrb_ep_of(struct exs_prov_ep *e)
{
    return (struct vrb_ep *)e;
}

extern struct exs_prov_ops exs__prov_verbs_ops;
/* The context's provider-neutral part (ops, cm_queued): at open, and by the unit tests' fake. */
void exs__vrb_ctx_base_init(struct vrb_ctx *ctx);
int exs__prov_verbs_device_active(void);
/* 1 in a child forked after this process's librdmacm opened the devices: verbs unusable. */
int exs__vrb_forked_child(void);

/* vrb_ctx.c */
/* Keep a completion for ctx_poll (ctx->lock held); -ENOMEM when it cannot be kept. */
int exs__vrb_ring_push(struct vrb_ctx *ctx, const struct vrb_kept *c);
/* The same, and when it cannot be kept: its slot given back, the loss logged. */
void exs__vrb_ring_keep(struct vrb_ctx *ctx, const struct vrb_kept *c);
void exs__vrb_cm_push(struct vrb_ctx *ctx, const struct exs_prov_cm_event *ev);
/* The same with ctx->lock held, without the wake-up: exs__vrb_wake after unlocking. */
void exs__vrb_cm_push_locked(struct vrb_ctx *ctx, const struct exs_prov_cm_event *ev);
void exs__vrb_wake(struct vrb_ctx *ctx);
/* exs__vrb_cq_reap with ctx->lock held. */
void exs__vrb_cq_drain_locked(struct vrb_ctx *ctx);
/* Ack every completion event read and not acked yet (ctx->lock held, or the ctx no longer
 * shared): before the CQ is destroyed, which waits for them. */
void exs__vrb_cq_ack_all(struct vrb_ctx *ctx);
/* Drop queued CONNECT_REQUESTs of a listener being destroyed (their requests go with it). */
void exs__vrb_cm_purge_listener(struct vrb_ctx *ctx, struct exs_prov_listener *lis);
void exs__vrb_ep_hash_add(struct vrb_ctx *ctx, struct vrb_ep *ep);
/* Poll the CQ into the kept completions (ctx->lock taken; call without ep->lock): the
 * provider's own completions are consumed on the way, the others kept in order. */
void exs__vrb_cq_reap(struct vrb_ctx *ctx);
/* Remove ep from the hash and purge its queued completions and cm events. */
void exs__vrb_ep_forget(struct vrb_ctx *ctx, struct vrb_ep *ep);

/* vrb_cm.c */
int exs__vrb_ep_create(struct exs_prov_ctx *ctx, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p);
void exs__vrb_ep_destroy(struct exs_prov_ep *ep);
enum exs_prov_ep_state exs__vrb_ep_state(struct exs_prov_ep *ep);
int exs__vrb_ep_local_addr(struct exs_prov_ep *ep, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
int exs__vrb_listen(struct exs_prov_ctx *ctx, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p);
int exs__vrb_listener_addr(struct exs_prov_listener *lis, struct sockaddr_storage *addr,
                           socklen_t *addrlen);
void exs__vrb_listener_destroy(struct exs_prov_listener *lis);
int exs__vrb_connect(struct exs_prov_ep *ep, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen);
int exs__vrb_accept(struct exs_prov_conn_req *req, struct exs_prov_ep *ep, const void *pd,
                    uint32_t pdlen);
int exs__vrb_reject(struct exs_prov_conn_req *req, const void *pd, uint32_t pdlen);
int exs__vrb_disconnect(struct exs_prov_ep *ep);
/* Take the next rdma_cm event and turn it into at most one provider event: 1 when *ev was
 * filled, 0 when nothing is pending. */
int exs__vrb_cm_process(struct vrb_ctx *ctx, struct exs_prov_cm_event *ev);
void exs__vrb_ep_set_error(struct vrb_ep *ep);
void exs__vrb_qp_destroy_cb(void *arg, void *qp);
/* Cm thread, cm_lock held: read goodbye datagrams; release held DISCONNECTED events whose
 * wait ran out. vrb_disc_due returns the earliest deadline (0 = none). */
void exs__vrb_udp_input(struct vrb_ctx *ctx);
/* vrb_bye.c: REP / REJ private data = a 14-byte header (magic, length, goodbye port, token)
 * + the user's bytes; pd_parse: 1 and the user's bytes in ev when data has the header. */
void exs__vrb_pd_hdr(uint8_t *buf, const void *pd, uint32_t len, uint16_t port_be, uint64_t tok);
int exs__vrb_pd_parse(const void *data, uint32_t dlen, struct exs_prov_cm_event *ev,
                      uint16_t *port_be_p, uint64_t *tok_p);
/* Goodbye datagrams (cm_lock held): HELLO (active, after the REP) tells the passive side
 * where to say goodbye; BYE (disconnect) or CLOSED (closed: ep_destroy) precedes an orderly
 * DREQ. */
void exs__vrb_say_bye(struct vrb_ep *ep, int closed);
void exs__vrb_say_hello(struct vrb_ep *ep);
uint64_t exs__vrb_disc_due(struct vrb_ctx *ctx, uint64_t now_ns);

/* vrb_mr.c */
int exs__vrb_mr_reg(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p);
int exs__vrb_mr_dereg(struct exs_prov_mr *mr);
int exs__vrb_reg_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                    uint32_t *rkey_p);
int exs__vrb_reg_local_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                          uint32_t *rkey_p);
int exs__vrb_ident_cb(void *arg, uintptr_t start, size_t len, uint64_t *id_p);
int exs__vrb_mem_alloc(struct exs_prov_ctx *ctx, size_t len, struct exs_prov_mr **mr_p);
void exs__vrb_mem_free(struct exs_prov_mr *mr);
int exs__vrb_mr_get(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p);
void exs__vrb_mr_put(struct exs_prov_mr *mr);
/* Deregisters a registration grants may lie in: the grant cache's entries over it first. */
void exs__vrb_dereg_cb(void *arg, void *handle);
/* The grant cache's registrations: exactly a grant's range, LOCAL_WRITE | MW_BIND. */
int exs__vrb_reg_bind_cb(void *arg, void *addr, size_t len, void **handle_p, uint32_t *lkey_p,
                         uint32_t *rkey_p);
void exs__vrb_dereg_bind_cb(void *arg, void *handle);
/* 1 when every sge lies inside an mr of ctx (with LOCAL_WRITE when need_lw). */
int exs__vrb_mr_covers(struct vrb_ctx *ctx, const struct exs_prov_sge *sge, int n, int need_lw);

/* Count a grant made (+1) or revoked (-1) over mr: mr_dereg refuses -EBUSY while any lives. */
void exs__vrb_mr_grants_add(struct exs_prov_mr *mr, int delta);
/* The ibv_mr behind a provider mr (for window binds). */
struct ibv_mr *exs__vrb_mr_ibv(struct exs_prov_mr *mr);
/* Extra ibv access flags every registration needs for grants (IBV_ACCESS_MW_BIND or 0). */
int exs__vrb_mr_extra(const struct vrb_ctx *ctx);

/* vrb_grant.c */
/* Choose ctx->grant_mode from the device (and EXS_VRB_GRANT), seed the key generator, log
 * the choice at INFO. */
void exs__vrb_grant_init(struct vrb_ctx *ctx);
const char *exs__vrb_grant_mode_str(enum vrb_grant_mode mode);
int exs__vrb_grant(struct exs_prov_ep *ep, struct exs_prov_mr *mr, void *addr, size_t length,
                   unsigned access, struct exs_prov_grant **grant_p);
void exs__vrb_revoke(struct exs_prov_grant *grant);
int exs__vrb_grant_settle(struct exs_prov_grant *grant);
/* An internal completion (wr_id & VRB_INT_BIT) of ep; ep->lock held. Returns a grant to
 * release with exs__vrb_grant_release once the lock is dropped, or NULL; *settled = 1
 * when grant_settle said -EBUSY for it (the consumer gets an EXS_PROV_WC_GRANT). */
struct vrb_grant *exs__vrb_int_complete(struct vrb_ep *ep, const struct ibv_wc *wc, int *settled);
void exs__vrb_grant_release(struct vrb_grant *g);
/* ep_destroy, QP already out of use: release what binds left behind. */
void exs__vrb_grants_drop(struct vrb_ep *ep);
/* At RTS (cm_lock, nothing posted yet): the ep's fence window, bound (ctx->bind_fence). */
void exs__vrb_fence_arm(struct vrb_ep *ep);
/* ctx_close / device removal (every grant released): the fence page's registration, and
 * the grant cache's (its counters unregistered; nothing cached after). */
void exs__vrb_fence_release(struct vrb_ctx *ctx);

/* vrb_gone.c: the device is going away (its DEVICE_REMOVAL event was acked; cm_lock held):
 * every ep ends (DISCONNECTED or UNREACHABLE with -ENODEV), what was outstanding completes
 * flushed, and every QP, window, registration, cm id, the CQ, its channel and the PD are
 * released, then librdmacm's hold on the device, so that the kernel's removal completes.
 * The ctx stays, empty: ops that would use the device answer -ENODEV. */
void exs__vrb_device_gone(struct vrb_ctx *ctx);
/* cm thread, cm_lock held, while ctx->gone_verbs: list the devices again (librdmacm then
 * closes its context of the removed one); clears gone_verbs once it is no longer listed. */
void exs__vrb_gone_ask(struct vrb_ctx *ctx);
/* Count a ctx of this process on device context vc (+1 at ctx_open, -1 at its close). */
void exs__vrb_dev_hold(struct ibv_context *vc, int delta);
/* A flushed completion of ep's request at seq (VRB_RECV_BIT for a receive), kept for
 * ctx_poll as the device would have flushed it (ctx->lock held, not ep->lock). */
void exs__vrb_flush_push(struct vrb_ctx *ctx, struct vrb_ep *ep, uint64_t seq_bits, uint64_t wr_id,
                         uint8_t opcode);
/* vrb_mr.c: deregister every registration of ctx (gone); the objects stay, empty. */
void exs__vrb_mr_gone(struct vrb_ctx *ctx);
/* vrb_grant.c, ep->lock held, the device going: release ep's windows and registrations;
 * returns how many waited grants (grant_settle said -EBUSY) are to be answered. */
unsigned exs__vrb_grants_gone(struct vrb_ep *ep);

/* vrb_data.c */
/* Slots of a queue ring of depth n (ep->sq, ep->rq): the least power of two >= n; 0 (no
 * ring: the ep is refused) above 2^31. */
uint32_t exs__vrb_slots(uint32_t n);
int exs__vrb_post_send(struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr);
int exs__vrb_post_recv(struct exs_prov_ep *ep, const struct exs_prov_recv_wr *wr);
/* Turn one work completion into a cqe (0) or drop it (-1: its ep is gone, it lies outside
 * its queue's outstanding slots, or it was the provider's own). ctx->lock held; ep->lock
 * is taken only off the success path (spec/threading.md, "verbs completions"). With retire_p NULL
 * the request's queue slot (and the unsignaled ones before it) is retired now; else *retire_p says
 * what to retire once the cqe is returned (exs__vrb_retire). The completions the provider makes for
 * requests before it that were posted unsignaled in its stead (vrb_swr.synth) are kept first; with
 * retire_p NULL the cqe is then kept after them too, and 1 returned. */
int exs__vrb_wc_convert(struct vrb_ctx *ctx, const struct ibv_wc *wc, struct exs_prov_cqe *cqe,
                        uint64_t *retire_p);
/* Retire a kept completion's slot as it is returned. ctx->lock held (no ep->lock: the
 * heads are written under ctx->lock only). */
void exs__vrb_retire(struct exs_prov_ep *ep, uint64_t retire);
enum exs_prov_wc_status exs__vrb_wc_status(enum ibv_wc_status st);
/* ep->lock held: move the QP to ERR so that it flushes (and the ep to ERROR). */
void exs__vrb_ep_kill_locked(struct vrb_ep *ep);
/* ep->lock held: hand the deferred send requests to the QP (one ibv_post_send). */
void exs__vrb_held_post_locked(struct vrb_ep *ep);
/* ep_flush: the same, taking ep->lock. */
void exs__vrb_ep_flush(struct exs_prov_ep *ep);
/* Every ep of ctx holding deferred requests hands them over (ctx->lock held). */
void exs__vrb_held_post_all_locked(struct vrb_ctx *ctx);
/* ep->lock held: forget the deferred requests (their slots stay taken: the caller flushes
 * or discards them) and free their storage. */
void exs__vrb_held_drop_locked(struct vrb_ep *ep);

/* An rdma-core call that enters the kernel (a write() of a command to the uverbs or rdma_cm
 * descriptor, a sysfs read, a close: cancellation points), made with cancellation off
 * (spec/threading.md, "Thread cancellation"): every one of the provider's calls but the
 * data path's (posts, polls: vrb_post_send below), whose kernel entries only rxe and siw
 * make. VRB_NCV: a call without a value. */
#define VRB_NC(_call)                                                                              \
    __extension__({                                                                                \
        int cs_ = exs__nc_begin();                                                                 \
        __typeof__(_call) r_ = (_call);                                                            \
        exs__nc_end(cs_);                                                                          \
        r_;                                                                                        \
    })
#define VRB_NCV(_call)                                                                             \
    do {                                                                                           \
        int cs_ = exs__nc_begin();                                                                 \
        (_call);                                                                                   \
        exs__nc_end(cs_);                                                                          \
    } while (0)

/* ctx->post_kernel: the device's post_send and req_notify_cq enter the kernel (rxe, siw);
 * its post_recv too (siw, whose user library falls back to a command when it could not map
 * the receive queue; a software device of unknown kind). rxe's post_recv writes the
 * user-mapped queue only (rdma-core's rxe_post_recv: its spinlock and a copy). */
#define VRB_PK_SEND 1
#define VRB_PK_RECV 2
int exs__vrb_post_kernel_of(const char *name, int soft);

/* rdma-core's posts, with cancellation off where they enter the kernel (ctx->post_kernel,
 * VRB_PK_*: rxe and siw write() a doorbell command, a cancellation point, under ep->lock;
 * spec/threading.md, "Thread cancellation"); a hardware device's post does not, nor rxe's
 * post_recv (no pthread_setcancelstate then: two atomic updates of the thread's cancel
 * word saved, per receive re-posted on rxe). */
static inline int vrb_nc_begin_if(const struct vrb_ctx *ctx, int pk)
{
    return (ctx->post_kernel & pk) ? exs__nc_begin() : -1;
}

static inline int vrb_nc_begin(const struct vrb_ctx *ctx)
{
    return vrb_nc_begin_if(ctx, VRB_PK_SEND);
}

static inline void vrb_nc_end(int cs)
{
    if (cs >= 0)
        exs__nc_end(cs);
}

static inline int vrb_post_send(const struct vrb_ctx *ctx, struct ibv_qp *qp, struct ibv_send_wr *w,
                                struct ibv_send_wr **bad)
{
    int cs = vrb_nc_begin(ctx), ret = ibv_post_send(qp, w, bad); /* nocancel: ok */

    vrb_nc_end(cs);
    return ret;
}

/* the completion channel's read (always a system call) */
static inline int vrb_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx)
{
    int cs = exs__nc_begin(), ret = ibv_get_cq_event(ch, cq, cq_ctx); /* nocancel: ok */

    exs__nc_end(cs);
    return ret;
}

static inline int vrb_req_notify_cq(const struct vrb_ctx *ctx, struct ibv_cq *cq)
{
    int cs = vrb_nc_begin(ctx), ret = ibv_req_notify_cq(cq, 0); /* nocancel: ok */

    vrb_nc_end(cs);
    return ret;
}

static inline int vrb_post_recv(const struct vrb_ctx *ctx, struct ibv_qp *qp, struct ibv_recv_wr *w,
                                struct ibv_recv_wr **bad)
{
    int cs = vrb_nc_begin_if(ctx, VRB_PK_RECV), ret = ibv_post_recv(qp, w, bad); /* nocancel: ok */

    vrb_nc_end(cs);
    return ret;
}

#endif
