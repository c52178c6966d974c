/* SPDX-License-Identifier: MIT */
/* A tiny protocol driver for unit tests: two exs_conns connected through the mock provider. */
#ifndef EXS_TESTS_MOCK_PROTO_H
#define EXS_TESTS_MOCK_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "tests/mock/mock_prov.h"

/* One end: its ctx (one per side, as two processes) and its conn. */
struct pt_side {
    struct exs_prov_ctx *ctx;
    struct exs_conn *conn;
    int established; /* cb->established calls */
    int est_err;
    int dead;           /* cb->dead calls */
    uint64_t delivered; /* ops handed back (op->done) */
};

struct pt_pair {
    struct pt_side a; /* the active side (connects) */
    struct pt_side b; /* the passive side (accepts) */
    struct exs_prov_listener *lis;
    struct exs_conn_params pa, pb; /* parameters of each side */
    int reject_reason;             /* b's last reject (0: none) */
};

/* An operation with its own registration and a record of its delivery. */
struct pt_op {
    struct exs_op op;
    struct pt_side *side;
    struct exs_prov_mr *mr;
    int done;       /* op->done calls */
    uint64_t order; /* side->delivered when it was handed back */
};

/* Default parameters: SEQPACKET or STREAM, 8 credits, 4 KiB ring, eager below 1 KiB. */
void pt_params(struct exs_conn_params *p, int sock_type);
/* Both sides' defaults of sock_type, resumable (may be cut over), shm as given. */
void pt_params_resumable(struct pt_pair *pp, int sock_type, int shm);

/* Open both ctxs and a listener on b (pa/pb already filled, else defaults of type). */
void pt_open(struct pt_pair *pp, int sock_type);
/* a connects, everything runs until idle; asserts both established without error. */
void pt_connect(struct pt_pair *pp);
/* Create a's conn and connect it to addr (NULL: b's listener); no running. */
void pt_connect_to(struct pt_pair *pp, const struct sockaddr *addr, socklen_t len);
/* Dispatch completions and events as the engine does and step the fabric until
 * nothing moves; returns the number of fabric steps. Fails the test after a bound. */
long pt_run(struct pt_pair *pp);
/* Dispatch what is queued on one ctx (completions, then each cm event). */
int pt_dispatch_ctx(struct pt_pair *pp, struct exs_prov_ctx *ctx);
/* Dispatch what is queued without stepping the fabric; returns entries handled. */
int pt_dispatch(struct pt_pair *pp);
/* Close what is left (conns must be DEAD or IDLE first: close, run), destroy the
 * listener and ctxs; asserts no conn leaks and no provider contract violation. */
void pt_close(struct pt_pair *pp);
/* The driver's connection callbacks: counted on the pt_side that owns the conn (for
 * tests that build their own exs_conn_cb around them). */
void pt_on_established(struct exs_conn *conn, int err);
void pt_on_dead(struct exs_conn *conn);
/* Orderly end of a test: both sides close, everything runs out, both conns die, no RNR,
 * then pt_close and the mock's reordering off. */
void pt_close_both(struct pt_pair *pp);
/* Post a send of len pattern bytes (pattern offset off) from side. */
void pt_send_pattern(struct pt_op *o, struct pt_side *side, void *buf, size_t len, uint64_t off);

/* Prepare op (kind, buffer registered for local access on side's ctx, flags). */
void pt_op_init(struct pt_op *o, struct pt_side *side, enum exs_op_kind kind, void *buf, size_t len,
                int flags);
