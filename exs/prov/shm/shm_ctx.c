/* SPDX-License-Identifier: MIT */
/* The shm provider's context: turns of the NIC role, its thread or manual progress, sleeping
 * with doorbells, the completion and cm queues. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* SHM_TAG_CTX objects (the pointer part of the epoll data) */
enum { SHM_CTX_BELL = 0, SHM_CTX_TIMER = 4, SHM_CTX_EVFD = 8 };

static const struct exs_counter_desc shm_counter_desc[] = {
    EXS_COUNTER(struct shm_counters, recs_tx, "requests written into rings"),
    EXS_COUNTER(struct shm_counters, recs_rx, "requests carried out from rings"),
    EXS_COUNTER(struct shm_counters, bytes_tx, "payload bytes of requests posted"),
    EXS_COUNTER(struct shm_counters, bytes_rx, "payload bytes placed or read for peers"),
    EXS_COUNTER(struct shm_counters, inline_rx, "requests whose payload rode in the ring"),
    EXS_COUNTER(struct shm_counters, copies, "process_vm_readv / writev calls"),
    EXS_COUNTER(struct shm_counters, naks_tx, "requests refused (NAK published)"),
    EXS_COUNTER(struct shm_counters, naks_rx, "NAKs received"),
    EXS_COUNTER(struct shm_counters, rnr_waits, "receiver-not-ready pauses"),
    EXS_COUNTER(struct shm_counters, rnr_naks, "receiver-not-ready retries exhausted"),
    EXS_COUNTER(struct shm_counters, access_errors, "remote access checks failed here"),
    EXS_COUNTER(struct shm_counters, protocol_errors,
                "connections ended by a lying peer (ring, answers or handshake)"),
    EXS_COUNTER(struct shm_counters, flushed_wrs, "work requests completed with WR_FLUSH_ERR"),
    EXS_COUNTER(struct shm_counters, conns_established, "connections established"),
    EXS_COUNTER(struct shm_counters, conns_rejected, "connection requests rejected"),
    EXS_COUNTER(struct shm_counters, conns_unreachable, "connects that failed"),
    EXS_COUNTER(struct shm_counters, bogus_conns, "incoming connections closed in handshake"),
    EXS_COUNTER(struct shm_counters, hello_refused,
                "accepted rendezvous sockets closed: no request by the deadline "
                "(EXS_TCP_HELLO_MS)"),
    EXS_COUNTER(struct shm_counters, rendezvous_closed,
                "accepted rendezvous sockets closed by the other side before a request (an "
                "active side's look at this listener: spec/provider-shm.md, Chosen by itself)"),
    EXS_COUNTER(struct shm_counters, peer_deaths,
                "connections whose peer process ended (pidfd) or closed the socket"),
    EXS_COUNTER(struct shm_counters, ring_full, "posts that waited for ring room"),
    EXS_COUNTER(struct shm_counters, ring_pads,
                "PAD records written: the ring found empty beyond the hot window "
                "(SHM_HOT_WINDOW), the next record at the ring's start"),
    EXS_COUNTER(struct shm_counters, bells_tx, "doorbells written to a sleeping peer"),
    EXS_COUNTER(struct shm_counters, bells_rx, "doorbells read"),
    EXS_COUNTER(struct shm_counters, turns, "turns of the NIC role"),
    EXS_COUNTER(struct shm_counters, collects,
                "turns that read the descriptors (epoll_wait): a busy poller's every "
                "64th idle turn"),
    EXS_COUNTER(struct shm_counters, sleeps, "sleeps of the NIC thread or armed consumers"),
    EXS_COUNTER(struct shm_counters, direct_cqes,
                "completions handed to the caller of ctx_progress_poll inside its turn (the "
                "engine's rounds), never queued"),
    EXS_COUNTER(struct shm_counters, ring_mem,
                "shared memory the live connections' segments can hold, bytes: each one's header "
                "and two rings of the size agreed (EXS_SHM_RING_KB, the smaller side's); not a "
                "counter, the sum now"),
};

