/* SPDX-License-Identifier: MIT */
/* A job for the progress thread, embedded in the object it works on so queuing it cannot fail. */
#ifndef EXS_UTIL_JOB_H
#define EXS_UTIL_JOB_H

#include "exs/util/list.h"

/*
 * The owner sets fn and keeps the job alive until fn runs; fn gets the job back and
 * reaches its object with exs_container_of. fn may free the object holding the job (the
 * queue does not touch a job once fn was called). A job is queued at most once at a
 * time (queued says so; the engine asserts it).
 */
struct exs_job {
    struct exs_list link;
    void (*fn)(struct exs_job *job);
    int queued;
};

#endif
