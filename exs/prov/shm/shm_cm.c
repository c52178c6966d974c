/* SPDX-License-Identifier: MIT */
/* The shm provider's connection management: endpoints, the unix-socket rendezvous (memfd and
 * doorbell passed with SCM_RIGHTS, SO_PEERCRED, pidfd), accept / reject, ending a connection. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/prov/shm/shm.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

#ifndef F_SEAL_SEAL
#define F_SEAL_SEAL   0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW   0x0004
#endif
#define SHM_SEALS (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW)

/* ---- handshake messages ---- */

int exs__shm_hs_send(int fd, uint8_t type, uint8_t flags, const struct shm_ctx *ctx,
                     const struct shm_ep *ep, const void *pd, uint32_t pdlen, const int *fds,
                     int nfds, unsigned sport, uint32_t ring_bytes)
{
    struct shm_hs hs;
    union {
        struct cmsghdr c;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } u;
    struct iovec iov;
    struct msghdr msg;
    ssize_t n;

    memset(&hs, 0, sizeof(hs));
    hs.magic = SHM_MAGIC;
    hs.version = SHM_VERSION;
    hs.type = type;
    hs.flags = flags;
    if (ep) {
        hs.rnr_retry = (uint8_t)EXS_MIN(ep->base.attr.rnr_retry, ctx->rnr_retry_max);
        hs.rnr_timer_ms = ep->base.attr.rnr_timer_ms;
    }
    hs.seg_bytes = type == SHM_HS_REQ ? SHM_SEG_BYTES(ring_bytes) : 0;
    hs.ring_bytes = ring_bytes;
    hs.src_port = (uint16_t)sport;
    hs.pdlen = pdlen;
    if (pdlen)
        memcpy(hs.pd, pd, pdlen);
    iov.iov_base = &hs;
    iov.iov_len = SHM_HS_FIXED + pdlen;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.buf;
        msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        u.c.cmsg_level = SOL_SOCKET;
        u.c.cmsg_type = SCM_RIGHTS;
        u.c.cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(&u.c), fds, (size_t)nfds * sizeof(int));
    }
    n = exs__nc_sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0)
        return -errno;
    return n == (ssize_t)iov.iov_len ? 0 : -EIO;
}

/* One message: its length (> 0), 0 at EOF, -EAGAIN, -errno; *nfds descriptors received
 * (the caller owns them). A message is checked for magic, version and length. */
static int shm_hs_recv(int fd, struct shm_hs *hs, int fds[2], int *nfds)
{
    union {
        struct cmsghdr c;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = hs, .iov_len = sizeof(*hs)};
    struct msghdr msg;
    struct cmsghdr *c;
    ssize_t n;
    int bad = 0;

    *nfds = 0;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof(u.buf);
    n = exs__nc_recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -errno;
    for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int f;

            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*nfds < 2)
                fds[(*nfds)++] = f;
            else {
                exs__nc_close(f);
                bad = 1;
            }
        }
    }
    if (n == 0 && !*nfds)
        return 0;
    if (bad || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < SHM_HS_FIXED ||
        hs->magic != SHM_MAGIC || hs->version != SHM_VERSION || hs->pdlen > SHM_PD_MAX ||
        (size_t)n != SHM_HS_FIXED + hs->pdlen)
        return -EPROTO;
    return (int)n;
}

static void shm_close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        exs__nc_close(fds[i]);
}

static void shm_event_ep(struct shm_ctx *ctx, enum exs_prov_cm_event_type type, struct shm_ep *ep,
                         int status, unsigned flags, const void *pd, uint32_t pdlen)
{
    struct exs_prov_cm_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.ep = &ep->base;
    ev.status = status;
    ev.flags = flags;
    ev.private_data_len = pdlen;
    if (pdlen)
        memcpy(ev.private_data, pd, pdlen);
    exs__shm_cm_push(ctx, &ev);
}

/* ---- connections ---- */

struct shm_conn *exs__shm_conn_new(struct shm_ctx *ctx, int fd, int side)
{
    struct shm_conn *conn = calloc(1, sizeof(*conn));

    if (!conn)
        return NULL;
    conn->ctx = ctx;
    conn->fd = fd;
    conn->pidfd = -1;
    conn->bell = -1;
    conn->side = side;
    exs_list_add_tail(&ctx->conns, &conn->link);
    return conn;
}

