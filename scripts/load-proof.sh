#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The suite under load (issue 24's proof; README.md, "Stress"): one busy
# loop per core for the whole run, and beside them RUNS x `make -j2 check` and RUNS x
# `make check-rxe` of the commit checked out, as two streams at once, each in its own
# worktree of that commit (two makes never share a tree). A stream stops at its first
# failure unless --keep-going. Each run's log is timestamped line by line; one summary line
# per run goes to $DIR/summary, printed at the end.
#
#   bash scripts/load-proof.sh [--runs N] [--no-rxe] [--no-check] [--keep-going] [--dir DIR]
#
# Measured (2 cores, loaded further by other work): a make check takes 45-60 min and a
# make check-rxe 28-38 min beside the busy loops, so five of each take most of a day's
# session; the summary says which runs passed in a row.
set -u
runs=5 rxe=1 check=1 keep=0
dir=${TMPDIR:-/tmp}/exs-load-proof
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2; shift ;;
    --no-rxe) rxe=0 ;;
    --no-check) check=0 ;;
    --keep-going) keep=1 ;;
    --dir) dir=$2; shift ;;
    *) echo "usage: $0 [--runs N] [--no-rxe] [--no-check] [--keep-going] [--dir DIR]" >&2; exit 2 ;;
    esac
    shift
done
top=$(cd "$(dirname "$0")/.." && pwd)
rev=$(git -C "$top" rev-parse HEAD) || exit 1
mkdir -p "$dir"
: >"$dir/summary"
busy=()
stop() {
    [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null
}
trap stop EXIT
stamp() { awk '{ print strftime("%H:%M:%S"), $0; fflush() }'; }

# stream NAME TARGET: RUNS x make TARGET in $dir/NAME (a worktree of rev)
stream() {
    local name=$1 target=$2 wt=$dir/$1 i t0 rc
    git -C "$top" worktree remove --force "$wt" >/dev/null 2>&1
    git -C "$top" worktree add --detach "$wt" "$rev" >/dev/null || return 1
    make -C "$wt" -j2 all >"$dir/$name-build.log" 2>&1 || { echo "$name: build failed" >>"$dir/summary"; return 1; }
    for i in $(seq 1 "$runs"); do
        t0=$(date +%s)
        make -C "$wt" $target 2>&1 | stamp >"$dir/$name$i.log"
        rc=${PIPESTATUS[0]}
        echo "$name #$i: exit $rc, $(($(date +%s) - t0)) s: $(grep -E 'passed, [0-9]+ failed' "$dir/$name$i.log" | tail -n 1 | cut -c10-)" >>"$dir/summary"
        [ "$rc" -eq 0 ] || [ "$keep" -eq 1 ] || return 1
    done
}

for _ in $(seq 1 "$(nproc)"); do
    (exec -a exs-busy-loop bash -c 'while :; do :; done') &
    busy+=($!)
done
echo "load-proof: $rev, $runs runs, ${#busy[@]} busy loops, logs in $dir"
pids=()
[ "$check" -eq 1 ] && { stream check "-j2 check" & pids+=($!); }
[ "$rxe" -eq 1 ] && { stream rxe check-rxe & pids+=($!); }
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=1; done
cat "$dir/summary"
exit $bad
