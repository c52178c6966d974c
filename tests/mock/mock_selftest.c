/* SPDX-License-Identifier: MIT */
/* Unit tests of the mock provider itself: the prov.h contract it promises the protocol tests. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>

#include "tests/mock/mock_prov.h"
#include "tests/unit/unit.h"

static struct exs_prov_ctx *ca, *cb;
static struct exs_prov_listener *lis;
static struct exs_prov_ep *ea, *eb; /* connected pair: ea active (ctx ca), eb passive (cb) */
static struct exs_prov_mr *ma, *mb;
static uint8_t bufa[4096], bufb[4096];

static int poll_one(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe)
{
    return exs__prov_poll(ctx, cqe, 1);
}

static void expect_cm(struct exs_prov_ctx *ctx, enum exs_prov_cm_event_type type,
                      struct exs_prov_cm_event *ev)
{
    ck_assert_int_eq(exs__prov_cm_poll(ctx, ev), 1);
    ck_assert_int_eq(ev->type, type);
}

static struct exs_prov_ep *mk_ep(struct exs_prov_ctx *ctx, uint32_t s, uint32_t r)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = s, .max_recv_wr = r, .max_inline = 64};
    struct exs_prov_ep *ep;

    ck_assert_int_eq(exs__prov_ep_create(ctx, &attr, &ep), 0);
    return ep;
}

static void ms_setup(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    struct sockaddr_storage ss;
    struct exs_prov_cm_event ev;
    socklen_t len;
    static const char pd[] = "hello", apd[] = "welcome";

    unit_env_clean();
    mock_set_reorder(0);
    ck_assert_int_eq(mock_ctx_open(NULL, &ca), 0);
    ck_assert_int_eq(mock_ctx_open(NULL, &cb), 0);
    ck_assert_int_eq(exs__prov_listen(cb, (struct sockaddr *)&sin, sizeof(sin), 4, NULL, &lis), 0);
    ck_assert_int_eq(exs__prov_listener_addr(lis, &ss, &len), 0);
    ea = mk_ep(ca, 16, 16);
    eb = mk_ep(cb, 16, 16);
    ck_assert_int_eq(
        exs__prov_post_send(ea, &(struct exs_prov_send_wr){.opcode = EXS_PROV_WR_SEND}), -ENOTCONN);
    ck_assert_int_eq(exs__prov_connect(ea, (struct sockaddr *)&ss, len, pd, sizeof(pd)), 0);
    expect_cm(cb, EXS_PROV_CM_CONNECT_REQUEST, &ev);
    ck_assert_uint_eq(ev.private_data_len, sizeof(pd));
    ck_assert_mem_eq(ev.private_data, pd, sizeof(pd));
    ck_assert_int_eq(exs__prov_accept(ev.req, eb, apd, sizeof(apd)), 0);
    expect_cm(ca, EXS_PROV_CM_ESTABLISHED, &ev);
    ck_assert_ptr_eq(ev.ep, ea);
    ck_assert_mem_eq(ev.private_data, apd, sizeof(apd));
    expect_cm(cb, EXS_PROV_CM_ESTABLISHED, &ev);
    ck_assert_ptr_eq(ev.ep, eb);
    ck_assert_int_eq(exs__prov_mr_reg(ca, bufa, sizeof(bufa), EXS_PROV_ACCESS_LOCAL_WRITE, &ma), 0);
    ck_assert_int_eq(exs__prov_mr_reg(cb, bufb, sizeof(bufb), EXS_PROV_ACCESS_LOCAL_WRITE, &mb), 0);
    memset(bufa, 0, sizeof(bufa));
    memset(bufb, 0, sizeof(bufb));
}

static void ms_teardown(void)
{
    if (ea)
        exs__prov_ep_destroy(ea);
    if (eb)
        exs__prov_ep_destroy(eb);
    ea = eb = NULL;
    exs__prov_mr_dereg(ma);
    exs__prov_mr_dereg(mb);
    exs__prov_listener_destroy(lis);
    exs__prov_ctx_close(ca);
    exs__prov_ctx_close(cb);
    ck_assert_uint_eq(mock_violations(), 0);
}

