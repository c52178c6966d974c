/* SPDX-License-Identifier: MIT */
/* A cut-over (spec/protocol.md §9.2) in each ring autotuning state (§7.4), on the mock: every byte
 * read once and in order, no region leaked. */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

/* a (active) sends to b (passive, the ring's owner); each side has a fallback ctx (pt_fb) */
static struct pt_pair pp;

#define RR_NS   16 /* sends */
#define RR_NR   96 /* receives */
#define RR_RECV 1000u
static uint8_t rr_sb[RR_NS][16384], rr_rb[RR_NR][RR_RECV];
static struct pt_op rr_s[RR_NS], rr_r[RR_NR];
static int rr_ns, rr_nr;
static uint64_t rr_soff, rr_roff;

static void rr_run(void)
{
    pt_fb_run(&pp);
}

static uint64_t rr_count(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("fallback", name, &v), 0);
    return v;
}

static void rr_setup(void)
{
    unit_pair_fresh(&pp, SOCK_STREAM, 1, 1);
    pt_connect(&pp);
    ck_assert_uint_ne(pp.a.conn->sess_token, 0);
    ck_assert(pp.b.conn->peer.features & EXS_WIRE_FEAT_RESIZE);
    pt_fb_open(&pp); /* the owner's callbacks with a fallback (sock.c's, on the mock) */
    rr_ns = rr_nr = 0;
    rr_soff = rr_roff = 0;
}

static void rr_teardown(void)
{
    struct mock_stats st;

    if (pp.a.conn)
        exs__conn_close(pp.a.conn);
    if (pp.b.conn)
        exs__conn_close(pp.b.conn);
    rr_run();
    ck_assert_int_eq(pp.a.dead, 1);
    ck_assert_int_eq(pp.b.dead, 1);
    for (int i = 0; i < rr_ns; i++)
        pt_op_fini(&rr_s[i]);
    for (int i = 0; i < rr_nr; i++)
        pt_op_fini(&rr_r[i]);
    ck_assert_uint_eq(pt_rnr(&pp), 0);
    for (int i = 0; i < 2; i++) {
        mock_stats(pt_fb.ctx[i], &st);
        ck_assert_uint_eq(st.rnr, 0);
    }
    pt_close(&pp); /* the primary ctxs hold nothing any more: no retired region left */
    pt_fb_close();
    ck_assert_uint_eq(mock_violations(), 0);
    ck_assert_uint_eq(exs__conn_ring_bytes(), 0); /* every region went back */
}

/* a sends len more bytes of the stream. */
static void rr_send(size_t len)
{
    ck_assert_int_lt(rr_ns, RR_NS);
    ck_assert_uint_le(len, sizeof(rr_sb[0]));
    pt_send_pattern(&rr_s[rr_ns], &pp.a, rr_sb[rr_ns], len, rr_soff);
    rr_ns++;
    rr_soff += len;
}

/* b receives until it has every byte a sent, one receive at a time: each holds the
 * stream's next bytes (none lost, twice or out of order); then every send is done whole. */
static void rr_recv_all(void)
{
    while (rr_roff < rr_soff) {
        struct pt_op *r = &rr_r[rr_nr];

        ck_assert_int_lt(rr_nr, RR_NR);
        pt_recv_post(r, &pp.b, rr_rb[rr_nr++], RR_RECV, 0);
        rr_run();
        ck_assert_int_eq(r->done, 1);
        ck_assert_int_eq(r->op.err, 0);
        ck_assert_int_gt(r->op.result, 0);
        ck_assert_msg(pt_check(rr_rb[rr_nr - 1], (size_t)r->op.result, rr_roff),
                      "bytes at %llu are not the stream's", (unsigned long long)rr_roff);
        rr_roff += (uint64_t)r->op.result;
    }
    ck_assert_uint_eq(rr_roff, rr_soff);
    for (int i = 0; i < rr_ns; i++)
        pt_assert_done(&rr_s[i], (ssize_t)rr_s[i].op.len, 0);
}

static int rr_offer(struct pt_side *side, uint32_t size)
{
    int ret;

    EXS_LITE_LOCK(&side->conn->lock, EXS_LOCK_CONN);
    ret = exs__stream_ring_offer_locked(side->conn, size, 0);
    EXS_LITE_UNLOCK(&side->conn->lock, EXS_LOCK_CONN);
    return ret;
}

