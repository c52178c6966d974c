/* SPDX-License-Identifier: MIT */
/* Session 26's second attack review (h76) of the receive queue as merged (h70's shm receive
 * ring: posts under rq_lock without ctx->lock, the local key checked when the turn takes a
 * receive; h73's and the lead's fixes).
 *
 * recv_dereg_before_take: a receive whose region is deregistered after the post and before
 * a message arrives must not be written (the region's memory is the application's again:
 * it may be freed); it completes in error, the receives behind it are flushed once each, in
 * posting order. Inline (64 B) and copied (256 KiB) messages.
 * rq_two_posters: two threads post on one ep at once (rq_lock contended, its naps taken)
 * while the peer sends one message per receive: every receive completes once, each
 * thread's in its own posting order, every message whole.
 * rq_destroy_own_sges: an ep destroyed with receives of their own memory (more sges than a
 * slot's block) and of slot blocks still in the ring frees them (ASan/LSan: no leak).
 * rq_destroy_mid_fragment: the same with the ep destroyed while r1 (sges of its own) holds
 * a message in fragments, r2 behind it.
 * killed_mid_fragment: the sending peer, another process, is killed (SIGKILL) while this
 * side's first receive r1 holds a message in fragments (made deterministic: this side's
 * nic_lock held while the receives are posted, one turn of the connection run by the test,
 * the child killed and reaped): r1, r2 and r3 are each flushed once, in posting order, then
 * DISCONNECTED. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/params.h"
#include "tests/prov/prov_shm_nic.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

static void dereg_round(uint32_t len)
{
    struct pt_pair p;
    struct pt_buf *src, *r1, *r2;
    struct exs_prov_cqe c;
    int seen1 = 0, seen2 = 0, sent = 0;
    double deadline;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', len, 0, 'x');
    r1 = pt_pair_buf(&p, 'b', len, LW, 0x11);
    r2 = pt_pair_buf(&p, 'b', len, LW, 0x22);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, r1, 0, len), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, r2, 0, len), 0);
    /* r1's region goes before any message arrives */
    ck_assert_int_eq(pt_ops->mr_dereg(r1->mr), 0);
    r1->mr = NULL;
    ck_assert_int_eq(pt_post_send(p.ea, 10, EXS_PROV_WR_SEND, SIG, src, 0, len, 0, 0, 0), 0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while ((!seen1 || !seen2) && pt_now_ms() < deadline) {
        if (!pt_try_cqe(&p.b, 100, &c))
            continue;
        ck_assert_msg(c.wr_id == 1 || c.wr_id == 2, "b: stray completion %llu",
                      (unsigned long long)c.wr_id);
        if (c.wr_id == 1) {
            ck_assert_msg(c.status != EXS_PROV_WC_SUCCESS,
                          "len %u: the receive on a deregistered region succeeded", len);
            ck_assert_int_eq(++seen1, 1);
        } else {
            ck_assert_msg(seen1, "r2 completed before r1");
            ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
            ck_assert_int_eq(++seen2, 1);
        }
    }
    ck_assert_msg(seen1 && seen2, "len %u: r1 %d r2 %d completions", len, seen1, seen2);
    ck_assert_msg(pt_all_bytes(r1->p, len, 0x11), "len %u: a deregistered region was written", len);
    ck_assert(pt_buf_guards_ok(r1));
    ck_assert(pt_all_bytes(r2->p, len, 0x22));
    while (!sent && pt_try_cqe(&p.a, PT_TIMEOUT_MS, &c)) {
        ck_assert_int_eq(c.wr_id, 10);
        ck_assert_int_ne(c.status, EXS_PROV_WC_SUCCESS);
        sent = 1;
    }
    ck_assert_int_eq(sent, 1);
    pt_expect_no_cqe(&p.b, 20); /* none twice */
    pt_pair_close(&p);
}

START_TEST(recv_dereg_before_take)
{
    dereg_round(64);
    dereg_round(256u << 10);
}
END_TEST

#define TP_N   256u /* receives per poster */
#define TP_LEN 32u

struct tp_poster {
    struct exs_prov_ep *ep;
    struct pt_buf *buf;
    uint64_t base; /* its wr_ids: base + i */
    int err;
};

