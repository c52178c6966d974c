/* SPDX-License-Identifier: MIT */
/* Golden tests: every wire encoding (wire.h, tcp_wire.h) pinned byte by byte. */
#include <arpa/inet.h>
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exs/proto/reqtrace.h"
#include "exs/prov/tcp/tcp.h"
#include "exs/util/json.h"
#include "exs/util/params.h"
#include "exs/proto/proto_int.h"
#include "exs/prov/tcp/tcp.h"
#include "exs/util/lockorder.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

/* Compare n bytes against the expected ones, naming the first difference. */
#define assert_bytes(_got, _want, _n)                                                              \
    do {                                                                                           \
        const uint8_t *g_ = (const uint8_t *)(_got), *w_ = (const uint8_t *)(_want);               \
        for (size_t i_ = 0; i_ < (size_t)(_n); i_++)                                               \
            ck_assert_msg(g_[i_] == w_[i_], "byte %zu: got 0x%02x, want 0x%02x", i_, g_[i_],       \
                          w_[i_]);                                                                 \
    } while (0)

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* ---- what the protocol really sends, captured from the mock ---- */

#define CAP_MAX 64
static struct cap {
    struct exs_prov_ep *ep;
    int opcode;
    uint32_t imm;
    uint32_t len;
    uint8_t bytes[EXS_WIRE_CTRL_MAX];
} caps[CAP_MAX];
static int ncaps;

static void cap_tap(void *arg, struct exs_prov_ep *ep, const struct exs_prov_send_wr *wr,
                    const uint8_t *p, uint32_t len)
{
    (void)arg;
    if (ncaps == CAP_MAX)
        return;
    caps[ncaps].ep = ep;
    caps[ncaps].opcode = wr->opcode;
    caps[ncaps].imm = wr->imm_data;
    caps[ncaps].len = len;
    if (wr->opcode == EXS_PROV_WR_SEND || wr->opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM)
        memcpy(caps[ncaps].bytes, p, len < EXS_WIRE_CTRL_MAX ? len : EXS_WIRE_CTRL_MAX);
    ncaps++;
}

static struct pt_pair pp;

static void gp_setup(int sock_type, int xfer_mode)
{
    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    ncaps = 0;
    mock_set_reorder(0);
    pt_params(&pp.pa, sock_type);
    pt_params(&pp.pb, sock_type);
    pp.pa.xfer_mode = xfer_mode;
    pt_open(&pp, sock_type);
    pt_connect(&pp);
    mock_set_tap(cap_tap, NULL);
}

static void gp_teardown(void)
{
    mock_set_tap(NULL, NULL);
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    pt_close(&pp);
}

/* The first captured SEND of ep at or after index *from. */
static struct cap *cap_send(struct exs_prov_ep *ep, int *from)
{
    for (int i = *from; i < ncaps; i++) {
        if (caps[i].ep == ep && caps[i].opcode == EXS_PROV_WR_SEND) {
            *from = i + 1;
            return &caps[i];
        }
    }
    ck_abort_msg("no SEND captured");
    return NULL;
}

static struct cap *cap_op(struct exs_prov_ep *ep, int opcode)
{
    for (int i = 0; i < ncaps; i++)
        if (caps[i].ep == ep && caps[i].opcode == opcode)
            return &caps[i];
    ck_abort_msg("no work request of opcode %d captured", opcode);
    return NULL;
}

START_TEST(golden_hello)
{
    struct exs_conn_params p;
    struct exs_prov_ctx *ctx;
    struct exs_conn *conn;
    struct exs_wire_hello h;
    uint8_t want[EXS_WIRE_HELLO_LEN] = {
        0x45, 0x58,                         /* magic "EX" */
        0x02,                               /* version 2 */
        0x01,                               /* STREAM */
        0x03, 0x7f,                         /* features: keepalive | read | batch | drain |
                                               trace | resize | frag | strace (bit 8) |
                                               alive (bit 9) */
        0x00, 0x21,                         /* credits 33 */
        0x00, 0x00, 0x02, 0x00,             /* ctrl_size 512 */
        0x00, 0x00, 0x20, 0x00,             /* ring_size 8192 */
        0,    0,    0,    0,    0, 0, 0, 0, /* ring_addr: below */
        0,    0,    0,    0,                /* ring_rkey: reserved since v2 (0) */
        0x00, 0x00, 0x07, 0xc0,             /* eager_max 1984 */
        0x00, 0x00, 0x00, 0x00,             /* max_msg 0 */
        0x02,                               /* xfer_mode indirect-only */
        0x00,                               /* hflags: no resume (§9.2) */
        0x00, 0x00,                         /* reserved */
    };

    unit_env_clean();
    pt_params(&p, SOCK_STREAM);
    p.credits = 33;
    p.ring_size = 8192;
    p.eager_max = 1984;
    p.xfer_mode = EXS_XFER_INDIRECT_ONLY;
    ck_assert_int_eq(mock_ctx_open(NULL, &ctx), 0);
    ck_assert_int_eq(exs__conn_create(ctx, &p, &(struct exs_conn_cb){0}, NULL, &conn), 0);
    memset(&h, 0xee, sizeof(h));
    exs__conn_hello(conn, &h);
    put_be(want + 16, (uintptr_t)conn->ring, 8);
    assert_bytes(&h, want, sizeof(want));
    /* and the SEQPACKET type byte */
    conn->p.sock_type = SOCK_SEQPACKET;
    exs__conn_hello(conn, &h);
    ck_assert_uint_eq(((uint8_t *)&h)[3], 0x02);
    /* the checker accepts exactly this and refuses each broken field */
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_SEQPACKET), 0);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), EXS_WIRE_REJ_SOCK_TYPE);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h) - 1, SOCK_SEQPACKET),
                     EXS_WIRE_REJ_VERSION);
    /* finding 6: a STREAM peer without a ring would make the writer divide by zero */
    conn->p.sock_type = SOCK_STREAM;
    exs__conn_hello(conn, &h);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), 0);
    memset((uint8_t *)&h + 12, 0, 4);
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), EXS_WIRE_REJ_HELLO);
    ((uint8_t *)&h)[2] = 1; /* v1 is not spoken any more */
    ck_assert_int_eq(exs__conn_hello_check(&h, sizeof(h), SOCK_STREAM), EXS_WIRE_REJ_VERSION);
    exs__conn_destroy(conn);
    exs__prov_ctx_close(ctx);
    ck_assert_uint_eq(mock_violations(), 0);
}
END_TEST

