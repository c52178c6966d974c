/* SPDX-License-Identifier: MIT */
/* ES-API sockets: descriptor table, state machine, connections, socket/bind/connect/shutdown/close.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/api/kfd.h"
#include "exs/api/sock_int.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- descriptor table ---- */

/* The table: tab and tab_len change under tab_lock, its slots are written there with
 * atomic stores. exs__api_sock_find takes no lock: it reads a slot through tabv (atomic),
 * raises the socket's reference count unless it is 0, and then checks that the table
 * (the current array) still names that socket at fd; the table's own reference is
 * dropped after its slot is emptied, so a socket at 0 has left the table. For that,
 * nothing such a reader may be reading is ever freed (exs_fini keeps them too, for the
 * next exs_init): a grown table keeps its old array, and a socket whose last reference
 * went is parked (sock_parked, count 0) and reused by a later exs__api_sock_new. */
static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
struct sock_tabv *exs__api_sock_tabv; /* api_int.h (exs__api_sock_at) */
#define tabv exs__api_sock_tabv
static struct api_sock **tab;
static int tab_len;
int exs__api_sock_nlive; /* api_int.h (exs__api_sock_live) */
#define sock_live exs__api_sock_nlive
static pthread_mutex_t park_lock = PTHREAD_MUTEX_INITIALIZER; /* sock_parked (leaf) */
static struct api_sock *sock_parked;                          /* by park_next */

void exs__api_sock_ref(struct api_sock *s)
{
    __atomic_fetch_add(&s->refs, 1, __ATOMIC_RELAXED);
}

/* s (count 0, freed of all it held) kept for reuse: a lookup may still read its count. */
static void sock_park(struct api_sock *s)
{
    EXS_MUTEX_LOCK(&park_lock, EXS_LOCK_LEAF);
    s->park_next = sock_parked;
    sock_parked = s;
    EXS_MUTEX_UNLOCK(&park_lock, EXS_LOCK_LEAF);
}

/* s's last reference went and no hazard names it: its conn, its number, its parent's
 * reference go; it is parked. */
static void sock_destroy(struct api_sock *s)
{
    if (s->conn)
        exs__conn_destroy(s->conn); /* DEAD: provider objects already gone */
    if (s->fd_open)
        exs__nc_close(s->fd);
    if (s->parent)
        exs__api_sock_put(s->parent);
    pthread_mutex_destroy(&s->lock);
    sock_park(s);
    __atomic_fetch_sub(&sock_live, 1, __ATOMIC_RELAXED);
}

/* ---- hazards (api_int.h, "Hazards") ---- */

struct api_hz *exs__api_hz_list; /* atomic: every record ever made */
__thread struct api_hz *exs__api_hz_self;
static pthread_once_t hz_once = PTHREAD_ONCE_INIT;
static pthread_key_t hz_key;
static int hz_ok; /* the key made and membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) registered */

/* A thread that made a record ends: the record is free for another (it names nothing:
 * a hazard spans one call). */
static void hz_thread_end(void *arg)
{
    struct api_hz *hz = arg;

    exs__api_hz_self = NULL;
    __atomic_store_n(&hz->used, 0, __ATOMIC_RELEASE);
}

/* Before the first record (so every record's thread and every put see one mode). */
static void hz_init(void)
{
    hz_ok = syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0 &&
            !pthread_key_create(&hz_key, hz_thread_end);
}

struct api_hz *exs__api_hz_new(void)
{
    struct api_hz *hz;

    pthread_once(&hz_once, hz_init);
    if (!hz_ok)
        return NULL; /* references only */
    for (hz = __atomic_load_n(&exs__api_hz_list, __ATOMIC_ACQUIRE); hz; hz = hz->next) {
        int free_ = 0;

        if (__atomic_compare_exchange_n(&hz->used, &free_, 1, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            break;
    }
    if (!hz) {
        hz = calloc(1, sizeof(*hz));
        if (!hz)
            return NULL;
        hz->used = 1;
        hz->next = __atomic_load_n(&exs__api_hz_list, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&exs__api_hz_list, &hz->next, hz, 1, __ATOMIC_SEQ_CST,
                                            __ATOMIC_RELAXED))
            ;
    }
    if (pthread_setspecific(hz_key, hz)) {
        __atomic_store_n(&hz->used, 0, __ATOMIC_RELEASE);
        return NULL;
    }
    exs__api_hz_self = hz;
    return hz;
}

/* The full fence of a last put's side (records exist: membarrier registered): every
 * running thread of the process passes a full barrier before it returns, and the caller
 * one at its entry and one at its exit (the kernel's smp_mb() there); the other side's
 * fence is a compiler barrier. It does not fail once registered. */
static void hz_heavy_fence(void)
{
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) != 0) {
        EXS_ERR(API, "membarrier: %s", strerror(errno));
        abort(); /* the other side's fences are compiler barriers: nothing else is safe */
    }
}

/* No record made yet: none can name s (a record is pushed, a seq_cst CAS, before it names
 * anything; the count's drop to 0 came before this look, so a thread pushing after it
 * sees the count 0 when it checks and lets go). w: s->hz as the caller saw it marked;
 * the claim takes that lifetime only (spec/api.md "Hazard records": a finisher that read
 * w, was overtaken by another that destroyed and parked s, and s unparked by
 * exs__api_sock_new meanwhile, finds the generation moved on and leaves the new socket). */
