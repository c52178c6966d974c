/* SPDX-License-Identifier: MIT */
/* Session 27 (h83): attack review of the session's speed work on the shm ring (h80: the
 * records announce themselves, no head in the line). Whatever the ring's format, a peer
 * that fills what its side of the segment holds (its ring and its line's first words,
 * where a consumer looks for new records) with garbage ends only its own connection: no
 * crash, no hang, nothing delivered, the next connection works (run with -p shm; skipped
 * elsewhere).
 *
 * shm_scribbler/0: the ring and the line's first word filled once with random bytes.
 * shm_scribbler/1: the same, rewritten over and over while b takes them (a's NIC held
 * meanwhile, so that a's connection, whose mapping the scribbler writes, stays), until b
 * ends the connection: a record's words change between b's looks (its announcement, its
 * header's copy, its body).
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "tests/prov/prov_shm_nic.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

struct scrib {
    uint8_t *ring;
    uint32_t ring_bytes;
    uint64_t *line0; /* the liar's line's first word (version 5's head) */
    int bell;        /* b's doorbell (a copy) */
};

static uint64_t scrib_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Garbage over the whole ring and the line's first word, then b's doorbell. */
static void scrib_fill(const struct scrib *c, uint64_t *seed)
{
    uint64_t one = 1;

    for (uint32_t o = 0; o < c->ring_bytes; o += 8)
        __atomic_store_n((uint64_t *)(void *)(c->ring + o), scrib_rand(seed) | 1, __ATOMIC_RELAXED);
    __atomic_store_n(c->line0, scrib_rand(seed), __ATOMIC_SEQ_CST);
    ck_assert_int_eq(write(c->bell, &one, sizeof(one)), (ssize_t)sizeof(one));
}

START_TEST(shm_scribbler)
{
    struct pt_pair p;
    struct pt_buf *dst, *src;
    struct shm_ctx *actx;
    struct shm_conn *conn;
    struct scrib c;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe;
    uint64_t seed = 0x9E3779B97F4A7C15ull + (uint64_t)_i, perr = 0;
    double deadline;

    if (strcmp(pt_name, "shm") != 0) {
        test_skip("shm_scribbler", "shm provider itself only; provider is %s", pt_name);
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    dst = pt_pair_buf(&p, 'b', 256, EXS_PROV_ACCESS_LOCAL_WRITE, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 256), 0);
    (void)exs__counters_lookup("prov.shm", "protocol_errors", &perr);
    actx = shm_ep_of(p.ea)->ctx;
    nic_hold(actx);
    conn = shm_ep_of(p.ea)->conn;
    ck_assert_ptr_nonnull(conn);
    c = (struct scrib){conn->tx_ring, conn->ring_bytes, (uint64_t *)(void *)conn->mine,
                       dup(conn->bell)};
    ck_assert_int_ge(c.bell, 0);
    if (_i == 0) {
        scrib_fill(&c, &seed);
        nic_drop(actx);
    } else {
        /* a's connection cannot end while its NIC is held: its mapping stays */
        deadline = pt_now_ms() + PT_TIMEOUT_MS;
        while (pt_ops->ep_state(p.eb) == EXS_PROV_EP_CONNECTED && pt_now_ms() < deadline)
            scrib_fill(&c, &seed);
        nic_drop(actx);
        ck_assert_int_ne(pt_ops->ep_state(p.eb), EXS_PROV_EP_CONNECTED);
    }
    /* b ended its connection with an error of its own (a lying ring) */
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.eb);
    ck_assert_msg(ev.status == -EPROTO || ev.status == -ECONNABORTED,
                  "DISCONNECTED status %d, expected a protocol error", ev.status);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    pt_wait_cm(&p.a, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    close(c.bell);
    {
        uint64_t now = 0;

        ck_assert_int_eq(exs__counters_lookup("prov.shm", "protocol_errors", &now), 0);
        ck_assert_uint_gt(now, perr);
    }
    /* nothing of the garbage was delivered */
    pt_expect_wr(&p.b, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(dst->p, 256, 0));
    ck_assert(pt_buf_guards_ok(dst));
    /* the next connection works */
    {
        struct exs_prov_ep_attr at = pt_default_attr();

        src = pt_pair_buf(&p, 'a', 64, EXS_PROV_ACCESS_LOCAL_WRITE, 0x3C);
        pt_ep_close(&p.a, p.ea);
        pt_ep_close(&p.b, p.eb);
        ck_assert_int_eq(pt_ops->ep_create(p.a.ctx, &at, &p.ea), 0);
        ck_assert_int_eq(pt_ops->ep_create(p.b.ctx, &at, &p.eb), 0);
        p.a_up = p.b_up = 0;
        pt_pair_connect(&p);
        ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 64), 0);
        ck_assert_int_eq(
            pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, src, 0, 64, 0, 0, 0),
            0);
        pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &cqe);
        ck_assert_uint_eq(cqe.byte_len, 64);
        ck_assert(pt_all_bytes(dst->p, 64, 0x3C));
        pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    pt_pair_close(&p);
}
END_TEST

Suite *prov_attack27_suite(void)
{
    Suite *s = suite_create("prov_attack27");
    TCase *tc = pt_tcase("shm_scribbler");

    tcase_add_loop_test(tc, shm_scribbler, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
