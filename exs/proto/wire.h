/* SPDX-License-Identifier: MIT */
/* The one home of every libexs protocol wire format (spec/protocol.md mirrors it). */
#ifndef EXS_PROTO_WIRE_H
#define EXS_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

/*
 * All multi-byte fields are in network byte order unless stated otherwise.
 * Section numbers (§) refer to spec/protocol.md.
 *
 * Version history:
 *   v1  handshake, credits, ACK, ADVERT, ANNOUNCE/READ_DONE (SEQPACKET rendezvous by
 *       RDMA READ), SHUTDOWN, NOP, KEEPALIVE feature bit; data by WRITE WITH IMMEDIATE.
 *   v2  adds the RING control record: the ring's key travels in it, as each side's first
 *       record after ESTABLISHED (keys are per-connection grants, which need a connected
 *       endpoint); hello.ring_rkey becomes reserved (sent 0, ignored).
 *   v2 + feature BATCH (negotiated in hello.features, no version change): a SEQPACKET
 *       eager WRITE WITH IMMEDIATE may carry several messages, framed by
 *       exs_wire_batch_rec, its immediate tag giving their count (§6.1).
 *   v2 + feature DRAIN (negotiated in hello.features): the STREAM return to direct (§7.2),
 *       the DRAIN control record, sent only to a peer whose hello has the bit.
 *   v2 + feature TRACE (negotiated in hello.features): the TRACE control record (§5.1),
 *       request tracing; sent only to a peer whose hello has the bit.
 *   v2 + feature RESIZE (negotiated in hello.features): STREAM ring autotuning (§7.4),
 *       the RESIZE control record, sent only to a peer whose hello has the bit.
 *   v2 + feature STRACE (with TRACE): TRACE records on a STREAM connection (§5.1), seq
 *       then being the stream offset just past the traced send's last byte.
 *   v2 + feature RESUMABLE (bit 7, sent only by a side whose fallback policy is `any`,
 *       used when both hellos have it): the passive side's SESSION record (§9.2) after
 *       its RING record; the RESUME record (§9.2, 48 bytes: with the receiver's ring
 *       positions for STREAM) after each side's RING on a cut-over's new path.
 *       hello.hflags (byte 37, was reserved 0) bit 0 RESUME marks a cut-over's new path
 *       (with bit 7 only); reject reason 7: a resume hello the listener does not take.
 *       Bit 7 was later redefined (no version change: the feature was new), so that a
 *       resume proves knowledge of keys instead of presenting a bearer token (§9.2): each
 *       side's SESSION record carries a 32-byte key (K_B from the passive side, K_A from
 *       the active side), the token is derived from K_B and never sent at establishment;
 *       the resume connect's private data is exs_wire_resume_req (56 bytes: hello, token,
 *       nonce_A), the accept's exs_wire_resume_acc (56 bytes: hello, nonce_B, MAC_B), and
 *       the active side's first record on the new path is an AUTH record (type 13). The
 *       earlier form (a 16-byte SESSION with the token itself, 48 bytes of resume private
 *       data, no proof) is not understood any more.
 *   v2 + feature ALIVE (bit 9, used when both hellos have it): liveness is answered by the
 *       peer's library: a keepalive probe is a NOP with flag PING (a SEND), answered by a
 *       NOP; only receive completions prove the peer alive (§9.1).
 *   v2 + feature SHM (bit 10, sent only by a side whose shm policy is on and that has an
 *       shm context beside its primary, so not in EXS_WIRE_FEAT_ALL): with both hellos
 *       having it (and bit 7), each side sends an SHM_OFFER record (type 14) after its
 *       SESSION; the passive side answers a matching offer by SHM_SWITCH (type 15), and
 *       the active side then cuts the connection over to shm (§9.2) once the peer's shm
 *       listener proved to be the process it claimed (spec/provider-shm.md), or answers
 *       SHM_SWITCH with flag DECLINED (1) when it stays.
 */
