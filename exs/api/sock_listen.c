/* SPDX-License-Identifier: MIT */
/* ES-API sockets: the listener (exs_listen, its queue of requests, exs_accept). */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/api/sock_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* A checked hello asking to be the new path of a cut-over connection (spec/protocol.md
 * §9.2): never a connection for exs_accept. Over the fallback context, the connection
 * its token names takes it (the request is then consumed: 1); anything else is refused
 * with reason 7, *reason_p. 0 for an ordinary hello. Called without the listener's lock
 * (conn locks come first). */
static int sock_resume_request(struct api_sock *lis, const struct exs_prov_cm_event *ev,
                               int *reason_p)
{
    struct exs_wire_hello h;

    memcpy(&h, ev->private_data, sizeof(h));
    if (!(h.hflags & EXS_WIRE_HELLO_F_RESUME))
        return 0;
    *reason_p = EXS_WIRE_REJ_RESUME;
    if (!exs__engine_fallback_ctx() || ev->listener->ctx != exs__engine_fallback_ctx()) {
        EXS_INFO(API, "listener fd %d: resume request refused: not over the fallback", lis->fd);
        return 1;
    }
    *reason_p = exs__conn_resume_request(ev->listener->ctx, ev->req, ev->private_data,
                                         ev->private_data_len, lis->type);
    return 1;
}

/* ---- the listener's queues (spec/api.md, exs_listen) ----
 *
 * A connection request either starts its handshake at once (a child socket with its conn:
 * an embryo) or waits in the listener's FIFO of deferred requests, holding the provider's
 * request (valid until accepted or rejected, spec/provider.md) and a copy of its event,
 * nothing more. There is room for a handshake when the embryos are fewer than the embryo
 * bound (listen_embryo_max, at least the backlog) and the embryos plus the established
 * children not yet accepted are fewer than the backlog plus the accepts posted (a posted
 * accept takes an established child at once): so the backlog bounds the established
 * connections nobody has taken, as on Linux. Requests start in arrival order whenever room
 * frees (an embryo ends, an accept is posted, the backlog grows: defer_job). One still
 * waiting half of connect_timeout_ms after it came is refused with reason 3: the refusal,
 * or a handshake started just before, reaches a peer with the same deadline before it
 * gives up. At listen_defer_max waiting, the provider listeners are paused (tcp: the
 * kernel's listen queue holds the clients, its SYN retries beyond it); requests they had
 * already taken still wait, up to twice the bound, and the listeners go on at half of it;
 * a provider that cannot pause (verbs) has requests beyond the bound refused at once. The
 * lists and counts are under the listener's lock; the rest runs with the progress lock
 * (requests, the job, the timer, the listener's close job), and nothing waits for a
 * peer. */

struct sock_deferred {
    struct exs_list link;        /* lis->deferred, oldest first */
    uint64_t deadline_ns;        /* refused (reason 3) if still waiting then */
    struct exs_prov_cm_event ev; /* the request, its peer and its hello */
};

static void sock_defer_job(struct exs_job *job);

/* Handshakes lis runs at once: listen_embryo_max, at least the backlog (lock held). */
static int sock_embryo_max_locked(const struct api_sock *lis)
{
    uint64_t m = __atomic_load_n(&exs__params.listen_embryo_max, __ATOMIC_RELAXED);

    return (uint64_t)lis->backlog > m ? lis->backlog : (int)m;
}

/* Room for one more handshake (lock held). */
static int sock_room_locked(const struct api_sock *lis)
{
    return lis->n_embryo < sock_embryo_max_locked(lis) &&
           lis->n_embryo + lis->n_ready < lis->backlog + lis->n_accepts;
}

/* Room may have freed (an embryo ended, an accept was posted, the backlog grew): queue
 * the job that starts deferred requests, once (lock held). */
void exs__api_sock_defer_kick_locked(struct api_sock *lis)
{
    if (lis->defer_job_busy || !lis->n_deferred || lis->state != API_SOCK_LISTENING ||
        !sock_room_locked(lis))
        return;
    lis->defer_job_busy = 1;
    exs__api_sock_ref(lis); /* the job's */
    lis->defer_job.fn = sock_defer_job;
    exs__engine_post(&lis->defer_job);
}

/* Refuse request ev with reason (consumes ev->req). */
static void sock_refuse(struct api_sock *lis, const struct exs_prov_cm_event *ev, int reason)
{
    struct exs_wire_reject rej = {.magic = htobe16(EXS_WIRE_MAGIC), .version = EXS_WIRE_VERSION};

    EXS_INFO(API, "listener fd %d: connection request refused, reason %d", lis->fd, reason);
    rej.reason = (uint8_t)reason;
    exs__prov_reject(ev->req, &rej, sizeof(rej));
}

