#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_probe_bwprof.py LOG: bench/rxe-probe-bwprof.sh's table. Per CPU, its samples (2 kHz:
0.5 ms each) per message of libexs (lx) and ib_write_bw (ibwb), summed over the cycles,
and the symbols whose share differs most."""
import re
import sys
from collections import defaultdict


def parse(path):
    msgs = defaultdict(int)  # tag -> messages over the cycles
    samp = defaultdict(int)  # (tag, cpu, class, symbol) -> samples
    for line in open(path, errors="replace"):
        m = re.search(r"PM cyc=\d+ tag=(\w+) msgs=(\d+)", line)
        if m:
            msgs[m.group(1)] += int(m.group(2))
            continue
        m = re.search(r"PS cyc=\d+ tag=(\w+) cpu(\d+) (\S+) (\S+) (\d+)\s*$", line)
        if m:
            samp[(m.group(1), int(m.group(2)), m.group(3), m.group(4))] += int(m.group(5))
    return msgs, samp


def main():
    msgs, samp = parse(sys.argv[1])
    if not msgs.get("lx") or not msgs.get("ibwb"):
        sys.exit("rxe_probe_bwprof.py: no messages of lx and ibwb in the log")
    per = defaultdict(float)
    for (tag, cpu, cls, sym), v in samp.items():
        if msgs.get(tag):
            per[(tag, cpu, cls, sym)] = v / msgs[tag]
    for lx in [t for t in ("lx", "lxe") if msgs.get(t)]:
        print(f"{lx} against ibwb: messages {msgs[lx]}, {msgs['ibwb']}; samples per message "
              "(0.5 ms each)")
        for cpu in sorted({k[1] for k in per}):
            a, b = per[(lx, cpu, "all", "all")], per[("ibwb", cpu, "all", "all")]
            print(f"cpu{cpu}: all {lx} {a:.3f} ibwb {b:.3f}")
            keys = {(k[2], k[3]) for k in per if k[1] == cpu and k[2] != "all"}
            rows = sorted(keys, key=lambda k: per[(lx, cpu) + k] - per[("ibwb", cpu) + k])
            for k in rows[::-1][:15] + rows[:6][::-1]:
                x, y = per[(lx, cpu) + k], per[("ibwb", cpu) + k]
                print(f"  {k[0]:6} {k[1][:48]:48} {lx} {x:.3f} ibwb {y:.3f} diff {x - y:+.3f}")


if __name__ == "__main__":
    main()
