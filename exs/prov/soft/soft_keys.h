/* SPDX-License-Identifier: MIT */
/* The key table of the software providers (tcp, shm): memory regions and grants under
 * random keys, the local and remote checks, and the copy fence that revoke and mr_dereg
 * wait for (soft_keys.c; spec/provider-tcp.md, Keys and Fencing; spec/provider-shm.md).
 * Every field is under the provider's lock that the table was made with (tcp: mr_lock,
 * shm: ctx->lock); nothing under it waits for a peer. */
#ifndef EXS_PROV_SOFT_SOFT_KEYS_H
#define EXS_PROV_SOFT_SOFT_KEYS_H

#include <pthread.h>
#include <stdint.h>

#include "exs/prov/prov.h"
#include "exs/util/list.h"

#define EXS_SOFT_KEY_HASH 256

/* A key the peer may present in a WRITE or READ: a region's rkey (valid on every
 * endpoint of the context, as a PD-wide verbs MR) or a grant (valid on its one endpoint). */
struct exs_soft_key {
    struct exs_list link; /* hash bucket, while live */
    uint32_t key;
    uint64_t addr;          /* first byte the key reaches */
    uint64_t length;        /* bytes */
    unsigned access;        /* EXS_PROV_ACCESS_* (grant: exactly one remote right) */
    struct exs_prov_ep *ep; /* grant: the one endpoint; NULL for a region */
    int live;               /* in the hash; cleared by revoke / mr_dereg */
    int orphan;             /* dead and its owner returned: the last put frees it */
    unsigned users;         /* NIC references (tcp: a WRITE being placed, READ responses) */
};

struct exs_soft_mr {
    struct exs_prov_mr base;
    struct exs_soft_key key;
    unsigned grants; /* live grants inside this region */
};

struct exs_soft_grant {
    struct exs_prov_grant base;
    struct exs_soft_key key;
    struct exs_soft_mr *mr;
    struct exs_list ep_link; /* the endpoint's list of grants */
};

struct exs_lite_lock;

struct exs_soft_keys {
    pthread_mutex_t *lock;      /* the provider's lock over all of this, or: */
    struct exs_lite_lock *lite; /* (exs__soft_keys_init_lite) a futex lock */
    /* regions killed, ever (soft_key_kill: stored with release, under the lock). A local
     * check that passed while this read g still holds while it reads g: a live region's
     * key, range and access never change. Read without the lock by tcp's take. */
    uint64_t region_kills;
    pthread_cond_t copy_cond; /* a copy ended while someone waits (lock) */
    uint32_t copy_ends;       /* (lite) copies ended while someone waits: a futex word */
    /* the copy fence: the NIC is copying to or from keyed memory */
    int copying;
    uint64_t copy_gen;             /* copies begun */
    struct exs_soft_key *copy_key; /* the one key copied, NULL: any (tcp's READ responses) */
    unsigned copy_waiters;
    /* key generator */
    uint32_t pool[64];
    unsigned pool_n;
    uint64_t prng;                           /* fallback when getrandom fails */
    struct exs_list hash[EXS_SOFT_KEY_HASH]; /* live keys by number */
    /* the region the last local check found, in front of the hash (a poster's buffers
     * are mostly in one region): NULL, or a live region (soft_key_kill clears it) */
    const struct exs_soft_key *last_local;
    /* the key the last remote check found (a peer's WRITEs mostly name one grant or
     * region): NULL, or a live key (soft_key_kill clears it) */
    struct exs_soft_key *last_remote;
    /* revoked grants' blocks kept for the next grants (a grant per receive or ADVERT on
     * the data path then costs no calloc and free): at most EXS_SOFT_GRANT_CACHE */
    struct exs_soft_grant *grant_cache; /* linked through their key.link.next */
    unsigned grant_cached;
};

#define EXS_SOFT_GRANT_CACHE 64

/* [addr, addr+len) inside [base, base+length), without overflow. */
static inline int exs__soft_range_in(uint64_t base, uint64_t length, uint64_t addr, uint64_t len)
{
    return addr >= base && len <= length && addr - base <= length - len;
}

void exs__soft_keys_init(struct exs_soft_keys *t, pthread_mutex_t *lock);
/* The same, the table under a futex lock (exs/util/lite_lock.h: shm's context lock). */
void exs__soft_keys_init_lite(struct exs_soft_keys *t, struct exs_lite_lock *lite);
/* The table's lock, whichever it is (the provider ops below take it themselves). */
void exs__soft_keys_lock(struct exs_soft_keys *t);
void exs__soft_keys_unlock(struct exs_soft_keys *t);
void exs__soft_keys_fini(struct exs_soft_keys *t);

/* ---- the provider ops (each takes the table's lock) ---- */

int exs__soft_mr_reg(struct exs_soft_keys *t, struct exs_prov_ctx *ctx, void *addr, size_t length,
                     unsigned access, struct exs_prov_mr **mr_p);
/* -EINVAL (dead), -EBUSY (live grants), or 0. Never waits for a peer: only for the one
 * copy into or out of the region running at this instant. */
int exs__soft_mr_dereg(struct exs_soft_keys *t, struct exs_prov_mr *mr);
/* A grant of ep over [addr, addr+length) of mr. ready_locked (may be NULL) is asked
 * under the table's lock whether ep may have one: else -ENOTCONN. */
