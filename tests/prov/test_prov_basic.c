/* SPDX-License-Identifier: MIT */
/* Basic provider conformance: caps, SEND/RECV, immediates, RDMA_WRITE, sge lists, argument checks,
 * event fd. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

START_TEST(caps_sane)
{
    struct pt_host h;
    struct exs_prov_caps c;
    int fd;

    pt_host_open(&h);
    c = h.ctx->caps;
    ck_assert_uint_ge(c.max_sge, 1);
    ck_assert_uint_ge(c.max_inline, 64);
    ck_assert_uint_ge(c.max_send_wr, 64);
    ck_assert_uint_ge(c.max_recv_wr, 64);
    ck_assert_uint_ge(c.max_private_data, 56);
    ck_assert_uint_le(c.max_private_data, EXS_PROV_PRIVATE_DATA_MAX);
    ck_assert_uint_ge(c.max_msg_size, 1u << 20);
    ck_assert_uint_ge(c.max_cqe, 64);
    ck_assert_msg(c.flags & EXS_PROV_CAP_WRITE_IMM, "caps lack WRITE_IMM");
    ck_assert_msg(c.flags & EXS_PROV_CAP_READ, "caps lack READ");
    ck_assert_msg(c.flags & EXS_PROV_CAP_INLINE, "caps lack INLINE");
    fd = pt_ops->ctx_event_fd(h.ctx);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pt_ops->ctx_event_fd(h.ctx), fd);
    ck_assert_str_eq(pt_ops->name, pt_name);
    pt_host_close(&h);
}
END_TEST

START_TEST(ep_attr_granted)
{
    struct pt_pair p;
    struct exs_prov_ep_attr a = pt_default_attr();
    int marker;

    a.user = &marker;
    pt_pair_open(&p, &a, NULL);
    ck_assert_ptr_eq(p.ea->user, &marker);
    ck_assert_ptr_eq(p.ea->attr.user, &marker);
    ck_assert_uint_ge(p.ea->attr.max_send_wr, 64);
    ck_assert_uint_ge(p.ea->attr.max_recv_wr, 64);
    ck_assert_uint_ge(p.ea->attr.max_inline, 64);
    ck_assert_uint_eq(p.ea->attr.rnr_retry, 7);
    pt_pair_close(&p);
}
END_TEST

/* Every provider refuses the same attributes (one check, exs__prov_ep_attr_check), and
 * takes them at the caps' limits. */
START_TEST(ep_attr_refused)
{
    struct pt_host h;
    struct exs_prov_ep *ep = NULL;
    struct exs_prov_ep_attr a;
    const struct exs_prov_caps *caps;

    pt_host_open(&h);
    caps = &h.ctx->caps;
    ck_assert_int_eq(pt_ops->ep_create(h.ctx, NULL, &ep), -EINVAL);
    for (int i = 0; i < 6; i++) {
        a = pt_default_attr();
        switch (i) {
        case 0:
            a.max_send_wr = 0;
            break;
        case 1:
            a.max_send_wr = caps->max_send_wr + 1;
            break;
        case 2:
            a.max_recv_wr = 0;
            break;
        case 3:
            a.max_recv_wr = caps->max_recv_wr + 1;
            break;
        case 4:
            a.max_inline = caps->max_inline + 1;
            break;
        case 5:
            a.rnr_retry = 8;
            break;
        }
        ck_assert_msg(pt_ops->ep_create(h.ctx, &a, &ep) == -EINVAL, "attribute case %d taken", i);
        ck_assert_int_eq(exs__prov_ep_attr_check(caps, &a), -EINVAL);
    }
    a = pt_default_attr();
    a.max_inline = caps->max_inline;
    a.rnr_retry = 7;
    ck_assert_int_eq(exs__prov_ep_attr_check(caps, &a), 0);
    ck_assert_int_eq(pt_ops->ep_create(h.ctx, &a, &ep), 0);
    pt_ops->ep_destroy(ep);
    /* the completion opcode of each send opcode, one map for every provider */
    ck_assert_int_eq(exs__prov_wr_wc_opcode(EXS_PROV_WR_SEND), EXS_PROV_WC_SEND);
    ck_assert_int_eq(exs__prov_wr_wc_opcode(EXS_PROV_WR_SEND_WITH_IMM), EXS_PROV_WC_SEND);
    ck_assert_int_eq(exs__prov_wr_wc_opcode(EXS_PROV_WR_RDMA_WRITE), EXS_PROV_WC_RDMA_WRITE);
    ck_assert_int_eq(exs__prov_wr_wc_opcode(EXS_PROV_WR_RDMA_WRITE_WITH_IMM),
                     EXS_PROV_WC_RDMA_WRITE);
    ck_assert_int_eq(exs__prov_wr_wc_opcode(EXS_PROV_WR_RDMA_READ), EXS_PROV_WC_RDMA_READ);
    pt_host_close(&h);
}
END_TEST

