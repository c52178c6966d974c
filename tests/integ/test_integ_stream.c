/* SPDX-License-Identifier: MIT */
/* SOCK_STREAM over the public ES-API: seeded randomized stress in every transfer mode, the
 * statistics of each mode, splitting and coalescing, multi-threaded posting, end of stream. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/util/params.h"
#include "tests/integ/integ.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* ahandles: kind in bits 40.., index below. */
#define ST_SEND          UINT64_C(1)
#define ST_RECV          UINT64_C(2)
#define ST_SHUT          UINT64_C(3)
#define ST_AH(kind, idx) ((exs_ahandle_t)(uintptr_t)(((kind) << 40) | (uint64_t)(idx)))
#define ST_AH_KIND(ah)   ((uint64_t)((uint64_t)(uintptr_t)(ah) >> 40))
#define ST_AH_IDX(ah)    ((uint64_t)((uint64_t)(uintptr_t)(ah) & ((UINT64_C(1) << 40) - 1)))

static const char *const mode_names[] = {"dynamic", "direct-only", "indirect-only"};

/* ---- the stream content: byte o of a stream of seed s is a function of (s, o) ---- */

static uint64_t st_word(uint64_t seed, uint64_t w)
{
    uint64_t z = seed * 0xD1B54A32D192ED03ull ^ w;

    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Write stream bytes [off, off+len) of seed into dst. */
static void st_fill(uint8_t *dst, uint64_t off, size_t len, uint64_t seed)
{
    size_t i = 0;

    while (i < len) {
        uint64_t o = off + i, v = st_word(seed, o >> 3);
        size_t b = (size_t)(o & 7), n = 8 - b < len - i ? 8 - b : len - i;

        memcpy(dst + i, (uint8_t *)&v + b, n);
        i += n;
    }
}

/* The first index i in [0, len) where src[i] is not stream byte off+i, or -1. */
static long st_check(const uint8_t *src, uint64_t off, size_t len, uint64_t seed)
{
    size_t i = 0;

    while (i < len) {
        uint64_t o = off + i, v = st_word(seed, o >> 3);
        size_t b = (size_t)(o & 7), n = 8 - b < len - i ? 8 - b : len - i;

        if (memcmp(src + i, (uint8_t *)&v + b, n) != 0) {
            for (size_t j = 0; j < n; j++) {
                if (src[i + j] != ((uint8_t *)&v)[b + j])
                    return (long)(i + j);
            }
        }
        i += n;
    }
    return -1;
}

/* ---- random numbers ---- */

/* Uniform in (0, 1]. */
static double st_unit(uint64_t *rs)
{
    return (double)((it_rand(rs) >> 11) + 1) / 9007199254740992.0;
}

/* Uniform in [lo, hi]. */
static size_t st_uniform(uint64_t *rs, size_t lo, size_t hi)
{
    return lo + (size_t)(it_rand(rs) % (hi - lo + 1));
}

/* Log-uniform in [1, max]. */
static size_t st_logu(uint64_t *rs, size_t max)
{
    size_t v = (size_t)exp(st_unit(rs) * log((double)max + 1));

    return v < 1 ? 1 : v > max ? max : v;
}

/* The paper's exponential distribution: mean 1 MiB, cut to [1, 4 MiB]. */
static size_t st_expo(uint64_t *rs)
{
    double v = -(double)MiB * log(st_unit(rs));

    return v < 1 ? 1 : v > (double)(4 * MiB) ? 4 * MiB : (size_t)v;
}

/* EXS_TEST_SEED (decimal or 0x hex) or a fixed default. */
static uint64_t st_base_seed(void)
{
    const char *e = getenv("EXS_TEST_SEED");

    if (e && *e)
        return strtoull(e, NULL, 0);
    return 0x57EA5EEDull;
}

static uint64_t st_mix(uint64_t a, uint64_t b)
{
    return st_word(a, b) | 1; /* never 0: xorshift state */
}

/* ---- pairs: one queue, the transfer mode set before listen / connect ---- */

struct st_pair {
    exs_qhandle_t q;
    int lfd, sfd, cfd; /* listener, accepted (receiving) side, connecting (sending) side */
    int mode;
};

static void st_set_mode(int fd, int mode)
{
    int rc = exs_setsockopt(fd, SOL_EXS, EXS_SO_XFER_MODE, &mode, sizeof(mode));

    ck_assert_msg(rc == 0, "exs_setsockopt(EXS_SO_XFER_MODE, %d) = %d errno %d (%s)", mode, rc,
                  errno, strerror(errno));
}

static int st_get_int(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof(v);
    int rc = exs_getsockopt(fd, level, name, &v, &len);

    ck_assert_msg(rc == 0 && len == sizeof(v), "exs_getsockopt(%d, %#x, %d) = %d errno %d (%s)", fd,
                  level, name, rc, errno, strerror(errno));
    return v;
}

/* A connected SOCK_STREAM pair on one queue of depth; the listener (and so the accepted
 * receiver) gets mode, the connecting sender cmode; < 0 leaves the default. */
static void st_pair_open_modes(struct st_pair *p, int mode, int cmode, int depth)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t alen = sizeof(sin);
    exs_event_t ev;

    memset(p, 0, sizeof(*p));
    p->mode = mode;
    p->q = it_qcreate(depth);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    errno = 0;
    p->lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_msg(p->lfd >= 0, "exs_socket(AF_INET, SOCK_STREAM, 0) = %d errno %d (%s)", p->lfd,
                  errno, strerror(errno));
    if (mode >= 0)
        st_set_mode(p->lfd, mode);
    IT_EXPECT_OK(exs_bind(p->lfd, (struct sockaddr *)&sin, sizeof(sin)));
    IT_EXPECT_OK(exs_listen(p->lfd, 16));
    IT_EXPECT_OK(exs_getsockname(p->lfd, (struct sockaddr *)&sin, &alen));
    ck_assert_int_ne(sin.sin_port, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    IT_EXPECT_OK(exs_accept(p->lfd, p->q, IT_AH(0xACC)));
    p->cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_msg(p->cfd >= 0, "exs_socket(SOCK_STREAM) = %d errno %d (%s)", p->cfd, errno,
                  strerror(errno));
    if (cmode >= 0)
        st_set_mode(p->cfd, cmode);
    IT_EXPECT_OK(exs_connect(p->cfd, (struct sockaddr *)&sin, sizeof(sin), p->q, IT_AH(0xC0)));
    it_expect_err(p->q, EXS_EVT_CONNECT, p->cfd, IT_AH(0xC0), 0);
    it_expect_err_at(p->q, EXS_EVT_ACCEPT, p->lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
    p->sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(p->sfd, 0);
    ck_assert_int_eq(st_get_int(p->cfd, SOL_SOCKET, SO_TYPE), SOCK_STREAM);
    ck_assert_int_eq(st_get_int(p->sfd, SOL_SOCKET, SO_TYPE), SOCK_STREAM);
    if (mode >= 0)
        ck_assert_msg(st_get_int(p->sfd, SOL_EXS, EXS_SO_XFER_MODE) == mode,
                      "accepted socket: EXS_SO_XFER_MODE %d, the listener's is %d",
                      st_get_int(p->sfd, SOL_EXS, EXS_SO_XFER_MODE), mode);
}

static void st_pair_open(struct st_pair *p, int mode, int depth)
{
    st_pair_open_modes(p, mode, mode, depth);
}

static void st_pair_close(struct st_pair *p)
{
    if (p->cfd >= 0)
        it_close(p->cfd, p->q);
    if (p->sfd >= 0)
        it_close(p->sfd, p->q);
    if (p->lfd >= 0)
        it_close(p->lfd, p->q);
    p->cfd = p->sfd = p->lfd = -1;
    it_qdelete(p->q);
}

static void st_stats(int fd, struct exs_sock_stats *s)
{
    socklen_t len = sizeof(*s);
    int rc;

    memset(s, 0xA5, sizeof(*s));
    rc = exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, s, &len);
    ck_assert_msg(rc == 0 && len == sizeof(*s), "exs_getsockopt(EXS_SO_STATS) = %d len %u errno %d",
                  rc, (unsigned)len, errno);
}

static const char *st_fmt_stats(const struct exs_sock_stats *s, char *buf, size_t size)
{
    snprintf(buf, size,
             "sent %" PRIu64 " recv %" PRIu64 " direct %" PRIu64 " indirect %" PRIu64
             " switches %" PRIu64 " adverts sent %" PRIu64 " recv %" PRIu64 " discarded %" PRIu64
             " credit stalls %" PRIu64,
             s->bytes_sent, s->bytes_received, s->direct_xfers, s->indirect_xfers, s->mode_switches,
             s->adverts_sent, s->adverts_received, s->adverts_discarded, s->credit_stalls);
    return buf;
}

/* Wait up to ms until the counter at byte offset off of fd's statistics reaches min. */
static uint64_t st_wait_stat_at(int fd, size_t off, const char *name, uint64_t min, int ms,
                                const char *file, int line)
{
    double deadline = it_now_ms() + ms;
    struct exs_sock_stats s;
    uint64_t v;

    for (;;) {
        st_stats(fd, &s);
        memcpy(&v, (const char *)&s + off, sizeof(v));
        if (v >= min)
            return v;
        if (it_now_ms() > deadline)
            ck_abort_msg("%s:%d: fd %d: %s stayed %" PRIu64 ", expected >= %" PRIu64
                         " within %d ms",
                         file, line, fd, name, v, min, ms);
        it_sleep_ms(1);
    }
}
#define ST_WAIT_STAT(fd, member, min)                                                              \
    st_wait_stat_at((fd), offsetof(struct exs_sock_stats, member), #member, (min), 5000, __FILE__, \
                    __LINE__)

/* ---- simple synchronous-style steps on a pair ---- */

/* Post a send of stream bytes [off, off+len) from sb (which holds the stream at its offsets). */
static void st_post_send(struct st_pair *p, struct it_buf *sb, uint64_t off, size_t len,
                         uint64_t idx)
{
    int rc = exs_send(p->cfd, sb->p + off, len, 0, p->q, ST_AH(ST_SEND, idx), sb->mh);

    ck_assert_msg(rc == 0, "exs_send(%zu bytes at stream offset %" PRIu64 ") = %d errno %d (%s)",
                  len, off, rc, errno, strerror(errno));
}

static void st_post_recv(struct st_pair *p, uint8_t *buf, size_t len, int flags, exs_mhandle_t mh,
                         uint64_t idx)
{
    int rc = exs_recv(p->sfd, buf, len, flags, p->q, ST_AH(ST_RECV, idx), mh);

    ck_assert_msg(rc == 0, "exs_recv(%zu bytes, flags %#x) = %d errno %d (%s)", len, flags, rc,
                  errno, strerror(errno));
}

/* Wait for the receive idx on the pair; returns its result (checked: errno 0, 0..len). */
static ssize_t st_wait_recv(struct st_pair *p, uint64_t idx, exs_event_t *out)
{
    exs_event_t ev;

    it_expect_xfer_at(p->q, EXS_EVT_RECV, p->sfd, ST_AH(ST_RECV, idx), IT_ANY_RESULT, 0, &ev,
                      __FILE__, __LINE__);
    ck_assert_msg(ev.exs_evt_u.exs_evt_xfer.exs_evt_result >= 0 &&
                      (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result <=
                          ev.exs_evt_u.exs_evt_xfer.exs_evt_len,
                  "receive %" PRIu64 ": result %zd of a %zu-byte receive", idx,
                  ev.exs_evt_u.exs_evt_xfer.exs_evt_result, ev.exs_evt_u.exs_evt_xfer.exs_evt_len);
    if (out)
        *out = ev;
    return ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
}

/* ======================================================================================
 * 1. Randomized stress
 * ====================================================================================== */

enum { PROF_EXPO, PROF_SMALL, PROF_MIXED };
static const char *const prof_names[] = {"exponential", "small-uniform", "mixed"};

struct st_rop { /* an outstanding receive */
    uint64_t idx;
    size_t aoff; /* offset in the receive arena */
    size_t len;
    int flags;
    int unreg;
};

#define ARENA_SIZE (32 * 4 * MiB + 8 * MiB)
#define ROP_MAX    64

struct st_rfifo {
    struct st_rop op[ROP_MAX];
    unsigned head, count;
    size_t next; /* arena offset of the next allocation */
    /* the next receive, drawn but not yet posted (no room in the arena) */
    int pending, pend_flags, pend_unreg;
    size_t pend_len;
};

/* FIFO allocation of len contiguous bytes of the arena; -1 when there is no room now. */
static long arena_alloc(struct st_rfifo *f, size_t len)
{
    size_t first, at;

    if (f->count == 0)
        f->next = 0;
    if (f->count == ROP_MAX)
        return -1;
    if (f->count == 0) {
        at = 0;
    } else {
        first = f->op[f->head].aoff;
        if (f->next > first) { /* free: [next, ARENA) and [0, first) */
            if (len <= ARENA_SIZE - f->next)
                at = f->next;
            else if (len < first)
                at = 0;
            else
                return -1;
        } else { /* free: [next, first) */
            if (f->next + len < first)
                at = f->next;
            else
                return -1;
        }
    }
    f->next = at + len;
    return (long)at;
}

struct st_stress {
    const char *cfg;
    int mode, profile, run;
    int paced; /* alternate pauses of the sender and of the receiver */
    int delay; /* EXS_EMU_DELAY_US=2000 */
    uint64_t seed, volume;
    /* out: the sender's statistics of the run */
    struct exs_sock_stats stats;
};

static size_t stress_send_size(uint64_t *rs, int profile)
{
    int r;

    switch (profile) {
    case PROF_EXPO:
        return st_expo(rs);
    case PROF_SMALL:
        return st_uniform(rs, 1, 4096);
    default:
        r = (int)(it_rand(rs) % 10);
        if (r < 4)
            return st_expo(rs);
        if (r < 7)
            return st_uniform(rs, 1, 4096);
        return st_logu(rs, 4 * MiB);
    }
}

static size_t stress_recv_size(uint64_t *rs)
{
    int r = (int)(it_rand(rs) % 4);

    if (r < 2)
        return st_logu(rs, 4 * MiB);
    if (r == 2)
        return st_uniform(rs, 1, 4 * MiB);
    return st_uniform(rs, 1, 4096);
}

/* One run on a fresh connection: the client sends volume bytes with up to max_s sends
 * outstanding, then SHUT_WR; the server receives with up to max_r receives outstanding
 * until end of stream. Everything is driven from this thread through one queue. When
 * paced, posting alternates at random between free running, the sender pausing (the
 * receiver gets ahead: ADVERTs) and the receiver pausing (it falls behind: the ring), for
 * 1-5 ms each (3-15 ms with the delay). Sizes and flags come from separate random streams
 * for sends and receives, so both sequences depend on the seed only, not on timing. */
static void stress_run(struct st_stress *c, struct it_buf *sb, struct it_buf *arena)
{
    uint64_t rs = c->seed, ss_rng = st_mix(c->seed, 1), rr_rng = st_mix(c->seed, 2);
    uint64_t hold_rng = st_mix(c->seed, 3);
    int max_s = (int)st_uniform(&rs, 1, 32), max_r = (int)st_uniform(&rs, 1, 32);
    int hold = 0, nholds[3] = {0, 0, 0};
    double hold_end = 0, last_event;
    struct st_pair p;
    struct st_rfifo rf;
    size_t *slen = NULL, slen_cap = 0;
    uint64_t nsend = 0, s_done = 0, sent_off = 0, nrecv = 0, received = 0, n_partial = 0;
    uint64_t n_waitall = 0, max_rlen = 0, n_short = 0;
    int s_out = 0, shut_posted = 0, shut_done = 0, eos = 0;
    struct exs_sock_stats ss, rsst;
    char b1[300], b2[300];
    double t0, ms;

    memset(&rf, 0, sizeof(rf));
    st_fill(sb->p, 0, c->volume, c->seed);
    st_pair_open(&p, c->mode, 256);
    it_context("%s run %d (%s%s, seed %#" PRIx64 ", %d sends / %d receives outstanding)", c->cfg,
               c->run, prof_names[c->profile], c->paced ? ", paced" : "", c->seed, max_s, max_r);
    t0 = last_event = it_now_ms();

    while (!(shut_done && eos && rf.count == 0)) {
        exs_event_t evs[64];
        struct timespec ts = {.tv_sec = IT_TIMEOUT_MS / 1000};
        double now = it_now_ms();
        int n;

        if (c->paced && now >= hold_end) {
            hold = (int)(it_rand(&hold_rng) % 3); /* 0 none, 1 sender paused, 2 receiver */
            hold_end = now + (double)st_uniform(&hold_rng, 1, 5) * (c->delay ? 3 : 1);
            nholds[hold]++;
        }
        /* Sends, then SHUT_WR once everything is posted. */
        while (hold != 1 && sent_off < c->volume && s_out < max_s) {
            size_t len = stress_send_size(&ss_rng, c->profile);
            /* MSG_NOSIGNAL and MSG_DONTWAIT are accepted and change nothing here. */
            int flags = (int)(it_rand(&ss_rng) % 4);

            flags = (flags & 1 ? MSG_NOSIGNAL : 0) | (flags & 2 ? MSG_DONTWAIT : 0);
            exs_mhandle_t mh = it_rand(&ss_rng) % 8 == 0 ? EXS_MHANDLE_UNREGISTERED : sb->mh;
            int rc;

            if (len > c->volume - sent_off)
                len = (size_t)(c->volume - sent_off);
            if (nsend == slen_cap) {
                slen_cap = slen_cap ? 2 * slen_cap : 1024;
                slen = realloc(slen, slen_cap * sizeof(*slen));
                ck_assert_ptr_nonnull(slen);
            }
            rc = exs_send(p.cfd, sb->p + sent_off, len, flags, p.q, ST_AH(ST_SEND, nsend), mh);
            ck_assert_msg(rc == 0,
                          "%s run %d: exs_send #%" PRIu64 " (%zu bytes) = %d errno %d (%s)", c->cfg,
                          c->run, nsend, len, rc, errno, strerror(errno));
            slen[nsend++] = len;
            sent_off += len;
            s_out++;
        }
        if (sent_off == c->volume && !shut_posted) {
            IT_EXPECT_OK(exs_shutdown(p.cfd, SHUT_WR, p.q, ST_AH(ST_SHUT, 0)));
            shut_posted = 1;
        }
        /* Receives, until end of stream was seen. */
        while (hold != 2 && !eos && (int)rf.count < max_r) {
            size_t len;
            long at;
            struct st_rop *op;

            if (!rf.pending) {
                rf.pend_len = stress_recv_size(&rr_rng);
                rf.pend_flags = (it_rand(&rr_rng) % 2 ? MSG_WAITALL : 0) |
                                (it_rand(&rr_rng) % 4 == 0 ? MSG_DONTWAIT : 0);
                rf.pend_unreg = it_rand(&rr_rng) % 8 == 0;
                rf.pending = 1;
            }
            len = rf.pend_len;
            at = arena_alloc(&rf, len);
            if (at < 0)
                break;
            rf.pending = 0;
            op = &rf.op[(rf.head + rf.count) % ROP_MAX];
            op->idx = nrecv++;
            op->aoff = (size_t)at;
            op->len = len;
            op->flags = rf.pend_flags;
            op->unreg = rf.pend_unreg;
            memset(arena->p + op->aoff, IT_GUARD_BYTE, len);
            st_post_recv(&p, arena->p + op->aoff, len, op->flags,
                         op->unreg ? EXS_MHANDLE_UNREGISTERED : arena->mh, op->idx);
            rf.count++;
            n_waitall += !!(op->flags & MSG_WAITALL);
            if (len > max_rlen)
                max_rlen = len;
        }

        if (hold) { /* wake up when the pause ends */
            double left = hold_end - now;

            ts.tv_sec = (time_t)(left / 1000);
            ts.tv_nsec = left <= 0 ? 0 : (long)((left - (double)ts.tv_sec * 1000) * 1e6);
        }
        n = exs_qdequeue(p.q, evs, 64, &ts);
        ck_assert_msg(n >= 0 || errno == EINTR, "exs_qdequeue = %d errno %d", n, errno);
        if (n > 0)
            last_event = it_now_ms();
        ck_assert_msg(n != 0 || it_now_ms() - last_event < IT_TIMEOUT_MS,
                      "%s run %d (seed %#" PRIx64 "): no event for %d ms: sent %" PRIu64 "/%" PRIu64
                      " bytes in %" PRIu64 " sends (%" PRIu64
                      " completed, %d outstanding), shutdown %s, received %" PRIu64
                      " bytes, %u receives outstanding (first: %zu bytes%s)",
                      c->cfg, c->run, c->seed, IT_TIMEOUT_MS, sent_off, c->volume, nsend, s_done,
                      s_out,
                      shut_done     ? "done"
                      : shut_posted ? "posted"
                                    : "not posted",
                      received, rf.count, rf.count ? rf.op[rf.head].len : 0,
                      rf.count && (rf.op[rf.head].flags & MSG_WAITALL) ? ", WAITALL" : "");
        for (int i = 0; i < n; i++) {
            const exs_event_t *ev = &evs[i];
            const exs_evt_xfer_t *x = &ev->exs_evt_u.exs_evt_xfer;
            uint64_t kind = ST_AH_KIND(ev->exs_evt_ahandle), idx = ST_AH_IDX(ev->exs_evt_ahandle);

            if (kind == ST_SEND) {
                ck_assert_msg(ev->exs_evt_type == EXS_EVT_SEND && ev->exs_evt_fd == p.cfd &&
                                  ev->exs_evt_errno == 0,
                              "%s run %d: send #%" PRIu64 ": event type %d fd %d errno %d (%s)",
                              c->cfg, c->run, idx, ev->exs_evt_type, ev->exs_evt_fd,
                              ev->exs_evt_errno, strerror(ev->exs_evt_errno));
                ck_assert_msg(idx == s_done,
                              "%s run %d: send #%" PRIu64 " completed while #%" PRIu64
                              " was the oldest outstanding",
                              c->cfg, c->run, idx, s_done);
                ck_assert_msg(x->exs_evt_result == (ssize_t)slen[idx] &&
                                  x->exs_evt_len == slen[idx],
                              "%s run %d: send #%" PRIu64 " of %zu bytes: result %zd len %zu",
                              c->cfg, c->run, idx, slen[idx], x->exs_evt_result, x->exs_evt_len);
                s_done++;
                s_out--;
            } else if (kind == ST_SHUT) {
                ck_assert_msg(ev->exs_evt_type == EXS_EVT_SHUTDOWN && ev->exs_evt_errno == 0,
                              "%s run %d: shutdown: event type %d errno %d (%s)", c->cfg, c->run,
                              ev->exs_evt_type, ev->exs_evt_errno, strerror(ev->exs_evt_errno));
                ck_assert_msg(s_done == nsend,
                              "%s run %d: SHUTDOWN event before %" PRIu64 " of %" PRIu64
                              " earlier sends completed",
                              c->cfg, c->run, nsend - s_done, nsend);
                shut_done = 1;
            } else {
                struct st_rop *op = &rf.op[rf.head];
                uint8_t *buf = arena->p + op->aoff;
                ssize_t res = x->exs_evt_result;
                long bad;

                ck_assert_msg(
                    kind == ST_RECV && ev->exs_evt_type == EXS_EVT_RECV && ev->exs_evt_fd == p.sfd,
                    "%s run %d: unexpected event type %d fd %d ah %#" PRIx64, c->cfg, c->run,
                    ev->exs_evt_type, ev->exs_evt_fd, (uint64_t)(uintptr_t)ev->exs_evt_ahandle);
                ck_assert_msg(rf.count > 0 && idx == op->idx,
                              "%s run %d: receive #%" PRIu64 " completed while #%" PRIu64
                              " was the oldest outstanding (completions out of posting order)",
                              c->cfg, c->run, idx, rf.count ? op->idx : (uint64_t)-1);
                ck_assert_msg(
                    ev->exs_evt_errno == 0 && res >= 0,
                    "%s run %d: receive #%" PRIu64 " (%zu bytes%s) at stream offset %" PRIu64
                    ": errno %d (%s) result %zd",
                    c->cfg, c->run, idx, op->len, (op->flags & MSG_WAITALL) ? ", WAITALL" : "",
                    received, ev->exs_evt_errno, strerror(ev->exs_evt_errno), res);
                ck_assert_msg(x->exs_evt_buf == buf && x->exs_evt_len == op->len &&
                                  !(x->exs_evt_flags & MSG_TRUNC),
                              "%s run %d: receive #%" PRIu64 ": event buf/len/flags %p/%zu/%#x, "
                              "posted %p/%zu",
                              c->cfg, c->run, idx, x->exs_evt_buf, x->exs_evt_len,
                              (unsigned)x->exs_evt_flags, (void *)buf, op->len);
                if (res == 0) {
                    ck_assert_msg(eos || received == c->volume,
                                  "%s run %d: receive #%" PRIu64 " got end of stream after %" PRIu64
                                  " of %" PRIu64 " bytes",
                                  c->cfg, c->run, idx, received, c->volume);
                    eos = 1;
                } else {
                    ck_assert_msg(
                        !eos, "%s run %d: receive #%" PRIu64 " got %zd bytes after end of stream",
                        c->cfg, c->run, idx, res);
                    ck_assert_msg((size_t)res <= op->len && received + (uint64_t)res <= c->volume,
                                  "%s run %d: receive #%" PRIu64 " of %zu bytes: result %zd at "
                                  "stream offset %" PRIu64 " of %" PRIu64,
                                  c->cfg, c->run, idx, op->len, res, received, c->volume);
                    ck_assert_msg(!(op->flags & MSG_WAITALL) || (size_t)res == op->len ||
                                      received + (uint64_t)res == c->volume,
                                  "%s run %d: MSG_WAITALL receive #%" PRIu64 " of %zu bytes "
                                  "completed with %zd at stream offset %" PRIu64
                                  " (stream of %" PRIu64 " bytes: not at its end)",
                                  c->cfg, c->run, idx, op->len, res, received, c->volume);
                    bad = st_check(buf, received, (size_t)res, c->seed);
                    ck_assert_msg(bad < 0,
                                  "%s run %d (seed %#" PRIx64 "): receive #%" PRIu64
                                  " (%zu bytes%s%s, "
                                  "result %zd) at stream offset %" PRIu64
                                  ": wrong byte at buffer offset %ld (stream offset %" PRIu64 ")",
                                  c->cfg, c->run, c->seed, idx, op->len,
                                  (op->flags & MSG_WAITALL) ? ", WAITALL" : "",
                                  op->unreg ? ", unregistered" : "", res, received, bad,
                                  received + (uint64_t)bad);
                    if ((size_t)res < op->len) {
                        n_short++;
                        n_partial += !!(op->flags & MSG_WAITALL);
                    }
                    received += (uint64_t)res;
                }
                ck_assert_msg(it_all_bytes(buf + res, op->len - (size_t)res, IT_GUARD_BYTE),
                              "%s run %d: receive #%" PRIu64 " (%zu bytes, result %zd) wrote past "
                              "its result",
                              c->cfg, c->run, idx, op->len, res);
                rf.head = (rf.head + 1) % ROP_MAX;
                rf.count--;
            }
        }
    }
    ms = it_now_ms() - t0;
    ck_assert_msg(received == c->volume, "%s run %d: received %" PRIu64 " of %" PRIu64 " bytes",
                  c->cfg, c->run, received, c->volume);
    ck_assert_msg(n_partial <= 1, "%s run %d: %" PRIu64 " partial MSG_WAITALL receives", c->cfg,
                  c->run, n_partial);
    /* The emulated delay is in effect: a send completes a round trip after it left (not on
     * shm, which emulates no link: caps without EXS_PROV_CAP_EMU_LINK) */
    if (c->delay && !strstr(it_provider, "shm"))
        ck_assert_msg(ms >= 4, "%s run %d: took %.1f ms with EXS_EMU_DELAY_US=2000", c->cfg, c->run,
                      ms);

    /* Statistics: bytes, and each mode doing what it says. */
    st_stats(p.cfd, &ss);
    st_stats(p.sfd, &rsst);
    st_fmt_stats(&ss, b1, sizeof(b1));
    st_fmt_stats(&rsst, b2, sizeof(b2));
    ck_assert_msg(ss.bytes_sent == c->volume && rsst.bytes_received == c->volume,
                  "%s run %d: bytes_sent %" PRIu64 " bytes_received %" PRIu64 ", expected %" PRIu64
                  " [sender: %s] [receiver: %s]",
                  c->cfg, c->run, ss.bytes_sent, rsst.bytes_received, c->volume, b1, b2);
    ck_assert_msg(ss.adverts_received <= rsst.adverts_sent &&
                      ss.adverts_discarded <= ss.adverts_received,
                  "%s run %d: advert counters inconsistent [sender: %s] [receiver: %s]", c->cfg,
                  c->run, b1, b2);
    if (c->mode == EXS_XFER_DIRECT_ONLY)
        ck_assert_msg(ss.indirect_xfers == 0 && ss.direct_xfers > 0 && ss.mode_switches == 0,
                      "%s run %d: direct-only, expected indirect 0, direct > 0, switches 0 "
                      "[sender: %s]",
                      c->cfg, c->run, b1);
    if (c->mode == EXS_XFER_INDIRECT_ONLY)
        ck_assert_msg(ss.direct_xfers == 0 && ss.indirect_xfers > 0 && rsst.adverts_sent == 0 &&
                          ss.adverts_received == 0,
                      "%s run %d: indirect-only, expected direct 0, indirect > 0, no adverts "
                      "[sender: %s] [receiver: %s]",
                      c->cfg, c->run, b1, b2);
    c->stats = ss;
    st_pair_close(&p);
    printf("%s run %d: %s sends%s, seed %#" PRIx64 ", %d/%d outstanding: %" PRIu64
           " sends, %" PRIu64 " receives (%" PRIu64 " WAITALL, %" PRIu64 " short, largest %" PRIu64
           "), %.1f MiB in %.0f ms (%.0f MiB/s); pauses: sender %d receiver %d; sender: %s; "
           "receiver adverts %" PRIu64 "\n",
           c->cfg, c->run, prof_names[c->profile], c->paced ? " paced" : "", c->seed, max_s, max_r,
           nsend, nrecv, n_waitall, n_short, max_rlen, (double)c->volume / (double)MiB, ms,
           (double)c->volume / (double)MiB / (ms / 1000), nholds[1], nholds[2], b1,
           rsst.adverts_sent);
    fflush(stdout);
    free(slen);
}

/* Twelve runs (four per send-size profile, two of them paced) in one mode, with or without
 * the emulated delay: about 52 MiB without, 8.5 MiB with. */
static void stress(int mode, int delay)
{
    /* Volume per run of each profile, without / with delay. */
    static const uint64_t vol[2][3] = {
        {6 * MiB, 1 * MiB, 6 * MiB},
        {1 * MiB, 128 * KiB, 1 * MiB},
    };
    uint64_t direct = 0, indirect = 0, switches = 0;
    uint64_t base = st_base_seed(), cseed = st_mix(base, (uint64_t)(mode * 2 + delay));
    char cfg[64];
    struct it_buf *sb, *arena;

    snprintf(cfg, sizeof(cfg), "stress %s%s", mode_names[mode], delay ? " delay 2 ms" : "");
    printf("%s: seed %#" PRIx64 " (set EXS_TEST_SEED to reproduce or vary)\n", cfg, base);
    fflush(stdout);
    if (delay)
        it_setenv("EXS_EMU_DELAY_US", "2000");
    it_init();
    sb = it_buf_new(12 * MiB, 1);
    arena = it_buf_new(ARENA_SIZE, 1);
    for (int run = 0; run < 12; run++) {
        struct st_stress c = {
            .cfg = cfg,
            .mode = mode,
            .profile = run % 3,
            .run = run,
            .paced = (run / 3) % 2,
            .delay = delay,
            .seed = st_mix(cseed, (uint64_t)run),
            .volume = vol[delay][run % 3],
        };

        stress_run(&c, sb, arena);
        direct += c.stats.direct_xfers;
        indirect += c.stats.indirect_xfers;
        if (c.stats.mode_switches > switches)
            switches = c.stats.mode_switches;
    }
    ck_assert(it_buf_guards_ok(arena));
    printf("%s: %" PRIu64 " direct and %" PRIu64 " indirect transfers, at most %" PRIu64
           " mode switches in a run\n",
           cfg, direct, indirect, switches);
    fflush(stdout);
}

START_TEST(test_stress_dynamic)
{
    stress(EXS_XFER_DYNAMIC, 0);
}
END_TEST

START_TEST(test_stress_direct)
{
    stress(EXS_XFER_DIRECT_ONLY, 0);
}
END_TEST

START_TEST(test_stress_indirect)
{
    stress(EXS_XFER_INDIRECT_ONLY, 0);
}
END_TEST

START_TEST(test_stress_dynamic_delay)
{
    stress(EXS_XFER_DYNAMIC, 1);
}
END_TEST

START_TEST(test_stress_direct_delay)
{
    stress(EXS_XFER_DIRECT_ONLY, 1);
}
END_TEST

START_TEST(test_stress_indirect_delay)
{
    stress(EXS_XFER_INDIRECT_ONLY, 1);
}
END_TEST

/* ======================================================================================
 * 2. Statistics per mode
 * ====================================================================================== */

struct st_seq { /* a sequential stream on a pair, checked step by step */
    struct st_pair p;
    struct it_buf *sb, *rb; /* the whole stream at its offsets; the receive buffer */
    uint64_t seed, soff, roff, nsend, s_done, nrecv;
};

/* Post n sends of len bytes each. */
static void seq_send(struct st_seq *s, int n, size_t len)
{
    for (int i = 0; i < n; i++) {
        ck_assert_uint_le(s->soff + len, s->sb->len);
        st_post_send(&s->p, s->sb, s->soff, len, s->nsend++);
        s->soff += len;
    }
}

/* Wait for every outstanding send (results checked). */
static void seq_send_wait(struct st_seq *s)
{
    while (s->s_done < s->nsend) {
        it_expect_xfer_at(s->p.q, EXS_EVT_SEND, s->p.cfd, ST_AH(ST_SEND, s->s_done), IT_ANY_RESULT,
                          0, NULL, __FILE__, __LINE__);
        s->s_done++;
    }
}

/* Post n receives of len bytes (flags) at consecutive places of rb, then wait for them:
 * with MSG_WAITALL each must return len; without, 1..len. Every byte checked. */
static void seq_recv(struct st_seq *s, int n, size_t len, int flags)
{
    uint64_t first = s->nrecv;

    ck_assert_uint_le((size_t)n * len, s->rb->len);
    memset(s->rb->p, IT_GUARD_BYTE, (size_t)n * len);
    for (int i = 0; i < n; i++)
        st_post_recv(&s->p, s->rb->p + (size_t)i * len, len, flags, s->rb->mh, s->nrecv++);
    for (int i = 0; i < n; i++) {
        ssize_t r = st_wait_recv(&s->p, first + (uint64_t)i, NULL);
        long bad;

        ck_assert_msg(r > 0, "receive %d of %d (%zu bytes): result %zd (no end of stream yet)", i,
                      n, len, r);
        if (flags & MSG_WAITALL)
            ck_assert_msg((size_t)r == len, "MSG_WAITALL receive %d of %d: %zd of %zu bytes", i, n,
                          r, len);
        bad = st_check(s->rb->p + (size_t)i * len, s->roff, (size_t)r, s->seed);
        ck_assert_msg(bad < 0, "receive %d of %d (stream offset %" PRIu64 "): wrong byte at %ld", i,
                      n, s->roff, bad);
        s->roff += (uint64_t)r;
    }
}

/* Receive until roff reaches target with receives of len (no flags). */
static void seq_recv_until(struct st_seq *s, uint64_t target, size_t len, int flags)
{
    while (s->roff < target) {
        size_t l = len < target - s->roff ? len : (size_t)(target - s->roff);

        seq_recv(s, 1, l, flags);
    }
}

static void seq_open(struct st_seq *s, int mode, size_t stream_len, size_t rbuf_len)
{
    memset(s, 0, sizeof(*s));
    s->seed = st_mix(st_base_seed(), 0x5EC0000u + (uint64_t)mode);
    st_pair_open(&s->p, mode, 256);
    s->sb = it_buf_new(stream_len, 1);
    s->rb = it_buf_new(rbuf_len, 1);
    st_fill(s->sb->p, 0, stream_len, s->seed);
}

/* SHUT_WR by the sender, the receiver sees 0, then close everything. */
static void seq_finish(struct st_seq *s)
{
    exs_event_t ev;

    seq_send_wait(s);
    IT_EXPECT_OK(exs_shutdown(s->p.cfd, SHUT_WR, s->p.q, ST_AH(ST_SHUT, 0)));
    it_expect_err(s->p.q, EXS_EVT_SHUTDOWN, s->p.cfd, ST_AH(ST_SHUT, 0), 0);
    st_post_recv(&s->p, s->rb->p, 4096, 0, s->rb->mh, s->nrecv);
    ck_assert_msg(st_wait_recv(&s->p, s->nrecv, &ev) == 0,
                  "receive after the peer's SHUT_WR: %zd bytes, expected 0 (end of stream)",
                  ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
    s->nrecv++;
    st_pair_close(&s->p);
}

struct st_snap {
    struct exs_sock_stats s, r; /* sender, receiver */
    char sb[300], rb[300];
};

static void snap(struct st_seq *s, struct st_snap *x)
{
    st_stats(s->p.cfd, &x->s);
    st_stats(s->p.sfd, &x->r);
    st_fmt_stats(&x->s, x->sb, sizeof(x->sb));
    st_fmt_stats(&x->r, x->rb, sizeof(x->rb));
}

/* The receiver falls behind, catches up, falls behind, catches up:
 * A/C: 8 sends of 64 KiB before any receive is posted (they fit the 1 MiB ring), then one
 *      WAITALL receive drains them;
 * B/D: 8 WAITALL receives of 1 MiB are posted and (unless indirect-only) their ADVERTs
 *      reach the sender before 8 sends of 1 MiB are posted.
 * Snapshots after A, B, C and D in x[0..3]. */
static void stats_scenario(int mode, struct st_snap x[4])
{
    struct st_seq s;

    it_init();
    seq_open(&s, mode, 2 * (512 * KiB + 8 * MiB), 8 * MiB);
    for (int phase = 0; phase < 4; phase++) {
        it_context("%s, phase %c", mode_names[mode], 'A' + phase);
        if (phase % 2 == 0) {
            seq_send(&s, 8, 64 * KiB);
            if (mode != EXS_XFER_DIRECT_ONLY) {
                seq_send_wait(&s); /* all in the ring */
            } else {
                /* Direct-only: the sends wait for an ADVERT. */
                it_expect_no_event(s.p.q, 100);
            }
            seq_recv(&s, 1, 512 * KiB, MSG_WAITALL);
            seq_send_wait(&s);
        } else {
            uint64_t adv0 = 0;
            struct exs_sock_stats st;

            st_stats(s.p.cfd, &st);
            adv0 = st.adverts_received;
            memset(s.rb->p, IT_GUARD_BYTE, 8 * MiB);
            for (int i = 0; i < 8; i++)
                st_post_recv(&s.p, s.rb->p + (size_t)i * MiB, MiB, MSG_WAITALL, s.rb->mh,
                             s.nrecv + (uint64_t)i);
            if (mode != EXS_XFER_INDIRECT_ONLY) {
                ST_WAIT_STAT(s.p.cfd, adverts_received, adv0 + 8);
            } else {
                it_sleep_ms(50);
                st_stats(s.p.cfd, &st);
                ck_assert_msg(st.adverts_received == 0,
                              "indirect-only: the sender received %" PRIu64 " ADVERTs",
                              st.adverts_received);
            }
            seq_send(&s, 8, MiB);
            for (int i = 0; i < 8; i++) {
                ssize_t r = st_wait_recv(&s.p, s.nrecv, NULL);
                long bad;

                ck_assert_msg(r == (ssize_t)MiB, "phase %c: WAITALL receive %d: %zd of %zu bytes",
                              'A' + phase, i, r, MiB);
                bad = st_check(s.rb->p + (size_t)i * MiB, s.roff, MiB, s.seed);
                ck_assert_msg(bad < 0, "phase %c: receive %d: wrong byte at %ld", 'A' + phase, i,
                              bad);
                s.roff += MiB;
                s.nrecv++;
            }
            seq_send_wait(&s);
        }
        snap(&s, &x[phase]);
        printf("stats %s after phase %c: sender: %s; receiver: %s\n", mode_names[mode], 'A' + phase,
               x[phase].sb, x[phase].rb);
    }
    fflush(stdout);
    seq_finish(&s);
}

START_TEST(test_stats_direct_only)
{
    struct st_snap x[4];

    stats_scenario(EXS_XFER_DIRECT_ONLY, x);
    ck_assert_msg(x[3].s.indirect_xfers == 0 && x[3].s.direct_xfers > 0,
                  "direct-only: expected indirect_xfers 0 and direct_xfers > 0 [sender: %s]",
                  x[3].sb);
    ck_assert_msg(x[3].s.mode_switches == 0, "direct-only: mode_switches != 0 [sender: %s]",
                  x[3].sb);
    ck_assert_msg(x[3].r.adverts_sent >= 2 + 16 && x[3].s.adverts_received >= 2 + 16,
                  "direct-only: every receive is advertised: expected >= 18 ADVERTs "
                  "[sender: %s] [receiver: %s]",
                  x[3].sb, x[3].rb);
}
END_TEST

START_TEST(test_stats_indirect_only)
{
    struct st_snap x[4];

    stats_scenario(EXS_XFER_INDIRECT_ONLY, x);
    ck_assert_msg(x[3].s.direct_xfers == 0 && x[3].s.indirect_xfers > 0,
                  "indirect-only: expected direct_xfers 0 and indirect_xfers > 0 [sender: %s]",
                  x[3].sb);
    ck_assert_msg(x[3].r.adverts_sent == 0 && x[3].s.adverts_received == 0,
                  "indirect-only: expected no ADVERT [sender: %s] [receiver: %s]", x[3].sb,
                  x[3].rb);
}
END_TEST

START_TEST(test_stats_dynamic)
{
    struct st_snap x[4];

    stats_scenario(EXS_XFER_DYNAMIC, x);
    /* A: the receiver is behind: everything through the ring. */
    ck_assert_msg(x[0].s.indirect_xfers > 0 && x[0].s.direct_xfers == 0,
                  "dynamic, after A (sends before receives): expected indirect > 0, direct 0 "
                  "[sender: %s]",
                  x[0].sb);
    ck_assert_msg(x[0].s.mode_switches >= 1,
                  "dynamic, after A: expected mode_switches >= 1 "
                  "[sender: %s]",
                  x[0].sb);
    /* B: the receiver is ahead: zero-copy, no ring transfer. */
    ck_assert_msg(x[1].s.direct_xfers > 0 && x[1].s.indirect_xfers == x[0].s.indirect_xfers,
                  "dynamic, B (receives advertised before the sends): expected only direct "
                  "transfers: after A [%s], after B [%s]",
                  x[0].sb, x[1].sb);
    ck_assert_msg(x[1].s.mode_switches >= 2,
                  "dynamic, after B (indirect -> direct): expected mode_switches >= 2 [sender: %s]",
                  x[1].sb);
    ck_assert_msg(x[1].r.adverts_sent >= 8, "dynamic, after B: receiver adverts_sent < 8 [%s]",
                  x[1].rb);
    /* C: behind again. */
    ck_assert_msg(x[2].s.indirect_xfers > x[1].s.indirect_xfers &&
                      x[2].s.direct_xfers == x[1].s.direct_xfers,
                  "dynamic, C: expected only indirect transfers: after B [%s], after C [%s]",
                  x[1].sb, x[2].sb);
    ck_assert_msg(x[2].s.mode_switches >= 3, "dynamic, after C: expected mode_switches >= 3 [%s]",
                  x[2].sb);
    /* D: ahead again. */
    ck_assert_msg(
        x[3].s.direct_xfers > x[2].s.direct_xfers && x[3].s.indirect_xfers == x[2].s.indirect_xfers,
        "dynamic, D: expected only direct transfers: after C [%s], after D [%s]", x[2].sb, x[3].sb);
    ck_assert_msg(x[3].s.mode_switches >= 4, "dynamic, after D: expected mode_switches >= 4 [%s]",
                  x[3].sb);
}
END_TEST

/* EXS_XFER_MODE=indirect is the process default: a new stream socket reports it, and a pair
 * left at the default makes no direct transfer and no ADVERT. */
/* EXS_SO_STATS grows at its end: an older caller's shorter length gets the prefix it
 * knows and nothing beyond it is written; shorter than version 1 is EINVAL. */
START_TEST(test_stats_abi_prefix)
{
    unsigned char buf[sizeof(struct exs_sock_stats) + 16];
    socklen_t len;
    exs_qhandle_t q;
    int fd;

    it_init();
    q = it_qcreate(4);
    fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    memset(buf, 0xA5, sizeof(buf));
    len = EXS_SOCK_STATS_V1_SIZE;
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, buf, &len), 0);
    ck_assert_uint_eq(len, EXS_SOCK_STATS_V1_SIZE);
    for (size_t i = 0; i < EXS_SOCK_STATS_V1_SIZE; i++)
        ck_assert_msg(buf[i] == 0, "byte %zu of the version 1 prefix not filled", i);
    for (size_t i = EXS_SOCK_STATS_V1_SIZE; i < sizeof(buf); i++)
        ck_assert_msg(buf[i] == 0xA5, "byte %zu beyond the caller's length written", i);
    len = sizeof(buf);
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, buf, &len), 0);
    ck_assert_uint_eq(len, sizeof(struct exs_sock_stats));
    len = EXS_SOCK_STATS_V1_SIZE - 1;
    errno = 0;
    ck_assert_int_eq(exs_getsockopt(fd, SOL_EXS, EXS_SO_STATS, buf, &len), -1);
    ck_assert_int_eq(errno, EINVAL);
    it_close(fd, q);
    it_qdelete(q);
}
END_TEST

