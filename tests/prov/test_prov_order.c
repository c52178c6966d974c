/* SPDX-License-Identifier: MIT */
/* Ordering, unsignaled completions and inline sends of the provider under test. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

#define MSG 64

START_TEST(order_many_sends)
{
    const uint32_t total = 3000;
    struct pt_pair p;
    struct pt_buf *src, *dst;
    uint32_t sdepth, rdepth, sent = 0, send_done = 0, recv_posted = 0, recvd = 0;
    double deadline;

    pt_pair_setup(&p, NULL, NULL);
    sdepth = p.ea->attr.max_send_wr;
    rdepth = p.eb->attr.max_recv_wr;
    src = pt_pair_buf(&p, 'a', (size_t)sdepth * MSG, LW, 0);
    dst = pt_pair_buf(&p, 'b', (size_t)rdepth * MSG, LW, 0);
    for (; recv_posted < rdepth; recv_posted++)
        ck_assert_int_eq(pt_post_recv(p.eb, recv_posted, dst, (recv_posted % rdepth) * MSG, MSG),
                         0);
    deadline = pt_now_ms() + 25000;
    while (recvd < total || send_done < total) {
        struct exs_prov_cqe c;
        int progress = 0;

        ck_assert_msg(pt_now_ms() < deadline, "stalled: sent %u, send done %u, received %u", sent,
                      send_done, recvd);
        /* a receive is always available for every posted SEND: no RNR */
        while (sent < total && sent - send_done < sdepth && sent < recv_posted) {
            uint8_t *slot = src->p + (size_t)(sent % sdepth) * MSG;

            memcpy(slot, &sent, 4);
            pt_pattern(slot + 4, MSG - 4, sent);
            ck_assert_int_eq(pt_post_send(p.ea, 1000000u + sent, EXS_PROV_WR_SEND, SIG, src,
                                          (size_t)(sent % sdepth) * MSG, MSG, 0, 0, 0),
                             0);
            sent++;
            progress = 1;
        }
        while (pt_try_cqe(&p.a, 0, &c)) {
            ck_assert_msg(c.wr_id == 1000000u + send_done && c.status == EXS_PROV_WC_SUCCESS &&
                              c.opcode == EXS_PROV_WC_SEND,
                          "send completion %u: wr_id %llu status %s opcode %s", send_done,
                          (unsigned long long)c.wr_id, exs__prov_wc_status_str(c.status),
                          exs__prov_wc_opcode_str(c.opcode));
            send_done++;
            progress = 1;
        }
        while (pt_try_cqe(&p.b, 0, &c)) {
            const uint8_t *slot = dst->p + (size_t)(recvd % rdepth) * MSG;
            uint32_t seq;

            ck_assert_msg(c.wr_id == recvd && c.status == EXS_PROV_WC_SUCCESS &&
                              c.opcode == EXS_PROV_WC_RECV && c.byte_len == MSG,
                          "receive completion %u: wr_id %llu status %s opcode %s len %u", recvd,
                          (unsigned long long)c.wr_id, exs__prov_wc_status_str(c.status),
                          exs__prov_wc_opcode_str(c.opcode), c.byte_len);
            memcpy(&seq, slot, 4);
            ck_assert_msg(seq == recvd, "message %u carries sequence %u", recvd, seq);
            ck_assert_msg(pt_pattern_check(slot + 4, MSG - 4, seq) == -1,
                          "message %u payload corrupt", recvd);
            recvd++;
            ck_assert_int_eq(
                pt_post_recv(p.eb, recv_posted, dst, (recv_posted % rdepth) * MSG, MSG), 0);
            recv_posted++;
            progress = 1;
        }
        if (!progress) {
            if (pt_try_cqe(&p.b, 20, &c)) {
                /* put it back in front: re-stash by handling on the next loop */
                p.b.cqe_head = (p.b.cqe_head + PT_CQE_STASH - 1) % PT_CQE_STASH;
                p.b.cqe[p.b.cqe_head] = c;
                p.b.cqe_count++;
            }
        }
    }
    pt_expect_no_cqe(&p.a, 20);
    pt_pair_close(&p);
}
END_TEST

