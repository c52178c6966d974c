/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/util/log.c: parsing, line format, filtering, errno, streams, threads. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/unit/unit.h"

/* Log lines captured in memory. */
struct capture {
    FILE *f;
    char *buf;
    size_t len;
};

static void cap_start(struct capture *c)
{
    c->buf = NULL;
    c->len = 0;
    c->f = open_memstream(&c->buf, &c->len);
    ck_assert_ptr_nonnull(c->f);
    exs__log_set_stream(c->f);
}

static const char *cap_text(struct capture *c)
{
    fflush(c->f);
    return c->buf ? c->buf : "";
}

static void cap_end(struct capture *c)
{
    exs__log_set_stream(NULL);
    fclose(c->f);
    free(c->buf);
}

START_TEST(test_level_parse)
{
    static const char *const names[] = {"none", "err", "warn", "info", "dbg", "trace", "data"};

    for (int i = 0; i < 7; i++) {
        char num[2] = {(char)('0' + i), 0};

        ck_assert_int_eq(exs__log_level_parse(names[i]), i);
        ck_assert_int_eq(exs__log_level_parse(num), i);
    }
    ck_assert_int_eq(exs__log_level_parse("WARN"), EXS_LOG_WARN);
    ck_assert_int_eq(exs__log_level_parse("Trace"), EXS_LOG_TRACE);
    ck_assert_int_eq(exs__log_level_parse(NULL), -1);
    ck_assert_int_eq(exs__log_level_parse(""), -1);
    ck_assert_int_eq(exs__log_level_parse("7"), -1);
    ck_assert_int_eq(exs__log_level_parse("-1"), -1);
    ck_assert_int_eq(exs__log_level_parse("01"), -1);
    ck_assert_int_eq(exs__log_level_parse("warnx"), -1);
    ck_assert_int_eq(exs__log_level_parse("war"), -1);
    ck_assert_int_eq(exs__log_level_parse(" warn"), -1);
}
END_TEST

START_TEST(test_subsys_parse)
{
    ck_assert_uint_eq(exs__log_subsys_parse("api"), EXS_SUB_API);
    ck_assert_uint_eq(exs__log_subsys_parse("eng"), EXS_SUB_ENG);
    ck_assert_uint_eq(exs__log_subsys_parse("proto"), EXS_SUB_PROTO);
    ck_assert_uint_eq(exs__log_subsys_parse("prov"), EXS_SUB_PROV);
    ck_assert_uint_eq(exs__log_subsys_parse("cache"), EXS_SUB_CACHE);
    ck_assert_uint_eq(exs__log_subsys_parse("util"), EXS_SUB_UTIL);
    ck_assert_uint_eq(exs__log_subsys_parse("all"), EXS_SUB_ALL);
    ck_assert_uint_eq(exs__log_subsys_parse("ALL"), EXS_SUB_ALL);
    ck_assert_uint_eq(exs__log_subsys_parse("prov,proto"), EXS_SUB_PROV | EXS_SUB_PROTO);
    ck_assert_uint_eq(exs__log_subsys_parse("util, Api ,cache"),
                      EXS_SUB_UTIL | EXS_SUB_API | EXS_SUB_CACHE);
    ck_assert_uint_eq(exs__log_subsys_parse("prov,all"), EXS_SUB_ALL);
    ck_assert_uint_eq(exs__log_subsys_parse(NULL), 0);
    ck_assert_uint_eq(exs__log_subsys_parse(""), 0);
    ck_assert_uint_eq(exs__log_subsys_parse("pro"), 0);
    ck_assert_uint_eq(exs__log_subsys_parse("provx"), 0);
    ck_assert_uint_eq(exs__log_subsys_parse("prov,"), 0);
    ck_assert_uint_eq(exs__log_subsys_parse(",prov"), 0);
    ck_assert_uint_eq(exs__log_subsys_parse("prov,,util"), 0);
    ck_assert_uint_eq(exs__log_subsys_parse("prov,bogus"), 0);
}
END_TEST

