/* SPDX-License-Identifier: MIT */
/* exsctl metrics: the stat replies of libexs processes (every connection's EXS_SO_STATS and
 * state, the process's counter sets) in the Prometheus text exposition format, version
 * 0.0.4 (spec/observability.md §9): on stdout, or written periodically into a directory
 * of node_exporter's textfile collector (a temporary file renamed over the old one). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exs/ctl/ctl.h"
#include "exs/ctl/ctl_fields.h"
#include "exs/util/json.h"
#include "tools/exsctl_metrics.h"

#define METRICS_PROCS    1024
#define METRICS_FAMILIES 512
#define METRICS_NAME_MAX 128
#define METRICS_FILE     "exs.prom"

/* Where a family's samples come from. */
enum fam_src {
    SRC_CONN,    /* a numeric member of each conns[] row: one sample per socket */
    SRC_PROCSUM, /* the same member summed over the process's sockets */
    SRC_SET,     /* a counter of a registered set (counters[] rows), summed per process */
};

struct family {
    char name[METRICS_NAME_MAX]; /* metric name, with _total for a counter */
    char key[METRICS_NAME_MAX];  /* the member (SRC_CONN, SRC_PROCSUM) or counter name */
    char set[METRICS_NAME_MAX];  /* SRC_SET: the set's name */
    const char *help;
    int counter;  /* else a gauge */
    double scale; /* value * scale: microseconds and milliseconds become seconds */
    enum fam_src src;
};

static const struct {
    const char *name;
    char kind;
    const char *help;
} stat_fields[] = {
#define STAT_ROW(_f, _kind, _help) {#_f, _kind, _help},
    EXS_CTL_STAT_FIELDS(STAT_ROW)
#undef STAT_ROW
};

/* The members of a conns[] row besides EXS_SO_STATS (ctl_reply.c stat_sock): gauges. */
static const struct {
    const char *name, *help;
    int summed; /* meaningful added up over a process's sockets */
} conn_gauges[] = {
    {"credits", "messages this side may still send (credits)", 1},
    {"peer_credits", "the peer's posted receives (this side's initial credits)", 1},
    {"sends_out", "sends posted by the application, not completed", 1},
    {"recvs_out", "receives posted by the application, not completed", 1},
    {"wr_out", "work requests posted to the provider, not completed", 1},
    {"pending", "arrived messages not yet matched to a receive", 1},
    {"adverts_held", "ADVERTs received, not used yet", 1},
    {"wrq_depth", "send work requests waiting behind the per-connection cap now", 1},
    {"age_ms", "time since the connection was created, milliseconds", 0},
};

/* Not exported as a number: what identifies the row. */
static int conn_label_member(const char *key)
{
    return !strcmp(key, "fd");
}

/* ---- names and escaping ---- */

/* name: prefix + raw, every character outside [a-zA-Z0-9_] made '_'; a time unit ending
 * (_us, _ms) becomes _seconds with *scale set; _total appended for a counter. */
static void metric_name(char *out, size_t size, const char *prefix, const char *raw, int counter,
                        double *scale)
{
    size_t len = strlen(raw), n;
    const char *unit = "";

    *scale = 1;
    if (len > 3 && !strcmp(raw + len - 3, "_us")) {
        len -= 3, *scale = 1e-6, unit = "_seconds";
    } else if (len > 3 && !strcmp(raw + len - 3, "_ms")) {
        len -= 3, *scale = 1e-3, unit = "_seconds";
    }
    n = (size_t)snprintf(out, size, "%s%.*s%s%s", prefix, (int)len, raw, unit,
                         counter ? "_total" : "");
    for (size_t i = 0; i < size && i < n && out[i]; i++) {
        char c = out[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            out[i] = '_';
    }
}

/* A label value or HELP text: backslash, newline (and in a label value the double
 * quote) escaped as the exposition format says. */
static void put_escaped(FILE *f, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (*s == '"' && quote)
            fputs("\\\"", f);
        else
            fputc(*s, f);
    }
}

static void put_label(FILE *f, int first, const char *name, const char *value)
{
    fprintf(f, "%s%s=\"", first ? "" : ",", name);
    put_escaped(f, value, 1);
    fputc('"', f);
}

static void put_proc_labels(FILE *f, const struct exs_json *p)
{
    char pid[24];

    snprintf(pid, sizeof(pid), "%" PRIu64, exs__json_get_u64(p, "pid"));
    put_label(f, 1, "pid", pid);
    put_label(f, 0, "prog", exs__json_get_str(p, "prog"));
}

