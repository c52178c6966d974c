/* SPDX-License-Identifier: MIT */
/* Fault provider: memory, grants, endpoints, connections and posts over the inner provider. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exs/prov/fault/fault.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* The inner ops table of a wrapper context. */
#define IOPS(_ctx) ((_ctx)->inner->ops)

/* ---- memory ---- */

/* A wrapper for inner mr m (NULL without memory; m is then released by release). */
static struct fault_mr *fault_mr_wrap(struct fault_ctx *ctx, struct exs_prov_mr *m)
{
    struct fault_mr *mr = malloc(sizeof(*mr));

    if (!mr)
        return NULL;
    mr->base = *m;
    mr->base.ctx = &ctx->base;
    mr->inner = m;
    mr->grants = 0;
    return mr;
}

/* Whether this registration fails (FAULT_REG). */
static int fault_reg_fails(struct fault_ctx *ctx, const char *what, size_t length)
{
    int hit;

    pthread_mutex_lock(&ctx->lock);
    hit = exs__fault_pick_locked(ctx, FAULT_REG, NULL);
    pthread_mutex_unlock(&ctx->lock);
    if (hit)
        EXS_INFO(PROV, "ctx %p: injected registration failure (%s of %zu bytes)", (void *)ctx, what,
                 length);
    return hit;
}

enum { FAULT_MR_REG, FAULT_MR_GET, FAULT_MR_MEM }; /* how the inner mr was made */

/* Wrap the registration the inner provider made (ret, m); it is given back (as it was
 * made: how) when the wrapper cannot be made. */
static int fault_mr_done(struct fault_ctx *ctx, int ret, struct exs_prov_mr *m, int how,
                         struct exs_prov_mr **mr_p)
{
    struct fault_mr *mr;

    if (ret)
        return ret;
    mr = fault_mr_wrap(ctx, m);
    if (!mr) {
        if (how == FAULT_MR_GET)
            IOPS(ctx)->mr_put(m);
        else if (how == FAULT_MR_MEM)
            IOPS(ctx)->mem_free(m);
        else
            IOPS(ctx)->mr_dereg(m);
        return -ENOMEM;
    }
    *mr_p = &mr->base;
    return 0;
}

static int fault_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                        struct exs_prov_mr **mr_p)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_prov_mr *m = NULL;
    int ret;

    if (fault_reg_fails(ctx, "mr_reg", length))
        return -ENOMEM;
    ret = IOPS(ctx)->mr_reg(ctx->inner, addr, length, access, &m);
    return fault_mr_done(ctx, ret, m, FAULT_MR_REG, mr_p);
}

static int fault_mr_dereg(struct exs_prov_mr *m)
{
    struct fault_mr *mr = fault_mr_of(m);
    struct fault_ctx *ctx = fault_ctx_of(m->ctx);
    int ret = IOPS(ctx)->mr_dereg(mr->inner);

    if (!ret)
        free(mr);
    return ret;
}

static int fault_mem_alloc(struct exs_prov_ctx *c, size_t len, struct exs_prov_mr **mr_p)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_prov_mr *m = NULL;
    int ret;

    if (fault_reg_fails(ctx, "mem_alloc", len))
        return -ENOMEM;
    ret = IOPS(ctx)->mem_alloc(ctx->inner, len, &m);
    return fault_mr_done(ctx, ret, m, FAULT_MR_MEM, mr_p);
}

/* Whether mr may go: with grants alive the inner provider keeps the memory (the peer
 * may still reach it), so the wrapper stays too. */
static int fault_mr_idle(struct fault_mr *mr, const char *what)
{
    uint32_t n = __atomic_load_n(&mr->grants, __ATOMIC_ACQUIRE);

    if (n)
        EXS_ERR(PROV, "%s %p: %u live grants; kept", what, mr->base.addr, n);
    return !n;
}

static void fault_mem_free(struct exs_prov_mr *m)
{
    struct fault_mr *mr = fault_mr_of(m);

    if (!fault_mr_idle(mr, "mem_free"))
        return;
    IOPS(fault_ctx_of(m->ctx))->mem_free(mr->inner);
    free(mr);
}

static int fault_mr_get(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                        struct exs_prov_mr **mr_p)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_prov_mr *m = NULL;
    int ret;

    if (fault_reg_fails(ctx, "mr_get", length))
        return -ENOMEM;
    ret = IOPS(ctx)->mr_get(ctx->inner, addr, length, access, &m);
    return fault_mr_done(ctx, ret, m, FAULT_MR_GET, mr_p);
}

