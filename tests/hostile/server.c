/* SPDX-License-Identifier: MIT */
/* The echo server under attack (a forked ES-API child) and a well-behaved client. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/hostile/raw.h"
#include "tests/hostile/server.h"

#define SRV_MSG_MAX  65536
#define SRV_MAX_CONN 4096

struct srv_client {
    int fd;
    int open;
    char *buf;
};

static struct srv_client *srv_clients[SRV_MAX_CONN];
static int srv_nclients;

static struct srv_client *srv_add(int fd)
{
    struct srv_client *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->buf = malloc(SRV_MSG_MAX);
    if (!c->buf) {
        free(c);
        return NULL;
    }
    c->fd = fd;
    c->open = 1;
    if (srv_nclients < SRV_MAX_CONN)
        srv_clients[srv_nclients++] = c;
    return c;
}

/* A transfer of c ended with err: its reason to the parent (srv_reason), one line. */
static void srv_tell_reason(int why, struct srv_client *c, int err)
{
    char reason[EXS_ERROR_REASON_MAX], line[EXS_ERROR_REASON_MAX + 16];
    socklen_t len = sizeof(reason);
    int n;

    if (exs_getsockopt(c->fd, SOL_EXS, EXS_SO_ERROR_REASON, reason, &len) < 0)
        snprintf(reason, sizeof(reason), "(getsockopt: %s)", strerror(errno));
    n = snprintf(line, sizeof(line), "%d %s\n", err, reason);
    if (n > (int)sizeof(line) - 1)
        n = (int)sizeof(line) - 1;
    if (n > 0 && write(why, line, (size_t)n) < 0) {
        /* the pipe is full (nobody reads): dropped */
    }
}

static void srv_close_client(exs_qhandle_t q, struct srv_client *c)
{
    if (!c->open)
        return;
    c->open = 0;
    if (exs_close(c->fd, q, c) < 0)
        fprintf(stderr, "hostile server: exs_close(%d): %s\n", c->fd, strerror(errno));
}

static void srv_post_accept(int lfd, exs_qhandle_t q)
{
    while (exs_accept(lfd, q, NULL) < 0) {
        fprintf(stderr, "hostile server: exs_accept: %s\n", strerror(errno));
        usleep(10000);
    }
}

