/* SPDX-License-Identifier: MIT */
/* The SEQPACKET data path (seqpacket.c, spec/protocol.md §6). */
#ifndef EXS_PROTO_SEQPKT_H
#include "exs/proto/proto.h" /* first: it takes the state part below (EXS_PROTO_STATE) */
#endif

#if defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_SEQPKT_H_STATE)
#define EXS_PROTO_SEQPKT_H_STATE
/* SEQPACKET (spec/protocol.md §6, §9.2; seqpacket.c, seqpkt_ann.c): its part of struct exs_conn
 * (conn->seqpkt). */
struct exs_seqpkt_state {
    /* fragmentation (spec/protocol.md §6.2) */
    struct exs_op *frag_op;     /* SEQPACKET send whose direct pieces are not all
                                 * posted: nothing after it leaves before them */
    struct exs_advert frag_adv; /* the ADVERT it fills */
    uint32_t frag_n;            /* bytes it writes (min(message, advert)) */
    struct exs_op *rx_frag;     /* SEQPACKET receive that got pieces, no eom yet */
    struct exs_op *rd_op;       /* receive whose READ pieces are not all posted:
                                 * no later message is read before them */
    uint64_t rd_addr;           /* its announced buffer (the peer's address) */
    uint32_t rd_rkey;           /* and key */
    /* SEQPACKET announced messages across a cut (spec/protocol.md §9.2, Replay,
     * SEQPACKET; seqpacket.c) */
    uint64_t *memo;      /* receiver, resumable: the last announced
                          * messages read whole (ring of seqs; a set top
                          * bit: its READ_DONE is owed again) */
    uint32_t memo_cap;   /* its entries (0: its bound at the
                          * first; tests lower it before) */
    uint32_t memo_n;     /* entries used */
    uint32_t memo_head;  /* the next entry written */
    uint32_t memo_owed;  /* READ_DONEs owed to re-announces */
    int reann_open;      /* receiver: the re-announce window is open */
    uint64_t reann_end;  /* receiver: rx_seq at the cut (the window's end) */
    uint64_t reann_next; /* receiver: lowest seq a re-announce may name */
    uint32_t stale;      /* receiver: announced messages whose grant died
                          * at the cut, not announced again yet */
    uint32_t reann_left; /* sender: announced sends to announce again */
    uint32_t ann_out;    /* sender: announced sends whose READ_DONE did
                          * not come (at least; recounted at the
                          * ANNOUNCED_MAX cap, §6) */
    uint64_t reann_pos;  /* sender: the peer's position P at the cut */
};
#endif

#if !defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_SEQPKT_H)
#define EXS_PROTO_SEQPKT_H

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"

/* An arrived SEQPACKET message not yet matched to a receive. */
/* Message entries a connection keeps for reuse (exs_conn.pending_free). */
#define EXS_PENDING_KEEP 8u

struct exs_pending_msg {
    struct exs_list link;
    int announced; /* 1: waits at the sender for a READ; 0: eager in our ring */
    uint64_t seq;
    uint64_t addr; /* announced: sender buffer; eager: ring offset */
    uint32_t len;
    uint32_t rkey;
    uint64_t ring_end;   /* eager: rd_consumed once this message is copied out */
    uint32_t batch_left; /* batched write (§6.1): its messages not yet matched (addr is
                          * then the ring offset of the next record); 0: one message */
    uint32_t batch_end;  /* batched write: ring offset just past its last record */
    int stale;           /* announced, its grant died at a cut (§9.2): waits for the
                          * sender to announce it again */
};

void exs__seqpkt_send_progress_locked(struct exs_conn *conn);
void exs__seqpkt_recv_progress_locked(struct exs_conn *conn);

/* The receive side's pass would only count the receives (its quick answer,
 * exs__seqpkt_recv_progress_locked): no READ_DONE or remembered read owed, no READ to
 * post, no message waiting, no SHUTDOWN seen, and no receive waiting that would be
 * advertised (one of eager_max bytes or more, still QUEUED). Inline: that pass asks it,
 * and so does every SEQPACKET receive post (exs__conn_post, spec/proto-layout.md, "A
 * receive posted with nothing to place"). */
