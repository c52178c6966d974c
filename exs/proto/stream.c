/* SPDX-License-Identifier: MIT */
/* SOCK_STREAM data path (spec/protocol.md §7): the UNH EXS dynamic choice between direct
 * writes into advertised receives and indirect writes into the hidden ring. Layer 2 of
 * spec/proto-layout.md; the ring's autotuning is in stream_ring.c. */
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* ---- sending side (Fig. 2) ---- */

/* Time of the sender's current phase goes to its bucket (direct_time_us, indirect_time_us). */
static void st_phase_clock(struct exs_conn *conn, struct exs_sock_stats *st, uint64_t now)
{
    if (!conn->stream.phase_t0 || now < conn->stream.phase_t0)
        return;
    if (PHASE_IS_DIRECT(conn->stream.ps))
        st->direct_time_us += now - conn->stream.phase_t0;
    else
        st->indirect_time_us += now - conn->stream.phase_t0;
}

static void st_set_phase(struct exs_conn *conn, uint32_t p)
{
    if (PHASE_IS_DIRECT(p) != PHASE_IS_DIRECT(conn->stream.ps)) {
        uint64_t now = exs__now_us();

        conn->stats.mode_switches++;
        st_phase_clock(conn, &conn->stats, now);
        if (PHASE_IS_DIRECT(p) && conn->stream.linger_skip)
            conn->stream.linger_skip--; /* §7 linger: one more direct phase without it */
        if (conn->stream.phase_t0)
            conn->stream.phase_t0 = now;
    }
    EXS_TRACE(PROTO, "conn %p: sender phase %u -> %u", (void *)conn, conn->stream.ps, p);
    if (p != conn->stream.ps)
        conn->stream.held = 0; /* a DRAIN holds the ring only in the phase it named */
    conn->stream.ps = p;
}

void exs__stream_stats_locked(struct exs_conn *conn, struct exs_sock_stats *st)
{
    st_phase_clock(conn, st, exs__now_us());
    st->ring_fill = conn->rd_arrived - conn->rd_consumed;
}

void exs__stream_enter_indirect_locked(struct exs_conn *conn)
{
    st_set_phase(conn, conn->stream.ps + 1);
}

/* Modes seen by this sender: may it write the ring, may it use ADVERTs? */
static int st_may_indirect(const struct exs_conn *conn)
{
    /* a direct-only sender facing an indirect-only receiver would wait forever; after a
     * DRAIN (§7.2) new data waits for ADVERTs */
    return (conn->p.xfer_mode != EXS_XFER_DIRECT_ONLY ||
            conn->peer.xfer_mode == EXS_XFER_INDIRECT_ONLY) &&
           !conn->stream.held && !conn->autotune.owed; /* §7.4: the peer's new region first */
}

/* §7 sender step 2, the linger: in a direct phase the sender writes the ring only once
 * no write of its sends is in flight. An ADVERT for a receive that one of those writes
 * fills is usually on its way (the receiver advertises what the application posts as
 * receives complete), so a gap in q_A no longer ends the direct phase; the wait ends with
 * the last completion, which runs the send path again. Only while the sends waiting are
 * no more than those in flight: the writes in flight of a direct phase stand for the
 * receives the peer has out, and more sends than receives make the ADVERTs the pace (over
 * a long link a round trip per linger) where the ring would not be. A linger that no
 * ADVERT ended skips the linger in the next 1, 2, 4 ... direct phases; one that an ADVERT
 * ended resets that. 1: wait. */
static int st_ring_deferred(struct exs_conn *conn)
{
    const struct exs_list *pos;
    uint32_t in = 0, wait = 0, seen = 0;

    if (PHASE_IS_INDIRECT(conn->stream.ps) || !exs__params.stream_direct_linger ||
        conn->stream.linger_skip)
        return 0;
    exs_list_for_each(pos, &conn->sendq)
    {
        const struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (++seen > EXS_STREAM_LINGER_OPS_MAX)
            return 0; /* a long queue: the ring it is */
        in += op->inflight > 0;
        wait += op->kind == EXS_OP_SEND && op->state != EXS_OPS_DONE && op->posted < op->len;
    }
    if (in && wait <= in) {
        conn->stream.lingering = 1;
        return 1;
    }
    if (conn->stream.lingering && !in) { /* every write completed, no ADVERT came */
        conn->stream.linger_pen =
            EXS_MIN(EXS_MAX(conn->stream.linger_pen * 2, 1u), EXS_STREAM_LINGER_SKIP_MAX);
        conn->stream.linger_skip = conn->stream.linger_pen;
    }
    conn->stream.lingering = 0;
    return 0;
}

