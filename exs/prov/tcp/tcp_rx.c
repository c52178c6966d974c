/* SPDX-License-Identifier: MIT */
/* The tcp provider's receive engine: frame parsing, checks, placement, ACK/NAK, RNR and READ
 * responses. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <sys/epoll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- receive (NIC) ---- */

#if defined(__SANITIZE_THREAD__)
int exs__tcp_tsan_token;
#endif

static void tcp_conn_proto_err(struct tcp_conn *conn, const char *why)
{
    EXS_ERR(PROV, "conn %p ep %p: protocol error: %s (type %u psn %u len %u)", (void *)conn,
            (void *)conn->ep, why, conn->rh.type, conn->rh.psn, conn->rh.len);
    EXS_CNT_INC(conn->ctx->cnt.protocol_errors);
    exs__tcp_conn_fail(conn, -EPROTO, 0, 0, TCP_END_QUIET);
}

/* Queue the ACK owed (or move the psn of a queued, unstarted one). */
void exs__tcp_conn_ack_flush(struct tcp_conn *conn)
{
    struct tcp_txf *f;

    if (!conn->ack_count || conn->state != TCP_CONN_UP)
        return;
    conn->ack_count = 0;
    if (conn->ack_txf && !exs__tcp_emu_on(conn->ctx)) {
        conn->ack_txf->hdr.psn = htonl(conn->ack_psn);
        return;
    }
    f = exs__tcp_txf_ctrl(conn, TCP_WIRE_ACK, 0);
    if (!f)
        return;
    f->hdr.psn = htonl(conn->ack_psn);
    conn->ack_txf = f;
    exs__tcp_txq_push(conn, f);
}

static void tcp_conn_nak(struct tcp_conn *conn, uint8_t syn, int status)
{
    exs__tcp_conn_fail(conn, status, syn, conn->rh.psn, TCP_END_QUIET);
}

void exs__tcp_conn_ack_undefer(struct tcp_conn *conn)
{
    if (!conn->ack_deferred)
        return;
    exs_list_del(&conn->ack_link);
    conn->ack_deferred = 0;
    __atomic_sub_fetch(&conn->ctx->acks_deferred, 1, __ATOMIC_RELAXED);
}

/* End of reading: the ACK owed leaves now, or (MANUAL_PROGRESS, in a turn with
 * epoll_wait, no link emulation) is deferred to the next frame written on this
 * connection or the start of the next turn, whichever comes first (spec: "ACK
 * deferral"), so that a reply posted meanwhile carries it in the same sendmsg. */
static void tcp_conn_ack_later(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;

    if (!conn->ack_count)
        return;
    if (!ctx->manual || !ctx->rx_turn || exs__tcp_emu_on(ctx)) {
        exs__tcp_conn_ack_flush(conn);
        return;
    }
    if (conn->ack_deferred)
        return;
    conn->ack_deferred = 1;
    if (exs_list_empty(&ctx->ack_defer))
        ctx->ack_defer_ns = exs__now_ns();
    EXS_CNT_INC(ctx->cnt.acks_deferred);
    exs_list_add_tail(&ctx->ack_defer, &conn->ack_link);
    __atomic_add_fetch(&ctx->acks_deferred, 1, __ATOMIC_RELAXED);
}

/* Give back what the receive state holds (conn failing or closing). */
void exs__tcp_rx_release(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;

    if (conn->rx_key) {
        exs__tcp_key_put(conn->ctx, conn->rx_key);
        conn->rx_key = NULL;
    }
    if (conn->rx_rwr) {
        if (ep) {
            pthread_mutex_lock(&ep->lock);
            exs_list_add_head(&ep->rq, &conn->rx_rwr->link);
            pthread_mutex_unlock(&ep->lock);
        } else {
            free(conn->rx_rwr);
        }
        conn->rx_rwr = NULL;
    }
    conn->rx_wr = NULL;
    conn->rx_phase = TCP_RX_HDR;
    conn->rx_retry = 0;
    conn->rx_discard = 0;
    conn->hold_resp = 0;
    conn->hgot = 0;
    conn->stg_off = conn->stg_len = 0; /* read ahead for a request that no longer matters */
    conn->rnr_at = 0;
}

/* The pause between RNR retries: this ep's timer (or the tunable), or the
 * requester's when that is longer. */
static uint32_t tcp_conn_rnr_ms(const struct tcp_conn *conn)
{
    const struct tcp_ep *ep = conn->ep;
    uint32_t ms = ep->base.attr.rnr_timer_ms ? ep->base.attr.rnr_timer_ms : ep->ctx->rnr_timer_ms;

    return EXS_MAX(ms, (uint32_t)conn->peer_rnr_timer_ms);
}

/* Consume the current frame's payload into a sink. */
static void tcp_conn_rx_discard(struct tcp_conn *conn)
{
    if (conn->rx_key) {
        exs__tcp_key_put(conn->ctx, conn->rx_key);
        conn->rx_key = NULL;
    }
    conn->rx_seg = NULL;
    conn->rx_nseg = 0;
    conn->rx_len = conn->rh.len;
    conn->rx_off = 0;
    conn->rx_discard = conn->rh.len != 0;
    conn->rx_phase = conn->rh.len ? TCP_RX_PAYLOAD : TCP_RX_HDR;
}

/* The held request is given up: the requester is gone or out of retries. Later
 * requests already in flight are consumed and dropped (as a responder drops
 * packets after a NAK); the connection itself lives on until a disconnect. */
static void tcp_conn_drop_held(struct tcp_conn *conn)
{
    conn->rnr_at = 0;
    conn->hold_resp = 0;
    conn->rnr_tries = 0;
    exs__tcp_conn_timer(conn);
    conn->rx_drop = 1;
    conn->ack_count = 0; /* the NAK (if any) acknowledges everything before it */
    tcp_conn_rx_discard(conn);
}

