#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-probe-bwprof.sh: where the CPU goes in a 64 KiB STREAM (blast --mode direct) against
# ib_write_bw, by CPU and symbol, in one scripts/rxe-vm.sh guest (perf record -a):
#   bash bench/rxe-probe-bwprof.sh [C=3] [T=4] [EXTRA="blast options"]
# Output: $BUILD/rxe-probe-bwprof/out.log, then per CPU the top symbols in samples per
# message (bench/rxe_probe_bwprof.py).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
. bench/rxe-probe-lib.sh
probe_dir rxe-probe-bwprof bench/rxe-probe-bwprof-guest.sh
cp "$B/blast/blast" "$D/"
cp "$(command -v ib_write_bw)" "$D/"
cc -O2 -g -Wall -shared -fPIC -o "$D/rxe-vstat.so" bench/rxe-vstat.c -ldl -pthread
probe_guest rxe-probe-bwprof "perf" "$@"
python3 bench/rxe_probe_bwprof.py "$B/rxe-probe-bwprof/out.log"
