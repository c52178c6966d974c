/* SPDX-License-Identifier: MIT */
/* Keepalive and the timers (keepalive.c, layer 4 of spec/proto-layout.md). */
#ifndef EXS_PROTO_KEEPALIVE_H
#define EXS_PROTO_KEEPALIVE_H

#include "exs/proto/proto.h"

/* Both hellos have feature ALIVE: the peer's library answers probes (§9.1). */
int exs__conn_ka_alive(const struct exs_conn *conn);
/* A NOP record came (flags: its hdr.flags): a PING is answered at the next progress
 * pass. -EPROTO on a violation (a PING without feature ALIVE). */
int exs__conn_ka_on_nop_locked(struct exs_conn *conn, uint8_t flags);

#endif
