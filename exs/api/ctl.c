/* SPDX-License-Identifier: MIT */
/* The control endpoint: one Unix stream socket per process, served without blocking by the
 * progress loop; requests are hostile text lines, replies JSON lines (spec/observability.md). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/ctl.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/json.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

#ifndef EXS_CTL_VERSION
#define EXS_CTL_VERSION "1"
#endif

#define CTL_TRACE_RING (64u << 10) /* log bytes queued between the logger and the loop */
#define CTL_SWEEP_MS   100         /* how often stalled and idle clients are looked for */
#define CTL_STAT_BATCH 64          /* sockets a stat reports per hold of the progress lock */

/* One connected client (progress lock). */
struct ctl_client {
    struct exs_eng_io io;
    int fd;
    int events; /* EV_* watched now */
    char in[EXS_CTL_LINE_MAX];
    size_t in_len;
    struct exs_jbuf out;    /* reply or trace records not yet written */
    size_t out_off;         /* bytes of out already written */
    int trace;              /* subscribed to log records */
    int closing;            /* close once out is written */
    uint64_t dropped;       /* trace records lost for this client (its queue was full) */
    uint64_t active_ns;     /* last request or write progress */
    struct api_sock **walk; /* a stat in progress: the sockets, each referenced */
    int walk_n, walk_i;     /* their count; the next to report */
    struct exs_list link;
};

static struct {
    int running; /* progress lock: watchers started */
    int lfd;     /* listening socket */
    int efd;     /* eventfd: trace records queued */
    struct exs_eng_io lio, eio;
    struct exs_eng_timer sweep;
    int sweeping; /* progress lock: the sweep timer runs (while clients exist) */
    struct exs_list clients;
    int nclients;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    pid_t owner; /* the process that made path (a forked child does not own it) */
    uint64_t start_ns;
    int atexit_done;
    /* trace records: the logger appends (any thread), the loop takes them */
    pthread_mutex_t tlock;
    int tracers; /* atomic: clients subscribed */
    char tring[CTL_TRACE_RING];
    size_t tlen;
    uint64_t tdropped; /* tlock: records lost because tring was full */
} ctl = {
    .lfd = -1,
    .efd = -1,
    .tlock = PTHREAD_MUTEX_INITIALIZER,
};

static char ctl_drain_buf[CTL_TRACE_RING]; /* loop thread: tring's content being sent */

/* ---- directory ---- */

int exs__ctl_dir(char *buf, size_t len, int create)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    uid_t uid = geteuid();
    int n;

    exs__params_load();
    if (exs__params.ctl_dir[0])
        n = snprintf(buf, len, "%s", exs__params.ctl_dir);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, len, "%s/exs", xdg);
    else if (uid == 0)
        n = snprintf(buf, len, "/run/exs/0");
    else
        n = snprintf(buf, len, "/tmp/exs-%u", (unsigned)uid);
    if (n < 0 || (size_t)n >= len)
        return -ENAMETOOLONG;
    if (!create)
        return 0;
    if (!exs__params.ctl_dir[0] && !(xdg && xdg[0] == '/') && uid == 0 &&
        mkdir("/run/exs", 0755) < 0 && errno != EEXIST) {
        EXS_WARN(API, "control endpoint: mkdir /run/exs: %m");
        return -errno;
    }
    /* made private; one that exists is checked as it is, never changed (ctl_dir_open) */
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) {
        EXS_WARN(API, "control endpoint: mkdir %s: %m", buf);
        return -errno;
    }
    return 0;
}

int exs__ctl_uid_ok(uid_t owner, uid_t uid, uid_t also)
{
    return owner == uid || owner == 0 || also == EXS_CTL_UID_ANY ||
           (also != EXS_CTL_UID_NONE && owner == also);
}

int exs__ctl_dir_trust(const struct stat *st, uid_t uid, uid_t also, char *why, size_t size)
{
    unsigned mode = (unsigned)st->st_mode & 07777;
    int shared = (mode & S_ISVTX) && (mode & 022);
    /* the library (also: EXS_CTL_UID_LIB): its own directory, or a shared one of root's or
     * its own; exsctl: its own, root's, or the one also names */
    int owner_ok = also == EXS_CTL_UID_LIB ? st->st_uid == uid || (shared && st->st_uid == 0)
                                           : exs__ctl_uid_ok(st->st_uid, uid, also);

    if (!S_ISDIR(st->st_mode)) {
        snprintf(why, size, "is not a directory");
        return -EPERM;
    }
    if (!owner_ok) {
        char other[48] = "", self[24] = "root";

        if (also != EXS_CTL_UID_LIB && also != EXS_CTL_UID_NONE && also != uid && also != 0)
            snprintf(other, sizeof(other), " or uid %u (the process's)", (unsigned)also);
        else if (uid && (also != EXS_CTL_UID_LIB || shared))
            snprintf(other, sizeof(other), " or root");
        if (uid)
            snprintf(self, sizeof(self), "uid %u", (unsigned)uid);
        snprintf(why, size, "belongs to uid %u (mode %04o), not to %s%s", (unsigned)st->st_uid,
                 mode, self, other);
        return -EPERM;
    }
    if ((mode & 022) && !shared) {
        snprintf(why, size, "has mode %04o: others may write in it and it is not sticky", mode);
        return -EPERM;
    }
    return shared;
}

