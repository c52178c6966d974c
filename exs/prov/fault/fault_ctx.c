/* SPDX-License-Identifier: MIT */
/* Fault provider context: fault choice, held completions and events, event fd, arm, poll. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/fault/fault.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* Completions taken from the inner provider per ctx_poll call. */
#define FAULT_BATCH    64
/* Distinct eps tracked while delivering (more: the rest wait for the next call). */
#define FAULT_SCAN_EPS 64

static const char *const fault_kind_names[FAULT_KIND_MAX] = {
    [FAULT_DELAY] = "delay",   [FAULT_STALL] = "stall", [FAULT_DROP] = "drop",
    [FAULT_WC] = "wc",         [FAULT_REG] = "reg",     [FAULT_CONNECT] = "connect",
    [FAULT_FREEZE] = "freeze",
};

static const struct exs_counter_desc fault_counter_desc[] = {
    EXS_COUNTER(struct fault_counters, delay, "completions held (delay)"),
    EXS_COUNTER(struct fault_counters, stall, "endpoint completion stalls"),
    EXS_COUNTER(struct fault_counters, drop, "connections dropped"),
    EXS_COUNTER(struct fault_counters, wc, "error completions injected"),
    EXS_COUNTER(struct fault_counters, reg, "memory registrations failed"),
    EXS_COUNTER(struct fault_counters, connect, "connects failed"),
    EXS_COUNTER(struct fault_counters, freeze, "links frozen"),
};

