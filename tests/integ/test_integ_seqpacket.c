/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET data transfer over the public ES-API: ping-pong, pipelining, random sizes,
 * truncation, unregistered buffers. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#include "tests/integ/integ.h"

#define MSG_SEED(i) ((uint32_t)(0x5EED0000u + (uint32_t)(i)))

/* 1000 round trips of 64-byte messages, each verified on both sides. */
START_TEST(test_pingpong)
{
    struct it_pair p;
    struct it_buf *cs, *cr, *ss, *sr;
    exs_event_t ev;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    cs = it_buf_new(64, 1);
    cr = it_buf_new(64, 1);
    ss = it_buf_new(64, 1);
    sr = it_buf_new(64, 1);
    for (int i = 0; i < 1000; i++) {
        long bad;

        it_context("round trip %d", i);
        IT_POST_RECV(p.sfd, sr->p, 64, p.sq, IT_AH(2 * i), sr->mh);
        IT_POST_RECV(p.cfd, cr->p, 64, p.cq, IT_AH(2 * i + 1), cr->mh);
        it_fill(cs->p, 64, MSG_SEED(2 * i));
        IT_POST_SEND(p.cfd, cs->p, 64, p.cq, IT_AH(2 * i), cs->mh);
        it_expect_xfer_at(p.sq, EXS_EVT_RECV, p.sfd, IT_AH(2 * i), 64, 0, &ev, __FILE__, __LINE__);
        ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_buf, sr->p);
        ck_assert_uint_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_len, 64);
        bad = it_check(sr->p, 64, MSG_SEED(2 * i));
        ck_assert_msg(bad < 0, "ping %d: server got a wrong byte at %ld", i, bad);
        it_expect_send(p.cq, p.cfd, IT_AH(2 * i), 64);

        it_fill(ss->p, 64, MSG_SEED(2 * i + 1));
        IT_POST_SEND(p.sfd, ss->p, 64, p.sq, IT_AH(2 * i + 1), ss->mh);
        it_expect_recv(p.cq, p.cfd, IT_AH(2 * i + 1), 64, 0);
        bad = it_check(cr->p, 64, MSG_SEED(2 * i + 1));
        ck_assert_msg(bad < 0, "pong %d: client got a wrong byte at %ld", i, bad);
        it_expect_send(p.sq, p.sfd, IT_AH(2 * i + 1), 64);
    }
    ck_assert(it_buf_guards_ok(cr) && it_buf_guards_ok(sr));
    it_pair_close(&p);
}
END_TEST

/* n outstanding sends and n outstanding receives (n = 1, 2, 4, ..., 64), for an eager and
 * a rendezvous size and both posting orders: every event arrives, per direction in posting
 * order, message k lands in receive k. */
START_TEST(test_outstanding)
{
    static const size_t sizes[] = {512, 65536};
    enum { NMAX = 64 };
    struct it_pair p;
    struct it_buf *sb, *rb;
    long ahn = 0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 256, 256);
    sb = it_buf_new(NMAX * 65536, 1);
    rb = it_buf_new(NMAX * 65536, 1);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t len = sizes[si];

        for (int n = 1; n <= NMAX; n *= 2) {
            for (int recv_first = 1; recv_first >= 0; recv_first--) {
                long base = ahn;

                it_context("len %zu, %d outstanding, %s", len, n,
                           recv_first ? "receives posted first" : "sends posted first");
                memset(rb->p, IT_GUARD_BYTE, (size_t)n * len);
                for (int i = 0; i < n; i++)
                    it_fill(sb->p + (size_t)i * len, len, MSG_SEED(base + i));
                for (int pass = 0; pass < 2; pass++) {
                    if (pass == (recv_first ? 0 : 1)) {
                        for (int i = 0; i < n; i++)
                            IT_POST_RECV(p.sfd, rb->p + (size_t)i * len, len, p.sq, IT_AH(base + i),
                                         rb->mh);
                    } else {
                        for (int i = 0; i < n; i++)
                            IT_POST_SEND(p.cfd, sb->p + (size_t)i * len, len, p.cq, IT_AH(base + i),
                                         sb->mh);
                    }
                }
                for (int i = 0; i < n; i++) {
                    exs_event_t ev;
                    long bad;

                    it_expect_xfer_at(p.sq, EXS_EVT_RECV, p.sfd, IT_AH(base + i), (ssize_t)len, 0,
                                      &ev, __FILE__, __LINE__);
                    ck_assert_ptr_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_buf,
                                     rb->p + (size_t)i * len);
                    bad = it_check(rb->p + (size_t)i * len, len, MSG_SEED(base + i));
                    ck_assert_msg(bad < 0, "len %zu n %d %s: receive %d holds a wrong byte at %ld",
                                  len, n, recv_first ? "recv-first" : "send-first", i, bad);
                }
                for (int i = 0; i < n; i++) {
                    it_context("len %zu, %d outstanding, %s: send %d of %d", len, n,
                               recv_first ? "receives posted first" : "sends posted first", i, n);
                    it_expect_send(p.cq, p.cfd, IT_AH(base + i), (ssize_t)len);
                }
                ahn += n;
            }
        }
    }
    ck_assert(it_buf_guards_ok(rb));
    it_pair_close(&p);
}
END_TEST

