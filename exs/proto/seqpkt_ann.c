/* SPDX-License-Identifier: MIT */
/* SEQPACKET announced messages (spec/protocol.md §6, §9.2 Replay, SEQPACKET): the
 * ANNOUNCE record, pending entries' memory, and across a cut-over the receiver's memo of
 * messages read whole, the re-announce window and the sender's re-announces. Layer 2 of
 * spec/proto-layout.md, below seqpacket.c (which calls it, never the reverse). */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/* A pending message entry, charged to the memory account (§9.3): one the connection kept
 * (sp_pending_free: charged already), else a new one; NULL when the budget is reached
 * (*err_p -ENOBUFS: the connection ends) or out of memory (-ENOMEM). */
struct exs_pending_msg *exs__seqpkt_pending_alloc(struct exs_conn *conn, int *err_p)
{
    struct exs_pending_msg *m;
    struct exs_list *kept;

    *err_p = 0;
    if (EXS_UNLIKELY(exs__proto_seams.pending_nomem)) {
        exs__proto_seams.pending_nomem--; /* test seam (violation.h) */
        *err_p = -ENOMEM;
        return NULL;
    }
    if ((kept = exs_list_pop_head(&conn->pending_free))) {
        conn->pending_free_n--;
        m = exs_list_entry(kept, struct exs_pending_msg, link);
        memset(m, 0, sizeof(*m));
        return m;
    }
    *err_p = exs__conn_mem_take_locked(conn, exs__mem_chunk(sizeof(*m)), EXS_MEM_OTHER);
    if (*err_p)
        return NULL;
    m = calloc(1, sizeof(*m));
    if (!m) {
        exs__conn_mem_give_locked(conn, exs__mem_chunk(sizeof(*m)));
        *err_p = -ENOMEM;
    }
    return m;
}

/* Bytes of the remembered-reads array (§9.2) of cap entries. */
uint64_t exs__seqpkt_memo_bytes(uint32_t cap)
{
    return exs__mem_chunk(cap * sizeof(uint64_t));
}

/* Append the ANNOUNCE of send op as message seq (room checked by the caller), with a
 * grant of its buffer: the peer may READ exactly this buffer until its READ_DONE. 0, or
 * -errno when the grant failed (the connection fails). */
int exs__seqpkt_announce_locked(struct exs_conn *conn, struct exs_op *op, uint64_t seq)
{
    int ret = exs__conn_grant_op_locked(conn, op, EXS_PROV_ACCESS_REMOTE_READ);

    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET, "announce grant failed");
        return ret;
    }
    struct exs_wire_announce a = {
        .hdr = {.type = EXS_CTRL_ANNOUNCE, .len = htobe16(EXS_WIRE_ANNOUNCE_LEN)},
        .addr = htobe64((uintptr_t)op->buf),
        .len = htobe32((uint32_t)op->len),
        .rkey = htobe32(op->rkey),
        .seq = htobe64(seq),
    };
    exs__conn_ctrl_append_locked(conn, &a, sizeof(a));
    return 0;
}

/* Sender, applying the peer's RESUME (§9.2, Replay, SEQPACKET): announced send op, whose
 * ANNOUNCE arrived (seq below the peer's position) and whose READ_DONE did not, stays
 * POSTED and is announced again on the new path, before anything else moves. */
void exs__seqpkt_resume_reann_mark_locked(struct exs_conn *conn, struct exs_op *op)
{
    op->announced = 0; /* until announced again: no READ_DONE completes it */
    op->inflight = 0;
    op->posted = 0;
    conn->seqpkt.reann_left++;
}

/* Announce again, in message order, every send marked by exs__seqpkt_resume_reann_mark_locked,
 * each with a new grant on the new path's endpoint (the old one died with the old path).
 * 1 when all went (the send queue goes on), 0 when one waits for control room. */
int exs__seqpkt_reannounce_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (!conn->seqpkt.reann_left)
            break;
        if (op->kind != EXS_OP_SEND || op->state != EXS_OPS_POSTED || op->announced ||
            op->seq >= conn->seqpkt.reann_pos)
            continue;
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ANNOUNCE_LEN) &&
            !exs__conn_ctrl_flush_locked(conn))
            return 0;
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_ANNOUNCE_LEN))
            return 0;
        exs__conn_revoke_op_locked(op); /* a grant of the old path (none after a switch) */
        if (exs__seqpkt_announce_locked(conn, op, op->seq))
            return 0;
        op->announced = 1;
        conn->seqpkt.reann_left--;
        EXS_DBG(PROTO, "conn %p: message %llu: announced again, %zu bytes", (void *)conn,
                (unsigned long long)op->seq, op->len);
    }
    EXS_ASSERT(!conn->seqpkt.reann_left);
    return 1;
}

