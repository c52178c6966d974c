/* SPDX-License-Identifier: MIT */
/* The cut-over (spec/protocol.md §9.2): a failed path's connection RESUMING, the new path
 * made and checked, the replay; the passive side's resume requests on trial. Layer 3 of
 * spec/proto-layout.md, above resume_sess.c. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/sha256.h"
#include "exs/util/util.h"

static void resume_end_locked(struct exs_conn *conn, int err, const char *why, int count);

/* exs__resume_evict_run (resume.h) once some are evicted. */
void exs__resume_evict_all(void)
{
    struct exs_conn *v;

    while ((v = exs__resume_evict_pop())) {
        EXS_LITE_LOCK(&v->lock, EXS_LOCK_CONN);
        if (v->state == EXS_CONN_RESUMING) { /* else it resumed or ended meanwhile */
            EXS_CNT_INC(exs__resume_cnt.fallback_resume_evicted);
            resume_end_locked(v, ETIMEDOUT, "evicted: resume_max newer connections wait", 1);
        }
        EXS_LITE_UNLOCK(&v->lock, EXS_LOCK_CONN);
        exs__resume_registry_put(v); /* frees it when it was destroyed meanwhile */
    }
}

static int resume_apply_locked(struct exs_conn *conn, const struct exs_wire_resume *r);

int exs__resume_on_resume_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    /* A RESUME is only ever the first record after RING on a new path (§9.2): on a first
     * path, or a second one, it is hostile, whatever it says. */
    if (!conn->resume.peer_wait || conn->resume.peer_got)
        return exs__proto_violation(
            conn, EXS_PV_RESUME, EXS_CTRL_RESUME,
            "%s (token %s, %" PRIu64 " messages, %" PRIu64 " bytes)",
            conn->resume.peer_got || conn->resume.over ? "a second one" : "on a first path",
            conn->sess_token && be64toh(r->token) == conn->sess_token ? "ours" : "not ours",
            be64toh(r->rx_msgs), be64toh(r->rx_bytes));
    if (conn->state == EXS_CONN_RESUMING) {
        /* the peer's SEND overtook our ESTABLISHED event: applied there, once the
         * peer's hello is adopted */
        memcpy(&conn->resume.peer, r, sizeof(*r));
        conn->resume.peer_got = 1;
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
    EXS_CNT_INC(exs__resume_cnt.fallback_resume_failures);
    /* what is left of resume_eligible: a ring region in change is no reason (§9.2) */
    EXS_INFO(
        PROTO, "conn %p: path failed (%s) while resumable: not resumed (%s); the connection ends",
        (void *)conn, cause,
        conn->resume.over                                           ? "cut over once already"
        : conn->resume.keys != (EXS_RSM_KEY_OWN | EXS_RSM_KEY_PEER) ? "the peer's key not known"
                                                                    : "no fallback from its owner");
}

/* Count a resumable connection whose cut-over failed, once, with the cause. */
static void resume_failed_note(struct exs_conn *conn, const char *cause)
{
    if (conn->resume_noted)
        return;
    conn->resume_noted = 1;
    EXS_CNT_INC(exs__resume_cnt.fallback_resume_failures);
    EXS_INFO(PROTO, "conn %p: cut-over to the fallback failed (%s); the connection ends",
             (void *)conn, cause);
}

/* ---- a resume request on trial (§9.2, Proof) ----
 *
 * The passive side never disturbs a connection for a request it has not authenticated:
 * the new path is made on the side (its ring, control slots and endpoint on the request's
 * context, the endpoint's user the conn so its completions and events come to it) and
 * accepted with nonce_B and MAC_B; the conn stays as it was. The first SEND on the new
 * path must start with a valid AUTH record; then the conn fails its old path (when still
 * CONNECTED) and, once drained, takes the new path and the completions held meanwhile.
 * Anything else (a bad AUTH, another record or a write first, a failure or disconnect of
 * the new path, its deadline) refuses it: the trial ends, the conn untouched, counted in
 * fallback_resume_refused. An endpoint is destroyed only where none of its completions
 * can be in a batch being handed out (a cm event, the timer, the conn's free): elsewhere
 * the trial is disconnected and ended (dead), and reaped at the next such point. */

/* Trials at once in the process (each holds a ring, control slots and an endpoint for at
 * most connect_timeout_ms): a flood of requests naming live sessions is refused beyond. */
#define RSM_PEND_MAX 64u

static uint32_t resume_pend_live; /* trials not dead */

struct exs_rsm_pend {
    struct exs_conn_path path;    /* the new path's endpoint, control slots, receives */
    struct exs_prov_mr *ring_mem; /* its ring (announced in the accept's hello) */
    uint32_t ring_size;
    uint8_t nonce_a[EXS_WIRE_NONCE_LEN];
    uint8_t nonce_b[EXS_WIRE_NONCE_LEN];
    struct exs_wire_hello peer; /* the request's hello (checked), adopted at the take */
    uint64_t t0_ns;             /* accepted (bounded by connect_timeout_ms) */
    int established;            /* the new endpoint's ESTABLISHED came */
    int authed;                 /* the peer's AUTH checked out */
    int dead;                   /* ended: the endpoint is disconnected, to be reaped */
    uint32_t held;              /* receive completions held for the conn */
    struct exs_prov_cqe cqe[];  /* ... at most the receives posted (credits) */
};

/* Free a dead trial's objects (a safe point: see above). */
static void resume_pend_reap_locked(struct exs_conn *conn)
{
    struct exs_rsm_pend *pd = conn->resume.pend;

    if (!pd || !pd->dead)
        return;
    exs__conn_path_drop(&pd->path);
    if (pd->ring_mem)
        exs__conn_ring_region_free(pd->ring_mem);
    free(pd);
    conn->resume.pend = NULL;
}

