#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-probe-arms.sh: who arms the CQ and who wakes per 64 KiB STREAM message (spec/rxe-vm.md,
# "64 KiB STREAM: who arms and who wakes"), this tree's blast against BASE/blast/blast in one
# scripts/rxe-vm.sh guest: C cycles (3) of VARIANTS (X B Xp Bp: X this tree, B the base, p:
# --poll) and ib_write_bw, T s each (6); the engine and provider counters of both ends
# (exsctl metrics) and their threads' context switches, 1.5 s and 3 s into each run.
#   bash bench/rxe-probe-arms.sh BASE [C=3] [T=6] [VARIANTS="X B Xp Bp"]
# Output: $BUILD/rxe-probe-arms/out.log, then per message (bench/rxe_probe_arms.py).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: $0 BASE_BUILD_DIR [VAR=VALUE...]}
shift
B=${BUILD:-build}
. bench/rxe-probe-lib.sh
probe_dir rxe-probe-arms bench/rxe-probe-arms-guest.sh
cp "$B/blast/blast" "$D/blastX"
cp "$base/blast/blast" "$D/blastB"
cp "$B/tools/exsctl" "$D/"
cp "$(command -v ib_write_bw)" "$D/"
probe_guest rxe-probe-arms "" "$@"
python3 bench/rxe_probe_arms.py "$B/rxe-probe-arms/out.log"
