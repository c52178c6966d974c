/* SPDX-License-Identifier: MIT */
/* Thousands of connections on one event queue: a SOCK_SEQPACKET echo server and a client
 * that opens N connections at once.
 *
 *   many_conns server PORT N     serve N connections, then exit (PORT 0: ephemeral)
 *   many_conns client PORT N     open N connections, echo one message on each, keep them
 *                                all open until every echo came back, then close them
 *
 * Each side posts every operation on ONE queue; the ahandle of an operation points to
 * its connection, so one exs_qdequeue loop serves them all, with no thread per
 * connection. Each process raises its soft RLIMIT_NOFILE to the hard limit first: every
 * exs socket holds descriptors (its own, and the tcp provider's kernel socket). The
 * receive ring (SO_RCVBUF) is set small, as a server with many idle clients would. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/resource.h>

#define MSG_LEN      64
#define ACCEPTS      64   /* accepts kept posted on the listener */
#define RING_BYTES   4096 /* SO_RCVBUF of every connection */
#define EVENTS_BATCH 64

struct conn {
    int fd, id;
    int sent, echoed; /* client: the two halves of its message completed */
    char out[MSG_LEN], in[MSG_LEN];
};

static int raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -1;
    rl.rlim_cur = rl.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &rl);
}

static int recv_on(struct conn *c, exs_qhandle_t q)
{
    return exs_recv(c->fd, c->in, MSG_LEN, 0, q, c, EXS_MHANDLE_UNREGISTERED);
}

static int server(int port, int n)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int ring = RING_BYTES, posted = 0, accepted = 0, open = 0, peak = 0, closed = 0, bad = 0;
    /* Room for every event that can be pending: per connection one transfer and its close. */
    exs_qhandle_t q = exs_qcreate(2 * n + ACCEPTS);
    int lfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    exs_event_t evs[EVENTS_BATCH];

    if (q == EXS_QHANDLE_INVALID || lfd < 0 ||
        exs_setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &ring, sizeof(ring)) < 0 ||
        exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(lfd, n) < 0 ||
        exs_getsockname(lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("server set-up");
        return 1;
    }
    printf("many_conns server on 127.0.0.1:%d\n", ntohs(sin.sin_port));
    fflush(stdout);
    while (closed < n) {
        while (posted < ACCEPTS && accepted + posted < n) { /* keep accepts posted */
            if (exs_accept(lfd, q, NULL) < 0) {
                perror("exs_accept");
                return 1;
            }
            posted++;
        }
        int got = exs_qdequeue(q, evs, EVENTS_BATCH, NULL);
        if (got < 0) {
            perror("exs_qdequeue");
            return 1;
        }
        for (int i = 0; i < got; i++) {
            exs_event_t *ev = &evs[i];
            struct conn *c = ev->exs_evt_ahandle;
            int rc = 0;

            if (ev->exs_evt_type == EXS_EVT_ACCEPT) {
                posted--;
                if (ev->exs_evt_errno) {
                    fprintf(stderr, "accept: %s\n", strerror(ev->exs_evt_errno));
                    return 1;
                }
                if (!(c = calloc(1, sizeof(*c))))
                    return 1;
                c->fd = ev->exs_evt_u.exs_evt_accept.exs_evt_newfd;
                accepted++;
                if (++open > peak)
                    peak = open;
                rc = recv_on(c, q);
            } else if (ev->exs_evt_type == EXS_EVT_CLOSE) {
                free(c);
                open--;
                closed++;
            } else if (ev->exs_evt_errno) { /* a failed transfer: drop that connection */
                fprintf(stderr, "fd %d: %s\n", c->fd, strerror(ev->exs_evt_errno));
                bad++;
                rc = exs_close(c->fd, q, c);
            } else if (ev->exs_evt_type == EXS_EVT_RECV) {
                ssize_t got_len = ev->exs_evt_u.exs_evt_xfer.exs_evt_result;
                if (got_len == 0) /* the client closed: close our end */
                    rc = exs_close(c->fd, q, c);
                else
                    rc = exs_send(c->fd, c->in, (size_t)got_len, 0, q, c, EXS_MHANDLE_UNREGISTERED);
            } else if (ev->exs_evt_type == EXS_EVT_SEND) {
                rc = recv_on(c, q); /* echoed: wait for the next message */
            }
            if (rc < 0) {
                perror("posting");
                return 1;
            }
        }
    }
    exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
    exs_qdelete(q);
    printf("many_conns server: %d connections served, %d open at once at the peak, %d failed\n",
           closed, peak, bad);
    return bad ? 1 : 0;
}

