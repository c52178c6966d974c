# SPDX-License-Identifier: MIT
# rxe-2host-guest.sh: the guest side of scripts/rxe-2host.sh (busybox sh), sourced by a
# scenario as `. ./2host.sh`. The same scenario runs in both guests; ROLE says which one
# this is (a: 10.0.3.1, b: 10.0.3.2). Sourcing it sets up the link between the two:
#
#   - the second NIC (found by the MAC the harness gave it) on 10.0.3.x/24, with its own
#     Soft-RoCE device rxe1, the guest's only one (rxe0, on qemu's user network, is deleted);
#   - netem on the link's egress: $NETEM_B on b (from RXE_2HOST_NETEM_B), nothing on a
#     until the scenario calls `netem ...` (a sets its own egress per run);
#   - the hairpin for one-process tests (the integration suite): on a, 10.0.4.1 is a second
#     address whose packets to and from 10.0.3.1 are routed through b (policy routing ahead
#     of the local table, b forwards), so a pair's connection in one process on a crosses
#     the link twice, through netem both ways, between two QPs of a's rxe1.
#
# Then it offers: ON a|b (true on that host), netem SPEC... / netem_off (a qdisc on this
# host's egress), barrier (both hosts meet), run NAME LIMIT CMD... (a verdict line per run,
# with rxe1's packet counters: fails when CMD fails or passed without a packet through
# rxe1), and finish (the summary; exits with the status).
ROLE=$(cat /guest/2host-role)
IP=/guest/ip   # iproute2's: busybox sh prefers its own applets for bare names
TC=/guest/tc
A=10.0.3.1
B=10.0.3.2
HAIRPIN=10.0.4.1
case $ROLE in a) ME=$A PEER=$B ;; *) ME=$B PEER=$A ;; esac
export PATH=/guest:$PATH
# libexs's keepalive (1 s x 3 probes by default) declares a peer dead after about 4 s of
# silence; a TCG guest on a loaded host stalls that long (blast failed ETIMEDOUT on the plain
# link at load average 46): 5 s x 3 here unless RXE_2HOST_KEEPALIVE_MS says otherwise.
export EXS_KEEPALIVE_INTV_MS=${RXE_2HOST_KEEPALIVE_MS:-5000}
# RXE_2HOST_ENV on the host (scripts/rxe-2host.sh): one VAR=VALUE a line, exported here, after
# the scenario's own arguments (so it overrides them), e.g. EXS_VRB_GRANT=mr.
ENV2=
while read -r kv; do
    [ -n "$kv" ] || continue
    export "$kv"
    ENV2="$ENV2 $kv"
done </guest/2host-env 2>/dev/null
ON() { [ "$ROLE" = "$1" ]; }
say2() { echo "[$ROLE $(cut -d' ' -f1 /proc/uptime)] $*"; }
die2() { say2 "setup failed: $*"; dmesg | tail -n 20; exit 3; }

insmod /guest/sch_netem.ko || die2 "insmod sch_netem"
mac=$(cat /guest/2host-mac)
LINK=
for n in /sys/class/net/*; do [ "$(cat "$n/address")" = "$mac" ] && LINK=${n##*/}; done
[ -n "$LINK" ] || die2 "no NIC with MAC $mac"
for f in all default $LINK; do
    echo 0 >/proc/sys/net/ipv4/conf/$f/rp_filter
    echo 0 >/proc/sys/net/ipv4/conf/$f/accept_redirects
    echo 0 >/proc/sys/net/ipv4/conf/$f/send_redirects
done
$IP addr add $ME/24 dev "$LINK" && $IP link set "$LINK" up || die2 "cannot configure $LINK"
# rxe0 (on qemu's user network) goes: the verbs provider takes the first active device.
rdma link delete rxe0 || die2 "rdma link delete rxe0"
rdma link add rxe1 type rxe netdev "$LINK" || die2 "rdma link add rxe1"
i=0
until ibv_devinfo -d rxe1 2>/dev/null | grep -q PORT_ACTIVE; do
    i=$((i + 1)); [ $i -le 300 ] || die2 "rxe1 never became ACTIVE"; sleep 0.1
done
# RXE_2HOST_DYNDBG=FILE[,FILE...] (in RXE_2HOST_ENV): the kernel's dynamic debug messages
# of those rxe source files (e.g. rxe_resp.c: the responder's states), in the kernel log
# that a failed run prints (RXE_2HOST_DMESG lines, default 12)
if [ -n "${RXE_2HOST_DYNDBG:-}" ]; then
    mount -t debugfs none /sys/kernel/debug 2>/dev/null
    for f in $(echo "$RXE_2HOST_DYNDBG" | tr , ' '); do
        echo "file $f +p" >/sys/kernel/debug/dynamic_debug/control || say2 "dynamic debug of $f refused"
    done
