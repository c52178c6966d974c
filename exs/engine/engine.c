/* SPDX-License-Identifier: MIT */
/* Progress as a lock: whoever holds it drives the provider; a libev thread drives only while no
 * application thread does. */
#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/engine/engine.h"
#include "exs/util/lite_lock.h"
#include "exs/util/list.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

#define ENG_CQE_BATCH   64
#define ENG_DRIVE_ROUND 16 /* cqe batches per round of one drive */
#define ENG_DRIVE_MAX   8  /* rounds per drive: a flood cannot keep one caller forever */
/* A busy wait's rounds (EXS_ENG_DRIVE_TRY), and a waiter's drive before it sleeps
 * (EXS_ENG_DRIVE_WAIT: its arm then looks at every context), look at the fallback context
 * only every ENG_FB_EVERY-th time once it found nothing in ENG_FB_IDLE rounds of its own
 * (a blocking verbs ping-pong made 1.8 tcp passes per round trip: four locks and an
 * epoll_wait, bench-rxe-cg, session 20) (a verbs
 * process polls an idle tcp context at every turn otherwise: three locks, half of a busy
 * turn's, and an epoll_wait); each look that finds nothing doubles that interval, up to
 * EXS_ENG_FB_EVERY_MAX rounds (at every 16th round the look was still 4-5 epoll_waits per
 * round trip of a busy verbs ping-pong in the guest); every other round looks at it, and
 * so does any round after it did something, which also puts the interval back. */
#define ENG_FB_EVERY    16
#define ENG_FB_IDLE     64

/*
 * Locks (spec/threading.md): eng.plock is the progress lock, outermost of the library;
 * eng.lock guards the job list and stopping only, and is a leaf.
 *
 * Fields written under plock: loop internals, io_on, loop_dirty. drv is atomic.
 */
/* eng.drv: the drivers inside a wait, and the leaves ever (wrapping) */
#define ENG_DRIVERS(v)   ((int)(uint32_t)(v))
#define ENG_LEAVE_GEN(v) ((unsigned)((v) >> 32))
/* A leave: the generation up and the count down in one add (the count is >= 1 before
 * it: no borrow from the generation) */
#define ENG_LEAVE        ((UINT64_C(1) << 32) - 1)
static struct {
    struct exs_prov_ctx *ctx;
    /* The fallback context (tcp), opened at start when the policy needs it
     * (spec/provider.md, Fallback), else NULL; fixed while running. ctxs[] lists the
     * primary then the fallback: every round, arm and watch covers each. */
    struct exs_prov_ctx *fb;
    struct exs_prov_ctx *ctxs[EXS_ENG_MAX_CTX];
    int nctx;
    int fb_policy; /* EXS_ENG_FB_*, fixed while running */
    struct ev_loop *loop;
    ev_io prov_io;
    ev_io fb_io; /* the fallback context's event fd, started and stopped with prov_io */
    ev_async wake;
    ev_prepare prep; /* before each blocking poll: who watches the provider */
    ev_timer lease;  /* while drivers > 0: look again whether they left */
    pthread_t thread;
    struct exs_lite_lock plock; /* the progress lock (a futex mutex: lite_lock.h, the _st pair) */
    pthread_mutex_t lock;       /* jobs, stopping */
    struct exs_list jobs;
    int stopping;
    int running;
    int manual; /* provider opened with EXS_PROV_ATTR_MANUAL_PROGRESS */
    /* atomic: application threads inside a wait (low 32 bits, ENG_DRIVERS) and drivers
     * that left, ever (high 32 bits, ENG_LEAVE_GEN): one word, so a leave is one locked
     * add (ENG_LEAVE) where a count down and a generation up were two */
    uint64_t drv;
    uint64_t leave_at;   /* atomic: when a driver last left (eng_stamp) */
    uint64_t gap_ns;     /* atomic: the application's remembered gap between waits, noted
                            at gap_at (exs__engine_gap_now; approximate when threads race) */
    uint64_t gap_at;     /* atomic */
    int lease_idle;      /* atomic: the lease is stopped; the last driver to leave wakes the loop */
    unsigned seen_gen;   /* plock (loop): leave_gen at the previous lease */
    unsigned lease_mult; /* plock (loop): the lease's period in leases (1..EXS_ENG_LEASE_GROW),
                            doubled while the drivers keep coming back, 1 after a take-over */
    int io_on;           /* plock: the loop watches the provider's event fd */
    uint64_t post_seen_at; /* atomic, written by the loop (eng_stamp): when a look last found
                              exs__eng_posted set */
    int post_back;         /* atomic: the application's last gap longer than a lease had
                              posts in it and ended in a wait within EXS_ENG_POST_LEASES */
    int psleepers;         /* atomic: application threads armed for, or asleep on, the event fds
                              (exs__engine_arm .. exs__engine_arm_end) */
    int armed;             /* plock: the contexts were armed since the last disarm */
    int loop_dirty;        /* plock: a non-loop holder changed a watcher */
    int njobs;             /* atomic: queued jobs (a sleeper looks before sleeping) */
    uint32_t fb_idle;      /* plock: rounds of the fallback context that found nothing, in a row */
    uint32_t fb_tick;      /* plock: busy rounds that could skip it */
    uint32_t fb_every;     /* plock: a busy round looks at it every this many (ENG_FB_EVERY ..
                              EXS_ENG_FB_EVERY_MAX, doubled by each idle look) */
    pthread_t holder;      /* atomic: the progress lock's holder (pthread_self), 0: none */
} eng = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* This thread's pthread_self(), read inline where it can be: glibc's pthread_t on x86-64
 * is the thread's control block, the thread pointer (%fs:0, one load instead of a call of
 * pthread_self; each spin turn asks twice: eng_holding, then the lock's holder). */
static inline pthread_t eng_self(void)
{
#if defined(__GLIBC__) && defined(__x86_64__) && (__GNUC__ >= 11 || defined(__clang__))
    return (pthread_t)__builtin_thread_pointer();
#else
    return pthread_self();
#endif
}

/* This thread holds the progress lock. */
static inline int eng_holding(void)
{
    return pthread_equal(__atomic_load_n(&eng.holder, __ATOMIC_RELAXED), eng_self());
}

/*
 * What the progress path knows per thread, kept out of thread-local storage where it can
 * be: in the shared library every function that touches a __thread variable calls
 * __tls_get_addr (no initial-exec model there: it would take static TLS space at dlopen),
 * ~11 instructions each, and a blocking 64 B ping-pong made ~20 such calls per round trip
 * and process (drive, arm, unlock, the operation blocks' cache). Now:
 * - who holds the progress lock is eng.holder (the holder's pthread_self, 0 when free):
 *   a thread asks "do I hold it" by comparing with its own id, which only it stores
 *   there, and clears before it gives the lock back, so the answer is exact without
 *   ordering (relaxed atomics);
 * - what a drive may skip (busy, only) is its round's arguments (eng_round);
 * - the slow-poll record (eng_poll_end_ns, eng_poll_last) stays per thread, but is
 *   touched only once polling_warn_cycle_us was seen set (eng_poll_used).
 */
static __thread uint64_t eng_poll_end_ns; /* Slow-poll detection (polling_warn_cycle_us):
                                           * when this thread's last drive ended, 0 once it
                                           * went to sleep (exs__engine_arm) or never drove */
/* atomic, sticky: polling_warn_cycle_us was seen non-zero (eng_poll_end_ns may be set) */
static int eng_poll_used;

/* What the last progress pass did (plock): slow-poll and slow-section reports. */
static struct eng_pass {
    unsigned cqes, cms, jobs;
    uint64_t ns;                          /* its duration (measured while a threshold is set) */
    void (*slow_fn)(struct exs_job *job); /* its slowest job */
    uint64_t slow_fn_ns;
} eng_pass;
static __thread int eng_is_loop; /* this thread is the libev loop's */

