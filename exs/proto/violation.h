/* SPDX-License-Identifier: MIT */
/* Protocol violations: every rule a peer can break has a name, and the one function that
 * ends a connection for breaking it records which (spec/protocol.md §10). */
#ifndef EXS_PROTO_VIOLATION_H
#define EXS_PROTO_VIOLATION_H

#include <stddef.h>
#include <stdint.h>

struct exs_conn;

/*
 * The rules. X(ENUM, "stable-name", "§", "what the peer did"): the names are part of the
 * interface (EXS_SO_PV_REASON, exsctl stat, trace, tests): never renamed or reused; a new
 * rule is appended. spec/protocol.md §10 lists them with the same words.
 */
#define EXS_PV_RULES(X)                                                                            \
    X(CTRL_TRUNCATED, "ctrl-truncated", "5", "a control SEND ends inside a record header")         \
    X(CTRL_LEN, "ctrl-len", "5",                                                                   \
      "a record length below the header, not a multiple of 8, or past the end of the SEND")        \
    X(CTRL_TYPE, "ctrl-type", "5", "a record of an unknown type")                                  \
    X(CTRL_SIZE, "ctrl-size", "5", "a record whose length is not its type's")                      \
    X(RING_ORDER, "ring-order", "2", "the peer's first record is not RING, or a second RING")      \
    X(RESUME_FIRST, "resume-first", "9.2",                                                         \
      "a record or a write before the peer's RESUME on a cut-over's new path")                     \
    X(AUTH, "auth", "9.2", "an AUTH record where none may come")                                   \
    X(SOCK_TYPE, "sock-type", "5",                                                                 \
      "a record of the other socket type (ANNOUNCE, READ_DONE on STREAM; DRAIN, RESIZE on "        \
      "SEQPACKET)")                                                                                \
    X(FEATURE, "feature", "2",                                                                     \
      "a record or flag of a feature not negotiated (TRACE, STRACE, ALIVE's PING, RESUMABLE)")     \
    X(RESERVED, "reserved", "5", "a reserved field or an unknown flag set")                        \
    X(CREDITS, "credits", "3", "credits returned beyond the receives this side posted")            \
    X(ACK_RANGE, "ack-range", "5", "an ACK of ring bytes never written")                           \
    X(ADVERT, "advert", "6, 7",                                                                    \
      "an ADVERT no history gives (STREAM: indirect phase or no bytes; SEQPACKET: message "        \
      "numbers not increasing)")                                                                   \
    X(ADVERTS_MAX, "adverts-max", "6, 7", "more than EXS_WIRE_ADVERTS_MAX usable ADVERTs held")    \
    X(ANNOUNCE, "announce", "6",                                                                   \
      "an ANNOUNCE out of message order, after SHUTDOWN, or inside a fragmented message")          \
    X(ANNOUNCED_MAX, "announced-max", "6", "more than EXS_WIRE_ANNOUNCED_MAX announced messages")  \
    X(READ_DONE, "read-done", "6", "a READ_DONE for no announced send waiting for one")            \
    X(SHUTDOWN, "shutdown", "8",                                                                   \
      "a second SHUTDOWN, one whose count is not what arrived, or one inside a message")           \
    X(DATA_AFTER_SHUTDOWN, "data-after-shutdown", "8", "data after the peer's SHUTDOWN")           \
    X(RING_OVERRUN, "ring-overrun", "6, 7",                                                        \
      "a ring write beyond the space the receiver reported free, or past a STREAM stop")           \
    X(EAGER_SIZE, "eager-size", "6", "an eager message not below eager_max or above the ring")     \
    X(IMM_KIND, "imm-kind", "4", "immediate data of an unknown kind")                              \
    X(DIRECT, "direct", "6, 7", "a direct write that does not fit the receive its tag names")      \
    X(FRAG, "frag", "6.2",                                                                         \
      "a fragmented message broken (the next message before eom, an empty or truncated piece)")    \
    X(BATCH, "batch", "6.1",                                                                       \
      "a batched write with a malformed record or a record count other than its tag")              \
    X(DRAIN, "drain", "7.2", "a DRAIN request or STOPPED answer out of sequence")                  \
    X(RESIZE, "resize", "7.4", "a RESIZE offer out of bounds, or SWITCHED answering no offer")     \
    X(TRACE, "trace", "5.1",                                                                       \
      "a TRACE request out of sequence or beyond the slots, an answer for no request, or "         \
      "times out of order")                                                                        \
    X(SESSION, "session", "9.2", "a SESSION record refused (a second one, a key of token 0)")      \
    X(RESUME, "resume", "9.2",                                                                     \
      "a RESUME where none may come, not naming our session, or with positions no history "        \
      "gives")                                                                                     \
    X(REANNOUNCE, "reannounce", "9.2",                                                             \
      "after a cut, an announced message not announced again, or announced again out of "          \
      "order, with another length, or never announced")                                            \
    X(COMPLETION, "completion", "4", "a receive completion of a kind the protocol never causes")   \
    X(SHM, "shm", "5",                                                                             \
      "an SHM_OFFER or SHM_SWITCH refused (a second one, a SWITCH from the active side "           \
      "without DECLINED or from the passive side with it, before the peer's offer or SWITCH, or "  \
      "after offers that do not match)")