START_TEST(golden_reject)
{
    struct exs_wire_reject r = {.magic = htobe16(EXS_WIRE_MAGIC),
                                .version = EXS_WIRE_VERSION,
                                .reason = EXS_WIRE_REJ_CLOSING};
    static const uint8_t want[EXS_WIRE_REJECT_LEN] = {0x45, 0x58, 0x02, 0x05};

    assert_bytes(&r, want, sizeof(want));
    ck_assert_int_eq(EXS_WIRE_REJ_VERSION, 1);
    ck_assert_int_eq(EXS_WIRE_REJ_SOCK_TYPE, 2);
    ck_assert_int_eq(EXS_WIRE_REJ_BACKLOG, 3);
    ck_assert_int_eq(EXS_WIRE_REJ_RESOURCES, 4);
    ck_assert_int_eq(EXS_WIRE_REJ_CLOSING, 5);
    ck_assert_int_eq(EXS_WIRE_REJ_HELLO, 6);
    ck_assert_int_eq(EXS_WIRE_REJ_RESUME, 7); /* a resume hello not taken (§9.2) */
}
END_TEST

/* The reject the passive side really sends on a socket type mismatch. */
START_TEST(golden_reject_sent)
{
    static const uint8_t want[EXS_WIRE_REJECT_LEN] = {0x45, 0x58, 0x02, 0x02};
    struct exs_prov_cm_event ev;
    int got = 0;

    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    pt_params(&pp.pa, SOCK_STREAM);
    pt_params(&pp.pb, SOCK_SEQPACKET);
    pt_open(&pp, SOCK_STREAM);
    pt_connect_to(&pp, NULL, 0);
    /* b's side, as the driver (and exs/api/sock.c) does it */
    pt_dispatch_ctx(&pp, pp.b.ctx);
    while (exs__prov_cm_poll(pp.a.ctx, &ev) == 1) {
        if (ev.type != EXS_PROV_CM_REJECTED)
            continue;
        ck_assert_uint_eq(ev.private_data_len, EXS_WIRE_REJECT_LEN);
        assert_bytes(ev.private_data, want, sizeof(want));
        got = 1;
        exs__conn_on_cm(pp.a.conn, &ev);
    }
    ck_assert(got);
    pt_run(&pp);
    ck_assert_int_eq(pp.a.est_err, ECONNREFUSED);
    pt_close(&pp);
}
END_TEST

START_TEST(golden_imm_layout)
{
    ck_assert_uint_eq(exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 5, 0), 0x60050000u);
    ck_assert_uint_eq(exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM | EXS_IMM_TRUNC, 0xfff, 0xbeef),
                      0x3fffbeefu);
    ck_assert_uint_eq(exs_imm_make(EXS_IMM_INDIRECT, 0, 0x1000, 0x12345), 0x40002345u);
    ck_assert_uint_eq(exs_imm_kind(0x7fffffffu), EXS_IMM_INDIRECT);
    ck_assert_uint_eq(exs_imm_kind(0xc0000000u), 3);
    ck_assert_uint_eq(exs_imm_credits(0x0abc0000u), 0xabc);
    ck_assert_uint_eq(exs_imm_tag(0xffff1234u), 0x1234);
    ck_assert_uint_eq(EXS_IMM_EOM, 1u << 29);
    ck_assert_uint_eq(EXS_IMM_TRUNC, 1u << 28);
}
END_TEST

/* The immediates the protocol really puts on eager, direct and ring writes. */
START_TEST(golden_imm_sent)
{
    static uint8_t sb[8000], rb[8000];
    struct pt_op s, r;

    gp_setup(SOCK_SEQPACKET, EXS_XFER_DYNAMIC);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, 100, 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    /* eager: INDIRECT, eom, one credit owed (for b's RING record), tag 0 */
    ck_assert_uint_eq(cap_op(pp.a.conn->ep, EXS_PROV_WR_RDMA_WRITE_WITH_IMM)->imm, 0x60010000u);
    ck_assert_uint_eq(cap_op(pp.a.conn->ep, EXS_PROV_WR_RDMA_WRITE_WITH_IMM)->len, 100);
    pt_op_fini(&s);
    ncaps = 0;
    /* b answers directly into a's advertised receive 0 (advert id 0): DIRECT, eom,
     * trunc (8000 > 5000), three credits owed to a (a's RING, the eager write, the ADVERT's SEND)
     */
    pt_op_init(&r, &pp.a, EXS_OP_RECV, rb, 5000, 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    pt_op_init(&s, &pp.b, EXS_OP_SEND, sb, 8000, 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    ck_assert_uint_eq(cap_op(pp.b.conn->ep, EXS_PROV_WR_RDMA_WRITE_WITH_IMM)->imm, 0x30030000u);
    ck_assert_uint_eq(cap_op(pp.b.conn->ep, EXS_PROV_WR_RDMA_WRITE_WITH_IMM)->len, 5000);
    ck_assert_int_eq(r.op.result, 5000);
    pt_op_fini(&s);
    pt_op_fini(&r);
    gp_teardown();
}
END_TEST

/* STREAM ADVERT with WAITALL; then ring data and the ACK. */
/* A STREAM receive with WAITALL, advertised. */
START_TEST(golden_advert_ack)
{
    static uint8_t rb[5000];
    struct pt_op r;
    uint8_t want[EXS_WIRE_ADVERT_LEN] = {
        0x02, 0x01, 0x00, 0x28, 0x00, 0x01, 0x00, 0x00, /* ADVERT, WAITALL, 40, 1 credit */
        0,    0,    0,    0,    0,    0,    0,    0,    /* addr: below */
        0x00, 0x00, 0x13, 0x88,                         /* len 5000 */
        0,    0,    0,    0,                            /* rkey: below */
        0,    0,    0,    0,    0,    0,    0,    0,    /* seq (S_A) 0 */
        0x00, 0x00, 0x00, 0x00,                         /* phase 0 (direct) */
        0x00, 0x00, 0x00, 0x00,                         /* advert id 0 */
    };
    int from = 0;

    gp_setup(SOCK_STREAM, EXS_XFER_DYNAMIC);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), MSG_WAITALL);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    struct cap *c = cap_send(pp.b.conn->ep, &from);
    ck_assert_uint_eq(c->len, EXS_WIRE_ADVERT_LEN);
    put_be(want + 8, (uintptr_t)rb, 8);
    put_be(want + 20, r.op.rkey, 4);
    assert_bytes(c->bytes, want, sizeof(want));
    ck_assert_uint_eq(cap_op(pp.b.conn->ep, EXS_PROV_WR_SEND)->len, EXS_WIRE_ADVERT_LEN);
    /* the receive is handed back by the close; its registration goes before the ctx */
    mock_set_tap(NULL, NULL);
    exs__conn_close(pp.a.conn);
    exs__conn_close(pp.b.conn);
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    pt_op_fini(&r);
    pt_close(&pp);
}
END_TEST

