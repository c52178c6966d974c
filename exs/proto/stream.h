/* SPDX-License-Identifier: MIT */
/* The STREAM data path (stream.c, spec/protocol.md §7). */
#ifndef EXS_PROTO_STREAM_H
#include "exs/proto/proto.h" /* first: it takes the state part below (EXS_PROTO_STATE) */
#endif

#if defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_STREAM_H_STATE)
#define EXS_PROTO_STREAM_H_STATE
/* STREAM (spec/protocol.md §7; stream.c): its part of struct exs_conn (conn->stream). */
struct exs_stream_state {
    /* STREAM (spec/protocol.md §7): tx_seq is S_s, rx_seq is S_r */
    uint32_t ps;      /* P_s */
    uint32_t pr;      /* P_r */
    uint64_t sr_next; /* S'_r */
    /* return to direct (§7.2): sender side */
    int held;       /* a DRAIN was honoured: no ring writes in
                     * phase stream.ps (cleared when the phase changes) */
    int drain_owed; /* its STOPPED answer is not yet appended */
    /* the linger (§7): waiting in a direct phase for an ADVERT while writes are in flight */
    int lingering;        /* waiting now */
    uint32_t linger_skip; /* direct phases left without a linger */
    uint32_t linger_pen;  /* the skip after the next failed linger / 2 */
    /* receiver side */
    enum exs_stream_drain drain; /* EXS_STREAM_DRAIN_* of phase stream.pr */
    uint64_t drain_pos;          /* STOPPED: the sender's ring writes end here */
    uint32_t streak;             /* ring arrivals in a row that left big receives
                                  * waiting with the ring empty (hysteresis) */
    uint64_t eval_arrived;       /* rd_arrived at the last streak update */
    uint32_t drain_need;         /* streak required now (backoff; 0: not set) */
    int drain_dir;               /* this direct phase began after a DRAIN */
    uint64_t drain_bytes;        /* bytes it delivered directly so far */
    uint64_t drain_t0;           /* when it began, us */
    uint64_t drain_hold;         /* no DRAIN before this time, us (backoff) */
    uint64_t phase_t0;           /* when the sender's phase began, us (0: no
                                  * send yet); direct/indirect_time_us */
};

/* Ring autotuning (spec/protocol.md §7.4; stream_ring.c): its part of struct exs_conn
 * (conn->autotune). */
struct exs_autotune_state {
    int offered;        /* a RESIZE offer is out, not yet answered */
    uint32_t next_size; /* the offered region (autotune.offered) */
    struct exs_prov_mr *next_mem;
    struct exs_prov_grant *next_grant;
    struct exs_prov_mr *old_mem; /* retired region (no grant): holds the ring
                                  * positions below autotune.old_end until consumed */
    uint32_t old_size;
    uint64_t old_end;
    uint64_t win_t0;    /* start of the measuring window, us (0: none) */
    uint64_t win_bytes; /* ring bytes arrived in it */
    uint64_t last_us;   /* last ring arrival seen (idle shrink), us */
    uint64_t rtt_min;   /* smallest round-trip sample of the last
                         * EXS_RTT_MIN_WIN_US, us (0: none) */
    uint64_t rtt_min_t; /* when it was taken, us */
    /* as the writer of the peer's ring: */
    int owed;           /* the peer offered a region: answer (and
                         * switch) before the next ring write */
    uint64_t peer_addr; /* the offer */
    uint32_t peer_size, peer_rkey;
    uint32_t peer_init; /* the peer's ring before its first switch (0: none yet) */
};
#endif

#if !defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_STREAM_H)
#define EXS_PROTO_STREAM_H

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"
#include "exs/util/list.h"
#include "exs/util/util.h"

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
 * allocated by the caller). 0 or -EPROTO (positions that no legal history gives: recorded
 * as ring-overrun, though every arrival was checked against its ring). */
int exs__stream_ring_cut_locked(struct exs_conn *conn);

/* The autotuning decision (§7.4), a pure function. */
enum exs_ring_tune_verdict {
    EXS_RING_KEEP = 0,
    EXS_RING_GROW,    /* *size_p: 2 or EXS_RING_GROW_FAST x size (at most max) */
    EXS_RING_SHRINK,  /* *size_p: init */
    EXS_RING_REFUSED, /* a grow was due but would pass the process budget */
};
struct exs_ring_tune_in {
    uint32_t size, init, max; /* the ring now, at creation, ring_max */
    uint64_t budget, in_use;  /* ring_budget (0: none), ring bytes of the process now */
    uint64_t win_bytes;       /* ring bytes that arrived per min_rtt in the last window */
    int reader_waiting;       /* a receive is posted with the ring copied out: the
                               * application keeps up, the ring is what limits */
    uint64_t idle_us;         /* since the last ring arrival */
    uint64_t idle_limit_us;   /* ring_idle_ms in us (0: never shrink) */
};
enum exs_ring_tune_verdict exs__stream_ring_tune(const struct exs_ring_tune_in *in,
                                                 uint32_t *size_p);

#define PHASE_IS_DIRECT(_p)   (((_p)&1u) == 0)
#define PHASE_IS_INDIRECT(_p) (((_p)&1u) == 1)

/* Shared by stream.c and stream_ring.c (the first two inline: on the path of every
 * message) */
/* The first receive not yet satisfied, or NULL. */
static inline struct exs_op *exs__stream_head_recv(struct exs_conn *conn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state != EXS_OPS_DONE)
            return op;
    }
    return NULL;
}

/* Where ring position pos lives: in the retired region while below its end, else in the
 * current one; *contig: bytes readable there without a wrap or a region change. */
static inline uint8_t *exs__stream_ring_at(struct exs_conn *conn, uint64_t pos, uint64_t *contig)
{
    uint32_t off;

    if (conn->autotune.old_mem && pos < conn->autotune.old_end) {
        off = (uint32_t)(pos % conn->autotune.old_size);
        *contig = EXS_MIN((uint64_t)(conn->autotune.old_size - off), conn->autotune.old_end - pos);
        return (uint8_t *)conn->autotune.old_mem->addr + off;
    }
    off = (uint32_t)(pos % conn->p.ring_size);
    *contig = conn->p.ring_size - off;
    return conn->ring + off;
}
/* The retired region goes once every byte written into it was copied out (§7.4). */
void exs__stream_ring_retire_locked(struct exs_conn *conn);
/* The largest ring write the sender makes now (§7.4). */
uint32_t exs__stream_ring_piece_max(const struct exs_conn *conn);
/* Autotuning's look after a ring arrival (§7.4). */
void exs__stream_ring_tune_locked(struct exs_conn *conn);

#endif
