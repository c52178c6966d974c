/* SPDX-License-Identifier: MIT */
/* The STREAM ring's autotuning and its switch to a new region (spec/protocol.md §7.4),
 * and the ring at a cut-over (§9.2). Layer 2 of spec/proto-layout.md. */
#include <endian.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/reqtrace.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

enum exs_ring_tune_verdict exs__stream_ring_tune(const struct exs_ring_tune_in *in,
                                                 uint32_t *size_p)
{
    uint32_t max = (uint32_t)EXS_MIN((uint64_t)in->max, (uint64_t)EXS_WIRE_RING_SIZE_MAX);

    max -= max % EXS_RING_SLOT;
    *size_p = in->size;
    /* ring-limited: in one round trip the sender wrote half the ring or more, and the
     * application had a receive waiting for more (it keeps up). When it refilled three
     * quarters or more, the ring limited the whole round trip and how much more the
     * sender has is unknown: grow by EXS_RING_GROW_FAST (slow start), else double. A
     * fast step the budget refuses may still double. */
    if (in->win_bytes * 2 >= in->size && in->reader_waiting && in->size < max) {
        uint64_t f = in->win_bytes * 4 >= (uint64_t)in->size * 3 ? EXS_RING_GROW_FAST : 2;

        for (; f >= 2; f /= 2) {
            uint32_t n = (uint32_t)EXS_MIN((uint64_t)in->size * f, (uint64_t)max);

            if (in->budget && in->in_use + n > in->budget)
                continue;
            *size_p = n;
            return EXS_RING_GROW;
        }
        return EXS_RING_REFUSED;
    }
    if (in->size > in->init && in->idle_limit_us && in->idle_us >= in->idle_limit_us &&
        !in->win_bytes) {
        *size_p = in->init;
        return EXS_RING_SHRINK;
    }
    return EXS_RING_KEEP;
}

/* The retired region goes once every byte written into it was copied out. */
void exs__stream_ring_retire_locked(struct exs_conn *conn)
{
    if (!conn->autotune.old_mem || conn->rd_consumed < conn->autotune.old_end)
        return;
    EXS_TRACE(PROTO, "conn %p: retired ring region of %u bytes freed", (void *)conn,
              conn->autotune.old_size);
    exs__conn_ring_region_free(conn->autotune.old_mem);
    conn->autotune.old_mem = NULL;
    conn->autotune.old_size = 0;
}

/* An offered region goes: its grant, its memory, the offer. */
static void st_ring_offer_drop(struct exs_conn *conn)
{
    if (conn->autotune.next_grant)
        exs__prov_revoke(conn->autotune.next_grant);
    conn->autotune.next_grant = NULL;
    if (conn->autotune.next_mem)
        exs__conn_ring_region_free(conn->autotune.next_mem);
    conn->autotune.next_mem = NULL;
    conn->autotune.offered = 0;
}

void exs__stream_ring_release_locked(struct exs_conn *conn)
{
    st_ring_offer_drop(conn);
    if (conn->autotune.old_mem)
        exs__conn_ring_region_free(conn->autotune.old_mem);
    conn->autotune.old_mem = NULL;
}

/* Copy the unread positions [from, to) of the retired region into the current ring at
 * their own offsets (free there: the caller checked they fit beside the current ring's). */
static void st_ring_merge_old(struct exs_conn *conn, uint64_t from, uint64_t to)
{
    const uint8_t *old = conn->autotune.old_mem->addr;

    for (uint64_t pos = from, n; pos < to; pos += n) {
        uint32_t src = (uint32_t)(pos % conn->autotune.old_size);
        uint32_t dst = (uint32_t)(pos % conn->p.ring_size);

        n = EXS_MIN(to - pos,
                    (uint64_t)EXS_MIN(conn->autotune.old_size - src, conn->p.ring_size - dst));
        memcpy(conn->ring + dst, old + src, (size_t)n);
    }
}

