/* SPDX-License-Identifier: MIT */
/* Helpers of the connection stress tests: the echo server process, client processes, /proc. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/stress/stress.h"

double st_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

long st_env_long(const char *name, long def)
{
    const char *v = getenv(name);

    return v && *v ? strtol(v, NULL, 0) : def;
}

int st_timeout_mult(void)
{
    long m = st_env_long("CK_TIMEOUT_MULTIPLIER", 1);

    return m < 1 ? 1 : (int)m;
}

void st_raise_nofile(long want)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("getrlimit(RLIMIT_NOFILE)");
        return;
    }
    if (want > 0 && (rlim_t)want > rl.rlim_max) {
        struct rlimit more = {.rlim_cur = (rlim_t)want, .rlim_max = (rlim_t)want};

        /* only a privileged process may go past the hard limit */
        if (setrlimit(RLIMIT_NOFILE, &more) == 0) {
            printf("RLIMIT_NOFILE raised to %ld, past the hard limit %lu\n", want,
                   (unsigned long)rl.rlim_max);
            return;
        }
        printf("RLIMIT_NOFILE: %ld wanted, hard limit %lu kept (%s)\n", want,
               (unsigned long)rl.rlim_max, strerror(errno));
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            perror("setrlimit(RLIMIT_NOFILE)");
    }
}

/* The echo server sample next to this binary: BUILD/tests/stress/x -> BUILD/samples/. */
static void server_path(char *buf, size_t len)
{
    const char *env = getenv("EXS_STRESS_SERVER");
    char exe[PATH_MAX];
    ssize_t n;

    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = '\0';
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(exe, '/');

        ck_assert_ptr_nonnull(slash);
        *slash = '\0';
    }
    ck_assert_int_lt(strlen(exe) + 32, len);
    strcpy(buf, exe);
    strcat(buf, "/samples/seqpacket_echo_server");
}

/* Read one line from fd within timeout_ms; 0 or -1. */
static int read_line(int fd, char *buf, size_t len, int timeout_ms)
{
    size_t got = 0;
    double end = st_now_ms() + timeout_ms;

    while (got + 1 < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)(end - st_now_ms());

        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return -1;
        if (read(fd, buf + got, 1) != 1)
            return -1;
        if (buf[got] == '\n')
            break;
        got++;
    }
    buf[got] = '\0';
    return 0;
}

/* One attempt to start the server: 0, or -1 when it exited before saying where it listens.
 * backlog > 0: its listen backlog and how many accepts it keeps posted. */
static int server_try(struct st_server *s, const char *path, long nofile, int backlog, int accepts)
{
    char line[256], port[16];
    int pfd[2], status;

    /* the sample takes port 0 (ephemeral); an old one ($EXS_STRESS_SERVER) a random port
     * below the ephemeral range */
    if (getenv("EXS_STRESS_SERVER"))
        snprintf(port, sizeof(port), "%d", 10000 + (int)(random() % 20000));
    else
        snprintf(port, sizeof(port), "0");
    ck_assert_int_eq(pipe(pfd), 0);
    s->pid = fork();
    ck_assert_int_ge(s->pid, 0);
    if (s->pid == 0) {
        close(pfd[0]);
        if (dup2(pfd[1], STDOUT_FILENO) < 0)
            _exit(126);
        close(pfd[1]);
        if (nofile > 0) {
            struct rlimit rl;

            getrlimit(RLIMIT_NOFILE, &rl);
            rl.rlim_cur = (rlim_t)nofile;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                _exit(126);
        }
        if (backlog > 0) {
            char b[16], a[16];

            snprintf(b, sizeof(b), "%d", backlog);
            snprintf(a, sizeof(a), "%d", accepts);
            execl(path, path, port, "0", "16384", b, a, NULL);
        } else {
            execl(path, path, port, NULL);
        }
        perror(path);
        _exit(127);
    }
    close(pfd[1]);
    if (read_line(pfd[0], line, sizeof(line), 20000 * st_timeout_mult()) < 0) {
        close(pfd[0]);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &status, 0);
        return -1;
    }
    close(pfd[0]);
    ck_assert_msg(sscanf(line, "echo server on 127.0.0.1:%d", &s->port) == 1,
                  "unexpected first line from %s: %s", path, line);
    return 0;
}

static void server_start(struct st_server *s, long nofile, int backlog, int accepts)
{
    char path[PATH_MAX];
    int tries = 0;

    server_path(path, sizeof(path));
    srandom((unsigned)getpid() ^ (unsigned)st_now_ms());
    while (server_try(s, path, nofile, backlog, accepts) < 0)
        ck_assert_msg(++tries < 5, "%s did not start", path);
    printf("server %s pid %d port %d%s\n", path, (int)s->pid, s->port,
           nofile > 0 ? " (low RLIMIT_NOFILE)" : "");
    fflush(stdout);
}