/* 200 messages of log-uniform random sizes in [1, 8 MiB], in batches of 4: the first half
 * posts the receives first (eager and advertised direct), the second half the sends first
 * (eager and announce + READ). Every byte checked, bytes past the message untouched. */
static void random_sizes(const char *name, int nmsg, uint64_t seed, size_t eager_max)
{
    enum { BATCH = 4, MAXLEN = 8 << 20, SLACK = 256 };
    const int NMSG = nmsg;
    uint64_t rs = seed;
    struct it_pair p;
    struct it_buf *sb, *rb;
    size_t slot = (size_t)MAXLEN + SLACK;
    int n_eager = 0, n_large = 0;
    double t0 = it_now_ms();

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(BATCH * slot, 1);
    rb = it_buf_new(BATCH * slot, 1);
    for (int m0 = 0; m0 < NMSG; m0 += BATCH) {
        int recv_first = m0 < NMSG / 2;
        size_t len[BATCH], rlen[BATCH], soff[BATCH], roff[BATCH];

        for (int i = 0; i < BATCH; i++) {
            double u = (double)(it_rand(&rs) >> 11) / 9007199254740992.0; /* [0, 1) */

            len[i] = (size_t)exp(u * log((double)MAXLEN + 1));
            if (len[i] < 1)
                len[i] = 1;
            if (len[i] > MAXLEN)
                len[i] = MAXLEN;
            soff[i] = (size_t)i * slot + it_rand(&rs) % 64;
            roff[i] = (size_t)i * slot + it_rand(&rs) % 64;
            rlen[i] = len[i] + it_rand(&rs) % 128;
            it_fill(sb->p + soff[i], len[i], MSG_SEED(m0 + i) ^ (uint32_t)seed);
            memset(rb->p + (size_t)i * slot, IT_GUARD_BYTE, slot);
            if (len[i] < eager_max)
                n_eager++;
            else
                n_large++;
        }
        for (int pass = 0; pass < 2; pass++) {
            if (pass == (recv_first ? 0 : 1)) {
                for (int i = 0; i < BATCH; i++)
                    IT_POST_RECV(p.sfd, rb->p + roff[i], rlen[i], p.sq, IT_AH(m0 + i), rb->mh);
            } else {
                for (int i = 0; i < BATCH; i++)
                    IT_POST_SEND(p.cfd, sb->p + soff[i], len[i], p.cq, IT_AH(m0 + i), sb->mh);
            }
            if (pass == 0)
                it_sleep_ms(2); /* let the ADVERTs (or ANNOUNCEs) reach the peer first */
        }
        it_context("%s: messages %d..%d (%s)", name, m0, m0 + BATCH - 1,
                   recv_first ? "receives posted first" : "sends posted first");
        for (int i = 0; i < BATCH; i++) {
            exs_event_t ev;
            long bad;

            it_wait_event(p.sq, EXS_EVT_RECV, p.sfd, &ev);
            ck_assert_msg(ev.exs_evt_ahandle == IT_AH(m0 + i) && ev.exs_evt_errno == 0 &&
                              ev.exs_evt_u.exs_evt_xfer.exs_evt_result == (ssize_t)len[i] &&
                              !(ev.exs_evt_u.exs_evt_xfer.exs_evt_flags & MSG_TRUNC),
                          "message %d (%zu bytes into %zu, %s, seed %#llx): RECV ah %ld errno %d "
                          "result %zd flags %#x",
                          m0 + i, len[i], rlen[i], recv_first ? "recv-first" : "send-first",
                          (unsigned long long)seed, IT_AHN(ev.exs_evt_ahandle), ev.exs_evt_errno,
                          ev.exs_evt_u.exs_evt_xfer.exs_evt_result,
                          (unsigned)ev.exs_evt_u.exs_evt_xfer.exs_evt_flags);
            bad = it_check(rb->p + roff[i], len[i], MSG_SEED(m0 + i) ^ (uint32_t)seed);
            ck_assert_msg(bad < 0, "message %d (%zu bytes, %s): wrong byte at offset %ld", m0 + i,
                          len[i], recv_first ? "recv-first" : "send-first", bad);
            ck_assert_msg(
                it_all_bytes(rb->p + (size_t)i * slot, roff[i] - (size_t)i * slot, IT_GUARD_BYTE) &&
                    it_all_bytes(rb->p + roff[i] + len[i],
                                 (size_t)(i + 1) * slot - roff[i] - len[i], IT_GUARD_BYTE),
                "message %d (%zu bytes): bytes outside the message were written", m0 + i, len[i]);
        }
        for (int i = 0; i < BATCH; i++)
            it_expect_send(p.cq, p.cfd, IT_AH(m0 + i), (ssize_t)len[i]);
    }
    ck_assert(it_buf_guards_ok(rb));
    ck_assert_int_gt(n_eager, nmsg / 20);
    ck_assert_int_gt(n_large, nmsg / 20);
    it_pair_close(&p);
    printf("%s: %d messages below %zu bytes, %d larger, in %.0f ms\n", name, n_eager, eager_max,
           n_large, it_now_ms() - t0);
}