int exs__ctl_dir_open(const char *dir, uid_t also, int *shared_p, char *why, size_t size)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), ret;
    struct stat st;

    if (fd < 0) {
        ret = -errno;
        snprintf(why, size, "%s", ret == -ELOOP ? "is a symbolic link" : strerror(-ret));
        return ret;
    }
    /* what the descriptor holds is what is used: no name is looked up twice */
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        snprintf(why, size, "fstat: %s", strerror(-ret));
        close(fd);
        return ret;
    }
    ret = exs__ctl_dir_trust(&st, geteuid(), also, why, size);
    if (ret < 0) {
        close(fd);
        return ret;
    }
    *shared_p = ret;
    return fd;
}

void exs__ctl_sockaddr_at(int dfd, const char *name, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", dfd, name);
}

/* ---- replies ---- */

static const char *errno_name(int err)
{
    switch (err) {
    case EACCES:
        return "EACCES";
    case EPERM:
        return "EPERM";
    case ENOENT:
        return "ENOENT";
    case EINVAL:
        return "EINVAL";
    case EBUSY:
        return "EBUSY";
    case ENOMEM:
        return "ENOMEM";
    case E2BIG:
        return "E2BIG";
    default:
        return "EIO";
    }
}

static void reply_error(struct exs_jbuf *b, int err, const char *msg)
{
    exs__jbuf_obj_begin(b);
    exs__jbuf_key(b, "ok");
    exs__jbuf_bool(b, 0);
    exs__jbuf_kv_str(b, "error", errno_name(err));
    exs__jbuf_kv_str(b, "message", msg);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

static void reply_head(struct exs_jbuf *b)
{
    char prog[64] = "";
    FILE *f = fopen("/proc/self/comm", "re");

    if (f) {
        if (fgets(prog, sizeof(prog), f))
            prog[strcspn(prog, "\n")] = '\0';
        fclose(f);
    }
    exs__jbuf_obj_begin(b);
    exs__jbuf_key(b, "ok");
    exs__jbuf_bool(b, 1);
    exs__jbuf_kv_u64(b, "pid", (uint64_t)getpid());
    exs__jbuf_kv_str(b, "prog", prog);
    exs__jbuf_kv_u64(b, "uid", (uint64_t)geteuid());
    exs__jbuf_kv_str(b, "version", EXS_CTL_VERSION);
    exs__jbuf_kv_str(b, "provider", exs__prov_name(exs__engine_ctx()));
    exs__jbuf_kv_u64(b, "uptime_ms", (exs__now_ns() - ctl.start_ns) / 1000000u);
}

static void addr_str(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t size)
{
    char host[INET6_ADDRSTRLEN] = "";

    buf[0] = '\0';
    if (len >= sizeof(struct sockaddr_in) && ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ss;

        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(buf, size, "%s:%u", host, ntohs(a->sin_port));
    } else if (len >= sizeof(struct sockaddr_in6) && ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;

        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(buf, size, "[%s]:%u", host, ntohs(a->sin6_port));
    }
}

#define STAT_FIELD(_f)                                                                             \
    {                                                                                              \
#_f, offsetof(struct exs_sock_stats, _f)                                                   \
    }
static const struct {
    const char *name;
    size_t off;
} stat_fields[] = {
    STAT_FIELD(bytes_sent),       STAT_FIELD(bytes_received),    STAT_FIELD(direct_xfers),
    STAT_FIELD(indirect_xfers),   STAT_FIELD(mode_switches),     STAT_FIELD(adverts_sent),
    STAT_FIELD(adverts_received), STAT_FIELD(adverts_discarded), STAT_FIELD(credit_stalls),
    STAT_FIELD(keepalive_probes), STAT_FIELD(batches_sent),      STAT_FIELD(msgs_batched),
    STAT_FIELD(batch_thresh),     STAT_FIELD(direct_time_us),    STAT_FIELD(indirect_time_us),
    STAT_FIELD(drain_requests),   STAT_FIELD(ring_resizes),      STAT_FIELD(ring_size),
    STAT_FIELD(ring_fill),        STAT_FIELD(rnr_events),        STAT_FIELD(fragments),
    STAT_FIELD(wr_queued),        STAT_FIELD(nops_sent),         STAT_FIELD(keepalive_timeouts),
    STAT_FIELD(srtt_us),          STAT_FIELD(ring_grow_refused), STAT_FIELD(sends_copied),
    STAT_FIELD(keepalive_answers),
};
/* every field of EXS_SO_STATS is a counter shown here: one appended there is listed */
_Static_assert(sizeof(stat_fields) / sizeof(stat_fields[0]) * sizeof(uint64_t) ==
                   sizeof(struct exs_sock_stats),
               "exsctl stat lists every EXS_SO_STATS field");

static const char *xfer_mode_name(int m)
{
    return m == EXS_XFER_DIRECT_ONLY     ? "direct"
           : m == EXS_XFER_INDIRECT_ONLY ? "indirect"
                                         : "dynamic";
}

/* One socket's row (progress lock held; the walk holds a reference to s). */
static void stat_sock(struct api_sock *s, void *arg)
{
    struct exs_jbuf *b = arg;
    struct exs_conn_info info;
    struct exs_conn *conn;
    char local[80], peer[80], id[32];
    int type, mode, n_send, n_recv;
    enum api_sock_state state;

    api_sock_lock(s);
    conn = s->conn;
    type = s->type;
    mode = s->xfer_mode;
    state = s->state;
    n_send = __atomic_load_n(&s->n_send, __ATOMIC_RELAXED); /* counted without the lock (xfer.c) */
    n_recv = __atomic_load_n(&s->n_recv, __ATOMIC_RELAXED);
    addr_str(&s->local, s->local_len, local, sizeof(local));
    addr_str(&s->peer, s->peer_len, peer, sizeof(peer));
    api_sock_unlock(s);
    memset(&info, 0, sizeof(info));
    if (conn)
        exs__conn_info(conn, &info); /* conn locks come without the socket's */
    exs__jbuf_obj_begin(b);
    exs__jbuf_kv_u64(b, "fd", (uint64_t)s->fd);
    snprintf(id, sizeof(id), "%p", (void *)conn);
    exs__jbuf_kv_str(b, "conn", conn ? id : "");
    exs__jbuf_kv_str(b, "type", type == SOCK_STREAM ? "stream" : "seqpacket");
    exs__jbuf_kv_str(b, "state", exs__api_sock_state_name(state));
    exs__jbuf_kv_str(b, "conn_state", conn ? info.state : "");
    exs__jbuf_kv_str(b, "local", local);
    exs__jbuf_kv_str(b, "peer", peer);
    /* the context the connection runs on: the primary or the fallback (tcp) */
    exs__jbuf_kv_str(
        b, "provider", /* a cut-over (§9.2) changes it under the conn lock */
        exs__prov_name(conn ? __atomic_load_n(&conn->ctx, __ATOMIC_RELAXED) : exs__engine_ctx()));
    /* and its device and port ("tcp" on tcp) */
    exs__jbuf_kv_str(b, "device", conn ? info.device : exs__prov_device(exs__engine_ctx()));
    exs__jbuf_kv_str(b, "mode", xfer_mode_name(mode));
    exs__jbuf_kv_str(b, "phase", conn ? info.phase : "");
    exs__jbuf_kv_u64(b, "credits", info.credits);
    exs__jbuf_kv_u64(b, "peer_credits", info.peer_credits);
    exs__jbuf_kv_u64(b, "sends_out", (uint64_t)n_send);
    exs__jbuf_kv_u64(b, "recvs_out", (uint64_t)n_recv);
    exs__jbuf_kv_u64(b, "wr_out", info.wr_out);
    exs__jbuf_kv_u64(b, "pending", info.pending);
    exs__jbuf_kv_u64(b, "adverts_held", info.adverts_held);
    exs__jbuf_kv_u64(b, "wrq_depth", info.wr_queued);
    exs__jbuf_kv_u64(b, "age_ms", info.age_ms);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(stat_fields); i++)
        exs__jbuf_kv_u64(b, stat_fields[i].name,
                         *(const uint64_t *)((const char *)&info.stats + stat_fields[i].off));
    exs__jbuf_obj_end(b);
}

