/* SPDX-License-Identifier: MIT */
/* Wire v2 grants seen from the peer: a raw provider endpoint speaks the protocol to a library
 * socket, gets the ring key from the RING record, and finds a receive buffer's key dead once the
 * receive completed; a second RING record resets the connection. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/proto/wire_names.h"
#include "exs/prov/prov.h"
#include "integ.h"

#define RAW_SLOTS 16
#define RAW_SLOT  EXS_WIRE_CTRL_MAX

struct rawp {
    struct exs_prov_ctx *ctx;
    struct exs_prov_ep *ep;
    struct exs_prov_mr *mr; /* RAW_SLOTS receive slots, then a send area */
    uint8_t *mem;
    uint32_t ring_rkey; /* from the library's RING record */
    int got_ring;
    struct exs_wire_advert adv; /* the last ADVERT received */
    int got_advert;
};

static void rawp_post_recv(struct rawp *r, uint32_t slot)
{
    struct exs_prov_sge sge = {(uintptr_t)(r->mem + (size_t)slot * RAW_SLOT), RAW_SLOT,
                               r->mr->lkey};
    struct exs_prov_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1};

    ck_assert_int_eq(exs__prov_post_recv(r->ep, &wr), 0);
}

/* Connect to addr as a SEQPACKET peer without a ring; returns once ESTABLISHED. */
static void rawp_connect(struct rawp *r, const struct sockaddr_in *addr)
{
    struct exs_prov_ep_attr attr = {.max_send_wr = 32, .max_recv_wr = RAW_SLOTS, .rnr_retry = 7};
    struct exs_wire_hello h = {
        .magic = htobe16(EXS_WIRE_MAGIC),
        .version = EXS_WIRE_VERSION,
        .sock_type = EXS_WIRE_SOCK_SEQPACKET,
        .credits = htobe16(RAW_SLOTS),
        .ctrl_size = htobe32(RAW_SLOT),
    };
    struct exs_wire_hello peer;
    struct exs_prov_cm_event ev;
    double end = it_now_ms() + IT_TIMEOUT_MS;
    int n;

    memset(r, 0, sizeof(*r));
    ck_assert_int_eq(exs__prov_open_default(&(struct exs_prov_attr){0}, &r->ctx), 0);
    ck_assert_int_eq(exs__prov_ep_create(r->ctx, &attr, &r->ep), 0);
    r->mem = calloc(RAW_SLOTS + 2, RAW_SLOT);
    ck_assert_ptr_nonnull(r->mem);
    ck_assert_int_eq(exs__prov_mr_reg(r->ctx, r->mem, (size_t)(RAW_SLOTS + 2) * RAW_SLOT,
                                      EXS_PROV_ACCESS_LOCAL_WRITE, &r->mr),
                     0);
    for (uint32_t i = 0; i < RAW_SLOTS; i++)
        rawp_post_recv(r, i);
    ck_assert_int_eq(
        exs__prov_connect(r->ep, (const struct sockaddr *)addr, sizeof(*addr), &h, sizeof(h)), 0);
    while ((n = exs__prov_cm_poll(r->ctx, &ev)) == 0 && it_now_ms() < end)
        it_sleep_ms(1);
    ck_assert_msg(n == 1 && ev.type == EXS_PROV_CM_ESTABLISHED, "raw connect: n %d type %d", n,
                  n == 1 ? (int)ev.type : -1);
    ck_assert_uint_ge(ev.private_data_len, sizeof(peer));
    memcpy(&peer, ev.private_data, sizeof(peer));
    ck_assert_uint_eq(peer.version, 2);
    ck_assert_uint_eq(peer.ring_rkey, 0); /* v2: reserved, the key travels in RING */
}

static void rawp_close(struct rawp *r)
{
    exs__prov_ep_destroy(r->ep);
    exs__prov_mr_dereg(r->mr);
    exs__prov_ctx_close(r->ctx);
    free(r->mem);
}

