/* SPDX-License-Identifier: MIT */
/* SOCK_STREAM file receiver: accepts one connection and writes the whole stream to a file.
 *
 *   stream_recv [-p PORT] OUTFILE
 *
 * Porting notes (BSD sockets -> ES-API): instead of a blocking read() loop, NBUF receives
 * are kept posted on one event queue, each into its own slice of one registered region;
 * completions arrive in posting order, so writing each one out as it comes keeps the file
 * in stream order. A receive completes with 1..len bytes like recv(); 0 = end of stream.
 * Prints "received N bytes fnv1a64 HEX" (FNV-1a 64 of the bytes received). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <unistd.h>

#define NBUF  8
#define CHUNK (1 << 20)

/* FNV-1a 64: a few lines, good enough to compare a file end to end. */
static uint64_t fnv1a64(uint64_t h, const unsigned char *p, size_t n)
{
    while (n--)
        h = (h ^ *p++) * 0x100000001b3ull;
    return h;
}

/* Accept one connection. Like accept(), it can fail for want of resources (EMFILE, ENFILE,
 * ENOMEM, ENOBUFS) or because a client gave up (ECONNABORTED): say so, pause (100 ms doubling
 * to 1 s) and try again. Other errors mean the listener is unusable: -1 with errno set. */
static int accept_retry(int lfd)
{
    int pause_ms = 100;

    for (;;) {
        int fd = exs_accept(lfd, EXS_QHANDLE_INVALID, NULL);

        if (fd >= 0)
            return fd;
        if (errno != EMFILE && errno != ENFILE && errno != ENOMEM && errno != ENOBUFS &&
            errno != ECONNABORTED && errno != EAGAIN && errno != EINTR)
            return -1;
        fprintf(stderr, "exs_accept: %s; retrying in %d ms\n", strerror(errno), pause_ms);
        usleep((useconds_t)pause_ms * 1000);
        pause_ms = pause_ms * 2 > 1000 ? 1000 : pause_ms * 2;
    }
}

static int fail(const char *what)
{
    perror(what);
    return 1;
}

int main(int argc, char **argv)
{
    int port = 7472, opt;

    while ((opt = getopt(argc, argv, "p:")) != -1) {
        if (opt != 'p')
            goto usage;
        port = atoi(optarg);
    }
    if (optind != argc - 1) {
    usage:
        fprintf(stderr, "usage: stream_recv [-p PORT] OUTFILE\n");
        return 2;
    }
    FILE *out = fopen(argv[optind], "wb");
    if (!out)
        return fail(argv[optind]);
    if (exs_init(EXS_VERSION) < 0)
        return fail("exs_init");

    /* Listen like socket() + bind() + listen(); the descriptor is the library's. */
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t slen = sizeof(sin);
    int lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        exs_listen(lfd, 1) < 0 || exs_getsockname(lfd, (struct sockaddr *)&sin, &slen) < 0)
        return fail("listen");
    printf("listening on port %d\n", ntohs(sin.sin_port));
    fflush(stdout);

    /* One queue for everything; the synchronous form (EXS_QHANDLE_INVALID) is enough for
     * accept, as accept() would be. */
    exs_qhandle_t q = exs_qcreate(2 * NBUF);
    if (q == EXS_QHANDLE_INVALID)
        return fail("exs_qcreate");
    int fd = accept_retry(lfd);
    if (fd < 0)
        return fail("exs_accept");

    /* Register the receive buffers once: transfers land in them without a copy. */
    unsigned char *bufs = malloc((size_t)NBUF * CHUNK);
    exs_mhandle_t mh = bufs ? exs_mregister(bufs, (size_t)NBUF * CHUNK, 0) : EXS_MHANDLE_INVALID;
    if (mh == EXS_MHANDLE_INVALID)
        return fail("exs_mregister");

    /* Keep NBUF receives posted; the ahandle says which buffer a completion used. */
    int outstanding = 0, eos = 0;
    for (int i = 0; i < NBUF; i++, outstanding++)
        if (exs_recv(fd, bufs + (size_t)i * CHUNK, CHUNK, 0, q, (exs_ahandle_t)(intptr_t)i, mh) < 0)
            return fail("exs_recv");

    uint64_t total = 0, hash = 0xcbf29ce484222325ull;
    while (outstanding > 0) {
        exs_event_t ev;
        if (exs_qdequeue(q, &ev, 1, NULL) != 1)
            return fail("exs_qdequeue");
        int i = (int)(intptr_t)ev.exs_evt_ahandle;
        ssize_t n = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        outstanding--;
        if (ev.exs_evt_type != EXS_EVT_RECV || ev.exs_evt_errno != 0 || n < 0) {
            fprintf(stderr, "receive failed: %s\n", strerror(ev.exs_evt_errno));
            return 1;
        }
        if (n == 0) { /* end of stream: the remaining receives complete with 0 too */
            eos = 1;
            continue;
        }
        unsigned char *b = bufs + (size_t)i * CHUNK;
        if (fwrite(b, 1, (size_t)n, out) != (size_t)n)
            return fail("fwrite");
        hash = fnv1a64(hash, b, (size_t)n);
        total += (uint64_t)n;
        if (!eos) { /* the buffer is ours again: post it for the next bytes */
            if (exs_recv(fd, b, CHUNK, 0, q, ev.exs_evt_ahandle, mh) < 0)
                return fail("exs_recv");
            outstanding++;
        }
    }
    printf("received %llu bytes fnv1a64 %016llx\n", (unsigned long long)total,
           (unsigned long long)hash);

    /* Synchronous close, like close(); then release what we registered and created. */
    int rc = 0;
    if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0)
        rc = fail("exs_close");
    if (exs_close(lfd, EXS_QHANDLE_INVALID, NULL) < 0)
        rc = fail("exs_close(listener)");
    if (exs_mderegister(mh) < 0)
        rc = fail("exs_mderegister");
    if (exs_qdelete(q) < 0)
        rc = fail("exs_qdelete");
    exs_fini();
    free(bufs);
    if (fclose(out) != 0)
        rc = fail("fclose");
    return rc;
}
