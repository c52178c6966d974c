/* SPDX-License-Identifier: MIT */
/* Verbs provider context: device and port, PD, the shared CQ and its channel, the rdma_cm
 * channel, the event fd, arming and polling, and the ops table. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

#define VRB_DEF_CQ   4096u
#define VRB_POLL_MAX 32

static const struct exs_counter_desc vrb_counter_desc[] = {
    EXS_COUNTER(struct vrb_counters, conns_established, "connections established"),
    EXS_COUNTER(struct vrb_counters, conns_rejected, "connect attempts rejected by the peer"),
    EXS_COUNTER(struct vrb_counters, conns_unreachable, "connect attempts that found no peer"),
    EXS_COUNTER(struct vrb_counters, disconnects, "connections ended"),
    EXS_COUNTER(struct vrb_counters, cm_events, "rdma_cm events processed"),
    EXS_COUNTER(struct vrb_counters, wc_errors, "error completions (not counting flushes)"),
    EXS_COUNTER(struct vrb_counters, stale_cqes, "completions of destroyed eps dropped"),
    EXS_COUNTER(struct vrb_counters, cq_resizes, "completion queue resizes"),
    EXS_COUNTER(struct vrb_counters, sq_full, "post_send refused: send queue full"),
    EXS_COUNTER(struct vrb_counters, connect_ns_total, "sum of connect-to-ESTABLISHED times, ns"),
    EXS_COUNTER(struct vrb_counters, connects_timed, "connects in connect_ns_total"),
    EXS_COUNTER(struct vrb_counters, grants, "remote access grants made"),
    EXS_COUNTER(struct vrb_counters, revokes, "grants revoked"),
    EXS_COUNTER(struct vrb_counters, revokes_early,
                "grants revoked before their bind ran (the ep was ended)"),
    EXS_COUNTER(struct vrb_counters, settle_waits,
                "grant_settle answers -EBUSY: a bind not completed yet (its op waits)"),
    EXS_COUNTER(struct vrb_counters, grant_fails, "grants refused"),
    EXS_COUNTER(struct vrb_counters, grant_room_waits,
                "grants that waited for earlier binds to complete (internal room full)"),
    EXS_COUNTER(struct vrb_counters, binds_unfenced,
                "binds posted without the fence: no request before them outstanding"),
    EXS_COUNTER(struct vrb_counters, ep_nobufs,
                "ep_create refused: the completion queue cannot hold the ep"),
    EXS_COUNTER(struct vrb_counters, device_removals,
                "the device was removed: its connections ended, everything on it released"),
    EXS_COUNTER(struct vrb_counters, cq_event_reads,
                "completion channel reads by ctx_arm (ibv_get_cq_event: a system call)"),
    EXS_COUNTER(struct vrb_counters, cq_event_skips,
                "ctx_arm calls that left the channel unread: no completion since the request"),
    EXS_COUNTER(struct vrb_counters, cq_event_acks,
                "ibv_ack_cq_events calls: the events read are acked in batches of 128"),
    EXS_COUNTER(struct vrb_counters, doorbells,
                "ibv_post_send calls of send requests (a batch of deferred ones is one)"),
    EXS_COUNTER(struct vrb_counters, sends_deferred,
                "send requests held back for their batch (EXS_PROV_SEND_DEFER)"),
    EXS_COUNTER(struct vrb_counters, signals_saved,
                "signaled send requests posted unsignaled: their completions made here"),
    EXS_COUNTER(struct vrb_counters, wc_locked,
                "completions converted under their endpoint's lock (errors, flushes, made "
                "ones, ones polled before their post was published): not the success path"),
};

/* ---- device probing ---- */

static int vrb_port_active(struct ibv_context *vc, const struct ibv_device_attr *da)
{
    for (uint8_t p = 1; p <= da->phys_port_cnt; p++) {
        struct ibv_port_attr pa;

        if (VRB_NC(ibv_query_port(vc, p, &pa)) == 0 && pa.state == IBV_PORT_ACTIVE)
            return p;
    }
    return 0;
}

static int vrb_active_probe(void)
{
    struct ibv_device **list;
    int n = 0, found = 0;

    list = VRB_NC(ibv_get_device_list(&n));
    if (!list)
        return 0;
    for (int i = 0; i < n && !found; i++) {
        struct ibv_context *vc = VRB_NC(ibv_open_device(list[i]));
        struct ibv_device_attr da;

        if (!vc)
            continue;
        if (VRB_NC(ibv_query_device(vc, &da)) == 0 && vrb_port_active(vc, &da))
            found = 1;
        VRB_NC(ibv_close_device(vc));
    }
    ibv_free_device_list(list);
    return found;
}

static pthread_once_t vrb_active_once = PTHREAD_ONCE_INIT;
static int vrb_active;

/* librdmacm opens every device once per process and keeps those contexts for the life of
 * the process; a child forked after that inherits them, and the kernel refuses every
 * command on a device file opened under the parent's credentials (uverbs_write: EACCES,
 * "changed security contexts after opening file descriptor"). So the process that first
 * opened the devices is remembered, and a forked child is told plainly. */
static pid_t vrb_devices_pid;

int exs__vrb_forked_child(void)
{
    pid_t p = __atomic_load_n(&vrb_devices_pid, __ATOMIC_RELAXED);

    return p != 0 && p != getpid();
}

static void vrb_active_init(void)
{
    vrb_active = vrb_active_probe();
}

int exs__prov_verbs_device_active(void)
{
    if (exs__vrb_forked_child()) {
        static int warned;

        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            EXS_WARN(PROV, "verbs: not usable in a child forked after the parent opened the "
                           "RDMA devices; the default provider here is tcp");
        return 0;
    }
    pthread_once(&vrb_active_once, vrb_active_init);
    return vrb_active;
}

