/* SPDX-License-Identifier: MIT */
/* Completion, control-record and connection-event dispatch (progress lock held: the
 * progress thread or a driving waiter). Layer 5 of spec/proto-layout.md. */
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

/* The conn is going away (DOWN on): its queued work requests will never be posted; each
 * completes as flushed, as the provider completes the posted ones, so every op and slot
 * they hold is accounted for (wr_out reaches 0). */
void exs__conn_wrq_flush_locked(struct exs_conn *conn)
{
    struct exs_prov_cqe cqe;

    while (exs__conn_wrq_pop_locked(conn, &cqe))
        exs__conn_on_cqe_locked(conn, &cqe);
}

/* ---- completions (progress lock held: the progress thread or a driving waiter) ---- */

/* ---- control records (§5): one table of type, length and handler ---- */

/* A record of its table's length (checked), at rec; h its header. 0, or -errno: -EPROTO
 * (the peer broke the protocol) or -ENOBUFS (the memory budget). */
typedef int (*rec_fn)(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h);

static int rec_ack(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_ack a;
    uint64_t c;

    (void)h;
    memcpy(&a, rec, sizeof(a));
    c = be64toh(a.ring_consumed);
    if (c - conn->wr_consumed > conn->wr_tail - conn->wr_consumed)
        return exs__proto_violation(conn, EXS_PV_ACK_RANGE, EXS_CTRL_ACK,
                                    "consumed %llu, written %llu, consumed before %llu",
                                    (unsigned long long)c, (unsigned long long)conn->wr_tail,
                                    (unsigned long long)conn->wr_consumed);
    conn->wr_consumed = c;
    return 0;
}

static int rec_advert(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_advert w;

    (void)h;
    memcpy(&w, rec, sizeof(w));
    struct exs_advert a = {
        .addr = be64toh(w.addr),
        .len = be32toh(w.len),
        .rkey = be32toh(w.rkey),
        .seq = be64toh(w.seq),
        .id = be32toh(w.id),
        .phase = be32toh(w.phase),
        .flags = w.hdr.flags,
    };
    return conn->dp->on_advert(conn, &a); /* a violation recorded there */
}

static int rec_announce(struct exs_conn *conn, const uint8_t *rec,
                        const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_announce a;

    (void)h;
    memcpy(&a, rec, sizeof(a));
    if (!conn->dp->on_announce)
        return exs__proto_violation(conn, EXS_PV_SOCK_TYPE, EXS_CTRL_ANNOUNCE, "on STREAM");
    return conn->dp->on_announce(conn, &a);
}

static int rec_read_done(struct exs_conn *conn, const uint8_t *rec,
                         const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_read_done d;

    (void)h;
    memcpy(&d, rec, sizeof(d));
    if (!conn->dp->on_read_done)
        return exs__proto_violation(conn, EXS_PV_SOCK_TYPE, EXS_CTRL_READ_DONE, "on STREAM");
    return conn->dp->on_read_done(conn, be64toh(d.seq));
}

static int rec_shutdown(struct exs_conn *conn, const uint8_t *rec,
                        const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_shutdown s;

    (void)h;
    memcpy(&s, rec, sizeof(s));
    /* everything the peer sent came before its SHUTDOWN on the one ordered path, so its
     * count is exactly what arrived (§8): a count above it would leave receives waiting
     * for data that never comes */
    if (conn->peer_shut || be64toh(s.seq) != exs__resume_arrived_locked(conn) ||
        conn->seqpkt.rx_frag)
        return exs__proto_violation(
            conn, EXS_PV_SHUTDOWN, EXS_CTRL_SHUTDOWN, "%scount %llu, arrived %llu%s",
            conn->peer_shut ? "a second, " : "", (unsigned long long)be64toh(s.seq),
            (unsigned long long)exs__resume_arrived_locked(conn),
            conn->seqpkt.rx_frag ? ", inside a fragmented message" : "");
    conn->peer_shut = 1;
    conn->peer_total = be64toh(s.seq);
    return 0;
}