/* One SEND of len bytes from src into a receive of dst_len bytes, both directions. */
static void send_one_way(struct pt_pair *p, char from, uint32_t len, uint32_t seed)
{
    struct pt_host *hs = from == 'a' ? &p->a : &p->b, *hr = from == 'a' ? &p->b : &p->a;
    struct exs_prov_ep *es = from == 'a' ? p->ea : p->eb, *er = from == 'a' ? p->eb : p->ea;
    struct pt_buf *src = pt_pair_buf(p, from, len, LW, 0);
    struct pt_buf *dst = pt_pair_buf(p, from == 'a' ? 'b' : 'a', len + 100, LW, 0);
    struct exs_prov_cqe c;

    pt_pattern(src->p, len, seed);
    ck_assert_int_eq(pt_post_recv(er, 11, dst, 0, len + 100), 0);
    ck_assert_int_eq(pt_post_send(es, 21, EXS_PROV_WR_SEND, SIG, src, 0, len, 0, 0, 0), 0);
    pt_expect_cqe(hr, 11, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, len);
    ck_assert_msg(!(c.flags & EXS_PROV_WC_WITH_IMM), "plain SEND completed WITH_IMM");
    ck_assert_ptr_eq(c.ep, er);
    pt_expect_cqe(hs, 21, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, &c);
    ck_assert_ptr_eq(c.ep, es);
    ck_assert_int_eq(pt_pattern_check(dst->p, len, seed), -1);
    ck_assert(pt_all_bytes(dst->p + len, 100, 0));
    ck_assert(pt_buf_guards_ok(dst));
}

START_TEST(send_recv_both_ways)
{
    struct pt_pair p;

    pt_pair_setup(&p, NULL, NULL);
    send_one_way(&p, 'a', 4096, 1);
    send_one_way(&p, 'b', 1000, 2);
    send_one_way(&p, 'a', 1, 3);
    send_one_way(&p, 'b', 65536, 4);
    pt_expect_no_cqe(&p.a, 50);
    pt_expect_no_cqe(&p.b, 0);
    pt_pair_close(&p);
}
END_TEST

