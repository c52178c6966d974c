/* SPDX-License-Identifier: MIT */
/* Verbs provider endpoints and connection management: our own RC QPs (from the QP cache),
 * rdma_cm for addresses, routes and the CM handshake with private data. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/* IB CM reject reasons seen here (ib_cm_rej_reason). */
#define VRB_REJ_CONSUMER 28

#define VRB_IN_LOOPBACK(_sin) ((ntohl((_sin)->sin_addr.s_addr) >> 24) == 127)

void exs__vrb_qp_destroy_cb(void *arg, void *qp)
{
    (void)arg;
    if (VRB_NC(ibv_destroy_qp(qp)))
        EXS_WARN(PROV, "ibv_destroy_qp failed");
}

/* ---- small helpers ---- */

static socklen_t vrb_sa_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* Shows the device's own address as 127.0.0.1 when the object was set up through loopback. */
static void vrb_sa_copy(struct vrb_ctx *ctx, int loopback, const struct sockaddr *sa,
                        struct sockaddr_storage *out, socklen_t *len_p)
{
    socklen_t len = vrb_sa_len(sa);

    memset(out, 0, sizeof(*out));
    memcpy(out, sa, len);
    if (loopback && sa->sa_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)out;

        if (sin->sin_addr.s_addr == ctx->loop_addr.s_addr)
            sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    *len_p = len;
}

static int vrb_same_device(struct vrb_ctx *ctx, struct rdma_cm_id *id)
{
    return id->verbs && ctx->verbs &&
           (id->verbs == ctx->verbs || strcmp(ibv_get_device_name(id->verbs->device),
                                              ibv_get_device_name(ctx->verbs->device)) == 0);
}

void exs__vrb_ep_set_error(struct vrb_ep *ep)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    exs__lite_lock_st(&ep->lock);
    exs__vrb_held_post_locked(ep); /* deferred requests go first: flushed with the rest */
    __atomic_store_n(&ep->state, EXS_PROV_EP_ERROR, __ATOMIC_RELAXED);
    if (ep->qp && VRB_NC(ibv_modify_qp(ep->qp, &a, IBV_QP_STATE)))
        EXS_DBG(PROV, "ep %p: modify to ERR failed", (void *)ep);
    exs__lite_unlock_st(&ep->lock);
}

static void vrb_ep_event(struct vrb_ep *ep, enum exs_prov_cm_event_type type, int status,
                         struct exs_prov_cm_event *ev)
{
    memset(ev, 0, sizeof(*ev));
    ev->type = type;
    ev->ep = &ep->base;
    ev->status = status;
}

/* RNR timer codes (IBA 9.7.5.2.8) in hundredths of ms; index = code. */
static const uint32_t vrb_rnr_codes[32] = {
    65536, 1,    2,    3,    4,    6,     8,     12,    16,    24,    32,
    48,    64,   96,   128,  192,  256,   384,   512,   768,   1024,  1536,
    2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
};

static uint8_t vrb_rnr_code(uint8_t ms)
{
    uint32_t want = ms ? ms * 100u : 64; /* default 0.64 ms */

    for (uint8_t c = 1; c < 32; c++)
        if (vrb_rnr_codes[c] >= want)
            return c;
    return 0;
}

/* INIT -> RTR -> RTS with the attributes rdma_cm computed, our timeouts and retries. */
static int vrb_qp_to_rts(struct vrb_ep *ep, struct rdma_cm_id *id, uint8_t resp_res,
                         uint8_t init_depth)
{
    struct vrb_ctx *ctx = ep->ctx;
    struct ibv_qp_attr a;
    int mask = 0, ret;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    ret = VRB_NC(rdma_init_qp_attr(id, &a, &mask));
    if (ret)
        return -errno;
    a.min_rnr_timer = vrb_rnr_code(ep->base.attr.rnr_timer_ms);
    mask |= IBV_QP_MIN_RNR_TIMER;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        a.max_dest_rd_atomic = resp_res;
    ret = VRB_NC(ibv_modify_qp(ep->qp, &a, mask));
    if (ret)
        return -ret;
    memset(&a, 0, sizeof(a));
    mask = 0;
    a.qp_state = IBV_QPS_RTS;
    ret = VRB_NC(rdma_init_qp_attr(id, &a, &mask));
    if (ret)
        return -errno;
    uint8_t cm_timeout = a.timeout;

    a.timeout = exs__vrb_qp_timeout(ep->base.attr.timeout, ctx->qp_timeout,
                                    (mask & IBV_QP_TIMEOUT) != 0, cm_timeout);
    EXS_DBG(PROV, "ep %p: local ACK timeout %u (rdma_cm's %u)", (void *)ep, a.timeout,
            (mask & IBV_QP_TIMEOUT) ? cm_timeout : 0);
    a.retry_cnt = ep->base.attr.retry_cnt ? EXS_MIN(ep->base.attr.retry_cnt, 7) : ctx->retry_cnt;
    a.rnr_retry = EXS_MIN(ep->base.attr.rnr_retry, ctx->rnr_retry);
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        a.max_rd_atomic = init_depth;
    ret = VRB_NC(ibv_modify_qp(ep->qp, &a, mask));
    if (ret)
        return -ret;
    exs__vrb_fence_arm(ep); /* before anything else is posted */
    return 0;
}