void exs__api_sock_hz_finish(struct api_sock *s, uint64_t w)
{
    struct api_hz *hz = __atomic_load_n(&exs__api_hz_list, __ATOMIC_SEQ_CST);

    if ((w & (EXS_API_HZ_DEFER | EXS_API_HZ_CLAIMED)) != EXS_API_HZ_DEFER)
        return; /* taken already */
    if (hz) {
        hz_heavy_fence();
        for (; hz; hz = hz->next)
            if (__atomic_load_n(&hz->s, __ATOMIC_ACQUIRE) == s)
                return; /* that thread finishes s when it lets go (exs__api_hz_clear) */
    }
    if (!__atomic_compare_exchange_n(&s->hz, &w, w | EXS_API_HZ_CLAIMED, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return; /* another one finishes it, or did and s lives again */
    sock_destroy(s);
}

void exs__api_sock_put(struct api_sock *s)
{
    uint64_t w;

    /* seq_cst: before exs__api_sock_hz_finish's look at the records */
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_SEQ_CST))
        return;
    /* once a lifetime (the count reaches 0 once: nothing raises it from 0); release: what
     * this thread did with s before its destroy elsewhere */
    w = __atomic_or_fetch(&s->hz, EXS_API_HZ_DEFER, __ATOMIC_ACQ_REL);
    exs__api_sock_hz_finish(s, w);
}

struct api_sock *exs__api_sock_hold(int fd, struct api_sock *s)
{
    return exs__api_sock_hold_x(fd, s);
}

struct api_sock *exs__api_sock_find(int fd)
{
    return exs__api_sock_find_x(fd);
}

/* The socket behind fd with a reference, or NULL with *err_p = EBADF / ENOTSOCK. */
struct api_sock *exs__api_sock_get(int fd, int *err_p)
{
    struct api_sock *s = exs__api_sock_find(fd);

    if (!s)
        *err_p = exs__api_fork_stale(fd)                 ? ESTALE
                 : (fd >= 0 && fcntl(fd, F_GETFD) != -1) ? ENOTSOCK
                                                         : EBADF;
    return s;
}

int exs__api_sock_tab_insert(struct api_sock *s)
{
    int ret = 0;

    EXS_MUTEX_LOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    if (s->fd >= tab_len) {
        int n = EXS_MAX(s->fd + 1, tab_len * 2);
        struct sock_tabv *t = calloc(1, sizeof(*t) + (size_t)n * sizeof(t->e[0]));

        if (!t) {
            ret = -ENOMEM;
            goto out;
        }
        t->len = n;
        t->old = tabv;
        if (tab_len)
            memcpy(t->e, tab, (size_t)tab_len * sizeof(t->e[0]));
        tab = t->e;
        tab_len = n;
        __atomic_store_n(&tabv, t, __ATOMIC_RELEASE);
    }
    EXS_ASSERT(!tab[s->fd]);
    __atomic_store_n(&tab[s->fd], s, __ATOMIC_RELEASE);
    exs__api_sock_ref(s);
out:
    EXS_MUTEX_UNLOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    return ret;
}

/* Remove s from the table; 1 when this call removed it. */
static int tab_remove(struct api_sock *s)
{
    int removed = 0;

    EXS_MUTEX_LOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    if (s->fd >= 0 && s->fd < tab_len && tab[s->fd] == s) {
        __atomic_store_n(&tab[s->fd], NULL, __ATOMIC_RELEASE); /* before the put */
        removed = 1;
    }
    EXS_MUTEX_UNLOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    if (removed)
        exs__api_sock_put(s);
    return removed;
}

/* A parked socket, all zero but its count (0: a lookup may be reading it) and its hazard
 * word (the next generation: a finisher of an earlier lifetime still holding the old
 * word must not match it), or a new one. */
static struct api_sock *sock_unpark(void)
{
    struct api_sock *s;
    size_t keep = offsetof(struct api_sock, refs), keep_end;

    _Static_assert(offsetof(struct api_sock, hz) > offsetof(struct api_sock, refs),
                   "sock_unpark keeps refs..hz");
    keep_end = offsetof(struct api_sock, hz) + sizeof(s->hz);
    s = EXS_PARKED_POP(&park_lock, sock_parked, park_next);
    if (!s)
        return calloc(1, sizeof(*s));
    memset(s, 0, keep);
    memset((char *)s + keep_end, 0, sizeof(*s) - keep_end);
    /* the old lifetime was claimed (sock_destroy, then parked under park_lock) */
    __atomic_store_n(
        &s->hz,
        (__atomic_load_n(&s->hz, __ATOMIC_RELAXED) & ~(uint64_t)(EXS_API_HZ_GEN1 - 1)) +
            EXS_API_HZ_GEN1,
        __ATOMIC_RELAXED);
    return s;
}

struct api_sock *exs__api_sock_new(int domain, int type)
{
    struct api_sock *s = sock_unpark();

    if (!s)
        return NULL;
    s->fd = eventfd(0, EFD_CLOEXEC);
    if (s->fd < 0) {
        sock_park(s);
        return NULL;
    }
    s->fd_open = 1;
    s->domain = domain;
    s->type = type;
    s->rcvbuf = (uint32_t)exs__params.ring_size;
    s->sndbuf = (uint32_t)exs__params.sndbuf;
    s->xfer_mode = exs__api_default_xfer_mode();
    s->keepalive = 1; /* interval EXS_KEEPALIVE_INTV_MS unless EXS_SO_KEEPALIVE_MS is set */
    pthread_mutex_init(&s->lock, NULL);
    exs_list_init(&s->ready);
    exs_list_init(&s->accepts);
    exs_list_init(&s->deferred);
    exs_list_init(&s->child_link);
    exs_list_init(&s->to_ops);
    __atomic_fetch_add(&sock_live, 1, __ATOMIC_RELAXED);
    /* last: a lookup that read this parked socket earlier counts it only from now on */
    __atomic_store_n(&s->refs, 1, __ATOMIC_RELEASE);
    return s;
}