/* The link dies; both ends cut over to the fallback ctxs and resume: one resume per end,
 * no failure, the ring resizes counted before the cut unchanged. */
static void rr_cut(void)
{
    uint64_t res0 = rr_count("fallback_resumes"), fail0 = rr_count("fallback_resume_failures");
    struct exs_sock_stats st;
    uint64_t resizes;

    pt_stats(&pp.b, &st);
    resizes = st.ring_resizes;
    mock_drop(pp.b.conn->ep);
    rr_run();
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_eq(pp.a.conn->ctx, pt_fb.ctx[0]);
    ck_assert_ptr_eq(pp.b.conn->ctx, pt_fb.ctx[1]);
    ck_assert_int_eq(pp.a.conn->resume.peer_wait, 0);
    ck_assert_int_eq(pp.b.conn->resume.peer_wait, 0);
    ck_assert_uint_eq(rr_count("fallback_resumes") - res0, 2);
    ck_assert_uint_eq(rr_count("fallback_resume_failures"), fail0);
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.ring_resizes, resizes);
    ck_assert_uint_eq(st.ring_size, pp.b.conn->p.ring_size);
    /* nothing of a change survives the cut */
    ck_assert_int_eq(pp.b.conn->autotune.offered, 0);
    ck_assert_ptr_null(pp.b.conn->autotune.next_mem);
    ck_assert_ptr_null(pp.b.conn->autotune.next_grant);
    ck_assert_int_eq(pp.a.conn->autotune.owed, 0);
    /* the writer sees the ring the new hello announced */
    ck_assert_uint_eq(pp.a.conn->peer.ring_size, pp.b.conn->p.ring_size);
}

/* After the cut: every byte read, a resize over the new path, more bytes through it. */
static void rr_after_cut(void)
{
    struct exs_sock_stats st;
    uint64_t resizes;
    uint32_t size;

    rr_recv_all();
    ck_assert_ptr_null(pp.b.conn->autotune.old_mem); /* read: retired region freed */
    pt_stats(&pp.b, &st);
    resizes = st.ring_resizes;
    size = pp.b.conn->p.ring_size * 2;
    ck_assert_int_eq(rr_offer(&pp.b, size), 0);
    rr_run();
    pt_stats(&pp.b, &st);
    ck_assert_uint_eq(st.ring_resizes, resizes + 1);
    ck_assert_uint_eq(st.ring_size, size);
    ck_assert_uint_eq(pp.a.conn->peer.ring_size, size);
    rr_send(size - 100); /* the new region holds it all */
    rr_run();
    ck_assert_uint_eq(pp.b.conn->rd_arrived - pp.b.conn->rd_consumed, size - 100);
    rr_recv_all();
    ck_assert_ptr_null(pp.b.conn->autotune.old_mem);
}

/* Writes in flight at the cut: the sends posted whole (send progress starts after them,
 * exs_conn.sendq_settled) go again from the position the peer's RESUME states, every
 * byte once and in order. */
START_TEST(rr_cut_writes_in_flight)
{
    pp.a.conn->batch_thresh = 0; /* each send its own write */
    for (int i = 0; i < 3; i++)
        rr_send(1000);
    pt_dispatch(&pp); /* posted, nothing carried: lost with the link */
    ck_assert_ptr_nonnull(pp.a.conn->sendq_settled);
    ck_assert_uint_eq(pp.b.conn->rd_arrived, 0);
    rr_cut();
    rr_recv_all();
    ck_assert_ptr_null(pp.a.conn->sendq_settled);
}
END_TEST

/* The owner's offer is out, the writer never saw it: the offer dies with the old path,
 * the new ring has the current size; the old ring's 3000 unread bytes are read first. */
START_TEST(rr_cut_offer_unseen)
{
    rr_send(3000);
    rr_run();
    ck_assert_uint_eq(exs__conn_ring_bytes(), 2 * 4096);
    ck_assert_int_eq(rr_offer(&pp.b, 8192), 0); /* posted, never carried out */
    ck_assert_int_eq(pp.b.conn->autotune.offered, 1);
    ck_assert_uint_eq(exs__conn_ring_bytes(), 2 * 4096 + 8192);
    rr_cut();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 4096);
    ck_assert_ptr_nonnull(pp.b.conn->autotune.old_mem); /* the old ring, retired */
    ck_assert_uint_eq(pp.b.conn->autotune.old_end, 3000);
    /* a's new ring, b's new ring and its retired one: the offered region went back */
    ck_assert_uint_eq(exs__conn_ring_bytes(), 3 * 4096);
    rr_after_cut();
}
END_TEST

