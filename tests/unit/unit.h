/* SPDX-License-Identifier: MIT */
/* The suite constructors of the unit test binary (registered in main.c) and shared helpers. */
#ifndef EXS_TESTS_UNIT_H
#define EXS_TESTS_UNIT_H

#include <check.h>

Suite *util_log_suite(void);
Suite *util_json_suite(void);
Suite *util_params_suite(void);
Suite *util_counters_suite(void);
Suite *util_list_suite(void);
Suite *util_misc_suite(void);
Suite *util_sha256_suite(void);
Suite *util_lockorder_suite(void);
Suite *api_evq_suite(void);
Suite *prov_vrb_cache_suite(void);
/* test_prov_vrb_wc.c: its cases, added to prov_vrb_cache (verbs builds only). */
TCase *prov_vrb_wc_tcase(void);
Suite *mock_prov_suite(void);
Suite *proto_credits_suite(void);
Suite *proto_stream_suite(void);
Suite *proto_seqpacket_suite(void);
Suite *proto_teardown_suite(void);
Suite *proto_hostile_suite(void);
Suite *wire_golden_suite(void);
Suite *proto_batch_suite(void);
Suite *proto_ring_suite(void);
Suite *proto_resume_ring_suite(void);
Suite *proto_resume_bound_suite(void);
Suite *proto_resume_auth_suite(void);
Suite *proto_violation_suite(void);
Suite *prov_soft_pool_suite(void);
Suite *proto_unsig_suite(void);
Suite *proto_unsig_cut_suite(void);
Suite *proto_resume_stay_suite(void);
Suite *api_evq_attack2_suite(void);
Suite *api_evq_attack3_suite(void);
Suite *api_evq_attack26_suite(void);
Suite *prov_shm_lock_suite(void);

/* Unset every EXS_* variable of the tunables table, forget loaded tunables, and put
 * the logger back to its defaults (writing to stderr). For fixtures. */
void unit_env_clean(void);

struct pt_pair;
/* A fresh mock pair of this type, opened (not connected) after unit_env_clean, with errors
 * logged only (the tests provoke warnings), the mock's reordering off and each side
 * resumable (policy any) as asked. */
void unit_pair_fresh(struct pt_pair *pp, int type, int a_resumable, int b_resumable);

#endif
