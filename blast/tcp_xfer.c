/* SPDX-License-Identifier: MIT */
/* blast: the same workload over plain kernel TCP sockets, the baseline (no link emulation). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blast/blast.h"

struct tconn {
    int fd, cls, done;
    uint64_t off, budget, msgs, cur_len, cur_done, slot;
    unsigned char *buf;  /* the buffer of the current message (sender) or read (receiver) */
    unsigned char *base; /* nbuf buffers of slot bytes, used in turn */
    unsigned nbuf, bi;
    struct sizegen sg;
    double t_first, t_last, posted;
    double *lat;
    size_t nlat, caplat;
};

static int tl_fd = -1, tl_port;

/* Buffers per connection: as many as the libexs run has operations outstanding on that
 * side (n), so that both touch the same memory; one with --tcp-one-buffer and for the
 * ping-pong. */
static unsigned tcp_nbuf(const struct run_params *rp, int n)
{
    return rp->kind == K_LAT || rp->onebuf || n < 1 ? 1 : (unsigned)n;
}

int tcp_server_prepare(const struct run_params *rp, int port, int *data_port)
{
    if (tl_fd < 0) {
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        int one = 1;
        socklen_t sl = sizeof(sin);

        tl_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(tl_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (tl_fd < 0 || bind(tl_fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
            listen(tl_fd, BLAST_MAX_CONNS) < 0) {
            fprintf(stderr, "blast: tcp listen on port %d: %s\n", port, strerror(errno));
            if (tl_fd >= 0)
                close(tl_fd);
            tl_fd = -1;
            return -1;
        }
        getsockname(tl_fd, (struct sockaddr *)&sin, &sl);
        tl_port = ntohs(sin.sin_port);
    }
    (void)rp;
    *data_port = tl_port;
    return 0;
}

void tcp_server_cleanup(void)
{
    if (tl_fd >= 0)
        close(tl_fd);
    tl_fd = -1;
}

static void set_bufs(int fd, const struct run_params *rp)
{
    int one = 1;

    if (rp->rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rp->rcvbuf, sizeof(int));
    if (rp->kind == K_LAT)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Receiver: read every connection to its end, verifying; or echo (K_LAT). */
int tcp_server_run(const struct run_params *rp, struct side_result *res)
{
    int n = rp->conns, ndone = 0;
    uint64_t slot = rp->size_max > rp->mice_size ? rp->size_max : rp->mice_size;
    struct tconn *cs = calloc((size_t)n, sizeof(*cs));
    struct pollfd *pf = calloc((size_t)n, sizeof(*pf));
    double cpu0, w0, first = 0, last = 0;

    if (!cs || !pf) {
        set_err(res, ENOMEM, "receiver: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct pollfd lp = {.fd = tl_fd, .events = POLLIN};

        cs[i].fd = -1;
        if (poll(&lp, 1, 30000) != 1) {
            set_err(res, ETIMEDOUT, "receiver: tcp accept: timed out");
            goto out;
        }
        cs[i].fd = accept4(tl_fd, NULL, NULL, SOCK_CLOEXEC);
        if (cs[i].fd < 0) {
            set_err(res, errno, "receiver: tcp accept: %s", strerror(errno));
            goto out;
        }
        set_bufs(cs[i].fd, rp);
        cs[i].nbuf = tcp_nbuf(rp, rp->recvs);
        cs[i].base = cs[i].buf = malloc(slot * cs[i].nbuf);
        if (!cs[i].buf) {
            set_err(res, ENOMEM, "receiver: out of memory");
            goto out;
        }
        pf[i].fd = cs[i].fd;
        pf[i].events = POLLIN;
    }
    cpu0 = cpu_now();
    w0 = now_sec();
    int spin = rp->kind == K_LAT && (rp->poll & POLL_RECV);
    double idle_since = now_sec();

    while (ndone < n && !res->status) {
        int k = poll(pf, (nfds_t)n, spin ? 0 : 30000 + (int)(rp->delay_us / 250));

        if (k == 0 && spin && now_sec() - idle_since < 30)
            continue; /* busy polling (--poll-recv): spin, up to the same 30 s */
        idle_since = now_sec();
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            set_err(res, k ? errno : ETIMEDOUT, "receiver: tcp poll: %s",
                    k ? strerror(errno) : "no data for 30 s");
            break;
        }
        for (int i = 0; i < n; i++) {
            struct tconn *c = &cs[i];

            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)) || c->done)
                continue;
            size_t want = rp->kind == K_LAT ? rp->size_max - c->cur_done : slot;

            if (rp->kind != K_LAT) /* each read into the next buffer, like a posted receive */
                c->buf = c->base + (size_t)(c->bi++ % c->nbuf) * slot;
            ssize_t got = read(c->fd, c->buf + (rp->kind == K_LAT ? c->cur_done : 0), want);

            if (got < 0) {
                if (errno == EINTR || errno == EAGAIN)
                    continue;
                set_err(res, errno, "receiver: tcp read: %s", strerror(errno));
                break;
            }
            if (got == 0) {
                c->done = 1;
                pf[i].fd = -1;
                ndone++;
                continue;
            }
            double t = now_sec();

            if (!first)
                first = t;
            last = t;
            if (rp->verify && rp->kind == K_XFER) {
                size_t bad = pattern_check(c->buf, (size_t)got, c->off);

                if (bad != (size_t)got) {
                    res->verify_errors++;
                    set_err(res, EILSEQ,
                            "receiver: DATA ERROR on tcp connection %d at stream "
                            "offset %llu",
                            i, (unsigned long long)(c->off + bad));
                }
            }
            c->off += (uint64_t)got;
            res->bytes += (uint64_t)got;
            res->messages++;
            if (rp->kind == K_LAT) {
                c->cur_done += (uint64_t)got;
                if (c->cur_done == rp->size_max) {
                    if (write_full(c->fd, c->buf, rp->size_max) < 0)
                        set_err(res, errno, "receiver: tcp echo: %s", strerror(errno));
                    c->cur_done = 0;
                }
            }
        }
    }
    res->seconds = last - first;
    res->cpu_sec = cpu_now() - cpu0;
    res->wall_sec = now_sec() - w0;
    if (!res->status)
        ctl_server_report(res);
out:
    for (int i = 0; cs && i < n; i++) {
        if (cs[i].fd >= 0)
            close(cs[i].fd);
        free(cs[i].base);
    }
    free(cs);
    free(pf);
    return res->status ? -1 : 0;
}

