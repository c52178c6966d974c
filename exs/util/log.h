/* SPDX-License-Identifier: MIT */
/* Logging with levels and subsystems, set at run time by EXS_LOG_LEVEL / EXS_LOG_SUBSYS. */
#ifndef EXS_UTIL_LOG_H
#define EXS_UTIL_LOG_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

enum exs_log_level {
    EXS_LOG_NONE = 0,
    EXS_LOG_ERR,
    EXS_LOG_WARN,
    EXS_LOG_INFO,
    EXS_LOG_DBG,
    EXS_LOG_TRACE,
    EXS_LOG_DATA, /* per-message data path logs */
};

/* Subsystems are bits so EXS_LOG_SUBSYS can select several ("prov,proto"). */
enum exs_log_subsys {
    EXS_SUB_API = 1u << 0,
    EXS_SUB_ENG = 1u << 1,
    EXS_SUB_PROTO = 1u << 2,
    EXS_SUB_PROV = 1u << 3,
    EXS_SUB_CACHE = 1u << 4,
    EXS_SUB_UTIL = 1u << 5,
    EXS_SUB_ALL = 0x3f,
};

/* Compile-time ceiling: levels above it compile to nothing (data path logs are
 * free in release builds). */
#ifndef EXS_MAX_LOG_LEVEL
#define EXS_MAX_LOG_LEVEL EXS_LOG_TRACE
#endif

/* Current run-time settings (read by the macros without a call; relaxed atomics: the control
 * endpoint's `set` changes them while other threads log). */
extern int exs__log_level;
extern unsigned exs__log_subsys;

/* (Re)read EXS_LOG_LEVEL (a number 0-6 or a name: none err warn info dbg trace data)
 * and EXS_LOG_SUBSYS (comma list of api eng proto prov cache util, or all). */
void exs__log_init(void);
/* Parse a level name or number; -1 when invalid. */
int exs__log_level_parse(const char *s);
/* Parse a subsystem list; 0 when invalid. */
unsigned exs__log_subsys_parse(const char *s);
/* Where log lines go (default stderr); NULL restores stderr. For tests. */
void exs__log_set_stream(FILE *f);

/* Writes "exs <level> <subsys> func:line: message\n"; keeps errno unchanged. */
void exs__log(int level, unsigned subsys, const char *func, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void exs__vlog(int level, unsigned subsys, const char *func, int line, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* Rate limiting (one per call site of the macros): a token bucket of log_rate_burst
 * lines refilled at log_rate_per_s lines per second; err, warn and info lines past it
 * are counted, and the next line the site writes is preceded by
 * "N messages like the next suppressed (rate limit)". dbg and below are not limited. */
struct exs_log_site {
    pthread_mutex_t lock;
    uint64_t refill_ns; /* when tokens were last refilled */
    uint64_t tokens;
    uint64_t suppressed; /* lines dropped since the last one written */
    int init;
};
#define EXS_LOG_SITE_INIT                                                                          \
    {                                                                                              \
        .lock = PTHREAD_MUTEX_INITIALIZER                                                          \
    }
void exs__log_rl(struct exs_log_site *site, int level, unsigned subsys, const char *func, int line,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Lines suppressed by rate limiting, ever (tests, exsctl stat). */
uint64_t exs__log_suppressed_total(void);

/* Every line written is also handed to fn (the control endpoint's trace stream), after it
 * is written and outside the log's lock; fn must not log. NULL removes it. */
typedef void exs_log_hook_fn(const char *line, size_t len);
void exs__log_set_hook(exs_log_hook_fn *fn);

/* fork (exs/api/fork.c): the log's lock held across fork(2) (phase: enum exs_fork_phase),
 * so no line is half written in the child's copy of the stream. */
void exs__log_fork(int phase);

#define EXS_LOG_ON(_lvl, _sub)                                                                     \
    ((_lvl) <= EXS_MAX_LOG_LEVEL &&                                                                \
     (_lvl) <= __atomic_load_n(&exs__log_level, __ATOMIC_RELAXED) &&                               \
     (__atomic_load_n(&exs__log_subsys, __ATOMIC_RELAXED) & (_sub)))

#define EXS_LOG(_lvl, _sub, ...)                                                                   \
    do {                                                                                           \
        if (EXS_LOG_ON(_lvl, EXS_SUB_##_sub)) {                                                    \
            static struct exs_log_site exs_log_site_ = EXS_LOG_SITE_INIT;                          \
            exs__log_rl(&exs_log_site_, _lvl, EXS_SUB_##_sub, __func__, __LINE__, __VA_ARGS__);    \
        }                                                                                          \
    } while (0)

#define EXS_ERR(_sub, ...)   EXS_LOG(EXS_LOG_ERR, _sub, __VA_ARGS__)
#define EXS_WARN(_sub, ...)  EXS_LOG(EXS_LOG_WARN, _sub, __VA_ARGS__)
#define EXS_INFO(_sub, ...)  EXS_LOG(EXS_LOG_INFO, _sub, __VA_ARGS__)
#define EXS_DBG(_sub, ...)   EXS_LOG(EXS_LOG_DBG, _sub, __VA_ARGS__)
#define EXS_TRACE(_sub, ...) EXS_LOG(EXS_LOG_TRACE, _sub, __VA_ARGS__)
#define EXS_DATA(_sub, ...)  EXS_LOG(EXS_LOG_DATA, _sub, __VA_ARGS__)

#endif
