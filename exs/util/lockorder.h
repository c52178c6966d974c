/* SPDX-License-Identifier: MIT */
/* Debug lock-order checker: each thread keeps the levels of the locks it holds and asserts each new
 * one is inner. */
#ifndef EXS_UTIL_LOCKORDER_H
#define EXS_UTIL_LOCKORDER_H

/*
 * The library's lock order as one list, outermost first (spec/threading.md). A thread
 * may take a lock only while every lock it holds has a smaller level. The checker is
 * compiled in when EXS_LOCK_DEBUG is defined and in every ASan and TSan build; it
 * costs a thread-local array push and pop per lock.
 */
enum exs_lock_level {
    EXS_LOCK_INIT = 1, /* init.c init_lock (exs_init / exs_fini) */
    EXS_LOCK_PROGRESS, /* engine plock: the progress role */
    EXS_LOCK_CONN,     /* proto conn->lock (op->done and conn callbacks run under it) */
    EXS_LOCK_LISTENER, /* api_sock lock of a listener (parent) */
    EXS_LOCK_SOCK,     /* api_sock lock of a connection or child socket */
    EXS_LOCK_SOCK_TAB, /* sock.c tab_lock, the descriptor table */
    EXS_LOCK_EVQ_TAB,  /* evq.c evq_tab.lock, the queue handle table */
    EXS_LOCK_EVQ,      /* evq->lock, one event queue */
    EXS_LOCK_LEAF,     /* engine job list, registrations table, provider locks */
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#ifndef EXS_LOCK_DEBUG
#define EXS_LOCK_DEBUG 1
#endif
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#ifndef EXS_LOCK_DEBUG
#define EXS_LOCK_DEBUG 1
#endif
#endif
#endif

#include <pthread.h>

#ifdef EXS_LOCK_DEBUG
/* Assert level is inner to every lock held, then record it. */
void exs__lock_acquire(int level, const char *file, int line);
/* Forget the most recent record of level (releases need not be LIFO). */
void exs__lock_release(int level);
/* Levels held by this thread (tests). */
int exs__lock_depth(void);
/* Locks of this level this thread took so far (tests: how often a path takes one). */
unsigned long exs__lock_takes(int level);
#define EXS_LOCK_ACQUIRE(_lvl) exs__lock_acquire((_lvl), __FILE__, __LINE__)
#define EXS_LOCK_RELEASE(_lvl) exs__lock_release(_lvl)
#else
#define EXS_LOCK_ACQUIRE(_lvl) ((void)0)
#define EXS_LOCK_RELEASE(_lvl) ((void)0)
#endif

/* A mutex taken and released at a level (the check, then the lock). */
#define EXS_MUTEX_LOCK(_m, _lvl)                                                                   \
    do {                                                                                           \
        EXS_LOCK_ACQUIRE(_lvl);                                                                    \
        pthread_mutex_lock(_m);                                                                    \
    } while (0)
#define EXS_MUTEX_UNLOCK(_m, _lvl)                                                                 \
    do {                                                                                           \
        pthread_mutex_unlock(_m);                                                                  \
        EXS_LOCK_RELEASE(_lvl);                                                                    \
    } while (0)

/* The head of a list of parked objects (linked by their field _next), taken off under the
 * leaf mutex _m; NULL when none is parked. */
#define EXS_PARKED_POP(_m, _head, _next)                                                           \
    __extension__({                                                                                \
        __typeof__(_head) _p;                                                                      \
        EXS_MUTEX_LOCK(_m, EXS_LOCK_LEAF);                                                         \
        _p = (_head);                                                                              \
        if (_p)                                                                                    \
            (_head) = _p->_next;                                                                   \
        EXS_MUTEX_UNLOCK(_m, EXS_LOCK_LEAF);                                                       \
        _p;                                                                                        \
    })

#endif