static void shm_fd_bump(int fd)
{
    uint64_t one = 1;

    if (exs__nc_write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "eventfd write: %m");
}

static void shm_fd_drain(int fd)
{
    uint64_t v;

    if (exs__nc_read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "eventfd read: %m");
}

void exs__shm_ctx_wake(struct shm_ctx *ctx)
{
    shm_fd_bump(ctx->bell);
}

int exs__shm_epoll_add(struct shm_ctx *ctx, int fd, void *ptr, unsigned tag)
{
    struct epoll_event ev = {.events = EPOLLIN};

    ev.data.u64 = (uint64_t)(uintptr_t)ptr | tag;
    if (tag == SHM_TAG_CONN)
        ev.events |= EPOLLRDHUP;
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
        return -errno;
    return 0;
}

void exs__shm_epoll_del(struct shm_ctx *ctx, int fd)
{
    if (fd >= 0)
        (void)epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, fd, NULL);
}

void exs__shm_timer_set(struct shm_ctx *ctx, uint64_t at)
{
    struct itimerspec its;

    if (ctx->timer_armed_ns && ctx->timer_armed_ns <= at)
        return;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = (time_t)(at / 1000000000u);
    its.it_value.tv_nsec = (long)(at % 1000000000u);
    if (timerfd_settime(ctx->timerfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
        EXS_ERR(PROV, "ctx %p: timerfd_settime: %m", (void *)ctx);
    ctx->timer_armed_ns = at;
}

/* ---- completion and cm event queues (ctx->lock) ---- */

void exs__shm_notify_locked(struct shm_ctx *ctx)
{
    if (!ctx->armed)
        return;
    __atomic_store_n(&ctx->armed, 0, __ATOMIC_RELAXED);
    ctx->evfd_set = 1;
    shm_fd_bump(ctx->evfd);
}

void exs__shm_cq_push_locked(struct shm_ctx *ctx, struct shm_ep *ep, const struct exs_prov_cqe *cqe)
{
    *exs__shm_cq_slot_locked(ctx) = *cqe;
    exs__shm_cq_commit_locked(ctx, ep, exs__soft_cqe_is_recv(cqe));
}

void exs__shm_cm_push(struct shm_ctx *ctx, const struct exs_prov_cm_event *ev)
{
    struct exs_soft_cm_node *n = exs__soft_cm_new(ctx, ev);

    if (!n)
        return;
    exs__lite_lock(&ctx->lock);
    exs_list_add_tail(&ctx->cm_events, &n->link);
    __atomic_store_n(&ctx->cm_hint, 1, __ATOMIC_RELAXED);
    exs__shm_notify_locked(ctx);
    exs__lite_unlock(&ctx->lock);
}

void exs__shm_flush_cqe_locked(struct shm_ep *ep, uint64_t wr_id, enum exs_prov_wc_opcode op)
{
    struct exs_prov_cqe cqe;

    memset(&cqe, 0, sizeof(cqe));
    cqe.wr_id = wr_id;
    cqe.ep = &ep->base;
    cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
    cqe.opcode = op;
    exs__shm_cq_push_locked(ep->ctx, ep, &cqe);
    EXS_CNT_INC(ep->ctx->cnt.flushed_wrs);
}

/* ---- turns (nic_lock held) ---- */

static void shm_event(struct shm_ctx *ctx, const struct epoll_event *ev)
{
    unsigned tag = (unsigned)(ev->data.u64 & SHM_TAG_MASK);
    void *p = (void *)(uintptr_t)(ev->data.u64 & ~(uint64_t)SHM_TAG_MASK);
    uint64_t v;

    switch (tag) {
    case SHM_TAG_CTX:
        if ((uintptr_t)p == SHM_CTX_BELL) {
            EXS_CNT_INC(ctx->cnt.bells_rx);
            shm_fd_drain(ctx->bell);
        } else if ((uintptr_t)p == SHM_CTX_TIMER) {
            if (exs__nc_read(ctx->timerfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                EXS_ERR(PROV, "ctx %p: timerfd read: %m", (void *)ctx);
            ctx->timer_armed_ns = 0;
        }
        /* SHM_CTX_EVFD (MANUAL): for the sleepers, only ctx_arm reads it */
        break;
    case SHM_TAG_LIS:
        exs__shm_listener_ready(p);
        break;
    case SHM_TAG_PID: {
        struct shm_conn *conn = p;

        if (conn->state != SHM_CONN_DEAD)
            exs__shm_conn_peer_died(conn);
        break;
    }
    default: {
        struct shm_conn *conn = p;

        if (conn->state != SHM_CONN_DEAD)
            exs__shm_conn_readable(conn, ev->events);
        break;
    }
    }
}

/* Every live connection's rings (nic_lock held). */
static inline __attribute__((always_inline)) int shm_rings(struct shm_ctx *ctx, int wake_up)
{
    struct exs_list *pos, *tmp;
    int did = 0;

    exs_list_for_each_safe(pos, tmp, &ctx->conns)
    {
        struct shm_conn *conn = exs_list_entry(pos, struct shm_conn, link);

        if (conn->state == SHM_CONN_UP) {
            exs__shm_conn_pay_kick(conn); /* the last turn's answers' fence */
            if (conn->sleeping && wake_up) {
                conn->sleeping = 0;
                __atomic_store_n(&conn->mine_flag->sleeping, 0, __ATOMIC_RELAXED);
            }
            /* most busy-polling turns find nothing: a look at the peer's line first */
            if (exs__shm_conn_stirred(conn))
                did += exs__shm_conn_service(conn);
        } else if (conn->state == SHM_CONN_WAIT_REQ) {
            did += exs__shm_conn_hello_late(conn, exs__now_ns());
        }
        if (conn->state == SHM_CONN_DEAD) {
            exs_list_del(&conn->link);
            exs__shm_conn_free(conn);
        }
    }
    return did;
}

/* A turn's read of the descriptors: out of line, so that a turn that does not read them
 * (most of a busy poller's) has no frame for its 64 events. The events found. */
static __attribute__((noinline)) int shm_collect(struct shm_ctx *ctx)
{
    struct epoll_event evs[64];
    int found = 0, n;

    ctx->idle_turns = 0;
    SHM_CNT_INC_OWNED(ctx->cnt.collects);
    n = exs__nc_epoll_wait(ctx->epfd, evs, (int)EXS_ARRAY_SIZE(evs), 0);
    for (int i = 0; i < n; i++) {
        /* a conn ended by an earlier event of this batch is DEAD, not freed yet */
        shm_event(ctx, &evs[i]);
        /* the consumer's event fd (MANUAL) stays readable until its next arm: it is
         * the sleeper's, not work, and must not make every later turn read again */
        if (evs[i].data.u64 != ((uint64_t)SHM_CTX_EVFD | SHM_TAG_CTX))
            found++;
    }
    ctx->collect_now = found > 0;
    return found;
}

int exs__shm_turn(struct shm_ctx *ctx, int collect)
{
    /* the sleeping flags belong to the sleeper: the NIC thread (default mode), or an armed
     * consumer (MANUAL); another caller's turn leaves them set, or a sleeper would miss
     * its doorbell */
    int wake_up;
    int did = 0;

    SHM_CNT_INC_OWNED(ctx->cnt.turns); /* (nic_lock) */
    if (ctx->manual) {
        /* armed is set under nic_lock (ours) and ctx->lock, cleared under ctx->lock only
         * (a notification, a disarm): a plain atomic look sees what a locked one would */
        wake_up = !__atomic_load_n(&ctx->armed, __ATOMIC_RELAXED);
    } else {
        wake_up = collect == 2;
    }
    /* A busy poller's turn (ctx_progress) makes no system call, whether it finds work in
     * the rings or spins on empty ones. The descriptors (doorbell, sockets, pidfds,
     * listeners, timer) are read every 8th turn that found work, every SHM_IDLE_LOOK-th
     * turn in a row that found none, right after an arm, and while the last read found
     * some. A turn returns 0 only after reading them: an idle turn that did not answers 1
     * ("call again"), so a caller that sleeps or stops when progress says 0 (the engine's
     * drain before its arm, a MANUAL sleeper's turn after its wake-up) has had a full look
     * first, and gets it within SHM_IDLE_LOOK turns. A sleeper loses nothing in between:
     * an arm does not depend on the last turn's look, its event descriptor is the epoll
     * set itself (MANUAL) and level-triggered, so a descriptor left unread keeps it
     * readable, and the first turn after the arm reads them (collect_now). */
    if (collect == 1 && !ctx->collect_now) {
        did = shm_rings(ctx, wake_up);
        if (did) {
            ctx->idle_turns = 0;
            if (++ctx->turn_seq & 7)
                return did;
        } else if (++ctx->idle_turns < SHM_IDLE_LOOK) {
            return 1;
        }
    }
    if (collect)
        did += shm_collect(ctx);
    return did + shm_rings(ctx, wake_up);
}

/* Before sleeping (nic_lock held): every live ring gets our sleeping flag, then a last
 * look; 1 when there is work after all (do not sleep). */
static int shm_prepare_sleep(struct shm_ctx *ctx)
{
    struct exs_list *pos;
    int busy = 0;

    exs_list_for_each(pos, &ctx->conns)
    {
        struct shm_conn *conn = exs_list_entry(pos, struct shm_conn, link);

        if (conn->state != SHM_CONN_UP)
            continue;
        exs__shm_conn_pay_kick(conn); /* a sleeper owes no look at the peer's flag */
        /* sequentially consistent, as the writers' publications and the look below: in
         * that one order either our look sees a writer's change or the writer sees the
         * flag (a store / load pair on each side; no fence, which TSan cannot follow) */
        conn->sleeping = 1;
        __atomic_store_n(&conn->mine_flag->sleeping, 1, __ATOMIC_SEQ_CST);
    }
    exs_list_for_each(pos, &ctx->conns)
    {
        struct shm_conn *conn = exs_list_entry(pos, struct shm_conn, link);

        if (conn->state == SHM_CONN_UP && exs__shm_conn_busy(conn)) {
            busy = 1;
            break;
        }
    }
    return busy;
}

static void *shm_nic_main(void *arg)
{
    struct shm_ctx *ctx = arg;
    struct epoll_event ev;
    int stop, did, busy;

    for (;;) {
        exs__shm_nic_lock(ctx);
        did = exs__shm_turn(ctx, 2);
        busy = did ? 1 : shm_prepare_sleep(ctx);
        exs__shm_nic_unlock(ctx);
        exs__lite_lock(&ctx->lock);
        stop = ctx->stop;
        exs__lite_unlock(&ctx->lock);
        if (stop)
            break;
        if (busy)
            continue;
        EXS_CNT_INC(ctx->cnt.sleeps);
        /* the event is not looked at: the next turn collects it again (level-triggered) */
        (void)exs__nc_epoll_wait(ctx->epfd, &ev, 1, -1);
    }
    return NULL;
}

/* A busy poller's idle turn, without the turn's frame (nic_lock held): what
 * exs__shm_turn(ctx, 1) does when every connection is UP, unstirred and keeps its
 * sleeping flag, and no look at the descriptors is due: count the idle turn and answer 1
 * ("call again"). 0: anything else, for the full turn. */
static inline int shm_turn_idle(struct shm_ctx *ctx)
{
    struct exs_list *pos;

    if (ctx->collect_now || ctx->idle_turns + 1 >= SHM_IDLE_LOOK)
        return 0;
    exs_list_for_each(pos, &ctx->conns)
    {
        const struct shm_conn *conn = exs_list_entry(pos, struct shm_conn, link);

        /* as exs__shm_turn's: a turn of collect 1 takes the flags back only from an
         * unarmed MANUAL consumer (looked at only when a flag is set) */
        if (conn->state != SHM_CONN_UP || conn->fence_owed ||
            (conn->sleeping && ctx->manual && !__atomic_load_n(&ctx->armed, __ATOMIC_RELAXED)) ||
            exs__shm_conn_stirred(conn))
            return 0;
    }
    SHM_CNT_INC_OWNED(ctx->cnt.turns);
    ctx->idle_turns++;
    return 1;
}

static int shm_ctx_progress(struct exs_prov_ctx *c)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    int did;

    exs__shm_nic_lock(ctx);
    did = shm_turn_idle(ctx) ? 1 : exs__shm_turn(ctx, 1);
    exs__shm_nic_unlock(ctx);
    return did > 0;
}

static __attribute__((noinline)) int shm_poll_take(struct shm_ctx *ctx, struct exs_prov_cqe *cqe,
                                                   int max);

/* ctx_progress then ctx_poll (prov.h, ctx_progress_poll): the completions the turn makes
 * are written into cqe while nothing is queued (exs__shm_cq_nic_slot_locked), not queued
 * under ctx->lock and taken out again under it; then the queue's, which are newer (the
 * array's were written only while it was empty), after them. An idle turn touches
 * nothing of the array. */
static int shm_ctx_progress_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max,
                                 int *n_p)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    int did, n = 0;

    exs__shm_nic_lock(ctx);
    if (shm_turn_idle(ctx)) {
        did = 1;
    } else {
        ctx->sink = cqe;
        ctx->sink_max = max > 0 ? max : 0;
        ctx->sink_n = 0;
        did = exs__shm_turn(ctx, 1);
        n = ctx->sink_n;
        ctx->sink_max = ctx->sink_n = 0;
        ctx->sink = NULL;
    }
    exs__shm_nic_unlock(ctx);
    if (n < max && exs__soft_cq_peek(&ctx->cq))
        n += shm_poll_take(ctx, cqe + n, max - n);
    *n_p = n;
    return did > 0;
}

/* ---- consumer side ---- */

static int shm_ctx_event_fd(struct exs_prov_ctx *c)
{
    struct shm_ctx *ctx = shm_ctx_of(c);

    return ctx->manual ? ctx->epfd : ctx->evfd;
}

static int shm_ctx_arm(struct exs_prov_ctx *c)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    int busy = 0, ret = 0;

    /* MANUAL: the flags are set and the arm taken under nic_lock in one go, so that no
     * turn between them takes the flags back from a sleeper (turns read armed) */
    if (ctx->manual) {
        exs__shm_nic_lock(ctx);
        busy = shm_prepare_sleep(ctx);
    }
    exs__lite_lock(&ctx->lock);
    if (ctx->evfd_set)
        shm_fd_drain(ctx->evfd);
    ctx->evfd_set = 0;
    /* requests or answers already in a ring are what arrived frames are to tcp: the event
     * fd becomes readable (our own doorbell), the arm stands */
    if (busy)
        exs__shm_ctx_wake(ctx);
    if (ctx->cq.count || !exs_list_empty(&ctx->cm_events)) {
        __atomic_store_n(&ctx->armed, 0, __ATOMIC_RELAXED);
        ret = -EAGAIN;
    } else {
        __atomic_store_n(&ctx->armed, 1, __ATOMIC_RELAXED);
        if (ctx->manual)
            ctx->collect_now = 1; /* (nic_lock) the next turn, after the sleep, reads them */
        EXS_CNT_INC(ctx->cnt.sleeps);
    }
    exs__lite_unlock(&ctx->lock);
    if (ctx->manual)
        exs__shm_nic_unlock(ctx);
    return ret;
}

