/* SPDX-License-Identifier: MIT */
/* The STREAM send buffer (stage.c, spec/protocol.md §7.5). */
#ifndef EXS_PROTO_STAGE_H
#define EXS_PROTO_STAGE_H

#include <string.h>

#include "exs/proto/conn.h"
#include "exs/proto/proto.h"
#include "exs/util/util.h"

/* Copy send op, just queued in sendq, into the send buffer when it may be: then the op
 * is finished (handed back once no earlier send waits) and 1 is returned; else 0 and it
 * stays queued (copied by a later refill when it only lacked room, else zero-copy). */
int exs__stage_send_locked(struct exs_conn *conn, struct exs_op *op);
/* exs_send's copy at the post (exs__conn_send_copy): len bytes (0 < len <= copy_max) of a
 * send that is no op, the conn CONNECTED with no send of the application in sendq, copied
 * into the buffer as the stream's next bytes (the buffer allocated at the first copy).
 * 1 when copied, 0 when the buffer has no room or memory (nothing changed). */
int exs__stage_copy_bytes_locked(struct exs_conn *conn, const void *buf, size_t len);
/* Copy queued sends that found the buffer full, now that bytes were released. */
void exs__stage_refill_locked(struct exs_conn *conn);
/* The most bytes one internal op gathers (a write's worth: the larger of the fragment
 * size and copy_max, taken when the buffer was allocated; asked only of a conn with
 * internal send ops, which have the buffer). */
static inline uint32_t exs__stage_cap(const struct exs_conn *conn)
{
    return conn->stg_cap;
}
/* Synchronization-ahead for the send buffer: op is the newest copy, not started, below
 * the cap, while a ring write is in flight: it waits for more copies (or that write).
 * (Inline: asked at every pass and at every STREAM post.) */
static inline int exs__stage_hold_locked(struct exs_conn *conn, const struct exs_op *op)
{
    return op == conn->stg_last && op->internal && op->kind == EXS_OP_SEND &&
           op->state == EXS_OPS_QUEUED && !op->posted && conn->ring_wr_out && !conn->batch_now &&
           op->len < exs__stage_cap(conn) && conn->state == EXS_CONN_CONNECTED;
}
/* An internal op of the send buffer (stage.c). */
struct exs__stage_op {
    struct exs_op op;
    struct exs_conn *conn;
    uint64_t end; /* buffer position just past its bytes */
};
/* The copy's bytes go to dst, at the end of the newest internal op (stg_tail). */
static inline void exs__stage_put(struct exs_conn *conn, uint8_t *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
    conn->stg_last->len += len;
    conn->stg_tail += len;
    exs_container_of(conn->stg_last, struct exs__stage_op, op)->end = conn->stg_tail;
    conn->bwait.first = NULL; /* a held run may have changed: built again */
    conn->stats.sends_copied++;
    conn->stats.bytes_sent += len;
}
/* exs__stage_copy_bytes_locked's case where the bytes join the newest internal op while it
 * is held behind the ring write in flight (exs__stage_hold_locked) and stays held with
 * them: 1 when appended so, else 0 (nothing changed). (Inline: every copy at the post of a
 * burst of small sends asks.) */
static inline int exs__stage_append_held_locked(struct exs_conn *conn, const void *buf, size_t len)
{
    struct exs_op *op = conn->stg_last;
    uint64_t size = conn->p.sndbuf;

    /* exs__stage_hold_locked and stage_appendable at sendq's end, in one pass: held now,
     * and still with len more bytes (below the cap); sendq's last op, its bytes ending at
     * stg_tail, room for len more before the buffer's end and in the buffer */
    if (!op || op->state != EXS_OPS_QUEUED || op->posted || op->inflight || !conn->ring_wr_out ||
        conn->batch_now || op->len + len >= exs__stage_cap(conn) || op->link.next != &conn->sendq ||
        exs_container_of(op, struct exs__stage_op, op)->end != conn->stg_tail ||
        (size_t)(op->buf - (uint8_t *)conn->stg_mem->addr) + op->len + len > size ||
        conn->stg_tail + len - conn->stg_head > size)
        return 0;
    exs__stage_put(conn, op->buf + op->len, buf, len);
    return 1;
}
/* Is a copy not yet entirely on the wire? */
int exs__stage_pending_locked(const struct exs_conn *conn);
/* exs_close with copies not yet on the wire: queue the SHUTDOWN record behind them, as
 * an internal op. 0 or -ENOMEM. */
int exs__stage_shutdown_locked(struct exs_conn *conn);
void exs__stage_release_locked(struct exs_conn *conn);

#endif