/* SEND or WRITE_WITH_IMM needs a receive: 1 got it, 0 holding (RNR), -1 dropped (NAK sent). */
static int tcp_conn_take_recv(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;
    struct tcp_ctx *ctx = conn->ctx;
    struct exs_list *l;
    struct tcp_txf *f;
    uint64_t ms;

    /* the receive keeps its place in rq_count until its completion is queued */
    pthread_mutex_lock(&ep->lock);
    l = exs_list_pop_head(&ep->rq);
    pthread_mutex_unlock(&ep->lock);
    if (l) {
        struct exs_soft_rwr *rwr = exs_list_entry(l, struct exs_soft_rwr, link);

        /* the local key checked when the receive is used, as hardware does at placement:
         * compares of the ep's memo and one load while no region died (no lock) */
        rwr->bad = 0;
        if (!exs__soft_local_memo_hit(&ctx->keys, &ep->rq_memo, rwr->sge, rwr->num_sge,
                                      EXS_PROV_ACCESS_LOCAL_WRITE)) {
            pthread_mutex_lock(&ctx->mr_lock);
            rwr->bad = exs__soft_check_local_memo_slow_locked(&ctx->keys, &ep->rq_memo, rwr->sge,
                                                              rwr->num_sge,
                                                              EXS_PROV_ACCESS_LOCAL_WRITE) != 0;
            pthread_mutex_unlock(&ctx->mr_lock);
        }
        conn->rx_rwr = rwr;
        conn->rnr_tries = 0;
        return 1;
    }
    if (conn->peer_rnr_retry >= 7 || conn->rnr_tries < conn->peer_rnr_retry) {
        conn->rnr_tries++;
        EXS_CNT_INC(ctx->cnt.rnr_waits);
        ms = tcp_conn_rnr_ms(conn);
        conn->rx_phase = TCP_RX_HOLD;
        conn->rnr_at = exs__now_ns() + (ms ? ms * 1000000u : 100000u);
        exs__tcp_conn_timer(conn);
        exs__tcp_conn_update_events(conn);
        EXS_DBG(PROV, "ep %p: receiver not ready, psn %u, try %u", (void *)ep, conn->rh.psn,
                conn->rnr_tries);
        return 0;
    }
    EXS_CNT_INC(ctx->cnt.rnr_naks);
    EXS_DBG(PROV, "ep %p: receiver not ready, retries exhausted, psn %u", (void *)ep, conn->rh.psn);
    f = exs__tcp_txf_ctrl(conn, TCP_WIRE_NAK, 0);
    if (f) {
        f->hdr.syndrome = TCP_WIRE_SYN_RNR_EXC;
        f->hdr.psn = htonl(conn->rh.psn);
        exs__tcp_txq_push(conn, f);
    }
    tcp_conn_drop_held(conn);
    return -1;
}

/* NIC: the peer shut its side while a request was held: drop the request and
 * read on (a DISCONNECT behind it gives status 0, a bare EOF -ECONNRESET). */
void exs__tcp_conn_hold_hup(struct tcp_conn *conn)
{
    if (conn->state != TCP_CONN_UP || conn->rx_phase != TCP_RX_HOLD) {
        exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, TCP_END_ABORT);
        return;
    }
    tcp_conn_drop_held(conn);
    exs__tcp_conn_update_events(conn);
    exs__tcp_conn_rx(conn);
}

/* Receive completion of the frame just finished (or failed). */
static void tcp_conn_recv_done(struct tcp_conn *conn, enum exs_prov_wc_status st)
{
    struct tcp_ep *ep = conn->ep;
    struct exs_soft_rwr *rwr = conn->rx_rwr;
    struct exs_prov_cqe cqe;

    conn->rx_rwr = NULL;
    exs__tcp_rwr_cqe(ep, rwr, st, &cqe);
    if (conn->rh.type == TCP_WIRE_WRITE)
        cqe.opcode = EXS_PROV_WC_RECV_RDMA_WITH_IMM;
    if (st == EXS_PROV_WC_SUCCESS) {
        cqe.byte_len = conn->rh.len;
        if (conn->rh.flags & TCP_WIRE_F_IMM) {
            cqe.imm_data = conn->rh.imm;
            cqe.flags = EXS_PROV_WC_WITH_IMM;
        }
    }
    pthread_mutex_lock(&ep->lock);
    ep->rq_count--;
    exs__tcp_cq_push(conn->ctx, ep, &cqe);
    exs__tcp_rwr_put_locked(ep, rwr);
    pthread_mutex_unlock(&ep->lock);
}

/* The receive taken for the current SEND cannot hold it: it completes with st,
 * the requester gets NAK syn, the connection ends. */
static void tcp_conn_recv_fail(struct tcp_conn *conn, enum exs_prov_wc_status st, uint8_t syn)
{
    struct exs_soft_rwr *rwr = conn->rx_rwr;
    struct exs_prov_cqe cqe;

    conn->rx_rwr = NULL;
    exs__tcp_rwr_cqe(conn->ep, rwr, st, &cqe);
    /* back to the ep's pool, as every completed receive (before the completion: whoever
     * sees it finds the block there) */
    pthread_mutex_lock(&conn->ep->lock);
    exs__tcp_rwr_put_locked(conn->ep, rwr);
    pthread_mutex_unlock(&conn->ep->lock);
    exs__tcp_conn_fail_cqe(conn, -ECONNABORTED, syn, conn->rh.psn, TCP_END_QUIET, &cqe);
}

/* A request (SEND / WRITE / READ_REQ) was carried out. */
static void tcp_conn_req_done(struct tcp_conn *conn)
{
    conn->ack_psn = conn->rcv_nxt++;
    if (++conn->ack_count >= TCP_ACK_EVERY)
        exs__tcp_conn_ack_flush(conn);
}

