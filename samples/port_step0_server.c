/* SPDX-License-Identifier: MIT */
/* Porting, step 0: a blocking TCP echo server with plain kernel sockets, the starting point.
 *
 *   port_step0_server [PORT] [CONNECTIONS]
 *
 * It serves CONNECTIONS clients (default 1) one after the other, sending back every byte
 * each one sends until it shuts down its side, then exits. PORT 0 (the default) takes an
 * ephemeral port; the first line printed names it. Step 2 (port_step2_server.c) is this
 * program on exs sockets; samples/README.md compares them. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int echo(int fd)
{
    char buf[65536];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0); /* blocks until bytes or end of stream */
        if (n == 0)
            return 0; /* the client shut down its side: done */
        if (n < 0) {
            perror("recv");
            return -1;
        }
        for (ssize_t off = 0; off < n;) { /* a blocking send may still write less */
            ssize_t w = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
            if (w < 0) {
                perror("send");
                return -1;
            }
            off += w;
        }
    }
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1, one = 1;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("listen");
        return 1;
    }
    printf("echo server on 127.0.0.1:%d\n", ntohs(sin.sin_port));
    fflush(stdout);
    int rc = 0;
    for (int i = 0; i < conns; i++) {
        int fd = accept(lfd, NULL, NULL); /* blocks until a client connects */
        if (fd < 0) {
            perror("accept");
            return 1;
        }
        if (echo(fd) < 0)
            rc = 1;
        close(fd);
    }
    close(lfd);
    printf("served %d connection(s)\n", conns);
    return rc;
}