static int post_write(struct exs_prov_ep *ep, uint64_t id, int op, void *src, uint32_t len,
                      uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    struct exs_prov_sge sge = {(uintptr_t)src, len, lkey};
    struct exs_prov_send_wr wr = {.wr_id = id,
                                  .opcode = op,
                                  .flags = EXS_PROV_SEND_SIGNALED,
                                  .sg_list = &sge,
                                  .num_sge = 1,
                                  .remote_addr = raddr,
                                  .rkey = rkey,
                                  .imm_data = 0x1234};
    return exs__prov_post_send(ep, &wr);
}

static void post_recv(struct exs_prov_ep *ep, uint64_t id, void *buf, uint32_t len, uint32_t lkey)
{
    struct exs_prov_sge sge = {(uintptr_t)buf, len, lkey};
    struct exs_prov_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1};

    ck_assert_int_eq(exs__prov_post_recv(ep, &wr), 0);
}

/* A grant: its own ep's peer, its right, its range; gone after revoke. */
START_TEST(ms_grant_exact)
{
    struct exs_prov_grant *g;
    struct exs_prov_cqe c;
    struct mock_stats st;

    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb + 100, 200, EXS_PROV_ACCESS_REMOTE_WRITE, &g), 0);
    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb, 10,
                                     EXS_PROV_ACCESS_REMOTE_WRITE | EXS_PROV_ACCESS_REMOTE_READ,
                                     &g),
                     -EINVAL);
    memset(bufa, 0x5a, sizeof(bufa));
    /* inside: lands */
    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_RDMA_WRITE, bufa, 200, ma->lkey,
                                (uintptr_t)bufb + 100, g->rkey),
                     0);
    ck_assert_int_eq(mock_run_until_idle(100), 1);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    ck_assert_uint_eq(bufb[99], 0);
    ck_assert_uint_eq(bufb[100], 0x5a);
    ck_assert_uint_eq(bufb[299], 0x5a);
    ck_assert_uint_eq(bufb[300], 0);
    /* the other right: refused */
    ck_assert_int_eq(post_write(ea, 2, EXS_PROV_WR_RDMA_READ, bufa, 10, ma->lkey,
                                (uintptr_t)bufb + 100, g->rkey),
                     0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_ACCESS_ERR);
    mock_stats(ca, &st);
    ck_assert_uint_eq(st.rem_access_err, 1);
    exs__prov_revoke(g);
    exs__prov_ep_destroy(ea);
    exs__prov_ep_destroy(eb);
    ea = eb = NULL;
}
END_TEST

/* One byte past the range, and after revoke: nothing written. */
START_TEST(ms_grant_range_and_revoke)
{
    struct exs_prov_grant *g;
    struct exs_prov_cqe c;

    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb + 100, 200, EXS_PROV_ACCESS_REMOTE_WRITE, &g), 0);
    memset(bufa, 0x5a, sizeof(bufa));
    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_RDMA_WRITE, bufa, 201, ma->lkey,
                                (uintptr_t)bufb + 100, g->rkey),
                     0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert_uint_eq(bufb[100], 0);
    exs__prov_revoke(g);
    exs__prov_ep_destroy(ea);
    exs__prov_ep_destroy(eb);
    ea = eb = NULL;
}
END_TEST

START_TEST(ms_grant_revoked)
{
    struct exs_prov_grant *g;
    struct exs_prov_cqe c;
    uint32_t key;

    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb, 64, EXS_PROV_ACCESS_REMOTE_WRITE, &g), 0);
    key = g->rkey;
    exs__prov_revoke(g);
    memset(bufa, 0x5a, sizeof(bufa));
    ck_assert_int_eq(
        post_write(ea, 1, EXS_PROV_WR_RDMA_WRITE, bufa, 8, ma->lkey, (uintptr_t)bufb, key), 0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert_uint_eq(bufb[0], 0);
}
END_TEST

