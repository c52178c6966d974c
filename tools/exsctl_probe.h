/* SPDX-License-Identifier: MIT */
/* exsctl serve / ping / perf: round-trip and bandwidth probes between hosts over libexs. */
#ifndef TOOLS_EXSCTL_PROBE_H
#define TOOLS_EXSCTL_PROBE_H

#include <stdio.h>

#define EXSCTL_PROBE_PORT 7478 /* default port of exsctl serve */

/* Each takes the subcommand's arguments (argv[0] is its name); returns the exit status:
 * 0 success, 1 a failed probe (unreachable, refused, loss, peer died), 2 bad usage. */
int exsctl_serve(int argc, char **argv);
int exsctl_ping(int argc, char **argv);
int exsctl_perf(int argc, char **argv);

/* The usage lines of the three subcommands, for exsctl's help text. */
void exsctl_probe_usage(FILE *f);

#endif
