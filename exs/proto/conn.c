/* SPDX-License-Identifier: MIT */
/* Connection core: states, failing and ending, delivering, the work-request cap, control
 * record output, credits, hello, ring grant and paths. Layer 1 of spec/proto-layout.md. */
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

static int conn_live;

int exs__conn_live_count(void)
{
    return __atomic_load_n(&conn_live, __ATOMIC_RELAXED);
}

void exs__conn_live_add(int n)
{
    __atomic_fetch_add(&conn_live, n, __ATOMIC_RELAXED);
}

/* The process counters of the protocol (set "proto", exsctl counters), over every conn. */
struct exs_proto_counters exs__proto_cnt;

static const struct exs_counter_desc proto_counter_desc[] = {
    EXS_COUNTER(struct exs_proto_counters, rnr_events,
                "receiver-not-ready completions (the credits make them impossible: must stay 0)"),
    EXS_COUNTER(struct exs_proto_counters, nops_sent,
                "NOP records sent to return credits to a peer whose window was full"),
    EXS_COUNTER(struct exs_proto_counters, writes_inline,
                "data writes small enough to go inline in the work request (no DMA read)"),
    EXS_COUNTER(struct exs_proto_counters, posts_fast,
                "sends put on the wire straight from the post, without a progress pass"),
    EXS_COUNTER(struct exs_proto_counters, sends_unsignaled,
                "small inline data writes posted unsignaled, their send done at post"),
    EXS_COUNTER(struct exs_proto_counters, unsignaled_failed,
                "error or flush completions of unsignaled data writes"),
};

static struct exs_counter_set proto_cset = {
    .name = "proto",
    .desc = proto_counter_desc,
    .count = sizeof(proto_counter_desc) / sizeof(proto_counter_desc[0]),
    .base = &exs__proto_cnt,
};

void exs__conn_cset_register(void)
{
    exs__counters_register(&proto_cset);
}

/* The conn's shard of the set (conn->cnt), counted from its creation; at its free the
 * counts fold into exs__proto_cnt. */
void exs__conn_cnt_attach(struct exs_conn *conn)
{
    conn->cnt_set = (struct exs_counter_set){
        .name = proto_cset.name,
        .desc = proto_cset.desc,
        .count = proto_cset.count,
        .base = &conn->cnt,
    };
    exs__counters_part_add(&proto_cset, &conn->cnt_set);
}

uint64_t exs__proto_counter(const char *name)
{
    uint64_t v = 0;

    (void)exs__counters_lookup(proto_cset.name, name, &v);
    return v;
}

const char *exs__conn_state_name(enum exs_conn_state st)
{
    return exs__conn_rows[st].name;
}

/* The one place a conn changes state (conn->lock held). */
void exs__conn_set_state_locked(struct exs_conn *conn, enum exs_conn_state st, const char *why)
{
    const struct exs_conn_row *row = &exs__conn_rows[conn->state];

    EXS_ASSERT(row->next & CONN_BIT(st));
    EXS_TRACE(PROTO, "conn %p: %s -> %s (%s)", (void *)conn, row->name, exs__conn_rows[st].name,
              why);
    if (conn->state == EXS_CONN_CONNECTING && st == EXS_CONN_DOWN)
        conn->hs_down = 1; /* the handshake deadline bounds the drain (exs__conn_timer) */
    if (st >= EXS_CONN_DOWN)
        conn->seqpkt.rd_op = NULL; /* no more READ pieces (§6.2): its receive ends with the conn */
    if (row->leave && st != conn->state)
        row->leave(conn); /* RESUMING: no longer counts against resume_max (§9.2) */
    conn->state = st;
}

static const char *const conn_txshut_names[EXS_TXSHUT_COUNT] = {
    [EXS_TXSHUT_OPEN] = "OPEN",         [EXS_TXSHUT_QUEUED] = "QUEUED",
    [EXS_TXSHUT_APPENDED] = "APPENDED", [EXS_TXSHUT_POSTED] = "POSTED",
    [EXS_TXSHUT_DONE] = "DONE",
};

static const uint32_t conn_txshut_next[EXS_TXSHUT_COUNT] = {
    [EXS_TXSHUT_OPEN] =
        CONN_BIT(EXS_TXSHUT_QUEUED) | CONN_BIT(EXS_TXSHUT_APPENDED) | CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_QUEUED] = CONN_BIT(EXS_TXSHUT_APPENDED) | CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_APPENDED] = CONN_BIT(EXS_TXSHUT_POSTED),
    [EXS_TXSHUT_POSTED] = CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_DONE] = 0,
};

/* The one place the send direction's SHUTDOWN sub-state changes (conn->lock held). */
void exs__conn_set_txshut_locked(struct exs_conn *conn, enum exs_conn_txshut st, const char *why)
{
    EXS_ASSERT(conn_txshut_next[conn->txshut] & CONN_BIT(st));
    EXS_TRACE(PROTO, "conn %p: shutdown %s -> %s (%s)", (void *)conn,
              conn_txshut_names[conn->txshut], conn_txshut_names[st], why);
    conn->txshut = st;
}

int exs__conn_is_dead(struct exs_conn *conn)
{
    int dead;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    dead = conn->state == EXS_CONN_DEAD || conn->state == EXS_CONN_IDLE;
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return dead;
}

/* ---- resources ---- */

/* Receive slot slot of the control slots ctrl (their receive part first) posted on ep. */
static int conn_post_rx_on(struct exs_prov_ep *ep, struct exs_prov_mr *ctrl, uint32_t slot)
{
    struct exs_prov_sge sge = {
        .addr = (uintptr_t)ctrl->addr + (size_t)slot * EXS_WIRE_CTRL_MAX,
        .length = EXS_WIRE_CTRL_MAX,
        .lkey = ctrl->lkey,
    };
    struct exs_prov_recv_wr wr = {
        .wr_id = WR_ID(WR_TAG_RX, (uint64_t)slot << 3), .sg_list = &sge, .num_sge = 1};

    return exs__prov_post_recv(ep, &wr);
}

int exs__conn_post_rx_locked(struct exs_conn *conn, uint32_t slot)
{
    int ret = conn_post_rx_on(conn->ep, conn->rx_mr, slot);

    if (!ret)
        conn->wr_out++;
    return ret;
}

/* End every grant of the conn (the ring's and its operations'), at once and without
 * waiting for the peer: late bytes are discarded by the provider. */
