/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET echo server: accepts connections and sends every message back.
 *
 *   seqpacket_echo_server [PORT] [MAX_CONNECTIONS]
 *
 * The whole program is the asynchronous ES-API pattern: post operations with an
 * ahandle naming what they are, then take their completions off one event queue. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#define MSG_MAX 65536 /* largest message echoed whole; longer ones arrive cut (MSG_TRUNC) */

struct client {
    int   fd;
    char *buf; /* one message in flight per client: receive into it, send it back */
};

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7471;
    int max_conns = argc > 2 ? atoi(argv[2]) : 0; /* 0: serve forever */
    int served = 0;

    if (exs_init(EXS_VERSION) < 0) {
        perror("exs_init");
        return 1;
    }
    /* One queue for everything; depth bounds the operations in flight. */
    exs_qhandle_t q = exs_qcreate(1024);
    int lfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (q == EXS_QHANDLE_INVALID || lfd < 0 ||
        exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(lfd, 16) < 0) {
        perror("exs listen");
        return 1;
    }
    printf("echo server on 127.0.0.1:%d\n", port);
    fflush(stdout);
    exs_accept(lfd, q, NULL); /* ahandle NULL marks the accept */

    for (;;) {
        exs_event_t ev;

        if (exs_qdequeue(q, &ev, 1, NULL) != 1)
            continue;
        struct client *c = ev.exs_evt_ahandle;
        switch (ev.exs_evt_type) {
        case EXS_EVT_ACCEPT:
            if (ev.exs_evt_errno) {
                fprintf(stderr, "accept: %s\n", strerror(ev.exs_evt_errno));
                break;
            }
            c = calloc(1, sizeof(*c));
            c->fd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
            c->buf = malloc(MSG_MAX);
            /* Unregistered buffers are fine; register with exs_mregister for zero copy. */
            exs_recv(c->fd, c->buf, MSG_MAX, 0, q, c, EXS_MHANDLE_UNREGISTERED);
            if (!max_conns || ++served < max_conns)
                exs_accept(lfd, q, NULL);
            break;
        case EXS_EVT_RECV: {
            ssize_t n = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;

            if (ev.exs_evt_errno || n == 0) { /* error, or the client closed */
                exs_close(c->fd, q, c);
                break;
            }
            exs_send(c->fd, c->buf, (size_t)n, 0, q, c, EXS_MHANDLE_UNREGISTERED);
            break;
        }
        case EXS_EVT_SEND: /* echoed: wait for the next message */
            if (ev.exs_evt_errno)
                exs_close(c->fd, q, c);
            else
                exs_recv(c->fd, c->buf, MSG_MAX, 0, q, c, EXS_MHANDLE_UNREGISTERED);
            break;
        case EXS_EVT_CLOSE:
            free(c->buf);
            free(c);
            if (max_conns && served >= max_conns) {
                exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
                exs_qdelete(q);
                exs_fini();
                return 0;
            }
            break;
        }
    }
}
