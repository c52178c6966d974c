/* SPDX-License-Identifier: MIT */
/* The unit test runner: all suites in one SRunner, so CK_RUN_SUITE / CK_RUN_CASE select. */
#include <stdlib.h>
#include <string.h>

#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/mock/mock_prov.h"
#include "tests/mock/mock_proto.h"
#include "tests/unit/unit.h"

/* The only list of suites: add a constructor here (and declare it in unit.h). */
static Suite *(*const suites[])(void) = {
    util_log_suite,          util_json_suite,
    util_params_suite,       util_counters_suite,
    util_list_suite,         util_misc_suite,
    util_lockorder_suite,    api_evq_suite,
    prov_vrb_cache_suite,    mock_prov_suite,
    proto_credits_suite,     proto_stream_suite,
    proto_seqpacket_suite,   proto_teardown_suite,
    proto_hostile_suite,     wire_golden_suite,
    proto_batch_suite,       proto_ring_suite,
    proto_resume_ring_suite, proto_resume_bound_suite,
    util_sha256_suite,       proto_resume_auth_suite,
    proto_violation_suite,   prov_soft_pool_suite,
    prov_shm_lock_suite,     proto_unsig_suite,
    proto_unsig_cut_suite,   proto_resume_stay_suite,
    api_evq_attack2_suite,   api_evq_attack3_suite,
    api_evq_attack26_suite,
};

void unit_env_clean(void)
{
    size_t n;
    const struct exs_param_def *t = exs__params_table(&n);

    for (size_t i = 0; i < n; i++)
        unsetenv(t[i].env);
    exs__params_reset();
    exs__log_set_stream(NULL);
    exs__log_level = EXS_LOG_WARN;
    exs__log_subsys = EXS_SUB_ALL;
}

void unit_pair_fresh(struct pt_pair *pp, int type, int a_resumable, int b_resumable)
{
    unit_env_clean();
    exs__log_level = EXS_LOG_ERR;
    memset(pp, 0, sizeof(*pp));
    mock_set_reorder(0);
    pt_params(&pp->pa, type);
    pt_params(&pp->pb, type);
    pp->pa.resumable = a_resumable;
    pp->pb.resumable = b_resumable;
    pt_open(pp, type);
}

int main(void)
{
    SRunner *sr = srunner_create(NULL);
    int failed;

    for (size_t i = 0; i < EXS_ARRAY_SIZE(suites); i++)
        srunner_add_suite(sr, suites[i]());
    /* CK_ENV: CK_VERBOSITY may ask for more; the default is Check's normal summary. */
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