/* Every socket of the table, each held by a reference the caller drops with
 * exs__api_sock_put, in an array the caller frees (the control endpoint's stat, ctl/ctl.c).
 * -ENOMEM when the array cannot be made. */
int exs__api_sock_list(struct api_sock ***all_p, int *n_p)
{
    struct api_sock **all;
    int n = 0;

    EXS_MUTEX_LOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    all = malloc(((size_t)tab_len + 1) * sizeof(*all));
    for (int fd = 0; all && fd < tab_len; fd++)
        if (tab[fd]) {
            exs__api_sock_ref(tab[fd]);
            all[n++] = tab[fd];
        }
    EXS_MUTEX_UNLOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
    if (!all)
        return -ENOMEM;
    *all_p = all;
    *n_p = n;
    return 0;
}

/* ---- the socket's state machine (spec/states.md, "Socket") ---- */

static const char *const sock_state_names[API_SOCK_STATE_COUNT] = {
    [API_SOCK_NEW] = "NEW",
    [API_SOCK_BOUND] = "BOUND",
    [API_SOCK_LISTENING] = "LISTENING",
    [API_SOCK_CONNECTING] = "CONNECTING",
    [API_SOCK_CONNECTED] = "CONNECTED",
    [API_SOCK_CLOSING] = "CLOSING",
    [API_SOCK_ABORTING] = "ABORTING",
    [API_SOCK_FINISHING] = "FINISHING",
};

const char *exs__api_sock_state_name(enum api_sock_state st)
{
    return st < API_SOCK_STATE_COUNT ? sock_state_names[st] : "?";
}

#define SOCK_BIT(_st) (1u << (_st))
#define SOCK_OPEN_STATES                                                                           \
    (SOCK_BIT(API_SOCK_NEW) | SOCK_BIT(API_SOCK_BOUND) | SOCK_BIT(API_SOCK_LISTENING) |            \
     SOCK_BIT(API_SOCK_CONNECTING) | SOCK_BIT(API_SOCK_CONNECTED))

/* The transition table: from each state, the states it may go to (spec/states.md). */
static const uint32_t sock_next[API_SOCK_STATE_COUNT] = {
    [API_SOCK_NEW] = SOCK_BIT(API_SOCK_BOUND) | SOCK_BIT(API_SOCK_LISTENING) |
                     SOCK_BIT(API_SOCK_CONNECTING) | SOCK_BIT(API_SOCK_CLOSING) |
                     SOCK_BIT(API_SOCK_ABORTING),
    [API_SOCK_BOUND] = SOCK_BIT(API_SOCK_LISTENING) | SOCK_BIT(API_SOCK_CONNECTING) |
                       SOCK_BIT(API_SOCK_CLOSING) | SOCK_BIT(API_SOCK_ABORTING),
    [API_SOCK_LISTENING] =
        SOCK_BIT(API_SOCK_BOUND) | SOCK_BIT(API_SOCK_CLOSING) | SOCK_BIT(API_SOCK_ABORTING),
    [API_SOCK_CONNECTING] = SOCK_BIT(API_SOCK_NEW) | SOCK_BIT(API_SOCK_BOUND) |
                            SOCK_BIT(API_SOCK_CONNECTED) | SOCK_BIT(API_SOCK_CLOSING) |
                            SOCK_BIT(API_SOCK_ABORTING) | SOCK_BIT(API_SOCK_FINISHING),
    [API_SOCK_CONNECTED] = SOCK_BIT(API_SOCK_CLOSING) | SOCK_BIT(API_SOCK_ABORTING),
    [API_SOCK_CLOSING] = SOCK_BIT(API_SOCK_FINISHING),
    [API_SOCK_ABORTING] = SOCK_BIT(API_SOCK_FINISHING),
    [API_SOCK_FINISHING] = 0,
};

/* The one place a socket changes state (s->lock held, or s not yet shared). */
void exs__api_sock_set_state(struct api_sock *s, enum api_sock_state st, const char *why)
{
    EXS_ASSERT(sock_next[s->state] & SOCK_BIT(st));
    EXS_TRACE(API, "sock %p fd %d: %s -> %s (%s)", (void *)s, s->fd, sock_state_names[s->state],
              sock_state_names[st], why);
    /* a post reads it without the lock (xfer.c): CONNECTED is seen with s->conn set */
    __atomic_store_n(&s->state, st, __ATOMIC_RELEASE);
}

/* exs_close or exs_fini has taken the socket: CLOSING, ABORTING or FINISHING. */
static int sock_is_closing(const struct api_sock *s)
{
    return !(SOCK_OPEN_STATES & SOCK_BIT(s->state));
}

static void sock_finish_close_job(struct exs_job *job);

/* CLOSING/ABORTING -> FINISHING: the conn is dead (or there is none): queue the last
 * step of the close. The state says it is queued once. */
static void sock_finish_locked(struct api_sock *s, const char *why)
{
    exs__api_sock_set_state(s, API_SOCK_FINISHING, why);
    s->finish_job.fn = sock_finish_close_job;
    exs__engine_post(&s->finish_job);
}

/* ---- connections: callbacks from the proto layer (conn->lock held) ---- */

static void sock_conn_established(struct exs_conn *conn, int err);
static void sock_conn_dead(struct exs_conn *conn);

/* The cut-over (spec/protocol.md §9.2), conn->lock held: the new path's context and the
 * peer's address on it (the connect's address, port + fallback_port_offset). */
static int sock_resume_addr(struct exs_conn *conn, struct exs_prov_ctx **ctx_p,
                            struct sockaddr_storage *addr, socklen_t *len_p)
{
    struct api_sock *s = conn->owner;
    struct exs_prov_ctx *fb = exs__engine_fallback_ctx();
    int ret;

