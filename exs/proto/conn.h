/* SPDX-License-Identifier: MIT */
/* The connection core (conn.c, layer 1 of spec/proto-layout.md): states, failing, delivering,
 * the work-request cap, control-record output, credits, hello, ring grant, paths. */
#ifndef EXS_PROTO_CONN_H
#define EXS_PROTO_CONN_H

#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/proto/mem.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* wr_id tags in the low 3 bits (every tagged object is at least 8-byte aligned). */
enum {
    WR_TAG_QUIET = 0, /* no pointer (§6.4): an unsignaled data write whose op finished at
                       * post (EXS_QUIET_WRITE), or the drain's fence (EXS_QUIET_FENCE) */
    WR_TAG_RX = 1,    /* receive slot: index << 3 */
    WR_TAG_CTRL = 2,  /* control send slot: index << 3 */
    WR_TAG_DATA = 3,  /* a send op's WRITE WITH IMMEDIATE: op pointer */
    WR_TAG_READ = 4,  /* a receive op's RDMA READ: op pointer */
    WR_TAG_RING = 5,  /* a send op's WRITE WITH IMMEDIATE into the peer's ring: op pointer */
    WR_TAG_BATCH = 6, /* a batched ring write of several send ops: staging slot << 3 */
    WR_TAG_KA = 7,    /* the keepalive probe, a zero-byte RDMA WRITE (§9): value 0 */
    WR_TAG_MASK = 7,
};

#define WR_ID(_tag, _v) ((uint64_t)(_v) | (uint64_t)(_tag))

/* The values of WR_TAG_QUIET (spec/protocol.md §6.4). An unsignaled write completes only
 * when it fails (error or flush): it is counted in neither wr_out nor sq_out. The fence, a
 * signaled zero-byte write, is posted as the conn drains after unsignaled writes, so that
 * their flushes come before a completion the drain waits for. */
enum { EXS_QUIET_WRITE = 1u << 3, EXS_QUIET_FENCE = 2u << 3 };
#define EXS_QUIET_WR_ID WR_ID(WR_TAG_QUIET, EXS_QUIET_WRITE)
/* Unsignaled writes that may hold a provider send-queue slot at once (each until a later
 * signaled request completes): reserved in max_send_wr besides the signaled ones. */
#define EXS_QUIET_MAX   16u

/* READ_DONE records of one control SEND at most: the bound of the announced messages
 * read whole a resumable receiver remembers (§9.2) is counted in these. */
#define EXS_SEQPKT_RDONE_PER_SEND (EXS_WIRE_CTRL_MAX / EXS_WIRE_READ_DONE_LEN)

/* The test seam EXS_WINDOW_TEST (spec/protocol.md §3.1): bits that turn the credit rules
 * off so a test can show the NOP is what unblocks the windows. 0 in production. */
enum {
    EXS_WINDOW_TEST_NO_NOP = 1, /* the window check never sends a NOP */
    EXS_WINDOW_TEST_NO_ACK = 2, /* owed credits go back in no standalone ACK and in no data
                                 * immediate (control records and ring ACKs still carry them) */
    EXS_WINDOW_TEST_STRICT = 4, /* a data write never spends the last credit */
};

/* While credits are owed, the window check runs at least this often (ms). */
#define EXS_NOP_CHECK_MS 1000u

/* The data path of a connection (spec/proto-layout.md, "The data-path table"): STREAM
 * (stream.c) and SEQPACKET (seqpacket.c) each fill one; entry.c chooses it once, at
 * creation (conn->dp). The core, dispatch, keepalive and the entry points reach the data
 * path only through it. A NULL entry: the data path has no such thing (a record of that
 * type breaks the protocol; no timer). */
