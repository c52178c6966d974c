/* SPDX-License-Identifier: MIT */
/* Protocol violations named (exs/proto/violation.c, spec/protocol.md §10): the rule table,
 * the record-type decoder and walker, and the reason a connection keeps. */
#include <check.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/violation.h"
#include "exs/proto/wire_names.h"
#include "exs/util/json.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/util.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

/* Every rule has a distinct name, a description and a section, and is found by its name. */
START_TEST(pv_rule_table)
{
    ck_assert_str_eq(exs__pv_rule_name(EXS_PV_NONE), "none");
    ck_assert_str_eq(exs__pv_rule_name(EXS_PV_COUNT), "unknown");
    ck_assert_int_eq(exs__pv_rule_by_name("none"), EXS_PV_NONE);
    ck_assert_int_eq(exs__pv_rule_by_name("no-such-rule"), EXS_PV_NONE);
    for (unsigned i = 1; i < EXS_PV_COUNT; i++) {
        const char *n = exs__pv_rule_name(i);

        ck_assert_msg(n[0] && strcspn(n, " :\"") == strlen(n), "rule %u name '%s'", i, n);
        ck_assert_msg(strlen(n) <= 19, "rule %s: longer than violation.h's bound", n);
        ck_assert(exs__pv_rule_desc(i)[0]);
        ck_assert(exs__pv_rule_section(i)[0]);
        ck_assert_int_eq(exs__pv_rule_by_name(n), i);
        for (unsigned j = 1; j < i; j++)
            ck_assert_str_ne(exs__pv_rule_name(j), n);
    }
}
END_TEST

/* The decoder names every control record type of wire.h, each once; nothing else. */
START_TEST(pv_wire_type_names)
{
    static const struct {
        unsigned type;
        const char *name;
    } want[] = {
        {EXS_CTRL_ACK, "ACK"},
        {EXS_CTRL_ADVERT, "ADVERT"},
        {EXS_CTRL_ANNOUNCE, "ANNOUNCE"},
        {EXS_CTRL_READ_DONE, "READ_DONE"},
        {EXS_CTRL_SHUTDOWN, "SHUTDOWN"},
        {EXS_CTRL_NOP, "NOP"},
        {EXS_CTRL_RING, "RING"},
        {EXS_CTRL_DRAIN, "DRAIN"},
        {EXS_CTRL_TRACE, "TRACE"},
        {EXS_CTRL_RESIZE, "RESIZE"},
        {EXS_CTRL_SESSION, "SESSION"},
        {EXS_CTRL_RESUME, "RESUME"},
        {EXS_CTRL_AUTH, "AUTH"},
        {EXS_CTRL_SHM_OFFER, "SHM_OFFER"},
        {EXS_CTRL_SHM_SWITCH, "SHM_SWITCH"},
    };

    ck_assert_int_eq(EXS_ARRAY_SIZE(want), EXS_CTRL_TYPE_MAX);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(want); i++) {
        ck_assert_str_eq(exs__wire_type_name(want[i].type), want[i].name);
        ck_assert_str_eq(exs__pv_rec_name(want[i].type), want[i].name);
    }
    ck_assert_str_eq(exs__wire_type_name(0), "unknown");
    ck_assert_str_eq(exs__wire_type_name(EXS_CTRL_TYPE_MAX + 1), "unknown");
    ck_assert_str_eq(exs__wire_type_name(255), "unknown");
    ck_assert_str_eq(exs__pv_rec_name(EXS_PV_REC_NONE), "");
    ck_assert_str_eq(exs__pv_rec_name(EXS_PV_REC_WRITE), "WRITE_IMM");
    ck_assert_str_eq(exs__pv_rec_name(EXS_PV_REC_COMPLETION), "completion");
}
END_TEST

struct walk_seen {
    unsigned n, types[8], lens[8];
    unsigned stop_at; /* return 7 at this record (1-based; 0: never) */
};

static int walk_one(void *arg, const struct exs_wire_ctrl_hdr *h, const uint8_t *rec, uint32_t rlen)
{
    struct walk_seen *w = arg;

    ck_assert_uint_eq(rec[0], h->type);
    w->types[w->n] = h->type;
    w->lens[w->n] = rlen;
    return ++w->n == w->stop_at ? 7 : 0;
}

static void put_hdr(uint8_t *p, unsigned type, unsigned len)
{
    struct exs_wire_ctrl_hdr h = {.type = (uint8_t)type, .len = htobe16((uint16_t)len)};

    memcpy(p, &h, sizeof(h));
}

