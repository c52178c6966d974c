/* SPDX-License-Identifier: MIT */
/* Hostile-peer tests: raw peers play the attacks of issue 10 and the bad peers of issue 13 against
 * a forked echo server. */
#include <check.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "exs/util/sha256.h"
#include "tests/hostile/raw.h"
#include "tests/hostile/server.h"

#define ECHO_MS   20000 /* a well-behaved client must be served within this (generous) */
#define ANSWER_MS 10000 /* an ACK or NAK must arrive within this */
#define SEQ       2     /* EXS_WIRE_SOCK_SEQPACKET */
#define STR       1     /* EXS_WIRE_SOCK_STREAM */

static struct srv srv;

static void start(int sock_type, int nofile, int quiet)
{
    struct srv_opts o = {.sock_type = sock_type, .nofile = nofile, .quiet = quiet};

    ck_assert_int_eq(srv_start(&srv, &o), 0);
}

static void stop(void)
{
    srv_stop(&srv);
}

/* The server process still runs and serves a well-behaved library client. */
static void expect_alive(int sock_type, const char *after)
{
    char how[64];
    int err;

    ck_assert_msg(srv_running(&srv), "after %s the server died: %s", after,
                  srv_how(&srv, how, sizeof(how)));
    /* A refusal means the listener's backlog is full (children the attack left for
     * exs_accept, which the server drains one by one): a real client tries again, and
     * the server must serve it before the deadline. */
    for (int tries = 0;; tries++) {
        err = client_echo(srv.port, sock_type, 1000, ECHO_MS);
        if (err != -ECONNREFUSED || tries == 50 || !srv_running(&srv))
            break;
        usleep(100 * 1000);
    }
    ck_assert_msg(err == 0, "after %s a well-behaved client was not served: %s (server %s)", after,
                  strerror(-err), srv_how(&srv, how, sizeof(how)));
}

static void open_peer(struct raw_peer *p, unsigned wire_type)
{
    struct exs_wire_hello h;
    int err;

    raw_hello_default(&h, wire_type);
    err = raw_open(p, srv.port, &h, ANSWER_MS);
    ck_assert_msg(err == 0, "handshake of a valid raw peer failed: %s", strerror(-err));
    /* keys that come after the handshake (RING, ADVERT records) */
    ck_assert_msg(raw_wait_ring(p, ANSWER_MS) == 0, "the server's ring key never came");
    raw_pump(p, 100);
}

static uint64_t ring_addr(const struct raw_peer *p)
{
    return be64toh(p->peer.ring_addr);
}

static uint32_t ring_size(const struct raw_peer *p)
{
    return be32toh(p->peer.ring_size);
}

/* WRITE (or READ) through p; returns 0 (ACK / response), a NAK syndrome, or -errno. */
static int try_write(struct raw_peer *p, uint64_t raddr, uint32_t rkey, uint32_t len)
{
    static uint8_t forged[65536];
    uint32_t psn;

    memset(forged, 0xF0, sizeof(forged));
    if (len > sizeof(forged))
        len = sizeof(forged);
    if (raw_write(p, raddr, rkey, 0, 0, forged, len, &psn))
        return -ECONNRESET;
    return raw_wait_psn(p, psn, ANSWER_MS);
}

static int try_read(struct raw_peer *p, uint64_t raddr, uint32_t rkey, uint32_t len)
{
    uint32_t psn;

    if (raw_read_req(p, raddr, rkey, len, &psn))
        return -ECONNRESET;
    return raw_wait_psn(p, psn, ANSWER_MS);
}

/* A refused access: NAK REM_ACCESS (or the connection ended without a response). */
static void expect_refused(int r, const char *what)
{
    ck_assert_msg(r == TCP_WIRE_SYN_REM_ACCESS || r == -ECONNRESET, "%s was not refused (%s)", what,
                  r == 0  ? "it succeeded"
                  : r > 0 ? "other NAK"
                          : strerror(-r));
}

/* ---- (1) complete CONN_REQ, then an immediate reset ---- */

START_TEST(conn_req_then_reset)
{
    struct exs_wire_hello h;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    char how[64];
    int err;

    start(SOCK_SEQPACKET, 0, 0);
    raw_hello_default(&h, SEQ);
    for (int i = 0; i < 400; i++) {
        int fd = raw_tcp_connect(srv.port);

        ck_assert_msg(fd >= 0, "connect %d: %s (server %s)", i + 1, strerror(-fd),
                      srv_how(&srv, how, sizeof(how)));
        err = raw_send_conn_req(fd, &h, sizeof(h));
        ck_assert_msg(err == 0, "CONN_REQ %d: %s (server %s)", i + 1, strerror(-err),
                      srv_how(&srv, how, sizeof(how)));
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fd);
        if (i % 10 == 0)
            ck_assert_msg(srv_running(&srv), "server died after %d resets: %s", i + 1,
                          srv_how(&srv, how, sizeof(how)));
    }
    expect_alive(SOCK_SEQPACKET, "400 CONN_REQ + reset");
    stop();
}
END_TEST

/* ---- (3) a WRITE into the ring that stops in the middle ---- */

START_TEST(silent_half_write)
{
    struct raw_peer a, b;
    uint8_t part[10];

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    open_peer(&b, SEQ);
    memset(part, 0x5A, sizeof(part));
    /* B starts a 4096-byte WRITE into A's ring with A's key: 10 bytes, then silence */
    ck_assert_int_eq(raw_send_frame(b.fd, TCP_WIRE_WRITE, 0, 0, 4096, b.tx_psn++, ring_addr(&a),
                                    a.ring_rkey, 0, part, sizeof(part)),
                     0);
    /* from now on B answers nothing: any byte it sent would continue the WRITE */
    b.mute = 1;
    raw_pump(&b, 300); /* the server has started placing it (or refused it) */
    /* the application closes A's connection (the oldest); once the server has ended it,
     * releasing A's ring must not wait for B, and others must be served */
    ck_assert_int_eq(srv_close_oldest(&srv), 0);
    raw_pump(&a, ECHO_MS);
    ck_assert_msg(a.closed, "the server did not end the connection it closed");
    expect_alive(SOCK_SEQPACKET, "a silent half WRITE into a closed connection's ring");
    raw_close(&a);
    raw_close(&b);
    expect_alive(SOCK_SEQPACKET, "the silent writer went away");
    stop();
}
END_TEST

/* ---- (4) isolation: keys of connection A used on connection B ---- */

START_TEST(isolation_ring_key)
{
    struct raw_peer a, b;
    int r;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    ck_assert_msg(ring_addr(&a) && ring_size(&a), "server announced no ring");
    /* positive control: A may write its own ring */
    r = try_write(&a, ring_addr(&a), a.ring_rkey, 64);
    ck_assert_msg(r == 0, "A could not write its own ring (%d): the test is broken", r);

    open_peer(&b, SEQ);
    expect_refused(try_write(&b, ring_addr(&a), a.ring_rkey, 64), "B writing A's ring");
    raw_close(&b);
    open_peer(&b, SEQ);
    r = try_read(&b, ring_addr(&a), a.ring_rkey, 64);
    ck_assert_msg(!b.read_resp_seen, "B read A's ring");
    expect_refused(r, "B reading A's ring");
    raw_close(&b);
    open_peer(&b, SEQ);
    expect_refused(try_read(&b, ring_addr(&b), b.ring_rkey, 64), "reading one's own ring");
    raw_close(&b);
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "ring key probes");
    stop();
}
END_TEST

