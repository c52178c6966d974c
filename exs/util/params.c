/* SPDX-License-Identifier: MIT */
/* The tunables table: defaults, EXS_* variables, validation, run-time changes and printing. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/parse.h"
#include "exs/util/util.h"

struct exs_params exs__params;

#define PARAM(_name, _env, _def, _type, _online, _help)                                            \
    {                                                                                              \
#_name, _env, _def, _help, EXS_PARAM_##_type, _online, offsetof(struct exs_params, _name)  \
    }

/* One row per field of struct exs_params, in field order. */
static const struct exs_param_def params_table[] = {
    PARAM(log_level, "EXS_LOG_LEVEL", "warn", STRING, 1,
          "log level: none err warn info dbg trace data, or 0-6"),
    PARAM(log_subsys, "EXS_LOG_SUBSYS", "all", STRING, 1,
          "subsystems to log, comma list of api eng proto prov cache util, or all"),
    PARAM(provider, "EXS_PROVIDER", "", STRING, 0,
          "provider: tcp, verbs, shm, fault:tcp, fault:verbs or fault:shm; empty = verbs when an "
          "active RDMA device exists, else tcp"),
    PARAM(emu_delay_us, "EXS_EMU_DELAY_US", "0", UINT, 0,
          "tcp link emulation: one-way delay added per direction, microseconds"),
    PARAM(emu_rate_mbps, "EXS_EMU_RATE_MBPS", "0", UINT, 0,
          "tcp link emulation: bandwidth cap per direction, Mbit/s, 0 = none"),
    PARAM(tcp_rnr_retry, "EXS_TCP_RNR_RETRY", "7", UINT, 0,
          "tcp: receiver-not-ready retries, 0-7, 7 = forever"),
    PARAM(tcp_rnr_timer_ms, "EXS_TCP_RNR_TIMER_MS", "1", UINT, 0,
          "tcp: pause between receiver-not-ready retries, milliseconds"),
    PARAM(tcp_max_inline, "EXS_TCP_MAX_INLINE", "256", UINT, 0, "tcp: largest inline send, bytes"),
    PARAM(tcp_max_sge, "EXS_TCP_MAX_SGE", "16", UINT, 0,
          "tcp: largest scatter/gather list of one work request"),
    PARAM(tcp_max_wr, "EXS_TCP_MAX_WR", "4096", UINT, 0,
          "tcp: largest send or receive queue depth"),
    PARAM(tcp_cq_size, "EXS_TCP_CQ_SIZE", "65536", UINT, 0,
          "tcp: initial completion queue size of a context (grows as endpoints reserve theirs, up "
          "to 4194304)"),
    PARAM(tcp_max_msg, "EXS_TCP_MAX_MSG", "1073741824", UINT, 0,
          "tcp: largest work request, bytes"),
    PARAM(tcp_ctrl_max, "EXS_TCP_CTRL_MAX", "64", UINT, 0,
          "tcp provider: responder frames (ACK, NAK, READ response) queued on a connection before "
          "it stops reading (back-pressure on a requester that does not read); 1 makes every READ "
          "request pause reading (tests)"),
    PARAM(tcp_hello_ms, "EXS_TCP_HELLO_MS", "5000", UINT, 1,
          "tcp provider: a socket accepted by a listener that has not sent a complete connection "
          "request (the provider's hello) this long after the accept is reset (not an exs peer), "
          "milliseconds, 1-3600000; bytes that cannot begin one reset it at once; also the shm "
          "provider's deadline for an accepted rendezvous socket's request"),
    PARAM(tcp_hello_max, "EXS_TCP_HELLO_MAX", "1024", UINT, 1,
          "tcp provider: accepted sockets a listener keeps waiting for their connection request, "
          "1-1048576; at the bound the oldest silent one is reset once it waited a tenth of "
          "EXS_TCP_HELLO_MS, else accepting pauses"),
    PARAM(credits, "EXS_CREDITS", "64", UINT, 0,
          "receives pre-posted per connection, the send credits granted to the peer, 3-4095"),
    PARAM(ring_size, "EXS_RING_SIZE", "1048576", UINT, 0,
          "default SO_RCVBUF: bytes of each connection's hidden receive ring, multiple of 64"),
    PARAM(eager_max, "EXS_EAGER_MAX", "8192", UINT, 0,
          "SOCK_SEQPACKET messages shorter than this go eagerly into the peer's ring"),
    PARAM(max_reads, "EXS_MAX_READS", "16", UINT, 0,
          "RDMA READs in flight per connection (SEQPACKET rendezvous), at least 1"),
    PARAM(sock_max_ops, "EXS_SOCK_MAX_OPS", "1024", UINT, 0,
          "outstanding operations per socket and direction before EAGAIN, at least 1"),
    PARAM(xfer_mode, "EXS_XFER_MODE", "dynamic", STRING, 0,
          "default EXS_SO_XFER_MODE: dynamic, direct or indirect"),
    PARAM(qspin_us, "EXS_QSPIN_US", "50", UINT, 1,
          "event queues in EXS_WAIT_ADAPTIVE mode spin this long before sleeping, microseconds"),
    PARAM(qwait_spin_us, "EXS_QWAIT_SPIN_US", "10", UINT, 1,
          "how a new event queue waits until exs_qsetwait: EXS_WAIT_ADAPTIVE with this spin, "
          "microseconds (as rsockets' blocking calls spin 10 us before they sleep), 0-1000000; "
          "0 = EXS_WAIT_NOTIFY (sleep at once)"),
    PARAM(qwait_spin_max_us, "EXS_QWAIT_SPIN_MAX_US", "100", UINT, 1,
          "how far such a queue's spin may grow: up to twice its recent waits' time to their "
          "events, while those are short (spec/api.md, \"Wait modes\"), microseconds, "
          "0-1000000; at or below EXS_QWAIT_SPIN_US the spin stays fixed"),
    PARAM(close_timeout_ms, "EXS_CLOSE_TIMEOUT_MS", "5000", UINT, 1,
          "exs_close resets a connection whose goodbye is not through after this, milliseconds"),
    PARAM(test_close_pause_us, "EXS_TEST_CLOSE_PAUSE_US", "0", UINT, 0,
          "tests only: exs_close pauses this long once the socket is CLOSING, microseconds"),
    PARAM(lease_us, "EXS_LEASE_US", "1000", UINT, 0,
          "while application threads drive progress, the progress thread checks this often whether "
          "they all left, microseconds, 10-1000000"),
    PARAM(test_shm_pid, "EXS_TEST_SHM_PID", "0", UINT, 0,
          "test seam: the process id this process claims in its SHM_OFFER records (a lying "
          "peer, spec/provider-shm.md); 0 = its own"),
    PARAM(test_engine_park, "EXS_TEST_ENGINE_PARK", "0", UINT, 0,
          "tests only: 1 = the progress thread never drives the provider nor runs kernel-socket "
          "queues (only jobs and timers), 0-1"),
    PARAM(vrb_qp_timeout, "EXS_VRB_QP_TIMEOUT", "0", UINT, 0,
          "verbs: QP local ACK timeout exponent (4.096 us * 2^n per try), 1-31; 0 = the one "
          "rdma_cm computes for the path, at most 16 (268 ms; 14 when it gives none)"),
    PARAM(vrb_retry_cnt, "EXS_VRB_RETRY_CNT", "7", UINT, 0, "verbs: QP transport retry count, 0-7"),
    PARAM(vrb_rnr_retry, "EXS_VRB_RNR_RETRY", "7", UINT, 0,
          "verbs: receiver-not-ready retries, caps every ep's rnr_retry, 0-7, 7 = forever"),
    PARAM(vrb_fork_safe, "EXS_VRB_FORK_SAFE", "no", BOOL, 0,
          "verbs: call ibv_fork_init() so registered memory survives fork()"),
    PARAM(vrb_mcache_guard, "EXS_VRB_MCACHE_GUARD", "yes", BOOL, 0,
          "verbs: PROT_NONE guard pages around each memory cache region"),
    PARAM(vrb_cq_size, "EXS_VRB_CQ_SIZE", "4096", UINT, 0,
          "verbs: completion queue capacity of a context (grown as eps are added)"),
    PARAM(vrb_max_inline, "EXS_VRB_MAX_INLINE", "256", UINT, 0,
          "verbs: inline send size asked of the device, bytes"),
    PARAM(vrb_qp_cache, "EXS_VRB_QP_CACHE", "16", UINT, 0,
          "verbs: closed connections' queue pairs kept (in RESET) for reuse per context, 0 = off"),
    PARAM(vrb_mem_alloc, "EXS_VRB_MEM_ALLOC", "anon", STRING, 0,
          "verbs: memory cache backing: anon, huge (falls back to anon) or malloc"),
    PARAM(vrb_mcache_region, "EXS_VRB_MCACHE_REGION", "4194304", UINT, 0,
          "verbs: bytes per memory cache region (rounded up to pages)"),
    PARAM(vrb_mcache_idle_ms, "EXS_VRB_MCACHE_IDLE_MS", "10000", UINT, 0,
          "verbs: memory cache regions idle this long are released, milliseconds"),
    PARAM(vrb_regcache_max, "EXS_VRB_REGCACHE_MAX", "256", UINT, 0,
          "verbs: user-buffer registrations kept by the registration cache (LRU); 0 = off"),
    PARAM(vrb_device, "EXS_VRB_DEVICE", "", STRING, 0,
          "verbs: device to use, NAME or NAME:PORT (e.g. mlx5_0:1); empty = first active port"),
    PARAM(vrb_addr, "EXS_VRB_ADDR", "", STRING, 0,
          "verbs: use the device and port that hold this IP address (RoCE/IPoIB)"),
    PARAM(batch_max, "EXS_BATCH_MAX", "8192", UINT, 0,
          "largest ring write gathering several small sends while another is in flight, bytes, at "
          "most 1048576; 0 = no batching"),
    PARAM(sndbuf, "EXS_SNDBUF", "262144", UINT, 0,
          "SOCK_STREAM send buffer per connection (default of SO_SNDBUF), bytes, 0 or "
          "4096..67108864: sends of at most EXS_STREAM_COPY_MAX bytes are copied into it and "
          "complete at once, like a kernel socket's send(); 0 = every send is zero-copy and "
          "completes when its bytes reached the peer"),
    PARAM(stream_copy_max, "EXS_STREAM_COPY_MAX", "8192", UINT, 0,
          "SOCK_STREAM: largest send copied into the send buffer (EXS_SNDBUF); larger sends are "
          "zero-copy; 0 = none"),

    /* -- adaptive stream algorithm and ring autotuning (issue 12) -- */
    PARAM(stream_direct_min, "EXS_STREAM_DIRECT_MIN", "32768", UINT, 0,
          "SOCK_STREAM, dynamic mode: receives with fewer bytes left than this stay indirect: the "
          "receiver advertises only bigger ones (except the first after a drain, or to a "
          "direct-only sender) and asks the sender back to direct (DRAIN) only for them; 0 = "
          "advertise every receive (the published algorithm)"),
    PARAM(
        stream_drain_streak, "EXS_STREAM_DRAIN_STREAK", "2", UINT, 0,
        "SOCK_STREAM: ring arrivals in a row that must leave such receives waiting with the ring "
        "empty before the receiver sends DRAIN (hysteresis); 0 = never (the published algorithm)"),
    PARAM(ring_max, "EXS_RING_MAX", "67108864", UINT, 0,
          "SOCK_STREAM ring autotuning: a receiver whose sender is ring-limited grows its ring "
          "(2x, 4x when it filled in a round trip) up to this many bytes (at most 1073741824); at "
          "or below the initial ring (EXS_RING_SIZE, SO_RCVBUF) = off; an explicit SO_RCVBUF turns "
          "it off for that socket"),
    PARAM(ring_budget, "EXS_RING_BUDGET", "1073741824", UINT, 0,
          "SOCK_STREAM ring autotuning: bytes of every receive ring of the process together that a "
          "grow may reach; a grow past it is refused (initial rings are not held to it, only to "
          "EXS_MEM_BUDGET); 0 = no bound"),
    PARAM(
        mem_budget, "EXS_MEM_BUDGET", "auto", UINT, 1,
        "bytes every connection of the process together may hold for its peer (rings, send "
        "buffers, control slots, batch staging, pending messages, ADVERTs, resume state): past "
        "it new connections are refused (ENOBUFS; a listener rejects with reason RESOURCES), ring "
        "grows and send buffers are refused, a peer's message that needs more ends its "
        "connection; auto = a quarter of physical memory; 0 = no bound"),
    PARAM(ring_idle_ms, "EXS_RING_IDLE_MS", "1000", UINT, 0,
          "SOCK_STREAM ring autotuning: a grown ring that received nothing for this long shrinks "
          "back to its initial size, milliseconds; 0 = never"),
    PARAM(stream_direct_linger, "EXS_STREAM_DIRECT_LINGER", "1", UINT, 0,
          "SOCK_STREAM, dynamic mode: 1 = a sender in a direct phase that has no ADVERT left, and "
          "no more sends waiting than sends in flight, writes the ring only once none of its "
          "writes is in flight (an ADVERT usually comes meanwhile: fewer switches); 0 = at once "
          "(the published algorithm)"),

    /* -- keepalive, deadlines, seq-ack window, fragmentation (issue 13) -- */
    PARAM(keepalive_intv_ms, "EXS_KEEPALIVE_INTV_MS", "1000", UINT, 1,
          "keepalive: a connection silent this long is probed (a PING the peer's library "
          "answers; a zero-byte RDMA WRITE to an older peer), "
          "milliseconds, at most 3600000, 0 = off; per socket SO_KEEPALIVE, EXS_SO_KEEPALIVE_MS"),
    PARAM(keepalive_probes, "EXS_KEEPALIVE_PROBES", "3", UINT, 1,
          "keepalive: probes unanswered for an interval each before the peer is dead (ETIMEDOUT), "
          "1-100"),
    PARAM(connect_timeout_ms, "EXS_CONNECT_TIMEOUT_MS", "30000", UINT, 1,
          "exs_connect and the accept handshake fail with ETIMEDOUT after this, milliseconds, "
          "1-3600000"),
    PARAM(send_timeout_ms, "EXS_SEND_TIMEOUT_MS", "120000", UINT, 1,
          "a connection whose queued sends made no progress this long (the peer returns no credits "
          "or ring space) is reset with ETIMEDOUT, milliseconds, at most 3600000, 0 = off"),
    PARAM(emu_blackhole, "EXS_EMU_BLACKHOLE", "0", UINT, 1,
          "tests: 1 = the tcp provider's link silently stops delivering: established connections' "
          "frames are neither written nor read, sockets stay open, 0-1"),
    PARAM(ack_every, "EXS_ACK_EVERY", "0", UINT, 1,
          "credits a receiver owes before it returns them in a standalone ACK when nothing else "
          "goes out, 2-4095, capped at EXS_CREDITS - 1; 0 = half of EXS_CREDITS (at least 2)"),
    PARAM(window_test, "EXS_WINDOW_TEST", "0", UINT, 1,
          "tests only, never in production: bits that break the credit window on purpose so a test "
          "can show the NOP is what unblocks it: 1 = no NOP, 2 = owed credits return in no "
          "standalone ACK and no data write, 4 = data never spends the last credit; 0-7"),
    PARAM(frag_size, "EXS_FRAG_SIZE", "65536", UINT, 1,
          "largest RDMA write or read of one transfer, bytes, 4096-1073741824: a larger SEQPACKET "
          "message into an advertised receive or read from an announced one, or STREAM bytes into "
          "the ring or a MSG_WAITALL receive, moves as several so control records of the "
          "connection go between them"),
    PARAM(wr_max, "EXS_WR_MAX", "128", UINT, 1,
          "send work requests (writes, control sends, reads, probes) outstanding per connection, "
          "1-65536; more wait in order in the connection's queue and go as completions make room"),
    PARAM(send_unsignaled, "EXS_SEND_UNSIGNALED", "1", UINT, 1,
          "1 = a small send copied whole into its work request (inline) leaves unsignaled and its "
          "event is queued at once, like a kernel send() (lost if the connection fails right "
          "after, the failure reported, unless it can be cut over: then a copy is kept until "
          "the peer has it and sent again), when an answer came since, no earlier send of the "
          "socket is unfinished and it is not a zero-copy STREAM send (spec/protocol.md 6.4); "
          "0 = every data write signaled"),
    PARAM(listen_embryo_max, "EXS_LISTEN_EMBRYO_MAX", "256", UINT, 1,
          "connections a listener has in their handshake at once, at least its backlog, 1-1048576; "
          "requests beyond wait for room (spec/api.md, exs_listen)"),
    PARAM(listen_defer_max, "EXS_LISTEN_DEFER_MAX", "1024", UINT, 1,
          "connection requests a listener keeps waiting for room in its backlog, 0-1048576; "
          "beyond it the tcp provider stops accepting (clients wait in the kernel's listen queue) "
          "and others refuse (ECONNREFUSED at the peer); 0 = refuse at once"),

    /* -- fault-injection provider (issue 13) -- */
    PARAM(fault_seed, "EXS_FAULT_SEED", "1", UINT, 1,
          "fault provider: seed of the probability choices; a change restarts every fault's "
          "sequence"),
    PARAM(fault_delay_nth, "EXS_FAULT_DELAY_NTH", "0", UINT, 1,
          "fault provider: hold every Nth completion for EXS_FAULT_DELAY_US, 0 = off"),
    PARAM(fault_delay_ppm, "EXS_FAULT_DELAY_PPM", "0", UINT, 1,
          "fault provider: hold each completion with this probability, per million"),
    PARAM(fault_delay_us, "EXS_FAULT_DELAY_US", "1000", UINT, 1,
          "fault provider: how long a delayed completion is held, microseconds"),
    PARAM(fault_stall_nth, "EXS_FAULT_STALL_NTH", "0", UINT, 1,
          "fault provider: every Nth completion stalls its endpoint's completions for "
          "EXS_FAULT_STALL_MS, 0 = off"),
    PARAM(fault_stall_ppm, "EXS_FAULT_STALL_PPM", "0", UINT, 1,
          "fault provider: each completion stalls its endpoint with this probability, per million"),
    PARAM(fault_stall_ms, "EXS_FAULT_STALL_MS", "100", UINT, 1,
          "fault provider: how long a stalled endpoint delivers no completion, milliseconds"),
    PARAM(fault_drop_nth, "EXS_FAULT_DROP_NTH", "0", UINT, 1,
          "fault provider: every Nth send post on a connected endpoint disconnects it, 0 = off"),
    PARAM(fault_drop_ppm, "EXS_FAULT_DROP_PPM", "0", UINT, 1,
          "fault provider: each send post disconnects its endpoint with this probability, per "
          "million"),
    PARAM(fault_wc_nth, "EXS_FAULT_WC_NTH", "0", UINT, 1,
          "fault provider: every Nth successful completion becomes an error completion, 0 = off"),
    PARAM(fault_wc_ppm, "EXS_FAULT_WC_PPM", "0", UINT, 1,
          "fault provider: each successful completion becomes an error with this probability, per "
          "million"),
    PARAM(fault_wc_status, "EXS_FAULT_WC_STATUS", "0", UINT, 1,
          "fault provider: status of injected error completions (1-9, as enum exs_prov_wc_status), "
          "0 = each in turn"),
    PARAM(fault_reg_nth, "EXS_FAULT_REG_NTH", "0", UINT, 1,
          "fault provider: every Nth memory registration (mr_reg, mr_get, mem_alloc) fails with "
          "ENOMEM, 0 = off"),
    PARAM(fault_reg_ppm, "EXS_FAULT_REG_PPM", "0", UINT, 1,
          "fault provider: each memory registration fails with this probability, per million"),
    PARAM(fault_connect_nth, "EXS_FAULT_CONNECT_NTH", "0", UINT, 1,
          "fault provider: every Nth connect fails (rejected, then unreachable, in turn), 0 = off"),
    PARAM(fault_connect_ppm, "EXS_FAULT_CONNECT_PPM", "0", UINT, 1,
          "fault provider: each connect fails with this probability, per million"),
    PARAM(fault_freeze_nth, "EXS_FAULT_FREEZE_NTH", "0", UINT, 1,
          "fault provider: every Nth send post freezes its endpoint's link for "
          "EXS_FAULT_FREEZE_MS, 0 = off"),
    PARAM(fault_freeze_ppm, "EXS_FAULT_FREEZE_PPM", "0", UINT, 1,
          "fault provider: each send post freezes its link with this probability, per million"),
    PARAM(fault_freeze_ms, "EXS_FAULT_FREEZE_MS", "1000", UINT, 1,
          "fault provider: how long a frozen link moves nothing in either direction, milliseconds"),
    PARAM(fault_port, "EXS_FAULT_PORT", "0", UINT, 1,
          "fault provider: endpoint faults only on connections whose local or remote port is this, "
          "0 = every connection"),
    PARAM(fault_connect_sync, "EXS_FAULT_CONNECT_SYNC", "0", UINT, 1,
          "fault provider: 1 = an injected connect failure fails the connect call itself with "
          "ECONNREFUSED (a provider refusing at post time) instead of by a later event; 0 = by the "
          "event"),

    /* -- RDMA-to-TCP fallback (issue 13) -- */
    PARAM(fallback, "EXS_FALLBACK", "auto", STRING, 0,
          "RDMA-to-TCP fallback (spec/provider.md, Fallback): off; connect = a connect the primary "
          "provider fails is retried over tcp and listeners listen on both; any = as connect, and "
          "an established connection whose path fails mid-stream is cut over to tcp with no "
          "byte lost or repeated (spec/protocol.md 9.2); auto = connect when the primary is "
          "verbs, else off (fault:verbs included)"),
    PARAM(fallback_port_offset, "EXS_FALLBACK_PORT_OFFSET", "0", UINT, 0,
          "RDMA-to-TCP fallback: the tcp listener and fallback connects use the primary's port "
          "plus this (0 for verbs, whose port space is not TCP's; set it when the primary is "
          "fault:tcp), 0-32767"),
    PARAM(shm, "EXS_SHM", "auto", STRING, 0,
          "shared memory chosen by itself (spec/provider-shm.md, Chosen by itself): on (or 1) = "
          "when the primary provider is tcp, the shm provider is opened beside it and a "
          "connection whose peer proves to be on this host (same boot id, network namespace and "
          "user, its shm listener's credentials the pid it claimed) is cut over to shm, a "
          "declined switch logged at info level; auto = as on when tcp was chosen by default "
          "(EXS_PROVIDER empty) and no tcp link emulation is set, else off; off (or 0) = never"),
    PARAM(shm_ring_kb, "EXS_SHM_RING_KB", "4096", UINT, 0,
          "shm provider: each ring of a connection (one per direction), KiB, a power of two, "
          "64-262144; a connection's rings are the smaller of its two sides' values; its shared "
          "memory is at most 4 KiB and two rings (prov.shm ring_mem)"),
    PARAM(resume_max, "EXS_RESUME_MAX", "128", UINT, 1,
          "RDMA-to-TCP fallback, policy any: connections of the process waiting for their new "
          "path after a path failure (RESUMING, spec/protocol.md 9.2); one more makes the "
          "oldest give up (ETIMEDOUT, counted in fallback_resume_evicted), 1-1000000"),

    /* -- control endpoint, tracing, logging (issue 14) -- */
    PARAM(ctl_enable, "EXS_CTL_ENABLE", "1", UINT, 0,
          "control endpoint: a Unix socket per process for exsctl stat, params, set, trace; 0 = "
          "off, 0-1"),
    PARAM(ctl_dir, "EXS_CTL_DIR", "", STRING, 0,
          "control endpoint directory (made 0700 if missing; used if the user's and not "
          "writable by others, or sticky and the user's or root's); empty = "
          "$XDG_RUNTIME_DIR/exs, else /run/exs/UID (root) or /tmp/exs-UID"),
    PARAM(ctl_timeout_ms, "EXS_CTL_TIMEOUT_MS", "10000", UINT, 1,
          "control clients that do not read their reply, or send no request, for this long are "
          "dropped, milliseconds, 100-3600000"),
    PARAM(log_rate_burst, "EXS_LOG_RATE_BURST", "20", UINT, 1,
          "log lines one call site may write at once before rate limiting (err, warn, info); 0 = "
          "no limit"),
    PARAM(log_rate_per_s, "EXS_LOG_RATE_PER_S", "10", UINT, 1,
          "rate-limited call sites write this many lines per second, the rest are counted as "
          "suppressed, 1-1000000"),
    PARAM(polling_warn_cycle_us, "EXS_POLLING_WARN_CYCLE_US", "0", UINT, 1,
          "log an application thread that drives progress again after this long without waiting in "
          "the library (a slow poller), microseconds; 0 = off"),
    PARAM(slow_threshold_us, "EXS_SLOW_THRESHOLD_US", "0", UINT, 1,
          "log a progress pass that holds the progress lock longer than this, with what it ran, "
          "microseconds; 0 = off"),
    PARAM(trace_sample_mask, "EXS_TRACE_SAMPLE_MASK", "0", UINT, 1,
          "request tracing (SEQPACKET and STREAM): the n-th send of a connection is traced when (n "
          "& mask) == 0; 0 = off, 0xffffffffffffffff = every send"),
    PARAM(trace_file, "EXS_TRACE_FILE", "", STRING, 0,
          "completed request traces are also appended to this file, one JSON object a line; empty "
          "= none"),

    /* -- porting: kernel descriptors, timeouts (issue 15) -- */
    PARAM(exit_linger_ms, "EXS_EXIT_LINGER_MS", "3000", UINT, 1,
          "at a normal process exit, open connections deliver their queued sends and end "
          "gracefully within this many milliseconds (SO_LINGER overrides it per socket), else "
          "reset; 0 = reset at once, at most 3600000"),

};