/* The one walker: records in order with their lengths; a malformed one stops it (-1)
 * before it is handed out; a callback's nonzero return stops it and is returned. */
START_TEST(pv_wire_walk)
{
    uint8_t buf[64] = {0};
    struct walk_seen w = {0};

    put_hdr(buf, EXS_CTRL_ACK, EXS_WIRE_ACK_LEN);
    put_hdr(buf + 16, EXS_CTRL_NOP, EXS_WIRE_NOP_LEN);
    put_hdr(buf + 24, EXS_CTRL_RING, EXS_WIRE_RING_LEN);
    ck_assert_int_eq(exs__wire_walk(buf, 40, walk_one, &w), 0);
    ck_assert_uint_eq(w.n, 3);
    ck_assert_uint_eq(w.types[0], EXS_CTRL_ACK);
    ck_assert_uint_eq(w.lens[0], EXS_WIRE_ACK_LEN);
    ck_assert_uint_eq(w.types[2], EXS_CTRL_RING);
    /* the last record cut short by the SEND: two handed out, then -1 */
    memset(&w, 0, sizeof(w));
    ck_assert_int_eq(exs__wire_walk(buf, 36, walk_one, &w), -1);
    ck_assert_uint_eq(w.n, 2);
    /* a header cut short */
    memset(&w, 0, sizeof(w));
    ck_assert_int_eq(exs__wire_walk(buf, 20, walk_one, &w), -1);
    ck_assert_uint_eq(w.n, 1);
    /* a length below the header (0 would loop forever in a naive walker) */
    put_hdr(buf + 16, EXS_CTRL_NOP, 0);
    memset(&w, 0, sizeof(w));
    ck_assert_int_eq(exs__wire_walk(buf, 40, walk_one, &w), -1);
    ck_assert_uint_eq(w.n, 1);
    /* stopped by the callback */
    put_hdr(buf + 16, EXS_CTRL_NOP, EXS_WIRE_NOP_LEN);
    memset(&w, 0, sizeof(w));
    w.stop_at = 2;
    ck_assert_int_eq(exs__wire_walk(buf, 40, walk_one, &w), 7);
    ck_assert_uint_eq(w.n, 2);
    ck_assert_int_eq(exs__wire_walk(buf, 0, walk_one, &w), 0);
}
END_TEST

static struct pt_pair pp;
static int pv_logged, pv_sunk;
static char pv_json[512];

static void pv_log_hook(const char *line, size_t len)
{
    if (memmem(line, len, "protocol violation", strlen("protocol violation")))
        pv_logged++;
}

static void pv_sink(const char *json, size_t len)
{
    pv_sunk++;
    ck_assert_uint_lt(len, sizeof(pv_json));
    memcpy(pv_json, json, len);
    pv_json[len] = '\0';
}

/* A connection's violation: -EPROTO returned; the first kept as its reason (rule, record
 * by name, detail), logged once at info level and sent once to the trace sink, later
 * ones only counted; the connection then ends with ECONNRESET like any reset. */