/* The next message the server echoes to p equals msg (nothing forged was delivered). */
static void expect_echo(struct raw_peer *p, const void *msg, uint32_t len)
{
    unsigned before = p->data_msgs;
    double deadline = raw_now_ms() + ANSWER_MS;

    while (p->data_msgs == before && raw_now_ms() < deadline && !p->closed)
        raw_pump(p, 100);
    ck_assert_msg(p->data_msgs > before, "no echo arrived");
    ck_assert_uint_eq(p->data_len, len);
    ck_assert_msg(memcmp(p->data, msg, len) == 0, "the echo holds bytes A never sent");
}

START_TEST(isolation_no_forged_delivery)
{
    static const char msg[64] = "genuine message from A, exactly sixty-four bytes long.........";
    uint32_t psn, imm = exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0);
    struct raw_peer a, b;
    int r;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    /* A puts its message into the ring slot the server will read next (offset 0)... */
    ck_assert_int_eq(raw_write(&a, ring_addr(&a), a.ring_rkey, 0, 0, msg, sizeof(msg), &psn), 0);
    ck_assert_int_eq(raw_wait_psn(&a, psn, ANSWER_MS), 0);
    /* ...B overwrites that slot with A's ring key... */
    open_peer(&b, SEQ);
    r = try_write(&b, ring_addr(&a), a.ring_rkey, sizeof(msg));
    raw_close(&b);
    /* ...and A's WRITE WITH IMMEDIATE (its payload placed further on) makes the server
     * take the slot at offset 0 as A's message: it must hold A's bytes, not B's */
    ck_assert_int_eq(
        raw_write(&a, ring_addr(&a) + 4096, a.ring_rkey, 1, imm, msg, sizeof(msg), &psn), 0);
    ck_assert_int_eq(raw_wait_psn(&a, psn, ANSWER_MS), 0);
    expect_echo(&a, msg, sizeof(msg));
    expect_refused(r, "B writing A's ring");
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "forged ring writes");
    stop();
}
END_TEST

/* A peer that asks for a trace (spec/protocol.md §5.1) learns nothing of the host's
 * clock: the server's answer carries times on its trace clock for the connection (a
 * random epoch), not CLOCK_MONOTONIC, which would tell the host's uptime. */
START_TEST(trace_answer_no_host_clock)
{
    static const char msg[64] = "a traced message; the server's answer must not tell its uptime";
    struct exs_wire_trace req = {
        .hdr = {.type = EXS_CTRL_TRACE, .len = htobe16(EXS_WIRE_TRACE_LEN)},
        .t_req = htobe64(1), /* T1 of message 0, the next one */
    };
    uint32_t psn, imm = exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0);
    uint64_t year = 365ull * 86400 * 1000000000, now, t[4];
    struct raw_peer a;
    struct timespec ts;
    double deadline;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    ck_assert_int_eq(raw_send_ctrl(&a, &req, sizeof(req), &psn), 0);
    ck_assert_int_eq(raw_write(&a, ring_addr(&a), a.ring_rkey, 1, imm, msg, sizeof(msg), &psn), 0);
    expect_echo(&a, msg, sizeof(msg));
    deadline = raw_now_ms() + ANSWER_MS;
    while (!a.trace_answers && !a.closed && raw_now_ms() < deadline)
        raw_pump(&a, 100);
    ck_assert_msg(a.trace_answers == 1, "%u TRACE answers", a.trace_answers);
    ck_assert_uint_eq(be64toh(a.trace.seq), 0);
    ck_assert_uint_eq(a.trace.hdr.flags, EXS_TRACE_ANSWER);
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the server's host: this one */
    now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    t[0] = be64toh(a.trace.t_req);
    t[1] = be64toh(a.trace.t_arrival);
    t[2] = be64toh(a.trace.t_delivery);
    t[3] = be64toh(a.trace.t_answer);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(t[i] > now + year || t[i] + year < now,
                      "time %d of the answer, %llu, is within a year of the host's clock %llu", i,
                      (unsigned long long)t[i], (unsigned long long)now);
    ck_assert(t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3]);
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "a traced message");
    stop();
}
END_TEST

/* Wait until the server has ADVERTed a receive buffer to p. */
static void want_advert(struct raw_peer *p)
{
    double deadline = raw_now_ms() + ANSWER_MS;

    while (!p->n_adverts && raw_now_ms() < deadline && !p->closed)
        raw_pump(p, 100);
    ck_assert_msg(p->n_adverts, "the server advertised no receive buffer");
}

START_TEST(isolation_advert_key)
{
    struct raw_peer a, b;
    struct raw_key k;
    int r;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    want_advert(&a);
    k = a.adverts[a.n_adverts - 1];
    /* ADVERTed buffers are for remote write only */
    r = try_read(&a, k.addr, k.rkey, k.len < 256 ? k.len : 256);
    ck_assert_msg(!a.read_resp_seen, "A read its ADVERTed receive buffer");
    expect_refused(r, "reading an ADVERTed buffer");
    raw_close(&a);

    open_peer(&a, SEQ);
    want_advert(&a);
    k = a.adverts[a.n_adverts - 1];
    open_peer(&b, SEQ);
    expect_refused(try_write(&b, k.addr, k.rkey, 64), "B writing A's ADVERTed buffer");
    raw_close(&b);
    open_peer(&b, SEQ);
    r = try_read(&b, k.addr, k.rkey, 64);
    ck_assert_msg(!b.read_resp_seen, "B read A's ADVERTed buffer");
    expect_refused(r, "B reading A's ADVERTed buffer");
    raw_close(&b);
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "ADVERT key probes");
    stop();
}
END_TEST

/* Make the server ANNOUNCE a message to p: p sends a big message into the server's ADVERT,
 * the server echoes it, and p (whose hello says eager_max 4096, with no ADVERT of its own)
 * is announced it. Returns the ANNOUNCE. */
static struct raw_key want_announce(struct raw_peer *p, uint8_t *msg, uint32_t len)
{
    struct raw_key k;
    uint32_t psn, imm;
    double deadline = raw_now_ms() + ANSWER_MS;

    want_advert(p);
    k = p->adverts[0];
    ck_assert_uint_ge(k.len, len);
    for (uint32_t i = 0; i < len; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    imm = exs_imm_make(EXS_IMM_DIRECT, EXS_IMM_EOM, 0, k.id);
    ck_assert_int_eq(raw_write(p, k.addr, k.rkey, 1, imm, msg, len, &psn), 0);
    ck_assert_int_eq(raw_wait_psn(p, psn, ANSWER_MS), 0);
    while (!p->n_announces && raw_now_ms() < deadline && !p->closed)
        raw_pump(p, 100);
    ck_assert_msg(p->n_announces, "the server announced nothing");
    return p->announces[0];
}

START_TEST(isolation_announce_key)
{
    static uint8_t msg[16384];
    struct raw_peer a, b;
    struct raw_key k;
    int r;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    k = want_announce(&a, msg, sizeof(msg));
    ck_assert_uint_eq(k.len, sizeof(msg));

    /* B reads A's announced message */
    open_peer(&b, SEQ);
    r = try_read(&b, k.addr, k.rkey, k.len);
    ck_assert_msg(!b.read_resp_seen, "B read A's announced message");
    expect_refused(r, "B reading A's ANNOUNCEd buffer");
    raw_close(&b);
    /* B writes into it */
    open_peer(&b, SEQ);
    expect_refused(try_write(&b, k.addr, k.rkey, 64), "B writing A's ANNOUNCEd buffer");
    raw_close(&b);
    /* positive control: A reads its own announced message, intact */
    r = try_read(&a, k.addr, k.rkey, k.len);
    ck_assert_msg(r == 0 && a.read_resp_seen, "A could not read its announced message (%d)", r);
    ck_assert_uint_eq(a.read_resp_len, sizeof(msg));
    ck_assert_msg(memcmp(a.read_resp, msg, sizeof(msg)) == 0, "announced message altered");
    /* A writes into it: announced buffers are for remote read only */
    expect_refused(try_write(&a, k.addr, k.rkey, 64), "writing an ANNOUNCEd buffer");
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "ANNOUNCE key probes");
    stop();
}
END_TEST