static void *tp_post(void *arg)
{
    struct tp_poster *t = arg;
    double deadline = pt_now_ms() + PT_TIMEOUT_MS;

    for (uint32_t i = 0; i < TP_N;) {
        int ret = pt_post_recv(t->ep, t->base + i, t->buf, (size_t)i * TP_LEN, TP_LEN);

        if (ret == -ENOMEM && pt_now_ms() < deadline) {
            sched_yield(); /* full: the main thread polls */
            continue;
        }
        if (ret) {
            t->err = ret;
            break;
        }
        i++;
    }
    return NULL;
}

START_TEST(rq_two_posters)
{
    struct exs_prov_ep_attr attr = pt_default_attr();
    struct tp_poster t[2];
    pthread_t th[2];
    struct pt_buf *src;
    struct pt_pair p;
    struct exs_prov_cqe c;
    uint32_t next[2] = {0, 0}, sends_done = 0, sent = 0, got = 0;
    double deadline;

    attr.max_recv_wr = 16;
    attr.rnr_retry = 7; /* the sends wait for the posters */
    pt_pair_setup(&p, &attr, &attr);
    src = pt_pair_buf(&p, 'a', TP_LEN, 0, 'm');
    for (int k = 0; k < 2; k++) {
        t[k] = (struct tp_poster){p.eb, pt_pair_buf(&p, 'b', TP_N * TP_LEN, LW, 0),
                                  (uint64_t)(k + 1) << 20, 0};
        ck_assert_int_eq(pthread_create(&th[k], NULL, tp_post, &t[k]), 0);
    }
    deadline = pt_now_ms() + 4 * PT_TIMEOUT_MS;
    while ((got < 2 * TP_N || sends_done < 2 * TP_N) && pt_now_ms() < deadline) {
        /* a few sends in flight (the sender's queue), one per receive in all */
        while (sent < 2 * TP_N && sent - sends_done < 8) {
            ck_assert_int_eq(
                pt_post_send(p.ea, 5000 + sent, EXS_PROV_WR_SEND, SIG, src, 0, TP_LEN, 0, 0, 0), 0);
            sent++;
        }
        if (pt_try_cqe(&p.a, 1, &c)) {
            ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
            ck_assert_int_eq(c.wr_id, 5000 + sends_done);
            sends_done++;
        }
        if (pt_try_cqe(&p.b, 1, &c)) {
            int k = (int)(c.wr_id >> 20) - 1;
            uint32_t i = (uint32_t)(c.wr_id & 0xfffff);

            ck_assert_msg(k == 0 || k == 1, "b: stray completion %llu",
                          (unsigned long long)c.wr_id);
            ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
            ck_assert_int_eq(c.byte_len, TP_LEN);
            ck_assert_msg(i == next[k], "poster %d: receive %u completed, expected %u", k, i,
                          next[k]);
            ck_assert(pt_all_bytes(t[k].buf->p + (size_t)i * TP_LEN, TP_LEN, 'm'));
            next[k]++;
            got++;
        }
    }
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(pthread_join(th[k], NULL), 0);
        ck_assert_int_eq(t[k].err, 0);
    }
    ck_assert_msg(got == 2 * TP_N && sends_done == 2 * TP_N, "%u receives, %u sends of %u", got,
                  sends_done, 2 * TP_N);
    pt_expect_no_cqe(&p.b, 20);
    pt_pair_close(&p);
}
END_TEST

START_TEST(rq_destroy_own_sges)
{
    struct exs_prov_ep_attr attr = pt_default_attr();
    struct exs_prov_sge sge[8];
    struct pt_buf *dst;
    struct pt_pair p;
    int nsge;

    attr.max_recv_wr = 8;
    pt_pair_setup(&p, NULL, &attr);
    nsge = p.b.ctx->caps.max_sge >= 6 ? 6 : 1;
    dst = pt_pair_buf(&p, 'b', 8 * 96, LW, 0);
    for (uint32_t i = 0; i < attr.max_recv_wr; i++) {
        struct exs_prov_recv_wr wr = {.wr_id = i, .sg_list = sge, .num_sge = (i & 1) ? nsge : 1};

        for (int s = 0; s < wr.num_sge; s++) {
            sge[s].addr = pt_raddr(dst, (size_t)i * 96 + (size_t)s * 16);
            sge[s].length = s == wr.num_sge - 1 ? 96 - (uint32_t)s * 16 : 16;
            sge[s].lkey = dst->mr->lkey;
        }
        ck_assert_int_eq(pt_ops->post_recv(p.eb, &wr), 0);
    }
    /* destroyed with the receives in the queue (pt_pair_close: b's ep goes first) */
    pt_ops->ep_destroy(p.eb);
    p.eb = NULL;
    pt_pair_close(&p);
}
END_TEST

