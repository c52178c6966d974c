/* SPDX-License-Identifier: MIT */
/* The cut-over of a connection to another path (spec/protocol.md §9.2): identity, positions,
 * the RESUMING state, the new path and the replay. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/random.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/* Process counters of the cut-over, in the set "fallback" beside the engine's (lookups
 * of one set name add up). */
static struct {
    uint64_t fallback_sessions;
    uint64_t fallback_resume_failures;
    uint64_t fallback_resumes;
    uint64_t fallback_replayed_bytes;
} resume_cnt;

static const struct exs_counter_desc resume_counter_desc[] = {
    EXS_COUNTER(__typeof__(resume_cnt), fallback_sessions,
                "connections that took a SESSION token (both sides resumable, policy any)"),
    EXS_COUNTER(__typeof__(resume_cnt), fallback_resume_failures,
                "of those: the path failed mid-stream and the connection was not resumed"),
    EXS_COUNTER(__typeof__(resume_cnt), fallback_resumes,
                "of those: cut over to the fallback mid-stream and continued (each end counts)"),
    EXS_COUNTER(__typeof__(resume_cnt), fallback_replayed_bytes,
                "bytes sent again over a new path (STREAM bytes, SEQPACKET messages sent whole "
                "again: sent on the old path, not arrived)"),
};

static struct exs_counter_set resume_cset = {
    .name = "fallback",
    .desc = resume_counter_desc,
    .count = sizeof(resume_counter_desc) / sizeof(resume_counter_desc[0]),
    .base = &resume_cnt,
};

void exs__resume_cset_register(void)
{
    exs__counters_register(&resume_cset);
}

int exs__resume_negotiated(const struct exs_conn *conn)
{
    return conn->p.resumable && (conn->peer.features & EXS_WIRE_FEAT_RESUMABLE);
}

/* The passive side's sessions, found by token when a resume request comes in (a leaf
 * lock: taken alone, or inside a conn->lock). A conn is destroyed on the progress thread
 * only, where requests are handled too, so one found here is alive. */
static pthread_mutex_t resume_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct exs_conn *resume_reg;

static void resume_registry_add(struct exs_conn *conn)
{
    EXS_MUTEX_LOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    conn->rsm_next = resume_reg;
    resume_reg = conn;
    EXS_MUTEX_UNLOCK(&resume_reg_lock, EXS_LOCK_LEAF);
}

int exs__resume_forget(struct exs_conn *conn)
{
    int now;

    EXS_MUTEX_LOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    for (struct exs_conn **pp = &resume_reg; *pp; pp = &(*pp)->rsm_next)
        if (*pp == conn) {
            *pp = conn->rsm_next;
            break;
        }
    now = conn->rsm_refs == 0;
    conn->rsm_gone = !now;
    EXS_MUTEX_UNLOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    return now;
}

/* The session named token, or NULL: every entry is compared, without a branch on the
 * bytes (a peer learns nothing from the time a wrong token takes). A conn found is held
 * (rsm_refs) until resume_registry_put: its socket may be closed and the conn destroyed
 * by another thread meanwhile, and the finder then frees it. */
static struct exs_conn *resume_registry_find(uint64_t token)
{
    uintptr_t found = 0;

