/* SPDX-License-Identifier: MIT */
/* The shm provider's own rules: a lying peer that scribbles its ring and its answers, and a
 * peer process killed mid-transfer (run with -p shm; skipped elsewhere). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "exs/util/util.h"
#include "tests/prov/prov_shm_nic.h"
#include "tests/prov/prov_test.h"
#include "tests/skip.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

static int skip_unless_shm(const char *test)
{
    if (strcmp(pt_name, "shm") == 0)
        return 0;
    test_skip(test, "shm provider itself only; provider is %s", pt_name);
    return 1;
}

/* b's doorbell, a copy of the liar's (whose NIC closes its own when the connection ends) */
static int bell_fd = -1;

/* The liar: host a's side of the connection, whose ring and line b reads; taken before the
 * lie, since a's NIC frees its connection once b ended it. */
struct liar {
    uint8_t *tx_ring;
    uint64_t head;
    struct shm_line *mine;
    const struct shm_line *peer; /* b's line: what b took of the liar's ring */
};

static struct liar liar(struct pt_pair *p)
{
    struct shm_ctx *ctx = shm_ep_of(p->ea)->ctx;
    struct shm_conn *conn;
    struct liar l;

    /* the connection is the NIC's: read under its lock, which its end and free take too */
    nic_hold(ctx);
    conn = shm_ep_of(p->ea)->conn;
    ck_assert_ptr_nonnull(conn);
    bell_fd = dup(conn->bell);
    l = (struct liar){conn->tx_ring, conn->head, conn->mine, conn->peer};
    nic_drop(ctx);
    ck_assert_int_ge(bell_fd, 0);
    return l;
}