void st_server_start(struct st_server *s, long nofile)
{
    server_start(s, nofile, 0, 0);
}

void st_server_start_backlog(struct st_server *s, int backlog, int accepts)
{
    server_start(s, 0, backlog, accepts);
}

void st_server_stop(struct st_server *s)
{
    double t0 = st_now_ms();
    pid_t got;
    int status;

    ck_assert_int_eq(waitpid(s->pid, &status, WNOHANG), 0); /* still running */
    kill(s->pid, SIGTERM);
    /* it stops cleanly (exs_fini waits up to about 5 s); under AddressSanitizer a leak
     * makes its exit status nonzero */
    while ((got = waitpid(s->pid, &status, WNOHANG)) == 0 &&
           st_now_ms() - t0 < 60000.0 * st_timeout_mult())
        usleep(50 * 1000);
    if (got == 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &status, 0);
        ck_abort_msg("the server did not stop within 60 s of SIGTERM");
    }
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the server stopped with status %#x", status);
}

int st_proc_fds(pid_t pid)
{
    char path[64];
    struct dirent *de;
    int n = 0;
    DIR *d;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    d = opendir(path);
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

long st_proc_rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    ck_assert_int_ge(kib, 0);
    return kib;
}

/* ---- the client process ---- */

#define MSG_LEN 64

struct conn {
    int fd;
    int state; /* 0 connecting, 1 echoing, 2 done, -1 failed */
    char out[MSG_LEN], in[MSG_LEN];
};

static void note_err(struct st_result *r, const char *what, int i, int err)
{
    r->failed++;
    if (!r->first_err) {
        r->first_err = err;
        snprintf(r->msg, sizeof(r->msg), "connection %d: %s: %s", i, what, strerror(err));
    }
}

/* Post the next connect; -1 when the posting call failed (the connection is counted). */
static void post_connect(int port, exs_qhandle_t q, struct conn *c, int i, struct st_result *r)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    c->fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (c->fd < 0) {
        c->state = -1;
        note_err(r, "exs_socket", i, errno);
        return;
    }
    if (exs_connect(c->fd, (struct sockaddr *)&sin, sizeof(sin), q, (exs_ahandle_t)(intptr_t)i) <
        0) {
        c->state = -1;
        note_err(r, "exs_connect", i, errno);
    }
}

/* The client: n connections, at most window connects in flight; each sends one message and
 * checks its echo. Writes its st_result to out_fd when every connection finished or after
 * quiet_ms without an event; then exits, or with hold sleeps until killed. */
