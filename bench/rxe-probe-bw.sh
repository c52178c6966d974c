# SPDX-License-Identifier: MIT
# rxe-probe-bw.sh: guest side of bench/rxe-probe.sh bw (busybox sh, rxe0 on 10.0.2.15).
# C cycles of: blast 64 KiB STREAM --mode direct for T (4) s, ib_write_bw -s 65536 -D T, then
# each of $VARIANTS (blast options or EXS_X=V, "+" for a space); both ends with rxe-vstat.so,
# client on CPU 0, server on CPU 1. Lines: "BW cyc= tag= gbps= msgs=", "BWV" (rxe-vstat),
# "BWJ" (blast's JSON counters), "BWD tag=T" (counter deltas over the run: rdma statistic,
# softirqs, /proc/stat) and "BWD tag=T/after" (over the 3 s after it).
A=10.0.2.15
export PATH=/guest:$PATH EXS_PROVIDER=verbs
VS=/guest/rxe-vstat.so
CL="taskset -c 0"; SV="taskset -c 1"
C=${C:-3}; T=${T:-4}
PORT=7600
snap() {
    { rdma statistic show link rxe0/1 2>&1 | tr ' ' '\n' | awk 'NF' | paste - - | sed 's/^/rdma /';
      awk '/^ *(NET_RX|NET_TX|TASKLET|TIMER|SCHED|RCU)/' /proc/softirqs | sed 's/^ */softirq /';
      head -n 3 /proc/stat | sed 's/^/stat /'; } >$1
}
delta() { # tag [from to]
    awk -v tag="$1" 'NR==FNR {a[$1" "$2]=$0; next} {k=$1" "$2; if (k in a) {split(a[k],x," "); o=""; for(i=3;i<=NF;i++) o=o" "($i-x[i]); print "BWD tag=" tag " " k o}}' ${2:-/tmp/b0} ${3:-/tmp/b1}
}
blastrun() { # tag extra-args... (EXS_X=V args go to both sides' environment)
    tag=$1; shift
    E=; B=
    for a in "$@"; do case $a in EXS_*=*) E="$E $a" ;; *) B="$B $a" ;; esac; done
    PORT=$((PORT + 1)); rm -f /tmp/vs.txt
    env $E VSTAT_OUT=/tmp/vs.txt VSTAT_TAG=srv LD_PRELOAD=$VS $SV ./blast -s -p $PORT --once >/tmp/srv.log 2>&1 &
    sp=$!; sleep 1
    snap /tmp/b0
    out=$(env $E VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS $CL ./blast -c $A -p $PORT --json --quiet --type stream --size 65536 --mode direct --time $T --runs 1 --no-latency $B 2>/tmp/blast.err)
    snap /tmp/b1
    wait $sp
    sleep 3; snap /tmp/b2
    g=$(echo "$out" | sed -n 's/.*"throughput_gbps": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    m=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"messages": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    echo "BW cyc=$c tag=$tag gbps=$g msgs=$m"
    echo "$out" | tr ',' '\n' | grep -E 'cpu_|switches|direct|ring|drain' | tr -d ' \n' | sed "s/^/BWJ cyc=$c tag=$tag /"; echo
    sed "s/^/BWV cyc=$c tag=$tag /" /tmp/vs.txt
    delta $tag
    delta $tag/after /tmp/b1 /tmp/b2
    tail -n 3 /tmp/blast.err | sed "s/^/BWERR tag=$tag /"
}
ptrun() {
    PORT=$((PORT + 1)); rm -f /tmp/vs.txt
    VSTAT_OUT=/tmp/vs.txt VSTAT_TAG=srv LD_PRELOAD=$VS $SV ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits >/tmp/pt-srv.out 2>&1 &
    sp=$!; sleep 1
    snap /tmp/b0
    VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS $CL ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits $A >/tmp/pt.out 2>&1
    snap /tmp/b1
    wait $sp
    sleep 3; snap /tmp/b2
    r=$(awk '$1 == 65536 {print; exit}' /tmp/pt.out)
    # its iterations are the completions it polled in its sample window, T - 2 x (T / 4) s
    # (integer seconds; margins of T / 4 s, as bench/rxe-bench.sh divides), not T
    w=$((T - 2 * (T / 4)))
    echo "BW cyc=$c tag=ibwb gbps=$(echo "$r" | awk -v w=$w '{printf "%.4f", $2 * 65536 * 8 / w / 1e9}') msgs=$(echo "$r" | awk '{print $2}')"
    sed "s/^/BWV cyc=$c tag=ibwb /" /tmp/vs.txt
    delta ibwb
    delta ibwb/after /tmp/b1 /tmp/b2
}
c=0
blastrun warm
c=1
while [ $c -le $C ]; do
    blastrun lx
    ptrun
    for v in $VARIANTS; do blastrun "v:$v" $(echo $v | tr '+' ' '); done
    c=$((c + 1))
done
echo BWDONE