START_TEST(test_random_sizes)
{
    random_sizes("random_sizes", 200, 0x1E5C0DEull, 8192);
}
END_TEST

/* The default eager threshold (EXS_EAGER_MAX, 8192) takes a 4 KiB message through the
 * peer's ring: its send completes with no receive posted at the peer (an announced one
 * would wait for the receive and its READ); the receive posted later gets it whole. */
START_TEST(test_eager_default_4k)
{
    struct it_pair p;
    struct it_buf *sb, *rb;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);
    it_fill(sb->p, 4096, MSG_SEED(7));
    IT_POST_SEND(p.cfd, sb->p, 4096, p.cq, IT_AH(7), sb->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(7), 4096);
    memset(sb->p, 0, 4096); /* the buffer is the application's again */
    IT_POST_RECV(p.sfd, rb->p, 4096, p.sq, IT_AH(8), rb->mh);
    it_expect_recv(p.sq, p.sfd, IT_AH(8), 4096, 0);
    ck_assert_int_lt(it_check(rb->p, 4096, MSG_SEED(7)), 0);
    it_pair_close(&p);
}
END_TEST

/* The same with EXS_EAGER_MAX=16384: messages up to 16 KiB go eagerly. */
START_TEST(test_random_sizes_eager16k)
{
    it_setenv("EXS_EAGER_MAX", "16384");
    random_sizes("random_sizes_eager16k", 100, 0xEA6E4ull, 16384);
}
END_TEST

/* The same over an emulated long link (EXS_EMU_DELAY_US=2000 one way): a 64-byte round
 * trip takes at least 4 ms and nothing is lost or reordered. */
