/* SPDX-License-Identifier: MIT */
/* A hostile peer speaking raw verbs through the mock: every protocol violation resets the conn. */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "exs/proto/reqtrace.h"
#include "exs/proto/proto_int.h"
#include "exs/proto/wire_names.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/sha256.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

#define RAW_RECVS 32

/* The raw peer: its own ctx (the driver never polls it), ep, memory and what it
 * learnt of the conn (b) from b's hello. */
static struct raw {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr;
    uint8_t mem[RAW_RECVS * 512 + 4096 + 65536]
        __attribute__((aligned(4096))); /* recvs, ring, send area */
    struct exs_wire_hello peer;         /* b's, host order */
    uint64_t wr_id;
    uint64_t session; /* the token of b's SESSION record's key (§9.2), 0: none came */
    uint8_t kb[EXS_WIRE_SESSION_KEY_LEN]; /* that key, K_B */
    struct exs_wire_shm_offer offer;      /* b's SHM_OFFER after it (type 0: none came) */
} raw;

#define RAW_RING (RAW_RECVS * 512)
#define RAW_SEND (RAW_RECVS * 512 + 4096)

static struct pt_pair pp;
static uint16_t raw_features = EXS_WIRE_FEAT_ALL; /* the raw peer's hello.features */
static int b_resumable;                           /* b's conn params: resumable (§9.2) */
static int b_shm;                                 /* b's conn params: shm (provider-shm.md) */

static void raw_post(enum exs_prov_wr_opcode op, const void *data, uint32_t len, uint64_t raddr,
                     uint32_t rkey, uint32_t imm);
static void raw_send_ring(void);
static uint32_t raw_peer_ring_key(void);

/* The pair (b listening), the raw peer's ctx, memory, ep and receives, and its hello *h. */
static void raw_prepare(int sock_type, struct exs_wire_hello *hp)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 256, .max_recv_wr = RAW_RECVS, .max_inline = 64};
    struct exs_wire_hello h;

    unit_env_clean();
    exs__log_level = EXS_LOG_ERR; /* the resets below are expected */
    memset(&pp, 0, sizeof(pp));
    memset(&raw, 0, sizeof(raw));
    mock_set_reorder(0);
    pt_params(&pp.pb, sock_type);
    pp.pb.resumable = b_resumable;
    pp.pb.shm = b_shm;
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
    h.features = htobe16(raw_features);
    h.credits = htobe16(RAW_RECVS);
    h.ctrl_size = htobe32(512);
    h.ring_size = htobe32(4096);
    h.ring_addr = htobe64((uintptr_t)raw.mem + RAW_RING);
    h.ring_rkey = 0; /* reserved (v2): the key goes in the RING record */
    h.eager_max = htobe32(1024);
    *hp = h;
}

static void raw_open_ring(int sock_type, int send_ring)
{
    struct sockaddr_storage ss;
    struct exs_prov_cm_event ev;
    struct exs_wire_hello h;
    socklen_t len;

    raw_prepare(sock_type, &h);
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
    raw.peer.credits = be16toh(h.credits);
    if (send_ring)
        raw_send_ring();
    pt_run(&pp);
    raw.peer.ring_rkey = raw_peer_ring_key();
}

static void raw_open(int sock_type)
{
    raw_open_ring(sock_type, 1);
}

/* Our ring's key, as the protocol's first record (v2). */
static void raw_send_ring(void)
{
    struct exs_wire_ring r = {
        .hdr = {.type = EXS_CTRL_RING, .len = htobe16(EXS_WIRE_RING_LEN)},
        .rkey = htobe32(raw.mr->rkey),
    };

    raw_post(EXS_PROV_WR_SEND, &r, sizeof(r), 0, 0, 0);
}

/* b's ring key from the RING record among the SENDs raw received. */
static uint32_t raw_peer_ring_key(void)
{
    struct exs_prov_cqe cqe;
    uint32_t key = 0;

    while (exs__prov_poll(raw.ctx, &cqe, 1) == 1) {
        struct exs_wire_ring r;

        if (cqe.status != EXS_PROV_WC_SUCCESS || cqe.opcode != EXS_PROV_WC_RECV ||
            cqe.byte_len < sizeof(r))
            continue;
        memcpy(&r, raw.mem + 512 * cqe.wr_id, sizeof(r));
        if (r.hdr.type == EXS_CTRL_RING)
            key = be32toh(r.rkey);
        /* §9.2: b's SESSION record follows its RING record in the same SEND */
        if (r.hdr.type == EXS_CTRL_RING &&
            cqe.byte_len >= EXS_WIRE_RING_LEN + EXS_WIRE_SESSION_LEN) {
            struct exs_wire_session ss;

            memcpy(&ss, raw.mem + 512 * cqe.wr_id + EXS_WIRE_RING_LEN, sizeof(ss));
            if (ss.hdr.type == EXS_CTRL_SESSION) {
                uint8_t d[EXS_SHA256_LEN];

                memcpy(raw.kb, ss.key, sizeof(raw.kb));
                exs__sha256(ss.key, sizeof(ss.key), d);
                memcpy(&raw.session, d, sizeof(raw.session));
                raw.session = be64toh(raw.session);
            }
            /* and its SHM_OFFER its SESSION (feature SHM) */
            if (cqe.byte_len >= EXS_WIRE_RING_LEN + EXS_WIRE_SESSION_LEN + EXS_WIRE_SHM_OFFER_LEN)
                memcpy(&raw.offer,
                       raw.mem + 512 * cqe.wr_id + EXS_WIRE_RING_LEN + EXS_WIRE_SESSION_LEN,
                       sizeof(raw.offer));
        }
    }
    ck_assert_uint_ne(key, 0);
    return key;
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

/* b has a receive posted: after the violation it fails with ECONNRESET, and b's conn
 * names the rule the peer broke (a macro: a failure names the caller's line). */
#define expect_pv(_rule)                                                                           \
    do {                                                                                           \
        expect_reset();                                                                            \
        ck_assert_pv(pp.b.conn, (_rule));                                                          \
    } while (0)

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
    expect_pv(EXS_PV_CREDITS);
    raw_close();
}
END_TEST

START_TEST(hs_unknown_record)
{
    raw_open(SOCK_STREAM);
    raw_ctrl(42, 8, 0, NULL, 0);
    expect_pv(EXS_PV_CTRL_TYPE);
    raw_close();
}
END_TEST

/* A record whose length runs past the SEND, and one of a wrong length for its type (the
 * SEND as long as it says). */
START_TEST(hs_bad_record_length)
{
    uint64_t body[2] = {0};

    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_ACK, _i ? 24 : 64, 0, body, _i ? 16 : 8);
    expect_pv(_i ? EXS_PV_CTRL_SIZE : EXS_PV_CTRL_LEN);
    raw_close();
}
END_TEST

/* An ACK of ring bytes never written. */
START_TEST(hs_ack_beyond_written)
{
    uint64_t consumed = htobe64(100);

    raw_open(SOCK_STREAM);
    raw_ctrl(EXS_CTRL_ACK, EXS_WIRE_ACK_LEN, 0, &consumed, sizeof(consumed));
    expect_pv(EXS_PV_ACK_RANGE);
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
    ck_assert_pv(pp.b.conn, EXS_PV_RING_OVERRUN);
    raw_close();
}
END_TEST

/* A batched eager write (§6.1) built by hand: n records of the given lengths (pattern
 * offset 1000 * i), into b's ring at offset off; returns its length. */
static uint32_t raw_batch(uint8_t *buf, const uint32_t *lens, int n)
{
    uint32_t off = 0;

    for (int i = 0; i < n; i++) {
        struct exs_wire_batch_rec h = {.len = htobe32(lens[i])};

        memcpy(buf + off, &h, sizeof(h));
        pt_fill(buf + off + sizeof(h), lens[i], 1000u * i);
        memset(buf + off + sizeof(h) + lens[i], 0,
               exs_wire_batch_rec_size(lens[i]) - sizeof(h) - lens[i]);
        off += exs_wire_batch_rec_size(lens[i]);
    }
    return off;
}

/* A well-formed batched write from the raw peer: three messages, one of them cut. */
START_TEST(hs_batch_delivered)
{
    static uint8_t buf[1024], rb[3][64];
    const uint32_t lens[3] = {5, 0, 100};
    struct pt_op r[3];
    uint32_t len;

    raw_open(SOCK_SEQPACKET);
    len = raw_batch(buf, lens, 3);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, buf, len, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 3));
    pt_run(&pp);
    for (int i = 0; i < 3; i++) {
        memset(rb[i], 0, sizeof(rb[i]));
        pt_op_init(&r[i], &pp.b, EXS_OP_RECV, rb[i], sizeof(rb[i]), 0);
        ck_assert_int_eq(pt_post(&r[i]), 0);
    }
    pt_run(&pp);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(r[i].done, 1);
        ck_assert_int_eq(r[i].op.result, (ssize_t)(lens[i] < 64 ? lens[i] : 64));
        ck_assert_int_eq(r[i].op.rflags, lens[i] > 64 ? MSG_TRUNC : 0);
        ck_assert(pt_check(rb[i], r[i].op.result, 1000u * i));
        ck_assert_uint_eq(r[i].order, (uint64_t)i + 1);
        pt_op_fini(&r[i]);
    }
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* Batched writes that do not parse: the tag counts 3 of 2 records; a message not below
 * eager_max (1024); reserved not 0; a record running past the write; a cut header; an
 * empty write with a count. */
START_TEST(hs_batch_malformed)
{
    static uint8_t buf[8192];
    uint32_t lens[2] = {10, 20}, len, tag = 2;

    raw_open(SOCK_SEQPACKET);
    len = raw_batch(buf, lens, 2);
    switch (_i) {
    case 0:
        tag = 3;
        break;
    case 1:
        lens[1] = 1024;
        len = raw_batch(buf, lens, 2);
        break;
    case 2:
        buf[4] = 1; /* reserved of the first record */
        break;
    case 3:
        len -= 8; /* the second record's payload runs past the end */
        break;
    case 4:
        len += 4; /* four bytes of a third header */
        memset(buf + len - 4, 0, 4);
        break;
    case 5:
        len = 0; /* no record at all */
        break;
    }
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, buf, len, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, tag));
    expect_pv(EXS_PV_BATCH);
    raw_close();
}
END_TEST

/* The peer rewrites a record of a batched write after it arrived (it may write its ring
 * at any time): the receive that reads it finds the connection reset, and nothing is
 * copied past the record. */
START_TEST(hs_batch_rewritten)
{
    static uint8_t buf[256], rb[2][2048];
    const uint32_t lens[2] = {10, 20};
    struct exs_wire_batch_rec bad = {.len = htobe32(1000)};
    struct pt_op r[2];
    uint32_t len;

    raw_open(SOCK_SEQPACKET);
    len = raw_batch(buf, lens, 2);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, buf, len, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 2));
    pt_run(&pp);
    pt_op_init(&r[0], &pp.b, EXS_OP_RECV, rb[0], sizeof(rb[0]), 0);
    ck_assert_int_eq(pt_post(&r[0]), 0);
    pt_run(&pp);
    ck_assert_int_eq(r[0].op.result, 10);
    /* a plain RDMA WRITE (no receive consumed) over the second record's header */
    raw_post(EXS_PROV_WR_RDMA_WRITE, &bad, sizeof(bad),
             raw.peer.ring_addr + exs_wire_batch_rec_size(10), raw.peer.ring_rkey, 0);
    pt_run(&pp);
    memset(rb[1], 0xa5, sizeof(rb[1]));
    pt_op_init(&r[1], &pp.b, EXS_OP_RECV, rb[1], sizeof(rb[1]), 0);
    ck_assert_int_eq(pt_post(&r[1]), 0);
    pt_run(&pp);
    ck_assert_int_eq(r[1].done, 1);
    ck_assert_int_eq(r[1].op.result, -1);
    ck_assert_int_eq(r[1].op.err, ECONNRESET);
    ck_assert_pv(pp.b.conn, EXS_PV_BATCH);
    for (size_t i = 0; i < sizeof(rb[1]); i++)
        ck_assert_uint_eq(rb[1][i], 0xa5);
    pt_op_fini(&r[0]);
    pt_op_fini(&r[1]);
    raw_close();
}
END_TEST

/* A direct write that names no advertised receive. */
START_TEST(hs_direct_without_advert)
{
    raw_open(_i ? SOCK_STREAM : SOCK_SEQPACKET);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0,
             exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, 0));
    expect_pv(EXS_PV_DIRECT);
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
    expect_pv(EXS_PV_ANNOUNCE);
    raw_close();
}
END_TEST

/* Kind 3 in the immediate (neither direct nor indirect). */
START_TEST(hs_bad_imm_kind)
{
    raw_open(SOCK_SEQPACKET);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0xc0000000u);
    expect_pv(EXS_PV_IMM_KIND);
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
    pt_run(&pp); /* raw's send area is reused by the next post */
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 1);
    ck_assert_pv(pp.b.conn, EXS_PV_DATA_AFTER_SHUTDOWN);
    raw_close();
}
END_TEST

/* SHUTDOWN's count must be exactly what arrived (spec §8): one above it (variants 0-1:
 * nothing arrived, count 1) would leave receives waiting for data that never comes, and
 * resets; the exact count (variants 2-3: 10 bytes, or one message of 10, then count 10 /
 * 1) gives the data and then end of stream. Even variants SEQPACKET, odd STREAM. */
START_TEST(hs_shutdown_count)
{
    int stream = _i & 1, exact = _i >= 2;
    uint64_t seq = htobe64(exact ? (stream ? 10 : 1) : 1);
    static uint8_t rb[2][64];
    uint8_t msg[10];
    struct pt_op r[2];

    raw_open(stream ? SOCK_STREAM : SOCK_SEQPACKET);
    if (!exact) {
        raw_ctrl(EXS_CTRL_SHUTDOWN, EXS_WIRE_SHUTDOWN_LEN, 0, &seq, sizeof(seq));
        expect_pv(EXS_PV_SHUTDOWN);
        raw_close();
        return;
    }
    pt_fill(msg, sizeof(msg), 31);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, stream ? 0 : EXS_IMM_EOM, 0, 0));
    pt_run(&pp); /* raw's send area is reused by the next post */
    raw_ctrl(EXS_CTRL_SHUTDOWN, EXS_WIRE_SHUTDOWN_LEN, 0, &seq, sizeof(seq));
    pt_run(&pp);
    for (int i = 0; i < 2; i++) {
        pt_op_init(&r[i], &pp.b, EXS_OP_RECV, rb[i], sizeof(rb[i]), 0);
        ck_assert_int_eq(pt_post(&r[i]), 0);
        pt_run(&pp);
        ck_assert_int_eq(r[i].done, 1);
        ck_assert_int_eq(r[i].op.err, 0);
    }
    ck_assert_int_eq(r[0].op.result, 10);
    ck_assert(pt_check(rb[0], 10, 31));
    ck_assert_int_eq(r[1].op.result, 0); /* end of stream */
    pt_op_fini(&r[0]);
    pt_op_fini(&r[1]);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* v2: the peer's first record must be its RING, and it comes once. */
START_TEST(hs_record_before_ring)
{
    raw_open_ring(SOCK_SEQPACKET, 0);
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 0, NULL, 0);
    expect_pv(EXS_PV_RING_ORDER);
    raw_close();
}
END_TEST

START_TEST(hs_second_ring)
{
    raw_open(SOCK_STREAM);
    raw_send_ring();
    expect_pv(EXS_PV_RING_ORDER);
    raw_close();
}
END_TEST

/* The control records raw received since the last call, searched for one of type;
 * copies it into rec (len bytes). */
/* Each control record raw received since the last look goes to fn with what is left of
 * its SEND from it; a length below a header ends that SEND. repost: each receive is
 * posted again. Returns the SENDs seen. */

static int raw_each_record(exs_wire_rec_fn *fn, void *arg, int repost)
{
    struct exs_prov_cqe cqe;
    int sends = 0;

    while (exs__prov_poll(raw.ctx, &cqe, 1) == 1) {
        const uint8_t *p = raw.mem + 512 * cqe.wr_id;
        struct exs_prov_sge sge = {(uintptr_t)p, 512, raw.mr->lkey};
        struct exs_prov_recv_wr wr = {.wr_id = cqe.wr_id, .sg_list = &sge, .num_sge = 1};

        if (cqe.status != EXS_PROV_WC_SUCCESS || cqe.opcode != EXS_PROV_WC_RECV)
            continue; /* raw's own sends; receives flushed once b's endpoint is gone */
        sends++;
        ck_assert_int_eq(exs__wire_walk(p, cqe.byte_len, fn, arg), 0);
        if (repost)
            ck_assert_int_eq(exs__prov_post_recv(raw.ep, &wr), 0);
    }
    return sends;
}

struct raw_find {
    uint8_t type;
    void *rec;
    size_t len;
    int found;
};

static int raw_find_one(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                        uint32_t rlen)
{
    struct raw_find *f = arg;

    if (h->type == f->type && f->len <= rlen && !f->found) {
        memcpy(f->rec, rec, f->len);
        f->found = 1;
    }
    return 0;
}

static int raw_find_record(uint8_t type, void *rec, size_t len)
{
    struct raw_find f = {.type = type, .rec = rec, .len = len};

    raw_each_record(raw_find_one, &f, 0);
    return f.found;
}

/* The status of raw's next completion of a send work request. */
static enum exs_prov_wc_status raw_send_status(void)
{
    struct exs_prov_cqe cqe;

    while (exs__prov_poll(raw.ctx, &cqe, 1) == 1)
        if (cqe.opcode != EXS_PROV_WC_RECV && cqe.opcode != EXS_PROV_WC_RECV_RDMA_WITH_IMM)
            return cqe.status;
    ck_abort_msg("no send completion");
    return EXS_PROV_WC_GENERAL_ERR;
}

