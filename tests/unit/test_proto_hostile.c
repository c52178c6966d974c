/* SPDX-License-Identifier: MIT */
/* A hostile peer speaking raw verbs through the mock: every protocol violation resets the conn. */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/util/log.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

#define RAW_RECVS 32

/* The raw peer: its own ctx (the driver never polls it), ep, memory and what it
 * learnt of the conn (b) from b's hello. */
static struct raw {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr;
    uint8_t mem[RAW_RECVS * 512 + 4096 + 65536]; /* recvs, ring, send area */
    struct exs_wire_hello peer;                  /* b's, host order */
    uint64_t wr_id;
} raw;

#define RAW_RING (RAW_RECVS * 512)
#define RAW_SEND (RAW_RECVS * 512 + 4096)

static struct pt_pair pp;

static void raw_open(int sock_type)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 256, .max_recv_wr = RAW_RECVS, .max_inline = 64};
    struct sockaddr_storage ss;
    struct exs_prov_cm_event ev;
    struct exs_wire_hello h;
    socklen_t len;

    unit_env_clean();
    exs__log_level = EXS_LOG_ERR; /* the resets below are expected */
    memset(&pp, 0, sizeof(pp));
    memset(&raw, 0, sizeof(raw));
    mock_set_reorder(0);
    pt_open(&pp, sock_type);
    ck_assert_int_eq(mock_ctx_open(NULL, &raw.ctx), 0);
    ck_assert_int_eq(exs__prov_mr_reg(raw.ctx, raw.mem, sizeof(raw.mem),
                                      EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                                          EXS_PROV_ACCESS_REMOTE_READ,
                                      &raw.mr),
                     0);
    ck_assert_int_eq(exs__prov_ep_create(raw.ctx, &attr, &raw.ep), 0);
    for (int i = 0; i < RAW_RECVS; i++) {
        struct exs_prov_sge sge = {(uintptr_t)raw.mem + 512 * i, 512, raw.mr->lkey};
        struct exs_prov_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1};

        ck_assert_int_eq(exs__prov_post_recv(raw.ep, &wr), 0);
    }
    memset(&h, 0, sizeof(h));
    h.magic = htobe16(EXS_WIRE_MAGIC);
    h.version = EXS_WIRE_VERSION;
    h.sock_type = sock_type == SOCK_STREAM ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET;
    h.features = htobe16(EXS_WIRE_FEAT_ALL);
    h.credits = htobe16(RAW_RECVS);
    h.ctrl_size = htobe32(512);
    h.ring_size = htobe32(4096);
    h.ring_addr = htobe64((uintptr_t)raw.mem + RAW_RING);
    h.ring_rkey = htobe32(raw.mr->rkey);
    h.eager_max = htobe32(1024);
    ck_assert_int_eq(exs__prov_listener_addr(pp.lis, &ss, &len), 0);
    ck_assert_int_eq(exs__prov_connect(raw.ep, (struct sockaddr *)&ss, len, &h, sizeof(h)), 0);
    pt_run(&pp);
    ck_assert_ptr_nonnull(pp.b.conn);
    ck_assert_int_eq(pp.b.established, 1);
    ck_assert_int_eq(exs__prov_cm_poll(raw.ctx, &ev), 1);
    ck_assert_int_eq(ev.type, EXS_PROV_CM_ESTABLISHED);
    ck_assert_uint_ge(ev.private_data_len, EXS_WIRE_HELLO_LEN);
    memcpy(&h, ev.private_data, sizeof(h));
    raw.peer.ring_size = be32toh(h.ring_size);
    raw.peer.ring_addr = be64toh(h.ring_addr);
    raw.peer.ring_rkey = be32toh(h.ring_rkey);
    raw.peer.credits = be16toh(h.credits);
}

static void raw_close(void)
{
    pt_run(&pp);
    /* b reset the connection and died; nothing leaked, no receive was missing */
    ck_assert_int_eq(pp.b.dead, 1);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DEAD);
    exs__prov_ep_destroy(raw.ep);
    exs__prov_mr_dereg(raw.mr);
    exs__prov_ctx_close(raw.ctx);
    ck_assert_uint_eq(pt_rnr(&pp), 0);
    pt_close(&pp);
}

static void raw_post(enum exs_prov_wr_opcode op, const void *data, uint32_t len, uint64_t raddr,
                     uint32_t rkey, uint32_t imm)
{
    struct exs_prov_sge sge = {(uintptr_t)raw.mem + RAW_SEND, len, raw.mr->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = ++raw.wr_id,
        .opcode = op,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = len ? 1 : 0,
        .imm_data = imm,
        .remote_addr = raddr,
        .rkey = rkey,
    };

    ck_assert_uint_le(len, sizeof(raw.mem) - RAW_SEND);
    if (data)
        memcpy(raw.mem + RAW_SEND, data, len);
    ck_assert_int_eq(exs__prov_post_send(raw.ep, &wr), 0);
}