/* The peer process (SO_PEERCRED): same user (cross-memory attach needs it), and a pidfd
 * that becomes readable when it exits. */
int exs__shm_conn_peer(struct shm_conn *conn)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);

    if (getsockopt(conn->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return -errno;
    if (cr.uid != geteuid() || cr.pid <= 0) {
        EXS_WARN(PROV, "shm: peer pid %d uid %u refused (not our user)", (int)cr.pid,
                 (unsigned)cr.uid);
        return -EPERM;
    }
    conn->pid = cr.pid;
    conn->pidfd = (int)syscall(SYS_pidfd_open, cr.pid, 0);
    if (conn->pidfd >= 0 && exs__shm_epoll_add(conn->ctx, conn->pidfd, conn, SHM_TAG_PID) < 0) {
        exs__nc_close(conn->pidfd);
        conn->pidfd = -1;
    }
    return 0;
}

/* The rings' size both sides use (ring: <= seg_ring, a power of two): fragments of at most
 * a quarter ring (a record of one a quarter ring at most), a doorbell each quarter. */
static void shm_conn_rings(struct shm_conn *conn, uint32_t ring)
{
    conn->ring_bytes = ring;
    conn->ring_mask = (uint64_t)ring - 1;
    conn->frag_bytes = EXS_MIN(SHM_FRAG_BYTES, ring / 4 - SHM_SLOT);
}

/* conn is UP with its rings agreed: counted in ring_mem until conn_free. */
static void shm_conn_count_rings(struct shm_conn *conn)
{
    conn->ring_counted = 1;
    EXS_CNT_ADD(conn->ctx->cnt.ring_mem, SHM_SEG_HDR + 2ull * conn->ring_bytes);
}

/* seg: a segment of rings of seg_ring bytes (SHM_SEG_BYTES(seg_ring)). */
static void shm_conn_map(struct shm_conn *conn, uint8_t *seg, uint32_t seg_ring)
{
    conn->seg = seg;
    conn->seg_ring = seg_ring;
    conn->mine = (struct shm_line *)(void *)(seg + (size_t)conn->side * SHM_LINE_STRIDE);
    conn->peer = (struct shm_line *)(void *)(seg + (size_t)!conn->side * SHM_LINE_STRIDE);
    conn->mine_flag =
        (struct shm_flag *)(void *)(seg + SHM_FLAG_OFF + (size_t)conn->side * SHM_LINE_STRIDE);
    conn->peer_flag =
        (struct shm_flag *)(void *)(seg + SHM_FLAG_OFF + (size_t)!conn->side * SHM_LINE_STRIDE);
    conn->tx_ring = seg + SHM_SEG_HDR + (size_t)conn->side * seg_ring;
    conn->rx_ring = seg + SHM_SEG_HDR + (size_t)!conn->side * seg_ring;
    /* peers write our bell until our first turn: a connection made while we sleep */
    conn->sleeping = 1;
    __atomic_store_n(&conn->mine_flag->sleeping, 1, __ATOMIC_RELAXED);
}

/* Close the descriptors of an ended connection (its memory stays until conn_free). */
static void shm_conn_close_fds(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;

    if (conn->fd >= 0) {
        exs__shm_epoll_del(ctx, conn->fd);
        exs__nc_close(conn->fd);
        conn->fd = -1;
    }
    if (conn->pidfd >= 0) {
        exs__shm_epoll_del(ctx, conn->pidfd);
        exs__nc_close(conn->pidfd);
        conn->pidfd = -1;
    }
    if (conn->bell >= 0) {
        exs__nc_close(conn->bell);
        conn->bell = -1;
    }
}

void exs__shm_conn_free(struct shm_conn *conn)
{
    shm_conn_close_fds(conn);
    if (conn->seg)
        munmap(conn->seg, SHM_SEG_BYTES(conn->seg_ring));
    if (conn->ring_counted)
        EXS_CNT_ADD(conn->ctx->cnt.ring_mem, -(SHM_SEG_HDR + 2ull * conn->ring_bytes));
    free(conn);
}

/* ctx->lock held */
void exs__shm_ep_flush_locked(struct shm_ep *ep)
{
    struct exs_list *l;

    for (int q = 0; q < 2; q++) {
        struct exs_list *sq = q ? &ep->sq_pend : &ep->sq;

        while ((l = exs_list_pop_head(sq)) != NULL) {
            struct shm_wr *wr = exs_list_entry(l, struct shm_wr, link);

            if (!ep->destroyed)
                exs__shm_flush_cqe_locked(
                    ep, wr->wr_id,
                    wr->opcode == EXS_PROV_WR_RDMA_READ    ? EXS_PROV_WC_RDMA_READ
                    : wr->opcode >= EXS_PROV_WR_RDMA_WRITE ? EXS_PROV_WC_RDMA_WRITE
                                                           : EXS_PROV_WC_SEND);
            exs__shm_wr_put_locked(ep, wr);
        }
    }
    exs__shm_ep_pend_locked(ep);
    ep->sq_used = 0;
    ep->sq_unretired = 0;
    ep->reads_out = 0;
    /* a message in fragments holds the receive taken last: given back first, so the sweep
     * flushes it once and in posting order (a flush with the connection kept, after
     * RNR_EXC, would leave it to the connection's end, behind later receives) */
    if (ep->conn && ep->conn->frag_rwr) {
        exs__shm_rq_back_locked(ep, ep->conn->frag_rwr);
        ep->conn->frag_rwr = NULL;
    }
    exs__shm_rq_sweep_locked(ep);
}

/* The ep goes to ERROR, everything flushed; DISCONNECTED (once) when notify. */
static void shm_ep_fail(struct shm_ep *ep, int status, unsigned flags, int notify)
{
    struct shm_ctx *ctx = ep->ctx;
    int send_ev;

    exs__lite_lock(&ctx->lock);
    ep->state = EXS_PROV_EP_ERROR;
    exs__shm_ep_flush_locked(ep);
    send_ev = notify && !ep->disc_sent;
    if (send_ev)
        ep->disc_sent = 1;
    exs__lite_unlock(&ctx->lock);
    if (send_ev)
        shm_event_ep(ctx, EXS_PROV_CM_DISCONNECTED, ep, status, flags, NULL, 0);
}

void exs__shm_conn_detach(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;

    conn->state = SHM_CONN_DEAD;
    if (conn->ep) {
        exs__lite_lock(&ctx->lock);
        if (conn->frag_rwr) /* a message in fragments cut off: its receive is flushed */
            exs__shm_rq_back_locked(conn->ep, conn->frag_rwr);
        conn->frag_rwr = NULL;
        conn->ep->conn = NULL;
        exs__lite_unlock(&ctx->lock);
        conn->ep = NULL;
    }
    shm_conn_close_fds(conn);
}

void exs__shm_conn_end(struct shm_conn *conn, int status, unsigned flags, int send_disc)
{
    struct shm_ep *ep = conn->ep;

    if (conn->state == SHM_CONN_DEAD)
        return;
    if (send_disc && conn->fd >= 0)
        (void)exs__shm_hs_send(conn->fd, SHM_HS_DISC, send_disc == 2 ? SHM_HSF_CLOSED : 0,
                               conn->ctx, NULL, NULL, 0, NULL, 0, 0, 0);
    EXS_DBG(PROV, "shm conn %p: ends, status %d", (void *)conn, status);
    exs__shm_conn_detach(conn);
    if (ep)
        shm_ep_fail(ep, status, flags, 1);
}

void exs__shm_conn_peer_died(struct shm_conn *conn)
{
    struct shm_ctx *ctx = conn->ctx;

    if (conn->dying)
        return; /* a copy failed while the service below ran: the end follows there */
    EXS_CNT_INC(ctx->cnt.peer_deaths);
    switch (conn->state) {
    case SHM_CONN_UP:
        /* what it finished before it died counts: its answers are in the segment */
        conn->dying = 1;
        (void)exs__shm_conn_service(conn);
        exs__shm_conn_end(conn, -ECONNRESET, EXS_PROV_CM_F_PEER_CLOSED, 0);
        break;
    case SHM_CONN_PENDING:
        conn->broken = 1;
        shm_conn_close_fds(conn);
        break;
    case SHM_CONN_WAIT_REPLY: {
        struct shm_ep *ep = conn->ep;

        EXS_CNT_INC(ctx->cnt.conns_unreachable);
        exs__shm_conn_detach(conn);
        if (ep) {
            exs__lite_lock(&ctx->lock);
            ep->state = EXS_PROV_EP_ERROR;
            exs__shm_ep_flush_locked(ep);
            ep->disc_sent = 1;
            exs__lite_unlock(&ctx->lock);
            shm_event_ep(ctx, EXS_PROV_CM_UNREACHABLE, ep, -ECONNREFUSED, 0, NULL, 0);
        }
        break;
    }
    default:
        EXS_CNT_INC(ctx->cnt.bogus_conns);
        exs__shm_conn_detach(conn);
        break;
    }
}

/* A doorbell the peer sent must be an eventfd: we write it from the NIC thread, and a pipe
 * or socket with no reader would raise SIGPIPE, a FIFO or device could block. Without /proc
 * (the name unreadable), anything but those kinds is taken: an eventfd has no file type. */
static int shm_bell_ok(int fd)
{
    char path[40], name[32];
    struct stat st;
    ssize_t n;

    if (fstat(fd, &st) < 0)
        return 0;
    switch (st.st_mode & S_IFMT) {
    case S_IFIFO:
    case S_IFSOCK:
    case S_IFCHR:
    case S_IFBLK:
    case S_IFDIR:
        return 0;
    default:
        break;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, name, sizeof(name) - 1);
    if (n < 0)
        return 1;
    name[n] = 0;
    return strcmp(name, "anon_inode:[eventfd]") == 0;
}

/* passive: a REQ arrived on a WAIT_REQ socket */
static void shm_conn_got_req(struct shm_conn *conn, const struct shm_hs *hs, int len, int *fds,
                             int nfds)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_listener *lis = conn->lis;
    struct exs_prov_cm_event ev;
    struct shm_req *req;
    struct stat st;
    void *seg;
    int seals;

    /* the ring size announced, and the segment's size it makes: checked before anything
     * is mapped (a mapping past the file's end is a SIGBUS at its first touch) */
    if (hs->type != SHM_HS_REQ || nfds != 2 || !exs__shm_ring_ok(hs->ring_bytes, SHM_RING_MAX) ||
        hs->seg_bytes != SHM_SEG_BYTES(hs->ring_bytes) || hs->rnr_retry > 7 || !shm_bell_ok(fds[1]))
        goto bogus;
    /* the segment must keep its size whatever the peer does: sealed, so that no page of it
     * can vanish under us (SIGBUS) */
    seals = fcntl(fds[0], F_GET_SEALS);
    if (seals < 0 || (seals & SHM_SEALS) != SHM_SEALS || fstat(fds[0], &st) < 0 ||
        !S_ISREG(st.st_mode) || (uint64_t)st.st_size != hs->seg_bytes)
        goto bogus;
    seg = mmap(NULL, hs->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (seg == MAP_FAILED)
        goto bogus;
    exs__nc_close(fds[0]);
    conn->bell = fds[1];
    (void)fcntl(conn->bell, F_SETFL, O_NONBLOCK);
    shm_conn_map(conn, seg, hs->ring_bytes);
    req = calloc(1, sizeof(*req));
    if (!req) {
        exs__shm_conn_detach(conn);
        return;
    }
    req->base.listener = &lis->base;
    req->conn = conn;
    conn->req = req;
    exs_list_add_tail(&lis->reqs, &req->link);
    conn->peer_rnr_retry = hs->rnr_retry;
    conn->peer_rnr_timer_ms = hs->rnr_timer_ms;
    conn->state = SHM_CONN_PENDING;
    exs__shm_loopback(&conn->peer_addr, &conn->peer_addrlen, lis->addr.ss_family, hs->src_port);
    memset(&ev, 0, sizeof(ev));
    ev.type = EXS_PROV_CM_CONNECT_REQUEST;
    ev.listener = &lis->base;
    ev.req = &req->base;
    ev.peer_addr = conn->peer_addr;
    ev.peer_addrlen = conn->peer_addrlen;
    ev.private_data_len = hs->pdlen;
    memcpy(ev.private_data, hs->pd, hs->pdlen);
    (void)len;
    exs__shm_cm_push(ctx, &ev);
    return;
bogus:
    EXS_CNT_INC(ctx->cnt.bogus_conns);
    shm_close_fds(fds, nfds);
    exs__shm_conn_detach(conn);
}

/* active: ACCEPT or REJECT */
static void shm_conn_got_reply(struct shm_conn *conn, const struct shm_hs *hs, int *fds, int nfds)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_ep *ep = conn->ep;

    /* the rings agreed: at most ours (the segment's), a power of two */
    if (hs->type == SHM_HS_ACCEPT && nfds == 1 && hs->rnr_retry <= 7 &&
        exs__shm_ring_ok(hs->ring_bytes, conn->seg_ring) && shm_bell_ok(fds[0])) {
        shm_conn_rings(conn, hs->ring_bytes);
        shm_conn_count_rings(conn);
        conn->bell = fds[0];
        (void)fcntl(conn->bell, F_SETFL, O_NONBLOCK);
        conn->peer_rnr_retry = hs->rnr_retry;
        conn->peer_rnr_timer_ms = hs->rnr_timer_ms;
        conn->state = SHM_CONN_UP;
        exs__lite_lock(&ctx->lock);
        ep->state = EXS_PROV_EP_CONNECTED;
        exs__shm_ep_push_locked(ep);
        exs__lite_unlock(&ctx->lock);
        EXS_CNT_INC(ctx->cnt.conns_established);
        shm_event_ep(ctx, EXS_PROV_CM_ESTABLISHED, ep, 0, 0, hs->pd, hs->pdlen);
        return;
    }
    shm_close_fds(fds, nfds);
    if (hs->type == SHM_HS_REJECT && !nfds) {
        EXS_CNT_INC(ctx->cnt.conns_rejected);
        exs__shm_conn_detach(conn);
        exs__lite_lock(&ctx->lock);
        ep->state = EXS_PROV_EP_ERROR;
        exs__shm_ep_flush_locked(ep);
        ep->disc_sent = 1;
        exs__lite_unlock(&ctx->lock);
        shm_event_ep(ctx, EXS_PROV_CM_REJECTED, ep, -ECONNREFUSED, 0, hs->pd, hs->pdlen);
        return;
    }
    EXS_CNT_INC(ctx->cnt.protocol_errors);
    exs__shm_conn_peer_died(conn); /* UNREACHABLE */
}

