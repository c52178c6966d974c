/* SPDX-License-Identifier: MIT */
/* exsctl: the libexs command-line tool; one table of subcommands (stat, top, params, set,
 * trace, version) that talk to running processes through their control endpoints. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "exs/ctl/ctl.h"
#include "exs/util/json.h"
#include "exs/util/params.h"
#include "tools/exsctl_metrics.h"
#include "tools/exsctl_probe.h"

#ifndef EXSCTL_VERSION
#define EXSCTL_VERSION "unknown"
#endif

#define REPLY_TIMEOUT_MS 10000
#define MAX_PROCS        1024

static int opt_json; /* --json anywhere on the command line */

/* ---- talking to a process ---- */

struct proc {
    int pid;
    int fd;
    struct exs_json *reply; /* last reply */
};

/* The uid a root caller may trust besides root for pid's endpoint: the process's own
 * (its effective uid, /proc/<pid>/status); EXS_CTL_UID_NONE for another caller, or when it
 * cannot be read (the process is gone). */
static uid_t ctl_also(int pid)
{
    char path[64], line[256];
    unsigned r, e;
    uid_t also = EXS_CTL_UID_NONE;
    FILE *f;

    if (geteuid() != 0)
        return EXS_CTL_UID_NONE;
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    f = fopen(path, "re");
    if (!f)
        return EXS_CTL_UID_NONE;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Uid: %u %u", &r, &e) == 2) {
            also = (uid_t)e;
            break;
        }
    fclose(f);
    return also;
}

/* Who exsctl trusts, for a message: "uid 1000 or root" or "uid 0, uid 1000 (the process's)
 * or root". */
static const char *ctl_trusted(uid_t also, char *buf, size_t size)
{
    uid_t uid = geteuid();

    if (also != EXS_CTL_UID_NONE && also != EXS_CTL_UID_ANY && also != uid && also != 0)
        snprintf(buf, size, "uid %u, uid %u (the process's) or root", (unsigned)uid,
                 (unsigned)also);
    else
        snprintf(buf, size, "uid %u or root", (unsigned)uid);
    return buf;
}

/* The control directory, opened and checked (spec/observability.md §2; also: as for
 * exs__ctl_uid_ok): its descriptor, its name in dir; or -errno, the reason printed
 * (-ENOENT quietly when quiet: no process of this user ever made it). */
static int ctl_dir_open(char *dir, size_t len, uid_t also, int quiet)
{
    char why[160];
    int shared, dfd, ret = exs__ctl_dir(dir, len, 0);

    if (ret < 0) {
        fprintf(stderr, "exsctl: control directory name too long\n");
        return ret;
    }
    dfd = exs__ctl_dir_open(dir, also, &shared, why, sizeof(why));
    if (dfd == -EPERM || dfd == -ELOOP)
        fprintf(stderr,
                "exsctl: control directory %s %s: not trusted, nothing sent "
                "(spec/observability.md §2)\n",
                dir, why);
    else if (dfd == -EACCES)
        fprintf(stderr,
                "exsctl: control directory %s: permission denied: another user's; only that "
                "user or root may use it\n",
                dir);
    else if (dfd < 0 && !(quiet && dfd == -ENOENT))
        fprintf(stderr, "exsctl: control directory %s: %s\n", dir, why);
    return dfd;
}

/* The socket file name in the directory dfd: a socket whose owner exsctl trusts
 * (exs__ctl_uid_ok); 0, or -errno, the reason printed. */
static int ctl_sock_check(int pid, int dfd, const char *dir, const char *name, uid_t also,
                          int quiet)
{
    char who[96];
    struct stat st;

    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        int ret = -errno;

        if (quiet)
            return ret;
        if (ret == -ENOENT)
            fprintf(stderr,
                    "exsctl: pid %d: no control endpoint at %s/%s (not a libexs process, "
                    "EXS_CTL_ENABLE=0, or another user's)\n",
                    pid, dir, name);
        else
            fprintf(stderr, "exsctl: pid %d: %s/%s: %s\n", pid, dir, name, strerror(-ret));
        return ret;
    }
    if (!S_ISSOCK(st.st_mode) || !exs__ctl_uid_ok(st.st_uid, geteuid(), also)) {
        fprintf(stderr,
                "exsctl: pid %d: %s/%s is %s of uid %u, not a socket of %s: not trusted, "
                "nothing sent\n",
                pid, dir, name, S_ISSOCK(st.st_mode) ? "a socket" : "not a socket",
                (unsigned)st.st_uid, ctl_trusted(also, who, sizeof(who)));
        return -EPERM;
    }
    return 0;
}

/* Who answers on fd: the process asked for (pid), of a uid exsctl trusts
 * (exs__ctl_uid_ok). 0, or -EPERM, the reason printed. */
static int ctl_peer_check(int pid, int fd, const char *path, uid_t also)
{
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    char who[96];

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
        fprintf(stderr, "exsctl: pid %d: SO_PEERCRED on %s: %s: not trusted, nothing sent\n", pid,
                path, strerror(errno));
        return -EPERM;
    }
    if (cred.pid != pid || !exs__ctl_uid_ok(cred.uid, geteuid(), also)) {
        fprintf(stderr,
                "exsctl: pid %d: %s is served by pid %d of uid %u, not by pid %d of %s: not "
                "trusted, nothing sent (another user's socket?)\n",
                pid, path, (int)cred.pid, (unsigned)cred.uid, pid,
                ctl_trusted(also, who, sizeof(who)));
        return -EPERM;
    }
    return 0;
}