static int client(int port, int n)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ring = RING_BYTES, echoed = 0, closed = 0;
    exs_qhandle_t q = exs_qcreate(2 * n + 1);
    struct conn *conns = calloc((size_t)n, sizeof(*conns));
    exs_event_t evs[EVENTS_BATCH];

    if (q == EXS_QHANDLE_INVALID || !conns) {
        perror("client set-up");
        return 1;
    }
    for (int i = 0; i < n; i++) { /* every connection requested at once */
        struct conn *c = &conns[i];
        c->id = i;
        snprintf(c->out, MSG_LEN, "connection %d of %d", i, n);
        c->fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
        if (c->fd < 0 || exs_setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &ring, sizeof(ring)) < 0 ||
            exs_connect(c->fd, (struct sockaddr *)&sin, sizeof(sin), q, c) < 0) {
            fprintf(stderr, "connection %d: %s\n", i, strerror(errno));
            return 1;
        }
    }
    while (closed < n) {
        int got = exs_qdequeue(q, evs, EVENTS_BATCH, NULL);
        if (got < 0) {
            perror("exs_qdequeue");
            return 1;
        }
        for (int i = 0; i < got; i++) {
            exs_event_t *ev = &evs[i];
            struct conn *c = ev->exs_evt_ahandle;
            int rc = 0;

            if (ev->exs_evt_type == EXS_EVT_CLOSE) {
                closed++;
                continue;
            }
            if (ev->exs_evt_errno) {
                fprintf(stderr, "connection %d, event %d: %s\n", c->id, ev->exs_evt_type,
                        strerror(ev->exs_evt_errno));
                return 1;
            }
            if (ev->exs_evt_type == EXS_EVT_CONNECT) {
                rc = recv_on(c, q) < 0 ||
                     exs_send(c->fd, c->out, MSG_LEN, 0, q, c, EXS_MHANDLE_UNREGISTERED) < 0;
            } else if (ev->exs_evt_type == EXS_EVT_SEND) {
                c->sent = 1;
            } else if (ev->exs_evt_type == EXS_EVT_RECV) {
                if (ev->exs_evt_u.exs_evt_xfer.exs_evt_result != MSG_LEN ||
                    memcmp(c->in, c->out, MSG_LEN)) {
                    fprintf(stderr, "connection %d: bad echo\n", c->id);
                    return 1;
                }
                c->echoed = 1;
            }
            if (rc) {
                perror("posting");
                return 1;
            }
            if (ev->exs_evt_type != EXS_EVT_CONNECT && c->sent && c->echoed && ++echoed == n) {
                /* every connection is open and echoed: now close them all */
                printf("many_conns client: %d connections open, every echo verified\n", n);
                for (int k = 0; k < n; k++)
                    if (exs_close(conns[k].fd, q, &conns[k]) < 0) {
                        perror("exs_close");
                        return 1;
                    }
            }
        }
    }
    exs_qdelete(q);
    free(conns);
    printf("many_conns client: %d connections closed\n", closed);
    return 0;
}

int main(int argc, char **argv)
{
    int port = argc > 2 ? atoi(argv[2]) : -1, n = argc > 3 ? atoi(argv[3]) : 0, rc;

    if (argc < 4 || port < 0 || n < 1 || n > 100000 ||
        (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: many_conns server|client PORT N\n");
        return 2;
    }
    if (raise_nofile() < 0)
        perror("setrlimit(RLIMIT_NOFILE)"); /* go on: fewer connections may still fit */
    if (exs_init(EXS_VERSION) < 0) {
        perror("exs_init");
        return 1;
    }
    rc = strcmp(argv[1], "server") ? client(port, n) : server(port, n);
    exs_fini();
    return rc;
}