#define EXS_WIRE_VERSION 2u
#define EXS_WIRE_MAGIC   0x4558u /* "EX" */

/* ---- §2 handshake: private data of connect and accept (at most 56 bytes) ---- */

enum exs_wire_sock_type {
    EXS_WIRE_SOCK_STREAM = 1,
    EXS_WIRE_SOCK_SEQPACKET = 2,
};

enum {                                    /* exs_wire_hello.features */
       EXS_WIRE_FEAT_KEEPALIVE = 1u << 0, /* answers zero-byte WRITE probes (every RC peer does) */
       EXS_WIRE_FEAT_READ = 1u << 1,      /* may be asked to serve RDMA READ of announced buffers */
       EXS_WIRE_FEAT_BATCH = 1u << 2,     /* splits SEQPACKET batched ring writes (§6.1) */
       EXS_WIRE_FEAT_DRAIN = 1u << 3,     /* STREAM: understands DRAIN records (§7.2) */
       EXS_WIRE_FEAT_TRACE = 1u << 4,     /* understands and answers TRACE records (§5.1) */
       EXS_WIRE_FEAT_RESIZE = 1u << 5,    /* STREAM: understands RESIZE records (§7.4) */
       EXS_WIRE_FEAT_FRAG = 1u << 6,      /* SEQPACKET: takes a direct message in several WWIs,
                                           * eom on the last only (§6.2) */
       EXS_WIRE_FEAT_RESUMABLE = 1u << 7, /* may be cut over to another path (§9.2); sent only
                                           * by a side with fallback policy `any`, so it is
                                           * not in EXS_WIRE_FEAT_ALL */
       EXS_WIRE_FEAT_STRACE = 1u << 8, /* STREAM: TRACE records on a stream (§5.1), with TRACE */
       EXS_WIRE_FEAT_ALIVE = 1u << 9,  /* answers a NOP with flag PING by a NOP; probes so
                                        * and counts only receives as alive (§9.1) */
       EXS_WIRE_FEAT_SHM = 1u << 10,   /* may be cut over to shared memory on one host
                                        * (SHM_OFFER, SHM_SWITCH; §9.2); not in
                                        * EXS_WIRE_FEAT_ALL */
       EXS_WIRE_FEAT_ALL = EXS_WIRE_FEAT_KEEPALIVE | EXS_WIRE_FEAT_READ | EXS_WIRE_FEAT_BATCH |
                           EXS_WIRE_FEAT_DRAIN | EXS_WIRE_FEAT_TRACE | EXS_WIRE_FEAT_RESIZE |
                           EXS_WIRE_FEAT_FRAG | EXS_WIRE_FEAT_STRACE | EXS_WIRE_FEAT_ALIVE,
};

struct exs_wire_hello {
    uint16_t magic;     /* EXS_WIRE_MAGIC */
    uint8_t version;    /* EXS_WIRE_VERSION */
    uint8_t sock_type;  /* exs_wire_sock_type; must equal the peer's */
    uint16_t features;  /* EXS_WIRE_FEAT_*; the connection uses the intersection */
    uint16_t credits;   /* receives pre-posted for the peer = initial send credits */
    uint32_t ctrl_size; /* bytes of each of those receive buffers (largest SEND accepted) */
    uint32_t ring_size; /* bytes of the hidden receive ring (0: none) */
    uint64_t ring_addr; /* its address, for RDMA WRITE WITH IMMEDIATE */
    uint32_t ring_rkey; /* reserved since v2: sent 0, ignored (the key comes in RING) */
    uint32_t eager_max; /* largest message the sender may write eagerly into the ring */
    uint32_t max_msg;   /* largest message the sender of this hello accepts (0: no limit) */
    uint8_t xfer_mode;  /* EXS_XFER_* of the sender (informational for the peer) */
    uint8_t hflags;     /* EXS_WIRE_HELLO_F_* (0 before the cut-over; unknown bits ignored) */
    uint16_t reserved1;
} __attribute__((packed));
#define EXS_WIRE_HELLO_LEN 40u

