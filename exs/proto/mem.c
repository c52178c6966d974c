/* SPDX-License-Identifier: MIT */
/* Memory of the protocol layer: the memory account of connections and the ring regions
 * (spec/protocol.md §7.4, §9.3). Layer 0 of spec/proto-layout.md. */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/membudget.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

static uint64_t conn_ring_bytes; /* every ring region of the process (§7.4 budget) */

uint64_t exs__conn_ring_bytes(void)
{
    return __atomic_load_n(&conn_ring_bytes, __ATOMIC_RELAXED);
}

/* Count size more ring bytes; with budget, only while the total stays within it. */
static int conn_ring_bytes_take(uint64_t size, uint64_t budget)
{
    uint64_t cur = __atomic_load_n(&conn_ring_bytes, __ATOMIC_RELAXED);

    do {
        if (budget && cur + size > budget)
            return -ENOBUFS;
    } while (!__atomic_compare_exchange_n(&conn_ring_bytes, &cur, cur + size, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 0;
}

/* Room a new connection leaves in the memory budget (§9.3): what a peer can make a live
 * connection's tables hold (pending announced messages, ADVERTs), so that admitting one
 * more does not leave the live ones without room for theirs. */
uint64_t exs__conn_mem_slack(enum exs_mem_kind kind)
{
    if (kind != EXS_MEM_CONN)
        return 0;
    return EXS_WIRE_ANNOUNCED_MAX * exs__mem_chunk(sizeof(struct exs_pending_msg)) +
           EXS_WIRE_ADVERTS_MAX * (uint64_t)sizeof(struct exs_advert);
}

int exs__conn_mem_alloc(struct exs_prov_ctx *ctx, size_t size, enum exs_mem_kind kind,
                        struct exs_prov_mr **mem_p)
{
    int ret = exs__mem_take(exs__mem_pages(size), kind, exs__conn_mem_slack(kind));

    if (ret)
        return ret;
    ret = exs__prov_mem_alloc(ctx, size, mem_p);
    if (ret)
        exs__mem_give(exs__mem_pages(size));
    return ret;
}

void exs__conn_mem_free(struct exs_prov_mr *mem)
{
    exs__mem_give(exs__mem_pages(mem->length));
    exs__prov_mem_free(mem);
}

int exs__conn_mem_take_locked(struct exs_conn *conn, uint64_t n, enum exs_mem_kind kind)
{
    int ret = exs__mem_take(n, kind, exs__conn_mem_slack(kind));

    if (!ret)
        conn->mem_held += n;
    return ret;
}

void exs__conn_mem_give_locked(struct exs_conn *conn, uint64_t n)
{
    EXS_ASSERT(conn->mem_held >= n);
    conn->mem_held -= n;
    exs__mem_give(n);
}

/* A ring region of size bytes on ctx, counted (within limit, 0: none) and charged to the
 * memory budget as kind. 0 or -errno. */
static int conn_ring_mem_alloc(struct exs_prov_ctx *ctx, uint32_t size, uint64_t limit,
                               enum exs_mem_kind kind, struct exs_prov_mr **mem_p)
{
    int ret = conn_ring_bytes_take(size, limit);

    if (ret)
        return ret;
    ret = exs__conn_mem_alloc(ctx, size, kind, mem_p);
    if (ret) {
        if (ret == -ENOBUFS)
            EXS_INFO(PROTO, "ring of %u bytes: memory budget (EXS_MEM_BUDGET) reached", size);
        else
            EXS_WARN(PROTO, "ring of %u bytes: %s", size, strerror(-ret));
        __atomic_fetch_sub(&conn_ring_bytes, (uint64_t)size, __ATOMIC_RELAXED);
    }
    return ret;
}

/* A resume trial's ring (§9.2, Proof): made for a peer not yet proved, so refused past the
 * memory budget like any other memory a peer makes a live connection take. */
int exs__conn_ring_alloc(struct exs_prov_ctx *ctx, uint32_t size, struct exs_prov_mr **mem_p)
{
    return conn_ring_mem_alloc(ctx, size, 0, EXS_MEM_OTHER, mem_p);
}

int exs__conn_ring_region_locked(struct exs_conn *conn, uint32_t size, int budget,
                                 struct exs_prov_mr **mem_p, struct exs_prov_grant **grant_p)
{
    uint64_t limit = budget ? __atomic_load_n(&exs__params.ring_budget, __ATOMIC_RELAXED) : 0;
    /* a grow is refused past the memory budget; so is a new connection's ring (IDLE: being
     * created); a resume's new ring and a shrink's are not (what they replace goes back) */
    enum exs_mem_kind kind = budget                         ? EXS_MEM_GROW
                             : conn->state == EXS_CONN_IDLE ? EXS_MEM_CONN
                                                            : EXS_MEM_FORCE;
    struct exs_prov_mr *mem;
    int ret;

    ret = conn_ring_mem_alloc(conn->ctx, size, limit, kind, &mem);
    if (ret)
        return ret;
    if (grant_p) {
        ret =
            exs__prov_grant(conn->ep, mem, mem->addr, size, EXS_PROV_ACCESS_REMOTE_WRITE, grant_p);
        if (ret) {
            EXS_INFO(PROTO, "conn %p: grant of a %u-byte ring: %s", (void *)conn, size,
                     strerror(-ret));
            exs__conn_ring_region_free(mem);
            return ret;
        }
    }
    *mem_p = mem;
    return 0;
}

void exs__conn_ring_region_free(struct exs_prov_mr *mem)
{
    __atomic_fetch_sub(&conn_ring_bytes, (uint64_t)mem->length, __ATOMIC_RELAXED);
    exs__conn_mem_free(mem);
}

void exs__conn_mem_fork_child(void)
{
    conn_ring_bytes = 0;
}
