/* SPDX-License-Identifier: MIT */
/* Shared helpers of the provider conformance tests: hosts, connected pairs, waits, buffers. */
#ifndef EXS_TESTS_PROV_TEST_H
#define EXS_TESTS_PROV_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "exs/prov/prov.h"
#include "exs/prov/tcp/tcp_wire.h"

/* The provider under test, set by main() from -p / EXS_PROVIDER. */
extern const char *pt_name;
extern const struct exs_prov_ops *pt_ops;

/* Default wait for anything that should happen promptly: 5 s, scaled like Check's own
 * timeouts by CK_TIMEOUT_MULTIPLIER (make check-rxe sets 10: under TCG on a busy host a
 * completion behind an RNR retry once took longer than 5 s). A guard around a condition,
 * never a wait of its own. */
#define PT_TIMEOUT_MS   (5000 * pt_time_scale())
/* Per-test timeout in seconds (scaled by CK_TIMEOUT_MULTIPLIER). */
#define PT_TEST_TIMEOUT 30

/* --manual: every ctx is opened with EXS_PROV_ATTR_MANUAL_PROGRESS and gets a driver
 * thread (ctx_progress, then a sleep on the event fd); the waits below also call
 * ctx_progress before they arm. */
extern int pt_manual;
/* ctx_open with the mode's flags (and, with --manual, a driver thread); close with
 * pt_ctx_close. */
int pt_ctx_open(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p);
void pt_ctx_close(struct exs_prov_ctx *ctx);
/* Set by a test before it opens hosts: MANUAL_PROGRESS without driver threads; the
 * waits drive every such ctx from the test thread (pt_drive_all). */
extern int pt_self_drive;
/* One ctx_progress on every MANUAL_PROGRESS ctx open; the sum of their results. */
int pt_drive_all(void);
/* n completions of p's b into out with exs__prov_progress_poll (at most max per call), a
 * driven by ctx_progress meanwhile, within PT_TIMEOUT_MS (fails the test otherwise). */
struct pt_pair;
void pt_progress_poll_b(struct pt_pair *p, struct exs_prov_cqe *out, int n, int max);

/* 1 when the provider under test is the tcp one (tcp-only tests check this). */
int pt_is_tcp(void);
/* Print a skip note for the current test and return 1 unless the provider is tcp. */
int pt_skip_unless_tcp(const char *test);
/* As pt_skip_unless_tcp, for tests that look inside the tcp provider's own objects
 * (tcp_ctx_of, its counters): the tcp provider itself, not wrapped (fault:tcp). */
int pt_skip_unless_tcp_itself(const char *test);

/* One "host": a ctx plus stashes for entries drained while waiting for the other kind. */
#define PT_CQE_STASH 8192
#define PT_CM_STASH  32
#define PT_MAX_DISC  16

struct pt_host {
    struct exs_prov_ctx *ctx;
    struct exs_prov_cqe *cqe; /* ring of PT_CQE_STASH */
    unsigned cqe_head, cqe_count;
    struct exs_prov_cm_event cm[PT_CM_STASH];
    unsigned cm_head, cm_count;
    struct exs_prov_ep *disc[PT_MAX_DISC]; /* eps whose DISCONNECTED was seen */
    int ndisc;
};

void pt_host_open(struct pt_host *h);
/* As pt_host_open with attr.cq_size (the provider's initial completion queue size). */
void pt_host_open_cq(struct pt_host *h, uint32_t cq_size);
/* Closes the ctx; every ep, listener and mr of it must already be gone. */
void pt_host_close(struct pt_host *h);

/* Waits. Each loops ctx_poll / ctx_cm_poll, ctx_arm and poll(2) on the event fd,
 * never longer than timeout_ms. The pt_try_ forms return 1 (got one) or 0 (timed
 * out); the PT_WAIT_ forms fail the test with the caller's file:line on timeout. */
int pt_try_cqe(struct pt_host *h, int timeout_ms, struct exs_prov_cqe *cqe);
int pt_try_cm(struct pt_host *h, int timeout_ms, struct exs_prov_cm_event *ev);
void pt_wait_cqe_at(struct pt_host *h, int timeout_ms, struct exs_prov_cqe *cqe, const char *file,
                    int line);
void pt_wait_cm_at(struct pt_host *h, enum exs_prov_cm_event_type type, int timeout_ms,
                   struct exs_prov_cm_event *ev, const char *file, int line);
/* Wait for one completion and check wr_id and status (and opcode when opcode >= 0). */
void pt_expect_cqe_at(struct pt_host *h, int timeout_ms, uint64_t wr_id,
                      enum exs_prov_wc_status status, int opcode, struct exs_prov_cqe *out,
                      const char *file, int line);
/* Wait for the completion of wr_id, keeping any other completion queued in order
 * (for completions of different queues, whose relative order is not defined). */
void pt_expect_wr_at(struct pt_host *h, int timeout_ms, uint64_t wr_id,
                     enum exs_prov_wc_status status, int opcode, struct exs_prov_cqe *out,
                     const char *file, int line);
