/* SPDX-License-Identifier: MIT */
/* blast: the transfer loops over libexs (ES-API): receiver (server) and sender (client). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/mman.h>

#include "blast/blast.h"

#define EVBATCH   64
#define STALL_SEC 30.0 /* no event for this long (plus the emulated delay): give up */

struct econn;

/* One outstanding operation's buffer. */
struct slot {
    struct econn *c;
    unsigned char *buf;
    uint64_t len, off;
    double posted;
};

struct econn {
    int fd, idx, cls; /* cls: 0 elephant, 1 mouse */
    int outstanding, depth, eos, shut, done, closed;
    uint64_t off;    /* stream offset of the next byte sent / expected */
    uint64_t budget; /* bytes still to send (UINT64_MAX: until the time ends) */
    uint64_t msgs;
    struct sizegen sg;
    struct slot *slots;
    double t_first, t_last;
    uint64_t slot_size;
    double *lat; /* mix: per-message send completion times */
    size_t nlat, caplat;
};

/* The receiver's listener lives across runs (its ring size is fixed at creation). */
static int srv_lfd = -1, srv_rcvbuf = -1, srv_port, srv_type = -1;
static exs_qhandle_t srv_q = EXS_QHANDLE_INVALID;
static int srv_q_wait[2]; /* how srv_q waited when it was made: {mode, spin} */
static void get_wait(exs_qhandle_t q, int def[2]);

static const char *ename(int e)
{
    return strerror(e);
}

static void *region_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    return p == MAP_FAILED ? NULL : p;
}

static double stall_limit(const struct run_params *rp)
{
    return STALL_SEC + rp->delay_us / 1e6 * 4;
}

int exs_server_prepare(const struct run_params *rp, int port, int *data_port)
{
    if (srv_q == EXS_QHANDLE_INVALID) {
        srv_q = exs_qcreate(1 << 16);
        if (srv_q == EXS_QHANDLE_INVALID) {
            fprintf(stderr, "blast: exs_qcreate: %s\n", ename(errno));
            return -1;
        }
        get_wait(srv_q, srv_q_wait);
    }
    if (srv_lfd >= 0 && (srv_rcvbuf != rp->rcvbuf || srv_type != rp->type)) {
        exs_close(srv_lfd, EXS_QHANDLE_INVALID, NULL);
        srv_lfd = -1;
    }
    for (int attempt = 0; srv_lfd < 0 && attempt < 2; attempt++) {
        if (attempt)
            port = 0; /* the old port still lingers: take an ephemeral one */
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        int type = rp->type == T_STREAM ? SOCK_STREAM : SOCK_SEQPACKET;

        srv_lfd = exs_socket(AF_INET, type, 0);
        if (srv_lfd < 0) {
            fprintf(stderr, "blast: exs_socket(%s): %s%s\n", type_name(rp->type), ename(errno),
                    errno == EPROTONOSUPPORT ? " (this libexs has no SOCK_STREAM yet; try "
                                               "--type seqpacket)"
                                             : "");
            return -1;
        }
        if (rp->rcvbuf > 0 &&
            exs_setsockopt(srv_lfd, SOL_SOCKET, SO_RCVBUF, &rp->rcvbuf, sizeof(int)) < 0) {
            fprintf(stderr, "blast: SO_RCVBUF %d: %s\n", rp->rcvbuf, ename(errno));
            return -1;
        }
        if (exs_bind(srv_lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
            exs_listen(srv_lfd, BLAST_MAX_CONNS) < 0) {
            fprintf(stderr, "blast: exs listen on port %d: %s\n", port, ename(errno));
            exs_close(srv_lfd, EXS_QHANDLE_INVALID, NULL);
            srv_lfd = -1;
            if (port == 0)
                return -1;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);

        exs_getsockname(srv_lfd, (struct sockaddr *)&ss, &sl);
        srv_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        srv_rcvbuf = rp->rcvbuf;
        srv_type = rp->type;
    }
    int mode = rp->mode;

    if (exs_setsockopt(srv_lfd, SOL_EXS, EXS_SO_XFER_MODE, &mode, sizeof(int)) < 0) {
        fprintf(stderr, "blast: EXS_SO_XFER_MODE %s: %s\n", mode_name(mode), ename(errno));
        return -1;
    }
    *data_port = srv_port;
    return 0;
}

void exs_server_cleanup(void)
{
    if (srv_lfd >= 0)
        exs_close(srv_lfd, EXS_QHANDLE_INVALID, NULL);
    srv_lfd = -1;
    if (srv_q != EXS_QHANDLE_INVALID)
        exs_qdelete(srv_q);
    srv_q = EXS_QHANDLE_INVALID;
}

static void add_stats(int fd, struct side_result *res)
{
    struct exs_sock_stats st;
    socklen_t sl = sizeof(st);

    memset(&st, 0, sizeof(st));
    if (exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, &st, &sl) < 0)
        return;
    res->direct += st.direct_xfers;
    res->indirect += st.indirect_xfers;
    res->switches += st.mode_switches;
    res->adverts += st.adverts_sent + st.adverts_received;
    res->stalls += st.credit_stalls;
    /* Fields of later versions stay 0 when the library fills fewer bytes. */
    res->dtime_us += st.direct_time_us;
    res->itime_us += st.indirect_time_us;
    res->drains += st.drain_requests;
    res->resizes += st.ring_resizes;
    if (st.ring_size > res->ring_size)
        res->ring_size = st.ring_size;
}

