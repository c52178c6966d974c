/* SPDX-License-Identifier: MIT */
/* Logging: level and subsystem filters, name parsing, and one atomic write per line. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

int exs__log_level = EXS_LOG_WARN;
unsigned exs__log_subsys = EXS_SUB_ALL;

/* NULL means stderr (which is not a constant initializer). */
static FILE *log_stream;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {
    [EXS_LOG_NONE] = "none", [EXS_LOG_ERR] = "err", [EXS_LOG_WARN] = "warn",
    [EXS_LOG_INFO] = "info", [EXS_LOG_DBG] = "dbg", [EXS_LOG_TRACE] = "trace",
    [EXS_LOG_DATA] = "data",
};

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"api", EXS_SUB_API},   {"eng", EXS_SUB_ENG},     {"proto", EXS_SUB_PROTO},
    {"prov", EXS_SUB_PROV}, {"cache", EXS_SUB_CACHE}, {"util", EXS_SUB_UTIL},
};

/* The environment goes through the params table (EXS_LOG_LEVEL / EXS_LOG_SUBSYS rows):
 * loading it applies both to exs__log_level / exs__log_subsys. Reapplying here also
 * covers values changed with exs__params_set(). To re-read the environment itself,
 * call exs__params_reset() first. */
void exs__log_init(void)
{
    int level;
    unsigned subsys;
    char buf[EXS_PARAM_STR_MAX];

    exs__params_load();
    if (exs__params_get("log_level", buf, sizeof(buf)) == 0 &&
        (level = exs__log_level_parse(buf)) >= 0)
        __atomic_store_n(&exs__log_level, level, __ATOMIC_RELAXED);
    if (exs__params_get("log_subsys", buf, sizeof(buf)) == 0 &&
        (subsys = exs__log_subsys_parse(buf)) != 0)
        __atomic_store_n(&exs__log_subsys, subsys, __ATOMIC_RELAXED);
}

int exs__log_level_parse(const char *s)
{
    if (!s || !*s)
        return -1;
    if (s[0] >= '0' && s[0] <= '9' && s[1] == '\0')
        return s[0] - '0' < (int)EXS_ARRAY_SIZE(level_names) ? s[0] - '0' : -1;
    for (size_t i = 0; i < EXS_ARRAY_SIZE(level_names); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return (int)i;
    return -1;
}

/* One item of a subsystem list: [start, start+len), spaces around it ignored. */
static unsigned subsys_item(const char *start, size_t len)
{
    while (len && *start == ' ') {
        start++;
        len--;
    }
    while (len && start[len - 1] == ' ')
        len--;
    if (len == 3 && strncasecmp(start, "all", 3) == 0)
        return EXS_SUB_ALL;
    for (size_t i = 0; i < EXS_ARRAY_SIZE(subsys_names); i++)
        if (strlen(subsys_names[i].name) == len &&
            strncasecmp(start, subsys_names[i].name, len) == 0)
            return subsys_names[i].bit;
    return 0;
}

unsigned exs__log_subsys_parse(const char *s)
{
    unsigned mask = 0;

    if (!s)
        return 0;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        unsigned bit = subsys_item(s, len);

        if (!bit)
            return 0; /* empty or unknown item: the whole list is invalid */
        mask |= bit;
        if (!comma)
            return mask;
        s = comma + 1;
    }
}

void exs__log_set_stream(FILE *f)
{
    __atomic_store_n(&log_stream, f, __ATOMIC_RELEASE);
}

static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < EXS_ARRAY_SIZE(subsys_names); i++)
        if (subsys & subsys_names[i].bit)
            return subsys_names[i].name;
    return "?";
}

static exs_log_hook_fn *log_hook;
static uint64_t log_suppressed;

void exs__log_set_hook(exs_log_hook_fn *fn)
{
    __atomic_store_n(&log_hook, fn, __ATOMIC_RELEASE);
}

uint64_t exs__log_suppressed_total(void)
{
    return __atomic_load_n(&log_suppressed, __ATOMIC_RELAXED);
}

void exs__log(int level, unsigned subsys, const char *func, int line, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    exs__vlog(level, subsys, func, line, fmt, ap);
    va_end(ap);
}

