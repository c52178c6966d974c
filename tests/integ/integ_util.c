/* SPDX-License-Identifier: MIT */
/* Helpers of the ES-API integration tests: lifetime, bounded waits, pairs, buffers, patterns. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/proto/proto.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "tests/integ/integ.h"

const char *it_provider = "tcp";

/* ---- test cases and library lifetime ---- */

#define IT_MAX_ENV   16
#define IT_MAX_QUEUE 64
#define IT_MAX_BUF   512
#define IT_STASH     4096

static int it_inited;
static char it_ctx[200]; /* it_context() */
static char *it_envs[IT_MAX_ENV];
static int it_nenv;

struct it_stash {
    exs_qhandle_t q;
    int used;
    exs_event_t *ev; /* IT_STASH slots, a ring */
    unsigned head, count;
};

static struct it_stash it_queues[IT_MAX_QUEUE];
static struct it_buf *it_bufs[IT_MAX_BUF];

TCase *it_tcase(const char *name, int timeout_s)
{
    TCase *tc = tcase_create(name);

    tcase_set_timeout(tc, timeout_s);
    tcase_add_checked_fixture(tc, NULL, it_teardown);
    return tc;
}

void it_suite_add(Suite *s, const char *name, int timeout_s, int loops, const TTest *const *tests)
{
    TCase *tc = it_tcase(name, timeout_s);

    for (; *tests; tests++)
        tcase_add_loop_test(tc, *tests, 0, loops);
    suite_add_tcase(s, tc);
}

void it_setenv(const char *name, const char *value)
{
    ck_assert_msg(!it_inited, "it_setenv(%s) after it_init: exs_init reads tunables", name);
    ck_assert_int_lt(it_nenv, IT_MAX_ENV);
    ck_assert_int_eq(setenv(name, value, 1), 0);
    it_envs[it_nenv++] = strdup(name);
}

void it_init(void)
{
    exs_version_t v;

    if (it_inited)
        return;
    it_ctx[0] = 0;
    ck_assert_int_eq(setenv("EXS_PROVIDER", it_provider, 1), 0);
    errno = 0;
    v = exs_init(EXS_VERSION);
    ck_assert_msg(v == EXS_VERSION, "exs_init(EXS_VERSION) returned %d (errno %d %s), provider %s",
                  v, errno, strerror(errno), it_provider);
    it_inited = 1;
}

static void stash_forget(struct it_stash *s)
{
    free(s->ev);
    memset(s, 0, sizeof(*s));
}

/* Live objects right now; when not 0, how it evolves over one second (for the message). */
static void check_live(const char *when)
{
    int live = exs__debug_live_objects();
    int later = live;
    double t0 = it_now_ms(), t = t0;

    if (live == 0)
        return;
    while (later != 0 && t - t0 < 1000) {
        it_sleep_ms(10);
        later = exs__debug_live_objects();
        t = it_now_ms();
    }
    ck_abort_msg("exs__debug_live_objects() == %d %s (expected 0; %s after %.0f ms)", live, when,
                 later == 0 ? "it reached 0" : "still not 0", t - t0);
}

/* Receiver-not-ready never happens (spec/protocol.md §3.1): the tcp provider never held
 * a message for want of a receive, and no conn saw an RNR completion other than those the
 * fault provider injected (its error completions, "prov.fault" wc), in the whole test. */
static void it_check_no_rnr(void)
{
    static const char *const rnr[][2] = {{"prov.tcp", "rnr_waits"}, {"prov.tcp", "rnr_naks"}};
    uint64_t v = 0, injected = 0;

    for (size_t i = 0; i < sizeof(rnr) / sizeof(rnr[0]); i++) {
        v = 0;
        if (exs__counters_lookup(rnr[i][0], rnr[i][1], &v) == 0)
            ck_assert_msg(v == 0, "teardown: counter %s %s = %llu (receiver not ready)", rnr[i][0],
                          rnr[i][1], (unsigned long long)v);
    }
    v = 0;
    exs__counters_lookup("prov.fault", "wc", &injected);
    if (exs__counters_lookup("proto", "rnr_events", &v) == 0)
        ck_assert_msg(v <= injected,
                      "teardown: counter proto rnr_events = %llu, %llu error completions "
                      "injected (receiver not ready)",
                      (unsigned long long)v, (unsigned long long)injected);
}

