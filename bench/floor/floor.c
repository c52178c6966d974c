/* SPDX-License-Identifier: MIT */
/*
 * The floors under blast's round trip (issue 28: where the time above UCX goes). Two
 * processes (a fork: the parent answers, the child asks and times), busy polling, one
 * message in flight, p50 of the per-round-trip times:
 *
 *   floor line [-i ITERS]            a word written by one process, seen by the other and
 *                                    written back: the cores' cache-line round trip
 *   floor prov [-p shm|tcp] [-s BYTES] [-i ITERS]
 *                                    the provider alone through prov.h: a SEND into a posted
 *                                    receive and back, completions taken by
 *                                    exs__prov_progress_poll (the engine's call)
 *
 * blast --loopback --type seqpacket --lat-only --poll --poll-recv is the same exchange
 * through the whole library (API, event queues, protocol); bench/floor/floor.sh prints the
 * three side by side, interleaved. Internal headers: this measures the layer the ES-API is
 * built on, as samples/prov_demo.c shows it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/prov/prov.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "floor: " __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

#define FL_DEADLINE_NS 30000000000ull /* a stall dies after 30 s, never hangs */
#define FL_RECVS       8

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* p50 of n round trips (ns), sorted in place; printed as one line "NAME p50 X us p99 Y us". */
static void report(const char *name, uint64_t *rt, int n)
{
    qsort(rt, (size_t)n, sizeof(*rt), cmp_u64);
    printf("%s p50 %.3f us p99 %.3f us (%d round trips)\n", name, rt[n / 2] / 1e3,
           rt[(size_t)n * 99 / 100] / 1e3, n);
    fflush(stdout);
}

/* ---- line: the cores' floor ---- */

struct line_pair {
    _Alignas(64) uint64_t ping; /* written by the asker */
    _Alignas(64) uint64_t pong; /* written by the answerer */
};

static int run_line(int iters)
{
    struct line_pair *lp =
        mmap(NULL, sizeof(*lp), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint64_t *rt = calloc((size_t)iters, sizeof(*rt));
    int status;
    pid_t pid;

    if (lp == MAP_FAILED || !rt)
        DIE("out of memory");
    memset(lp, 0, sizeof(*lp));
    pid = fork();
    if (pid < 0)
        DIE("fork: %s", strerror(errno));
    if (pid == 0) {
        uint64_t deadline = exs__now_ns() + FL_DEADLINE_NS;

        for (uint64_t i = 1, spins = 0; i <= (uint64_t)iters + 1; i++) {
            while (__atomic_load_n(&lp->ping, __ATOMIC_ACQUIRE) != i)
                if ((++spins & 0xfffff) == 0 && exs__now_ns() > deadline)
                    _exit(3);
            __atomic_store_n(&lp->pong, i, __ATOMIC_RELEASE);
        }
        _exit(0);
    }
    for (uint64_t i = 1; i <= (uint64_t)iters + 1; i++) {
        uint64_t t0 = exs__now_ns(), deadline = t0 + FL_DEADLINE_NS;

        __atomic_store_n(&lp->ping, i, __ATOMIC_RELEASE);
        while (__atomic_load_n(&lp->pong, __ATOMIC_ACQUIRE) != i)
            if (exs__now_ns() > deadline) {
                kill(pid, SIGKILL);
                DIE("line: no answer within 30 s");
            }
        if (i > 1) /* the first one warms up */
            rt[i - 2] = exs__now_ns() - t0;
    }
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
        DIE("line: the answering process failed (status %#x)", (unsigned)status);
    report("line", rt, iters);
    free(rt);
    munmap(lp, sizeof(*lp));
    return 0;
}

/* ---- prov: the provider alone ---- */

struct side {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr;
    uint8_t *buf;
    uint32_t size;
    uint64_t deadline;
};

static void side_open(struct side *s, const struct exs_prov_ops *ops, uint32_t size)
{
    struct exs_prov_ep_attr attr = {
        .max_send_wr = 64, .max_recv_wr = 64, .max_inline = 0, .rnr_retry = 7};
    size_t bufsz = (size_t)size * (FL_RECVS + 1);
    int ret;

    s->size = size;
    /* manual progress, as the engine opens it: our turns move the data, no thread of the
     * provider's own (and so no doorbell) */
    if ((ret = exs__prov_ctx_open(
             ops, &(struct exs_prov_attr){.flags = EXS_PROV_ATTR_MANUAL_PROGRESS}, &s->ctx)))
        DIE("ctx_open: %s", strerror(-ret));
    s->buf = aligned_alloc(4096, (bufsz + 4095) & ~(size_t)4095);
    if (!s->buf)
        DIE("out of memory");
    memset(s->buf, 0x5a, bufsz);
    if ((ret = exs__prov_mr_reg(s->ctx, s->buf, bufsz, EXS_PROV_ACCESS_LOCAL_WRITE, &s->mr)))
        DIE("mr_reg: %s", strerror(-ret));
    if ((ret = exs__prov_ep_create(s->ctx, &attr, &s->ep)))
        DIE("ep_create: %s", strerror(-ret));
}

static void side_recv(struct side *s, uint64_t slot)
{
    struct exs_prov_sge sge = {(uintptr_t)(s->buf + (slot + 1) * s->size), s->size, s->mr->lkey};
    struct exs_prov_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1};
    int ret = exs__prov_post_recv(s->ep, &wr);

    if (ret)
        DIE("post_recv: %s", strerror(-ret));
}

