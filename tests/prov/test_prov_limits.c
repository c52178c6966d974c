/* SPDX-License-Identifier: MIT */
/* Resource exhaustion in the tcp provider: out of descriptors, half-open connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/prov/prov_test.h"

/* Counters of a tcp ctx (tcp-only tests look inside the provider). */
static uint64_t tcp_cnt(struct exs_prov_ctx *c, size_t off)
{
    return __atomic_load_n((uint64_t *)((char *)&tcp_ctx_of(c)->cnt + off), __ATOMIC_RELAXED);
}
#define TCP_CNT(_c, _f) tcp_cnt((_c), offsetof(struct tcp_counters, _f))

static int raw_connect_port(uint16_t port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int raw_conn_req(int fd)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN, 0, 0, 0, 0);
    struct tcp_wire_conn cb = {.rnr_retry = 7};
    uint8_t buf[TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN];

    memcpy(buf, &h, sizeof(h));
    memcpy(buf + TCP_WIRE_HDR_LEN, &cb, sizeof(cb));
    return pt_raw_send(fd, buf, sizeof(buf));
}

/* ---- out of descriptors: the listener backs off instead of spinning ---- */

enum {
    EMFILE_OK = 0,
    EMFILE_SETUP = 10, /* ctx, listener or pipe failed in the child */
    EMFILE_NOT_FULL,   /* could not fill the descriptor table */
    EMFILE_SPIN,       /* accept attempts exploded */
    EMFILE_NO_BACKOFF, /* no back-off was counted */
    EMFILE_NO_RESUME,  /* no connection request after descriptors came back */
};

#define EMFILE_CLIENTS 3

/* The child: a ctx and a listener under RLIMIT_NOFILE 64, its table filled. */
static int emfile_child(int tochild, int toparent)
{
    struct rlimit rl = {.rlim_cur = 64, .rlim_max = 64};
    struct exs_prov_attr attr = {0};
    struct exs_prov_ctx *ctx = NULL;
    struct exs_prov_listener *lis = NULL;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fill[64], nfill = 0, got = 0;
    uint64_t calls0, calls;
    uint16_t port;
    char c;
    double deadline;

    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || pt_ctx_open(&attr, &ctx) < 0)
        return EMFILE_SETUP;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (pt_ops->listen(ctx, (struct sockaddr *)&sin, sizeof(sin), 16, NULL, &lis) < 0 ||
        pt_ops->listener_addr(lis, &ss, &sl) < 0)
        return EMFILE_SETUP;
    port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    while (nfill < 64) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

        if (fd < 0)
            break;
        fill[nfill++] = fd;
    }
    if (nfill == 64 || errno != EMFILE)
        return EMFILE_NOT_FULL;
    /* the table is full: let the clients connect, and watch for two seconds */
    calls0 = TCP_CNT(ctx, accept_calls);
    if (write(toparent, &port, sizeof(port)) != sizeof(port) || read(tochild, &c, 1) != 1)
        return EMFILE_SETUP;
    pt_sleep_ms(2000);
    calls = TCP_CNT(ctx, accept_calls) - calls0;
    printf("emfile: %llu accept calls, %llu back-offs in 2 s with the table full\n",
           (unsigned long long)calls, (unsigned long long)TCP_CNT(ctx, accept_backoffs));
    fflush(stdout);
    if (calls > 100)
        return EMFILE_SPIN;
    if (!TCP_CNT(ctx, accept_backoffs))
        return EMFILE_NO_BACKOFF;
    /* descriptors come back: the waiting clients are accepted without any help */
    while (nfill)
        close(fill[--nfill]);
    deadline = pt_now_ms() + 10000;
    while (got < EMFILE_CLIENTS && pt_now_ms() < deadline) {
        struct exs_prov_cm_event ev;

        if (pt_ops->ctx_cm_poll(ctx, &ev) == 1) {
            if (ev.type == EXS_PROV_CM_CONNECT_REQUEST) {
                pt_ops->reject(ev.req, NULL, 0);
                got++;
            }
        } else {
            pt_sleep_ms(5);
        }
    }
    if (got < EMFILE_CLIENTS)
        return EMFILE_NO_RESUME;
    pt_ops->listener_destroy(lis);
    pt_ctx_close(ctx);
    return EMFILE_OK;
}

