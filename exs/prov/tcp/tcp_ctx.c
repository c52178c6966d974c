/* SPDX-License-Identifier: MIT */
/* The tcp provider's context: NIC turns and thread, manual progress, completion and cm queues,
 * commands. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* epoll data: a pointer with the object kind in the low bits. */
enum { TCP_TAG_CONN = 0, TCP_TAG_LIS = 1, TCP_TAG_WAKE = 2, TCP_TAG_TIMER = 3, TCP_TAG_MASK = 3 };
/* MANUAL_PROGRESS: evfd is in epfd too, tagged as the ctx itself with TCP_TAG_LIS
 * (no listener is the ctx); a turn skips it: only ctx_arm reads evfd. */

/* caps.max_cqe: the ring grows to this many entries (40 B each): 10,000 eps of the
 * protocol's default depth (104 send + 64 receive) need 1.7 M. */
#define TCP_CQ_MAX (1u << 22)

static const struct exs_counter_desc tcp_counter_desc[] = {
    EXS_COUNTER(struct tcp_counters, frames_tx, "frames written"),
    EXS_COUNTER(struct tcp_counters, frames_rx, "frames read"),
    EXS_COUNTER(struct tcp_counters, bytes_tx, "bytes written, headers included"),
    EXS_COUNTER(struct tcp_counters, bytes_rx, "bytes read, headers included"),
    EXS_COUNTER(struct tcp_counters, acks_tx, "ACK frames sent"),
    EXS_COUNTER(struct tcp_counters, acks_rx, "ACK frames received"),
    EXS_COUNTER(struct tcp_counters, naks_tx, "NAK frames sent"),
    EXS_COUNTER(struct tcp_counters, naks_rx, "NAK frames received"),
    EXS_COUNTER(struct tcp_counters, rnr_waits, "receiver-not-ready pauses"),
    EXS_COUNTER(struct tcp_counters, rnr_naks, "receiver-not-ready retries exhausted"),
    EXS_COUNTER(struct tcp_counters, access_errors, "remote access checks failed here"),
    EXS_COUNTER(struct tcp_counters, protocol_errors, "connections ended by malformed input"),
    EXS_COUNTER(struct tcp_counters, flushed_wrs, "work requests completed with WR_FLUSH_ERR"),
    EXS_COUNTER(struct tcp_counters, conns_established, "connections established"),
    EXS_COUNTER(struct tcp_counters, conns_rejected, "connection requests rejected"),
    EXS_COUNTER(struct tcp_counters, conns_unreachable, "connects that failed"),
    EXS_COUNTER(struct tcp_counters, bogus_conns, "incoming connections closed in handshake"),
    EXS_COUNTER(struct tcp_counters, conns_reset,
                "connections ended abortively (a reset on the wire, not the EOF of a close)"),
    EXS_COUNTER(struct tcp_counters, cq_overflows, "completions lost to a full queue"),
    EXS_COUNTER(struct tcp_counters, wakeups,
                "wake-ups written by posts that found the NIC role held by another thread"),
    EXS_COUNTER(struct tcp_counters, direct_writes,
                "posts framed and written by the posting thread itself"),
    EXS_COUNTER(struct tcp_counters, progress_turns, "NIC turns run by ctx_progress"),
    EXS_COUNTER(struct tcp_counters, tx_full,
                "writes cut short by a full socket (the rest waits for EPOLLOUT)"),
    EXS_COUNTER(struct tcp_counters, tx_calls, "sendmsg calls (one may carry several frames)"),
    EXS_COUNTER(struct tcp_counters, acks_deferred,
                "ACKs deferred to the next frame written or the next turn"),
    EXS_COUNTER(struct tcp_counters, emu_holds, "frames held by the link emulation"),
    EXS_COUNTER(struct tcp_counters, timer_walks,
                "walks of the deadline list (the timerfd fired or a deadline moved earlier)"),
    EXS_COUNTER(struct tcp_counters, accept_calls, "accept calls on listeners"),
    EXS_COUNTER(struct tcp_counters, accept_backoffs,
                "listener pauses: out of descriptors or memory"),
    EXS_COUNTER(struct tcp_counters, handshake_timeouts,
                "incoming sockets silent until the handshake timeout"),
    EXS_COUNTER(struct tcp_counters, handshake_evictions,
                "incoming sockets dropped: too many handshakes"),
    EXS_COUNTER(struct tcp_counters, handshake_waits,
                "listener pauses: as many handshakes as allowed, none silent long enough to drop"),
    EXS_COUNTER(struct tcp_counters, notifies,
                "event fd writes: an entry queued while a consumer was armed"),
    EXS_COUNTER(struct tcp_counters, ack_kicks,
                "wake-ups written for ACKs left deferred while a consumer was armed"),
    EXS_COUNTER(struct tcp_counters, disarms,
                "arms taken back by ctx_disarm (nobody slept on the event fd any more)"),
    EXS_COUNTER(struct tcp_counters, rx_lowats,
                "SO_RCVLOWAT raised: the rest of a large payload wakes the reader once"),
    EXS_COUNTER(struct tcp_counters, hello_refused,
                "incoming sockets reset: no CONN_REQ by the hello deadline, or bytes that are "
                "not one (not an exs peer)"),
    EXS_COUNTER(struct tcp_counters, state_errors,
                "state changes outside the transition table (a bug: the connection or endpoint "
                "was failed instead)"),
};