/* Grants (deliver 1): an advertised receive buffer may be written by this peer until
 * the receive completes, and not one byte later. */
START_TEST(hs_advert_key_dies_with_receive)
{
    static uint8_t rb[4096];
    struct exs_wire_advert a;
    uint8_t msg[100];
    struct pt_op r;

    raw_open(SOCK_SEQPACKET);
    memset(rb, 0, sizeof(rb));
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ADVERT, &a, sizeof(a)));
    ck_assert_uint_eq(be64toh(a.addr), (uintptr_t)rb);
    ck_assert_uint_eq(be32toh(a.len), sizeof(rb));
    /* the other right: refused */
    raw_post(EXS_PROV_WR_RDMA_READ, NULL, 8, be64toh(a.addr), be32toh(a.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_REM_ACCESS_ERR);
    exs__prov_ep_destroy(raw.ep); /* raw's ep is in ERROR now: a fresh one */
    exs__prov_mr_dereg(raw.mr);
    exs__prov_ctx_close(raw.ctx);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    pt_op_fini(&r);
    pt_close(&pp);

    raw_open(SOCK_SEQPACKET);
    memset(rb, 0, sizeof(rb));
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ADVERT, &a, sizeof(a)));
    pt_fill(msg, sizeof(msg), 5);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), be64toh(a.addr), be32toh(a.rkey),
             exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, be32toh(a.id)));
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, 100);
    ck_assert(pt_check(rb, 100, 5));
    /* done: the key is dead */
    memset(msg, 0xee, sizeof(msg));
    raw_post(EXS_PROV_WR_RDMA_WRITE, msg, sizeof(msg), be64toh(a.addr), be32toh(a.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert(pt_check(rb, 100, 5));
    pt_op_fini(&r);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* An announced send buffer may be read, never written, and only until READ_DONE. */
START_TEST(hs_announce_key_read_only)
{
    static uint8_t sb[8000];
    struct exs_wire_announce a;
    struct exs_wire_read_done d = {
        .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
    };
    struct pt_op s;

    raw_open(SOCK_SEQPACKET);
    pt_fill(sb, sizeof(sb), 9);
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ANNOUNCE, &a, sizeof(a)));
    ck_assert_uint_eq(be64toh(a.addr), (uintptr_t)sb);
    raw_post(EXS_PROV_WR_RDMA_READ, NULL, 8000, be64toh(a.addr), be32toh(a.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS);
    ck_assert(pt_check(raw.mem + RAW_SEND, 8000, 9));
    d.seq = a.seq;
    raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(s.op.result, 8000);
    raw_post(EXS_PROV_WR_RDMA_READ, NULL, 8, be64toh(a.addr), be32toh(a.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_REM_ACCESS_ERR);
    pt_op_fini(&s);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

START_TEST(hs_announce_key_not_writable)
{
    static uint8_t sb[8000];
    struct exs_wire_announce a;
    struct pt_op s;

    raw_open(SOCK_SEQPACKET);
    pt_fill(sb, sizeof(sb), 9);
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ANNOUNCE, &a, sizeof(a)));
    raw_post(EXS_PROV_WR_RDMA_WRITE, NULL, 8, be64toh(a.addr), be32toh(a.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert(pt_check(sb, sizeof(sb), 9));
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(s.done, 1);
    pt_op_fini(&s);
    raw_close();
}
END_TEST

/* A READ_DONE naming an eager message whose write is still outstanding: only an
 * announced send waits for one, so the peer broke the protocol (reset), and the send is
 * not completed by it while its write is outstanding (the write flushes: ECONNRESET). */
START_TEST(hs_read_done_for_eager_write)
{
    static uint8_t sb[100];
    struct exs_wire_read_done d = {
        .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
    };
    struct mock_stats st;
    uint64_t sends;
    struct pt_op s;

    raw_open(SOCK_SEQPACKET);
    d.seq = htobe64(pp.b.conn->tx_seq); /* the number of b's next message */
    raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
    mock_stats(raw.ctx, &st);
    sends = st.sends;
    while (st.sends == sends) { /* the READ_DONE arrives at b, not yet dispatched */
        ck_assert_int_eq(mock_step(), 1);
        mock_stats(raw.ctx, &st);
    }
    pt_fill(sb, sizeof(sb), 3);
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0); /* eager: one write into raw's ring, posted */
    ck_assert_int_eq(s.op.state, EXS_OPS_POSTED);
    ck_assert_uint_eq(s.op.seq, be64toh(d.seq));
    pt_run(&pp);
    /* completed by its flushed write with the reset, not by the READ_DONE (100, 0) */
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(s.op.result, -1);
    ck_assert_int_eq(s.op.err, ECONNRESET);
    ck_assert_pv(pp.b.conn, EXS_PV_READ_DONE);
    pt_op_fini(&s);
    raw_close();
}
END_TEST

/* §7.2 DRAIN from the raw peer (b is the data sender). b first puts 100 bytes into raw's
 * ring (phase 1) when s is given; then raw's request DRAIN(pos, phase). */
static void raw_drain(uint64_t pos, uint32_t phase, struct pt_op *s, uint8_t *sb)
{
    struct {
        uint64_t pos;
        uint32_t phase, reserved;
    } __attribute__((packed)) d = {htobe64(pos), htobe32(phase), 0};

    if (s) {
        pt_fill(sb, 100, 0);
        pt_op_init(s, &pp.b, EXS_OP_SEND, sb, 100, 0);
        ck_assert_int_eq(pt_post(s), 0);
        pt_run(&pp);
        pt_assert_done(s, 100, 0);
        ck_assert_uint_eq(pp.b.conn->stream.ps, 1);
    }
    raw_ctrl(EXS_CTRL_DRAIN, EXS_WIRE_DRAIN_LEN, 0, &d, sizeof(d));
}

/* A well-formed request is honoured: b answers STOPPED at its stream offset, holds the
 * ring (a new send waits), and writes directly into the next ADVERT, at that offset. */
START_TEST(hs_drain_honoured)
{
    static uint8_t sb[100], sb2[300];
    uint8_t *rb = raw.mem + RAW_RING + 2048; /* raw's receive buffer (its own memory) */
    struct exs_wire_drain ans;
    struct exs_sock_stats st;
    struct pt_op s, s2;

    raw_open(SOCK_STREAM);
    raw_drain(100, 1, &s, sb);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_DRAIN, &ans, sizeof(ans)));
    ck_assert_uint_eq(ans.hdr.flags, EXS_DRAIN_STOPPED);
    ck_assert_uint_eq(be16toh(ans.hdr.len), EXS_WIRE_DRAIN_LEN);
    ck_assert_uint_eq(be64toh(ans.pos), 100);
    ck_assert_uint_eq(be32toh(ans.phase), 1);
    pt_fill(sb2, sizeof(sb2), 100);
    pt_op_init(&s2, &pp.b, EXS_OP_SEND, sb2, sizeof(sb2), 0);
    ck_assert_int_eq(pt_post(&s2), 0);
    pt_run(&pp);
    ck_assert_int_eq(s2.done, 0); /* held: no ring write */
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.indirect_xfers, 1);
    ck_assert_uint_eq(st.drain_requests, 1);
    struct {
        uint64_t addr;
        uint32_t len, rkey;
        uint64_t seq;
        uint32_t phase, id;
    } __attribute__((packed)) a = {htobe64((uintptr_t)rb), htobe32(1000), htobe32(raw.mr->rkey),
                                   htobe64(100),           htobe32(2),    htobe32(7)};
    raw_ctrl(EXS_CTRL_ADVERT, EXS_WIRE_ADVERT_LEN, 0, &a, sizeof(a));
    pt_run(&pp);
    pt_assert_done(&s2, 300, 0);
    ck_assert(pt_check(rb, 300, 100));
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.direct_xfers, 1);
    ck_assert_uint_eq(st.indirect_xfers, 1);
    ck_assert_uint_eq(pp.b.conn->stream.ps, 2);
    pt_op_fini(&s);
    pt_op_fini(&s2);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* Hostile DRAINs: 0 in a direct phase (b sent nothing), 1 a position b never sent,
 * 2 an even (direct) phase, 3 another phase than b's, 4 a second request in a held
 * phase, 5 an unsolicited STOPPED answer, 6 reserved not 0, 7 unknown flags. */
START_TEST(hs_drain_bad)
{
    static uint8_t sb[100];
    struct pt_op s;

    raw_open(SOCK_STREAM);
    switch (_i) {
    case 0:
        raw_drain(0, 1, NULL, NULL);
        break;
    case 1:
        raw_drain(101, 1, &s, sb);
        break;
    case 2:
        raw_drain(100, 2, &s, sb);
        break;
    case 3:
        raw_drain(100, 3, &s, sb);
        break;
    case 4:
        raw_drain(100, 1, &s, sb);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.dead, 0);
        raw_drain(100, 1, NULL, NULL);
        break;
    case 5: {
        struct exs_wire_drain d = {.hdr = {.type = EXS_CTRL_DRAIN,
                                           .flags = EXS_DRAIN_STOPPED,
                                           .len = htobe16(EXS_WIRE_DRAIN_LEN)},
                                   .pos = 0,
                                   .phase = htobe32(1)};
        raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
        break;
    }
    default: {
        struct exs_wire_drain d = {.hdr = {.type = EXS_CTRL_DRAIN,
                                           .flags = _i == 7 ? 2 : 0,
                                           .len = htobe16(EXS_WIRE_DRAIN_LEN)},
                                   .pos = htobe64(100),
                                   .phase = htobe32(1),
                                   .reserved = htobe32(_i == 6)};
        pt_fill(sb, 100, 0);
        pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, 100, 0);
        ck_assert_int_eq(pt_post(&s), 0);
        pt_run(&pp);
        raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
        break;
    }
    }
    expect_pv(_i >= 6 ? EXS_PV_RESERVED : EXS_PV_DRAIN);
    if (_i && _i != 5)
        pt_op_fini(&s);
    raw_close();
}
END_TEST

/* A DRAIN of a wrong length (16: the old size of nothing, 32: too long). */
START_TEST(hs_drain_bad_length)
{
    uint8_t body[24] = {0};

    raw_open(SOCK_STREAM);
    raw_ctrl(EXS_CTRL_DRAIN, _i ? 32 : 16, 0, body, _i ? 24 : 8);
    expect_pv(EXS_PV_CTRL_SIZE);
    raw_close();
}
END_TEST

/* A DRAIN on a SEQPACKET connection. */
START_TEST(hs_drain_seqpacket)
{
    struct {
        uint64_t pos;
        uint32_t phase, reserved;
    } __attribute__((packed)) d = {0, htobe32(1), 0};

    raw_open(SOCK_SEQPACKET);
    raw_ctrl(EXS_CTRL_DRAIN, EXS_WIRE_DRAIN_LEN, 0, &d, sizeof(d));
    expect_pv(EXS_PV_SOCK_TYPE);
    raw_close();
}
END_TEST

/* ---- TRACE records (spec/protocol.md §5.1) ---- */

/* One TRACE record from the raw peer. */
static void raw_trace(uint8_t flags, uint64_t seq, uint64_t t2, uint64_t ta, uint64_t td,
                      uint64_t t3)
{
    struct exs_wire_trace w = {
        .hdr = {.type = EXS_CTRL_TRACE, .flags = flags, .len = htobe16(EXS_WIRE_TRACE_LEN)},
        .seq = htobe64(seq),
        .t_req = htobe64(t2),
        .t_arrival = htobe64(ta),
        .t_delivery = htobe64(td),
        .t_answer = htobe64(t3),
    };

    raw_post(EXS_PROV_WR_SEND, &w, sizeof(w), 0, 0, 0);
    pt_run(&pp); /* the send area is reused by the next raw_post */
}

static void raw_trace_ninth(int stream);
static void raw_st_write(const uint8_t *data, uint32_t len, uint64_t off);

/* b sends one sampled 20-byte message to the raw peer: its request is message 0's. */
static void b_sends_traced(struct pt_op *s, uint8_t *sb)
{
    exs__params.trace_sample_mask = UINT64_MAX;
    pt_fill(sb, 20, 0);
    pt_op_init(s, &pp.b, EXS_OP_SEND, sb, 20, 0);
    ck_assert_int_eq(pt_post(s), 0);
    pt_run(&pp);
    exs__params.trace_sample_mask = 0;
    ck_assert_int_eq(s->done, 1);
}

/* A request and a well-formed answer are accepted; an answer completes b's trace. */
START_TEST(hs_trace_ok)
{
    static uint8_t sb[20];
    struct pt_op s;
    uint64_t before = exs__reqtrace_completed();

    raw_open(SOCK_SEQPACKET);
    raw_trace(0, 0, 5, 0, 0, 0); /* a request for message 0, which comes next */
    raw_trace(0, 0, 6, 0, 0, 0); /* again: its send was cancelled, this one replaces it */
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, sb, 8, raw.peer.ring_addr, raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
    pt_run(&pp);
    b_sends_traced(&s, sb);
    raw_trace(EXS_TRACE_ANSWER, 0, 10, 11, 12, 13);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(exs__reqtrace_completed(), before + 1);
    pt_op_fini(&s);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* Every violation of §5.1 resets the connection (cases 0 and 12-16: on a STREAM). */
START_TEST(hs_trace_bad)
{
    static uint8_t sb[20];
    struct pt_op s;
    int sent = 0;

    raw_open(_i == 0 || _i >= 12 ? SOCK_STREAM : SOCK_SEQPACKET);
    switch (_i) {
    case 0: /* on a STREAM connection: a request whose send ends where the stream stands */
        raw_trace(0, 0, 5, 0, 0, 0);
        break;
    case 1: { /* a wrong length */
        uint8_t body[32] = {0};
        raw_ctrl(EXS_CTRL_TRACE, 40, 0, body, 32);
        break;
    }
    case 2: /* a request for a message other than the next */
        raw_trace(0, 3, 5, 0, 0, 0);
        break;
    case 3: /* a request with a flag it must not have */
        raw_trace(EXS_TRACE_DROPPED, 0, 5, 0, 0, 0);
        break;
    case 4: /* a request with answer fields */
        raw_trace(0, 0, 5, 6, 0, 0);
        break;
    case 5: /* an answer for another message than the traced one */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER, 1, 10, 11, 12, 13);
        break;
    case 6: /* an answer for a message never traced */
        raw_trace(EXS_TRACE_ANSWER, 0, 10, 11, 12, 13);
        break;
    case 7: /* an answer with times out of order */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER, 0, 10, 12, 11, 13);
        break;
    case 8: /* an answer with an unknown flag */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER | 4, 0, 10, 11, 12, 13);
        break;
    case 9: /* a DROPPED answer with times */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER | EXS_TRACE_DROPPED, 0, 10, 11, 12, 13);
        break;
    case 10: /* a second answer for the same message */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER, 0, 10, 11, 12, 13);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        raw_trace(EXS_TRACE_ANSWER, 0, 10, 11, 12, 13);
        break;
    case 11: /* a ninth request while 8 wait for their answers (no receive posted) */
        raw_trace_ninth(0);
        return;
    case 12: /* STREAM: a request for a send whose last byte has arrived already */
        raw_st_write(sb, 8, 0);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        raw_trace(0, 8, 5, 0, 0, 0);
        ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN); /* a receive would get the bytes */
        ck_assert_pv(pp.b.conn, EXS_PV_TRACE);
        raw_close();
        return;
    case 13: /* STREAM: a request with answer fields */
        raw_trace(0, 8, 5, 6, 0, 0);
        break;
    case 14: /* STREAM: an answer for an offset no traced send ends at (b's ends at 20) */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER, 19, 10, 11, 12, 13);
        break;
    case 15: /* STREAM: an answer with times out of order */
        b_sends_traced(&s, sb);
        sent = 1;
        raw_trace(EXS_TRACE_ANSWER, 20, 10, 11, 12, 9);
        break;
    default: /* STREAM: a ninth request while 8 arrived sends wait for a receive */
        raw_trace_ninth(1);
        return;
    }
    expect_pv(_i == 1 ? EXS_PV_CTRL_SIZE : _i == 3 || _i == 8 ? EXS_PV_RESERVED : EXS_PV_TRACE);
    if (sent)
        pt_op_fini(&s);
    raw_close();
}
END_TEST

/* A peer whose hello lacks feature TRACE (on STREAM: STRACE): b never sends it a TRACE
 * record, and one it sends anyway resets the connection. */
START_TEST(hs_trace_without_feature)
{
    static uint8_t sb[20];
    struct pt_op s;
    struct exs_prov_cqe cqe;
    int stream = _i >= 2;

    raw_features = EXS_WIRE_FEAT_ALL & ~(stream ? EXS_WIRE_FEAT_STRACE : EXS_WIRE_FEAT_TRACE);
    raw_open(stream ? SOCK_STREAM : SOCK_SEQPACKET);
    raw_features = EXS_WIRE_FEAT_ALL;
    b_sends_traced(&s, sb);
    while (exs__prov_poll(raw.ctx, &cqe, 1) == 1)
        if (cqe.status == EXS_PROV_WC_SUCCESS && cqe.opcode == EXS_PROV_WC_RECV)
            ck_assert_uint_ne(raw.mem[512 * cqe.wr_id], EXS_CTRL_TRACE);
    ck_assert_ptr_null(pp.b.conn->rt);
    if (_i & 1) {
        raw_trace(0, stream ? 8 : 0, 5, 0, 0, 0); /* otherwise well formed */
        expect_pv(EXS_PV_FEATURE);
    } else {
        exs__conn_close(pp.b.conn);
    }
    pt_op_fini(&s);
    raw_close();
}
END_TEST

