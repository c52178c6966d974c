/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET echo client: sends N messages of a given size and checks each echo.
 *
 *   seqpacket_echo_client [PORT] [COUNT] [SIZE]
 *
 * Synchronous calls (queue EXS_QHANDLE_INVALID) keep it as short as a BSD sockets
 * client; the buffers are registered once, as zero-copy transfers want. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7471;
    int count = argc > 2 ? atoi(argv[2]) : 1000;
    size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 1024;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    if (size < 1 || size > 65536 || count < 1 || exs_init(EXS_VERSION) < 0) {
        fprintf(stderr, "usage: seqpacket_echo_client [port] [count] [size 1..65536]\n");
        return 2;
    }
    char *out = malloc(size), *in = malloc(size);
    if (!out || !in) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    exs_mhandle_t mout = exs_mregister(out, size, 0), min = exs_mregister(in, size, 0);
    if (mout == EXS_MHANDLE_INVALID || min == EXS_MHANDLE_INVALID) {
        perror("exs_mregister");
        return 1;
    }
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (fd < 0) {
        perror("exs_socket");
        return 1;
    }
    if (exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), EXS_QHANDLE_INVALID, NULL) < 0) {
        perror("exs_connect");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        int n;

        for (size_t j = 0; j < size; j++)
            out[j] = (char)(i + j);
        /* Each send is one message; each receive takes exactly one message. */
        if ((n = exs_send(fd, out, size, 0, EXS_QHANDLE_INVALID, NULL, mout)) != (int)size) {
            fprintf(stderr, "message %d: exs_send: %s\n", i,
                    n < 0 ? strerror(errno) : "short send");
            return 1;
        }
        if ((n = exs_recv(fd, in, size, 0, EXS_QHANDLE_INVALID, NULL, min)) != (int)size) {
            fprintf(stderr, "message %d: exs_recv: %s\n", i,
                    n < 0    ? strerror(errno)
                    : n == 0 ? "the server closed the connection"
                             : "short echo");
            return 1;
        }
        if (memcmp(in, out, size)) {
            fprintf(stderr, "message %d: the echo differs from the message\n", i);
            return 1;
        }
    }
    printf("%d messages of %zu bytes echoed and verified\n", count, size);
    int rc = 0;
    if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0) {
        perror("exs_close");
        rc = 1;
    }
    if (exs_mderegister(mout) < 0 || exs_mderegister(min) < 0) {
        perror("exs_mderegister");
        rc = 1;
    }
    exs_fini();
    free(out);
    free(in);
    return rc;
}
