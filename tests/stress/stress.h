/* SPDX-License-Identifier: MIT */
/* Shared declarations of the connection stress tests (echo server and client processes). */
#ifndef EXS_TESTS_STRESS_H
#define EXS_TESTS_STRESS_H

#include <check.h>
#include <sys/types.h>

/* The sample echo server (build/samples/seqpacket_echo_server, or $EXS_STRESS_SERVER)
 * running in its own process on an ephemeral loopback port. */
struct st_server {
    pid_t pid;
    int port;
};

/* What a client process saw, sent back through a pipe. */
struct st_result {
    int established, echoed, failed, open;
    int closed, close_failed; /* without hold: closes completed cleanly, and not */
    int first_err;
    double ms; /* from the first connect to the report */
    char msg[160];
};

double st_now_ms(void);
long st_env_long(const char *name, long def);
/* CK_TIMEOUT_MULTIPLIER, at least 1: scales every wait. */
int st_timeout_mult(void);
/* Raise RLIMIT_NOFILE to the hard limit, or to want when that is larger and the process
 * may (root); children inherit it. */
void st_raise_nofile(long want);

/* Start the server (nofile > 0: with that RLIMIT_NOFILE); fails the test on error. */
void st_server_start(struct st_server *s, long nofile);
/* The same with the server's listen backlog and the number of accepts it keeps posted. */
void st_server_start_backlog(struct st_server *s, int backlog, int accepts);
/* Check it is still running, stop it (SIGTERM) and check it exited cleanly (status 0). */
void st_server_stop(struct st_server *s);
int st_proc_fds(pid_t pid);
long st_proc_rss_kib(pid_t pid);

/* Fork a client process (library inside): n SOCK_SEQPACKET connections to port, at most
 * window connects in flight, each sends one 64-byte message and checks the echo. It
 * stops waiting after quiet_ms without an event. Then it closes all at once, counts the
 * closes and reports, or (hold) reports and keeps them open until killed. *res_fd
 * receives the report. */
pid_t st_clients_start(int port, int n, int window, int hold, int quiet_ms, int *res_fd);
/* The same, the client's stderr (the library's log) going to log_fd. */
pid_t st_clients_start_log(int port, int n, int window, int hold, int quiet_ms, int *res_fd,
                           int log_fd);
/* An anonymous temporary file for a client's log; st_log_count counts (and closes it) the
 * lines starting with prefix and copies the first. */
int st_log_open(void);
int st_log_count(int fd, const char *prefix, char *first, size_t len);
/* Wait up to timeout_ms for the report: 0, or -1 (the client was killed). */
int st_clients_result(pid_t pid, int res_fd, int timeout_ms, struct st_result *r);
/* Reap the client (kill_it: SIGKILL first, its connections then reset at once). */
void st_clients_end(pid_t pid, int kill_it);
/* 1 when a new client process gets one message echoed within timeout_ms. */
int st_served(int port, int timeout_ms);

#endif
