/* SPDX-License-Identifier: MIT */
/* Sender batching of small ring writes: synchronization-ahead and the elastic threshold. */
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/*
 * spec/protocol.md §6.1 (SEQPACKET) and §7.1 (STREAM). While a ring write of the
 * connection is in flight, the queued sends that would each go into the peer's ring are
 * not posted one by one: they wait as a run of consecutive queued sends, and the run
 * leaves as one WRITE WITH IMMEDIATE (one credit, one receive at the peer) when the
 * ring write in flight completes, or at once when the run reaches the threshold, meets
 * a send that cannot join it, or runs out of ring room. With no ring write in flight a
 * send leaves at once, alone. The run is not kept anywhere: its ops stay QUEUED (so
 * cancel and close treat them as before) and it is found again on each pass.
 */

enum run_end {
    RUN_TAIL = 1, /* the send queue ended */
    RUN_THRESH,   /* the next send would pass the threshold */
    RUN_ROOM,     /* the next send finds no ring room */
    RUN_OTHER,    /* the next op cannot be batched */
};

struct batch_run {
    struct exs_op *first, *last;
    uint32_t n;     /* ops */
    uint32_t bytes; /* bytes of the write */
    enum run_end end;
};

static void batch_run_build_locked(struct exs_conn *conn, struct exs_list *from, batch_fit_fn fit,
                                   struct batch_run *run)
{
    struct exs_list *pos;

    memset(run, 0, sizeof(*run));
    run->end = RUN_TAIL;
    for (pos = from; pos != &conn->sendq; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);
        uint32_t rec = 0;
        int r;

        if (op->state == EXS_OPS_DONE)
            continue; /* cancelled, waiting to be delivered in order */
        r = fit(conn, op, run->bytes, &rec);
        if (r == 0) {
            run->end = RUN_OTHER;
            break;
        }
        if (r < 0) {
            run->end = RUN_ROOM;
            break;
        }
        if ((uint64_t)run->bytes + rec > conn->batch_thresh || run->n == EXS_WIRE_BATCH_MAX_MSGS) {
            run->end = RUN_THRESH;
            break;
        }
        if (!run->n)
            run->first = op;
        run->last = op;
        run->n++;
        run->bytes += rec;
    }
}

/*
 * The batch wait cache. While a ring write is in flight, synchronization-ahead holds the
 * run of waiting sends back, and every new send used to rebuild that run from its first
 * op (a fit call per waiting send per post: the hottest code of a stream of small sends).
 * A held run stays held while only sends appended behind it changed: the ring write in
 * flight has not completed and no completion brought an ADVERT, ACK, DRAIN or anything
 * else (cqe_stamp), the threshold and the close state are the same, and the run still
 * starts at the same op. Then only the appended sends are fitted. Any other outcome is
 * computed from scratch, so the cache only ever answers "hold".
 *
 * The ops it points to stay in sendq while it is valid: they follow the ring write in
 * flight, and sends leave sendq only in posting order.
 */
static int batch_wait_extend_locked(struct exs_conn *conn, struct exs_list *from, batch_fit_fn fit)
{
    struct exs_batch_wait *w = &conn->bwait;
    struct exs_list *pos;

    if (!w->first || &w->first->link != from || w->cqe_stamp != conn->cqe_stamp ||
        w->ring_wr_out != conn->ring_wr_out || !conn->ring_wr_out || conn->batch_now ||
        w->thresh != conn->batch_thresh || conn->state != EXS_CONN_CONNECTED)
        return 0;
    for (pos = w->last->link.next; pos != &conn->sendq; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);
        uint32_t rec = 0;

        if (op->state == EXS_OPS_DONE)
            continue;
        if (fit(conn, op, w->bytes, &rec) != 1 || (uint64_t)w->bytes + rec > conn->batch_thresh ||
            w->n == EXS_WIRE_BATCH_MAX_MSGS)
            return 0;
        w->last = op;
        w->n++;
        w->bytes += rec;
    }
    return 1;
}

/* The elastic threshold (§6.1): doubles when a run fills it (or a send alone passes it)
 * while a ring write is still in flight (the peer or the link is the bottleneck: gather
 * more per write), halves when the write in flight completed before the run reached
 * half of it. */
static void batch_adapt_locked(struct exs_conn *conn, const struct batch_run *run)
{
    uint32_t floor = EXS_MIN(EXS_BATCH_FLOOR, conn->p.batch_max);

    if (run->end == RUN_THRESH && conn->ring_wr_out)
        conn->batch_thresh =
            (uint32_t)EXS_MIN((uint64_t)conn->batch_thresh * 2, (uint64_t)conn->p.batch_max);
    else if (run->end == RUN_TAIL && !conn->ring_wr_out && run->bytes < conn->batch_thresh / 2)
        conn->batch_thresh = EXS_MAX(conn->batch_thresh / 2, floor);
}

