/* SPDX-License-Identifier: MIT */
/* blast: the ES-API throughput tool: options, the control connection, runs and sweeps. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blast/blast.h"

struct ready_msg {
    int32_t status, data_port;
    char msg[200];
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: blast -s [-p PORT] [--once] [--delay-ms MS] [--rate-mbps R]     (receiver)\n"
        "       blast -c HOST [-p PORT] [workload] [output]                     (sender)\n"
        "       blast --loopback [workload] [output]                           (both, here)\n"
        "workload:\n"
        "  --type stream|seqpacket       socket type (default stream)\n"
        "  --mode dynamic|direct|indirect|all|LIST   transfer mode(s) (default dynamic)\n"
        "  --sends N / --recvs N         outstanding sends / receives per connection (8 / 8)\n"
        "  --recv-ratio R                in sweeps of sends: recvs = R x sends\n"
        "  --size BYTES|exp:MEAN[:MAX]   message size (default exp:1M:4M; K/M/G suffixes)\n"
        "  --bytes N | --time SECONDS    amount per run (default --time 1)\n"
        "  --waitall                     stream receives with MSG_WAITALL\n"
        "  --runs N                      runs per point (default 3); mean and 95%% CI\n"
        "  --transport exs|tcp|both      libexs, kernel TCP baseline, or both (default exs)\n"
        "  --delay-ms MS --rate-mbps R   emulated link of the tcp provider (exs only)\n"
        "  --rcvbuf BYTES                SO_RCVBUF: the hidden ring (exs) / socket buffer (tcp)\n"
        "  --sweep sends=L|recvs=L|size=L|depth=L   L: a,b,c or A-B or A-B*F (geometric)\n"
        "  --conns N                     connections at once (default 1)\n"
        "  --mix elephants=N,mice=M[,mice-size=B][,mice-sends=K]   mixed flows, per-class results\n"
        "  --verify | --no-verify        check the data pattern at the receiver (default off)\n"
        "  --latency | --no-latency      ping-pong test (default: on for seqpacket)\n"
        "  --lat-iters N --lat-size B    ping-pong count (2000) and message size (64)\n"
        "  --lat-only                    only the ping-pong test: no throughput runs\n"
        "  --poll                        busy-poll the sender's event queue (default: "
        "the library's wait)\n"
        "  --poll-recv                   busy-poll the receiver's event queue too (or alone)\n"
        "                                (tcp: the ping-pong spins on non-blocking reads instead)\n"
        "  --wait-spin US                queues not busy-polled spin US microseconds before they\n"
        "                                sleep (EXS_WAIT_ADAPTIVE; rsockets' blocking calls spin "
        "10)\n"
        "  --wait-notify                 queues not busy-polled sleep at once (EXS_WAIT_NOTIFY);\n"
        "                                default: as the library makes a queue wait (a spin of\n"
        "                                EXS_QWAIT_SPIN_US, 10 us, then sleep)\n"
        "  --one-buffer                  one buffer per connection and side, reused for every\n"
        "                                message (cache-hot, as ucx_perftest's; default: --sends\n"
        "                                buffers at the sender and --recvs at the receiver, in\n"
        "                                turn); libexs: not with --verify (sends share it)\n"
        "  --tcp-one-buffer              the same (its older name)\n"
        "  --seed N                      random sizes seed\n"
        "presets (the paper's figures, each point in all three modes; --preset list names them):\n"
        "  --preset NAME                 fig9a, fig9b, fig11, fig12, fig13: the paper's value next "
        "to ours\n"
        "  --points N                    only the first N points of the preset (quick checks)\n"
        "  --rounds N                    run a point's modes N times, interleaved (the order "
        "rotates\n"
        "                                each round), and keep each mode's median-throughput "
        "round\n"
        "                                (default 3 with --preset, else 1)\n"
        "                                (--time, --runs, --rounds, --mode, --rcvbuf override the "
        "preset's)\n"
        "  --markdown                    the preset table as Markdown (for blast/README.md)\n"
        "output:\n"
        "  --json | --csv                machine-readable output instead of the table\n"
        "  --plot FILE.png               gnuplot chart of a sweep\n"
        "  --output FILE                 write the report to FILE\n"
        "  --quiet                       no progress line\n"
        "  --inject-error                (testing) corrupt one byte: verification must fail\n");
}

static int parse_list(const char *s, uint64_t *v, int max, int sizes)
{
    char buf[512], *save = NULL, *tok;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *dash = strchr(tok, '-'), *star;
        uint64_t a, b, f = 0;

        if (!dash || sizes) {
            if (sizes ? parse_size(tok, &a) : parse_size(tok, &a))
                return -1;
            if (n >= max)
                return -1;
            v[n++] = a;
            continue;
        }
        *dash++ = 0;
        star = strchr(dash, '*');
        if (star) {
            *star++ = 0;
            if (parse_size(star, &f) || f < 2)
                return -1;
        }
        if (parse_size(tok, &a) || parse_size(dash, &b) || a > b || a < 1)
            return -1;
        for (uint64_t x = a; x <= b; x = f ? x * f : x + 1) {
            if (n >= max)
                return -1;
            v[n++] = x;
        }
    }
    return n > 0 ? n : -1;
}

static int parse_modes(const char *s, struct config *c)
{
    char buf[128], *save = NULL, *tok;

    c->nmodes = 0;
    if (!strcmp(s, "all")) {
        c->modes[0] = M_DYNAMIC;
        c->modes[1] = M_DIRECT;
        c->modes[2] = M_INDIRECT;
        c->nmodes = 3;
        return 0;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int m;

        if (!strcmp(tok, "dynamic"))
            m = M_DYNAMIC;
        else if (!strcmp(tok, "direct"))
            m = M_DIRECT;
        else if (!strcmp(tok, "indirect"))
            m = M_INDIRECT;
        else
            return -1;
        if (c->nmodes >= 3)
            return -1;
        c->modes[c->nmodes++] = m;
    }
    return c->nmodes ? 0 : -1;
}

static int parse_mix(const char *s, struct config *c)
{
    char buf[256], *save = NULL, *tok;

    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        uint64_t v;

        if (!eq || parse_size(eq + 1, &v))
            return -1;
        *eq = 0;
        if (!strcmp(tok, "elephants"))
            c->elephants = (int)v;
        else if (!strcmp(tok, "mice"))
            c->mice = (int)v;
        else if (!strcmp(tok, "mice-size"))
            c->mice_size = v;
        else if (!strcmp(tok, "mice-sends"))
            c->mice_sends = (int)v;
        else
            return -1;
    }
    return c->elephants >= 1 && c->mice >= 0 && c->mice_size >= 1 && c->mice_sends >= 1 ? 0 : -1;
}

enum {
    O_LOOP = 256,
    O_ONCE,
    O_TYPE,
    O_MODE,
    O_SENDS,
    O_RECVS,
    O_RATIO,
    O_SIZE,
    O_BYTES,
    O_TIME,
    O_WAITALL,
    O_RUNS,
    O_TRANSPORT,
    O_DELAY,
    O_RATE,
    O_RCVBUF,
    O_SWEEP,
    O_CONNS,
    O_MIX,
    O_VERIFY,
    O_NOVERIFY,
    O_LAT,
    O_NOLAT,
    O_LATITERS,
    O_LATSIZE,
    O_POLL,
    O_SEED,
    O_JSON,
    O_CSV,
    O_PLOT,
    O_OUT,
    O_QUIET,
    O_INJECT,
    O_LATONLY,
    O_POLLRECV,
    O_PRESET,
    O_POINTS,
    O_MARKDOWN,
    O_ONEBUF,
    O_WAITSPIN,
    O_WAITNOTIFY,
    O_ROUNDS
};

static const struct option longopts[] = {{"server", no_argument, NULL, 's'},
                                         {"client", required_argument, NULL, 'c'},
                                         {"port", required_argument, NULL, 'p'},
                                         {"loopback", no_argument, NULL, O_LOOP},
                                         {"once", no_argument, NULL, O_ONCE},
                                         {"type", required_argument, NULL, O_TYPE},
                                         {"mode", required_argument, NULL, O_MODE},
                                         {"sends", required_argument, NULL, O_SENDS},
                                         {"recvs", required_argument, NULL, O_RECVS},
                                         {"recv-ratio", required_argument, NULL, O_RATIO},
                                         {"size", required_argument, NULL, O_SIZE},
                                         {"bytes", required_argument, NULL, O_BYTES},
                                         {"time", required_argument, NULL, O_TIME},
                                         {"waitall", no_argument, NULL, O_WAITALL},
                                         {"runs", required_argument, NULL, O_RUNS},
                                         {"transport", required_argument, NULL, O_TRANSPORT},
                                         {"delay-ms", required_argument, NULL, O_DELAY},
                                         {"rate-mbps", required_argument, NULL, O_RATE},
                                         {"rcvbuf", required_argument, NULL, O_RCVBUF},
                                         {"sweep", required_argument, NULL, O_SWEEP},
                                         {"conns", required_argument, NULL, O_CONNS},
                                         {"mix", required_argument, NULL, O_MIX},
                                         {"verify", no_argument, NULL, O_VERIFY},
                                         {"no-verify", no_argument, NULL, O_NOVERIFY},
                                         {"latency", no_argument, NULL, O_LAT},
                                         {"no-latency", no_argument, NULL, O_NOLAT},
                                         {"lat-iters", required_argument, NULL, O_LATITERS},
                                         {"lat-size", required_argument, NULL, O_LATSIZE},
                                         {"poll", no_argument, NULL, O_POLL},
                                         {"poll-recv", no_argument, NULL, O_POLLRECV},
                                         {"one-buffer", no_argument, NULL, O_ONEBUF},
                                         {"tcp-one-buffer", no_argument, NULL, O_ONEBUF},
                                         {"wait-spin", required_argument, NULL, O_WAITSPIN},
                                         {"wait-notify", no_argument, NULL, O_WAITNOTIFY},
                                         {"lat-only", no_argument, NULL, O_LATONLY},
                                         {"seed", required_argument, NULL, O_SEED},
                                         {"json", no_argument, NULL, O_JSON},
                                         {"csv", no_argument, NULL, O_CSV},
                                         {"plot", required_argument, NULL, O_PLOT},
                                         {"output", required_argument, NULL, O_OUT},
                                         {"quiet", no_argument, NULL, O_QUIET},
                                         {"inject-error", no_argument, NULL, O_INJECT},
                                         {"preset", required_argument, NULL, O_PRESET},
                                         {"points", required_argument, NULL, O_POINTS},
                                         {"markdown", no_argument, NULL, O_MARKDOWN},
                                         {"rounds", required_argument, NULL, O_ROUNDS},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};

static int bad(const char *opt, const char *val)
{
    fprintf(stderr, "blast: invalid value for %s: '%s' (blast --help)\n", opt, val);
    return -1;
}

static uint64_t g_lat_size = 64;

/* --preset: the figure's link, sizes, modes and points, unless the options set them. The x
 * value of each point (for --plot and the JSON) is its size, its depth or its sends. */