/* The labels of one socket: its process, descriptor, type, provider and addresses. */
static void put_conn_labels(FILE *f, const struct exs_json *p, const struct exs_json *c)
{
    char fd[24];

    put_proc_labels(f, p);
    snprintf(fd, sizeof(fd), "%" PRIu64, exs__json_get_u64(c, "fd"));
    put_label(f, 0, "fd", fd);
    put_label(f, 0, "type", exs__json_get_str(c, "type"));
    put_label(f, 0, "provider", exs__json_get_str(c, "provider"));
    put_label(f, 0, "device", exs__json_get_str(c, "device"));
    put_label(f, 0, "local", exs__json_get_str(c, "local"));
    put_label(f, 0, "peer", exs__json_get_str(c, "peer"));
}

static void put_value(FILE *f, uint64_t v, double scale)
{
    if (scale == 1)
        fprintf(f, " %" PRIu64 "\n", v);
    else
        fprintf(f, " %.9g\n", (double)v * scale);
}

static void put_head(FILE *f, const char *name, const char *help, const char *type)
{
    fprintf(f, "# HELP %s ", name);
    put_escaped(f, help, 0);
    fprintf(f, "\n# TYPE %s %s\n", name, type);
}

/* ---- families ---- */

struct families {
    struct family f[METRICS_FAMILIES];
    int n;
};

/* Add a family unless one of that name is there (two raw names may map to one). */
static struct family *fam_add(struct families *fs, const char *prefix, const char *raw, int counter,
                              const char *help, enum fam_src src)
{
    struct family *f;
    char name[METRICS_NAME_MAX];
    double scale;

    metric_name(name, sizeof(name), prefix, raw, counter, &scale);
    for (int i = 0; i < fs->n; i++)
        if (!strcmp(fs->f[i].name, name))
            return NULL;
    if (fs->n == METRICS_FAMILIES)
        return NULL;
    f = &fs->f[fs->n++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->key, sizeof(f->key), "%s", raw);
    f->help = help;
    f->counter = counter;
    f->scale = scale;
    f->src = src;
    return f;
}

static int known_member(const char *key)
{
    for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++)
        if (!strcmp(stat_fields[i].name, key))
            return 1;
    for (size_t i = 0; i < sizeof(conn_gauges) / sizeof(conn_gauges[0]); i++)
        if (!strcmp(conn_gauges[i].name, key))
            return 1;
    return 0;
}

/* Every family: EXS_SO_STATS and the conn gauges (per socket, and summed per process),
 * numeric members this exsctl does not know (a newer library: gauges), and every counter
 * of every set the processes report. */
static void fam_collect(struct families *fs, struct exsctl_stat *r, int n)
{
    for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
        int counter = stat_fields[i].kind == 'c';

        fam_add(fs, "exs_conn_", stat_fields[i].name, counter, stat_fields[i].help, SRC_CONN);
        if (stat_fields[i].kind != 'v')
            fam_add(fs, "exs_process_", stat_fields[i].name, counter, stat_fields[i].help,
                    SRC_PROCSUM);
    }
    for (size_t i = 0; i < sizeof(conn_gauges) / sizeof(conn_gauges[0]); i++) {
        fam_add(fs, "exs_conn_", conn_gauges[i].name, 0, conn_gauges[i].help, SRC_CONN);
        if (conn_gauges[i].summed)
            fam_add(fs, "exs_process_", conn_gauges[i].name, 0, conn_gauges[i].help, SRC_PROCSUM);
    }
    for (int p = 0; p < n; p++) {
        const struct exs_json *conns = exs__json_get(r[p].j, "conns");
        const struct exs_json *sets = exs__json_get(r[p].j, "counters");

        for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next)
            for (const struct exs_json *m = c->child; m; m = m->next)
                if (m->type == EXS_JSON_NUM && m->key && !conn_label_member(m->key) &&
                    !known_member(m->key))
                    fam_add(fs, "exs_conn_", m->key, 0,
                            "a per-connection value this exsctl has no description of", SRC_CONN);
        for (const struct exs_json *c = sets ? sets->child : NULL; c; c = c->next) {
            const char *set = exs__json_get_str(c, "set"), *help = exs__json_get_str(c, "help");
            char raw[2 * METRICS_NAME_MAX];
            struct family *f;

            snprintf(raw, sizeof(raw), "%s_%s", set, exs__json_get_str(c, "name"));
            f = fam_add(fs, "exs_", raw, !strstr(help, "(gauge)"),
                        help[0] ? help : "a counter of the library", SRC_SET);
            if (f) {
                snprintf(f->set, sizeof(f->set), "%s", set);
                snprintf(f->key, sizeof(f->key), "%s", exs__json_get_str(c, "name"));
            }
        }
    }
}

