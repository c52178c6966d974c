/* SPDX-License-Identifier: MIT */
/* Strict parsing of numbers and booleans given as text (tunables, tool arguments). */
#ifndef EXS_UTIL_PARSE_H
#define EXS_UTIL_PARSE_H

#include <stdint.h>

/* Decimal or 0x hex digits, then optionally one of k m g (either case; powers of 1024),
 * nothing else: no sign, no spaces. -EINVAL for garbage, -ERANGE for overflow. */
int exs__parse_uint(const char *s, uint64_t *v_p);
/* 0/1, yes/no, on/off, true/false (either case). -EINVAL otherwise. */
int exs__parse_bool(const char *s, int *v_p);

#endif