static void next_msg(struct tconn *c, const struct run_params *rp, int stop)
{
    c->cur_done = 0;
    c->cur_len = 0;
    if (stop || c->budget == 0)
        return;
    uint64_t len = sg_next(&c->sg);

    if (len > c->slot)
        len = c->slot;
    if (len > c->budget)
        len = c->budget;
    c->buf = c->base + (size_t)(c->bi++ % c->nbuf) * c->slot;
    if (rp->verify)
        pattern_fill(c->buf, len, c->off);
    if ((rp->verify & 2) && c->off == 0)
        c->buf[len / 2] ^= 0x40; /* --inject-error */
    c->cur_len = len;
    c->posted = now_sec();
    if (!c->t_first)
        c->t_first = c->posted;
    if (c->budget != UINT64_MAX)
        c->budget -= len;
}

static int tcp_connect(const char *host, int port, const struct run_params *rp)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    char ps[16];
    int fd;

    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        set_bufs(fd, rp);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static int latency_loop(struct tconn *c, const struct run_params *rp, struct side_result *res)
{
    int warm = rp->lat_iters / 10, total = rp->lat_iters + warm;
    double *lat = calloc((size_t)total, sizeof(double)), sum = 0;
    size_t nl = 0;

    if (!lat)
        return -1;
    memset(c->buf, 0x5a, rp->size_max);
    for (int i = 0; i < total; i++) {
        double t = now_sec();

        if (write_full(c->fd, c->buf, rp->size_max) < 0 ||
            read_full_spin(c->fd, c->buf, rp->size_max, rp->poll & POLL_SEND) < 0) {
            set_err(res, errno, "sender: tcp ping: %s", strerror(errno));
            break;
        }
        if (i >= warm)
            lat[nl++] = (now_sec() - t) * 1e6;
    }
    for (size_t i = 0; i < nl; i++)
        sum += lat[i];
    if (nl) {
        res->lat_mean_us = sum / (double)nl;
        res->lat_p50_us = percentile(lat, nl, 50);
        res->lat_p99_us = percentile(lat, nl, 99);
        res->lat_p999_us = percentile(lat, nl, 99.9);
        res->lat_count = nl;
    }
    free(lat);
    return res->status ? -1 : 0;
}

/* Sender: write messages on every connection until the bytes or the time are used up. */
int tcp_client_run(const struct run_params *rp, const char *host, int data_port,
                   struct side_result *res)
{
    int n = rp->conns, ndone = 0, stop = 0;
    int nele = rp->elephants > 0 ? rp->elephants : n;
    struct tconn *cs = calloc((size_t)n, sizeof(*cs));
    struct pollfd *pf = calloc((size_t)n, sizeof(*pf));
    double t0, cpu0, last_prog = 0;

