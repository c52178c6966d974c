/* SPDX-License-Identifier: MIT */
/* The fields of a stat row that come from EXS_SO_STATS, with their kind and meaning: one
 * table for the control endpoint (exs/ctl/ctl_reply.c) and exsctl metrics. */
#ifndef EXS_CTL_CTL_FIELDS_H
#define EXS_CTL_CTL_FIELDS_H

/* Every field of EXS_SO_STATS (struct exs_sock_stats, in its order), as exsctl stat shows
 * it (ctl_reply.c) and exsctl metrics exports it: X(name, kind, help), kind 'c' a counter
 * (only grows), 'g' a gauge that adds up over sockets, 'v' one that does not. A field
 * appended to the struct is appended here (a static assertion in ctl_reply.c fails
 * otherwise). */
#define EXS_CTL_STAT_FIELDS(X)                                                                     \
    X(bytes_sent, 'c', "bytes sent (payload)")                                                     \
    X(bytes_received, 'c', "bytes received (payload)")                                             \
    X(direct_xfers, 'c', "transfers written straight into an advertised user buffer")              \
    X(indirect_xfers, 'c', "transfers written into the hidden receive ring")                       \
    X(mode_switches, 'c', "direct/indirect phase changes seen by the sender")                      \
    X(adverts_sent, 'c', "ADVERTs of receive buffers sent")                                        \
    X(adverts_received, 'c', "ADVERTs of the peer's receive buffers received")                     \
    X(adverts_discarded, 'c', "stale ADVERTs dropped by the sender")                               \
    X(credit_stalls, 'c', "sends that waited for credits")                                         \
    X(keepalive_probes, 'c', "keepalive probes sent")                                              \
    X(batches_sent, 'c', "ring writes that carried several sends")                                 \
    X(msgs_batched, 'c', "sends that left inside a batch")                                         \
    X(batch_thresh, 'v', "the elastic batch threshold now, bytes (0: batching off)")               \
    X(direct_time_us, 'c', "time the sender spent in direct phases, microseconds")                 \
    X(indirect_time_us, 'c', "time the sender spent in indirect phases, microseconds")             \
    X(drain_requests, 'c', "return-to-direct requests sent (receiver) and honoured (sender)")      \
    X(ring_resizes, 'c', "receive ring size changes (autotuning)")                                 \
    X(ring_size, 'g', "receive ring size now, bytes")                                              \
    X(ring_fill, 'g', "bytes waiting in the receive ring now")                                     \
    X(rnr_events, 'c', "receiver-not-ready events (must stay 0)")                                  \
    X(fragments, 'c', "work requests that carried part of a larger transfer")                      \
    X(wr_queued, 'c', "work requests that waited behind the per-connection cap")                   \
    X(nops_sent, 'c', "NOPs that broke a full-window deadlock")                                    \
    X(keepalive_timeouts, 'c', "1 once keepalive declared the peer dead")                          \
    X(srtt_us, 'v', "smoothed round-trip time, microseconds (0: not measured yet)")                \
    X(ring_grow_refused, 'c', "ring grows refused by the process's ring budget")                   \
    X(sends_copied, 'c', "STREAM sends copied into the send buffer and completed at once")         \
    X(keepalive_answers, 'c', "keepalive PINGs of the peer answered")

#endif
