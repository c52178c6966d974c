/* SPDX-License-Identifier: MIT */
/* The connection core (conn.c, layer 1 of spec/proto-layout.md): states, failing, delivering,
 * the work-request cap, control-record output, credits, hello, ring grant, paths. */
#ifndef EXS_PROTO_CONN_H
#define EXS_PROTO_CONN_H

#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/proto/mem.h"

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

/* Control send slots per connection, and the inline size asked for control sends. */
#define CONN_TX_SLOTS     16u
#define CONN_CTRL_INLINE  128u

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

/* conn.c: the last part of exs__conn_destroy (provider objects, memory, the struct). */
void exs__conn_free(struct exs_conn *conn);

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
    struct exs_prov_ep  *ep;       /* user: the conn */
    struct exs_prov_mr  *ctrl_mem; /* credits receive slots, then the control send slots */
    uint32_t             posted;   /* receives posted on ep, completion not yet taken */
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
unsigned exs__conn_window_test(void);
int exs__conn_can_spend_ctrl_locked(struct exs_conn *conn);
void exs__conn_wrq_post_locked(struct exs_conn *conn);
/* The oldest queued work request out of the queue, as its flushed completion (*cqe): 1,
 * or 0 when none is queued. */
int exs__conn_wrq_pop_locked(struct exs_conn *conn, struct exs_prov_cqe *cqe);
void exs__conn_deliver_locked(struct exs_conn *conn);
/* Answer the peer's keepalive PING (§9.1): a NOP unless records wait to go. */
void exs__conn_ka_answer_locked(struct exs_conn *conn);
/* The connection is over: every operation completes, the provider resources go. */
void exs__conn_dead_locked(struct exs_conn *conn, int err, const char *why);

#endif
