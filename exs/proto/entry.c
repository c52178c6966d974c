/* SPDX-License-Identifier: MIT */
/* The entry points the engine and the api call: create and destroy, connect and accept,
 * operations, close and abort, statistics. Layer 6 of spec/proto-layout.md. */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

static inline int conn_is_stream(const struct exs_conn *conn)
{
    return conn->p.sock_type == SOCK_STREAM;
}

/* The modules above the core, hooked in (conn.h, spec/proto-layout.md). */
const struct exs_conn_hooks exs__conn_hooks = {
    .fail = exs__resume_on_fail_locked,
    .trial_end = exs__resume_pend_end_locked,
    .trace_done = exs__reqtrace_done_locked,
    .trace_deliver = exs__reqtrace_deliver_locked,
    .trace_free = exs__reqtrace_free_locked,
    .wrq_flush = exs__conn_wrq_flush_locked,
    .on_rx_held = exs__conn_on_rx_held_locked,
};

/* The state table (conn.h, spec/states.md): RESUMING is the one state with handlers of
 * its own, the cut-over's (resume.c). */
const struct exs_conn_row exs__conn_rows[EXS_CONN_STATE_COUNT] = {
    [EXS_CONN_IDLE] = {.name = "IDLE", .next = CONN_BIT(EXS_CONN_CONNECTING)},
    [EXS_CONN_CONNECTING] = {.name = "CONNECTING",
                             .next = CONN_BIT(EXS_CONN_IDLE) | CONN_BIT(EXS_CONN_CONNECTED) |
                                     CONN_BIT(EXS_CONN_REFUSING) | CONN_BIT(EXS_CONN_DOWN) |
                                     CONN_BIT(EXS_CONN_DEAD)},
    [EXS_CONN_CONNECTED] = {.name = "CONNECTED",
                            .next = CONN_BIT(EXS_CONN_CLOSING) | CONN_BIT(EXS_CONN_DOWN) |
                                    CONN_BIT(EXS_CONN_DRAINING) | CONN_BIT(EXS_CONN_RESUMING)},
    [EXS_CONN_CLOSING] = {.name = "CLOSING",
                          .next = CONN_BIT(EXS_CONN_DOWN) | CONN_BIT(EXS_CONN_DRAINING)},
    [EXS_CONN_RESUMING] = {.name = "RESUMING",
                           .next = CONN_BIT(EXS_CONN_CONNECTED) | CONN_BIT(EXS_CONN_DOWN),
                           .leave = exs__resume_wait_leave,
                           .after_cqes = exs__resume_progress_locked,
                           .on_cm = exs__resume_on_cm_locked,
                           .timer = exs__resume_timer_locked},
    [EXS_CONN_DOWN] = {.name = "DOWN",
                       .next = CONN_BIT(EXS_CONN_DRAINING) | CONN_BIT(EXS_CONN_DEAD)},
    [EXS_CONN_REFUSING] = {.name = "REFUSING", .next = CONN_BIT(EXS_CONN_DEAD)},
    [EXS_CONN_DRAINING] = {.name = "DRAINING", .next = CONN_BIT(EXS_CONN_DEAD)},
    [EXS_CONN_DEAD] = {.name = "DEAD", .next = 0},
};

static pthread_once_t proto_cset_once = PTHREAD_ONCE_INIT;

static void proto_cset_register(void)
{
    exs__conn_cset_register();
    exs__resume_cset_register();
    exs__shmsw_cset_register();
    exs__mem_cset_register();
}