/* The port's first IPv4-mapped GID (RoCE): the address 127.0.0.1 stands for. */
static void vrb_find_loop_addr(struct vrb_ctx *ctx)
{
    struct ibv_port_attr pa;

    if (VRB_NC(ibv_query_port(ctx->verbs, ctx->port, &pa)) != 0)
        return;
    for (int i = 0; i < pa.gid_tbl_len && i < 128; i++) {
        union ibv_gid g;
        static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

        if (VRB_NC(ibv_query_gid(ctx->verbs, ctx->port, i, &g)) != 0)
            continue;
        if (memcmp(g.raw, pre, sizeof(pre)) == 0) {
            memcpy(&ctx->loop_addr, g.raw + 12, 4);
            return;
        }
    }
}

/* Which calls of device name enter the kernel (VRB_PK_*, vrb.h): a software device (rxe,
 * siw: its name's prefix, or soft: the "parent" attribute both have in sysfs, the netdev
 * they run over) on each post_send and req_notify_cq; its post_recv too, but rxe's. */
int exs__vrb_post_kernel_of(const char *name, int soft)
{
    if (name && !strncmp(name, "rxe", 3))
        return VRB_PK_SEND;
    if ((name && !strncmp(name, "siw", 3)) || soft)
        return VRB_PK_SEND | VRB_PK_RECV;
    return 0;
}

static int vrb_post_kernel(struct ibv_context *vc)
{
    char path[512];

    snprintf(path, sizeof(path), "%s/parent", vc->device->ibdev_path);
    return exs__vrb_post_kernel_of(ibv_get_device_name(vc->device), access(path, F_OK) == 0);
}

static int vrb_numa_node(struct ibv_context *vc)
{
    char path[512];
    FILE *f;
    int node = -1;

    snprintf(path, sizeof(path), "%s/device/numa_node", vc->device->ibdev_path);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (fscanf(f, "%d", &node) != 1)
        node = -1;
    fclose(f);
    return node;
}

static uint32_t vrb_probe_inline(struct vrb_ctx *ctx, uint32_t want)
{
    struct ibv_qp_init_attr ia;
    struct ibv_qp *qp;

    while (want >= 32) {
        memset(&ia, 0, sizeof(ia));
        ia.send_cq = ia.recv_cq = ctx->cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = 1;
        ia.cap.max_recv_wr = 1;
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        ia.cap.max_inline_data = want;
        qp = VRB_NC(ibv_create_qp(ctx->pd, &ia));
        if (qp) {
            uint32_t got = ia.cap.max_inline_data;

            VRB_NC(ibv_destroy_qp(qp));
            return got >= want ? want : got;
        }
        want /= 2;
    }
    return 0;
}

/* ---- completion ring (ctx->lock) ---- */

int exs__vrb_ring_push(struct vrb_ctx *ctx, const struct vrb_kept *c)
{
    if (ctx->ring_count == ctx->ring_cap) {
        uint32_t ncap = ctx->ring_cap ? ctx->ring_cap * 2 : 256;
        struct vrb_kept *n = malloc(ncap * sizeof(*n));

        if (!n)
            return -ENOMEM;
        for (uint32_t i = 0; i < ctx->ring_count; i++)
            n[i] = ctx->ring[(ctx->ring_head + i) % ctx->ring_cap];
        free(ctx->ring);
        ctx->ring = n;
        ctx->ring_cap = ncap;
        ctx->ring_head = 0;
    }
    ctx->ring[(ctx->ring_head + ctx->ring_count) % ctx->ring_cap] = *c;
    ctx->ring_count++;
    return 0;
}

void exs__vrb_ring_keep(struct vrb_ctx *ctx, const struct vrb_kept *c)
{
    if (exs__vrb_ring_push(ctx, c) == 0)
        return;
    /* no memory to keep it: give its slot back, say what was lost */
    EXS_ERR(PROV, "ctx %p: completion of ep %p (wr_id %llu) lost: no memory", (void *)ctx,
            (void *)c->cqe.ep, (unsigned long long)c->cqe.wr_id);
    exs__vrb_retire(c->cqe.ep, c->retire);
}

/* Poll the CQ into the ring; returns the number added. */
static int vrb_cq_to_ring(struct vrb_ctx *ctx)
{
    struct ibv_wc wc[VRB_POLL_MAX];
    struct vrb_kept k;
    int n, added = 0;

    if (!ctx->cq) /* the device is gone */
        return 0;
    do {
        n = ibv_poll_cq(ctx->cq, VRB_POLL_MAX, wc);
        if (n > 0)
            ctx->cq_seen = 1;
        for (int i = 0; i < n; i++) {
            uint32_t before = ctx->ring_count;

            if (exs__vrb_wc_convert(ctx, &wc[i], &k.cqe, &k.retire) != 0)
                continue;
            exs__vrb_ring_keep(ctx, &k);
            added += (int)(ctx->ring_count - before);
        }
    } while (n == VRB_POLL_MAX);
    return added;
}

void exs__vrb_cq_ack_all(struct vrb_ctx *ctx)
{
    if (!ctx->cq_unacked)
        return;
    EXS_CNT_INC(ctx->cnt.cq_event_acks);
    ibv_ack_cq_events(ctx->cq, (unsigned)ctx->cq_unacked);
    ctx->cq_unacked = 0;
}

void exs__vrb_cq_drain_locked(struct vrb_ctx *ctx)
{
    vrb_cq_to_ring(ctx);
}

void exs__vrb_cq_reap(struct vrb_ctx *ctx)
{
    exs__lite_lock_st(&ctx->lock);
    vrb_cq_to_ring(ctx);
    exs__lite_unlock_st(&ctx->lock);
}

