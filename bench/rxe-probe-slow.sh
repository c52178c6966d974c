# SPDX-License-Identifier: MIT
# rxe-probe-slow.sh: guest side of bench/rxe-probe.sh slow (busybox sh, rxe0 on 10.0.2.15).
# C cycles; each runs "idle" (6 s) and "bw" (ib_write_bw 64 KiB 2 s, 1 MiB 3 s) in alternating
# order, each followed by 3 libexs busy runs (1,000 round trips of 64 B),
# against one long-lived blast receiver, as bench/rxe-bench.sh. Lines: "SL cyc= tag= p50= p99=
# mean= t=uptime0-uptime1", "SLBW" (ib_write_bw size, iterations), "SLD" (counter deltas
# over a run: rdma statistic, softirqs, /proc/stat per CPU, the receiver's threads).
A=10.0.2.15
export PATH=/guest:$PATH EXS_PROVIDER=verbs
CL="taskset -c 0"; SV="taskset -c 1"
C=${C:-8}
PORT=7600
$SV ./blast -s -p 7471 >/tmp/blast-srv.log 2>&1 &
BS=$!
sleep 2
snap() {
    { rdma statistic show link rxe0/1 2>&1 | tr ' ' '\n' | awk 'NF' | tail -n +3 | paste - - | sed 's/^/rdma /';
      awk '$1 ~ /^(NET_RX|NET_TX|TASKLET|TIMER|SCHED|RCU|HRTIMER):$/' /proc/softirqs | sed 's/^ */softirq /';
      awk '{print "srv x", $14, $15, $10, $12}' /proc/$BS/stat;
      for t in /proc/$BS/task/*; do echo "task ${t##*/} $(cut -d' ' -f14,15,39 $t/stat) $(awk '/ctxt/ {printf "%s ", $2}' $t/status)"; done
      awk '/^cpu[0-9]/ {print "stat", $1, $2+$3+$4, $5, $7+$8}' /proc/stat
      grep -E '^(MemFree|Slab):' /proc/meminfo | sed 's/^/mem /'; } >$1
}
delta() { # tag
    awk -v tag="$1" 'NR==FNR {a[$1" "$2]=$0; next} {k=$1" "$2; if (k in a) {split(a[k],x," "); o=""; for(i=3;i<=NF;i++) o=o" "($i-x[i]); print "SLD cyc=" c " tag=" tag " " k o}}' c=$c /tmp/s0 /tmp/s1
}
lx() { # tag
    snap /tmp/s0
    t0=$(cut -d' ' -f1 /proc/uptime)
    out=$($CL ./blast -c $A -p 7471 --json --quiet --type seqpacket --lat-only --lat-size 64 --lat-iters 1000 --poll --poll-recv 2>/tmp/blast.err)
    t1=$(cut -d' ' -f1 /proc/uptime)
    snap /tmp/s1
    v=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    p99=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"p99": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    mean=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"mean": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    echo "SL cyc=$c tag=$1 p50=$v p99=$p99 mean=$mean t=$t0-$t1"
    delta $1
}
ptbw() { # size secs
    PORT=$((PORT + 1))
    $SV ib_write_bw -R -d rxe0 -F -p $PORT -s $1 -D $2 --report_gbits >/tmp/pt-srv.out 2>&1 &
    sp=$!; sleep 1
    $CL ib_write_bw -R -d rxe0 -F -p $PORT -s $1 -D $2 --report_gbits $A >/tmp/pt.out 2>&1
    wait $sp
    echo "SLBW cyc=$c $(awk -v s=$1 '$1 == s {print $1, $2; exit}' /tmp/pt.out)"
}
idle() { sleep 6; }
bw() { ptbw 65536 2; ptbw 1048576 3; }
c=0
lx warm
c=1
while [ $c -le $C ]; do
    if [ $((c % 2)) = 1 ]; then set -- idle bw; else set -- bw idle; fi
    for ph in "$@"; do
        $ph
        lx $ph; lx $ph+2; lx $ph+3
    done
    c=$((c + 1))
done
echo "SLDONE"
