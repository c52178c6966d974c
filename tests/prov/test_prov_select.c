/* SPDX-License-Identifier: MIT */
/* Device and port selection of the verbs provider: by name (EXS_VRB_DEVICE, NAME or
 * NAME:PORT, or the context attribute) and by address (EXS_VRB_ADDR). Verbs only. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/params.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

static int skip_unless_verbs(const char *test)
{
    if (strcmp(pt_ops->name, "verbs") == 0)
        return 0;
    test_skip(test, "verbs device selection; provider is %s", pt_ops->name);
    return 1;
}

/* The first RDMA device the kernel lists. */
static void first_device(char *name, size_t len)
{
    DIR *d = opendir("/sys/class/infiniband");
    struct dirent *de;

    name[0] = 0;
    ck_assert_msg(d != NULL, "no /sys/class/infiniband on the verbs provider");
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] != '.') {
            snprintf(name, len, "%s", de->d_name);
            break;
        }
    }
    closedir(d);
    ck_assert_msg(name[0], "no RDMA device in /sys/class/infiniband");
}

/* ctx_open with the environment variable env set to value (the tunables read afresh): its
 * return code (the ctx is closed again). */
static int open_with(const char *env, const char *value, const char *attr_device)
{
    struct exs_prov_attr attr = {.device = attr_device};
    struct exs_prov_ctx *ctx = NULL;
    int ret;

    ck_assert_int_eq(setenv(env, value, 1), 0);
    exs__params_reset();
    ret = pt_ops->ctx_open(&attr, &ctx);
    if (ret == 0)
        pt_ops->ctx_close(ctx);
    ck_assert_int_eq(unsetenv(env), 0);
    exs__params_reset();
    return ret;
}

START_TEST(select_by_name)
{
    char dev[256], spec[300];

    if (skip_unless_verbs("select_by_name"))
        return;
    first_device(dev, sizeof(dev));
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", dev, NULL), 0);
    snprintf(spec, sizeof(spec), "%s:1", dev);
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", spec, NULL), 0);
    snprintf(spec, sizeof(spec), "%s:9", dev); /* no such port */
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", spec, NULL), -ENODEV);
    snprintf(spec, sizeof(spec), "%s:x", dev);
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", spec, NULL), -EINVAL);
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", "nosuch_dev0", NULL), -ENODEV);
    /* the context attribute wins over the tunable */
    ck_assert_int_eq(open_with("EXS_VRB_DEVICE", "nosuch_dev0", dev), 0);
}
END_TEST

START_TEST(select_by_address)
{
    const char *addr = getenv("EXS_TEST_ADDR");
    char dev[256], spec[300];

    if (skip_unless_verbs("select_by_address"))
        return;
    first_device(dev, sizeof(dev));
    /* TEST-NET-1: no device holds it */
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", "192.0.2.1", NULL), -EADDRNOTAVAIL);
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", "not-an-address", NULL), -EINVAL);
    /* loopback names no device: the first active one */
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", "127.0.0.1", NULL), 0);
    if (!addr || !addr[0]) {
        printf("select_by_address: EXS_TEST_ADDR unset, the device's own address not tried\n");
        return;
    }
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", addr, NULL), 0);
    /* the address and a device name that disagree */
    ck_assert_int_eq(setenv("EXS_VRB_DEVICE", "nosuch_dev0", 1), 0);
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", addr, NULL), -ENODEV);
    snprintf(spec, sizeof(spec), "%s:1", dev);
    ck_assert_int_eq(setenv("EXS_VRB_DEVICE", spec, 1), 0);
    ck_assert_int_eq(open_with("EXS_VRB_ADDR", addr, NULL), 0);
    ck_assert_int_eq(unsetenv("EXS_VRB_DEVICE"), 0);
}
END_TEST

Suite *prov_select_suite(void)
{
    Suite *s = suite_create("prov_select");
    TCase *tc = tcase_create("select");

    tcase_set_timeout(tc, PT_TEST_TIMEOUT);
    tcase_add_test(tc, select_by_name);
    tcase_add_test(tc, select_by_address);
    suite_add_tcase(s, tc);
    return s;
}
