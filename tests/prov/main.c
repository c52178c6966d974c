/* SPDX-License-Identifier: MIT */
/* The provider conformance test runner: exs_prov_test [-p PROVIDER] runs every suite. */
#include <check.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"

static Suite *(*const suites[])(void) = {
    prov_basic_suite,     prov_order_suite,    prov_rnr_suite,     prov_access_suite,
    prov_read_suite,      prov_flush_suite,    prov_cm_suite,      prov_emu_suite,
    prov_hostile_suite,   prov_mem_suite,      prov_select_suite,  prov_grant_suite,
    prov_req_suite,       prov_cq_suite,       prov_limits_suite,  prov_keep_suite,
    prov_progress_suite,  prov_fault_suite,    prov_lowat_suite,   prov_close_suite,
    prov_shm_suite,       prov_defer_suite,    prov_rq_suite,      prov_attack26_suite,
    prov_attack26b_suite, prov_attack27_suite, prov_keymemo_suite, prov_fence28_suite,
    prov_gone_suite, /* last: removes the device */
};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [-p PROVIDER] [--manual]\n"
            "  -p PROVIDER  provider to test (default: $EXS_PROVIDER, else tcp)\n"
            "  --manual     open every ctx with EXS_PROV_ATTR_MANUAL_PROGRESS, each driven\n"
            "               by a driver thread and by the waiting test thread\n"
            "Check's CK_RUN_SUITE, CK_RUN_CASE, CK_FORK and CK_TIMEOUT_MULTIPLIER apply.\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *env = getenv("EXS_PROVIDER");
    SRunner *sr = NULL;
    static const struct option longopts[] = {
        {"manual", no_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt, failed;

    if (env && env[0])
        pt_name = env;
    while ((opt = getopt_long(argc, argv, "p:mh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'p':
            pt_name = optarg;
            break;
        case 'm':
            pt_manual = 1;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    pt_ops = exs__prov_find(pt_name);
    if (!pt_ops) {
        fprintf(stderr, "%s: unknown provider '%s'\n", argv[0], pt_name);
        return 2;
    }
    printf("provider conformance tests: provider %s%s\n", pt_name,
           pt_manual ? ", manual progress" : "");
    fflush(stdout);

    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++) {
        if (!sr)
            sr = srunner_create(suites[i]());
        else
            srunner_add_suite(sr, suites[i]());
    }
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
