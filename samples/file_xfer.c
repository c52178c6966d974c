/* SPDX-License-Identifier: MIT */
/* File transfer with exs_sendfile over an exs SOCK_STREAM socket: the sender posts file
 * ranges, the receiver writes what arrives to a file.
 *
 *   file_xfer recv OUTFILE [PORT]      prints "file_xfer receiver on 127.0.0.1:PORT"
 *   file_xfer send PORT INFILE
 *
 * The sender never reads the file itself: each exs_sendfile(fd, in_fd, offset, count, q, ah)
 * names a range of it and completes with an EXS_EVT_SENDFILE event whose result is the
 * bytes sent. The file offset of in_fd is left alone, so ranges may be posted in any
 * number at once; a few are kept outstanding here. The receiver gathers each receive into
 * two registered halves of one buffer with exs_recvmsg, synchronously. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/stat.h>
#include <unistd.h>

#define RANGE     (1u << 20) /* bytes per exs_sendfile (at most EXS_SENDFILE_MAX) */
#define DEPTH     4          /* ranges outstanding at once */
#define RECV_SIZE (1u << 20) /* receive buffer */

static int fail(const char *what)
{
    fprintf(stderr, "file_xfer: %s: %s\n", what, strerror(errno));
    return 1;
}

/* The sender: connect, post the file's ranges DEPTH at a time, then shut down and close. */
static int sender(int port, const char *path)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    exs_qhandle_t q = exs_qcreate(DEPTH);
    off_t size, next = 0, done = 0;
    int in_fd = open(path, O_RDONLY), fd, pending = 0;
    struct stat st;
    exs_event_t ev;

    if (in_fd < 0 || fstat(in_fd, &st) < 0)
        return fail(path);
    size = st.st_size;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (q == EXS_QHANDLE_INVALID || fd < 0)
        return fail("exs_qcreate / exs_socket");
    /* synchronous connect: EXS_QHANDLE_INVALID instead of a queue */
    if (exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), EXS_QHANDLE_INVALID, NULL) < 0)
        return fail("exs_connect");
    while (done < size) {
        /* keep DEPTH ranges in flight; each event says how many bytes its range sent */
        while (pending < DEPTH && next < size) {
            size_t count = (size_t)(size - next) < RANGE ? (size_t)(size - next) : RANGE;

            /* the ahandle carries the range's length, to check the result against */
            if (exs_sendfile(fd, in_fd, next, count, q, (exs_ahandle_t)(uintptr_t)count) < 0)
                return fail("exs_sendfile");
            next += (off_t)count;
            pending++;
        }
        if (exs_qdequeue(q, &ev, 1, NULL) != 1)
            return fail("exs_qdequeue");
        pending--;
        if (ev.exs_evt_errno) {
            errno = ev.exs_evt_errno;
            return fail("EXS_EVT_SENDFILE");
        }
        /* a short result means the file shrank under us (sendfile(2) semantics) */
        if (ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result != (ssize_t)(uintptr_t)ev.exs_evt_ahandle) {
            fprintf(stderr, "file_xfer: %s changed while it was sent\n", path);
            return 1;
        }
        done += ev.exs_evt_u.exs_evt_xfermsg.exs_evt_result;
    }
    /* end of stream for the receiver, then close (both synchronous) */
    if (exs_shutdown(fd, SHUT_WR, EXS_QHANDLE_INVALID, NULL) < 0 ||
        exs_close(fd, EXS_QHANDLE_INVALID, NULL) < 0)
        return fail("exs_shutdown / exs_close");
    close(in_fd);
    exs_qdelete(q);
    printf("file_xfer sender: %lld bytes of %s sent\n", (long long)done, path);
    return 0;
}

/* The receiver: accept one connection and write what arrives until the end of stream. */
static int receiver(const char *path, int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t len = sizeof(sin);
    char *buf = malloc(RECV_SIZE);
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), lfd, fd;
    exs_mhandle_t mh;
    long long total = 0;

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!buf || out < 0)
        return fail(path);
    mh = exs_mregister(buf, RECV_SIZE, 0);
    lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (mh == EXS_MHANDLE_INVALID || lfd < 0 || exs_bind(lfd, (struct sockaddr *)&sin, len) < 0 ||
        exs_listen(lfd, 1) < 0 || exs_getsockname(lfd, (struct sockaddr *)&sin, &len) < 0)
        return fail("listener");
    printf("file_xfer receiver on 127.0.0.1:%d\n", ntohs(sin.sin_port));
    fflush(stdout);
    fd = exs_accept(lfd, EXS_QHANDLE_INVALID, NULL); /* synchronous: the new descriptor */
    if (fd < 0)
        return fail("exs_accept");
    for (;;) {
        /* one receive scattered over the buffer's two halves (both in one registration) */
        exs_iovec_t iov[2] = {{buf, RECV_SIZE / 2, mh}, {buf + RECV_SIZE / 2, RECV_SIZE / 2, mh}};
        exs_msghdr_t msg = {.msg_iov = iov, .msg_iovlen = 2};
        int n = exs_recvmsg(fd, &msg, 0, EXS_QHANDLE_INVALID, NULL);

        if (n < 0)
            return fail("exs_recvmsg");
        if (n == 0)
            break; /* end of stream: the sender shut down its side */
        for (int off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));

            if (w < 0 && errno != EINTR)
                return fail("write");
            off += w > 0 ? (int)w : 0;
        }
        total += n;
    }
    if (close(out) < 0)
        return fail("close");
    exs_close(fd, EXS_QHANDLE_INVALID, NULL);
    exs_close(lfd, EXS_QHANDLE_INVALID, NULL);
    exs_mderegister(mh);
    free(buf);
    printf("file_xfer receiver: %lld bytes written to %s\n", total, path);
    return 0;
}

int main(int argc, char **argv)
{
    int rc;

    if (argc < 3 || (strcmp(argv[1], "send") && strcmp(argv[1], "recv")) ||
        (!strcmp(argv[1], "send") && argc < 4)) {
        fprintf(stderr, "usage: file_xfer recv OUTFILE [PORT] | file_xfer send PORT INFILE\n");
        return 2;
    }
    if (exs_init(EXS_VERSION) < 0)
        return fail("exs_init");
    if (!strcmp(argv[1], "send"))
        rc = sender(atoi(argv[2]), argv[3]);
    else
        rc = receiver(argv[2], argc > 3 ? atoi(argv[3]) : 0);
    exs_fini();
    return rc;
}