void exs__shm_conn_readable(struct shm_conn *conn, uint32_t events)
{
    struct shm_ctx *ctx = conn->ctx;
    struct shm_hs hs;
    int fds[2], nfds, n;

    for (;;) {
        if (conn->fd < 0 || conn->state == SHM_CONN_DEAD)
            return;
        n = shm_hs_recv(conn->fd, &hs, fds, &nfds);
        if (n == -EAGAIN || n == -EINTR) {
            if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP))
                n = 0; /* hung up with nothing more to read */
            else
                return;
        }
        if (n <= 0 && n != -EPROTO) {
            shm_close_fds(fds, nfds);
            if (conn->state == SHM_CONN_WAIT_REQ) {
                /* closed before any request: an active side's look at this listener
                 * (exs__prov_shm_peer), or a client that gave up; nothing was held */
                EXS_CNT_INC(ctx->cnt.rendezvous_closed);
                exs__shm_conn_detach(conn);
                return;
            }
            exs__shm_conn_peer_died(conn);
            return;
        }
        switch (conn->state) {
        case SHM_CONN_WAIT_REQ:
            if (n < 0)
                goto bogus;
            shm_conn_got_req(conn, &hs, n, fds, nfds);
            continue;
        case SHM_CONN_WAIT_REPLY:
            if (n < 0)
                goto bogus;
            shm_conn_got_reply(conn, &hs, fds, nfds);
            continue;
        case SHM_CONN_PENDING:
            /* the active side gave up (DISCONNECT) or spoke out of turn */
            shm_close_fds(fds, nfds);
            conn->broken = 1;
            shm_conn_close_fds(conn);
            return;
        case SHM_CONN_UP:
            shm_close_fds(fds, nfds);
            if (n < 0 || hs.type != SHM_HS_DISC || (hs.flags & ~SHM_HSF_CLOSED) || hs.pdlen) {
                EXS_CNT_INC(ctx->cnt.protocol_errors);
                exs__shm_conn_end(conn, -EPROTO, 0, 1);
                return;
            }
            /* requests it wrote before its DISCONNECT are carried out first */
            while (conn->state == SHM_CONN_UP && !conn->rnr_at && exs__shm_conn_service(conn) > 0)
                ;
            exs__shm_conn_end(conn, 0, (hs.flags & SHM_HSF_CLOSED) ? EXS_PROV_CM_F_PEER_CLOSED : 0,
                              0);
            return;
        default:
            shm_close_fds(fds, nfds);
            return;
        }
    }
