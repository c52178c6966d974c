/* SPDX-License-Identifier: MIT */
/* Unit tests of params.c and parse.c: the table, parsing, environment, set/get, printing. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/parse.h"
#include "tests/unit/unit.h"

static size_t type_size(enum exs_param_type t)
{
    switch (t) {
    case EXS_PARAM_UINT:
        return sizeof(uint64_t);
    case EXS_PARAM_BOOL:
        return sizeof(int);
    case EXS_PARAM_STRING:
        return EXS_PARAM_STR_MAX;
    }
    return 0;
}

START_TEST(test_table_shape)
{
    size_t n = 0, covered = 0;
    const struct exs_param_def *t = exs__params_table(&n);
    char env[128], buf[128];

    ck_assert_uint_ge(n, 12); /* the coverage check below catches a missing row */
    for (size_t i = 0; i < n; i++) {
        /* env = EXS_ + uppercase name */
        snprintf(env, sizeof(env), "EXS_%s", t[i].name);
        for (char *p = env; *p; p++)
            *p = (char)toupper((unsigned char)*p);
        ck_assert_str_eq(t[i].env, env);
        ck_assert_ptr_eq(exs__params_find(t[i].name), &t[i]);
        ck_assert_uint_gt(strlen(t[i].help), 10);
        ck_assert_ptr_null(strchr(t[i].help, '\n'));
        /* Rows in field order, each field once, nothing of the struct left out. */
        ck_assert_uint_eq(t[i].offset, covered);
        covered += type_size(t[i].type);
        /* The default is a valid value and reads back as written. */
        ck_assert_int_eq(exs__params_set(t[i].name, t[i].defval), 0);
        ck_assert_int_eq(exs__params_get(t[i].name, buf, sizeof(buf)), 0);
        if (strcmp(t[i].name, "mem_budget") == 0) /* auto: computed, a number */
            ck_assert_uint_gt(strtoull(buf, NULL, 10), 0);
        else
            ck_assert_str_eq(buf, t[i].defval);
        /* online: the log settings, the adaptive spin, the close timeout, the deadlines,
         * keepalive, the window, fragmentation and the work-request cap (issue 13, read at
         * each use), the bound of connections resuming, the listeners' bounds (read at each
         * request), the fault provider's faults, the control client timeout, the slow-poll and
         * slow-pass thresholds and trace sampling, the exit linger (read at exit); the rest is
         * start-up only */
        /* and the tcp provider's hello deadline and bound (read at each accept) */
        ck_assert_int_eq(
            t[i].online,
            strncmp(t[i].name, "log_", 4) == 0 || strncmp(t[i].name, "tcp_hello_", 10) == 0 ||
                strcmp(t[i].name, "qspin_us") == 0 || strcmp(t[i].name, "qwait_spin_us") == 0 ||
                strcmp(t[i].name, "qwait_spin_max_us") == 0 ||
                strcmp(t[i].name, "close_timeout_ms") == 0 ||
                strcmp(t[i].name, "exit_linger_ms") == 0 ||
                strcmp(t[i].name, "keepalive_intv_ms") == 0 ||
                strcmp(t[i].name, "keepalive_probes") == 0 ||
                strcmp(t[i].name, "connect_timeout_ms") == 0 ||
                strcmp(t[i].name, "resume_max") == 0 || strcmp(t[i].name, "mem_budget") == 0 ||
                strcmp(t[i].name, "send_timeout_ms") == 0 ||
                strcmp(t[i].name, "emu_blackhole") == 0 || strcmp(t[i].name, "ack_every") == 0 ||
                strcmp(t[i].name, "window_test") == 0 || strcmp(t[i].name, "frag_size") == 0 ||
                strcmp(t[i].name, "wr_max") == 0 || strcmp(t[i].name, "send_unsignaled") == 0 ||
                strncmp(t[i].name, "listen_", 7) == 0 || strncmp(t[i].name, "fault_", 6) == 0 ||
                strcmp(t[i].name, "ctl_timeout_ms") == 0 ||
                strcmp(t[i].name, "polling_warn_cycle_us") == 0 ||
                strcmp(t[i].name, "slow_threshold_us") == 0 ||
                strcmp(t[i].name, "trace_sample_mask") == 0);
    }
    ck_assert_uint_eq(covered, sizeof(struct exs_params));
    ck_assert_ptr_null(exs__params_find("nope"));
    ck_assert_ptr_null(exs__params_find("EXS_LOG_LEVEL"));
}
END_TEST