/* Unloaded -> defaults (set before load, or by get/print) -> loaded (environment applied). */
enum { PARAMS_NONE, PARAMS_DEFAULTS, PARAMS_LOADED };

static pthread_mutex_t params_lock = PTHREAD_MUTEX_INITIALIZER;
static int params_state; /* PARAMS_*; written under the lock, read without it */
static int params_load_rc;

union param_val {
    uint64_t u;
    int b;
    char s[EXS_PARAM_STR_MAX];
};

/* Parse and validate text for row d. Returns 0 or -EINVAL. */
/* EXS_MEM_BUDGET=auto: a quarter of physical memory (1 GiB when unknown). */
static uint64_t params_phys_quarter(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

    if (pages <= 0 || psz <= 0)
        return 1ull << 30;
    return (uint64_t)pages * (uint64_t)psz / 4;
}

static int param_parse(const struct exs_param_def *d, const char *text, union param_val *v)
{
    switch (d->type) {
    case EXS_PARAM_UINT:
        if (d->offset == offsetof(struct exs_params, mem_budget) && text && !strcmp(text, "auto")) {
            v->u = params_phys_quarter();
            return 0;
        }
        if (exs__parse_uint(text, &v->u) < 0)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, tcp_rnr_retry) && v->u > 7)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, credits) && (v->u < 3 || v->u > 4095))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, ring_size) &&
            (v->u < 1024 || v->u % 64 || v->u > (1u << 30)))
            return -EINVAL;
        if ((d->offset == offsetof(struct exs_params, max_reads) ||
             d->offset == offsetof(struct exs_params, sock_max_ops)) &&
            (v->u < 1 || v->u > (1u << 20)))
            return -EINVAL;
        if ((d->offset == offsetof(struct exs_params, qspin_us) ||
             d->offset == offsetof(struct exs_params, qwait_spin_us) ||
             d->offset == offsetof(struct exs_params, qwait_spin_max_us)) &&
            v->u > 1000000)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, exit_linger_ms) && v->u > 3600000)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, close_timeout_ms) &&
            (v->u < 1 || v->u > 3600000))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, test_close_pause_us) && v->u > 1000000)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, test_engine_park) && v->u > 1)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, lease_us) && (v->u < 10 || v->u > 1000000))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, eager_max) && v->u > (1u << 20))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, batch_max) && v->u > (1u << 20))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, sndbuf) && v->u &&
            (v->u < 4096 || v->u > (64u << 20)))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, stream_copy_max) && v->u > (1u << 20))
            return -EINVAL;
        if ((d->offset == offsetof(struct exs_params, keepalive_intv_ms) ||
             d->offset == offsetof(struct exs_params, send_timeout_ms)) &&
            v->u > 3600000)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, ack_every) && (v->u == 1 || v->u > 4095))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, window_test) && v->u > 7)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, listen_embryo_max) &&
            (v->u < 1 || v->u > (1u << 20)))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, listen_defer_max) && v->u > (1u << 20))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, wr_max) && (v->u < 1 || v->u > 65536))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, frag_size) &&
            (v->u < 4096 || v->u > (1u << 30)))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, keepalive_probes) && (v->u < 1 || v->u > 100))
            return -EINVAL;
        if ((d->offset == offsetof(struct exs_params, connect_timeout_ms) ||
             d->offset == offsetof(struct exs_params, tcp_hello_ms)) &&
            (v->u < 1 || v->u > 3600000))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, tcp_hello_max) &&
            (v->u < 1 || v->u > (1u << 20)))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, emu_blackhole) && v->u > 1)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, fallback_port_offset) && v->u > 32767)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, resume_max) && (v->u < 1 || v->u > 1000000))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, shm_ring_kb) &&
            (v->u < 64 || v->u > 262144 || (v->u & (v->u - 1))))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, ctl_enable) && v->u > 1)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, ctl_timeout_ms) &&
            (v->u < 100 || v->u > 3600000))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, log_rate_per_s) &&
            (v->u < 1 || v->u > 1000000))
            return -EINVAL;
        return 0;
    case EXS_PARAM_BOOL:
        return exs__parse_bool(text, &v->b) < 0 ? -EINVAL : 0;
    case EXS_PARAM_STRING:
        if (!text || strlen(text) >= EXS_PARAM_STR_MAX)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, provider) && text[0] &&
            strcmp(text, "tcp") != 0 && strcmp(text, "verbs") != 0 &&
            strcmp(text, "fault:tcp") != 0 && strcmp(text, "fault:verbs") != 0 &&
            strcmp(text, "shm") != 0 && strcmp(text, "fault:shm") != 0)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, xfer_mode) && strcmp(text, "dynamic") &&
            strcmp(text, "direct") && strcmp(text, "indirect"))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, shm) && strcmp(text, "auto") &&
            strcmp(text, "on") && strcmp(text, "off") && strcmp(text, "1") && strcmp(text, "0"))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, fallback) && strcmp(text, "auto") &&
            strcmp(text, "off") && strcmp(text, "connect") && strcmp(text, "any"))
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, log_level) && exs__log_level_parse(text) < 0)
            return -EINVAL;
        if (d->offset == offsetof(struct exs_params, log_subsys) && !exs__log_subsys_parse(text))
            return -EINVAL;
        strcpy(v->s, text);
        return 0;
    }
    return -EINVAL;
}

