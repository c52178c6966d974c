/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET data path (spec/protocol.md §6): eager ring writes, direct writes into
 * advertised receives, and announce + RDMA READ rendezvous. Layer 2 of
 * spec/proto-layout.md; seqpkt_ann.c below it holds the announced messages' records. */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/* Where a message of len bytes goes in a ring of size bytes whose tail is at pos: the
 * bytes skipped at the end (a message never wraps) and the slot length. */
static void sp_ring_place(uint64_t pos, uint32_t size, uint32_t len, uint32_t *skip_p,
                          uint32_t *slot_p)
{
    uint32_t off = (uint32_t)exs__pos_mod(pos, size);
    uint32_t slot = exs__seqpkt_slot_len(len);

    *skip_p = off + slot > size ? size - off : 0;
    *slot_p = slot;
}

/* A message entry is done with: kept for the next message (no malloc per message) while
 * fewer than EXS_PENDING_KEEP are, else freed. */
static void sp_pending_free(struct exs_conn *conn, struct exs_pending_msg *m)
{
    if (conn->pending_free_n < EXS_PENDING_KEEP) {
        exs_list_add_tail(&conn->pending_free, &m->link);
        conn->pending_free_n++;
        return;
    }
    free(m);
    exs__conn_mem_give_locked(conn, exs__mem_chunk(sizeof(*m)));
}

void exs__seqpkt_free_pending_locked(struct exs_conn *conn)
{
    struct exs_list *n;

    while ((n = exs_list_pop_head(&conn->pending)))
        sp_pending_free(conn, exs_list_entry(n, struct exs_pending_msg, link));
    while ((n = exs_list_pop_head(&conn->pending_free))) {
        free(exs_list_entry(n, struct exs_pending_msg, link));
        exs__conn_mem_give_locked(conn, exs__mem_chunk(sizeof(struct exs_pending_msg)));
    }
    conn->pending_free_n = 0;
    conn->pending_count = conn->pending_announced = 0;
    if (conn->seqpkt.memo)
        exs__conn_mem_give_locked(conn, exs__seqpkt_memo_bytes(conn->seqpkt.memo_cap));
    free(conn->seqpkt.memo);
    conn->seqpkt.memo = NULL;
    conn->seqpkt.memo_n = conn->seqpkt.memo_head = conn->seqpkt.memo_owed = 0;
}

/* ---- sending side ---- */

static struct exs_advert *sp_advert_head(struct exs_conn *conn)
{
    /* ADVERTs for receives already matched otherwise are stale (§6) */
    while (conn->adv_count) {
        struct exs_advert *a = &conn->adverts[conn->adv_head];

        if (a->seq >= conn->tx_seq)
            return a;
        conn->adv_head = (conn->adv_head + 1) % conn->adv_cap;
        conn->adv_count--;
        conn->stats.adverts_discarded++;
    }
    return NULL;
}

static void sp_advert_pop(struct exs_conn *conn)
{
    conn->adv_head = (conn->adv_head + 1) % conn->adv_cap;
    conn->adv_count--;
}

int exs__seqpkt_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a)
{
    /* Stale ADVERTs (for messages that went eager or batched) were dropped only when a
     * send looked at the head, and a stream of batched sends never does: they piled up
     * to CONN_ADVERTS_MAX and an honest peer was declared hostile. Drop them as new ones
     * arrive: the queue then holds only receives ahead of the sender. */
    (void)sp_advert_head(conn);
    /* adverts come in receive-posting order, so their message numbers only grow */
    if (conn->adv_count) {
        uint64_t last = conn->adverts[(conn->adv_head + conn->adv_count - 1) % conn->adv_cap].seq;

        if (a->seq <= last)
            return exs__proto_violation(conn, EXS_PV_ADVERT, EXS_CTRL_ADVERT,
                                        "message %llu after %llu", (unsigned long long)a->seq,
                                        (unsigned long long)last);
    }
    return exs__advert_push_locked(conn, a);
}

/* Post the next pieces of the fragmented direct message (§6.2) while credits allow:
 * control records waiting go first, between pieces (only those that number no message
 * can be waiting: the send loop stops at this op). The last piece carries eom (and trunc
 * when the message was longer than the ADVERT). */
static void sp_frag_post_locked(struct exs_conn *conn)
{
    struct exs_op *op = conn->seqpkt.frag_op;
    const struct exs_advert *adv = &conn->seqpkt.frag_adv;
    uint32_t frag = exs__conn_frag_size();

    while (op) {
        uint32_t off = (uint32_t)op->posted;
        uint32_t lw = EXS_MIN(frag, conn->seqpkt.frag_n - off);
        int last = off + lw == conn->seqpkt.frag_n;
        unsigned flags = last ? EXS_IMM_EOM | (op->len > adv->len ? EXS_IMM_TRUNC : 0) : 0;

        /* a SHUTDOWN of exs_close waits in the batch behind these pieces */
        if (conn->ctrl_len && conn->txshut != EXS_TXSHUT_APPENDED &&
            !exs__conn_ctrl_flush_locked(conn))
            return;
        if (!exs__conn_can_spend_locked(conn)) {
            conn->stats.credit_stalls++;
            return;
        }
        uint32_t imm =
            exs_imm_make(EXS_IMM_DIRECT, flags, exs__conn_take_owed_imm_locked(conn), adv->id);
        if (exs__conn_post_write_imm_locked(conn, op, adv->addr + off, adv->rkey, lw, imm,
                                            op->buf + off))
            return;
        op->inflight++;
        conn->stats.fragments++;
        if (!last) {
            op->posted += lw;
            continue;
        }
        /* the completion rule of a send: done with its last write once posted == len */
        op->posted = op->len;
        conn->seqpkt.frag_op = NULL;
        EXS_TRACE(PROTO, "conn %p: message %llu: %u bytes direct in pieces of %u, advert %u",
                  (void *)conn, (unsigned long long)op->seq, conn->seqpkt.frag_n, frag, adv->id);
        return;
    }
}

/* May one more message be announced (§6: at most ANNOUNCED_MAX whose READ_DONE has not
 * come)? seqpkt.ann_out only over-counts (a send announced again after a cut counts twice):
 * at the cap the sends still waiting for their READ_DONE are counted again. */