/* Connect to pid's endpoint once its directory, its socket file and the process serving
 * it are checked (spec/observability.md §2). Prints the reason and returns -errno on
 * failure (quiet: not for a missing or dead endpoint, but always for a refused one). */
static int ctl_connect(int pid, int quiet)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], path[sizeof(dir) + 32], name[32];
    struct sockaddr_un sa;
    uid_t also = ctl_also(pid);
    int dfd, fd, ret;

    dfd = ctl_dir_open(dir, sizeof(dir), also, 0);
    if (dfd < 0)
        return dfd;
    snprintf(name, sizeof(name), "%d.sock", pid);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ret = ctl_sock_check(pid, dfd, dir, name, also, quiet);
    if (ret < 0)
        goto out;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ret = -errno;
        perror("exsctl: socket");
        goto out;
    }
    exs__ctl_sockaddr_at(dfd, name, &sa); /* the file just checked, not a name looked up again */
    ret = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    if (ret < 0 && errno == ENOENT && strlen(path) < sizeof(sa.sun_path)) { /* no /proc */
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        ret = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    }
    if (ret == 0) {
        ret = ctl_peer_check(pid, fd, path, also);
        if (ret == 0) {
            close(dfd);
            return fd;
        }
        close(fd);
        goto out;
    }
    ret = -errno;
    close(fd);
    if (quiet)
        goto out;
    if (ret == -EACCES || ret == -EPERM)
        fprintf(stderr,
                "exsctl: pid %d: permission denied (%s): the process belongs to another "
                "user; only that user or root may connect\n",
                pid, path);
    else if (ret == -ENOENT)
        fprintf(stderr,
                "exsctl: pid %d: no control endpoint at %s (not a libexs process, "
                "EXS_CTL_ENABLE=0, or another user's)\n",
                pid, path);
    else if (ret == -ECONNREFUSED)
        fprintf(stderr, "exsctl: pid %d: %s: nobody listens (the process is gone)\n", pid, path);
    else
        fprintf(stderr, "exsctl: pid %d: connect %s: %s\n", pid, path, strerror(-ret));
out:
    close(dfd);
    return ret;
}

/* A reply: its text (one line, no newline) and its parse. */
struct reply {
    char *raw;
    struct exs_json *j;
};

static void reply_free(struct reply *r)
{
    free(r->raw);
    exs__json_free(r->j);
    r->raw = NULL;
    r->j = NULL;
}

/* Read one reply line (bounded, with a timeout; -1: none) and parse it. */
static int ctl_read_reply(int fd, int timeout_ms, struct reply *r)
{
    size_t cap = 4096, len = 0,
           max = 256u << 20; /* a stat of many connections streams past EXS_CTL_REPLY_MAX */
    char *buf = malloc(cap);
    int ret;

    if (!buf)
        return -ENOMEM;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        char *nl;
        ssize_t n;

        if (len && (nl = memchr(buf, '\n', len))) {
            *nl = '\0';
            ret = exs__json_parse(buf, (size_t)(nl - buf), &r->j);
            if (ret == 0) {
                r->raw = buf;
                return 0;
            }
            ret = -EPROTO;
            break;
        }
        if (len == cap) {
            char *p;

            if (cap >= max) {
                ret = -E2BIG;
                break;
            }
            p = realloc(buf, cap * 2);
            if (!p) {
                ret = -ENOMEM;
                break;
            }
            buf = p;
            cap *= 2;
        }
        if (timeout_ms >= 0) {
            ret = poll(&pfd, 1, timeout_ms);
            if (ret == 0) {
                ret = -ETIMEDOUT;
                break;
            }
            if (ret < 0 && errno != EINTR) {
                ret = -errno;
                break;
            }
        }
        /* one byte at a time past the first newline would be slow; read what is there
         * but never beyond one line: MSG_PEEK then consume up to the newline */
        n = recv(fd, buf + len, cap - len, MSG_PEEK);
        if (n > 0) {
            char *e = memchr(buf + len, '\n', (size_t)n);

            if (e)
                n = e - (buf + len) + 1;
            n = recv(fd, buf + len, (size_t)n, 0);
        }
        if (n == 0) {
            ret = -ECONNRESET;
            break;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            ret = -errno;
            break;
        }
        len += (size_t)n;
    }
    free(buf);
    return ret;
}

/* Print why a reply failed: none (ret < 0) or "ok": false (-EACCES for a refused uid,
 * -EPERM for an offline tunable, else -EIO). */
static int ctl_check_reply(int pid, int ret, struct reply *r)
{
    const char *e;

    if (ret < 0) {
        fprintf(stderr, "exsctl: pid %d: no reply: %s\n", pid,
                ret == -ECONNRESET ? "connection closed" : strerror(-ret));
        return ret;
    }
    if (exs__json_get_bool(r->j, "ok"))
        return 0;
    e = exs__json_get_str(r->j, "error");
    fprintf(stderr, "exsctl: pid %d: %s: %s\n", pid, e, exs__json_get_str(r->j, "message"));
    ret = !strcmp(e, "EACCES") ? -EACCES : !strcmp(e, "EPERM") ? -EPERM : -EIO;
    if (opt_json)
        printf("%s\n", r->raw);
    reply_free(r);
    return ret;
}