static void fault_mr_put(struct exs_prov_mr *m)
{
    struct fault_mr *mr = fault_mr_of(m);

    if (!fault_mr_idle(mr, "mr_put"))
        return;
    IOPS(fault_ctx_of(m->ctx))->mr_put(mr->inner);
    free(mr);
}

static int fault_grant(struct exs_prov_ep *e, struct exs_prov_mr *m, void *addr, size_t length,
                       unsigned access, struct exs_prov_grant **grant_p)
{
    struct fault_ep *ep = fault_ep_of(e);
    struct fault_grant *g = malloc(sizeof(*g));
    struct exs_prov_grant *ig;
    int ret;

    if (!g)
        return -ENOMEM;
    ret = IOPS(ep->ctx)->grant(ep->inner, fault_mr_of(m)->inner, addr, length, access, &ig);
    if (ret) {
        free(g);
        return ret;
    }
    g->base = *ig;
    g->base.ep = e;
    g->base.mr = m;
    g->inner = ig;
    __atomic_fetch_add(&fault_mr_of(m)->grants, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&ep->ctx->lock);
    exs_list_add_tail(&ep->grants, &g->link);
    pthread_mutex_unlock(&ep->ctx->lock);
    *grant_p = &g->base;
    return 0;
}

static void fault_revoke(struct exs_prov_grant *gr)
{
    struct fault_grant *g = exs_container_of(gr, struct fault_grant, base);
    struct fault_ctx *ctx = fault_ep_of(gr->ep)->ctx;

    pthread_mutex_lock(&ctx->lock);
    exs_list_del(&g->link);
    pthread_mutex_unlock(&ctx->lock);
    IOPS(ctx)->revoke(g->inner);
    __atomic_fetch_sub(&fault_mr_of(gr->mr)->grants, 1, __ATOMIC_RELEASE);
    free(g);
}

static int fault_grant_settle(struct exs_prov_grant *gr)
{
    struct fault_grant *g = exs_container_of(gr, struct fault_grant, base);
    struct fault_ctx *ctx = fault_ep_of(gr->ep)->ctx;

    return IOPS(ctx)->grant_settle ? IOPS(ctx)->grant_settle(g->inner) : 0;
}

/* ---- endpoints ---- */

static int fault_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                           struct exs_prov_ep **ep_p)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_prov_ep_attr iattr;
    struct fault_ep *ep;
    int ret;

    if (!attr)
        return -EINVAL;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    iattr = *attr;
    iattr.user = ep;
    ret = IOPS(ctx)->ep_create(ctx->inner, &iattr, &ep->inner);
    if (ret) {
        free(ep);
        return ret;
    }
    ep->base.ctx = c;
    ep->base.user = attr->user;
    ep->base.attr = ep->inner->attr;
    ep->base.attr.user = attr->user;
    ep->ctx = ctx;
    exs_list_init(&ep->posts);
    exs_list_init(&ep->grants);
    pthread_mutex_lock(&ctx->lock);
    exs_list_add_tail(&ctx->eps, &ep->link);
    pthread_mutex_unlock(&ctx->lock);
    *ep_p = &ep->base;
    return 0;
}

static void fault_ep_destroy(struct exs_prov_ep *e)
{
    struct fault_ep *ep = fault_ep_of(e);
    struct fault_ctx *ctx = ep->ctx;

    pthread_mutex_lock(&ctx->lock);
    while (ep->replaying) {
        /* the thaw thread is posting its frozen sends: a moment */
        struct timespec ts = {.tv_nsec = 100000};

        pthread_mutex_unlock(&ctx->lock);
        exs__nc_nanosleep(&ts);
        pthread_mutex_lock(&ctx->lock);
    }
    exs__fault_purge_ep_locked(ctx, ep);
    exs_list_del(&ep->link);
    pthread_mutex_unlock(&ctx->lock);
    /* revokes (and logs) the grants the consumer left */
    IOPS(ctx)->ep_destroy(ep->inner);
    while (!exs_list_empty(&ep->grants)) {
        struct fault_grant *g =
            exs_list_entry(exs_list_pop_head(&ep->grants), struct fault_grant, link);

        __atomic_fetch_sub(&fault_mr_of(g->base.mr)->grants, 1, __ATOMIC_RELEASE);
        free(g);
    }
    free(ep);
}