static int sp_may_announce(struct exs_conn *conn)
{
    struct exs_list *pos;
    uint32_t n = 0;

    if (conn->seqpkt.ann_out < EXS_WIRE_ANNOUNCED_MAX)
        return 1;
    exs_list_for_each(pos, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        n += op->kind == EXS_OP_SEND && op->state == EXS_OPS_POSTED && op->announced;
    }
    conn->seqpkt.ann_out = n;
    return n < EXS_WIRE_ANNOUNCED_MAX;
}

/* op's one write (eager or direct) was posted: the message is numbered; done when the
 * write completes, or now when it went unsignaled (§6.4). */
static inline void sp_sent_locked(struct exs_conn *conn, struct exs_op *op)
{
    op->posted = op->len;
    op->inflight = 1;
    op->seq = conn->tx_seq++;
    op->state = EXS_OPS_POSTED;
    exs__conn_quiet_check_locked(conn, op);
}

/* The eager write of op's len bytes into the peer's ring (it is keyed, len < eager), no
 * control record waiting: 1 posted, 0 no credit or ring room (nothing changed), -1 the
 * post failed (the conn fails). */
static inline int sp_eager_locked(struct exs_conn *conn, struct exs_op *op, uint32_t len)
{
    uint32_t size = conn->peer.ring_size, skip, slot;

    if (!exs__conn_can_spend_locked(conn))
        return 0;
    sp_ring_place(conn->wr_tail, size, len, &skip, &slot);
    if ((uint64_t)skip + slot > size - (conn->wr_tail - conn->wr_consumed))
        return 0;
    uint64_t off = exs__pos_mod(conn->wr_tail + skip, size);
    uint32_t imm =
        exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, exs__conn_take_owed_imm_locked(conn), 0);
    if (exs__conn_post_write_imm_locked(conn, op, conn->peer.ring_addr + off, conn->peer.ring_rkey,
                                        len, imm, op->buf))
        return -1;
    conn->wr_tail += skip + slot;
    conn->stats.indirect_xfers++;
    EXS_TRACE(PROTO, "conn %p: message %llu: eager %u bytes", (void *)conn,
              (unsigned long long)conn->tx_seq, len);
    sp_sent_locked(conn, op);
    return 1;
}

/* Try to put the head send op on the wire. 1: it went (or waits for the peer), 0: it
 * must wait for credits, ring space, a control slot or a READ_DONE. */
static int sp_send_one_locked(struct exs_conn *conn, struct exs_op *op)
{
    uint32_t eager = EXS_MIN(conn->p.eager_max, conn->peer.eager_max);
    uint32_t len = (uint32_t)op->len;
    struct exs_advert *adv;

    if (op->kind == EXS_OP_SHUTDOWN) {
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN) &&
            !exs__conn_ctrl_flush_locked(conn))
            return 0;
        exs__conn_shutdown_record_locked(conn, op);
        op->state = EXS_OPS_POSTED;
        exs__conn_ctrl_flush_locked(conn);
        return 1;
    }
    if (!exs__conn_can_spend_locked(conn)) {
        conn->stats.credit_stalls++;
        return 0;
    }
    if (EXS_REQTRACE_ON && op->rt && !exs__reqtrace_wire_begin_locked(conn, op))
        return 0;
    adv = sp_advert_head(conn);

    /* 1. eager into the peer's ring */
    if (len < eager && conn->peer.ring_size && conn->peer_ring_keyed) {
        uint32_t skip, slot;

        sp_ring_place(conn->wr_tail, conn->peer.ring_size, len, &skip, &slot);
        if ((uint64_t)skip + slot <= conn->peer.ring_size - (conn->wr_tail - conn->wr_consumed)) {
            /* earlier control records (ANNOUNCE, SHUTDOWN) must arrive first */
            if (conn->ctrl_len && !exs__conn_ctrl_flush_locked(conn))
                return 0;
            return sp_eager_locked(conn, op, len) > 0;
        }
    }
    /* 2. direct into the advertised receive for this message */
    if (adv && adv->seq == conn->tx_seq) {
        uint32_t n = EXS_MIN(len, adv->len);
        unsigned flags = EXS_IMM_EOM | (len > adv->len ? EXS_IMM_TRUNC : 0);

        if (conn->ctrl_len && !exs__conn_ctrl_flush_locked(conn))
            return 0;
        if (!exs__conn_can_spend_locked(conn))
            return 0;
        if (n > exs__conn_frag_size() && (conn->peer.features & EXS_WIRE_FEAT_FRAG)) {
            /* several pieces (§6.2): the message is numbered now, its pieces follow */
            conn->seqpkt.frag_adv = *adv;
            conn->seqpkt.frag_n = n;
            conn->seqpkt.frag_op = op;
            sp_advert_pop(conn);
            conn->stats.direct_xfers++;
            op->posted = 0;
            op->inflight = 0;
            op->seq = conn->tx_seq++;
            op->state = EXS_OPS_POSTED;
            sp_frag_post_locked(conn);
            return !conn->seqpkt.frag_op;
        }
        uint32_t imm =
            exs_imm_make(EXS_IMM_DIRECT, flags, exs__conn_take_owed_imm_locked(conn), adv->id);
        if (exs__conn_post_write_imm_locked(conn, op, adv->addr, adv->rkey, n, imm, op->buf))
            return 0;
        EXS_TRACE(PROTO, "conn %p: message %llu: direct %u bytes, advert %u", (void *)conn,
                  (unsigned long long)conn->tx_seq, n, adv->id);
        sp_advert_pop(conn);
        conn->stats.direct_xfers++;
        sp_sent_locked(conn, op);
        return 1;
    }
    /* An eager-size message waits for the peer's RING record (the first record of its
     * first SEND) rather than being announced: announcing would expose a buffer that is
     * often not grantable (a constant: read-only pages, registered without LOCAL_WRITE). */
    if (len < eager && conn->peer.ring_size && !conn->peer_ring_keyed)
        return 0;
    /* 3. announce it; the receiver READs it when its receive is posted */
    if (!sp_may_announce(conn))
        return 0; /* the next READ_DONE runs the send path again */
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ANNOUNCE_LEN) &&
        !exs__conn_ctrl_flush_locked(conn))
        return 0;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ANNOUNCE_LEN))
        return 0;
    if (exs__seqpkt_announce_locked(conn, op, conn->tx_seq))
        return 0;
    EXS_TRACE(PROTO, "conn %p: message %llu: announce %u bytes", (void *)conn,
              (unsigned long long)conn->tx_seq, len);
    op->seq = conn->tx_seq++;
    op->state = EXS_OPS_POSTED;
    op->announced = 1;
    conn->seqpkt.ann_out++;
    return 1;
}

