/* SPDX-License-Identifier: MIT */
/* The small mutex's slow paths (lite_lock.h): a waiter's sleep, an unlock's wake-up. */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "exs/util/lite_lock.h"

void exs__lite_lock_wait(struct exs_lite_lock *l)
{
    /* held: mark it waited for, and sleep while it stays held so */
    while (__atomic_exchange_n(&l->v, 2, __ATOMIC_ACQUIRE) != 0)
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void exs__lite_lock_nap(struct exs_lite_lock *l)
{
    const struct timespec nap = {0, EXS_LITE_NAP_NS};

    /* as exs__lite_lock_wait, each sleep bounded (a give-back by store may miss the mark) */
    while (__atomic_exchange_n(&l->v, 2, __ATOMIC_ACQUIRE) != 0)
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2, &nap, NULL, 0);
}

void exs__lite_lock_wake(struct exs_lite_lock *l)
{
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