/* Ring b's doorbell, as a writer does after a change b waits for. */
static void ring_bell(void)
{
    uint64_t one = 1;

    ck_assert_int_eq(write(bell_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* Publish a record written by hand at the liar's head: its header but the size and its
 * body, then the size word, which says the record is written (the slot after it is left as
 * it is: zero in a fresh ring). */
static void put_rec(const struct liar *c, const struct shm_rec *rec, const void *body,
                    uint32_t blen)
{
    uint64_t pos = c->head & (SHM_RING_DEFAULT - 1);
    struct shm_rec *at = (struct shm_rec *)(void *)(c->tx_ring + pos);

    memcpy(at, rec, offsetof(struct shm_rec, size));
    if (blen)
        memcpy(c->tx_ring + pos + SHM_REC_HDR, body, blen);
    __atomic_store_n(&at->size, rec->size, __ATOMIC_SEQ_CST);
    ring_bell();
}

/* What an honest PAD's writer does before it stores the PAD's size: the size word of the
 * ring's first slot zeroed (the record an earlier lap left there is no new one), so a lying
 * PAD that b took would leave it waiting there (the test fails by its timeout), not finding
 * the earlier record (a protocol error of its own, which would hide the PAD's). */
static void zero_lap_start(const struct liar *c)
{
    __atomic_store_n((uint32_t *)(void *)(c->tx_ring + offsetof(struct shm_rec, size)), 0,
                     __ATOMIC_RELAXED);
}

static uint64_t shm_counter(const char *name)
{
    uint64_t v = 0;

    ck_assert_int_eq(exs__counters_lookup("prov.shm", name, &v), 0);
    return v;
}

/* b ended the connection with status; b's ep is in ERROR and a still gets DISCONNECTED. */
static void expect_b_ended(struct pt_pair *p, int status)
{
    struct exs_prov_cm_event ev;

    pt_wait_cm(&p->b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    ck_assert_msg(ev.status == status, "DISCONNECTED status %d, expected %d", ev.status, status);
    ck_assert_int_eq(pt_ops->ep_state(p->eb), EXS_PROV_EP_ERROR);
    pt_wait_cm(&p->a, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->ea);
}

/* Another connection through the same listener works: the liar ended only its own. */
static void fresh_connection_works(struct pt_pair *p)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct pt_buf *src = pt_pair_buf(p, 'a', 64, LW, 0x3C), *dst = pt_pair_buf(p, 'b', 64, LW, 0);
    struct exs_prov_cqe c;

    pt_ep_close(&p->a, p->ea);
    pt_ep_close(&p->b, p->eb);
    ck_assert_int_eq(pt_ops->ep_create(p->a.ctx, &at, &p->ea), 0);
    ck_assert_int_eq(pt_ops->ep_create(p->b.ctx, &at, &p->eb), 0);
    p->a_up = p->b_up = 0;
    pt_pair_connect(p);
    ck_assert_int_eq(pt_post_recv(p->eb, 1, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p->ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p->b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, 64);
    ck_assert(pt_all_bytes(dst->p, 64, 0x3C));
    pt_expect_cqe(&p->a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
}

/* ---- a liar in the ring: each is a protocol error for that one connection ---- */

enum {
    LIE_SIZE_RING,   /* a record as large as the ring (no slot left free after it) */
    LIE_SIZE_SLOT,   /* a size not a whole number of slots */
    LIE_HUGE_INLINE, /* inline record claiming 1 GiB */
    LIE_SIZE_BEYOND, /* record larger than what was published */
    LIE_SEQUENCE,    /* record out of sequence */
    LIE_TYPE,        /* unknown record type */
    LIE_SGES,        /* more remote sges than allowed */
    LIE_SGE_SUM,     /* remote sges that do not add up to the length */
    LIE_TORN,        /* a slot half written: the second half garbage */
    LIE_ACK,         /* an ack of requests never sent */
    LIE_NAK,         /* a nak of a request never sent */
    LIE_TAIL,        /* claims to have consumed more than was written */
    LIE_BAD_SOURCE,  /* a WRITE whose source is no memory of the peer's */
    LIE_TAIL_FULL,   /* the tail lie, found when the ring looks full (no answer read it) */
    /* PAD records (the hot window, version 7), after one honest SEND (the liar's position
     * 128: not a lap's start) but pad_whole */
    LIE_PAD_START,  /* a PAD sized from a slot before its position: ends beyond the lap end */
    LIE_PAD_WHOLE,  /* a PAD at the lap's start, the whole ring */
    LIE_PAD_SHORT,  /* a PAD ending a slot before the lap end */
    LIE_PAD_SLOT,   /* a PAD not a whole number of slots (8 bytes short of the lap end) */
    LIE_PAD_FIELDS, /* a PAD with a field that must be 0 set (rkey, its last before size) */
    LIE_PAD_PSN,    /* a PAD carrying the next request's psn */
    LIE_COUNT
};

static const char *const lie_names[LIE_COUNT] = {
    "size_ring", "size_slot", "huge_inline", "size_beyond", "sequence",   "type",       "sges",
    "sge_sum",   "torn",      "ack",         "nak",         "tail",       "bad_source", "tail_full",
    "pad_start", "pad_whole", "pad_short",   "pad_slot",    "pad_fields", "pad_psn",
};

/* One honest 64 B SEND from a to b, received into a buffer of its own: the liar's position
 * then 128 (an inline record of 96 bytes), b's next psn 1. */
static void honest_send(struct pt_pair *p)
{
    struct pt_buf *src = pt_pair_buf(p, 'a', 64, LW, 0x5A), *dst = pt_pair_buf(p, 'b', 64, LW, 0);

    ck_assert_int_eq(pt_post_recv(p->eb, 90, dst, 0, 64), 0);
    ck_assert_int_eq(pt_post_send(p->ea, 91, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p->b, 90, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_expect_cqe(&p->a, 91, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert(pt_all_bytes(dst->p, 64, 0x5A));
}

START_TEST(shm_liar)
{
    char test[64];
    struct pt_pair p;
    struct pt_buf *dst, *tgt = NULL;
    struct exs_prov_grant *g = NULL;
    struct liar l, *c = &l;
    struct shm_rec rec;
    struct shm_rsge rs[17];
    uint64_t perr;

    snprintf(test, sizeof(test), "shm_liar_%s", lie_names[_i]);
    if (skip_unless_shm(test))
        return;
    pt_pair_setup(&p, NULL, NULL);
    if (_i >= LIE_PAD_START && _i != LIE_PAD_WHOLE)
        honest_send(&p);
    l = liar(&p);
    ck_assert_uint_eq(l.head, _i >= LIE_PAD_START && _i != LIE_PAD_WHOLE ? 128 : 0);
    dst = pt_pair_buf(&p, 'b', 256, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, 256), 0);
    perr = shm_counter("protocol_errors");
    memset(&rec, 0, sizeof(rec));
    memset(rs, 0, sizeof(rs));
    rec.type = SHM_REC_SEND;
    rec.flags = SHM_RF_INLINE;
    rec.len = 16;
    rec.size = SHM_SLOT;
    switch (_i) {
    case LIE_SIZE_RING:
        rec.size = SHM_RING_DEFAULT;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_SIZE_SLOT:
        rec.size = SHM_SLOT + 8;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_HUGE_INLINE:
        rec.len = 1u << 30;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_SIZE_BEYOND:
        rec.size = 2 * SHM_SLOT;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_SEQUENCE:
        rec.psn = 5;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_TYPE:
        rec.type = 9;
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_SGES:
        rec.flags = 0;
        rec.nsge = 17;
        rec.len = 17;
        rec.size = (SHM_REC_HDR + 17 * sizeof(rs[0]) + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
        for (int i = 0; i < 17; i++)
            rs[i] = (struct shm_rsge){(uint64_t)(uintptr_t)dst->p, 1};
        put_rec(c, &rec, rs, 17 * sizeof(rs[0]));
        break;
    case LIE_SGE_SUM:
        rec.flags = 0;
        rec.nsge = 1;
        rec.len = 200;
        rs[0] = (struct shm_rsge){(uint64_t)(uintptr_t)dst->p, 100};
        put_rec(c, &rec, rs, sizeof(rs[0]));
        break;
    case LIE_TORN:
        memset((uint8_t *)&rec + 16, 0xff, sizeof(rec) - 16);
        put_rec(c, &rec, NULL, 0);
        break;
    case LIE_ACK:
        __atomic_store_n(&c->mine->ack, 7, __ATOMIC_RELEASE);
        ring_bell();
        break;
    case LIE_NAK:
        __atomic_store_n(&c->mine->nak_psn, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&c->mine->nak_syn, SHM_SYN_REM_ACCESS, __ATOMIC_RELEASE);
        ring_bell();
        break;
    case LIE_TAIL: {
        struct pt_buf *src = pt_pair_buf(&p, 'b', 64, LW, 1);

        /* a post reads the peer's tail only when the last one seen leaves no room; an
         * answer's look at the peer's line reads it too: the liar "answers" the request */
        __atomic_store_n(&c->mine->tail, 4096, __ATOMIC_RELEASE);
        ck_assert_int_eq(pt_post_send(p.eb, 2, EXS_PROV_WR_SEND, SIG, src, 0, 64, 0, 0, 0), 0);
        __atomic_store_n(&c->mine->ack, 1, __ATOMIC_SEQ_CST);
        ring_bell();
        pt_expect_wr(&p.b, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
        break;
    }
    case LIE_TAIL_FULL: {
        /* b posts 64 KiB SENDs (one fragment each, records of 65600 bytes, 63 fit the
         * ring of 4 MiB) that a holds by receiver-not-ready; the 64th finds no room by the
         * tail b saw last and reads the peer's: a lie, a protocol error */
        uint32_t rsz = (SHM_REC_HDR + SHM_FRAG_BYTES + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
        struct pt_buf *src = pt_pair_buf(&p, 'b', SHM_FRAG_BYTES, LW, 1);

        __atomic_store_n(&c->mine->tail, SHM_RING_DEFAULT, __ATOMIC_RELEASE);
        for (uint32_t i = 0; i <= SHM_RING_DEFAULT / rsz; i++)
            ck_assert_int_eq(
                pt_post_send(p.eb, 2 + i, EXS_PROV_WR_SEND, SIG, src, 0, SHM_FRAG_BYTES, 0, 0, 0),
                0);
        pt_expect_wr(&p.b, 2, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
        break;
    }
    case LIE_BAD_SOURCE:
        /* a real grant of b, a record within it, and a source that is no memory at all */
        tgt = pt_pair_buf(&p, 'b', 8192, LW, 0x11);
        ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, 8192, RW, &g), 0);
        rec.type = SHM_REC_WRITE;
        rec.flags = 0;
        rec.nsge = 1;
        rec.len = 8192;
        rec.raddr = (uint64_t)(uintptr_t)tgt->p;
        rec.rkey = g->rkey;
        rs[0] = (struct shm_rsge){4096, 8192}; /* page 1 of the address space */
        put_rec(c, &rec, rs, sizeof(rs[0]));
        break;
    case LIE_PAD_START:
    case LIE_PAD_WHOLE:
    case LIE_PAD_SHORT:
    case LIE_PAD_SLOT:
    case LIE_PAD_FIELDS:
    case LIE_PAD_PSN: {
        /* the honest PAD's size at the liar's position: to the lap's end (a PAD of size 0
         * is no lie to check: its slot says "not written") */
        uint32_t to_end = SHM_RING_DEFAULT - (uint32_t)(c->head & (SHM_RING_DEFAULT - 1));
        uint64_t next;

        memset(&rec, 0, sizeof(rec));
        rec.type = SHM_REC_PAD;
        rec.size = to_end;
        if (_i == LIE_PAD_START)
            rec.size = to_end + SHM_SLOT;
        else if (_i == LIE_PAD_SHORT)
            rec.size = to_end - SHM_SLOT;
        else if (_i == LIE_PAD_SLOT)
            rec.size = to_end - 8;
        else if (_i == LIE_PAD_FIELDS)
            rec.rkey = 1;
        else if (_i == LIE_PAD_PSN)
            rec.psn = 1; /* b's next psn: a request's, never a PAD's */
        zero_lap_start(c);
        /* and the slot where b would go on after the lie, when it is one (pad_start: offset
         * 64, inside the honest record): b taking the lie waits there, the test fails */
        next = (c->head + rec.size) & (SHM_RING_DEFAULT - 1);
        if (next % SHM_SLOT == 0 && next != (c->head & (SHM_RING_DEFAULT - 1)))
            __atomic_store_n(
                (uint32_t *)(void *)(c->tx_ring + next + offsetof(struct shm_rec, size)), 0,
                __ATOMIC_RELAXED);
        put_rec(c, &rec, NULL, 0);
        break;
    }
    }
    expect_b_ended(&p, -EPROTO);
    close(bell_fd);
    bell_fd = -1;
    ck_assert_uint_gt(shm_counter("protocol_errors"), perr);
    /* nothing of a lying ring was delivered: the receive is flushed, its buffer untouched */
    pt_expect_wr(&p.b, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(dst->p, 256, 0));
    ck_assert(pt_buf_guards_ok(dst));
    if (tgt) {
        ck_assert(pt_buf_guards_ok(tgt));
        pt_ops->revoke(g);
    }
    fresh_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

/* A liar that presents a real grant, one byte beyond it: refused (REM_ACCESS), the
 * connection aborted, not one byte placed or read beyond the grant. */
START_TEST(shm_liar_beyond_grant)
{
    struct pt_pair p;
    struct pt_buf *tgt, *src;
    struct exs_prov_grant *g;
    struct liar l, *c = &l;
    struct shm_rec rec;
    struct shm_rsge rs;
    uint8_t body[2 * SHM_SLOT];
    unsigned right = _i ? RR : RW;

    if (skip_unless_shm(_i ? "shm_liar_read_beyond_grant" : "shm_liar_write_beyond_grant"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    l = liar(&p);
    tgt = pt_pair_buf(&p, 'b', 64, LW, 0x22);
    src = pt_pair_buf(&p, 'a', 128, LW, 0x33);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, 64, right, &g), 0);
    memset(&rec, 0, sizeof(rec));
    memset(body, 0x44, sizeof(body));
    rec.len = 65;
    rec.raddr = (uint64_t)(uintptr_t)tgt->p;
    rec.rkey = g->rkey;
    if (right == RW) {
        rec.type = SHM_REC_WRITE;
        rec.flags = SHM_RF_INLINE;
        rec.size = 2 * SHM_SLOT;
        put_rec(c, &rec, body, 65);
    } else {
        rec.type = SHM_REC_READ;
        rec.nsge = 1;
        rec.size = SHM_SLOT;
        rs = (struct shm_rsge){(uint64_t)(uintptr_t)src->p, 65};
        put_rec(c, &rec, &rs, sizeof(rs));
    }
    expect_b_ended(&p, -ECONNABORTED);
    close(bell_fd);
    bell_fd = -1;
    ck_assert(pt_all_bytes(tgt->p, 64, 0x22));
    ck_assert(pt_buf_guards_ok(tgt));
    ck_assert(pt_all_bytes(src->p, 128, 0x33));
    pt_ops->revoke(g);
    pt_pair_close(&p);
}
END_TEST

/* ---- a peer process killed (SIGKILL) in the middle of transfers ---- */

struct kill_pd {
    uint64_t addr;
    uint32_t rkey;
    uint32_t len;
};

#define KILL_LEN (16u << 20)

/* The child: connect to port, give its buffer's address and key in the private data,
 * then let its NIC thread serve the parent's READs until it is killed. Never returns. */
static void kill_child(int rfd)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_attr attr = {0};
    struct exs_prov_cm_event ev;
    struct sockaddr_storage ss;
    struct exs_prov_ctx *ctx;
    struct exs_prov_mr *mr;
    struct exs_prov_ep *ep;
    struct kill_pd pd;
    socklen_t len;
    uint8_t *buf;

    if (pt_read_addr(rfd, &ss, &len))
        _exit(2);
    buf = malloc(KILL_LEN);
    if (!buf || pt_ops->ctx_open(&attr, &ctx) || pt_ops->ep_create(ctx, &at, &ep) ||
        pt_ops->mr_reg(ctx, buf, KILL_LEN, LW | RR | RW, &mr))
        _exit(3);
    memset(buf, 0x5c, KILL_LEN);
    pd = (struct kill_pd){(uint64_t)(uintptr_t)buf, mr->rkey, KILL_LEN};
    if (pt_ops->connect(ep, (struct sockaddr *)&ss, len, &pd, sizeof(pd)))
        _exit(4);
    for (;;) {
        if (pt_ops->ctx_cm_poll(ctx, &ev) == 1 && ev.type != EXS_PROV_CM_ESTABLISHED)
            _exit(5);
        pause();
    }
}

START_TEST(shm_peer_killed_mid_transfer)
{
    struct exs_prov_ep_attr at = pt_default_attr();
    struct exs_prov_listener *lis;
    struct exs_prov_cm_event ev;
    struct sockaddr_storage ss;
    struct exs_prov_cqe c;
    struct exs_prov_ep *ep;
    struct pt_buf *dst, *msg;
    struct pt_host h;
    struct kill_pd pd;
    socklen_t len;
    int wfd, st, nposted = 0, nok = 0, nfail = 0, reads = 8;
    double t_kill, t_disc = -1, t_last = -1;
    pid_t pid;

    if (skip_unless_shm("shm_peer_killed_mid_transfer"))
        return;
    pid = pt_fork_peer(kill_child, &wfd); /* before this process has threads of its own */
    pt_host_open(&h);
    lis = pt_listen(&h, &ss, &len);
    pt_tell_addr(wfd, &ss, len);
    pt_wait_cm(&h, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_uint_eq(ev.private_data_len, sizeof(pd));
    memcpy(&pd, ev.private_data, sizeof(pd));
    ck_assert_int_eq(pt_ops->ep_create(h.ctx, &at, &ep), 0);
    ck_assert_int_eq(pt_ops->accept(ev.req, ep, NULL, 0), 0);
    pt_wait_cm(&h, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    dst = pt_buf_new(&h, KILL_LEN, LW, 0);
    msg = pt_buf_new(&h, 64, LW, 1);
    /* READs of the child's 16 MiB, a SEND it never receives (held: no receive posted,
     * rnr_retry 7), and READs behind it: transfers in flight when it dies */
    for (int i = 0; i < reads; i++, nposted++)
        ck_assert_int_eq(pt_post_send(ep, 100 + i, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, KILL_LEN, 0,
                                      pd.addr, pd.rkey),
                         0);
    ck_assert_int_eq(pt_post_send(ep, 200, EXS_PROV_WR_SEND, SIG, msg, 0, 64, 0, 0, 0), 0);
    nposted++;
    for (int i = 0; i < reads; i++, nposted++)
        ck_assert_int_eq(pt_post_send(ep, 300 + i, EXS_PROV_WR_RDMA_READ, SIG, dst, 0, KILL_LEN, 0,
                                      pd.addr, pd.rkey),
                         0);
    /* the first READ done: the child is in the middle of serving the rest */
    pt_expect_cqe_t(&h, 10 * PT_TIMEOUT_MS, 100, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_READ, &c);
    ck_assert(pt_all_bytes(dst->p, KILL_LEN, 0x5c));
    nok++;
    t_kill = pt_now_ms();
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    while (nok + nfail < nposted) {
        ck_assert_msg(pt_try_cqe(&h, PT_TIMEOUT_MS, &c), "operations still outstanding: %d of %d",
                      nposted - nok - nfail, nposted);
        if (c.status == EXS_PROV_WC_SUCCESS) {
            ck_assert_msg(nfail == 0 && c.wr_id < 200, "wr %llu succeeded after a failure",
                          (unsigned long long)c.wr_id);
            nok++;
        } else {
            nfail++;
            t_last = pt_now_ms();
        }
    }
    pt_wait_cm(&h, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    t_disc = pt_now_ms();
    ck_assert_ptr_eq(ev.ep, ep);
    ck_assert_msg(ev.status == -ECONNRESET, "DISCONNECTED status %d", ev.status);
    /* the held SEND and every READ behind it failed */
    ck_assert_int_ge(nfail, reads + 1);
    printf("shm_peer_killed_mid_transfer: SIGKILL at +0 ms; the last of %d operations failed at "
           "+%.1f ms; DISCONNECTED (-ECONNRESET) polled at +%.1f ms\n",
           nfail, t_last - t_kill, t_disc - t_kill);
    fflush(stdout);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(wfd);
    pt_ops->ep_destroy(ep);
    pt_ops->listener_destroy(lis);
    pt_buf_free(dst);
    pt_buf_free(msg);
    pt_host_close(&h);
}
END_TEST

/* ---- the rendezvous deadline ---- */

/* A raw local process at p's listener: a unix socket connected to its abstract name. */
static int raw_rendezvous(const struct pt_pair *p)
{
    struct sockaddr_un un;
    unsigned port = 0;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(exs__shm_addr_port((const struct sockaddr *)&p->addr, p->addrlen, &port), 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&un, exs__shm_unix_name(&un, port)), 0);
    return fd;
}

/* A local process that connects to a listener's rendezvous socket and never sends its REQ
 * (loop 0: nothing; loop 1: a REQ's first 8 bytes, which is no REQ) holds nothing
 * forever: the silent one is closed at the deadline (EXS_TCP_HELLO_MS, 300 ms here) and
 * counted hello_refused, the partial one at once; nothing reaches the application and the
 * next connection is served. (The old provider kept the silent one open without end.) */
START_TEST(shm_rendezvous_deadline)
{
    struct shm_hs hs;
    struct pt_pair p;
    uint64_t refused0, bogus0;
    double t0, ms;
    int fd, end;

    if (skip_unless_shm("shm_rendezvous_deadline"))
        return;
    ck_assert_int_eq(exs__params_set("tcp_hello_ms", _i ? "3600000" : "300"), 0);
    pt_pair_open(&p, NULL, NULL);
    refused0 = shm_counter("hello_refused");
    bogus0 = shm_counter("bogus_conns");
    t0 = pt_now_ms();
    fd = raw_rendezvous(&p);
    if (_i) {
        memset(&hs, 0, sizeof(hs));
        hs.magic = SHM_MAGIC;
        hs.version = SHM_VERSION;
        hs.type = SHM_HS_REQ;
        ck_assert_int_eq(send(fd, &hs, 8, MSG_NOSIGNAL), 8);
    }
    end = pt_raw_end_within(fd, PT_TIMEOUT_MS);
    ms = pt_now_ms() - t0;
    ck_assert_msg(end == 0, "the rendezvous socket was %s, expected closed (EOF)",
                  end > 0 ? strerror(end) : "still open");
    printf("shm_rendezvous_deadline(%s): closed after %.0f ms\n", _i ? "partial" : "silent", ms);
    close(fd);
    if (!_i)
        ck_assert_msg(ms >= 250, "closed after %.0f ms, before the 300 ms deadline", ms);
    ck_assert_uint_eq(shm_counter("hello_refused") - refused0, _i ? 0 : 1);
    ck_assert_uint_eq(shm_counter("bogus_conns") - bogus0, 1);
    pt_expect_no_cm(&p.b, 50);
    pt_pair_connect(&p);
    pt_pair_close(&p);
    exs__params_set("tcp_hello_ms", exs__params_find("tcp_hello_ms")->defval);
}
END_TEST

/* A local process that connects and closes at once, without a request (what an active
 * side's look at a listener does: exs__prov_shm_peer, spec/provider-shm.md, Chosen by
 * itself), is counted rendezvous_closed, neither bogus nor a peer death, and held nothing
 * (the connection after it works); the look itself gives the listener's pid and uid. */
START_TEST(shm_rendezvous_look)
{
    struct pt_pair p;
    uint64_t closed0, bogus0, deaths0;
    uint32_t pid = 0, uid = 0;
    double t0;

    if (skip_unless_shm("shm_rendezvous_look"))
        return;
    pt_pair_open(&p, NULL, NULL);
    closed0 = shm_counter("rendezvous_closed");
    bogus0 = shm_counter("bogus_conns");
    deaths0 = shm_counter("peer_deaths");
    ck_assert_int_eq(exs__prov_shm_peer(p.a.ctx, (struct sockaddr *)&p.addr, p.addrlen, &pid, &uid),
                     0);
    ck_assert_uint_eq(pid, (uint32_t)getpid());
    ck_assert_uint_eq(uid, (uint32_t)geteuid());
    t0 = pt_now_ms();
    while (shm_counter("rendezvous_closed") == closed0) {
        ck_assert_msg(pt_now_ms() - t0 < PT_TIMEOUT_MS, "the look was not counted");
        if (!pt_drive_all()) /* ctxs without a driver thread */
            pt_sleep_ms(1);
    }
    ck_assert_uint_eq(shm_counter("rendezvous_closed") - closed0, 1);
    ck_assert_uint_eq(shm_counter("bogus_conns") - bogus0, 0);
    ck_assert_uint_eq(shm_counter("peer_deaths") - deaths0, 0);
    pt_expect_no_cm(&p.b, 50);
    pt_pair_connect(&p);
    pt_pair_close(&p);
}
END_TEST

/* ---- a segment the peer could shrink ---- */

/* A handshake message hs (SHM_HS_FIXED bytes) with nfds descriptors, on fd. */
static void raw_hs_send(int fd, const struct shm_hs *hs, const int *fds, int nfds)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = (void *)(uintptr_t)hs, .iov_len = SHM_HS_FIXED};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = u.buf,
                         .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
    struct cmsghdr *cm;

    memset(u.buf, 0, sizeof(u.buf));
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    ck_assert_int_eq(sendmsg(fd, &msg, MSG_NOSIGNAL), (ssize_t)SHM_HS_FIXED);
}

/* A raw local process's REQ at p's listener: hs with the segment mfd and the doorbell
 * bell. Returns the rendezvous socket. */
static int raw_req_send(const struct pt_pair *p, const struct shm_hs *hs, int mfd, int bell)
{
    int fd = raw_rendezvous(p);

    raw_hs_send(fd, hs, (int[]){mfd, bell}, 2);
    return fd;
}

/* A REQ's fixed part as a real one fills it (its doorbell's retry count 7). */
static struct shm_hs raw_req(uint8_t version, uint32_t ring_bytes, uint32_t seg_bytes)
{
    struct shm_hs hs;

    memset(&hs, 0, sizeof(hs));
    hs.magic = SHM_MAGIC;
    hs.version = version;
    hs.type = SHM_HS_REQ;
    hs.rnr_retry = 7;
    hs.ring_bytes = ring_bytes;
    hs.seg_bytes = seg_bytes;
    return hs;
}

/* A sealed memfd of size bytes (a segment as a REQ carries it). */
static int raw_segment(off_t size, int seals)
{
    int mfd = memfd_create("exs-shm-hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(ftruncate(mfd, size), 0);
    if (seals)
        ck_assert_int_eq(fcntl(mfd, F_ADD_SEALS, seals), 0);
    return mfd;
}

/* A local process whose REQ carries a segment that can lose pages under the listener (loop
 * 0: the right size, no seal at all; loop 1: sealed against growing but not shrinking),
 * and that truncates it to nothing right after sending it; or (loop 2) a segment sealed
 * whole but one page short. The listener must never map it: a mapped page past the file's
 * end is a SIGBUS at the next touch (its line at once, the rings at the first record), so
 * a hostile or buggy peer would crash us. Loop 3: a good segment, but a doorbell that is a
 * pipe with no reader (a socket would do the same): the first ring would be SIGPIPE, and
 * a full pipe put back in blocking mode by its owner would block our NIC thread. Loops 4-9:
 * a ring size that lies (zero; not a power of two; below SHM_RING_MIN; above SHM_RING_MAX;
 * a segment larger than its two rings make; rings larger than the sealed file it sends).
 * Each is refused before the mapping (bogus_conns, the socket closed, nothing reaches the
 * application) and the next connection is served. Without the seal and size checks of
 * shm_conn_got_req, loops 0 and 1 die of SIGBUS; without the doorbell check, loop 3's
 * request reaches the application; without its ring check, loops 4-7 do, and without its
 * check of the segment's size against the rings, loop 8. */
START_TEST(shm_segment_unsealed)
{
    enum { SEALED = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, D = SHM_RING_DEFAULT };
    static const struct {
        int seals;
        uint32_t file, ring, seg; /* file 0: the segment's size */
    } c[] = {
        {0, 0, D, SHM_SEG_BYTES(D)},
        {F_SEAL_GROW | F_SEAL_SEAL, 0, D, SHM_SEG_BYTES(D)},
        {SEALED, SHM_SEG_BYTES(D) - 4096, D, SHM_SEG_BYTES(D)},
        {SEALED, 0, D, SHM_SEG_BYTES(D)},
        {SEALED, 0, 0, SHM_SEG_BYTES(0)},
        {SEALED, 0, SHM_RING_MIN + SHM_SLOT, SHM_SEG_BYTES(SHM_RING_MIN + SHM_SLOT)},
        {SEALED, 0, SHM_RING_MIN / 2, SHM_SEG_BYTES(SHM_RING_MIN / 2)},
        {SEALED, 0, 2u * SHM_RING_MAX, SHM_SEG_BYTES(2u * SHM_RING_MAX)},
        {SEALED, 0, D, SHM_SEG_BYTES(2 * D)},
        {SEALED, SHM_SEG_BYTES(D), 2 * D, SHM_SEG_BYTES(2 * D)},
    };
    int pipefd[2];
    struct shm_hs hs;
    struct pt_pair p;
    uint64_t bogus0;
    int fd, mfd, bell, end;

    if (skip_unless_shm("shm_segment_unsealed"))
        return;
    pt_pair_open(&p, NULL, NULL);
    bogus0 = shm_counter("bogus_conns");
    mfd = raw_segment(c[_i].file ? c[_i].file : c[_i].seg, c[_i].seals);
    if (_i == 3) { /* a pipe nobody reads as the doorbell: our first ring, SIGPIPE */
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        close(pipefd[0]);
        bell = pipefd[1];
    } else {
        bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    }
    ck_assert_int_ge(bell, 0);
    /* what the REQ says, whatever the file is */
    hs = raw_req(SHM_VERSION, c[_i].ring, c[_i].seg);
    fd = raw_req_send(&p, &hs, mfd, bell);
    if (_i < 2) /* the hostile part: every page goes (the seal, had it been there, refuses) */
        ck_assert_int_eq(ftruncate(mfd, 0), 0);
    end = pt_raw_end_within(fd, PT_TIMEOUT_MS);
    ck_assert_msg(end == 0, "ring %u, segment %u: the rendezvous socket was %s, expected closed",
                  c[_i].ring, c[_i].seg, end > 0 ? strerror(end) : "still open");
    ck_assert_uint_eq(shm_counter("bogus_conns") - bogus0, 1);
    pt_expect_no_cm(&p.b, 50);
    close(fd);
    close(mfd);
    close(bell);
    pt_pair_connect(&p);
    pt_pair_close(&p);
}
END_TEST

/* ---- a peer of another segment version ---- */

/* The descriptors this process holds. */
static int fd_count(void)
{
    char path[64];
    int n = 0;

    for (int fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n += access(path, F_OK) == 0;
    }
    return n;
}

/* A REQ from a peer of another layout: loop 0, a version-3 peer (its segment: rings of
 * 1 MiB, sealed, the size it says); loop 1, a peer that says our version but sends and
 * announces the version-3 segment (its rings said to be of the default size); loop 2, a
 * future version with a segment of ours; loop 3, the version before ours (6: no hot window,
 * a PAD would be an unknown record to it) with a segment of ours. Each is refused before any
 * mapping (a mapping of SHM_SEG_BYTES over the smaller file would be a SIGBUS at the first touch
 * past its end): the socket is closed, the refusal counted (protocol_errors: the version;
 * bogus_conns: the size), nothing reaches the application, and the segment and doorbell the
 * listener received are closed (this process's descriptors back to their count; seen failing, +2,
 * with the shm_close_fds of shm_conn_readable's bogus path taken out); the next connection works.
 */
START_TEST(shm_version_mismatch)
{
    static const uint8_t version[] = {3, SHM_VERSION, SHM_VERSION + 1, SHM_VERSION - 1};
    const uint32_t v3_bytes = SHM_SEG_HDR + 2u * (1u << 20);
    const uint32_t seg_bytes = _i >= 2 ? SHM_SEG_BYTES(SHM_RING_DEFAULT) : v3_bytes;
    struct shm_hs hs;
    struct pt_pair p;
    uint64_t perr0, bogus0;
    double t0;
    int fd, mfd, bell, end, fds0;

    if (skip_unless_shm("shm_version_mismatch"))
        return;
    pt_pair_open(&p, NULL, NULL);
    perr0 = shm_counter("protocol_errors");
    bogus0 = shm_counter("bogus_conns");
    fds0 = fd_count();
    mfd = raw_segment(seg_bytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ck_assert_int_ge(bell, 0);
    hs = raw_req(version[_i], SHM_RING_DEFAULT, seg_bytes); /* (loop 1: not its segment) */
    fd = raw_req_send(&p, &hs, mfd, bell);
    end = pt_raw_end_within(fd, PT_TIMEOUT_MS);
    ck_assert_msg(end == 0,
                  "version %u, segment %u bytes: the rendezvous socket was %s, expected "
                  "closed (EOF)",
                  version[_i], seg_bytes, end > 0 ? strerror(end) : "still open");
    if (_i == 1)
        ck_assert_uint_eq(shm_counter("bogus_conns") - bogus0, 1);
    else
        ck_assert_uint_eq(shm_counter("protocol_errors") - perr0, 1);
    pt_expect_no_cm(&p.b, 50);
    close(fd);
    close(mfd);
    close(bell);
    /* the listener's copies of the segment and the doorbell, and its end of the socket */
    t0 = pt_now_ms();
    while (fd_count() > fds0) { /* (fewer: something of before closed meanwhile) */
        ck_assert_msg(pt_now_ms() - t0 < PT_TIMEOUT_MS, "version %u: %d descriptors left open",
                      version[_i], fd_count() - fds0);
        if (!pt_drive_all())
            pt_sleep_ms(1);
    }
    pt_pair_connect(&p);
    pt_pair_close(&p);
}
END_TEST

/* The other way (loop 0: a version-3 listener; 1: a version after ours): our REQ (our
 * version, our segment) reaches a raw listener, which answers with an ACCEPT (its doorbell,
 * as a real one) of its version. The active side refuses the answer as it would a lie
 * (protocol_errors), and its endpoint ends UNREACHABLE (-ECONNREFUSED), never ESTABLISHED:
 * no crash, no hang. Seen failing (ESTABLISHED) with shm_hs_recv's version check made
 * for REQs only. Loops 2-4: an ACCEPT of our version whose agreed ring size lies: larger
 * than the rings our segment has (we would read and write past them), not a power of two,
 * zero; refused the same way (seen ESTABLISHED without the ring check of
 * shm_conn_got_reply). */
START_TEST(shm_version_mismatch_reply)
{
    struct sockaddr_storage to;
    struct sockaddr_un un;
    struct exs_prov_cm_event ev;
    struct shm_hs hs;
    struct pt_pair p;
    unsigned port = 0;
    uint64_t perr0;
    double t0;
    int lfd, cfd, bell, fds[2], nfds = 0;
    ssize_t n;
    char cbuf[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {.iov_base = &hs, .iov_len = sizeof(hs)};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};

    if (skip_unless_shm("shm_version_mismatch_reply"))
        return;
    pt_pair_open(&p, NULL, NULL);
    perr0 = shm_counter("protocol_errors");
    /* a raw listener at a port next to p's (the first free one) */
    ck_assert_int_eq(exs__shm_addr_port((const struct sockaddr *)&p.addr, p.addrlen, &port), 0);
    lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ck_assert_int_ge(lfd, 0);
    for (int i = 1;; i++) {
        ck_assert_msg(i < 100, "no free rendezvous name near port %u", port);
        port = port < 65000 ? port + 1 : 20000;
        if (bind(lfd, (struct sockaddr *)&un, exs__shm_unix_name(&un, port)) == 0)
            break;
    }
    ck_assert_int_eq(listen(lfd, 4), 0);
    memcpy(&to, &p.addr, p.addrlen);
    if (to.ss_family == AF_INET)
        ((struct sockaddr_in *)&to)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)&to)->sin6_port = htons((uint16_t)port);
    ck_assert_int_eq(pt_ops->connect(p.ea, (struct sockaddr *)&to, p.addrlen, NULL, 0), 0);
    t0 = pt_now_ms();
    while ((cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) < 0) {
        ck_assert_msg(errno == EAGAIN && pt_now_ms() - t0 < PT_TIMEOUT_MS,
                      "no connection at the raw listener: %s", strerror(errno));
        if (!pt_drive_all())
            pt_sleep_ms(1);
    }
    ck_assert_int_eq(fcntl(cfd, F_SETFL, 0), 0);
    n = recvmsg(cfd, &msg, MSG_CMSG_CLOEXEC);
    ck_assert_int_ge(n, (ssize_t)SHM_HS_FIXED);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds, CMSG_DATA(cm), (size_t)nfds * sizeof(int));
        }
    }
    ck_assert_int_eq(nfds, 2);
    close(fds[0]);
    close(fds[1]);
    ck_assert_uint_eq(hs.version, SHM_VERSION);
    ck_assert_uint_eq(hs.type, SHM_HS_REQ);
    ck_assert_uint_eq(hs.seg_bytes, SHM_SEG_BYTES(SHM_RING_DEFAULT));
    ck_assert_uint_eq(hs.ring_bytes, SHM_RING_DEFAULT);
    /* its answer: an acceptance with its doorbell, as a real one, but of its version, or of
     * a ring size we did not offer */
    memset(&hs, 0, sizeof(hs));
    hs.magic = SHM_MAGIC;
    hs.version = _i == 0 ? 3 : _i == 1 ? SHM_VERSION + 1 : SHM_VERSION;
    hs.type = SHM_HS_ACCEPT;
    hs.rnr_retry = 7;
    hs.ring_bytes = _i == 2   ? 2 * SHM_RING_DEFAULT
                    : _i == 3 ? SHM_RING_MIN + SHM_SLOT
                    : _i == 4 ? 0
                              : SHM_RING_DEFAULT;
    bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ck_assert_int_ge(bell, 0);
    raw_hs_send(cfd, &hs, &bell, 1);
    close(bell);
    pt_wait_cm(&p.a, EXS_PROV_CM_UNREACHABLE, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p.ea);
    ck_assert_int_eq(ev.status, -ECONNREFUSED);
    ck_assert_int_ne(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    ck_assert_uint_eq(shm_counter("protocol_errors") - perr0, 1);
    ck_assert_int_eq(pt_raw_end_within(cfd, PT_TIMEOUT_MS), 0); /* it closed its side */
    close(cfd);
    close(lfd);
    pt_pair_close(&p);
}
END_TEST

/* ---- a busy poller makes no system call ---- */

/* A MANUAL context driven by a busy poller (the engine's rounds) on empty rings: its turns
 * read the descriptors (an epoll_wait each) once per SHM_IDLE_LOOK turns, whether it idles
 * (loop 0) or its consumer's event fd was left readable by a notification it did not sleep
 * for (loop 1: it stays readable until the next arm). Before, every idle turn read them
 * (loop 1: every turn). The turns that did not read answer 1, never 0: a zero comes only
 * after a look, at least once per SHM_IDLE_LOOK turns (prov_basic notify_cm_event over
 * --manual needs it: a sleeper's turns until 0 must have read the connect request). */
START_TEST(shm_busy_turns_no_syscall)
{
    struct exs_prov_attr attr = {.flags = EXS_PROV_ATTR_MANUAL_PROGRESS};
    const unsigned turns = 100 * SHM_IDLE_LOOK;
    struct exs_prov_cm_event ev = {.type = EXS_PROV_CM_DISCONNECTED};
    struct exs_prov_ctx *c;
    struct shm_ctx *ctx;
    uint64_t c0, looks;
    unsigned zeros = 0, run = 0, longest = 0;

    if (skip_unless_shm("shm_busy_turns_no_syscall"))
        return;
    ck_assert_int_eq(pt_ops->ctx_open(&attr, &c), 0);
    ctx = shm_ctx_of(c);
    if (_i) { /* a sleeper's notification, its event taken without a sleep */
        ck_assert_int_eq(pt_ops->ctx_arm(c), 0);
        exs__shm_cm_push(ctx, &ev);
        ck_assert_int_eq(pt_ops->ctx_cm_poll(c, &ev), 1);
    }
    c0 = __atomic_load_n(&ctx->cnt.collects, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < turns; i++) {
        int rc = pt_ops->ctx_progress(c);

        ck_assert_int_ge(rc, 0);
        ck_assert_int_le(rc, 1);
        if (rc == 0) {
            zeros++;
            run = 0;
        } else if (++run > longest) {
            longest = run;
        }
    }
    looks = __atomic_load_n(&ctx->cnt.collects, __ATOMIC_RELAXED) - c0;
    ck_assert_msg(looks <= turns / SHM_IDLE_LOOK + 1, "%llu descriptor reads in %u idle turns",
                  (unsigned long long)looks, turns);
    ck_assert_msg(zeros == looks, "%u turns answered 0, %llu read the descriptors", zeros,
                  (unsigned long long)looks);
    ck_assert_msg(longest < SHM_IDLE_LOOK, "%u idle turns in a row without a look", longest);
    pt_ops->ctx_close(c);
}
END_TEST

/* The context's cm_queued (prov.h) reads 0 only while no cm event is queued, so the
 * engine's busy turns ask exs__prov_cm_poll without calling ctx_cm_poll: 0 on a new
 * context, set by a push, still set after taking one of two, 0 after the last is taken
 * (exs__prov_cm_poll then answers 0 from it). Before, shm left it NULL and every busy
 * turn made the call (callgrind: shm_ctx_cm_poll once per round). */
START_TEST(shm_cm_queued_follows_events)
{
    struct exs_prov_attr attr = {.flags = EXS_PROV_ATTR_MANUAL_PROGRESS};
    struct exs_prov_cm_event ev = {.type = EXS_PROV_CM_DISCONNECTED}, got;
    struct exs_prov_ctx *c;
    struct shm_ctx *ctx;

    if (skip_unless_shm("shm_cm_queued_follows_events"))
        return;
    ck_assert_int_eq(pt_ops->ctx_open(&attr, &c), 0);
    ctx = shm_ctx_of(c);
    ck_assert_ptr_nonnull(c->cm_queued);
    ck_assert_uint_eq(__atomic_load_n(c->cm_queued, __ATOMIC_ACQUIRE), 0);
    ck_assert_int_eq(exs__prov_cm_poll(c, &got), 0);
    exs__shm_cm_push(ctx, &ev);
    exs__shm_cm_push(ctx, &ev);
    ck_assert_uint_ne(__atomic_load_n(c->cm_queued, __ATOMIC_ACQUIRE), 0);
    ck_assert_int_eq(exs__prov_cm_poll(c, &got), 1);
    ck_assert_int_eq(got.type, EXS_PROV_CM_DISCONNECTED);
    ck_assert_uint_ne(__atomic_load_n(c->cm_queued, __ATOMIC_ACQUIRE), 0);
    ck_assert_int_eq(exs__prov_cm_poll(c, &got), 1);
    ck_assert_uint_eq(__atomic_load_n(c->cm_queued, __ATOMIC_ACQUIRE), 0);
    ck_assert_int_eq(exs__prov_cm_poll(c, &got), 0);
    pt_ops->ctx_close(c);
}
END_TEST

/* ctx_poll of the default mode with completions already queued (an engine round's
 * ctx_progress turn wrote them just before) takes them without a turn of its own: no NIC
 * role taken, no second walk of the rings between a completion and its consumer. Before,
 * every ctx_poll that found the NIC role free ran a turn first (turns counted it). The
 * NIC thread of a quiet pair sleeps (nothing rings it here), so most of the 32 polls see
 * no turn at all; the old way saw one in every poll that found the role free. An empty
 * queue still gets its ring-only turn (the busy poller's run to completion). */
START_TEST(shm_poll_queued_no_turn)
{
    struct pt_pair p;
    struct shm_ep *eb;
    struct shm_ctx *ctx;
    struct exs_prov_cqe c;
    int quiet = 0, turned = 0;

    if (skip_unless_shm("shm_poll_queued_no_turn"))
        return;
    if (pt_manual) {
        test_skip("shm_poll_queued_no_turn", "ctx_poll runs no turn in MANUAL mode");
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    eb = shm_ep_of(p.eb);
    ctx = eb->ctx;
    for (int i = 0; i < 32; i++) {
        uint64_t t0, t1;

        exs__lite_lock(&ctx->lock);
        exs__shm_flush_cqe_locked(eb, 7000 + (uint64_t)i, EXS_PROV_WC_RECV);
        exs__lite_unlock(&ctx->lock);
        t0 = __atomic_load_n(&ctx->cnt.turns, __ATOMIC_RELAXED);
        ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 1);
        t1 = __atomic_load_n(&ctx->cnt.turns, __ATOMIC_RELAXED);
        ck_assert_uint_eq(c.wr_id, 7000 + (uint64_t)i);
        ck_assert_int_eq(c.status, EXS_PROV_WC_WR_FLUSH_ERR);
        quiet += t1 == t0;
    }
    ck_assert_msg(quiet >= 16, "%d of 32 polls with a completion queued ran no turn", quiet);
    /* nothing queued: the poll turns (unless the NIC thread holds the role right then) */
    for (int i = 0; i < 32 && !turned; i++) {
        uint64_t t0 = __atomic_load_n(&ctx->cnt.turns, __ATOMIC_RELAXED);

        ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 0);
        turned = __atomic_load_n(&ctx->cnt.turns, __ATOMIC_RELAXED) != t0;
    }
    ck_assert_msg(turned, "no poll of an empty queue ran a turn");
    pt_pair_close(&p);
}
END_TEST

static void direct_check(const struct exs_prov_cqe *c, int n, uint64_t id0)
{
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(c[i].wr_id, id0 + (uint64_t)i);
        ck_assert_int_eq(c[i].status, EXS_PROV_WC_SUCCESS);
        ck_assert_uint_eq(c[i].byte_len, 64);
    }
}

/* ctx_progress_poll (the engine's rounds): the completions a turn makes go straight into
 * the caller's array, never through the queue and ctx->lock's second hold (direct_cqes
 * counts them): (1) K receives, all handed over, nothing left queued; (2) with two older
 * completions queued by plain turns, the turn's new ones go behind them into the queue
 * and come out after them, in order (written into the array first, they would overtake
 * them); (3) max 1: one handed over, the rest of the turn's queued, taken in order by the
 * next calls. Before, the engine's round called ctx_progress and then ctx_poll, which took
 * every completion out of the queue under ctx->lock (direct_cqes stays 0). */
START_TEST(shm_progress_poll_direct)
{
    enum { K = 8 };
    struct pt_pair p;
    struct pt_buf *sa, *rb[K];
    struct exs_prov_cqe c[K];
    struct shm_ctx *ctx;
    uint64_t d0;
    double deadline;

    if (skip_unless_shm("shm_progress_poll_direct"))
        return;
    pt_self_drive = 1;
    pt_pair_setup(&p, NULL, NULL);
    ctx = shm_ep_of(p.eb)->ctx;
    sa = pt_pair_buf(&p, 'a', 64, LW, 0);
    for (int i = 0; i < K; i++)
        rb[i] = pt_pair_buf(&p, 'b', 64, LW, 0);
    /* (1) */
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + (uint64_t)i, rb[i], 0, 64), 0);
    d0 = shm_counter("direct_cqes");
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(pt_post_send(p.ea, 900, EXS_PROV_WR_SEND, 0, sa, 0, 64, 0, 0, 0), 0);
    pt_progress_poll_b(&p, c, K, K);
    direct_check(c, K, 100);
    ck_assert_uint_eq(shm_counter("direct_cqes") - d0, K);
    ck_assert_uint_eq(exs__soft_cq_peek(&ctx->cq), 0);
    /* (2) */
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 200 + (uint64_t)i, rb[i], 0, 64), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pt_post_send(p.ea, 900, EXS_PROV_WR_SEND, 0, sa, 0, 64, 0, 0, 0), 0);
    deadline = pt_now_ms() + PT_TIMEOUT_MS;
    while (exs__soft_cq_peek(&ctx->cq) < 2 && pt_now_ms() < deadline)
        ck_assert_int_ge(pt_ops->ctx_progress(p.b.ctx), 0);
    ck_assert_uint_eq(exs__soft_cq_peek(&ctx->cq), 2);
    for (int i = 2; i < K; i++)
        ck_assert_int_eq(pt_post_send(p.ea, 900, EXS_PROV_WR_SEND, 0, sa, 0, 64, 0, 0, 0), 0);
    pt_progress_poll_b(&p, c, K, K);
    direct_check(c, K, 200);
    /* (3): the K requests are in the ring before b's turn (posts write it themselves) */
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 300 + (uint64_t)i, rb[i], 0, 64), 0);
    for (int i = 0; i < K; i++)
        ck_assert_int_eq(pt_post_send(p.ea, 900, EXS_PROV_WR_SEND, 0, sa, 0, 64, 0, 0, 0), 0);
    d0 = shm_counter("direct_cqes");
    pt_progress_poll_b(&p, c, 1, 1);
    ck_assert_uint_eq(shm_counter("direct_cqes") - d0, 1);
    ck_assert_uint_eq(exs__soft_cq_peek(&ctx->cq), K - 1);
    pt_progress_poll_b(&p, c + 1, K - 1, 1);
    direct_check(c, K, 300);
    pt_pair_close(&p);
    pt_self_drive = 0;
}
END_TEST

