/* SPDX-License-Identifier: MIT */
/* Private declarations shared by the files of the proto module. */
#ifndef EXS_PROTO_PROTO_INT_H
#define EXS_PROTO_PROTO_INT_H

#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/util/membudget.h"

/* wr_id tags in the low 3 bits (every tagged object is at least 8-byte aligned). */
enum {
    WR_TAG_RX   = 1, /* receive slot: index << 3 */
    WR_TAG_CTRL = 2, /* control send slot: index << 3 */
    WR_TAG_DATA = 3, /* a send op's WRITE WITH IMMEDIATE: op pointer */
    WR_TAG_READ = 4, /* a receive op's RDMA READ: op pointer */
    WR_TAG_RING = 5, /* a send op's WRITE WITH IMMEDIATE into the peer's ring: op pointer */
    WR_TAG_BATCH = 6, /* a batched ring write of several send ops: staging slot << 3 */
    WR_TAG_KA   = 7, /* the keepalive probe, a zero-byte RDMA WRITE (§9): value 0 */
    WR_TAG_MASK = 7,
};

#define WR_ID(_tag, _v) ((uint64_t)(_v) | (uint64_t)(_tag))

/* An arrived SEQPACKET message not yet matched to a receive. */
struct exs_pending_msg {
    struct exs_list link;
    int             announced; /* 1: waits at the sender for a READ; 0: eager in our ring */
    uint64_t        seq;
    uint64_t        addr;      /* announced: sender buffer; eager: ring offset */
    uint32_t        len;
    uint32_t        rkey;
    uint64_t        ring_end;  /* eager: rd_consumed once this message is copied out */
    uint32_t        batch_left; /* batched write (§6.1): its messages not yet matched (addr is
                                 * then the ring offset of the next record); 0: one message */
    uint32_t        batch_end; /* batched write: ring offset just past its last record */
    int             stale;     /* announced, its grant died at a cut (§9.2): waits for the
                                * sender to announce it again */
};

/* READ_DONE records of one control SEND at most: the bound of the announced messages
 * read whole a resumable receiver remembers (§9.2) is counted in these. */
#define EXS_SP_RDONE_PER_SEND (EXS_WIRE_CTRL_MAX / EXS_WIRE_READ_DONE_LEN)

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

/* conn.c */
/* EXS_FRAG_SIZE now: the largest data write of one transfer (§6.2). */
uint32_t exs__conn_frag_size(void);
/* Post a send work request (at most one sge) to the conn's endpoint, or queue it behind
 * EXS_WR_MAX outstanding ones (§6.3): either way it is the conn's now, in posting order,
 * and completes (flushed, if the conn ends first) like a posted one. 0 or -errno. */
int exs__conn_post_send_locked(struct exs_conn *conn, const struct exs_prov_send_wr *wr);
void exs__conn_kick_locked(struct exs_conn *conn);
void exs__conn_fail_locked(struct exs_conn *conn, int err, const char *why);
int exs__conn_ctrl_flush_locked(struct exs_conn *conn);
void exs__conn_shutdown_record_locked(struct exs_conn *conn, struct exs_op *op);
int exs__conn_ctrl_room_locked(struct exs_conn *conn, uint32_t len);
void exs__conn_ctrl_append_locked(struct exs_conn *conn, const void *rec, uint32_t len);
int exs__conn_can_spend_locked(struct exs_conn *conn);
uint32_t exs__conn_take_owed_imm_locked(struct exs_conn *conn);
void exs__conn_op_finish_locked(struct exs_op *op, ssize_t result, int err);
/* Grants of an op's buffer to the peer (conn.c). Errors of grant: -ENOMEM, -EINVAL, -ENOTCONN. */
int exs__conn_grant_op_locked(struct exs_conn *conn, struct exs_op *op, unsigned access);
void exs__conn_revoke_op_locked(struct exs_op *op);
int exs__conn_post_write_imm_locked(struct exs_conn *conn, struct exs_op *op, uint64_t raddr,
                                    uint32_t rkey, uint32_t len, uint32_t imm, const void *src);
