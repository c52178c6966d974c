/* SPDX-License-Identifier: MIT */
/* The tcp provider's frame format on the TCP byte stream (spec/provider-tcp.md). */
#ifndef EXS_PROV_TCP_TCP_WIRE_H
#define EXS_PROV_TCP_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every frame is a 32-byte header followed by exactly hdr.len payload bytes.
 * All multi-byte fields are in network byte order (big endian).
 *
 *   off size field     meaning
 *   0   4    magic     TCP_WIRE_MAGIC ("EXST")
 *   4   1    version   TCP_WIRE_VERSION
 *   5   1    type      TCP_WIRE_* frame type
 *   6   1    flags     TCP_WIRE_F_*
 *   7   1    syndrome  NAK: TCP_WIRE_SYN_*; 0 otherwise
 *   8   4    len       payload bytes following the header
 *   12  4    psn       request sequence number (SEND, WRITE, READ_REQ, READ_RESP)
 *                      or the acknowledged / refused sequence number (ACK, NAK)
 *   16  8    raddr     WRITE, READ_REQ: target virtual address; 0 otherwise
 *   24  4    rkey      WRITE, READ_REQ: target region key; 0 otherwise
 *   28  4    imm       SEND/WRITE with TCP_WIRE_F_IMM: immediate data;
 *                      READ_REQ: requested length; 0 otherwise
 */
#define TCP_WIRE_MAGIC   0x45585354u /* "EXST" */
#define TCP_WIRE_VERSION 1u
#define TCP_WIRE_HDR_LEN 32u

enum tcp_wire_type {
    TCP_WIRE_CONN_REQ = 1,    /* active -> passive: tcp_wire_conn + private data */
    TCP_WIRE_CONN_ACCEPT = 2, /* passive -> active: tcp_wire_conn + private data */
    TCP_WIRE_CONN_REJECT = 3, /* passive -> active: private data only; then close */
    TCP_WIRE_SEND = 4,        /* payload consumed by one posted receive */
    TCP_WIRE_WRITE = 5,       /* payload placed at raddr/rkey; F_IMM also consumes a receive */
    TCP_WIRE_READ_REQ = 6,    /* no payload; imm = length to read at raddr/rkey */
    TCP_WIRE_READ_RESP = 7,   /* payload = the data read; psn = the READ_REQ's psn */
    TCP_WIRE_ACK = 8,         /* no payload; every request with sequence <= psn is done */
    TCP_WIRE_NAK = 9,         /* no payload; request psn failed with syndrome; earlier ones done */
    TCP_WIRE_DISCONNECT = 10, /* no payload; orderly end of the connection */
    TCP_WIRE_TYPE_MAX = 10,
};

enum {
    TCP_WIRE_F_IMM = 1u << 0, /* SEND, WRITE: imm carries immediate data */
    /* DISCONNECT: the sender's endpoint was destroyed (ep_destroy): it closed for good,
     * no path failed (the receiver's DISCONNECTED carries EXS_PROV_CM_F_PEER_CLOSED) */
    TCP_WIRE_F_CLOSED = 1u << 1,
    TCP_WIRE_F_ALL = TCP_WIRE_F_IMM | TCP_WIRE_F_CLOSED,
};

/* NAK syndromes: the requester's work request completes with the matching status. */
enum tcp_wire_syndrome {
    TCP_WIRE_SYN_NONE = 0,
    TCP_WIRE_SYN_RNR_EXC = 1, /* no receive posted after rnr_retry retries -> RNR_RETRY_EXC_ERR */
    TCP_WIRE_SYN_REM_ACCESS = 2, /* rkey / bounds / rights / deregistered -> REM_ACCESS_ERR */
    TCP_WIRE_SYN_REM_INV = 3,    /* SEND longer than the receive buffer -> REM_INV_REQ_ERR */
    TCP_WIRE_SYN_REM_OP = 4, /* responder's local failure (e.g. bad receive sge) -> REM_OP_ERR */
    TCP_WIRE_SYN_MAX = 4,
};

struct tcp_wire_hdr {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint8_t flags;
    uint8_t syndrome;
    uint32_t len;
    uint32_t psn;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t imm;
} __attribute__((packed));

/*
 * CONN_REQ and CONN_ACCEPT payload: this 8-byte block, then private data
 * (len - 8 bytes, at most TCP_WIRE_PD_MAX).
 *
 *   off size field         meaning
 *   0   1    rnr_retry     sender's ep rnr_retry capped by EXS_TCP_RNR_RETRY (0..7,
 *                          7 = forever): how often the peer, as responder, retries
 *                          before NAK RNR_EXC; > 7 is refused
 *   1   1    rnr_timer_ms  sender's ep rnr_timer_ms (0 = default): the peer waits at
 *                          least this long between retries
 *   2   2    reserved      0
 *   4   4    reserved      0
 */
#define TCP_WIRE_CONN_LEN 8u
#define TCP_WIRE_PD_MAX   256u

struct tcp_wire_conn {
    uint8_t rnr_retry;
    uint8_t rnr_timer_ms;
    uint16_t reserved0;
    uint32_t reserved1;
} __attribute__((packed));

_Static_assert(sizeof(struct tcp_wire_hdr) == TCP_WIRE_HDR_LEN, "header size");
_Static_assert(offsetof(struct tcp_wire_hdr, magic) == 0, "magic offset");
_Static_assert(offsetof(struct tcp_wire_hdr, version) == 4, "version offset");
_Static_assert(offsetof(struct tcp_wire_hdr, type) == 5, "type offset");
_Static_assert(offsetof(struct tcp_wire_hdr, flags) == 6, "flags offset");
_Static_assert(offsetof(struct tcp_wire_hdr, syndrome) == 7, "syndrome offset");
_Static_assert(offsetof(struct tcp_wire_hdr, len) == 8, "len offset");
_Static_assert(offsetof(struct tcp_wire_hdr, psn) == 12, "psn offset");
_Static_assert(offsetof(struct tcp_wire_hdr, raddr) == 16, "raddr offset");
_Static_assert(offsetof(struct tcp_wire_hdr, rkey) == 24, "rkey offset");
_Static_assert(offsetof(struct tcp_wire_hdr, imm) == 28, "imm offset");
_Static_assert(sizeof(struct tcp_wire_conn) == TCP_WIRE_CONN_LEN, "conn block size");
_Static_assert(offsetof(struct tcp_wire_conn, rnr_retry) == 0, "rnr_retry offset");
_Static_assert(offsetof(struct tcp_wire_conn, rnr_timer_ms) == 1, "rnr_timer offset");

/*
 * Limits a receiver enforces before acting on a header (anything else ends
 * the connection with a protocol error):
 *   magic, version exact; 1 <= type <= TCP_WIRE_TYPE_MAX; flags & ~F_ALL == 0, F_CLOSED
 *   on DISCONNECT only;
 *   CONN_REQ/CONN_ACCEPT: 8 <= len <= 8 + TCP_WIRE_PD_MAX; CONN_REJECT: len <= PD_MAX;
 *   READ_REQ, ACK, NAK, DISCONNECT: len == 0;
 *   SEND, WRITE, READ_REQ.imm, READ_RESP: len <= the receiver's max_msg_size.
 */

#endif
