/* SPDX-License-Identifier: MIT */
/* The cut-over's session (spec/protocol.md §9.2): its counters, the registry of passive
 * sessions, the keys and proofs, the SESSION record, and the positions a RESUME record
 * carries and is checked against. Layer 3 of spec/proto-layout.md, below resume.c. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/random.h>

#include "exs/proto/proto_int.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/sha256.h"
#include "exs/util/util.h"

/* Process counters of the cut-over, in the set "fallback" beside the engine's (lookups
 * of one set name add up). */
struct exs_resume_counters exs__resume_cnt;

static const struct exs_counter_desc resume_counter_desc[] = {
    EXS_COUNTER(struct exs_resume_counters, fallback_sessions,
                "connections that took a SESSION token (both sides resumable, policy any)"),
    EXS_COUNTER(struct exs_resume_counters, fallback_resume_failures,
                "of those: the path failed mid-stream and the connection was not resumed"),
    EXS_COUNTER(struct exs_resume_counters, fallback_resumes,
                "of those: cut over to the fallback mid-stream and continued (each end counts)"),
    EXS_COUNTER(struct exs_resume_counters, fallback_replayed_bytes,
                "bytes sent again over a new path (STREAM bytes, SEQPACKET messages sent whole "
                "again: sent on the old path, not arrived)"),
    EXS_COUNTER(struct exs_resume_counters, fallback_resume_evicted,
                "of the failures: waiting for the new path, ended because resume_max newer "
                "connections were waiting too (ETIMEDOUT)"),
    EXS_COUNTER(struct exs_resume_counters, fallback_resume_refused,
                "resume requests naming a live session refused on trial (no valid AUTH proof "
                "in time): the connection was not touched"),
};

static struct exs_counter_set resume_cset = {
    .name = "fallback",
    .desc = resume_counter_desc,
    .count = sizeof(resume_counter_desc) / sizeof(resume_counter_desc[0]),
    .base = &exs__resume_cnt,
};

void exs__resume_cset_register(void)
{
    exs__counters_register(&resume_cset);
}

int exs__resume_negotiated(const struct exs_conn *conn)
{
    return conn->p.resumable && (conn->peer.features & EXS_WIRE_FEAT_RESUMABLE);
}

/* The passive side's sessions, found by token when a resume request comes in (a leaf
 * lock: taken alone, or inside a conn->lock). A conn is destroyed on the progress thread
 * only, where requests are handled too, so one found here is alive. */
pthread_mutex_t exs__resume_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct exs_conn *resume_reg;

static void resume_registry_add(struct exs_conn *conn)
{
    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    conn->resume.next = resume_reg;
    resume_reg = conn;
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
}

int exs__resume_forget(struct exs_conn *conn)
{
    int now;

    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    for (struct exs_conn **pp = &resume_reg; *pp; pp = &(*pp)->resume.next)
        if (*pp == conn) {
            *pp = conn->resume.next;
            break;
        }
    now = conn->resume.refs == 0;
    conn->resume.gone = !now;
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    exs__resume_wait_leave(conn); /* (it left RESUMING before: nothing, normally) */
    return now;
}

/* The session named token, or NULL: every entry is compared, without a branch on the
 * bytes (a peer learns nothing from the time a wrong token takes). A conn found is held
 * (resume.refs) until exs__resume_registry_put: its socket may be closed and the conn destroyed
 * by another thread meanwhile, and the finder then frees it. */
