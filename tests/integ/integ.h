/* SPDX-License-Identifier: MIT */
/* Shared helpers of the ES-API integration tests: init/teardown, connected pairs, bounded waits,
 * buffers, patterns. */
#ifndef EXS_TESTS_INTEG_H
#define EXS_TESTS_INTEG_H

#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>

#include "exs/api/api.h"

/* The provider under test (main() sets EXS_PROVIDER to it before any test runs). */
extern const char *it_provider;

/* Default bound of every wait for something that should happen promptly: a safety net
 * only (every wait is for a condition), wide enough for a host loaded many times over. */
#define IT_TIMEOUT_MS   30000
/* Default Check timeout of a test case, in seconds. */
#define IT_CASE_TIMEOUT 120

/* The suites (one per test file). */
Suite *integ_seqpacket_suite(void);
Suite *integ_errors_suite(void);
Suite *integ_qdequeue_suite(void);
Suite *integ_sync_suite(void);
Suite *integ_lifecycle_suite(void);
Suite *integ_stream_suite(void);
Suite *integ_robust_suite(void);
Suite *integ_hello_suite(void);
Suite *integ_grant_suite(void);
Suite *integ_progress_suite(void);
Suite *integ_handoff_suite(void);
Suite *integ_keepalive_suite(void);
Suite *integ_fault_suite(void);
Suite *integ_fallback_suite(void);
Suite *integ_ctl_suite(void);
Suite *integ_trace_suite(void);
Suite *integ_kfd_suite(void);
Suite *integ_kfdcache_suite(void);
Suite *integ_unh_suite(void);
Suite *integ_poll_suite(void);
Suite *integ_ring_suite(void);
Suite *integ_msg_suite(void);
Suite *integ_window_suite(void);
Suite *integ_sndbuf_suite(void);
Suite *integ_resume_suite(void);
Suite *integ_resume_ring_suite(void);
Suite *integ_fragread_suite(void);
Suite *integ_backlog_suite(void);
Suite *integ_pv_suite(void);
Suite *integ_fork_suite(void);
Suite *integ_shm_suite(void);
Suite *integ_unsig_suite(void);
Suite *integ_attack_suite(void);
Suite *integ_attack2_suite(void);
Suite *integ_attack26_suite(void);
Suite *integ_hz27_suite(void);
Suite *integ_attack27_suite(void);
Suite *integ_cancel_suite(void);

/* A test case with timeout seconds and the shared teardown it_teardown. */
TCase *it_tcase(const char *name, int timeout_s);

/* Adds to s the test case name (it_tcase) with the NULL-terminated tests, each run
 * loops times (Check's loop index _i from 0; 1 for a plain test). */
void it_suite_add(Suite *s, const char *name, int timeout_s, int loops, const TTest *const *tests);

/* ---- library lifetime ---- */

/* Set an EXS_* tunable for the next it_init(); it_teardown() unsets it again. */
void it_setenv(const char *name, const char *value);
/* exs_init(EXS_VERSION) (asserted), after EXS_PROVIDER was set; no-op when already done. */
void it_init(void);
/* Delete the queues and deregister the buffers the helpers still track (asserting each
 * call succeeds), assert exs__debug_live_objects() == 0, exs_fini(), assert it is still 0,
 * unset the tunables of it_setenv. Does nothing when it_init() was not called (or
 * it_fini() already ran). */
void it_fini(void);
/* The checked teardown of every test case: it_fini(). */
void it_teardown(void);
/* Forget the queues tracked (a test that ended them with exs_fini itself). */
void it_forget_queues(void);

/* ---- time ---- */
double it_now_ms(void);
void it_sleep_ms(int ms);

/* A watchdog for calls that block without a timeout of their own (synchronous calls,
 * exs_qdequeue with timeout NULL): if it_watchdog_stop() is not called within seconds,
 * print what (read at expiry: the caller may keep updating the text) and _exit(99),
 * which Check reports as an early exit. */
void it_watchdog_start(int seconds, const char *what);
/* Restart the watchdog's interval (progress was made). */
void it_watchdog_kick(void);
void it_watchdog_stop(void);