static void tcp_conn_payload_done(struct tcp_conn *conn)
{
    struct tcp_ep *ep = conn->ep;

    conn->rx_phase = TCP_RX_HDR;
    if (conn->rx_discard) {
        conn->rx_discard = 0;
        return;
    }
    switch (conn->rh.type) {
    case TCP_WIRE_SEND:
        tcp_conn_recv_done(conn, EXS_PROV_WC_SUCCESS);
        tcp_conn_req_done(conn);
        break;
    case TCP_WIRE_WRITE:
        if (conn->rx_key) {
            exs__tcp_key_put(conn->ctx, conn->rx_key);
            conn->rx_key = NULL;
        }
        if (conn->rx_rwr)
            tcp_conn_recv_done(conn, EXS_PROV_WC_SUCCESS);
        tcp_conn_req_done(conn);
        break;
    case TCP_WIRE_READ_RESP: {
        struct tcp_wr *wr = conn->rx_wr;

        conn->rx_wr = NULL;
        exs__tcp_ep_wr_done(ep, wr, EXS_PROV_WC_SUCCESS);
        exs__tcp_ep_tx_fill(ep);
        break;
    }
    default:
        break;
    }
}

/* Find the framed and sent request psn on ep->sq; NULL when unknown. */
static struct tcp_wr *tcp_ep_find_psn(struct tcp_ep *ep, uint32_t psn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ep->sq)
    {
        struct tcp_wr *wr = exs_list_entry(pos, struct tcp_wr, link);

        if (wr->psn == psn)
            return wr->state == TCP_WR_SENT ? wr : NULL;
        if ((int32_t)(wr->psn - psn) > 0)
            return NULL;
    }
    return NULL;
}

/* An unanswered READ before psn means the peer skipped it. */
static int tcp_ep_read_before(struct tcp_ep *ep, uint32_t psn)
{
    struct exs_list *pos;

    exs_list_for_each(pos, &ep->sq)
    {
        struct tcp_wr *wr = exs_list_entry(pos, struct tcp_wr, link);

        if ((int32_t)(wr->psn - psn) >= 0)
            break;
        if (wr->opcode == EXS_PROV_WR_RDMA_READ)
            return 1;
    }
    return 0;
}

static enum exs_prov_wc_status tcp_syn_status(uint8_t syn)
{
    switch (syn) {
    case TCP_WIRE_SYN_RNR_EXC:
        return EXS_PROV_WC_RNR_RETRY_EXC_ERR;
    case TCP_WIRE_SYN_REM_ACCESS:
        return EXS_PROV_WC_REM_ACCESS_ERR;
    case TCP_WIRE_SYN_REM_INV:
        return EXS_PROV_WC_REM_INV_REQ_ERR;
    default:
        return EXS_PROV_WC_REM_OP_ERR;
    }
}

/* Requester after NAK RNR_EXC: the ep goes to ERROR (everything flushed) but,
 * as with verbs, the connection stays until disconnect / ep_destroy; whatever
 * the peer still sends is consumed and dropped. 0 go on reading, -1 stop. */
static int tcp_conn_zombie(struct tcp_conn *conn, const struct exs_prov_cqe *first)
{
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, &conn->txq)
    {
        struct tcp_txf *f = exs_list_entry(pos, struct tcp_txf, link);

        if (f->kind != TCP_TXF_WR)
            continue;
        if (f->off) {
            /* half written from a buffer about to be flushed: end it all */
            exs__tcp_conn_fail_cqe(conn, -ECONNABORTED, 0, 0, TCP_END_ABORT, first);
            return -1;
        }
        exs_list_del(&f->link);
    }
    conn->zombie = 1;
    exs__tcp_ep_fail_cqe(conn->ep, -ECONNABORTED, TCP_FAIL_SILENT, first);
    return 0;
}

/* Replace an unsent READ_RESP by a copy of the data (the region is read now). */
static void tcp_txf_snapshot(struct tcp_conn *conn, struct tcp_txf *f)
{
    uint32_t len = (uint32_t)f->one.length;
    struct tcp_txf *c = malloc(sizeof(*c) + len);

    if (!c)
        return; /* keep the reference: later SEND/WRITEs wait for it */
    if (exs__tcp_copy_begin(conn->ctx, f->key)) {
        free(c); /* revoked meanwhile: the transmit path answers with a NAK */
        return;
    }
    memcpy(c->buf, (const void *)(uintptr_t)f->one.addr, len);
    exs__tcp_copy_end(conn->ctx);
    *c = *f;
    c->kind = TCP_TXF_CTRL;
    c->key = NULL;
    c->one.addr = (uint64_t)(uintptr_t)c->buf;
    c->seg = &c->one;
    exs_list_insert_after(&f->link, &c->link);
    exs_list_del(&f->link);
    conn->last_resp = NULL;
    conn->resp_pending--;
    exs__tcp_txf_free(conn->ctx, f);
}

/* The key of the WRITE being placed was revoked (or its mr deregistered) half-way:
 * NAK the requester with a remote access error (REM_ACCESS_ERR, its ep to ERROR, as
 * verbs); the connection lingers, reading the rest of the payload into a sink. */
static void tcp_conn_write_revoked(struct tcp_conn *conn)
{
    EXS_CNT_INC(conn->ctx->cnt.access_errors);
    EXS_DBG(PROV, "ep %p: write psn %u: key 0x%x revoked after %llu of %llu bytes",
            (void *)conn->ep, conn->rh.psn, conn->rh.rkey, (unsigned long long)conn->rx_off,
            (unsigned long long)conn->rx_len);
    tcp_conn_nak(conn, TCP_WIRE_SYN_REM_ACCESS, -ECONNABORTED);
}

/* The target of the payload being placed died (WRITE: its key revoked or its region
 * deregistered; SEND: a region of the receive deregistered; READ response: a region of the
 * READ's destination deregistered): the connection ends, the rest of the payload goes to a
 * sink. -1. */