void exs__vrb_ep_hash_add(struct vrb_ctx *ctx, struct vrb_ep *ep)
{
    exs__lite_lock_st(&ctx->lock);
    ep->epid = ++ctx->next_epid & 0xffffffu;
    if (!ep->epid)
        ep->epid = ++ctx->next_epid & 0xffffffu;
    exs_list_add_tail(&ctx->ep_hash[ep->epid % VRB_EP_HASH], &ep->hlink);
    exs_list_add_tail(&ctx->eps, &ep->link);
    exs__lite_unlock_st(&ctx->lock);
}

/* ctx->lock held: nd leaves cm_sw and is freed. */
static void vrb_cm_drop_locked(struct vrb_ctx *ctx, struct vrb_cm_node *nd)
{
    exs_list_del(&nd->link);
    __atomic_store_n(&ctx->cm_sw_n, ctx->cm_sw_n - 1, __ATOMIC_RELAXED);
    free(nd);
}

void exs__vrb_ep_forget(struct vrb_ctx *ctx, struct vrb_ep *ep)
{
    struct exs_list *pos, *tmp;
    uint32_t keep = 0;

    exs__lite_lock_st(&ctx->lock);
    /* completions already in the CQ go to the ring first (others' are kept) */
    vrb_cq_to_ring(ctx);
    exs_list_del(&ep->hlink);
    exs_list_del(&ep->link);
    for (uint32_t i = 0; i < ctx->ring_count; i++) {
        struct vrb_kept *c = &ctx->ring[(ctx->ring_head + i) % ctx->ring_cap];

        if (c->cqe.ep != &ep->base)
            ctx->ring[(ctx->ring_head + keep++) % ctx->ring_cap] = *c;
    }
    ctx->ring_count = keep;
    exs_list_for_each_safe(pos, tmp, &ctx->cm_sw)
    {
        struct vrb_cm_node *nd = exs_list_entry(pos, struct vrb_cm_node, link);

        if (nd->ev.ep == &ep->base)
            vrb_cm_drop_locked(ctx, nd);
    }
    exs__lite_unlock_st(&ctx->lock);
}

void exs__vrb_cm_purge_listener(struct vrb_ctx *ctx, struct exs_prov_listener *lis)
{
    struct exs_list *pos, *tmp;

    exs__lite_lock_st(&ctx->lock);
    exs_list_for_each_safe(pos, tmp, &ctx->cm_sw)
    {
        struct vrb_cm_node *nd = exs_list_entry(pos, struct vrb_cm_node, link);

        if (nd->ev.type == EXS_PROV_CM_CONNECT_REQUEST && nd->ev.listener == lis)
            vrb_cm_drop_locked(ctx, nd);
    }
    exs__lite_unlock_st(&ctx->lock);
}

void exs__vrb_cm_push_locked(struct vrb_ctx *ctx, const struct exs_prov_cm_event *ev)
{
    struct vrb_cm_node *nd = malloc(sizeof(*nd));

    if (!nd) {
        EXS_ERR(PROV, "ctx %p: cm event %s lost (no memory)", (void *)ctx,
                exs__prov_cm_event_str(ev->type));
        return;
    }
    nd->ev = *ev;
    exs_list_add_tail(&ctx->cm_sw, &nd->link);
    __atomic_store_n(&ctx->cm_sw_n, ctx->cm_sw_n + 1, __ATOMIC_RELEASE);
}

