/* SPDX-License-Identifier: MIT */
/* Porting a fork-per-client server, way 3: fork the workers first, then exs_init in each.
 *
 *   port_fork_prefork [WORKERS] [CONNECTIONS]
 *
 * The parent forks WORKERS processes before anything of the library exists, and never
 * calls exs_init itself; each worker calls exs_init (a library of its own, RDMA
 * included), listens on a port of its own, serves CONNECTIONS clients one after the
 * other with the blocking echo loop, and exits. The parent prints each worker's port
 * ("worker N on 127.0.0.1:PORT") and waits for them. The kernel could share one
 * listening socket among workers; exs listeners cannot be shared between processes, so
 * clients are spread over the workers' ports (by the client, a name service or a load
 * balancer). Clients: port_step2_client (exs sockets). */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "port_fork.h"

static int worker(int n, int conns, int report)
{
    int port = 0, lfd, failed = 0;

    if (exs_init(EXS_VERSION) < 0 || (lfd = pf_exs_listen(0, &port)) < 0)
        return 1;
    if (write(report, &port, sizeof(port)) != (ssize_t)sizeof(port))
        return 1;
    close(report);
    for (int i = 0; i < conns; i++) {
        int fd = exs_accept(lfd, EXS_QHANDLE_INVALID, NULL);

        if (fd < 0) {
            perror("exs_accept");
            return 1;
        }
        failed += pf_exs_echo(fd) != 0;
        exs_close(fd, EXS_QHANDLE_INVALID, NULL);
    }
    exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
    exs_fini();
    printf("worker %d: served %d connection(s)\n", n, conns);
    return failed != 0;
}

int main(int argc, char **argv)
{
    int workers = argc > 1 ? atoi(argv[1]) : 2, conns = argc > 2 ? atoi(argv[2]) : 1;
    int failed;

    fflush(stdout);
    for (int n = 0; n < workers; n++) {
        int p[2], port;

        if (pipe(p) < 0) {
            perror("pipe");
            return 1;
        }
        pid_t pid = fork(); /* before any exs_init: nothing of the library to inherit */
        if (pid == 0) {
            close(p[0]);
            exit(worker(n, conns, p[1]));
        }
        close(p[1]);
        if (pid < 0 || read(p[0], &port, sizeof(port)) != (ssize_t)sizeof(port)) {
            fprintf(stderr, "worker %d did not start\n", n);
            return 1;
        }
        close(p[0]);
        printf("worker %d on 127.0.0.1:%d\n", n, port);
        fflush(stdout);
    }
    failed = pf_wait_children();
    printf("%d worker(s) served %d connection(s) each, %d failed\n", workers, conns, failed);
    return failed != 0;
}