START_TEST(test_random_sizes_delay)
{
    struct it_pair p;
    struct it_buf *b, *r;
    double t0, rtt;

    it_setenv("EXS_EMU_DELAY_US", "2000");
    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    b = it_buf_new(64, 1);
    r = it_buf_new(64, 1);
    t0 = it_now_ms();
    for (int i = 0; i < 5; i++) {
        IT_POST_RECV(p.sfd, r->p, 64, p.sq, IT_AH(i), r->mh);
        IT_POST_SEND(p.cfd, b->p, 64, p.cq, IT_AH(i), b->mh);
        it_expect_recv(p.sq, p.sfd, IT_AH(i), 64, 0);
        it_expect_send(p.cq, p.cfd, IT_AH(i), 64);
        IT_POST_RECV(p.cfd, r->p, 64, p.cq, IT_AH(100 + i), r->mh);
        IT_POST_SEND(p.sfd, b->p, 64, p.sq, IT_AH(100 + i), b->mh);
        it_expect_recv(p.cq, p.cfd, IT_AH(100 + i), 64, 0);
        it_expect_send(p.sq, p.sfd, IT_AH(100 + i), 64);
    }
    rtt = (it_now_ms() - t0) / 5;
    /* the link emulation is the tcp provider's: a real device ignores it */
    if (strcmp(it_provider, "tcp") == 0)
        ck_assert_msg(rtt >= 3.9, "EXS_EMU_DELAY_US=2000: round trip %.2f ms, expected >= 4 ms",
                      rtt);
    it_pair_close(&p);
    it_buf_free(b);
    it_buf_free(r);
    random_sizes("random_sizes_delay", 40, 0xDE1A7ull, 8192);
}
END_TEST

/* Send a len-byte message into an rlen-byte receive (receive posted first when recv_first,
 * with a pause so its ADVERT arrives), check result rlen, MSG_TRUNC, the prefix and that
 * nothing past rlen was written; then a following message arrives intact. */
static void trunc_case(struct it_pair *p, struct it_buf *sb, struct it_buf *rb, size_t len,
                       size_t rlen, int recv_first, long ah)
{
    const size_t next_len = 777;
    exs_event_t ev;
    long bad;

    it_context("%zu-byte message into a %zu-byte receive, %s", len, rlen,
               recv_first ? "receive posted first" : "send posted first");
    memset(rb->p, IT_GUARD_BYTE, rb->len);
    it_fill(sb->p, len, MSG_SEED(ah));
    if (recv_first) {
        IT_POST_RECV(p->sfd, rb->p, rlen, p->sq, IT_AH(ah), rb->mh);
        it_sleep_ms(5);
        IT_POST_SEND(p->cfd, sb->p, len, p->cq, IT_AH(ah), sb->mh);
    } else {
        IT_POST_SEND(p->cfd, sb->p, len, p->cq, IT_AH(ah), sb->mh);
        it_sleep_ms(5);
        IT_POST_RECV(p->sfd, rb->p, rlen, p->sq, IT_AH(ah), rb->mh);
    }
    it_expect_xfer_at(p->sq, EXS_EVT_RECV, p->sfd, IT_AH(ah), (ssize_t)rlen, 1, &ev, __FILE__,
                      __LINE__);
    bad = it_check(rb->p, rlen, MSG_SEED(ah));
    ck_assert_msg(bad < 0, "%zu into %zu (%s): wrong byte at %ld", len, rlen,
                  recv_first ? "recv-first" : "send-first", bad);
    ck_assert_msg(it_all_bytes(rb->p + rlen, rb->len - rlen, IT_GUARD_BYTE),
                  "%zu into %zu (%s): bytes past the receive buffer were written", len, rlen,
                  recv_first ? "recv-first" : "send-first");
    /* The sender's event: no error (its result is not specified for a cut message). */
    it_expect_xfer_at(p->cq, EXS_EVT_SEND, p->cfd, IT_AH(ah), IT_ANY_RESULT, 0, NULL, __FILE__,
                      __LINE__);

    /* The next message is intact and not flagged. */
    memset(rb->p, IT_GUARD_BYTE, rb->len);
    it_fill(sb->p, next_len, MSG_SEED(ah + 1));
    IT_POST_SEND(p->cfd, sb->p, next_len, p->cq, IT_AH(ah + 1), sb->mh);
    IT_POST_RECV(p->sfd, rb->p, 1000, p->sq, IT_AH(ah + 1), rb->mh);
    it_expect_recv(p->sq, p->sfd, IT_AH(ah + 1), (ssize_t)next_len, 0);
    bad = it_check(rb->p, next_len, MSG_SEED(ah + 1));
    ck_assert_msg(bad < 0, "message after %zu into %zu: wrong byte at %ld", len, rlen, bad);
    it_expect_send(p->cq, p->cfd, IT_AH(ah + 1), (ssize_t)next_len);
}

