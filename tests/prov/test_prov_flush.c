/* SPDX-License-Identifier: MIT */
/* Flushing: disconnect on either side, posting afterwards, and a peer process killed with SIGKILL.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

static void expect_disconnected(struct pt_host *h, struct exs_prov_ep *ep, int want_status,
                                const char *side)
{
    struct exs_prov_cm_event ev;

    pt_wait_cm(h, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, ep);
    ck_assert_msg(ev.status == want_status, "%s: DISCONNECTED status %d, expected %d", side,
                  ev.status, want_status);
}

START_TEST(flush_recvs_on_disconnect)
{
    struct pt_pair p;
    struct pt_buf *ba, *bb;

    pt_pair_setup(&p, NULL, NULL);
    ba = pt_pair_buf(&p, 'a', 64, LW, 0);
    bb = pt_pair_buf(&p, 'b', 64, LW, 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(pt_post_recv(p.ea, 10 + i, ba, 0, 64), 0);
        ck_assert_int_eq(pt_post_recv(p.eb, 20 + i, bb, 0, 64), 0);
    }
    ck_assert_int_eq(pt_ops->disconnect(p.ea), 0);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    expect_disconnected(&p.a, p.ea, 0, "active side");
    expect_disconnected(&p.b, p.eb, 0, "passive side");
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    for (int i = 0; i < 3; i++) {
        pt_expect_cqe(&p.a, 10 + i, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
        pt_expect_cqe(&p.b, 20 + i, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    }
    /* posting after the disconnect completes with WR_FLUSH_ERR on both sides */
    ck_assert_int_eq(pt_post_send(p.ea, 30, EXS_PROV_WR_SEND, SIG, ba, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_recv(p.ea, 31, ba, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p.eb, 40, EXS_PROV_WR_SEND, 0, bb, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 41, bb, 0, 64), 0);
    pt_expect_wr(&p.a, 30, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_wr(&p.a, 31, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_wr(&p.b, 40, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_wr(&p.b, 41, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    pt_expect_no_cm(&p.a, 0);
    pt_expect_no_cm(&p.b, 0);
    pt_pair_close(&p);
}
END_TEST

START_TEST(flush_sends_on_disconnect)
{
    /* SENDs stalled by receiver-not-ready on both sides; the passive side disconnects. */
    struct pt_pair p;
    struct pt_buf *ba, *bb, *tb;

    pt_pair_setup(&p, NULL, NULL);
    ba = pt_pair_buf(&p, 'a', 64, LW, 1);
    bb = pt_pair_buf(&p, 'b', 64, LW, 2);
    tb = pt_pair_buf(&p, 'b', 64, LW | RW, 0);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_SEND, SIG, ba, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_RDMA_WRITE, 0, ba, 0, 64, 0, pt_raddr(tb, 0),
                                  tb->mr->rkey),
                     0);
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, ba, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_SEND, SIG, bb, 0, 64, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.eb, 5, EXS_PROV_WR_SEND_WITH_IMM, 0, bb, 0, 64, 9, 0, 0), 0);
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
    expect_disconnected(&p.b, p.eb, 0, "passive side");
    expect_disconnected(&p.a, p.ea, 0, "active side");
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.b, 4, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.b, 5, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    pt_pair_close(&p);
}
END_TEST

START_TEST(flush_after_error_completion_keeps_order)
{
    /* Receives posted before and after an error flush in posting order. */
    struct pt_pair p;
    struct pt_buf *src, *dst;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 200, LW, 0x42);
    dst = pt_pair_buf(&p, 'b', 200, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 100), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, dst, 0, 100), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 3, dst, 0, 100), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 9, EXS_PROV_WR_SEND, SIG, src, 0, 200, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_LOC_LEN_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.b, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.b, 3, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_post_recv(p.eb, 4, dst, 0, 100), 0);
    pt_expect_cqe(&p.b, 4, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 9, EXS_PROV_WC_REM_INV_REQ_ERR, PT_ANY_OPCODE, NULL);
    pt_pair_close(&p);
}
END_TEST