enum {                                    /* exs_wire_hello.hflags */
       EXS_WIRE_HELLO_F_RESUME = 1u << 0, /* connect only: the new path of a cut-over connection
                                           * (§9.2), its first record a RESUME; needs feature
                                           * bit 7 in the same hello (else reason 6) */
};

/* The resume proof (§9.2): keys and nonces. */
#define EXS_WIRE_SESSION_KEY_LEN 32u /* K_A, K_B: each side's random key (SESSION record) */
#define EXS_WIRE_NONCE_LEN       8u  /* nonce_A, nonce_B: fresh random per resume attempt */
#define EXS_WIRE_MAC_B_LEN       8u  /* the passive side's proof: a truncated HMAC */
#define EXS_WIRE_MAC_A_LEN       32u /* the active side's proof (AUTH): a whole HMAC */
/* The one-byte labels that keep the two proofs apart (the first byte HMACed). */
#define EXS_WIRE_AUTH_LABEL_A    'A'
#define EXS_WIRE_AUTH_LABEL_B    'B'

/* The private data of a resume connect (§9.2): the hello (flag RESUME, feature bit 7),
 * the token that names the connection to resume (the first 8 bytes of SHA-256(K_B), never
 * all zero) and the active side's fresh nonce_A. */
struct exs_wire_resume_req {
    struct exs_wire_hello hello;
    uint64_t token;                      /* network order */
    uint8_t nonce_a[EXS_WIRE_NONCE_LEN]; /* random, new per attempt */
} __attribute__((packed));
#define EXS_WIRE_RESUME_PD_LEN 56u

/* The private data of the accept of a resume (§9.2): the passive side's hello for the new
 * path, its fresh nonce_B and MAC_B = the first 8 bytes of HMAC-SHA256(K_A || K_B,
 * 'B' || nonce_A || nonce_B). The active side checks MAC_B before it sends anything. */
struct exs_wire_resume_acc {
    struct exs_wire_hello hello;
    uint8_t nonce_b[EXS_WIRE_NONCE_LEN];
    uint8_t mac_b[EXS_WIRE_MAC_B_LEN];
} __attribute__((packed));
#define EXS_WIRE_RESUME_ACC_LEN 56u

/* Reject reason: private data of a reject is one exs_wire_reject. */
enum exs_wire_reject_reason {
    EXS_WIRE_REJ_VERSION = 1,   /* unknown magic or version */
    EXS_WIRE_REJ_SOCK_TYPE = 2, /* STREAM vs SEQPACKET mismatch */
    EXS_WIRE_REJ_BACKLOG = 3,   /* listener's backlog full */
    EXS_WIRE_REJ_RESOURCES = 4, /* the passive side could not allocate the connection */
    EXS_WIRE_REJ_CLOSING = 5,   /* listener is being closed */
    EXS_WIRE_REJ_HELLO = 6,     /* a hello field out of range (§2 lists the rules) */
    EXS_WIRE_REJ_RESUME = 7,    /* a resume hello (§9.2) the listener does not take */
};

/* Bounds of a peer's hello (§2). */
#define EXS_WIRE_CTRL_SIZE_MAX (1u << 16)
#define EXS_WIRE_RING_SIZE_MAX (1u << 30)

struct exs_wire_reject {
    uint16_t magic;  /* EXS_WIRE_MAGIC */
    uint8_t version; /* the rejecter's EXS_WIRE_VERSION */
    uint8_t reason;  /* exs_wire_reject_reason */
} __attribute__((packed));
#define EXS_WIRE_REJECT_LEN 4u

