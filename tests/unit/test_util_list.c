/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/util/list.h: insertion, removal, pop, iteration, container_of. */
#include <stdlib.h>

#include "exs/util/list.h"
#include "tests/unit/unit.h"

struct item {
    int v;
    struct exs_list link;
};

/* The values of the list, front to back, as digits ("" when empty); checks the links
 * both ways. */
static const char *values(struct exs_list *h)
{
    static char buf[32];
    size_t n = 0;
    struct exs_list *pos;

    exs_list_for_each(pos, h)
    {
        ck_assert_ptr_eq(pos->next->prev, pos);
        ck_assert_ptr_eq(pos->prev->next, pos);
        ck_assert_uint_lt(n, sizeof(buf) - 1);
        buf[n++] = (char)('0' + exs_list_entry(pos, struct item, link)->v);
    }
    ck_assert_ptr_eq(h->next->prev, h);
    ck_assert_ptr_eq(h->prev->next, h);
    buf[n] = '\0';
    return buf;
}

START_TEST(test_init_empty)
{
    struct exs_list h = EXS_LIST_INIT(h), h2;

    ck_assert(exs_list_empty(&h));
    ck_assert_ptr_eq(h.next, &h);
    ck_assert_ptr_eq(h.prev, &h);
    exs_list_init(&h2);
    ck_assert(exs_list_empty(&h2));
    ck_assert_ptr_null(exs_list_pop_head(&h2));
    ck_assert_str_eq(values(&h), "");
}
END_TEST

START_TEST(test_add)
{
    struct exs_list h;
    struct item it[5] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}, {.v = 4}};

    exs_list_init(&h);
    exs_list_add_tail(&h, &it[1].link);
    ck_assert(!exs_list_empty(&h));
    exs_list_add_tail(&h, &it[2].link);
    exs_list_add_head(&h, &it[0].link);
    ck_assert_str_eq(values(&h), "012");
    exs_list_insert_after(&it[2].link, &it[4].link);
    exs_list_insert_after(&it[2].link, &it[3].link);
    ck_assert_str_eq(values(&h), "01234");
    ck_assert_ptr_eq(h.prev, &it[4].link);
}
END_TEST

START_TEST(test_del_pop)
{
    struct exs_list h;
    struct item it[4] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}};
    struct exs_list *n;

    exs_list_init(&h);
    for (int i = 0; i < 4; i++)
        exs_list_add_tail(&h, &it[i].link);
    exs_list_del(&it[2].link);
    ck_assert_str_eq(values(&h), "013");
    /* A deleted node points at itself (so deleting it again is harmless). */
    ck_assert(exs_list_empty(&it[2].link));
    exs_list_del(&it[2].link);
    ck_assert_str_eq(values(&h), "013");
    exs_list_del(&it[0].link);
    ck_assert_str_eq(values(&h), "13");
    exs_list_del(&it[3].link);
    ck_assert_str_eq(values(&h), "1");
    exs_list_add_tail(&h, &it[0].link);
    n = exs_list_pop_head(&h);
    ck_assert_ptr_eq(n, &it[1].link);
    ck_assert_int_eq(exs_list_entry(n, struct item, link)->v, 1);
    ck_assert(exs_list_empty(n));
    ck_assert_ptr_eq(exs_list_pop_head(&h), &it[0].link);
    ck_assert(exs_list_empty(&h));
    ck_assert_ptr_null(exs_list_pop_head(&h));
}
END_TEST

START_TEST(test_for_each_safe)
{
    struct exs_list h, *pos, *tmp;
    struct item *it = calloc(8, sizeof(*it));
    int count = 0;

    ck_assert_ptr_nonnull(it);
    exs_list_init(&h);
    for (int i = 0; i < 8; i++) {
        it[i].v = i;
        exs_list_add_tail(&h, &it[i].link);
    }
    /* Delete the odd ones while walking. */
    exs_list_for_each_safe(pos, tmp, &h)
    {
        struct item *x = exs_list_entry(pos, struct item, link);

        count++;
        if (x->v % 2)
            exs_list_del(pos);
    }
    ck_assert_int_eq(count, 8);
    ck_assert_str_eq(values(&h), "0246");
    /* Empty everything while walking. */
    exs_list_for_each_safe(pos, tmp, &h) exs_list_del(pos);
    ck_assert(exs_list_empty(&h));
    free(it);
}
END_TEST

START_TEST(test_container_of)
{
    struct item it = {.v = 7};

    ck_assert_ptr_eq(exs_container_of(&it.link, struct item, link), &it);
    ck_assert_ptr_eq(exs_list_entry(&it.link, struct item, link), &it);
    ck_assert_ptr_eq(exs_container_of(&it.v, struct item, v), &it);
}
END_TEST

Suite *util_list_suite(void)
{
    Suite *s = suite_create("util_list");
    TCase *tc = tcase_create("list");

    tcase_add_test(tc, test_init_empty);
    tcase_add_test(tc, test_add);
    tcase_add_test(tc, test_del_pop);
    tcase_add_test(tc, test_for_each_safe);
    tcase_add_test(tc, test_container_of);
    suite_add_tcase(s, tc);
    return s;
}