static void shm_ctx_disarm(struct exs_prov_ctx *c)
{
    struct shm_ctx *ctx = shm_ctx_of(c);

    exs__lite_lock(&ctx->lock);
    __atomic_store_n(&ctx->armed, 0, __ATOMIC_RELAXED);
    exs__lite_unlock(&ctx->lock);
}

static __attribute__((noinline)) int shm_poll_take(struct shm_ctx *ctx, struct exs_prov_cqe *cqe,
                                                   int max)
{
    int n = 0;

    exs__lite_lock(&ctx->lock);
    for (struct exs_prov_cqe *q; n < max && (q = exs__soft_cq_head(&ctx->cq));) {
        struct shm_ep *ep = shm_ep_of(q->ep);

        if (exs__soft_cqe_is_recv(q))
            exs__shm_rq_retire_locked(ep);
        else
            ep->cq_sq--;
        cqe[n++] = *q;
        exs__soft_cq_pop(&ctx->cq);
    }
    exs__lite_unlock(&ctx->lock);
    return n;
}

/* ctx_poll's turn (the NIC role taken), then the queue: out of line, as shm_poll_take, so
 * that a busy poller's empty look is a leaf without a frame (it saved and restored three
 * registers for these calls) */
static __attribute__((noinline)) int shm_poll_turn(struct shm_ctx *ctx, struct exs_prov_cqe *cqe,
                                                   int max)
{
    (void)exs__shm_turn(ctx, 0);
    exs__shm_nic_unlock(ctx);
    return exs__soft_cq_peek(&ctx->cq) ? shm_poll_take(ctx, cqe, max) : 0;
}