START_TEST(limits_emfile_backoff)
{
    static const char *const why[] = {
        [EMFILE_SETUP] = "setup failed in the child",
        [EMFILE_NOT_FULL] = "could not fill the descriptor table",
        [EMFILE_SPIN] = "accept attempts exploded with the table full (spinning)",
        [EMFILE_NO_BACKOFF] = "no back-off counted",
        [EMFILE_NO_RESUME] = "connections not accepted after descriptors came back",
    };
    int tochild[2], toparent[2], fds[EMFILE_CLIENTS], status = 0;
    uint16_t port = 0;
    double deadline;
    pid_t pid;

    if (pt_skip_unless_tcp_itself("limits_emfile_backoff"))
        return;
    ck_assert_int_eq(pipe(tochild), 0);
    ck_assert_int_eq(pipe(toparent), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(tochild[1]);
        close(toparent[0]);
        _exit(emfile_child(tochild[0], toparent[1]));
    }
    close(tochild[0]);
    close(toparent[1]);
    if (read(toparent[0], &port, sizeof(port)) == sizeof(port)) {
        for (int i = 0; i < EMFILE_CLIENTS; i++) {
            fds[i] = raw_connect_port(port);
            ck_assert_int_ge(fds[i], 0);
            ck_assert_int_eq(raw_conn_req(fds[i]), 0);
        }
        ck_assert_int_eq(write(tochild[1], "g", 1), 1);
    } else {
        for (int i = 0; i < EMFILE_CLIENTS; i++)
            fds[i] = -1;
    }
    deadline = pt_now_ms() + 30000;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (pt_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ck_abort_msg("the child hung");
        }
        pt_sleep_ms(20);
    }
    for (int i = 0; i < EMFILE_CLIENTS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    close(tochild[1]);
    close(toparent[0]);
    ck_assert_msg(WIFEXITED(status), "the child died (status 0x%x)", status);
    ck_assert_msg(WEXITSTATUS(status) == EMFILE_OK, "%s (child exit %d)",
                  WEXITSTATUS(status) < (int)(sizeof(why) / sizeof(why[0])) &&
                          why[WEXITSTATUS(status)]
                      ? why[WEXITSTATUS(status)]
                      : "unexpected",
                  WEXITSTATUS(status));
}
END_TEST

/* ---- half-open connections: a handshake timeout and a bound per listener ---- */

static int count_fds(void)
{
    char path[64];
    int n = 0;

    for (int fd = 0; fd < 65536; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (access(path, F_OK) == 0)
            n++;
        else if (fd > 4096 && n == 0)
            break;
    }
    return n;
}

START_TEST(limits_half_open)
{
    enum { N = 300 };
    struct pt_pair p;
    int fds[N], base, now = 0;
    uint64_t dropped = 0;
    double deadline;

    if (pt_skip_unless_tcp_itself("limits_half_open"))
        return;
    /* a silent socket may be dropped for a new one after a tenth of it (100 ms): the 300
     * ahead of the new client go in about 19 rounds of 16 */
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "1000"), 0);
    ck_assert_int_eq(exs__params_set("tcp_hello_max", "16"), 0);
    pt_pair_open(&p, NULL, NULL);
    base = count_fds();
    for (int i = 0; i < N; i++)
        fds[i] = pt_raw_connect(&p); /* and never a CONN_REQ */
    /* new clients are still served */
    pt_pair_connect(&p);
    /* the provider's side of every silent socket is closed: by the bound or the timeout */
    deadline = pt_now_ms() + 15000; /* the timeout is 1 s */
    do {
        dropped = TCP_CNT(p.b.ctx, handshake_timeouts) + TCP_CNT(p.b.ctx, handshake_evictions);
        now = count_fds();
        if (dropped >= N && now <= base + N + 2)
            break;
        pt_sleep_ms(20);
    } while (pt_now_ms() < deadline);
    printf("limits_half_open: %llu timed out, %llu evicted; descriptors %d -> %d (+%d clients, "
           "+2 for the pair)\n",
           (unsigned long long)TCP_CNT(p.b.ctx, handshake_timeouts),
           (unsigned long long)TCP_CNT(p.b.ctx, handshake_evictions), base, now, N);
    ck_assert_msg(dropped >= N, "%llu of %d silent sockets dropped", (unsigned long long)dropped,
                  N);
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, handshake_evictions), 1);
    ck_assert_msg(now <= base + N + 2, "descriptors not back: %d, expected <= %d", now,
                  base + N + 2);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    pt_pair_close(&p);
    exs__params_set("tcp_hello_ms", exs__params_find("tcp_hello_ms")->defval);
    exs__params_set("tcp_hello_max", exs__params_find("tcp_hello_max")->defval);
}
END_TEST