int exs__conn_create(struct exs_prov_ctx *ctx, const struct exs_conn_params *p,
                     const struct exs_conn_cb *cb, void *owner, struct exs_conn **conn_p)
{
    struct exs_conn *conn;
    int ret = -ENOMEM;

    if (p->credits < 3 || p->credits > EXS_IMM_CREDITS_MAX || p->ring_size % EXS_RING_SLOT ||
        p->max_reads < 1 || p->ring_size < EXS_RING_SLOT || p->ring_size > EXS_WIRE_RING_SIZE_MAX ||
        p->batch_max > EXS_BATCH_MAX_LIMIT)
        return -EINVAL;
    pthread_once(&proto_cset_once, proto_cset_register);
    /* the connection's own memory first: past the budget, nothing is allocated (§9.3) */
    ret = exs__mem_take(exs__mem_chunk(sizeof(*conn)), EXS_MEM_CONN,
                        exs__conn_mem_slack(EXS_MEM_CONN));
    if (ret) {
        EXS_INFO(PROTO, "conn: refused, memory budget (EXS_MEM_BUDGET %llu bytes) reached",
                 (unsigned long long)__atomic_load_n(&exs__params.mem_budget, __ATOMIC_RELAXED));
        return ret;
    }
    ret = -ENOMEM;
    conn = calloc(1, sizeof(*conn));
    if (!conn) {
        exs__mem_give(exs__mem_chunk(sizeof(*conn)));
        return -ENOMEM;
    }
    conn->created_ns = exs__now_ns();
    conn->ctx = ctx;
    conn->cb = cb;
    conn->owner = owner;
    conn->p = *p;
    conn->dp = conn_is_stream(conn) ? &exs__stream_path : &exs__seqpkt_path; /* the one choice */
    /* our hello must pass the peer's check (§2): nothing larger than the ring goes eagerly */
    conn->p.eager_max = EXS_MIN(p->eager_max, p->ring_size);
    exs_list_init(&conn->sendq);
    exs_list_init(&conn->recvq);
    exs_list_init(&conn->pending);
    exs_list_init(&conn->pending_free);
    exs_list_init(&conn->wrq);
    conn->batch_thresh = EXS_MIN(EXS_BATCH_FLOOR, p->batch_max); /* 0: off */

    conn->tx_slots = CONN_TX_SLOTS;
    conn->adv_cap = 64;
    conn->tx_free = calloc(conn->tx_slots, sizeof(*conn->tx_free));
    conn->tx_op = calloc(conn->tx_slots, sizeof(*conn->tx_op));
    conn->adverts = calloc(conn->adv_cap, sizeof(*conn->adverts));
    conn->rd_owed = calloc(p->max_reads ? p->max_reads : 1, sizeof(*conn->rd_owed));
    if (!conn->rd_owed || !conn->tx_free || !conn->tx_op || !conn->adverts)
        goto err;
    ret = exs__conn_mem_take_locked(conn, exs__conn_arrays_bytes(conn), EXS_MEM_CONN);
    if (ret)
        goto err;
    conn->mem_arrays = exs__conn_arrays_bytes(conn);
    for (uint32_t i = 0; i < conn->tx_slots; i++)
        conn->tx_free[conn->tx_free_top++] = i;

    /* registered memory from the provider (its memory cache on verbs): the ring, and the
     * control receive and send slots together, all for local access only */
    ret = exs__conn_ring_region_locked(conn, p->ring_size, 0, &conn->ring_mem, NULL);
    if (ret)
        goto err;
    conn->ring = conn->ring_mem->addr;
    conn->ring_init = p->ring_size;
    ret = exs__conn_mem_alloc(ctx, (size_t)(p->credits + conn->tx_slots) * EXS_WIRE_CTRL_MAX,
                              EXS_MEM_CONN, &conn->ctrl_mem);
    if (ret)
        goto err;
    conn->rx_bufs = conn->ctrl_mem->addr;
    conn->tx_bufs = conn->rx_bufs + (size_t)p->credits * EXS_WIRE_CTRL_MAX;
    conn->rx_mr = conn->tx_mr = conn->ctrl_mem;
    /* the peer gets its write grant over the ring once connected (§2, RING) */

    struct exs_prov_ep_attr attr = {
        /* + the unsignaled writes that may still hold a slot (§6.4), as exs__conn_path_make */
        .max_send_wr = p->credits + p->max_reads + conn->tx_slots + 8 + EXS_QUIET_MAX,
        .max_recv_wr = p->credits,
        /* control records (ACK, ADVERT, ...) are small: sent inline, no DMA read of a slot */
        .max_inline = EXS_MIN(ctx->caps.max_inline, CONN_CTRL_INLINE),
        .rnr_retry = 3,
        .user = conn,
    };
    ret = exs__prov_ep_create(ctx, &attr, &conn->ep);
    if (ret)
        goto err;
    for (uint32_t i = 0; i < p->credits; i++) {
        ret = exs__conn_post_rx_locked(conn, i);
        if (ret)
            goto err;
    }
    conn->credits = 0; /* granted by the peer's hello */
    exs__conn_live_add(1);
    exs__conn_cnt_attach(conn);
    *conn_p = conn;
    return 0;

err:
    if (ret != -ENOBUFS)
        EXS_WARN(PROTO, "conn: set-up failed: %s", strerror(-ret));
    else
        EXS_INFO(PROTO, "conn: refused, memory budget (EXS_MEM_BUDGET %llu bytes) reached",
                 (unsigned long long)__atomic_load_n(&exs__params.mem_budget, __ATOMIC_RELAXED));
    exs__conn_release_locked(conn);
    exs__conn_struct_free(conn);
    return ret;
}

