/* SPDX-License-Identifier: MIT */
/* Sampled request tracing: the TRACE exchange (spec/protocol.md §5.1) and its records. */
#ifndef EXS_PROTO_REQTRACE_H
#define EXS_PROTO_REQTRACE_H

#include <stddef.h>
#include <stdint.h>

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"

/*
 * EXS_REQTRACE 0 (make TRACE=0, build-notrace/) compiles request tracing out: EXS_REQTRACE_ON is
 * a constant 0 in front of every hook's call, so the compiler drops the hooks and their
 * branches from the send and receive paths, and EXS_REQTRACE_FEAT_OFF takes the TRACE and STRACE
 * bits out of the hello (sent and accepted), so a peer never sends TRACE records and one that
 * does breaks the protocol. The default build (1) compiles the same code as without these
 * macros. For make bench's comparison only (bench/module.mk).
 */
#ifndef EXS_REQTRACE
#define EXS_REQTRACE 1
#endif
#if EXS_REQTRACE
#define EXS_REQTRACE_ON       1
#define EXS_REQTRACE_FEAT_OFF 0u
#else
#define EXS_REQTRACE_ON       0
#define EXS_REQTRACE_FEAT_OFF ((unsigned)(EXS_WIRE_FEAT_TRACE | EXS_WIRE_FEAT_STRACE))
#endif

/*
 * Every hook below is reached through one predictable branch on the data path: the
 * post hook when EXS_TRACE_SAMPLE_MASK is not 0, the others when the op carries a
 * trace slot (op->rt) or the connection has trace state (conn->rt). All run with
 * conn->lock held. spec/observability.md §8 describes what they record.
 */

/* Sampled messages outstanding at each end of a connection (requests not answered). */
#define EXS_REQTRACE_SLOTS         8
/* Exchanges the clock-offset filter keeps (the one of least round-trip delay is used). */
#define EXS_REQTRACE_OFFSET_WINDOW 8

/* A sampled message at its sender: times are this host's CLOCK_MONOTONIC ns (r_*: the
 * receiver's trace clock, as it sent them). seq: its
 * message number, STREAM: the stream offset just past its last byte. */
struct exs_reqtrace_tx {
    struct exs_reqtrace *owner;
    uint64_t seq, bytes;
    uint64_t t_post, t_wire, t_done, t_req, t_answer_rx; /* t_req T1, t_answer_rx T4 */
    uint64_t r_req, r_arrival, r_delivery, r_answer;     /* the receiver's: T2, ..., T3 */
    uint8_t used, req_sent, done, answered;
};

/* A sampled message at its receiver (request seen, answer not yet appended); times are
 * this host's CLOCK_MONOTONIC ns, sent on the connection's trace clock. */
struct exs_reqtrace_rx {
    uint64_t seq;
    uint64_t t_req, t_arrival, t_delivery; /* 0: not yet */
    uint8_t used, ready, dropped;
};

/* Per-connection trace state, allocated at the first sampled send or request. */
struct exs_reqtrace {
    struct exs_conn *conn;
    uint64_t nsend; /* sends posted so far: the sampling counter n */
    struct exs_reqtrace_tx tx[EXS_REQTRACE_SLOTS];
    struct exs_reqtrace_rx rx[EXS_REQTRACE_SLOTS];
    unsigned rx_wait;  /* rx entries still waiting for their arrival or delivery */
    unsigned rx_ready; /* rx entries whose answer waits for control room */
    uint64_t epoch_ns; /* the trace clock's zero (random, §5.1): the wire says t - epoch_ns */
    int64_t off_ns[EXS_REQTRACE_OFFSET_WINDOW];  /* receiver's trace clock - sender clock */
    uint64_t err_ns[EXS_REQTRACE_OFFSET_WINDOW]; /* its bound: half the round trip */
    unsigned off_count, off_next;
};

/* One completed trace, in the sender's clock (receiver times corrected by offset_ns). */
struct exs_reqtrace_record {
    const void *conn;
    uint64_t seq, bytes;
    uint64_t post_ns, wire_ns, done_ns, answer_ns;
    int64_t arrival_ns, delivery_ns; /* receiver's times minus offset_ns */
    int64_t offset_ns;               /* estimated receiver's trace clock - sender clock */
    uint64_t offset_err_ns;          /* |true offset - offset_ns| <= this */
};

/* Is send number n sampled under mask? (0: off; all ones: every send.) */
static inline int exs__reqtrace_sampled(uint64_t n, uint64_t mask)
{
    return mask && (mask == UINT64_MAX || (n & mask) == 0);
}

/* Sender hooks. post: exs__conn_post of a send (mask != 0); wire_begin: sp_send_one (or,
 * STREAM, st_send_some for the send's first byte) is about to put op on the wire: takes the wire
 * time and appends its request (once), 0 when it could not (no control room: the caller returns
 * "wait"); done: its op finished (exs__conn_op_finish_locked). */
void exs__reqtrace_post_locked(struct exs_conn *conn, struct exs_op *op);
int exs__reqtrace_wire_begin_locked(struct exs_conn *conn, struct exs_op *op);
void exs__reqtrace_done_locked(struct exs_op *op);

/* Receiver hooks. arrival: after a receive completion was handled (conn->rx_seq moved);
 * deliver: op is handed to its owner (conn_deliver_locked); flush: append pending answers. */
void exs__reqtrace_arrival_locked(struct exs_conn *conn);
void exs__reqtrace_deliver_locked(struct exs_conn *conn, struct exs_op *op);
void exs__reqtrace_flush_locked(struct exs_conn *conn);
/* STREAM receiver: bytes were placed into a receive (S_r moved; conn->rt set): a traced
 * send whose last byte is now in a receive is delivered (spec/protocol.md §5.1). */
void exs__reqtrace_stream_placed_locked(struct exs_conn *conn);

/* A TRACE record arrived (length already checked). 0, or -EPROTO: the peer broke §5.1
 * (no feature TRACE, a request out of sequence or beyond EXS_REQTRACE_SLOTS, an answer for no
 * outstanding request, unordered times), -ENOMEM. */
int exs__reqtrace_on_record_locked(struct exs_conn *conn, const struct exs_wire_trace *w);

/* Free conn's trace state (conn release). */
void exs__reqtrace_free_locked(struct exs_conn *conn);

/* Where completed traces go: fn gets one JSON object (no newline) per trace, from any
 * thread with a conn lock held, so it must only queue (the control endpoint's hook).
 * EXS_TRACE_FILE, when set, also gets every record as a line. */
typedef void exs_reqtrace_sink_fn(const char *json, size_t len);
void exs__reqtrace_set_sink(exs_reqtrace_sink_fn *fn);

/* Format a record as one JSON object into buf; returns its length (< size, or 0). */
size_t exs__reqtrace_format(const struct exs_reqtrace_record *r, char *buf, size_t size);

/* Records completed in this process (a counter, for tests and exsctl stat). */
uint64_t exs__reqtrace_completed(void);

#endif