static void side_send(struct side *s)
{
    struct exs_prov_sge sge = {(uintptr_t)s->buf, s->size, s->mr->lkey};
    struct exs_prov_send_wr wr = {.wr_id = 1u << 20,
                                  .opcode = EXS_PROV_WR_SEND,
                                  .flags = EXS_PROV_SEND_SIGNALED,
                                  .sg_list = &sge,
                                  .num_sge = 1};
    int ret = exs__prov_post_send(s->ep, &wr);

    if (ret)
        DIE("post_send: %s", strerror(-ret));
}

/* Busy: the next receive completion (its slot); send completions on the way are counted. */
static uint64_t side_take_recv(struct side *s, int *sends_p)
{
    struct exs_prov_cqe c[4];

    for (;;) {
        int n = 0;

        exs__prov_progress_poll(s->ctx, c, 4, &n);
        for (int i = 0; i < n; i++) {
            if (c[i].status != EXS_PROV_WC_SUCCESS)
                DIE("wr %llu: %s", (unsigned long long)c[i].wr_id,
                    exs__prov_wc_status_str(c[i].status));
            if (c[i].opcode == EXS_PROV_WC_RECV) {
                /* at most one receive completes per round trip: nothing else is sent */
                for (int j = i + 1; j < n; j++)
                    if (c[j].opcode == EXS_PROV_WC_RECV)
                        DIE("two receives in one round trip");
                    else
                        (*sends_p)++;
                return c[i].wr_id;
            }
            (*sends_p)++;
        }
        if (exs__now_ns() > s->deadline)
            DIE("no receive within 30 s");
    }
}

static struct exs_prov_cm_event side_cm(struct side *s, enum exs_prov_cm_event_type want)
{
    struct exs_prov_cm_event ev;
    uint64_t deadline = exs__now_ns() + FL_DEADLINE_NS;

    for (;;) {
        exs__prov_progress(s->ctx); /* manual progress: the connection moves in our turns */
        if (exs__prov_cm_poll(s->ctx, &ev) == 1) {
            if (ev.type != want)
                DIE("expected %s, got %s (status %d)", exs__prov_cm_event_str(want),
                    exs__prov_cm_event_str(ev.type), ev.status);
            return ev;
        }
        if (exs__prov_arm(s->ctx) == -EAGAIN)
            continue;
        struct pollfd pfd = {.fd = exs__prov_ctx_event_fd(s->ctx), .events = POLLIN};
        poll(&pfd, 1, 100);
        if (exs__now_ns() > deadline)
            DIE("no %s within 30 s", exs__prov_cm_event_str(want));
    }
}

