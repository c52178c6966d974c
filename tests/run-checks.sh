#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run each test command given (binary plus arguments), print each one's Check summary,
# and end with one "N passed, N failed, N skipped" line over all of them. A test that
# prints "SKIP <test>: <reason>" (tests/skip.h) passed for Check but ran nothing: it is
# counted as skipped, not passed. Above the failures and the summary, the seconds of the
# longest commands (where a slow run spent its time). Exit 1 if any failed.
set -u
if [ "${1:-}" = --self-test ]; then
    # Two fake test binaries: 3 checks with one SKIP (2 passed, 1 skipped), and 2 checks
    # with one failure (1 passed, 1 failed).
    t=$(mktemp -d)
    trap 'rm -rf "$t"' EXIT
    printf '#!/bin/sh\necho "SKIP a: not here"\necho "100%%: Checks: 3, Failures: 0, Errors: 0"\n' >"$t/ok"
    printf '#!/bin/sh\necho "t.c:7:F:suite:case_x:0: boom"\necho "50%%: Checks: 2, Failures: 1, Errors: 0"\nexit 1\n' >"$t/bad"
    chmod +x "$t/ok" "$t/bad"
    rc=0
    bash "$0" "$t" "$t/ok" "$t/bad" >"$t/out" || rc=$?
    last=$(tail -n 1 "$t/out")
    want="3 passed, 1 failed, 1 skipped"
    named=$(tail -n 4 "$t/out" | grep -c '^!! t.c:7:F:suite:case_x:')
    if [ "$last" = "$want" ] && [ "$rc" -ne 0 ] && [ "$named" -eq 1 ]; then
        echo "run-checks self-test: '$want', failure named at the end, nonzero exit: ok"
        exit 0
    fi
    echo "run-checks self-test: got '$last' (exit $rc), wanted '$want', the failing case named above it and a nonzero exit" >&2
    exit 1
fi
build=$1; shift
mult=${EXS_TEST_TIMEOUT_MULT:-1}
total_pass=0; total_fail=0; total_skip=0; bad=0
failed_list=$(mktemp)
times_list=$(mktemp)
for cmd in "$@"; do
    echo "== $cmd"
    out=$(mktemp)
    t0=$SECONDS
    # shellcheck disable=SC2086
    timeout $((600 * mult)) $cmd 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    echo "$((SECONDS - t0)) $cmd" >>"$times_list"
    line=$(grep -E '^[0-9]+%: Checks: ' "$out" | tail -n 1)
    skips=$(grep -c -E '^SKIP [^:]+: ' "$out")
    if [ -n "$line" ]; then
        checks=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
        fails=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
        errs=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
        pass=$((checks - fails - errs))
        if [ "$skips" -gt "$pass" ]; then
            # a skipping test that also failed: never report a negative pass count
            echo "!! $cmd: $skips SKIP lines but only $pass passed"
            skips=$pass
        fi
        total_pass=$((total_pass + pass - skips))
        total_skip=$((total_skip + skips))
        total_fail=$((total_fail + fails + errs))
    else
        total_fail=$((total_fail + 1))
    fi
    [ "$rc" -eq 0 ] || { bad=1; echo "!! $cmd exited $rc"; }
    # Check's failure lines (file:line:F|E:suite:test:message), kept for the end of the run
    grep -E '^[^:]+:[0-9]+:[FE]:' "$out" >>"$failed_list"
    [ "$rc" -eq 0 ] || echo "$cmd exited $rc" >>"$failed_list"
    rm -f "$out"
done
# Where the time went (seconds, the longest first): what to look at when the run is slow.
echo "== seconds per command, the longest first"
sort -rn "$times_list" | head -n 12 | sed 's/^/   /'
rm -f "$times_list"
# The failures again, right above the summary: a log read from its tail names them.
if [ -s "$failed_list" ]; then
    echo "== failures"
    sed 's/^/!! /' "$failed_list"
fi
rm -f "$failed_list"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ $bad -eq 0 ] && [ $total_fail -eq 0 ]