static int rec_nop(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    (void)rec;
    return exs__conn_ka_on_nop_locked(conn, h->flags);
}

static int rec_ring(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_ring r;

    (void)h;
    memcpy(&r, rec, sizeof(r));
    conn->peer.ring_rkey = be32toh(r.rkey);
    conn->peer_ring_keyed = 1;
    return 0;
}

static int rec_drain(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_drain d;

    (void)h;
    memcpy(&d, rec, sizeof(d));
    if (!conn->dp->on_drain)
        return exs__proto_violation(conn, EXS_PV_SOCK_TYPE, EXS_CTRL_DRAIN, "on SEQPACKET");
    return conn->dp->on_drain(conn, &d);
}

static int rec_trace(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_trace t;

    (void)h;
    memcpy(&t, rec, sizeof(t));
    return exs__reqtrace_on_record_locked(conn, &t);
}

static int rec_resize(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_resize r;

    (void)h;
    memcpy(&r, rec, sizeof(r));
    if (!conn->dp->on_resize)
        return exs__proto_violation(conn, EXS_PV_SOCK_TYPE, EXS_CTRL_RESIZE, "on SEQPACKET");
    return conn->dp->on_resize(conn, &r);
}

static int rec_session(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_session s;

    (void)h;
    memcpy(&s, rec, sizeof(s));
    return exs__resume_on_session_locked(conn, &s);
}

static int rec_resume(struct exs_conn *conn, const uint8_t *rec, const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_resume r;

    (void)h;
    memcpy(&r, rec, sizeof(r));
    return exs__resume_on_resume_locked(conn, &r);
}

/* Every record type a connection takes: its length (exact: §5) and handler. A type not
 * here breaks the protocol (ctrl-type); one with a refused rule breaks that rule. */
static const struct ctrl_rec {
    uint16_t len;
    rec_fn on;
    enum exs_pv_rule refused;
} ctrl_recs[EXS_CTRL_TYPE_MAX + 1] = {
    [EXS_CTRL_ACK] = {EXS_WIRE_ACK_LEN, rec_ack, EXS_PV_NONE},
    [EXS_CTRL_ADVERT] = {EXS_WIRE_ADVERT_LEN, rec_advert, EXS_PV_NONE},
    [EXS_CTRL_ANNOUNCE] = {EXS_WIRE_ANNOUNCE_LEN, rec_announce, EXS_PV_NONE},
    [EXS_CTRL_READ_DONE] = {EXS_WIRE_READ_DONE_LEN, rec_read_done, EXS_PV_NONE},
    [EXS_CTRL_SHUTDOWN] = {EXS_WIRE_SHUTDOWN_LEN, rec_shutdown, EXS_PV_NONE},
    [EXS_CTRL_NOP] = {EXS_WIRE_NOP_LEN, rec_nop, EXS_PV_NONE},
    [EXS_CTRL_RING] = {EXS_WIRE_RING_LEN, rec_ring, EXS_PV_NONE},
    [EXS_CTRL_DRAIN] = {EXS_WIRE_DRAIN_LEN, rec_drain, EXS_PV_NONE},
    [EXS_CTRL_TRACE] = {EXS_WIRE_TRACE_LEN, rec_trace, EXS_PV_NONE},
    [EXS_CTRL_RESIZE] = {EXS_WIRE_RESIZE_LEN, rec_resize, EXS_PV_NONE},
    [EXS_CTRL_SESSION] = {EXS_WIRE_SESSION_LEN, rec_session, EXS_PV_NONE},
    [EXS_CTRL_RESUME] = {EXS_WIRE_RESUME_LEN, rec_resume, EXS_PV_NONE},
    /* taken by a resume request on trial only (§9.2): on a connection, a second one, or
     * one on a first path */
    [EXS_CTRL_AUTH] = {0, NULL, EXS_PV_AUTH},
    [EXS_CTRL_SHM_OFFER] = {EXS_WIRE_SHM_OFFER_LEN, exs__shmsw_on_offer, EXS_PV_NONE},
    [EXS_CTRL_SHM_SWITCH] = {EXS_WIRE_SHM_SWITCH_LEN, exs__shmsw_on_switch, EXS_PV_NONE},
};

