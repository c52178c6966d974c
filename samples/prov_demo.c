/* SPDX-License-Identifier: MIT */
/* End-to-end demonstration of the verbs engine's provider layer: two contexts on this
 * machine connect over loopback, ping-pong with SEND, stream RDMA WRITE WITH IMMEDIATE,
 * read back with RDMA READ, and verify every byte.
 *
 *   prov_demo [-p PROVIDER] [-s BYTES] [-n TOTAL_BYTES] [-d DEPTH] [-i PINGS]
 *
 * This is the README's main job until blast exists. It uses internal headers, not the
 * ES-API: it shows the layer the ES-API is built on. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/prov.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "prov_demo: " __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

struct side {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr;
    uint8_t *buf;
};

/* Wait (at most 10 s) for one completion of ctx, sleeping on the event descriptor. */
static struct exs_prov_cqe wait_cqe(struct exs_prov_ctx *ctx)
{
    struct exs_prov_cqe cqe;
    uint64_t deadline = exs__now_ns() + 10000000000ull;

    for (;;) {
        if (exs__prov_poll(ctx, &cqe, 1) == 1) {
            if (cqe.status != EXS_PROV_WC_SUCCESS)
                DIE("wr %llu: %s", (unsigned long long)cqe.wr_id,
                    exs__prov_wc_status_str(cqe.status));
            return cqe;
        }
        if (exs__prov_arm(ctx) == -EAGAIN)
            continue;
        struct pollfd pfd = {.fd = exs__prov_ctx_event_fd(ctx), .events = POLLIN};
        if (poll(&pfd, 1, 100) < 0 && errno != EINTR)
            DIE("poll: %s", strerror(errno));
        if (exs__now_ns() > deadline)
            DIE("no completion within 10 s");
    }
}

static struct exs_prov_cm_event wait_cm(struct exs_prov_ctx *ctx, enum exs_prov_cm_event_type want)
{
    struct exs_prov_cm_event ev;
    uint64_t deadline = exs__now_ns() + 10000000000ull;

    for (;;) {
        if (exs__prov_cm_poll(ctx, &ev) == 1) {
            if (ev.type != want)
                DIE("expected %s, got %s (status %d)", exs__prov_cm_event_str(want),
                    exs__prov_cm_event_str(ev.type), ev.status);
            return ev;
        }
        if (exs__prov_arm(ctx) == -EAGAIN)
            continue;
        struct pollfd pfd = {.fd = exs__prov_ctx_event_fd(ctx), .events = POLLIN};
        poll(&pfd, 1, 100);
        if (exs__now_ns() > deadline)
            DIE("no %s within 10 s", exs__prov_cm_event_str(want));
    }
}

static void post_recv(struct side *s, uint64_t id, size_t off, uint32_t len)
{
    struct exs_prov_sge sge = {(uintptr_t)(s->buf + off), len, s->mr->lkey};
    struct exs_prov_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};

    if (exs__prov_post_recv(s->ep, &wr))
        DIE("post_recv failed");
}

static void post_send(struct side *s, enum exs_prov_wr_opcode op, uint64_t id, size_t off,
                      uint32_t len, uint64_t raddr, uint32_t rkey, uint32_t imm)
{
    struct exs_prov_sge sge = {(uintptr_t)(s->buf + off), len, s->mr->lkey};
    struct exs_prov_send_wr wr = {.wr_id = id,
                                  .opcode = op,
                                  .flags = EXS_PROV_SEND_SIGNALED,
                                  .sg_list = &sge,
                                  .num_sge = 1,
                                  .imm_data = imm,
                                  .remote_addr = raddr,
                                  .rkey = rkey};
    int ret = exs__prov_post_send(s->ep, &wr);

    if (ret)
        DIE("post_send: %s", strerror(-ret));
}