/* Store a parsed value (lock held); the log rows also drive the logger. */
static void param_store(const struct exs_param_def *d, const union param_val *v)
{
    void *field = (char *)&exs__params + d->offset;

    switch (d->type) {
    case EXS_PARAM_UINT:
        __atomic_store_n((uint64_t *)field, v->u, __ATOMIC_RELAXED);
        break;
    case EXS_PARAM_BOOL:
        __atomic_store_n((int *)field, v->b, __ATOMIC_RELAXED);
        break;
    case EXS_PARAM_STRING:
        strcpy((char *)field, v->s);
        break;
    }
    if (d->offset == offsetof(struct exs_params, log_level))
        __atomic_store_n(&exs__log_level, exs__log_level_parse(v->s), __ATOMIC_RELAXED);
    else if (d->offset == offsetof(struct exs_params, log_subsys))
        __atomic_store_n(&exs__log_subsys, exs__log_subsys_parse(v->s), __ATOMIC_RELAXED);
}

/* Current value of row d as text (lock held). -ENOSPC when len is too small. */
static int param_format(const struct exs_param_def *d, char *buf, size_t len)
{
    const void *field = (const char *)&exs__params + d->offset;
    int n = 0;

    switch (d->type) {
    case EXS_PARAM_UINT:
        n = snprintf(buf, len, "%" PRIu64,
                     __atomic_load_n((const uint64_t *)field, __ATOMIC_RELAXED));
        break;
    case EXS_PARAM_BOOL:
        n = snprintf(buf, len, "%s",
                     __atomic_load_n((const int *)field, __ATOMIC_RELAXED) ? "yes" : "no");
        break;
    case EXS_PARAM_STRING:
        n = snprintf(buf, len, "%s", (const char *)field);
        break;
    }
    return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

static void params_defaults_locked(void)
{
    union param_val v;

    if (params_state != PARAMS_NONE)
        return;
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++) {
        int rc = param_parse(&params_table[i], params_table[i].defval, &v);

        EXS_ASSERT(rc == 0);
        param_store(&params_table[i], &v);
    }
    __atomic_store_n(&params_state, PARAMS_DEFAULTS, __ATOMIC_RELEASE);
}

