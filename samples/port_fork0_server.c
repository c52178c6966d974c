/* SPDX-License-Identifier: MIT */
/* Porting a fork-per-client server, the start: the textbook TCP echo server with kernel
 * sockets, one child process per client.
 *
 *   port_fork0_server [PORT] [CONNECTIONS]
 *
 * The parent accepts; each client is served by a child made with fork() right after
 * accept(), which echoes until the client shuts down its side and exits. After
 * CONNECTIONS clients the parent waits for its children and exits. PORT 0 (the default)
 * takes an ephemeral port; the first line printed names it. Any echo client works:
 * port_step0_client. This shape does not survive the port as it is: a child forked by a
 * process that called exs_init cannot use the connections it inherits (spec/api.md
 * section 2, "fork"). samples/README.md ports it three ways: port_fork_threads.c,
 * port_fork_exec.c, port_fork_prefork.c. */
#include <stdlib.h>
#include <unistd.h>

#include "port_fork.h" /* pf_kernel_listen, pf_wait_children: plain kernel-socket code */

static int serve(int fd)
{
    char buf[65536];
    ssize_t n;

    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        for (ssize_t off = 0, w; off < n; off += w)
            if ((w = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL)) < 0)
                return 1;
    return n < 0;
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1, failed;
    int lfd = pf_kernel_listen(port, 0, &port);

    if (lfd < 0)
        return 1;
    printf("fork-per-client echo server on 127.0.0.1:%d\n", port);
    fflush(stdout);
    for (int i = 0; i < conns; i++) {
        int fd = accept(lfd, NULL, NULL);

        if (fd < 0) {
            perror("accept");
            return 1;
        }
        pid_t pid = fork();
        if (pid == 0) { /* the child: this client only */
            close(lfd);
            int rc = serve(fd);
            close(fd);
            _exit(rc);
        }
        if (pid < 0)
            perror("fork");
        close(fd); /* the parent: the child has its copy */
    }
    close(lfd);
    failed = pf_wait_children();
    printf("served %d connection(s), %d failed\n", conns, failed);
    return failed != 0;
}
