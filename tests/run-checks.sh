#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run each test command given (binary plus arguments), print each one's Check summary,
# and end with one "N passed, N failed" line over all of them. Exit 1 if any failed.
set -u
build=$1; shift
mult=${EXS_TEST_TIMEOUT_MULT:-1}
total_pass=0; total_fail=0; bad=0
for cmd in "$@"; do
    echo "== $cmd"
    out=$(mktemp)
    # shellcheck disable=SC2086
    timeout $((600 * mult)) $cmd 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^[0-9]+%: Checks: ' "$out" | tail -n 1)
    if [ -n "$line" ]; then
        checks=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
        fails=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
        errs=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
        total_pass=$((total_pass + checks - fails - errs))
        total_fail=$((total_fail + fails + errs))
    else
        total_fail=$((total_fail + 1))
    fi
    [ "$rc" -eq 0 ] || { bad=1; echo "!! $cmd exited $rc"; }
    rm -f "$out"
done
echo "$total_pass passed, $total_fail failed"
[ $bad -eq 0 ] && [ $total_fail -eq 0 ]
