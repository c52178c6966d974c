/* SPDX-License-Identifier: MIT */
/* Helpers of the provider conformance tests: hosts, bounded waits, guarded buffers, pairs. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/util.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

const char *pt_name = "tcp";
const struct exs_prov_ops *pt_ops;
int pt_manual;
int pt_self_drive;

int pt_is_tcp(void)
{
    /* fault:tcp wraps tcp: the tcp-only tests (raw wire peers, tcp counters) apply */
    return strcmp(pt_name, "tcp") == 0 || strcmp(pt_name, "fault:tcp") == 0;
}

int pt_skip_unless_tcp(const char *test)
{
    if (pt_is_tcp())
        return 0;
    test_skip(test, "tcp provider only; provider is %s", pt_name);
    return 1;
}

int pt_skip_unless_tcp_itself(const char *test)
{
    if (strcmp(pt_name, "tcp") == 0)
        return 0;
    test_skip(test, "tcp provider itself only; provider is %s", pt_name);
    return 1;
}

TCase *pt_tcase(const char *name)
{
    TCase *tc = tcase_create(name);

    tcase_set_timeout(tc, PT_TEST_TIMEOUT);
    return tc;
}

int pt_time_scale(void)
{
    static int scale;

    if (!scale) {
        const char *m = getenv("CK_TIMEOUT_MULTIPLIER");
        int v = m ? atoi(m) : 1;

        scale = v > 0 ? v : 1;
    }
    return scale;
}

double pt_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void pt_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- drivers (--manual) ---- */

/* A thread per ctx standing in for an application that drives progress: it calls
 * ctx_progress and sleeps on the event fd. It does not arm (the test thread owns the
 * queues): while a notification waits for the test thread, the event fd stays
 * readable, so a turn that found nothing to do is followed by a short pause. */
#define PT_MAX_DRIVERS 16

struct pt_driver {
    struct exs_prov_ctx *ctx; /* every MANUAL_PROGRESS ctx open, with or without thread */
    int has_thread;
    pthread_t thread;
    int stopfd;
};

static struct pt_driver pt_drivers[PT_MAX_DRIVERS];

static void *pt_driver_main(void *arg)
{
    struct pt_driver *d = arg;
    struct pollfd pfd[2];
    int rc;

    pfd[0].fd = pt_ops->ctx_event_fd(d->ctx);
    pfd[0].events = POLLIN;
    pfd[1].fd = d->stopfd;
    pfd[1].events = POLLIN;
    for (;;) {
        int did = pt_ops->ctx_progress(d->ctx);

        if (did < 0) {
            fprintf(stderr, "driver: ctx_progress returned %d\n", did);
            abort();
        }
        pfd[0].revents = pfd[1].revents = 0;
        rc = poll(pfd, 2, 200);
        if (rc < 0 && errno != EINTR) {
            perror("driver: poll");
            abort();
        }
        if (pfd[1].revents)
            return NULL;
        if (rc > 0 && !did) {
            struct timespec ts = {.tv_nsec = 100000};

            nanosleep(&ts, NULL);
        }
    }
}

int pt_ctx_open(const struct exs_prov_attr *attr_in, struct exs_prov_ctx **ctx_p)
{
    struct exs_prov_attr attr = attr_in ? *attr_in : (struct exs_prov_attr){0};
    struct pt_driver *d = NULL;
    int rc;

    if (pt_manual || pt_self_drive)
        attr.flags |= EXS_PROV_ATTR_MANUAL_PROGRESS;
    rc = pt_ops->ctx_open(&attr, ctx_p);
    if (rc || !(attr.flags & EXS_PROV_ATTR_MANUAL_PROGRESS))
        return rc;
    for (int i = 0; i < PT_MAX_DRIVERS && !d; i++)
        if (!pt_drivers[i].ctx)
            d = &pt_drivers[i];
    if (!d) {
        fprintf(stderr, "pt_ctx_open: more than %d drivers\n", PT_MAX_DRIVERS);
        abort();
    }
    d->ctx = *ctx_p;
    if (pt_self_drive)
        return 0;
    d->has_thread = 1;
    d->stopfd = eventfd(0, EFD_CLOEXEC);
    if (d->stopfd < 0 || pthread_create(&d->thread, NULL, pt_driver_main, d) != 0) {
        perror("pt_ctx_open: driver");
        abort();
    }
    return 0;
}