static __attribute__((noinline, cold)) int tcp_place_dead(struct tcp_conn *conn)
{
    if (conn->rx_key) {
        tcp_conn_write_revoked(conn);
        return -1;
    }
    if (conn->rh.type == TCP_WIRE_READ_RESP) {
        struct tcp_ep *ep = conn->ep;
        struct tcp_wr *wr = conn->rx_wr;
        struct exs_prov_cqe cqe;

        /* as RC's requester: the READ completes LOC_PROT_ERR ahead of the flushes, our ep
         * to ERROR, the peer told DISCONNECT; the connection lingers, reading the rest of
         * the response into a sink */
        EXS_CNT_INC(conn->ctx->cnt.access_errors);
        EXS_DBG(PROV, "ep %p: read psn %u: destination deregistered after %llu of %llu bytes",
                (void *)ep, conn->rh.psn, (unsigned long long)conn->rx_off,
                (unsigned long long)conn->rx_len);
        conn->rx_wr = NULL;
        exs__tcp_wr_cqe(ep, wr, EXS_PROV_WC_LOC_PROT_ERR, &cqe);
        pthread_mutex_lock(&ep->lock);
        exs_list_del(&wr->link);
        exs__tcp_wr_put_locked(ep, wr);
        pthread_mutex_unlock(&ep->lock);
        exs__tcp_conn_fail_cqe(conn, -ECONNABORTED, 0, 0, TCP_END_DISCONNECT, &cqe);
        return -1;
    }
    /* as RC: the receive completes LOC_PROT_ERR, the requester gets REM_OP_ERR */
    EXS_CNT_INC(conn->ctx->cnt.access_errors);
    EXS_DBG(PROV, "ep %p: send psn %u: receive's region deregistered after %llu of %llu bytes",
            (void *)conn->ep, conn->rh.psn, (unsigned long long)conn->rx_off,
            (unsigned long long)conn->rx_len);
    tcp_conn_recv_fail(conn, EXS_PROV_WC_LOC_PROT_ERR, TCP_WIRE_SYN_REM_OP);
    return -1;
}

/* Before a copy of the current payload into its target: 1 the copy fence raised over it
 * (spec/provider-tcp.md, "Fencing"), -1 the target died (tcp_place_dead). A WRITE's target
 * is its key; a SEND's the receive's regions, a READ response's the READ's destination
 * (until session 28 a READ response took no fence: the rest of it went into a destination
 * deregistered half-way, fence28_tcp_read_response_mr_dereg). */
static inline int tcp_place_begin(struct tcp_conn *conn)
{
    if (conn->rx_key)
        return exs__tcp_copy_begin(conn->ctx, conn->rx_key) ? tcp_place_dead(conn) : 1;
    return exs__tcp_copy_begin_local(conn->ctx, conn->rx_seg, conn->rx_nseg, &conn->rx_lkey,
                                     &conn->rx_lkills)
               ? tcp_place_dead(conn)
               : 1;
}