struct exs_datapath {
    const char *name;
    int bytes;       /* positions (tx_seq, rx_seq) count bytes (STREAM), else messages */
    int ring_resize; /* the ring may be resized (§7.4) */
    /* control records and arrivals (dispatch.c); 0 or -errno as the handlers' */
    int (*on_advert)(struct exs_conn *conn, const struct exs_advert *a);
    int (*on_announce)(struct exs_conn *conn, const struct exs_wire_announce *a);
    int (*on_read_done)(struct exs_conn *conn, uint64_t seq);
    int (*on_drain)(struct exs_conn *conn, const struct exs_wire_drain *d);
    int (*on_resize)(struct exs_conn *conn, const struct exs_wire_resize *r);
    int (*on_data)(struct exs_conn *conn, uint32_t imm, uint32_t len);
    void (*on_read_cqe)(struct exs_conn *conn, struct exs_op *op);
    /* progress (exs__conn_kick_locked): receive side first, then the send side */
    void (*recv_progress)(struct exs_conn *conn);
    void (*send_progress)(struct exs_conn *conn);
    /* the conn is DEAD: receives get what arrived, then end of stream or the error */
    void (*dead_drain)(struct exs_conn *conn);
    /* a send op just queued: copied into the send buffer (§7.5)? 1 yes */
    int (*stage_send)(struct exs_conn *conn, struct exs_op *op);
    /* a send op just queued, the conn CONNECTED: put it on the wire at once when it is
     * the first op that needs sending and goes alone (SEQPACKET), or hand it back when
     * its copy joined a run held behind a ring write (STREAM) (spec/proto-layout.md,
     * "The post's fast path"); 1: it did, and the kick would do nothing more */
    int (*post_fast)(struct exs_conn *conn, struct exs_op *op);
    /* the ring's periodic look (§7.4): ms until due again, 0: none */
    uint64_t (*ring_timer)(struct exs_conn *conn, uint64_t now_us);
    /* statistics of the data path into st */
    void (*stats)(struct exs_conn *conn, struct exs_sock_stats *st);
    /* a batched ring write is about to be posted (§6.1) */
    void (*batch_ring_write)(struct exs_conn *conn);
    /* the conn's memory goes (exs__conn_release_locked): what the data path holds */
    void (*release)(struct exs_conn *conn);
};
/* Where the modules above the core hook into it (spec/proto-layout.md, "Hook points"):
 * the core calls them only through this table, filled in entry.c. */