/* ---- queues and events ---- */

/* exs_qcreate(depth), asserted, and tracked (it_fini deletes it if still alive). */
exs_qhandle_t it_qcreate(int depth);
/* Assert no event is left on q (stashed or queued within ms), then exs_qdelete it. */
void it_qdelete_at(exs_qhandle_t q, int ms, const char *file, int line);
#define it_qdelete(q) it_qdelete_at((q), 0, __FILE__, __LINE__)

/* Wait up to ms for the first event of q with this type (any type when type < 0) and fd
 * (any when fd < 0). Events that do not match are stashed (per queue, in arrival order)
 * and are found by later waits first. it_try_event returns 1 or 0 (timeout); it_wait_event
 * fails the test with the caller's file:line on timeout. */
int it_try_event(exs_qhandle_t q, int type, int fd, int ms, exs_event_t *out);
void it_wait_event_at(exs_qhandle_t q, int type, int fd, int ms, exs_event_t *out, const char *file,
                      int line);
#define it_wait_event(q, type, fd, out)                                                            \
    it_wait_event_at((q), (type), (fd), IT_TIMEOUT_MS, (out), __FILE__, __LINE__)
/* A note (printf format) added to the failure messages of the waits below, e.g. the
 * iteration of a loop; it_init clears it. */
void it_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fail when any event shows up on q within ms (stashed ones count). */
void it_expect_no_event_at(exs_qhandle_t q, int ms, const char *file, int line);
#define it_expect_no_event(q, ms) it_expect_no_event_at((q), (ms), __FILE__, __LINE__)

/* Wait for the next event of (q, type, fd) and check: ahandle == ah, errno 0,
 * result == result, and for EXS_EVT_RECV (MSG_TRUNC set) == (trunc != 0).
 * result < -1 means "do not check the result". */
#define IT_ANY_RESULT (-2)
void it_expect_xfer_at(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, ssize_t result,
                       int trunc, exs_event_t *out, const char *file, int line);
#define it_expect_send(q, fd, ah, res)                                                             \
    it_expect_xfer_at((q), EXS_EVT_SEND, (fd), (ah), (res), 0, NULL, __FILE__, __LINE__)
#define it_expect_recv(q, fd, ah, res, trunc)                                                      \
    it_expect_xfer_at((q), EXS_EVT_RECV, (fd), (ah), (res), (trunc), NULL, __FILE__, __LINE__)
/* Wait for the next event of (q, type, fd) and check ahandle and errno (the result too
 * when type is SEND/RECV and err != 0: -1). */
void it_expect_err_at(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, int err,
                      exs_event_t *out, const char *file, int line);
#define it_expect_err(q, type, fd, ah, err)                                                        \
    it_expect_err_at((q), (type), (fd), (ah), (err), NULL, __FILE__, __LINE__)

/* Post one send / receive (flags 0) and assert the call accepted it. */
#define IT_POST_SEND(fd, buf, len, q, ah, mh)                                                      \
    do {                                                                                           \
        int rc_ = exs_send((fd), (buf), (len), 0, (q), (ah), (mh));                                \
        ck_assert_msg(rc_ == 0, "exs_send(fd %d, len %zu, ah %ld) = %d errno %d (%s)", (fd),       \
                      (size_t)(len), IT_AHN(ah), rc_, errno, strerror(errno));                     \
    } while (0)
#define IT_POST_RECV(fd, buf, len, q, ah, mh)                                                      \
    do {                                                                                           \
        int rc_ = exs_recv((fd), (buf), (len), 0, (q), (ah), (mh));                                \
        ck_assert_msg(rc_ == 0, "exs_recv(fd %d, len %zu, ah %ld) = %d errno %d (%s)", (fd),       \
                      (size_t)(len), IT_AHN(ah), rc_, errno, strerror(errno));                     \
    } while (0)

