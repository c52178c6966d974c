/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/util/counters.c: registry, values, lookup, printing, concurrency. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/counters.h"
#include "tests/unit/unit.h"

struct owner {
    uint64_t rx;
    int not_a_counter;
    uint64_t tx;
    uint64_t drops;
};

static const struct exs_counter_desc owner_desc[] = {
    EXS_COUNTER(struct owner, rx, "frames received"),
    EXS_COUNTER(struct owner, tx, "frames sent"),
    EXS_COUNTER(struct owner, drops, "frames dropped"),
};

static void set_init(struct exs_counter_set *set, const char *name, const struct owner *o)
{
    memset(set, 0, sizeof(*set));
    set->name = name;
    set->desc = owner_desc;
    set->count = 3;
    set->base = o;
}

static char *print_to_string(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    ck_assert_ptr_nonnull(f);
    exs__counters_print(f);
    fclose(f);
    return text;
}

START_TEST(test_value)
{
    struct owner o = {.rx = 1, .not_a_counter = -1, .tx = 2, .drops = 3};
    struct exs_counter_set set;

    set_init(&set, "t.value", &o);
    ck_assert_str_eq(owner_desc[1].name, "tx");
    ck_assert_uint_eq(owner_desc[1].offset, offsetof(struct owner, tx));
    ck_assert_uint_eq(exs__counters_value(&set, 0), 1);
    ck_assert_uint_eq(exs__counters_value(&set, 1), 2);
    ck_assert_uint_eq(exs__counters_value(&set, 2), 3);
    EXS_CNT_INC(o.tx);
    EXS_CNT_ADD(o.drops, 40);
    ck_assert_uint_eq(EXS_CNT_GET(o.tx), 3);
    ck_assert_uint_eq(exs__counters_value(&set, 1), 3);
    ck_assert_uint_eq(exs__counters_value(&set, 2), 43);
}
END_TEST

START_TEST(test_register_lookup)
{
    struct owner a = {.rx = 5, .tx = 6, .drops = 7};
    struct owner b = {.rx = 50, .tx = 60, .drops = 70};
    struct owner c = {.rx = 500};
    struct exs_counter_set sa, sb, sc;
    uint64_t v = 99;

    set_init(&sa, "t.dup", &a);
    set_init(&sb, "t.dup", &b);
    set_init(&sc, "t.other", &c);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "rx", &v), -ENOENT);
    exs__counters_register(&sa);
    exs__counters_register(&sb);
    exs__counters_register(&sc);
    /* Sets of one name add up. */
    ck_assert_int_eq(exs__counters_lookup("t.dup", "rx", &v), 0);
    ck_assert_uint_eq(v, 55);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "drops", &v), 0);
    ck_assert_uint_eq(v, 77);
    ck_assert_int_eq(exs__counters_lookup("t.other", "rx", &v), 0);
    ck_assert_uint_eq(v, 500);
    EXS_CNT_INC(a.rx);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "rx", &v), 0);
    ck_assert_uint_eq(v, 56);
    v = 99;
    ck_assert_int_eq(exs__counters_lookup("t.dup", "nope", &v), -ENOENT);
    ck_assert_int_eq(exs__counters_lookup("t.nope", "rx", &v), -ENOENT);
    ck_assert_int_eq(exs__counters_lookup("t.du", "rx", &v), -ENOENT);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "not_a_counter", &v), -ENOENT);
    ck_assert_uint_eq(v, 99);
    /* Remove the first: the second of that name is what is left. */
    exs__counters_unregister(&sa);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "rx", &v), 0);
    ck_assert_uint_eq(v, 50);
    exs__counters_unregister(&sa); /* twice: harmless */
    exs__counters_unregister(&sb);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "rx", &v), -ENOENT);
    ck_assert_int_eq(exs__counters_lookup("t.other", "rx", &v), 0);
    exs__counters_unregister(&sc);
    ck_assert_int_eq(exs__counters_lookup("t.other", "rx", &v), -ENOENT);
    /* Re-registering after unregistering works. */
    exs__counters_register(&sa);
    ck_assert_int_eq(exs__counters_lookup("t.dup", "tx", &v), 0);
    ck_assert_uint_eq(v, 6);
    exs__counters_unregister(&sa);
}
END_TEST