    EXS_MUTEX_LOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    for (struct exs_conn *c = resume_reg; c; c = c->rsm_next) {
        uint64_t d = c->sess_token ^ token;
        uintptr_t m = (uintptr_t)0 - (uintptr_t)(((d | (0 - d)) >> 63) ^ 1); /* d == 0: ~0 */

        found = (found & ~m) | ((uintptr_t)c & m);
    }
    if (found) /* atomic: written under the lock, but a unit test watches it without */
        __atomic_add_fetch(&((struct exs_conn *)found)->rsm_refs, 1, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    return (struct exs_conn *)found;
}

static void resume_registry_put(struct exs_conn *conn)
{
    int last;

    EXS_MUTEX_LOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    last = __atomic_sub_fetch(&conn->rsm_refs, 1, __ATOMIC_RELEASE) == 0 && conn->rsm_gone;
    EXS_MUTEX_UNLOCK(&resume_reg_lock, EXS_LOCK_LEAF);
    if (last)
        exs__conn_free(conn); /* destroyed while we held it */
}

/* A random token, never 0. 0 or -errno. */
static int resume_token_new(uint64_t *token_p)
{
    uint64_t t = 0;

    while (!t) {
        ssize_t n = getrandom(&t, sizeof(t), 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof(t)) {
            int err = n < 0 ? errno : EIO;

            EXS_WARN(PROTO, "session token: getrandom failed: %s", strerror(err));
            return -err;
        }
    }
    *token_p = t;
    return 0;
}

void exs__resume_established_locked(struct exs_conn *conn)
{
    struct exs_wire_session s = {
        .hdr = {.type = EXS_CTRL_SESSION, .len = htobe16(EXS_WIRE_SESSION_LEN)},
    };
    int ret;

    if (conn->state != EXS_CONN_CONNECTED)
        return;
    if (conn->active) {
        /* the passive side's SEND may have been handled before this event (its hello
         * was not adopted yet): a token it sent needs the bit in that hello */
        if (conn->sess_token && !exs__resume_negotiated(conn)) {
            EXS_INFO(PROTO, "conn %p: SESSION record refused: the peer's hello lacks bit 7",
                     (void *)conn);
            exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
        } else if (conn->sess_token) {
            EXS_CNT_INC(resume_cnt.fallback_sessions);
        }
        return;
    }
    /* the passive side names the session; the active side learns the name */
    if (!exs__resume_negotiated(conn))
        return;
    ret = resume_token_new(&conn->sess_token);
    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET, "no session token");
        return;
    }
    s.token = htobe64(conn->sess_token);
    exs__conn_ctrl_append_locked(conn, &s, sizeof(s));
    resume_registry_add(conn);
    EXS_CNT_INC(resume_cnt.fallback_sessions);
    EXS_DBG(PROTO, "conn %p: session token %#" PRIx64 " sent", (void *)conn, conn->sess_token);
}

int exs__resume_on_session_locked(struct exs_conn *conn, const struct exs_wire_session *s)
{
    uint64_t token = be64toh(s->token);
    const char *bad = NULL;

    /* before the active side's ESTABLISHED event the peer's hello is not adopted yet:
     * its bit is checked then (exs__resume_established_locked) */
    if (!conn->p.resumable || (conn->peer.magic == EXS_WIRE_MAGIC && !exs__resume_negotiated(conn)))
        bad = "feature RESUMABLE not negotiated";
    else if (!conn->active)
        bad = "from the active side";
    else if (conn->sess_token)
        bad = "a second one";
    else if (!token)
        bad = "token 0";
    else if (s->hdr.flags)
        bad = "flags set";
    if (bad) {
        EXS_INFO(PROTO, "conn %p: SESSION record refused: %s", (void *)conn, bad);
        return -EPROTO;
    }
    conn->sess_token = token;
    if (conn->state == EXS_CONN_CONNECTED) /* else counted at ESTABLISHED */
        EXS_CNT_INC(resume_cnt.fallback_sessions);
    EXS_DBG(PROTO, "conn %p: session token %#" PRIx64 " received", (void *)conn, token);
    return 0;
}

static int resume_apply_locked(struct exs_conn *conn, const struct exs_wire_resume *r);

int exs__resume_on_resume_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    /* A RESUME is only ever the first record after RING on a new path (§9.2): on a first
     * path, or a second one, it is hostile, whatever it says. */
    if (!conn->rsm_peer_wait || conn->rsm_peer_got) {
        EXS_INFO(PROTO,
                 "conn %p: RESUME record refused: %s (token %s, %" PRIu64 " messages, %" PRIu64
                 " bytes)",
                 (void *)conn,
                 conn->rsm_peer_got || conn->rsm_over ? "a second one" : "a first path",
                 conn->sess_token && be64toh(r->token) == conn->sess_token ? "ours" : "not ours",
                 be64toh(r->rx_msgs), be64toh(r->rx_bytes));
        return -EPROTO;
    }
    if (conn->state == EXS_CONN_RESUMING) {
        /* the peer's SEND overtook our ESTABLISHED event: applied there, once the
         * peer's hello is adopted */
        memcpy(&conn->rsm_peer, r, sizeof(*r));
        conn->rsm_peer_got = 1;
        return 0;
    }
    return resume_apply_locked(conn, r);
}

/* The path of conn failed (cause: for the log) and conn is not resumed: a resumable
 * connection that nobody was ending is counted and logged, once (§9.2, When); the caller
 * then ends it as before. */
