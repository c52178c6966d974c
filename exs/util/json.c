/* SPDX-License-Identifier: MIT */
/* JSON: a bounded writer for control replies and a depth-limited reader for exsctl. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/json.h"
#include "exs/util/util.h"

/* ---- writer ---- */

void exs__jbuf_init(struct exs_jbuf *b, size_t max)
{
    memset(b, 0, sizeof(*b));
    b->max = max;
}

void exs__jbuf_free(struct exs_jbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void exs__jbuf_reset(struct exs_jbuf *b)
{
    b->len = 0;
    b->overflow = 0;
    b->comma = 0;
}

void exs__jbuf_raw(struct exs_jbuf *b, const char *s, size_t n)
{
    if (b->overflow)
        return;
    if (n > b->max - b->len) {
        b->overflow = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *p;

        while (cap < b->len + n + 1)
            cap *= 2;
        if (cap > b->max + 1)
            cap = b->max + 1;
        p = realloc(b->p, cap);
        if (!p) {
            b->overflow = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void jbuf_sep(struct exs_jbuf *b)
{
    if (b->comma)
        exs__jbuf_raw(b, ",", 1);
    b->comma = 0;
}

void exs__jbuf_obj_begin(struct exs_jbuf *b)
{
    jbuf_sep(b);
    exs__jbuf_raw(b, "{", 1);
}

void exs__jbuf_obj_end(struct exs_jbuf *b)
{
    exs__jbuf_raw(b, "}", 1);
    b->comma = 1;
}

void exs__jbuf_arr_begin(struct exs_jbuf *b)
{
    jbuf_sep(b);
    exs__jbuf_raw(b, "[", 1);
}

void exs__jbuf_arr_end(struct exs_jbuf *b)
{
    exs__jbuf_raw(b, "]", 1);
    b->comma = 1;
}

static void jbuf_quoted(struct exs_jbuf *b, const char *s, size_t n)
{
    size_t start = 0;

    exs__jbuf_raw(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];

        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f)
            continue;
        exs__jbuf_raw(b, s + start, i - start);
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            exs__jbuf_raw(b, esc, 2);
        } else if (c == '\n') {
            exs__jbuf_raw(b, "\\n", 2);
        } else {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            exs__jbuf_raw(b, esc, 6);
        }
        start = i + 1;
    }
    exs__jbuf_raw(b, s + start, n - start);
    exs__jbuf_raw(b, "\"", 1);
}

void exs__jbuf_key(struct exs_jbuf *b, const char *key)
{
    jbuf_sep(b);
    jbuf_quoted(b, key, strlen(key));
    exs__jbuf_raw(b, ":", 1);
}

void exs__jbuf_strn(struct exs_jbuf *b, const char *s, size_t n)
{
    jbuf_sep(b);
    jbuf_quoted(b, s, n);
    b->comma = 1;
}

void exs__jbuf_str(struct exs_jbuf *b, const char *s)
{
    exs__jbuf_strn(b, s ? s : "", s ? strlen(s) : 0);
}

void exs__jbuf_u64(struct exs_jbuf *b, uint64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof(t), "%" PRIu64, v);

    jbuf_sep(b);
    exs__jbuf_raw(b, t, (size_t)n);
    b->comma = 1;
}

void exs__jbuf_i64(struct exs_jbuf *b, int64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof(t), "%" PRId64, v);

    jbuf_sep(b);
    exs__jbuf_raw(b, t, (size_t)n);
    b->comma = 1;
}

void exs__jbuf_bool(struct exs_jbuf *b, int v)
{
    jbuf_sep(b);
    exs__jbuf_raw(b, v ? "true" : "false", v ? 4 : 5);
    b->comma = 1;
}

void exs__jbuf_kv_str(struct exs_jbuf *b, const char *key, const char *s)
{
    exs__jbuf_key(b, key);
    exs__jbuf_str(b, s);
}

void exs__jbuf_kv_u64(struct exs_jbuf *b, const char *key, uint64_t v)
{
    exs__jbuf_key(b, key);
    exs__jbuf_u64(b, v);
}

/* ---- reader ---- */

struct jparse {
    const char *s;
    size_t len, pos;
};

static void jp_ws(struct jparse *p)
{
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int jp_lit(struct jparse *p, const char *lit)
{
    size_t n = strlen(lit);

    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0)
        return -EINVAL;
    p->pos += n;
    return 0;
}

/* A string at p->pos (the opening quote); *out_p is malloc'ed, UTF-8. */
static int jp_string(struct jparse *p, char **out_p)
{
    size_t start = ++p->pos, cap, n = 0;
    char *out;

    /* the decoded text is never longer than the source */
    while (p->pos < p->len && p->s[p->pos] != '"')
        p->pos += p->s[p->pos] == '\\' ? 2 : 1;
    if (p->pos >= p->len)
        return -EINVAL;
    cap = p->pos - start + 1;
    out = malloc(cap);
    if (!out)
        return -ENOMEM;
    for (size_t i = start; i < p->pos; i++) {
        unsigned char c = (unsigned char)p->s[i];

        if (c < 0x20)
            goto bad;
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        c = (unsigned char)p->s[++i];
        switch (c) {
        case '"':
        case '\\':
        case '/':
            out[n++] = (char)c;
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'n':
            out[n++] = '\n';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'u': {
            unsigned v = 0;

            if (p->pos - i < 5)
                goto bad;
            for (int k = 1; k <= 4; k++) {
                int h = exs__hex_digit(p->s[i + (size_t)k]);

                if (h < 0)
                    goto bad;
                v = v * 16 + (unsigned)h;
            }
            i += 4;
            if (v == 0 || (v >= 0xd800 && v <= 0xdfff))
                goto bad; /* no NUL inside C strings; surrogate pairs not needed here */
            if (v < 0x80) {
                out[n++] = (char)v;
            } else if (v < 0x800) {
                out[n++] = (char)(0xc0 | (v >> 6));
                out[n++] = (char)(0x80 | (v & 0x3f));
            } else {
                out[n++] = (char)(0xe0 | (v >> 12));
                out[n++] = (char)(0x80 | ((v >> 6) & 0x3f));
                out[n++] = (char)(0x80 | (v & 0x3f));
            }
            break;
        }
        default:
            goto bad;
        }
    }
    out[n] = '\0';
    p->pos++;
    *out_p = out;
    return 0;
bad:
    free(out);
    return -EINVAL;
}

