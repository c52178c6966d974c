/* SPDX-License-Identifier: MIT */
/* Request tracing seen through the process's own trace stream: records, their bounds, off at mask
 * 0. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/util/json.h"
#include "tests/integ/integ.h"
#include "tests/integ/integ_ctl.h"

/* One message of len bytes from cfd to sfd, received, both completions seen. STREAM: the
 * receive takes exactly len bytes (MSG_WAITALL); send_first: the send completes before the
 * receive is posted (its bytes wait in the ring). */
static void rt_message_at(struct it_pair *p, struct it_buf *sb, struct it_buf *rb, size_t len,
                          int n, int stream, int send_first)
{
    if (send_first) {
        IT_POST_SEND(p->cfd, sb->p, len, p->cq, IT_AH(n), sb->mh);
        it_expect_send(p->cq, p->cfd, IT_AH(n), (ssize_t)len);
    }
    ck_assert_int_eq(exs_recv(p->sfd, rb->p, stream ? len : rb->len, stream ? MSG_WAITALL : 0,
                              p->sq, IT_AH(1000 + n), rb->mh),
                     0);
    if (!send_first) {
        IT_POST_SEND(p->cfd, sb->p, len, p->cq, IT_AH(n), sb->mh);
        it_expect_send(p->cq, p->cfd, IT_AH(n), (ssize_t)len);
    }
    it_expect_recv(p->sq, p->sfd, IT_AH(1000 + n), (ssize_t)len, 0);
}

static void rt_message(struct it_pair *p, struct it_buf *sb, struct it_buf *rb, size_t len, int n)
{
    rt_message_at(p, sb, rb, len, n, 0, 0);
}

#define RT_MSGS 16
#define RT_BIG  (256 * 1024)
#define RT_10S  10000000000ll
#define RT_YEAR (365ll * 86400 * 1000000000)

static size_t rt_size(int n)
{
    return n % 8 == 4 ? RT_BIG : 64; /* a large one (announced or direct) among small ones */
}

/* The send a record names: its message number, or (STREAM) the one whose bytes end at
 * the record's seq; -1 when none does. */
static int rt_send_of(uint64_t seq, int stream)
{
    uint64_t end = 0;

    if (!stream)
        return seq < RT_MSGS ? (int)seq : -1;
    for (int n = 0; n < RT_MSGS; n++) {
        end += rt_size(n);
        if (end == seq)
            return n;
    }
    return -1;
}

/* Mask 3: sends 0, 4, 8 and 12 are traced; each record is complete, its times ordered
 * and plausible, its receiver times, corrected by the offset, between the sender's wire
 * time and its reading of the answer within the offset's bound (same host: the offset is
 * that of the receiver's trace clock, a random epoch). STREAM: send 8 waits in the ring before its
 * receive is posted. */