/* Ring bytes consumed come back in an ACK: type 1, len 16, returned credits, count. */
START_TEST(golden_ack)
{
    static uint8_t sb[3000], rb[3000];
    struct pt_op s, r;
    static const uint8_t want[EXS_WIRE_ACK_LEN] = {
        0x01, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, /* ACK, 16 bytes, 0 credits */
        0,    0,    0,    0,    0,    0,    0x0b, 0xb8, /* ring_consumed 3000 */
    };
    int from = 0;

    gp_setup(SOCK_STREAM, EXS_XFER_DYNAMIC);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), MSG_WAITALL);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert_int_eq(r.op.result, 3000);
    struct cap *c = cap_send(pp.b.conn->ep, &from);
    ck_assert_uint_eq(c->len, EXS_WIRE_ACK_LEN);
    /* the credits of a's RING and of the one WWI ride along in the header: 2 */
    uint8_t w[EXS_WIRE_ACK_LEN];
    memcpy(w, want, sizeof(w));
    w[5] = 0x02;
    assert_bytes(c->bytes, w, sizeof(w));
    pt_op_fini(&r);
    pt_op_fini(&s);
    gp_teardown();
}
END_TEST

/* STREAM ring autotuning (§7.4): b offers a new 8 KiB region in a RESIZE record (type 10,
 * len 32, flags 0, addr, size, rkey, pos 0); a answers SWITCHED (flags 1) with addr and
 * rkey 0, the size echoed and pos = the ring position where the new region begins. */
START_TEST(golden_resize)
{
    static uint8_t sb[3000], rb[3000];
    uint8_t offer[EXS_WIRE_RESIZE_LEN] = {
        0x0a, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, /* RESIZE, 32 bytes (credits: below) */
        0,    0,    0,    0,    0,    0,    0,    0,    /* addr: below */
        0x00, 0x00, 0x20, 0x00,                         /* size 8192 */
        0,    0,    0,    0,                            /* rkey: below */
        0,    0,    0,    0,    0,    0,    0,    0,    /* pos 0 */
    };
    uint8_t answer[EXS_WIRE_RESIZE_LEN] = {
        0x0a, 0x01, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, /* RESIZE SWITCHED, 32 bytes */
        0,    0,    0,    0,    0,    0,    0,    0,    /* addr 0 */
        0x00, 0x00, 0x20, 0x00,                         /* size 8192 echoed */
        0,    0,    0,    0,                            /* rkey 0 */
        0,    0,    0,    0,    0,    0,    0x0b, 0xb8, /* pos 3000 */
    };
    struct pt_op s, r;
    int from_a = 0, from_b = 0;

    gp_setup(SOCK_STREAM, EXS_XFER_INDIRECT_ONLY);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), MSG_WAITALL);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert_int_eq(r.op.result, 3000);
    from_a = from_b = ncaps; /* what follows the offer */
    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__stream_ring_offer_locked(pp.b.conn, 8192, 0), 0);
    uint64_t addr = (uintptr_t)pp.b.conn->autotune.next_mem->addr;
    uint32_t rkey = pp.b.conn->autotune.next_grant->rkey;
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    pt_run(&pp);
    put_be(offer + 8, addr, 8);
    put_be(offer + 20, rkey, 4);
    struct cap *c = cap_send(pp.b.conn->ep, &from_b);
    ck_assert_uint_eq(c->len, EXS_WIRE_RESIZE_LEN);
    offer[4] = c->bytes[4]; /* returned credits vary with the run */
    offer[5] = c->bytes[5];
    assert_bytes(c->bytes, offer, sizeof(offer));
    c = cap_send(pp.a.conn->ep, &from_a);
    ck_assert_uint_eq(c->len, EXS_WIRE_RESIZE_LEN);
    answer[4] = c->bytes[4];
    answer[5] = c->bytes[5];
    assert_bytes(c->bytes, answer, sizeof(answer));
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    pt_op_fini(&r);
    pt_op_fini(&s);
    gp_teardown();
}
END_TEST

/* SEQPACKET rendezvous: ANNOUNCE, then READ_DONE; then SHUTDOWN. */
START_TEST(golden_announce_read_done_shutdown)
{
    static uint8_t sb[6000], rb[6000];
    struct pt_op s, r, sh;
    uint8_t ann[EXS_WIRE_ANNOUNCE_LEN] = {
        0x03, 0x00, 0x00, 0x20, 0x00, 0x01, 0x00, 0x00, /* ANNOUNCE, 32 bytes, 1 credit */
        0,    0,    0,    0,    0,    0,    0,    0,    /* addr: below */
        0x00, 0x00, 0x17, 0x70,                         /* len 6000 */
        0,    0,    0,    0,                            /* rkey: below */
        0,    0,    0,    0,    0,    0,    0,    0,    /* message 0 */
    };
    uint8_t rd[EXS_WIRE_READ_DONE_LEN] = {
        0x04, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, /* READ_DONE, 16 bytes */
        0,    0,    0,    0,    0,    0,    0,    0,    /* message 0 */
    };
    uint8_t shut[EXS_WIRE_SHUTDOWN_LEN] = {
        0x05, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, /* SHUTDOWN, 16 bytes */
        0,    0,    0,    0,    0,    0,    0,    0x01, /* one message sent in all */
    };
    int fa = 0, fb = 0;

    gp_setup(SOCK_SEQPACKET, EXS_XFER_DYNAMIC);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    struct cap *c = cap_send(pp.a.conn->ep, &fa);
    ck_assert_uint_eq(c->len, EXS_WIRE_ANNOUNCE_LEN);
    put_be(ann + 8, (uintptr_t)sb, 8);
    put_be(ann + 20, s.op.rkey, 4);
    assert_bytes(c->bytes, ann, sizeof(ann));

    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_run(&pp);
    ck_assert_int_eq(s.op.result, 6000);
    c = cap_send(pp.b.conn->ep, &fb);
    ck_assert_uint_eq(c->len, EXS_WIRE_READ_DONE_LEN);
    rd[5] = 0x02; /* the receives of a's RING and ANNOUNCE, re-posted */
    assert_bytes(c->bytes, rd, sizeof(rd));

    pt_op_init(&sh, &pp.a, EXS_OP_SHUTDOWN, NULL, 0, 0);
    ck_assert_int_eq(pt_post(&sh), 0);
    pt_run(&pp);
    c = cap_send(pp.a.conn->ep, &fa);
    ck_assert_uint_eq(c->len, EXS_WIRE_SHUTDOWN_LEN);
    shut[5] = 0x01; /* the READ_DONE's receive */
    assert_bytes(c->bytes, shut, sizeof(shut));
    pt_op_fini(&s);
    pt_op_fini(&r);
    pt_op_fini(&sh);
    gp_teardown();
}
END_TEST

/* §6.1: a SEQPACKET batched write as sent: the immediate (INDIRECT, eom, tag = number
 * of messages) and the records (len, reserved 0, payload, zero padding to 8). */
