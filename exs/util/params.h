/* SPDX-License-Identifier: MIT */
/* The tunables table: every tunable has a name, an EXS_* variable, a default, a description,
 * and is either online (changeable at run time) or offline (read once at start). */
#ifndef EXS_UTIL_PARAMS_H
#define EXS_UTIL_PARAMS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum exs_param_type {
    EXS_PARAM_UINT,   /* uint64_t; accepts decimal, 0x hex, and k/m/g suffixes (powers of 1024) */
    EXS_PARAM_BOOL,   /* int; 0/1, yes/no, on/off, true/false */
    EXS_PARAM_STRING, /* char[EXS_PARAM_STR_MAX] */
};

#define EXS_PARAM_STR_MAX 64

/* The current values. Read them directly (they are plain loads); change them only
 * through exs__params_set(). Each field is one row of the table in params.c. */
struct exs_params {
    /* util */
    char log_level[EXS_PARAM_STR_MAX];  /* EXS_LOG_LEVEL */
    char log_subsys[EXS_PARAM_STR_MAX]; /* EXS_LOG_SUBSYS */
    /* provider choice */
    char provider[EXS_PARAM_STR_MAX]; /* EXS_PROVIDER: "" (auto), tcp, verbs, fault:tcp, fault:verbs
                                       */
    /* tcp provider and its link emulation */
    uint64_t emu_delay_us;     /* EXS_EMU_DELAY_US: one-way delay added per direction */
    uint64_t emu_rate_mbps;    /* EXS_EMU_RATE_MBPS: bandwidth cap per direction, 0 = none */
    uint64_t tcp_rnr_retry;    /* EXS_TCP_RNR_RETRY: 0..7, 7 = forever */
    uint64_t tcp_rnr_timer_ms; /* EXS_TCP_RNR_TIMER_MS: pause between RNR retries */
    uint64_t tcp_max_inline;   /* EXS_TCP_MAX_INLINE */
    uint64_t tcp_max_sge;      /* EXS_TCP_MAX_SGE */
    uint64_t tcp_max_wr;       /* EXS_TCP_MAX_WR: largest send/recv queue depth */
    uint64_t tcp_cq_size;      /* EXS_TCP_CQ_SIZE: ctx completion queue capacity */
    uint64_t tcp_max_msg;      /* EXS_TCP_MAX_MSG: largest work request in bytes */
    uint64_t tcp_ctrl_max;     /* EXS_TCP_CTRL_MAX: responder frames queued before reading stops */
    uint64_t tcp_hello_ms;     /* EXS_TCP_HELLO_MS: an accepted socket's CONN_REQ deadline */
    uint64_t tcp_hello_max;    /* EXS_TCP_HELLO_MAX: sockets waiting for CONN_REQ per listener */
    /* protocol and sockets */
    uint64_t credits;      /* EXS_CREDITS: receives pre-posted per connection (3-4095) */
    uint64_t ring_size;    /* EXS_RING_SIZE: default SO_RCVBUF, bytes of the hidden ring */
    uint64_t eager_max;    /* EXS_EAGER_MAX: SEQPACKET messages below it go eagerly */
    uint64_t max_reads;    /* EXS_MAX_READS: RDMA READs in flight per connection */
    uint64_t sock_max_ops; /* EXS_SOCK_MAX_OPS: outstanding operations per socket and direction */
    char xfer_mode[EXS_PARAM_STR_MAX]; /* EXS_XFER_MODE: dynamic, direct, indirect */
    uint64_t qspin_us;                 /* EXS_QSPIN_US: EXS_WAIT_ADAPTIVE spin before sleeping */
    uint64_t qwait_spin_us; /* EXS_QWAIT_SPIN_US: a new queue's wait (ADAPTIVE spin, 0 = NOTIFY) */
    uint64_t qwait_spin_max_us;   /* EXS_QWAIT_SPIN_MAX_US: how far that spin may learn to grow */
    uint64_t close_timeout_ms;    /* EXS_CLOSE_TIMEOUT_MS: a graceful close resets after this */
    uint64_t test_close_pause_us; /* EXS_TEST_CLOSE_PAUSE_US: test seam, see params.c */
    uint64_t lease_us;            /* EXS_LEASE_US: progress thread's lease while threads drive */
    uint64_t test_shm_pid;        /* EXS_TEST_SHM_PID: test seam, the pid an SHM_OFFER claims */
    uint64_t test_engine_park;    /* EXS_TEST_ENGINE_PARK: test seam (0/1), see params.c */
    /* verbs provider */
    uint64_t vrb_qp_timeout; /* EXS_VRB_QP_TIMEOUT: local ACK timeout exponent, 4.096 us * 2^n;
                                0 = rdma_cm's */
    uint64_t vrb_retry_cnt;  /* EXS_VRB_RETRY_CNT: transport retries, 0-7 */
    uint64_t vrb_rnr_retry;  /* EXS_VRB_RNR_RETRY: receiver-not-ready retries, 0-7, 7 = forever */
    int vrb_fork_safe;       /* EXS_VRB_FORK_SAFE: ibv_fork_init() before the first context */
    int vrb_mcache_guard;    /* EXS_VRB_MCACHE_GUARD: PROT_NONE pages around cache regions */
    uint64_t vrb_cq_size;    /* EXS_VRB_CQ_SIZE: default completion queue capacity */
    uint64_t vrb_max_inline; /* EXS_VRB_MAX_INLINE: inline size asked of the device */
    uint64_t vrb_qp_cache;   /* EXS_VRB_QP_CACHE: queue pairs kept for reuse per context */
    char vrb_mem_alloc[EXS_PARAM_STR_MAX]; /* EXS_VRB_MEM_ALLOC: anon, huge, malloc */
    uint64_t vrb_mcache_region;  /* EXS_VRB_MCACHE_REGION: bytes per memory cache region */
    uint64_t vrb_mcache_idle_ms; /* EXS_VRB_MCACHE_IDLE_MS: idle regions released after this */
    uint64_t vrb_regcache_max;   /* EXS_VRB_REGCACHE_MAX: user-buffer registrations kept */
    char vrb_device[EXS_PARAM_STR_MAX]; /* EXS_VRB_DEVICE: NAME or NAME:PORT, "" = any */
    char vrb_addr[EXS_PARAM_STR_MAX];   /* EXS_VRB_ADDR: the device holding this IP */
    uint64_t batch_max;                 /* EXS_BATCH_MAX: largest batched ring write, 0 = off */
    uint64_t sndbuf;                    /* EXS_SNDBUF: STREAM send buffer per connection, 0 = off */
    uint64_t stream_copy_max; /* EXS_STREAM_COPY_MAX: STREAM sends up to this are copied */