/* End the trial: its endpoint disconnected (the peer learns at once), the objects reaped
 * later, or now with reap. */
static void resume_pend_kill_locked(struct exs_conn *conn, int reap)
{
    struct exs_rsm_pend *pd = conn->resume.pend;

    if (pd && !pd->dead) {
        pd->dead = 1;
        __atomic_sub_fetch(&resume_pend_live, 1, __ATOMIC_RELAXED);
        if (pd->path.ep)
            exs__prov_disconnect(pd->path.ep);
    }
    if (reap)
        resume_pend_reap_locked(conn);
}

/* The trial is refused (why: for the log): counted, logged once, the conn untouched. */
static void resume_pend_refuse_locked(struct exs_conn *conn, const char *why, int reap)
{
    EXS_CNT_INC(exs__resume_cnt.fallback_resume_refused);
    EXS_INFO(PROTO, "conn %p: resume request refused on trial: %s; the connection goes on",
             (void *)conn, why);
    resume_pend_kill_locked(conn, reap);
}

static void resume_quiet_free_locked(struct exs_conn *conn, int destroy);

void exs__resume_pend_end_locked(struct exs_conn *conn, int destroy)
{
    resume_pend_kill_locked(conn, destroy);
    if (destroy) /* the conn's memory goes (exs__conn_release_locked) */
        resume_quiet_free_locked(conn, 1);
}

/* The size of the new path's ring: what the cut would give now (exs__stream_ring_cut_locked),
 * the current ring's, or the retired region's when more is unread than the current ring
 * holds. The peer, which asked to resume, writes nothing more on the old path, so what is
 * unread only shrinks until the cut, which checks that it fits. */
static uint32_t resume_ring_size(const struct exs_conn *conn)
{
    uint64_t unread = conn->rd_arrived - conn->rd_consumed;

    return unread > conn->p.ring_size && conn->autotune.old_mem ? conn->autotune.old_size
                                                                : conn->p.ring_size;
}

/* Open a trial for the request req (its private data q) on ctx: the new path made on the
 * side and accepted with our proof. 0: req consumed (accepted, or its accept failed and
 * the trial ended); else a reject reason, req untouched. */
static int resume_pend_open_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx,
                                   struct exs_prov_conn_req *req,
                                   const struct exs_wire_resume_req *q)
{
    struct exs_wire_resume_acc acc;
    struct exs_rsm_pend *pd;
    uint8_t mac[EXS_SHA256_LEN];
    int ret;

    pd = calloc(1, sizeof(*pd) + conn->p.credits * sizeof(pd->cqe[0]));
    if (!pd)
        return EXS_WIRE_REJ_RESOURCES;
    conn->resume.pend = pd;
    __atomic_add_fetch(&resume_pend_live, 1, __ATOMIC_RELAXED);
    pd->ring_size = resume_ring_size(conn);
    ret = exs__conn_ring_alloc(ctx, pd->ring_size, &pd->ring_mem);
    if (!ret)
        ret = exs__conn_path_make(conn, ctx, EXS_MEM_OTHER, &pd->path);
    if (!ret)
        ret = exs__resume_random(pd->nonce_b, sizeof(pd->nonce_b));
    if (ret) {
        EXS_INFO(PROTO, "conn %p: resume request: no new path: %s", (void *)conn, strerror(-ret));
        resume_pend_kill_locked(conn, 1);
        return EXS_WIRE_REJ_RESOURCES;
    }
    memcpy(pd->nonce_a, q->nonce_a, sizeof(pd->nonce_a));
    pd->peer = q->hello;
    pd->t0_ns = exs__now_ns();
    exs__conn_hello(conn, &acc.hello);
    acc.hello.ring_size = htobe32(pd->ring_size);
    acc.hello.ring_addr = htobe64((uintptr_t)pd->ring_mem->addr);
    memcpy(acc.nonce_b, pd->nonce_b, sizeof(acc.nonce_b));
    exs__resume_conn_mac(conn, EXS_WIRE_AUTH_LABEL_B, pd->nonce_a, pd->nonce_b, mac);
    memcpy(acc.mac_b, mac, sizeof(acc.mac_b));
    ret = exs__prov_accept(req, pd->path.ep, &acc, sizeof(acc)); /* consumes req */
    if (ret) {
        EXS_INFO(PROTO, "conn %p: resume request: accept failed: %s", (void *)conn, strerror(-ret));
        resume_pend_kill_locked(conn, 1);
        return 0;
    }
    EXS_DBG(PROTO, "conn %p: resume request on trial (ring %u bytes)", (void *)conn, pd->ring_size);
    return 0;
}

/* The first SEND on the trial's path, len bytes at buf: NULL when it starts with a valid
 * AUTH record (constant-time compare), else what is wrong. */
static const char *resume_auth_check(const struct exs_conn *conn, const struct exs_rsm_pend *pd,
                                     const uint8_t *buf, uint32_t len)
{
    struct exs_wire_auth a;
    uint8_t mac[EXS_SHA256_LEN];

    if (len < EXS_WIRE_AUTH_LEN)
        return "its first SEND is too short for an AUTH record";
    memcpy(&a, buf, sizeof(a));
    if (a.hdr.type != EXS_CTRL_AUTH)
        return "its first record is not AUTH";
    if (be16toh(a.hdr.len) != EXS_WIRE_AUTH_LEN || a.hdr.flags || a.hdr.credits)
        return "a malformed AUTH record";
    exs__resume_conn_mac(conn, EXS_WIRE_AUTH_LABEL_A, pd->nonce_a, pd->nonce_b, mac);
    if (!exs__mem_equal_ct(mac, a.mac, sizeof(mac)))
        return "a wrong AUTH proof";
    return NULL;
}