START_TEST(keys_not_guessable)
{
    struct raw_peer a, b;
    uint32_t ka, kb;
    int hits = 0;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&a, SEQ);
    want_advert(&a);
    open_peer(&b, SEQ);
    ka = a.ring_rkey;
    kb = b.ring_rkey;
    raw_close(&b);
    ck_assert_msg(ka - kb + 64u > 128u, "ring keys of consecutive connections are close: %#x %#x",
                  ka, kb);
    /* keys near A's ring and ADVERT keys, tried on A's ring and buffer through other
     * connections: none may work */
    for (int d = -8; d <= 8; d++) {
        if (!d)
            continue;
        open_peer(&b, SEQ);
        hits += try_write(&b, ring_addr(&a), ka + (uint32_t)d, 64) == 0;
        raw_close(&b);
        open_peer(&b, SEQ);
        hits += try_write(&b, a.adverts[0].addr, a.adverts[0].rkey + (uint32_t)d, 64) == 0;
        raw_close(&b);
    }
    ck_assert_msg(hits == 0, "%d guessed keys worked", hits);
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "key guessing");
    stop();
}
END_TEST

/* ---- (6) STREAM hellos with bad fields ---- */

struct bad_hello {
    const char *name;
    uint32_t ring_size, eager_max, ctrl_size;
    uint16_t credits;
};

static const struct bad_hello bad_hellos[] = {
    {"ring_size 0", 0, 4096, EXS_WIRE_CTRL_MAX, 64},
    {"ring_size unaligned", 100000, 4096, EXS_WIRE_CTRL_MAX, 64},
    {"credits 0", 1u << 20, 4096, EXS_WIRE_CTRL_MAX, 0},
    {"credits 65535", 1u << 20, 4096, EXS_WIRE_CTRL_MAX, 65535},
    {"ctrl_size 16", 1u << 20, 4096, 16, 64},
    {"eager_max > ring", 4096, 65536, EXS_WIRE_CTRL_MAX, 64},
};

START_TEST(stream_bad_hello)
{
    const struct bad_hello *c = &bad_hellos[_i];
    struct exs_wire_hello h;
    struct raw_peer p;
    int err;

    start(SOCK_STREAM, 0, 0);
    raw_hello_default(&h, STR);
    h.ring_size = htobe32(c->ring_size);
    h.eager_max = htobe32(c->eager_max);
    h.ctrl_size = htobe32(c->ctrl_size);
    h.credits = htobe16(c->credits);
    err = raw_open(&p, srv.port, &h, ANSWER_MS);
    if (err == 0) {
        /* accepted: give the server something to send back to this peer, then judge */
        static const char data[200] = "stream bytes";
        uint32_t psn, imm = exs_imm_make(EXS_IMM_INDIRECT, 0, 0, 0);

        raw_pump(&p, 300);
        (void)raw_write(&p, ring_addr(&p), p.ring_rkey, 1, imm, data, sizeof(data), &psn);
        raw_pump(&p, 1000);
    }
    raw_close(&p);
    ck_assert_msg(err == -ECONNREFUSED || err == -ECONNRESET,
                  "STREAM hello with %s was not refused (%s)", c->name,
                  err ? strerror(-err) : "accepted");
    expect_alive(SOCK_STREAM, c->name);
    stop();
}
END_TEST

/* ---- (7) descriptor exhaustion ---- */

enum { SETTLE_MS = 30000 };

/* One look of 300 ms at the server's threads: 1 when each blocked at least twice or spent
 * under 30 ms on or waiting for a CPU (asleep). */
static int fd_settled(void)
{
    struct srv_tsnap a, b;
    int settled = 1;

    if (srv_threads_snap(&srv, &a))
        return 0;
    usleep(300 * 1000);
    if (srv_threads_snap(&srv, &b))
        return 0;
    for (int i = 0; i < b.n; i++)
        for (int j = 0; j < a.n; j++)
            if (a.t[j].tid == b.t[i].tid && b.t[i].blocked - a.t[j].blocked < 2 &&
                (b.t[i].run_ms - a.t[j].run_ms) + (b.t[i].wait_ms - a.t[j].wait_ms) >= 30)
                settled = 0;
    return settled;
}

START_TEST(fd_exhaustion_no_spin)
{
    enum { FLOOD = 300 };
    static int fds[FLOOD];
    struct srv_tsnap t0, t1;
    double c0, c1;
    double deadline;
    int err = -1, tid;
    char why[200];

    start(SOCK_SEQPACKET, 64, 1);
    for (int i = 0; i < FLOOD; i++) {
        struct sockaddr_in sin = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)srv.port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        ck_assert_int_ge(fds[i], 0);
        (void)connect(fds[i], (struct sockaddr *)&sin, sizeof(sin));
    }
    /* The burst's handshakes are served once every server thread sleeps again: each either
     * blocked a few times in a short look or hardly ran (a loaded host may take seconds to
     * get there; a moment's sleep was a premise). A server that spins never gets there: the
     * look gives up after SETTLE_MS and the window below judges it. */
    deadline = raw_now_ms() + SETTLE_MS;
    while (!fd_settled() && raw_now_ms() < deadline)
        ;
    c0 = srv_cpu_ms(&srv);
    ck_assert_int_eq(srv_threads_snap(&srv, &t0), 0);
    sleep(3); /* the window measured, not a wait for a condition */
    c1 = srv_cpu_ms(&srv);
    ck_assert_int_eq(srv_threads_snap(&srv, &t1), 0);
    ck_assert_msg(c0 >= 0 && c1 >= 0 && t1.n > 0, "cannot read the server's times");
    tid = srv_spinning(&t0, &t1, why, sizeof(why));
    printf("fd exhaustion: in 3 s the server used %.0f ms of CPU; spinning: %s\n", c1 - c0, why);
    fflush(stdout);
    /* generous margins: main's spinning NIC thread measured 520-3000 ms of CPU (depending on
     * the load) and ~3000 ms runnable without blocking; a backing-off server needs a few
     * tens of ms and blocks every round (this server's own loop wakes every 20 ms), however
     * long a loaded host keeps it waiting for a CPU */
    ck_assert_msg(c1 - c0 < 1500, "server used %.0f ms of CPU in 3 s under fd exhaustion", c1 - c0);
    ck_assert_msg(tid == 0, "a server thread spun under fd exhaustion: %s", why);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    /* once descriptors are free it serves again */
    deadline = raw_now_ms() + ECHO_MS;
    while (raw_now_ms() < deadline && (err = client_echo(srv.port, SOCK_SEQPACKET, 100, 5000)))
        usleep(200 * 1000);
    ck_assert_msg(err == 0, "server not serving after descriptors were freed: %s", strerror(-err));
    stop();
}
END_TEST