static void tcp_wakefd_write(struct tcp_ctx *ctx)
{
    uint64_t one = 1;

    if (exs__nc_write(ctx->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: wake write: %m", (void *)ctx);
}

static void tcp_wakefd_read(struct tcp_ctx *ctx)
{
    uint64_t v;

    if (exs__nc_read(ctx->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: wake read: %m", (void *)ctx);
}

/* ---- completion and cm event queues ---- */

/* An entry was queued: make the event fd readable when armed. MANUAL_PROGRESS: the
 * event fd is epfd, and evfd is in it; no turn reads evfd (only ctx_arm does), so a
 * notification stays visible to every sleeper until one of them arms again. */
static void tcp_ctx_notify_locked(struct tcp_ctx *ctx)
{
    uint64_t one = 1;

    if (!ctx->armed)
        return;
    ctx->armed = 0;
    ctx->evfd_set = 1;
    EXS_CNT_INC(ctx->cnt.notifies);
    if (exs__nc_write(ctx->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: event fd write: %m", (void *)ctx);
}

void exs__tcp_cq_push_locked(struct tcp_ctx *ctx, struct tcp_ep *ep, const struct exs_prov_cqe *cqe)
{
    if (EXS_UNLIKELY(exs__soft_cq_push(&ctx->cq, cqe))) {
        /* Cannot happen: every ep reserved room for all it can produce (ep_create)
         * and post_send / post_recv refuse work beyond it. */
        EXS_CNT_INC(ctx->cnt.cq_overflows);
        EXS_ERR(PROV, "ep %p: completion queue full (%u), wr_id %llu", (void *)ep, ctx->cq.cap,
                (unsigned long long)cqe->wr_id);
        EXS_ASSERT(ctx->cq.count < ctx->cq.cap);
    }
    if (exs__soft_cqe_is_recv(cqe))
        __atomic_store_n(&ep->cq_rq, ep->cq_rq + 1, __ATOMIC_RELAXED);
    else
        __atomic_store_n(&ep->cq_sq, ep->cq_sq + 1, __ATOMIC_RELAXED);
    tcp_ctx_notify_locked(ctx);
}

void exs__tcp_cq_push(struct tcp_ctx *ctx, struct tcp_ep *ep, const struct exs_prov_cqe *cqe)
{
    pthread_mutex_lock(&ctx->lock);
    exs__tcp_cq_push_locked(ctx, ep, cqe);
    pthread_mutex_unlock(&ctx->lock);
}

void exs__tcp_cm_push(struct tcp_ctx *ctx, const struct exs_prov_cm_event *ev)
{
    struct exs_soft_cm_node *n = exs__soft_cm_new(ctx, ev);

    if (!n)
        return;
    pthread_mutex_lock(&ctx->lock);
    exs_list_add_tail(&ctx->cm_events, &n->link);
    __atomic_store_n(&ctx->cm_hint, 1, __ATOMIC_RELAXED);
    tcp_ctx_notify_locked(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

void exs__tcp_ep_work(struct tcp_ctx *ctx, struct tcp_ep *ep)
{
    pthread_mutex_lock(&ctx->lock);
    if (!ep->on_work) {
        ep->on_work = 1;
        exs_list_add_tail(&ctx->work_eps, &ep->work_link);
    }
    pthread_mutex_unlock(&ctx->lock);
}

static int tcp_ctx_event_fd(struct exs_prov_ctx *c)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);

    return ctx->manual ? ctx->epfd : ctx->evfd;
}

/* Consume the evfd notification, then arm unless entries are queued. MANUAL_PROGRESS:
 * also -EAGAIN while posted work waits for a turn (a poster that lost trylock queued
 * its ep under ctx->lock, then wrote wakefd, which keeps epfd readable until a turn
 * reads it and takes the ep). */
static int tcp_ctx_arm(struct exs_prov_ctx *c)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    uint64_t v;
    int ret = 0;

    pthread_mutex_lock(&ctx->lock);
    /* only notify writes evfd: nothing to consume unless it did */
    if (ctx->evfd_set && exs__nc_read(ctx->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: event fd read: %m", (void *)ctx);
    ctx->evfd_set = 0;
    if (ctx->manual && __atomic_load_n(&ctx->acks_deferred, __ATOMIC_RELAXED))
        __atomic_store_n(&ctx->ack_flush_now, 1, __ATOMIC_RELAXED); /* the next turn sends them */
    if (ctx->cq.count || !exs_list_empty(&ctx->cm_events) ||
        __atomic_load_n(&ctx->rx_again_n, __ATOMIC_RELAXED) ||
        (ctx->manual && (!exs_list_empty(&ctx->work_eps) ||
                         __atomic_load_n(&ctx->acks_deferred, __ATOMIC_RELAXED)))) {
        ctx->armed = 0;
        ret = -EAGAIN;
    } else {
        ctx->armed = 1;
    }
    pthread_mutex_unlock(&ctx->lock);
    return ret;
}

/* Nobody sleeps on the event fd: completions queued from now on write no evfd (and
 * deferred ACKs wake no sleeper) until the next ctx_arm. */
static void tcp_ctx_disarm(struct exs_prov_ctx *c)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);

    pthread_mutex_lock(&ctx->lock);
    if (ctx->armed)
        EXS_CNT_INC(ctx->cnt.disarms);
    ctx->armed = 0;
    pthread_mutex_unlock(&ctx->lock);
}

static int tcp_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    int n = 0;

    if (max <= 0)
        return max < 0 ? -EINVAL : 0;
    if (!exs__soft_cq_peek(&ctx->cq))
        return 0; /* an empty look takes no lock (as shm's: a busy poller's idle round) */
    pthread_mutex_lock(&ctx->lock);
    for (struct exs_prov_cqe *q; n < max && (q = exs__soft_cq_head(&ctx->cq));) {
        struct tcp_ep *ep = tcp_ep_of(q->ep);

        if (exs__soft_cqe_is_recv(q))
            __atomic_store_n(&ep->cq_rq, ep->cq_rq - 1, __ATOMIC_RELAXED);
        else
            __atomic_store_n(&ep->cq_sq, ep->cq_sq - 1, __ATOMIC_RELAXED);
        cqe[n++] = *q;
        exs__soft_cq_pop(&ctx->cq);
    }
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

static int tcp_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);

    return exs__soft_cm_pop(&ctx->cm_events, &ctx->lock, &ctx->cm_hint, ev);
}

/* ---- NIC turns (nic_lock held) ---- */

void exs__tcp_conn_epoll(struct tcp_conn *conn, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = conn};

    if (conn->fd < 0 || conn->events == events)
        return;
    if (epoll_ctl(conn->ctx->epfd, EPOLL_CTL_MOD, conn->fd, &ev) < 0)
        EXS_ERR(PROV, "conn %p: epoll_ctl: %m", (void *)conn);
    conn->events = events;
}

void exs__tcp_conn_timer(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    uint64_t t[3] = {conn->rnr_at, conn->tx_at, conn->linger_at};
    int want = t[0] || t[1] || t[2];

    if (want && !conn->on_timer)
        exs_list_add_tail(&ctx->timers, &conn->timer_link);
    else if (!want && conn->on_timer)
        exs_list_del(&conn->timer_link);
    conn->on_timer = want;
    /* A later or removed deadline needs nothing: the timerfd fires early, the walk
     * finds nothing due and re-arms for the next one. */
    for (int i = 0; i < 3; i++)
        if (t[i] && (!ctx->timer_armed_ns || t[i] < ctx->timer_armed_ns))
            ctx->timer_rearm = 1;
}

/* Run the expired deadlines, only when the timerfd fired (it is armed for the
 * earliest one): a turn that has nothing due does not walk the list. */
static void tcp_nic_timers(struct tcp_ctx *ctx)
{
    struct exs_list *pos, *tmp;
    uint64_t now = 0;

    if (!ctx->timers_due)
        return;
    ctx->timers_due = 0;
    ctx->timer_rearm = 1; /* what ran may have set later deadlines */
    EXS_CNT_INC(ctx->cnt.timer_walks);
    exs_list_for_each_safe(pos, tmp, &ctx->listeners)
    {
        struct tcp_listener *lis = exs_list_entry(pos, struct tcp_listener, link);

        if (!lis->resume_at)
            continue;
        if (!now)
            now = exs__now_ns();
        if (lis->resume_at <= now) {
            /* back-off over: watch again and try at once (unless the consumer paused it:
             * resuming it does that) */
            lis->resume_at = 0;
            lis->hs_wait = 0;
            if (!lis->paused) {
                exs__tcp_listener_watch(lis, 1);
                exs__tcp_listener_ready(lis);
            }
        }
    }
    if (exs_list_empty(&ctx->timers))
        return;
    if (!now)
        now = exs__now_ns();
    exs_list_for_each_safe(pos, tmp, &ctx->timers)
    {
        struct tcp_conn *conn = exs_list_entry(pos, struct tcp_conn, timer_link);

        if (conn->linger_at && conn->linger_at <= now) {
            conn->linger_at = 0;
            if (conn->state == TCP_CONN_WAIT_REQ)
                exs__tcp_conn_hello_late(conn);
            else
                exs__tcp_conn_close(conn);
            continue;
        }
        if (conn->tx_at && conn->tx_at <= now) {
            conn->tx_at = 0;
            exs__tcp_txq_push(conn, NULL); /* marks it dirty */
        }
        if (conn->rnr_at && conn->rnr_at <= now) {
            conn->rnr_at = 0;
            exs__tcp_conn_rnr_resume(conn);
        }
        exs__tcp_conn_timer(conn);
    }
}

/* Point the timerfd at the earliest deadline when one may have moved earlier or the
 * timerfd fired (no walk otherwise; no syscall when unchanged). */
static void tcp_nic_timer_arm(struct tcp_ctx *ctx)
{
    struct exs_list *pos;
    struct itimerspec its;
    uint64_t next = 0;

    if (!ctx->timer_rearm)
        return;
    ctx->timer_rearm = 0;

    exs_list_for_each(pos, &ctx->listeners)
    {
        struct tcp_listener *lis = exs_list_entry(pos, struct tcp_listener, link);

        if (lis->resume_at && (!next || lis->resume_at < next))
            next = lis->resume_at;
    }
    if (!next && exs_list_empty(&ctx->timers) && !ctx->timer_armed_ns)
        return;
    exs_list_for_each(pos, &ctx->timers)
    {
        struct tcp_conn *conn = exs_list_entry(pos, struct tcp_conn, timer_link);
        uint64_t t[3] = {conn->rnr_at, conn->tx_at, conn->linger_at};

        for (int i = 0; i < 3; i++)
            if (t[i] && (!next || t[i] < next))
                next = t[i];
    }
    if (next == ctx->timer_armed_ns)
        return;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = (time_t)(next / 1000000000u);
    its.it_value.tv_nsec = (long)(next % 1000000000u);
    if (timerfd_settime(ctx->timerfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
        EXS_ERR(PROV, "ctx %p: timerfd_settime: %m", (void *)ctx);
    ctx->timer_armed_ns = next;
}

/* Frame the posted sends of the eps on work_eps. Returns how many eps it took. */
static int tcp_nic_service(struct tcp_ctx *ctx)
{
    struct exs_list *l;
    int i;

    /* eps first (a command may destroy one); one at a time, because a post may
     * queue the ep again as soon as on_work is cleared */
    for (i = 0; i < 256; i++) {
        pthread_mutex_lock(&ctx->lock);
        l = exs_list_pop_head(&ctx->work_eps);
        if (l)
            exs_list_entry(l, struct tcp_ep, work_link)->on_work = 0;
        pthread_mutex_unlock(&ctx->lock);
        if (!l)
            break;
        exs__tcp_ep_take(exs_list_entry(l, struct tcp_ep, work_link));
    }
    return i;
}

static void tcp_nic_flush(struct tcp_ctx *ctx)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(&ctx->dirty)) != NULL) {
        struct tcp_conn *conn = exs_list_entry(l, struct tcp_conn, dirty_link);

        conn->tx_dirty = 0;
        exs__tcp_conn_tx(conn);
    }
}

static void tcp_nic_reap(struct tcp_ctx *ctx)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(&ctx->dead)) != NULL) {
        struct tcp_conn *conn = exs_list_entry(l, struct tcp_conn, link);

        free(conn->stg);
        free(conn);
    }
}