int  exs__advert_push_locked(struct exs_conn *conn, const struct exs_advert *a);

/* resume.c: the cut-over's identity (spec/protocol.md §9.2) */
/* Both sides may be cut over: this side is resumable and the peer's hello has the bit. */
int exs__resume_negotiated(const struct exs_conn *conn);
/* Just established, right after the RING record: each side of a resumable connection
 * draws its key and appends its SESSION record; the passive side registers the session
 * under the token its key gives (a failure to draw a key ends the conn). */
void exs__resume_established_locked(struct exs_conn *conn);
/* The resume proof (§9.2): the token a passive side's key K_B gives (the first 8 bytes of
 * SHA-256(K_B), big endian), and HMAC-SHA256(key = K_A || K_B, label || nonce_A ||
 * nonce_B) into out (32 bytes; MAC_B is its first 8). */
uint64_t exs__resume_token_of(const uint8_t *kb);
void exs__resume_mac(const uint8_t *key, uint8_t label, const uint8_t *nonce_a,
                     const uint8_t *nonce_b, uint8_t *out);
/* A peer's SESSION / RESUME record (length checked): 0, or -EPROTO (logged). */
int exs__resume_on_session_locked(struct exs_conn *conn, const struct exs_wire_session *s);
int exs__resume_on_resume_locked(struct exs_conn *conn, const struct exs_wire_resume *r);
/* The path of conn failed (cause; disc: it was the DISCONNECTED event; silent: the path
 * went silent, a keepalive timeout, so its drain is not waited for): 1 when conn is
 * (now, or already) RESUMING, the caller then leaves it alone; 0 when it is not cut
 * over (counted as above) and the caller ends it as before (§9.2, When). */
int exs__resume_begin_locked(struct exs_conn *conn, const char *cause, int disc, int silent);
/* exs__conn_fail_locked is ending conn (err, why): 1 when it is cut over instead (its
 * endpoint is no longer connected: the path failed first, whatever found it), or is
 * RESUMING (the failure ends it at the next progress-thread look); 0: end it. */
int exs__resume_on_fail_locked(struct exs_conn *conn, int err, const char *why);
/* Progress thread, RESUMING: the old endpoint drained: make the new path (active:
 * connect; passive: take the new path of a resume request whose proof checked out); a
 * failure noted: end the conn. */
void exs__resume_progress_locked(struct exs_conn *conn);
/* A cm event while RESUMING (the old endpoint's or the new one's). */
void exs__resume_on_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev);
/* RESUMING, or a new path waiting for the peer's RESUME: past connect_timeout_ms the conn
 * ends with ETIMEDOUT. ms until the deadline, 0 once it ended the conn. */
uint64_t exs__resume_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms);
/* A resume request on trial (passive side, §9.2): its new path's endpoint has the conn as
 * its user, so its completions and events come here first. 1 when cqe / ev was the
 * trial's (handled: held, or the proof checked), 0 when it is the conn's own. */
int exs__resume_pend_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
int exs__resume_pend_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev);
/* Its deadline (connect_timeout_ms from the accept): past it, the request is refused.
 * Returns next (the conn timer's ms until its next look, 0: none) lowered to the trial's
 * deadline. */
uint64_t exs__resume_pend_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms,
                                       uint64_t next);
/* The conn ends (destroy 0: its endpoint is disconnected, the objects go at a later safe
 * point; destroy 1, the conn is freed: everything goes now). Not counted. */
void exs__resume_pend_end_locked(struct exs_conn *conn, int destroy);
/* exs_close or an abort while being cut over: the conn ends now (1), else 0. */
int exs__resume_close_locked(struct exs_conn *conn);
/* A posted op registered on another context than the conn's (a cut-over happened): its
 * registration on the conn's context. 0 or -errno. */
int exs__resume_op_mr_locked(struct exs_conn *conn, struct exs_op *op);
/* The conn is destroyed: out of the registry of sessions. 1: the caller frees it now;
 * 0: a resume request's finder still holds it and frees it (exs__conn_free) when done. */