static void open_side(struct side *s, const struct exs_prov_ops *ops, size_t bufsz)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 256, .max_recv_wr = 256, .rnr_retry = 7};
    int ret;

    if ((ret = exs__prov_ctx_open(ops, &(struct exs_prov_attr){0}, &s->ctx)))
        DIE("ctx_open: %s", strerror(-ret));
    s->buf = aligned_alloc(4096, bufsz);
    if (!s->buf)
        DIE("out of memory");
    memset(s->buf, 0, bufsz);
    ret = exs__prov_mr_reg(s->ctx, s->buf, bufsz,
                           EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                               EXS_PROV_ACCESS_REMOTE_READ,
                           &s->mr);
    if (ret)
        DIE("mr_reg: %s", strerror(-ret));
    if ((ret = exs__prov_ep_create(s->ctx, &attr, &s->ep)))
        DIE("ep_create: %s", strerror(-ret));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *prov = NULL;
    size_t size = 1 << 20, total = 256u << 20;
    int depth = 16, pings = 1000, opt;
    struct side a = {0}, b = {0};

    while ((opt = getopt(argc, argv, "p:s:n:d:i:h")) != -1) {
        switch (opt) {
        case 'p':
            prov = optarg;
            break;
        case 's':
            size = strtoull(optarg, NULL, 0);
            break;
        case 'n':
            total = strtoull(optarg, NULL, 0);
            break;
        case 'd':
            depth = atoi(optarg);
            break;
        case 'i':
            pings = atoi(optarg);
            break;
        default:
            fprintf(stderr,
                    "usage: prov_demo [-p tcp|verbs] [-s size] [-n total] [-d depth] [-i pings]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (size == 0 || size > (64u << 20) || depth < 1 || depth > 128 || pings < 1)
        DIE("bad arguments");

    exs__params_load();
    if (!prov)
        prov = exs__params.provider[0] ? exs__params.provider : "tcp";
    const struct exs_prov_ops *ops = exs__prov_find(prov);
    if (!ops)
        DIE("unknown provider %s", prov);

    /* Two "hosts": a is the client, b the server; each buffer holds depth slots. */
    size_t bufsz = size * (size_t)depth;
    open_side(&a, ops, bufsz);
    open_side(&b, ops, bufsz);

    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    struct exs_prov_listener *lis;
    if (exs__prov_listen(b.ctx, (struct sockaddr *)&sin, sizeof(sin), 8, NULL, &lis) ||
        exs__prov_listener_addr(lis, &bound, &blen))
        DIE("listen failed");

    /* The handshake carries b's buffer address and rkey to a in the private data, as
     * the ES-API protocol carries its receive ring. */
    for (int i = 0; i < depth; i++)
        post_recv(&b, 1000 + i, 0, 64);
    if (exs__prov_connect(a.ep, (struct sockaddr *)&bound, blen, "hello", 5))
        DIE("connect failed");
    struct exs_prov_cm_event req = wait_cm(b.ctx, EXS_PROV_CM_CONNECT_REQUEST);
    uint8_t pd[12];
    uint64_t baddr = (uintptr_t)b.buf;
    memcpy(pd, &baddr, 8);
    memcpy(pd + 8, &b.mr->rkey, 4);
    if (exs__prov_accept(req.req, b.ep, pd, sizeof(pd)))
        DIE("accept failed");
    struct exs_prov_cm_event est = wait_cm(a.ctx, EXS_PROV_CM_ESTABLISHED);
    wait_cm(b.ctx, EXS_PROV_CM_ESTABLISHED);
    uint64_t raddr;
    uint32_t rkey;
    if (est.private_data_len != sizeof(pd))
        DIE("private data: %u bytes", est.private_data_len);
    memcpy(&raddr, est.private_data, 8);
    memcpy(&rkey, est.private_data + 8, 4);

    printf("# provider %s, loopback, %zu-byte transfers, depth %d\n", exs__prov_name(a.ctx), size,
           depth);

    /* 1. ping-pong: a SENDs 8 bytes, b answers; round trip = post to receive completion. */
    uint64_t *rtt = calloc((size_t)pings, sizeof(*rtt));
    for (int i = 0; i < depth; i++)
        post_recv(&a, 2000 + i, 0, 64);
    for (int i = 0; i < pings; i++) {
        uint64_t t0 = exs__now_ns();
        post_send(&a, EXS_PROV_WR_SEND, 1, 0, 8, 0, 0, 0);
        struct exs_prov_cqe c = wait_cqe(b.ctx); /* b: receive */
        post_recv(&b, c.wr_id, 0, 64);
        post_send(&b, EXS_PROV_WR_SEND, 2, 0, 8, 0, 0, 0);
        for (int got = 0; got < 2;) { /* a: its send and b's reply */
            c = wait_cqe(a.ctx);
            if (c.opcode == EXS_PROV_WC_RECV)
                post_recv(&a, c.wr_id, 0, 64);
            got++;
        }
        rtt[i] = exs__now_ns() - t0;
        wait_cqe(b.ctx); /* b's send */
    }
    qsort(rtt, (size_t)pings, sizeof(*rtt), cmp_u64);
    printf("%-28s p50 %8.1f us   p99 %8.1f us\n", "SEND ping-pong round trip", rtt[pings / 2] / 1e3,
           rtt[pings * 99 / 100] / 1e3);
    free(rtt);

    /* 2. stream WRITE WITH IMM, depth outstanding, each into its slot of b's buffer. */
    for (size_t i = 0; i < bufsz; i++)
        a.buf[i] = (uint8_t)(i * 7 + 3);
    size_t count = total / size, posted = 0, done = 0;
    uint64_t t0 = exs__now_ns();
    while (done < count) {
        while (posted < count && posted - done < (size_t)depth) {
            size_t slot = posted % (size_t)depth;
            post_send(&a, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, posted, slot * size, (uint32_t)size,
                      raddr + slot * size, rkey, (uint32_t)posted);
            posted++;
        }
        struct exs_prov_cqe c = wait_cqe(a.ctx);
        if (c.opcode != EXS_PROV_WC_RDMA_WRITE)
            DIE("unexpected opcode %s", exs__prov_wc_opcode_str(c.opcode));
        done++;
        /* The receiver sees the immediate data in order and re-posts its receive. */
        c = wait_cqe(b.ctx);
        if (c.opcode != EXS_PROV_WC_RECV_RDMA_WITH_IMM || c.imm_data != (uint32_t)(done - 1) ||
            c.byte_len != size)
            DIE("write %zu: bad receive completion", done - 1);
        post_recv(&b, c.wr_id, 0, 64);
    }
    double secs = (exs__now_ns() - t0) / 1e9;
    if (memcmp(a.buf, b.buf, bufsz))
        DIE("written data differs");
    printf("%-28s %8.2f Gbit/s (%zu MiB in %.3f s, verified)\n", "RDMA WRITE WITH IMM",
           count * size * 8 / secs / 1e9, count * size >> 20, secs);

    /* 3. READ it back into a's buffer after clearing it, and compare. */
    memset(a.buf, 0, bufsz);
    t0 = exs__now_ns();
    for (int i = 0; i < depth; i++)
        post_send(&a, EXS_PROV_WR_RDMA_READ, 5000 + i, (size_t)i * size, (uint32_t)size,
                  raddr + (size_t)i * size, rkey, 0);
    for (int i = 0; i < depth; i++) {
        struct exs_prov_cqe c = wait_cqe(a.ctx);
        if (c.opcode != EXS_PROV_WC_RDMA_READ || c.wr_id != 5000u + (unsigned)i)
            DIE("read completions out of order");
    }
    secs = (exs__now_ns() - t0) / 1e9;
    if (memcmp(a.buf, b.buf, bufsz))
        DIE("read data differs");
    printf("%-28s %8.2f Gbit/s (%zu MiB, verified)\n", "RDMA READ", bufsz * 8 / secs / 1e9,
           bufsz >> 20);

    /* 4. orderly teardown: both sides see DISCONNECTED, posted receives flush. */
    exs__prov_disconnect(a.ep);
    wait_cm(a.ctx, EXS_PROV_CM_DISCONNECTED);
    wait_cm(b.ctx, EXS_PROV_CM_DISCONNECTED);
    struct exs_prov_cqe drain[64];
    int flushed = 0, n;
    uint64_t until = exs__now_ns() + 200000000ull;
    while (exs__now_ns() < until)
        if ((n = exs__prov_poll(b.ctx, drain, 64)) > 0)
            flushed += n;
    while (exs__prov_poll(a.ctx, drain, 64) > 0)
        ;
    printf("%-28s both sides disconnected, %d receives flushed at the server\n", "teardown",
           flushed);
    exs__prov_ep_destroy(a.ep);
    exs__prov_ep_destroy(b.ep);
    exs__prov_listener_destroy(lis);
    exs__prov_mr_dereg(a.mr);
    exs__prov_mr_dereg(b.mr);
    exs__prov_ctx_close(a.ctx);
    exs__prov_ctx_close(b.ctx);
    free(a.buf);
    free(b.buf);
    return 0;
}