START_TEST(test_stats_env_mode)
{
    struct st_seq s;
    struct st_snap x;

    it_setenv("EXS_XFER_MODE", "indirect");
    it_init();
    seq_open(&s, -1, 4 * MiB, 4 * MiB);
    ck_assert_int_eq(st_get_int(s.p.cfd, SOL_EXS, EXS_SO_XFER_MODE), EXS_XFER_INDIRECT_ONLY);
    ck_assert_int_eq(st_get_int(s.p.sfd, SOL_EXS, EXS_SO_XFER_MODE), EXS_XFER_INDIRECT_ONLY);
    memset(s.rb->p, IT_GUARD_BYTE, 4 * MiB);
    for (int i = 0; i < 4; i++)
        st_post_recv(&s.p, s.rb->p + (size_t)i * MiB, MiB, MSG_WAITALL, s.rb->mh, s.nrecv + i);
    it_sleep_ms(20);
    seq_send(&s, 4, MiB);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(st_wait_recv(&s.p, s.nrecv, NULL), (ssize_t)MiB);
        ck_assert_int_lt(st_check(s.rb->p + (size_t)i * MiB, s.roff, MiB, s.seed), 0);
        s.roff += MiB;
        s.nrecv++;
    }
    seq_send_wait(&s);
    snap(&s, &x);
    ck_assert_msg(x.s.direct_xfers == 0 && x.s.indirect_xfers > 0 && x.r.adverts_sent == 0,
                  "EXS_XFER_MODE=indirect: expected no direct transfer and no ADVERT "
                  "[sender: %s] [receiver: %s]",
                  x.sb, x.rb);
    seq_finish(&s);
}
END_TEST

