/* SPDX-License-Identifier: MIT */
/* QP cache (X-RDMA): queue pairs of closed connections, back in RESET, kept per context for
 * the next endpoint. Bookkeeping only: destroying goes through a callback. */
#include <stdlib.h>
#include <string.h>

#include "exs/prov/verbs/vrb_cache.h"
#include "exs/util/util.h"

void exs__vrb_qpc_init(struct vrb_qpcache *qc, unsigned max_entries,
                       void (*destroy)(void *arg, void *qp), void *arg)
{
    memset(&qc->cnt, 0, sizeof(qc->cnt));
    pthread_mutex_init(&qc->lock, NULL);
    exs_list_init(&qc->list);
    qc->max_entries = max_entries;
    qc->destroy = destroy;
    qc->arg = arg;
}

void exs__vrb_qpc_fini(struct vrb_qpcache *qc)
{
    if (!qc->list.next)
        return;
    exs__vrb_qpc_close(qc);
    pthread_mutex_destroy(&qc->lock);
    qc->list.next = NULL;
}

void exs__vrb_qpc_close(struct vrb_qpcache *qc)
{
    struct exs_list *l;

    pthread_mutex_lock(&qc->lock);
    __atomic_store_n(&qc->max_entries, 0u, __ATOMIC_RELAXED);
    while ((l = exs_list_pop_head(&qc->list)) != NULL) {
        struct vrb_qpc_entry *e = exs_list_entry(l, struct vrb_qpc_entry, link);

        qc->destroy(qc->arg, e->qp);
        free(e);
    }
    qc->cnt.qp_cache_entries = 0;
    pthread_mutex_unlock(&qc->lock);
}

static int vrb_qpc_covers(const struct vrb_qpc_caps *have, const struct vrb_qpc_caps *want)
{
    return have->max_send_wr >= want->max_send_wr && have->max_recv_wr >= want->max_recv_wr &&
           have->max_inline >= want->max_inline && have->max_sge >= want->max_sge;
}

static uint64_t vrb_qpc_size(const struct vrb_qpc_caps *c)
{
    return (uint64_t)c->max_send_wr + c->max_recv_wr + c->max_inline / 64 + c->max_sge;
}

void *exs__vrb_qpc_get(struct vrb_qpcache *qc, const struct vrb_qpc_caps *want,
                       struct vrb_qpc_caps *caps_p)
{
    struct vrb_qpc_entry *best = NULL;
    struct exs_list *pos;
    void *qp = NULL;

    pthread_mutex_lock(&qc->lock);
    exs_list_for_each(pos, &qc->list)
    {
        struct vrb_qpc_entry *e = exs_list_entry(pos, struct vrb_qpc_entry, link);

        /* the smallest that fits, so big QPs stay for big requests */
        if (vrb_qpc_covers(&e->caps, want) &&
            (!best || vrb_qpc_size(&e->caps) < vrb_qpc_size(&best->caps)))
            best = e;
    }
    if (best) {
        exs_list_del(&best->link);
        qp = best->qp;
        *caps_p = best->caps;
        free(best);
        EXS_CNT_INC(qc->cnt.qp_cache_hits);
        __atomic_fetch_sub(&qc->cnt.qp_cache_entries, 1, __ATOMIC_RELAXED);
    } else {
        EXS_CNT_INC(qc->cnt.qp_cache_misses);
    }
    pthread_mutex_unlock(&qc->lock);
    return qp;
}

void exs__vrb_qpc_put(struct vrb_qpcache *qc, void *qp, const struct vrb_qpc_caps *caps)
{
    struct vrb_qpc_entry *e = NULL, *old = NULL;

    if (__atomic_load_n(&qc->max_entries, __ATOMIC_RELAXED))
        e = malloc(sizeof(*e));
    if (e) {
        e->qp = qp;
        e->caps = *caps;
    }
    pthread_mutex_lock(&qc->lock);
    if (!e || !__atomic_load_n(&qc->max_entries, __ATOMIC_RELAXED)) {
        /* no memory, or caching off (or closed meanwhile) */
        pthread_mutex_unlock(&qc->lock);
        free(e);
        qc->destroy(qc->arg, qp);
        return;
    }
    exs_list_add_head(&qc->list, &e->link);
    EXS_CNT_INC(qc->cnt.qp_cache_puts);
    if (EXS_CNT_GET(qc->cnt.qp_cache_entries) >= qc->max_entries) {
        old = exs_list_entry(qc->list.prev, struct vrb_qpc_entry, link);
        exs_list_del(&old->link);
        EXS_CNT_INC(qc->cnt.qp_cache_evictions);
    } else {
        EXS_CNT_INC(qc->cnt.qp_cache_entries);
    }
    pthread_mutex_unlock(&qc->lock);
    if (old) {
        qc->destroy(qc->arg, old->qp);
        free(old);
    }
}