enum exs_pv_rule {
    EXS_PV_NONE = 0,
#define EXS_PV_ENUM_(_e, _n, _s, _d) EXS_PV_##_e,
    EXS_PV_RULES(EXS_PV_ENUM_)
#undef EXS_PV_ENUM_
        EXS_PV_COUNT
};

/* What a violation was found in, besides a control record (exs_wire_ctrl_type, 1..255):
 * the data of a WRITE WITH IMMEDIATE (its immediate data and bytes), or a completion. */
enum {
    EXS_PV_REC_NONE = 0,
    EXS_PV_REC_WRITE = 0x100,      /* a WRITE WITH IMMEDIATE: its immediate data and bytes */
    EXS_PV_REC_COMPLETION = 0x101, /* a receive completion */
};

#define EXS_PV_DETAIL_MAX 96u
/* exs__pv_reason's line, rule and record names included, fits EXS_ERROR_REASON_MAX (160,
 * include/sys/exs.h): the longest name is 19 bytes, a record's 10 */

/* A connection's first violation (the member exs_conn.pv; under conn->lock). */
struct exs_pv_state {
    uint16_t rule;     /* enum exs_pv_rule; EXS_PV_NONE: none */
    uint16_t rec_type; /* the record it was found in (EXS_CTRL_*, EXS_PV_REC_*) */
    uint32_t count;    /* violations found on the connection (only the first is kept) */
    uint64_t t_us;     /* when the first was found (CLOCK_MONOTONIC us) */
    char detail[EXS_PV_DETAIL_MAX];
};

/*
 * The peer broke rule in a record of type rec_type (EXS_CTRL_*, EXS_PV_REC_*); fmt says
 * how (one line, the values that broke it). conn->lock held. The first violation of a
 * connection is kept as its reason, logged at info level and sent to the trace stream;
 * later ones are only counted. Returns -EPROTO, for `return exs__proto_violation(...)`:
 * the caller fails the connection with ECONNRESET as before. Every -EPROTO in exs/proto
 * starts here (scripts/check-pv.sh).
 */
int exs__proto_violation(struct exs_conn *conn, enum exs_pv_rule rule, unsigned rec_type,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The rule's stable name ("ctrl-len"), its description, its spec section; "" / NULL-safe
 * for an unknown value ("none" for EXS_PV_NONE). */
const char *exs__pv_rule_name(unsigned rule);
const char *exs__pv_rule_desc(unsigned rule);
const char *exs__pv_rule_section(unsigned rule);
/* A rule by its name; EXS_PV_NONE when none has it. */
enum exs_pv_rule exs__pv_rule_by_name(const char *name);
/* The name of what a violation was found in: a control record type by name
 * (exs__wire_type_name), "WRITE_IMM", "completion", "" for none. */
const char *exs__pv_rec_name(unsigned rec_type);

/* The reason as one line "RULE RECORD: detail" ("RULE: detail" without a record) into
 * buf (NUL-terminated, cut at size); "" when the connection broke no rule. Takes
 * conn->lock. Returns the length the whole line has (as snprintf). */
size_t exs__pv_reason(struct exs_conn *conn, char *buf, size_t size);
/* The first violation of conn as recorded (takes conn->lock). 0, or -ENOENT for none. */
int exs__pv_get(struct exs_conn *conn, struct exs_pv_state *out);

/* Where violation events go: fn gets one JSON object per recorded violation, from any
 * thread with a conn lock held, so it must only queue (the control endpoint's trace). */
typedef void exs_pv_sink_fn(const char *json, size_t len);
void exs__pv_set_sink(exs_pv_sink_fn *fn);
/* Format conn's violation as the JSON object of the trace event and of exsctl stat's
 * "violation": {"conn","rule","record","detail","count"}; its length (< size), or 0. */
size_t exs__pv_format(const void *conn_id, const struct exs_pv_state *pv, char *buf, size_t size);

/* Violations recorded in this process (every one, first or not). */
uint64_t exs__pv_total(void);

/* Test seams of paths next to the violation checks that no peer reaches on demand (set
 * by tests/unit only; all 0 in a program, and nothing outside the unit tests writes them). */
struct exs_proto_seams {
    /* this many of the next allocations of a pending message (a peer's ANNOUNCE, §6) fail
     * as out of memory: the -ENOMEM pass-through (the connection ends, no rule recorded) */
    uint32_t pending_nomem;
    /* a SESSION key (§9.2) whose token counts as 0, as exs__resume_token_of answers for
     * it: a real one takes a SHA-256 preimage */
    const uint8_t *token0_key;
};
extern struct exs_proto_seams exs__proto_seams;

#endif