START_TEST(test_format)
{
    static const char *const levels[] = {"none", "err", "warn", "info", "dbg", "trace", "data"};
    static const struct {
        unsigned bit;
        const char *name;
    } subs[] = {{EXS_SUB_API, "api"},   {EXS_SUB_ENG, "eng"},     {EXS_SUB_PROTO, "proto"},
                {EXS_SUB_PROV, "prov"}, {EXS_SUB_CACHE, "cache"}, {EXS_SUB_UTIL, "util"}};
    struct capture c;
    char want[256];
    int line;

    exs__log_level = EXS_LOG_INFO;
    cap_start(&c);
    EXS_INFO(PROV, "hello %d %s", 42, "x");
    line = __LINE__ - 1; /* the EXS_INFO line */
    snprintf(want, sizeof(want), "exs info prov %s:%d: hello 42 x\n", __func__, line);
    ck_assert_str_eq(cap_text(&c), want);
    cap_end(&c);

    /* exs__log itself does not filter: every level and subsystem name. */
    for (int l = 0; l < 7; l++) {
        for (size_t s = 0; s < sizeof(subs) / sizeof(subs[0]); s++) {
            cap_start(&c);
            exs__log(l, subs[s].bit, "fn", 7 + l, "v=%u", (unsigned)s);
            snprintf(want, sizeof(want), "exs %s %s fn:%d: v=%u\n", levels[l], subs[s].name, 7 + l,
                     (unsigned)s);
            ck_assert_str_eq(cap_text(&c), want);
            cap_end(&c);
        }
    }
}
END_TEST

START_TEST(test_newline_and_long)
{
    struct capture c;
    char *big = malloc(5001), *want = malloc(5100);

    ck_assert_ptr_nonnull(big);
    ck_assert_ptr_nonnull(want);
    cap_start(&c);
    exs__log(EXS_LOG_ERR, EXS_SUB_API, "f", 1, "ends in newline\n");
    ck_assert_str_eq(cap_text(&c), "exs err api f:1: ends in newline\n");
    cap_end(&c);

    /* Longer than any stack buffer: written whole, one line. */
    memset(big, 'a', 5000);
    big[5000] = '\0';
    big[4999] = 'z';
    cap_start(&c);
    exs__log(EXS_LOG_ERR, EXS_SUB_API, "f", 2, "<%s>", big);
    snprintf(want, 5100, "exs err api f:2: <%s>\n", big);
    ck_assert_str_eq(cap_text(&c), want);
    cap_end(&c);
    free(big);
    free(want);
}
END_TEST

START_TEST(test_level_filter)
{
    struct capture c;

    cap_start(&c);
    ck_assert_int_eq(exs__log_level, EXS_LOG_WARN); /* the default */
    EXS_ERR(UTIL, "e1");
    EXS_WARN(UTIL, "w1");
    EXS_INFO(UTIL, "i1");
    EXS_DBG(UTIL, "d1");
    exs__log_level = EXS_LOG_DBG;
    EXS_DBG(UTIL, "d2");
    EXS_TRACE(UTIL, "t2");
    exs__log_level = EXS_LOG_NONE;
    EXS_ERR(UTIL, "e3");
    /* DATA is above the default compile-time ceiling (TRACE): compiled out. */
    exs__log_level = EXS_LOG_DATA;
    EXS_TRACE(UTIL, "t4");
    EXS_DATA(UTIL, "x4");

    const char *t = cap_text(&c);

    ck_assert_ptr_nonnull(strstr(t, ": e1\n"));
    ck_assert_ptr_nonnull(strstr(t, ": w1\n"));
    ck_assert_ptr_null(strstr(t, ": i1\n"));
    ck_assert_ptr_null(strstr(t, ": d1\n"));
    ck_assert_ptr_nonnull(strstr(t, ": d2\n"));
    ck_assert_ptr_null(strstr(t, ": t2\n"));
    ck_assert_ptr_null(strstr(t, ": e3\n"));
    ck_assert_ptr_nonnull(strstr(t, ": t4\n"));
    ck_assert_ptr_null(strstr(t, ": x4\n"));
    cap_end(&c);
}
END_TEST