START_TEST(send_zero_length)
{
    struct pt_pair p;
    struct pt_buf *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0x55);
    ck_assert_int_eq(pt_post_recv(p.eb, 5, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 6, EXS_PROV_WR_SEND, SIG, NULL, 0, 0, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 5, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 0);
    ck_assert_uint_eq(c.flags & EXS_PROV_WC_WITH_IMM, 0);
    pt_expect_cqe(&p.a, 6, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert(pt_all_bytes(dst->p, 64, 0x55));
    pt_pair_close(&p);
}
END_TEST

START_TEST(send_with_imm)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 300, LW, 0);
    dst = pt_pair_buf(&p, 'b', 512, LW, 0);
    pt_pattern(src->p, 300, 77);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 512), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, dst, 0, 512), 0);
    ck_assert_int_eq(
        pt_post_send(p.ea, 3, EXS_PROV_WR_SEND_WITH_IMM, SIG, src, 0, 300, 0xDEADBEEFu, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 300);
    ck_assert_msg(c.flags & EXS_PROV_WC_WITH_IMM, "SEND_WITH_IMM completed without WITH_IMM");
    ck_assert_uint_eq(c.imm_data, 0xDEADBEEFu);
    ck_assert_int_eq(pt_pattern_check(dst->p, 300, 77), -1);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    /* Zero-length SEND_WITH_IMM: only the immediate. */
    ck_assert_int_eq(pt_post_send(p.ea, 4, EXS_PROV_WR_SEND_WITH_IMM, SIG, NULL, 0, 0, 7, 0, 0), 0);
    pt_expect_cqe(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 0);
    ck_assert_msg(c.flags & EXS_PROV_WC_WITH_IMM, "no WITH_IMM");
    ck_assert_uint_eq(c.imm_data, 7);
    pt_expect_cqe(&p.a, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
}
END_TEST

START_TEST(write_with_imm)
{
    struct pt_pair p;
    struct pt_buf *src, *tgt, *rbuf;
    struct exs_prov_cqe c;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 1000, LW, 0);
    tgt = pt_pair_buf(&p, 'b', 4096, LW | RW, 0);
    rbuf = pt_pair_buf(&p, 'b', 256, LW, 0x77);
    pt_pattern(src->p, 1000, 5);
    ck_assert_int_eq(pt_post_recv(p.eb, 50, rbuf, 0, 256), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 60, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, SIG, src, 0, 1000,
                                  0x01020304u, pt_raddr(tgt, 100), tgt->mr->rkey),
                     0);
    pt_expect_cqe(&p.b, 50, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
    ck_assert_uint_eq(c.byte_len, 1000);
    ck_assert_msg(c.flags & EXS_PROV_WC_WITH_IMM, "WRITE_WITH_IMM completed without WITH_IMM");
    ck_assert_uint_eq(c.imm_data, 0x01020304u);
    ck_assert_ptr_eq(c.ep, p.eb);
    ck_assert_int_eq(pt_pattern_check(tgt->p + 100, 1000, 5), -1);
    ck_assert(pt_all_bytes(tgt->p, 100, 0));
    ck_assert(pt_all_bytes(tgt->p + 1100, 4096 - 1100, 0));
    ck_assert_msg(pt_all_bytes(rbuf->p, 256, 0x77), "WRITE_WITH_IMM wrote into the receive buffer");
    ck_assert(pt_buf_guards_ok(tgt) && pt_buf_guards_ok(rbuf));
    pt_expect_cqe(&p.a, 60, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    pt_pair_close(&p);
}
END_TEST

START_TEST(rdma_write_sizes)
{
    static const uint32_t sizes[] = {1, 7, 4096, 65536, 1u << 20};
    struct pt_pair p;
    struct pt_buf *src, *tgt;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', (1u << 20) + 64, LW, 0);
    tgt = pt_pair_buf(&p, 'b', (1u << 20) + 64, LW | RW, 0);
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint32_t n = sizes[i];

        memset(tgt->p, 0, tgt->len);
        pt_pattern(src->p + 3, n, 100 + i);
        ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_RDMA_WRITE, SIG, src, 3, n, 0,
                                      pt_raddr(tgt, 5), tgt->mr->rkey),
                         0);
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
        ck_assert_msg(pt_pattern_check(tgt->p + 5, n, 100 + i) == -1, "write of %u bytes wrong", n);
        ck_assert(pt_all_bytes(tgt->p, 5, 0));
        ck_assert(pt_all_bytes(tgt->p + 5 + n, tgt->len - 5 - n, 0));
        ck_assert(pt_buf_guards_ok(tgt));
    }
    /* Plain RDMA_WRITE consumes no receive and makes no completion at the target. */
    pt_expect_no_cqe(&p.b, 100);
    pt_pair_close(&p);
}
END_TEST

