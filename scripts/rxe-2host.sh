#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-2host.sh: run a scenario on two qemu guests ("hosts" a and b), each with its own
# Soft-RoCE device, joined by one virtual link shaped with netem.
#
#   scripts/rxe-2host.sh DIR SCENARIO [ARG...]
#
# Each guest is a scripts/rxe-vm.sh guest (same kernel, same base initramfs) with a second
# virtio NIC on a qemu UDP socket link to the other guest (host loopback, nothing else on
# it). DIR is copied to /guest in both, with the guest library (rxe-2host-guest.sh, as
# 2host.sh), iproute2's ip and tc, and sch_netem.ko; both run `sh SCENARIO ARG...` there,
# the scenario sourcing ./2host.sh (which sets up the link, rxe1 on it, netem and the
# hairpin route; see that file). Their outputs are streamed here, prefixed "a| " and
# "b| ". Exit status: 0 when both guests' scenarios exit 0; else a's status if nonzero,
# else b's (2 usage/setup, 3 a guest failed before its scenario, 124 time limit).
#
# Environment: RXE_2HOST_NETEM_B="delay 1ms" (netem on b's egress for the whole run; a
# sets its own per run in the scenario), RXE_VM_TIMEOUT (default 3600, each guest),
# RXE_2HOST_MEM=1G, RXE_2HOST_SMP=1 (per guest: two TCG guests on a small host), BUILD,
# RXE_2HOST_ENV="VAR=VALUE ..." (exported in both guests by 2host.sh before the scenario's
# runs, e.g. EXS_VRB_GRANT=mr, CK_RUN_CASE=outstanding; words split on blanks, no quoting).
# Why two guests and not two network namespaces in one: Debian 12's 6.1 rdma_rxe receives
# only in the initial network namespace (spec/rxe-vm.md, "Two hosts").
set -euo pipefail
me=rxe-2host
say() { echo "$me: $*" >&2; }
die() { say "$*"; exit 2; }
[ $# -ge 2 ] || die "usage: $0 DIR SCENARIO [ARG...]"
dir=$1
shift
[ -d "$dir" ] || die "not a directory: $dir"
[ -f "$dir/$1" ] || die "no scenario $1 in $dir"
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-build}
export RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-3600} RXE_VM_MEM=${RXE_2HOST_MEM:-1G} RXE_VM_SMP=${RXE_2HOST_SMP:-1}
t0=$(date +%s)

netem_ko=$(find /lib/modules -name 'sch_netem.ko*' 2>/dev/null | sort -V | tail -n 1)
[ -n "$netem_ko" ] || die "sch_netem.ko not found (apt-get install linux-image-amd64)"
for b in /usr/bin/ip /usr/sbin/tc; do [ -x "$b" ] || [ -x "/sbin/${b##*/}" ] || die "$b missing (iproute2)"; done

work=$(mktemp -d "${TMPDIR:-/tmp}/rxe-2host.XXXXXX")
pids=()
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# Two free UDP ports on the host's loopback for the link (qemu -netdev socket,udp=).
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        ss -Hlun "sport = :$p" 2>/dev/null | grep -q . || { echo $p; return; }
    done
}
pa=$(free_port)
pb=$(free_port)
while [ "$pb" = "$pa" ]; do pb=$(free_port); done