static void resume_path_failed_locked(struct exs_conn *conn, const char *cause)
{
    /* only an established, resumable connection that nobody was ending (no exs_close,
     * exs_shutdown or SHUTDOWN record on either side) is cut over (§9.2, When) */
    if (!conn->sess_token || conn->resume_noted || conn->state != EXS_CONN_CONNECTED ||
        conn->txshut != EXS_TXSHUT_OPEN || conn->peer_shut)
        return;
    conn->resume_noted = 1;
    EXS_CNT_INC(resume_cnt.fallback_resume_failures);
    /* what is left of resume_eligible: a ring region in change is no reason (§9.2) */
    EXS_INFO(PROTO,
             "conn %p: path failed (%s) while resumable: not resumed (%s); the connection ends",
             (void *)conn, cause,
             conn->rsm_over ? "cut over once already" : "no fallback from its owner");
}

void exs__resume_tx_done_locked(struct exs_conn *conn, const struct exs_op *op)
{
    /* the writes of one endpoint complete in posting order and a stream is written in
     * order, so these bytes are a prefix of the stream; SEQPACKET: one past the highest
     * message seen completed (announced ones complete out of order, at READ_DONE) */
    if (op->kind != EXS_OP_SEND)
        return;
    if (conn_is_stream(conn))
        conn->resume_tx_done += op->len;
    else if (op->seq + 1 > conn->resume_tx_done)
        conn->resume_tx_done = op->seq + 1;
}

uint64_t exs__resume_arrived_locked(const struct exs_conn *conn)
{
    /* STREAM: S_r (bytes placed in receives, directly or copied out of the ring) and the
     * bytes still in the ring (a STREAM ring has no skips, §7) */
    if (conn_is_stream(conn))
        return conn->rx_seq + (conn->rd_arrived - conn->rd_consumed);
    return conn->rx_seq;
}

void exs__resume_record_locked(const struct exs_conn *conn, struct exs_wire_resume *r)
{
    uint64_t arrived = exs__resume_arrived_locked(conn);

    memset(r, 0, sizeof(*r));
    r->hdr.type = EXS_CTRL_RESUME;
    r->hdr.len = htobe16(EXS_WIRE_RESUME_LEN);
    r->token = htobe64(conn->sess_token);
    if (conn_is_stream(conn))
        r->rx_bytes = htobe64(arrived);
    else
        r->rx_msgs = htobe64(arrived);
    r->ring_arrived = htobe64(conn->rd_arrived);
    r->ring_consumed = htobe64(conn->rd_consumed);
}

int exs__resume_check_locked(const struct exs_conn *conn, const struct exs_wire_resume *r)
{
    uint64_t token = be64toh(r->token), msgs = be64toh(r->rx_msgs), bytes = be64toh(r->rx_bytes);
    uint64_t ra = be64toh(r->ring_arrived), rc = be64toh(r->ring_consumed);
    int stream = conn_is_stream(conn);
    uint64_t pos = stream ? bytes : msgs;
    uint64_t done = conn->resume_tx_done; /* bytes (STREAM) or messages (SEQPACKET) */
    const char *bad = NULL;

    if (!conn->sess_token)
        bad = "the connection has no session";
    else if (r->hdr.flags)
        bad = "flags set";
    else if (token != conn->sess_token)
        bad = "not our token";
    else if (stream ? msgs != 0 : bytes != 0)
        bad = stream ? "a message position on a stream" : "a byte position on SEQPACKET";
    else if (pos > conn->tx_seq)
        bad = "beyond what we sent";
    else if (pos < done) /* a hostile peer, or a receive completion reported in error
                          * after its NIC acknowledged the write: those bytes are gone
                          * here (completed, handed back), so the resume cannot be whole */
        bad = "below what we saw completed";
    else if (rc > ra || ra > conn->wr_tail || rc < conn->wr_consumed ||
             ra - rc > conn->peer.ring_size)
        /* the peer's ring: what arrived of what we wrote, at least what it reported
         * read, at most a ring's worth unread */
        bad = "ring positions out of range";
    if (bad) {
        EXS_INFO(PROTO,
                 "conn %p: RESUME refused: %s (position %" PRIu64 ", sent %" PRIu64
                 ", completed %" PRIu64 ")",
                 (void *)conn, bad, pos, conn->tx_seq, done);
        return -EPROTO;
    }
    return 0;
}

/* Count a resumable connection whose cut-over failed, once, with the cause. */
static void resume_failed_note(struct exs_conn *conn, const char *cause)
{
    if (conn->resume_noted)
        return;
    conn->resume_noted = 1;
    EXS_CNT_INC(resume_cnt.fallback_resume_failures);
    EXS_INFO(PROTO, "conn %p: cut-over to the fallback failed (%s); the connection ends",
             (void *)conn, cause);
}

