/* SPDX-License-Identifier: MIT */
/* Link emulation of the tcp provider: EXS_EMU_DELAY_US adds latency, EXS_EMU_RATE_MBPS caps
 * bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/params.h"
#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

static void emu_set(const char *var, const char *val)
{
    if (val)
        ck_assert_int_eq(setenv(var, val, 1), 0);
    else
        unsetenv(var);
    exs__params_reset();
}

static int emu_supported(const char *test)
{
    struct pt_host h;
    int ok;

    if (pt_skip_unless_tcp(test))
        return 0;
    pt_host_open(&h);
    ok = (h.ctx->caps.flags & EXS_PROV_CAP_EMU_LINK) != 0;
    pt_host_close(&h);
    ck_assert_msg(ok, "tcp provider does not announce EXS_PROV_CAP_EMU_LINK");
    return ok;
}

/* 5 SEND/RECV ping-pong round trips; returns the shortest and longest in ms. */
static void pingpong(double *min_ms, double *max_ms)
{
    struct pt_pair p;
    struct pt_buf *ba, *bb;

    pt_pair_setup(&p, NULL, NULL);
    ba = pt_pair_buf(&p, 'a', 64, LW, 1);
    bb = pt_pair_buf(&p, 'b', 64, LW, 2);
    *min_ms = 1e9;
    *max_ms = 0;
    for (int i = 0; i < 6; i++) {
        double t0, dt;

        ck_assert_int_eq(pt_post_recv(p.ea, 1, ba, 0, 64), 0);
        ck_assert_int_eq(pt_post_recv(p.eb, 2, bb, 0, 64), 0);
        t0 = pt_now_ms();
        ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, ba, 0, 64, 0, 0, 0), 0);
        pt_expect_wr(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_SEND, SIG, bb, 0, 64, 0, 0, 0), 0);
        pt_expect_wr(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        dt = pt_now_ms() - t0;
        pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        pt_expect_wr(&p.b, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        if (i == 0)
            continue; /* warm-up */
        if (dt < *min_ms)
            *min_ms = dt;
        if (dt > *max_ms)
            *max_ms = dt;
    }
    pt_pair_close(&p);
}

START_TEST(emu_delay_pingpong)
{
    double mn, mx;

    if (!emu_supported("emu_delay_pingpong"))
        return;
    emu_set("EXS_EMU_DELAY_US", "10000");
    pingpong(&mn, &mx);
    emu_set("EXS_EMU_DELAY_US", NULL);
    printf("emu_delay_pingpong: 10 ms one-way delay: round trips %.2f .. %.2f ms\n", mn, mx);
    ck_assert_msg(mn >= 20.0, "round trip %.2f ms with 10 ms one-way delay, expected >= 20", mn);
}
END_TEST

START_TEST(emu_no_delay_pingpong)
{
    double mn, mx;

    if (!emu_supported("emu_no_delay_pingpong"))
        return;
    emu_set("EXS_EMU_DELAY_US", NULL);
    emu_set("EXS_EMU_RATE_MBPS", NULL);
    pingpong(&mn, &mx);
    printf("emu_no_delay_pingpong: round trips %.3f .. %.3f ms\n", mn, mx);
    /* the fastest round trip: a load spike may stretch any single one (timed assertions
     * on the slowest fail on a busy machine), while an emulated delay would stretch all */
    ck_assert_msg(mn < 10.0, "fastest round trip %.2f ms without emulated delay, expected < 10",
                  mn);
}
END_TEST

START_TEST(emu_rate_cap)
{
    const uint32_t len = 2u << 20;
    struct pt_pair p;
    struct pt_buf *src, *tgt;
    double t0, dt;

    if (!emu_supported("emu_rate_cap"))
        return;
    emu_set("EXS_EMU_RATE_MBPS", "100");
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', len, LW, 0);
    tgt = pt_pair_buf(&p, 'b', len, LW | RW, 0);
    pt_pattern(src->p, len, 5);
    t0 = pt_now_ms();
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, len, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey),
                     0);
    pt_expect_cqe_t(&p.a, 20000, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    dt = pt_now_ms() - t0;
    ck_assert_int_eq(pt_pattern_check(tgt->p, len, 5), -1);
    pt_pair_close(&p);
    emu_set("EXS_EMU_RATE_MBPS", NULL);
    printf("emu_rate_cap: 2 MiB RDMA_WRITE at 100 Mbit/s took %.1f ms\n", dt);
    /* 2 MiB = 16.8 Mbit: 168 ms at 100 Mbit/s */
    ck_assert_msg(dt >= 150.0, "2 MiB at 100 Mbit/s took %.1f ms, expected >= 150", dt);
}
END_TEST

/*
 * Read-ahead and back-pressure (spec/provider-tcp.md, "Implementation"): 16 READ requests
 * reach b in one burst, so b's first read takes them all into its staging buffer. With
 * EXS_TCP_CTRL_MAX=1 and an emulated delay holding each response, b stops reading after
 * every request; when the response leaves, the requests still staged are no longer in
 * the socket, so nothing but the ctx's rx_again list brings b back to them. Every READ
 * must complete, in order, with its data.
 */
START_TEST(emu_staged_reads_backpressure)
{
    struct pt_pair p;
    struct pt_buf *rem, *dst;

    if (!emu_supported("emu_staged_reads_backpressure"))
        return;
    emu_set("EXS_TCP_CTRL_MAX", "1");
    emu_set("EXS_EMU_DELAY_US", "2000");
    pt_pair_setup(&p, NULL, NULL);
    rem = pt_pair_buf(&p, 'b', 16 * 512, RR, 0);
    dst = pt_pair_buf(&p, 'a', 16 * 512, LW, 0);
    pt_pattern(rem->p, rem->len, 21);
    for (uint32_t i = 0; i < 16; i++)
        ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_RDMA_READ, SIG, dst, 512 * i, 512, 0,
                                      pt_raddr(rem, 512 * i), rem->mr->rkey),
                         0);
    for (uint32_t i = 0; i < 16; i++)
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, NULL);
    ck_assert_msg(memcmp(dst->p, rem->p, 16 * 512) == 0, "READ data wrong");
    pt_pair_close(&p);
    emu_set("EXS_EMU_DELAY_US", NULL);
    emu_set("EXS_TCP_CTRL_MAX", NULL);
}
END_TEST

Suite *prov_emu_suite(void)
{
    Suite *s = suite_create("prov_emu");
    TCase *tc = pt_tcase("emu");

    tcase_add_test(tc, emu_delay_pingpong);
    tcase_add_test(tc, emu_no_delay_pingpong);
    tcase_add_test(tc, emu_rate_cap);
    tcase_add_test(tc, emu_staged_reads_backpressure);
    suite_add_tcase(s, tc);
    return s;
}