struct exs_eng_counters exs__eng_cnt;
struct exs_eng_fb_counters exs__eng_fb_cnt;

static const struct exs_counter_desc eng_counter_desc[] = {
    EXS_COUNTER(struct exs_eng_counters, drives_app,
                "drives by application threads that found work (waits, synchronous calls)"),
    EXS_COUNTER(struct exs_eng_counters, drives_thread,
                "drives by the progress thread that delivered completions, connection events or "
                "jobs"),
    EXS_COUNTER(struct exs_eng_counters, lease_handoffs,
                "times the progress thread took the provider back when no thread drove"),
    EXS_COUNTER(
        struct exs_eng_counters, lease_idles,
        "leases stopped because the same threads kept waiting (idle waits cost no wake-up)"),
    EXS_COUNTER(struct exs_eng_counters, lease_fires,
                "times the lease woke the progress thread to look at the drivers"),
    EXS_COUNTER(struct exs_eng_counters, lease_grows,
                "times the lease's period doubled because the drivers kept coming back"),
    EXS_COUNTER(struct exs_eng_counters, spin_yields,
                "busy waiters that yielded their CPU: the progress lock stayed held through 32 "
                "turns of their spin (its holder may need that CPU)"),
    EXS_COUNTER(struct exs_eng_counters, spin_waits,
                "busy waiters that slept on the progress lock: it stayed held through 2 of "
                "their yields (the yields gave the CPU to nobody)"),
    EXS_COUNTER(struct exs_eng_counters, arms,
                "waiters' arms before a sleep (the first look at the providers of a sleeping "
                "wait: no drive before it)"),
    EXS_COUNTER(struct exs_eng_counters, arm_drives,
                "of those: work was pending (-EAGAIN), and its round ran in the same hold of "
                "the progress lock"),
    EXS_COUNTER(struct exs_eng_counters, wake_drives,
                "sleeping waiters woken by a provider's event fd, which then drove the contexts "
                "that signalled"),
    EXS_COUNTER(struct exs_eng_counters, woken_skips,
                "contexts a waiter woken from its sleep did not drive: their event fd was not "
                "readable (armed with nothing pending, nothing since)"),
    EXS_COUNTER(struct exs_eng_counters, evq_fd_writes,
                "event queue descriptor writes (only for queues someone can see)"),
    EXS_COUNTER(struct exs_eng_counters, rounds,
                "progress rounds run, also those that found nothing (an idle process runs none)"),
    EXS_COUNTER(struct exs_eng_counters, listen_deferred,
                "connection requests that waited for room in their listener's backlog"),
    EXS_COUNTER(struct exs_eng_counters, listen_defer_timeouts,
                "of those: refused (backlog full) after waiting half of connect_timeout_ms"),
    EXS_COUNTER(struct exs_eng_counters, listen_defer_full,
                "connection requests refused at once (backlog full): too many already waiting"),
    EXS_COUNTER(struct exs_eng_counters, listen_pauses,
                "times a listener's provider was told to stop taking requests (too many waiting)"),
    EXS_COUNTER(struct exs_eng_counters, post_holds,
                "looks of the progress thread that left the provider to an application thread "
                "because it posted since the previous look (it comes back to wait and drive)"),
    EXS_COUNTER(struct exs_eng_counters, fb_skips,
                "busy-wait rounds that left the idle fallback context for a later round"),
};

/* A counter written only under plock (the rounds' and drives' counts): a relaxed load and
 * store, no locked add (on x86 a lock-prefixed add, about 20 cycles, at every round of a
 * busy poller's spin: as the shm provider's SHM_CNT_ADD_OWNED). Readers load it relaxed. */
#define ENG_CNT_INC_LOCKED(_field)                                                                 \
    __atomic_store_n(&(_field), __atomic_load_n(&(_field), __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED)

static struct exs_counter_set eng_cset = {
    .name = "engine",
    .desc = eng_counter_desc,
    .count = sizeof(eng_counter_desc) / sizeof(eng_counter_desc[0]),
    .base = &exs__eng_cnt,
};

static const struct exs_counter_desc eng_fb_counter_desc[] = {
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_connects,
                "connects the primary provider failed, retried over the fallback (tcp)"),
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_refused,
                "of those: refused (rejected by the peer or its provider)"),
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_unreachable,
                "of those: network or host unreachable, no route"),
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_timeout,
                "of those: timed out (no answer, or the handshake deadline)"),
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_addr,
                "of those: address error (cannot be resolved or used by the primary)"),
    EXS_COUNTER(struct exs_eng_fb_counters, fallback_listens,
                "listeners listening on the fallback context too"),
};

static struct exs_counter_set eng_fb_cset = {
    .name = "fallback",
    .desc = eng_fb_counter_desc,
    .count = sizeof(eng_fb_counter_desc) / sizeof(eng_fb_counter_desc[0]),
    .base = &exs__eng_fb_cnt,
};

struct exs_prov_ctx *exs__engine_ctx(void)
{
    return eng.ctx;
}

struct exs_prov_ctx *exs__engine_fallback_ctx(void)
{
    return eng.fb;
}

int exs__engine_on_thread(void)
{
    return eng_holding();
}

int exs__engine_manual(void)
{
    return eng.manual;
}

/* ---- the leave stamp's clock ----
 * A driver's leave is stamped on every wait's way out (exs__engine_driver_leave), on the
 * message's path; what reads the stamp (the gap at the next enter, the loop's hysteresis
 * and lease, spec/threading.md §4) compares differences of stamps with the lease (10 us
 * and up): microseconds. Where the kernel's own clock source is the TSC (it keeps it
 * constant and in step across CPUs: x86-64, current_clocksource "tsc"), a stamp is the
 * TSC itself (rdtsc, ~9 ns here against ~21-39 ns for clock_gettime, which reads it too
 * and then converts) and a difference of two is converted to ns by a factor measured
 * once per process against CLOCK_MONOTONIC (eng_clock_calibrate); elsewhere a stamp is
 * exs__now_ns. Stamps are only ever subtracted from one another, never compared with
 * clock_gettime times. */
static struct {
    int tsc;       /* stamps are TSC ticks */
    uint64_t mult; /* ns per tick, << 32 */
} eng_clk;
static pthread_once_t eng_clk_once = PTHREAD_ONCE_INIT;

static inline uint64_t eng_stamp(void)
{
#if defined(__x86_64__)
    if (__atomic_load_n(&eng_clk.tsc, __ATOMIC_RELAXED))
        return __builtin_ia32_rdtsc();
#endif
    return exs__now_ns();
}

/* ns from stamp from to stamp to; 0 when to is not later (another CPU's read) */
static inline uint64_t eng_stamp_ns(uint64_t from, uint64_t to)
{
    if (to <= from)
        return 0;
    if (!__atomic_load_n(&eng_clk.tsc, __ATOMIC_RELAXED))
        return to - from;
    return (uint64_t)(((unsigned __int128)(to - from) *
                       __atomic_load_n(&eng_clk.mult, __ATOMIC_RELAXED)) >>
                      32);
}

#if defined(__x86_64__)
/* A TSC read between two clock reads close together: 0 and its time (their middle), or
 * -1 when none of a few tries was tight (preempted, or a slow clock). */
static int eng_clock_pair(uint64_t *tsc_p, uint64_t *ns_p)
{
    for (int i = 0; i < 16; i++) {
        uint64_t a = exs__now_ns(), t = __builtin_ia32_rdtsc(), b = exs__now_ns();

        if (b - a < 2000) {
            *tsc_p = t;
            *ns_p = a + (b - a) / 2;
            return 0;
        }
    }
    return -1;
}
#endif

