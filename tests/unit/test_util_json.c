/* SPDX-License-Identifier: MIT */
/* Unit tests of the JSON writer and reader used by the control endpoint and exsctl. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/json.h"
#include "tests/unit/unit.h"

/* Writer output parses back to the same values, escapes included. */
START_TEST(test_roundtrip)
{
    struct exs_jbuf b;
    struct exs_json *j;
    const struct exs_json *arr;
    int n = 0;

    exs__jbuf_init(&b, 4096);
    exs__jbuf_obj_begin(&b);
    exs__jbuf_kv_str(&b, "s", "a\"b\\c\nd\x01");
    exs__jbuf_kv_u64(&b, "u", 18446744073709551615ull);
    exs__jbuf_key(&b, "arr");
    exs__jbuf_arr_begin(&b);
    exs__jbuf_u64(&b, 1);
    exs__jbuf_obj_begin(&b);
    exs__jbuf_key(&b, "t");
    exs__jbuf_bool(&b, 1);
    exs__jbuf_obj_end(&b);
    exs__jbuf_i64(&b, -5);
    exs__jbuf_arr_end(&b);
    exs__jbuf_obj_end(&b);
    ck_assert_int_eq(b.overflow, 0);
    ck_assert_str_eq(b.p, "{\"s\":\"a\\\"b\\\\c\\nd\\u0001\",\"u\":18446744073709551615,"
                          "\"arr\":[1,{\"t\":true},-5]}");
    ck_assert_int_eq(exs__json_parse(b.p, b.len, &j), 0);
    ck_assert_str_eq(exs__json_get_str(j, "s"), "a\"b\\c\nd\x01");
    ck_assert_uint_eq(exs__json_get_u64(j, "u"), 18446744073709551615ull);
    arr = exs__json_get(j, "arr");
    ck_assert_ptr_nonnull(arr);
    for (const struct exs_json *e = arr->child; e; e = e->next)
        n++;
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(exs__json_get_bool(arr->child->next, "t"), 1);
    ck_assert_str_eq(exs__json_get_str(j, "missing"), "");
    exs__json_free(j);
    exs__jbuf_free(&b);
}
END_TEST

/* The limit: output past max is dropped and flagged, never written beyond. */
START_TEST(test_writer_bound)
{
    struct exs_jbuf b;

    exs__jbuf_init(&b, 16);
    exs__jbuf_obj_begin(&b);
    exs__jbuf_kv_str(&b, "key", "a long value that does not fit");
    ck_assert_int_eq(b.overflow, 1);
    ck_assert_uint_le(b.len, 16);
    exs__jbuf_free(&b);
}
END_TEST

/* Hostile input: every malformed text is refused, deep nesting too. */
START_TEST(test_reader_rejects)
{
    static const char *const bad[] = {
        "",      "{",      "}",          "[1,]",        "{\"a\"}",     "{\"a\":}",
        "{a:1}", "\"open", "\"bad\\q\"", "\"\\u00\"",   "\"\\u0000\"", "tru",
        "nul",   "1 2",    "{\"a\":1}x", "\"ctl\x01\"", "[\"\\",
    };
    struct exs_json *j;
    char deep[200];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(exs__json_parse(bad[i], strlen(bad[i]), &j) == -EINVAL, "accepted: %s",
                      bad[i]);
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    ck_assert_int_eq(exs__json_parse(deep, sizeof(deep), &j), -EINVAL);
    ck_assert_int_eq(exs__json_parse(deep + 100 - 10, 20, &j), 0);
    exs__json_free(j);
    ck_assert_int_eq(exs__json_parse(" {\"a\" : [ ] , \"b\":null}\n", 24, &j), 0);
    ck_assert_ptr_nonnull(exs__json_get(j, "b"));
    exs__json_free(j);
}
END_TEST

Suite *util_json_suite(void)
{
    Suite *s = suite_create("util_json");
    TCase *tc = tcase_create("json");

    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_writer_bound);
    tcase_add_test(tc, test_reader_rejects);
    suite_add_tcase(s, tc);
    return s;
}