static int jp_value(struct jparse *p, int depth, struct exs_json **j_p);

/* Members of an array or object up to the closing bracket. */
static int jp_members(struct jparse *p, int depth, struct exs_json *j, int obj)
{
    struct exs_json **tail = &j->child;
    char close = obj ? '}' : ']';

    p->pos++;
    jp_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        struct exs_json *m;
        int ret;

        jp_ws(p);
        if (obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return -EINVAL;
            if ((ret = jp_string(p, &key)))
                return ret;
            jp_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(key);
                return -EINVAL;
            }
            p->pos++;
        }
        if ((ret = jp_value(p, depth + 1, &m))) {
            free(key);
            return ret;
        }
        m->key = key;
        *tail = m;
        tail = &m->next;
        jp_ws(p);
        if (p->pos >= p->len)
            return -EINVAL;
        if (p->s[p->pos] == close) {
            p->pos++;
            return 0;
        }
        if (p->s[p->pos] != ',')
            return -EINVAL;
        p->pos++;
    }
}

static int jp_value(struct jparse *p, int depth, struct exs_json **j_p)
{
    struct exs_json *j;
    int ret = 0;

    if (depth > EXS_JSON_DEPTH_MAX)
        return -EINVAL;
    jp_ws(p);
    if (p->pos >= p->len)
        return -EINVAL;
    j = calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    switch (p->s[p->pos]) {
    case '{':
        j->type = EXS_JSON_OBJ;
        ret = jp_members(p, depth, j, 1);
        break;
    case '[':
        j->type = EXS_JSON_ARR;
        ret = jp_members(p, depth, j, 0);
        break;
    case '"':
        j->type = EXS_JSON_STR;
        ret = jp_string(p, &j->str);
        break;
    case 't':
        j->type = EXS_JSON_BOOL;
        j->b = 1;
        ret = jp_lit(p, "true");
        break;
    case 'f':
        j->type = EXS_JSON_BOOL;
        ret = jp_lit(p, "false");
        break;
    case 'n':
        ret = jp_lit(p, "null");
        break;
    default: {
        size_t start = p->pos;

        while (p->pos < p->len && strchr("+-0123456789.eE", p->s[p->pos]))
            p->pos++;
        if (p->pos == start) {
            ret = -EINVAL;
            break;
        }
        j->type = EXS_JSON_NUM;
        j->str = strndup(p->s + start, p->pos - start);
        if (!j->str)
            ret = -ENOMEM;
    }
    }
    if (ret) {
        exs__json_free(j);
        return ret;
    }
    *j_p = j;
    return 0;
}

int exs__json_parse(const char *text, size_t len, struct exs_json **root_p)
{
    struct jparse p = {.s = text, .len = len};
    struct exs_json *j;
    int ret = jp_value(&p, 0, &j);

    if (ret)
        return ret;
    jp_ws(&p);
    if (p.pos != p.len) {
        exs__json_free(j);
        return -EINVAL;
    }
    *root_p = j;
    return 0;
}

void exs__json_free(struct exs_json *j)
{
    while (j) {
        struct exs_json *next = j->next;

        exs__json_free(j->child);
        free(j->key);
        free(j->str);
        free(j);
        j = next;
    }
}

const struct exs_json *exs__json_get(const struct exs_json *j, const char *key)
{
    if (!j || j->type != EXS_JSON_OBJ)
        return NULL;
    for (const struct exs_json *m = j->child; m; m = m->next)
        if (m->key && strcmp(m->key, key) == 0)
            return m;
    return NULL;
}

const char *exs__json_get_str(const struct exs_json *j, const char *key)
{
    const struct exs_json *m = exs__json_get(j, key);

    return m && m->type == EXS_JSON_STR ? m->str : "";
}

uint64_t exs__json_get_u64(const struct exs_json *j, const char *key)
{
    const struct exs_json *m = exs__json_get(j, key);

    return m && m->type == EXS_JSON_NUM && m->str[0] != '-' ? strtoull(m->str, NULL, 10) : 0;
}

int64_t exs__json_get_i64(const struct exs_json *j, const char *key)
{
    const struct exs_json *m = exs__json_get(j, key);

    return m && m->type == EXS_JSON_NUM ? strtoll(m->str, NULL, 10) : 0;
}

int exs__json_get_bool(const struct exs_json *j, const char *key)
{
    const struct exs_json *m = exs__json_get(j, key);

    return m && m->type == EXS_JSON_BOOL ? m->b : 0;
}