/* Wait for the next completion of the raw endpoint (fails the test after the timeout). */
static void rawp_cqe(struct rawp *r, struct exs_prov_cqe *cqe)
{
    double end = it_now_ms() + IT_TIMEOUT_MS;
    int n;

    while ((n = exs__prov_poll(r->ctx, cqe, 1)) == 0 && it_now_ms() < end)
        it_sleep_ms(1);
    ck_assert_msg(n == 1, "raw peer: no completion within %d ms", IT_TIMEOUT_MS);
}

static int rawp_on_rec(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec,
                       uint32_t rlen)
{
    struct rawp *r = arg;

    /* the library's RING comes first, once */
    ck_assert_msg((h->type == EXS_CTRL_RING) == !r->got_ring, "record %s, ring seen %d",
                  exs__wire_type_name(h->type), r->got_ring);
    if (h->type == EXS_CTRL_RING) {
        struct exs_wire_ring ring;

        ck_assert_uint_eq(rlen, sizeof(ring));
        memcpy(&ring, rec, sizeof(ring));
        r->ring_rkey = be32toh(ring.rkey);
        r->got_ring = 1;
    } else if (h->type == EXS_CTRL_ADVERT) {
        ck_assert_uint_eq(rlen, sizeof(r->adv));
        memcpy(&r->adv, rec, sizeof(r->adv));
        r->got_advert = 1;
    }
    return 0;
}

/* Handle one received control SEND: remember RING and ADVERT records; re-post the slot. */
static void rawp_on_recv(struct rawp *r, const struct exs_prov_cqe *cqe)
{
    const uint8_t *buf = r->mem + cqe->wr_id * RAW_SLOT;

    ck_assert_int_eq(cqe->opcode, EXS_PROV_WC_RECV);
    ck_assert_int_eq(exs__wire_walk(buf, cqe->byte_len, rawp_on_rec, r), 0);
    rawp_post_recv(r, (uint32_t)cqe->wr_id);
}

/* Wait until cond holds, handling received control SENDs meanwhile. */
#define RAWP_UNTIL(r, cond)                                                                        \
    do {                                                                                           \
        struct exs_prov_cqe c_;                                                                    \
        while (!(cond)) {                                                                          \
            rawp_cqe((r), &c_);                                                                    \
            ck_assert_msg(c_.status == EXS_PROV_WC_SUCCESS, "raw completion status %d",            \
                          (int)c_.status);                                                         \
            if (c_.opcode == EXS_PROV_WC_RECV)                                                     \
                rawp_on_recv((r), &c_);                                                            \
        }                                                                                          \
    } while (0)

/* Send one control record (our RING) and wait for its completion. */
static void rawp_send_ring(struct rawp *r)
{
    struct exs_wire_ring ring = {
        .hdr = {.type = EXS_CTRL_RING, .len = htobe16(EXS_WIRE_RING_LEN)},
    };
    uint8_t *src = r->mem + (size_t)RAW_SLOTS * RAW_SLOT;
    struct exs_prov_sge sge = {(uintptr_t)src, sizeof(ring), r->mr->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = 1000,
        .opcode = EXS_PROV_WR_SEND,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
    };
    struct exs_prov_cqe c;

    memcpy(src, &ring, sizeof(ring));
    ck_assert_int_eq(exs__prov_post_send(r->ep, &wr), 0);
    for (;;) {
        rawp_cqe(r, &c);
        if (c.wr_id == 1000)
            break;
        ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
        rawp_on_recv(r, &c);
    }
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
}

/* One RDMA write of len bytes to the advertised buffer; returns the completion status. */
static int rawp_write(struct rawp *r, int with_imm, uint32_t len, uint8_t fill)
{
    uint8_t *src = r->mem + (size_t)(RAW_SLOTS + 1) * RAW_SLOT;
    struct exs_prov_sge sge = {(uintptr_t)src, len, r->mr->lkey};
    struct exs_prov_send_wr wr = {
        .wr_id = 2000,
        .opcode = with_imm ? EXS_PROV_WR_RDMA_WRITE_WITH_IMM : EXS_PROV_WR_RDMA_WRITE,
        .flags = EXS_PROV_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
        .imm_data = exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, be32toh(r->adv.id)),
        .remote_addr = be64toh(r->adv.addr),
        .rkey = be32toh(r->adv.rkey),
    };
    struct exs_prov_cqe c;

    memset(src, fill, len);
    ck_assert_int_eq(exs__prov_post_send(r->ep, &wr), 0);
    for (;;) {
        rawp_cqe(r, &c);
        if (c.wr_id == 2000)
            return (int)c.status;
        if (c.status == EXS_PROV_WC_SUCCESS && c.opcode == EXS_PROV_WC_RECV)
            rawp_on_recv(r, &c);
    }
}