static void rt_sampled_records(int type)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    int tfd, seen[RT_MSGS] = {0}, stream = type == SOCK_STREAM;

    it_ctl_setup("trace");
    it_setenv("EXS_TRACE_SAMPLE_MASK", "3");
    it_init();
    tfd = it_ctl_open();
    exs__json_free(it_ctl_req(tfd, "trace\n"));
    sb = it_buf_new(RT_BIG, 1);
    rb = it_buf_new(RT_BIG, 1);
    it_pair_open(&p, type, 16, 16);
    for (int n = 0; n < RT_MSGS; n++)
        rt_message_at(&p, sb, rb, rt_size(n), n, stream, stream && n == 8);
    for (int k = 0; k < RT_MSGS / 4; k++) {
        struct exs_json *j = NULL;
        const struct exs_json *r;

        ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, NULL, NULL, &j) == IT_CTL_REQ,
                      "only %d of %d trace records", k, RT_MSGS / 4);
        r = exs__json_get(j, "req");
        int n = rt_send_of(exs__json_get_u64(r, "seq"), stream);
        int64_t post = (int64_t)exs__json_get_u64(r, "post_ns");
        int64_t wire = (int64_t)exs__json_get_u64(r, "wire_ns");
        int64_t done = (int64_t)exs__json_get_u64(r, "done_ns");
        int64_t ans = (int64_t)exs__json_get_u64(r, "answer_ns");
        int64_t arr = exs__json_get_i64(r, "arrival_ns");
        int64_t dlv = exs__json_get_i64(r, "delivery_ns");
        int64_t off = exs__json_get_i64(r, "offset_ns");
        int64_t err = (int64_t)exs__json_get_u64(r, "offset_err_ns");

        ck_assert_int_ge(n, 0);
        ck_assert_int_eq(n % 4, 0);
        ck_assert_int_eq(seen[n]++, 0);
        ck_assert_uint_eq(exs__json_get_u64(r, "bytes"), rt_size(n));
        ck_assert(*exs__json_get_str(r, "conn"));
        ck_assert_int_gt(post, 0);
        ck_assert_int_le(post, wire);
        ck_assert_int_le(wire, done);
        ck_assert_int_le(arr, dlv);
        ck_assert_int_ge(arr + err, wire);
        ck_assert_int_le(dlv, ans + err);
        /* one host, but the receiver's times came on its trace clock (§5.1), years from
         * the host's: the bounds above check that the offset converts them right */
        ck_assert_int_gt(off < 0 ? -off : off, RT_YEAR);
        ck_assert_int_lt(done - post, RT_10S);
        ck_assert_int_lt(ans - post, RT_10S);
        ck_assert_int_lt(err, RT_10S);
        if (stream && n == 8) /* its receive was posted after its send completed */
            ck_assert_int_ge(dlv + err, done);
        exs__json_free(j);
    }
    close(tfd);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_fini();
    rmdir(it_ctl_dir());
}

START_TEST(test_trace_sampled_records)
{
    rt_sampled_records(SOCK_SEQPACKET);
}
END_TEST

START_TEST(test_trace_stream_records)
{
    rt_sampled_records(SOCK_STREAM);
}
END_TEST

/* Mask 0: messages make no record (a marker log record, queued after their completions,
 * comes first); set online to 1, the next messages are traced. */
START_TEST(test_trace_off_then_online)
{
    struct it_pair p;
    struct it_buf *sb, *rb;
    struct exs_json *j;
    int tfd, cfd;

    it_ctl_setup("trace");
    it_init();
    tfd = it_ctl_open();
    cfd = it_ctl_open();
    exs__json_free(it_ctl_req(tfd, "trace\n"));
    sb = it_buf_new(RT_BIG, 1);
    rb = it_buf_new(RT_BIG, 1);
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);
    for (int n = 0; n < 8; n++)
        rt_message(&p, sb, rb, rt_size(n), n);
    exs__json_free(it_ctl_req(cfd, "set log_level info\n"));
    exs__json_free(it_ctl_req(cfd, "set qspin_us 54\n"));
    /* the marker, and no request trace before it */
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "qspin_us changed", "\"req\"", NULL) ==
                      IT_CTL_WANT,
                  "no marker record in the trace");

    exs__json_free(it_ctl_req(cfd, "set trace_sample_mask 1\n"));
    for (int n = 8; n < 12; n++)
        rt_message(&p, sb, rb, 64, n);
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, NULL, NULL, &j) == IT_CTL_REQ,
                  "no trace record once tracing was set on");
    ck_assert_uint_ge(exs__json_get_u64(exs__json_get(j, "req"), "seq"), 8);
    exs__json_free(j);
    exs__json_free(it_ctl_req(cfd, "set trace_sample_mask 0\n"));
    close(tfd);
    close(cfd);
    it_pair_close(&p);
    it_buf_free(sb);
    it_buf_free(rb);
    it_fini();
    rmdir(it_ctl_dir());
}
END_TEST

Suite *integ_trace_suite(void)
{
    Suite *s = suite_create("integ_trace");

    it_suite_add(s, "trace", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_trace_sampled_records, test_trace_stream_records,
                                        test_trace_off_then_online, NULL});
    return s;
}