START_TEST(golden_batch_sent)
{
    static uint8_t m0[3] = {'a', 'b', 'c'}, m1[1],
                   m2[9] = {'0', '1', '2', '3', '4', '5', '6', '7', '8'};
    static const uint8_t want[32] = {
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* len 0, reserved */
        0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, /* len 9, reserved */
        '0',  '1',  '2',  '3',  '4',  '5',  '6',  '7',  /* payload */
        '8',  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* payload, padding */
    };
    struct pt_op s[3];
    struct cap *c = NULL;
    int n = 0;

    gp_setup(SOCK_SEQPACKET, EXS_XFER_DYNAMIC);
    pt_op_init(&s[0], &pp.a, EXS_OP_SEND, m0, sizeof(m0), 0);
    ck_assert_int_eq(pt_post(&s[0]), 0); /* alone: in flight */
    pt_op_init(&s[1], &pp.a, EXS_OP_SEND, m1, 0, 0);
    ck_assert_int_eq(pt_post(&s[1]), 0);
    pt_op_init(&s[2], &pp.a, EXS_OP_SEND, m2, sizeof(m2), 0);
    ck_assert_int_eq(pt_post(&s[2]), 0);
    pt_run(&pp);
    for (int i = 0; i < ncaps; i++) {
        if (caps[i].ep == pp.a.conn->ep && caps[i].opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM) {
            if (n++ == 1)
                c = &caps[i];
        }
    }
    ck_assert_int_eq(n, 2);
    ck_assert_uint_eq(c->len, sizeof(want));
    ck_assert_uint_eq(c->imm & ~(EXS_IMM_CREDITS_MAX << EXS_IMM_CREDITS_SHIFT),
                      0x40000000u | 0x20000000u | 2u); /* INDIRECT, eom, 2 messages */
    assert_bytes(c->bytes, want, sizeof(want));
    ck_assert_uint_eq(EXS_WIRE_FEAT_BATCH, 4);
    ck_assert_uint_eq(exs_wire_batch_rec_size(0), 8);
    ck_assert_uint_eq(exs_wire_batch_rec_size(1), 16);
    ck_assert_uint_eq(exs_wire_batch_rec_size(8), 16);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(s[i].done, 1);
        pt_op_fini(&s[i]);
    }
    gp_teardown();
}
END_TEST

START_TEST(golden_ctrl_constants)
{
    struct exs_wire_ctrl_hdr h = {.type = EXS_CTRL_NOP,
                                  .flags = 0,
                                  .len = htobe16(EXS_WIRE_NOP_LEN),
                                  .credits = htobe16(0x0102)};
    static const uint8_t want[8] = {0x06, 0x00, 0x00, 0x08, 0x01, 0x02, 0x00, 0x00};

    assert_bytes(&h, want, sizeof(want));
    ck_assert_int_eq(EXS_CTRL_ACK, 1);
    ck_assert_int_eq(EXS_CTRL_ADVERT, 2);
    ck_assert_int_eq(EXS_CTRL_ANNOUNCE, 3);
    ck_assert_int_eq(EXS_CTRL_READ_DONE, 4);
    ck_assert_int_eq(EXS_CTRL_SHUTDOWN, 5);
    ck_assert_int_eq(EXS_CTRL_NOP, 6);
    ck_assert_int_eq(EXS_WIRE_CTRL_MAX, 512);
    ck_assert_int_eq(EXS_WIRE_MAGIC, 0x4558);
}
END_TEST

/* §9.1 (feature ALIVE, bit 9): a's keepalive probe after a silent interval is one SEND of
 * one NOP record with flag 1 (PING) carrying a's owed credits; b answers at once with a
 * NOP, flags 0, carrying b's. */
START_TEST(golden_ping)
{
    uint8_t want[EXS_WIRE_NOP_LEN] = {0x06, 0x01, 0x00, 0x08, 0, 0, 0x00, 0x00};
    uint32_t owed, b_owed;
    int fa = 0, fb = 0;

    ck_assert_uint_eq(EXS_WIRE_FEAT_ALIVE, 0x200);
    ck_assert_uint_eq(EXS_WIRE_FEAT_ALL & EXS_WIRE_FEAT_ALIVE, 0x200);
    ck_assert_uint_eq(EXS_NOP_PING, 1);
    gp_setup(SOCK_SEQPACKET, EXS_XFER_DYNAMIC);
    ck_assert_uint_ne(pp.a.conn->peer.features & EXS_WIRE_FEAT_ALIVE, 0);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    pp.a.conn->keepalive.heard_ns -= 2000000000ull; /* silent for 2 s: the 1 s interval passed */
    pp.a.conn->keepalive.heard = 0; /* nothing heard since (the timer's look stamps that) */
    owed = pp.a.conn->owed;
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_uint_gt(exs__conn_timer(pp.a.conn, 1000), 0);
    ck_assert_uint_eq(pp.a.conn->stats.keepalive_probes, 1);
    b_owed = pp.b.conn->owed; /* what b owes before the PING arrives */
    pt_run(&pp);              /* the PING goes (the tap sees it on the fabric), b answers */
    struct cap *c = cap_send(pp.a.conn->ep, &fa);
    ck_assert_uint_eq(c->len, EXS_WIRE_NOP_LEN);
    put_be(want + 4, owed, 2);
    assert_bytes(c->bytes, want, sizeof(want));
    c = cap_send(pp.b.conn->ep, &fb);
    ck_assert_uint_eq(c->len, EXS_WIRE_NOP_LEN);
    want[1] = 0x00;
    put_be(want + 4, b_owed + 1, 2); /* with the PING's receive */
    assert_bytes(c->bytes, want, sizeof(want));
    for (int i = 0; i < ncaps; i++) /* the probe was no zero-byte WRITE */
        ck_assert_int_ne(caps[i].opcode, EXS_PROV_WR_RDMA_WRITE);
    gp_teardown();
}
END_TEST

/* The tcp provider's frame header (spec/provider-tcp.md), as exs__tcp_hdr_init and the
 * posting code fill it. */