void pt_ctx_close(struct exs_prov_ctx *ctx)
{
    uint64_t one = 1;

    for (int i = 0; i < PT_MAX_DRIVERS; i++) {
        struct pt_driver *d = &pt_drivers[i];

        if (d->ctx != ctx)
            continue;
        if (!d->has_thread) {
            memset(d, 0, sizeof(*d));
            continue;
        }
        if (write(d->stopfd, &one, sizeof(one)) != sizeof(one))
            abort();
        pthread_join(d->thread, NULL);
        close(d->stopfd);
        memset(d, 0, sizeof(*d));
    }
    /* every state change of the tcp provider kept to its tables (spec/provider-tcp.md) */
    if (strcmp(pt_name, "tcp") == 0)
        ck_assert_uint_eq(__atomic_load_n(&tcp_ctx_of(ctx)->cnt.state_errors, __ATOMIC_RELAXED), 0);
    pt_ops->ctx_close(ctx);
}

void pt_progress_poll_b(struct pt_pair *p, struct exs_prov_cqe *out, int n, int max)
{
    double deadline = pt_now_ms() + PT_TIMEOUT_MS;
    int got = 0;

    while (got < n && pt_now_ms() < deadline) {
        int k = -1;

        ck_assert_int_ge(exs__prov_progress_poll(p->b.ctx, out + got, EXS_MIN(max, n - got), &k),
                         0);
        ck_assert_int_ge(k, 0);
        ck_assert_int_le(k, EXS_MIN(max, n - got));
        got += k;
        ck_assert_int_ge(pt_ops->ctx_progress(p->a.ctx), 0);
    }
    ck_assert_int_eq(got, n);
}

int pt_drive_all(void)
{
    int did = 0;

    for (int i = 0; i < PT_MAX_DRIVERS; i++) {
        if (pt_drivers[i].ctx) {
            int rc = pt_ops->ctx_progress(pt_drivers[i].ctx);

            ck_assert_msg(rc >= 0, "ctx_progress returned %d", rc);
            did += rc;
        }
    }
    return did;
}

/* ---- hosts ---- */

void pt_host_open(struct pt_host *h)
{
    pt_host_open_cq(h, 0);
}

void pt_host_open_cq(struct pt_host *h, uint32_t cq_size)
{
    struct exs_prov_attr attr = {.device = NULL, .cq_size = cq_size};
    int rc;

    memset(h, 0, sizeof(*h));
    rc = pt_ctx_open(&attr, &h->ctx);
    ck_assert_msg(rc == 0, "ctx_open(%s) failed: %d (%s)", pt_name, rc, strerror(-rc));
    ck_assert_ptr_nonnull(h->ctx);
    ck_assert_ptr_eq(h->ctx->ops, pt_ops);
    h->cqe = calloc(PT_CQE_STASH, sizeof(*h->cqe));
    ck_assert_ptr_nonnull(h->cqe);
}

void pt_host_close(struct pt_host *h)
{
    if (h->ctx)
        pt_ctx_close(h->ctx);
    free(h->cqe);
    memset(h, 0, sizeof(*h));
}

static void stash_cqe(struct pt_host *h, const struct exs_prov_cqe *c)
{
    ck_assert_msg(h->cqe_count < PT_CQE_STASH, "completion stash overflow");
    h->cqe[(h->cqe_head + h->cqe_count) % PT_CQE_STASH] = *c;
    h->cqe_count++;
}

static void stash_cm(struct pt_host *h, const struct exs_prov_cm_event *ev)
{
    ck_assert_msg(h->cm_count < PT_CM_STASH, "cm event stash overflow");
    h->cm[(h->cm_head + h->cm_count) % PT_CM_STASH] = *ev;
    h->cm_count++;
}

static void drain_cm(struct pt_host *h)
{
    struct exs_prov_cm_event ev;
    int n;

    while (h->cm_count < PT_CM_STASH) {
        memset(&ev, 0, sizeof(ev));
        n = pt_ops->ctx_cm_poll(h->ctx, &ev);
        ck_assert_msg(n == 0 || n == 1, "ctx_cm_poll returned %d", n);
        if (n == 0)
            break;
        stash_cm(h, &ev);
    }
}