/* ======================================================================================
 * 3. Splitting and coalescing
 * ====================================================================================== */

static void split_mode(int mode)
{
    struct st_seq s;
    struct st_snap x0, x1;
    uint64_t first;

    it_init();
    seq_open(&s, mode, 8 * MiB, 2 * MiB);

    /* a) 16 receives of 64 KiB without WAITALL, posted (and advertised) first, then one
     *    1 MiB send: split across them. */
    it_context("%s: 1 MiB send into 16 x 64 KiB receives posted first", mode_names[mode]);
    snap(&s, &x0);
    first = s.nrecv;
    memset(s.rb->p, IT_GUARD_BYTE, MiB);
    for (int i = 0; i < 16; i++)
        st_post_recv(&s.p, s.rb->p + (size_t)i * 64 * KiB, 64 * KiB, 0, s.rb->mh, s.nrecv++);
    if (mode != EXS_XFER_INDIRECT_ONLY)
        ST_WAIT_STAT(s.p.cfd, adverts_received, x0.s.adverts_received + 16);
    seq_send(&s, 1, MiB);
    {
        for (int i = 0; i < 16; i++) {
            ssize_t r = st_wait_recv(&s.p, first + (uint64_t)i, NULL);
            long bad;

            ck_assert_msg(r > 0, "receive %d of 16: result %zd", i, r);
            if (mode != EXS_XFER_INDIRECT_ONLY)
                ck_assert_msg(r == (ssize_t)(64 * KiB),
                              "%s: advertised 64 KiB receive %d of 16 got %zd bytes of the 1 MiB "
                              "send, expected 65536 (the send split across the ADVERTs)",
                              mode_names[mode], i, r);
            bad = st_check(s.rb->p + (size_t)i * 64 * KiB, s.roff, (size_t)r, s.seed);
            ck_assert_msg(bad < 0, "receive %d of 16: wrong byte at %ld", i, bad);
            ck_assert(it_all_bytes(s.rb->p + (size_t)i * 64 * KiB + (size_t)r, 64 * KiB - (size_t)r,
                                   IT_GUARD_BYTE));
            s.roff += (uint64_t)r;
        }
        /* Without WAITALL a receive may take less; the rest comes with more receives. */
        seq_recv_until(&s, s.soff, 64 * KiB, 0);
    }
    seq_send_wait(&s);
    snap(&s, &x1);
    if (mode != EXS_XFER_INDIRECT_ONLY)
        ck_assert_msg(x1.s.direct_xfers >= x0.s.direct_xfers + 16 &&
                          x1.s.indirect_xfers == x0.s.indirect_xfers,
                      "%s: 1 MiB into 16 advertised receives: expected >= 16 direct and no "
                      "indirect transfer: before [%s], after [%s]",
                      mode_names[mode], x0.sb, x1.sb);

    /* b) The same with WAITALL, receives first, then send first: 16 x exactly 64 KiB. */
    it_context("%s: 1 MiB send into 16 WAITALL receives posted first", mode_names[mode]);
    snap(&s, &x0);
    first = s.nrecv;
    memset(s.rb->p, IT_GUARD_BYTE, MiB);
    for (int i = 0; i < 16; i++)
        st_post_recv(&s.p, s.rb->p + (size_t)i * 64 * KiB, 64 * KiB, MSG_WAITALL, s.rb->mh,
                     s.nrecv++);
    if (mode != EXS_XFER_INDIRECT_ONLY)
        ST_WAIT_STAT(s.p.cfd, adverts_received, x0.s.adverts_received + 16);
    seq_send(&s, 1, MiB);
    for (int i = 0; i < 16; i++) {
        ssize_t r = st_wait_recv(&s.p, first + (uint64_t)i, NULL);

        ck_assert_msg(r == (ssize_t)(64 * KiB), "WAITALL receive %d of 16: %zd bytes", i, r);
    }
    ck_assert_int_lt(st_check(s.rb->p, s.roff, MiB, s.seed), 0);
    s.roff += MiB;
    seq_send_wait(&s);

    it_context("%s: 1 MiB send first, then 16 WAITALL receives", mode_names[mode]);
    seq_send(&s, 1, MiB);
    if (mode != EXS_XFER_DIRECT_ONLY)
        seq_send_wait(&s);
    else
        it_sleep_ms(20);
    seq_recv(&s, 16, 64 * KiB, MSG_WAITALL);
    seq_send_wait(&s);

    /* c) Coalescing: 64 sends of 1000 bytes into one WAITALL receive of 64000, sends first
     *    and receive first. */
    it_context("%s: 64 x 1000-byte sends, then one WAITALL receive of 64000", mode_names[mode]);
    seq_send(&s, 64, 1000);
    if (mode != EXS_XFER_DIRECT_ONLY)
        seq_send_wait(&s);
    else
        it_sleep_ms(20);
    seq_recv(&s, 1, 64000, MSG_WAITALL);
    seq_send_wait(&s);

    it_context("%s: one WAITALL receive of 64000, then 64 x 1000-byte sends", mode_names[mode]);
    snap(&s, &x0);
    memset(s.rb->p, IT_GUARD_BYTE, 65536);
    st_post_recv(&s.p, s.rb->p, 64000, MSG_WAITALL, s.rb->mh, s.nrecv);
    if (mode != EXS_XFER_INDIRECT_ONLY)
        ST_WAIT_STAT(s.p.cfd, adverts_received, x0.s.adverts_received + 1);
    seq_send(&s, 64, 1000);
    ck_assert_int_eq(st_wait_recv(&s.p, s.nrecv, NULL), 64000);
    ck_assert_int_lt(st_check(s.rb->p, s.roff, 64000, s.seed), 0);
    ck_assert(it_all_bytes(s.rb->p + 64000, 65536 - 64000, IT_GUARD_BYTE));
    s.roff += 64000;
    s.nrecv++;
    seq_send_wait(&s);
    snap(&s, &x1);
    if (mode != EXS_XFER_INDIRECT_ONLY)
        ck_assert_msg(x1.s.direct_xfers >= x0.s.direct_xfers + 64 &&
                          x1.s.indirect_xfers == x0.s.indirect_xfers,
                      "%s: 64 sends into one advertised WAITALL receive: expected 64 direct "
                      "transfers into it: before [%s], after [%s]",
                      mode_names[mode], x0.sb, x1.sb);

    /* d) Without WAITALL, a large receive after small sends sit in the ring gets 1..all of them. */
    if (mode != EXS_XFER_DIRECT_ONLY) {
        it_context("%s: 8 x 1000-byte sends, then receives of 64 KiB without WAITALL",
                   mode_names[mode]);
        seq_send(&s, 8, 1000);
        seq_send_wait(&s);
        seq_recv_until(&s, s.soff, 64 * KiB, 0);
    }
    ck_assert_uint_eq(s.roff, s.soff);
    seq_finish(&s);
}

