/* SPDX-License-Identifier: MIT */
/* Remote access errors of RDMA_WRITE and RDMA_READ: keys, bounds, rights, deregistration, foreign
 * keys. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

#define TLEN 4096

enum access_kind {
    K_UNKNOWN_RKEY,
    K_BEYOND_END,
    K_BEFORE_START,
    K_WRAP,
    K_NO_RIGHT,
    K_DEREGISTERED,
    K_OTHER_CTX,
};

static const char *const kind_names[] = {
    "unknown rkey",  "range beyond the end", "range before the start", "addr+len wraps",
    "missing right", "deregistered region",  "key of another ctx",
};

static void access_case(enum exs_prov_wr_opcode op, enum access_kind k)
{
    struct pt_pair p;
    struct pt_host c;
    struct exs_prov_mr *mrc = NULL;
    struct pt_buf *tgt, *valid, *src, *dst;
    unsigned tacc = LW | RW | RR;
    uint64_t raddr;
    uint32_t rkey;
    const uint32_t len = 64;
    int is_read = op == EXS_PROV_WR_RDMA_READ;

    if (k == K_NO_RIGHT)
        tacc = LW | (is_read ? RW : RR);
    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', TLEN, tacc, 0x5A);
    valid = pt_pair_buf(&p, 'b', 64, LW | RW | RR, 0x33);
    src = pt_pair_buf(&p, 'a', TLEN, LW, 0);
    dst = pt_pair_buf(&p, 'a', TLEN, LW, 0x11);
    pt_pattern(src->p, TLEN, 3);
    raddr = pt_raddr(tgt, 0);
    rkey = tgt->mr->rkey;
    switch (k) {
    case K_UNKNOWN_RKEY:
        rkey ^= 0x5A5A0000u;
        ck_assert(rkey != tgt->mr->rkey && rkey != valid->mr->rkey);
        break;
    case K_BEYOND_END:
        raddr = pt_raddr(tgt, TLEN - 32);
        break;
    case K_BEFORE_START:
        raddr = pt_raddr(tgt, 0) - 32;
        break;
    case K_WRAP:
        raddr = UINT64_MAX - 15; /* raddr + len wraps to 48 */
        break;
    case K_NO_RIGHT:
        break;
    case K_DEREGISTERED:
        ck_assert_int_eq(pt_ops->mr_dereg(tgt->mr), 0);
        tgt->mr = NULL;
        break;
    case K_OTHER_CTX:
        pt_host_open(&c);
        /* the very same memory, registered with every right, but in another ctx */
        ck_assert_int_eq(pt_ops->mr_reg(c.ctx, tgt->p, TLEN, LW | RW | RR, &mrc), 0);
        rkey = mrc->rkey;
        ck_assert_msg(rkey != tgt->mr->rkey && rkey != valid->mr->rkey,
                      "foreign key 0x%x collides with a key of the target ctx", rkey);
        break;
    }
    if (op == EXS_PROV_WR_RDMA_WRITE_WITH_IMM) /* a receive is ready: only the key is wrong */
        ck_assert_int_eq(pt_post_recv(p.eb, 100, valid, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 7, op, SIG, is_read ? dst : src, 0, len, 0, raddr, rkey),
                     0);
    /* a valid WRITE behind it must not be carried out */
    ck_assert_int_eq(pt_post_send(p.ea, 8, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 8, 0,
                                  pt_raddr(valid, 0), valid->mr->rkey),
                     0);
    {
        struct exs_prov_cqe cq;

        pt_wait_cqe(&p.a, PT_TIMEOUT_MS, &cq);
        ck_assert_msg(cq.wr_id == 7 && cq.status == EXS_PROV_WC_REM_ACCESS_ERR,
                      "%s %s: wr_id %llu status '%s', expected wr_id 7 'remote access error'",
                      is_read ? "RDMA_READ" : "RDMA_WRITE", kind_names[k],
                      (unsigned long long)cq.wr_id, exs__prov_wc_status_str(cq.status));
    }
    pt_expect_cqe(&p.a, 8, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert_int_eq(pt_post_send(p.ea, 9, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 8, 0,
                                  pt_raddr(valid, 0), valid->mr->rkey),
                     0);
    pt_expect_cqe(&p.a, 9, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    /* not one byte of the target (or around it) changed */
    ck_assert_msg(pt_all_bytes(tgt->p, TLEN, 0x5A), "%s: target region modified", kind_names[k]);
    ck_assert_msg(pt_buf_guards_ok(tgt), "%s: bytes around the target region modified",
                  kind_names[k]);
    ck_assert_msg(pt_all_bytes(valid->p, 64, 0x33), "flushed WRITE was carried out");
    if (is_read)
        ck_assert_msg(pt_all_bytes(dst->p, TLEN, 0x11) && pt_buf_guards_ok(dst),
                      "failed READ placed data locally");
    if (mrc) {
        ck_assert_int_eq(pt_ops->mr_dereg(mrc), 0);
        pt_pair_close(&p);
        pt_host_close(&c);
    } else {
        pt_pair_close(&p);
    }
}

#define ACCESS_TEST(_name, _op, _kind)                                                             \
    START_TEST(_name)                                                                              \
    {                                                                                              \
        access_case(_op, _kind);                                                                   \
    }                                                                                              \
    END_TEST

ACCESS_TEST(write_unknown_rkey, EXS_PROV_WR_RDMA_WRITE, K_UNKNOWN_RKEY)
ACCESS_TEST(write_beyond_end, EXS_PROV_WR_RDMA_WRITE, K_BEYOND_END)
ACCESS_TEST(write_before_start, EXS_PROV_WR_RDMA_WRITE, K_BEFORE_START)
ACCESS_TEST(write_addr_wraps, EXS_PROV_WR_RDMA_WRITE, K_WRAP)
ACCESS_TEST(write_no_remote_write, EXS_PROV_WR_RDMA_WRITE, K_NO_RIGHT)
ACCESS_TEST(write_deregistered, EXS_PROV_WR_RDMA_WRITE, K_DEREGISTERED)
ACCESS_TEST(write_other_ctx_key, EXS_PROV_WR_RDMA_WRITE, K_OTHER_CTX)
ACCESS_TEST(write_imm_unknown_rkey, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, K_UNKNOWN_RKEY)
ACCESS_TEST(read_unknown_rkey, EXS_PROV_WR_RDMA_READ, K_UNKNOWN_RKEY)
ACCESS_TEST(read_beyond_end, EXS_PROV_WR_RDMA_READ, K_BEYOND_END)
ACCESS_TEST(read_before_start, EXS_PROV_WR_RDMA_READ, K_BEFORE_START)
ACCESS_TEST(read_addr_wraps, EXS_PROV_WR_RDMA_READ, K_WRAP)
ACCESS_TEST(read_no_remote_read, EXS_PROV_WR_RDMA_READ, K_NO_RIGHT)
ACCESS_TEST(read_deregistered, EXS_PROV_WR_RDMA_READ, K_DEREGISTERED)
ACCESS_TEST(read_other_ctx_key, EXS_PROV_WR_RDMA_READ, K_OTHER_CTX)

START_TEST(zero_length_bogus_rkey)
{
    /* verbs does not check the rkey of a zero-length RDMA_WRITE / RDMA_READ */
    struct pt_pair p;
    struct pt_buf *tgt, *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', 64, LW | RW | RR, 0x5A);
    dst = pt_pair_buf(&p, 'a', 64, LW, 0x11);
    ck_assert_int_eq(
        pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG, NULL, 0, 0, 0, 0, 0xBADC0DEu), 0);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_RDMA_READ, SIG, NULL, 0, 0, 0,
                                  UINT64_MAX - 3, 0xBADC0DEu),
                     0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, &c);
    ck_assert_uint_eq(c.byte_len, 0);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    /* and the ep still works */
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, 64, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey),
                     0);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, &c);
    ck_assert_uint_eq(c.byte_len, 64);
    ck_assert(pt_all_bytes(dst->p, 64, 0x5A));
    pt_expect_no_cqe(&p.b, 20);
    pt_pair_close(&p);
}
END_TEST