struct exs_conn *exs__resume_registry_find(uint64_t token)
{
    uintptr_t found = 0;

    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    for (struct exs_conn *c = resume_reg; c; c = c->resume.next) {
        uint64_t d = c->sess_token ^ token;
        uintptr_t m = (uintptr_t)0 - (uintptr_t)(((d | (0 - d)) >> 63) ^ 1); /* d == 0: ~0 */

        found = (found & ~m) | ((uintptr_t)c & m);
    }
    if (found) /* atomic: written under the lock, but a unit test watches it without */
        __atomic_add_fetch(&((struct exs_conn *)found)->resume.refs, 1, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    return (struct exs_conn *)found;
}

void exs__resume_registry_put(struct exs_conn *conn)
{
    int last;

    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    last = __atomic_sub_fetch(&conn->resume.refs, 1, __ATOMIC_RELEASE) == 0 && conn->resume.gone;
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    if (last)
        exs__conn_free(conn); /* destroyed while we held it */
}

/* len random bytes into buf. 0 or -errno. */
int exs__resume_random(void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len) {
        ssize_t n = getrandom(p, len, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;

            EXS_WARN(PROTO, "session: getrandom failed: %s", strerror(err));
            return -err;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

uint64_t exs__resume_token_of(const uint8_t *kb)
{
    uint8_t d[EXS_SHA256_LEN];
    uint64_t t;

    if (EXS_UNLIKELY(exs__proto_seams.token0_key) &&
        !memcmp(kb, exs__proto_seams.token0_key, EXS_WIRE_SESSION_KEY_LEN))
        return 0; /* test seam (violation.h) */
    exs__sha256(kb, EXS_WIRE_SESSION_KEY_LEN, d);
    memcpy(&t, d, sizeof(t));
    return be64toh(t);
}

void exs__resume_mac(const uint8_t *key, uint8_t label, const uint8_t *nonce_a,
                     const uint8_t *nonce_b, uint8_t *out)
{
    const void *parts[3] = {&label, nonce_a, nonce_b};
    const size_t lens[3] = {1, EXS_WIRE_NONCE_LEN, EXS_WIRE_NONCE_LEN};

    exs__hmac_sha256(key, 2 * EXS_WIRE_SESSION_KEY_LEN, 3, parts, lens, out);
}

void exs__resume_conn_mac(const struct exs_conn *conn, uint8_t label, const uint8_t *nonce_a,
                          const uint8_t *nonce_b, uint8_t out[EXS_SHA256_LEN])
{
    exs__resume_mac(conn->resume.key, label, nonce_a, nonce_b, out);
}

/* Where each side's key lives in conn->resume.key: K_A (the active side's) first. */
static uint8_t *resume_key_of(struct exs_conn *conn, int active)
{
    return conn->resume.key + (active ? 0 : EXS_WIRE_SESSION_KEY_LEN);
}

void exs__resume_established_locked(struct exs_conn *conn)
{
    struct exs_wire_session s = {
        .hdr = {.type = EXS_CTRL_SESSION, .len = htobe16(EXS_WIRE_SESSION_LEN)},
    };
    uint8_t *key = resume_key_of(conn, conn->active);

    if (conn->state != EXS_CONN_CONNECTED)
        return;
    /* the passive side's SEND may have been handled before the active side's event (its
     * hello was not adopted yet): a SESSION it sent needs the bit in that hello */
    if (conn->active && (conn->resume.keys & EXS_RSM_KEY_PEER) && !exs__resume_negotiated(conn)) {
        exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_SESSION,
                             "the peer's hello lacks feature RESUMABLE");
        exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
        return;
    }
    if (!exs__resume_negotiated(conn))
        return;
    /* each side draws its key; the passive side's names the session (a key whose token
     * would be 0 is drawn again) */
    do {
        if (exs__resume_random(key, EXS_WIRE_SESSION_KEY_LEN)) {
            exs__conn_fail_locked(conn, ECONNRESET, "no session key");
            return;
        }
    } while (!conn->active && !exs__resume_token_of(key));
    conn->resume.keys |= EXS_RSM_KEY_OWN;
    memcpy(s.key, key, sizeof(s.key));
    exs__conn_ctrl_append_locked(conn, &s, sizeof(s));
    memset(&s, 0, sizeof(s));
    if (conn->active) {
        if (conn->sess_token) /* the peer's came first: counted now */
            EXS_CNT_INC(exs__resume_cnt.fallback_sessions);
        return;
    }
    conn->sess_token = exs__resume_token_of(key);
    resume_registry_add(conn);
    EXS_CNT_INC(exs__resume_cnt.fallback_sessions);
    EXS_DBG(PROTO, "conn %p: session key sent (token %#" PRIx64 ")", (void *)conn,
            conn->sess_token);
}

int exs__resume_on_session_locked(struct exs_conn *conn, const struct exs_wire_session *s)
{
    uint64_t token = conn->active ? exs__resume_token_of(s->key) : 0;

    /* before the active side's ESTABLISHED event the peer's hello is not adopted yet:
     * its bit is checked then (exs__resume_established_locked) */
    if (!conn->p.resumable || (conn->peer.magic == EXS_WIRE_MAGIC && !exs__resume_negotiated(conn)))
        return exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_SESSION,
                                    "feature RESUMABLE not negotiated");
    if (conn->resume.keys & EXS_RSM_KEY_PEER)
        return exs__proto_violation(conn, EXS_PV_SESSION, EXS_CTRL_SESSION, "a second one");
    if (s->hdr.flags)
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_SESSION, "flags %#x",
                                    s->hdr.flags);
    if (conn->active && !token)
        return exs__proto_violation(conn, EXS_PV_SESSION, EXS_CTRL_SESSION,
                                    "a key whose token is 0");
    memcpy(resume_key_of(conn, !conn->active), s->key, EXS_WIRE_SESSION_KEY_LEN);
    conn->resume.keys |= EXS_RSM_KEY_PEER;
    if (!conn->active)
        return 0; /* K_A: the passive side can check a resume's proof from now on */
    conn->sess_token = token;
    if (conn->state == EXS_CONN_CONNECTED) /* else counted at ESTABLISHED */
        EXS_CNT_INC(exs__resume_cnt.fallback_sessions);
    EXS_DBG(PROTO, "conn %p: session key received (token %#" PRIx64 ")", (void *)conn, token);
    return 0;
}