/* The library's counters of one socket, for stall reports. */
static void stats_str(int fd, char *b, size_t n)
{
    struct exs_sock_stats st;
    socklen_t sl = sizeof(st);

    memset(&st, 0, sizeof(st));
    exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, &st, &sl);
    snprintf(b, n,
             "sent %llu rcvd %llu direct %llu indirect %llu switches %llu adv_s %llu "
             "adv_r %llu adv_disc %llu stalls %llu direct_us %llu indirect_us %llu drains %llu "
             "ring %llu (resized %llu, refused %llu, fill %llu) srtt_us %llu",
             (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_received,
             (unsigned long long)st.direct_xfers, (unsigned long long)st.indirect_xfers,
             (unsigned long long)st.mode_switches, (unsigned long long)st.adverts_sent,
             (unsigned long long)st.adverts_received, (unsigned long long)st.adverts_discarded,
             (unsigned long long)st.credit_stalls, (unsigned long long)st.direct_time_us,
             (unsigned long long)st.indirect_time_us, (unsigned long long)st.drain_requests,
             (unsigned long long)st.ring_size, (unsigned long long)st.ring_resizes,
             (unsigned long long)st.ring_grow_refused, (unsigned long long)st.ring_fill,
             (unsigned long long)st.srtt_us);
}

/* Close every socket and wait for their CLOSE events (and any straggling operations). */
static void close_all(exs_qhandle_t q, struct econn *cs, int n, int pending_ops)
{
    exs_event_t ev[EVBATCH];
    int want = pending_ops;

    for (int i = 0; i < n; i++) {
        if (cs[i].fd >= 0 && !cs[i].closed && exs_close(cs[i].fd, q, &cs[i]) == 0)
            want++;
        cs[i].closed = 1;
    }
    double t0 = now_sec();

    while (want > 0 && now_sec() - t0 < 10) {
        struct timespec to = {0, 100000000};
        int k = exs_qdequeue(q, ev, EVBATCH, &to);

        if (k > 0)
            want -= k;
    }
}

static int post_recv(struct econn *c, struct slot *s, const struct run_params *rp, exs_qhandle_t q,
                     exs_mhandle_t mh)
{
    int flags = (rp->waitall || rp->kind == K_LAT) && rp->type == T_STREAM ? MSG_WAITALL : 0;

    if (exs_recv(c->fd, s->buf, s->len, flags, q, s, mh) < 0)
        return -1;
    c->outstanding++;
    return 0;
}

/* How the queue of the end `side` (POLL_SEND, POLL_RECV) waits: busy polling, adaptive
 * (--wait-spin: spin, then sleep), notification (--wait-notify) or, with none of them,
 * as the library makes a new queue wait (read off the queue when it was made: the
 * receiver's queue outlives runs, so each run sets it). */
static int set_wait(exs_qhandle_t q, const struct run_params *rp, int side, const int def[2])
{
    int mode = def[0], spin = def[1];

    if (rp->poll & side)
        mode = EXS_WAIT_POLL, spin = 0;
    else if (rp->wait_spin > 0)
        mode = EXS_WAIT_ADAPTIVE, spin = rp->wait_spin;
    else if (rp->wait_spin < 0)
        mode = EXS_WAIT_NOTIFY, spin = 0;
    return exs_qsetwait(q, mode, spin);
}