/* Fail when a completion (or a cm event) arrives within ms. */
void pt_expect_no_cqe_at(struct pt_host *h, int ms, const char *file, int line);
void pt_expect_no_cm_at(struct pt_host *h, int ms, const char *file, int line);

#define pt_wait_cqe(h, ms, c)   pt_wait_cqe_at((h), (ms), (c), __FILE__, __LINE__)
#define pt_wait_cm(h, t, ms, e) pt_wait_cm_at((h), (t), (ms), (e), __FILE__, __LINE__)
#define pt_expect_cqe(h, id, st, op, out)                                                          \
    pt_expect_cqe_at((h), PT_TIMEOUT_MS, (id), (st), (op), (out), __FILE__, __LINE__)
#define pt_expect_cqe_t(h, ms, id, st, op, out)                                                    \
    pt_expect_cqe_at((h), (ms), (id), (st), (op), (out), __FILE__, __LINE__)
#define pt_expect_wr(h, id, st, op, out)                                                           \
    pt_expect_wr_at((h), PT_TIMEOUT_MS, (id), (st), (op), (out), __FILE__, __LINE__)
#define pt_expect_no_cqe(h, ms) pt_expect_no_cqe_at((h), (ms), __FILE__, __LINE__)
#define pt_expect_no_cm(h, ms)  pt_expect_no_cm_at((h), (ms), __FILE__, __LINE__)
/* Opcode argument meaning "do not check". */
#define PT_ANY_OPCODE           (-1)

/* A buffer with guard bytes on both sides; only [p, p+len) is registered. */
#define PT_GUARD      256
#define PT_GUARD_BYTE 0xEE

struct pt_buf {
    struct pt_host *h;
    uint8_t *base; /* allocation: guard | data | guard */
    uint8_t *p;    /* the registered data */
    size_t len;
    struct exs_prov_mr *mr; /* NULL when unregistered */
};

/* Allocate, fill the data with fill and the guards with PT_GUARD_BYTE, and register it
 * with access (EXS_PROV_ACCESS_*; 0 registers with no rights; PT_NOREG leaves it
 * unregistered). */
#define PT_NOREG (1u << 31)
struct pt_buf *pt_buf_new(struct pt_host *h, size_t len, unsigned access, int fill);
void pt_buf_free(struct pt_buf *b);
/* 1 when both guards still hold PT_GUARD_BYTE. */
int pt_buf_guards_ok(const struct pt_buf *b);
/* Fill data with a pattern derived from seed; check it (returns the first bad offset or -1). */
void pt_pattern(void *dst, size_t len, uint32_t seed);
long pt_pattern_check(const void *src, size_t len, uint32_t seed);
/* 1 when every byte of [p, p+len) equals v. */
int pt_all_bytes(const void *p, size_t len, int v);

/* Two hosts: a connects (active), b listens (passive) on 127.0.0.1 port 0. */
#define PT_MAX_BUFS 32

struct pt_pair {
    struct pt_host a, b;
    struct exs_prov_listener *lis;
    struct sockaddr_storage addr; /* the listener's address */
    socklen_t addrlen;
    struct exs_prov_ep *ea, *eb;
    struct pt_buf *bufs[PT_MAX_BUFS];
    int nbufs;
    int a_up, b_up; /* ea / eb were established (close waits for DISCONNECTED) */
};

/* Defaults: 64 send/recv WRs, 64 B inline, rnr_retry 7 (forever). */
struct exs_prov_ep_attr pt_default_attr(void);
/* Open both hosts, the listener, and create ea / eb (not connected). NULL attrs = default. */
void pt_pair_open(struct pt_pair *p, const struct exs_prov_ep_attr *attr_a,
                  const struct exs_prov_ep_attr *attr_b);
/* Connect ea to the listener, accept onto eb, wait for ESTABLISHED on both. */
void pt_pair_connect(struct pt_pair *p);
/* pt_pair_open + pt_pair_connect. */
void pt_pair_setup(struct pt_pair *p, const struct exs_prov_ep_attr *attr_a,
                   const struct exs_prov_ep_attr *attr_b);
/* A buffer owned by the pair (freed by pt_pair_close). side: 'a' or 'b'. */
struct pt_buf *pt_pair_buf(struct pt_pair *p, char side, size_t len, unsigned access, int fill);
/* Disconnect, wait (bounded) for DISCONNECTED, drain, destroy eps and the listener,
 * deregister and free the buffers, close both ctxs. */
void pt_pair_close(struct pt_pair *p);

/* Fork a peer process (before this one has threads of its own): child(rfd) runs there and
 * never returns; *wfd is the pipe's writing end, to pass it a listener's address with
 * pt_tell_addr (pt_read_addr in the child: 0, or -1 when it did not come whole). */