static void prov_answer(const struct exs_prov_ops *ops, uint32_t size, int iters, int port_w,
                        int done_r)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    struct exs_prov_listener *lis;
    struct side s = {0};
    int sends = 0;

    side_open(&s, ops, size);
    if (exs__prov_listen(s.ctx, (struct sockaddr *)&sin, sizeof(sin), 4, NULL, &lis) ||
        exs__prov_listener_addr(lis, &bound, &blen))
        DIE("listen failed");
    for (uint64_t i = 0; i < FL_RECVS; i++)
        side_recv(&s, i);
    if (write(port_w, &bound, blen) != (ssize_t)blen)
        DIE("pipe: %s", strerror(errno));
    close(port_w);
    struct exs_prov_cm_event req = side_cm(&s, EXS_PROV_CM_CONNECT_REQUEST);
    if (exs__prov_accept(req.req, s.ep, NULL, 0))
        DIE("accept failed");
    side_cm(&s, EXS_PROV_CM_ESTABLISHED);
    s.deadline = exs__now_ns() + FL_DEADLINE_NS;
    for (int i = 0; i <= iters; i++) {
        uint64_t slot = side_take_recv(&s, &sends);

        side_recv(&s, slot);
        side_send(&s);
    }
    /* progress on until the asker has its last answer (it says so on done_r): in manual
     * progress our turns move that answer, and over tcp its completion needs the asker's
     * acknowledgement, so neither side waits for the other's last completion */
    for (unsigned turn = 0;; turn++) {
        struct exs_prov_cqe c[4];
        int n = 0;

        exs__prov_progress_poll(s.ctx, c, 4, &n);
        if ((turn & 1023) == 0) {
            struct pollfd pfd = {.fd = done_r, .events = POLLIN};

            if (poll(&pfd, 1, 0) == 1)
                break;
            if (exs__now_ns() > s.deadline)
                DIE("the asker did not finish within 30 s");
        }
    }
    exs__prov_listener_destroy(lis);
}

static int run_prov(const char *prov, uint32_t size, int iters)
{
    const struct exs_prov_ops *ops;
    struct sockaddr_storage addr;
    uint64_t *rt = calloc((size_t)iters, sizeof(*rt));
    struct side s = {0};
    int pfd[2], done[2], status, sends = 0;
    ssize_t alen;
    pid_t pid;

    exs__params_load();
    ops = exs__prov_find(prov);
    if (!ops)
        DIE("unknown provider %s", prov);
    if (!rt || pipe(pfd) || pipe(done))
        DIE("out of memory or descriptors");
    pid = fork();
    if (pid < 0)
        DIE("fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        close(done[1]);
        prov_answer(ops, size, iters, pfd[1], done[0]);
        _exit(0);
    }
    close(pfd[1]);
    close(done[0]);
    alen = read(pfd[0], &addr, sizeof(addr));
    if (alen <= 0)
        DIE("the answering process did not listen");
    side_open(&s, ops, size);
    for (uint64_t i = 0; i < FL_RECVS; i++)
        side_recv(&s, i);
    if (exs__prov_connect(s.ep, (struct sockaddr *)&addr, (socklen_t)alen, NULL, 0))
        DIE("connect failed");
    side_cm(&s, EXS_PROV_CM_ESTABLISHED);
    s.deadline = exs__now_ns() + FL_DEADLINE_NS;
    for (int i = 0; i <= iters; i++) {
        uint64_t t0 = exs__now_ns(), slot;

        side_send(&s);
        slot = side_take_recv(&s, &sends);
        side_recv(&s, slot);
        if (i > 0) /* the first one warms up */
            rt[i - 1] = exs__now_ns() - t0;
    }
    if (write(done[1], "", 1) != 1)
        DIE("pipe: %s", strerror(errno));
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
        DIE("prov: the answering process failed (status %#x)", (unsigned)status);
    char name[64];
    snprintf(name, sizeof(name), "prov %s %u B", prov, size);
    report(name, rt, iters);
    free(rt);
    return 0;
}

int main(int argc, char **argv)
{
    const char *prov = "shm";
    uint32_t size = 64;
    int iters = 100000, opt;

    if (argc < 2 || (strcmp(argv[1], "line") && strcmp(argv[1], "prov"))) {
        fprintf(stderr, "usage: floor line|prov [-p shm|tcp] [-s BYTES] [-i ITERS]\n");
        return 2;
    }
    optind = 2;
    while ((opt = getopt(argc, argv, "p:s:i:")) != -1) {
        switch (opt) {
        case 'p':
            prov = optarg;
            break;
        case 's':
            size = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    if (size < 1 || size > (1u << 20) || iters < 1 || iters > 100000000)
        DIE("bad arguments");
    return strcmp(argv[1], "line") == 0 ? run_line(iters) : run_prov(prov, size, iters);
}