/* Send a request line and read its reply; prints the reason on failure. A reply with
 * "ok": false is printed and turned into -EIO (or -EACCES for a refused uid). */
static int ctl_call(int pid, int fd, const char *req, struct reply *r)
{
    size_t len = strlen(req);
    int ret;

    if (send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len || send(fd, "\n", 1, MSG_NOSIGNAL) != 1) {
        ret = -errno;
        /* a refusal (another uid, too many clients) is written before the close */
        if (ctl_read_reply(fd, 1000, r) == 0)
            return ctl_check_reply(pid, 0, r);
        fprintf(stderr, "exsctl: pid %d: send: %s\n", pid, strerror(-ret));
        return ret;
    }
    return ctl_check_reply(pid, ctl_read_reply(fd, REPLY_TIMEOUT_MS, r), r);
}

/* One request to one process (connect, call, close). */
static int ctl_once(int pid, const char *req, struct reply *r)
{
    int fd = ctl_connect(pid, 0), ret;

    if (fd < 0)
        return fd;
    ret = ctl_call(pid, fd, req, r);
    close(fd);
    return ret;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* PIDs with a control socket in this user's directory (checked first: -errno when it is
 * not trusted, 0 when there is none); files of dead processes that are this user's are
 * removed. Returns the count. */
static int list_pids(int *pids, int max)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    DIR *d;
    struct dirent *e;
    /* a root caller lists anyone's directory; each process is checked when connected */
    int n = 0, dfd = ctl_dir_open(dir, sizeof(dir),
                                  geteuid() == 0 ? EXS_CTL_UID_ANY : EXS_CTL_UID_NONE, 1);

    if (dfd < 0)
        return dfd == -ENOENT ? 0 : dfd;
    if (!(d = fdopendir(dfd))) {
        close(dfd);
        return 0;
    }
    while ((e = readdir(d)) && n < max) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        struct stat st;

        if (end == e->d_name || strcmp(end, ".sock") != 0 || pid <= 0 || pid > 0x7fffffff)
            continue;
        if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
            if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == geteuid() &&
                !S_ISDIR(st.st_mode) && unlinkat(dfd, e->d_name, 0) == 0 && !opt_json)
                fprintf(stderr, "exsctl: removed the stale socket of dead pid %ld\n", pid);
            continue;
        }
        pids[n++] = (int)pid;
    }
    closedir(d);
    qsort(pids, (size_t)n, sizeof(*pids), cmp_int);
    return n;
}

/* ---- argument helpers ---- */

/* Remove --json from argv (anywhere); returns the new argc. */
static int strip_json(int argc, char **argv)
{
    int n = 0;

    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            opt_json = 1;
        else
            argv[n++] = argv[i];
    }
    argv[n] = NULL;
    return n;
}

static int parse_pid(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);

    return end != s && *end == '\0' && v > 0 && v <= 0x7fffffff ? (int)v : -1;
}

static void human_bytes(uint64_t v, char *buf, size_t len)
{
    const char *u = "KMGTP";
    double d = (double)v;
    int i = -1;

    if (v < 10000) {
        snprintf(buf, len, "%" PRIu64, v);
        return;
    }
    while (d >= 1024 && i < 4) {
        d /= 1024;
        i++;
    }
    snprintf(buf, len, "%.1f%c", d, u[i]);
}

/* ---- stat and top ---- */