/* How a queue just made waits: {mode, spin}. */
static void get_wait(exs_qhandle_t q, int def[2])
{
    socklen_t len = sizeof(int);

    def[0] = EXS_WAIT_NOTIFY;
    def[1] = 0;
    if (exs_qgetattr(q, EXS_QATTR_WAIT, &def[0], &len) < 0)
        def[0] = EXS_WAIT_NOTIFY;
    len = sizeof(int);
    if (exs_qgetattr(q, EXS_QATTR_WAIT_SPIN, &def[1], &len) < 0)
        def[1] = 0;
}

/* Receiver: accept conns, keep recvs receives outstanding on each, verify, until end of stream
 * everywhere (K_XFER); or echo every message back (K_LAT). */
int exs_server_run(const struct run_params *rp, struct side_result *res)
{
    exs_qhandle_t q = srv_q;
    int n = rp->conns, accepted = 0, ndone = 0, ops = 0;
    uint64_t slot = rp->size_max > rp->mice_size ? rp->size_max : rp->mice_size;
    int depth = rp->kind == K_LAT ? 1 : rp->recvs;
    int nbuf = rp->onebuf ? 1 : depth; /* --one-buffer: every receive into the same one */
    struct econn *cs = calloc((size_t)n, sizeof(*cs));
    size_t rlen = (size_t)n * (size_t)nbuf * slot;
    unsigned char *region = region_alloc(rlen);
    exs_mhandle_t mh = EXS_MHANDLE_INVALID;
    exs_event_t ev[EVBATCH];
    double cpu0 = 0, w0 = 0, last_ev;

    /* The queue outlives runs: each run sets its wait mode (--poll-recv busy-polls). */
    if (set_wait(q, rp, POLL_RECV, srv_q_wait) < 0) {
        set_err(res, errno, "receiver: exs_qsetwait: %s", ename(errno));
        goto out;
    }
    if (!cs || !region) {
        set_err(res, ENOMEM, "receiver: cannot allocate %zu bytes of buffers", rlen);
        goto out;
    }
    mh = exs_mregister(region, rlen, 0);
    if (mh == EXS_MHANDLE_INVALID) {
        set_err(res, errno, "receiver: exs_mregister(%zu bytes): %s", rlen, ename(errno));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        cs[i].fd = -1;
        cs[i].idx = i;
        cs[i].slots = calloc((size_t)depth, sizeof(struct slot));
        for (int j = 0; j < depth; j++) {
            struct slot *s = &cs[i].slots[j];

            s->c = &cs[i];
            s->buf = region + ((size_t)i * (size_t)nbuf + (size_t)(j % nbuf)) * slot;
            s->len = rp->kind == K_LAT ? rp->size_max : slot;
        }
        if (exs_accept(srv_lfd, q, NULL) < 0) {
            set_err(res, errno, "receiver: exs_accept: %s", ename(errno));
            goto out;
        }
        ops++;
    }
    last_ev = now_sec();
    while (ndone < n && !res->status) {
        struct timespec to = {0, 200000000};
        int k = exs_qdequeue(q, ev, EVBATCH, &to);

        if (k < 0) {
            set_err(res, errno, "receiver: exs_qdequeue: %s", ename(errno));
            break;
        }
        if (k == 0 && now_sec() - last_ev > stall_limit(rp) - 5) { /* before the sender */
            set_err(res, ETIMEDOUT,
                    "receiver: no progress for %.0f s (%d of %d connections "
                    "accepted, %d finished)",
                    now_sec() - last_ev, accepted, n, ndone);
            for (int i = 0; i < accepted; i++) {
                char sb[512];

                stats_str(cs[i].fd, sb, sizeof(sb));
                fprintf(stderr,
                        "blast: receiver stalled: conn %d: %llu bytes received, %d "
                        "receives outstanding, eos %d; EXS_SO_STATS %s\n",
                        i, (unsigned long long)cs[i].off, cs[i].outstanding, cs[i].eos, sb);
            }
            break;
        }
        if (k > 0)
            last_ev = now_sec(); /* the batch's time: its events' own (one clock read) */
        for (int e = 0; e < k; e++) {
            exs_event_t *v = &ev[e];

            ops--;
            if (v->exs_evt_type == EXS_EVT_ACCEPT) {
                if (v->exs_evt_errno) {
                    set_err(res, v->exs_evt_errno, "receiver: accept event: %s",
                            ename(v->exs_evt_errno));
                    continue;
                }
                struct econn *c = &cs[accepted++];

                c->fd = v->exs_evt_u.exs_evt_accept.exs_evt_newfd;
                for (int j = 0; j < depth && !res->status; j++) {
                    if (post_recv(c, &c->slots[j], rp, q, mh) < 0)
                        set_err(res, errno, "receiver: exs_recv: %s", ename(errno));
                    else
                        ops++;
                }
                if (accepted == n) {
                    cpu0 = cpu_now();
                    w0 = now_sec();
                }
                continue;
            }
            struct slot *s = v->exs_evt_ahandle;
            struct econn *c = s->c;
            ssize_t got = v->exs_evt_u.exs_evt_xfer.exs_evt_result;

            if (v->exs_evt_type == EXS_EVT_SEND) { /* latency echo done: receive again */
                c->outstanding--;
                if (v->exs_evt_errno) {
                    set_err(res, v->exs_evt_errno, "receiver: echo send: %s",
                            ename(v->exs_evt_errno));
                } else if (post_recv(c, s, rp, q, mh) < 0) {
                    set_err(res, errno, "receiver: exs_recv: %s", ename(errno));
                } else {
                    ops++;
                }
                continue;
            }
            if (v->exs_evt_type != EXS_EVT_RECV) {
                set_err(res, EPROTO, "receiver: unexpected event type %d", v->exs_evt_type);
                continue;
            }
            c->outstanding--;
            if (v->exs_evt_errno) {
                set_err(res, v->exs_evt_errno, "receiver: connection %d: receive failed: %s",
                        c->idx, ename(v->exs_evt_errno));
                continue;
            }
            if (got == 0) {
                c->eos = 1;
            } else {
                double t = last_ev;

                if (!res->messages && !res->bytes)
                    res->seconds = -t; /* first data */
                c->t_last = t;
                if (v->exs_evt_u.exs_evt_xfer.exs_evt_flags & MSG_TRUNC)
                    set_err(res, EMSGSIZE,
                            "receiver: connection %d: message truncated at "
                            "%zd bytes",
                            c->idx, got);
                if (rp->verify && rp->kind == K_XFER) {
                    size_t bad = pattern_check(s->buf, (size_t)got, c->off);

                    if (bad != (size_t)got) {
                        res->verify_errors++;
                        set_err(res, EILSEQ,
                                "receiver: DATA ERROR on connection %d at stream "
                                "offset %llu (byte %zu of a %zd-byte receive)",
                                c->idx, (unsigned long long)(c->off + bad), bad, got);
                    }
                }
                c->off += (uint64_t)got;
                c->msgs++;
                res->bytes += (uint64_t)got;
                res->messages++;
                if (rp->kind == K_LAT) {
                    if (exs_send(c->fd, s->buf, (size_t)got, 0, q, s, mh) < 0) {
                        set_err(res, errno, "receiver: echo exs_send: %s", ename(errno));
                    } else {
                        c->outstanding++;
                        ops++;
                    }
                    continue;
                }
            }
            if (!c->eos) {
                if (post_recv(c, s, rp, q, mh) < 0)
                    set_err(res, errno, "receiver: exs_recv: %s", ename(errno));
                else
                    ops++;
            }
            if (c->eos && c->outstanding == 0 && !c->done) {
                c->done = 1;
                ndone++;
            }
        }
    }
    if (accepted == n) {
        double t_last = 0;

        for (int i = 0; i < n; i++)
            if (cs[i].t_last > t_last)
                t_last = cs[i].t_last;
        res->seconds = res->seconds < 0 ? t_last + res->seconds : 0;
        res->cpu_sec = cpu_now() - cpu0;
        res->wall_sec = now_sec() - w0;
    }
    for (int i = 0; i < accepted; i++)
        add_stats(cs[i].fd, res);
    if (!res->status)
        ctl_server_report(res); /* the sender's go-ahead: now closing cannot hurt it */
out:
    if (cs) {
        close_all(q, cs, accepted, res->status ? ops : 0);
        for (int i = 0; i < n; i++)
            free(cs[i].slots);
    }
    if (mh != EXS_MHANDLE_INVALID && exs_mderegister(mh) < 0)
        fprintf(stderr, "blast: receiver: exs_mderegister: %s\n", ename(errno));
    if (region)
        munmap(region, rlen);
    free(cs);
    return res->status ? -1 : 0;
}

