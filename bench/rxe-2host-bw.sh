# SPDX-License-Identifier: MIT
# rxe-2host-bw.sh: STREAM throughput across the two hosts of scripts/rxe-2host.sh, libexs
# (blast --type stream --mode direct, 8/8) against ib_write_bw, interleaved, a sending to b
# (busybox sh, run in both guests; bench/rxe-2host-bw-run.sh starts it). On one rxe0 the
# receiving QP's rxe work runs on the sender's vCPU (loopback); here each host does its own.
# Arguments VAR=VALUE are exported: BW_CYCLES (5), BW_TIME (4), BW_SIZES ("65536 1048576").
for kv in "$@"; do export "$kv"; done
. ./2host.sh
export EXS_PROVIDER=verbs EXS_FALLBACK=off
: "${BW_CYCLES:=5}" "${BW_TIME:=4}" "${BW_SIZES:=65536 1048576}"
if ON b; then
    ./blast -s -p 7471 >blast-server.log 2>&1 &
    until netstat -ltn | grep -q ":7471 "; do sleep 0.2; done
fi
barrier "receiver up"
port=7600
c=0
while [ $c -lt $BW_CYCLES ]; do
    c=$((c + 1))
    for s in $BW_SIZES; do
        # ib_write_bw: duration mode counts the iterations of its window, T - 2 x (T / 4) s
        # (1 MiB at a send queue 16 deep, as make bench-rxe: at perftest's default 128 its
        # first 128 MiB are posted before its first poll; spec/rxe-vm.md)
        t=$BW_TIME; w=$((t - 2 * (t / 4))); dep=
        [ $s -ge 1048576 ] && dep="-t 16"
        port=$((port + 1))
        if ON b; then
            # bounded: a client that never connects must not leave b waiting here
            timeout $((t + 60)) ./ib_write_bw -R -d rxe1 -F -p $port -s $s -D $t $dep --report_gbits >/tmp/pt-srv.out 2>&1 &
            sp=$!
        fi
        barrier "ib_write_bw $s server"
        if ON a; then
            # -R: b's server listens through rdma_cm (no TCP port to wait for): the client
            # is tried again while it made no connection (no "#bytes" header), 30 times
            n=0
            until ./ib_write_bw -R -d rxe1 -F -p $port -s $s -D $t $dep --report_gbits $B >/tmp/pt.out 2>&1 ||
                grep -q '#bytes' /tmp/pt.out || [ $n -ge 30 ]; do
                n=$((n + 1)); sleep 0.5
            done
            it=$(awk -v s=$s '$1 == s {print $2; exit}' /tmp/pt.out)
            if [ "${it:-0}" -gt 0 ] 2>/dev/null; then
                say2 "BW2 cyc=$c sys=ib_write_bw size=$s gbps=$(echo "$it" | awk -v w=$w -v s=$s '{printf "%.4f", $1 * s * 8 / w / 1e9}') iters=$it tries=$((n + 1))"
            else  # not counted as 0 in the medians
                say2 "BW2FAIL cyc=$c sys=ib_write_bw size=$s: $(grep -v '^ *$' /tmp/pt.out | tail -n 2 | tr '\n' ' ')"
            fi
        else
            wait $sp
        fi
        barrier "ib_write_bw $s done"
        if ON a; then
            out=$(./blast -c $B -p 7471 --json --quiet --type stream --size $s --mode direct --time $t --runs 1 --no-latency 2>/tmp/blast.err)
            g=$(echo "$out" | sed -n 's/.*"throughput_gbps": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
            if [ -n "$g" ]; then say2 "BW2 cyc=$c sys=libexs size=$s gbps=$g"
            else say2 "BW2FAIL cyc=$c sys=libexs size=$s: $(tail -n 2 /tmp/blast.err | tr '\n' ' ')"; fi
        fi
        barrier "libexs $s done"
    done
done
say2 "BW2DONE"