START_TEST(order_write_then_send)
{
    const uint32_t wlen = 65536;
    struct pt_pair p;
    struct pt_buf *src, *msg, *tgt, *rbuf;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', wlen, LW, 0);
    msg = pt_pair_buf(&p, 'a', 8, LW, 0);
    tgt = pt_pair_buf(&p, 'b', wlen, LW | RW, 0);
    rbuf = pt_pair_buf(&p, 'b', 8, LW, 0);
    for (uint32_t i = 0; i < 20; i++) {
        struct exs_prov_cqe c;
        long bad;

        pt_pattern(src->p, wlen, 500 + i);
        ck_assert_int_eq(pt_post_recv(p.eb, i, rbuf, 0, 8), 0);
        /* unsignaled WRITE, then a signaled SEND */
        ck_assert_int_eq(pt_post_send(p.ea, 100 + i, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, wlen, 0,
                                      pt_raddr(tgt, 0), tgt->mr->rkey),
                         0);
        ck_assert_int_eq(pt_post_send(p.ea, 200 + i, EXS_PROV_WR_SEND, SIG, msg, 0, 8, 0, 0, 0), 0);
        pt_expect_cqe(&p.b, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        bad = pt_pattern_check(tgt->p, wlen, 500 + i);
        ck_assert_msg(bad == -1,
                      "round %u: written data not visible at offset %ld when the "
                      "following SEND's receive completed",
                      i, bad);
        pt_expect_cqe(&p.a, 200 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    pt_expect_no_cqe(&p.a, 20);
    pt_pair_close(&p);
}
END_TEST

/* Frames whose headers arrive in the same read as the previous frame's payload must be
 * acted on even when that read ends a receive pass (tcp: its per-pass byte budget): a
 * zero-length SEND behind a large WRITE completes. Pairs of 256 KiB make pass budgets
 * end exactly after a SEND header. */
START_TEST(order_header_after_payload)
{
    const uint32_t wlen = 262144 - 64;
    struct pt_pair p;
    struct pt_buf *src, *tgt, *rbuf;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', wlen, LW, 1);
    tgt = pt_pair_buf(&p, 'b', wlen, LW | RW, 0);
    rbuf = pt_pair_buf(&p, 'b', 8, LW, 0);
    for (uint32_t round = 0; round < 12; round++) {
        for (uint32_t i = 0; i < 4; i++)
            ck_assert_int_eq(pt_post_recv(p.eb, i, rbuf, 0, 8), 0);
        for (uint32_t i = 0; i < 4; i++) {
            ck_assert_int_eq(pt_post_send(p.ea, 100 + i, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, wlen, 0,
                                          pt_raddr(tgt, 0), tgt->mr->rkey),
                             0);
            ck_assert_int_eq(pt_post_send(p.ea, 200 + i, EXS_PROV_WR_SEND, SIG, src, 0, 0, 0, 0, 0),
                             0);
        }
        for (uint32_t i = 0; i < 4; i++)
            pt_expect_cqe(&p.b, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        for (uint32_t i = 0; i < 4; i++)
            pt_expect_cqe(&p.a, 200 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    pt_pair_close(&p);
}
END_TEST

START_TEST(order_mixed_signaled)
{
    const uint32_t n = 60;
    struct pt_pair p;
    struct pt_buf *src, *tgt, *rbuf;
    uint32_t nsend = 0;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0x31);
    tgt = pt_pair_buf(&p, 'b', 64 * n, LW | RW, 0);
    rbuf = pt_pair_buf(&p, 'b', 64 * n, LW, 0);
    for (uint32_t i = 0; i < n; i += 2)
        ck_assert_int_eq(pt_post_recv(p.eb, 5000 + i, rbuf, 64 * i, 64), 0);
    for (uint32_t i = 0; i < n; i++) {
        unsigned flags = (i % 3 == 0 || i == n - 1) ? SIG : 0;
        enum exs_prov_wr_opcode op = (i % 2 == 0) ? EXS_PROV_WR_SEND : EXS_PROV_WR_RDMA_WRITE;

        ck_assert_int_eq(
            pt_post_send(p.ea, i, op, flags, src, 0, 64, 0, pt_raddr(tgt, 64 * i), tgt->mr->rkey),
            0);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!(i % 3 == 0 || i == n - 1))
            continue;
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS,
                      i % 2 == 0 ? EXS_PROV_WC_SEND : EXS_PROV_WC_RDMA_WRITE, NULL);
    }
    for (uint32_t i = 0; i < n; i += 2) {
        pt_expect_cqe(&p.b, 5000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
        nsend++;
    }
    ck_assert_uint_eq(nsend, n / 2);
    for (uint32_t i = 1; i < n; i += 2)
        ck_assert(pt_all_bytes(tgt->p + 64 * i, 64, 0x31));
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    pt_pair_close(&p);
}
END_TEST

START_TEST(unsignaled_no_cqe)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0x21);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, 0, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    ck_assert(pt_all_bytes(dst->p, 64, 0x21));
    pt_expect_no_cqe(&p.a, 200);
    pt_pair_close(&p);
}
END_TEST

START_TEST(unsignaled_fill_send_queue)
{
    /* N unsignaled WRs occupy the whole send queue until a signaled one completes. */
    struct pt_pair p;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *src, *tgt;
    uint32_t n;

    at.max_send_wr = 16;
    pt_pair_setup(&p, &at, NULL);
    n = p.ea->attr.max_send_wr;
    ck_assert_uint_ge(n, 16);
    src = pt_pair_buf(&p, 'a', 8, LW, 0x11);
    tgt = pt_pair_buf(&p, 'b', 8, LW | RW, 0);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(pt_post_send(p.ea, i, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, 8, 0,
                                   pt_raddr(tgt, 0), tgt->mr->rkey) == 0,
                      "unsignaled WR %u of %u refused", i, n);
    pt_expect_no_cqe(&p.a, 100);
    ck_assert_int_eq(pt_post_send(p.ea, n, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, 8, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey),
                     -ENOMEM);
    ck_assert_int_eq(pt_post_send(p.ea, n, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 8, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey),
                     -ENOMEM);
    /* the unsignaled writes land (on a loaded machine, maybe after the 100 ms above) */
    for (double deadline = pt_now_ms() + PT_TIMEOUT_MS;
         !pt_all_bytes(tgt->p, 8, 0x11) && pt_now_ms() < deadline;) {
        pt_drive_all();
        pt_sleep_ms(1);
    }
    ck_assert(pt_all_bytes(tgt->p, 8, 0x11));
    pt_pair_close(&p);
}
END_TEST

START_TEST(unsignaled_retired_by_signaled)
{
    struct pt_pair p;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *src, *tgt;
    uint32_t n;

    at.max_send_wr = 16;
    pt_pair_setup(&p, &at, NULL);
    n = p.ea->attr.max_send_wr;
    src = pt_pair_buf(&p, 'a', 8, LW, 0x11);
    tgt = pt_pair_buf(&p, 'b', 8, LW | RW, 0);
    for (int round = 0; round < 3; round++) {
        for (uint32_t i = 0; i < n; i++) {
            unsigned flags = i == n - 1 ? SIG : 0;

            ck_assert_msg(pt_post_send(p.ea, 1000 * round + i, EXS_PROV_WR_RDMA_WRITE, flags, src,
                                       0, 8, 0, pt_raddr(tgt, 0), tgt->mr->rkey) == 0,
                          "round %d: WR %u of %u refused", round, i, n);
        }
        pt_expect_cqe(&p.a, 1000 * round + n - 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE,
                      NULL);
        pt_expect_no_cqe(&p.a, 20);
    }
    pt_pair_close(&p);
}
END_TEST

START_TEST(unsignaled_error_cqe)
{
    struct pt_pair p;
    struct pt_buf *src, *tgt;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 8, LW, 0x11);
    tgt = pt_pair_buf(&p, 'b', 8, LW | RW, 0);
    ck_assert_int_eq(pt_post_send(p.ea, 77, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, 8, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey ^ 0x5A5A0000u),
                     0);
    pt_expect_cqe(&p.a, 77, EXS_PROV_WC_REM_ACCESS_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(tgt->p, 8, 0));
    pt_pair_close(&p);
}
END_TEST

START_TEST(inline_send)
{
    struct pt_pair p;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *dst;
    struct exs_prov_cqe c;
    uint8_t *tmp;
    uint32_t mi, cmi;

    {
        struct pt_host h;

        pt_host_open(&h);
        cmi = h.ctx->caps.max_inline;
        if (!(h.ctx->caps.flags & EXS_PROV_CAP_INLINE)) {
            pt_host_close(&h);
            test_skip("inline_send", "no EXS_PROV_CAP_INLINE");
            return;
        }
        pt_host_close(&h);
    }
    at.max_inline = cmi;
    pt_pair_setup(&p, &at, NULL);
    mi = p.ea->attr.max_inline;
    ck_assert_uint_ge(mi, cmi > 64 ? 64 : cmi);
    dst = pt_pair_buf(&p, 'b', mi + 64, LW, 0);
    tmp = malloc(mi > cmi ? mi + 1 : cmi + 1); /* unregistered */
    ck_assert_ptr_nonnull(tmp);
    pt_pattern(tmp, mi, 31);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, mi + 64), 0);
    {
        struct exs_prov_sge sge = {(uint64_t)(uintptr_t)tmp, mi, 0};
        struct exs_prov_send_wr wr = {.wr_id = 2,
                                      .opcode = EXS_PROV_WR_SEND,
                                      .flags = SIG | EXS_PROV_SEND_INLINE,
                                      .sg_list = &sge,
                                      .num_sge = 1};

        ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), 0);
        memset(tmp, 0xFF, mi); /* the provider must have copied already */
        pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, mi);
        ck_assert_msg(pt_pattern_check(dst->p, mi, 31) == -1,
                      "inline SEND delivered bytes written after post_send returned");
        pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        /* one byte too long for the ep, then for the caps */
        sge.length = mi + 1;
        ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
        sge.length = cmi + 1;
        ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
        pt_expect_no_cqe(&p.a, 50);
        pt_expect_no_cqe(&p.b, 0);
    }
    free(tmp);
    pt_pair_close(&p);
}
END_TEST