/* Once per process, before the first stamp (exs__engine_start): the TSC's rate, measured
 * over >= 2 ms (two pairs within 1 us each: error < 1e-3), when the kernel's clock source
 * is the TSC. */
static void eng_clock_calibrate(void)
{
#if defined(__x86_64__)
    char src[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    uint64_t t0, n0, t1, n1;

    if (!f)
        return;
    if (!fgets(src, sizeof(src), f))
        src[0] = 0;
    fclose(f);
    if (strcmp(src, "tsc\n") != 0 || eng_clock_pair(&t0, &n0))
        return;
    do {
        if (eng_clock_pair(&t1, &n1))
            return;
    } while (n1 - n0 < 2000000);
    /* 500 MHz .. 10 GHz (ticks per ns in [0.5, 10]), or the measure is wrong (a clock
     * step or a pause between the pairs): an invariant TSC ticks at the CPU's nominal
     * rate, 1..5 GHz in x86-64 parts (low-power ones ~1 GHz), so the bounds are a factor
     * 2 outside what a right measure can give; a correct one is within 1e-3 */
    if (t1 <= t0 || (n1 - n0) * 10 < t1 - t0 || (t1 - t0) * 2 < n1 - n0)
        return;
    __atomic_store_n(&eng_clk.mult, (uint64_t)(((unsigned __int128)(n1 - n0) << 32) / (t1 - t0)),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&eng.leave_at, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&eng.post_seen_at, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&eng_clk.tsc, 1, __ATOMIC_RELEASE);
#endif
}

void exs__engine_clock_init(void)
{
    (void)pthread_once(&eng_clk_once, eng_clock_calibrate);
}

int exs__engine_clock_tsc(void)
{
    return __atomic_load_n(&eng_clk.tsc, __ATOMIC_ACQUIRE);
}

uint64_t exs__engine_stamp(void)
{
    return eng_stamp();
}

uint64_t exs__engine_stamp_ns(uint64_t from, uint64_t to)
{
    return eng_stamp_ns(from, to);
}

/* ---- the progress lock ---- */

/* The progress lock is a lite lock given back with a plain store when nobody waits
 * (lite_lock.h, exs__lite_unlock_st; spec/threading.md §1): a busy poller's idle drive
 * takes it with one CAS and gives it back with no locked instruction. */
static void eng_lock(void)
{
    EXS_LOCK_ACQUIRE(EXS_LOCK_PROGRESS);
    exs__lite_lock_st(&eng.plock);
    __atomic_store_n(&eng.holder, eng_self(), __ATOMIC_RELAXED);
}

/* A fork's PREPARE waits for the progress lock (exs__engine_fork): set while it does, so
 * that a busy-polling application thread, which takes the lock by trylock at every turn,
 * leaves it to the forking thread instead of taking it again before the woken waiter runs
 * (the lock is not fair: the fork could wait as long as the poller spins). */
static int eng_fork_want;

static int eng_trylock(void)
{
    if (__atomic_load_n(&eng_fork_want, __ATOMIC_RELAXED) || !exs__lite_trylock(&eng.plock))
        return -EBUSY;
    EXS_LOCK_ACQUIRE(EXS_LOCK_PROGRESS);
    __atomic_store_n(&eng.holder, eng_self(), __ATOMIC_RELAXED);
    return 0;
}

/* The loop may be asleep with a timeout computed before the change. A call racing
 * exs_fini at exit may get here after the engine stopped: eng.loop is cleared under
 * eng.lock before the loop is destroyed. */
/* ev_async_send from an application thread: libev's write of its wake-up descriptor is a
 * cancellation point, made here under eng.lock (spec/threading.md, "Thread cancellation"):
 * cancellation off around it. */
static void eng_async_send(void)
{
    int cs = exs__nc_begin();

    ev_async_send(eng.loop, &eng.wake);
    exs__nc_end(cs);
}

static __attribute__((noinline, cold)) void eng_wake_loop(void)
{
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    if (eng.loop)
        eng_async_send();
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
}

/* Inline (each drive and arm ends with it); the loop's wake-up out of line. */
static inline __attribute__((always_inline)) void eng_unlock(void)
{
    /* The loop thread recomputes its timeout itself before it blocks. */
    int dirty = eng.loop_dirty && !eng_is_loop;

    eng.loop_dirty = 0;
    __atomic_store_n(&eng.holder, (pthread_t)0, __ATOMIC_RELAXED);
    exs__lite_unlock_st(&eng.plock);
    EXS_LOCK_RELEASE(EXS_LOCK_PROGRESS);
    if (dirty)
        eng_wake_loop();
}

/* libev's thread locking: the loop thread holds plock except inside its blocking poll. */
static void eng_loop_release(struct ev_loop *loop)
{
    (void)loop;
    eng_unlock();
}

static void eng_loop_acquire(struct ev_loop *loop)
{
    (void)loop;
    eng_lock();
}

/* ---- dispatch (plock held) ---- */

static void eng_dispatch_cm(const struct exs_prov_cm_event *ev)
{
    if (ev->type == EXS_PROV_CM_CONNECT_REQUEST) {
        struct exs_eng_listener *lis = ev->listener->user;

        lis->on_request(lis, ev);
        return;
    }
    if (ev->ep && ev->ep->user)
        exs__conn_on_cm(ev->ep->user, ev);
}

/* Hand the n completions in cqe (a batch of ctx's, polled) to their connections, then up
 * to batches - 1 more batches while they come full; returns how many. */
static inline __attribute__((always_inline)) int
eng_hand_cq(struct exs_prov_ctx *ctx, struct exs_prov_cqe *cqe, int n, int batches)
{
    int total = 0;

    while (n > 0) {
        exs__conn_on_cqes(cqe, n); /* runs of one conn: one lock, one progress pass */
        total += n;
        if (n < ENG_CQE_BATCH || --batches <= 0)
            break;
        n = exs__prov_poll(ctx, cqe, ENG_CQE_BATCH);
    }
    return total;
}

/* Hand up to batches * ENG_CQE_BATCH queued completions to their connections; returns
 * how many. */
static int eng_drain_cq(struct exs_prov_ctx *ctx, int batches)
{
    struct exs_prov_cqe cqe[ENG_CQE_BATCH];

    return eng_hand_cq(ctx, cqe, exs__prov_poll(ctx, cqe, ENG_CQE_BATCH), batches);
}

/* Run the jobs queued now (not those they queue: those run in the next round). */
static int eng_run_jobs(void)
{
    struct exs_list todo;
    struct exs_list *n;
    int count = 0;

    if (__atomic_load_n(&eng.njobs, __ATOMIC_ACQUIRE) == 0)
        return 0;
    exs_list_init(&todo);
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    while ((n = exs_list_pop_head(&eng.jobs)))
        exs_list_add_tail(&todo, n);
    __atomic_store_n(&eng.njobs, 0, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
    while ((n = exs_list_pop_head(&todo))) {
        struct exs_job *job = exs_list_entry(n, struct exs_job, link);
        void (*fn)(struct exs_job * job) = job->fn;
        uint64_t t0 = exs__params.slow_threshold_us ? exs__now_ns() : 0;

        job->queued = 0;
        fn(job); /* may free the job's object */
        count++;
        if (t0 && exs__now_ns() - t0 > eng_pass.slow_fn_ns) {
            eng_pass.slow_fn_ns = exs__now_ns() - t0;
            eng_pass.slow_fn = fn;
        }
    }
    eng_pass.jobs += (unsigned)count;
    return count;
}

/* One round: provider work, completions, then each cm event after the completions that
 * precede it (a DISCONNECTED must not overtake the completions of the data and the
 * SHUTDOWN the peer sent before it), then jobs. Returns how much it did. */
/* The end of a pass that began at t0 (0: not measured): its duration, and the report
 * when it held the progress lock longer than slow_threshold_us. */
static void eng_pass_end(uint64_t t0)
{
    uint64_t slow_us = exs__params.slow_threshold_us;

    if (!t0)
        return;
    eng_pass.ns = exs__now_ns() - t0;
    if (slow_us && eng_pass.ns > slow_us * 1000u)
        EXS_WARN(ENG,
                 "slow progress pass: the progress lock held %" PRIu64
                 " us (slow_threshold_us %" PRIu64 ") by %s: %u completions, %u connection "
                 "events, %u jobs (slowest job %p, %" PRIu64 " us)",
                 eng_pass.ns / 1000u, slow_us,
                 eng_is_loop ? "the progress thread" : "an application thread", eng_pass.cqes,
                 eng_pass.cms, eng_pass.jobs, (void *)eng_pass.slow_fn,
                 eng_pass.slow_fn_ns / 1000u);
}

static void (*eng_round_hook)(void); /* exs__engine_set_round_hook */

void exs__engine_set_round_hook(void (*fn)(void))
{
    __atomic_store_n(&eng_round_hook, fn, __ATOMIC_RELEASE);
}

/* One context's part of a round. */
static inline __attribute__((always_inline)) int eng_round_ctx(struct exs_prov_ctx *ctx)
{
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe[ENG_CQE_BATCH];
    int p, n = 0, c;

    /* the provider's work and its first batch of completions in one call: shm hands its
     * turn's completions over directly (spec/provider.md, "Progress and poll in one") */
    p = exs__prov_progress_poll(ctx, cqe, ENG_CQE_BATCH, &c);
    if (p > 0)
        n += p;
    else if (p < 0)
        EXS_WARN(ENG, "provider %s progress failed: %d", exs__prov_name(ctx), p);
    c = eng_hand_cq(ctx, cqe, c, ENG_DRIVE_ROUND);
    eng_pass.cqes += (unsigned)c;
    n += c;
    while (exs__prov_cm_poll(ctx, &ev) == 1) {
        c = eng_drain_cq(ctx, INT32_MAX);
        eng_pass.cqes += (unsigned)c;
        n += c;
        eng_dispatch_cm(&ev);
        eng_pass.cms++;
        n++;
    }
    return n;
}

/* A round: busy: it may skip an idle fallback context (a busy wait's, EXS_ENG_DRIVE_TRY, or
 * a waiter's before it sleeps, EXS_ENG_DRIVE_WAIT); only: the contexts it runs (bit i:
 * eng.ctxs[i], EXS_ENG_DRIVE_ONLY). Arguments, not fields: a spin turn sets and resets
 * nothing (and the loop's rounds fold them to constants). */
static inline __attribute__((always_inline)) int eng_round(int busy, unsigned only)
{
    int n = 0;
    uint64_t t0 =
        exs__params.slow_threshold_us || exs__params.polling_warn_cycle_us ? exs__now_ns() : 0;

    /* the counts; the rest only where it is measured (slow pass, slow poll: t0) */
    eng_pass.cqes = eng_pass.cms = eng_pass.jobs = 0;
    if (t0)
        eng_pass = (struct eng_pass){0};
    ENG_CNT_INC_LOCKED(exs__eng_cnt.rounds);
    void (*hook)(void);

    for (int i = 0; i < eng.nctx; i++) {
        int c;

        if (!(only & (1u << i))) {
            ENG_CNT_INC_LOCKED(exs__eng_cnt.woken_skips);
            continue;
        }
        if (eng.ctxs[i] == eng.fb && busy && eng.fb_idle >= ENG_FB_IDLE &&
            ++eng.fb_tick < eng.fb_every) {
            ENG_CNT_INC_LOCKED(exs__eng_cnt.fb_skips);
            continue;
        }
        c = eng_round_ctx(eng.ctxs[i]);
        if (eng.ctxs[i] == eng.fb) {
            if (c)
                eng.fb_every = ENG_FB_EVERY;
            else if (busy && eng.fb_idle >= ENG_FB_IDLE)
                eng.fb_every = EXS_MIN(2 * eng.fb_every, (unsigned)EXS_ENG_FB_EVERY_MAX);
            eng.fb_tick = 0;
            eng.fb_idle = c ? 0 : EXS_MIN(eng.fb_idle + 1, (uint32_t)ENG_FB_IDLE);
        }
        n += c;
    }
    n += eng_run_jobs();
    hook = __atomic_load_n(&eng_round_hook, __ATOMIC_ACQUIRE);
    /* readiness changes with what the round delivered, not with a provider's answer
     * alone (shm's idle busy turns answer "call again": eng_drain_all) */
    if (hook && eng_pass.cqes + eng_pass.cms + eng_pass.jobs > 0)
        hook();
    if (t0)
        eng_pass_end(t0);
    return n;
}

/* Rounds until one finds nothing, at most max. Returns the total; *idle_p (when given)
 * tells whether the last round found nothing, *work_p (when given) the completions,
 * connection events and jobs the rounds delivered (not the providers' own answers, which
 * may be "call again": eng_drain_all). */
static int eng_drive_locked(int max, int *idle_p, unsigned *work_p)
{
    int total = 0, n = 1;
    unsigned work = 0;

    for (int r = 0; r < max && n; r++) {
        n = eng_round(0, ~0u);
        total += n;
        work += eng_pass.cqes + eng_pass.cms + eng_pass.jobs;
    }
    if (idle_p)
        *idle_p = n == 0;
    if (work_p)
        *work_p = work;
    return total;
}

/* Arm every context (plock held): -EAGAIN as soon as one has work pending (*pend_p, when
 * given: its index), 0 when all are armed, or the first other error (logged). */
static inline __attribute__((always_inline)) int eng_arm_all(int *pend_p)
{
    int ret = 0;

    eng.armed = 1;
    for (int i = 0; i < eng.nctx; i++) {
        int r = exs__prov_arm(eng.ctxs[i]);

        if (r == -EAGAIN) {
            if (pend_p)
                *pend_p = i;
            return -EAGAIN;
        }
        if (r && !ret) {
            EXS_WARN(ENG, "provider %s arm failed: %d", exs__prov_name(eng.ctxs[i]), r);
            ret = r;
        }
    }
    return ret;
}

/* The loop thread: drive until every context is armed with nothing left. A round that
 * found nothing is the one to arm after, not a whole drive that found nothing: a
 * provider may answer "call again" (> 0) from turns that did not look at everything (the
 * shm provider's busy turns, spec/provider-shm.md) and 0 from the one that did, so a
 * drive whose earlier rounds answered > 0 can end idle. */
static void eng_drain_all(void)
{
    unsigned work;
    int idle;

    do {
        /* counted when it delivered something: shm's "call again" answers are not work
         * (counted, a wake-up of the loop made up to 8 drives of them: integ_handoff
         * busy_gaps_keep_provider over shm saw 36 drives in 60 gaps under load) */
        (void)eng_drive_locked(ENG_DRIVE_MAX, &idle, &work);
        if (work > 0)
            ENG_CNT_INC_LOCKED(exs__eng_cnt.drives_thread);
    } while (!idle || eng_arm_all(NULL) == -EAGAIN);
}

static __thread struct eng_pass eng_poll_last; /* this thread's last pass */

/* An application thread drives again: report a gap since its previous drive longer than
 * polling_warn_cycle_us (it stopped polling without sleeping in the library: its own code
 * ran that long between two calls). Also at a failed trylock: that is a poll too. */
static void eng_poll_check(void)
{
    uint64_t warn_us = __atomic_load_n(&exs__params.polling_warn_cycle_us, __ATOMIC_RELAXED);
    uint64_t now = exs__now_ns(), gap;

    if (eng_poll_end_ns && (gap = now - eng_poll_end_ns) > warn_us * 1000u)
        EXS_WARN(
            ENG,
            "slow poller: this thread drove progress again after %" PRIu64
            " us without waiting in the library (polling_warn_cycle_us %" PRIu64
            "); its previous pass ran %u completions, %u connection events, %u jobs in %" PRIu64
            " us",
            gap / 1000u, warn_us, eng_poll_last.cqes, eng_poll_last.cms, eng_poll_last.jobs,
            eng_poll_last.ns / 1000u);
    eng_poll_end_ns = now;
}

/* plock held, by an application thread about to drive: when nobody sleeps on the
 * providers' event fds (no application thread between exs__engine_arm and
 * exs__engine_arm_end, and the loop does not watch them), take back the last arm, so
 * the completions this drive queues write no event fd (spec/threading.md §3). */
static inline __attribute__((always_inline)) void eng_disarm_unwatched(void)
{
    if (!eng.armed || eng.io_on || __atomic_load_n(&eng.psleepers, __ATOMIC_SEQ_CST))
        return;
    eng.armed = 0;
    for (int i = 0; i < eng.nctx; i++)
        exs__prov_disarm(eng.ctxs[i]);
}

/* An application thread's drive, plock held (exs__engine_drive, exs__engine_arm): one
 * round. Returns how much it did. */
static inline __attribute__((always_inline)) int eng_drive_held(int flags)
{
    unsigned work = 0;
    int n;

    /* running is cleared under the lock by exs__engine_stop before the provider closes */
    eng_disarm_unwatched();
    /* One round: the caller looks at its queue next and drives again if it must; an
     * empty extra round would only cost system calls on every wake-up. */
    if (__atomic_load_n(&eng.running, __ATOMIC_RELAXED)) {
        n = eng_round((flags & (EXS_ENG_DRIVE_TRY | EXS_ENG_DRIVE_WAIT)) != 0,
                      flags & EXS_ENG_DRIVE_ONLY ? (unsigned)flags >> 8 : ~0u);
        work = eng_pass.cqes + eng_pass.cms + eng_pass.jobs;
    } else {
        n = 0;
    }
    if (work > 0) /* as drives_thread: delivered something, not only "call again" */
        ENG_CNT_INC_LOCKED(exs__eng_cnt.drives_app);
    return n;
}

int exs__engine_drive(int flags)
{
    int n;

    if (eng_holding())
        return 0; /* a dispatch on this thread is below us */
    if (!__atomic_load_n(&eng.running, __ATOMIC_ACQUIRE))
        return 0;
    if (__atomic_load_n(&exs__params.polling_warn_cycle_us, __ATOMIC_RELAXED)) {
        if (!__atomic_load_n(&eng_poll_used, __ATOMIC_RELAXED))
            __atomic_store_n(&eng_poll_used, 1, __ATOMIC_RELAXED);
        eng_poll_check();
    }
    if (flags & EXS_ENG_DRIVE_TRY) {
        if (eng_trylock())
            return -EBUSY;
    } else {
        eng_lock();
    }
    n = eng_drive_held(flags);
    if (__atomic_load_n(&eng_poll_used, __ATOMIC_RELAXED) &&
        (eng_poll_end_ns ||
         __atomic_load_n(&exs__params.polling_warn_cycle_us, __ATOMIC_RELAXED))) {
        eng_poll_last = eng_pass; /* what this thread's pass did, for its next report */
        eng_poll_end_ns = exs__now_ns();
    }
    eng_unlock();
    return n;
}

int exs__engine_arm(int fds_p[EXS_ENG_MAX_CTX])
{
    int ret, pend = -1;

    for (int i = 0; i < EXS_ENG_MAX_CTX; i++)
        fds_p[i] = -1;
    if (eng_holding() || !__atomic_load_n(&eng.running, __ATOMIC_ACQUIRE))
        return 0;
    eng_lock();
    if (!__atomic_load_n(&eng.running, __ATOMIC_RELAXED)) {
        ret = 0;
    } else if (__atomic_load_n(&eng.njobs, __ATOMIC_ACQUIRE) > 0) {
        ret = -EAGAIN;
    } else {
        ret = eng_arm_all(&pend);
        if (ret == 0) {
            /* a sleeper from now until exs__engine_arm_end: no driver disarms */
            __atomic_add_fetch(&eng.psleepers, 1, __ATOMIC_SEQ_CST);
            for (int i = 0; i < eng.nctx; i++)
                fds_p[i] = exs__prov_ctx_event_fd(eng.ctxs[i]);
            if (__atomic_load_n(&eng_poll_used, __ATOMIC_RELAXED))
                eng_poll_end_ns = 0; /* it sleeps: a wait, not a slow poll */
        }
    }
    /* Work is pending: its round now, in this hold of the lock (the caller registers as
     * its queue's sleeper only after a successful arm, so the events of this round for
     * its queue write no descriptor). A waiter arms without driving first (evq.c,
     * evq_dequeue_wait): this is its drive, one lock instead of a drive's and an arm's.
     * An idle fallback context may wait as in EXS_ENG_DRIVE_WAIT, unless it is the one
     * that answered -EAGAIN. */
    EXS_CNT_INC(exs__eng_cnt.arms);
    if (ret == -EAGAIN) {
        EXS_CNT_INC(exs__eng_cnt.arm_drives);
        (void)eng_drive_held(pend >= 0 && eng.ctxs[pend] == eng.fb ? 0 : EXS_ENG_DRIVE_WAIT);
    }
    eng_unlock();
    return ret == -EAGAIN ? -EAGAIN : 0;
}

void exs__engine_arm_end(const int fds[EXS_ENG_MAX_CTX])
{
    if (fds[0] >= 0)
        __atomic_sub_fetch(&eng.psleepers, 1, __ATOMIC_SEQ_CST);
}

void exs__engine_driver_enter(uint64_t now)
{
    if (ENG_DRIVERS(__atomic_add_fetch(&eng.drv, 1, __ATOMIC_SEQ_CST)) == 1) {
        /* back from a gap: how long the application was away (posting, or computing) */
        uint64_t lease_ns = (uint64_t)exs__params.lease_us * 1000u;
        uint64_t gap;

        uint64_t left = __atomic_load_n(&eng.leave_at, __ATOMIC_RELAXED);

        if (!now)
            now = exs__now_ns();
        gap = eng_stamp_ns(left, eng_stamp());
        /* a longer gap is the application computing: not remembered (nor compared) */
        /* a gap with posts that ended in this wait: the application comes back (a gap
         * of a lease or less tells nothing: the next wait of a batch, a ping-pong) */
        if (gap > lease_ns) {
            int posted = __atomic_exchange_n(&exs__eng_posted, 0, __ATOMIC_RELAXED) ||
                         __atomic_load_n(&eng.post_seen_at, __ATOMIC_RELAXED) > left;

            __atomic_store_n(&eng.post_back,
                             posted && gap <= (uint64_t)EXS_ENG_POST_LEASES * lease_ns,
                             __ATOMIC_RELAXED);
        }
        if (gap <= (uint64_t)EXS_ENG_HYST_LEASES * lease_ns &&
            gap >= exs__engine_gap_now(__atomic_load_n(&eng.gap_ns, __ATOMIC_RELAXED),
                                       __atomic_load_n(&eng.gap_at, __ATOMIC_RELAXED), now,
                                       lease_ns)) {
            __atomic_store_n(&eng.gap_ns, gap, __ATOMIC_RELAXED);
            __atomic_store_n(&eng.gap_at, now, __ATOMIC_RELAXED);
        }
    }
}

void exs__engine_driver_leave(void)
{
    /* No wake-up while the lease runs: the loop looks within one lease. After a long
     * wait the lease was stopped (eng_lease_cb): the last driver out wakes the loop. */
    __atomic_store_n(&eng.leave_at, eng_stamp(), __ATOMIC_RELAXED);
    if (ENG_DRIVERS(__atomic_add_fetch(&eng.drv, ENG_LEAVE, __ATOMIC_SEQ_CST)) == 0 &&
        __atomic_load_n(&eng.lease_idle, __ATOMIC_SEQ_CST) &&
        __atomic_exchange_n(&eng.lease_idle, 0, __ATOMIC_SEQ_CST)) {
        /* a wait that exs_fini ended (a synchronous exs_poll) may leave after the loop
         * is gone: eng.loop is cleared under eng.lock before it is destroyed */
        EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
        if (eng.loop)
            eng_async_send();
        EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
    }
}

/* For tests: a field the loop changes under the progress lock. */
static unsigned eng_read_plocked(const unsigned *field)
{
    unsigned v;

    eng_lock();
    v = *field;
    eng_unlock();
    return v;
}

unsigned exs__engine_fb_every(void)
{
    return eng_read_plocked(&eng.fb_every);
}

unsigned exs__engine_lease_mult(void)
{
    return eng_read_plocked(&eng.lease_mult);
}

/* ---- the loop thread ---- */

static void eng_prov_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    eng_drain_all();
}

static void eng_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
    uint64_t t0 = exs__params.slow_threshold_us ? exs__now_ns() : 0;

    (void)w;
    (void)revents;
    eng_pass = (struct eng_pass){0};
    eng_run_jobs();
    eng_pass_end(t0);
    if (eng.io_on)
        eng_drain_all();
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    int stop = eng.stopping && exs_list_empty(&eng.jobs);
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
    if (stop)
        ev_break(loop, EVBREAK_ALL);
}

