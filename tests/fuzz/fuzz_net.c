/* SPDX-License-Identifier: MIT */
/* In-process echo servers (ES-API, tcp provider) that network fuzz targets attack over loopback. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_net.h"

#define FZ_MSG_MAX     65536
#define FZ_END_WAIT_MS 20000 /* the server must end a connection whose peer shut down */

struct fz_client {
    int fd;
    int open;
    char buf[FZ_MSG_MAX];
};

static int fz_port[2]; /* [0] SEQPACKET, [1] STREAM */
static int fz_lfd[2];
static exs_qhandle_t fz_q;

static void fz_accept(int i)
{
    while (exs_accept(fz_lfd[i], fz_q, (void *)(intptr_t)(i + 1)) < 0) {
        fprintf(stderr, "fuzz server: exs_accept: %s\n", strerror(errno));
        usleep(10000);
    }
}

static void fz_close(struct fz_client *c)
{
    if (c->open && exs_close(c->fd, fz_q, c) < 0) {
        fprintf(stderr, "fuzz server: exs_close: %s\n", strerror(errno));
        abort();
    }
    c->open = 0;
}

static void *fz_loop(void *arg)
{
    for (;;) {
        exs_event_t ev;

        if (exs_qdequeue(fz_q, &ev, 1, NULL) != 1)
            continue;
        intptr_t tag = (intptr_t)ev.exs_evt_ahandle;
        struct fz_client *c = ev.exs_evt_ahandle;
        ssize_t n = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;

        if (ev.exs_evt_type == EXS_EVT_ACCEPT && (tag == 1 || tag == 2)) {
            if (!ev.exs_evt_errno) {
                c = calloc(1, sizeof(*c));
                if (!c)
                    abort();
                c->fd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
                c->open = 1;
                if (exs_recv(c->fd, c->buf, FZ_MSG_MAX, 0, fz_q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                    fz_close(c);
            }
            fz_accept((int)tag - 1);
            continue;
        }
        switch (ev.exs_evt_type) {
        case EXS_EVT_RECV:
            if (!c->open)
                break;
            if (ev.exs_evt_errno || n == 0 ||
                exs_send(c->fd, c->buf, (size_t)n, 0, fz_q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                fz_close(c);
            break;
        case EXS_EVT_SEND:
            if (!c->open)
                break;
            if (ev.exs_evt_errno ||
                exs_recv(c->fd, c->buf, FZ_MSG_MAX, 0, fz_q, c, EXS_MHANDLE_UNREGISTERED) < 0)
                fz_close(c);
            break;
        case EXS_EVT_CLOSE:
            free(c);
            break;
        default:
            break;
        }
    }
    return NULL;
}

static void fz_start(void)
{
    static const int types[2] = {SOCK_SEQPACKET, SOCK_STREAM};
    pthread_t th;

    signal(SIGPIPE, SIG_IGN);
    setenv("EXS_PROVIDER", "tcp", 1);
    if (!getenv("EXS_LOG_LEVEL"))
        setenv("EXS_LOG_LEVEL", "crit", 1);
    if (exs_init(EXS_VERSION) < 0)
        abort();
    fz_q = exs_qcreate(8192);
    if (fz_q == EXS_QHANDLE_INVALID)
        abort();
    for (int i = 0; i < 2; i++) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

        fz_port[i] = raw_free_port();
        sin.sin_port = htons((uint16_t)fz_port[i]);
        fz_lfd[i] = exs_socket(AF_INET, types[i], 0);
        if (fz_lfd[i] < 0 || exs_bind(fz_lfd[i], (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
            exs_listen(fz_lfd[i], 128) < 0) {
            perror("fuzz server: listen");
            abort();
        }
        fz_accept(i);
    }
    if (pthread_create(&th, NULL, fz_loop, NULL))
        abort();
    pthread_detach(th);
}

int fuzz_server_port(int sock_type)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, fz_start);
    return fz_port[sock_type == SOCK_STREAM];
}

void fuzz_finish(int fd, const uint8_t *bytes, size_t len)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    double deadline = raw_now_ms() + FZ_END_WAIT_MS;
    char sink[65536];

    if (len)
        (void)raw_write_all(fd, bytes, len); /* the server may have ended it already */
    shutdown(fd, SHUT_WR);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - raw_now_ms());
        ssize_t n;

        if (left <= 0) {
            fprintf(stderr,
                    "fuzz: the server did not end a connection whose peer shut down "
                    "within %d ms\n",
                    FZ_END_WAIT_MS);
            abort();
        }
        if (poll(&pfd, 1, left) <= 0)
            continue;
        n = recv(fd, sink, sizeof(sink), 0);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            break;
    }
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
}

void fuzz_reset(int fd, const uint8_t *bytes, size_t len)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};

    if (len)
        (void)raw_write_all(fd, bytes, len);
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
}
