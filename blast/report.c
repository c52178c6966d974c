/* SPDX-License-Identifier: MIT */
/* blast: the report: fixed-width table, JSON, CSV, and a gnuplot chart of sweeps. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blast/blast.h"

const char *type_name(int t)
{
    return t == T_SEQPACKET ? "seqpacket" : "stream";
}

const char *mode_name(int m)
{
    return m == M_DIRECT ? "direct" : m == M_INDIRECT ? "indirect" : "dynamic";
}

const char *transport_name(int x)
{
    return x == X_TCP ? "tcp" : "exs";
}

const char *sweep_name(int s)
{
    switch (s) {
    case SW_SENDS:
        return "sends";
    case SW_RECVS:
        return "recvs";
    case SW_SIZE:
        return "size";
    case SW_DEPTH:
        return "depth";
    default:
        return "none";
    }
}

static const char *rmode(const struct result *r)
{
    return r->transport == X_TCP ? "-" : mode_name(r->mode);
}

static void size_str(char *b, size_t n, const struct result *r)
{
    if (r->size_exp)
        snprintf(b, n, "exp:%llu:%llu", (unsigned long long)r->size_mean,
                 (unsigned long long)r->size_max);
    else
        snprintf(b, n, "%llu", (unsigned long long)r->size_mean);
}

static void human(char *b, size_t n, uint64_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(b, n, "%lluM", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(b, n, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(b, n, "%llu", (unsigned long long)v);
}

static void size_short(char *b, size_t n, const struct result *r)
{
    char m[24], x[24];

    human(m, sizeof(m), r->size_mean);
    human(x, sizeof(x), r->size_max);
    if (r->size_exp)
        snprintf(b, n, "exp:%s:%s", m, x);
    else
        snprintf(b, n, "%s", m);
}

void report_table(FILE *f, const struct config *c, const struct result *r, int n)
{
    int lat = 0;

    for (int i = 0; i < n; i++)
        lat |= r[i].has_lat;
    if (c->lat_only)
        fprintf(f, "# blast: type %s, ping-pong only (--lat-only): %d round trips per line\n",
                type_name(c->type), c->lat_iters);
    else
        fprintf(f, "# blast: type %s, %d connection(s)%s, %d run(s) per line, %s per run%s%s\n",
                type_name(c->type), c->conns, c->elephants ? " (mix)" : "", c->runs,
                c->bytes ? "bytes" : "time", c->waitall ? ", MSG_WAITALL" : "",
                c->verify ? ", data verified" : "");
    if (c->delay_ms > 0 || c->rate_mbps > 0)
        fprintf(f,
                "# emulated link (exs tcp provider only): one-way delay %.3g ms, rate %.0f "
                "Mbit/s (0 = none); the tcp transport is NOT emulated\n",
                c->delay_ms, c->rate_mbps);
    fprintf(f, "# Gbit/s = user bytes x 8 / (first send posted .. last send completed), at the "
               "sender; +-: 95%% CI (t) over runs\n");
    fprintf(f, "# cpu%%: user+sys of each process / its wall time, 100 = one core; direct, "
               "indirect, switches: per run, from EXS_SO_STATS\n");
    fprintf(f, "# dir_ms, ind_ms: sender time in direct / indirect phases; drains: return-to-"
               "direct requests of the receiver; ring_K: receiver ring at the end (KiB), resized: "
               "ring size changes (per run)\n");
    if (lat)
        fprintf(f, "# lat: ping-pong round trip of %s, microseconds\n", "--lat-size bytes");
    fprintf(f,
            "#%-4s %-8s %5s %5s %-14s %5s %9s %8s %10s %9s %9s %6s %8s %6s %6s %8s %8s %7s "
            "%7s %7s",
            "xprt", "mode", "sends", "recvs", "size", "conns", "Gbit/s", "+-ci95", "msg/s",
            "direct", "indirect", "d_rat", "switches", "cpu_s%", "cpu_r%", "dir_ms", "ind_ms",
            "drains", "ring_K", "resized");
    if (lat)
        fprintf(f, " %8s %8s %8s", "lat_p50", "lat_p99", "p99.9");
    fprintf(f, "\n");
    for (int i = 0; i < n; i++) {
        const struct result *x = &r[i];
        char sz[64];

        size_short(sz, sizeof(sz), x);
        fprintf(f,
                " %-4s %-8s %5d %5d %-14s %5d %9.3f %8.3f %10.0f %9.0f %9.0f %6.3f %8.1f "
                "%6.1f %6.1f",
                transport_name(x->transport), rmode(x), x->sends, x->recvs, sz, x->conns,
                x->tput_mean, x->tput_ci, x->mps_mean, x->direct, x->indirect, x->direct_ratio,
                x->switches, x->cpu_send, x->cpu_recv);
        fprintf(f, " %8.1f %8.1f %7.1f %7.0f %7.1f", x->dtime_ms, x->itime_ms, x->drains_rcv,
                x->ring_size / 1024, x->resizes);
        if (lat) {
            if (x->has_lat)
                fprintf(f, " %8.1f %8.1f %8.1f", x->lat_p50, x->lat_p99, x->lat_p999);
            else
                fprintf(f, " %8s %8s %8s", "-", "-", "-");
        }
        fprintf(f, "\n");
        if (x->elephants) {
            static const char *cls[2] = {"elephants", "mice"};

            for (int k = 0; k < 2; k++)
                fprintf(f,
                        "#   %-9s %3d conns: %9.3f Gbit/s %10.0f msg/s, send completion "
                        "p50 %.1f us p99 %.1f us\n",
                        cls[k], k ? x->mice : x->elephants, x->cls_tput[k], x->cls_mps[k],
                        x->cls_p50[k], x->cls_p99[k]);
        }
    }
}

static void json_result(FILE *f, const struct config *c, const struct result *x)
{
    char sz[64];
    double runs = x->runs ? x->runs : 1;

    size_str(sz, sizeof(sz), x);
    fprintf(f, "    {\"throughput_gbps\": %.6f, \"throughput_ci95_gbps\": %.6f, ", x->tput_mean,
            x->tput_ci);
    fprintf(f, "\"bytes\": %.0f, \"messages\": %.0f, \"seconds\": %.6f, ", x->bytes / runs,
            x->messages / runs, x->secs_mean);
    fprintf(f,
            "\"messages_per_sec\": %.1f, \"direct_xfers\": %.1f, \"indirect_xfers\": %.1f, "
            "\"direct_ratio\": %.6f, \"mode_switches\": %.2f, ",
            x->mps_mean, x->direct, x->indirect, x->direct_ratio, x->switches);
    fprintf(f,
            "\"direct_time_ms\": %.3f, \"indirect_time_ms\": %.3f, "
            "\"drain_requests_sent\": %.2f, \"drain_requests_honoured\": %.2f, "
            "\"ring_resizes\": %.2f, \"ring_size\": %.0f,\n     ",
            x->dtime_ms, x->itime_ms, x->drains_rcv, x->drains_snd, x->resizes, x->ring_size);
    if (x->nrounds > 1) {
        fprintf(f, "\"rounds\": %d, \"round_throughputs_gbps\": [", x->nrounds);
        for (int r = 0; r < x->nrounds; r++)
            fprintf(f, "%s%.6f", r ? ", " : "", x->round_tput[r]);
        fprintf(f, "], ");
    }
    if (c->preset && x->point >= 0) {
        const struct preset_point *pp = &c->preset->pts[x->point];

        fprintf(f, "\"preset\": \"%s\", \"point\": %d, \"paper\": \"%s\", ", c->preset->name,
                x->point, pp->paper);
        if (pp->paper_ratio >= 0)
            fprintf(f, "\"paper_direct_ratio\": %.6f, ", pp->paper_ratio);
    }
    fprintf(f,
            "\"cpu_send_pct\": %.2f, \"cpu_send_ci95_pct\": %.2f, \"cpu_recv_pct\": %.2f, "
            "\"cpu_recv_ci95_pct\": %.2f,\n     ",
            x->cpu_send, x->cpu_send_ci, x->cpu_recv, x->cpu_recv_ci);
    fprintf(f,
            "\"type\": \"%s\", \"transport\": \"%s\", \"mode\": \"%s\", \"sends\": %d, "
            "\"recvs\": %d, \"size\": \"%s\", \"size_mean\": %llu, \"size_max\": %llu, "
            "\"conns\": %d, \"waitall\": %s, \"verify\": %s, \"runs\": %d, ",
            type_name(x->type), transport_name(x->transport), rmode(x), x->sends, x->recvs, sz,
            (unsigned long long)x->size_mean, (unsigned long long)x->size_max, x->conns,
            x->waitall ? "true" : "false", x->verify ? "true" : "false", x->runs);
    if (c->bytes)
        fprintf(f, "\"bytes_per_run\": %llu, ", (unsigned long long)c->bytes);
    else
        fprintf(f, "\"time_per_run\": %.3f, ", c->seconds);
    fprintf(f,
            "\"delay_ms\": %.3f, \"rate_mbps\": %.0f, \"emulated\": %s, \"rcvbuf\": %d, "
            "\"sweep\": \"%s\", \"sweep_value\": %llu",
            c->delay_ms, c->rate_mbps,
            x->transport == X_EXS && (c->delay_ms > 0 || c->rate_mbps > 0) ? "true" : "false",
            c->rcvbuf, sweep_name(c->sweep), (unsigned long long)x->sweep_val);
    if (x->elephants) {
        static const char *cls[2] = {"elephants", "mice"};

        fprintf(f, ",\n     \"classes\": {");
        for (int k = 0; k < 2; k++)
            fprintf(f,
                    "%s\"%s\": {\"conns\": %d, \"size\": %llu, \"throughput_gbps\": %.6f, "
                    "\"bytes\": %.0f, \"messages\": %.0f, \"messages_per_sec\": %.1f, "
                    "\"send_p50_us\": %.1f, \"send_p99_us\": %.1f}",
                    k ? ", " : "", cls[k], k ? x->mice : x->elephants,
                    (unsigned long long)(k ? x->mice_size : x->size_mean), x->cls_tput[k],
                    x->cls_bytes[k] / runs, x->cls_msgs[k] / runs, x->cls_mps[k], x->cls_p50[k],
                    x->cls_p99[k]);
        fprintf(f, "}");
    }
    if (x->has_lat)
        fprintf(f,
                ",\n     \"latency_us\": {\"p50\": %.2f, \"p99\": %.2f, \"p999\": %.2f, "
                "\"mean\": %.2f, \"count\": %llu}",
                x->lat_p50, x->lat_p99, x->lat_p999, x->lat_mean, (unsigned long long)x->lat_count);
    fprintf(f, "}");
}

void report_json(FILE *f, const struct config *c, const struct result *r, int n)
{
    fprintf(f,
            "{\n  \"tool\": \"blast\", \"measured_at\": \"sender\", \"type\": \"%s\", "
            "\"sweep\": \"%s\",",
            type_name(c->type), sweep_name(c->sweep));
    if (c->preset)
        fprintf(f, " \"preset\": \"%s\", \"paper\": \"%s\",", c->preset->name, c->preset->paper);
    fprintf(f, "\n  \"results\": [\n");
    for (int i = 0; i < n; i++) {
        json_result(f, c, &r[i]);
        fprintf(f, "%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

void report_csv(FILE *f, const struct config *c, const struct result *r, int n)
{
    fprintf(f, "type,transport,mode,sends,recvs,size,conns,waitall,runs,sweep,sweep_value,"
               "throughput_gbps,throughput_ci95_gbps,bytes,messages,seconds,messages_per_sec,"
               "direct_xfers,indirect_xfers,direct_ratio,mode_switches,cpu_send_pct,cpu_recv_pct,"
               "lat_p50_us,lat_p99_us,lat_p999_us,elephant_gbps,mice_gbps,mice_p99_us,"
               "direct_time_ms,indirect_time_ms,drain_requests_sent,ring_resizes,ring_size\n");
    for (int i = 0; i < n; i++) {
        const struct result *x = &r[i];
        char sz[64];
        double runs = x->runs ? x->runs : 1;

        size_str(sz, sizeof(sz), x);
        fprintf(f,
                "%s,%s,%s,%d,%d,%s,%d,%d,%d,%s,%llu,%.6f,%.6f,%.0f,%.0f,%.6f,%.1f,%.1f,%.1f,"
                "%.6f,%.2f,%.2f,%.2f,",
                type_name(x->type), transport_name(x->transport), rmode(x), x->sends, x->recvs, sz,
                x->conns, x->waitall, x->runs, sweep_name(c->sweep),
                (unsigned long long)x->sweep_val, x->tput_mean, x->tput_ci, x->bytes / runs,
                x->messages / runs, x->secs_mean, x->mps_mean, x->direct, x->indirect,
                x->direct_ratio, x->switches, x->cpu_send, x->cpu_recv);
        if (x->has_lat)
            fprintf(f, "%.2f,%.2f,%.2f,", x->lat_p50, x->lat_p99, x->lat_p999);
        else
            fprintf(f, ",,,");
        if (x->elephants)
            fprintf(f, "%.6f,%.6f,%.1f,", x->cls_tput[0], x->cls_tput[1], x->cls_p99[1]);
        else
            fprintf(f, ",,,");
        fprintf(f, "%.3f,%.3f,%.2f,%.2f,%.0f\n", x->dtime_ms, x->itime_ms, x->drains_rcv,
                x->resizes, x->ring_size);
    }
}

/* A plot line: (group of the preset point, transport, mode). */
static int plot_key(const struct config *c, const struct result *x)
{
    int grp = c->preset && x->point >= 0 ? c->preset->pts[x->point].group : 0;

    return (grp * 2 + x->transport) * 3 + (x->transport == X_TCP ? 0 : x->mode);
}