void exs__vrb_wake(struct vrb_ctx *ctx)
{
    uint64_t one = 1;

    if (exs__nc_write(ctx->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: eventfd write: %m", (void *)ctx);
    /* after the write: ctx_arm that sees the flag finds the count to read; one that
     * misses it leaves the descriptor readable, and the next arm reads it */
    __atomic_store_n(&ctx->wake_pending, 1, __ATOMIC_RELEASE);
}

void exs__vrb_cm_push(struct vrb_ctx *ctx, const struct exs_prov_cm_event *ev)
{
    exs__lite_lock_st(&ctx->lock);
    exs__vrb_cm_push_locked(ctx, ev);
    exs__lite_unlock_st(&ctx->lock);
    exs__vrb_wake(ctx);
}

/* ---- ops ---- */

static int vrb_ctx_event_fd(struct exs_prov_ctx *c)
{
    return vrb_ctx_of(c)->epfd;
}

static int vrb_ctx_arm(struct exs_prov_ctx *c)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    struct ibv_cq *cq;
    void *cq_ctx;
    uint64_t v;
    int busy;

    exs__lite_lock_st(&ctx->lock);
    if (__atomic_load_n(&ctx->held_eps, __ATOMIC_RELAXED))
        exs__vrb_held_post_all_locked(ctx);
    /* One CQ, so at most one event per request for notification: read only while one is
     * requested, once; request again only when it was used up (a request whose event has
     * not come yet still stands). Each skipped call is a system call on rxe. And read
     * only when a completion was taken from the CQ since the request (or since a read
     * found nothing): an event comes only for a completion added after the request,
     * which is then either still in the CQ (the poll below finds it: -EAGAIN, and the
     * next arm reads) or was taken already. An event left unread only keeps the
     * descriptor readable: a wake-up, never a lost one (the request is renewed only
     * once its event was read). */
    if (ctx->ch && ctx->cq_armed) {
        if (!ctx->cq_seen) {
            EXS_CNT_INC(ctx->cnt.cq_event_skips);
        } else {
            EXS_CNT_INC(ctx->cnt.cq_event_reads);
            if (vrb_get_cq_event(ctx->ch, &cq, &cq_ctx) == 0) {
                EXS_ASSERT(cq == ctx->cq); /* the one CQ */
                if (++ctx->cq_unacked >= VRB_ACKS)
                    exs__vrb_cq_ack_all(ctx); /* a mutex and a signal per batch only */
                ctx->cq_armed = 0;
            } else {
                ctx->cq_seen = 0;
            }
        }
    }
    if (__atomic_exchange_n(&ctx->wake_pending, 0, __ATOMIC_ACQ_REL) &&
        exs__nc_read(ctx->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: eventfd read: %m", (void *)ctx);
    if (ctx->cq && !ctx->cq_armed) {
        if (vrb_req_notify_cq(ctx, ctx->cq) != 0) {
            EXS_ERR(PROV, "ctx %p: ibv_req_notify_cq failed", (void *)ctx);
        } else {
            ctx->cq_armed = 1;
            ctx->cq_seen = 0;
        }
    }
    busy = ctx->ring_count || !exs_list_empty(&ctx->cm_sw);
    if (!busy)
        busy = vrb_cq_to_ring(ctx) > 0;
    exs__lite_unlock_st(&ctx->lock);
    return busy ? -EAGAIN : 0;
}

/* Return kept completions into cqe[n..max) (ctx->lock held), retiring their slots. */
static int vrb_ring_pop(struct vrb_ctx *ctx, struct exs_prov_cqe *cqe, int n, int max)
{
    while (n < max && ctx->ring_count) {
        cqe[n] = ctx->ring[ctx->ring_head].cqe;
        exs__vrb_retire(cqe[n].ep, ctx->ring[ctx->ring_head].retire);
        n++;
        ctx->ring_head = (ctx->ring_head + 1) % ctx->ring_cap;
        ctx->ring_count--;
    }
    return n;
}

/* ctx_poll's all but the empty turn (ctx->lock held, given back): got completions already
 * taken into wc (asking for at most max and VRB_POLL_MAX), or, got 0, none polled yet
 * (deferred requests, kept completions or no CQ). */
static __attribute__((noinline)) int vrb_ctx_poll_more(struct vrb_ctx *ctx,
                                                       struct exs_prov_cqe *cqe, int max,
                                                       struct ibv_wc *wc, int got)
{
    int n = 0, want = EXS_MIN(max, VRB_POLL_MAX);

    if (!got) {
        if (__atomic_load_n(&ctx->held_eps, __ATOMIC_RELAXED))
            exs__vrb_held_post_all_locked(ctx);
        /* Kept completions are returned alone: they were mostly taken by ctx_arm's poll,
         * which left the CQ empty just before, so a poll now would mostly find nothing
         * (an empty ibv_poll_cq, ~50 instructions on rxe). What came since stays in the
         * CQ for the next call or ctx_arm's poll (its -EAGAIN): nothing is left unseen. */
        if (ctx->ring_count) {
            n = vrb_ring_pop(ctx, cqe, n, max);
            exs__lite_unlock_st(&ctx->lock);
            return n;
        }
        got = ctx->cq ? ibv_poll_cq(ctx->cq, want, wc) : 0;
    }
    while (got > 0) {
        ctx->cq_seen = 1;
        for (int i = 0; i < got; i++) {
            struct vrb_kept k;

            if (!ctx->ring_count) {
                if (exs__vrb_wc_convert(ctx, &wc[i], &cqe[n], NULL) == 0)
                    n++;
            } else if (exs__vrb_wc_convert(ctx, &wc[i], &k.cqe, &k.retire) == 0) {
                /* behind completions the provider made and kept: in order, kept too */
                exs__vrb_ring_keep(ctx, &k);
            }
        }
        if (ctx->ring_count)
            n = vrb_ring_pop(ctx, cqe, n, max);
        if (got < want || n >= max || !ctx->cq)
            break;
        want = EXS_MIN(max - n, VRB_POLL_MAX);
        got = ibv_poll_cq(ctx->cq, want, wc);
    }
    exs__lite_unlock_st(&ctx->lock);
    return n;
}

/* A busy poller's turn mostly finds nothing: this is the lock, one ibv_poll_cq and the
 * unlock (a plain store: the _st pair, vrb.h); the rest (vrb_ctx_poll_more) is out of
 * line, so an empty turn does not save and restore its registers (a third of this
 * function's own instructions per empty turn, bench-rxe-cg's busy client). */
static inline __attribute__((always_inline)) int vrb_ctx_poll_in(struct vrb_ctx *ctx,
                                                                 struct exs_prov_cqe *cqe, int max)
{
    struct ibv_wc wc[VRB_POLL_MAX];
    int got;

    if (max <= 0)
        return 0;
    exs__lite_lock_st(&ctx->lock);
    if (__atomic_load_n(&ctx->held_eps, __ATOMIC_RELAXED) || ctx->ring_count || !ctx->cq)
        return vrb_ctx_poll_more(ctx, cqe, max, wc, 0);
    got = ibv_poll_cq(ctx->cq, EXS_MIN(max, VRB_POLL_MAX), wc);
    if (got > 0)
        return vrb_ctx_poll_more(ctx, cqe, max, wc, got);
    exs__lite_unlock_st(&ctx->lock);
    return 0;
}

static int vrb_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max)
{
    return vrb_ctx_poll_in(vrb_ctx_of(c), cqe, max);
}

/* The engine's round calls ctx_progress then ctx_poll (prov.h, ctx_progress_poll): verbs
 * has no progress of its own (the device, and rdma_cm's thread, make it), so its round is
 * the poll alone, one indirect call a turn where the default progress made two. */
static int vrb_ctx_progress_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max,
                                 int *n_p)
{
    *n_p = vrb_ctx_poll_in(vrb_ctx_of(c), cqe, max);
    return 0;
}

static int vrb_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    struct exs_list *l;
    struct vrb_cm_node *nd;

    /* the progress round asks at every turn: no lock while nothing is queued (an event
     * pushed meanwhile is found at the next turn, or wakes a sleeper's arm) */
    if (!__atomic_load_n(&ctx->cm_sw_n, __ATOMIC_ACQUIRE))
        return 0;
    exs__lite_lock_st(&ctx->lock);
    l = exs_list_pop_head(&ctx->cm_sw);
    if (l)
        __atomic_store_n(&ctx->cm_sw_n, ctx->cm_sw_n - 1, __ATOMIC_RELAXED);
    exs__lite_unlock_st(&ctx->lock);
    if (!l)
        return 0;
    nd = exs_list_entry(l, struct vrb_cm_node, link);
    *ev = nd->ev;
    free(nd);
    return 1;
}

