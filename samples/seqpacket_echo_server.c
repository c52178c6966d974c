/* SPDX-License-Identifier: MIT */
/* SOCK_SEQPACKET echo server: accepts connections and sends every message back.
 *
 *   seqpacket_echo_server [PORT] [MAX_CONNECTIONS] [MAX_CLIENTS] [BACKLOG] [ACCEPTS]
 *
 * PORT 0 takes an ephemeral port; the first line printed names the port listened on.
 * MAX_CONNECTIONS: exit after serving that many connections (0, the default: forever).
 * MAX_CLIENTS: connections served at the same time (default 16384); at the limit the
 * server stops accepting until one closes, and new clients wait in the backlog.
 * BACKLOG: exs_listen's backlog (default 4096). ACCEPTS: exs_accept operations kept
 * posted at once (default 1).
 *
 * The whole program is the asynchronous ES-API pattern: post operations with an
 * ahandle naming what they are, then take their completions off one event queue.
 * It is also the robust-server pattern: every failing call is handled. A failed accept
 * (EMFILE, ENFILE, ENOMEM, ECONNABORTED, ...) is logged at most once a second, then the
 * server pauses accepting (100 ms, doubling to 1 s) while it keeps serving its clients, and
 * retries; a failed receive, send or post closes that one connection. When its last client
 * is gone it hands the memory freed since back to the system (malloc_trim), so a burst of
 * connections does not leave the process large. */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <time.h>

#define MSG_MAX         65536 /* largest message echoed whole; longer ones arrive cut */
#define BACKOFF_MIN_MS  100
#define BACKOFF_MAX_MS  1000
#define LOG_INTERVAL_MS 1000

struct client {
    int fd;
    char *buf;                  /* one message in flight: receive into it, send it back */
    struct client *prev, *next; /* every client, to free them all when stopped */
};

struct server {
    exs_qhandle_t q;
    int lfd;
    long max_conns, served; /* served: connections accepted so far */
    long max_clients, clients;
    struct client *all;         /* list of the clients */
    int accept_posted, accepts; /* accepts posted now, and how many to keep posted */
    double resume_ms;           /* accepting paused until then (0: not paused) */
    int backoff_ms;
    double log_ms; /* last rate-limited message, and messages held back since */
    unsigned long log_held;
};

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* At most one message per LOG_INTERVAL_MS; says how many were held back meanwhile. */
__attribute__((format(printf, 2, 3))) static void log_limited(struct server *s, const char *fmt,
                                                              ...)
{
    double t = now_ms();
    va_list ap;

    if (s->log_ms && t - s->log_ms < LOG_INTERVAL_MS) {
        s->log_held++;
        return;
    }
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (s->log_held)
        fprintf(stderr, " (%lu more messages held back)", s->log_held);
    fputc('\n', stderr);
    s->log_ms = t;
    s->log_held = 0;
}

/* Errors that say the listener itself is unusable: retrying cannot help. */
static int accept_err_fatal(int err)
{
    return err == EBADF || err == EINVAL || err == ENOTSOCK || err == EOPNOTSUPP;
}

/* A failed accept: log it, pause accepting for the back-off, double it. */
static void accept_failed(struct server *s, int err, const char *what)
{
    log_limited(s, "%s: %s; accepting paused for %d ms", what, strerror(err), s->backoff_ms);
    s->resume_ms = now_ms() + s->backoff_ms;
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : s->backoff_ms * 2;
}

/* Keep s->accepts accepts posted while there is room for a client and no pause; 0 or -1
 * (fatal). */
static int accept_more(struct server *s)
{
    while (s->accept_posted < s->accepts && s->clients + s->accept_posted < s->max_clients &&
           (!s->max_conns || s->served + s->accept_posted < s->max_conns)) {
        if (s->resume_ms) {
            if (now_ms() < s->resume_ms)
                return 0;
            s->resume_ms = 0;
        }
        if (exs_accept(s->lfd, s->q, NULL) < 0) { /* ahandle NULL marks the accept */
            if (accept_err_fatal(errno)) {
                perror("exs_accept");
                return -1;
            }
            accept_failed(s, errno, "exs_accept");
            return 0;
        }
        s->accept_posted++;
    }
    return 0;
}

