/* SPDX-License-Identifier: MIT */
/* A protocol violation's reason reaches the application (EXS_SO_ERROR_REASON), exsctl stat
 * ("violation") and the trace stream (spec/protocol.md §10, spec/observability.md §3). The
 * violation is recorded inside the library as a hostile peer's record would make it
 * (exs__proto_violation, then the reset), so the test runs on every provider. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/engine/engine.h"
#include "exs/proto/proto_int.h"
#include "exs/util/json.h"
#include "exs/util/lockorder.h"
#include "tests/integ/integ.h"
#include "tests/integ/integ_ctl.h"

#define PV_REASON "ctrl-size ADVERT: length 48, want 40"

static struct exs_conn *pv_conn_of(int fd)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    struct exs_conn *conn;

    ck_assert_ptr_nonnull(s);
    api_sock_lock(s);
    conn = s->conn;
    api_sock_unlock(s);
    exs__api_sock_put(s); /* the conn lives as long as the socket, which the test holds */
    ck_assert_ptr_nonnull(conn);
    return conn;
}

/* On the progress thread, as a completion handler finds a bad record. */
static void pv_inject(void *arg)
{
    struct exs_conn *conn = arg;

    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__proto_violation(conn, EXS_PV_CTRL_SIZE, EXS_CTRL_ADVERT,
                                          "length %u, want %u", 48u, EXS_WIRE_ADVERT_LEN),
                     -EPROTO);
    exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
}

static void pv_reason_of(int fd, char *buf, socklen_t size, socklen_t want_len)
{
    socklen_t len = size;

    memset(buf, 0x55, size);
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_ERROR_REASON, buf, &len), 0);
    ck_assert_uint_eq(len, want_len);
    ck_assert_int_eq(buf[len - 1], '\0');
}

START_TEST(test_pv_reason_shown)
{
    struct it_pair p;
    struct it_buf *rb;
    struct exs_json *j;
    const struct exs_json *conns;
    char why[EXS_ERROR_REASON_MAX];
    socklen_t len;
    int tfd, cfd, found = 0;

    it_ctl_setup("pv");
    it_init();
    tfd = it_ctl_open();
    cfd = it_ctl_open();
    exs__json_free(it_ctl_req(tfd, "trace\n"));
    rb = it_buf_new(4096, 1);
    it_pair_open(&p, SOCK_SEQPACKET, 16, 16);

    /* a healthy connection: an empty reason; a buffer of no byte, and setting it, refused */
    pv_reason_of(p.sfd, why, sizeof(why), 1);
    ck_assert_str_eq(why, "");
    len = 0;
    ck_assert_int_eq(exs_getsockopt(p.sfd, SOL_EXS, EXS_SO_ERROR_REASON, why, &len), -1);
    ck_assert_int_eq(errno, EINVAL);
    int one = 1;
    ck_assert_int_eq(exs_setsockopt(p.sfd, SOL_EXS, EXS_SO_ERROR_REASON, &one, sizeof(one)), -1);
    ck_assert_int_eq(errno, ENOPROTOOPT);

    IT_POST_RECV(p.sfd, rb->p, 4096, p.sq, IT_AH(1), rb->mh);
    exs__engine_call(pv_inject, pv_conn_of(p.sfd));
    it_expect_err(p.sq, EXS_EVT_RECV, p.sfd, IT_AH(1), ECONNRESET);

    /* the application: the whole line, or cut to its buffer */
    pv_reason_of(p.sfd, why, sizeof(why), sizeof(PV_REASON));
    ck_assert_str_eq(why, PV_REASON);
    pv_reason_of(p.sfd, why, 10, 10);
    ck_assert_str_eq(why, "ctrl-size");
    /* the peer broke no rule: the client's reason stays empty */
    pv_reason_of(p.cfd, why, sizeof(why), 1);

    /* the trace stream: one violation record */
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "\"violation\"", NULL, NULL) == IT_CTL_WANT,
                  "no violation record in the trace");

    /* exsctl stat: the reason on the socket's row, "" on the others */
    j = it_ctl_req(cfd, "stat\n");
    conns = exs__json_get(j, "conns");
    ck_assert_ptr_nonnull(conns);
    for (const struct exs_json *c = conns->child; c; c = c->next) {
        ck_assert_ptr_nonnull(exs__json_get(c, "violation"));
        if (exs__json_get_u64(c, "fd") == (uint64_t)p.sfd) {
            found |= 1;
            ck_assert_str_eq(exs__json_get_str(c, "violation"), PV_REASON);
        } else {
            found |= 2;
            ck_assert_str_eq(exs__json_get_str(c, "violation"), "");
        }
    }
    ck_assert_int_eq(found, 3);
    exs__json_free(j);

    close(tfd);
    close(cfd);
    it_pair_close(&p);
    it_buf_free(rb);
    it_fini();
    rmdir(it_ctl_dir());
}
END_TEST

Suite *integ_pv_suite(void)
{
    Suite *s = suite_create("integ_pv");

    it_suite_add(s, "pv", IT_CASE_TIMEOUT, 1, (const TTest *const[]){test_pv_reason_shown, NULL});
    return s;
}