/* ---- a peer process killed with SIGKILL ---- */

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    size_t got = 0;

    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&pfd, 1, timeout_ms) <= 0)
            return -1;
        n = read(fd, (char *)buf + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* Child side, without Check: exits with a code on failure. role 'c' connects to the
 * address read from in_fd; role 'l' listens, writes its address, accepts. Then writes
 * 'E' once established and waits to be killed. */
static void child_main(char role, int in_fd, int out_fd)
{
    const struct exs_prov_attr attr = {.device = NULL};
    struct exs_prov_ep_attr ea = pt_default_attr();
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_cm_event ev;
    struct sockaddr_storage addr;
    socklen_t alen = sizeof(addr);
    double deadline;
    int est = 0;

    alarm(30);
    if (pt_ctx_open(&attr, &ctx) != 0)
        _exit(10);
    if (pt_ops->ep_create(ctx, &ea, &ep) != 0)
        _exit(11);
    if (role == 'c') {
        if (read_full(in_fd, &alen, sizeof(alen), 10000) || read_full(in_fd, &addr, alen, 10000))
            _exit(12);
        if (pt_ops->connect(ep, (struct sockaddr *)&addr, alen, NULL, 0) != 0)
            _exit(13);
    } else {
        struct sockaddr_in sin = {.sin_family = AF_INET};
        struct exs_prov_listener *lis;

        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (pt_ops->listen(ctx, (struct sockaddr *)&sin, sizeof(sin), 4, NULL, &lis) != 0)
            _exit(14);
        if (pt_ops->listener_addr(lis, &addr, &alen) != 0)
            _exit(15);
        if (write(out_fd, &alen, sizeof(alen)) != sizeof(alen) ||
            write(out_fd, &addr, alen) != (ssize_t)alen)
            _exit(16);
    }
    deadline = pt_now_ms() + 10000;
    while (!est && pt_now_ms() < deadline) {
        if (pt_ops->ctx_cm_poll(ctx, &ev) != 1) {
            pt_sleep_ms(1);
            continue;
        }
        if (ev.type == EXS_PROV_CM_CONNECT_REQUEST) {
            if (pt_ops->accept(ev.req, ep, NULL, 0) != 0)
                _exit(17);
        } else if (ev.type == EXS_PROV_CM_ESTABLISHED) {
            est = 1;
        } else {
            _exit(18);
        }
    }
    if (!est)
        _exit(19);
    if (write(out_fd, "E", 1) != 1)
        _exit(20);
    for (;;)
        pause();
}

static pid_t spawn_child(char role, int *to_child, int *from_child)
{
    int a[2], b[2];
    pid_t pid;

    ck_assert_int_eq(pipe(a), 0);
    ck_assert_int_eq(pipe(b), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        child_main(role, a[0], b[1]);
        _exit(1);
    }
    close(a[0]);
    close(b[1]);
    *to_child = a[1];
    *from_child = b[0];
    return pid;
}

static void reap(pid_t pid, int fd1, int fd2)
{
    int st;

    kill(pid, SIGKILL);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child ended early, status %#x", st);
    close(fd1);
    close(fd2);
}

START_TEST(dead_peer_active_child)
{
    /* The child connects to us; killing it disconnects our ep and flushes its receives. */
    struct pt_host b;
    struct exs_prov_listener *lis;
    struct sockaddr_storage addr;
    socklen_t alen;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_ep *eb;
    struct exs_prov_cm_event ev;
    struct pt_buf *buf;
    int to_child, from_child;
    char c;
    pid_t pid;

    pid = spawn_child('c', &to_child, &from_child); /* fork before any provider thread */
    pt_host_open(&b);
    lis = pt_listen(&b, &addr, &alen);
    ck_assert_int_eq(pt_ops->ep_create(b.ctx, &at, &eb), 0);
    buf = pt_buf_new(&b, 64, LW, 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pt_post_recv(eb, 100 + i, buf, 0, 64), 0);
    ck_assert(write(to_child, &alen, sizeof(alen)) == sizeof(alen));
    ck_assert(write(to_child, &addr, alen) == (ssize_t)alen);
    pt_wait_cm(&b, EXS_PROV_CM_CONNECT_REQUEST, 10000, &ev);
    ck_assert_int_eq(pt_ops->accept(ev.req, eb, NULL, 0), 0);
    pt_wait_cm(&b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_msg(read_full(from_child, &c, 1, 10000) == 0 && c == 'E',
                  "child did not report ESTABLISHED");
    reap(pid, to_child, from_child);
    pt_wait_cm(&b, EXS_PROV_CM_DISCONNECTED, 10000, &ev);
    ck_assert_ptr_eq(ev.ep, eb);
    ck_assert_msg(ev.status == -ECONNRESET, "dead peer: DISCONNECTED status %d, expected %d",
                  ev.status, -ECONNRESET);
    ck_assert_int_eq(pt_ops->ep_state(eb), EXS_PROV_EP_ERROR);
    for (int i = 0; i < 3; i++)
        pt_expect_cqe(&b, 100 + i, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_ops->ep_destroy(eb);
    pt_ops->listener_destroy(lis);
    pt_buf_free(buf);
    pt_host_close(&b);
}
END_TEST

START_TEST(dead_peer_passive_child)
{
    /* We connect to the child; it dies while our SEND is stalled (no receive there). */
    struct pt_host a;
    struct sockaddr_storage addr;
    socklen_t alen;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_ep *ea;
    struct exs_prov_cm_event ev;
    struct pt_buf *buf;
    int to_child, from_child;
    char c;
    pid_t pid;

    pid = spawn_child('l', &to_child, &from_child);
    ck_assert_msg(read_full(from_child, &alen, sizeof(alen), 10000) == 0 &&
                      read_full(from_child, &addr, alen, 10000) == 0,
                  "child did not send its listener address");
    pt_host_open(&a);
    ck_assert_int_eq(pt_ops->ep_create(a.ctx, &at, &ea), 0);
    buf = pt_buf_new(&a, 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(ea, 1, buf, 0, 64), 0);
    ck_assert_int_eq(pt_ops->connect(ea, (struct sockaddr *)&addr, alen, NULL, 0), 0);
    pt_wait_cm(&a, EXS_PROV_CM_ESTABLISHED, 10000, &ev);
    ck_assert_ptr_eq(ev.ep, ea);
    ck_assert_msg(read_full(from_child, &c, 1, 10000) == 0 && c == 'E',
                  "child did not report ESTABLISHED");
    ck_assert_int_eq(pt_post_send(ea, 2, EXS_PROV_WR_SEND, SIG, buf, 0, 64, 0, 0, 0), 0);
    pt_expect_no_cqe(&a, 50);
    reap(pid, to_child, from_child);
    pt_wait_cm(&a, EXS_PROV_CM_DISCONNECTED, 10000, &ev);
    ck_assert_ptr_eq(ev.ep, ea);
    ck_assert_msg(ev.status == -ECONNRESET, "dead peer: DISCONNECTED status %d, expected %d",
                  ev.status, -ECONNRESET);
    pt_expect_wr(&a, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_wr(&a, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_ops->ep_destroy(ea);
    pt_buf_free(buf);
    pt_host_close(&a);
}
END_TEST

Suite *prov_flush_suite(void)
{
    Suite *s = suite_create("prov_flush");
    TCase *tc = pt_tcase("flush");

    tcase_add_test(tc, flush_recvs_on_disconnect);
    tcase_add_test(tc, flush_sends_on_disconnect);
    tcase_add_test(tc, flush_after_error_completion_keeps_order);
    suite_add_tcase(s, tc);
    tc = pt_tcase("dead_peer");
    tcase_add_test(tc, dead_peer_active_child);
    tcase_add_test(tc, dead_peer_passive_child);
    suite_add_tcase(s, tc);
    return s;
}