START_TEST(test_defaults)
{
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_str_eq(exs__params.log_level, "warn");
    ck_assert_str_eq(exs__params.log_subsys, "all");
    ck_assert_str_eq(exs__params.provider, "");
    ck_assert_uint_eq(exs__params.emu_delay_us, 0);
    ck_assert_uint_eq(exs__params.emu_rate_mbps, 0);
    ck_assert_uint_eq(exs__params.tcp_rnr_retry, 7);
    ck_assert_uint_eq(exs__params.tcp_rnr_timer_ms, 1);
    ck_assert_uint_eq(exs__params.tcp_max_inline, 256);
    ck_assert_uint_eq(exs__params.tcp_max_sge, 16);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 4096);
    ck_assert_uint_eq(exs__params.tcp_cq_size, 65536);
    ck_assert_uint_eq(exs__params.tcp_max_msg, 1073741824);
    ck_assert_uint_eq(exs__params.tcp_hello_ms, 5000);
    ck_assert_uint_eq(exs__params.tcp_hello_max, 1024);
    /* their ranges, and online after the load (read at each accept) */
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "0"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "3600001"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_hello_max", "0"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_hello_max", "1048577"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", "250"), 0);
    ck_assert_uint_eq(exs__params.tcp_hello_ms, 250);
    ck_assert_int_eq(exs__log_level, EXS_LOG_WARN);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_ALL);
}
END_TEST

START_TEST(test_parse_uint)
{
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {
        {"0", 0},
        {"42", 42},
        {"010", 10},
        {"0x1F", 31},
        {"0XfF", 255},
        {"1k", 1024},
        {"1K", 1024},
        {"3m", 3u << 20},
        {"2G", 2ull << 30},
        {"0x10k", 16384},
        {"18446744073709551615", UINT64_MAX},
        {"17179869183g", 17179869183ull << 30},
    };
    static const struct {
        const char *s;
        int rc;
    } bad[] = {
        {"", -EINVAL},
        {"-1", -EINVAL},
        {"+1", -EINVAL},
        {" 1", -EINVAL},
        {"1 ", -EINVAL},
        {"abc", -EINVAL},
        {"12x", -EINVAL},
        {"0x", -EINVAL},
        {"0xg", -EINVAL},
        {"1kk", -EINVAL},
        {"1kb", -EINVAL},
        {"k", -EINVAL},
        {"1.5", -EINVAL},
        {"1t", -EINVAL},
        {"0x-1", -EINVAL},
        {"18446744073709551616", -ERANGE},
        {"99999999999999999999999", -ERANGE},
        {"17179869184g", -ERANGE},
        {"0x10000000000000000", -ERANGE},
        {"18014398509481984k", -ERANGE},
    };
    uint64_t v;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = 12345;
        ck_assert_msg(exs__parse_uint(good[i].s, &v) == 0, "%s rejected", good[i].s);
        ck_assert_msg(v == good[i].v, "%s parsed as %llu", good[i].s, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 12345;
        ck_assert_msg(exs__parse_uint(bad[i].s, &v) == bad[i].rc, "\"%s\" not rejected", bad[i].s);
        ck_assert_uint_eq(v, 12345);
    }
    ck_assert_int_eq(exs__parse_uint(NULL, &v), -EINVAL);
}
END_TEST

START_TEST(test_parse_bool)
{
    static const char *const yes[] = {"1", "yes", "YES", "on", "On", "true", "TRUE"};
    static const char *const no[] = {"0", "no", "NO", "off", "Off", "false", "False"};
    static const char *const bad[] = {"", "2", "y", "n", "tru", "yes ", " no", "01", "enable"};
    int v;

    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        v = -1;
        ck_assert_int_eq(exs__parse_bool(yes[i], &v), 0);
        ck_assert_int_eq(v, 1);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        v = -1;
        ck_assert_int_eq(exs__parse_bool(no[i], &v), 0);
        ck_assert_int_eq(v, 0);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = -1;
        ck_assert_msg(exs__parse_bool(bad[i], &v) == -EINVAL, "\"%s\" accepted", bad[i]);
        ck_assert_int_eq(v, -1);
    }
    ck_assert_int_eq(exs__parse_bool(NULL, &v), -EINVAL);
}
END_TEST

