#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-2host-bw-run.sh: bench/rxe-2host-bw.sh in the two guests of scripts/rxe-2host.sh (the
# harness's link: netem RXE_2HOST_NETEM_B on b's egress, 1 ms when unset or empty), then the
# medians per system and size, and the runs that failed (BW2FAIL: not in the medians).
#   bash bench/rxe-2host-bw-run.sh [BW_CYCLES=5] [BW_TIME=4] [BW_SIZES="65536 1048576"]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
D=$B/rxe-2host-bw
rm -rf "$D" && mkdir -p "$D/run"
cp "$B/blast/blast" "$(command -v ib_write_bw)" bench/rxe-2host-bw.sh "$D/run/"
BUILD=$B RXE_VM_BINS="${RXE_VM_BINS:-} ib_write_bw" bash scripts/rxe-2host.sh "$D/run" rxe-2host-bw.sh "$@" 2>&1 |
    tee "$D/out.log"
python3 - "$D/out.log" <<'PY'
import re, statistics, sys
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"BW2 cyc=\d+ sys=(\S+) size=(\d+) gbps=([0-9.]+)", line)
    if m:
        v[(int(m.group(2)), m.group(1))].append(float(m.group(3)))
for line in open(sys.argv[1], errors="replace"):
    if "BW2FAIL" in line:
        print("failed:", line.split("BW2FAIL", 1)[1].strip())
for size in sorted({k[0] for k in v}):
    lx, pt = v.get((size, "libexs"), []), v.get((size, "ib_write_bw"), [])
    if lx and pt:
        a, b = statistics.median(lx), statistics.median(pt)
        print(f"{size} B: libexs {a:.3f} ({', '.join(f'{x:.3f}' for x in lx)}) ib_write_bw "
              f"{b:.3f} ({', '.join(f'{x:.3f}' for x in pt)}) ratio {a / b:.2f}")
PY
