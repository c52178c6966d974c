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
    int ctl;  /* write end of the command pipe */
    int dead; /* exit status collected */
    int status;
};

/* Fork the server; returns once it listens (0) or -errno. */
int srv_start(struct srv *s, const struct srv_opts *o);
/* Command: close the oldest connection still open ('x'). 0 or -errno. */
int srv_close_oldest(struct srv *s);
/* 1 while the server process runs; otherwise fills s->status. */
int srv_running(struct srv *s);
/* Describe how the server ended ("killed by signal 11", "exit 1") into buf. */
const char *srv_how(struct srv *s, char *buf, size_t len);
/* Kill and reap the server. */
void srv_stop(struct srv *s);
/* User + system CPU time of the server so far, in ms (from /proc/<pid>/stat). */
double srv_cpu_ms(struct srv *s);
/* Time its threads were runnable (on a CPU or waiting for one) so far, in ms, summed from
 * /proc/<pid>/task/<tid>/schedstat: a spinning thread counts the whole wall time even on a
 * loaded machine, where its CPU time alone may be small. */
double srv_runnable_ms(struct srv *s);

/* A well-behaved library client in this process: connect, send n bytes, get them echoed.
 * 0, or -errno (-ETIMEDOUT after ms). */
int client_echo(int port, int sock_type, size_t n, int ms);

#endif