/* ---- (2) the application closes a connection while the peer kills it ----
 * Aims at the window of finding 2 (exs_close racing a dying connection); on main's code it
 * did not hit it in 5 runs under ASan (the random-frame fuzzer is the better hunter), so it
 * guards the close-at-accept path rather than proving that fix. */

START_TEST(close_races_dying_connection)
{
    struct srv_opts o = {.sock_type = SOCK_SEQPACKET, .close_at_once = 1};
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    char how[64];

    ck_assert_int_eq(srv_start(&srv, &o), 0);
    for (int i = 0; i < 500; i++) {
        struct raw_peer p;
        struct exs_wire_hello h;

        raw_hello_default(&h, SEQ);
        if (raw_open(&p, srv.port, &h, ANSWER_MS) == 0) {
            /* the server closes this connection now; kill it from here at the same time */
            (void)raw_send_frame(p.fd, 77, 0, 0, 0, 0, 0, 0, 0, NULL, 0);
            setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        }
        raw_close(&p);
        if (i % 50 == 0)
            ck_assert_msg(srv_running(&srv), "server died after %d rounds: %s", i + 1,
                          srv_how(&srv, how, sizeof(how)));
    }
    ck_assert_msg(srv_running(&srv), "server died: %s", srv_how(&srv, how, sizeof(how)));
    stop();
}
END_TEST

/* ---- handled cleanly today: keep it so ---- */

START_TEST(malformed_frames)
{
    static const struct {
        unsigned type, flags;
        uint32_t len;
    } bad[] = {
        {0, 0, 0},
        {77, 0, 0},
        {TCP_WIRE_ACK, 0, 8},
        {TCP_WIRE_SEND, 0x80, 0},
        {TCP_WIRE_CONN_REQ, 0, 8},
        {TCP_WIRE_NAK, 0, 0},
        {TCP_WIRE_READ_RESP, 0, 16},
        {TCP_WIRE_SEND, 0, 0xfffffff0u},
    };
    uint8_t zeros[16] = {0};
    char why[256], want[64];

    start(SOCK_SEQPACKET, 0, 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct raw_peer p;

        open_peer(&p, SEQ);
        (void)raw_send_frame(p.fd, bad[i].type, bad[i].flags, 0, bad[i].len, p.tx_psn, 0, 0, 0,
                             zeros, bad[i].len <= sizeof(zeros) ? bad[i].len : 0);
        raw_pump(&p, ANSWER_MS);
        ck_assert_msg(p.closed, "frame %zu (type %u) did not end the connection", i, bad[i].type);
        /* the tcp provider refused the frame (and logged why): the connection is reset,
         * and its reason names no rule of the protocol (spec/protocol.md §10) */
        snprintf(want, sizeof(want), "%d ", ECONNRESET);
        ck_assert_msg(srv_reason(&srv, why, sizeof(why), ANSWER_MS) == 0 && !strcmp(why, want),
                      "frame %zu: reason '%s', want '%s'", i, why, want);
        raw_close(&p);
    }
    expect_alive(SOCK_SEQPACKET, "malformed frames");
    stop();
}
END_TEST

/* Each record resets the connection, and the server's side names the rule it broke
 * (EXS_SO_ERROR_REASON, spec/protocol.md §10). */
START_TEST(malformed_control_records)
{
    static const char *const rule[4] = {"ctrl-type ", "ctrl-len ACK", "ctrl-len ACK",
                                        "ack-range ACK"};
    uint8_t rec[EXS_WIRE_CTRL_MAX];
    struct exs_wire_ctrl_hdr *h = (struct exs_wire_ctrl_hdr *)rec;
    char why[256], want[64];

    start(SOCK_SEQPACKET, 0, 0);
    for (int i = 0; i < 4; i++) {
        struct raw_peer p;
        uint32_t psn, len = 16;

        open_peer(&p, SEQ);
        memset(rec, 0, sizeof(rec));
        h->type = i == 0 ? 99 : EXS_CTRL_ACK;
        h->len = htobe16(i == 1 ? 7 : i == 2 ? 200 : 16);
        if (i == 3) /* ACK of ring bytes never written */
            ((struct exs_wire_ack *)rec)->ring_consumed = htobe64(1u << 30);
        ck_assert_int_eq(raw_send_ctrl(&p, rec, len, &psn), 0);
        raw_pump(&p, ANSWER_MS);
        ck_assert_msg(p.closed, "bad control record %d did not end the connection", i);
        ck_assert_msg(srv_reason(&srv, why, sizeof(why), ANSWER_MS) == 0,
                      "bad control record %d: the server told no reason (%s)", i, why);
        snprintf(want, sizeof(want), "%d %s", ECONNRESET, rule[i]);
        ck_assert_msg(!strncmp(why, want, strlen(want)),
                      "bad control record %d: reason '%s', want '%s...'", i, why, want);
        raw_close(&p);
    }
    expect_alive(SOCK_SEQPACKET, "malformed control records");
    stop();
}
END_TEST

START_TEST(half_frame_and_silence)
{
    struct raw_peer p;
    struct tcp_wire_hdr h;
    int silent;

    start(SOCK_SEQPACKET, 0, 0);
    /* a TCP connection that says nothing */
    silent = raw_tcp_connect(srv.port);
    ck_assert_int_ge(silent, 0);
    /* an established peer that sends 13 bytes of a header and stops */
    open_peer(&p, SEQ);
    memset(&h, 0, sizeof(h));
    h.magic = htobe32(TCP_WIRE_MAGIC);
    h.version = TCP_WIRE_VERSION;
    h.type = TCP_WIRE_SEND;
    ck_assert_int_eq(raw_write_all(p.fd, &h, 13), 0);
    expect_alive(SOCK_SEQPACKET, "a half frame and a silent socket (both still open)");
    raw_close(&p);
    close(silent);
    expect_alive(SOCK_SEQPACKET, "the silent peers left");
    stop();
}
END_TEST

START_TEST(bad_keys_and_ranges)
{
    struct raw_peer p;

    start(SOCK_SEQPACKET, 0, 0);
    open_peer(&p, SEQ);
    expect_refused(try_write(&p, ring_addr(&p), 0xdeadbeefu, 64), "a made-up key");
    raw_close(&p);
    open_peer(&p, SEQ);
    expect_refused(try_write(&p, UINT64_MAX - 15, p.ring_rkey, 64), "a wrapping range");
    raw_close(&p);
    open_peer(&p, SEQ);
    expect_refused(try_write(&p, ring_addr(&p) + ring_size(&p) - 8, p.ring_rkey, 64),
                   "a range past the ring's end");
    raw_close(&p);
    open_peer(&p, SEQ);
    expect_refused(try_read(&p, ring_addr(&p) - 64, p.ring_rkey, 128),
                   "a READ starting before the ring");
    raw_close(&p);
    expect_alive(SOCK_SEQPACKET, "bad keys and ranges");
    stop();
}
END_TEST

/* ---- bad peers (issue 13) ---- */

/* A peer that completes the handshake and then goes silent, its TCP connection open
 * (half-open: the process or its host is gone, nothing resets): it acknowledges
 * nothing, not even keepalive probes. The server declares it dead after
 * EXS_KEEPALIVE_PROBES unanswered intervals and drops the connection (which the peer
 * finds ended once it reads again). With keepalive off the same peer is kept: the
 * drop is keepalive's doing. */