    if (!fb)
        return -EOPNOTSUPP;
    api_sock_lock(s);
    ret = exs__engine_fallback_addr((struct sockaddr *)&s->peer, s->peer_len, addr, len_p);
    api_sock_unlock(s);
    *ctx_p = fb;
    return ret;
}

static int sock_resume_mr(struct exs_conn *conn, struct exs_op *op, struct exs_prov_ctx *ctx)
{
    (void)conn;
    return exs__api_op_resume_mr(op, ctx);
}

static const struct exs_conn_cb sock_conn_cb = {
    .established = sock_conn_established,
    .dead = sock_conn_dead,
    .resume_addr = sock_resume_addr,
    .resume_mr = sock_resume_mr,
};

/* A conn for s on provider context ctx (the primary, or the fallback). */
int exs__api_sock_conn_new(struct api_sock *s, struct exs_prov_ctx *ctx)
{
    /* policy any: a conn on the primary may be cut over to the fallback (§9.2) */
    int resumable =
        exs__engine_fallback_policy() == EXS_ENG_FB_ANY && ctx != exs__engine_fallback_ctx();
    /* shm beside a tcp primary: a conn on the primary may be switched to it on one host
     * (spec/provider-shm.md, Chosen by itself), with the cut-over's session */
    int shm = exs__engine_fallback_policy() == EXS_ENG_FB_SHM && ctx != exs__engine_fallback_ctx();
    struct exs_conn_params p = {
        .sock_type = s->type,
        .credits = (uint32_t)exs__params.credits,
        .ring_size = s->rcvbuf,
        .eager_max = (uint32_t)exs__params.eager_max,
        .xfer_mode = s->xfer_mode,
        .max_reads = (uint32_t)exs__params.max_reads,
        .batch_max = (uint32_t)exs__params.batch_max,
        /* as on Linux, an explicit SO_RCVBUF fixes the size; a resumable conn is tuned
         * too (a cut in any resize state resumes, §9.2) */
        .autotune = !s->rcvbuf_set,
        .sndbuf = s->sndbuf,
        /* at most the largest message, which exs_send's copy at the post then need not
         * look at (xfer.c, send_copy) */
        .copy_max = (uint32_t)EXS_MIN(EXS_MIN(exs__params.stream_copy_max, (uint64_t)s->sndbuf),
                                      exs__engine_ctx()->caps.max_msg_size),
        .resumable = resumable || shm,
        .shm = shm,
    };
    /* The conn lives as long as its socket (freed in the last exs__api_sock_put), so a
     * caller holding a socket reference may always use it; its callbacks stop at DEAD,
     * before the socket's closing reference goes. */
    return exs__conn_create(ctx, &p, &sock_conn_cb, s, &s->conn);
}

/* Progress thread: free a conn detached from its socket after a failed connect. */
static void sock_conn_destroy_job(struct exs_job *job)
{
    exs__conn_destroy(exs_container_of(job, struct exs_conn, owner_job));
}

/* Free conn on the progress thread (it was detached from its socket). */
static void sock_conn_destroy_later(struct exs_conn *conn)
{
    conn->owner_job.fn = sock_conn_destroy_job;
    exs__engine_post(&conn->owner_job);
}

/* The keepalive interval of s now, ms (0: off) (lock held). */
static uint64_t sock_ka_ms_locked(struct api_sock *s)
{
    if (!s->keepalive)
        return 0;
    return s->keepalive_ms ? (uint64_t)s->keepalive_ms
                           : __atomic_load_n(&exs__params.keepalive_intv_ms, __ATOMIC_RELAXED);
}

/* Progress thread: the conn's periodic check is due (spec/protocol.md §9). */
static void sock_conn_timer(struct exs_eng_timer *t)
{
    struct api_sock *s = exs_container_of(t, struct api_sock, conn_timer);
    struct exs_conn *conn;
    uint64_t ka_ms, next = 0;

    api_sock_lock(s);
    conn = s->state < API_SOCK_FINISHING ? s->conn : NULL;
    ka_ms = sock_ka_ms_locked(s);
    api_sock_unlock(s);
    if (conn)
        next = exs__conn_timer(conn, ka_ms); /* may end conn: its callbacks run inside */
    if (conn)
        exs__api_poll_kick(); /* a conn it ended is readable / hung up now */
    if (next)
        exs__engine_timer_start(&s->conn_timer, next, sock_conn_timer);
}

/* Progress thread: run the check at once, which arms the next one. The finish job stops
 * it, so it never outlives the socket. */
void exs__api_sock_conn_timer_kick(struct api_sock *s)
{
    exs__engine_timer_stop(&s->conn_timer);
    exs__engine_timer_start(&s->conn_timer, 0, sock_conn_timer);
}

/* Progress thread: exs_connect went out: its deadline starts. */
static void sock_ka_job(struct exs_job *job)
{
    struct api_sock *s = exs_container_of(job, struct api_sock, ka_job);
    int go;

    api_sock_lock(s);
    s->ka_job_busy = 0;
    go = s->conn && (s->state == API_SOCK_CONNECTING || s->state == API_SOCK_CONNECTED);
    api_sock_unlock(s);
    if (go)
        exs__api_sock_conn_timer_kick(s);
    exs__api_sock_put(s); /* the job's reference */
}

static void sock_post_simple(struct api_op *op, int type, int err)
{
    exs_event_t ev = {.exs_evt_type = type, .exs_evt_errno = err};

    if (type == EXS_EVT_ACCEPT)
        ev.exs_evt_u.exs_evt_accept.exs_evt_newfd = -1;
    else
        ev.exs_evt_u.exs_evt_xfer.exs_evt_result = err ? -1 : 0;
    exs__api_op_event(op, &ev);
}