static void print_conn_header(int rate)
{
    printf("%-7s %-15s %-4s %-9s %-10s %-21s %-21s %-5s %-12s %-15s %-5s %-7s %-8s %-8s %-7s "
           "%-7s %s%s\n",
           "PID", "PROG", "FD", "TYPE", "STATE", "LOCAL", "PEER", "PROV", "DEVICE", "MODE/PHASE",
           "CRED", "SND/RCV", "TX", "RX", "DIRECT", "INDIR", "AGE_S",
           rate ? "  TX/s     RX/s" : "");
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

static void print_conn(const struct exs_json *proc, const struct exs_json *c, double txr,
                       double rxr, int rate)
{
    char tx[16], rx[16], mode[32], sr[24], a[16], b[16];

    human_bytes(exs__json_get_u64(c, "bytes_sent"), tx, sizeof(tx));
    human_bytes(exs__json_get_u64(c, "bytes_received"), rx, sizeof(rx));
    snprintf(mode, sizeof(mode), "%.8s%s%.8s", exs__json_get_str(c, "mode"),
             exs__json_get_str(c, "phase")[0] ? "/" : "", exs__json_get_str(c, "phase"));
    snprintf(sr, sizeof(sr), "%" PRIu64 "/%" PRIu64, exs__json_get_u64(c, "sends_out"),
             exs__json_get_u64(c, "recvs_out"));
    printf("%-7" PRIu64 " %-15.15s %-4" PRIu64 " %-9s %-10s %-21s %-21s %-5s %-12s %-15s %-5" PRIu64
           " %-7s %-8s %-8s %-7" PRIu64 " %-7" PRIu64 " %" PRIu64,
           exs__json_get_u64(proc, "pid"), exs__json_get_str(proc, "prog"),
           exs__json_get_u64(c, "fd"), exs__json_get_str(c, "type"), exs__json_get_str(c, "state"),
           or_dash(exs__json_get_str(c, "local")), or_dash(exs__json_get_str(c, "peer")),
           exs__json_get_str(c, "provider"), or_dash(exs__json_get_str(c, "device")), mode,
           exs__json_get_u64(c, "credits"), sr, tx, rx, exs__json_get_u64(c, "direct_xfers"),
           exs__json_get_u64(c, "indirect_xfers"), exs__json_get_u64(c, "age_ms") / 1000);
    if (rate) {
        human_bytes((uint64_t)txr, a, sizeof(a));
        human_bytes((uint64_t)rxr, b, sizeof(b));
        printf("  %-8s %s", a, b);
    }
    printf("\n");
    /* the rule the peer broke, when it reset the connection (spec/protocol.md §10) */
    if (exs__json_get_str(c, "violation")[0])
        printf("        violation: %s\n", exs__json_get_str(c, "violation"));
    /* its path and why, when shm was in question (spec/provider-shm.md, Chosen by itself) */
    if (exs__json_get_str(c, "path")[0] && !strstr(exs__json_get_str(c, "path"), "shm off here"))
        printf("        path: %s\n", exs__json_get_str(c, "path"));
}

/* Stat replies of pid (one) or of every process (pid < 0); in a scan, processes that
 * fail (exited meanwhile, another user's) are skipped. Returns the count or -errno. */
static int gather(int pid, struct reply *replies, int max)
{
    int pids[MAX_PROCS], n, got = 0;

    if (pid > 0) {
        int ret = ctl_once(pid, "stat", &replies[0]);

        return ret < 0 ? ret : 1;
    }
    n = list_pids(pids, max < MAX_PROCS ? max : MAX_PROCS);
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++) {
        int fd = ctl_connect(pids[i], 1);

        if (fd < 0)
            continue;
        if (ctl_call(pids[i], fd, "stat", &replies[got]) == 0)
            got++;
        close(fd);
    }
    return got;
}

/* gather and reply_free for exsctl metrics (tools/exsctl_metrics.c). */
int exsctl_stat_gather(int pid, struct exsctl_stat *out, int max)
{
    struct reply *r = calloc((size_t)(max > 0 ? max : 1), sizeof(*r));
    int n = r ? gather(pid, r, max) : -ENOMEM;

    for (int i = 0; i < n; i++) {
        out[i].raw = r[i].raw;
        out[i].j = r[i].j;
    }
    free(r);
    return n;
}

void exsctl_stat_free(struct exsctl_stat *s)
{
    struct reply r = {s->raw, s->j};

    reply_free(&r);
    s->raw = NULL;
    s->j = NULL;
}

static void print_json_processes(struct reply *r, int n)
{
    printf("{\"processes\":[");
    for (int i = 0; i < n; i++)
        printf("%s%s", i ? "," : "", r[i].raw);
    printf("]}\n");
}

/* Counter name of set "mem" in a process's counter rows (0 when absent). */
static uint64_t mem_counter(const struct exs_json *cs, const char *name)
{
    for (const struct exs_json *c = cs ? cs->child : NULL; c; c = c->next)
        if (!strcmp(exs__json_get_str(c, "set"), "mem") &&
            !strcmp(exs__json_get_str(c, "name"), name))
            return exs__json_get_u64(c, "value");
    return 0;
}

/* The memory budget's line (spec/protocol.md §9.3), when the process has the set. */
static void print_mem_line(const struct exs_json *cs)
{
    uint64_t budget = mem_counter(cs, "mem_budget");

    if (!mem_counter(cs, "mem_peak"))
        return; /* no connection yet (or an older library) */
    printf("  memory: %" PRIu64 " bytes held for peers (peak %" PRIu64 "), budget ",
           mem_counter(cs, "mem_used"), mem_counter(cs, "mem_peak"));
    if (budget)
        printf("%" PRIu64, budget);
    else
        printf("none");
    printf("; refused: %" PRIu64 " connections, %" PRIu64 " ring grows, %" PRIu64 " other\n",
           mem_counter(cs, "mem_refused_conns"), mem_counter(cs, "mem_refused_growth"),
           mem_counter(cs, "mem_refused_other"));
}