/* st_advert_head when ADVERTs are held. */
static struct exs_advert *st_advert_head_held(struct exs_conn *conn)
{
    while (conn->adv_count) {
        struct exs_advert *a = &conn->adverts[conn->adv_head];

        if (PHASE_IS_INDIRECT(conn->stream.ps) &&
            (a->phase < conn->stream.ps || a->seq < conn->tx_seq)) {
            /* stale: its receive is being filled from the ring */
            if (conn->stream.ps < a->phase)
                st_set_phase(conn, a->phase + 1);
            conn->adv_head = (conn->adv_head + 1) % conn->adv_cap;
            conn->adv_count--;
            conn->stats.adverts_discarded++;
            continue;
        }
        return a;
    }
    return NULL;
}

/* The usable ADVERT at the head of q_A after dropping stale ones, or NULL (none held: no
 * call, asked at every STREAM post). */
static inline struct exs_advert *st_advert_head(struct exs_conn *conn)
{
    return conn->adv_count ? st_advert_head_held(conn) : NULL;
}

/* Put bytes of send op on the wire: one WWI per call. 1 when something went, 0 when
 * the op must wait (credit, ADVERT or ring space). */

static int st_send_some_locked(struct exs_conn *conn, struct exs_op *op)
{
    size_t left = op->len - op->posted;
    struct exs_advert *a;
    uint32_t imm, lw;

    if (!conn->stream.phase_t0)
        conn->stream.phase_t0 = exs__now_us(); /* phase times count from the first send */
    if (!exs__conn_can_spend_locked(conn)) {
        conn->stats.credit_stalls++;
        return 0;
    }
    /* a traced send's TRACE request goes before its first byte (§5.1) */
    if (EXS_REQTRACE_ON && op->rt && !op->posted && !exs__reqtrace_wire_begin_locked(conn, op))
        return 0;
    /* control records queued earlier (SHUTDOWN, TRACE) keep their place */
    if (conn->ctrl_len && !exs__conn_ctrl_flush_locked(conn))
        return 0;
    if (!exs__conn_can_spend_locked(conn))
        return 0;

    a = st_advert_head(conn);
    if (a) {
        if (conn->stream.lingering) { /* §7 linger: the ADVERT came */
            conn->stream.lingering = 0;
            conn->stream.linger_pen = 0;
        }
        if (PHASE_IS_INDIRECT(conn->stream.ps))
            st_set_phase(conn, a->phase); /* direct again */
        lw = (uint32_t)EXS_MIN(left, (size_t)(a->len - a->filled));
        if (a->flags & EXS_ADVERT_WAITALL) /* filled piece by piece anyway (§6.2) */
            lw = EXS_MIN(lw, exs__conn_frag_size());
        imm = exs_imm_make(EXS_IMM_DIRECT, 0, exs__conn_take_owed_imm_locked(conn), a->id);
        if (exs__conn_post_write_imm_locked(conn, op, a->addr + a->filled, a->rkey, lw, imm,
                                            op->buf + op->posted))
            return 0;
        EXS_TRACE(PROTO, "conn %p: direct %u bytes at %llu into advert %u", (void *)conn, lw,
                  (unsigned long long)conn->tx_seq, a->id);
        a->filled += lw;
        if (!(a->flags & EXS_ADVERT_WAITALL) || a->filled == a->len) {
            conn->adv_head = (conn->adv_head + 1) % conn->adv_cap;
            conn->adv_count--;
        }
        conn->stats.direct_xfers++;
    } else {
        uint32_t size = conn->peer.ring_size;
        uint64_t used = conn->wr_tail - conn->wr_consumed;
        uint32_t off;

        /* nothing goes into the peer's ring before its key (RING record) arrived */
        if (!st_may_indirect(conn) || !size || !conn->peer_ring_keyed || used >= size ||
            st_ring_deferred(conn))
            return 0;
        off = (uint32_t)exs__pos_mod(conn->wr_tail, size);
        if (PHASE_IS_DIRECT(conn->stream.ps))
            st_set_phase(conn, conn->stream.ps + 1); /* now indirect */
        lw = (uint32_t)EXS_MIN(left, (size_t)EXS_MIN(size - used, (uint64_t)(size - off)));
        lw = EXS_MIN(lw, exs__stream_ring_piece_max(conn)); /* §6.2, §7.4 */
        imm = exs_imm_make(EXS_IMM_INDIRECT, 0, exs__conn_take_owed_imm_locked(conn), 0);
        if (exs__conn_post_write_imm_locked(conn, op, conn->peer.ring_addr + off,
                                            conn->peer.ring_rkey, lw, imm, op->buf + op->posted))
            return 0;
        EXS_TRACE(PROTO, "conn %p: indirect %u bytes at %llu, ring offset %u", (void *)conn, lw,
                  (unsigned long long)conn->tx_seq, off);
        conn->wr_tail += lw;
        conn->stats.indirect_xfers++;
    }
    conn->tx_seq += lw;
    op->posted += lw;
    op->inflight++;
    exs__conn_quiet_check_locked(conn, op); /* unsignaled: done now (§6.4) */
    return 1;
}