void exs__conn_destroy(struct exs_conn *conn)
{
    EXS_ASSERT(conn->state == EXS_CONN_DEAD || conn->state == EXS_CONN_IDLE);
    EXS_ASSERT(exs_list_empty(&conn->sendq) && exs_list_empty(&conn->recvq));
    if (exs__resume_forget(conn))
        exs__conn_free(conn);
}

int exs__conn_connect(struct exs_conn *conn, const struct sockaddr *addr, socklen_t len)
{
    struct exs_wire_hello h;
    int ret;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__conn_hello(conn, &h);
    conn->active = 1;
    conn->dl_start_ns = exs__now_ns();
    exs__conn_set_state_locked(conn, EXS_CONN_CONNECTING, "connect");
    ret = exs__prov_connect(conn->ep, addr, len, &h, sizeof(h));
    if (ret)
        exs__conn_set_state_locked(conn, EXS_CONN_IDLE, "connect failed");
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

int exs__conn_accept(struct exs_conn *conn, struct exs_prov_conn_req *req, const void *peer_pd)
{
    struct exs_wire_hello h;
    int ret;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__conn_adopt_hello_locked(conn, peer_pd);
    exs__conn_hello(conn, &h);
    conn->dl_start_ns = exs__now_ns();
    exs__conn_set_state_locked(conn, EXS_CONN_CONNECTING, "accept");
    ret = exs__prov_accept(req, conn->ep, &h, sizeof(h));
    if (ret)
        exs__conn_set_state_locked(conn, EXS_CONN_IDLE, "accept failed");
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

int exs__conn_post(struct exs_conn *conn, struct exs_op *op)
{
    int ret = 0;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    switch (conn->state) {
    case EXS_CONN_IDLE:
    case EXS_CONN_CONNECTING:
        ret = -ENOTCONN;
        goto out;
    case EXS_CONN_CLOSING:
        ret = -EBADF;
        goto out;
    default:
        break;
    }
    if (op->kind != EXS_OP_RECV && conn->txshut != EXS_TXSHUT_OPEN) {
        ret = -EPIPE;
        goto out;
    }
    op->state = EXS_OPS_QUEUED;
    op->grant = NULL;
    op->rkey = 0;
    op->result = 0;
    op->err = 0;
    op->rflags = 0;
    op->posted = 0;
    op->inflight = 0;
    op->announced = 0;
    op->filled = 0;
    op->rt = NULL;
    if (op->mr && op->mr->ctx != conn->ctx) {
        /* registered on the context the conn ran on before a cut-over (§9.2) */
        ret = exs__resume_op_mr_locked(conn, op);
        if (ret)
            goto out;
    }
    if (op->kind == EXS_OP_RECV) {
        exs_list_add_tail(&conn->recvq, &op->link);
        if (conn->state == EXS_CONN_DEAD) {
            conn->dp->dead_drain(conn);
        } else if (conn->dp == &exs__seqpkt_path && conn->state == EXS_CONN_CONNECTED &&
                   !conn->resume.peer_wait && exs__seqpkt_rx_idle(conn) &&
                   exs__conn_ctrl_idle(conn) && exs__conn_deliver_idle(conn)) {
            /* nothing to place (spec/proto-layout.md, "A receive posted with nothing to
             * place"): each part of the receive side's kick would give its quick answer,
             * so no pass runs; delivery's would forget the run of internal ops */
            conn->rx_posts_idle++;
            conn->dlv_run = NULL;
            goto out;
        }
        exs__conn_kick_rx_locked(conn); /* the full kick off CONNECTED */
        goto out;
    } else {
        if (op->kind == EXS_OP_SHUTDOWN)
            exs__conn_set_txshut_locked(conn, EXS_TXSHUT_QUEUED, "exs_shutdown accepted");
        if (EXS_REQTRACE_ON &&
            EXS_UNLIKELY(__atomic_load_n(&exs__params.trace_sample_mask, __ATOMIC_RELAXED)))
            exs__reqtrace_post_locked(conn, op);
        exs_list_add_tail(&conn->sendq, &op->link);
        __atomic_store_n(&conn->sendq_app, conn->sendq_app + 1, __ATOMIC_RELAXED);
        if (conn->dp->stage_send)
            conn->dp->stage_send(conn, op); /* copied: finished, the copy goes on */
        if (conn->state == EXS_CONN_DEAD) {
            exs__conn_op_finish_locked(op, -1, conn->peer_shut ? EPIPE : conn->err);
        } else if (op->kind == EXS_OP_SEND) {
            if (!conn->dp->post_fast || conn->state != EXS_CONN_CONNECTED ||
                !conn->dp->post_fast(conn, op))
                exs__conn_kick_tx_locked(conn); /* else on the wire: nothing more to do */
            goto out;
        }
    }
    exs__conn_kick_locked(conn);
out:
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* An op may be cancelled while nothing of it is on the wire; a receive also only when
 * no advertised receive follows it (the advert's message number counts it). */
static int conn_cancellable_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_list *pos;

    if (op->state != EXS_OPS_QUEUED)
        return 0;
    if (op->kind != EXS_OP_RECV)
        return 1;
    for (pos = op->link.next; pos != &conn->recvq; pos = pos->next)
        if (exs_list_entry(pos, struct exs_op, link)->state == EXS_OPS_ADVERTISED)
            return 0;
    return 1;
}

int exs__conn_cancel(struct exs_conn *conn, int (*match)(struct exs_op *op, void *arg), void *arg)
{
    struct exs_list *q[2] = {&conn->sendq, &conn->recvq};
    struct exs_list *pos;
    int n = 0;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    for (int i = 0; i < 2; i++) {
        exs_list_for_each(pos, q[i])
        {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->state == EXS_OPS_DONE || op->internal || !match(op, arg))
                continue;
            if (op->kind == EXS_OP_SHUTDOWN)
                continue;
            if (conn_cancellable_locked(conn, op)) {
                exs__conn_op_finish_locked(op, -1, ECANCELED);
                n++;
            } else if (conn->state >= EXS_CONN_DOWN) {
                /* On the wire, and the connection is going away. With a work request
                 * of its own outstanding, the provider still holds the op (its wr_id)
                 * and its buffer: it completes when that completion or flush is seen
                 * (at DEAD at the latest). Otherwise only the peer's grant reaches it,
                 * and finishing revokes that. */
                op->cancel = 1;
                if (!op->inflight) {
                    exs__conn_op_finish_locked(op, -1, ECANCELED);
                    n++;
                }
            }
        }
    }
    exs__conn_kick_locked(conn);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return n;
}

void exs__conn_close(struct exs_conn *conn)
{
    struct exs_list *q[2] = {&conn->sendq, &conn->recvq};
    struct exs_list *pos;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    /* Sends gathered behind a ring write in flight (batching, §6.1) would have been on
     * the wire without batching: they leave now, so close sends what it sent before. */
    if (conn->state == EXS_CONN_CONNECTED && conn->ring_wr_out) {
        conn->batch_now = 1;
        conn->dp->send_progress(conn);
        conn->batch_now = 0;
    }
    /* Everything outstanding completes with ECANCELED: at once when nothing of it is
     * on the wire, else when the disconnect has flushed it (its buffer is then free). */
    for (int i = 0; i < 2; i++) {
        exs_list_for_each(pos, q[i])
        {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->state == EXS_OPS_DONE || op->internal)
                continue; /* copies in the send buffer are sent: their sends completed */
            op->cancel = 1;
            if (op->state == EXS_OPS_QUEUED)
                exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
    }
    if (exs__resume_close_locked(conn)) { /* being cut over: reset now (§9.2) */
        exs__conn_deliver_locked(conn);
        EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        return;
    }
    switch (conn->state) {
    case EXS_CONN_CONNECTED:
        /* Say goodbye with a SHUTDOWN record, then disconnect once its SEND completed,
         * so the peer reads end of stream rather than a reset. */
        exs__conn_set_state_locked(conn, EXS_CONN_CLOSING, "close");
        if ((conn->txshut == EXS_TXSHUT_OPEN || conn->txshut == EXS_TXSHUT_QUEUED) &&
            exs__stage_pending_locked(conn) && !exs__stage_shutdown_locked(conn)) {
            /* copies not yet on the wire (§7.5): the record follows them */
            if (conn->txshut == EXS_TXSHUT_OPEN)
                exs__conn_set_txshut_locked(conn, EXS_TXSHUT_QUEUED,
                                            "close behind the send buffer");
            exs__stream_send_progress_locked(conn);
            exs__conn_ctrl_flush_locked(conn);
        } else if (conn->txshut == EXS_TXSHUT_OPEN || conn->txshut == EXS_TXSHUT_QUEUED) {
            if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN))
                exs__conn_ctrl_flush_locked(conn);
            if (exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN))
                exs__conn_shutdown_record_locked(conn, NULL);
            else /* cannot: reset below */
                exs__conn_set_txshut_locked(conn, EXS_TXSHUT_DONE, "no room for the record");
        }
        if (conn->txshut == EXS_TXSHUT_DONE) {
            exs__conn_set_state_locked(conn, EXS_CONN_DOWN, "closed");
            exs__prov_disconnect(conn->ep);
        } else {
            exs__conn_ctrl_flush_locked(conn);
        }
        break;
    case EXS_CONN_CONNECTING:
        exs__conn_set_state_locked(conn, EXS_CONN_DOWN, "close while connecting");
        exs__prov_disconnect(conn->ep);
        break;
    default:
        break;
    }
    exs__conn_deliver_locked(conn);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_abort_locked(struct exs_conn *conn)
{
    if (exs__resume_close_locked(conn))
        return;
    if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING ||
        conn->state == EXS_CONN_CONNECTING) {
        exs__conn_set_state_locked(conn, EXS_CONN_DOWN, "abort");
        exs__prov_disconnect(conn->ep);
    } else if (conn->state == EXS_CONN_DRAINING) {
        /* the provider never flushed what was outstanding: give up waiting */
        EXS_WARN(PROTO, "conn %p: %u work requests never completed after the disconnect",
                 (void *)conn, conn->wr_out);
        exs__conn_dead_locked(conn, conn->disc_err, "flush never completed");
        conn->cb->dead(conn);
    }
}