static int conn_on_ctrl_locked(struct exs_conn *conn, const uint8_t *buf, uint32_t len)
{
    uint32_t off = 0;

    while (off < len) {
        struct exs_wire_ctrl_hdr h;
        const struct ctrl_rec *k;
        uint32_t rlen;
        int ret;

        if (len - off < EXS_WIRE_CTRL_HDR_LEN)
            return exs__proto_violation(conn, EXS_PV_CTRL_TRUNCATED, EXS_PV_REC_NONE,
                                        "%u bytes left at offset %u of %u", len - off, off, len);
        memcpy(&h, buf + off, sizeof(h));
        rlen = be16toh(h.len);
        if (rlen < EXS_WIRE_CTRL_HDR_LEN || rlen % 8 || rlen > len - off)
            return exs__proto_violation(conn, EXS_PV_CTRL_LEN, h.type,
                                        "length %u at offset %u of %u", rlen, off, len);
        k = h.type <= EXS_CTRL_TYPE_MAX ? &ctrl_recs[h.type] : NULL;
        if (k && k->refused)
            return exs__proto_violation(conn, k->refused, h.type, "on a connection");
        if (!k || !k->on)
            return exs__proto_violation(conn, EXS_PV_CTRL_TYPE, h.type, "type %u", h.type);
        if (rlen != k->len)
            return exs__proto_violation(conn, EXS_PV_CTRL_SIZE, h.type, "length %u, want %u", rlen,
                                        k->len);
        /* the peer's RING comes first and once (§2) */
        if ((h.type == EXS_CTRL_RING) == conn->peer_ring_keyed)
            return exs__proto_violation(conn, EXS_PV_RING_ORDER, h.type,
                                        conn->peer_ring_keyed ? "a second RING"
                                                              : "before the peer's RING");
        /* on a cut-over's new path its RESUME comes next (§9.2) */
        if (conn->resume.peer_wait && h.type != EXS_CTRL_RING && h.type != EXS_CTRL_RESUME)
            return exs__proto_violation(conn, EXS_PV_RESUME_FIRST, h.type,
                                        "on the new path before the peer's RESUME");
        EXS_TRACE(PROTO, "conn %p: control record type %u, %u credits", (void *)conn, h.type,
                  be16toh(h.credits));
        conn->credits += be16toh(h.credits);
        if (conn->credits > conn->peer.credits)
            return exs__proto_violation(conn, EXS_PV_CREDITS, h.type,
                                        "%u returned, %u held of the %u granted",
                                        be16toh(h.credits), conn->credits, conn->peer.credits);
        ret = k->on(conn, buf + off, &h);
        if (ret)
            return ret;
        off += rlen;
    }
    return 0;
}

/* A receive slot back to the provider, counted owed (reported to the peer from now on);
 * a failed post resets the connection. */
static inline __attribute__((always_inline)) void conn_rx_repost_locked(struct exs_conn *conn,
                                                                        uint32_t slot)
{
    if (conn->state >= EXS_CONN_DOWN || (conn->state == EXS_CONN_RESUMING && !conn->resume.newpath))
        return; /* going away, or the old path of a cut-over: the slot is not needed any more */
    if (exs__conn_post_rx_locked(conn, slot)) {
        exs__conn_fail_locked(conn, ECONNRESET, "receive re-post failed");
        return;
    }
    conn->owed++;
}

