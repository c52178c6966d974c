/* SPDX-License-Identifier: MIT */
/* Completion, control-record and event dispatch (dispatch.c, layer 5 of spec/proto-layout.md). */
#ifndef EXS_PROTO_DISPATCH_H
#define EXS_PROTO_DISPATCH_H

#include "exs/proto/proto.h"

/* One completion, conn->lock held; the caller kicks the conn afterwards. */
void exs__conn_on_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
/* The conn is going away (DOWN on) or cut over: its queued work requests complete as
 * flushed, as the provider completes the posted ones. */
void exs__conn_wrq_flush_locked(struct exs_conn *conn);
void exs__conn_path_take_locked(struct exs_conn *conn, struct exs_conn_path *path);
/* A receive completion of a path conn took, held until then (by a resume request on
 * trial): handled as if it came now (records, re-post, a credit owed). */

#endif
