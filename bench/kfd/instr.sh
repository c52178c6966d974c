#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make check: the library's own instructions per exs_send on a kernel TCP socket that
# completes at once, with its exs_qdequeue (issue 27). callgrind counts kfd_bench --only exs
# (64 B sends, one outstanding) at N and 2N sends: the difference over N is one send and its
# event, start-up cancelled; the same of --only send (plain send()) is the loop's and libc's
# share, taken off. The library's share must stay below LIMIT instructions (1,818 before the
# send's fast path, the event queue's light table lock and the dequeue without the driver
# bookkeeping; 1,308-1,383 after; 1,001 once the send went without the probe, without an
# operation object and without the kfd table's lock; 608 with the reservation one CAS, the
# event written in place and the futex locks; 317-321 with exs_send's first look, a lean
# path for a send that completes at once, and exs_qdequeue's hot path without a frame:
# the bound, 420, keeps a third above that). Instruction counts do not depend on the
# machine's load. Prints a
# Check summary line (tests/run-checks.sh); a SKIP when valgrind is missing or the bench is a
# sanitizer build (valgrind cannot run those).
set -u
bench=$1
n=${2:-5000}
limit=${3:-420}
if ! command -v valgrind >/dev/null 2>&1; then
    echo "SKIP kfd_instr: valgrind is missing"
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi
if nm "$bench" 2>/dev/null | grep -q -E '__(asan|tsan|ubsan)_'; then
    echo "SKIP kfd_instr: $bench is a sanitizer build"
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Ir of the sending thread (main, -01: the progress thread's work depends on time, not on
# the count; the receiver, forked before exs_init, counts far fewer)
ir() {
    rm -f "$dir"/cg.*
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/cg.%p" "$bench" \
        --only "$1" --size 64 --count "$2" >/dev/null 2>"$dir/err" || { cat "$dir/err" >&2; return 1; }
    awk '/^summary:/ { if ($2 > m) m = $2 } END { print m + 0 }' "$dir"/cg.*-01
}
per() {
    local a b
    a=$(ir "$1" "$n") && b=$(ir "$1" $((2 * n))) || return 1
    echo $(((b - a) / n))
}
if ! e=$(per exs) || ! s=$(per send); then
    echo "kfd_instr: kfd_bench failed under valgrind"
    echo "0%: Checks: 1, Failures: 1, Errors: 0"
    exit 1
fi
lib=$((e - s))
echo "kfd_instr: instructions per 64 B send: exs_send + exs_qdequeue $e, send() $s, the library's $lib (limit $limit)"
if [ "$lib" -gt 0 ] && [ "$lib" -lt "$limit" ]; then
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi
echo "0%: Checks: 1, Failures: 1, Errors: 0"
exit 1