void exs__conn_revoke_all_locked(struct exs_conn *conn)
{
    struct exs_list *q[2] = {&conn->sendq, &conn->recvq};
    struct exs_list *pos;

    for (int i = 0; i < 2; i++)
        exs_list_for_each(pos, q[i])
            exs__conn_revoke_op_locked(exs_list_entry(pos, struct exs_op, link));
    if (conn->ring_grant)
        exs__prov_revoke(conn->ring_grant);
    conn->ring_grant = NULL;
    if (conn->autotune.next_grant) /* an offered region (§7.4) */
        exs__prov_revoke(conn->autotune.next_grant);
    conn->autotune.next_grant = NULL;
}

/* Give back the endpoint after revoking every grant: the peer can no longer reach any
 * memory. The ring stays (with its local registration) so eager messages already in it
 * can still be received after the end. */
static void conn_release_prov_locked(struct exs_conn *conn)
{
    exs__conn_hooks.trial_end(conn, 0); /* a resume request on trial goes too (§9.2) */
    exs__conn_revoke_all_locked(conn);
    if (conn->ep)
        exs__prov_ep_destroy(conn->ep);
    conn->ep = NULL;
}

/* Give the peer op's one right over its buffer (REMOTE_WRITE for an ADVERT, REMOTE_READ
 * for an ANNOUNCE); op->rkey is then the key to send. Revoked when op completes. A
 * zero-length buffer needs no grant (key 0). Errors: those of exs__prov_grant. */
int exs__conn_grant_op_locked(struct exs_conn *conn, struct exs_op *op, unsigned access)
{
    int ret;

    EXS_ASSERT(!op->grant);
    op->rkey = 0;
    if (!op->len)
        return 0;
    ret = exs__prov_grant(conn->ep, op->mr, op->buf, op->len, access, &op->grant);
    if (ret == -ENOTCONN) { /* the endpoint went down under us: the conn is going away */
        EXS_INFO(PROTO, "conn %p: grant of %zu bytes: endpoint not connected", (void *)conn,
                 op->len);
        return ret;
    }
    if (ret) {
        EXS_WARN(PROTO, "conn %p: grant of %zu bytes failed: %s", (void *)conn, op->len,
                 strerror(-ret));
        return ret;
    }
    op->rkey = op->grant->rkey;
    return 0;
}

void exs__conn_revoke_op_locked(struct exs_op *op)
{
    if (op->grant)
        exs__prov_revoke(op->grant);
    op->grant = NULL;
    op->rkey = 0;
}

static void conn_wrq_free_locked(struct exs_conn *conn);

void exs__conn_release_locked(struct exs_conn *conn)
{
    conn_wrq_free_locked(conn);
    exs__conn_hooks.trial_end(conn, 1);

    conn_release_prov_locked(conn);
    conn->dp->release(conn);
    if (conn->ring_mem)
        exs__conn_ring_region_free(conn->ring_mem);
    if (conn->ctrl_mem)
        exs__conn_mem_free(conn->ctrl_mem);
    conn->ring_mem = conn->ctrl_mem = conn->rx_mr = conn->tx_mr = NULL;
    free(conn->tx_free);
    free(conn->tx_op);
    free(conn->adverts);
    free(conn->rd_owed);
    if (conn->mem_arrays)
        exs__conn_mem_give_locked(conn, conn->mem_arrays);
    conn->mem_arrays = 0;
    conn->rd_owed = NULL;
    conn->ring = conn->rx_bufs = conn->tx_bufs = NULL;
    conn->tx_free = NULL;
    conn->tx_op = NULL;
    conn->adverts = NULL;
    exs__conn_hooks.trace_free(conn);
}

/* The malloc'd arrays of a connection as created (the ADVERT queue at its first size),
 * and an estimate of what it makes others hold: the provider endpoint's work requests and
 * completion queue entries, its state and the socket (a page each). */
uint64_t exs__conn_arrays_bytes(const struct exs_conn *conn)
{
    uint64_t wrs = 2ull * conn->p.credits + conn->p.max_reads + conn->tx_slots + 8;

    return wrs * (sizeof(struct exs_prov_cqe) + 64) + 2 * 4096 +
           exs__mem_chunk(conn->tx_slots * sizeof(*conn->tx_free)) +
           exs__mem_chunk(conn->tx_slots * sizeof(*conn->tx_op)) +
           exs__mem_chunk(conn->adv_cap * sizeof(*conn->adverts)) +
           exs__mem_chunk((conn->p.max_reads ? conn->p.max_reads : 1) * sizeof(*conn->rd_owed));
}

/* The struct itself, once everything it held went back: its account is empty. */
void exs__conn_struct_free(struct exs_conn *conn)
{
    EXS_ASSERT(!conn->mem_held);
    free(conn);
    exs__mem_give(exs__mem_chunk(sizeof(*conn)));
}

void exs__conn_free(struct exs_conn *conn)
{
    exs__counters_part_del(&conn->cnt_set, &exs__proto_cnt);
    exs__conn_release_locked(conn);
    exs__conn_struct_free(conn);
    __atomic_fetch_sub(&conn_live, 1, __ATOMIC_RELAXED);
}

/* ---- handshake (§2) ---- */

static uint8_t wire_sock_type(int type)
{
    return type == SOCK_STREAM ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET;
}

void exs__conn_hello(struct exs_conn *conn, struct exs_wire_hello *h)
{
    memset(h, 0, sizeof(*h));
    h->magic = htobe16(EXS_WIRE_MAGIC);
    h->version = EXS_WIRE_VERSION;
    h->sock_type = wire_sock_type(conn->p.sock_type);
    h->features = htobe16((EXS_WIRE_FEAT_ALL & ~EXS_REQTRACE_FEAT_OFF) |
                          (conn->p.resumable ? EXS_WIRE_FEAT_RESUMABLE : 0) |
                          (conn->p.shm && conn->p.resumable ? EXS_WIRE_FEAT_SHM : 0));
    h->credits = htobe16((uint16_t)conn->p.credits);
    h->ctrl_size = htobe32(EXS_WIRE_CTRL_MAX);
    h->ring_size = htobe32(conn->p.ring_size);
    h->ring_addr = htobe64((uintptr_t)conn->ring);
    h->ring_rkey = 0; /* reserved (v2): the key comes in the RING record */
    h->eager_max = htobe32(conn->p.eager_max);
    h->max_msg = 0;
    h->xfer_mode = (uint8_t)conn->p.xfer_mode;
}