/* Values set with exs__params_set() before the load are kept unless the environment
 * overrides them: the user's EXS_* variables have the last word. */
int exs__params_load(void)
{
    int rc = 0;

    if (__atomic_load_n(&params_state, __ATOMIC_ACQUIRE) == PARAMS_LOADED)
        return params_load_rc;
    pthread_mutex_lock(&params_lock);
    if (params_state == PARAMS_LOADED) {
        rc = params_load_rc;
        goto out;
    }
    params_defaults_locked();
    /* Table order: the log rows come first, so later warnings obey EXS_LOG_LEVEL. */
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++) {
        const struct exs_param_def *d = &params_table[i];
        const char *text = getenv(d->env);
        union param_val v;
        char cur[EXS_PARAM_STR_MAX + 32];

        if (!text)
            continue;
        if (param_parse(d, text, &v) < 0) {
            if (param_format(d, cur, sizeof(cur)) < 0)
                cur[0] = '\0';
            EXS_WARN(UTIL, "%s=\"%s\": invalid, keeping %s=\"%s\" (%s)", d->env, text, d->name, cur,
                     d->help);
            rc = -EINVAL;
            continue;
        }
        param_store(d, &v);
    }
    params_load_rc = rc;
    __atomic_store_n(&params_state, PARAMS_LOADED, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&params_lock);
    return rc;
}