START_TEST(half_open_silent)
{
    struct exs_wire_hello h;
    struct raw_peer p;
    double t0;
    int err, ka_on = _i == 0;

    setenv("EXS_KEEPALIVE_INTV_MS", ka_on ? "100" : "0", 1);
    setenv("EXS_KEEPALIVE_PROBES", "3", 1);
    start(SOCK_SEQPACKET, 0, 0);
    unsetenv("EXS_KEEPALIVE_INTV_MS");
    unsetenv("EXS_KEEPALIVE_PROBES");
    raw_hello_default(&h, SEQ);
    err = raw_open(&p, srv.port, &h, ANSWER_MS);
    ck_assert_msg(err == 0, "handshake of the raw peer failed: %s", strerror(-err));
    /* silent: nothing read, nothing acknowledged, for 20 intervals */
    usleep(2000 * 1000);
    t0 = raw_now_ms();
    while (!p.closed && raw_now_ms() < t0 + (ka_on ? 10000 : 1000))
        raw_pump(&p, 100);
    if (ka_on)
        ck_assert_msg(p.closed, "the server still keeps a peer that answered nothing for 2 s "
                                "(keepalive 100 ms x 3)");
    else
        ck_assert_msg(!p.closed, "without keepalive the server dropped a silent peer");
    raw_close(&p);
    expect_alive(SOCK_SEQPACKET, "a silent half-open peer");
    stop();
}
END_TEST

/* A peer that takes the server's messages (its NIC acknowledges them, and every
 * keepalive probe) but never returns a credit: the server's echoes beyond the credits
 * of the peer's hello wait forever. After EXS_SEND_TIMEOUT_MS without progress the
 * server resets that connection (ETIMEDOUT) and goes on serving others. */
START_TEST(credits_withheld)
{
    static const char msg[64] = "a message the server echoes; its echo needs a credit from us..";
    uint32_t psn, imm = exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0);
    struct exs_wire_hello h;
    struct raw_peer p;
    double t0, dt;
    int err;

    setenv("EXS_SEND_TIMEOUT_MS", "500", 1);
    setenv("EXS_KEEPALIVE_INTV_MS", "100", 1);
    start(SOCK_SEQPACKET, 0, 0);
    unsetenv("EXS_SEND_TIMEOUT_MS");
    unsetenv("EXS_KEEPALIVE_INTV_MS");
    raw_hello_default(&h, SEQ);
    h.credits = htobe16(4); /* the server may send us 4 messages until we return credits */
    err = raw_open(&p, srv.port, &h, ANSWER_MS);
    ck_assert_msg(err == 0, "handshake of the raw peer failed: %s", strerror(-err));
    ck_assert_msg(raw_wait_ring(&p, ANSWER_MS) == 0, "the server's ring key never came");
    /* 10 messages (the server granted 64 credits): 10 echoes, 4 of which can go */
    for (uint32_t i = 0; i < 10; i++) {
        ck_assert_int_eq(raw_write(&p, ring_addr(&p) + i * sizeof(msg), p.ring_rkey, 1, imm, msg,
                                   sizeof(msg), &psn),
                         0);
        ck_assert_int_eq(raw_wait_psn(&p, psn, ANSWER_MS), 0);
    }
    t0 = raw_now_ms();
    while (!p.closed && raw_now_ms() < t0 + 20000)
        raw_pump(&p, 100); /* acknowledges everything the server sends, returns no credit */
    dt = raw_now_ms() - t0;
    ck_assert_msg(p.closed, "the server kept the connection without credits for %.0f ms", dt);
    /* the credits also pay for the server's control records (RING, ACK) */
    ck_assert_msg(p.data_msgs < 4, "%u echoes arrived with 4 credits", p.data_msgs);
    /* it waited for credits that never came, then gave up (not a protocol error) */
    ck_assert_msg(dt >= 400, "the server ended the connection after %.0f ms, before its deadline",
                  dt);
    printf("credits_withheld: %u of 10 echoes came, then the server reset the connection "
           "%.0f ms after the last message (EXS_SEND_TIMEOUT_MS 500)\n",
           p.data_msgs, dt);
    fflush(stdout);
    raw_close(&p);
    expect_alive(SOCK_SEQPACKET, "a peer withholding credits");
    stop();
}
END_TEST

/* ---- a hostile acceptor (issue 13): the library connects to a raw peer ---- */

#define HACC_MS 30000 /* the connect's outcome must come within this (generous) */

struct hacc {
    int lfd, fd, err;
};

/* The hostile acceptor: CONN_ACCEPT with a good hello, then at once a SEND with an unknown
 * record; the connection is then left open and silent. */
static void *hacc_main(void *arg)
{
    struct hacc *a = arg;
    struct exs_wire_hello h;
    struct exs_wire_ctrl_hdr bad = {.type = 42, .len = htobe16(sizeof(bad))};

    raw_hello_default(&h, STR);
    a->fd = raw_accept_then_send(a->lfd, &h, &bad, sizeof(bad), HACC_MS);
    a->err = a->fd < 0 ? a->fd : 0;
    return NULL;
}

/* Wait for an event of type on q until deadline: its errno, or ETIMEDOUT. */
static int hacc_wait(exs_qhandle_t q, int type, double deadline)
{
    exs_event_t ev;

    for (;;) {
        double left = deadline - raw_now_ms();
        struct timespec ts;

        if (left <= 0)
            return ETIMEDOUT;
        ts.tv_sec = (time_t)(left / 1000);
        ts.tv_nsec = (long)((left - (double)ts.tv_sec * 1000) * 1e6);
        if (exs_qdequeue(q, &ev, 1, &ts) == 1 && ev.exs_evt_type == type)
            return ev.exs_evt_errno;
    }
}

/* An acceptor that breaks the protocol in its first SEND, which the connector's provider
 * delivers together with the acceptance (so the record is usually handled before the
 * ESTABLISHED event): exs_connect ends with ECONNRESET, asynchronously (_i 0) and
 * synchronously (_i 1). Where ESTABLISHED was handled first, the connect succeeds and the
 * connection is reset: a receive ends with ECONNRESET. Either way nothing hangs (the
 * library used to leave such a connect pending forever). */