/* ---- TRACE on STREAM (§5.1, feature STRACE) ---- */

struct rt_collect {
    struct exs_wire_trace *out;
    int n, k;
};

static int rt_collect_one(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                          uint32_t rlen)
{
    struct rt_collect *c = arg;

    if (h->type == EXS_CTRL_TRACE && c->k < c->n) {
        ck_assert_uint_eq(rlen, EXS_WIRE_TRACE_LEN);
        memcpy(&c->out[c->k++], rec, sizeof(*c->out));
    }
    return 0;
}

/* The TRACE records b sent raw since the last poll (at most n, as received); *data_first:
 * whether a data write reached raw before the first of them. */
static int raw_traces(struct exs_wire_trace *out, int n, int *data_first)
{
    struct exs_prov_cqe cqe;
    int k = 0, data = 0;

    while (exs__prov_poll(raw.ctx, &cqe, 1) == 1) {
        const uint8_t *m = raw.mem + 512 * cqe.wr_id;

        if (cqe.status != EXS_PROV_WC_SUCCESS)
            continue;
        if (cqe.opcode == EXS_PROV_WC_RECV_RDMA_WITH_IMM && !k)
            data = 1;
        if (cqe.opcode != EXS_PROV_WC_RECV)
            continue;
        struct rt_collect c = {.out = out, .n = n, .k = k};

        ck_assert_int_eq(exs__wire_walk(m, cqe.byte_len, rt_collect_one, &c), 0);
        k = c.k;
    }
    if (data_first)
        *data_first = data;
    return k;
}

/* raw writes len stream bytes into b's ring at ring offset off */
static void raw_st_write(const uint8_t *data, uint32_t len, uint64_t off)
{
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, data, len, raw.peer.ring_addr + off,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
}

/* Nine TRACE requests from raw, each but the last followed by its data (SEQPACKET: an eager
 * message; STREAM: one byte), none received: the ninth, with EXS_REQTRACE_SLOTS waiting, resets
 * the connection. Closes raw. */
static void raw_trace_ninth(int stream)
{
    static const uint8_t data[8];

    for (int i = 0; i < 9; i++) {
        raw_trace(0, (uint64_t)i + (stream ? 1 : 0), 5, 0, 0, 0);
        if (i < 8 && stream)
            raw_st_write(data, 1, (uint64_t)i);
        else if (i < 8)
            raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, data, 8,
                     raw.peer.ring_addr + 64u * (uint64_t)i, raw.peer.ring_rkey,
                     exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        pt_run(&pp);
        if (i < 8)
            ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    }
    /* reset: the data is still handed to receives (§6, §7), so look at the connection */
    ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_pv(pp.b.conn, EXS_PV_TRACE);
    raw_close();
}

/* Both directions of a traced STREAM send: b answers raw's traced 8 bytes once they are in a
 * receive, with ordered times; b's own traced send is preceded by its request, which names
 * the offset past its last byte, and raw's answer completes b's trace. */
START_TEST(hs_trace_stream_ok)
{
    static uint8_t sb[20], rb[64];
    struct pt_op s, r;
    struct exs_wire_trace t[4];
    uint64_t before = exs__reqtrace_completed();
    int data_first = 0;

    raw_open(SOCK_STREAM);
    raw_trace(0, 12, 5, 0, 0, 0); /* for a send of 12 bytes, cancelled before it went */
    raw_trace(0, 8, 6, 0, 0, 0);  /* the next send takes its place: replaces it */
    raw_st_write(sb, 8, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(raw_traces(t, 4, NULL), 0); /* arrived, in no receive yet */
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, 8);
    ck_assert_int_eq(raw_traces(t, 4, NULL), 1); /* one answer: the replaced request had none */
    ck_assert_uint_eq(t[0].hdr.flags, EXS_TRACE_ANSWER);
    ck_assert_uint_eq(be64toh(t[0].seq), 8);
    ck_assert_uint_gt(be64toh(t[0].t_req), 0);
    ck_assert_uint_le(be64toh(t[0].t_req), be64toh(t[0].t_arrival));
    ck_assert_uint_le(be64toh(t[0].t_arrival), be64toh(t[0].t_delivery));
    ck_assert_uint_le(be64toh(t[0].t_delivery), be64toh(t[0].t_answer));

    b_sends_traced(&s, sb);
    ck_assert_int_eq(raw_traces(t, 4, &data_first), 1);
    ck_assert_int_eq(data_first, 0); /* the request went before the bytes */
    ck_assert_uint_eq(t[0].hdr.flags, 0);
    ck_assert_uint_eq(be64toh(t[0].seq), 20);
    ck_assert_uint_gt(be64toh(t[0].t_req), 0);
    ck_assert_uint_eq(exs__reqtrace_completed(), before);
    raw_trace(EXS_TRACE_ANSWER, 20, 10, 11, 12, 13);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(exs__reqtrace_completed(), before + 1);
    pt_op_fini(&r);
    pt_op_fini(&s);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

static int match_op(struct exs_op *op, void *arg)
{
    return op == arg;
}

/* STREAM, b sending: a traced send whose bytes wait for ring room after its request went
 * can no longer be cancelled (a request never goes stale on a stream); once raw frees its
 * ring the bytes follow, and raw's answer completes the trace, leaving no slot behind. */
START_TEST(hs_trace_stream_waiting)
{
    static uint8_t fill[4096], sb[20];
    struct pt_op f, s;
    struct exs_wire_trace t[4];
    uint64_t before = exs__reqtrace_completed(), consumed = htobe64(4096);

    raw_open(SOCK_STREAM);
    pt_op_init(&f, &pp.b, EXS_OP_SEND, fill, sizeof(fill), 0); /* fills raw's ring */
    ck_assert_int_eq(pt_post(&f), 0);
    pt_run(&pp);
    ck_assert_int_eq(f.done, 1);
    (void)raw_traces(t, 4, NULL);
    exs__params.trace_sample_mask = UINT64_MAX;
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, 20, 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    exs__params.trace_sample_mask = 0;
    ck_assert_int_eq(raw_traces(t, 4, NULL), 1); /* its request went; its bytes wait */
    ck_assert_uint_eq(t[0].hdr.flags, 0);
    ck_assert_uint_eq(be64toh(t[0].seq), 4096 + 20);
    ck_assert_int_eq(exs__conn_cancel(pp.b.conn, match_op, &s.op), 0);
    ck_assert_int_eq(s.done, 0);
    raw_ctrl(EXS_CTRL_ACK, EXS_WIRE_ACK_LEN, 0, &consumed, sizeof(consumed)); /* room */
    pt_run(&pp);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(s.op.err, 0);
    raw_trace(EXS_TRACE_ANSWER, 4096 + 20, 10, 11, 12, 13);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(exs__reqtrace_completed(), before + 1);
    for (unsigned i = 0; i < EXS_REQTRACE_SLOTS; i++)
        ck_assert_int_eq(pp.b.conn->rt->tx[i].used, 0);
    pt_op_fini(&f);
    pt_op_fini(&s);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* ---- §7.4 RESIZE ---- */

/* A RESIZE record from the raw peer (flags, addr, size, rkey, pos; host order). */
static void raw_resize(uint8_t flags, uint64_t addr, uint32_t size, uint32_t rkey, uint64_t pos)
{
    struct exs_wire_resize r = {
        .hdr = {.type = EXS_CTRL_RESIZE, .flags = flags, .len = htobe16(EXS_WIRE_RESIZE_LEN)},
        .addr = htobe64(addr),
        .size = htobe32(size),
        .rkey = htobe32(rkey),
        .pos = htobe64(pos),
    };

    raw_post(EXS_PROV_WR_SEND, &r, sizeof(r), 0, 0, 0);
}

/* b (the data sender) puts len bytes of the stream at offset off into raw's ring. */
static void raw_b_sends(struct pt_op *s, uint8_t *sb, size_t len, uint64_t off)
{
    pt_fill(sb, len, off);
    pt_op_init(s, &pp.b, EXS_OP_SEND, sb, len, 0);
    ck_assert_int_eq(pt_post(s), 0);
    pt_run(&pp);
    pt_assert_done(s, (ssize_t)len, 0);
}

#define RAW_NEW_RING (RAW_SEND + 32768) /* the region raw offers (in raw.mr) */

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* raw (the ring's owner) offers a new 2 KiB region after 100 ring bytes: b answers
 * SWITCHED at ring position 100 and writes its next bytes at offset 100 of the new
 * region, none into the old one. */
START_TEST(hs_resize_honoured)
{
    static uint8_t sb[100], sb2[300];
    struct exs_wire_resize ans;
    struct pt_op s, s2;

    raw_open(SOCK_STREAM);
    raw_b_sends(&s, sb, sizeof(sb), 0);
    ck_assert(pt_check(raw.mem + RAW_RING, 100, 0));
    raw_resize(0, (uintptr_t)raw.mem + RAW_NEW_RING, 2048, raw.mr->rkey, 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_RESIZE, &ans, sizeof(ans)));
    ck_assert_uint_eq(ans.hdr.flags, EXS_RESIZE_SWITCHED);
    ck_assert_uint_eq(be16toh(ans.hdr.len), EXS_WIRE_RESIZE_LEN);
    ck_assert_uint_eq(be64toh(ans.pos), 100);
    ck_assert_uint_eq(be32toh(ans.size), 2048);
    ck_assert_uint_eq(be64toh(ans.addr), 0);
    ck_assert_uint_eq(be32toh(ans.rkey), 0);
    memset(raw.mem + RAW_RING + 100, 0, 300);
    raw_b_sends(&s2, sb2, sizeof(sb2), 100);
    ck_assert(pt_check(raw.mem + RAW_NEW_RING + 100, 300, 100));
    ck_assert(all_zero(raw.mem + RAW_RING + 100, 300));
    ck_assert_uint_eq(pp.b.conn->peer.ring_size, 2048);
    pt_op_fini(&s);
    pt_op_fini(&s2);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* Hostile offers (b is the writer): 0 size above the wire limit, 1 size not a multiple
 * of 64, 2 below the smallest region, 3 address 0, 4 address not aligned, 5 region
 * wrapping the address space, 6 pos not 0, 7 a second offer before b answered, 8 an
 * unsolicited SWITCHED, 9 unknown flags, 10 on a SEQPACKET conn. */
START_TEST(hs_resize_bad_offer)
{
    uint64_t addr = (uintptr_t)raw.mem + RAW_NEW_RING;
    uint32_t key;

    raw_open(_i == 10 ? SOCK_SEQPACKET : SOCK_STREAM);
    addr = (uintptr_t)raw.mem + RAW_NEW_RING;
    key = raw.mr->rkey;
    switch (_i) {
    case 0:
        raw_resize(0, addr, EXS_WIRE_RING_SIZE_MAX + 64, key, 0);
        break;
    case 1:
        raw_resize(0, addr, 2048 + 8, key, 0);
        break;
    case 2:
        raw_resize(0, addr, EXS_WIRE_RESIZE_MIN - 64, key, 0);
        break;
    case 3:
        raw_resize(0, 0, 2048, key, 0);
        break;
    case 4:
        raw_resize(0, addr + 8, 2048, key, 0);
        break;
    case 5:
        raw_resize(0, UINT64_MAX - 1023, 2048, key, 0);
        break;
    case 6:
        raw_resize(0, addr, 2048, key, 64);
        break;
    case 7: {
        struct exs_wire_resize r[2] = {
            {.hdr = {.type = EXS_CTRL_RESIZE, .len = htobe16(EXS_WIRE_RESIZE_LEN)},
             .addr = htobe64(addr),
             .size = htobe32(2048),
             .rkey = htobe32(key)},
            {.hdr = {.type = EXS_CTRL_RESIZE, .len = htobe16(EXS_WIRE_RESIZE_LEN)},
             .addr = htobe64(addr),
             .size = htobe32(1024),
             .rkey = htobe32(key)},
        };
        raw_post(EXS_PROV_WR_SEND, r, sizeof(r), 0, 0, 0);
        break;
    }
    case 8:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 2048, 0, 0);
        break;
    case 9:
        raw_resize(2, addr, 2048, key, 0);
        break;
    default:
        raw_resize(0, addr, 2048, key, 0);
        break;
    }
    expect_pv(_i == 10 ? EXS_PV_SOCK_TYPE : _i == 9 ? EXS_PV_RESERVED : EXS_PV_RESIZE);
    raw_close();
}
END_TEST

/* b (the ring's owner) offers 8 KiB after raw wrote 100 ring bytes; raw answers. */
static void raw_b_offers(struct exs_wire_resize *offer)
{
    static uint8_t msg[100];

    pt_fill(msg, sizeof(msg), 0);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    pt_run(&pp);
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 8192, 0), 0);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 8192, 0), -EBUSY);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_RESIZE, offer, sizeof(*offer)));
    ck_assert_uint_eq(offer->hdr.flags, 0);
    ck_assert_uint_eq(be32toh(offer->size), 8192);
    ck_assert_uint_eq(be64toh(offer->pos), 0);
}

/* A correct answer: raw's next ring bytes go to offset 100 of the new region; b hands
 * out the 100 old bytes, then the new ones, in order; the old key is dead (raw's write
 * with it fails, the old region is untouched). */
START_TEST(hs_resize_switched)
{
    static uint8_t rb[400];
    struct exs_wire_resize offer;
    struct exs_sock_stats st;
    uint8_t msg[200];
    struct pt_op r;

    raw_open(SOCK_STREAM);
    raw_b_offers(&offer);
    raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, 0, 100);
    pt_run(&pp); /* (raw's send area is reused below) */
    pt_fill(msg, sizeof(msg), 100);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), be64toh(offer.addr) + 100,
             be32toh(offer.rkey), exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 0);
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    pt_assert_done(&r, 300, 0);
    ck_assert(pt_check(rb, 300, 0));
    ck_assert_ptr_null(pp.b.conn->autotune.old_mem); /* consumed: retired */
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.ring_resizes, 1);
    ck_assert_uint_eq(st.ring_size, 8192);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS); /* the SWITCHED */
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS); /* the write into the new region */
    memset(msg, 0xee, sizeof(msg));
    raw_post(EXS_PROV_WR_RDMA_WRITE, msg, 64, raw.peer.ring_addr, raw.peer.ring_rkey, 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_REM_ACCESS_ERR);
    pt_op_fini(&r);
    exs__prov_ep_destroy(raw.ep); /* raw's ep is in ERROR now */
    raw.ep = NULL;
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    exs__prov_mr_dereg(raw.mr);
    exs__prov_ctx_close(raw.ctx);
    pt_close(&pp);
    ck_assert_uint_eq(exs__conn_ring_bytes(), 0);
}
END_TEST

/* Hostile answers to b's offer: 0 a position in the past, 1 one in the future, 2 another
 * size, 3 an address, 4 a key, 5 a second SWITCHED after the right one. */
START_TEST(hs_resize_bad_answer)
{
    struct exs_wire_resize offer;

    raw_open(SOCK_STREAM);
    raw_b_offers(&offer);
    switch (_i) {
    case 0:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, 0, 50);
        break;
    case 1:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, 0, 150);
        break;
    case 2:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 4096, 0, 100);
        break;
    case 3:
        raw_resize(EXS_RESIZE_SWITCHED, be64toh(offer.addr), 8192, 0, 100);
        break;
    case 4:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, be32toh(offer.rkey), 100);
        break;
    default:
        raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, 0, 100);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.dead, 0);
        raw_resize(EXS_RESIZE_SWITCHED, 0, 8192, 0, 100);
        break;
    }
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 1); /* (its 100 ring bytes would still be handed out) */
    ck_assert_pv(pp.b.conn, EXS_PV_RESIZE);
    raw_close();
    ck_assert_uint_eq(exs__conn_ring_bytes(), 0);
}
END_TEST

/* Fragmented direct messages (§6.2): pieces without eom fill the advertised receive, the
 * eom piece completes it with their sum (case 0). A piece past the advert, a piece with
 * trunc or no bytes, or anything but the next piece before the eom (an eager write, an
 * ANNOUNCE, a SHUTDOWN) is a protocol error and resets the conn. */