START_TEST(test_subsys_filter)
{
    struct capture c;

    cap_start(&c);
    exs__log_subsys = EXS_SUB_PROV | EXS_SUB_CACHE;
    EXS_ERR(API, "a");
    EXS_ERR(PROV, "p");
    EXS_ERR(CACHE, "c");
    EXS_ERR(UTIL, "u");

    const char *t = cap_text(&c);

    ck_assert_ptr_null(strstr(t, ": a\n"));
    ck_assert_ptr_nonnull(strstr(t, "exs err prov "));
    ck_assert_ptr_nonnull(strstr(t, "exs err cache "));
    ck_assert_ptr_null(strstr(t, ": u\n"));
    cap_end(&c);
}
END_TEST

START_TEST(test_errno_preserved)
{
    struct capture c;
    FILE *ro;

    cap_start(&c);
    errno = ENOENT;
    EXS_ERR(UTIL, "open: %m");
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_ptr_nonnull(strstr(cap_text(&c), "open: No such file or directory\n"));
    errno = EAGAIN;
    exs__log(EXS_LOG_DBG, EXS_SUB_UTIL, "f", 1, "%s", "x");
    ck_assert_int_eq(errno, EAGAIN);
    cap_end(&c);

    /* Even when the write itself fails (a read-only stream sets errno to EBADF). */
    ro = fopen("/dev/null", "r");
    ck_assert_ptr_nonnull(ro);
    exs__log_set_stream(ro);
    errno = EINTR;
    EXS_ERR(UTIL, "lost");
    ck_assert_int_eq(errno, EINTR);
    exs__log_set_stream(NULL);
    fclose(ro);
}
END_TEST

START_TEST(test_default_stderr)
{
    char path[] = "/tmp/exs_unit_logXXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    char buf[256] = "";
    FILE *other = tmpfile();

    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(saved, 0);
    ck_assert_ptr_nonnull(other);
    unlink(path);
    fflush(stderr);
    ck_assert_int_ge(dup2(fd, 2), 0);
    EXS_ERR(UTIL, "to stderr");
    exs__log_set_stream(other);
    EXS_ERR(UTIL, "to other");
    exs__log_set_stream(NULL); /* back to stderr */
    EXS_ERR(UTIL, "stderr again");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert_int_gt(pread(fd, buf, sizeof(buf) - 1, 0), 0);
    close(fd);
    fclose(other);
    ck_assert_ptr_nonnull(strstr(buf, ": to stderr\n"));
    ck_assert_ptr_null(strstr(buf, ": to other\n"));
    ck_assert_ptr_nonnull(strstr(buf, ": stderr again\n"));
}
END_TEST

START_TEST(test_init_env)
{
    struct capture c;

    setenv("EXS_LOG_LEVEL", "dbg", 1);
    setenv("EXS_LOG_SUBSYS", "prov,util", 1);
    exs__params_reset();
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_DBG);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_PROV | EXS_SUB_UTIL);

    /* Numbers work too; re-reading takes a reset. */
    setenv("EXS_LOG_LEVEL", "1", 1);
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_DBG);
    exs__params_reset();
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_ERR);

    /* A bad value keeps the default and warns (at the default level, warn). */
    setenv("EXS_LOG_LEVEL", "loud", 1);
    setenv("EXS_LOG_SUBSYS", "everything", 1);
    exs__params_reset();
    cap_start(&c);
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_WARN);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_ALL);
    ck_assert_ptr_nonnull(strstr(cap_text(&c), "EXS_LOG_LEVEL=\"loud\""));
    ck_assert_ptr_nonnull(strstr(cap_text(&c), "EXS_LOG_SUBSYS=\"everything\""));
    cap_end(&c);

    /* Unset: defaults. */
    unsetenv("EXS_LOG_LEVEL");
    unsetenv("EXS_LOG_SUBSYS");
    exs__log_level = EXS_LOG_NONE;
    exs__params_reset();
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_WARN);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_ALL);
}
END_TEST