static uint8_t vrb_rd_res(struct vrb_ctx *ctx)
{
    return (uint8_t)EXS_MAX(EXS_MIN(ctx->dattr.max_qp_rd_atom, 16), 1);
}

static uint8_t vrb_rd_init(struct vrb_ctx *ctx)
{
    return (uint8_t)EXS_MAX(EXS_MIN(ctx->dattr.max_qp_init_rd_atom, 16), 1);
}

static void vrb_note_local(struct vrb_ep *ep)
{
    struct sockaddr *sa = ep->id ? rdma_get_local_addr(ep->id) : NULL;

    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6))
        vrb_sa_copy(ep->ctx, ep->loopback, sa, &ep->local, &ep->local_len);
}

static void vrb_ep_up(struct vrb_ep *ep)
{
    struct vrb_ctx *ctx = ep->ctx;

    vrb_note_local(ep);
    exs__lite_lock_st(&ep->lock);
    __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTED, __ATOMIC_RELAXED);
    exs__lite_unlock_st(&ep->lock);
    ep->up = 1;
    EXS_CNT_INC(ctx->cnt.conns_established);
    if (ep->active && ep->connect_ns) {
        EXS_CNT_ADD(ctx->cnt.connect_ns_total, exs__now_ns() - ep->connect_ns);
        EXS_CNT_INC(ctx->cnt.connects_timed);
    }
}

/* ---- endpoints ---- */

static struct ibv_qp *vrb_qp_create(struct vrb_ctx *ctx, const struct vrb_qpc_caps *want,
                                    struct vrb_qpc_caps *got)
{
    struct ibv_qp_init_attr ia;
    struct ibv_qp *qp;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = ctx->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = want->max_send_wr;
    ia.cap.max_recv_wr = want->max_recv_wr;
    ia.cap.max_send_sge = want->max_sge;
    ia.cap.max_recv_sge = want->max_sge;
    ia.cap.max_inline_data = want->max_inline;
    qp = VRB_NC(ibv_create_qp(ctx->pd, &ia));
    if (!qp)
        return NULL;
    got->max_send_wr = ia.cap.max_send_wr;
    got->max_recv_wr = ia.cap.max_recv_wr;
    got->max_sge = EXS_MIN(ia.cap.max_send_sge, ia.cap.max_recv_sge);
    got->max_inline = ia.cap.max_inline_data;
    return qp;
}

/* Reserve room for n more completions in the ctx CQ, growing it (ibv_resize_cq) up to the
 * device's max_cqe: -ENOBUFS when it cannot hold them. */
static int vrb_cq_reserve(struct vrb_ctx *ctx, uint64_t n)
{
    uint64_t resize = 0;
    int ret;

    exs__lite_lock_st(&ctx->lock);
    ret = exs__vrb_cq_plan((uint64_t)ctx->cq_cap, ctx->cq_need, n,
                           (uint64_t)EXS_MAX(ctx->dattr.max_cqe, ctx->cq_cap), &resize);
    if (!ret && resize) {
        if (VRB_NC(ibv_resize_cq(ctx->cq, (int)resize)) == 0) {
            ctx->cq_cap = ctx->cq->cqe;
            /* whether a request for notification survives the resize is the driver's
             * business: request again (ctx_arm requests only when none stands) */
            if (vrb_req_notify_cq(ctx, ctx->cq) == 0)
                ctx->cq_armed = 1;
            ctx->cq_seen = 1; /* an event of the old request may be pending: read it */
            EXS_CNT_INC(ctx->cnt.cq_resizes);
            if (ctx->cq_need + n > (uint64_t)ctx->cq_cap)
                ret = -ENOBUFS;
        } else {
            EXS_WARN(PROV, "ctx %p: ibv_resize_cq to %llu failed: %m", (void *)ctx,
                     (unsigned long long)resize);
            ret = -ENOBUFS;
        }
    }
    if (!ret)
        ctx->cq_need += n;
    exs__lite_unlock_st(&ctx->lock);
    if (ret) {
        EXS_CNT_INC(ctx->cnt.ep_nobufs);
        EXS_WARN(PROV,
                 "ctx %p: completion queue (%d, device max %d) cannot hold %llu more "
                 "entries (%llu reserved): ep refused",
                 (void *)ctx, ctx->cq_cap, ctx->dattr.max_cqe, (unsigned long long)n,
                 (unsigned long long)ctx->cq_need);
    }
    return ret;
}

static void vrb_cq_release(struct vrb_ctx *ctx, uint64_t n)
{
    exs__lite_lock_st(&ctx->lock);
    ctx->cq_need -= EXS_MIN(n, ctx->cq_need);
    exs__lite_unlock_st(&ctx->lock);
}

/* Every completion an ep can produce: its send queue, the provider's own requests, its
 * receive queue. */
static uint64_t vrb_ep_cqes(const struct vrb_ep *ep)
{
    return (uint64_t)ep->base.attr.max_send_wr + ep->int_room + ep->base.attr.max_recv_wr;
}