START_TEST(test_split_dynamic)
{
    split_mode(EXS_XFER_DYNAMIC);
}
END_TEST

START_TEST(test_split_direct)
{
    split_mode(EXS_XFER_DIRECT_ONLY);
}
END_TEST

START_TEST(test_split_indirect)
{
    split_mode(EXS_XFER_INDIRECT_ONLY);
}
END_TEST

/* ======================================================================================
 * 4. Multi-threaded posting: 2 threads send, 2 threads receive on one connection
 * ====================================================================================== */

#define MT_VOLUME  (16 * MiB)
#define MT_MAXLEN  (256 * KiB)
#define MT_SLOTS   32
#define MT_PER_THR 8
#define MT_MAXRECV (1 << 20)

struct mt_rrec {
    int slot;
    size_t len;
    int flags;
    int done;
    ssize_t result;
};

struct mt {
    int cfd, sfd, mode;
    uint64_t seed;
    struct it_buf *sb, *rb;
    /* senders */
    pthread_mutex_t slock;
    uint64_t next_off, nsend;
    /* receivers */
    pthread_mutex_t rlock;
    struct mt_rrec *rec;
    uint64_t nrecv, cursor, received;
    int slot_free[MT_SLOTS];
    int eos;
    /* failures */
    pthread_mutex_t elock;
    int failed;
    char err[512];
};