static int apply_preset(struct config *c, int set_time, int set_runs, int set_mode, int set_rounds)
{
    const struct preset *p = c->preset;
    int n = p->npts, fixed = 1, equal = 1;

    if (c->nsweep || c->elephants || c->lat_only) {
        fprintf(stderr, "blast: --preset replaces --sweep; not with --mix or --lat-only\n");
        return -1;
    }
    if (c->preset_points > 0 && c->preset_points < n)
        n = c->preset_points;
    if (n > BLAST_MAX_SWEEP)
        n = BLAST_MAX_SWEEP;
    if (c->type != T_STREAM) {
        fprintf(stderr, "blast: the paper's figures are SOCK_STREAM: not with --type\n");
        return -1;
    }
    if (parse_sizegen(p->sizegen, &c->size) < 0)
        return -1;
    if (c->delay_ms == 0 && c->rate_mbps == 0) {
        c->delay_ms = p->delay_ms;
        c->rate_mbps = p->rate_mbps;
    }
    if (!set_time && !c->bytes)
        c->seconds = p->seconds;
    if (!set_runs)
        c->runs = 1;
    if (!set_rounds)
        c->rounds = 3;
    if (!set_mode) {
        c->modes[0] = M_DIRECT, c->modes[1] = M_INDIRECT, c->modes[2] = M_DYNAMIC;
        c->nmodes = 3;
    }
    for (int i = 0; i < n; i++) {
        fixed &= p->pts[i].size != 0 && p->pts[i].group == 0;
        equal &= p->pts[i].sends == p->pts[i].recvs;
    }
    c->sweep = fixed ? SW_SIZE : equal ? SW_DEPTH : SW_SENDS;
    c->nsweep = n;
    for (int i = 0; i < n; i++)
        c->sweep_vals[i] = fixed ? p->pts[i].size : (uint64_t)p->pts[i].sends;
    return 0;
}