static void client_free(struct server *s, struct client *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->buf);
    free(c);
    if (--s->clients == 0)
        malloc_trim(0); /* idle after a burst: give the freed memory back */
}

/* Close one client. Its event slot is free (its last event was just taken), so the close
 * can be posted; should that fail anyway, close synchronously rather than leak it. */
static void client_close(struct server *s, struct client *c)
{
    if (exs_close(c->fd, s->q, c) == 0)
        return;
    fprintf(stderr, "exs_close(%d) posted: %s; closing synchronously\n", c->fd, strerror(errno));
    if (exs_close(c->fd, EXS_QHANDLE_INVALID, NULL) < 0)
        fprintf(stderr, "exs_close(%d): %s\n", c->fd, strerror(errno));
    client_free(s, c);
}

static void client_recv(struct server *s, struct client *c)
{
    /* Unregistered buffers are fine; register with exs_mregister for zero copy. */
    if (exs_recv(c->fd, c->buf, MSG_MAX, 0, s->q, c, EXS_MHANDLE_UNREGISTERED) < 0) {
        log_limited(s, "exs_recv(%d): %s; closing it", c->fd, strerror(errno));
        client_close(s, c);
    }
}

static void on_accept(struct server *s, const exs_event_t *ev)
{
    int fd = ev->exs_evt_u.exs_evt_accept.exs_evt_newfd;
    struct client *c;

    s->accept_posted--;
    if (ev->exs_evt_errno) {
        accept_failed(s, ev->exs_evt_errno, "accept");
        return;
    }
    s->backoff_ms = BACKOFF_MIN_MS;
    s->served++;
    c = calloc(1, sizeof(*c));
    if (c)
        c->buf = malloc(MSG_MAX);
    if (!c || !c->buf) {
        log_limited(s, "accept: no memory for a client; closing it");
        free(c);
        if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0)
            fprintf(stderr, "exs_close(%d): %s\n", fd, strerror(errno));
        return;
    }
    c->fd = fd;
    c->next = s->all;
    if (s->all)
        s->all->prev = c;
    s->all = c;
    s->clients++;
    client_recv(s, c);
}

static void on_event(struct server *s, const exs_event_t *ev)
{
    struct client *c = ev->exs_evt_ahandle;
    ssize_t n = ev->exs_evt_u.exs_evt_xfer.exs_evt_result;

    switch (ev->exs_evt_type) {
    case EXS_EVT_ACCEPT:
        on_accept(s, ev);
        break;
    case EXS_EVT_RECV:
        if (ev->exs_evt_errno || n <= 0) { /* error, or the client closed */
            if (ev->exs_evt_errno)
                log_limited(s, "recv(%d): %s", c->fd, strerror(ev->exs_evt_errno));
            client_close(s, c);
        } else if (exs_send(c->fd, c->buf, (size_t)n, 0, s->q, c, EXS_MHANDLE_UNREGISTERED) < 0) {
            log_limited(s, "exs_send(%d): %s; closing it", c->fd, strerror(errno));
            client_close(s, c);
        }
        break;
    case EXS_EVT_SEND: /* echoed: wait for the next message */
        if (ev->exs_evt_errno) {
            log_limited(s, "send(%d): %s", c->fd, strerror(ev->exs_evt_errno));
            client_close(s, c);
        } else {
            client_recv(s, c);
        }
        break;
    case EXS_EVT_CLOSE:
        if (ev->exs_evt_errno)
            log_limited(s, "close(%d): %s", c->fd, strerror(ev->exs_evt_errno));
        client_free(s, c);
        break;
    default:
        fprintf(stderr, "unexpected event type %d\n", (int)ev->exs_evt_type);
        break;
    }
}