/* The registered counter sets, as [{"set","name","value"}]. */
static void stat_counters(struct exs_jbuf *b)
{
    char *text = NULL, *line, *save = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    exs__jbuf_key(b, "counters");
    exs__jbuf_arr_begin(b);
    if (f) {
        exs__counters_print(f);
        fclose(f);
        for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char set[128], name[128];
            unsigned long long v;

            if (sscanf(line, "%127s %127s %llu", set, name, &v) != 3)
                continue;
            exs__jbuf_obj_begin(b);
            exs__jbuf_kv_str(b, "set", set);
            exs__jbuf_kv_str(b, "name", name);
            exs__jbuf_kv_u64(b, "value", v);
            exs__jbuf_obj_end(b);
        }
        free(text);
    }
    exs__jbuf_arr_end(b);
}

/* The log level as text (through the params lock: a concurrent set rewrites the string). */
static void kv_log_level(struct exs_jbuf *b)
{
    char level[EXS_PARAM_STR_MAX];

    if (exs__params_get("log_level", level, sizeof(level)) < 0)
        level[0] = '\0';
    exs__jbuf_kv_str(b, "log_level", level);
}

/* A stat streams: the head now, then CTL_STAT_BATCH sockets each time the previous part
 * is written (stat_step), so the progress lock is never held for all connections at once. */