START_TEST(test_print)
{
    struct owner a = {.rx = 1, .tx = 2, .drops = 3};
    struct owner b = {.rx = 10, .tx = 20, .drops = 30};
    struct exs_counter_set sa, sb;
    char *text;

    set_init(&sa, "t.a", &a);
    set_init(&sb, "t.b", &b);
    text = print_to_string();
    ck_assert_str_eq(text, "");
    free(text);
    exs__counters_register(&sa);
    exs__counters_register(&sb);
    EXS_CNT_ADD(b.drops, 12);
    text = print_to_string();
    ck_assert_str_eq(text, "t.a rx 1\nt.a tx 2\nt.a drops 3\n"
                           "t.b rx 10\nt.b tx 20\nt.b drops 42\n");
    free(text);
    exs__counters_unregister(&sa);
    text = print_to_string();
    ck_assert_str_eq(text, "t.b rx 10\nt.b tx 20\nt.b drops 42\n");
    free(text);
    exs__counters_unregister(&sb);
    text = print_to_string();
    ck_assert_str_eq(text, "");
    free(text);
}
END_TEST

#define CNT_THREADS 4
#define CNT_ITERS   20000

static struct owner shared_owner;

static void *cnt_thread(void *arg)
{
    struct owner mine = {0};
    struct exs_counter_set set;

    (void)arg;
    set_init(&set, "t.thread", &mine);
    for (int i = 0; i < CNT_ITERS; i++) {
        EXS_CNT_INC(shared_owner.rx);
        if (i % 100 == 0) {
            exs__counters_register(&set);
            EXS_CNT_INC(mine.tx);
            exs__counters_unregister(&set);
        }
    }
    return NULL;
}

START_TEST(test_threads)
{
    pthread_t th[CNT_THREADS];
    struct exs_counter_set set;
    uint64_t v;
    FILE *null = fopen("/dev/null", "w");

    ck_assert_ptr_nonnull(null);
    set_init(&set, "t.shared", &shared_owner);
    exs__counters_register(&set);
    for (int i = 0; i < CNT_THREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, cnt_thread, NULL), 0);
    for (int i = 0; i < 200; i++) {
        exs__counters_print(null);
        exs__counters_lookup("t.thread", "tx", &v);
    }
    for (int i = 0; i < CNT_THREADS; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(exs__counters_lookup("t.shared", "rx", &v), 0);
    ck_assert_uint_eq(v, (uint64_t)CNT_THREADS * CNT_ITERS);
    ck_assert_int_eq(exs__counters_lookup("t.thread", "tx", &v), -ENOENT);
    exs__counters_unregister(&set);
    fclose(null);
}
END_TEST

/* Shards (exs__counters_part_add): a set's counts kept per owner add to the set wherever
 * it is read (lookup, print), the shards never listed on their own; a shard taken out
 * folds its counts into the set's own fields, so the total does not go back; taking it
 * out twice folds once. Seen failing with the shards left out of the value (lookup 5 for
 * 555) and with the fold left out (555 -> 5 after part_del). */
START_TEST(test_parts)
{
    struct owner total = {.rx = 5, .tx = 1};
    struct owner p1 = {.rx = 50}, p2 = {.rx = 500, .drops = 2};
    struct exs_counter_set st, s1, s2;
    uint64_t v = 0;
    char *text;

    set_init(&st, "t.parts", &total);
    set_init(&s1, "t.parts", &p1);
    set_init(&s2, "t.parts", &p2);
    exs__counters_register(&st);
    exs__counters_part_add(&st, &s1);
    exs__counters_part_add(&st, &s2);
    ck_assert_int_eq(exs__counters_lookup("t.parts", "rx", &v), 0);
    ck_assert_uint_eq(v, 555);
    EXS_CNT_INC_1W(p1.tx);
    EXS_CNT_INC_1W(p2.tx);
    ck_assert_int_eq(exs__counters_lookup("t.parts", "tx", &v), 0);
    ck_assert_uint_eq(v, 3);
    text = print_to_string();
    ck_assert_str_eq(text, "t.parts rx 555\nt.parts tx 3\nt.parts drops 2\n");
    free(text);
    exs__counters_part_del(&s2, &total);
    exs__counters_part_del(&s2, &total); /* twice: folded once */
    ck_assert_uint_eq(total.rx, 505);
    ck_assert_uint_eq(total.drops, 2);
    ck_assert_int_eq(exs__counters_lookup("t.parts", "rx", &v), 0);
    ck_assert_uint_eq(v, 555);
    exs__counters_part_del(&s1, &total);
    ck_assert_int_eq(exs__counters_lookup("t.parts", "rx", &v), 0);
    ck_assert_uint_eq(v, 555);
    ck_assert_int_eq(exs__counters_lookup("t.parts", "tx", &v), 0);
    ck_assert_uint_eq(v, 3);
    exs__counters_unregister(&st);
}
END_TEST

Suite *util_counters_suite(void)
{
    Suite *s = suite_create("util_counters");
    TCase *tc = tcase_create("counters");

    tcase_add_test(tc, test_value);
    tcase_add_test(tc, test_register_lookup);
    tcase_add_test(tc, test_print);
    tcase_add_test(tc, test_parts);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(s, tc);
    return s;
}