static int resolve(const char *host, int port, struct sockaddr_in *sin)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;

    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return -1;
    *sin = *(struct sockaddr_in *)ai->ai_addr;
    sin->sin_port = htons((uint16_t)port);
    freeaddrinfo(ai);
    return 0;
}

/* Post the next send of c into slot s, if it has anything left to send. (Inline in both
 * callers: a send's own bookkeeping no call of its own.) */
static inline __attribute__((always_inline)) int post_send(struct econn *c, struct slot *s,
                                                           const struct run_params *rp,
                                                           exs_qhandle_t q, exs_mhandle_t mh,
                                                           int stop)
{
    if (stop || c->budget == 0)
        return 0;
    uint64_t len = sg_next(&c->sg);

    if (len > c->slot_size)
        len = c->slot_size;
    if (len > c->budget)
        len = c->budget;
    if (rp->verify)
        pattern_fill(s->buf, len, c->off);
    if ((rp->verify & 2) && c->off == 0)
        s->buf[len / 2] ^= 0x40; /* --inject-error: the receiver must catch this */
    s->len = len;
    s->off = c->off;
    /* the posting time: the run's start (the first send) and a mixed run's per-message
     * latency read it; no clock read per send otherwise (ucx_perftest reads one per
     * message, as the completion's below does) */
    s->posted = c->t_first == 0 || rp->elephants > 0 ? now_sec() : 0;
    if (exs_send(c->fd, s->buf, len, 0, q, s, mh) < 0)
        return -1;
    if (c->t_first == 0)
        c->t_first = s->posted;
    c->off += len;
    if (c->budget != UINT64_MAX)
        c->budget -= len;
    c->outstanding++;
    return 1;
}