/* batch_fit_fn (§7.1): a send joins the run when it has not started, would go into the
 * ring (no usable ADVERT) and the run with it fits the ring room before the ring's end. */
static int st_batch_fit(struct exs_conn *conn, struct exs_op *op, uint64_t bytes, uint32_t *rec_p)
{
    uint32_t size = conn->peer.ring_size;
    uint64_t used = conn->wr_tail - conn->wr_consumed, room;

    if (op->kind != EXS_OP_SEND || op->posted || op->inflight || !op->len || op->rt ||
        (op->state != EXS_OPS_QUEUED && op->state != EXS_OPS_POSTED))
        return 0;
    if (!st_may_indirect(conn) || !size || !conn->peer_ring_keyed || st_advert_head(conn) ||
        st_ring_deferred(conn))
        return 0;
    room = used >= size ? 0 : EXS_MIN(size - used, size - exs__pos_mod(conn->wr_tail, size));
    if (bytes + op->len > room)
        return -1;
    *rec_p = op->len > UINT32_MAX ? UINT32_MAX : (uint32_t)op->len;
    return 1;
}

/* The sender's STOPPED answer to a DRAIN (§7.2): its ring writes of the phase end at S_s. */
static int st_drain_answer_locked(struct exs_conn *conn)
{
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_DRAIN_LEN) && !exs__conn_ctrl_flush_locked(conn))
        return 0;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_DRAIN_LEN))
        return 0;
    struct exs_wire_drain d = {
        .hdr = {.type = EXS_CTRL_DRAIN,
                .flags = EXS_DRAIN_STOPPED,
                .len = htobe16(EXS_WIRE_DRAIN_LEN)},
        .pos = htobe64(conn->tx_seq),
        .phase = htobe32(conn->stream.ps),
    };
    exs__conn_ctrl_append_locked(conn, &d, sizeof(d));
    conn->stream.drain_owed = 0;
    EXS_TRACE(PROTO, "conn %p: ring writes of phase %u stop at %llu", (void *)conn, conn->stream.ps,
              (unsigned long long)conn->tx_seq);
    return 1;
}

/* The writer's SWITCHED answer to a RESIZE offer (§7.4): ring positions from wr_tail on
 * go into the offered region. Every later ring write flushes the control records first,
 * so the answer reaches the peer before them. 1 when appended. */
static int st_resize_answer_locked(struct exs_conn *conn)
{
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_RESIZE_LEN) &&
        !exs__conn_ctrl_flush_locked(conn))
        return 0;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_RESIZE_LEN))
        return 0;
    struct exs_wire_resize r = {
        .hdr = {.type = EXS_CTRL_RESIZE,
                .flags = EXS_RESIZE_SWITCHED,
                .len = htobe16(EXS_WIRE_RESIZE_LEN)},
        .size = htobe32(conn->autotune.peer_size),
        .pos = htobe64(conn->wr_tail),
    };
    exs__conn_ctrl_append_locked(conn, &r, sizeof(r));
    EXS_TRACE(PROTO, "conn %p: peer ring %u -> %u bytes at ring position %llu", (void *)conn,
              conn->peer.ring_size, conn->autotune.peer_size, (unsigned long long)conn->wr_tail);
    if (!conn->autotune.peer_init)
        conn->autotune.peer_init = conn->peer.ring_size;
    conn->peer.ring_addr = conn->autotune.peer_addr;
    conn->peer.ring_size = conn->autotune.peer_size;
    conn->peer.ring_rkey = conn->autotune.peer_rkey;
    conn->autotune.owed = 0;
    return 1;
}