static int batch_staging_locked(struct exs_conn *conn)
{
    int ret;

    if (conn->batch_mem)
        return 0;
    ret = exs__conn_mem_alloc(conn->ctx, (size_t)EXS_BATCH_SLOTS * conn->p.batch_max, EXS_MEM_OTHER,
                              &conn->batch_mem);
    if (ret) {
        EXS_WARN(PROTO, "conn %p: batch staging of %u bytes: %s; batching off", (void *)conn,
                 EXS_BATCH_SLOTS * conn->p.batch_max, strerror(-ret));
        conn->batch_thresh = 0;
    }
    return ret;
}

/* Copy the run into staging buffer dst in its wire form. */
static void batch_fill_locked(struct exs_conn *conn, const struct batch_run *run, uint8_t *dst)
{
    struct exs_list *pos = &run->first->link;
    uint32_t off = 0;

    for (uint32_t i = 0; i < run->n; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE)
            continue;
        if (conn->dp->bytes) { /* STREAM: the bytes alone */
            memcpy(dst + off, op->buf, op->len);
            off += (uint32_t)op->len;
        } else {
            struct exs_wire_batch_rec h = {.len = htobe32((uint32_t)op->len)};
            uint32_t rec = exs_wire_batch_rec_size((uint32_t)op->len);

            memcpy(dst + off, &h, sizeof(h));
            if (op->len)
                memcpy(dst + off + sizeof(h), op->buf, op->len);
            memset(dst + off + sizeof(h) + op->len, 0, rec - sizeof(h) - op->len);
            off += rec;
        }
        i++;
    }
    EXS_ASSERT(off == run->bytes);
}

/* Post the run as one ring write. BATCH_SENT, BATCH_STALL, or BATCH_NONE when batching
 * just turned off (no staging memory). */
static enum batch_verdict batch_post_locked(struct exs_conn *conn, const struct batch_run *run)
{
    uint32_t size = conn->peer.ring_size, slot, skip = 0, used, imm;
    uint64_t raddr;
    struct exs_list *pos;
    uint8_t *dst;
    int ret;

    for (slot = 0; slot < EXS_BATCH_SLOTS; slot++)
        if (!conn->batch_slot[slot].first)
            break;
    if (slot == EXS_BATCH_SLOTS)
        return BATCH_STALL; /* a batched write completes first */
    if (batch_staging_locked(conn))
        return BATCH_NONE;
    if (!exs__conn_can_spend_locked(conn)) {
        conn->stats.credit_stalls++;
        return BATCH_STALL;
    }
    /* control records queued earlier (ANNOUNCE, SHUTDOWN) keep their place */
    if (conn->ctrl_len && !exs__conn_ctrl_flush_locked(conn))
        return BATCH_STALL;
    if (!exs__conn_can_spend_locked(conn))
        return BATCH_STALL;

    dst = (uint8_t *)conn->batch_mem->addr + (size_t)slot * conn->p.batch_max;
    batch_fill_locked(conn, run, dst);
    if (conn->dp->bytes) {
        /* the run fits the contiguous ring room (st_batch_fit) */
        conn->dp->batch_ring_write(conn);
        raddr = conn->peer.ring_addr + exs__pos_mod(conn->wr_tail, size);
        used = run->bytes;
        imm = exs_imm_make(EXS_IMM_INDIRECT, 0, exs__conn_take_owed_imm_locked(conn), 0);
    } else {
        uint32_t off = (uint32_t)exs__pos_mod(conn->wr_tail, size);
        uint32_t slot_len = exs__seqpkt_slot_len(run->bytes);

        skip = off + slot_len > size ? size - off : 0;
        used = skip + slot_len;
        raddr = conn->peer.ring_addr + exs__pos_mod(conn->wr_tail + skip, size);
        imm = exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, exs__conn_take_owed_imm_locked(conn),
                           run->n);
    }
    struct exs_prov_sge sge = {(uintptr_t)dst, run->bytes, conn->batch_mem->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = WR_ID(WR_TAG_BATCH, (uint64_t)slot << 3),
        .opcode = EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
        .imm_data = imm,
        .remote_addr = raddr,
        .rkey = conn->peer.ring_rkey,
    };
    if (run->bytes <= conn->ep->attr.max_inline)
        wr.flags |= EXS_PROV_SEND_INLINE;
    ret = exs__conn_post_send_locked(conn, &wr);
    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET, "batched write failed");
        return BATCH_STALL;
    }
    conn->wr_out++;
    conn->credits--;
    conn->ring_wr_out++;
    conn->wr_tail += used;
    conn->batch_slot[slot].first = run->first;
    conn->batch_slot[slot].nops = run->n;
    pos = &run->first->link;
    for (uint32_t i = 0; i < run->n; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE)
            continue;
        op->posted = op->len;
        op->inflight = 1;
        op->state = EXS_OPS_POSTED;
        if (conn->dp->bytes)
            conn->tx_seq += op->len;
        else
            op->seq = conn->tx_seq++;
        i++;
    }
    conn->stats.indirect_xfers++;
    conn->stats.batches_sent++;
    conn->stats.msgs_batched += run->n;
    EXS_TRACE(PROTO, "conn %p: batched write of %u sends, %u bytes (threshold %u)", (void *)conn,
              run->n, run->bytes, conn->batch_thresh);
    return BATCH_SENT;
}