#define KF_BIG (32u << 20)

START_TEST(rq_destroy_mid_fragment)
{
    /* b's ep destroyed while its receive r1, of sges of its own (more than a slot's
     * block), holds a message in fragments and r2 waits in the ring: the connection's end
     * gives r1 back, the sweep frees both (ASan/LSan: no leak, no double free). a's NIC
     * held throughout: the SEND's later fragments wait for a's turn, so the message
     * cannot end; b's one turn is run by the test under b's nic_lock. */
    struct exs_prov_sge sge[6];
    struct exs_prov_recv_wr wr = {.wr_id = 1, .sg_list = sge, .num_sge = 6};
    struct pt_buf *src, *r1, *r2;
    struct shm_ep *ea, *eb;
    struct pt_pair p;
    double deadline;
    int mid;

    if (strcmp(pt_name, "shm") != 0) {
        test_skip("rq_destroy_mid_fragment", "shm provider itself only; provider is %s", pt_name);
        return;
    }
    ck_assert_int_eq(setenv("EXS_SHM_RING_KB", "64", 1), 0);
    exs__params_reset();
    pt_pair_setup(&p, NULL, NULL);
    unsetenv("EXS_SHM_RING_KB");
    exs__params_reset();
    if (p.b.ctx->caps.max_sge < 6) {
        pt_pair_close(&p);
        test_skip("rq_destroy_mid_fragment", "max_sge %u < 6", p.b.ctx->caps.max_sge);
        return;
    }
    ea = shm_ep_of(p.ea);
    eb = shm_ep_of(p.eb);
    src = pt_pair_buf(&p, 'a', KF_BIG, LW, 0);
    r1 = pt_pair_buf(&p, 'b', KF_BIG, LW, 0);
    r2 = pt_pair_buf(&p, 'b', 64, LW, 0);
    for (int s = 0; s < 6; s++) {
        sge[s].addr = pt_raddr(r1, (size_t)s * 16);
        sge[s].length = s == 5 ? KF_BIG - 5 * 16 : 16;
        sge[s].lkey = r1->mr->lkey;
    }
    nic_hold(eb->ctx);
    ck_assert_int_eq(pt_ops->post_recv(p.eb, &wr), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, r2, 0, 64), 0);
    nic_hold(ea->ctx);
    ck_assert_int_eq(pt_post_send(p.ea, 10, EXS_PROV_WR_SEND, SIG, src, 0, KF_BIG, 0, 0, 0), 0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (!__atomic_load_n(exs__shm_rx_stamp(eb->conn), __ATOMIC_ACQUIRE) &&
           pt_now_ms() < deadline)
        sched_yield();
    (void)exs__shm_conn_service(eb->conn);
    mid = eb->conn && eb->conn->frag_rwr != NULL;
    nic_drop(eb->ctx);
    if (!mid)
        nic_drop(ea->ctx);
    ck_assert_msg(mid, "r1 not in fragments after b's turn");
    pt_ops->ep_destroy(p.eb);
    p.eb = NULL;
    nic_drop(ea->ctx);
    pt_pair_close(&p);
}
END_TEST

/* The child: connect to the parent's address (read from rfd), SEND KF_BIG bytes once
 * established, then let its NIC thread push fragments until it is killed. */
static void kf_child(int rfd)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_attr attr = {0};
    struct exs_prov_send_wr wr = {0};
    struct exs_prov_sge sge;
    struct exs_prov_cm_event ev;
    struct sockaddr_storage ss;
    struct exs_prov_ctx *ctx;
    struct exs_prov_mr *mr;
    struct exs_prov_ep *ep;
    socklen_t len;
    uint8_t *buf;

    if (pt_read_addr(rfd, &ss, &len))
        _exit(2);
    buf = malloc(KF_BIG);
    if (!buf || pt_ops->ctx_open(&attr, &ctx) || pt_ops->ep_create(ctx, &at, &ep) ||
        pt_ops->mr_reg(ctx, buf, KF_BIG, LW, &mr))
        _exit(3);
    memset(buf, 0x5c, KF_BIG);
    if (pt_ops->connect(ep, (struct sockaddr *)&ss, len, NULL, 0))
        _exit(4);
    for (;;) {
        if (pt_ops->ctx_cm_poll(ctx, &ev) != 1)
            continue;
        if (ev.type != EXS_PROV_CM_ESTABLISHED)
            _exit(5);
        break;
    }
    sge = (struct exs_prov_sge){(uint64_t)(uintptr_t)buf, KF_BIG, mr->lkey};
    wr.wr_id = 1;
    wr.opcode = EXS_PROV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (pt_ops->post_send(ep, &wr))
        _exit(6);
    for (;;)
        pause();
}

