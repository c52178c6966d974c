/* SPDX-License-Identifier: MIT */
/* A raw peer of the tcp provider: frames, handshake and control records written by hand. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "exs/proto/wire_names.h"
#include "exs/util/sha256.h"
#include "tests/hostile/raw.h"

static int raw_step(struct raw_peer *p, double deadline);

double raw_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int raw_free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
        port = ntohs(sin.sin_port);
    close(fd);
    return port;
}

int raw_tcp_connect(int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, err;

    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        err = -errno;
        close(fd);
        return err;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int raw_write_all(int fd, const void *buf, size_t len)
{
    const char *q = buf;

    while (len) {
        ssize_t n = send(fd, q, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EPIPE;
        q += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_send_frame(int fd, unsigned type, unsigned flags, unsigned syndrome, uint32_t len,
                   uint32_t psn, uint64_t raddr, uint32_t rkey, uint32_t imm, const void *payload,
                   size_t payload_len)
{
    struct tcp_wire_hdr h;
    int err;

    memset(&h, 0, sizeof(h));
    h.magic = htonl(TCP_WIRE_MAGIC);
    h.version = TCP_WIRE_VERSION;
    h.type = (uint8_t)type;
    h.flags = (uint8_t)flags;
    h.syndrome = (uint8_t)syndrome;
    h.len = htonl(len);
    h.psn = htonl(psn);
    h.raddr = htobe64(raddr);
    h.rkey = htonl(rkey);
    h.imm = htonl(imm);
    err = raw_write_all(fd, &h, sizeof(h));
    if (!err && payload_len)
        err = raw_write_all(fd, payload, payload_len);
    return err;
}

void raw_hello_default(struct exs_wire_hello *h, unsigned sock_type)
{
    memset(h, 0, sizeof(*h));
    h->magic = htobe16(EXS_WIRE_MAGIC);
    h->version = EXS_WIRE_VERSION;
    h->sock_type = (uint8_t)sock_type;
    /* raw peers answer no keepalive PING: they do not claim feature ALIVE (§9.1) */
    h->features = htobe16(EXS_WIRE_FEAT_ALL & ~EXS_WIRE_FEAT_ALIVE);
    h->credits = htobe16(64);
    h->ctrl_size = htobe32(EXS_WIRE_CTRL_MAX);
    h->ring_size = htobe32(1u << 20);
    h->ring_addr = htobe64(0x100000000ull); /* never dereferenced: we only read frames */
    h->ring_rkey = htobe32(0x1234);
    h->eager_max = htobe32(4096);
}

int raw_send_conn_req(int fd, const void *pd, uint32_t pd_len)
{
    uint8_t buf[TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX];
    struct tcp_wire_conn c = {.rnr_retry = 7, .rnr_timer_ms = 0};

    if (pd_len > TCP_WIRE_PD_MAX)
        return -EINVAL;
    memcpy(buf, &c, sizeof(c));
    if (pd_len)
        memcpy(buf + TCP_WIRE_CONN_LEN, pd, pd_len);
    return raw_send_frame(fd, TCP_WIRE_CONN_REQ, 0, 0, TCP_WIRE_CONN_LEN + pd_len, 0, 0, 0, 0, buf,
                          TCP_WIRE_CONN_LEN + pd_len);
}

/* Read exactly len bytes before the deadline (bytes already there are read even when it
 * has passed): 0, -ECONNRESET or -ETIMEDOUT. */
