/* SPDX-License-Identifier: MIT */
/* blast: shared types of the throughput tool (options, control messages, results). */
#ifndef BLAST_BLAST_H
#define BLAST_BLAST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BLAST_MAGIC      0x424c5354u /* "BLST" */
#define BLAST_VERSION    2
#define BLAST_MAX_CONNS  256
#define BLAST_MAX_SWEEP  64
#define BLAST_MAX_RUNS   1000
#define BLAST_MAX_ROUNDS 16
#define BLAST_DEF_PORT   7480

enum { T_STREAM = 0, T_SEQPACKET = 1 };
enum { X_EXS = 0, X_TCP = 1 };
enum { M_DYNAMIC = 0, M_DIRECT = 1, M_INDIRECT = 2 }; /* = EXS_XFER_* */
enum { SW_NONE = 0, SW_SENDS, SW_RECVS, SW_SIZE, SW_DEPTH };
enum { K_XFER = 1, K_LAT = 2, K_QUIT = 3 };
enum { POLL_SEND = 1, POLL_RECV = 2 }; /* run_params.poll: which ends busy-poll their queue */

/* Message sizes: fixed, or exponential with mean and maximum (the paper's workload). */
struct sizegen {
    int exp; /* 0: fixed size `mean` */
    uint64_t mean;
    uint64_t max; /* largest message; receive buffers are this long */
    uint64_t rng; /* xorshift state */
};

/* One run's parameters: what the sender sends to the receiver on the control connection. */
struct run_params {
    uint32_t magic, version, kind;
    int32_t type, transport, mode;
    int32_t sends, recvs, waitall, verify, conns, poll;
    int32_t elephants, mice, mice_sends; /* mix: first `elephants` connections, then mice */
    int32_t rcvbuf;                      /* 0 = library default */
    uint64_t size_mean, size_max, mice_size;
    int32_t size_exp, lat_iters;
    uint64_t bytes;               /* 0: time limited */
    double seconds;               /* time limit when bytes == 0 */
    uint32_t delay_us, rate_mbps; /* what the sender set: the receiver warns on mismatch */
    uint64_t seed;
    int32_t onebuf;    /* one buffer per connection and side (cache-hot), not sends/recvs of them */
    int32_t wait_spin; /* queues not busy-polled: > 0 EXS_WAIT_ADAPTIVE spinning this many us, < 0
                        * EXS_WAIT_NOTIFY, 0 as the library makes a queue wait */
};

/* Counters of one side of one run. */
struct side_result {
    int32_t status;   /* 0 ok; else an errno-like code, msg says what */
    int32_t reported; /* already sent to (receiver) / read from (sender) the control peer */
    char msg[200];
    uint64_t bytes, messages;
    double seconds;  /* first transfer start .. last transfer end on this side */
    double cpu_sec;  /* user+sys over the run */
    double wall_sec; /* wall time the CPU figure is divided by */
    uint64_t direct, indirect, switches, adverts, stalls; /* EXS_SO_STATS of this side */
    /* the adaptive algorithm's EXS_SO_STATS fields, summed over this side's connections
     * (ring_size: the largest ring of any connection at the end of the run) */
    uint64_t dtime_us, itime_us, drains, resizes, ring_size;
    uint64_t verify_errors;
    /* mix classes: 0 elephants, 1 mice */
    uint64_t cls_bytes[2], cls_msgs[2];
    double cls_seconds[2];
    double cls_p50_us[2], cls_p99_us[2]; /* sender: send completion time per message */
    /* latency test (sender side) */
    double lat_p50_us, lat_p99_us, lat_p999_us, lat_mean_us;
    uint64_t lat_count;
};

struct preset;

/* Command-line configuration. */
struct config {
    int server, loopback, once;
    const char *host;
    int port;
    int type, transports[2], ntransports;
    int modes[3], nmodes;
    int sends, recvs;
    double recv_ratio; /* > 0: recvs = ratio * sends in sweeps of sends */
    struct sizegen size;
    uint64_t bytes;
    double seconds;
    int waitall, runs, verify, conns, poll, rcvbuf;
    int onebuf;    /* --one-buffer (--tcp-one-buffer) */
    int wait_spin; /* --wait-spin US; -1: --wait-notify */
    double delay_ms, rate_mbps;
    int sweep;
    uint64_t sweep_vals[BLAST_MAX_SWEEP];
    int nsweep;
    int elephants, mice, mice_sends;
    uint64_t mice_size;
    int latency, lat_iters; /* latency: -1 auto (seqpacket), 0 off, 1 on */
    int lat_only;           /* only the latency test, no throughput runs */
    int json, csv, quiet, inject;
    const char *plot;
    const char *out; /* write the report here instead of stdout */
    uint64_t seed;
    const struct preset *preset; /* --preset NAME: its points replace the sweep */
    int preset_points;           /* --points N: only the first N points of the preset */
    int markdown;                /* --markdown: the preset table as Markdown */
    int rounds;                  /* --rounds N: modes interleaved N times, median kept */
};

/* A paper figure as a list of points, each run in all three modes. The paper's values are
 * the ones its text and Table III state; none are read off a plot unless said so. */