START_TEST(test_env_applied)
{
    setenv("EXS_TCP_MAX_WR", "2k", 1);
    setenv("EXS_PROVIDER", "tcp", 1);
    setenv("EXS_EMU_DELAY_US", "0x10", 1);
    setenv("EXS_TCP_MAX_MSG", "4m", 1);
    setenv("EXS_TCP_RNR_RETRY", "0", 1);
    setenv("EXS_LOG_LEVEL", "trace", 1);
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 2048);
    ck_assert_str_eq(exs__params.provider, "tcp");
    ck_assert_uint_eq(exs__params.emu_delay_us, 16);
    ck_assert_uint_eq(exs__params.tcp_max_msg, 4u << 20);
    ck_assert_uint_eq(exs__params.tcp_rnr_retry, 0);
    ck_assert_uint_eq(exs__params.tcp_max_sge, 16); /* untouched */
    ck_assert_int_eq(exs__log_level, EXS_LOG_TRACE);

    /* The first load wins until reset. */
    setenv("EXS_TCP_MAX_WR", "100", 1);
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 2048);
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 100);
    setenv("EXS_PROVIDER", "verbs", 1);
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_str_eq(exs__params.provider, "verbs");
}
END_TEST

START_TEST(test_env_invalid)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    ck_assert_ptr_nonnull(f);
    exs__log_set_stream(f);
    setenv("EXS_TCP_RNR_RETRY", "8", 1);
    setenv("EXS_TCP_MAX_SGE", "abc", 1);
    setenv("EXS_PROVIDER", "rxe", 1);
    setenv("EXS_TCP_CQ_SIZE", "-1", 1);
    setenv("EXS_TCP_MAX_WR", "100", 1);
    exs__params_reset();
    ck_assert_int_eq(exs__params_load(), -EINVAL);
    ck_assert_int_eq(exs__params_load(), -EINVAL); /* remembered */
    ck_assert_uint_eq(exs__params.tcp_rnr_retry, 7);
    ck_assert_uint_eq(exs__params.tcp_max_sge, 16);
    ck_assert_str_eq(exs__params.provider, "");
    ck_assert_uint_eq(exs__params.tcp_cq_size, 65536);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 100); /* the valid ones still apply */
    fflush(f);
    ck_assert_ptr_nonnull(strstr(text, "exs warn util "));
    ck_assert_ptr_nonnull(strstr(text, "EXS_TCP_RNR_RETRY=\"8\""));
    ck_assert_ptr_nonnull(strstr(text, "EXS_TCP_MAX_SGE=\"abc\""));
    ck_assert_ptr_nonnull(strstr(text, "EXS_PROVIDER=\"rxe\""));
    ck_assert_ptr_nonnull(strstr(text, "EXS_TCP_CQ_SIZE=\"-1\""));
    ck_assert_ptr_null(strstr(text, "EXS_TCP_MAX_WR"));
    exs__log_set_stream(NULL);
    fclose(f);
    free(text);
}
END_TEST

START_TEST(test_set_before_load)
{
    char long_name[EXS_PARAM_STR_MAX + 1];

    /* Offline tunables can be set before the load; the environment still overrides. */
    ck_assert_int_eq(exs__params_set("tcp_max_wr", "1k"), 0);
    ck_assert_int_eq(exs__params_set("tcp_max_sge", "4"), 0);
    setenv("EXS_TCP_MAX_SGE", "8", 1);
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 1024);
    ck_assert_uint_eq(exs__params.tcp_max_sge, 8);
    exs__params_reset();

    ck_assert_int_eq(exs__params_set("provider", "tcp"), 0);
    ck_assert_str_eq(exs__params.provider, "tcp");
    ck_assert_int_eq(exs__params_set("provider", "verbs"), 0);
    ck_assert_int_eq(exs__params_set("provider", ""), 0);
    ck_assert_str_eq(exs__params.provider, "");
    ck_assert_int_eq(exs__params_set("provider", "rxe"), -EINVAL);
    ck_assert_int_eq(exs__params_set("provider", "TCP"), -EINVAL);
    ck_assert_str_eq(exs__params.provider, "");
    ck_assert_int_eq(exs__params_set("tcp_rnr_retry", "0"), 0);
    ck_assert_int_eq(exs__params_set("tcp_rnr_retry", "7"), 0);
    ck_assert_int_eq(exs__params_set("tcp_rnr_retry", "8"), -EINVAL);
    ck_assert_uint_eq(exs__params.tcp_rnr_retry, 7);
    ck_assert_int_eq(exs__params_set("tcp_max_msg", "-1"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_max_msg", "18446744073709551616"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_max_msg", "1x"), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_max_msg", NULL), -EINVAL);
    ck_assert_int_eq(exs__params_set("tcp_max_msg", "2g"), 0);
    ck_assert_uint_eq(exs__params.tcp_max_msg, 2ull << 30);
    /* shm rings: a power of two of KiB within 64-262144 */
    ck_assert_uint_eq(exs__params.shm_ring_kb, 4096);
    ck_assert_int_eq(exs__params_set("shm_ring_kb", "64"), 0);
    ck_assert_int_eq(exs__params_set("shm_ring_kb", "262144"), 0);
    ck_assert_int_eq(exs__params_set("shm_ring_kb", "32"), -EINVAL);
    ck_assert_int_eq(exs__params_set("shm_ring_kb", "524288"), -EINVAL);
    ck_assert_int_eq(exs__params_set("shm_ring_kb", "96"), -EINVAL);
    ck_assert_uint_eq(exs__params.shm_ring_kb, 262144);
    memset(long_name, 'a', EXS_PARAM_STR_MAX);
    long_name[EXS_PARAM_STR_MAX] = '\0';
    ck_assert_int_eq(exs__params_set("log_subsys", long_name), -EINVAL);
    ck_assert_int_eq(exs__params_set("nope", "1"), -ENOENT);
    ck_assert_int_eq(exs__params_set(NULL, "1"), -ENOENT);
}
END_TEST