uint64_t exs__fault_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fault_load(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* ---- the choice ---- */

static uint64_t fault_splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fault_rand(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Every kind starts its own sequence from the seed, so enabling one kind does not
 * move the faults of another. */
static void fault_reseed_locked(struct fault_ctx *ctx, uint64_t seed)
{
    ctx->seed = seed;
    for (int k = 0; k < FAULT_KIND_MAX; k++) {
        ctx->sel[k].calls = 0;
        ctx->sel[k].rng = fault_splitmix(seed ^ ((uint64_t)(k + 1) << 56)) | 1;
    }
    ctx->wc_turn = 0;
    ctx->connect_turn = 0;
}

static const uint64_t *fault_nth_param(enum fault_kind k)
{
    static const uint64_t *const p[FAULT_KIND_MAX] = {
        [FAULT_DELAY] = &exs__params.fault_delay_nth,
        [FAULT_STALL] = &exs__params.fault_stall_nth,
        [FAULT_DROP] = &exs__params.fault_drop_nth,
        [FAULT_WC] = &exs__params.fault_wc_nth,
        [FAULT_REG] = &exs__params.fault_reg_nth,
        [FAULT_CONNECT] = &exs__params.fault_connect_nth,
        [FAULT_FREEZE] = &exs__params.fault_freeze_nth,
    };
    return p[k];
}

static const uint64_t *fault_ppm_param(enum fault_kind k)
{
    static const uint64_t *const p[FAULT_KIND_MAX] = {
        [FAULT_DELAY] = &exs__params.fault_delay_ppm,
        [FAULT_STALL] = &exs__params.fault_stall_ppm,
        [FAULT_DROP] = &exs__params.fault_drop_ppm,
        [FAULT_WC] = &exs__params.fault_wc_ppm,
        [FAULT_REG] = &exs__params.fault_reg_ppm,
        [FAULT_CONNECT] = &exs__params.fault_connect_ppm,
        [FAULT_FREEZE] = &exs__params.fault_freeze_ppm,
    };
    return p[k];
}

static int fault_kind_on(enum fault_kind k)
{
    return fault_load(fault_nth_param(k)) || fault_load(fault_ppm_param(k));
}

/* Whether ep belongs to the connection fault_port selects. */
static int fault_port_match_locked(struct fault_ctx *ctx, struct fault_ep *ep, uint64_t port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    if (ep->peer_port == port)
        return 1;
    if (ctx->inner->ops->ep_local_addr(ep->inner, &ss, &len))
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port) == port;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == port;
    return 0;
}

int exs__fault_pick_locked(struct fault_ctx *ctx, enum fault_kind k, struct fault_ep *ep)
{
    uint64_t port = fault_load(&exs__params.fault_port);
    uint64_t nth = fault_load(fault_nth_param(k));
    uint64_t ppm = fault_load(fault_ppm_param(k));
    uint64_t seed = fault_load(&exs__params.fault_seed);
    struct fault_sel *s = &ctx->sel[k];
    uint64_t idx;
    int hit;

    if (!nth && !ppm)
        return 0;
    if (ep && port && !fault_port_match_locked(ctx, ep, port))
        return 0;
    if (seed != ctx->seed)
        fault_reseed_locked(ctx, seed);
    idx = ++s->calls;
    hit = nth && idx % nth == 0;
    if (ppm && fault_rand(&s->rng) % 1000000u < ppm)
        hit = 1;
    if (!hit)
        return 0;
    EXS_CNT_INC(((uint64_t *)&ctx->cnt)[k]);
    EXS_DBG(PROV, "ctx %p: fault %s injected at call %" PRIu64, (void *)ctx, fault_kind_names[k],
            idx);
    return 1;
}

/* ---- the event fd's timer ---- */

static void fault_timer_set_locked(struct fault_ctx *ctx, uint64_t at_ns)
{
    struct itimerspec its = {0};

    if (at_ns) {
        its.it_value.tv_sec = (time_t)(at_ns / 1000000000ull);
        its.it_value.tv_nsec = (long)(at_ns % 1000000000ull);
    }
    if (timerfd_settime(ctx->timerfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) {
        EXS_ERR(PROV, "ctx %p: timerfd_settime: %m", (void *)ctx);
        return;
    }
    ctx->timer_ns = at_ns;
}

void exs__fault_timer_locked(struct fault_ctx *ctx, uint64_t deadline_ns)
{
    if (!deadline_ns)
        deadline_ns = 1; /* already due: 0 would disarm */
    if (!ctx->timer_ns || deadline_ns < ctx->timer_ns)
        fault_timer_set_locked(ctx, deadline_ns);
}

/* ---- stalls and freezes ---- */

static uint64_t fault_stall_end(const struct fault_ep *ep)
{
    return ep->stall_ns + fault_load(&exs__params.fault_stall_ms) * 1000000ull;
}

static uint64_t fault_freeze_end(const struct fault_ep *ep)
{
    return ep->freeze_ns + fault_load(&exs__params.fault_freeze_ms) * 1000000ull;
}

static int fault_frozen(const struct fault_ep *ep, uint64_t now)
{
    return ep->freeze_ns && now < fault_freeze_end(ep);
}

/* End the stalls that are over; *next_p gets the earliest end still ahead. Returns 1
 * when a freeze is over (exs__fault_thaw has work). */
static int fault_expire_locked(struct fault_ctx *ctx, uint64_t now, uint64_t *next_p)
{
    struct exs_list *pos;
    int thaw = 0;

    if (!ctx->nblocked)
        return 0;
    exs_list_for_each(pos, &ctx->eps)
    {
        struct fault_ep *ep = exs_list_entry(pos, struct fault_ep, link);

        if (ep->stall_ns) {
            if (now >= fault_stall_end(ep)) {
                ep->stall_ns = 0;
                ctx->nblocked--;
                EXS_DBG(PROV, "ep %p: stall over", (void *)ep);
            } else if (!*next_p || fault_stall_end(ep) < *next_p) {
                *next_p = fault_stall_end(ep);
            }
        }
        if (ep->freeze_ns) {
            if (now >= fault_freeze_end(ep))
                thaw = 1;
            else if (!*next_p || fault_freeze_end(ep) < *next_p)
                *next_p = fault_freeze_end(ep);
        }
    }
    return thaw;
}

int exs__fault_thaw(struct fault_ctx *ctx)
{
    int did = 0;

    for (;;) {
        struct fault_ep *ep = NULL;
        struct exs_list *pos;
        uint64_t now = exs__fault_now_ns();
        int failed = 0;

        pthread_mutex_lock(&ctx->lock);
        if (!ctx->nblocked) {
            pthread_mutex_unlock(&ctx->lock);
            break;
        }
        exs_list_for_each(pos, &ctx->eps)
        {
            struct fault_ep *e = exs_list_entry(pos, struct fault_ep, link);

            if (e->freeze_ns && !e->replaying && now >= fault_freeze_end(e)) {
                ep = e;
                break;
            }
        }
        if (!ep) {
            pthread_mutex_unlock(&ctx->lock);
            break;
        }
        /* posts made from now on queue behind the replay (replaying) */
        ep->freeze_ns = 0;
        ctx->nblocked--;
        ep->replaying = 1;
        EXS_DBG(PROV, "ep %p: link thawed", (void *)ep);
        while (!exs_list_empty(&ep->posts)) {
            struct fault_post *p =
                exs_list_entry(exs_list_pop_head(&ep->posts), struct fault_post, link);
            int ret;

            pthread_mutex_unlock(&ctx->lock);
            ret = exs__fault_post_replay(ep, p);
            pthread_mutex_lock(&ctx->lock);
            if (ret) {
                /* as a queue pair in error: the send is flushed */
                struct fault_held h = {.release_ns = 0};

                EXS_ERR(PROV, "ep %p: replaying a send frozen on the link: %s; flushed", (void *)ep,
                        strerror(-ret));
                h.cqe.wr_id = p->wr.wr_id;
                h.cqe.ep = &ep->base;
                h.cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
                h.cqe.opcode = exs__prov_wr_wc_opcode(p->wr.opcode);
                if (exs__fault_hold_locked(ctx, &h) == 0)
                    exs__fault_timer_locked(ctx, 0);
                failed = 1;
            }
            exs__fault_post_free(p);
        }
        if (failed) {
            int ret;

            pthread_mutex_unlock(&ctx->lock);
            ret = ctx->inner->ops->disconnect(ep->inner);
            if (ret)
                EXS_ERR(PROV, "ep %p: disconnect after a failed replay: %s", (void *)ep,
                        strerror(-ret));
            pthread_mutex_lock(&ctx->lock);
        }
        ep->replaying = 0; /* from here on ep_destroy may free it */
        pthread_mutex_unlock(&ctx->lock);
        did = 1;
    }
    return did;
}

/* The thaw thread (default progress mode only): while a freeze is in force, look every
 * 10 ms whether it is over and replay its sends; asleep otherwise. */
static void *fault_thaw_main(void *arg)
{
    struct fault_ctx *ctx = arg;

    pthread_mutex_lock(&ctx->lock);
    while (!ctx->thaw_stop) {
        if (!ctx->nblocked) {
            pthread_cond_wait(&ctx->thaw_cond, &ctx->lock); /* nocancel: ok (its own thread) */
            continue;
        }
        uint64_t at = exs__fault_now_ns() + 10 * 1000000ull;
        struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                              .tv_nsec = (long)(at % 1000000000ull)};

        pthread_cond_timedwait(&ctx->thaw_cond, &ctx->lock, &ts); /* nocancel: ok */
        if (ctx->thaw_stop)
            break;
        pthread_mutex_unlock(&ctx->lock);
        exs__fault_thaw(ctx);
        pthread_mutex_lock(&ctx->lock);
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

void exs__fault_frozen_locked(struct fault_ctx *ctx)
{
    int ret;

    if (ctx->manual)
        return; /* ctx_progress replays */
    if (ctx->thaw_started) {
        pthread_cond_signal(&ctx->thaw_cond);
        return;
    }
    ret = pthread_create(&ctx->thaw_thread, NULL, fault_thaw_main, ctx);
    if (ret) {
        /* the consumer's own calls (poll, progress, arm) still replay */
        EXS_ERR(PROV, "ctx %p: thaw thread: %s", (void *)ctx, strerror(ret));
        return;
    }
    ctx->thaw_started = 1;
}

/* ---- held completions ---- */

int exs__fault_hold_locked(struct fault_ctx *ctx, const struct fault_held *h)
{
    struct fault_ep *ep = fault_ep_of(h->cqe.ep);

    if (ctx->held_count == ctx->held_cap) {
        uint32_t cap = ctx->held_cap ? ctx->held_cap * 2 : 256;
        struct fault_held *n = realloc(ctx->held, (size_t)cap * sizeof(*n));

        if (!n) {
            EXS_ERR(PROV, "ctx %p: no memory to hold %u completions", (void *)ctx, cap);
            return -ENOMEM;
        }
        ctx->held = n;
        ctx->held_cap = cap;
    }
    ctx->held[ctx->held_count++] = *h;
    ep->held++;
    return 0;
}

/* Take what the inner provider has, deciding each completion's faults. *fail_p gets
 * the eps whose error completion was just injected (up to FAULT_BATCH). */
static int fault_drain_locked(struct fault_ctx *ctx, struct fault_ep **fail, int *nfail_p)
{
    struct exs_prov_cqe tmp[FAULT_BATCH];
    uint64_t now = exs__fault_now_ns();
    int n;

    do {
        n = ctx->inner->ops->ctx_poll(ctx->inner, tmp, FAULT_BATCH);
        if (n < 0) {
            EXS_ERR(PROV, "ctx %p: inner ctx_poll: %s", (void *)ctx, strerror(-n));
            return n;
        }
        for (int i = 0; i < n; i++) {
            struct fault_ep *ep = tmp[i].ep->user;
            struct fault_held h = {.cqe = tmp[i], .release_ns = now};

            h.cqe.ep = &ep->base;
            if (ep->failed) {
                if (h.cqe.status == EXS_PROV_WC_SUCCESS)
                    h.cqe.status = EXS_PROV_WC_WR_FLUSH_ERR;
            } else if (h.cqe.status == EXS_PROV_WC_SUCCESS &&
                       exs__fault_pick_locked(ctx, FAULT_WC, ep)) {
                uint64_t st = fault_load(&exs__params.fault_wc_status);

                if (!st || st >= EXS_PROV_WC_STATUS_MAX)
                    st = 1 + ctx->wc_turn++ % (EXS_PROV_WC_STATUS_MAX - 1);
                h.cqe.status = (enum exs_prov_wc_status)st;
                ep->failed = 1;
                ctx->nfailed++;
                if (*nfail_p < FAULT_BATCH)
                    fail[(*nfail_p)++] = ep;
                EXS_INFO(PROV, "ep %p: injected error completion: %s (%s, wr_id 0x%" PRIx64 ")",
                         (void *)ep, exs__prov_wc_status_str(h.cqe.status),
                         exs__prov_wc_opcode_str(h.cqe.opcode), h.cqe.wr_id);
            }
            if (exs__fault_pick_locked(ctx, FAULT_DELAY, ep)) {
                h.release_ns = now + fault_load(&exs__params.fault_delay_us) * 1000ull;
                exs__fault_timer_locked(ctx, h.release_ns);
            }
            if (!ep->stall_ns && exs__fault_pick_locked(ctx, FAULT_STALL, ep)) {
                ep->stall_ns = now;
                ctx->nblocked++;
                EXS_INFO(PROV, "ep %p: completions stalled for %" PRIu64 " ms", (void *)ep,
                         fault_load(&exs__params.fault_stall_ms));
                exs__fault_timer_locked(ctx, now + FAULT_RECHECK_NS);
            }
            if (exs__fault_hold_locked(ctx, &h)) {
                /* cannot keep it: deliver it late rather than lose it is impossible
                 * here, so the ctx fails loudly */
                return -ENOMEM;
            }
        }
    } while (n == FAULT_BATCH && ctx->held_count < (1u << 22));
    return 0;
}

/* An error completion moves its queue pair to ERROR: the peer sees the end too. */
static void fault_fail_eps(struct fault_ctx *ctx, struct fault_ep **fail, int nfail)
{
    for (int i = 0; i < nfail; i++) {
        int r = ctx->inner->ops->disconnect(fail[i]->inner);

        if (r)
            EXS_ERR(PROV, "ep %p: disconnect after an injected error: %s", (void *)fail[i],
                    strerror(-r));
    }
}

static int fault_in_set(struct fault_ep *const *set, int n, const struct fault_ep *ep)
{
    for (int i = 0; i < n; i++)
        if (set[i] == ep)
            return 1;
    return 0;
}

/* Move deliverable completions to cqe (oldest first; a completion that must wait
 * holds back the later ones of its ep only). With cqe NULL, only tells whether one
 * is deliverable. */
static int fault_deliver_locked(struct fault_ctx *ctx, struct exs_prov_cqe *cqe, int max,
                                uint64_t now)
{
    struct fault_ep *waiting[FAULT_SCAN_EPS];
    int nwait = 0, out = 0, full = 0;
    uint32_t w = 0;

    for (uint32_t r = 0; r < ctx->held_count; r++) {
        struct fault_held *h = &ctx->held[r];
        struct fault_ep *ep = fault_ep_of(h->cqe.ep);
        int ok = !full && out < max && h->release_ns <= now && !ep->stall_ns &&
                 !fault_frozen(ep, now) && !fault_in_set(waiting, nwait, ep);

        if (ok && !cqe)
            return 1;
        if (ok) {
            cqe[out++] = h->cqe;
            ep->held--;
            continue;
        }
        if (!full && !fault_in_set(waiting, nwait, ep)) {
            if (nwait < FAULT_SCAN_EPS)
                waiting[nwait++] = ep;
            else
                full = 1;
        }
        if (cqe)
            ctx->held[w++] = *h;
    }
    if (cqe)
        ctx->held_count = w;
    return out;
}

/* The earliest release time of a held completion, 0 = none. */
static uint64_t fault_next_release_locked(struct fault_ctx *ctx)
{
    uint64_t next = 0;

    for (uint32_t r = 0; r < ctx->held_count; r++)
        if (!next || ctx->held[r].release_ns < next)
            next = ctx->held[r].release_ns;
    return next;
}

static int fault_cq_plain_locked(struct fault_ctx *ctx)
{
    return !ctx->held_count && !ctx->nblocked && !ctx->nfailed && !fault_kind_on(FAULT_WC) &&
           !fault_kind_on(FAULT_DELAY) && !fault_kind_on(FAULT_STALL);
}

int exs__fault_ctx_poll(struct exs_prov_ctx *c, struct exs_prov_cqe *cqe, int max)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct fault_ep *fail[FAULT_BATCH];
    uint64_t now, next = 0;
    int nfail = 0, n, ret;

    exs__fault_thaw(ctx);
    pthread_mutex_lock(&ctx->lock);
    if (fault_cq_plain_locked(ctx)) {
        n = ctx->inner->ops->ctx_poll(ctx->inner, cqe, max);
        for (int i = 0; i < n; i++)
            cqe[i].ep = cqe[i].ep->user;
        pthread_mutex_unlock(&ctx->lock);
        return n;
    }
    ret = fault_drain_locked(ctx, fail, &nfail);
    now = exs__fault_now_ns();
    fault_expire_locked(ctx, now, &next);
    n = fault_deliver_locked(ctx, cqe, max, now);
    if (n == max && fault_deliver_locked(ctx, NULL, 1, now))
        exs__fault_timer_locked(ctx, 0); /* more is ready: keep the event fd readable */
    pthread_mutex_unlock(&ctx->lock);
    fault_fail_eps(ctx, fail, nfail);
    if (ret && !n)
        return ret;
    return n;
}

/* ---- connection events ---- */

void exs__fault_cm_push_locked(struct fault_ctx *ctx, struct fault_cm *cm)
{
    exs_list_add_tail(&ctx->cmq, &cm->link);
    exs__fault_timer_locked(ctx, 0);
}

/* Translate one inner event into the wrapper's objects. Returns 0, or -ENOMEM when a
 * connection request could not be wrapped (it is then rejected). */
static int fault_cm_translate_locked(struct fault_ctx *ctx, struct fault_cm *cm)
{
    struct exs_prov_cm_event *ev = &cm->ev;

    if (ev->ep)
        ev->ep = ev->ep->user;
    if (ev->listener) {
        struct fault_lis *lis = ev->listener->user;

        ev->listener = &lis->base;
        if (ev->req) {
            struct fault_req *req = calloc(1, sizeof(*req));

            if (!req) {
                int ret = ctx->inner->ops->reject(ev->req, NULL, 0);

                EXS_ERR(PROV, "listener %p: no memory for a connection request; rejected (%d)",
                        (void *)lis, ret);
                return -ENOMEM;
            }
            req->base.listener = &lis->base;
            req->inner = ev->req;
            exs_list_add_tail(&lis->reqs, &req->link);
            ev->req = &req->base;
        }
    }
    return 0;
}

static int fault_cm_ready(const struct exs_prov_cm_event *ev, uint64_t now)
{
    const struct fault_ep *ep;

    if (!ev->ep)
        return 1;
    ep = fault_ep_of(ev->ep);
    /* never ahead of the completions before it, nor across a frozen link */
    return !ep->held && !fault_frozen(ep, now);
}

int exs__fault_ctx_cm_poll(struct exs_prov_ctx *c, struct exs_prov_cm_event *ev)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_list *pos;
    uint64_t now;
    int ret = 0;

    pthread_mutex_lock(&ctx->lock);
    /* completions first: an ep's event waits for the completions held before it */
    if (!fault_cq_plain_locked(ctx)) {
        struct fault_ep *fail[FAULT_BATCH];
        int nfail = 0;

        fault_drain_locked(ctx, fail, &nfail);
        if (nfail) {
            /* delivered by the next ctx_poll; their eps fail now (as in ctx_poll) */
            pthread_mutex_unlock(&ctx->lock);
            fault_fail_eps(ctx, fail, nfail);
            pthread_mutex_lock(&ctx->lock);
        }
        if (ctx->held_count)
            exs__fault_timer_locked(ctx, 0);
    }
    for (;;) {
        struct fault_cm *cm = malloc(sizeof(*cm));

        if (!cm) {
            /* the events stay in the inner queue until the next call */
            EXS_ERR(PROV, "ctx %p: no memory for a connection event", (void *)ctx);
            break;
        }
        if (ctx->inner->ops->ctx_cm_poll(ctx->inner, &cm->ev) != 1) {
            free(cm);
            break;
        }
        if (fault_cm_translate_locked(ctx, cm))
            free(cm);
        else
            exs_list_add_tail(&ctx->cmq, &cm->link);
    }
    now = exs__fault_now_ns();
    exs_list_for_each(pos, &ctx->cmq)
    {
        struct fault_cm *cm = exs_list_entry(pos, struct fault_cm, link);

        if (!fault_cm_ready(&cm->ev, now))
            continue;
        *ev = cm->ev;
        exs_list_del(&cm->link);
        free(cm);
        ret = 1;
        break;
    }
    pthread_mutex_unlock(&ctx->lock);
    return ret;
}

void exs__fault_purge_ep_locked(struct fault_ctx *ctx, struct fault_ep *ep)
{
    struct exs_list *pos, *tmp;
    uint32_t w = 0;

    for (uint32_t r = 0; r < ctx->held_count; r++)
        if (ctx->held[r].cqe.ep != &ep->base)
            ctx->held[w++] = ctx->held[r];
    ctx->held_count = w;
    ep->held = 0;
    exs_list_for_each_safe(pos, tmp, &ctx->cmq)
    {
        struct fault_cm *cm = exs_list_entry(pos, struct fault_cm, link);

        if (cm->ev.ep == &ep->base) {
            exs_list_del(&cm->link);
            free(cm);
        }
    }
    while (!exs_list_empty(&ep->posts))
        exs__fault_post_free(
            exs_list_entry(exs_list_pop_head(&ep->posts), struct fault_post, link));
    if (ep->stall_ns)
        ctx->nblocked--;
    if (ep->freeze_ns)
        ctx->nblocked--;
    if (ep->failed)
        ctx->nfailed--;
    ep->stall_ns = ep->freeze_ns = 0;
    ep->failed = 0;
}

void exs__fault_purge_lis_locked(struct fault_ctx *ctx, struct fault_lis *lis)
{
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, &ctx->cmq)
    {
        struct fault_cm *cm = exs_list_entry(pos, struct fault_cm, link);

        if (cm->ev.listener == &lis->base) {
            exs_list_del(&cm->link);
            free(cm);
        }
    }
}