/* Sender: connect conns, keep sends outstanding per connection until the bytes or the time are
 * used up, shut down, and wait for the receiver's verdict on the control connection. */
int exs_client_run(const struct run_params *rp, const char *host, int data_port,
                   struct side_result *res)
{
    exs_qhandle_t q;
    int cl_wait[2];
    int n = rp->conns, nconn = 0, ndone = 0, ops = 0, stop = 0;
    struct econn *cs = calloc((size_t)n, sizeof(*cs));
    exs_mhandle_t mh = EXS_MHANDLE_INVALID;
    unsigned char *region = NULL;
    size_t rlen = 0;
    exs_event_t ev[EVBATCH];
    struct sockaddr_in sin;
    int type = rp->type == T_STREAM ? SOCK_STREAM : SOCK_SEQPACKET;
    int nele = rp->elephants > 0 ? rp->elephants : n;
    double t0 = 0, cpu0 = 0, last_ev, last_prog = 0;
    double *lat = NULL;
    size_t nlat = 0;
    int lat_i = 0, lat_warm = rp->lat_iters / 10, lat_pending = 0;
    double lat_t = 0;

    q = exs_qcreate(n * 1100 + 64 < (1 << 20) ? n * 1100 + 64 : (1 << 20));
    if (!cs || q == EXS_QHANDLE_INVALID) {
        set_err(res, errno ? errno : ENOMEM, "sender: exs_qcreate: %s", ename(errno));
        free(cs);
        return -1;
    }
    get_wait(q, cl_wait);
    if (set_wait(q, rp, POLL_SEND, cl_wait) < 0) {
        set_err(res, errno, "sender: exs_qsetwait: %s", ename(errno));
        exs_qdelete(q);
        free(cs);
        return -1;
    }
    if (resolve(host, data_port, &sin) < 0) {
        set_err(res, EHOSTUNREACH, "sender: cannot resolve %s", host);
        goto out;
    }
    /* Buffers: one region, each connection's slots in it. */
    for (int i = 0; i < n; i++) {
        struct econn *c = &cs[i];

        c->fd = -1;
        c->idx = i;
        c->cls = rp->elephants > 0 && i >= rp->elephants;
        c->depth = rp->kind == K_LAT ? 1 : (c->cls ? rp->mice_sends : rp->sends);
        c->slot_size = c->cls ? rp->mice_size : rp->size_max;
        /* (--one-buffer: every send of the connection from the same one; the ping-pong
         * has its own two) */
        rlen += (size_t)(rp->kind == K_LAT ? 2 * c->depth
                         : rp->onebuf      ? 1
                                           : c->depth) *
                c->slot_size;
        c->sg.exp = c->cls ? 0 : rp->size_exp;
        c->sg.mean = c->cls ? rp->mice_size : rp->size_mean;
        c->sg.max = c->slot_size;
        sg_seed(&c->sg, rp->seed + 7919u * (uint64_t)(i + 1));
        if (rp->kind == K_LAT)
            c->budget = UINT64_MAX;
        else if (rp->bytes == 0 || c->cls)
            c->budget = UINT64_MAX; /* time limited; mice run as long as the elephants */
        else
            c->budget = rp->bytes / (uint64_t)nele + (i == 0 ? rp->bytes % (uint64_t)nele : 0);
    }
    region = region_alloc(rlen);
    if (!region) {
        set_err(res, ENOMEM, "sender: cannot allocate %zu bytes of buffers", rlen);
        goto out;
    }
    mh = exs_mregister(region, rlen, 0);
    if (mh == EXS_MHANDLE_INVALID) {
        set_err(res, errno, "sender: exs_mregister(%zu bytes): %s", rlen, ename(errno));
        goto out;
    }
    size_t at = 0;