/* batch_fit_fn (§6.1): a message joins the run when the peer splits batched writes, it
 * would go eagerly, and the run's write with it fits the peer's ring now. */
static int sp_batch_fit(struct exs_conn *conn, struct exs_op *op, uint64_t bytes, uint32_t *rec_p)
{
    uint32_t eager = EXS_MIN(conn->p.eager_max, conn->peer.eager_max);
    uint32_t size = conn->peer.ring_size, rec, skip, slot;

    if (op->kind != EXS_OP_SEND || op->state != EXS_OPS_QUEUED || op->len >= eager || op->rt ||
        !size || !conn->peer_ring_keyed || !(conn->peer.features & EXS_WIRE_FEAT_BATCH))
        return 0;
    rec = exs_wire_batch_rec_size((uint32_t)op->len);
    if (bytes + rec > size)
        return -1;
    sp_ring_place(conn->wr_tail, size, (uint32_t)bytes + rec, &skip, &slot);
    if ((uint64_t)skip + slot > size - (conn->wr_tail - conn->wr_consumed))
        return -1;
    *rec_p = rec;
    return 1;
}

static __attribute__((noinline)) void sp_send_progress_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    /* after a cut, messages announced again go first (§9.2) */
    if (conn->seqpkt.reann_left &&
        (!exs__seqpkt_reannounce_locked(conn) || conn->state >= EXS_CONN_DOWN))
        return;

    if (conn->seqpkt.frag_op) {
        sp_frag_post_locked(conn);
        if (conn->seqpkt.frag_op || conn->state >= EXS_CONN_DOWN)
            return; /* the next message waits for the last piece of this one */
    }

    /* from the first op that may still need sending (proto.h, sendq_settled) */
    for (pos = conn->sendq_settled ? conn->sendq_settled->link.next : conn->sendq.next;
         pos != &conn->sendq; pos = pos->next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state != EXS_OPS_QUEUED) {
            if (pos->prev == (conn->sendq_settled ? &conn->sendq_settled->link : &conn->sendq))
                conn->sendq_settled = op; /* settled, and all before it */
            continue;
        }
        if (op->kind == EXS_OP_SEND) {
            switch (exs__batch_try_locked(conn, pos, sp_batch_fit)) {
            case BATCH_SENT:
                if (conn->state >= EXS_CONN_DOWN)
                    return;
                continue; /* the run's ops are POSTED now: skipped */
            case BATCH_WAIT:
            case BATCH_STALL:
                return;
            case BATCH_NONE:
                break;
            }
        }
        if (!sp_send_one_locked(conn, op) || conn->state >= EXS_CONN_DOWN)
            break;
    }
}

/* The send side's pass: nothing to do, and nothing called (no frame to build: a leaf),
 * when no re-announcement or piece waits and no op follows the settled ones (every kick
 * asks; in a ping-pong sendq is mostly empty). */
void exs__seqpkt_send_progress_locked(struct exs_conn *conn)
{
    if (!conn->seqpkt.reann_left && !conn->seqpkt.frag_op &&
        (conn->sendq_settled ? conn->sendq_settled->link.next : conn->sendq.next) == &conn->sendq)
        return;
    sp_send_progress_locked(conn);
}

/* The conn's conditions of a send that goes eagerly at its post (sp_post_fast, and
 * exs__conn_send_now_begin's send with no op): nothing waits to be sent or answered before
 * it (no resume wait, re-announcement, piece, control record, queued or ring write in
 * flight), the peer's ring keyed, and len below both eager limits. */
static inline int sp_fast_conn_ok(const struct exs_conn *conn, size_t len)
{
    return !conn->resume.peer_wait && !conn->seqpkt.reann_left && !conn->seqpkt.frag_op &&
           !conn->ctrl_len && !conn->wrq_count && !conn->ring_wr_out && conn->peer_ring_keyed &&
           len < EXS_MIN(conn->p.eager_max, conn->peer.eager_max);
}

/* The post's fast path (spec/proto-layout.md, "The post's fast path"): op, just queued
 * at sendq's tail, goes into the peer's ring at once when nothing else is to be sent
 * before it and it would leave alone. What the kick would then do besides is nothing: a
 * send changes no input of the receive side, the keepalive answer or delivery, and with
 * no control record waiting the flush has nothing to send. 1: on the wire. */
static int sp_post_fast(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_list *prev = op->link.prev;
    int ret;

    if (op->kind != EXS_OP_SEND || op->rt || !sp_fast_conn_ok(conn, op->len))
        return 0;
    /* every op before it needs no more sending (proto.h, sendq_settled) */
    if (prev != &conn->sendq && (!conn->sendq_settled || prev != &conn->sendq_settled->link))
        return 0;
    exs__batch_alone_locked(conn, op, sp_batch_fit);
    /* eager at once (sp_send_one_locked's first way, its other checks made above), else
     * the whole choice: direct into an ADVERT, or announced */
    ret = sp_eager_locked(conn, op, (uint32_t)op->len);
    if (ret < 0 || (!ret && !sp_send_one_locked(conn, op)))
        return 0; /* no room or no credit: it waits, as after any post */
    conn->sendq_settled = op;
    if (conn->ctrl_len || conn->state != EXS_CONN_CONNECTED)
        return 0; /* announced (the ring was full): the kick flushes the record */
    EXS_PROTO_CNT_INC(conn, posts_fast);
    if (op->state == EXS_OPS_DONE) /* unsignaled (§6.4): its event now */
        exs__conn_deliver_locked(conn);
    return 1;
}

