/* SPDX-License-Identifier: MIT */
/* Receiver-not-ready: SEND and RDMA_WRITE_WITH_IMM without a posted receive, with and without
 * retries. */
#include <errno.h>
#include <string.h>

#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

/* rnr_retry 0, no receive at the peer: RNR_RETRY_EXC_ERR, then everything flushes. */
static void rnr_exceeded(enum exs_prov_wr_opcode op)
{
    struct pt_pair p;
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *src, *tgt;
    struct exs_prov_cm_event ev;

    at.rnr_retry = 0;
    pt_pair_setup(&p, &at, NULL);
    src = pt_pair_buf(&p, 'a', 128, LW, 0x61);
    tgt = pt_pair_buf(&p, 'b', 128, LW | RW, 0);
    ck_assert_int_eq(
        pt_post_send(p.ea, 1, op, SIG, src, 0, 128, 0xABCD, pt_raddr(tgt, 0), tgt->mr->rkey), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 16, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_RDMA_WRITE, 0, src, 0, 16, 0,
                                  pt_raddr(tgt, 0), tgt->mr->rkey),
                     0);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_RNR_RETRY_EXC_ERR, PT_ANY_OPCODE, NULL);
    /* outstanding WRs flush, unsignaled ones too */
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    /* later WRs flush */
    ck_assert_int_eq(pt_post_send(p.ea, 4, EXS_PROV_WR_SEND, SIG, src, 0, 16, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_recv(p.ea, 5, src, 0, 16), 0);
    pt_expect_wr(&p.a, 4, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_wr(&p.a, 5, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_no_cqe(&p.a, 50);
    /* Nothing reached the responder: a receive posted there now never gets data (it
     * stays posted, as with verbs, or flushes if the provider already ended the link). */
    ck_assert_int_eq(pt_post_recv(p.eb, 6, tgt, 0, 128), 0);
    {
        struct exs_prov_cqe c;

        if (pt_try_cqe(&p.b, 100, &c))
            ck_assert_msg(c.wr_id == 6 && c.status == EXS_PROV_WC_WR_FLUSH_ERR,
                          "peer completion wr_id %llu status '%s'", (unsigned long long)c.wr_id,
                          exs__prov_wc_status_str(c.status));
        else
            c.wr_id = 0;
        /* the requester ends the connection: both sides see DISCONNECTED, the peer flushes */
        pt_ops->disconnect(p.ea);
        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_ptr_eq(ev.ep, p.eb);
        pt_wait_cm(&p.a, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_ptr_eq(ev.ep, p.ea);
        if (c.wr_id != 6)
            pt_expect_cqe(&p.b, 6, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    }
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    pt_pair_close(&p);
}

START_TEST(rnr_send_retry0)
{
    rnr_exceeded(EXS_PROV_WR_SEND);
}
END_TEST

START_TEST(rnr_send_imm_retry0)
{
    rnr_exceeded(EXS_PROV_WR_SEND_WITH_IMM);
}
END_TEST

START_TEST(rnr_write_imm_retry0)
{
    rnr_exceeded(EXS_PROV_WR_RDMA_WRITE_WITH_IMM);
}
END_TEST

/* rnr_retry 7: the request waits for the receive posted later, then succeeds. */
static void rnr_late_recv(enum exs_prov_wr_opcode op)
{
    struct pt_pair p;
    struct pt_buf *src, *tgt, *rbuf;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL); /* default rnr_retry 7 */
    src = pt_pair_buf(&p, 'a', 512, LW, 0);
    tgt = pt_pair_buf(&p, 'b', 512, LW | RW, 0);
    rbuf = pt_pair_buf(&p, 'b', 512, LW, 0x44);
    pt_pattern(src->p, 512, 1234);
    ck_assert_int_eq(
        pt_post_send(p.ea, 1, op, SIG, src, 0, 512, 0x55AA, pt_raddr(tgt, 0), tgt->mr->rkey), 0);
    /* no receive yet: nothing completes for ~50 ms */
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, rbuf, 0, 512), 0);
    if (op == EXS_PROV_WR_SEND) {
        pt_expect_cqe(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, 512);
        ck_assert_int_eq(pt_pattern_check(rbuf->p, 512, 1234), -1);
        pt_expect_cqe(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    } else {
        pt_expect_cqe(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
        ck_assert_uint_eq(c.byte_len, 512);
        ck_assert(c.flags & EXS_PROV_WC_WITH_IMM);
        ck_assert_uint_eq(c.imm_data, 0x55AA);
        ck_assert_int_eq(pt_pattern_check(tgt->p, 512, 1234), -1);
        ck_assert(pt_all_bytes(rbuf->p, 512, 0x44));
        pt_expect_cqe(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    }
    pt_pair_close(&p);
}

START_TEST(rnr_send_retry7_late_recv)
{
    rnr_late_recv(EXS_PROV_WR_SEND);
}
END_TEST

START_TEST(rnr_write_imm_retry7_late_recv)
{
    rnr_late_recv(EXS_PROV_WR_RDMA_WRITE_WITH_IMM);
}
END_TEST

START_TEST(rnr_retry7_keeps_order)
{
    /* Three SENDs stalled by RNR are delivered in order once receives appear. */
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 3, LW, 0);
    dst = pt_pair_buf(&p, 'b', 3, LW, 0);
    for (int i = 0; i < 3; i++) {
        src->p[i] = (uint8_t)(0xA0 + i);
        ck_assert_int_eq(pt_post_send(p.ea, 10 + i, EXS_PROV_WR_SEND, SIG, src, i, 1, 0, 0, 0), 0);
    }
    pt_expect_no_cqe(&p.a, 30);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(pt_post_recv(p.eb, 20 + i, dst, i, 1), 0);
        pt_sleep_ms(10);
    }
    for (int i = 0; i < 3; i++) {
        pt_expect_cqe(&p.b, 20 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, 1);
        ck_assert_uint_eq(dst->p[i], 0xA0 + i);
    }
    for (int i = 0; i < 3; i++)
        pt_expect_cqe(&p.a, 10 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_rnr_suite(void)
{
    Suite *s = suite_create("prov_rnr");
    TCase *tc = pt_tcase("rnr");

    tcase_add_test(tc, rnr_send_retry0);
    tcase_add_test(tc, rnr_send_imm_retry0);
    tcase_add_test(tc, rnr_write_imm_retry0);
    tcase_add_test(tc, rnr_send_retry7_late_recv);
    tcase_add_test(tc, rnr_write_imm_retry7_late_recv);
    tcase_add_test(tc, rnr_retry7_keeps_order);
    suite_add_tcase(s, tc);
    return s;
}
