/* SPDX-License-Identifier: MIT */
/* ES-API data transfer: send, receive, cancel, memory registration, synchronous waits. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/api/api_int.h"
#include "exs/api/evq_int.h"
#include "exs/api/kfd.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- memory registration ---- */

#define MREG_GEN_SHIFT 20
#define MREG_IDX_MASK  ((1 << MREG_GEN_SHIFT) - 1)

/*
 * The registrations. A hold (every operation with a handle) takes no lock: it reads the
 * table and the registration with atomic loads, raises busy, and then checks that the
 * table still names the registration under the same handle; a deregistration empties the
 * slot first and then reads busy (the four accesses sequentially consistent), so either
 * the hold sees the empty slot and lets go, or the deregistration sees busy and puts the
 * registration back (EBUSY). For that, nothing a hold may be reading is ever freed: a
 * table grown keeps its old array (mreg_retired), and a registration deregistered is parked
 * (mreg_parked, handle 0) and reused by a later one under a new handle. A hold that read
 * a parked or reused registration raises and drops its busy count without using it: a
 * deregistration of the new one at that instant may answer EBUSY once more.
 */
struct api_mreg {
    void *addr;
    size_t len;
    struct exs_prov_mr *mr;
    struct exs_prov_mr *mr_fb; /* on the fallback context, made at its first use there */
    int busy;                  /* operations using it (and holds about to check it) */
    int handle;                /* 0: parked */
    struct api_mreg *next;     /* parked: the next one */
};

#define MREG_RETIRED_MAX 32 /* doublings from 64 to MREG_IDX_MASK fit */

static pthread_mutex_t mreg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct api_mreg **mregs; /* read without the lock: atomic loads */
static int mreg_cap, mreg_count;
static unsigned mreg_gen;
static struct api_mreg **mreg_retired[MREG_RETIRED_MAX];
static int mreg_nretired;
static struct api_mreg *mreg_parked;

int exs__api_mreg_live(void)
{
    return __atomic_load_n(&mreg_count, __ATOMIC_RELAXED);
}

int exs__api_mreg_handle(const struct api_mreg *m)
{
    return __atomic_load_n(&m->handle, __ATOMIC_RELAXED);
}

/* The registration slot idx (below the capacity, which only grows) of the table names
 * under mh now, or NULL (no lock needed). */
static inline __attribute__((always_inline)) struct api_mreg *mreg_at(int idx, exs_mhandle_t mh)
{
    struct api_mreg **tab = __atomic_load_n(&mregs, __ATOMIC_ACQUIRE);
    struct api_mreg *m = __atomic_load_n(&tab[idx], __ATOMIC_SEQ_CST); /* after a hold's busy */

    if (!m || __atomic_load_n(&m->handle, __ATOMIC_RELAXED) != mh)
        return NULL;
    return m;
}

/* The registration the table names under mh now, or NULL (no lock needed). */
static inline __attribute__((always_inline)) struct api_mreg *mreg_find(exs_mhandle_t mh)
{
    int idx = (mh & MREG_IDX_MASK) - 1;

    /* the capacity is stored after the array it describes: read it first */
    if (mh <= 0 || idx < 0 || idx >= __atomic_load_n(&mreg_cap, __ATOMIC_ACQUIRE))
        return NULL;
    return mreg_at(idx, mh);
}

static struct api_mreg *mreg_unpark(void)
{
    struct api_mreg *m;

    m = EXS_PARKED_POP(&mreg_lock, mreg_parked, next);
    if (!m)
        return calloc(1, sizeof(*m));
    /* busy may be raised for a moment by a hold that read it before it was parked */
    m->mr = m->mr_fb = NULL;
    m->next = NULL;
    return m;
}

static void mreg_park(struct api_mreg *m)
{
    __atomic_store_n(&m->handle, 0, __ATOMIC_RELAXED);
    EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
    m->next = mreg_parked;
    mreg_parked = m;
    EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
}

exs_mhandle_t exs_mregister(void *addr, size_t len, int flags)
{
    struct api_mreg *m;
    int ret, idx = -1;

    if (!exs__api_initialized()) {
        errno = EINVAL;
        return EXS_MHANDLE_INVALID;
    }
    /* EXS_MRF_SHARED: every registration serves every socket and queue of the process */
    if (!addr || !len || (flags & ~EXS_MRF_SHARED) || (uintptr_t)addr + len < (uintptr_t)addr) {
        errno = EINVAL;
        return EXS_MHANDLE_INVALID;
    }
    m = mreg_unpark();
    if (!m) {
        errno = ENOMEM;
        return EXS_MHANDLE_INVALID;
    }
    ret = exs__prov_mr_reg(exs__engine_ctx(), addr, len,
                           EXS_PROV_ACCESS_LOCAL_WRITE, /* remote rights: grants */
                           &m->mr);
    if (ret) {
        mreg_park(m);
        errno = ret == -ENOMEM ? ENOMEM : EINVAL;
        return EXS_MHANDLE_INVALID;
    }
    /* a reused record: read by mreg_covers without a hold, which looks at the handle
     * again after them (its park cleared the handle before: the release stores order
     * that before them) */
    __atomic_store_n(&m->addr, addr, __ATOMIC_RELEASE);
    __atomic_store_n(&m->len, len, __ATOMIC_RELEASE);
    EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
    for (int i = 0; i < mreg_cap; i++)
        if (!mregs[i]) {
            idx = i;
            break;
        }
    if (idx < 0 && mreg_cap < MREG_IDX_MASK && mreg_nretired < MREG_RETIRED_MAX) {
        size_t cap = mreg_cap ? (size_t)mreg_cap * 2 : 64;
        struct api_mreg **n = cap <= MREG_IDX_MASK ? calloc(cap, sizeof(*n)) : NULL;

        if (n) {
            /* the old array stays readable for holds in flight (never freed) */
            if (mregs) {
                memcpy(n, mregs, (size_t)mreg_cap * sizeof(*n));
                mreg_retired[mreg_nretired++] = mregs;
            }
            idx = mreg_cap;
            __atomic_store_n(&mregs, n, __ATOMIC_RELEASE);
            __atomic_store_n(&mreg_cap, (int)cap, __ATOMIC_RELEASE);
        }
    }
    if (idx >= 0) {
        mreg_gen = (mreg_gen + 1) % 1024;
        __atomic_store_n(&m->handle, (int)(mreg_gen << MREG_GEN_SHIFT) | (idx + 1),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&mregs[idx], m, __ATOMIC_RELEASE); /* m complete before it shows */
        mreg_count++;
    }
    EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
    if (idx < 0) {
        exs__prov_mr_dereg(m->mr);
        mreg_park(m);
        errno = ENOMEM;
        return EXS_MHANDLE_INVALID;
    }
    return m->handle;
}

