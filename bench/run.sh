#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make bench: install the bench's tools when missing, then run bench/bench.py (libexs over the
# tcp provider against kernel TCP and UCX over TCP, interleaved; callgrind instruction counts).
#
#   bench/run.sh [BUILD_DIR]        (make bench passes its build directory; default build)
#
# Environment (make bench passes the make variables of the same names):
#   BENCH_QUICK=1       short smoke version: runs of 0.3 s, smaller callgrind counts (< 2 min)
#   BENCH_CALLGRIND=0   no callgrind instruction counts
#   BENCH_STRACE=0      no system call counts (strace -f -c)
#   BENCH_ROUNDS=N      rounds (default 3): each round measures every system once; medians
#   BENCH_SECS=S        length of each run (default 2, 0.3 with BENCH_QUICK)
#   BENCH_OUT=DIR       where results.md, results.json and results.png go (default bench)
#   BENCH_TINY=1        the self test's configuration (bench/selftest.sh): runs of 0.1 s
#   BENCH_QUIET=1       no progress lines on stderr
#   BENCH_BASE=DIR      also measure DIR/blast/blast (or DIR itself when it is the blast binary)
#                       as the base: every libexs figure again, interleaved in the same rounds,
#                       and ours / base per figure (make bench BENCH_BASE=TRACE=0 builds
#                       build-notrace/ and passes it here)
#   BENCH_BASE_NAME=S   the base's name in results.md (default: DIR)
# Exit status: 0 when every figure was measured, 1 when one failed (results.md lists why).
set -eu
build=${1:-build}
cd "$(dirname "$0")/.."
bash scripts/deps.sh --bench
export BENCH_BLAST="$build/blast/blast"
if [ -n "${BENCH_BASE:-}" ]; then
    if [ -f "$BENCH_BASE" ]; then base_blast=$BENCH_BASE; else base_blast=$BENCH_BASE/blast/blast; fi
    if [ ! -x "$base_blast" ]; then
        echo "bench: BENCH_BASE=$BENCH_BASE: no blast binary at $base_blast (build it first)" >&2
        exit 1
    fi
    export BENCH_BASE_BLAST="$base_blast" BENCH_BASE_NAME="${BENCH_BASE_NAME:-$BENCH_BASE}"
fi
case "$build" in
    build-*) echo "bench: note: $build is a sanitizer build; its figures are not comparable" >&2 ;;
esac
exec python3 bench/bench.py