static int parse_args(int argc, char **argv, struct config *c)
{
    int o, set_time = 0, set_runs = 0, set_mode = 0, set_rounds = 0;
    uint64_t v;
    char *end;

    memset(c, 0, sizeof(*c));
    c->port = BLAST_DEF_PORT;
    c->type = T_STREAM;
    c->transports[0] = X_EXS;
    c->ntransports = 1;
    c->modes[0] = M_DYNAMIC;
    c->nmodes = 1;
    c->sends = c->recvs = 8;
    parse_sizegen("exp:1M:4M", &c->size);
    c->seconds = 1;
    c->runs = 3;
    c->rounds = 1;
    c->conns = 1;
    c->latency = -1;
    c->lat_iters = 2000;
    c->mice_size = 4096;
    c->mice_sends = 1;
    c->seed = 12345;
    while ((o = getopt_long(argc, argv, "sc:p:h", longopts, NULL)) != -1) {
        switch (o) {
        case 's':
            c->server = 1;
            break;
        case 'c':
            c->host = optarg;
            break;
        case 'p':
            c->port = (int)strtol(optarg, &end, 10);
            if (*end || c->port < 0 || c->port > 65533)
                return bad("-p", optarg);
            break;
        case O_LOOP:
            c->loopback = 1;
            break;
        case O_ONCE:
            c->once = 1;
            break;
        case O_TYPE:
            if (!strcmp(optarg, "stream"))
                c->type = T_STREAM;
            else if (!strcmp(optarg, "seqpacket"))
                c->type = T_SEQPACKET;
            else
                return bad("--type", optarg);
            break;
        case O_MODE:
            if (parse_modes(optarg, c))
                return bad("--mode", optarg);
            set_mode = 1;
            break;
        case O_SENDS:
        case O_RECVS:
            if (parse_size(optarg, &v) || v < 1 || v > 1024)
                return bad(o == O_SENDS ? "--sends (1..1024)" : "--recvs (1..1024)", optarg);
            *(o == O_SENDS ? &c->sends : &c->recvs) = (int)v;
            break;
        case O_RATIO:
            c->recv_ratio = strtod(optarg, &end);
            if (*end || c->recv_ratio <= 0)
                return bad("--recv-ratio", optarg);
            break;
        case O_SIZE:
            if (parse_sizegen(optarg, &c->size) || c->size.max > (1u << 30))
                return bad("--size", optarg);
            break;
        case O_BYTES:
            if (parse_size(optarg, &c->bytes) || c->bytes < 1)
                return bad("--bytes", optarg);
            break;
        case O_TIME:
            c->seconds = strtod(optarg, &end);
            if (*end || c->seconds <= 0)
                return bad("--time", optarg);
            c->bytes = 0;
            set_time = 1;
            break;
        case O_WAITALL:
            c->waitall = 1;
            break;
        case O_RUNS:
            c->runs = (int)strtol(optarg, &end, 10);
            if (*end || c->runs < 1 || c->runs > BLAST_MAX_RUNS)
                return bad("--runs", optarg);
            set_runs = 1;
            break;
        case O_ROUNDS:
            c->rounds = (int)strtol(optarg, &end, 10);
            if (*end || c->rounds < 1 || c->rounds > BLAST_MAX_ROUNDS)
                return bad("--rounds", optarg);
            set_rounds = 1;
            break;
        case O_TRANSPORT:
            if (!strcmp(optarg, "exs"))
                c->transports[0] = X_EXS, c->ntransports = 1;
            else if (!strcmp(optarg, "tcp"))
                c->transports[0] = X_TCP, c->ntransports = 1;
            else if (!strcmp(optarg, "both") || !strcmp(optarg, "exs,tcp"))
                c->transports[0] = X_EXS, c->transports[1] = X_TCP, c->ntransports = 2;
            else
                return bad("--transport", optarg);
            break;
        case O_DELAY:
            c->delay_ms = strtod(optarg, &end);
            if (*end || c->delay_ms < 0)
                return bad("--delay-ms", optarg);
            break;
        case O_RATE:
            c->rate_mbps = strtod(optarg, &end);
            if (*end || c->rate_mbps < 0)
                return bad("--rate-mbps", optarg);
            break;
        case O_RCVBUF:
            if (parse_size(optarg, &v) || v < 1024 || v > (1u << 30))
                return bad("--rcvbuf (1K..1G)", optarg);
            c->rcvbuf = (int)v;
            break;
        case O_SWEEP: {
            char *eq = strchr(optarg, '=');
            int sz = 0;

            if (!eq)
                return bad("--sweep", optarg);
            if (!strncmp(optarg, "sends=", 6))
                c->sweep = SW_SENDS;
            else if (!strncmp(optarg, "recvs=", 6))
                c->sweep = SW_RECVS;
            else if (!strncmp(optarg, "depth=", 6))
                c->sweep = SW_DEPTH;
            else if (!strncmp(optarg, "size=", 5))
                c->sweep = SW_SIZE, sz = 1;
            else
                return bad("--sweep", optarg);
            c->nsweep = parse_list(eq + 1, c->sweep_vals, BLAST_MAX_SWEEP, sz);
            if (c->nsweep < 1)
                return bad("--sweep", optarg);
            for (int i = 0; i < c->nsweep; i++)
                if (c->sweep_vals[i] < 1 || (!sz && c->sweep_vals[i] > 1024))
                    return bad("--sweep", optarg);
            break;
        }
        case O_CONNS:
            c->conns = (int)strtol(optarg, &end, 10);
            if (*end || c->conns < 1 || c->conns > BLAST_MAX_CONNS)
                return bad("--conns", optarg);
            break;
        case O_MIX:
            if (parse_mix(optarg, c))
                return bad("--mix", optarg);
            break;
        case O_VERIFY:
            c->verify = 1;
            break;
        case O_NOVERIFY:
            c->verify = 0;
            break;
        case O_LAT:
            c->latency = 1;
            break;
        case O_NOLAT:
            c->latency = 0;
            break;
        case O_LATITERS:
            c->lat_iters = (int)strtol(optarg, &end, 10);
            if (*end || c->lat_iters < 1 || c->lat_iters > 10000000)
                return bad("--lat-iters", optarg);
            break;
        case O_LATSIZE:
            if (parse_size(optarg, &g_lat_size) || g_lat_size < 1 || g_lat_size > (1u << 26))
                return bad("--lat-size", optarg);
            break;
        case O_POLL:
            c->poll |= POLL_SEND;
            break;
        case O_POLLRECV:
            c->poll |= POLL_RECV;
            break;
        case O_ONEBUF:
            c->onebuf = 1;
            break;
        case O_WAITSPIN:
            c->wait_spin = (int)strtol(optarg, &end, 10);
            if (*end || c->wait_spin < 1 || c->wait_spin > 1000000)
                return bad("--wait-spin", optarg);
            break;
        case O_WAITNOTIFY:
            c->wait_spin = -1;
            break;
        case O_LATONLY:
            c->lat_only = 1;
            break;
        case O_SEED:
            c->seed = strtoull(optarg, NULL, 0);
            break;
        case O_JSON:
            c->json = 1;
            break;
        case O_CSV:
            c->csv = 1;
            break;
        case O_PLOT:
            c->plot = optarg;
            break;
        case O_OUT:
            c->out = optarg;
            break;
        case O_QUIET:
            c->quiet = 1;
            break;
        case O_INJECT:
            c->inject = 1;
            c->verify = 1;
            break;
        case O_PRESET:
            if (!strcmp(optarg, "list")) {
                preset_list(stdout);
                exit(0);
            }
            if (!(c->preset = preset_find(optarg))) {
                fprintf(stderr, "blast: unknown preset '%s'; the presets:\n", optarg);
                preset_list(stderr);
                return -1;
            }
            break;
        case O_POINTS:
            c->preset_points = (int)strtol(optarg, &end, 10);
            if (*end || c->preset_points < 1)
                return bad("--points", optarg);
            break;
        case O_MARKDOWN:
            c->markdown = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "blast: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (c->server + !!c->host + c->loopback != 1) {
        fprintf(stderr, "blast: choose one role: -s, -c HOST or --loopback (blast --help)\n");
        return -1;
    }
    if (c->elephants)
        c->conns = c->elephants + c->mice;
    if (c->preset && apply_preset(c, set_time, set_runs, set_mode, set_rounds) < 0)
        return -1;
    if (!c->preset && (c->preset_points || c->markdown)) {
        fprintf(stderr, "blast: --points and --markdown go with --preset\n");
        return -1;
    }
    if (c->markdown && (c->json || c->csv)) {
        fprintf(stderr, "blast: --markdown excludes --json and --csv\n");
        return -1;
    }
    if (c->conns > BLAST_MAX_CONNS) {
        fprintf(stderr, "blast: at most %d connections\n", BLAST_MAX_CONNS);
        return -1;
    }
    int maxd = c->sends > c->recvs ? c->sends : c->recvs;

    for (int i = 0; i < c->nsweep && c->sweep != SW_SIZE && !c->preset; i++) {
        int d = (int)c->sweep_vals[i];

        if (c->recv_ratio > 0 && c->sweep == SW_SENDS)
            d = (int)(d * c->recv_ratio + 0.5);
        maxd = d > maxd ? d : maxd;
    }
    for (int i = 0; c->preset && i < c->nsweep; i++) {
        const struct preset_point *pp = &c->preset->pts[i];

        maxd = pp->sends > maxd ? pp->sends : maxd;
        maxd = pp->recvs > maxd ? pp->recvs : maxd;
    }
    if ((long)c->conns * maxd > 60000) {
        fprintf(stderr, "blast: --conns x outstanding operations is at most 60000 (one event "
                        "queue per process)\n");
        return -1;
    }
    uint64_t maxsz = c->sweep == SW_SIZE ? 0 : c->size.max;

    for (int i = 0; i < c->nsweep && c->sweep == SW_SIZE; i++)
        maxsz = c->sweep_vals[i] > maxsz ? c->sweep_vals[i] : maxsz;
    for (int i = 0; c->preset && i < c->nsweep; i++)
        maxsz = c->preset->pts[i].size > maxsz ? c->preset->pts[i].size : maxsz;
    if ((double)c->conns * maxd * (double)maxsz > 16.0 * (1ull << 30)) {
        fprintf(stderr, "blast: buffers of --conns x outstanding operations x largest message "
                        "exceed 16 GiB\n");
        return -1;
    }
    if (c->onebuf && c->verify && c->transports[0] == X_EXS) {
        fprintf(stderr, "blast: --one-buffer with libexs: not with --verify (the sends in "
                        "flight share the buffer the next is filled in)\n");
        return -1;
    }
    if (c->json + c->csv > 1) {
        fprintf(stderr, "blast: --json and --csv exclude each other\n");
        return -1;
    }
    if (c->plot && !c->nsweep)
        fprintf(stderr, "blast: note: --plot draws a sweep; with one point it has one dot\n");
    if (c->lat_only && !c->latency) {
        fprintf(stderr, "blast: --lat-only runs the latency test: not with --no-latency\n");
        return -1;
    }
    if (c->lat_only)
        c->latency = 1;
    if (c->latency < 0)
        c->latency = c->type == T_SEQPACKET;
    return 0;
}

static void set_emu_env(const struct config *c)
{
    char b[32];

    if (c->delay_ms > 0) {
        snprintf(b, sizeof(b), "%.0f", c->delay_ms * 1000);
        setenv("EXS_EMU_DELAY_US", b, 1);
    }
    if (c->rate_mbps > 0) {
        snprintf(b, sizeof(b), "%.0f", c->rate_mbps);
        setenv("EXS_EMU_RATE_MBPS", b, 1);
    }
}

static int init_exs(void)
{
    if (exs_init(EXS_VERSION) != EXS_VERSION) {
        fprintf(stderr, "blast: exs_init: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- the end-of-run handshake ---- */

static int ctl_fd = -1;
struct side_result *ctl_peer_result;

int ctl_server_report(struct side_result *res)
{
    char go;
    struct pollfd p = {.fd = ctl_fd, .events = POLLIN};

    res->reported = 1;
    if (write_full(ctl_fd, res, sizeof(*res)) < 0)
        return -1;
    if (poll(&p, 1, 60000) != 1 || read_full(ctl_fd, &go, 1) < 0)
        return -1;
    return 0;
}

int ctl_client_collect(struct side_result *self, struct side_result *peer)
{
    char go = 'g';

    (void)self;
    if (peer->reported)
        return 0;
    if (read_full(ctl_fd, peer, sizeof(*peer)) < 0) {
        peer->status = ECONNRESET;
        snprintf(peer->msg, sizeof(peer->msg), "lost the control connection to the receiver");
        peer->reported = 1;
        return -1;
    }
    peer->reported = 1;
    return write_full(ctl_fd, &go, 1);
}

/* ---- receiver ---- */

static int serve_control(int cfd, const struct config *c)
{
    for (;;) {
        struct run_params rp;
        struct ready_msg rm;
        struct side_result res;
        int rc;

        if (read_full(cfd, &rp, sizeof(rp)) < 0)
            return 0; /* the sender went away */
        if (rp.magic != BLAST_MAGIC || rp.version != BLAST_VERSION) {
            fprintf(stderr, "blast: receiver: bad control message (another blast version?)\n");
            return -1;
        }
        if (rp.kind == K_QUIT)
            return 0;
        if ((uint32_t)(c->delay_ms * 1000 + 0.5) != rp.delay_us ||
            (uint32_t)(c->rate_mbps + 0.5) != rp.rate_mbps)
            fprintf(stderr,
                    "blast: receiver: warning: the sender emulates delay %u us / rate "
                    "%u Mbit/s; pass the same --delay-ms/--rate-mbps to -s\n",
                    rp.delay_us, rp.rate_mbps);
        memset(&rm, 0, sizeof(rm));
        rc = rp.transport == X_TCP
                 ? tcp_server_prepare(&rp, c->port ? c->port + 2 : 0, &rm.data_port)
                 : exs_server_prepare(&rp, c->port ? c->port + 1 : 0, &rm.data_port);
        if (rc < 0) {
            rm.status = EIO;
            snprintf(rm.msg, sizeof(rm.msg), "receiver could not listen (see its stderr)");
        }
        if (write_full(cfd, &rm, sizeof(rm)) < 0 || rc < 0)
            return -1;
        memset(&res, 0, sizeof(res));
        ctl_fd = cfd;
        if (rp.transport == X_TCP)
            tcp_server_run(&rp, &res);
        else
            exs_server_run(&rp, &res);
        if (res.status)
            fprintf(stderr, "blast: %s\n", res.msg);
        if (!res.reported && write_full(cfd, &res, sizeof(res)) < 0)
            return -1;
    }
}

static int listen_control(int port, int *bound)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t sl = sizeof(sin);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 4) < 0) {
        fprintf(stderr, "blast: control listen on port %d: %s\n", port, strerror(errno));
        close(fd);
        return -1;
    }
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    *bound = ntohs(sin.sin_port);
    return fd;
}

static int run_server(const struct config *c, int lfd)
{
    int rc = 0;

    if (init_exs() < 0)
        return 1;
    for (;;) {
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

        if (cfd < 0) {
            if (errno == EINTR)
                continue;
            perror("blast: accept");
            rc = 1;
            break;
        }
        int one = 1;

        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (serve_control(cfd, c) < 0)
            rc = 1;
        close(cfd);
        if (c->once)
            break;
    }
    close(lfd);
    exs_server_cleanup();
    tcp_server_cleanup();
    exs_fini();
    return rc;
}

/* ---- sender ---- */

static int connect_control(const char *host, int port, double wait_s)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    char ps[16];
    double t0 = now_sec();

    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0) {
        fprintf(stderr, "blast: cannot resolve %s\n", host);
        return -1;
    }
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            freeaddrinfo(ai);
            return fd;
        }
        int e = errno;

        if (fd >= 0)
            close(fd);
        if (now_sec() - t0 > wait_s) {
            fprintf(stderr,
                    "blast: cannot reach the receiver at %s:%d: %s (is blast -s "
                    "running?)\n",
                    host, port, strerror(e));
            freeaddrinfo(ai);
            return -1;
        }
        usleep(50000);
    }
}