/* How long after the last leave the loop still leaves the provider to the drivers, now
 * (exs__engine_hyst_ns of the remembered gap as it is worth now). */
static uint64_t eng_hyst_now(uint64_t now, uint64_t lease_ns)
{
    return exs__engine_hyst_ns(exs__engine_gap_now(__atomic_load_n(&eng.gap_ns, __ATOMIC_RELAXED),
                                                   __atomic_load_n(&eng.gap_at, __ATOMIC_RELAXED),
                                                   now, lease_ns),
                               lease_ns);
}

/* (Re)start the lease: first look after `after` seconds, then every period. */
static void eng_lease_start(struct ev_loop *loop, double after)
{
    double period = (double)exs__params.lease_us * eng.lease_mult / 1e6;

    if (ev_is_active(&eng.lease))
        ev_timer_stop(loop, &eng.lease);
    ev_timer_set(&eng.lease, after > 0 ? after : period, period);
    ev_timer_start(loop, &eng.lease);
}

/* The lease: a periodic look at the drivers while they drive. When no driver left during
 * a whole lease, the same threads are still waiting (an idle server in exs_qdequeue):
 * stop the lease instead of waking every lease_us, and let the last driver to leave wake
 * the loop (exs__engine_driver_leave). The two sides publish, then look (sequentially
 * consistent), so either the loop sees the leave or the leaver sees lease_idle.
 * While the drivers keep coming and going (a ping-pong), each look that finds one
 * driving doubles the period, up to EXS_ENG_LEASE_GROW leases: every look costs the
 * drivers a wake-up and a turn of the progress lock. A look that finds them all gone
 * but recently (within the hysteresis) comes again when the hysteresis ends, at least
 * one lease later, so the take-over still comes within nine leases of the last leave. */