uint64_t exs__resume_arrived_locked(const struct exs_conn *conn)
{
    /* STREAM: S_r (bytes placed in receives, directly or copied out of the ring) and the
     * bytes still in the ring (a STREAM ring has no skips, §7) */
    if (conn->dp->bytes)
        return conn->rx_seq + (conn->rd_arrived - conn->rd_consumed);
    return conn->rx_seq;
}

void exs__resume_record_locked(const struct exs_conn *conn, struct exs_wire_resume *r)
{
    uint64_t arrived = exs__resume_arrived_locked(conn);

    memset(r, 0, sizeof(*r));
    r->hdr.type = EXS_CTRL_RESUME;
    r->hdr.len = htobe16(EXS_WIRE_RESUME_LEN);
    r->token = htobe64(conn->sess_token);
    if (conn->dp->bytes)
        r->rx_bytes = htobe64(arrived);
    else
        r->rx_msgs = htobe64(arrived);
    r->ring_arrived = htobe64(conn->rd_arrived);
    r->ring_consumed = htobe64(conn->rd_consumed);
}

uint64_t exs__resume_low_locked(const struct exs_conn *conn)
{
    const struct exs_rsm_quiet *q = conn->resume.quiet;

    /* without copies no send ended at its post: resume_tx_done is resume.tx_sig */
    return q ? EXS_MAX(conn->resume.tx_sig, q->floor) : conn->resume_tx_done;
}

int exs__resume_check_locked(struct exs_conn *conn, const struct exs_wire_resume *r)
{
    uint64_t token = be64toh(r->token), msgs = be64toh(r->rx_msgs), bytes = be64toh(r->rx_bytes);
    uint64_t ra = be64toh(r->ring_arrived), rc = be64toh(r->ring_consumed);
    int stream = conn->dp->bytes;
    uint64_t pos = stream ? bytes : msgs;
    /* bytes (STREAM) or messages (SEQPACKET) the peer surely has: past the sends seen
     * completed, or ended at their post with their copies given up (§6.4) */
    uint64_t done = exs__resume_low_locked(conn);
    const char *bad = NULL;

    if (!conn->sess_token)
        bad = "the connection has no session";
    else if (r->hdr.flags)
        bad = "flags set";
    else if (token != conn->sess_token)
        bad = "not our token";
    else if (stream ? msgs != 0 : bytes != 0)
        bad = stream ? "a message position on a stream" : "a byte position on SEQPACKET";
    else if (pos > conn->tx_seq)
        bad = "beyond what we sent";
    else if (pos < done) /* a hostile peer, or a receive completion reported in error
                          * after its NIC acknowledged the write: those bytes are gone
                          * here (completed, handed back), so the resume cannot be whole */
        bad = "below what we saw completed";
    else if (rc > ra || ra > conn->wr_tail || rc < conn->wr_consumed ||
             ra - rc > conn->peer.ring_size)
        /* the peer's ring: what arrived of what we wrote, at least what it reported
         * read, at most a ring's worth unread */
        bad = "ring positions out of range";
    if (bad)
        return exs__proto_violation(
            conn, conn->sess_token && r->hdr.flags ? EXS_PV_RESERVED : EXS_PV_RESUME,
            EXS_CTRL_RESUME, "%s (position %" PRIu64 ", sent %" PRIu64 ", completed %" PRIu64 ")",
            bad, pos, conn->tx_seq, done);
    return 0;
}