static void fill_params(const struct config *c, struct run_params *rp, int kind, int transport,
                        int mode, int sends, int recvs, const struct sizegen *sg, int run)
{
    memset(rp, 0, sizeof(*rp));
    rp->magic = BLAST_MAGIC;
    rp->version = BLAST_VERSION;
    rp->kind = (uint32_t)kind;
    rp->type = c->type;
    rp->transport = transport;
    rp->mode = mode;
    rp->sends = sends;
    rp->recvs = recvs;
    rp->waitall = c->waitall;
    rp->verify = c->verify | (c->inject ? 2 : 0);
    rp->conns = kind == K_LAT ? 1 : c->conns;
    rp->poll = c->poll;
    rp->elephants = kind == K_LAT ? 0 : c->elephants;
    rp->mice = kind == K_LAT ? 0 : c->mice;
    rp->mice_sends = c->mice_sends;
    rp->mice_size = kind == K_LAT ? 0 : c->mice_size;
    rp->rcvbuf = c->rcvbuf;
    rp->onebuf = c->onebuf;
    rp->wait_spin = c->wait_spin;
    rp->size_mean = kind == K_LAT ? g_lat_size : sg->mean;
    rp->size_max = kind == K_LAT ? g_lat_size : sg->max;
    rp->size_exp = kind == K_LAT ? 0 : sg->exp;
    rp->lat_iters = c->lat_iters;
    rp->bytes = c->bytes;
    rp->seconds = c->seconds;
    rp->delay_us = (uint32_t)(c->delay_ms * 1000 + 0.5);
    rp->rate_mbps = (uint32_t)(c->rate_mbps + 0.5);
    rp->seed = c->seed + (uint64_t)run * 1000003u;
}