static int shm_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max)
{
    struct shm_ctx *ctx = shm_ctx_of(c);

    if (max <= 0)
        return max < 0 ? -EINVAL : 0;
    /* completions already queued (an engine round's ctx_progress turn wrote them just
     * before) are taken at once, without a turn of its own: no NIC role taken and given
     * back, no second walk of the rings between a completion and its consumer */
    if (exs__soft_cq_peek(&ctx->cq))
        return shm_poll_take(ctx, cqe, max);
    /* run to completion: a busy poller of the default mode carries out what arrived
     * itself when the NIC role is free (no thread hop, no doorbell) */
    if (!ctx->manual && exs__shm_nic_trylock(ctx))
        return shm_poll_turn(ctx, cqe, max);
    return 0; /* a busy poller's empty look takes no lock */
}

static int shm_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    struct exs_list *l;

    if (!__atomic_load_n(&ctx->cm_hint, __ATOMIC_RELAXED))
        return 0; /* exs__soft_cm_pop's first look (the engine's is cm_queued's) */
    exs__lite_lock(&ctx->lock);
    l = exs__soft_cm_take_locked(&ctx->cm_events, &ctx->cm_hint);
    exs__lite_unlock(&ctx->lock);
    return exs__soft_cm_give(l, ev);
}

/* ---- open and close ---- */

