/* SPDX-License-Identifier: MIT */
/* Porting, step 0: a blocking TCP echo client with plain kernel sockets, the starting point.
 *
 *   port_step0_client PORT [COUNT] [SIZE]
 *
 * Sends COUNT messages of SIZE bytes (default 100 of 1000) to 127.0.0.1:PORT, reads each
 * echo back whole and checks every byte; then shuts down its side and waits for the
 * server's end of stream. Step 2 (port_step2_client.c) is this program on exs sockets. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, count = argc > 2 ? atoi(argv[2]) : 100;
    size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 1000;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char *out = malloc(size), *in = malloc(size);
    char end;

    if (port <= 0 || count < 1 || size < 1 || !out || !in) {
        fprintf(stderr, "usage: port_step0_client PORT [COUNT] [SIZE]\n");
        return 2;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        perror("connect");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        for (size_t j = 0; j < size; j++)
            out[j] = (char)(i * 7 + j);
        if (send(fd, out, size, MSG_NOSIGNAL) != (ssize_t)size) { /* blocks until all sent */
            perror("send");
            return 1;
        }
        /* A stream has no message boundaries: MSG_WAITALL waits for the whole echo. */
        ssize_t n = recv(fd, in, size, MSG_WAITALL);
        if (n != (ssize_t)size || memcmp(in, out, size)) {
            fprintf(stderr, "message %d: %s\n", i, n < 0 ? "recv failed" : "bad echo");
            return 1;
        }
    }
    shutdown(fd, SHUT_WR); /* tell the server we are done; it closes in turn */
    if (recv(fd, &end, 1, 0) != 0) {
        fprintf(stderr, "expected the end of the stream\n");
        return 1;
    }
    close(fd);
    printf("%d messages of %zu bytes echoed and verified\n", count, size);
    free(out);
    free(in);
    return 0;
}