static void drain_cq(struct pt_host *h)
{
    struct exs_prov_cqe c[16];
    int n;

    for (;;) {
        n = pt_ops->ctx_poll(h->ctx, c, 16);
        ck_assert_msg(n >= 0 && n <= 16, "ctx_poll returned %d", n);
        for (int i = 0; i < n; i++)
            stash_cqe(h, &c[i]);
        if (n < 16)
            break;
    }
}

/* Sleep on the event fd for at most ms. Returns after arming when something is queued. */
static void wait_event(struct pt_host *h, int ms, int *spins)
{
    struct pollfd pfd;
    int rc;

    if (pt_manual || pt_self_drive) {
        /* the waiting thread drives too, as an application's would (self-drive: it
         * is the only driver of every ctx, so it drives them all) */
        rc = pt_ops->ctx_progress(h->ctx);
        ck_assert_msg(rc >= 0, "ctx_progress returned %d", rc);
        if (pt_self_drive)
            pt_drive_all();
    }
    rc = pt_ops->ctx_arm(h->ctx);

    if (rc == -EAGAIN) {
        /* Entries are queued (maybe of the other kind, already stashed by the caller
         * just before: then the provider raced us). Do not spin hot. */
        if (++*spins > 50)
            pt_sleep_ms(1);
        return;
    }
    ck_assert_msg(rc == 0, "ctx_arm returned %d", rc);
    pfd.fd = pt_ops->ctx_event_fd(h->ctx);
    ck_assert_msg(pfd.fd >= 0, "ctx_event_fd returned %d", pfd.fd);
    pfd.events = POLLIN;
    pfd.revents = 0;
    /* Capped so that a lost notification shows up as slowness here and as a
     * failure in the dedicated event-fd tests, not as a hang. */
    rc = poll(&pfd, 1, ms < (pt_self_drive ? 1 : 200) ? ms : (pt_self_drive ? 1 : 200));
    ck_assert_msg(rc >= 0 || errno == EINTR, "poll: %s", strerror(errno));
}

int pt_try_cqe(struct pt_host *h, int timeout_ms, struct exs_prov_cqe *cqe)
{
    double deadline = pt_now_ms() + timeout_ms;
    int spins = 0;

    for (;;) {
        int n;

        if (h->cqe_count) {
            *cqe = h->cqe[h->cqe_head];
            h->cqe_head = (h->cqe_head + 1) % PT_CQE_STASH;
            h->cqe_count--;
            return 1;
        }
        memset(cqe, 0, sizeof(*cqe));
        n = pt_ops->ctx_poll(h->ctx, cqe, 1);
        ck_assert_msg(n == 0 || n == 1, "ctx_poll returned %d", n);
        if (n == 1)
            return 1;
        drain_cm(h);
        double left = deadline - pt_now_ms();
        if (left <= 0)
            return 0;
        wait_event(h, (int)left + 1, &spins);
    }
}

int pt_try_cm(struct pt_host *h, int timeout_ms, struct exs_prov_cm_event *ev)
{
    double deadline = pt_now_ms() + timeout_ms;
    int spins = 0;

    for (;;) {
        int n;

        if (h->cm_count) {
            *ev = h->cm[h->cm_head];
            h->cm_head = (h->cm_head + 1) % PT_CM_STASH;
            h->cm_count--;
        } else {
            memset(ev, 0, sizeof(*ev));
            n = pt_ops->ctx_cm_poll(h->ctx, ev);
            ck_assert_msg(n == 0 || n == 1, "ctx_cm_poll returned %d", n);
            if (n == 0) {
                drain_cq(h);
                double left = deadline - pt_now_ms();
                if (left <= 0)
                    return 0;
                wait_event(h, (int)left + 1, &spins);
                continue;
            }
        }
        if (ev->type == EXS_PROV_CM_DISCONNECTED && h->ndisc < PT_MAX_DISC)
            h->disc[h->ndisc++] = ev->ep;
        return 1;
    }
}