    for (int i = 0; i < n; i++) {
        struct econn *c = &cs[i];
        int mode = rp->mode;
        int nslots = c->depth * (rp->kind == K_LAT ? 2 : 1);

        c->slots = calloc((size_t)nslots, sizeof(struct slot));
        for (int j = 0; j < nslots; j++) {
            c->slots[j].c = c;
            c->slots[j].buf = region + at;
            c->slots[j].len = c->slot_size;
            if (rp->kind == K_LAT || !rp->onebuf || j == nslots - 1)
                at += c->slot_size;
        }
        c->fd = exs_socket(AF_INET, type, 0);
        if (c->fd < 0) {
            set_err(res, errno, "sender: exs_socket(%s): %s%s", type_name(rp->type), ename(errno),
                    errno == EPROTONOSUPPORT ? " (this libexs has no "
                                               "SOCK_STREAM yet; try --type seqpacket)"
                                             : "");
            goto out;
        }
        if (exs_setsockopt(c->fd, SOL_EXS, EXS_SO_XFER_MODE, &mode, sizeof(int)) < 0 ||
            (rp->rcvbuf > 0 &&
             exs_setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rp->rcvbuf, sizeof(int)) < 0)) {
            set_err(res, errno, "sender: exs_setsockopt: %s", ename(errno));
            goto out;
        }
        if (exs_connect(c->fd, (struct sockaddr *)&sin, sizeof(sin), q, c) < 0) {
            set_err(res, errno, "sender: exs_connect: %s", ename(errno));
            goto out;
        }
        ops++;
    }
    if (rp->kind == K_LAT) {
        lat = calloc((size_t)rp->lat_iters + 1, sizeof(double));
        if (!lat) {
            set_err(res, ENOMEM, "sender: out of memory");
            goto out;
        }
    }
    last_ev = now_sec();
    while (ndone < n && !res->status) {
        struct timespec to = {0, 100000000};
        int k = exs_qdequeue(q, ev, EVBATCH, &to);
        /* A ping-pong reads the clock once per round trip (its end is the next one's
         * start, as ucx_perftest's): no read here when events came, where its time is not
         * used (last_ev is then the round trip's end). */
        double t = k > 0 && rp->kind == K_LAT ? 0 : now_sec();

        if (k < 0) {
            set_err(res, errno, "sender: exs_qdequeue: %s", ename(errno));
            break;
        }
        if (k == 0 && t - last_ev > stall_limit(rp)) {
            set_err(res, ETIMEDOUT,
                    "sender: no progress for %.0f s (%d of %d connected, %d "
                    "finished)",
                    t - last_ev, nconn, n, ndone);
            for (int i = 0; i < n; i++) {
                char sb[512];

                stats_str(cs[i].fd, sb, sizeof(sb));
                fprintf(stderr,
                        "blast: sender stalled: conn %d: %llu bytes posted, %llu "
                        "completed, %d sends outstanding, shut %d; EXS_SO_STATS %s\n",
                        i, (unsigned long long)cs[i].off, (unsigned long long)res->bytes,
                        cs[i].outstanding, cs[i].shut, sb);
            }
            break;
        }
        if (k > 0 && t > 0)
            last_ev = t;
        if (t0 > 0 && rp->kind == K_XFER && !stop) {
            if (rp->bytes == 0 && t - t0 >= rp->seconds)
                stop = 1;
            if (rp->bytes && rp->elephants > 0) { /* mice stop when every elephant has sent */
                int left = 0;

                for (int i = 0; i < rp->elephants; i++)
                    left += cs[i].budget != 0;
                stop = !left;
            }
            if (t - last_prog > 0.5) {
                last_prog = t;
                uint64_t sent = 0;

                for (int i = 0; i < n; i++)
                    sent += cs[i].off;
                progress("  sending: %.1f s, %.1f MB, %.3f Gbit/s", t - t0, sent / 1e6,
                         sent * 8 / 1e9 / (t - t0));
            }
        }
        for (int e = 0; e < k; e++) {
            exs_event_t *v = &ev[e];

            ops--;
            if (v->exs_evt_type == EXS_EVT_CONNECT) {
                struct econn *c = v->exs_evt_ahandle;

                if (v->exs_evt_errno) {
                    set_err(res, v->exs_evt_errno, "sender: connect to %s:%d: %s", host, data_port,
                            ename(v->exs_evt_errno));
                    continue;
                }
                (void)c;
                if (++nconn < n)
                    continue;
                /* Everyone connected: start. */
                t0 = now_sec();
                cpu0 = cpu_now();
                for (int i = 0; i < n && !res->status; i++) {
                    struct econn *cc = &cs[i];

                    if (rp->kind == K_LAT)
                        break;
                    for (int j = 0; j < cc->depth; j++) {
                        int r = post_send(cc, &cc->slots[j], rp, q, mh, 0);

                        if (r < 0) {
                            set_err(res, errno, "sender: exs_send: %s", ename(errno));
                            break;
                        }
                        ops += r;
                    }
                }
                if (rp->kind == K_LAT) {
                    struct econn *cc = &cs[0];
                    struct slot *sr = &cc->slots[1], *ss = &cc->slots[0];

                    sr->len = ss->len = rp->size_max;
                    memset(ss->buf, 0x5a, ss->len);
                    lat_t = now_sec();
                    /* the ping first, then the receive of its echo (as rstream and
                     * ucx_perftest do): the receive is posted while the ping travels */
                    if (exs_send(cc->fd, ss->buf, ss->len, 0, q, ss, mh) < 0 ||
                        post_recv(cc, sr, rp, q, mh) < 0) {
                        set_err(res, errno, "sender: ping: %s", ename(errno));
                        continue;
                    }
                    cc->outstanding++;
                    ops += 2;
                    lat_pending = 2;
                }
                continue;
            }
            struct econn *c;

            if (v->exs_evt_type == EXS_EVT_SHUTDOWN) {
                c = v->exs_evt_ahandle;
                if (v->exs_evt_errno)
                    set_err(res, v->exs_evt_errno, "sender: shutdown: %s", ename(v->exs_evt_errno));
                c->done = 1;
                ndone++;
                continue;
            }
            struct slot *s = v->exs_evt_ahandle;

            c = s->c;
            c->outstanding--;
            if (v->exs_evt_errno) {
                set_err(res, v->exs_evt_errno, "sender: connection %d: %s failed: %s", c->idx,
                        v->exs_evt_type == EXS_EVT_SEND ? "send" : "receive",
                        ename(v->exs_evt_errno));
                continue;
            }
            ssize_t got = v->exs_evt_u.exs_evt_xfer.exs_evt_result;

            if (rp->kind == K_LAT) {
                if (v->exs_evt_type == EXS_EVT_RECV && (uint64_t)got != rp->size_max) {
                    set_err(res, EPROTO, "sender: echo of %zd bytes, expected %llu", got,
                            (unsigned long long)rp->size_max);
                    continue;
                }
                if (--lat_pending > 0)
                    continue;
                double end = now_sec(), rtt = end - lat_t;

                last_ev = end;
                if (lat_i >= lat_warm)
                    lat[nlat++] = rtt * 1e6;
                if (++lat_i < rp->lat_iters + lat_warm) {
                    struct slot *sr = &c->slots[1], *ss = &c->slots[0];

                    lat_t = end;
                    /* the ping first, then the receive of its echo (as rstream and
                     * ucx_perftest do): the receive is posted while the ping travels */
                    if (exs_send(c->fd, ss->buf, ss->len, 0, q, ss, mh) < 0 ||
                        post_recv(c, sr, rp, q, mh) < 0) {
                        set_err(res, errno, "sender: ping: %s", ename(errno));
                        continue;
                    }
                    c->outstanding++;
                    ops += 2;
                    lat_pending = 2;
                    continue;
                }
                c->budget = 0; /* fall through to the shutdown below */
            } else {
                /* the completion's time: the clock read at this batch's dequeue (t, one
                 * read per exs_qdequeue; ucx_perftest reads one per message), a mixed
                 * run's per-message latency its own read */
                double tt = rp->elephants > 0 ? now_sec() : t;

                if ((uint64_t)got != s->len) {
                    set_err(res, EPROTO, "sender: send of %llu bytes completed with %zd",
                            (unsigned long long)s->len, got);
                    continue;
                }
                c->t_last = tt;
                c->msgs++;
                res->messages++;
                res->bytes += s->len;
                if (rp->elephants > 0) {
                    if (c->nlat == c->caplat) {
                        c->caplat = c->caplat ? 2 * c->caplat : 1024;
                        c->lat = realloc(c->lat, c->caplat * sizeof(double));
                    }
                    c->lat[c->nlat++] = (tt - s->posted) * 1e6;
                }
                int r = post_send(c, s, rp, q, mh, stop);

                if (r < 0) {
                    set_err(res, errno, "sender: exs_send: %s", ename(errno));
                    continue;
                }
                ops += r;
            }
            if (c->outstanding == 0 && !c->shut) {
                c->shut = 1;
                if (exs_shutdown(c->fd, SHUT_WR, q, c) < 0)
                    set_err(res, errno, "sender: exs_shutdown: %s", ename(errno));
                else
                    ops++;
            }
        }
        /* When the time ends, connections with nothing outstanding shut down now. */
        for (int i = 0; stop && i < n && !res->status; i++) {
            if (cs[i].outstanding == 0 && !cs[i].shut && nconn == n) {
                cs[i].shut = 1;
                if (exs_shutdown(cs[i].fd, SHUT_WR, q, &cs[i]) < 0)
                    set_err(res, errno, "sender: exs_shutdown: %s", ename(errno));
                else
                    ops++;
            }
        }
    }
    progress_end();
    if (!res->status) {
        struct flow_view *v = calloc((size_t)n, sizeof(*v));

        for (int i = 0; v && i < n; i++)
            v[i] = (struct flow_view){cs[i].cls,    cs[i].off, cs[i].msgs, cs[i].t_first,
                                      cs[i].t_last, cs[i].lat, cs[i].nlat};
        if (v)
            flows_results(res, v, n, rp->elephants > 0);
        free(v);
        res->cpu_sec = cpu_now() - cpu0;
        res->wall_sec = now_sec() - t0;
        for (int i = 0; i < n; i++)
            add_stats(cs[i].fd, res);
        if (rp->kind == K_LAT && nlat) {
            double sum = 0;

            for (size_t i = 0; i < nlat; i++)
                sum += lat[i];
            res->lat_mean_us = sum / (double)nlat;
            res->lat_p50_us = percentile(lat, nlat, 50);
            res->lat_p99_us = percentile(lat, nlat, 99);
            res->lat_p999_us = percentile(lat, nlat, 99.9);
            res->lat_count = nlat;
        }
    }
    if (!res->status)
        ctl_client_collect(res, ctl_peer_result); /* the receiver has everything: close */
out:
    progress_end();
    close_all(q, cs, n, res->status ? ops : 0);
    for (int i = 0; i < n; i++) {
        free(cs[i].slots);
        free(cs[i].lat);
    }
    if (mh != EXS_MHANDLE_INVALID && exs_mderegister(mh) < 0)
        fprintf(stderr, "blast: sender: exs_mderegister: %s\n", ename(errno));
    if (region)
        munmap(region, rlen);
    if (exs_qdelete(q) < 0 && !res->status)
        set_err(res, errno, "sender: exs_qdelete: %s", ename(errno));
    free(lat);
    free(cs);
    return res->status ? -1 : 0;
}
