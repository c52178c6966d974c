/* SPDX-License-Identifier: MIT */
/* Connection management: private data on connect/accept/reject, unreachable peers, several
 * connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

static void check_pd(const struct exs_prov_cm_event *ev, uint32_t len, uint32_t seed,
                     const char *what)
{
    ck_assert_msg(ev->private_data_len == len, "%s: private_data_len %u, expected %u", what,
                  ev->private_data_len, len);
    ck_assert_msg(pt_pattern_check(ev->private_data, len, seed) == -1,
                  "%s: private data bytes differ", what);
}

/* connect with len bytes, accept (or reject) with len bytes, check both ways. */
static void private_data_case(uint32_t len, int do_reject)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;
    uint8_t out[EXS_PROV_PRIVATE_DATA_MAX], back[EXS_PROV_PRIVATE_DATA_MAX];
    const struct sockaddr_in *pa;

    pt_pair_open(&p, NULL, NULL);
    if (len == 0)
        len = p.a.ctx->caps.max_private_data;
    ck_assert_uint_ge(p.a.ctx->caps.max_private_data, 56);
    ck_assert_uint_le(len, EXS_PROV_PRIVATE_DATA_MAX);
    pt_pattern(out, len, 1000 + len);
    pt_pattern(back, len, 2000 + len);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, out, len), 0);
    memset(out, 0, sizeof(out)); /* the provider copied it */
    pt_wait_cm(&p.b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.listener, p.lis);
    ck_assert_ptr_nonnull(ev.req);
    ck_assert_ptr_eq(ev.req->listener, p.lis);
    check_pd(&ev, len, 1000 + len, "CONNECT_REQUEST");
    ck_assert_int_eq(ev.peer_addr.ss_family, AF_INET);
    pa = (const struct sockaddr_in *)&ev.peer_addr;
    ck_assert_uint_eq(ntohl(pa->sin_addr.s_addr), INADDR_LOOPBACK);
    ck_assert_uint_ge(ev.peer_addrlen, sizeof(struct sockaddr_in));
    if (do_reject) {
        ck_assert_int_eq(pt_ops->reject(ev.req, back, len), 0);
        pt_wait_cm(&p.a, EXS_PROV_CM_REJECTED, PT_TIMEOUT_MS, &ev);
        ck_assert_ptr_eq(ev.ep, p.ea);
        check_pd(&ev, len, 2000 + len, "REJECTED");
        ck_assert_int_ne(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
        pt_expect_no_cm(&p.b, 50);
    } else {
        ck_assert_int_eq(pt_ops->accept(ev.req, p.eb, back, len), 0);
        pt_wait_cm(&p.a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
        ck_assert_ptr_eq(ev.ep, p.ea);
        check_pd(&ev, len, 2000 + len, "ESTABLISHED");
        p.a_up = 1;
        pt_wait_cm(&p.b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
        ck_assert_ptr_eq(ev.ep, p.eb);
        p.b_up = 1;
    }
    pt_pair_close(&p);
}

START_TEST(private_data_56_accept)
{
    private_data_case(56, 0);
}
END_TEST

START_TEST(private_data_max_accept)
{
    private_data_case(0, 0);
}
END_TEST

START_TEST(private_data_56_reject)
{
    private_data_case(56, 1);
}
END_TEST

START_TEST(private_data_max_reject)
{
    private_data_case(0, 1);
}
END_TEST

START_TEST(private_data_too_long)
{
    struct pt_pair p;
    uint8_t pd[EXS_PROV_PRIVATE_DATA_MAX + 1];
    uint32_t max;

    memset(pd, 1, sizeof(pd));
    pt_pair_open(&p, NULL, NULL);
    max = p.a.ctx->caps.max_private_data;
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, pd, max + 1),
                     -EINVAL);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_IDLE);
    pt_expect_no_cm(&p.b, 100);
    pt_pair_close(&p);
}
END_TEST

START_TEST(unreachable_no_listener)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof(sin);
    int fd;

    /* a port that was free a moment ago and has no listener */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    close(fd);
    pt_pair_open(&p, NULL, NULL);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&sin, sizeof(sin), NULL, 0), 0);
    pt_wait_cm(&p.a, EXS_PROV_CM_UNREACHABLE, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.ea);
    ck_assert_msg(ev.status < 0, "UNREACHABLE status %d, expected a negative errno", ev.status);
    ck_assert_int_ne(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    pt_pair_close(&p);
}
END_TEST

START_TEST(send_while_connecting)
{
    struct pt_pair p;
    struct pt_buf *src;
    struct exs_prov_cm_event ev;

    pt_pair_open(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, NULL, 0), 0);
    pt_wait_cm(&p.b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    /* not accepted yet: the active ep is CONNECTING */
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTING);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), -ENOTCONN);
    ck_assert_int_eq(pt_ops->accept(ev.req, p.eb, NULL, 0), 0);
    pt_wait_cm(&p.a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, NULL);
    p.a_up = 1;
    pt_wait_cm(&p.b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, NULL);
    p.b_up = 1;
    pt_pair_close(&p);
}
END_TEST