int exs__conn_hello_check(const void *pd, uint32_t len, int sock_type)
{
    struct exs_wire_hello h;
    uint32_t credits, ctrl_size, ring_size, eager_max, max_msg;
    uint64_t ring_addr;
    const char *bad = NULL;

    if (!pd || len < EXS_WIRE_HELLO_LEN)
        return EXS_WIRE_REJ_VERSION;
    memcpy(&h, pd, sizeof(h));
    if (be16toh(h.magic) != EXS_WIRE_MAGIC || h.version != EXS_WIRE_VERSION)
        return EXS_WIRE_REJ_VERSION;
    if (h.sock_type != wire_sock_type(sock_type))
        return EXS_WIRE_REJ_SOCK_TYPE;
    credits = be16toh(h.credits);
    ctrl_size = be32toh(h.ctrl_size);
    ring_size = be32toh(h.ring_size);
    ring_addr = be64toh(h.ring_addr);
    eager_max = be32toh(h.eager_max);
    max_msg = be32toh(h.max_msg);
    /* every field the protocol relies on, before anything depends on it (§2) */
    if (credits < 3 || credits > EXS_IMM_CREDITS_MAX)
        bad = "credits";
    else if (ctrl_size < EXS_WIRE_CTRL_MAX || ctrl_size > EXS_WIRE_CTRL_SIZE_MAX)
        bad = "ctrl_size";
    else if (ring_size % EXS_RING_SLOT || ring_size > EXS_WIRE_RING_SIZE_MAX)
        bad = "ring_size";
    else if (!ring_size && (sock_type == SOCK_STREAM || eager_max))
        bad = "ring_size 0";
    else if (ring_size &&
             (!ring_addr || ring_addr % EXS_RING_SLOT || ring_addr + ring_size < ring_addr))
        bad = "ring_addr";
    else if (eager_max > ring_size)
        bad = "eager_max";
    else if (max_msg && max_msg < eager_max)
        bad = "max_msg";
    else if ((h.hflags & EXS_WIRE_HELLO_F_RESUME) &&
             !(be16toh(h.features) & EXS_WIRE_FEAT_RESUMABLE))
        bad = "resume flag without feature bit 7";
    if (bad) {
        EXS_INFO(PROTO,
                 "peer hello refused: bad %s (credits %u ctrl_size %u ring_size %u "
                 "ring_addr %#llx eager_max %u max_msg %u)",
                 bad, credits, ctrl_size, ring_size, (unsigned long long)ring_addr, eager_max,
                 max_msg);
        return EXS_WIRE_REJ_HELLO;
    }
    return 0;
}

/* Adopt a checked peer hello: host-order copy, initial credits. */
void exs__conn_adopt_hello_locked(struct exs_conn *conn, const void *pd)
{
    struct exs_wire_hello h;

    memcpy(&h, pd, sizeof(h));
    conn->peer.magic = be16toh(h.magic);
    conn->peer.version = h.version;
    conn->peer.sock_type = h.sock_type;
    conn->peer.features = be16toh(h.features) & ((EXS_WIRE_FEAT_ALL & ~EXS_REQTRACE_FEAT_OFF) |
                                                 EXS_WIRE_FEAT_RESUMABLE | EXS_WIRE_FEAT_SHM);
    conn->peer.credits = be16toh(h.credits);
    conn->peer.ctrl_size = be32toh(h.ctrl_size);
    conn->peer.ring_size = be32toh(h.ring_size);
    conn->peer.ring_addr = be64toh(h.ring_addr);
    /* peer.ring_rkey: from its RING record (v2), which may have been processed already */
    conn->peer.eager_max = be32toh(h.eager_max);
    conn->peer.max_msg = be32toh(h.max_msg);
    conn->peer.xfer_mode = h.xfer_mode;
    conn->credits = conn->peer.credits;
}

/* ---- credits and control records (§3, §5) ---- */

/* Just connected: grant the peer write access to our ring for the connection's life and
 * send the key in a RING record, the first record of our first SEND (§2). */
void exs__conn_ring_grant_locked(struct exs_conn *conn)
{
    struct exs_wire_ring r = {
        .hdr = {.type = EXS_CTRL_RING, .len = htobe16(EXS_WIRE_RING_LEN)},
    };
    int ret;

    /* first, but for the active side's AUTH on a cut-over's new path (§9.2) */
    EXS_ASSERT(!conn->ring_grant && (!conn->ctrl_len || (conn->active && conn->resume.newpath &&
                                                         conn->ctrl_len == EXS_WIRE_AUTH_LEN)));
    ret = exs__prov_grant(conn->ep, conn->ring_mem, conn->ring, conn->p.ring_size,
                          EXS_PROV_ACCESS_REMOTE_WRITE, &conn->ring_grant);
    if (ret) {
        if (ret == -ENOTCONN)
            EXS_INFO(PROTO, "conn %p: ring grant: endpoint not connected", (void *)conn);
        else
            EXS_WARN(PROTO, "conn %p: ring grant failed: %s", (void *)conn, strerror(-ret));
        exs__conn_fail_locked(conn, -ret == ENOMEM ? ENOMEM : ECONNRESET, "ring grant failed");
        return;
    }
    r.rkey = htobe32(conn->ring_grant->rkey);
    exs__conn_ctrl_append_locked(conn, &r, sizeof(r));
}

/* ---- the work-request cap (§6.3) ---- */

struct conn_wrq_ent {
    struct exs_list link;
    struct exs_prov_send_wr wr;
    struct exs_prov_sge sge;
};

static uint32_t conn_wr_max(void)
{
    uint64_t m = __atomic_load_n(&exs__params.wr_max, __ATOMIC_RELAXED);

    return m ? (uint32_t)m : UINT32_MAX; /* 0: the tunables were never loaded (unit tests) */
}

/* A send work request went to the provider: a signaled one counts under the cap and
 * retires (when it completes) every unsignaled one before it; an unsignaled one holds a
 * slot until then (§6.4). */
static inline void conn_sq_posted(struct exs_conn *conn, unsigned flags)
{
    if (flags & EXS_PROV_SEND_SIGNALED) {
        conn->sq_out++;
        conn->quiet_run = 0;
    } else {
        conn->quiet_run++;
        conn->quiet_live++;
    }
}

int exs__conn_post_send_locked(struct exs_conn *conn, const struct exs_prov_send_wr *wr)
{
    struct conn_wrq_ent *e;
    int ret;

    EXS_ASSERT(wr->num_sge <= 1);
    if (!conn->wrq_count && conn->sq_out < conn_wr_max()) {
        ret = exs__prov_post_send(conn->ep, wr);
        if (!ret)
            conn_sq_posted(conn, wr->flags);
        return ret;
    }
    /* behind the cap, or behind others waiting: keep the order */
    e = malloc(sizeof(*e));
    if (!e) {
        EXS_WARN(PROTO, "conn %p: no memory to queue a work request", (void *)conn);
        return -ENOMEM;
    }
    e->wr = *wr;
    if (wr->num_sge)
        e->sge = wr->sg_list[0];
    e->wr.sg_list = &e->sge;
    exs_list_add_tail(&conn->wrq, &e->link);
    conn->wrq_count++;
    conn->stats.wr_queued++;
    return 0;
}

