#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_cg_results.py LOG [K=V ...]: bench/results-rxe-cg.md from make bench-rxe-cg's guest
output (bench/rxe-cg.sh): user-space instructions per 64 B round trip of each client,
(Ir(N2) - Ir(N1)) / (round trips(N2) - round trips(N1)), by object and by function."""
import base64
import gzip
import re
import sys
from collections import defaultdict


# blast's percentile() sorts the round trips' times (qsort, n log n): bench/rxe-cg.sh runs
# blast with callgrind --toggle-collect=percentile, which leaves it out of the counts; a run
# where one of these still has a cost was counted with the sort
SORT_FNS = ("percentile", "cmp_double")


def parse_cg(text):
    """Self cost (Ir) per object and per (object, function) of one callgrind file."""
    names = {"ob": {}, "fn": {}}
    ob = fn = "?"
    per_ob, per_fn = defaultdict(int), defaultdict(int)
    skip_next = False
    for line in text.splitlines():
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            if skip_next:  # the inclusive cost of the call just named
                skip_next = False
                continue
            parts = line.split()
            if len(parts) >= 2:
                ir = int(parts[-1])
                per_ob[ob] += ir
                per_fn[(ob, fn)] += ir
            continue
        m = re.match(r"^(ob|fn|cob|cfn|cfi|cfl|fl|fi|fe)=(?:\((\d+)\))?\s*(.*)$", line)
        if m:
            kind, ident, name = m.groups()
            table = names["ob"] if kind in ("ob", "cob") else names["fn"] if kind in (
                "fn", "cfn") else None
            if table is not None:
                if ident and name:
                    table[ident] = name
                val = table.get(ident, name) if ident else name
                if kind == "ob":
                    ob = val
                elif kind == "fn":
                    fn = val
            continue
        if line.startswith("calls="):
            skip_next = True
    return per_ob, per_fn


def group(ob):
    o = ob.rsplit("/", 1)[-1]
    if o.startswith("blast") or o == "rstream":
        return "program (libexs is linked into blast)" if o.startswith("blast") else "program"
    if o.startswith("librdmacm"):
        return "librdmacm (rsockets)"
    if o.startswith("libibverbs") or o.startswith("librxe"):
        return "libibverbs + librxe"
    if o.startswith("libc.") or o.startswith("libm."):
        return "libc"
    if o.startswith("ld-linux"):
        return "ld.so"
    return "other (" + o + ")"


def main():
    log = sys.argv[1]
    meta = [a.split("=", 1) for a in sys.argv[2:] if "=" in a]
    runs = defaultdict(lambda: defaultdict(dict))  # label -> rep -> n -> (per_ob, per_fn)
    fails, cur, buf = [], None, []
    for raw in open(log, errors="replace"):
        line = re.sub(r"^\S+\| ", "", raw.rstrip("\n"))
        if line.startswith("@@CG BEGIN"):
            f = line.split()
            cur, buf = (f[2], int(f[3]), f[4] if len(f) > 4 else "1"), []
        elif line.startswith("@@CG END") and cur:
            text = gzip.decompress(base64.b64decode("".join(buf))).decode(errors="replace")
            runs[cur[0]][cur[2]][cur[1]] = parse_cg(text)
            cur = None
        elif cur:
            buf.append(line.strip())
        elif line.startswith("CGFAIL"):
            fails.append(line)
    out = []
    w = out.append
    w("# User-space instructions per 64 B round trip on Soft-RoCE (make bench-rxe-cg)\n")
    w("Written by `make bench-rxe-cg` (bench/rxe-cg.sh under callgrind in a scripts/rxe-vm.sh "
      "guest, bench/rxe_cg_results.py); do not edit by hand.\n")
    w("| run | |\n| --- | --- |")
    for k, v in meta:
        w(f"| {k} | {v} |")
    w("")
    w("Instructions the client process executes in user space per 64 B round trip, counted by "
      "callgrind inside the guest (the kernel's rxe work is not counted: the same for every "
      "system). Each client runs twice (N1 and N2 round trips) and the difference is divided by "
      "the round trips between them, which takes start-up and teardown out. Every wait sleeps "
      "at once (blast `--wait-notify`; rsockets with `polling_time` 0), so no spin adds turns "
      "whose number depends on timing: unlike the guest's clock, this figure does not move with "
      "the host's load. libexs runs with `EXS_LEASE_US=1000000`: a round trip under callgrind "
      "outlasts the default 1 ms lease, whose ends and restarts a native round trip never meets. "
      "blast runs `n` round trips plus `n/10` of warm-up; its sort of the round "
      "trips' times for the percentiles (qsort, n log n) is not counted: callgrind runs it "
      "with `--toggle-collect=percentile`.\n")
    per_rt, each, sorted_in = {}, {}, set()
    for label, reps in runs.items():
        got = []
        for rep, d in sorted(reps.items()):
            if len(d) < 2:
                continue
            (n1, a), (n2, b) = sorted(d.items())[:2]
            rts = (n2 - n1) * (1.1 if label.startswith("libexs") else 1.0)
            groups = defaultdict(float)
            for ob in set(a[0]) | set(b[0]):
                groups[group(ob)] += (b[0].get(ob, 0) - a[0].get(ob, 0)) / rts
            fns = {}
            for k in set(a[1]) | set(b[1]):
                fns[k] = (b[1].get(k, 0) - a[1].get(k, 0)) / rts
            for (o, f) in set(a[1]) | set(b[1]):
                if f in SORT_FNS and (a[1].get((o, f)) or b[1].get((o, f))):
                    sorted_in.add(f"{label} (pair {rep})")
            got.append((sum(groups.values()), groups, fns))
        if got:
            got.sort(key=lambda g: g[0])
            per_rt[label] = got[(len(got) - 1) // 2]  # the median pair (the lower of two)
            each[label] = [g[0] for g in got]
    if per_rt:
        gs = sorted({g for v in per_rt.values() for g, x in v[1].items() if abs(x) >= 0.5})
        w("| client | Ir per round trip | " + " | ".join(gs) + " | each pair |")
        w("| --- | --- | " + " | ".join("---" for _ in gs) + " | --- |")
        for label, (tot, groups, _) in per_rt.items():
            w(f"| {label} | {tot:,.0f} | " + " | ".join(f"{groups.get(g, 0):,.0f}" for g in gs)
              + " | " + ", ".join(f"{t:,.0f}" for t in each[label]) + " |")
        w("")
        for label, (tot, _, fns) in per_rt.items():
            w(f"## {label}: functions by own instructions per round trip (top 25)\n")
            w("| function | object | Ir |\n| --- | --- | --- |")
            for (ob, fn), v in sorted(fns.items(), key=lambda kv: -kv[1])[:25]:
                w(f"| `{fn}` | {ob.rsplit('/', 1)[-1]} | {v:,.0f} |")
            w("")
    if sorted_in:
        w("## Runs counted with blast's sort of the round trips' times\n")
        w("`percentile` or `cmp_double` has a cost in " + ", ".join(sorted(sorted_in))
          + ": their figures include blast's sort (a blast without `percentile`?)\n")
    if fails:
        w("## Runs that failed\n")
        for f in fails:
            w(f"- `{f}`")
    print("\n".join(out))


if __name__ == "__main__":
    main()
