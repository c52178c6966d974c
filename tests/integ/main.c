/* SPDX-License-Identifier: MIT */
/* The ES-API integration test runner: exs_integ_test [-p PROVIDER] runs every suite. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integ/integ.h"

static Suite *(*const suites[])(void) = {
    integ_seqpacket_suite,   integ_errors_suite,   integ_qdequeue_suite,  integ_sync_suite,
    integ_lifecycle_suite,   integ_robust_suite,   integ_stream_suite,    integ_hello_suite,
    integ_grant_suite,       integ_progress_suite, integ_keepalive_suite, integ_fault_suite,
    integ_fallback_suite,    integ_ctl_suite,      integ_trace_suite,     integ_kfd_suite,
    integ_kfdcache_suite,    integ_unh_suite,      integ_poll_suite,      integ_ring_suite,
    integ_msg_suite,         integ_window_suite,   integ_sndbuf_suite,    integ_resume_suite,
    integ_resume_ring_suite, integ_handoff_suite,  integ_fragread_suite,  integ_backlog_suite,
    integ_pv_suite,          integ_fork_suite,     integ_shm_suite,       integ_unsig_suite,
    integ_attack_suite,      integ_cancel_suite,   integ_attack2_suite,   integ_attack26_suite,
    integ_hz27_suite,        integ_attack27_suite,
};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [-p PROVIDER]\n"
            "  -p PROVIDER  provider to test, exported as EXS_PROVIDER (default: tcp)\n"
            "Check's CK_RUN_SUITE, CK_RUN_CASE, CK_FORK, CK_VERBOSITY and\n"
            "CK_TIMEOUT_MULTIPLIER apply.\n",
            argv0);
}

int main(int argc, char **argv)
{
    SRunner *sr = NULL;
    int opt, failed;

    /* a peer process exec'd by a test, not a test run */
    if (argc >= 2 && strcmp(argv[1], "--child-stream-send") == 0)
        return it_child_stream_send(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "--child-accept") == 0)
        return it_child_accept(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "--child-shm-echo") == 0)
        return it_child_shm_echo(argc - 2, argv + 2);

    while ((opt = getopt(argc, argv, "p:h")) != -1) {
        switch (opt) {
        case 'p':
            it_provider = optarg;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    /* Before any exs_init (each test also sets it again in it_init). */
    if (setenv("EXS_PROVIDER", it_provider, 1) != 0) {
        perror("setenv");
        return 2;
    }
    printf("ES-API integration tests: provider %s\n", it_provider);
    fflush(stdout);

    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++) {
        if (!sr)
            sr = srunner_create(suites[i]());
        else
            srunner_add_suite(sr, suites[i]());
    }
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
