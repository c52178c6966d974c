/* SPDX-License-Identifier: MIT */
/* The engine's listeners and the RDMA-to-TCP fallback: listening on both contexts, which
 * failed connects are retried over tcp, and at which port. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "exs/engine/engine.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/* ---- fallback (spec/provider.md, Fallback) ---- */

int exs__engine_fallback_addr(const struct sockaddr *addr, socklen_t addrlen,
                              struct sockaddr_storage *out_p, socklen_t *outlen_p)
{
    uint64_t off = exs__params.fallback_port_offset;
    unsigned port;

    if (addrlen > sizeof(*out_p))
        return -EINVAL;
    memcpy(out_p, addr, addrlen);
    if (addr->sa_family == AF_INET && addrlen >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in *in = (struct sockaddr_in *)out_p;

        port = ntohs(in->sin_port);
        if (port + off > 65535)
            return -EADDRNOTAVAIL;
        in->sin_port = htons((uint16_t)(port + off));
    } else if (addr->sa_family == AF_INET6 && addrlen >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out_p;

        port = ntohs(in6->sin6_port);
        if (port + off > 65535)
            return -EADDRNOTAVAIL;
        in6->sin6_port = htons((uint16_t)(port + off));
    } else {
        return -EAFNOSUPPORT;
    }
    *outlen_p = addrlen;
    return 0;
}

/* The reason a failed connect falls back for, or NULL when err is not one. */
static const char *eng_fb_reason(int err, uint64_t **cnt_p)
{
    switch (err) {
    case ECONNREFUSED:
        *cnt_p = &exs__eng_fb_cnt.fallback_refused;
        return "refused";
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
        *cnt_p = &exs__eng_fb_cnt.fallback_unreachable;
        return "unreachable";
    case ETIMEDOUT:
        *cnt_p = &exs__eng_fb_cnt.fallback_timeout;
        return "timed out";
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:
    case ENODEV:
        *cnt_p = &exs__eng_fb_cnt.fallback_addr;
        return "address error";
    default:
        return NULL;
    }
}

int exs__engine_fallback_eligible(const struct exs_prov_ctx *ctx, int err)
{
    uint64_t *cnt;

    return exs__engine_fallback_ctx() && ctx != exs__engine_fallback_ctx() &&
           exs__engine_fallback_policy() != EXS_ENG_FB_OFF &&
           exs__engine_fallback_policy() != EXS_ENG_FB_SHM && eng_fb_reason(err, &cnt) != NULL;
}

void exs__engine_fallback_note(int err, const struct sockaddr *addr, int sock_fd)
{
    char host[INET6_ADDRSTRLEN] = "?";
    uint64_t *cnt = NULL;
    const char *why = eng_fb_reason(err, &cnt);
    unsigned port = 0;

    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;

        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;

        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    EXS_CNT_INC(exs__eng_fb_cnt.fallback_connects);
    if (cnt)
        EXS_CNT_INC(*cnt);
    EXS_INFO(
        ENG,
        "fd %d: connect to %s port %u over %s failed (%s: %s); retrying over tcp port %" PRIu64,
        sock_fd, host, port, exs__prov_name(exs__engine_ctx()), why ? why : "?", strerror(err),
        (uint64_t)port + exs__params.fallback_port_offset);
}

/* A primary listener given up while exs_listen still holds its socket's lock: a
 * connection request already taken from the provider may be on its way to on_request
 * (which waits for that lock), so it is destroyed by a job, on the progress thread,
 * after any such dispatch. */
struct eng_retire {
    struct exs_job job;
    struct exs_prov_listener *pl;
};

static void eng_retire_job(struct exs_job *job)
{
    struct eng_retire *r = exs_container_of(job, struct eng_retire, job);

    exs__prov_listener_destroy(r->pl);
    free(r);
}

static int eng_listener_retire(struct exs_prov_listener *pl)
{
    struct eng_retire *r = calloc(1, sizeof(*r));

    if (!r)
        return -ENOMEM;
    r->pl = pl;
    r->job.fn = eng_retire_job;
    exs__engine_post(&r->job);
    return 0;
}

static unsigned eng_sa_port(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return 0;
}

#define ENG_FB_LISTEN_TRIES 16 /* ephemeral primary ports tried for a free fallback port */

int exs__engine_listen(struct exs_eng_listener *lis, const struct sockaddr *addr, socklen_t addrlen,
                       int backlog)
{
    struct sockaddr_storage ss, fa;
    socklen_t len, flen;
    int ret;

    lis->pl = lis->pl_fb = NULL;
    ret = exs__prov_listen(exs__engine_ctx(), addr, addrlen, backlog, lis, &lis->pl);
    if (ret || !exs__engine_fallback_ctx())
        return ret;
    for (int tries = 1;; tries++) {
        len = sizeof(ss);
        ret = exs__prov_listener_addr(lis->pl, &ss, &len);
        if (!ret)
            ret = exs__engine_fallback_addr((struct sockaddr *)&ss, len, &fa, &flen);
        if (!ret)
            ret = exs__prov_listen(exs__engine_fallback_ctx(), (struct sockaddr *)&fa, flen,
                                   backlog, lis, &lis->pl_fb);
        if (!ret) {
            EXS_CNT_INC(exs__eng_fb_cnt.fallback_listens);
            EXS_DBG(ENG, "listener on %s port %u and tcp port %u",
                    exs__prov_name(exs__engine_ctx()), eng_sa_port((struct sockaddr *)&ss),
                    eng_sa_port((struct sockaddr *)&fa));
            return 0;
        }
        /* An ephemeral primary port whose fallback port is taken: try another one. */
        if (ret != -EADDRINUSE || eng_sa_port(addr) != 0 || tries == ENG_FB_LISTEN_TRIES)
            break;
        if (eng_listener_retire(lis->pl))
            break;
        lis->pl = NULL;
        ret = exs__prov_listen(exs__engine_ctx(), addr, addrlen, backlog, lis, &lis->pl);
        if (ret)
            return ret;
    }
    if (exs__engine_fallback_policy() == EXS_ENG_FB_SHM && lis->pl) {
        /* no shm listener (its port's name taken by another process of the host): the
         * listener serves over the primary alone, its connections stay there */
        EXS_INFO(ENG, "shm listener: %s; connections of this listener stay on %s", strerror(-ret),
                 exs__prov_name(exs__engine_ctx()));
        lis->pl_fb = NULL;
        return 0;
    }
    EXS_INFO(ENG, "fallback listener on tcp: %s", strerror(-ret));
    if (lis->pl && eng_listener_retire(lis->pl)) {
        /* no memory for the job: a request for this brand-new listener is unlikely */
        exs__prov_listener_destroy(lis->pl);
    }
    lis->pl = NULL;
    return ret;
}

int exs__engine_listener_pause(struct exs_eng_listener *lis, int pause)
{
    int ret = 0, r;

    EXS_ASSERT(exs__engine_on_thread());
    if (lis->pl && (r = exs__prov_listener_pause(lis->pl, pause)))
        ret = r;
    if (lis->pl_fb && (r = exs__prov_listener_pause(lis->pl_fb, pause)) && !ret)
        ret = r;
    return ret;
}

void exs__engine_listener_destroy(struct exs_eng_listener *lis)
{
    EXS_ASSERT(exs__engine_on_thread());
    if (lis->pl)
        exs__prov_listener_destroy(lis->pl);
    if (lis->pl_fb)
        exs__prov_listener_destroy(lis->pl_fb);
    lis->pl = lis->pl_fb = NULL;
}