/* The proof checked out: now the conn leaves its old path for the trial's (a conn still
 * CONNECTED fails its old path first, §9.2, The old path). */
static void resume_pend_authed_locked(struct exs_conn *conn)
{
    struct exs_rsm_pend *pd = conn->resume.pend;

    pd->authed = 1;
    EXS_INFO(PROTO, "conn %p: resume request proved: the connection leaves its old path",
             (void *)conn);
    if (conn->state == EXS_CONN_CONNECTED &&
        !exs__resume_begin_locked(conn, "resume request from the peer", 0,
                                  conn->keepalive.waiting)) {
        EXS_INFO(PROTO, "conn %p: proved resume request: the connection cannot be resumed",
                 (void *)conn);
        resume_pend_kill_locked(conn, 0);
        return;
    }
    if (conn->state != EXS_CONN_RESUMING || conn->resume.newpath) {
        EXS_INFO(PROTO,
                 "conn %p: proved resume request: the connection is not waiting for a "
                 "new path",
                 (void *)conn);
        resume_pend_kill_locked(conn, 0);
        return;
    }
    exs__resume_progress_locked(conn); /* at once when drained */
}

int exs__resume_pend_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    struct exs_rsm_pend *pd = conn->resume.pend;
    uint32_t slot = (uint32_t)((cqe->wr_id & ~(uint64_t)WR_TAG_MASK) >> 3);
    uint8_t *buf;
    const char *bad;

    if (cqe->ep != pd->path.ep)
        return 0;
    if (pd->dead) /* flushed after the end: the slots go with the trial */
        return 1;
    if ((cqe->wr_id & WR_TAG_MASK) != WR_TAG_RX || slot >= conn->p.credits) {
        resume_pend_refuse_locked(conn, "an unexpected completion", 0); /* we post no send */
        return 1;
    }
    pd->path.posted--;
    if (cqe->status != EXS_PROV_WC_SUCCESS) {
        if (!pd->authed) {
            resume_pend_refuse_locked(conn, "the new path failed before its proof", 0);
        } else {
            resume_pend_kill_locked(conn, 0);
            exs__resume_on_fail_locked(conn, ECONNRESET, "the new path failed");
        }
        return 1;
    }
    if (pd->authed) { /* the conn handles it once it takes the path */
        EXS_ASSERT(pd->held < conn->p.credits);
        pd->cqe[pd->held++] = *cqe;
        return 1;
    }
    buf = (uint8_t *)pd->path.ctrl_mem->addr + (size_t)slot * EXS_WIRE_CTRL_MAX;
    bad = cqe->opcode != EXS_PROV_WC_RECV ? "a write before the proof"
                                          : resume_auth_check(conn, pd, buf, cqe->byte_len);
    if (bad) {
        resume_pend_refuse_locked(conn, bad, 0);
        return 1;
    }
    /* the records after AUTH (RING, RESUME) wait for the conn, from the slot's start */
    pd->cqe[0] = *cqe;
    pd->cqe[0].byte_len -= EXS_WIRE_AUTH_LEN;
    memmove(buf, buf + EXS_WIRE_AUTH_LEN, pd->cqe[0].byte_len);
    pd->held = 1;
    resume_pend_authed_locked(conn);
    return 1;
}

int exs__resume_pend_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev)
{
    struct exs_rsm_pend *pd = conn->resume.pend;

    if (!ev->ep || ev->ep != pd->path.ep) {
        resume_pend_reap_locked(conn); /* a cm event: a safe point */
        return 0;
    }
    if (pd->dead) {
        resume_pend_reap_locked(conn);
        return 1;
    }
    switch (ev->type) {
    case EXS_PROV_CM_ESTABLISHED:
        pd->established = 1;
        if (pd->authed)
            exs__resume_progress_locked(conn);
        break;
    case EXS_PROV_CM_REJECTED:
    case EXS_PROV_CM_UNREACHABLE:
    case EXS_PROV_CM_DISCONNECTED:
        if (!pd->authed) {
            resume_pend_refuse_locked(conn, "the new path ended before its proof", 1);
        } else {
            resume_pend_kill_locked(conn, 1);
            exs__resume_on_fail_locked(conn, ECONNRESET, "the new path failed");
        }
        break;
    default:
        break;
    }
    return 1;
}

uint64_t exs__resume_pend_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms,
                                       uint64_t next)
{
    struct exs_rsm_pend *pd = conn->resume.pend;
    uint64_t due, ms;

    resume_pend_reap_locked(conn); /* the timer: a safe point */
    pd = conn->resume.pend;
    if (!pd || pd->authed) /* proved: the conn's own deadline (RESUMING) bounds it */
        return next;
    due = pd->t0_ns + conn_ms * 1000000u; /* connect_timeout_ms is at least 1 */
    if (now_ns >= due) {
        resume_pend_refuse_locked(conn, "no proof before the deadline", 1);
        return next;
    }
    ms = (due - now_ns + 999999u) / 1000000u;
    return next ? EXS_MIN(next, ms) : ms;
}

/* The cut-over failed (or the application closed): the conn ends at once, every
 * operation with err (§9.2: as without fallback). count: a failure to count. */
static void resume_end_locked(struct exs_conn *conn, int err, const char *why, int count)
{
    if (count)
        resume_failed_note(conn, why);
    resume_pend_kill_locked(conn, 0);
    conn->resume.peer_wait = conn->resume.peer_got = 0;
    if (!conn->err)
        conn->err = err;
    exs__conn_end_locked(conn, err, why);
}

