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
    case SW_SENDS: return "sends";
    case SW_RECVS: return "recvs";
    case SW_SIZE: return "size";
    case SW_DEPTH: return "depth";
    default: return "none";
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
        fprintf(f, "# emulated link (exs tcp provider only): one-way delay %.3g ms, rate %.0f "
                "Mbit/s (0 = none); the tcp transport is NOT emulated\n",
                c->delay_ms, c->rate_mbps);
    fprintf(f, "# Gbit/s = user bytes x 8 / (first send posted .. last send completed), at the "
            "sender; +-: 95%% CI (t) over runs\n");
    fprintf(f, "# cpu%%: user+sys of each process / its wall time, 100 = one core; direct, "
            "indirect, switches: per run, from EXS_SO_STATS\n");
    if (lat)
        fprintf(f, "# lat: ping-pong round trip of %s, microseconds\n", "--lat-size bytes");
    fprintf(f, "#%-4s %-8s %5s %5s %-14s %5s %9s %8s %10s %9s %9s %6s %8s %6s %6s",
            "xprt", "mode", "sends", "recvs", "size", "conns", "Gbit/s", "+-ci95", "msg/s",
            "direct", "indirect", "d_rat", "switches", "cpu_s%", "cpu_r%");
    if (lat)
        fprintf(f, " %8s %8s %8s", "lat_p50", "lat_p99", "p99.9");
    fprintf(f, "\n");
    for (int i = 0; i < n; i++) {
        const struct result *x = &r[i];
        char sz[64];

        size_short(sz, sizeof(sz), x);
        fprintf(f, " %-4s %-8s %5d %5d %-14s %5d %9.3f %8.3f %10.0f %9.0f %9.0f %6.3f %8.1f "
                "%6.1f %6.1f", transport_name(x->transport), rmode(x), x->sends, x->recvs, sz,
                x->conns, x->tput_mean, x->tput_ci, x->mps_mean, x->direct, x->indirect,
                x->direct_ratio, x->switches, x->cpu_send, x->cpu_recv);
        if (lat) {
            if (x->has_lat)
                fprintf(f, " %8.1f %8.1f %8.1f", x->lat_p50, x->lat_p99, x->lat_p999);
            else
                fprintf(f, " %8s %8s %8s", "-", "-", "-");
        }
        fprintf(f, "\n");
        if (x->elephants) {
            static const char *cls[2] = { "elephants", "mice" };

            for (int k = 0; k < 2; k++)
                fprintf(f, "#   %-9s %3d conns: %9.3f Gbit/s %10.0f msg/s, send completion "
                        "p50 %.1f us p99 %.1f us\n", cls[k], k ? x->mice : x->elephants,
                        x->cls_tput[k], x->cls_mps[k], x->cls_p50[k], x->cls_p99[k]);
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
    fprintf(f, "\"messages_per_sec\": %.1f, \"direct_xfers\": %.1f, \"indirect_xfers\": %.1f, "
            "\"direct_ratio\": %.6f, \"mode_switches\": %.2f, ", x->mps_mean, x->direct,
            x->indirect, x->direct_ratio, x->switches);
    fprintf(f, "\"cpu_send_pct\": %.2f, \"cpu_send_ci95_pct\": %.2f, \"cpu_recv_pct\": %.2f, "
            "\"cpu_recv_ci95_pct\": %.2f,\n     ", x->cpu_send, x->cpu_send_ci, x->cpu_recv,
            x->cpu_recv_ci);
    fprintf(f, "\"type\": \"%s\", \"transport\": \"%s\", \"mode\": \"%s\", \"sends\": %d, "
            "\"recvs\": %d, \"size\": \"%s\", \"size_mean\": %llu, \"size_max\": %llu, "
            "\"conns\": %d, \"waitall\": %s, \"verify\": %s, \"runs\": %d, ",
            type_name(x->type), transport_name(x->transport), rmode(x), x->sends, x->recvs, sz,
            (unsigned long long)x->size_mean, (unsigned long long)x->size_max, x->conns,
            x->waitall ? "true" : "false", x->verify ? "true" : "false", x->runs);
    if (c->bytes)
        fprintf(f, "\"bytes_per_run\": %llu, ", (unsigned long long)c->bytes);
    else
        fprintf(f, "\"time_per_run\": %.3f, ", c->seconds);
    fprintf(f, "\"delay_ms\": %.3f, \"rate_mbps\": %.0f, \"emulated\": %s, \"rcvbuf\": %d, "
            "\"sweep\": \"%s\", \"sweep_value\": %llu", c->delay_ms, c->rate_mbps,
            x->transport == X_EXS && (c->delay_ms > 0 || c->rate_mbps > 0) ? "true" : "false",
            c->rcvbuf, sweep_name(c->sweep), (unsigned long long)x->sweep_val);
    if (x->elephants) {
        static const char *cls[2] = { "elephants", "mice" };

        fprintf(f, ",\n     \"classes\": {");
        for (int k = 0; k < 2; k++)
            fprintf(f, "%s\"%s\": {\"conns\": %d, \"size\": %llu, \"throughput_gbps\": %.6f, "
                    "\"bytes\": %.0f, \"messages\": %.0f, \"messages_per_sec\": %.1f, "
                    "\"send_p50_us\": %.1f, \"send_p99_us\": %.1f}", k ? ", " : "", cls[k],
                    k ? x->mice : x->elephants,
                    (unsigned long long)(k ? x->mice_size : x->size_mean), x->cls_tput[k],
                    x->cls_bytes[k] / runs, x->cls_msgs[k] / runs, x->cls_mps[k], x->cls_p50[k],
                    x->cls_p99[k]);
        fprintf(f, "}");
    }
    if (x->has_lat)
        fprintf(f, ",\n     \"latency_us\": {\"p50\": %.2f, \"p99\": %.2f, \"p999\": %.2f, "
                "\"mean\": %.2f, \"count\": %llu}", x->lat_p50, x->lat_p99, x->lat_p999,
                x->lat_mean, (unsigned long long)x->lat_count);
    fprintf(f, "}");
}

void report_json(FILE *f, const struct config *c, const struct result *r, int n)
{
    fprintf(f, "{\n  \"tool\": \"blast\", \"measured_at\": \"sender\", \"type\": \"%s\", "
            "\"sweep\": \"%s\",\n  \"results\": [\n", type_name(c->type), sweep_name(c->sweep));
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
            "lat_p50_us,lat_p99_us,lat_p999_us,elephant_gbps,mice_gbps,mice_p99_us\n");
    for (int i = 0; i < n; i++) {
        const struct result *x = &r[i];
        char sz[64];
        double runs = x->runs ? x->runs : 1;

        size_str(sz, sizeof(sz), x);
        fprintf(f, "%s,%s,%s,%d,%d,%s,%d,%d,%d,%s,%llu,%.6f,%.6f,%.0f,%.0f,%.6f,%.1f,%.1f,%.1f,"
                "%.6f,%.2f,%.2f,%.2f,", type_name(x->type), transport_name(x->transport),
                rmode(x), x->sends, x->recvs, sz, x->conns, x->waitall, x->runs,
                sweep_name(c->sweep), (unsigned long long)x->sweep_val, x->tput_mean,
                x->tput_ci, x->bytes / runs, x->messages / runs, x->secs_mean, x->mps_mean,
                x->direct, x->indirect, x->direct_ratio, x->switches, x->cpu_send, x->cpu_recv);
        if (x->has_lat)
            fprintf(f, "%.2f,%.2f,%.2f,", x->lat_p50, x->lat_p99, x->lat_p999);
        else
            fprintf(f, ",,,");
        if (x->elephants)
            fprintf(f, "%.6f,%.6f,%.1f\n", x->cls_tput[0], x->cls_tput[1], x->cls_p99[1]);
        else
            fprintf(f, ",,\n");
    }
}