void it_fini(void)
{
    if (!it_inited)
        return;
    for (int i = 0; i < IT_MAX_QUEUE; i++) {
        if (!it_queues[i].used)
            continue;
        exs_qhandle_t q = it_queues[i].q;
        int rc = exs_qdelete(q);

        ck_assert_msg(rc == 0, "teardown: exs_qdelete(%d) = %d errno %d (%s)", q, rc, errno,
                      strerror(errno));
        stash_forget(&it_queues[i]);
    }
    for (int i = 0; i < IT_MAX_BUF; i++) {
        if (it_bufs[i])
            it_buf_free(it_bufs[i]);
    }
    check_live("after the test's cleanup, before exs_fini");
    it_check_no_rnr();
    exs_fini();
    it_inited = 0;
    ck_assert_msg(exs__debug_live_objects() == 0, "exs__debug_live_objects() == %d after exs_fini",
                  exs__debug_live_objects());
    for (int i = 0; i < it_nenv; i++) {
        unsetenv(it_envs[i]);
        free(it_envs[i]);
        it_envs[i] = NULL;
    }
    it_nenv = 0;
}

void it_forget_queues(void)
{
    for (int i = 0; i < IT_MAX_QUEUE; i++)
        if (it_queues[i].used)
            stash_forget(&it_queues[i]);
}

void it_teardown(void)
{
    it_fini();
}

/* ---- time ---- */

double it_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void it_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- watchdog ---- */

static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static pthread_t wd_thread;
static int wd_running, wd_stop, wd_seconds;
static double wd_deadline; /* it_now_ms() */
static const char *wd_what;

/* Every thread's stack on stderr, by gdb when it is installed (EXS_TEST_WATCHDOG_GDB=0:
 * never): what a stall blocked on, from a run that cannot be repeated at will. At most
 * 60 s; a run without gdb says so. */