/* A held resume request is refused (reason 7). */
static void resume_req_reject(struct exs_conn *conn)
{
    struct exs_wire_reject rej = {
        .magic = htobe16(EXS_WIRE_MAGIC),
        .version = EXS_WIRE_VERSION,
        .reason = EXS_WIRE_REJ_RESUME,
    };

    if (!conn->rsm_req)
        return;
    exs__prov_reject(conn->rsm_req, &rej, sizeof(rej));
    conn->rsm_req = NULL;
}

/* The cut-over failed (or the application closed): the conn ends at once, every
 * operation with err (§9.2: as without fallback). count: a failure to count. */
static void resume_end_locked(struct exs_conn *conn, int err, const char *why, int count)
{
    if (count)
        resume_failed_note(conn, why);
    resume_req_reject(conn);
    conn->rsm_peer_wait = conn->rsm_peer_got = 0;
    if (!conn->err)
        conn->err = err;
    exs__conn_end_locked(conn, err, why);
}

/* May conn be cut over now (§9.2, When)? A conn cut over once is not again; a ring
 * region in change (§7.4) is not a reason (exs__st_ring_cut_locked). */
static int resume_eligible(const struct exs_conn *conn)
{
    return conn->sess_token && !conn->rsm_over && conn->state == EXS_CONN_CONNECTED &&
           conn->txshut == EXS_TXSHUT_OPEN && !conn->peer_shut && conn->cb->resume_mr &&
           (!conn->active || conn->cb->resume_addr);
}

int exs__resume_begin_locked(struct exs_conn *conn, const char *cause, int disc, int silent)
{
    if (conn->state == EXS_CONN_RESUMING) {
        conn->rsm_disc |= disc;
        return 1;
    }
    if (!resume_eligible(conn)) {
        resume_path_failed_locked(conn, cause);
        return 0;
    }
    EXS_INFO(PROTO, "conn %p: path failed (%s): resuming over the fallback (%s side)", (void *)conn,
             cause, conn->active ? "active" : "passive");
    exs__conn_set_state_locked(conn, EXS_CONN_RESUMING, cause);
    conn->rsm_over = 1; /* one cut-over per connection */
    conn->rsm_t0_ns = exs__now_ns();
    conn->rsm_disc = disc;
    conn->rsm_newpath = 0;
    conn->rsm_fail = 0;
    /* a silent path (keepalive) is not drained: nothing more comes over it, and waiting
     * for a flush would wait for the remote; its endpoint goes with what it holds */
    conn->rsm_abandon = !!silent;
    conn->rsm_disc |= conn->rsm_abandon;
    if (!disc)
        exs__prov_disconnect(conn->ep); /* its outstanding work is flushed */
    /* work requests never posted complete as flushed, as the posted ones will */
    exs__conn_wrq_flush_locked(conn);
    return 1;
}

int exs__resume_on_fail_locked(struct exs_conn *conn, int err, const char *why)
{
    if (conn->state == EXS_CONN_RESUMING) {
        if (!conn->rsm_fail) {
            EXS_INFO(PROTO, "conn %p: %s while resuming", (void *)conn, why);
            conn->rsm_fail = err ? err : ECONNRESET;
        }
        return 1;
    }
    if (conn->rsm_peer_wait) { /* the new path failed before the resume was whole */
        resume_failed_note(conn, why);
        return 0;
    }
    if (conn->sess_token && conn->state == EXS_CONN_CONNECTED &&
        exs__prov_ep_state(conn->ep) != EXS_PROV_EP_CONNECTED)
        return exs__resume_begin_locked(conn, why, 0, 0);
    return 0;
}

/* SEQPACKET receiver, once the old path is over: announced messages that arrived and
 * were not read whole lost their grants with the old endpoint; they wait, stale, to be
 * announced again by the sender on the new path (§9.2, Replay, SEQPACKET). 0, or
 * -ENOMEM (the cut-over fails). */
static int resume_sp_cut_locked(struct exs_conn *conn)
{
    uint32_t stale = exs__sp_resume_cut_locked(conn);

    if (stale == UINT32_MAX)
        return -ENOMEM;
    if (stale)
        EXS_INFO(PROTO,
                 "conn %p: %u announced messages not read at the cut wait to be "
                 "announced again",
                 (void *)conn, stale);
    return 0;
}