    /* -- adaptive stream algorithm and ring autotuning (issue 12) -- */
    uint64_t
        stream_direct_min; /* EXS_STREAM_DIRECT_MIN: receives this big are advertised (direct) */
    uint64_t
        stream_drain_streak; /* EXS_STREAM_DRAIN_STREAK: arrivals in a row before DRAIN, 0 = off */
    uint64_t ring_max;       /* EXS_RING_MAX: STREAM ring autotuning grows up to this, bytes */
    uint64_t ring_budget;    /* EXS_RING_BUDGET: ring bytes of the process a grow may reach */
    uint64_t mem_budget;     /* EXS_MEM_BUDGET: bytes peers may make the process hold */
    uint64_t ring_idle_ms;   /* EXS_RING_IDLE_MS: a grown ring idle this long shrinks, 0 = never */
    uint64_t stream_direct_linger; /* EXS_STREAM_DIRECT_LINGER: a direct sender waits for its writes
                                      before the ring */

    /* -- keepalive, deadlines, seq-ack window, fragmentation (issue 13) -- */
    uint64_t keepalive_intv_ms;  /* EXS_KEEPALIVE_INTV_MS: silence before a probe, 0 = off */
    uint64_t keepalive_probes;   /* EXS_KEEPALIVE_PROBES: failed probes before the peer is dead */
    uint64_t connect_timeout_ms; /* EXS_CONNECT_TIMEOUT_MS: connect / accept handshake bound */
    uint64_t send_timeout_ms;    /* EXS_SEND_TIMEOUT_MS: sends stalled this long reset, 0 = off */
    uint64_t emu_blackhole;      /* EXS_EMU_BLACKHOLE: tcp link silently stops delivering (0/1) */
    uint64_t ack_every;       /* EXS_ACK_EVERY: owed credits that send a standalone ACK, 0 = n/2 */
    uint64_t window_test;     /* EXS_WINDOW_TEST: test seam, EXS_WINDOW_TEST_* bits, 0 = off */
    uint64_t frag_size;       /* EXS_FRAG_SIZE: largest data write of a transfer, bytes */
    uint64_t wr_max;          /* EXS_WR_MAX: send work requests outstanding per connection */
    uint64_t send_unsignaled; /* EXS_SEND_UNSIGNALED: small inline sends unsignaled, done at
                               * post (spec/protocol.md §6.4), 0 = off */
    uint64_t listen_embryo_max; /* EXS_LISTEN_EMBRYO_MAX: handshakes in flight per listener
                                 * (at least its backlog) */
    uint64_t listen_defer_max;  /* EXS_LISTEN_DEFER_MAX: requests waiting for room per listener */

