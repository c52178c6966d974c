/* SPDX-License-Identifier: MIT */
/* RDMA_READ: sizes, scatter into several sges, local protection, ordering with later writes. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

#define MIB (1u << 20)

START_TEST(read_sizes)
{
    static const uint32_t sizes[] = {1, 4096, MIB};
    struct pt_pair p;
    struct pt_buf *rem, *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    rem = pt_pair_buf(&p, 'b', MIB + 64, RR, 0);
    dst = pt_pair_buf(&p, 'a', MIB + 64, LW, 0);
    pt_pattern(rem->p, rem->len, 42);
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint32_t n = sizes[i];

        memset(dst->p, 0, dst->len);
        ck_assert_int_eq(pt_post_send(p.ea, 100 + i, EXS_PROV_WR_RDMA_READ, SIG, dst, 3, n, 0,
                                      pt_raddr(rem, 7), rem->mr->rkey),
                         0);
        pt_expect_cqe(&p.a, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, &c);
        ck_assert_msg(c.byte_len == n, "READ of %u bytes: byte_len %u", n, c.byte_len);
        ck_assert_ptr_eq(c.ep, p.ea);
        ck_assert_msg(memcmp(dst->p + 3, rem->p + 7, n) == 0, "READ of %u bytes: data differs", n);
        ck_assert(pt_all_bytes(dst->p, 3, 0));
        ck_assert(pt_all_bytes(dst->p + 3 + n, dst->len - 3 - n, 0));
        ck_assert(pt_buf_guards_ok(dst));
    }
    ck_assert_int_eq(pt_pattern_check(rem->p, rem->len, 42), -1);
    pt_expect_no_cqe(&p.b, 20);
    pt_pair_close(&p);
}
END_TEST

START_TEST(read_multi_sge)
{
    struct pt_pair p;
    struct pt_buf *rem, *dst;
    struct exs_prov_sge sg[3];
    struct exs_prov_send_wr wr;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    if (p.a.ctx->caps.max_sge < 3) {
        test_skip("read_multi_sge", "max_sge %u < 3", p.a.ctx->caps.max_sge);
        pt_pair_close(&p);
        return;
    }
    rem = pt_pair_buf(&p, 'b', 4096, RR | RW, 0);
    dst = pt_pair_buf(&p, 'a', 8192, LW, 0);
    pt_pattern(rem->p, 4096, 77);
    sg[0] = (struct exs_prov_sge){pt_raddr(dst, 0), 1000, dst->mr->lkey};
    sg[1] = (struct exs_prov_sge){pt_raddr(dst, 1500), 2000, dst->mr->lkey};
    sg[2] = (struct exs_prov_sge){pt_raddr(dst, 4000), 1096, dst->mr->lkey};
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 5;
    wr.opcode = EXS_PROV_WR_RDMA_READ;
    wr.flags = SIG;
    wr.sg_list = sg;
    wr.num_sge = 3;
    wr.remote_addr = pt_raddr(rem, 0);
    wr.rkey = rem->mr->rkey;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), 0);
    pt_expect_cqe(&p.a, 5, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, &c);
    ck_assert_uint_eq(c.byte_len, 4096);
    ck_assert(memcmp(dst->p, rem->p, 1000) == 0);
    ck_assert(pt_all_bytes(dst->p + 1000, 500, 0));
    ck_assert(memcmp(dst->p + 1500, rem->p + 1000, 2000) == 0);
    ck_assert(pt_all_bytes(dst->p + 3500, 500, 0));
    ck_assert(memcmp(dst->p + 4000, rem->p + 3000, 1096) == 0);
    ck_assert(pt_all_bytes(dst->p + 5096, 8192 - 5096, 0));
    ck_assert(pt_buf_guards_ok(dst));
    pt_pair_close(&p);
}
END_TEST

START_TEST(read_into_readonly_local)
{
    /* READ targets need LOCAL_WRITE: LOC_PROT_ERR, nothing placed. */
    struct pt_pair p;
    struct pt_buf *rem, *dst;

    pt_pair_setup(&p, NULL, NULL);
    rem = pt_pair_buf(&p, 'b', 256, RR, 0x5A);
    dst = pt_pair_buf(&p, 'a', 256, 0, 0x11);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, 256, 0,
                                  pt_raddr(rem, 0), rem->mr->rkey),
                     0);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_LOC_PROT_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert(pt_all_bytes(dst->p, 256, 0x11));
    pt_pair_close(&p);
}
END_TEST

START_TEST(read_then_fenced_write)
{
    /* A WRITE with FENCE starts after the earlier READ finished: the READ sees the old data. */
    struct pt_pair p;
    struct pt_buf *rem, *dst, *src;

    pt_pair_setup(&p, NULL, NULL);
    rem = pt_pair_buf(&p, 'b', 4096, RR | RW, 0);
    dst = pt_pair_buf(&p, 'a', 4096, LW, 0);
    src = pt_pair_buf(&p, 'a', 4096, LW, 0);
    for (uint32_t i = 0; i < 10; i++) {
        pt_pattern(rem->p, 4096, 1000 + i);
        pt_pattern(src->p, 4096, 2000 + i);
        ck_assert_int_eq(pt_post_send(p.ea, 2 * i, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, 4096, 0,
                                      pt_raddr(rem, 0), rem->mr->rkey),
                         0);
        ck_assert_int_eq(pt_post_send(p.ea, 2 * i + 1, EXS_PROV_WR_RDMA_WRITE,
                                      SIG | EXS_PROV_SEND_FENCE, src, 0, 4096, 0, pt_raddr(rem, 0),
                                      rem->mr->rkey),
                         0);
        pt_expect_cqe(&p.a, 2 * i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, NULL);
        pt_expect_cqe(&p.a, 2 * i + 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
        ck_assert_msg(pt_pattern_check(dst->p, 4096, 1000 + i) == -1,
                      "round %u: READ returned data of the later WRITE", i);
        ck_assert_int_eq(pt_pattern_check(rem->p, 4096, 2000 + i), -1);
    }
    pt_pair_close(&p);
}
END_TEST

START_TEST(read_many_outstanding)
{
    /* 32 READs in flight complete in posting order with the right data. */
    struct pt_pair p;
    struct pt_buf *rem, *dst;

    pt_pair_setup(&p, NULL, NULL);
    rem = pt_pair_buf(&p, 'b', 32 * 1024, RR, 0);
    dst = pt_pair_buf(&p, 'a', 32 * 1024, LW, 0);
    pt_pattern(rem->p, rem->len, 9);
    for (uint32_t i = 0; i < 32; i++)
        ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_RDMA_READ, SIG, dst, 1024 * (31 - i),
                                      1024, 0, pt_raddr(rem, 1024 * i), rem->mr->rkey),
                         0);
    for (uint32_t i = 0; i < 32; i++)
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, NULL);
    for (uint32_t i = 0; i < 32; i++)
        ck_assert_msg(memcmp(dst->p + 1024 * (31 - i), rem->p + 1024 * i, 1024) == 0,
                      "READ %u data wrong", i);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_read_suite(void)
{
    Suite *s = suite_create("prov_read");
    TCase *tc = pt_tcase("read");

    tcase_add_test(tc, read_sizes);
    tcase_add_test(tc, read_multi_sge);
    tcase_add_test(tc, read_into_readonly_local);
    tcase_add_test(tc, read_then_fenced_write);
    tcase_add_test(tc, read_many_outstanding);
    suite_add_tcase(s, tc);
    return s;
}