/* Two panels: throughput and direct ratio against the swept value, one line per
 * (transport, mode). */
int report_plot(const char *png, const struct config *c, const struct result *r, int n)
{
    char dat[] = "/tmp/blast-plot-XXXXXX";
    int fd = mkstemp(dat);
    FILE *d, *g;
    int series[6], ns = 0, rc;
    uint64_t lo = UINT64_MAX, hi = 0;

    if (fd < 0 || !(d = fdopen(fd, "w"))) {
        fprintf(stderr, "blast: --plot: temporary file: %s\n", strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int key = r[i].transport * 3 + (r[i].transport == X_TCP ? 0 : r[i].mode), seen = 0;

        for (int k = 0; k < ns; k++)
            seen |= series[k] == key;
        if (!seen)
            series[ns++] = key;
    }
    for (int k = 0; k < ns; k++) {
        for (int i = 0; i < n; i++) {
            int key = r[i].transport * 3 + (r[i].transport == X_TCP ? 0 : r[i].mode);
            uint64_t x = c->nsweep ? r[i].sweep_val : (uint64_t)i + 1;

            if (key != series[k])
                continue;
            if (x < lo)
                lo = x;
            if (x > hi)
                hi = x;
            fprintf(d, "%llu %.6f %.6f %.6f\n", (unsigned long long)x, r[i].tput_mean,
                    r[i].tput_ci, r[i].direct_ratio);
        }
        fprintf(d, "\n\n");
    }
    fclose(d);
    g = popen("gnuplot", "w");
    if (!g) {
        fprintf(stderr, "blast: --plot: cannot run gnuplot: %s\n", strerror(errno));
        unlink(dat);
        return -1;
    }
    fprintf(g, "set terminal pngcairo size 1200,500 noenhanced\nset output '%s'\n", png);
    fprintf(g, "set multiplot layout 1,2 title 'blast %s, %s sweep'\n", type_name(c->type),
            sweep_name(c->sweep));
    fprintf(g, "set xlabel '%s'\nset grid\nset key bottom right\n",
            c->nsweep ? (c->sweep == SW_SIZE ? "message size (bytes)"
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
            int x = series[k] / 3, m = series[k] % 3;

            if (pass == 0)
                fprintf(g, "%s'%s' index %d using 1:2:3 with yerrorlines title '%s %s'",
                        k ? ", " : "", dat, k, transport_name(x), x == X_TCP ? "" : mode_name(m));
            else
                fprintf(g, "%s'%s' index %d using 1:4 with linespoints title '%s %s'",
                        k ? ", " : "", dat, k, transport_name(x), x == X_TCP ? "" : mode_name(m));
        }
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