/* exs_send's SEQPACKET send that ends at its post (spec/proto-layout.md, "A SEQPACKET
 * send that ends at its post"): the conditions of sp_post_fast with an empty sendq (no
 * send before it at all), no request tracing, batching's threshold idle (a run of one
 * would not change it), and those of an unsignaled inline write; the peer's ring has room
 * and a credit is left. 1: conn->lock held, nothing changed yet; 0: unlocked. */
int exs__conn_send_now_begin(struct exs_conn *conn, size_t len)
{
    uint32_t skip, slot;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    if (conn->dp == &exs__seqpkt_path && conn->state == EXS_CONN_CONNECTED &&
        conn->txshut == EXS_TXSHUT_OPEN && exs_list_empty(&conn->sendq) &&
        sp_fast_conn_ok(conn, len) && conn->peer.ring_size && exs__batch_alone_idle(conn) &&
        !(EXS_REQTRACE_ON &&
          EXS_UNLIKELY(__atomic_load_n(&exs__params.trace_sample_mask, __ATOMIC_RELAXED))) &&
        exs__conn_can_spend_locked(conn)) {
        sp_ring_place(conn->wr_tail, conn->peer.ring_size, (uint32_t)len, &skip, &slot);
        if ((uint64_t)skip + slot <= conn->peer.ring_size - (conn->wr_tail - conn->wr_consumed) &&
            exs__conn_quiet_may_locked(conn, (uint32_t)len))
            return 1;
    }
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return 0;
}

/* ... its eager write (the lock held since exs__conn_send_now_begin said yes): what
 * sp_post_fast does for such a send, with no op: the message numbered and done. 1 posted;
 * 0 the provider refused the write (nothing changed). The lock stays held either way. */
int exs__conn_send_now_post(struct exs_conn *conn, const void *buf, size_t len, int flags)
{
    uint32_t size = conn->peer.ring_size, skip, slot;

    sp_ring_place(conn->wr_tail, size, (uint32_t)len, &skip, &slot);
    if (!exs__conn_post_quiet_locked(
            conn, conn->peer.ring_addr + exs__pos_mod(conn->wr_tail + skip, size),
            conn->peer.ring_rkey, (uint32_t)len, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0),
            buf, flags))
        return 0;
    conn->bwait.first = NULL; /* exs__batch_alone_locked's */
    conn->wr_tail += skip + slot;
    conn->stats.indirect_xfers++;
    EXS_TRACE(PROTO, "conn %p: message %llu: eager %u bytes at the post", (void *)conn,
              (unsigned long long)conn->tx_seq, (unsigned)len);
    /* numbered and ended (exs__conn_send_end_locked's SEQPACKET part) */
    conn->tx_seq++;
    if (conn->tx_seq > conn->resume_tx_done)
        conn->resume_tx_done = conn->tx_seq;
    EXS_PROTO_CNT_INC(conn, posts_fast);
    conn->posts_copied++;
    return 1;
}

int exs__seqpkt_on_read_done_locked(struct exs_conn *conn, uint64_t seq)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        /* only an announced send waits for a READ_DONE: an eager or direct one is
         * completed by its own write, which may still be outstanding */
        if (op->kind == EXS_OP_SEND && op->state == EXS_OPS_POSTED && op->seq == seq &&
            op->announced) {
            EXS_ASSERT(!op->inflight);
            if (conn->seqpkt.ann_out)
                conn->seqpkt.ann_out--;
            exs__conn_send_done_locked(conn, op);
            return 0;
        }
    }
    return exs__proto_violation(conn, EXS_PV_READ_DONE, EXS_CTRL_READ_DONE,
                                "message %llu: no announced send waits for it",
                                (unsigned long long)seq);
}

/* ---- receiving side ---- */

static struct exs_pending_msg *sp_pending_new(struct exs_conn *conn, int *err_p)
{
    struct exs_pending_msg *m = exs__seqpkt_pending_alloc(conn, err_p);

    if (!m)
        return NULL;
    m->seq = conn->rx_seq++;
    exs_list_add_tail(&conn->pending, &m->link);
    conn->pending_count++;
    return m;
}

int exs__seqpkt_on_announce_locked(struct exs_conn *conn, const struct exs_wire_announce *a)
{
    struct exs_pending_msg *m;
    int err;

    if (conn->seqpkt.reann_open && !conn->peer_shut) {
        if (be64toh(a->seq) < conn->seqpkt.reann_end)
            return exs__seqpkt_on_reannounce_locked(conn, a, be64toh(a->seq));
        err = exs__seqpkt_reann_close_locked(conn, EXS_CTRL_ANNOUNCE);
        if (err)
            return err;
    }
    if (conn->peer_shut || conn->seqpkt.rx_frag || be64toh(a->seq) != conn->rx_seq)
        return exs__proto_violation(
            conn, EXS_PV_ANNOUNCE, EXS_CTRL_ANNOUNCE, "message %llu, expected %llu%s%s",
            (unsigned long long)be64toh(a->seq), (unsigned long long)conn->rx_seq,
            conn->peer_shut ? ", after SHUTDOWN" : "",
            conn->seqpkt.rx_frag ? ", inside a fragmented message" : "");
    if (conn->pending_announced >= EXS_WIRE_ANNOUNCED_MAX)
        return exs__proto_violation(conn, EXS_PV_ANNOUNCED_MAX, EXS_CTRL_ANNOUNCE,
                                    "message %llu: %u announced pending already",
                                    (unsigned long long)conn->rx_seq, conn->pending_announced);
    m = sp_pending_new(conn, &err);
    if (!m)
        return err; /* -ENOBUFS (the budget) or -ENOMEM: not the peer's fault */
    m->announced = 1;
    conn->pending_announced++;
    m->addr = be64toh(a->addr);
    m->len = be32toh(a->len);
    m->rkey = be32toh(a->rkey);
    return 0;
}

/* The n-th (from 0) receive not yet matched to a message, or NULL. */
static struct exs_op *sp_nth_unmatched(struct exs_conn *conn, uint32_t n)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_QUEUED || op->state == EXS_OPS_ADVERTISED) {
            if (!n)
                return op;
            n--;
        }
    }
    return NULL;
}

/* The ring holding pending message m: the old path's (retired at a cut-over, §9.2)
 * while m arrived over it, else the current one. */