struct preset_point {
    int sends, recvs;
    uint64_t size;      /* fixed size; 0: the preset's size generator */
    int group;          /* a line of the figure (Fig. 11: one per message size), 0 otherwise */
    double paper_ratio; /* the paper's direct ratio for the dynamic mode, < 0 if not stated */
    const char *paper;  /* what the paper reports for this point, short */
};
struct preset {
    const char *name, *title, *sizegen, *paper; /* paper: the figure's result in a sentence */
    double delay_ms, rate_mbps, seconds;        /* the link and the default time per run */
    const struct preset_point *pts;
    int npts;
};
const struct preset *preset_find(const char *name);
void preset_list(FILE *f);

/* One line of the report: a (transport, mode, sweep value) point over all its runs. */
struct result {
    int transport, mode, type, sends, recvs, conns, waitall, verify, runs;
    int elephants, mice;
    uint64_t size_mean, size_max, mice_size;
    int size_exp;
    uint64_t sweep_val;
    int point; /* index of the preset point, -1 without a preset */
    double tput_mean, tput_ci, mps_mean, secs_mean;
    uint64_t bytes, messages;
    double direct, indirect, direct_ratio, switches;
    double dtime_ms, itime_ms; /* sender: time in direct / indirect phases, per run */
    double drains_rcv, drains_snd, resizes, ring_size; /* per run; ring: receiver's, bytes */
    double cpu_send, cpu_recv, cpu_send_ci, cpu_recv_ci;
    double cls_tput[2], cls_mps[2], cls_p50[2], cls_p99[2];
    uint64_t cls_bytes[2], cls_msgs[2];
    int nrounds; /* --rounds: this mode's throughput in each round */
    double round_tput[BLAST_MAX_ROUNDS];
    int has_lat;
    double lat_p50, lat_p99, lat_p999, lat_mean;
    uint64_t lat_count;
};

/* workload.c */
double now_sec(void);
double cpu_now(void);
uint64_t sg_next_exp(struct sizegen *g);
/* Next message size: fixed, or -mean*ln(U) cut to [1, max] (inline: asked per send). */
static inline uint64_t sg_next(struct sizegen *g)
{
    return g->exp ? sg_next_exp(g) : g->mean;
}
void sg_seed(struct sizegen *g, uint64_t seed);
void pattern_fill(unsigned char *p, size_t len, uint64_t off);
size_t pattern_check(const unsigned char *p, size_t len, uint64_t off);
void mean_ci95(const double *v, int n, double *mean, double *ci);
double percentile(double *v, size_t n, double p);

/* One connection's numbers as the per-class (elephants / mice) results need them. */
struct flow_view {
    int cls; /* 0 elephant, 1 mouse */
    uint64_t bytes, msgs;
    double t_first, t_last;
    const double *lat; /* per-message send completion times */
    size_t nlat;
};
/* Fill res->seconds (first transfer start .. last transfer end over all flows, Eq. 1)
 * and, with classes, the per-class bytes, messages, seconds and completion times. */
void flows_results(struct side_result *res, const struct flow_view *v, int n, int classes);
int parse_size(const char *s, uint64_t *out);
int parse_sizegen(const char *s, struct sizegen *g);
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress_end(void);
extern int progress_off; /* --quiet */
void set_err(struct side_result *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int write_full(int fd, const void *buf, size_t len);
int read_full(int fd, void *buf, size_t len);
/* spin: non-blocking reads in a loop (a busy-polling ping-pong), else read_full */
int read_full_spin(int fd, void *buf, size_t len, int spin);
void rusage_pair(double *cpu);

/* blast.c: the end-of-run handshake on the control connection. The receiver reports its
 * result and waits for the sender's go-ahead before closing its sockets; the sender reads that
 * result, then says go and closes. So neither side closes while the other still works. */
int ctl_server_report(struct side_result *res);
int ctl_client_collect(struct side_result *self, struct side_result *peer);
extern struct side_result *ctl_peer_result;

/* exs_xfer.c: one run of the exs transport; the listener persists in the server. */
int exs_server_prepare(const struct run_params *rp, int port, int *data_port);
int exs_server_run(const struct run_params *rp, struct side_result *res);
int exs_client_run(const struct run_params *rp, const char *host, int data_port,
                   struct side_result *res);
void exs_server_cleanup(void);

/* tcp_xfer.c: the same workload over kernel TCP sockets. */
int tcp_server_prepare(const struct run_params *rp, int port, int *data_port);
int tcp_server_run(const struct run_params *rp, struct side_result *res);
int tcp_client_run(const struct run_params *rp, const char *host, int data_port,
                   struct side_result *res);
void tcp_server_cleanup(void);

/* report.c */
const char *type_name(int t);
const char *mode_name(int m);
const char *transport_name(int x);
const char *sweep_name(int s);
void report_table(FILE *f, const struct config *c, const struct result *r, int n);
void report_json(FILE *f, const struct config *c, const struct result *r, int n);
void report_csv(FILE *f, const struct config *c, const struct result *r, int n);
int report_plot(const char *png, const struct config *c, const struct result *r, int n);
void report_preset(FILE *f, const struct config *c, const struct result *r, int n);

#endif