static enum exs_prov_ep_state fault_ep_state(struct exs_prov_ep *e)
{
    struct fault_ep *ep = fault_ep_of(e);
    int failed;

    pthread_mutex_lock(&ep->ctx->lock);
    failed = ep->failed || ep->connect_failed;
    pthread_mutex_unlock(&ep->ctx->lock);
    if (failed)
        return EXS_PROV_EP_ERROR;
    return IOPS(ep->ctx)->ep_state(ep->inner);
}

static int fault_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr,
                               socklen_t *addrlen)
{
    struct fault_ep *ep = fault_ep_of(e);

    return IOPS(ep->ctx)->ep_local_addr(ep->inner, addr, addrlen);
}

/* ---- connection management ---- */

static int fault_listen(struct exs_prov_ctx *c, const struct sockaddr *addr, socklen_t addrlen,
                        int backlog, void *user, struct exs_prov_listener **lis_p)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct fault_lis *lis = calloc(1, sizeof(*lis));
    int ret;

    if (!lis)
        return -ENOMEM;
    exs_list_init(&lis->reqs);
    lis->base.ctx = c;
    lis->base.user = user;
    ret = IOPS(ctx)->listen(ctx->inner, addr, addrlen, backlog, lis, &lis->inner);
    if (ret) {
        free(lis);
        return ret;
    }
    *lis_p = &lis->base;
    return 0;
}

static int fault_listener_addr(struct exs_prov_listener *l, struct sockaddr_storage *addr,
                               socklen_t *addrlen)
{
    return IOPS(fault_ctx_of(l->ctx))->listener_addr(fault_lis_of(l)->inner, addr, addrlen);
}

static void fault_listener_destroy(struct exs_prov_listener *l)
{
    struct fault_lis *lis = fault_lis_of(l);
    struct fault_ctx *ctx = fault_ctx_of(l->ctx);

    pthread_mutex_lock(&ctx->lock);
    exs__fault_purge_lis_locked(ctx, lis);
    pthread_mutex_unlock(&ctx->lock);
    /* rejects the requests still pending, ours among them */
    IOPS(ctx)->listener_destroy(lis->inner);
    while (!exs_list_empty(&lis->reqs))
        free(exs_list_entry(exs_list_pop_head(&lis->reqs), struct fault_req, link));
    free(lis);
}

static int fault_listener_pause(struct exs_prov_listener *l, int pause)
{
    return IOPS(fault_ctx_of(l->ctx))->listener_pause(fault_lis_of(l)->inner, pause);
}

static int fault_connect(struct exs_prov_ep *e, const struct sockaddr *addr, socklen_t addrlen,
                         const void *pd, uint32_t pdlen)
{
    struct fault_ep *ep = fault_ep_of(e);
    struct fault_ctx *ctx = ep->ctx;
    struct fault_cm *cm;

    pthread_mutex_lock(&ctx->lock);
    if (addr && addr->sa_family == AF_INET && addrlen >= sizeof(struct sockaddr_in))
        ep->peer_port = ntohs(((const struct sockaddr_in *)addr)->sin_port);
    else if (addr && addr->sa_family == AF_INET6 && addrlen >= sizeof(struct sockaddr_in6))
        ep->peer_port = ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
    if (!exs__fault_pick_locked(ctx, FAULT_CONNECT, ep)) {
        pthread_mutex_unlock(&ctx->lock);
        return IOPS(ctx)->connect(ep->inner, addr, addrlen, pd, pdlen);
    }
    if (__atomic_load_n(&exs__params.fault_connect_sync, __ATOMIC_RELAXED)) {
        /* the call itself fails: nothing went out, no event follows */
        pthread_mutex_unlock(&ctx->lock);
        EXS_INFO(PROV, "ep %p: injected connect failure: the call refused", (void *)ep);
        return -ECONNREFUSED;
    }
    cm = calloc(1, sizeof(*cm));
    if (!cm) {
        pthread_mutex_unlock(&ctx->lock);
        return -ENOMEM;
    }
    /* the peer refused, or nothing answered: in turn */
    cm->ev.ep = e;
    if (ctx->connect_turn++ % 2 == 0) {
        cm->ev.type = EXS_PROV_CM_REJECTED;
    } else {
        cm->ev.type = EXS_PROV_CM_UNREACHABLE;
        cm->ev.status = -ETIMEDOUT;
    }
    ep->connect_failed = 1;
    /* logged before the event is queued: once unlocked, a poller may take and free it */
    EXS_INFO(PROV, "ep %p: injected connect failure: %s", (void *)ep,
             exs__prov_cm_event_str(cm->ev.type));
    exs__fault_cm_push_locked(ctx, cm);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

static struct fault_req *fault_req_of(struct exs_prov_conn_req *r)
{
    return exs_container_of(r, struct fault_req, base);
}

static int fault_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                        uint32_t pdlen)
{
    struct fault_req *req = fault_req_of(r);
    struct fault_ep *ep = fault_ep_of(e);
    struct fault_ctx *ctx = ep->ctx;
    int ret = IOPS(ctx)->accept(req->inner, ep->inner, pd, pdlen);

    if (!ret) {
        pthread_mutex_lock(&ctx->lock);
        exs_list_del(&req->link);
        pthread_mutex_unlock(&ctx->lock);
        free(req);
    }
    return ret;
}