static void wd_dump_stacks(void)
{
    const char *env = getenv("EXS_TEST_WATCHDOG_GDB");
    char pid[24];
    pid_t child;
    int status;

    if (env && strcmp(env, "0") == 0)
        return;
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* Yama: let gdb attach */
    fflush(stderr);
    child = fork();
    if (child == 0) {
        dup2(STDERR_FILENO, STDOUT_FILENO);
        execlp("gdb", "gdb", "-batch", "-nx", "-p", pid, "-ex", "thread apply all bt",
               (char *)NULL);
        static const char msg[] = "WATCHDOG: no stacks (gdb could not be run)\n";

        /* only async-signal-safe calls in the child of a threaded process */
        (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
        _exit(127);
    }
    if (child < 0)
        return;
    for (int i = 0; i < 600; i++) {
        if (waitpid(child, &status, WNOHANG) != 0)
            return;
        usleep(100 * 1000);
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
}

static void *wd_main(void *arg)
{
    int expired = 0;

    (void)arg;
    pthread_mutex_lock(&wd_lock);
    while (!wd_stop && !expired) {
        struct timespec tick;

        clock_gettime(CLOCK_REALTIME, &tick);
        tick.tv_nsec += 200 * 1000000L;
        if (tick.tv_nsec >= 1000000000L) {
            tick.tv_sec++;
            tick.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&wd_cond, &wd_lock, &tick);
        expired = it_now_ms() > wd_deadline;
    }
    pthread_mutex_unlock(&wd_lock);
    if (expired && !wd_stop) {
        fprintf(stderr, "WATCHDOG: %s still blocked after %d s; aborting the test\n", wd_what,
                wd_seconds);
        wd_dump_stacks();
        fflush(stderr);
        _exit(99);
    }
    return NULL;
}

void it_watchdog_start(int seconds, const char *what)
{
    ck_assert_msg(!wd_running, "watchdog already running");
    wd_stop = 0;
    wd_seconds = seconds;
    wd_what = what;
    wd_deadline = it_now_ms() + seconds * 1000.0;
    ck_assert_int_eq(pthread_create(&wd_thread, NULL, wd_main, NULL), 0);
    wd_running = 1;
}

void it_watchdog_kick(void)
{
    pthread_mutex_lock(&wd_lock);
    wd_deadline = it_now_ms() + wd_seconds * 1000.0;
    pthread_mutex_unlock(&wd_lock);
}

void it_watchdog_stop(void)
{
    if (!wd_running)
        return;
    pthread_mutex_lock(&wd_lock);
    wd_stop = 1;
    pthread_cond_broadcast(&wd_cond);
    pthread_mutex_unlock(&wd_lock);
    pthread_join(wd_thread, NULL);
    wd_running = 0;
}

/* ---- queues and events ---- */

void it_context(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(it_ctx, sizeof(it_ctx), fmt, ap);
    va_end(ap);
}

const char *it_evt_name(int type)
{
    static const char *const names[] = {
        "?",        "CONNECT", "ACCEPT",      "SEND",        "RECV",     "SENDMSG", "RECVMSG",
        "SENDFILE", "POLL",    "SENDTIMEOUT", "RECVTIMEOUT", "SHUTDOWN", "CLOSE",
    };

    if (type < 0 || type >= (int)(sizeof(names) / sizeof(names[0])))
        return "?";
    return names[type];
}

static const char *describe(const exs_event_t *ev, char *buf, size_t size)
{
    if (ev->exs_evt_type == EXS_EVT_SEND || ev->exs_evt_type == EXS_EVT_RECV)
        snprintf(buf, size, "%s fd=%d ah=%ld errno=%d (%s) result=%zd len=%zu flags=%#x",
                 it_evt_name(ev->exs_evt_type), ev->exs_evt_fd, IT_AHN(ev->exs_evt_ahandle),
                 ev->exs_evt_errno, strerror(ev->exs_evt_errno),
                 ev->exs_evt_u.exs_evt_xfer.exs_evt_result, ev->exs_evt_u.exs_evt_xfer.exs_evt_len,
                 (unsigned)ev->exs_evt_u.exs_evt_xfer.exs_evt_flags);
    else if (ev->exs_evt_type == EXS_EVT_ACCEPT)
        snprintf(buf, size, "ACCEPT fd=%d ah=%ld errno=%d (%s) newfd=%d", ev->exs_evt_fd,
                 IT_AHN(ev->exs_evt_ahandle), ev->exs_evt_errno, strerror(ev->exs_evt_errno),
                 ev->exs_evt_u.exs_evt_accept.exs_evt_newfd);
    else
        snprintf(buf, size, "%s(%d) fd=%d ah=%ld errno=%d (%s)", it_evt_name(ev->exs_evt_type),
                 ev->exs_evt_type, ev->exs_evt_fd, IT_AHN(ev->exs_evt_ahandle), ev->exs_evt_errno,
                 strerror(ev->exs_evt_errno));
    return buf;
}

static struct it_stash *stash_find(exs_qhandle_t q, int create)
{
    struct it_stash *freeslot = NULL;

    for (int i = 0; i < IT_MAX_QUEUE; i++) {
        if (it_queues[i].used && it_queues[i].q == q)
            return &it_queues[i];
        if (!it_queues[i].used && !freeslot)
            freeslot = &it_queues[i];
    }
    if (!create)
        return NULL;
    ck_assert_msg(freeslot != NULL, "too many queues tracked");
    freeslot->used = 1;
    freeslot->q = q;
    freeslot->ev = calloc(IT_STASH, sizeof(exs_event_t));
    ck_assert_ptr_nonnull(freeslot->ev);
    freeslot->head = freeslot->count = 0;
    return freeslot;
}

exs_qhandle_t it_qcreate(int depth)
{
    exs_qhandle_t q;

    errno = 0;
    q = exs_qcreate(depth);
    ck_assert_msg(q != EXS_QHANDLE_INVALID, "exs_qcreate(%d) failed: errno %d (%s)", depth, errno,
                  strerror(errno));
    ck_assert_msg(stash_find(q, 0) == NULL, "exs_qcreate returned handle %d, already live", q);
    stash_find(q, 1);
    return q;
}

void it_qdelete_at(exs_qhandle_t q, int ms, const char *file, int line)
{
    struct it_stash *s;
    int rc;

    it_expect_no_event_at(q, ms, file, line);
    rc = exs_qdelete(q);
    ck_assert_msg(rc == 0, "%s:%d: exs_qdelete(%d) = %d errno %d (%s)", file, line, q, rc, errno,
                  strerror(errno));
    s = stash_find(q, 0);
    if (s)
        stash_forget(s);
}

static void stash_push(struct it_stash *s, const exs_event_t *ev)
{
    ck_assert_msg(s->count < IT_STASH, "event stash of queue %d overflows", s->q);
    s->ev[(s->head + s->count) % IT_STASH] = *ev;
    s->count++;
}

static int ev_match(const exs_event_t *ev, int type, int fd)
{
    return (type < 0 || ev->exs_evt_type == type) && (fd < 0 || ev->exs_evt_fd == fd);
}

/* Take the first stashed event matching (type, fd), keeping the others in order. */
static int stash_take(struct it_stash *s, int type, int fd, exs_event_t *out)
{
    for (unsigned i = 0; i < s->count; i++) {
        exs_event_t *ev = &s->ev[(s->head + i) % IT_STASH];

        if (!ev_match(ev, type, fd))
            continue;
        *out = *ev;
        for (unsigned j = i; j + 1 < s->count; j++)
            s->ev[(s->head + j) % IT_STASH] = s->ev[(s->head + j + 1) % IT_STASH];
        s->count--;
        return 1;
    }
    return 0;
}

static void ms_to_ts(double ms, struct timespec *ts)
{
    if (ms < 0)
        ms = 0;
    ts->tv_sec = (time_t)(ms / 1000);
    ts->tv_nsec = (long)((ms - (double)ts->tv_sec * 1000) * 1e6);
    if (ts->tv_nsec >= 1000000000L)
        ts->tv_nsec = 999999999L;
    if (ts->tv_nsec < 0)
        ts->tv_nsec = 0;
}

int it_try_event(exs_qhandle_t q, int type, int fd, int ms, exs_event_t *out)
{
    struct it_stash *s = stash_find(q, 0);
    double deadline = it_now_ms() + ms;
    exs_event_t ev;

    ck_assert_msg(s != NULL, "queue %d was not created with it_qcreate", q);
    if (stash_take(s, type, fd, out))
        return 1;
    for (;;) {
        double left = deadline - it_now_ms();
        struct timespec ts;
        int n;

        ms_to_ts(left, &ts);
        memset(&ev, 0, sizeof(ev));
        n = exs_qdequeue(q, &ev, 1, &ts);
        if (n < 0) {
            ck_assert_msg(errno == EINTR, "exs_qdequeue(%d, 1, %.0f ms) = %d errno %d (%s)", q,
                          left, n, errno, strerror(errno));
            continue;
        }
        ck_assert_msg(n <= 1, "exs_qdequeue(%d, nevents 1) returned %d", q, n);
        if (n == 1) {
            if (ev_match(&ev, type, fd)) {
                *out = ev;
                return 1;
            }
            stash_push(s, &ev);
            continue;
        }
        if (left <= 0)
            return 0;
    }
}

void it_wait_event_at(exs_qhandle_t q, int type, int fd, int ms, exs_event_t *out, const char *file,
                      int line)
{
    exs_event_t ev;
    struct it_stash *s;
    char buf[256] = "none";

    if (it_try_event(q, type, fd, ms, out ? out : &ev))
        return;
    s = stash_find(q, 0);
    if (s && s->count)
        describe(&s->ev[s->head], buf, sizeof(buf));
    ck_abort_msg("%s:%d: no EXS_EVT_%s event (fd %d) on queue %d within %d ms "
                 "(%u other events stashed, first: %s) [%s]",
                 file, line, type < 0 ? "(any)" : it_evt_name(type), fd, q, ms, s ? s->count : 0,
                 buf, it_ctx);
}

void it_expect_no_event_at(exs_qhandle_t q, int ms, const char *file, int line)
{
    struct it_stash *s = stash_find(q, 0);
    exs_event_t ev;
    char buf[256];

    if (s && s->count)
        ck_abort_msg("%s:%d: unexpected event on queue %d: %s (%u stashed)", file, line, q,
                     describe(&s->ev[s->head], buf, sizeof(buf)), s->count);
    if (it_try_event(q, -1, -1, ms, &ev))
        ck_abort_msg("%s:%d: unexpected event on queue %d: %s", file, line, q,
                     describe(&ev, buf, sizeof(buf)));
}

void it_expect_xfer_at(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, ssize_t result,
                       int trunc, exs_event_t *out, const char *file, int line)
{
    exs_event_t ev;
    char buf[256];

    it_wait_event_at(q, type, fd, IT_TIMEOUT_MS, &ev, file, line);
    describe(&ev, buf, sizeof(buf));
    ck_assert_msg(ev.exs_evt_ahandle == ah, "%s:%d: expected ah %ld, got %s [%s]", file, line,
                  IT_AHN(ah), buf, it_ctx);
    ck_assert_msg(ev.exs_evt_errno == 0, "%s:%d: expected errno 0, got %s [%s]", file, line, buf,
                  it_ctx);
    if (result >= -1)
        ck_assert_msg(ev.exs_evt_u.exs_evt_xfer.exs_evt_result == result,
                      "%s:%d: expected result %zd, got %s [%s]", file, line, result, buf, it_ctx);
    if (type == EXS_EVT_RECV)
        ck_assert_msg(!!(ev.exs_evt_u.exs_evt_xfer.exs_evt_flags & MSG_TRUNC) == !!trunc,
                      "%s:%d: expected MSG_TRUNC %s, got %s [%s]", file, line,
                      trunc ? "set" : "clear", buf, it_ctx);
    if (out)
        *out = ev;
}

void it_expect_err_at(exs_qhandle_t q, int type, int fd, exs_ahandle_t ah, int err,
                      exs_event_t *out, const char *file, int line)
{
    exs_event_t ev;
    char buf[256];

    it_wait_event_at(q, type, fd, IT_TIMEOUT_MS, &ev, file, line);
    describe(&ev, buf, sizeof(buf));
    ck_assert_msg(ev.exs_evt_ahandle == ah, "%s:%d: expected ah %ld, got %s [%s]", file, line,
                  IT_AHN(ah), buf, it_ctx);
    ck_assert_msg(ev.exs_evt_errno == err, "%s:%d: expected errno %d (%s), got %s [%s]", file, line,
                  err, strerror(err), buf, it_ctx);
    if (err != 0 && (type == EXS_EVT_SEND || type == EXS_EVT_RECV))
        ck_assert_msg(ev.exs_evt_u.exs_evt_xfer.exs_evt_result == -1,
                      "%s:%d: expected result -1 with errno %d, got %s", file, line, err, buf);
    if (out)
        *out = ev;
}

/* ---- sockets and pairs ---- */

/* An IPv4 address from environment variable var, else 127.0.0.1. */
static struct in_addr it_env_in(const char *var)
{
    const char *at = getenv(var);
    struct in_addr a = {.s_addr = htonl(INADDR_LOOPBACK)};

    if (at && *at)
        ck_assert_msg(inet_pton(AF_INET, at, &a) == 1, "%s '%s'", var, at);
    return a;
}

struct in_addr it_listen_in(void)
{
    return it_env_in("EXS_TEST_LISTEN_ADDR");
}

struct in_addr it_client_in(void)
{
    const char *at = getenv("EXS_TEST_LISTEN_ADDR");

    return at && *at ? it_env_in("EXS_TEST_ADDR") : it_env_in("");
}

int it_listen(int type, struct sockaddr_in *addr)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(*addr);
    int fd, rc;

    const char *at = getenv("EXS_TEST_LISTEN_ADDR");

    /* EXS_TEST_LISTEN_ADDR (scripts/rxe-2host.sh): listen on this address instead of
     * 127.0.0.1, so that a pair's connection leaves the host (spec/rxe-vm.md, two hosts). */
    sin.sin_addr = it_listen_in();
    errno = 0;
    fd = exs_socket(AF_INET, type, 0);
    ck_assert_msg(fd >= 0, "exs_socket(AF_INET, %d, 0) = %d errno %d (%s)", type, fd, errno,
                  strerror(errno));
    rc = exs_bind(fd, (struct sockaddr *)&sin, sizeof(sin));
    ck_assert_msg(rc == 0, "exs_bind(%s:0) = %d errno %d (%s)", at && *at ? at : "127.0.0.1", rc,
                  errno, strerror(errno));
    rc = exs_listen(fd, 128);
    ck_assert_msg(rc == 0, "exs_listen = %d errno %d (%s)", rc, errno, strerror(errno));
    memset(addr, 0, sizeof(*addr));
    rc = exs_getsockname(fd, (struct sockaddr *)addr, &len);
    ck_assert_msg(rc == 0, "exs_getsockname(listener) = %d errno %d (%s)", rc, errno,
                  strerror(errno));
    ck_assert_msg(len == sizeof(*addr) && addr->sin_family == AF_INET,
                  "exs_getsockname: len %u family %d", (unsigned)len, addr->sin_family);
    ck_assert_msg(addr->sin_port != 0, "exs_getsockname: port 0 after bind + listen");
    if (addr->sin_addr.s_addr == htonl(INADDR_ANY))
        addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return fd;
}

void it_close_at(int fd, exs_qhandle_t q, const char *file, int line)
{
    exs_ahandle_t ah = IT_AH(0xC105E);
    int rc;

    errno = 0;
    rc = exs_close(fd, q, ah);
    ck_assert_msg(rc == 0, "%s:%d: exs_close(%d, q %d) = %d errno %d (%s)", file, line, fd, q, rc,
                  errno, strerror(errno));
    it_expect_err_at(q, EXS_EVT_CLOSE, fd, ah, 0, NULL, file, line);
}

void it_refusing_addr(struct sockaddr_in *addr, int *holder)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(*addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ge(fd, 0);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)addr, &len), 0);
    *holder = fd;
}

