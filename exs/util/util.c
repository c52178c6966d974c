/* SPDX-License-Identifier: MIT */
/* Out-of-line helpers of util.h: the assertion failure path, library thread creation. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "exs/util/util.h"

void exs__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "exs: assertion failed: %s (%s:%d %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}

int exs__thread_create(pthread_t *thread, const char *name, void *(*fn)(void *arg), void *arg)
{
    /* synchronous signals stay deliverable: they are the thread's own faults */
    static const int sync_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    sigset_t all, old;
    int ret, ret2;

    sigfillset(&all);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(sync_sigs); i++)
        sigdelset(&all, sync_sigs[i]);
    /* the new thread inherits the creator's mask: block, create, restore */
    ret = pthread_sigmask(SIG_BLOCK, &all, &old);
    if (ret)
        return -ret;
    ret = pthread_create(thread, NULL, fn, arg);
    ret2 = pthread_sigmask(SIG_SETMASK, &old, NULL);
    EXS_ASSERT(ret2 == 0); /* restoring a mask just read cannot fail */
    if (!ret)
        pthread_setname_np(*thread, name); /* a name is a convenience: errors ignored */
    return -ret;
}

/* A list of what forked children abandoned (exs__forsake): its head is a global, so
 * everything in it stays reachable. */
struct util_forsaken {
    struct util_forsaken *next;
    const void *p;
};
static struct util_forsaken *util_forsaken;

void exs__forsake(const void *p)
{
    struct util_forsaken *n;

    if (!p || !(n = malloc(sizeof(*n))))
        return;
    n->p = p;
    n->next = util_forsaken;
    util_forsaken = n;
}

void exs__mutex_fork(pthread_mutex_t *m, int phase)
{
    if (phase == EXS_FORK_PREPARE)
        pthread_mutex_lock(m);
    else if (phase == EXS_FORK_PARENT)
        pthread_mutex_unlock(m);
    else
        pthread_mutex_init(m, NULL);
}
