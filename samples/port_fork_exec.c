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

    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1, one = 1;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), failed = 0, status;

    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("listen");
        return 1;
    }
    printf("accept-and-exec echo server on 127.0.0.1:%d\n", ntohs(sin.sin_port));
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
    while (wait(&status) > 0)
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    printf("served %d connection(s), %d failed\n", conns, failed);
    return failed != 0;
}
