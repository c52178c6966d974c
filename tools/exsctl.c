/* SPDX-License-Identifier: MIT */
/* exsctl: the libexs command-line tool (tunables now; statistics and probes later). */
#include <stdio.h>
#include <string.h>

#include "exs/util/params.h"
#include "tools/exsctl_probe.h"

#ifndef EXSCTL_VERSION
#define EXSCTL_VERSION "unknown"
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: exsctl <command> [options]\n"
               "\n"
               "commands:\n"
               "  params             tunables with their current values (EXS_* applied)\n"
               "  params --markdown  the tunables table of spec/params.md\n"
               "  version            print the libexs version\n");
    exsctl_probe_usage(f);
    fprintf(f, ""
               "  help               print this text\n");
}

static int cmd_params(int argc, char **argv)
{
    int rc;

    if (argc == 1) {
        /* Bad EXS_* values are reported on stderr and make the status 1. */
        rc = exs__params_load();
        exs__params_print(stdout, 0);
        return rc < 0 ? 1 : 0;
    }
    if (argc == 2 && strcmp(argv[1], "--markdown") == 0) {
        /* Defaults only: the output must not depend on the environment. */
        exs__params_print(stdout, 1);
        return 0;
    }
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;

    if (!cmd) {
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "params") == 0)
        return cmd_params(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0)
        return exsctl_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "ping") == 0)
        return exsctl_ping(argc - 1, argv + 1);
    if (strcmp(cmd, "perf") == 0)
        return exsctl_perf(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 && argc == 2) {
        printf("exsctl (libexs) %s\n", EXSCTL_VERSION);
        return 0;
    }
    if ((strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) &&
        argc == 2) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "exsctl: unknown command or arguments: %s\n", cmd);
    usage(stderr);
    return 2;
}
