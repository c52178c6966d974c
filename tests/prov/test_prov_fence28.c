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

/* ---- shm: a SEND copied into its receive ---- */

static int skip_unless_shm(const char *test)
{
    if (strcmp(pt_name, "shm") == 0)
        return 0;
    test_skip(test, "shm provider itself only; provider is %s", pt_name);
    return 1;
}

/* a's side of its connection to b, written by hand (as test_prov_shm.c's liar) */
struct hand {
    uint8_t *tx_ring;
    uint64_t head;
    const struct shm_line *peer; /* b's line: what b took of a's ring */
    int bell;                    /* b's doorbell (a copy) */
};

static struct hand hand_of(struct pt_pair *p)
{
    struct shm_ctx *ctx = shm_ep_of(p->ea)->ctx;
    struct shm_conn *conn;
    struct hand h;

    nic_hold(ctx);
    conn = shm_ep_of(p->ea)->conn;
    ck_assert_ptr_nonnull(conn);
    h = (struct hand){conn->tx_ring, conn->head, conn->peer, dup(conn->bell)};
    nic_drop(ctx);
    ck_assert_int_ge(h.bell, 0);
    return h;
}

/* Publish a record at the hand's head (header, body, then the size word) and ring b. */
static void hand_put(struct hand *c, const struct shm_rec *rec, const void *body, uint32_t blen)
{
    uint64_t pos = c->head & (SHM_RING_DEFAULT - 1), one = 1;
    struct shm_rec *at = (struct shm_rec *)(void *)(c->tx_ring + pos);

    memcpy(at, rec, offsetof(struct shm_rec, size));
    if (blen)
        memcpy(c->tx_ring + pos + SHM_REC_HDR, body, blen);
    __atomic_store_n(&at->size, rec->size, __ATOMIC_SEQ_CST);
    ck_assert_int_eq(write(c->bell, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* Wait (bounded) until b took the hand's records up to its head plus size; advance head. */
static void hand_taken(struct hand *c, uint32_t size)
{
    uint64_t end = exs__now_ns() + (uint64_t)PT_TIMEOUT_MS * 1000000u;

    while (__atomic_load_n(&c->peer->tail, __ATOMIC_ACQUIRE) != c->head + size) {
        ck_assert_msg(exs__now_ns() < end, "b did not take the record");
        pt_sleep_ms(1);
    }
    c->head += size;
}

/* b ended the connection -ECONNABORTED, its receive 1 completed LOC_PROT_ERR (the ep in
 * ERROR); a got its DISCONNECTED. */
static void b_refused(struct pt_pair *p)
{
    struct exs_prov_cm_event ev;

    pt_expect_wr(&p->b, 1, EXS_PROV_WC_LOC_PROT_ERR, EXS_PROV_WC_RECV, NULL);
    pt_wait_cm(&p->b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    ck_assert_int_eq(ev.status, -ECONNABORTED);
    ck_assert_int_eq(pt_ops->ep_state(p->eb), EXS_PROV_EP_ERROR);
    pt_wait_cm(&p->a, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
}

/* A SEND in fragments: the first placed into b's receive, then the receive's region
 * deregistered, then the second fragment: not one byte of it placed, the receive completes
 * LOC_PROT_ERR, the requester is refused (REM_OP), the connection ends. Before, each later
 * fragment was copied into the receive's sges unchecked, into the deregistered region. */
START_TEST(fence28_shm_frag_send_mr_dereg)
{
    enum { LEN = 100000, BUF = 128 << 10 };
    uint32_t size1 = (SHM_REC_HDR + SHM_FRAG_BYTES + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
    uint32_t part2 = LEN - SHM_FRAG_BYTES;
    uint8_t *body = malloc(SHM_FRAG_BYTES);
    struct pt_pair p;
    struct pt_buf *dst;
    struct hand c;
    struct shm_rec rec;

    ck_assert_ptr_nonnull(body);
    if (skip_unless_shm("fence28_shm_frag_send_mr_dereg")) {
        free(body);
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    c = hand_of(&p);
    dst = pt_pair_buf(&p, 'b', BUF, LW, 0x22);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, BUF), 0);
    memset(body, 0x44, SHM_FRAG_BYTES);
    rec = (struct shm_rec){.type = SHM_REC_SEND, .flags = SHM_RF_FRAG, .len = LEN, .size = size1};
    hand_put(&c, &rec, body, SHM_FRAG_BYTES);
    hand_taken(&c, size1);
    ck_assert_int_eq(pt_ops->mr_dereg(dst->mr), 0);
    dst->mr = NULL;
    memset(body, 0x77, part2);
    rec.size = (SHM_REC_HDR + part2 + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
    hand_put(&c, &rec, body, part2);
    b_refused(&p);
    /* (read after the completion: the NIC's copies are ordered before it) */
    ck_assert(pt_all_bytes(dst->p, SHM_FRAG_BYTES, 0x44));
    ck_assert_msg(pt_all_bytes(dst->p + SHM_FRAG_BYTES, BUF - SHM_FRAG_BYTES, 0x22) &&
                      pt_buf_guards_ok(dst),
                  "bytes landed after mr_dereg returned");
    close(c.bell);
    pt_pair_close(&p);
    free(body);
}
END_TEST

/* A SEND of source pairs (the records an older requester wrote: b copies from a's memory
 * with process_vm_readv, in chunks of SHM_COPY_CHUNK) whose first chunk is stalled on a
 * page of the source that is not there yet (userfaultfd): the receive's region is
 * deregistered meanwhile. mr_dereg waits for that one chunk and no more (the page is
 * supplied once it waits), and not one byte after it lands; the receive completes
 * LOC_PROT_ERR. Before, the copy took no fence: mr_dereg returned while the chunk was
 * still being copied, and every chunk landed after it. */
struct uffd_feed {
    int uffd;
    struct shm_ctx *bctx; /* b's: its mr_dereg waits on its fence */
    struct dereg_call *dc;
    struct exs_prov_mr *mr;
    uint8_t *page; /* what the missing page gets */
    long psz;
    int faulted, fed; /* atomic */
};

static void *uffd_feeder(void *arg)
{
    struct uffd_feed *f = arg;
    struct uffd_msg msg;
    struct pollfd pfd = {f->uffd, POLLIN, 0};
    struct uffdio_copy cp;

    if (poll(&pfd, 1, HANG_MS) != 1 || read(f->uffd, &msg, sizeof(msg)) != (ssize_t)sizeof(msg) ||
        msg.event != UFFD_EVENT_PAGEFAULT)
        return NULL;
    __atomic_store_n(&f->faulted, 1, __ATOMIC_RELEASE);
    /* the copy is stalled inside its first chunk: deregister now */
    dereg_start(f->dc, f->mr);
    /* supply the page once mr_dereg waits for the copy (or returned: no fence) */
    for (double end = pt_now_ms() + HANG_MS; pt_now_ms() < end;) {
        unsigned w;

        exs__lite_lock(&f->bctx->lock);
        w = f->bctx->keys.copy_waiters;
        exs__lite_unlock(&f->bctx->lock);
        if (w || __atomic_load_n(&f->dc->done, __ATOMIC_ACQUIRE))
            break;
        pt_sleep_ms(1);
    }
    cp = (struct uffdio_copy){.dst = msg.arg.pagefault.address & ~(uint64_t)(f->psz - 1),
                              .src = (uint64_t)(uintptr_t)f->page,
                              .len = (uint64_t)f->psz};
    (void)ioctl(f->uffd, UFFDIO_COPY, &cp);
    __atomic_store_n(&f->fed, 1, __ATOMIC_RELEASE);
    return NULL;
}

START_TEST(fence28_shm_pair_send_mr_dereg)
{
    enum { LEN = 2 * SHM_COPY_CHUNK + 4096, BUF = LEN + 4096 };
    long psz = sysconf(_SC_PAGESIZE);
    struct uffdio_api api = {.api = UFFD_API};
    struct uffdio_register reg;
    struct uffd_feed f = {0};
    struct dereg_call dc = {0};
    struct pt_pair p;
    struct pt_buf *dst;
    struct hand c;
    struct shm_rec rec;
    struct shm_rsge rs;
    uint8_t *src;
    pthread_t t;
    size_t landed = 0;
    int uffd;

    if (skip_unless_shm("fence28_shm_pair_send_mr_dereg"))
        return;
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) < 0) {
        test_skip("fence28_shm_pair_send_mr_dereg", "no userfaultfd: %s", strerror(errno));
        if (uffd >= 0)
            close(uffd);
        return;
    }
    /* the source: its first page present, its second missing until the feeder supplies it */
    src = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(src, MAP_FAILED);
    memset(src, 0x77, (size_t)psz);
    ck_assert_int_eq(madvise(src + psz, LEN - (size_t)psz, MADV_DONTNEED), 0);
    reg = (struct uffdio_register){.range = {(uint64_t)(uintptr_t)(src + psz), (uint64_t)psz},
                                   .mode = UFFDIO_REGISTER_MODE_MISSING};
    ck_assert_int_eq(ioctl(uffd, UFFDIO_REGISTER, &reg), 0);
    for (size_t o = 2 * (size_t)psz; o < LEN; o += (size_t)psz)
        src[o] = 0x77; /* (the rest present, any value: none of it may land) */
    f.page = aligned_alloc((size_t)psz, (size_t)psz);
    ck_assert_ptr_nonnull(f.page);
    memset(f.page, 0x77, (size_t)psz);

    pt_pair_setup(&p, NULL, NULL);
    c = hand_of(&p);
    dst = pt_pair_buf(&p, 'b', BUF, LW, 0x22);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, BUF), 0);
    f = (struct uffd_feed){uffd, shm_ep_of(p.eb)->ctx, &dc, dst->mr, f.page, psz, 0, 0};
    ck_assert_int_eq(pthread_create(&t, NULL, uffd_feeder, &f), 0);
    rs = (struct shm_rsge){(uint64_t)(uintptr_t)src, LEN};
    rec = (struct shm_rec){.type = SHM_REC_SEND,
                           .nsge = 1,
                           .len = LEN,
                           .size = (SHM_REC_HDR + sizeof(rs) + SHM_SLOT - 1) & ~(SHM_SLOT - 1)};
    hand_put(&c, &rec, &rs, sizeof(rs));
    pthread_join(t, NULL);
    ck_assert_msg(__atomic_load_n(&f.faulted, __ATOMIC_ACQUIRE), "the copy never met the gap");
    ck_assert(__atomic_load_n(&f.fed, __ATOMIC_ACQUIRE));
    ck_assert_int_eq(dereg_join(&dc), 0);
    dst->mr = NULL;
    {
        struct exs_prov_cqe cqe;

        pt_wait_cqe(&p.b, PT_TIMEOUT_MS, &cqe); /* the receive's, whatever its status */
        ck_assert_uint_eq(cqe.wr_id, 1);
        /* the first chunk may have landed (mr_dereg waited for it); nothing after it */
        for (size_t o = SHM_COPY_CHUNK; o < BUF; o++)
            landed += dst->p[o] != 0x22;
        ck_assert_msg(landed == 0, "%zu bytes landed after mr_dereg returned", landed);
        ck_assert(pt_buf_guards_ok(dst));
        ck_assert_int_eq(cqe.status, EXS_PROV_WC_LOC_PROT_ERR);
    }
    {
        struct exs_prov_cm_event ev;

        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_int_eq(ev.status, -ECONNABORTED);
        pt_wait_cm(&p.a, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    }
    close(c.bell);
    pt_pair_close(&p);
    close(uffd);
    munmap(src, LEN);
    free(f.page);
}
END_TEST

Suite *prov_fence28_suite(void)
{
    Suite *s = suite_create("prov_fence28");
    TCase *tc = pt_tcase("fence28");

    tcase_add_test(tc, fence28_tcp_read_response_mr_dereg);
    tcase_add_test(tc, fence28_tcp_read_response_dead_before);
    tcase_add_test(tc, fence28_tcp_recv_fail_pooled);
    tcase_add_test(tc, fence28_shm_frag_send_mr_dereg);
    tcase_add_test(tc, fence28_shm_pair_send_mr_dereg);
    suite_add_tcase(s, tc);
    return s;
}