struct exs_conn_hooks {
    /* the cut-over (resume.c) */
    int (*fail)(struct exs_conn *conn, int err, const char *why); /* 1: cut over instead */
    void (*trial_end)(struct exs_conn *conn, int destroy); /* a resume request on trial goes */
    /* request tracing (reqtrace.c) */
    void (*trace_done)(struct exs_op *op);                           /* op->rt set */
    void (*trace_deliver)(struct exs_conn *conn, struct exs_op *op); /* conn->rt set */
    void (*trace_free)(struct exs_conn *conn);
    /* dispatch (dispatch.c), for the cut-over */
    void (*wrq_flush)(struct exs_conn *conn);
    void (*on_rx_held)(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
};
extern const struct exs_conn_hooks exs__conn_hooks; /* entry.c */

#define CONN_BIT(_st) (1u << (_st))

/* The connection's state table (spec/states.md, "Connection"), one row per state: its
 * name, the states it may go to (exs__conn_set_state_locked checks each transition),
 * and the handlers of a state that handles these itself (RESUMING: resume.c); NULL:
 * the generic handling of conn.c, dispatch.c and keepalive.c. Filled in entry.c. */
struct exs_conn_row {
    const char *name;
    uint32_t next; /* CONN_BIT of each state it may go to */
    /* the conn leaves the state */
    void (*leave)(struct exs_conn *conn);
    /* after a run of completions, before the kick */
    void (*after_cqes)(struct exs_conn *conn);
    /* a connection event (any endpoint the conn has or had) */
    void (*on_cm)(struct exs_conn *conn, const struct exs_prov_cm_event *ev);
    /* the periodic look: ms until the next, 0 once it ended the conn */
    uint64_t (*timer)(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms);
};
extern const struct exs_conn_row exs__conn_rows[EXS_CONN_STATE_COUNT];
extern const struct exs_datapath exs__stream_path; /* stream.c */
extern const struct exs_datapath exs__seqpkt_path; /* seqpacket.c */

/* Control send slots per connection, and the inline size asked for control sends. */
#define CONN_TX_SLOTS    16u
#define CONN_CTRL_INLINE 128u

/* conn.c */
/* A process counter of the set "proto" counted in conn's shard (conn->lock held). */
#define EXS_PROTO_CNT_INC(_conn, _name) EXS_CNT_INC_1W((_conn)->cnt._name)
/* conn's shard joins the set (exs__conn_create); exs__conn_free folds it in. */
void exs__conn_cnt_attach(struct exs_conn *conn);
/* pos % size for a ring or buffer position (size not 0): a mask when size is a power of
 * two, as the default ring (EXS_RING_SIZE) and send buffer (EXS_SNDBUF) are, so the data
 * path's per-message placements make no 64-bit division (tens of cycles each). */
static inline uint64_t exs__pos_mod(uint64_t pos, uint64_t size)
{
    return (size & (size - 1)) ? pos % size : pos & (size - 1);
}

/* EXS_FRAG_SIZE now: the largest data write of one transfer (§6.2). Inline: the STREAM
 * send path asks several times per small send. */
static inline uint32_t exs__conn_frag_size(void)
{
    uint64_t f = __atomic_load_n(&exs__params.frag_size, __ATOMIC_RELAXED);

    return f ? (uint32_t)f : UINT32_MAX; /* 0: the tunables were never loaded (unit tests) */
}
/* A forked child (exs__proto_fork_child): no connection of the parent's counts as live. */
void exs__conn_fork_child(void);
/* Post a send work request (at most one sge) to the conn's endpoint, or queue it behind
 * EXS_WR_MAX outstanding ones (§6.3): either way it is the conn's now, in posting order,
 * and completes (flushed, if the conn ends first) like a posted one. 0 or -errno. */
int exs__conn_post_send_locked(struct exs_conn *conn, const struct exs_prov_send_wr *wr);
void exs__conn_kick_locked(struct exs_conn *conn);
/* The kick after a send was posted: the send side and delivery (conn.c). */
void exs__conn_kick_tx_locked(struct exs_conn *conn);
/* The kick after a receive was posted: the receive side, the flush, delivery (conn.c). */
void exs__conn_kick_rx_locked(struct exs_conn *conn);
void exs__conn_fail_locked(struct exs_conn *conn, int err, const char *why);
/* The test seam EXS_WINDOW_TEST (EXS_WINDOW_TEST_* bits; 0 in production). Inline, as
 * the two credit tests below: asked at every send and completion. */
static inline unsigned exs__conn_window_test(void)
{
    return (unsigned)__atomic_load_n(&exs__params.window_test, __ATOMIC_RELAXED);
}

/* May a control SEND (which consumes a peer receive) go out? The last credit is kept for
 * a message that returns credits, so two starved sides can always unblock each other
 * (spec/protocol.md §3.1). */
static inline int exs__conn_can_spend_ctrl_locked(const struct exs_conn *conn)
{
    return conn->credits > 1 || (conn->credits == 1 && conn->owed > 0);
}

/* May one more data write (WWI) go out? As a control SEND: its immediate returns the owed
 * credits. Under the seam EXS_WINDOW_TEST_STRICT the last credit is for ACK / NOP only. */
static inline int exs__conn_can_spend_locked(const struct exs_conn *conn)
{
    if (exs__conn_window_test() & EXS_WINDOW_TEST_STRICT)
        return conn->credits > 1;
    return exs__conn_can_spend_ctrl_locked(conn);
}

/* The owed credits a data write's immediate returns (at most EXS_IMM_CREDITS_MAX), no
 * longer owed. Inline: one per data write. */
static inline uint32_t exs__conn_take_owed_imm_locked(struct exs_conn *conn)
{
    uint32_t n = EXS_MIN(conn->owed, EXS_IMM_CREDITS_MAX);

    if (exs__conn_window_test() & EXS_WINDOW_TEST_NO_ACK)
        return 0; /* the seam: data returns none */
    conn->owed -= n;
    return n;
}

/* The control flush when something may be due (conn.c). */
int exs__conn_ctrl_flush_due_locked(struct exs_conn *conn);
/* Send the pending control records (adding an ACK when owed). Returns 1 when nothing
 * remains pending, 0 when they must wait (no credit or send slot). Inline: every kick
 * asks, and mostly nothing waits and no ACK can be due: no record, fewer owed credits
 * than the smallest threshold (2, with at least 3 credits) and less than a quarter of the
 * ring arrived since the last report (so less consumed too; spec/protocol.md §3.1, §7). */
static inline int exs__conn_ctrl_idle(const struct exs_conn *conn)
{
    return !conn->ctrl_len && conn->owed < 2 && conn->p.credits >= 3 &&
           conn->rd_arrived - conn->rd_reported < conn->p.ring_size / 4;
}
static inline int exs__conn_ctrl_flush_locked(struct exs_conn *conn)
{
    if (exs__conn_ctrl_idle(conn))
        return 1;
    return exs__conn_ctrl_flush_due_locked(conn);
}
void exs__conn_shutdown_record_locked(struct exs_conn *conn, struct exs_op *op);
int exs__conn_ctrl_room_locked(struct exs_conn *conn, uint32_t len);
void exs__conn_ctrl_append_locked(struct exs_conn *conn, const void *rec, uint32_t len);
/* exs__conn_op_finish_locked when op holds a grant, was cancelled or is traced (conn.c). */
void exs__conn_op_finish_all_locked(struct exs_op *op, ssize_t result, int err);
/* op finished with result (bytes, or -1 with err): DONE, delivered in its queue's order.
 * Inline: twice per round trip; mostly the op holds no grant, was not cancelled and is not
 * traced, and only its result is stored. */
static inline void exs__conn_op_finish_locked(struct exs_op *op, ssize_t result, int err)
{
    if (EXS_UNLIKELY(op->grant || op->cancel || op->rt)) {
        exs__conn_op_finish_all_locked(op, result, err);
        return;
    }
    op->result = err ? -1 : result;
    op->err = err;
    op->state = EXS_OPS_DONE;
}
/* Grants of an op's buffer to the peer (conn.c). Errors of grant: -ENOMEM, -EINVAL, -ENOTCONN. */
int exs__conn_grant_op_locked(struct exs_conn *conn, struct exs_op *op, unsigned access);
void exs__conn_revoke_op_locked(struct exs_op *op);
/* A SEQPACKET send with no op, at its post (conn.c: exs__conn_send_now_begin's use) */
int exs__conn_quiet_may_locked(struct exs_conn *conn, uint32_t len);
int exs__conn_post_quiet_locked(struct exs_conn *conn, uint64_t raddr, uint32_t rkey, uint32_t len,
                                uint32_t imm, const void *src, int flags);
int exs__conn_post_write_imm_locked(struct exs_conn *conn, struct exs_op *op, uint64_t raddr,
                                    uint32_t rkey, uint32_t len, uint32_t imm, const void *src);
int exs__advert_push_locked(struct exs_conn *conn, const struct exs_advert *a);

/* conn.c: the last part of exs__conn_destroy (provider objects, memory, the struct). */
void exs__conn_free(struct exs_conn *conn);

/* Send op ended: its every write completed successfully, or its one write went unsignaled
 * (§6.4): it finishes with its length, its bytes count in bytes_sent (an internal op's
 * were counted when copied, §7.5) and join resume_tx_done (STREAM). */
static inline void exs__conn_send_end_locked(struct exs_conn *conn, struct exs_op *op)
{
    exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
    if (!op->internal) /* a copy counted when its send completed (§7.5) */
        conn->stats.bytes_sent += op->len;
    /* the writes of one endpoint complete in posting order and a stream is written in
     * order, so these bytes are a prefix of the stream; SEQPACKET: one past the highest
     * message seen completed (announced ones complete out of order, at READ_DONE) */
    if (op->kind != EXS_OP_SEND)
        return;
    if (conn->dp->bytes)
        conn->resume_tx_done += op->len;
    else if (op->seq + 1 > conn->resume_tx_done)
        conn->resume_tx_done = op->seq + 1;
}
/* Send op ended by its completion (its last write's, or READ_DONE), or by the cut-over's
 * rewind: the peer has it and every send before it (§9.2, Positions): resume.tx_sig. */
static inline void exs__conn_send_done_locked(struct exs_conn *conn, struct exs_op *op)
{
    exs__conn_send_end_locked(conn, op);
    conn->resume.tx_sig = conn->resume_tx_done;
}
/* The unsignaled write exs__conn_post_write_imm_locked just posted was op's (conn->quiet_op),
 * whose caller has done its bookkeeping: op is done now (§6.4). */
static inline void exs__conn_quiet_check_locked(struct exs_conn *conn, struct exs_op *op)
{
    if (EXS_UNLIKELY(conn->quiet_op == op)) {
        conn->quiet_op = NULL;
        op->inflight--;
        conn->tx_moved++;
        exs__conn_send_end_locked(conn, op); /* not known arrived: no resume.tx_sig */
    }
}
/* The conn drains (DRAINING) after unsignaled writes: the fence behind them (§6.4). */
void exs__conn_quiet_fence_locked(struct exs_conn *conn);
/* The cut-over's use of the core (resume.c) */
void exs__conn_set_state_locked(struct exs_conn *conn, enum exs_conn_state st, const char *why);
/* The conn is over at once: through DOWN to DEAD, every op completed (err), the endpoint
 * and grants released, cb->dead called. Progress thread. */
void exs__conn_end_locked(struct exs_conn *conn, int err, const char *why);
void exs__conn_revoke_all_locked(struct exs_conn *conn);
void exs__conn_adopt_hello_locked(struct exs_conn *conn, const void *pd);
void exs__conn_ring_grant_locked(struct exs_conn *conn);
/* The new path's control memory and endpoint on ctx (conn->ctx becomes ctx), receives
 * posted. 0 or -errno (nothing made is left). */
int exs__conn_path_new_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx);
/* The same in two steps, so a resume request on trial can hold a path the conn takes only
 * once the request's proof checked out (§9.2): made on ctx for conn (its endpoint's user
 * is conn; conn itself is not touched), dropped, or taken by conn. */