/* exs__api_mreg_hold, inline in xfer_post. The look after busy is raised reads the slot
 * again, not the capacity (it only grows: mreg_at). */
static inline __attribute__((always_inline)) int mreg_hold(exs_mhandle_t mh, const void *buf,
                                                           size_t len, struct api_mreg **m_p)
{
    struct api_mreg *m = mreg_find(mh);

    if (!m)
        return -EINVAL;
    /* seq_cst, as exs_mderegister's store of the slot and load of busy: of the two, at
     * least one sees the other's write */
    __atomic_add_fetch(&m->busy, 1, __ATOMIC_SEQ_CST);
    if (mreg_at((mh & MREG_IDX_MASK) - 1, mh) != m) {
        __atomic_sub_fetch(&m->busy, 1, __ATOMIC_RELEASE);
        return -EINVAL; /* deregistered meanwhile */
    }
    /* held: addr and len stay until the hold is released */
    if ((uintptr_t)buf < (uintptr_t)m->addr || (uintptr_t)buf + len > (uintptr_t)m->addr + m->len ||
        (uintptr_t)buf + len < (uintptr_t)buf) {
        __atomic_sub_fetch(&m->busy, 1, __ATOMIC_RELEASE);
        return -EINVAL;
    }
    *m_p = m;
    return 0;
}

/* Does the registration mh cover buf .. buf + len now? Looked at without a hold, for
 * exs_send's copy at the post (send_copy) on s, which uses nothing of the registration
 * after the look (it reads only buf). The record is the one s's hint names when that one
 * carries mh (a socket's sends mostly use one registration: the table is not read then),
 * else the table's (the hint set to it). Records are parked, never freed (exs_fini too):
 * one may be deregistered and reused meanwhile, so its handle is read again after addr
 * and len (acquire loads), and a reuse stores those (release stores, exs_mregister) after
 * the old handle was cleared (mreg_park). A handle names one record at a time, so the
 * hint's record carrying mh is the table's (or was a moment ago: a send racing the
 * deregistration of its handle may be taken either way, as with a hold). */
static inline __attribute__((always_inline)) int mreg_covers(struct api_sock *s, exs_mhandle_t mh,
                                                             const void *buf, size_t len)
{
    struct api_mreg *m = __atomic_load_n(&s->copy_mreg, __ATOMIC_RELAXED);
    uintptr_t off;
    size_t mlen;

    if (!m || __atomic_load_n(&m->handle, __ATOMIC_RELAXED) != mh) {
        m = mreg_find(mh);
        if (!m)
            return 0;
        __atomic_store_n(&s->copy_mreg, m, __ATOMIC_RELAXED);
    }
    off = (uintptr_t)buf - (uintptr_t)__atomic_load_n(&m->addr, __ATOMIC_ACQUIRE);
    mlen = __atomic_load_n(&m->len, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&m->handle, __ATOMIC_RELAXED) != mh)
        return 0;
    /* buf at or past the start (below it off wraps above mlen), len within what is left:
     * no sum that may overflow */
    return off <= mlen && len <= mlen - off;
}

int exs__api_mreg_hold(exs_mhandle_t mh, const void *buf, size_t len, struct api_mreg **m_p)
{
    return mreg_hold(mh, buf, len, m_p);
}

/* No lock: busy only rises under mreg_lock (a hold), and exs_mderegister reads it there;
 * a release it does not see yet only makes it answer EBUSY a moment longer. */
void exs__api_mreg_release(struct api_mreg *m)
{
    __atomic_sub_fetch(&m->busy, 1, __ATOMIC_RELEASE);
}