/* The cm thread: rdma_cm must progress (address and route resolution, the REQ, the DREP)
 * even when the application polls only the other side, as a NIC would. It turns rdma_cm
 * events into provider events on ctx->cm_sw. */
static void *vrb_cm_main(void *arg)
{
    struct vrb_ctx *ctx = arg;
    struct exs_prov_cm_event ev;
    struct pollfd pfd[3];
    uint64_t due = 0;

    for (;;) {
        int timeout = -1, n;

        if (due) {
            uint64_t now = exs__now_ns();

            timeout = due > now ? (int)((due - now) / 1000000u) + 1 : 0;
        }
        if (ctx->gone_verbs && (timeout < 0 || timeout > 100))
            timeout = 100; /* the removed device: librdmacm is asked again */
        pfd[0] = (struct pollfd){.fd = ctx->cmch->fd, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = ctx->stopfd, .events = POLLIN};
        pfd[2] = (struct pollfd){.fd = ctx->udpfd, .events = POLLIN};
        n = exs__nc_poll(pfd, ctx->udpfd >= 0 ? 3 : 2, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            EXS_ERR(PROV, "ctx %p: cm thread poll: %m", (void *)ctx);
            break;
        }
        if (pfd[1].revents)
            break;
        pthread_mutex_lock(&ctx->cm_lock);
        if (ctx->udpfd >= 0)
            exs__vrb_udp_input(ctx);
        while (exs__vrb_cm_process(ctx, &ev) == 1)
            exs__vrb_cm_push(ctx, &ev);
        if (ctx->udpfd >= 0)
            exs__vrb_udp_input(ctx);
        due = exs__vrb_disc_due(ctx, exs__now_ns());
        exs__vrb_gone_ask(ctx);
        pthread_mutex_unlock(&ctx->cm_lock);
    }
    return NULL;
}

/* The goodbye socket: UDP on the rdma_cm addresses (IPoIB on InfiniBand). */
static void vrb_udp_open(struct vrb_ctx *ctx)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return;
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0) {
        exs__nc_close(fd);
        return;
    }
    ctx->udpfd = fd;
    ctx->udp_port = sin.sin_port;
}

/* The device's removal is told (RDMA_CM_EVENT_DEVICE_REMOVAL) to the cm ids bound to it
 * only: one bound to the device's address (rdma_cm's UDP port space, port 0: no TCP port
 * is taken) makes sure it reaches the ctx with no ep or listener open. Without an IPv4
 * address there is none; the eps' and listeners' own ids still tell it. */
static void vrb_watch_open(struct vrb_ctx *ctx)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr = ctx->loop_addr};

    if (!ctx->loop_addr.s_addr)
        return;
    ctx->watch_cmo.kind = VRB_K_WATCH;
    if (VRB_NC(rdma_create_id(ctx->cmch, &ctx->watch_id, &ctx->watch_cmo, RDMA_PS_UDP))) {
        ctx->watch_id = NULL;
    } else if (VRB_NC(rdma_bind_addr(ctx->watch_id, (struct sockaddr *)&sin))) {
        VRB_NC(rdma_destroy_id(ctx->watch_id));
        ctx->watch_id = NULL;
    }
    if (!ctx->watch_id)
        EXS_DBG(PROV, "ctx %p: no device watch id: %m", (void *)ctx);
}

/* ---- open / close ---- */

static int vrb_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static int vrb_epoll_add(int epfd, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN};

    ev.data.fd = fd;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static void vrb_ctx_free(struct vrb_ctx *ctx)
{
    struct exs_list *l;
    uint64_t one = 1;

    if (ctx->cm_thread_on) {
        if (exs__nc_write(ctx->stopfd, &one, sizeof(one)) < 0)
            EXS_ERR(PROV, "ctx %p: stop write: %m", (void *)ctx);
        pthread_join(ctx->cm_thread, NULL); /* nocancel: ok (exs_fini: off) */
    }
    exs__vrb_cache_counters(&ctx->mc, &ctx->rc, &ctx->qpc, 0);
    exs__vrb_qpc_fini(&ctx->qpc);
    exs__vrb_rc_fini(&ctx->rc);
    exs__vrb_mc_fini(&ctx->mc);
    if (ctx->pagemap_fd >= 0)
        exs__nc_close(ctx->pagemap_fd);
    while ((l = exs_list_pop_head(&ctx->cm_sw)) != NULL)
        free(exs_list_entry(l, struct vrb_cm_node, link));
    if (ctx->watch_id)
        VRB_NC(rdma_destroy_id(ctx->watch_id));
    if (ctx->cq) {
        exs__vrb_cq_ack_all(ctx); /* ibv_destroy_cq waits for every event read */
        VRB_NC(ibv_destroy_cq(ctx->cq));
    }
    if (ctx->ch)
        VRB_NC(ibv_destroy_comp_channel(ctx->ch));
    exs__vrb_fence_release(ctx);
    if (ctx->pd)
        VRB_NC(ibv_dealloc_pd(ctx->pd));
    if (ctx->cmch)
        VRB_NCV(rdma_destroy_event_channel(ctx->cmch));
    if (ctx->devlist) {
        if (ctx->verbs)
            exs__vrb_dev_hold(ctx->verbs, -1);
        rdma_free_devices(ctx->devlist);
    }
    if (ctx->evfd >= 0)
        exs__nc_close(ctx->evfd);
    if (ctx->stopfd >= 0)
        exs__nc_close(ctx->stopfd);
    if (ctx->udpfd >= 0)
        exs__nc_close(ctx->udpfd);
    if (ctx->epfd >= 0)
        exs__nc_close(ctx->epfd);
    free(ctx->ring);
    pthread_mutex_destroy(&ctx->cm_lock);
    pthread_rwlock_destroy(&ctx->mr_lock);
    pthread_rwlock_destroy(&ctx->dev_lock);
    free(ctx);
}