START_TEST(inline_write)
{
    struct pt_pair p;
    struct pt_buf *tgt;
    uint8_t tmp[64];
    struct exs_prov_sge sge[2];
    struct exs_prov_send_wr wr;

    pt_pair_setup(&p, NULL, NULL);
    if (!(p.a.ctx->caps.flags & EXS_PROV_CAP_INLINE)) {
        test_skip("inline_write", "no EXS_PROV_CAP_INLINE");
        pt_pair_close(&p);
        return;
    }
    tgt = pt_pair_buf(&p, 'b', 128, LW | RW, 0);
    pt_pattern(tmp, sizeof(tmp), 8);
    sge[0] = (struct exs_prov_sge){(uint64_t)(uintptr_t)tmp, 20, 0};
    sge[1] = (struct exs_prov_sge){(uint64_t)(uintptr_t)(tmp + 20), 44, 0xBADBAD};
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 9;
    wr.opcode = EXS_PROV_WR_RDMA_WRITE;
    wr.flags = SIG | EXS_PROV_SEND_INLINE;
    wr.sg_list = sge;
    wr.num_sge = p.a.ctx->caps.max_sge >= 2 ? 2 : 1;
    if (wr.num_sge == 1)
        sge[0].length = 64;
    wr.remote_addr = pt_raddr(tgt, 32);
    wr.rkey = tgt->mr->rkey;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), 0);
    memset(tmp, 0, sizeof(tmp));
    pt_expect_cqe(&p.a, 9, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert_int_eq(pt_pattern_check(tgt->p + 32, 64, 8), -1);
    ck_assert(pt_all_bytes(tgt->p, 32, 0) && pt_all_bytes(tgt->p + 96, 32, 0));
    pt_pair_close(&p);
}
END_TEST

Suite *prov_order_suite(void)
{
    Suite *s = suite_create("prov_order");
    TCase *tc = pt_tcase("order");

    tcase_add_test(tc, order_many_sends);
    tcase_add_test(tc, order_write_then_send);
    tcase_add_test(tc, order_header_after_payload);
    tcase_add_test(tc, order_mixed_signaled);
    suite_add_tcase(s, tc);
    tc = pt_tcase("unsignaled");
    tcase_add_test(tc, unsignaled_no_cqe);
    tcase_add_test(tc, unsignaled_fill_send_queue);
    tcase_add_test(tc, unsignaled_retired_by_signaled);
    tcase_add_test(tc, unsignaled_error_cqe);
    suite_add_tcase(s, tc);
    tc = pt_tcase("inline");
    tcase_add_test(tc, inline_send);
    tcase_add_test(tc, inline_write);
    suite_add_tcase(s, tc);
    return s;
}
