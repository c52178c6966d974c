/* SPDX-License-Identifier: MIT */
/* Sampled request tracing: per-message times at both ends, the TRACE exchange, clock offset. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

static exs_reqtrace_sink_fn *rt_sink;
static uint64_t rt_count; /* atomic: records completed */
static pthread_mutex_t rt_file_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *rt_file;
static int rt_file_tried;

void exs__reqtrace_set_sink(exs_reqtrace_sink_fn *fn)
{
    __atomic_store_n(&rt_sink, fn, __ATOMIC_RELEASE);
}

uint64_t exs__reqtrace_completed(void)
{
    return __atomic_load_n(&rt_count, __ATOMIC_RELAXED);
}

/* The connection's trace clock (§5.1): what the peer sees of this host's time is
 * now - epoch, where epoch lies a random 2^61 to 2^62 ns before the connection's trace
 * state was made. Without getrandom (old kernel, or its pool not ready: never waited
 * for on the progress path) the random part is 0 and the clock starts at 2^61 then: the
 * peer still learns no more than how long the connection has been traced. */
static uint64_t rt_epoch_draw(void)
{
    uint64_t r = 0;

    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        EXS_DBG(PROTO, "request tracing: getrandom: %m; the trace clock starts at 2^61");
        r = 0;
    }
    return exs__now_ns() - ((1ull << 61) | (r & ((1ull << 61) - 1)));
}

/* A local CLOCK_MONOTONIC time as the peer sees it (never 0: see rt_epoch_draw). */
static uint64_t rt_wire_time(const struct exs_reqtrace *rt, uint64_t t)
{
    return t - rt->epoch_ns;
}

static struct exs_reqtrace *rt_get(struct exs_conn *conn)
{
    if (!conn->rt) {
        conn->rt = calloc(1, sizeof(*conn->rt));
        if (!conn->rt) {
            EXS_WARN(PROTO, "conn %p: request tracing: out of memory", (void *)conn);
            return NULL;
        }
        conn->rt->conn = conn;
        conn->rt->epoch_ns = rt_epoch_draw();
    }
    return conn->rt;
}

void exs__reqtrace_free_locked(struct exs_conn *conn)
{
    free(conn->rt);
    conn->rt = NULL;
}

/* Does the peer take TRACE records on this connection? (STREAM: also feature STRACE.) */
static int rt_peer_traces(const struct exs_conn *conn)
{
    uint16_t need = EXS_WIRE_FEAT_TRACE | (conn->dp->bytes ? EXS_WIRE_FEAT_STRACE : 0);

    return (conn->peer.features & need) == need;
}

/* STREAM: where the data stands at the receiver. Arrived: every byte before it has come
 * (placed directly or waiting in the ring); placed: copied or written into a receive. */
static uint64_t rt_st_arrived(const struct exs_conn *conn)
{
    return conn->rx_seq + (conn->rd_arrived - conn->rd_consumed);
}

/* ---- sender ---- */

void exs__reqtrace_post_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_reqtrace *rt;

    /* a STREAM send of no bytes has no last byte to trace */
    if (op->kind != EXS_OP_SEND || (conn->dp->bytes && !op->len) || !rt_peer_traces(conn) ||
        !(rt = rt_get(conn)))
        return;
    if (!exs__reqtrace_sampled(rt->nsend++,
                               __atomic_load_n(&exs__params.trace_sample_mask, __ATOMIC_RELAXED)))
        return;
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS; i++) {
        struct exs_reqtrace_tx *s = &rt->tx[i];

        if (s->used)
            continue;
        memset(s, 0, sizeof(*s));
        s->used = 1;
        s->owner = rt;
        s->bytes = op->len;
        s->t_post = exs__now_ns();
        op->rt = s;
        return;
    }
    /* EXS_REQTRACE_SLOTS sampled messages wait for their answers: this one is not traced */
    EXS_DBG(PROTO, "conn %p: request tracing: %u traces outstanding, send not traced", (void *)conn,
            EXS_REQTRACE_SLOTS);
}