struct exs_conn_path {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;       /* user: the conn */
    struct exs_prov_mr *ctrl_mem; /* credits receive slots, then the control send slots */
    uint32_t posted;              /* receives posted on ep, completion not yet taken */
};
/* 0 or -errno (drop what was made). Progress thread. */
int exs__conn_path_make(struct exs_conn *conn, struct exs_prov_ctx *ctx, enum exs_mem_kind kind,
                        struct exs_conn_path *path);
void exs__conn_path_drop(struct exs_conn_path *path);
/* conn (without an endpoint or control slots) takes path; path is emptied. */

/* Internal to the core's files (conn.c, keepalive.c, dispatch.c, entry.c) */
void exs__conn_live_add(int n);
void exs__conn_cset_register(void);
const char *exs__conn_state_name(enum exs_conn_state st);
void exs__conn_set_txshut_locked(struct exs_conn *conn, enum exs_conn_txshut st, const char *why);
int exs__conn_post_rx_locked(struct exs_conn *conn, uint32_t slot);
void exs__conn_release_locked(struct exs_conn *conn);
uint64_t exs__conn_arrays_bytes(const struct exs_conn *conn);
void exs__conn_struct_free(struct exs_conn *conn);
void exs__conn_wrq_post_locked(struct exs_conn *conn);
/* The oldest queued work request out of the queue, as its flushed completion (*cqe): 1,
 * or 0 when none is queued. */
