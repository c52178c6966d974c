#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-probe-kern.sh: what the guest's kernel does per 64 B busy round trip, libexs against
# rstream, in one scripts/rxe-vm.sh guest (spec/rxe-vm.md, "The kernel's side, libexs against
# rstream"): interrupts, softirqs, rxe's counters, context switches, migrations, page
# faults, system calls, and where rxe's work runs (bench/rxe-probe-kern-guest.sh).
#   bash bench/rxe-probe-kern.sh [C=3] [N1=1000] [N2=5000] [BLAST=path] [MODE=knobs|recs]
# C cycles of the counter pass, each system at N1 and N2 round trips (the difference is one
# round trip's), then one cycle of the sched, ftrace, strace and profile passes. BLAST:
# another build's blast instead of this tree's. MODE=knobs: the p50 with EXS_FALLBACK=off
# and/or EXS_LEASE_US=100000 against as is and rstream, C cycles of N2; MODE=recs: every
# counter of a running client and of the receiver that moved in 2 s (steady state). Output:
# $BUILD/rxe-probe-kern/out.log, then the table per round trip (bench/rxe_probe_kern.py).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
blast=$B/blast/blast
for a in "$@"; do case $a in BLAST=*) blast=${a#BLAST=} ;; esac; done
. bench/rxe-probe-lib.sh
probe_dir rxe-probe-kern bench/rxe-probe-kern-guest.sh
cp "$blast" "$D/blast"
cp "$(command -v rstream)" "$D/"
cp "$B/tools/exsctl" "$D/"
probe_guest rxe-probe-kern "strace perf" "$@"
python3 bench/rxe_probe_kern.py "$B/rxe-probe-kern/out.log"