void pt_wait_cqe_at(struct pt_host *h, int timeout_ms, struct exs_prov_cqe *cqe, const char *file,
                    int line)
{
    if (!pt_try_cqe(h, timeout_ms, cqe))
        ck_abort_msg("%s:%d: no completion within %d ms", file, line, timeout_ms);
}

void pt_wait_cm_at(struct pt_host *h, enum exs_prov_cm_event_type type, int timeout_ms,
                   struct exs_prov_cm_event *ev, const char *file, int line)
{
    struct exs_prov_cm_event tmp;

    if (!ev)
        ev = &tmp;
    if (!pt_try_cm(h, timeout_ms, ev))
        ck_abort_msg("%s:%d: no cm event (expected %s) within %d ms", file, line,
                     exs__prov_cm_event_str(type), timeout_ms);
    ck_assert_msg(ev->type == type, "%s:%d: cm event %s (status %d), expected %s", file, line,
                  exs__prov_cm_event_str(ev->type), ev->status, exs__prov_cm_event_str(type));
}

void pt_expect_cqe_at(struct pt_host *h, int timeout_ms, uint64_t wr_id,
                      enum exs_prov_wc_status status, int opcode, struct exs_prov_cqe *out,
                      const char *file, int line)
{
    struct exs_prov_cqe c;

    if (!pt_try_cqe(h, timeout_ms, &c))
        ck_abort_msg("%s:%d: no completion within %d ms (expected wr_id %llu %s)", file, line,
                     timeout_ms, (unsigned long long)wr_id, exs__prov_wc_status_str(status));
    ck_assert_msg(c.wr_id == wr_id && c.status == status,
                  "%s:%d: completion wr_id %llu status '%s' opcode %s, expected wr_id %llu "
                  "status '%s'",
                  file, line, (unsigned long long)c.wr_id, exs__prov_wc_status_str(c.status),
                  exs__prov_wc_opcode_str(c.opcode), (unsigned long long)wr_id,
                  exs__prov_wc_status_str(status));
    if (opcode >= 0)
        ck_assert_msg((int)c.opcode == opcode, "%s:%d: wr_id %llu opcode %s, expected %s", file,
                      line, (unsigned long long)wr_id, exs__prov_wc_opcode_str(c.opcode),
                      exs__prov_wc_opcode_str((enum exs_prov_wc_opcode)opcode));
    if (out)
        *out = c;
}

void pt_expect_wr_at(struct pt_host *h, int timeout_ms, uint64_t wr_id,
                     enum exs_prov_wc_status status, int opcode, struct exs_prov_cqe *out,
                     const char *file, int line)
{
    double deadline = pt_now_ms() + timeout_ms;
    int spins = 0;

    for (;;) {
        drain_cq(h);
        for (unsigned i = 0; i < h->cqe_count; i++) {
            struct exs_prov_cqe c = h->cqe[(h->cqe_head + i) % PT_CQE_STASH];

            if (c.wr_id != wr_id)
                continue;
            for (unsigned j = i; j + 1 < h->cqe_count; j++)
                h->cqe[(h->cqe_head + j) % PT_CQE_STASH] =
                    h->cqe[(h->cqe_head + j + 1) % PT_CQE_STASH];
            h->cqe_count--;
            ck_assert_msg(c.status == status,
                          "%s:%d: completion wr_id %llu status '%s', expected '%s'", file, line,
                          (unsigned long long)wr_id, exs__prov_wc_status_str(c.status),
                          exs__prov_wc_status_str(status));
            if (opcode >= 0)
                ck_assert_msg((int)c.opcode == opcode, "%s:%d: wr_id %llu opcode %s, expected %s",
                              file, line, (unsigned long long)wr_id,
                              exs__prov_wc_opcode_str(c.opcode),
                              exs__prov_wc_opcode_str((enum exs_prov_wc_opcode)opcode));
            if (out)
                *out = c;
            return;
        }
        drain_cm(h);
        double left = deadline - pt_now_ms();
        if (left <= 0)
            ck_abort_msg("%s:%d: no completion for wr_id %llu within %d ms", file, line,
                         (unsigned long long)wr_id, timeout_ms);
        wait_event(h, (int)left + 1, &spins);
    }
}

