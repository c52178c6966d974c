# SPDX-License-Identifier: MIT
# rxe-2host-wan.sh: long distance and failure across the two hosts of scripts/rxe-2host.sh
# (make rxe-2host-wan; busybox sh, run in both guests). Arguments VAR=VALUE are exported.
#
# 1. Seed 004's Fig. 13 point 8/8, exp:1M:4M, across a 48 ms round trip (netem delay
#    $WAN_DELAY on each host's egress: b's from RXE_2HOST_NETEM_B, a's set here): libexs
#    over verbs in the three modes, then kernel TCP with cubic and with bbr, each run
#    verified; then the same with loss 0.1% and 1% on a's egress (the data direction). The
#    libexs sender runs with EXS_FALLBACK=off: over verbs or not at all.
# 2. The cut-over: with EXS_FALLBACK=any at both ends, b deletes its rxe1 (rdma link
#    delete) in the middle of a verified transfer: the transfer must complete, every byte
#    verified, over tcp (a's verdict), and the removal must complete while b's receiver
#    still runs, within WAN_DEL_LIMIT s (b's verdict: the provider let go of the device);
#    rxe1 is added back afterwards.
# 3. The link down (netem loss 100% both ways) for WAN_DOWN seconds in a transfer without
#    fallback: each end must report ETIMEDOUT ("timed out") within WAN_TO_LIMIT s of its
#    own cut (default 2 x keepalive_intv x 4 probes' worth), while the link is still down.
#    make check-rxe-2host-fail runs parts 2 and 3 on the plain link.
#    WAN_PHASES="long cutover linkdown" picks the parts;
#    WAN_MODES="direct indirect dynamic", WAN_CCS="cubic bbr" and WAN_LOSSES="0 0.1% 1%"
#    the runs of part 1 (WAN_CCS= for none).
# Verdict lines as in check-rxe-2host. Numbers under TCG say little about the link and much
# about the emulated CPUs; the comparisons are made in one run.
for kv in "$@"; do export "$kv"; done
. ./2host.sh
export EXS_PROVIDER=verbs EXS_FALLBACK=any
: "${BLAST_PORT:=7471}" "${WAN_DELAY:=24ms}" "${WAN_TIME:=8}" "${WAN_LOSSES:=0 0.1% 1%}"
: "${WAN_PHASES:=long cutover linkdown}" "${WAN_DOWN:=40}"
: "${WAN_MODES:=direct indirect dynamic}" "${WAN_CCS=cubic bbr}" "${WAN_DEL_LIMIT:=60}"
: "${WAN_TO_LIMIT:=$((2 * 4 * EXS_KEEPALIVE_INTV_MS / 1000))}"
phase() { case " $WAN_PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
# verdict NAME OK DETAIL: a judged line, counted in finish's summary
verdict() {
    if [ "$2" = 1 ]; then
        say2 "--- $1: PASS ($3)"; passed=$((passed + 1))
    else
        say2 "--- $1: FAIL ($3)"; failed=$((failed + 1)); failures="$failures $1"
    fi
}
# seconds (guest uptime, 2 decimals) from $1 to the stamp of the first line of file $2
# stamped at or after it that matches $3; nothing when none does
stamp_after() {
    awk -v t0="$1" -v pat="$3" '$0 ~ pat { s = substr($1, 2) + 0; if (s >= t0) { printf "%.2f", s - t0; exit } }' "$2"
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }
# Timestamped lines (guest uptime): each host's clock, compared only with itself.
stamp() { while IFS= read -r l; do echo "[$(cut -d' ' -f1 /proc/uptime)] $l"; done; }
insmod /guest/tcp_bbr.ko 2>/dev/null || say2 "tcp_bbr not loaded"
if ON b; then
    (setsid sh -c 'echo $$ >/tmp/srv.pid; exec ./blast -s -p $0' $BLAST_PORT 2>&1 | stamp >blast-server.log) &
    srv=$!
    until netstat -ltn | grep -q ":$BLAST_PORT "; do sleep 0.2; done
fi
barrier "receiver up"
if ON a && phase long; then
    for loss in $WAN_LOSSES; do
        if [ "$loss" = 0 ]; then netem delay $WAN_DELAY; else netem delay $WAN_DELAY loss $loss; fi
        for mode in $WAN_MODES; do
            # EXS_FALLBACK=off at the sender: a connect that fails over verbs fails the run
            # (with auto or any it would go on over tcp, as it did at 0.1% and 1% loss)
            run "exs-$mode-loss$loss" 600 env EXS_FALLBACK=off ./blast -c $B -p $BLAST_PORT --sends 8 --recvs 8 \
                --size exp:1M:4M --mode $mode --time $WAN_TIME --runs 1 --verify --quiet
        done
        for cc in $WAN_CCS; do
            echo $cc >/proc/sys/net/ipv4/tcp_congestion_control || continue
            # kernel TCP sends no packet through rxe1: judged by its exit status alone
            say2 "=== tcp-$cc-loss$loss"
            timeout 600 ./blast -c $B -p $BLAST_PORT --transport tcp --sends 8 --recvs 8 \
                --size exp:1M:4M --time $WAN_TIME --runs 1 --verify --quiet
            rc=$?
            say2 "--- tcp-$cc-loss$loss: $([ $rc -eq 0 ] && echo PASS || echo "FAIL: exit $rc")"
            if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures tcp-$cc-loss$loss"; fi
        done
    done
    netem_off
fi
barrier "long distance done"
# The cut-over: a's transfer runs 3 x WAN_TIME; b removes its device 2 s after it is seen
# running over verbs (500 packets through a's rxe1). a reads
# its rxe1 and link NIC counters at the start, when b says the device is gone, and at the
# end: packets on rxe1 before, on the NIC (tcp) after.
cnt_now() { echo "rxe1 sent $(cat $cnt/sent_pkts), $LINK sent $(cat /sys/class/net/$LINK/statistics/tx_packets)"; }
if phase cutover; then
    if ON a; then
        say2 "cut-over: at start $(cnt_now)"
        s0=$(cat $cnt/sent_pkts)
        ./blast -c $B -p $BLAST_PORT --mode dynamic --time $((3 * WAN_TIME)) --runs 1 --verify \
            --quiet >cutover.out 2>&1 &
        cl=$!
        # the transfer runs over verbs (its connect takes seconds in a loaded TCG guest)
        # before b removes its device: 500 packets through rxe1, at most 60 s
        i=0
        while [ $(($(cat $cnt/sent_pkts) - s0)) -lt 500 ] && [ $i -lt 300 ] && kill -0 $cl 2>/dev/null; do
            sleep 0.2; i=$((i + 1))
        done
        say2 "cut-over: transfer under way: $(cnt_now)"
    fi
    barrier "cut-over transfer started"
    if ON b; then
        sleep 2
        say2 "rdma link delete rxe1 (mid-transfer)"
        # It returns only once every process has let go of the device (rxe has no
        # disassociate): in the background, timed, while the receiver runs.
        t_del=$(uptime_s)
        (rdma link delete rxe1; echo $? >/tmp/del.rc; uptime_s >/tmp/del.at) &
        del=$!
        sleep 2
    fi
    barrier "rxe1 removal under way on b"
    if ON a; then
        say2 "cut-over: b's rxe1 gone: $(cnt_now)"
        wait $cl
        rc=$?
        cat cutover.out
        say2 "cut-over: at the end: $(cnt_now)"
        say2 "--- cutover: $([ $rc -eq 0 ] && echo PASS || echo "FAIL: exit $rc") (blast --verify across the device removal)"
        if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures cutover"; fi
    fi
    barrier "cut-over done"
    if ON b; then
        i=0
        while kill -0 $del 2>/dev/null && [ $i -lt $((WAN_DEL_LIMIT * 5)) ]; do sleep 0.2; i=$((i + 1)); done
        if kill -0 $del 2>/dev/null; then
            verdict cutover-release 0 "rdma link delete rxe1 still blocked after ${WAN_DEL_LIMIT}s: the receiver holds the device"
        else
            kill -0 "$(cat /tmp/srv.pid)" 2>/dev/null && alive=1 || alive=0
            took=$(awk -v a="$t_del" -v b="$(cat /tmp/del.at)" 'BEGIN { printf "%.1f", b - a }')
            ok=0; [ "$(cat /tmp/del.rc)" = 0 ] && [ $alive = 1 ] && ok=1
            verdict cutover-release $ok "rdma link delete rxe1 returned $(cat /tmp/del.rc) after ${took}s, receiver $([ $alive = 1 ] && echo still running || echo gone)"
        fi
        kill "$(cat /tmp/srv.pid)"
        wait $del
        rdma link add rxe1 type rxe netdev "$LINK" || say2 "rxe1 not added back"
        (setsid sh -c 'echo $$ >/tmp/srv.pid; exec ./blast -s -p $0' $BLAST_PORT 2>&1 | stamp >>blast-server.log) &
        srv=$!
        until netstat -ltn | grep -q ":$BLAST_PORT "; do sleep 0.2; done
    fi
    barrier "receiver up again"
fi
# The link down longer than keepalive allows: no fallback; a's transfer runs; WAN_TIME in,
# both hosts drop everything on their egress (netem loss 100%) for WAN_DOWN seconds. Both
# ends must fail with ETIMEDOUT within about keepalive_intv_ms x (keepalive_probes + 1)
# (EXS_KEEPALIVE_INTV_MS from 2host.sh, 5 s here: about 20 s), each timed from its own cut.
if phase linkdown; then
    if ON a; then
        s0=$(cat $cnt/sent_pkts)
        (EXS_FALLBACK=off ./blast -c $B -p $BLAST_PORT --mode dynamic \
            --time $((2 * WAN_TIME + WAN_DOWN)) --runs 1 --verify --quiet 2>&1
            echo "blast exit $?") | stamp >linkdown.out &
        cl=$!
        # connected and sending over verbs before the link goes down (as in the cut-over)
        i=0
        while [ $(($(cat $cnt/sent_pkts) - s0)) -lt 500 ] && [ $i -lt 300 ] && kill -0 $cl 2>/dev/null; do
            sleep 0.2; i=$((i + 1))
        done
    fi
    barrier "link-down transfer started"
    sleep $WAN_TIME
    netem loss 100%
    t_cut=$(uptime_s)
    say2 "link down (egress loss 100%) for ${WAN_DOWN}s"
    sleep $WAN_DOWN
    if ON a; then netem delay $WAN_DELAY; else netem $NETEM_B; fi
    say2 "link up"
    if ON a; then
        wait $cl
        rc=$(sed -n 's/.*blast exit \([0-9]*\).*/\1/p' linkdown.out)
        cat linkdown.out
        log=linkdown.out
    else
        log=blast-server.log
    fi
    # the end's first "timed out" line after the cut, timed from it
    took=$(stamp_after "$t_cut" "$log" 'timed out')
    ok=0
    [ -n "$took" ] && awk -v t="$took" -v l="$WAN_TO_LIMIT" 'BEGIN { exit !(t >= 0 && t <= l) }' && ok=1
    if ON a && [ "$rc" = 0 ]; then ok=0; fi
    verdict linkdown-$ROLE $ok "ETIMEDOUT ${took:-never} s after the cut (limit ${WAN_TO_LIMIT}s, link down ${WAN_DOWN}s)"
    barrier "link-down done"
fi
if ON b; then
    kill "$(cat /tmp/srv.pid)" 2>/dev/null
    echo "--- blast receiver output:"; cat blast-server.log
    say2 "rxe1 counters: $(rxe_counters)"
fi
finish