/* ---- §4 immediate data of WRITE WITH IMMEDIATE (32 bits, host order in the cqe) ---- */
/*
 *   bits   field    meaning
 *   31-30  kind     EXS_IMM_DIRECT: into the buffer of the ADVERT at the head
 *                   EXS_IMM_INDIRECT: into the ring at the writer's tail
 *   29     eom      SEQPACKET: last piece of a message; STREAM: 0
 *   28     trunc    SEQPACKET direct: the message was longer than the advert (cut)
 *   27-16  credits  receives the writer re-posted for the peer since its last report
 *   15-0   tag      DIRECT: low 16 bits of the ADVERT id; INDIRECT: 0, or SEQPACKET with
 *                   feature BATCH: the number of exs_wire_batch_rec messages the write
 *                   carries (§6.1); STREAM: always 0 (a batch is plain stream bytes)
 */
#define EXS_IMM_KIND_SHIFT    30
#define EXS_IMM_KIND_MASK     0x3u
#define EXS_IMM_DIRECT        0u
#define EXS_IMM_INDIRECT      1u
#define EXS_IMM_EOM           (1u << 29)
#define EXS_IMM_TRUNC         (1u << 28)
#define EXS_IMM_CREDITS_SHIFT 16
#define EXS_IMM_CREDITS_MAX   0xfffu
#define EXS_IMM_TAG_MASK      0xffffu

static inline uint32_t exs_imm_make(unsigned kind, unsigned flags, unsigned credits, unsigned tag)
{
    return (kind & EXS_IMM_KIND_MASK) << EXS_IMM_KIND_SHIFT | flags |
           (credits & EXS_IMM_CREDITS_MAX) << EXS_IMM_CREDITS_SHIFT | (tag & EXS_IMM_TAG_MASK);
}
static inline unsigned exs_imm_kind(uint32_t imm)
{
    return imm >> EXS_IMM_KIND_SHIFT & EXS_IMM_KIND_MASK;
}
static inline unsigned exs_imm_credits(uint32_t imm)
{
    return imm >> EXS_IMM_CREDITS_SHIFT & EXS_IMM_CREDITS_MAX;
}
static inline unsigned exs_imm_tag(uint32_t imm)
{
    return imm & EXS_IMM_TAG_MASK;
}

/* ---- §6.1 SEQPACKET batched ring write (feature EXS_WIRE_FEAT_BATCH) ---- */
/*
 * An INDIRECT write whose immediate tag is n (1..65535) holds n messages back to back,
 * each one record: this header, then len payload bytes, then zero padding up to a
 * multiple of 8. The write's length is exactly the sum of its records. The write as a
 * whole takes ring space like one eager message of that length (64-byte slots, never
 * wraps). Every len is below the receiver's eager_max; reserved is 0.
 */
struct exs_wire_batch_rec {
    uint32_t len;      /* payload bytes of this message */
    uint32_t reserved; /* 0 */
} __attribute__((packed));
#define EXS_WIRE_BATCH_REC_LEN  8u
#define EXS_WIRE_BATCH_MAX_MSGS EXS_IMM_TAG_MASK /* messages in one batched write */

/* Bytes of the record carrying a message of len bytes. */
static inline uint32_t exs_wire_batch_rec_size(uint32_t len)
{
    return EXS_WIRE_BATCH_REC_LEN + ((len + 7u) & ~7u);
}

/* ---- §5 control messages: the payload of a SEND, one or more records back to back ---- */

enum exs_wire_ctrl_type {
    EXS_CTRL_ACK = 1,       /* credits and ring space returned */
    EXS_CTRL_ADVERT = 2,    /* a posted receive buffer the peer may write directly */
    EXS_CTRL_ANNOUNCE = 3,  /* SEQPACKET: a message waiting at the sender, to be READ */
    EXS_CTRL_READ_DONE = 4, /* SEQPACKET: the announced message was read (or dropped) */
    EXS_CTRL_SHUTDOWN = 5,  /* the sender will send no more data (SHUT_WR / close) */
    EXS_CTRL_NOP = 6,       /* carries credits only; breaks credit deadlocks */
    EXS_CTRL_RING = 7,      /* v2: the key of the sender's ring; its first record, once */
    EXS_CTRL_DRAIN = 8,     /* STREAM, feature DRAIN: stop writing the ring / stopped (§7.2) */
    EXS_CTRL_TRACE = 9, /* feature TRACE (+ STRACE on STREAM): a traced send / its times (§5.1) */
    EXS_CTRL_RESIZE = 10,     /* STREAM, feature RESIZE: a new ring region / switched (§7.4) */
    EXS_CTRL_SESSION = 11,    /* feature RESUMABLE: the passive side's session token (§9.2) */
    EXS_CTRL_RESUME = 12,     /* feature RESUMABLE: first record on a new path (§9.2) */
    EXS_CTRL_AUTH = 13,       /* feature RESUMABLE: the active side's proof, first on a new
                               * path, before RING (§9.2) */
    EXS_CTRL_SHM_OFFER = 14,  /* feature SHM: where this side runs (§9.2, shm) */
    EXS_CTRL_SHM_SWITCH = 15, /* feature SHM: the passive side agrees to the switch */
    EXS_CTRL_TYPE_MAX = 15,
};