static void shm_ctx_free(struct shm_ctx *ctx)
{
    exs__soft_cm_free_all(&ctx->cm_events);
    if (ctx->epfd >= 0)
        exs__nc_close(ctx->epfd);
    if (ctx->bell >= 0)
        exs__nc_close(ctx->bell);
    if (ctx->timerfd >= 0)
        exs__nc_close(ctx->timerfd);
    if (ctx->evfd >= 0)
        exs__nc_close(ctx->evfd);
    exs__soft_cq_fini(&ctx->cq);
    exs__soft_keys_fini(&ctx->keys);
    free(ctx);
}

static int shm_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    struct shm_ctx *ctx;
    int ret = 0;

    exs__params_load();
    if (attr && (attr->flags & ~(uint32_t)EXS_PROV_ATTR_MANUAL_PROGRESS))
        return -EINVAL;
    if (attr && attr->device && attr->device[0] && strcmp(attr->device, "shm") != 0) {
        EXS_ERR(PROV, "device %s: unknown (the shm provider has one device, shm)", attr->device);
        return -ENODEV;
    }
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->epfd = ctx->bell = ctx->timerfd = ctx->evfd = -1;
    ctx->manual = attr && (attr->flags & EXS_PROV_ATTR_MANUAL_PROGRESS);
    exs__soft_keys_init_lite(&ctx->keys, &ctx->lock);
    exs_list_init(&ctx->cm_events);
    exs_list_init(&ctx->eps);
    exs_list_init(&ctx->conns);
    exs_list_init(&ctx->listeners);
    ctx->base.ops = &exs__prov_shm_ops;
    /* (an int read as its unsigned counterpart: never 0 while an event is queued) */
    ctx->base.cm_queued = (const uint32_t *)&ctx->cm_hint;
    ctx->base.caps.flags = EXS_PROV_CAP_WRITE_IMM | EXS_PROV_CAP_READ | EXS_PROV_CAP_INLINE;
    ctx->base.caps.max_inline = SHM_MAX_INLINE;
    ctx->base.caps.max_sge = SHM_MAX_SGE;
    ctx->base.caps.max_send_wr = SHM_MAX_WR;
    ctx->base.caps.max_recv_wr = SHM_MAX_WR;
    ctx->base.caps.max_private_data = SHM_PD_MAX;
    ctx->base.caps.max_msg_size = (uint64_t)EXS_MIN(exs__params.tcp_max_msg, UINT32_MAX);
    ctx->base.caps.max_cqe = SHM_CQ_MAX;
    ctx->rnr_timer_ms = (uint32_t)EXS_MIN(exs__params.tcp_rnr_timer_ms, 60000);
    ctx->rnr_retry_max = (uint8_t)EXS_MIN(exs__params.tcp_rnr_retry, 7);
    /* (a power of two within the bounds: exs/util/params.c checks it) */
    ctx->ring_bytes = (uint32_t)(exs__params.shm_ring_kb * 1024u);
    ret = exs__soft_cq_init(&ctx->cq, attr && attr->cq_size ? EXS_MIN(attr->cq_size, SHM_CQ_MAX)
                                                            : SHM_CQ_SIZE);
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (!ret && (ctx->epfd < 0 || ctx->bell < 0 || ctx->evfd < 0 || ctx->timerfd < 0))
        ret = -errno;
    if (!ret)
        ret = exs__shm_epoll_add(ctx, ctx->bell, (void *)(uintptr_t)SHM_CTX_BELL, SHM_TAG_CTX);
    if (!ret)
        ret = exs__shm_epoll_add(ctx, ctx->timerfd, (void *)(uintptr_t)SHM_CTX_TIMER, SHM_TAG_CTX);
    if (!ret && ctx->manual)
        ret = exs__shm_epoll_add(ctx, ctx->evfd, (void *)(uintptr_t)SHM_CTX_EVFD, SHM_TAG_CTX);
    if (!ret && !ctx->manual) {
        ret = exs__thread_create(&ctx->thread, "exs-shm-nic", shm_nic_main, ctx);
        ctx->has_thread = !ret;
    }
    if (ret) {
        EXS_ERR(PROV, "shm ctx open: %s", strerror(-ret));
        shm_ctx_free(ctx);
        return ret;
    }
    ctx->cset.name = "prov.shm";
    ctx->cset.desc = shm_counter_desc;
    ctx->cset.count = EXS_ARRAY_SIZE(shm_counter_desc);
    ctx->cset.base = &ctx->cnt;
    exs__counters_register(&ctx->cset);
    *ctx_p = &ctx->base;
    return 0;
}

