/* SPDX-License-Identifier: MIT */
/* The control endpoint: one Unix stream socket per process, served without blocking by the
 * progress loop; requests are hostile text lines, replies JSON lines (spec/observability.md). */
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
#include "exs/ctl/ctl.h"
#include "exs/ctl/ctl_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/json.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

#define CTL_TRACE_RING (64u << 10) /* log bytes queued between the logger and the loop */
#define CTL_SWEEP_MS   100         /* how often stalled and idle clients are looked for */

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

uint64_t exs__ctl_uptime_ms(void)
{
    return (exs__now_ns() - ctl.start_ns) / 1000000u;
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
    exs__nc_close(c->fd);
    if (c->trace)
        __atomic_sub_fetch(&ctl.tracers, 1, __ATOMIC_RELAXED);
    if (c->walk)
        exs__ctl_stat_walk_end(c);
    exs_list_del(&c->link);
    ctl.nclients--;
    exs__jbuf_free(&c->out);
    free(c);
}

/* Write what is pending; 0, or -1 when the client was closed. */
static int client_flush(struct ctl_client *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = exs__nc_send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off,
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
            exs__ctl_reply_error(b, EINVAL, "a request is one line of printable ASCII");
            c->closing = 1;
            return;
        }
    n = split_words(line, w, 4);
    if (n < 0 || n == 0) {
        exs__ctl_reply_error(b, EINVAL, "empty request or too many words");
        return;
    }
    if (!strcmp(w[0], "hello") && n == 1) {
        exs__ctl_reply_head(b);
        exs__jbuf_obj_end(b);
        exs__jbuf_raw(b, "\n", 1);
    } else if (!strcmp(w[0], "stat") && n == 1) {
        exs__ctl_req_stat(c);
    } else if (!strcmp(w[0], "params") && n == 1) {
        exs__ctl_req_params(b);
    } else if (!strcmp(w[0], "set") && n == 3) {
        exs__ctl_req_set(b, w[1], w[2]);
    } else if (!strcmp(w[0], "trace") && n == 1) {
        if (!c->trace) {
            c->trace = 1;
            __atomic_add_fetch(&ctl.tracers, 1, __ATOMIC_RELAXED);
        }
        exs__ctl_reply_head(b);
        exs__jbuf_key(b, "trace");
        exs__jbuf_bool(b, 1);
        exs__ctl_kv_log_level(b);
        exs__jbuf_obj_end(b);
        exs__jbuf_raw(b, "\n", 1);
    } else {
        exs__ctl_reply_error(b, EINVAL,
                             "unknown request (hello, stat, params, set NAME VALUE, trace)");
    }
    if (b->overflow) {
        exs__jbuf_reset(b);
        exs__ctl_reply_error(b, E2BIG, "reply larger than the control endpoint's limit");
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
        exs__ctl_reply_error(&c->out, E2BIG, "request line too long");
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
        ssize_t n = room ? exs__nc_recv(c->fd, dst, room, MSG_DONTWAIT) : -1;

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

        exs__ctl_stat_step(c);
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
    exs__ctl_reply_error(&b, err, msg);
    if (b.len && exs__nc_send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        EXS_DBG(API, "control endpoint: refusal not sent: %m");
    exs__jbuf_free(&b);
    exs__nc_close(fd);
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
        int fd = exs__nc_accept4(ctl.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                EXS_WARN(API, "control endpoint: accept: %m");
            return;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
            EXS_WARN(API, "control endpoint: SO_PEERCRED: %m");
            exs__nc_close(fd);
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
 * request trace, 'V': a violation, one JSON object, given without its '\n') and wake the
 * loop. */
static void ctl_queue(char kind, const char *line, size_t len)
{
    char head[32];
    int hlen, wake = 0;
    uint64_t one = 1;
    size_t nl = kind != 'L';

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
    if (wake && exs__nc_write(ctl.efd, &one, sizeof(one)) < 0) {
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

/* The violation sink (any thread, a conn lock held): a protocol violation recorded. */
static void ctl_pv_sink(const char *json, size_t len)
{
    ctl_queue('V', json, len);
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
        if (sp[1] == 'R' || sp[1] == 'V') {
            /* our own formatting (exs__reqtrace_format, exs__pv_format): an object, as it is */
            exs__jbuf_key(b, sp[1] == 'R' ? "req" : "violation");
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
    if (exs__nc_read(ctl.efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
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
    /* closed here, under the progress lock as the loop's own calls on it: closed after
     * the job by the caller, the loop could still act on the descriptor (libev removes a
     * stopped descriptor when an event of it comes, epoll_ctl in the loop thread) while
     * the caller closes it, or after its number went to another file (TSan: exs_fini in
     * test_ctl_dir_modes over shm) */
    exs__nc_close(ctl.lfd);
    ctl.lfd = -1;
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
    exs__nc_close(dfd);
    if (!ctl.atexit_done) {
        atexit(ctl_atexit);
        ctl.atexit_done = 1;
    }
    exs_list_init(&ctl.clients);
    ctl.nclients = 0;
    ctl.start_ns = exs__now_ns();
    exs__log_set_hook(ctl_log_hook);
    exs__reqtrace_set_sink(ctl_rt_sink);
    exs__pv_set_sink(ctl_pv_sink);
    exs__engine_call(ctl_start_job, NULL);
    EXS_INFO(API, "control endpoint %s%s", ctl.path, shared ? " (in a shared directory)" : "");
    return 0;

err_unlink:
    ctl_unlink();
    exs__nc_close(ctl.lfd);
    ctl.lfd = -1;
err_dir:
    exs__nc_close(dfd);
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
    exs__pv_set_sink(NULL);
    ctl_unlink();
    if (ctl.lfd >= 0) { /* the job did not run: the endpoint never started its watchers */
        exs__nc_close(ctl.lfd);
        ctl.lfd = -1;
    }
    pthread_mutex_lock(&ctl.tlock);
    ctl.tlen = 0;
    ctl.tdropped = 0;
    pthread_mutex_unlock(&ctl.tlock);
}

/* A forked child (fork.c; the progress lock, under which clients come and go, was held
 * across the fork): the endpoint is the parent's. The child closes its copies of the
 * listening socket, the clients' sockets and the trace eventfd (none is written: the
 * parent's clients hear nothing from the child), leaves the socket file to its owner
 * (its name is forgotten here), and drops the hooks; exs_init in the child starts an
 * endpoint of its own. */
void exs__ctl_fork_child(void)
{
    struct exs_list *n;

    exs__log_set_hook(NULL);
    exs__reqtrace_set_sink(NULL);
    exs__pv_set_sink(NULL);
    if (ctl.lfd >= 0) {
        exs_list_for_each(n, &ctl.clients)
        {
            struct ctl_client *c = exs_list_entry(n, struct ctl_client, link);

            if (c->fd >= 0)
                exs__nc_close(c->fd);
            c->fd = -1;
            exs__forsake(c);
        }
        exs__nc_close(ctl.lfd);
    }
    if (ctl.efd >= 0)
        exs__nc_close(ctl.efd);
    ctl.lfd = ctl.efd = -1;
    ctl.running = ctl.sweeping = 0;
    exs_list_init(&ctl.clients);
    ctl.nclients = 0;
    ctl.path[0] = '\0';
    pthread_mutex_init(&ctl.tlock, NULL);
    ctl.tracers = 0;
    ctl.tlen = 0;
    ctl.tdropped = 0;
}