static void conn_on_rx_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe, uint32_t slot)
{
    int ret = 0;

    if (cqe->opcode == EXS_PROV_WC_RECV) {
        ret = conn_on_ctrl_locked(conn, conn->rx_bufs + (size_t)slot * EXS_WIRE_CTRL_MAX,
                                  cqe->byte_len);
    } else if (cqe->opcode == EXS_PROV_WC_RECV_RDMA_WITH_IMM &&
               (cqe->flags & EXS_PROV_WC_WITH_IMM)) {
        conn->credits += exs_imm_credits(cqe->imm_data);
        if (conn->credits > conn->peer.credits)
            ret = exs__proto_violation(
                conn, EXS_PV_CREDITS, EXS_PV_REC_WRITE, "%u returned, %u held of the %u granted",
                exs_imm_credits(cqe->imm_data), conn->credits, conn->peer.credits);
        else if (conn->resume.peer_wait)
            ret = exs__proto_violation(conn, EXS_PV_RESUME_FIRST, EXS_PV_REC_WRITE,
                                       "on the new path before the peer's RESUME");
        else
            ret = conn->dp->on_data(conn, cqe->imm_data, cqe->byte_len);
    } else {
        ret = exs__proto_violation(conn, EXS_PV_COMPLETION, EXS_PV_REC_COMPLETION,
                                   "opcode %d, flags %#x", (int)cqe->opcode, cqe->flags);
    }
    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET,
                              ret == -ENOBUFS  ? "memory budget (EXS_MEM_BUDGET) reached"
                              : ret == -ENOMEM ? "out of memory"
                                               : "peer broke the protocol");
        return;
    }
    if (EXS_REQTRACE_ON && conn->rt)
        exs__reqtrace_arrival_locked(conn);
    /* on a plain connection the run's last receive is re-posted after the kick delivered
     * its event (conn_after_cqes_locked, which follows every run): an earlier one of the
     * run goes now; owed counts each only once posted */
    if ((conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) &&
        !conn->resume.pend && !conn->resume.peer_wait) {
        if (conn->rx_defer)
            conn_rx_repost_locked(conn, conn->rx_defer - 1);
        conn->rx_defer = slot + 1;
        return;
    }
    conn_rx_repost_locked(conn, slot);
}

/* A control SEND completes once the peer's NIC acknowledged it: one round-trip sample
 * (spec/protocol.md §7.4), smoothed as TCP does (srtt += (sample - srtt) / 8). */
static void conn_rtt_sample_locked(struct exs_conn *conn, uint64_t t_us)
{
    uint64_t now = exs__now_us(), rtt;

    if (!t_us || now < t_us)
        return;
    rtt = EXS_MAX(now - t_us, (uint64_t)1);
    conn->stats.srtt_us = conn->stats.srtt_us ? (7 * conn->stats.srtt_us + rtt + 4) / 8 : rtt;
    /* the path's own round trip, without the time samples wait in queues (§7.4) */
    if (!conn->autotune.rtt_min || rtt <= conn->autotune.rtt_min ||
        now - conn->autotune.rtt_min_t > EXS_RTT_MIN_WIN_US) {
        conn->autotune.rtt_min = rtt;
        conn->autotune.rtt_min_t = now;
    }
}