/* "4K " for a line of one message size of a preset with several (Fig. 11), else "". */
static void group_label(char *b, size_t n, const struct config *c, int grp)
{
    const struct preset *ps = c->preset;

    b[0] = 0;
    if (!ps || ps->pts[ps->npts - 1].group == 0)
        return;
    for (int i = 0; i < ps->npts; i++) {
        if (ps->pts[i].group == grp && ps->pts[i].size) {
            human(b, n - 1, ps->pts[i].size);
            strcat(b, " ");
            return;
        }
    }
}

/* Two panels: throughput and direct ratio against the swept value, one line per
 * (transport, mode). */
int report_plot(const char *png, const struct config *c, const struct result *r, int n)
{
    char dat[] = "/tmp/blast-plot-XXXXXX";
    int fd = mkstemp(dat);
    FILE *d, *g;
    int series[64], ns = 0, rc, paper = 0;
    uint64_t lo = UINT64_MAX, hi = 0;
    const struct preset *ps = c->preset;

    if (fd < 0 || !(d = fdopen(fd, "w"))) {
        fprintf(stderr, "blast: --plot: temporary file: %s\n", strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int key = plot_key(c, &r[i]), seen = 0;

        for (int k = 0; k < ns; k++)
            seen |= series[k] == key;
        if (!seen && ns < (int)(sizeof(series) / sizeof(series[0])))
            series[ns++] = key;
    }
    for (int k = 0; k < ns; k++) {
        for (int i = 0; i < n; i++) {
            int key = plot_key(c, &r[i]);
            uint64_t x = c->nsweep ? r[i].sweep_val : (uint64_t)i + 1;

            if (key != series[k])
                continue;
            if (x < lo)
                lo = x;
            if (x > hi)
                hi = x;
            fprintf(d, "%llu %.6f %.6f %.6f\n", (unsigned long long)x, r[i].tput_mean, r[i].tput_ci,
                    r[i].direct_ratio);
        }
        fprintf(d, "\n\n");
    }
    /* The paper's direct ratios (Table III) as one more data set, on the ratio panel. */
    for (int i = 0; ps && i < c->nsweep; i++) {
        if (ps->pts[i].paper_ratio < 0)
            continue;
        fprintf(d, "%llu 0 0 %.6f\n", (unsigned long long)c->sweep_vals[i], ps->pts[i].paper_ratio);
        paper = 1;
    }
    fclose(d);
    g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "blast: --plot: cannot run gnuplot: %s\n", strerror(errno));
        unlink(dat);
        return -1;
    }
    fprintf(g, "set terminal pngcairo size 1200,500 noenhanced\nset output '%s'\n", png);
    if (ps)
        fprintf(g, "set multiplot layout 1,2 title 'blast --preset %s: %s'\n", ps->name, ps->title);
    else
        fprintf(g, "set multiplot layout 1,2 title 'blast %s, %s sweep'\n", type_name(c->type),
                sweep_name(c->sweep));
    fprintf(g, "set xlabel '%s'\nset grid\nset key bottom right\n",
            c->nsweep ? (c->sweep == SW_SIZE    ? "message size (bytes)"
                         : c->sweep == SW_DEPTH ? "outstanding operations (sends = recvs)"
                         : c->sweep == SW_SENDS ? "outstanding sends"
                                                : "outstanding receives")
                      : "point");
    if (hi >= 8 * lo)
        fprintf(g, "set logscale x 2\n");
    fprintf(g, "set ylabel 'throughput (Gbit/s)'\nset yrange [0:*]\n");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            fprintf(g, "set ylabel 'direct / total transfers'\nset yrange [0:1.05]\n");
        fprintf(g, "plot ");
        for (int k = 0; k < ns; k++) {
            int x = series[k] / 3 % 2, m = series[k] % 3, grp = series[k] / 6;
            char t[64];

            group_label(t, sizeof(t), c, grp);
            if (pass == 0)
                fprintf(g, "%s'%s' index %d using 1:2:3 with yerrorlines title '%s%s %s'",
                        k ? ", " : "", dat, k, t, transport_name(x),
                        x == X_TCP ? "" : mode_name(m));
            else
                fprintf(g, "%s'%s' index %d using 1:4 with linespoints title '%s%s %s'",
                        k ? ", " : "", dat, k, t, transport_name(x),
                        x == X_TCP ? "" : mode_name(m));
        }
        if (pass == 1 && paper)
            fprintf(g,
                    ", '%s' index %d using 1:4 with points pt 7 ps 1.5 title 'paper, dynamic "
                    "(Table III / text)'",
                    dat, ns);
        fprintf(g, "\n");
    }
    fprintf(g, "unset multiplot\n");
    rc = pclose(g);
    unlink(dat);
    if (rc != 0) {
        fprintf(stderr, "blast: --plot: gnuplot failed (status %d)\n", rc);
        return -1;
    }
    return 0;
}