/* 1 when the site may write a line now; *suppressed_p: lines it dropped before. */
static int log_site_take(struct exs_log_site *site, uint64_t *suppressed_p)
{
    uint64_t burst = __atomic_load_n(&exs__params.log_rate_burst, __ATOMIC_RELAXED);
    uint64_t rate = __atomic_load_n(&exs__params.log_rate_per_s, __ATOMIC_RELAXED);
    uint64_t now = exs__now_ns();
    int ok = 1;

    *suppressed_p = 0;
    if (burst == 0 || rate == 0)
        return 1; /* no limit (rate 0: the params were never loaded) */
    pthread_mutex_lock(&site->lock);
    if (!site->init) {
        site->init = 1;
        site->tokens = burst;
        site->refill_ns = now;
    } else if (now > site->refill_ns) {
        uint64_t add = (now - site->refill_ns) / (1000000000u / rate ? 1000000000u / rate : 1);

        if (add) {
            site->tokens = EXS_MIN(burst, site->tokens + add);
            site->refill_ns = now;
        }
    }
    if (site->tokens == 0) {
        site->suppressed++;
        ok = 0;
    } else {
        site->tokens--;
        *suppressed_p = site->suppressed;
        site->suppressed = 0;
    }
    pthread_mutex_unlock(&site->lock);
    if (!ok)
        __atomic_fetch_add(&log_suppressed, 1, __ATOMIC_RELAXED);
    return ok;
}

void exs__log_rl(struct exs_log_site *site, int level, unsigned subsys, const char *func, int line,
                 const char *fmt, ...)
{
    int saved_errno = errno;
    uint64_t suppressed = 0;
    va_list ap;

    if (level <= EXS_LOG_INFO && !log_site_take(site, &suppressed)) {
        errno = saved_errno;
        return;
    }
    if (suppressed)
        exs__log(level, subsys, func, line, "%llu messages like the next suppressed (rate limit)",
                 (unsigned long long)suppressed);
    errno = saved_errno;
    va_start(ap, fmt);
    exs__vlog(level, subsys, func, line, fmt, ap);
    va_end(ap);
}

void exs__vlog(int level, unsigned subsys, const char *func, int line, const char *fmt, va_list ap0)
{
    int saved_errno = errno; /* first: %m and the caller both see the original */
    char stack[1024];
    char *buf = stack;
    size_t size = sizeof(stack);
    int head, body, cs;
    va_list ap;
    FILE *f = __atomic_load_n(&log_stream, __ATOMIC_ACQUIRE);
    exs_log_hook_fn *hook = __atomic_load_n(&log_hook, __ATOMIC_ACQUIRE);

    if (!f)
        f = stderr;
    head =
        snprintf(buf, size, "exs %s %s %s:%d: ",
                 level >= 0 && level < (int)EXS_ARRAY_SIZE(level_names) ? level_names[level] : "?",
                 subsys_name(subsys), func, line);
    if (head < 0 || (size_t)head >= size - 2) {
        head = 0; /* absurd function name: drop the prefix rather than the message */
        buf[0] = '\0';
    }
    errno = saved_errno;
    va_copy(ap, ap0);
    body = vsnprintf(buf + head, size - (size_t)head, fmt, ap);
    va_end(ap);
    if (body < 0)
        body = 0;
    if ((size_t)head + (size_t)body + 2 > size) {
        /* Too long for the stack buffer: format again into one of the exact size;
         * if that fails the line is cut (and still ends in a newline). */
        char *big = malloc((size_t)head + (size_t)body + 2);

        if (big) {
            memcpy(big, buf, (size_t)head);
            errno = saved_errno;
            va_copy(ap, ap0);
            vsnprintf(big + head, (size_t)body + 1, fmt, ap);
            va_end(ap);
            buf = big;
            size = (size_t)head + (size_t)body + 2;
        } else {
            body = (int)(size - (size_t)head - 2);
        }
    }
    /* A message that already ends in a newline does not get a second one. */
    if (body > 0 && buf[head + body - 1] == '\n')
        body--;
    buf[head + body] = '\n';
    buf[head + body + 1] = '\0';

    /* One fwrite of the whole line is atomic with respect to other stdio users of f.
     * log_lock orders our own writers in a way ThreadSanitizer can see (it does not
     * see glibc's FILE locks) and keeps each flush with its line. */
    /* stdio's write is a cancellation point, and so may be the hook's code: off, the
     * caller may hold the library's locks (nocancel.h) */
    cs = exs__nc_begin();
    pthread_mutex_lock(&log_lock);
    fwrite(buf, 1, (size_t)head + (size_t)body + 1, f);
    fflush(f);
    pthread_mutex_unlock(&log_lock);
    if (hook)
        hook(buf, (size_t)head + (size_t)body + 1);
    exs__nc_end(cs);

    if (buf != stack)
        free(buf);
    errno = saved_errno;
}

void exs__log_fork(int phase)
{
    exs__mutex_fork(&log_lock, phase);
}