/* One completion, conn->lock held; the caller kicks the conn afterwards. */
void exs__conn_on_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    unsigned tag = cqe->wr_id & WR_TAG_MASK;
    uint64_t val = cqe->wr_id & ~(uint64_t)WR_TAG_MASK;

    if (conn->state == EXS_CONN_DEAD)
        return;
    conn->cqe_stamp++;
    if (EXS_UNLIKELY(cqe->wr_id == EXS_QUIET_WR_ID)) {
        /* an unsignaled write failed or was flushed: its op finished at post, nothing
         * waits for it (not in wr_out); it fails the conn as any write does (§6.4) */
        EXS_PROTO_CNT_INC(conn, unsignaled_failed);
        if (conn->quiet_live)
            conn->quiet_live--;
    } else {
        conn->wr_out--;
    }
    if (cqe->status != EXS_PROV_WC_SUCCESS) {
        if (cqe->status == EXS_PROV_WC_RNR_RETRY_EXC_ERR) {
            /* the credits make it impossible (§3.1): a peer or library bug */
            conn->stats.rnr_events++;
            EXS_PROTO_CNT_INC(conn, rnr_events);
        }
        if (cqe->status != EXS_PROV_WC_WR_FLUSH_ERR)
            EXS_WARN(PROTO, "conn %p: work request failed: %s", (void *)conn,
                     exs__prov_wc_status_str(cqe->status));
        if (tag == WR_TAG_READ)
            conn->reads--;
        if (tag == WR_TAG_DATA || tag == WR_TAG_RING || tag == WR_TAG_READ) {
            /* the op is alive: none is handed back while a work request of its own is
             * outstanding; a cancelled one completes with its last one */
            struct exs_op *op = (struct exs_op *)(uintptr_t)val;

            EXS_ASSERT(op->inflight > 0 && op->state == EXS_OPS_POSTED);
            if (--op->inflight == 0 && op->cancel && conn->state >= EXS_CONN_DOWN)
                exs__conn_op_finish_locked(op, -1, ECANCELED);
        } else if (tag == WR_TAG_BATCH) {
            exs__batch_on_cqe_locked(conn, (uint32_t)(val >> 3), 0);
        }
        if (cqe->status == EXS_PROV_WC_WR_FLUSH_ERR && conn->state == EXS_CONN_CONNECTED &&
            conn->sess_token && !conn->resume.over)
            return; /* a consequence: the endpoint's DISCONNECTED, which follows, says
                     * whether the path failed or the peer closed (§9.2, When) */
        if (exs__resume_begin_locked(conn, "error completion", 0, 0)) {
            if (tag == WR_TAG_RX) /* what arrived is a prefix (§9.2, Positions) */
                conn->resume.rx_gap = 1;
            return; /* cut over (§9.2): the op is sent again over the new path */
        }
        /* while connecting, the cm event tells what happened */
        if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING)
            exs__conn_fail_locked(conn, ECONNRESET, "work request failed");
        return;
    }
    /* the peer answered: keepalive has nothing to probe this interval (§9.1). With
     * feature ALIVE only a receive counts (the peer's library posted it); without it any
     * completion does (a send the peer's NIC acknowledged). A flag, no clock read: the
     * keepalive timer's next look turns it into a time (conn_ka_check_locked) */
    if (tag == WR_TAG_RX || !exs__conn_ka_alive(conn))
        conn->keepalive.heard = 1;
    switch (tag) {
    case WR_TAG_RX:
        if (EXS_UNLIKELY(conn->resume.rx_gap))
            break;             /* behind a receive that failed: not arrived (§9.2, Positions) */
        conn->quiet_armed = 1; /* an answer: the next small send may go unsignaled (§6.4) */
        conn_on_rx_locked(conn, cqe, (uint32_t)(val >> 3));
        break;
    case WR_TAG_QUIET: /* the drain's fence on an endpoint not yet in ERROR */
        break;
    case WR_TAG_CTRL: {
        uint32_t slot = (uint32_t)(val >> 3);
        struct exs_ctrl_tx tx = conn->tx_op[slot];

        conn->tx_op[slot] = (struct exs_ctrl_tx){0};
        conn->tx_free[conn->tx_free_top++] = slot;
        conn_rtt_sample_locked(conn, tx.t_us);
        if (tx.op)
            exs__conn_op_finish_locked(tx.op, 0, 0);
        if (tx.shut) {
            exs__conn_set_txshut_locked(conn, EXS_TXSHUT_DONE, "control send completed");
            if (conn->state == EXS_CONN_CLOSING) {
                exs__conn_set_state_locked(conn, EXS_CONN_DOWN, "closed");
                exs__prov_disconnect(conn->ep);
            }
        }
        break;
    }
    case WR_TAG_BATCH:
        conn->tx_moved++;
        exs__batch_on_cqe_locked(conn, (uint32_t)(val >> 3), 1);
        break;
    case WR_TAG_KA:
        conn->keepalive.probe_out = 0;
        break;
    case WR_TAG_RING:
        conn->ring_wr_out--;
        /* fall through */
    case WR_TAG_DATA: {
        struct exs_op *op = (struct exs_op *)(uintptr_t)val;

        conn->tx_moved++;
        /* writes of one op complete in order: the op is done with its last one (a
         * cancelled one from DOWN on, when no more of it will be posted) */
        EXS_ASSERT(op->inflight > 0 && op->state == EXS_OPS_POSTED);
        if (--op->inflight == 0 && op->posted == op->len) {
            exs__conn_send_done_locked(conn, op);
        } else if (!op->inflight && op->cancel && conn->state >= EXS_CONN_DOWN) {
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
        break;
    }
    case WR_TAG_READ:
        conn->reads--;
        conn->dp->on_read_cqe(conn, (struct exs_op *)(uintptr_t)val); /* only SEQPACKET reads */
        break;
    default:
        exs__conn_fail_locked(conn, ECONNRESET, "unknown completion");
        break;
    }
}