pid_t pt_fork_peer(void (*child)(int rfd), int *wfd);
void pt_tell_addr(int wfd, const struct sockaddr_storage *ss, socklen_t len);
int pt_read_addr(int rfd, struct sockaddr_storage *ss, socklen_t *len);
/* Bind 127.0.0.1 port 0 with a listener of h. */
struct exs_prov_listener *pt_listen(struct pt_host *h, struct sockaddr_storage *addr,
                                    socklen_t *addrlen);
/* Tear down one ep cleanly: disconnect, wait (bounded) for DISCONNECTED, drain, destroy. */
void pt_ep_close(struct pt_host *h, struct exs_prov_ep *ep);

/* Work request shorthands; they return the provider's return code. */
int pt_post_recv(struct exs_prov_ep *ep, uint64_t wr_id, const struct pt_buf *b, size_t off,
                 uint32_t len);
int pt_post_send(struct exs_prov_ep *ep, uint64_t wr_id, enum exs_prov_wr_opcode opcode,
                 unsigned flags, const struct pt_buf *b, size_t off, uint32_t len, uint32_t imm,
                 uint64_t remote_addr, uint32_t rkey);
/* Remote address of b->p + off. */
uint64_t pt_raddr(const struct pt_buf *b, size_t off);

/* ---- raw peers (prov_raw.c; tcp-only tests): sockets speaking tcp_wire.h by hand ---- */
/* A header in network order. */
struct tcp_wire_hdr pt_raw_hdr(uint8_t type, uint8_t flags, uint32_t len, uint32_t psn,
                               uint64_t raddr, uint32_t rkey, uint32_t imm);
/* A TCP connection to p's listener (TCP_NODELAY). */
int pt_raw_connect(const struct pt_pair *p);
/* Write all of buf; 0, or -1 when the provider already closed the socket. */
int pt_raw_send(int fd, const void *buf, size_t len);
/* Read exactly len bytes, waiting at most ms for each piece (a bound on a stall, not on
 * the whole read: many MiB take what they take on a loaded machine); 0 ok, -1 closed /
 * stalled. */
int pt_raw_recv(int fd, void *buf, size_t len, int ms);
/* 1 when the peer closed (EOF or reset) within ms, reading and discarding anything else. */
int pt_raw_closed_within(int fd, int ms);
/* As pt_raw_closed_within: the errno of a reset (ECONNRESET), 0 for an orderly end (EOF),
 * -1 when fd is still open after ms. */
int pt_raw_end_within(int fd, int ms);
/* Complete a handshake (CONN_REQ, rnr_retry 7, no private data) from a raw socket and
 * accept it onto p->eb; returns the socket, eb is CONNECTED. */
int pt_raw_establish(struct pt_pair *p);

/* Bytes the tcp provider's receivers read so far (counter prov.tcp bytes_rx, headers
 * included, every ctx; fault:tcp counts its inner tcp). */
uint64_t pt_raw_rx_bytes(void);
/* Wait (PT_TIMEOUT_MS, else fail) until the tcp provider read n bytes more than base
 * (pt_raw_rx_bytes), then make h's ctx run a command (a listen and its destroy): a
 * command holds the ctx's NIC role (exs/prov/tcp/tcp.h), so every turn that read those
 * bytes is over, and what it placed (the payload of a WRITE, which has no completion at
 * the target) is in memory and ordered before the caller's reads of it. */
void pt_raw_rx_settle(struct pt_host *h, uint64_t base, uint64_t n);

/* Milliseconds on the monotonic clock. */
double pt_now_ms(void);
/* CK_TIMEOUT_MULTIPLIER (a positive integer), 1 when unset or malformed */
int pt_time_scale(void);
void pt_sleep_ms(int ms);

/* The suites (one per file). */
Suite *prov_basic_suite(void);
Suite *prov_close_suite(void);
Suite *prov_order_suite(void);
Suite *prov_attack26_suite(void);
Suite *prov_attack26b_suite(void);
Suite *prov_attack27_suite(void);
Suite *prov_keymemo_suite(void);
Suite *prov_rq_suite(void);
Suite *prov_rnr_suite(void);
Suite *prov_access_suite(void);
Suite *prov_read_suite(void);
Suite *prov_flush_suite(void);
Suite *prov_cm_suite(void);
Suite *prov_emu_suite(void);
Suite *prov_fault_suite(void);
Suite *prov_lowat_suite(void);
Suite *prov_hostile_suite(void);
Suite *prov_mem_suite(void);
Suite *prov_gone_suite(void);
Suite *prov_select_suite(void);
Suite *prov_grant_suite(void);
Suite *prov_req_suite(void);
Suite *prov_cq_suite(void);
Suite *prov_defer_suite(void);
Suite *prov_limits_suite(void);
Suite *prov_keep_suite(void);
Suite *prov_progress_suite(void);
Suite *prov_shm_suite(void);
Suite *prov_fence28_suite(void);

/* A TCase with the per-test timeout applied. */
TCase *pt_tcase(const char *name);

#endif