/* One run: ask the receiver to get ready, send, collect both sides' results. */
static int one_run(int cfd, const struct config *c, const struct run_params *rp,
                   struct side_result *snd, struct side_result *rcv)
{
    struct ready_msg rm;
    const char *host = c->loopback ? "127.0.0.1" : c->host;

    memset(snd, 0, sizeof(*snd));
    memset(rcv, 0, sizeof(*rcv));
    if (write_full(cfd, rp, sizeof(*rp)) < 0 || read_full(cfd, &rm, sizeof(rm)) < 0) {
        fprintf(stderr, "blast: lost the control connection to the receiver\n");
        return -1;
    }
    if (rm.status) {
        fprintf(stderr, "blast: %s\n", rm.msg);
        return -1;
    }
    ctl_fd = cfd;
    ctl_peer_result = rcv;
    if (rp->transport == X_TCP)
        tcp_client_run(rp, host, rm.data_port, snd);
    else
        exs_client_run(rp, host, rm.data_port, snd);
    if (snd->status && !rcv->reported) { /* the receiver may still wait for us: not long */
        struct pollfd p = {.fd = cfd, .events = POLLIN};

        if (poll(&p, 1, 3000) != 1) {
            fprintf(stderr, "blast: %s\n", snd->msg);
            return -1;
        }
    }
    if (!rcv->reported && read_full(cfd, rcv, sizeof(*rcv)) < 0) {
        fprintf(stderr, "blast: lost the control connection to the receiver%s%s\n",
                snd->status ? "; sender: " : "", snd->status ? snd->msg : "");
        return -1;
    }
    if (snd->status || rcv->status) {
        if (snd->status)
            fprintf(stderr, "blast: %s\n", snd->msg);
        if (rcv->status)
            fprintf(stderr, "blast: %s\n", rcv->msg);
        return -1;
    }
    if (rp->kind == K_XFER && snd->bytes != rcv->bytes) {
        fprintf(stderr,
                "blast: DATA ERROR: the sender completed %llu bytes, the receiver got "
                "%llu\n",
                (unsigned long long)snd->bytes, (unsigned long long)rcv->bytes);
        return -1;
    }
    if (rp->kind == K_XFER && rp->type == T_SEQPACKET && rp->transport == X_EXS &&
        snd->messages != rcv->messages) {
        fprintf(stderr, "blast: DATA ERROR: %llu messages sent, %llu received\n",
                (unsigned long long)snd->messages, (unsigned long long)rcv->messages);
        return -1;
    }
    return 0;
}

