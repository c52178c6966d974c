/* SPDX-License-Identifier: MIT */
/* rxe-vstat.so: an LD_PRELOAD counter of what a process asks of libibverbs, for make bench-rxe
 * (bench/rxe-bench.sh). ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are
 * inline calls through the device context's ops table, which no symbol interposition sees:
 * the first ibv_create_cq / ibv_create_qp of a context (exported, called through the PLT by
 * libexs, librdmacm, perftest and UCX alike) swaps those four entries for counting wrappers.
 * It also counts ibv_get_cq_event (blocking waits) and mutex, rwlock and spinlock
 * acquisitions (through the PLT: a library's own inlined locks are not seen), and times the
 * wrapped calls (CLOCK_MONOTONIC around one call in VS_SAMPLE, scaled: time in libibverbs,
 * the rxe provider and the kernel's rxe under it). At exit it appends one line of key=value
 * pairs to $VSTAT_OUT (or stderr): the process's figures, which bench/rxe_results.py divides
 * by its messages. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define ADD(c, n) __atomic_fetch_add(&(c), (uint64_t)(n), __ATOMIC_RELAXED)

static struct {
    uint64_t post_send_calls, send_wrs, send_signaled, send_inline;
    uint64_t post_recv_calls, recv_wrs;
    uint64_t poll_calls, polled_cqes, empty_polls;
    uint64_t req_notify, cq_events;
    uint64_t locks;
    uint64_t verbs_ns; /* inside the four wrapped ops */
    uint64_t event_ns; /* inside ibv_get_cq_event (blocked) */
} st;

static int (*real_post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
static int (*real_post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
static int (*real_poll_cq)(struct ibv_cq *, int, struct ibv_wc *);
static int (*real_req_notify)(struct ibv_cq *, int);

static uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* One call in VS_SAMPLE of the four wrapped ops is timed (its time counted VS_SAMPLE times):
 * a read of the clock is a system call in the TCG guest, and timing every call added two
 * to each of a busy poller's hundreds of polls per message, slowing what was measured. */
#define VS_SAMPLE 64
static __thread unsigned vs_tick;

static uint64_t t_begin(void)
{
    return ++vs_tick % VS_SAMPLE == 0 ? now_ns() : 0;
}

static void t_end(uint64_t t0)
{
    if (t0)
        ADD(st.verbs_ns, (now_ns() - t0) * VS_SAMPLE);
}

static int w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    uint64_t t0 = t_begin();
    int ret;

    ADD(st.post_send_calls, 1);
    for (struct ibv_send_wr *w = wr; w; w = w->next) {
        ADD(st.send_wrs, 1);
        if (w->send_flags & IBV_SEND_SIGNALED)
            ADD(st.send_signaled, 1);
        if (w->send_flags & IBV_SEND_INLINE)
            ADD(st.send_inline, 1);
    }
    ret = real_post_send(qp, wr, bad);
    t_end(t0);
    return ret;
}

static int w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    uint64_t t0 = t_begin();
    int ret;

    ADD(st.post_recv_calls, 1);
    for (struct ibv_recv_wr *w = wr; w; w = w->next)
        ADD(st.recv_wrs, 1);
    ret = real_post_recv(qp, wr, bad);
    t_end(t0);
    return ret;
}

static int w_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    uint64_t t0 = t_begin();
    int ret = real_poll_cq(cq, n, wc);

    t_end(t0);
    ADD(st.poll_calls, 1);
    if (ret > 0)
        ADD(st.polled_cqes, ret);
    else if (ret == 0)
        ADD(st.empty_polls, 1);
    return ret;
}

static int w_req_notify(struct ibv_cq *cq, int solicited)
{
    uint64_t t0 = t_begin();
    int ret = real_req_notify(cq, solicited);

    t_end(t0);
    ADD(st.req_notify, 1);
    return ret;
}

/* One provider per process here (rxe): its ops are saved once, every context patched. */
static pthread_mutex_t patch_mu = PTHREAD_MUTEX_INITIALIZER;

static void patch(struct ibv_context *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&patch_mu);
    if (c->ops.post_send != w_post_send && c->ops.post_send) {
        real_post_send = c->ops.post_send;
        real_post_recv = c->ops.post_recv;
        real_poll_cq = c->ops.poll_cq;
        real_req_notify = c->ops.req_notify_cq;
        c->ops.post_send = w_post_send;
        c->ops.post_recv = w_post_recv;
        c->ops.poll_cq = w_poll_cq;
        c->ops.req_notify_cq = w_req_notify;
    }
    pthread_mutex_unlock(&patch_mu);
}