void it_pair_open_at(struct it_pair *p, int type, int sdepth, int cdepth, const char *file,
                     int line)
{
    exs_event_t ev;
    char buf[256];
    int rc;

    memset(p, 0, sizeof(*p));
    p->type = type;
    p->sfd = p->cfd = p->lfd = -1;
    p->sq = it_qcreate(sdepth);
    p->cq = it_qcreate(cdepth);
    p->lfd = it_listen(type, &p->addr);
    rc = exs_accept(p->lfd, p->sq, IT_AH(0xACC));
    ck_assert_msg(rc == 0, "%s:%d: exs_accept = %d errno %d (%s)", file, line, rc, errno,
                  strerror(errno));
    p->cfd = exs_socket(AF_INET, type, 0);
    ck_assert_msg(p->cfd >= 0, "%s:%d: exs_socket = %d errno %d (%s)", file, line, p->cfd, errno,
                  strerror(errno));
    rc = exs_connect(p->cfd, (struct sockaddr *)&p->addr, sizeof(p->addr), p->cq, IT_AH(0xC0));
    ck_assert_msg(rc == 0, "%s:%d: exs_connect = %d errno %d (%s)", file, line, rc, errno,
                  strerror(errno));
    it_expect_err_at(p->cq, EXS_EVT_CONNECT, p->cfd, IT_AH(0xC0), 0, NULL, file, line);
    it_expect_err_at(p->sq, EXS_EVT_ACCEPT, p->lfd, IT_AH(0xACC), 0, &ev, file, line);
    p->sfd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    ck_assert_msg(p->sfd >= 0 && p->sfd != p->cfd && p->sfd != p->lfd,
                  "%s:%d: bad accepted descriptor: %s (cfd %d lfd %d)", file, line,
                  describe(&ev, buf, sizeof(buf)), p->cfd, p->lfd);
}