static int fault_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct fault_req *req = fault_req_of(r);
    struct fault_ctx *ctx = fault_ctx_of(r->listener->ctx);
    int ret = IOPS(ctx)->reject(req->inner, pd, pdlen);

    if (!ret) {
        pthread_mutex_lock(&ctx->lock);
        exs_list_del(&req->link);
        pthread_mutex_unlock(&ctx->lock);
        free(req);
    }
    return ret;
}

static int fault_disconnect(struct exs_prov_ep *e)
{
    struct fault_ep *ep = fault_ep_of(e);
    int cfailed;

    pthread_mutex_lock(&ep->ctx->lock);
    cfailed = ep->connect_failed;
    pthread_mutex_unlock(&ep->ctx->lock);
    if (cfailed)
        return 0; /* never reached the inner provider */
    return IOPS(ep->ctx)->disconnect(ep->inner);
}

/* ---- data path ---- */

static int fault_post_recv(struct exs_prov_ep *e, const struct exs_prov_recv_wr *wr)
{
    struct fault_ep *ep = fault_ep_of(e);

    return IOPS(ep->ctx)->post_recv(ep->inner, wr);
}

void exs__fault_post_free(struct fault_post *p)
{
    free(p->sge);
    free(p->data);
    free(p);
}

/* A copy of wr that outlives the call (inline data copied now, as the caller may reuse
 * its buffer as soon as post_send returns). */
static struct fault_post *fault_post_copy(const struct exs_prov_send_wr *wr)
{
    struct fault_post *p = calloc(1, sizeof(*p));
    size_t total = 0;

    if (!p)
        return NULL;
    p->wr = *wr;
    if (wr->num_sge < 0)
        goto err_free;
    if (wr->flags & EXS_PROV_SEND_INLINE) {
        size_t off = 0;

        for (int i = 0; i < wr->num_sge; i++)
            total += wr->sg_list[i].length;
        p->data = malloc(total ? total : 1);
        p->sge = calloc(1, sizeof(*p->sge));
        if (!p->data || !p->sge)
            goto err_free;
        for (int i = 0; i < wr->num_sge; i++) {
            memcpy((char *)p->data + off, (const void *)(uintptr_t)wr->sg_list[i].addr,
                   wr->sg_list[i].length);
            off += wr->sg_list[i].length;
        }
        p->sge->addr = (uint64_t)(uintptr_t)p->data;
        p->sge->length = (uint32_t)total;
        p->wr.num_sge = wr->num_sge ? 1 : 0;
    } else if (wr->num_sge) {
        p->sge = malloc((size_t)wr->num_sge * sizeof(*p->sge));
        if (!p->sge)
            goto err_free;
        memcpy(p->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*p->sge));
    }
    p->wr.sg_list = p->sge;
    return p;

err_free:
    exs__fault_post_free(p);
    return NULL;
}

int exs__fault_post_replay(struct fault_ep *ep, struct fault_post *p)
{
    return IOPS(ep->ctx)->post_send(ep->inner, &p->wr);
}