/* May conn be cut over now (§9.2, When)? A conn cut over once is not again; a ring
 * region in change (§7.4) is not a reason (exs__stream_ring_cut_locked). */
static int resume_eligible(const struct exs_conn *conn)
{
    /* both keys: a passive side that has not taken the peer's SESSION (lost with the
     * path) could check no proof and would refuse every request (exs__conn_resume_request) */
    return conn->sess_token && conn->resume.keys == (EXS_RSM_KEY_OWN | EXS_RSM_KEY_PEER) &&
           !conn->resume.over && conn->state == EXS_CONN_CONNECTED &&
           conn->txshut == EXS_TXSHUT_OPEN && !conn->peer_shut && conn->cb->resume_mr &&
           (!conn->active || conn->cb->resume_addr);
}

int exs__resume_begin_locked(struct exs_conn *conn, const char *cause, int disc, int silent)
{
    if (conn->state == EXS_CONN_RESUMING) {
        conn->resume.disc |= disc;
        return 1;
    }
    if (!resume_eligible(conn)) {
        resume_path_failed_locked(conn, cause);
        return 0;
    }
    EXS_INFO(PROTO, "conn %p: path failed (%s): resuming over the fallback (%s side)", (void *)conn,
             cause, conn->active ? "active" : "passive");
    exs__conn_set_state_locked(conn, EXS_CONN_RESUMING, cause);
    conn->resume.over = 1; /* one cut-over per connection */
    conn->resume.t0_ns = exs__now_ns();
    conn->resume.disc = disc;
    conn->resume.newpath = 0;
    conn->resume.fail = 0;
    /* a silent path (keepalive) is not drained: nothing more comes over it, and waiting
     * for a flush would wait for the remote; its endpoint goes with what it holds */
    conn->resume.abandon = !!silent;
    conn->resume.disc |= conn->resume.abandon;
    if (!disc)
        exs__prov_disconnect(conn->ep); /* its outstanding work is flushed */
    else if (!silent)
        exs__conn_quiet_fence_locked(conn); /* the drain waits behind unsignaled writes */
    /* work requests never posted complete as flushed, as the posted ones will */
    exs__conn_hooks.wrq_flush(conn);
    return 1;
}

int exs__resume_on_fail_locked(struct exs_conn *conn, int err, const char *why)
{
    if (conn->state == EXS_CONN_RESUMING) {
        if (!conn->resume.fail) {
            EXS_INFO(PROTO, "conn %p: %s while resuming", (void *)conn, why);
            conn->resume.fail = err ? err : ECONNRESET;
        }
        return 1;
    }
    if (conn->resume.peer_wait) { /* the new path failed before the resume was whole */
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
    uint32_t stale = exs__seqpkt_resume_cut_locked(conn);

    if (stale == UINT32_MAX)
        return -ENOMEM;
    if (stale)
        EXS_INFO(PROTO,
                 "conn %p: %u announced messages not read at the cut wait to be "
                 "announced again",
                 (void *)conn, stale);
    return 0;
}

/* The old path is over: its endpoint goes, its grants first, so a connection waiting for
 * its new path holds no provider resource (§9.2, The old path). What the endpoint still
 * held is discarded (resume.abandon). Nothing when it went already. */
static void resume_old_path_release_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    if (!conn->ep)
        return;
    exs__conn_revoke_all_locked(conn);
    exs__prov_ep_destroy(conn->ep);
    conn->ep = NULL;
    conn->wr_out = 0;
    exs_list_for_each(pos, &conn->sendq) exs_list_entry(pos, struct exs_op, link)->inflight = 0;
}

/* The new path's ring and endpoint on ctx (conn->ctx already): made now (the active side),
 * or taken from the resume request whose proof checked out (the passive side: the ring
 * its accept announced must hold what is unread). 0 or -errno. */