#define LOG_THREADS 4
#define LOG_LINES   500

static void *log_thread(void *arg)
{
    int id = (int)(long)arg;

    for (int i = 0; i < LOG_LINES; i++)
        EXS_ERR(UTIL, "thread %d line %d %s", id, i, "padding-padding-padding-padding");
    return NULL;
}

START_TEST(test_threads)
{
    struct capture c;
    pthread_t th[LOG_THREADS];
    int seen[LOG_THREADS] = {0};
    char *text, *save = NULL;

    cap_start(&c);
    for (long i = 0; i < LOG_THREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, log_thread, (void *)i), 0);
    for (int i = 0; i < LOG_THREADS; i++)
        pthread_join(th[i], NULL);
    text = strdup(cap_text(&c));
    ck_assert_ptr_nonnull(text);
    /* Every line whole and in order per thread: no interleaving inside a line. */
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int id, n, end = 0;

        ck_assert_msg(sscanf(l,
                             "exs err util log_thread:%*d: thread %d line %d "
                             "padding-padding-padding-padding%n",
                             &id, &n, &end) == 2 &&
                          end == (int)strlen(l),
                      "bad line: %s", l);
        ck_assert_int_lt(id, LOG_THREADS);
        ck_assert_int_eq(n, seen[id]);
        seen[id]++;
    }
    for (int i = 0; i < LOG_THREADS; i++)
        ck_assert_int_eq(seen[i], LOG_LINES);
    free(text);
    cap_end(&c);
}
END_TEST

/* Count the lines of text containing needle. */
static int count_lines(const char *text, const char *needle)
{
    int n = 0;

    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);

        if (memmem(l, len, needle, strlen(needle)))
            n++;
        l = nl ? nl + 1 : NULL;
    }
    return n;
}

/* A storm from one call site: the burst, then nothing, then (after a refill) one line
 * preceded by the count of what was suppressed. Another site is not limited by it. */
