/* SPDX-License-Identifier: MIT */
/* Session 26's attack review (h73) of the shm provider's receive ring (h70, 8879690: posted
 * receives in a ring per endpoint, taken by the turn; a receive given back must be the last
 * one taken). Run with -p shm; skipped elsewhere.
 *
 * rnr_exc_mid_fragment: b is receiving a message in fragments (its first receive r1 taken,
 * kept in conn->frag_rwr) when its own SEND to a comes back NAK RNR_EXC (a has no receive,
 * b's rnr_retry 0): b's endpoint goes to ERROR and the flush sweeps the receives still
 * posted (r2, r3) while the connection stays (a zombie, dropping a's requests). The
 * disconnect then gives r1 back to the ring and flushes it. Every receive must complete
 * exactly once (WR_FLUSH_ERR). With the ring, r1 is not the last receive taken when it is
 * given back (the sweep took r2 and r3 after it): 8879690's exs__shm_rq_back_locked asserts
 * (the process aborts); without the assertion it would move the ring's tail back onto r3's
 * slot, flush r3 a second time (and free it twice when it had sges of its own) and never
 * complete r1. On main (a list) r1 goes back to the list's head and is flushed once.
 *
 * Made deterministic with the NIC threads' locks (the test holds one, so that NIC cannot
 * turn): a's while b takes the message's first fragments (the rest wait for a's turn),
 * then b's while a NAKs b's SEND, so that b's next turn takes the NAK with r1 still in
 * fragments (32 MiB through 64 KiB rings: b's turn carries at most 256 fragments of
 * 16 KiB). Conditions are waited for with deadlines, no sleeps. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/params.h"
#include "tests/prov/prov_shm_nic.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW       EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG      EXS_PROV_SEND_SIGNALED
#define BIG      (32u << 20) /* the message in fragments */
#define SMALL    64u
#define NRECV    3 /* r1 (BIG), r2, r3 (SMALL) */
#define SEND_ID  900
#define BSEND_ID 901

/* b's connection has a message in fragments under way (b's nic_lock held by the caller). */
static int mid_message(struct shm_ep *eb)
{
    return eb->conn && eb->conn->frag_rwr != NULL;
}

/* c is one of b's receives, flushed, its first completion (seen counts them), and in
 * posting order (last: the receive flushed before it; r1 was flushed after r2 and r3) */
static void recv_flushed(const struct exs_prov_cqe *c, int seen[NRECV + 1], uint64_t *last)
{
    ck_assert_msg(c->wr_id >= 1 && c->wr_id <= NRECV, "b: stray completion %llu",
                  (unsigned long long)c->wr_id);
    ck_assert_int_eq(c->status, EXS_PROV_WC_WR_FLUSH_ERR);
    ck_assert_msg(++seen[c->wr_id] == 1, "receive %llu completed twice",
                  (unsigned long long)c->wr_id);
    ck_assert_msg(c->wr_id > *last, "receive %llu flushed after receive %llu",
                  (unsigned long long)c->wr_id, (unsigned long long)*last);
    *last = c->wr_id;
}