START_TEST(hs_frag_pieces)
{
    static uint8_t rb[4096];
    struct exs_wire_announce an = {
        .hdr = {.type = EXS_CTRL_ANNOUNCE, .len = htobe16(EXS_WIRE_ANNOUNCE_LEN)},
        .len = htobe32(8192),
        .seq = htobe64(0), /* the number the unfinished message holds */
    };
    struct exs_wire_shutdown sh = {
        .hdr = {.type = EXS_CTRL_SHUTDOWN, .len = htobe16(EXS_WIRE_SHUTDOWN_LEN)},
        .seq = htobe64(1), /* counting the unfinished message */
    };
    static uint8_t msg[4096];
    struct exs_wire_advert a;
    uint32_t tag, first = _i == 1 ? 3000 : 1000;
    uint64_t addr;
    struct pt_op r;
    /* the rule each variant breaks (0: none) */
    static const enum exs_pv_rule frag_rule[] = {
        EXS_PV_NONE, EXS_PV_DIRECT,   EXS_PV_FRAG,     EXS_PV_FRAG,
        EXS_PV_FRAG, EXS_PV_ANNOUNCE, EXS_PV_SHUTDOWN,
    };

    raw_open(SOCK_SEQPACKET);
    memset(rb, 0, sizeof(rb));
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ADVERT, &a, sizeof(a)));
    tag = be32toh(a.id);
    addr = be64toh(a.addr);
    pt_fill(msg, sizeof(msg), 9);
    switch (_i) {
    case 4: /* a piece that moves nothing */
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, addr, be32toh(a.rkey),
                 exs_imm_make(EXS_IMM_DIRECT, 0, 0, tag));
        break;
    case 3: /* trunc on a piece that is not the last */
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, first, addr, be32toh(a.rkey),
                 exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_TRUNC, 0, tag));
        break;
    default:
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, first, addr, be32toh(a.rkey),
                 exs_imm_make(EXS_IMM_DIRECT, 0, 0, tag));
        break;
    }
    pt_run(&pp);
    if (_i != 3 && _i != 4)
        ck_assert_int_eq(r.done, 0); /* a piece completes nothing */
    switch (_i) {
    case 0:
    case 1: /* the rest: fits (0), or 3000 + 2000 pass the advert's 4096 bytes (1; put
             * inside the buffer, where the grant lets it land: the sum is what is wrong) */
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, _i ? msg : msg + first, 2000,
                 _i ? addr : addr + first, be32toh(a.rkey),
                 exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, tag));
        break;
    case 2: /* the next message, eagerly, before this one's eom */
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, 64, raw.peer.ring_addr, raw.peer.ring_rkey,
                 exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        break;
    case 5:
        raw_ctrl(EXS_CTRL_ANNOUNCE, EXS_WIRE_ANNOUNCE_LEN, 0, (uint8_t *)&an + 8, sizeof(an) - 8);
        break;
    case 6:
        raw_ctrl(EXS_CTRL_SHUTDOWN, EXS_WIRE_SHUTDOWN_LEN, 0, (uint8_t *)&sh + 8, sizeof(sh) - 8);
        break;
    default:
        break;
    }
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    if (_i == 0) {
        ck_assert_int_eq(r.op.result, 3000);
        ck_assert_int_eq(r.op.rflags, 0);
        ck_assert(pt_check(rb, 3000, 9));
        pt_op_fini(&r);
        exs__conn_close(pp.b.conn);
    } else {
        ck_assert_int_eq(r.op.result, -1);
        ck_assert_int_eq(r.op.err, ECONNRESET);
        ck_assert_pv(pp.b.conn, frag_rule[_i]);
        pt_op_fini(&r);
    }
    raw_close();
}
END_TEST

/* ---- §9.2 SESSION and RESUME ---- */

/* b resumable, the raw peer's hello with bit 7 (_i == 0) or without (_i == 1): b's
 * first SEND carries a SESSION record after RING exactly when both have the bit; the
 * connection works either way. */
START_TEST(hs_session_sent)
{
    static uint8_t rb[100];
    struct pt_op r;
    uint8_t msg[50];

    b_resumable = 1;
    raw_features = EXS_WIRE_FEAT_ALL | (_i ? 0 : EXS_WIRE_FEAT_RESUMABLE);
    raw_open(SOCK_SEQPACKET);
    b_resumable = 0;
    raw_features = EXS_WIRE_FEAT_ALL;
    if (_i) {
        ck_assert_uint_eq(raw.session, 0);
        ck_assert_uint_eq(pp.b.conn->sess_token, 0);
    } else {
        ck_assert_uint_ne(raw.session, 0);
        ck_assert_uint_eq(raw.session, pp.b.conn->sess_token);
    }
    pt_fill(msg, sizeof(msg), 5);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, 50);
    ck_assert(pt_check(rb, 50, 5));
    pt_op_fini(&r);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* Records of the cut-over the passive side b must refuse (each resets the connection):
 *  0 a SESSION when the raw peer's hello lacks bit 7        1 a second SESSION of the active side
 *  2 a SESSION of a wrong length                            3 a RESUME with b's own token
 *  4 a RESUME with a wrong token                            5 a RESUME beyond what b sent
 *  6 a RESUME on a connection that is not resumable (b not) 7 a RESUME of a wrong length
 *  8 a second RESUME after a refused one cannot come: the first already reset; instead a
 *    RESUME on a STREAM connection (positions 0)
 *  9 an AUTH (valid only first on a resume request's new path, taken by its trial) on a
 *    connection's first path */
START_TEST(hs_resume_bad)
{
    static const uint8_t zero[EXS_WIRE_SESSION_LEN];
    struct exs_wire_session ss = {.key = {0x12, 0x34}};
    struct exs_wire_resume rs = {.token = 0};
    int sock_type = _i == 8 ? SOCK_STREAM : SOCK_SEQPACKET;

    b_resumable = _i != 6;
    raw_features = EXS_WIRE_FEAT_ALL | (_i == 0 || _i == 6 ? 0 : EXS_WIRE_FEAT_RESUMABLE);
    raw_open(sock_type);
    b_resumable = 0;
    raw_features = EXS_WIRE_FEAT_ALL;
    ck_assert_uint_eq(raw.session, pp.b.conn->sess_token);
    ck_assert(_i == 0 || _i == 6 ? raw.session == 0 : raw.session != 0);
    rs.token = htobe64(_i == 4 ? raw.session + 1 : raw.session);
    rs.rx_msgs = htobe64(_i == 5 ? 1000 : 0);
    switch (_i) {
    case 1: /* the first is taken (the raw peer's K_A) */
        raw_ctrl(EXS_CTRL_SESSION, EXS_WIRE_SESSION_LEN, 0, (uint8_t *)&ss + 8, sizeof(ss) - 8);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        ck_assert_int_eq(pp.b.conn->resume.keys, EXS_RSM_KEY_OWN | EXS_RSM_KEY_PEER);
        /* fall through: a second one */
    case 0:
        raw_ctrl(EXS_CTRL_SESSION, EXS_WIRE_SESSION_LEN, 0, (uint8_t *)&ss + 8, sizeof(ss) - 8);
        break;
    case 2: /* (the SEND as long as the record says: its length is the type's that is wrong) */
        raw_ctrl(EXS_CTRL_SESSION, EXS_WIRE_SESSION_LEN + 8, 0, zero, EXS_WIRE_SESSION_LEN);
        break;
    case 7:
        raw_ctrl(EXS_CTRL_RESUME, EXS_WIRE_RESUME_LEN - 8, 0, zero, EXS_WIRE_RESUME_LEN - 16);
        break;
    case 9: {
        struct exs_wire_auth au = {.mac = {1}};

        raw_ctrl(EXS_CTRL_AUTH, EXS_WIRE_AUTH_LEN, 0, (uint8_t *)&au + 8, sizeof(au) - 8);
        break;
    }
    default:
        raw_ctrl(EXS_CTRL_RESUME, EXS_WIRE_RESUME_LEN, 0, (uint8_t *)&rs + 8, sizeof(rs) - 8);
        break;
    }
    expect_pv(_i == 0              ? EXS_PV_FEATURE
              : _i == 1            ? EXS_PV_SESSION
              : _i == 2 || _i == 7 ? EXS_PV_CTRL_SIZE
              : _i == 9            ? EXS_PV_AUTH
                                   : EXS_PV_RESUME);
    raw_close();
}
END_TEST

/* ---- shm chosen by itself: SHM_OFFER and SHM_SWITCH (spec/provider-shm.md) ---- */

/* b (passive) has shm on and is resumable; the raw peer (active) speaks the records:
 *  0 an SHM_OFFER when its hello lacks bit 10 (rule feature)
 *  1 a second SHM_OFFER (rule shm)                     2 an SHM_SWITCH from the active side (shm)
 *  3 an SHM_OFFER with a reserved byte set (reserved)
 *  4 a matching offer (b's own): b answers SHM_SWITCH and stays connected
 *  5 an offer of another host: b stays on its path, says why, sends no SHM_SWITCH
 *  6 a matching offer, then the raw peer declines (SHM_SWITCH flag DECLINED): b stays on
 *    its path, says "peer declined the switch" and has given up the cut-over
 *  7 DECLINED after an offer of another host (no SHM_SWITCH of b's to decline) (shm)
 *  8 a second DECLINED (shm)                           9 SHM_SWITCH with flag 2 (reserved)
 * A refused record resets the connection with its rule kept. */
static void raw_shm_switch(uint8_t flags)
{
    struct exs_wire_ctrl_hdr h = {
        .type = EXS_CTRL_SHM_SWITCH, .flags = flags, .len = htobe16(EXS_WIRE_SHM_SWITCH_LEN)};

    raw_post(EXS_PROV_WR_SEND, &h, sizeof(h), 0, 0, 0);
}

START_TEST(hs_shm_records)
{
    static const unsigned want_rule[4] = {EXS_PV_FEATURE, EXS_PV_SHM, EXS_PV_SHM, EXS_PV_RESERVED};
    struct exs_wire_shm_offer o;
    struct exs_pv_state pv;
    char path[EXS_PATH_MAX];

    b_resumable = b_shm = 1;
    raw_features = EXS_WIRE_FEAT_ALL | EXS_WIRE_FEAT_RESUMABLE | (_i ? EXS_WIRE_FEAT_SHM : 0);
    raw_open(SOCK_SEQPACKET);
    b_resumable = b_shm = 0;
    raw_features = EXS_WIRE_FEAT_ALL;
    /* b offers only to a peer with the bit */
    ck_assert_int_eq(raw.offer.hdr.type, _i ? EXS_CTRL_SHM_OFFER : 0);
    ck_assert_int_eq(pp.b.conn->shmsw.sent, !!_i);
    o = raw.offer;
    o.hdr.type = EXS_CTRL_SHM_OFFER;
    o.hdr.len = htobe16(EXS_WIRE_SHM_OFFER_LEN);
    if (_i == 3)
        o.rsvd[5] = 1;
    if (_i == 5 || _i == 7)
        o.host_id[0] ^= 0xff;
    if (_i == 2)
        raw_ctrl(EXS_CTRL_SHM_SWITCH, EXS_WIRE_SHM_SWITCH_LEN, 0, NULL, 0);
    else
        raw_ctrl(EXS_CTRL_SHM_OFFER, EXS_WIRE_SHM_OFFER_LEN, 0, (uint8_t *)&o + 8, sizeof(o) - 8);
    if (_i == 1) { /* the first is taken */
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        raw_ctrl(EXS_CTRL_SHM_OFFER, EXS_WIRE_SHM_OFFER_LEN, 0, (uint8_t *)&o + 8, sizeof(o) - 8);
    }
    if (_i < 4) {
        expect_reset();
        ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), 0);
        ck_assert_uint_eq(pv.rule, want_rule[_i]);
        raw_close();
        return;
    }
    pt_run(&pp);
    if (_i >= 6) {
        raw_shm_switch(_i == 9 ? 2 : EXS_WIRE_SHM_SWITCH_DECLINED);
        if (_i == 8) { /* the first is taken */
            pt_run(&pp);
            ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
            raw_shm_switch(EXS_WIRE_SHM_SWITCH_DECLINED);
        }
        if (_i > 6) {
            expect_reset();
            ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), 0);
            ck_assert_uint_eq(pv.rule, _i == 9 ? EXS_PV_RESERVED : EXS_PV_SHM);
            raw_close();
            return;
        }
        pt_run(&pp);
    }
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->shmsw.sw, _i == 4 || _i == 6);
    /* the cut-over is kept only while the switch may still come */
    ck_assert_int_eq(pp.b.conn->resume.over, _i != 4);
    ck_assert_int_eq(exs__conn_path(pp.b.conn, path, sizeof(path)), (int)strlen(path) + 1);
    ck_assert_str_eq(strchr(path, ':'), _i == 4   ? ": switching"
                                        : _i == 6 ? ": peer declined the switch"
                                                  : ": other host");
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* A connected mock pair of this type on which both ends are resumable (policy any): the
 * passive side has drawn the SESSION token. */
static void rs_pair_open(int type)
{
    unit_pair_fresh(&pp, type, 1, 1);
    pt_connect(&pp);
}

static int on_session(struct exs_conn *conn, const struct exs_wire_session *ss)
{
    int ret;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    ret = exs__resume_on_session_locked(conn, ss);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* A side refuses a SESSION it cannot take: a second one (the active side's _i 0, the
 * passive side's _i 2), flags set (_i 1: the good one is then taken, and names the
 * session), or one on a connection where only it is resumable (_i 3) (each -EPROTO; the
 * caller resets). A key whose token is 0 is refused too: hs_session_token0. */
START_TEST(hs_session_active_checks)
{
    struct exs_wire_session ss = {
        .hdr = {.type = EXS_CTRL_SESSION, .len = htobe16(EXS_WIRE_SESSION_LEN)},
        .key = {77},
    };
    uint8_t d[EXS_SHA256_LEN];
    uint64_t token;

    unit_pair_fresh(&pp, SOCK_STREAM, 1, _i != 3);
    pt_connect(&pp);
    token = pp.a.conn->sess_token;
    ck_assert(_i == 3 ? token == 0 : token != 0);
    ck_assert(_i == 3 ? pp.b.conn->sess_token == 0 : pp.b.conn->sess_token == token);
    if (_i == 0 || _i == 3) { /* a second one; the peer lacks the bit */
        ck_assert_int_eq(on_session(pp.a.conn, &ss), -EPROTO);
        ck_assert_pv_take(pp.a.conn, _i ? EXS_PV_FEATURE : EXS_PV_SESSION);
    } else if (_i == 2) {
        ck_assert_int_eq(on_session(pp.b.conn, &ss), -EPROTO);
        ck_assert_pv_take(pp.b.conn, EXS_PV_SESSION);
    } else {
        pp.a.conn->sess_token = 0; /* as if none had come yet */
        pp.a.conn->resume.keys &= ~EXS_RSM_KEY_PEER;
        ss.hdr.flags = 1;
        ck_assert_int_eq(on_session(pp.a.conn, &ss), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESERVED);
        ss.hdr.flags = 0; /* and the good one is taken */
        ck_assert_int_eq(on_session(pp.a.conn, &ss), 0);
        exs__sha256(ss.key, sizeof(ss.key), d);
        memcpy(&token, d, sizeof(token));
        ck_assert_uint_eq(pp.a.conn->sess_token, be64toh(token));
        ck_assert_int_eq(memcmp(pp.a.conn->resume.key + EXS_WIRE_SESSION_KEY_LEN, ss.key, 32), 0);
    }
    pt_close_both(&pp);
}
END_TEST

/* The active side handled a SESSION before its ESTABLISHED event (the peer's hello not yet
 * adopted; the tcp provider can deliver the peer's first SEND first): at ESTABLISHED a
 * peer hello without bit 7 makes that a protocol error, and the connection is reset. */
START_TEST(hs_session_early_without_bit)
{
    unit_pair_fresh(&pp, SOCK_STREAM, 1, 0);
    pt_connect(&pp);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(pp.a.conn->sess_token, 0);
    pp.a.conn->sess_token = 99; /* as if taken before the hello was adopted */
    pp.a.conn->resume.keys |= EXS_RSM_KEY_PEER;
    exs__resume_established_locked(pp.a.conn);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(pp.a.conn->err, ECONNRESET);
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_pv(pp.a.conn, EXS_PV_FEATURE);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.dead, 1);
    pt_close_both(&pp);
}
END_TEST

static int check_resume(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    int ret;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    ret = exs__resume_check_locked(conn, r);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* The RESUME of a new path (§9.2), hostile until checked. a sends b 5000 bytes (STREAM,
 * _i 0) or 3 messages (SEQPACKET, _i 1); b's own RESUME then states exactly what arrived
 * and passes a's check; a refuses every record that breaks a rule: flags, another token,
 * the other kind's position, beyond what a sent, below what a saw completed. */
START_TEST(hs_resume_positions)
{
    int stream = _i == 0, type = stream ? SOCK_STREAM : SOCK_SEQPACKET;
    uint64_t want = stream ? 5000 : 3;
    static uint8_t sb[3][5000], rb[3][5000];
    struct pt_op s[3], r[3];
    struct exs_wire_resume rec, bad;
    int nops = stream ? 1 : 3;

    rs_pair_open(type);
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    ck_assert_uint_eq(pp.a.conn->sess_token, pp.b.conn->sess_token);
    for (int i = 0; i < nops; i++) {
        size_t len = stream ? sizeof(sb[i]) : 100;

        pt_recv_post(&r[i], &pp.b, rb[i], len, stream ? MSG_WAITALL : 0);
        pt_send_pattern(&s[i], &pp.a, sb[i], len, 0);
    }
    pt_run(&pp);
    for (int i = 0; i < nops; i++) {
        ck_assert_int_eq(s[i].done, 1);
        ck_assert_int_eq(s[i].op.err, 0);
        ck_assert_int_eq(r[i].done, 1);
    }
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(exs__resume_arrived_locked(pp.b.conn), want);
    exs__resume_record_locked(pp.b.conn, &rec);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(rec.hdr.type, EXS_CTRL_RESUME);
    ck_assert_uint_eq(be16toh(rec.hdr.len), EXS_WIRE_RESUME_LEN);
    ck_assert_uint_eq(be64toh(rec.token), pp.b.conn->sess_token);
    ck_assert_uint_eq(be64toh(stream ? rec.rx_bytes : rec.rx_msgs), want);
    ck_assert_uint_eq(be64toh(stream ? rec.rx_msgs : rec.rx_bytes), 0);
    ck_assert_int_eq(check_resume(pp.a.conn, &rec), 0);
    /* STREAM: bytes seen completed; SEQPACKET: one past the last message seen completed */
    ck_assert_uint_eq(pp.a.conn->resume_tx_done, want);

    bad = rec;
    bad.hdr.flags = 1;
    ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESERVED);
    bad = rec;
    bad.token = htobe64(pp.a.conn->sess_token ^ 1);
    ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    bad = rec;
    if (stream)
        bad.rx_msgs = htobe64(1);
    else
        bad.rx_bytes = htobe64(1);
    ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    bad = rec;
    if (stream)
        bad.rx_bytes = htobe64(want + 1);
    else
        bad.rx_msgs = htobe64(want + 1);
    ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    if (stream) {
        /* every byte was seen completed: less cannot have arrived */
        bad = rec;
        bad.rx_bytes = htobe64(want - 1);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        /* with fewer seen completed (writes in flight), any position from there to what
         * was sent is taken */
        EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        pp.a.conn->resume_tx_done = want - 100;
        EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), 0);
        bad.rx_bytes = htobe64(want - 100);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), 0);
        bad.rx_bytes = htobe64(want - 101);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    } else {
        /* every message was seen completed: fewer cannot have arrived */
        bad = rec;
        bad.rx_msgs = htobe64(want - 1);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        bad.rx_msgs = htobe64(0);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        /* with only message 0 seen completed, 1 to what was sent is taken, 0 not */
        EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        pp.a.conn->resume_tx_done = 1;
        EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        bad.rx_msgs = htobe64(1);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), 0);
        bad.rx_msgs = htobe64(want - 1);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), 0);
        bad.rx_msgs = htobe64(0);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    }
    {
        /* the ring positions (the writer continues from them, STREAM and SEQPACKET):
         * what arrived of what was written, at least what was reported read, at most a
         * ring's worth unread */
        uint64_t tail, cons, size, saved_tail;

        EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        pp.a.conn->resume_tx_done = want;
        saved_tail = pp.a.conn->wr_tail;
        cons = pp.a.conn->wr_consumed;
        tail = pp.a.conn->wr_tail = cons + 64; /* 64 bytes written, not reported read */
        size = pp.a.conn->peer.ring_size;
        EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        bad = rec;
        bad.ring_arrived = htobe64(tail);
        bad.ring_consumed = htobe64(cons);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), 0);
        bad.ring_arrived = htobe64(tail + 1); /* more than was written */
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        bad.ring_arrived = htobe64(cons);
        bad.ring_consumed = htobe64(cons + 1); /* read more than arrived */
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        if (cons) {
            bad.ring_consumed = htobe64(cons - 1); /* less than it reported */
            ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
            ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        }
        EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        pp.a.conn->wr_tail = cons + size + 64;
        EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        bad.ring_arrived = htobe64(cons + size + 64); /* more than a ring unread */
        bad.ring_consumed = htobe64(cons);
        ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
        ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
        EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
        pp.a.conn->wr_tail = saved_tail;
        EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    }
    /* a connection without a session takes no RESUME, whatever it says */
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->sess_token = 0;
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    bad = rec;
    bad.token = 0;
    ck_assert_int_eq(check_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    for (int i = 0; i < nops; i++) {
        pt_op_fini(&s[i]);
        pt_op_fini(&r[i]);
    }
    pt_close_both(&pp);
}
END_TEST

