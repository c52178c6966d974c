# SPDX-License-Identifier: MIT
# rxe-guest-lib.sh: sourced by the guest-side bench scripts (busybox sh, in the guest
# directory: bench/rxe-ab.sh, bench/rxe-probe-stall-guest.sh).

# wait_listen PORT TAG: until something listens on TCP port PORT (30 s at most; then
# "TAG receiver PORT never listened")
wait_listen() {
    wl_i=0
    until netstat -ltn 2>/dev/null | grep -q ":$1 "; do
        wl_i=$((wl_i + 1)); [ $wl_i -le 300 ] || { echo "$2 receiver $1 never listened"; return 1; }
        sleep 0.1
    done
}