int exs__stream_ring_cut_locked(struct exs_conn *conn)
{
    uint64_t unread = conn->rd_arrived - conn->rd_consumed;
    int both = conn->autotune.old_mem && conn->rd_arrived > conn->autotune.old_end;
    uint32_t size = conn->p.ring_size;
    int fits;

    /* Every arrival was checked against the ring it went into (the overrun check), and
     * what is unread only shrinks: the unread bytes fit the region of the last arrival,
     * the current ring when it holds some, else the retired one. */
    if (both || !conn->autotune.old_mem)
        fits = unread <= conn->p.ring_size;
    else
        fits = unread <= conn->autotune.old_size && conn->rd_consumed < conn->autotune.old_end;
    if (!fits)
        return exs__proto_violation(
            conn, EXS_PV_RING_OVERRUN, EXS_PV_REC_NONE,
            "at the cut: %llu unread, ring %u, retired %u up to %llu", (unsigned long long)unread,
            conn->p.ring_size, conn->autotune.old_size, (unsigned long long)conn->autotune.old_end);
    if (conn->autotune.offered || conn->autotune.owed || conn->autotune.old_mem || unread)
        EXS_INFO(PROTO, "conn %p: ring at the cut: %s%s%s%llu bytes unread (ring %u bytes%s)",
                 (void *)conn, conn->autotune.offered ? "offer dropped, " : "",
                 conn->autotune.owed ? "answer owed dropped, " : "",
                 both ? "two regions merged, " : "", (unsigned long long)unread, conn->p.ring_size,
                 conn->autotune.old_mem ? ", a retired region" : "");
    /* an offer out dies with the old path (its grant went with the others); the writer
     * drops an answer it owes: the new path's hello and RING grant the ring anew */
    st_ring_offer_drop(conn);
    conn->autotune.owed = 0;
    if (both) {
        /* the retired region and the current ring both hold unread bytes: the retired
         * region's go into the current ring at their own offsets, free there since the
         * whole unread span fits the current ring; one retired region is left */
        st_ring_merge_old(conn, conn->rd_consumed, conn->autotune.old_end);
        exs__conn_ring_region_free(conn->autotune.old_mem);
        conn->autotune.old_mem = NULL;
    }
    if (unread && !conn->autotune.old_mem) { /* the current ring is retired (§7.4) */
        conn->autotune.old_mem = conn->ring_mem;
        conn->autotune.old_size = conn->p.ring_size;
        conn->autotune.old_end = conn->rd_arrived;
    } else {
        exs__conn_ring_region_free(conn->ring_mem);
    }
    conn->ring_mem = NULL;
    conn->ring = NULL;
    /* the new path's ring has the current size, or the retired region's when more is
     * unread than that (a shrink switched, its old region not yet read): the writer then
     * counts the unread bytes against a ring they fit (§9.2) */
    if (unread > size)
        size = conn->autotune.old_size;
    conn->p.ring_size = size;
    /* autotuning measures the new path afresh: its round trip and its windows */
    conn->autotune.win_t0 = conn->autotune.win_bytes = 0;
    conn->autotune.rtt_min = conn->autotune.rtt_min_t = 0;
    return 0;
}

int exs__stream_ring_offer_locked(struct exs_conn *conn, uint32_t size, int budget)
{
    int ret;

    if (!conn->dp->ring_resize || !(conn->peer.features & EXS_WIRE_FEAT_RESIZE))
        return -EOPNOTSUPP;
    if (conn->state != EXS_CONN_CONNECTED || conn->peer_shut)
        return -ENOTCONN;
    if (conn->resume.peer_wait)
        return -EAGAIN; /* a new path: nothing but RING and RESUME before the peer's RESUME */
    if (conn->autotune.offered || conn->autotune.old_mem)
        return -EBUSY;
    if (size < EXS_WIRE_RESIZE_MIN || size % EXS_RING_SLOT || size > EXS_WIRE_RING_SIZE_MAX)
        return -EINVAL;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_RESIZE_LEN) &&
        !exs__conn_ctrl_flush_locked(conn))
        return -EAGAIN;
    if (!exs__conn_ctrl_room_locked(conn, EXS_WIRE_RESIZE_LEN))
        return -EAGAIN;
    ret = exs__conn_ring_region_locked(conn, size, budget, &conn->autotune.next_mem,
                                       &conn->autotune.next_grant);
    if (ret) {
        conn->autotune.next_mem = NULL;
        conn->autotune.next_grant = NULL;
        return ret;
    }
    struct exs_wire_resize r = {
        .hdr = {.type = EXS_CTRL_RESIZE, .len = htobe16(EXS_WIRE_RESIZE_LEN)},
        .addr = htobe64((uintptr_t)conn->autotune.next_mem->addr),
        .size = htobe32(size),
        .rkey = htobe32(conn->autotune.next_grant->rkey),
    };
    exs__conn_ctrl_append_locked(conn, &r, sizeof(r));
    conn->autotune.offered = 1;
    conn->autotune.next_size = size;
    EXS_TRACE(PROTO, "conn %p: ring %u -> %u bytes offered", (void *)conn, conn->p.ring_size, size);
    exs__conn_ctrl_flush_locked(conn);
    return 0;
}