int exs_mderegister(exs_mhandle_t mh)
{
    struct api_mreg *m;
    int err = 0;

    EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
    m = mreg_find(mh);
    if (!m) {
        err = EINVAL;
    } else {
        struct api_mreg **slot = &mregs[(mh & MREG_IDX_MASK) - 1];

        /* empty the slot, then look at busy: a hold raises busy, then looks at the slot */
        __atomic_store_n(slot, NULL, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&m->busy, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(slot, m, __ATOMIC_RELEASE);
            err = EBUSY;
        } else {
            mreg_count--;
        }
    }
    EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
    if (err)
        return exs__err(err);
    exs__prov_mr_dereg(m->mr);
    if (m->mr_fb)
        exs__prov_mr_dereg(m->mr_fb);
    mreg_park(m);
    return 0;
}

/* mreg_mr_on on another context than m's own: the registration on the fallback context,
 * made at the first operation of a connection that runs there (spec/provider.md,
 * Fallback). Errors: provider errors. */
static __attribute__((noinline)) int mreg_mr_fb(struct api_mreg *m, struct exs_prov_ctx *ctx,
                                                struct exs_prov_mr **mr_p)
{
    struct exs_prov_mr *mr;
    int ret;

    EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
    mr = m->mr_fb;
    EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
    if (!mr) {
        /* registered without the lock (busy keeps m); a racing twin is dropped */
        ret = exs__prov_mr_reg(ctx, m->addr, m->len, EXS_PROV_ACCESS_LOCAL_WRITE, &mr);
        if (ret)
            return ret;
        EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
        if (m->mr_fb) {
            struct exs_prov_mr *twin = mr;

            mr = m->mr_fb;
            EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
            exs__prov_mr_dereg(twin);
        } else {
            m->mr_fb = mr;
            EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
        }
    }
    *mr_p = mr;
    return 0;
}

/* The registration of m on ctx (m held busy): m->mr (inline: the common case), or the one
 * on the fallback context. */
static inline __attribute__((always_inline)) int
mreg_mr_on(struct api_mreg *m, struct exs_prov_ctx *ctx, struct exs_prov_mr **mr_p)
{
    if (m->mr->ctx == ctx) {
        *mr_p = m->mr;
        return 0;
    }
    return mreg_mr_fb(m, ctx, mr_p);
}

/* exs_fini and the exit path: every registration deregistered and parked (handle 0: a
 * hold lets go of it), the table's arrays (the old ones too) and the records kept for the
 * next exs_init: holds and exs_send's look (mreg_covers, through a socket's hint) still
 * running read them without a lock (a call racing exs_fini is the application's mistake;
 * its answer is an error, never a read of freed memory, as for the sockets' and the
 * queues' tables). A handle stays invalid: the generation goes on. */
void exs__api_mreg_destroy_all(void)
{
    EXS_MUTEX_LOCK(&mreg_lock, EXS_LOCK_LEAF);
    for (int i = 0; i < mreg_cap; i++) {
        struct api_mreg *m = mregs[i];

        if (!m)
            continue;
        __atomic_store_n(&mregs[i], NULL, __ATOMIC_SEQ_CST);
        __atomic_store_n(&m->handle, 0, __ATOMIC_RELAXED);
        exs__prov_mr_dereg(m->mr);
        if (m->mr_fb)
            exs__prov_mr_dereg(m->mr_fb);
        m->next = mreg_parked;
        mreg_parked = m;
    }
    mreg_count = 0;
    EXS_MUTEX_UNLOCK(&mreg_lock, EXS_LOCK_LEAF);
}

/* ---- operations ---- */

static void op_done(struct exs_op *pop);

/* Operations come from the per-thread cache of exs__evq_reserve_alloc only when they fit
 * its blocks: a field added beyond would silently send every post back to malloc. */
_Static_assert(sizeof(struct api_op) <= EXS_EVQ_OP_BLOCK, "api_op outgrew EXS_EVQ_OP_BLOCK");

/* exs__api_op_new, inline in xfer_post (a call and its arguments less per send and
 * receive). */
static inline __attribute__((always_inline)) struct api_op *
op_new(struct api_sock *s, int evt_type, exs_qhandle_t q, exs_ahandle_t ah, int *err_p)
{
    struct api_op *op;
    struct exs_evq *evq;

    op = exs__evq_reserve_alloc(q, sizeof(*op), &evq, err_p);
    if (!op)
        return NULL;
    op->evt_type = evt_type;
    op->fd = s->fd;
    op->ah = ah;
    op->evq = evq;
    op->sock = s;
    op->op.done = op_done;
    op->op.owner = op;
    exs_list_init(&op->link);
    return op; /* counted live by its queue's reservation (exs__evq_ops_live) */
}

struct api_op *exs__api_op_new(struct api_sock *s, int evt_type, exs_qhandle_t q, exs_ahandle_t ah,
                               int *err_p)
{
    return op_new(s, evt_type, q, ah, err_p);
}

static void op_release(struct api_op *op)
{
    if (op->mreg)
        exs__api_mreg_release(op->mreg);
    if (op->tmp_mr)
        exs__prov_mr_put(op->tmp_mr);
    if (op->bounce)
        exs__api_bounce_free(op->bounce);
    exs__evq_op_free(op, sizeof(*op));
}

void exs__api_op_abandon(struct api_op *op)
{
    exs__evq_unreserve(op->evq);
    op_release(op);
}

void exs__api_op_event(struct api_op *op, const exs_event_t *ev_in)
{
    exs_event_t ev = *ev_in;
    struct exs_evq *evq = op->evq;

    ev.exs_evt_type = op->evt_type;
    ev.exs_evt_fd = op->fd;
    ev.exs_evt_ahandle = op->ah;
    /* release first: once the event is visible the application may count objects */
    op_release(op);
    exs__evq_post(evq, &ev);
}