START_TEST(test_set_after_load)
{
    ck_assert_int_eq(exs__params_load(), 0);
    /* Offline: refused, unchanged. */
    ck_assert_int_eq(exs__params_set("tcp_max_wr", "8"), -EPERM);
    ck_assert_uint_eq(exs__params.tcp_max_wr, 4096);
    ck_assert_int_eq(exs__params_set("provider", "tcp"), -EPERM);
    ck_assert_str_eq(exs__params.provider, "");
    ck_assert_int_eq(exs__params_set("nope", "1"), -ENOENT);
    /* Online: the log rows, which drive the logger. */
    ck_assert_int_eq(exs__params_set("log_level", "dbg"), 0);
    ck_assert_str_eq(exs__params.log_level, "dbg");
    ck_assert_int_eq(exs__log_level, EXS_LOG_DBG);
    ck_assert_int_eq(exs__params_set("log_level", "1"), 0);
    ck_assert_int_eq(exs__log_level, EXS_LOG_ERR);
    ck_assert_int_eq(exs__params_set("log_level", "bogus"), -EINVAL);
    ck_assert_int_eq(exs__log_level, EXS_LOG_ERR);
    ck_assert_str_eq(exs__params.log_level, "1");
    ck_assert_int_eq(exs__params_set("log_subsys", "prov,proto"), 0);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_PROV | EXS_SUB_PROTO);
    ck_assert_int_eq(exs__params_set("log_subsys", "prov,"), -EINVAL);
    ck_assert_uint_eq(exs__log_subsys, EXS_SUB_PROV | EXS_SUB_PROTO);
    /* exs__log_init reapplies the current (set) values. */
    exs__log_level = EXS_LOG_NONE;
    exs__log_init();
    ck_assert_int_eq(exs__log_level, EXS_LOG_ERR);
}
END_TEST

