/* SPDX-License-Identifier: MIT */
/* Sender batching (batch.c, spec/protocol.md §6.1, §7.1). */
#ifndef EXS_PROTO_BATCH_H
#define EXS_PROTO_BATCH_H

#include "exs/proto/proto.h"
#include "exs/util/util.h"

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
void exs__batch_alone_locked(struct exs_conn *conn, struct exs_op *op, batch_fit_fn fit);
/* Would a run of one leave batching's threshold as it is (off, or at its floor already:
 * exs__batch_alone_locked then changes nothing but bwait.first)? */
static inline int exs__batch_alone_idle(const struct exs_conn *conn)
{
    return !conn->batch_thresh || conn->batch_thresh == EXS_MIN(EXS_BATCH_FLOOR, conn->p.batch_max);
}
void exs__batch_on_cqe_locked(struct exs_conn *conn, uint32_t slot, int ok);
void exs__batch_release_locked(struct exs_conn *conn);

#endif