/* Progress thread: the connect of s failed on the primary provider with errno err (the
 * failed conn is gone): connect again to the same address over the fallback context
 * (spec/provider.md, Fallback). Nothing to do when a close came meanwhile: it completes
 * the connect operation. */
static void sock_fallback_connect(struct api_sock *s, int err)
{
    struct sockaddr_storage fa;
    socklen_t flen = 0;
    struct exs_conn *conn = NULL;
    struct api_op *op = NULL;
    int ret;

    api_sock_lock(s);
    if (s->state != API_SOCK_CONNECTING || !s->connect_op || s->conn) {
        api_sock_unlock(s);
        return;
    }
    ret = exs__engine_fallback_addr((struct sockaddr *)&s->peer, s->peer_len, &fa, &flen);
    if (!ret)
        ret = exs__api_sock_conn_new(s, exs__engine_fallback_ctx());
    conn = ret ? NULL : s->conn;
    api_sock_unlock(s);
    if (!ret) {
        exs__engine_fallback_note(err, (struct sockaddr *)&s->peer, s->fd);
        ret = exs__conn_connect(conn, (struct sockaddr *)&fa, flen);
    }
    if (!ret) {
        exs__api_sock_conn_timer_kick(s); /* the new handshake's deadline */
        return;
    }
    EXS_INFO(API, "fd %d: connect over the fallback failed at once: %s", s->fd, strerror(-ret));
    api_sock_lock(s);
    if (conn && s->conn == conn)
        s->conn = NULL;
    if (s->state == API_SOCK_CONNECTING) {
        op = s->connect_op;
        s->connect_op = NULL;
        exs__api_sock_set_state(s, s->local_len ? API_SOCK_BOUND : API_SOCK_NEW, "connect failed");
    }
    api_sock_unlock(s);
    if (conn)
        exs__conn_destroy(conn); /* never connected: IDLE */
    if (op)
        sock_post_simple(op, EXS_EVT_CONNECT, err); /* the primary's failure */
}

/* Progress thread: a conn whose connect failed on the primary is freed and its socket's
 * connect retried over the fallback. */
static void sock_fallback_job(struct exs_job *job)
{
    struct exs_conn *conn = exs_container_of(job, struct exs_conn, owner_job);
    struct api_sock *s = conn->owner;
    int err = conn->err;

    exs__conn_destroy(conn);
    sock_fallback_connect(s, err);
    exs__api_sock_put(s); /* the job's reference */
}

/* exs_connect (s locked): the primary's connect call itself failed with errno err: as
 * for a failure reported later, the socket stays CONNECTING with its connect operation and
 * a job frees conn (IDLE, detached: nothing else reaches it) and connects over the
 * fallback (spec/provider.md, Fallback). */
static void sock_connect_fallback_later(struct api_sock *s, struct exs_conn *conn, int err)
{
    EXS_INFO(API, "fd %d: the primary's connect call failed (%s): over the fallback", s->fd,
             strerror(err));
    conn->err = err;      /* read by the job */
    exs__api_sock_ref(s); /* the job's */
    conn->owner_job.fn = sock_fallback_job;
    exs__engine_post(&conn->owner_job);
}

static void sock_conn_established(struct exs_conn *conn, int err)
{
    struct api_sock *s = conn->owner;
    struct api_sock *parent = s->parent;

    if (parent) {
        /* passive child: ready for exs_accept, or gone */
        api_sock_lock(parent);
        parent->n_embryo--;
        if (!err && parent->state == API_SOCK_LISTENING) {
            api_sock_lock(s);
            exs__api_sock_set_state(s, API_SOCK_CONNECTED, "accepted");
            api_sock_unlock(s);
            exs__api_sock_conn_timer_kick(s); /* keepalive from now on */
            exs_list_add_tail(&parent->ready, &s->child_link);
            parent->n_ready++;
            exs__api_sock_deliver_accepts_locked(parent);
        } else if (!err) {
            /* the listener closed meanwhile: reset the child; its death finishes it */
            api_sock_lock(s);
            exs__api_sock_set_state(s, API_SOCK_ABORTING, "listener closed");
            api_sock_unlock(s);
            exs__conn_abort_locked(conn);
        }
        exs__api_sock_defer_kick_locked(parent); /* an embryo fewer */
        api_sock_unlock(parent);
        if (err) {
            /* never accepted and already dead: finished as a closed socket */
            api_sock_lock(s);
            sock_finish_locked(s, "handshake failed");
            api_sock_unlock(s);
        }
        return;
    }
    api_sock_lock(s);
    struct api_op *op = s->connect_op;
    s->connect_op = NULL;
    if (!err) {
        socklen_t len = sizeof(s->local);

        if (s->state == API_SOCK_CONNECTING) {
            exs__api_sock_set_state(s, API_SOCK_CONNECTED, "connected");
            exs__api_sock_conn_timer_kick(s); /* keepalive from now on */
        }
        if (!exs__prov_ep_local_addr(conn->ep, &s->local, &len))
            s->local_len = len;
    } else if (s->state == API_SOCK_CONNECTING && op &&
               exs__engine_fallback_eligible(conn->ctx, err)) {
        /* retried over the fallback context by a job (conn locks do not nest); the
         * socket stays CONNECTING with its connect operation */
        s->connect_op = op;
        op = NULL;
        s->conn = NULL;
        exs__api_sock_ref(s); /* the job's */
        conn->owner_job.fn = sock_fallback_job;
        exs__engine_post(&conn->owner_job);
    } else if (s->state == API_SOCK_CONNECTING) {
        exs__api_sock_set_state(s, s->local_len ? API_SOCK_BOUND : API_SOCK_NEW, "connect failed");
        s->conn = NULL;
        sock_conn_destroy_later(conn);
    }
    api_sock_unlock(s);
    if (op)
        sock_post_simple(op, EXS_EVT_CONNECT, err);
}