/* Completions made room: post queued work requests, oldest first, up to the cap. */
void exs__conn_wrq_post_locked(struct exs_conn *conn)
{
    uint32_t max = conn_wr_max();

    while (conn->wrq_count && conn->sq_out < max &&
           (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING)) {
        struct conn_wrq_ent *e = exs_list_entry(conn->wrq.next, struct conn_wrq_ent, link);
        int ret = exs__prov_post_send(conn->ep, &e->wr);

        if (ret) {
            /* it stays queued: it is flushed with the others as the conn ends */
            EXS_WARN(PROTO, "conn %p: queued work request: post failed: %s", (void *)conn,
                     strerror(-ret));
            exs__conn_fail_locked(conn, ECONNRESET, "queued work request failed");
            return;
        }
        exs_list_del(&e->link);
        conn->wrq_count--;
        conn_sq_posted(conn, e->wr.flags);
        free(e);
    }
}

int exs__conn_wrq_pop_locked(struct exs_conn *conn, struct exs_prov_cqe *cqe)
{
    struct exs_list *n = exs_list_pop_head(&conn->wrq);
    struct conn_wrq_ent *e;

    if (!n)
        return 0;
    e = exs_list_entry(n, struct conn_wrq_ent, link);
    *cqe = (struct exs_prov_cqe){
        .wr_id = e->wr.wr_id,
        .status = EXS_PROV_WC_WR_FLUSH_ERR,
        .ep = conn->ep,
    };
    conn->wrq_count--;
    free(e);
    return 1;
}

/* The provider objects are gone (DEAD): queued work requests are dropped with them. */
static void conn_wrq_free_locked(struct exs_conn *conn)
{
    struct exs_list *n;

    while ((n = exs_list_pop_head(&conn->wrq)))
        free(exs_list_entry(n, struct conn_wrq_ent, link));
    conn->wrq_count = 0;
}

/* Owed credits that make the receiver send a standalone ACK (§3.1): EXS_ACK_EVERY, by
 * default half the credits; at least 2 (an ACK answering an ACK would never end) and at
 * most n - 1, so a sender whose window is full always gets its credits back. */
static uint32_t conn_ack_threshold(const struct exs_conn *conn)
{
    uint64_t t = __atomic_load_n(&exs__params.ack_every, __ATOMIC_RELAXED);

    if (!t)
        t = conn->p.credits / 2;
    return (uint32_t)EXS_MIN(EXS_MAX(t, 2u), (uint64_t)conn->p.credits - 1);
}

int exs__conn_ctrl_room_locked(struct exs_conn *conn, uint32_t len)
{
    /* keep room for the ACK record the flush may add */
    return conn->ctrl_len + len + EXS_WIRE_ACK_LEN <= EXS_WIRE_CTRL_MAX;
}

void exs__conn_ctrl_append_locked(struct exs_conn *conn, const void *rec, uint32_t len)
{
    EXS_ASSERT(exs__conn_ctrl_room_locked(conn, len));
    memcpy(conn->ctrl_out + conn->ctrl_len, rec, len);
    conn->ctrl_len += len;
}

/* ACK (§3, §7): when half the credits are owed, or ring space is unreported and either
 * a quarter of the ring or the writer may think more than half of it is in use. */
static int conn_needs_ack_locked(struct exs_conn *conn)
{
    uint64_t unreported = conn->rd_consumed - conn->rd_reported;

    if (conn->owed >= conn_ack_threshold(conn) &&
        !(exs__conn_window_test() & EXS_WINDOW_TEST_NO_ACK))
        return 1;
    return unreported >= conn->p.ring_size / 4 ||
           (unreported && conn->rd_arrived - conn->rd_reported > conn->p.ring_size / 2);
}

/* exs__conn_ctrl_flush_locked (conn.h) when its quick test could not tell that nothing is
 * due: the full ACK decision, then the SEND. */
int exs__conn_ctrl_flush_due_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr *first;
    uint32_t slot;
    uint8_t *dst;
    int ret;

    if (!conn->ctrl_len && !conn_needs_ack_locked(conn))
        return 1;
    if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
        return 0;
    if (conn->seqpkt.frag_op && conn->txshut == EXS_TXSHUT_APPENDED)
        return 0; /* the SHUTDOWN counts a message whose pieces must all go first (§6.2) */
    if (!conn->tx_free_top || !exs__conn_can_spend_ctrl_locked(conn)) {
        if (conn->ctrl_len)
            conn->stats.credit_stalls++;
        return 0;
    }
    if (conn->rd_consumed != conn->rd_reported || !conn->ctrl_len) {
        struct exs_wire_ack ack = {
            .hdr = {.type = EXS_CTRL_ACK, .len = htobe16(EXS_WIRE_ACK_LEN)},
            .ring_consumed = htobe64(conn->rd_consumed),
        };
        memcpy(conn->ctrl_out + conn->ctrl_len, &ack, sizeof(ack));
        conn->ctrl_len += EXS_WIRE_ACK_LEN;
        conn->rd_reported = conn->rd_consumed;
    }
    first = (struct exs_wire_ctrl_hdr *)(void *)conn->ctrl_out;
    uint32_t give = EXS_MIN(conn->owed, 0xffffu);
    first->credits = htobe16((uint16_t)give);

    slot = conn->tx_free[--conn->tx_free_top];
    dst = conn->tx_bufs + (size_t)slot * EXS_WIRE_CTRL_MAX;
    memcpy(dst, conn->ctrl_out, conn->ctrl_len);
    struct exs_prov_sge sge = {(uintptr_t)dst, conn->ctrl_len, conn->tx_mr->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = WR_ID(WR_TAG_CTRL, (uint64_t)slot << 3),
        .opcode = EXS_PROV_WR_SEND,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
    };
    if (conn->ctrl_len <= conn->ep->attr.max_inline)
        wr.flags |= EXS_PROV_SEND_INLINE;
    ret = exs__conn_post_send_locked(conn, &wr);
    if (!ret)
        conn->wr_out++;
    if (ret) {
        conn->tx_free[conn->tx_free_top++] = slot;
        exs__conn_fail_locked(conn, ECONNRESET, "control send failed");
        return 0;
    }
    EXS_TRACE(PROTO, "conn %p: control send %u bytes, %u credits returned, %u left", (void *)conn,
              conn->ctrl_len, give, conn->credits - 1);
    conn->tx_op[slot].op = conn->shut_op;
    conn->tx_op[slot].shut = conn->txshut == EXS_TXSHUT_APPENDED;
    conn->tx_op[slot].t_us = exs__now_us(); /* srtt_us (§7.4) */
    if (conn->txshut == EXS_TXSHUT_APPENDED)
        exs__conn_set_txshut_locked(conn, EXS_TXSHUT_POSTED, "control send posted");
    conn->shut_op = NULL;
    conn->owed -= give;
    conn->credits--;
    conn->ctrl_len = 0;
    return 1;
}

