/* SPDX-License-Identifier: MIT */
/* The pieces the fork-per-client ports share (samples/README.md, "Porting a fork-per-client
 * server"): an exs listener and the echo loop in synchronous ES-API calls, which serve an
 * exs socket and a kernel TCP socket alike. */
#ifndef SAMPLES_PORT_FORK_H
#define SAMPLES_PORT_FORK_H

#include <arpa/inet.h>
#include <stdio.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/wait.h>

/* A kernel TCP listener on 127.0.0.1:port (0: ephemeral), as the textbook server makes it
 * (flags: SOCK_CLOEXEC or 0); *port_p gets the port. -1 (reported) on failure. */
static inline int pf_kernel_listen(int port, int flags, int *port_p)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM | flags, 0);

    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("listen");
        return -1;
    }
    *port_p = ntohs(sin.sin_port);
    return lfd;
}

/* Wait for every child; the number that did not exit 0. */
static inline int pf_wait_children(void)
{
    int status, failed = 0;

    while (wait(&status) > 0)
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return failed;
}

/* An exs SOCK_STREAM listener on 127.0.0.1:port (0: ephemeral); *port_p gets the port.
 * -1 (reported) on failure. */
static inline int pf_exs_listen(int port, int *port_p)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int lfd = exs_socket(AF_INET, SOCK_STREAM, 0);

    if (lfd < 0 || exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        exs_listen(lfd, 16) < 0 || exs_getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("exs listen");
        return -1;
    }
    *port_p = ntohs(sin.sin_port);
    return lfd;
}

/* Say who connected: the synchronous exs_accept returns only the descriptor, and
 * exs_getpeername names the peer (as getpeername(2) does after accept(fd, NULL, NULL)). */
static inline void pf_say_peer(const char *who, int fd)
{
    struct sockaddr_in peer;
    socklen_t len = sizeof(peer);
    char host[INET_ADDRSTRLEN] = "?";

    if (exs_getpeername(fd, (struct sockaddr *)&peer, &len) == 0)
        inet_ntop(AF_INET, &peer.sin_addr, host, sizeof(host));
    printf("%s: client %s:%d\n", who, host, len ? ntohs(peer.sin_port) : 0);
    fflush(stdout);
}

/* Echo fd (an exs socket or a kernel TCP socket: the ES-API takes both) until the client
 * shuts down its side, with synchronous calls (EXS_QHANDLE_INVALID): recv and send as
 * the textbook server wrote them. 0 at end of stream, -1 (reported) on an error. */
static inline int pf_exs_echo(int fd)
{
    static __thread char buf[65536];

    for (;;) {
        int n =
            exs_recv(fd, buf, sizeof(buf), 0, EXS_QHANDLE_INVALID, NULL, EXS_MHANDLE_UNREGISTERED);
        if (n == 0)
            return 0;
        if (n < 0 || exs_send(fd, buf, (size_t)n, 0, EXS_QHANDLE_INVALID, NULL,
                              EXS_MHANDLE_UNREGISTERED) != n) {
            perror("echo");
            return -1;
        }
    }
}

#endif
