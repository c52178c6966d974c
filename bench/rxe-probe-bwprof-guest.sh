# SPDX-License-Identifier: MIT
# rxe-probe-bwprof-guest.sh: guest side of bench/rxe-probe-bwprof.sh (busybox sh, rxe0 on
# 10.0.2.15). C cycles of: blast 64 KiB STREAM --mode direct (T s, client CPU 0, receiver
# CPU 1; lx, and lxe with the blast options EXTRA) and ib_write_bw -s 65536 -D T, each under perf record -a -e cpu-clock (2 kHz).
# Lines: "PM cyc= tag= msgs=" (messages in the window perf saw) and
# "PS cyc= tag= cpuN kernel|user SYMBOL samples" (samples by CPU and symbol). Messages: the
# client's posted send work requests (rxe-vstat.so's send_wrs; ib_write_bw posts through
# margins before and after the window it reports).
A=10.0.2.15
export PATH=/guest:$PATH EXS_PROVIDER=verbs
CL="taskset -c 0"; SV="taskset -c 1"
C=${C:-3}; T=${T:-4}; PORT=7600; EXTRA=${EXTRA:-}
VS=/guest/rxe-vstat.so
wrs() { sed -n 's/.*send_wrs=\([0-9]*\).*/\1/p' /tmp/vs.txt | head -n 1; }
mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
echo 0 >/proc/sys/kernel/kptr_restrict
echo -1 >/proc/sys/kernel/perf_event_paranoid
report() { # tag
    perf script -i /tmp/p.data -F cpu,ip,sym,dso 2>/dev/null | awk -v c=$c -v t=$1 '
        {cpu = $1; gsub(/[^0-9]/, "", cpu); dso = $NF; sym = (NF > 3) ? $3 : "?"
         cls = (dso ~ /kallsyms|\.ko|rdma_rxe/) ? "kernel" : "user"
         if (cls == "user") {gsub(/[()]/, "", dso); sub(/^.*\//, "", dso); sym = dso ":" sym}
         m["cpu" cpu " " cls " " sym]++; m["cpu" cpu " all all"]++}
        END {for (k in m) print "PS cyc=" c " tag=" t " " k " " m[k]}'
}
c=0
while [ $c -lt $C ]; do
    c=$((c + 1))
    for tag in lx ${EXTRA:+lxe}; do
        e=; [ $tag = lxe ] && e=$EXTRA
        PORT=$((PORT + 1))
        $SV ./blast -s -p $PORT --once >/tmp/srv.log 2>&1 &
        sp=$!; sleep 1
        rm -f /tmp/vs.txt
        perf record -q -a -F 2000 -e cpu-clock -o /tmp/p.data -- env VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS $CL ./blast -c $A -p $PORT --json --quiet --type stream --size 65536 --mode direct --time $T --runs 1 --no-latency $e >/tmp/out.json 2>/tmp/blast.err
        wait $sp
        echo "PM cyc=$c tag=$tag msgs=$(wrs)"
        report $tag
    done
    PORT=$((PORT + 1))
    $SV ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits >/tmp/pt-srv.out 2>&1 &
    sp=$!; sleep 1
    rm -f /tmp/vs.txt
    perf record -q -a -F 2000 -e cpu-clock -o /tmp/p.data -- env VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS $CL ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits $A >/tmp/pt.out 2>&1
    wait $sp
    echo "PM cyc=$c tag=ibwb msgs=$(wrs)"
    report ibwb
done
echo PMDONE