/* A grant of one connection is refused on another connection of the same ctx. */
START_TEST(ms_grant_other_connection)
{
    struct exs_prov_grant *g;
    struct exs_prov_ep *ea2, *eb2;
    struct exs_prov_cm_event ev;
    struct sockaddr_storage ss;
    struct exs_prov_cqe c;
    socklen_t len;

    ck_assert_int_eq(exs__prov_listener_addr(lis, &ss, &len), 0);
    ea2 = mk_ep(ca, 4, 4);
    eb2 = mk_ep(cb, 4, 4);
    ck_assert_int_eq(exs__prov_connect(ea2, (struct sockaddr *)&ss, len, NULL, 0), 0);
    expect_cm(cb, EXS_PROV_CM_CONNECT_REQUEST, &ev);
    ck_assert_int_eq(exs__prov_accept(ev.req, eb2, NULL, 0), 0);
    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb, 64, EXS_PROV_ACCESS_REMOTE_WRITE, &g), 0);
    ck_assert_int_eq(
        post_write(ea2, 1, EXS_PROV_WR_RDMA_WRITE, bufa, 8, ma->lkey, (uintptr_t)bufb, g->rkey), 0);
    mock_run_until_idle(100);
    while (poll_one(ca, &c) == 1 && c.ep != ea2)
        ;
    ck_assert_ptr_eq(c.ep, ea2);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_ACCESS_ERR);
    exs__prov_revoke(g);
    exs__prov_ep_destroy(ea2);
    exs__prov_ep_destroy(eb2);
}
END_TEST

/* mem_alloc memory is never reachable by its rkey. */
START_TEST(ms_mem_alloc_local_only)
{
    struct exs_prov_mr *m;
    struct exs_prov_cqe c;

    ck_assert_int_eq(exs__prov_mem_alloc(cb, 100, &m), 0);
    ck_assert_int_eq(
        post_write(ea, 1, EXS_PROV_WR_RDMA_WRITE, bufa, 8, ma->lkey, (uintptr_t)m->addr, m->rkey),
        0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_ACCESS_ERR);
    exs__prov_mem_free(m);
}
END_TEST

/* SEND without a receive: counted as RNR, fails, the rest is flushed. */
START_TEST(ms_rnr_counted)
{
    struct exs_prov_cqe c;
    struct mock_stats st;

    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_SEND, bufa, 8, ma->lkey, 0, 0), 0);
    ck_assert_int_eq(post_write(ea, 2, EXS_PROV_WR_SEND, bufa, 8, ma->lkey, 0, 0), 0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_RNR_RETRY_EXC_ERR);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_uint_eq(c.wr_id, 2);
    ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
    ck_assert_int_eq(exs__prov_ep_state(ea), EXS_PROV_EP_ERROR);
    mock_stats(ca, &st);
    ck_assert_uint_eq(st.rnr, 1);
}
END_TEST

/* SEND longer than the receive: LOC_LEN_ERR there, REM_INV_REQ_ERR here. A bad lkey:
 * LOC_PROT_ERR. WRITE_WITH_IMM: receive completion with imm, its buffer untouched. */
START_TEST(ms_send_checks)
{
    struct exs_prov_cqe c;

    post_recv(eb, 7, bufb, 4, mb->lkey);
    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_SEND, bufa, 8, ma->lkey, 0, 0), 0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(cb, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_LOC_LEN_ERR);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_REM_INV_REQ_ERR);
}
END_TEST

START_TEST(ms_loc_prot)
{
    struct exs_prov_cqe c;

    post_recv(eb, 7, bufb, 64, mb->lkey);
    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_SEND, bufa + 4090, 8, ma->lkey, 0, 0), 0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_LOC_PROT_ERR);
}
END_TEST

