/* SPDX-License-Identifier: MIT */
/* exs_connbench: connection establishment time through the provider interface, with and
 * without the verbs provider's QP cache (X-RDMA measured 3946 us -> 2451 us).
 *
 *   exs_connbench [-p PROVIDER] [-n ITERATIONS] [-a ADDRESS] [-c QP_CACHE|-C]
 *
 * One process, two contexts (client and server) on one device. Each iteration creates an ep
 * on both sides, connects, accepts, waits for ESTABLISHED on both (the time measured: from
 * ep_create to both ESTABLISHED), then disconnects, waits for DISCONNECTED on both and
 * destroys the eps (their QPs go back to the cache when it is on). By default two passes run,
 * the QP cache off (EXS_VRB_QP_CACHE=0) then on (16); -c N runs one pass with N. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

#define CB_TIMEOUT_NS (10ull * 1000000000ull)

struct cb {
    const struct exs_prov_ops *ops;
    struct exs_prov_ctx *cctx, *sctx;
    struct exs_prov_listener *lis;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct exs_prov_ep *ec, *es;
    int est_c, est_s, disc_c, disc_s, failed;
};

static void cb_events(struct cb *b, struct exs_prov_ctx *ctx)
{
    struct exs_prov_cqe c[16];
    struct exs_prov_cm_event ev;

    while (exs__prov_poll(ctx, c, 16) > 0)
        ;
    while (exs__prov_cm_poll(ctx, &ev) == 1) {
        switch (ev.type) {
        case EXS_PROV_CM_CONNECT_REQUEST:
            if (exs__prov_accept(ev.req, b->es, NULL, 0) != 0) {
                fprintf(stderr, "exs_connbench: accept failed\n");
                b->failed = 1;
            }
            break;
        case EXS_PROV_CM_ESTABLISHED:
            if (ev.ep == b->ec)
                b->est_c = 1;
            else if (ev.ep == b->es)
                b->est_s = 1;
            break;
        case EXS_PROV_CM_DISCONNECTED:
            if (ev.ep == b->ec)
                b->disc_c = 1;
            else if (ev.ep == b->es)
                b->disc_s = 1;
            break;
        default:
            fprintf(stderr, "exs_connbench: unexpected %s (status %d)\n",
                    exs__prov_cm_event_str(ev.type), ev.status);
            b->failed = 1;
            break;
        }
    }
}

/* Drive both contexts until *a && *b2 (or failure / timeout). 0 or -1. */
static int cb_wait(struct cb *b, const int *x, const int *y)
{
    uint64_t deadline = exs__now_ns() + CB_TIMEOUT_NS;

    for (;;) {
        struct pollfd pfd[2];
        int busy = 0;

        cb_events(b, b->cctx);
        cb_events(b, b->sctx);
        if (b->failed)
            return -1;
        if (*x && *y)
            return 0;
        if (exs__now_ns() > deadline) {
            fprintf(stderr, "exs_connbench: timed out\n");
            return -1;
        }
        busy |= exs__prov_arm(b->cctx) == -EAGAIN;
        busy |= exs__prov_arm(b->sctx) == -EAGAIN;
        if (busy)
            continue;
        pfd[0] = (struct pollfd){.fd = exs__prov_ctx_event_fd(b->cctx), .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = exs__prov_ctx_event_fd(b->sctx), .events = POLLIN};
        poll(pfd, 2, 100);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static void print_counter(const char *set, const char *name)
{
    uint64_t v;

    if (exs__counters_lookup(set, name, &v) == 0)
        printf("  %s/%s %llu\n", set, name, (unsigned long long)v);
}

static int cb_pass(const char *prov, const char *ip, int n, long qp_cache)
{
    struct exs_prov_attr attr = {.device = NULL};
    struct exs_prov_ep_attr ea = {
        .max_send_wr = 64,
        .max_recv_wr = 64,
        .max_inline = 64,
        .rnr_retry = 7,
    };
    struct sockaddr_in sin = {.sin_family = AF_INET};
    struct cb b;
    uint64_t *t, sum = 0, create_sum = 0;
    int rc = 1, done = 0;
    char buf[32];

    memset(&b, 0, sizeof(b));
    snprintf(buf, sizeof(buf), "%ld", qp_cache);
    setenv("EXS_VRB_QP_CACHE", buf, 1);
    exs__params_reset();
    exs__params_load();
    b.ops = exs__prov_find(prov);
    if (!b.ops) {
        fprintf(stderr, "exs_connbench: provider %s: not built in\n", prov);
        return 1;
    }
    t = calloc((size_t)n, sizeof(*t));
    if (!t)
        return 1;
    if (exs__prov_ctx_open(b.ops, &attr, &b.cctx) || exs__prov_ctx_open(b.ops, &attr, &b.sctx)) {
        fprintf(stderr, "exs_connbench: ctx_open(%s) failed\n", prov);
        goto out;
    }
    if (inet_pton(AF_INET, ip, &sin.sin_addr) != 1) {
        fprintf(stderr, "exs_connbench: bad address %s\n", ip);
        goto out;
    }
    if (exs__prov_listen(b.sctx, (struct sockaddr *)&sin, sizeof(sin), 64, NULL, &b.lis)) {
        fprintf(stderr, "exs_connbench: listen on %s failed\n", ip);
        goto out;
    }
    b.addrlen = sizeof(b.addr);
    if (exs__prov_listener_addr(b.lis, &b.addr, &b.addrlen))
        goto out;
    for (int i = 0; i < n; i++) {
        uint64_t t0 = exs__now_ns();

        b.est_c = b.est_s = b.disc_c = b.disc_s = 0;
        if (exs__prov_ep_create(b.cctx, &ea, &b.ec) || exs__prov_ep_create(b.sctx, &ea, &b.es)) {
            fprintf(stderr, "exs_connbench: ep_create failed\n");
            goto out;
        }
        create_sum += exs__now_ns() - t0;
        if (exs__prov_connect(b.ec, (struct sockaddr *)&b.addr, b.addrlen, NULL, 0) ||
            cb_wait(&b, &b.est_c, &b.est_s))
            goto out;
        t[i] = exs__now_ns() - t0;
        exs__prov_disconnect(b.ec);
        if (cb_wait(&b, &b.disc_c, &b.disc_s))
            goto out;
        exs__prov_ep_destroy(b.ec);
        exs__prov_ep_destroy(b.es);
        b.ec = b.es = NULL;
        done++;
    }
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof(*t), cmp_u64);
    printf("%s qp_cache %ld: %d connections, establishment mean %.0f us, median %.0f us, "
           "min %.0f us, max %.0f us\n",
           prov, qp_cache, n, (double)sum / n / 1e3, (double)t[n / 2] / 1e3, (double)t[0] / 1e3,
           (double)t[n - 1] / 1e3);
    printf("  of which ep_create (both sides) mean %.0f us\n", (double)create_sum / n / 1e3);
    print_counter("prov.verbs.qpcache", "qp_cache_hits");
    print_counter("prov.verbs.qpcache", "qp_cache_misses");
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "exs_connbench: failed after %d connections\n", done);
    if (b.ec)
        exs__prov_ep_destroy(b.ec);
    if (b.es)
        exs__prov_ep_destroy(b.es);
    if (b.lis)
        exs__prov_listener_destroy(b.lis);
    if (b.cctx)
        exs__prov_ctx_close(b.cctx);
    if (b.sctx)
        exs__prov_ctx_close(b.sctx);
    free(t);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: exs_connbench [-p PROVIDER] [-n ITERATIONS] [-a ADDRESS] [-c QP_CACHE]\n"
               "  -p  tcp or verbs (default: $EXS_PROVIDER, else tcp)\n"
               "  -n  connections per pass (default 50)\n"
               "  -a  IPv4 address to listen on (default 127.0.0.1)\n"
               "  -c  one pass with EXS_VRB_QP_CACHE=QP_CACHE (default: two passes, 0 and 16)\n");
}

int main(int argc, char **argv)
{
    const char *prov = getenv("EXS_PROVIDER"), *ip = "127.0.0.1";
    long one = -1;
    int n = 50, opt, rc;

    if (!prov || !prov[0])
        prov = "tcp";
    while ((opt = getopt(argc, argv, "p:n:a:c:h")) != -1) {
        switch (opt) {
        case 'p':
            prov = optarg;
            break;
        case 'n':
            n = atoi(optarg);
            break;
        case 'a':
            ip = optarg;
            break;
        case 'c':
            one = atol(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (n < 1) {
        usage(stderr);
        return 2;
    }
    if (one >= 0)
        return cb_pass(prov, ip, n, one);
    rc = cb_pass(prov, ip, n, 0);
    if (!rc)
        rc = cb_pass(prov, ip, n, 16);
    return rc;
}