START_TEST(sge_gather_scatter)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_sge ss[3], rs[2];
    struct exs_prov_send_wr sw;
    struct exs_prov_recv_wr rw;
    struct exs_prov_cqe c;
    uint8_t msg[600];

    pt_pair_setup(&p, NULL, NULL);
    if (p.a.ctx->caps.max_sge < 3) {
        test_skip("sge_gather_scatter", "max_sge %u < 3", p.a.ctx->caps.max_sge);
        pt_pair_close(&p);
        return;
    }
    src = pt_pair_buf(&p, 'a', 1024, LW, 0);
    dst = pt_pair_buf(&p, 'b', 1024, LW, 0);
    pt_pattern(src->p, 1024, 9);
    /* gather 100 B @0, 200 B @400, 300 B @700 */
    ss[0] = (struct exs_prov_sge){pt_raddr(src, 0), 100, src->mr->lkey};
    ss[1] = (struct exs_prov_sge){pt_raddr(src, 400), 200, src->mr->lkey};
    ss[2] = (struct exs_prov_sge){pt_raddr(src, 700), 300, src->mr->lkey};
    memcpy(msg, src->p, 100);
    memcpy(msg + 100, src->p + 400, 200);
    memcpy(msg + 300, src->p + 700, 300);
    /* scatter into 250 B @0 and 500 B @512 */
    rs[0] = (struct exs_prov_sge){pt_raddr(dst, 0), 250, dst->mr->lkey};
    rs[1] = (struct exs_prov_sge){pt_raddr(dst, 512), 500, dst->mr->lkey};
    rw = (struct exs_prov_recv_wr){.wr_id = 1, .sg_list = rs, .num_sge = 2};
    ck_assert_int_eq(pt_ops->post_recv(p.eb, &rw), 0);
    memset(&sw, 0, sizeof(sw));
    sw.wr_id = 2;
    sw.opcode = EXS_PROV_WR_SEND;
    sw.flags = SIG;
    sw.sg_list = ss;
    sw.num_sge = 3;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &sw), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 600);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert_msg(memcmp(dst->p, msg, 250) == 0, "first receive sge wrong");
    ck_assert_msg(pt_all_bytes(dst->p + 250, 262, 0), "gap between receive sges written");
    ck_assert_msg(memcmp(dst->p + 512, msg + 250, 350) == 0, "second receive sge wrong");
    ck_assert_msg(pt_all_bytes(dst->p + 862, 1024 - 862, 0), "bytes after the message written");
    ck_assert(pt_buf_guards_ok(dst));
    pt_pair_close(&p);
}
END_TEST

START_TEST(recv_too_small)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 200, LW, 0x42);
    dst = pt_pair_buf(&p, 'b', 200, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 100), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 200, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_LOC_LEN_ERR, PT_ANY_OPCODE, NULL);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_REM_INV_REQ_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    ck_assert(pt_all_bytes(dst->p + 100, 100, 0));
    ck_assert(pt_buf_guards_ok(dst));
    pt_pair_close(&p);
}
END_TEST

START_TEST(send_bad_lkey)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_sge sge;
    struct exs_prov_send_wr wr;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 128, LW, 0x42);
    dst = pt_pair_buf(&p, 'b', 128, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 128), 0);
    sge = (struct exs_prov_sge){pt_raddr(src, 0), 128, src->mr->lkey ^ 0x5A5A0000u};
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 2;
    wr.opcode = EXS_PROV_WR_SEND;
    wr.flags = SIG;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), 0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_LOC_PROT_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert(pt_all_bytes(dst->p, 128, 0));
    pt_pair_close(&p);
}
END_TEST

START_TEST(send_sge_outside_mr)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 128, LW, 0x42);
    dst = pt_pair_buf(&p, 'b', 256, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 256), 0);
    /* valid lkey, range runs 64 bytes past the region's end */
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 64, 128, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_LOC_PROT_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert(pt_all_bytes(dst->p, 256, 0));
    pt_pair_close(&p);
}
END_TEST

START_TEST(recv_sge_no_local_write)
{
    /* A receive into a region without LOCAL_WRITE fails with LOC_PROT_ERR. */
    struct pt_pair p;
    struct pt_buf *src, *dst;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0x42);
    dst = pt_pair_buf(&p, 'b', 64, 0, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_LOC_PROT_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(dst->p, 64, 0));
    pt_pair_close(&p);
}
END_TEST

