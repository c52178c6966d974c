/* SPDX-License-Identifier: MIT */
/* placeholder */
#include "tests/unit/unit.h"
Suite *proto_credits_suite(void) { return suite_create("proto_credits"); }