START_TEST(test_trunc_rendezvous)
{
    struct it_pair p;
    struct it_buf *sb, *rb;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(16384, 1);
    rb = it_buf_new(16384, 1);
    trunc_case(&p, sb, rb, 10000, 100, 0, 10); /* announce, READ of 100 bytes */
    trunc_case(&p, sb, rb, 10000, 100, 1, 20); /* small receive: not advertised */
    it_pair_close(&p);
}
END_TEST

START_TEST(test_trunc_eager)
{
    struct it_pair p;
    struct it_buf *sb, *rb;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(4096, 1);
    rb = it_buf_new(4096, 1);
    trunc_case(&p, sb, rb, 2000, 10, 0, 10);
    trunc_case(&p, sb, rb, 2000, 10, 1, 20);
    it_pair_close(&p);
}
END_TEST

START_TEST(test_trunc_advertised)
{
    struct it_pair p;
    struct it_buf *sb, *rb;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    sb = it_buf_new(1 << 20, 1);
    rb = it_buf_new(1 << 17, 1);
    /* 1 MiB into an advertised 64 KiB receive: direct write of 64 KiB with trunc. */
    trunc_case(&p, sb, rb, 1 << 20, 65536, 1, 10);
    /* 10000 bytes into an advertised 8 KiB receive. */
    trunc_case(&p, sb, rb, 10000, 8192, 1, 20);
    /* The same sizes with the send first (announce + READ). */
    trunc_case(&p, sb, rb, 1 << 20, 65536, 0, 30);
    it_pair_close(&p);
}
END_TEST

/* EXS_MHANDLE_UNREGISTERED on both sides for 1 B, 3 KiB and 1 MiB, both posting orders. */
START_TEST(test_unregistered)
{
    static const size_t sizes[] = {1, 3072, 1 << 20};
    struct it_pair p;
    long ah = 0;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t len = sizes[si];

        for (int recv_first = 1; recv_first >= 0; recv_first--, ah++) {
            uint8_t *s = malloc(len), *r = malloc(len + 16);
            long bad;

            it_context("%zu bytes unregistered, %s", len,
                       recv_first ? "receive posted first" : "send posted first");
            ck_assert(s && r);
            it_fill(s, len, MSG_SEED(ah));
            memset(r, IT_GUARD_BYTE, len + 16);
            if (recv_first) {
                IT_POST_RECV(p.sfd, r, len + 16, p.sq, IT_AH(ah), EXS_MHANDLE_UNREGISTERED);
                it_sleep_ms(2);
                IT_POST_SEND(p.cfd, s, len, p.cq, IT_AH(ah), EXS_MHANDLE_UNREGISTERED);
            } else {
                IT_POST_SEND(p.cfd, s, len, p.cq, IT_AH(ah), EXS_MHANDLE_UNREGISTERED);
                it_sleep_ms(2);
                IT_POST_RECV(p.sfd, r, len + 16, p.sq, IT_AH(ah), EXS_MHANDLE_UNREGISTERED);
            }
            it_expect_recv(p.sq, p.sfd, IT_AH(ah), (ssize_t)len, 0);
            it_expect_send(p.cq, p.cfd, IT_AH(ah), (ssize_t)len);
            bad = it_check(r, len, MSG_SEED(ah));
            ck_assert_msg(bad < 0, "%zu bytes unregistered (%s): wrong byte at %ld", len,
                          recv_first ? "recv-first" : "send-first", bad);
            ck_assert(it_all_bytes(r + len, 16, IT_GUARD_BYTE));
            /* The other direction, from the server's unregistered buffer. */
            it_fill(s, len, MSG_SEED(ah + 1000));
            memset(r, IT_GUARD_BYTE, len + 16);
            IT_POST_RECV(p.cfd, r, len, p.cq, IT_AH(ah + 1000), EXS_MHANDLE_UNREGISTERED);
            IT_POST_SEND(p.sfd, s, len, p.sq, IT_AH(ah + 1000), EXS_MHANDLE_UNREGISTERED);
            it_expect_recv(p.cq, p.cfd, IT_AH(ah + 1000), (ssize_t)len, 0);
            it_expect_send(p.sq, p.sfd, IT_AH(ah + 1000), (ssize_t)len);
            bad = it_check(r, len, MSG_SEED(ah + 1000));
            ck_assert_msg(bad < 0, "%zu bytes unregistered, server to client: wrong byte at %ld",
                          len, bad);
            free(s);
            free(r);
        }
    }
    it_pair_close(&p);
}
END_TEST