START_TEST(golden_tcp_frame)
{
    struct tcp_wire_hdr h;
    struct tcp_wire_conn c = {.rnr_retry = 7, .rnr_timer_ms = 12};
    static const uint8_t want[TCP_WIRE_HDR_LEN] = {
        0x45, 0x58, 0x53, 0x54,                         /* "EXST" */
        0x01,                                           /* version */
        0x05,                                           /* WRITE */
        0x01,                                           /* F_IMM */
        0x00,                                           /* syndrome */
        0x00, 0x01, 0x02, 0x03,                         /* len */
        0x0a, 0x0b, 0x0c, 0x0d,                         /* psn */
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, /* raddr */
        0xca, 0xfe, 0xba, 0xbe,                         /* rkey */
        0xde, 0xad, 0xbe, 0xef,                         /* imm */
    };
    static const uint8_t want_conn[TCP_WIRE_CONN_LEN] = {7, 12, 0, 0, 0, 0, 0, 0};

    memset(&h, 0xee, sizeof(h));
    exs__tcp_hdr_init(&h, TCP_WIRE_WRITE, 0x010203);
    h.flags = TCP_WIRE_F_IMM;
    h.psn = htonl(0x0a0b0c0d);
    h.raddr = htobe64(0x1122334455667788ull);
    h.rkey = htonl(0xcafebabe);
    h.imm = htonl(0xdeadbeef);
    assert_bytes(&h, want, sizeof(want));
    exs__tcp_hdr_init(&h, TCP_WIRE_NAK, 0);
    ck_assert_uint_eq(((uint8_t *)&h)[5], 9);
    for (size_t i = 8; i < sizeof(h); i++)
        ck_assert_uint_eq(((uint8_t *)&h)[i], 0);
    assert_bytes(&c, want_conn, sizeof(want_conn));
    ck_assert_int_eq(TCP_WIRE_CONN_REQ, 1);
    ck_assert_int_eq(TCP_WIRE_CONN_ACCEPT, 2);
    ck_assert_int_eq(TCP_WIRE_CONN_REJECT, 3);
    ck_assert_int_eq(TCP_WIRE_SEND, 4);
    ck_assert_int_eq(TCP_WIRE_READ_REQ, 6);
    ck_assert_int_eq(TCP_WIRE_READ_RESP, 7);
    ck_assert_int_eq(TCP_WIRE_ACK, 8);
    ck_assert_int_eq(TCP_WIRE_DISCONNECT, 10);
    ck_assert_int_eq(TCP_WIRE_SYN_RNR_EXC, 1);
    ck_assert_int_eq(TCP_WIRE_SYN_REM_ACCESS, 2);
    ck_assert_int_eq(TCP_WIRE_SYN_REM_INV, 3);
    ck_assert_int_eq(TCP_WIRE_SYN_REM_OP, 4);
}
END_TEST

/* v2: each side's first record after ESTABLISHED is RING with its ring's key. */
START_TEST(golden_ring)
{
    uint8_t want[EXS_WIRE_RING_LEN] = {
        0x07, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, /* RING, 16 bytes, 0 credits */
        0,    0,    0,    0,                            /* rkey: below */
        0x00, 0x00, 0x00, 0x00,                         /* reserved */
    };
    int fa = 0, fb = 0;

    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    ncaps = 0;
    mock_set_reorder(0);
    pt_open(&pp, SOCK_SEQPACKET);
    mock_set_tap(cap_tap, NULL);
    pt_connect(&pp);
    struct cap *c = cap_send(pp.a.conn->ep, &fa);
    ck_assert_uint_eq(c->len, EXS_WIRE_RING_LEN);
    put_be(want + 8, pp.a.conn->ring_grant->rkey, 4);
    assert_bytes(c->bytes, want, sizeof(want));
    c = cap_send(pp.b.conn->ep, &fb);
    ck_assert_uint_eq(c->len, EXS_WIRE_RING_LEN);
    put_be(want + 8, pp.b.conn->ring_grant->rkey, 4);
    assert_bytes(c->bytes, want, sizeof(want));
    ck_assert_uint_ne(pp.a.conn->ring_grant->rkey, pp.b.conn->ring_grant->rkey);
    ck_assert_int_eq(EXS_CTRL_RING, 7);
    gp_teardown();
}
END_TEST

/* §9.2 (feature RESUMABLE): with both sides resumable, both hellos have bit 7 and each
 * side's first SEND is RING then SESSION (type 11, 40 bytes) with its own 32-byte key:
 * the passive side's K_B, the active side's K_A; both ends then hold K_A || K_B and the
 * token, the first 8 bytes of SHA-256(K_B), which no record carries. With _i == 1 only
 * the active side is resumable: no SESSION, no token on either side. */
START_TEST(golden_session)
{
    uint8_t want[EXS_WIRE_RING_LEN + EXS_WIRE_SESSION_LEN] = {
        0x07, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, /* RING, 16 bytes, 0 credits */
        0,    0,    0,    0,                            /* rkey: below */
        0x00, 0x00, 0x00, 0x00,                         /* reserved */
        0x0b, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x00, /* SESSION, 40 bytes, 0 credits */
        /* key (32): below */
    };
    struct exs_wire_hello h;
    uint8_t tok[8];
    int fa = 0, fb = 0;

    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    ncaps = 0;
    mock_set_reorder(0);
    pt_params(&pp.pa, SOCK_STREAM);
    pt_params(&pp.pb, SOCK_STREAM);
    pp.pa.resumable = 1;
    pp.pb.resumable = !_i;
    pt_open(&pp, SOCK_STREAM);
    mock_set_tap(cap_tap, NULL);
    pt_connect(&pp);
    exs__conn_hello(pp.a.conn, &h);
    ck_assert_uint_eq(be16toh(h.features), 0x3ff); /* every bit, RESUMABLE (7) too */
    exs__conn_hello(pp.b.conn, &h);
    ck_assert_uint_eq(be16toh(h.features), _i ? 0x37f : 0x3ff);
    for (int side = 0; side < 2; side++) {
        struct exs_conn *c = side ? pp.b.conn : pp.a.conn;
        struct cap *cp = cap_send(c->ep, side ? &fb : &fa);

        put_be(want + 8, c->ring_grant->rkey, 4);
        if (_i) {
            ck_assert_uint_eq(cp->len, EXS_WIRE_RING_LEN); /* RING alone */
            assert_bytes(cp->bytes, want, EXS_WIRE_RING_LEN);
            ck_assert_uint_eq(c->sess_token, 0);
            ck_assert_int_eq(c->resume.keys, 0);
            continue;
        }
        ck_assert_uint_eq(cp->len, sizeof(want));
        /* K_A first in the HMAC key, then K_B */
        memcpy(want + 24, c->resume.key + (side ? EXS_WIRE_SESSION_KEY_LEN : 0), 32);
        assert_bytes(cp->bytes, want, sizeof(want));
        ck_assert_int_eq(c->resume.keys, EXS_RSM_KEY_OWN | EXS_RSM_KEY_PEER);
    }
    if (!_i) {
        ck_assert_int_eq(memcmp(pp.a.conn->resume.key, pp.b.conn->resume.key, 64), 0);
        ck_assert_uint_ne(pp.b.conn->sess_token, 0);
        ck_assert_uint_eq(pp.a.conn->sess_token, pp.b.conn->sess_token);
        ck_assert_uint_eq(pp.b.conn->sess_token,
                          exs__resume_token_of(pp.b.conn->resume.key + EXS_WIRE_SESSION_KEY_LEN));
        put_be(tok, pp.b.conn->sess_token, 8);
        for (int i = 0; i < ncaps; i++) /* the token itself is on no record */
            for (uint32_t off = 0; off + 8 <= caps[i].len; off++)
                ck_assert_int_ne(memcmp(caps[i].bytes + off, tok, 8), 0);
    }
    for (int i = 0; i < ncaps; i++) /* nothing else carries a SESSION */
        if (caps[i].opcode == EXS_PROV_WR_SEND && i != fa - 1 && i != fb - 1)
            for (uint32_t off = 0; off + EXS_WIRE_CTRL_HDR_LEN <= caps[i].len;
                 off += (uint32_t)caps[i].bytes[off + 2] << 8 | caps[i].bytes[off + 3])
                ck_assert_uint_ne(caps[i].bytes[off], EXS_CTRL_SESSION);
    ck_assert_int_eq(EXS_CTRL_SESSION, 11);
    gp_teardown();
}
END_TEST