void it_pair_close_at(struct it_pair *p, const char *file, int line)
{
    if (p->cfd >= 0)
        it_close_at(p->cfd, p->cq, file, line);
    if (p->sfd >= 0)
        it_close_at(p->sfd, p->sq, file, line);
    if (p->lfd >= 0)
        it_close_at(p->lfd, p->sq, file, line);
    p->cfd = p->sfd = p->lfd = -1;
    it_qdelete_at(p->sq, 0, file, line);
    it_qdelete_at(p->cq, 0, file, line);
}

/* ---- buffers and patterns ---- */

struct it_buf *it_buf_new(size_t len, int reg)
{
    struct it_buf *b = calloc(1, sizeof(*b));
    void *mem = NULL;
    int slot = -1;

    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(posix_memalign(&mem, 4096, len + 2 * IT_GUARD), 0);
    b->base = mem;
    memset(b->base, IT_GUARD_BYTE, len + 2 * IT_GUARD);
    b->p = b->base + IT_GUARD;
    b->len = len;
    b->mh = EXS_MHANDLE_UNREGISTERED;
    if (reg) {
        errno = 0;
        b->mh = exs_mregister(b->p, len, 0);
        ck_assert_msg(b->mh != EXS_MHANDLE_INVALID && b->mh != EXS_MHANDLE_UNREGISTERED,
                      "exs_mregister(%zu bytes) = %d errno %d (%s)", len, b->mh, errno,
                      strerror(errno));
    }
    for (int i = 0; i < IT_MAX_BUF; i++) {
        if (!it_bufs[i]) {
            slot = i;
            break;
        }
    }
    ck_assert_msg(slot >= 0, "too many test buffers");
    it_bufs[slot] = b;
    return b;
}