int exs__reqtrace_wire_begin_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_reqtrace_tx *s = op->rt;

    /* "wire": taken before anything of the message is posted (each attempt; the last one
     * posts), so the peer cannot see it earlier, however the poster is preempted */
    s->t_wire = exs__now_ns();
    if (s->req_sent)
        return 1;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_TRACE_LEN) && !exs__conn_ctrl_flush_locked(conn))
        return 0;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_TRACE_LEN))
        return 0;
    /* the request goes before the message (STREAM: before the send's first byte): the
     * receiver sees it with rx_seq == seq (STREAM: with everything before the send
     * arrived). A request already sent for this number (STREAM: for a send ending past
     * here, whose bytes never all went) belonged to a send cancelled before it went out:
     * the receiver replaces it with this one, and so does the sender. */
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS; i++) {
        struct exs_reqtrace_tx *o = &conn->rt->tx[i];
        int stale = conn->dp->bytes ? o->seq > conn->tx_seq : o->seq == conn->tx_seq;

        if (o != s && o->used && o->req_sent && !o->answered && stale) {
            EXS_ASSERT(o->done); /* its op finished while queued */
            memset(o, 0, sizeof(*o));
        }
    }
    /* STREAM: seq names the offset just past the send's last byte */
    s->seq = conn->tx_seq + (conn->dp->bytes ? s->bytes : 0);
    s->t_req = exs__now_ns();
    struct exs_wire_trace w = {
        .hdr = {.type = EXS_CTRL_TRACE, .len = htobe16(EXS_WIRE_TRACE_LEN)},
        .seq = htobe64(s->seq),
        .t_req = htobe64(rt_wire_time(conn->rt, s->t_req)),
    };
    exs__conn_ctrl_append_locked(conn, &w, sizeof(w));
    s->req_sent = 1;
    return 1;
}

/* Minimum-delay filter: the exchange of least round trip bounds the offset best. */
static void rt_offset(struct exs_reqtrace *rt, const struct exs_reqtrace_tx *s, int64_t *off_p,
                      uint64_t *err_p)
{
    /* receiver - sender, from each leg; the true offset lies between them. Unsigned
     * arithmetic: the peer's times are whatever it sent. */
    int64_t up = (int64_t)(s->r_req - s->t_req);            /* T2 - T1 >= offset */
    int64_t down = (int64_t)(s->r_answer - s->t_answer_rx); /* T3 - T4 <= offset */
    uint64_t spread;
    unsigned best = 0;

    if (down > up) /* clocks that disagree with causality: no bound at all */
        down = up;
    spread = (uint64_t)up - (uint64_t)down;
    rt->off_ns[rt->off_next] = (int64_t)((uint64_t)down + spread / 2);
    rt->err_ns[rt->off_next] = spread - spread / 2;
    rt->off_next = (rt->off_next + 1) % EXS_REQTRACE_OFFSET_WINDOW;
    if (rt->off_count < EXS_REQTRACE_OFFSET_WINDOW)
        rt->off_count++;
    for (unsigned i = 1; i < rt->off_count; i++)
        if (rt->err_ns[i] < rt->err_ns[best])
            best = i;
    *off_p = rt->off_ns[best];
    *err_p = rt->err_ns[best];
}