int exs__conn_wrq_pop_locked(struct exs_conn *conn, struct exs_prov_cqe *cqe);
/* Delivery's walk (conn.c). */
void exs__conn_deliver_all_locked(struct exs_conn *conn);
/* Hand finished operations to their owners, each direction in posting order. Inline: every
 * kick asks, and mostly neither queue's head is finished: a send at sendq's head that is
 * not the library's own and not DONE, and a receive at recvq's head not DONE, hold back
 * everything behind them; the run of internal ops is then not at the head (forgotten, as
 * the walk would). Anything else takes the walk. */
static inline int exs__conn_deliver_idle(const struct exs_conn *conn)
{
    const struct exs_op *s =
        exs_list_empty(&conn->sendq) ? NULL : exs_list_entry(conn->sendq.next, struct exs_op, link);

    return (!s || (s->state != EXS_OPS_DONE && !s->internal)) &&
           (exs_list_empty(&conn->recvq) ||
            exs_list_entry(conn->recvq.next, struct exs_op, link)->state != EXS_OPS_DONE);
}
static inline void exs__conn_deliver_locked(struct exs_conn *conn)
{
    if (exs__conn_deliver_idle(conn)) {
        conn->dlv_run = NULL;
        return;
    }
    exs__conn_deliver_all_locked(conn);
}
/* Answer the peer's keepalive PING (§9.1): a NOP unless records wait to go. */
void exs__conn_ka_answer_locked(struct exs_conn *conn);
/* The connection is over: every operation completes, the provider resources go. */
void exs__conn_dead_locked(struct exs_conn *conn, int err, const char *why);

#endif