static void tcp_nic_event(struct tcp_ctx *ctx, struct epoll_event *ev)
{
    uintptr_t tag = (uintptr_t)ev->data.u64 & TCP_TAG_MASK;
    void *p = (void *)((uintptr_t)ev->data.u64 & ~(uintptr_t)TCP_TAG_MASK);
    uint64_t v;

    switch (tag) {
    case TCP_TAG_WAKE:
        tcp_wakefd_read(ctx);
        break;
    case TCP_TAG_TIMER:
        if (exs__nc_read(ctx->timerfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
            EXS_ERR(PROV, "ctx %p: timerfd read: %m", (void *)ctx);
        ctx->timer_armed_ns = 0;
        ctx->timers_due = 1;
        break;
    case TCP_TAG_LIS:
        if (p == (void *)ctx)
            break; /* evfd (MANUAL_PROGRESS): for the sleepers, not for us */
        exs__tcp_listener_ready(p);
        break;
    default: {
        struct tcp_conn *conn = p;

        if (conn->state == TCP_CONN_DEAD)
            break;
        if (EXS_UNLIKELY(exs__tcp_emu_blackholed(conn))) {
            /* nothing arrives over a dead link, not even the peer's reset */
            exs__tcp_conn_update_events(conn);
            break;
        }
        if (conn->state == TCP_CONN_CONNECTING) {
            if (ev->events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                exs__tcp_conn_connected(conn);
            break;
        }
        if (ev->events & EPOLLOUT)
            exs__tcp_conn_tx(conn);
        if (conn->state == TCP_CONN_DEAD)
            break;
        if (conn->events & EPOLLIN) {
            if (ev->events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                exs__tcp_conn_rx(conn);
        } else if (ev->events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
            /* not reading (pending request, held request): the peer died or ended */
            if (conn->rx_phase == TCP_RX_HOLD)
                exs__tcp_conn_hold_hup(conn);
            else
                exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, TCP_END_ABORT);
        }
        break;
    }
    }
}

/* Closing: the last frames of ended connections (DISCONNECT, NAK) get a short
 * while to leave, so the peers learn of an orderly end. */
static int tcp_nic_drained(struct tcp_ctx *ctx, uint64_t *stop_at)
{
    struct exs_list *pos;
    uint64_t now = exs__now_ns();

    if (!*stop_at)
        *stop_at = now + 200000000u + 2 * ctx->emu_delay_ns;
    if (now >= *stop_at)
        return 1;
    exs_list_for_each(pos, &ctx->conns)
    {
        struct tcp_conn *conn = exs_list_entry(pos, struct tcp_conn, link);

        if (conn->fd >= 0 && !exs_list_empty(&conn->txq) && conn->state != TCP_CONN_CONNECTING)
            return 0;
    }
    return 1;
}

/* Queue every deferred ACK. */
static void tcp_nic_acks(struct tcp_ctx *ctx)
{
    struct exs_list *l;

    while ((l = exs_list_pop_head(&ctx->ack_defer)) != NULL) {
        struct tcp_conn *conn = exs_list_entry(l, struct tcp_conn, ack_link);

        conn->ack_deferred = 0;
        __atomic_sub_fetch(&ctx->acks_deferred, 1, __ATOMIC_RELAXED);
        if (conn->state == TCP_CONN_UP)
            exs__tcp_conn_ack_flush(conn);
    }
}

/* ACKs stay deferred after this turn: a next turn must come. A consumer that arms
 * gets -EAGAIN; one already armed (asleep, or about to be) is woken. */
static void tcp_nic_acks_kick(struct tcp_ctx *ctx)
{
    int armed;

    pthread_mutex_lock(&ctx->lock);
    armed = ctx->armed;
    pthread_mutex_unlock(&ctx->lock);
    if (armed) {
        EXS_CNT_INC(ctx->cnt.ack_kicks);
        tcp_wakefd_write(ctx);
    }
}

/* What a NIC turn does besides the queued work. */
enum tcp_turn {
    TCP_TURN_QUEUED, /* only what is queued: posted work, timers, flush, reap (a command) */
    TCP_TURN_IO,     /* also collect the ready descriptors (epoll_wait, timeout 0) */
};

/*
 * One NIC turn, shared by the NIC thread, ctx_progress, commands and direct writes
 * (nic_lock held). TCP_TURN_IO: also collect the ready descriptors and handle them.
 * The posted work is taken AFTER the events: a poster that lost trylock queued its ep
 * before writing wakefd, so a turn that consumed that write also sees the ep. Returns
 * the number of things done (events, eps taken).
 */
/* How long a deferred ACK waits for a reply while consumers busy-poll (spec: "ACK deferral"). */
#define TCP_ACK_DELAY_NS 20000u

static int tcp_nic_turn(struct tcp_ctx *ctx, enum tcp_turn kind)
{
    int io = kind == TCP_TURN_IO;
    struct epoll_event evs[64];
    int n, did = 0;

    /* Deferred ACKs go first in the queues, so they leave this turn, once they waited
     * TCP_ACK_DELAY_NS for a reply to ride on, or at once when the consumer wants to
     * sleep (ctx_arm refused) or this turn will not read. */
    if (!exs_list_empty(&ctx->ack_defer) &&
        (!io || __atomic_exchange_n(&ctx->ack_flush_now, 0, __ATOMIC_RELAXED) ||
         exs__now_ns() - ctx->ack_defer_ns >= TCP_ACK_DELAY_NS))
        tcp_nic_acks(ctx);
    if (io) {
        ctx->rx_turn = 1;
        n = exs__nc_epoll_wait(ctx->epfd, evs, (int)EXS_ARRAY_SIZE(evs), 0);
        if (n < 0) {
            if (errno != EINTR)
                EXS_ERR(PROV, "ctx %p: epoll_wait: %m", (void *)ctx);
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == (uint64_t)((uintptr_t)ctx | TCP_TAG_LIS))
                continue; /* evfd: a notification waiting for its sleeper */
            tcp_nic_event(ctx, &evs[i]);
            did++;
        }
        ctx->rx_turn = 0;
    }
    exs__tcp_nic_rx_again(ctx);
    did += tcp_nic_service(ctx);
    tcp_nic_timers(ctx);
    if (!io)
        tcp_nic_acks(ctx); /* a turn without epoll_wait leaves nothing deferred */
    else if (!exs_list_empty(&ctx->ack_defer))
        tcp_nic_acks_kick(ctx);
    tcp_nic_flush(ctx);
    tcp_nic_timer_arm(ctx);
    tcp_nic_reap(ctx);
    return did;
}

/*
 * A poster's turn (nic_lock held): only what posts need. Frame the posted sends (each
 * connection's deferred ACK rides in front of its first request: exs__tcp_ep_tx_fill)
 * and write them. No epoll_wait (reading is left to whoever drives), no deadline walk
 * (none can be due: only a turn that collected the timerfd walks), and the other
 * connections' deferred ACKs stay deferred for their own replies or the next turn
 * (spec: "ACK deferral").
 */
static void tcp_nic_post_turn(struct tcp_ctx *ctx)
{
    tcp_nic_service(ctx);
    tcp_nic_flush(ctx);
    tcp_nic_timer_arm(ctx);
    tcp_nic_reap(ctx);
}

void exs__tcp_ctx_kick(struct tcp_ctx *ctx)
{
    if (pthread_mutex_trylock(&ctx->nic_lock) == 0) {
        EXS_CNT_INC(ctx->cnt.direct_writes);
        tcp_nic_post_turn(ctx);
        pthread_mutex_unlock(&ctx->nic_lock);
        return;
    }
    /* The holder may be past its look at work_eps: a turn must follow it. */
    EXS_CNT_INC(ctx->cnt.wakeups);
    tcp_wakefd_write(ctx);
}

/* ---- commands: run by the caller's thread, nic_lock held ---- */

int exs__tcp_ctx_call(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    int stop;

    cmd->ret = 0;
    pthread_mutex_lock(&ctx->nic_lock);
    pthread_mutex_lock(&ctx->lock);
    stop = ctx->stop;
    pthread_mutex_unlock(&ctx->lock);
    if (stop) {
        pthread_mutex_unlock(&ctx->nic_lock);
        return -ESHUTDOWN;
    }
    exs__tcp_cmd_run(ctx, cmd);
    /* what the command queued leaves now; dead conns are freed */
    tcp_nic_turn(ctx, TCP_TURN_QUEUED);
    pthread_mutex_unlock(&ctx->nic_lock);
    return cmd->ret;
}

/* ctx_progress: one non-blocking turn (both modes; serialized by nic_lock). */
static int tcp_ctx_progress(struct exs_prov_ctx *c)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    int did;

    pthread_mutex_lock(&ctx->nic_lock);
    EXS_CNT_INC(ctx->cnt.progress_turns);
    did = tcp_nic_turn(ctx, TCP_TURN_IO);
    pthread_mutex_unlock(&ctx->nic_lock);
    return did > 0;
}

/*
 * One turn of a driver that sleeps between turns (the NIC thread, or ctx_close in
 * MANUAL_PROGRESS mode). Returns 1 when ctx_close may finish (stopped, nothing
 * queued, the last frames left or the drain deadline passed), else 0 with *wait_ms
 * set to how long the caller may sleep on epfd (-1: until an event).
 */
static int tcp_nic_step(struct tcp_ctx *ctx, uint64_t *stop_at, int *wait_ms)
{
    int busy, stop, done;

    pthread_mutex_lock(&ctx->nic_lock);
    tcp_nic_turn(ctx, TCP_TURN_IO);
    pthread_mutex_lock(&ctx->lock);
    busy = !exs_list_empty(&ctx->work_eps) || !exs_list_empty(&ctx->ack_defer);
    stop = ctx->stop;
    pthread_mutex_unlock(&ctx->lock);
    done = stop && !busy && tcp_nic_drained(ctx, stop_at);
    busy |= !exs_list_empty(&ctx->dirty) || !exs_list_empty(&ctx->rx_again);
    pthread_mutex_unlock(&ctx->nic_lock);
    *wait_ms = busy ? 0 : stop ? 10 : -1;
    return done;
}

/* Sleep until epfd has something, without nic_lock. The event is not looked at (its
 * object may be freed by another thread's turn meanwhile): the next turn collects it
 * again, level-triggered. */
static void tcp_nic_sleep(struct tcp_ctx *ctx, int wait_ms)
{
    struct epoll_event ev;

    if (wait_ms && exs__nc_epoll_wait(ctx->epfd, &ev, 1, wait_ms) < 0 && errno != EINTR)
        EXS_ERR(PROV, "ctx %p: epoll_wait: %m", (void *)ctx);
}

/* Default mode: the NIC thread, a driver that sleeps outside nic_lock. */
static void *tcp_nic_main(void *arg)
{
    struct tcp_ctx *ctx = arg;
    uint64_t stop_at = 0;
    int wait_ms;

    while (!tcp_nic_step(ctx, &stop_at, &wait_ms))
        tcp_nic_sleep(ctx, wait_ms);
    return NULL;
}

/* ---- open / close ---- */

static int tcp_ctx_epoll_add(struct tcp_ctx *ctx, int fd, uintptr_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN};

    ev.data.u64 = (uint64_t)((uintptr_t)ctx | tag);
    return epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/* NIC: watch the listener's socket (on) or stop watching it during a back-off. */
void exs__tcp_listener_watch(struct tcp_listener *lis, int on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0};

    ev.data.u64 = (uint64_t)((uintptr_t)lis | TCP_TAG_LIS);
    if (epoll_ctl(lis->ctx->epfd, EPOLL_CTL_MOD, lis->fd, &ev) < 0)
        EXS_ERR(PROV, "listener %p: epoll_ctl: %m", (void *)lis);
}