/* Store a received ADVERT at the tail of q_A, growing it up to a bound. */
int exs__advert_push_locked(struct exs_conn *conn, const struct exs_advert *a)
{
    if (conn->adv_count >= EXS_WIRE_ADVERTS_MAX)
        return exs__proto_violation(conn, EXS_PV_ADVERTS_MAX, EXS_CTRL_ADVERT,
                                    "%u usable ADVERTs held already", conn->adv_count);
    if (conn->adv_count == conn->adv_cap) {
        uint32_t cap = EXS_MIN(conn->adv_cap * 2, EXS_WIRE_ADVERTS_MAX);
        uint64_t more = exs__mem_chunk(cap * sizeof(*conn->adverts)) -
                        exs__mem_chunk(conn->adv_cap * sizeof(*conn->adverts));
        struct exs_advert *n;
        int ret = exs__conn_mem_take_locked(conn, more, EXS_MEM_OTHER);

        if (ret)
            return ret;
        n = calloc(cap, sizeof(*n));
        if (!n) {
            exs__conn_mem_give_locked(conn, more);
            return -ENOMEM;
        }
        conn->mem_arrays += more;
        for (uint32_t i = 0; i < conn->adv_count; i++)
            n[i] = conn->adverts[(conn->adv_head + i) % conn->adv_cap];
        free(conn->adverts);
        conn->adverts = n;
        conn->adv_cap = cap;
        conn->adv_head = 0;
    }
    conn->adverts[(conn->adv_head + conn->adv_count) % conn->adv_cap] = *a;
    conn->adv_count++;
    conn->stats.adverts_received++;
    return 0;
}

_Static_assert(EXS_RSM_COPIES == EXS_QUIET_MAX, "a copy per unsignaled write that may be unacked");
_Static_assert(EXS_RSM_COPY_SIZE >= CONN_CTRL_INLINE, "a copy holds the largest inline write");

/* The copies' ring of a conn that may be cut over (§9.2; resume.quiet), allocated and
 * charged at its first unsignaled send. 0, or -errno: the send goes signaled. */
static int conn_quiet_alloc_locked(struct exs_conn *conn)
{
    uint64_t n = exs__mem_chunk(sizeof(*conn->resume.quiet));
    int ret = exs__conn_mem_take_locked(conn, n, EXS_MEM_OTHER);

    if (ret)
        return ret;
    conn->resume.quiet = calloc(1, sizeof(*conn->resume.quiet));
    if (!conn->resume.quiet) {
        exs__conn_mem_give_locked(conn, n);
        return -ENOMEM;
    }
    return 0;
}

/* May the conn be cut over (§9.2), so that an unsignaled send's bytes are kept in a copy
 * until acknowledged? A conn cut over once is not again. */
static inline int conn_quiet_copies(const struct exs_conn *conn)
{
    return conn->p.resumable && !conn->resume.over;
}

/* The conn's part of conn_quiet_ok_locked (below), but the copy's place: an answer came
 * since the last unsignaled write, the write goes to the provider now, a slot is left. */
static inline __attribute__((always_inline)) int conn_quiet_conn_ok(const struct exs_conn *conn)
{
    return conn->quiet_armed && !conn->wrq_count && conn->quiet_live < EXS_QUIET_MAX &&
           conn->state == EXS_CONN_CONNECTED && conn->sq_out < conn_wr_max() &&
           __atomic_load_n(&exs__params.send_unsignaled, __ATOMIC_RELAXED);
}

/* The copy's place (the last condition of conn_quiet_ok_locked): 1 when it has one. */
static inline __attribute__((always_inline)) int conn_quiet_place_locked(struct exs_conn *conn)
{
    return !(EXS_UNLIKELY(conn_quiet_copies(conn)) && !conn->resume.quiet &&
             conn_quiet_alloc_locked(conn));
}

/* May op's write of len bytes, inline, go unsignaled, op done at post (§6.4)? It carries
 * the whole send of a SEQPACKET message or of a STREAM send buffer's copy (a zero-copy
 * STREAM send keeps its promise: done when its bytes reached the peer, spec/api.md §6b),
 * and no earlier send of the conn is unfinished (events keep their order);
 * it goes to the provider now (not queued behind the cap), within EXS_QUIET_MAX slots;
 * an answer came since the last one (a stream of sends with nothing coming back goes
 * signaled, so ring writes in flight gather the next ones, §6.1); on a conn that may be
 * cut over (§9.2), its copy has a place (resume.quiet, allocated at the first). */
static int conn_quiet_ok_locked(struct exs_conn *conn, const struct exs_op *op, uint32_t len)
{
    const struct exs_list *pos;

    /* (len == op->len: nothing of op was posted before, so none of its writes is in
     * flight; an eager or direct write's op holds no grant) */
    if (len != op->len || op->cancel || op->rt || (conn->dp->bytes && !op->internal) ||
        !conn_quiet_conn_ok(conn))
        return 0;
    for (pos = conn->sendq.next; pos != &op->link; pos = pos->next)
        if (exs_list_entry(pos, struct exs_op, link)->state != EXS_OPS_DONE)
            return 0;
    return conn_quiet_place_locked(conn);
}

/* The write of op's len bytes at src just went unsignaled on a conn that may be cut over:
 * its copy, at the send's position (tx_seq, not yet past it), in the place of the oldest
 * (acknowledged: at most EXS_QUIET_MAX - 1 others may not be) once all are taken (§9.2,
 * Replay). */
static void conn_quiet_keep_locked(struct exs_conn *conn, int flags, const void *src, uint32_t len)
{
    struct exs_rsm_quiet *q = conn->resume.quiet;
    struct exs_rsm_copy *c = &q->c[q->next];

    EXS_ASSERT(len <= EXS_RSM_COPY_SIZE);
    if (q->n == EXS_RSM_COPIES) {
        uint64_t end = c->pos + (conn->dp->bytes ? c->len : 1);

        q->floor = EXS_MAX(q->floor, end);
    } else {
        q->n++;
    }
    c->pos = conn->tx_seq;
    c->len = len;
    c->flags = flags;
    memcpy(c->data, src, len);
    q->next = (q->next + 1) % EXS_RSM_COPIES;
}