START_TEST(args_send_not_connected)
{
    struct pt_pair p;
    struct pt_buf *src;

    pt_pair_open(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), -ENOTCONN);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 64, 0, 0, 1),
                     -ENOTCONN);
    /* Receives may be posted on an IDLE ep. */
    ck_assert_int_eq(pt_post_recv(p.ea, 2, src, 0, 64), 0);
    pt_expect_no_cqe(&p.a, 50);
    pt_pair_close(&p);
}
END_TEST

START_TEST(args_bad_opcode_and_sge_count)
{
    struct pt_pair p;
    struct pt_buf *src;
    struct exs_prov_sge *sg;
    struct exs_prov_send_wr wr;
    struct exs_prov_recv_wr rw;
    uint32_t n;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 4096, LW, 0);
    n = p.a.ctx->caps.max_sge + 1;
    sg = calloc(n, sizeof(*sg));
    ck_assert_ptr_nonnull(sg);
    for (uint32_t i = 0; i < n; i++)
        sg[i] = (struct exs_prov_sge){pt_raddr(src, i % 4096), 1, src->mr->lkey};
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 1;
    wr.flags = SIG;
    wr.sg_list = sg;
    wr.num_sge = 1;
    wr.opcode = (enum exs_prov_wr_opcode)99;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
    wr.opcode = (enum exs_prov_wr_opcode) - 1;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
    wr.opcode = EXS_PROV_WR_SEND;
    wr.num_sge = (int)n;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
    wr.num_sge = -1;
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
    rw = (struct exs_prov_recv_wr){.wr_id = 2, .sg_list = sg, .num_sge = (int)n};
    ck_assert_int_eq(pt_ops->post_recv(p.ea, &rw), -EINVAL);
    /* total length above caps.max_msg_size */
    if (p.a.ctx->caps.max_msg_size < UINT32_MAX) {
        sg[0].length = (uint32_t)p.a.ctx->caps.max_msg_size + 1;
        wr.num_sge = 1;
        wr.opcode = EXS_PROV_WR_RDMA_WRITE;
        ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), -EINVAL);
        sg[0].length = 1;
    }
    /* Nothing was queued by the rejected posts, and the ep still works. */
    pt_expect_no_cqe(&p.a, 50);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    free(sg);
    send_one_way(&p, 'a', 100, 1);
    pt_pair_close(&p);
}
END_TEST

START_TEST(args_recv_queue_overflow)
{
    struct pt_pair p;
    struct pt_buf *dst;
    uint32_t n;

    pt_pair_open(&p, NULL, NULL);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0);
    n = p.eb->attr.max_recv_wr;
    ck_assert_uint_ge(n, 1);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(pt_post_recv(p.eb, i, dst, 0, 64) == 0, "receive %u of %u refused", i, n);
    ck_assert_int_eq(pt_post_recv(p.eb, n, dst, 0, 64), -ENOMEM);
    pt_pair_close(&p);
}
END_TEST

START_TEST(args_send_queue_overflow)
{
    /* SENDs stalled on receiver-not-ready (rnr_retry 7) keep the send queue full. */
    struct pt_pair p;
    struct pt_buf *src;
    uint32_t n;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0);
    n = p.ea->attr.max_send_wr;
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(pt_post_send(p.ea, i, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0) == 0,
                      "send %u of %u refused", i, n);
    ck_assert_int_eq(pt_post_send(p.ea, n, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), -ENOMEM);
    pt_pair_close(&p);
}
END_TEST