/* The writer took the owner's offer and owes its answer (autotune.owed) at the cut: the answer
 * is dropped, the new path's hello and RING grant the owner's ring as it is. */
START_TEST(rr_cut_answer_owed)
{
    struct exs_wire_resize r = {
        .hdr = {.type = EXS_CTRL_RESIZE, .len = htobe16(EXS_WIRE_RESIZE_LEN)},
        .size = htobe32(8192),
    };

    rr_send(3000);
    rr_run();
    ck_assert_int_eq(rr_offer(&pp.b, 8192), 0);
    /* the record as it travels, taken by a whose answer has not gone yet */
    r.addr = htobe64((uintptr_t)pp.b.conn->autotune.next_mem->addr);
    r.rkey = htobe32(pp.b.conn->autotune.next_grant->rkey);
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__stream_on_resize_locked(pp.a.conn, &r), 0);
    ck_assert_int_eq(pp.a.conn->autotune.owed, 1);
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    rr_cut();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 4096);
    ck_assert_uint_eq(pp.a.conn->peer.ring_size, 4096);
    rr_after_cut();
}
END_TEST

/* The writer switched to the offered region (its SWITCHED lost with the path), the
 * owner still has the offer out: both go back to the owner's current ring. */
START_TEST(rr_cut_switched_unseen)
{
    rr_send(3000);
    rr_run();
    ck_assert_int_eq(rr_offer(&pp.b, 8192), 0);
    /* only a takes what arrives, until it has switched */
    for (int i = 0; i < 10000 && pp.a.conn->peer.ring_size != 8192; i++) {
        if (!mock_step())
            break;
        pt_dispatch_ctx(&pp, pp.a.ctx);
    }
    ck_assert_uint_eq(pp.a.conn->peer.ring_size, 8192);
    ck_assert_int_eq(pp.b.conn->autotune.offered, 1);
    rr_cut();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 4096);
    rr_after_cut();
}
END_TEST

/* A switch happened (3000 bytes unread in the retired 4 KiB region) and 5000 more
 * arrived into the current 8 KiB ring: both hold unread bytes at the cut. The retired
 * region's are copied into the current ring at their positions, which becomes the one
 * retired region; the bytes come out in order, once. */
START_TEST(rr_cut_two_regions)
{
    rr_send(3000);
    rr_run();
    ck_assert_int_eq(rr_offer(&pp.b, 8192), 0);
    rr_run();
    ck_assert_ptr_nonnull(pp.b.conn->autotune.old_mem);
    ck_assert_uint_eq(pp.b.conn->autotune.old_end, 3000);
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    rr_send(5000);
    rr_run();
    ck_assert_uint_eq(pp.b.conn->rd_arrived, 8000);
    ck_assert_uint_eq(pp.b.conn->rd_consumed, 0);
    pt_assert_done(&rr_s[1], 5000, 0);
    rr_cut();
    ck_assert_ptr_nonnull(pp.b.conn->autotune.old_mem);
    ck_assert_uint_eq(pp.b.conn->autotune.old_size, 8192);
    ck_assert_uint_eq(pp.b.conn->autotune.old_end, 8000);
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    /* a's ring, b's new ring and one retired region */
    ck_assert_uint_eq(exs__conn_ring_bytes(), 4096 + 2 * 8192);
    rr_after_cut();
}
END_TEST

/* A shrink switched while 7000 bytes were unread in the 8 KiB region (the current 4 KiB
 * ring is empty): the new path's ring takes the retired region's size, so the writer
 * counts the unread bytes against a ring they fit and the resume is whole. */
START_TEST(rr_cut_after_shrink)
{
    ck_assert_int_eq(rr_offer(&pp.b, 8192), 0);
    rr_run();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    ck_assert_ptr_null(pp.b.conn->autotune.old_mem);
    rr_send(7000);
    rr_run();
    ck_assert_int_eq(rr_offer(&pp.b, 4096), 0);
    rr_run();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 4096);
    ck_assert_ptr_nonnull(pp.b.conn->autotune.old_mem);
    ck_assert_uint_eq(pp.b.conn->autotune.old_end, 7000);
    rr_cut();
    ck_assert_uint_eq(pp.b.conn->p.ring_size, 8192);
    ck_assert_uint_eq(pp.b.conn->autotune.old_size, 8192);
    rr_after_cut();
}
END_TEST