START_TEST(recv_preposted_before_accept)
{
    /* Receives posted on both eps before the connection exists catch the first SENDs. */
    struct pt_pair p;
    struct pt_buf *ba, *bb;
    struct exs_prov_cqe c;

    pt_pair_open(&p, NULL, NULL);
    ba = pt_pair_buf(&p, 'a', 64, LW, 0x0A);
    bb = pt_pair_buf(&p, 'b', 64, LW, 0x0B);
    ck_assert_int_eq(pt_post_recv(p.ea, 1, ba, 32, 32), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 2, bb, 32, 32), 0);
    pt_pair_connect(&p);
    ck_assert_int_eq(pt_post_send(p.ea, 3, EXS_PROV_WR_SEND, SIG, ba, 0, 32, 0, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_SEND, SIG, bb, 0, 32, 0, 0, 0), 0);
    pt_expect_wr(&p.b, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 32);
    pt_expect_wr(&p.b, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_wr(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 32);
    pt_expect_wr(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert(pt_all_bytes(ba->p + 32, 32, 0x0B));
    ck_assert(pt_all_bytes(bb->p + 32, 32, 0x0A));
    pt_pair_close(&p);
}
END_TEST

START_TEST(many_connections_one_listener)
{
    /* Four connections through one listener, each with its own traffic and completions. */
    enum { N = 4 };
    struct pt_host a, b;
    struct exs_prov_listener *lis;
    struct sockaddr_storage addr;
    socklen_t alen;
    struct exs_prov_ep *ea[N], *eb[N];
    struct pt_buf *sa, *rb;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe c;
    int seen[N] = {0};

    pt_host_open(&a);
    pt_host_open(&b);
    lis = pt_listen(&b, &addr, &alen);
    sa = pt_buf_new(&a, 64 * N, LW, 0);
    rb = pt_buf_new(&b, 64 * N, LW, 0);
    for (int i = 0; i < N; i++) {
        struct exs_prov_ep_attr at = pt_default_attr();
        uint8_t pd = (uint8_t)i;

        ck_assert_int_eq(pt_ops->ep_create(a.ctx, &at, &ea[i]), 0);
        ck_assert_int_eq(pt_ops->ep_create(b.ctx, &at, &eb[i]), 0);
        ck_assert_int_eq(pt_post_recv(eb[i], 100 + i, rb, 64 * i, 64), 0);
        ck_assert_int_eq(pt_ops->connect(ea[i], (struct sockaddr *)&addr, alen, &pd, 1), 0);
    }
    /* b sees N requests and N ESTABLISHED, the latter possibly between the former */
    for (int nreq = 0, nest = 0; nreq < N || nest < N;) {
        int k;

        ck_assert_msg(pt_try_cm(&b, PT_TIMEOUT_MS, &ev),
                      "passive side: %d requests, %d "
                      "established, then nothing",
                      nreq, nest);
        if (ev.type == EXS_PROV_CM_ESTABLISHED) {
            nest++;
            continue;
        }
        ck_assert_msg(ev.type == EXS_PROV_CM_CONNECT_REQUEST, "unexpected %s",
                      exs__prov_cm_event_str(ev.type));
        ck_assert_uint_eq(ev.private_data_len, 1);
        k = ev.private_data[0];
        ck_assert(k < N && !seen[k]);
        seen[k] = 1;
        ck_assert_int_eq(pt_ops->accept(ev.req, eb[k], NULL, 0), 0);
        nreq++;
    }
    for (int i = 0; i < N; i++)
        pt_wait_cm(&a, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    for (int i = 0; i < N; i++) {
        memset(sa->p + 64 * i, 0x40 + i, 64);
        ck_assert_int_eq(
            pt_post_send(ea[i], 200 + i, EXS_PROV_WR_SEND, SIG, sa, 64 * i, 64, 0, 0, 0), 0);
    }
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < N; i++) {
        int k;

        pt_wait_cqe(&b, PT_TIMEOUT_MS, &c);
        ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
        k = (int)c.wr_id - 100;
        ck_assert(k >= 0 && k < N && !seen[k]);
        seen[k] = 1;
        ck_assert_ptr_eq(c.ep, eb[k]);
        ck_assert(pt_all_bytes(rb->p + 64 * k, 64, 0x40 + k));
    }
    for (int i = 0; i < N; i++) {
        pt_wait_cqe(&a, PT_TIMEOUT_MS, &c);
        ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
        ck_assert_ptr_eq(c.ep, ea[c.wr_id - 200]);
    }
    for (int i = 0; i < N; i++) {
        pt_ep_close(&a, ea[i]);
        pt_ep_close(&b, eb[i]);
    }
    pt_ops->listener_destroy(lis);
    pt_buf_free(sa);
    pt_buf_free(rb);
    pt_host_close(&a);
    pt_host_close(&b);
}
END_TEST

START_TEST(listener_destroy_rejects_pending)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;

    pt_pair_open(&p, NULL, NULL);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, NULL, 0), 0);
    pt_wait_cm(&p.b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    pt_ops->listener_destroy(p.lis);
    p.lis = NULL;
    ck_assert(pt_try_cm(&p.a, PT_TIMEOUT_MS, &ev));
    ck_assert_msg(ev.type == EXS_PROV_CM_REJECTED || ev.type == EXS_PROV_CM_UNREACHABLE,
                  "pending request of a destroyed listener: %s, expected rejected",
                  exs__prov_cm_event_str(ev.type));
    ck_assert_ptr_eq(ev.ep, p.ea);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_cm_suite(void)
{
    Suite *s = suite_create("prov_cm");
    TCase *tc = pt_tcase("private_data");

    tcase_add_test(tc, private_data_56_accept);
    tcase_add_test(tc, private_data_max_accept);
    tcase_add_test(tc, private_data_56_reject);
    tcase_add_test(tc, private_data_max_reject);
    tcase_add_test(tc, private_data_too_long);
    suite_add_tcase(s, tc);
    tc = pt_tcase("connect");
    tcase_add_test(tc, unreachable_no_listener);
    tcase_add_test(tc, send_while_connecting);
    tcase_add_test(tc, recv_preposted_before_accept);
    tcase_add_test(tc, many_connections_one_listener);
    tcase_add_test(tc, listener_destroy_rejects_pending);
    suite_add_tcase(s, tc);
    return s;
}