/* Progress thread (conn->lock held): the connection is over. A closing socket can now
 * be finished; an open one stays (its operations already completed). A conn that ended
 * before it was established (the peer broke the protocol during the handshake) ends its
 * socket's connect, or its embryonic accepted socket, as a failed handshake would: with
 * the conn's error (spec/api.md, exs_connect). */
static void sock_conn_dead(struct exs_conn *conn)
{
    struct api_sock *s = conn->owner;
    int connecting;

    api_sock_lock(s);
    if (s->state == API_SOCK_CLOSING || s->state == API_SOCK_ABORTING)
        sock_finish_locked(s, "connection dead");
    connecting = s->state == API_SOCK_CONNECTING && s->conn == conn;
    api_sock_unlock(s);
    if (connecting)
        sock_conn_established(conn, conn->err ? conn->err : ECONNRESET);
}

/* ---- socket calls ---- */

int exs_socket(int domain, int type, int protocol)
{
    struct api_sock *s;

    if (!exs__api_initialized())
        return exs__err(EINVAL);
    if (domain != AF_INET && domain != AF_INET6)
        return exs__err(EAFNOSUPPORT);
    type &= ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (type != SOCK_SEQPACKET && type != SOCK_STREAM)
        return exs__err(EPROTONOSUPPORT);
    if (protocol != 0)
        return exs__err(EPROTONOSUPPORT);
    s = exs__api_sock_new(domain, type);
    if (!s)
        return exs__err(errno == EMFILE || errno == ENFILE ? errno : ENOMEM);
    if (exs__api_sock_tab_insert(s)) {
        exs__api_sock_put(s);
        return exs__err(ENOMEM);
    }
    exs__api_sock_put(s); /* the table holds it */
    return s->fd;
}

static int sock_check_addr(struct api_sock *s, const struct sockaddr *addr, socklen_t len)
{
    if (!addr)
        return EINVAL;
    if (addr->sa_family != s->domain)
        return EAFNOSUPPORT;
    if ((s->domain == AF_INET && len < sizeof(struct sockaddr_in)) ||
        (s->domain == AF_INET6 && len < sizeof(struct sockaddr_in6)))
        return EINVAL;
    return 0;
}

int exs_bind(int fd, const struct sockaddr *addr, socklen_t addrlen)
{
    int err = 0;
    struct api_sock *s = exs__api_sock_get(fd, &err);

    if (!s)
        return exs__err(err);
    api_sock_lock(s);
    if (!(err = sock_check_addr(s, addr, addrlen))) {
        if (s->state != API_SOCK_NEW) {
            err = EINVAL;
        } else {
            s->local_len =
                s->domain == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
            memcpy(&s->local, addr, s->local_len);
            exs__api_sock_set_state(s, API_SOCK_BOUND, "bind");
        }
    }
    api_sock_unlock(s);
    exs__api_sock_put(s);
    return err ? exs__err(err) : 0;
}

int exs_connect(int fd, const struct sockaddr *addr, socklen_t addrlen, exs_qhandle_t q,
                exs_ahandle_t ah)
{
    exs_event_t ev;
    int err = 0, ret, sync = q == EXS_QHANDLE_INVALID;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    struct api_op *op = NULL;

    if (!s)
        return exs__err(err);
    api_sock_lock(s);
    if ((err = sock_check_addr(s, addr, addrlen)))
        goto out;
    switch (s->state) {
    case API_SOCK_NEW:
    case API_SOCK_BOUND:
        break;
    case API_SOCK_CONNECTING:
        err = EALREADY;
        goto out;
    case API_SOCK_CONNECTED:
        err = EISCONN;
        goto out;
    default:
        err = EINVAL;
        goto out;
    }
    if (sync)
        q = exs__api_sync_queue();
    op = exs__api_op_new(s, EXS_EVT_CONNECT, q, ah, &err);
    if (!op)
        goto out;
    if ((ret = exs__api_sock_conn_new(s, exs__engine_ctx()))) {
        err = -ret == ENOMEM ? ENOMEM : ENOBUFS;
        goto out;
    }
    s->peer_len = addrlen > sizeof(s->peer) ? sizeof(s->peer) : addrlen;
    memcpy(&s->peer, addr, s->peer_len);
    s->connect_op = op;
    exs__api_sock_set_state(s, API_SOCK_CONNECTING, "connect");
    struct exs_conn *conn = s->conn;
    api_sock_unlock(s);
    ret = exs__conn_connect(conn, addr, addrlen);
    api_sock_lock(s);
    if (ret) {
        /* nothing went out: undo (a concurrent exs_close keeps its state) */
        s->conn = NULL;
        err = ret == -ENETUNREACH || ret == -EADDRNOTAVAIL ? -ret : ECONNREFUSED;
        if (s->connect_op == op && !sock_is_closing(s) &&
            exs__engine_fallback_eligible(conn->ctx, err)) {
            sock_connect_fallback_later(s, conn, err);
            op = NULL;
            err = 0;
            goto out;
        }
        sock_conn_destroy_later(conn);
        if (s->connect_op != op) {
            /* the close already completed the connect with ECANCELED */
            op = NULL;
            goto out;
        }
        s->connect_op = NULL;
        if (!sock_is_closing(s))
            exs__api_sock_set_state(s, s->local_len ? API_SOCK_BOUND : API_SOCK_NEW,
                                    "connect failed");
        goto out;
    }
    if (!s->ka_job_busy && !sock_is_closing(s)) {
        /* the deadline starts on the progress thread; a close queues its job after */
        s->ka_job_busy = 1;
        exs__api_sock_ref(s);
        s->ka_job.fn = sock_ka_job;
        exs__engine_post(&s->ka_job);
    }
    op = NULL;
out:
    api_sock_unlock(s);
    if (op)
        exs__api_op_abandon(op);
    exs__api_sock_put(s);
    if (err)
        return exs__api_sync_fail(sync, q, err);
    return exs__api_call_end(sync, q, &ev);
}

