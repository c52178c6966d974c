/* SPDX-License-Identifier: MIT */
/* The event queue's operation block cache (see the comment below). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "exs/api/evq.h"
#include "exs/api/evq_int.h"

/*
 * Operation blocks. Every posting call allocates one operation and its event frees it, so
 * a stream of small sends spent a fifth of its instructions in malloc and free. Blocks of
 * up to EXS_EVQ_OP_BLOCK bytes are kept in a per-thread list of at most OP_CACHE_MAX: a thread
 * that posts and dequeues (run to completion) reuses its own; a block freed by another
 * thread goes to that thread's list, or to free() when the list is full. No lock: each
 * list is its thread's alone. A thread's list is freed when the thread exits (key
 * destructor) or, for the thread calling exs_fini, by exs__evq_op_cache_flush.
 */
#define OP_CACHE_MAX EXS_OP_CACHE_MAX /* evq_int.h */

#if OP_CACHE_MAX > 0
/* A thread's list (evq_int.h: its inline paths, exs__evq_op_alloc_x and _free_x, use it) */
__thread struct exs_op_cache_thr exs__op_cache;
static pthread_key_t op_cache_key;
static pthread_once_t op_cache_once = PTHREAD_ONCE_INIT;
static int op_cache_keyed; /* the key exists: lists may be kept */

static void op_cache_thread_exit(void *arg)
{
    struct exs_op_cache_thr *c = &exs__op_cache;
    struct exs_op_block *b = c->head;

    (void)arg;
    while (b) {
        struct exs_op_block *next = b->next;

        free(b);
        b = next;
    }
    c->head = NULL;
    c->n = 0;
    if (arg)
        c->armed = 0; /* the thread's exit cleared the key: a later free sets it again */
}

static void op_cache_init(void)
{
    op_cache_keyed = pthread_key_create(&op_cache_key, op_cache_thread_exit) == 0;
}

void exs__evq_op_cache_flush(void)
{
    op_cache_thread_exit(NULL);
}

void *exs__evq_op_alloc(size_t size)
{
    struct exs_op_cache_thr *c = &exs__op_cache;
    struct exs_op_block *b = c->head;

    if (size > EXS_EVQ_OP_BLOCK)
        return calloc(1, size);
    if (b) {
        c->head = b->next;
        c->n--;
        memset(b, 0, size);
        return b;
    }
    return calloc(1, EXS_EVQ_OP_BLOCK);
}

/* A thread's first free into its list: the key's destructor set for it (armed: the key
 * exists, no pthread_once at later frees). 0: no key, the block goes to free(). Out of
 * line, so that exs__evq_op_free keeps one address of its thread's list. */
static __attribute__((noinline, cold)) int op_cache_arm(struct exs_op_cache_thr *c)
{
    pthread_once(&op_cache_once, op_cache_init);
    if (!op_cache_keyed)
        return 0;
    /* non-NULL: run the destructor (once per thread: it stays set) */
    (void)pthread_setspecific(op_cache_key, c);
    c->armed = 1;
    return 1;
}

void exs__evq_op_free(void *mem, size_t size)
{
    struct exs_op_block *b = mem;
    struct exs_op_cache_thr *c;

    if (!mem)
        return;
    c = &exs__op_cache;
    /* the address kept: gcc otherwise computes it again (a second __tls_get_addr) after
     * the branch to op_cache_arm */
    __asm__("" : "+r"(c));
    if (size > EXS_EVQ_OP_BLOCK || c->n >= OP_CACHE_MAX) {
        free(mem);
        return;
    }
    if (__builtin_expect(!c->armed, 0) && !op_cache_arm(c)) {
        free(mem);
        return;
    }
    b->next = c->head;
    c->head = b;
    c->n++;
}
#else
void exs__evq_op_cache_flush(void) {}

void *exs__evq_op_alloc(size_t size)
{
    return calloc(1, size);
}

void exs__evq_op_free(void *mem, size_t size)
{
    (void)size;
    free(mem);
}
#endif