/* The child: listen on port, tell the parent through ready, echo until killed. */
static void srv_main(const struct srv_opts *o, int port, int ready, int ctl, int why)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    exs_qhandle_t q;
    int lfd;
    char ok = 1;

    if (exs_init(EXS_VERSION) < 0)
        _exit(2);
    q = exs_qcreate(4096);
    lfd = exs_socket(AF_INET, o->sock_type, 0);
    if (q == EXS_QHANDLE_INVALID || lfd < 0 ||
        exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(lfd, 128) < 0) {
        perror("hostile server: listen");
        _exit(3);
    }
    if (write(ready, &ok, 1) != 1)
        _exit(4);
    close(ready);
    srv_post_accept(lfd, q);
    for (;;) {
        exs_event_t ev;
        struct pollfd pfd = {.fd = ctl, .events = POLLIN};
        char cmd;

        if (poll(&pfd, 1, 0) == 1) {
            if (read(ctl, &cmd, 1) != 1)
                _exit(0); /* the test went away */
            if (cmd == 'x') {
                for (int i = 0; i < srv_nclients; i++) {
                    if (srv_clients[i]->open) {
                        srv_close_client(q, srv_clients[i]);
                        break;
                    }
                }
            }
        }
        if (exs_qdequeue(q, &ev, 1, &tick) != 1)
            continue;
        struct srv_client *c = ev.exs_evt_ahandle;
        ssize_t n = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;

        switch (ev.exs_evt_type) {
        case EXS_EVT_ACCEPT:
            if (ev.exs_evt_errno) {
                fprintf(stderr, "hostile server: accept: %s\n", strerror(ev.exs_evt_errno));
                usleep(10000); /* our own back-off: the library's is what is measured */
                srv_post_accept(lfd, q);
                break;
            }
            c = srv_add(ev.exs_evt_u.exs_evt_accept.exs_evt_newfd);
            if (c && o->close_at_once) {
                srv_close_client(q, c);
                srv_post_accept(lfd, q);
                break;
            }
            if (!c || exs_recv(c->fd, c->buf, SRV_MSG_MAX, 0, q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                fprintf(stderr, "hostile server: cannot serve a connection\n");
            srv_post_accept(lfd, q);
            break;
        case EXS_EVT_RECV:
            if (!c->open)
                break;
            if (ev.exs_evt_errno || n == 0) {
                if (ev.exs_evt_errno)
                    srv_tell_reason(why, c, ev.exs_evt_errno);
                srv_close_client(q, c);
                break;
            }
            if (exs_send(c->fd, c->buf, (size_t)n, 0, q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                srv_close_client(q, c);
            break;
        case EXS_EVT_SEND:
            if (!c->open)
                break;
            if (ev.exs_evt_errno ||
                exs_recv(c->fd, c->buf, SRV_MSG_MAX, 0, q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                srv_close_client(q, c);
            break;
        case EXS_EVT_CLOSE:
            /* keep the buffer: a forged transfer after close must still land in live memory
             * for ASan to judge the library, not the test */
            break;
        default:
            break;
        }
    }
}

int srv_start(struct srv *s, const struct srv_opts *o)
{
    int ready[2], ctl[2], why[2];
    char ok;

    memset(s, 0, sizeof(*s));
    s->port = raw_free_port();
    if (s->port < 0)
        return s->port;
    /* the fallback listens on port + EXS_FALLBACK_PORT_OFFSET (1-32767): two free ports,
     * the second above the first */
    for (int tries = 0; o->resumable && !s->fb_port && tries < 64; tries++) {
        int fb = raw_free_port();

        if (fb > s->port && fb - s->port <= 32767)
            s->fb_port = fb;
        else if (fb > 0)
            s->port = fb;
    }
    if (o->resumable && !s->fb_port)
        return -EADDRINUSE;
    if (pipe(ready) || pipe(ctl) || pipe2(why, O_NONBLOCK | O_CLOEXEC))
        return -errno;
    s->pid = fork();
    if (s->pid < 0)
        return -errno;
    if (s->pid == 0) {
        /* never outlive the test (a failed assertion exits it at once) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(0);
        close(ready[0]);
        close(ctl[1]);
        close(why[0]);
        setenv("EXS_PROVIDER", "tcp", 1);
        if (o->resumable) { /* tcp has no fallback: the same wire through fault:tcp */
            char off[16];

            snprintf(off, sizeof(off), "%d", s->fb_port - s->port);
            setenv("EXS_PROVIDER", "fault:tcp", 1);
            setenv("EXS_FALLBACK", "any", 1);
            setenv("EXS_FALLBACK_PORT_OFFSET", off, 1);
        }
        if (!getenv("EXS_LOG_LEVEL"))
            setenv("EXS_LOG_LEVEL", "err", 1);
        if (o->quiet) {
            int null = open("/dev/null", O_WRONLY);

            if (null >= 0)
                dup2(null, 2);
        }
        if (o->nofile) {
            struct rlimit rl = {.rlim_cur = (rlim_t)o->nofile, .rlim_max = (rlim_t)o->nofile};

            if (setrlimit(RLIMIT_NOFILE, &rl))
                _exit(5);
        }
        srv_main(o, s->port, ready[1], ctl[0], why[1]);
        _exit(0);
    }
    close(ready[1]);
    close(ctl[0]);
    close(why[1]);
    s->ctl = ctl[1];
    s->why = why[0];
    signal(SIGPIPE, SIG_IGN);
    if (read(ready[0], &ok, 1) != 1) {
        close(ready[0]);
        srv_running(s);
        return -ECHILD;
    }
    close(ready[0]);
    return 0;
}

int srv_close_oldest(struct srv *s)
{
    return write(s->ctl, "x", 1) == 1 ? 0 : -errno;
}

int srv_running(struct srv *s)
{
    if (s->dead)
        return 0;
    if (waitpid(s->pid, &s->status, WNOHANG) == s->pid) {
        s->dead = 1;
        return 0;
    }
    return 1;
}

const char *srv_how(struct srv *s, char *buf, size_t len)
{
    if (srv_running(s))
        snprintf(buf, len, "running");
    else if (WIFSIGNALED(s->status))
        snprintf(buf, len, "killed by signal %d", WTERMSIG(s->status));
    else
        snprintf(buf, len, "exit %d", WEXITSTATUS(s->status));
    return buf;
}

void srv_stop(struct srv *s)
{
    if (s->pid > 0 && !s->dead) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &s->status, 0);
        s->dead = 1;
    }
    if (s->ctl > 0)
        close(s->ctl);
    s->ctl = -1;
    if (s->why > 0)
        close(s->why);
    s->why = -1;
}

int srv_reason(struct srv *s, char *buf, size_t len, int ms)
{
    struct timespec t0, now;
    size_t n = 0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n + 1 < len) { /* a byte at a time: the next line only, the rest stays */
        struct pollfd pfd = {.fd = s->why, .events = POLLIN};
        long left;

        clock_gettime(CLOCK_MONOTONIC, &now);
        left = ms - ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0 || poll(&pfd, 1, (int)left) != 1)
            break;
        if (read(s->why, buf + n, 1) != 1)
            break;
        if (buf[n] == '\n') {
            buf[n] = 0;
            return 0;
        }
        n++;
    }
    buf[n] = 0;
    return -ETIMEDOUT;
}

double srv_cpu_ms(struct srv *s)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)s->pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(buf, sizeof(buf), f)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