/* Progress thread: start the handshake of request ev, whose place the caller reserved
 * under lis's lock (n_embryo counted, a reference for the child's parent pointer).
 * Consumes ev->req: accepted onto a new child, or rejected (also after a failed accept:
 * the request is still ours, spec/provider.md). */
static void sock_start_child(struct api_sock *lis, const struct exs_prov_cm_event *ev)
{
    struct api_sock *c = exs__api_sock_new(lis->domain, lis->type);
    int reason = 0, ret;

    if (c) {
        api_sock_lock(lis);
        c->rcvbuf = lis->rcvbuf;
        c->rcvbuf_set = lis->rcvbuf_set;
        c->sndbuf = lis->sndbuf;
        c->xfer_mode = lis->xfer_mode;
        c->keepalive = lis->keepalive;
        c->keepalive_ms = lis->keepalive_ms;
        c->local = lis->local;
        c->local_len = lis->local_len;
        api_sock_unlock(lis);
        exs__api_sock_set_state(c, API_SOCK_CONNECTING, "connection request");
        memcpy(&c->peer, &ev->peer_addr, sizeof(c->peer));
        c->peer_len = ev->peer_addrlen;
        c->parent = lis;
        if (exs__api_sock_conn_new(c, ev->listener->ctx)) /* the context the request came on */
            reason = EXS_WIRE_REJ_RESOURCES;
    } else {
        exs__api_sock_put(lis);
        reason = EXS_WIRE_REJ_RESOURCES;
    }
    if (!reason) {
        ret = exs__conn_accept(c->conn, ev->req, ev->private_data);
        if (!ret) {
            exs__api_sock_conn_timer_kick(c); /* the handshake deadline */
            return;                           /* sock_conn_established follows */
        }
        EXS_INFO(API, "listener fd %d: accept failed: %s", lis->fd, strerror(-ret));
        reason = EXS_WIRE_REJ_RESOURCES; /* nothing is sent to a peer that is gone */
    }
    sock_refuse(lis, ev, reason);
    api_sock_lock(lis);
    lis->n_embryo--;
    exs__api_sock_defer_kick_locked(lis);
    api_sock_unlock(lis);
    if (c) {
        if (c->conn) {
            struct exs_conn *conn = c->conn;

            c->conn = NULL;
            exs__conn_destroy(conn);
        }
        exs__api_sock_put(c); /* also drops the parent reference */
    }
}

/* Request ev waits for room (lock held): 0, or the reason it is refused instead.
 * *pause_p: it is the one that filled the FIFO, pause the provider listeners. */
static int sock_defer_locked(struct api_sock *lis, const struct exs_prov_cm_event *ev, int *pause_p)
{
    uint64_t max = __atomic_load_n(&exs__params.listen_defer_max, __ATOMIC_RELAXED);
    uint64_t wait_ms = __atomic_load_n(&exs__params.connect_timeout_ms, __ATOMIC_RELAXED) / 2;
    struct sock_deferred *d;

    /* a request of a provider listener exs_listen gave up (exs__engine_listen) must not
     * outlive it */
    if (ev->listener != lis->lis.pl && ev->listener != lis->lis.pl_fb)
        return EXS_WIRE_REJ_BACKLOG;
    if ((uint64_t)lis->n_deferred >= (lis->defer_paused ? 2 * max : max)) {
        EXS_CNT_INC(exs__eng_cnt.listen_defer_full);
        return EXS_WIRE_REJ_BACKLOG;
    }
    d = malloc(sizeof(*d));
    if (!d)
        return EXS_WIRE_REJ_RESOURCES;
    d->ev = *ev;
    d->deadline_ns = exs__now_ns() + EXS_MAX(wait_ms, 1) * 1000000u;
    exs_list_add_tail(&lis->deferred, &d->link);
    lis->n_deferred++;
    EXS_CNT_INC(exs__eng_cnt.listen_deferred);
    *pause_p = !lis->defer_paused && (uint64_t)lis->n_deferred >= max;
    return 0;
}

static void sock_defer_timeout(struct exs_eng_timer *t);

/* Progress thread, after the FIFO changed: let the provider listeners go on once half of
 * listen_defer_max is left, and arm the oldest request's deadline. */
static void sock_defer_after(struct api_sock *lis)
{
    uint64_t max = __atomic_load_n(&exs__params.listen_defer_max, __ATOMIC_RELAXED);
    uint64_t ms = 0, now;
    int resume = 0, arm = 0;

    api_sock_lock(lis);
    if (lis->state == API_SOCK_LISTENING) {
        resume = lis->defer_paused && (uint64_t)lis->n_deferred <= max / 2;
        if (resume)
            lis->defer_paused = 0;
        if (!lis->defer_timer_on && lis->n_deferred) {
            struct sock_deferred *d =
                exs_list_entry(lis->deferred.next, struct sock_deferred, link);

            now = exs__now_ns();
            ms = d->deadline_ns > now ? (d->deadline_ns - now + 999999u) / 1000000u : 0;
            lis->defer_timer_on = arm = 1;
        }
    }
    api_sock_unlock(lis);
    if (resume)
        exs__engine_listener_pause(&lis->lis, 0);
    if (arm)
        exs__engine_timer_start(&lis->defer_timer, ms, sock_defer_timeout);
}

