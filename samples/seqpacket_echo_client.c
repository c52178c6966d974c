/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET echo client: sends N messages of a given size and checks each echo.
 *
 *   seqpacket_echo_client [PORT] [COUNT] [SIZE]
 *
 * Synchronous calls (queue EXS_QHANDLE_INVALID) keep it as short as a BSD sockets
 * client; the buffers are registered once, as zero-copy transfers want. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7471;
    int count = argc > 2 ? atoi(argv[2]) : 1000;
    size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 1024;
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

    if (size < 1 || size > 65536 || count < 1 || exs_init(EXS_VERSION) < 0) {
        fprintf(stderr, "usage: seqpacket_echo_client [port] [count] [size 1..65536]\n");
        return 2;
    }
    char *out = malloc(size), *in = malloc(size);
    exs_mhandle_t mout = exs_mregister(out, size, 0), min = exs_mregister(in, size, 0);
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (fd < 0 || exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), EXS_QHANDLE_INVALID,
                              NULL) < 0) {
        perror("exs_connect");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        for (size_t j = 0; j < size; j++)
            out[j] = (char)(i + j);
        /* Each send is one message; each receive takes exactly one message. */
        if (exs_send(fd, out, size, 0, EXS_QHANDLE_INVALID, NULL, mout) != (int)size ||
            exs_recv(fd, in, size, 0, EXS_QHANDLE_INVALID, NULL, min) != (int)size ||
            memcmp(in, out, size)) {
            fprintf(stderr, "message %d: echo failed\n", i);
            return 1;
        }
    }
    printf("%d messages of %zu bytes echoed and verified\n", count, size);
    exs_close(fd, EXS_QHANDLE_INVALID, NULL);
    exs_mderegister(mout);
    exs_mderegister(min);
    exs_fini();
    free(out);
    free(in);
    return 0;
}
