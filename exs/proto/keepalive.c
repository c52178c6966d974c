/* SPDX-License-Identifier: MIT */
/* Keepalive and the connection's timers (spec/protocol.md §3.1, §9): the handshake and
 * send deadlines, keepalive probes, the window check. Layer 4 of spec/proto-layout.md. */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* ---- keepalive and deadlines (§9; progress thread, from the owner's timer) ---- */

/* The peer stopped answering, or the connection hung: end it at once, without waiting
 * for anything from the peer. Every operation completes with ETIMEDOUT (eager data
 * already in the ring is still handed out first), the endpoint and every grant go now
 * (ep_destroy discards outstanding work without completions), and the owner hears of
 * the death; the conn itself stays until its owner closes. */
static void conn_timeout_locked(struct exs_conn *conn, const char *why)
{
    EXS_INFO(PROTO, "conn %p: %s: connection timed out", (void *)conn, why);
    if (!conn->err)
        conn->err = ETIMEDOUT;
    exs__conn_set_state_locked(conn, EXS_CONN_DOWN, why);
    exs__conn_dead_locked(conn, ETIMEDOUT, why);
    conn->cb->dead(conn);
}

/* Post the probe: a zero-byte RDMA WRITE, which consumes no receive at the peer and
 * wakes nothing there; its completion says the peer's NIC acknowledged it. Zero-length
 * writes are not checked against the key (spec/provider.md), so the ring's address and
 * key serve whether or not the peer's RING record came. */
static int conn_ka_probe_locked(struct exs_conn *conn)
{
    struct exs_prov_sge sge = {0};
    struct exs_prov_send_wr wr = {
        .wr_id = WR_ID(WR_TAG_KA, 0),
        .opcode = EXS_PROV_WR_RDMA_WRITE,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 0,
        .remote_addr = conn->peer.ring_addr,
        .rkey = conn->peer.ring_rkey,
    };
    int ret = exs__conn_post_send_locked(conn, &wr);

    if (ret) {
        EXS_WARN(PROTO, "conn %p: keepalive probe: post failed: %s", (void *)conn, strerror(-ret));
        return ret;
    }
    conn->wr_out++;
    conn->keepalive.probe_out = 1;
    conn->stats.keepalive_probes++;
    return 0;
}

/* Both hellos have feature ALIVE: the peer's library answers probes (§9.1). Not under
 * the window seam EXS_WINDOW_TEST (tests only): a PING returns credits, and the seam's
 * windows must stay full until its NOP (§3.1), so keepalive keeps the zero-byte WRITE. */
/* Feature ALIVE: the probe is a NOP with flag PING, a SEND that costs a credit like any
 * control record and carries the owed credits; the peer's library answers it with a NOP,
 * a receive here. 0 when it cannot go yet (no send slot, no credit it may spend, records
 * waiting fill the control buffer): it waits while the interval keeps counting; a live
 * peer returns credits by itself meanwhile, and that receive is its answer (§9.1). */
static int conn_ka_ping_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr ping = {
        .type = EXS_CTRL_NOP,
        .flags = EXS_NOP_PING,
        .len = htobe16(EXS_WIRE_NOP_LEN),
    };

    if (!conn->tx_free_top || !exs__conn_can_spend_ctrl_locked(conn) ||
        !exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return 0;
    exs__conn_ctrl_append_locked(conn, &ping, sizeof(ping));
    conn->keepalive.ping = 1;
    conn->stats.keepalive_probes++;
    exs__conn_ctrl_flush_locked(conn); /* a failed post resets the conn */
    return 1;
}

/* A NOP record came (flags: its hdr.flags). A PING is answered once per progress pass
 * (exs__conn_ka_answer_locked), however many came; from a peer without feature ALIVE it is a
 * protocol error. -EPROTO on a violation. */
int exs__conn_ka_on_nop_locked(struct exs_conn *conn, uint8_t flags)
{
    if (!(flags & EXS_NOP_PING))
        return 0;
    if (!exs__conn_ka_alive(conn))
        return exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_NOP,
                                    "a PING without feature ALIVE");
    conn->keepalive.answer = 1;
    return 0;
}