for h in a b; do
    mkdir -p "$work/$h"
    cp -a "$dir"/. "$work/$h/"
    cp "$here/rxe-2host-guest.sh" "$work/$h/2host.sh"
    cp /usr/bin/ip "$work/$h/ip" 2>/dev/null || cp /sbin/ip "$work/$h/ip"
    cp /usr/sbin/tc "$work/$h/tc" 2>/dev/null || cp /sbin/tc "$work/$h/tc"
    case $netem_ko in
        *.xz) xz -dc "$netem_ko" >"$work/$h/sch_netem.ko" ;;
        *.zst) zstd -qdc "$netem_ko" >"$work/$h/sch_netem.ko" ;;
        *) cp "$netem_ko" "$work/$h/sch_netem.ko" ;;
    esac
    echo $h >"$work/$h/2host-role"
    printf '%s\n' "${RXE_2HOST_NETEM_B:-delay 1ms}" >"$work/$h/2host-netem-b"
    : >"$work/$h/2host-env"
    for kv in ${RXE_2HOST_ENV:-}; do
        case $kv in
            [A-Za-z_]*=*) printf '%s\n' "$kv" >>"$work/$h/2host-env" ;;
            *) die "RXE_2HOST_ENV: not VAR=VALUE: $kv" ;;
        esac
    done
done
echo 52:54:00:00:03:01 >"$work/a/2host-mac"
echo 52:54:00:00:03:02 >"$work/b/2host-mac"

# Guest h: its link NIC sends to the other's port and receives on its own.
boot() {
    local h=$1 mine=$2 theirs=$3
    shift 3
    RXE_VM_QEMU_ARGS="-netdev socket,id=link,udp=127.0.0.1:$theirs,localaddr=127.0.0.1:$mine -device virtio-net-pci,netdev=link,mac=$(cat "$work/$h/2host-mac"),romfile=" \
        BUILD=$build bash "$here/rxe-vm.sh" "$work/$h" "$@" >"$work/$h.out" 2>"$work/$h.err"
}
# a first; b once a's run has started (both share the base initramfs cache, built by a).
shift_args=("$@")
: >"$work/a.out"; : >"$work/b.out"; : >"$work/a.err"; : >"$work/b.err"
(rc=0; boot a "$pa" "$pb" sh "${shift_args[@]}" || rc=$?; echo $rc >"$work/a.rc") &
pids+=($!)
until grep -q 'booting' "$work/a.err" 2>/dev/null || [ -e "$work/a.rc" ]; do sleep 0.2; done
(rc=0; boot b "$pb" "$pa" sh "${shift_args[@]}" || rc=$?; echo $rc >"$work/b.rc") &
pids+=($!)
tail -s 0.3 -f --pid="${pids[0]}" "$work/a.out" | sed -u 's/^/a| /' &
tail -s 0.3 -f --pid="${pids[1]}" "$work/b.out" | sed -u 's/^/b| /' &
# When one guest's run ends in failure, the other would wait at its next barrier until its
# time limit: its qemu (found by the link port only it uses) is stopped.
stop_guest() {
    local p
    for p in $(pgrep -f "qemu-system.*localaddr=127.0.0.1:$1 " || true); do kill "$p" 2>/dev/null || true; done
}
# (After a grace of 120 s: a scenario that failed may still have met every barrier.)
grace=0
while [ ! -e "$work/a.rc" ] || [ ! -e "$work/b.rc" ]; do
    for h in a b; do
        o=b; [ $h = b ] && o=a
        if [ -e "$work/$h.rc" ] && [ ! -e "$work/$o.rc" ] && [ "$(cat "$work/$h.rc")" != 0 ]; then
            grace=$((grace + 1))
            if [ $grace -ge 120 ]; then
                say "$h failed (exit $(cat "$work/$h.rc")) and $o still runs after 120 s: stopping $o"
                if [ $o = a ]; then stop_guest "$pa"; else stop_guest "$pb"; fi
                break 2
            fi
        fi
    done
    sleep 1
done
wait "${pids[0]}" "${pids[1]}" || true
wait || true
pids=()
ra=$(cat "$work/a.rc" 2>/dev/null || echo 2)
rb=$(cat "$work/b.rc" 2>/dev/null || echo 2)
for h in a b; do sed "s/^/$h: /" "$work/$h.err" >&2; done
say "a exit $ra, b exit $rb, $(($(date +%s) - t0))s wall"
[ "$ra" -ne 0 ] && exit "$ra"
exit "$rb"
