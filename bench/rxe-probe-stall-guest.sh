# SPDX-License-Identifier: MIT
# rxe-probe-stall-guest.sh: the guest side of bench/rxe-probe-stall.sh (busybox sh, in
# scripts/rxe-vm.sh's guest, rxe0 on 10.0.2.15). Usage: sh rxe-probe-stall-guest.sh ROUNDS
# ITERS BINARY...
#
# What the ~8 ms "stalled rounds" of make bench-rxe-ab are: rounds of ITERS 64 B busy round
# trips (blast --poll --poll-recv, client on CPU 0, one long-lived receiver per binary on
# CPU 1, as bench/rxe-ab.sh), and around each round every thread's CPU time (utime +
# stime, clock ticks), voluntary and involuntary context switches and last CPU, of the
# receiver (from /proc before and after) and of the client (its last sample, taken every
# 50 ms while it runs). One line per round, "STALL round=R bin=B p50=US", then one
# "STALLTH round=R bin=B side=client|receiver tid=T comm=C cpu_ticks=N vcs=N ivcs=N
# last_cpu=N" per thread (the receivers' as differences over the round, the idle one's
# too). STALL_BETWEEN=1: after each busy round a blocking one ("STALLBLOCK ... p50=US")
# and a 1 s 64 B STREAM run, as bench/rxe-ab.sh's order. STALL_STRACE=1: the busy client
# under strace -f -c ("STALLSYS ... call=C count=N", its six most frequent system calls).
# STALL_RSTREAM=1 (rstream in the guest: RXE_VM_BINS=rstream): rsockets' busy round trip in
# each round too. By hand:
#   D=build/h72-stall; mkdir -p $D; cp build/blast/blast $D/blast-this; cp BASE/blast/blast
#   $D/blast-base; cp bench/rxe-probe-stall-guest.sh bench/rxe-guest-lib.sh $D/; BUILD=build/rxe-bench \
#   RXE_VM_APPEND="clocksource=tsc tsc=reliable" RXE_VM_BINS=rstream bash scripts/rxe-vm.sh \
#   $D env STALL_BETWEEN=1 sh rxe-probe-stall-guest.sh 6 300 blast-this blast-base
. ./rxe-guest-lib.sh
ROUNDS=$1
N=$2
shift 2
A=10.0.2.15
export EXS_PROVIDER=verbs
CL=; SV=
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    CL="taskset -c 0"; SV="taskset -c 1"
fi
echo "STALLINFO clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
# snap PID: one line per thread: tid comm ticks vcs ivcs last_cpu
snap() {
    for t in /proc/$1/task/*; do
        [ -r $t/stat ] || continue
        s=$(cat $t/stat 2>/dev/null) || continue
        # fields after the ")": 3 state ... 14 utime 15 stime ... 39 processor
        rest=${s##*) }
        set -- $rest
        ut=${12}; st=${13}; cpu=${37}
        comm=$(cat $t/comm 2>/dev/null | tr ' ' '_')
        vcs=$(sed -n 's/^voluntary_ctxt_switches:[[:space:]]*//p' $t/status 2>/dev/null)
        ivcs=$(sed -n 's/^nonvoluntary_ctxt_switches:[[:space:]]*//p' $t/status 2>/dev/null)
        echo "${t##*/} $comm $((ut + st)) $vcs $ivcs $cpu"
    done
}
# kern: "what value" lines: the softirqs by kind and CPU (/proc/softirqs), and the CPU
# ticks, voluntary and involuntary context switches of the kernel threads that run deferred
# rxe work (ksoftirqd/N, and kworkers summed per CPU)
kern() {
    awk '$1 == "TASKLET:" || $1 == "NET_RX:" || $1 == "TIMER:" || $1 == "SCHED:" {
        for (i = 2; i <= NF; i++) print $1 "cpu" i - 2, $i }' /proc/softirqs
    for t in /proc/[0-9]*; do
        c=$(cat $t/comm 2>/dev/null) || continue
        case $c in ksoftirqd/*|kworker/*) ;; *) continue ;; esac
        s=$(cat $t/stat 2>/dev/null) || continue
        rest=${s##*) }
        set -- $rest
        n=$(echo "$c" | sed 's|^kworker/\([0-9]*\).*|kworker/\1|; s|^kworker/u.*|kworker/u|')
        vcs=$(sed -n 's/^voluntary_ctxt_switches:[[:space:]]*//p' $t/status 2>/dev/null)
        echo "$n-ticks $((${12} + ${13}))"
        echo "$n-vcs ${vcs:-0}"
    done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