static int cmd_stat(int argc, char **argv)
{
    static struct reply r[MAX_PROCS];
    int pid = -1, n, counters = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--counters"))
            counters = 1;
        else if (pid > 0 || (pid = parse_pid(argv[i])) < 0)
            goto usage;
    }
    n = gather(pid, r, MAX_PROCS);
    if (n < 0)
        return 1;
    if (opt_json) {
        print_json_processes(r, n);
    } else {
        print_conn_header(0);
        for (int i = 0; i < n; i++) {
            const struct exs_json *conns = exs__json_get(r[i].j, "conns");

            for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next)
                print_conn(r[i].j, c, 0, 0, 0);
        }
        /* per process: one line, and with --counters every counter set */
        for (int i = 0; i < n; i++) {
            const struct exs_json *cs = exs__json_get(r[i].j, "counters");

            printf("\npid %" PRIu64 " (%s): provider %s, up %" PRIu64 " s, log level %s, "
                   "%" PRIu64 " log lines suppressed\n",
                   exs__json_get_u64(r[i].j, "pid"), exs__json_get_str(r[i].j, "prog"),
                   exs__json_get_str(r[i].j, "provider"),
                   exs__json_get_u64(r[i].j, "uptime_ms") / 1000,
                   exs__json_get_str(r[i].j, "log_level"),
                   exs__json_get_u64(r[i].j, "log_suppressed"));
            print_mem_line(cs);
            for (const struct exs_json *c = counters && cs ? cs->child : NULL; c; c = c->next)
                printf("  %-20s %-24s %" PRIu64 "\n", exs__json_get_str(c, "set"),
                       exs__json_get_str(c, "name"), exs__json_get_u64(c, "value"));
        }
    }
    for (int i = 0; i < n; i++)
        reply_free(&r[i]);
    return 0;
usage:
    fprintf(stderr, "usage: exsctl stat [PID] [--counters] [--json]\n");
    return 2;
}

/* top: one row per connection with its rate since the previous round. */
struct top_row {
    uint64_t pid, fd;
    char conn[32];
    uint64_t tx, rx;
    double txr, rxr;
    const struct exs_json *proc, *c;
};

static int top_cmp(const void *a, const void *b)
{
    const struct top_row *x = a, *y = b;
    double tx = x->txr + x->rxr, ty = y->txr + y->rxr;

    return tx < ty ? 1 : tx > ty ? -1 : (x->pid > y->pid) - (x->pid < y->pid);
}

static int cmd_top(int argc, char **argv)
{
    static struct reply r[MAX_PROCS];
    struct top_row *prev = NULL, *cur = NULL;
    int nprev = 0, iterations = -1, pid = -1;
    double interval = 1.0;
    struct timespec t0, t1;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iterations = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--interval") && i + 1 < argc)
            interval = atof(argv[++i]);
        else if ((pid = parse_pid(argv[i])) < 0)
            goto usage;
    }
    if (interval <= 0 || interval > 3600 || iterations == 0 || iterations < -1)
        goto usage;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int it = 0; iterations < 0 || it < iterations; it++) {
        int n = gather(pid, r, MAX_PROCS), ncur = 0;
        double dt;

        if (n < 0)
            return 1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        t0 = t1;
        for (int i = 0; i < n; i++) {
            const struct exs_json *conns = exs__json_get(r[i].j, "conns");

            for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next)
                ncur++;
        }
        cur = calloc((size_t)ncur + 1, sizeof(*cur));
        if (!cur)
            return 1;
        ncur = 0;
        for (int i = 0; i < n; i++) {
            const struct exs_json *conns = exs__json_get(r[i].j, "conns");

            for (const struct exs_json *c = conns ? conns->child : NULL; c; c = c->next) {
                struct top_row *row = &cur[ncur++];

                row->pid = exs__json_get_u64(r[i].j, "pid");
                row->fd = exs__json_get_u64(c, "fd");
                snprintf(row->conn, sizeof(row->conn), "%s", exs__json_get_str(c, "conn"));
                row->tx = exs__json_get_u64(c, "bytes_sent");
                row->rx = exs__json_get_u64(c, "bytes_received");
                row->proc = r[i].j;
                row->c = c;
                for (int k = 0; k < nprev && it > 0; k++)
                    if (prev[k].pid == row->pid && !strcmp(prev[k].conn, row->conn) &&
                        prev[k].fd == row->fd && dt > 0) {
                        row->txr = (double)(row->tx - prev[k].tx) / dt;
                        row->rxr = (double)(row->rx - prev[k].rx) / dt;
                    }
            }
        }
        qsort(cur, (size_t)ncur, sizeof(*cur), top_cmp);
        if (opt_json) {
            printf("{\"iteration\":%d,\"conns\":[", it + 1);
            for (int k = 0; k < ncur; k++)
                printf("%s{\"pid\":%" PRIu64 ",\"fd\":%" PRIu64
                       ",\"conn\":\"%s\",\"bytes_sent\":%" PRIu64 ",\"bytes_received\":%" PRIu64
                       ",\"tx_bps\":%.0f,\"rx_bps\":%.0f}",
                       k ? "," : "", cur[k].pid, cur[k].fd, cur[k].conn, cur[k].tx, cur[k].rx,
                       cur[k].txr, cur[k].rxr);
            printf("]}\n");
        } else {
            if (isatty(STDOUT_FILENO))
                printf("\033[H\033[2J");
            printf("exsctl top: %d processes, %d connections, every %.1f s (bytes/s since the "
                   "last round)\n",
                   n, ncur, interval);
            print_conn_header(1);
            for (int k = 0; k < ncur; k++)
                print_conn(cur[k].proc, cur[k].c, cur[k].txr, cur[k].rxr, 1);
        }
        fflush(stdout);
        free(prev);
        prev = cur;
        nprev = ncur;
        for (int k = 0; k < nprev; k++)
            prev[k].proc = prev[k].c = NULL; /* the trees are freed next */
        for (int i = 0; i < n; i++)
            reply_free(&r[i]);
        if (iterations < 0 || it + 1 < iterations)
            usleep((useconds_t)(interval * 1e6));
    }
    free(prev);
    return 0;