static void client_main(int port, int n, int window, int hold, int quiet_ms, int out_fd)
{
    struct st_result r = {0};
    struct conn *cs = calloc((size_t)n, sizeof(*cs));
    exs_qhandle_t q;
    int next = 0, connecting = 0, open = 0;
    double t0 = st_now_ms(), last = t0;

    if (!cs || exs_init(EXS_VERSION) < 0)
        _exit(3);
    q = exs_qcreate(2 * n + 16);
    if (q == EXS_QHANDLE_INVALID)
        _exit(4);
    while (r.echoed + r.failed < n) {
        exs_event_t ev[256];
        struct timespec tmo = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        int got;

        while (next < n && connecting < window) {
            post_connect(port, q, &cs[next], next, &r);
            if (cs[next].state == 0)
                connecting++;
            next++;
        }
        got = exs_qdequeue(q, ev, 256, &tmo);
        if (got < 0 && errno != EINTR) {
            note_err(&r, "exs_qdequeue", -1, errno);
            break;
        }
        if (got <= 0) {
            if (st_now_ms() - last > quiet_ms)
                break;
            continue;
        }
        last = st_now_ms();
        for (int k = 0; k < got; k++) {
            int i = (int)(intptr_t)ev[k].exs_evt_ahandle;
            struct conn *c = &cs[i];

            switch (ev[k].exs_evt_type) {
            case EXS_EVT_CONNECT:
                connecting--;
                if (ev[k].exs_evt_errno) {
                    c->state = -1;
                    note_err(&r, "connect", i, ev[k].exs_evt_errno);
                    break;
                }
                r.established++;
                open++;
                c->state = 1;
                snprintf(c->out, sizeof(c->out), "connection %d", i);
                if (exs_recv(c->fd, c->in, MSG_LEN, 0, q, ev[k].exs_evt_ahandle,
                             EXS_MHANDLE_UNREGISTERED) < 0 ||
                    exs_send(c->fd, c->out, MSG_LEN, 0, q, ev[k].exs_evt_ahandle,
                             EXS_MHANDLE_UNREGISTERED) < 0) {
                    c->state = -1;
                    note_err(&r, "exs_recv/exs_send", i, errno);
                }
                break;
            case EXS_EVT_SEND:
                if (ev[k].exs_evt_errno && c->state == 1) {
                    c->state = -1;
                    note_err(&r, "send", i, ev[k].exs_evt_errno);
                }
                break;
            case EXS_EVT_RECV:
                if (c->state != 1)
                    break;
                if (ev[k].exs_evt_errno) {
                    c->state = -1;
                    note_err(&r, "recv", i, ev[k].exs_evt_errno);
                } else if (ev[k].exs_evt_u.exs_evt_xfer.exs_evt_result != MSG_LEN ||
                           memcmp(c->in, c->out, MSG_LEN) != 0) {
                    c->state = -1;
                    note_err(&r, "echo", i, EBADMSG);
                } else {
                    c->state = 2;
                    r.echoed++;
                }
                break;
            default:
                break;
            }
        }
    }
    r.ms = st_now_ms() - t0;
    r.open = open;
    if (hold) {
        if (write(out_fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
            _exit(5);
        close(out_fd);
        for (;;)
            pause();
    }
    /* Close them all at once, as a process would; every close must complete, cleanly. */
    int closing = 0;
    for (int i = 0; i < next; i++) {
        if (cs[i].fd < 0)
            continue;
        if (exs_close(cs[i].fd, q, (exs_ahandle_t)(intptr_t)i) == 0) {
            closing++;
        } else {
            r.close_failed++;
            note_err(&r, "exs_close", i, errno);
        }
    }
    last = st_now_ms();
    while (closing > 0 && st_now_ms() - last < quiet_ms) {
        exs_event_t ev[256];
        struct timespec tmo = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        int got = exs_qdequeue(q, ev, 256, &tmo);

        for (int k = 0; k < got; k++) {
            if (ev[k].exs_evt_type != EXS_EVT_CLOSE)
                continue;
            closing--;
            last = st_now_ms();
            if (ev[k].exs_evt_errno) {
                r.close_failed++;
                note_err(&r, "close", (int)(intptr_t)ev[k].exs_evt_ahandle, ev[k].exs_evt_errno);
            } else {
                r.closed++;
            }
        }
    }
    r.close_failed += closing; /* never completed */
    if (closing)
        note_err(&r, "close never completed", -1, ETIMEDOUT);
    if (write(out_fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(5);
    close(out_fd);
    exs_fini();
    _exit(0);
}

pid_t st_clients_start(int port, int n, int window, int hold, int quiet_ms, int *res_fd)
{
    return st_clients_start_log(port, n, window, hold, quiet_ms, res_fd, -1);
}

pid_t st_clients_start_log(int port, int n, int window, int hold, int quiet_ms, int *res_fd,
                           int log_fd)
{
    int pfd[2];
    pid_t pid;

    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        if (log_fd >= 0 && dup2(log_fd, STDERR_FILENO) < 0)
            _exit(6);
        client_main(port, n, window, hold, quiet_ms, pfd[1]);
    }
    close(pfd[1]);
    *res_fd = pfd[0];
    return pid;
}

int st_clients_result(pid_t pid, int res_fd, int timeout_ms, struct st_result *r)
{
    struct pollfd pfd = {.fd = res_fd, .events = POLLIN};
    int ok = poll(&pfd, 1, timeout_ms) == 1 && read(res_fd, r, sizeof(*r)) == (ssize_t)sizeof(*r);

    close(res_fd);
    if (!ok) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return 0;
}

void st_clients_end(pid_t pid, int kill_it)
{
    int status;

    if (kill_it)
        kill(pid, SIGKILL);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (!kill_it)
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "client process ended with status %#x", status);
}

int st_served(int port, int timeout_ms)
{
    struct st_result r;
    int fd;
    pid_t pid = st_clients_start(port, 1, 1, 0, timeout_ms, &fd);

    if (st_clients_result(pid, fd, timeout_ms + 5000, &r) < 0)
        return 0;
    st_clients_end(pid, 0);
    return r.echoed == 1;
}

int st_log_open(void)
{
    char path[] = "/tmp/exs_stress_log.XXXXXX";
    int fd = mkstemp(path);

    ck_assert_int_ge(fd, 0);
    unlink(path);
    return fd;
}

int st_log_count(int fd, const char *prefix, char *first, size_t len)
{
    char line[512];
    int n = 0;
    FILE *f;

    first[0] = '\0';
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    f = fdopen(fd, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, prefix, strlen(prefix)) != 0)
            continue;
        if (!n++)
            snprintf(first, len, "%s", line);
    }
    fclose(f);
    return n;
}
