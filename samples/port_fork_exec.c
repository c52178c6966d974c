/* SPDX-License-Identifier: MIT */
/* Porting a fork-per-client server, way 2: the parent accepts, the work runs in an exec'd
 * child (the inetd shape).
 *
 *   port_fork_exec [PORT] [CONNECTIONS]
 *
 * The accepting parent stays as port_fork0_server.c wrote it: kernel sockets, accept(),
 * fork(), and it never calls exs_init. The child execs a fresh program (here this one
 * again, "port_fork_exec --serve FD"), which starts its own library with exs_init and
 * serves the inherited kernel TCP socket with ES-API calls: exs_recv and exs_send take an
 * application's kernel socket as well as an exs socket (spec/api.md section 5.14). An
 * exs connection itself cannot be handed to another process, and a child that only
 * forked cannot use its parent's library; exec gives the child a library of its own,
 * and over RDMA the only way: rdma-core refuses a forked child the parent's devices.
 * Clients: port_step0_client (any TCP client). */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "port_fork.h"

/* The exec'd child: serve the kernel socket fd with the ES-API. */
static int serve(int fd)
{
    int rc;

    if (exs_init(EXS_VERSION) < 0) {
        perror("exs_init");
        return 1;
    }
    rc = pf_exs_echo(fd) != 0;
    /* exs_close on a kernel socket: its pending operations end, then close(fd) */
    exs_close(fd, EXS_QHANDLE_INVALID, NULL);
    exs_fini();
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--serve") == 0)
        return serve(atoi(argv[2]));

    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1, failed;
    int lfd = pf_kernel_listen(port, SOCK_CLOEXEC, &port); /* the exec'd child has no use for it */

    if (lfd < 0)
        return 1;
    printf("accept-and-exec echo server on 127.0.0.1:%d\n", port);
    fflush(stdout);
    for (int i = 0; i < conns; i++) {
        int fd = accept(lfd, NULL, NULL); /* no SOCK_CLOEXEC: the exec'd child keeps it */
        char arg[16];

        if (fd < 0) {
            perror("accept");
            return 1;
        }
        snprintf(arg, sizeof(arg), "%d", fd);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "--serve", arg, (char *)NULL);
            perror("exec");
            _exit(127);
        }
        if (pid < 0)
            perror("fork");
        close(fd);
    }
    close(lfd);
    failed = pf_wait_children();
    printf("served %d connection(s), %d failed\n", conns, failed);
    return failed != 0;
}