static const uint8_t *sp_ring_of(const struct exs_conn *conn, const struct exs_pending_msg *m)
{
    if (conn->autotune.old_mem && m->ring_end <= conn->autotune.old_end)
        return conn->autotune.old_mem->addr;
    return conn->ring;
}

/* Ring space given back up to end: the retired ring goes once all of it was read. */
static void sp_ring_consumed_locked(struct exs_conn *conn, uint64_t end)
{
    conn->rd_consumed = end;
    if (conn->autotune.old_mem && end >= conn->autotune.old_end) {
        exs__conn_ring_region_free(conn->autotune.old_mem);
        conn->autotune.old_mem = NULL;
        conn->autotune.old_size = 0;
    }
}

/* Receive op takes the eager message of len bytes at offset off of ring, which frees
 * the ring up to end: copied (cut to the receive), numbered seq, done. */
static void sp_take_eager_locked(struct exs_conn *conn, struct exs_op *op, const uint8_t *ring,
                                 uint64_t off, uint32_t len, uint64_t end, uint64_t seq)
{
    uint32_t n = (uint32_t)EXS_MIN((size_t)len, op->len);

    memcpy(op->buf, ring + off, n);
    op->rflags = len > op->len ? MSG_TRUNC : 0;
    op->seq = seq;
    sp_ring_consumed_locked(conn, end);
    conn->stats.bytes_received += n;
    exs__conn_op_finish_locked(op, n, 0);
}

/* A write of len bytes taking need ring bytes (its skip and slot) beyond the space free. */
static int sp_overrun(struct exs_conn *conn, uint32_t len, uint32_t need)
{
    return exs__proto_violation(
        conn, EXS_PV_RING_OVERRUN, EXS_PV_REC_WRITE, "%u bytes need %u, %llu of %u free", len, need,
        (unsigned long long)(conn->p.ring_size - (conn->rd_arrived - conn->rd_consumed)),
        conn->p.ring_size);
}

/* The record at ring offset off of a batched write ending at ring offset end (§6.1):
 * 0 and its payload length, or -EPROTO. The peer may rewrite its ring at any time, so a
 * record is checked again each time it is read. */
static int sp_batch_rec(struct exs_conn *conn, const uint8_t *ring, uint32_t off, uint32_t end,
                        uint32_t *len_p)
{
    struct exs_wire_batch_rec h;
    uint32_t len;

    if (end - off < EXS_WIRE_BATCH_REC_LEN)
        return exs__proto_violation(conn, EXS_PV_BATCH, EXS_PV_REC_WRITE,
                                    "record header cut: %u bytes left", end - off);
    memcpy(&h, ring + off, sizeof(h));
    len = be32toh(h.len);
    if (h.reserved || len >= conn->p.eager_max || exs_wire_batch_rec_size(len) > end - off)
        return exs__proto_violation(
            conn, EXS_PV_BATCH, EXS_PV_REC_WRITE, "record of %u bytes%s, %u left, eager_max %u",
            len, h.reserved ? " with reserved set" : "", end - off, conn->p.eager_max);
    *len_p = len;
    return 0;
}

/* A batched eager write of n messages and len bytes arrived: checked whole, it becomes
 * one pending entry that hands out its messages in order (no allocation per message). */
static int sp_on_batch_locked(struct exs_conn *conn, uint32_t n, uint32_t len)
{
    uint32_t size = conn->p.ring_size, skip, slot, off, end, count = 0;
    struct exs_pending_msg *m;
    int err;

    if (len > size)
        return exs__proto_violation(conn, EXS_PV_EAGER_SIZE, EXS_PV_REC_WRITE,
                                    "batched write of %u bytes, ring %u", len, size);
    sp_ring_place(conn->rd_arrived, size, len, &skip, &slot);
    if (conn->rd_arrived + skip + slot - conn->rd_consumed > size)
        return sp_overrun(conn, len, skip + slot);
    off = (uint32_t)exs__pos_mod(conn->rd_arrived + skip, size);
    end = off + len;
    for (uint32_t o = off, l; o < end; o += exs_wire_batch_rec_size(l), count++) {
        err = sp_batch_rec(conn, conn->ring, o, end, &l);
        if (err)
            return err;
    }
    if (count != n)
        return exs__proto_violation(conn, EXS_PV_BATCH, EXS_PV_REC_WRITE,
                                    "%u bytes hold %u messages, the tag says %u", len, count, n);
    m = sp_pending_new(conn, &err);
    if (!m)
        return err;        /* -ENOBUFS (the budget) or -ENOMEM: not the peer's fault */
    conn->rx_seq += n - 1; /* sp_pending_new numbered the first */
    conn->pending_count += n - 1;
    m->batch_left = n;
    m->addr = off;
    m->batch_end = end;
    conn->rd_arrived += skip + slot;
    m->ring_end = conn->rd_arrived;
    return 0;
}

/* Receive op just took a message at its arrival (below): it goes back to its owner here,
 * as the delivery of the pass after the run would hand it back first (spec/proto-layout.md,
 * "A receive handed back at the arrival"), when it is recvq's head, holds no grant, sendq
 * is empty (no send of the run can finish before the pass: the events come in the same
 * order), request tracing is off (its arrival is traced after this) and the run ends with
 * the event before the re-post (no resume request on trial, no RESUME awaited). Else
 * delivery hands it back as before. */
static inline void sp_taken_deliver_locked(struct exs_conn *conn, struct exs_op *op)
{
    if (conn->recvq.next != &op->link || op->grant || !exs_list_empty(&conn->sendq) ||
        (EXS_REQTRACE_ON && conn->rt) || conn->resume.pend || conn->resume.peer_wait)
        return;
    exs_list_del(&op->link);
    conn->rx_handed++;
    op->done(op);
}

