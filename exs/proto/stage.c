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

/* Internal ops kept per connection for the next copied run (a burst of small sends makes
 * one op per ring write: a calloc and a free each, before); at most STAGE_KEEP, freed
 * with the send buffer. */
#define STAGE_KEEP     4u
#define STAGE_RELEASED ((uint32_t)-1)

static void stage_op_put(struct exs_conn *conn, struct exs__stage_op *so)
{
    if (conn->stg_free_n >= STAGE_KEEP) { /* (STAGE_RELEASED too) */
        free(so);
        return;
    }
    memcpy(so, &conn->stg_free, sizeof(void *));
    conn->stg_free = so;
    conn->stg_free_n++;
}

static void stage_op_done(struct exs_op *op)
{
    struct exs__stage_op *so = exs_container_of(op, struct exs__stage_op, op);
    struct exs_conn *conn = so->conn;

    /* internal ops are handed back in order: positions are released in order */
    if (op->kind == EXS_OP_SEND)
        conn->stg_head = so->end;
    if (conn->stg_last == op)
        conn->stg_last = NULL;
    stage_op_put(conn, so);
}

static struct exs__stage_op *stage_op_new(struct exs_conn *conn, enum exs_op_kind kind)
{
    struct exs__stage_op *so = conn->stg_free;

    if (so && conn->stg_free_n != STAGE_RELEASED) {
        memcpy(&conn->stg_free, so, sizeof(void *));
        conn->stg_free_n--;
        memset(so, 0, sizeof(*so));
    } else {
        so = calloc(1, sizeof(*so));
        if (!so)
            return NULL;
    }
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
    conn->stg_cap = EXS_MAX(exs__conn_frag_size(), conn->p.copy_max);
    ret = exs__conn_mem_alloc(conn->ctx, conn->p.sndbuf, EXS_MEM_OTHER, &conn->stg_mem);
    if (ret) {
        EXS_WARN(PROTO, "conn %p: send buffer of %u bytes: %s; sends stay zero-copy", (void *)conn,
                 conn->p.sndbuf, strerror(-ret));
        conn->p.sndbuf = 0;
    }
    return ret;
}

/* May the newest internal op take len more bytes, for the send at pos? It must come
 * right before pos in the stream (only finished sends, which carry no bytes, between
 * them), not have started, and its bytes must end where the buffer's allocation ends,
 * without wrapping. */
static int stage_appendable(const struct exs_conn *conn, const struct exs_list *pos, size_t len)
{
    const struct exs_op *op = conn->stg_last;
    const struct exs_list *prev = pos->prev;

    if (!op || op->state != EXS_OPS_QUEUED || op->posted || op->inflight)
        return 0;
    if (exs_container_of(op, const struct exs__stage_op, op)->end != conn->stg_tail)
        return 0;
    while (prev != &conn->sendq && prev != &op->link) {
        const struct exs_op *o = exs_list_entry(prev, const struct exs_op, link);

        if (o->internal || o->state != EXS_OPS_DONE)
            return 0;
        prev = prev->prev;
    }
    if (prev != &op->link)
        return 0;
    /* where the op's bytes end in the buffer (stg_tail % sndbuf is 0 there when they
     * reach the buffer's end) */
    return (size_t)(op->buf - (uint8_t *)conn->stg_mem->addr) + op->len + len <= conn->p.sndbuf &&
           op->len + len <= exs__stage_cap(conn) &&
           conn->stg_tail + len - conn->stg_head <= conn->p.sndbuf; /* room */
}

/* Copy len bytes from src into the buffer, as the stream's next bytes at pos in sendq (the
 * link of the send they are, or sendq itself for bytes of no op): appended to the newest
 * internal op when it may take them, else in a new internal op placed right before pos.
 * 1 when copied, 0 when the buffer has no room or memory. */
static int stage_copy_at(struct exs_conn *conn, struct exs_list *pos, const void *src, size_t len)
{
    uint64_t size = conn->p.sndbuf, off, pad = 0;
    struct exs__stage_op *so;
    uint8_t *dst;

    if (stage_appendable(conn, pos, len)) {
        /* the run's bytes end at stg_tail, inside the buffer (appendable): no division */
        dst = conn->stg_last->buf + conn->stg_last->len;
    } else {
        off = exs__pos_mod(conn->stg_tail, size);
        if (off + len > size)
            pad = size - off; /* a copy never wraps: it starts again at 0 */
        if (conn->stg_tail + pad + len - conn->stg_head > size)
            return 0;
        so = stage_op_new(conn, EXS_OP_SEND);
        if (!so)
            return 0;
        conn->stg_tail += pad;
        off = exs__pos_mod(conn->stg_tail, size);
        so->op.buf = (uint8_t *)conn->stg_mem->addr + off;
        so->op.mr = conn->stg_mem;
        so->op.lkey = conn->stg_mem->lkey;
        exs_list_add_tail(pos, &so->op.link); /* right before pos */
        conn->stg_last = &so->op;
        dst = so->op.buf;
    }
    exs__stage_put(conn, dst, src, len);
    return 1;
}