/* At the handshake bound the waiting sockets may be a burst of live clients: the oldest is
 * dropped only once it has been silent for a tenth of the handshake timeout, and until then
 * the listener stops accepting (the next client waits in the kernel's queue) instead of
 * resetting a client that had no time to send its request. The old provider dropped the
 * oldest at once. */
START_TEST(limits_handshake_burst)
{
    enum { N = 2 };
    struct pt_pair p;
    int fds[N];
    double t0, ms;

    if (pt_skip_unless_tcp_itself("limits_handshake_burst"))
        return;
    /* a socket may be judged silent at 300 ms */
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "3000"), 0);
    ck_assert_int_eq(exs__params_set("tcp_hello_max", "2"), 0);
    pt_pair_open(&p, NULL, NULL);
    t0 = pt_now_ms();
    for (int i = 0; i < N; i++)
        fds[i] = pt_raw_connect(&p); /* they fill the bound, young */
    pt_pair_connect(&p);             /* queued behind them: waits, then one is dropped */
    ms = pt_now_ms() - t0;
    printf("limits_handshake_burst: connected after %.0f ms; %llu waits, %llu evicted\n", ms,
           (unsigned long long)TCP_CNT(p.b.ctx, handshake_waits),
           (unsigned long long)TCP_CNT(p.b.ctx, handshake_evictions));
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, handshake_waits), 1);
    ck_assert_uint_ge(TCP_CNT(p.b.ctx, handshake_evictions), 1);
    ck_assert_msg(ms >= 300, "a socket waiting %.0f ms was dropped, before 300 ms", ms);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    pt_pair_close(&p);
    exs__params_set("tcp_hello_max", exs__params_find("tcp_hello_max")->defval);
}
END_TEST

/* The completion ring grows with the reservations of the eps it serves and gives the
 * memory back when they are gone (issue 10: memory back to baseline after mass resets). */
static uint32_t cq_cap_of(struct exs_prov_ctx *c)
{
    uint32_t cap;

    pthread_mutex_lock(&tcp_ctx_of(c)->lock);
    cap = tcp_ctx_of(c)->cq.cap;
    pthread_mutex_unlock(&tcp_ctx_of(c)->lock);
    return cap;
}