struct mt_thr {
    struct mt *m;
    int id;
    exs_qhandle_t q;
    uint64_t rs;
};

static void mt_fail(struct mt *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mt_fail(struct mt *m, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&m->elock);
    if (!m->failed) {
        va_start(ap, fmt);
        vsnprintf(m->err, sizeof(m->err), fmt, ap);
        va_end(ap);
        m->failed = 1;
    }
    pthread_mutex_unlock(&m->elock);
}

static int mt_failed(struct mt *m)
{
    int f;

    pthread_mutex_lock(&m->elock);
    f = m->failed;
    pthread_mutex_unlock(&m->elock);
    return f;
}

/* Dequeue one event of q within IT_TIMEOUT_MS; 0 on timeout or error (failure recorded). */
static int mt_dequeue(struct mt_thr *t, exs_event_t *ev, const char *who)
{
    struct timespec ts = {.tv_sec = IT_TIMEOUT_MS / 1000};
    int n;

    do {
        n = exs_qdequeue(t->q, ev, 1, &ts);
    } while (n < 0 && errno == EINTR);
    if (n != 1)
        mt_fail(t->m, "%s thread %d: exs_qdequeue = %d (errno %d) after %d ms", who, t->id, n,
                errno, IT_TIMEOUT_MS);
    return n == 1;
}

static void *mt_sender(void *arg)
{
    struct mt_thr *t = arg;
    struct mt *m = t->m;
    uint64_t fidx[MT_PER_THR], foff[MT_PER_THR];
    size_t flen[MT_PER_THR];
    unsigned head = 0, count = 0;
    int all_posted = 0;

    while (!mt_failed(m)) {
        while (!all_posted && count < MT_PER_THR) {
            size_t len = st_logu(&t->rs, MT_MAXLEN);
            unsigned k = (head + count) % MT_PER_THR;
            int rc;

            /* The offset is taken and the send posted under one lock: posting order is
             * stream order. */
            pthread_mutex_lock(&m->slock);
            if (m->next_off == MT_VOLUME) {
                all_posted = 1;
                pthread_mutex_unlock(&m->slock);
                break;
            }
            if (len > MT_VOLUME - m->next_off)
                len = (size_t)(MT_VOLUME - m->next_off);
            rc = exs_send(m->cfd, m->sb->p + m->next_off, len, 0, t->q, ST_AH(ST_SEND, m->nsend),
                          m->sb->mh);
            if (rc == 0) {
                fidx[k] = m->nsend++;
                foff[k] = m->next_off;
                flen[k] = len;
                m->next_off += len;
                count++;
            }
            pthread_mutex_unlock(&m->slock);
            if (rc != 0) {
                mt_fail(m, "sender %d: exs_send(%zu) = %d errno %d (%s)", t->id, len, rc, errno,
                        strerror(errno));
                return NULL;
            }
        }
        if (count == 0)
            break;
        {
            exs_event_t ev;
            const exs_evt_xfer_t *x = &ev.exs_evt_u.exs_evt_xfer;

            if (!mt_dequeue(t, &ev, "sender"))
                return NULL;
            if (ev.exs_evt_type != EXS_EVT_SEND || ev.exs_evt_errno != 0 ||
                ST_AH_IDX(ev.exs_evt_ahandle) != fidx[head] ||
                x->exs_evt_result != (ssize_t)flen[head] ||
                x->exs_evt_buf != m->sb->p + foff[head]) {
                mt_fail(m,
                        "sender %d: expected SEND #%" PRIu64 " (%zu bytes at offset %" PRIu64
                        "), got type %d ah #%" PRIu64 " errno %d (%s) result %zd",
                        t->id, fidx[head], flen[head], foff[head], ev.exs_evt_type,
                        ST_AH_IDX(ev.exs_evt_ahandle), ev.exs_evt_errno, strerror(ev.exs_evt_errno),
                        x->exs_evt_result);
                return NULL;
            }
            head = (head + 1) % MT_PER_THR;
            count--;
        }
    }
    return NULL;
}

/* Under rlock: take completed receives in posting order, verify them at their stream offset. */
static void mt_advance(struct mt *m)
{
    while (m->cursor < m->nrecv && m->rec[m->cursor].done) {
        struct mt_rrec *r = &m->rec[m->cursor];
        uint8_t *buf = m->rb->p + (size_t)r->slot * MT_MAXLEN;

        if (r->result == 0) {
            if (!m->eos && m->received != MT_VOLUME)
                mt_fail(m, "receive #%" PRIu64 ": end of stream after %" PRIu64 " of %zu bytes",
                        m->cursor, m->received, MT_VOLUME);
            m->eos = 1;
        } else {
            long bad = st_check(buf, m->received, (size_t)r->result, m->seed);

            if (m->eos)
                mt_fail(m, "receive #%" PRIu64 ": %zd bytes after end of stream", m->cursor,
                        r->result);
            else if (m->received + (uint64_t)r->result > MT_VOLUME)
                mt_fail(m,
                        "receive #%" PRIu64 ": %zd bytes at offset %" PRIu64 ", past the %zu sent",
                        m->cursor, r->result, m->received, MT_VOLUME);
            else if (bad >= 0)
                mt_fail(m,
                        "%s: receive #%" PRIu64
                        " (%zu bytes%s, result %zd) at stream offset %" PRIu64
                        ": wrong byte at %ld (bytes lost, duplicated or reordered)",
                        mode_names[m->mode], m->cursor, r->len, r->flags ? ", WAITALL" : "",
                        r->result, m->received, bad);
            else if (r->flags && (size_t)r->result < r->len &&
                     m->received + (uint64_t)r->result != MT_VOLUME)
                mt_fail(m,
                        "WAITALL receive #%" PRIu64 " of %zu bytes completed with %zd at %" PRIu64,
                        m->cursor, r->len, r->result, m->received);
            m->received += (uint64_t)r->result;
        }
        m->slot_free[r->slot] = 1;
        m->cursor++;
    }
}