void exs__conn_abort(struct exs_conn *conn)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__conn_abort_locked(conn);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_stats(struct exs_conn *conn, struct exs_sock_stats *st)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    *st = conn->stats;
    st->batch_thresh = conn->batch_thresh;
    st->ring_size = conn->p.ring_size;
    if (conn->dp->stats)
        conn->dp->stats(conn, st);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_info(struct exs_conn *conn, struct exs_conn_info *info)
{
    exs__conn_stats(conn, &info->stats);
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    info->state = exs__conn_state_name(conn->state);
    info->phase = conn->p.sock_type != SOCK_STREAM   ? ""
                  : PHASE_IS_DIRECT(conn->stream.ps) ? "direct"
                                                     : "indirect";
    info->credits = conn->credits;
    info->peer_credits = conn->peer.credits;
    info->wr_out = conn->wr_out;
    info->pending = conn->pending_count;
    info->adverts_held = conn->adv_count;
    info->wr_queued = conn->wrq_count;
    info->age_ms = (exs__now_ns() - conn->created_ns) / 1000000u;
    info->device = exs__prov_device(conn->ctx);
    info->posts_copied = conn->posts_copied;
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__proto_fork_child(void)
{
    exs__resume_fork_child();
    exs__conn_fork_child();
    exs__conn_mem_fork_child();
}
