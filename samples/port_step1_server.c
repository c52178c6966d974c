/* SPDX-License-Identifier: MIT */
/* Porting, step 1: the plain blocking TCP receiver the ported client talks to (kernel sockets only,
 * no libexs). */
/*
 * usage: port_step1_server [-p PORT] [-l LEN]
 *
 * Listens on 127.0.0.1:PORT (0: any; it prints "listening PORT"), accepts one
 * connection and reads it with blocking recv() until the end of the stream, checking
 * every byte: the client sends buffers A and B of LEN bytes in turn (A B A B ...), byte
 * j of A is pattern_a(j) and of B pattern_b(j). It sends nothing before the end of the
 * stream (the client relies on that to check that its blocking recv blocks), then
 * answers "OK <bytes>\n" or "BAD <offset>\n" and closes. Exit status 0 when intact.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "samples/port_step1.h"

int main(int argc, char **argv)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t slen = sizeof(sin);
    unsigned long long got = 0, bad = ~0ull;
    size_t len = PORT1_LEN;
    static unsigned char buf[1 << 16];
    char reply[64];
    int opt, port = 0, l, c, n;

    while ((opt = getopt(argc, argv, "p:l:")) != -1) {
        if (opt == 'p')
            port = atoi(optarg);
        else if (opt == 'l')
            len = strtoul(optarg, NULL, 0);
        else {
            fprintf(stderr, "usage: %s [-p PORT] [-l LEN]\n", argv[0]);
            return 2;
        }
    }
    if (!len) {
        fprintf(stderr, "LEN must be > 0\n");
        return 2;
    }
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = htons((uint16_t)port);
    l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof(sin)) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&sin, &slen)) {
        perror("listen");
        return 1;
    }
    printf("listening %d\n", ntohs(sin.sin_port));
    fflush(stdout);
    c = accept(l, NULL, NULL);
    if (c < 0) {
        perror("accept");
        return 1;
    }
    close(l);
    for (;;) {
        ssize_t k = recv(c, buf, sizeof(buf), 0);

        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            perror("recv");
            return 1;
        }
        if (k == 0)
            break; /* the client shut its side down */
        for (ssize_t i = 0; i < k && bad == ~0ull; i++)
            if (buf[i] != port1_byte(got + (unsigned long long)i, len))
                bad = got + (unsigned long long)i;
        got += (unsigned long long)k;
    }
    if (bad == ~0ull)
        n = snprintf(reply, sizeof(reply), "OK %llu\n", got);
    else
        n = snprintf(reply, sizeof(reply), "BAD %llu\n", bad);
    if (send(c, reply, (size_t)n, MSG_NOSIGNAL) != n)
        perror("send");
    close(c);
    printf("server: %llu bytes, %s", got, reply);
    return bad == ~0ull ? 0 : 1;
}