static void *mt_receiver(void *arg)
{
    struct mt_thr *t = arg;
    struct mt *m = t->m;
    uint64_t mine[MT_PER_THR];
    unsigned head = 0, count = 0;

    while (!mt_failed(m)) {
        int stop;

        pthread_mutex_lock(&m->rlock);
        while (!m->eos && count < MT_PER_THR && m->nrecv < MT_MAXRECV) {
            int slot = -1, rc;
            size_t len = st_logu(&t->rs, MT_MAXLEN);
            int flags = it_rand(&t->rs) % 2 ? MSG_WAITALL : 0;

            for (int i = 0; i < MT_SLOTS; i++) {
                if (m->slot_free[i]) {
                    slot = i;
                    break;
                }
            }
            if (slot < 0)
                break;
            memset(m->rb->p + (size_t)slot * MT_MAXLEN, IT_GUARD_BYTE, len);
            rc = exs_recv(m->sfd, m->rb->p + (size_t)slot * MT_MAXLEN, len, flags, t->q,
                          ST_AH(ST_RECV, m->nrecv), m->rb->mh);
            if (rc != 0) {
                mt_fail(m, "receiver %d: exs_recv(%zu) = %d errno %d (%s)", t->id, len, rc, errno,
                        strerror(errno));
                break;
            }
            m->slot_free[slot] = 0;
            m->rec[m->nrecv] = (struct mt_rrec){.slot = slot, .len = len, .flags = flags};
            mine[(head + count) % MT_PER_THR] = m->nrecv++;
            count++;
        }
        stop = m->eos && count == 0;
        pthread_mutex_unlock(&m->rlock);
        if (stop)
            break;
        if (count == 0) { /* no free slot: the other thread holds the oldest receive */
            it_sleep_ms(1);
            continue;
        }
        {
            exs_event_t ev;
            const exs_evt_xfer_t *x = &ev.exs_evt_u.exs_evt_xfer;
            uint64_t idx;

            if (!mt_dequeue(t, &ev, "receiver"))
                return NULL;
            idx = ST_AH_IDX(ev.exs_evt_ahandle);
            if (ev.exs_evt_type != EXS_EVT_RECV || ev.exs_evt_errno != 0 || idx != mine[head] ||
                x->exs_evt_result < 0 || (size_t)x->exs_evt_result > x->exs_evt_len) {
                mt_fail(m,
                        "receiver %d: expected RECV #%" PRIu64 ", got type %d ah #%" PRIu64
                        " errno %d (%s) result %zd",
                        t->id, mine[head], ev.exs_evt_type, idx, ev.exs_evt_errno,
                        strerror(ev.exs_evt_errno), x->exs_evt_result);
                return NULL;
            }
            pthread_mutex_lock(&m->rlock);
            m->rec[idx].result = x->exs_evt_result;
            m->rec[idx].done = 1;
            mt_advance(m);
            pthread_mutex_unlock(&m->rlock);
            head = (head + 1) % MT_PER_THR;
            count--;
        }
    }
    return NULL;
}

static void mt_mode(int mode)
{
    struct st_pair p;
    struct mt m;
    struct mt_thr thr[4];
    pthread_t tid[4];
    uint64_t base = st_base_seed();
    struct exs_sock_stats ss, rs;
    char b1[300], b2[300];
    double t0 = it_now_ms();

    memset(&m, 0, sizeof(m));
    m.mode = mode;
    m.seed = st_mix(base, 0x3700 + (uint64_t)mode);
    pthread_mutex_init(&m.slock, NULL);
    pthread_mutex_init(&m.rlock, NULL);
    pthread_mutex_init(&m.elock, NULL);
    m.rec = calloc(MT_MAXRECV, sizeof(*m.rec));
    ck_assert_ptr_nonnull(m.rec);
    for (int i = 0; i < MT_SLOTS; i++)
        m.slot_free[i] = 1;
    m.sb = it_buf_new(MT_VOLUME, 1);
    m.rb = it_buf_new(MT_SLOTS * MT_MAXLEN, 1);
    st_fill(m.sb->p, 0, MT_VOLUME, m.seed);
    st_pair_open(&p, mode, 64);
    m.cfd = p.cfd;
    m.sfd = p.sfd;
    for (int i = 0; i < 4; i++) {
        thr[i] = (struct mt_thr){
            .m = &m, .id = i, .q = it_qcreate(64), .rs = st_mix(m.seed, (uint64_t)i)};
    }
    it_watchdog_start(90, "multi-threaded stream transfer");
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&tid[i], NULL, i < 2 ? mt_sender : mt_receiver, &thr[i]),
                         0);
    pthread_join(tid[0], NULL);
    pthread_join(tid[1], NULL);
    if (!mt_failed(&m)) {
        IT_EXPECT_OK(exs_shutdown(p.cfd, SHUT_WR, p.q, ST_AH(ST_SHUT, 0)));
        it_expect_err(p.q, EXS_EVT_SHUTDOWN, p.cfd, ST_AH(ST_SHUT, 0), 0);
    }
    pthread_join(tid[2], NULL);
    pthread_join(tid[3], NULL);
    it_watchdog_stop();
    ck_assert_msg(!m.failed, "%s (seed %#" PRIx64 "): %s", mode_names[mode], m.seed, m.err);
    ck_assert_msg(m.eos && m.received == MT_VOLUME && m.next_off == MT_VOLUME,
                  "%s: received %" PRIu64 " of %zu bytes, end of stream %d", mode_names[mode],
                  m.received, MT_VOLUME, m.eos);
    ck_assert(it_buf_guards_ok(m.rb));
    st_stats(p.cfd, &ss);
    st_stats(p.sfd, &rs);
    ck_assert_uint_eq(ss.bytes_sent, MT_VOLUME);
    ck_assert_uint_eq(rs.bytes_received, MT_VOLUME);
    printf("multithread %s: %" PRIu64 " sends, %" PRIu64 " receives, %.0f ms; sender: %s; "
           "receiver: %s\n",
           mode_names[mode], m.nsend, m.nrecv, it_now_ms() - t0, st_fmt_stats(&ss, b1, sizeof(b1)),
           st_fmt_stats(&rs, b2, sizeof(b2)));
    fflush(stdout);
    for (int i = 0; i < 4; i++)
        it_qdelete(thr[i].q);
    st_pair_close(&p);
    it_buf_free(m.sb);
    it_buf_free(m.rb);
    free(m.rec);
}

START_TEST(test_multithread)
{
    it_init();
    for (int mode = EXS_XFER_DYNAMIC; mode <= EXS_XFER_INDIRECT_ONLY; mode++)
        mt_mode(mode);
}
END_TEST

/* ======================================================================================
 * 5. End of stream
 * ====================================================================================== */

/* Receives pending when the peer closes complete with 0; later ones too. */
START_TEST(test_eos_close)
{
    for (int mode = EXS_XFER_DYNAMIC; mode <= EXS_XFER_INDIRECT_ONLY; mode++) {
        struct st_seq s;
        exs_event_t ev;

        it_init();
        it_context("%s", mode_names[mode]);
        seq_open(&s, mode, 64 * KiB, 64 * KiB);
        memset(s.rb->p, IT_GUARD_BYTE, 64 * KiB);
        st_post_recv(&s.p, s.rb->p, 1000, MSG_WAITALL, s.rb->mh, 0);
        st_post_recv(&s.p, s.rb->p + 4096, 4096, 0, s.rb->mh, 1);
        st_post_recv(&s.p, s.rb->p + 8192, 4096, MSG_WAITALL, s.rb->mh, 2);
        seq_send(&s, 1, 1000);
        seq_send_wait(&s);
        ck_assert_int_eq(st_wait_recv(&s.p, 0, NULL), 1000);
        ck_assert_int_lt(st_check(s.rb->p, 0, 1000, s.seed), 0);
        it_expect_no_event(s.p.q, 20); /* 1 and 2 wait */
        it_close(s.p.cfd, s.p.q);
        s.p.cfd = -1;
        ck_assert_msg(st_wait_recv(&s.p, 1, &ev) == 0,
                      "%s: pending receive after the peer's close: result %zd, expected 0",
                      mode_names[mode], ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
        ck_assert_msg(st_wait_recv(&s.p, 2, &ev) == 0,
                      "%s: pending WAITALL receive after the peer's close: result %zd, expected 0",
                      mode_names[mode], ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
        for (uint64_t i = 3; i < 6; i++) {
            st_post_recv(&s.p, s.rb->p, 4096, i % 2 ? MSG_WAITALL : 0, s.rb->mh, i);
            ck_assert_msg(st_wait_recv(&s.p, i, &ev) == 0,
                          "%s: receive posted after the peer's close: result %zd, expected 0",
                          mode_names[mode], ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
        }
        ck_assert(it_all_bytes(s.rb->p + 4096, 8192, IT_GUARD_BYTE));
        st_pair_close(&s.p);
        it_fini();
    }
}
END_TEST

/* A WAITALL receive holding part of its length completes with that part at the peer's
 * SHUT_WR; the half-closed side still receives; its own sends fail with EPIPE. */
START_TEST(test_eos_shutdown_partial)
{
    for (int mode = EXS_XFER_DYNAMIC; mode <= EXS_XFER_INDIRECT_ONLY; mode++) {
        struct st_seq s;
        struct it_buf *cb;
        exs_event_t ev;

        it_init();
        it_context("%s", mode_names[mode]);
        seq_open(&s, mode, 64 * KiB, 64 * KiB);
        cb = it_buf_new(4096, 1);
        memset(s.rb->p, IT_GUARD_BYTE, 64 * KiB);
        st_post_recv(&s.p, s.rb->p, 4096, MSG_WAITALL, s.rb->mh, 0);
        seq_send(&s, 1, 1000);
        seq_send_wait(&s);             /* in place (advertised WAITALL receive) or in the ring */
        it_expect_no_event(s.p.q, 50); /* WAITALL: 1000 of 4096 is not enough */
        IT_EXPECT_OK(exs_shutdown(s.p.cfd, SHUT_WR, s.p.q, ST_AH(ST_SHUT, 0)));
        it_expect_err(s.p.q, EXS_EVT_SHUTDOWN, s.p.cfd, ST_AH(ST_SHUT, 0), 0);
        ck_assert_msg(st_wait_recv(&s.p, 0, &ev) == 1000,
                      "%s: WAITALL receive of 4096 with 1000 bytes at end of stream: result %zd, "
                      "expected 1000",
                      mode_names[mode], ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
        ck_assert_int_lt(st_check(s.rb->p, 0, 1000, s.seed), 0);
        ck_assert(it_all_bytes(s.rb->p + 1000, 4096 - 1000, IT_GUARD_BYTE));
        st_post_recv(&s.p, s.rb->p, 4096, MSG_WAITALL, s.rb->mh, 1);
        ck_assert_int_eq(st_wait_recv(&s.p, 1, NULL), 0);
        st_post_recv(&s.p, s.rb->p, 4096, 0, s.rb->mh, 2);
        ck_assert_int_eq(st_wait_recv(&s.p, 2, NULL), 0);

        /* The client shut down its sending side only. */
        IT_EXPECT_FAIL(exs_send(s.p.cfd, cb->p, 10, 0, s.p.q, IT_AH(1), cb->mh), EPIPE);
        memset(cb->p, 0, 4096);
        IT_EXPECT_OK(exs_recv(s.p.cfd, cb->p, 4096, MSG_WAITALL, s.p.q, IT_AH(2), cb->mh));
        IT_EXPECT_OK(exs_send(s.p.sfd, s.sb->p, 4096, 0, s.p.q, IT_AH(3), s.sb->mh));
        it_expect_xfer_at(s.p.q, EXS_EVT_RECV, s.p.cfd, IT_AH(2), 4096, 0, NULL, __FILE__,
                          __LINE__);
        it_expect_xfer_at(s.p.q, EXS_EVT_SEND, s.p.sfd, IT_AH(3), 4096, 0, NULL, __FILE__,
                          __LINE__);
        ck_assert_int_lt(st_check(cb->p, 0, 4096, s.seed), 0);
        st_pair_close(&s.p);
        it_fini();
    }
}
END_TEST

/* Bytes that reached the receiver's ring before the peer closed are still delivered to
 * receives posted after the close, then end of stream. */
START_TEST(test_eos_ring_after_close)
{
    static const int modes[] = {EXS_XFER_DYNAMIC, EXS_XFER_INDIRECT_ONLY};

    for (int mi = 0; mi < 2; mi++) {
        int mode = modes[mi];
        struct st_seq s;
        exs_event_t ev;
        uint64_t idx = 0;

        it_init();
        it_context("%s", mode_names[mode]);
        seq_open(&s, mode, 64 * KiB, 64 * KiB);
        seq_send(&s, 3, 1000);
        seq_send_wait(&s); /* all in the receiver's ring */
        it_close(s.p.cfd, s.p.q);
        s.p.cfd = -1;
        it_sleep_ms(20);
        while (s.roff < 3000) {
            ssize_t r;

            memset(s.rb->p, IT_GUARD_BYTE, 4096);
            st_post_recv(&s.p, s.rb->p, 4096, 0, s.rb->mh, idx);
            r = st_wait_recv(&s.p, idx++, &ev);
            ck_assert_msg(r > 0,
                          "%s: receive after the peer's close with %" PRIu64 " of 3000 ring bytes "
                          "delivered: result %zd (bytes whose sends had completed were lost)",
                          mode_names[mode], s.roff, r);
            ck_assert_int_lt(st_check(s.rb->p, s.roff, (size_t)r, s.seed), 0);
            s.roff += (uint64_t)r;
        }
        ck_assert_uint_eq(s.roff, 3000);
        st_post_recv(&s.p, s.rb->p, 4096, 0, s.rb->mh, idx);
        ck_assert_int_eq(st_wait_recv(&s.p, idx, NULL), 0);
        st_pair_close(&s.p);
        it_fini();
    }
}
END_TEST

/* The sender shuts down and closes as soon as its last send completed, while the receiver
 * (slower: it pauses 1 ms per completion) still has receives outstanding and data in
 * flight or in its ring, as a file-transfer sender does: the receiver still gets every
 * byte, then 0 - never ECONNRESET. Repeated to catch the race. */
static void close_while_receiving(int mode, int round)
{
    enum { NB = 8 };
    const size_t chunk = MiB, volume = 16 * MiB;
    struct st_seq s;
    uint64_t posted_s = 0, done_s = 0, done_r = 0;
    int closed = 0, eos = 0, out_r = 0, shut_seen = 0;
    exs_event_t ev;

    it_context("%s, round %d", mode_names[mode], round);
    seq_open(&s, mode, volume, NB * chunk);
    for (int i = 0; i < NB; i++, posted_s++)
        st_post_send(&s.p, s.sb, posted_s * chunk, chunk, posted_s);
    for (int i = 0; i < NB; i++, out_r++)
        st_post_recv(&s.p, s.rb->p + (size_t)i * chunk, chunk, 0, s.rb->mh, (uint64_t)i);
    s.nrecv = NB;
    while (!eos || out_r > 0 || closed != 2 || !shut_seen) {
        it_wait_event_at(s.p.q, -1, -1, IT_TIMEOUT_MS, &ev, __FILE__, __LINE__);
        if (ev.exs_evt_type == EXS_EVT_SEND) {
            ck_assert_msg(ev.exs_evt_errno == 0, "%s round %d: send #%" PRIu64 ": errno %d (%s)",
                          mode_names[mode], round, ST_AH_IDX(ev.exs_evt_ahandle), ev.exs_evt_errno,
                          strerror(ev.exs_evt_errno));
            done_s++;
            if (posted_s * chunk < volume) {
                st_post_send(&s.p, s.sb, posted_s * chunk, chunk, posted_s);
                posted_s++;
            } else if (done_s == posted_s && !closed) {
                /* Everything sent: end the stream and close at once. */
                IT_EXPECT_OK(exs_shutdown(s.p.cfd, SHUT_WR, s.p.q, ST_AH(ST_SHUT, 0)));
                IT_EXPECT_OK(exs_close(s.p.cfd, s.p.q, IT_AH(0xC105E)));
                closed = 1;
            }
        } else if (ev.exs_evt_type == EXS_EVT_RECV) {
            uint64_t idx = ST_AH_IDX(ev.exs_evt_ahandle);
            ssize_t r = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
            uint8_t *buf = ev.exs_evt_u.exs_evt_xfer.exs_evt_buf;

            ck_assert_msg(ev.exs_evt_errno == 0 && r >= 0,
                          "%s round %d: receive #%" PRIu64 " at stream offset %" PRIu64
                          " of %zu (sender %s): errno %d (%s) result %zd, expected data or 0",
                          mode_names[mode], round, idx, s.roff, volume,
                          closed ? "closed after SHUT_WR" : "still open", ev.exs_evt_errno,
                          strerror(ev.exs_evt_errno), r);
            ck_assert_msg(idx == done_r, "receive #%" PRIu64 " completed before #%" PRIu64, idx,
                          done_r);
            done_r++;
            out_r--;
            if (r == 0) {
                ck_assert_msg(s.roff == volume,
                              "%s round %d: end of stream after %" PRIu64 " of %zu bytes",
                              mode_names[mode], round, s.roff, volume);
                eos = 1;
                continue;
            }
            ck_assert_int_lt(st_check(buf, s.roff, (size_t)r, s.seed), 0);
            s.roff += (uint64_t)r;
            it_sleep_ms(1); /* a slow consumer */
            if (!eos) {
                st_post_recv(&s.p, buf, chunk, 0, s.rb->mh, s.nrecv++);
                out_r++;
            }
        } else if (ev.exs_evt_type == EXS_EVT_SHUTDOWN) {
            /* The close right after may cancel it (spec/api.md section 8). */
            ck_assert_msg(ev.exs_evt_errno == 0 || ev.exs_evt_errno == ECANCELED,
                          "%s round %d: SHUTDOWN event errno %d (%s)", mode_names[mode], round,
                          ev.exs_evt_errno, strerror(ev.exs_evt_errno));
            shut_seen = 1;
        } else {
            ck_assert_msg(ev.exs_evt_type == EXS_EVT_CLOSE && ev.exs_evt_fd == s.p.cfd,
                          "unexpected event type %d fd %d", ev.exs_evt_type, ev.exs_evt_fd);
            closed = 2;
        }
    }
    s.p.cfd = -1;
    st_pair_close(&s.p);
    it_buf_free(s.sb);
    it_buf_free(s.rb);
}

START_TEST(test_eos_close_while_receiving)
{
    it_init();
    for (int round = 0; round < 5; round++) {
        for (int mode = EXS_XFER_DYNAMIC; mode <= EXS_XFER_INDIRECT_ONLY; mode++)
            close_while_receiving(mode, round);
    }
}
END_TEST

/* The sending peer is another process, as with samples/stream_send: it sends 16 MiB with
 * 8 sends of 1 MiB outstanding, exs_shutdown(SHUT_WR), exs_close and exs_fini (all
 * synchronous) and exits as soon as its last send completed. The receiver, slower, must
 * still get every byte and then 0, never ECONNRESET. */
static int child_send(uint16_t port, int mode, uint64_t seed, size_t volume)
{
    const size_t chunk = MiB;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = port};
    uint8_t *buf = malloc(volume);
    exs_qhandle_t q;
    exs_mhandle_t mh;
    size_t off = 0;
    int fd, out = 0;

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!buf || exs_init(EXS_VERSION) != EXS_VERSION)
        return 10;
    st_fill(buf, 0, volume, seed);
    q = exs_qcreate(64);
    mh = exs_mregister(buf, volume, 0);
    fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (q == EXS_QHANDLE_INVALID || mh == EXS_MHANDLE_INVALID || fd < 0)
        return 11;
    if (exs_setsockopt(fd, SOL_EXS, EXS_SO_XFER_MODE, &mode, sizeof(mode)) != 0)
        return 12;
    if (exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), EXS_QHANDLE_INVALID, NULL) != 0)
        return 13;
    while (off < volume || out > 0) {
        exs_event_t ev;

        while (off < volume && out < 8) {
            if (exs_send(fd, buf + off, chunk, 0, q, NULL, mh) != 0)
                return 14;
            off += chunk;
            out++;
        }
        if (exs_qdequeue(q, &ev, 1, NULL) != 1 || ev.exs_evt_type != EXS_EVT_SEND ||
            ev.exs_evt_errno != 0)
            return 15;
        out--;
    }
    if (exs_shutdown(fd, SHUT_WR, EXS_QHANDLE_INVALID, NULL) != 0)
        return 16;
    if (exs_close(fd, EXS_QHANDLE_INVALID, NULL) != 0)
        return 17;
    exs_mderegister(mh);
    exs_qdelete(q);
    exs_fini();
    free(buf);
    return 0;
}

