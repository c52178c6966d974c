/* SPDX-License-Identifier: MIT */
/* The cut-over (resume.c, spec/protocol.md §9.2). */
#ifndef EXS_PROTO_RESUME_H
#include "exs/proto/proto.h" /* first: it takes the state part below (EXS_PROTO_STATE) */
#endif

#if defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_RESUME_H_STATE)
#define EXS_PROTO_RESUME_H_STATE
/* A connection that may be cut over keeps a copy of each unsignaled send's bytes, whose
 * event was delivered at its post (spec/protocol.md §6.4, §9.2, Replay): the last
 * EXS_RSM_COPIES of them, a ring allocated once and filled by conn.c, so a cut-over
 * replays those the peer did not get (resume.c). At most EXS_QUIET_MAX unsignaled writes may be
 * unacknowledged at once, so the oldest copy a new one takes the place of was acknowledged. */
#define EXS_RSM_COPIES    16u  /* EXS_QUIET_MAX */
#define EXS_RSM_COPY_SIZE 128u /* CONN_CTRL_INLINE: the largest inline write */
struct exs_rsm_copy {
    uint64_t pos; /* STREAM: the position of its first byte; SEQPACKET: its message number */
    uint32_t len; /* bytes (1 to EXS_RSM_COPY_SIZE) */
    int flags;    /* the send's MSG_* flags */
    uint8_t data[EXS_RSM_COPY_SIZE];
};
struct exs_rsm_quiet {
    uint32_t next;  /* the slot of the next copy (the oldest once all are used) */
    uint32_t n;     /* copies kept */
    uint64_t floor; /* the position past the newest copy given up (its slot taken) */
    struct exs_rsm_copy c[EXS_RSM_COPIES];
};
/* The cut-over (spec/protocol.md §9.2; resume.c, resume_sess.c): its part of struct exs_conn
 * (conn->resume). */
struct exs_resume_state {
    /* the cut-over itself (resume.c) */
    int over;                                  /* cut over once: never again */
    int disc;                                  /* RESUMING: the old endpoint's DISCONNECTED seen */
    int abandon;                               /* RESUMING: the old path is silent (keepalive):
                                                * its endpoint goes without a drain */
    int newpath;                               /* RESUMING: the new endpoint exists */
    int peer_wait;                             /* new path: the peer's RESUME not yet applied */
    int peer_got;                              /* ... but it arrived before our ESTABLISHED */
    int fail;                                  /* RESUMING: errno that ends the conn at the next
                                                * progress-thread look (0: none) */
    uint64_t t0_ns;                            /* RESUMING began (bounded by connect_timeout_ms) */
    struct exs_wire_resume peer;               /* the peer's RESUME (resume.peer_got) */
    uint8_t key[2 * EXS_WIRE_SESSION_KEY_LEN]; /* K_A || K_B: the
                                                * resume proof's HMAC key (SESSION records) */
    int keys;                                  /* EXS_RSM_KEY_* known */
    uint8_t nonce[EXS_WIRE_NONCE_LEN];         /* active: nonce_A of its
                                                * resume connect */
    struct exs_rsm_pend *pend;                 /* passive: a resume request on trial, its new
                                                * path made on the side (resume.c) */
    struct exs_conn *next;                     /* the registry of passive sessions (resume.c) */
    uint32_t refs;                             /* registry: finders using the conn now */
    int gone;                                  /* registry: destroyed while a finder held it;
                                                * the last finder frees it (both under the
                                                * registry's lock) */
    /* RESUMING bounded (spec/protocol.md §9.2, The wait; resume.c) */
    int peer_closed;           /* RESUMING: the old endpoint's DISCONNECTED
                                * said the peer closed it (no cut-over) */
    int waiting;               /* in the wait list (registry's lock) */
    int evicting;              /* in the eviction list, held (resume.refs) */
    struct exs_list wait_link; /* in one of the two (registry's lock) */
    /* unsignaled sends of a connection that may be cut over (§6.4; conn.c, resume.c) */
    struct exs_rsm_quiet *quiet;   /* the copies (NULL until the first such send) */
    uint64_t tx_sig;               /* resume_tx_done as the last send that ended otherwise
                                    * than at its post left it: what the peer surely has
                                    * (the RESUME check's floor with the copies') */
    struct exs_rsm_replay *replay; /* the copies the cut-over sends again, in flight */
    int rx_gap; /* RESUMING: a receive of the old path failed (not flushed): the receive
                 * completions behind it are not taken (what arrived is a prefix) */
};
#endif

