/* SPDX-License-Identifier: MIT */
/* Porting a fork-per-client server, way 1: a thread per client instead of a process.
 *
 *   port_fork_threads [PORT] [CONNECTIONS]
 *
 * port_fork0_server.c on exs sockets. One process calls exs_init and accepts; where the
 * textbook server forked, this one starts a thread, which runs the same blocking echo
 * loop in synchronous ES-API calls (every ES-API call may be made from any thread). What
 * the child process got for free, isolation, is gone: a thread must not exit the
 * process, and state the children each had alone is shared now. Clients: port_step2_client
 * (exs sockets). */
#include <pthread.h>
#include <stdlib.h>

#include "port_fork.h"

static void *client_thread(void *arg)
{
    int fd = (int)(intptr_t)arg, rc;

    pf_say_peer("thread", fd);
    rc = pf_exs_echo(fd);
    exs_close(fd, EXS_QHANDLE_INVALID, NULL);
    return (void *)(intptr_t)rc;
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, conns = argc > 2 ? atoi(argv[2]) : 1, failed = 0;
    pthread_t *t = calloc((size_t)conns, sizeof(*t));
    int lfd;

    if (!t || exs_init(EXS_VERSION) < 0 || (lfd = pf_exs_listen(port, &port)) < 0) {
        perror("start");
        return 1;
    }
    printf("thread-per-client echo server on 127.0.0.1:%d\n", port);
    fflush(stdout);
    for (int i = 0; i < conns; i++) {
        /* the synchronous accept returns the descriptor only; pf_say_peer asks
         * exs_getpeername for the address */
        int fd = exs_accept(lfd, EXS_QHANDLE_INVALID, NULL);

        if (fd < 0 || pthread_create(&t[i], NULL, client_thread, (void *)(intptr_t)fd)) {
            perror("accept");
            return 1;
        }
    }
    for (int i = 0; i < conns; i++) {
        void *rc;

        pthread_join(t[i], &rc);
        failed += rc != NULL;
    }
    exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
    exs_fini();
    free(t);
    printf("served %d connection(s), %d failed\n", conns, failed);
    return failed != 0;
}
