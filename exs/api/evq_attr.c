/* SPDX-License-Identifier: MIT */
/* Event queue attributes: the wait mode (exs_qsetwait) and the UNH EXS names
 * exs_qgetattr / exs_qsetattr (spec/api.md, deviation 21). */
#include <errno.h>
#include <string.h>

#include "exs/api/api_int.h"
#include "exs/api/evq.h"
#include "exs/api/evq_int.h"
#include "exs/util/util.h"

int exs_qsetwait(exs_qhandle_t q, int mode, int spin_us)
{
    struct exs_evq *evq;
    int ret;

    if ((mode != EXS_WAIT_NOTIFY && mode != EXS_WAIT_POLL && mode != EXS_WAIT_ADAPTIVE) ||
        spin_us < 0)
        return exs__err(EINVAL);
    ret = exs__evq_get(q, &evq);
    if (ret < 0)
        return exs__err(-ret);
    __atomic_store_n(&evq->mode, mode, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_us, spin_us, __ATOMIC_RELAXED);
    __atomic_store_n(&evq->spin_learn, exs__evq_wait_is_default(mode, spin_us), __ATOMIC_RELAXED);
    exs__evq_put(evq);
    return 0;
}

/* ---- queue attributes (UNH EXS names, spec/api.md) ---- */

/* An int attribute value: 0, or EINVAL when the buffer cannot hold one. */
static int evq_attr_int(void *val, socklen_t *len, int v)
{
    if (!val || !len || *len < sizeof(int))
        return EINVAL;
    memcpy(val, &v, sizeof(v));
    *len = sizeof(int);
    return 0;
}

int exs_qgetattr(exs_qhandle_t q, int attr, void *val, socklen_t *len)
{
    exs_signal_t sig = {.exs_sig_state = EXS_SIG_DISABLE};
    struct exs_evq *evq;
    int ret, err = 0;

    ret = exs__evq_get(q, &evq);
    if (ret < 0)
        return exs__err(-ret);
    switch (attr) {
    case EXS_QATTR_DEPTH:
        err = evq_attr_int(val, len, evq->depth);
        break;
    case EXS_QATTR_EVENTS:
        err = evq_attr_int(val, len, __atomic_load_n(&evq->queued, __ATOMIC_ACQUIRE));
        break;
    case EXS_QATTR_WAIT:
        err = evq_attr_int(val, len, __atomic_load_n(&evq->mode, __ATOMIC_RELAXED));
        break;
    case EXS_QATTR_WAIT_SPIN:
        err = evq_attr_int(val, len, __atomic_load_n(&evq->spin_us, __ATOMIC_RELAXED));
        break;
    case EXS_QATTR_SIGNAL:
        if (!val || !len || *len < sizeof(sig)) {
            err = EINVAL;
            break;
        }
        memcpy(val, &sig, sizeof(sig)); /* never enabled */
        *len = sizeof(sig);
        break;
    default:
        err = EINVAL;
        break;
    }
    exs__evq_put(evq);
    return err ? exs__err(err) : 0;
}

int exs_qsetattr(exs_qhandle_t q, int attr, const void *val, socklen_t len)
{
    exs_signal_t sig;
    struct exs_evq *evq;
    int ret, v, err = 0;

    ret = exs__evq_get(q, &evq);
    if (ret < 0)
        return exs__err(-ret);
    switch (attr) {
    case EXS_QATTR_WAIT:
        if (!val || len != sizeof(int)) {
            err = EINVAL;
            break;
        }
        memcpy(&v, val, sizeof(v));
        exs__evq_put(evq);
        /* the spin bound stays the default (exs_qsetwait sets it) */
        return exs_qsetwait(q, v, 0);
    case EXS_QATTR_WAIT_SPIN:
        if (!val || len != sizeof(int)) {
            err = EINVAL;
            break;
        }
        memcpy(&v, val, sizeof(v));
        if (v < 0) {
            err = EINVAL;
            break;
        }
        __atomic_store_n(&evq->spin_us, v, __ATOMIC_RELAXED); /* the mode stays */
        __atomic_store_n(&evq->spin_learn,
                         exs__evq_wait_is_default(__atomic_load_n(&evq->mode, __ATOMIC_RELAXED), v),
                         __ATOMIC_RELAXED);
        break;
    case EXS_QATTR_SIGNAL:
        if (!val || len != sizeof(sig)) {
            err = EINVAL;
            break;
        }
        memcpy(&sig, val, sizeof(sig));
        if (sig.exs_sig_state == EXS_SIG_ENABLE)
            err = EOPNOTSUPP; /* no signal notification: exs_qfd with poll/epoll instead */
        else if (sig.exs_sig_state != EXS_SIG_DISABLE)
            err = EINVAL;
        break;
    case EXS_QATTR_DEPTH:
        err = EOPNOTSUPP; /* fixed at exs_qcreate */
        break;
    default: /* EXS_QATTR_EVENTS is read only */
        err = EINVAL;
        break;
    }
    exs__evq_put(evq);
    return err ? exs__err(err) : 0;
}