int exs__seqpkt_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len)
{
    int ret;

    if (conn->peer_shut)
        return exs__proto_violation(conn, EXS_PV_DATA_AFTER_SHUTDOWN, EXS_PV_REC_WRITE,
                                    "immediate %#x, %u bytes", imm, len);
    if (conn->seqpkt.reann_open) {
        ret = exs__seqpkt_reann_close_locked(conn, EXS_PV_REC_WRITE);
        if (ret)
            return ret;
    }
    if (conn->seqpkt.rx_frag && exs_imm_kind(imm) != EXS_IMM_DIRECT)
        return exs__proto_violation(conn, EXS_PV_FRAG, EXS_PV_REC_WRITE,
                                    "message %llu not ended (no eom) when the next one came",
                                    (unsigned long long)conn->rx_seq);
    if (exs_imm_kind(imm) == EXS_IMM_INDIRECT && exs_imm_tag(imm))
        return sp_on_batch_locked(conn, exs_imm_tag(imm), len);
    if (exs_imm_kind(imm) == EXS_IMM_INDIRECT) {
        uint32_t size = conn->p.ring_size, skip, slot;
        struct exs_pending_msg *m;
        int err;

        if (len >= conn->p.eager_max)
            return exs__proto_violation(conn, EXS_PV_EAGER_SIZE, EXS_PV_REC_WRITE,
                                        "%u bytes, eager_max %u", len, conn->p.eager_max);
        sp_ring_place(conn->rd_arrived, size, len, &skip, &slot);
        if (conn->rd_arrived + skip + slot - conn->rd_consumed > size)
            return sp_overrun(conn, len, skip + slot);
        if (exs_list_empty(&conn->pending) && conn->state == EXS_CONN_CONNECTED) {
            /* no earlier message waits: the first receive not matched yet takes it now,
             * as the kick's receive side would (no pending entry; spec/proto-layout.md,
             * "A message taken at its arrival") */
            struct exs_op *op = sp_nth_unmatched(conn, 0);

            if (op) {
                uint64_t off = exs__pos_mod(conn->rd_arrived + skip, size);

                conn->rd_arrived += skip + slot;
                conn->rx_matched++;
                conn->rx_taken++;
                sp_take_eager_locked(conn, op, conn->ring, off, len, conn->rd_arrived,
                                     conn->rx_seq++);
                sp_taken_deliver_locked(conn, op);
                return 0;
            }
        }
        m = sp_pending_new(conn, &err);
        if (!m)
            return err; /* -ENOBUFS (the budget) or -ENOMEM: not the peer's fault */
        conn->rd_arrived += skip;
        m->addr = exs__pos_mod(conn->rd_arrived, size);
        m->len = len;
        conn->rd_arrived += slot;
        m->ring_end = conn->rd_arrived;
        return 0;
    }
    if (exs_imm_kind(imm) != EXS_IMM_DIRECT)
        return exs__proto_violation(conn, EXS_PV_IMM_KIND, EXS_PV_REC_WRITE, "immediate %#x", imm);
    /* direct: into the advertised receive this message number belongs to. Messages
     * that arrived before it and wait for their receives (announced ones wait while
     * READs are throttled) take the unmatched receives ahead of it. */
    struct exs_op *op = sp_nth_unmatched(conn, conn->pending_count);
    if (!op || op->state != EXS_OPS_ADVERTISED ||
        (op->advert_id & EXS_IMM_TAG_MASK) != exs_imm_tag(imm) || op->seq != conn->rx_seq ||
        len > op->len - op->filled || (conn->seqpkt.rx_frag && conn->seqpkt.rx_frag != op))
        return exs__proto_violation(conn, EXS_PV_DIRECT, EXS_PV_REC_WRITE,
                                    "tag %u, %u bytes, message %llu: receive state %d, advert %u, "
                                    "message %llu, %u pending",
                                    exs_imm_tag(imm), len, (unsigned long long)conn->rx_seq,
                                    op ? (int)op->state : -1, op ? op->advert_id : 0,
                                    op ? (unsigned long long)op->seq : 0ull, conn->pending_count);
    if (!(imm & EXS_IMM_EOM)) {
        /* a piece (§6.2): more of the message follows, into the same receive; a piece
         * moves at least one byte (else a peer could send pieces forever) */
        if (!len || (imm & EXS_IMM_TRUNC))
            return exs__proto_violation(
                conn, EXS_PV_FRAG, EXS_PV_REC_WRITE, "piece of %u bytes%s of message %llu", len,
                imm & EXS_IMM_TRUNC ? " with trunc" : "", (unsigned long long)conn->rx_seq);
        op->filled += len;
        conn->seqpkt.rx_frag = op;
        conn->stats.bytes_received += len;
        return 0;
    }
    conn->seqpkt.rx_frag = NULL;
    conn->rx_seq++;
    conn->rx_matched++;
    op->rflags = (imm & EXS_IMM_TRUNC) ? MSG_TRUNC : 0;
    conn->stats.bytes_received += len;
    exs__conn_op_finish_locked(op, (ssize_t)(op->filled + len), 0);
    return 0;
}

/* Bytes the READs of receive op read: the announced message, cut to the receive. */
static uint32_t sp_read_len(const struct exs_op *op)
{
    return (uint32_t)EXS_MIN((size_t)op->msg_len, op->len);
}

/* Post the next READ pieces of the receive being read (§6.2) while fewer than max_reads
 * READs are in flight or owe their READ_DONE: each reads at most rd_piece bytes at the
 * next offset of the announced buffer into the same offset of the receive. Pieces are
 * posted in order, and the next message's READs start only after the last piece of
 * this one, so messages complete in order (READs complete in posting order). */
static void sp_read_post_locked(struct exs_conn *conn)
{
    struct exs_op *op;

    while ((op = conn->seqpkt.rd_op) && conn->state == EXS_CONN_CONNECTED &&
           conn->reads + conn->rd_owed_count < conn->p.max_reads) {
        uint32_t n = sp_read_len(op), off = (uint32_t)op->posted;
        uint32_t lw = EXS_MIN(op->rd_piece, n - off);
        struct exs_prov_sge sge = {(uintptr_t)(op->buf + off), lw, op->lkey};
        struct exs_prov_send_wr wr = {
            .wr_id = WR_ID(WR_TAG_READ, (uintptr_t)op),
            .opcode = EXS_PROV_WR_RDMA_READ,
            .flags = EXS_PROV_SEND_SIGNALED,
            .sg_list = &sge,
            .num_sge = lw ? 1 : 0,
            .remote_addr = conn->seqpkt.rd_addr + off,
            .rkey = conn->seqpkt.rd_rkey,
        };
        if (exs__conn_post_send_locked(conn, &wr)) {
            exs__conn_fail_locked(conn, ECONNRESET, "read failed");
            return;
        }
        conn->wr_out++;
        conn->reads++;
        op->inflight++;
        op->posted += lw;
        if (n > op->rd_piece)
            conn->stats.fragments++;
        if (op->posted == n) {
            conn->seqpkt.rd_op = NULL;
            EXS_TRACE(PROTO, "conn %p: message %llu: %u bytes read in pieces of %u", (void *)conn,
                      (unsigned long long)op->seq, n, op->rd_piece);
        }
    }
}