/* Move every registration of the conn to ctx and restart what the old path held (§9.2,
 * "What the cut-over has to move", "Everything else restarts"): the old endpoint goes
 * (its grants first); the old ring stays, read locally, as a retired region until its
 * bytes are copied out; the new path gets a ring, control slots and an endpoint of its
 * own on ctx; the send buffer's copies move; the application's buffers are registered
 * on ctx by the owner. 0 or -errno. */
static int resume_switch_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx)
{
    struct exs_prov_mr *old_ctrl = conn->ctrl_mem, *old_stg = conn->stg_mem;
    struct exs_list *q[2] = {&conn->sendq, &conn->recvq};
    struct exs_list *pos;
    int ret;

    exs__conn_revoke_all_locked(conn);
    exs__prov_ep_destroy(conn->ep); /* what it still held is discarded (rsm_abandon) */
    conn->ep = NULL;
    conn->wr_out = 0;
    exs_list_for_each(pos, &conn->sendq) exs_list_entry(pos, struct exs_op, link)->inflight = 0;
    ret = exs__st_ring_cut_locked(conn); /* unread bytes retired; the new ring's size */
    if (ret)
        return ret;
    conn->ctrl_mem = conn->rx_mr = conn->tx_mr = NULL;
    conn->rx_bufs = conn->tx_bufs = NULL;
    exs__conn_mem_free(old_ctrl);
    exs__batch_release_locked(conn); /* staging: made again at the next batch */
    memset(conn->batch_slot, 0, sizeof(conn->batch_slot));
    __atomic_store_n(&conn->ctx, ctx, __ATOMIC_RELAXED);
    ret = exs__conn_ring_region_locked(conn, conn->p.ring_size, 0, &conn->ring_mem, NULL);
    if (ret) {
        conn->ring_mem = NULL;
        return ret;
    }
    conn->ring = conn->ring_mem->addr;
    ret = exs__conn_path_new_locked(conn, ctx);
    if (ret)
        return ret;
    if (old_stg) { /* the send buffer's copies not yet arrived move with their bytes */
        struct exs_prov_mr *stg;

        ret = exs__conn_mem_alloc(ctx, old_stg->length, EXS_MEM_FORCE, &stg);
        if (ret)
            return ret;
        memcpy(stg->addr, old_stg->addr, old_stg->length);
        exs_list_for_each(pos, &conn->sendq)
        {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->internal && op->mr == old_stg) {
                op->buf = (uint8_t *)stg->addr + (op->buf - (uint8_t *)old_stg->addr);
                op->mr = stg;
                op->lkey = stg->lkey;
            }
        }
        conn->stg_mem = stg;
        exs__conn_mem_free(old_stg);
    }
    for (int i = 0; i < 2; i++)
        exs_list_for_each(pos, q[i])
        {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->internal || op->state == EXS_OPS_DONE || !op->mr || op->mr->ctx == ctx)
                continue;
            ret = conn->cb->resume_mr(conn, op, ctx);
            if (ret)
                return ret;
            if (op->state == EXS_OPS_ADVERTISED)
                op->state = EXS_OPS_QUEUED; /* advertised again on the new path */
        }
    if (conn->sp_rx_frag) { /* SEQPACKET: a message cut between its pieces comes again
                             * whole; its receive is advertised again from offset 0 */
        conn->stats.bytes_received -= conn->sp_rx_frag->filled;
        conn->sp_rx_frag->filled = 0;
        conn->sp_rx_frag = NULL;
    }
    conn->sp_frag_op = NULL; /* the sender's: re-sent whole from its first byte */
    /* the receiver restarts in a direct phase (§7), its old ring's bytes first */
    conn->st_pr = 0;
    conn->st_sr_next = conn->rx_seq;
    conn->st_drain = EXS_ST_DRAIN_IDLE;
    conn->st_streak = 0;
    conn->st_eval_arrived = conn->rd_arrived;
    conn->st_drain_dir = 0;
    conn->st_drain_hold = 0;
    /* the sender's ADVERTs, credits and ring writes were the old path's */
    conn->adv_head = conn->adv_count = 0;
    conn->peer_ring_keyed = 0;
    conn->credits = conn->owed = 0;
    conn->sq_out = 0;
    conn->ring_wr_out = 0;
    conn->ctrl_len = 0;
    conn->shut_op = NULL;
    memset(&conn->bwait, 0, sizeof(conn->bwait));
    conn->ka_probe_out = conn->ka_waiting = 0;
    conn->ka_ping = conn->ka_answer = 0; /* the old path's PING and its owed answer */
    conn->ka_fails = 0;
    conn->tx_stall_ns = 0;
    conn->rsm_newpath = 1;
    conn->rsm_peer_wait = 1;
    return 0;
}

