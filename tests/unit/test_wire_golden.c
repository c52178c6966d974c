/* SPDX-License-Identifier: MIT */
/* placeholder */
#include "tests/unit/unit.h"
Suite *wire_golden_suite(void) { return suite_create("wire_golden"); }