static int on_resume(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    int ret;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    ret = exs__resume_on_resume_locked(conn, r);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* The new path of a cut-over (§9.2), hostile until checked. A RESUME is taken only while
 * a new path waits for it: on a first path it is refused; one that overtook the
 * ESTABLISHED event is kept, and a second one refused; on an established new path a
 * RESUME that fails the checks (here: not the token) is refused and rewinds nothing. A
 * resume request is refused (reason 7, the request untouched) without a token, with
 * token 0, with a token no session has, or naming a session of the other socket type. */
START_TEST(hs_resume_new_path)
{
    struct exs_wire_resume rec, bad;
    struct exs_conn *pas;
    uint8_t pd[EXS_WIRE_RESUME_PD_LEN] = {0};
    uint64_t tok, sent;

    rs_pair_open(SOCK_STREAM);
    pas = pp.a.conn->active ? pp.b.conn : pp.a.conn;
    ck_assert_uint_ne(pas->sess_token, 0);
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    exs__resume_record_locked(pp.b.conn, &rec);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    /* a first path */
    ck_assert_int_eq(on_resume(pp.a.conn, &rec), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    /* a new path not yet established: kept once, a second one refused */
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->state = EXS_CONN_RESUMING;
    pp.a.conn->resume.peer_wait = 1;
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(on_resume(pp.a.conn, &rec), 0);
    ck_assert_int_eq(pp.a.conn->resume.peer_got, 1);
    ck_assert_int_eq(on_resume(pp.a.conn, &rec), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    /* an established new path: checked before anything moves */
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->state = EXS_CONN_CONNECTED;
    pp.a.conn->resume.peer_got = 0;
    sent = pp.a.conn->tx_seq;
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    bad = rec;
    bad.token = htobe64(pp.a.conn->sess_token + 1);
    ck_assert_int_eq(on_resume(pp.a.conn, &bad), -EPROTO);
    ck_assert_pv_take(pp.a.conn, EXS_PV_RESUME);
    ck_assert_uint_eq(pp.a.conn->tx_seq, sent);
    ck_assert_int_eq(pp.a.conn->resume.peer_wait, 1);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->resume.peer_wait = 0;
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);

    /* resume requests: refused before anything is touched (req NULL) */
    ck_assert_int_eq(exs__conn_resume_request(NULL, NULL, pd, EXS_WIRE_HELLO_LEN, SOCK_STREAM),
                     EXS_WIRE_REJ_RESUME);
    ck_assert_int_eq(exs__conn_resume_request(NULL, NULL, pd, sizeof(pd), SOCK_STREAM),
                     EXS_WIRE_REJ_RESUME);
    tok = htobe64(pas->sess_token ^ 0x8000000000000000ull);
    memcpy(pd + EXS_WIRE_HELLO_LEN, &tok, sizeof(tok));
    ck_assert_int_eq(exs__conn_resume_request(NULL, NULL, pd, sizeof(pd), SOCK_STREAM),
                     EXS_WIRE_REJ_RESUME);
    tok = htobe64(pas->sess_token);
    memcpy(pd + EXS_WIRE_HELLO_LEN, &tok, sizeof(tok));
    ck_assert_int_eq(exs__conn_resume_request(NULL, NULL, pd, sizeof(pd), SOCK_SEQPACKET),
                     EXS_WIRE_REJ_RESUME);
    ck_assert_int_eq(pas->state, EXS_CONN_CONNECTED);
    pt_close_both(&pp);
}
END_TEST

struct rq_arg {
    uint8_t pd[EXS_WIRE_RESUME_PD_LEN];
    int ret;
};

static void *rq_thread(void *a)
{
    struct rq_arg *q = a;

    q->ret = exs__conn_resume_request(NULL, NULL, q->pd, sizeof(q->pd), SOCK_STREAM);
    return NULL;
}

/* A resume request finds its session in the registry, then takes the conn's lock; the
 * conn's socket may be closed and the conn destroyed by another thread in between. The
 * finder holds the conn (resume.refs): destroy leaves it to the finder, which sees it DEAD,
 * refuses the request and frees it. Without the hold the conn is freed under the finder
 * (ASan: use after free) and the live count is off. */
START_TEST(hs_resume_request_vs_destroy)
{
    struct exs_conn *pas;
    struct rq_arg q;
    pthread_t th;
    uint64_t tok;
    int i;

    rs_pair_open(SOCK_STREAM);
    pas = pp.a.conn->active ? pp.b.conn : pp.a.conn;
    ck_assert_uint_ne(pas->sess_token, 0);
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(pas->state, EXS_CONN_DEAD);

    memset(&q, 0, sizeof(q));
    tok = htobe64(pas->sess_token);
    memcpy(q.pd + EXS_WIRE_HELLO_LEN, &tok, sizeof(tok));
    EXS_LITE_LOCK(&pas->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(pthread_create(&th, NULL, rq_thread, &q), 0);
    for (i = 0; i < 10000 && !__atomic_load_n(&pas->resume.refs, __ATOMIC_ACQUIRE); i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    ck_assert_uint_eq(__atomic_load_n(&pas->resume.refs, __ATOMIC_ACQUIRE), 1);
    /* the finder waits for the lock: destroy the conn now */
    exs__conn_destroy(pas);
    ck_assert_int_eq(exs__conn_live_count(), 2); /* not freed: the finder holds it */
    EXS_LITE_UNLOCK(&pas->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(q.ret, EXS_WIRE_REJ_RESUME);
    if (pp.a.conn == pas)
        pp.a.conn = NULL;
    else
        pp.b.conn = NULL;
    pt_close(&pp); /* asserts no conn is left: the finder freed it */
}
END_TEST

/* An established connection is looked at at least once a second (the window check,
 * spec §3.1) whatever the other periods: here it owes nothing, keepalive is off and the
 * send deadline's quarter is 30 s, so credits it comes to owe are still checked in time. */
START_TEST(hs_window_tick)
{
    uint64_t saved_send = exs__params.send_timeout_ms;

    unit_pair_fresh(&pp, SOCK_STREAM, 0, 0); /* not resumable: no cut-over look either */
    pt_connect(&pp);
    ck_assert_int_eq(exs__params_set("send_timeout_ms", "120000"), 0);
    for (int i = 0; i < 2; i++) {
        struct exs_conn *c = i ? pp.b.conn : pp.a.conn;
        uint64_t next;

        EXS_LITE_LOCK(&c->lock, EXS_LOCK_CONN);
        c->owed = 0; /* as after an ACK went */
        EXS_LITE_UNLOCK(&c->lock, EXS_LOCK_CONN);
        next = exs__conn_timer(c, 0);
        ck_assert_uint_ge(next, 1);
        ck_assert_uint_le(next, 1000);
    }
    pt_close_both(&pp);
    exs__params.send_timeout_ms = saved_send;
}
END_TEST

/* A connection that may be cut over is looked at four times per connect_timeout_ms, even
 * with keepalive (ka_ms 0) and the send deadline off, so a RESUMING begun between two
 * looks ends within 1.25 x its deadline (spec §9.2): at 2000 ms, within 500 ms (the
 * window check alone would look in 1000, the old rule in 2000). */
START_TEST(hs_resume_tick)
{
    uint64_t saved_conn = exs__params.connect_timeout_ms;
    uint64_t saved_send = exs__params.send_timeout_ms;

    rs_pair_open(SOCK_STREAM);
    ck_assert_int_eq(exs__params_set("connect_timeout_ms", "2000"), 0);
    ck_assert_int_eq(exs__params_set("send_timeout_ms", "0"), 0);
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    for (int i = 0; i < 2; i++) {
        uint64_t next = exs__conn_timer(i ? pp.b.conn : pp.a.conn, 0);

        ck_assert_uint_ge(next, 1);
        ck_assert_uint_le(next, 500);
    }
    pt_close_both(&pp);
    exs__params.connect_timeout_ms = saved_conn;
    exs__params.send_timeout_ms = saved_send;
}
END_TEST

/* A connection that failed before its ESTABLISHED (here: the protocol error a record could
 * raise) never reports through established(); with no provider event after it (the fabric
 * is not stepped), the handshake deadline still ends it: until then the timer waits, at
 * the deadline the conn dies and dead() is called once, with the latched ECONNRESET. */
START_TEST(hs_down_before_established_deadline)
{
    uint64_t conn_ms, saved;

    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    saved = exs__params.connect_timeout_ms;
    ck_assert_int_eq(exs__params_set("connect_timeout_ms", "30000"), 0);
    conn_ms = exs__params.connect_timeout_ms;
    memset(&pp, 0, sizeof(pp));
    mock_set_reorder(0);
    pt_params(&pp.pa, SOCK_STREAM);
    pt_params(&pp.pb, SOCK_STREAM);
    pt_open(&pp, SOCK_STREAM);
    pt_connect_to(&pp, NULL, 0);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTING);
    exs__conn_fail_locked(pp.a.conn, ECONNRESET, "test: protocol error before ESTABLISHED");
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DOWN);
    pp.a.conn->dl_start_ns = exs__now_ns(); /* the deadline is conn_ms away */
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_gt(exs__conn_timer(pp.a.conn, 0), 0);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(pp.a.dead, 0);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->dl_start_ns -= (conn_ms + 1) * 1000000u; /* the deadline passed */
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_eq(exs__conn_timer(pp.a.conn, 0), 0);
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_DEAD);
    ck_assert_int_eq(pp.a.conn->err, ECONNRESET);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.a.established, 0);
    /* what the fabric still delivers changes nothing: reported once */
    pt_run(&pp);
    ck_assert_int_eq(exs__conn_timer(pp.a.conn, 0), 0);
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.a.established, 0);
    if (pp.b.conn) {
        exs__conn_close(pp.b.conn);
        pt_run(&pp);
        ck_assert(exs__conn_is_dead(pp.b.conn));
    }
    pt_close(&pp);
    exs__params.connect_timeout_ms = saved;
}
END_TEST

/* The passive side's callbacks are the driver's (tests/mock/mock_proto.c). */
static const struct exs_conn_cb hb_cb = {.established = pt_on_established, .dead = pt_on_dead};

/* A hostile connector (the passive side of the early-record case): b accepts the raw
 * peer's request, and before b handles its ESTABLISHED the peer's first SEND, which breaks
 * the protocol (an unknown record), has completed at b (on verbs the receive completion
 * can overtake the connection event; the engine hands completions over first). The conn
 * goes DOWN from CONNECTING; the ESTABLISHED that follows changes nothing; the conn ends
 * once, through dead() with ECONNRESET and never through established(), which is how the
 * socket layer finishes the embryo and frees its backlog slot (exs/api/sock.c,
 * sock_conn_dead). _i 0: the provider's DISCONNECTED ends it (drained); _i 1: no provider
 * event comes, the handshake deadline ends it. Then the listener accepts a good
 * connection, and nothing leaks. */
START_TEST(hs_record_before_established)
{
    struct exs_wire_ctrl_hdr bad = {.type = 42, .len = htobe16(sizeof(bad))};
    struct sockaddr_storage ss;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe[16];
    struct exs_wire_hello h;
    uint64_t conn_ms = 0, saved = exs__params.connect_timeout_ms;
    socklen_t len;
    int n;

    raw_prepare(SOCK_SEQPACKET, &h);
    if (_i) {
        ck_assert_int_eq(exs__params_set("connect_timeout_ms", "30000"), 0);
        conn_ms = exs__params.connect_timeout_ms;
    }
    ck_assert_int_eq(exs__prov_listener_addr(pp.lis, &ss, &len), 0);
    ck_assert_int_eq(exs__prov_connect(raw.ep, (struct sockaddr *)&ss, len, &h, sizeof(h)), 0);
    /* b's listener takes the request as exs/api/sock.c does, and nothing more yet */
    ck_assert_int_eq(exs__prov_cm_poll(pp.b.ctx, &ev), 1);
    ck_assert_int_eq(ev.type, EXS_PROV_CM_CONNECT_REQUEST);
    ck_assert_int_eq(exs__conn_hello_check(ev.private_data, ev.private_data_len, SOCK_SEQPACKET),
                     0);
    ck_assert_int_eq(exs__conn_create(pp.b.ctx, &pp.pb, &hb_cb, &pp.b, &pp.b.conn), 0);
    ck_assert_int_eq(exs__conn_accept(pp.b.conn, ev.req, ev.private_data), 0);
    /* the raw peer is connected: its first SEND carries a record no peer may send */
    ck_assert_int_eq(exs__prov_cm_poll(raw.ctx, &ev), 1);
    ck_assert_int_eq(ev.type, EXS_PROV_CM_ESTABLISHED);
    raw_post(EXS_PROV_WR_SEND, &bad, sizeof(bad), 0, 0, 0);
    ck_assert_int_ge(mock_run_until_idle(1000), 1);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTING);
    /* b's progress: its completions first (the engine's order), the record among them */
    while ((n = exs__prov_poll(pp.b.ctx, cqe, 16)) > 0)
        exs__conn_on_cqes(cqe, n);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(pp.b.conn->err, ECONNRESET);
    ck_assert_pv(pp.b.conn, EXS_PV_CTRL_TYPE);
    ck_assert_int_eq(pp.b.established, 0);
    ck_assert_int_eq(pp.b.dead, 0);
    if (_i) {
        /* no provider event: the handshake deadline ends it */
        EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        pp.b.conn->dl_start_ns = exs__now_ns() - (conn_ms + 1) * 1000000u;
        EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        ck_assert_uint_eq(exs__conn_timer(pp.b.conn, 0), 0);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DEAD);
        ck_assert_int_eq(pp.b.dead, 1);
    }
    /* ESTABLISHED, then DISCONNECTED (the reset): ended once, never established */
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DEAD);
    ck_assert_int_eq(pp.b.conn->err, ECONNRESET);
    ck_assert_int_eq(pp.b.dead, 1);
    ck_assert_int_eq(pp.b.established, 0);
    ck_assert_uint_eq(exs__conn_timer(pp.b.conn, 0), 0);
    ck_assert_int_eq(pp.b.dead, 1);
    exs__params.connect_timeout_ms = saved;
    exs__conn_destroy(pp.b.conn);
    pp.b.conn = NULL;
    pp.b.dead = 0;
    exs__prov_ep_destroy(raw.ep);
    exs__prov_mr_dereg(raw.mr);
    exs__prov_ctx_close(raw.ctx);
    /* the listener still accepts: a good connection works */
    pt_connect(&pp);
    pt_close_both(&pp);
}
END_TEST

/* ---- re-announce after a cut (§9.2, Replay, SEQPACKET): raw is the sender ---- */

#define RAW_MSGS    (RAW_SEND + 4096) /* raw's announced messages: 4 KiB each from here */
#define RAW_MSG_LEN 3000u

/* raw (resumable) and b (resumable) connected: b holds a SESSION token. */
static void ra_open(void)
{
    b_resumable = 1;
    raw_features = EXS_WIRE_FEAT_ALL | EXS_WIRE_FEAT_RESUMABLE;
    raw_open(SOCK_SEQPACKET);
    b_resumable = 0;
    raw_features = EXS_WIRE_FEAT_ALL;
    ck_assert_uint_ne(pp.b.conn->sess_token, 0);
}

/* Message i of raw: RAW_MSG_LEN pattern bytes (offset 1000 * i) in its own slot. */
static uint8_t *ra_msg(uint32_t i)
{
    uint8_t *p = raw.mem + RAW_MSGS + 4096 * i;

    pt_fill(p, RAW_MSG_LEN, 1000 * (uint64_t)i);
    return p;
}

