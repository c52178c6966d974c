/* SPDX-License-Identifier: MIT */
/* An application with its own libev loop that waits on an exs event queue through exs_qfd.
 *
 *   qfd_libev [COUNT]
 *
 * The loop watches the queue's descriptor (readable while an event is queued) next to its
 * other work (here a timer); when it fires, the callback takes the events with a zero
 * timeout, so it never blocks the loop. The work: a client and a server socket in this
 * process exchange COUNT (default 1000) checked SOCK_SEQPACKET messages, each echoed back. */
#include <arpa/inet.h>
#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>

#define MSG_LEN 256

enum role { LISTENER = 1, CLIENT, SERVER }; /* the ahandle of each operation */

struct app {
    exs_qhandle_t q;
    int lfd, cfd, afd;
    int count, done, closes, failed;
    int send_done, recv_done; /* the client's current message: both halves completed */
    char out[MSG_LEN], in[MSG_LEN], echo[MSG_LEN];
    unsigned long ticks;
    ev_io qwatch;
    ev_timer tick;
};

#define AH(r) ((exs_ahandle_t)(uintptr_t)(r))

static int post_client_message(struct app *a)
{
    memset(a->out, 'a' + a->done % 26, sizeof(a->out));
    memcpy(a->out, &a->done, sizeof(a->done));
    a->send_done = a->recv_done = 0;
    return exs_recv(a->cfd, a->in, sizeof(a->in), 0, a->q, AH(CLIENT), EXS_MHANDLE_UNREGISTERED) ||
           exs_send(a->cfd, a->out, sizeof(a->out), 0, a->q, AH(CLIENT), EXS_MHANDLE_UNREGISTERED);
}

static void close_all(struct app *a)
{
    exs_close(a->cfd, a->q, AH(CLIENT));
    exs_close(a->afd, a->q, AH(SERVER));
    exs_close(a->lfd, a->q, AH(LISTENER));
}

static void fail(struct app *a, struct ev_loop *loop, const char *what)
{
    fprintf(stderr, "qfd_libev: %s\n", what);
    a->failed = 1;
    ev_break(loop, EVBREAK_ALL);
}

/* One event: move the client or the server along. */
static void handle(struct app *a, struct ev_loop *loop, const exs_event_t *ev)
{
    enum role r = (enum role)(uintptr_t)ev->exs_evt_ahandle;
    int rc = 0;

    if (ev->exs_evt_type == EXS_EVT_CLOSE) {
        if (++a->closes == 3)
            ev_break(loop, EVBREAK_ALL); /* every socket is gone: the work is over */
        return;
    }
    if (a->done == a->count)
        return; /* closing: the server's last receive completes with ECANCELED */
    if (ev->exs_evt_errno) {
        fail(a, loop, strerror(ev->exs_evt_errno));
        return;
    }
    switch (ev->exs_evt_type) {
    case EXS_EVT_ACCEPT: /* the server side: wait for the first message */
        a->afd = ev->exs_evt_u.exs_evt_accept.exs_evt_newfd;
        rc = exs_recv(a->afd, a->echo, sizeof(a->echo), 0, a->q, AH(SERVER),
                      EXS_MHANDLE_UNREGISTERED);
        break;
    case EXS_EVT_CONNECT:
        rc = post_client_message(a);
        break;
    case EXS_EVT_RECV:
        if (r == SERVER) { /* echo the message back */
            rc = exs_send(a->afd, a->echo, (size_t)ev->exs_evt_u.exs_evt_xfer.exs_evt_result, 0,
                          a->q, AH(SERVER), EXS_MHANDLE_UNREGISTERED);
            break;
        }
        if (memcmp(a->in, a->out, sizeof(a->out))) {
            fail(a, loop, "the echo differs from the message");
            return;
        }
        a->recv_done = 1;
        break;
    case EXS_EVT_SEND:
        if (r == SERVER) /* the echo left: the buffer is free for the next message */
            rc = exs_recv(a->afd, a->echo, sizeof(a->echo), 0, a->q, AH(SERVER),
                          EXS_MHANDLE_UNREGISTERED);
        else
            a->send_done = 1;
        break;
    }
    if (rc < 0) {
        fail(a, loop, "posting failed");
        return;
    }
    if (r == CLIENT && a->send_done && a->recv_done) {
        if (++a->done == a->count)
            close_all(a);
        else if (post_client_message(a) < 0)
            fail(a, loop, "posting failed");
    }
}

/* The queue's descriptor is readable: take what is there, without waiting. */
static void on_queue(struct ev_loop *loop, ev_io *w, int revents)
{
    struct app *a = w->data;
    exs_event_t evs[16];
    int n = 0;

    while (!a->failed && (n = exs_qdequeue(a->q, evs, 16, &(struct timespec){0, 0})) > 0)
        for (int i = 0; i < n && !a->failed; i++)
            handle(a, loop, &evs[i]);
    if (n < 0)
        fail(a, loop, "exs_qdequeue failed");
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    ((struct app *)w->data)->ticks++; /* the loop's other work goes on meanwhile */
}

int main(int argc, char **argv)
{
    struct app a = {.count = argc > 1 ? atoi(argv[1]) : 1000, .afd = -1};
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    struct ev_loop *loop = ev_default_loop(0);

    if (a.count < 1 || !loop || exs_init(EXS_VERSION) < 0) {
        fprintf(stderr, "usage: qfd_libev [COUNT >= 1] (exs_init or libev failed?)\n");
        return 2;
    }
    a.q = exs_qcreate(16);
    a.lfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    a.cfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (a.q == EXS_QHANDLE_INVALID || a.lfd < 0 || a.cfd < 0 ||
        exs_bind(a.lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(a.lfd, 4) < 0 ||
        exs_getsockname(a.lfd, (struct sockaddr *)&sin, &len) < 0) {
        perror("qfd_libev: set-up");
        return 1;
    }
    /* exs_qfd: the library owns this descriptor; only watch it (never read or close it). */
    ev_io_init(&a.qwatch, on_queue, exs_qfd(a.q), EV_READ);
    a.qwatch.data = &a;
    ev_io_start(loop, &a.qwatch);
    ev_timer_init(&a.tick, on_tick, 0.01, 0.01);
    a.tick.data = &a;
    ev_timer_start(loop, &a.tick);
    if (exs_accept(a.lfd, a.q, AH(LISTENER)) < 0 ||
        exs_connect(a.cfd, (struct sockaddr *)&sin, sizeof(sin), a.q, AH(CLIENT)) < 0) {
        perror("qfd_libev: accept/connect");
        return 1;
    }
    ev_run(loop, 0);
    ev_io_stop(loop, &a.qwatch); /* out of the loop before exs_qdelete closes the descriptor */
    ev_timer_stop(loop, &a.tick);
    if (a.failed || exs_qdelete(a.q) < 0)
        return 1;
    exs_fini();
    printf("qfd_libev: %d messages echoed through a libev loop watching exs_qfd (%lu timer "
           "ticks meanwhile)\n",
           a.done, a.ticks);
    return 0;
}