bogus:
    shm_close_fds(fds, nfds);
    EXS_CNT_INC(ctx->cnt.protocol_errors);
    exs__shm_conn_peer_died(conn);
}

/* ---- endpoints ---- */

int exs__shm_ep_create(struct exs_prov_ctx *c, const struct exs_prov_ep_attr *attr,
                       struct exs_prov_ep **ep_p)
{
    struct shm_ctx *ctx = shm_ctx_of(c);
    const struct exs_prov_caps *caps = &c->caps;
    struct shm_ep *ep;
    int ret;

    if (!attr || !attr->max_send_wr || !attr->max_recv_wr ||
        attr->max_send_wr > caps->max_send_wr || attr->max_recv_wr > caps->max_recv_wr ||
        attr->max_inline > caps->max_inline || attr->rnr_retry > 7)
        return -EINVAL;
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    ep->base.ctx = c;
    ep->base.user = attr->user;
    ep->base.attr = *attr;
    ep->ctx = ctx;
    ep->state = EXS_PROV_EP_IDLE;
    exs_list_init(&ep->sq_pend);
    exs_list_init(&ep->sq);
    exs_list_init(&ep->grants);
    exs__soft_pool_init(&ep->wr_pool, SHM_WR_POOL_LEN, SHM_POOL_MAX);
    if (exs__shm_rq_init(ep)) {
        free(ep);
        return -ENOMEM;
    }
    exs__lite_lock(&ctx->lock);
    ret = exs__soft_cq_reserve(&ctx->cq, (uint64_t)attr->max_send_wr + attr->max_recv_wr,
                               ctx->base.caps.max_cqe);
    if (!ret)
        exs_list_add_tail(&ctx->eps, &ep->link);
    exs__lite_unlock(&ctx->lock);
    if (ret) {
        exs__shm_rq_fini(ep);
        free(ep);
        return ret;
    }
    *ep_p = &ep->base;
    return 0;
}