/* A completion from the provider: a send work request leaves the cap's count. */
static inline void conn_on_prov_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    if (cqe->opcode == EXS_PROV_WC_GRANT && !cqe->wr_id && cqe->status == EXS_PROV_WC_SUCCESS)
        return; /* a held op's grant may end now: the pass after this run delivers it */
    if (conn->resume.pend && exs__resume_pend_cqe_locked(conn, cqe))
        return; /* a resume request's new path, on trial (§9.2) */
    /* a signaled send request completed: the unsignaled ones before it are retired, so
     * with none outstanding only those posted after the last one hold slots (§6.4) */
    if ((cqe->wr_id & WR_TAG_MASK) != WR_TAG_RX && cqe->wr_id != EXS_QUIET_WR_ID && conn->sq_out &&
        !--conn->sq_out)
        conn->quiet_live = conn->quiet_run;
    exs__conn_on_cqe_locked(conn, cqe);
}

/* A completion whose run may take the send side's pass alone (spec/proto-layout.md, "A
 * run of send completions"): a data write (DATA, RING, BATCH) that succeeded. It finishes
 * send ops (delivery), frees ring writes in flight and batch slots (the send side), and
 * changes no input of the receive side, the keepalive answer or the control flush:
 * credits, control slots, owed credits and ring positions move only with receives,
 * control sends and the application's receives, which all kick in full. */
static int conn_cqe_tx_only(const struct exs_prov_cqe *cqe)
{
    const unsigned tx = 1u << WR_TAG_DATA | 1u << WR_TAG_RING | 1u << WR_TAG_BATCH;

    return (tx >> (cqe->wr_id & WR_TAG_MASK) & 1u) && cqe->status == EXS_PROV_WC_SUCCESS &&
           cqe->opcode != EXS_PROV_WC_GRANT;
}

/* exs__conn_kick_locked on a CONNECTED or CLOSING conn whose run's last receive (slot)
 * is not re-posted yet: the receive side and delivery first (the application's event,
 * which a thread other than the driver may take at once), then the re-post (owed from
 * now on; a failure resets the conn), then the send side, the keepalive answer and the
 * ACK decision with that credit owed, as when the re-post went first, and delivery of
 * what the send side finished. */
static void conn_kick_event_first_locked(struct exs_conn *conn, uint32_t slot)
{
    conn->dp->recv_progress(conn);
    exs__conn_deliver_locked(conn);
    conn_rx_repost_locked(conn, slot);
    if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) {
        conn->dp->send_progress(conn);
        exs__conn_ka_answer_locked(conn);
        exs__conn_ctrl_flush_locked(conn);
    }
    exs__conn_deliver_locked(conn);
}

