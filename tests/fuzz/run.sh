#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run each libFuzzer target for SECS seconds from its checked-in seeds (tests/fuzz/corpus/T)
# and the reproducers of crashes it found (tests/fuzz/crashes/T);
# new inputs go to a scratch directory, a crash to BUILD/crash-T-*. Prints exec/s per target
# and ends with "N passed, N failed" and Check's summary line (read by tests/run-checks.sh).
#   tests/fuzz/run.sh BUILD SECS TARGET...
set -u
build=$1; secs=$2; shift 2
pass=0; fail=0
for t in "$@"; do
    scratch=$(mktemp -d)
    log=$build/tests/fuzz/$t.log
    crashes=; [ -d "tests/fuzz/crashes/$t" ] && crashes=tests/fuzz/crashes/$t
    echo "== fuzz $t (${secs}s)"
    # the in-process servers still hold live connections at exit: not leaks
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
        "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 \
        -detect_leaks=0 -print_final_stats=1 -artifact_prefix="$build/crash-$t-" \
        "$scratch" "tests/fuzz/corpus/$t" $crashes >"$log" 2>&1
    rc=$?
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
    rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        echo "   ok: ${runs:-?} runs, ${rate:-?} exec/s"
        pass=$((pass + 1))
    else
        echo "!! $t failed (exit $rc); last lines of $log:"
        tail -n 40 "$log"
        fail=$((fail + 1))
    fi
    rm -rf "$scratch"
done
echo "fuzz: $pass passed, $fail failed"
echo "$((pass * 100 / ($pass + $fail > 0 ? $pass + $fail : 1)))%: Checks: $((pass + fail)), Failures: $fail, Errors: 0"
[ "$fail" -eq 0 ]