int exs__resume_forget(struct exs_conn *conn);
/* A forked child: the registry and the wait lists start empty (exs__proto_fork_child). */
void exs__resume_fork_child(void);
/* conn leaves RESUMING (conn->lock held): it no longer counts against resume_max. */
void exs__resume_wait_leave(struct exs_conn *conn);
/* End the connections evicted from the wait list (spec/protocol.md §9.2, The wait): run
 * by the progress thread's entry points into proto once they hold no conn lock. */
void exs__resume_evict_run(void);
/* conn.c: the last part of exs__conn_destroy (provider objects, memory, the struct). */
void exs__conn_free(struct exs_conn *conn);

/* conn.c, for the cut-over */
void exs__conn_set_state_locked(struct exs_conn *conn, enum exs_conn_state st, const char *why);
/* The conn is over at once: through DOWN to DEAD, every op completed (err), the endpoint
 * and grants released, cb->dead called. Progress thread. */
void exs__conn_end_locked(struct exs_conn *conn, int err, const char *why);
void exs__conn_revoke_all_locked(struct exs_conn *conn);
void exs__conn_adopt_hello_locked(struct exs_conn *conn, const void *pd);
void exs__conn_ring_grant_locked(struct exs_conn *conn);
void exs__conn_wrq_flush_locked(struct exs_conn *conn);
/* The new path's control memory and endpoint on ctx (conn->ctx becomes ctx), receives
 * posted. 0 or -errno (nothing made is left). */
int exs__conn_path_new_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx);
/* The same in two steps, so a resume request on trial can hold a path the conn takes only
 * once the request's proof checked out (§9.2): made on ctx for conn (its endpoint's user
 * is conn; conn itself is not touched), dropped, or taken by conn. */
struct exs_conn_path {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep  *ep;       /* user: the conn */
    struct exs_prov_mr  *ctrl_mem; /* credits receive slots, then the control send slots */
    uint32_t             posted;   /* receives posted on ep, completion not yet taken */
};
/* 0 or -errno (drop what was made). Progress thread. */
int exs__conn_path_make(struct exs_conn *conn, struct exs_prov_ctx *ctx, enum exs_mem_kind kind,
                        struct exs_conn_path *path);
void exs__conn_path_drop(struct exs_conn_path *path);
/* conn (without an endpoint or control slots) takes path; path is emptied. */
void exs__conn_path_take_locked(struct exs_conn *conn, struct exs_conn_path *path);
/* A receive completion of a path conn took, held until then (by a resume request on
 * trial): handled as if it came now (records, re-post, a credit owed). */
void exs__conn_on_rx_held_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
/* Register the counters (once, with the proto set). */
void exs__resume_cset_register(void);
/* Send op's every write completed successfully (STREAM: its bytes join resume_tx_done). */
void exs__resume_tx_done_locked(struct exs_conn *conn, const struct exs_op *op);
/* What has arrived over the path so far: STREAM bytes (placed in receives or waiting in
 * the ring), SEQPACKET messages. Final once the old endpoint is drained (§9.2). */
uint64_t exs__resume_arrived_locked(const struct exs_conn *conn);
/* This side's RESUME record for the new path: the token and what arrived (§9.2). */
void exs__resume_record_locked(const struct exs_conn *conn, struct exs_wire_resume *r);
/* The peer's RESUME on a new path, hostile until checked (§9.2): flags 0, our token, the
 * other kind's position 0, and a position at least what we saw completed and at most
 * what we posted. 0, or -EPROTO (logged). */
int exs__resume_check_locked(const struct exs_conn *conn, const struct exs_wire_resume *r);

/* Provider memory charged to the memory account (spec/protocol.md §9.3): size bytes,
 * refused (-ENOBUFS) past EXS_MEM_BUDGET unless kind is EXS_MEM_FORCE; a new connection's
 * (EXS_MEM_CONN) also leaves room for a connection's tables. Errors: -ENOBUFS, those of
 * mem_alloc. */
int exs__conn_mem_alloc(struct exs_prov_ctx *ctx, size_t size, enum exs_mem_kind kind,
                        struct exs_prov_mr **mem_p);