static void shm_ctx_close(struct exs_prov_ctx *c)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    struct exs_list *l;

    if (!ctx)
        return;
    if (!exs_list_empty(&ctx->eps))
        EXS_WARN(PROV, "shm ctx %p: closed with endpoints left", (void *)ctx);
    exs__lite_lock(&ctx->lock);
    ctx->stop = 1;
    exs__lite_unlock(&ctx->lock);
    if (ctx->has_thread) {
        exs__shm_ctx_wake(ctx);
        pthread_join(ctx->thread, NULL); /* nocancel: ok (exs_fini: off) */
    }
    /* connections of destroyed eps still in their handshake or pending */
    while ((l = exs_list_pop_head(&ctx->conns)) != NULL)
        exs__shm_conn_free(exs_list_entry(l, struct shm_conn, link));
    exs__counters_unregister(&ctx->cset);
    shm_ctx_free(ctx);
}

/* fork (prov.h, ctx_fork), as the tcp provider's: the rendezvous sockets, pidfds and
 * doorbells of connections and listeners are made and listed with nic_lock held, so
 * holding it across the fork gives the child complete lists. The child closes its copies
 * only (no byte is written to a socket, a doorbell or a ring; the inherited segments stay
 * mapped, unused): the parent's connections and listeners stay as they are. */