void exs__shm_ep_destroy(struct exs_prov_ep *e)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx;

    if (!ep)
        return;
    ctx = ep->ctx;
    exs__shm_nic_lock(ctx);
    exs__lite_lock(&ctx->lock);
    ep->destroyed = 1;
    ep->disc_sent = 1;
    exs__shm_ep_revoke_all_locked(ep);
    exs__lite_unlock(&ctx->lock);
    if (ep->conn)
        exs__shm_conn_end(ep->conn, 0, 0, 2); /* closed for good */
    exs__lite_lock(&ctx->lock);
    exs__shm_ep_flush_locked(ep); /* frees without completions: destroyed */
    exs__soft_cq_drop_ep(&ctx->cq, &ep->base);
    exs__soft_cq_unreserve(&ctx->cq, (uint64_t)e->attr.max_send_wr + e->attr.max_recv_wr);
    exs__soft_cm_drop_locked(&ctx->cm_events, e, NULL);
    exs_list_del(&ep->link);
    exs__lite_unlock(&ctx->lock);
    exs__shm_nic_unlock(ctx);
    exs__soft_pool_fini(&ep->wr_pool);
    exs__shm_rq_fini(ep);
    free(ep);
}

enum exs_prov_ep_state exs__shm_ep_state(struct exs_prov_ep *e)
{
    struct shm_ep *ep = shm_ep_of(e);
    int st;