/* Every record starts with this header; len includes it and is a multiple of 8. */
struct exs_wire_ctrl_hdr {
    uint8_t type;     /* exs_wire_ctrl_type */
    uint8_t flags;    /* per type */
    uint16_t len;     /* bytes of the record including this header */
    uint16_t credits; /* receives re-posted for the peer since the last report */
    uint16_t reserved;
} __attribute__((packed));
#define EXS_WIRE_CTRL_HDR_LEN 8u

/* ACK: ring bytes consumed by the receiver since the connection began (cumulative,
 * modulo 2^64), so the writer knows how much ring space is free. */
struct exs_wire_ack {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t ring_consumed;
} __attribute__((packed));
#define EXS_WIRE_ACK_LEN 16u

enum {                               /* exs_wire_advert.hdr.flags */
       EXS_ADVERT_WAITALL = 1u << 0, /* STREAM: keep at the head until the whole buffer is filled */
};

/* ADVERT (§6 SEQPACKET, §7 STREAM): a user receive buffer the writer may fill directly. */
struct exs_wire_advert {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t addr;  /* start of the receive buffer */
    uint32_t len;   /* its length */
    uint32_t rkey;  /* its key */
    uint64_t seq;   /* STREAM: S_A, expected stream offset; SEQPACKET: message number */
    uint32_t phase; /* STREAM: P_A (even = direct); SEQPACKET: 0 */
    uint32_t id;    /* receiver's advert id; low 16 bits echo in the imm tag */
} __attribute__((packed));
#define EXS_WIRE_ADVERT_LEN 40u

/* ANNOUNCE (§6): SEQPACKET message seq of len bytes waits at addr/rkey for an RDMA READ. */
struct exs_wire_announce {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t addr;
    uint32_t len;
    uint32_t rkey;
    uint64_t seq; /* message number */
} __attribute__((packed));
#define EXS_WIRE_ANNOUNCE_LEN 32u

/* READ_DONE (§6): the announced message seq was consumed; its send may complete. */
struct exs_wire_read_done {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t seq;
} __attribute__((packed));
#define EXS_WIRE_READ_DONE_LEN 16u

/* SHUTDOWN (§8): no data follows; seq = bytes (STREAM) or messages (SEQPACKET) sent in all. */
struct exs_wire_shutdown {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t seq;
} __attribute__((packed));
#define EXS_WIRE_SHUTDOWN_LEN 16u

/* RING (§2): the sender's ring (hello.ring_addr, ring_size) may be written with rkey,
 * by this connection's peer only, for the connection's life. */
struct exs_wire_ring {
    struct exs_wire_ctrl_hdr hdr;
    uint32_t rkey;
    uint32_t reserved; /* 0 */
} __attribute__((packed));
#define EXS_WIRE_RING_LEN 16u

enum { /* exs_wire_drain.hdr.flags */
       EXS_DRAIN_STOPPED =
           1u << 0, /* the data sender's answer; without it: the receiver's request */
};