int exs_shutdown(int fd, int how, exs_qhandle_t q, exs_ahandle_t ah)
{
    exs_event_t ev;
    int err = 0, ret, sync = q == EXS_QHANDLE_INVALID;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    struct api_op *op;

    if (!s)
        return err == ENOTSOCK ? exs__api_kfd_shutdown(fd, how, q, ah) : exs__err(err);
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
        err = EINVAL;
        goto out;
    }
    api_sock_lock(s);
    struct exs_conn *conn = s->state == API_SOCK_CONNECTED ? s->conn : NULL;
    api_sock_unlock(s);
    if (!conn) {
        err = ENOTCONN;
        goto out;
    }
    if (sync)
        q = exs__api_sync_queue();
    op = exs__api_op_new(s, EXS_EVT_SHUTDOWN, q, ah, &err);
    if (!op)
        goto out;
    if (how == SHUT_RD) {
        sock_post_simple(op, EXS_EVT_SHUTDOWN, 0);
        goto out;
    }
    op->op.kind = EXS_OP_SHUTDOWN;
    ret = exs__conn_post(conn, &op->op);
    if (ret == -EPIPE) {
        /* already shut: nothing more to do */
        sock_post_simple(op, EXS_EVT_SHUTDOWN, 0);
    } else if (ret) {
        exs__api_op_abandon(op);
        err = -ret;
    }
out:
    exs__api_sock_put(s);
    if (err)
        return exs__api_sync_fail(sync, q, err);
    return exs__api_call_end(sync, q, &ev);
}

/* ---- close ---- */

/* Progress thread: the last step of exs_close once the connection (if any) is dead. */
static void sock_finish_close_job(struct exs_job *job)
{
    struct api_sock *s = exs_container_of(job, struct api_sock, finish_job);
    struct api_op *connect_op, *close_op;

    exs__engine_timer_stop(&s->close_timer);
    exs__engine_timer_stop(&s->conn_timer);
    api_sock_lock(s);
    connect_op = s->connect_op;
    close_op = s->close_op;
    s->connect_op = s->close_op = NULL;
    api_sock_unlock(s);
    if (connect_op)
        sock_post_simple(connect_op, EXS_EVT_CONNECT, ECANCELED);
    /* the CLOSE event comes last, once the socket is gone (unless a caller still
     * holds a reference for a moment) */
    exs__api_sock_put(s); /* the closing reference */
    if (close_op)
        sock_post_simple(close_op, EXS_EVT_CLOSE, 0);
}

/* Progress thread: close a listener and everything it holds. */
static void sock_close_listener_job(struct exs_job *job)
{
    struct api_sock *s = exs_container_of(job, struct api_sock, close_job);
    struct exs_list accepts, ready, deferred, *n;

    /* the requests waiting for room are refused before their provider listener goes
     * (which would free them); none is deferred from now on (the socket is CLOSING) */
    exs__engine_timer_stop(&s->defer_timer);
    api_sock_lock(s);
    s->defer_timer_on = 0;
    exs__api_sock_defer_take_locked(s, &deferred, 1);
    api_sock_unlock(s);
    exs__api_sock_defer_refuse(s, &deferred, EXS_WIRE_REJ_CLOSING);
    exs__engine_listener_destroy(&s->lis); /* no request arrives after this */
    exs_list_init(&accepts);
    exs_list_init(&ready);
    api_sock_lock(s);
    while ((n = exs_list_pop_head(&s->accepts)))
        exs_list_add_tail(&accepts, n);
    while ((n = exs_list_pop_head(&s->ready)))
        exs_list_add_tail(&ready, n);
    s->n_accepts = s->n_ready = 0;
    api_sock_unlock(s);
    while ((n = exs_list_pop_head(&accepts)))
        sock_post_simple(exs_list_entry(n, struct api_op, link), EXS_EVT_ACCEPT, ECANCELED);
    while ((n = exs_list_pop_head(&ready))) {
        struct api_sock *c = exs_list_entry(n, struct api_sock, child_link);

        /* never accepted: closed as the application would */
        exs__api_sock_close(c, NULL, 0);
    }
    api_sock_lock(s);
    sock_finish_locked(s, "listener closed");
    api_sock_unlock(s);
    exs__api_sock_put(s); /* the job's reference */
}

/* Progress thread: a graceful close took too long (the peer froze): reset it. */
static void sock_close_timeout(struct exs_eng_timer *t)
{
    struct api_sock *s = exs_container_of(t, struct api_sock, close_timer);

    EXS_INFO(API, "fd %d: close timed out after %llu ms, resetting the connection", s->fd,
             (unsigned long long)exs__params.close_timeout_ms);
    exs__conn_abort(s->conn);
}

/* Progress thread: the part of a close that touches the connection. Connections die
 * (sock_conn_dead) and are freed (sock_finish_close_job) on this thread too, so the
 * conn cannot vanish under it. */