static void eng_lease_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    uint64_t drv = __atomic_load_n(&eng.drv, __ATOMIC_SEQ_CST);
    unsigned gen = ENG_LEAVE_GEN(drv);
    int drivers = ENG_DRIVERS(drv);
    int moved = gen != eng.seen_gen;

    (void)revents;
    EXS_CNT_INC(exs__eng_cnt.lease_fires);
    if (drivers > 0 && !moved && !exs__params.test_engine_park) {
        __atomic_store_n(&eng.lease_idle, 1, __ATOMIC_SEQ_CST);
        drv = __atomic_load_n(&eng.drv, __ATOMIC_SEQ_CST);
        if (ENG_DRIVERS(drv) > 0 && ENG_LEAVE_GEN(drv) == gen) {
            ev_timer_stop(loop, w);
            eng.lease_mult = 1;
            EXS_CNT_INC(exs__eng_cnt.lease_idles);
            return;
        }
        __atomic_store_n(&eng.lease_idle, 0, __ATOMIC_SEQ_CST);
    }
    eng.seen_gen = gen;
    /* An application that posted since the previous look is around as well (a posting
     * sender: eng_prepare_cb holds the provider for it): its looks grow the period too, or
     * the progress thread would wake every lease for nothing (the guest's 64 KiB sender:
     * 0.9 lease wake-ups per message). The flag is left for eng_prepare_cb, which runs
     * next. */
    if ((drivers > 0 && moved) ||
        (drivers == 0 && __atomic_load_n(&eng.post_back, __ATOMIC_RELAXED) &&
         __atomic_load_n(&exs__eng_posted, __ATOMIC_RELAXED))) {
        unsigned m = exs__engine_lease_grow(eng.lease_mult);

        if (m != eng.lease_mult) {
            eng.lease_mult = m;
            EXS_CNT_INC(exs__eng_cnt.lease_grows);
            eng_lease_start(loop, 0);
        }
    } else if (drivers == 0 && eng.lease_mult > 1) {
        /* all gone: look again when the hysteresis ends (eng_prepare_cb decides), not
         * a whole grown period later */
        uint64_t lease_ns = (uint64_t)exs__params.lease_us * 1000u;
        uint64_t now = exs__now_ns();
        uint64_t since =
            eng_stamp_ns(__atomic_load_n(&eng.leave_at, __ATOMIC_RELAXED), eng_stamp());
        uint64_t hyst = eng_hyst_now(now, lease_ns);

        if (since < hyst)
            eng_lease_start(loop, (double)exs__engine_lease_after(hyst - since, lease_ns) / 1e9);
    }
    /* eng_prepare_cb, which runs next, decides who watches the provider. */
}