static uint32_t vrb_clamp32(uint64_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

/* The device and port the address addr (EXS_VRB_ADDR) is on: what rdma_cm binds it to.
 * Loopback addresses say nothing (any device loops back): name stays empty. */
static int vrb_addr_device(const char *addr, char *name, size_t len, int *port_p)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST}, *ai = NULL;
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id = NULL;
    int ret = -EADDRNOTAVAIL;

    name[0] = 0;
    *port_p = 0;
    if (getaddrinfo(addr, NULL, &hints, &ai) != 0 || !ai) {
        EXS_ERR(PROV, "EXS_VRB_ADDR %s: not a numeric IP address", addr);
        return -EINVAL;
    }
    if (ai->ai_family == AF_INET &&
        (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127) {
        freeaddrinfo(ai);
        return 0;
    }
    ch = VRB_NC(rdma_create_event_channel());
    if (ch && VRB_NC(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) == 0 &&
        VRB_NC(rdma_bind_addr(id, ai->ai_addr)) == 0 && id->verbs) {
        snprintf(name, len, "%s", ibv_get_device_name(id->verbs->device));
        *port_p = id->port_num;
        ret = 0;
    } else {
        EXS_ERR(PROV, "EXS_VRB_ADDR %s: no RDMA device holds this address", addr);
    }
    if (id)
        VRB_NC(rdma_destroy_id(id));
    if (ch)
        VRB_NCV(rdma_destroy_event_channel(ch));
    freeaddrinfo(ai);
    return ret;
}

/* Choose the device and port: by name (attr->device, else EXS_VRB_DEVICE, "NAME[:PORT]"),
 * by address (EXS_VRB_ADDR), else the first device with an active port. */
static int vrb_select(struct vrb_ctx *ctx, const struct exs_prov_attr *attr, int n)
{
    const char *spec =
        attr && attr->device && attr->device[0] ? attr->device : exs__params.vrb_device;
    char want[EXS_PARAM_STR_MAX] = "", by_addr[EXS_PARAM_STR_MAX] = "";
    int want_port = 0, addr_port = 0, ret;
    char *colon;

    snprintf(want, sizeof(want), "%s", spec);
    colon = strchr(want, ':');
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);

        if (*end || p < 1 || p > 255) {
            EXS_ERR(PROV, "verbs device %s: bad port (NAME or NAME:PORT)", spec);
            return -EINVAL;
        }
        *colon = 0;
        want_port = (int)p;
    }
    if (exs__params.vrb_addr[0]) {
        ret = vrb_addr_device(exs__params.vrb_addr, by_addr, sizeof(by_addr), &addr_port);
        if (ret)
            return ret;
        if (by_addr[0] && want[0] &&
            (strcmp(by_addr, want) != 0 || (want_port && want_port != addr_port))) {
            EXS_ERR(PROV, "EXS_VRB_ADDR %s is on %s port %d, not on the device asked for (%s)",
                    exs__params.vrb_addr, by_addr, addr_port, spec);
            return -ENODEV;
        }
        if (by_addr[0]) {
            snprintf(want, sizeof(want), "%s", by_addr);
            want_port = addr_port;
        }
    }
    for (int i = 0; i < n && !ctx->verbs; i++) {
        struct ibv_context *vc = ctx->devlist[i];
        struct ibv_device_attr da;
        struct ibv_port_attr pa;
        int port;

        if (want[0] && strcmp(want, ibv_get_device_name(vc->device)) != 0)
            continue;
        if (VRB_NC(ibv_query_device(vc, &da)) != 0)
            continue;
        if (want_port)
            port = want_port <= da.phys_port_cnt &&
                           VRB_NC(ibv_query_port(vc, (uint8_t)want_port, &pa)) == 0 &&
                           pa.state == IBV_PORT_ACTIVE
                       ? want_port
                       : 0;
        else
            port = vrb_port_active(vc, &da);
        if (!port)
            continue;
        ctx->verbs = vc;
        ctx->post_kernel = vrb_post_kernel(vc);
        ctx->dattr = da;
        ctx->port = (uint8_t)port;
    }
    if (!ctx->verbs) {
        if (want[0])
            EXS_ERR(PROV, "verbs: no device %s%s%.0d with an active port", want,
                    want_port ? " port " : "", want_port);
        else
            EXS_DBG(PROV, "verbs: no device with an active port");
        return -ENODEV;
    }
    return 0;
}

static pthread_once_t vrb_fork_once = PTHREAD_ONCE_INIT;

static void vrb_fork_init(void)
{
    int rc = VRB_NC(ibv_fork_init());

    if (rc)
        EXS_WARN(PROV, "ibv_fork_init: %s", strerror(rc));
    else
        EXS_INFO(PROV, "verbs: fork-safe memory registration on (vrb_fork_safe)");
}