static int resume_path_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx)
{
    struct exs_rsm_pend *pd = conn->resume.pend;
    uint64_t unread = conn->rd_arrived - conn->rd_consumed;
    int ret;

    if (conn->active) {
        ret = exs__conn_ring_region_locked(conn, conn->p.ring_size, 0, &conn->ring_mem, NULL);
        if (ret) {
            conn->ring_mem = NULL;
            return ret;
        }
        conn->ring = conn->ring_mem->addr;
        return exs__conn_path_new_locked(conn, ctx);
    }
    EXS_ASSERT(pd && pd->authed && !pd->dead && pd->path.ctx == ctx);
    if (unread > pd->ring_size) {
        EXS_INFO(PROTO,
                 "conn %p: %" PRIu64 " bytes unread at the cut: more than the %u-byte "
                 "ring the new path announced",
                 (void *)conn, unread, pd->ring_size);
        return -ENOSPC;
    }
    conn->p.ring_size = pd->ring_size;
    conn->ring_mem = pd->ring_mem;
    conn->ring = conn->ring_mem->addr;
    pd->ring_mem = NULL;
    exs__conn_path_take_locked(conn, &pd->path);
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

    resume_old_path_release_locked(conn);    /* (the passive side's went when it began to wait) */
    ret = exs__stream_ring_cut_locked(conn); /* unread bytes retired; the new ring's size */
    if (ret)
        return ret;
    conn->ctrl_mem = conn->rx_mr = conn->tx_mr = NULL;
    conn->rx_bufs = conn->tx_bufs = NULL;
    exs__conn_mem_free(old_ctrl);
    exs__batch_release_locked(conn); /* staging: made again at the next batch */
    memset(conn->batch_slot, 0, sizeof(conn->batch_slot));
    __atomic_store_n(&conn->ctx, ctx, __ATOMIC_RELAXED);
    ret = resume_path_locked(conn, ctx);
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
    if (conn->seqpkt.rx_frag) { /* SEQPACKET: a message cut between its pieces comes again
                                 * whole; its receive is advertised again from offset 0 */
        conn->stats.bytes_received -= conn->seqpkt.rx_frag->filled;
        conn->seqpkt.rx_frag->filled = 0;
        conn->seqpkt.rx_frag = NULL;
    }
    conn->seqpkt.frag_op = NULL; /* the sender's: re-sent whole from its first byte */
    /* the receiver restarts in a direct phase (§7), its old ring's bytes first */
    conn->stream.pr = 0;
    conn->stream.sr_next = conn->rx_seq;
    conn->stream.drain = EXS_STREAM_DRAIN_IDLE;
    conn->stream.streak = 0;
    conn->stream.eval_arrived = conn->rd_arrived;
    conn->stream.drain_dir = 0;
    conn->stream.drain_hold = 0;
    /* the sender's ADVERTs, credits and ring writes were the old path's */
    conn->adv_head = conn->adv_count = 0;
    conn->peer_ring_keyed = 0;
    conn->credits = conn->owed = 0;
    conn->sq_out = 0;
    conn->quiet_run = conn->quiet_live = 0; /* the old endpoint's unsignaled writes */
    conn->resume.rx_gap = 0;
    conn->ring_wr_out = 0;
    conn->ctrl_len = 0;
    conn->shut_op = NULL;
    memset(&conn->bwait, 0, sizeof(conn->bwait));
    conn->keepalive.probe_out = conn->keepalive.waiting = 0;
    conn->keepalive.ping = conn->keepalive.answer = 0; /* the old path's PING and its owed answer */
    conn->keepalive.fails = 0;
    conn->tx_stall_ns = 0;
    conn->resume.newpath = 1;
    conn->resume.peer_wait = 1;
    return 0;
}

/* Active side: connect to the peer's fallback address with the resume hello, the token
 * and a fresh nonce_A (§9.2, Proof). */
static int resume_connect_locked(struct exs_conn *conn, const struct sockaddr_storage *addr,
                                 socklen_t len)
{
    struct exs_wire_resume_req q;
    int ret = exs__resume_random(conn->resume.nonce, sizeof(conn->resume.nonce));

    if (ret)
        return ret;
    exs__conn_hello(conn, &q.hello);
    q.hello.hflags = EXS_WIRE_HELLO_F_RESUME;
    q.token = htobe64(conn->sess_token);
    memcpy(q.nonce_a, conn->resume.nonce, sizeof(q.nonce_a));
    return exs__prov_connect(conn->ep, (const struct sockaddr *)addr, len, &q, sizeof(q));
}

/* The new path is up (the active side's ESTABLISHED, with its AUTH appended; the passive
 * side's take of a proved request): CONNECTED, our RING and RESUME, and the peer's RESUME
 * applied when it came first. */
static void resume_newpath_up_locked(struct exs_conn *conn)
{
    struct exs_wire_resume r;

    exs__conn_set_state_locked(conn, EXS_CONN_CONNECTED, "new path established");
    conn->keepalive.heard_ns = exs__now_ns();
    exs__conn_ring_grant_locked(conn); /* the RING record (after AUTH on the active side) */
    if (conn->state != EXS_CONN_CONNECTED)
        return;
    /* then our RESUME: what arrived over the old path; the ring bytes still to be
     * copied out are reported consumed by later ACKs */
    exs__resume_record_locked(conn, &r);
    conn->rd_reported = conn->rd_consumed;
    exs__conn_ctrl_append_locked(conn, &r, sizeof(r));
    if (conn->resume.peer_got) {
        conn->resume.peer_got = 0;
        memcpy(&r, &conn->resume.peer, sizeof(r));
        if (resume_apply_locked(conn, &r)) {
            exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
            return;
        }
    }
    exs__conn_kick_locked(conn);
}

/* Passive side, the path switched to the proved request's: its hello adopted, the
 * completions it held handed to the conn (the records after AUTH first), the trial gone. */
static void resume_pend_take_locked(struct exs_conn *conn)
{
    struct exs_rsm_pend *pd = conn->resume.pend;

    exs__conn_adopt_hello_locked(conn, &pd->peer);
    for (uint32_t i = 0; i < pd->held && !conn->resume.fail && conn->state == EXS_CONN_RESUMING;
         i++)
        exs__conn_hooks.on_rx_held(conn, &pd->cqe[i]);
    __atomic_sub_fetch(&resume_pend_live, 1, __ATOMIC_RELAXED);
    free(pd);
    conn->resume.pend = NULL;
    if (conn->resume.fail) {
        resume_end_locked(conn, conn->resume.fail, "failure while resuming", 1);
        return;
    }
    resume_newpath_up_locked(conn);
}