/* The largest piece of a ring write (§6.2, §7.4): EXS_FRAG_SIZE, but once autotuning grew
 * the peer's ring, never so small that the peer's credits cannot cover it: every piece
 * spends a credit and credits come back a round trip later, so with pieces of frag_size
 * at most credits x frag_size ring bytes move per round trip however large the ring grew
 * (64 x 64 KiB = 4 MiB: 0.7 Gbit/s over 48 ms). A quarter of the credits then fill the
 * whole ring. */
uint32_t exs__stream_ring_piece_max(const struct exs_conn *conn)
{
    uint32_t frag = exs__conn_frag_size(), quarter = EXS_MAX(conn->peer.credits / 4u, 1u);
    uint32_t piece;

    if (!conn->autotune.peer_init || conn->peer.ring_size <= conn->autotune.peer_init)
        return frag;
    piece = conn->peer.ring_size / quarter;
    piece -= piece % EXS_RING_SLOT;
    return EXS_MAX(frag, piece);
}

/* May this conn's ring be tuned now (and is anything to measure)? */
static int st_ring_tunable(const struct exs_conn *conn)
{
    return conn->p.autotune && conn->state == EXS_CONN_CONNECTED && !conn->peer_shut &&
           !conn->resume.peer_wait && (conn->peer.features & EXS_WIRE_FEAT_RESIZE);
}

void exs__stream_ring_tune_locked(struct exs_conn *conn)
{
    struct exs_ring_tune_in in;
    enum exs_ring_tune_verdict v;
    uint64_t now, rtt, win;
    uint32_t size;

    if (!st_ring_tunable(conn))
        return;
    if (!conn->autotune.win_bytes) {
        if (conn->p.ring_size > conn->ring_init) /* grown: idle long enough to shrink? */
            (void)exs__stream_ring_timer_locked(conn, exs__now_us());
        return;
    }
    now = exs__now_us();
    conn->autotune.last_us = now;
    if (!conn->autotune.win_t0) {
        conn->autotune.win_t0 = now;
        return;
    }
    rtt = conn->autotune.rtt_min;
    if (!rtt)
        return;
    if (now - conn->autotune.win_t0 < rtt) {
        /* a window lasts at least the path's round trip, unless three quarters of the
         * ring arrived in less: the sender refilled it faster than a round trip, it is
         * ring-limited whatever the rest of the window brings (decided now, not a round
         * trip later; the window goes on while a change is under way) */
        if (conn->autotune.offered || conn->autotune.old_mem ||
            conn->autotune.win_bytes * 4 < (uint64_t)conn->p.ring_size * 3)
            return;
        win = conn->autotune.win_bytes;
    } else {
        /* the bytes the sender moved per minimum round trip, at the rate the window saw:
         * on a busy machine the smoothed round trip and the calls here come late, and
         * counting a longer window's bytes against the ring would grow it where it never
         * limited */
        win = (uint64_t)((double)conn->autotune.win_bytes * (double)rtt /
                         (double)(now - conn->autotune.win_t0));
    }
    in = (struct exs_ring_tune_in){
        .size = conn->p.ring_size,
        .init = conn->ring_init,
        .max = (uint32_t)EXS_MIN(__atomic_load_n(&exs__params.ring_max, __ATOMIC_RELAXED),
                                 (uint64_t)EXS_WIRE_RING_SIZE_MAX),
        .budget = __atomic_load_n(&exs__params.ring_budget, __ATOMIC_RELAXED),
        .in_use = exs__conn_ring_bytes(),
        .win_bytes = win,
        .reader_waiting = exs__stream_head_recv(conn) && conn->rd_arrived == conn->rd_consumed,
    };
    conn->autotune.win_t0 = now;
    conn->autotune.win_bytes = 0;
    if (conn->autotune.offered || conn->autotune.old_mem)
        return; /* one change at a time */
    v = exs__stream_ring_tune(&in, &size);
    if (v == EXS_RING_REFUSED) {
        conn->stats.ring_grow_refused++;
        return;
    }
    if (v == EXS_RING_GROW) {
        int ret = exs__stream_ring_offer_locked(conn, size, 1);

        if (ret == -ENOBUFS)
            conn->stats.ring_grow_refused++;
        else if (ret && ret != -EAGAIN)
            EXS_INFO(PROTO, "conn %p: ring grow to %u bytes: %s", (void *)conn, size,
                     strerror(-ret));
    }
}