int exs__tcp_epoll_add_listener(struct tcp_listener *lis)
{
    struct epoll_event ev = {.events = EPOLLIN};

    ev.data.u64 = (uint64_t)((uintptr_t)lis | TCP_TAG_LIS);
    return epoll_ctl(lis->ctx->epfd, EPOLL_CTL_ADD, lis->fd, &ev) < 0 ? -errno : 0;
}

static void tcp_ctx_free(struct tcp_ctx *ctx)
{
    struct exs_list *l;

    exs__soft_cm_free_all(&ctx->cm_events);
    while ((l = exs_list_pop_head(&ctx->conns)) != NULL)
        exs__tcp_conn_close(exs_list_entry(l, struct tcp_conn, link));
    tcp_nic_reap(ctx);
    if (ctx->epfd >= 0)
        exs__nc_close(ctx->epfd);
    if (ctx->wakefd >= 0)
        exs__nc_close(ctx->wakefd);
    if (ctx->timerfd >= 0)
        exs__nc_close(ctx->timerfd);
    if (ctx->evfd >= 0)
        exs__nc_close(ctx->evfd);
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->nic_lock);
    pthread_mutex_destroy(&ctx->mr_lock);
    exs__soft_keys_fini(&ctx->keys);
    exs__soft_cq_fini(&ctx->cq);
    free(ctx);
}

