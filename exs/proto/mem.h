/* SPDX-License-Identifier: MIT */
/* Memory of the protocol layer (mem.c, layer 0): the memory account, ring regions. */
#ifndef EXS_PROTO_MEM_H
#define EXS_PROTO_MEM_H

#include "exs/proto/proto.h"
#include "exs/util/membudget.h"

/* Provider memory charged to the memory account (spec/protocol.md §9.3): size bytes,
 * refused (-ENOBUFS) past EXS_MEM_BUDGET unless kind is EXS_MEM_FORCE; a new connection's
 * (EXS_MEM_CONN) also leaves room for a connection's tables. Errors: -ENOBUFS, those of
 * mem_alloc. */
int exs__conn_mem_alloc(struct exs_prov_ctx *ctx, size_t size, enum exs_mem_kind kind,
                        struct exs_prov_mr **mem_p);
void exs__conn_mem_free(struct exs_prov_mr *mem);
/* A forked child (exs__proto_fork_child): no ring region of the parent's counts. */
void exs__conn_mem_fork_child(void);
/* n malloc'd bytes of conn charged (conn->mem_held), as above; 0 or -ENOBUFS. Given back
 * exactly as freed. */
int exs__conn_mem_take_locked(struct exs_conn *conn, uint64_t n, enum exs_mem_kind kind);
void exs__conn_mem_give_locked(struct exs_conn *conn, uint64_t n);
/* Ring memory (conn.c, spec/protocol.md §7.4): a region of size bytes from the provider,
 * counted in the process's ring bytes; with budget set, refused (-ENOBUFS) when the
 * count would pass it. grant_p non-NULL: the peer's REMOTE_WRITE over it too.
 * Errors: -ENOBUFS, those of mem_alloc and grant. */
int exs__conn_ring_region_locked(struct exs_conn *conn, uint32_t size, int budget,
                                 struct exs_prov_mr **mem_p, struct exs_prov_grant **grant_p);
void exs__conn_ring_region_free(struct exs_prov_mr *mem);
/* A ring region of size bytes on ctx (a resume request's new path), counted, no budget,
 * no grant. 0 or -errno. */
int exs__conn_ring_alloc(struct exs_prov_ctx *ctx, uint32_t size, struct exs_prov_mr **mem_p);
/* Bytes of every ring region of the process now. */
uint64_t exs__conn_ring_bytes(void);
/* Room a new connection leaves in the memory budget (§9.3) for kind. */
uint64_t exs__conn_mem_slack(enum exs_mem_kind kind);

#endif