void exs__params_reset(void)
{
    pthread_mutex_lock(&params_lock);
    __atomic_store_n(&params_state, PARAMS_NONE, __ATOMIC_RELEASE);
    params_load_rc = 0;
    pthread_mutex_unlock(&params_lock);
}

const struct exs_param_def *exs__params_table(size_t *count_p)
{
    if (count_p)
        *count_p = EXS_ARRAY_SIZE(params_table);
    return params_table;
}

const struct exs_param_def *exs__params_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++)
        if (strcmp(params_table[i].name, name) == 0)
            return &params_table[i];
    return NULL;
}

int exs__params_set(const char *name, const char *value)
{
    const struct exs_param_def *d = exs__params_find(name);
    union param_val v;
    int rc;

    if (!d)
        return -ENOENT;
    pthread_mutex_lock(&params_lock);
    if (params_state == PARAMS_LOADED && !d->online) {
        rc = -EPERM;
    } else if ((rc = param_parse(d, value, &v)) == 0) {
        params_defaults_locked();
        param_store(d, &v);
    }
    pthread_mutex_unlock(&params_lock);
    return rc;
}

int exs__params_get(const char *name, char *buf, size_t len)
{
    const struct exs_param_def *d = exs__params_find(name);
    int rc;

    if (!d)
        return -ENOENT;
    pthread_mutex_lock(&params_lock);
    params_defaults_locked();
    rc = param_format(d, buf, len);
    pthread_mutex_unlock(&params_lock);
    return rc;
}

