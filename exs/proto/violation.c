/* SPDX-License-Identifier: MIT */
/* Protocol violations named (violation.h, spec/protocol.md §10). */
#include "exs/proto/violation.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "exs/proto/proto.h"
#include "exs/proto/wire_names.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

static const struct {
    const char *name, *section, *desc;
} pv_rules[EXS_PV_COUNT] = {[EXS_PV_NONE] = {"none", "", "no rule broken"},
#define EXS_PV_ROW_(_e, _n, _s, _d) [EXS_PV_##_e] = {_n, _s, _d},
                            EXS_PV_RULES(EXS_PV_ROW_)
#undef EXS_PV_ROW_
};

struct exs_proto_seams exs__proto_seams;

static exs_pv_sink_fn *pv_sink;
static uint64_t pv_count;

const char *exs__pv_rule_name(unsigned rule)
{
    return rule < EXS_PV_COUNT ? pv_rules[rule].name : "unknown";
}

const char *exs__pv_rule_desc(unsigned rule)
{
    return rule < EXS_PV_COUNT ? pv_rules[rule].desc : "";
}

const char *exs__pv_rule_section(unsigned rule)
{
    return rule < EXS_PV_COUNT ? pv_rules[rule].section : "";
}

enum exs_pv_rule exs__pv_rule_by_name(const char *name)
{
    for (unsigned i = 1; name && i < EXS_PV_COUNT; i++)
        if (!strcmp(pv_rules[i].name, name))
            return (enum exs_pv_rule)i;
    return EXS_PV_NONE;
}

const char *exs__pv_rec_name(unsigned rec_type)
{
    switch (rec_type) {
    case EXS_PV_REC_NONE:
        return "";
    case EXS_PV_REC_WRITE:
        return "WRITE_IMM";
    case EXS_PV_REC_COMPLETION:
        return "completion";
    default:
        return exs__wire_type_name(rec_type);
    }
}

void exs__pv_set_sink(exs_pv_sink_fn *fn)
{
    __atomic_store_n(&pv_sink, fn, __ATOMIC_RELEASE);
}

uint64_t exs__pv_total(void)
{
    return __atomic_load_n(&pv_count, __ATOMIC_RELAXED);
}

/* The detail goes into logs, JSON and an application's buffer: printable ASCII only, no
 * quote or backslash (so JSON needs no escaping). */
static void pv_clean(char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\')
            *s = '?';
}

size_t exs__pv_format(const void *conn_id, const struct exs_pv_state *pv, char *buf, size_t size)
{
    int n = snprintf(buf, size,
                     "{\"conn\":\"%p\",\"rule\":\"%s\",\"record\":\"%s\",\"detail\":\"%s\","
                     "\"count\":%" PRIu32 "}",
                     conn_id, exs__pv_rule_name(pv->rule), exs__pv_rec_name(pv->rec_type),
                     pv->detail, pv->count);

    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

int exs__proto_violation(struct exs_conn *conn, enum exs_pv_rule rule, unsigned rec_type,
                         const char *fmt, ...)
{
    struct exs_pv_state *pv = &conn->pv;
    exs_pv_sink_fn *sink;
    char json[EXS_PV_DETAIL_MAX + 192];
    size_t len;
    va_list ap;

    __atomic_add_fetch(&pv_count, 1, __ATOMIC_RELAXED);
    if (pv->count++) {
        /* what follows the first is most often its consequence: counted, not kept */
        EXS_DBG(PROTO, "conn %p: protocol violation %s %s too (after %s)", (void *)conn,
                exs__pv_rule_name(rule), exs__pv_rec_name(rec_type), exs__pv_rule_name(pv->rule));
        return -EPROTO;
    }
    if (rule <= EXS_PV_NONE || rule >= EXS_PV_COUNT)
        rule = EXS_PV_COMPLETION; /* a caller's slip must not lose the event; never happens */
    pv->rule = (uint16_t)rule;
    pv->rec_type = (uint16_t)rec_type;
    pv->t_us = exs__now_us();
    va_start(ap, fmt);
    vsnprintf(pv->detail, sizeof(pv->detail), fmt, ap);
    va_end(ap);
    pv_clean(pv->detail);
    EXS_INFO(PROTO, "conn %p: protocol violation %s%s%s: %s (spec/protocol.md §%s: %s)",
             (void *)conn, pv_rules[rule].name, rec_type ? " in " : "", exs__pv_rec_name(rec_type),
             pv->detail, pv_rules[rule].section, pv_rules[rule].desc);
    sink = __atomic_load_n(&pv_sink, __ATOMIC_ACQUIRE);
    if (sink && (len = exs__pv_format(conn, pv, json, sizeof(json))))
        sink(json, len);
    return -EPROTO;
}

int exs__pv_get(struct exs_conn *conn, struct exs_pv_state *out)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    *out = conn->pv;
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return out->rule ? 0 : -ENOENT;
}

size_t exs__pv_reason(struct exs_conn *conn, char *buf, size_t size)
{
    struct exs_pv_state pv;
    int n;

    if (exs__pv_get(conn, &pv)) {
        if (size)
            buf[0] = '\0';
        return 0;
    }
    n = snprintf(buf, size, "%s%s%s: %s", exs__pv_rule_name(pv.rule), pv.rec_type ? " " : "",
                 exs__pv_rec_name(pv.rec_type), pv.detail);
    return n > 0 ? (size_t)n : 0;
}