START_TEST(acceptor_breaks_protocol_early)
{
    int sync = _i, port = 0, fd, err;
    struct hacc a = {.fd = -1};
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    exs_qhandle_t q = EXS_QHANDLE_INVALID;
    pthread_t th;
    char b[16];

    a.lfd = raw_listen(&port);
    ck_assert_int_ge(a.lfd, 0);
    sin.sin_port = htons((uint16_t)port);
    setenv("EXS_PROVIDER", "tcp", 1);
    ck_assert_int_ge(exs_init(EXS_VERSION), 0);
    ck_assert_int_eq(pthread_create(&th, NULL, hacc_main, &a), 0);
    fd = exs_socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    if (sync) {
        err = exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, NULL) < 0 ? errno : 0;
    } else {
        q = exs_qcreate(16);
        ck_assert(q != EXS_QHANDLE_INVALID);
        ck_assert_int_eq(exs_connect(fd, (struct sockaddr *)&sin, sizeof(sin), q, NULL), 0);
        err = hacc_wait(q, EXS_EVT_CONNECT, raw_now_ms() + HACC_MS);
    }
    pthread_join(th, NULL);
    ck_assert_msg(a.err == 0, "the raw acceptor failed: %s", strerror(-a.err));
    if (err == 0) {
        /* ESTABLISHED came first: the record then resets the connection */
        if (sync) {
            err = exs_recv(fd, b, sizeof(b), 0, q, NULL, EXS_MHANDLE_UNREGISTERED) < 0 ? errno : 0;
        } else {
            ck_assert_int_eq(exs_recv(fd, b, sizeof(b), 0, q, NULL, EXS_MHANDLE_UNREGISTERED), 0);
            err = hacc_wait(q, EXS_EVT_RECV, raw_now_ms() + HACC_MS);
        }
        ck_assert_msg(err == ECONNRESET, "connected, then the receive ended with %s",
                      strerror(err));
        printf("acceptor_breaks_protocol_early (%s): ESTABLISHED handled first, then reset\n",
               sync ? "sync" : "async");
    } else {
        ck_assert_msg(err == ECONNRESET, "the connect ended with %s, not ECONNRESET",
                      strerror(err));
        printf("acceptor_breaks_protocol_early (%s): the connect failed with ECONNRESET\n",
               sync ? "sync" : "async");
    }
    fflush(stdout);
    ck_assert_int_eq(exs_close(fd, EXS_QHANDLE_INVALID, NULL), 0);
    if (!sync)
        exs_qdelete(q);
    exs_fini();
    close(a.fd);
    close(a.lfd);
}
END_TEST

/* ---- a hostile connector (issue 13): the passive side of the early-record case ---- */

#define HCON_N 140 /* connections: more than the server's backlog (128) */

/* Descriptors the server process holds now. */
static int srv_fds(void)
{
    char path[64];
    struct dirent *d;
    DIR *dir;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)srv.pid);
    dir = opendir(path);
    ck_assert_msg(dir != NULL, "%s: %s", path, strerror(errno));
    while ((d = readdir(dir)))
        n += d->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* A raw connector writes its hello and a SEND with an unknown record in one write, before
 * the server's listener has even seen the request, HCON_N times in a row (more than the
 * listener's backlog). On tcp the server's progress handles ESTABLISHED before it reads
 * the record (one thread reads, only in its turns: the record is read in the next one), so
 * each embryo is offered to exs_accept and then reset (the unit test
 * proto_hostile/hs_record_before_established covers the other order, where the record's
 * completion is handled first, on the mock). Each time: the connection is accepted (a
 * backlog slot left behind by an earlier one would make the listener refuse it), the
 * server ends it within the bound, and afterwards the server still serves a good client
 * and holds no more descriptors than before (nothing leaked). _i: SEQPACKET, STREAM. */
START_TEST(connector_breaks_protocol_early)
{
    int type = _i ? SOCK_STREAM : SOCK_SEQPACKET;
    struct exs_wire_ctrl_hdr bad = {.type = 42, .len = htobe16(sizeof(bad))};
    struct exs_wire_hello h;
    double t0;
    int fds0, fds;

    start(type, 0, 0);
    expect_alive(type, "the start"); /* the server's lazily made objects exist now */
    fds0 = srv_fds();
    raw_hello_default(&h, _i ? STR : SEQ);
    for (int i = 0; i < HCON_N; i++) {
        struct raw_peer p;
        int err = raw_connect_then_send(&p, srv.port, &h, &bad, sizeof(bad), ANSWER_MS);

        ck_assert_msg(err == 0, "hostile connector %d: %s%s", i, strerror(-err),
                      err == -ECONNREFUSED ? " (a backlog slot leaked?)" : "");
        t0 = raw_now_ms();
        while (!p.closed && raw_now_ms() - t0 < ECHO_MS)
            raw_pump(&p, 100);
        ck_assert_msg(p.closed,
                      "hostile connector %d: the server did not end the connection "
                      "within %d ms",
                      i, ECHO_MS);
        raw_close(&p);
    }
    expect_alive(type, "hostile connectors");
    /* the server closes what it accepted as the resets reach it: bounded, not timed */
    t0 = raw_now_ms();
    while ((fds = srv_fds()) > fds0 && raw_now_ms() - t0 < ECHO_MS)
        usleep(10 * 1000);
    ck_assert_msg(fds <= fds0, "the server holds %d descriptors, %d before the attack", fds, fds0);
    printf("connector_breaks_protocol_early (%s): %d connections accepted and reset, "
           "%d descriptors before and after\n",
           _i ? "stream" : "seqpacket", HCON_N, fds0);
    fflush(stdout);
    stop();
}
END_TEST

/* ---- resume takeover (issue 24, 1): spec/protocol.md §9.2, Proof ---- */

static void start_resumable(void)
{
    struct srv_opts o = {.sock_type = SOCK_SEQPACKET, .resumable = 1};

    ck_assert_int_eq(srv_start(&srv, &o), 0);
}

static unsigned echo_slot; /* the real client's messages so far: its next ring slot */

/* The real client of a resumable server: a raw peer with feature bit 7 that learns the
 * server's key K_B from its SESSION record and sends its own K_A after its RING, as the
 * library's active side does. */
static void open_resumable(struct raw_peer *p, uint8_t ka[EXS_WIRE_SESSION_KEY_LEN])
{
    struct exs_wire_session ss = {
        .hdr = {.type = EXS_CTRL_SESSION, .len = htobe16(EXS_WIRE_SESSION_LEN)},
    };
    struct exs_wire_hello h;
    double deadline = raw_now_ms() + ANSWER_MS;
    uint32_t psn;

    raw_hello_default(&h, SEQ);
    h.features |= htobe16(EXS_WIRE_FEAT_RESUMABLE);
    echo_slot = 0;
    ck_assert_int_eq(raw_open(p, srv.port, &h, ANSWER_MS), 0);
    ck_assert_int_eq(raw_wait_ring(p, ANSWER_MS), 0);
    while (!p->sess_keyed && !p->closed && raw_now_ms() < deadline)
        raw_pump(p, 50);
    ck_assert_msg(p->sess_keyed, "the resumable server sent no SESSION key");
    for (unsigned i = 0; i < EXS_WIRE_SESSION_KEY_LEN; i++)
        ka[i] = (uint8_t)(0x40 + i * 7);
    memcpy(ss.key, ka, EXS_WIRE_SESSION_KEY_LEN);
    ck_assert_int_eq(raw_send_ctrl(p, &ss, sizeof(ss), &psn), 0);
    ck_assert_int_eq(raw_wait_psn(p, psn, ANSWER_MS), 0);
}

/* Message i of the real client (64 bytes, eager into the server's next ring slot) comes
 * back whole: the session serves. */
static void echo_msg(struct raw_peer *p, unsigned i)
{
    uint32_t psn, imm = exs_imm_make(EXS_IMM_INDIRECT, EXS_IMM_EOM, 0, 0);
    char msg[64];

    snprintf(msg, sizeof(msg), "message %u of the real peer, which must come back unchanged..", i);
    ck_assert_int_eq(raw_write(p, ring_addr(p) + 64u * echo_slot++, p->ring_rkey, 1, imm, msg,
                               sizeof(msg), &psn),
                     0);
    ck_assert_int_eq(raw_wait_psn(p, psn, ANSWER_MS), 0);
    expect_echo(p, msg, sizeof(msg));
}

