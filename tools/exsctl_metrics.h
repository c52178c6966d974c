/* SPDX-License-Identifier: MIT */
/* exsctl metrics: every counter of libexs processes in the Prometheus text exposition
 * format, once on stdout or periodically into node_exporter's textfile collector. */
#ifndef TOOLS_EXSCTL_METRICS_H
#define TOOLS_EXSCTL_METRICS_H

#include <stdio.h>

struct exs_json;

/* One process's stat reply (exsctl.c): its text and its parse. */
struct exsctl_stat {
    char *raw;
    struct exs_json *j;
};

/* The stat replies of pid, or of every process of this user with an endpoint (pid < 0;
 * those that fail meanwhile are skipped) into r[0, max): the count, or -errno (pid's
 * failure is printed on stderr). exsctl_stat_free releases one. */
int exsctl_stat_gather(int pid, struct exsctl_stat *r, int max);
void exsctl_stat_free(struct exsctl_stat *r);

/* exsctl metrics [PID] [--textfile DIR [--interval S] [--count N]]; argv[0] is
 * "metrics". The exit status: 0, 1 (PID unreachable, a file not written), 2 bad usage. */
int exsctl_metrics(int argc, char **argv);
void exsctl_metrics_usage(FILE *f);

#endif
