/* SPDX-License-Identifier: MIT */
/* Connection request lifetime: a request whose peer resets stays valid until the consumer answers
 * it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"

/* A raw client sends a complete CONN_REQ, then resets the connection (SO_LINGER 0). */
static int raw_req_then_reset(struct pt_pair *p)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN + 4, 0, 0, 0, 0);
    struct tcp_wire_conn cb = {.rnr_retry = 7, .rnr_timer_ms = 0};
    uint8_t buf[TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN + 4];
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    int fd = pt_raw_connect(p);

    memcpy(buf, &h, sizeof(h));
    memcpy(buf + TCP_WIRE_HDR_LEN, &cb, sizeof(cb));
    memcpy(buf + TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN, "RST!", 4);
    ck_assert_int_eq(pt_raw_send(fd, buf, sizeof(buf)), 0);
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    return fd;
}

/* The request of a peer that reset: accept fails -ECONNRESET (or, when the provider has
 * not seen the reset yet, succeeds and the ep ends at once); reject frees it either way. */
START_TEST(req_peer_reset_then_answer)
{
    enum { N = 40 };
    struct pt_pair p;
    int accepted = 0, refused = 0, rejected = 0;

    if (pt_skip_unless_tcp("req_peer_reset_then_answer"))
        return;
    pt_pair_open(&p, NULL, NULL);
    for (int i = 0; i < N; i++) {
        struct exs_prov_cm_event ev;
        int fd = raw_req_then_reset(&p), rc;

        if (!pt_try_cm(&p.b, PT_TIMEOUT_MS, &ev)) {
            close(fd);
            ck_abort_msg("round %d: no CONNECT_REQUEST", i);
        }
        ck_assert_int_eq(ev.type, EXS_PROV_CM_CONNECT_REQUEST);
        ck_assert_uint_eq(ev.private_data_len, 4);
        close(fd);       /* RST while the request is the consumer's */
        pt_sleep_ms(20); /* let the provider see the reset (either outcome is checked) */
        if (i % 2) {
            ck_assert_int_eq(pt_ops->reject(ev.req, NULL, 0), 0);
            rejected++;
            continue;
        }
        rc = pt_ops->accept(ev.req, p.eb, NULL, 0);
        if (rc == 0) {
            struct exs_prov_cm_event e2;

            /* accepted before the reset was seen: the connection ends at once (it may
             * first be reported established, as the accept's answer left before the
             * reset was read) */
            accepted++;
            ck_assert_msg(pt_try_cm(&p.b, PT_TIMEOUT_MS, &e2), "round %d: no cm event", i);
            if (e2.type == EXS_PROV_CM_ESTABLISHED) {
                ck_assert_ptr_eq(e2.ep, p.eb);
                pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &e2);
            }
            ck_assert_int_eq(e2.type, EXS_PROV_CM_DISCONNECTED);
            ck_assert_ptr_eq(e2.ep, p.eb);
            pt_ep_close(&p.b, p.eb);
            {
                struct exs_prov_ep_attr at = pt_default_attr();

                ck_assert_int_eq(pt_ops->ep_create(p.b.ctx, &at, &p.eb), 0);
            }
        } else {
            /* as a consumer does: the request is still its own, reject frees it */
            int rej = pt_ops->reject(ev.req, NULL, 0);

            ck_assert_msg(rc == -ECONNRESET, "accept of a reset request: %d, expected %d", rc,
                          -ECONNRESET);
            ck_assert_int_eq(rej, 0);
            ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_IDLE);
            refused++;
        }
    }
    printf("req_peer_reset_then_answer: %d accepted, %d refused -ECONNRESET, %d rejected\n",
           accepted, refused, rejected);
    ck_assert_msg(refused > 0, "no accept ever saw a reset request");
    /* the listener and the ep still serve a normal connection */
    pt_pair_connect(&p);
    pt_pair_close(&p);
}
END_TEST

/* listener_destroy with a delivered, unanswered request: the request is rejected (the
 * active side sees REJECTED) and nothing leaks (ASan). */
START_TEST(req_listener_destroy_unanswered)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;

    pt_pair_open(&p, NULL, NULL);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, NULL, 0), 0);
    pt_wait_cm(&p.b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    pt_ops->listener_destroy(p.lis);
    p.lis = NULL;
    pt_wait_cm(&p.a, EXS_PROV_CM_REJECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.ea);
    pt_pair_close(&p);
}
END_TEST

/* listener_destroy with delivered requests whose peers reset, unanswered: freed, no
 * leak, no use after free (ASan). */
START_TEST(req_listener_destroy_reset_unanswered)
{
    struct pt_pair p;
    int fds[4];

    if (pt_skip_unless_tcp("req_listener_destroy_reset_unanswered"))
        return;
    pt_pair_open(&p, NULL, NULL);
    for (int i = 0; i < 4; i++) {
        struct exs_prov_cm_event ev;

        fds[i] = raw_req_then_reset(&p);
        pt_wait_cm(&p.b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
        if (i % 2)
            close(fds[i]); /* reset: the request is marked, still the consumer's */
    }
    pt_sleep_ms(20);
    pt_ops->listener_destroy(p.lis);
    p.lis = NULL;
    for (int i = 0; i < 4; i += 2)
        ck_assert_msg(pt_raw_closed_within(fds[i], PT_TIMEOUT_MS),
                      "request %d: the provider kept the socket", i);
    for (int i = 0; i < 4; i += 2)
        close(fds[i]);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_req_suite(void)
{
    Suite *s = suite_create("prov_req");
    TCase *tc = pt_tcase("lifetime");

    tcase_add_test(tc, req_peer_reset_then_answer);
    tcase_add_test(tc, req_listener_destroy_unanswered);
    tcase_add_test(tc, req_listener_destroy_reset_unanswered);
    suite_add_tcase(s, tc);
    return s;
}