/* Copy send op (in sendq, not started) into the buffer, at its place in the stream.
 * 1 when copied (op finished), 0 when the buffer has no room or memory. */
static int stage_copy_locked(struct exs_conn *conn, struct exs_op *op)
{
    if (!stage_copy_at(conn, &op->link, op->buf, op->len))
        return 0;
    /* finished: handed back in posting order, once no send before it waits */
    exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
    return 1;
}

static inline int stage_eligible(const struct exs_conn *conn, const struct exs_op *op)
{
    return op->kind == EXS_OP_SEND && !op->internal && op->state == EXS_OPS_QUEUED && !op->posted &&
           !op->inflight && !op->cancel && op->len && op->len <= conn->p.copy_max && !op->rt;
}

/* No send of the application before op still waits: op's event would follow at once.
 * Copies are only made then, so that (a) a copied send's success is never reported
 * after an earlier send failed, and (b) the buffer's positions follow the stream. */
static int stage_first_waiting(const struct exs_conn *conn, const struct exs_op *op)
{
    const struct exs_list *prev;

    for (prev = op->link.prev; prev != &conn->sendq; prev = prev->prev) {
        const struct exs_op *o = exs_list_entry(prev, const struct exs_op, link);

        if (!o->internal && o->state != EXS_OPS_DONE)
            return 0;
    }
    return 1;
}

int exs__stage_send_locked(struct exs_conn *conn, struct exs_op *op)
{
    if (!conn->p.sndbuf || conn->state != EXS_CONN_CONNECTED || !stage_eligible(conn, op))
        return 0;
    if (!stage_first_waiting(conn, op) || stage_buffer_locked(conn) ||
        !stage_copy_locked(conn, op)) {
        conn->stg_pending = 1; /* copied by a refill once it may be */
        return 0;
    }
    return 1;
}

int exs__stage_copy_bytes_locked(struct exs_conn *conn, const void *buf, size_t len)
{
    /* (the caller checked the rest of stage_eligible and stage_first_waiting: no send of
     * the application is in sendq) */
    return !stage_buffer_locked(conn) && stage_copy_at(conn, &conn->sendq, buf, len);
}

void exs__stage_refill_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    if (!conn->stg_pending || conn->state != EXS_CONN_CONNECTED || !conn->stg_mem)
        return;
    /* the sends waiting at the head of the application's sends, in order */
    exs_list_for_each(pos, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->internal || op->state == EXS_OPS_DONE)
            continue;
        if (!stage_eligible(conn, op) || !stage_copy_locked(conn, op))
            return; /* this one waits (zero-copy, or for room): look again later */
    }
    conn->stg_pending = 0; /* every send is copied or on its way */
}

int exs__stage_pending_locked(const struct exs_conn *conn)
{
    const struct exs_list *pos;

    exs_list_for_each(pos, &conn->sendq)
    {
        const struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->internal && op->kind == EXS_OP_SEND && op->state != EXS_OPS_DONE &&
            op->posted < op->len)
            return 1;
    }
    return 0;
}

int exs__stage_shutdown_locked(struct exs_conn *conn)
{
    struct exs__stage_op *so = stage_op_new(conn, EXS_OP_SHUTDOWN);

    if (!so)
        return -ENOMEM;
    exs_list_add_tail(&conn->sendq, &so->op.link);
    return 0;
}

void exs__stage_release_locked(struct exs_conn *conn)
{
    if (conn->stg_mem)
        exs__conn_mem_free(conn->stg_mem);
    conn->stg_mem = NULL;
    conn->stg_last = NULL;
    while (conn->stg_free && conn->stg_free_n != STAGE_RELEASED) {
        void *so = conn->stg_free;

        memcpy(&conn->stg_free, so, sizeof(void *));
        free(so);
    }
    conn->stg_free = NULL;
    conn->stg_free_n = STAGE_RELEASED; /* an op handed back after this is freed */
}
