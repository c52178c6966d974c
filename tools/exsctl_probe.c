/* SPDX-License-Identifier: MIT */
/* exsctl serve / ping / perf (X-RDMA's XR-Ping and XR-Perf): probes over the public ES-API. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <time.h>

#include "tools/exsctl_probe.h"

/* ---- the probe protocol: SOCK_SEQPACKET messages, each starting with this header ---- */

#define PROBE_MAGIC   0x58525042u /* "XRPB" */
#define PROBE_VERSION 1
#define PROBE_MSG_MAX (1u << 20) /* largest message the server takes whole */
#define PROBE_HDR     40         /* bytes of the header on the wire */

enum { PK_PING = 1, PK_PONG, PK_DATA, PK_END, PK_REPORT };

/* Host-order view of a header; on the wire every field is big-endian, in this order. */
struct probe_hdr {
    uint32_t magic;
    uint16_t kind, version;
    uint32_t seq, len; /* len: the whole message, header included */
    uint64_t t_ns;     /* PING/PONG: the pinger's clock, echoed; unused otherwise */
    uint64_t a, b;     /* END: bytes and messages sent; REPORT: bytes and messages received */
};

static void hdr_put(unsigned char *p, const struct probe_hdr *h)
{
    uint32_t w32;
    uint16_t w16;
    uint64_t w64;

    w32 = htobe32(h->magic), memcpy(p, &w32, 4);
    w16 = htobe16(h->kind), memcpy(p + 4, &w16, 2);
    w16 = htobe16(h->version), memcpy(p + 6, &w16, 2);
    w32 = htobe32(h->seq), memcpy(p + 8, &w32, 4);
    w32 = htobe32(h->len), memcpy(p + 12, &w32, 4);
    w64 = htobe64(h->t_ns), memcpy(p + 16, &w64, 8);
    w64 = htobe64(h->a), memcpy(p + 24, &w64, 8);
    w64 = htobe64(h->b), memcpy(p + 32, &w64, 8);
}

/* Parse and check a received message of `n` bytes (hostile until checked): 0 or -EPROTO. */
static int hdr_get(const unsigned char *p, size_t n, int trunc, struct probe_hdr *h)
{
    uint32_t w32;
    uint16_t w16;
    uint64_t w64;

    if (n < PROBE_HDR || trunc)
        return -EPROTO;
    memcpy(&w32, p, 4), h->magic = be32toh(w32);
    memcpy(&w16, p + 4, 2), h->kind = be16toh(w16);
    memcpy(&w16, p + 6, 2), h->version = be16toh(w16);
    memcpy(&w32, p + 8, 4), h->seq = be32toh(w32);
    memcpy(&w32, p + 12, 4), h->len = be32toh(w32);
    memcpy(&w64, p + 16, 8), h->t_ns = be64toh(w64);
    memcpy(&w64, p + 24, 8), h->a = be64toh(w64);
    memcpy(&w64, p + 32, 8), h->b = be64toh(w64);
    if (h->magic != PROBE_MAGIC || h->version != PROBE_VERSION || h->len != n ||
        h->kind < PK_PING || h->kind > PK_REPORT)
        return -EPROTO;
    return 0;
}

/* ---- helpers ---- */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct timespec ts_of(double s)
{
    struct timespec ts;

    if (s < 0)
        s = 0;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_nsec = 999999999L;
    return ts;
}

static const char *provider_name(void)
{
    const char *p = getenv("EXS_PROVIDER");

    return p && *p ? p : "default";
}

/* A JSON string literal of s (quotes, backslashes and control characters escaped). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* json_str of s, or null where s is empty. */
static void json_str_or_null(FILE *f, const char *s)
{
    if (s && *s)
        json_str(f, s);
    else
        fputs("null", f);
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* A byte count with an optional binary suffix K or M, in [lo, hi]. */
static int parse_bytes(const char *s, double lo, double hi, double *out)
{
    char b[32];
    size_t n = strlen(s);
    double mul = 1;

    if (n == 0 || n >= sizeof(b))
        return -1;
    memcpy(b, s, n + 1);
    if (b[n - 1] == 'K' || b[n - 1] == 'k')
        mul = 1024, b[n - 1] = 0;
    else if (b[n - 1] == 'M' || b[n - 1] == 'm')
        mul = 1024 * 1024, b[n - 1] = 0;
    if (parse_num(b, 0, hi, out) < 0)
        return -1;
    *out *= mul;
    return *out < lo || *out > hi || *out != (double)(uint64_t)*out ? -1 : 0;
}

static int bad_arg(const char *cmd, const char *opt, const char *val)
{
    fprintf(stderr, "exsctl %s: invalid value for %s: '%s' (exsctl help)\n", cmd, opt, val);
    return 2;
}

/* "HOST", "HOST:PORT", "[V6]:PORT" into a socket address; 0, or -1 with a message in err. */
static int resolve(const char *spec, int defport, struct sockaddr_storage *ss, socklen_t *len,
                   char *err, size_t errlen)
{
    char host[256], port[16];
    const char *colon;
    struct addrinfo hints, *ai = NULL;
    int rc;

    snprintf(port, sizeof(port), "%d", defport);
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');

        if (!close || (size_t)(close - spec - 1) >= sizeof(host)) {
            snprintf(err, errlen, "bad address '%s'", spec);
            return -1;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = 0;
        colon = close[1] == ':' ? close + 1 : NULL;
        if (close[1] && !colon) {
            snprintf(err, errlen, "bad address '%s'", spec);
            return -1;
        }
    } else {
        colon = strrchr(spec, ':');
        if (colon && strchr(spec, ':') != colon)
            colon = NULL; /* a bare IPv6 address */
        size_t hl = colon ? (size_t)(colon - spec) : strlen(spec);

        if (hl == 0 || hl >= sizeof(host)) {
            snprintf(err, errlen, "bad address '%s'", spec);
            return -1;
        }
        memcpy(host, spec, hl);
        host[hl] = 0;
    }
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);

        if (!colon[1] || *end || p < 1 || p > 65535) {
            snprintf(err, errlen, "bad port in '%s'", spec);
            return -1;
        }
        snprintf(port, sizeof(port), "%ld", p);
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, errlen, "unknown host '%s': %s", host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        if (ai)
            freeaddrinfo(ai);
        return -1;
    }
    /* IPv4 first: serve listens on 0.0.0.0 by default, and "localhost" may list ::1 first. */
    const struct addrinfo *use = ai;

    for (const struct addrinfo *a = ai; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            use = a;
            break;
        }
    memcpy(ss, use->ai_addr, use->ai_addrlen);
    *len = use->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