/* One control record from the raw peer. */
static void raw_ctrl(uint8_t type, uint16_t len, uint16_t credits, const void *body, uint32_t blen)
{
    uint8_t rec[512] = {0};
    struct exs_wire_ctrl_hdr h = {.type = type, .len = htobe16(len), .credits = htobe16(credits)};

    memcpy(rec, &h, sizeof(h));
    if (blen)
        memcpy(rec + sizeof(h), body, blen);
    raw_post(EXS_PROV_WR_SEND, rec, sizeof(h) + blen, 0, 0, 0);
}

/* b has a receive posted: after the violation it fails with ECONNRESET. */
static void expect_reset(void)
{
    static uint8_t rb[64];
    struct pt_op r;

    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, -1);
    ck_assert_int_eq(r.op.err, ECONNRESET);
    pt_op_fini(&r);
}

/* Sanity: a well-formed eager message from the raw peer is delivered. */
START_TEST(hs_raw_peer_works)
{
    static uint8_t rb[100];
    struct pt_op r;
    uint8_t msg[50];

    raw_open(SOCK_SEQPACKET);
    pt_fill(msg, sizeof(msg), 77);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, 50);
    ck_assert(pt_check(rb, 50, 77));
    pt_op_fini(&r);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* More credits returned than were ever granted. */
START_TEST(hs_credit_overflow)
{
    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 1000, NULL, 0);
    expect_reset();
    raw_close();
}
END_TEST

START_TEST(hs_unknown_record)
{
    raw_open(SOCK_STREAM);
    raw_ctrl(42, 8, 0, NULL, 0);
    expect_reset();
    raw_close();
}
END_TEST

/* A record whose length runs past the SEND, and one of a wrong length for its type. */
START_TEST(hs_bad_record_length)
{
    uint64_t body = 0;

    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_ACK, _i ? 24 : 64, 0, &body, sizeof(body));
    expect_reset();
    raw_close();
}
END_TEST

/* An ACK of ring bytes never written. */
START_TEST(hs_ack_beyond_written)
{
    uint64_t consumed = htobe64(100);

    raw_open(SOCK_STREAM);
    raw_ctrl(EXS_CTRL_ACK, EXS_WIRE_ACK_LEN, 0, &consumed, sizeof(consumed));
    expect_reset();
    raw_close();
}
END_TEST

/* STREAM: the peer writes more into the ring than it has room for (no ACK came). */
START_TEST(hs_ring_overrun)
{
    static uint8_t junk[4096];

    raw_open(SOCK_STREAM);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, junk, 4096, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, junk, 64, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 1);
    raw_close();
}
END_TEST

/* A direct write that names no advertised receive. */
START_TEST(hs_direct_without_advert)
{
    raw_open(_i ? SOCK_STREAM : SOCK_SEQPACKET);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0,
             exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, 0));
    expect_reset();
    raw_close();
}
END_TEST

/* SEQPACKET: an ANNOUNCE out of sequence, and one message announced twice. */
START_TEST(hs_announce_out_of_sequence)
{
    struct {
        uint64_t addr;
        uint32_t len, rkey;
        uint64_t seq;
    } __attribute__((packed)) a = {0, htobe32(8000), 0, htobe64(5)};

    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_ANNOUNCE, EXS_WIRE_ANNOUNCE_LEN, 0, &a, sizeof(a));
    expect_reset();
    raw_close();
}
END_TEST

/* Kind 3 in the immediate (neither direct nor indirect). */
START_TEST(hs_bad_imm_kind)
{
    raw_open(SOCK_SEQPACKET);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0xc0000000u);
    expect_reset();
    raw_close();
}
END_TEST

/* Data after the peer's own SHUTDOWN. */
START_TEST(hs_data_after_shutdown)
{
    uint64_t seq = 0;
    uint8_t msg[10] = {0};

    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_SHUTDOWN, EXS_WIRE_SHUTDOWN_LEN, 0, &seq, sizeof(seq));
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 1);
    raw_close();
}
END_TEST

Suite *proto_hostile_suite(void)
{
    Suite *s = suite_create("proto_hostile");
    TCase *tc = tcase_create("hostile");

    tcase_add_test(tc, hs_raw_peer_works);
    tcase_add_test(tc, hs_credit_overflow);
    tcase_add_test(tc, hs_unknown_record);
    tcase_add_loop_test(tc, hs_bad_record_length, 0, 2);
    tcase_add_test(tc, hs_ack_beyond_written);
    tcase_add_test(tc, hs_ring_overrun);
    tcase_add_loop_test(tc, hs_direct_without_advert, 0, 2);
    tcase_add_test(tc, hs_announce_out_of_sequence);
    tcase_add_test(tc, hs_bad_imm_kind);
    tcase_add_test(tc, hs_data_after_shutdown);
    suite_add_tcase(s, tc);
    return s;
}