int exs__soft_grant(struct exs_soft_keys *t, struct exs_prov_ep *ep, struct exs_prov_mr *mr,
                    void *addr, size_t length, unsigned access,
                    int (*ready_locked)(struct exs_prov_ep *ep), struct exs_list *ep_grants,
                    struct exs_prov_grant **grant_p);
void exs__soft_revoke(struct exs_soft_keys *t, struct exs_prov_grant *grant);
/* Locked: the grants left on an endpoint being destroyed (a consumer bug: logged). */
void exs__soft_revoke_all_locked(struct exs_soft_keys *t, struct exs_list *ep_grants);

/* ---- the NIC's side (locked) ---- */

/* exs__soft_check_local_locked without the look at the last region found. */
int exs__soft_check_local_slow_locked(struct exs_soft_keys *t, const struct exs_prov_sge *sge,
                                      int n, unsigned access);

/* 0 when every sge of non-zero length lies in a region with the access bits, else
 * -EACCES. One sge inside the region the last check found: a compare, no hash walk and
 * no call (a post_recv per message). */
static inline int exs__soft_check_local_locked(struct exs_soft_keys *t,
                                               const struct exs_prov_sge *sge, int n,
                                               unsigned access)
{
    const struct exs_soft_key *k = t->last_local;

    if (n == 1 && k && k->key == sge[0].lkey &&
        exs__soft_range_in(k->addr, k->length, sge[0].addr, sge[0].length) &&
        (k->access & access) == access)
        return 0;
    return exs__soft_check_local_slow_locked(t, sge, n, access);
}
/* A local check remembered by its user (shm: an endpoint's receive ring): a live region
 * the table found and region_kills then. Zeroed: remembers nothing (no live key is 0). */
struct exs_soft_local_memo {
    uint64_t addr, length;
    uint64_t kills;
    uint32_t key;
    unsigned access;
};

/* 1 when one sge lies inside m's region with the access and no region died since m was
 * filled. Without the table's lock too (tcp's take: m its own, region_kills acquired): a
 * region dying meanwhile is one dying after the check, as at a locked check's return. */
static inline int exs__soft_local_memo_hit(struct exs_soft_keys *t,
                                           const struct exs_soft_local_memo *m,
                                           const struct exs_prov_sge *sge, int n, unsigned access)
{
    return n == 1 && m->kills == __atomic_load_n(&t->region_kills, __ATOMIC_ACQUIRE) &&
           m->key == sge[0].lkey &&
           exs__soft_range_in(m->addr, m->length, sge[0].addr, sge[0].length) &&
           (m->access & access) == access;
}

/* exs__soft_check_local_memo_locked past the memo: the check, and the memo filled. */
int exs__soft_check_local_memo_slow_locked(struct exs_soft_keys *t, struct exs_soft_local_memo *m,
                                           const struct exs_prov_sge *sge, int n, unsigned access);

/* exs__soft_check_local_locked, the region first looked for in m: one sge inside it, no
 * region killed since it was found, passes with compares of the user's own memory and one
 * load of region_kills (a receive per message, taken by the NIC's turn). */
static inline int exs__soft_check_local_memo_locked(struct exs_soft_keys *t,
                                                    struct exs_soft_local_memo *m,
                                                    const struct exs_prov_sge *sge, int n,
                                                    unsigned access)
{
    if (exs__soft_local_memo_hit(t, m, sge, n, access))
        return 0;
    return exs__soft_check_local_memo_slow_locked(t, m, sge, n, access);
}
/* The live key numbered rkey, or NULL (the hash walk of exs__soft_key_remote_locked). */
struct exs_soft_key *exs__soft_key_find_locked(struct exs_soft_keys *t, uint32_t rkey);
/* A grant of ep (exact right, exact range) or a region of the context (covering the
 * access) numbered rkey and reaching [addr, addr+len): the key, or NULL. The key the last
 * check found is looked at first: a compare, no call and no hash walk (a WRITE per
 * message). */
static inline struct exs_soft_key *exs__soft_key_remote_locked(struct exs_soft_keys *t,
                                                               const struct exs_prov_ep *ep,
                                                               uint32_t rkey, uint64_t addr,
                                                               uint64_t len, unsigned access)
{
    struct exs_soft_key *k = t->last_remote;

    if (!k || k->key != rkey) {
        k = exs__soft_key_find_locked(t, rkey);
        if (!k)
            return NULL;
        t->last_remote = k;
    }
    if ((k->ep ? k->ep == ep && k->access == access : (k->access & access) == access) &&
        exs__soft_range_in(k->addr, k->length, addr, len))
        return k;
    return NULL;
}
/* Raise the fence over k (NULL: every key) / lower it. */
void exs__soft_fence_raise_locked(struct exs_soft_keys *t, struct exs_soft_key *k);
void exs__soft_fence_lower_locked(struct exs_soft_keys *t);
/* Before a copy of peer bytes into local memory (a receive's sges, a READ's destination):
 * 0 and the fence raised over the sges' region (sges in several regions: every key), or
 * -EACCES (an sge outside a live region with access; the fence left as it was). *kills is
 * region_kills when the sges were last found live (UINT64_MAX: never) and *lkey the region
 * then: while no region died since, nothing is looked up again (a copy per readv). */
int exs__soft_fence_local_locked(struct exs_soft_keys *t, const struct exs_prov_sge *sge, int n,
                                 unsigned access, struct exs_soft_key **lkey, uint64_t *kills);
/* A NIC reference of k dropped: the last one of a dead key frees its owner. */
void exs__soft_key_put_locked(struct exs_soft_key *k);

#endif