/* raw announces message i as number seq with key rkey (len bytes); b handles it. */
static void ra_announce(uint64_t seq, uint32_t i, uint32_t len, uint32_t rkey)
{
    struct exs_wire_announce a = {
        .addr = htobe64((uintptr_t)ra_msg(i)),
        .len = htobe32(len),
        .rkey = htobe32(rkey),
        .seq = htobe64(seq),
    };

    raw_ctrl(EXS_CTRL_ANNOUNCE, EXS_WIRE_ANNOUNCE_LEN, 0, (uint8_t *)&a + EXS_WIRE_CTRL_HDR_LEN,
             sizeof(a) - EXS_WIRE_CTRL_HDR_LEN);
    pt_run(&pp); /* raw's next post reuses its send area */
}

/* The cut as b's receiver sees it once the old path is over (resume.c calls this before
 * the new path): the number of its stale messages. */
static uint32_t ra_cut(void)
{
    uint32_t n;

    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    n = exs__seqpkt_resume_cut_locked(pp.b.conn);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    return n;
}

/* READ_DONE records raw received since the last look, and of those naming seq. */
struct ra_rd {
    uint64_t seq;
    uint32_t n, named;
};

static int ra_read_done_one(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                            uint32_t rlen)
{
    struct ra_rd *c = arg;
    struct exs_wire_read_done d;

    if (h->type != EXS_CTRL_READ_DONE || rlen < sizeof(d))
        return 0;
    memcpy(&d, rec, sizeof(d));
    c->n++;
    c->named += be64toh(d.seq) == c->seq;
    return 0;
}

static uint32_t ra_read_dones(uint64_t seq, uint32_t *named)
{
    struct ra_rd c = {.seq = seq};

    raw_each_record(ra_read_done_one, &c, 0);
    *named = c.named;
    return c.n;
}

/* A receive of b into rb: done with message i whole. */
static void ra_expect_msg(struct pt_op *r, uint8_t *rb, uint32_t i)
{
    pt_assert_done(r, (ssize_t)RAW_MSG_LEN, 0);
    ck_assert(pt_check(rb, RAW_MSG_LEN, 1000 * (uint64_t)i));
}

/* Announced messages b holds unread at a cut (no receive yet) lose their grants: after
 * the cut a receive does not READ them (they are stale) until raw announces each again
 * with a new key, the old key's registration gone; then each is read with the new key,
 * whole, once, into the receive it numbers, and answered with its READ_DONE; the window
 * closes at the first new message, which is read as usual. Without the stale mark the
 * receive READs with the dead key: REM_ACCESS_ERR, the connection fails. */
START_TEST(hs_reann_stale)
{
    static uint8_t rb[3][RAW_MSG_LEN];
    struct exs_prov_mr *mr_a, *mr_b;
    struct mock_stats st0, st;
    uint32_t named;
    struct pt_op r[3];

    ra_open();
    ck_assert_int_eq(exs__prov_mr_reg(raw.ctx, raw.mem + RAW_MSGS, 3 * 4096,
                                      EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_READ,
                                      &mr_a),
                     0);
    ra_announce(0, 0, RAW_MSG_LEN, mr_a->rkey);
    ra_announce(1, 1, RAW_MSG_LEN, mr_a->rkey);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(pp.b.conn->rx_seq, 2);
    ck_assert_uint_eq(pp.b.conn->pending_announced, 2);
    ck_assert_uint_eq(ra_cut(), 2);
    ck_assert_uint_eq(pp.b.conn->pending_announced, 2);
    ck_assert_uint_eq(pp.b.conn->rx_seq, 2); /* its RESUME still counts them arrived */
    exs__prov_mr_dereg(mr_a);                /* the old key dies with the old path */
    ck_assert_int_eq(exs__prov_mr_reg(raw.ctx, raw.mem + RAW_MSGS, 3 * 4096,
                                      EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_READ,
                                      &mr_b),
                     0);
    mock_stats(pp.b.ctx, &st0);
    for (int i = 0; i < 3; i++)
        pt_recv_post(&r[i], &pp.b, rb[i], RAW_MSG_LEN, 0);
    pt_run(&pp);
    mock_stats(pp.b.ctx, &st);
    ck_assert_uint_eq(st.reads, st0.reads); /* stale: nothing read */
    ck_assert_int_eq(r[0].done, 0);
    ra_announce(0, 0, RAW_MSG_LEN, mr_b->rkey);
    pt_run(&pp);
    ra_expect_msg(&r[0], rb[0], 0);
    ck_assert_int_eq(r[1].done, 0); /* message 1 is still stale */
    ck_assert_uint_eq(ra_read_dones(0, &named), 1);
    ck_assert_uint_eq(named, 1);
    ra_announce(1, 1, RAW_MSG_LEN, mr_b->rkey);
    pt_run(&pp);
    ra_expect_msg(&r[1], rb[1], 1);
    ck_assert_uint_eq(ra_read_dones(1, &named), 1);
    ck_assert_uint_eq(named, 1);
    ck_assert_int_eq(pp.b.conn->seqpkt.reann_open, 1);
    ra_announce(2, 2, RAW_MSG_LEN, mr_b->rkey); /* the first new message */
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->seqpkt.reann_open, 0);
    ra_expect_msg(&r[2], rb[2], 2);
    mock_stats(pp.b.ctx, &st);
    ck_assert_uint_eq(st.reads - st0.reads, 3);
    ck_assert_uint_eq(st.rem_access_err, st0.rem_access_err);
    ck_assert_uint_eq(pp.b.conn->rx_seq, 3);
    for (int i = 0; i < 3; i++)
        pt_op_fini(&r[i]);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    exs__prov_mr_dereg(mr_b);
    raw_close();
}
END_TEST

/* An announced message b read whole before the cut, whose READ_DONE the sender did not
 * get (lost with the old path): announced again, it is answered with exactly one
 * READ_DONE and no READ, and no receive takes it again: the next receive gets the next
 * message. */
START_TEST(hs_reann_read_done)
{
    static uint8_t rb[2][RAW_MSG_LEN];
    struct mock_stats st0, st;
    uint32_t named;
    struct pt_op r[2];

    ra_open();
    pt_recv_post(&r[0], &pp.b, rb[0], RAW_MSG_LEN, 0);
    pt_run(&pp);
    ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
    pt_run(&pp);
    ra_expect_msg(&r[0], rb[0], 0);
    ck_assert_uint_eq(ra_read_dones(0, &named), 1);
    ck_assert_uint_eq(ra_cut(), 0);
    mock_stats(pp.b.ctx, &st0);
    pt_recv_post(&r[1], &pp.b, rb[1], RAW_MSG_LEN, 0);
    ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
    pt_run(&pp);
    mock_stats(pp.b.ctx, &st);
    ck_assert_uint_eq(st.reads, st0.reads);         /* no READ */
    ck_assert_uint_eq(ra_read_dones(0, &named), 1); /* exactly one READ_DONE, for it */
    ck_assert_uint_eq(named, 1);
    ck_assert_int_eq(r[1].done, 0);
    ra_announce(1, 1, RAW_MSG_LEN, raw.mr->rkey);
    pt_run(&pp);
    ra_expect_msg(&r[1], rb[1], 1);
    ck_assert_uint_eq(ra_read_dones(1, &named), 1);
    ck_assert_uint_eq(named, 1);
    for (int i = 0; i < 2; i++)
        pt_op_fini(&r[i]);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* A receive whose READ was in flight when the path failed (flushed in the drain): at the
 * cut it gives its message back, first in the pending list and stale like the message
 * after it, and waits for it again, to be read from offset 0 (nothing of it counted);
 * no READ is outstanding any more. (The mock harness has no fallback: b is put in
 * RESUMING by hand, as exs__resume_begin_locked does, and the link dropped.) */
START_TEST(hs_reann_inflight)
{
    static uint8_t rb[RAW_MSG_LEN];
    struct exs_pending_msg *m0, *m1;
    struct exs_sock_stats st;
    struct pt_op r;

    ra_open();
    ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
    ra_announce(1, 1, RAW_MSG_LEN, raw.mr->rkey);
    pt_recv_post(&r, &pp.b, rb, RAW_MSG_LEN, 0); /* its READ is posted, not carried out */
    ck_assert_int_eq(r.op.state, EXS_OPS_POSTED);
    ck_assert_uint_eq(r.op.inflight, 1);
    ck_assert_uint_eq(pp.b.conn->pending_announced, 1);
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pp.b.conn->state = EXS_CONN_RESUMING;
    pp.b.conn->resume.over = 1;
    pp.b.conn->resume.t0_ns = exs__now_ns();
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    mock_drop(raw.ep);
    pt_run(&pp); /* the READ flushes, the DISCONNECTED comes: the old path is over */
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_RESUMING);
    ck_assert_int_eq(r.done, 0);
    ck_assert_uint_eq(r.op.inflight, 0);
    ck_assert_uint_eq(ra_cut(), 2);
    ck_assert_int_eq(r.op.state, EXS_OPS_QUEUED);
    ck_assert_uint_eq(r.op.filled, 0);
    ck_assert_uint_eq(pp.b.conn->reads, 0);
    ck_assert_ptr_null(pp.b.conn->seqpkt.rd_op);
    ck_assert_uint_eq(pp.b.conn->pending_count, 2);
    ck_assert_uint_eq(pp.b.conn->pending_announced, 2);
    ck_assert_uint_eq(pp.b.conn->rx_seq, 2);
    ck_assert_uint_eq(pp.b.conn->rx_matched, 0);
    m0 = exs_list_entry(pp.b.conn->pending.next, struct exs_pending_msg, link);
    m1 = exs_list_entry(m0->link.next, struct exs_pending_msg, link);
    ck_assert_uint_eq(m0->seq, 0);
    ck_assert_uint_eq(m0->len, RAW_MSG_LEN);
    ck_assert_int_eq(m0->stale, 1);
    ck_assert_uint_eq(m1->seq, 1);
    ck_assert_int_eq(m1->stale, 1);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.bytes_received, 0);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, -1);
    pt_op_fini(&r);
    raw_close();
}
END_TEST

/* Re-announces b refuses (each resets the connection, which ends cleanly):
 *  0 of a message that arrived eager (neither stale nor remembered read)
 *  1 in decreasing order (1 then 0, both stale)
 *  2 after the first new message closed the window (0 read whole, then eager message 1)
 *  3 on a connection never cut (0 read whole)
 *  4 beyond what b remembers (memo of 1: 0 and 1 read whole, 0 forgotten)
 *  5 of a stale message with another length
 *  6 none: a new message while one is still stale (it had to be announced again first)
 *  7 the same message twice (0 read whole: answered once, then refused) */
START_TEST(hs_reann_bad)
{
    static uint8_t rb[2][RAW_MSG_LEN];
    uint8_t msg[100] = {0};
    struct pt_op r[2];
    uint32_t named;
    int nr = 0;

    ra_open();
    if (_i == 4)
        pp.b.conn->seqpkt.memo_cap = 1; /* before the first read */
    switch (_i) {
    case 0:
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
                 raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        pt_recv_post(&r[nr++], &pp.b, rb[0], RAW_MSG_LEN, 0);
        pt_run(&pp);
        pt_assert_done(&r[0], (ssize_t)sizeof(msg), 0);
        break;
    case 1:
    case 5:
    case 6:
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        ra_announce(1, 1, RAW_MSG_LEN, raw.mr->rkey);
        pt_run(&pp);
        break;
    default:
        for (int i = 0; i < (_i == 4 ? 2 : 1); i++) {
            pt_recv_post(&r[nr++], &pp.b, rb[i], RAW_MSG_LEN, 0);
            pt_run(&pp);
            ra_announce((uint64_t)i, (uint32_t)i, RAW_MSG_LEN, raw.mr->rkey);
            pt_run(&pp);
            ra_expect_msg(&r[i], rb[i], (uint32_t)i);
        }
        break;
    }
    if (_i != 3)
        ck_assert_uint_eq(ra_cut(), _i == 1 || _i == 5 || _i == 6 ? 2 : 0);
    (void)ra_read_dones(0, &named);
    switch (_i) {
    case 1:
        ra_announce(1, 1, RAW_MSG_LEN, raw.mr->rkey);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED); /* 1 is taken */
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        break;
    case 2:
        pt_recv_post(&r[nr++], &pp.b, rb[1], RAW_MSG_LEN, 0);
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
                 raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        pt_assert_done(&r[1], (ssize_t)sizeof(msg), 0);
        ck_assert_int_eq(pp.b.conn->seqpkt.reann_open, 0);
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        break;
    case 4:
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        break;
    case 5:
        ra_announce(0, 0, RAW_MSG_LEN - 1, raw.mr->rkey);
        break;
    case 6:
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
                 raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        break;
    case 7:
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        ck_assert_uint_eq(ra_read_dones(0, &named), 1);
        ck_assert_uint_eq(named, 1);
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        break;
    default: /* 0, 3 */
        ra_announce(0, 0, RAW_MSG_LEN, raw.mr->rkey);
        break;
    }
    /* 2 and 3 announce outside any window; 6 breaks it with a write */
    expect_pv(_i == 2 || _i == 3 ? EXS_PV_ANNOUNCE : EXS_PV_REANNOUNCE);
    ck_assert_uint_eq(pp.b.conn->pv.rec_type, _i == 6 ? EXS_PV_REC_WRITE : EXS_CTRL_ANNOUNCE);
    for (int i = 0; i < nr; i++)
        pt_op_fini(&r[i]);
    raw_close();
}
END_TEST

/* The sender's side: b announced message 0 (8000 bytes) and the cut lost its READ_DONE
 * (raw never read it). Applying raw's RESUME (position 1: the ANNOUNCE arrived) the send
 * is not completed but announced again, first, with a new grant (the old one revoked);
 * raw READs it with the new key and answers READ_DONE: the send completes once, whole.
 * Without the re-announce the send completes at the RESUME, unread. */
START_TEST(hs_reann_sender)
{
    static uint8_t sb[8000];
    struct exs_wire_announce a, a2;
    struct exs_wire_read_done d = {
        .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
    };
    struct exs_wire_resume rec;
    struct mock_stats st0, st;
    struct pt_op s;

    ra_open();
    pt_fill(sb, sizeof(sb), 9);
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ANNOUNCE, &a, sizeof(a)));
    ck_assert_uint_eq(be64toh(a.seq), 0);
    /* the new path: b waits for raw's RESUME, which states message 0 arrived */
    memset(&rec, 0, sizeof(rec));
    rec.hdr.type = EXS_CTRL_RESUME;
    rec.hdr.len = htobe16(EXS_WIRE_RESUME_LEN);
    rec.token = htobe64(pp.b.conn->sess_token);
    rec.rx_msgs = htobe64(1);
    rec.ring_arrived = htobe64(pp.b.conn->wr_tail);
    rec.ring_consumed = htobe64(pp.b.conn->wr_consumed);
    mock_stats(pp.b.ctx, &st0);
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pp.b.conn->resume.peer_wait = 1;
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(on_resume(pp.b.conn, &rec), 0);
    ck_assert_int_eq(s.done, 0); /* not completed: its READ_DONE never came */
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    exs__conn_kick_locked(pp.b.conn);
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pt_run(&pp);
    ck_assert(raw_find_record(EXS_CTRL_ANNOUNCE, &a2, sizeof(a2)));
    ck_assert_uint_eq(be64toh(a2.seq), 0);
    ck_assert_uint_eq(be64toh(a2.addr), (uintptr_t)sb);
    ck_assert_uint_eq(be32toh(a2.len), sizeof(sb));
    mock_stats(pp.b.ctx, &st);
    ck_assert_uint_eq(st.revokes - st0.revokes, 1); /* the old grant */
    ck_assert_uint_eq(st.grants - st0.grants, 1);   /* the new one */
    ck_assert_int_eq(s.done, 0);
    raw_post(EXS_PROV_WR_RDMA_READ, NULL, sizeof(sb), be64toh(a2.addr), be32toh(a2.rkey), 0);
    pt_run(&pp);
    ck_assert_int_eq(raw_send_status(), EXS_PROV_WC_SUCCESS);
    ck_assert(pt_check(raw.mem + RAW_SEND, sizeof(sb), 9));
    d.seq = a2.seq;
    raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
    pt_run(&pp);
    pt_assert_done(&s, (ssize_t)sizeof(sb), 0);
    pt_op_fini(&s);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* ---- keepalive answered by the peer's library (feature ALIVE, spec/protocol.md §9.1) ---- */

/* What b sent raw since the last call: the NOPs answering (flags 0), the PINGs, the
 * credits all its records returned and its SENDs; each receive is posted again. */
struct ka_seen {
    int nops, pings, sends;
    uint32_t credits;
};

static int ka_collect_one(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                          uint32_t rlen)
{
    struct ka_seen *k = arg;

    (void)rec;
    (void)rlen;
    k->credits += be16toh(h->credits);
    if (h->type == EXS_CTRL_NOP) {
        if (h->flags & EXS_NOP_PING)
            k->pings++;
        else
            k->nops++;
    }
    return 0;
}

static void ka_collect(struct ka_seen *k)
{
    k->sends += raw_each_record(ka_collect_one, k, 1);
}

/* n PING records from raw in one SEND. */
static void ka_raw_pings(int n, uint16_t credits)
{
    uint8_t rec[EXS_WIRE_CTRL_MAX] = {0};

    ck_assert_uint_le((uint32_t)n * EXS_WIRE_NOP_LEN, sizeof(rec));
    for (int i = 0; i < n; i++) {
        struct exs_wire_ctrl_hdr h = {
            .type = EXS_CTRL_NOP,
            .flags = EXS_NOP_PING,
            .len = htobe16(EXS_WIRE_NOP_LEN),
            .credits = htobe16(i ? 0 : credits),
        };

        memcpy(rec + i * EXS_WIRE_NOP_LEN, &h, sizeof(h));
    }
    raw_post(EXS_PROV_WR_SEND, rec, (uint32_t)n * EXS_WIRE_NOP_LEN, 0, 0, 0);
}