usage:
    fprintf(stderr, "usage: exsctl top [PID] [--iterations N] [--interval SECONDS] [--json]\n");
    return 2;
}

/* ---- params and set ---- */

static int cmd_params(int argc, char **argv)
{
    struct reply r = {0};
    int pid, rc;

    if (argc == 1) {
        /* Bad EXS_* values are reported on stderr and make the status 1. */
        rc = exs__params_load();
        if (opt_json) {
            size_t count;
            const struct exs_param_def *t = exs__params_table(&count);
            struct exs_jbuf b;
            char val[EXS_PARAM_STR_MAX + 32];

            exs__jbuf_init(&b, 1u << 20);
            exs__jbuf_obj_begin(&b);
            exs__jbuf_key(&b, "params");
            exs__jbuf_arr_begin(&b);
            for (size_t i = 0; i < count; i++) {
                if (exs__params_get(t[i].name, val, sizeof(val)) < 0)
                    val[0] = '\0';
                exs__jbuf_obj_begin(&b);
                exs__jbuf_kv_str(&b, "name", t[i].name);
                exs__jbuf_kv_str(&b, "env", t[i].env);
                exs__jbuf_kv_str(&b, "value", val);
                exs__jbuf_kv_str(&b, "default", t[i].defval);
                exs__jbuf_kv_str(&b, "mode", t[i].online ? "online" : "offline");
                exs__jbuf_kv_str(&b, "help", t[i].help);
                exs__jbuf_obj_end(&b);
            }
            exs__jbuf_arr_end(&b);
            exs__jbuf_obj_end(&b);
            printf("%s\n", b.p ? b.p : "{}");
            exs__jbuf_free(&b);
        } else {
            exs__params_print(stdout, 0);
        }
        return rc < 0 ? 1 : 0;
    }
    if (argc == 2 && strcmp(argv[1], "--markdown") == 0) {
        /* Defaults only: the output must not depend on the environment. */
        exs__params_print(stdout, 1);
        return 0;
    }
    if (argc != 2 || (pid = parse_pid(argv[1])) < 0) {
        fprintf(stderr, "usage: exsctl params [PID] [--json] | exsctl params --markdown\n");
        return 2;
    }
    if (ctl_once(pid, "params", &r) < 0)
        return 1;
    if (opt_json) {
        printf("%s\n", r.raw);
    } else {
        const struct exs_json *ps = exs__json_get(r.j, "params");

        printf("pid %d (%s):\n", pid, exs__json_get_str(r.j, "prog"));
        printf("%-22s %-24s %-8s %s\n", "NAME", "VALUE", "MODE", "DEFAULT");
        for (const struct exs_json *p = ps ? ps->child : NULL; p; p = p->next)
            printf("%-22s %-24s %-8s %s\n", exs__json_get_str(p, "name"),
                   exs__json_get_str(p, "value"), exs__json_get_str(p, "mode"),
                   exs__json_get_str(p, "default"));
    }
    reply_free(&r);
    return 0;
}

static int cmd_set(int argc, char **argv)
{
    struct reply r = {0};
    char req[EXS_CTL_LINE_MAX];
    char *eq;
    int pid, n;

    if (argc != 3 || (pid = parse_pid(argv[1])) < 0 || !(eq = strchr(argv[2], '=')) ||
        eq == argv[2] || !eq[1] || strchr(argv[2], ' ') || strchr(argv[2], '\n')) {
        fprintf(stderr, "usage: exsctl set PID NAME=VALUE [--json]\n");
        return 2;
    }
    *eq = '\0';
    n = snprintf(req, sizeof(req), "set %s %s", argv[2], eq + 1);
    if (n < 0 || (size_t)n >= sizeof(req)) {
        fprintf(stderr, "exsctl: set: name or value too long\n");
        return 2;
    }
    if (ctl_once(pid, req, &r) < 0)
        return 1;
    if (opt_json)
        printf("%s\n", r.raw);
    else
        printf("pid %d: %s: \"%s\" -> \"%s\"\n", pid, exs__json_get_str(r.j, "name"),
               exs__json_get_str(r.j, "old"), exs__json_get_str(r.j, "value"));
    reply_free(&r);
    return 0;
}

/* ---- trace ---- */

/* Chrome trace event JSON (spec/observability.md §8): each request trace becomes complete
 * ("X") events on three tracks of the traced process: sender (request, send, queued),
 * network, receiver (delivery). Times are the sender's clock, receiver times corrected by
 * the trace's clock offset. */
struct chrome {
    FILE *f;
    int events;
};

static void chrome_event(struct chrome *c, const char *name, int pid, int tid, int64_t t0,
                         int64_t t1, const struct exs_json *req)
{
    if (t1 < t0)
        t1 = t0; /* a corrected receiver time within the offset's error of the sender's */
    fprintf(c->f,
            "%s\n{\"name\":\"%s\",\"cat\":\"exs\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"conn\":\"%s\",\"seq\":%" PRIu64
            ",\"bytes\":%" PRIu64 ",\"offset_err_us\":%.3f}}",
            c->events ? "," : "", name, pid, tid, (double)t0 / 1000.0, (double)(t1 - t0) / 1000.0,
            exs__json_get_str(req, "conn"), exs__json_get_u64(req, "seq"),
            exs__json_get_u64(req, "bytes"),
            (double)exs__json_get_u64(req, "offset_err_ns") / 1000.0);
    c->events++;
}

