/* SPDX-License-Identifier: MIT */
/* The fault provider's own rules at the provider door (run with -p fault:NAME; skipped
 * otherwise): held completions keep their order and are not overtaken by connection events,
 * error completions fail the ep, frozen sends keep their inline bytes, connects fail. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "exs/util/params.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define SIG EXS_PROV_SEND_SIGNALED

static int skip_unless_fault(const char *test)
{
    if (strncmp(pt_name, "fault:", 6) == 0)
        return 0;
    test_skip(test, "fault provider only; provider is %s", pt_name);
    return 1;
}

static void set(const char *name, const char *value)
{
    exs__params_load();
    ck_assert_msg(exs__params_set(name, value) == 0, "exs__params_set(%s, %s)", name, value);
}

/* Every fault tunable back to its default (also when a test failed half-way). */
static void fault_reset(void)
{
    size_t n;
    const struct exs_param_def *t = exs__params_table(&n);

    for (size_t i = 0; i < n; i++)
        if (strncmp(t[i].name, "fault_", 6) == 0)
            ck_assert_int_eq(exs__params_set(t[i].name, t[i].defval), 0);
}

#define NMSG 8

/* Every completion held 100 ms. The peer disconnects after its sends completed; the
 * DISCONNECTED at the receiver comes only after every receive completion, in order. */
START_TEST(fault_cm_waits_for_held_completions)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe c;

    if (skip_unless_fault("fault_cm_waits_for_held_completions"))
        return;
    set("fault_delay_us", "100000");
    set("fault_delay_nth", "1");
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64 * NMSG, LW, 0);
    dst = pt_pair_buf(&p, 'b', 64 * NMSG, LW, 0);
    for (int i = 0; i < NMSG; i++) {
        pt_pattern(src->p + 64 * i, 64, (uint32_t)i);
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, dst, 64 * (size_t)i, 64), 0);
    }
    for (int i = 0; i < NMSG; i++)
        ck_assert_int_eq(
            pt_post_send(p.ea, i, EXS_PROV_WR_SEND, SIG, src, 64 * (size_t)i, 64, 0, 0, 0), 0);
    for (int i = 0; i < NMSG; i++)
        pt_expect_cqe(&p.a, i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, &c);
    ck_assert_int_eq(pt_ops->disconnect(p.ea), 0);
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.eb);
    ck_assert_msg(p.b.cqe_count == NMSG, "DISCONNECTED after %u of %d receive completions",
                  p.b.cqe_count, NMSG);
    for (int i = 0; i < NMSG; i++) {
        pt_expect_cqe(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_ptr_eq(c.ep, p.eb);
        ck_assert_uint_eq(c.byte_len, 64);
        ck_assert_int_eq(pt_pattern_check(dst->p + 64 * i, 64, (uint32_t)i), -1);
    }
    pt_pair_close(&p);
}
END_TEST

/* The ep's first completion gets the injected status (each in turn of the loop); the ep
 * is then in ERROR, the next send is flushed, and the peer sees the connection end. */
START_TEST(fault_wc_fails_the_ep)
{
    int status = 1 + _i;
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe c;
    char st[16];

    if (skip_unless_fault("fault_wc_fails_the_ep"))
        return;
    snprintf(st, sizeof(st), "%d", status);
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 1);
    dst = pt_pair_buf(&p, 'b', 64, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 9, dst, 0, 64), 0);
    set("fault_wc_status", st);
    set("fault_wc_nth", "1");
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 1, (enum exs_prov_wc_status)status, PT_ANY_OPCODE, &c);
    ck_assert_ptr_eq(c.ep, p.ea);
    set("fault_wc_nth", "0");
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, &c);
    pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.eb);
    pt_pair_close(&p);
}
END_TEST

/* A frozen link sends nothing and delivers nothing; its sends keep their inline bytes
 * (copied at post time, the caller's buffer reused at once) and their order, and go out
 * when the freeze ends (online). */
START_TEST(fault_freeze_keeps_inline_bytes_and_order)
{
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;
    uint8_t stackbuf[32];
    struct exs_prov_sge sge = {.addr = (uint64_t)(uintptr_t)stackbuf, .length = 32};
    struct exs_prov_send_wr wr = {
        .wr_id = 1,
        .opcode = EXS_PROV_WR_SEND,
        .flags = SIG | EXS_PROV_SEND_INLINE,
        .sg_list = &sge,
        .num_sge = 1,
    };

    if (skip_unless_fault("fault_freeze_keeps_inline_bytes_and_order"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', 64, LW, 0);
    dst = pt_pair_buf(&p, 'b', 128, LW, 0);
    pt_pattern(src->p, 64, 2);
    ck_assert_int_eq(pt_post_recv(p.eb, 11, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 12, dst, 64, 64), 0);
    set("fault_freeze_ms", "3600000");
    set("fault_freeze_nth", "1");
    pt_pattern(stackbuf, 32, 1);
    ck_assert_int_eq(pt_ops->post_send(p.ea, &wr), 0);
    memset(stackbuf, 0x5A, sizeof(stackbuf)); /* reused at once, as inline allows */
    set("fault_freeze_nth", "0");
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_no_cqe(&p.b, 300);
    pt_expect_no_cqe(&p.a, 0);
    ck_assert(pt_all_bytes(dst->p, 128, 0));
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);

    set("fault_freeze_ms", "0"); /* thaw */
    pt_expect_cqe(&p.b, 11, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 32);
    ck_assert_int_eq(pt_pattern_check(dst->p, 32, 1), -1);
    pt_expect_cqe(&p.b, 12, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 64);
    ck_assert_int_eq(pt_pattern_check(dst->p + 64, 64, 2), -1);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, &c);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, &c);
    pt_pair_close(&p);
}
END_TEST

/* Failed connects: the first is REJECTED, the second UNREACHABLE (-ETIMEDOUT); the ep is
 * in ERROR and the listener never hears of them. */
START_TEST(fault_connect_fails)
{
    struct pt_pair p;
    struct exs_prov_cm_event ev;
    struct exs_prov_ep *e2;
    struct exs_prov_ep_attr attr = pt_default_attr();

    if (skip_unless_fault("fault_connect_fails"))
        return;
    pt_pair_open(&p, NULL, NULL);
    ck_assert_int_eq(pt_ops->ep_create(p.a.ctx, &attr, &e2), 0);
    set("fault_connect_nth", "1");
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&p.addr, p.addrlen, "hello", 5), 0);
    pt_wait_cm(&p.a, EXS_PROV_CM_REJECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.ea);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_ERROR);
    ck_assert_int_eq(pt_ops->connect(e2, (struct sockaddr *)&p.addr, p.addrlen, "hello", 5), 0);
    pt_wait_cm(&p.a, EXS_PROV_CM_UNREACHABLE, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, e2);
    ck_assert_int_eq(ev.status, -ETIMEDOUT);
    set("fault_connect_nth", "0");
    pt_expect_no_cm(&p.b, 200);
    pt_ops->ep_destroy(e2);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_fault_suite(void)
{
    Suite *s = suite_create("fault");
    TCase *tc = pt_tcase("fault");

    tcase_add_checked_fixture(tc, NULL, fault_reset);
    tcase_add_test(tc, fault_cm_waits_for_held_completions);
    tcase_add_loop_test(tc, fault_wc_fails_the_ep, 0, EXS_PROV_WC_STATUS_MAX - 1);
    tcase_add_test(tc, fault_freeze_keeps_inline_bytes_and_order);
    tcase_add_test(tc, fault_connect_fails);
    suite_add_tcase(s, tc);
    return s;
}