/* The SHM_SWITCH records in ep's SENDs from capture from on, each asserted to be 0f FLAGS 00 08
 * (type 15, the header alone); how many. */
static int cap_shm_switches(const struct exs_prov_ep *ep, int from, uint8_t flags)
{
    const uint8_t want[4] = {0x0f, flags, 0x00, 0x08};
    int n = 0;

    for (int i = from; i < ncaps; i++)
        if (caps[i].ep == ep && caps[i].opcode == EXS_PROV_WR_SEND)
            for (uint32_t o = 0; o + EXS_WIRE_CTRL_HDR_LEN <= caps[i].len;
                 o += (uint32_t)caps[i].bytes[o + 2] << 8 | caps[i].bytes[o + 3])
                if (caps[i].bytes[o] == EXS_CTRL_SHM_SWITCH) {
                    assert_bytes(caps[i].bytes + o, want, sizeof(want));
                    n++;
                }
    return n;
}

/* spec/provider-shm.md, Chosen by itself (feature SHM, bit 10): with both sides resumable
 * and shm on, both hellos have bits 7 and 10 and each side's first SEND is RING, SESSION,
 * then SHM_OFFER (type 14, 48 bytes): the boot id (16), the network name space's inode
 * (8), the effective uid (4) and the pid (4), 8 zero bytes. The passive side, whose
 * offer matches the active side's (one process), then sends SHM_SWITCH (type 15, the
 * header alone); the active side, which finds no shm listener there (the mock), declines
 * (SHM_SWITCH with flag DECLINED, 1). */
START_TEST(golden_shm_offer)
{
    uint8_t want[EXS_WIRE_SHM_OFFER_LEN] = {
        0x0e, 0x00, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, /* SHM_OFFER, 48 bytes, 0 credits */
    };
    const uint32_t off = EXS_WIRE_RING_LEN + EXS_WIRE_SESSION_LEN;
    struct exs_wire_hello h;
    char text[64] = "";
    struct stat st;
    int fa = 0, fb = 0;
    FILE *f;

    ck_assert_uint_eq(EXS_WIRE_FEAT_SHM, 0x400);
    ck_assert_uint_eq(EXS_WIRE_FEAT_ALL & EXS_WIRE_FEAT_SHM, 0);
    ck_assert_int_eq(EXS_CTRL_SHM_OFFER, 14);
    ck_assert_int_eq(EXS_CTRL_SHM_SWITCH, 15);
    /* the expected offer, from the system's own sources */
    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(text, sizeof(text), f));
    fclose(f);
    for (int i = 0, n = 0; text[i] && n < 32; i++) {
        const char *hex = "0123456789abcdef", *d = strchr(hex, text[i]);

        if (!d || !*d)
            continue; /* a dash, the newline */
        want[8 + n / 2] |= (uint8_t)(n % 2 ? d - hex : (d - hex) << 4);
        n++;
    }
    ck_assert_int_eq(stat("/proc/self/ns/net", &st), 0);
    put_be(want + 24, (uint64_t)st.st_ino, 8);
    put_be(want + 32, geteuid(), 4);
    put_be(want + 36, (uint64_t)getpid(), 4);

    unit_env_clean();
    memset(&pp, 0, sizeof(pp));
    ncaps = 0;
    mock_set_reorder(0);
    pt_params_resumable(&pp, SOCK_SEQPACKET, 1);
    pt_open(&pp, SOCK_SEQPACKET);
    mock_set_tap(cap_tap, NULL);
    pt_connect(&pp);
    pt_run(&pp);
    exs__conn_hello(pp.a.conn, &h);
    ck_assert_uint_eq(be16toh(h.features), 0x7ff); /* every bit, 7 and 10 too */
    for (int side = 0; side < 2; side++) {
        struct exs_conn *c = side ? pp.b.conn : pp.a.conn;
        struct cap *cp = cap_send(c->ep, side ? &fb : &fa);

        ck_assert_uint_eq(cp->len, off + EXS_WIRE_SHM_OFFER_LEN);
        ck_assert_uint_eq(cp->bytes[EXS_WIRE_RING_LEN], EXS_CTRL_SESSION);
        assert_bytes(cp->bytes + off, want, sizeof(want));
    }
    /* b's later SENDs: one SHM_SWITCH record, 8 bytes, flags 0 */
    ck_assert_int_eq(cap_shm_switches(pp.b.conn->ep, fb, 0x00), 1);
    ck_assert_int_eq(pp.a.conn->shmsw.sw, 1);
    /* a finds no shm listener of b's port (the mock has none) and stays: its answer is
     * SHM_SWITCH with flag DECLINED (1), once; b then gives up the cut-over too */
    ck_assert_int_eq(EXS_WIRE_SHM_SWITCH_DECLINED, 1);
    ck_assert_int_eq(cap_shm_switches(pp.a.conn->ep, fa, 0x01), 1);
    ck_assert_int_eq(pp.a.conn->shmsw.reason, EXS_SHMSW_NO_LISTENER);
    ck_assert_int_eq(pp.b.conn->shmsw.reason, EXS_SHMSW_DECLINED);
    ck_assert_int_eq(pp.b.conn->resume.over, 1);
    gp_teardown();
}
END_TEST

/* §9.2: the RESUME record's layout (type 12, 48 bytes), the AUTH record's (type 13, 40
 * bytes), the resume connect's private data (hello, token, nonce_A: 56 bytes) and the
 * accept's (hello, nonce_B, MAC_B: 56 bytes), and the proof itself pinned on a fixed key
 * and nonces (K_A || K_B = 00 01 .. 3f, nonce_A = a0 .. a7, nonce_B = b0 .. b7; values
 * from an independent HMAC-SHA256): AUTH = HMAC(key, 'A' nonce_A nonce_B), MAC_B = the
 * first 8 bytes of HMAC(key, 'B' nonce_A nonce_B), token of K_B = 20 .. 3f. */