static void shm_ctx_fork(struct exs_prov_ctx *c, int phase)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    struct exs_list *l;
    int *fds[] = {&ctx->epfd, &ctx->bell, &ctx->timerfd, &ctx->evfd};

    /* exs__prov_fork_lock's phases, for nic_lock (a futex lock, not a pthread mutex) */
    if (phase == EXS_FORK_PREPARE || phase == EXS_FORK_PARENT) {
        if (phase == EXS_FORK_PREPARE)
            exs__shm_nic_lock(ctx);
        else
            exs__shm_nic_unlock(ctx);
        return;
    }
    exs_list_for_each(l, &ctx->conns)
    {
        struct shm_conn *conn = exs_list_entry(l, struct shm_conn, link);
        int *cfds[] = {&conn->fd, &conn->pidfd, &conn->bell};

        exs__prov_fork_close(cfds, EXS_ARRAY_SIZE(cfds));
    }
    exs_list_for_each(l, &ctx->listeners)
    {
        struct shm_listener *lis = exs_list_entry(l, struct shm_listener, link);

        exs__prov_fork_close((int *const[]){&lis->fd}, 1);
    }
    exs__prov_fork_close(fds, EXS_ARRAY_SIZE(fds));
    exs__counters_unregister(&ctx->cset);
}

