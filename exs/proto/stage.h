/* SPDX-License-Identifier: MIT */
/* The STREAM send buffer (stage.c, spec/protocol.md §7.5). */
#ifndef EXS_PROTO_STAGE_H
#define EXS_PROTO_STAGE_H

#include "exs/proto/proto.h"

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

#endif