/* A PING is answered by exactly one NOP, at once, without the application (b's timer is
 * never run: the answer is the library's); the NOP returns exactly the credits of the
 * receives b consumed (raw's RING and the PING). A second PING, a second answer. */
START_TEST(hs_ka_ping_answered)
{
    struct exs_sock_stats st;
    struct ka_seen k = {0};

    raw_open(SOCK_SEQPACKET);
    ka_collect(&k); /* b's RING, read already */
    ka_raw_pings(1, 0);
    pt_run(&pp);
    ka_collect(&k);
    ck_assert_int_eq(k.nops, 1);
    ck_assert_int_eq(k.pings, 0);
    ck_assert_int_eq(k.sends, 1);
    ck_assert_uint_eq(k.credits, 2); /* RING + PING */
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_answers, 1);
    ck_assert_uint_eq(st.keepalive_probes, 0);
    ka_raw_pings(1, 0);
    pt_run(&pp);
    ka_collect(&k);
    ck_assert_int_eq(k.nops, 2);
    ck_assert_int_eq(k.sends, 2);
    ck_assert_uint_eq(k.credits, 3);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_answers, 2);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* A PING flood. _i 0: 40 PINGs in one SEND get one answer. _i 1: a PING in every SEND
 * raw may send (b's credits, spent to the last, then again with the credits returned):
 * at most one answer per SEND, never more credits returned than receives consumed, no
 * credit of b overspent (no RNR, checked by raw_close), and the conn stays up. */
/* ---- memory: the per-connection caps of §6 and §7 (ANNOUNCED_MAX, ADVERTS_MAX) ---- */

static int raw_rec_ignore(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                          uint32_t rlen)
{
    (void)arg, (void)h, (void)rec, (void)rlen;
    return 0;
}

/* n records of rlen bytes from raw, record i made by make(i, rec): as many per SEND as
 * fit, b running after each SEND (its receives come back) and raw's receives posted
 * again. */
static void raw_records(uint32_t n, uint32_t rlen, void (*make)(uint32_t i, uint8_t *rec))
{
    uint8_t buf[512];

    for (uint32_t i = 0; i < n;) {
        uint32_t len = 0;

        for (; i < n && len + rlen <= sizeof(buf); i++, len += rlen)
            make(i, buf + len);
        raw_post(EXS_PROV_WR_SEND, buf, len, 0, 0, 0);
        pt_run(&pp);
        raw_each_record(raw_rec_ignore, NULL, 1);
    }
}

static void make_announce(uint32_t i, uint8_t *rec)
{
    struct exs_wire_announce a = {
        .hdr = {.type = EXS_CTRL_ANNOUNCE, .len = htobe16(EXS_WIRE_ANNOUNCE_LEN)},
        .addr = htobe64((uintptr_t)raw.mem + RAW_SEND),
        .len = htobe32(8192),
        .rkey = htobe32(raw.mr->rkey),
        .seq = htobe64(i),
    };

    memcpy(rec, &a, sizeof(a));
}

static int raw_stream; /* make_advert: STREAM (phase 0, offsets) or SEQPACKET (numbers) */

static void make_advert(uint32_t i, uint8_t *rec)
{
    struct exs_wire_advert a = {
        .hdr = {.type = EXS_CTRL_ADVERT, .len = htobe16(EXS_WIRE_ADVERT_LEN)},
        .addr = htobe64((uintptr_t)raw.mem + RAW_SEND),
        .len = htobe32(8192),
        .rkey = htobe32(raw.mr->rkey),
        .seq = htobe64(raw_stream ? (uint64_t)i * 8192 : i),
        .phase = 0,
        .id = htobe32(i + 1),
    };

    memcpy(rec, &a, sizeof(a));
}

/* SEQPACKET receiver: ANNOUNCED_MAX announced messages pending are held (and charged to
 * the memory account); one more is a protocol error (§6), not 64 KiB more of them. */
START_TEST(hs_announce_cap)
{
    uint64_t before;

    raw_open(SOCK_SEQPACKET);
    before = exs__mem_used();
    raw_records(EXS_WIRE_ANNOUNCED_MAX, EXS_WIRE_ANNOUNCE_LEN, make_announce);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(pp.b.conn->pending_count, EXS_WIRE_ANNOUNCED_MAX);
    ck_assert_uint_ge(exs__mem_used() - before,
                      EXS_WIRE_ANNOUNCED_MAX * sizeof(struct exs_pending_msg));
    make_announce(EXS_WIRE_ANNOUNCED_MAX, raw.mem + RAW_SEND);
    raw_post(EXS_PROV_WR_SEND, NULL, EXS_WIRE_ANNOUNCE_LEN, 0, 0, 0);
    pt_run(&pp);
    ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(pp.b.conn->err, ECONNRESET);
    ck_assert_pv(pp.b.conn, EXS_PV_ANNOUNCED_MAX);
    raw_close(); /* and pt_close: the account is back at 0 */
}
END_TEST

/* Sender: ADVERTS_MAX usable ADVERTs are held; one more is a protocol error (§6, §7). */
START_TEST(hs_advert_cap)
{
    raw_stream = _i;
    raw_open(_i ? SOCK_STREAM : SOCK_SEQPACKET);
    raw_records(EXS_WIRE_ADVERTS_MAX, EXS_WIRE_ADVERT_LEN, make_advert);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(pp.b.conn->adv_count, EXS_WIRE_ADVERTS_MAX);
    make_advert(EXS_WIRE_ADVERTS_MAX, raw.mem + RAW_SEND);
    raw_post(EXS_PROV_WR_SEND, NULL, EXS_WIRE_ADVERT_LEN, 0, 0, 0);
    pt_run(&pp);
    ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_pv(pp.b.conn, EXS_PV_ADVERTS_MAX);
    raw_close();
}
END_TEST

/* The memory budget (§9.3): a peer's announced message past it ends the connection
 * (ENOBUFS counted), and the account goes back to 0. */
START_TEST(hs_announce_budget)
{
    uint64_t refused = exs__mem.mem_refused_other;
    struct exs_pv_state pv;
    char v[32];

    raw_open(SOCK_SEQPACKET);
    /* room for 10 more pending messages */
    snprintf(v, sizeof(v), "%llu",
             (unsigned long long)(exs__mem_used() +
                                  10 * exs__mem_chunk(sizeof(struct exs_pending_msg))));
    ck_assert_int_eq(exs__params_set("mem_budget", v), 0);
    raw_records(10, EXS_WIRE_ANNOUNCE_LEN, make_announce);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_uint_eq(exs__mem.mem_refused_other, refused);
    make_announce(10, raw.mem + RAW_SEND);
    raw_post(EXS_PROV_WR_SEND, NULL, EXS_WIRE_ANNOUNCE_LEN, 0, 0, 0);
    pt_run(&pp);
    ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_uint_eq(exs__mem.mem_refused_other, refused + 1);
    ck_assert_uint_eq(exs__pv_get(pp.b.conn, &pv), -ENOENT); /* the budget, not the peer */
    raw_close();
    ck_assert_int_eq(exs__params_set("mem_budget", "0"), 0);
}
END_TEST

START_TEST(hs_ka_ping_flood)
{
    struct exs_sock_stats st;
    struct ka_seen k = {0};
    uint32_t credits, sent = 1; /* raw's RING */

    raw_open(SOCK_SEQPACKET);
    ka_collect(&k);
    credits = raw.peer.credits - 1 + k.credits; /* what raw may still send */
    if (_i == 0) {
        ka_raw_pings(40, 0);
        sent++;
        pt_run(&pp);
        ka_collect(&k);
        ck_assert_int_eq(k.nops, 1);
        ck_assert_int_eq(k.sends, 1);
    } else {
        for (int round = 0; round < 3; round++) {
            uint32_t before = k.credits;

            for (uint32_t i = 0; i < credits; i++)
                ka_raw_pings(1, 0);
            sent += credits;
            pt_run(&pp);
            ka_collect(&k);
            ck_assert_int_ge(k.nops, round + 1);
            ck_assert_int_le(k.nops, (int)(sent - 1));
            ck_assert_int_le(k.sends, (int)sent);
            credits = k.credits - before; /* returned: raw may send that many again */
            ck_assert_uint_ge(credits, 1);
        }
    }
    ck_assert_int_eq(k.pings, 0);
    ck_assert_uint_eq(k.credits, sent); /* every receive consumed came back, no more */
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_answers, (uint64_t)k.nops);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    exs__conn_close(pp.b.conn);
    raw_close();
}
END_TEST

/* A PING from a peer whose hello lacks feature ALIVE is a protocol error (decided so: it
 * asks for an answer the connection never agreed to give); without the flag the same
 * NOP is fine. */
START_TEST(hs_ka_ping_without_feature)
{
    raw_features = EXS_WIRE_FEAT_ALL & ~EXS_WIRE_FEAT_ALIVE;
    raw_open(SOCK_SEQPACKET);
    raw_features = EXS_WIRE_FEAT_ALL;
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 0, NULL, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ka_raw_pings(1, 0);
    expect_pv(EXS_PV_FEATURE);
    raw_close();
}
END_TEST

/* Keepalive against a peer whose NIC acknowledges everything and whose library never
 * answers (raw: its receives are posted, it sends nothing). _i 0: with feature ALIVE
 * the probes are PINGs, their send completions prove nothing, b declares raw dead after
 * interval x (probes + 1): ETIMEDOUT, keepalive_timeouts 1. _i 1: raw without ALIVE:
 * the probes are zero-byte WRITEs whose completions count, as before: b keeps the
 * connection over many intervals and raw never sees a PING. */
START_TEST(hs_ka_send_completion_not_alive)
{
    const uint64_t ka_ms = 20;
    struct exs_sock_stats st;
    struct ka_seen k = {0};
    double t0, end;
    int alive = _i == 0;

    raw_features = alive ? EXS_WIRE_FEAT_ALL : EXS_WIRE_FEAT_ALL & ~EXS_WIRE_FEAT_ALIVE;
    raw_open(SOCK_SEQPACKET);
    raw_features = EXS_WIRE_FEAT_ALL;
    ck_assert_int_eq(exs__params_set("keepalive_probes", "2"), 0);
    ka_collect(&k);
    t0 = (double)exs__now_ns() / 1e6;
    /* dead at 3 intervals of silence: 60 ms; bounds generous for a loaded machine */
    end = t0 + (alive ? 10000.0 : 20.0 * ka_ms);
    while ((double)exs__now_ns() / 1e6 < end && pp.b.conn->state != EXS_CONN_DEAD) {
        struct timespec ts = {0, 2000000};

        pt_run(&pp); /* b's completions: its probes' (the NIC's acknowledgements) */
        ka_collect(&k);
        exs__conn_timer(pp.b.conn, ka_ms);
        nanosleep(&ts, NULL);
    }
    pt_run(&pp);
    ka_collect(&k);
    pt_stats(&pp.b, &st);
    ck_assert_uint_ge(st.keepalive_probes, 1);
    if (alive) {
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_DEAD);
        ck_assert_int_eq(pp.b.conn->err, ETIMEDOUT);
        ck_assert_uint_eq(st.keepalive_timeouts, 1);
        /* one PING: its completion proved nothing, so the wait it began never ended
         * (were send completions counted, each would begin a new wait and a new PING,
         * until raw's credits ran out) */
        ck_assert_int_eq(k.pings, 1);
        ck_assert_uint_eq(st.keepalive_probes, 1);
        ck_assert_int_eq(pp.b.dead, 1);
    } else {
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        ck_assert_uint_eq(st.keepalive_timeouts, 0);
        ck_assert_uint_ge(st.keepalive_probes, 3);
        ck_assert_int_eq(k.pings, 0);
        exs__conn_close(pp.b.conn);
    }
    raw_close();
}
END_TEST

/* A PING waits for a credit and the wait keeps counting (§3.1, §9.1). raw PINGs b until
 * b's answers spent b's every credit (raw returns none); the next PING's answer waits.
 * b's silent interval ends: its PING cannot go (no credit), no probe is counted, and a
 * further interval counts as failed (the PING tried again, still without a credit). Then
 * raw returns one credit in a NOP: a receive, which proves raw alive (the wait ends,
 * nothing failed) and lets the waiting answer go; b never sent a PING. Time is moved
 * by hand: nothing here depends on the machine's speed. */
START_TEST(hs_ka_ping_waits_for_credit)
{
    const uint64_t ka_ms = 1000, intv = ka_ms * 1000000u;
    struct exs_sock_stats st;
    struct ka_seen k = {0};
    struct exs_conn *b;
    int nops;

    raw_open(SOCK_SEQPACKET);
    ck_assert_int_eq(exs__params_set("keepalive_probes", "3"), 0);
    b = pp.b.conn;
    ka_collect(&k);
    for (int i = 0; i < 64 && b->credits > 0; i++) {
        ka_raw_pings(1, 0);
        pt_run(&pp);
        ka_collect(&k);
    }
    ck_assert_uint_eq(b->credits, 0);
    nops = k.nops;
    ck_assert_int_eq(k.pings, 0);
    ka_raw_pings(1, 0); /* its answer waits for a credit */
    pt_run(&pp);
    ka_collect(&k);
    ck_assert_int_eq(k.nops, nops);
    ck_assert_uint_gt(b->ctrl_len, 0);
    ck_assert_uint_eq(b->owed, 1);
    /* an interval of silence: the PING cannot go, the wait begins (nothing heard since
     * the PINGs: the timer's look would stamp those now) */
    EXS_LITE_LOCK(&b->lock, EXS_LOCK_CONN);
    b->keepalive.heard_ns -= intv + intv / 2;
    b->keepalive.heard = 0;
    EXS_LITE_UNLOCK(&b->lock, EXS_LOCK_CONN);
    ck_assert_uint_gt(exs__conn_timer(b, ka_ms), 0);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_probes, 0);
    ck_assert_int_eq(b->keepalive.waiting, 1);
    ck_assert_int_eq(b->keepalive.ping, 0);
    /* another: tried again, still no credit; one failed interval */
    EXS_LITE_LOCK(&b->lock, EXS_LOCK_CONN);
    b->keepalive.probe_ns -= intv + intv / 2;
    EXS_LITE_UNLOCK(&b->lock, EXS_LOCK_CONN);
    ck_assert_uint_gt(exs__conn_timer(b, ka_ms), 0);
    ck_assert_uint_eq(b->keepalive.fails, 1);
    ck_assert_int_eq(b->state, EXS_CONN_CONNECTED);
    pt_run(&pp);
    ka_collect(&k);
    ck_assert_int_eq(k.pings, 0);
    ck_assert_int_eq(k.nops, nops);
    /* raw returns a credit: a receive (alive), and the answer goes */
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 1, NULL, 0);
    pt_run(&pp);
    ka_collect(&k);
    ck_assert_int_eq(k.nops, nops + 1);
    ck_assert_uint_gt(exs__conn_timer(b, ka_ms), 0);
    ck_assert_int_eq(b->keepalive.waiting, 0);
    ck_assert_uint_eq(b->keepalive.fails, 0);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_probes, 0);
    ck_assert_uint_eq(st.keepalive_timeouts, 0);
    ck_assert_int_eq(k.pings, 0);
    ck_assert_int_eq(b->state, EXS_CONN_CONNECTED);
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 4, NULL, 0); /* credits for b's SHUTDOWN */
    pt_run(&pp);
    exs__conn_close(b);
    raw_close();
}
END_TEST

/* A connection that only receives is alive (§9.1): its completions read no clock, the
 * timer's look turns "heard since the last look" into its own time. raw sends b a NOP
 * (credits 0: b answers nothing, posts nothing) before each of probes + 2 looks, each
 * look a whole interval and a half after the previous one (time moved by hand: nothing
 * depends on the machine's speed): b never probes, never waits, never ends the
 * connection. Were the receives' proof lost (no flag, or a look that ignores it), the
 * first look would begin a wait (a PING) and the fourth end the connection. */
START_TEST(hs_ka_receives_only_alive)
{
    const uint64_t ka_ms = 1000, intv = ka_ms * 1000000u;
    struct exs_sock_stats st;
    struct ka_seen k = {0};
    struct exs_conn *b;

    raw_open(SOCK_SEQPACKET);
    ck_assert_int_eq(exs__params_set("keepalive_probes", "3"), 0);
    b = pp.b.conn;
    ka_collect(&k);
    for (int i = 0; i < 5; i++) {
        EXS_LITE_LOCK(&b->lock, EXS_LOCK_CONN);
        b->keepalive.heard_ns -= intv + intv / 2;
        b->keepalive.probe_ns -= intv + intv / 2;
        EXS_LITE_UNLOCK(&b->lock, EXS_LOCK_CONN);
        raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 0, NULL, 0);
        pt_run(&pp);
        ck_assert_int_eq(b->keepalive.heard, 1);
        ck_assert_uint_gt(exs__conn_timer(b, ka_ms), 0);
        ck_assert_int_eq(b->keepalive.heard, 0);
        ck_assert_int_eq(b->keepalive.waiting, 0);
        ck_assert_int_eq(b->state, EXS_CONN_CONNECTED);
    }
    pt_run(&pp);
    ka_collect(&k);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.keepalive_probes, 0);
    ck_assert_uint_eq(st.keepalive_timeouts, 0);
    ck_assert_int_eq(k.pings, 0);
    raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 4, NULL, 0); /* credits for b's SHUTDOWN */
    pt_run(&pp);
    exs__conn_close(b);
    raw_close();
}
END_TEST

