/* SPDX-License-Identifier: MIT */
/* Session 28's copy fences: a region deregistered never receives a byte after mr_dereg
 * returned (tcp: a READ response placed into the requester's destination; shm: a SEND
 * copied into its receive, in fragments or from source pairs), and tcp's failed receive
 * given back to its ep's pool. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/prov/tcp/tcp.h"
#include "exs/util/util.h"
#include "tests/prov/prov_shm_nic.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

/* Watchdog for calls that must not wait for a peer. */
#define HANG_MS 10000

/* mr_dereg on a thread, watched: it must return without the peer doing anything. */
struct dereg_call {
    struct exs_prov_mr *mr;
    int ret;
    int done; /* atomic */
    pthread_t t;
};

static void *dereg_thread(void *arg)
{
    struct dereg_call *dc = arg;

    dc->ret = pt_ops->mr_dereg(dc->mr);
    __atomic_store_n(&dc->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void dereg_start(struct dereg_call *dc, struct exs_prov_mr *mr)
{
    dc->mr = mr;
    dc->done = 0;
    ck_assert_int_eq(pthread_create(&dc->t, NULL, dereg_thread, dc), 0);
}

/* Its result once returned; fails the test when it has not returned within HANG_MS. */
static int dereg_join(struct dereg_call *dc)
{
    double deadline = pt_now_ms() + HANG_MS;

    while (!__atomic_load_n(&dc->done, __ATOMIC_ACQUIRE) && pt_now_ms() < deadline)
        pt_sleep_ms(2);
    ck_assert_msg(__atomic_load_n(&dc->done, __ATOMIC_ACQUIRE),
                  "mr_dereg blocked for %d ms waiting for a peer", HANG_MS);
    pthread_join(dc->t, NULL);
    return dc->ret;
}

/* ---- tcp: a READ response placed into the requester's destination ---- */

/* The requester (p's b, raw peer as responder) posts a READ into dst; the response's header
 * and first FIRST bytes arrive, then silence; dst's region is deregistered: mr_dereg returns
 * at once, not one byte of the rest lands, the READ completes LOC_PROT_ERR (the ep in
 * ERROR, what was posted behind it flushed), the peer is told DISCONNECT, and the rest of
 * the response is read into a sink. Before the READ response took the fence, the rest went
 * into the deregistered region and the READ completed successfully. */
START_TEST(fence28_tcp_read_response_mr_dereg)
{
    enum { TLEN = 16384, OFF = 1024, RLEN = 8192, FIRST = 10 };
    struct pt_pair p;
    struct pt_buf *dst, *src;
    struct dereg_call dc;
    struct tcp_wire_hdr req, h, d;
    struct exs_prov_cm_event ev;
    uint8_t *payload = malloc(RLEN);
    uint64_t rx0;
    uint32_t psn;
    int fd;

    ck_assert_ptr_nonnull(payload);
    if (pt_skip_unless_tcp("fence28_tcp_read_response_mr_dereg")) {
        free(payload);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    dst = pt_pair_buf(&p, 'b', TLEN, LW, 0x5A);
    src = pt_pair_buf(&p, 'b', 64, LW, 0x33);
    ck_assert_int_eq(
        pt_post_send(p.eb, 9, EXS_PROV_WR_RDMA_READ, SIG, dst, OFF, RLEN, 0, 0x10000, 0x1234), 0);
    ck_assert_int_eq(pt_raw_recv(fd, &req, sizeof(req), PT_TIMEOUT_MS), 0);
    ck_assert_uint_eq(req.type, TCP_WIRE_READ_REQ);
    ck_assert_uint_eq(ntohl(req.imm), RLEN);
    psn = ntohl(req.psn);
    /* a SEND behind the READ: framed after it, answered by no one (flushed at the end) */
    ck_assert_int_eq(pt_post_send(p.eb, 10, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    /* the response's header and its first bytes, placed */
    memset(payload, 0x99, FIRST);
    h = pt_raw_hdr(TCP_WIRE_READ_RESP, 0, RLEN, psn, 0, 0, 0);
    rx0 = pt_raw_rx_bytes();
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    ck_assert_int_eq(pt_raw_send(fd, payload, FIRST), 0);
    pt_raw_rx_settle(&p.b, rx0, sizeof(h) + FIRST);
    ck_assert_msg(pt_all_bytes(dst->p + OFF, FIRST, 0x99), "the first bytes did not land");
    /* half-way: the deregistration must not wait for the peer */
    dereg_start(&dc, dst->mr);
    ck_assert_int_eq(dereg_join(&dc), 0);
    dst->mr = NULL;
    /* the rest arrives after mr_dereg returned: read (into a sink), never placed */
    memset(payload, 0x77, RLEN);
    rx0 = pt_raw_rx_bytes();
    (void)pt_raw_send(fd, payload + FIRST, RLEN - FIRST);
    pt_raw_rx_settle(&p.b, rx0, RLEN - FIRST);
    ck_assert_msg(pt_all_bytes(dst->p + OFF + FIRST, TLEN - OFF - FIRST, 0x5A) &&
                      pt_all_bytes(dst->p, OFF, 0x5A) && pt_buf_guards_ok(dst),
                  "bytes landed after mr_dereg returned");
    pt_expect_cqe(&p.b, 9, EXS_PROV_WC_LOC_PROT_ERR, EXS_PROV_WC_RDMA_READ, NULL);
    pt_expect_cqe(&p.b, 10, EXS_PROV_WC_WR_FLUSH_ERR, EXS_PROV_WC_SEND, NULL);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_ERROR);
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.eb);
    ck_assert_int_eq(ev.status, -ECONNABORTED);
    /* the peer: the SEND framed behind the READ (64 bytes), then DISCONNECT */
    for (;;) {
        uint8_t skip[64];

        ck_assert_msg(pt_raw_recv(fd, &d, sizeof(d), PT_TIMEOUT_MS) == 0, "no DISCONNECT");
        if (d.type == TCP_WIRE_DISCONNECT)
            break;
        ck_assert_uint_eq(d.type, TCP_WIRE_SEND);
        ck_assert_uint_eq(ntohl(d.len), sizeof(skip));
        ck_assert_int_eq(pt_raw_recv(fd, skip, sizeof(skip), PT_TIMEOUT_MS), 0);
    }
    close(fd);
    pt_pair_close(&p);
    free(payload);
}
END_TEST

/* The same READ with its destination's region deregistered after the post and before any
 * byte of the response arrived: nothing placed, LOC_PROT_ERR. */
START_TEST(fence28_tcp_read_response_dead_before)
{
    enum { RLEN = 4096 };
    struct pt_pair p;
    struct pt_buf *dst;
    struct tcp_wire_hdr req, h;
    uint8_t *payload = malloc(RLEN);
    uint64_t rx0;
    int fd;

    ck_assert_ptr_nonnull(payload);
    if (pt_skip_unless_tcp("fence28_tcp_read_response_dead_before")) {
        free(payload);
        return;
    }
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    dst = pt_pair_buf(&p, 'b', RLEN, LW, 0x5A);
    ck_assert_int_eq(
        pt_post_send(p.eb, 9, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, RLEN, 0, 0x10000, 0x1234), 0);
    ck_assert_int_eq(pt_raw_recv(fd, &req, sizeof(req), PT_TIMEOUT_MS), 0);
    ck_assert_uint_eq(req.type, TCP_WIRE_READ_REQ);
    ck_assert_int_eq(pt_ops->mr_dereg(dst->mr), 0);
    dst->mr = NULL;
    memset(payload, 0x77, RLEN);
    h = pt_raw_hdr(TCP_WIRE_READ_RESP, 0, RLEN, ntohl(req.psn), 0, 0, 0);
    rx0 = pt_raw_rx_bytes();
    ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
    (void)pt_raw_send(fd, payload, RLEN);
    pt_raw_rx_settle(&p.b, rx0, sizeof(h) + RLEN);
    ck_assert_msg(pt_all_bytes(dst->p, RLEN, 0x5A) && pt_buf_guards_ok(dst),
                  "bytes landed in a region deregistered before the response");
    pt_expect_cqe(&p.b, 9, EXS_PROV_WC_LOC_PROT_ERR, EXS_PROV_WC_RDMA_READ, NULL);
    close(fd);
    pt_pair_close(&p);
    free(payload);
}
END_TEST

/* ---- tcp: a receive that fails goes back to its ep's pool ---- */

static uint32_t rwr_pool_n(struct exs_prov_ep *e)
{
    struct tcp_ep *ep = tcp_ep_of(e);
    uint32_t n;

    pthread_mutex_lock(&ep->lock);
    n = ep->rwr_pool.n;
    pthread_mutex_unlock(&ep->lock);
    return n;
}

/* A SEND longer than its receive: the receive completes LOC_LEN_ERR and its block is back
 * in the ep's pool when the completion is seen (before, tcp_conn_recv_fail freed it: the
 * pool lost a block per failed receive, the next post paid a malloc). */
START_TEST(fence28_tcp_recv_fail_pooled)
{
    struct pt_pair p;
    struct pt_buf *sb, *rb;
    uint32_t n0;

    if (pt_skip_unless_tcp_itself("fence28_tcp_recv_fail_pooled"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    sb = pt_pair_buf(&p, 'a', 128, LW, 1);
    rb = pt_pair_buf(&p, 'b', 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, rb, 0, 64), 0);
    n0 = rwr_pool_n(p.eb); /* the receive's block out of it */
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, sb, 0, 128, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_LOC_LEN_ERR, EXS_PROV_WC_RECV, NULL);
    ck_assert_msg(rwr_pool_n(p.eb) == n0 + 1, "the failed receive's block is not back (%u, %u)",
                  rwr_pool_n(p.eb), n0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_REM_INV_REQ_ERR, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_fence28_suite(void)
{
    Suite *s = suite_create("prov_fence28");
    TCase *tc = pt_tcase("fence28");

    tcase_add_test(tc, fence28_tcp_read_response_mr_dereg);
    tcase_add_test(tc, fence28_tcp_read_response_dead_before);
    tcase_add_test(tc, fence28_tcp_recv_fail_pooled);
    suite_add_tcase(s, tc);
    return s;
}
