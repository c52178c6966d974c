/* SPDX-License-Identifier: MIT */
/* The library process under attack: an echo server on the public ES-API, forked per test. */
#ifndef EXS_TESTS_HOSTILE_SERVER_H
#define EXS_TESTS_HOSTILE_SERVER_H

#include <sys/types.h>

struct srv_opts {
    int sock_type;     /* SOCK_SEQPACKET or SOCK_STREAM */
    int nofile;        /* RLIMIT_NOFILE of the server (0: unchanged) */
    int quiet;         /* stderr to /dev/null (a test that floods the log) */
    int close_at_once; /* close every connection as soon as it is accepted */
    int resumable;     /* policy any (spec/protocol.md §9.2): primary fault:tcp (no fault),
                        * its tcp fallback listener on fb_port, connections cut over */
};

struct srv {
    pid_t pid;
    int port;
    int fb_port; /* resumable: the fallback listener's port (resume requests go there) */
    int ctl;     /* write end of the command pipe */
    int why;     /* read end of the reasons pipe (srv_reason) */
    int dead;    /* exit status collected */
    int status;
};

/* Fork the server; returns once it listens (0) or -errno. */
int srv_start(struct srv *s, const struct srv_opts *o);
/* Command: close the oldest connection still open ('x'). 0 or -errno. */
int srv_close_oldest(struct srv *s);
/* The next connection the server saw reset: the errno its transfer ended with and the
 * reason the library kept (EXS_SO_ERROR_REASON: "RULE RECORD: detail", "" when the peer
 * broke no rule), as the line "errno reason" into buf. 0, or -ETIMEDOUT when none came
 * within ms. The server writes one line per such connection (lines beyond what the pipe
 * holds are dropped: a test reads them as it causes them). */
int srv_reason(struct srv *s, char *buf, size_t len, int ms);
/* 1 while the server process runs; otherwise fills s->status. */
int srv_running(struct srv *s);
/* Describe how the server ended ("killed by signal 11", "exit 1") into buf. */
const char *srv_how(struct srv *s, char *buf, size_t len);
/* Kill and reap the server. */
void srv_stop(struct srv *s);
/* User + system CPU time of the server so far, in ms (from /proc/<pid>/stat). */
double srv_cpu_ms(struct srv *s);
/* Each thread of the server: its time on a CPU and waiting for one (from
 * /proc/<pid>/task/<tid>/schedstat), how often it blocked and how often it was preempted
 * (voluntary and nonvoluntary context switches, from .../status), so far. */
struct srv_tsnap {
    int n;
    struct {
        int tid;
        double run_ms, wait_ms;
        unsigned long long blocked, preempted;
    } t[64];
};
int srv_threads_snap(struct srv *s, struct srv_tsnap *out);
/* Between two snapshots: a thread that spun, i.e. blocked fewer than 5 times while it ran
 * 1.5 s on a CPU, or while it was runnable 1.5 s and preempted at least 5 times (a spinner
 * on a loaded host gets little CPU but never gives it up); its tid, described in why, or
 * 0. A thread that sleeps between rounds blocks every round it gets a CPU, however long a
 * loaded host keeps it waiting for one. */
int srv_spinning(const struct srv_tsnap *a, const struct srv_tsnap *b, char *why, size_t len);

/* A well-behaved library client in this process: connect, send n bytes, get them echoed.
 * 0, or -errno (-ETIMEDOUT after ms). */
int client_echo(int port, int sock_type, size_t n, int ms);

#endif