/* ---- arm, progress, event fd ---- */

int exs__fault_ctx_arm(struct exs_prov_ctx *c)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    struct exs_list *pos;
    uint64_t now = exs__fault_now_ns(), next = 0, v;
    int pending, ret;

    pthread_mutex_lock(&ctx->lock);
    pending = fault_expire_locked(ctx, now, &next) || fault_deliver_locked(ctx, NULL, 1, now);
    exs_list_for_each(pos, &ctx->cmq)
    {
        if (pending)
            break;
        pending = fault_cm_ready(&exs_list_entry(pos, struct fault_cm, link)->ev, now);
    }
    pthread_mutex_unlock(&ctx->lock);
    if (pending)
        return -EAGAIN;
    ret = ctx->inner->ops->ctx_arm(ctx->inner);
    if (ret)
        return ret;
    pthread_mutex_lock(&ctx->lock);
    if (exs__nc_read(ctx->timerfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_ERR(PROV, "ctx %p: timerfd read: %m", (void *)ctx);
    ctx->timer_ns = 0;
    now = exs__fault_now_ns();
    next = 0;
    fault_expire_locked(ctx, now, &next);
    if (ctx->held_count) {
        uint64_t r = fault_next_release_locked(ctx);

        if (!next || r < next)
            next = r;
    }
    if (ctx->nblocked && (!next || next > now + FAULT_RECHECK_NS))
        next = now + FAULT_RECHECK_NS;
    fault_timer_set_locked(ctx, next);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

int exs__fault_ctx_progress(struct exs_prov_ctx *c)
{
    struct fault_ctx *ctx = fault_ctx_of(c);
    int ret = ctx->inner->ops->ctx_progress(ctx->inner);
    int thawed = exs__fault_thaw(ctx);

    if (ret < 0)
        return ret;
    return ret > 0 || thawed;
}

int exs__fault_ctx_event_fd(struct exs_prov_ctx *c)
{
    return fault_ctx_of(c)->epfd;
}

/* fork (prov.h, ctx_fork): the inner context's descriptors, then our own. */
void exs__fault_ctx_fork(struct exs_prov_ctx *c, int phase)
{
    struct fault_ctx *ctx = fault_ctx_of(c);

    ctx->inner->ops->ctx_fork(ctx->inner, phase);
    if (phase != EXS_FORK_CHILD)
        return;
    exs__counters_unregister(&ctx->cset);
    exs__nc_close(ctx->timerfd);
    exs__nc_close(ctx->epfd);
    ctx->timerfd = ctx->epfd = -1;
}

/* ---- open and close ---- */

void exs__fault_ctx_close(struct exs_prov_ctx *c)
{
    struct fault_ctx *ctx = fault_ctx_of(c);

    if (!exs_list_empty(&ctx->eps))
        EXS_ERR(PROV, "ctx %p: closed with endpoints alive", (void *)ctx);
    pthread_mutex_lock(&ctx->lock);
    ctx->thaw_stop = 1;
    pthread_cond_signal(&ctx->thaw_cond);
    pthread_mutex_unlock(&ctx->lock);
    if (ctx->thaw_started)
        pthread_join(ctx->thaw_thread, NULL); /* nocancel: ok (exs_fini: off) */
    pthread_cond_destroy(&ctx->thaw_cond);
    exs__counters_unregister(&ctx->cset);
    ctx->inner->ops->ctx_close(ctx->inner);
    while (!exs_list_empty(&ctx->cmq))
        free(exs_list_entry(exs_list_pop_head(&ctx->cmq), struct fault_cm, link));
    free(ctx->held);
    exs__nc_close(ctx->timerfd);
    exs__nc_close(ctx->epfd);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

int exs__fault_ctx_open(const struct exs_prov_ops *ops, const char *inner_name,
                        const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    const struct exs_prov_ops *iops = exs__prov_find(inner_name);
    struct epoll_event ev = {.events = EPOLLIN};
    struct fault_ctx *ctx;
    int ret, ifd;

    if (!iops) {
        EXS_ERR(PROV, "fault: inner provider %s is not built in", inner_name);
        return -ENOENT;
    }
    exs__params_load();
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    ret = iops->ctx_open(attr, &ctx->inner);
    if (ret)
        goto err_free;
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->epfd < 0) {
        ret = -errno;
        EXS_ERR(PROV, "fault: epoll_create1: %m");
        goto err_close_inner;
    }
    ctx->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ctx->timerfd < 0) {
        ret = -errno;
        EXS_ERR(PROV, "fault: timerfd_create: %m");
        goto err_close_epfd;
    }
    ifd = iops->ctx_event_fd(ctx->inner);
    if (ifd < 0) {
        ret = ifd;
        EXS_ERR(PROV, "fault: inner event fd: %s", strerror(-ret));
        goto err_close_timer;
    }
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ifd, &ev) < 0 ||
        epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->timerfd, &ev) < 0) {
        ret = -errno;
        EXS_ERR(PROV, "fault: epoll_ctl: %m");
        goto err_close_timer;
    }
    ctx->base.ops = ops;
    ctx->base.caps = ctx->inner->caps;
    /* posts it holds are replayed one by one: nothing would flush a deferred one */
    ctx->base.caps.flags &= ~(uint32_t)EXS_PROV_CAP_DEFER;
    /* it runs on the inner context's device ("tcp" for fault:tcp) */
    snprintf(ctx->base.device, sizeof(ctx->base.device), "%s", exs__prov_device(ctx->inner));
    pthread_mutex_init(&ctx->lock, NULL);
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&ctx->thaw_cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    ctx->manual = attr && (attr->flags & EXS_PROV_ATTR_MANUAL_PROGRESS);
    exs_list_init(&ctx->cmq);
    exs_list_init(&ctx->eps);
    fault_reseed_locked(ctx, fault_load(&exs__params.fault_seed));
    ctx->cset.name = "prov.fault";
    ctx->cset.desc = fault_counter_desc;
    ctx->cset.count = EXS_ARRAY_SIZE(fault_counter_desc);
    ctx->cset.base = &ctx->cnt;
    exs__counters_register(&ctx->cset);
    EXS_INFO(PROV, "ctx %p: fault injection over %s, seed %" PRIu64, (void *)ctx, inner_name,
             ctx->seed);
    *ctx_p = &ctx->base;
    return 0;

err_close_timer:
    exs__nc_close(ctx->timerfd);
err_close_epfd:
    exs__nc_close(ctx->epfd);
err_close_inner:
    iops->ctx_close(ctx->inner);
err_free:
    free(ctx);
    return ret;
}