void exs__stream_send_progress_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    if (conn->stream.drain_owed && !st_drain_answer_locked(conn))
        return; /* nothing else leaves before it */
    if (conn->autotune.owed && !st_resize_answer_locked(conn))
        return; /* no ring write before it; the rest waits for the same room */
    exs__stage_refill_locked(conn);
    /* from the first op that may still need sending: a window of sends posted whole
     * (their writes in flight) is not walked again at every pass */
    for (pos = conn->sendq_settled ? conn->sendq_settled->link.next : conn->sendq.next;
         pos != &conn->sendq; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE ||
            (op->kind == EXS_OP_SEND && op->posted == op->len && op->state == EXS_OPS_POSTED)) {
            if (pos->prev == (conn->sendq_settled ? &conn->sendq_settled->link : &conn->sendq))
                conn->sendq_settled = op; /* settled, and all before it */
            continue;
        }
        if (op->kind == EXS_OP_SHUTDOWN) {
            if (op->state != EXS_OPS_QUEUED)
                continue;
            if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN) &&
                !exs__conn_ctrl_flush_locked(conn))
                return;
            exs__conn_shutdown_record_locked(conn, op);
            op->state = EXS_OPS_POSTED;
            exs__conn_ctrl_flush_locked(conn);
            continue;
        }
        if (op->posted == 0 && op->inflight == 0 && op->len) {
            /* the send buffer's newest copy gathers while a ring write is in flight
             * (§7.5) unless an ADVERT takes it now */
            if (exs__stage_hold_locked(conn, op) && !st_advert_head(conn))
                return;
            switch (exs__batch_try_locked(conn, pos, st_batch_fit)) {
            case BATCH_SENT:
                continue; /* the run's ops are POSTED now: skipped below */
            case BATCH_WAIT:
            case BATCH_STALL:
                return;
            case BATCH_NONE:
                break;
            }
        }
        op->state = EXS_OPS_POSTED;
        if (op->len == 0) {
            exs__conn_op_finish_locked(op, 0, 0); /* nothing to send */
            continue;
        }
        while (op->posted < op->len && conn->state < EXS_CONN_DOWN)
            if (!st_send_some_locked(conn, op))
                return;
        if (conn->state >= EXS_CONN_DOWN)
            return;
    }
}

int exs__stream_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a)
{
    /* Lemma 1: every ADVERT carries a direct phase */
    if (PHASE_IS_INDIRECT(a->phase) || !a->len)
        return exs__proto_violation(conn, EXS_PV_ADVERT, EXS_CTRL_ADVERT, "phase %u, %u bytes",
                                    a->phase, a->len);
    /* ADVERTs of a phase before an indirect sender's are stale whatever comes next (step 1
     * drops them, with no phase change): drop them as new ones arrive, so that a sender
     * that sends nothing holds only the receives the peer has out (ADVERTS_MAX, §7) */
    while (conn->adv_count && PHASE_IS_INDIRECT(conn->stream.ps) &&
           conn->adverts[conn->adv_head].phase < conn->stream.ps) {
        conn->adv_head = (conn->adv_head + 1) % conn->adv_cap;
        conn->adv_count--;
        conn->stats.adverts_discarded++;
    }
    return exs__advert_push_locked(conn, a);
}

/* A DRAIN record (§7.2), either direction; hostile until checked. */
int exs__stream_on_drain_locked(struct exs_conn *conn, const struct exs_wire_drain *d)
{
    uint64_t pos = be64toh(d->pos);
    uint32_t phase = be32toh(d->phase);

    if (d->reserved || (d->hdr.flags & ~EXS_DRAIN_STOPPED))
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_DRAIN,
                                    "flags %#x, reserved %#x", d->hdr.flags, be32toh(d->reserved));
    if (d->hdr.flags & EXS_DRAIN_STOPPED) {
        /* we asked in this phase; the sender cannot have stopped before bytes we hold */
        if (conn->stream.drain != EXS_STREAM_DRAIN_REQUESTED || phase != conn->stream.pr ||
            pos < conn->rx_seq + (conn->rd_arrived - conn->rd_consumed))
            return exs__proto_violation(conn, EXS_PV_DRAIN, EXS_CTRL_DRAIN,
                                        "STOPPED at %llu phase %u answers no request (state %d, "
                                        "phase %u)",
                                        (unsigned long long)pos, phase, conn->stream.drain,
                                        conn->stream.pr);
        conn->stream.drain = EXS_STREAM_DRAIN_STOPPED;
        conn->stream.drain_pos = pos;
        return 0;
    }
    /* a request: drop the ADVERTs that came before it, then we must be in its indirect
     * phase (the receiver sends no ADVERT of a later phase before our answer), and it
     * cannot have seen bytes we never sent */
    (void)st_advert_head(conn);
    if (PHASE_IS_DIRECT(phase) || phase != conn->stream.ps || pos > conn->tx_seq ||
        conn->stream.held)
        return exs__proto_violation(conn, EXS_PV_DRAIN, EXS_CTRL_DRAIN,
                                    "request at %llu phase %u in phase %u at %llu (held %d)",
                                    (unsigned long long)pos, phase, conn->stream.ps,
                                    (unsigned long long)conn->tx_seq, conn->stream.held);
    conn->stream.held = 1;
    conn->stream.drain_owed = 1;
    conn->stats.drain_requests++;
    return 0;
}

/* ---- ring autotuning (§7.4) ---- */

/* ---- receiving side (Fig. 3, 4, 5) ---- */