/* Active side: connect to the peer's fallback address with the resume hello. */
static int resume_connect_locked(struct exs_conn *conn, const struct sockaddr_storage *addr,
                                 socklen_t len)
{
    uint8_t pd[EXS_WIRE_RESUME_PD_LEN];
    struct exs_wire_hello h;
    uint64_t token = htobe64(conn->sess_token);

    exs__conn_hello(conn, &h);
    h.hflags = EXS_WIRE_HELLO_F_RESUME;
    memcpy(pd, &h, sizeof(h));
    memcpy(pd + EXS_WIRE_HELLO_LEN, &token, sizeof(token));
    return exs__prov_connect(conn->ep, (const struct sockaddr *)addr, len, pd, sizeof(pd));
}

/* Passive side: accept the held request on the new endpoint. */
static int resume_accept_locked(struct exs_conn *conn)
{
    struct exs_prov_conn_req *req = conn->rsm_req;
    struct exs_wire_hello h;

    conn->rsm_req = NULL;
    exs__conn_adopt_hello_locked(conn, &conn->rsm_req_hello);
    exs__conn_hello(conn, &h);
    return exs__prov_accept(req, conn->ep, &h, sizeof(h)); /* consumes req */
}

void exs__resume_progress_locked(struct exs_conn *conn)
{
    struct sockaddr_storage addr;
    struct exs_prov_ctx *ctx = NULL;
    socklen_t len = 0;
    int ret;

    if (conn->state != EXS_CONN_RESUMING)
        return;
    if (conn->rsm_fail) {
        resume_end_locked(conn, conn->rsm_fail, "failure while resuming", 1);
        return;
    }
    if (conn->rsm_newpath) {
        if (!conn->active && conn->rsm_req) {
            ret = resume_accept_locked(conn);
            if (ret)
                resume_end_locked(conn, ECONNRESET, "accept of the new path failed", 1);
        }
        return;
    }
    /* the old path is over once its DISCONNECTED came and every work request completed:
     * then what arrived is final (§9.2, Positions) */
    if (!conn->rsm_disc || ((conn->wr_out || conn->wrq_count) && !conn->rsm_abandon))
        return;
    if (conn->peer_shut) { /* its SHUTDOWN came in the drain: the peer closed */
        resume_end_locked(conn, ECONNRESET, "the peer closed", 0);
        return;
    }
    if (conn->active) {
        ret = conn->cb->resume_addr(conn, &ctx, &addr, &len);
        if (ret) {
            resume_end_locked(conn, ECONNRESET, "no fallback address", 1);
            return;
        }
    } else {
        ctx = conn->rsm_req ? conn->rsm_req_ctx : NULL;
        if (!ctx)
            return; /* the active side's request comes */
    }
    if (!conn_is_stream(conn) && resume_sp_cut_locked(conn)) {
        resume_end_locked(conn, ECONNRESET, "no memory for announced messages", 1);
        return;
    }
    ret = resume_switch_locked(conn, ctx);
    if (ret) {
        EXS_WARN(PROTO, "conn %p: new path: %s", (void *)conn, strerror(-ret));
        resume_end_locked(conn, ECONNRESET, "the new path could not be made", 1);
        return;
    }
    ret = conn->active ? resume_connect_locked(conn, &addr, len) : resume_accept_locked(conn);
    if (ret) {
        EXS_INFO(PROTO, "conn %p: new path: %s failed: %s", (void *)conn,
                 conn->active ? "connect" : "accept", strerror(-ret));
        resume_end_locked(conn, ECONNRESET, "the new path's connect failed", 1);
        return;
    }
    EXS_DBG(PROTO, "conn %p: old path drained (%" PRIu64 " bytes arrived): new path on %s",
            (void *)conn, exs__resume_arrived_locked(conn), exs__prov_name(ctx));
}