START_TEST(pv_recorded_once)
{
    static uint8_t rb[64];
    struct exs_pv_state st;
    struct exs_json *j;
    struct pt_op r;
    char why[EXS_ERROR_REASON_MAX];
    FILE *null = fopen("/dev/null", "w");

    unit_pair_fresh(&pp, SOCK_SEQPACKET, 0, 0);
    pt_connect(&pp);
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &st), -ENOENT);
    ck_assert_uint_eq(exs__pv_reason(pp.b.conn, why, sizeof(why)), 0);
    ck_assert_str_eq(why, "");
    pt_op_init(&r, &pp.b, EXS_OP_RECV, rb, sizeof(rb), 0);
    ck_assert_int_eq(pt_post(&r), 0);

    ck_assert_ptr_nonnull(null);
    exs__log_set_stream(null);
    exs__log_level = EXS_LOG_INFO;
    exs__log_set_hook(pv_log_hook);
    exs__pv_set_sink(pv_sink);
    pv_logged = pv_sunk = 0;
    uint64_t total = exs__pv_total();

    EXS_LITE_LOCK(&pp.b.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__proto_violation(pp.b.conn, EXS_PV_CTRL_SIZE, EXS_CTRL_ADVERT,
                                          "length %u, want %u", 48u, EXS_WIRE_ADVERT_LEN),
                     -EPROTO);
    ck_assert_int_eq(exs__proto_violation(pp.b.conn, EXS_PV_CREDITS, EXS_PV_REC_WRITE,
                                          "credits %u \"quoted\"\n", 9u),
                     -EPROTO);
    exs__conn_fail_locked(pp.b.conn, ECONNRESET, "peer broke the protocol");
    EXS_LITE_UNLOCK(&pp.b.conn->lock, EXS_LOCK_CONN);

    exs__log_set_hook(NULL);
    exs__pv_set_sink(NULL);
    exs__log_set_stream(NULL);
    exs__log_level = EXS_LOG_ERR;
    fclose(null);
    ck_assert_int_eq(pv_logged, 1);
    ck_assert_int_eq(pv_sunk, 1);
    ck_assert_uint_eq(exs__pv_total(), total + 2);

    ck_assert_pv(pp.b.conn, EXS_PV_CTRL_SIZE);
    ck_assert_int_eq(exs__pv_get(pp.b.conn, &st), 0);
    ck_assert_uint_eq(st.count, 2);
    ck_assert_uint_eq(st.rec_type, EXS_CTRL_ADVERT);
    ck_assert_str_eq(st.detail, "length 48, want 40");
    ck_assert_uint_eq(exs__pv_reason(pp.b.conn, why, sizeof(why)),
                      strlen("ctrl-size ADVERT: length 48, want 40"));
    ck_assert_str_eq(why, "ctrl-size ADVERT: length 48, want 40");
    /* cut to the caller's buffer */
    exs__pv_reason(pp.b.conn, why, 10);
    ck_assert_str_eq(why, "ctrl-size");

    /* the trace event: one JSON object naming the rule and the record */
    ck_assert_int_eq(exs__json_parse(pv_json, strlen(pv_json), &j), 0);
    ck_assert_str_eq(exs__json_get_str(j, "rule"), "ctrl-size");
    ck_assert_str_eq(exs__json_get_str(j, "record"), "ADVERT");
    ck_assert_str_eq(exs__json_get_str(j, "detail"), "length 48, want 40");
    ck_assert_uint_eq(exs__json_get_u64(j, "count"), 1);
    ck_assert(exs__json_get_str(j, "conn")[0]);
    exs__json_free(j);

    /* the application still sees the reset as before */
    pt_run(&pp);
    ck_assert_int_eq(r.done, 1);
    ck_assert_int_eq(r.op.result, -1);
    ck_assert_int_eq(r.op.err, ECONNRESET);
    pt_op_fini(&r);
    /* the peer that did nothing wrong has no violation */
    ck_assert_int_eq(exs__pv_get(pp.a.conn, &st), -ENOENT);
    pt_close_both(&pp);
}
END_TEST

/* A detail that would break a log line or a JSON string is made printable, and a long
 * one is cut, so the reason always fits EXS_ERROR_REASON_MAX. */
START_TEST(pv_detail_cleaned)
{
    struct exs_pv_state st;
    char why[EXS_ERROR_REASON_MAX + 64], longd[300];

    unit_pair_fresh(&pp, SOCK_STREAM, 0, 0);
    pt_connect(&pp);
    memset(longd, 'x', sizeof(longd) - 1);
    longd[sizeof(longd) - 1] = '\0';
    EXS_LITE_LOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    exs__proto_violation(pp.a.conn, EXS_PV_REANNOUNCE, EXS_CTRL_ANNOUNCE, "a\"b\\c\n%s", longd);
    exs__conn_fail_locked(pp.a.conn, ECONNRESET, "peer broke the protocol");
    EXS_LITE_UNLOCK(&pp.a.conn->lock, EXS_LOCK_CONN);
    ck_assert_int_eq(exs__pv_get(pp.a.conn, &st), 0);
    ck_assert_int_eq(strncmp(st.detail, "a?b?c?xxx", 9), 0);
    ck_assert_uint_eq(strlen(st.detail), EXS_PV_DETAIL_MAX - 1);
    ck_assert_uint_lt(exs__pv_reason(pp.a.conn, why, sizeof(why)), EXS_ERROR_REASON_MAX);
    ck_assert_ptr_null(strchr(why, '\n'));
    pt_run(&pp);
    pt_close_both(&pp);
}
END_TEST

Suite *proto_violation_suite(void)
{
    Suite *s = suite_create("proto_violation");
    TCase *tc = tcase_create("violation");

    tcase_add_test(tc, pv_rule_table);
    tcase_add_test(tc, pv_wire_type_names);
    tcase_add_test(tc, pv_wire_walk);
    tcase_add_test(tc, pv_recorded_once);
    tcase_add_test(tc, pv_detail_cleaned);
    suite_add_tcase(s, tc);
    return s;
}