#define SP_MEMO_OWED (1ull << 63) /* a memo entry's READ_DONE is owed to a re-announce */
#define SP_MEMO_GONE UINT64_MAX   /* a memo entry answered: never again */

/* A resumable receiver read announced message seq whole: remember it, so that a
 * re-announce after a cut (its READ_DONE lost with the old path) is answered with a
 * READ_DONE and no READ (§9.2). The oldest entry goes when the memo is full: its bound
 * covers every READ_DONE that can be unsent or unprocessed when a path fails. Nothing
 * is added after the cut (one cut per connection). */
void exs__seqpkt_memo_add_locked(struct exs_conn *conn, uint64_t seq)
{
    /* until the cut is over: on the new path nothing is cut again, and an entry whose
     * READ_DONE is owed to a re-announce is never overwritten */
    if (!conn->sess_token || (conn->resume.over && conn->state != EXS_CONN_RESUMING))
        return;
    if (!conn->seqpkt.memo) {
        if (!conn->seqpkt.memo_cap)
            conn->seqpkt.memo_cap = conn->p.max_reads + (conn->tx_slots + 1 + conn->peer.credits) *
                                                            EXS_SEQPKT_RDONE_PER_SEND;
        if (exs__conn_mem_take_locked(conn, exs__seqpkt_memo_bytes(conn->seqpkt.memo_cap),
                                      EXS_MEM_OTHER)) {
            EXS_INFO(PROTO,
                     "conn %p: memory budget reached: announced messages read are not "
                     "remembered",
                     (void *)conn);
            return; /* as out of memory, below */
        }
        conn->seqpkt.memo = calloc(conn->seqpkt.memo_cap, sizeof(*conn->seqpkt.memo));
        if (!conn->seqpkt.memo) {
            /* a later re-announce of it is refused: the connection ends then */
            EXS_WARN(PROTO, "conn %p: no memory to remember announced messages read", (void *)conn);
            exs__conn_mem_give_locked(conn, exs__seqpkt_memo_bytes(conn->seqpkt.memo_cap));
            return;
        }
    }
    conn->seqpkt.memo[conn->seqpkt.memo_head] = seq;
    conn->seqpkt.memo_head = (conn->seqpkt.memo_head + 1) % conn->seqpkt.memo_cap;
    if (conn->seqpkt.memo_n < conn->seqpkt.memo_cap)
        conn->seqpkt.memo_n++;
}

/* The memo entry of message seq, or NULL. */
static uint64_t *sp_memo_find(struct exs_conn *conn, uint64_t seq)
{
    for (uint32_t i = 0; i < conn->seqpkt.memo_n; i++)
        if (conn->seqpkt.memo[i] == seq)
            return &conn->seqpkt.memo[i];
    return NULL;
}

/* Append the READ_DONEs owed to re-announces while the control batch has room. */
void exs__seqpkt_memo_flush_locked(struct exs_conn *conn)
{
    for (uint32_t i = 0; i < conn->seqpkt.memo_n && conn->seqpkt.memo_owed; i++) {
        struct exs_wire_read_done d = {
            .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
        };

        if (conn->seqpkt.memo[i] == SP_MEMO_GONE || !(conn->seqpkt.memo[i] & SP_MEMO_OWED))
            continue;
        if (!exs__conn_ctrl_room_locked(conn, sizeof(d)) && !exs__conn_ctrl_flush_locked(conn))
            return;
        if (!exs__conn_ctrl_room_locked(conn, sizeof(d)))
            return;
        d.seq = htobe64(conn->seqpkt.memo[i] & ~SP_MEMO_OWED);
        exs__conn_ctrl_append_locked(conn, &d, sizeof(d));
        conn->seqpkt.memo[i] = SP_MEMO_GONE;
        conn->seqpkt.memo_owed--;
    }
}

/* Receiver, at a cut over (§9.2, Replay, SEQPACKET), once the old path is over: every
 * announced message that arrived and was not read whole has lost its grant with the old
 * endpoint. A receive whose READs did not all complete (flushed, or in flight on an
 * abandoned endpoint) gives its message back, first in the pending list, and waits for
 * it again, to be read from offset 0 (its bytes were not counted); every pending
 * announced message becomes stale until the sender announces it again. READ_DONEs not
 * yet appended are forgotten: each is answered again to its re-announce (the memo).
 * Opens the re-announce window. The stale messages, or UINT32_MAX when out of memory. */
