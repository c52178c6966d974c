#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Per-round-trip table of bench/rxe-probe-kern.sh's output.

Reads the "K pass cyc sys n key value" lines of bench/rxe-probe-kern-guest.sh (possibly
prefixed by a host timestamp) and prints, per pass and key, one round trip's figure for
libexs (L) and rstream (R): (value at N2 - value at N1) / (N2 - N1), per cycle, where N is
the round trips made (blast makes N + N / 10: its warm-up), (pass prof:
perf samples at 4 kHz, as microseconds of CPU time). Keys whose
figure is below --min (0.02) per round trip for both systems in every cycle are left out.
"""
import argparse
import collections
import re
import statistics

SYS = {"L": "libexs", "R": "rstream"}


def parse(path):
    """{(pass, cyc, sys, key): {n: value}} and the p50s {(sys): [values]}"""
    vals = collections.defaultdict(dict)
    p50 = collections.defaultdict(list)
    for line in open(path, errors="replace"):
        m = re.search(r"\bK (\w+) (\d+) ([LR]) (\d+) (\S+) (\S+)\s*$", line)
        if not m:
            continue
        pas, cyc, sys_, n, key, val = m.groups()
        try:
            v = float(val)
        except ValueError:
            continue
        if key == "p50":
            p50[(sys_, int(n))].append(v)
            continue
        vals[(pas, int(cyc), sys_, key)][int(n)] = v
    return vals, p50


def per_rt(vals):
    """{(pass, key): {sys: [per-round-trip figure per cycle]}}"""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for (pas, cyc, sys_, key), byn in sorted(vals.items()):
        ns = sorted(byn)
        if len(ns) < 2:
            continue
        n1, n2 = ns[0], ns[-1]
        if sys_ == "L":  # blast adds lat_iters / 10 warm-up round trips (blast/exs_xfer.c)
            byn = {n + n // 10: v for n, v in byn.items()}
            n1, n2 = n1 + n1 // 10, n2 + n2 // 10
        # prof counts samples at 4 kHz: us of CPU time per round trip
        scale = 250.0 if pas == "prof" else 1.0
        out[(pas, key)][sys_].append(scale * (byn[n2] - byn[n1]) / (n2 - n1))
    return out


def fmt(xs):
    if not xs:
        return "-"
    if len(xs) == 1:
        return "%.2f" % xs[0]
    return "%.2f (%s)" % (statistics.median(xs), ", ".join("%.2f" % x for x in xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--min", type=float, default=0.02)
    ap.add_argument("--prof-min", type=float, default=0.3, help="us per round trip")
    a = ap.parse_args()
    vals, p50 = parse(a.log)
    for (s, n), v in sorted(p50.items()):
        print("p50 %s n=%d: %s us" % (SYS[s], n, ", ".join("%.1f" % x for x in v)))
    table = per_rt(vals)
    last = None
    for (pas, key), bys in sorted(table.items()):
        allv = [abs(x) for s in bys.values() for x in s]
        if not allv or max(allv) < (a.prof_min if pas == "prof" else a.min):
            continue
        if pas != last:
            print("\n| %s: per round trip | libexs | rstream |\n| --- | --- | --- |" % pas)
            last = pas
        print("| %s | %s | %s |" % (key, fmt(bys.get("L", [])), fmt(bys.get("R", []))))


if __name__ == "__main__":
    main()
