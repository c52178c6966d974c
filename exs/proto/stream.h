/* SPDX-License-Identifier: MIT */
/* The STREAM data path (stream.c, spec/protocol.md §7). */
#ifndef EXS_PROTO_STREAM_H
#define EXS_PROTO_STREAM_H

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"

void exs__stream_send_progress_locked(struct exs_conn *conn);
void exs__stream_recv_progress_locked(struct exs_conn *conn);
int exs__stream_on_data_locked(struct exs_conn *conn, uint32_t imm, uint32_t len);
int exs__stream_on_advert_locked(struct exs_conn *conn, const struct exs_advert *a);
/* DRAIN record (§7.2): 0, or -EPROTO for a record that breaks the rules. */
int exs__stream_on_drain_locked(struct exs_conn *conn, const struct exs_wire_drain *d);
/* The STREAM fields of the statistics (phase times, ring fill) into st. */
void exs__stream_stats_locked(struct exs_conn *conn, struct exs_sock_stats *st);
void exs__stream_enter_indirect_locked(struct exs_conn *conn);
void exs__stream_dead_drain_locked(struct exs_conn *conn);
/* RESIZE record (§7.4): 0, or -EPROTO for a record that breaks the rules. */
int exs__stream_on_resize_locked(struct exs_conn *conn, const struct exs_wire_resize *r);
/* Ring autotuning's periodic look (idle shrink, §7.4): ms until it is due again, 0: none. */
uint64_t exs__stream_ring_timer_locked(struct exs_conn *conn, uint64_t now_us);
/* Offer the peer a ring region of size bytes now (§7.4; autotuning, and tests). 0,
 * -EBUSY (an offer or a retired region is outstanding), -EOPNOTSUPP (SEQPACKET, the
 * peer lacks the feature), -ENOBUFS (budget), -EINVAL, or a provider error. */
int exs__stream_ring_offer_locked(struct exs_conn *conn, uint32_t size, int budget);
/* Free the regions of autotuning (conn teardown). */
void exs__stream_ring_release_locked(struct exs_conn *conn);
/* The ring at a cut-over (§9.2, The ring at the cut), after the old endpoint and its
 * grants are gone: an offer out dies, an answer owed is dropped, every unread byte ends
 * in one retired region, and p.ring_size becomes the size of the new path's ring (to be
 * allocated by the caller). 0 or -EPROTO (positions that no legal history gives). */
int exs__stream_ring_cut_locked(struct exs_conn *conn);

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
enum exs_ring_tune_verdict exs__stream_ring_tune(const struct exs_ring_tune_in *in, uint32_t *size_p);

#define PHASE_IS_DIRECT(_p)   (((_p) & 1u) == 0)
#define PHASE_IS_INDIRECT(_p) (((_p) & 1u) == 1)

/* Shared by stream.c and stream_ring.c */
/* The first receive not yet satisfied, or NULL. */
struct exs_op *exs__stream_head_recv(struct exs_conn *conn);
/* Where ring position pos lives: in the retired region while below its end, else in the
 * current one; *contig: bytes readable there without a wrap or a region change. */
uint8_t *exs__stream_ring_at(struct exs_conn *conn, uint64_t pos, uint64_t *contig);
/* The retired region goes once every byte written into it was copied out (§7.4). */
void exs__stream_ring_retire_locked(struct exs_conn *conn);
/* The largest ring write the sender makes now (§7.4). */
uint32_t exs__stream_ring_piece_max(const struct exs_conn *conn);
/* Autotuning's look after a ring arrival (§7.4). */
void exs__stream_ring_tune_locked(struct exs_conn *conn);

#endif
