/* SPDX-License-Identifier: MIT */
/* Strict parsing of numbers and booleans given as text. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <strings.h>

#include "exs/util/parse.h"
#include "exs/util/util.h"

int exs__parse_uint(const char *s, uint64_t *v_p)
{
    unsigned long long v;
    char *end;
    int base = 10;
    unsigned shift = 0;

    if (!s)
        return -EINVAL;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    /* strtoull would skip spaces and accept a sign (and negate "-1" to UINT64_MAX). */
    if (base == 16 ? !isxdigit((unsigned char)*s) : !isdigit((unsigned char)*s))
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, base);
    if (errno == ERANGE)
        return -ERANGE;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    default:
        return -EINVAL;
    }
    if (shift && end[1] != '\0')
        return -EINVAL;
    if (v > (UINT64_MAX >> shift))
        return -ERANGE;
    *v_p = (uint64_t)v << shift;
    return 0;
}

int exs__parse_bool(const char *s, int *v_p)
{
    static const char *const yes[] = {"1", "yes", "on", "true"};
    static const char *const no[] = {"0", "no", "off", "false"};

    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < EXS_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *v_p = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *v_p = 0;
            return 0;
        }
    }
    return -EINVAL;
}