/* After a run of completions of conn: queued work requests into the room they made,
 * progress once (the send side's alone after a run of data writes only, tx_only), and
 * the end once drained. The run's last receive (rx_defer) is re-posted inside that
 * progress, after its event (conn_kick_event_first_locked). */
static void conn_after_cqes_locked(struct exs_conn *conn, int tx_only)
{
    uint32_t rx_defer = conn->rx_defer; /* the run's last receive, not re-posted yet */

    conn->rx_defer = 0;
    if (conn->wrq_count) {
        if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING)
            exs__conn_wrq_post_locked(conn);
        if ((conn->state >= EXS_CONN_DOWN && conn->state != EXS_CONN_DEAD) ||
            conn->state == EXS_CONN_RESUMING)
            exs__conn_wrq_flush_locked(conn);
    }
    if (exs__conn_rows[conn->state].after_cqes) { /* RESUMING: the old path drained */
        exs__conn_rows[conn->state].after_cqes(conn);
        if (conn->state == EXS_CONN_DEAD)
            return;
    }
    if (rx_defer && (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) &&
        !conn->resume.pend && !conn->resume.peer_wait) {
        conn_kick_event_first_locked(conn, rx_defer - 1);
    } else {
        if (rx_defer) /* a cut-over began meanwhile: re-posted before the kick, as before */
            conn_rx_repost_locked(conn, rx_defer - 1);
        /* (a resume request on trial or a new path's wait for RESUME take the full
         * kick: exs__conn_kick_tx_locked falls back to it off CONNECTED) */
        if (conn->state != EXS_CONN_DEAD && tx_only && !conn->resume.pend) {
            conn->kicks_tx++;
            exs__conn_kick_tx_locked(conn);
        } else if (conn->state != EXS_CONN_DEAD) {
            exs__conn_kick_locked(conn);
        }
    }
    if (conn->state == EXS_CONN_DRAINING && !conn->wr_out) {
        /* the last completion before the end: every byte that arrived was seen */
        exs__conn_dead_locked(conn, conn->disc_err, "drained");
        conn->cb->dead(conn);
    }
}

