/* SPDX-License-Identifier: MIT */
/* Keepalive and the timers (keepalive.c, layer 4 of spec/proto-layout.md). */
#ifndef EXS_PROTO_KEEPALIVE_H
#include "exs/proto/proto.h" /* first: it takes the state part below (EXS_PROTO_STATE) */
#endif

#if defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_KEEPALIVE_H_STATE)
#define EXS_PROTO_KEEPALIVE_H_STATE
/* Keepalive (spec/protocol.md §9.1; keepalive.c): its part of struct exs_conn (conn->keepalive). */
struct exs_keepalive_state {
    int heard;         /* a completion succeeded since the timer's last look */
    int probe_out;     /* the probe is posted, not completed */
    int waiting;       /* silent for an interval: waiting for an answer */
    uint32_t fails;    /* intervals that wait stayed unanswered */
    uint64_t heard_ns; /* the timer's first look after the last successful completion
                          (or the establishment) */
    uint64_t probe_ns; /* when the wait for an answer began */
    int ping;          /* feature ALIVE: this wait's PING is out */
    int answer;        /* feature ALIVE: a PING came, its answer is owed */
};
#endif

#if !defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_KEEPALIVE_H)
#define EXS_PROTO_KEEPALIVE_H

#include "exs/proto/conn.h"
#include "exs/proto/proto.h"

/* Both hellos have feature ALIVE: the peer's library answers probes (§9.1). Inline: asked
 * at every completion. */
static inline int exs__conn_ka_alive(const struct exs_conn *conn)
{
    return (conn->peer.features & EXS_WIRE_FEAT_ALIVE) && !exs__conn_window_test();
}
/* A NOP record came (flags: its hdr.flags): a PING is answered at the next progress
 * pass. -EPROTO on a violation (a PING without feature ALIVE). */
int exs__conn_ka_on_nop_locked(struct exs_conn *conn, uint8_t flags);

#endif