static void req_stat(struct ctl_client *c)
{
    struct exs_jbuf *b = &c->out;

    if (exs__api_sock_list(&c->walk, &c->walk_n) < 0) {
        c->walk = NULL;
        reply_error(b, ENOMEM, "no memory for the socket list");
        return;
    }
    c->walk_i = 0;
    reply_head(b);
    kv_log_level(b);
    exs__jbuf_kv_u64(b, "log_suppressed", exs__log_suppressed_total());
    exs__jbuf_key(b, "conns");
    exs__jbuf_arr_begin(b);
}

static void stat_walk_end(struct ctl_client *c)
{
    while (c->walk_i < c->walk_n)
        exs__api_sock_put(c->walk[c->walk_i++]);
    free(c->walk);
    c->walk = NULL;
}

/* The next sockets of a stat in progress; its end once all are there. */
static void stat_step(struct ctl_client *c)
{
    struct exs_jbuf *b = &c->out;

    for (int k = 0; k < CTL_STAT_BATCH && c->walk_i < c->walk_n; k++) {
        struct api_sock *s = c->walk[c->walk_i++];

        stat_sock(s, b);
        exs__api_sock_put(s);
    }
    if (c->walk_i < c->walk_n)
        return;
    stat_walk_end(c);
    exs__jbuf_arr_end(b);
    stat_counters(b);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

static void req_params(struct exs_jbuf *b)
{
    size_t count;
    const struct exs_param_def *t = exs__params_table(&count);
    char val[EXS_PARAM_STR_MAX + 32];

    reply_head(b);
    exs__jbuf_key(b, "params");
    exs__jbuf_arr_begin(b);
    for (size_t i = 0; i < count; i++) {
        if (exs__params_get(t[i].name, val, sizeof(val)) < 0)
            strcpy(val, "?");
        exs__jbuf_obj_begin(b);
        exs__jbuf_kv_str(b, "name", t[i].name);
        exs__jbuf_kv_str(b, "env", t[i].env);
        exs__jbuf_kv_str(b, "value", val);
        exs__jbuf_kv_str(b, "default", t[i].defval);
        exs__jbuf_kv_str(b, "mode", t[i].online ? "online" : "offline");
        exs__jbuf_kv_str(b, "help", t[i].help);
        exs__jbuf_obj_end(b);
    }
    exs__jbuf_arr_end(b);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

static void req_set(struct exs_jbuf *b, const char *name, const char *value)
{
    const struct exs_param_def *d = exs__params_find(name);
    char old[EXS_PARAM_STR_MAX + 32], now[EXS_PARAM_STR_MAX + 32];
    char msg[256];
    int ret;

    if (!d) {
        snprintf(msg, sizeof(msg), "no tunable named %s (exsctl params lists them)", name);
        reply_error(b, ENOENT, msg);
        return;
    }
    if (!d->online) {
        snprintf(msg, sizeof(msg),
                 "%s is offline: read once at start; set %s in the environment and restart", name,
                 d->env);
        reply_error(b, EPERM, msg);
        return;
    }
    if (exs__params_get(name, old, sizeof(old)) < 0)
        old[0] = '\0';
    ret = exs__params_set(name, value);
    if (ret < 0) {
        snprintf(msg, sizeof(msg), "%s: invalid value \"%s\" (%s)", name, value, d->help);
        reply_error(b, -ret, msg);
        return;
    }
    if (exs__params_get(name, now, sizeof(now)) < 0)
        now[0] = '\0';
    EXS_INFO(API, "control endpoint: %s changed from \"%s\" to \"%s\"", name, old, now);
    reply_head(b);
    exs__jbuf_kv_str(b, "name", name);
    exs__jbuf_kv_str(b, "old", old);
    exs__jbuf_kv_str(b, "value", now);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

/* ---- clients ---- */

static void ctl_client_io_cb(struct exs_eng_io *io, int revents);
static void ctl_sweep_cb(struct exs_eng_timer *t);

static void client_watch(struct ctl_client *c)
{
    int pending = c->out_off < c->out.len || c->walk;
    /* a complete request waits in c->in (pipelined): served from the next callback */
    int queued = !pending && !c->trace && !c->closing && memchr(c->in, '\n', c->in_len);
    /* Reading waits while a reply is pending (one request at a time): a client that
     * does not read cannot make us queue more. Trace clients are read for EOF only. */
    int ev = (pending || queued ? EV_WRITE : 0) | (!pending || c->trace ? EV_READ : 0);

    if (c->closing)
        ev = EV_WRITE;
    if (ev == c->events)
        return;
    exs__engine_io_start(&c->io, c->fd, ev, ctl_client_io_cb);
    c->events = ev;
}

static void client_close(struct ctl_client *c, const char *why)
{
    EXS_DBG(API, "control client fd %d: closed (%s)", c->fd, why);
    exs__engine_io_stop(&c->io);
    close(c->fd);
    if (c->trace)
        __atomic_sub_fetch(&ctl.tracers, 1, __ATOMIC_RELAXED);
    if (c->walk)
        stat_walk_end(c);
    exs_list_del(&c->link);
    ctl.nclients--;
    exs__jbuf_free(&c->out);
    free(c);
}

/* Write what is pending; 0, or -1 when the client was closed. */
static int client_flush(struct ctl_client *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            client_close(c, "write failed");
            return -1;
        }
        c->out_off += (size_t)n;
        c->active_ns = exs__now_ns();
    }
    if (c->out_off == c->out.len) {
        int comma = c->out.comma;

        exs__jbuf_reset(&c->out);
        c->out_off = 0;
        if (c->walk)
            c->out.comma = comma; /* a stat continues the same JSON text */
        if (c->closing) {
            client_close(c, "reply written");
            return -1;
        }
    }
    return 0;
}

/* Split a request line into at most max words (spaces separate). -E2BIG: too many. */
static int split_words(char *line, char **w, int max)
{
    int n = 0;

    for (char *p = line; *p;) {
        while (*p == ' ')
            *p++ = '\0';
        if (!*p)
            break;
        if (n == max)
            return -E2BIG;
        w[n++] = p;
        while (*p && *p != ' ')
            p++;
    }
    return n;
}

/* One request line (NUL-terminated, no newline). */
static void client_request_words(struct ctl_client *c, char *line);

/* One request, timed against slow_threshold_us like a progress pass (it holds the
 * progress lock: a stat of many connections is the longest). */
static void client_request(struct ctl_client *c, char *line)
{
    uint64_t slow_us = exs__params.slow_threshold_us;
    uint64_t t0 = slow_us ? exs__now_ns() : 0;
    char verb[16];

    snprintf(verb, sizeof(verb), "%.*s", (int)strcspn(line, " "), line);
    client_request_words(c, line);
    if (t0 && exs__now_ns() - t0 > slow_us * 1000u)
        EXS_WARN(API,
                 "slow control request: \"%s\" held the progress lock %" PRIu64
                 " us (slow_threshold_us %" PRIu64 "), reply %zu bytes",
                 verb, (exs__now_ns() - t0) / 1000u, slow_us, c->out.len);
}

static void client_request_words(struct ctl_client *c, char *line)
{
    struct exs_jbuf *b = &c->out;
    char *w[4];
    int n;

    for (const char *p = line; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) {
            reply_error(b, EINVAL, "a request is one line of printable ASCII");
            c->closing = 1;
            return;
        }
    n = split_words(line, w, 4);
    if (n < 0 || n == 0) {
        reply_error(b, EINVAL, "empty request or too many words");
        return;
    }
    if (!strcmp(w[0], "hello") && n == 1) {
        reply_head(b);
        exs__jbuf_obj_end(b);
        exs__jbuf_raw(b, "\n", 1);
    } else if (!strcmp(w[0], "stat") && n == 1) {
        req_stat(c);
    } else if (!strcmp(w[0], "params") && n == 1) {
        req_params(b);
    } else if (!strcmp(w[0], "set") && n == 3) {
        req_set(b, w[1], w[2]);
    } else if (!strcmp(w[0], "trace") && n == 1) {
        if (!c->trace) {
            c->trace = 1;
            __atomic_add_fetch(&ctl.tracers, 1, __ATOMIC_RELAXED);
        }
        reply_head(b);
        exs__jbuf_key(b, "trace");
        exs__jbuf_bool(b, 1);
        kv_log_level(b);
        exs__jbuf_obj_end(b);
        exs__jbuf_raw(b, "\n", 1);
    } else {
        reply_error(b, EINVAL, "unknown request (hello, stat, params, set NAME VALUE, trace)");
    }
    if (b->overflow) {
        exs__jbuf_reset(b);
        reply_error(b, E2BIG, "reply larger than the control endpoint's limit");
    }
}

/* Handle the complete lines in c->in, one while no reply is pending. */
static void client_lines(struct ctl_client *c)
{
    char *nl;

    while (c->out_off == c->out.len && !c->closing && !c->trace && !c->walk &&
           (nl = memchr(c->in, '\n', c->in_len))) {
        size_t used = (size_t)(nl - c->in) + 1;

        *nl = '\0';
        if (nl > c->in && nl[-1] == '\r')
            nl[-1] = '\0';
        client_request(c, c->in);
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
    }
    if (c->in_len == sizeof(c->in) && !memchr(c->in, '\n', c->in_len) && !c->closing) {
        exs__jbuf_reset(&c->out);
        reply_error(&c->out, E2BIG, "request line too long");
        c->closing = 1;
    }
}

static void ctl_client_io_cb(struct exs_eng_io *io, int revents)
{
    struct ctl_client *c = exs_container_of(io, struct ctl_client, io);

    if ((revents & EV_WRITE) && client_flush(c) < 0)
        return;
    if ((revents & EV_READ) && !c->closing) {
        char trash[256];
        char *dst = c->trace ? trash : c->in + c->in_len;
        size_t room = c->trace ? sizeof(trash) : sizeof(c->in) - c->in_len;
        /* a full c->in holds a complete line (client_lines answers a full one without) */
        ssize_t n = room ? recv(c->fd, dst, room, MSG_DONTWAIT) : -1;

        if (room && (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))) {
            client_close(c, n == 0 ? "end of file" : "read failed");
            return;
        }
        if (n > 0 && !c->trace) {
            c->in_len += (size_t)n;
            c->active_ns = exs__now_ns();
        }
    }
    /* a stat in progress: its next part once the previous one is written */
    if (c->walk && c->out_off == c->out.len) {
        uint64_t slow_us = exs__params.slow_threshold_us;
        uint64_t t0 = slow_us ? exs__now_ns() : 0;

        stat_step(c);
        if (t0 && exs__now_ns() - t0 > slow_us * 1000u)
            EXS_WARN(API,
                     "slow control request: a part of \"stat\" held the progress lock %" PRIu64
                     " us (slow_threshold_us %" PRIu64 "), %zu bytes",
                     (exs__now_ns() - t0) / 1000u, slow_us, c->out.len);
        if (c->out.overflow) {
            client_close(c, "stat reply part too large");
            return;
        }
    }
    client_lines(c);
    if (c->out_off < c->out.len && client_flush(c) < 0)
        return;
    client_watch(c);
}