START_TEST(test_rate_limit)
{
    struct capture c;
    const char *sup;
    char want[64];
    uint64_t before = exs__log_suppressed_total(), t0;
    int n, extra, first = 0;

    exs__params_load();
    ck_assert_int_eq(exs__params_set("log_rate_burst", "5"), 0);
    ck_assert_int_eq(exs__params_set("log_rate_per_s", "1"), 0);
    exs__log_level = EXS_LOG_WARN;
    cap_start(&c);
    t0 = exs__now_ns();
    for (int i = 0; i < 1000; i++)
        EXS_WARN(API, "storm %d", i);
    /* the burst, plus one line per whole second the loop took (none unless a loaded host
     * kept this thread off a CPU that long) */
    extra = (int)((exs__now_ns() - t0) / 1000000000u);
    EXS_WARN(API, "other site");
    n = count_lines(cap_text(&c), "storm");
    ck_assert_msg(n >= 5 && n <= 5 + extra, "%d storm lines, %d refills possible", n, extra);
    ck_assert_int_eq(count_lines(cap_text(&c), "other site"), 1);
    ck_assert_uint_eq(exs__log_suppressed_total() - before, (uint64_t)(1000 - n));
    cap_end(&c);

    /* one token refills per second: the site's next line carries the count */
    usleep(1100 * 1000);
    cap_start(&c);
    for (int i = 0; i < 3; i++)
        EXS_WARN(API, "storm2 %d", i);
    ck_assert_int_eq(count_lines(cap_text(&c), "storm2"), 3); /* a different site: its burst */
    cap_end(&c);

    cap_start(&c);
    extra = 0;
    for (int round = 0; round < 2; round++) {
        t0 = exs__now_ns();
        for (int i = 0; i < 1000; i++)
            EXS_ERR(PROTO, "flood %d", i);
        extra += (int)((exs__now_ns() - t0) / 1000000000u);
        if (round == 0) {
            first = count_lines(cap_text(&c), "flood");
            usleep(1100 * 1000);
        }
    }
    /* 5 (burst) + 1 after the refill (+ a loaded host's whole seconds inside the loops),
     * the refill's line preceded by "995 messages ... suppressed" */
    n = count_lines(cap_text(&c), "flood");
    ck_assert_msg(n >= 6 && n <= 6 + extra, "%d flood lines, %d extra refills possible", n, extra);
    snprintf(want, sizeof(want), "%d messages like the next suppressed", 1000 - first);
    sup = strstr(cap_text(&c), want);
    ck_assert_msg(sup != NULL, "no line \"%s\"", want);
    cap_end(&c);

    /* 0 turns the limit off; dbg lines are never limited */
    ck_assert_int_eq(exs__params_set("log_rate_burst", "0"), 0);
    cap_start(&c);
    for (int i = 0; i < 200; i++)
        EXS_WARN(API, "free %d", i);
    ck_assert_int_eq(count_lines(cap_text(&c), "free"), 200);
    cap_end(&c);
    ck_assert_int_eq(exs__params_set("log_rate_burst", "2"), 0);
    exs__log_level = EXS_LOG_DBG;
    cap_start(&c);
    for (int i = 0; i < 50; i++)
        EXS_DBG(API, "debug %d", i);
    ck_assert_int_eq(count_lines(cap_text(&c), "debug"), 50);
    cap_end(&c);
}
END_TEST

static char hook_buf[4096];
static size_t hook_len;

static void test_hook(const char *line, size_t len)
{
    if (hook_len + len < sizeof(hook_buf)) {
        memcpy(hook_buf + hook_len, line, len);
        hook_len += len;
    }
}

/* The hook sees each written line whole, and only lines that pass the filters. */
START_TEST(test_hook_sees_lines)
{
    struct capture c;

    exs__log_level = EXS_LOG_WARN;
    hook_len = 0;
    exs__log_set_hook(test_hook);
    cap_start(&c);
    EXS_WARN(ENG, "hooked %d", 7);
    EXS_INFO(ENG, "filtered");
    exs__log_set_hook(NULL);
    EXS_WARN(ENG, "after");
    hook_buf[hook_len] = '\0';
    ck_assert_ptr_nonnull(strstr(hook_buf, "exs warn eng"));
    ck_assert_ptr_nonnull(strstr(hook_buf, "hooked 7\n"));
    ck_assert_ptr_null(strstr(hook_buf, "filtered"));
    ck_assert_ptr_null(strstr(hook_buf, "after"));
    cap_end(&c);
}
END_TEST

Suite *util_log_suite(void)
{
    Suite *s = suite_create("util_log");
    TCase *tc = tcase_create("log");

    tcase_add_checked_fixture(tc, unit_env_clean, unit_env_clean);
    tcase_add_test(tc, test_level_parse);
    tcase_add_test(tc, test_subsys_parse);
    tcase_add_test(tc, test_format);
    tcase_add_test(tc, test_newline_and_long);
    tcase_add_test(tc, test_level_filter);
    tcase_add_test(tc, test_subsys_filter);
    tcase_add_test(tc, test_errno_preserved);
    tcase_add_test(tc, test_default_stderr);
    tcase_add_test(tc, test_init_env);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_rate_limit);
    tcase_add_test(tc, test_hook_sees_lines);
    suite_add_tcase(s, tc);
    return s;
}