/* Act on a complete header of an UP connection: 0 go on reading, -1 stop. */
static int tcp_conn_rx_request(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    struct tcp_wire_hdr *h = &conn->rh;
    struct tcp_ep *ep = conn->ep;
    int req = h->type == TCP_WIRE_SEND || h->type == TCP_WIRE_WRITE || h->type == TCP_WIRE_READ_REQ;
    struct exs_prov_cqe cqe;
    struct tcp_wr *wr;
    int r;

    if ((req && (conn->rx_drop || conn->zombie)) ||
        (conn->zombie &&
         (h->type == TCP_WIRE_ACK || h->type == TCP_WIRE_NAK || h->type == TCP_WIRE_READ_RESP))) {
        /* dropped requests; answers to requests already flushed */
        tcp_conn_rx_discard(conn);
        return 0;
    }
    if ((h->type == TCP_WIRE_SEND || h->type == TCP_WIRE_WRITE) && conn->resp_pending) {
        /* RC order: a READ before this request reads the region first */
        conn->hold_resp = 1;
        conn->rx_phase = TCP_RX_HOLD;
        exs__tcp_conn_update_events(conn);
        return -1;
    }
    switch (h->type) {
    case TCP_WIRE_SEND:
        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (!conn->rx_rwr) {
            r = tcp_conn_take_recv(conn);
            if (r <= 0)
                return r == 0 ? -1 : 0;
        }
        if (conn->rx_rwr->bad) {
            tcp_conn_recv_fail(conn, EXS_PROV_WC_LOC_PROT_ERR, TCP_WIRE_SYN_REM_OP);
            return -1;
        }
        if (h->len > conn->rx_rwr->len) {
            EXS_DBG(PROV, "ep %p: send of %u bytes into a receive of %llu", (void *)ep, h->len,
                    (unsigned long long)conn->rx_rwr->len);
            tcp_conn_recv_fail(conn, EXS_PROV_WC_LOC_LEN_ERR, TCP_WIRE_SYN_REM_INV);
            return -1;
        }
        conn->rx_seg = conn->rx_rwr->sge;
        conn->rx_nseg = conn->rx_rwr->num_sge;
        conn->rx_lkey = NULL;
        conn->rx_lkills = UINT64_MAX; /* the first copy looks the regions up */
        break;
    case TCP_WIRE_WRITE:
        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (h->len && !conn->rx_key &&
            exs__tcp_key_get_remote(ctx, ep, h->rkey, h->raddr, h->len,
                                    EXS_PROV_ACCESS_REMOTE_WRITE, &conn->rx_key)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            EXS_DBG(PROV, "ep %p: write 0x%llx+%u rkey 0x%x refused", (void *)ep,
                    (unsigned long long)h->raddr, h->len, h->rkey);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_ACCESS, -ECONNABORTED);
            return -1;
        }
        if ((h->flags & TCP_WIRE_F_IMM) && !conn->rx_rwr) {
            r = tcp_conn_take_recv(conn);
            if (r == 0 && conn->rx_key) {
                /* not holding the region while waiting: checked again on retry */
                exs__tcp_key_put(ctx, conn->rx_key);
                conn->rx_key = NULL;
            }
            if (r <= 0)
                return r == 0 ? -1 : 0;
        }
        conn->rx_one.addr = h->raddr;
        conn->rx_one.length = h->len;
        conn->rx_seg = &conn->rx_one;
        conn->rx_nseg = 1;
        break;
    case TCP_WIRE_READ_REQ: {
        struct tcp_txf *f;
        struct exs_soft_key *mr = NULL;

        if (h->psn != conn->rcv_nxt)
            return tcp_conn_proto_err(conn, "request out of sequence"), -1;
        if (h->imm > ctx->base.caps.max_msg_size)
            return tcp_conn_proto_err(conn, "read longer than max_msg_size"), -1;
        if (h->imm && exs__tcp_key_get_remote(ctx, ep, h->rkey, h->raddr, h->imm,
                                              EXS_PROV_ACCESS_REMOTE_READ, &mr)) {
            EXS_CNT_INC(ctx->cnt.access_errors);
            EXS_DBG(PROV, "ep %p: read 0x%llx+%u rkey 0x%x refused", (void *)ep,
                    (unsigned long long)h->raddr, h->imm, h->rkey);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_ACCESS, -ECONNABORTED);
            return -1;
        }
        f = calloc(1, sizeof(*f));
        if (!f) {
            if (mr)
                exs__tcp_key_put(ctx, mr);
            tcp_conn_nak(conn, TCP_WIRE_SYN_REM_OP, -ENOMEM);
            return -1;
        }
        f->kind = TCP_TXF_READ_RESP;
        exs__tcp_hdr_init(&f->hdr, TCP_WIRE_READ_RESP, h->imm);
        f->hdr.psn = htonl(h->psn);
        f->one.addr = h->raddr;
        f->one.length = h->imm;
        f->seg = &f->one;
        f->nseg = h->imm ? 1 : 0;
        f->total = TCP_WIRE_HDR_LEN + (uint64_t)h->imm;
        f->key = mr;
        if (!mr)
            f->kind = TCP_TXF_CTRL;
        else
            conn->resp_pending++;
        conn->ctrl_queued++;
        /* the response acknowledges everything before it */
        conn->rcv_nxt++;
        conn->ack_count = 0;
        exs__tcp_txq_push(conn, f);
        if (mr) {
            /* read the region now if the socket takes it; else copy small reads so
             * later WRITEs need not wait for the response to leave */
            conn->last_resp = f;
            exs__tcp_conn_tx(conn);
            if (conn->state != TCP_CONN_UP)
                return -1;
            if (conn->last_resp == f && !f->off && h->imm <= TCP_RESP_COPY_MAX)
                tcp_txf_snapshot(conn, f);
        }
        if (conn->ctrl_queued >= TCP_CTRL_MAX(conn->ctx)) {
            exs__tcp_conn_update_events(conn);
            return -1;
        }
        return 0;
    }
    case TCP_WIRE_READ_RESP:
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || wr->opcode != EXS_PROV_WR_RDMA_READ || h->len != wr->len ||
            tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "read response without a matching read"), -1;
        exs__tcp_ep_ack_before(ep, h->psn);
        conn->rx_wr = wr;
        conn->rx_seg = wr->sge;
        conn->rx_nseg = wr->num_sge;
        conn->rx_lkey = NULL;
        conn->rx_lkills = UINT64_MAX; /* the first copy looks the regions up */
        break;
    case TCP_WIRE_ACK:
        EXS_CNT_INC(ctx->cnt.acks_rx);
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || wr->opcode == EXS_PROV_WR_RDMA_READ || tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "ack for an unknown sequence"), -1;
        exs__tcp_ep_ack_before(ep, h->psn + 1);
        exs__tcp_ep_tx_fill(ep);
        return 0;
    case TCP_WIRE_NAK:
        EXS_CNT_INC(ctx->cnt.naks_rx);
        wr = tcp_ep_find_psn(ep, h->psn);
        if (!wr || tcp_ep_read_before(ep, h->psn))
            return tcp_conn_proto_err(conn, "nak for an unknown sequence"), -1;
        EXS_DBG(PROV, "ep %p: nak psn %u syndrome %u", (void *)ep, h->psn, h->syndrome);
        exs__tcp_ep_ack_before(ep, h->psn);
        exs_list_del(&wr->link);
        exs__tcp_wr_cqe(ep, wr, tcp_syn_status(h->syndrome), &cqe);
        free(wr);
        if (h->syndrome == TCP_WIRE_SYN_RNR_EXC)
            return tcp_conn_zombie(conn, &cqe);
        exs__tcp_conn_fail_cqe(conn, -ECONNABORTED, 0, 0, TCP_END_QUIET, &cqe);
        return -1;
    case TCP_WIRE_DISCONNECT:
        EXS_DBG(PROV, "ep %p: peer disconnected%s", (void *)ep,
                h->flags & TCP_WIRE_F_CLOSED ? " (its endpoint closed)" : "");
        if (h->flags & TCP_WIRE_F_CLOSED)
            ep->peer_closed = 1;
        exs__tcp_conn_fail(conn, 0, 0, 0, TCP_END_QUIET);
        return -1;
    default:
        return tcp_conn_proto_err(conn, "unexpected frame type"), -1;
    }
    conn->rx_len = h->len;
    conn->rx_off = 0;
    conn->rx_phase = TCP_RX_PAYLOAD;
    if (!h->len)
        tcp_conn_payload_done(conn);
    return 0;
}