void it_buf_free(struct it_buf *b)
{
    if (!b)
        return;
    if (b->mh != EXS_MHANDLE_UNREGISTERED) {
        int rc = exs_mderegister(b->mh);

        ck_assert_msg(rc == 0, "exs_mderegister(%d) = %d errno %d (%s)", b->mh, rc, errno,
                      strerror(errno));
    }
    for (int i = 0; i < IT_MAX_BUF; i++) {
        if (it_bufs[i] == b)
            it_bufs[i] = NULL;
    }
    free(b->base);
    free(b);
}

int it_buf_guards_ok(const struct it_buf *b)
{
    return it_all_bytes(b->base, IT_GUARD, IT_GUARD_BYTE) &&
           it_all_bytes(b->p + b->len, IT_GUARD, IT_GUARD_BYTE);
}

static uint64_t pat_word(uint32_t seed, uint64_t w)
{
    uint64_t z = ((uint64_t)seed << 40) ^ w;

    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void it_fill(void *dst, size_t len, uint32_t seed)
{
    uint8_t *d = dst;

    for (size_t off = 0, w = 0; off < len; off += 8, w++) {
        uint64_t v = pat_word(seed, w);
        size_t n = len - off < 8 ? len - off : 8;

        memcpy(d + off, &v, n);
    }
}

long it_check(const void *src, size_t len, uint32_t seed)
{
    const uint8_t *s = src;

    for (size_t off = 0, w = 0; off < len; off += 8, w++) {
        uint64_t v = pat_word(seed, w);
        size_t n = len - off < 8 ? len - off : 8;

        if (memcmp(s + off, &v, n) != 0) {
            const uint8_t *e = (const uint8_t *)&v;

            for (size_t i = 0; i < n; i++) {
                if (s[off + i] != e[i])
                    return (long)(off + i);
            }
        }
    }
    return -1;
}

int it_all_bytes(const void *p, size_t len, int v)
{
    const uint8_t *s = p;

    for (size_t i = 0; i < len; i++) {
        if (s[i] != (uint8_t)v)
            return 0;
    }
    return 1;
}

uint64_t it_rand(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* ---- process state ---- */

static int count_dir(const char *path, int self)
{
    DIR *d = opendir(path);
    struct dirent *de;
    int n = 0;

    ck_assert_msg(d != NULL, "opendir(%s): %s", path, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            n++;
    }
    closedir(d);
    return n - self;
}

int it_count_fds(void)
{
    return count_dir("/proc/self/fd", 1); /* minus the directory's own descriptor */
}

int it_join_within(pthread_t t, int ms, void **ret)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_timedjoin_np(t, ret, &ts) == 0;
}

long it_thread_syscall(int pid, int tid)
{
    char path[64], buf[128];
    long nr = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task/%d/syscall", pid, tid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(buf, sizeof(buf), f) || sscanf(buf, "%ld", &nr) != 1)
        nr = -1;
    fclose(f);
    return nr;
}

int it_count_tasks(void)
{
    return count_dir("/proc/self/task", 0);
}

/* A joined thread can still be listed in /proc/self/task for a moment: the kernel wakes
 * pthread_join when the thread releases its memory, before the task itself is reaped.
 * So wait (up to 2 s) for the count to come down to what is expected; a thread that
 * really leaked stays listed and the caller's assertion sees it. */
int it_count_tasks_expect(int want)
{
    int n = it_count_tasks();

    for (int i = 0; i < 400 && n != want; i++) {
        usleep(5000);
        n = it_count_tasks();
    }
    return n;
}

/* A connected pair of kernel TCP sockets over loopback: *a connected, *b accepted.
 * sndbuf / rcvbuf > 0 set SO_SNDBUF on a and SO_RCVBUF on b first (small buffers make
 * partial writes). */
void it_tcp_pair(int *a, int *b, int sndbuf, int rcvbuf)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof(sin);
    int l, c, s;

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    l = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(l, 0);
    ck_assert_int_eq(bind(l, (struct sockaddr *)&sin, sizeof(sin)), 0);
    ck_assert_int_eq(listen(l, 4), 0);
    ck_assert_int_eq(getsockname(l, (struct sockaddr *)&sin, &len), 0);
    c = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(c, 0);
    if (sndbuf > 0)
        ck_assert_int_eq(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
    ck_assert_int_eq(connect(c, (struct sockaddr *)&sin, sizeof(sin)), 0);
    s = accept(l, NULL, NULL);
    ck_assert_int_ge(s, 0);
    if (rcvbuf > 0)
        ck_assert_int_eq(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    close(l);
    *a = c;
    *b = s;
}

exs_qhandle_t it_kfd_reset_open(int *a, int *b, struct sigaction *old)
{
    struct sigaction sa = {.sa_handler = SIG_DFL};
    exs_qhandle_t q;

    it_init();
    ck_assert_int_eq(sigaction(SIGPIPE, &sa, old), 0);
    q = it_qcreate(8);
    it_tcp_pair(a, b, 4096, 4096);
    return q;
}

void it_tcp_reset(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};

    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd); /* RST */
}