/* One WRITE WITH IMMEDIATE of len bytes from src (inside op's buffer). A write into the
 * peer's ring (INDIRECT) counts in ring_wr_out until it completes (batching, §6.1). An
 * unsignaled one (§6.4) counts in neither: conn->quiet_op says so to the caller. */
int exs__conn_post_write_imm_locked(struct exs_conn *conn, struct exs_op *op, uint64_t raddr,
                                    uint32_t rkey, uint32_t len, uint32_t imm, const void *src)
{
    int ring = exs_imm_kind(imm) == EXS_IMM_INDIRECT, quiet = 0;
    struct exs_prov_sge sge = {(uintptr_t)src, len, op->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = WR_ID(ring ? WR_TAG_RING : WR_TAG_DATA, (uintptr_t)op),
        .opcode = EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = len ? 1 : 0,
        .imm_data = imm,
        .remote_addr = raddr,
        .rkey = rkey,
    };
    int ret;

    /* a small write is copied into the work request (no DMA read of the buffer); its
     * completion hands the buffer back, or the post does when it goes unsignaled */
    if (len && len <= conn->ep->attr.max_inline) {
        wr.flags |= EXS_PROV_SEND_INLINE;
        EXS_PROTO_CNT_INC(conn, writes_inline);
        quiet = conn_quiet_ok_locked(conn, op, len);
        if (quiet) {
            wr.flags = EXS_PROV_SEND_INLINE;
            wr.wr_id = EXS_QUIET_WR_ID;
        }
    }
    ret = exs__conn_post_send_locked(conn, &wr);
    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET, "data write failed");
        return ret;
    }
    conn->credits--;
    if (quiet) {
        conn->quiet_op = op;
        conn->quiet_armed = 0;
        EXS_PROTO_CNT_INC(conn, sends_unsignaled);
        if (EXS_UNLIKELY(conn_quiet_copies(conn)))
            conn_quiet_keep_locked(conn, op->flags, src, len);
    } else {
        conn->wr_out++;
        conn->ring_wr_out += ring;
    }
    if (conn->dp->bytes && len != op->len)
        conn->stats.fragments++; /* STREAM: part of the send (SEQPACKET counts its own) */
    return 0;
}

/* exs_send's send that ends at its post, SEQPACKET (seqpacket.c, exs__conn_send_now_begin):
 * may a write of len bytes of a send with no op go inline and unsignaled now? The
 * conditions of conn_quiet_ok_locked (the caller found sendq empty), and the copy's place
 * made when the conn may be cut over. */
int exs__conn_quiet_may_locked(struct exs_conn *conn, uint32_t len)
{
    return len <= conn->ep->attr.max_inline && conn_quiet_conn_ok(conn) &&
           conn_quiet_place_locked(conn);
}

/* ... and its write (exs__conn_quiet_may_locked said yes, the lock held since, a credit
 * left): the WRITE WITH IMMEDIATE imm (no credits in it: the owed ones are taken here) of
 * len bytes from src, inline and unsignaled, as exs__conn_post_write_imm_locked posts an
 * op's, and the send's end (its bytes sent, the write moved). It goes to the provider
 * straight (exs__prov_post_send), not through exs__conn_post_send_locked: that one's
 * test, no work request queued and room under the cap, is exs__conn_quiet_may_locked's,
 * which the held lock keeps true, so it would post it at once too; the unsignaled write's
 * slot is counted as it counts it (conn_sq_posted); a cap (wr_max) another thread lowers
 * meanwhile counts from the next post, as if it came just after this one. 1 posted; 0 the
 * provider refused it: nothing changed (the conn is not failed here: the whole way posts
 * the send again and fails the conn then). */
int exs__conn_post_quiet_locked(struct exs_conn *conn, uint64_t raddr, uint32_t rkey, uint32_t len,
                                uint32_t imm, const void *src, int flags)
{
    uint32_t owed = exs__conn_take_owed_imm_locked(conn);
    struct exs_prov_sge sge = {(uintptr_t)src, len, 0};
    struct exs_prov_send_wr wr = {
        .wr_id = EXS_QUIET_WR_ID,
        .opcode = EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
        .flags = EXS_PROV_SEND_INLINE,
        .sg_list = &sge,
        .num_sge = 1,
        .imm_data = imm | exs_imm_make(0, 0, owed, 0),
        .remote_addr = raddr,
        .rkey = rkey,
    };

    EXS_ASSERT(!conn->wrq_count);
    if (exs__prov_post_send(conn->ep, &wr)) {
        conn->owed += owed;
        return 0;
    }
    conn_sq_posted(conn, wr.flags);
    conn->credits--;
    conn->quiet_armed = 0;
    EXS_PROTO_CNT_INC(conn, writes_inline);
    EXS_PROTO_CNT_INC(conn, sends_unsignaled);
    if (EXS_UNLIKELY(conn_quiet_copies(conn)))
        conn_quiet_keep_locked(conn, flags, src, len);
    conn->tx_moved++;
    conn->stats.bytes_sent += len;
    return 1;
}

/* Unsignaled writes were posted after the last signaled request: whether each still
 * completes (flushed) or already succeeded silently is unknowable, so the drain would not
 * know when the last completion of the endpoint came. A signaled zero-byte write behind
 * them (flushed on the endpoint in ERROR, after theirs: one send queue completes in
 * order) is the last, counted in wr_out (§6.4). */
void exs__conn_quiet_fence_locked(struct exs_conn *conn)
{
    struct exs_prov_send_wr wr = {
        .wr_id = WR_ID(WR_TAG_QUIET, EXS_QUIET_FENCE),
        .opcode = EXS_PROV_WR_RDMA_WRITE,
        .flags = EXS_PROV_SEND_SIGNALED,
        .remote_addr = conn->peer.ring_addr,
        .rkey = conn->peer.ring_rkey,
    };
    int ret;

    if (!conn->quiet_run || !conn->ep)
        return;
    ret = exs__prov_post_send(conn->ep, &wr);
    if (ret) {
        /* exs_abort still ends the wait (exs__conn_abort_locked) */
        EXS_WARN(PROTO, "conn %p: drain fence: post failed: %s", (void *)conn, strerror(-ret));
        return;
    }
    conn_sq_posted(conn, wr.flags);
    conn->wr_out++;
}

/* ---- operations ---- */

/* Append the SHUTDOWN record (§8) after everything sent so far; op, if any, is the
 * exs_shutdown operation its SEND completes. */
void exs__conn_shutdown_record_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_wire_shutdown s = {
        .hdr = {.type = EXS_CTRL_SHUTDOWN, .len = htobe16(EXS_WIRE_SHUTDOWN_LEN)},
        .seq = htobe64(conn->tx_seq),
    };

    exs__conn_ctrl_append_locked(conn, &s, sizeof(s));
    exs__conn_set_txshut_locked(conn, EXS_TXSHUT_APPENDED, op ? "exs_shutdown" : "close");
    conn->shut_op = op;
}