void exs__resume_on_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev)
{
    struct exs_wire_resume r;

    if (ev->ep && ev->ep != conn->ep)
        return;               /* not the conn's endpoint now */
    if (!conn->rsm_newpath) { /* the old endpoint */
        if (ev->type == EXS_PROV_CM_DISCONNECTED) {
            conn->rsm_disc = 1;
            exs__resume_progress_locked(conn);
        }
        return;
    }
    switch (ev->type) {
    case EXS_PROV_CM_ESTABLISHED:
        if (conn->active) {
            struct exs_wire_hello h;

            if (exs__conn_hello_check(ev->private_data, ev->private_data_len, conn->p.sock_type)) {
                resume_end_locked(conn, ECONNRESET, "bad hello on the new path", 1);
                return;
            }
            memcpy(&h, ev->private_data, sizeof(h));
            if (!(be16toh(h.features) & EXS_WIRE_FEAT_RESUMABLE)) {
                resume_end_locked(conn, ECONNRESET, "new path's hello without bit 7", 1);
                return;
            }
            exs__conn_adopt_hello_locked(conn, ev->private_data);
        }
        exs__conn_set_state_locked(conn, EXS_CONN_CONNECTED, "new path established");
        conn->ka_heard_ns = exs__now_ns();
        exs__conn_ring_grant_locked(conn); /* the RING record first */
        if (conn->state != EXS_CONN_CONNECTED)
            return;
        /* then our RESUME: what arrived over the old path; the ring bytes still to be
         * copied out are reported consumed by later ACKs */
        exs__resume_record_locked(conn, &r);
        conn->rd_reported = conn->rd_consumed;
        exs__conn_ctrl_append_locked(conn, &r, sizeof(r));
        if (conn->rsm_peer_got) {
            conn->rsm_peer_got = 0;
            memcpy(&r, &conn->rsm_peer, sizeof(r));
            if (resume_apply_locked(conn, &r)) {
                exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
                return;
            }
        }
        exs__conn_kick_locked(conn);
        break;
    case EXS_PROV_CM_REJECTED:
    case EXS_PROV_CM_UNREACHABLE:
    case EXS_PROV_CM_DISCONNECTED:
        resume_end_locked(conn, ECONNRESET,
                          ev->type == EXS_PROV_CM_REJECTED ? "the peer refused the resume"
                                                           : "the new path failed",
                          1);
        break;
    default:
        break;
    }
}

/* SEQPACKET replay from message pos (§9.2, Replay): a send whose message arrived
 * completes now, but an announced one still waiting for its READ_DONE is announced again
 * first (the receiver reads it, or answers READ_DONE if it read it whole); every later
 * one goes again whole from its first byte, in order (QUEUED: numbered again from pos).
 * The bytes of messages sent again. */
static uint64_t resume_sp_rewind_locked(struct exs_conn *conn, uint64_t pos)
{
    uint64_t again = 0;
    struct exs_list *p;

    exs_list_for_each(p, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(p, struct exs_op, link);

        if (op->kind != EXS_OP_SEND || op->state == EXS_OPS_DONE)
            continue;
        if (op->state == EXS_OPS_POSTED && op->seq < pos && op->announced) {
            exs__sp_resume_reann_mark_locked(conn, op);
            continue;
        }
        if (op->state == EXS_OPS_POSTED && op->seq < pos) {
            exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
            exs__resume_tx_done_locked(conn, op);
            if (!op->internal)
                conn->stats.bytes_sent += op->len;
            continue;
        }
        if (op->state == EXS_OPS_POSTED)
            again += op->len;
        op->state = EXS_OPS_QUEUED;
        op->posted = 0;
        op->inflight = 0;
        op->announced = 0;
    }
    return again;
}

/* The peer's RESUME on the new path, checked: the sender rewinds to the position the
 * peer stated and sends everything past it again (§9.2, Replay). */
static int resume_apply_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    uint64_t pos = be64toh(r->rx_bytes), ra = be64toh(r->ring_arrived);
    uint64_t rc = be64toh(r->ring_consumed), off = conn->resume_tx_done, sent = conn->tx_seq;
    uint64_t again;
    struct exs_list *p;

    if (exs__resume_check_locked(conn, r))
        return -EPROTO;
    if (!conn_is_stream(conn)) {
        pos = be64toh(r->rx_msgs);
        conn->sp_reann_pos = pos;
        again = resume_sp_rewind_locked(conn, pos);
        goto rewound;
    }
    exs_list_for_each(p, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(p, struct exs_op, link);

        if (op->kind != EXS_OP_SEND || op->state == EXS_OPS_DONE)
            continue;
        if (pos >= off + op->len && op->posted == op->len) { /* arrived whole */
            exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
            exs__resume_tx_done_locked(conn, op);
            if (!op->internal)
                conn->stats.bytes_sent += op->len;
        } else {
            op->posted = pos > off ? (size_t)(pos - off) : 0;
            op->state = op->posted ? EXS_OPS_POSTED : EXS_OPS_QUEUED;
        }
        off += op->len;
    }
    again = sent - pos;
