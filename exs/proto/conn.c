/* SPDX-License-Identifier: MIT */
/* Connection core: resources, handshake, credits, control records, completion dispatch. */
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

#define CONN_TX_SLOTS     16u
#define CONN_CTRL_INLINE  128u /* inline size asked for control sends */

static int conn_live;
static uint64_t conn_ring_bytes; /* every ring region of the process (§7.4 budget) */

uint64_t exs__conn_ring_bytes(void)
{
    return __atomic_load_n(&conn_ring_bytes, __ATOMIC_RELAXED);
}

/* Count size more ring bytes; with budget, only while the total stays within it. */
static int conn_ring_bytes_take(uint64_t size, uint64_t budget)
{
    uint64_t cur = __atomic_load_n(&conn_ring_bytes, __ATOMIC_RELAXED);

    do {
        if (budget && cur + size > budget)
            return -ENOBUFS;
    } while (!__atomic_compare_exchange_n(&conn_ring_bytes, &cur, cur + size, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 0;
}

/* Room a new connection leaves in the memory budget (§9.3): what a peer can make a live
 * connection's tables hold (pending announced messages, ADVERTs), so that admitting one
 * more does not leave the live ones without room for theirs. */
static uint64_t conn_mem_slack(enum exs_mem_kind kind)
{
    if (kind != EXS_MEM_CONN)
        return 0;
    return EXS_WIRE_ANNOUNCED_MAX * exs__mem_chunk(sizeof(struct exs_pending_msg)) +
           EXS_WIRE_ADVERTS_MAX * (uint64_t)sizeof(struct exs_advert);
}

int exs__conn_mem_alloc(struct exs_prov_ctx *ctx, size_t size, enum exs_mem_kind kind,
                        struct exs_prov_mr **mem_p)
{
    int ret = exs__mem_take(exs__mem_pages(size), kind, conn_mem_slack(kind));

    if (ret)
        return ret;
    ret = exs__prov_mem_alloc(ctx, size, mem_p);
    if (ret)
        exs__mem_give(exs__mem_pages(size));
    return ret;
}

void exs__conn_mem_free(struct exs_prov_mr *mem)
{
    exs__mem_give(exs__mem_pages(mem->length));
    exs__prov_mem_free(mem);
}

int exs__conn_mem_take_locked(struct exs_conn *conn, uint64_t n, enum exs_mem_kind kind)
{
    int ret = exs__mem_take(n, kind, conn_mem_slack(kind));

    if (!ret)
        conn->mem_held += n;
    return ret;
}

void exs__conn_mem_give_locked(struct exs_conn *conn, uint64_t n)
{
    EXS_ASSERT(conn->mem_held >= n);
    conn->mem_held -= n;
    exs__mem_give(n);
}

/* A ring region of size bytes on ctx, counted (within limit, 0: none) and charged to the
 * memory budget as kind. 0 or -errno. */
static int conn_ring_mem_alloc(struct exs_prov_ctx *ctx, uint32_t size, uint64_t limit,
                               enum exs_mem_kind kind, struct exs_prov_mr **mem_p)
{
    int ret = conn_ring_bytes_take(size, limit);

    if (ret)
        return ret;
    ret = exs__conn_mem_alloc(ctx, size, kind, mem_p);
    if (ret) {
        if (ret == -ENOBUFS)
            EXS_INFO(PROTO, "ring of %u bytes: memory budget (EXS_MEM_BUDGET) reached", size);
        else
            EXS_WARN(PROTO, "ring of %u bytes: %s", size, strerror(-ret));
        __atomic_fetch_sub(&conn_ring_bytes, (uint64_t)size, __ATOMIC_RELAXED);
    }
    return ret;
}

/* A resume trial's ring (§9.2, Proof): made for a peer not yet proved, so refused past the
 * memory budget like any other memory a peer makes a live connection take. */
int exs__conn_ring_alloc(struct exs_prov_ctx *ctx, uint32_t size, struct exs_prov_mr **mem_p)
{
    return conn_ring_mem_alloc(ctx, size, 0, EXS_MEM_OTHER, mem_p);
}

int exs__conn_ring_region_locked(struct exs_conn *conn, uint32_t size, int budget,
                                 struct exs_prov_mr **mem_p, struct exs_prov_grant **grant_p)
{
    uint64_t limit = budget ? __atomic_load_n(&exs__params.ring_budget, __ATOMIC_RELAXED) : 0;
    /* a grow is refused past the memory budget; so is a new connection's ring (IDLE: being
     * created); a resume's new ring and a shrink's are not (what they replace goes back) */
    enum exs_mem_kind kind = budget                           ? EXS_MEM_GROW
                             : conn->state == EXS_CONN_IDLE ? EXS_MEM_CONN
                                                            : EXS_MEM_FORCE;
    struct exs_prov_mr *mem;
    int ret;

    ret = conn_ring_mem_alloc(conn->ctx, size, limit, kind, &mem);
    if (ret)
        return ret;
    if (grant_p) {
        ret = exs__prov_grant(conn->ep, mem, mem->addr, size, EXS_PROV_ACCESS_REMOTE_WRITE,
                              grant_p);
        if (ret) {
            EXS_INFO(PROTO, "conn %p: grant of a %u-byte ring: %s", (void *)conn, size,
                     strerror(-ret));
            exs__conn_ring_region_free(mem);
            return ret;
        }
    }
    *mem_p = mem;
    return 0;
}

void exs__conn_ring_region_free(struct exs_prov_mr *mem)
{
    __atomic_fetch_sub(&conn_ring_bytes, (uint64_t)mem->length, __ATOMIC_RELAXED);
    exs__conn_mem_free(mem);
}

int exs__conn_live_count(void)
{
    return __atomic_load_n(&conn_live, __ATOMIC_RELAXED);
}

/* The process counters of the protocol (set "proto", exsctl counters), over every conn. */
struct exs_proto_counters exs__proto_cnt;

static const struct exs_counter_desc proto_counter_desc[] = {
    EXS_COUNTER(struct exs_proto_counters, rnr_events,
                "receiver-not-ready completions (the credits make them impossible: must stay 0)"),
    EXS_COUNTER(struct exs_proto_counters, nops_sent,
                "NOP records sent to return credits to a peer whose window was full"),
};

static struct exs_counter_set proto_cset = {
    .name = "proto",
    .desc = proto_counter_desc,
    .count = sizeof(proto_counter_desc) / sizeof(proto_counter_desc[0]),
    .base = &exs__proto_cnt,
};

static pthread_once_t proto_cset_once = PTHREAD_ONCE_INIT;

static void proto_cset_register(void)
{
    exs__counters_register(&proto_cset);
    exs__resume_cset_register();
    exs__mem_cset_register();
}

static const char *const conn_state_names[EXS_CONN_STATE_COUNT] = {
    [EXS_CONN_IDLE] = "IDLE",           [EXS_CONN_CONNECTING] = "CONNECTING",
    [EXS_CONN_CONNECTED] = "CONNECTED", [EXS_CONN_CLOSING] = "CLOSING",
    [EXS_CONN_RESUMING] = "RESUMING",   [EXS_CONN_DOWN] = "DOWN",
    [EXS_CONN_REFUSING] = "REFUSING",   [EXS_CONN_DRAINING] = "DRAINING",
    [EXS_CONN_DEAD] = "DEAD",
};

#define CONN_BIT(_st) (1u << (_st))

/* The transition table (spec/states.md, "Connection"): from each state, where it may go. */
static const uint32_t conn_next[EXS_CONN_STATE_COUNT] = {
    [EXS_CONN_IDLE] = CONN_BIT(EXS_CONN_CONNECTING),
    [EXS_CONN_CONNECTING] = CONN_BIT(EXS_CONN_IDLE) | CONN_BIT(EXS_CONN_CONNECTED) |
                            CONN_BIT(EXS_CONN_REFUSING) | CONN_BIT(EXS_CONN_DOWN) |
                            CONN_BIT(EXS_CONN_DEAD),
    [EXS_CONN_CONNECTED] = CONN_BIT(EXS_CONN_CLOSING) | CONN_BIT(EXS_CONN_DOWN) |
                           CONN_BIT(EXS_CONN_DRAINING) | CONN_BIT(EXS_CONN_RESUMING),
    [EXS_CONN_CLOSING] = CONN_BIT(EXS_CONN_DOWN) | CONN_BIT(EXS_CONN_DRAINING),
    [EXS_CONN_RESUMING] = CONN_BIT(EXS_CONN_CONNECTED) | CONN_BIT(EXS_CONN_DOWN),
    [EXS_CONN_DOWN] = CONN_BIT(EXS_CONN_DRAINING) | CONN_BIT(EXS_CONN_DEAD),
    [EXS_CONN_REFUSING] = CONN_BIT(EXS_CONN_DEAD),
    [EXS_CONN_DRAINING] = CONN_BIT(EXS_CONN_DEAD),
    [EXS_CONN_DEAD] = 0,
};

/* The one place a conn changes state (conn->lock held). */
static void conn_set_state(struct exs_conn *conn, enum exs_conn_state st, const char *why)
{
    EXS_ASSERT(conn_next[conn->state] & CONN_BIT(st));
    EXS_TRACE(PROTO, "conn %p: %s -> %s (%s)", (void *)conn, conn_state_names[conn->state],
              conn_state_names[st], why);
    if (conn->state == EXS_CONN_CONNECTING && st == EXS_CONN_DOWN)
        conn->hs_down = 1; /* the handshake deadline bounds the drain (exs__conn_timer) */
    if (st >= EXS_CONN_DOWN)
        conn->sp_rd_op = NULL; /* no more READ pieces (§6.2): its receive ends with the conn */
    if (conn->state == EXS_CONN_RESUMING && st != EXS_CONN_RESUMING)
        exs__resume_wait_leave(conn); /* no longer counts against resume_max (§9.2) */
    conn->state = st;
}

static const char *const conn_txshut_names[EXS_TXSHUT_COUNT] = {
    [EXS_TXSHUT_OPEN] = "OPEN",         [EXS_TXSHUT_QUEUED] = "QUEUED",
    [EXS_TXSHUT_APPENDED] = "APPENDED", [EXS_TXSHUT_POSTED] = "POSTED",
    [EXS_TXSHUT_DONE] = "DONE",
};

static const uint32_t conn_txshut_next[EXS_TXSHUT_COUNT] = {
    [EXS_TXSHUT_OPEN] = CONN_BIT(EXS_TXSHUT_QUEUED) | CONN_BIT(EXS_TXSHUT_APPENDED) |
                        CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_QUEUED] = CONN_BIT(EXS_TXSHUT_APPENDED) | CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_APPENDED] = CONN_BIT(EXS_TXSHUT_POSTED),
    [EXS_TXSHUT_POSTED] = CONN_BIT(EXS_TXSHUT_DONE),
    [EXS_TXSHUT_DONE] = 0,
};

