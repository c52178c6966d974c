/* SPDX-License-Identifier: MIT */
/* Link emulation: per-direction one-way delay, bandwidth pacing and a link that stops delivering.
 */
#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

/*
 * Model, per connection and direction, on the transmit side:
 *   delay  a frame enqueued at t may start leaving at t + delay;
 *   rate   bytes leave no faster than the rate: writing n bytes moves the link
 *          clock by n * 8 / rate, and nothing is written while the link clock
 *          is ahead of now (the link never banks more than 1 ms of idle time,
 *          and one write is at most 1 ms of bytes, 16 KiB at least).
 * Frames of one connection leave in order (it is one byte stream), so a held
 * frame holds the ones behind it; other connections and the receive path are
 * unaffected (the NIC thread sleeps on the timerfd, never in a call).
 */

#define TCP_EMU_SLACK_NS 1000000u

int exs__tcp_emu_on(const struct tcp_ctx *ctx)
{
    return ctx->emu_delay_ns != 0 || ctx->emu_rate_mbps != 0;
}

void exs__tcp_emu_stamp(struct tcp_conn *conn, struct tcp_txf *txf, uint64_t enq_ns)
{
    txf->ready_ns = enq_ns + conn->ctx->emu_delay_ns;
}

/* 0 when txf's delay has passed, else the time it does. */
uint64_t exs__tcp_emu_ready(struct tcp_conn *conn, struct tcp_txf *txf, uint64_t now)
{
    if (txf->ready_ns <= now)
        return 0;
    EXS_CNT_INC(conn->ctx->cnt.emu_holds);
    return txf->ready_ns;
}

/* Bytes that may be written now; 0 with *until_p = when more may. */
uint64_t exs__tcp_emu_budget(struct tcp_conn *conn, uint64_t now, uint64_t *until_p)
{
    uint64_t rate = conn->ctx->emu_rate_mbps;

    if (!rate)
        return UINT64_MAX;
    if (conn->emu_next_ns > now) {
        *until_p = conn->emu_next_ns;
        return 0;
    }
    return EXS_MAX(16384u, rate * 125u); /* 1 ms of bytes */
}

/* n bytes were written at now. */
void exs__tcp_emu_sent(struct tcp_conn *conn, uint64_t n, uint64_t now)
{
    uint64_t rate = conn->ctx->emu_rate_mbps;
    uint64_t base = conn->emu_next_ns;

    if (!rate)
        return;
    if (base + TCP_EMU_SLACK_NS < now)
        base = now - TCP_EMU_SLACK_NS;
    conn->emu_next_ns = base + n * 8000u / rate;
}

/*
 * Blackhole (EXS_EMU_BLACKHOLE, online): the emulated link silently stops delivering,
 * as an RDMA fabric does when a cable, a switch or the peer's host dies: no reset, no
 * error, nothing. While it is set, established (UP) and lingering connections of every
 * context of the process neither write nor read a byte: frames stay queued, the
 * peer's bytes stay in the kernel's socket buffer, epoll stops watching the socket (so
 * the NIC does not spin) and the TCP socket stays open, so neither side sees an end
 * of file. Clearing it lets the next turn that touches the connection resume it.
 * Connections being set up are not affected. Test seam for keepalive (spec/protocol.md §9).
 */
int exs__tcp_emu_blackholed(const struct tcp_conn *conn)
{
    return (conn->state == TCP_CONN_UP || conn->state == TCP_CONN_LINGER) &&
           __atomic_load_n(&exs__params.emu_blackhole, __ATOMIC_RELAXED);
}