    if (!cs || !pf) {
        set_err(res, ENOMEM, "sender: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct tconn *c = &cs[i];

        c->cls = rp->elephants > 0 && i >= rp->elephants;
        c->slot = c->cls ? rp->mice_size : rp->size_max;
        c->sg.exp = c->cls ? 0 : rp->size_exp;
        c->sg.mean = c->cls ? rp->mice_size : rp->size_mean;
        c->sg.max = c->slot;
        sg_seed(&c->sg, rp->seed + 7919u * (uint64_t)(i + 1));
        c->budget = rp->bytes == 0 || c->cls || rp->kind == K_LAT
                        ? UINT64_MAX
                        : rp->bytes / (uint64_t)nele + (i == 0 ? rp->bytes % (uint64_t)nele : 0);
        c->nbuf = tcp_nbuf(rp, rp->sends);
        c->base = c->buf = malloc(c->slot * c->nbuf);
        c->fd = tcp_connect(host, data_port, rp);
        if (c->fd < 0 || !c->buf) {
            set_err(res, errno, "sender: tcp connect to %s:%d: %s", host, data_port,
                    strerror(errno));
            goto out;
        }
    }
    if (rp->kind == K_LAT) {
        latency_loop(&cs[0], rp, res);
        shutdown(cs[0].fd, SHUT_WR);
        if (!res->status)
            ctl_client_collect(res, ctl_peer_result);
        goto out;
    }
    t0 = now_sec();
    cpu0 = cpu_now();
    for (int i = 0; i < n; i++) {
        fcntl(cs[i].fd, F_SETFL, O_NONBLOCK);
        pf[i].fd = cs[i].fd;
        pf[i].events = POLLOUT;
        next_msg(&cs[i], rp, 0);
    }
    while (ndone < n && !res->status) {
        double t = now_sec();

        if (rp->bytes == 0 && t - t0 >= rp->seconds)
            stop = 1;
        if (rp->bytes && rp->elephants > 0) {
            int left = 0;

            for (int i = 0; i < rp->elephants; i++)
                left += cs[i].budget != 0 || cs[i].cur_len != 0;
            stop = !left;
        }
        if (t - last_prog > 0.5) {
            uint64_t sent = 0;

            last_prog = t;
            for (int i = 0; i < n; i++)
                sent += cs[i].off;
            progress("  sending (tcp): %.1f s, %.1f MB", t - t0, sent / 1e6);
        }
        for (int i = 0; i < n; i++) {
            struct tconn *c = &cs[i];

            if (!c->done && c->cur_len == 0 && stop) {
                c->done = 1;
                pf[i].fd = -1;
                shutdown(c->fd, SHUT_WR);
                ndone++;
            }
        }
        int k = poll(pf, (nfds_t)n, 100);

        if (k < 0 && errno != EINTR) {
            set_err(res, errno, "sender: tcp poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; k > 0 && i < n; i++) {
            struct tconn *c = &cs[i];

            if (c->done || !(pf[i].revents & (POLLOUT | POLLERR | POLLHUP)))
                continue;
            while (c->cur_len) {
                ssize_t w =
                    send(c->fd, c->buf + c->cur_done, c->cur_len - c->cur_done, MSG_NOSIGNAL);

                if (w < 0) {
                    if (errno != EAGAIN && errno != EINTR)
                        set_err(res, errno, "sender: tcp send: %s", strerror(errno));
                    break;
                }
                c->cur_done += (uint64_t)w;
                c->off += (uint64_t)w;
                if (c->cur_done < c->cur_len)
                    continue;
                c->t_last = now_sec();
                c->msgs++;
                res->messages++;
                res->bytes += c->cur_len;
                if (rp->elephants > 0) {
                    if (c->nlat == c->caplat) {
                        c->caplat = c->caplat ? 2 * c->caplat : 1024;
                        c->lat = realloc(c->lat, c->caplat * sizeof(double));
                    }
                    c->lat[c->nlat++] = (c->t_last - c->posted) * 1e6;
                }
                next_msg(c, rp, stop || (rp->bytes == 0 && c->t_last - t0 >= rp->seconds));
            }
            if (c->cur_len == 0 && c->budget == 0 && !c->done) {
                c->done = 1;
                pf[i].fd = -1;
                shutdown(c->fd, SHUT_WR);
                ndone++;
            }
        }
    }
    progress_end();
    struct flow_view *v = calloc((size_t)n, sizeof(*v));

    for (int i = 0; v && i < n; i++)
        v[i] = (struct flow_view){cs[i].cls,    cs[i].off, cs[i].msgs, cs[i].t_first,
                                  cs[i].t_last, cs[i].lat, cs[i].nlat};
    if (v)
        flows_results(res, v, n, rp->elephants > 0);
    free(v);
    res->cpu_sec = cpu_now() - cpu0;
    res->wall_sec = now_sec() - t0;
    if (!res->status)
        ctl_client_collect(res, ctl_peer_result);
out:
    progress_end();
    /* The connections stay open until the receiver has read everything: close after a
     * blocking drain (the receiver closes first once it saw the end). */
    for (int i = 0; cs && i < n; i++) {
        if (cs[i].fd >= 0) {
            char b[256];
            struct pollfd p = {.fd = cs[i].fd, .events = POLLIN};

            fcntl(cs[i].fd, F_SETFL, 0);
            shutdown(cs[i].fd, SHUT_WR);
            while (poll(&p, 1, 30000) == 1 && read(cs[i].fd, b, sizeof(b)) > 0)
                ;
            close(cs[i].fd);
        }
        free(cs[i].base);
        free(cs[i].lat);
    }
    free(cs);
    free(pf);
    return res->status ? -1 : 0;
}