    /* -- fault-injection provider (issue 13) -- */
    uint64_t fault_seed;         /* EXS_FAULT_SEED: seed of every probability choice */
    uint64_t fault_delay_nth;    /* EXS_FAULT_DELAY_NTH: every Nth completion held, 0 = off */
    uint64_t fault_delay_ppm;    /* EXS_FAULT_DELAY_PPM: or each with this probability (1e-6) */
    uint64_t fault_delay_us;     /* EXS_FAULT_DELAY_US: how long a delayed completion is held */
    uint64_t fault_stall_nth;    /* EXS_FAULT_STALL_NTH: every Nth completion stalls its ep */
    uint64_t fault_stall_ppm;    /* EXS_FAULT_STALL_PPM */
    uint64_t fault_stall_ms;     /* EXS_FAULT_STALL_MS: how long a stalled ep delivers nothing */
    uint64_t fault_drop_nth;     /* EXS_FAULT_DROP_NTH: every Nth send post disconnects its ep */
    uint64_t fault_drop_ppm;     /* EXS_FAULT_DROP_PPM */
    uint64_t fault_wc_nth;       /* EXS_FAULT_WC_NTH: every Nth completion turned into an error */
    uint64_t fault_wc_ppm;       /* EXS_FAULT_WC_PPM */
    uint64_t fault_wc_status;    /* EXS_FAULT_WC_STATUS: the error status, 0 = each in turn */
    uint64_t fault_reg_nth;      /* EXS_FAULT_REG_NTH: every Nth registration fails */
    uint64_t fault_reg_ppm;      /* EXS_FAULT_REG_PPM */
    uint64_t fault_connect_nth;  /* EXS_FAULT_CONNECT_NTH: every Nth connect fails */
    uint64_t fault_connect_ppm;  /* EXS_FAULT_CONNECT_PPM */
    uint64_t fault_freeze_nth;   /* EXS_FAULT_FREEZE_NTH: every Nth send post freezes its link */
    uint64_t fault_freeze_ppm;   /* EXS_FAULT_FREEZE_PPM */
    uint64_t fault_freeze_ms;    /* EXS_FAULT_FREEZE_MS: how long a frozen link stays frozen */
    uint64_t fault_port;         /* EXS_FAULT_PORT: only connections with this port, 0 = all */
    uint64_t fault_connect_sync; /* EXS_FAULT_CONNECT_SYNC: injected connect failures fail
                                  * the connect call itself (ECONNREFUSED) */