int exs__eng_posted;

/* The loop: an application thread posted since the last call (and clear that). */
static inline int eng_posted_take(void)
{
    return __atomic_load_n(&exs__eng_posted, __ATOMIC_RELAXED) &&
           __atomic_exchange_n(&exs__eng_posted, 0, __ATOMIC_RELAXED);
}

/* Before every blocking poll, plock held: watch the provider only while no application
 * thread drives (or posts between its waits); take it back (and drain at once) when the
 * last one left. */
static void eng_prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
    int drivers = ENG_DRIVERS(__atomic_load_n(&eng.drv, __ATOMIC_SEQ_CST));
    uint64_t lease_ns = (uint64_t)exs__params.lease_us * 1000u;
    /* Hysteresis: take the provider back only after a whole lease without a driver, so
     * an application that leaves exs_qdequeue for a moment (a ping-pong posting its
     * reply) keeps driving alone; longer (twice its usual gap, at most
     * EXS_ENG_HYST_LEASES leases) for one that stays away for milliseconds posting
     * (a sender whose posts copy megabytes into the socket): a take-over then only
     * fights it for the locks and writes the socket from a second CPU. */
    uint64_t now = exs__now_ns();
    uint64_t hyst = eng_hyst_now(now, lease_ns);
    uint64_t st = eng_stamp();
    uint64_t since = eng_stamp_ns(__atomic_load_n(&eng.leave_at, __ATOMIC_RELAXED), st);
    int recent = since < hyst;

    (void)w;
    (void)revents;
    /* An application thread that posted since the loop's last look, and whose last such
     * gap ended in a wait (post_back), is between two of its waits, not computing: it
     * comes back to drive (a sender posting a batch after each wait, its posts slow: the
     * Soft-RoCE guest's 64 KiB writes, ~1 ms each, spec/rxe-vm.md). For at most
     * EXS_ENG_POST_LEASES leases since its last wait: one that posts and never waits
     * still gets its completions driven. */
    if (!recent && drivers == 0 && __atomic_load_n(&eng.post_back, __ATOMIC_RELAXED)) {
        if (eng_posted_take())
            __atomic_store_n(&eng.post_seen_at, st, __ATOMIC_RELAXED);
        if (exs__engine_post_hold(
                since, eng_stamp_ns(__atomic_load_n(&eng.post_seen_at, __ATOMIC_RELAXED), st),
                lease_ns)) {
            recent = 1;
            EXS_CNT_INC(exs__eng_cnt.post_holds);
        }
    }
    if (drivers > 0 || recent || exs__params.test_engine_park) {
        if (eng.io_on) {
            ev_io_stop(loop, &eng.prov_io);
            if (eng.fb)
                ev_io_stop(loop, &eng.fb_io);
            eng.io_on = 0;
        }
        if (!ev_is_active(&eng.lease) && !__atomic_load_n(&eng.lease_idle, __ATOMIC_SEQ_CST))
            eng_lease_start(loop, 0);
        return;
    }
    if (ev_is_active(&eng.lease))
        ev_timer_stop(loop, &eng.lease);
    eng.lease_mult = 1;
    if (!eng.io_on) {
        ev_io_start(loop, &eng.prov_io);
        if (eng.fb)
            ev_io_start(loop, &eng.fb_io);
        eng.io_on = 1;
        EXS_CNT_INC(exs__eng_cnt.lease_handoffs);
        /* Drivers may have left work (or not armed): finish it and arm. */
        eng_drain_all();
    }
}