void pt_expect_no_cqe_at(struct pt_host *h, int ms, const char *file, int line)
{
    struct exs_prov_cqe c;

    if (pt_try_cqe(h, ms, &c))
        ck_abort_msg("%s:%d: unexpected completion wr_id %llu status '%s' opcode %s", file, line,
                     (unsigned long long)c.wr_id, exs__prov_wc_status_str(c.status),
                     exs__prov_wc_opcode_str(c.opcode));
}

void pt_expect_no_cm_at(struct pt_host *h, int ms, const char *file, int line)
{
    struct exs_prov_cm_event ev;

    if (pt_try_cm(h, ms, &ev))
        ck_abort_msg("%s:%d: unexpected cm event %s (status %d)", file, line,
                     exs__prov_cm_event_str(ev.type), ev.status);
}

/* ---- buffers ---- */

struct pt_buf *pt_buf_new(struct pt_host *h, size_t len, unsigned access, int fill)
{
    struct pt_buf *b = calloc(1, sizeof(*b));
    void *base = NULL;
    int rc;

    ck_assert_ptr_nonnull(b);
    rc = posix_memalign(&base, 4096, len + 2 * PT_GUARD);
    ck_assert_int_eq(rc, 0);
    b->h = h;
    b->base = base;
    b->p = b->base + PT_GUARD;
    b->len = len;
    memset(b->base, PT_GUARD_BYTE, PT_GUARD);
    memset(b->p + len, PT_GUARD_BYTE, PT_GUARD);
    memset(b->p, fill, len);
    if (!(access & PT_NOREG)) {
        rc = pt_ops->mr_reg(h->ctx, b->p, len, access, &b->mr);
        ck_assert_msg(rc == 0, "mr_reg(%zu bytes, access %#x) failed: %d", len, access, rc);
        ck_assert_ptr_eq(b->mr->addr, b->p);
        ck_assert_uint_eq(b->mr->length, len);
        ck_assert_ptr_eq(b->mr->ctx, h->ctx);
        ck_assert_uint_eq(b->mr->access, access);
    }
    return b;
}

void pt_buf_free(struct pt_buf *b)
{
    if (!b)
        return;
    if (b->mr) {
        int rc = pt_ops->mr_dereg(b->mr);

        ck_assert_msg(rc == 0, "mr_dereg failed: %d", rc);
    }
    free(b->base);
    free(b);
}

int pt_all_bytes(const void *p, size_t len, int v)
{
    const uint8_t *q = p;

    for (size_t i = 0; i < len; i++)
        if (q[i] != (uint8_t)v)
            return 0;
    return 1;
}

int pt_buf_guards_ok(const struct pt_buf *b)
{
    return pt_all_bytes(b->base, PT_GUARD, PT_GUARD_BYTE) &&
           pt_all_bytes(b->p + b->len, PT_GUARD, PT_GUARD_BYTE);
}

static uint8_t pattern_byte(uint32_t seed, size_t i)
{
    uint32_t x = seed * 0x9E3779B1u + (uint32_t)i * 0x85EBCA6Bu + (uint32_t)(i >> 32);

    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return (uint8_t)(x >> 16);
}

void pt_pattern(void *dst, size_t len, uint32_t seed)
{
    uint8_t *d = dst;

    for (size_t i = 0; i < len; i++)
        d[i] = pattern_byte(seed, i);
}

long pt_pattern_check(const void *src, size_t len, uint32_t seed)
{
    const uint8_t *s = src;

    for (size_t i = 0; i < len; i++)
        if (s[i] != pattern_byte(seed, i))
            return (long)i;
    return -1;
}

/* ---- work requests ---- */

uint64_t pt_raddr(const struct pt_buf *b, size_t off)
{
    return (uint64_t)(uintptr_t)(b->p + off);
}