static void addr_str(const struct sockaddr_storage *ss, char *b, size_t n)
{
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;

    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)ss;

        inet_ntop(AF_INET, &s->sin_addr, h, sizeof(h));
        port = ntohs(s->sin_port);
        snprintf(b, n, "%s:%d", h, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;

        inet_ntop(AF_INET6, &s->sin6_addr, h, sizeof(h));
        port = ntohs(s->sin6_port);
        snprintf(b, n, "[%s]:%d", h, port);
    } else {
        snprintf(b, n, "?");
    }
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pctl(const double *v, int n, double p)
{
    int k;

    if (n <= 0)
        return 0;
    k = (int)(p / 100.0 * n + 0.999999);
    k = k < 1 ? 1 : k > n ? n : k;
    return v[k - 1];
}

static volatile sig_atomic_t probe_stop;

static void on_signal(int sig)
{
    probe_stop = sig;
}

static int init_lib(const char *cmd)
{
    if (exs_init(EXS_VERSION) != EXS_VERSION) {
        fprintf(stderr, "exsctl %s: exs_init: %s\n", cmd, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- serve ---- */

#define SRV_RECVS 8 /* receives kept posted per client */

enum { SOP_ACCEPT = 1, SOP_BUF, SOP_REPORT, SOP_CLOSE, SOP_REJECT };

struct sclient;
struct sop {
    int kind;
    int idx;
    struct sclient *c;
};

struct sclient {
    int fd, closing;
    char name[64];
    unsigned char *buf[SRV_RECVS];
    exs_mhandle_t mh[SRV_RECVS];
    struct sop op[SRV_RECVS];
    unsigned char rep[PROBE_HDR];
    exs_mhandle_t rep_mh;
    struct sop rep_op, close_op;
    int rep_busy;
    uint64_t pings, data_bytes, data_msgs, ends;
    double t0;
    struct sclient *prev, *next;
};

struct server {
    exs_qhandle_t q;
    int lfd, json, accept_posted, clients, max_clients, once;
    double resume; /* no accept posted before this time (after a failed accept) */
    long served;
    struct sop accept_op, reject_op;
    struct sclient *all;
};

static void srv_client_free(struct server *s, struct sclient *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    for (int i = 0; i < SRV_RECVS; i++) {
        if (c->mh[i] != EXS_MHANDLE_INVALID)
            exs_mderegister(c->mh[i]);
        free(c->buf[i]);
    }
    if (c->rep_mh != EXS_MHANDLE_INVALID)
        exs_mderegister(c->rep_mh);
    free(c);
    s->clients--;
}

static void srv_log_done(struct server *s, struct sclient *c, const char *why)
{
    if (s->json) {
        printf("{\"event\": \"client_done\", \"peer\": ");
        json_str(stdout, c->name);
        printf(", \"pings\": %llu, \"data_bytes\": %llu, \"data_messages\": %llu, "
               "\"seconds\": %.3f, \"end\": ",
               (unsigned long long)c->pings, (unsigned long long)c->data_bytes,
               (unsigned long long)c->data_msgs, now_s() - c->t0);
        json_str(stdout, why);
        printf("}\n");
    } else {
        printf("client %s: %llu pings, %llu data bytes in %llu messages, %.3f s: %s\n", c->name,
               (unsigned long long)c->pings, (unsigned long long)c->data_bytes,
               (unsigned long long)c->data_msgs, now_s() - c->t0, why);
    }
    fflush(stdout);
}

/* Close a client once; its events end with EXS_EVT_CLOSE, which frees it. */
static void srv_close(struct server *s, struct sclient *c, const char *why)
{
    if (c->closing)
        return;
    c->closing = 1;
    srv_log_done(s, c, why);
    if (exs_close(c->fd, s->q, &c->close_op) < 0) {
        /* Its operations may still report on the queue: keep it (freed at exit). */
        fprintf(stderr, "exsctl serve: exs_close(%s): %s; closing synchronously\n", c->name,
                strerror(errno));
        exs_close(c->fd, EXS_QHANDLE_INVALID, NULL);
    }
}

static int srv_post_recv(struct server *s, struct sclient *c, int i)
{
    if (exs_recv(c->fd, c->buf[i], PROBE_MSG_MAX, 0, s->q, &c->op[i], c->mh[i]) < 0) {
        char why[96];

        snprintf(why, sizeof(why), "exs_recv: %s", strerror(errno));
        srv_close(s, c, why);
        return -1;
    }
    return 0;
}

static void srv_accepted(struct server *s, const exs_event_t *e)
{
    const exs_evt_accept_t *a = &e->exs_evt_u.exs_evt_accept;
    struct sclient *c;

    s->accept_posted = 0;
    if (e->exs_evt_errno) {
        /* Out of descriptors or memory, say: pause accepting rather than spin on it. */
        fprintf(stderr, "exsctl serve: accept: %s; accepting paused for 100 ms\n",
                strerror(e->exs_evt_errno));
        s->resume = now_s() + 0.1;
        return;
    }
    if (s->clients >= s->max_clients || !(c = calloc(1, sizeof(*c)))) {
        fprintf(stderr, "exsctl serve: %s; connection refused\n",
                s->clients >= s->max_clients ? "too many clients" : "out of memory");
        exs_close(a->exs_evt_newfd, s->q, &s->reject_op);
        return;
    }
    c->fd = a->exs_evt_newfd;
    c->t0 = now_s();
    c->close_op = (struct sop){SOP_CLOSE, 0, c};
    c->rep_op = (struct sop){SOP_REPORT, 0, c};
    c->rep_mh = EXS_MHANDLE_INVALID;
    addr_str(&a->exs_evt_addr, c->name, sizeof(c->name));
    c->next = s->all;
    if (s->all)
        s->all->prev = c;
    s->all = c;
    s->clients++;
    s->served++;
    for (int i = 0; i < SRV_RECVS; i++)
        c->mh[i] = EXS_MHANDLE_INVALID;
    for (int i = 0; i < SRV_RECVS; i++) {
        c->op[i] = (struct sop){SOP_BUF, i, c};
        c->buf[i] = malloc(PROBE_MSG_MAX);
        if (!c->buf[i] ||
            (c->mh[i] = exs_mregister(c->buf[i], PROBE_MSG_MAX, 0)) == EXS_MHANDLE_INVALID) {
            srv_close(s, c, "out of memory for receive buffers");
            return;
        }
    }
    if ((c->rep_mh = exs_mregister(c->rep, sizeof(c->rep), 0)) == EXS_MHANDLE_INVALID) {
        srv_close(s, c, "cannot register the report buffer");
        return;
    }
    for (int i = 0; i < SRV_RECVS; i++)
        if (srv_post_recv(s, c, i) < 0)
            return;
    if (s->json)
        printf("{\"event\": \"client\", \"peer\": \"%s\"}\n", c->name);
    else
        printf("client %s: connected\n", c->name);
    fflush(stdout);
}

/* A message arrived in buffer i: answer a ping with the same bytes, count data, report. */
static void srv_message(struct server *s, struct sclient *c, int i, const exs_event_t *e)
{
    const exs_evt_xfer_t *x = &e->exs_evt_u.exs_evt_xfer;
    struct probe_hdr h;
    char why[96];

    if (c->closing)
        return;
    if (e->exs_evt_errno) {
        snprintf(why, sizeof(why), "connection lost: %s", strerror(e->exs_evt_errno));
        srv_close(s, c, why);
        return;
    }
    if (x->exs_evt_result == 0) {
        srv_close(s, c, "closed by the client");
        return;
    }
    if (hdr_get(c->buf[i], (size_t)x->exs_evt_result, x->exs_evt_flags & MSG_TRUNC, &h) < 0 ||
        h.kind == PK_PONG || h.kind == PK_REPORT) {
        snprintf(why, sizeof(why), "protocol error (a %zd-byte message that is no probe)",
                 x->exs_evt_result);
        srv_close(s, c, why);
        return;
    }
    switch (h.kind) {
    case PK_PING:
        c->pings++;
        h.kind = PK_PONG;
        hdr_put(c->buf[i], &h);
        if (exs_send(c->fd, c->buf[i], h.len, 0, s->q, &c->op[i], c->mh[i]) < 0) {
            snprintf(why, sizeof(why), "exs_send: %s", strerror(errno));
            srv_close(s, c, why);
        }
        return; /* the receive is posted again when the answer is sent */
    case PK_DATA:
        c->data_bytes += h.len;
        c->data_msgs++;
        break;
    case PK_END:
        c->ends++;
        if (c->rep_busy) {
            srv_close(s, c, "protocol error (END before the last report was sent)");
            return;
        }
        h.kind = PK_REPORT;
        h.len = PROBE_HDR;
        h.a = c->data_bytes;
        h.b = c->data_msgs;
        hdr_put(c->rep, &h);
        c->data_bytes = c->data_msgs = 0;
        if (exs_send(c->fd, c->rep, PROBE_HDR, 0, s->q, &c->rep_op, c->rep_mh) < 0) {
            snprintf(why, sizeof(why), "exs_send: %s", strerror(errno));
            srv_close(s, c, why);
            return;
        }
        c->rep_busy = 1;
        break;
    }
    srv_post_recv(s, c, i);
}

static void srv_event(struct server *s, const exs_event_t *e)
{
    struct sop *op = e->exs_evt_ahandle;
    struct sclient *c = op ? op->c : NULL;
    char why[96];

    if (!op)
        return;
    switch (op->kind) {
    case SOP_ACCEPT:
        srv_accepted(s, e);
        return;
    case SOP_REJECT:
        return;
    case SOP_CLOSE:
        srv_client_free(s, c);
        return;
    case SOP_REPORT:
        c->rep_busy = 0;
        if (e->exs_evt_errno && !c->closing) {
            snprintf(why, sizeof(why), "report not sent: %s", strerror(e->exs_evt_errno));
            srv_close(s, c, why);
        }
        return;
    case SOP_BUF:
        if (e->exs_evt_type == EXS_EVT_RECV) {
            srv_message(s, c, op->idx, e);
        } else if (!c->closing) { /* a PONG went out: the buffer takes a message again */
            if (e->exs_evt_errno) {
                snprintf(why, sizeof(why), "answer not sent: %s", strerror(e->exs_evt_errno));
                srv_close(s, c, why);
            } else {
                srv_post_recv(s, c, op->idx);
            }
        }
        return;
    }
}

int exsctl_serve(int argc, char **argv)
{
    static const struct option lo[] = {{"port", required_argument, NULL, 'p'},
                                       {"bind", required_argument, NULL, 'b'},
                                       {"max-clients", required_argument, NULL, 'm'},
                                       {"once", no_argument, NULL, 'o'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    struct server s;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    const char *bind_addr = "0.0.0.0";
    char err[300], name[80];
    double v;
    int o, port = EXSCTL_PROBE_PORT, rc = 0;

    memset(&s, 0, sizeof(s));
    s.max_clients = 16;
    optind = 1;
    while ((o = getopt_long(argc, argv, "p:", lo, NULL)) != -1) {
        switch (o) {
        case 'p':
            if (parse_num(optarg, 0, 65535, &v))
                return bad_arg("serve", "--port", optarg);
            port = (int)v;
            break;
        case 'b':
            bind_addr = optarg;
            break;
        case 'm':
            if (parse_num(optarg, 1, 4096, &v))
                return bad_arg("serve", "--max-clients", optarg);
            s.max_clients = (int)v;
            break;
        case 'o':
            s.once = 1;
            break;
        case 'j':
            s.json = 1;
            break;
        case 'h':
            exsctl_probe_usage(stdout);
            return 0;
        default:
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "exsctl serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (resolve(bind_addr, port ? port : 1, &ss, &sl, err, sizeof(err)) < 0) {
        fprintf(stderr, "exsctl serve: --bind: %s\n", err);
        return 1;
    }
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    if (init_lib("serve") < 0)
        return 1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    s.q = exs_qcreate(s.max_clients * (SRV_RECVS + 2) + 8);
    s.lfd = exs_socket(ss.ss_family, SOCK_SEQPACKET, 0);
    if (s.q == EXS_QHANDLE_INVALID || s.lfd < 0) {
        fprintf(stderr, "exsctl serve: %s: %s\n", s.lfd < 0 ? "exs_socket" : "exs_qcreate",
                strerror(errno));
        exs_fini();
        return 1;
    }
    if (exs_bind(s.lfd, (struct sockaddr *)&ss, sl) < 0 || exs_listen(s.lfd, 64) < 0) {
        fprintf(stderr, "exsctl serve: cannot listen on %s port %d: %s\n", bind_addr, port,
                strerror(errno));
        exs_fini();
        return 1;
    }
    sl = sizeof(ss);
    if (exs_getsockname(s.lfd, (struct sockaddr *)&ss, &sl) < 0) {
        fprintf(stderr, "exsctl serve: exs_getsockname: %s\n", strerror(errno));
        exs_fini();
        return 1;
    }
    addr_str(&ss, name, sizeof(name));
    port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                         : ((struct sockaddr_in6 *)&ss)->sin6_port);
    if (s.json)
        printf("{\"event\": \"listening\", \"address\": \"%s\", \"port\": %d, \"provider\": "
               "\"%s\", \"type\": \"seqpacket\"}\n",
               name, port, provider_name());
    else
        printf("exsctl serve: listening on %s (port %d, SOCK_SEQPACKET, provider %s)\n", name, port,
               provider_name());
    fflush(stdout);
    s.accept_op = (struct sop){SOP_ACCEPT, 0, NULL};
    s.reject_op = (struct sop){SOP_REJECT, 0, NULL};
    while (!probe_stop) {
        exs_event_t ev[32];
        struct timespec to = ts_of(0.2);
        int n;

        if (!s.accept_posted && !(s.once && s.served > 0) && now_s() >= s.resume) {
            if (exs_accept(s.lfd, s.q, &s.accept_op) < 0) {
                fprintf(stderr, "exsctl serve: exs_accept: %s\n", strerror(errno));
                rc = 1;
                break;
            }
            s.accept_posted = 1;
        }
        n = exs_qdequeue(s.q, ev, 32, &to);
        if (n < 0 && errno == EINTR)
            continue; /* a signal: the loop condition looks at it */
        if (n < 0) {
            fprintf(stderr, "exsctl serve: exs_qdequeue: %s\n", strerror(errno));
            rc = 1;
            break;
        }
        for (int i = 0; i < n; i++)
            srv_event(&s, &ev[i]);
        if (s.once && s.served > 0 && s.clients == 0)
            break;
    }
    /* exs_fini closes what is left (the listener, clients still connected). */
    for (struct sclient *c = s.all; c; c = c->next)
        if (!c->closing)
            srv_log_done(&s, c, "server stopped");
    exs_fini();
    while (s.all) {
        struct sclient *c = s.all;

        for (int i = 0; i < SRV_RECVS; i++)
            free(c->buf[i]); /* registrations died with exs_fini */
        s.all = c->next;
        free(c);
    }
    if (s.json)
        printf("{\"event\": \"stopped\", \"clients_served\": %ld}\n", s.served);
    else
        printf("exsctl serve: stopped after %ld client(s)\n", s.served);
    return rc;
}

/* ---- the prober side: peers on one event queue ---- */

#define PEER_RECVS 4
#define PEER_SENDS 32 /* largest --depth */

enum { POP_CONNECT = 1, POP_SEND, POP_RECV, POP_CLOSE };

struct peer;
struct pop {
    int kind, idx;
    struct peer *p;
};

struct peer {
    const char *spec;
    char name[300], addr[80], err[300]; /* name: as given; addr: what it resolved to */
    struct sockaddr_storage ss;
    socklen_t sl;
    int fd, connected, failed, closing, closed;
    size_t rsize, ssize;
    unsigned char *rbuf[PEER_RECVS], *sbuf[PEER_SENDS];
    exs_mhandle_t rmh[PEER_RECVS], smh[PEER_SENDS];
    int sbusy[PEER_SENDS], nsend;
    struct pop oconn, oclose, orecv[PEER_RECVS], osend[PEER_SENDS];
    /* pings */
    int count, sent, late;
    double *t_sent; /* per sequence number; 0 = not sent */
    unsigned char *answered;
    double *rtt;
    int nrtt;
    /* perf */
    int got_report;
    struct probe_hdr report;
    uint64_t sent_bytes, sent_msgs;
    double t_last_done;
};

struct prober {
    exs_qhandle_t q;
    struct peer *peers;
    int npeers;
    double timeout_s;
    int inject; /* testing: the first ping carries a bad magic (the server must drop us) */
};

static void peer_fail(struct prober *pr, struct peer *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void peer_fail(struct prober *pr, struct peer *p, const char *fmt, ...)
{
    va_list ap;

    if (p->failed)
        return;
    p->failed = 1;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof(p->err), fmt, ap);
    va_end(ap);
    if (p->fd >= 0 && !p->closing) {
        p->closing = 1;
        if (exs_close(p->fd, pr->q, &p->oclose) < 0)
            p->closed = 1; /* exs_fini takes it */
    }
}

static void peer_event(struct prober *pr, const exs_event_t *e)
{
    struct pop *op = e->exs_evt_ahandle;
    struct peer *p;

    if (!op)
        return;
    p = op->p;
    switch (op->kind) {
    case POP_CONNECT:
        if (e->exs_evt_errno)
            peer_fail(pr, p, "cannot connect: %s", strerror(e->exs_evt_errno));
        else
            p->connected = 1;
        return;
    case POP_CLOSE:
        p->closed = 1;
        return;
    case POP_SEND:
        p->sbusy[op->idx] = 0;
        if (e->exs_evt_errno) {
            peer_fail(pr, p, "connection lost: send: %s", strerror(e->exs_evt_errno));
            return;
        }
        p->t_last_done = now_s();
        return;
    case POP_RECV:
        break;
    default:
        return;
    }
    if (p->failed)
        return;
    const exs_evt_xfer_t *x = &e->exs_evt_u.exs_evt_xfer;
    struct probe_hdr h;
    double t = now_s();

    if (e->exs_evt_errno) {
        peer_fail(pr, p, "connection lost: %s", strerror(e->exs_evt_errno));
        return;
    }
    if (x->exs_evt_result == 0) {
        peer_fail(pr, p, "the peer closed the connection");
        return;
    }
    if (hdr_get(p->rbuf[op->idx], (size_t)x->exs_evt_result, x->exs_evt_flags & MSG_TRUNC, &h) <
            0 ||
        (h.kind != PK_PONG && h.kind != PK_REPORT)) {
        peer_fail(pr, p,
                  "protocol error: a %zd-byte answer that is no probe answer (is the peer "
                  "exsctl serve?)",
                  x->exs_evt_result);
        return;
    }
    if (h.kind == PK_PONG) {
        /* Our own sequence number comes back: trust only our clock for the send time. */
        if (h.seq < (uint32_t)p->count && p->t_sent[h.seq] > 0 && !p->answered[h.seq]) {
            p->answered[h.seq] = 1;
            if (t - p->t_sent[h.seq] <= pr->timeout_s)
                p->rtt[p->nrtt++] = (t - p->t_sent[h.seq]) * 1e6;
            else
                p->late++;
        }
    } else {
        p->report = h;
        p->got_report = 1;
    }
    if (exs_recv(p->fd, p->rbuf[op->idx], p->rsize, 0, pr->q, op, p->rmh[op->idx]) < 0)
        peer_fail(pr, p, "exs_recv: %s", strerror(errno));
}

/* Take events until done(pr, arg) or the deadline; 0, or -1 when the queue failed. */
static int pump(struct prober *pr, double deadline, int (*done)(struct prober *, void *), void *arg)
{
    exs_event_t ev[32];

    for (;;) {
        double t = now_s();
        struct timespec to;
        int n;

        if ((done && done(pr, arg)) || t >= deadline || probe_stop)
            return 0;
        to = ts_of(deadline - t);
        n = exs_qdequeue(pr->q, ev, 32, &to);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "exsctl: exs_qdequeue: %s\n", strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++)
            peer_event(pr, &ev[i]);
    }
}

static int all_connected(struct prober *pr, void *arg)
{
    (void)arg;
    for (int i = 0; i < pr->npeers; i++)
        if (!pr->peers[i].connected && !pr->peers[i].failed)
            return 0;
    return 1;
}

static int all_closed(struct prober *pr, void *arg)
{
    (void)arg;
    for (int i = 0; i < pr->npeers; i++)
        if (pr->peers[i].fd >= 0 && pr->peers[i].closing && !pr->peers[i].closed)
            return 0;
    return 1;
}

/* Buffers, socket and connect of every peer; all connected or failed within the timeout. */
static int peers_open(struct prober *pr, double connect_s, int nsend)
{
    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        p->fd = -1;
        p->nsend = nsend;
        for (int k = 0; k < PEER_RECVS; k++)
            p->rmh[k] = EXS_MHANDLE_INVALID;
        for (int k = 0; k < PEER_SENDS; k++)
            p->smh[k] = EXS_MHANDLE_INVALID;
        p->oconn = (struct pop){POP_CONNECT, 0, p};
        p->oclose = (struct pop){POP_CLOSE, 0, p};
        snprintf(p->name, sizeof(p->name), "%s", p->spec);
        if (resolve(p->spec, EXSCTL_PROBE_PORT, &p->ss, &p->sl, p->err, sizeof(p->err)) < 0) {
            p->failed = 1;
            continue;
        }
        addr_str(&p->ss, p->addr, sizeof(p->addr));
        for (int k = 0; k < PEER_RECVS; k++) {
            p->orecv[k] = (struct pop){POP_RECV, k, p};
            if (!(p->rbuf[k] = malloc(p->rsize)) ||
                (p->rmh[k] = exs_mregister(p->rbuf[k], p->rsize, 0)) == EXS_MHANDLE_INVALID) {
                fprintf(stderr, "exsctl: buffers: %s\n", strerror(errno ? errno : ENOMEM));
                return -1;
            }
        }
        for (int k = 0; k < nsend; k++) {
            p->osend[k] = (struct pop){POP_SEND, k, p};
            if (!(p->sbuf[k] = calloc(1, p->ssize)) ||
                (p->smh[k] = exs_mregister(p->sbuf[k], p->ssize, 0)) == EXS_MHANDLE_INVALID) {
                fprintf(stderr, "exsctl: buffers: %s\n", strerror(errno ? errno : ENOMEM));
                return -1;
            }
        }
        p->fd = exs_socket(p->ss.ss_family, SOCK_SEQPACKET, 0);
        if (p->fd < 0) {
            peer_fail(pr, p, "exs_socket: %s", strerror(errno));
            continue;
        }
        if (exs_connect(p->fd, (struct sockaddr *)&p->ss, p->sl, pr->q, &p->oconn) < 0)
            peer_fail(pr, p, "cannot connect: %s", strerror(errno));
    }
    if (pump(pr, now_s() + connect_s, all_connected, NULL) < 0)
        return -1;
    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        if (!p->connected && !p->failed)
            peer_fail(pr, p, "cannot connect: no answer within %.1f s", connect_s);
        for (int k = 0; k < PEER_RECVS && p->connected && !p->failed; k++)
            if (exs_recv(p->fd, p->rbuf[k], p->rsize, 0, pr->q, &p->orecv[k], p->rmh[k]) < 0)
                peer_fail(pr, p, "exs_recv: %s", strerror(errno));
    }
    return 0;
}

/* Close every peer (bounded wait), stop the library, free the buffers. */
static void peers_close(struct prober *pr)
{
    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        if (p->fd >= 0 && !p->closing) {
            p->closing = 1;
            if (exs_close(p->fd, pr->q, &p->oclose) < 0)
                p->closed = 1;
        }
    }
    pump(pr, now_s() + 3, all_closed, NULL);
    exs_fini(); /* also what a dead peer left behind */
    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        for (int k = 0; k < PEER_RECVS; k++)
            free(p->rbuf[k]);
        for (int k = 0; k < PEER_SENDS; k++)
            free(p->sbuf[k]);
        free(p->t_sent);
        free(p->answered);
        free(p->rtt);
    }
}