int main(int argc, char **argv)
{
    struct server s = {.max_clients = 16384, .accepts = 1, .backoff_ms = BACKOFF_MIN_MS};
    int port = argc > 1 ? atoi(argv[1]) : 7471;
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t slen = sizeof(sin);
    int backlog = 4096;

    s.max_conns = argc > 2 ? atol(argv[2]) : 0;
    if (argc > 3)
        s.max_clients = atol(argv[3]);
    if (argc > 4)
        backlog = atoi(argv[4]);
    if (argc > 5)
        s.accepts = atoi(argv[5]);
    if (argc > 6 || port < 0 || port > 65535 || s.max_conns < 0 || s.max_clients < 1 ||
        s.max_clients > (1 << 20) - 2 || backlog < 1 || s.accepts < 1 || s.accepts > 65536) {
        fprintf(stderr, "usage: seqpacket_echo_server [PORT] [MAX_CONNECTIONS] "
                        "[MAX_CLIENTS 1..1048574] [BACKLOG] [ACCEPTS 1..65536]\n");
        return 2;
    }
    /* SIGINT and SIGTERM stop the server cleanly. They stay blocked in the library's
     * threads (created by exs_init with this mask) and reach this one, where they interrupt
     * exs_qdequeue (EINTR); the wait is also capped at a second in case one arrives just
     * before it sleeps. */
    sigset_t stop_set;
    struct sigaction sa = {.sa_handler = on_stop_signal};

    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 ||
        pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0) {
        perror("sigaction");
        return 1;
    }
    if (exs_init(EXS_VERSION) < 0) {
        perror("exs_init");
        return 1;
    }
    if (pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL) != 0) {
        perror("pthread_sigmask");
        return 1;
    }
    /* One queue for everything. Each client has one operation in flight (receive, send or
     * close) and there are s.accepts accepts: this depth can never run out of slots. */
    s.q = exs_qcreate((int)s.max_clients + s.accepts + 1);
    if (s.q == EXS_QHANDLE_INVALID) {
        perror("exs_qcreate");
        return 1;
    }
    s.lfd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    if (s.lfd < 0 || exs_bind(s.lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        exs_listen(s.lfd, backlog) < 0 ||
        exs_getsockname(s.lfd, (struct sockaddr *)&sin, &slen) < 0) {
        perror("exs listen");
        return 1;
    }
    printf("echo server on 127.0.0.1:%d\n", ntohs(sin.sin_port));
    fflush(stdout);

    while (!stop_signal &&
           (!s.max_conns || s.served < s.max_conns || s.clients > 0 || s.accept_posted)) {
        struct timespec wait = {.tv_sec = 1}, *tmo = &wait;
        exs_event_t ev[64];
        int n;

        if (accept_more(&s) < 0)
            return 1;
        if (s.resume_ms) { /* wake up to resume accepting */
            double ms = s.resume_ms - now_ms();

            ms = ms < 1 ? 1 : ms > 1000 ? 1000 : ms;
            wait.tv_sec = (time_t)(ms / 1e3);
            wait.tv_nsec = (long)((ms - (double)wait.tv_sec * 1e3) * 1e6);
        }
        n = exs_qdequeue(s.q, ev, 64, tmo);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("exs_qdequeue");
            return 1;
        }
        for (int i = 0; i < n; i++)
            on_event(&s, &ev[i]);
    }
    if (stop_signal) {
        /* exs_fini aborts every connection still open (the clients see a reset), cancels
         * what is outstanding and deletes the queue; then the clients' memory is ours. */
        fprintf(stderr, "signal %d: stopping with %ld clients\n", (int)stop_signal, s.clients);
        exs_fini();
        while (s.all)
            client_free(&s, s.all);
        return 0;
    }
    if (exs_close(s.lfd, EXS_QHANDLE_INVALID, NULL) < 0)
        perror("exs_close(listener)");
    if (exs_qdelete(s.q) < 0)
        perror("exs_qdelete");
    exs_fini();
    return 0;
}