static void st_recv_filled_locked(struct exs_conn *conn, struct exs_op *op, size_t n)
{
    op->filled += n;
    conn->rx_seq += n; /* S_r */
    conn->stats.bytes_received += n;
    if (EXS_REQTRACE_ON && conn->rt)
        exs__reqtrace_stream_placed_locked(conn);
    if (!(op->flags & MSG_WAITALL) || op->filled == op->len)
        exs__conn_op_finish_locked(op, (ssize_t)op->filled, 0);
}

/* §7.2 backoff: did the direct phase that a drain began pay for the drain? It must have
 * carried EXS_STREAM_DRAIN_WORTH ring sizes and lasted EXS_STREAM_DRAIN_WORTH round trips (the
 * drain held the ring for about one: over a long link a phase of one round trip's
 * ADVERTs does not pay, however many bytes it carried). */
static int st_drain_paid(const struct exs_conn *conn)
{
    uint64_t now = exs__now_us();

    return conn->stream.drain_bytes >= (uint64_t)EXS_STREAM_DRAIN_WORTH * conn->p.ring_size &&
           now - conn->stream.drain_t0 >= (uint64_t)EXS_STREAM_DRAIN_WORTH * conn->autotune.rtt_min;
}

int exs__stream_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len)
{
    if (conn->peer_shut)
        return exs__proto_violation(conn, EXS_PV_DATA_AFTER_SHUTDOWN, EXS_PV_REC_WRITE,
                                    "immediate %#x, %u bytes", imm, len);
    if (exs_imm_kind(imm) == EXS_IMM_INDIRECT) {
        /* Fig. 4: an indirect transfer starts (or continues) an indirect phase */
        if (conn->rd_arrived + len - conn->rd_consumed > conn->p.ring_size)
            return exs__proto_violation(
                conn, EXS_PV_RING_OVERRUN, EXS_PV_REC_WRITE, "%u bytes, %llu of %u free", len,
                (unsigned long long)(conn->p.ring_size - (conn->rd_arrived - conn->rd_consumed)),
                conn->p.ring_size);
        if (conn->stream.drain == EXS_STREAM_DRAIN_STOPPED &&
            conn->rx_seq + (conn->rd_arrived - conn->rd_consumed) + len > conn->stream.drain_pos)
            return exs__proto_violation(conn, EXS_PV_RING_OVERRUN, EXS_PV_REC_WRITE,
                                        "%u bytes past the stop at %llu", len,
                                        (unsigned long long)conn->stream.drain_pos);
        if (PHASE_IS_DIRECT(conn->stream.pr)) {
            conn->stream.pr++;
            if (conn->stream.drain_dir) { /* §7.2 backoff: was the drain worth it? */
                uint64_t base = EXS_MAX(exs__params.stream_drain_streak, (uint64_t)1);

                if (!st_drain_paid(conn)) {
                    conn->stream.drain_need =
                        (uint32_t)EXS_MIN(EXS_MAX((uint64_t)conn->stream.drain_need, base) * 2,
                                          (uint64_t)EXS_STREAM_DRAIN_NEED_MAX);
                    /* and in time: need x EXS_STREAM_DRAIN_WORTH round trips without one */
                    conn->stream.drain_hold = exs__now_us() + (uint64_t)conn->stream.drain_need *
                                                                  EXS_STREAM_DRAIN_WORTH *
                                                                  conn->autotune.rtt_min;
                } else {
                    conn->stream.drain_need =
                        (uint32_t)EXS_MIN(base, (uint64_t)EXS_STREAM_DRAIN_NEED_MAX);
                    conn->stream.drain_hold = 0;
                }
                conn->stream.drain_dir = 0;
            }
        }
        conn->rd_arrived += len;
        conn->autotune.win_bytes += len; /* autotuning's measure (§7.4) */
        return 0;
    }
    if (exs_imm_kind(imm) != EXS_IMM_DIRECT)
        return exs__proto_violation(conn, EXS_PV_IMM_KIND, EXS_PV_REC_WRITE, "immediate %#x", imm);
    /* the safety theorem: a direct transfer fills the head receive's ADVERT */
    struct exs_op *op = exs__stream_head_recv(conn);
    if (!op || op->state != EXS_OPS_ADVERTISED || conn->rd_arrived != conn->rd_consumed ||
        op->phase != conn->stream.pr || (op->advert_id & EXS_IMM_TAG_MASK) != exs_imm_tag(imm) ||
        len > op->len - op->filled || !len)
        return exs__proto_violation(conn, EXS_PV_DIRECT, EXS_PV_REC_WRITE,
                                    "%u bytes, tag %u, phase %u: the head receive %s", len,
                                    exs_imm_tag(imm), conn->stream.pr,
                                    !op                                     ? "missing"
                                    : op->state != EXS_OPS_ADVERTISED       ? "not advertised"
                                    : conn->rd_arrived != conn->rd_consumed ? "behind ring bytes"
                                                                            : "does not match");
    if (!(op->flags & MSG_WAITALL))
        conn->stream.sr_next += len - 1;
    if (conn->stream.drain_dir)
        conn->stream.drain_bytes += len;
    st_recv_filled_locked(conn, op, len);
    return 0;
}