/* DRAIN (§7.2, STREAM, feature DRAIN). Request (flags 0, from the data receiver): "stop
 * writing my ring; wait for my ADVERTs", sent in indirect phase `phase` when its posted
 * receives outrun the ring; pos = the stream offset just past the ring bytes that had
 * arrived. Answer (EXS_DRAIN_STOPPED, from the data sender): its ring writes of `phase`
 * end at stream offset pos; the next byte goes into an ADVERT. */
struct exs_wire_drain {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t pos;      /* stream offset (see above) */
    uint32_t phase;    /* P_r of the request (odd: an indirect phase) */
    uint32_t reserved; /* 0 */
} __attribute__((packed));
#define EXS_WIRE_DRAIN_LEN 24u

enum {                              /* exs_wire_trace.hdr.flags */
       EXS_TRACE_ANSWER = 1u << 0,  /* the receiver's answer; without it: the sender's request */
       EXS_TRACE_DROPPED = 1u << 1, /* answer: the receiver kept no times for seq (all 0) */
};

/* TRACE (§5.1, feature TRACE; on STREAM also STRACE, seq then being the stream offset just
 * past the traced send's last byte). Times are ns on the writer's trace clock: its
 * CLOCK_MONOTONIC minus a random per-connection epoch, never the host's clock (§5.1).
 * Request (from the data sender, just before message seq, in the same connection's
 * order): t_req = when the request was appended (T1); the other times are 0. Answer
 * (EXS_TRACE_ANSWER, from the data receiver): t_req = when the request's completion was
 * polled (T2), t_arrival = the completion that brought message seq (its write or its
 * ANNOUNCE), t_delivery = its receive handed to the application's event queue, t_answer
 * = when this answer was appended (T3); t_req <= t_arrival <= t_delivery <= t_answer. */
struct exs_wire_trace {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t seq;        /* message number; STREAM: end offset of the send */
    uint64_t t_req;      /* request: T1; answer: T2 */
    uint64_t t_arrival;  /* answer only */
    uint64_t t_delivery; /* answer only */
    uint64_t t_answer;   /* answer only: T3 */
} __attribute__((packed));
#define EXS_WIRE_TRACE_LEN 48u
enum {                                /* exs_wire_resize.hdr.flags */
       EXS_RESIZE_SWITCHED = 1u << 0, /* the data sender's answer; without it: the offer */
};

/* RESIZE (§7.4, STREAM, feature RESIZE). Offer (flags 0, from the ring's owner, the data
 * receiver): "my ring moves to addr/size, write it with rkey"; pos is 0. At most one
 * offer is outstanding, and none while a retired region still holds bytes. Answer
 * (EXS_RESIZE_SWITCHED, from the data sender, sent before any later ring write): ring
 * positions (the cumulative ring byte count that ACK reports) below pos were written into
 * the old region, every later one goes into the new; size echoes the offer, addr and
 * rkey are 0. A position p lives at offset p % size of the region that holds it. */
struct exs_wire_resize {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t addr; /* offer: the new region (aligned to 64); answer: 0 */
    uint32_t size; /* bytes of the new region (multiple of 64) */
    uint32_t rkey; /* offer: its key; answer: 0 */
    uint64_t pos;  /* answer: the first ring position in the new region */
} __attribute__((packed));
#define EXS_WIRE_RESIZE_LEN 32u
/* Smallest region a RESIZE may offer. */
#define EXS_WIRE_RESIZE_MIN (16u * 64u)

/* SESSION (§9.2, feature RESUMABLE, both hellos): sent once by each side, in the SEND
 * that carries its RING record, right after it: the passive side's key K_B, the active
 * side's K_A, each 32 random bytes. The session's token (its name in a resume request) is
 * the first 8 bytes of SHA-256(K_B), never all zero (the passive side draws K_B again).
 * A resume proves knowledge of K_A || K_B without sending them. hdr.flags 0. */
struct exs_wire_session {
    struct exs_wire_ctrl_hdr hdr;
    uint8_t key[EXS_WIRE_SESSION_KEY_LEN];
} __attribute__((packed));
#define EXS_WIRE_SESSION_LEN 40u

