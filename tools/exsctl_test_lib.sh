# SPDX-License-Identifier: MIT
# The opening shared by tools/ctl_test.sh and tools/trace_test.sh (sourced): results, work dir, waits.
#
# usage: . tools/exsctl_test_lib.sh NAME WHY_PYTHON3 [BUILD]
#   Sets build (BUILD, default build), mult (EXS_TEST_TIMEOUT_MULT), exsctl; pass NAME,
#   fail NAME WHY and summary (a Check-style line; its status says whether all passed);
#   skips the whole test (exit 0, one passing check) without python3, saying WHY_PYTHON3;
#   makes the work directory $work (removed at exit, with every pid in pids killed),
#   exports EXS_CTL_DIR=$work/ctl and EXS_PROVIDER=tcp; wait_for SECONDS CMD... and
#   jq_py FILE EXPR.
set -u
lib_name=$1
build=${3:-build}
mult=${EXS_TEST_TIMEOUT_MULT:-1}
exsctl=$build/tools/exsctl
checks=0
fails=0
pass() { checks=$((checks + 1)); echo "ok $1"; }
fail() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL $1: $2"; }
summary() {
    echo "$(( checks ? 100 * (checks - fails) / checks : 100 ))%: Checks: $checks, Failures: $fails, Errors: 0"
    [ "$fails" -eq 0 ]
}
if ! command -v python3 >/dev/null; then
    echo "SKIP $lib_name: python3 is needed for $2"
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi

work=$(mktemp -d)
export EXS_CTL_DIR=$work/ctl EXS_PROVIDER=tcp
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# wait_for SECONDS CMD...: until CMD succeeds
wait_for() {
    local t=$(( $1 * 10 * mult )); shift
    while [ $t -gt 0 ]; do "$@" && return 0; sleep 0.1; t=$((t - 1)); done
    return 1
}

# jq_py FILE EXPR: evaluate a Python expression on the parsed JSON (j)
jq_py() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