/* Assert that call returns -1 with errno err (and nothing else). */
#define IT_EXPECT_FAIL(call, err)                                                                  \
    do {                                                                                           \
        int rc_, e_;                                                                               \
        errno = 0;                                                                                 \
        rc_ = (call);                                                                              \
        e_ = errno;                                                                                \
        ck_assert_msg(rc_ == -1 && e_ == (err),                                                    \
                      "%s: expected -1 errno %d (%s), got %d errno %d (%s)", #call, (err),         \
                      strerror(err), rc_, e_, strerror(e_));                                       \
    } while (0)
/* Assert that call returns 0. */
#define IT_EXPECT_OK(call)                                                                         \
    do {                                                                                           \
        int rc_, e_;                                                                               \
        errno = 0;                                                                                 \
        rc_ = (call);                                                                              \
        e_ = errno;                                                                                \
        ck_assert_msg(rc_ == 0, "%s: expected 0, got %d errno %d (%s)", #call, rc_, e_,            \
                      strerror(e_));                                                               \
    } while (0)

/* An ahandle from a small integer and back. */
#define IT_AH(n)   ((exs_ahandle_t)(uintptr_t)(n))
#define IT_AHN(ah) ((long)(uintptr_t)(ah))

const char *it_evt_name(int type);

/* ---- sockets and pairs ---- */

/* exs_socket(AF_INET, type, 0), bind it_listen_in() port 0, listen; *addr gets the bound
 * address from exs_getsockname (port != 0). */
int it_listen(int type, struct sockaddr_in *addr);
/* The address it_listen binds: 127.0.0.1, or EXS_TEST_LISTEN_ADDR (across hosts,
 * spec/rxe-vm.md "Two hosts"). */
struct in_addr it_listen_in(void);
/* The address a listener sees this process's connections come from: 127.0.0.1, or across
 * hosts (EXS_TEST_LISTEN_ADDR set) EXS_TEST_ADDR, the host's own. */
struct in_addr it_client_in(void);
/* exs_close(fd, q, ah) and wait for its EXS_EVT_CLOSE (errno 0). */
void it_close_at(int fd, exs_qhandle_t q, const char *file, int line);
#define it_close(fd, q) it_close_at((fd), (q), __FILE__, __LINE__)
/* A sockaddr_in of 127.0.0.1:port where nothing listens (a kernel TCP socket keeps the
 * port bound without listening while *holder stays open; close it afterwards). */
void it_refusing_addr(struct sockaddr_in *addr, int *holder);

struct it_pair {
    int type;                /* SOCK_SEQPACKET or SOCK_STREAM */
    exs_qhandle_t sq;        /* server queue: listener, accepted socket */
    exs_qhandle_t cq;        /* client queue */
    int lfd;                 /* listener */
    int sfd;                 /* the accepted (server) side */
    int cfd;                 /* the connecting (client) side */
    struct sockaddr_in addr; /* the listener's address */
};

/* Queues of depth sdepth / cdepth, a listener, accept + connect (async), both events
 * checked (errno 0, newfd >= 0). */
void it_pair_open_at(struct it_pair *p, int type, int sdepth, int cdepth, const char *file,
                     int line);
#define it_pair_open(p, type, sd, cd) it_pair_open_at((p), (type), (sd), (cd), __FILE__, __LINE__)
/* Close cfd, sfd and lfd (those still >= 0; async, each CLOSE awaited), then delete both
 * queues asserting no stray event is left. */
void it_pair_close_at(struct it_pair *p, const char *file, int line);
#define it_pair_close(p) it_pair_close_at((p), __FILE__, __LINE__)

/* ---- buffers ---- */

#define IT_GUARD      64
#define IT_GUARD_BYTE 0xEE

/* A buffer with IT_GUARD guard bytes on each side; [p, p+len) is registered with
 * exs_mregister(p, len, 0) unless reg == 0 (then mh is EXS_MHANDLE_UNREGISTERED).
 * Data and guards start as IT_GUARD_BYTE. Tracked: it_fini frees what is left. */
struct it_buf {
    uint8_t *base;
    uint8_t *p;
    size_t len;
    exs_mhandle_t mh;
};