/* Markdown cell text: code span, or a word for the empty default. */
static void print_md_code(FILE *f, const char *s)
{
    if (s[0])
        fprintf(f, " `%s` |", s);
    else
        fprintf(f, " (empty) |");
}

static void params_print_markdown(FILE *f)
{
    fprintf(f, "# Tunables\n\n");
    fprintf(f, "This file is generated by `build/tools/exsctl params --markdown` from the table in "
               "`exs/util/params.c`; do not edit it by hand.\n\n");
    fprintf(f, "| Name | Variable | Default | Online | Description |\n");
    fprintf(f, "|------|----------|---------|--------|-------------|\n");
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++) {
        const struct exs_param_def *d = &params_table[i];

        fprintf(f, "|");
        print_md_code(f, d->name);
        print_md_code(f, d->env);
        print_md_code(f, d->defval);
        fprintf(f, " %s | ", d->online ? "online" : "offline");
        for (const char *c = d->help; *c; c++) {
            if (*c == '|')
                fputc('\\', f);
            fputc(*c, f);
        }
        fprintf(f, " |\n");
    }
}

void exs__params_print(FILE *f, int markdown)
{
    char values[EXS_ARRAY_SIZE(params_table)][EXS_PARAM_STR_MAX + 32];
    int wname = (int)strlen("NAME"), wenv = (int)strlen("VARIABLE");
    int wval = (int)strlen("VALUE"), wdef = (int)strlen("DEFAULT");

    if (markdown) {
        params_print_markdown(f);
        return;
    }
    pthread_mutex_lock(&params_lock);
    params_defaults_locked();
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++)
        if (param_format(&params_table[i], values[i], sizeof(values[i])) < 0)
            strcpy(values[i], "?");
    pthread_mutex_unlock(&params_lock);

    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++) {
        const struct exs_param_def *d = &params_table[i];

        wname = EXS_MAX(wname, (int)strlen(d->name));
        wenv = EXS_MAX(wenv, (int)strlen(d->env));
        wval = EXS_MAX(wval, (int)strlen(values[i]) + 2);
        wdef = EXS_MAX(wdef, (int)strlen(d->defval) + 2);
    }
    fprintf(f, "%-*s  %-*s  %-*s  %-*s  %-7s  %s\n", wname, "NAME", wenv, "VARIABLE", wval, "VALUE",
            wdef, "DEFAULT", "MODE", "DESCRIPTION");
    for (size_t i = 0; i < EXS_ARRAY_SIZE(params_table); i++) {
        const struct exs_param_def *d = &params_table[i];
        char val[EXS_PARAM_STR_MAX + 40], def[EXS_PARAM_STR_MAX + 8];

        /* Strings quoted so an empty one is visible. */
        const char *q = d->type == EXS_PARAM_STRING ? "\"" : "";

        snprintf(val, sizeof(val), "%s%.*s%s", q, (int)sizeof(values[i]), values[i], q);
        snprintf(def, sizeof(def), "%s%s%s", q, d->defval, q);
        fprintf(f, "%-*s  %-*s  %-*s  %-*s  %-7s  %s\n", wname, d->name, wenv, d->env, wval, val,
                wdef, def, d->online ? "online" : "offline", d->help);
    }
}

void exs__params_fork(int phase)
{
    exs__mutex_fork(&params_lock, phase);
}