/* A set counter of a process: summed over its sets of that name. */
static uint64_t set_value(const struct exs_json *p, const struct family *f, int *found)
{
    const struct exs_json *sets = exs__json_get(p, "counters");
    uint64_t sum = 0;

    *found = 0;
    for (const struct exs_json *c = sets ? sets->child : NULL; c; c = c->next)
        if (!strcmp(exs__json_get_str(c, "set"), f->set) &&
            !strcmp(exs__json_get_str(c, "name"), f->key)) {
            sum += exs__json_get_u64(c, "value");
            *found = 1;
        }
    return sum;
}

static void fam_print(FILE *out, const struct family *f, struct exsctl_stat *r, int n)
{
    put_head(out, f->name, f->help, f->counter ? "counter" : "gauge");
    for (int p = 0; p < n; p++) {
        const struct exs_json *conns = exs__json_get(r[p].j, "conns");
        uint64_t sum = 0;
        int found = f->src == SRC_PROCSUM;

        for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next) {
            const struct exs_json *m = exs__json_get(c, f->key);

            if (!m || m->type != EXS_JSON_NUM)
                continue;
            if (f->src == SRC_CONN) {
                fprintf(out, "%s{", f->name);
                put_conn_labels(out, r[p].j, c);
                fputc('}', out);
                put_value(out, exs__json_get_u64(c, f->key), f->scale);
            }
            sum += exs__json_get_u64(c, f->key);
        }
        if (f->src == SRC_SET)
            sum = set_value(r[p].j, f, &found);
        if (f->src != SRC_CONN && found) {
            fprintf(out, "%s{", f->name);
            put_proc_labels(out, r[p].j);
            fputc('}', out);
            put_value(out, sum, f->scale);
        }
    }
}

/* A family of one sample per process: the member key of its reply, times scale. */
static void proc_family(FILE *out, struct exsctl_stat *r, int n, const char *name, const char *help,
                        const char *type, const char *key, double scale)
{
    put_head(out, name, help, type);
    for (int p = 0; p < n; p++) {
        fprintf(out, "%s{", name);
        put_proc_labels(out, r[p].j);
        fputc('}', out);
        put_value(out, exs__json_get_u64(r[p].j, key), scale);
    }
}

/* The whole exposition of n processes. */
static void metrics_write(FILE *out, struct exsctl_stat *r, int n)
{
    static struct families fs;

    put_head(out, "exs_processes", "libexs processes whose control endpoint answered", "gauge");
    fprintf(out, "exs_processes %d\n", n);
    put_head(out, "exs_process_info",
             "a libexs process: its primary provider, control protocol version and log level",
             "gauge");
    for (int p = 0; p < n; p++) {
        fputs("exs_process_info{", out);
        put_proc_labels(out, r[p].j);
        put_label(out, 0, "provider", exs__json_get_str(r[p].j, "provider"));
        put_label(out, 0, "version", exs__json_get_str(r[p].j, "version"));
        put_label(out, 0, "log_level", exs__json_get_str(r[p].j, "log_level"));
        fputs("} 1\n", out);
    }
    proc_family(out, r, n, "exs_process_uptime_seconds", "time since the control endpoint started",
                "gauge", "uptime_ms", 1e-3);
    proc_family(out, r, n, "exs_process_log_suppressed_total",
                "log lines suppressed by rate limiting", "counter", "log_suppressed", 1);
    put_head(out, "exs_process_sockets", "exs sockets open (listeners included)", "gauge");
    for (int p = 0; p < n; p++) {
        const struct exs_json *conns = exs__json_get(r[p].j, "conns");
        uint64_t k = 0;

        for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next)
            k++;
        fputs("exs_process_sockets{", out);
        put_proc_labels(out, r[p].j);
        fputc('}', out);
        put_value(out, k, 1);
    }
    put_head(out, "exs_conn_info",
             "an exs socket (value 1): its state (LISTENING for a listener), the connection's "
             "protocol state, transfer mode and phase",
             "gauge");
    for (int p = 0; p < n; p++) {
        const struct exs_json *conns = exs__json_get(r[p].j, "conns");

        for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next) {
            fputs("exs_conn_info{", out);
            put_conn_labels(out, r[p].j, c);
            put_label(out, 0, "state", exs__json_get_str(c, "state"));
            put_label(out, 0, "conn_state", exs__json_get_str(c, "conn_state"));
            put_label(out, 0, "mode", exs__json_get_str(c, "mode"));
            put_label(out, 0, "phase", exs__json_get_str(c, "phase"));
            fputs("} 1\n", out);
        }
    }
    fs.n = 0;
    fam_collect(&fs, r, n);
    for (int i = 0; i < fs.n; i++)
        fam_print(out, &fs.f[i], r, n);
}

