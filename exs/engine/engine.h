/* SPDX-License-Identifier: MIT */
/* The engine: the provider contexts (primary, fallback), the progress lock, and a progress thread
 * running a libev loop. */
#ifndef EXS_ENGINE_ENGINE_H
#define EXS_ENGINE_ENGINE_H

#include <ev.h>
#include <stdint.h>

#include "exs/proto/proto.h"
#include "exs/prov/prov.h"
#include "exs/util/counters.h"
#include "exs/util/job.h"

/*
 * Progress is a role held through the progress lock (spec/threading.md): its holder
 * drains the provider's completion and connection event queues, handing each completion
 * to its connection (exs__conn_on_cqe) and each connection event to its connection or
 * listener, and runs jobs other threads queue. Application threads that wait
 * (exs_qdequeue, synchronous calls) take it and drive; the progress thread (a libev
 * loop) takes it outside its blocking poll, and watches the provider only while no
 * application thread is waiting. Everything that frees a connection or a listener runs
 * under it, so no provider event can name a freed object. "On the progress thread" in
 * comments means "with the progress lock held".
 */

/* Engine counters (set "engine"), relaxed atomic increments. */
struct exs_eng_counters {
    uint64_t drives_app;     /* drives by application threads that found work */
    uint64_t drives_thread;  /* drives by the progress thread that found work */
    uint64_t lease_handoffs; /* the progress thread took the provider back */
    uint64_t lease_idles;    /* leases stopped: the same drivers waited a whole lease */
    uint64_t lease_fires;    /* the lease woke the progress thread */
    uint64_t lease_grows;    /* the lease's period doubled: the drivers kept coming back */
    uint64_t evq_fd_writes;  /* event queue eventfd writes (api/evq.c) */
    uint64_t spin_yields;    /* busy waiters that gave the progress lock's holder their CPU */
    uint64_t spin_waits;     /* ... whose yields did not: they slept on the progress lock */
    uint64_t woken_skips;    /* contexts a woken waiter's drive left out (fd not readable) */
    uint64_t arms;           /* exs__engine_arm calls: a waiter's look before it sleeps */
    uint64_t arm_drives;     /* of those: work was pending, its round ran in the same hold */
    uint64_t wake_drives;    /* sleeping waiters woken by a provider's event fd, then drove */
    uint64_t rounds;         /* progress rounds, also empty ones */
    /* listeners (api/sock.c, spec/api.md exs_listen) */
    uint64_t listen_deferred;       /* connection requests that waited for room */
    uint64_t listen_defer_timeouts; /* ... refused (reason 3) after waiting their limit */
    uint64_t listen_defer_full;     /* requests refused (reason 3) at once: too many waiting */
    uint64_t listen_pauses;         /* provider listeners told to stop taking requests */
    uint64_t fb_skips;   /* busy rounds that left the idle fallback context for a later one */
    uint64_t post_holds; /* the progress thread's looks that left the provider to a poster */
};
extern struct exs_eng_counters exs__eng_cnt;

/* Fallback counters (set "fallback"), spec/provider.md. */
struct exs_eng_fb_counters {
    uint64_t fallback_connects;    /* failed primary connects retried over the fallback */
    uint64_t fallback_refused;     /* ... because refused */
    uint64_t fallback_unreachable; /* ... unreachable, no route */
    uint64_t fallback_timeout;     /* ... timed out */
    uint64_t fallback_addr;        /* ... address error */
    uint64_t fallback_listens;     /* listeners on the fallback context too */
};
extern struct exs_eng_fb_counters exs__eng_fb_cnt;

/* Provider contexts: the primary, and the fallback (tcp) when the policy opened one. */
#define EXS_ENG_MAX_CTX 2

/* A listening endpoint owned by the api layer: on the primary context, and on the
 * fallback context too when there is one (at the primary's port + fallback_port_offset). */