/* The rules no test above breaks, each named: a control SEND ending inside a header
 * (0); an ADVERT of an indirect phase (1) or of no bytes (2) on STREAM, of a message
 * number not above the last on SEQPACKET (3); an eager message not below eager_max (4);
 * eager writes past the free ring on SEQPACKET (5); an ANNOUNCE (6) or a READ_DONE (7) on
 * STREAM; a write returning more credits than were granted (8); a record (9) or a write
 * (10) on a new path before the peer's RESUME (the wait set by hand: the cut-over's
 * machinery is test_resume_*'s). */
START_TEST(hs_named_rules)
{
    static const struct {
        int stream;
        enum exs_pv_rule rule;
        unsigned rec;
    } v[] = {
        {0, EXS_PV_CTRL_TRUNCATED, EXS_PV_REC_NONE}, {1, EXS_PV_ADVERT, EXS_CTRL_ADVERT},
        {1, EXS_PV_ADVERT, EXS_CTRL_ADVERT},         {0, EXS_PV_ADVERT, EXS_CTRL_ADVERT},
        {0, EXS_PV_EAGER_SIZE, EXS_PV_REC_WRITE},    {0, EXS_PV_RING_OVERRUN, EXS_PV_REC_WRITE},
        {1, EXS_PV_SOCK_TYPE, EXS_CTRL_ANNOUNCE},    {1, EXS_PV_SOCK_TYPE, EXS_CTRL_READ_DONE},
        {0, EXS_PV_CREDITS, EXS_PV_REC_WRITE},       {0, EXS_PV_RESUME_FIRST, EXS_CTRL_NOP},
        {1, EXS_PV_RESUME_FIRST, EXS_PV_REC_WRITE},
    };
    static uint8_t msg[1024];
    uint8_t rec[2 * EXS_WIRE_ADVERT_LEN] = {0};
    struct exs_wire_advert a;
    struct exs_pv_state pv;

    ck_assert_uint_eq(EXS_ARRAY_SIZE(v), 11);
    raw_stream = v[_i].stream;
    raw_open(v[_i].stream ? SOCK_STREAM : SOCK_SEQPACKET);
    switch (_i) {
    case 0: { /* a NOP, then half a header */
        struct exs_wire_ctrl_hdr h = {.type = EXS_CTRL_NOP, .len = htobe16(EXS_WIRE_NOP_LEN)};

        memcpy(rec, &h, sizeof(h));
        raw_post(EXS_PROV_WR_SEND, rec, EXS_WIRE_NOP_LEN + 4, 0, 0, 0);
        break;
    }
    case 1:
    case 2:
        make_advert(0, rec);
        memcpy(&a, rec, sizeof(a));
        if (_i == 1)
            a.phase = htobe32(1);
        else
            a.len = 0;
        raw_post(EXS_PROV_WR_SEND, &a, sizeof(a), 0, 0, 0);
        break;
    case 3: /* message 5 advertised twice */
        make_advert(5, rec);
        make_advert(5, rec + EXS_WIRE_ADVERT_LEN);
        raw_post(EXS_PROV_WR_SEND, rec, sizeof(rec), 0, 0, 0);
        break;
    case 4:
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, 1024, raw.peer.ring_addr, raw.peer.ring_rkey,
                 exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
        break;
    case 5: /* 4 x 1000 bytes fill the 4 KiB ring (no receive takes them), the fifth
             * does not fit */
        for (uint32_t i = 0; i < 5; i++) {
            raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, 1000,
                     raw.peer.ring_addr + 1024u * (i % 4), raw.peer.ring_rkey,
                     exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0));
            pt_run(&pp);
            if (i < 4)
                ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        }
        break;
    case 6:
        make_announce(0, rec);
        raw_post(EXS_PROV_WR_SEND, rec, EXS_WIRE_ANNOUNCE_LEN, 0, 0, 0);
        break;
    case 7: {
        struct exs_wire_read_done d = {
            .hdr = {.type = EXS_CTRL_READ_DONE, .len = htobe16(EXS_WIRE_READ_DONE_LEN)},
        };

        raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
        break;
    }
    case 8:
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, 8, raw.peer.ring_addr, raw.peer.ring_rkey,
                 exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, EXS_IMM_CREDITS_MAX, 0));
        break;
    default:
        EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        pp.b.conn->resume.peer_wait = 1;
        EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        if (_i == 9)
            raw_ctrl(EXS_CTRL_NOP, EXS_WIRE_NOP_LEN, 0, NULL, 0);
        else
            raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, 8, raw.peer.ring_addr,
                     raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
        pt_run(&pp);
        EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        pp.b.conn->resume.peer_wait = 0;
        EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
        break;
    }
    if (_i == 5) { /* what arrived before the overrun is still handed to receives */
        ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
        ck_assert_pv(pp.b.conn, v[_i].rule);
    } else {
        expect_pv(v[_i].rule);
    }
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), 0);
    ck_assert_uint_eq(pv.rec_type, v[_i].rec);
    raw_stream = 0;
    raw_close();
}
END_TEST

/* The ring at a cut-over (§9.2): unread bytes that fit no region cannot come from a
 * checked history (every arrival was checked against its ring), and if positions ever
 * said so the cut would fail on the rule they break, named, not silently. */
START_TEST(hs_ring_cut_positions)
{
    uint64_t saved;
    int ret;

    unit_pair_fresh(&pp, SOCK_STREAM, 0, 0);
    pt_connect(&pp);
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    saved = pp.b.conn->rd_arrived;
    pp.b.conn->rd_arrived = pp.b.conn->rd_consumed + pp.b.conn->p.ring_size + 1;
    ret = exs__stream_ring_cut_locked(pp.b.conn);
    pp.b.conn->rd_arrived = saved;
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(ret, -EPROTO);
    ck_assert_pv(pp.b.conn, EXS_PV_RING_OVERRUN);
    ck_assert_uint_eq(pp.b.conn->pv.rec_type, EXS_PV_REC_NONE);
    pt_close_both(&pp);
}
END_TEST

/* ---- violation paths no peer reached before (issue 25) ---- */

/* A receive completion the protocol never causes (a provider gone wrong; the mock makes
 * one of raw's next WRITE_WITH_IMM): _i 0 RECV_RDMA_WITH_IMM without its immediate data,
 * 1 a send's opcode (RDMA_READ) on a receive. Rule completion, found in a completion. */
START_TEST(hs_completion_kind)
{
    static const enum exs_prov_wc_opcode op[2] = {EXS_PROV_WC_RECV_RDMA_WITH_IMM,
                                                  EXS_PROV_WC_RDMA_READ};
    struct exs_pv_state pv;
    uint8_t msg[64];

    raw_open(SOCK_STREAM);
    pt_fill(msg, sizeof(msg), 0);
    mock_inject_recv_cqe(raw.ep, op[_i], _i ? EXS_PROV_WC_WITH_IMM : 0);
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, msg, sizeof(msg), raw.peer.ring_addr,
             raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    expect_pv(EXS_PV_COMPLETION);
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), 0);
    ck_assert_uint_eq(pv.rec_type, EXS_PV_REC_COMPLETION);
    raw_close();
}
END_TEST

/* §7.2, b the receiver: two ring arrivals each leave a large receive waiting with the
 * ring empty, so b asks raw to DRAIN; raw answers STOPPED at 300 (b has 200), then writes
 * 150 ring bytes: 50 past the stop position (rule ring-overrun, though the ring has room).
 * _i 1: the 100 bytes up to the stop are taken, then (no receive waiting, b still
 * stopped) one more byte is not. */
START_TEST(hs_ring_past_stop)
{
    static uint8_t rb[3][65536];
    struct exs_wire_drain req, d = {
                                   .hdr = {.type = EXS_CTRL_DRAIN,
                                           .flags = EXS_DRAIN_STOPPED,
                                           .len = htobe16(EXS_WIRE_DRAIN_LEN)},
                                   .pos = htobe64(300),
                               };
    uint64_t streak = exs__params.stream_drain_streak, dmin = exs__params.stream_direct_min;
    struct exs_pv_state pv;
    uint8_t junk[150] = {0};
    struct pt_op r[3];

    raw_open(SOCK_STREAM);
    exs__params.stream_drain_streak = 2;
    exs__params.stream_direct_min = 32768;
    for (int i = 0; i < 3; i++) {
        pt_op_init(&r[i], &pp.b, EXS_OP_RECV, rb[i], sizeof(rb[i]), 0);
        ck_assert_int_eq(pt_post(&r[i]), 0);
    }
    pt_run(&pp);
    for (int i = 0; i < 2; i++) {
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, junk, 100, raw.peer.ring_addr + 100u * i,
                 raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
        pt_run(&pp);
        pt_assert_done(&r[i], 100, 0);
    }
    ck_assert(raw_find_record(EXS_CTRL_DRAIN, &req, sizeof(req)));
    ck_assert_uint_eq(req.hdr.flags, 0);
    ck_assert_uint_eq(be64toh(req.pos), 200);
    d.phase = req.phase;
    raw_post(EXS_PROV_WR_SEND, &d, sizeof(d), 0, 0, 0);
    pt_run(&pp);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->stream.drain, EXS_STREAM_DRAIN_STOPPED);
    if (_i) {
        raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, junk, 100, raw.peer.ring_addr + 200,
                 raw.peer.ring_rkey, exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
        pt_run(&pp);
        ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
        pt_assert_done(&r[2], 100, 0);
        /* no receive waits: b stays stopped (a new one would be advertised, in a new
         * direct phase after which a ring write starts a new indirect one) */
        ck_assert_int_eq(pp.b.conn->stream.drain, EXS_STREAM_DRAIN_STOPPED);
    }
    raw_post(EXS_PROV_WR_RDMA_WRITE_WITH_IMM, junk, _i ? 1 : 150,
             raw.peer.ring_addr + (_i ? 300 : 200), raw.peer.ring_rkey,
             exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0));
    pt_run(&pp);
    ck_assert_int_eq(pp.b.dead, 1);
    if (!_i)
        pt_assert_done(&r[2], -1, ECONNRESET);
    ck_assert_pv(pp.b.conn, EXS_PV_RING_OVERRUN);
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), 0);
    ck_assert_msg(strstr(pv.detail, "past the stop at 300"), "detail: %s", pv.detail);
    for (int i = 0; i < 3; i++)
        pt_op_fini(&r[i]);
    raw_close();
    exs__params.stream_drain_streak = streak;
    exs__params.stream_direct_min = dmin;
}
END_TEST

/* §9.2: the active side refuses a SESSION key whose token is 0 (the test seam names such
 * a key: a real one takes a SHA-256 preimage); the same key is taken once it is not. */
START_TEST(hs_session_token0)
{
    struct exs_wire_session ss = {
        .hdr = {.type = EXS_CTRL_SESSION, .len = htobe16(EXS_WIRE_SESSION_LEN)},
        .key = {42},
    };
    struct exs_pv_state pv;

    unit_pair_fresh(&pp, SOCK_STREAM, 1, 1);
    pt_connect(&pp);
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    pp.a.conn->sess_token = 0; /* as if none had come yet */
    pp.a.conn->resume.keys &= ~EXS_RSM_KEY_PEER;
    exs__proto_seams.token0_key = ss.key;
    ck_assert_uint_eq(exs__resume_token_of(ss.key), 0);
    ck_assert_int_eq(on_session(pp.a.conn, &ss), -EPROTO);
    ck_assert_int_eq(exs__pv_get(pp.a.conn, &pv), 0);
    ck_assert_uint_eq(pv.rec_type, EXS_CTRL_SESSION);
    ck_assert_msg(strstr(pv.detail, "token is 0"), "detail: %s", pv.detail);
    ck_assert_pv_take(pp.a.conn, EXS_PV_SESSION);
    ck_assert_uint_eq(pp.a.conn->sess_token, 0);
    exs__proto_seams.token0_key = NULL;
    ck_assert_int_eq(on_session(pp.a.conn, &ss), 0);
    ck_assert_uint_eq(pp.a.conn->sess_token, exs__resume_token_of(ss.key));
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    pt_close_both(&pp);
}
END_TEST

/* Out of memory for a peer's announced message (the test seam fails the allocation of
 * its pending entry): the connection ends, and as with the memory budget it is not the
 * peer's fault: -ENOMEM passes through to the reset's reason ("out of memory"), no rule
 * is recorded, no budget refusal counted. */
START_TEST(hs_announce_nomem)
{
    uint64_t refused = exs__mem.mem_refused_other;
    static char logged[65536];
    FILE *log = tmpfile();
    struct exs_pv_state pv;

    raw_open(SOCK_SEQPACKET);
    raw_records(2, EXS_WIRE_ANNOUNCE_LEN, make_announce);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_nonnull(log);
    exs__log_set_stream(log); /* the reason the connection ends with, logged at info */
    exs__log_level = EXS_LOG_INFO;
    exs__proto_seams.pending_nomem = 1;
    make_announce(2, raw.mem + RAW_SEND);
    raw_post(EXS_PROV_WR_SEND, NULL, EXS_WIRE_ANNOUNCE_LEN, 0, 0, 0);
    pt_run(&pp);
    exs__log_set_stream(NULL);
    exs__log_level = EXS_LOG_ERR;
    ck_assert_uint_eq(exs__proto_seams.pending_nomem, 0); /* the allocation was tried */
    exs__proto_seams.pending_nomem = 0;
    rewind(log);
    logged[fread(logged, 1, sizeof(logged) - 1, log)] = 0;
    fclose(log);
    ck_assert_msg(strstr(logged, "out of memory: connection reset"), "log: %s", logged);
    ck_assert_ptr_null(strstr(logged, "protocol violation"));
    ck_assert_int_ge(pp.b.conn->state, EXS_CONN_DOWN);
    ck_assert_int_eq(pp.b.conn->err, ECONNRESET);
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &pv), -ENOENT); /* memory, not the peer */
    ck_assert_uint_eq(exs__mem.mem_refused_other, refused);
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
    tcase_add_loop_test(tc, hs_shutdown_count, 0, 4);
    tcase_add_test(tc, hs_record_before_ring);
    tcase_add_test(tc, hs_second_ring);
    tcase_add_test(tc, hs_advert_key_dies_with_receive);
    tcase_add_test(tc, hs_announce_key_read_only);
    tcase_add_test(tc, hs_announce_key_not_writable);
    tcase_add_test(tc, hs_read_done_for_eager_write);
    tcase_add_test(tc, hs_batch_delivered);
    tcase_add_loop_test(tc, hs_batch_malformed, 0, 6);
    tcase_add_test(tc, hs_batch_rewritten);
    tcase_add_test(tc, hs_drain_honoured);
    tcase_add_loop_test(tc, hs_drain_bad, 0, 8);
    tcase_add_loop_test(tc, hs_drain_bad_length, 0, 2);
    tcase_add_test(tc, hs_drain_seqpacket);
    tcase_add_test(tc, hs_trace_ok);
    tcase_add_loop_test(tc, hs_trace_bad, 0, 17);
    tcase_add_loop_test(tc, hs_trace_without_feature, 0, 4);
    tcase_add_test(tc, hs_trace_stream_ok);
    tcase_add_test(tc, hs_trace_stream_waiting);
    tcase_add_test(tc, hs_resize_honoured);
    tcase_add_loop_test(tc, hs_resize_bad_offer, 0, 11);
    tcase_add_test(tc, hs_resize_switched);
    tcase_add_loop_test(tc, hs_resize_bad_answer, 0, 6);
    tcase_add_loop_test(tc, hs_frag_pieces, 0, 7);
    tcase_add_loop_test(tc, hs_session_sent, 0, 2);
    tcase_add_loop_test(tc, hs_shm_records, 0, 10);
    tcase_add_loop_test(tc, hs_resume_bad, 0, 10);
    tcase_add_loop_test(tc, hs_session_active_checks, 0, 4);
    tcase_add_loop_test(tc, hs_resume_positions, 0, 2);
    tcase_add_test(tc, hs_resume_new_path);
    tcase_add_test(tc, hs_resume_request_vs_destroy);
    tcase_add_test(tc, hs_resume_tick);
    tcase_add_test(tc, hs_window_tick);
    tcase_add_test(tc, hs_session_early_without_bit);
    tcase_add_test(tc, hs_down_before_established_deadline);
    tcase_add_loop_test(tc, hs_record_before_established, 0, 2);
    tcase_add_test(tc, hs_reann_stale);
    tcase_add_test(tc, hs_reann_read_done);
    tcase_add_test(tc, hs_reann_inflight);
    tcase_add_loop_test(tc, hs_reann_bad, 0, 8);
    tcase_add_test(tc, hs_reann_sender);
    tcase_add_test(tc, hs_ka_ping_answered);
    tcase_add_loop_test(tc, hs_ka_ping_flood, 0, 2);
    tcase_add_test(tc, hs_ka_ping_without_feature);
    tcase_add_loop_test(tc, hs_ka_send_completion_not_alive, 0, 2);
    tcase_add_test(tc, hs_ka_ping_waits_for_credit);
    tcase_add_test(tc, hs_ka_receives_only_alive);
    tcase_add_test(tc, hs_announce_cap);
    tcase_add_loop_test(tc, hs_advert_cap, 0, 2);
    tcase_add_test(tc, hs_announce_budget);
    tcase_add_loop_test(tc, hs_named_rules, 0, 11);
    tcase_add_test(tc, hs_ring_cut_positions);
    tcase_add_loop_test(tc, hs_completion_kind, 0, 2);
    tcase_add_loop_test(tc, hs_ring_past_stop, 0, 2);
    tcase_add_test(tc, hs_session_token0);
    tcase_add_test(tc, hs_announce_nomem);
    suite_add_tcase(s, tc);
    return s;
}