/* The sending process: exs_integ_test --child-stream-send FD MODE SEED VOLUME, exec'd by
 * peer_process_exit (a fresh program, as a real peer is: rdma-core's device contexts do
 * not survive fork). It reads the listener's port from descriptor FD. */
int it_child_stream_send(int argc, char **argv)
{
    uint16_t port;
    int fd;

    if (argc != 4)
        return 8;
    fd = atoi(argv[0]);
    if (read(fd, &port, sizeof(port)) != (ssize_t)sizeof(port))
        return 9;
    close(fd);
    return child_send(port, atoi(argv[1]), strtoull(argv[2], NULL, 0),
                      (size_t)strtoull(argv[3], NULL, 0));
}

static void peer_process_exit(int mode, int round)
{
    const size_t chunk = MiB, volume = 16 * MiB;
    uint64_t seed = st_mix(st_base_seed(), 0xF0F0 + (uint64_t)mode);
    int pfd[2], lfd, fd, status = -1;
    uint16_t port;
    pid_t pid;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t alen = sizeof(sin);
    struct it_buf *rb;
    exs_qhandle_t q;
    exs_event_t ev;
    uint64_t roff = 0, nrecv = 0;
    int out = 0, eos = 0;

    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char a_fd[16], a_mode[16], a_seed[32], a_vol[32];

        close(pfd[1]);
        snprintf(a_fd, sizeof(a_fd), "%d", pfd[0]);
        snprintf(a_mode, sizeof(a_mode), "%d", mode);
        snprintf(a_seed, sizeof(a_seed), "%" PRIu64, seed);
        snprintf(a_vol, sizeof(a_vol), "%zu", volume);
        execl("/proc/self/exe", "exs_integ_test", "--child-stream-send", a_fd, a_mode, a_seed,
              a_vol, (char *)NULL);
        _exit(7);
    }
    close(pfd[0]);
    it_init();
    it_context("%s, round %d, sender pid %d", mode_names[mode], round, (int)pid);
    q = it_qcreate(64);
    rb = it_buf_new(8 * chunk, 1);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    st_set_mode(lfd, mode);
    IT_EXPECT_OK(exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)));
    IT_EXPECT_OK(exs_listen(lfd, 4));
    IT_EXPECT_OK(exs_getsockname(lfd, (struct sockaddr *)&sin, &alen));
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(0xACC)));
    port = sin.sin_port;
    ck_assert_int_eq(write(pfd[1], &port, sizeof(port)), (ssize_t)sizeof(port));
    close(pfd[1]);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
    fd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_int_ge(fd, 0);
    for (int i = 0; i < 8; i++, out++)
        IT_EXPECT_OK(
            exs_recv(fd, rb->p + (size_t)i * chunk, chunk, 0, q, ST_AH(ST_RECV, nrecv++), rb->mh));
    while (out > 0) {
        ssize_t r;
        uint8_t *buf;

        it_wait_event_at(q, EXS_EVT_RECV, fd, IT_TIMEOUT_MS, &ev, __FILE__, __LINE__);
        out--;
        r = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        buf = ev.exs_evt_u.exs_evt_xfer.exs_evt_buf;
        if (ev.exs_evt_errno != 0 || r < 0) {
            /* say whether the sender got through its sends (exit 0) or failed a step */
            for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; i++)
                it_sleep_ms(50);
            ck_abort_msg("%s round %d: receive at stream offset %" PRIu64 " of %zu: errno %d "
                         "(%s) result %zd, expected the remaining bytes then 0; the sending "
                         "process ended with status %#x (exit code = step that failed, see "
                         "child_send; 0 = all sends completed, shut down and closed)",
                         mode_names[mode], round, roff, volume, ev.exs_evt_errno,
                         strerror(ev.exs_evt_errno), r, (unsigned)status);
        }
        if (r == 0) {
            ck_assert_msg(roff == volume, "%s round %d: end of stream after %" PRIu64 " of %zu",
                          mode_names[mode], round, roff, volume);
            eos = 1;
            continue;
        }
        ck_assert_msg(!eos, "data after end of stream");
        ck_assert_int_lt(st_check(buf, roff, (size_t)r, seed), 0);
        roff += (uint64_t)r;
        it_sleep_ms(2); /* a slow consumer */
        IT_EXPECT_OK(exs_recv(fd, buf, chunk, 0, q, ST_AH(ST_RECV, nrecv++), rb->mh));
        out++;
        if (!eos && out == 0)
            break;
    }
    ck_assert(eos);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "%s round %d: the sending process ended with status %#x (exit code = step "
                  "that failed, see child_send)",
                  mode_names[mode], round, (unsigned)status);
    it_close(fd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_fini();
}

START_TEST(test_eos_peer_process_exit)
{
    for (int round = 0; round < 4; round++) {
        for (int mode = EXS_XFER_DYNAMIC; mode <= EXS_XFER_INDIRECT_ONLY; mode++)
            peer_process_exit(mode, round);
    }
}
END_TEST

/* ======================================================================================
 * 6. Return to direct (spec/protocol.md §7.2)
 * ====================================================================================== */

/*
 * Dynamic mode, twice as many receives as sends: the sender starts indirect (its first
 * sends go into the ring before any receive is posted) and keeps 16 sends of 64 KiB in
 * flight, a pipeline that fits the 1 MiB ring, while the receiver keeps 32 receives of
 * 64 KiB posted (MSG_WAITALL when waitall), over a link of 1 ms each way. The receiver is
 * ahead: the connection must come back to direct (direct_xfers grows, most transfers
 * after the start are direct), every byte in order in the right receive, WAITALL receives
 * full. Whether the published rule alone gets back here depends on timing (an ADVERT
 * that finds the sender stalled on ring room is exact), so the DRAIN count is printed,
 * not asserted; tests/unit/test_proto_stream.c (st_drain_to_direct) builds the case that
 * only DRAIN resolves, step by step.
 */
