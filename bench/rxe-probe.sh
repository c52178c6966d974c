#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-probe.sh: the probes behind spec/rxe-vm.md "Host load" and "Where the 64 KiB STREAM
# time goes" (session 23), in one scripts/rxe-vm.sh guest (clocksource=tsc, as bench-rxe):
#   bash bench/rxe-probe.sh slow [CYCLES]   libexs 64 B busy round trips (3 runs) after 6 s
#       idle and after ib_write_bw 64 KiB 2 s + 1 MiB 3 s, alternating (bench/rxe-probe-slow.sh)
#   bash bench/rxe-probe.sh bw [CYCLES] [VARIANT...]   64 KiB STREAM direct (blast, 4 s)
#       against ib_write_bw -D 4, interleaved, with rdma counters, softirqs and rxe-vstat per
#       run; a VARIANT is more blast options or EXS_X=V, '+' for a space ("--poll",
#       "EXS_VRB_QP_TIMEOUT=14") (bench/rxe-probe-bw.sh)
# Every guest line is stamped with the host's time (seconds since the epoch) and the host's
# /proc/pressure/cpu is sampled every 0.5 s into $BUILD/rxe-probe/psi.log ("PSI time
# total=us load1"): a run's host CPU pressure is the stall time over its window. Output:
# $BUILD/rxe-probe/out.log (and stdout); for bw, then one line per run per work request
# (bench/rxe_probe_bw.py).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: $0 slow|bw [CYCLES] [VARIANT...]}
cycles=${2:-8}
shift $(($# >= 2 ? 2 : 1))
B=${BUILD:-build}
D=$B/rxe-probe/run
rm -rf "$D" && mkdir -p "$D"
cp "$B/blast/blast" bench/rxe-probe-slow.sh bench/rxe-probe-bw.sh "$D/"
for b in ib_write_bw ib_write_lat; do cp "$(command -v $b)" "$D/"; done
cc -O2 -g -Wall -shared -fPIC -o "$D/rxe-vstat.so" bench/rxe-vstat.c -ldl -pthread
(while :; do
    echo "PSI $(date +%s.%N) $(awk '/^some/ {print $NF}' /proc/pressure/cpu 2>/dev/null) $(cut -d' ' -f1 /proc/loadavg)"
    sleep 0.5
done) >"$B/rxe-probe/psi.log" &
sampler=$!
trap 'kill $sampler' EXIT
case $what in
slow) cmd=(env C="$cycles" sh rxe-probe-slow.sh) ;;
bw) cmd=(env C="$cycles" VARIANTS="$*" sh rxe-probe-bw.sh) ;;
*) echo "$0: slow or bw" >&2; exit 2 ;;
esac
BUILD=$B/rxe-bench RXE_VM_APPEND="clocksource=tsc tsc=reliable" bash scripts/rxe-vm.sh "$D" "${cmd[@]}" 2>&1 |
    while IFS= read -r l; do echo "$(date +%s.%N) $l"; done | tee "$B/rxe-probe/out.log"
[ "$what" = bw ] && python3 bench/rxe_probe_bw.py "$B/rxe-probe/out.log"
exit 0