/* A small SEQPACKET send that ends at its post (spec/proto-layout.md, "A SEQPACKET send
 * that ends at its post"): in a ping-pong each send after an answer goes with no operation
 * (counted), asynchronous and synchronous, registered and not, its event and bytes as the
 * whole way's; sends posted back to back (no answer between) take the whole way behind it,
 * every event in posting order and every message in its receive; bad input still fails
 * with the whole way's errno. */
START_TEST(test_send_now)
{
    enum { N = 200, LEN = 64 };
    struct it_pair p;
    struct it_buf *cs, *cr[3], *ss, *sr[3];
    uint64_t c0, s0;
    int inl = 0;
    long bad;

    it_init();
    it_pair_open(&p, SOCK_SEQPACKET, 64, 64);
    cs = it_buf_new(3 * LEN, 1);
    ss = it_buf_new(LEN, 1);
    for (int k = 0; k < 3; k++) {
        cr[k] = it_buf_new(LEN, 1);
        sr[k] = it_buf_new(LEN, 1);
    }
    c0 = it_posts_copied(p.cfd, LEN, &inl);
    s0 = it_posts_copied(p.sfd, LEN, NULL);
    for (int i = 0; i < N; i++) {
        int sync = i % 4 == 3;
        exs_mhandle_t mh = i % 8 == 5 ? EXS_MHANDLE_UNREGISTERED : cs->mh;

        it_context("round trip %d", i);
        IT_POST_RECV(p.sfd, sr[0]->p, LEN, p.sq, IT_AH(2 * i), sr[0]->mh);
        IT_POST_RECV(p.cfd, cr[0]->p, LEN, p.cq, IT_AH(2 * i + 1), cr[0]->mh);
        it_fill(cs->p, LEN, MSG_SEED(2 * i));
        if (sync)
            ck_assert_int_eq(exs_send(p.cfd, cs->p, LEN, 0, EXS_QHANDLE_INVALID, NULL, mh), LEN);
        else
            IT_POST_SEND(p.cfd, cs->p, LEN, p.cq, IT_AH(2 * i), mh);
        it_expect_recv(p.sq, p.sfd, IT_AH(2 * i), LEN, 0);
        bad = it_check(sr[0]->p, LEN, MSG_SEED(2 * i));
        ck_assert_msg(bad < 0, "ping %d: server got a wrong byte at %ld", i, bad);
        if (!sync)
            it_expect_send(p.cq, p.cfd, IT_AH(2 * i), LEN);
        it_fill(ss->p, LEN, MSG_SEED(2 * i + 1));
        IT_POST_SEND(p.sfd, ss->p, LEN, p.sq, IT_AH(2 * i + 1), ss->mh);
        it_expect_send(p.sq, p.sfd, IT_AH(2 * i + 1), LEN);
        it_expect_recv(p.cq, p.cfd, IT_AH(2 * i + 1), LEN, 0);
        bad = it_check(cr[0]->p, LEN, MSG_SEED(2 * i + 1));
        ck_assert_msg(bad < 0, "pong %d: client got a wrong byte at %ld", i, bad);
    }
    if (inl) {
        /* all but a few: before batching's threshold came to rest, and one in
         * EXS_QUIET_MAX signaled to retire the provider slots of the unsignaled ones */
        ck_assert_uint_ge(it_posts_copied(p.cfd, LEN, NULL) - c0, N - N / 16 - 8);
        ck_assert_uint_ge(it_posts_copied(p.sfd, LEN, NULL) - s0, N - N / 16 - 8);
    }
    /* three back to back: at most the first ends at its post; the rest queue behind it */
    c0 = it_posts_copied(p.cfd, LEN, NULL);
    for (int k = 0; k < 3; k++) {
        it_context("back to back %d", k);
        it_fill(cs->p + k * LEN, LEN, MSG_SEED(1000 + k));
        IT_POST_SEND(p.cfd, cs->p + k * LEN, LEN, p.cq, IT_AH(1000 + k), cs->mh);
    }
    for (int k = 0; k < 3; k++)
        it_expect_send(p.cq, p.cfd, IT_AH(1000 + k), LEN);
    ck_assert_uint_le(it_posts_copied(p.cfd, LEN, NULL) - c0, 1);
    for (int k = 0; k < 3; k++)
        IT_POST_RECV(p.sfd, sr[k]->p, LEN, p.sq, IT_AH(1000 + k), sr[k]->mh);
    for (int k = 0; k < 3; k++) {
        it_expect_recv(p.sq, p.sfd, IT_AH(1000 + k), LEN, 0);
        bad = it_check(sr[k]->p, LEN, MSG_SEED(1000 + k));
        ck_assert_msg(bad < 0, "back to back %d: wrong byte at %ld", k, bad);
    }
    /* an answer came: the next goes at its post again; bad input fails as before */
    IT_POST_RECV(p.sfd, sr[0]->p, LEN, p.sq, IT_AH(2000), sr[0]->mh);
    IT_POST_RECV(p.cfd, cr[0]->p, LEN, p.cq, IT_AH(2001), cr[0]->mh);
    IT_POST_SEND(p.sfd, ss->p, LEN, p.sq, IT_AH(2001), ss->mh);
    it_expect_send(p.sq, p.sfd, IT_AH(2001), LEN);
    it_expect_recv(p.cq, p.cfd, IT_AH(2001), LEN, 0);
    ck_assert_int_eq(exs_send(p.cfd, cs->p, LEN, MSG_WAITALL, p.cq, IT_AH(1), cs->mh), -1);
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_int_eq(exs_send(p.cfd, cs->p, LEN, 0, p.cq, IT_AH(1), ss->mh), -1);
    ck_assert_int_eq(errno, EINVAL); /* not within that registration */
    ck_assert_int_eq(exs_send(p.cfd, cs->p, LEN, 0, (exs_qhandle_t)0x7fff0001, IT_AH(1), cs->mh),
                     -1);
    ck_assert_int_eq(errno, EINVAL); /* no such queue */
    c0 = it_posts_copied(p.cfd, LEN, NULL);
    it_fill(cs->p, LEN, MSG_SEED(2000));
    IT_POST_SEND(p.cfd, cs->p, LEN, p.cq, IT_AH(2000), cs->mh);
    it_expect_send(p.cq, p.cfd, IT_AH(2000), LEN);
    if (inl)
        ck_assert_uint_eq(it_posts_copied(p.cfd, LEN, NULL) - c0, 1);
    it_expect_recv(p.sq, p.sfd, IT_AH(2000), LEN, 0);
    bad = it_check(sr[0]->p, LEN, MSG_SEED(2000));
    ck_assert_msg(bad < 0, "after the errors: wrong byte at %ld", bad);
    it_pair_close(&p);
    it_buf_free(cs);
    it_buf_free(ss);
    for (int k = 0; k < 3; k++) {
        it_buf_free(cr[k]);
        it_buf_free(sr[k]);
    }
}
END_TEST

Suite *integ_seqpacket_suite(void)
{
    Suite *s = suite_create("integ_seqpacket");
    TCase *tc;

    tc = it_tcase("pingpong", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_pingpong);
    suite_add_tcase(s, tc);
    tc = it_tcase("outstanding", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_outstanding);
    suite_add_tcase(s, tc);
    tc = it_tcase("random_sizes", 180);
    tcase_add_test(tc, test_random_sizes);
    tcase_add_test(tc, test_random_sizes_eager16k);
    tcase_add_test(tc, test_eager_default_4k);
    tcase_add_test(tc, test_random_sizes_delay);
    suite_add_tcase(s, tc);
    tc = it_tcase("truncation", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_trunc_rendezvous);
    tcase_add_test(tc, test_trunc_eager);
    tcase_add_test(tc, test_trunc_advertised);
    suite_add_tcase(s, tc);
    tc = it_tcase("unregistered", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_unregistered);
    suite_add_tcase(s, tc);
    tc = it_tcase("send_now", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_send_now);
    suite_add_tcase(s, tc);
    return s;
}
