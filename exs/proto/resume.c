/* SPDX-License-Identifier: MIT */
/* The cut-over of a connection to another path (spec/protocol.md §9.2): identity, positions. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/random.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"

/* Process counters of the cut-over, in the set "fallback" beside the engine's (lookups
 * of one set name add up). */
static struct {
    uint64_t fallback_sessions;
    uint64_t fallback_resume_failures;
} resume_cnt;

static const struct exs_counter_desc resume_counter_desc[] = {
    EXS_COUNTER(__typeof__(resume_cnt), fallback_sessions,
                "connections that took a SESSION token (both sides resumable, policy any)"),
    EXS_COUNTER(__typeof__(resume_cnt), fallback_resume_failures,
                "of those: the path failed mid-stream and the connection was not resumed "
                "(every one for now: the cut-over is not built)"),
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

int exs__resume_on_resume_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    /* A RESUME is only ever the first record on a new path (§9.2), and no new path is
     * made yet: on a connection's first path it is always hostile, whatever it says. */
    EXS_INFO(PROTO,
             "conn %p: RESUME record refused on a first path (token %s, %" PRIu64
             " messages, %" PRIu64 " bytes)",
             (void *)conn,
             conn->sess_token && be64toh(r->token) == conn->sess_token ? "ours" : "not ours",
             be64toh(r->rx_msgs), be64toh(r->rx_bytes));
    return -EPROTO;
}

void exs__resume_path_failed_locked(struct exs_conn *conn, const char *cause)
{
    /* only an established, resumable connection that nobody was ending (no exs_close,
     * exs_shutdown or SHUTDOWN record on either side) is cut over (§9.2, When) */
    if (!conn->sess_token || conn->resume_noted || conn->state != EXS_CONN_CONNECTED ||
        conn->txshut != EXS_TXSHUT_OPEN || conn->peer_shut)
        return;
    conn->resume_noted = 1;
    EXS_CNT_INC(resume_cnt.fallback_resume_failures);
    EXS_INFO(PROTO,
             "conn %p: path failed (%s) while resumable: not resumed (the cut-over to the "
             "fallback is not built); the connection ends",
             (void *)conn, cause);
}

void exs__resume_tx_done_locked(struct exs_conn *conn, const struct exs_op *op)
{
    /* the writes of one endpoint complete in posting order and a stream is written in
     * order, so these bytes are a prefix of the stream */
    if (conn_is_stream(conn) && op->kind == EXS_OP_SEND)
        conn->resume_tx_done += op->len;
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
}

int exs__resume_check_locked(const struct exs_conn *conn, const struct exs_wire_resume *r)
{
    uint64_t token = be64toh(r->token), msgs = be64toh(r->rx_msgs), bytes = be64toh(r->rx_bytes);
    int stream = conn_is_stream(conn);
    uint64_t pos = stream ? bytes : msgs;
    /* SEQPACKET: what was seen completed is not tracked (yet): only the upper bound */
    uint64_t done = stream ? conn->resume_tx_done : 0;
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
    if (bad) {
        EXS_INFO(PROTO,
                 "conn %p: RESUME refused: %s (position %" PRIu64 ", sent %" PRIu64
                 ", completed %" PRIu64 ")",
                 (void *)conn, bad, pos, conn->tx_seq, done);
        return -EPROTO;
    }
    return 0;
}

void exs__resume_on_fail_locked(struct exs_conn *conn, const char *why)
{
    if (conn->sess_token && conn->state == EXS_CONN_CONNECTED &&
        exs__prov_ep_state(conn->ep) != EXS_PROV_EP_CONNECTED)
        exs__resume_path_failed_locked(conn, why);
}