START_TEST(poll_batch_oldest_first)
{
    /* ctx_poll with max > 1 returns several completions, oldest first, never more than max. */
    struct pt_pair p;
    struct pt_buf *src, *tgt;
    struct exs_prov_cqe c[8];
    uint64_t next = 0;
    double deadline;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 1);
    tgt = pt_pair_buf(&p, 'b', 64, LW | RW, 0);
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(pt_post_send(p.ea, i, EXS_PROV_WR_RDMA_WRITE, SIG, src, 0, 64, 0,
                                      pt_raddr(tgt, 0), tgt->mr->rkey),
                         0);
    /* let them all complete, then poll in batches (directly: the helpers would stash them) */
    pt_sleep_ms(100);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (next < 20 && pt_now_ms() < deadline) {
        int n = pt_ops->ctx_poll(p.a.ctx, c, 8);

        ck_assert_int_ge(n, 0);
        ck_assert_int_le(n, 8);
        for (int i = 0; i < n; i++) {
            ck_assert_uint_eq(c[i].wr_id, next);
            ck_assert_int_eq(c[i].status, EXS_PROV_WC_SUCCESS);
            ck_assert_int_eq(c[i].opcode, EXS_PROV_WC_RDMA_WRITE);
            ck_assert_ptr_eq(c[i].ep, p.ea);
            next++;
        }
        if (n == 0)
            pt_sleep_ms(1);
    }
    ck_assert_uint_eq(next, 20);
    ck_assert_int_eq(pt_ops->ctx_poll(p.a.ctx, c, 8), 0);
    pt_pair_close(&p);
}
END_TEST

/* ---- completion notification ---- */

static int fd_readable(struct pt_host *h, int ms)
{
    struct pollfd pfd = {.fd = pt_ops->ctx_event_fd(h->ctx), .events = POLLIN};
    double deadline = pt_now_ms() + ms;

    for (;;) {
        double left = deadline - pt_now_ms();
        int rc = poll(&pfd, 1, left > 0 ? (int)left + 1 : 0);

        ck_assert_int_ge(rc, 0);
        if (rc != 1 || !(pfd.revents & POLLIN))
            return 0;
        if (!pt_manual)
            return 1;
        /* MANUAL_PROGRESS: readable also means "ctx_progress has work". Do it as the
         * sleeper would (after a driver's turn in progress); what stays readable once
         * a turn found nothing left is the notification. */
        rc = pt_ops->ctx_progress(h->ctx);
        ck_assert_int_ge(rc, 0);
        if (rc == 0 && poll(&pfd, 1, 0) == 1)
            return 1;
        if (left <= 0)
            return 0;
    }
}

/* Arm with nothing queued. MANUAL_PROGRESS: ctx_arm also refuses while the provider
 * owes work of its own (a deferred ACK): the consumer runs a turn, as a sleeper does,
 * and tries again; no completion may appear meanwhile. */
static int arm_drained(struct pt_host *h)
{
    struct exs_prov_cqe c;
    int rc = pt_ops->ctx_arm(h->ctx);

    for (int i = 0; pt_manual && rc == -EAGAIN && i < 100; i++) {
        ck_assert_int_ge(pt_ops->ctx_progress(h->ctx), 0);
        ck_assert_int_eq(pt_ops->ctx_poll(h->ctx, &c, 1), 0);
        rc = pt_ops->ctx_arm(h->ctx);
    }
    return rc;
}

/* Arm h with nothing queued and see its event fd stay quiet for 100 ms. Spurious
 * readability is allowed (prov.h, ctx_arm), and a provider may have a late event of its
 * own under load (verbs: seen in check-rxe beside other jobs, 2 runs in about 20): what
 * is queued then is taken, as a sleeper would, and once armed again the fd must go quiet;
 * readable three times running is a notification that nothing consumes. */
static void arm_quiet(struct pt_host *h)
{
    struct exs_prov_cqe c;
    struct exs_prov_cm_event ev;
    int late = 0;

    ck_assert_int_eq(arm_drained(h), 0);
    for (int i = 0; fd_readable(h, 100); i++) {
        ck_assert_msg(i < 3, "event fd readable with nothing queued (%d late events taken)", late);
        while (pt_ops->ctx_cm_poll(h->ctx, &ev) == 1)
            late++;
        while (pt_ops->ctx_poll(h->ctx, &c, 1) == 1)
            late++;
        ck_assert_int_eq(arm_drained(h), 0);
    }
}

/* A receive completion makes an armed event fd readable; with disarm, ctx_disarm taken
 * after the arm leaves the fd quiet (tcp, default mode, where only the notification makes
 * it readable), and in both cases the next ctx_arm refuses while the completion is queued
 * and an arm after draining works as before. */