/* Fig. 5: copy ring bytes into the head receives while both are there. */
static void st_copy_out_locked(struct exs_conn *conn)
{
    struct exs_op *op;

    while (conn->rd_arrived != conn->rd_consumed && (op = exs__stream_head_recv(conn))) {
        uint64_t avail = conn->rd_arrived - conn->rd_consumed, contig;
        size_t lc = (size_t)EXS_MIN(avail, (uint64_t)(op->len - op->filled));

        /* in pieces: at the ring's end, and where a retired region ends (§7.4) */
        for (size_t done = 0, n; done < lc; done += n) {
            const uint8_t *src = exs__stream_ring_at(conn, conn->rd_consumed + done, &contig);

            n = (size_t)EXS_MIN((uint64_t)(lc - done), contig);
            memcpy(op->buf + op->filled + done, src, n);
        }
        conn->rd_consumed += lc;
        if (op->state == EXS_OPS_ADVERTISED && !(op->flags & MSG_WAITALL))
            conn->stream.sr_next += lc - 1;
        st_recv_filled_locked(conn, op, lc);
    }
    exs__stream_ring_retire_locked(conn);
}

/* Fig. 3: advertise the first unadvertised receive when allowed. */
static void st_advertise_locked(struct exs_conn *conn)
{
    struct exs_list *pos;
    uint32_t outstanding = 0; /* ADVERTs of this phase whose receives are not satisfied */
    int drained = 0, redo = 0;
    uint64_t small_min =
        conn->p.xfer_mode == EXS_XFER_DYNAMIC && conn->peer.xfer_mode != EXS_XFER_DIRECT_ONLY
            ? exs__params.stream_direct_min
            : 0;

    if (conn->p.xfer_mode == EXS_XFER_INDIRECT_ONLY || conn->peer_shut)
        return;
    if (conn->stream.drain == EXS_STREAM_DRAIN_REQUESTED)
        return; /* §7.2: until the sender says where its ring writes stop */
    if (conn->stream.drain == EXS_STREAM_DRAIN_STOPPED) {
        if (conn->rx_seq != conn->stream.drain_pos || conn->rd_arrived != conn->rd_consumed)
            return; /* ring bytes before the stop position are still to come */
        drained = redo = 1;
    }
    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE)
            continue;
        if (op->state == EXS_OPS_ADVERTISED && (op->phase == conn->stream.pr || !redo)) {
            if (op->phase != conn->stream.pr)
                return; /* k_a > 0: an ADVERT of an earlier phase is outstanding */
            outstanding++;
            continue;
        }
        /* op has no ADVERT, or (after a drain, §7.2) one of an earlier phase that the
         * sender dropped as stale: no ring byte will fill it, it is advertised again */
        /* op is the first receive without an ADVERT: k_b counts only it and later ones.
         * After a drain (§7.2) a WAITALL receive partly filled from the ring is
         * advertised for the rest of its buffer: no ring byte can follow. */
        if (conn->rd_arrived != conn->rd_consumed || (op->filled && !drained) ||
            op->len - op->filled > UINT32_MAX)
            return; /* b_r > 0 */
        /* §7.3: a small receive stays indirect (its copy costs less than an ADVERT's
         * round trip), unless the sender waits for an ADVERT (after a drain) or never
         * writes the ring (direct-only) */
        if (small_min && op->len - op->filled < small_min && !drained)
            return;
        if (outstanding >= EXS_WIRE_ADVERTS_MAX)
            return; /* the sender would hold too many (ADVERTS_MAX) */
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ADVERT_LEN) &&
            !exs__conn_ctrl_flush_locked(conn))
            return;
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ADVERT_LEN))
            return;
        if (PHASE_IS_INDIRECT(conn->stream.pr)) {
            conn->stream.pr++; /* a new direct sequence */
            conn->stream.drain_dir = conn->stream.drain == EXS_STREAM_DRAIN_STOPPED;
            conn->stream.drain_bytes = 0;
            conn->stream.drain_t0 = exs__now_us();
            conn->stream.drain = EXS_STREAM_DRAIN_IDLE;
            conn->stream.streak = 0;
        }
        drained = 0; /* only the first ADVERT may cover a partly filled receive */
        if (!outstanding)
            conn->stream.sr_next = conn->rx_seq; /* resynchronize (§7, receiver step 3) */
        /* the peer may WRITE exactly this buffer until the receive completes (a receive
         * advertised again keeps its grant) */
        if (!op->grant && exs__conn_grant_op_locked(conn, op, EXS_PROV_ACCESS_REMOTE_WRITE)) {
            exs__conn_fail_locked(conn, ECONNRESET, "advert grant failed");
            return;
        }
        op->advert_id = conn->next_advert_id++;
        op->phase = conn->stream.pr;
        op->seq = conn->stream.sr_next;
        conn->stream.sr_next += (op->flags & MSG_WAITALL) ? op->len - op->filled : 1;
        struct exs_wire_advert a = {
            .hdr = {.type = EXS_CTRL_ADVERT,
                    .flags = (op->flags & MSG_WAITALL) ? EXS_ADVERT_WAITALL : 0,
                    .len = htobe16(EXS_WIRE_ADVERT_LEN)},
            .addr = htobe64((uintptr_t)(op->buf + op->filled)),
            .len = htobe32((uint32_t)(op->len - op->filled)),
            .rkey = htobe32(op->rkey),
            .seq = htobe64(op->seq),
            .phase = htobe32(op->phase),
            .id = htobe32(op->advert_id),
        };
        exs__conn_ctrl_append_locked(conn, &a, sizeof(a));
        op->state = EXS_OPS_ADVERTISED;
        conn->stats.adverts_sent++;
        outstanding++;
    }
}