/* Decode and check a complete header; dispatch it. 0 go on, -1 stop. */
static int tcp_conn_rx_hdr(struct tcp_conn *conn)
{
    struct tcp_wire_hdr *h = &conn->rh;
    const struct tcp_wire_hdr *w = (const void *)conn->hbuf;
    uint64_t max = conn->ctx->base.caps.max_msg_size;
    const char *bad = NULL;

    h->magic = ntohl(w->magic);
    h->version = w->version;
    h->type = w->type;
    h->flags = w->flags;
    h->syndrome = w->syndrome;
    h->len = ntohl(w->len);
    h->psn = ntohl(w->psn);
    h->raddr = be64toh(w->raddr);
    h->rkey = ntohl(w->rkey);
    h->imm = ntohl(w->imm);
    conn->hgot = 0; /* consumed; a held frame is retried from conn->rh */
    EXS_CNT_INC(conn->ctx->cnt.frames_rx);

    if (h->magic != TCP_WIRE_MAGIC)
        bad = "bad magic";
    else if (h->version != TCP_WIRE_VERSION)
        bad = "bad version";
    else if (h->type < 1 || h->type > TCP_WIRE_TYPE_MAX)
        bad = "bad frame type";
    else if ((h->flags & ~TCP_WIRE_F_ALL) ||
             ((h->flags & TCP_WIRE_F_CLOSED) && h->type != TCP_WIRE_DISCONNECT))
        bad = "bad flags";
    else if (h->type == TCP_WIRE_NAK ? (h->syndrome < 1 || h->syndrome > TCP_WIRE_SYN_MAX)
                                     : h->syndrome != 0)
        bad = "bad syndrome";
    else {
        switch (h->type) {
        case TCP_WIRE_CONN_REQ:
        case TCP_WIRE_CONN_ACCEPT:
            if (h->len < TCP_WIRE_CONN_LEN || h->len > TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX)
                bad = "bad handshake length";
            break;
        case TCP_WIRE_CONN_REJECT:
            if (h->len > TCP_WIRE_PD_MAX)
                bad = "bad handshake length";
            break;
        case TCP_WIRE_SEND:
        case TCP_WIRE_WRITE:
        case TCP_WIRE_READ_RESP:
            if (h->len > max)
                bad = "payload longer than max_msg_size";
            break;
        default:
            if (h->len)
                bad = "payload on a frame without one";
            break;
        }
    }
    if (!bad) {
        int hs = h->type <= TCP_WIRE_CONN_REJECT;

        switch (conn->state) {
        case TCP_CONN_WAIT_REQ:
            if (h->type != TCP_WIRE_CONN_REQ)
                bad = "expected a connection request";
            break;
        case TCP_CONN_WAIT_REPLY:
            if (h->type != TCP_WIRE_CONN_ACCEPT && h->type != TCP_WIRE_CONN_REJECT)
                bad = "expected accept or reject";
            break;
        case TCP_CONN_UP:
            if (hs)
                bad = "handshake frame on an established connection";
            break;
        default:
            bad = "frame in a bad state";
            break;
        }
        if (!bad && hs) {
            conn->rx_phase = TCP_RX_CONN;
            conn->rx_len = h->len;
            conn->rx_off = 0;
            if (!h->len)
                return exs__tcp_conn_hs_frame(conn);
            return 0;
        }
    }
    if (bad) {
        if (conn->state == TCP_CONN_UP) {
            tcp_conn_proto_err(conn, bad);
        } else if (conn->state == TCP_CONN_WAIT_REQ) {
            exs__tcp_conn_refuse(conn, bad);
        } else {
            EXS_CNT_INC(conn->ctx->cnt.protocol_errors);
            EXS_DBG(PROV, "conn %p: handshake: %s", (void *)conn, bad);
            exs__tcp_conn_fail(conn, -EPROTO, 0, 0, TCP_END_QUIET);
        }
        return -1;
    }
    return tcp_conn_rx_request(conn);
}

/* The peer is gone (EOF, reset, error). */
static void tcp_conn_dead(struct tcp_conn *conn, int err)
{
    EXS_DBG(PROV, "conn %p ep %p: peer gone: %s", (void *)conn, (void *)conn->ep,
            err ? strerror(err) : "eof");
    if (conn->state == TCP_CONN_LINGER) {
        exs__tcp_conn_close(conn);
        return;
    }
    /* EOF: the peer's socket was closed, by its provider or by its kernel when its
     * process ended; a reset or an error may be the path's */
    if (!err && conn->state == TCP_CONN_UP && conn->ep)
        conn->ep->peer_closed = 1;
    exs__tcp_conn_fail(conn, -ECONNRESET, 0, 0, TCP_END_ABORT);
}

/*
 * Read-ahead. A frame used to cost two system calls at least: its header, then its
 * payload (with the next header). At a frame start an UP connection reads up to
 * TCP_STG_LEN bytes into its staging buffer instead, and the state machine takes its
 * bytes from there (headers, payloads, discarded payloads) before it reads the socket
 * again: a burst of small frames costs one call. Large payloads still go from the socket
 * straight into their target once the staging is empty.
 *
 * Staged bytes are not in the socket, so level-triggered epoll no longer announces them:
 * the loop below places them all before it returns, except when the connection stops
 * reading (a request held for RNR: exs__tcp_conn_rnr_resume and hold_hup call this
 * function again; the connection ending: they are dropped with it), and they are never
 * charged to the turn's byte budget (only socket reads are).
 */
static uint32_t tcp_stg_avail(const struct tcp_conn *conn)
{
    return conn->stg_len - conn->stg_off;
}

/* Place up to want staged bytes at dst. */
static ssize_t tcp_stg_take(struct tcp_conn *conn, void *dst, size_t want)
{
    size_t n = EXS_MIN(want, (size_t)tcp_stg_avail(conn));

    memcpy(dst, conn->stg + conn->stg_off, n);
    conn->stg_off += (uint32_t)n;
    return (ssize_t)n;
}

