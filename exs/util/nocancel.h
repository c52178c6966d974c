/* SPDX-License-Identifier: MIT */
/* System calls that are not cancellation points (spec/threading.md, "Thread cancellation").
 *
 * glibc's read, write, close, recv, sendmsg, epoll_wait, ppoll, poll, connect, accept4,
 * open, pread, readv, nanosleep... are cancellation points: a pthread_cancel (deferred) of an
 * application thread acts inside them, and the thread dies there. The library makes such
 * calls with its state held (the progress lock, a provider's lock, a connection's lock, a
 * wait's driver count), so every system call of the library goes through these wrappers:
 * syscall(2) is not a cancellation point. They return as the libc calls do (-1 and errno).
 * They are also cheaper than the libc calls on a glibc that brackets each cancellable call
 * with two atomic updates of the thread's cancel state (2.36: __pthread_enable_asynccancel).
 *
 * The one cancellation point the library keeps on purpose is the sleep of exs_qdequeue
 * (exs/api/evq.c, with a cleanup handler); scripts/check-nocancel.sh lists the raw calls
 * that must not appear in exs/ and the lines allowed to make one ("nocancel: ok"). */
#ifndef EXS_UTIL_NOCANCEL_H
#define EXS_UTIL_NOCANCEL_H

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* the kernel's sigset size (ppoll, epoll_pwait): _NSIG / 8 */
#define EXS_NC_SIGSET_SIZE 8

static inline ssize_t exs__nc_read(int fd, void *buf, size_t len)
{
    return syscall(SYS_read, fd, buf, len);
}

static inline ssize_t exs__nc_write(int fd, const void *buf, size_t len)
{
    return syscall(SYS_write, fd, buf, len);
}

static inline int exs__nc_close(int fd)
{
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer builds: glibc's close, which TSan intercepts, with cancellation off.
     * A raw close leaves TSan believing the number still names the closed descriptor, and
     * its reuse by another thread (an accept4, a socket) then reads as a race on it
     * (prov_shm shm_rendezvous_look: a unix socket closed here, its number accepted by the
     * NIC thread and added to its epoll set). */
    int old, ret;

    (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    ret = close(fd); /* nocancel: ok (cancellation off) */
    (void)pthread_setcancelstate(old, NULL);
    return ret;
#else
    return (int)syscall(SYS_close, fd);
#endif
}

static inline ssize_t exs__nc_readv(int fd, const struct iovec *iov, int n)
{
    return syscall(SYS_readv, fd, iov, n);
}

static inline ssize_t exs__nc_pread(int fd, void *buf, size_t len, off_t off)
{
    return syscall(SYS_pread64, fd, buf, len, off);
}

static inline ssize_t exs__nc_recvfrom(int fd, void *buf, size_t len, int flags,
                                       struct sockaddr *from, socklen_t *fromlen)
{
    return syscall(SYS_recvfrom, fd, buf, len, flags, from, fromlen);
}

static inline ssize_t exs__nc_recv(int fd, void *buf, size_t len, int flags)
{
    return exs__nc_recvfrom(fd, buf, len, flags, NULL, NULL);
}

static inline ssize_t exs__nc_sendto(int fd, const void *buf, size_t len, int flags,
                                     const struct sockaddr *to, socklen_t tolen)
{
    return syscall(SYS_sendto, fd, buf, len, flags, to, tolen);
}

static inline ssize_t exs__nc_send(int fd, const void *buf, size_t len, int flags)
{
    return exs__nc_sendto(fd, buf, len, flags, NULL, 0);
}

static inline ssize_t exs__nc_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    return syscall(SYS_sendmsg, fd, msg, flags);
}

static inline ssize_t exs__nc_recvmsg(int fd, struct msghdr *msg, int flags)
{
    return syscall(SYS_recvmsg, fd, msg, flags);
}

static inline int exs__nc_accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
    return (int)syscall(SYS_accept4, fd, sa, len, flags);
}

static inline int exs__nc_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    return (int)syscall(SYS_connect, fd, sa, len);
}

static inline int exs__nc_open(const char *path, int flags)
{
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, 0);
}

static inline int exs__nc_epoll_wait(int ep, struct epoll_event *evs, int max, int timeout_ms)
{
    return (int)syscall(SYS_epoll_pwait, ep, evs, max, timeout_ms, NULL, EXS_NC_SIGSET_SIZE);
}

/* as ppoll(2) (the kernel writes the time left into its argument: a copy, as glibc's) */
static inline int exs__nc_ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts,
                                const sigset_t *mask)
{
    struct timespec t, *tp = NULL;

    if (ts) {
        t = *ts;
        tp = &t;
    }
    return (int)syscall(SYS_ppoll, fds, n, tp, mask, EXS_NC_SIGSET_SIZE);
}

static inline int exs__nc_poll(struct pollfd *fds, nfds_t n, int timeout_ms)
{
    struct timespec t = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};

    return exs__nc_ppoll(fds, n, timeout_ms < 0 ? NULL : &t, NULL);
}

/* one sleep of ts (not resumed after a signal: the callers loop or do not care) */
static inline int exs__nc_nanosleep(const struct timespec *ts)
{
    return (int)syscall(SYS_nanosleep, ts, NULL);
}

static inline void exs__nc_sleep_us(long us)
{
    struct timespec ts = {us / 1000000L, (us % 1000000L) * 1000L};

    (void)exs__nc_nanosleep(&ts);
}

/* A region that must not reach a cancellation point and can not use the wrappers above
 * (pthread_cond_wait, pthread_join, stdio, getaddrinfo, a library's call that may enter the
 * kernel): cancellation disabled around it, the caller's state given back after.
 *   int cs = exs__nc_begin(); ... exs__nc_end(cs);
 * Not on a hot path: two updates of the thread's cancel word (atomic) when the state
 * changes. */
static inline int exs__nc_begin(void)
{
    int old;

    (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return old;
}

static inline void exs__nc_end(int old)
{
    (void)pthread_setcancelstate(old, NULL);
}

#endif