size_t exs__reqtrace_format(const struct exs_reqtrace_record *r, char *buf, size_t size)
{
    int n =
        snprintf(buf, size,
                 "{\"conn\":\"%p\",\"seq\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"post_ns\":%" PRIu64
                 ",\"wire_ns\":%" PRIu64 ",\"done_ns\":%" PRIu64 ",\"arrival_ns\":%" PRId64
                 ",\"delivery_ns\":%" PRId64 ",\"answer_ns\":%" PRIu64 ",\"offset_ns\":%" PRId64
                 ",\"offset_err_ns\":%" PRIu64 "}",
                 r->conn, r->seq, r->bytes, r->post_ns, r->wire_ns, r->done_ns, r->arrival_ns,
                 r->delivery_ns, r->answer_ns, r->offset_ns, r->offset_err_ns);

    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

static void rt_emit(struct exs_reqtrace *rt, struct exs_reqtrace_tx *s)
{
    struct exs_reqtrace_record r = {
        .conn = rt->conn,
        .seq = s->seq,
        .bytes = s->bytes,
        .post_ns = s->t_post,
        .wire_ns = s->t_wire,
        .done_ns = s->t_done,
        .answer_ns = s->t_answer_rx,
    };
    exs_reqtrace_sink_fn *sink = __atomic_load_n(&rt_sink, __ATOMIC_ACQUIRE);
    char line[512];
    size_t len;

    rt_offset(rt, s, &r.offset_ns, &r.offset_err_ns);
    r.arrival_ns = (int64_t)(s->r_arrival - (uint64_t)r.offset_ns);
    r.delivery_ns = (int64_t)(s->r_delivery - (uint64_t)r.offset_ns);
    len = exs__reqtrace_format(&r, line, sizeof(line));
    if (!len)
        return;
    __atomic_add_fetch(&rt_count, 1, __ATOMIC_RELAXED);
    if (sink)
        sink(line, len);
    if (exs__params.trace_file[0]) {
        pthread_mutex_lock(&rt_file_lock);
        if (!rt_file && !rt_file_tried) {
            rt_file_tried = 1;
            rt_file = fopen(exs__params.trace_file, "ae");
            if (!rt_file)
                EXS_WARN(PROTO, "request tracing: cannot open %s: %m", exs__params.trace_file);
        }
        if (rt_file) {
            line[len] = '\n';
            fwrite(line, 1, len + 1, rt_file);
            fflush(rt_file);
        }
        pthread_mutex_unlock(&rt_file_lock);
    }
}

/* Done with a slot: a successful send answered with times is a record. */
static void rt_tx_finish(struct exs_reqtrace_tx *s)
{
    if (s->done == 1 && s->answered == 1)
        rt_emit(s->owner, s);
    memset(s, 0, sizeof(*s));
}

void exs__reqtrace_done_locked(struct exs_op *op)
{
    struct exs_reqtrace_tx *s = op->rt;

    op->rt = NULL;
    s->t_done = exs__now_ns();
    s->done = op->err ? 2 : 1; /* 2: failed or cancelled, no record */
    /* never requested: the peer will not answer; answered: complete */
    if (!s->req_sent || s->answered)
        rt_tx_finish(s);
}

/* ---- receiver ---- */

void exs__reqtrace_flush_locked(struct exs_conn *conn)
{
    struct exs_reqtrace *rt = conn->rt;

    if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
        return;
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS && rt->rx_ready; i++) {
        struct exs_reqtrace_rx *e = &rt->rx[i];

        if (!e->used || !e->ready)
            continue;
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_TRACE_LEN) &&
            !exs__conn_ctrl_flush_locked(conn))
            return;
        if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_TRACE_LEN))
            return;
        struct exs_wire_trace w = {
            .hdr = {.type = EXS_CTRL_TRACE,
                    .flags = EXS_TRACE_ANSWER | (e->dropped ? EXS_TRACE_DROPPED : 0),
                    .len = htobe16(EXS_WIRE_TRACE_LEN)},
            .seq = htobe64(e->seq),
        };
        if (!e->dropped) {
            w.t_req = htobe64(rt_wire_time(rt, e->t_req));
            w.t_arrival = htobe64(rt_wire_time(rt, e->t_arrival));
            w.t_delivery = htobe64(rt_wire_time(rt, e->t_delivery));
            w.t_answer = htobe64(rt_wire_time(rt, exs__now_ns()));
        }
        exs__conn_ctrl_append_locked(conn, &w, sizeof(w));
        memset(e, 0, sizeof(*e));
        rt->rx_ready--;
    }
    exs__conn_ctrl_flush_locked(conn);
}

/* STREAM: a traced send has arrived once the arrived position reaches its end offset,
 * and is delivered once the placed position (S_r) does: its last byte is in a receive. */
static void rt_st_progress(struct exs_conn *conn)
{
    struct exs_reqtrace *rt = conn->rt;
    uint64_t arrived = rt_st_arrived(conn), now = 0;

    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS && rt->rx_wait; i++) {
        struct exs_reqtrace_rx *e = &rt->rx[i];

        if (!e->used || e->ready || e->seq > arrived)
            continue;
        if (!now)
            now = exs__now_ns();
        if (!e->t_arrival)
            e->t_arrival = now;
        if (e->seq <= conn->rx_seq) {
            e->t_delivery = now;
            e->ready = 1;
            rt->rx_wait--;
            rt->rx_ready++;
        }
    }
    if (rt->rx_ready)
        exs__reqtrace_flush_locked(conn);
}

void exs__reqtrace_stream_placed_locked(struct exs_conn *conn)
{
    if (conn->rt->rx_wait)
        rt_st_progress(conn);
}

void exs__reqtrace_arrival_locked(struct exs_conn *conn)
{
    struct exs_reqtrace *rt = conn->rt;
    uint64_t now = 0;

    if (conn->dp->bytes) {
        rt_st_progress(conn);
        return;
    }
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS && rt->rx_wait; i++) {
        struct exs_reqtrace_rx *e = &rt->rx[i];

        if (e->used && !e->t_arrival && e->seq < conn->rx_seq) {
            if (!now)
                now = exs__now_ns();
            e->t_arrival = now;
        }
    }
    if (rt->rx_ready)
        exs__reqtrace_flush_locked(conn);
}

void exs__reqtrace_deliver_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_reqtrace *rt = conn->rt;

    if (op->kind != EXS_OP_RECV || !rt->rx_wait || conn->dp->bytes)
        return; /* STREAM: delivered when placed (rt_st_progress) */
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS; i++) {
        struct exs_reqtrace_rx *e = &rt->rx[i];

        if (!e->used || e->ready || !e->t_arrival || e->seq != op->seq)
            continue;
        e->t_delivery = exs__now_ns();
        e->dropped = op->err != 0;
        e->ready = 1;
        rt->rx_wait--;
        rt->rx_ready++;
        exs__reqtrace_flush_locked(conn);
        return;
    }
}