#if !defined(EXS_PROTO_STATE) && !defined(EXS_PROTO_RESUME_H)
#define EXS_PROTO_RESUME_H

#include "exs/proto/proto.h"
#include "exs/util/sha256.h"

/* resume.c: the cut-over's identity (spec/protocol.md §9.2) */
/* Both sides may be cut over: this side is resumable and the peer's hello has the bit. */
int exs__resume_negotiated(const struct exs_conn *conn);
/* Just established, right after the RING record: each side of a resumable connection
 * draws its key and appends its SESSION record; the passive side registers the session
 * under the token its key gives (a failure to draw a key ends the conn). */
void exs__resume_established_locked(struct exs_conn *conn);
/* The resume proof (§9.2): the token a passive side's key K_B gives (the first 8 bytes of
 * SHA-256(K_B), big endian), and HMAC-SHA256(key = K_A || K_B, label || nonce_A ||
 * nonce_B) into out (32 bytes; MAC_B is its first 8). */
uint64_t exs__resume_token_of(const uint8_t *kb);
void exs__resume_mac(const uint8_t *key, uint8_t label, const uint8_t *nonce_a,
                     const uint8_t *nonce_b, uint8_t *out);
/* A peer's SESSION / RESUME record (length checked): 0, or -EPROTO (recorded, §10). */
int exs__resume_on_session_locked(struct exs_conn *conn, const struct exs_wire_session *s);
int exs__resume_on_resume_locked(struct exs_conn *conn, const struct exs_wire_resume *r);
/* The path of conn failed (cause; disc: it was the DISCONNECTED event; silent: the path
 * went silent, a keepalive timeout, so its drain is not waited for): 1 when conn is
 * (now, or already) RESUMING, the caller then leaves it alone; 0 when it is not cut
 * over (counted as above) and the caller ends it as before (§9.2, When). */
int exs__resume_begin_locked(struct exs_conn *conn, const char *cause, int disc, int silent);
/* exs__conn_fail_locked is ending conn (err, why): 1 when it is cut over instead (its
 * endpoint is no longer connected: the path failed first, whatever found it), or is
 * RESUMING (the failure ends it at the next progress-thread look); 0: end it. */
int exs__resume_on_fail_locked(struct exs_conn *conn, int err, const char *why);
/* Progress thread, RESUMING: the old endpoint drained: make the new path (active:
 * connect; passive: take the new path of a resume request whose proof checked out); a
 * failure noted: end the conn. */
void exs__resume_progress_locked(struct exs_conn *conn);
/* A cm event while RESUMING (the old endpoint's or the new one's). */
void exs__resume_on_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev);
/* RESUMING, or a new path waiting for the peer's RESUME: past connect_timeout_ms the conn
 * ends with ETIMEDOUT. ms until the deadline, 0 once it ended the conn. */
uint64_t exs__resume_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms);
/* A resume request on trial (passive side, §9.2): its new path's endpoint has the conn as
 * its user, so its completions and events come here first. 1 when cqe / ev was the
 * trial's (handled: held, or the proof checked), 0 when it is the conn's own. */
int exs__resume_pend_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
int exs__resume_pend_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev);
/* Its deadline (connect_timeout_ms from the accept): past it, the request is refused.
 * Returns next (the conn timer's ms until its next look, 0: none) lowered to the trial's
 * deadline. */
uint64_t exs__resume_pend_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms,
                                       uint64_t next);
/* The conn ends (destroy 0: its endpoint is disconnected, the objects go at a later safe
 * point; destroy 1, the conn is freed: everything goes now). Not counted. */
void exs__resume_pend_end_locked(struct exs_conn *conn, int destroy);
/* No cut-over can happen on conn any more (shm_switch.c: it stays on its path; not one
 * under way, whose copies the cut-over itself takes): resume.over set, and the copies of
 * its unsignaled sends (resume.quiet) freed now, their memory given back, not at close. */
void exs__resume_give_up_locked(struct exs_conn *conn);
/* exs_close or an abort while being cut over: the conn ends now (1), else 0. */
int exs__resume_close_locked(struct exs_conn *conn);
/* A posted op registered on another context than the conn's (a cut-over happened): its
 * registration on the conn's context. 0 or -errno. */