/* End of stream: once every byte the peer sent was delivered, receives complete with
 * what they hold (0 = end of stream). */
static void st_eof_locked(struct exs_conn *conn, int err)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE)
            continue;
        if (op->cancel)
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        else if (err && !op->filled)
            exs__conn_op_finish_locked(op, -1, err);
        else
            exs__conn_op_finish_locked(op, (ssize_t)op->filled, 0);
    }
}

/* §7.2: in an indirect phase, ask the sender back to direct once ring arrivals keep
 * leaving big receives waiting with the ring empty (the receiver is ahead). */
static void st_drain_check_locked(struct exs_conn *conn)
{
    uint64_t streak_min = exs__params.stream_drain_streak;
    struct exs_op *head;

    if (PHASE_IS_DIRECT(conn->stream.pr) || conn->stream.drain != EXS_STREAM_DRAIN_IDLE ||
        !streak_min || conn->p.xfer_mode == EXS_XFER_INDIRECT_ONLY || conn->peer_shut ||
        !(conn->peer.features & EXS_WIRE_FEAT_DRAIN))
        return;
    if (conn->rd_arrived != conn->stream.eval_arrived) { /* one step per arrival, not per call */
        conn->stream.eval_arrived = conn->rd_arrived;
        head = exs__stream_head_recv(conn);
        if (conn->rd_arrived == conn->rd_consumed && head &&
            head->len - head->filled >= exs__params.stream_direct_min)
            conn->stream.streak++;
        else
            conn->stream.streak = 0;
    }
    if (!conn->stream.drain_need)
        conn->stream.drain_need =
            (uint32_t)EXS_MIN(streak_min, (uint64_t)EXS_STREAM_DRAIN_NEED_MAX);
    if (conn->stream.streak < conn->stream.drain_need)
        return;
    if (conn->stream.drain_hold && exs__now_us() < conn->stream.drain_hold)
        return; /* backing off (§7.2): the streak stays, the request waits */
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_DRAIN_LEN) && !exs__conn_ctrl_flush_locked(conn))
        return;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_DRAIN_LEN))
        return;
    uint64_t arrived = conn->rx_seq + (conn->rd_arrived - conn->rd_consumed);
    struct exs_wire_drain d = {
        .hdr = {.type = EXS_CTRL_DRAIN, .len = htobe16(EXS_WIRE_DRAIN_LEN)},
        .pos = htobe64(arrived),
        .phase = htobe32(conn->stream.pr),
    };
    exs__conn_ctrl_append_locked(conn, &d, sizeof(d));
    conn->stream.drain = EXS_STREAM_DRAIN_REQUESTED;
    conn->stream.streak = 0;
    conn->stats.drain_requests++;
    EXS_TRACE(PROTO, "conn %p: DRAIN in phase %u at %llu", (void *)conn, conn->stream.pr,
              (unsigned long long)arrived);
}

void exs__stream_recv_progress_locked(struct exs_conn *conn)
{
    if (conn->state != EXS_CONN_CONNECTED)
        return;
    st_copy_out_locked(conn);
    if (conn->peer_shut && conn->rx_seq == conn->peer_total &&
        conn->rd_arrived == conn->rd_consumed) {
        st_eof_locked(conn, 0);
        return;
    }
    st_drain_check_locked(conn);
    st_advertise_locked(conn);
    exs__stream_ring_tune_locked(conn);
}