fi
if ON a; then
    $IP addr add $HAIRPIN/32 dev "$LINK"
    echo 1 >/proc/sys/net/ipv4/conf/all/accept_local
    echo 1 >/proc/sys/net/ipv4/conf/$LINK/accept_local
    $IP route add $HAIRPIN via $B dev "$LINK" src $A table 100
    $IP route add $A via $B dev "$LINK" src $HAIRPIN table 100
    $IP rule add pref 10 to $HAIRPIN iif lo lookup 100
    $IP rule add pref 11 from $HAIRPIN to $A iif lo lookup 100
    $IP rule add pref 100 lookup local && $IP rule del pref 0 lookup local ||
        die2 "cannot move the local routing table"
else
    echo 1 >/proc/sys/net/ipv4/ip_forward
    $IP route add $HAIRPIN/32 dev "$LINK"
    NETEM_B=$(cat /guest/2host-netem-b 2>/dev/null)
    [ -z "$NETEM_B" ] || $TC qdisc replace dev "$LINK" root netem limit 100000 $NETEM_B ||
        die2 "netem $NETEM_B"
fi
say2 "$LINK $ME, rxe1 ACTIVE${NETEM_B:+, egress netem $NETEM_B}${ENV2:+; environment$ENV2}"

netem() {
    $TC qdisc replace dev "$LINK" root netem limit 100000 "$@" || return 1
    say2 "egress netem: $*"
}
netem_off() { $TC qdisc del dev "$LINK" root 2>/dev/null; say2 "egress netem off"; }

# Both hosts meet: a listens on port 7100+n (nc -e true closes at once), b connects until
# that succeeds. Bounded by the guest's own time limit.
BARRIER_N=0
barrier() {
    BARRIER_N=$((BARRIER_N + 1))
    if ON a; then
        nc -l -p $((7100 + BARRIER_N)) -e true </dev/null >/dev/null || say2 "barrier $BARRIER_N: nc failed"
    else
        until nc $A $((7100 + BARRIER_N)) </dev/null >/dev/null 2>&1; do sleep 0.3; done
    fi
    say2 "barrier $BARRIER_N${1:+ ($1)}"
}

cnt=/sys/class/infiniband/rxe1/ports/1/hw_counters
# every nonzero rxe1 counter, totals since rxe1 was added
rxe_counters() { (cd $cnt && for f in *; do v=$(cat $f); [ "$v" = 0 ] || printf '%s=%s ' $f $v; done); }
passed=0
failed=0
failures=
run() {
    name=$1; limit=$2; shift 2
    echo; say2 "=== $name: $*"
    s0=$(cat $cnt/sent_pkts); r0=$(cat $cnt/rcvd_pkts); d0=$(cat $cnt/duplicate_request 2>/dev/null || echo 0)
    q0=$(cat $cnt/retry_exceeded_err 2>/dev/null || echo 0); t0=$(date +%s)
    e0=$(cat /sys/class/net/$LINK/statistics/tx_packets)
    timeout "$limit" setsid "$@"
    rc=$?
    s=$(($(cat $cnt/sent_pkts) - s0)); r=$(($(cat $cnt/rcvd_pkts) - r0)); t=$(($(date +%s) - t0))
    dup=$(($(cat $cnt/duplicate_request 2>/dev/null || echo 0) - d0))
    rex=$(($(cat $cnt/retry_exceeded_err 2>/dev/null || echo 0) - q0))
    e=$(($(cat /sys/class/net/$LINK/statistics/tx_packets) - e0))
    if [ $rc -ne 0 ]; then
        why="FAIL: exit $rc"; [ $rc -eq 143 ] && why="$why (killed after ${limit}s)"
    elif [ $s -eq 0 ]; then
        why="FAIL: exit 0 but no packet went through rxe1 (not the verbs provider?)"; rc=1
    elif [ $e -lt $((s / 2)) ]; then
        # rxe loops packets to its own addresses back in the kernel: they never reach the NIC
        why="FAIL: exit 0 but rxe1's packets did not cross the link ($LINK sent $e)"; rc=1
    else
        why=PASS
    fi
    say2 "--- $name: $why; ${t}s; rxe1 sent $s, received $r packets, duplicate requests $dup, retry exceeded $rex; $LINK sent $e"
    # a failure: every nonzero rxe1 counter (totals since boot), to tell a stalled QP
    # (retries, sequence errors, RNR) from the library's own verdict
    [ $rc -eq 0 ] || say2 "rxe1 counters: $(rxe_counters)"
    # and the kernel's last words (rxe reports a refused bind or a QP error there)
    [ $rc -eq 0 ] || dmesg | grep -v 'speed is unknown' | tail -n "${RXE_2HOST_DMESG:-12}" |
        sed "s/^/[$ROLE dmesg] /"
    if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures $name"; fi
    return $rc
}
finish() {
    echo; say2 "rxe-2host $ROLE: $passed passed, $failed failed${failures:+:$failures}"
    [ $failed -eq 0 ]
    exit $?
}