/* The data path's short ways keep the RC semantics: (1) a revoked grant's block serves the
 * next grant (exs/prov/soft's grant cache) under a fresh key: the new key works, the old
 * one is refused; (2) 48 inline WRITE_WITH_IMMs of one burst, carried out under a few holds
 * of ctx->lock (at most 16 requests each), complete in order with their bytes and
 * immediates; (3) 4 KiB SENDs through more than three laps of the ring, posted straight
 * into it, the poster reading the peer's tail only when the one it saw last leaves no
 * room (ring_full counts the waits), each received whole and in order. */
START_TEST(shm_fast_paths)
{
    enum { N = 48, SZ = 64, BIG = 4096, LAPS = 4 * (SHM_RING_DEFAULT / (BIG + SHM_SLOT)) };
    struct pt_pair p;
    struct exs_prov_grant *g1, *g2;
    struct pt_buf *tgt, *src, *big, *dst;
    struct exs_prov_cqe c;
    uint32_t k1;
    uint64_t full0;

    if (skip_unless_shm("shm_fast_paths"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    tgt = pt_pair_buf(&p, 'b', N * SZ, LW, 0);
    src = pt_pair_buf(&p, 'a', N * SZ, LW, 0);
    for (int i = 0; i < N * SZ; i++)
        src->p[i] = (uint8_t)(i / SZ + 1);

    /* (1) */
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, N * SZ, RW, &g1), 0);
    k1 = g1->rkey;
    pt_ops->revoke(g1);
    ck_assert_int_eq(pt_ops->grant(p.eb, tgt->mr, tgt->p, N * SZ, RW, &g2), 0);
    ck_assert_uint_ne(g2->rkey, k1);

    /* (2) */
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(pt_post_recv(p.eb, 100 + i, NULL, 0, 0), 0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(pt_post_send(p.ea, 200 + i, EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
                                      SIG | EXS_PROV_SEND_INLINE, src, (size_t)i * SZ, SZ,
                                      (uint32_t)i, pt_raddr(tgt, (size_t)i * SZ), g2->rkey),
                         0);
    for (int i = 0; i < N; i++) {
        pt_expect_cqe(&p.b, 100 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
        ck_assert_uint_eq(c.imm_data, (uint32_t)i);
        ck_assert_uint_eq(c.byte_len, SZ);
    }
    for (int i = 0; i < N; i++)
        pt_expect_cqe(&p.a, 200 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert(memcmp(tgt->p, src->p, N * SZ) == 0);
    ck_assert(pt_buf_guards_ok(tgt));

    /* (3) */
    big = pt_pair_buf(&p, 'a', BIG, LW, 0);
    dst = pt_pair_buf(&p, 'b', BIG, LW, 0);
    full0 = shm_counter("ring_full");
    for (int i = 0; i < LAPS; i++) {
        memset(big->p, i + 1, BIG);
        ck_assert_int_eq(pt_post_recv(p.eb, 1000 + i, dst, 0, BIG), 0);
        ck_assert_int_eq(pt_post_send(p.ea, 2000 + i, EXS_PROV_WR_SEND, SIG, big, 0, BIG, 0, 0, 0),
                         0);
        pt_expect_cqe(&p.b, 1000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, BIG);
        ck_assert(pt_all_bytes(dst->p, BIG, i + 1));
        pt_expect_cqe(&p.a, 2000 + i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    }
    /* every answer refreshed the tail the poster sees: no post waited for room */
    ck_assert_uint_eq(shm_counter("ring_full"), full0);

    /* (1), the old key: refused, the connection aborted */
    ck_assert_int_eq(pt_post_recv(p.eb, 3000, NULL, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 4000, EXS_PROV_WR_RDMA_WRITE_WITH_IMM,
                                  SIG | EXS_PROV_SEND_INLINE, src, 0, SZ, 0, pt_raddr(tgt, 0), k1),
                     0);
    pt_expect_cqe(&p.a, 4000, EXS_PROV_WC_REM_ACCESS_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_buf_guards_ok(tgt));
    pt_ops->revoke(g2);
    pt_pair_close(&p);
}
END_TEST

/* ---- messages in fragments (SEND and WRITE above SHM_RING_INLINE) ---- */

/* A SEND of three odd sges into a receive of three odd sges, both crossing fragment
 * boundaries, a WRITE with IMM of 1 MiB + 3, and one of two rings + 5 posted while the
 * peer holds it by receiver-not-ready (it waits for room half-written, then goes on):
 * whole and in place, the gaps untouched, and no process_vm_* call (counter copies): the
 * payload went through the ring. */
START_TEST(shm_frag_send_scatter)
{
    enum { L0 = 70001, L1 = 3, L2 = 130000, LEN = L0 + L1 + L2, R0 = 65503, R1 = 65506 };
    enum { WLEN = (1 << 20) + 3, BIG = 2 * SHM_RING_DEFAULT + 5 };
    struct pt_pair p;
    struct pt_buf *src, *dst, *tgt;
    struct exs_prov_sge ss[3], rs[3];
    struct exs_prov_send_wr sw;
    struct exs_prov_recv_wr rw;
    struct exs_prov_cqe c;
    uint8_t *msg = malloc(LEN);
    uint64_t copies, full0;

    if (skip_unless_shm("shm_frag_send_scatter")) {
        free(msg);
        return;
    }
    ck_assert_ptr_nonnull(msg);
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', BIG + 64, LW, 0);
    dst = pt_pair_buf(&p, 'b', LEN + 350, LW, 0);
    tgt = pt_pair_buf(&p, 'b', BIG + 64, LW | RW, 0);
    pt_pattern(src->p, BIG + 64, 77);
    ss[0] = (struct exs_prov_sge){pt_raddr(src, 0), L0, src->mr->lkey};
    ss[1] = (struct exs_prov_sge){pt_raddr(src, L0 + 100), L1, src->mr->lkey};
    ss[2] = (struct exs_prov_sge){pt_raddr(src, L0 + 200), L2, src->mr->lkey};
    memcpy(msg, src->p, L0);
    memcpy(msg + L0, src->p + L0 + 100, L1);
    memcpy(msg + L0 + L1, src->p + L0 + 200, L2);
    rs[0] = (struct exs_prov_sge){pt_raddr(dst, 0), R0, dst->mr->lkey};
    rs[1] = (struct exs_prov_sge){pt_raddr(dst, R0 + 100), R1, dst->mr->lkey};
    rs[2] = (struct exs_prov_sge){pt_raddr(dst, R0 + R1 + 300), LEN - R0 - R1 + 50, dst->mr->lkey};
    rw = (struct exs_prov_recv_wr){.wr_id = 1, .sg_list = rs, .num_sge = 3};
    copies = shm_counter("copies");
    ck_assert_int_eq(pt_ops->post_recv(p.eb, &rw), 0);
    sw = (struct exs_prov_send_wr){
        .wr_id = 2, .opcode = EXS_PROV_WR_SEND, .flags = SIG, .sg_list = ss, .num_sge = 3};
    ck_assert_int_eq(pt_ops->post_send(p.ea, &sw), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, LEN);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert(memcmp(dst->p, msg, R0) == 0);
    ck_assert(pt_all_bytes(dst->p + R0, 100, 0));
    ck_assert(memcmp(dst->p + R0 + 100, msg + R0, R1) == 0);
    ck_assert(pt_all_bytes(dst->p + R0 + 100 + R1, 200, 0));
    ck_assert(memcmp(dst->p + R0 + R1 + 300, msg + R0 + R1, LEN - R0 - R1) == 0);
    ck_assert(pt_all_bytes(dst->p + LEN + 300, 50, 0));
    ck_assert(pt_buf_guards_ok(dst));

    ck_assert_int_eq(pt_post_recv(p.eb, 3, NULL, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 4, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, SIG, src, 1, WLEN,
                                  0x1234, pt_raddr(tgt, 7), tgt->mr->rkey),
                     0);
    pt_expect_cqe(&p.b, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
    ck_assert_uint_eq(c.imm_data, 0x1234);
    ck_assert_uint_eq(c.byte_len, WLEN);
    pt_expect_cqe(&p.a, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert(memcmp(tgt->p + 7, src->p + 1, WLEN) == 0);
    ck_assert(pt_all_bytes(tgt->p, 7, 0));
    ck_assert(pt_all_bytes(tgt->p + 7 + WLEN, 64 - 7, 0));
    ck_assert(pt_buf_guards_ok(tgt));

    /* larger than the ring, while b holds its first fragment (receiver not ready): the post
     * writes what fits and waits for room (ring_full), then goes on once b takes them */
    full0 = shm_counter("ring_full");
    ck_assert_int_eq(pt_post_send(p.ea, 6, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, SIG, src, 2, BIG,
                                  0x5678, pt_raddr(tgt, 9), tgt->mr->rkey),
                     0);
    ck_assert_uint_gt(shm_counter("ring_full"), full0);
    ck_assert_int_eq(pt_post_recv(p.eb, 5, NULL, 0, 0), 0);
    pt_expect_cqe(&p.b, 5, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
    ck_assert_uint_eq(c.imm_data, 0x5678);
    ck_assert_uint_eq(c.byte_len, BIG);
    pt_expect_cqe(&p.a, 6, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert(memcmp(tgt->p + 9, src->p + 2, BIG) == 0);
    ck_assert(pt_buf_guards_ok(tgt));
    ck_assert_uint_eq(shm_counter("copies"), copies);
    free(msg);
    pt_pair_close(&p);
}
END_TEST

/* A pair whose two MANUAL ctxs this thread alone turns (pt_self_drive), and its two
 * connections and b's context. */
static void self_driven_pair(struct pt_pair *p, struct shm_conn **ca, struct shm_conn **cb,
                             struct shm_ctx **xb)
{
    pt_self_drive = 1;
    pt_pair_setup(p, NULL, NULL);
    *ca = shm_ep_of(p->ea)->conn;
    *cb = shm_ep_of(p->eb)->conn;
    *xb = shm_ep_of(p->eb)->ctx;
}

/* The doorbell of a sleeping requester within the responder's turn (h69): one each half
 * ring freed (SHM_KICK_DIV), then one for the turn's answers, at the start of b's next
 * turn (the owed fence, SHM_FENCE_LATER; at the turn's end under TSan). a (MANUAL, armed:
 * asleep, its flags up) fills the ring with fragments of a WRITE of two rings; b's one
 * turn takes them all and writes a's bell once per half ring freed, its next turn the
 * answers' one: 2 for the 63 fragments of a 4 MiB ring. Seen failing with the old
 * doorbell each quarter ring (4 bells). The WRITE then completes whole, the data in
 * place. */
START_TEST(shm_frag_bell_half_ring)
{
    const uint32_t BIG = 2 * SHM_RING_DEFAULT + 9;
    struct pt_pair p;
    struct pt_buf *src, *tgt;
    struct shm_conn *ca, *cb;
    struct shm_ctx *xb;
    uint64_t bells0, bells, taken, rec, per, want;

    if (skip_unless_shm("shm_frag_bell_half_ring"))
        return;
    self_driven_pair(&p, &ca, &cb, &xb);
    ck_assert_uint_eq(cb->ring_bytes, SHM_RING_DEFAULT);
    src = pt_pair_buf(&p, 'a', BIG + 64, LW, 0);
    tgt = pt_pair_buf(&p, 'b', BIG + 64, LW | RW, 0);
    pt_pattern(src->p, BIG + 64, 41);
    ck_assert_int_eq(pt_post_send(p.ea, 1, EXS_PROV_WR_RDMA_WRITE, SIG, src, 3, BIG, 0,
                                  pt_raddr(tgt, 5), tgt->mr->rkey),
                     0);
    ck_assert_uint_gt(ca->head - cb->tail, SHM_RING_DEFAULT / 2); /* the ring filled */
    ck_assert_int_eq(pt_ops->ctx_arm(p.a.ctx), 0);                /* a asleep */
    ck_assert(__atomic_load_n(&cb->peer_flag->sleeping, __ATOMIC_SEQ_CST));
    bells0 = __atomic_load_n(&xb->cnt.bells_tx, __ATOMIC_RELAXED);
    ck_assert_int_gt(pt_ops->ctx_progress(p.b.ctx), 0);
    if (SHM_FENCE_LATER) {
        ck_assert(cb->fence_owed);
        pt_ops->ctx_progress(p.b.ctx); /* the answers' fence and bell */
    }
    bells = __atomic_load_n(&xb->cnt.bells_tx, __ATOMIC_RELAXED) - bells0;
    rec = (SHM_REC_HDR + cb->frag_bytes + SHM_SLOT - 1) / SHM_SLOT * SHM_SLOT;
    taken = cb->tail / rec; /* fragments b took in its turn (all a wrote) */
    per = (SHM_RING_DEFAULT / SHM_KICK_DIV + rec - 1) / rec;
    want = taken / per + 1;
    ck_assert_uint_eq(cb->tail, ca->head);
    ck_assert_uint_ge(taken, per);
    ck_assert_msg(bells == want && want == 2, "%llu doorbells for %llu fragments taken, want %llu",
                  (unsigned long long)bells, (unsigned long long)taken, (unsigned long long)want);
    pt_ops->ctx_disarm(p.a.ctx);
    pt_expect_cqe(&p.a, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert(memcmp(tgt->p + 5, src->p + 3, BIG) == 0);
    ck_assert(pt_all_bytes(tgt->p, 5, 0) && pt_all_bytes(tgt->p + 5 + BIG, 64 - 5, 0));
    pt_pair_close(&p);
    pt_self_drive = 0;
}
END_TEST

/* The owed fence (spec/provider-shm.md, "The owed fence"): the answers of a responder's
 * turn (tail, ack) go out with release stores, and the look at a sleeping requester's flag
 * waits for b's next turn (loop 0) or b's sleep (loop 1: its arm). a (MANUAL) posts a 64 B
 * SEND and sleeps (armed, flags up); b's one turn takes it (the receive completes) and, the
 * fence owed, writes no bell; then b's next turn, or its arm, writes a's bell once, a's
 * descriptor turns readable and a's SEND completes. Without the payment at the turn's
 * start (or in the idle turn's look, which would answer "call again" without it), or in the
 * sleep, a is never woken: the poll below fails after PT_TIMEOUT_MS. Under TSan the bell
 * comes within the first turn (SHM_FENCE_LATER 0). */
START_TEST(shm_owed_fence)
{
    enum { SZ = 64 };
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct shm_conn *ca, *cb;
    struct shm_ctx *xb;
    struct exs_prov_cqe c;
    uint64_t bells0;
    struct pollfd pfd;

    if (skip_unless_shm(_i ? "shm_owed_fence_arm" : "shm_owed_fence_turn"))
        return;
    self_driven_pair(&p, &ca, &cb, &xb);
    src = pt_pair_buf(&p, 'a', SZ, LW, 0);
    dst = pt_pair_buf(&p, 'b', SZ, LW, 0);
    pt_pattern(src->p, SZ, 77);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, SZ), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, SZ, 0, 0, 0), 0);
    ck_assert_int_eq(pt_ops->ctx_arm(p.a.ctx), 0); /* a asleep */
    ck_assert(__atomic_load_n(&cb->peer_flag->sleeping, __ATOMIC_SEQ_CST));
    bells0 = __atomic_load_n(&xb->cnt.bells_tx, __ATOMIC_RELAXED);
    ck_assert_int_gt(pt_ops->ctx_progress(p.b.ctx), 0); /* b's turn takes the SEND */
    ck_assert_uint_eq(cb->tail, ca->head);
    ck_assert_uint_eq(__atomic_load_n(&cb->mine->ack, __ATOMIC_ACQUIRE), ca->acked + 1);
    ck_assert_int_eq(pt_ops->ctx_poll(p.b.ctx, &c, 1), 1);
    ck_assert_uint_eq(c.wr_id, 1);
    ck_assert_int_eq(c.status, EXS_PROV_WC_SUCCESS);
    ck_assert_msg(pt_pattern_check(dst->p, SZ, 77) < 0, "the SEND's bytes differ");
    if (SHM_FENCE_LATER) {
        ck_assert(cb->fence_owed);
        ck_assert_uint_eq(__atomic_load_n(&xb->cnt.bells_tx, __ATOMIC_RELAXED), bells0);
        if (_i == 0) {
            pt_ops->ctx_progress(p.b.ctx); /* one turn, on empty rings */
        } else {
            ck_assert_int_eq(pt_ops->ctx_arm(p.b.ctx), 0); /* b goes to sleep */
            pt_ops->ctx_disarm(p.b.ctx);
        }
        ck_assert(!cb->fence_owed);
    }
    ck_assert_uint_eq(__atomic_load_n(&xb->cnt.bells_tx, __ATOMIC_RELAXED), bells0 + 1);
    pfd = (struct pollfd){.fd = pt_ops->ctx_event_fd(p.a.ctx), .events = POLLIN};
    ck_assert_msg(poll(&pfd, 1, PT_TIMEOUT_MS) == 1, "a was not woken by b's answer");
    pt_ops->ctx_disarm(p.a.ctx);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_pair_close(&p);
    pt_self_drive = 0;
}
END_TEST

/* Wait (bounded) until b took bytes of the liar's ring up to tail. */
static void wait_b_took(const struct liar *c, uint64_t tail)
{
    uint64_t end = exs__now_ns() + (uint64_t)PT_TIMEOUT_MS * 1000000u;

    while (__atomic_load_n(&c->peer->tail, __ATOMIC_ACQUIRE) != tail) {
        ck_assert_msg(exs__now_ns() < end, "b did not take the first fragment");
        pt_sleep_ms(1);
    }
}

enum { FRAG_OTHER, FRAG_SIZE, FRAG_SMALL, FRAG_REVOKED, FRAG_PAD, FRAG_LIES };
static const char *const frag_names[FRAG_LIES] = {"other", "size", "small", "revoked", "pad"};

/* A liar's message in fragments: (other) a first SEND fragment into b's receive, then a
 * record that is not its next fragment: a protocol error, and the receive the message
 * held is flushed (not lost); (size) a fragment whose size is not its part's; (small) a
 * fragment of a message that would be inline; (revoked) the first fragment of a WRITE
 * placed, the grant revoked, the second refused: REM_ACCESS, the connection aborted, not
 * one byte of it placed; (pad) a PAD, right in every field and size, after the first
 * fragment: PADs come between messages only, a protocol error. */
START_TEST(shm_liar_frag)
{
    enum { LEN = 100000, BUF = 128 << 10 };
    char test[64];
    struct pt_pair p;
    struct pt_buf *dst;
    struct exs_prov_grant *g = NULL;
    struct liar l, *c = &l;
    struct shm_rec rec;
    uint8_t *body = malloc(SHM_FRAG_BYTES);
    uint32_t size1 = (SHM_REC_HDR + SHM_FRAG_BYTES + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
    uint32_t part2 = LEN - SHM_FRAG_BYTES;
    uint64_t perr;

    snprintf(test, sizeof(test), "shm_liar_frag_%s", frag_names[_i]);
    if (skip_unless_shm(test)) {
        free(body);
        return;
    }
    ck_assert_ptr_nonnull(body);
    memset(body, 0x44, SHM_FRAG_BYTES);
    pt_pair_setup(&p, NULL, NULL);
    l = liar(&p);
    dst = pt_pair_buf(&p, 'b', BUF, LW, 0x22);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, BUF), 0);
    perr = shm_counter("protocol_errors");
    rec = (struct shm_rec){.type = SHM_REC_SEND, .flags = SHM_RF_FRAG, .len = LEN, .size = size1};
    switch (_i) {
    case FRAG_OTHER:
        put_rec(c, &rec, body, SHM_FRAG_BYTES);
        wait_b_took(c, l.head + size1);
        l.head += size1;
        rec.flags = SHM_RF_INLINE; /* an inline SEND where the second fragment belongs */
        rec.len = 16;
        rec.size = SHM_SLOT;
        put_rec(c, &rec, body, 16);
        break;
    case FRAG_PAD:
        put_rec(c, &rec, body, SHM_FRAG_BYTES);
        wait_b_took(c, l.head + size1);
        l.head += size1;
        rec = (struct shm_rec){.type = SHM_REC_PAD,
                               .size =
                                   SHM_RING_DEFAULT - (uint32_t)(l.head & (SHM_RING_DEFAULT - 1))};
        zero_lap_start(c);
        put_rec(c, &rec, NULL, 0);
        break;
    case FRAG_SIZE:
        rec.size = size1 - SHM_SLOT;
        put_rec(c, &rec, body, SHM_FRAG_BYTES - SHM_SLOT);
        break;
    case FRAG_SMALL:
        rec.len = SHM_RING_INLINE;
        rec.size = SHM_RING_INLINE + SHM_SLOT;
        put_rec(c, &rec, body, SHM_RING_INLINE);
        break;
    case FRAG_REVOKED:
        ck_assert_int_eq(pt_ops->grant(p.eb, dst->mr, dst->p, BUF, RW, &g), 0);
        rec.type = SHM_REC_WRITE;
        rec.raddr = (uint64_t)(uintptr_t)dst->p;
        rec.rkey = g->rkey;
        put_rec(c, &rec, body, SHM_FRAG_BYTES);
        wait_b_took(c, l.head + size1);
        l.head += size1;
        pt_ops->revoke(g);
        rec.size = (SHM_REC_HDR + part2 + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
        put_rec(c, &rec, body, part2);
        expect_b_ended(&p, -ECONNABORTED);
        ck_assert(pt_all_bytes(dst->p, SHM_FRAG_BYTES, 0x44));
        ck_assert(pt_all_bytes(dst->p + SHM_FRAG_BYTES, BUF - SHM_FRAG_BYTES, 0x22));
        break;
    }
    if (_i != FRAG_REVOKED) {
        expect_b_ended(&p, -EPROTO);
        ck_assert_uint_gt(shm_counter("protocol_errors"), perr);
    }
    close(bell_fd);
    bell_fd = -1;
    pt_expect_wr(&p.b, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_buf_guards_ok(dst));
    free(body);
    fresh_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

/* ---- ring sizes (EXS_SHM_RING_KB) ---- */

/* A host whose ctx is opened with EXS_SHM_RING_KB=kb (NULL: the default). */
static void host_open_ring(struct pt_host *h, const char *kb)
{
    if (kb)
        ck_assert_int_eq(setenv("EXS_SHM_RING_KB", kb, 1), 0);
    else
        unsetenv("EXS_SHM_RING_KB");
    exs__params_reset();
    pt_host_open(h);
    unsetenv("EXS_SHM_RING_KB");
    exs__params_reset();
}

/* A pair whose hosts chose rings of kb_a and kb_b KiB (NULL: the default), connected:
 * nothing counted in ring_mem before; both ends' rings of ring bytes, ring_mem a header and
 * two such rings per end (both ends are ours). */
/* What the tests look at of an end's connection, read under its ctx's nic_lock: the NIC
 * thread frees a connection when its peer ends it (a DISC, a protocol error), and that
 * free is ordered after a read without the lock only through the kernel (the socket) or
 * the segment mapped twice, which TSan does not see (it reported the free racing the read
 * of ca->seg and cb->seg in shm_small_rings); under the lock the order is the lock's. */
struct conn_view {
    uint8_t *seg;
    uint32_t seg_ring, ring_bytes, frag_bytes;
};

static struct conn_view conn_view(struct exs_prov_ep *e)
{
    struct shm_ctx *ctx = shm_ep_of(e)->ctx;
    struct shm_conn *conn;
    struct conn_view v;

    nic_hold(ctx);
    conn = shm_ep_of(e)->conn;
    ck_assert_ptr_nonnull(conn);
    v = (struct conn_view){conn->seg, conn->seg_ring, conn->ring_bytes, conn->frag_bytes};
    nic_drop(ctx);
    return v;
}

static void rings_pair_setup(struct pt_pair *p, const char *kb_a, const char *kb_b, uint32_t ring)
{
    struct exs_prov_ep_attr at = pt_default_attr();

    memset(p, 0, sizeof(*p));
    host_open_ring(&p->a, kb_a);
    host_open_ring(&p->b, kb_b);
    ck_assert_uint_eq(shm_counter("ring_mem"), 0);
    p->lis = pt_listen(&p->b, &p->addr, &p->addrlen);
    ck_assert_int_eq(pt_ops->ep_create(p->a.ctx, &at, &p->ea), 0);
    ck_assert_int_eq(pt_ops->ep_create(p->b.ctx, &at, &p->eb), 0);
    pt_pair_connect(p);
    ck_assert_uint_eq(conn_view(p->ea).ring_bytes, ring);
    ck_assert_uint_eq(conn_view(p->eb).ring_bytes, ring);
    ck_assert_uint_eq(shm_counter("ring_mem"), 2 * (SHM_SEG_HDR + 2ull * ring));
}

/* The ends gone: nothing counted (a connection is freed at its ctx's next turn); then the
 * pair closed. */
static void rings_pair_close(struct pt_pair *p)
{
    uint64_t mem1;
    double t0;

    pt_ep_close(&p->a, p->ea);
    pt_ep_close(&p->b, p->eb);
    p->ea = p->eb = NULL;
    t0 = pt_now_ms();
    while ((mem1 = shm_counter("ring_mem")) != 0) {
        ck_assert_msg(pt_now_ms() - t0 < PT_TIMEOUT_MS, "ring_mem %llu after the ends",
                      (unsigned long long)mem1);
        if (!pt_drive_all())
            pt_sleep_ms(1);
    }
    pt_pair_close(p);
}

/* Resident bytes of the mapping that starts at addr (/proc/self/smaps), -1 if none. */
static long mapping_rss(const void *addr)
{
    char line[512], want[32];
    FILE *f = fopen("/proc/self/smaps", "r");
    long rss = -1;
    int in = 0;

    ck_assert_ptr_nonnull(f);
    snprintf(want, sizeof(want), "%lx-", (unsigned long)(uintptr_t)addr);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, want, strlen(want)) == 0)
            in = 1;
        else if (in && sscanf(line, "Rss: %ld kB", &rss) == 1)
            break;
    }
    fclose(f);
    return rss < 0 ? -1 : rss * 1024;
}

/* Each side chooses its rings (loop 0: the active side 64 KiB, the passive the default; 1:
 * the default and 128 KiB; 2: both 64 KiB): the connection's rings are the smaller choice
 * on both ends, ring_mem counts a header and two such rings per end while it lives and
 * nothing after, and in both directions messages larger than the ring (a SEND of three
 * rings + 5 into three sges, a WRITE with IMM of two rings + 7) pass whole, in fragments of
 * at most a quarter ring, through the ring (no process_vm_* copy); then the memory each end
 * has of the segment (its mapping's resident pages) is at most its header and two such
 * rings, however large the segment the active side made. Seen failing with the rings of
 * the active side's choice used whatever the passive side said (loop 1: 4 MiB rings), and
 * with fragments of SHM_FRAG_BYTES in rings this small (the fragment bound). */
START_TEST(shm_small_rings)
{
    static const char *kb_a[] = {"64", NULL, "64"}, *kb_b[] = {NULL, "128", "64"};
    static const uint32_t want[] = {64u << 10, 128u << 10, 64u << 10};
    const uint32_t R = want[_i], SLEN = 3 * R + 5, WLEN = 2 * R + 7;
    const uint32_t s0 = R + 1, s1 = 3, s2 = SLEN - s0 - s1;
    struct pt_pair p;
    struct pt_buf *src, *dst, *wsrc, *wtgt;
    struct exs_prov_sge rs[3];
    struct exs_prov_recv_wr rw;
    struct exs_prov_grant *g;
    struct exs_prov_cqe c;
    struct conn_view ca, cb;
    uint64_t copies0;
    const uint64_t per_end = SHM_SEG_HDR + 2ull * R;

    if (skip_unless_shm("shm_small_rings"))
        return;
    rings_pair_setup(&p, kb_a[_i], kb_b[_i], R);
    ca = conn_view(p.ea);
    cb = conn_view(p.eb);
    ck_assert_uint_le(ca.frag_bytes, R / 4);
    copies0 = shm_counter("copies");

    /* a -> b: a SEND of three rings + 5 into a receive of three sges */
    src = pt_pair_buf(&p, 'a', SLEN, LW, 0);
    dst = pt_pair_buf(&p, 'b', SLEN + 64, LW, 0);
    pt_pattern(src->p, SLEN, 11);
    rs[0] = (struct exs_prov_sge){pt_raddr(dst, 0), s0, dst->mr->lkey};
    rs[1] = (struct exs_prov_sge){pt_raddr(dst, s0 + 16), s1, dst->mr->lkey};
    rs[2] = (struct exs_prov_sge){pt_raddr(dst, s0 + 32), s2, dst->mr->lkey};
    rw = (struct exs_prov_recv_wr){.wr_id = 1, .sg_list = rs, .num_sge = 3};
    ck_assert_int_eq(pt_ops->post_recv(p.eb, &rw), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, SLEN, 0, 0, 0), 0);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, SLEN);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    ck_assert(memcmp(dst->p, src->p, s0) == 0);
    ck_assert(memcmp(dst->p + s0 + 16, src->p + s0, s1) == 0);
    ck_assert(memcmp(dst->p + s0 + 32, src->p + s0 + s1, s2) == 0);
    ck_assert(pt_all_bytes(dst->p + s0, 16, 0) && pt_all_bytes(dst->p + s0 + 16 + s1, 13, 0));

    /* b -> a: a WRITE with IMM of two rings + 7 into a grant */
    wsrc = pt_pair_buf(&p, 'b', WLEN, LW, 0);
    wtgt = pt_pair_buf(&p, 'a', WLEN + 64, LW, 0x5A);
    pt_pattern(wsrc->p, WLEN, 12);
    ck_assert_int_eq(pt_ops->grant(p.ea, wtgt->mr, wtgt->p + 32, WLEN, RW, &g), 0);
    ck_assert_int_eq(pt_post_recv(p.ea, 3, NULL, 0, 0), 0);
    ck_assert_int_eq(pt_post_send(p.eb, 4, EXS_PROV_WR_RDMA_WRITE_WITH_IMM, SIG, wsrc, 0, WLEN, 77,
                                  g->addr, g->rkey),
                     0);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV_RDMA_WITH_IMM, &c);
    ck_assert_uint_eq(c.imm_data, 77);
    ck_assert_uint_eq(c.byte_len, WLEN);
    pt_expect_cqe(&p.b, 4, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RDMA_WRITE, NULL);
    ck_assert(memcmp(wtgt->p + 32, wsrc->p, WLEN) == 0);
    ck_assert(pt_all_bytes(wtgt->p, 32, 0x5A) && pt_all_bytes(wtgt->p + 32 + WLEN, 32, 0x5A));
    ck_assert(pt_buf_guards_ok(wtgt) && pt_buf_guards_ok(dst));
    ck_assert_uint_eq(shm_counter("copies"), copies0);

    /* the memory each end holds of the segment: its header and two rings of R at most */
    {
        long ra = mapping_rss(ca.seg), rb = mapping_rss(cb.seg);

        ck_assert_msg(ra > 0 && rb > 0, "segment mappings not found (%ld, %ld)", ra, rb);
        ck_assert_msg((uint64_t)ra <= per_end && (uint64_t)rb <= per_end,
                      "resident %ld and %ld bytes of the segment, rings of %u", ra, rb, R);
        printf("shm_small_rings(%u KiB): resident %ld and %ld bytes of segments of %u\n", R >> 10,
               ra, rb, SHM_SEG_BYTES(ca.seg_ring));
    }
    pt_ops->revoke(g);
    /* the ends gone: nothing counted (a connection is freed at its ctx's next turn) */
    rings_pair_close(&p);
}
END_TEST

/* The producer's position in its ring (its 64-bit count of bytes written): the connection
 * under nic_lock, its head under ctx->lock (the poster's). */
static uint64_t tx_head(struct exs_prov_ep *e)
{
    struct shm_ctx *ctx = shm_ep_of(e)->ctx;
    struct shm_conn *conn;
    uint64_t head;

    nic_hold(ctx);
    conn = shm_ep_of(e)->conn;
    ck_assert_ptr_nonnull(conn);
    exs__lite_lock(&ctx->lock);
    head = conn->head;
    exs__lite_unlock(&ctx->lock);
    nic_drop(ctx);
    return head;
}

/* Records announce themselves (version 6): the writer zeroes the size word of the slot after
 * each record before it stores the record's own, so the reader never takes what an earlier
 * lap left at its position for a record. SENDs of lengths that put each record's start in
 * the middle of earlier laps' records and payloads (payload bytes 0xA5: a stale size word
 * is never 0), inline and in fragments, some 80 rings' worth through rings of 64 KiB, each
 * message whole in its receive. Without the zeroing the reader takes a stale header or
 * payload for a record: a protocol error, the connection ended (seen failing).
 * The hot window (version 7) makes two kinds of laps, both covered: rounds of one message
 * (the ring empty at each post: beyond SHM_HOT_WINDOW a PAD to the lap's end, whose slot
 * after, ring offset 0, holds an earlier lap's record until the PAD's writer zeroes it) and
 * bursts of BURST messages posted before any completes (the ring not empty by the tail the
 * poster saw: no PAD, the records walk the whole ring and wrap around its end). Both are
 * counted: the laps through PADs (ring_pads) and the laps through the ring's end (the laps
 * the writer's position made less the PADs) each more than 0. */
START_TEST(shm_ring_laps_stale_slots)
{
    enum { BURST = 40 };
    const uint32_t R = 64u << 10, MAXL = SHM_RING_INLINE + 700;
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;
    uint64_t bytes = 0, pads0, pads, laps, head0;
    uint32_t i = 0;

    if (skip_unless_shm("shm_ring_laps_stale_slots"))
        return;
    rings_pair_setup(&p, "64", "64", R);
    src = pt_pair_buf(&p, 'a', MAXL, LW, 0xA5);
    dst = pt_pair_buf(&p, 'b', BURST * MAXL, LW, 0);
    pads0 = shm_counter("ring_pads");
    head0 = tx_head(p.ea);
    for (uint32_t round = 0; bytes < 80ull * R; round++) {
        uint32_t k = round % 2 ? BURST : 1;

        memset(dst->p, 0, (size_t)BURST * MAXL);
        for (uint32_t j = 0; j < k; j++)
            ck_assert_int_eq(pt_post_recv(p.eb, 1 + j, dst, (size_t)j * MAXL, MAXL), 0);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t len = 1 + ((i + j) * 997u) % MAXL;

            ck_assert_int_eq(
                pt_post_send(p.ea, 100 + j, EXS_PROV_WR_SEND, SIG, src, 0, len, 0, 0, 0), 0);
        }
        for (uint32_t j = 0; j < k; j++) {
            uint32_t len = 1 + ((i + j) * 997u) % MAXL;
            const uint8_t *d = dst->p + (size_t)j * MAXL;

            pt_expect_cqe(&p.b, 1 + j, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
            ck_assert_uint_eq(c.byte_len, len);
            ck_assert(pt_all_bytes(d, len, 0xA5) && pt_all_bytes(d + len, MAXL - len, 0));
            bytes += len + SHM_REC_HDR;
        }
        for (uint32_t j = 0; j < k; j++)
            pt_expect_cqe(&p.a, 100 + j, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        i += k;
    }
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_CONNECTED);
    pads = shm_counter("ring_pads") - pads0; /* (only a writes: b sends nothing) */
    laps = tx_head(p.ea) / R - head0 / R;
    printf("shm_ring_laps_stale_slots: %u messages, %llu laps, %llu through a PAD\n", i,
           (unsigned long long)laps, (unsigned long long)pads);
    ck_assert_uint_gt(pads, 0);
    ck_assert_uint_gt(laps, pads);
    ck_assert(pt_buf_guards_ok(dst));
    rings_pair_close(&p);
}
END_TEST

/* The hot window (version 7, spec/provider-shm.md "The hot window"): a ping-pong of N 64 B
 * SENDs between a pair (records of 128 bytes), each message a pattern of its own, checked
 * whole and in order (the completions' wr_ids in sequence). Each producer finds its ring
 * empty at each post (the answer to its last message told it), so beyond SHM_HOT_WINDOW it
 * writes a PAD and starts again at ring offset 0: both producers' positions, read after each
 * round, stay within the window and a record (a few records of slack: a post may come
 * before the answer that says the ring is empty, and the PAD is then one post later), and
 * ring_pads counts about one PAD per window's worth of records per side. Without the PAD
 * the positions walk the ring of 4 MiB (N records of 128 bytes: 250 KiB). */
START_TEST(shm_hot_window)
{
    enum { N = 2000, SZ = 64, REC = 128, SLACK = 4 * REC };
    struct pt_pair p;
    struct pt_buf *sa, *sb, *da, *db;
    struct exs_prov_cqe c;
    uint64_t pads0, pads, top[2] = {0, 0};

    if (skip_unless_shm("shm_hot_window"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    sa = pt_pair_buf(&p, 'a', SZ, LW, 0);
    sb = pt_pair_buf(&p, 'b', SZ, LW, 0);
    da = pt_pair_buf(&p, 'a', SZ, LW, 0);
    db = pt_pair_buf(&p, 'b', SZ, LW, 0);
    pads0 = shm_counter("ring_pads");
    for (uint32_t i = 0; i < N; i++) {
        pt_pattern(sa->p, SZ, 2 * i);
        pt_pattern(sb->p, SZ, 2 * i + 1);
        memset(da->p, 0, SZ);
        memset(db->p, 0, SZ);
        ck_assert_int_eq(pt_post_recv(p.eb, 10 * (uint64_t)i, db, 0, SZ), 0);
        ck_assert_int_eq(pt_post_recv(p.ea, 10 * (uint64_t)i + 1, da, 0, SZ), 0);
        ck_assert_int_eq(
            pt_post_send(p.ea, 10 * (uint64_t)i + 2, EXS_PROV_WR_SEND, SIG, sa, 0, SZ, 0, 0, 0), 0);
        pt_expect_cqe(&p.b, 10 * (uint64_t)i, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, SZ);
        ck_assert_msg(pt_pattern_check(db->p, SZ, 2 * i) < 0, "ping %u differs", i);
        pt_expect_cqe(&p.a, 10 * (uint64_t)i + 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        ck_assert_int_eq(
            pt_post_send(p.eb, 10 * (uint64_t)i + 3, EXS_PROV_WR_SEND, SIG, sb, 0, SZ, 0, 0, 0), 0);
        pt_expect_cqe(&p.a, 10 * (uint64_t)i + 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, SZ);
        ck_assert_msg(pt_pattern_check(da->p, SZ, 2 * i + 1) < 0, "pong %u differs", i);
        pt_expect_cqe(&p.b, 10 * (uint64_t)i + 3, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        for (int s = 0; s < 2; s++) {
            uint64_t off = tx_head(s ? p.eb : p.ea) & (SHM_RING_DEFAULT - 1);

            top[s] = EXS_MAX(top[s], off);
            ck_assert_msg(off <= SHM_HOT_WINDOW + SLACK,
                          "round %u: side %d's position at ring offset %llu, beyond the hot "
                          "window (%u) and %u",
                          i, s, (unsigned long long)off, SHM_HOT_WINDOW, SLACK);
        }
    }
    pads = shm_counter("ring_pads") - pads0;
    printf("shm_hot_window: %u round trips, %llu PADs, positions up to %llu and %llu\n", N,
           (unsigned long long)pads, (unsigned long long)top[0], (unsigned long long)top[1]);
    /* per side, a PAD each window's worth of records: N / (SHM_HOT_WINDOW / REC) (15) */
    ck_assert_uint_ge(pads, 2 * (N / (SHM_HOT_WINDOW / REC + SLACK / REC)));
    ck_assert_uint_le(pads, 2 * (N / (SHM_HOT_WINDOW / REC) + 1));
    ck_assert(top[0] >= SHM_HOT_WINDOW && top[1] >= SHM_HOT_WINDOW);
    ck_assert_int_eq(pt_ops->ep_state(p.ea), EXS_PROV_EP_CONNECTED);
    pt_pair_close(&p);
}
END_TEST

/* h47 (attack review of fca7144, the ring size agreed per connection): a liar whose
 * segment's rings are larger than the rings agreed (it made a segment of the default
 * size, its peer chose 128 KiB: the connection's rings are 128 KiB, the segment has 4 MiB
 * of each). Loop 0: a 16 B inline SEND whose record claims a size beyond the agreed ring
 * (within the segment's ring; version 5 published a head that far ahead); loop 1: a fragment sized
 * as one of a default ring (64 KiB of payload, a record of 65600 bytes, all published, less than
 * the agreed ring) where the agreed ring's fragments are at most a quarter ring. Each is a protocol
 * error for that connection, nothing placed (the receive, large enough for the whole message, is
 * flushed and untouched); the next connection works. Seen failing (version 5) with the head checked
 * against the segment's ring (seg_ring) instead of the agreed one (loop 0: the SEND was delivered)
 * and with fragments checked against SHM_FRAG_BYTES (loop 1: no protocol error). */
START_TEST(shm_liar_small_ring)
{
    const uint32_t R = 128u << 10, MLEN = 2 * SHM_FRAG_BYTES;
    struct pt_pair p;
    struct pt_buf *dst;
    struct liar l;
    struct shm_rec rec;
    uint64_t perr;

    if (skip_unless_shm("shm_liar_small_ring"))
        return;
    rings_pair_setup(&p, NULL, "128", R);
    ck_assert_uint_eq(conn_view(p.eb).seg_ring, SHM_RING_DEFAULT);
    l = liar(&p);
    ck_assert_uint_eq(l.head, 0); /* (put_rec's position: the same in either ring) */
    dst = pt_pair_buf(&p, 'b', MLEN, LW, 0);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, MLEN), 0);
    perr = shm_counter("protocol_errors");
    memset(&rec, 0, sizeof(rec));
    rec.type = SHM_REC_SEND;
    if (_i == 0) {
        rec.flags = SHM_RF_INLINE;
        rec.len = 16;
        rec.size = R + SHM_SLOT; /* beyond the agreed ring, within the segment's */
        put_rec(&l, &rec, NULL, 0);
    } else {
        rec.flags = SHM_RF_FRAG;
        rec.len = MLEN;
        rec.size = (SHM_REC_HDR + SHM_FRAG_BYTES + SHM_SLOT - 1) & ~(SHM_SLOT - 1);
        ck_assert_uint_lt(rec.size, R);
        put_rec(&l, &rec, NULL, 0);
    }
    expect_b_ended(&p, -EPROTO);
    close(bell_fd);
    bell_fd = -1;
    ck_assert_uint_gt(shm_counter("protocol_errors"), perr);
    pt_expect_wr(&p.b, 1, EXS_PROV_WC_WR_FLUSH_ERR, PT_ANY_OPCODE, NULL);
    ck_assert(pt_all_bytes(dst->p, MLEN, 0));
    ck_assert(pt_buf_guards_ok(dst));
    fresh_connection_works(&p);
    pt_pair_close(&p);
}
END_TEST

/* h47 (attack review of fca7144): real connections at the bounds of EXS_SHM_RING_KB. Loop
 * 0: both sides at the largest (256 MiB rings, a segment of 512 MiB + 4 KiB: the sizes'
 * 32-bit arithmetic at its top); loop 1: the active side at the largest, the passive at the
 * smallest (64 KiB agreed in a 512 MiB segment); loop 2: the other way (64 KiB segment, the
 * passive side's choice larger). The agreed rings on both ends, ring_mem's count, a 64 B
 * SEND and a SEND of 1 MiB + 3 (fragments) each way, byte for byte; ring_mem back to 0
 * after the ends. No test ran a connection at the top bound (shm_small_rings: 64 and
 * 128 KiB). */
START_TEST(shm_ring_bounds)
{
    static const char *kb_a[] = {"262144", "262144", "64"}, *kb_b[] = {"262144", "64", "262144"};
    static const uint32_t want[] = {SHM_RING_MAX, SHM_RING_MIN, SHM_RING_MIN};
    const uint32_t R = want[_i], BIG = (1u << 20) + 3;
    struct pt_pair p;

    if (skip_unless_shm("shm_ring_bounds"))
        return;
    rings_pair_setup(&p, kb_a[_i], kb_b[_i], R);
    ck_assert_uint_eq(conn_view(p.eb).seg_ring, conn_view(p.ea).seg_ring);
    for (int dir = 0; dir < 2; dir++) {
        struct exs_prov_ep *tx = dir ? p.eb : p.ea, *rx = dir ? p.ea : p.eb;
        struct pt_host *htx = dir ? &p.b : &p.a, *hrx = dir ? &p.a : &p.b;
        char stx = dir ? 'b' : 'a', srx = dir ? 'a' : 'b';
        struct pt_buf *src = pt_pair_buf(&p, stx, BIG, LW, 0);
        struct pt_buf *dst = pt_pair_buf(&p, srx, BIG, LW, 0);
        struct exs_prov_cqe c;

        for (int k = 0; k < 2; k++) {
            uint32_t len = k ? BIG : 64;

            pt_pattern(src->p, len, 40 + 2 * dir + k);
            memset(dst->p, 0, BIG);
            ck_assert_int_eq(pt_post_recv(rx, 10 + k, dst, 0, BIG), 0);
            ck_assert_int_eq(pt_post_send(tx, 20 + k, EXS_PROV_WR_SEND, SIG, src, 0, len, 0, 0, 0),
                             0);
            pt_expect_cqe(hrx, 10 + k, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
            ck_assert_uint_eq(c.byte_len, len);
            pt_expect_cqe(htx, 20 + k, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
            ck_assert_msg(pt_pattern_check(dst->p, len, 40 + 2 * dir + k) < 0,
                          "rings of %u, direction %d, %u bytes: data differs", R, dir, len);
            ck_assert(pt_all_bytes(dst->p + len, BIG - len, 0) && pt_buf_guards_ok(dst));
        }
    }
    rings_pair_close(&p);
}
END_TEST

/* A thread that spins turns of one context's rings (nic_lock held per turn, no descriptors:
 * exs__shm_turn with collect 0; its completions are queued for the test's polls). */
struct spinner {
    struct shm_ctx *ctx;
    int stop;
    pthread_t th;
};

static void *spin_turns(void *arg)
{
    struct spinner *sp = arg;

    while (!__atomic_load_n(&sp->stop, __ATOMIC_ACQUIRE)) {
        nic_hold(sp->ctx);
        (void)exs__shm_turn(sp->ctx, 0);
        nic_drop(sp->ctx);
    }
    return NULL;
}

/* A PAD's announcement: its writer zeroes the size word of the slot after it, the ring's
 * offset 0, before it stores the PAD's size, as after any record. Messages of three
 * fragments of 64 KiB (records of 65600 bytes) one at a time, b's rings turned by a
 * spinning thread: each message but the first starts beyond the window with the ring empty,
 * so a PAD, then its first fragment at offset 0, whose 64 KiB copy into the ring (after
 * the PAD was published) gives the spinning reader time to look at offset 0, where the
 * first fragment of the message before lies (the same size, the same header but its psn):
 * without the zeroing it is taken for the new one (a protocol error, "record sequence", or,
 * the header already rewritten, a fragment taken before its payload is in: the message
 * differs from its pattern). Each message whole, one PAD per message but the first. */
START_TEST(shm_hot_window_pad_announce)
{
    enum { K = 12, LEN = 3 * SHM_FRAG_BYTES };
    struct pt_pair p;
    struct pt_buf *src, *dst;
    struct exs_prov_cqe c;
    struct spinner sp;
    uint64_t pads0;

    if (skip_unless_shm("shm_hot_window_pad_announce"))
        return;
    pt_pair_setup(&p, NULL, NULL);
    src = pt_pair_buf(&p, 'a', LEN, LW, 0);
    dst = pt_pair_buf(&p, 'b', LEN, LW, 0);
    pads0 = shm_counter("ring_pads");
    sp = (struct spinner){shm_ep_of(p.eb)->ctx, 0, 0};
    ck_assert_int_eq(pthread_create(&sp.th, NULL, spin_turns, &sp), 0);
    for (uint32_t i = 0; i < K; i++) {
        pt_pattern(src->p, LEN, 77 + i);
        memset(dst->p, 0, LEN);
        ck_assert_int_eq(pt_post_recv(p.eb, 1, dst, 0, LEN), 0);
        ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, src, 0, LEN, 0, 0, 0), 0);
        pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
        ck_assert_uint_eq(c.byte_len, LEN);
        ck_assert_msg(pt_pattern_check(dst->p, LEN, 77 + i) < 0, "message %u differs", i);
        pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
        /* the first fragment at offset 0, the position beyond it (no PAD at a fragment) */
        ck_assert_uint_eq(tx_head(p.ea) & (SHM_RING_DEFAULT - 1), 3 * 65600);
    }
    __atomic_store_n(&sp.stop, 1, __ATOMIC_RELEASE);
    ck_assert_int_eq(pthread_join(sp.th, NULL), 0);
    ck_assert_uint_eq(shm_counter("ring_pads") - pads0, K - 1);
    ck_assert_int_eq(pt_ops->ep_state(p.eb), EXS_PROV_EP_CONNECTED);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_shm_suite(void)
{
    Suite *s = suite_create("prov_shm");
    TCase *tc = pt_tcase("shm_liar");

    tcase_add_loop_test(tc, shm_liar, 0, LIE_COUNT);
    tcase_add_loop_test(tc, shm_liar_beyond_grant, 0, 2);
    tcase_add_loop_test(tc, shm_liar_frag, 0, FRAG_LIES);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_death");
    tcase_add_test(tc, shm_peer_killed_mid_transfer);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_rendezvous");
    tcase_add_loop_test(tc, shm_rendezvous_deadline, 0, 2);
    tcase_add_test(tc, shm_rendezvous_look);
    tcase_add_loop_test(tc, shm_segment_unsealed, 0, 10);
    tcase_add_loop_test(tc, shm_version_mismatch, 0, 4);
    tcase_add_loop_test(tc, shm_version_mismatch_reply, 0, 5);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_rings");
    tcase_add_loop_test(tc, shm_small_rings, 0, 3);
    tcase_add_loop_test(tc, shm_liar_small_ring, 0, 2);
    tcase_add_test(tc, shm_ring_laps_stale_slots);
    tcase_add_loop_test(tc, shm_ring_bounds, 0, 3);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_busy");
    tcase_add_loop_test(tc, shm_busy_turns_no_syscall, 0, 2);
    tcase_add_test(tc, shm_poll_queued_no_turn);
    tcase_add_test(tc, shm_cm_queued_follows_events);
    tcase_add_test(tc, shm_progress_poll_direct);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_fast");
    tcase_add_test(tc, shm_fast_paths);
    tcase_add_test(tc, shm_frag_send_scatter);
    tcase_add_test(tc, shm_frag_bell_half_ring);
    tcase_add_loop_test(tc, shm_owed_fence, 0, 2);
    suite_add_tcase(s, tc);
    tc = pt_tcase("shm_hot");
    tcase_add_test(tc, shm_hot_window);
    tcase_add_test(tc, shm_hot_window_pad_announce);
    suite_add_tcase(s, tc);
    return s;
}