void exs__stream_dead_drain_locked(struct exs_conn *conn)
{
    /* receives in flight lose their ADVERTs; ring data still goes out in order */
    st_copy_out_locked(conn);
    st_eof_locked(conn, conn->peer_shut ? 0 : (conn->err ? conn->err : ECONNRESET));
}

/* A batched ring write (§6.1) of a direct phase makes it indirect. */
static void st_batch_ring_write(struct exs_conn *conn)
{
    if (PHASE_IS_DIRECT(conn->stream.ps))
        exs__stream_enter_indirect_locked(conn);
}

/* The memory the STREAM data path holds: batching's staging, the send buffer, the
 * regions of autotuning. */
static void st_release(struct exs_conn *conn)
{
    exs__batch_release_locked(conn);
    exs__stage_release_locked(conn);
    exs__stream_ring_release_locked(conn);
}

/* The copy of len bytes that just went into the send buffer was appended to the newest
 * internal op, which still waits behind the ring write in flight (exs__stage_hold_locked,
 * no ADVERT to take instead): the last kick left the send side with nothing it could do,
 * and an append changes no input of it but that op's length, which the hold looks at: a
 * pass would stop at the held op again. */
static int st_copy_held(struct exs_conn *conn, size_t len)
{
    struct exs_op *last = conn->stg_last;

    /* appended: a new internal op holds exactly the copy's bytes; it was never held */
    return last && last->len > len && !conn->ctrl_len && !conn->resume.peer_wait &&
           exs__stage_hold_locked(conn, last) && !st_advert_head(conn);
}

/* The post's fast path of STREAM (spec/proto-layout.md, "The post's fast path"): op was
 * just copied into the send buffer (finished) and joined a held run (st_copy_held):
 * delivery alone hands op back. 1: done so. */
static int st_post_fast(struct exs_conn *conn, struct exs_op *op)
{
    if (op->state != EXS_OPS_DONE || !st_copy_held(conn, op->len))
        return 0;
    conn->posts_staged_fast++;
    exs__conn_deliver_locked(conn);
    return 1;
}

/* exs_send's copy at the post (spec/proto-layout.md, "A send that ends at its post"): the
 * bytes go into the send buffer with no op. When they join the run held behind the ring
 * write in flight, which stays held (st_copy_held's case, looked at before the copy),
 * nothing more is done; else the send side's kick runs as after a post (it finds no send
 * of the application to hand back). 1 done, 0 no room or memory (nothing changed).
 * (Here, not through the data path's table: only STREAM copies at the post, and the
 * append to the held run is inline in this one frame.) */
static inline __attribute__((always_inline)) int st_send_copy(struct exs_conn *conn,
                                                              const void *buf, size_t len)
{
    if (!conn->ctrl_len && !conn->resume.peer_wait && !st_advert_head(conn) &&
        exs__stage_append_held_locked(conn, buf, len)) {
        conn->posts_copied++;
        return 1;
    }
    if (!exs__stage_copy_bytes_locked(conn, buf, len))
        return 0;
    conn->posts_copied++;
    exs__conn_kick_tx_locked(conn);
    return 1;
}

/* len: exs__conn_copy_likely's (0 < len <= copy_max, fixed at creation), not asked again */
int exs__conn_send_copy(struct exs_conn *conn, const void *buf, size_t len)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    if (conn->dp == &exs__stream_path && conn->state == EXS_CONN_CONNECTED &&
        conn->txshut == EXS_TXSHUT_OPEN && !conn->sendq_app && conn->p.sndbuf &&
        !(EXS_REQTRACE_ON &&
          EXS_UNLIKELY(__atomic_load_n(&exs__params.trace_sample_mask, __ATOMIC_RELAXED))) &&
        st_send_copy(conn, buf, len))
        return 1;
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return 0;
}

const struct exs_datapath exs__stream_path = {
    .name = "STREAM",
    .bytes = 1,
    .ring_resize = 1,
    .on_advert = exs__stream_on_advert_locked,
    .on_drain = exs__stream_on_drain_locked,
    .on_resize = exs__stream_on_resize_locked,
    .on_data = exs__stream_on_data_locked,
    .recv_progress = exs__stream_recv_progress_locked,
    .send_progress = exs__stream_send_progress_locked,
    .dead_drain = exs__stream_dead_drain_locked,
    .stage_send = exs__stage_send_locked,
    .post_fast = st_post_fast,
    .ring_timer = exs__stream_ring_timer_locked,
    .stats = exs__stream_stats_locked,
    .batch_ring_write = st_batch_ring_write,
    .release = st_release,
};
