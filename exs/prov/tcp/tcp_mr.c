/* SPDX-License-Identifier: MIT */
/* Memory regions of the tcp provider: registration, never-reused keys, local and remote checks. */
#include <errno.h>
#include <stdlib.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/log.h"
#include "exs/util/util.h"

/* Keys come from one process-wide counter: a key is never reused, in this ctx
 * or any other, so a stale key or another ctx's key always misses. */
static uint32_t tcp_mr_next_key = 0x100;

static struct exs_list *tcp_mr_bucket(struct tcp_ctx *ctx, uint32_t key)
{
    return &ctx->mr_hash[key % TCP_MR_HASH];
}

/* Under mr_lock. */
static struct tcp_mr *tcp_mr_find(struct tcp_ctx *ctx, uint32_t key)
{
    struct exs_list *pos, *b = tcp_mr_bucket(ctx, key);

    exs_list_for_each(pos, b) {
        struct tcp_mr *mr = exs_list_entry(pos, struct tcp_mr, link);

        if (mr->base.lkey == key)
            return mr;
    }
    return NULL;
}

/* [addr, addr+len) inside the region, without overflow. */
static int tcp_mr_contains(const struct tcp_mr *mr, uint64_t addr, uint64_t len)
{
    uint64_t base = (uint64_t)(uintptr_t)mr->base.addr;

    return addr >= base && len <= mr->base.length && addr - base <= mr->base.length - len;
}

int exs__tcp_mr_reg(struct exs_prov_ctx *c, void *addr, size_t length, unsigned access,
                    struct exs_prov_mr **mr_p)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    unsigned all = EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE |
                   EXS_PROV_ACCESS_REMOTE_READ;
    struct tcp_mr *mr;
    uint32_t key;

    if ((access & ~all) || (!addr && length) ||
        (uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr)
        return -EINVAL;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return -ENOMEM;
    do {
        key = __atomic_fetch_add(&tcp_mr_next_key, 1, __ATOMIC_RELAXED);
    } while (key == 0);
    mr->base.ctx = c;
    mr->base.addr = addr;
    mr->base.length = length;
    mr->base.lkey = key;
    mr->base.rkey = key;
    mr->base.access = access;
    pthread_mutex_lock(&ctx->mr_lock);
    mr->live = 1;
    exs_list_add_tail(tcp_mr_bucket(ctx, key), &mr->link);
    pthread_mutex_unlock(&ctx->mr_lock);
    EXS_DBG(PROV, "mr %p: registered %p+%zu key 0x%x access 0x%x", (void *)mr, addr, length,
            key, access);
    *mr_p = &mr->base;
    return 0;
}

int exs__tcp_mr_dereg(struct exs_prov_mr *m)
{
    struct tcp_mr *mr = (struct tcp_mr *)m;
    struct tcp_ctx *ctx;
    struct tcp_cmd cmd = { .type = TCP_CMD_MR_DEREG, .mr = mr };
    unsigned users;
    int ret;

    if (!mr)
        return -EINVAL;
    ctx = tcp_ctx_of(mr->base.ctx);
    pthread_mutex_lock(&ctx->mr_lock);
    if (!mr->live) {
        pthread_mutex_unlock(&ctx->mr_lock);
        return -EINVAL;
    }
    mr->live = 0;
    exs_list_del(&mr->link);
    users = mr->users;
    pthread_mutex_unlock(&ctx->mr_lock);
    if (users) {
        /* A transfer is placing into / reading from it: let it finish. */
        ret = exs__tcp_ctx_call(ctx, &cmd);
        if (ret && ret != -ESHUTDOWN)
            EXS_WARN(PROV, "mr %p: dereg: %d", (void *)mr, ret);
    }
    EXS_DBG(PROV, "mr %p: deregistered key 0x%x", (void *)mr, mr->base.lkey);
    free(mr);
    return 0;
}

/* NIC: finish the dereg now or when the last user puts the region. */
void exs__tcp_mr_dereg_nic(struct tcp_ctx *ctx, struct tcp_cmd *cmd)
{
    struct tcp_mr *mr = cmd->mr;
    int park;

    pthread_mutex_lock(&ctx->mr_lock);
    park = mr->users != 0;
    if (park)
        mr->dereg = cmd;
    pthread_mutex_unlock(&ctx->mr_lock);
    if (!park)
        exs__tcp_cmd_finish(ctx, cmd, 0);
}

void exs__tcp_mr_put(struct tcp_ctx *ctx, struct tcp_mr *mr)
{
    struct tcp_cmd *cmd = NULL;

    pthread_mutex_lock(&ctx->mr_lock);
    EXS_ASSERT(mr->users > 0);
    if (--mr->users == 0 && mr->dereg) {
        cmd = mr->dereg;
        mr->dereg = NULL;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    if (cmd)
        exs__tcp_cmd_finish(ctx, cmd, 0);
}

/* 0 when every sge of non-zero length lies in an mr of ctx with the access bits. */
int exs__tcp_mr_check_local(struct tcp_ctx *ctx, const struct exs_prov_sge *sge, int n,
                            unsigned access)
{
    int ret = 0;

    pthread_mutex_lock(&ctx->mr_lock);
    for (int i = 0; i < n && !ret; i++) {
        struct tcp_mr *mr;

        if (!sge[i].length)
            continue;
        mr = tcp_mr_find(ctx, sge[i].lkey);
        if (!mr || !tcp_mr_contains(mr, sge[i].addr, sge[i].length) ||
            (mr->base.access & access) != access)
            ret = -EACCES;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}

/* NIC: the region for a remote access, with a user reference (put it with
 * exs__tcp_mr_put), or -EACCES. */
int exs__tcp_mr_get_remote(struct tcp_ctx *ctx, uint32_t rkey, uint64_t addr, uint64_t len,
                           unsigned access, struct tcp_mr **mr_p)
{
    struct tcp_mr *mr;
    int ret = -EACCES;

    pthread_mutex_lock(&ctx->mr_lock);
    mr = tcp_mr_find(ctx, rkey);
    if (mr && mr->live && tcp_mr_contains(mr, addr, len) &&
        (mr->base.access & access) == access) {
        mr->users++;
        *mr_p = mr;
        ret = 0;
    }
    pthread_mutex_unlock(&ctx->mr_lock);
    return ret;
}
