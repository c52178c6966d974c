/* SPDX-License-Identifier: MIT */
/* A bounded JSON writer (control endpoint replies) and a small, depth-limited JSON reader
 * (exsctl, tests) for the control protocol of spec/observability.md. */
#ifndef EXS_UTIL_JSON_H
#define EXS_UTIL_JSON_H

#include <stddef.h>
#include <stdint.h>

/* ---- writer ---- */

/* Text grows up to max bytes; past it, further output is dropped and overflow is set
 * (the reply is then cut at a value boundary by the caller, see exs__jbuf_mark). */
struct exs_jbuf {
    char *p;
    size_t len, cap, max;
    int overflow; /* an append did not fit in max */
    int comma;    /* the next value or key needs a comma before it */
};

void exs__jbuf_init(struct exs_jbuf *b, size_t max);
void exs__jbuf_free(struct exs_jbuf *b);
/* Forget the text, keep the memory. */
void exs__jbuf_reset(struct exs_jbuf *b);
void exs__jbuf_raw(struct exs_jbuf *b, const char *s, size_t n);
void exs__jbuf_obj_begin(struct exs_jbuf *b);
void exs__jbuf_obj_end(struct exs_jbuf *b);
void exs__jbuf_arr_begin(struct exs_jbuf *b);
void exs__jbuf_arr_end(struct exs_jbuf *b);
void exs__jbuf_key(struct exs_jbuf *b, const char *key);
void exs__jbuf_str(struct exs_jbuf *b, const char *s);
/* A string of n bytes (may hold any byte: control characters are escaped). */
void exs__jbuf_strn(struct exs_jbuf *b, const char *s, size_t n);
void exs__jbuf_u64(struct exs_jbuf *b, uint64_t v);
void exs__jbuf_i64(struct exs_jbuf *b, int64_t v);
void exs__jbuf_bool(struct exs_jbuf *b, int v);
void exs__jbuf_kv_str(struct exs_jbuf *b, const char *key, const char *s);
void exs__jbuf_kv_u64(struct exs_jbuf *b, const char *key, uint64_t v);

/* ---- reader ---- */

enum exs_json_type {
    EXS_JSON_NULL,
    EXS_JSON_BOOL,
    EXS_JSON_NUM,
    EXS_JSON_STR,
    EXS_JSON_ARR,
    EXS_JSON_OBJ
};

struct exs_json {
    enum exs_json_type type;
    char *key;              /* member name inside an object, else NULL */
    char *str;              /* STR: the string (NUL-terminated, \u0000 refused); NUM: its text */
    int b;                  /* BOOL */
    struct exs_json *child; /* ARR, OBJ: first element */
    struct exs_json *next;  /* next sibling */
};

#define EXS_JSON_DEPTH_MAX 32

/* Parse one JSON value filling text[0, len) (white space around it allowed). Returns 0,
 * -EINVAL (not JSON, trailing bytes, nesting deeper than EXS_JSON_DEPTH_MAX) or -ENOMEM. */
int exs__json_parse(const char *text, size_t len, struct exs_json **root_p);
void exs__json_free(struct exs_json *j);
/* Member of an object by name, NULL when absent or j is not an object. */
const struct exs_json *exs__json_get(const struct exs_json *j, const char *key);
/* Member as text ("" when absent or not a string), as a number (0 when absent), as a
 * boolean (0 when absent). */
const char *exs__json_get_str(const struct exs_json *j, const char *key);
uint64_t exs__json_get_u64(const struct exs_json *j, const char *key);
int64_t exs__json_get_i64(const struct exs_json *j, const char *key);
int exs__json_get_bool(const struct exs_json *j, const char *key);

#endif