static double pct(double cpu, double wall)
{
    return wall > 0 ? 100.0 * cpu / wall : 0;
}

static int measure_point(int cfd, const struct config *c, int transport, int mode, int sends,
                         int recvs, const struct sizegen *sg, uint64_t sweep_val, struct result *r,
                         int idx, int total)
{
    double tp[BLAST_MAX_RUNS], mps[BLAST_MAX_RUNS], cs[BLAST_MAX_RUNS], cr[BLAST_MAX_RUNS];
    double secs[BLAST_MAX_RUNS], dummy;
    struct run_params rp;
    struct side_result snd, rcv;

    memset(r, 0, sizeof(*r));
    r->transport = transport;
    r->mode = mode;
    r->type = c->type;
    r->sends = sends;
    r->recvs = recvs;
    r->conns = c->conns;
    r->waitall = c->waitall;
    r->verify = c->verify;
    r->runs = c->lat_only ? 0 : c->runs;
    r->elephants = c->elephants;
    r->mice = c->mice;
    r->mice_size = c->mice_size;
    r->size_mean = sg->mean;
    r->size_max = sg->max;
    r->size_exp = sg->exp;
    r->sweep_val = sweep_val;
    for (int run = 0; run < c->runs && !c->lat_only; run++) {
        if (!c->quiet)
            progress("[%d/%d] %s %s sends %d recvs %d: run %d/%d", idx + 1, total,
                     transport_name(transport), transport == X_TCP ? "-" : mode_name(mode), sends,
                     recvs, run + 1, c->runs);
        fill_params(c, &rp, K_XFER, transport, mode, sends, recvs, sg, run);
        if (one_run(cfd, c, &rp, &snd, &rcv) < 0)
            return -1;
        secs[run] = snd.seconds;
        tp[run] = snd.seconds > 0 ? snd.bytes * 8.0 / snd.seconds / 1e9 : 0;
        mps[run] = snd.seconds > 0 ? snd.messages / snd.seconds : 0;
        cs[run] = pct(snd.cpu_sec, snd.wall_sec);
        cr[run] = pct(rcv.cpu_sec, rcv.wall_sec);
        uint64_t dir = snd.direct + (c->type == T_SEQPACKET ? rcv.direct : 0);

        r->bytes += snd.bytes;
        r->messages += snd.messages;
        r->direct += (double)dir / c->runs;
        r->indirect += (double)snd.indirect / c->runs;
        r->switches += (double)snd.switches / c->runs;
        r->dtime_ms += snd.dtime_us / 1e3 / c->runs;
        r->itime_ms += snd.itime_us / 1e3 / c->runs;
        r->drains_rcv += (double)rcv.drains / c->runs;
        r->drains_snd += (double)snd.drains / c->runs;
        r->resizes += (double)rcv.resizes / c->runs;
        r->ring_size += (double)rcv.ring_size / c->runs;
        r->direct_ratio +=
            (dir + snd.indirect ? (double)dir / (double)(dir + snd.indirect) : 0) / c->runs;
        for (int k = 0; k < 2; k++) {
            r->cls_bytes[k] += snd.cls_bytes[k];
            r->cls_msgs[k] += snd.cls_msgs[k];
            if (snd.cls_seconds[k] > 0) {
                r->cls_tput[k] += snd.cls_bytes[k] * 8.0 / snd.cls_seconds[k] / 1e9 / c->runs;
                r->cls_mps[k] += snd.cls_msgs[k] / snd.cls_seconds[k] / c->runs;
            }
            r->cls_p50[k] += snd.cls_p50_us[k] / c->runs;
            r->cls_p99[k] += snd.cls_p99_us[k] / c->runs;
        }
    }
    if (!c->lat_only) {
        mean_ci95(tp, c->runs, &r->tput_mean, &r->tput_ci);
        mean_ci95(mps, c->runs, &r->mps_mean, &dummy);
        mean_ci95(secs, c->runs, &r->secs_mean, &dummy);
        mean_ci95(cs, c->runs, &r->cpu_send, &r->cpu_send_ci);
        mean_ci95(cr, c->runs, &r->cpu_recv, &r->cpu_recv_ci);
    }
    if (c->latency) {
        if (!c->quiet)
            progress("[%d/%d] %s %s: ping-pong x %d", idx + 1, total, transport_name(transport),
                     transport == X_TCP ? "-" : mode_name(mode), c->lat_iters);
        fill_params(c, &rp, K_LAT, transport, mode, 1, 1, sg, 0);
        if (one_run(cfd, c, &rp, &snd, &rcv) < 0)
            return -1;
        r->has_lat = 1;
        r->lat_p50 = snd.lat_p50_us;
        r->lat_p99 = snd.lat_p99_us;
        r->lat_p999 = snd.lat_p999_us;
        r->lat_mean = snd.lat_mean_us;
        r->lat_count = snd.lat_count;
    }
    progress_end();
    return 0;
}