START_TEST(rnr_exc_mid_fragment)
{
    struct exs_prov_ep_attr at_b = pt_default_attr();
    struct pt_pair p;
    struct pt_buf *src, *r1, *r2, *r3, *bsrc;
    struct shm_ep *eb;
    struct shm_ctx *ca, *cb;
    struct exs_prov_cqe c;
    int seen[NRECV + 1] = {0}, bsend = 0, caught = 0;
    uint64_t naks0, last = 0;
    double deadline;

    if (strcmp(pt_name, "shm") != 0) {
        test_skip("rnr_exc_mid_fragment", "shm provider itself only; provider is %s", pt_name);
        return;
    }
    ck_assert_int_eq(setenv("EXS_SHM_RING_KB", "64", 1), 0);
    exs__params_reset();
    at_b.rnr_retry = 0; /* b's SEND to a: RNR_EXC at a's first miss */
    pt_pair_setup(&p, NULL, &at_b);
    unsetenv("EXS_SHM_RING_KB");
    exs__params_reset();
    eb = shm_ep_of(p.eb);
    cb = eb->ctx;
    ca = shm_ep_of(p.ea)->ctx;

    src = pt_pair_buf(&p, 'a', BIG, LW, 0);
    r1 = pt_pair_buf(&p, 'b', BIG, LW, 0);
    r2 = pt_pair_buf(&p, 'b', SMALL, LW, 0);
    r3 = pt_pair_buf(&p, 'b', SMALL, LW, 0);
    bsrc = pt_pair_buf(&p, 'b', SMALL, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, r1, 0, BIG), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, r2, 0, SMALL), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 3, r3, 0, SMALL), 0);
    /* (0) a's NIC thread held: the SEND's first fragments go into the ring at the post, the
     * rest wait for a's turn, so b cannot end the message */
    nic_hold(ca);
    ck_assert_int_eq(pt_post_send(p.ea, SEND_ID, EXS_PROV_WR_SEND, SIG, src, 0, BIG, 0, 0, 0), 0);

    /* (1) b mid-message: its nic_lock taken while r1 is in fragments, and kept */
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (pt_now_ms() < deadline) {
        nic_hold(cb);
        if (mid_message(eb)) {
            caught = 1;
            break;
        }
        nic_drop(cb);
        sched_yield(); /* b's NIC thread turns */
    }
    ck_assert_msg(caught, "b never seen in the middle of the message");

    /* (2) b's SEND to a, which has no receive: a NAKs it RNR_EXC (a's NIC thread, let go;
     * its further fragments fill the ring, which b does not empty) */
    nic_drop(ca);
    naks0 = __atomic_load_n(&ca->cnt.rnr_naks, __ATOMIC_RELAXED);
    ck_assert_int_eq(pt_post_send(p.eb, BSEND_ID, EXS_PROV_WR_SEND, SIG, bsrc, 0, SMALL, 0, 0, 0),
                     0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (__atomic_load_n(&ca->cnt.rnr_naks, __ATOMIC_RELAXED) == naks0 && pt_now_ms() < deadline)
        sched_yield();
    ck_assert_msg(__atomic_load_n(&ca->cnt.rnr_naks, __ATOMIC_RELAXED) > naks0,
                  "a never refused b's SEND");
    ck_assert_msg(mid_message(eb), "b's message ended while b could not turn");
    nic_drop(cb);

    /* (3) b takes the NAK: its send fails, r2 and r3 are flushed, and r1 before them (the
     * connection, a zombie now, gives it back to the flush) */
    while (!bsend || !seen[2] || !seen[3]) {
        ck_assert_msg(pt_try_cqe(&p.b, PT_TIMEOUT_MS, &c), "b: a completion missing");
        if (c.wr_id == BSEND_ID) {
            ck_assert_int_eq(c.status, EXS_PROV_WC_RNR_RETRY_EXC_ERR);
            bsend++;
            continue;
        }
        recv_flushed(&c, seen, &last);
    }

    /* (4) b disconnects: r1 flushed once (in (3); it was given back by the connection's
     * end, after r2 and r3, before) */
    ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (!seen[1] && pt_now_ms() < deadline) {
        if (!pt_try_cqe(&p.b, 100, &c))
            continue;
        recv_flushed(&c, seen, &last);
    }
    ck_assert_msg(seen[1] == 1, "r1 (the message in fragments) never completed");
    /* nothing more of b's: no receive completes a second time */
    while (pt_try_cqe(&p.b, 200, &c))
        ck_assert_msg(c.wr_id < 1 || c.wr_id > NRECV, "receive %llu completed twice",
                      (unsigned long long)c.wr_id);
    ck_assert_int_eq(bsend, 1);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_attack26_suite(void)
{
    Suite *s = suite_create("prov_attack26");
    TCase *tc = pt_tcase("shm_rq_ring");

    tcase_add_test(tc, rnr_exc_mid_fragment);
    suite_add_tcase(s, tc);
    return s;
}