void exs__resume_progress_locked(struct exs_conn *conn)
{
    struct sockaddr_storage addr;
    struct exs_prov_ctx *ctx = NULL;
    socklen_t len = 0;
    int ret;

    if (conn->state != EXS_CONN_RESUMING)
        return;
    if (conn->resume.fail) {
        resume_end_locked(conn, conn->resume.fail, "failure while resuming", 1);
        return;
    }
    if (conn->resume.newpath)
        return;
    /* the old path is over once its DISCONNECTED came and every work request completed:
     * then what arrived is final (§9.2, Positions) */
    if (!conn->resume.disc || ((conn->wr_out || conn->wrq_count) && !conn->resume.abandon))
        return;
    if (conn->peer_shut || conn->resume.peer_closed) {
        /* its SHUTDOWN came in the drain, or its endpoint closed (the provider told,
         * after a failure seen first had begun the cut-over): the peer closed */
        resume_end_locked(conn, ECONNRESET, "the peer closed", 0);
        return;
    }
    exs__resume_wait_join_locked(conn); /* at most resume_max wait: the oldest give up */
    if (conn->active) {
        ret = conn->cb->resume_addr(conn, &ctx, &addr, &len);
        if (ret) {
            resume_end_locked(conn, ECONNRESET, "no fallback address", 1);
            return;
        }
    } else {
        struct exs_rsm_pend *pd = conn->resume.pend;

        /* a request whose proof checked out, its new path established */
        ctx = pd && pd->authed && !pd->dead && pd->established ? pd->path.ctx : NULL;
        if (!ctx) { /* the active side's request (or its proof) comes; nothing of the
                     * old path waits */
            resume_old_path_release_locked(conn);
            return;
        }
    }
    if (!conn->dp->bytes && resume_sp_cut_locked(conn)) {
        resume_end_locked(conn, ECONNRESET, "no memory for announced messages", 1);
        return;
    }
    ret = resume_switch_locked(conn, ctx);
    if (ret) {
        EXS_WARN(PROTO, "conn %p: new path: %s", (void *)conn, strerror(-ret));
        resume_end_locked(conn, ECONNRESET, "the new path could not be made", 1);
        return;
    }
    EXS_DBG(PROTO, "conn %p: old path drained (%" PRIu64 " bytes arrived): new path on %s",
            (void *)conn, exs__resume_arrived_locked(conn), exs__prov_name(ctx));
    if (!conn->active) {
        resume_pend_take_locked(conn);
        return;
    }
    ret = resume_connect_locked(conn, &addr, len);
    if (ret) {
        EXS_INFO(PROTO, "conn %p: new path: connect failed: %s", (void *)conn, strerror(-ret));
        resume_end_locked(conn, ECONNRESET, "the new path's connect failed", 1);
    }
}

/* Active side, the new path established: the accept's hello checked and MAC_B, the
 * passive side's proof, before anything is sent; then AUTH, our proof, first (§9.2). */
static void resume_established_active_locked(struct exs_conn *conn,
                                             const struct exs_prov_cm_event *ev)
{
    struct exs_wire_auth a = {
        .hdr = {.type = EXS_CTRL_AUTH, .len = htobe16(EXS_WIRE_AUTH_LEN)},
    };
    struct exs_wire_resume_acc acc;
    uint8_t mac[EXS_SHA256_LEN];

    if (exs__conn_hello_check(ev->private_data, ev->private_data_len, conn->p.sock_type)) {
        resume_end_locked(conn, ECONNRESET, "bad hello on the new path", 1);
        return;
    }
    if (ev->private_data_len < EXS_WIRE_RESUME_ACC_LEN) {
        resume_end_locked(conn, ECONNRESET, "the new path's accept carries no proof", 1);
        return;
    }
    memcpy(&acc, ev->private_data, sizeof(acc));
    exs__resume_conn_mac(conn, EXS_WIRE_AUTH_LABEL_B, conn->resume.nonce, acc.nonce_b, mac);
    if (!exs__mem_equal_ct(mac, acc.mac_b, sizeof(acc.mac_b))) {
        resume_end_locked(conn, ECONNRESET, "the new path's accept has a wrong proof (MAC_B)", 1);
        return;
    }
    if (!(be16toh(acc.hello.features) & EXS_WIRE_FEAT_RESUMABLE)) {
        resume_end_locked(conn, ECONNRESET, "new path's hello without bit 7", 1);
        return;
    }
    exs__conn_adopt_hello_locked(conn, &acc.hello);
    exs__resume_conn_mac(conn, EXS_WIRE_AUTH_LABEL_A, conn->resume.nonce, acc.nonce_b, a.mac);
    exs__conn_ctrl_append_locked(conn, &a, sizeof(a));
    resume_newpath_up_locked(conn);
}

