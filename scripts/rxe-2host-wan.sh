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
#    verified, over tcp; rxe1 is added back afterwards.
# Verdict lines as in check-rxe-2host. Numbers under TCG say little about the link and much
# about the emulated CPUs; the comparisons are made in one run.
for kv in "$@"; do export "$kv"; done
. ./2host.sh
export EXS_PROVIDER=verbs EXS_FALLBACK=any
: "${BLAST_PORT:=7471}" "${WAN_DELAY:=24ms}" "${WAN_TIME:=8}" "${WAN_LOSSES:=0 0.1% 1%}"
insmod /guest/tcp_bbr.ko 2>/dev/null || say2 "tcp_bbr not loaded"
if ON b; then
    setsid ./blast -s -p $BLAST_PORT >blast-server.log 2>&1 &
    srv=$!
    until netstat -ltn | grep -q ":$BLAST_PORT "; do sleep 0.2; done
fi
barrier "receiver up"
if ON a; then
    for loss in $WAN_LOSSES; do
        if [ "$loss" = 0 ]; then netem delay $WAN_DELAY; else netem delay $WAN_DELAY loss $loss; fi
        for mode in direct indirect dynamic; do
            # EXS_FALLBACK=off at the sender: a connect that fails over verbs fails the run
            # (with auto or any it would go on over tcp, as it did at 0.1% and 1% loss)
            run "exs-$mode-loss$loss" 600 env EXS_FALLBACK=off ./blast -c $B -p $BLAST_PORT --sends 8 --recvs 8 \
                --size exp:1M:4M --mode $mode --time $WAN_TIME --runs 1 --verify --quiet
        done
        for cc in cubic bbr; do
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
# The cut-over: a's transfer runs 3 x WAN_TIME; b removes its device a third of the way in.
if ON a; then
    ./blast -c $B -p $BLAST_PORT --mode dynamic --time $((3 * WAN_TIME)) --runs 1 --verify \
        --quiet >cutover.out 2>&1 &
    cl=$!
fi
barrier "cut-over transfer started"
if ON b; then
    sleep $WAN_TIME
    say2 "rdma link delete rxe1 (mid-transfer)"
    rdma link delete rxe1 || say2 "rdma link delete failed"
fi
if ON a; then
    wait $cl
    rc=$?
    cat cutover.out
    say2 "--- cutover: $([ $rc -eq 0 ] && echo PASS || echo "FAIL: exit $rc") (blast --verify across the device removal)"
    if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures cutover"; fi
fi
barrier "cut-over done"
if ON b; then
    kill $srv 2>/dev/null
    echo "--- blast receiver output:"; cat blast-server.log
fi
finish