/* AUTH (§9.2): the active side's first record on a cut-over's new path, before its RING,
 * in the SEND that carries RING and RESUME: mac = HMAC-SHA256(K_A || K_B, 'A' || nonce_A ||
 * nonce_B) with the nonces of this path's connect and accept. The passive side touches
 * the connection only once it checked out; anywhere else it is a protocol error.
 * hdr.flags 0, hdr.credits 0. */
struct exs_wire_auth {
    struct exs_wire_ctrl_hdr hdr;
    uint8_t mac[EXS_WIRE_MAC_A_LEN];
} __attribute__((packed));
#define EXS_WIRE_AUTH_LEN 40u

/* RESUME (§9.2): the first record of each side on the new path of a cut-over connection
 * after its RING record (the active side's AUTH comes before both): the session's token
 * and what has ARRIVED at the sender of the
 * record over the old path (messages for SEQPACKET, bytes for STREAM; the other field 0),
 * counted after every completion of the old endpoint was drained; for STREAM also its
 * ring positions (bytes arrived in its ring and copied out of it, with the old ring's
 * bytes still to be read: the writer continues from there; 0 for SEQPACKET). Never valid
 * on a connection's first path: there it ends the connection. hdr.flags 0. */
struct exs_wire_resume {
    struct exs_wire_ctrl_hdr hdr;
    uint64_t token;
    uint64_t rx_msgs;       /* SEQPACKET: messages arrived */
    uint64_t rx_bytes;      /* STREAM: bytes arrived */
    uint64_t ring_arrived;  /* STREAM: ring position arrived (rd_arrived) */
    uint64_t ring_consumed; /* STREAM: ring position copied out (rd_consumed) */
} __attribute__((packed));
#define EXS_WIRE_RESUME_LEN 48u

/* SHM_OFFER (§9.2, feature SHM in both hellos): sent once by each side, in the SEND that
 * carries its SESSION, right after it: where it runs. host_id is the kernel's boot id
 * (/proc/sys/kernel/random/boot_id, 16 bytes), netns the inode of its network name space
 * (the shm listeners' names are per name space), uid its effective user, pid its process
 * id, the one its shm listener's credentials must show (big endian). hdr.flags 0. */
struct exs_wire_shm_offer {
    struct exs_wire_ctrl_hdr hdr;
    uint8_t host_id[16];
    uint64_t netns;
    uint32_t uid;
    uint32_t pid;
    uint8_t rsvd[8]; /* 0 */
} __attribute__((packed));
#define EXS_WIRE_SHM_OFFER_LEN 48u

/* SHM_SWITCH (§9.2, feature SHM): the header alone, sent once by the passive side after its
 * SHM_OFFER when the active side's offer matched its own (same host, name space, user):
 * it holds both session keys, so the active side may cut over; hdr.flags 0. The active
 * side's answer when it does not cut over (the peer's shm listener is not the process
 * it claimed, or the connection is shutting down): SHM_SWITCH with flag DECLINED, once,
 * after the passive side's; the passive side then gives up the session's cut-over as
 * the active side did. Anything else (from the active side without DECLINED, DECLINED
 * from the passive side or before its SHM_SWITCH, other flags) is a protocol error. */
#define EXS_WIRE_SHM_SWITCH_LEN EXS_WIRE_CTRL_HDR_LEN
enum { EXS_WIRE_SHM_SWITCH_DECLINED = 1u << 0 }; /* SHM_SWITCH hdr.flags */

/* NOP: the header alone. */
#define EXS_WIRE_NOP_LEN EXS_WIRE_CTRL_HDR_LEN

enum {                         /* NOP hdr.flags */
       EXS_NOP_PING = 1u << 0, /* keepalive probe (feature ALIVE, §9.1): the peer's library
                                * answers with a NOP; from a peer without the feature a
                                * protocol error; other bits ignored */
};

/* Largest control SEND: a batch of records. Receive buffers are at least this big. */
#define EXS_WIRE_CTRL_MAX 512u

