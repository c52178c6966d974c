/* SPDX-License-Identifier: MIT */
/* fork(2): the child of an initialized process holds nothing of the parent's library. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/ctl/ctl.h"
#include "exs/api/kfd.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/*
 * After fork(2) the child has a copy of everything the parent's library had: sockets,
 * connections, queues with their events, the provider's TCP sockets, epoll sets and
 * eventfds, the control endpoint, and locks other threads may have held at that instant;
 * but none of its threads. Left alone, a child's exs_send on an inherited descriptor
 * wrote the parent's TCP socket (the peer then saw an unknown sequence) and waited for a
 * progress thread that does not exist. So (spec/api.md section 2, "fork"):
 *
 * prepare (the forking thread, before the fork), in the lock order (spec/threading.md §6):
 *   init_lock; the progress lock and each provider context's fork lock (the tcp
 *   provider's NIC lock: its sockets are made and listed under it); the descriptor
 *   table's and the queue table's locks; the counter registry's, the tunables' and the
 *   log's (leaves). Every list the child walks is then whole, and the child can take
 *   every global lock again. Nothing is taken when the library is not initialized
 *   (init_lock only).
 * parent: release in reverse.
 * child: the provider contexts close their copies of every descriptor (close only: a
 *   socket ends when its last copy closes, so nothing reaches the parent's peers, and
 *   the epoll sets the child shares with the parent are not changed); the control
 *   endpoint, the kernel-socket epoll set and the queues' eventfds likewise; every table
 *   (descriptors, queues, registrations, kernel-socket state, exs_poll requests,
 *   connections, resume registry) starts empty and the library is not initialized. What
 *   the parent's objects hold is abandoned, never used or freed (exs__forsake keeps it
 *   reachable for leak checkers). The exs socket descriptors stay open in the child (so
 *   their numbers are not reused behind the application's back) and are remembered:
 *   every call on one fails with ESTALE, before and after exs_init; exs_close on one
 *   also closes the child's copy. exs_init then starts a new library in the child.
 */

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static int fork_held; /* prepare found the library initialized and took its locks */

/* The inherited descriptors: one byte per descriptor number, set in the child (one
 * thread), cleared atomically (exs_close, or the number no longer an eventfd). */
static uint8_t *stale;
static int stale_len;
static dev_t stale_dev; /* every eventfd is the one anonymous inode: what fd must still be */
static ino_t stale_ino;

void exs__api_fork_stale_mark(int fd)
{
    struct stat st;

    if (fd < 0 || fstat(fd, &st) < 0)
        return;
    if (fd >= stale_len) {
        int n = EXS_MAX(fd + 1, stale_len * 2);
        uint8_t *t = realloc(stale, (size_t)n);

        if (!t)
            return;
        memset(t + stale_len, 0, (size_t)(n - stale_len));
        stale = t;
        stale_len = n;
    }
    stale_dev = st.st_dev;
    stale_ino = st.st_ino;
    stale[fd] = 1;
}

int exs__api_fork_stale(int fd)
{
    struct stat st;

    if (fd < 0 || fd >= stale_len || !__atomic_load_n(&stale[fd], __ATOMIC_RELAXED))
        return 0;
    /* the application may have closed the number with close(2) and reused it */
    if (fstat(fd, &st) == 0 && st.st_dev == stale_dev && st.st_ino == stale_ino)
        return 1;
    __atomic_store_n(&stale[fd], 0, __ATOMIC_RELAXED);
    return 0;
}

void exs__api_fork_stale_close(int fd)
{
    if (fd >= 0 && fd < stale_len && __atomic_exchange_n(&stale[fd], 0, __ATOMIC_RELAXED))
        exs__nc_close(fd);
}

static void fork_prepare(void)
{
    if (!exs__api_init_fork(EXS_FORK_PREPARE))
        return;
    fork_held = 1;
    exs__engine_fork(EXS_FORK_PREPARE);
    exs__api_sock_fork(EXS_FORK_PREPARE);
    exs__evq_fork(EXS_FORK_PREPARE);
    exs__counters_fork(EXS_FORK_PREPARE);
    exs__params_fork(EXS_FORK_PREPARE);
    exs__log_fork(EXS_FORK_PREPARE);
}

static void fork_parent(void)
{
    if (fork_held) {
        fork_held = 0;
        exs__log_fork(EXS_FORK_PARENT);
        exs__params_fork(EXS_FORK_PARENT);
        exs__counters_fork(EXS_FORK_PARENT);
        exs__evq_fork(EXS_FORK_PARENT);
        exs__api_sock_fork(EXS_FORK_PARENT);
        exs__engine_fork(EXS_FORK_PARENT);
    }
    exs__api_init_fork(EXS_FORK_PARENT);
}

static void fork_child(void)
{
    if (fork_held) {
        fork_held = 0;
        /* the leaves first: what follows may log and unregister counter sets */
        exs__log_fork(EXS_FORK_CHILD);
        exs__params_fork(EXS_FORK_CHILD);
        exs__counters_fork(EXS_FORK_CHILD);
        exs__ctl_fork_child(); /* its clients are listed under the progress lock */
        exs__api_poll_fork_child();
        exs__engine_fork(EXS_FORK_CHILD);
        exs__evq_fork(EXS_FORK_CHILD);
        exs__api_sock_fork(EXS_FORK_CHILD);
        exs__api_kfd_fork_child();
        exs__api_xfer_fork_child();
        exs__proto_fork_child();
        exs__mem_fork_child();
    }
    exs__api_init_fork(EXS_FORK_CHILD);
}

static void fork_register(void)
{
    int ret = pthread_atfork(fork_prepare, fork_parent, fork_child);

    if (ret)
        EXS_WARN(API, "pthread_atfork: %s: a forked child inherits the library unusable",
                 strerror(ret));
}

void exs__api_fork_setup(void)
{
    pthread_once(&fork_once, fork_register);
}