/* Take the deferred requests off lis (all, or those whose deadline passed) into out
 * (lock held). */
void exs__api_sock_defer_take_locked(struct api_sock *lis, struct exs_list *out, int all)
{
    uint64_t now = exs__now_ns();

    exs_list_init(out);
    while (lis->n_deferred) {
        struct sock_deferred *d = exs_list_entry(lis->deferred.next, struct sock_deferred, link);

        if (!all && d->deadline_ns > now)
            break;
        exs_list_del(&d->link);
        exs_list_add_tail(out, &d->link);
        lis->n_deferred--;
    }
}

/* Refuse every request of list with reason and free them. */
void exs__api_sock_defer_refuse(struct api_sock *lis, struct exs_list *list, int reason)
{
    struct exs_list *n;

    while ((n = exs_list_pop_head(list))) {
        struct sock_deferred *d = exs_list_entry(n, struct sock_deferred, link);

        if (reason == EXS_WIRE_REJ_BACKLOG)
            EXS_CNT_INC(exs__eng_cnt.listen_defer_timeouts);
        sock_refuse(lis, &d->ev, reason);
        free(d);
    }
}

/* Progress thread: the oldest deferred request's deadline: refuse those that waited too
 * long. The listener's close job stops the timer. */
static void sock_defer_timeout(struct exs_eng_timer *t)
{
    struct api_sock *lis = exs_container_of(t, struct api_sock, defer_timer);
    struct exs_list late;

    api_sock_lock(lis);
    lis->defer_timer_on = 0;
    exs__api_sock_defer_take_locked(lis, &late, 0);
    api_sock_unlock(lis);
    exs__api_sock_defer_refuse(lis, &late, EXS_WIRE_REJ_BACKLOG);
    sock_defer_after(lis);
}

/* Progress thread: start deferred requests, oldest first, while there is room. */
static void sock_defer_job(struct exs_job *job)
{
    struct api_sock *lis = exs_container_of(job, struct api_sock, defer_job);

    for (;;) {
        struct sock_deferred *d = NULL;

        api_sock_lock(lis);
        if (lis->state == API_SOCK_LISTENING && lis->n_deferred && sock_room_locked(lis)) {
            d = exs_list_entry(exs_list_pop_head(&lis->deferred), struct sock_deferred, link);
            lis->n_deferred--;
            lis->n_embryo++;
            exs__api_sock_ref(lis); /* the child's parent pointer */
        } else {
            lis->defer_job_busy = 0;
        }
        api_sock_unlock(lis);
        if (!d)
            break;
        sock_start_child(lis, &d->ev);
        free(d);
    }
    sock_defer_after(lis);
    exs__api_sock_put(lis); /* the job's reference */
}

/* Progress thread: a connection request for listener lis. Exactly one of accept and
 * reject is called on ev->req, now or, when it waits for room, later (the provider keeps
 * it valid until then); ev->req is not touched after that call (it consumes the request
 * whatever it returns: the provider may free it at once). */
static void sock_on_request(struct exs_eng_listener *el, const struct exs_prov_cm_event *ev)
{
    struct api_sock *lis = exs_container_of(el, struct api_sock, lis);
    struct exs_wire_reject rej = {.magic = htobe16(EXS_WIRE_MAGIC), .version = EXS_WIRE_VERSION};
    int reason, start = 0, deferred = 0, pause = 0;

    /* Decide under the listener's lock: a place for the handshake now, or a place in the
     * FIFO; build the child without it (conn locks come before socket locks). */
    reason = exs__conn_hello_check(ev->private_data, ev->private_data_len, lis->type);
    if (!reason && sock_resume_request(lis, ev, &reason)) {
        if (!reason)
            return; /* taken by the connection it resumes */
        rej.reason = (uint8_t)reason;
        exs__prov_reject(ev->req, &rej, sizeof(rej));
        return;
    }
    api_sock_lock(lis);
    if (!reason && lis->state != API_SOCK_LISTENING)
        reason = EXS_WIRE_REJ_CLOSING;
    if (!reason && !lis->n_deferred && sock_room_locked(lis)) {
        lis->n_embryo++;
        exs__api_sock_ref(lis); /* the child's parent pointer */
        start = 1;
    } else if (!reason) {
        reason = sock_defer_locked(lis, ev, &pause);
        deferred = !reason;
    }
    api_sock_unlock(lis);
    if (start) {
        sock_start_child(lis, ev);
    } else if (deferred) {
        if (pause && !exs__engine_listener_pause(&lis->lis, 1)) {
            lis->defer_paused = 1; /* progress thread */
            EXS_CNT_INC(exs__eng_cnt.listen_pauses);
            EXS_INFO(API, "listener fd %d: %d requests waiting: provider listener paused", lis->fd,
                     lis->n_deferred);
        }
        sock_defer_after(lis);
    } else {
        sock_refuse(lis, ev, reason);
    }
}