static int vrb_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    struct vrb_ctx *ctx;
    struct ibv_port_attr pa;
    struct vrb_reg_ops rops;
    int n = 0, ret, backing;
    uint64_t cq_size;

    exs__params_load();
    if (exs__params.vrb_fork_safe)
        pthread_once(&vrb_fork_once, vrb_fork_init);
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->evfd = ctx->epfd = ctx->stopfd = ctx->udpfd = ctx->pagemap_fd = -1;
    exs_list_init(&ctx->disc_wait);
    ctx->tok_base = exs__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)ctx;
    pthread_mutex_init(&ctx->cm_lock, NULL);
    exs_list_init(&ctx->cm_sw);
    exs_list_init(&ctx->eps);
    exs_list_init(&ctx->listeners);
    for (unsigned i = 0; i < VRB_EP_HASH; i++)
        exs_list_init(&ctx->ep_hash[i]);
    pthread_rwlock_init(&ctx->mr_lock, NULL);
    pthread_rwlock_init(&ctx->dev_lock, NULL);
    for (unsigned i = 0; i < VRB_MR_HASH; i++)
        exs_list_init(&ctx->mr_hash[i]);
    ctx->pagemap_fd = exs__nc_open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    rops = (struct vrb_reg_ops){
        .reg = exs__vrb_reg_cb, .dereg = exs__vrb_dereg_cb, .ident = exs__vrb_ident_cb, .arg = ctx};
    exs__vrb_qpc_init(&ctx->qpc, (unsigned)EXS_MIN(exs__params.vrb_qp_cache, 65536u),
                      exs__vrb_qp_destroy_cb, ctx);
    exs__vrb_rc_init(&ctx->rc, (unsigned)EXS_MIN(exs__params.vrb_regcache_max, 1u << 20), &rops);
    rops =
        (struct vrb_reg_ops){.reg = exs__vrb_reg_local_cb, .dereg = exs__vrb_dereg_cb, .arg = ctx};

    if (exs__vrb_forked_child()) {
        EXS_ERR(PROV,
                "verbs: this process was forked from one that had opened the RDMA "
                "devices (pid %d); librdmacm's contexts cannot be used here: exec a new "
                "program, or set EXS_PROVIDER=tcp",
                (int)vrb_devices_pid);
        ret = -EOPNOTSUPP;
        goto fail;
    }
    ctx->devlist = VRB_NC(rdma_get_devices(&n));
    if (ctx->devlist && n > 0 && !__atomic_load_n(&vrb_devices_pid, __ATOMIC_RELAXED))
        __atomic_store_n(&vrb_devices_pid, getpid(), __ATOMIC_RELAXED);
    if (!ctx->devlist || n <= 0) {
        EXS_DBG(PROV, "verbs: no RDMA device");
        ret = -ENODEV;
        goto fail;
    }
    ret = vrb_select(ctx, attr, n);
    if (ret)
        goto fail;
    exs__vrb_dev_hold(ctx->verbs, 1);
    if (VRB_NC(ibv_query_port(ctx->verbs, ctx->port, &pa)) != 0) {
        ret = -ENODEV;
        goto fail;
    }
    vrb_find_loop_addr(ctx);
    exs__vrb_grant_init(ctx); /* before any registration: it decides their access flags */
    ctx->pd = VRB_NC(ibv_alloc_pd(ctx->verbs));
    ctx->ch = VRB_NC(ibv_create_comp_channel(ctx->verbs));
    ctx->cmch = VRB_NC(rdma_create_event_channel());
    ctx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!ctx->pd || !ctx->ch || !ctx->cmch || ctx->evfd < 0 || ctx->epfd < 0 || ctx->stopfd < 0) {
        ret = errno ? -errno : -ENOMEM;
        goto fail;
    }
    cq_size = attr && attr->cq_size ? attr->cq_size : exs__params.vrb_cq_size;
    ctx->cq_cap = (int)vrb_clamp32(cq_size, 64, (uint32_t)EXS_MAX(ctx->dattr.max_cqe, 64));
    ctx->cq = VRB_NC(ibv_create_cq(ctx->verbs, ctx->cq_cap, ctx, ctx->ch, 0));
    if (!ctx->cq) {
        ret = errno ? -errno : -ENOMEM;
        goto fail;
    }
    ctx->cq_cap = ctx->cq->cqe;
    ret = vrb_set_nonblock(ctx->ch->fd);
    if (!ret)
        ret = vrb_set_nonblock(ctx->cmch->fd);
    if (!ret)
        ret = vrb_epoll_add(ctx->epfd, ctx->ch->fd);
    if (!ret)
        ret = vrb_epoll_add(ctx->epfd, ctx->evfd);
    if (ret)
        goto fail;
    if (vrb_req_notify_cq(ctx, ctx->cq) != 0)
        EXS_WARN(PROV, "ctx %p: ibv_req_notify_cq failed", (void *)ctx);
    else
        ctx->cq_armed = 1;

    ctx->qp_timeout = (uint8_t)vrb_clamp32(exs__params.vrb_qp_timeout, 0, 31);
    ctx->retry_cnt = (uint8_t)vrb_clamp32(exs__params.vrb_retry_cnt, 0, 7);
    ctx->rnr_retry = (uint8_t)vrb_clamp32(exs__params.vrb_rnr_retry, 0, 7);
    ctx->max_inline = vrb_probe_inline(ctx, vrb_clamp32(exs__params.vrb_max_inline, 0, 4096));

    exs__vrb_ctx_base_init(ctx);
    ctx->base.caps.flags = EXS_PROV_CAP_WRITE_IMM | EXS_PROV_CAP_READ | EXS_PROV_CAP_DEFER |
                           (ctx->max_inline ? EXS_PROV_CAP_INLINE : 0);
    ctx->base.caps.max_inline = ctx->max_inline;
    ctx->base.caps.max_sge = vrb_clamp32((uint64_t)ctx->dattr.max_sge, 1, VRB_MAX_SGE);
    {
        /* the provider's own requests (window binds) take VRB_INT_ROOM more; one ep of the
         * largest depths must fit in the completion queue (ep_create reserves them all) */
        uint64_t qp = (uint64_t)ctx->dattr.max_qp_wr;
        uint64_t cq = (uint64_t)EXS_MAX(ctx->dattr.max_cqe, ctx->cq_cap);

        qp -= EXS_MIN(qp / 2, ctx->int_room);
        cq = cq > 2 * (uint64_t)ctx->int_room + 2 ? (cq - ctx->int_room) / 2 : 1;
        ctx->base.caps.max_send_wr = vrb_clamp32(EXS_MIN(qp, cq), 1, 1u << 20);
        ctx->base.caps.max_recv_wr = ctx->base.caps.max_send_wr;
    }
    ctx->base.caps.max_private_data = VRB_PD_MAX;
    ctx->base.caps.max_msg_size = pa.max_msg_sz ? pa.max_msg_sz : (1ull << 31);
    /* what the CQ can grow to; ep_create reserves every completion of an ep in it */
    ctx->base.caps.max_cqe = (uint32_t)EXS_MAX(ctx->dattr.max_cqe, ctx->cq_cap);

    backing = exs__vrb_mc_backing_parse(exs__params.vrb_mem_alloc);
    if (backing < 0) {
        EXS_WARN(PROV, "vrb_mem_alloc %s: unknown, using anon", exs__params.vrb_mem_alloc);
        backing = VRB_MEM_ANON;
    }
    ret = exs__vrb_mc_init(&ctx->mc, exs__params.vrb_mcache_region, (enum vrb_mem_backing)backing,
                           vrb_numa_node(ctx->verbs), exs__params.vrb_mcache_idle_ms, &rops);
    if (ret)
        goto fail;
    ctx->mc.guard = exs__params.vrb_mcache_guard;
    vrb_watch_open(ctx);
    vrb_udp_open(ctx);
    ret = exs__thread_create(&ctx->cm_thread, "exs-vrb-cm", vrb_cm_main, ctx);
    if (ret)
        goto fail;
    ctx->cm_thread_on = 1;
    exs__vrb_cache_counters(&ctx->mc, &ctx->rc, &ctx->qpc, 1);
    ctx->cset.name = "prov.verbs";
    ctx->cset.desc = vrb_counter_desc;
    ctx->cset.count = EXS_ARRAY_SIZE(vrb_counter_desc);
    ctx->cset.base = &ctx->cnt;
    exs__counters_register(&ctx->cset);
    exs__prov_set_device(&ctx->base, ibv_get_device_name(ctx->verbs->device), ctx->port);
    EXS_INFO(PROV, "verbs ctx %p: device %s port %u, cq %d, inline %u, sge %u, loopback %s",
             (void *)ctx, ibv_get_device_name(ctx->verbs->device), ctx->port, ctx->cq_cap,
             ctx->max_inline, ctx->base.caps.max_sge,
             ctx->loop_addr.s_addr ? inet_ntoa(ctx->loop_addr) : "-");
    *ctx_p = &ctx->base;
    return 0;