int pt_post_recv(struct exs_prov_ep *ep, uint64_t wr_id, const struct pt_buf *b, size_t off,
                 uint32_t len)
{
    struct exs_prov_sge sge;
    struct exs_prov_recv_wr wr = {.wr_id = wr_id, .sg_list = NULL, .num_sge = 0};

    if (b) {
        sge.addr = pt_raddr(b, off);
        sge.length = len;
        sge.lkey = b->mr ? b->mr->lkey : 0;
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    return pt_ops->post_recv(ep, &wr);
}

int pt_post_send(struct exs_prov_ep *ep, uint64_t wr_id, enum exs_prov_wr_opcode opcode,
                 unsigned flags, const struct pt_buf *b, size_t off, uint32_t len, uint32_t imm,
                 uint64_t remote_addr, uint32_t rkey)
{
    struct exs_prov_sge sge;
    struct exs_prov_send_wr wr = {
        .wr_id = wr_id,
        .opcode = opcode,
        .flags = flags,
        .sg_list = NULL,
        .num_sge = 0,
        .imm_data = imm,
        .remote_addr = remote_addr,
        .rkey = rkey,
    };

    if (b) {
        sge.addr = pt_raddr(b, off);
        sge.length = len;
        sge.lkey = b->mr ? b->mr->lkey : 0;
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    return pt_ops->post_send(ep, &wr);
}

/* ---- a peer in another process ---- */

pid_t pt_fork_peer(void (*child)(int rfd), int *wfd)
{
    int pfd[2];
    pid_t pid;

    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pfd[1]);
        child(pfd[0]);
        _exit(3);
    }
    close(pfd[0]);
    *wfd = pfd[1];
    return pid;
}

void pt_tell_addr(int wfd, const struct sockaddr_storage *ss, socklen_t len)
{
    ck_assert_int_eq(write(wfd, &len, sizeof(len)), (ssize_t)sizeof(len));
    ck_assert_int_eq(write(wfd, ss, len), (ssize_t)len);
}

int pt_read_addr(int rfd, struct sockaddr_storage *ss, socklen_t *len)
{
    if (read(rfd, len, sizeof(*len)) != sizeof(*len) || *len > sizeof(*ss) ||
        read(rfd, ss, *len) != (ssize_t)*len)
        return -1;
    return 0;
}

/* ---- listeners and pairs ---- */

struct exs_prov_listener *pt_listen(struct pt_host *h, struct sockaddr_storage *addr,
                                    socklen_t *addrlen)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    struct exs_prov_listener *lis = NULL;
    int rc;

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = pt_ops->listen(h->ctx, (struct sockaddr *)&sin, sizeof(sin), 16, NULL, &lis);
    ck_assert_msg(rc == 0, "listen on 127.0.0.1:0 failed: %d", rc);
    ck_assert_ptr_nonnull(lis);
    *addrlen = sizeof(*addr);
    rc = pt_ops->listener_addr(lis, addr, addrlen);
    ck_assert_msg(rc == 0, "listener_addr failed: %d", rc);
    ck_assert_int_eq(addr->ss_family, AF_INET);
    ck_assert_msg(((struct sockaddr_in *)addr)->sin_port != 0, "listener port 0 not resolved");
    return lis;
}

struct exs_prov_ep_attr pt_default_attr(void)
{
    struct exs_prov_ep_attr a = {
        .max_send_wr = 64,
        .max_recv_wr = 64,
        .max_inline = 64,
        .rnr_retry = 7,
        .rnr_timer_ms = 0,
        .timeout = 0,
        .retry_cnt = 0,
        .user = NULL,
    };
    return a;
}

static struct exs_prov_ep *make_ep(struct pt_host *h, const struct exs_prov_ep_attr *attr)
{
    struct exs_prov_ep_attr def = pt_default_attr();
    struct exs_prov_ep *ep = NULL;
    int rc;

    if (!attr)
        attr = &def;
    rc = pt_ops->ep_create(h->ctx, attr, &ep);
    ck_assert_msg(rc == 0, "ep_create failed: %d", rc);
    ck_assert_ptr_nonnull(ep);
    ck_assert_ptr_eq(ep->ctx, h->ctx);
    ck_assert_int_eq(pt_ops->ep_state(ep), EXS_PROV_EP_IDLE);
    return ep;
}

void pt_pair_open(struct pt_pair *p, const struct exs_prov_ep_attr *attr_a,
                  const struct exs_prov_ep_attr *attr_b)
{
    memset(p, 0, sizeof(*p));
    pt_host_open(&p->a);
    pt_host_open(&p->b);
    p->lis = pt_listen(&p->b, &p->addr, &p->addrlen);
    p->ea = make_ep(&p->a, attr_a);
    p->eb = make_ep(&p->b, attr_b);
}