/* Best effort, nonblocking: a refusal the client can print, then close. */
static void refuse(int fd, int err, const char *msg)
{
    struct exs_jbuf b;

    exs__jbuf_init(&b, 1024);
    reply_error(&b, err, msg);
    if (b.len && send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        EXS_DBG(API, "control endpoint: refusal not sent: %m");
    exs__jbuf_free(&b);
    close(fd);
}

static void ctl_accept_cb(struct exs_eng_io *io, int revents)
{
    (void)io;
    (void)revents;
    for (int i = 0; i < EXS_CTL_CLIENTS_MAX; i++) {
        struct ucred cred;
        socklen_t clen = sizeof(cred);
        struct ctl_client *c;
        char msg[160];
        int fd = accept4(ctl.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                EXS_WARN(API, "control endpoint: accept: %m");
            return;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
            EXS_WARN(API, "control endpoint: SO_PEERCRED: %m");
            close(fd);
            continue;
        }
        if (cred.uid != geteuid() && cred.uid != 0) {
            EXS_WARN(API, "control endpoint: uid %u (pid %d) refused: only uid %u or root",
                     (unsigned)cred.uid, (int)cred.pid, (unsigned)geteuid());
            snprintf(msg, sizeof(msg),
                     "uid %u may not control a process of uid %u (only its user or root)",
                     (unsigned)cred.uid, (unsigned)geteuid());
            refuse(fd, EACCES, msg);
            continue;
        }
        if (ctl.nclients >= EXS_CTL_CLIENTS_MAX) {
            refuse(fd, EBUSY, "too many control clients at once");
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
            refuse(fd, ENOMEM, "no memory");
            continue;
        }
        c->fd = fd;
        c->active_ns = exs__now_ns();
        exs__jbuf_init(&c->out, EXS_CTL_REPLY_MAX);
        exs_list_add_tail(&ctl.clients, &c->link);
        ctl.nclients++;
        client_watch(c);
        if (!ctl.sweeping) {
            exs__engine_timer_start(&ctl.sweep, CTL_SWEEP_MS, ctl_sweep_cb);
            ctl.sweeping = 1;
        }
    }
}

/* ---- trace records ---- */

/* Queue one record "<t_us> <kind><text>" (kind 'L': a log line ending in '\n'; 'R': a
 * request trace, one JSON object, given without its '\n') and wake the loop. */
static void ctl_queue(char kind, const char *line, size_t len)
{
    char head[32];
    int hlen, wake = 0;
    uint64_t one = 1;
    size_t nl = kind == 'R';

    if (!__atomic_load_n(&ctl.tracers, __ATOMIC_RELAXED))
        return;
    hlen = snprintf(head, sizeof(head), "%" PRIu64 " %c", exs__now_us(), kind);
    pthread_mutex_lock(&ctl.tlock);
    if (ctl.tlen + (size_t)hlen + len + nl <= sizeof(ctl.tring)) {
        wake = ctl.tlen == 0;
        memcpy(ctl.tring + ctl.tlen, head, (size_t)hlen);
        memcpy(ctl.tring + ctl.tlen + (size_t)hlen, line, len);
        if (nl)
            ctl.tring[ctl.tlen + (size_t)hlen + len] = '\n';
        ctl.tlen += (size_t)hlen + len + nl;
    } else {
        ctl.tdropped++;
    }
    pthread_mutex_unlock(&ctl.tlock);
    if (wake && write(ctl.efd, &one, sizeof(one)) < 0) {
        /* the counter cannot overflow from ones: nothing to do */
    }
}

/* The logger's hook (any thread, any lock held). */
static void ctl_log_hook(const char *line, size_t len)
{
    ctl_queue('L', line, len);
}

/* The request tracer's sink (any thread, a conn lock held): one completed trace. */
static void ctl_rt_sink(const char *json, size_t len)
{
    ctl_queue('R', json, len);
}

/* One record "<t_us> <kind><text>\n" to every tracer: {"t_us","log"} for a log line,
 * {"t_us","req":{...}} for a request trace (spec/observability.md §8). */
static void trace_send(const char *rec, size_t len, uint64_t dropped)
{
    struct exs_list *pos, *tmp;
    const char *sp = memchr(rec, ' ', len);

    if (!sp || (size_t)(sp + 2 - rec) > len)
        return;
    exs_list_for_each_safe(pos, tmp, &ctl.clients)
    {
        struct ctl_client *c = exs_list_entry(pos, struct ctl_client, link);
        struct exs_jbuf *b = &c->out;
        size_t before = b->len;

        if (!c->trace || c->closing)
            continue;
        if (b->len - c->out_off > EXS_CTL_TRACE_MAX) {
            c->dropped++;
            continue;
        }
        exs__jbuf_obj_begin(b);
        exs__jbuf_kv_u64(b, "t_us", strtoull(rec, NULL, 10));
        if (sp[1] == 'R') {
            /* our own formatting (exs__reqtrace_format): an object, copied as it is */
            exs__jbuf_key(b, "req");
            exs__jbuf_raw(b, sp + 2, len - (size_t)(sp + 2 - rec) - 1);
            b->comma = 1;
        } else {
            exs__jbuf_key(b, "log");
            exs__jbuf_strn(b, sp + 2, len - (size_t)(sp + 2 - rec) - 1);
        }
        if (dropped + c->dropped)
            exs__jbuf_kv_u64(b, "dropped", dropped + c->dropped);
        exs__jbuf_obj_end(b);
        exs__jbuf_raw(b, "\n", 1);
        if (b->overflow) {
            b->len = before;
            b->overflow = 0;
            c->dropped++;
        } else {
            c->dropped = 0;
        }
        b->comma = 0;
    }
}

static void ctl_trace_cb(struct exs_eng_io *io, int revents)
{
    uint64_t v, dropped;
    size_t len;
    struct exs_list *pos, *tmp;

    (void)io;
    (void)revents;
    if (read(ctl.efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        EXS_DBG(API, "control endpoint: eventfd read: %m");
    pthread_mutex_lock(&ctl.tlock);
    len = ctl.tlen;
    memcpy(ctl_drain_buf, ctl.tring, len);
    ctl.tlen = 0;
    dropped = ctl.tdropped;
    ctl.tdropped = 0;
    pthread_mutex_unlock(&ctl.tlock);
    for (size_t off = 0; off < len;) {
        const char *nl = memchr(ctl_drain_buf + off, '\n', len - off);
        size_t rlen = nl ? (size_t)(nl - (ctl_drain_buf + off)) + 1 : len - off;

        trace_send(ctl_drain_buf + off, rlen, dropped);
        dropped = 0;
        off += rlen;
    }
    exs_list_for_each_safe(pos, tmp, &ctl.clients)
    {
        struct ctl_client *c = exs_list_entry(pos, struct ctl_client, link);

        if (c->trace && client_flush(c) == 0)
            client_watch(c);
    }
}

/* ---- sweep: stalled and idle clients ---- */

static void ctl_sweep_cb(struct exs_eng_timer *t)
{
    uint64_t now = exs__now_ns();
    uint64_t limit = exs__params.ctl_timeout_ms * 1000000u;
    struct exs_list *pos, *tmp;

    exs_list_for_each_safe(pos, tmp, &ctl.clients)
    {
        struct ctl_client *c = exs_list_entry(pos, struct ctl_client, link);
        int pending = c->out_off < c->out.len;

        /* a tracer with nothing to read is waiting for records, not idle */
        if (now - c->active_ns > limit && (pending || !c->trace)) {
            EXS_WARN(API, "control client fd %d: %s for %" PRIu64 " ms: dropped", c->fd,
                     pending ? "does not read its reply" : "sent no request",
                     exs__params.ctl_timeout_ms);
            client_close(c, "timeout");
        }
    }
    /* no client, no timer: an idle process is not woken for the endpoint */
    ctl.sweeping = !exs_list_empty(&ctl.clients);
    if (ctl.sweeping)
        exs__engine_timer_start(t, CTL_SWEEP_MS, ctl_sweep_cb);
}

/* ---- start and stop ---- */

static void ctl_start_job(void *arg)
{
    (void)arg;
    exs__engine_io_start(&ctl.lio, ctl.lfd, EV_READ, ctl_accept_cb);
    exs__engine_io_start(&ctl.eio, ctl.efd, EV_READ, ctl_trace_cb);
    ctl.sweeping = 0;
    ctl.running = 1;
}

static void ctl_stop_job(void *arg)
{
    struct exs_list *n;

    (void)arg;
    if (!ctl.running)
        return;
    exs__engine_io_stop(&ctl.lio);
    exs__engine_io_stop(&ctl.eio);
    if (ctl.sweeping)
        exs__engine_timer_stop(&ctl.sweep);
    ctl.sweeping = 0;
    while ((n = ctl.clients.next) != &ctl.clients)
        client_close(exs_list_entry(n, struct ctl_client, link), "library finishing");
    ctl.running = 0;
}

/* Remove our socket file: only in the process that made it, and only while the name is
 * still a socket of our uid (in a shared directory nothing else may go). */
static void ctl_unlink(void)
{
    struct stat st;

    if (ctl.path[0] && ctl.owner == getpid() && lstat(ctl.path, &st) == 0 && S_ISSOCK(st.st_mode) &&
        st.st_uid == geteuid())
        unlink(ctl.path);
    ctl.path[0] = '\0';
}

static void ctl_atexit(void)
{
    ctl_unlink();
}

/* Bind lfd as name in the checked directory dfd (path: its name, for the log): through
 * /proc/self/fd, so the directory bound in is the one checked (the path when /proc is not
 * there). A stale file of an earlier process with our pid is removed when it is a socket
 * of our uid; anything else there is left alone and the endpoint stays off. */
static int ctl_bind_at(int dfd, const char *name, const char *path)
{
    struct sockaddr_un sa;
    struct stat st;
    int ret;

    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
            EXS_WARN(API, "control endpoint: %s exists and is not a socket of uid %u: not used",
                     path, (unsigned)geteuid());
            return -EEXIST;
        }
        unlinkat(dfd, name, 0);
    }
    exs__ctl_sockaddr_at(dfd, name, &sa);
    ret = bind(ctl.lfd, (struct sockaddr *)&sa, sizeof(sa));
    if (ret < 0 && errno == ENOENT) { /* no /proc */
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        ret = bind(ctl.lfd, (struct sockaddr *)&sa, sizeof(sa));
    }
    if (ret < 0) {
        ret = -errno;
        EXS_WARN(API, "control endpoint: bind %s: %m", path);
        return ret;
    }
    snprintf(ctl.path, sizeof(ctl.path), "%s", path);
    ctl.owner = getpid();
    /* the name is ours now: no one else may remove or replace it, shared directory or not */
    if (fchmodat(dfd, name, 0600, 0) < 0) {
        ret = -errno;
        EXS_WARN(API, "control endpoint: chmod %s: %m", path);
        return ret;
    }
    return 0;
}

int exs__ctl_start(void)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], path[sizeof(dir)], name[32], why[160];
    int ret, n, dfd, shared;

    ret = exs__ctl_dir(dir, sizeof(dir), 1);
    if (ret < 0)
        goto err;
    snprintf(name, sizeof(name), "%d.sock", (int)getpid());
    n = snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        EXS_WARN(API, "control endpoint: directory name %s too long for a socket", dir);
        ret = -ENAMETOOLONG;
        goto err;
    }
    dfd = exs__ctl_dir_open(dir, EXS_CTL_UID_LIB, &shared, why, sizeof(why));
    if (dfd < 0) {
        ret = dfd;
        EXS_WARN(API,
                 "control endpoint: directory %s %s: not used, no endpoint "
                 "(spec/observability.md §2)",
                 dir, why);
        goto err;
    }
    ctl.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ctl.lfd < 0) {
        ret = -errno;
        EXS_WARN(API, "control endpoint: socket: %m");
        goto err_dir;
    }
    ret = ctl_bind_at(dfd, name, path);
    if (ret < 0)
        goto err_unlink;
    if (listen(ctl.lfd, EXS_CTL_CLIENTS_MAX) < 0) {
        ret = -errno;
        EXS_WARN(API, "control endpoint: listen %s: %m", ctl.path);
        goto err_unlink;
    }
    /* The eventfd lives as long as the process: a logger thread that saw a tracer just
     * before exs__ctl_stop may still write to it, and must never write to a reused fd. */
    if (ctl.efd < 0)
        ctl.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctl.efd < 0) {
        ret = -errno;
        EXS_WARN(API, "control endpoint: eventfd: %m");
        goto err_unlink;
    }
    close(dfd);
    if (!ctl.atexit_done) {
        atexit(ctl_atexit);
        ctl.atexit_done = 1;
    }
    exs_list_init(&ctl.clients);
    ctl.nclients = 0;
    ctl.start_ns = exs__now_ns();
    exs__log_set_hook(ctl_log_hook);
    exs__reqtrace_set_sink(ctl_rt_sink);
    exs__engine_call(ctl_start_job, NULL);
    EXS_INFO(API, "control endpoint %s%s", ctl.path, shared ? " (in a shared directory)" : "");
    return 0;

err_unlink:
    ctl_unlink();
    close(ctl.lfd);
    ctl.lfd = -1;
err_dir:
    close(dfd);
err:
    return ret;
}

void exs__ctl_stop(void)
{
    if (ctl.lfd < 0)
        return;
    exs__engine_call(ctl_stop_job, NULL);
    exs__log_set_hook(NULL);
    exs__reqtrace_set_sink(NULL);
    ctl_unlink();
    close(ctl.lfd);
    ctl.lfd = -1;
    pthread_mutex_lock(&ctl.tlock);
    ctl.tlen = 0;
    ctl.tdropped = 0;
    pthread_mutex_unlock(&ctl.tlock);
}
