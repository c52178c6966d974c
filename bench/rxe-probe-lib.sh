# SPDX-License-Identifier: MIT
# rxe-probe-lib.sh: sourced by the bench/rxe-probe-*.sh host scripts (bash, from the tree's top).
# probe_dir NAME GUEST_SCRIPT: D=$B/NAME/run, emptied, with GUEST_SCRIPT as probe.sh in it.
probe_dir() {
    D=$B/$1/run
    rm -rf "$D" && mkdir -p "$D"
    cp "$2" "$D/probe.sh"
}
# probe_guest NAME BINS [VAR=VALUE...]: runs `sh probe.sh` from $D in one scripts/rxe-vm.sh
# guest (bench-rxe's cached base initramfs with the host programs BINS, clocksource=tsc as
# bench-rxe), the VAR=VALUE words in its environment; its output is teed to
# $B/NAME/out.log, and the host's CPU pressure (/proc/pressure/cpu avg10) is sampled every
# 2 s into $B/NAME/psi.log ("PSI <epoch> avg10=<percent>").
probe_guest() {
    local name=$1 bins=$2
    shift 2
    (while :; do echo "PSI $(date +%s) $(awk '/^some/ {print $2}' /proc/pressure/cpu)"; sleep 2; done) \
        >"$B/$name/psi.log" &
    PROBE_SAMPLER=$!
    trap 'kill $PROBE_SAMPLER' EXIT
    BUILD=$B/rxe-bench RXE_VM_BINS="$bins" RXE_VM_APPEND="clocksource=tsc tsc=reliable" \
        bash scripts/rxe-vm.sh "$D" env "$@" sh probe.sh 2>&1 | tee "$B/$name/out.log"
}