void exs__conn_mem_free(struct exs_prov_mr *mem);
/* n malloc'd bytes of conn charged (conn->mem_held), as above; 0 or -ENOBUFS. Given back
 * exactly as freed. */
int exs__conn_mem_take_locked(struct exs_conn *conn, uint64_t n, enum exs_mem_kind kind);
void exs__conn_mem_give_locked(struct exs_conn *conn, uint64_t n);
/* Ring memory (conn.c, spec/protocol.md §7.4): a region of size bytes from the provider,
 * counted in the process's ring bytes; with budget set, refused (-ENOBUFS) when the
 * count would pass it. grant_p non-NULL: the peer's REMOTE_WRITE over it too.
 * Errors: -ENOBUFS, those of mem_alloc and grant. */
int exs__conn_ring_region_locked(struct exs_conn *conn, uint32_t size, int budget,
                                 struct exs_prov_mr **mem_p, struct exs_prov_grant **grant_p);
void exs__conn_ring_region_free(struct exs_prov_mr *mem);
/* A ring region of size bytes on ctx (a resume request's new path), counted, no budget,
 * no grant. 0 or -errno. */
int exs__conn_ring_alloc(struct exs_prov_ctx *ctx, uint32_t size, struct exs_prov_mr **mem_p);
/* Bytes of every ring region of the process now. */
uint64_t exs__conn_ring_bytes(void);

/* batch.c: sender batching (spec/protocol.md §6.1, §7.1) */
/* Does op join a run of bytes batched bytes? 1 yes (*rec_p: the bytes it adds), 0 it
 * cannot be batched (the run ends before it), -1 it could but the ring has no room. */
typedef int (*batch_fit_fn)(struct exs_conn *conn, struct exs_op *op, uint64_t bytes,
                            uint32_t *rec_p);
enum batch_verdict {
    BATCH_NONE = 0, /* send the op at from on its own, as without batching */
    BATCH_SENT,     /* a batched write carrying it and the ops after it was posted */
    BATCH_WAIT,     /* gathered: leaves when the ring write in flight completes */
    BATCH_STALL,    /* must wait for a credit or a staging buffer */
};
enum batch_verdict exs__batch_try_locked(struct exs_conn *conn, struct exs_list *from,
                                         batch_fit_fn fit);
void exs__batch_on_cqe_locked(struct exs_conn *conn, uint32_t slot, int ok);
void exs__batch_release_locked(struct exs_conn *conn);

/* stage.c: the STREAM send buffer (spec/protocol.md §7.5) */
/* Copy send op, just queued in sendq, into the send buffer when it may be: then the op
 * is finished (handed back once no earlier send waits) and 1 is returned; else 0 and it
 * stays queued (copied by a later refill when it only lacked room, else zero-copy). */
int exs__stage_send_locked(struct exs_conn *conn, struct exs_op *op);
/* Copy queued sends that found the buffer full, now that bytes were released. */
void exs__stage_refill_locked(struct exs_conn *conn);
/* The most bytes one internal op gathers (a write's worth). */
uint32_t exs__stage_cap(const struct exs_conn *conn);
/* Synchronization-ahead for the send buffer: op is the newest copy, not started, below
 * the cap, while a ring write is in flight: it waits for more copies (or that write). */
int exs__stage_hold_locked(struct exs_conn *conn, const struct exs_op *op);
/* Is a copy not yet entirely on the wire? */
int exs__stage_pending_locked(const struct exs_conn *conn);
/* exs_close with copies not yet on the wire: queue the SHUTDOWN record behind them, as
 * an internal op. 0 or -ENOMEM. */
int exs__stage_shutdown_locked(struct exs_conn *conn);
void exs__stage_release_locked(struct exs_conn *conn);