static void *eng_main(void *arg)
{
    (void)arg;
    eng_is_loop = 1;
    eng_lock();
    ev_run(eng.loop, 0);
    eng_unlock();
    return NULL;
}

static int eng_open(int (*open_ctx)(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p),
                    struct exs_prov_ctx **ctx_p, int *manual_p)
{
    int ret;

    ret = open_ctx(&(struct exs_prov_attr){.flags = EXS_PROV_ATTR_MANUAL_PROGRESS}, ctx_p);
    if (ret == 0) {
        *manual_p = 1;
        return 0;
    }
    if (ret != -EOPNOTSUPP && ret != -EINVAL)
        return ret;
    EXS_INFO(ENG, "provider refused manual progress (%d): its own threads move data", ret);
    *manual_p = 0;
    return open_ctx(&(struct exs_prov_attr){0}, ctx_p);
}

/* Open the fallback context when the policy asks for one. It is opened here, not at the
 * first failed connect: a waiter that armed and went to sleep before it existed would
 * not watch its event fd, and could sleep through its work. A failure leaves the
 * process without fallback (logged), not without the primary. */
static void eng_fb_open(void)
{
    int manual, ret;

    eng.fb_policy = exs__engine_fb_policy_for(exs__prov_name(eng.ctx));
    if (eng.fb_policy == EXS_ENG_FB_OFF && exs__engine_shm_wanted(exs__prov_name(eng.ctx))) {
        /* shm chosen by itself (spec/provider-shm.md): beside a tcp primary, whose peers
         * on this host would otherwise talk over loopback TCP */
        ret = eng_open(exs__prov_open_shm, &eng.fb, &manual);
        if (ret) {
            EXS_INFO(ENG, "shm provider: open failed (%s); connections stay on tcp",
                     strerror(-ret));
            eng.fb = NULL;
            return;
        }
        eng.fb_policy = EXS_ENG_FB_SHM;
        eng.ctxs[eng.nctx++] = eng.fb;
        EXS_INFO(ENG, "shm provider opened beside tcp (%s progress, policy %s)",
                 manual ? "manual" : "provider-thread", exs__params.shm);
        return;
    }
    if (eng.fb_policy == EXS_ENG_FB_OFF)
        return;
    ret = eng_open(exs__prov_open_fallback, &eng.fb, &manual);
    if (ret) {
        EXS_WARN(ENG, "fallback provider tcp: open failed (%s); no fallback", strerror(-ret));
        eng.fb = NULL;
        eng.fb_policy = EXS_ENG_FB_OFF;
        return;
    }
    eng.ctxs[eng.nctx++] = eng.fb;
    EXS_INFO(ENG, "fallback provider tcp opened (%s progress, policy %s, port offset %" PRIu64 ")",
             manual ? "manual" : "provider-thread",
             eng.fb_policy == EXS_ENG_FB_ANY ? "any" : "connect", exs__params.fallback_port_offset);
}

int exs__engine_fallback_policy(void)
{
    return eng.fb_policy;
}

static void eng_close_ctxs(void)
{
    if (eng.fb)
        exs__prov_ctx_close(eng.fb);
    exs__prov_ctx_close(eng.ctx);
    eng.fb = eng.ctx = NULL;
    eng.ctxs[0] = eng.ctxs[1] = NULL;
    eng.nctx = 0;
    eng.fb_policy = EXS_ENG_FB_OFF;
}

int exs__engine_start(void)
{
    int ret;

    exs__engine_clock_init();
    exs_list_init(&eng.jobs);
    eng.njobs = 0;
    __atomic_store_n(&eng.gap_ns, 0, __ATOMIC_RELAXED); /* no gap remembered from a previous run */
    __atomic_store_n(&eng.post_back, 0, __ATOMIC_RELAXED);
    ret = eng_open(exs__prov_open_default, &eng.ctx, &eng.manual);
    if (ret)
        return ret;
    eng.ctxs[0] = eng.ctx;
    eng.nctx = 1;
    eng_fb_open();
    eng.loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOSIGMASK);
    if (!eng.loop) {
        ret = -ENOMEM;
        goto err_close;
    }
    ev_set_loop_release_cb(eng.loop, eng_loop_release, eng_loop_acquire);
    ev_io_init(&eng.prov_io, eng_prov_cb, exs__prov_ctx_event_fd(eng.ctx), EV_READ);
    if (eng.fb)
        ev_io_init(&eng.fb_io, eng_prov_cb, exs__prov_ctx_event_fd(eng.fb), EV_READ);
    ev_async_init(&eng.wake, eng_async_cb);
    ev_async_start(eng.loop, &eng.wake);
    ev_prepare_init(&eng.prep, eng_prepare_cb);
    ev_prepare_start(eng.loop, &eng.prep);
    ev_timer_init(&eng.lease, eng_lease_cb, 0., 0.);
    eng.lease_mult = 1;
    eng.fb_every = ENG_FB_EVERY;
    eng.io_on = 0; /* the first prepare starts it and drains */
    eng.loop_dirty = 0;
    eng.stopping = 0;
    __atomic_store_n(&eng.running, 1, __ATOMIC_RELEASE);
    ret = exs__thread_create(&eng.thread, "exs-progress", eng_main, NULL);
    if (ret)
        goto err_loop;
    exs__counters_register(&eng_cset);
    exs__counters_register(&eng_fb_cset);
    EXS_INFO(ENG, "engine started on provider %s (%s progress)", exs__prov_name(eng.ctx),
             eng.manual ? "manual" : "provider-thread");
    return 0;

err_loop:
    __atomic_store_n(&eng.running, 0, __ATOMIC_RELEASE);
    ev_loop_destroy(eng.loop);
    eng.loop = NULL;
err_close:
    eng_close_ctxs();
    return ret;
}