#ifndef VSTAT_NO_VERBS
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
                             struct ibv_comp_channel *ch, int vec)
{
    static struct ibv_cq *(*real)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
                                  int);

    if (!real)
        real = dlsym(RTLD_NEXT, "ibv_create_cq");
    patch(c);
    return real(c, cqe, cq_context, ch, vec);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    static struct ibv_qp *(*real)(struct ibv_pd *, struct ibv_qp_init_attr *);

    if (!real)
        real = dlsym(RTLD_NEXT, "ibv_create_qp");
    patch(pd->context);
    return real(pd, attr);
}

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
    static int (*real)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    uint64_t t0 = now_ns();
    int ret;

    if (!real)
        real = dlsym(RTLD_NEXT, "ibv_get_cq_event");
    ret = real(ch, cq, ctx);
    ADD(st.event_ns, now_ns() - t0);
    ADD(st.cq_events, 1);
    return ret;
}
#endif

#ifndef VSTAT_NO_LOCKS
/* glibc's own entry points under the public names, so no dlsym is needed (dlsym itself
 * takes locks). */
extern int __pthread_mutex_lock(pthread_mutex_t *);
extern int __pthread_rwlock_rdlock(pthread_rwlock_t *);
extern int __pthread_rwlock_wrlock(pthread_rwlock_t *);

#ifndef VSTAT_NO_MUTEX
int pthread_mutex_lock(pthread_mutex_t *m)
{
    ADD(st.locks, 1);
    return __pthread_mutex_lock(m);
}

int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
    ADD(st.locks, 1);
    return __pthread_rwlock_rdlock(l);
}

int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
    ADD(st.locks, 1);
    return __pthread_rwlock_wrlock(l);
}
#endif

#ifndef VSTAT_NO_SPIN
/* glibc's own: its lock word's convention is the architecture's (x86: 1 is free). Resolved
 * in a constructor (dlsym takes mutexes, never spinlocks). */
static int (*real_spin_lock)(pthread_spinlock_t *);

__attribute__((constructor)) static void vstat_init(void)
{
    real_spin_lock = (int (*)(pthread_spinlock_t *))dlsym(RTLD_NEXT, "pthread_spin_lock");
}

int pthread_spin_lock(pthread_spinlock_t *l)
{
    ADD(st.locks, 1);
    if (!real_spin_lock)
        vstat_init();
    return real_spin_lock(l);
}
#endif
#endif

__attribute__((destructor)) static void vstat_report(void)
{
    struct rusage ru;
    char comm[64] = "?", line[1024];
    const char *out = getenv("VSTAT_OUT");
    FILE *f = NULL;
    int fd, n;

    getrusage(RUSAGE_SELF, &ru);
    fd = open("/proc/self/comm", O_RDONLY);
    if (fd >= 0) {
        n = (int)read(fd, comm, sizeof(comm) - 1);
        comm[n > 0 ? n : 0] = 0;
        comm[strcspn(comm, "\n")] = 0;
        close(fd);
    }
    n = snprintf(line, sizeof(line),
                 "vstat pid=%d comm=%s tag=%s post_send_calls=%llu send_wrs=%llu "
                 "send_signaled=%llu send_inline=%llu post_recv_calls=%llu recv_wrs=%llu "
                 "poll_calls=%llu polled_cqes=%llu empty_polls=%llu req_notify=%llu "
                 "cq_events=%llu locks=%llu verbs_ns=%llu event_ns=%llu cpu_ns=%llu\n",
                 (int)getpid(), comm, getenv("VSTAT_TAG") ? getenv("VSTAT_TAG") : "-",
                 (unsigned long long)st.post_send_calls, (unsigned long long)st.send_wrs,
                 (unsigned long long)st.send_signaled, (unsigned long long)st.send_inline,
                 (unsigned long long)st.post_recv_calls, (unsigned long long)st.recv_wrs,
                 (unsigned long long)st.poll_calls, (unsigned long long)st.polled_cqes,
                 (unsigned long long)st.empty_polls, (unsigned long long)st.req_notify,
                 (unsigned long long)st.cq_events, (unsigned long long)st.locks,
                 (unsigned long long)st.verbs_ns, (unsigned long long)st.event_ns,
                 (unsigned long long)((ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ull +
                                      (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ull));
    if (out && *out)
        f = fopen(out, "a");
    fputs(line, f ? f : stderr);
    if (f)
        fclose(f);
    (void)n;
}