/* What one side may make the other hold (§6, §7): announced messages whose READ_DONE has
 * not come (a sender announces no more; a receiver holding more is facing a protocol
 * error), and ADVERTs of receives not yet filled (a receiver advertises no more; a sender
 * holding more usable ones is facing a protocol error). */
#define EXS_WIRE_ANNOUNCED_MAX 1024u
#define EXS_WIRE_ADVERTS_MAX   1024u

_Static_assert(sizeof(struct exs_wire_hello) == EXS_WIRE_HELLO_LEN, "hello size");
_Static_assert(EXS_WIRE_HELLO_LEN <= 56, "hello fits rdma_cm private data");
_Static_assert(offsetof(struct exs_wire_hello, credits) == 6, "hello.credits");
_Static_assert(offsetof(struct exs_wire_hello, ring_addr) == 16, "hello.ring_addr");
_Static_assert(offsetof(struct exs_wire_hello, xfer_mode) == 36, "hello.xfer_mode");
_Static_assert(sizeof(struct exs_wire_reject) == EXS_WIRE_REJECT_LEN, "reject size");
_Static_assert(sizeof(struct exs_wire_ctrl_hdr) == EXS_WIRE_CTRL_HDR_LEN, "ctrl hdr size");
_Static_assert(sizeof(struct exs_wire_ack) == EXS_WIRE_ACK_LEN, "ack size");
_Static_assert(sizeof(struct exs_wire_advert) == EXS_WIRE_ADVERT_LEN, "advert size");
_Static_assert(offsetof(struct exs_wire_advert, seq) == 24, "advert.seq");
_Static_assert(sizeof(struct exs_wire_announce) == EXS_WIRE_ANNOUNCE_LEN, "announce size");
_Static_assert(sizeof(struct exs_wire_read_done) == EXS_WIRE_READ_DONE_LEN, "read_done size");
_Static_assert(sizeof(struct exs_wire_shutdown) == EXS_WIRE_SHUTDOWN_LEN, "shutdown size");
_Static_assert(sizeof(struct exs_wire_ring) == EXS_WIRE_RING_LEN, "ring size");
_Static_assert(sizeof(struct exs_wire_drain) == EXS_WIRE_DRAIN_LEN, "drain size");
_Static_assert(sizeof(struct exs_wire_trace) == EXS_WIRE_TRACE_LEN, "trace size");
_Static_assert(offsetof(struct exs_wire_trace, t_answer) == 40, "trace.t_answer");
_Static_assert(sizeof(struct exs_wire_resize) == EXS_WIRE_RESIZE_LEN, "resize size");
_Static_assert(sizeof(struct exs_wire_session) == EXS_WIRE_SESSION_LEN, "session size");
_Static_assert(sizeof(struct exs_wire_auth) == EXS_WIRE_AUTH_LEN, "auth size");
_Static_assert(sizeof(struct exs_wire_resume_req) == EXS_WIRE_RESUME_PD_LEN, "resume req size");
_Static_assert(offsetof(struct exs_wire_resume_req, nonce_a) == 48, "resume_req.nonce_a");
_Static_assert(sizeof(struct exs_wire_resume_acc) == EXS_WIRE_RESUME_ACC_LEN, "resume acc size");
_Static_assert(offsetof(struct exs_wire_resume_acc, mac_b) == 48, "resume_acc.mac_b");
_Static_assert(EXS_WIRE_RESUME_PD_LEN <= 56 && EXS_WIRE_RESUME_ACC_LEN <= 56,
               "resume private data fits rdma_cm's 56 bytes");
_Static_assert(sizeof(struct exs_wire_resume) == EXS_WIRE_RESUME_LEN, "resume size");
_Static_assert(offsetof(struct exs_wire_resume, rx_bytes) == 24, "resume.rx_bytes");
_Static_assert(sizeof(struct exs_wire_batch_rec) == EXS_WIRE_BATCH_REC_LEN, "batch rec size");

#endif