/* seqpacket.c */
void exs__sp_send_progress_locked(struct exs_conn *conn);
void exs__sp_recv_progress_locked(struct exs_conn *conn);
int exs__sp_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len);
int exs__sp_on_announce_locked(struct exs_conn *conn, const struct exs_wire_announce *a);
int exs__sp_on_read_done_locked(struct exs_conn *conn, uint64_t seq);
int exs__sp_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a);
void exs__sp_on_read_cqe_locked(struct exs_conn *conn, struct exs_op *op);
void exs__sp_free_pending_locked(struct exs_conn *conn);
void exs__sp_dead_drain_locked(struct exs_conn *conn);
uint32_t exs__sp_resume_cut_locked(struct exs_conn *conn);
void exs__sp_resume_reann_mark_locked(struct exs_conn *conn, struct exs_op *op);
uint32_t exs__sp_slot_len(uint32_t len);

/* stream.c */
void exs__st_send_progress_locked(struct exs_conn *conn);
void exs__st_recv_progress_locked(struct exs_conn *conn);
int exs__st_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len);
int exs__st_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a);
/* DRAIN record (§7.2): 0, or -EPROTO for a record that breaks the rules. */
int exs__st_on_drain_locked(struct exs_conn *conn, const struct exs_wire_drain *d);
/* The STREAM fields of the statistics (phase times, ring fill) into st. */
void exs__st_stats_locked(struct exs_conn *conn, struct exs_sock_stats *st);
void exs__st_enter_indirect_locked(struct exs_conn *conn);
void exs__st_dead_drain_locked(struct exs_conn *conn);
/* RESIZE record (§7.4): 0, or -EPROTO for a record that breaks the rules. */
int exs__st_on_resize_locked(struct exs_conn *conn, const struct exs_wire_resize *r);
/* Ring autotuning's periodic look (idle shrink, §7.4): ms until it is due again, 0: none. */
uint64_t exs__st_ring_timer_locked(struct exs_conn *conn, uint64_t now_us);
/* Offer the peer a ring region of size bytes now (§7.4; autotuning, and tests). 0,
 * -EBUSY (an offer or a retired region is outstanding), -EOPNOTSUPP (SEQPACKET, the
 * peer lacks the feature), -ENOBUFS (budget), -EINVAL, or a provider error. */
int exs__st_ring_offer_locked(struct exs_conn *conn, uint32_t size, int budget);
/* Free the regions of autotuning (conn teardown). */
void exs__st_ring_release_locked(struct exs_conn *conn);
/* The ring at a cut-over (§9.2, The ring at the cut), after the old endpoint and its
 * grants are gone: an offer out dies, an answer owed is dropped, every unread byte ends
 * in one retired region, and p.ring_size becomes the size of the new path's ring (to be
 * allocated by the caller). 0 or -EPROTO (positions that no legal history gives). */
int exs__st_ring_cut_locked(struct exs_conn *conn);

/* The autotuning decision (§7.4), a pure function. */
enum exs_ring_tune_verdict {
    EXS_RING_KEEP = 0,
    EXS_RING_GROW,    /* *size_p: 2 or EXS_RING_GROW_FAST x size (at most max) */
    EXS_RING_SHRINK,  /* *size_p: init */
    EXS_RING_REFUSED, /* a grow was due but would pass the process budget */
};
struct exs_ring_tune_in {
    uint32_t size, init, max;  /* the ring now, at creation, ring_max */
    uint64_t budget, in_use;   /* ring_budget (0: none), ring bytes of the process now */
    uint64_t win_bytes;        /* ring bytes that arrived per min_rtt in the last window */
    int      reader_waiting;   /* a receive is posted with the ring copied out: the
                                * application keeps up, the ring is what limits */
    uint64_t idle_us;          /* since the last ring arrival */
    uint64_t idle_limit_us;    /* ring_idle_ms in us (0: never shrink) */
};
enum exs_ring_tune_verdict exs__st_ring_tune(const struct exs_ring_tune_in *in, uint32_t *size_p);

#define PHASE_IS_DIRECT(_p)   (((_p) & 1u) == 0)
#define PHASE_IS_INDIRECT(_p) (((_p) & 1u) == 1)

static inline int conn_is_stream(const struct exs_conn *conn)
{
    return conn->p.sock_type == SOCK_STREAM;
}

#endif
