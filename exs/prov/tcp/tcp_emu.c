/* SPDX-License-Identifier: MIT */
/* Link emulation: per-direction one-way delay and bandwidth pacing of outgoing frames. */
#include "exs/prov/tcp/tcp.h"
#include "exs/util/counters.h"
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