/* A READ (piece) of receive op completed successfully. The receive completes with its
 * last piece, when every piece read its bytes; then READ_DONE frees the sender's
 * buffer. A piece that failed took the connection down: the op ends with it. */
void exs__seqpkt_on_read_cqe_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_wire_read_done d = {
        .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
        .seq = htobe64(op->seq),
    };
    uint32_t n = sp_read_len(op);

    EXS_ASSERT(op->inflight > 0 && op->state == EXS_OPS_POSTED);
    op->inflight--;
    /* pieces complete in posting order, each rd_piece bytes but the last */
    op->filled += EXS_MIN((size_t)op->rd_piece, n - op->filled);
    if (op->inflight)
        return;
    if (op == conn->seqpkt.rd_op || op->filled != n) {
        /* pieces not posted yet (CONNECTED: the next ones go in the next progress), or
         * one failed or will never be posted (going away: it ends with the conn, a
         * cancelled one now, as a send whose last write completed) */
        if (op->cancel && conn->state >= EXS_CONN_DOWN) {
            if (conn->seqpkt.rd_op == op)
                conn->seqpkt.rd_op = NULL;
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
        return;
    }
    op->rflags = op->msg_len > op->len ? MSG_TRUNC : 0;
    conn->stats.bytes_received += n;
    conn->stats.direct_xfers++;
    exs__conn_op_finish_locked(op, n, 0);
    exs__seqpkt_memo_add_locked(conn, op->seq);
    /* the sender's buffer is free now: tell it (owed if the batch is full; the owed
     * list is bounded because no READ starts while reads + owed reach max_reads) */
    if (conn->rd_owed_count == 0 && !exs__conn_ctrl_room_locked(conn, sizeof(d)))
        exs__conn_ctrl_flush_locked(conn);
    if (conn->rd_owed_count == 0 && exs__conn_ctrl_room_locked(conn, sizeof(d)))
        exs__conn_ctrl_append_locked(conn, &d, sizeof(d));
    else
        conn->rd_owed[conn->rd_owed_count++] = op->seq;
}

/* Append the READ_DONE records that did not fit earlier, oldest first. */
static void sp_flush_read_done_locked(struct exs_conn *conn)
{
    uint32_t n = 0;

    while (n < conn->rd_owed_count && exs__conn_ctrl_room_locked(conn, EXS_WIRE_READ_DONE_LEN)) {
        struct exs_wire_read_done d = {
            .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
            .seq = htobe64(conn->rd_owed[n]),
        };
        exs__conn_ctrl_append_locked(conn, &d, sizeof(d));
        n++;
    }
    memmove(conn->rd_owed, conn->rd_owed + n, (conn->rd_owed_count - n) * sizeof(uint64_t));
    conn->rd_owed_count -= n;
}

/* Give the head unmatched receive the head pending message. 1 done, 0 when it must
 * wait, -1 when the message was bad (the entry is dropped and the connection fails). */
static int sp_match_locked(struct exs_conn *conn, struct exs_op *op, struct exs_pending_msg *m)
{
    if (m->announced && m->stale)
        return 0; /* its grant died at a cut: it waits to be announced again (§9.2) */
    if (m->announced) {
        /* at most max_reads READs (§6.2); the pieces of the previous message stop only
         * there, so they are all posted before this message's first */
        if (conn->reads + conn->rd_owed_count >= conn->p.max_reads)
            return 0;
        EXS_ASSERT(!conn->seqpkt.rd_op);
        op->msg_len = m->len;
        op->seq = m->seq;
        op->posted = 0;
        op->filled = 0;
        op->inflight = 0;
        op->rd_piece = exs__conn_frag_size();
        op->state = EXS_OPS_POSTED;
        conn->seqpkt.rd_op = op;
        conn->seqpkt.rd_addr = m->addr;
        conn->seqpkt.rd_rkey = m->rkey;
        sp_read_post_locked(conn);
        if (!op->inflight) {
            /* not even the first piece went: the connection failed, the message
             * stays pending and the receive queued, as before any READ */
            EXS_ASSERT(conn->state != EXS_CONN_CONNECTED);
            conn->seqpkt.rd_op = NULL;
            op->state = EXS_OPS_QUEUED;
            return 0;
        }
    } else if (m->batch_left) {
        uint32_t len, n;

        if (sp_batch_rec(conn, sp_ring_of(conn, m), (uint32_t)m->addr, m->batch_end, &len)) {
            /* rewritten since it arrived: the peer broke the protocol */
            exs__conn_fail_locked(conn, ECONNRESET, "batched write changed in the ring");
            conn->pending_count -= m->batch_left;
            exs_list_del(&m->link);
            sp_pending_free(conn, m);
            return -1;
        }
        n = (uint32_t)EXS_MIN((size_t)len, op->len);
        memcpy(op->buf, sp_ring_of(conn, m) + m->addr + EXS_WIRE_BATCH_REC_LEN, n);
        op->rflags = len > op->len ? MSG_TRUNC : 0;
        op->seq = m->seq++;
        conn->stats.bytes_received += n;
        exs__conn_op_finish_locked(op, n, 0);
        conn->pending_count--;
        conn->rx_matched++;
        m->addr += exs_wire_batch_rec_size(len);
        if (--m->batch_left)
            return 1;                               /* more messages in this write */
        sp_ring_consumed_locked(conn, m->ring_end); /* the space goes back with the last */
        exs_list_del(&m->link);
        sp_pending_free(conn, m);
        return 1;
    } else {
        sp_take_eager_locked(conn, op, sp_ring_of(conn, m), m->addr, m->len, m->ring_end, m->seq);
    }
    exs_list_del(&m->link);
    conn->pending_count--;
    conn->pending_announced -= m->announced;
    conn->rx_matched++;
    sp_pending_free(conn, m);
    return 1;
}