/* A cancelled operation always reports ECANCELED, whatever became of it. */
void exs__conn_op_finish_all_locked(struct exs_op *op, ssize_t result, int err)
{
    /* the peer's right ends with the operation; where the provider cannot end it yet
     * without ending the endpoint (a verbs window whose bind has not completed, behind
     * sends the peer has not acknowledged), the op is handed back once it can */
    if (op->grant && !exs__prov_grant_settle(op->grant))
        exs__conn_revoke_op_locked(op);
    if (op->cancel)
        err = ECANCELED;
    op->result = err ? -1 : result;
    op->err = err;
    op->state = EXS_OPS_DONE;
    if (EXS_REQTRACE_ON && op->rt)
        exs__conn_hooks.trace_done(op);
}

/* Hand finished operations to their owners, each direction in posting order. The
 * library's own ops (the send buffer's copies, §7.5) are nobody's events: a finished
 * send behind one still on the wire is handed back (its bytes are in the copy or were
 * written), while the internal ops themselves go in their own order. */
/* A finished op whose grant still waits (exs__conn_op_finish_locked): ended now if the
 * provider can, or the connection is past using its endpoint; else 0 (an
 * EXS_PROV_WC_GRANT completion comes and the next delivery asks again). */
static int conn_op_grant_ended_locked(struct exs_conn *conn, struct exs_op *op)
{
    if (op->grant && (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) &&
        exs__prov_grant_settle(op->grant))
        return 0;
    exs__conn_revoke_op_locked(op);
    return 1;
}

/* op (internal, waiting) follows the known run of internal ops at sendq's head: the run
 * ends at it now. */
static void conn_dlv_run_extend(struct exs_conn *conn, struct exs_op *op)
{
    if (op->link.prev == (conn->dlv_run ? &conn->dlv_run->link : &conn->sendq))
        conn->dlv_run = op;
}

void exs__conn_deliver_all_locked(struct exs_conn *conn)
{
    struct exs_list *pos = conn->sendq.next, *next;
    struct exs_op *head = pos != &conn->sendq ? exs_list_entry(pos, struct exs_op, link) : NULL;
    int internal_waits = 0;

    /* Internal ops go in their own order: while the first is not finished, the run of
     * internal ops behind it waits whole, whatever their states. A window of copies in
     * flight is then not walked again at every delivery: only what follows the run. Ops
     * leave sendq only here, and the run's only from a walk from the head, which finds
     * the run again. */
    if (conn->dlv_run && head && head->internal && head->state != EXS_OPS_DONE) {
        pos = conn->dlv_run->link.next;
        internal_waits = 1;
    } else {
        conn->dlv_run = NULL;
    }
    for (; pos != &conn->sendq; pos = next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        next = pos->next;
        if (op->state != EXS_OPS_DONE || !conn_op_grant_ended_locked(conn, op)) {
            if (!op->internal)
                break;
            internal_waits = 1;
            conn_dlv_run_extend(conn, op);
            continue;
        }
        if (op->internal && internal_waits) {
            conn_dlv_run_extend(conn, op);
            continue;
        }
        if (internal_waits)
            conn->bwait.first = NULL;  /* taken from the middle: a held run may point here */
        if (conn->sendq_settled == op) /* the ops before it are settled too */
            conn->sendq_settled = op->link.prev == &conn->sendq
                                      ? NULL
                                      : exs_list_entry(op->link.prev, struct exs_op, link);
        exs_list_del(&op->link);
        if (!op->internal)
            __atomic_store_n(&conn->sendq_app, conn->sendq_app - 1, __ATOMIC_RELAXED);
        op->done(op);
    }
    while (!exs_list_empty(&conn->recvq)) {
        struct exs_op *op = exs_list_entry(conn->recvq.next, struct exs_op, link);

        if (op->state != EXS_OPS_DONE || !conn_op_grant_ended_locked(conn, op))
            break;
        exs_list_del(&op->link);
        if (EXS_REQTRACE_ON && conn->rt)
            exs__conn_hooks.trace_deliver(conn, op);
        op->done(op);
    }
}

/* Answer the peer's PING (progress pass, before the flush): a NOP (credits only) unless
 * records already wait to go, which answer as well (any SEND of ours is a receive at the
 * peer). One answer at most is pending: PINGs that come while it waits for a credit are
 * answered by it. Never wakes the application. */
void exs__conn_ka_answer_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr nop = {
        .type = EXS_CTRL_NOP,
        .len = htobe16(EXS_WIRE_NOP_LEN),
    };

    if (!conn->keepalive.answer)
        return;
    conn->keepalive.answer = 0;
    if (conn->ctrl_len || !exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return; /* the waiting records answer */
    exs__conn_ctrl_append_locked(conn, &nop, sizeof(nop));
    conn->stats.keepalive_answers++;
}

void exs__conn_kick_locked(struct exs_conn *conn)
{
    if ((conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) &&
        !conn->resume.peer_wait) { /* a new path moves nothing before the peer's RESUME */
        conn->dp->recv_progress(conn);
        conn->dp->send_progress(conn);
        exs__conn_ka_answer_locked(conn);
        exs__conn_ctrl_flush_locked(conn);
    } else if (conn->resume.peer_wait && conn->state == EXS_CONN_CONNECTED)
        exs__conn_ctrl_flush_locked(conn); /* our RING and RESUME records */
    exs__conn_deliver_locked(conn);
}

/* The kick after a send was posted (exs__conn_post; spec/proto-layout.md, "The post's
 * fast path"): the send side and delivery only. A posted send changes no input of the
 * receive side, of the keepalive answer or of the ACK decision (its writes only carry
 * owed credits back), so those parts would do what the last kick left them to do:
 * nothing until a completion, a timer or a receive kicks again. */
void exs__conn_kick_tx_locked(struct exs_conn *conn)
{
    if (conn->state != EXS_CONN_CONNECTED || conn->resume.peer_wait) {
        exs__conn_kick_locked(conn);
        return;
    }
    conn->dp->send_progress(conn);
    if (conn->ctrl_len) /* a record the send path appended (ANNOUNCE, DRAIN, TRACE) */
        exs__conn_ctrl_flush_locked(conn);
    exs__conn_deliver_locked(conn);
}

/* The kick after a receive was posted (exs__conn_post; spec/proto-layout.md, "The
 * receive post's kick"): the receive side, the control flush and delivery. A posted
 * receive changes no input of the send side (credits, the peer's ring space and ADVERTs,
 * sendq) or of the keepalive answer: it may take a message that arrived, advertise itself
 * or owe a READ, whose records the flush sends. */
