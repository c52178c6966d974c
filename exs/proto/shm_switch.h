/* SPDX-License-Identifier: MIT */
/* Shared memory chosen by itself (shm_switch.c, layer 4 of spec/proto-layout.md;
 * spec/provider-shm.md, Chosen by itself). */
#ifndef EXS_PROTO_SHM_SWITCH_H
#include "exs/proto/proto.h" /* first: it takes the state part below (EXS_PROTO_STATE) */
#endif

#if defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_SHM_SWITCH_H_STATE)
#define EXS_PROTO_SHM_SWITCH_H_STATE
/* Why a connection is on its path (EXS_SO_PATH, exsctl stat). */
enum exs_shmsw_reason {
    EXS_SHMSW_OFF = 0,     /* no shm here (EXS_SHM off, or the primary is not tcp) */
    EXS_SHMSW_PEER_NO,     /* the peer's hello has no feature SHM */
    EXS_SHMSW_DECIDING,    /* offers exchanged, not decided yet */
    EXS_SHMSW_OTHER_HOST,  /* another boot id */
    EXS_SHMSW_OTHER_NETNS, /* another network name space */
    EXS_SHMSW_OTHER_USER,  /* another user */
    EXS_SHMSW_NO_LISTENER, /* the peer's shm listener was not found */
    EXS_SHMSW_NOT_PEER,    /* the peer's shm listener is not the process it claimed */
    EXS_SHMSW_NO_ROOM,     /* the passive side had no room for SHM_SWITCH */
    EXS_SHMSW_ENDING,      /* shut down before the switch */
    EXS_SHMSW_SWITCHING,   /* the cut-over to shm began (on shm once it is done) */
    EXS_SHMSW_DECLINED,    /* passive: the active side declined our SHM_SWITCH */
};

/* Its part of struct exs_conn (conn->shmsw). */
struct exs_shmsw_state {
    int reason;        /* enum exs_shmsw_reason */
    int sent;          /* our SHM_OFFER is sent */
    int got;           /* the peer's SHM_OFFER was taken */
    int match;         /* ... and names our host, name space and user */
    int sw;            /* SHM_SWITCH sent (passive) or received (active) */
    int started;       /* active: the cut-over began */
    int declined;      /* SHM_SWITCH with DECLINED sent (active) or received (passive) */
    int err;           /* NO_LISTENER: the errno of the look */
    uint32_t peer_pid; /* the pid the peer's offer claimed */
};
#endif

#if !defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_SHM_SWITCH_H)
#define EXS_PROTO_SHM_SWITCH_H

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"

/* Just established, after the SESSION record: both hellos have feature SHM: our
 * SHM_OFFER is appended; else the reason is noted (and the cut-over that only shm made
 * possible is given up). */
void exs__shmsw_established_locked(struct exs_conn *conn);
/* The peer's SHM_OFFER and SHM_SWITCH records (dispatch.c's table): 0 or -EPROTO. */
int exs__shmsw_on_offer(struct exs_conn *conn, const uint8_t *rec,
                        const struct exs_wire_ctrl_hdr *h);
int exs__shmsw_on_switch(struct exs_conn *conn, const uint8_t *rec,
                         const struct exs_wire_ctrl_hdr *h);
/* "<provider>: <reason>" of conn's path into buf (conn->lock held). */
void exs__shmsw_path_locked(const struct exs_conn *conn, char *buf, size_t len);
/* Register the counters (set "shm_path"; once, with the proto set). */
void exs__shmsw_cset_register(void);

#endif
