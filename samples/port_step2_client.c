/* SPDX-License-Identifier: MIT */
/* Porting, step 2: the step 0 echo client (port_step0_client.c) on exs sockets (RDMA, or
 * its tcp emulation), with asynchronous ES-API calls.
 *
 *   port_step2_client PORT [COUNT] [SIZE]
 *
 * What changed from step 0: exs_init, exs_socket instead of socket, registered buffers,
 * and each send/receive pair is posted together and awaited together: exs_qdequeue with
 * a negative count (-2) returns only when both events are there. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, count = argc > 2 ? atoi(argv[2]) : 100;
    size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 1000;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char *out = malloc(size), *in = malloc(size);
    exs_event_t ev[2];

    if (port <= 0 || count < 1 || size < 1 || !out || !in) {
        fprintf(stderr, "usage: port_step2_client PORT [COUNT] [SIZE]\n");
        return 2;
    }
    if (exs_init(EXS_VERSION) < 0) {
        perror("exs_init");
        return 1;
    }
    exs_qhandle_t q = exs_qcreate(4);
    exs_mhandle_t mout = exs_mregister(out, size, 0), min = exs_mregister(in, size, 0);
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (q == EXS_QHANDLE_INVALID || mout == EXS_MHANDLE_INVALID || min == EXS_MHANDLE_INVALID ||
        fd < 0) {
        perror("exs_qcreate/exs_mregister/exs_socket");
        return 1;
    }
    /* connect() becomes: post, then wait for EXS_EVT_CONNECT. */
    if (exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, NULL) < 0 ||
        exs_qdequeue(q, ev, 1, NULL) != 1 || ev[0].exs_evt_errno) {
        fprintf(stderr, "connect failed\n");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        for (size_t j = 0; j < size; j++)
            out[j] = (char)(i * 7 + j);
        /* Post the receive of the echo before the send: both are in flight at once. */
        if (exs_recv(fd, in, size, MSG_WAITALL, q, NULL, min) < 0 ||
            exs_send(fd, out, size, 0, q, NULL, mout) < 0) {
            perror("exs_recv/exs_send");
            return 1;
        }
        if (exs_qdequeue(q, ev, -2, NULL) != 2) { /* both completions, or none */
            perror("exs_qdequeue");
            return 1;
        }
        for (int k = 0; k < 2; k++)
            if (ev[k].exs_evt_errno ||
                ev[k].exs_evt_u.exs_evt_xfer.exs_evt_result != (ssize_t)size) {
                fprintf(stderr, "message %d: event %d failed\n", i, ev[k].exs_evt_type);
                return 1;
            }
        if (memcmp(in, out, size)) {
            fprintf(stderr, "message %d: bad echo\n", i);
            return 1;
        }
    }
    /* shutdown(SHUT_WR), then the server's end of stream: a receive that completes with 0. */
    if (exs_shutdown(fd, SHUT_WR, q, NULL) < 0 || exs_recv(fd, in, size, 0, q, NULL, min) < 0 ||
        exs_qdequeue(q, ev, -2, NULL) != 2) {
        perror("exs_shutdown");
        return 1;
    }
    for (int k = 0; k < 2; k++)
        if (ev[k].exs_evt_errno ||
            (ev[k].exs_evt_type == EXS_EVT_RECV && ev[k].exs_evt_u.exs_evt_xfer.exs_evt_result)) {
            fprintf(stderr, "expected the end of the stream\n");
            return 1;
        }
    if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0) {
        perror("exs_close");
        return 1;
    }
    exs_mderegister(mout);
    exs_mderegister(min);
    exs_qdelete(q);
    exs_fini();
    printf("%d messages of %zu bytes echoed and verified\n", count, size);
    free(out);
    free(in);
    return 0;
}
