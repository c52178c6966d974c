#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of request tracing: blast ping-pong and stream throughput, interleaved runs, medians.
#
# usage: tools/trace_cost.sh [ROUNDS] [BLAST...]
#   Each round runs, for every blast binary given (default build/blast/blast) and every
#   EXS_TRACE_SAMPLE_MASK of $MASKS (default "0 1023 0xffffffffffffffff"), in turn: the
#   SEQPACKET and the STREAM 64 B ping-pong (p50 round trip, us) and a STREAM throughput
#   run of 64 KiB sends (Gbit/s). Interleaving spreads the machine's load over all of
#   them; the table gives every run and the median. Not part of make check (it measures).
set -euo pipefail

rounds=${1:-9}
shift || true
blasts=("$@")
[ ${#blasts[@]} -gt 0 ] || blasts=(build/blast/blast)
masks=${MASKS:-"0 1023 0xffffffffffffffff"}
iters=${LAT_ITERS:-20000}
out=$(mktemp -d /tmp/trace-cost.XXXXXX)
export EXS_PROVIDER=${EXS_PROVIDER:-tcp}

# the last column of blast's table row: lat_p50 for the ping-pong, Gbit/s for throughput
lat_p50() { awk '$1=="exs" {print $(NF-2)}'; }
gbps() { awk '$1=="exs" {print $7}'; }

for r in $(seq "$rounds"); do
    for i in "${!blasts[@]}"; do
        b=${blasts[$i]}
        for m in $masks; do
            key="b${i}_$m"
            EXS_TRACE_SAMPLE_MASK=$m "$b" --loopback --type seqpacket --lat-only --lat-iters "$iters" \
                --lat-size 64 --poll --poll-recv --quiet | lat_p50 >>"$out/sp_$key"
            EXS_TRACE_SAMPLE_MASK=$m "$b" --loopback --type stream --lat-only --lat-iters "$iters" \
                --lat-size 64 --poll --poll-recv --quiet | lat_p50 >>"$out/st_$key"
            EXS_TRACE_SAMPLE_MASK=$m "$b" --loopback --type stream --size 65536 --time 1 --runs 1 \
                --no-latency --quiet | gbps >>"$out/tp_$key"
        done
    done
    echo "round $r of $rounds done" >&2
done

for i in "${!blasts[@]}"; do echo "b$i: ${blasts[$i]}"; done
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
printf '| %-8s | %-40s | %-20s | %s | %s |\n' test "build_mask" unit runs median
for t in sp st tp; do
    for f in "$out"/${t}_*; do
        unit=us
        [ "$t" = tp ] && unit=Gbit/s
        printf '| %-8s | %-40s | %-20s | %s | %s |\n' \
            "$(case $t in sp) echo 'seqpacket p50';; st) echo 'stream p50';; tp) echo 'stream 64K';; esac)" \
            "${f##*/${t}_}" "$unit" "$(tr '\n' ' ' <"$f")" "$(median <"$f")"
    done
done
rm -rf "$out"