/* ---- the record (§5.1) ---- */

static int rt_on_request(struct exs_conn *conn, const struct exs_wire_trace *w, uint64_t seq)
{
    struct exs_reqtrace *rt;
    struct exs_reqtrace_rx *free_e = NULL;

    /* the request travels just before its message: nothing of seq has arrived yet */
    if (w->hdr.flags)
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_TRACE, "request with flags %#x",
                                    w->hdr.flags);
    if (w->t_arrival || w->t_delivery || w->t_answer ||
        (conn->dp->bytes ? seq <= rt_st_arrived(conn) : seq != conn->rx_seq))
        return exs__proto_violation(
            conn, EXS_PV_TRACE, EXS_CTRL_TRACE, "request for %llu%s while %llu is next",
            (unsigned long long)seq,
            w->t_arrival || w->t_delivery || w->t_answer ? " with times" : "",
            (unsigned long long)(conn->dp->bytes ? rt_st_arrived(conn) : conn->rx_seq));
    rt = rt_get(conn);
    if (!rt)
        return -ENOMEM;
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS; i++) {
        /* STREAM: the request comes after every byte of the sends before its own, so an
         * entry whose last byte has not arrived was the request of a cancelled send */
        if (rt->rx[i].used && (conn->dp->bytes ? !rt->rx[i].t_arrival : rt->rx[i].seq == seq)) {
            /* the send of the earlier request was cancelled before it went out: this
             * request, for the message that took its number, replaces it */
            free_e = &rt->rx[i];
            rt->rx_wait--;
            break;
        }
        if (!rt->rx[i].used && !free_e)
            free_e = &rt->rx[i];
    }
    if (!free_e)
        return exs__proto_violation(conn, EXS_PV_TRACE, EXS_CTRL_TRACE,
                                    "request for %llu beyond %u outstanding",
                                    (unsigned long long)seq, EXS_REQTRACE_SLOTS);
    memset(free_e, 0, sizeof(*free_e));
    free_e->used = 1;
    free_e->seq = seq;
    free_e->t_req = exs__now_ns();
    rt->rx_wait++;
    return 0;
}

static int rt_on_answer(struct exs_conn *conn, const struct exs_wire_trace *w, uint64_t seq)
{
    struct exs_reqtrace *rt = conn->rt;
    uint64_t t2 = be64toh(w->t_req), ta = be64toh(w->t_arrival);
    uint64_t td = be64toh(w->t_delivery), t3 = be64toh(w->t_answer);
    int dropped = w->hdr.flags & EXS_TRACE_DROPPED;

    if (w->hdr.flags & ~(EXS_TRACE_ANSWER | EXS_TRACE_DROPPED))
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_TRACE, "answer with flags %#x",
                                    w->hdr.flags);
    if (dropped ? (t2 | ta | td | t3) != 0 : !(t2 && t2 <= ta && ta <= td && td <= t3))
        return exs__proto_violation(conn, EXS_PV_TRACE, EXS_CTRL_TRACE,
                                    "answer for %llu with times out of order%s",
                                    (unsigned long long)seq, dropped ? " (dropped)" : "");
    for (unsigned i = 0; rt && i < EXS_REQTRACE_SLOTS; i++) {
        struct exs_reqtrace_tx *s = &rt->tx[i];

        if (!s->used || !s->req_sent || s->answered || s->seq != seq)
            continue;
        s->t_answer_rx = exs__now_ns();
        s->r_req = t2;
        s->r_arrival = ta;
        s->r_delivery = td;
        s->r_answer = t3;
        s->answered = dropped ? 2 : 1;
        if (s->done)
            rt_tx_finish(s);
        return 0;
    }
    return exs__proto_violation(conn, EXS_PV_TRACE, EXS_CTRL_TRACE,
                                "answer for %llu, which was not traced", (unsigned long long)seq);
}

int exs__reqtrace_on_record_locked(struct exs_conn *conn, const struct exs_wire_trace *w)
{
    uint64_t seq = be64toh(w->seq);

    /* sent only to a peer that announced the feature (on STREAM: and STRACE, §5.1) */
    if (!rt_peer_traces(conn))
        return exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_TRACE,
                                    "without feature TRACE (STREAM: STRACE)");
    return w->hdr.flags & EXS_TRACE_ANSWER ? rt_on_answer(conn, w, seq)
                                           : rt_on_request(conn, w, seq);
}