static void notify_cqe_run(int disarm)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;
    struct exs_prov_cm_event ev;

    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 1);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, dst, 0, 64), 0);
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 0);
    ck_assert_int_eq(pt_ops->ctx_cm_poll(p.b.ctx, &ev), 0);
    arm_quiet(&p.b);
    if (disarm)
        pt_ops->ctx_disarm(p.b.ctx);
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    if (disarm)
        ck_assert_msg(!fd_readable(&p.b, 500), "event fd readable after ctx_disarm");
    else
        ck_assert_msg(fd_readable(&p.b, PT_TIMEOUT_MS),
                      "event fd not readable after a receive completed");
    /* The completion is queued and not polled yet: arming must refuse. */
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 1);
    ck_assert_uint_eq(c.wr_id, 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 0);
    /* Armed again after draining: quiet until the next completion. */
    arm_quiet(&p.b);
    ck_assert_int_eq(pt_post_send(p.ea, 4, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    ck_assert_msg(fd_readable(&p.b, PT_TIMEOUT_MS), "event fd not readable after 2nd receive");
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 1);
    ck_assert_uint_eq(c.wr_id, 2);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p.a, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
}

START_TEST(notify_cqe)
{
    notify_cqe_run(0);
}
END_TEST

START_TEST(notify_disarm)
{
    if (strcmp(pt_name, "tcp") != 0 || pt_manual) {
        test_skip("notify_disarm", "provider %s%s: ctx_disarm is tested on tcp's default mode",
                  pt_name, pt_manual ? " (manual progress)" : "");
        return;
    }
    notify_cqe_run(1);
}
END_TEST

START_TEST(notify_cm_event)
{
    struct pt_pair p;
    struct exs_prov_cqe c;
    struct exs_prov_cm_event ev;

    pt_pair_open(&p, NULL, NULL);
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 0);
    ck_assert_int_eq(pt_ops->ctx_cm_poll(p.b.ctx, &ev), 0);
    arm_quiet(&p.b);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, NULL, 0), 0);
    ck_assert_msg(fd_readable(&p.b, PT_TIMEOUT_MS),
                  "event fd not readable after a connect request");
    ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), -EAGAIN);
    ck_assert_int_eq(pt_ops->ctx_cm_poll(p.b.ctx, &ev), 1);
    ck_assert_int_eq(ev.type, EXS_PROV_CM_CONNECT_REQUEST);
    ck_assert_int_eq(pt_ops->accept(ev.req, p.eb, NULL, 0), 0);
    pt_wait_cm(&p.a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, NULL);
    p.a_up = 1;
    pt_wait_cm(&p.b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, NULL);
    p.b_up = 1;
    pt_pair_close(&p);
}
END_TEST

Suite *prov_basic_suite(void)
{
    Suite *s = suite_create("prov_basic");
    TCase *tc = pt_tcase("data");

    tcase_add_test(tc, caps_sane);
    tcase_add_test(tc, ep_attr_granted);
    tcase_add_test(tc, ep_attr_refused);
    tcase_add_test(tc, send_recv_both_ways);
    tcase_add_test(tc, send_zero_length);
    tcase_add_test(tc, send_with_imm);
    tcase_add_test(tc, write_with_imm);
    tcase_add_test(tc, rdma_write_sizes);
    tcase_add_test(tc, sge_gather_scatter);
    tcase_add_test(tc, recv_too_small);
    tcase_add_test(tc, send_bad_lkey);
    tcase_add_test(tc, send_sge_outside_mr);
    tcase_add_test(tc, recv_sge_no_local_write);
    tcase_add_test(tc, poll_batch_oldest_first);
    suite_add_tcase(s, tc);
    tc = pt_tcase("args");
    tcase_add_test(tc, args_send_not_connected);
    tcase_add_test(tc, args_bad_opcode_and_sge_count);
    tcase_add_test(tc, args_recv_queue_overflow);
    tcase_add_test(tc, args_send_queue_overflow);
    suite_add_tcase(s, tc);
    tc = pt_tcase("notify");
    tcase_add_test(tc, notify_cqe);
    tcase_add_test(tc, notify_cm_event);
    tcase_add_test(tc, notify_disarm);
    suite_add_tcase(s, tc);
    return s;
}