void exs__resume_on_cm_locked(struct exs_conn *conn, const struct exs_prov_cm_event *ev)
{
    if (ev->type == EXS_PROV_CM_DISCONNECTED && ev->ep && ev->ep == conn->ep &&
        !conn->resume.newpath && (ev->flags & EXS_PROV_CM_F_PEER_CLOSED))
        conn->resume.peer_closed = 1; /* the peer closed: no cut-over after the drain */

    if (ev->ep && ev->ep != conn->ep)
        return;                  /* not the conn's endpoint now */
    if (!conn->resume.newpath) { /* the old endpoint */
        if (ev->type == EXS_PROV_CM_DISCONNECTED) {
            if (!conn->resume.disc) /* in ERROR now: the drain waits behind unsignaled
                                     * writes (§6.4, The drain) */
                exs__conn_quiet_fence_locked(conn);
            conn->resume.disc = 1;
            exs__resume_progress_locked(conn);
        }
        return;
    }
    switch (ev->type) {
    case EXS_PROV_CM_ESTABLISHED:
        if (conn->active) /* the passive side's new path is a trial's until taken */
            resume_established_active_locked(conn, ev);
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
            exs__seqpkt_resume_reann_mark_locked(conn, op);
            continue;
        }
        if (op->state == EXS_OPS_POSTED && op->seq < pos) {
            exs__conn_send_done_locked(conn, op);
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

/* ---- unsignaled sends' copies (§6.4, §9.2, Replay) ---- */

/* The copies a cut-over sends again: internal ops (no event: the application had its
 * send's at the post), their bytes in memory registered on the new path's context. */
struct exs_rsm_replay {
    struct exs_prov_mr *mem;
    uint32_t n, left; /* ops; not yet handed back */
    struct exs_op op[];
};

static void resume_replay_done(struct exs_op *op)
{
    struct exs_conn *conn = op->owner;
    struct exs_rsm_replay *rp = conn->resume.replay;

    if (--rp->left)
        return;
    exs__conn_mem_free(rp->mem);
    free(rp);
    conn->resume.replay = NULL;
}

/* The copies go: at the cut-over, once those to send again are taken (no second cut),
 * or with the conn (destroy: the replayed ops left sendq before it could be). */
static void resume_quiet_free_locked(struct exs_conn *conn, int destroy)
{
    if (conn->resume.quiet) {
        free(conn->resume.quiet);
        exs__conn_mem_give_locked(conn, exs__mem_chunk(sizeof(*conn->resume.quiet)));
        conn->resume.quiet = NULL;
    }
    EXS_ASSERT(!destroy || !conn->resume.replay);
}

void exs__resume_give_up_locked(struct exs_conn *conn)
{
    if (conn->resume.over) /* cut over (copies freed at the cut) or under way (its own) */
        return;
    conn->resume.over = 1;
    resume_quiet_free_locked(conn, 0); /* conn_quiet_copies: no copy is kept from now on */
}

/* Applying the peer's RESUME at position pos, before the send queue is rewound (upto:
 * resume_tx_done, where the first send not ended starts, STREAM; one past the highest
 * ended message, SEQPACKET): the sends from pos up to upto ended at their post, their
 * bytes only in the copies, made ready to go again (an op for each, from pos: a copy pos
 * cuts goes on from its byte pos). NULL in *rp when none goes again. 0, -EPROTO (a
 * violation, recorded) when the copies do not hold them all, one after the other (the
 * RESUME check's floor refuses such a pos first), or -ENOMEM. */
static int resume_quiet_prepare_locked(struct exs_conn *conn, uint64_t pos, uint64_t upto,
                                       struct exs_rsm_replay **rp_p)
{
    const struct exs_rsm_quiet *q = conn->resume.quiet;
    int bytes = conn->dp->bytes;
    uint64_t at = pos, skip[EXS_RSM_COPIES];
    uint32_t first = 0, n = 0;
    struct exs_rsm_replay *rp;
    int ret;

    *rp_p = NULL;
    for (uint32_t i = 0; q && i < q->n; i++) {
        const struct exs_rsm_copy *c =
            &q->c[(q->next + EXS_RSM_COPIES - q->n + i) % EXS_RSM_COPIES]; /* oldest first */
        uint64_t end = c->pos + (bytes ? c->len : 1);

        if (end <= pos)
            continue;
        if (c->pos > at || at >= end)
            break; /* a gap, or an overlap: a send of it is not here */
        if (!n)
            first = i;
        skip[n] = at - c->pos; /* 0 but where pos cuts the first (STREAM) */
        at = end;
        n++;
    }
    if (at != EXS_MAX(pos, upto))
        return exs__proto_violation(conn, EXS_PV_RESUME, EXS_CTRL_RESUME,
                                    "position %" PRIu64 ": the copies of unsignaled sends do not "
                                    "hold %s %" PRIu64 " to %" PRIu64,
                                    pos, bytes ? "bytes" : "messages", at, upto);
    if (!n)
        return 0;
    rp = calloc(1, sizeof(*rp) + n * sizeof(rp->op[0]));
    if (!rp)
        return -ENOMEM;
    ret = exs__conn_mem_alloc(conn->ctx, (size_t)n * EXS_RSM_COPY_SIZE, EXS_MEM_FORCE, &rp->mem);
    if (ret) {
        free(rp);
        return ret;
    }
    rp->n = rp->left = n;
    for (uint32_t i = 0; i < n; i++) {
        const struct exs_rsm_copy *c =
            &q->c[(q->next + EXS_RSM_COPIES - q->n + first + i) % EXS_RSM_COPIES];
        struct exs_op *op = &rp->op[i];

        op->kind = EXS_OP_SEND;
        op->state = EXS_OPS_QUEUED;
        op->buf = (uint8_t *)rp->mem->addr + (size_t)i * EXS_RSM_COPY_SIZE;
        op->len = c->len - skip[i];
        op->flags = c->flags;
        op->mr = rp->mem;
        op->lkey = rp->mem->lkey;
        op->internal = 1;
        op->done = resume_replay_done;
        op->owner = conn;
        memcpy(op->buf, c->data + skip[i], op->len);
    }
    *rp_p = rp;
    return 0;
}

/* The copies go first, in order, at sendq's head (every send still in sendq came after
 * them: a send went unsignaled only with none before it unfinished). Their bytes. */
static uint64_t resume_quiet_replay_locked(struct exs_conn *conn, struct exs_rsm_replay *rp)
{
    struct exs_list *head = conn->sendq.next;
    uint64_t again = 0;

    if (!rp)
        return 0;
    EXS_ASSERT(!conn->resume.replay);
    conn->resume.replay = rp;
    for (uint32_t i = 0; i < rp->n; i++) {
        exs_list_add_tail(head, &rp->op[i].link); /* before the old head, after the last */
        again += rp->op[i].len;
    }
    conn->dlv_run = NULL; /* delivery's run of internal ops at the head: found again */
    conn->bwait.first = NULL;
    EXS_INFO(PROTO, "conn %p: %u unsignaled sends the peer did not get go again from their copies",
             (void *)conn, rp->n);
    return again;
}

/* The peer's RESUME on the new path, checked: the sender rewinds to the position the
 * peer stated and sends everything past it again (§9.2, Replay). */
static int resume_apply_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    uint64_t pos = be64toh(r->rx_bytes), ra = be64toh(r->ring_arrived);
    uint64_t rc = be64toh(r->ring_consumed), off = conn->resume_tx_done, sent = conn->tx_seq;
    uint64_t again;
    struct exs_rsm_replay *rp;
    struct exs_list *p;
    int ret = exs__resume_check_locked(conn, r);

    if (ret)
        return ret;
    if (!conn->dp->bytes)
        pos = be64toh(r->rx_msgs);
    /* the sends that ended at their post (§6.4) and did not arrive: from their copies */
    ret = resume_quiet_prepare_locked(conn, pos, off, &rp);
    if (ret)
        return ret;
    resume_quiet_free_locked(conn, 0); /* cut over once: no copy is kept from now on */
    conn->sendq_settled = NULL;        /* sends posted whole may go again */
    if (!conn->dp->bytes) {
        conn->seqpkt.reann_pos = pos;
        again = resume_sp_rewind_locked(conn, pos) + resume_quiet_replay_locked(conn, rp);
        goto rewound;
    }
    exs_list_for_each(p, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(p, struct exs_op, link);

        if (op->kind != EXS_OP_SEND || op->state == EXS_OPS_DONE)
            continue;
        if (pos >= off + op->len && op->posted == op->len) { /* arrived whole */
            exs__conn_send_done_locked(conn, op);
        } else {
            op->posted = pos > off ? (size_t)(pos - off) : 0;
            op->state = op->posted ? EXS_OPS_POSTED : EXS_OPS_QUEUED;
        }
        off += op->len;
    }
    resume_quiet_replay_locked(conn, rp);
    again = sent - pos; /* the copies' bytes too */
rewound:
    conn->tx_seq = pos;
    conn->wr_tail = ra;
    conn->wr_consumed = rc;
    /* the STREAM algorithm restarts in a direct phase */
    conn->stream.ps = 0;
    conn->stream.held = conn->stream.drain_owed = conn->stream.lingering = 0;
    conn->autotune.owed = 0;
    conn->adv_head = conn->adv_count = 0;
    conn->resume.peer_wait = 0;
    EXS_CNT_INC(exs__resume_cnt.fallback_resumes);
    EXS_CNT_ADD(exs__resume_cnt.fallback_replayed_bytes, again);
    EXS_INFO(PROTO,
             "conn %p: resumed over %s: %" PRIu64 " bytes sent again from %s %" PRIu64 ", %" PRIu64
             " ring bytes of the old path still to read",
             (void *)conn, exs__prov_name(conn->ctx), again, conn->dp->bytes ? "byte" : "message",
             pos, conn->rd_arrived - conn->rd_consumed);
    return 0;
}

uint64_t exs__resume_timer_locked(struct exs_conn *conn, uint64_t now_ns, uint64_t conn_ms)
{
    uint64_t due = conn->resume.t0_ns + conn_ms * 1000000u;

    if (conn->state == EXS_CONN_RESUMING && conn->resume.fail) {
        resume_end_locked(conn, conn->resume.fail, "failure while resuming", 1);
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
    if (conn->state == EXS_CONN_CONNECTED && conn->resume.peer_wait) {
        /* nothing was rewound yet: no SHUTDOWN can count the stream; reset */
        if (!conn->err)
            conn->err = ECONNRESET;
        conn->resume.peer_wait = 0;
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
    struct exs_wire_resume_req q;
    struct exs_conn *conn;
    uint64_t token;
    const char *bad = NULL;
    char why[96];
    int reason = EXS_WIRE_REJ_RESUME;

    if (!pd || len < EXS_WIRE_RESUME_PD_LEN) {
        EXS_INFO(PROTO, "resume request without a token and nonce (%u bytes)", len);
        return EXS_WIRE_REJ_RESUME;
    }
    memcpy(&q, pd, sizeof(q));
    token = be64toh(q.token);
    conn = token ? exs__resume_registry_find(token) : NULL;
    if (!conn) {
        EXS_INFO(PROTO, "resume request for an unknown session refused");
        return EXS_WIRE_REJ_RESUME;
    }
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    resume_pend_reap_locked(conn); /* a cm event: a safe point */
    /* nothing here touches the connection: the request is only put on trial */
    if (conn->p.sock_type != sock_type || conn->active)
        bad = "not a passive session of this socket type";
    else if (conn->resume.keys != (EXS_RSM_KEY_OWN | EXS_RSM_KEY_PEER))
        bad = "the session's keys are not both known";
    else if (conn->resume.pend)
        bad = "a request is already on trial";
    else if (!(conn->state == EXS_CONN_CONNECTED && resume_eligible(conn)) &&
             !(conn->state == EXS_CONN_RESUMING && !conn->resume.newpath)) {
        snprintf(why, sizeof(why), "the connection cannot be resumed (%s%s%s)",
                 exs__conn_state_name(conn->state),
                 conn->state == EXS_CONN_CONNECTED && conn->resume.over ? ", cut over once" : "",
                 conn->state == EXS_CONN_CONNECTED && (conn->txshut || conn->peer_shut)
                     ? ", shut down"
                     : "");
        bad = why;
    } else if (__atomic_load_n(&resume_pend_live, __ATOMIC_RELAXED) >= RSM_PEND_MAX)
        bad = "too many resume requests on trial in the process";
    if (!bad)
        reason = resume_pend_open_locked(conn, ctx, req, &q);
    else
        EXS_INFO(PROTO, "conn %p: resume request refused: %s", (void *)conn, bad);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    exs__resume_registry_put(conn);
    exs__resume_evict_run(); /* those it made give up (the wait) */
    return reason;
}

void exs__resume_fork_child(void)
{
    exs__resume_sess_fork_child();
    resume_pend_live = 0;
}
