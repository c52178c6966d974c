/* SPDX-License-Identifier: MIT */
/* SOCK_STREAM file sender: connects and sends a file with several sends outstanding.
 *
 *   stream_send [-p PORT] [-h HOST] INFILE
 *
 * Porting notes (BSD sockets -> ES-API): a write() loop becomes NBUF asynchronous sends
 * on one event queue, each from its own slice of one registered region. When a send's
 * event arrives its buffer is free again: refill it from the file and post it. The peer
 * sees the bytes in posting order however its receives are sized. exs_shutdown(SHUT_WR)
 * ends the stream (the receiver then gets 0), like shutdown(). Prints
 * "sent N bytes fnv1a64 HEX" (FNV-1a 64 of the file) for an end-to-end comparison. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <unistd.h>

#define NBUF  8
#define CHUNK (1 << 20)

static uint64_t fnv1a64(uint64_t h, const unsigned char *p, size_t n)
{
    while (n--)
        h = (h ^ *p++) * 0x100000001b3ull;
    return h;
}

struct sender {
    FILE *in;
    int fd;
    exs_qhandle_t q;
    exs_mhandle_t mh;
    unsigned char *bufs; /* NBUF slices of CHUNK bytes, one registered region */
    uint64_t total, hash;
};

/* Fill buffer i from the file and post it as one send: 1 posted, 0 end of file, -1 error.
 * Hashing here, in read order, is hashing in stream order. */
static int post_chunk(struct sender *s, int i)
{
    unsigned char *b = s->bufs + (size_t)i * CHUNK;
    size_t n = fread(b, 1, CHUNK, s->in);

    if (n == 0)
        return 0;
    s->hash = fnv1a64(s->hash, b, n);
    s->total += n;
    /* The ahandle carries the buffer index back in the event. */
    if (exs_send(s->fd, b, n, MSG_NOSIGNAL, s->q, (exs_ahandle_t)(intptr_t)i, s->mh) < 0)
        return -1;
    return 1;
}

static int fail(const char *what)
{
    perror(what);
    return 1;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *port = "7472";
    int opt;

    while ((opt = getopt(argc, argv, "p:h:")) != -1) {
        if (opt == 'p')
            port = optarg;
        else if (opt == 'h')
            host = optarg;
        else
            goto usage;
    }
    if (optind != argc - 1) {
    usage:
        fprintf(stderr, "usage: stream_send [-p PORT] [-h HOST] INFILE\n");
        return 2;
    }
    FILE *in = fopen(argv[optind], "rb");
    if (!in)
        return fail(argv[optind]);

    /* Name resolution is unchanged from BSD sockets code. */
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", host, gai_strerror(rc));
        return 1;
    }
    if (exs_init(EXS_VERSION) < 0)
        return fail("exs_init");

    /* Synchronous connect (EXS_QHANDLE_INVALID) reads like connect(). */
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || exs_connect(fd, ai->ai_addr, ai->ai_addrlen, EXS_QHANDLE_INVALID, NULL) < 0)
        return fail("exs_connect");
    freeaddrinfo(ai);

    /* One queue for the send completions; send buffers registered once. */
    exs_qhandle_t q = exs_qcreate(NBUF);
    unsigned char *bufs = malloc((size_t)NBUF * CHUNK);
    exs_mhandle_t mh = bufs ? exs_mregister(bufs, (size_t)NBUF * CHUNK, 0) : EXS_MHANDLE_INVALID;
    if (q == EXS_QHANDLE_INVALID || mh == EXS_MHANDLE_INVALID)
        return fail("exs_qcreate / exs_mregister");

    /* Keep NBUF sends outstanding; when one completes, its buffer is free: refill, repost. */
    struct sender snd = {
        .in = in, .fd = fd, .q = q, .mh = mh, .bufs = bufs, .hash = 0xcbf29ce484222325ull};
    int outstanding = 0;
    for (int i = 0; i < NBUF; i++) {
        if ((rc = post_chunk(&snd, i)) < 0)
            return fail("exs_send");
        outstanding += rc;
    }
    while (outstanding > 0) {
        exs_event_t ev;
        if (exs_qdequeue(q, &ev, 1, NULL) != 1)
            return fail("exs_qdequeue");
        outstanding--;
        if (ev.exs_evt_type != EXS_EVT_SEND || ev.exs_evt_errno != 0) {
            fprintf(stderr, "send failed: %s\n", strerror(ev.exs_evt_errno));
            return 1;
        }
        if ((rc = post_chunk(&snd, (int)(intptr_t)ev.exs_evt_ahandle)) < 0)
            return fail("exs_send");
        outstanding += rc;
    }
    if (ferror(in))
        return fail("fread");

    /* End of stream for the peer, then close (both synchronous here). */
    if (exs_shutdown(fd, SHUT_WR, EXS_QHANDLE_INVALID, NULL) < 0)
        return fail("exs_shutdown");
    printf("sent %llu bytes fnv1a64 %016llx\n", (unsigned long long)snd.total,
           (unsigned long long)snd.hash);
    rc = 0;
    if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0)
        rc = fail("exs_close");
    if (exs_mderegister(mh) < 0)
        rc = fail("exs_mderegister");
    if (exs_qdelete(q) < 0)
        rc = fail("exs_qdelete");
    exs_fini();
    free(bufs);
    fclose(in);
    return rc;
}