struct it_buf *it_buf_new(size_t len, int reg);
/* Deregister (asserted) and free. */
void it_buf_free(struct it_buf *b);
/* exs_sends of fd that ended at their post without an operation (exs_conn.posts_copied,
 * spec/proto-layout.md "A send that ends at its post", "A SEQPACKET send that ends at its
 * post"); *inl_p (when given): fd's provider writes n bytes inline (only then can a
 * SEQPACKET send end at its post). */
uint64_t it_posts_copied(int fd, size_t n, int *inl_p);
/* 1 when both guards still hold IT_GUARD_BYTE. */
int it_buf_guards_ok(const struct it_buf *b);

/* A deterministic pattern: byte i of the pattern of seed depends on (seed, i), so a
 * prefix of a message is the pattern of the same seed. it_check returns the first bad
 * offset or -1. */
void it_fill(void *dst, size_t len, uint32_t seed);
long it_check(const void *src, size_t len, uint32_t seed);
/* 1 when every byte of [p, p+len) equals v. */
int it_all_bytes(const void *p, size_t len, int v);

/* xorshift64* state for seeded random choices. */
uint64_t it_rand(uint64_t *state);

/* ---- process state ---- */

/* Entries of /proc/self/fd and /proc/self/task. */
int it_count_fds(void);
/* A connected pair of kernel TCP sockets over loopback: *a connected, *b accepted;
 * sndbuf / rcvbuf > 0 set SO_SNDBUF on a and SO_RCVBUF on b first. */
void it_tcp_pair(int *a, int *b, int sndbuf, int rcvbuf);
/* The opening of a kernel-socket reset test: it_init, SIGPIPE at its default action (the
 * old one in *old: the test restores it), a queue of depth 8 (returned) and a pair
 * it_tcp_pair(a, b, 4096, 4096). it_tcp_reset(fd): close fd with a reset (RST). */
exs_qhandle_t it_kfd_reset_open(int *a, int *b, struct sigaction *old);
void it_tcp_reset(int fd);
/* Drive q until no kernel-socket state is left (the last event detaches it; the watcher
 * goes shortly after); fails the test when some is left after 10 s. */
void it_kfd_settle(exs_qhandle_t q);

/* The fault provider (exs/prov/fault): it_fault_init is it_init with the fault provider
 * over the one under test (tcp -> fault:tcp); it_fault_teardown (a checked fixture) sets
 * every fault_* tunable back to its default first, so that the next test starts clean
 * even when this one failed half-way; it_fault_set sets one (online), it_fault_set_port
 * aims the faults at connection p. */
void it_fault_init(void);
const char *it_fault_provider(void); /* its name (after it_fault_init) */
void it_fault_params_reset(void);
/* A process counter of the cut-over (set "fallback"; 0 before the first connection). */
uint64_t it_fallback_count(const char *name);
void it_fault_teardown(void);
void it_fault_set(const char *name, const char *value);
void it_fault_set_port(const struct it_pair *p);
int it_count_tasks(void);
/* it_count_tasks() once it equals want, or after 2 s: exited threads linger briefly. */
int it_count_tasks_expect(int want);
/* The system call thread tid of process pid is in (/proc/PID/task/TID/syscall: its
 * number, e.g. SYS_ppoll for a sleeping NOTIFY wait); -1: running in user space, or
 * unreadable. */
long it_thread_syscall(int pid, int tid);
/* Join thread t within ms milliseconds; 1: joined (*ret its value, if ret), 0: still running. */
int it_join_within(pthread_t t, int ms, void **ret);

/* Entry of the exec'd sender of test_eos_peer_process_exit (main.c dispatches to it). */
int it_child_stream_send(int argc, char **argv);
/* Entry of the exec'd accepting peer of test_close_races_peer_death. */
int it_child_accept(int argc, char **argv);
/* Entry of the exec'd echoing peer of the shm switch tests (test_integ_shm.c). */
int it_child_shm_echo(int argc, char **argv);

/* This thread's reads of the clock (integ_clock.c): counted while it_clock_count(1). */
void it_clock_count(int on);
uint64_t it_clock_reads(void);

#endif