void exs__engine_stop(void)
{
    if (!__atomic_load_n(&eng.running, __ATOMIC_ACQUIRE))
        return;
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    eng.stopping = 1;
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
    eng_async_send();
    pthread_join(eng.thread, NULL); /* nocancel: ok (exs_fini: cancellation off) */
    exs__counters_unregister(&eng_cset);
    exs__counters_unregister(&eng_fb_cset);
    eng_lock();
    while (eng_run_jobs() > 0)
        ;
    __atomic_store_n(&eng.running, 0, __ATOMIC_RELEASE);
    eng.loop_dirty = 0;
    eng_unlock();
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    struct ev_loop *loop = eng.loop;

    eng.loop = NULL; /* a driver leaving late finds no loop to wake */
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
    ev_loop_destroy(loop);
    eng_close_ctxs();
}

void exs__engine_post(struct exs_job *job)
{
    EXS_MUTEX_LOCK(&eng.lock, EXS_LOCK_LEAF);
    EXS_ASSERT(!job->queued);
    job->queued = 1;
    exs_list_add_tail(&eng.jobs, &job->link);
    __atomic_add_fetch(&eng.njobs, 1, __ATOMIC_RELEASE);
    /* a call racing exs_fini (another thread of a process that exits) may post after the
     * engine stopped: eng.loop is cleared under eng.lock before it is destroyed, and the
     * job then never runs */
    if (eng.loop)
        eng_async_send();
    EXS_MUTEX_UNLOCK(&eng.lock, EXS_LOCK_LEAF);
}

struct eng_call {
    struct exs_job job;
    void (*fn)(void *arg);
    void *arg;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
};

static void eng_call_job(struct exs_job *job)
{
    struct eng_call *c = exs_container_of(job, struct eng_call, job);

    c->fn(c->arg);
    pthread_mutex_lock(&c->lock);
    c->done = 1;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void exs__engine_call(void (*fn)(void *arg), void *arg)
{
    struct eng_call c = {.job = {.fn = eng_call_job}, .fn = fn, .arg = arg};
    int cs = exs__nc_begin(); /* the job names c, on this stack: no cancel in the wait */

    EXS_ASSERT(!eng_holding());
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cond, NULL);
    exs__engine_post(&c.job);
    pthread_mutex_lock(&c.lock);
    while (!c.done)
        pthread_cond_wait(&c.cond, &c.lock); /* nocancel: ok (off) */
    pthread_mutex_unlock(&c.lock);
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.lock);
    exs__nc_end(cs);
}

static void eng_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct exs_eng_timer *t = exs_container_of(w, struct exs_eng_timer, w);

    (void)loop;
    (void)revents;
    t->cb(t);
}

void exs__engine_timer_start(struct exs_eng_timer *t, uint64_t ms,
                             void (*cb)(struct exs_eng_timer *t))
{
    EXS_ASSERT(eng_holding());
    t->cb = cb;
    /* The loop's notion of now is its last wake-up: while it slept (or another thread
     * drove), it fell behind, and a timer set from it would fire that much early (a
     * 500 ms close timeout was seen to end after 434 ms). Read the clock first. */
    ev_now_update(eng.loop);
    ev_timer_init(&t->w, eng_timer_cb, (double)ms / 1000.0, 0.);
    ev_timer_start(eng.loop, &t->w);
    eng.loop_dirty = 1;
}

void exs__engine_timer_stop(struct exs_eng_timer *t)
{
    EXS_ASSERT(eng_holding());
    if (t->cb) {
        ev_timer_stop(eng.loop, &t->w);
        eng.loop_dirty = 1;
    }
}

static void eng_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct exs_eng_io *io = exs_container_of(w, struct exs_eng_io, w);

    (void)loop;
    io->cb(io, revents);
}

void exs__engine_io_start(struct exs_eng_io *io, int fd, int events,
                          void (*cb)(struct exs_eng_io *io, int revents))
{
    EXS_ASSERT(eng_holding());
    if (io->cb && ev_is_active(&io->w))
        ev_io_stop(eng.loop, &io->w);
    io->cb = cb;
    ev_io_init(&io->w, eng_io_cb, fd, events);
    ev_io_start(eng.loop, &io->w);
    eng.loop_dirty = 1;
}

void exs__engine_io_stop(struct exs_eng_io *io)
{
    EXS_ASSERT(eng_holding());
    if (io->cb && ev_is_active(&io->w)) {
        ev_io_stop(eng.loop, &io->w);
        eng.loop_dirty = 1;
    }
}

/* ---- fork (exs/api/fork.c, spec/threading.md §8) ---- */

static int eng_fork_held; /* PREPARE took the progress lock and the contexts' */

void exs__engine_fork(int phase)
{
    if (phase == EXS_FORK_PREPARE) {
        if (!__atomic_load_n(&eng.running, __ATOMIC_ACQUIRE) || eng_holding())
            return;
        __atomic_store_n(&eng_fork_want, 1, __ATOMIC_RELAXED);
        eng_lock();
        __atomic_store_n(&eng_fork_want, 0, __ATOMIC_RELAXED);
        for (int i = 0; i < eng.nctx; i++)
            exs__prov_ctx_fork(eng.ctxs[i], EXS_FORK_PREPARE);
        eng_fork_held = 1;
        return;
    }
    if (!eng_fork_held)
        return;
    eng_fork_held = 0;
    for (int i = eng.nctx - 1; i >= 0; i--)
        exs__prov_ctx_fork(eng.ctxs[i], phase);
    if (phase == EXS_FORK_PARENT) {
        eng_unlock();
        return;
    }
    /* The child: the progress thread and the providers' threads are not there, the loop
     * and the contexts are the parent's (their descriptors shared with it): the
     * contexts closed their copies above; the loop's own epoll set and wake-up eventfd
     * (libev does not tell their numbers) stay open, unused: they hold none of the
     * parent's connections and are never written here. Nothing of it is touched again:
     * the next exs_init starts a new engine. */
    exs__counters_unregister(&eng_cset);
    exs__counters_unregister(&eng_fb_cset);
    exs__forsake(eng.loop);
    for (int i = 0; i < eng.nctx; i++)
        exs__forsake(eng.ctxs[i]);
    /* a new progress lock (the parent's thread id held it), nothing woken */
    eng.loop_dirty = 0;
    /* this thread is the parent's forking thread (the same pthread_self) */
    __atomic_store_n(&eng.holder, (pthread_t)0, __ATOMIC_RELAXED);
    __atomic_store_n(&eng.plock.v, 0, __ATOMIC_RELEASE);
    EXS_LOCK_RELEASE(EXS_LOCK_PROGRESS);
    eng.ctx = eng.fb = NULL;
    eng.ctxs[0] = eng.ctxs[1] = NULL;
    eng.nctx = 0;
    eng.fb_policy = EXS_ENG_FB_OFF;
    eng.loop = NULL;
    pthread_mutex_init(&eng.lock, NULL); /* a thread of the parent may have held it */
    exs_list_init(&eng.jobs);
    eng.stopping = eng.manual = eng.lease_idle = eng.io_on = 0;
    eng.drv = 0;
    eng.post_back = 0;
    eng.psleepers = eng.armed = eng.njobs = 0;
    eng.seen_gen = 0;
    eng.lease_mult = 1;
    eng.leave_at = eng.gap_ns = eng.gap_at = eng.post_seen_at = 0;
    __atomic_store_n(&eng.running, 0, __ATOMIC_RELEASE);
    eng_pass = (struct eng_pass){0};
    eng_poll_end_ns = 0;
    memset(&exs__eng_cnt, 0, sizeof(exs__eng_cnt));
    memset(&exs__eng_fb_cnt, 0, sizeof(exs__eng_fb_cnt));
}
