/* SPDX-License-Identifier: MIT */
/* placeholder */
#include "tests/unit/unit.h"
Suite *proto_teardown_suite(void) { return suite_create("proto_teardown"); }