struct exs_eng_listener {
    struct exs_prov_listener *pl;
    struct exs_prov_listener *pl_fb;
    /* progress thread: a connection request (ev->req, peer address, private data) of
     * either listener (ev->listener->ctx: the context to accept it on); accepts or
     * rejects ev->req, now or later (the request stays valid until then, or until the
     * listener is destroyed: spec/provider.md, Connection management) */
    void (*on_request)(struct exs_eng_listener *lis, const struct exs_prov_cm_event *ev);
};

/* Open the provider and start the progress thread. Errors: provider errors, -ENOMEM. */
int exs__engine_start(void);
/* Stop the thread and close the provider (every conn and listener must be gone). */
void exs__engine_stop(void);
struct exs_prov_ctx *exs__engine_ctx(void);
/* fork(2) (exs/api/fork.c; phase: enum exs_fork_phase), init_lock held. PREPARE: take the
 * progress lock and each context's fork locks (exs__prov_ctx_fork); PARENT: release them.
 * CHILD: every context closes its descriptors, and the engine forgets the parent's
 * (not running: exs_init starts a new one). Nothing when the engine was not running. */
void exs__engine_fork(int phase);

/* ---- RDMA-to-TCP fallback (spec/provider.md, Fallback) ----
 * The policy (tunable fallback, read at start): */
enum { EXS_ENG_FB_OFF = 0, EXS_ENG_FB_CONNECT, EXS_ENG_FB_ANY, EXS_ENG_FB_SHM };
/* EXS_ENG_FB_SHM: the second context is the shm provider's, beside a tcp primary
 * (EXS_SHM, spec/provider-shm.md, Chosen by itself): connections switch to it on one host,
 * never on a failure, and no failed connect is retried over it. */
int exs__engine_fallback_policy(void);
/* The fallback (tcp) context, or NULL when the policy opened none. */
struct exs_prov_ctx *exs__engine_fallback_ctx(void);
/* 1 when a connect on ctx that failed with errno err is to be retried over the fallback:
 * there is one, ctx is not it, and err is refused, unreachable, timed out or an address
 * error. */
int exs__engine_fallback_eligible(const struct exs_prov_ctx *ctx, int err);
/* Count a connect retried over the fallback (and its reason), log it (info) for socket
 * fd: addr is the address the primary failed to reach. */
void exs__engine_fallback_note(int err, const struct sockaddr *addr, int sock_fd);
/* addr with its port moved by fallback_port_offset: where the peer's fallback listener
 * is. Errors: -EINVAL, -EAFNOSUPPORT, -EADDRNOTAVAIL (past 65535). */
int exs__engine_fallback_addr(const struct sockaddr *addr, socklen_t addrlen,
                              struct sockaddr_storage *out_p, socklen_t *outlen_p);

/* Run job->fn(job) on the progress thread soon (from any thread, also from the progress
 * thread itself: then after the current dispatch). Cannot fail: the job lives in the
 * object it works on (exs/util/job.h); it must not be queued already. */
void exs__engine_post(struct exs_job *job);
/* Run fn(arg) on the progress thread and wait for it (not from the progress thread). */
void exs__engine_call(void (*fn)(void *arg), void *arg);
/* 1 when this thread holds the progress lock. */
int exs__engine_on_thread(void);
/* 1 when the provider was opened with EXS_PROV_ATTR_MANUAL_PROGRESS. */
int exs__engine_manual(void);

/* Drive progress from an application thread: take the progress lock (with
 * EXS_ENG_DRIVE_TRY only if free), run the provider, completions, cm events and jobs
 * until nothing is left or a bound is reached, release. Returns how much it did (>= 0),
 * or -EBUSY (TRY and another thread holds the lock: it is driving). Returns 0 at once
 * when the engine is not running or this thread already holds the lock. Never waits
 * for a remote, only for another holder's turn. */
#define EXS_ENG_DRIVE_TRY    1
/* A waiter woken from its sleep on the event fds of exs__engine_arm: drive only the
 * contexts whose fd was readable, EXS_ENG_DRIVE_CTX(i) for the i-th fd (the others were
 * armed with nothing pending and have not signalled since: a round of theirs would find
 * nothing, at the cost of a system call on tcp's, epoll_wait). */