static void drain_run(int waitall)
{
    enum { SENDS = 16, RECVS = 32 };
    const size_t len = 64 * KiB, total = 32 * MiB;
    struct exs_sock_stats s0, s1, r1;
    struct st_seq q;
    uint64_t posted_s = 0, done_s = 0, posted_r = 0, roff = 0;
    char sb[300], rb[300];
    double deadline;

    /* a 1 ms link: ring writes are always in flight when an ADVERT arrives */
    it_setenv("EXS_EMU_DELAY_US", "1000");
    it_init();
    it_context("return to direct, %s", waitall ? "MSG_WAITALL" : "plain receives");
    seq_open(&q, EXS_XFER_DYNAMIC, total, RECVS * len);
    /* indirect start: half the ring before any receive exists */
    for (; posted_s < SENDS / 2; posted_s++)
        st_post_send(&q.p, q.sb, posted_s * len, len, posted_s);
    for (; done_s < SENDS / 2; done_s++)
        it_expect_xfer_at(q.p.q, EXS_EVT_SEND, q.p.cfd, ST_AH(ST_SEND, done_s), (ssize_t)len, 0,
                          NULL, __FILE__, __LINE__);
    st_stats(q.p.cfd, &s0);
    ck_assert_msg(s0.indirect_xfers > 0 && s0.direct_xfers == 0,
                  "the start must be indirect [sender: %s]", st_fmt_stats(&s0, sb, sizeof(sb)));
    for (; posted_s < SENDS / 2 + SENDS; posted_s++)
        st_post_send(&q.p, q.sb, posted_s * len, len, posted_s);
    memset(q.rb->p, IT_GUARD_BYTE, RECVS * len);
    for (; posted_r < RECVS; posted_r++)
        st_post_recv(&q.p, q.rb->p + (posted_r % RECVS) * len, len, waitall ? MSG_WAITALL : 0,
                     q.rb->mh, posted_r);
    deadline = it_now_ms() + 60000;
    while (roff < total) {
        struct timespec to = {0, 100000000};
        exs_event_t ev;
        int k = exs_qdequeue(q.p.q, &ev, 1, &to);

        ck_assert_msg(it_now_ms() < deadline, "no end after 60 s: %" PRIu64 " of %zu bytes", roff,
                      total);
        if (k <= 0)
            continue;
        ck_assert_msg(ev.exs_evt_errno == 0, "event type %d: errno %d", ev.exs_evt_type,
                      ev.exs_evt_errno);
        uint64_t idx = ST_AH_IDX(ev.exs_evt_ahandle);
        if (ev.exs_evt_type == EXS_EVT_SEND) {
            ck_assert_uint_eq(idx, done_s);
            ck_assert_int_eq(ev.exs_evt_u.exs_evt_xfer.exs_evt_result, (ssize_t)len);
            done_s++;
            if (posted_s * len < total) {
                st_post_send(&q.p, q.sb, posted_s * len, len, posted_s);
                posted_s++;
            }
            continue;
        }
        ck_assert_int_eq(ev.exs_evt_type, EXS_EVT_RECV);
        ssize_t r = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        uint8_t *buf = q.rb->p + (idx % RECVS) * len;
        long bad;

        ck_assert_msg(r > 0, "receive %" PRIu64 ": result %zd before the end", idx, r);
        if (waitall)
            ck_assert_msg((size_t)r == len, "MSG_WAITALL receive %" PRIu64 ": %zd of %zu bytes",
                          idx, r, len);
        bad = st_check(buf, roff, (size_t)r, q.seed);
        ck_assert_msg(bad < 0, "receive %" PRIu64 " (stream offset %" PRIu64 "): wrong byte at %ld",
                      idx, roff, bad);
        for (size_t j = (size_t)r; j < len; j++) /* nothing written past the result */
            ck_assert_msg(buf[j] == IT_GUARD_BYTE,
                          "receive %" PRIu64 ": byte %zu past its "
                          "result %zd was written",
                          idx, j, r);
        roff += (uint64_t)r;
        memset(buf, IT_GUARD_BYTE, len);
        st_post_recv(&q.p, buf, len, waitall ? MSG_WAITALL : 0, q.rb->mh, posted_r++);
    }
    while (done_s < posted_s) {
        it_expect_xfer_at(q.p.q, EXS_EVT_SEND, q.p.cfd, ST_AH(ST_SEND, done_s), (ssize_t)len, 0,
                          NULL, __FILE__, __LINE__);
        done_s++;
    }
    st_stats(q.p.cfd, &s1);
    st_stats(q.p.sfd, &r1);
    st_fmt_stats(&s1, sb, sizeof(sb));
    st_fmt_stats(&r1, rb, sizeof(rb));
    printf("return to direct (%s): sender: %s, drain %" PRIu64 ", direct %" PRIu64
           " us, indirect %" PRIu64 " us; receiver: %s, drain %" PRIu64 "\n",
           waitall ? "waitall" : "plain", sb, s1.drain_requests, s1.direct_time_us,
           s1.indirect_time_us, rb, r1.drain_requests);
    fflush(stdout);
    ck_assert_msg(r1.drain_requests == s1.drain_requests,
                  "DRAIN: receiver sent %" PRIu64 ", sender honoured %" PRIu64 " [sender: %s]",
                  r1.drain_requests, s1.drain_requests, sb);
    ck_assert_msg(s1.direct_xfers > s0.direct_xfers,
                  "the sender never came back to direct [sender: %s]", sb);
    ck_assert_msg(s1.direct_xfers > s1.indirect_xfers - s0.indirect_xfers,
                  "after the start, most transfers must be direct [sender: %s]", sb);
    ck_assert_msg(s1.direct_time_us > 0 && s1.indirect_time_us > 0,
                  "phase times: direct %" PRIu64 " us, indirect %" PRIu64 " us", s1.direct_time_us,
                  s1.indirect_time_us);
    /* the outstanding receives beyond the stream end with the sender's SHUT_WR */
    IT_EXPECT_OK(exs_shutdown(q.p.cfd, SHUT_WR, q.p.q, ST_AH(ST_SHUT, 0)));
    it_expect_err(q.p.q, EXS_EVT_SHUTDOWN, q.p.cfd, ST_AH(ST_SHUT, 0), 0);
    for (uint64_t i = posted_r - RECVS; i < posted_r; i++)
        ck_assert_msg(st_wait_recv(&q.p, i, NULL) == 0, "receive %" PRIu64 " after the end", i);
    st_pair_close(&q.p);
}

START_TEST(test_drain_plain)
{
    drain_run(0);
}
END_TEST

START_TEST(test_drain_waitall)
{
    drain_run(1);
}
END_TEST

/* §7.4: 16 receives of 64 bytes posted with the ring empty, then 16 sends of 64 bytes.
 * small_min sets EXS_STREAM_DIRECT_MIN for the run; tx_mode is the sender's mode (the
 * receiver stays dynamic). Returns the receiver's and the sender's statistics. */
static void small_run(uint64_t small_min, int tx_mode, struct st_snap *x)
{
    uint64_t saved = exs__params.stream_direct_min;
    struct st_seq s;

    it_init();
    exs__params.stream_direct_min = small_min;
    memset(&s, 0, sizeof(s));
    s.seed = st_mix(st_base_seed(), 0x5A11u);
    st_pair_open_modes(&s.p, EXS_XFER_DYNAMIC, tx_mode, 256);
    s.sb = it_buf_new(16 * 64, 1);
    s.rb = it_buf_new(4096, 1); /* seq_finish takes the end of stream with 4096 bytes */
    st_fill(s.sb->p, 0, 16 * 64, s.seed);
    memset(s.rb->p, IT_GUARD_BYTE, 16 * 64);
    for (int i = 0; i < 16; i++)
        st_post_recv(&s.p, s.rb->p + (size_t)i * 64, 64, 0, s.rb->mh, s.nrecv + (uint64_t)i);
    if (small_min == 0 || tx_mode == EXS_XFER_DIRECT_ONLY)
        ST_WAIT_STAT(s.p.cfd, adverts_received, 1); /* advertised with the ring empty */
    else
        it_sleep_ms(50); /* room for an ADVERT the rule must not send */
    seq_send(&s, 16, 64);
    for (int i = 0; i < 16; i++) {
        ssize_t r = st_wait_recv(&s.p, s.nrecv, NULL);
        long bad;

        ck_assert_msg(r > 0, "receive %d: result %zd", i, r);
        bad = st_check(s.rb->p + (size_t)i * 64, s.roff, (size_t)r, s.seed);
        ck_assert_msg(bad < 0, "receive %d: wrong byte at %ld", i, bad);
        s.roff += (uint64_t)r;
        s.nrecv++;
    }
    seq_recv_until(&s, 16 * 64, 64, 0); /* what the first 16 left (a receive may take less) */
    seq_send_wait(&s);
    snap(&s, x);
    printf("small receives (min %" PRIu64 ", sender mode %d): sender: %s; receiver: %s\n",
           small_min, tx_mode, x->sb, x->rb);
    fflush(stdout);
    seq_finish(&s);
    exs__params.stream_direct_min = saved;
}

START_TEST(test_small_recvs_stay_indirect)
{
    struct st_snap x;

    small_run(32768, EXS_XFER_DYNAMIC, &x);
    ck_assert_msg(x.r.adverts_sent == 0 && x.s.direct_xfers == 0 && x.s.indirect_xfers > 0,
                  "64-byte receives must stay indirect [sender: %s] [receiver: %s]", x.sb, x.rb);
}
END_TEST

/* EXS_STREAM_DIRECT_MIN=0 is the published rule: the same receives are advertised. */
START_TEST(test_small_recvs_published_rule)
{
    struct st_snap x;

    small_run(0, EXS_XFER_DYNAMIC, &x);
    ck_assert_msg(x.r.adverts_sent > 0 && x.s.direct_xfers > 0,
                  "with EXS_STREAM_DIRECT_MIN=0 empty-ring receives are advertised [sender: %s] "
                  "[receiver: %s]",
                  x.sb, x.rb);
}
END_TEST

/* A direct-only sender never writes the ring: small receives are advertised to it. */
START_TEST(test_small_recvs_direct_only_peer)
{
    struct st_snap x;

    small_run(32768, EXS_XFER_DIRECT_ONLY, &x);
    ck_assert_msg(x.r.adverts_sent >= 16 && x.s.indirect_xfers == 0,
                  "a direct-only sender gets every receive advertised [sender: %s] [receiver: %s]",
                  x.sb, x.rb);
}
END_TEST

Suite *integ_stream_suite(void)
{
    Suite *s = suite_create("integ_stream");
    TCase *tc;

    tc = it_tcase("stream_stress", 90);
    tcase_add_test(tc, test_stress_dynamic);
    tcase_add_test(tc, test_stress_direct);
    tcase_add_test(tc, test_stress_indirect);
    tcase_add_test(tc, test_stress_dynamic_delay);
    tcase_add_test(tc, test_stress_direct_delay);
    tcase_add_test(tc, test_stress_indirect_delay);
    suite_add_tcase(s, tc);
    tc = it_tcase("stream_stats", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_stats_direct_only);
    tcase_add_test(tc, test_stats_indirect_only);
    tcase_add_test(tc, test_stats_dynamic);
    tcase_add_test(tc, test_stats_env_mode);
    tcase_add_test(tc, test_stats_abi_prefix);
    suite_add_tcase(s, tc);
    tc = it_tcase("stream_split", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_split_dynamic);
    tcase_add_test(tc, test_split_direct);
    tcase_add_test(tc, test_split_indirect);
    suite_add_tcase(s, tc);
    tc = it_tcase("stream_multithread", 120);
    tcase_add_test(tc, test_multithread);
    suite_add_tcase(s, tc);
    tc = it_tcase("stream_eos", IT_CASE_TIMEOUT);
    tcase_add_test(tc, test_eos_close);
    tcase_add_test(tc, test_eos_shutdown_partial);
    tcase_add_test(tc, test_eos_ring_after_close);
    tcase_add_test(tc, test_eos_close_while_receiving);
    tcase_add_test(tc, test_eos_peer_process_exit);
    suite_add_tcase(s, tc);
    tc = it_tcase("stream_drain", 120);
    tcase_add_test(tc, test_drain_plain);
    tcase_add_test(tc, test_drain_waitall);
    tcase_add_test(tc, test_small_recvs_stay_indirect);
    tcase_add_test(tc, test_small_recvs_published_rule);
    tcase_add_test(tc, test_small_recvs_direct_only_peer);
    suite_add_tcase(s, tc);
    return s;
}