/* The result of `mode` at preset point `p`, or NULL. */
static const struct result *at(const struct result *r, int n, int p, int mode)
{
    for (int i = 0; i < n; i++)
        if (r[i].point == p && r[i].transport == X_EXS && r[i].mode == mode)
            return &r[i];
    return NULL;
}

/* The kernel-TCP baseline at preset point `p` (--transport both), or NULL. */
static const struct result *tcp_at(const struct result *r, int n, int p)
{
    for (int i = 0; i < n; i++)
        if (r[i].point == p && r[i].transport == X_TCP)
            return &r[i];
    return NULL;
}

static void gbps(char *b, size_t n, const struct result *x)
{
    if (x)
        snprintf(b, n, "%.2f", x->tput_mean);
    else
        snprintf(b, n, "-");
}

/* --preset: one line per point, the three modes side by side, the paper's value last. */
void report_preset(FILE *f, const struct config *c, const struct result *r, int n)
{
    const struct preset *ps = c->preset;
    int md = c->markdown, good = 0, judged = 0, direct = 0, ndyn = 0, dtime = 0, tcp = 0;
    char amount[48], rounds[64] = "";

    for (int k = 0; k < n; k++)
        tcp |= r[k].transport == X_TCP && r[k].point >= 0;

    if (c->bytes)
        snprintf(amount, sizeof(amount), "%llu bytes", (unsigned long long)c->bytes);
    else
        snprintf(amount, sizeof(amount), "%.1f s", c->seconds);
    if (c->rounds > 1)
        snprintf(rounds, sizeof(rounds), ", the median of %d interleaved rounds", c->rounds);

    if (md) {
        fprintf(f,
                "`blast --loopback --preset %s` (%d run(s) of %s per mode and point%s%s%s; "
                "%s%s)\n\n",
                ps->name, c->runs, amount, rounds, c->delay_ms > 0 ? ", emulated delay" : "",
                c->rate_mbps > 0 ? " and rate" : "", ps->title,
                tcp && (c->delay_ms > 0 || c->rate_mbps > 0) ? "; kernel TCP is not emulated" : "");
        fprintf(f,
                "| sends/recvs | size | direct-only Gbit/s | indirect-only | dynamic | "
                "dynamic / best | dynamic direct ratio | dynamic direct time | switches | "
                "drain requests | ring KiB | "
                "receiver CPU %% dir/ind/dyn | %spaper |\n",
                tcp ? "kernel TCP Gbit/s | " : "");
        fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", tcp ? "---|" : "");
    } else {
        fprintf(f, "# blast --preset %s: %s\n", ps->name, ps->title);
        fprintf(f, "# paper (from its text and Table III; no values read off plots): %s\n",
                ps->paper);
        fprintf(f, "# ours: %d run(s) of %s per mode and point%s", c->runs, amount, rounds);
        if (c->delay_ms > 0 || c->rate_mbps > 0)
            fprintf(f, ", emulated link: one-way delay %.3g ms, rate %.0f Mbit/s%s", c->delay_ms,
                    c->rate_mbps, tcp ? " (the tcp column is NOT emulated)" : "");
        if (c->rcvbuf)
            fprintf(f, ", SO_RCVBUF %d", c->rcvbuf);
        fprintf(f,
                "\n# Gbit/s per mode; dyn/best = dynamic / the better fixed mode; d_ratio, "
                "d_time, switches, drains, ring_K: the dynamic mode's (d_time: the sender's share "
                "of time in direct phases); cpu_r%%: receiver, direct/indirect/dynamic\n");
        fprintf(f, "#%-11s %-9s %8s %8s %8s %8s %7s %7s %8s %7s %7s %-14s %s%s\n", "sends/recvs",
                "size", "direct", "indirect", "dynamic", "dyn/best", "d_ratio", "d_time",
                "switches", "drains", "ring_K", "cpu_r%", tcp ? "     tcp " : "", "paper");
    }
    for (int p = 0; p < c->nsweep; p++) {
        const struct result *d = at(r, n, p, M_DIRECT), *i = at(r, n, p, M_INDIRECT);
        const struct result *y = at(r, n, p, M_DYNAMIC), *any = d ? d : i ? i : y;
        const struct preset_point *pp = &ps->pts[p];
        char sr[24], sz[64], gd[24], gi[24], gy[24], gt[24], rel[24], cpu[48], dt[24] = "-";
        double best = 0;

        if (!any)
            continue;
        snprintf(sr, sizeof(sr), "%d/%d", pp->sends, pp->recvs);
        size_short(sz, sizeof(sz), any);
        gbps(gd, sizeof(gd), d);
        gbps(gi, sizeof(gi), i);
        gbps(gy, sizeof(gy), y);
        gbps(gt, sizeof(gt), tcp_at(r, n, p));
        best = d && (!i || d->tput_mean > i->tput_mean) ? d->tput_mean : i ? i->tput_mean : 0;
        if (y && best > 0) {
            snprintf(rel, sizeof(rel), "%.2f", y->tput_mean / best);
            judged++;
            good += y->tput_mean >= 0.9 * best;
        } else {
            snprintf(rel, sizeof(rel), "-");
        }
        snprintf(cpu, sizeof(cpu), "%.0f/%.0f/%.0f", d ? d->cpu_recv : 0, i ? i->cpu_recv : 0,
                 y ? y->cpu_recv : 0);
        if (y) {
            ndyn++;
            direct += y->direct_ratio >= 0.9;
            if (y->dtime_ms + y->itime_ms > 0) {
                snprintf(dt, sizeof(dt), "%.3f", y->dtime_ms / (y->dtime_ms + y->itime_ms));
                dtime += y->dtime_ms >= 0.9 * (y->dtime_ms + y->itime_ms);
            }
        }
        if (md) {
            fprintf(f, "| %s | %s | %s | %s | %s | %s | ", sr, sz, gd, gi, gy, rel);
            if (y)
                fprintf(f, "%.3f | %s | %.1f | %.1f | %.0f | ", y->direct_ratio, dt, y->switches,
                        y->drains_rcv, y->ring_size / 1024);
            else
                fprintf(f, "- | - | - | - | - | ");
            fprintf(f, "%s | ", cpu);
            if (tcp)
                fprintf(f, "%s | ", gt);
            fprintf(f, "%s |\n", pp->paper);
        } else {
            fprintf(f, " %-11s %-9s %8s %8s %8s %8s ", sr, sz, gd, gi, gy, rel);
            if (y)
                fprintf(f, "%7.3f %7s %8.1f %7.1f %7.0f ", y->direct_ratio, dt, y->switches,
                        y->drains_rcv, y->ring_size / 1024);
            else
                fprintf(f, "%7s %7s %8s %7s %7s ", "-", "-", "-", "-", "-");
            fprintf(f, "%-14s ", cpu);
            if (tcp)
                fprintf(f, "%8s ", gt);
            fprintf(f, "%s\n", pp->paper);
        }
    }
    if (md)
        fprintf(f,
                "\nPaper: %s. Ours: dynamic within 0.9x of the better fixed mode at %d of %d "
                "points; dynamic direct ratio >= 0.9 at %d of %d; dynamic direct time >= 0.9 at "
                "%d of %d.\n",
                ps->paper, good, judged, direct, ndyn, dtime, ndyn);
    else
        fprintf(f,
                "# dynamic >= 0.9 x the better fixed mode at %d of %d points; dynamic direct "
                "ratio >= 0.9 at %d of %d; direct time >= 0.9 at %d of %d\n",
                good, judged, direct, ndyn, dtime, ndyn);
}