int srv_threads_snap(struct srv *s, struct srv_tsnap *out)
{
    char path[512], line[256];
    unsigned long long run, wait, v = 0, nv = 0;
    struct dirent *d;
    DIR *dir;

    out->n = 0;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)s->pid);
    dir = opendir(path);
    if (!dir)
        return -1;
    while ((d = readdir(dir)) && out->n < (int)(sizeof(out->t) / sizeof(out->t[0]))) {
        int ok = 0;
        FILE *f;

        if (d->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/schedstat", (int)s->pid, d->d_name);
        f = fopen(path, "r");
        if (!f)
            continue; /* the thread just ended */
        ok = fscanf(f, "%llu %llu", &run, &wait) == 2;
        fclose(f);
        snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)s->pid, d->d_name);
        f = ok ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        ok = 0;
        while (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1)
                ok |= 1;
            if (sscanf(line, "nonvoluntary_ctxt_switches: %llu", &nv) == 1)
                ok |= 2;
        }
        fclose(f);
        if (ok != 3)
            continue;
        out->t[out->n].tid = atoi(d->d_name);
        out->t[out->n].run_ms = (double)run / 1e6;
        out->t[out->n].wait_ms = (double)wait / 1e6;
        out->t[out->n].blocked = v;
        out->t[out->n].preempted = nv;
        out->n++;
    }
    closedir(dir);
    return 0;
}

int srv_spinning(const struct srv_tsnap *a, const struct srv_tsnap *b, char *why, size_t len)
{
    snprintf(why, len, "none");
    for (int i = 0; i < b->n; i++)
        for (int j = 0; j < a->n; j++) {
            double run = b->t[i].run_ms - a->t[j].run_ms;
            double wait = b->t[i].wait_ms - a->t[j].wait_ms;
            unsigned long long blocked = b->t[i].blocked - a->t[j].blocked;
            unsigned long long preempted = b->t[i].preempted - a->t[j].preempted;

            if (a->t[j].tid != b->t[i].tid || blocked >= 5)
                continue;
            if (run >= 1500 || (preempted >= 5 && run + wait >= 1500)) {
                snprintf(why, len,
                         "thread %d: %.0f ms on a CPU, %.0f ms waiting for one, blocked %llu "
                         "times, preempted %llu",
                         b->t[i].tid, run, wait, blocked, preempted);
                return b->t[i].tid;
            }
        }
    return 0;
}

/* ---- the well-behaved client ---- */

static int client_wait(exs_qhandle_t q, int type, exs_event_t *ev, double deadline)
{
    for (;;) {
        double left = deadline - raw_now_ms();
        struct timespec ts;

        if (left <= 0)
            return -ETIMEDOUT;
        ts.tv_sec = (time_t)(left / 1000);
        ts.tv_nsec = (long)((left - (double)ts.tv_sec * 1000) * 1e6);
        if (exs_qdequeue(q, ev, 1, &ts) == 1 && ev->exs_evt_type == type)
            return ev->exs_evt_errno ? -ev->exs_evt_errno : 0;
    }
}

int client_echo(int port, int sock_type, size_t n, int ms)
{
    static int inited;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double deadline = raw_now_ms() + ms;
    char *out = malloc(n), *in = calloc(1, n + 1);
    exs_qhandle_t q = EXS_QHANDLE_INVALID;
    exs_event_t ev;
    size_t got = 0;
    int fd = -1, err;

    if (!out || !in) {
        err = -ENOMEM;
        goto out;
    }
    if (!inited) {
        setenv("EXS_PROVIDER", "tcp", 1);
        if (exs_init(EXS_VERSION) < 0) {
            err = -errno;
            goto out;
        }
        inited = 1;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = (char)('a' + i % 26);
    q = exs_qcreate(64);
    fd = exs_socket(AF_INET, sock_type, 0);
    if (q == EXS_QHANDLE_INVALID || fd < 0) {
        err = -EMFILE;
        goto out;
    }
    if (exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, NULL) < 0) {
        err = -errno;
        goto out;
    }
    err = client_wait(q, EXS_EVT_CONNECT, &ev, deadline);
    if (err)
        goto out;
    if (exs_send(fd, out, n, 0, q, NULL, EXS_MHANDLE_UNREGISTERED) < 0) {
        err = -errno;
        goto out;
    }
    err = client_wait(q, EXS_EVT_SEND, &ev, deadline);
    while (!err && got < n) {
        if (exs_recv(fd, in + got, n - got, 0, q, NULL, EXS_MHANDLE_UNREGISTERED) < 0) {
            err = -errno;
            break;
        }
        err = client_wait(q, EXS_EVT_RECV, &ev, deadline);
        if (!err && ev.exs_evt_u.exs_evt_xfer.exs_evt_result <= 0)
            err = -ECONNRESET;
        if (!err)
            got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
    }
    if (!err && memcmp(in, out, n))
        err = -EBADMSG;
out:
    if (fd >= 0) {
        exs_close(fd, q, NULL);
        if (q != EXS_QHANDLE_INVALID)
            (void)client_wait(q, EXS_EVT_CLOSE, &ev, raw_now_ms() + 5000);
    }
    if (q != EXS_QHANDLE_INVALID)
        exs_qdelete(q);
    free(out);
    free(in);
    return err;
}