static void sock_close_conn_job(struct exs_job *job)
{
    struct api_sock *s = exs_container_of(job, struct api_sock, close_job);
    struct exs_conn *conn;
    int dead, abort_;

    /* s->conn only goes away on this thread (a failed connect detaches it under the
     * lock and frees it in a later job) */
    api_sock_lock(s);
    conn = s->conn;
    api_sock_unlock(s);
    dead = !conn || exs__conn_is_dead(conn);
    api_sock_lock(s);
    abort_ = s->state == API_SOCK_ABORTING;
    if (dead && s->state != API_SOCK_FINISHING)
        sock_finish_locked(s, conn ? "connection already dead" : "no connection");
    api_sock_unlock(s);
    if (!dead) {
        if (abort_) {
            exs__conn_abort(conn); /* sock_conn_dead finishes */
        } else {
            exs__conn_close(conn); /* sock_conn_dead finishes */
            exs__engine_timer_start(&s->close_timer, exs__params.close_timeout_ms,
                                    sock_close_timeout);
        }
    }
    exs__api_sock_put(s); /* the job's reference */
}

/* Take s from an open state to CLOSING (graceful) or ABORTING (reset) and queue its
 * close job. Once per socket: only the call that took it out of the table (or off its
 * listener) gets here. */
void exs__api_sock_close(struct api_sock *s, struct api_op *op, int abort_)
{
    enum api_sock_state was;

    api_sock_lock(s);
    /* The job's own reference, taken before CLOSING becomes visible: from then on the
     * conn may die (sock_conn_dead) and the finish job drop the closing reference
     * before this job is even queued. */
    exs__api_sock_ref(s);
    was = s->state;
    exs__api_sock_set_state(s, abort_ ? API_SOCK_ABORTING : API_SOCK_CLOSING,
                            abort_ ? "exs_fini" : "exs_close");
    s->close_op = op;
    if (s->fd_open) {
        exs__nc_close(s->fd);
        s->fd_open = 0;
    }
    api_sock_unlock(s);
    if (exs__params.test_close_pause_us) /* test seam: widens the window above */
        exs__nc_sleep_us((long)exs__params.test_close_pause_us);
    s->close_job.fn = was == API_SOCK_LISTENING ? sock_close_listener_job : sock_close_conn_job;
    exs__engine_post(&s->close_job);
}

int exs_close(int fd, exs_qhandle_t q, exs_ahandle_t ah)
{
    int err = 0, sync = q == EXS_QHANDLE_INVALID;
    struct api_sock *s = exs__api_sock_get(fd, &err);
    struct api_op *op;

    if (!s) {
        if (err == ESTALE)
            exs__api_fork_stale_close(fd); /* the child's copy goes; still an error */
        return err == ENOTSOCK ? exs__api_kfd_close(fd, q, ah) : exs__err(err);
    }
    if (sync)
        q = exs__api_sync_queue();
    op = exs__api_op_new(s, EXS_EVT_CLOSE, q, ah, &err);
    if (!op) {
        exs__api_sock_put(s);
        return exs__api_sync_fail(sync, q, err);
    }
    if (!tab_remove(s)) {
        /* a concurrent close won */
        exs__api_op_abandon(op);
        exs__api_sock_put(s);
        return exs__api_sync_fail(sync, q, EBADF);
    }
    /* our get reference becomes the closing reference, dropped by the finish job */
    exs__api_sock_close(s, op, 0);
    if (sync) {
        exs_event_t ev;

        return exs__api_call_end(sync, q, &ev);
    }
    return 0;
}

/* exs_fini: close every socket without events. */
void exs__api_sock_close_all(void)
{
    for (;;) {
        struct api_sock *s = NULL;

        EXS_MUTEX_LOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
        for (int fd = 0; fd < tab_len && !s; fd++)
            if (tab[fd]) {
                s = tab[fd];
                exs__api_sock_ref(s);
            }
        EXS_MUTEX_UNLOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
        if (!s)
            break;
        if (tab_remove(s)) {
            exs__api_sock_close(s, NULL, 1);
        } else {
            exs__api_sock_put(s);
        }
    }
    /* The emptied table stays, its arrays too (the old ones), and the parked sockets: a
     * look without the lock racing this (exs__api_sock_at, exs__api_sock_hz, a hold) may
     * still read them, and learns from the slot (NULL) or the count (0) that its socket
     * is gone (EBADF); freed here, it read freed memory (integ_attack26 send_at_fini).
     * The next exs_init's sockets reuse them (the memory: the table's largest size and
     * the most sockets parked at once); numbers given out before stay invalid (their
     * slots are empty until a new socket gets the number). */
}

/* fork(2) (fork.c). PREPARE/PARENT: the table's lock held across it. CHILD: every
 * socket is the parent's: its descriptor (the eventfd, kept open so the number is not
 * reused) is marked inherited, and the sockets are left unused. */
void exs__api_sock_fork(int phase)
{
    if (phase == EXS_FORK_PREPARE) {
        EXS_MUTEX_LOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
        exs__mutex_fork(&park_lock, phase);
        return;
    }
    exs__mutex_fork(&park_lock, phase); /* the parked sockets are memory: the child's too */
    if (phase == EXS_FORK_CHILD) {
        for (int fd = 0; fd < tab_len; fd++)
            if (tab[fd] && tab[fd]->fd_open)
                exs__api_fork_stale_mark(fd);
        /* the other threads' records: they are gone (this one's names nothing: a hazard
         * spans one call, and fork is no part of one) */
        for (struct api_hz *hz = exs__api_hz_list; hz; hz = hz->next) {
            hz->s = NULL;
            if (hz != exs__api_hz_self)
                hz->used = 0;
        }
        exs__forsake(tabv); /* the old arrays are reachable from it */
        tabv = NULL;
        tab = NULL;
        tab_len = 0;
        sock_live = 0;
        pthread_mutex_init(&tab_lock, NULL); /* held by the parent's thread id */
        EXS_LOCK_RELEASE(EXS_LOCK_SOCK_TAB);
        return;
    }
    EXS_MUTEX_UNLOCK(&tab_lock, EXS_LOCK_SOCK_TAB);
}