void exs__conn_on_cqe(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    conn_on_prov_cqe_locked(conn, cqe);
    conn_after_cqes_locked(conn, conn_cqe_tx_only(cqe));
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_on_cqes(const struct exs_prov_cqe *cqe, int n)
{
    for (int i = 0, j; i < n; i = j) {
        struct exs_conn *conn = cqe[i].ep->user;

        /* a run of completions of one conn: one lock, one progress pass (one ACK
         * decision, one walk of the queues, one delivery) for all of them */
        int tx_only = 1;

        EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
        for (j = i; j < n && cqe[j].ep->user == conn; j++) {
            if (tx_only)
                tx_only = conn_cqe_tx_only(&cqe[j]);
            conn_on_prov_cqe_locked(conn, &cqe[j]);
        }
        conn_after_cqes_locked(conn, tx_only);
        EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    }
    exs__resume_evict_run(); /* connections a cut made give up (§9.2, The wait) */
}

void exs__conn_on_cm(struct exs_conn *conn, const struct exs_prov_cm_event *ev)
{
    void (*established)(struct exs_conn *, int) = NULL;
    void (*dead)(struct exs_conn *) = NULL;
    int err = 0;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    if (conn->resume.pend && exs__resume_pend_cm_locked(conn, ev)) {
        EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN); /* a resume request's new path (§9.2) */
        return;
    }
    if (exs__conn_rows[conn->state].on_cm) { /* RESUMING: the cut-over's events (§9.2) */
        exs__conn_rows[conn->state].on_cm(conn, ev);
        EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        exs__resume_evict_run();
        return;
    }
    if (ev->ep && ev->ep != conn->ep) { /* an endpoint the conn no longer has */
        EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        return;
    }
    switch (ev->type) {
    case EXS_PROV_CM_ESTABLISHED:
        if (conn->state != EXS_CONN_CONNECTING)
            break;
        if (conn->active) {
            if (exs__conn_hello_check(ev->private_data, ev->private_data_len, conn->p.sock_type)) {
                exs__conn_set_state_locked(conn, EXS_CONN_REFUSING, "bad hello from acceptor");
                exs__prov_disconnect(conn->ep);
                break;
            }
            exs__conn_adopt_hello_locked(conn, ev->private_data);
        }
        exs__conn_set_state_locked(conn, EXS_CONN_CONNECTED, "established");
        conn->keepalive.heard_ns = exs__now_ns(); /* the peer just answered */
        established = conn->cb->established;
        exs__conn_ring_grant_locked(conn);
        exs__resume_established_locked(conn);
        exs__shmsw_established_locked(conn);
        exs__conn_kick_locked(conn);
        break;
    case EXS_PROV_CM_REJECTED:
    case EXS_PROV_CM_UNREACHABLE:
        err = ev->type == EXS_PROV_CM_REJECTED ? ECONNREFUSED
              : ev->status                     ? -ev->status
                                               : ECONNREFUSED;
        switch (conn->state) {
        case EXS_CONN_CONNECTING:
            exs__conn_dead_locked(conn, err, "connect failed");
            established = conn->cb->established;
            break;
        case EXS_CONN_REFUSING:
            exs__conn_dead_locked(conn, ECONNREFUSED, "refused");
            established = conn->cb->established;
            err = ECONNREFUSED;
            break;
        case EXS_CONN_DOWN: /* closed while connecting */
            exs__conn_dead_locked(conn, err, "connect failed after close");
            dead = conn->cb->dead;
            break;
        default:
            break;
        }
        break;
    case EXS_PROV_CM_DISCONNECTED:
        switch (conn->state) {
        case EXS_CONN_CONNECTING:
        case EXS_CONN_REFUSING:
            err = ECONNREFUSED;
            exs__conn_dead_locked(conn, err, "refused");
            established = conn->cb->established;
            break;
        case EXS_CONN_CONNECTED:
        case EXS_CONN_CLOSING:
        case EXS_CONN_DOWN:
            /* Completions of what arrived before the end may still be on their way (a
             * connection event can overtake them on verbs): the conn dies once every work
             * request it posted has completed (flushed, at the latest). */
            err = ev->status ? -ev->status : ECONNRESET;
            /* a peer that closed its endpoint ended the connection: not a path failure,
             * never cut over (§9.2, When) */
            if (!(ev->flags & EXS_PROV_CM_F_PEER_CLOSED) &&
                exs__resume_begin_locked(conn, "disconnected", 1, 0)) {
                exs__resume_progress_locked(conn);
                break; /* cut over (§9.2) */
            }
            exs__conn_set_state_locked(conn, EXS_CONN_DRAINING, "disconnected");
            conn->disc_err = err;
            exs__conn_quiet_fence_locked(conn); /* behind unsignaled writes (§6.4) */
            exs__conn_wrq_flush_locked(conn);   /* never posted: flushed here */
            if (!conn->wr_out) {
                exs__conn_dead_locked(conn, err, "drained");
                dead = conn->cb->dead;
            }
            break;
        default: /* IDLE, DRAINING, DEAD: nothing (more) to end */
            break;
        }
        break;
    default:
        break;
    }
    if (established)
        established(conn, err);
    if (dead)
        dead(conn);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    exs__resume_evict_run(); /* those a cut made give up (§9.2, The wait) */
}

void exs__conn_on_rx_held_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    conn_on_rx_locked(conn, cqe, (uint32_t)((cqe->wr_id & ~(uint64_t)WR_TAG_MASK) >> 3));
}