static int fault_post_send(struct exs_prov_ep *e, const struct exs_prov_send_wr *wr)
{
    struct fault_ep *ep = fault_ep_of(e);
    struct fault_ctx *ctx = ep->ctx;
    int connected = IOPS(ctx)->ep_state(ep->inner) == EXS_PROV_EP_CONNECTED;
    int drop = 0;

    pthread_mutex_lock(&ctx->lock);
    if (connected && !ep->freeze_ns && exs__fault_pick_locked(ctx, FAULT_FREEZE, ep)) {
        uint64_t now = exs__fault_now_ns();

        ep->freeze_ns = now;
        ctx->nblocked++;
        exs__fault_timer_locked(ctx, now + FAULT_RECHECK_NS);
        exs__fault_frozen_locked(ctx);
        EXS_INFO(PROV, "ep %p: link frozen for %" PRIu64 " ms", (void *)ep,
                 __atomic_load_n(&exs__params.fault_freeze_ms, __ATOMIC_RELAXED));
    }
    if (ep->freeze_ns || ep->replaying || !exs_list_empty(&ep->posts)) {
        struct fault_post *p = fault_post_copy(wr);

        if (!p) {
            pthread_mutex_unlock(&ctx->lock);
            return -ENOMEM;
        }
        exs_list_add_tail(&ep->posts, &p->link);
        pthread_mutex_unlock(&ctx->lock);
        return 0;
    }
    if (connected)
        drop = exs__fault_pick_locked(ctx, FAULT_DROP, ep);
    pthread_mutex_unlock(&ctx->lock);
    if (drop) {
        int ret = IOPS(ctx)->disconnect(ep->inner);

        EXS_INFO(PROV, "ep %p: injected connection drop (%d)", (void *)ep, ret);
    }
    return IOPS(ctx)->post_send(ep->inner, wr);
}

/* ---- the ops tables, one per inner provider ---- */

#define FAULT_OPS(_name, _open)                                                                    \
    {                                                                                              \
        .name = _name, .ctx_open = _open, .ctx_close = exs__fault_ctx_close,                       \
        .ctx_event_fd = exs__fault_ctx_event_fd, .ctx_arm = exs__fault_ctx_arm,                    \
        .ctx_progress = exs__fault_ctx_progress, .ctx_poll = exs__fault_ctx_poll,                  \
        .ctx_cm_poll = exs__fault_ctx_cm_poll, .ctx_fork = exs__fault_ctx_fork,                    \
        .mr_reg = fault_mr_reg, .mr_dereg = fault_mr_dereg, .mem_alloc = fault_mem_alloc,          \
        .mem_free = fault_mem_free, .mr_get = fault_mr_get, .mr_put = fault_mr_put,                \
        .grant = fault_grant, .revoke = fault_revoke, .grant_settle = fault_grant_settle,          \
        .ep_create = fault_ep_create, .ep_destroy = fault_ep_destroy, .ep_state = fault_ep_state,  \
        .ep_local_addr = fault_ep_local_addr, .listen = fault_listen,                              \
        .listener_addr = fault_listener_addr, .listener_destroy = fault_listener_destroy,          \
        .listener_pause = fault_listener_pause, .connect = fault_connect, .accept = fault_accept,  \
        .reject = fault_reject, .disconnect = fault_disconnect, .post_recv = fault_post_recv,      \
        .post_send = fault_post_send,                                                              \
    }

extern struct exs_prov_ops exs__prov_fault_tcp_ops;

static int fault_tcp_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    return exs__fault_ctx_open(&exs__prov_fault_tcp_ops, "tcp", attr, ctx_p);
}

struct exs_prov_ops exs__prov_fault_tcp_ops = FAULT_OPS("fault:tcp", fault_tcp_ctx_open);

#ifdef EXS_HAVE_VERBS_PROV
extern struct exs_prov_ops exs__prov_fault_verbs_ops;

static int fault_verbs_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    return exs__fault_ctx_open(&exs__prov_fault_verbs_ops, "verbs", attr, ctx_p);
}

struct exs_prov_ops exs__prov_fault_verbs_ops = FAULT_OPS("fault:verbs", fault_verbs_ctx_open);
#endif

/* the shm provider under the fault wrapper (exs/prov/shm/, spec/provider-shm.md) */
extern struct exs_prov_ops exs__prov_fault_shm_ops;

static int fault_shm_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    return exs__fault_ctx_open(&exs__prov_fault_shm_ops, "shm", attr, ctx_p);
}

struct exs_prov_ops exs__prov_fault_shm_ops = FAULT_OPS("fault:shm", fault_shm_ctx_open);
