/* SPDX-License-Identifier: MIT */
/*
 * kfd_bench: the ES-API calls on a kernel TCP socket against plain send(), as netperf's EXS
 * test runs them (issue 27): the sender makes a kernel socket and posts exs_send with an
 * event queue, the other end (a child process forked before exs_init) is a plain recv
 * loop. Each round sends --bytes at each size both ways, in alternating order, then the
 * receiver acknowledges the last byte; the median of the rounds is reported, with the
 * ratio exs_send / send. With --probe, a third stream per round: sendmsg carrying the
 * probe exs_send used to carry on a checked TCP socket until it gave way to a plain send()
 * (an AF_UNIX address and an SO_TIMESTAMPING control message, spec/api.md 5.14), and
 * nothing else: probe / send is what that probe alone cost in the kernel, the most
 * exs / send could have reached with it.
 *
 *   kfd_bench [--sizes 64,4096,65536,1048576] [--bytes N] [--rounds N] [--depth N] [--probe]
 *   kfd_bench --only exs|send|probe --size S --count N   one stream, for strace -c -f
 */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES  16
#define MAX_ROUNDS 31

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* The receiver: each connection is read to its end, then answered with one byte. */
static void receiver(int lfd)
{
    static char buf[1 << 20];

    for (;;) {
        int c = accept(lfd, NULL, NULL);
        ssize_t n;

        if (c < 0)
            _exit(errno == EINTR ? 0 : 1);
        while ((n = recv(c, buf, sizeof(buf), 0)) > 0)
            ;
        if (n < 0 || send(c, "k", 1, MSG_NOSIGNAL) != 1)
            _exit(1);
        close(c);
    }
}

static int conn(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0 || connect(fd, (const struct sockaddr *)sa, sizeof(*sa)))
        die("connect");
    return fd;
}

/* After the sends: the receiver has every byte. */
static void finish(int fd)
{
    char k;

    if (shutdown(fd, SHUT_WR) || recv(fd, &k, 1, MSG_WAITALL) != 1)
        die("finish");
    close(fd);
}

static void run_send(int fd, const char *buf, size_t size, long count)
{
    for (long i = 0; i < count; i++) {
        size_t off = 0;

        while (off < size) {
            ssize_t n = send(fd, buf + off, size - off, MSG_NOSIGNAL);

            if (n < 0)
                die("send");
            off += (size_t)n;
        }
    }
}

/* sendmsg with the probe api/kfd.c's sends carried before (--probe). */
static void run_probe(int fd, const char *buf, size_t size, long count)
{
    static const struct sockaddr unix_addr = {.sa_family = AF_UNIX};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;

    for (long i = 0; i < count; i++) {
        size_t off = 0;

        while (off < size) {
            struct iovec iov = {.iov_base = (char *)buf + off, .iov_len = size - off};
            struct msghdr mh = {.msg_iov = &iov,
                                .msg_iovlen = 1,
                                .msg_name = (void *)&unix_addr,
                                .msg_namelen = sizeof(unix_addr.sa_family),
                                .msg_control = c.buf,
                                .msg_controllen = sizeof(c.buf)};
            struct cmsghdr *h;
            ssize_t n;

            memset(&c, 0, sizeof(c));
            h = CMSG_FIRSTHDR(&mh);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SO_TIMESTAMPING;
            h->cmsg_len = CMSG_LEN(sizeof(int));
            n = sendmsg(fd, &mh, MSG_NOSIGNAL);
            if (n < 0)
                die("sendmsg");
            off += (size_t)n;
        }
    }
}

/* exs_send with up to depth sends outstanding on queue q. */
static void run_exs(int fd, exs_qhandle_t q, const char *buf, size_t size, long count, int depth)
{
    long posted = 0, done = 0;
    exs_event_t ev[64];

    while (done < count) {
        while (posted < count && posted - done < depth) {
            if (exs_send(fd, (void *)buf, size, 0, q, NULL, EXS_MHANDLE_UNREGISTERED))
                die("exs_send");
            posted++;
        }
        int n = exs_qdequeue(q, ev, posted - done < 64 ? (int)(posted - done) : 64, NULL);

        if (n < 0)
            die("exs_qdequeue");
        for (int i = 0; i < n; i++) {
            if (ev[i].exs_evt_errno ||
                ev[i].exs_evt_u.exs_evt_xfer.exs_evt_result != (ssize_t)size) {
                fprintf(stderr, "exs_send: errno %d result %zd\n", ev[i].exs_evt_errno,
                        (ssize_t)ev[i].exs_evt_u.exs_evt_xfer.exs_evt_result);
                exit(1);
            }
        }
        done += n;
    }
}