START_TEST(golden_resume_layout)
{
    struct exs_wire_resume r = {
        .hdr = {.type = EXS_CTRL_RESUME, .len = htobe16(EXS_WIRE_RESUME_LEN)},
        .token = htobe64(0x0102030405060708ull),
        .rx_msgs = htobe64(0x11),
        .rx_bytes = htobe64(0x123456789aull),
        .ring_arrived = htobe64(0x2000),
        .ring_consumed = htobe64(0x1f40),
    };
    static const uint8_t want[EXS_WIRE_RESUME_LEN] = {
        0x0c, 0x00, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, /* RESUME, 48 bytes */
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* token */
        0,    0,    0,    0,    0,    0,    0,    0x11, /* rx_msgs 17 */
        0,    0,    0,    0x12, 0x34, 0x56, 0x78, 0x9a, /* rx_bytes */
        0,    0,    0,    0,    0,    0,    0x20, 0x00, /* ring_arrived */
        0,    0,    0,    0,    0,    0,    0x1f, 0x40, /* ring_consumed */
    };
    static const uint8_t auth_want[32] = {
        0xba, 0x31, 0x82, 0xe6, 0xd7, 0x99, 0x12, 0x28, 0x31, 0xa1, 0xf8,
        0x49, 0x75, 0x9d, 0xca, 0x5f, 0xcb, 0x22, 0xe7, 0x95, 0xf3, 0xc6,
        0x51, 0x55, 0x07, 0x2e, 0x54, 0xb9, 0x5f, 0x5c, 0xf3, 0xb2,
    };
    static const uint8_t mac_b_want[8] = {0x39, 0x80, 0xee, 0xcc, 0x62, 0x79, 0x98, 0x46};
    struct exs_wire_auth a = {.hdr = {.type = EXS_CTRL_AUTH, .len = htobe16(EXS_WIRE_AUTH_LEN)}};
    static const uint8_t auth_hdr[8] = {0x0d, 0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x00};
    uint8_t key[64], na[8], nb[8], mac[32];
    struct exs_wire_resume_req q;
    struct exs_wire_resume_acc acc;

    assert_bytes(&r, want, sizeof(want));
    ck_assert_int_eq(EXS_CTRL_RESUME, 12);
    /* the new path's hello: byte 37 (hflags) bit 0 RESUME, with feature bit 7 */
    ck_assert_uint_eq(offsetof(struct exs_wire_hello, hflags), 37);
    ck_assert_int_eq(EXS_WIRE_HELLO_F_RESUME, 0x01);
    ck_assert_int_eq(EXS_WIRE_FEAT_RESUMABLE, 0x80);
    ck_assert_int_eq(EXS_WIRE_FEAT_ALL & EXS_WIRE_FEAT_RESUMABLE, 0);
    /* the connect's private data: the 40-byte hello, the token at 40-47, nonce_A at 48-55 */
    ck_assert_int_eq(EXS_WIRE_RESUME_PD_LEN, 56);
    ck_assert_uint_eq(sizeof(q), 56);
    ck_assert_uint_eq(offsetof(struct exs_wire_resume_req, token), 40);
    ck_assert_uint_eq(offsetof(struct exs_wire_resume_req, nonce_a), 48);
    /* the accept's: the hello, nonce_B at 40-47, MAC_B at 48-55 */
    ck_assert_int_eq(EXS_WIRE_RESUME_ACC_LEN, 56);
    ck_assert_uint_eq(sizeof(acc), 56);
    ck_assert_uint_eq(offsetof(struct exs_wire_resume_acc, nonce_b), 40);
    ck_assert_uint_eq(offsetof(struct exs_wire_resume_acc, mac_b), 48);
    /* AUTH: type 13, 40 bytes, the whole HMAC after the header */
    ck_assert_int_eq(EXS_CTRL_AUTH, 13);
    ck_assert_uint_eq(sizeof(a), 40);
    assert_bytes(&a, auth_hdr, sizeof(auth_hdr));
    ck_assert_uint_eq(offsetof(struct exs_wire_auth, mac), 8);
    /* the proofs on fixed inputs */
    for (int i = 0; i < 64; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 8; i++) {
        na[i] = (uint8_t)(0xa0 + i);
        nb[i] = (uint8_t)(0xb0 + i);
    }
    exs__resume_mac(key, EXS_WIRE_AUTH_LABEL_A, na, nb, mac);
    assert_bytes(mac, auth_want, sizeof(auth_want));
    exs__resume_mac(key, EXS_WIRE_AUTH_LABEL_B, na, nb, mac);
    assert_bytes(mac, mac_b_want, sizeof(mac_b_want));
    ck_assert_uint_eq(exs__resume_token_of(key + 32), 0x72dbb7336c767800ull);
}
END_TEST

/* ---- request tracing (§5.1) ---- */

static char rt_json[512];
static int rt_records;

static void rt_sink(const char *json, size_t len)
{
    if (len < sizeof(rt_json)) {
        memcpy(rt_json, json, len);
        rt_json[len] = 0;
    }
    rt_records++;
}