int exs_listen(int fd, int backlog)
{
    int err = 0, ret;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    socklen_t len;

    if (!s)
        return exs__err(err);
    api_sock_lock(s);
    if (backlog <= 0 || backlog > 4096)
        backlog = backlog <= 0 ? 128 : 4096;
    if (s->state == API_SOCK_LISTENING) {
        s->backlog = backlog;
        exs__api_sock_defer_kick_locked(s); /* a larger backlog has room */
        goto out;
    }
    if (s->state != API_SOCK_NEW && s->state != API_SOCK_BOUND) {
        err = EINVAL;
        goto out;
    }
    if (s->state == API_SOCK_NEW) {
        memset(&s->local, 0, sizeof(s->local));
        s->local.ss_family = (sa_family_t)s->domain;
        s->local_len =
            s->domain == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    }
    s->lis.on_request = sock_on_request;
    s->backlog = backlog;
    exs__api_sock_set_state(s, API_SOCK_LISTENING, "listen"); /* before requests can arrive */
    __atomic_store_n(&s->listener, 1, __ATOMIC_RELAXED);
    ret = exs__engine_listen(&s->lis, (struct sockaddr *)&s->local, s->local_len, backlog);
    if (ret) {
        exs__api_sock_set_state(s, API_SOCK_BOUND, "listen failed");
        __atomic_store_n(&s->listener, 0, __ATOMIC_RELAXED);
        err = ret == -EADDRINUSE || ret == -EADDRNOTAVAIL || ret == -EACCES ? -ret : EINVAL;
        goto out;
    }
    len = sizeof(s->local);
    exs__prov_listener_addr(s->lis.pl, &s->local, &len);
    s->local_len = len;
out:
    api_sock_unlock(s);
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}

/* Match established children with pending exs_accept operations (lis->lock held). */
void exs__api_sock_deliver_accepts_locked(struct api_sock *lis)
{
    while (!exs_list_empty(&lis->ready) && !exs_list_empty(&lis->accepts)) {
        struct api_sock *c =
            exs_list_entry(exs_list_pop_head(&lis->ready), struct api_sock, child_link);
        struct api_op *op = exs_list_entry(exs_list_pop_head(&lis->accepts), struct api_op, link);
        exs_event_t ev = {.exs_evt_type = EXS_EVT_ACCEPT};

        lis->n_ready--;
        lis->n_accepts--;
        /* the child no longer belongs to the listener */
        exs__api_sock_put(c->parent);
        c->parent = NULL;
        ev.exs_evt_u.exs_evt_accept.exs_evt_newfd = -1;
        if (exs__api_sock_tab_insert(c)) {
            ev.exs_evt_errno = ENOMEM;
            exs__api_sock_close(c, NULL, 0); /* finishes on the progress thread */
        } else {
            ev.exs_evt_u.exs_evt_accept.exs_evt_newfd = c->fd;
            memcpy(&ev.exs_evt_u.exs_evt_accept.exs_evt_addr, &c->peer, sizeof(c->peer));
            ev.exs_evt_u.exs_evt_accept.exs_evt_addrlen = c->peer_len;
            exs__api_sock_put(c); /* the table holds it now */
        }
        exs__api_op_event(op, &ev);
    }
}

int exs_accept(int fd, exs_qhandle_t q, exs_ahandle_t ah)
{
    exs_event_t ev;
    int err = 0, sync = q == EXS_QHANDLE_INVALID;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    struct api_op *op;

    if (!s)
        return exs__err(err);
    if (sync)
        q = exs__api_sync_queue();
    op = exs__api_op_new(s, EXS_EVT_ACCEPT, q, ah, &err);
    if (!op)
        goto out;
    api_sock_lock(s);
    if (s->state != API_SOCK_LISTENING) {
        api_sock_unlock(s);
        exs__api_op_abandon(op);
        err = EINVAL;
        goto out;
    }
    exs_list_add_tail(&s->accepts, &op->link);
    s->n_accepts++;
    exs__api_sock_deliver_accepts_locked(s);
    exs__api_sock_defer_kick_locked(s); /* the accept makes room */
    api_sock_unlock(s);
out:
    exs__api_sock_put(s);
    if (err)
        return exs__api_sync_fail(sync, q, err);
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    return sync ? ev.exs_evt_u.exs_evt_accept.exs_evt_newfd : 0;
}