/* exs__conn_post; returns its result. */
int pt_post(struct pt_op *o);
/* Release the op's registration (after it was handed back). */
void pt_op_fini(struct pt_op *o);
/* Post a receive of len bytes into buf (zeroed first) with flags; asserts the post works. */
void pt_recv_post(struct pt_op *o, struct pt_side *side, void *buf, size_t len, int flags);
/* The statistics of a side's connection. */
void pt_stats(struct pt_side *side, struct exs_sock_stats *st);
/* One delivery, with this result and errno (a macro: failures name the caller's line). */
#define pt_assert_done(_o, _result, _err)                                                          \
    do {                                                                                           \
        ck_assert_int_eq((_o)->done, 1);                                                           \
        ck_assert_int_eq((_o)->op.result, (_result));                                              \
        ck_assert_int_eq((_o)->op.err, (_err));                                                    \
    } while (0)

/* Fill buf with the pattern of stream offset off (byte i = f(off + i)). */
void pt_fill(void *buf, size_t len, uint64_t off);
/* 1 when buf holds the pattern of offset off. */
int pt_check(const void *buf, size_t len, uint64_t off);

/* n sends s[i] of len bytes and their receives r[i] (into rb + i * len, pattern of offset
 * i * len): each delivered whole, the bytes verified; every op finished. */
void pt_assert_pairs_done(struct pt_op *s, struct pt_op *r, int n, const uint8_t *rb, size_t len);

/* The connection's first protocol violation is rule _rule (enum exs_pv_rule,
 * exs/proto/violation.h): the reason a reset is asserted by, not only ECONNRESET. A
 * failure names both rules and the recorded detail. */
#define ck_assert_pv(_conn, _rule)                                                                 \
    do {                                                                                           \
        struct exs_pv_state _pv;                                                                   \
        int _got = exs__pv_get((_conn), &_pv);                                                     \
        ck_assert_msg(_got == 0 && _pv.rule == (_rule),                                            \
                      "protocol violation %s expected, got %s %s: %s", exs__pv_rule_name(_rule),   \
                      exs__pv_rule_name(_got ? 0u : _pv.rule), exs__pv_rec_name(_pv.rec_type),     \
                      _got ? "(none recorded)" : _pv.detail);                                      \
    } while (0)

/* ck_assert_pv, then the connection's violation forgotten (pt_pv_clear): for a test that
 * calls a check several times on one connection, each call's rule asserted. */
#define ck_assert_pv_take(_conn, _rule)                                                            \
    do {                                                                                           \
        ck_assert_pv((_conn), (_rule));                                                            \
        pt_pv_clear(_conn);                                                                        \
    } while (0)
/* Forget conn's recorded violation (takes conn->lock). */
void pt_pv_clear(struct exs_conn *conn);

/* The mock's RNR counters of both sides added. */
uint64_t pt_rnr(struct pt_pair *pp);

/* ---- the fallback of a cut-over (spec/protocol.md §9.2) ----
 * Each side gets a fallback ctx; b's has a listener of its own for resume requests, which
 * go to the session they name as exs/api/sock.c hands them (hello checked, then
 * exs__conn_resume_request), unless on_request takes them. pt_fb_cb is the owner's
 * callbacks with a fallback (sock.c's, on the mock: a's new path goes to that listener,
 * an op's buffer is registered again on the new ctx). */
struct pt_fb {
    struct exs_prov_ctx *ctx[2];   /* a's, b's */
    struct exs_prov_listener *lis; /* on ctx[1] */
    int sock_type;
    /* a connect request on the listener: 1 taken (accepted or rejected), 0 the default */
    int (*on_request)(const struct exs_prov_cm_event *ev);
};
extern struct pt_fb pt_fb;
extern const struct exs_conn_cb pt_fb_cb;
/* After pt_connect: open the fallback ctxs and listener; both conns take pt_fb_cb. */
void pt_fb_open(struct pt_pair *pp);
/* pt_run over the primary and the fallback ctxs. */
void pt_fb_run(struct pt_pair *pp);
/* Dispatch what the fallback ctx i holds (completions, events); entries handled. */
int pt_fb_drain(int i);
/* Destroy the listener and close the fallback ctxs (after pt_close). */
void pt_fb_close(void);

#endif