static int read_exact(int fd, void *buf, size_t len, double deadline)
{
    char *q = buf;

    while (len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        double left = deadline - raw_now_ms();
        ssize_t n;

        n = poll(&pfd, 1, left > 0 ? (int)left + 1 : 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -ETIMEDOUT;
        n = recv(fd, q, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return -ECONNRESET;
        q += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read one frame's header and payload (payload beyond cap is read and dropped). */
static int read_frame(int fd, struct tcp_wire_hdr *h, uint8_t *buf, uint32_t cap, uint32_t *got,
                      double deadline)
{
    uint8_t sink[4096];
    uint32_t len, n;
    int err = read_exact(fd, h, sizeof(*h), deadline);

    if (err)
        return err;
    h->magic = ntohl(h->magic);
    h->len = ntohl(h->len);
    h->psn = ntohl(h->psn);
    h->raddr = be64toh(h->raddr);
    h->rkey = ntohl(h->rkey);
    h->imm = ntohl(h->imm);
    if (h->magic != TCP_WIRE_MAGIC)
        return -EPROTO;
    len = h->len;
    n = len < cap ? len : cap;
    /* the server's payload arrives promptly once the header did: a generous bound */
    err = read_exact(fd, buf, n, raw_now_ms() + 10000);
    if (err)
        return err;
    *got = n;
    for (len -= n; len && !err; len -= n) {
        n = len < sizeof(sink) ? len : (uint32_t)sizeof(sink);
        err = read_exact(fd, sink, n, raw_now_ms() + 10000);
    }
    return err;
}

/* The acceptor's answer to our CONN_REQ: its hello in p->peer (0), or -ECONNRESET (the
 * connection was closed: p->closed), -ECONNREFUSED (rejected: p->rejected), -EPROTO. */
static int raw_read_accept(struct raw_peer *p, int ms)
{
    uint8_t buf[TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX];
    struct tcp_wire_hdr fh;
    uint32_t got = 0;
    int err;

    err = read_frame(p->fd, &fh, buf, sizeof(buf), &got, raw_now_ms() + ms);
    if (err == -EPROTO || err == -ECONNRESET) {
        p->closed = 1;
        return -ECONNRESET;
    }
    if (err)
        return err;
    if (fh.type == TCP_WIRE_CONN_REJECT) {
        p->rejected = 1;
        return -ECONNREFUSED;
    }
    if (fh.type != TCP_WIRE_CONN_ACCEPT || got < TCP_WIRE_CONN_LEN + EXS_WIRE_HELLO_LEN)
        return -EPROTO;
    memcpy(&p->peer, buf + TCP_WIRE_CONN_LEN, sizeof(p->peer));
    p->acc_pd_len = got - TCP_WIRE_CONN_LEN;
    memcpy(p->acc_pd, buf + TCP_WIRE_CONN_LEN, p->acc_pd_len);
    return 0;
}

int raw_open_pd(struct raw_peer *p, int port, const void *pd, uint32_t pd_len, int ms)
{
    int err;

    memset(p, 0, sizeof(*p));
    p->fd = raw_tcp_connect(port);
    if (p->fd < 0)
        return p->fd;
    err = raw_send_conn_req(p->fd, pd, pd_len);
    return err ? err : raw_read_accept(p, ms);
}

int raw_open(struct raw_peer *p, int port, const struct exs_wire_hello *h, int ms)
{
    int err;

    memset(p, 0, sizeof(*p));
    p->fd = raw_tcp_connect(port);
    if (p->fd < 0)
        return p->fd;
    err = raw_send_conn_req(p->fd, h, sizeof(*h));
    if (err)
        return err;
    err = raw_read_accept(p, ms);
    if (err)
        return err;
    p->ring_rkey = be32toh(p->peer.ring_rkey);
#ifdef EXS_WIRE_RING_LEN
    {
        /* v2: our ring's key goes in a RING record, the first of our first SEND */
        struct exs_wire_ring r;
        uint32_t psn;

        memset(&r, 0, sizeof(r));
        r.hdr.type = EXS_CTRL_RING;
        r.hdr.len = htobe16(EXS_WIRE_RING_LEN);
        r.rkey = h->ring_rkey ? h->ring_rkey : htobe32(0x1234);
        err = raw_send_ctrl(p, &r, sizeof(r), &psn);
        if (err)
            return err;
    }
#endif
    return 0;
}

int raw_wait_ring(struct raw_peer *p, int ms)
{
    double deadline = raw_now_ms() + ms;

    while (!p->ring_rkey && raw_step(p, deadline) == 0)
        ;
    return p->ring_rkey ? 0 : -ETIMEDOUT;
}

void raw_close(struct raw_peer *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
}

static void add_key(struct raw_key *keys, unsigned *n, uint64_t addr, uint32_t len, uint32_t rkey,
                    uint32_t id, uint64_t seq)
{
    struct raw_key *k = &keys[*n < RAW_MAX_KEYS ? *n : RAW_MAX_KEYS - 1];

    k->addr = addr;
    k->len = len;
    k->rkey = rkey;
    k->id = id;
    k->seq = seq;
    if (*n < RAW_MAX_KEYS)
        (*n)++;
}

static int raw_parse_rec(void *arg, const struct exs_wire_ctrl_hdr *hp, const uint8_t *rec,
                         uint32_t rlen)
{
    struct raw_peer *p = arg;
    struct exs_wire_ctrl_hdr h = *hp;

    if (h.type == EXS_CTRL_ADVERT && rlen >= EXS_WIRE_ADVERT_LEN) {
        struct exs_wire_advert a;

        memcpy(&a, rec, sizeof(a));
        add_key(p->adverts, &p->n_adverts, be64toh(a.addr), be32toh(a.len), be32toh(a.rkey),
                be32toh(a.id), be64toh(a.seq));
    } else if (h.type == EXS_CTRL_ANNOUNCE && rlen >= EXS_WIRE_ANNOUNCE_LEN) {
        struct exs_wire_announce a;

        memcpy(&a, rec, sizeof(a));
        add_key(p->announces, &p->n_announces, be64toh(a.addr), be32toh(a.len), be32toh(a.rkey), 0,
                be64toh(a.seq));
    } else if (h.type == EXS_CTRL_TRACE && rlen >= EXS_WIRE_TRACE_LEN &&
               (h.flags & EXS_TRACE_ANSWER)) {
        memcpy(&p->trace, rec, sizeof(p->trace));
        p->trace_answers++;
    } else if (h.type == EXS_CTRL_SESSION && rlen == EXS_WIRE_SESSION_LEN) {
        /* §9.2: the server's key K_B; the token a resume hello carries is the first 8
         * bytes of its SHA-256 */
        uint8_t d[EXS_SHA256_LEN];

        memcpy(p->sess_key, rec + EXS_WIRE_CTRL_HDR_LEN, sizeof(p->sess_key));
        exs__sha256(p->sess_key, sizeof(p->sess_key), d);
        memcpy(&p->sess_token, d, sizeof(p->sess_token));
        p->sess_token = be64toh(p->sess_token);
        p->sess_keyed = 1;
    }
#ifdef EXS_WIRE_RING_LEN
    else if (h.type == EXS_CTRL_RING && rlen >= EXS_WIRE_RING_LEN) {
        struct exs_wire_ring r;

        memcpy(&r, rec, sizeof(r));
        p->ring_rkey = be32toh(r.rkey);
    }
#endif
    return 0;
}

/* The records of one control SEND (the shared walker, exs/proto/wire_names.h): 0, or
 * -EPROTO for a malformed one. */
int raw_parse_ctrl(struct raw_peer *p, const uint8_t *buf, uint32_t len)
{
    return exs__wire_walk(buf, len, raw_parse_rec, p) ? -EPROTO : 0;
}

/* Handle one frame from the server. */
static int on_frame(struct raw_peer *p, const struct tcp_wire_hdr *h, const uint8_t *buf,
                    uint32_t got)
{
    if (p->mute) {
        p->closed |= h->type == TCP_WIRE_DISCONNECT || h->type == TCP_WIRE_NAK;
        if (h->type == TCP_WIRE_ACK)
            p->acked = h->psn + 1; /* ours are still acknowledged: we only answer nothing */
        return 0;
    }
    switch (h->type) {
    case TCP_WIRE_SEND:
    case TCP_WIRE_WRITE:
        p->rx_psn = h->psn + 1;
        if (h->type == TCP_WIRE_SEND)
            (void)raw_parse_ctrl(p, buf, got);
        else if (h->flags & TCP_WIRE_F_IMM) {
            memcpy(p->data, buf, got);
            p->data_len = got;
            p->data_msgs++;
        }
        /* acknowledge at once: we are a prompt responder */
        return raw_send_frame(p->fd, TCP_WIRE_ACK, 0, 0, 0, h->psn, 0, 0, 0, NULL, 0);
    case TCP_WIRE_READ_REQ:
        if (p->stall_reads) {
            /* never answered, nor anything after it (responses go in order): the
             * reader waits */
            p->mute = 1;
            return 0;
        }
        /* we announce nothing: refuse, which ends the connection */
        return raw_send_frame(p->fd, TCP_WIRE_NAK, 0, TCP_WIRE_SYN_REM_ACCESS, 0, h->psn, 0, 0, 0,
                              NULL, 0);
    case TCP_WIRE_READ_RESP:
        memcpy(p->read_resp, buf, got);
        p->read_resp_len = got;
        p->read_resp_seen = 1;
        p->acked = h->psn + 1;
        return 0;
    case TCP_WIRE_ACK:
        p->acked = h->psn + 1;
        return 0;
    case TCP_WIRE_NAK:
        p->naked = h->syndrome ? h->syndrome : 255;
        p->nak_psn = h->psn;
        return 0;
    case TCP_WIRE_DISCONNECT:
        p->closed = 1;
        return 0;
    default:
        return 0;
    }
}

/* Read and handle one frame before the deadline: 0, -ETIMEDOUT or -ECONNRESET. */
static int raw_step(struct raw_peer *p, double deadline)
{
    static uint8_t buf[65536];
    struct tcp_wire_hdr h;
    uint32_t got = 0;
    int err;

    if (p->closed)
        return -ECONNRESET;
    err = read_frame(p->fd, &h, buf, sizeof(buf), &got, deadline);
    if (err == -ETIMEDOUT)
        return err;
    if (err || on_frame(p, &h, buf, got)) {
        p->closed = 1;
        return -ECONNRESET;
    }
    return 0;
}

int raw_pump(struct raw_peer *p, int ms)
{
    double deadline = raw_now_ms() + ms;
    int err;

    while ((err = raw_step(p, deadline)) == 0)
        ;
    return err == -ETIMEDOUT ? 0 : err;
}

int raw_wait_psn(struct raw_peer *p, uint32_t psn, int ms)
{
    double deadline = raw_now_ms() + ms;

    for (;;) {
        if (p->naked && p->nak_psn == psn)
            return p->naked;
        if ((int32_t)(p->acked - (psn + 1)) >= 0)
            return 0;
        if (p->closed || p->naked)
            return -ECONNRESET;
        if (raw_step(p, deadline) == -ETIMEDOUT)
            return -ETIMEDOUT;
    }
}

int raw_write(struct raw_peer *p, uint64_t raddr, uint32_t rkey, int with_imm, uint32_t imm,
              const void *buf, uint32_t len, uint32_t *psn)
{
    *psn = p->tx_psn++;
    return raw_send_frame(p->fd, TCP_WIRE_WRITE, with_imm ? TCP_WIRE_F_IMM : 0, 0, len, *psn, raddr,
                          rkey, with_imm ? imm : 0, buf, len);
}

int raw_read_req(struct raw_peer *p, uint64_t raddr, uint32_t rkey, uint32_t len, uint32_t *psn)
{
    *psn = p->tx_psn++;
    p->read_resp_seen = 0;
    return raw_send_frame(p->fd, TCP_WIRE_READ_REQ, 0, 0, 0, *psn, raddr, rkey, len, NULL, 0);
}

int raw_send_ctrl(struct raw_peer *p, const void *buf, uint32_t len, uint32_t *psn)
{
    *psn = p->tx_psn++;
    return raw_send_frame(p->fd, TCP_WIRE_SEND, 0, 0, len, *psn, 0, 0, 0, buf, len);
}

int raw_listen(int *port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM, 0), err;

    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 4) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0) {
        err = -errno;
        close(fd);
        return err;
    }
    *port = ntohs(sin.sin_port);
    return fd;
}

/* Append one frame (header in network order, then payload) to buf at *off. */
static void frame_put(uint8_t *buf, size_t *off, unsigned type, uint32_t psn, const void *payload,
                      uint32_t len)
{
    struct tcp_wire_hdr h;

    memset(&h, 0, sizeof(h));
    h.magic = htonl(TCP_WIRE_MAGIC);
    h.version = TCP_WIRE_VERSION;
    h.type = (uint8_t)type;
    h.len = htonl(len);
    h.psn = htonl(psn);
    memcpy(buf + *off, &h, sizeof(h));
    memcpy(buf + *off + sizeof(h), payload, len);
    *off += sizeof(h) + len;
}

int raw_accept_then_send(int lfd, const struct exs_wire_hello *h, const void *ctrl,
                         uint32_t ctrl_len, int ms)
{
    uint8_t buf[2 * TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX + 4096];
    uint8_t acc[TCP_WIRE_CONN_LEN + sizeof(*h)];
    struct tcp_wire_conn c = {.rnr_retry = 7, .rnr_timer_ms = 0};
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    struct tcp_wire_hdr fh;
    uint32_t got = 0;
    size_t off = 0;
    int fd, err, one = 1;

    if (ctrl_len > 4096)
        return -EINVAL;
    if (poll(&pfd, 1, ms) != 1)
        return -ETIMEDOUT;
    fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return -errno;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    err = read_frame(fd, &fh, buf, sizeof(buf), &got, raw_now_ms() + ms);
    if (!err && fh.type != TCP_WIRE_CONN_REQ)
        err = -EPROTO;
    if (!err) {
        memcpy(acc, &c, sizeof(c));
        memcpy(acc + TCP_WIRE_CONN_LEN, h, sizeof(*h));
        frame_put(buf, &off, TCP_WIRE_CONN_ACCEPT, 0, acc, sizeof(acc));
        frame_put(buf, &off, TCP_WIRE_SEND, 0, ctrl, ctrl_len);
        err = raw_write_all(fd, buf, off);
    }
    if (err) {
        close(fd);
        return err;
    }
    return fd;
}

int raw_connect_then_send(struct raw_peer *p, int port, const struct exs_wire_hello *h,
                          const void *ctrl, uint32_t ctrl_len, int ms)
{
    uint8_t buf[2 * TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX + 4096];
    uint8_t req[TCP_WIRE_CONN_LEN + sizeof(*h)];
    struct tcp_wire_conn c = {.rnr_retry = 7, .rnr_timer_ms = 0};
    size_t off = 0;
    int err;

    if (ctrl_len > 4096)
        return -EINVAL;
    memset(p, 0, sizeof(*p));
    p->fd = raw_tcp_connect(port);
    if (p->fd < 0)
        return p->fd;
    memcpy(req, &c, sizeof(c));
    memcpy(req + TCP_WIRE_CONN_LEN, h, sizeof(*h));
    frame_put(buf, &off, TCP_WIRE_CONN_REQ, 0, req, sizeof(req));
    frame_put(buf, &off, TCP_WIRE_SEND, p->tx_psn++, ctrl, ctrl_len);
    err = raw_write_all(p->fd, buf, off);
    if (err)
        return err;
    err = raw_read_accept(p, ms);
    if (err)
        return err;
    return 0;
}