void it_kfd_settle(exs_qhandle_t q)
{
    for (int i = 0; i < 1000 && exs__debug_kfd_live(); i++) {
        exs_qdequeue(q, NULL, 0, NULL);
        it_sleep_ms(10);
    }
    ck_assert_msg(exs__debug_kfd_live() == 0, "%d kernel-socket objects left",
                  exs__debug_kfd_live());
}

static char it_fault_prov[32];

void it_fault_init(void)
{
    const char *saved = it_provider;

    if (strncmp(it_provider, "fault:", 6) == 0)
        snprintf(it_fault_prov, sizeof(it_fault_prov), "%s", it_provider);
    else
        snprintf(it_fault_prov, sizeof(it_fault_prov), "fault:%s", it_provider);
    it_provider = it_fault_prov;
    it_init();
    it_provider = saved;
}

const char *it_fault_provider(void)
{
    return it_fault_prov;
}

void it_fault_params_reset(void)
{
    size_t n;
    const struct exs_param_def *t = exs__params_table(&n);

    for (size_t i = 0; i < n; i++)
        if (strncmp(t[i].name, "fault_", 6) == 0)
            ck_assert_int_eq(exs__params_set(t[i].name, t[i].defval), 0);
}

uint64_t it_fallback_count(const char *name)
{
    uint64_t v = 0;
    int rc = exs__counters_lookup("fallback", name, &v);

    /* the set is registered with the first connection: 0 before */
    ck_assert_msg(rc == 0 || (rc == -ENOENT && exs__conn_live_count() == 0),
                  "counter fallback %s: %d", name, rc);
    return v;
}

void it_fault_teardown(void)
{
    it_fault_params_reset();
    it_teardown();
}

void it_fault_set(const char *name, const char *value)
{
    int rc = exs__params_set(name, value);

    ck_assert_msg(rc == 0, "exs__params_set(%s, %s) = %d", name, value, rc);
}

void it_fault_set_port(const struct it_pair *p)
{
    char port[16];

    snprintf(port, sizeof(port), "%u", ntohs(p->addr.sin_port));
    it_fault_set("fault_port", port);
}

uint64_t it_posts_copied(int fd, size_t n, int *inl_p)
{
    struct exs_conn_info info;
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_nonnull(s->conn);
    exs__conn_info(s->conn, &info);
    if (inl_p)
        *inl_p = n <= s->conn->ep->attr.max_inline;
    exs__api_sock_put(s);
    return info.posts_copied;
}