/* On the new path the owner offers nothing until the peer's RESUME is applied (the peer
 * takes nothing but RING and RESUME before its own): an offer then is -EAGAIN, and
 * autotuning waits; once applied, offers go again. Seen at the active side a, the owner of
 * its own ring: the passive side takes the new path together with the peer's RESUME (it
 * came in the SEND that proved the request, §9.2), so it has no such window. */
START_TEST(rr_no_offer_before_resume)
{
    uint64_t res0 = rr_count("fallback_resumes");
    int seen = 0;

    rr_send(3000);
    rr_recv_all(); /* no retired region at the cut: nothing else refuses an offer */
    mock_drop(pp.b.conn->ep);
    for (long steps = 0; steps < 1000000L && !seen; steps++) {
        int m;

        do
            m = pt_dispatch(&pp) + pt_fb_drain(0) + pt_fb_drain(1);
        while (m && !(pp.a.conn->state == EXS_CONN_CONNECTED && pp.a.conn->resume.peer_wait));
        if (pp.a.conn->state == EXS_CONN_CONNECTED && pp.a.conn->resume.peer_wait) {
            ck_assert_int_eq(rr_offer(&pp.a, 8192), -EAGAIN);
            ck_assert_int_eq(pp.a.conn->autotune.offered, 0);
            seen = 1;
        } else if (!mock_step()) {
            break;
        }
    }
    ck_assert_int_eq(seen, 1);
    rr_run();
    ck_assert_uint_eq(rr_count("fallback_resumes") - res0, 2);
    ck_assert_int_eq(pp.b.conn->resume.peer_wait, 0);
    rr_after_cut();
}
END_TEST

/* SEQPACKET: messages whose writes were in flight at the cut (send progress starts after
 * the sends already posted, exs_conn.sendq_settled) go again from the message number the
 * peer's RESUME states, each once and in order. */
static void rr_sp_setup(void)
{
    unit_pair_fresh(&pp, SOCK_SEQPACKET, 1, 1);
    pt_connect(&pp);
    pt_fb_open(&pp);
    rr_ns = rr_nr = 0;
    rr_soff = rr_roff = 0;
}

START_TEST(rr_sp_cut_writes_in_flight)
{
    pp.a.conn->batch_thresh = 0; /* each message its own write */
    for (int i = 0; i < 3; i++)
        rr_send(RR_RECV);
    pt_dispatch(&pp); /* posted, nothing carried: lost with the link */
    ck_assert_ptr_nonnull(pp.a.conn->sendq_settled);
    ck_assert_uint_eq(pp.b.conn->rx_seq, 0);
    mock_drop(pp.b.conn->ep);
    rr_run();
    ck_assert_int_eq(pp.a.conn->state, EXS_CONN_CONNECTED);
    ck_assert_int_eq(pp.b.conn->state, EXS_CONN_CONNECTED);
    ck_assert_ptr_eq(pp.a.conn->ctx, pt_fb.ctx[0]);
    rr_recv_all(); /* one message per receive, each the next RR_RECV bytes of the pattern */
    ck_assert_int_eq(rr_nr, 3);
    ck_assert_ptr_null(pp.a.conn->sendq_settled);
}
END_TEST

Suite *proto_resume_ring_suite(void)
{
    Suite *s = suite_create("proto_resume_ring");
    TCase *tc = tcase_create("resume_ring");

    tcase_add_checked_fixture(tc, rr_setup, rr_teardown);
    tcase_add_test(tc, rr_cut_offer_unseen);
    tcase_add_test(tc, rr_cut_writes_in_flight);
    tcase_add_test(tc, rr_cut_answer_owed);
    tcase_add_test(tc, rr_cut_switched_unseen);
    tcase_add_test(tc, rr_cut_two_regions);
    tcase_add_test(tc, rr_cut_after_shrink);
    tcase_add_test(tc, rr_no_offer_before_resume);
    suite_add_tcase(s, tc);

    tc = tcase_create("resume_sp");
    tcase_add_checked_fixture(tc, rr_sp_setup, rr_teardown);
    tcase_add_test(tc, rr_sp_cut_writes_in_flight);
    suite_add_tcase(s, tc);
    return s;
}