fail:
    vrb_ctx_free(ctx);
    return ret;
}

static void vrb_ctx_close(struct exs_prov_ctx *c)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);

    if (!ctx)
        return;
    if (!exs_list_empty(&ctx->eps))
        EXS_WARN(PROV, "ctx %p: closed with endpoints left", (void *)ctx);
    exs__counters_unregister(&ctx->cset);
    vrb_ctx_free(ctx);
}

void exs__vrb_ctx_base_init(struct vrb_ctx *ctx)
{
    ctx->base.ops = &exs__prov_verbs_ops;
    /* exs__prov_cm_poll looks at the count of queued cm events without calling
     * ctx_cm_poll (a busy poller's every turn asks) */
    ctx->base.cm_queued = &ctx->cm_sw_n;
}

struct exs_prov_ops exs__prov_verbs_ops = {
    .name = "verbs",
    .ctx_open = vrb_ctx_open,
    .ctx_close = vrb_ctx_close,
    .ctx_event_fd = vrb_ctx_event_fd,
    .ctx_arm = vrb_ctx_arm,
    .ctx_poll = vrb_ctx_poll,
    .ctx_progress_poll = vrb_ctx_progress_poll,
    .ctx_cm_poll = vrb_ctx_cm_poll,
    .mr_reg = exs__vrb_mr_reg,
    .mr_dereg = exs__vrb_mr_dereg,
    .mem_alloc = exs__vrb_mem_alloc,
    .mem_free = exs__vrb_mem_free,
    .mr_get = exs__vrb_mr_get,
    .mr_put = exs__vrb_mr_put,
    .grant = exs__vrb_grant,
    .revoke = exs__vrb_revoke,
    .grant_settle = exs__vrb_grant_settle,
    .ep_create = exs__vrb_ep_create,
    .ep_destroy = exs__vrb_ep_destroy,
    .ep_state = exs__vrb_ep_state,
    .ep_local_addr = exs__vrb_ep_local_addr,
    .listen = exs__vrb_listen,
    .listener_addr = exs__vrb_listener_addr,
    .listener_destroy = exs__vrb_listener_destroy,
    .connect = exs__vrb_connect,
    .accept = exs__vrb_accept,
    .reject = exs__vrb_reject,
    .disconnect = exs__vrb_disconnect,
    .post_recv = exs__vrb_post_recv,
    .post_send = exs__vrb_post_send,
    .ep_flush = exs__vrb_ep_flush,
};