/* The probe of this silent interval: a PING with feature ALIVE (a failed post resets the
 * conn there: the caller sees its state), else the zero-byte WRITE unless one is still
 * outstanding. 0, or -errno when the WRITE's post failed. */
static int conn_ka_send_probe_locked(struct exs_conn *conn)
{
    if (!exs__conn_ka_alive(conn))
        return conn->keepalive.probe_out ? 0 : conn_ka_probe_locked(conn);
    if (!conn->keepalive.ping)
        conn_ka_ping_locked(conn);
    return 0;
}

/* Keepalive (spec/protocol.md §9.1): after an interval without a successful completion
 * (with feature ALIVE: without a receive) a probe goes out, and each further interval
 * without one counts as a failed probe (an earlier probe still outstanding serves:
 * completions come in posting order; a PING that could not go is tried again at each
 * look). A completion's proof is stamped by the first look after it (the look's time),
 * so a peer that went silent at L is dead at L + interval x (probes + 1), plus less than
 * one look period (a look comes at least once an interval and once a second).
 * *due_p: when to look again. 1 when the peer is dead. */
static int conn_ka_check_locked(struct exs_conn *conn, uint64_t now, uint64_t intv_ns,
                                uint64_t *due_p)
{
    uint64_t probes = __atomic_load_n(&exs__params.keepalive_probes, __ATOMIC_RELAXED);
    const uint64_t slack = 1000000u; /* 1 ms early still counts: timers are not exact */

    /* heard since the last look: the completions read no clock (a message's path), the
     * look stamps them with its own time, never earlier than the proof (§9.1) */
    if (conn->keepalive.heard) {
        conn->keepalive.heard = 0;
        conn->keepalive.heard_ns = now;
    }
    if (!conn->keepalive.waiting || conn->keepalive.heard_ns > conn->keepalive.probe_ns) {
        conn->keepalive.waiting = 0;
        conn->keepalive.fails = 0;
        conn->keepalive.ping = 0;
        if (now + slack < conn->keepalive.heard_ns + intv_ns) {
            *due_p = conn->keepalive.heard_ns + intv_ns;
            return 0;
        }
        if (conn_ka_send_probe_locked(conn)) {
            exs__conn_fail_locked(conn, ECONNRESET, "keepalive probe failed");
            return 0;
        }
        conn->keepalive.waiting = 1;
        conn->keepalive.probe_ns = now;
        *due_p = now + intv_ns;
        return 0;
    }
    if (now + slack < conn->keepalive.probe_ns + (conn->keepalive.fails + 1) * intv_ns) {
        *due_p = conn->keepalive.probe_ns + (conn->keepalive.fails + 1) * intv_ns;
        return 0;
    }
    if (exs__conn_ka_alive(conn) && !conn->keepalive.ping) {
        conn_ka_ping_locked(conn); /* the PING could not go until now */
        if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
            return 0; /* its post failed: reset */
    }
    if (++conn->keepalive.fails < probes) {
        *due_p = conn->keepalive.probe_ns + (conn->keepalive.fails + 1) * intv_ns;
        return 0;
    }
    conn->stats.keepalive_timeouts = 1;
    EXS_INFO(PROTO, "conn %p: keepalive: %u probe intervals without an answer: peer dead",
             (void *)conn, conn->keepalive.fails);
    return 1;
}

/* Do queued sends move? Waiting sends with no data write completed for the whole
 * deadline mean a peer that stopped returning credits, ring space or ADVERTs (it may
 * still answer probes). 1 when the deadline passed. */