static __attribute__((noinline)) void sp_recv_progress_locked(struct exs_conn *conn)
{
    struct exs_list *pos;
    uint64_t index = 0;
    uint32_t advertised = 0;

    if (conn->rd_owed_count) {
        sp_flush_read_done_locked(conn);
        if (conn->rd_owed_count && exs__conn_ctrl_flush_locked(conn))
            sp_flush_read_done_locked(conn);
    }
    if (conn->seqpkt.memo_owed)
        exs__seqpkt_memo_flush_locked(conn);
    if (conn->seqpkt.rd_op) {
        sp_read_post_locked(conn);
        if (conn->state != EXS_CONN_CONNECTED)
            return;
    }
    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state != EXS_OPS_QUEUED && op->state != EXS_OPS_ADVERTISED)
            continue;
        if (!exs_list_empty(&conn->pending)) {
            struct exs_pending_msg *m =
                exs_list_entry(conn->pending.next, struct exs_pending_msg, link);

            if (sp_match_locked(conn, op, m) <= 0)
                return;
            if (conn->state != EXS_CONN_CONNECTED)
                return; /* a later READ piece failed to post: the conn is going away */
            continue;
        }
        if (conn->peer_shut && conn->rx_seq == conn->peer_total) {
            exs__conn_op_finish_locked(op, 0, 0); /* end of stream */
            continue;
        }
        if (op->state == EXS_OPS_ADVERTISED)
            advertised++;
        /* advertise it: it will take message rx_seq + index (§6), unless ADVERTS_MAX
         * receives are advertised already (the sender would hold too many) */
        if (op->state == EXS_OPS_QUEUED && advertised >= EXS_WIRE_ADVERTS_MAX)
            return;
        if (op->state == EXS_OPS_QUEUED && op->len >= conn->p.eager_max &&
            conn->p.xfer_mode != EXS_XFER_INDIRECT_ONLY && op->len <= UINT32_MAX) {
            if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ADVERT_LEN) &&
                !exs__conn_ctrl_flush_locked(conn))
                return;
            if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ADVERT_LEN))
                return;
            /* the peer may WRITE exactly this buffer until the receive completes */
            if (exs__conn_grant_op_locked(conn, op, EXS_PROV_ACCESS_REMOTE_WRITE)) {
                exs__conn_fail_locked(conn, ECONNRESET, "advert grant failed");
                return;
            }
            op->advert_id = conn->next_advert_id++;
            op->seq = conn->rx_seq + index;
            struct exs_wire_advert a = {
                .hdr = {.type = EXS_CTRL_ADVERT, .len = htobe16(EXS_WIRE_ADVERT_LEN)},
                .addr = htobe64((uintptr_t)op->buf),
                .len = htobe32((uint32_t)op->len),
                .rkey = htobe32(op->rkey),
                .seq = htobe64(op->seq),
                .phase = 0,
                .id = htobe32(op->advert_id),
            };
            exs__conn_ctrl_append_locked(conn, &a, sizeof(a));
            op->state = EXS_OPS_ADVERTISED;
            advertised++;
            conn->stats.adverts_sent++;
        }
        index++;
    }
}

/* The receive side's pass. Its quick answer, a leaf (no frame to build): nothing for the
 * pass to do (exs__seqpkt_rx_idle, seqpkt.h), when it would only count the receives
 * (every kick asks; in a ping-pong the arrival's, which finds its receive taken at the
 * arrival; the receive post asks exs__seqpkt_rx_idle itself). */
void exs__seqpkt_recv_progress_locked(struct exs_conn *conn)
{
    if (conn->state != EXS_CONN_CONNECTED || exs__seqpkt_rx_idle(conn))
        return;
    sp_recv_progress_locked(conn);
}

/* The connection is over: hand the eager messages still in the ring to receives in
 * order (announced ones can no longer be read: their sends were cancelled), then end
 * of stream after an orderly SHUTDOWN, else the connection's error. */
void exs__seqpkt_dead_drain_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);
        struct exs_pending_msg *m;

        if (op->state == EXS_OPS_DONE)
            continue;
        m = exs_list_empty(&conn->pending)
                ? NULL
                : exs_list_entry(conn->pending.next, struct exs_pending_msg, link);
        if (op->cancel)
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        else if (m && m->announced) {
            /* it can no longer be read: the receive it numbers ends with the error, the
             * next receive takes the next message (message k always ends the k-th
             * receive, §6; none is handed a later message in place of a lost one) */
            exs_list_del(&m->link);
            conn->pending_count--;
            conn->pending_announced--;
            sp_pending_free(conn, m);
            exs__conn_op_finish_locked(op, -1, conn->err ? conn->err : ECONNRESET);
        } else if (m) {
            if (sp_match_locked(
                    conn, op, exs_list_entry(conn->pending.next, struct exs_pending_msg, link)) < 0)
                exs__conn_op_finish_locked(op, -1, ECONNRESET);
        } else if (conn->peer_shut)
            exs__conn_op_finish_locked(op, 0, 0);
        else
            exs__conn_op_finish_locked(op, -1, conn->err ? conn->err : ECONNRESET);
    }
}

/* The memory the SEQPACKET data path holds: batching's staging, the pending messages and
 * the memo. */
static void sp_release(struct exs_conn *conn)
{
    exs__batch_release_locked(conn);
    exs__seqpkt_free_pending_locked(conn);
}

const struct exs_datapath exs__seqpkt_path = {
    .name = "SEQPACKET",
    .on_advert = exs__seqpkt_on_advert_locked,
    .on_announce = exs__seqpkt_on_announce_locked,
    .on_read_done = exs__seqpkt_on_read_done_locked,
    .on_data = exs__seqpkt_on_data_locked,
    .on_read_cqe = exs__seqpkt_on_read_cqe_locked,
    .recv_progress = exs__seqpkt_recv_progress_locked,
    .send_progress = exs__seqpkt_send_progress_locked,
    .dead_drain = exs__seqpkt_dead_drain_locked,
    .post_fast = sp_post_fast,
    .release = sp_release,
};