/* Place up to want staged bytes into the payload's segments at rx_off. */
static ssize_t tcp_stg_take_segs(struct tcp_conn *conn, size_t want)
{
    struct iovec iov[TCP_TX_IOV];
    size_t left = EXS_MIN(want, (size_t)tcp_stg_avail(conn)), done = 0;
    int k = exs__tcp_iov_fill(iov, TCP_TX_IOV, conn->rx_seg, conn->rx_nseg, conn->rx_off, left);

    for (int i = 0; i < k; i++) {
        memcpy(iov[i].iov_base, conn->stg + conn->stg_off + done, iov[i].iov_len);
        done += iov[i].iov_len;
    }
    conn->stg_off += (uint32_t)done;
    return (ssize_t)done;
}

/* Refill the empty staging buffer from the socket (allocated at first use). */
static ssize_t tcp_stg_fill(struct tcp_conn *conn)
{
    ssize_t n;

    if (!conn->stg && !(conn->stg = malloc(TCP_STG_LEN))) {
        errno = ENOMEM;
        return -1;
    }
    n = exs__nc_recv(conn->fd, conn->stg, TCP_STG_LEN, MSG_DONTWAIT);
    if (n > 0)
        TCP_TSAN_ACQUIRE();
    conn->stg_off = 0;
    conn->stg_len = n > 0 ? (uint32_t)n : 0;
    return n;
}

void exs__tcp_conn_rx_again(struct tcp_conn *conn)
{
    if (conn->rx_again || conn->state != TCP_CONN_UP || !tcp_stg_avail(conn))
        return;
    conn->rx_again = 1;
    exs_list_add_tail(&conn->ctx->rx_again, &conn->rx_again_link);
    __atomic_add_fetch(&conn->ctx->rx_again_n, 1, __ATOMIC_RELAXED);
}

void exs__tcp_nic_rx_again(struct tcp_ctx *ctx)
{
    unsigned n = __atomic_load_n(&ctx->rx_again_n, __ATOMIC_RELAXED);
    struct exs_list *l;

    /* those waiting now; any that stage again (at the tail) wait for the next turn */
    while (n-- && (l = exs_list_pop_head(&ctx->rx_again)) != NULL) {
        struct tcp_conn *conn = exs_list_entry(l, struct tcp_conn, rx_again_link);

        conn->rx_again = 0;
        __atomic_sub_fetch(&ctx->rx_again_n, 1, __ATOMIC_RELAXED);
        if (conn->state == TCP_CONN_UP && (conn->events & EPOLLIN))
            exs__tcp_conn_rx(conn);
    }
}

/*
 * A read into a large payload came back short: the socket is drained and the rest is on
 * its way. Every segment of it would wake the reader (a ppoll, an epoll_wait, a readv
 * of a few dozen kilobytes, and a wake-up the sender's kernel pays for) although nothing
 * completes before the last byte. So the socket's SO_RCVLOWAT is raised to what the
 * payload still owes (at most TCP_LOWAT_MAX): epoll reports it readable once that much is
 * in (or at an end of file, an error, or when the kernel's receive window closes, which
 * it checks itself), and back to 1 as soon as the reader is between payloads. The peer
 * owes those bytes (it is half-way through the frame), so nothing waits for data that
 * will not come.
 */
void exs__tcp_conn_lowat(struct tcp_conn *conn)
{
    int want = 1, have = conn->lowat ? conn->lowat : 1;

    if (conn->fd < 0)
        return;
    if (conn->state == TCP_CONN_UP && conn->rx_phase == TCP_RX_PAYLOAD && !tcp_stg_avail(conn) &&
        conn->rx_len - conn->rx_off >= TCP_LOWAT_MIN)
        want = (int)EXS_MIN(conn->rx_len - conn->rx_off, (uint64_t)TCP_LOWAT_MAX);
    if (want == have)
        return;
    if (setsockopt(conn->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) < 0) {
        EXS_ERR(PROV, "conn %p: SO_RCVLOWAT %d: %m", (void *)conn, want);
        return; /* a failed raise: as before; a failed reset: tried again next time */
    }
    if (want > 1)
        EXS_CNT_INC(conn->ctx->cnt.rx_lowats);
    conn->lowat = want;
}