static uint64_t get_be(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* A time read off the wire is not near this host's CLOCK_MONOTONIC (§5.1: it is on the
 * connection's trace clock, whose epoch is drawn at random 2^61 to 2^62 ns back): more
 * than a year away from it. */
static void rt_not_host_clock(uint64_t t)
{
    uint64_t now = exs__now_ns(), year = 365ull * 86400 * 1000000000;

    ck_assert_msg(t > now + year || t + year < now, "wire time %llu near the clock %llu",
                  (unsigned long long)t, (unsigned long long)now);
}

/* The first captured SEND of ep holding a TRACE record (alone in it), or NULL. */
static struct cap *cap_trace(struct exs_prov_ep *ep)
{
    for (int i = 0; i < ncaps; i++)
        if (caps[i].ep == ep && caps[i].opcode == EXS_PROV_WR_SEND &&
            caps[i].bytes[0] == EXS_CTRL_TRACE)
            return &caps[i];
    return NULL;
}

/* One sampled message (mask all ones): the request goes before the message, the answer
 * comes back with ordered times, the record is complete and consistent. With _i == 1 the
 * mask is 0: no TRACE record is sent and no record made. */
START_TEST(golden_trace)
{
    static uint8_t sb[10], rb[64];
    static const uint8_t req_hdr[8] = {0x09, 0x00, 0x00, 0x30}; /* TRACE, request, 48 bytes */
    struct pt_op s, r;
    int req_i = -1, wwi_i = -1;

    gp_setup(SOCK_SEQPACKET, EXS_XFER_DYNAMIC);
    exs__params.trace_sample_mask = _i ? 0 : UINT64_MAX;
    rt_records = 0;
    exs__reqtrace_set_sink(rt_sink);
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);
    pt_op_init(&s, &pp.a, EXS_OP_SEND, sb, sizeof(sb), 0);
    ck_assert_int_eq(pt_post(&s), 0);
    pt_run(&pp);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, 10);
    exs__reqtrace_set_sink(NULL);
    exs__params.trace_sample_mask = 0;
    if (_i) {
        ck_assert_ptr_null(cap_trace(pp.a.conn->ep));
        ck_assert_ptr_null(cap_trace(pp.b.conn->ep));
        ck_assert_int_eq(rt_records, 0);
        goto out;
    }
    for (int i = 0; i < ncaps; i++) {
        if (caps[i].ep != pp.a.conn->ep)
            continue;
        if (caps[i].opcode == EXS_PROV_WR_SEND && caps[i].bytes[0] == EXS_CTRL_TRACE && req_i < 0)
            req_i = i;
        if (caps[i].opcode == EXS_PROV_WR_RDMA_WRITE_WITH_IMM && wwi_i < 0)
            wwi_i = i;
    }
    ck_assert_int_ge(req_i, 0);
    ck_assert_int_gt(wwi_i, req_i); /* the request before the message */
    struct cap *c = &caps[req_i];
    ck_assert_uint_eq(c->len, EXS_WIRE_TRACE_LEN);
    assert_bytes(c->bytes, req_hdr, 4);
    ck_assert_uint_eq(c->bytes[6] | c->bytes[7], 0); /* reserved */
    ck_assert_uint_eq(get_be(c->bytes + 8), 0);      /* seq: message 0 */
    uint64_t t1 = get_be(c->bytes + 16);
    ck_assert_uint_ne(t1, 0);
    rt_not_host_clock(t1);
    for (int i = 24; i < 48; i++)
        ck_assert_uint_eq(c->bytes[i], 0); /* answer fields: 0 */

    c = cap_trace(pp.b.conn->ep);
    ck_assert_ptr_nonnull(c);
    /* the answer first in its SEND (an ACK of the ring slot may follow it) */
    ck_assert_uint_ge(c->len, EXS_WIRE_TRACE_LEN);
    ck_assert_uint_eq(c->bytes[3], EXS_WIRE_TRACE_LEN);
    ck_assert_uint_eq(c->bytes[1], EXS_TRACE_ANSWER);
    ck_assert_uint_eq(get_be(c->bytes + 8), 0);
    uint64_t t2 = get_be(c->bytes + 16), ta = get_be(c->bytes + 24);
    uint64_t td = get_be(c->bytes + 32), t3 = get_be(c->bytes + 40);
    /* each end's times are on its own trace clock (a random epoch per connection, §5.1) */
    uint64_t ea = pp.a.conn->rt->epoch_ns, eb = pp.b.conn->rt->epoch_ns;
    rt_not_host_clock(t2);
    rt_not_host_clock(t3);
    ck_assert_uint_ne(ea, eb);
    ck_assert_uint_le(t1 + ea, t2 + eb); /* one process, one clock */
    ck_assert_uint_le(t2, ta);
    ck_assert_uint_le(ta, td);
    ck_assert_uint_le(td, t3);

    ck_assert_int_eq(rt_records, 1);
    struct exs_json *j;
    ck_assert_int_eq(exs__json_parse(rt_json, strlen(rt_json), &j), 0);
    uint64_t post = exs__json_get_u64(j, "post_ns"), wire = exs__json_get_u64(j, "wire_ns");
    uint64_t done = exs__json_get_u64(j, "done_ns"), ans = exs__json_get_u64(j, "answer_ns");
    int64_t arr = exs__json_get_i64(j, "arrival_ns"), dlv = exs__json_get_i64(j, "delivery_ns");
    int64_t off = exs__json_get_i64(j, "offset_ns");
    int64_t err = (int64_t)exs__json_get_u64(j, "offset_err_ns");
    ck_assert_uint_eq(exs__json_get_u64(j, "seq"), 0);
    ck_assert_uint_eq(exs__json_get_u64(j, "bytes"), 10);
    ck_assert_uint_le(post, wire);
    ck_assert_uint_le(wire, t1 + ea); /* T1, back on a's clock */
    ck_assert_uint_le(t1 + ea, done);
    ck_assert_uint_le(t3 + eb, ans);
    /* one clock: the true offset is b's trace clock minus it, -eb; the estimate is within
     * its bound */
    int64_t miss = off - (int64_t)(0 - eb);
    ck_assert_int_le(miss < 0 ? -miss : miss, err);
    ck_assert_int_ge(arr + err, (int64_t)wire);
    ck_assert_int_le(arr, dlv);
    ck_assert_int_le(dlv, (int64_t)ans + err);
    ck_assert_int_eq(arr + off, (int64_t)ta);
    ck_assert_int_eq(dlv + off, (int64_t)td);
    exs__json_free(j);
out:
    pt_op_fini(&s);
    pt_op_fini(&r);
    gp_teardown();
}
END_TEST

/* Sampling rule (spec/observability.md §8). */
START_TEST(golden_trace_sampling)
{
    ck_assert(!exs__reqtrace_sampled(0, 0));
    ck_assert(exs__reqtrace_sampled(0, 1023));
    ck_assert(!exs__reqtrace_sampled(1, 1023));
    ck_assert(exs__reqtrace_sampled(2048, 1023));
    ck_assert(!exs__reqtrace_sampled(2049, 1023));
    ck_assert(exs__reqtrace_sampled(12345, UINT64_MAX));
    ck_assert(!exs__reqtrace_sampled(1, 1));
    ck_assert(exs__reqtrace_sampled(2, 1));
    ck_assert_int_eq(EXS_CTRL_TRACE, 9);
    ck_assert_uint_eq(EXS_WIRE_FEAT_TRACE, 16);
    ck_assert_uint_eq(EXS_WIRE_FEAT_STRACE, 256);
}
END_TEST

Suite *wire_golden_suite(void)
{
    Suite *s = suite_create("wire_golden");
    TCase *tc = tcase_create("golden");

    tcase_add_test(tc, golden_hello);
    tcase_add_test(tc, golden_reject);
    tcase_add_test(tc, golden_reject_sent);
    tcase_add_test(tc, golden_imm_layout);
    tcase_add_test(tc, golden_imm_sent);
    tcase_add_test(tc, golden_advert_ack);
    tcase_add_test(tc, golden_ack);
    tcase_add_test(tc, golden_announce_read_done_shutdown);
    tcase_add_test(tc, golden_ring);
    tcase_add_test(tc, golden_resize);
    tcase_add_loop_test(tc, golden_session, 0, 2);
    tcase_add_test(tc, golden_resume_layout);
    tcase_add_test(tc, golden_shm_offer);
    tcase_add_test(tc, golden_batch_sent);
    tcase_add_test(tc, golden_ctrl_constants);
    tcase_add_test(tc, golden_ping);
    tcase_add_test(tc, golden_tcp_frame);
    tcase_add_loop_test(tc, golden_trace, 0, 2);
    tcase_add_test(tc, golden_trace_sampling);
    suite_add_tcase(s, tc);
    return s;
}