/* ---- the command ---- */

static volatile sig_atomic_t metrics_stop;

static void metrics_on_signal(int sig)
{
    (void)sig;
    metrics_stop = 1;
}

/* One round: gather, then write to stdout or to dir (tmp file, fsync, rename). */
static int metrics_round(int pid, const char *dir)
{
    static struct exsctl_stat r[METRICS_PROCS];
    char tmp[4096], path[4096];
    int n = exsctl_stat_gather(pid, r, METRICS_PROCS), ret = 0, fd;
    FILE *f;

    if (n < 0 && !dir)
        return 1;
    if (n < 0)
        n = 0; /* the file says: no process (its series end) */
    if (!dir) {
        metrics_write(stdout, r, n);
        ret = fflush(stdout) == 0 ? 0 : 1;
        goto out;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, METRICS_FILE);
    /* node_exporter reads *.prom only: the temporary name is not one */
    snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, METRICS_FILE, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    f = fd < 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        fprintf(stderr, "exsctl metrics: %s: %s\n", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        ret = 1;
        goto out;
    }
    metrics_write(f, r, n);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || ferror(f)) {
        fprintf(stderr, "exsctl metrics: writing %s: %s\n", tmp, strerror(errno));
        ret = 1;
    }
    if (fclose(f) != 0)
        ret = 1;
    if (ret == 0 && rename(tmp, path) != 0) {
        fprintf(stderr, "exsctl metrics: rename %s to %s: %s\n", tmp, path, strerror(errno));
        ret = 1;
    }
    if (ret != 0)
        unlink(tmp);
out:
    for (int i = 0; i < n; i++)
        exsctl_stat_free(&r[i]);
    return ret;
}

void exsctl_metrics_usage(FILE *f)
{
    fprintf(f, "  metrics [PID]           every counter of every libexs process (or PID's), "
               "per connection and in total, in Prometheus text format\n"
               "  metrics [PID] --textfile DIR [--interval S] [--count N]  write DIR/" METRICS_FILE
               " every S seconds (default 15; N rounds, default until killed) for "
               "node_exporter's textfile collector\n");
}

int exsctl_metrics(int argc, char **argv)
{
    const char *dir = NULL;
    double interval = 15;
    long count = 0;
    int pid = -1, ret = 0;

    for (int i = 1; i < argc; i++) {
        char *end;

        if (!strcmp(argv[i], "--textfile") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
            interval = strtod(argv[++i], &end);
            if (*end || !(interval > 0 && interval <= 86400))
                goto usage;
        } else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
            count = strtol(argv[++i], &end, 10);
            if (*end || count < 1)
                goto usage;
        } else {
            long v = strtol(argv[i], &end, 10);

            if (pid > 0 || end == argv[i] || *end || v <= 0 || v > 0x7fffffff)
                goto usage;
            pid = (int)v;
        }
    }
    if (!dir)
        return count ? (fprintf(stderr, "exsctl metrics: --count needs --textfile\n"), 2)
                     : metrics_round(pid, NULL);
    struct sigaction sa = {.sa_handler = metrics_on_signal};

    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (long round = 0; !metrics_stop && (!count || round < count); round++) {
        struct timespec ts = {(time_t)interval, (long)((interval - (time_t)interval) * 1e9)};

        ret = metrics_round(pid, dir);
        if (count && round + 1 == count)
            break;
        /* a signal ends the wait early (no SA_RESTART): the loop sees metrics_stop */
        while (!metrics_stop && nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
    return ret;
usage:
    fprintf(stderr, "usage: exsctl metrics [PID] [--textfile DIR [--interval S] [--count N]]\n");
    return 2;
}