void pt_pair_connect(struct pt_pair *p)
{
    struct exs_prov_cm_event ev;
    int rc;

    rc = pt_ops->connect(p->ea, (struct sockaddr *)&p->addr, p->addrlen, NULL, 0);
    ck_assert_msg(rc == 0, "connect failed: %d", rc);
    pt_wait_cm(&p->b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.listener, p->lis);
    ck_assert_ptr_nonnull(ev.req);
    rc = pt_ops->accept(ev.req, p->eb, NULL, 0);
    ck_assert_msg(rc == 0, "accept failed: %d", rc);
    pt_wait_cm(&p->a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->ea);
    p->a_up = 1;
    pt_wait_cm(&p->b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    p->b_up = 1;
    ck_assert_int_eq(pt_ops->ep_state(p->ea), EXS_PROV_EP_CONNECTED);
    ck_assert_int_eq(pt_ops->ep_state(p->eb), EXS_PROV_EP_CONNECTED);
}

void pt_pair_setup(struct pt_pair *p, const struct exs_prov_ep_attr *attr_a,
                   const struct exs_prov_ep_attr *attr_b)
{
    pt_pair_open(p, attr_a, attr_b);
    pt_pair_connect(p);
}

struct pt_buf *pt_pair_buf(struct pt_pair *p, char side, size_t len, unsigned access, int fill)
{
    struct pt_buf *b;

    ck_assert_msg(p->nbufs < PT_MAX_BUFS, "too many buffers");
    b = pt_buf_new(side == 'a' ? &p->a : &p->b, len, access, fill);
    p->bufs[p->nbufs++] = b;
    return b;
}

static int seen_disc(const struct pt_host *h, const struct exs_prov_ep *ep)
{
    for (int i = 0; i < h->ndisc; i++)
        if (h->disc[i] == ep)
            return 1;
    return 0;
}

/* Wait (bounded, not fatal) for DISCONNECTED of the eps flagged in want[]. */
static void await_disconnects(struct pt_host **hs, struct exs_prov_ep **eps, int n, int ms)
{
    double deadline = pt_now_ms() + ms;

    for (;;) {
        int missing = 0;

        for (int i = 0; i < n; i++) {
            struct exs_prov_cm_event ev;

            if (!eps[i] || seen_disc(hs[i], eps[i]))
                continue;
            missing = 1;
            pt_try_cm(hs[i], 20, &ev);
        }
        if (!missing || pt_now_ms() > deadline)
            return;
    }
}

void pt_ep_close(struct pt_host *h, struct exs_prov_ep *ep)
{
    struct exs_prov_cqe c;
    enum exs_prov_ep_state st = pt_ops->ep_state(ep);

    if (st != EXS_PROV_EP_IDLE) {
        pt_ops->disconnect(ep);
        await_disconnects(&h, &ep, 1, 1000);
    }
    while (pt_try_cqe(h, 0, &c))
        ;
    pt_ops->ep_destroy(ep);
}

void pt_pair_close(struct pt_pair *p)
{
    struct pt_host *hs[2] = {&p->a, &p->b};
    struct exs_prov_ep *eps[2] = {p->a_up ? p->ea : NULL, p->b_up ? p->eb : NULL};
    struct exs_prov_cqe c;

    if (p->ea && pt_ops->ep_state(p->ea) != EXS_PROV_EP_IDLE)
        pt_ops->disconnect(p->ea);
    if (p->eb && pt_ops->ep_state(p->eb) != EXS_PROV_EP_IDLE)
        pt_ops->disconnect(p->eb);
    await_disconnects(hs, eps, 2, 1000);
    while (pt_try_cqe(&p->a, 0, &c))
        ;
    while (pt_try_cqe(&p->b, 0, &c))
        ;
    if (p->ea)
        pt_ops->ep_destroy(p->ea);
    if (p->eb)
        pt_ops->ep_destroy(p->eb);
    if (p->lis)
        pt_ops->listener_destroy(p->lis);
    for (int i = 0; i < p->nbufs; i++)
        pt_buf_free(p->bufs[i]);
    pt_host_close(&p->a);
    pt_host_close(&p->b);
    memset(p, 0, sizeof(*p));
}