/* The one place the send direction's SHUTDOWN sub-state changes (conn->lock held). */
static void conn_set_txshut(struct exs_conn *conn, enum exs_conn_txshut st, const char *why)
{
    EXS_ASSERT(conn_txshut_next[conn->txshut] & CONN_BIT(st));
    EXS_TRACE(PROTO, "conn %p: shutdown %s -> %s (%s)", (void *)conn,
              conn_txshut_names[conn->txshut], conn_txshut_names[st], why);
    conn->txshut = st;
}

int exs__conn_is_dead(struct exs_conn *conn)
{
    int dead;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    dead = conn->state == EXS_CONN_DEAD || conn->state == EXS_CONN_IDLE;
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
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
        .wr_id = WR_ID(WR_TAG_RX, (uint64_t)slot << 3), .sg_list = &sge, .num_sge = 1
    };

    return exs__prov_post_recv(ep, &wr);
}

static int conn_post_rx_locked(struct exs_conn *conn, uint32_t slot)
{
    int ret = conn_post_rx_on(conn->ep, conn->rx_mr, slot);

    if (!ret)
        conn->wr_out++;
    return ret;
}

/* End every grant of the conn (the ring's and its operations'), at once and without
 * waiting for the peer: late bytes are discarded by the provider. */
static void conn_revoke_all_locked(struct exs_conn *conn)
{
    struct exs_list *q[2] = { &conn->sendq, &conn->recvq };
    struct exs_list *pos;

    for (int i = 0; i < 2; i++)
        exs_list_for_each(pos, q[i])
            exs__conn_revoke_op_locked(exs_list_entry(pos, struct exs_op, link));
    if (conn->ring_grant)
        exs__prov_revoke(conn->ring_grant);
    conn->ring_grant = NULL;
    if (conn->rs_next_grant) /* an offered region (§7.4) */
        exs__prov_revoke(conn->rs_next_grant);
    conn->rs_next_grant = NULL;
}

/* Give back the endpoint after revoking every grant: the peer can no longer reach any
 * memory. The ring stays (with its local registration) so eager messages already in it
 * can still be received after the end. */
