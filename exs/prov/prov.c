/* SPDX-License-Identifier: MIT */
/* Provider registry: the static table of providers, default selection, stubs and names. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "exs/prov/prov.h"
#include "exs/prov/shm/shm.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

extern struct exs_prov_ops exs__prov_tcp_ops;
extern struct exs_prov_ops exs__prov_fault_tcp_ops;
extern struct exs_prov_ops exs__prov_shm_ops; /* exs/prov/shm/, spec/provider-shm.md */
extern struct exs_prov_ops exs__prov_fault_shm_ops;
#ifdef EXS_HAVE_VERBS_PROV
extern struct exs_prov_ops exs__prov_verbs_ops;
extern struct exs_prov_ops exs__prov_fault_verbs_ops;
int exs__prov_verbs_device_active(void);
#endif

/* fault:NAME wraps provider NAME (exs/prov/fault/, spec/provider-fault.md) */
static struct exs_prov_ops *prov_table[] = {
    &exs__prov_tcp_ops,
#ifdef EXS_HAVE_VERBS_PROV
    &exs__prov_verbs_ops,
#endif
    &exs__prov_fault_tcp_ops,   &exs__prov_shm_ops, &exs__prov_fault_shm_ops,
#ifdef EXS_HAVE_VERBS_PROV
    &exs__prov_fault_verbs_ops,
#endif
};

static pthread_once_t prov_once = PTHREAD_ONCE_INIT;

static int prov_stub(void)
{
    return -EOPNOTSUPP;
}

static void prov_stub_void(void) {}

/* Default ctx_progress: the provider progresses on its own. */
static int prov_progress_none(struct exs_prov_ctx *ctx)
{
    (void)ctx;
    return 0;
}

/* Regions this big or bigger (rings, send buffers) are mappings of their own: freed, they
 * go back to the system at once, where the heap would keep them (glibc raises its mmap
 * threshold past the size of a freed mapping, so later rings came from the heap and a
 * closed connection's memory stayed in the process). */
#define PROV_MEM_MAP_MIN (64u << 10)

static void *prov_mem_get(size_t sz)
{
    void *p;

    if (sz < PROV_MEM_MAP_MIN)
        return aligned_alloc(4096, sz);
    p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void prov_mem_put(void *p, size_t sz)
{
    if (sz < PROV_MEM_MAP_MIN)
        free(p);
    else
        munmap(p, sz);
}

/* Default mem_alloc/mem_free: page-aligned memory with a local-only registration. */
static int prov_mem_alloc(struct exs_prov_ctx *ctx, size_t len, struct exs_prov_mr **mr_p)
{
    size_t sz = (len + 4095) & ~(size_t)4095;
    void *p;
    int ret;

    if (!len || sz < len)
        return -EINVAL;
    p = prov_mem_get(sz);
    if (!p)
        return -ENOMEM;
    ret = ctx->ops->mr_reg(ctx, p, len, EXS_PROV_ACCESS_LOCAL_WRITE, mr_p);
    if (ret)
        prov_mem_put(p, sz);
    return ret;
}

static void prov_mem_free(struct exs_prov_mr *mr)
{
    void *p = mr->addr;
    size_t sz = (mr->length + 4095) & ~(size_t)4095;
    int ret = mr->ctx->ops->mr_dereg(mr);

    if (ret) {
        /* still registered (e.g. -EBUSY: grants not revoked): a peer may still reach
         * it, so the memory is leaked rather than freed */
        EXS_ERR(PROV, "mem_free %p: mr_dereg: %d; memory not freed", p, ret);
        return;
    }
    prov_mem_put(p, sz);
}

/* Default mr_get/mr_put: a registration per operation. */
static int prov_mr_get(struct exs_prov_ctx *ctx, void *addr, size_t length, unsigned access,
                       struct exs_prov_mr **mr_p)
{
    return ctx->ops->mr_reg(ctx, addr, length, access, mr_p);
}

static void prov_mr_put(struct exs_prov_mr *mr)
{
    void *p = mr->addr;
    int ret = mr->ctx->ops->mr_dereg(mr);

    if (ret)
        EXS_ERR(PROV, "mr_put %p: mr_dereg: %d", p, ret);
}

void exs__prov_fill_defaults(struct exs_prov_ops *ops)
{
    if (!ops->mem_alloc) {
        ops->mem_alloc = prov_mem_alloc;
        ops->mem_free = prov_mem_free;
    }
    if (!ops->ctx_progress)
        ops->ctx_progress = prov_progress_none;
    if (!ops->mr_get) {
        ops->mr_get = prov_mr_get;
        ops->mr_put = prov_mr_put;
    }
    /* Each member is a function pointer; those left NULL get a stub of the same
     * return kind. Casting through void (*)(void) is how rdma-core's dummy_ops
     * does it; the stubs take no arguments and the cdecl ABI tolerates that. */
#define FILL(_m, _stub)                                                                            \
    do {                                                                                           \
        if (!ops->_m)                                                                              \
            ops->_m = (__typeof__(ops->_m))(void (*)(void))(_stub);                                \
    } while (0)
    FILL(ctx_open, prov_stub);
    FILL(ctx_close, prov_stub_void);
    FILL(ctx_event_fd, prov_stub);
    FILL(ctx_arm, prov_stub);
    FILL(ctx_disarm, prov_stub_void);
    FILL(ep_flush, prov_stub_void);
    FILL(ctx_fork, prov_stub_void);
    FILL(ctx_poll, prov_stub);
    FILL(ctx_cm_poll, prov_stub);
    FILL(mr_reg, prov_stub);
    FILL(mr_dereg, prov_stub);
    FILL(grant, prov_stub);
    FILL(revoke, prov_stub_void);
    FILL(ep_create, prov_stub);
    FILL(ep_destroy, prov_stub_void);
    FILL(ep_state, prov_stub);
    FILL(ep_local_addr, prov_stub);
    FILL(listen, prov_stub);
    FILL(listener_addr, prov_stub);
    FILL(listener_destroy, prov_stub_void);
    FILL(listener_pause, prov_stub);
    FILL(connect, prov_stub);
    FILL(accept, prov_stub);
    FILL(reject, prov_stub);
    FILL(disconnect, prov_stub);
    FILL(post_recv, prov_stub);
    FILL(post_send, prov_stub);
#undef FILL
}

static void prov_init_once(void)
{
    for (size_t i = 0; i < EXS_ARRAY_SIZE(prov_table); i++)
        exs__prov_fill_defaults(prov_table[i]);
}

const struct exs_prov_ops *exs__prov_find(const char *name)
{
    pthread_once(&prov_once, prov_init_once);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(prov_table); i++)
        if (strcmp(prov_table[i]->name, name) == 0)
            return prov_table[i];
    return NULL;
}