uint32_t exs__seqpkt_resume_cut_locked(struct exs_conn *conn)
{
    struct exs_list back, *pos, *n;
    int nomem = 0, err;

    exs_list_init(&back);
    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);
        struct exs_pending_msg *m;

        if (op->state != EXS_OPS_POSTED)
            continue; /* only a receive reading an announced message is POSTED */
        m = exs__seqpkt_pending_alloc(conn, &err);
        if (!m) {
            nomem = 1; /* the cut-over fails: the connection ends (what was given back
                        * is pending, the rest ends with it) */
            break;
        }
        m->announced = 1;
        m->seq = op->seq;
        m->len = op->msg_len;
        exs_list_add_tail(&back, &m->link);
        conn->pending_count++;
        conn->pending_announced++;
        conn->rx_matched--;
        op->state = EXS_OPS_QUEUED;
        op->posted = op->filled = 0;
        op->inflight = 0;
        op->msg_len = 0;
    }
    /* in message order, before the messages still pending (they came after) */
    for (pos = back.prev; pos != &back; pos = n) {
        n = pos->prev;
        exs_list_del(pos);
        exs_list_add_head(&conn->pending, pos);
    }
    conn->seqpkt.rd_op = NULL;
    conn->reads = 0;
    conn->seqpkt.stale = 0;
    exs_list_for_each(pos, &conn->pending)
    {
        struct exs_pending_msg *m = exs_list_entry(pos, struct exs_pending_msg, link);

        if (m->announced) {
            m->stale = 1;
            m->addr = 0;
            m->rkey = 0;
            conn->seqpkt.stale++;
        }
    }
    conn->rd_owed_count = 0;
    conn->seqpkt.reann_open = 1;
    conn->seqpkt.reann_end = conn->rx_seq;
    conn->seqpkt.reann_next = 0;
    return nomem ? UINT32_MAX : conn->seqpkt.stale;
}

/* A message at or past the cut's position arrived: the re-announce window closes. Every
 * stale message must have been announced again before it (the sender announces them
 * first): one still stale means the peer broke the protocol. 0 or -EPROTO. */
int exs__seqpkt_reann_close_locked(struct exs_conn *conn, unsigned rec_type)
{
    conn->seqpkt.reann_open = 0;
    if (!conn->seqpkt.stale)
        return 0;
    return exs__proto_violation(conn, EXS_PV_REANNOUNCE, rec_type,
                                "message %llu came before %u of the cut were announced again",
                                (unsigned long long)conn->rx_seq, conn->seqpkt.stale);
}

/* An ANNOUNCE of message seq below the cut's position (§9.2): in the window, in
 * increasing order, of a stale message (it gets the new grant and is read when its
 * receive comes) or of one read whole (remembered: answered with one READ_DONE, no
 * READ). Anything else: -EPROTO. */
int exs__seqpkt_on_reannounce_locked(struct exs_conn *conn, const struct exs_wire_announce *a,
                                     uint64_t seq)
{
    struct exs_list *pos;
    uint64_t *e;

    if (seq < conn->seqpkt.reann_next)
        return exs__proto_violation(
            conn, EXS_PV_REANNOUNCE, EXS_CTRL_ANNOUNCE, "message %llu announced again after %llu",
            (unsigned long long)seq, (unsigned long long)conn->seqpkt.reann_next - 1);
    exs_list_for_each(pos, &conn->pending)
    {
        struct exs_pending_msg *m = exs_list_entry(pos, struct exs_pending_msg, link);

        if (m->seq > seq)
            break;
        if (m->seq != seq || !m->announced || !m->stale)
            continue;
        if (be32toh(a->len) != m->len)
            return exs__proto_violation(conn, EXS_PV_REANNOUNCE, EXS_CTRL_ANNOUNCE,
                                        "message %llu announced again with %u bytes, not %u",
                                        (unsigned long long)seq, be32toh(a->len), m->len);
        m->addr = be64toh(a->addr);
        m->rkey = be32toh(a->rkey);
        m->stale = 0;
        conn->seqpkt.stale--;
        conn->seqpkt.reann_next = seq + 1;
        return 0;
    }
    e = conn->seqpkt.memo ? sp_memo_find(conn, seq) : NULL;
    if (!e)
        return exs__proto_violation(conn, EXS_PV_REANNOUNCE, EXS_CTRL_ANNOUNCE,
                                    "message %llu announced again: neither unread at the cut "
                                    "nor remembered read",
                                    (unsigned long long)seq);
    *e |= SP_MEMO_OWED; /* its READ_DONE is appended by the next progress */
    conn->seqpkt.memo_owed++;
    conn->seqpkt.reann_next = seq + 1;
    return 0;
}
