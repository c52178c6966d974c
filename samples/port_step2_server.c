/* SPDX-License-Identifier: MIT */
/* Porting, step 2: the step 0 echo server (port_step0_server.c) on exs sockets (RDMA, or
 * its tcp emulation), with asynchronous ES-API calls.
 *
 *   port_step2_server [PORT] [CONNECTIONS]
 *
 * What changed from step 0: exs_init first; exs_socket/exs_bind/exs_listen for the
 * listener; every blocking call (accept, recv, send, close) becomes a posted operation
 * whose completion is taken off one event queue with exs_qdequeue; the echo buffer is
 * registered once (exs_mregister) so transfers can go straight into it. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#define BUF_SIZE 65536

/* Wait for the next event; report a failed one. Returns 0 or -1. */
static int next_event(exs_qhandle_t q, exs_event_t *ev)
{
    if (exs_qdequeue(q, ev, 1, NULL) != 1) {
        perror("exs_qdequeue");
        return -1;
    }
    if (ev->exs_evt_errno) {
        fprintf(stderr, "event %d on fd %d: %s\n", ev->exs_evt_type, ev->exs_evt_fd,
                strerror(ev->exs_evt_errno));
        return -1;
    }
    return 0;
}

/* Echo one connection: one receive posted at a time; each one's bytes are sent back,
 * and the next receive is posted when that send completed (the buffer is free again). */
static int echo(int fd, exs_qhandle_t q, char *buf, exs_mhandle_t mh)
{
    exs_event_t ev;

    if (exs_recv(fd, buf, BUF_SIZE, 0, q, NULL, mh) < 0) {
        perror("exs_recv");
        return -1;
    }
    for (;;) {
        if (next_event(q, &ev) < 0)
            return -1;
        ssize_t n = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        if (ev.exs_evt_type == EXS_EVT_RECV && n == 0)
            return 0; /* end of stream: the client shut down its side */
        if (ev.exs_evt_type == EXS_EVT_RECV && exs_send(fd, buf, (size_t)n, 0, q, NULL, mh) < 0) {
            perror("exs_send");
            return -1;
        }
        if (ev.exs_evt_type == EXS_EVT_SEND && exs_recv(fd, buf, BUF_SIZE, 0, q, NULL, mh) < 0) {
            perror("exs_recv");
            return -1;
        }
    }
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    exs_event_t ev;

    if (exs_init(EXS_VERSION) < 0) { /* picks the provider: EXS_PROVIDER, or the best one */
        perror("exs_init");
        return 1;
    }
    exs_qhandle_t q = exs_qcreate(4); /* room for every operation this program has posted */
    char *buf = malloc(BUF_SIZE);
    exs_mhandle_t mh = buf ? exs_mregister(buf, BUF_SIZE, 0) : EXS_MHANDLE_INVALID;
    int lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (q == EXS_QHANDLE_INVALID || mh == EXS_MHANDLE_INVALID || lfd < 0) {
        perror("exs_qcreate/exs_mregister/exs_socket");
        return 1;
    }
    if (exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(lfd, 16) < 0 ||
        exs_getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("listen");
        return 1;
    }
    printf("echo server on 127.0.0.1:%d\n", ntohs(sin.sin_port));
    fflush(stdout);
    int rc = 0;
    for (int i = 0; i < conns; i++) {
        /* accept() becomes: post an accept, then take its event (the new descriptor). */
        if (exs_accept(lfd, q, NULL) < 0 || next_event(q, &ev) < 0) {
            perror("exs_accept");
            return 1;
        }
        int fd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
        if (echo(fd, q, buf, mh) < 0)
            rc = 1;
        /* close() becomes exs_close; EXS_EVT_CLOSE is the socket's last event. */
        if (exs_close(fd, q, NULL) < 0)
            return 1;
        do {
            if (exs_qdequeue(q, &ev, 1, NULL) != 1)
                return 1;
        } while (ev.exs_evt_type != EXS_EVT_CLOSE); /* an echo cancelled by an error first */
    }
    /* Synchronous forms exist too: EXS_QHANDLE_INVALID waits for the event inside. */
    exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
    exs_mderegister(mh);
    exs_qdelete(q);
    exs_fini();
    free(buf);
    printf("served %d connection(s)\n", conns);
    return rc;
}
