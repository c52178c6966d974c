/* SPDX-License-Identifier: MIT */
/* The receive queue under load: posts racing a flush from another thread (every accepted
 * receive completes exactly once, in posting order), and a queue filled, drained and
 * refilled past its size (room comes back only when a completion is polled; order and data
 * kept through the reuse, with receives of one sge and of several). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

struct rq_poster {
    struct exs_prov_ep *ep;
    struct pt_buf *buf;
    uint32_t n;      /* receives to post */
    uint32_t posted; /* atomic: accepted so far */
    int err;         /* a post's error other than -ENOMEM */
};

static void *rq_post_thread(void *arg)
{
    struct rq_poster *t = arg;
    double deadline = pt_now_ms() + PT_TIMEOUT_MS;

    for (uint32_t i = 0; i < t->n;) {
        int ret = pt_post_recv(t->ep, 1000 + i, t->buf, 0, 64);

        if (ret == -ENOMEM && pt_now_ms() < deadline) {
            sched_yield(); /* full: the main thread polls the flushed ones */
            continue;
        }
        if (ret) {
            t->err = ret;
            break;
        }
        __atomic_store_n(&t->posted, ++i, __ATOMIC_RELEASE);
    }
    return NULL;
}

START_TEST(rq_flush_races_posts)
{
    /* A thread posts 3 x max_recv_wr receives while this one disconnects the ep once the
     * thread is partway: the receives in the queue, those posted during the flush and
     * those posted after it each complete once, WR_FLUSH_ERR, in posting order. Rounds
     * put the disconnect at different points of the posting. */
    for (int round = 0; round < 8; round++) {
        struct exs_prov_ep_attr attr = pt_default_attr();
        struct rq_poster t = {0};
        struct exs_prov_cqe cqe;
        struct pt_pair p;
        pthread_t th;
        double deadline;
        uint32_t got = 0;

        attr.max_recv_wr = 16;
        pt_pair_setup(&p, NULL, &attr);
        t.ep = p.eb;
        t.buf = pt_pair_buf(&p, 'b', 64, LW, 0);
        t.n = 3 * attr.max_recv_wr;
        ck_assert_int_eq(pthread_create(&th, NULL, rq_post_thread, &t), 0);
        deadline = pt_now_ms() + PT_TIMEOUT_MS;
        while (__atomic_load_n(&t.posted, __ATOMIC_ACQUIRE) < (uint32_t)round * 2 &&
               pt_now_ms() < deadline)
            sched_yield();
        ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
        while (got < t.n && pt_try_cqe(&p.b, PT_TIMEOUT_MS, &cqe)) {
            ck_assert_ptr_eq(cqe.ep, p.eb);
            ck_assert_msg(cqe.wr_id == 1000 + got, "round %d: completion of %llu, expected %u",
                          round, (unsigned long long)cqe.wr_id, 1000 + got);
            ck_assert_int_eq(cqe.status, EXS_PROV_WC_WR_FLUSH_ERR);
            got++;
        }
        ck_assert_int_eq(pthread_join(th, NULL), 0);
        ck_assert_int_eq(t.err, 0);
        ck_assert_msg(got == t.n, "round %d: %u of %u receives completed (posted %u)", round, got,
                      t.n, t.posted);
        pt_expect_no_cqe(&p.b, 20); /* none twice */
        pt_pair_close(&p);
    }
}
END_TEST

/* A receive of nsge sges of 16 bytes (the last takes the rest of len) at b + off. */
static int rq_post_sges(struct exs_prov_ep *ep, uint64_t wr_id, const struct pt_buf *b, size_t off,
                        uint32_t len, int nsge)
{
    struct exs_prov_sge sge[8];
    struct exs_prov_recv_wr wr = {.wr_id = wr_id, .sg_list = sge, .num_sge = nsge};

    for (int i = 0; i < nsge; i++) {
        sge[i].addr = pt_raddr(b, off + (size_t)i * 16);
        sge[i].length = i == nsge - 1 ? len - (uint32_t)i * 16 : 16;
        sge[i].lkey = b->mr->lkey;
    }
    return pt_ops->post_recv(ep, &wr);
}