#define EXS_ENG_DRIVE_ONLY   2
/* A waiter's drive outside a spin (EXS_WAIT_NOTIFY, ADAPTIVE after its spin: its first
 * look when its events are already queued, and the round of an arm that found work): it
 * may skip an idle fallback context as a busy wait's rounds do (the next arm looks at
 * every context; exs__engine_arm never skips the context that answered -EAGAIN). */
#define EXS_ENG_DRIVE_WAIT   4
#define EXS_ENG_DRIVE_CTX(i) (1 << (8 + (i)))
int exs__engine_drive(int flags);
/* Before a waiter sleeps: under the progress lock, arm every provider context. 0: sleep
 * on fds_p (each context's event fd, readable when it has work; -1 for none, all -1 when
 * the engine is not running); -EAGAIN: work was pending (completions or jobs) and one
 * round of progress ran in the same hold of the lock (as exs__engine_drive with
 * EXS_ENG_DRIVE_WAIT, the context that had the work always included): look at the queue,
 * then arm again. The caller must not be a sleeper on its queue yet. */
int exs__engine_arm(int fds_p[EXS_ENG_MAX_CTX]);
/* The caller of a successful exs__engine_arm (fds[0] >= 0) stopped sleeping on the fds. */
void exs__engine_arm_end(const int fds[EXS_ENG_MAX_CTX]);
/* Count the application threads inside a wait (they drive, so the progress thread
 * stops watching the provider until they are all gone for one lease). now: the clock
 * the caller read as its wait began (0: not read; the engine reads it if it needs it). */
void exs__engine_driver_enter(uint64_t now);
void exs__engine_driver_leave(void);
/* The clock of the drivers' leave stamps (engine.c, "the leave stamp's clock"): the TSC
 * where the kernel's clock source is (exs__engine_clock_tsc 1 once exs__engine_clock_init,
 * called by exs__engine_start, measured its rate), else CLOCK_MONOTONIC ns. For tests:
 * a stamp, and the ns between two. */
void exs__engine_clock_init(void);
int exs__engine_clock_tsc(void);
uint64_t exs__engine_stamp(void);
uint64_t exs__engine_stamp_ns(uint64_t from, uint64_t to);

/* The hand-off's hysteresis (spec/threading.md §4), pure functions. A busy
 * application's longest recent gap between two waits (drivers back from 0; gaps longer
 * than EXS_ENG_HYST_LEASES leases are the application computing and are not noted) is
 * remembered with the time it was noted; exs__engine_gap_now: what it is worth now (it
 * halves every EXS_ENG_HYST_LEASES leases since; inline: every wait's entry asks).
 * exs__engine_hyst_ns: how long after
 * the last driver left the progress thread still leaves the provider to the application:
 * one lease, or twice that gap, at most EXS_ENG_HYST_LEASES leases. */
#define EXS_ENG_HYST_LEASES 8
static inline uint64_t exs__engine_gap_now(uint64_t gap_ns, uint64_t at_ns, uint64_t now_ns,
                                           uint64_t lease_ns)
{
    uint64_t halvings = lease_ns ? (now_ns - at_ns) / (EXS_ENG_HYST_LEASES * lease_ns) : 64;

    return halvings >= 64 ? 0 : gap_ns >> halvings;
}
uint64_t exs__engine_hyst_ns(uint64_t remembered_ns, uint64_t lease_ns);
/* An application thread posted an operation (api/xfer.c, after a successful post): it is
 * between two of its waits, and the progress thread leaves the provider to it past the
 * hysteresis, for at most EXS_ENG_POST_LEASES leases since its last wait
 * (spec/threading.md §4, "Posting applications"). One relaxed load per post, a store
 * only when the progress thread cleared the flag since. */
#define EXS_ENG_POST_LEASES 32
/* The rule, pure: since_ns since the application's last wait, its last post seen
 * post_ago_ns ago (within a lease: the progress thread may look more often than it
 * posts); 1: the progress thread still leaves it the provider. */