START_TEST(killed_mid_fragment)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_listener *lis;
    struct exs_prov_cm_event ev;
    struct sockaddr_storage ss;
    struct exs_prov_cqe c;
    struct exs_prov_ep *ep;
    struct pt_buf *r[3];
    struct shm_ep *se;
    struct pt_host h;
    socklen_t len;
    int wfd, st, caught = 0, disc = 0;
    uint64_t next = 1;
    double deadline;
    pid_t pid;

    if (strcmp(pt_name, "shm") != 0) {
        test_skip("killed_mid_fragment", "shm provider itself only; provider is %s", pt_name);
        return;
    }
    ck_assert_int_eq(setenv("EXS_SHM_RING_KB", "64", 1), 0);
    exs__params_reset();
    pid = pt_fork_peer(kf_child, &wfd); /* before this process has threads of its own */
    pt_host_open(&h);
    unsetenv("EXS_SHM_RING_KB");
    exs__params_reset();
    lis = pt_listen(&h, &ss, &len);
    pt_tell_addr(wfd, &ss, len);
    pt_wait_cm(&h, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_int_eq(pt_ops->ep_create(h.ctx, &at, &ep), 0);
    ck_assert_int_eq(pt_ops->accept(ev.req, ep, NULL, 0), 0);
    pt_wait_cm(&h, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    se = shm_ep_of(ep);
    /* this side's NIC held (the child's SEND waits for a receive: RNR, rnr_retry 7), the
     * receives posted, the first fragments in the ring: one turn of the connection takes
     * r1 and what the ring holds (at most SHM_TURN_RECS fragments, far from 32 MiB) */
    nic_hold(se->ctx);
    for (int i = 0; i < 3; i++) {
        r[i] = pt_buf_new(&h, i ? 64 : KF_BIG, LW, 0);
        ck_assert_int_eq(pt_post_recv(ep, 1 + (uint64_t)i, r[i], 0, i ? 64 : KF_BIG), 0);
    }
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (se->conn && !__atomic_load_n(exs__shm_rx_stamp(se->conn), __ATOMIC_ACQUIRE) &&
           pt_now_ms() < deadline)
        sched_yield();
    ck_assert_ptr_nonnull(se->conn);
    (void)exs__shm_conn_service(se->conn);
    caught = se->conn && se->conn->frag_rwr != NULL;
    if (!caught)
        kill(pid, SIGKILL);
    ck_assert_msg(caught, "r1 not in fragments after a turn");
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    nic_drop(se->ctx);
    /* each receive flushed once, in posting order; then DISCONNECTED */
    while (next <= 3) {
        ck_assert_msg(pt_try_cqe(&h, PT_TIMEOUT_MS, &c), "receive %llu never completed",
                      (unsigned long long)next);
        ck_assert_msg(c.wr_id == next, "receive %llu completed, expected %llu",
                      (unsigned long long)c.wr_id, (unsigned long long)next);
        ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
        next++;
    }
    while (!disc) {
        ck_assert_msg(pt_try_cm(&h, PT_TIMEOUT_MS, &ev), "no DISCONNECTED");
        ck_assert_msg(ev.type == EXS_PROV_CM_ESTABLISHED || ev.type == EXS_PROV_CM_DISCONNECTED,
                      "cm event %d", (int)ev.type);
        disc = ev.type == EXS_PROV_CM_DISCONNECTED && ev.ep == ep;
    }
    pt_expect_no_cqe(&h, 20); /* none twice */
    close(wfd);
    pt_ops->ep_destroy(ep);
    pt_ops->listener_destroy(lis);
    for (int i = 0; i < 3; i++)
        pt_buf_free(r[i]);
    pt_host_close(&h);
}
END_TEST

Suite *prov_attack26b_suite(void)
{
    Suite *s = suite_create("prov_attack26b");
    TCase *tc = pt_tcase("rq_attack");

    tcase_add_test(tc, recv_dereg_before_take);
    tcase_add_test(tc, rq_two_posters);
    tcase_add_test(tc, rq_destroy_own_sges);
    tcase_add_test(tc, killed_mid_fragment);
    tcase_add_test(tc, rq_destroy_mid_fragment);
    suite_add_tcase(s, tc);
    return s;
}