/* A resume hello for token with nonce_A: the library's hello form, flag RESUME. */
static void resume_hello(struct exs_wire_resume_req *q, uint64_t token, uint8_t nonce)
{
    memset(q, 0, sizeof(*q));
    raw_hello_default(&q->hello, SEQ);
    q->hello.features |= htobe16(EXS_WIRE_FEAT_RESUMABLE);
    q->hello.hflags = EXS_WIRE_HELLO_F_RESUME;
    q->token = htobe64(token);
    memset(q->nonce_a, nonce, sizeof(q->nonce_a));
}

/* HMAC-SHA256(K_A || K_B, label || nonce_A || nonce_B), as §9.2 defines the proofs. */
static void resume_proof(const uint8_t *ka, const uint8_t *kb, uint8_t label, const uint8_t *na,
                         const uint8_t *nb, uint8_t out[EXS_SHA256_LEN])
{
    uint8_t key[2 * EXS_WIRE_SESSION_KEY_LEN];
    const void *parts[3] = {&label, na, nb};
    size_t lens[3] = {1, EXS_WIRE_NONCE_LEN, EXS_WIRE_NONCE_LEN};

    memcpy(key, ka, EXS_WIRE_SESSION_KEY_LEN);
    memcpy(key + EXS_WIRE_SESSION_KEY_LEN, kb, EXS_WIRE_SESSION_KEY_LEN);
    exs__hmac_sha256(key, sizeof(key), 3, parts, lens, out);
}

/* The server ends connection p (a refused trial) within ANSWER_MS. */
static void expect_ended(struct raw_peer *p, const char *what)
{
    double deadline = raw_now_ms() + ANSWER_MS;

    while (!p->closed && raw_now_ms() < deadline)
        raw_pump(p, 100);
    ck_assert_msg(p->closed, "%s: the server kept the connection", what);
}

/* Against a resumable server whose real client is connected and transferring:
 *  _i 0: another TCP connection presents the live session's token (what an observer of a
 *        resume hello learns; here computed from K_B as the hello carries it) on the
 *        fallback port, with an AUTH it cannot compute;
 *  _i 1: a capture replayed: the real client's own resume hello and the AUTH it made for
 *        that exchange's nonce_B (an exchange abandoned before the AUTH went, so the
 *        session is still resumable), sent again on a new connection.
 * Each is refused (that connection ended) and the real client's session goes on
 * untouched: not disconnected, its messages echoed whole before and after. */
START_TEST(resume_takeover)
{
    uint8_t ka[EXS_WIRE_SESSION_KEY_LEN], mac[EXS_SHA256_LEN];
    struct exs_wire_auth auth = {.hdr = {.type = EXS_CTRL_AUTH, .len = htobe16(EXS_WIRE_AUTH_LEN)}};
    struct exs_wire_resume_req q;
    struct exs_wire_resume_acc acc;
    struct raw_peer a, b;
    uint32_t psn;

    start_resumable();
    open_resumable(&a, ka);
    echo_msg(&a, 0);
    if (_i == 0) {
        resume_hello(&q, a.sess_token, 0x33);
        ck_assert_int_eq(raw_open_pd(&b, srv.fb_port, &q, sizeof(q), ANSWER_MS), 0);
        ck_assert_uint_ge(b.acc_pd_len, sizeof(acc));
        memset(auth.mac, 0x5c, sizeof(auth.mac)); /* no keys: a guess */
    } else {
        struct raw_peer c;

        /* the real client's exchange, seen on the wire: hello, accept, and its AUTH */
        resume_hello(&q, a.sess_token, 0x44);
        ck_assert_int_eq(raw_open_pd(&c, srv.fb_port, &q, sizeof(q), ANSWER_MS), 0);
        ck_assert_uint_ge(c.acc_pd_len, sizeof(acc));
        memcpy(&acc, c.acc_pd, sizeof(acc));
        /* the server proved its keys: MAC_B checks out for the real client */
        resume_proof(ka, a.sess_key, EXS_WIRE_AUTH_LABEL_B, q.nonce_a, acc.nonce_b, mac);
        ck_assert_int_eq(memcmp(mac, acc.mac_b, sizeof(acc.mac_b)), 0);
        resume_proof(ka, a.sess_key, EXS_WIRE_AUTH_LABEL_A, q.nonce_a, acc.nonce_b, auth.mac);
        raw_close(&c); /* abandoned before the AUTH went */
        echo_msg(&a, 1);
        /* the replay */
        ck_assert_int_eq(raw_open_pd(&b, srv.fb_port, &q, sizeof(q), ANSWER_MS), 0);
        ck_assert_uint_ge(b.acc_pd_len, sizeof(acc));
        ck_assert_msg(memcmp(acc.nonce_b, b.acc_pd + offsetof(struct exs_wire_resume_acc, nonce_b),
                             EXS_WIRE_NONCE_LEN),
                      "the server answered a replayed hello with the same nonce_B");
    }
    ck_assert_int_eq(raw_send_ctrl(&b, &auth, sizeof(auth), &psn), 0);
    expect_ended(&b, _i ? "a replayed resume" : "a resume with the token alone");
    raw_close(&b);
    ck_assert_msg(!a.closed, "the real client's connection was ended");
    echo_msg(&a, 2);
    echo_msg(&a, 3);
    ck_assert_msg(!a.closed, "the real client's connection was ended");
    raw_close(&a);
    expect_alive(SOCK_SEQPACKET, "resume takeover attempts");
    stop();
}
END_TEST

/* ---- memory: EXS_MEM_BUDGET holds against many hostile connections (issue 24) ---- */

#define MEM_BUDGET_MB 256

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* A sanitizer's shadow memory (and AddressSanitizer's quarantine of freed memory) counts in
 * the RSS: it says nothing of the library's here (the refusals and the client served are
 * still checked) */
#define MEM_RSS_COMPARED 0
#else
#define MEM_RSS_COMPARED 1
#endif

/* The server's resident set, KiB (/proc/<pid>/status VmRSS). */
static long srv_rss_kb(void)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)srv.pid);
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* One hostile connection doing what a peer may do to make the server hold memory: fill
 * its ring (every page of it touched), announce messages (never answering their READs)
 * and advertise receives, as many as its credits carry, within the caps of §6. 0 when
 * accepted, -ECONNREFUSED when the server refused it. */