int exs__prov_set_device(struct exs_prov_ctx *ctx, const char *name, unsigned port)
{
    int n = snprintf(ctx->device, sizeof(ctx->device), "%s:%u", name, port);

    if (n < 0 || (size_t)n >= sizeof(ctx->device)) {
        EXS_WARN(PROV, "device name %.32s... port %u: longer than %zu bytes, not reported", name,
                 port, sizeof(ctx->device) - 1);
        ctx->device[0] = 0;
        return -ENAMETOOLONG;
    }
    return 0;
}

static const char *prov_default_name(void)
{
#ifdef EXS_HAVE_VERBS_PROV
    if (exs__prov_verbs_device_active())
        return "verbs";
#endif
    return "tcp";
}

int exs__prov_open_default(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    static int logged;
    const struct exs_prov_ops *ops;
    const char *name;

    exs__params_load();
    name = exs__params.provider[0] ? exs__params.provider : prov_default_name();
    ops = exs__prov_find(name);
    if (!ops) {
        EXS_ERR(PROV,
                "provider %s: unknown (EXS_PROVIDER); known: tcp, fault:tcp, shm, fault:shm%s",
                name,
#ifdef EXS_HAVE_VERBS_PROV
                ", verbs, fault:verbs"
#else
                ""
#endif
        );
        return -ENOENT;
    }
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        EXS_INFO(PROV, "provider %s selected%s", name,
                 exs__params.provider[0] ? " by EXS_PROVIDER" : " by default");
    return ops->ctx_open(attr, ctx_p);
}

int exs__prov_open_fallback(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    const struct exs_prov_ops *ops = exs__prov_find("tcp");

    return ops->ctx_open(attr, ctx_p);
}

int exs__prov_open_shm(const struct exs_prov_attr *attr, struct exs_prov_ctx **ctx_p)
{
    return exs__prov_shm_ops.ctx_open(attr, ctx_p);
}