static uint32_t tcp_clamp32(uint64_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

static int tcp_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    struct tcp_ctx *ctx;
    uint64_t cq_size;
    int cq_ret;
    int ret;

    exs__params_load();
    if (attr && (attr->flags & ~(uint32_t)EXS_PROV_ATTR_MANUAL_PROGRESS)) {
        EXS_ERR(PROV, "ctx open: unknown attribute flags 0x%x", attr->flags);
        return -EINVAL;
    }
    if (attr && attr->device && attr->device[0] && strcmp(attr->device, "tcp") != 0) {
        EXS_ERR(PROV, "device %s: unknown (the tcp provider has one device, tcp)", attr->device);
        return -ENODEV;
    }
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ctx->epfd = ctx->wakefd = ctx->timerfd = ctx->evfd = -1;
    ctx->manual = attr && (attr->flags & EXS_PROV_ATTR_MANUAL_PROGRESS);
    pthread_mutex_init(&ctx->nic_lock, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->mr_lock, NULL);
    exs__soft_keys_init(&ctx->keys, &ctx->mr_lock);
    exs_list_init(&ctx->cm_events);
    exs_list_init(&ctx->work_eps);
    exs_list_init(&ctx->eps);
    exs_list_init(&ctx->conns);
    exs_list_init(&ctx->dead);
    exs_list_init(&ctx->dirty);
    exs_list_init(&ctx->rx_again);
    exs_list_init(&ctx->timers);
    exs_list_init(&ctx->listeners);
    exs_list_init(&ctx->ack_defer);

    ctx->base.ops = &exs__prov_tcp_ops;
    ctx->base.caps.flags =
        EXS_PROV_CAP_WRITE_IMM | EXS_PROV_CAP_READ | EXS_PROV_CAP_INLINE | EXS_PROV_CAP_EMU_LINK;
    ctx->base.caps.max_inline = tcp_clamp32(exs__params.tcp_max_inline, 0, 1u << 20);
    ctx->base.caps.max_sge = tcp_clamp32(exs__params.tcp_max_sge, 1, 1024);
    ctx->base.caps.max_send_wr = tcp_clamp32(exs__params.tcp_max_wr, 1, 1u << 20);
    ctx->base.caps.max_recv_wr = ctx->base.caps.max_send_wr;
    ctx->base.caps.max_private_data = TCP_WIRE_PD_MAX;
    ctx->base.caps.max_msg_size = tcp_clamp32(exs__params.tcp_max_msg, 1, UINT32_MAX);
    cq_size = attr && attr->cq_size ? attr->cq_size : exs__params.tcp_cq_size;
    ctx->base.caps.max_cqe = TCP_CQ_MAX;
    ctx->emu_delay_ns = exs__params.emu_delay_us * 1000u;
    ctx->emu_rate_mbps = exs__params.emu_rate_mbps;
    ctx->rnr_timer_ms = tcp_clamp32(exs__params.tcp_rnr_timer_ms, 0, 60000);
    ctx->ctrl_max = tcp_clamp32(exs__params.tcp_ctrl_max, 1, 1u << 20);
    ctx->rnr_retry_max = (uint8_t)tcp_clamp32(exs__params.tcp_rnr_retry, 0, 7);

    cq_ret = exs__soft_cq_init(&ctx->cq, tcp_clamp32(cq_size, 1, TCP_CQ_MAX));
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (cq_ret || ctx->epfd < 0 || ctx->wakefd < 0 || ctx->evfd < 0 || ctx->timerfd < 0) {
        ret = cq_ret ? cq_ret : -errno;
        EXS_ERR(PROV, "ctx open: %s", strerror(-ret));
        tcp_ctx_free(ctx);
        return ret;
    }
    ret = tcp_ctx_epoll_add(ctx, ctx->wakefd, TCP_TAG_WAKE);
    if (!ret)
        ret = tcp_ctx_epoll_add(ctx, ctx->timerfd, TCP_TAG_TIMER);
    if (!ret && ctx->manual)
        ret = tcp_ctx_epoll_add(ctx, ctx->evfd, TCP_TAG_LIS);
    if (!ret && !ctx->manual) {
        ret = exs__thread_create(&ctx->thread, "exs-tcp-nic", tcp_nic_main, ctx);
        ctx->has_thread = !ret;
    }
    if (ret) {
        EXS_ERR(PROV, "ctx open: %s", strerror(-ret));
        tcp_ctx_free(ctx);
        return ret;
    }
    ctx->cset.name = "prov.tcp";
    ctx->cset.desc = tcp_counter_desc;
    ctx->cset.count = EXS_ARRAY_SIZE(tcp_counter_desc);
    ctx->cset.base = &ctx->cnt;
    exs__counters_register(&ctx->cset);
    EXS_DBG(PROV, "ctx %p: open, %s progress, cq %u, emu delay %llu us rate %llu mbps", (void *)ctx,
            ctx->manual ? "manual" : "NIC thread", ctx->cq.cap,
            (unsigned long long)exs__params.emu_delay_us, (unsigned long long)ctx->emu_rate_mbps);
    *ctx_p = &ctx->base;
    return 0;
}