static inline int exs__seqpkt_rx_idle(const struct exs_conn *conn)
{
    const struct exs_list *pos;

    if (conn->rd_owed_count || conn->seqpkt.memo_owed || conn->seqpkt.rd_op ||
        !exs_list_empty(&conn->pending) || conn->peer_shut)
        return 0;
    for (pos = conn->recvq.next; pos != &conn->recvq; pos = pos->next) {
        const struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_QUEUED && op->len >= conn->p.eager_max)
            return 0;
    }
    return 1;
}
int exs__seqpkt_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len);
int exs__seqpkt_on_announce_locked(struct exs_conn *conn, const struct exs_wire_announce *a);
int exs__seqpkt_on_read_done_locked(struct exs_conn *conn, uint64_t seq);
int exs__seqpkt_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a);
void exs__seqpkt_on_read_cqe_locked(struct exs_conn *conn, struct exs_op *op);
void exs__seqpkt_free_pending_locked(struct exs_conn *conn);
void exs__seqpkt_dead_drain_locked(struct exs_conn *conn);
uint32_t exs__seqpkt_resume_cut_locked(struct exs_conn *conn);
void exs__seqpkt_resume_reann_mark_locked(struct exs_conn *conn, struct exs_op *op);
/* Ring bytes an eager message of len bytes occupies: whole slots, at least one. */
static inline uint32_t exs__seqpkt_slot_len(uint32_t len)
{
    uint32_t n = (len + EXS_RING_SLOT - 1) / EXS_RING_SLOT * EXS_RING_SLOT;

    return n ? n : EXS_RING_SLOT;
}

/* Shared by seqpacket.c and seqpkt_ann.c */
/* A pending message entry, charged to the memory account (§9.3): NULL when the budget is
 * reached (*err_p -ENOBUFS: the connection ends) or out of memory (-ENOMEM). */
struct exs_pending_msg *exs__seqpkt_pending_alloc(struct exs_conn *conn, int *err_p);
/* Bytes of the remembered-reads array (§9.2) of cap entries. */
uint64_t exs__seqpkt_memo_bytes(uint32_t cap);
/* Append the ANNOUNCE of send op as message seq (room checked by the caller), with a
 * grant of its buffer: the peer may READ exactly this buffer until its READ_DONE. 0, or
 * -errno when the grant failed (the connection fails). */
int exs__seqpkt_announce_locked(struct exs_conn *conn, struct exs_op *op, uint64_t seq);
/* Announce again, in message order, every send marked by exs__seqpkt_resume_reann_mark_locked,
 * each with a new grant on the new path's endpoint (the old one died with the old path).
 * 1 when all went (the send queue goes on), 0 when one waits for control room. */
int exs__seqpkt_reannounce_locked(struct exs_conn *conn);
/* A resumable receiver read announced message seq whole: remember it, so that a
 * re-announce after a cut (its READ_DONE lost with the old path) is answered with a
 * READ_DONE and no READ (§9.2). The oldest entry goes when the memo is full: its bound
 * covers every READ_DONE that can be unsent or unprocessed when a path fails. Nothing
 * is added after the cut (one cut per connection). */
void exs__seqpkt_memo_add_locked(struct exs_conn *conn, uint64_t seq);
/* Append the READ_DONEs owed to re-announces while the control batch has room. */
void exs__seqpkt_memo_flush_locked(struct exs_conn *conn);
/* A message at or past the cut's position arrived: the re-announce window closes. Every
 * stale message must have been announced again before it (the sender announces them
 * first): one still stale means the peer broke the protocol. 0 or -EPROTO (recorded as found
 * in rec_type: the ANNOUNCE or the write that arrived, EXS_CTRL_ANNOUNCE, EXS_PV_REC_WRITE). */
int exs__seqpkt_reann_close_locked(struct exs_conn *conn, unsigned rec_type);
/* An ANNOUNCE of message seq below the cut's position (§9.2): in the window, in
 * increasing order, of a stale message (it gets the new grant and is read when its
 * receive comes) or of one read whole (remembered: answered with one READ_DONE, no
 * READ). Anything else: -EPROTO (recorded: reannounce). */
int exs__seqpkt_on_reannounce_locked(struct exs_conn *conn, const struct exs_wire_announce *a,
                                     uint64_t seq);

#endif