SRVS=
BINS="$*"
port=7471
for b in $BINS; do
    $SV ./$b -s -p $port >/tmp/st-srv-$port.log 2>&1 &
    echo "$! $port" >/tmp/st-pid-$b
    SRVS="$SRVS $!"
    wait_listen $port STALLFAIL
    port=$((port + 1))
done
R=1
while [ $R -le $ROUNDS ]; do
    for b in $BINS; do
        read -r spid port </tmp/st-pid-$b
        for x in $BINS; do read -r p _ </tmp/st-pid-$x; snap $p >/tmp/st-before-$x; done
        kern >/tmp/st-kbefore
        ST=; [ "${STALL_STRACE:-0}" = 1 ] && ST="strace -f -c -o /tmp/st-sys"
        $CL $ST ./$b -c $A -p $port --json --quiet --type seqpacket --lat-only --lat-size 64 \
            --lat-iters $N --poll --poll-recv >/tmp/st-out 2>/tmp/st-err &
        cpid=$!
        : >/tmp/st-client
        while kill -0 $cpid 2>/dev/null; do
            snap $cpid >/tmp/st-client.new 2>/dev/null && [ -s /tmp/st-client.new ] &&
                mv /tmp/st-client.new /tmp/st-client
            sleep 0.05
        done
        wait $cpid
        for x in $BINS; do read -r p _ </tmp/st-pid-$x; snap $p >/tmp/st-after-$x; done
        kern >/tmp/st-kafter
        p50=$(tr ',' '\n' </tmp/st-out | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
        echo "STALL round=$R bin=$b p50=${p50:-fail}"
        [ -s /tmp/st-sys ] && grep -E '^ +[0-9]' /tmp/st-sys | sort -k4 -nr | head -n 6 |
            awk -v r=$R -v b=$b '{print "STALLSYS round=" r " bin=" b " call=" $NF " count=" $4}'
        rm -f /tmp/st-sys
        while read -r tid comm ticks vcs ivcs cpu; do
            echo "STALLTH round=$R bin=$b side=client tid=$tid comm=$comm cpu_ticks=$ticks vcs=$vcs ivcs=$ivcs last_cpu=$cpu"
        done </tmp/st-client
        for x in $BINS; do
            side=receiver; [ $x = $b ] || side=idle-receiver-$x
            while read -r tid comm ticks vcs ivcs cpu; do
                b0=$(grep "^$tid " /tmp/st-before-$x)
                t0=$(echo "$b0" | cut -d' ' -f3); v0=$(echo "$b0" | cut -d' ' -f4); i0=$(echo "$b0" | cut -d' ' -f5)
                echo "STALLTH round=$R bin=$b side=$side tid=$tid comm=$comm cpu_ticks=$((ticks - ${t0:-0})) vcs=$((vcs - ${v0:-0})) ivcs=$((ivcs - ${i0:-0})) last_cpu=$cpu"
            done </tmp/st-after-$x
        done
        paste -d' ' /tmp/st-kbefore /tmp/st-kafter | while read -r k0 v0 k1 v1; do
            echo "STALLK round=$R bin=$b what=$k0 delta=$((v1 - v0))"
        done
        # as bench/rxe-ab.sh: a blocking round and a STREAM messages/s run after each busy one
        if [ "${STALL_BETWEEN:-0}" = 1 ]; then
            $CL ./$b -c $A -p $port --json --quiet --type seqpacket --lat-only --lat-size 64 \
                --lat-iters $N >/tmp/st-out 2>/tmp/st-err
            p50=$(tr ',' '\n' </tmp/st-out | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
            echo "STALLBLOCK round=$R bin=$b p50=${p50:-fail}"
            $CL ./$b -c $A -p $port --json --quiet --type stream --size 64 --sends 16 --recvs 16 \
                --time 1 --runs 1 --no-latency >/dev/null 2>&1
        fi
    done
    # STALL_RSTREAM=1: rsockets in the same round (rstream -T n, busy; a server per run;
    # rstream reports the mean: 2 x usec/xfer is its round trip, as bench/rxe-bench.sh)
    if [ "${STALL_RSTREAM:-0}" = 1 ]; then
        p=$((7600 + R))
        $SV rstream -p $p -S 64 -C 1 -I $N -T n >/tmp/st-rs-srv 2>&1 &
        rp=$!
        sleep 1
        rt=$($CL rstream -s $A -p $p -S 64 -C 1 -I $N -T n 2>&1 |
            awk 'NF >= 7 && $1 != "name" {v = $NF} END {if (v != "") printf "%.2f", 2 * v}')
        wait $rp
        echo "STALL round=$R bin=rstream p50=${rt:-fail} (mean)"
    fi
    R=$((R + 1))
done
kill $SRVS 2>/dev/null
echo "STALLINFO done"