static int mem_hog(struct raw_peer *p)
{
    static uint8_t fill[65536];
    struct exs_wire_hello h;
    uint8_t rec[512];
    uint32_t psn = 0, size;
    uint64_t seq = 0;
    int err;

    raw_hello_default(&h, SEQ);
    err = raw_open(p, srv.port, &h, ANSWER_MS);
    if (err)
        return err;
    p->stall_reads = 1;
    if (raw_wait_ring(p, ANSWER_MS))
        return -ETIMEDOUT;
    size = ring_size(p);
    memset(fill, 0x5A, sizeof(fill));
    for (uint32_t off = 0; off < size; off += sizeof(fill))
        ck_assert_int_eq(raw_write(p, ring_addr(p) + off, p->ring_rkey, 0, 0, fill,
                                   size - off < sizeof(fill) ? size - off : (uint32_t)sizeof(fill),
                                   &psn),
                         0);
    ck_assert_int_eq(raw_wait_psn(p, psn, ANSWER_MS), 0);
    /* 32 SENDs of 16 ANNOUNCEs, 24 of 12 ADVERTs: with the RING record, 57 of the server's
     * 64 receives, so no record waits for a credit back */
    for (int i = 0; i < 32; i++) {
        for (int k = 0; k < 16; k++) {
            struct exs_wire_announce a = {
                .hdr = {.type = EXS_CTRL_ANNOUNCE, .len = htobe16(EXS_WIRE_ANNOUNCE_LEN)},
                .addr = htobe64(0x10000),
                .len = htobe32(1u << 20),
                .rkey = htobe32(0x77),
                .seq = htobe64(seq++)};
            memcpy(rec + k * EXS_WIRE_ANNOUNCE_LEN, &a, sizeof(a));
        }
        ck_assert_int_eq(raw_send_ctrl(p, rec, 16 * EXS_WIRE_ANNOUNCE_LEN, &psn), 0);
    }
    for (int i = 0; i < 24; i++) {
        for (int k = 0; k < 12; k++) {
            struct exs_wire_advert a = {
                .hdr = {.type = EXS_CTRL_ADVERT, .len = htobe16(EXS_WIRE_ADVERT_LEN)},
                .addr = htobe64(0x10000),
                .len = htobe32(1u << 20),
                .rkey = htobe32(0x77),
                .seq = htobe64((uint64_t)(i * 12 + k) + 1),
                .id = htobe32((uint32_t)(i * 12 + k))};
            memcpy(rec + k * EXS_WIRE_ADVERT_LEN, &a, sizeof(a));
        }
        ck_assert_int_eq(raw_send_ctrl(p, rec, 12 * EXS_WIRE_ADVERT_LEN, &psn), 0);
    }
    /* every record taken (a reset, were the server to end it, would do too) */
    ck_assert_int_ne(raw_wait_psn(p, psn, ANSWER_MS), -ETIMEDOUT);
    return 0;
}

/* EXS_MEM_BUDGET=256 MiB: many hostile connections (EXS_HOSTILE_MEM_CONNS, default 300;
 * 1000 in tests/stress/run-full.sh) that fill their rings, announce and advertise keep
 * the server's RSS under its baseline plus the budget: past the budget it refuses them
 * (reason RESOURCES). Once they are gone its RSS comes back near the baseline, and a
 * well-behaved client is served. Without the budget the 300 take 330 MB. */
START_TEST(mem_budget_holds)
{
    const char *env = getenv("EXS_HOSTILE_MEM_CONNS");
    int n = env ? atoi(env) : 300, accepted = 0, refused = 0;
    struct raw_peer **p = calloc((size_t)n, sizeof(*p));
    long base, peak = 0, rss, limit;
    double deadline;

    ck_assert(p != NULL);
    setenv("EXS_MEM_BUDGET", "256m", 1);
    setenv("EXS_KEEPALIVE_INTV_MS", "0", 1); /* the hogs hold on: nothing ends them */
    start(SOCK_SEQPACKET, 0, 1);
    unsetenv("EXS_MEM_BUDGET");
    unsetenv("EXS_KEEPALIVE_INTV_MS");
    expect_alive(SOCK_SEQPACKET, "start"); /* a connection made and gone: the baseline */
    base = srv_rss_kb();
    limit = base + MEM_BUDGET_MB * 1024L;
    for (int i = 0; i < n; i++) {
        int err;

        p[i] = calloc(1, sizeof(*p[i]));
        ck_assert(p[i] != NULL);
        err = mem_hog(p[i]);
        if (err == -ECONNREFUSED)
            refused++;
        else
            ck_assert_msg(err == 0, "hostile connection %d: %s", i, strerror(-err));
        accepted += !err;
        if (err) {
            raw_close(p[i]);
            free(p[i]);
            p[i] = NULL;
        }
        rss = srv_rss_kb();
        peak = rss > peak ? rss : peak;
        ck_assert_msg(!MEM_RSS_COMPARED || rss <= limit,
                      "after %d hostile connections (%d refused) the server's RSS "
                      "is %ld KiB, more than its baseline %ld + %d MiB",
                      i + 1, refused, rss, base, MEM_BUDGET_MB);
    }
    printf("mem_budget_holds: %d hostile connections, %d accepted, %d refused; server RSS "
           "baseline %ld KiB, peak %ld KiB (limit %ld)\n",
           n, accepted, refused, base, peak, limit);
    for (int i = 0; i < n; i++)
        if (p[i]) {
            raw_pump(p[i], 0); /* each answered its READs with nothing: still open */
            raw_close(p[i]);
            free(p[i]);
        }
    free(p);
    /* the closes reach the server: wait for its memory to go back */
    deadline = raw_now_ms() + 30000;
    while (MEM_RSS_COMPARED && srv_rss_kb() > base + 32 * 1024 && raw_now_ms() < deadline)
        usleep(100 * 1000);
    rss = srv_rss_kb();
    printf("mem_budget_holds: server RSS after every hostile connection closed: %ld KiB "
           "(baseline %ld)\n",
           rss, base);
    fflush(stdout);
    if (!MEM_RSS_COMPARED)
        printf("mem_budget_holds: RSS not compared under a sanitizer\n");
    ck_assert_msg(!MEM_RSS_COMPARED || rss <= base + 32 * 1024,
                  "the server kept %ld KiB over its baseline", rss - base);
    ck_assert_msg(n < 250 || refused > 0, "%d connections of 1 MiB rings, none refused", n);
    expect_alive(SOCK_SEQPACKET, "the memory hogs");
    stop();
}
END_TEST

static Suite *hostile_suite(void)
{
    Suite *s = suite_create("hostile");
    TCase *t;

    t = tcase_create("attacks");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, conn_req_then_reset);
    tcase_add_test(t, silent_half_write);
    tcase_add_test(t, isolation_ring_key);
    tcase_add_test(t, isolation_no_forged_delivery);
    tcase_add_test(t, isolation_advert_key);
    tcase_add_test(t, isolation_announce_key);
    tcase_add_test(t, keys_not_guessable);
    tcase_add_test(t, trace_answer_no_host_clock);
    tcase_add_loop_test(t, stream_bad_hello, 0, (int)(sizeof(bad_hellos) / sizeof(bad_hellos[0])));
    tcase_add_test(t, fd_exhaustion_no_spin);
    suite_add_tcase(s, t);

    t = tcase_create("races");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, close_races_dying_connection);
    suite_add_tcase(s, t);

    t = tcase_create("handled");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, malformed_frames);
    tcase_add_test(t, malformed_control_records);
    tcase_add_test(t, half_frame_and_silence);
    tcase_add_test(t, bad_keys_and_ranges);
    suite_add_tcase(s, t);

    t = tcase_create("bad_peers");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, credits_withheld);
    tcase_add_loop_test(t, half_open_silent, 0, 2);
    suite_add_tcase(s, t);

    t = tcase_create("hostile_acceptor");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, acceptor_breaks_protocol_early, 0, 2);
    suite_add_tcase(s, t);

    t = tcase_create("resume");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, resume_takeover, 0, 2);
    suite_add_tcase(s, t);

    t = tcase_create("memory");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, mem_budget_holds);
    suite_add_tcase(s, t);

    t = tcase_create("hostile_connector");
    tcase_set_timeout(t, 180);
    tcase_add_loop_test(t, connector_breaks_protocol_early, 0, 2);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(hostile_suite());
    int failed;

    printf("hostile-peer tests: raw peers against a forked echo server on the tcp provider\n");
    fflush(stdout);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