/* A receive buffer is writable by its peer from its ADVERT until it completes, and not a
 * moment longer: the same key then fails with a remote access error and the bytes do not
 * land. The ring key comes in the library's first record (RING), not in the hello. */
START_TEST(test_grant_receive_key_dies)
{
    struct sockaddr_in addr;
    struct it_buf *b;
    exs_qhandle_t q;
    exs_event_t ev;
    struct rawp r;
    int lfd, sfd;

    it_init();
    q = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    rawp_connect(&r, &addr);
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    ck_assert_int_eq(ev.exs_evt_errno, 0);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    RAWP_UNTIL(&r, r.got_ring);
    ck_assert_uint_ne(r.ring_rkey, 0);
    rawp_send_ring(&r);

    b = it_buf_new(8192, 1);
    IT_POST_RECV(sfd, b->p, b->len, q, IT_AH(2), b->mh);
    RAWP_UNTIL(&r, r.got_advert);
    ck_assert_uint_eq(be64toh(r.adv.addr), (uintptr_t)b->p);
    ck_assert_uint_eq(be32toh(r.adv.len), 8192);
    /* granted: the message lands and completes the receive */
    ck_assert_int_eq(rawp_write(&r, 1, 100, 0x5A), EXS_PROV_WC_SUCCESS);
    it_expect_recv(q, sfd, IT_AH(2), 100, 0);
    ck_assert(it_all_bytes(b->p, 100, 0x5A));
    /* completed: the key is dead */
    ck_assert_int_eq(rawp_write(&r, 0, 64, 0xA5), EXS_PROV_WC_REM_ACCESS_ERR);
    ck_assert(it_all_bytes(b->p, 100, 0x5A));
    ck_assert(it_all_bytes(b->p + 100, b->len - 100, IT_GUARD_BYTE));
    ck_assert(it_buf_guards_ok(b));

    rawp_close(&r);
    it_close(sfd, q);
    it_close(lfd, q);
    it_buf_free(b);
    it_qdelete(q);
}
END_TEST

/* A second RING record is a protocol error: the library resets the connection and the
 * pending receive fails. */
START_TEST(test_grant_second_ring_resets)
{
    struct sockaddr_in addr;
    struct exs_prov_cm_event cev;
    struct it_buf *b;
    exs_qhandle_t q;
    exs_event_t ev;
    struct rawp r;
    double end;
    int lfd, sfd, n;

    it_init();
    q = it_qcreate(16);
    lfd = it_listen(SOCK_SEQPACKET, &addr);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(1)));
    rawp_connect(&r, &addr);
    it_wait_event(q, EXS_EVT_ACCEPT, lfd, &ev);
    sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    RAWP_UNTIL(&r, r.got_ring);
    b = it_buf_new(64, 1);
    IT_POST_RECV(sfd, b->p, b->len, q, IT_AH(2), b->mh);
    rawp_send_ring(&r);
    rawp_send_ring(&r); /* once too often */
    it_expect_err(q, EXS_EVT_RECV, sfd, IT_AH(2), ECONNRESET);
    end = it_now_ms() + IT_TIMEOUT_MS;
    while ((n = exs__prov_cm_poll(r.ctx, &cev)) == 0 && it_now_ms() < end)
        it_sleep_ms(1);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(cev.type, EXS_PROV_CM_DISCONNECTED);
    rawp_close(&r);
    it_close(sfd, q);
    it_close(lfd, q);
    it_buf_free(b);
    it_qdelete(q);
}
END_TEST

Suite *integ_grant_suite(void)
{
    Suite *s = suite_create("integ_grant");
    TCase *tc = it_tcase("grant", 60);

    tcase_add_test(tc, test_grant_receive_key_dies);
    tcase_add_test(tc, test_grant_second_ring_resets);
    suite_add_tcase(s, tc);
    return s;
}