uint32_t exs__vrb_slots(uint32_t n)
{
    uint32_t p = 1;

    if (n > (1u << 31))
        return 0;
    while (p < n)
        p <<= 1;
    return p;
}

int exs__vrb_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    const struct exs_prov_caps *caps = &c->caps;
    struct vrb_qpc_caps want;
    struct ibv_qp_attr qa;
    struct vrb_ep *ep;
    int ret;

    uint32_t room = ctx->int_room, sq_slots, rq_slots;

    ret = exs__prov_ep_attr_check(caps, attr);
    if (ret)
        return ret;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    ep->base.ctx = c;
    ep->base.user = attr->user;
    ep->base.attr = *attr;
    ep->ctx = ctx;
    ep->cmo.kind = VRB_K_EP;
    exs_list_init(&ep->hlink);
    exs_list_init(&ep->link);
    exs_list_init(&ep->disc_link);
    exs_list_init(&ep->grants);
    ep->int_room = room;
    sq_slots = exs__vrb_slots(attr->max_send_wr);
    rq_slots = exs__vrb_slots(attr->max_recv_wr);
    ep->sq_mask = sq_slots - 1;
    ep->rq_mask = rq_slots - 1;
    ep->sq = sq_slots ? calloc(sq_slots, sizeof(*ep->sq)) : NULL;
    ep->rq = rq_slots ? calloc(rq_slots, sizeof(*ep->rq)) : NULL;
    if (!ep->sq || !ep->rq) {
        ret = -ENOMEM;
        goto fail;
    }
    /* the device's removal (cm_lock) finds every QP on it in an ep, or none made */
    pthread_mutex_lock(&ctx->cm_lock);
    ret = vrb_gone(ctx) ? -ENODEV : vrb_cq_reserve(ctx, vrb_ep_cqes(ep));
    if (ret)
        goto fail_unlock;
    /* window binds get room of their own: they never take what max_send_wr granted */
    want.max_send_wr = attr->max_send_wr + room;
    want.max_recv_wr = attr->max_recv_wr;
    want.max_inline = attr->max_inline;
    want.max_sge = caps->max_sge;
    ep->qp = exs__vrb_qpc_get(&ctx->qpc, &want, &ep->qcaps);
    if (!ep->qp)
        ep->qp = vrb_qp_create(ctx, &want, &ep->qcaps);
    if (!ep->qp) {
        ret = errno ? -errno : -ENOMEM;
        EXS_ERR(PROV, "ctx %p: ibv_create_qp: %s", (void *)ctx, strerror(-ret));
        goto err_release_cq;
    }
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    qa.pkey_index = 0;
    qa.port_num = ctx->port;
    qa.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ret = VRB_NC(ibv_modify_qp(
        ep->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    if (ret) {
        ret = -ret;
        EXS_ERR(PROV, "ctx %p: QP to INIT: %s", (void *)ctx, strerror(-ret));
        exs__vrb_qp_destroy_cb(ctx, ep->qp);
        ep->qp = NULL;
        goto err_release_cq;
    }
    __atomic_store_n(&ep->state, EXS_PROV_EP_IDLE, __ATOMIC_RELAXED);
    exs__vrb_ep_hash_add(ctx, ep);
    ep->tok = ctx->tok_base ^ ((uint64_t)ep->epid * 0x9E3779B97F4A7C15ull);
    EXS_DBG(PROV, "ep %p: qp %u epid %u", (void *)ep, ep->qp->qp_num, ep->epid);
    pthread_mutex_unlock(&ctx->cm_lock);
    *ep_p = &ep->base;
    return 0;
err_release_cq:
    vrb_cq_release(ctx, vrb_ep_cqes(ep));
fail_unlock:
    pthread_mutex_unlock(&ctx->cm_lock);
fail:
    free(ep->sq);
    free(ep->rq);
    free(ep);
    return ret;
}

void exs__vrb_ep_destroy(struct exs_prov_ep *e)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx;
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_RESET};

    if (!ep)
        return;
    ctx = ep->ctx;
    pthread_mutex_lock(&ctx->cm_lock);
    exs_list_del(&ep->disc_link);
    if (ep->id) {
        if (ep->up && !ep->disc_sent) {
            exs__vrb_say_bye(ep, 1);
            VRB_NC(rdma_disconnect(ep->id));
        }
        ep->id->context = NULL;
        VRB_NC(rdma_destroy_id(ep->id));
        ep->id = NULL;
    }
    ep->tok = 0; /* goodbye datagrams no longer find it (the cm thread holds cm_lock) */
    /* no completion or event names the ep after this */
    exs__vrb_ep_forget(ctx, ep);
    vrb_cq_release(ctx, vrb_ep_cqes(ep));
    /* still under cm_lock: the device's removal either released the QP (NULL) or waits */
    if (!ep->qp) {
        exs__vrb_grants_drop(ep);
    } else if (VRB_NC(ibv_modify_qp(ep->qp, &qa, IBV_QP_STATE)) == 0) {
        /* binds still queued are gone with the reset: release their windows */
        exs__vrb_grants_drop(ep);
        exs__vrb_qpc_put(&ctx->qpc, ep->qp, &ep->qcaps);
    } else {
        exs__vrb_qp_destroy_cb(ctx, ep->qp);
        exs__vrb_grants_drop(ep);
    }
    pthread_mutex_unlock(&ctx->cm_lock);
    exs__vrb_held_drop_locked(ep); /* discarded, as everything outstanding (nobody else
                                      holds the ep now) */
    free(ep->sq);
    free(ep->rq);
    free(ep);
}