/* ---- RESUMING bounded (§9.2, The wait) ----
 * The connections past their old path's drain that wait for the new path, oldest first
 * (resume_waitq), at most resume_max; those evicted from it and not yet ended
 * (resume_evictq), each held (resume.refs) until exs__resume_evict_run ends it without
 * another conn's lock. Both lists, the resume.waiting and resume.evicting flags under the
 * registry's lock. */
static struct exs_list resume_waitq = EXS_LIST_INIT(resume_waitq);
static struct exs_list resume_evictq = EXS_LIST_INIT(resume_evictq);
static uint64_t resume_nwait;
uint32_t exs__resume_nevict; /* also read without the lock (atomic) */

/* conn (its lock held), its old path over, joins the wait; while more than resume_max
 * wait, the oldest is evicted (never conn itself: resume_max is at least 1). */
void exs__resume_wait_join_locked(struct exs_conn *conn)
{
    uint64_t max = __atomic_load_n(&exs__params.resume_max, __ATOMIC_RELAXED);

    if (!max) /* the tunables were never loaded (unit tests) */
        max = UINT64_MAX;
    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    if (!conn->resume.waiting && !conn->resume.evicting) {
        exs_list_add_tail(&resume_waitq, &conn->resume.wait_link);
        conn->resume.waiting = 1;
        resume_nwait++;
        while (resume_nwait > max) {
            struct exs_conn *v =
                exs_list_entry(resume_waitq.next, struct exs_conn, resume.wait_link);

            exs_list_del(&v->resume.wait_link);
            resume_nwait--;
            v->resume.waiting = 0;
            v->resume.evicting = 1; /* for good: it never waits again */
            __atomic_add_fetch(&v->resume.refs, 1, __ATOMIC_RELEASE);
            exs_list_add_tail(&resume_evictq, &v->resume.wait_link);
            __atomic_add_fetch(&exs__resume_nevict, 1, __ATOMIC_RELEASE);
        }
    }
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
}

void exs__resume_wait_leave(struct exs_conn *conn)
{
    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    if (conn->resume.waiting) {
        exs_list_del(&conn->resume.wait_link);
        conn->resume.waiting = 0;
        resume_nwait--;
    }
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
}

/* The next connection evicted from the wait (held: resume.refs), out of the eviction list;
 * NULL when none is. */
struct exs_conn *exs__resume_evict_pop(void)
{
    struct exs_list *n;

    if (!__atomic_load_n(&exs__resume_nevict, __ATOMIC_ACQUIRE))
        return NULL;
    EXS_MUTEX_LOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    n = exs_list_pop_head(&resume_evictq);
    if (n)
        __atomic_sub_fetch(&exs__resume_nevict, 1, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&exs__resume_reg_lock, EXS_LOCK_LEAF);
    return n ? exs_list_entry(n, struct exs_conn, resume.wait_link) : NULL;
}

void exs__resume_sess_fork_child(void)
{
    pthread_mutex_init(&exs__resume_reg_lock, NULL);
    resume_reg = NULL;
    exs_list_init(&resume_waitq);
    exs_list_init(&resume_evictq);
    resume_nwait = 0;
    exs__resume_nevict = 0;
}