/* One point in each of the nm modes. With --rounds N the modes run N times, interleaved,
 * the order rotating each round (so no mode always runs first or last), and each mode keeps
 * its round of median throughput whole: on a shared machine two runs of the same behaviour
 * differ by far more than one run's confidence interval says. */
static int measure_modes(int cfd, const struct config *c, int transport, int nm, int sends,
                         int recvs, const struct sizegen *sg, uint64_t sweep_val,
                         struct result *out, int idx, int total)
{
    static struct result rr[BLAST_MAX_ROUNDS][3];
    int rounds = c->lat_only ? 1 : c->rounds;

    if (rounds <= 1) {
        for (int m = 0; m < nm; m++)
            if (measure_point(cfd, c, transport, c->modes[m], sends, recvs, sg, sweep_val, &out[m],
                              idx + m, total) < 0)
                return -1;
        return 0;
    }
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < nm; k++) {
            int m = (k + r) % nm;

            if (measure_point(cfd, c, transport, c->modes[m], sends, recvs, sg, sweep_val,
                              &rr[r][m], idx + m, total) < 0)
                return -1;
        }
    for (int m = 0; m < nm; m++) {
        int order[BLAST_MAX_RUNS];

        for (int r = 0; r < rounds; r++)
            order[r] = r;
        for (int i = 1; i < rounds; i++) /* insertion sort by throughput */
            for (int j = i; j > 0 && rr[order[j]][m].tput_mean < rr[order[j - 1]][m].tput_mean;
                 j--) {
                int x = order[j];

                order[j] = order[j - 1];
                order[j - 1] = x;
            }
        out[m] = rr[order[(rounds - 1) / 2]][m];
        out[m].nrounds = rounds;
        for (int r = 0; r < rounds; r++)
            out[m].round_tput[r] = rr[r][m].tput_mean;
    }
    return 0;
}