static int conn_stall_check_locked(struct exs_conn *conn, uint64_t now, uint64_t limit_ms)
{
    struct exs_list *pos;
    int waiting = 0;

    exs_list_for_each(pos, &conn->sendq)
    {
        if (exs_list_entry(pos, struct exs_op, link)->state != EXS_OPS_DONE) {
            waiting = 1;
            break;
        }
    }
    if (!waiting || !limit_ms) {
        conn->tx_stall_ns = 0;
        return 0;
    }
    if (!conn->tx_stall_ns || conn->tx_moved != conn->tx_moved_seen) {
        conn->tx_stall_ns = now;
        conn->tx_moved_seen = conn->tx_moved;
        return 0;
    }
    return now - conn->tx_stall_ns >= limit_ms * 1000000u;
}

/* Do sends wait for a credit (a queued send or shutdown that a credit would let go)? */
static int conn_sends_starved_locked(struct exs_conn *conn)
{
    struct exs_list *pos;

    if (exs__conn_can_spend_locked(conn))
        return 0;
    exs_list_for_each(pos, &conn->sendq) if (exs_list_entry(pos, struct exs_op, link)->state ==
                                             EXS_OPS_QUEUED) return 1;
    return 0;
}

/* The window check (spec/protocol.md §3.1): the conn owes the peer credits and either the
 * peer's window is full as far as we know (we owe it n - 1: it holds at most its reserved
 * last credit) or our own sends wait for a credit: return the owed credits now in a NOP,
 * which may spend the reserved last credit. Event-driven ACKs and piggybacking make this
 * unnecessary with the default rules (§3.1 shows why); it is the safety net, and what
 * unblocks the windows when the seam EXS_WINDOW_TEST turns those rules off. */
static void conn_nop_check_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr nop = {
        .type = EXS_CTRL_NOP,
        .len = htobe16(EXS_WIRE_NOP_LEN),
    };

    if (!conn->owed || (exs__conn_window_test() & EXS_WINDOW_TEST_NO_NOP))
        return;
    if (conn->owed < conn->p.credits - 1 && !conn_sends_starved_locked(conn))
        return;
    if (!conn->tx_free_top || !exs__conn_can_spend_ctrl_locked(conn))
        return; /* our own window is empty: the peer's next message returns credits */
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return; /* records wait that cannot go: they carry the credits when they do */
    EXS_DBG(PROTO, "conn %p: window check: %u credits owed, %u left: NOP", (void *)conn, conn->owed,
            conn->credits);
    exs__conn_ctrl_append_locked(conn, &nop, sizeof(nop));
    if (exs__conn_ctrl_flush_locked(conn)) {
        conn->stats.nops_sent++;
        EXS_PROTO_CNT_INC(conn, nops_sent);
    }
    exs__conn_kick_locked(conn); /* the credits it may have freed nothing; others may go */
}

/* A conn that went DOWN before ESTABLISHED (hs_down) waits for its endpoint to drain, but
 * never past the handshake deadline: a peer cannot hold the connect open by breaking the
 * protocol. Returns the ms until the deadline, 0 once it ended the conn. */
static uint64_t conn_hs_down_timer_locked(struct exs_conn *conn, uint64_t now, uint64_t conn_ms)
{
    uint64_t due = conn->dl_start_ns + conn_ms * 1000000u;

    if (now < due)
        return (due - now + 999999u) / 1000000u;
    EXS_INFO(PROTO, "conn %p: ended %s not drained after %llu ms", (void *)conn,
             conn->active ? "connect" : "accepted connection", (unsigned long long)conn_ms);
    exs__conn_dead_locked(conn, conn->err ? conn->err : ETIMEDOUT, "ended handshake not drained");
    conn->cb->dead(conn);
    return 0;
}