START_TEST(write_dereg_then_reg_new_key)
{
    /* A region registered again after deregistration gets a key the old one does not alias. */
    struct pt_pair p;
    struct pt_buf *tgt, *src;
    struct exs_prov_mr *mr2 = NULL;
    uint32_t old;

    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', 256, LW | RW, 0x5A);
    src = pt_pair_buf(&p, 'a', 256, LW, 0x01);
    old = tgt->mr->rkey;
    ck_assert_int_eq(pt_ops->mr_dereg(tgt->mr), 0);
    tgt->mr = NULL;
    ck_assert_int_eq(pt_ops->mr_reg(p.b.ctx, tgt->p, 256, LW | RW, &mr2), 0);
    if (mr2->rkey == old) {
        test_skip("write_dereg_then_reg_new_key", "the provider reused the key");
    } else {
        ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 256, 0,
                                      pt_raddr(tgt, 0), old),
                         0);
        pt_expect_cqe(&p.a, 1, EXS_PROV_WC_REM_ACCESS_ERR, PT_ANY_OPCODE, NULL);
        ck_assert(pt_all_bytes(tgt->p, 256, 0x5A));
    }
    ck_assert_int_eq(pt_ops->mr_dereg(mr2), 0);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_access_suite(void)
{
    Suite *s = suite_create("prov_access");
    TCase *tc = pt_tcase("write");

    tcase_add_test(tc, write_unknown_rkey);
    tcase_add_test(tc, write_beyond_end);
    tcase_add_test(tc, write_before_start);
    tcase_add_test(tc, write_addr_wraps);
    tcase_add_test(tc, write_no_remote_write);
    tcase_add_test(tc, write_deregistered);
    tcase_add_test(tc, write_other_ctx_key);
    tcase_add_test(tc, write_imm_unknown_rkey);
    tcase_add_test(tc, write_dereg_then_reg_new_key);
    suite_add_tcase(s, tc);
    tc = pt_tcase("read");
    tcase_add_test(tc, read_unknown_rkey);
    tcase_add_test(tc, read_beyond_end);
    tcase_add_test(tc, read_before_start);
    tcase_add_test(tc, read_addr_wraps);
    tcase_add_test(tc, read_no_remote_read);
    tcase_add_test(tc, read_deregistered);
    tcase_add_test(tc, read_other_ctx_key);
    suite_add_tcase(s, tc);
    tc = pt_tcase("zero_length");
    tcase_add_test(tc, zero_length_bogus_rkey);
    suite_add_tcase(s, tc);
    return s;
}