START_TEST(ms_write_imm)
{
    struct exs_prov_grant *g;
    struct exs_prov_cqe c;
    uint8_t rbuf[16] = {0};
    struct exs_prov_mr *rm;

    ck_assert_int_eq(exs__prov_mr_reg(cb, rbuf, sizeof(rbuf), EXS_PROV_ACCESS_LOCAL_WRITE, &rm), 0);
    post_recv(eb, 7, rbuf, sizeof(rbuf), rm->lkey);
    ck_assert_int_eq(exs__prov_grant(eb, mb, bufb, 64, EXS_PROV_ACCESS_REMOTE_WRITE, &g), 0);
    memset(bufa, 0x33, 32);
    ck_assert_int_eq(post_write(ea, 1, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, bufa, 32, ma->lkey,
                                (uintptr_t)bufb, g->rkey),
                     0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll_one(cb, &c), 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(c.opcode, EXS_PROV_WC_RECV_RDMA_WITH_IMM);
    ck_assert_uint_eq(c.byte_len, 32);
    ck_assert_uint_eq(c.imm_data, 0x1234);
    ck_assert_uint_eq(c.flags & EXS_PROV_WC_WITH_IMM, EXS_PROV_WC_WITH_IMM);
    ck_assert_uint_eq(bufb[31], 0x33);
    ck_assert_uint_eq(rbuf[0], 0);
    ck_assert_int_eq(poll_one(ca, &c), 1);
    ck_assert_int_eq(c.opcode, EXS_PROV_WC_RDMA_WRITE);
    exs__prov_revoke(g);
    exs__prov_mr_dereg(rm);
}
END_TEST

/* exs__prov_progress_poll on a provider without ctx_progress_poll (the mock, as tcp and
 * verbs): ctx_progress then ctx_poll, the same completions in the same order, at most
 * max per call, n 0 when none; with the op, only the op is called (a copy of the mock's
 * table with a counting ctx_progress_poll: without the wrapper's look at the op, the
 * engine's rounds would never hand shm's turn completions over). */
static int pp_calls;
static int pp_counting(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe, int max, int *n_p)
{
    (void)ctx;
    (void)cqe;
    (void)max;
    pp_calls++;
    *n_p = 0;
    return 7;
}

START_TEST(ms_progress_poll_fallback)
{
    struct exs_prov_ops filled = mock_prov_ops, ops;
    const struct exs_prov_ops *saved = cb->ops;
    struct exs_prov_cqe c[2];
    int n = -1;

    exs__prov_fill_defaults(&filled); /* as a provider opened through prov.c */
    ops = filled;
    cb->ops = &filled;

    for (int i = 0; i < 3; i++)
        post_recv(eb, 10 + (uint64_t)i, bufb + 64 * i, 64, mb->lkey);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(
            post_write(ea, 20 + (uint64_t)i, EXS_PROV_WR_SEND, bufa, 16, ma->lkey, 0, 0), 0);
    mock_run_until_idle(100);
    ck_assert_int_ge(exs__prov_progress_poll(cb, c, 2, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(c[0].wr_id, 10);
    ck_assert_uint_eq(c[1].wr_id, 11);
    ck_assert_int_ge(exs__prov_progress_poll(cb, c, 2, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_uint_eq(c[0].wr_id, 12);
    ck_assert_uint_eq(c[0].byte_len, 16);
    ck_assert_int_ge(exs__prov_progress_poll(cb, c, 2, &n), 0);
    ck_assert_int_eq(n, 0);
    ops.ctx_progress_poll = pp_counting;
    cb->ops = &ops;
    ck_assert_int_eq(exs__prov_progress_poll(cb, c, 2, &n), 7);
    cb->ops = saved;
    ck_assert_int_eq(pp_calls, 1);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(poll_one(ca, c), 1);
}
END_TEST

/* disconnect: both sides flushed and told; ep_destroy drops queued completions. */
START_TEST(ms_disconnect_flush)
{
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe c;

    post_recv(eb, 7, bufb, 64, mb->lkey);
    post_recv(ea, 8, bufa, 64, ma->lkey);
    ck_assert_int_eq(exs__prov_disconnect(ea), 0);
    expect_cm(ca, EXS_PROV_CM_DISCONNECTED, &ev);
    ck_assert_int_eq(ev.status, 0);
    expect_cm(cb, EXS_PROV_CM_DISCONNECTED, &ev);
    ck_assert_int_eq(poll_one(cb, &c), 1);
    ck_assert_uint_eq(c.wr_id, 7);
    ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
    /* a's flushed receive is dropped with its ep */
    exs__prov_ep_destroy(ea);
    ea = NULL;
    ck_assert_int_eq(poll_one(ca, &c), 0);
}
END_TEST

START_TEST(ms_drop_reset)
{
    struct exs_prov_cm_event ev;

    mock_drop(eb);
    expect_cm(ca, EXS_PROV_CM_DISCONNECTED, &ev);
    ck_assert_int_eq(ev.status, -ECONNRESET);
    expect_cm(cb, EXS_PROV_CM_DISCONNECTED, &ev);
    ck_assert_int_eq(ev.status, -ECONNRESET);
}
END_TEST

/* Capacity: the completion queue refuses an ep it cannot serve; the send queue its
 * depth; arm reports queued entries and the descriptor wakes up. */
START_TEST(ms_capacity)
{
    struct exs_prov_attr attr = {.cq_size = 64};
    struct exs_prov_ctx *c;
    struct exs_prov_ep *e1, *e2;
    struct exs_prov_ep_attr ea_ = {.max_send_wr = 16, .max_recv_wr = 16};
    struct exs_prov_cqe cqe;

    ck_assert_int_eq(mock_ctx_open(&attr, &c), 0);
    ck_assert_int_eq(exs__prov_ep_create(c, &ea_, &e1), 0);
    ea_.max_send_wr = 17;
    ck_assert_int_eq(exs__prov_ep_create(c, &ea_, &e2), -ENOBUFS);
    ea_.max_send_wr = 16;
    ck_assert_int_eq(exs__prov_ep_create(c, &ea_, &e2), 0);
    exs__prov_ep_destroy(e1);
    exs__prov_ep_destroy(e2);
    exs__prov_ctx_close(c);

    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(
            post_write(ea, (uint64_t)i, EXS_PROV_WR_RDMA_WRITE, bufa, 0, ma->lkey, 0, 0), 0);
    ck_assert_int_eq(post_write(ea, 99, EXS_PROV_WR_RDMA_WRITE, bufa, 0, ma->lkey, 0, 0), -ENOMEM);
    ck_assert_int_eq(exs__prov_arm(ca), 0);
    struct pollfd pfd = {.fd = exs__prov_ctx_event_fd(ca), .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    mock_run_until_idle(100);
    ck_assert_int_eq(poll(&pfd, 1, 0), 1);
    ck_assert_int_eq(exs__prov_arm(ca), -EAGAIN);
    for (int i = 0; i < 16; i++) {
        ck_assert_int_eq(poll_one(ca, &cqe), 1);
        ck_assert_uint_eq(cqe.wr_id, (uint64_t)i); /* posting order */
    }
    ck_assert_int_eq(post_write(ea, 99, EXS_PROV_WR_RDMA_WRITE, bufa, 0, ma->lkey, 0, 0), 0);
}
END_TEST

/* What a context runs on (exsctl stat's device): the provider's name until a device is
 * recorded, then "<device>:<port>"; a name too long for the field is refused, not cut. */
START_TEST(ms_device_name)
{
    struct exs_prov_ctx *c;
    char name[EXS_PROV_DEVICE_MAX];

    ck_assert_int_eq(mock_ctx_open(NULL, &c), 0);
    ck_assert_str_eq(exs__prov_device(c), "mock");
    ck_assert_int_eq(exs__prov_set_device(c, "mlx5_0", 1), 0);
    ck_assert_str_eq(exs__prov_device(c), "mlx5_0:1");
    ck_assert_int_eq(exs__prov_set_device(c, "rxe0", 255), 0);
    ck_assert_str_eq(exs__prov_device(c), "rxe0:255");
    /* "<name>:1" of exactly EXS_PROV_DEVICE_MAX - 1 bytes fits; one byte more does not */
    memset(name, 'd', sizeof(name));
    name[EXS_PROV_DEVICE_MAX - 3] = 0;
    ck_assert_int_eq(exs__prov_set_device(c, name, 1), 0);
    ck_assert_uint_eq(strlen(exs__prov_device(c)), EXS_PROV_DEVICE_MAX - 1);
    name[EXS_PROV_DEVICE_MAX - 3] = 'd';
    name[EXS_PROV_DEVICE_MAX - 2] = 0;
    ck_assert_int_eq(exs__prov_set_device(c, name, 1), -ENAMETOOLONG);
    ck_assert_str_eq(exs__prov_device(c), "mock");
    exs__prov_ctx_close(c);
}
END_TEST

Suite *mock_prov_suite(void)
{
    Suite *s = suite_create("mock_prov");
    TCase *tc = tcase_create("contract");

    tcase_add_checked_fixture(tc, ms_setup, ms_teardown);
    tcase_add_test(tc, ms_grant_exact);
    tcase_add_test(tc, ms_device_name);
    tcase_add_test(tc, ms_grant_range_and_revoke);
    tcase_add_test(tc, ms_grant_revoked);
    tcase_add_test(tc, ms_grant_other_connection);
    tcase_add_test(tc, ms_mem_alloc_local_only);
    tcase_add_test(tc, ms_rnr_counted);
    tcase_add_test(tc, ms_send_checks);
    tcase_add_test(tc, ms_loc_prot);
    tcase_add_test(tc, ms_write_imm);
    tcase_add_test(tc, ms_progress_poll_fallback);
    tcase_add_test(tc, ms_disconnect_flush);
    tcase_add_test(tc, ms_drop_reset);
    tcase_add_test(tc, ms_capacity);
    suite_add_tcase(s, tc);
    return s;
}