START_TEST(test_get)
{
    char buf[64];
    char small[4];

    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_int_eq(exs__params_get("tcp_max_msg", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "1073741824");
    ck_assert_int_eq(exs__params_get("provider", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(exs__params_get("log_subsys", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "all");
    ck_assert_int_eq(exs__params_get("tcp_max_wr", small, sizeof(small)), -ENOSPC);
    ck_assert_int_eq(exs__params_get("tcp_max_inline", small, sizeof(small)), 0);
    ck_assert_str_eq(small, "256");
    ck_assert_int_eq(exs__params_get("log_level", small, 4), -ENOSPC);
    ck_assert_int_eq(exs__params_get("nope", buf, sizeof(buf)), -ENOENT);
}
END_TEST

static char *print_to_string(int markdown)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    ck_assert_ptr_nonnull(f);
    exs__params_print(f, markdown);
    fclose(f);
    return text;
}

START_TEST(test_print_human)
{
    char *text;
    size_t n;
    const struct exs_param_def *t = exs__params_table(&n);
    int lines = 0;

    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_int_eq(exs__params_set("log_level", "trace"), 0);
    text = print_to_string(0);
    ck_assert_ptr_nonnull(strstr(text, "NAME"));
    ck_assert_ptr_nonnull(strstr(text, "VARIABLE"));
    ck_assert_ptr_nonnull(strstr(text, "DEFAULT"));
    for (size_t i = 0; i < n; i++) {
        char *row = text, *eol;

        /* the row that begins with the name (a name may be in another row's text) */
        while (row && (strncmp(row, t[i].name, strlen(t[i].name)) || row[strlen(t[i].name)] != ' '))
            row = (row = strchr(row, '\n')) ? row + 1 : NULL;

        ck_assert_ptr_nonnull(row);
        eol = strchr(row, '\n');
        ck_assert_ptr_nonnull(eol);
        *eol = '\0';
        ck_assert_ptr_nonnull(strstr(row, t[i].env));
        ck_assert_ptr_nonnull(strstr(row, t[i].help));
        ck_assert_ptr_nonnull(strstr(row, t[i].online ? " online " : " offline "));
        if (strcmp(t[i].name, "log_level") == 0) {
            ck_assert_ptr_nonnull(strstr(row, "\"trace\""));
            ck_assert_ptr_nonnull(strstr(row, "\"warn\""));
        }
        *eol = '\n';
    }
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, (int)n + 1);
    free(text);
}
END_TEST

START_TEST(test_print_markdown)
{
    char *text, *p;
    size_t n;
    const struct exs_param_def *t = exs__params_table(&n);
    int rows = 0;

    /* The current values never appear: the file must not depend on the environment. */
    ck_assert_int_eq(exs__params_load(), 0);
    ck_assert_int_eq(exs__params_set("log_level", "trace"), 0);
    text = print_to_string(1);
    ck_assert_int_eq(strncmp(text, "# ", 2), 0);
    ck_assert_ptr_nonnull(strstr(text, "`build/tools/exsctl params --markdown`"));
    ck_assert_ptr_nonnull(strstr(text, "\n| Name | Variable | Default | Online | Description |\n"
                                       "|------|----------|---------|--------|-------------|\n"));
    ck_assert_ptr_null(strstr(text, "trace`"));
    ck_assert_ptr_nonnull(strstr(text, "\n| `log_level` | `EXS_LOG_LEVEL` | `warn` | online | "));
    ck_assert_ptr_nonnull(strstr(text, "\n| `provider` | `EXS_PROVIDER` | (empty) | offline | "));
    ck_assert_ptr_nonnull(
        strstr(text, "\n| `tcp_max_msg` | `EXS_TCP_MAX_MSG` | `1073741824` | offline | "));
    for (p = text; (p = strstr(p, "\n| `")); p++)
        rows++;
    ck_assert_int_eq(rows, (int)n);
    ck_assert_int_eq(text[strlen(text) - 1], '\n');
    for (size_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(strstr(text, t[i].help));
    free(text);
}
END_TEST

#define LOAD_THREADS 8

static void *load_thread(void *arg)
{
    int *rc = arg;

    *rc = exs__params_load();
    return NULL;
}

START_TEST(test_load_threads)
{
    pthread_t th[LOAD_THREADS];
    int rc[LOAD_THREADS];
    FILE *null = fopen("/dev/null", "w");

    ck_assert_ptr_nonnull(null);
    exs__log_set_stream(null); /* the "bad" rounds warn */
    for (int round = 0; round < 20; round++) {
        setenv("EXS_TCP_MAX_SGE", round % 2 ? "bad" : "3", 1);
        exs__params_reset();
        for (int i = 0; i < LOAD_THREADS; i++)
            ck_assert_int_eq(pthread_create(&th[i], NULL, load_thread, &rc[i]), 0);
        for (int i = 0; i < LOAD_THREADS; i++) {
            pthread_join(th[i], NULL);
            ck_assert_int_eq(rc[i], round % 2 ? -EINVAL : 0);
        }
        ck_assert_uint_eq(exs__params.tcp_max_sge, round % 2 ? 16 : 3);
    }
    exs__log_set_stream(NULL);
    fclose(null);
}
END_TEST

Suite *util_params_suite(void)
{
    Suite *s = suite_create("util_params");
    TCase *tc = tcase_create("params");

    tcase_add_checked_fixture(tc, unit_env_clean, unit_env_clean);
    tcase_add_test(tc, test_table_shape);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_parse_uint);
    tcase_add_test(tc, test_parse_bool);
    tcase_add_test(tc, test_env_applied);
    tcase_add_test(tc, test_env_invalid);
    tcase_add_test(tc, test_set_before_load);
    tcase_add_test(tc, test_set_after_load);
    tcase_add_test(tc, test_get);
    tcase_add_test(tc, test_print_human);
    tcase_add_test(tc, test_print_markdown);
    tcase_add_test(tc, test_load_threads);
    suite_add_tcase(s, tc);
    return s;
}