START_TEST(limits_cq_shrinks)
{
    enum { N = 64 };
    struct exs_prov_ep *eps[N];
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_host h;
    uint32_t cap0, cap;

    if (pt_skip_unless_tcp_itself("limits_cq_shrinks"))
        return;
    pt_host_open(&h);
    cap0 = cq_cap_of(h.ctx);
    at.max_send_wr = EXS_MIN(h.ctx->caps.max_send_wr, 2048u);
    at.max_recv_wr = EXS_MIN(h.ctx->caps.max_recv_wr, 2048u);
    ck_assert_uint_gt((uint64_t)N * (at.max_send_wr + at.max_recv_wr), cap0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(pt_ops->ep_create(h.ctx, &at, &eps[i]), 0);
    cap = cq_cap_of(h.ctx);
    ck_assert_msg(cap >= (uint64_t)N * (at.max_send_wr + at.max_recv_wr),
                  "ring of %u entries for %d eps of %u + %u", cap, N, at.max_send_wr,
                  at.max_recv_wr);
    for (int i = 0; i < N; i++)
        pt_ops->ep_destroy(eps[i]);
    ck_assert_msg(cq_cap_of(h.ctx) == cap0, "ring still %u entries after every ep went (first %u)",
                  cq_cap_of(h.ctx), cap0);
    pt_host_close(&h);
}
END_TEST

/* ---- work request blocks: posted sends and receives take blocks of their ep's pool ----
 * (exs_soft_pool, issue 25: no malloc and free per work request on the data path) */

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;

    return x < y ? -1 : x > y;
}

/* The blocks cached in e's pool of sends (send) or receives, sorted; their count. */
static uint32_t pool_blocks(struct exs_prov_ep *e, int send, void **blk, uint32_t max)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    struct exs_soft_pool *pool = send ? &ep->wr_pool : &ep->rwr_pool;
    uint32_t n = 0;

    pthread_mutex_lock(&ep->lock);
    ck_assert_uint_le(pool->n, max);
    for (void *b = pool->head; b && n < max; memcpy(&b, b, sizeof(b)))
        blk[n++] = b;
    ck_assert_uint_eq(n, pool->n);
    pthread_mutex_unlock(&ep->lock);
    qsort(blk, n, sizeof(*blk), ptr_cmp);
    return n;
}

/* Two rounds of N SENDs into N receives: the completions of the first give every block
 * back to its ep's pool, and the second round takes its blocks from there and gives them
 * back (nothing allocated per work request once the pool holds enough). */
START_TEST(limits_wr_blocks_reused)
{
    enum { N = 8 };
    void *blk[2][2][N]; /* [round][send?][block] */
    uint32_t n[2][2];
    struct pt_buf *sb, *rb;
    struct pt_pair p;

    if (pt_skip_unless_tcp_itself("limits_wr_blocks_reused"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    sb = pt_pair_buf(&p, 'a', N * 64, EXS_PROV_ACCESS_LOCAL_WRITE, 1);
    rb = pt_pair_buf(&p, 'b', N * 64, EXS_PROV_ACCESS_LOCAL_WRITE, 0);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, rb, 64 * i, 64), 0);
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, sb,
                                          64 * i, 64, 0, 0, 0),
                             0);
        for (int i = 0; i < N; i++) {
            pt_expect_wr(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
            pt_expect_wr(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        }
        /* as many blocks as were out at once (a send may complete before the next is
         * posted), all back once every request completed */
        for (int side = 0; side < 2; side++) {
            n[round][side] = pool_blocks(side ? p.ea : p.eb, side, blk[round][side], N);
            ck_assert_uint_ge(n[round][side], 1);
        }
    }
    /* the second round took its blocks from the pool: none of the first round's went */
    for (int side = 0; side < 2; side++) {
        ck_assert_uint_ge(n[1][side], n[0][side]);
        for (uint32_t i = 0; i < n[0][side]; i++) {
            int found = 0;

            for (uint32_t k = 0; k < n[1][side]; k++)
                found |= blk[1][side][k] == blk[0][side][i];
            ck_assert_msg(found, "a %s block of the first round left the pool",
                          side ? "send" : "receive");
        }
    }
    pt_pair_close(&p);
}
END_TEST

Suite *prov_limits_suite(void)
{
    Suite *s = suite_create("prov_limits");
    TCase *tc = pt_tcase("limits");

    tcase_add_test(tc, limits_emfile_backoff);
    tcase_add_test(tc, limits_half_open);
    tcase_add_test(tc, limits_handshake_burst);
    tcase_add_test(tc, limits_cq_shrinks);
    tcase_add_test(tc, limits_wr_blocks_reused);
    suite_add_tcase(s, tc);
    return s;
}
