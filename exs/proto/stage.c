/* SPDX-License-Identifier: MIT */
/* The STREAM send buffer: small sends copied at posting and completed at once (§7.5). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "exs/proto/proto_int.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/*
 * spec/protocol.md §7.5. A kernel TCP socket completes send() once the bytes are in its
 * send buffer; a zero-copy send completes only when its write reached the peer, one round
 * trip later, so an application with a few sends outstanding is bound by the round trip,
 * not by the link. Here a STREAM send of at most copy_max bytes is copied into the
 * connection's send buffer (sndbuf bytes, a ring of byte positions stg_head..stg_tail)
 * and handed back at once, when that keeps events in posting order (no application op
 * waits in sendq ahead of it). Consecutive copies are appended to one internal op while
 * it waits, so a burst of small sends leaves as one ring write from the buffer (the
 * batching of §7.1 happens in the copy). An internal op runs through the protocol like
 * any send (direct into an ADVERT, or into the ring); its completion releases its bytes.
 * Copies are data the application was told is sent: exs_close sends them before its
 * SHUTDOWN record rather than cancelling them; a connection that fails loses them, as
 * a kernel socket loses its send buffer.
 */

struct stage_op {
    struct exs_op    op;
    struct exs_conn *conn;
    uint64_t         end; /* buffer position just past its bytes */
};

static void stage_op_done(struct exs_op *op)
{
    struct stage_op *so = exs_container_of(op, struct stage_op, op);
    struct exs_conn *conn = so->conn;

    /* sendq hands ops back in order: positions are released in order */
    if (op->kind == EXS_OP_SEND)
        conn->stg_head = so->end;
    if (conn->stg_last == op)
        conn->stg_last = NULL;
    free(so);
}

static struct stage_op *stage_op_new(struct exs_conn *conn, enum exs_op_kind kind)
{
    struct stage_op *so = calloc(1, sizeof(*so));

    if (!so)
        return NULL;
    so->conn = conn;
    so->op.kind = kind;
    so->op.state = EXS_OPS_QUEUED;
    so->op.internal = 1;
    so->op.done = stage_op_done;
    so->op.owner = conn;
    return so;
}

static int stage_buffer_locked(struct exs_conn *conn)
{
    int ret;

    if (conn->stg_mem)
        return 0;
    ret = exs__prov_mem_alloc(conn->ctx, conn->p.sndbuf, &conn->stg_mem);
    if (ret) {
        EXS_WARN(PROTO, "conn %p: send buffer of %u bytes: %s; sends stay zero-copy",
                 (void *)conn, conn->p.sndbuf, strerror(-ret));
        conn->p.sndbuf = 0;
    }
    return ret;
}

/* The newest internal op takes len more bytes at stg_tail: it waits, untouched, and its
 * bytes end where the buffer's allocation ends, without wrapping. */
static int stage_appendable(const struct exs_conn *conn, size_t len)
{
    const struct exs_op *op = conn->stg_last;
    uint32_t cap = EXS_MAX(conn->batch_thresh, conn->p.copy_max);

    if (!op || op->state != EXS_OPS_QUEUED || op->posted || op->inflight || op->cancel)
        return 0;
    if (exs_container_of(op, struct stage_op, op)->end != conn->stg_tail)
        return 0;
    /* where the op's bytes end in the buffer (stg_tail % sndbuf is 0 there when they
     * reach the buffer's end) */
    return (size_t)(op->buf - (uint8_t *)conn->stg_mem->addr) + op->len + len <= conn->p.sndbuf &&
           op->len + len <= cap;
}

int exs__stage_send_locked(struct exs_conn *conn, struct exs_op *op)
{
    uint64_t size = conn->p.sndbuf, off, pad = 0;
    struct stage_op *so = NULL;
    uint8_t *dst;

    if (!size || op->kind != EXS_OP_SEND || !op->len || op->len > conn->p.copy_max ||
        conn->state != EXS_CONN_CONNECTED || conn->sendq_user || op->rt)
        return 0;
    if (stage_buffer_locked(conn))
        return 0;
    off = conn->stg_tail % size;
    if (!stage_appendable(conn, op->len)) {
        if (off + op->len > size)
            pad = size - off; /* a copy never wraps: it starts again at 0 */
        if (conn->stg_tail + pad + op->len - conn->stg_head > size)
            return 0; /* full: this one goes zero-copy (and the next ones behind it) */
        so = stage_op_new(conn, EXS_OP_SEND);
        if (!so)
            return 0;
        conn->stg_tail += pad;
        off = conn->stg_tail % size;
        so->op.buf = (uint8_t *)conn->stg_mem->addr + off;
        so->op.mr = conn->stg_mem;
        so->op.lkey = conn->stg_mem->lkey;
        exs_list_add_tail(&conn->sendq, &so->op.link);
        conn->stg_last = &so->op;
    } else if (conn->bwait.first) {
        conn->bwait.first = NULL; /* the held run's bytes changed: built again */
    }
    dst = (uint8_t *)conn->stg_mem->addr + off;
    memcpy(dst, op->buf, op->len);
    conn->stg_last->len += op->len;
    conn->stg_tail += op->len;
    exs_container_of(conn->stg_last, struct stage_op, op)->end = conn->stg_tail;
    conn->stats.sends_copied++;
    conn->stats.bytes_sent += op->len;
    /* handed back now: nothing of the application's waits ahead of it in sendq */
    exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
    op->done(op);
    return 1;
}

int exs__stage_pending_locked(const struct exs_conn *conn)
{
    const struct exs_list *pos;

    exs_list_for_each(pos, &conn->sendq) {
        const struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->internal && op->kind == EXS_OP_SEND && op->state != EXS_OPS_DONE &&
            op->posted < op->len)
            return 1;
    }
    return 0;
}

int exs__stage_shutdown_locked(struct exs_conn *conn)
{
    struct stage_op *so = stage_op_new(conn, EXS_OP_SHUTDOWN);

    if (!so)
        return -ENOMEM;
    exs_list_add_tail(&conn->sendq, &so->op.link);
    return 0;
}

void exs__stage_release_locked(struct exs_conn *conn)
{
    if (conn->stg_mem)
        exs__prov_mem_free(conn->stg_mem);
    conn->stg_mem = NULL;
    conn->stg_last = NULL;
}