/* Post one message of `len` bytes from send slot k; 0 or -1 (the peer failed). */
static int peer_send(struct prober *pr, struct peer *p, int k, struct probe_hdr *h)
{
    hdr_put(p->sbuf[k], h);
    if (exs_send(p->fd, p->sbuf[k], h->len, 0, pr->q, &p->osend[k], p->smh[k]) < 0) {
        peer_fail(pr, p, "exs_send: %s", strerror(errno));
        return -1;
    }
    p->sbusy[k] = 1;
    return 0;
}

struct round {
    uint32_t seq;
};

static int round_done(struct prober *pr, void *arg)
{
    uint32_t seq = ((struct round *)arg)->seq;

    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        if (!p->failed && p->connected && p->t_sent[seq] > 0 && !p->answered[seq])
            return 0;
    }
    return 1;
}

/* `count` rounds: a ping to every live peer, wait for the answers up to the timeout, then
 * the rest of the interval. A probe not answered in time is lost. */
static int ping_rounds(struct prober *pr, int count, size_t size, double interval_s)
{
    for (int i = 0; i < pr->npeers; i++) {
        struct peer *p = &pr->peers[i];

        p->count = count;
        p->t_sent = calloc((size_t)count, sizeof(double));
        p->answered = calloc((size_t)count, 1);
        p->rtt = calloc((size_t)count, sizeof(double));
        if (!p->t_sent || !p->answered || !p->rtt) {
            fprintf(stderr, "exsctl: out of memory\n");
            return -1;
        }
    }
    for (int r = 0; r < count && !probe_stop; r++) {
        double t0 = now_s();
        struct round rd = {(uint32_t)r};
        int alive = 0;

        for (int i = 0; i < pr->npeers; i++)
            alive += pr->peers[i].connected && !pr->peers[i].failed;
        if (!alive)
            break; /* every peer failed: the rest is lost, no need to wait for it */

        for (int i = 0; i < pr->npeers; i++) {
            struct peer *p = &pr->peers[i];
            struct probe_hdr h = {
                PROBE_MAGIC, PK_PING, PROBE_VERSION, (uint32_t)r, (uint32_t)size, 0, 0, 0};

            if (p->failed || !p->connected || p->sbusy[0])
                continue; /* the last ping is not even sent: this one is lost */
            h.t_ns = (uint64_t)(now_s() * 1e9);
            p->t_sent[r] = now_s();
            if (pr->inject && r == 0)
                h.magic = ~PROBE_MAGIC;
            if (peer_send(pr, p, 0, &h) < 0)
                continue;
            p->sent++;
        }
        if (pump(pr, t0 + pr->timeout_s, round_done, &rd) < 0)
            return -1;
        if (r + 1 < count && pump(pr, t0 + interval_s, NULL, NULL) < 0)
            return -1;
    }
    return 0;
}