uint64_t exs__stream_ring_timer_locked(struct exs_conn *conn, uint64_t now_us)
{
    uint64_t idle_ms = __atomic_load_n(&exs__params.ring_idle_ms, __ATOMIC_RELAXED);
    struct exs_ring_tune_in in;
    uint32_t size;
    uint64_t due;

    if (!idle_ms || !st_ring_tunable(conn))
        return 0;
    /* At its initial size the ring cannot shrink, but it may grow before the next check
     * (nothing re-arms the owner's timer when it does): looking every EXS_RING_IDLE_MS
     * bounds how late a grown ring's idle shrink can come to one more period. */
    if (conn->p.ring_size <= conn->ring_init)
        return idle_ms;
    if (conn->autotune.offered || conn->autotune.old_mem)
        return idle_ms; /* look again once the change in progress is done */
    in = (struct exs_ring_tune_in){
        .size = conn->p.ring_size,
        .init = conn->ring_init,
        .max = conn->p.ring_size,
        .win_bytes = conn->autotune.win_bytes,
        .idle_us = now_us > conn->autotune.last_us ? now_us - conn->autotune.last_us : 0,
        .idle_limit_us = idle_ms * 1000u,
    };
    if (exs__stream_ring_tune(&in, &size) == EXS_RING_SHRINK) {
        int ret = exs__stream_ring_offer_locked(conn, size, 0);

        if (!ret)
            return idle_ms;
        if (ret != -EAGAIN)
            EXS_INFO(PROTO, "conn %p: ring shrink to %u bytes: %s", (void *)conn, size,
                     strerror(-ret));
        return idle_ms;
    }
    due = conn->autotune.last_us + idle_ms * 1000u;
    return due > now_us ? (due - now_us + 999u) / 1000u : 1;
}

/* The owner's side of a RESIZE answer, or the writer's side of an offer (§7.4). */
int exs__stream_on_resize_locked(struct exs_conn *conn, const struct exs_wire_resize *r)
{
    uint64_t addr = be64toh(r->addr), pos = be64toh(r->pos);
    uint32_t size = be32toh(r->size), rkey = be32toh(r->rkey);

    if (r->hdr.flags & ~EXS_RESIZE_SWITCHED)
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_RESIZE, "flags %#x",
                                    r->hdr.flags);
    if (r->hdr.flags & EXS_RESIZE_SWITCHED) {
        /* our offer's answer: every ring write before it arrived already (receive
         * completions come in posting order), so it must name exactly rd_arrived */
        if (!conn->autotune.offered || size != conn->autotune.next_size ||
            pos != conn->rd_arrived || addr || rkey)
            return exs__proto_violation(conn, EXS_PV_RESIZE, EXS_CTRL_RESIZE,
                                        "SWITCHED to %u bytes at %llu answers no offer (offered "
                                        "%d, %u bytes, %llu arrived)",
                                        size, (unsigned long long)pos, conn->autotune.offered,
                                        conn->autotune.next_size,
                                        (unsigned long long)conn->rd_arrived);
        /* the old region's key ends now: nothing more may be written there */
        if (conn->ring_grant)
            exs__prov_revoke(conn->ring_grant);
        conn->ring_grant = conn->autotune.next_grant;
        conn->autotune.old_mem = conn->ring_mem;
        conn->autotune.old_size = conn->p.ring_size;
        conn->autotune.old_end = pos;
        conn->ring_mem = conn->autotune.next_mem;
        conn->ring = conn->ring_mem->addr;
        conn->p.ring_size = size;
        conn->autotune.next_mem = NULL;
        conn->autotune.next_grant = NULL;
        conn->autotune.offered = 0;
        conn->stats.ring_resizes++;
        /* a new window: every byte from here on was written against the new room */
        conn->autotune.win_t0 = exs__now_us();
        conn->autotune.win_bytes = 0;
        EXS_DBG(PROTO, "conn %p: ring %u -> %u bytes from ring position %llu", (void *)conn,
                conn->autotune.old_size, size, (unsigned long long)pos);
        exs__stream_ring_retire_locked(conn);
        return 0;
    }
    /* an offer: one at a time, a region the protocol can use (the key is checked by the
     * provider at each write) */
    if (conn->autotune.owed || pos || !addr || addr % EXS_RING_SLOT || addr + size < addr ||
        size < EXS_WIRE_RESIZE_MIN || size % EXS_RING_SLOT || size > EXS_WIRE_RING_SIZE_MAX)
        return exs__proto_violation(
            conn, EXS_PV_RESIZE, EXS_CTRL_RESIZE, "offer of %u bytes at %#llx, pos %llu, owed %d",
            size, (unsigned long long)addr, (unsigned long long)pos, conn->autotune.owed);
    conn->autotune.owed = 1;
    conn->autotune.peer_addr = addr;
    conn->autotune.peer_size = size;
    conn->autotune.peer_rkey = rkey;
    return 0;
}