void exs__tcp_conn_rx(struct tcp_conn *conn)
{
    struct tcp_ctx *ctx = conn->ctx;
    uint64_t budget = TCP_RX_BUDGET;
    struct iovec iov[TCP_TX_IOV];
    static __thread uint8_t sink[16384];
    int sock_empty = 0; /* a read came back short: the socket holds nothing more */
    ssize_t n;

    if (EXS_UNLIKELY(conn->fd >= 0 && exs__tcp_emu_blackholed(conn))) {
        exs__tcp_conn_update_events(conn); /* the bytes stay in the socket */
        return;
    }
    while (conn->fd >= 0 && (budget || tcp_stg_avail(conn))) {
        size_t want;
        int short_read, staged = 0;

        if (conn->state == TCP_CONN_LINGER) {
            conn->stg_off = conn->stg_len = 0; /* discarded, as what follows */
            want = sizeof(sink);
            n = exs__nc_recv(conn->fd, sink, want, MSG_DONTWAIT);
        } else if (conn->state == TCP_CONN_PENDING || conn->state == TCP_CONN_CONNECTING ||
                   conn->state == TCP_CONN_DEAD) {
            break;
        } else if (conn->rx_phase == TCP_RX_HOLD) {
            break;
        } else if (conn->rx_phase == TCP_RX_HDR) {
            if (conn->rx_retry) {
                /* a held header retried (RNR) */
                conn->rx_retry = 0;
                if (tcp_conn_rx_request(conn) < 0)
                    break;
                continue;
            }
            if (conn->hgot == TCP_WIRE_HDR_LEN) {
                /* read along with the previous payload */
                if (tcp_conn_rx_hdr(conn) < 0)
                    break;
                continue;
            }
            want = TCP_WIRE_HDR_LEN - conn->hgot;
            if (!tcp_stg_avail(conn) && conn->state == TCP_CONN_UP && conn->hgot == 0) {
                if (sock_empty || !budget)
                    break;
                n = tcp_stg_fill(conn);
                if (n > 0) {
                    EXS_CNT_ADD(ctx->cnt.bytes_rx, n);
                    budget = (uint64_t)n >= budget ? 0 : budget - (uint64_t)n;
                    sock_empty = n < TCP_STG_LEN;
                    continue; /* placed from the staging buffer */
                }
            } else if (tcp_stg_avail(conn)) {
                n = tcp_stg_take(conn, conn->hbuf + conn->hgot, want);
                staged = 1;
            } else {
                n = exs__nc_recv(conn->fd, conn->hbuf + conn->hgot, want, MSG_DONTWAIT);
            }
        } else if (conn->rx_phase == TCP_RX_CONN) {
            want = conn->rx_len - conn->rx_off;
            n = exs__nc_recv(conn->fd, conn->hs + conn->rx_off, want, MSG_DONTWAIT);
        } else if (conn->rx_discard) {
            want = EXS_MIN(sizeof(sink), conn->rx_len - conn->rx_off);
            if (tcp_stg_avail(conn)) {
                n = tcp_stg_take(conn, sink, want);
                staged = 1;
            } else {
                n = exs__nc_recv(conn->fd, sink, want, MSG_DONTWAIT);
            }
        } else if (tcp_stg_avail(conn)) {
            int fenced;

            want = conn->rx_len - conn->rx_off;
            fenced = tcp_place_begin(conn);
            if (fenced < 0)
                continue; /* the rest goes to a sink */
            n = tcp_stg_take_segs(conn, want);
            if (fenced)
                exs__tcp_copy_end(ctx);
            staged = 1;
        } else {
            int k = exs__tcp_iov_fill(iov, TCP_TX_IOV - 1, conn->rx_seg, conn->rx_nseg,
                                      conn->rx_off, conn->rx_len - conn->rx_off);
            int fenced;

            /* the next frame's header comes in the same call when it is there */
            iov[k].iov_base = conn->hbuf;
            iov[k].iov_len = TCP_WIRE_HDR_LEN;
            want = conn->rx_len - conn->rx_off + TCP_WIRE_HDR_LEN;
            fenced = tcp_place_begin(conn);
            if (fenced < 0)
                break; /* target dead during the WRITE / SEND: the rest goes to a sink */
            n = exs__nc_readv(conn->fd, iov, k + 1);
            if (fenced) {
                int e = errno;

                exs__tcp_copy_end(ctx);
                errno = e;
            }
        }
        if (n == 0 && !staged) {
            tcp_conn_dead(conn, 0);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            tcp_conn_dead(conn, errno);
            return;
        }
        if (staged) {
            short_read = 0; /* the staging buffer ran dry, not the socket */
        } else {
            TCP_TSAN_ACQUIRE();
            EXS_CNT_ADD(ctx->cnt.bytes_rx, n);
            short_read = (size_t)n < want;
            budget = (uint64_t)n >= budget ? 0 : budget - (uint64_t)n;
        }
        if (conn->state == TCP_CONN_LINGER)
            continue;
        if (conn->rx_phase == TCP_RX_HDR) {
            conn->hgot += (uint32_t)n;
            if (conn->hgot == TCP_WIRE_HDR_LEN) {
                if (tcp_conn_rx_hdr(conn) < 0)
                    break;
            } else if (conn->state == TCP_CONN_WAIT_REQ &&
                       !exs__tcp_hello_prefix_ok(conn->hbuf, conn->hgot)) {
                /* not an exs peer: no need to wait for the rest of a header */
                exs__tcp_conn_refuse(conn, "bytes that begin no connection request");
                return;
            }
        } else if (conn->rx_phase == TCP_RX_CONN) {
            conn->rx_off += (uint64_t)n;
            if (conn->rx_off == conn->rx_len && exs__tcp_conn_hs_frame(conn) < 0)
                break;
        } else {
            uint64_t left = conn->rx_len - conn->rx_off;

            if (!conn->rx_discard && (uint64_t)n > left) {
                conn->hgot = (uint32_t)((uint64_t)n - left);
                n = (ssize_t)left;
            }
            conn->rx_off += (uint64_t)n;
            if (conn->rx_off == conn->rx_len)
                tcp_conn_payload_done(conn);
        }
        /* A short read emptied the socket (what arrives later makes it readable again,
         * level-triggered): no further call that would only return EAGAIN. */
        if (short_read)
            break;
    }
    /* A whole header read along with the last payload is no longer in the socket, so
     * level-triggered epoll would never bring us back for it (a budget exit): act on
     * it now. Its payload, if any, is still in the socket and wakes us as usual. */
    if (conn->fd >= 0 && conn->state == TCP_CONN_UP && conn->rx_phase == TCP_RX_HDR &&
        !conn->rx_retry && conn->hgot == TCP_WIRE_HDR_LEN)
        tcp_conn_rx_hdr(conn);
    /* read ahead left behind (a header that stopped the loop, the budget): the next
     * turn places it while the connection may read (a held request: its resume does) */
    if (conn->state == TCP_CONN_UP && conn->rx_phase != TCP_RX_HOLD && (conn->events & EPOLLIN))
        exs__tcp_conn_rx_again(conn);
    exs__tcp_conn_lowat(conn);
    if (conn->state == TCP_CONN_UP)
        tcp_conn_ack_later(conn);
}

/* NIC: the RNR pause of conn ended: retry the held frame. */
void exs__tcp_conn_rnr_resume(struct tcp_conn *conn)
{
    if (conn->state != TCP_CONN_UP || conn->rx_phase != TCP_RX_HOLD)
        return;
    conn->rx_phase = TCP_RX_HDR;
    conn->rx_retry = 1;
    exs__tcp_conn_update_events(conn);
    exs__tcp_conn_rx(conn);
}
