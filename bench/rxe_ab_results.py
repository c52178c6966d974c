#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_ab_results.py LOG ITERS [K=V ...]: bench/results-rxe-ab.md from one make bench-rxe-ab
guest run (bench/rxe-ab.sh: AB, ABFAIL, ABVS, ABSYS, ABSYSTOP lines). Medians over the
rounds, each round's value beside them; per message: the vstat counters summed over the
rounds of the round-trip figures, divided by 2 x (ITERS + ITERS / 10) per run: the messages
of blast's round trips, its warm-up (ITERS / 10) included, as bench-rxe counts. STREAM
throughput (figures gbps<SIZE>): medians, the ratio to the base and to ib_write_bw (when it
ran), the median of each round's this/base ratio, and both ends' counters per message (blast's
messages; ib_write_bw's: the client's posted work requests, its margins included)."""
import os
import re
import statistics
import sys
from collections import defaultdict

FIG = {"busy": "{size} B round trip p50, busy polling (us)",
       "block": "{size} B round trip p50, blocking waits (us)",
       "msgs": "64 B messages/s, 16 outstanding"}
VS_COLS = [("send_wrs", "sends"), ("send_signaled", "signaled"), ("send_inline", "inline"),
           ("recv_wrs", "recvs"), ("poll_calls", "polls"), ("polled_cqes", "completions"),
           ("req_notify", "notify req"), ("cq_events", "CQ events"), ("locks", "locks")]
ST_COLS = [("post_send_calls", "doorbells"), ("send_wrs", "sends"),
           ("send_signaled", "signaled"), ("recv_wrs", "recvs"), ("poll_calls", "polls"),
           ("polled_cqes", "completions"), ("req_notify", "notify req"),
           ("cq_events", "CQ events")]


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def main():
    path, iters = sys.argv[1], int(sys.argv[2])
    meta = [a.split("=", 1) for a in sys.argv[3:]]
    val = defaultdict(dict)
    vs = defaultdict(lambda: defaultdict(float))
    runs = defaultdict(int)
    st_vs = defaultdict(lambda: defaultdict(float))  # (fig, label, side) -> counters
    st_msgs = defaultdict(float)  # (fig, label) -> messages of the runs with vstat lines
    sysc, systop, fails, labels = {}, defaultdict(list), [], []
    st_run_msgs, st_figs, st_raw = {}, [], []
    for raw in open(path, errors="replace"):
        line = re.sub(r"^\S+\| ", "", raw.rstrip("\n"))
        d = kv(line)
        if line.startswith("AB ") and "value" in d:
            val[(d["fig"], d["label"])][int(d["round"])] = float(d["value"])
            if d["fig"].startswith("gbps"):
                st_run_msgs[(d["fig"], d["label"], int(d["round"]))] = float(d.get("msgs", 0))
                if d["fig"] not in st_figs:
                    st_figs.append(d["fig"])
            if d["label"] not in labels and d["label"] != "ib_write_bw":
                labels.append(d["label"])
        elif line.startswith("ABFAIL"):
            fails.append(line)
        elif line.startswith("ABVS ") and d.get("fig", "").startswith("gbps"):
            st_raw.append(d)
        elif line.startswith("ABVS ") and d.get("fig") in ("busy", "block"):
            key = (d["fig"], d["label"])
            runs[key] += 1
            for k, _ in VS_COLS:
                vs[key][k] += float(d.get(k, 0))
        elif line.startswith("ABSYS "):
            sysc[(d["fig"], d["label"])] = (int(d["msgs"]), int(d.get("total") or 0))
        elif line.startswith("ABSYSTOP "):
            systop[(d["fig"], d["label"])].append(f'{d["call"]} {d["count"]}')
    out = ["# libexs verbs before and after (make bench-rxe-ab)", "",
           "Written by `make bench-rxe-ab` (bench/rxe-ab.sh in a scripts/rxe-vm.sh guest, "
           "bench/rxe_ab_results.py); do not edit by hand. Two builds of blast on one rxe0 in "
           "one guest (TCG), the same rounds, the order alternating; absolute figures say "
           "little, the counters per message are the point.", "",
           "| run | |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in meta]
    base = labels[0] if labels else None
    for fig in ("busy", "block", "msgs"):
        out += ["", f"## {FIG[fig].format(size=os.environ.get('AB_SIZE', '64'))}", "", f"| build | median | / {base} | each round |",
                "| --- | --- | --- | --- |"]
        for lab in labels:
            r = val.get((fig, lab), {})
            if not r:
                out.append(f"| {lab} | - | - | - |")
                continue
            med = statistics.median(r.values())
            b = val.get((fig, base), {})
            ratio = f"{med / statistics.median(b.values()):.2f}" if b else "-"
            each = ", ".join(f"{r[k]:.1f}" for k in sorted(r))
            out.append(f"| {lab} | {med:.1f} | {ratio} | {each} |")
    # the STREAM counters, per message: blast's messages of the run (the sender's), or for
    # ib_write_bw its client's posted work requests (its iterations count the window only)
    for d in st_raw:
        fig, lab, rnd = d["fig"], d["label"], int(d["round"])
        side = d.get("side", "client")
        if lab == "ib_write_bw":
            if side == "client":
                st_msgs[(fig, lab)] += float(d.get("send_wrs", 0))
        elif side == "client":
            st_msgs[(fig, lab)] += st_run_msgs.get((fig, lab, rnd), 0)
        for k in ST_COLS:
            st_vs[(fig, lab, side)][k[0]] += float(d.get(k[0], 0))
    for fig in st_figs:
        size = int(fig[4:])
        name = f"{size // 1048576} MiB" if size % 1048576 == 0 else f"{size // 1024} KiB"
        pt = val.get((fig, "ib_write_bw"), {})
        out += ["", f"## {name} STREAM throughput, direct (Gbit/s)", "",
                f"| build | median | / {base} | median of each round's / {base} | / ib_write_bw "
                "| each round |", "| --- | --- | --- | --- | --- | --- |"]
        for lab in labels + (["ib_write_bw"] if pt else []):
            r = val.get((fig, lab), {})
            if not r:
                out.append(f"| {lab} | - | - | - | - | - |")
                continue
            med = statistics.median(r.values())
            b = val.get((fig, base), {})
            ratio = f"{med / statistics.median(b.values()):.2f}" if b else "-"
            pr = [r[k] / b[k] for k in r if b.get(k)]
            pair = f"{statistics.median(pr):.2f}" if pr and lab != base else "-"
            ptr = f"{med / statistics.median(pt.values()):.2f}" if pt else "-"
            each = ", ".join(f"{r[k]:.3f}" for k in sorted(r))
            out.append(f"| {lab} | {med:.3f} | {ratio} | {pair} | {ptr} | {each} |")
        out += ["", f"Per {name} message (rxe-vstat.so, both ends, summed over the rounds; "
                "doorbells: ibv_post_send calls):", "",
                "| build | side | " + " | ".join(c for _, c in ST_COLS) + " |",
                "| --- | --- | " + " | ".join("---" for _ in ST_COLS) + " |"]
        for lab in labels + ["ib_write_bw"]:
            m = st_msgs.get((fig, lab), 0)
            for side in ("client", "server"):
                c = st_vs.get((fig, lab, side))
                if not c or not m:
                    continue
                cells = " | ".join(f"{c[k] / m:.2f}" for k, _ in ST_COLS)
                out.append(f"| {lab} | {side} | {cells} |")
    out += ["", "## Per message (rxe-vstat.so, client, " + os.environ.get("AB_SIZE", "64") + " B round trips, summed over the rounds)",
            "", "| figure | build | " + " | ".join(c for _, c in VS_COLS) + " |",
            "| --- | --- | " + " | ".join("---" for _ in VS_COLS) + " |"]
    for fig in ("busy", "block"):
        for lab in labels:
            key = (fig, lab)
            if not runs.get(key):
                continue
            # blast makes iters / 10 warm-up round trips before the measured ones
            # (blast/exs_xfer.c); the counters count them too
            msgs = 2 * (iters + iters // 10) * runs[key]
            cells = " | ".join(f"{vs[key][k] / msgs:.2f}" for k, _ in VS_COLS)
            out.append(f"| {fig} | {lab} | {cells} |")
    out += ["", "## System calls per message (strace -c -f, one client run each)", "",
            "| figure | build | messages | system calls | per message | most frequent |",
            "| --- | --- | --- | --- | --- | --- |"]
    for fig in ("busy", "block"):
        for lab in labels:
            if (fig, lab) in sysc:
                m, t = sysc[(fig, lab)]
                out.append(f"| {fig} | {lab} | {m} | {t} | {t / m:.1f} | "
                           f"{', '.join(systop[(fig, lab)])} |")
    if fails:
        out += ["", "## Runs that failed", ""] + [f"- `{f}`" for f in fails]
    print("\n".join(out))


if __name__ == "__main__":
    main()