static void conn_release_prov_locked(struct exs_conn *conn)
{
    exs__resume_pend_end_locked(conn, 0); /* a resume request on trial goes too (§9.2) */
    conn_revoke_all_locked(conn);
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

static void conn_release_locked(struct exs_conn *conn)
{
    conn_wrq_free_locked(conn);
    exs__resume_pend_end_locked(conn, 1);

    conn_release_prov_locked(conn);
    exs__batch_release_locked(conn);
    exs__stage_release_locked(conn);
    exs__st_ring_release_locked(conn);
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
    exs__sp_free_pending_locked(conn);
    exs__rt_free_locked(conn);
}

/* The malloc'd arrays of a connection as created (the ADVERT queue at its first size),
 * and an estimate of what it makes others hold: the provider endpoint's work requests and
 * completion queue entries, its state and the socket (a page each). */
static uint64_t conn_arrays_bytes(const struct exs_conn *conn)
{
    uint64_t wrs = 2ull * conn->p.credits + conn->p.max_reads + conn->tx_slots + 8;

    return wrs * (sizeof(struct exs_prov_cqe) + 64) + 2 * 4096 +
           exs__mem_chunk(conn->tx_slots * sizeof(*conn->tx_free)) +
           exs__mem_chunk(conn->tx_slots * sizeof(*conn->tx_op)) +
           exs__mem_chunk(conn->adv_cap * sizeof(*conn->adverts)) +
           exs__mem_chunk((conn->p.max_reads ? conn->p.max_reads : 1) * sizeof(*conn->rd_owed));
}

/* The struct itself, once everything it held went back: its account is empty. */
static void conn_struct_free(struct exs_conn *conn)
{
    EXS_ASSERT(!conn->mem_held);
    pthread_mutex_destroy(&conn->lock);
    free(conn);
    exs__mem_give(exs__mem_chunk(sizeof(*conn)));
}

int exs__conn_create(struct exs_prov_ctx *ctx, const struct exs_conn_params *p,
                     const struct exs_conn_cb *cb, void *owner, struct exs_conn **conn_p)
{
    struct exs_conn *conn;
    int ret = -ENOMEM;

    if (p->credits < 3 || p->credits > EXS_IMM_CREDITS_MAX || p->ring_size % EXS_RING_SLOT ||
        p->max_reads < 1 || p->ring_size < EXS_RING_SLOT || p->ring_size > EXS_WIRE_RING_SIZE_MAX ||
        p->batch_max > EXS_BATCH_MAX_LIMIT)
        return -EINVAL;
    pthread_once(&proto_cset_once, proto_cset_register);
    /* the connection's own memory first: past the budget, nothing is allocated (§9.3) */
    ret = exs__mem_take(exs__mem_chunk(sizeof(*conn)), EXS_MEM_CONN,
                        conn_mem_slack(EXS_MEM_CONN));
    if (ret) {
        EXS_INFO(PROTO, "conn: refused, memory budget (EXS_MEM_BUDGET %llu bytes) reached",
                 (unsigned long long)__atomic_load_n(&exs__params.mem_budget, __ATOMIC_RELAXED));
        return ret;
    }
    ret = -ENOMEM;
    conn = calloc(1, sizeof(*conn));
    if (!conn) {
        exs__mem_give(exs__mem_chunk(sizeof(*conn)));
        return -ENOMEM;
    }
    pthread_mutex_init(&conn->lock, NULL);
    conn->created_ns = exs__now_ns();
    conn->ctx = ctx;
    conn->cb = cb;
    conn->owner = owner;
    conn->p = *p;
    /* our hello must pass the peer's check (§2): nothing larger than the ring goes eagerly */
    conn->p.eager_max = EXS_MIN(p->eager_max, p->ring_size);
    exs_list_init(&conn->sendq);
    exs_list_init(&conn->recvq);
    exs_list_init(&conn->pending);
    exs_list_init(&conn->wrq);
    conn->batch_thresh = EXS_MIN(EXS_BATCH_FLOOR, p->batch_max); /* 0: off */

    conn->tx_slots = CONN_TX_SLOTS;
    conn->adv_cap = 64;
    conn->tx_free = calloc(conn->tx_slots, sizeof(*conn->tx_free));
    conn->tx_op = calloc(conn->tx_slots, sizeof(*conn->tx_op));
    conn->adverts = calloc(conn->adv_cap, sizeof(*conn->adverts));
    conn->rd_owed = calloc(p->max_reads ? p->max_reads : 1, sizeof(*conn->rd_owed));
    if (!conn->rd_owed || !conn->tx_free || !conn->tx_op || !conn->adverts)
        goto err;
    ret = exs__conn_mem_take_locked(conn, conn_arrays_bytes(conn), EXS_MEM_CONN);
    if (ret)
        goto err;
    conn->mem_arrays = conn_arrays_bytes(conn);
    for (uint32_t i = 0; i < conn->tx_slots; i++)
        conn->tx_free[conn->tx_free_top++] = i;

    /* registered memory from the provider (its memory cache on verbs): the ring, and the
     * control receive and send slots together, all for local access only */
    ret = exs__conn_ring_region_locked(conn, p->ring_size, 0, &conn->ring_mem, NULL);
    if (ret)
        goto err;
    conn->ring = conn->ring_mem->addr;
    conn->ring_init = p->ring_size;
    ret = exs__conn_mem_alloc(ctx, (size_t)(p->credits + conn->tx_slots) * EXS_WIRE_CTRL_MAX,
                              EXS_MEM_CONN, &conn->ctrl_mem);
    if (ret)
        goto err;
    conn->rx_bufs = conn->ctrl_mem->addr;
    conn->tx_bufs = conn->rx_bufs + (size_t)p->credits * EXS_WIRE_CTRL_MAX;
    conn->rx_mr = conn->tx_mr = conn->ctrl_mem;
    /* the peer gets its write grant over the ring once connected (§2, RING) */

    struct exs_prov_ep_attr attr = {
        .max_send_wr = p->credits + p->max_reads + conn->tx_slots + 8,
        .max_recv_wr = p->credits,
        /* control records (ACK, ADVERT, ...) are small: sent inline, no DMA read of a slot */
        .max_inline = EXS_MIN(ctx->caps.max_inline, CONN_CTRL_INLINE),
        .rnr_retry = 3,
        .user = conn,
    };
    ret = exs__prov_ep_create(ctx, &attr, &conn->ep);
    if (ret)
        goto err;
    for (uint32_t i = 0; i < p->credits; i++) {
        ret = conn_post_rx_locked(conn, i);
        if (ret)
            goto err;
    }
    conn->credits = 0; /* granted by the peer's hello */
    __atomic_fetch_add(&conn_live, 1, __ATOMIC_RELAXED);
    *conn_p = conn;
    return 0;

err:
    if (ret != -ENOBUFS)
        EXS_WARN(PROTO, "conn: set-up failed: %s", strerror(-ret));
    else
        EXS_INFO(PROTO, "conn: refused, memory budget (EXS_MEM_BUDGET %llu bytes) reached",
                 (unsigned long long)__atomic_load_n(&exs__params.mem_budget, __ATOMIC_RELAXED));
    conn_release_locked(conn);
    conn_struct_free(conn);
    return ret;
}

void exs__conn_destroy(struct exs_conn *conn)
{
    EXS_ASSERT(conn->state == EXS_CONN_DEAD || conn->state == EXS_CONN_IDLE);
    EXS_ASSERT(exs_list_empty(&conn->sendq) && exs_list_empty(&conn->recvq));
    if (exs__resume_forget(conn))
        exs__conn_free(conn);
}

void exs__conn_free(struct exs_conn *conn)
{
    conn_release_locked(conn);
    conn_struct_free(conn);
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
    h->features = htobe16((EXS_WIRE_FEAT_ALL & ~EXS_RT_FEAT_OFF) |
                          (conn->p.resumable ? EXS_WIRE_FEAT_RESUMABLE : 0));
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
    else if (ring_size && (!ring_addr || ring_addr % EXS_RING_SLOT ||
                           ring_addr + ring_size < ring_addr))
        bad = "ring_addr";
    else if (eager_max > ring_size)
        bad = "eager_max";
    else if (max_msg && max_msg < eager_max)
        bad = "max_msg";
    else if ((h.hflags & EXS_WIRE_HELLO_F_RESUME) &&
             !(be16toh(h.features) & EXS_WIRE_FEAT_RESUMABLE))
        bad = "resume flag without feature bit 7";
    if (bad) {
        EXS_INFO(PROTO, "peer hello refused: bad %s (credits %u ctrl_size %u ring_size %u "
                 "ring_addr %#llx eager_max %u max_msg %u)", bad, credits, ctrl_size, ring_size,
                 (unsigned long long)ring_addr, eager_max, max_msg);
        return EXS_WIRE_REJ_HELLO;
    }
    return 0;
}

/* Adopt a checked peer hello: host-order copy, initial credits. */
static void conn_adopt_hello_locked(struct exs_conn *conn, const void *pd)
{
    struct exs_wire_hello h;

    memcpy(&h, pd, sizeof(h));
    conn->peer.magic = be16toh(h.magic);
    conn->peer.version = h.version;
    conn->peer.sock_type = h.sock_type;
    conn->peer.features =
        be16toh(h.features) & ((EXS_WIRE_FEAT_ALL & ~EXS_RT_FEAT_OFF) | EXS_WIRE_FEAT_RESUMABLE);
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

int exs__conn_connect(struct exs_conn *conn, const struct sockaddr *addr, socklen_t len)
{
    struct exs_wire_hello h;
    int ret;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__conn_hello(conn, &h);
    conn->active = 1;
    conn->dl_start_ns = exs__now_ns();
    conn_set_state(conn, EXS_CONN_CONNECTING, "connect");
    ret = exs__prov_connect(conn->ep, addr, len, &h, sizeof(h));
    if (ret)
        conn_set_state(conn, EXS_CONN_IDLE, "connect failed");
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

int exs__conn_accept(struct exs_conn *conn, struct exs_prov_conn_req *req, const void *peer_pd)
{
    struct exs_wire_hello h;
    int ret;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    conn_adopt_hello_locked(conn, peer_pd);
    exs__conn_hello(conn, &h);
    conn->dl_start_ns = exs__now_ns();
    conn_set_state(conn, EXS_CONN_CONNECTING, "accept");
    ret = exs__prov_accept(req, conn->ep, &h, sizeof(h));
    if (ret)
        conn_set_state(conn, EXS_CONN_IDLE, "accept failed");
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* ---- credits and control records (§3, §5) ---- */


/* Just connected: grant the peer write access to our ring for the connection's life and
 * send the key in a RING record, the first record of our first SEND (§2). */
static void conn_ring_grant_locked(struct exs_conn *conn)
{
    struct exs_wire_ring r = {
        .hdr = { .type = EXS_CTRL_RING, .len = htobe16(EXS_WIRE_RING_LEN) },
    };
    int ret;

    /* first, but for the active side's AUTH on a cut-over's new path (§9.2) */
    EXS_ASSERT(!conn->ring_grant &&
               (!conn->ctrl_len || (conn->active && conn->rsm_newpath &&
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


/* The test seam EXS_WINDOW_TEST (EXS_WINDOW_TEST_* bits; 0 in production). */
static unsigned conn_window_test(void)
{
    return (unsigned)__atomic_load_n(&exs__params.window_test, __ATOMIC_RELAXED);
}

/* May a control SEND (which consumes a peer receive) go out? The last credit is kept for
 * a message that returns credits, so two starved sides can always unblock each other
 * (spec/protocol.md §3.1). */
static int conn_can_spend_ctrl_locked(struct exs_conn *conn)
{
    return conn->credits > 1 || (conn->credits == 1 && conn->owed > 0);
}

/* May one more data write (WWI) go out? As a control SEND: its immediate returns the owed
 * credits. Under the seam EXS_WINDOW_TEST_STRICT the last credit is for ACK / NOP only. */
int exs__conn_can_spend_locked(struct exs_conn *conn)
{
    if (conn_window_test() & EXS_WINDOW_TEST_STRICT)
        return conn->credits > 1;
    return conn_can_spend_ctrl_locked(conn);
}

/* ---- the work-request cap (§6.3) ---- */

struct conn_wrq_ent {
    struct exs_list          link;
    struct exs_prov_send_wr  wr;
    struct exs_prov_sge      sge;
};

static uint32_t conn_wr_max(void)
{
    uint64_t m = __atomic_load_n(&exs__params.wr_max, __ATOMIC_RELAXED);

    return m ? (uint32_t)m : UINT32_MAX; /* 0: the tunables were never loaded (unit tests) */
}

int exs__conn_post_send_locked(struct exs_conn *conn, const struct exs_prov_send_wr *wr)
{
    struct conn_wrq_ent *e;
    int ret;

    EXS_ASSERT(wr->num_sge <= 1);
    if (!conn->wrq_count && conn->sq_out < conn_wr_max()) {
        ret = exs__prov_post_send(conn->ep, wr);
        if (!ret)
            conn->sq_out++;
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
static void conn_wrq_post_locked(struct exs_conn *conn)
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
        conn->sq_out++;
        free(e);
    }
}

static void conn_on_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe);

/* The conn is going away (DOWN on): its queued work requests will never be posted; each
 * completes as flushed, as the provider completes the posted ones, so every op and slot
 * they hold is accounted for (wr_out reaches 0). */
static void conn_wrq_flush_locked(struct exs_conn *conn)
{
    struct exs_list *n;

    while ((n = exs_list_pop_head(&conn->wrq))) {
        struct conn_wrq_ent *e = exs_list_entry(n, struct conn_wrq_ent, link);
        struct exs_prov_cqe cqe = {
            .wr_id = e->wr.wr_id,
            .status = EXS_PROV_WC_WR_FLUSH_ERR,
            .ep = conn->ep,
        };

        conn->wrq_count--;
        free(e);
        conn_on_cqe_locked(conn, &cqe);
    }
}

/* The provider objects are gone (DEAD): queued work requests are dropped with them. */
static void conn_wrq_free_locked(struct exs_conn *conn)
{
    struct exs_list *n;

    while ((n = exs_list_pop_head(&conn->wrq)))
        free(exs_list_entry(n, struct conn_wrq_ent, link));
    conn->wrq_count = 0;
}

uint32_t exs__conn_frag_size(void)
{
    uint64_t f = __atomic_load_n(&exs__params.frag_size, __ATOMIC_RELAXED);

    return f ? (uint32_t)f : UINT32_MAX; /* 0: the tunables were never loaded (unit tests) */
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

uint32_t exs__conn_take_owed_imm_locked(struct exs_conn *conn)
{
    uint32_t n = EXS_MIN(conn->owed, EXS_IMM_CREDITS_MAX);

    if (conn_window_test() & EXS_WINDOW_TEST_NO_ACK)
        return 0; /* the seam: data returns none */

    conn->owed -= n;
    return n;
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
        !(conn_window_test() & EXS_WINDOW_TEST_NO_ACK))
        return 1;
    return unreported >= conn->p.ring_size / 4 ||
           (unreported && conn->rd_arrived - conn->rd_reported > conn->p.ring_size / 2);
}

/* Send the pending control records (adding an ACK when owed). Returns 1 when nothing
 * remains pending, 0 when they must wait (no credit or send slot). */
int exs__conn_ctrl_flush_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr *first;
    uint32_t slot;
    uint8_t *dst;
    int ret;

    if (!conn->ctrl_len && !conn_needs_ack_locked(conn))
        return 1;
    if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
        return 0;
    if (conn->sp_frag_op && conn->txshut == EXS_TXSHUT_APPENDED)
        return 0; /* the SHUTDOWN counts a message whose pieces must all go first (§6.2) */
    if (!conn->tx_free_top || !conn_can_spend_ctrl_locked(conn)) {
        if (conn->ctrl_len)
            conn->stats.credit_stalls++;
        return 0;
    }
    if (conn->rd_consumed != conn->rd_reported || !conn->ctrl_len) {
        struct exs_wire_ack ack = {
            .hdr = { .type = EXS_CTRL_ACK, .len = htobe16(EXS_WIRE_ACK_LEN) },
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
    struct exs_prov_sge sge = { (uintptr_t)dst, conn->ctrl_len, conn->tx_mr->lkey };
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
    EXS_TRACE(PROTO, "conn %p: control send %u bytes, %u credits returned, %u left",
              (void *)conn, conn->ctrl_len, give, conn->credits - 1);
    conn->tx_op[slot].op = conn->shut_op;
    conn->tx_op[slot].shut = conn->txshut == EXS_TXSHUT_APPENDED;
    conn->tx_op[slot].t_us = exs__now_us(); /* srtt_us (§7.4) */
    if (conn->txshut == EXS_TXSHUT_APPENDED)
        conn_set_txshut(conn, EXS_TXSHUT_POSTED, "control send posted");
    conn->shut_op = NULL;
    conn->owed -= give;
    conn->credits--;
    conn->ctrl_len = 0;
    return 1;
}

/* Store a received ADVERT at the tail of q_A, growing it up to a bound. */
int exs__advert_push_locked(struct exs_conn *conn, const struct exs_advert *a)
{
    if (conn->adv_count >= EXS_WIRE_ADVERTS_MAX) {
        EXS_INFO(PROTO, "conn %p: more than %u usable ADVERTs held (§6, §7: ADVERTS_MAX)",
                 (void *)conn, EXS_WIRE_ADVERTS_MAX);
        return -EPROTO;
    }
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

/* One WRITE WITH IMMEDIATE of len bytes from src (inside op's buffer). A write into the
 * peer's ring (INDIRECT) counts in ring_wr_out until it completes (batching, §6.1). */
int exs__conn_post_write_imm_locked(struct exs_conn *conn, struct exs_op *op, uint64_t raddr,
                                    uint32_t rkey, uint32_t len, uint32_t imm, const void *src)
{
    int ring = exs_imm_kind(imm) == EXS_IMM_INDIRECT;
    struct exs_prov_sge sge = { (uintptr_t)src, len, op->lkey };
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
    int ret = exs__conn_post_send_locked(conn, &wr);

    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET, "data write failed");
        return ret;
    }
    conn->wr_out++;
    conn->credits--;
    conn->ring_wr_out += ring;
    if (conn_is_stream(conn) && len != op->len)
        conn->stats.fragments++; /* STREAM: part of the send (SEQPACKET counts its own) */
    return 0;
}

/* ---- operations ---- */

/* Append the SHUTDOWN record (§8) after everything sent so far; op, if any, is the
 * exs_shutdown operation its SEND completes. */
void exs__conn_shutdown_record_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_wire_shutdown s = {
        .hdr = { .type = EXS_CTRL_SHUTDOWN, .len = htobe16(EXS_WIRE_SHUTDOWN_LEN) },
        .seq = htobe64(conn->tx_seq),
    };

    exs__conn_ctrl_append_locked(conn, &s, sizeof(s));
    conn_set_txshut(conn, EXS_TXSHUT_APPENDED, op ? "exs_shutdown" : "close");
    conn->shut_op = op;
}

/* A cancelled operation always reports ECANCELED, whatever became of it. */
void exs__conn_op_finish_locked(struct exs_op *op, ssize_t result, int err)
{
    exs__conn_revoke_op_locked(op); /* the peer's right ends with the operation */
    if (op->cancel)
        err = ECANCELED;
    op->result = err ? -1 : result;
    op->err = err;
    op->state = EXS_OPS_DONE;
    if (EXS_RT_ON && op->rt)
        exs__rt_done_locked(op);
}

/* Hand finished operations to their owners, each direction in posting order. The
 * library's own ops (the send buffer's copies, §7.5) are nobody's events: a finished
 * send behind one still on the wire is handed back (its bytes are in the copy or were
 * written), while the internal ops themselves go in their own order. */
static void conn_deliver_locked(struct exs_conn *conn)
{
    struct exs_list *pos, *next;
    int internal_waits = 0;

    for (pos = conn->sendq.next; pos != &conn->sendq; pos = next) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        next = pos->next;
        if (op->state != EXS_OPS_DONE) {
            if (!op->internal)
                break;
            internal_waits = 1;
            continue;
        }
        if (op->internal && internal_waits)
            continue;
        if (internal_waits)
            conn->bwait.first = NULL; /* taken from the middle: a held run may point here */
        exs_list_del(&op->link);
        op->done(op);
    }
    while (!exs_list_empty(&conn->recvq)) {
        struct exs_op *op = exs_list_entry(conn->recvq.next, struct exs_op, link);

        if (op->state != EXS_OPS_DONE)
            break;
        exs_list_del(&op->link);
        if (EXS_RT_ON && conn->rt)
            exs__rt_deliver_locked(conn, op);
        op->done(op);
    }
}

static void conn_ka_answer_locked(struct exs_conn *conn);

void exs__conn_kick_locked(struct exs_conn *conn)
{
    if ((conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING) &&
        !conn->rsm_peer_wait) { /* a new path moves nothing before the peer's RESUME */
        if (conn_is_stream(conn)) {
            exs__st_recv_progress_locked(conn);
            exs__st_send_progress_locked(conn);
        } else {
            exs__sp_recv_progress_locked(conn);
            exs__sp_send_progress_locked(conn);
        }
        conn_ka_answer_locked(conn);
        exs__conn_ctrl_flush_locked(conn);
    } else if (conn->rsm_peer_wait && conn->state == EXS_CONN_CONNECTED)
        exs__conn_ctrl_flush_locked(conn); /* our RING and RESUME records */
    conn_deliver_locked(conn);
}

void exs__conn_fail_locked(struct exs_conn *conn, int err, const char *why)
{
    if (conn->state >= EXS_CONN_DOWN || conn->state == EXS_CONN_IDLE)
        return; /* already going away, or nothing to end */
    if (exs__resume_on_fail_locked(conn, err, why))
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
    conn_set_state(conn, EXS_CONN_DOWN, why);
    conn->sp_frag_op = NULL; /* no more pieces: its op ends with the conn */
    exs__prov_disconnect(conn->ep);
}

/* The connection is over: every operation still outstanding completes, the provider
 * resources go, and the owner hears of it. */
static void conn_dead_locked(struct exs_conn *conn, int err, const char *why)
{
    struct exs_list *pos;

    if (!conn->err)
        conn->err = err;
    conn_set_state(conn, EXS_CONN_DEAD, why);
    conn->sp_frag_op = NULL;
    conn->sp_rx_frag = NULL;
    conn_wrq_free_locked(conn);
    exs_list_for_each(pos, &conn->sendq) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state != EXS_OPS_DONE)
            exs__conn_op_finish_locked(op, -1, op->cancel ? ECANCELED : conn->err);
    }
    /* receives still in flight (advertised, reading) end now; data that arrived
     * eagerly is still handed out, then end of stream or the error */
    exs_list_for_each(pos, &conn->recvq) {
        struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

        if (op->state == EXS_OPS_ADVERTISED || op->state == EXS_OPS_POSTED) {
            int lost = !conn_is_stream(conn) && op->state == EXS_OPS_POSTED && op->rd_piece;

            exs__conn_revoke_op_locked(op);
            op->state = EXS_OPS_QUEUED;
            op->inflight = 0; /* a READ of it: the provider objects go below */
            if (lost) /* its announced message cannot be read any more (§6): it ends
                       * with the error in its place, never with a later message */
                exs__conn_op_finish_locked(op, -1, conn->err ? conn->err : ECONNRESET);
        }
    }
    conn->reads = 0;
    if (conn_is_stream(conn))
        exs__st_dead_drain_locked(conn);
    else
        exs__sp_dead_drain_locked(conn);
    conn_deliver_locked(conn);
    conn_release_prov_locked(conn);
}

int exs__conn_post(struct exs_conn *conn, struct exs_op *op)
{
    int ret = 0;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    switch (conn->state) {
    case EXS_CONN_IDLE:
    case EXS_CONN_CONNECTING:
        ret = -ENOTCONN;
        goto out;
    case EXS_CONN_CLOSING:
        ret = -EBADF;
        goto out;
    default:
        break;
    }
    if (op->kind != EXS_OP_RECV && conn->txshut != EXS_TXSHUT_OPEN) {
        ret = -EPIPE;
        goto out;
    }
    op->state = EXS_OPS_QUEUED;
    op->grant = NULL;
    op->rkey = 0;
    op->result = 0;
    op->err = 0;
    op->rflags = 0;
    op->posted = 0;
    op->inflight = 0;
    op->announced = 0;
    op->filled = 0;
    op->rt = NULL;
    if (op->mr && op->mr->ctx != conn->ctx) {
        /* registered on the context the conn ran on before a cut-over (§9.2) */
        ret = exs__resume_op_mr_locked(conn, op);
        if (ret)
            goto out;
    }
    if (op->kind == EXS_OP_RECV) {
        exs_list_add_tail(&conn->recvq, &op->link);
        if (conn->state == EXS_CONN_DEAD) {
            if (conn_is_stream(conn))
                exs__st_dead_drain_locked(conn);
            else
                exs__sp_dead_drain_locked(conn);
        }
    } else {
        if (op->kind == EXS_OP_SHUTDOWN)
            conn_set_txshut(conn, EXS_TXSHUT_QUEUED, "exs_shutdown accepted");
        if (EXS_RT_ON &&
            EXS_UNLIKELY(__atomic_load_n(&exs__params.trace_sample_mask, __ATOMIC_RELAXED)))
            exs__rt_post_locked(conn, op);
        exs_list_add_tail(&conn->sendq, &op->link);
        if (conn_is_stream(conn))
            exs__stage_send_locked(conn, op); /* copied: finished, the copy goes on */
        if (conn->state == EXS_CONN_DEAD)
            exs__conn_op_finish_locked(op, -1, conn->peer_shut ? EPIPE : conn->err);
    }
    exs__conn_kick_locked(conn);
out:
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* An op may be cancelled while nothing of it is on the wire; a receive also only when
 * no advertised receive follows it (the advert's message number counts it). */
static int conn_cancellable_locked(struct exs_conn *conn, struct exs_op *op)
{
    struct exs_list *pos;

    if (op->state != EXS_OPS_QUEUED)
        return 0;
    if (op->kind != EXS_OP_RECV)
        return 1;
    for (pos = op->link.next; pos != &conn->recvq; pos = pos->next)
        if (exs_list_entry(pos, struct exs_op, link)->state == EXS_OPS_ADVERTISED)
            return 0;
    return 1;
}

int exs__conn_cancel(struct exs_conn *conn, int (*match)(struct exs_op *op, void *arg), void *arg)
{
    struct exs_list *q[2] = { &conn->sendq, &conn->recvq };
    struct exs_list *pos;
    int n = 0;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    for (int i = 0; i < 2; i++) {
        exs_list_for_each(pos, q[i]) {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->state == EXS_OPS_DONE || op->internal || !match(op, arg))
                continue;
            if (op->kind == EXS_OP_SHUTDOWN)
                continue;
            if (conn_cancellable_locked(conn, op)) {
                exs__conn_op_finish_locked(op, -1, ECANCELED);
                n++;
            } else if (conn->state >= EXS_CONN_DOWN) {
                /* On the wire, and the connection is going away. With a work request
                 * of its own outstanding, the provider still holds the op (its wr_id)
                 * and its buffer: it completes when that completion or flush is seen
                 * (at DEAD at the latest). Otherwise only the peer's grant reaches it,
                 * and finishing revokes that. */
                op->cancel = 1;
                if (!op->inflight) {
                    exs__conn_op_finish_locked(op, -1, ECANCELED);
                    n++;
                }
            }
        }
    }
    exs__conn_kick_locked(conn);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return n;
}

void exs__conn_close(struct exs_conn *conn)
{
    struct exs_list *q[2] = { &conn->sendq, &conn->recvq };
    struct exs_list *pos;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    /* Sends gathered behind a ring write in flight (batching, §6.1) would have been on
     * the wire without batching: they leave now, so close sends what it sent before. */
    if (conn->state == EXS_CONN_CONNECTED && conn->ring_wr_out) {
        conn->batch_now = 1;
        if (conn_is_stream(conn))
            exs__st_send_progress_locked(conn);
        else
            exs__sp_send_progress_locked(conn);
        conn->batch_now = 0;
    }
    /* Everything outstanding completes with ECANCELED: at once when nothing of it is
     * on the wire, else when the disconnect has flushed it (its buffer is then free). */
    for (int i = 0; i < 2; i++) {
        exs_list_for_each(pos, q[i]) {
            struct exs_op *op = exs_list_entry(pos, struct exs_op, link);

            if (op->state == EXS_OPS_DONE || op->internal)
                continue; /* copies in the send buffer are sent: their sends completed */
            op->cancel = 1;
            if (op->state == EXS_OPS_QUEUED)
                exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
    }
    if (exs__resume_close_locked(conn)) { /* being cut over: reset now (§9.2) */
        conn_deliver_locked(conn);
        EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        return;
    }
    switch (conn->state) {
    case EXS_CONN_CONNECTED:
        /* Say goodbye with a SHUTDOWN record, then disconnect once its SEND completed,
         * so the peer reads end of stream rather than a reset. */
        conn_set_state(conn, EXS_CONN_CLOSING, "close");
        if ((conn->txshut == EXS_TXSHUT_OPEN || conn->txshut == EXS_TXSHUT_QUEUED) &&
            exs__stage_pending_locked(conn) && !exs__stage_shutdown_locked(conn)) {
            /* copies not yet on the wire (§7.5): the record follows them */
            if (conn->txshut == EXS_TXSHUT_OPEN)
                conn_set_txshut(conn, EXS_TXSHUT_QUEUED, "close behind the send buffer");
            exs__st_send_progress_locked(conn);
            exs__conn_ctrl_flush_locked(conn);
        } else if (conn->txshut == EXS_TXSHUT_OPEN || conn->txshut == EXS_TXSHUT_QUEUED) {
            if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN))
                exs__conn_ctrl_flush_locked(conn);
            if (exs__conn_ctrl_room_locked(conn, EXS_WIRE_SHUTDOWN_LEN))
                exs__conn_shutdown_record_locked(conn, NULL);
            else /* cannot: reset below */
                conn_set_txshut(conn, EXS_TXSHUT_DONE, "no room for the record");
        }
        if (conn->txshut == EXS_TXSHUT_DONE) {
            conn_set_state(conn, EXS_CONN_DOWN, "closed");
            exs__prov_disconnect(conn->ep);
        } else {
            exs__conn_ctrl_flush_locked(conn);
        }
        break;
    case EXS_CONN_CONNECTING:
        conn_set_state(conn, EXS_CONN_DOWN, "close while connecting");
        exs__prov_disconnect(conn->ep);
        break;
    default:
        break;
    }
    conn_deliver_locked(conn);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_abort_locked(struct exs_conn *conn)
{
    if (exs__resume_close_locked(conn))
        return;
    if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING ||
        conn->state == EXS_CONN_CONNECTING) {
        conn_set_state(conn, EXS_CONN_DOWN, "abort");
        exs__prov_disconnect(conn->ep);
    } else if (conn->state == EXS_CONN_DRAINING) {
        /* the provider never flushed what was outstanding: give up waiting */
        EXS_WARN(PROTO, "conn %p: %u work requests never completed after the disconnect",
                 (void *)conn, conn->wr_out);
        conn_dead_locked(conn, conn->disc_err, "flush never completed");
        conn->cb->dead(conn);
    }
}

void exs__conn_abort(struct exs_conn *conn)
{
    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__conn_abort_locked(conn);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

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
    conn_set_state(conn, EXS_CONN_DOWN, why);
    conn_dead_locked(conn, ETIMEDOUT, why);
    conn->cb->dead(conn);
}

/* Post the probe: a zero-byte RDMA WRITE, which consumes no receive at the peer and
 * wakes nothing there; its completion says the peer's NIC acknowledged it. Zero-length
 * writes are not checked against the key (spec/provider.md), so the ring's address and
 * key serve whether or not the peer's RING record came. */
static int conn_ka_probe_locked(struct exs_conn *conn)
{
    struct exs_prov_sge sge = { 0 };
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
    conn->ka_probe_out = 1;
    conn->stats.keepalive_probes++;
    return 0;
}

/* Both hellos have feature ALIVE: the peer's library answers probes (§9.1). Not under
 * the window seam EXS_WINDOW_TEST (tests only): a PING returns credits, and the seam's
 * windows must stay full until its NOP (§3.1), so keepalive keeps the zero-byte WRITE. */
static int conn_ka_alive(const struct exs_conn *conn)
{
    return (conn->peer.features & EXS_WIRE_FEAT_ALIVE) && !conn_window_test();
}

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

    if (!conn->tx_free_top || !conn_can_spend_ctrl_locked(conn) ||
        !exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return 0;
    exs__conn_ctrl_append_locked(conn, &ping, sizeof(ping));
    conn->ka_ping = 1;
    conn->stats.keepalive_probes++;
    exs__conn_ctrl_flush_locked(conn); /* a failed post resets the conn */
    return 1;
}

/* A NOP record came (flags: its hdr.flags). A PING is answered once per progress pass
 * (conn_ka_answer_locked), however many came; from a peer without feature ALIVE it is a
 * protocol error. -EPROTO on a violation. */
static int conn_ka_on_nop_locked(struct exs_conn *conn, uint8_t flags)
{
    if (!(flags & EXS_NOP_PING))
        return 0;
    if (!conn_ka_alive(conn)) {
        EXS_INFO(PROTO, "conn %p: keepalive PING from a peer without feature ALIVE", (void *)conn);
        return -EPROTO;
    }
    conn->ka_answer = 1;
    return 0;
}

/* Answer the peer's PING (progress pass, before the flush): a NOP (credits only) unless
 * records already wait to go, which answer as well (any SEND of ours is a receive at the
 * peer). One answer at most is pending: PINGs that come while it waits for a credit are
 * answered by it. Never wakes the application. */
static void conn_ka_answer_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr nop = {
        .type = EXS_CTRL_NOP,
        .len = htobe16(EXS_WIRE_NOP_LEN),
    };

    if (!conn->ka_answer)
        return;
    conn->ka_answer = 0;
    if (conn->ctrl_len || !exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return; /* the waiting records answer */
    exs__conn_ctrl_append_locked(conn, &nop, sizeof(nop));
    conn->stats.keepalive_answers++;
}

/* The probe of this silent interval: a PING with feature ALIVE (a failed post resets the
 * conn there: the caller sees its state), else the zero-byte WRITE unless one is still
 * outstanding. 0, or -errno when the WRITE's post failed. */
static int conn_ka_send_probe_locked(struct exs_conn *conn)
{
    if (!conn_ka_alive(conn))
        return conn->ka_probe_out ? 0 : conn_ka_probe_locked(conn);
    if (!conn->ka_ping)
        conn_ka_ping_locked(conn);
    return 0;
}

/* Keepalive (spec/protocol.md §9.1): after an interval without a successful completion
 * (with feature ALIVE: without a receive) a probe goes out, and each further interval
 * without one counts as a failed probe (an earlier probe still outstanding serves:
 * completions come in posting order; a PING that could not go is tried again at each
 * look). So a peer that went silent at L is dead at L + interval x (probes + 1).
 * *due_p: when to look again. 1 when the peer is dead. */
static int conn_ka_check_locked(struct exs_conn *conn, uint64_t now, uint64_t intv_ns,
                                uint64_t *due_p)
{
    uint64_t probes = __atomic_load_n(&exs__params.keepalive_probes, __ATOMIC_RELAXED);
    const uint64_t slack = 1000000u; /* 1 ms early still counts: timers are not exact */

    if (!conn->ka_waiting || conn->ka_heard_ns > conn->ka_probe_ns) {
        conn->ka_waiting = 0;
        conn->ka_fails = 0;
        conn->ka_ping = 0;
        if (now + slack < conn->ka_heard_ns + intv_ns) {
            *due_p = conn->ka_heard_ns + intv_ns;
            return 0;
        }
        if (conn_ka_send_probe_locked(conn)) {
            exs__conn_fail_locked(conn, ECONNRESET, "keepalive probe failed");
            return 0;
        }
        conn->ka_waiting = 1;
        conn->ka_probe_ns = now;
        *due_p = now + intv_ns;
        return 0;
    }
    if (now + slack < conn->ka_probe_ns + (conn->ka_fails + 1) * intv_ns) {
        *due_p = conn->ka_probe_ns + (conn->ka_fails + 1) * intv_ns;
        return 0;
    }
    if (conn_ka_alive(conn) && !conn->ka_ping) {
        conn_ka_ping_locked(conn); /* the PING could not go until now */
        if (conn->state != EXS_CONN_CONNECTED && conn->state != EXS_CONN_CLOSING)
            return 0; /* its post failed: reset */
    }
    if (++conn->ka_fails < probes) {
        *due_p = conn->ka_probe_ns + (conn->ka_fails + 1) * intv_ns;
        return 0;
    }
    conn->stats.keepalive_timeouts = 1;
    EXS_INFO(PROTO, "conn %p: keepalive: %u probe intervals without an answer: peer dead",
             (void *)conn, conn->ka_fails);
    return 1;
}

/* Do queued sends move? Waiting sends with no data write completed for the whole
 * deadline mean a peer that stopped returning credits, ring space or ADVERTs (it may
 * still answer probes). 1 when the deadline passed. */
static int conn_stall_check_locked(struct exs_conn *conn, uint64_t now, uint64_t limit_ms)
{
    struct exs_list *pos;
    int waiting = 0;

    exs_list_for_each(pos, &conn->sendq) {
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
    exs_list_for_each(pos, &conn->sendq)
        if (exs_list_entry(pos, struct exs_op, link)->state == EXS_OPS_QUEUED)
            return 1;
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

    if (!conn->owed || (conn_window_test() & EXS_WINDOW_TEST_NO_NOP))
        return;
    if (conn->owed < conn->p.credits - 1 && !conn_sends_starved_locked(conn))
        return;
    if (!conn->tx_free_top || !conn_can_spend_ctrl_locked(conn))
        return; /* our own window is empty: the peer's next message returns credits */
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_NOP_LEN))
        return; /* records wait that cannot go: they carry the credits when they do */
    EXS_DBG(PROTO, "conn %p: window check: %u credits owed, %u left: NOP", (void *)conn,
            conn->owed, conn->credits);
    exs__conn_ctrl_append_locked(conn, &nop, sizeof(nop));
    if (exs__conn_ctrl_flush_locked(conn)) {
        conn->stats.nops_sent++;
        EXS_CNT_INC(exs__proto_cnt.nops_sent);
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
    conn_dead_locked(conn, conn->err ? conn->err : ETIMEDOUT, "ended handshake not drained");
    conn->cb->dead(conn);
    return 0;
}

uint64_t exs__conn_timer(struct exs_conn *conn, uint64_t ka_ms)
{
    uint64_t now = exs__now_ns(), next = 0, ka_due = 0, ring_ms;
    uint64_t conn_ms = __atomic_load_n(&exs__params.connect_timeout_ms, __ATOMIC_RELAXED);
    uint64_t send_ms = __atomic_load_n(&exs__params.send_timeout_ms, __ATOMIC_RELAXED);

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    switch (conn->state) {
    case EXS_CONN_CONNECTING: {
        uint64_t due = conn->dl_start_ns + conn_ms * 1000000u;

        if (now < due) {
            next = (due - now + 999999u) / 1000000u;
            break;
        }
        EXS_INFO(PROTO, "conn %p: %s not established after %llu ms", (void *)conn,
                 conn->active ? "connect" : "accepted connection", (unsigned long long)conn_ms);
        conn_dead_locked(conn, ETIMEDOUT, "handshake timed out");
        conn->cb->established(conn, ETIMEDOUT);
        break;
    }
    case EXS_CONN_DOWN:
    case EXS_CONN_DRAINING:
        next = conn->hs_down ? conn_hs_down_timer_locked(conn, now, conn_ms) : 0;
        break;
    case EXS_CONN_RESUMING:
        next = exs__resume_timer_locked(conn, now, conn_ms);
        break;
    case EXS_CONN_CONNECTED:
    case EXS_CONN_CLOSING:
        if (conn->rsm_peer_wait) { /* the new path until the peer's RESUME (§9.2) */
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
        ring_ms = conn_is_stream(conn) ? exs__st_ring_timer_locked(conn, now / 1000u) : 0;
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
        if (conn->sess_token && !conn->rsm_over && conn_ms)
            next = next ? EXS_MIN(next, EXS_MAX(conn_ms / 4, 1)) : EXS_MAX(conn_ms / 4, 1);
        break;
    default:
        break;
    }
    if (conn->rsm_pend) /* a resume request on trial: bounded by connect_timeout_ms (§9.2) */
        next = exs__resume_pend_timer_locked(conn, now, conn_ms, next);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    exs__resume_evict_run(); /* connections a keepalive cut made give up (§9.2) */
    return next;
}

void exs__conn_stats(struct exs_conn *conn, struct exs_sock_stats *st)
{
    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    *st = conn->stats;
    st->batch_thresh = conn->batch_thresh;
    st->ring_size = conn->p.ring_size;
    if (conn_is_stream(conn))
        exs__st_stats_locked(conn, st);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_info(struct exs_conn *conn, struct exs_conn_info *info)
{
    exs__conn_stats(conn, &info->stats);
    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    info->state = conn_state_names[conn->state];
    info->phase = conn->p.sock_type != SOCK_STREAM     ? ""
                  : PHASE_IS_DIRECT(conn->st_ps) ? "direct"
                                                 : "indirect";
    info->credits = conn->credits;
    info->peer_credits = conn->peer.credits;
    info->wr_out = conn->wr_out;
    info->pending = conn->pending_count;
    info->adverts_held = conn->adv_count;
    info->wr_queued = conn->wrq_count;
    info->age_ms = (exs__now_ns() - conn->created_ns) / 1000000u;
    info->device = exs__prov_device(conn->ctx);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

/* ---- completions (progress lock held: the progress thread or a driving waiter) ---- */

static int conn_on_ctrl_locked(struct exs_conn *conn, const uint8_t *buf, uint32_t len)
{
    uint32_t off = 0;

    while (off < len) {
        struct exs_wire_ctrl_hdr h;
        uint32_t rlen, want = 0;

        if (len - off < EXS_WIRE_CTRL_HDR_LEN)
            return -EPROTO;
        memcpy(&h, buf + off, sizeof(h));
        rlen = be16toh(h.len);
        if (rlen < EXS_WIRE_CTRL_HDR_LEN || rlen % 8 || rlen > len - off)
            return -EPROTO;
        switch (h.type) {
        case EXS_CTRL_ACK: want = EXS_WIRE_ACK_LEN; break;
        case EXS_CTRL_ADVERT: want = EXS_WIRE_ADVERT_LEN; break;
        case EXS_CTRL_ANNOUNCE: want = EXS_WIRE_ANNOUNCE_LEN; break;
        case EXS_CTRL_READ_DONE: want = EXS_WIRE_READ_DONE_LEN; break;
        case EXS_CTRL_SHUTDOWN: want = EXS_WIRE_SHUTDOWN_LEN; break;
        case EXS_CTRL_NOP: want = EXS_WIRE_NOP_LEN; break;
        case EXS_CTRL_RING: want = EXS_WIRE_RING_LEN; break;
        case EXS_CTRL_DRAIN: want = EXS_WIRE_DRAIN_LEN; break;
        case EXS_CTRL_TRACE: want = EXS_WIRE_TRACE_LEN; break;
        case EXS_CTRL_RESIZE: want = EXS_WIRE_RESIZE_LEN; break;
        case EXS_CTRL_SESSION: want = EXS_WIRE_SESSION_LEN; break;
        case EXS_CTRL_RESUME: want = EXS_WIRE_RESUME_LEN; break;
        case EXS_CTRL_AUTH: /* taken by a resume request on trial only (§9.2): on a
                             * connection, a second one, or one on a first path */
            EXS_INFO(PROTO, "conn %p: AUTH record where none may come", (void *)conn);
            return -EPROTO;
        default: return -EPROTO;
        }
        if (rlen != want)
            return -EPROTO;
        /* the peer's RING comes first and once (§2) */
        if ((h.type == EXS_CTRL_RING) == conn->peer_ring_keyed)
            return -EPROTO;
        /* on a cut-over's new path its RESUME comes next (§9.2) */
        if (conn->rsm_peer_wait && h.type != EXS_CTRL_RING && h.type != EXS_CTRL_RESUME) {
            EXS_INFO(PROTO, "conn %p: record type %u before the peer's RESUME", (void *)conn,
                     h.type);
            return -EPROTO;
        }
        EXS_TRACE(PROTO, "conn %p: control record type %u, %u credits", (void *)conn, h.type,
                  be16toh(h.credits));
        conn->credits += be16toh(h.credits);
        if (conn->credits > conn->peer.credits)
            return -EPROTO;

        const uint8_t *rec = buf + off;
        switch (h.type) {
        case EXS_CTRL_ACK: {
            struct exs_wire_ack a;
            memcpy(&a, rec, sizeof(a));
            uint64_t c = be64toh(a.ring_consumed);
            if (c - conn->wr_consumed > conn->wr_tail - conn->wr_consumed)
                return -EPROTO;
            conn->wr_consumed = c;
            break;
        }
        case EXS_CTRL_ADVERT: {
            struct exs_wire_advert w;
            memcpy(&w, rec, sizeof(w));
            struct exs_advert a = {
                .addr = be64toh(w.addr),
                .len = be32toh(w.len),
                .rkey = be32toh(w.rkey),
                .seq = be64toh(w.seq),
                .id = be32toh(w.id),
                .phase = be32toh(w.phase),
                .flags = w.hdr.flags,
            };
            int ret = conn_is_stream(conn) ? exs__st_on_advert_locked(conn, &a)
                                           : exs__sp_on_advert_locked(conn, &a);
            if (ret)
                return ret == -ENOBUFS ? ret : -EPROTO;
            break;
        }
        case EXS_CTRL_ANNOUNCE: {
            struct exs_wire_announce a;
            memcpy(&a, rec, sizeof(a));
            int ret = conn_is_stream(conn) ? -EPROTO : exs__sp_on_announce_locked(conn, &a);
            if (ret)
                return ret == -ENOBUFS ? ret : -EPROTO;
            break;
        }
        case EXS_CTRL_READ_DONE: {
            struct exs_wire_read_done d;
            memcpy(&d, rec, sizeof(d));
            if (conn_is_stream(conn) || exs__sp_on_read_done_locked(conn, be64toh(d.seq)))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_RING: {
            struct exs_wire_ring r;
            memcpy(&r, rec, sizeof(r));
            conn->peer.ring_rkey = be32toh(r.rkey);
            conn->peer_ring_keyed = 1;
            break;
        }
        case EXS_CTRL_DRAIN: {
            struct exs_wire_drain d;
            memcpy(&d, rec, sizeof(d));
            if (exs__st_on_drain_locked(conn, &d))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_TRACE: {
            struct exs_wire_trace t;
            memcpy(&t, rec, sizeof(t));
            if (exs__rt_on_record_locked(conn, &t))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_RESIZE: {
            struct exs_wire_resize r;
            memcpy(&r, rec, sizeof(r));
            if (exs__st_on_resize_locked(conn, &r))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_SESSION: {
            struct exs_wire_session s;
            memcpy(&s, rec, sizeof(s));
            if (exs__resume_on_session_locked(conn, &s))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_RESUME: {
            struct exs_wire_resume r;
            memcpy(&r, rec, sizeof(r));
            if (exs__resume_on_resume_locked(conn, &r))
                return -EPROTO;
            break;
        }
        case EXS_CTRL_SHUTDOWN: {
            struct exs_wire_shutdown s;
            memcpy(&s, rec, sizeof(s));
            /* everything the peer sent came before its SHUTDOWN on the one ordered
             * path, so its count is exactly what arrived (§8): a count above it would
             * leave receives waiting for data that never comes */
            if (conn->peer_shut || be64toh(s.seq) != exs__resume_arrived_locked(conn) ||
                conn->sp_rx_frag)
                return -EPROTO;
            conn->peer_shut = 1;
            conn->peer_total = be64toh(s.seq);
            break;
        }
        case EXS_CTRL_NOP:
            if (conn_ka_on_nop_locked(conn, h.flags))
                return -EPROTO;
            break;
        default:
            break;
        }
        off += rlen;
    }
    return 0;
}

static void conn_on_rx_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe, uint32_t slot)
{
    int ret = 0;

    if (cqe->opcode == EXS_PROV_WC_RECV) {
        ret = conn_on_ctrl_locked(conn, conn->rx_bufs + (size_t)slot * EXS_WIRE_CTRL_MAX,
                                  cqe->byte_len);
    } else if (cqe->opcode == EXS_PROV_WC_RECV_RDMA_WITH_IMM &&
               (cqe->flags & EXS_PROV_WC_WITH_IMM)) {
        conn->credits += exs_imm_credits(cqe->imm_data);
        if (conn->credits > conn->peer.credits || conn->rsm_peer_wait)
            ret = -EPROTO;
        else
            ret = conn_is_stream(conn) ? exs__st_on_data_locked(conn, cqe->imm_data, cqe->byte_len)
                                       : exs__sp_on_data_locked(conn, cqe->imm_data, cqe->byte_len);
    } else {
        ret = -EPROTO;
    }
    if (ret) {
        exs__conn_fail_locked(conn, ECONNRESET,
                              ret == -ENOBUFS ? "memory budget (EXS_MEM_BUDGET) reached"
                                              : "peer broke the protocol");
        return;
    }
    if (EXS_RT_ON && conn->rt)
        exs__rt_arrival_locked(conn);
    if (conn->state >= EXS_CONN_DOWN || (conn->state == EXS_CONN_RESUMING && !conn->rsm_newpath))
        return; /* going away, or the old path of a cut-over: the slot is not needed any more */
    if (conn_post_rx_locked(conn, slot)) {
        exs__conn_fail_locked(conn, ECONNRESET, "receive re-post failed");
        return;
    }
    conn->owed++;
}

/* A control SEND completes once the peer's NIC acknowledged it: one round-trip sample
 * (spec/protocol.md §7.4), smoothed as TCP does (srtt += (sample - srtt) / 8). */
static void conn_rtt_sample_locked(struct exs_conn *conn, uint64_t t_us)
{
    uint64_t now = exs__now_us(), rtt;

    if (!t_us || now < t_us)
        return;
    rtt = EXS_MAX(now - t_us, (uint64_t)1);
    conn->stats.srtt_us = conn->stats.srtt_us ? (7 * conn->stats.srtt_us + rtt + 4) / 8 : rtt;
    /* the path's own round trip, without the time samples wait in queues (§7.4) */
    if (!conn->rs_rtt_min || rtt <= conn->rs_rtt_min ||
        now - conn->rs_rtt_min_t > EXS_RTT_MIN_WIN_US) {
        conn->rs_rtt_min = rtt;
        conn->rs_rtt_min_t = now;
    }
}

/* One completion, conn->lock held; the caller kicks the conn afterwards. */
static void conn_on_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    unsigned tag = cqe->wr_id & WR_TAG_MASK;
    uint64_t val = cqe->wr_id & ~(uint64_t)WR_TAG_MASK;

    if (conn->state == EXS_CONN_DEAD)
        return;
    conn->cqe_stamp++;
    conn->wr_out--;
    if (cqe->status != EXS_PROV_WC_SUCCESS) {
        if (cqe->status == EXS_PROV_WC_RNR_RETRY_EXC_ERR) {
            /* the credits make it impossible (§3.1): a peer or library bug */
            conn->stats.rnr_events++;
            EXS_CNT_INC(exs__proto_cnt.rnr_events);
        }
        if (cqe->status != EXS_PROV_WC_WR_FLUSH_ERR)
            EXS_WARN(PROTO, "conn %p: work request failed: %s", (void *)conn,
                     exs__prov_wc_status_str(cqe->status));
        if (tag == WR_TAG_READ)
            conn->reads--;
        if (tag == WR_TAG_DATA || tag == WR_TAG_RING || tag == WR_TAG_READ) {
            /* the op is alive: none is handed back while a work request of its own is
             * outstanding; a cancelled one completes with its last one */
            struct exs_op *op = (struct exs_op *)(uintptr_t)val;

            EXS_ASSERT(op->inflight > 0 && op->state == EXS_OPS_POSTED);
            if (--op->inflight == 0 && op->cancel && conn->state >= EXS_CONN_DOWN)
                exs__conn_op_finish_locked(op, -1, ECANCELED);
        } else if (tag == WR_TAG_BATCH) {
            exs__batch_on_cqe_locked(conn, (uint32_t)(val >> 3), 0);
        }
        if (cqe->status == EXS_PROV_WC_WR_FLUSH_ERR && conn->state == EXS_CONN_CONNECTED &&
            conn->sess_token && !conn->rsm_over)
            return; /* a consequence: the endpoint's DISCONNECTED, which follows, says
                     * whether the path failed or the peer closed (§9.2, When) */
        if (exs__resume_begin_locked(conn, "error completion", 0, 0))
            return; /* cut over (§9.2): the op is sent again over the new path */
        /* while connecting, the cm event tells what happened */
        if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING)
            exs__conn_fail_locked(conn, ECONNRESET, "work request failed");
        return;
    }
    /* the peer answered: keepalive has nothing to probe this interval (§9.1). With
     * feature ALIVE only a receive counts (the peer's library posted it); without it any
     * completion does (a send the peer's NIC acknowledged) */
    if (tag == WR_TAG_RX || !conn_ka_alive(conn))
        conn->ka_heard = 1;
    switch (tag) {
    case WR_TAG_RX:
        conn_on_rx_locked(conn, cqe, (uint32_t)(val >> 3));
        break;
    case WR_TAG_CTRL: {
        uint32_t slot = (uint32_t)(val >> 3);
        struct exs_ctrl_tx tx = conn->tx_op[slot];

        conn->tx_op[slot] = (struct exs_ctrl_tx){ 0 };
        conn->tx_free[conn->tx_free_top++] = slot;
        conn_rtt_sample_locked(conn, tx.t_us);
        if (tx.op)
            exs__conn_op_finish_locked(tx.op, 0, 0);
        if (tx.shut) {
            conn_set_txshut(conn, EXS_TXSHUT_DONE, "control send completed");
            if (conn->state == EXS_CONN_CLOSING) {
                conn_set_state(conn, EXS_CONN_DOWN, "closed");
                exs__prov_disconnect(conn->ep);
            }
        }
        break;
    }
    case WR_TAG_BATCH:
        conn->tx_moved++;
        exs__batch_on_cqe_locked(conn, (uint32_t)(val >> 3), 1);
        break;
    case WR_TAG_KA:
        conn->ka_probe_out = 0;
        break;
    case WR_TAG_RING:
        conn->ring_wr_out--;
        /* fall through */
    case WR_TAG_DATA: {
        struct exs_op *op = (struct exs_op *)(uintptr_t)val;

        conn->tx_moved++;
        /* writes of one op complete in order: the op is done with its last one (a
         * cancelled one from DOWN on, when no more of it will be posted) */
        EXS_ASSERT(op->inflight > 0 && op->state == EXS_OPS_POSTED);
        if (--op->inflight == 0 && op->posted == op->len) {
            exs__conn_op_finish_locked(op, (ssize_t)op->len, 0);
            exs__resume_tx_done_locked(conn, op);
            if (!op->internal) /* a copy counted when its send completed (§7.5) */
                conn->stats.bytes_sent += op->len;
        } else if (!op->inflight && op->cancel && conn->state >= EXS_CONN_DOWN) {
            exs__conn_op_finish_locked(op, -1, ECANCELED);
        }
        break;
    }
    case WR_TAG_READ:
        conn->reads--;
        exs__sp_on_read_cqe_locked(conn, (struct exs_op *)(uintptr_t)val);
        break;
    default:
        exs__conn_fail_locked(conn, ECONNRESET, "unknown completion");
        break;
    }
}

/* A completion from the provider: a send work request leaves the cap's count. */
static void conn_on_prov_cqe_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    if (conn->rsm_pend && exs__resume_pend_cqe_locked(conn, cqe))
        return; /* a resume request's new path, on trial (§9.2) */
    if ((cqe->wr_id & WR_TAG_MASK) != WR_TAG_RX && conn->sq_out)
        conn->sq_out--;
    conn_on_cqe_locked(conn, cqe);
}

/* After a run of completions of conn: queued work requests into the room they made,
 * progress once, and the end once drained. */
static void conn_after_cqes_locked(struct exs_conn *conn)
{
    if (conn->wrq_count) {
        if (conn->state == EXS_CONN_CONNECTED || conn->state == EXS_CONN_CLOSING)
            conn_wrq_post_locked(conn);
        if ((conn->state >= EXS_CONN_DOWN && conn->state != EXS_CONN_DEAD) ||
            conn->state == EXS_CONN_RESUMING)
            conn_wrq_flush_locked(conn);
    }
    if (conn->state == EXS_CONN_RESUMING) {
        exs__resume_progress_locked(conn); /* the old path drained: the new one */
        if (conn->state == EXS_CONN_DEAD)
            return;
    }
    if (conn->state != EXS_CONN_DEAD)
        exs__conn_kick_locked(conn);
    if (conn->state == EXS_CONN_DRAINING && !conn->wr_out) {
        /* the last completion before the end: every byte that arrived was seen */
        conn_dead_locked(conn, conn->disc_err, "drained");
        conn->cb->dead(conn);
    }
}

/* After a run of completions: one that succeeded proves the peer alive (keepalive);
 * *now_p is read once per batch. */
static void conn_heard_locked(struct exs_conn *conn, uint64_t *now_p)
{
    if (!conn->ka_heard)
        return;
    conn->ka_heard = 0;
    if (!*now_p)
        *now_p = exs__now_ns();
    conn->ka_heard_ns = *now_p;
}

void exs__conn_on_cqe(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    uint64_t now = 0;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    conn_on_prov_cqe_locked(conn, cqe);
    conn_heard_locked(conn, &now);
    conn_after_cqes_locked(conn);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

void exs__conn_on_cqes(const struct exs_prov_cqe *cqe, int n)
{
    uint64_t now = 0; /* read once, when a run proves a peer alive (keepalive) */

    for (int i = 0, j; i < n; i = j) {
        struct exs_conn *conn = cqe[i].ep->user;

        /* a run of completions of one conn: one lock, one progress pass (one ACK
         * decision, one walk of the queues, one delivery) for all of them */
        EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
        for (j = i; j < n && cqe[j].ep->user == conn; j++)
            conn_on_prov_cqe_locked(conn, &cqe[j]);
        conn_heard_locked(conn, &now);
        conn_after_cqes_locked(conn);
        EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    }
    exs__resume_evict_run(); /* connections a cut made give up (§9.2, The wait) */
}

void exs__conn_on_cm(struct exs_conn *conn, const struct exs_prov_cm_event *ev)
{
    void (*established)(struct exs_conn *, int) = NULL;
    void (*dead)(struct exs_conn *) = NULL;
    int err = 0;

    EXS_MUTEX_LOCK(&conn->lock, EXS_LOCK_CONN);
    if (conn->rsm_pend && exs__resume_pend_cm_locked(conn, ev)) {
        EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN); /* a resume request's new path (§9.2) */
        return;
    }
    if (conn->state == EXS_CONN_RESUMING) { /* the cut-over's events (§9.2) */
        if (ev->type == EXS_PROV_CM_DISCONNECTED && ev->ep && ev->ep == conn->ep &&
            !conn->rsm_newpath && (ev->flags & EXS_PROV_CM_F_PEER_CLOSED))
            conn->rsm_peer_closed = 1; /* the peer closed: no cut-over after the drain */
        exs__resume_on_cm_locked(conn, ev);
        EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        exs__resume_evict_run();
        return;
    }
    if (ev->ep && ev->ep != conn->ep) { /* an endpoint the conn no longer has */
        EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
        return;
    }
    switch (ev->type) {
    case EXS_PROV_CM_ESTABLISHED:
        if (conn->state != EXS_CONN_CONNECTING)
            break;
        if (conn->active) {
            if (exs__conn_hello_check(ev->private_data, ev->private_data_len,
                                      conn->p.sock_type)) {
                conn_set_state(conn, EXS_CONN_REFUSING, "bad hello from acceptor");
                exs__prov_disconnect(conn->ep);
                break;
            }
            conn_adopt_hello_locked(conn, ev->private_data);
        }
        conn_set_state(conn, EXS_CONN_CONNECTED, "established");
        conn->ka_heard_ns = exs__now_ns(); /* the peer just answered */
        established = conn->cb->established;
        conn_ring_grant_locked(conn);
        exs__resume_established_locked(conn);
        exs__conn_kick_locked(conn);
        break;
    case EXS_PROV_CM_REJECTED:
    case EXS_PROV_CM_UNREACHABLE:
        err = ev->type == EXS_PROV_CM_REJECTED ? ECONNREFUSED
              : ev->status ? -ev->status : ECONNREFUSED;
        switch (conn->state) {
        case EXS_CONN_CONNECTING:
            conn_dead_locked(conn, err, "connect failed");
            established = conn->cb->established;
            break;
        case EXS_CONN_REFUSING:
            conn_dead_locked(conn, ECONNREFUSED, "refused");
            established = conn->cb->established;
            err = ECONNREFUSED;
            break;
        case EXS_CONN_DOWN: /* closed while connecting */
            conn_dead_locked(conn, err, "connect failed after close");
            dead = conn->cb->dead;
            break;
        default:
            break;
        }
        break;
    case EXS_PROV_CM_DISCONNECTED:
        switch (conn->state) {
        case EXS_CONN_CONNECTING:
        case EXS_CONN_REFUSING:
            err = ECONNREFUSED;
            conn_dead_locked(conn, err, "refused");
            established = conn->cb->established;
            break;
        case EXS_CONN_CONNECTED:
        case EXS_CONN_CLOSING:
        case EXS_CONN_DOWN:
            /* Completions of what arrived before the end may still be on their way (a
             * connection event can overtake them on verbs): the conn dies once every work
             * request it posted has completed (flushed, at the latest). */
            err = ev->status ? -ev->status : ECONNRESET;
            /* a peer that closed its endpoint ended the connection: not a path failure,
             * never cut over (§9.2, When) */
            if (!(ev->flags & EXS_PROV_CM_F_PEER_CLOSED) &&
                exs__resume_begin_locked(conn, "disconnected", 1, 0)) {
                exs__resume_progress_locked(conn);
                break; /* cut over (§9.2) */
            }
            conn_set_state(conn, EXS_CONN_DRAINING, "disconnected");
            conn->disc_err = err;
            conn_wrq_flush_locked(conn); /* never posted: flushed here */
            if (!conn->wr_out) {
                conn_dead_locked(conn, err, "drained");
                dead = conn->cb->dead;
            }
            break;
        default: /* IDLE, DRAINING, DEAD: nothing (more) to end */
            break;
        }
        break;
    default:
        break;
    }
    if (established)
        established(conn, err);
    if (dead)
        dead(conn);
    EXS_MUTEX_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    exs__resume_evict_run(); /* those a cut made give up (§9.2, The wait) */
}

/* ---- for the cut-over (resume.c, spec/protocol.md §9.2) ---- */

void exs__conn_set_state_locked(struct exs_conn *conn, enum exs_conn_state st, const char *why)
{
    conn_set_state(conn, st, why);
}

void exs__conn_end_locked(struct exs_conn *conn, int err, const char *why)
{
    conn_set_state(conn, EXS_CONN_DOWN, why);
    conn_dead_locked(conn, err, why);
    conn->cb->dead(conn);
}

void exs__conn_revoke_all_locked(struct exs_conn *conn)
{
    conn_revoke_all_locked(conn);
}

void exs__conn_adopt_hello_locked(struct exs_conn *conn, const void *pd)
{
    conn_adopt_hello_locked(conn, pd);
}

void exs__conn_ring_grant_locked(struct exs_conn *conn)
{
    conn_ring_grant_locked(conn);
}

void exs__conn_wrq_flush_locked(struct exs_conn *conn)
{
    conn_wrq_flush_locked(conn);
}

int exs__conn_path_make(struct exs_conn *conn, struct exs_prov_ctx *ctx, enum exs_mem_kind kind,
                        struct exs_conn_path *path)
{
    struct exs_prov_ep_attr attr = {
        .max_send_wr = conn->p.credits + conn->p.max_reads + conn->tx_slots + 8,
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

void exs__conn_on_rx_held_locked(struct exs_conn *conn, const struct exs_prov_cqe *cqe)
{
    conn_on_rx_locked(conn, cqe, (uint32_t)((cqe->wr_id & ~(uint64_t)WR_TAG_MASK) >> 3));
}

void exs__proto_fork_child(void)
{
    exs__resume_fork_child();
    conn_live = 0;
    conn_ring_bytes = 0;
}