/* A byte count with an optional K, M or G (binary). */
static long long parse_bytes(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 0);

    switch (*end) {
    case 'K':
        return v << 10;
    case 'M':
        return v << 20;
    case 'G':
        return v << 30;
    default:
        return v;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {64, 4096, 65536, 1 << 20};
    int nsizes = 4, rounds = 5, depth = 1, probe = 0;
    long long bytes = 64ll << 20;
    const char *only = NULL;
    size_t only_size = 64;
    long only_count = 10000;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t salen = sizeof(sa);
    static const struct option opts[] = {{"sizes", required_argument, NULL, 'z'},
                                         {"bytes", required_argument, NULL, 'b'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"depth", required_argument, NULL, 'd'},
                                         {"only", required_argument, NULL, 'o'},
                                         {"size", required_argument, NULL, 's'},
                                         {"count", required_argument, NULL, 'n'},
                                         {"probe", no_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    int o, lfd, status;
    exs_qhandle_t q;
    pid_t pid;
    char *buf;

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'z':
            nsizes = 0;
            for (char *t = strtok(optarg, ","); t && nsizes < MAX_SIZES; t = strtok(NULL, ","))
                sizes[nsizes++] = (size_t)parse_bytes(t);
            break;
        case 'b':
            bytes = parse_bytes(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'd':
            depth = atoi(optarg);
            break;
        case 'o':
            only = optarg;
            break;
        case 's':
            only_size = (size_t)parse_bytes(optarg);
            break;
        case 'n':
            only_count = atol(optarg);
            break;
        case 'p':
            probe = 1;
            break;
        default:
            fprintf(stderr, "usage: see the opening comment of bench/kfd/kfd_bench.c\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || depth < 1 || depth > 1024 || nsizes < 1 ||
        (only && strcmp(only, "exs") && strcmp(only, "send") && strcmp(only, "probe")))
        return fprintf(stderr, "kfd_bench: bad option\n"), 2;
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 16) ||
        getsockname(lfd, (struct sockaddr *)&sa, &salen))
        die("listen");
    pid = fork(); /* before exs_init: the receiver is a plain process */
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1)
            _exit(0);
        receiver(lfd);
    }
    close(lfd);
    if (exs_init(EXS_VERSION) != EXS_VERSION)
        die("exs_init");
    q = exs_qcreate(1024);
    if (q == EXS_QHANDLE_INVALID)
        die("exs_qcreate");
    buf = calloc(1, only ? only_size : 1 << 20);
    if (!buf)
        die("calloc");
    for (int i = 0; i < nsizes && !only; i++)
        if (sizes[i] < 1 || sizes[i] > 1 << 20)
            return fprintf(stderr, "kfd_bench: sizes are 1..1 MiB\n"), 2;
    if (only) {
        int fd = conn(&sa);

        if (!strcmp(only, "exs"))
            run_exs(fd, q, buf, only_size, only_count, depth);
        else if (!strcmp(only, "probe"))
            run_probe(fd, buf, only_size, only_count);
        else
            run_send(fd, buf, only_size, only_count);
        finish(fd);
    } else {
        printf("# kfd_bench: exs_send (event queue, %d outstanding) on a kernel TCP socket vs "
               "send(), loopback, %lld bytes per point, median of %d rounds\n",
               depth, bytes, rounds);
        printf("# %9s %12s %12s %8s%s\n", "size", "send MB/s", "exs MB/s", "exs/send",
               probe ? " probe/send" : "");
        for (int i = 0; i < nsizes; i++) {
            double t[3][MAX_ROUNDS]; /* send, exs, probe */
            long count = (long)(bytes / (long long)sizes[i]);

            if (count < 1)
                count = 1;
            int kinds = probe ? 3 : 2;

            for (int r = 0; r < rounds; r++) {
                for (int w = 0; w < kinds; w++) {
                    int kind = (w + r) % kinds; /* the order turns each round */
                    int fd = conn(&sa);
                    double t0 = now_s();

                    if (kind == 1)
                        run_exs(fd, q, buf, sizes[i], count, depth);
                    else if (kind == 2)
                        run_probe(fd, buf, sizes[i], count);
                    else
                        run_send(fd, buf, sizes[i], count);
                    finish(fd);
                    t[kind][r] = now_s() - t0;
                }
            }
            double ms = (double)count * (double)sizes[i] / 1e6;
            double s = ms / median(t[0], rounds), e = ms / median(t[1], rounds);
            double p = probe ? ms / median(t[2], rounds) : 0;

            printf("  %9zu %12.1f %12.1f %8.2f", sizes[i], s, e, e / s);
            if (probe)
                printf(" %10.2f", p / s);
            printf("\n");
            fflush(stdout);
        }
    }
    exs_qdelete(q);
    exs_fini();
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    free(buf);
    return 0;
}
