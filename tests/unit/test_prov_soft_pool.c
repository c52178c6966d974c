/* SPDX-License-Identifier: MIT */
/* The block pool of the software providers' work requests (exs/prov/soft/soft_wr.h). */
#include <check.h>
#include <stdlib.h>

#include "exs/prov/soft/soft_wr.h"
#include "tests/unit/unit.h"

/* Blocks come back last in, first out; the pool keeps at most max (a block given back to
 * a full pool is freed: LeakSanitizer would see one lost), and fini frees what it holds. */
START_TEST(pool_reuse_and_cap)
{
    struct exs_soft_pool p;
    void *b[3];

    exs__soft_pool_init(&p, 48, 2);
    ck_assert_uint_eq(p.size, 48);
    ck_assert_ptr_null(exs__soft_pool_get_locked(&p));
    for (int i = 0; i < 3; i++) {
        b[i] = malloc(p.size);
        ck_assert_ptr_nonnull(b[i]);
    }
    exs__soft_pool_put_locked(&p, b[0]);
    exs__soft_pool_put_locked(&p, b[1]);
    ck_assert_uint_eq(p.n, 2);
    exs__soft_pool_put_locked(&p, b[2]); /* full: freed */
    ck_assert_uint_eq(p.n, 2);
    ck_assert_ptr_eq(exs__soft_pool_get_locked(&p), b[1]);
    ck_assert_uint_eq(p.n, 1);
    exs__soft_pool_put_locked(&p, b[1]);
    ck_assert_ptr_eq(exs__soft_pool_get_locked(&p), b[1]);
    ck_assert_ptr_eq(exs__soft_pool_get_locked(&p), b[0]);
    ck_assert_ptr_null(exs__soft_pool_get_locked(&p));
    ck_assert_uint_eq(p.n, 0);
    exs__soft_pool_put_locked(&p, b[0]);
    exs__soft_pool_put_locked(&p, b[1]);
    exs__soft_pool_fini(&p);
    ck_assert_uint_eq(p.n, 0);
    ck_assert_ptr_null(p.head);
    /* a block holds at least the link to the next one */
    exs__soft_pool_init(&p, 1, 4);
    ck_assert_uint_ge(p.size, sizeof(void *));
}
END_TEST

Suite *prov_soft_pool_suite(void)
{
    Suite *s = suite_create("prov_soft_pool");
    TCase *tc = tcase_create("pool");

    tcase_add_test(tc, pool_reuse_and_cap);
    suite_add_tcase(s, tc);
    return s;
}