void exs__conn_kick_rx_locked(struct exs_conn *conn)
{
    if (conn->state != EXS_CONN_CONNECTED || conn->resume.peer_wait) {
        exs__conn_kick_locked(conn);
        return;
    }
    conn->kicks_rx++;
    conn->dp->recv_progress(conn);
    exs__conn_ctrl_flush_locked(conn);
    exs__conn_deliver_locked(conn);
}

void exs__conn_fail_locked(struct exs_conn *conn, int err, const char *why)
{
    if (conn->state >= EXS_CONN_DOWN || conn->state == EXS_CONN_IDLE)
        return; /* already going away, or nothing to end */
    if (exs__conn_hooks.fail(conn, err, why))
        return; /* cut over (or being cut over): the connection goes on */
    if (conn->state == EXS_CONN_CONNECTED)
        EXS_INFO(PROTO, "conn %p: %s: connection reset", (void *)conn, why);
    if (!conn->err)
        conn->err = err;
    if (conn->state == EXS_CONN_CONNECTING) {
        /* before ESTABLISHED: the owner hears of it through its dead callback (its
         * connect or accept ends with conn->err), once the endpoint is drained or the
         * handshake deadline passes (hs_down), whichever comes first */
        EXS_INFO(PROTO, "conn %p: %s before the connection was established", (void *)conn, why);
    }
    exs__conn_set_state_locked(conn, EXS_CONN_DOWN, why);
    conn->seqpkt.frag_op = NULL; /* no more pieces: its op ends with the conn */
    exs__prov_disconnect(conn->ep);
}

/* The connection is over: every operation still outstanding completes, the provider
 * resources go, and the owner hears of it. */
void exs__conn_dead_locked(struct exs_conn *conn, int err, const char *why)
{
    struct exs_list *pos;

    if (!conn->err)
        conn->err = err;
    exs__conn_set_state_locked(conn, EXS_CONN_DEAD, why);
    conn->seqpkt.frag_op = NULL;
    conn->seqpkt.rx_frag = NULL;
    conn_wrq_free_locked(conn);
    exs_list_for_each(pos, &conn->sendq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state != EXS_OPS_DONE)
            exs__conn_op_finish_locked(op, -1, op->cancel ? ECANCELED : conn->err);
    }
    /* receives still in flight (advertised, reading) end now; data that arrived
     * eagerly is still handed out, then end of stream or the error */
    exs_list_for_each(pos, &conn->recvq)
    {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_ADVERTISED || op->state == EXS_OPS_POSTED) {
            int lost = !conn->dp->bytes && op->state == EXS_OPS_POSTED && op->rd_piece;

            exs__conn_revoke_op_locked(op);
            op->state = EXS_OPS_QUEUED;
            op->inflight = 0; /* a READ of it: the provider objects go below */
            if (lost)         /* its announced message cannot be read any more (§6): it ends
                               * with the error in its place, never with a later message */
                exs__conn_op_finish_locked(op, -1, conn->err ? conn->err : ECONNRESET);
        }
    }
    conn->reads = 0;
    conn->dp->dead_drain(conn);
    exs__conn_deliver_locked(conn);
    conn_release_prov_locked(conn);
}

void exs__conn_end_locked(struct exs_conn *conn, int err, const char *why)
{
    exs__conn_set_state_locked(conn, EXS_CONN_DOWN, why);
    exs__conn_dead_locked(conn, err, why);
    conn->cb->dead(conn);
}

int exs__conn_path_make(struct exs_conn *conn, struct exs_prov_ctx *ctx, enum exs_mem_kind kind,
                        struct exs_conn_path *path)
{
    struct exs_prov_ep_attr attr = {
        .max_send_wr = conn->p.credits + conn->p.max_reads + conn->tx_slots + 8 + EXS_QUIET_MAX,
        .max_recv_wr = conn->p.credits,
        .max_inline = EXS_MIN(ctx->caps.max_inline, CONN_CTRL_INLINE),
        .rnr_retry = 3,
        .user = conn,
    };
    int ret;

    memset(path, 0, sizeof(*path));
    path->ctx = ctx;
    ret = exs__conn_mem_alloc(ctx, (size_t)(conn->p.credits + conn->tx_slots) * EXS_WIRE_CTRL_MAX,
                              kind, &path->ctrl_mem);
    if (ret) {
        path->ctrl_mem = NULL;
        return ret;
    }
    ret = exs__prov_ep_create(ctx, &attr, &path->ep);
    if (ret) {
        path->ep = NULL;
        return ret;
    }
    for (uint32_t i = 0; i < conn->p.credits; i++) {
        ret = conn_post_rx_on(path->ep, path->ctrl_mem, i);
        if (ret)
            return ret;
        path->posted++;
    }
    return 0;
}

void exs__conn_path_drop(struct exs_conn_path *path)
{
    if (path->ep)
        exs__prov_ep_destroy(path->ep);
    if (path->ctrl_mem)
        exs__conn_mem_free(path->ctrl_mem);
    memset(path, 0, sizeof(*path));
}

void exs__conn_path_take_locked(struct exs_conn *conn, struct exs_conn_path *path)
{
    EXS_ASSERT(!conn->ep && !conn->ctrl_mem);
    __atomic_store_n(&conn->ctx, path->ctx, __ATOMIC_RELAXED); /* read unlocked by xfer.c, ctl.c */
    conn->ctrl_mem = path->ctrl_mem;
    conn->rx_bufs = conn->ctrl_mem->addr;
    conn->tx_bufs = conn->rx_bufs + (size_t)conn->p.credits * EXS_WIRE_CTRL_MAX;
    conn->rx_mr = conn->tx_mr = conn->ctrl_mem;
    conn->tx_free_top = 0;
    for (uint32_t i = 0; i < conn->tx_slots; i++) {
        conn->tx_free[conn->tx_free_top++] = i;
        conn->tx_op[i] = (struct exs_ctrl_tx){0};
    }
    conn->ep = path->ep;
    conn->wr_out += path->posted;
    memset(path, 0, sizeof(*path));
}

int exs__conn_path_new_locked(struct exs_conn *conn, struct exs_prov_ctx *ctx)
{
    struct exs_conn_path path;
    int ret = exs__conn_path_make(conn, ctx, EXS_MEM_FORCE, &path);

    if (ret) {
        exs__conn_path_drop(&path);
        return ret;
    }
    exs__conn_path_take_locked(conn, &path);
    return 0;
}

void exs__conn_fork_child(void)
{
    conn_live = 0;
}