int exs__prov_shm_peer(const struct exs_prov_ctx *ctx, const struct sockaddr *addr,
                       socklen_t addrlen, uint32_t *pid_p, uint32_t *uid_p)
{
    struct sockaddr_un un;
    struct ucred cr;
    socklen_t len = sizeof(cr);
    unsigned port;
    int fd, ret;

    if (!ctx || ctx->ops != &exs__prov_shm_ops)
        return -EOPNOTSUPP;
    ret = exs__shm_addr_port(addr, addrlen, &port);
    if (ret)
        return ret;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* a unix connect never waits: it is queued on the listener or refused */
    if (exs__nc_connect(fd, (struct sockaddr *)&un, exs__shm_unix_name(&un, port)) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        ret = -errno;
    exs__nc_close(fd);
    if (ret)
        return ret;
    *pid_p = (uint32_t)cr.pid;
    *uid_p = (uint32_t)cr.uid;
    return 0;
}

const char *exs__prov_wc_status_str(enum exs_prov_wc_status status)
{
    static const char *const names[] = {
        [EXS_PROV_WC_SUCCESS] = "success",
        [EXS_PROV_WC_LOC_LEN_ERR] = "local length error",
        [EXS_PROV_WC_LOC_PROT_ERR] = "local protection error",
        [EXS_PROV_WC_WR_FLUSH_ERR] = "flushed",
        [EXS_PROV_WC_REM_ACCESS_ERR] = "remote access error",
        [EXS_PROV_WC_REM_INV_REQ_ERR] = "remote invalid request",
        [EXS_PROV_WC_REM_OP_ERR] = "remote operation error",
        [EXS_PROV_WC_RETRY_EXC_ERR] = "transport retry exceeded",
        [EXS_PROV_WC_RNR_RETRY_EXC_ERR] = "receiver not ready, retries exceeded",
        [EXS_PROV_WC_GENERAL_ERR] = "general error",
    };

    if ((unsigned)status < EXS_ARRAY_SIZE(names) && names[status])
        return names[status];
    return "unknown status";
}

const char *exs__prov_wc_opcode_str(enum exs_prov_wc_opcode opcode)
{
    static const char *const names[] = {
        [EXS_PROV_WC_SEND] = "send",
        [EXS_PROV_WC_RDMA_WRITE] = "rdma_write",
        [EXS_PROV_WC_RDMA_READ] = "rdma_read",
        [EXS_PROV_WC_RECV] = "recv",
        [EXS_PROV_WC_RECV_RDMA_WITH_IMM] = "recv_rdma_with_imm",
        [EXS_PROV_WC_GRANT] = "grant",
    };

    if ((unsigned)opcode < EXS_ARRAY_SIZE(names) && names[opcode])
        return names[opcode];
    return "unknown opcode";
}

const char *exs__prov_cm_event_str(enum exs_prov_cm_event_type type)
{
    static const char *const names[] = {
        [EXS_PROV_CM_CONNECT_REQUEST] = "connect_request",
        [EXS_PROV_CM_ESTABLISHED] = "established",
        [EXS_PROV_CM_REJECTED] = "rejected",
        [EXS_PROV_CM_UNREACHABLE] = "unreachable",
        [EXS_PROV_CM_DISCONNECTED] = "disconnected",
    };

    if ((unsigned)type < EXS_ARRAY_SIZE(names) && names[type])
        return names[type];
    return "unknown event";
}

/* ---- shared by the providers ---- */

int exs__prov_ep_attr_check(const struct exs_prov_caps *caps, const struct exs_prov_ep_attr *attr)
{
    if (!attr || !attr->max_send_wr || attr->max_send_wr > caps->max_send_wr ||
        !attr->max_recv_wr || attr->max_recv_wr > caps->max_recv_wr ||
        attr->max_inline > caps->max_inline || attr->rnr_retry > 7)
        return -EINVAL;
    return 0;
}

enum exs_prov_wc_opcode exs__prov_wr_wc_opcode(enum exs_prov_wr_opcode opcode)
{
    switch (opcode) {
    case EXS_PROV_WR_RDMA_WRITE:
    case EXS_PROV_WR_RDMA_WRITE_WITH_IMM:
        return EXS_PROV_WC_RDMA_WRITE;
    case EXS_PROV_WR_RDMA_READ:
        return EXS_PROV_WC_RDMA_READ;
    case EXS_PROV_WR_SEND:
    case EXS_PROV_WR_SEND_WITH_IMM:
        break;
    }
    return EXS_PROV_WC_SEND;
}

int exs__prov_fork_lock(pthread_mutex_t *lock, int phase)
{
    if (phase == EXS_FORK_PREPARE) {
        pthread_mutex_lock(lock);
        return 1;
    }
    if (phase == EXS_FORK_PARENT) {
        pthread_mutex_unlock(lock);
        return 1;
    }
    return 0;
}

void exs__prov_fork_close(int *const *fds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (*fds[i] >= 0)
            exs__nc_close(*fds[i]);
        *fds[i] = -1;
    }
}