static int run_client(const struct config *c, const char *host, int port, struct result **out,
                      int *nout)
{
    int npts = c->nsweep ? c->nsweep : 1, total = 0, n = 0, rc = 0;
    int cfd = connect_control(host, port, c->loopback ? 10 : 3);
    struct result *res;

    if (cfd < 0)
        return -1;
    for (int t = 0; t < c->ntransports; t++)
        total += c->transports[t] == X_TCP ? npts : npts * c->nmodes;
    res = calloc((size_t)total, sizeof(*res));
    for (int p = 0; p < npts && !rc; p++) {
        int sends = c->sends, recvs = c->recvs;
        struct sizegen sg = c->size;
        uint64_t sv = c->nsweep ? c->sweep_vals[p] : 0;

        if (c->preset) {
            const struct preset_point *pp = &c->preset->pts[p];

            sends = pp->sends;
            recvs = pp->recvs;
            if (pp->size) {
                sg.exp = 0;
                sg.mean = sg.max = pp->size;
            }
        }
        switch (c->preset ? SW_NONE : c->sweep) {
        case SW_SENDS:
            sends = (int)sv;
            if (c->recv_ratio > 0)
                recvs = (int)(sv * c->recv_ratio + 0.5);
            break;
        case SW_RECVS:
            recvs = (int)sv;
            break;
        case SW_DEPTH:
            sends = recvs = (int)sv;
            break;
        case SW_SIZE:
            sg.exp = 0;
            sg.mean = sg.max = sv;
            break;
        default:
            break;
        }
        if (recvs > 1024)
            recvs = 1024;
        for (int t = 0; t < c->ntransports && !rc; t++) {
            int nm = c->transports[t] == X_TCP ? 1 : c->nmodes;

            if (measure_modes(cfd, c, c->transports[t], nm, sends, recvs, &sg, sv, &res[n], n,
                              total) < 0) {
                rc = -1;
            } else {
                for (int m = 0; m < nm; m++)
                    res[n + m].point = c->preset ? p : -1;
                n += nm;
            }
        }
    }
    struct run_params q;

    memset(&q, 0, sizeof(q));
    q.magic = BLAST_MAGIC;
    q.version = BLAST_VERSION;
    q.kind = K_QUIT;
    write_full(cfd, &q, sizeof(q));
    close(cfd);
    *out = res;
    *nout = n;
    return rc;
}

static int report(const struct config *c, const struct result *r, int n)
{
    FILE *f = stdout;
    int rc = 0;

    if (c->out && !(f = fopen(c->out, "w"))) {
        fprintf(stderr, "blast: %s: %s\n", c->out, strerror(errno));
        return -1;
    }
    if (c->json)
        report_json(f, c, r, n);
    else if (c->preset && !c->csv)
        report_preset(f, c, r, n);
    else if (c->csv)
        report_csv(f, c, r, n);
    else
        report_table(f, c, r, n);
    if (f != stdout)
        fclose(f);
    else
        fflush(f);
    if (c->plot && n > 0)
        rc = report_plot(c->plot, c, r, n);
    return rc;
}

int main(int argc, char **argv)
{
    struct config c;
    struct result *res = NULL;
    int n = 0, rc;

    signal(SIGPIPE, SIG_IGN);
    if (parse_args(argc, argv, &c) < 0)
        return 2;
    progress_off = c.quiet;
    set_emu_env(&c);
    if (c.server) {
        int bound, lfd = listen_control(c.port, &bound);

        if (lfd < 0)
            return 1;
        fprintf(stderr, "blast: receiver listening on port %d (data: exs %d, tcp %d)\n", bound,
                bound + 1, bound + 2);
        return run_server(&c, lfd);
    }
    if (c.loopback) {
        /* The receiver is a child process: each side's CPU use is its own. The child is
         * forked before exs_init, so each process has its own library instance. */
        int bound, lfd = listen_control(0, &bound);
        pid_t pid;
        struct config sc = c;

        if (lfd < 0)
            return 1;
        sc.server = 1;
        sc.once = 1;
        sc.port = 0; /* data listeners on ephemeral ports too */
        fflush(NULL);
        pid = fork();
        if (pid < 0) {
            perror("blast: fork");
            return 1;
        }
        if (pid == 0)
            _exit(run_server(&sc, lfd));
        close(lfd);
        if (init_exs() < 0)
            return 1;
        rc = run_client(&c, "127.0.0.1", bound, &res, &n);
        exs_fini();
        int st = 0;

        for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++)
            usleep(100000);
        if (waitpid(pid, &st, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "blast: the receiver process did not exit; killed\n");
            rc = -1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "blast: the receiver process failed (status %d)\n", st);
            rc = -1;
        }
    } else {
        if (init_exs() < 0)
            return 1;
        rc = run_client(&c, c.host, c.port, &res, &n);
        exs_fini();
    }
    if (n > 0 && report(&c, res, n) < 0)
        rc = -1;
    free(res);
    if (rc < 0)
        fprintf(stderr, "blast: FAILED\n");
    return rc < 0 ? 1 : 0;
}