static inline int exs__engine_post_hold(uint64_t since_ns, uint64_t post_ago_ns, uint64_t lease_ns)
{
    return since_ns < (uint64_t)EXS_ENG_POST_LEASES * lease_ns && post_ago_ns < lease_ns;
}
extern int exs__eng_posted;
static inline void exs__engine_posted(void)
{
    if (!__atomic_load_n(&exs__eng_posted, __ATOMIC_RELAXED))
        __atomic_store_n(&exs__eng_posted, 1, __ATOMIC_RELAXED);
}
/* The lease's growth (spec/threading.md §4): while the drivers keep coming and going, the
 * period doubles at each look, up to EXS_ENG_LEASE_GROW leases; exs__engine_lease_grow:
 * the next period's multiple. exs__engine_lease_after: when to look again once they are
 * all gone, hyst_left before the hysteresis ends: then, but at least one lease later and
 * at most EXS_ENG_HYST_LEASES leases. */
#define EXS_ENG_LEASE_GROW 8
unsigned exs__engine_lease_grow(unsigned mult);
uint64_t exs__engine_lease_after(uint64_t hyst_left_ns, uint64_t lease_ns);
/* A busy wait looks at an idle fallback context at most every this many rounds (the
 * interval doubles per idle look from 16, engine.c). For tests: the interval now. */
#define EXS_ENG_FB_EVERY_MAX 256
unsigned exs__engine_fb_every(void);
/* For tests: the lease's period now, in leases (1 .. EXS_ENG_LEASE_GROW). */
unsigned exs__engine_lease_mult(void);
/* engine_policy.c: the fallback policy (EXS_ENG_FB_*) for primary provider name (spec/provider.md,
 * Fallback), and whether the shm provider is opened beside it (spec/provider-shm.md). */
int exs__engine_fb_policy_for(const char *primary);
int exs__engine_shm_wanted(const char *primary);

/* A function the progress lock's holder calls after each round of progress that did
 * something (completions, connection events, jobs): readiness may have changed
 * (exs_poll, api/poll.c). Set once; NULL: none. It must not drive. */
void exs__engine_set_round_hook(void (*fn)(void));

/* A one-shot timer of the progress loop. Start and stop with the progress lock held
 * (from a job or a callback); cb runs on the progress thread. */
struct exs_eng_timer {
    ev_timer w;
    void (*cb)(struct exs_eng_timer *t);
};
void exs__engine_timer_start(struct exs_eng_timer *t, uint64_t ms,
                             void (*cb)(struct exs_eng_timer *t));
void exs__engine_timer_stop(struct exs_eng_timer *t);

/* A descriptor watched by the progress loop (the control endpoint, ctl/ctl.c; the
 * library's epoll set of the application's kernel sockets, api/kfd.c). Start, change and
 * stop with the progress lock held; cb runs on the progress thread with the lock held,
 * with EV_READ / EV_WRITE in revents (EV_ERROR when libev found the descriptor invalid:
 * it stopped the watcher itself). events: EV_READ | EV_WRITE. Stop it before the
 * descriptor is closed. */
struct exs_eng_io {
    ev_io w;
    void (*cb)(struct exs_eng_io *io, int revents);
};
void exs__engine_io_start(struct exs_eng_io *io, int fd, int events,
                          void (*cb)(struct exs_eng_io *io, int revents));
void exs__engine_io_stop(struct exs_eng_io *io);

/* Listen on the primary context, and on the fallback one at the port + offset. When
 * addr's port is 0 and the fallback port of the ephemeral one is taken, other ephemeral
 * ports are tried. Errors: provider errors (-EADDRINUSE, ...). */
int exs__engine_listen(struct exs_eng_listener *lis, const struct sockaddr *addr, socklen_t addrlen,
                       int backlog);
/* Progress thread only. */
void exs__engine_listener_destroy(struct exs_eng_listener *lis);
/* Ask lis's provider listeners to stop (pause 1) or go on (0) taking new connection
 * requests (exs__prov_listener_pause); progress thread. 0 when every one of them did,
 * else the first error (-EOPNOTSUPP: a provider that cannot; its requests keep coming). */
int exs__engine_listener_pause(struct exs_eng_listener *lis, int pause);

#endif
