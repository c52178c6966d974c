/* SPDX-License-Identifier: MIT */
/* blast: the paper's experiments (seed 004, Fig. 9-13, Table III) as named presets. */
#include <stdio.h>
#include <string.h>

#include "blast/blast.h"

#define K       1024ull
#define M       (1024ull * 1024ull)
#define NPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Table III, top half: sends = recvs. Switch counts and direct ratios are the table's ("< 0.001"
 * is kept as 0.001, an upper bound). */
static const struct preset_point fig9a_pts[] = {
    {1, 1, 0, 0, 0.0011, "Table III: 93 +- 86 switches, ratio 0.0011"},
    {2, 2, 0, 0, 0.0632, "Table III: 6529 +- 346 switches, ratio 0.063"},
    {4, 4, 0, 0, 0.001, "Table III: 1 switch, ratio < 0.001"},
    {8, 8, 0, 0, 0.001, "Table III: 1 switch, ratio < 0.001"},
    {16, 16, 0, 0, 0.001, "Table III: 1 switch, ratio < 0.001"},
    {32, 32, 0, 0, 0.001, "Table III: 1 switch, ratio < 0.001"},
};

/* Table III, bottom half: recvs = 2 x sends. */
static const struct preset_point fig9b_pts[] = {
    {1, 2, 0, 0, 0.99949, "Table III: 20 +- 6 switches, ratio 0.9995"},
    {2, 4, 0, 0, 0.191, "Table III: 1 switch, ratio 0.19 (the anomaly)"},
    {4, 8, 0, 0, 0.914, "Table III: 0.1 switches, ratio 0.91"},
    {8, 16, 0, 0, 1.0, "Table III: 0 switches, ratio 1"},
    {16, 32, 0, 0, 1.0, "Table III: 0 switches, ratio 1"},
};

/* Fig. 11: 32 receives, 1-32 sends, one line per message size. The paper's text names only
 * 128 KiB (the size whose direct ratio varies most); 4 KiB and 1 MiB are chosen here. */
static const struct preset_point fig11_pts[] = {
    {1, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {2, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {4, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {8, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {16, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {32, 32, 4 * K, 0, -1, "flat above 5 sends"},
    {1, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {2, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {4, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {8, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {16, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {32, 32, 128 * K, 1, -1, "direct ratio varies most, so does throughput"},
    {1, 32, 1 * M, 2, -1, "flat above 5 sends"},
    {2, 32, 1 * M, 2, -1, "flat above 5 sends"},
    {4, 32, 1 * M, 2, -1, "flat above 5 sends"},
    {8, 32, 1 * M, 2, -1, "flat above 5 sends"},
    {16, 32, 1 * M, 2, -1, "flat above 5 sends"},
    {32, 32, 1 * M, 2, -1, "flat above 5 sends"},
};

/* Fig. 12: 2 sends, 4 receives, fixed sizes 4 KiB .. 4 MiB. */
static const struct preset_point fig12_pts[] = {
    {2, 4, 4 * K, 0, -1, "ratio falls with size"},
    {2, 4, 16 * K, 0, -1, "ratio falls with size"},
    {2, 4, 32 * K, 0, -1, "ratio lowest about here"},
    {2, 4, 64 * K, 0, -1, "ratio rises again"},
    {2, 4, 128 * K, 0, -1, "ratio rises again"},
    {2, 4, 256 * K, 0, -1, "ratio rises again"},
    {2, 4, 512 * K, 0, 1.0, "all direct"},
    {2, 4, 1 * M, 0, 1.0, "all direct"},
    {2, 4, 2 * M, 0, 1.0, "all direct; peak 46.5 Gbit/s"},
    {2, 4, 4 * M, 0, 1.0, "all direct; a little below the peak"},
};

/* Fig. 13: 48 ms round trip on a 10 Gbit/s link, sends = recvs. */
static const struct preset_point fig13_pts[] = {
    {1, 1, 0, 0, -1, "all three similar"},
    {2, 2, 0, 0, -1, "all three similar"},
    {4, 4, 0, 0, -1, "indirect 0.1-0.4 above direct; dynamic above direct"},
    {8, 8, 0, 0, -1, "indirect 0.1-0.4 above direct; dynamic above direct"},
    {16, 16, 0, 0, -1, "indirect 0.1-0.4 above direct; dynamic above direct"},
    {32, 32, 0, 0, -1, "indirect 0.1-0.4 above direct; dynamic above direct"},
};

static const struct preset presets[] = {
    {"fig9a", "Fig. 9a / 10a / Table III top: sends = recvs, exp:1M:4M", "exp:1M:4M",
     "FDR IB: direct-only 35-44 Gbit/s, indirect-only 20-27; dynamic at the indirect level "
     "(the sender always wins the race to the ring); receiver CPU near 100% when indirect",
     0, 0, 0.5, fig9a_pts, NPTS(fig9a_pts)},
    {"fig9b", "Fig. 9b / 10b / Table III bottom: recvs = 2 x sends, exp:1M:4M", "exp:1M:4M",
     "FDR IB: dynamic at the direct-only level (ADVERTs arrive first), except 2 sends / 4 "
     "recvs (one switch to indirect, ratio 0.19)",
     0, 0, 0.5, fig9b_pts, NPTS(fig9b_pts)},
    {"fig11", "Fig. 11: 32 recvs, 1-32 sends, sizes 4K / 128K / 1M", "exp:1M:4M",
     "FDR IB, dynamic: throughput grows with size and is flat above 5 sends, except 128 KiB "
     "where the direct ratio (and throughput) varies",
     0, 0, 0.5, fig11_pts, NPTS(fig11_pts)},
    {"fig12", "Fig. 12: 2 sends, 4 recvs, size 4 KiB - 4 MiB", "exp:1M:4M",
     "FDR IB, dynamic: throughput grows with size to a 46.5 Gbit/s peak at 2 MiB; the direct "
     "ratio falls to about 32 KiB, then rises: all direct from 512 KiB",
     0, 0, 0.5, fig12_pts, NPTS(fig12_pts)},
    {"fig13", "Fig. 13: 48 ms RTT, 10 Gbit/s (--delay-ms 24 --rate-mbps 10000), sends = recvs",
     "exp:1M:4M",
     "10G RoCE + 48 ms: all three similar; with 4-32 buffers indirect 0.1-0.4 Gbit/s above "
     "direct, dynamic above direct (no Gbit/s values are given in the text)",
     24, 10000, 2, fig13_pts, NPTS(fig13_pts)},
};

const struct preset *preset_find(const char *name)
{
    /* Fig. 10 is the receiver's CPU in the runs of Fig. 9: the cpu_r% column. */
    if (!strcmp(name, "fig10a"))
        name = "fig9a";
    else if (!strcmp(name, "fig10b"))
        name = "fig9b";
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    return NULL;
}

void preset_list(FILE *f)
{
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        fprintf(f, "  %-6s %s (%d points x 3 modes x 3 rounds, %.1f s per run)\n", presets[i].name,
                presets[i].title, presets[i].npts, presets[i].seconds);
    fprintf(f, "  (fig10a, fig10b: the same runs as fig9a, fig9b; Fig. 10 is their cpu_r%% "
               "column)\n");
}