/* The end of an exs_send's or exs_recv's operation (no bounce buffer): the event written
 * straight into its slot (no exs_event_t built and copied), as far as exs_qdequeue copies
 * it; op_release's work inline (op and pop freed before the event shows, as in
 * exs__api_op_event). */
static inline __attribute__((always_inline)) void op_end_xfer(struct api_op *op, int type,
                                                              ssize_t result)
{
    struct exs_evq *evq = op->evq;
    int err = op->op.err, fd = op->fd, flags = op->op.rflags;
    exs_ahandle_t ah = op->ah;
    void *buf = op->op.buf;
    size_t len = op->op.len;

    if (op->mreg)
        exs__api_mreg_release(op->mreg);
    else if (op->tmp_mr)
        exs__prov_mr_put(op->tmp_mr);
    exs__evq_op_free_x(op, sizeof(*op));
    exs__evq_post_xfer_x(evq, type, err, fd, flags, ah, buf, len, result);
}

/* One more operation of the socket ended (api_sock.n_send_done / n_recv_done): op_done is
 * its only writer, always under the conn's lock (conn.c, delivery), so no locked add;
 * release: after what the operation did (a reader's acquire, exs__api_sock_outstanding). */
static inline __attribute__((always_inline)) void op_count_done(unsigned *done)
{
    __atomic_store_n(done, __atomic_load_n(done, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

/* proto callback: an exs_send / exs_recv / exs_shutdown finished (conn->lock held). */
static void op_done(struct exs_op *pop)
{
    struct api_op *op = exs_container_of(pop, struct api_op, op);
    int type = op->evt_type;
    ssize_t result = pop->err ? -1 : pop->result;
    exs_event_t ev;

    /* the common case first, with one test of the type, bounce and to_armed */
    if (__builtin_expect(
            !(op->bounce || op->to_armed) && (type == EXS_EVT_SEND || type == EXS_EVT_RECV), 1)) {
        op_count_done(type == EXS_EVT_SEND ? &op->sock->n_send_done : &op->sock->n_recv_done);
        op_end_xfer(op, type, result);
        return;
    }
    if (type == EXS_EVT_SEND || (op->bounce && pop->kind == EXS_OP_SEND))
        op_count_done(&op->sock->n_send_done);
    else if (type == EXS_EVT_RECV || (op->bounce && pop->kind == EXS_OP_RECV))
        op_count_done(&op->sock->n_recv_done);
    if (op->to_armed)
        exs__api_to_op_end(op); /* no timeout notice after this: the completion follows */
    if (!op->bounce && (type == EXS_EVT_SEND || type == EXS_EVT_RECV)) {
        op_end_xfer(op, type, result);
        return;
    }
    ev = (exs_event_t){.exs_evt_errno = pop->err};
    if (op->bounce) {
        exs__api_bounce_event(op->bounce, result, pop->rflags, &ev);
    } else { /* exs_shutdown */
        ev.exs_evt_u.exs_evt_xfer.exs_evt_buf = pop->buf;
        ev.exs_evt_u.exs_evt_xfer.exs_evt_len = pop->len;
        ev.exs_evt_u.exs_evt_xfer.exs_evt_result = result;
        ev.exs_evt_u.exs_evt_xfer.exs_evt_flags = pop->rflags;
    }
    exs__api_op_event(op, &ev);
}

int exs__api_op_resume_mr(struct exs_op *pop, struct exs_prov_ctx *ctx)
{
    struct api_op *op = exs_container_of(pop, struct api_op, op);
    struct exs_prov_mr *mr;
    int ret;

    if (!pop->len)
        return 0;
    if (op->bounce) { /* the library's buffer: registered for this operation only */
        ret = exs__prov_mr_reg(ctx, pop->buf, pop->len, EXS_PROV_ACCESS_LOCAL_WRITE, &mr);
        if (ret)
            return ret;
        if (op->bounce->mr)
            exs__prov_mr_dereg(op->bounce->mr);
        op->bounce->mr = mr;
    } else if (op->tmp_mr) {
        ret = exs__prov_mr_get(ctx, pop->buf, pop->len, EXS_PROV_ACCESS_LOCAL_WRITE, &mr);
        if (ret)
            return ret;
        exs__prov_mr_put(op->tmp_mr);
        op->tmp_mr = mr;
    } else if (op->mreg) {
        ret = mreg_mr_on(op->mreg, ctx, &mr); /* kept with the handle (its mr_fb) */
        if (ret)
            return ret;
    } else {
        return -EINVAL;
    }
    pop->mr = mr;
    pop->lkey = mr->lkey;
    return 0;
}

/* ---- synchronous calls: one queue per thread ----
 *
 * A thread's synchronous calls post on its own queue, created at its first call and
 * deleted at thread exit (sync_key's destructor). A queue left stale by exs_fini (its
 * handle no longer valid) is replaced at the next call. When a call fails with its
 * operation still outstanding, the queue is abandoned (never reused, so no late event
 * can reach a later call); exs_fini frees it. */

static pthread_key_t sync_key;
static pthread_once_t sync_once = PTHREAD_ONCE_INIT;
static int sync_key_err;
static __thread exs_qhandle_t sync_q = EXS_QHANDLE_INVALID;

static void sync_key_dtor(void *arg)
{
    exs_qhandle_t q = (exs_qhandle_t)(intptr_t)arg;

    /* EINVAL: stale after exs_fini; EBUSY: abandoned with an operation outstanding. */
    if (exs_qdelete(q) < 0 && errno != EINVAL)
        EXS_DBG(API, "evq %d: thread exit, synchronous queue kept: %m", q);
}

static void sync_key_init(void)
{
    sync_key_err = pthread_key_create(&sync_key, sync_key_dtor);
    if (sync_key_err)
        EXS_WARN(API, "pthread_key_create: %d: synchronous queues are freed at exs_fini",
                 sync_key_err);
}

/* Forget this thread's queue; delete it unless an operation still holds a slot. */
static void sync_abandon(exs_qhandle_t q)
{
    int e = errno;

    if (q == sync_q) {
        sync_q = EXS_QHANDLE_INVALID;
        if (!sync_key_err)
            pthread_setspecific(sync_key, NULL);
    }
    if (exs_qdelete(q) < 0 && errno == EBUSY)
        EXS_DBG(API, "evq %d: synchronous queue abandoned with an operation outstanding", q);
    errno = e;
}

exs_qhandle_t exs__api_sync_queue(void)
{
    struct exs_evq *evq;
    exs_qhandle_t q = sync_q;

    if (q != EXS_QHANDLE_INVALID) {
        if (exs__evq_get(q, &evq) == 0) {
            exs__evq_put(evq);
            return q;
        }
        sync_q = EXS_QHANDLE_INVALID; /* stale: exs_fini freed it */
    }
    pthread_once(&sync_once, sync_key_init);
    q = exs__evq_create_private(1);
    if (q == EXS_QHANDLE_INVALID)
        return q;
    if (!sync_key_err && pthread_setspecific(sync_key, (void *)(intptr_t)q)) {
        exs_qdelete(q); /* no destructor would free it: make one per call */
        return exs_qcreate(1);
    }
    sync_q = q;
    return q;
}

/* The queue of a synchronous call is done with: keep it for the next call when it is
 * clean, abandon it otherwise. */
static void sync_release(exs_qhandle_t q)
{
    if (q == EXS_QHANDLE_INVALID)
        return;
    if (q != sync_q) {
        int e = errno;

        exs_qdelete(q); /* a per-call queue (no thread key) */
        errno = e;
        return;
    }
    if (exs__evq_clean(q) < 0)
        sync_abandon(q);
}

/* A synchronous call failed before its operation was accepted: report err. */
int exs__api_sync_fail(int sync, exs_qhandle_t q, int err)
{
    if (sync)
        sync_release(q);
    return exs__err(err);
}

/* The end of an accepted posting call: nothing more for an asynchronous one; a
 * synchronous one waits for its event. 0, or -1 with errno (the event's errno). */
int exs__api_call_end(int sync, exs_qhandle_t q, exs_event_t *ev)
{
    if (!sync)
        return 0;
    if (exs__api_wait_sync(q, ev))
        return -1;
    return ev->exs_evt_errno ? exs__err(ev->exs_evt_errno) : 0;
}

/* A synchronous call's wait is no cancellation point (spec/threading.md, "Thread
 * cancellation"): its operation names the caller's buffer, maybe on its stack, so a
 * cancel acts at the caller's next cancellation point after the call. */
int exs__api_wait_sync(exs_qhandle_t q, exs_event_t *ev)
{
    int cs = exs__nc_begin(), ret = 0;

    for (;;) {
        int n = exs_qdequeue(q, ev, 1, NULL);

        if (n == 1)
            break;
        if (n < 0 && errno != EINTR) {
            /* the operation may still be outstanding: never reuse the queue */
            if (q == sync_q)
                sync_abandon(q);
            else
                sync_release(q);
            ret = -1;
            break;
        }
    }
    if (!ret)
        sync_release(q);
    exs__nc_end(cs);
    return ret;
}

/* ---- send / receive ---- */

/* The end of a send that ended at its post (send_copy, send_now; conn->lock held): its
 * event written into the slot reserved in evq (NULL: a synchronous send, no event) before
 * the unlock, so it follows every earlier send's; the call's result. */
static inline __attribute__((always_inline)) int send_ended(struct api_sock *s,
                                                            struct exs_conn *conn,
                                                            struct exs_evq *evq, const void *buf,
                                                            size_t len, exs_ahandle_t ah)
{
    if (evq)
        exs__evq_post_xfer_x(evq, EXS_EVT_SEND, 0, s->fd, 0, ah, (void *)(uintptr_t)buf, len,
                             (ssize_t)len);
    exs__conn_unlock(conn);
    exs__engine_posted(); /* the application is around: spec/threading.md §4 */
    return evq ? 0 : (int)len;
}

/* exs_send's copy at the post (spec/proto-layout.md, "A send that ends at its post"): a
 * send on s (named by this thread's hazard record, no reference: api_int.h "Hazards")
 * that the STREAM send buffer takes and finishes at once goes in without
 * an operation: no block, no registration held or looked up on the provider (only
 * checked: the bytes are read here), no count of outstanding sends, nothing queued in the
 * conn, and its event written straight into the slot reserved under the conn's lock (so
 * it follows every earlier send's, posted under that lock too). A synchronous send (q
 * invalid) has no event. The call's result (0, or len when synchronous) when done so; -1
 * when the send goes the whole way, nothing taken (any error is found and reported
 * there). The caller's record names s until it lets go (exs__api_hz_clear), after this:
 * s's last put meanwhile leaves s and its conn to it. */
static inline __attribute__((always_inline)) int send_copy(struct api_sock *s, const void *buf,
                                                           size_t len, int flags, exs_qhandle_t q,
                                                           exs_ahandle_t ah, exs_mhandle_t mh)
{
    struct exs_evq *evq = NULL;
    struct exs_conn *conn;

    /* xfer_post's checks that pass (copy_max, below, is at most the largest message:
     * sock.c); no lock, as there; a send with timeout notices reserves the first one's
     * slot too */
    if (s->type != SOCK_STREAM || (flags & ~(MSG_NOSIGNAL | MSG_DONTWAIT)) || !buf ||
        __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != API_SOCK_CONNECTED ||
        __atomic_load_n(&s->snd_timeo, __ATOMIC_RELAXED))
        return -1;
    conn = s->conn;
    /* No look at the count of outstanding sends: a copy needs no application send in
     * the conn's sendq (exs__conn_send_copy, under its lock), and a send stays there until
     * its op_done took it off the count; sends counted but not yet in sendq are posts
     * racing this one, which may come after it. The slot is reserved before the conn's
     * lock (a refusal gives it back). */
    if (!exs__conn_copy_likely(conn, len) ||
        (mh != EXS_MHANDLE_UNREGISTERED && !mreg_covers(s, mh, buf, len)) ||
        (q != EXS_QHANDLE_INVALID && exs__evq_reserve_hint(q, &s->copy_evq, &evq)))
        return -1;
    if (!exs__conn_send_copy(conn, buf, len)) {
        if (evq)
            exs__evq_unreserve(evq);
        return -1;
    }
    return send_ended(s, conn, evq, buf, len, ah);
}

/* exs_send's SEQPACKET send that ends at its post (spec/proto-layout.md, "A SEQPACKET send
 * that ends at its post"): a small message that the conn writes at once, inline and
 * unsignaled, goes in without an operation, as send_copy's copy (s named by this thread's
 * hazard record; nothing of the registration held, only checked: the provider copies the
 * bytes at the post). The conn's lock is taken first and the slot reserved under it, so a
 * refusal (a send in flight or queued, no credit, no answer since the last unsignaled write: §6.4)
 * costs no reservation. The call's result as send_copy's; -1: the whole way, nothing taken. */
static inline __attribute__((always_inline)) int send_now(struct api_sock *s, const void *buf,
                                                          size_t len, int flags, exs_qhandle_t q,
                                                          exs_ahandle_t ah, exs_mhandle_t mh)
{
    struct exs_evq *evq = NULL;
    struct exs_conn *conn;

    /* xfer_post's checks that pass (len is below the eager limit: below the largest
     * message); a send with timeout notices reserves the first one's slot too */
    if ((flags & ~(MSG_NOSIGNAL | MSG_DONTWAIT)) || !buf || !len ||
        __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != API_SOCK_CONNECTED ||
        __atomic_load_n(&s->snd_timeo, __ATOMIC_RELAXED))
        return -1;
    conn = s->conn;
    if (!exs__conn_now_likely(conn) ||
        (mh != EXS_MHANDLE_UNREGISTERED && !mreg_covers(s, mh, buf, len)) ||
        !exs__conn_send_now_begin(conn, len))
        return -1;
    if ((q != EXS_QHANDLE_INVALID && exs__evq_reserve_hint(q, &s->copy_evq, &evq)) ||
        !exs__conn_send_now_post(conn, buf, len, flags)) {
        exs__conn_unlock(conn);
        if (evq)
            exs__evq_unreserve(evq);
        return -1;
    }
    return send_ended(s, conn, evq, buf, len, ah);
}

/* xfer_post's answer when it declines a socket named by a hazard record: nothing done,
 * the caller lets go and goes the whole way with a reference. */
#define XFER_HELD_ONLY (-2)

/* s: the socket at fd (exs__api_sock_find_x, held), or NULL: not a libexs socket (a
 * kernel socket's operation tells EBADF and ENOTSOCK apart). hz != NULL: s is named by
 * this thread's hazard record hz instead (exs__api_sock_hz, no reference; api_int.h
 * "Hazards"): the record lets go of it (exs__api_hz_clear) where a held s is put, after
 * the hand-over to the conn and before a synchronous call's wait; an asynchronous post
 * with timeout notices, whose timer and job take references of their own, is declined
 * (XFER_HELD_ONLY, nothing done; b is NULL then). b != NULL: exs_sendmsg /
 * exs_recvmsg / exs_sendfile of b's buffer (buf, len, mh ignored; b is taken in any case:
 * freed with the operation, or here). Inline in each of its callers: recv, hz and b are
 * constants there (a 64 B send 40 instructions less, a receive 29). */
static inline __attribute__((always_inline)) int
xfer_post(int fd, struct api_sock *s, void *buf, size_t len, int flags, exs_qhandle_t q,
          exs_ahandle_t ah, exs_mhandle_t mh, int recv, struct api_bounce *b, struct api_hz *hz)
{
    exs_event_t ev;
    int err = 0, ret, sync = q == EXS_QHANDLE_INVALID;
    int allowed = recv ? (MSG_WAITALL | MSG_DONTWAIT) : (MSG_NOSIGNAL | MSG_DONTWAIT);
    struct api_op *op = NULL;
    unsigned *count, *done;
    int armed = 0, timeo = 0;

    if (b) {
        buf = b->buf;
        len = b->len;
    }
    if (!s && exs__api_fork_stale(fd)) { /* inherited from a parent (fork.c): no system call
                                          * unless fd was one */
        if (b)
            exs__api_bounce_free(b);
        return exs__err(ESTALE);
    }
    if (!s)
        return exs__api_kfd_xfer(fd, buf, len, flags, q, ah, mh, recv, b);
    count = recv ? &s->n_recv : &s->n_send;
    done = recv ? &s->n_recv_done : &s->n_send_done;
    if (flags & ~allowed)
        err = EINVAL;
    else if ((!buf && len) || (recv && !len))
        err = EINVAL;
    else if (len > exs__engine_ctx()->caps.max_msg_size || len > UINT32_MAX)
        err = EMSGSIZE;
    if (err)
        goto out;
    /* No lock: the state is stored last (exs__api_sock_set_state), and a connected
     * socket keeps its conn as long as it lives (our reference or hazard record); a close racing
     * this post is seen by exs__conn_post (EBADF), as it would be right after an unlock. */
    enum api_sock_state st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);

    if (st != API_SOCK_CONNECTED) {
        err = st >= API_SOCK_CLOSING ? EBADF : ENOTCONN;
        goto out;
    }
    struct exs_conn *conn = s->conn;
    /* SO_ASYNC_*_TIMEOUT set: notices below */
    timeo = __atomic_load_n(recv ? &s->rcv_timeo : &s->snd_timeo, __ATOMIC_RELAXED);
    if (hz && timeo && !sync)
        return XFER_HELD_ONLY; /* the notices' timer and job take references */
    if (sync)
        q = exs__api_sync_queue();
    op = op_new(s, b ? b->evt_type : recv ? EXS_EVT_RECV : EXS_EVT_SEND, q, ah, &err);
    if (!op)
        goto out;
    op->bounce = b;
    b = NULL;
    op->op.kind = recv ? EXS_OP_RECV : EXS_OP_SEND;
    op->op.buf = buf;
    op->op.len = len;
    op->op.flags = flags;
    if (op->bounce) {
        if (len) {
            /* the library's buffer: registered for this operation only, never cached */
            ret = exs__prov_mr_reg(exs__engine_ctx(), buf, len, EXS_PROV_ACCESS_LOCAL_WRITE,
                                   &op->bounce->mr);
            if (ret) {
                err = ret == -ENOMEM ? ENOMEM : EINVAL;
                goto out;
            }
            op->op.mr = op->bounce->mr;
            op->op.lkey = op->bounce->mr->lkey;
        }
    } else if (mh == EXS_MHANDLE_UNREGISTERED) {
        if (len) {
            /* the context conn runs on (a cut-over may change it: exs__conn_post then
             * registers the buffer again, §9.2) */
            ret = exs__prov_mr_get(__atomic_load_n(&conn->ctx, __ATOMIC_RELAXED), buf, len,
                                   EXS_PROV_ACCESS_LOCAL_WRITE, /* remote rights: grants */
                                   &op->tmp_mr);
            if (ret) {
                err = ret == -ENOMEM ? ENOMEM : EINVAL;
                goto out;
            }
            op->op.mr = op->tmp_mr;
            op->op.lkey = op->tmp_mr->lkey;
        }
    } else {
        if (mreg_hold(mh, buf, len, &op->mreg)) {
            err = EINVAL;
            goto out;
        }
        ret = mreg_mr_on(op->mreg, __atomic_load_n(&conn->ctx, __ATOMIC_RELAXED), &op->op.mr);
        if (ret) {
            err = ret == -ENOMEM ? ENOMEM : EINVAL;
            goto out;
        }
        op->op.lkey = op->op.mr->lkey;
    }
    /* posted less ended (exs__api_sock_outstanding's order would cost a load more) */
    if ((int)(__atomic_add_fetch(count, 1, __ATOMIC_RELAXED) -
              __atomic_load_n(done, __ATOMIC_RELAXED)) > (int)exs__params.sock_max_ops) {
        __atomic_fetch_sub(count, 1, __ATOMIC_RELAXED);
        err = EAGAIN;
        goto out;
    }
    /* SO_ASYNC_*_TIMEOUT: the first notice's slot, and the op registered for notices */
    if (!sync && timeo) {
        err = exs__api_to_op_start(s, op, recv);
        if (err) {
            __atomic_fetch_sub(count, 1, __ATOMIC_RELAXED);
            goto out;
        }
        armed = op->to_armed;
    }
    ret = exs__conn_post(conn, &op->op);
    if (armed)
        exs__api_to_op_posted(s); /* op may be gone on success: only s is touched */
    if (ret) {
        __atomic_fetch_sub(count, 1, __ATOMIC_RELAXED);
        exs__api_to_op_end(op);
        err = -ret;
        goto out;
    }
    op = NULL;
    exs__engine_posted(); /* the application is around: spec/threading.md §4 */
out:
    if (op)
        exs__api_op_abandon(op);
    if (b)
        exs__api_bounce_free(b);
    if (hz)
        exs__api_hz_clear(hz, s);
    else
        exs__api_sock_put(s);
    if (err)
        return exs__api_sync_fail(sync, q, err);
    if (exs__api_call_end(sync, q, &ev))
        return -1;
    /* exs_evt_xfermsg_t keeps its result where exs_evt_xfer_t has it */
    return sync ? (int)ev.exs_evt_u.exs_evt_xfer.exs_evt_result : 0;
}

int exs__api_xfer_bounce(int fd, int flags, exs_qhandle_t q, exs_ahandle_t ah, int recv,
                         struct api_bounce *b)
{
    return xfer_post(fd, exs__api_sock_find_x(fd), NULL, 0, flags, q, ah, EXS_MHANDLE_UNREGISTERED,
                     recv, b, NULL);
}

/* exs_send of a libexs socket, with the socket named by this thread's hazard record (no
 * reference): the copy at the post (STREAM) or send_now (SEQPACKET), else the whole way
 * (xfer_post); with the socket found (held) when there is no record or xfer_post declines; or what
 * exs__api_kfd_send_fast (kfd.c) did not take. */
__attribute__((noinline)) int exs__api_send_slow(int fd, const void *buf, size_t len, int flags,
                                                 exs_qhandle_t q, exs_ahandle_t ah,
                                                 exs_mhandle_t mh)
{
    struct api_hz *hz = exs__api_hz_self;
    struct api_sock *s;

    if (__builtin_expect(!hz, 0))
        hz = exs__api_hz_new();
    if (hz && (s = exs__api_sock_hz(fd, hz))) {
        int ret = s->type == SOCK_SEQPACKET ? send_now(s, buf, len, flags, q, ah, mh)
                                            : send_copy(s, buf, len, flags, q, ah, mh);

        if (ret < 0)
            ret = xfer_post(fd, s, (void *)(uintptr_t)buf, len, flags, q, ah, mh, 0, NULL, hz);
        else
            exs__api_hz_clear(hz, s);
        if (ret != XFER_HELD_ONLY)
            return ret;
        exs__api_hz_clear(hz, s);
    }
    return xfer_post(fd, exs__api_sock_find_x(fd), (void *)(uintptr_t)buf, len, flags, q, ah, mh, 0,
                     NULL, NULL);
}

int exs_send(int fd, const void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
             exs_mhandle_t mh)
{
    /* a libexs socket's goes to exs__api_send_slow at once (the copy at the post, else the
     * whole way); a kernel socket's that completes at once is done in
     * exs__api_kfd_send_fast, which sends the rest back to exs__api_send_slow (tail calls:
     * no frame of exs_send's own) */
    if (exs__api_sock_at(fd))
        return exs__api_send_slow(fd, buf, len, flags, q, ah, mh);
    return exs__api_kfd_send_fast(fd, buf, len, flags, q, ah, mh);
}

/* exs_recv: with the socket named by this thread's hazard record (no reference), else
 * found (held), as exs_send's. */
int exs_recv(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
             exs_mhandle_t mh)
{
    struct api_hz *hz = exs__api_hz_self;
    struct api_sock *s;

    if (__builtin_expect(!hz, 0))
        hz = exs__api_hz_new();
    if (hz && (s = exs__api_sock_hz(fd, hz))) {
        int ret = xfer_post(fd, s, buf, len, flags, q, ah, mh, 1, NULL, hz);

        if (ret != XFER_HELD_ONLY)
            return ret;
        exs__api_hz_clear(hz, s);
    }
    return xfer_post(fd, exs__api_sock_find_x(fd), buf, len, flags, q, ah, mh, 1, NULL, NULL);
}

static int cancel_match(struct exs_op *pop, void *arg)
{
    struct api_op *op = exs_container_of(pop, struct api_op, op);

    return op->ah == arg;
}

/* EXS_CAF_FILDES: every operation of the socket. */
static int cancel_match_all(struct exs_op *pop, void *arg)
{
    (void)pop;
    (void)arg;
    return 1;
}

int exs_cancel(int fd, exs_ahandle_t ah, int flags)
{
    int err = 0;
    struct api_sock *s;

    if (fd == -1) /* exs_poll requests: their events carry fd -1 */
        return exs__api_poll_cancel(ah, flags == EXS_CAF_AHANDLE ? 0 : flags);
    s = exs__api_sock_get(fd, &err);

    if (!s)
        return err == ENOTSOCK ? exs__api_kfd_cancel(fd, ah, flags) : exs__err(err);
    api_sock_lock(s);
    struct exs_conn *conn = s->state == API_SOCK_CONNECTED ? s->conn : NULL;
    api_sock_unlock(s);
    if (exs__api_cancel_flags_bad(flags))
        err = EINVAL;
    else if (conn)
        exs__conn_cancel(conn, flags == EXS_CAF_FILDES ? cancel_match_all : cancel_match, ah);
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}

/* A forked child (fork.c): the parent's registrations and operations are not the
 * child's; their handles fail with EINVAL (the generation goes on, so a new handle
 * differs from an inherited one). */
void exs__api_xfer_fork_child(void)
{
    exs__forsake(mregs);
    mregs = NULL;
    mreg_cap = mreg_count = 0;
    /* the parent's old arrays too (the child's table grows from nothing again); parked
     * records are only memory and are reused */
    while (mreg_nretired)
        exs__forsake(mreg_retired[--mreg_nretired]);
    pthread_mutex_init(&mreg_lock, NULL);
}