struct exs_prov_ops exs__prov_shm_ops = {
    .name = "shm",
    .ctx_open = shm_ctx_open,
    .ctx_close = shm_ctx_close,
    .ctx_event_fd = shm_ctx_event_fd,
    .ctx_arm = shm_ctx_arm,
    .ctx_disarm = shm_ctx_disarm,
    .ctx_progress = shm_ctx_progress,
    .ctx_poll = shm_ctx_poll,
    .ctx_progress_poll = shm_ctx_progress_poll,
    .ctx_cm_poll = shm_ctx_cm_poll,
    .ctx_fork = shm_ctx_fork,
    .mr_reg = exs__shm_mr_reg,
    .mr_dereg = exs__shm_mr_dereg,
    .grant = exs__shm_grant,
    .revoke = exs__shm_revoke,
    .ep_create = exs__shm_ep_create,
    .ep_destroy = exs__shm_ep_destroy,
    .ep_state = exs__shm_ep_state,
    .ep_local_addr = exs__shm_ep_local_addr,
    .listen = exs__shm_listen,
    .listener_addr = exs__shm_listener_addr,
    .listener_destroy = exs__shm_listener_destroy,
    .listener_pause = exs__shm_listener_pause,
    .connect = exs__shm_connect,
    .accept = exs__shm_accept,
    .reject = exs__shm_reject,
    .disconnect = exs__shm_disconnect,
    .post_recv = exs__shm_post_recv,
    .post_send = exs__shm_post_send,
};
