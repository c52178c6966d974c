/* SPDX-License-Identifier: MIT */
/* The library's own memory (mem_alloc / mem_free) and per-operation registrations of user
 * buffers (mr_get / mr_put), on every provider: on verbs they come from the memory cache and
 * the registration cache, and these tests also read those caches' counters. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

#define LW  EXS_PROV_ACCESS_LOCAL_WRITE
#define RW  EXS_PROV_ACCESS_REMOTE_WRITE
#define RR  EXS_PROV_ACCESS_REMOTE_READ
#define SIG EXS_PROV_SEND_SIGNALED

static uint64_t counter(const char *set, const char *name)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup(set, name, &v) == 0, "counter %s.%s not registered", set,
                  name);
    return v;
}

static int is_verbs(void)
{
    return strcmp(pt_ops->name, "verbs") == 0;
}

/* A pt_buf view of memory the provider handed out. */
static struct pt_buf view(struct pt_host *h, struct exs_prov_mr *mr)
{
    struct pt_buf b = {.h = h, .base = mr->addr, .p = mr->addr, .len = mr->length, .mr = mr};

    return b;
}

/* mem_alloc memory is page aligned, serves as SEND source and RECV target, and is not
 * reachable by the peer: an RDMA WRITE with its rkey is refused. */
START_TEST(mem_alloc_local_only)
{
    struct pt_pair p;
    struct exs_prov_mr *ma = NULL, *mb = NULL;
    struct pt_buf va, vb;
    struct exs_prov_cqe c;
    uint64_t allocs0 = 0;
    const size_t len = 3 * 4096 + 100;

    pt_pair_setup(&p, NULL, NULL);
    if (is_verbs())
        allocs0 = counter("prov.verbs.mcache", "allocs");
    ck_assert_int_eq(pt_ops->mem_alloc(p.a.ctx, 0, &ma), -EINVAL);
    ck_assert_int_eq(pt_ops->mem_alloc(p.a.ctx, len, &ma), 0);
    ck_assert_int_eq(pt_ops->mem_alloc(p.b.ctx, len, &mb), 0);
    ck_assert_uint_eq((uintptr_t)ma->addr % 4096, 0);
    ck_assert_uint_eq(ma->length, len);
    ck_assert_uint_eq(ma->access, LW);
    if (is_verbs())
        ck_assert_uint_eq(counter("prov.verbs.mcache", "allocs"), allocs0 + 2);
    va = view(&p.a, ma);
    vb = view(&p.b, mb);
    pt_pattern(ma->addr, len, 7);
    memset(mb->addr, 0, len);
    ck_assert_int_eq(pt_post_recv(p.eb, 1, &vb, 0, (uint32_t)len), 0);
    ck_assert_int_eq(pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, SIG, &va, 0, (uint32_t)len, 0, 0, 0),
                     0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, &c);
    ck_assert_uint_eq(c.byte_len, len);
    ck_assert_int_eq(pt_pattern_check(mb->addr, len, 7), -1);
    /* the peer cannot write into it */
    ck_assert_int_eq(pt_post_send(p.eb, 3, EXS_PROV_WR_RDMA_WRITE, SIG, &vb, 0, 64, 0,
                                  (uintptr_t)ma->addr, ma->rkey),
                     0);
    pt_expect_cqe(&p.b, 3, EXS_PROV_WC_REM_ACCESS_ERR, PT_ANY_OPCODE, NULL);
    ck_assert_int_eq(pt_pattern_check(ma->addr, len, 7), -1);
    pt_ops->mem_free(ma);
    pt_ops->mem_free(mb);
    if (is_verbs())
        ck_assert_uint_ge(counter("prov.verbs.mcache", "frees"), 2);
    pt_pair_close(&p);
}
END_TEST

/* Sending from an mr_get registration of buf, then ep a; b receives into rbuf. */
static void send_get(struct pt_pair *p, void *buf, size_t len, uint64_t id, struct pt_buf *rb)
{
    struct exs_prov_mr *mr = NULL;
    struct pt_buf v;

    ck_assert_int_eq(pt_ops->mr_get(p->a.ctx, buf, len, LW | RW | RR, &mr), 0);
    ck_assert_ptr_eq(mr->addr, buf);
    v = view(&p->a, mr);
    ck_assert_int_eq(pt_post_recv(p->eb, id, rb, 0, (uint32_t)len), 0);
    ck_assert_int_eq(pt_post_send(p->ea, id, EXS_PROV_WR_SEND, SIG, &v, 0, (uint32_t)len, 0, 0, 0),
                     0);
    pt_expect_cqe(&p->a, id, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p->b, id, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    pt_ops->mr_put(mr);
}

/* A user buffer registered per operation, used again (a cache hit on verbs), then unmapped
 * and mapped again at the same address with other contents (free, then malloc): what is
 * sent is the new contents, never the old pages a cached registration still pins. */
START_TEST(mr_get_remapped_buffer)
{
    const size_t len = 4 * 4096;
    struct pt_pair p;
    struct pt_buf *rb;
    uint8_t *buf, *again;
    uint64_t hits0 = 0, stale0 = 0, unver0 = 0;

    pt_pair_setup(&p, NULL, NULL);
    rb = pt_pair_buf(&p, 'b', len, LW, 0);
    if (is_verbs()) {
        hits0 = counter("prov.verbs.regcache", "hits");
        stale0 = counter("prov.verbs.regcache", "stale");
        unver0 = counter("prov.verbs.regcache", "unverifiable");
    }
    buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(buf, MAP_FAILED);
    memset(buf, 0x11, len);
    send_get(&p, buf, len, 1, rb);
    ck_assert(pt_all_bytes(rb->p, len, 0x11));
    memset(buf, 0x22, len);
    send_get(&p, buf, len, 2, rb);
    ck_assert(pt_all_bytes(rb->p, len, 0x22));
    if (is_verbs()) {
        uint64_t hits = counter("prov.verbs.regcache", "hits") - hits0;
        uint64_t unver = counter("prov.verbs.regcache", "unverifiable") - unver0;

        printf("mr_get_remapped_buffer: regcache hits %llu, unverifiable %llu\n",
               (unsigned long long)hits, (unsigned long long)unver);
        /* the second use was served from the cache, or the cache said why it could not */
        ck_assert_uint_eq(hits + unver, unver ? 2 : 1);
    }
    /* new pages at the same address */
    ck_assert_int_eq(munmap(buf, len), 0);
    again = mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ck_assert_ptr_eq(again, buf);
    memset(again, 0x33, len);
    send_get(&p, again, len, 3, rb);
    ck_assert_msg(pt_all_bytes(rb->p, len, 0x33),
                  "sent the old pages of a remapped buffer (first byte %#x)", rb->p[0]);
    if (is_verbs() && counter("prov.verbs.regcache", "unverifiable") == unver0)
        ck_assert_uint_eq(counter("prov.verbs.regcache", "stale"), stale0 + 1);
    ck_assert_int_eq(munmap(again, len), 0);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_mem_suite(void)
{
    Suite *s = suite_create("prov_mem");
    TCase *tc = tcase_create("mem");

    tcase_set_timeout(tc, PT_TEST_TIMEOUT);
    tcase_add_test(tc, mem_alloc_local_only);
    tcase_add_test(tc, mr_get_remapped_buffer);
    suite_add_tcase(s, tc);
    return s;
}