static void tcp_ctx_close(struct exs_prov_ctx *c)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);

    if (!ctx)
        return;
    if (!exs_list_empty(&ctx->eps))
        EXS_WARN(PROV, "ctx %p: closed with endpoints left", (void *)ctx);
    pthread_mutex_lock(&ctx->lock);
    ctx->stop = 1;
    pthread_mutex_unlock(&ctx->lock);
    if (ctx->has_thread) {
        tcp_wakefd_write(ctx);
        pthread_join(ctx->thread, NULL); /* nocancel: ok (exs_fini: off) */
    } else {
        /* MANUAL_PROGRESS: drive the last frames out ourselves, bounded as the NIC
         * thread does (tcp_nic_drained) */
        uint64_t stop_at = 0;
        int wait_ms;

        while (!tcp_nic_step(ctx, &stop_at, &wait_ms))
            tcp_nic_sleep(ctx, wait_ms);
    }
    exs__counters_unregister(&ctx->cset);
    tcp_ctx_free(ctx);
}

struct exs_prov_ops exs__prov_tcp_ops = {
    .name = "tcp",
    .ctx_open = tcp_ctx_open,
    .ctx_close = tcp_ctx_close,
    .ctx_event_fd = tcp_ctx_event_fd,
    .ctx_disarm = tcp_ctx_disarm,
    .ctx_arm = tcp_ctx_arm,
    .ctx_progress = tcp_ctx_progress,
    .ctx_poll = tcp_ctx_poll,
    .ctx_cm_poll = tcp_ctx_cm_poll,
    .ctx_fork = exs__tcp_ctx_fork,
    .mr_reg = exs__tcp_mr_reg,
    .mr_dereg = exs__tcp_mr_dereg,
    .grant = exs__tcp_grant,
    .revoke = exs__tcp_revoke,
    .ep_create = exs__tcp_ep_create,
    .ep_destroy = exs__tcp_ep_destroy,
    .ep_state = exs__tcp_ep_state,
    .ep_local_addr = exs__tcp_ep_local_addr,
    .listen = exs__tcp_listen,
    .listener_addr = exs__tcp_listener_addr,
    .listener_destroy = exs__tcp_listener_destroy,
    .listener_pause = exs__tcp_listener_pause,
    .connect = exs__tcp_connect,
    .accept = exs__tcp_accept,
    .reject = exs__tcp_reject,
    .disconnect = exs__tcp_disconnect,
    .post_recv = exs__tcp_post_recv,
    .post_send = exs__tcp_post_send,
};