rewound:
    conn->tx_seq = pos;
    conn->wr_tail = ra;
    conn->wr_consumed = rc;
    /* the STREAM algorithm restarts in a direct phase */
    conn->st_ps = 0;
    conn->st_held = conn->st_drain_owed = conn->st_lingering = 0;
    conn->rs_owed = 0;
    conn->adv_head = conn->adv_count = 0;
    conn->rsm_peer_wait = 0;
    EXS_CNT_INC(resume_cnt.fallback_resumes);
    EXS_CNT_ADD(resume_cnt.fallback_replayed_bytes, again);
    EXS_INFO(PROTO,
             "conn %p: resumed over %s: %" PRIu64 " bytes sent again from %s %" PRIu64 ", %" PRIu64
             " ring bytes of the old path still to read",
             (void *)conn, exs__prov_name(conn->ctx), again,
             conn_is_stream(conn) ? "byte" : "message", pos, conn->rd_arrived - conn->rd_consumed);
    return 0;
}

uint64_t exs__resume_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms)
{
    uint64_t due = conn->rsm_t0_ns + conn_ms * 1000000u;

    if (conn->state == EXS_CONN_RESUMING && conn->rsm_fail) {
        resume_end_locked(conn, conn->rsm_fail, "failure while resuming", 1);
        return 0;
    }
    if (now_ns < due)
        return (due - now_ns + 999999u) / 1000000u;
    EXS_INFO(PROTO, "conn %p: not resumed after %" PRIu64 " ms", (void *)conn, conn_ms);
    resume_end_locked(conn, ETIMEDOUT, "resume timed out", 1);
    return 0;
}

int exs__resume_close_locked(struct exs_conn *conn)
{
    if (conn->state == EXS_CONN_RESUMING) {
        resume_end_locked(conn, ECONNRESET, "closed while resuming", 0);
        return 1;
    }
    if (conn->state == EXS_CONN_CONNECTED && conn->rsm_peer_wait) {
        /* nothing was rewound yet: no SHUTDOWN can count the stream; reset */
        if (!conn->err)
            conn->err = ECONNRESET;
        conn->rsm_peer_wait = 0;
        exs__conn_set_state_locked(conn, EXS_CONN_DOWN, "closed while resuming");
        exs__prov_disconnect(conn->ep);
        return 1;
    }
    return 0;
}

int exs__resume_op_mr_locked(struct exs_conn *conn, struct exs_op *op)
{
    return conn->cb->resume_mr ? conn->cb->resume_mr(conn, op, conn->ctx) : -EINVAL;
}

int exs__conn_resume_request(struct exs_prov_ctx *ctx, struct exs_prov_conn_req *req,
                             const void *pd, uint32_t len, int sock_type)
{
    struct exs_conn *conn;
    uint64_t token;
    const char *bad = NULL;

    if (!pd || len < EXS_WIRE_RESUME_PD_LEN) {
        EXS_INFO(PROTO, "resume request without a token (%u bytes)", len);
        return EXS_WIRE_REJ_RESUME;
    }
    memcpy(&token, (const uint8_t *)pd + EXS_WIRE_HELLO_LEN, sizeof(token));
    token = be64toh(token);
    conn = token ? resume_registry_find(token) : NULL;
    if (!conn) {
        EXS_INFO(PROTO, "resume request for an unknown session refused");
        return EXS_WIRE_REJ_RESUME;
    }
    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    if (conn->p.sock_type != sock_type || conn->active)
        bad = "not a passive session of this socket type";
    else if (conn->rsm_req)
        bad = "a request is already held";
    else if (conn->state == EXS_CONN_CONNECTED && !conn->rsm_over &&
             !exs__resume_begin_locked(conn, "resume request from the peer", 0, conn->ka_waiting))
        bad = "the connection cannot be resumed";
    else if (conn->state != EXS_CONN_RESUMING || conn->rsm_newpath)
        bad = "the connection is not waiting for a new path";
    if (!bad) {
        conn->rsm_req = req;
        conn->rsm_req_ctx = ctx;
        memcpy(&conn->rsm_req_hello, pd, sizeof(conn->rsm_req_hello));
        exs__resume_progress_locked(conn); /* at once when drained */
    } else {
        EXS_INFO(PROTO, "conn %p: resume request refused: %s", (void *)conn, bad);
    }
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    resume_registry_put(conn);
    return bad ? EXS_WIRE_REJ_RESUME : 0;
}
