/* SPDX-License-Identifier: MIT */
/* exs_init / exs_fini and the library-wide object accounting. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/ctl/ctl.h"
#include "exs/api/kfd.h"
#include "exs/util/lockorder.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
int exs__fini_keep_memory; /* api_int.h */

int exs__api_initialized(void)
{
    return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE);
}

int exs__api_init_fork(int phase)
{
    if (phase == EXS_FORK_PREPARE) {
        EXS_MUTEX_LOCK(&init_lock, EXS_LOCK_INIT);
        return initialized;
    }
    if (phase == EXS_FORK_CHILD) {
        __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);
        pthread_mutex_init(&init_lock, NULL); /* held by the parent's thread id */
        EXS_LOCK_RELEASE(EXS_LOCK_INIT);
        return 0;
    }
    EXS_MUTEX_UNLOCK(&init_lock, EXS_LOCK_INIT);
    return 0;
}

int exs__api_default_xfer_mode(void)
{
    const char *m = exs__params.xfer_mode;

    if (!strcmp(m, "direct"))
        return EXS_XFER_DIRECT_ONLY;
    if (!strcmp(m, "indirect"))
        return EXS_XFER_INDIRECT_ONLY;
    return EXS_XFER_DYNAMIC;
}

/* exs_init and exs_fini run with cancellation off (spec/threading.md, "Thread
 * cancellation"): they start and join threads, open providers (rdma-core, getaddrinfo)
 * and write logs under init_lock. */
exs_version_t exs_init(exs_version_t version)
{
    int ret = 0, cs;

    if (version != EXS_VERSION1)
        return exs__err(ENOTSUP);
    cs = exs__nc_begin();
    EXS_MUTEX_LOCK(&init_lock, EXS_LOCK_INIT);
    if (!initialized) {
        exs__params_load();
        exs__log_init();
        ret = exs__engine_start();
        if (!ret) {
            exs__api_fork_setup(); /* fork.c: the child forgets the parent's library */
            exs__api_exit_setup(); /* exit.c: exit() ends connections as close() would */
            __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
        }
        if (!ret && exs__params.ctl_enable)
            exs__ctl_start(); /* without it the library works; the failure is logged */
    }
    EXS_MUTEX_UNLOCK(&init_lock, EXS_LOCK_INIT);
    exs__nc_end(cs);
    if (ret)
        return exs__err(-ret == ENOENT ? ENODEV : -ret);
    return version;
}

void exs_fini(void)
{
    int cs = exs__nc_begin();

    EXS_MUTEX_LOCK(&init_lock, EXS_LOCK_INIT);
    if (!initialized) {
        EXS_MUTEX_UNLOCK(&init_lock, EXS_LOCK_INIT);
        exs__nc_end(cs);
        return;
    }
    exs__ctl_stop();
    exs__api_poll_close_all(); /* exs_poll requests still waiting: ECANCELED */
    exs__api_sock_close_all();
    /* Sockets finish closing under the progress lock: help drive, and wait for them
     * (bounded). */
    for (int i = 0; i < 5000 && exs__api_sock_live(); i++) {
        exs__engine_drive(0);
        if (exs__api_sock_live())
            exs__nc_sleep_us(1000);
    }
    if (exs__api_sock_live())
        EXS_WARN(API, "exs_fini: %d sockets still closing, abandoned", exs__api_sock_live());
    exs__api_kfd_close_all(); /* before the registrations its operations hold */
    exs__api_mreg_destroy_all();
    exs__engine_stop();
    exs__evq_destroy_all();
    exs__evq_op_cache_flush(); /* other threads free theirs when they exit */
    __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);
    EXS_MUTEX_UNLOCK(&init_lock, EXS_LOCK_INIT);
    exs__nc_end(cs);
}

int exs__debug_live_objects(void)
{
    if (getenv("EXS_DEBUG_LIVE"))
        fprintf(stderr, "live: socks %d conns %d ops %d mregs %d evqs %d kfd %d\n",
                exs__api_sock_live(), exs__conn_live_count(), exs__evq_ops_live(),
                exs__api_mreg_live(), exs__evq_live_count(), exs__debug_kfd_live());
    return exs__api_sock_live() + exs__conn_live_count() + exs__evq_ops_live() +
           exs__api_mreg_live() + exs__evq_live_count() + exs__debug_kfd_live();
}