uint64_t exs__conn_timer(struct exs_conn *conn, uint64_t ka_ms)
{
    uint64_t now = exs__now_ns(), next = 0, ka_due = 0, ring_ms;
    uint64_t conn_ms = __atomic_load_n(&exs__params.connect_timeout_ms, __ATOMIC_RELAXED);
    uint64_t send_ms = __atomic_load_n(&exs__params.send_timeout_ms, __ATOMIC_RELAXED);

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    switch (conn->state) {
    case EXS_CONN_CONNECTING: {
        uint64_t due = conn->dl_start_ns + conn_ms * 1000000u;

        if (now < due) {
            next = (due - now + 999999u) / 1000000u;
            break;
        }
        EXS_INFO(PROTO, "conn %p: %s not established after %llu ms", (void *)conn,
                 conn->active ? "connect" : "accepted connection", (unsigned long long)conn_ms);
        exs__conn_dead_locked(conn, ETIMEDOUT, "handshake timed out");
        conn->cb->established(conn, ETIMEDOUT);
        break;
    }
    case EXS_CONN_DOWN:
    case EXS_CONN_DRAINING:
        next = conn->hs_down ? conn_hs_down_timer_locked(conn, now, conn_ms) : 0;
        break;
    case EXS_CONN_CONNECTED:
    case EXS_CONN_CLOSING:
        if (conn->resume.peer_wait) { /* the new path until the peer's RESUME (§9.2) */
            next = exs__resume_timer_locked(conn, now, conn_ms);
            break;
        }
        if (ka_ms && conn_ka_check_locked(conn, now, ka_ms * 1000000u, &ka_due)) {
            if (exs__resume_begin_locked(conn, "keepalive timeout", 0, 1)) {
                exs__resume_progress_locked(conn); /* the silent path is not drained */
                if (conn->state == EXS_CONN_RESUMING)
                    next = exs__resume_timer_locked(conn, now, conn_ms);
            } else {
                conn_timeout_locked(conn, "keepalive");
            }
            break;
        }
        if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
            break; /* a failed probe post reset it */
        if (conn_stall_check_locked(conn, now, send_ms)) {
            EXS_INFO(PROTO, "conn %p: queued sends made no progress for %llu ms", (void *)conn,
                     (unsigned long long)send_ms);
            conn_timeout_locked(conn, "send timeout");
            break;
        }
        ring_ms = conn->dp->ring_timer ? conn->dp->ring_timer(conn, now / 1000u) : 0;
        conn_nop_check_locked(conn);
        if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
            break; /* the NOP's post failed: reset */
        /* the stall deadline is checked four times per period: found within 1.25 x */
        next = 0;
        if (ka_ms)
            next = ka_due > now ? (ka_due - now + 999999u) / 1000000u : 1;
        if (send_ms)
            next = next ? EXS_MIN(next, EXS_MAX(send_ms / 4, 1)) : EXS_MAX(send_ms / 4, 1);
        if (ring_ms) /* ring autotuning: an idle grown ring shrinks (§7.4) */
            next = next ? EXS_MIN(next, ring_ms) : ring_ms;
        /* the window check runs at least this often: credits owed since the last look,
         * and online changes of keepalive and the deadlines, are seen within it */
        next = next ? EXS_MIN(next, EXS_NOP_CHECK_MS) : EXS_NOP_CHECK_MS;
        /* a conn that may be cut over is looked at four times per connect_timeout_ms,
         * so a RESUMING begun meanwhile ends within 1.25 x its deadline even with every
         * other check off (§9.2) */
        if (conn->sess_token && !conn->resume.over && conn_ms)
            next = next ? EXS_MIN(next, EXS_MAX(conn_ms / 4, 1)) : EXS_MAX(conn_ms / 4, 1);
        break;
    default: /* RESUMING: the cut-over's deadline (§9.2) */
        if (exs__conn_rows[conn->state].timer)
            next = exs__conn_rows[conn->state].timer(conn, now, conn_ms);
        break;
    }
    if (conn->resume.pend) /* a resume request on trial: bounded by connect_timeout_ms (§9.2) */
        next = exs__resume_pend_timer_locked(conn, now, conn_ms, next);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    exs__resume_evict_run(); /* connections a keepalive cut made give up (§9.2) */
    return next;
}