enum exs_prov_ep_state exs__vrb_ep_state(struct exs_prov_ep *e)
{
    return (enum exs_prov_ep_state)__atomic_load_n(&vrb_ep_of(e)->state, __ATOMIC_RELAXED);
}

int exs__vrb_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr, socklen_t *addrlen)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    int ret = -ENOTCONN;

    pthread_mutex_lock(&ep->ctx->cm_lock);
    if (ep->local_len) {
        if (*addrlen < ep->local_len) {
            ret = -EINVAL;
        } else {
            memcpy(addr, &ep->local, ep->local_len);
            *addrlen = ep->local_len;
            ret = 0;
        }
    }
    pthread_mutex_unlock(&ep->ctx->cm_lock);
    return ret;
}

/* ---- listeners ---- */

int exs__vrb_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                    int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct vrb_ctx *ctx = vrb_ctx_of(c);
    struct sockaddr_storage sa;
    struct vrb_listener *lis;
    int ret;

    if (!addr || addrlen < sizeof(struct sockaddr_in) || addrlen > sizeof(sa) ||
        (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return -EINVAL;
    lis = calloc(1, sizeof(*lis));
    if (!lis)
        return -ENOMEM;
    memset(&sa, 0, sizeof(sa));
    memcpy(&sa, addr, addrlen);
    if (sa.ss_family == AF_INET && VRB_IN_LOOPBACK((struct sockaddr_in *)&sa) &&
        ctx->loop_addr.s_addr) {
        ((struct sockaddr_in *)&sa)->sin_addr = ctx->loop_addr;
        lis->loopback = 1;
    }
    lis->base.ctx = c;
    lis->base.user = user;
    lis->ctx = ctx;
    lis->cmo.kind = VRB_K_LIS;
    exs_list_init(&lis->reqs);
    pthread_mutex_lock(&ctx->cm_lock);
    if (vrb_gone(ctx)) {
        ret = -ENODEV;
        goto fail;
    }
    if (VRB_NC(rdma_create_id(ctx->cmch, &lis->id, &lis->cmo, RDMA_PS_TCP))) {
        ret = -errno;
        goto fail;
    }
    if (VRB_NC(rdma_bind_addr(lis->id, (struct sockaddr *)&sa))) {
        ret = -errno;
        goto fail;
    }
    if (lis->id->verbs && !vrb_same_device(ctx, lis->id)) {
        ret = -EADDRNOTAVAIL;
        goto fail;
    }
    if (VRB_NC(rdma_listen(lis->id, backlog > 0 ? backlog : 16))) {
        ret = -errno;
        goto fail;
    }
    exs_list_add_tail(&ctx->listeners, &lis->link);
    pthread_mutex_unlock(&ctx->cm_lock);
    *lis_p = &lis->base;
    return 0;
fail:
    if (lis->id)
        VRB_NC(rdma_destroy_id(lis->id));
    pthread_mutex_unlock(&ctx->cm_lock);
    EXS_DBG(PROV, "ctx %p: listen: %s", (void *)ctx, strerror(-ret));
    free(lis);
    return ret;
}

int exs__vrb_listener_addr(struct exs_prov_listener *l, struct sockaddr_storage *addr,
                           socklen_t *addrlen)
{
    struct vrb_listener *lis = (struct vrb_listener *)l;
    struct sockaddr *sa;
    struct sockaddr_storage tmp;
    socklen_t len;

    pthread_mutex_lock(&lis->ctx->cm_lock); /* the device's removal takes lis->id */
    sa = lis->id ? rdma_get_local_addr(lis->id) : NULL;
    if (sa)
        vrb_sa_copy(lis->ctx, lis->loopback, sa, &tmp, &len);
    pthread_mutex_unlock(&lis->ctx->cm_lock);
    if (!sa)
        return -ENOTCONN;
    if (*addrlen < len)
        return -EINVAL;
    memcpy(addr, &tmp, len);
    *addrlen = len;
    return 0;
}

static void vrb_req_free(struct vrb_req *req, int reject)
{
    if (reject && !req->broken && req->id) {
        /* with our header, so that the active side sees REJECTED, not UNREACHABLE */
        uint8_t buf[VRB_PD_HDR];

        exs__vrb_pd_hdr(buf, NULL, 0, 0, 0);
        if (VRB_NC(rdma_reject(req->id, buf, VRB_PD_HDR)))
            EXS_DBG(PROV, "rdma_reject: %m (the peer gave up)");
    }
    if (req->id) {
        req->id->context = NULL;
        VRB_NC(rdma_destroy_id(req->id));
    }
    exs_list_del(&req->link);
    free(req);
}

void exs__vrb_listener_destroy(struct exs_prov_listener *l)
{
    struct vrb_listener *lis = (struct vrb_listener *)l;
    struct vrb_ctx *ctx;
    struct exs_list *l2;

    if (!lis)
        return;
    ctx = lis->ctx;
    pthread_mutex_lock(&ctx->cm_lock);
    exs__vrb_cm_purge_listener(ctx, &lis->base);
    while ((l2 = lis->reqs.next) != &lis->reqs)
        vrb_req_free(exs_list_entry(l2, struct vrb_req, link), 1);
    exs_list_del(&lis->link);
    if (lis->id) {
        lis->id->context = NULL;
        VRB_NC(rdma_destroy_id(lis->id));
    }
    pthread_mutex_unlock(&ctx->cm_lock);
    free(lis);
}

/* ---- connect / accept / reject / disconnect ---- */

static void vrb_connect_fail(struct vrb_ep *ep, int status)
{
    struct exs_prov_cm_event ev;

    EXS_CNT_INC(ep->ctx->cnt.conns_unreachable);
    exs__vrb_ep_set_error(ep);
    ep->disc_sent = 1;
    vrb_ep_event(ep, EXS_PROV_CM_UNREACHABLE, status, &ev);
    exs__vrb_cm_push(ep->ctx, &ev);
}

int exs__vrb_connect(struct exs_prov_ep *e, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx = ep->ctx;
    struct sockaddr_storage sa;

    if (!addr || addrlen < sizeof(struct sockaddr_in) || addrlen > sizeof(sa) ||
        (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return -EINVAL;
    if (pdlen > VRB_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    memset(&sa, 0, sizeof(sa));
    memcpy(&sa, addr, addrlen);
    pthread_mutex_lock(&ctx->cm_lock);
    if (ep->id || __atomic_load_n(&ep->state, __ATOMIC_RELAXED) != EXS_PROV_EP_IDLE) {
        pthread_mutex_unlock(&ctx->cm_lock);
        return -EISCONN;
    }
    if (vrb_gone(ctx)) {
        pthread_mutex_unlock(&ctx->cm_lock);
        return -ENODEV;
    }
    if (pdlen)
        memcpy(ep->cpd, pd, pdlen);
    ep->cpd_len = pdlen;
    if (sa.ss_family == AF_INET && VRB_IN_LOOPBACK((struct sockaddr_in *)&sa) &&
        ctx->loop_addr.s_addr) {
        ((struct sockaddr_in *)&sa)->sin_addr = ctx->loop_addr;
        ep->loopback = 1;
    }
    if (VRB_NC(rdma_create_id(ctx->cmch, &ep->id, &ep->cmo, RDMA_PS_TCP))) {
        int err = errno;

        ep->id = NULL;
        pthread_mutex_unlock(&ctx->cm_lock);
        return -err;
    }
    ep->active = 1;
    ep->connect_ns = exs__now_ns();
    exs__lite_lock_st(&ep->lock);
    __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTING, __ATOMIC_RELAXED);
    exs__lite_unlock_st(&ep->lock);
    if (VRB_NC(rdma_resolve_addr(ep->id, NULL, (struct sockaddr *)&sa, VRB_RESOLVE_MS))) {
        int err = errno;

        EXS_DBG(PROV, "ep %p: rdma_resolve_addr: %s", (void *)ep, strerror(err));
        vrb_connect_fail(ep, -(err ? err : EHOSTUNREACH));
    }
    pthread_mutex_unlock(&ctx->cm_lock);
    return 0;
}

int exs__vrb_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                    uint32_t pdlen)
{
    struct vrb_req *req = (struct vrb_req *)r;
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx;
    struct rdma_conn_param cp;
    uint8_t buf[VRB_PD_HDR + VRB_PD_MAX];
    uint8_t rres, idepth;
    int ret;

    if (!req || !ep || pdlen > VRB_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    ctx = ep->ctx;
    if (&ctx->base != req->lis->base.ctx)
        return -EINVAL;
    pthread_mutex_lock(&ctx->cm_lock);
    if (ep->id || __atomic_load_n(&ep->state, __ATOMIC_RELAXED) != EXS_PROV_EP_IDLE) {
        pthread_mutex_unlock(&ctx->cm_lock);
        return -EISCONN;
    }
    if (req->broken || !req->id || !ep->qp) {
        /* the request stays the consumer's: reject releases it */
        pthread_mutex_unlock(&ctx->cm_lock);
        return vrb_gone(ctx) ? -ENODEV : -ECONNRESET;
    }
    rres = (uint8_t)EXS_MIN(vrb_rd_res(ctx), EXS_MAX(req->init_depth, 1));
    idepth = (uint8_t)EXS_MIN(vrb_rd_init(ctx), EXS_MAX(req->resp_res, 1));
    ep->id = req->id;
    ep->loopback = req->lis->loopback;
    ret = vrb_qp_to_rts(ep, ep->id, rres, idepth);
    if (ret) {
        EXS_ERR(PROV, "ep %p: accept: QP to RTS: %s", (void *)ep, strerror(-ret));
        ep->id = NULL; /* the request is still the consumer's, to reject */
        exs__vrb_ep_set_error(ep);
        pthread_mutex_unlock(&ctx->cm_lock);
        return ret;
    }
    exs__vrb_pd_hdr(buf, pd, pdlen, ctx->udp_port, ep->tok);
    memset(&cp, 0, sizeof(cp));
    cp.private_data = buf;
    cp.private_data_len = (uint8_t)(VRB_PD_HDR + pdlen);
    cp.responder_resources = rres;
    cp.initiator_depth = idepth;
    cp.flow_control = 1;
    cp.retry_count = ctx->retry_cnt;
    cp.rnr_retry_count = EXS_MIN(ep->base.attr.rnr_retry, ctx->rnr_retry);
    cp.qp_num = ep->qp->qp_num;
    exs__lite_lock_st(&ep->lock);
    __atomic_store_n(&ep->state, EXS_PROV_EP_CONNECTING, __ATOMIC_RELAXED);
    exs__lite_unlock_st(&ep->lock);
    ep->id->context = &ep->cmo;
    if (VRB_NC(rdma_accept(ep->id, &cp))) {
        ret = -errno;
        EXS_DBG(PROV, "ep %p: rdma_accept: %s", (void *)ep, strerror(-ret));
        ep->id->context = &req->cmo; /* the request is still the consumer's, to reject */
        ep->id = NULL;
        req->broken = 1;
        exs__vrb_ep_set_error(ep);
        pthread_mutex_unlock(&ctx->cm_lock);
        return ret;
    }
    exs_list_del(&req->link);
    free(req);
    pthread_mutex_unlock(&ctx->cm_lock);
    return 0;
}

int exs__vrb_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct vrb_req *req = (struct vrb_req *)r;
    struct vrb_ctx *ctx;
    uint8_t buf[VRB_PD_HDR + VRB_PD_MAX];

    if (!req || pdlen > VRB_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    ctx = req->lis->ctx;
    exs__vrb_pd_hdr(buf, pd, pdlen, 0, 0);
    pthread_mutex_lock(&ctx->cm_lock);
    /* The request is released whatever happens: a peer that gave up meanwhile (broken,
     * or its cm already gone when rdma_reject runs) has nothing left to be told. */
    if (!req->broken && req->id && VRB_NC(rdma_reject(req->id, buf, (uint8_t)(VRB_PD_HDR + pdlen))))
        EXS_DBG(PROV, "ctx %p: rdma_reject: %m (the peer gave up)", (void *)ctx);
    vrb_req_free(req, 0);
    pthread_mutex_unlock(&ctx->cm_lock);
    return 0;
}

int exs__vrb_disconnect(struct exs_prov_ep *e)
{
    struct vrb_ep *ep = vrb_ep_of(e);
    struct vrb_ctx *ctx;
    struct exs_prov_cm_event ev;
    int state;

    if (!ep)
        return -EINVAL;
    ctx = ep->ctx;
    pthread_mutex_lock(&ctx->cm_lock);
    state = __atomic_load_n(&ep->state, __ATOMIC_RELAXED);
    if (state == EXS_PROV_EP_IDLE && !ep->id) {
        pthread_mutex_unlock(&ctx->cm_lock);
        return -EINVAL;
    }
    exs__vrb_ep_set_error(ep);
    if (ep->disc_sent) {
        pthread_mutex_unlock(&ctx->cm_lock);
        return 0;
    }
    ep->local_disc = 1;
    /* The local end is final at once: DISCONNECTED now, not when the peer's CM answers the
     * DREQ (a stopped peer process answers only after the CM's retries, a minute). */
    if (ep->up)
        exs__vrb_say_bye(ep, 0);
    if (ep->id)
        VRB_NC(rdma_disconnect(ep->id));
    ep->disc_sent = 1;
    EXS_CNT_INC(ctx->cnt.disconnects);
    vrb_ep_event(ep, EXS_PROV_CM_DISCONNECTED, 0, &ev);
    exs__vrb_cm_push(ctx, &ev);
    pthread_mutex_unlock(&ctx->cm_lock);
    return 0;
}

/* ---- rdma_cm events ---- */

static int vrb_on_connect_request(struct vrb_ctx *ctx, struct rdma_cm_event *cme,
                                  struct exs_prov_cm_event *ev)
{
    struct vrb_cmobj *o = cme->listen_id ? cme->listen_id->context : NULL;
    struct vrb_listener *lis;
    struct vrb_req *req;
    struct sockaddr *peer;
    uint32_t len;

    if (!o || o->kind != VRB_K_LIS || vrb_gone(ctx))
        return -1; /* reject */
    lis = exs_container_of(o, struct vrb_listener, cmo);
    if (!vrb_same_device(ctx, cme->id)) {
        EXS_WARN(PROV, "ctx %p: connect request on another device, rejected", (void *)ctx);
        return -1;
    }
    req = calloc(1, sizeof(*req));
    if (!req)
        return -1;
    req->base.listener = &lis->base;
    req->cmo.kind = VRB_K_REQ;
    req->lis = lis;
    req->id = cme->id;
    req->resp_res = cme->param.conn.responder_resources;
    req->init_depth = cme->param.conn.initiator_depth;
    cme->id->context = &req->cmo;
    exs_list_add_tail(&lis->reqs, &req->link);
    memset(ev, 0, sizeof(*ev));
    ev->type = EXS_PROV_CM_CONNECT_REQUEST;
    ev->listener = &lis->base;
    ev->req = &req->base;
    len = (uint32_t)(cme->param.conn.retry_count & 7) |
          ((uint32_t)(cme->param.conn.rnr_retry_count & 7) << 3);
    len = EXS_MIN(len, EXS_MIN(VRB_PD_MAX, cme->param.conn.private_data_len));
    if (len && cme->param.conn.private_data)
        memcpy(ev->private_data, cme->param.conn.private_data, len);
    ev->private_data_len = cme->param.conn.private_data ? len : 0;
    peer = rdma_get_peer_addr(cme->id);
    if (peer && (peer->sa_family == AF_INET || peer->sa_family == AF_INET6))
        vrb_sa_copy(ctx, lis->loopback, peer, &ev->peer_addr, &ev->peer_addrlen);
    return 1;
}

/* Route resolved: send the REQ. 0 or -errno. */
static int vrb_send_req(struct vrb_ep *ep)
{
    struct vrb_ctx *ctx = ep->ctx;
    struct rdma_conn_param cp;
    int ret = 0;

    memset(&cp, 0, sizeof(cp));
    if (ep->cpd_len) {
        cp.private_data = ep->cpd;
        cp.private_data_len = (uint8_t)ep->cpd_len;
    }
    cp.retry_count = (uint8_t)(ep->cpd_len & 7);
    cp.rnr_retry_count = (uint8_t)((ep->cpd_len >> 3) & 7);
    cp.responder_resources = vrb_rd_res(ctx);
    cp.initiator_depth = vrb_rd_init(ctx);
    cp.flow_control = 1;
    cp.qp_num = ep->qp->qp_num;
    if (VRB_NC(rdma_connect(ep->id, &cp)))
        ret = -errno;
    return ret;
}

static int vrb_on_ep_event(struct vrb_ctx *ctx, struct vrb_ep *ep, struct rdma_cm_event *cme,
                           struct exs_prov_cm_event *ev)
{
    int ret;

    switch (cme->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (ep->disc_sent)
            return 0;
        if (!vrb_same_device(ctx, ep->id)) {
            EXS_DBG(PROV, "ep %p: address resolves to another device", (void *)ep);
            vrb_connect_fail(ep, -ENETUNREACH);
            return 0;
        }
        if (VRB_NC(rdma_resolve_route(ep->id, VRB_RESOLVE_MS))) {
            int err = errno;

            vrb_connect_fail(ep, -(err ? err : EHOSTUNREACH));
        }
        return 0;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (ep->disc_sent)
            return 0;
        ret = vrb_send_req(ep);
        if (ret)
            vrb_connect_fail(ep, ret);
        return 0;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        if (ep->disc_sent || ep->up) {
            VRB_NC(rdma_reject(ep->id, NULL, 0));
            return 0;
        }
        vrb_ep_event(ep, EXS_PROV_CM_ESTABLISHED, 0, ev);
        {
            uint16_t port = 0;
            struct sockaddr *peer = rdma_get_peer_addr(ep->id);

            if (exs__vrb_pd_parse(cme->param.conn.private_data, cme->param.conn.private_data_len,
                                  ev, &port, &ep->peer_tok) &&
                port && ctx->udpfd >= 0 && peer && peer->sa_family == AF_INET) {
                memcpy(&ep->peer_bye, peer, sizeof(ep->peer_bye));
                ep->peer_bye.sin_port = port;
                ep->bye_ok = 1;
                /* before the RTU: the passive side knows where to say goodbye by the time
                 * it sees ESTABLISHED */
                exs__vrb_say_hello(ep);
            }
        }
        ret = vrb_qp_to_rts(
            ep, ep->id,
            (uint8_t)EXS_MIN(vrb_rd_res(ctx), EXS_MAX(cme->param.conn.initiator_depth, 1)),
            (uint8_t)EXS_MIN(vrb_rd_init(ctx), EXS_MAX(cme->param.conn.responder_resources, 1)));
        if (!ret && VRB_NC(rdma_establish(ep->id)))
            ret = -errno;
        if (ret) {
            EXS_ERR(PROV, "ep %p: connect response: %s", (void *)ep, strerror(-ret));
            VRB_NC(rdma_reject(ep->id, NULL, 0));
            vrb_connect_fail(ep, ret);
            return 0;
        }
        vrb_ep_up(ep);
        return 1;
    case RDMA_CM_EVENT_ESTABLISHED:
        if (ep->disc_sent || ep->up)
            return 0;
        vrb_ep_up(ep);
        vrb_ep_event(ep, EXS_PROV_CM_ESTABLISHED, 0, ev);
        if (ep->active)
            exs__vrb_pd_parse(cme->param.conn.private_data, cme->param.conn.private_data_len, ev,
                              NULL, NULL);
        return 1;
    case RDMA_CM_EVENT_REJECTED:
        if (ep->disc_sent)
            return 0;
        exs__vrb_ep_set_error(ep);
        ep->disc_sent = 1;
        if (!ep->active || ep->up) {
            vrb_ep_event(ep, EXS_PROV_CM_DISCONNECTED, -ECONNRESET, ev);
            return 1;
        }
        vrb_ep_event(ep, EXS_PROV_CM_REJECTED, -ECONNREFUSED, ev);
        if (cme->status == VRB_REJ_CONSUMER &&
            exs__vrb_pd_parse(cme->param.conn.private_data, cme->param.conn.private_data_len, ev,
                              NULL, NULL)) {
            EXS_CNT_INC(ctx->cnt.conns_rejected);
            return 1;
        }
        /* no listener (invalid service id), or the peer's CM refused without our header */
        EXS_DBG(PROV, "ep %p: rejected, reason %d: unreachable", (void *)ep, cme->status);
        EXS_CNT_INC(ctx->cnt.conns_unreachable);
        vrb_ep_event(ep, EXS_PROV_CM_UNREACHABLE, -ECONNREFUSED, ev);
        return 1;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
        if (ep->disc_sent)
            return 0;
        exs__vrb_ep_set_error(ep);
        ep->disc_sent = 1;
        if (!ep->active || ep->up) {
            vrb_ep_event(ep, EXS_PROV_CM_DISCONNECTED, -ECONNRESET, ev);
            return 1;
        }
        EXS_CNT_INC(ctx->cnt.conns_unreachable);
        vrb_ep_event(ep, EXS_PROV_CM_UNREACHABLE,
                     cme->status < 0                           ? cme->status
                     : cme->event == RDMA_CM_EVENT_UNREACHABLE ? -ETIMEDOUT
                                                               : -EHOSTUNREACH,
                     ev);
        return 1;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        if (cme->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
            ctx->gone_pending = 1; /* everything goes once the event is acked */
        exs__vrb_ep_set_error(ep);
        /* answer the DREQ at once so the peer's DISCONNECTED is not held for a timeout */
        VRB_NC(rdma_disconnect(ep->id));
        if (ep->disc_sent)
            return 0;
        ep->disc_sent = 1;
        EXS_CNT_INC(ctx->cnt.disconnects);
        if (ep->active && !ep->up) {
            vrb_ep_event(ep, EXS_PROV_CM_UNREACHABLE, -ECONNRESET, ev);
            return 1;
        }
        if (cme->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
            vrb_ep_event(ep, EXS_PROV_CM_DISCONNECTED, -ENODEV, ev);
            return 1;
        }
        if (ep->up && ep->bye_ok && !ep->got_bye && !ep->local_disc) {
            /* orderly ends are announced; hold it briefly for a goodbye still in flight */
            ep->disc_at = exs__now_ns() + VRB_BYE_WAIT_NS;
            exs_list_add_tail(&ctx->disc_wait, &ep->disc_link);
            return 0;
        }
        vrb_ep_event(ep, EXS_PROV_CM_DISCONNECTED, ep->up ? 0 : -ECONNRESET, ev);
        if (ep->peer_closed)
            ev->flags = EXS_PROV_CM_F_PEER_CLOSED;
        return 1;
    default:
        return 0;
    }
}

int exs__vrb_cm_process(struct vrb_ctx *ctx, struct exs_prov_cm_event *ev)
{
    struct rdma_cm_event *cme;

    for (;;) {
        struct vrb_cmobj *o;
        struct rdma_cm_id *reject_id = NULL;
        int ret = 0;

        if (rdma_get_cm_event(ctx->cmch, &cme))
            return 0; /* EAGAIN: nothing pending */
        EXS_CNT_INC(ctx->cnt.cm_events);
        EXS_DBG(PROV, "ctx %p: cm event %s status %d", (void *)ctx, rdma_event_str(cme->event),
                cme->status);
        if (cme->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            ret = vrb_on_connect_request(ctx, cme, ev);
            if (ret < 0) {
                reject_id = cme->id;
                ret = 0;
            }
        } else {
            o = cme->id ? cme->id->context : NULL;
            if (o && o->kind == VRB_K_EP)
                ret = vrb_on_ep_event(ctx, exs_container_of(o, struct vrb_ep, cmo), cme, ev);
            else if (o && cme->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
                ctx->gone_pending = 1; /* the watch id, a listener's or a request's */
            if (o && o->kind == VRB_K_REQ &&
                (cme->event == RDMA_CM_EVENT_REJECTED || cme->event == RDMA_CM_EVENT_DISCONNECTED ||
                 cme->event == RDMA_CM_EVENT_CONNECT_ERROR ||
                 cme->event == RDMA_CM_EVENT_UNREACHABLE))
                exs_container_of(o, struct vrb_req, cmo)->broken = 1;
        }
        VRB_NC(rdma_ack_cm_event(cme));
        if (reject_id) {
            VRB_NC(rdma_reject(reject_id, NULL, 0));
            VRB_NC(rdma_destroy_id(reject_id));
        }
        if (ctx->gone_pending && !vrb_gone(ctx)) {
            /* the ep's own event (ret > 0) is returned; the others are pushed */
            if (ret > 0)
                exs__vrb_cm_push(ctx, ev);
            exs__vrb_device_gone(ctx);
            if (ret > 0)
                return 0;
        }
        if (ret > 0)
            return 1;
    }
}