int exs__resume_op_mr_locked(struct exs_conn *conn, struct exs_op *op);
/* The conn is destroyed: out of the registry of sessions. 1: the caller frees it now;
 * 0: a resume request's finder still holds it and frees it (exs__conn_free) when done. */
int exs__resume_forget(struct exs_conn *conn);
/* conn leaves RESUMING (conn->lock held): it no longer counts against resume_max. */
void exs__resume_wait_leave(struct exs_conn *conn);
/* Connections evicted from the wait and not yet ended (resume_sess.c; atomic). */
extern uint32_t exs__resume_nevict;
void exs__resume_evict_all(void);
/* End the connections evicted from the wait list (spec/protocol.md §9.2, The wait): run
 * by the progress thread's entry points into proto once they hold no conn lock. Inline:
 * every run of completions asks, and mostly none is. */
static inline void exs__resume_evict_run(void)
{
    if (__atomic_load_n(&exs__resume_nevict, __ATOMIC_ACQUIRE))
        exs__resume_evict_all();
}
/* A forked child (exs__proto_fork_child): the registry, the wait lists and the trials
 * start empty; the _sess one is the registry's part (resume_sess.c). */
void exs__resume_fork_child(void);
void exs__resume_sess_fork_child(void);
void exs__conn_on_rx_held_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);
/* Register the counters (once, with the proto set). */
void exs__resume_cset_register(void);
/* What has arrived over the path so far: STREAM bytes (placed in receives or waiting in
 * the ring), SEQPACKET messages. Final once the old endpoint is drained (§9.2). */
uint64_t exs__resume_arrived_locked(const struct exs_conn *conn);
/* This side's RESUME record for the new path: the token and what arrived (§9.2). */
void exs__resume_record_locked(const struct exs_conn *conn, struct exs_wire_resume *r);
/* The peer's RESUME on a new path, hostile until checked (§9.2): flags 0, our token, the
 * other kind's position 0, and a position at least what we saw completed and at most
 * what we posted. 0, or -EPROTO (recorded: rule resume; reserved for flags). */
int exs__resume_check_locked(struct exs_conn *conn, const struct exs_wire_resume *r);

/* The lowest position a RESUME may state: what the peer surely has (resume.tx_sig), and
 * past the copies given up; resume_tx_done on a conn without copies. */
uint64_t exs__resume_low_locked(const struct exs_conn *conn);

/* Shared by resume.c and resume_sess.c */
/* Process counters of the cut-over (counter set "fallback", resume_sess.c). */
struct exs_resume_counters {
    uint64_t fallback_sessions;
    uint64_t fallback_resume_failures;
    uint64_t fallback_resumes;
    uint64_t fallback_replayed_bytes;
    uint64_t fallback_resume_evicted;
    uint64_t fallback_resume_refused;
};
extern struct exs_resume_counters exs__resume_cnt;
/* The registry's lock (resume_sess.c): the passive sessions, the wait and eviction lists. */
extern pthread_mutex_t exs__resume_reg_lock;
/* The session named token, or NULL: every entry is compared, without a branch on the
 * bytes (a peer learns nothing from the time a wrong token takes). A conn found is held
 * (resume.refs) until exs__resume_registry_put: its socket may be closed and the conn destroyed
 * by another thread meanwhile, and the finder then frees it. */
struct exs_conn *exs__resume_registry_find(uint64_t token);
void exs__resume_registry_put(struct exs_conn *conn);
/* len random bytes into buf. 0 or -errno. */
int exs__resume_random(void *buf, size_t len);
void exs__resume_conn_mac(const struct exs_conn *conn, uint8_t label, const uint8_t *nonce_a,
                          const uint8_t *nonce_b, uint8_t out[EXS_SHA256_LEN]);
/* conn (its lock held), its old path over, joins the wait; while more than resume_max
 * wait, the oldest is evicted (never conn itself: resume_max is at least 1). */
void exs__resume_wait_join_locked(struct exs_conn *conn);
/* The next connection evicted from the wait (held: resume.refs), out of the eviction list;
 * NULL when none is. */
struct exs_conn *exs__resume_evict_pop(void);

#endif