    exs__lite_lock(&ep->ctx->lock);
    st = ep->state;
    exs__lite_unlock(&ep->ctx->lock);
    return (enum exs_prov_ep_state)st;
}

int exs__shm_ep_local_addr(struct exs_prov_ep *e, struct sockaddr_storage *addr, socklen_t *addrlen)
{
    struct shm_ep *ep = shm_ep_of(e);
    int ret = -ENOTCONN;

    exs__lite_lock(&ep->ctx->lock);
    if (ep->local_len) {
        *addr = ep->local;
        *addrlen = ep->local_len;
        ret = 0;
    }
    exs__lite_unlock(&ep->ctx->lock);
    return ret;
}

/* The consumer's request of conn is gone: free it (nic_lock held). */
void exs__shm_req_free(struct shm_conn *conn)
{
    struct shm_req *req = conn->req;

    exs_list_del(&req->link);
    free(req);
    conn->req = NULL;
    conn->lis = NULL;
}

/* ---- connect, accept, reject, disconnect ---- */

static int shm_connect_nic(struct shm_ctx *ctx, struct shm_ep *ep, const struct sockaddr *addr,
                           unsigned port, const void *pd, uint32_t pdlen)
{
    struct sockaddr_un un;
    struct shm_conn *conn;
    int fd, mfd, ret, fds[2];
    void *seg;

    uint32_t r = 0;
    unsigned sport;

    if (!exs__shm_addr_local(addr))
        return -ENETUNREACH;
    /* a port for this end's address (there is no socket port): random, as ephemeral */
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
        r = (uint32_t)exs__now_ns();
    sport = SHM_PORT_LO + r % (SHM_PORT_HI - SHM_PORT_LO + 1);
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (exs__nc_connect(fd, (struct sockaddr *)&un, exs__shm_unix_name(&un, port)) < 0) {
        ret = errno == EAGAIN || errno == ENOENT ? -ECONNREFUSED : -errno;
        exs__nc_close(fd);
        return ret;
    }
    conn = exs__shm_conn_new(ctx, fd, 0);
    if (!conn) {
        exs__nc_close(fd);
        return -ENOMEM;
    }
    conn->state = SHM_CONN_WAIT_REPLY;
    conn->ep = ep;
    ret = exs__shm_conn_peer(conn);
    mfd = ret ? -1 : memfd_create("exs-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (!ret && mfd < 0)
        ret = -errno;
    if (!ret && (ftruncate(mfd, SHM_SEG_BYTES(ctx->ring_bytes)) < 0 ||
                 fcntl(mfd, F_ADD_SEALS, SHM_SEALS) < 0))
        ret = -errno;
    seg = ret ? MAP_FAILED
              : mmap(NULL, SHM_SEG_BYTES(ctx->ring_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, mfd,
                     0);
    if (!ret && seg == MAP_FAILED)
        ret = -errno;
    if (!ret) {
        shm_conn_map(conn, seg, ctx->ring_bytes);
        /* the peer's line too: it starts asleep, so our first writes ring its bell */
        __atomic_store_n(&conn->peer_flag->sleeping, 1, __ATOMIC_RELAXED);
        fds[0] = mfd;
        fds[1] = ctx->bell;
        ret =
            exs__shm_hs_send(fd, SHM_HS_REQ, 0, ctx, ep, pd, pdlen, fds, 2, sport, ctx->ring_bytes);
    }
    if (mfd >= 0)
        exs__nc_close(mfd);
    if (!ret)
        ret = exs__shm_epoll_add(ctx, fd, conn, SHM_TAG_CONN);
    if (ret) {
        conn->ep = NULL;
        exs__shm_conn_detach(conn);
        return ret == -EPIPE || ret == -ECONNRESET ? -ECONNREFUSED : ret;
    }
    exs__lite_lock(&ctx->lock);
    ep->conn = conn;
    ep->state = EXS_PROV_EP_CONNECTING;
    exs__shm_loopback(&ep->local, &ep->local_len, addr->sa_family, sport);
    exs__lite_unlock(&ctx->lock);
    return 0;
}

int exs__shm_connect(struct exs_prov_ep *e, const struct sockaddr *addr, socklen_t addrlen,
                     const void *pd, uint32_t pdlen)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx;
    unsigned port;
    int ret;

    if (!e || pdlen > SHM_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    ret = exs__shm_addr_port(addr, addrlen, &port);
    if (ret)
        return ret;
    ctx = ep->ctx;
    exs__shm_nic_lock(ctx);
    exs__lite_lock(&ctx->lock);
    ret = ep->state == EXS_PROV_EP_IDLE && !ep->conn ? 0 : -EISCONN;
    if (!ret)
        ep->state = EXS_PROV_EP_CONNECTING;
    exs__lite_unlock(&ctx->lock);
    if (!ret) {
        ret = shm_connect_nic(ctx, ep, addr, port, pd, pdlen);
        if (ret) {
            /* the attempt failed at once: UNREACHABLE, as an asynchronous failure */
            EXS_CNT_INC(ctx->cnt.conns_unreachable);
            exs__lite_lock(&ctx->lock);
            ep->state = EXS_PROV_EP_ERROR;
            exs__shm_ep_flush_locked(ep);
            ep->disc_sent = 1;
            exs__lite_unlock(&ctx->lock);
            shm_event_ep(ctx, EXS_PROV_CM_UNREACHABLE, ep, ret, 0, NULL, 0);
            ret = 0;
        }
    }
    exs__shm_nic_unlock(ctx);
    return ret;
}

int exs__shm_accept(struct exs_prov_conn_req *r, struct exs_prov_ep *e, const void *pd,
                    uint32_t pdlen)
{
    struct shm_req *req = (struct shm_req *)r;
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx;
    struct shm_conn *conn;
    uint32_t ring;
    int ret;

    if (!r || !e || pdlen > SHM_PD_MAX || (pdlen && !pd) || e->ctx != r->listener->ctx)
        return -EINVAL;
    ctx = ep->ctx;
    exs__shm_nic_lock(ctx);
    conn = req->conn;
    exs__lite_lock(&ctx->lock);
    ret = ep->state == EXS_PROV_EP_IDLE && !ep->conn ? 0 : -EISCONN;
    exs__lite_unlock(&ctx->lock);
    if (!ret && (conn->broken || conn->fd < 0))
        ret = -ECONNRESET;
    /* the rings: the smaller of the two sides' choices (both powers of two) */
    ring = EXS_MIN(conn->seg_ring, ctx->ring_bytes);
    if (!ret) {
        ret = exs__shm_hs_send(conn->fd, SHM_HS_ACCEPT, 0, ctx, ep, pd, pdlen, &ctx->bell, 1, 0,
                               ring);
        if (ret) {
            conn->broken = 1;
            shm_conn_close_fds(conn);
            ret = -ECONNRESET;
        }
    }
    if (!ret) {
        struct shm_listener *lis = conn->lis;

        exs__shm_req_free(conn);
        shm_conn_rings(conn, ring);
        shm_conn_count_rings(conn);
        conn->ep = ep;
        conn->state = SHM_CONN_UP;
        exs__lite_lock(&ctx->lock);
        ep->conn = conn;
        ep->state = EXS_PROV_EP_CONNECTED;
        ep->local = lis->addr;
        ep->local_len = lis->addrlen;
        exs__lite_unlock(&ctx->lock);
        EXS_CNT_INC(ctx->cnt.conns_established);
        shm_event_ep(ctx, EXS_PROV_CM_ESTABLISHED, ep, 0, 0, NULL, 0);
        exs__shm_ctx_wake(ctx); /* the driver starts watching the new ring */
    }
    exs__shm_nic_unlock(ctx);
    return ret;
}

int exs__shm_reject(struct exs_prov_conn_req *r, const void *pd, uint32_t pdlen)
{
    struct shm_req *req = (struct shm_req *)r;
    struct shm_ctx *ctx;
    struct shm_conn *conn;

    if (!r || pdlen > SHM_PD_MAX || (pdlen && !pd))
        return -EINVAL;
    ctx = shm_ctx_of(r->listener->ctx);
    exs__shm_nic_lock(ctx);
    conn = req->conn;
    if (!conn->broken && conn->fd >= 0) {
        (void)exs__shm_hs_send(conn->fd, SHM_HS_REJECT, 0, ctx, NULL, pd, pdlen, NULL, 0, 0, 0);
        EXS_CNT_INC(ctx->cnt.conns_rejected);
    }
    exs__shm_req_free(conn);
    exs__shm_conn_detach(conn);
    exs__shm_nic_unlock(ctx);
    return 0;
}

int exs__shm_disconnect(struct exs_prov_ep *e)
{
    struct shm_ep *ep = shm_ep_of(e);
    struct shm_ctx *ctx;
    struct shm_conn *conn;
    int ret = 0;

    if (!e)
        return -EINVAL;
    ctx = ep->ctx;
    exs__shm_nic_lock(ctx);
    conn = ep->conn;
    if (conn && conn->state == SHM_CONN_UP) {
        exs__shm_conn_end(conn, 0, 0, 1);
    } else if (conn) {
        exs__shm_conn_detach(conn); /* still connecting: give up */
        shm_ep_fail(ep, 0, 0, 1);
    } else {
        exs__lite_lock(&ctx->lock);
        ret = ep->state == EXS_PROV_EP_ERROR ? 0 : -EINVAL;
        exs__lite_unlock(&ctx->lock);
    }
    exs__shm_nic_unlock(ctx);
    return ret;
}