struct rtt_sum {
    double min, p50, p99, max, mean;
};

static void rtt_summary(struct peer *p, struct rtt_sum *s)
{
    memset(s, 0, sizeof(*s));
    if (p->nrtt == 0)
        return;
    qsort(p->rtt, (size_t)p->nrtt, sizeof(double), cmp_dbl);
    s->min = p->rtt[0];
    s->max = p->rtt[p->nrtt - 1];
    s->p50 = pctl(p->rtt, p->nrtt, 50);
    s->p99 = pctl(p->rtt, p->nrtt, 99);
    for (int i = 0; i < p->nrtt; i++)
        s->mean += p->rtt[i] / p->nrtt;
}

/* The library, the signals that stop a probe and pr's queue of depth entries for command
 * cmd (ping, perf); -1 said on stderr. */
static int probe_begin(struct prober *pr, const char *cmd, int depth)
{
    if (init_lib(cmd) < 0)
        return -1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    pr->q = exs_qcreate(depth);
    if (pr->q == EXS_QHANDLE_INVALID) {
        fprintf(stderr, "exsctl %s: exs_qcreate: %s\n", cmd, strerror(errno));
        exs_fini();
        return -1;
    }
    return 0;
}

int exsctl_ping(int argc, char **argv)
{
    static const struct option lo[] = {{"count", required_argument, NULL, 'c'},
                                       {"interval", required_argument, NULL, 'i'},
                                       {"size", required_argument, NULL, 's'},
                                       {"timeout", required_argument, NULL, 't'},
                                       {"connect-timeout", required_argument, NULL, 'C'},
                                       {"inject-error", no_argument, NULL, 'E'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    struct prober pr;
    double v, interval_s = 0.1, connect_s = 5;
    int o, count = 10, json = 0, rc = 0;
    size_t size = 64;

    memset(&pr, 0, sizeof(pr));
    pr.timeout_s = 1;
    optind = 1;
    while ((o = getopt_long(argc, argv, "c:i:s:t:", lo, NULL)) != -1) {
        switch (o) {
        case 'c':
            if (parse_num(optarg, 1, 1000000, &v))
                return bad_arg("ping", "--count", optarg);
            count = (int)v;
            break;
        case 'i':
            if (parse_num(optarg, 0, 3600000, &v))
                return bad_arg("ping", "--interval (ms)", optarg);
            interval_s = v / 1e3;
            break;
        case 's':
            if (parse_bytes(optarg, PROBE_HDR, 65536, &v))
                return bad_arg("ping", "--size (40..64K)", optarg);
            size = (size_t)v;
            break;
        case 't':
            if (parse_num(optarg, 1, 3600000, &v))
                return bad_arg("ping", "--timeout (ms)", optarg);
            pr.timeout_s = v / 1e3;
            break;
        case 'C':
            if (parse_num(optarg, 1, 3600000, &v))
                return bad_arg("ping", "--connect-timeout (ms)", optarg);
            connect_s = v / 1e3;
            break;
        case 'E':
            pr.inject = 1;
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            exsctl_probe_usage(stdout);
            return 0;
        default:
            return 2;
        }
    }
    pr.npeers = argc - optind;
    if (pr.npeers < 1 || pr.npeers > 256) {
        fprintf(stderr, "exsctl ping: name 1 to 256 peers: HOST[:PORT]... (exsctl help)\n");
        return 2;
    }
    pr.peers = calloc((size_t)pr.npeers, sizeof(*pr.peers));
    if (!pr.peers || probe_begin(&pr, "ping", pr.npeers * (PEER_RECVS + 4) + 8) < 0)
        return 1;
    for (int i = 0; i < pr.npeers; i++) {
        pr.peers[i].spec = argv[optind + i];
        pr.peers[i].rsize = size;
        pr.peers[i].ssize = size;
    }
    if (peers_open(&pr, connect_s, 1) < 0 || ping_rounds(&pr, count, size, interval_s) < 0)
        rc = 1;
    if (probe_stop)
        fprintf(stderr, "exsctl ping: interrupted\n");
    /* The table before closing: a failure seen while closing does not change the probes. */
    if (json)
        printf("{\"tool\": \"exsctl\", \"command\": \"ping\", \"provider\": \"%s\", \"count\": %d, "
               "\"size\": %zu, \"interval_ms\": %.1f, \"timeout_ms\": %.1f, \"peers\": [\n",
               provider_name(), count, size, interval_s * 1e3, pr.timeout_s * 1e3);
    else
        printf("# exsctl ping: %d probes of %zu bytes per peer, every %.0f ms, lost when not "
               "answered within %.0f ms (provider %s)\n"
               "#%-29s %6s %6s %6s %10s %10s %10s %10s  %s\n",
               count, size, interval_s * 1e3, pr.timeout_s * 1e3, provider_name(), "peer", "sent",
               "recv", "loss%", "min_us", "p50_us", "p99_us", "max_us", "error");
    for (int i = 0; i < pr.npeers; i++) {
        struct peer *p = &pr.peers[i];
        struct rtt_sum s;
        int lost = count - p->nrtt;
        double loss = 100.0 * lost / count;

        rtt_summary(p, &s);
        if (lost > 0 || p->failed)
            rc = 1;
        if (lost > 0 && !p->failed && !p->err[0])
            snprintf(p->err, sizeof(p->err), "%d probe(s) not answered within %.0f ms%s", lost,
                     pr.timeout_s * 1e3, p->late ? " (some answered late)" : "");
        if (json) {
            printf("    {\"peer\": ");
            json_str(stdout, p->name);
            printf(", \"address\": ");
            json_str_or_null(stdout, p->addr);
            printf(", \"sent\": %d, \"received\": %d, \"lost\": %d, \"loss\": %.4f, "
                   "\"late\": %d, ",
                   p->sent, p->nrtt, lost, loss / 100, p->late);
            if (p->nrtt)
                printf("\"rtt_us\": {\"min\": %.2f, \"p50\": %.2f, \"p99\": %.2f, \"max\": %.2f, "
                       "\"mean\": %.2f}, ",
                       s.min, s.p50, s.p99, s.max, s.mean);
            else
                printf("\"rtt_us\": null, ");
            printf("\"error\": ");
            json_str_or_null(stdout, p->err);
            printf("}%s\n", i + 1 < pr.npeers ? "," : "");
        } else if (p->nrtt) {
            printf(" %-29s %6d %6d %6.1f %10.1f %10.1f %10.1f %10.1f  %s\n", p->name, p->sent,
                   p->nrtt, loss, s.min, s.p50, s.p99, s.max, p->err[0] ? p->err : "-");
        } else {
            printf(" %-29s %6d %6d %6.1f %10s %10s %10s %10s  %s\n", p->name, p->sent, p->nrtt,
                   loss, "-", "-", "-", "-", p->err[0] ? p->err : "-");
        }
        if (p->err[0] && !json)
            fprintf(stderr, "exsctl ping: %s: %s\n", p->name, p->err);
    }
    if (json)
        printf("  ],\n  \"ok\": %s\n}\n", rc ? "false" : "true");
    fflush(stdout);
    peers_close(&pr);
    free(pr.peers);
    return rc;
}

/* ---- perf ---- */

static int report_in(struct prober *pr, void *arg)
{
    (void)arg;
    return pr->peers[0].got_report || pr->peers[0].failed;
}

static int sends_idle(struct prober *pr, void *arg)
{
    struct peer *p = &pr->peers[0];

    (void)arg;
    if (p->failed)
        return 1;
    for (int k = 0; k < p->nsend; k++)
        if (p->sbusy[k])
            return 0;
    return 1;
}

/* Stream DATA messages with `depth` outstanding for `secs`, then END; the server's REPORT
 * says what arrived. Gbit/s over first send .. report (all bytes confirmed received). */
static int perf_bandwidth(struct prober *pr, size_t size, int depth, double secs, double *gbps,
                          double *elapsed)
{
    struct peer *p = &pr->peers[0];
    double t0 = now_s(), t_end = t0 + secs;
    struct probe_hdr h = {PROBE_MAGIC, PK_DATA, PROBE_VERSION, 0, (uint32_t)size, 0, 0, 0};
    exs_event_t ev[32];

    while (!p->failed && !probe_stop && now_s() < t_end) {
        struct timespec to;
        int n;

        for (int k = 0; k < depth && !p->failed; k++) {
            if (p->sbusy[k])
                continue;
            h.seq = (uint32_t)p->sent_msgs;
            if (peer_send(pr, p, k, &h) == 0) {
                p->sent_bytes += size;
                p->sent_msgs++;
            }
        }
        to = ts_of(t_end - now_s() < pr->timeout_s ? t_end - now_s() : pr->timeout_s);
        n = exs_qdequeue(pr->q, ev, 32, &to);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "exsctl perf: exs_qdequeue: %s\n", strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++)
            peer_event(pr, &ev[i]);
    }
    if (pump(pr, now_s() + pr->timeout_s + secs, sends_idle, NULL) < 0)
        return -1;
    if (!p->failed && !sends_idle(pr, NULL))
        peer_fail(pr, p, "sends not completed within %.1f s", pr->timeout_s + secs);
    if (p->failed)
        return -1;
    h.kind = PK_END;
    h.len = PROBE_HDR;
    h.a = p->sent_bytes;
    h.b = p->sent_msgs;
    if (peer_send(pr, p, 0, &h) < 0)
        return -1;
    if (pump(pr, now_s() + pr->timeout_s, report_in, NULL) < 0)
        return -1;
    if (!p->got_report) {
        peer_fail(pr, p, "no report from the peer within %.1f s", pr->timeout_s);
        return -1;
    }
    *elapsed = now_s() - t0;
    if (p->report.a != p->sent_bytes || p->report.b != p->sent_msgs) {
        peer_fail(pr, p, "DATA LOSS: sent %llu bytes in %llu messages, the peer got %llu in %llu",
                  (unsigned long long)p->sent_bytes, (unsigned long long)p->sent_msgs,
                  (unsigned long long)p->report.a, (unsigned long long)p->report.b);
        return -1;
    }
    *gbps = *elapsed > 0 ? (double)p->sent_bytes * 8 / *elapsed / 1e9 : 0;
    return 0;
}

int exsctl_perf(int argc, char **argv)
{
    static const struct option lo[] = {{"time", required_argument, NULL, 'T'},
                                       {"size", required_argument, NULL, 's'},
                                       {"depth", required_argument, NULL, 'd'},
                                       {"lat-count", required_argument, NULL, 'n'},
                                       {"lat-size", required_argument, NULL, 'l'},
                                       {"timeout", required_argument, NULL, 't'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    struct prober pr;
    struct peer *p;
    struct rtt_sum s;
    double v, secs = 1, gbps = 0, elapsed = 0;
    size_t size = PROBE_MSG_MAX, lat_size = 64;
    int o, depth = 8, lat_count = 1000, json = 0, rc = 0, lost;

    memset(&pr, 0, sizeof(pr));
    pr.timeout_s = 5;
    optind = 1;
    while ((o = getopt_long(argc, argv, "s:d:t:", lo, NULL)) != -1) {
        switch (o) {
        case 'T':
            if (parse_num(optarg, 0.01, 3600, &v))
                return bad_arg("perf", "--time (s)", optarg);
            secs = v;
            break;
        case 's':
            if (parse_bytes(optarg, PROBE_HDR, PROBE_MSG_MAX, &v))
                return bad_arg("perf", "--size (40..1M)", optarg);
            size = (size_t)v;
            break;
        case 'd':
            if (parse_num(optarg, 1, PEER_SENDS, &v))
                return bad_arg("perf", "--depth (1..32)", optarg);
            depth = (int)v;
            break;
        case 'n':
            if (parse_num(optarg, 1, 1000000, &v))
                return bad_arg("perf", "--lat-count", optarg);
            lat_count = (int)v;
            break;
        case 'l':
            if (parse_bytes(optarg, PROBE_HDR, 65536, &v))
                return bad_arg("perf", "--lat-size (40..64K)", optarg);
            lat_size = (size_t)v;
            break;
        case 't':
            if (parse_num(optarg, 1, 3600000, &v))
                return bad_arg("perf", "--timeout (ms)", optarg);
            pr.timeout_s = v / 1e3;
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            exsctl_probe_usage(stdout);
            return 0;
        default:
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "exsctl perf: name one peer: HOST[:PORT] (exsctl help)\n");
        return 2;
    }
    pr.npeers = 1;
    pr.peers = p = calloc(1, sizeof(*p));
    if (!p || probe_begin(&pr, "perf", PEER_RECVS + PEER_SENDS + 8) < 0)
        return 1;
    p->spec = argv[optind];
    p->rsize = lat_size;
    p->ssize = size > lat_size ? size : lat_size;
    /* Latency: back-to-back pings (no interval), then the bandwidth stream. */
    if (peers_open(&pr, pr.timeout_s, depth) < 0 || p->failed ||
        ping_rounds(&pr, lat_count, lat_size, 0) < 0 || p->failed ||
        perf_bandwidth(&pr, size, depth, secs, &gbps, &elapsed) < 0)
        rc = 1;
    if (probe_stop && !p->failed)
        peer_fail(&pr, p, "interrupted");
    rtt_summary(p, &s);
    lost = p->count - p->nrtt;
    if (!p->failed && lost > 0) {
        snprintf(p->err, sizeof(p->err), "%d of %d pings not answered within %.0f ms", lost,
                 p->count, pr.timeout_s * 1e3);
        rc = 1;
    }
    if (p->failed)
        rc = 1;
    if (json) {
        printf("{\"tool\": \"exsctl\", \"command\": \"perf\", \"provider\": \"%s\", \"peer\": ",
               provider_name());
        json_str(stdout, p->name);
        printf(", \"address\": ");
        json_str_or_null(stdout, p->addr);
        printf(",\n  \"latency_us\": ");
        if (p->nrtt)
            printf("{\"count\": %d, \"size\": %zu, \"lost\": %d, \"min\": %.2f, \"p50\": %.2f, "
                   "\"p99\": %.2f, \"max\": %.2f, \"mean\": %.2f}",
                   p->nrtt, lat_size, lost, s.min, s.p50, s.p99, s.max, s.mean);
        else
            printf("null");
        printf(",\n  \"throughput_gbps\": %.6f, \"bytes\": %llu, \"messages\": %llu, "
               "\"seconds\": %.6f, \"size\": %zu, \"depth\": %d,\n  \"error\": ",
               rc ? 0.0 : gbps, (unsigned long long)p->sent_bytes, (unsigned long long)p->sent_msgs,
               elapsed, size, depth);
        json_str_or_null(stdout, p->err);
        printf(", \"ok\": %s}\n", rc ? "false" : "true");
    } else {
        printf("# exsctl perf %s (provider %s, SOCK_SEQPACKET)\n", p->name, provider_name());
        if (p->nrtt)
            printf("latency    %d round trips of %zu bytes: min %.1f  p50 %.1f  p99 %.1f  max "
                   "%.1f us\n",
                   p->nrtt, lat_size, s.min, s.p50, s.p99, s.max);
        if (!rc)
            printf("bandwidth  %.3f Gbit/s  (%llu messages of %zu bytes, %d outstanding, %.2f s, "
                   "every byte confirmed by the peer)\n",
                   gbps, (unsigned long long)p->sent_msgs, size, depth, elapsed);
    }
    fflush(stdout);
    if (p->err[0])
        fprintf(stderr, "exsctl perf: %s: %s\n", p->name, p->err);
    peers_close(&pr);
    free(pr.peers);
    return rc;
}

void exsctl_probe_usage(FILE *f)
{
    fprintf(f,
            "  serve [--port P] [--bind ADDR] [--max-clients N] [--once] [--json]\n"
            "                     answer pings and perf probes (SOCK_SEQPACKET, port %d;\n"
            "                     provider from EXS_PROVIDER); stops on SIGINT/SIGTERM\n"
            "  ping HOST[:PORT]... [--count N] [--interval MS] [--size B] [--timeout MS]\n"
            "       [--connect-timeout MS] [--json] [--inject-error]\n"
            "                     round trips to each peer running exsctl serve: min/p50/p99/max,\n"
            "                     loss (no answer within the timeout); exit 1 on any loss;\n"
            "                     --inject-error (testing): a malformed first probe\n"
            "  perf HOST[:PORT] [--time S] [--size B] [--depth N] [--lat-count N]\n"
            "       [--lat-size B] [--timeout MS] [--json]\n"
            "                     latency (ping-pong) and bandwidth (Gbit/s) to exsctl serve\n",
            EXSCTL_PROBE_PORT);
}