static int chrome_open(struct chrome *c, const char *path)
{
    c->f = fopen(path, "w");
    c->events = 0;
    if (!c->f) {
        fprintf(stderr, "exsctl: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(c->f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
    return 0;
}

static void chrome_add(struct chrome *c, int pid, const struct exs_json *req)
{
    static const char *tracks[] = {"sender", "network", "receiver"};
    int64_t post = (int64_t)exs__json_get_u64(req, "post_ns");
    int64_t wire = (int64_t)exs__json_get_u64(req, "wire_ns");
    int64_t done = (int64_t)exs__json_get_u64(req, "done_ns");
    int64_t arr = exs__json_get_i64(req, "arrival_ns");
    int64_t dlv = exs__json_get_i64(req, "delivery_ns");

    if (!c->events)
        for (int t = 0; t < 3; t++) {
            fprintf(c->f,
                    "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                    "\"args\":{\"name\":\"%s\"}}",
                    t ? "," : "", pid, t + 1, tracks[t]);
            c->events++;
        }
    chrome_event(c, "request", pid, 1, post, done > dlv ? done : dlv, req);
    chrome_event(c, "send", pid, 1, post, done, req);
    chrome_event(c, "queued", pid, 1, post, wire, req);
    chrome_event(c, "network", pid, 2, wire, arr, req);
    chrome_event(c, "delivery", pid, 3, arr, dlv, req);
}

static int chrome_close(struct chrome *c, const char *path, int traces)
{
    int bad;

    fprintf(c->f, "\n]}\n");
    bad = ferror(c->f);
    if (fclose(c->f) || bad) {
        fprintf(stderr, "exsctl: %s: write failed\n", path);
        return 1;
    }
    fprintf(stderr, "exsctl: %d request traces written to %s\n", traces, path);
    return 0;
}

/* exsctl trace --chrome OUT --from FILE: convert an EXS_TRACE_FILE (JSON lines). */
static int trace_convert(const char *out, const char *in)
{
    struct chrome c;
    char line[4096];
    int n = 0;
    FILE *f = fopen(in, "r");

    if (!f) {
        fprintf(stderr, "exsctl: %s: %s\n", in, strerror(errno));
        return 1;
    }
    if (chrome_open(&c, out) < 0) {
        fclose(f);
        return 1;
    }
    while (fgets(line, sizeof(line), f)) {
        struct exs_json *j;

        if (exs__json_parse(line, strlen(line), &j) < 0) {
            fprintf(stderr, "exsctl: %s: a line is not JSON, skipped\n", in);
            continue;
        }
        chrome_add(&c, 0, j);
        exs__json_free(j);
        n++;
    }
    fclose(f);
    return chrome_close(&c, out, n);
}

static int cmd_trace(int argc, char **argv)
{
    struct reply r = {0};
    int pid = -1, fd, count = -1, timeout_ms = -1, got = 0, ret, traces = 0;
    const char *chrome_path = NULL, *from = NULL;
    struct chrome c;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--count") && i + 1 < argc)
            count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout_ms = (int)(atof(argv[++i]) * 1000);
        else if (!strcmp(argv[i], "--chrome") && i + 1 < argc)
            chrome_path = argv[++i];
        else if (!strcmp(argv[i], "--from") && i + 1 < argc)
            from = argv[++i];
        else if (pid < 0 && !from && (pid = parse_pid(argv[i])) > 0)
            continue;
        else
            goto usage;
    }
    if (from) {
        if (!chrome_path || pid > 0)
            goto usage;
        return trace_convert(chrome_path, from);
    }
    if (pid < 0 || count == 0 || count < -1)
        goto usage;
    if (chrome_path && chrome_open(&c, chrome_path) < 0)
        return 1;
    fd = ctl_connect(pid, 0);
    if (fd < 0 || ctl_call(pid, fd, "trace", &r) < 0) {
        if (fd >= 0)
            close(fd);
        if (chrome_path) {
            fclose(c.f);
            unlink(chrome_path);
        }
        return 1;
    }
    if (opt_json)
        printf("%s\n", r.raw);
    else
        fprintf(stderr,
                "exsctl: tracing pid %d (%s), log level %s; exsctl set %d "
                "log_level=dbg for more\n",
                pid, exs__json_get_str(r.j, "prog"), exs__json_get_str(r.j, "log_level"), pid);
    fflush(stdout);
    reply_free(&r);
    while (count < 0 || got < count) {
        ret = ctl_read_reply(fd, timeout_ms, &r);
        if (ret == -ETIMEDOUT)
            break;
        if (ret < 0) {
            if (ret != -ECONNRESET)
                fprintf(stderr, "exsctl: pid %d: trace: %s\n", pid, strerror(-ret));
            break;
        }
        const struct exs_json *req = exs__json_get(r.j, "req");

        if (chrome_path) {
            /* with --chrome, only request traces count and nothing is printed */
            if (req && req->type == EXS_JSON_OBJ) {
                chrome_add(&c, pid, req);
                traces++;
                got++;
            }
            reply_free(&r);
            continue;
        }
        if (opt_json) {
            printf("%s\n", r.raw);
        } else if (req) {
            uint64_t t = exs__json_get_u64(r.j, "t_us");
            int64_t post = (int64_t)exs__json_get_u64(req, "post_ns");

            printf("%" PRIu64 ".%06" PRIu64 " request conn %s seq %" PRIu64 " %" PRIu64
                   " B: wire +%.1f us, arrival +%.1f us, delivery +%.1f us, completion +%.1f "
                   "us (receiver times +- %.1f us)\n",
                   t / 1000000, t % 1000000, exs__json_get_str(req, "conn"),
                   exs__json_get_u64(req, "seq"), exs__json_get_u64(req, "bytes"),
                   (double)((int64_t)exs__json_get_u64(req, "wire_ns") - post) / 1e3,
                   (double)(exs__json_get_i64(req, "arrival_ns") - post) / 1e3,
                   (double)(exs__json_get_i64(req, "delivery_ns") - post) / 1e3,
                   (double)((int64_t)exs__json_get_u64(req, "done_ns") - post) / 1e3,
                   (double)exs__json_get_u64(req, "offset_err_ns") / 1e3);
        } else {
            uint64_t t = exs__json_get_u64(r.j, "t_us");

            printf("%" PRIu64 ".%06" PRIu64 " %s\n", t / 1000000, t % 1000000,
                   exs__json_get_str(r.j, "log"));
            if (exs__json_get_u64(r.j, "dropped"))
                printf("(%" PRIu64 " records dropped before this one)\n",
                       exs__json_get_u64(r.j, "dropped"));
        }
        fflush(stdout);
        reply_free(&r);
        got++;
    }
    close(fd);
    return chrome_path ? chrome_close(&c, chrome_path, traces) : 0;
usage:
    fprintf(stderr, "usage: exsctl trace PID [--count N] [--timeout SECONDS] [--json] "
                    "[--chrome FILE]\n       exsctl trace --chrome FILE --from TRACE_FILE\n");
    return 2;
}

/* ---- the table of subcommands ---- */

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

/* The probes parse their own options: give --json back to them. */
static int cmd_probe(int (*fn)(int, char **), int argc, char **argv)
{
    char *v[argc + 2];

    for (int i = 0; i < argc; i++)
        v[i] = argv[i];
    if (opt_json)
        v[argc++] = (char *)"--json";
    v[argc] = NULL;
    return fn(argc, v);
}

static int cmd_serve(int argc, char **argv)
{
    return cmd_probe(exsctl_serve, argc, argv);
}
static int cmd_ping(int argc, char **argv)
{
    return cmd_probe(exsctl_ping, argc, argv);
}
static int cmd_perf(int argc, char **argv)
{
    return cmd_probe(exsctl_perf, argc, argv);
}

struct exsctl_cmd {
    const char *name;
    int (*fn)(int argc, char **argv); /* argv[0] is the subcommand */
    const char *usage;
};

static const struct exsctl_cmd cmds[] = {
    {"stat", cmd_stat,
     "stat [PID] [--counters] every connection of every libexs process (or PID's); --counters: its "
     "counter sets"},
    {"top", cmd_top,
     "top [PID] [--iterations N] [--interval S]  the same, refreshed, by throughput"},
    {"metrics", exsctl_metrics, NULL},
    {"params", cmd_params,
     "params [PID]            tunables (with PID: the running process's values)"},
    {"params", cmd_params, "params --markdown       the tunables table of spec/params.md"},
    {"set", cmd_set, "set PID NAME=VALUE      change an online tunable of a running process"},
    {"trace", cmd_trace,
     "trace PID [--count N] [--timeout S] [--chrome FILE]  stream the process's log and "
     "request-trace records (--chrome: request traces as Chrome trace JSON; --from FILE converts "
     "an EXS_TRACE_FILE)"},
    /* probes (tools/exsctl_probe.c); their usage: exsctl_probe_usage */
    {"serve", cmd_serve, NULL},
    {"ping", cmd_ping, NULL},
    {"perf", cmd_perf, NULL},
    {"version", cmd_version, "version                 print the libexs version"},
    {"help", cmd_help, "help                    print this text"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: exsctl <command> [options] [--json]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (cmds[i].usage)
            fprintf(f, "  %s\n", cmds[i].usage);
    exsctl_metrics_usage(f);
    exsctl_probe_usage(f);
    fprintf(f, "\n--json: machine-readable output (every command).\n"
               "Processes are found in the control directory (EXS_CTL_DIR, else "
               "$XDG_RUNTIME_DIR/exs, /run/exs/0 for root, /tmp/exs-UID).\n");
}

static int cmd_version(int argc, char **argv)
{
    (void)argv;
    if (argc != 1) {
        usage(stderr);
        return 2;
    }
    if (opt_json)
        printf("{\"version\":\"%s\"}\n", EXSCTL_VERSION);
    else
        printf("exsctl (libexs) %s\n", EXSCTL_VERSION);
    return 0;
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    usage(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd;

    argc = strip_json(argc, argv);
    cmd = argc > 1 ? argv[1] : NULL;
    if (!cmd) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h"))
        cmd = "help";
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(cmd, cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "exsctl: unknown command or arguments: %s\n", cmd);
    usage(stderr);
    return 2;
}
