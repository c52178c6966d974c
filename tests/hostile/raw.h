/* SPDX-License-Identifier: MIT */
/* A raw peer speaking tcp provider frames and the libexs protocol by hand (tests, fuzzing). */
#ifndef EXS_TESTS_HOSTILE_RAW_H
#define EXS_TESTS_HOSTILE_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "exs/prov/tcp/tcp_wire.h"
#include "exs/proto/wire.h"

#define RAW_MAX_KEYS 64

/* A remote buffer the server named on this connection (ring, ADVERT or ANNOUNCE). */
struct raw_key {
    uint64_t addr;
    uint32_t len;
    uint32_t rkey;
    uint32_t id;  /* ADVERT id (tag) */
    uint64_t seq; /* ADVERT / ANNOUNCE message number */
};

struct raw_peer {
    int fd;
    uint32_t tx_psn;            /* our next request's sequence number */
    uint32_t rx_psn;            /* the server's next request's sequence number */
    uint32_t acked;             /* highest of our psns the server acknowledged, +1 */
    int naked;                  /* a NAK arrived: its syndrome (connection over) */
    uint32_t nak_psn;           /* ... for this psn */
    int closed;                 /* EOF or reset seen */
    int rejected;               /* CONN_REJECT seen */
    int mute;                   /* read frames but answer none (mid-frame attacker) */
    int stall_reads;            /* answer no READ request, and nothing after the first
                                 * (mute): its announced messages can never be read */
    struct exs_wire_hello peer; /* the server's hello (network order, as received) */
    uint32_t ring_rkey;         /* the server's ring key, wherever it came from */
    struct raw_key adverts[RAW_MAX_KEYS];
    unsigned n_adverts;
    struct raw_key announces[RAW_MAX_KEYS];
    unsigned n_announces;
    uint8_t data[65536]; /* payload of the last data WRITE the server sent us */
    uint32_t data_len;
    unsigned data_msgs;              /* data WRITEs (with immediate) received */
    uint8_t acc_pd[TCP_WIRE_PD_MAX]; /* the acceptor's private data (its hello first) */
    uint32_t acc_pd_len;
    uint8_t sess_key[EXS_WIRE_SESSION_KEY_LEN]; /* the server's SESSION key (K_B, §9.2) */
    int sess_keyed;                             /* ... came */
    uint64_t sess_token;      /* the session's token: what a resume hello carries */
    uint8_t read_resp[65536]; /* payload of the last READ_RESP */
    uint32_t read_resp_len;
    int read_resp_seen;
    struct exs_wire_trace trace; /* the last TRACE answer the server sent (as received) */
    unsigned trace_answers;      /* TRACE answers received */
};

double raw_now_ms(void);
/* A free loopback TCP port (bound and released: the caller binds it soon after). */
int raw_free_port(void);
/* TCP connect to 127.0.0.1:port (blocking, NODELAY); fd or -errno. */
int raw_tcp_connect(int port);
/* Write all of buf; 0 or -errno. */
int raw_write_all(int fd, const void *buf, size_t len);
/* One frame: header fields in host order, payload copied after the header. */
int raw_send_frame(int fd, unsigned type, unsigned flags, unsigned syndrome, uint32_t len,
                   uint32_t psn, uint64_t raddr, uint32_t rkey, uint32_t imm, const void *payload,
                   size_t payload_len);
/* The hello a well-behaved library peer of this sock_type (1 STREAM, 2 SEQPACKET) sends. */
void raw_hello_default(struct exs_wire_hello *h, unsigned sock_type);
/* CONN_REQ carrying pd (the hello, or anything else) as private data. */
int raw_send_conn_req(int fd, const void *pd, uint32_t pd_len);

/* A loopback TCP listener on a free port: its fd (*port set), or -errno. */
int raw_listen(int *port);
/* Hostile acceptor: accept one connection on lfd, read its CONN_REQ (up to ms), then write
 * CONN_ACCEPT with hello h and a SEND of the records in ctrl, in one write, so that the
 * connector's provider sees both at once. The accepted fd (left open), or -errno. */
int raw_accept_then_send(int lfd, const struct exs_wire_hello *h, const void *ctrl,
                         uint32_t ctrl_len, int ms);

/* Hostile connector: connect to port and write CONN_REQ with hello h and a SEND of the
 * records in ctrl (psn 0) in one write, before any answer, so that the acceptor's
 * provider has both at once; then wait up to ms for the answer. 0 accepted (p->peer
 * filled, p->fd open), -ECONNREFUSED rejected, -ECONNRESET closed, -ETIMEDOUT. */
int raw_connect_then_send(struct raw_peer *p, int port, const struct exs_wire_hello *h,
                          const void *ctrl, uint32_t ctrl_len, int ms);

/* Connect and send CONN_REQ with hello h; wait up to ms for CONN_ACCEPT.
 * 0 accepted (p->peer filled), -ECONNREFUSED rejected, -ECONNRESET closed, -ETIMEDOUT. */
int raw_open(struct raw_peer *p, int port, const struct exs_wire_hello *h, int ms);
void raw_close(struct raw_peer *p);
/* Connect and send CONN_REQ with private data pd (anything), wait up to ms for the answer;
 * no record is sent after. 0 accepted (p->acc_pd, p->peer), or as raw_open. */
int raw_open_pd(struct raw_peer *p, int port, const void *pd, uint32_t pd_len, int ms);
/* Pump until the server's ring key is known (hello in v1, its RING record in v2). */
int raw_wait_ring(struct raw_peer *p, int ms);
/* Read and handle frames for up to ms (0: those already there; returns earlier once
 * p->closed): ACKs the server's requests, records keys from control records, answers
 * nothing else. 0, or -ECONNRESET. */
int raw_pump(struct raw_peer *p, int ms);
/* Pump until our request psn is acknowledged (0), refused (the NAK syndrome, > 0),
 * the connection ends (-ECONNRESET) or ms pass (-ETIMEDOUT). */
int raw_wait_psn(struct raw_peer *p, uint32_t psn, int ms);
/* RDMA WRITE (with immediate when with_imm); returns the request's psn via *psn. */
int raw_write(struct raw_peer *p, uint64_t raddr, uint32_t rkey, int with_imm, uint32_t imm,
              const void *buf, uint32_t len, uint32_t *psn);
/* RDMA READ request of len bytes; *psn as above; the response lands in p->read_resp. */
int raw_read_req(struct raw_peer *p, uint64_t raddr, uint32_t rkey, uint32_t len, uint32_t *psn);
/* A SEND of control records (the payload as given). */
int raw_send_ctrl(struct raw_peer *p, const void *buf, uint32_t len, uint32_t *psn);
/* Parse control records of a SEND the server made; records keys. -EPROTO if malformed. */
int raw_parse_ctrl(struct raw_peer *p, const uint8_t *buf, uint32_t len);

#endif