enum batch_verdict exs__batch_try_locked(struct exs_conn *conn, struct exs_list *from,
                                         batch_fit_fn fit)
{
    struct batch_run run;
    enum batch_verdict v;

    if (!conn->batch_thresh)
        return BATCH_NONE; /* off */
    if (batch_wait_extend_locked(conn, from, fit))
        return BATCH_WAIT;
    conn->bwait.first = NULL;
    batch_run_build_locked(conn, from, fit, &run);
    if (!run.n) {
        /* a send larger than the threshold, behind a ring write in flight: load too */
        if (run.end == RUN_THRESH)
            batch_adapt_locked(conn, &run);
        return BATCH_NONE;
    }
    if (run.end == RUN_TAIL && conn->ring_wr_out && !conn->batch_now) {
        conn->bwait = (struct exs_batch_wait){
            .first = run.first,
            .last = run.last,
            .n = run.n,
            .bytes = run.bytes,
            .thresh = conn->batch_thresh,
            .ring_wr_out = conn->ring_wr_out,
            .cqe_stamp = conn->cqe_stamp,
        };
        return BATCH_WAIT; /* synchronization-ahead: leave with the next completion */
    }
    batch_adapt_locked(conn, &run);
    if (run.n == 1)
        return BATCH_NONE; /* alone: as without batching (zero-copy, no framing) */
    v = batch_post_locked(conn, &run);
    return v;
}

/* The post's fast path sends op, the last op of sendq, alone, with no ring write in
 * flight (spec/proto-layout.md, "The post's fast path"): the threshold learns from it
 * what exs__batch_try_locked would have taught it, a run of op alone. */
void exs__batch_alone_locked(struct exs_conn *conn, struct exs_op *op, batch_fit_fn fit)
{
    struct batch_run run;

    EXS_ASSERT(!conn->ring_wr_out && op->link.next == &conn->sendq);
    conn->bwait.first = NULL;
    /* off, or at the floor already: a run of one can only lower it (no ring write is in
     * flight), to no less than the floor */
    if (exs__batch_alone_idle(conn))
        return;
    batch_run_build_locked(conn, &op->link, fit, &run);
    if (run.n || run.end == RUN_THRESH)
        batch_adapt_locked(conn, &run);
}

/* A batched write completed (ok) or failed: its sends complete, in order; failed, only
 * the cancelled ones do (from DOWN on), the others end with the connection. */
void exs__batch_on_cqe_locked(struct exs_conn *conn, uint32_t slot, int ok)
{
    struct exs_batch_slot *b;
    struct exs_list *pos;
    uint32_t n;

    if (slot >= EXS_BATCH_SLOTS || !conn->batch_slot[slot].first) {
        exs__conn_fail_locked(conn, ECONNRESET, "unknown batch completion");
        return;
    }
    b = &conn->batch_slot[slot];
    conn->ring_wr_out--;
    /* the ops are alive, also from DOWN on: none is handed back while its write is
     * outstanding (a cancelled one completes here, with ECANCELED) */
    pos = &b->first->link;
    for (n = b->nops; n && pos != &conn->sendq; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_DONE)
            continue;
        EXS_ASSERT(op->state == EXS_OPS_POSTED && op->inflight == 1);
        op->inflight = 0;
        if (ok) {
            exs__conn_send_done_locked(conn, op);
        } else if (op->cancel && conn->state >= EXS_CONN_DOWN) {
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
        n--;
    }
    b->first = NULL;
    b->nops = 0;
}

void exs__batch_release_locked(struct exs_conn *conn)
{
    if (conn->batch_mem)
        exs__conn_mem_free(conn->batch_mem);
    conn->batch_mem = NULL;
}