    /* -- RDMA-to-TCP fallback (issue 13) -- */
    char fallback[EXS_PARAM_STR_MAX]; /* EXS_FALLBACK: auto, off, connect, any (offline) */
    uint64_t fallback_port_offset;    /* EXS_FALLBACK_PORT_OFFSET: tcp ports = primary + this */
    char shm[EXS_PARAM_STR_MAX];      /* EXS_SHM: auto, on, off (offline; provider-shm.md) */
    uint64_t shm_ring_kb;             /* EXS_SHM_RING_KB: shm rings per direction, KiB */
    uint64_t resume_max;              /* EXS_RESUME_MAX: connections waiting in RESUMING */

    /* -- control endpoint, tracing, logging (issue 14) -- */
    uint64_t ctl_enable;             /* EXS_CTL_ENABLE: the control endpoint, 0-1 (offline) */
    char ctl_dir[EXS_PARAM_STR_MAX]; /* EXS_CTL_DIR: its directory, "" = the runtime dir */
    uint64_t ctl_timeout_ms; /* EXS_CTL_TIMEOUT_MS: a stalled or idle control client is dropped */
    uint64_t log_rate_burst; /* EXS_LOG_RATE_BURST: lines per call site before limiting, 0 = off */
    uint64_t log_rate_per_s; /* EXS_LOG_RATE_PER_S: lines per second per call site after it */
    uint64_t polling_warn_cycle_us; /* EXS_POLLING_WARN_CYCLE_US: slow-poll report, 0 = off */
    uint64_t slow_threshold_us;     /* EXS_SLOW_THRESHOLD_US: slow progress pass report, 0 = off */
    uint64_t
        trace_sample_mask; /* EXS_TRACE_SAMPLE_MASK: send n traced when (n & mask) == 0; 0 = off */
    char trace_file[EXS_PARAM_STR_MAX]; /* EXS_TRACE_FILE: completed traces appended here, "" = none
                                         */

    /* -- porting: kernel descriptors, timeouts (issue 15) -- */
    uint64_t exit_linger_ms; /* EXS_EXIT_LINGER_MS: at exit, open connections finish this long */
};

struct exs_param_def {
    const char *name;   /* e.g. "emu_delay_us" */
    const char *env;    /* e.g. "EXS_EMU_DELAY_US" */
    const char *defval; /* default as text */
    const char *help;   /* one line */
    enum exs_param_type type;
    int online;    /* 1: exs__params_set works after load; 0: start-up only */
    size_t offset; /* offsetof(struct exs_params, field) */
};

extern struct exs_params exs__params;

/* Set defaults, then apply every EXS_* variable present. Idempotent; the first call
 * wins until exs__params_reset(). Logs a warning and keeps the default for a bad value.
 * Returns 0, or -EINVAL when some variable was invalid (the rest still applied). */
int exs__params_load(void);
/* Forget the loaded state (tests): the next load starts from defaults again. */
void exs__params_reset(void);
/* Change one tunable by name. -ENOENT unknown, -EINVAL bad value, -EPERM offline
 * tunable after load. */
int exs__params_set(const char *name, const char *value);
/* Current value as text. -ENOENT unknown, -ENOSPC buffer too small. */
int exs__params_get(const char *name, char *buf, size_t len);
/* The table. */
const struct exs_param_def *exs__params_table(size_t *count_p);
const struct exs_param_def *exs__params_find(const char *name);
/* Print the table (name, variable, current, default, online/offline, help) to f;
 * markdown=1 prints the spec/params.md table. */
void exs__params_print(FILE *f, int markdown);

/* fork (exs/api/fork.c): the table's lock held across fork(2) (phase: enum
 * exs_fork_phase); the child keeps the parent's values. */
void exs__params_fork(int phase);

#endif