START_TEST(rq_full_wraps_in_order)
{
    /* max_recv_wr receives fill the queue (-ENOMEM past it); their messages arrive and
     * are sent (the sender's completions), yet the room comes back one receive at a time
     * as their completions are polled, not before; four fills pass each slot of the
     * queue several times, receives of 1 and of 6 sges mixed, every message whole in the
     * receive posted for it. The room is the software providers' (tcp, shm: a receive's
     * room holds its completion's place in the queue until polled); verbs frees a
     * receive's slot when the device consumes it and may round max_recv_wr up, so there
     * only the order and the data are checked. */
    struct exs_prov_ep_attr attr = pt_default_attr();
    const uint32_t max = 8, len = 96;
    int nsge, soft;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe cqe;
    struct pt_pair p;
    uint64_t id = 0;

    attr.max_recv_wr = max;
    pt_pair_setup(&p, NULL, &attr);
    nsge = p.b.ctx->caps.max_sge >= 6 ? 6 : 1;
    soft = strstr(pt_name, "verbs") == NULL;
    src = pt_pair_buf(&p, 'a', (size_t)max * len, LW, 0);
    dst = pt_pair_buf(&p, 'b', (size_t)max * len, LW, 0);
    for (uint32_t i = 0; i < max; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, id + i, dst, (size_t)i * len, len), 0);
    for (int fill = 0; fill < 4; fill++) {
        if (soft)
            ck_assert_int_eq(pt_post_recv(p.eb, 999, dst, 0, len), -ENOMEM);
        for (uint32_t i = 0; i < max; i++) {
            pt_pattern(src->p + (size_t)i * len, len, (uint32_t)(id + i));
            ck_assert_int_eq(pt_post_send(p.ea, 500 + i, EXS_PROV_WR_SEND, SIG, src,
                                          (size_t)i * len, len, 0, 0, 0),
                             0);
        }
        for (uint32_t i = 0; i < max; i++)
            pt_expect_cqe(&p.a, 500 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        /* every message is in a receive; none of their completions polled yet */
        if (soft)
            ck_assert_int_eq(pt_post_recv(p.eb, 999, dst, 0, len), -ENOMEM);
        for (uint32_t i = 0; i < max; i++) {
            pt_wait_cqe(&p.b, PT_TIMEOUT_MS, &cqe);
            ck_assert_int_eq(cqe.status, EXS_PROV_WC_SUCCESS);
            ck_assert_msg(cqe.wr_id == id + i, "fill %d: receive %llu completed, expected %llu",
                          fill, (unsigned long long)cqe.wr_id, (unsigned long long)(id + i));
            ck_assert_int_eq(cqe.byte_len, len);
            ck_assert_int_eq(pt_pattern_check(dst->p + (size_t)i * len, len, (uint32_t)(id + i)),
                             -1);
            /* one completion polled, one receive's room back (and no more) */
            ck_assert_int_eq((i & 1)
                                 ? rq_post_sges(p.eb, id + max + i, dst, (size_t)i * len, len, nsge)
                                 : pt_post_recv(p.eb, id + max + i, dst, (size_t)i * len, len),
                             0);
            if (soft)
                ck_assert_int_eq(pt_post_recv(p.eb, 999, dst, 0, len), -ENOMEM);
        }
        id += max;
    }
    pt_pair_close(&p);
}
END_TEST

Suite *prov_rq_suite(void)
{
    Suite *s = suite_create("prov_rq");
    TCase *tc = tcase_create("rq");

    tcase_set_timeout(tc, PT_TEST_TIMEOUT);
    tcase_add_test(tc, rq_flush_races_posts);
    tcase_add_test(tc, rq_full_wraps_in_order);
    suite_add_tcase(s, tc);
    return s;
}
