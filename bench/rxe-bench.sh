# SPDX-License-Identifier: MIT
# rxe-bench.sh: the guest side of make bench-rxe (busybox sh, in scripts/rxe-vm.sh's guest,
# device rxe0 on 10.0.2.15). Usage: sh rxe-bench.sh ROUNDS QUICK
#
# Each round runs every system once, the order rotating by round: libexs (blast, verbs
# provider), rsockets (rstream; riostream for STREAM), perftest (ib_send_lat, ib_write_lat,
# ib_send_bw, ib_write_bw), UCX (ucx_perftest over rc_verbs). Every figure is printed as one
# line "BR round=R sys=S fig=F size=B value=V" (fig: rtt_busy, rtt_block in us; msgs in
# messages/s; gbps in Gbit/s) and failures as "BRFAIL ...". The client (and, where the
# server runs per test, the server) carries rxe-vstat.so: its lines ("vstat ... tag=...")
# follow. After the rounds, one profile pass: strace -c (system calls) and perf record
# (where the time goes, by shared object) of the 64 B round trips of libexs and rstream.
# bench/rxe_results.py turns this output into bench/results-rxe.md.
ROUNDS=${1:-3}
QUICK=${2:-0}
A=10.0.2.15
export PATH=/guest:$PATH
VS=/guest/rxe-vstat.so
export VSTAT_OUT=/tmp/vstat.txt
# rc_verbs with ud_verbs for the wire-up (rc alone reported "Destination is unreachable")
export UCX_MODULE_DIR=/guest/ucx UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=rxe0:1 UCX_WARN_UNUSED_ENV_VARS=n
PORT=7600
if [ "$QUICK" = 1 ]; then SIZES="64 65536"; else SIZES="64 4096 65536 1048576"; fi
iters() { case $1 in 64 | 4096) echo 1000 ;; 65536) echo 200 ;; *) echo 40 ;; esac; }
[ "$QUICK" = 1 ] && iters() { case $1 in 64 | 4096) echo 200 ;; 65536) echo 50 ;; *) echo 10 ;; esac; }
BT=2  # seconds per throughput run
[ "$QUICK" = 1 ] && BT=1

emit() { echo "BR round=$R sys=$1 fig=$2 size=$3 value=$4"; }
fail() { echo "BRFAIL round=$R sys=$1 fig=$2 size=$3: $4"; }
vstat_flush() {  # $1: tag
    [ -s $VSTAT_OUT ] && sed -e "s|tag=-|tag=$1|" -e "s|tag=srv|tag=$1/server|" $VSTAT_OUT
    rm -f $VSTAT_OUT
}
# Waits until something listens on TCP port $1 (perftest and UCX exchange over TCP; rstream
# listens with rsockets, whose port is not in netstat: a fixed pause for those).
wait_port() {
    i=0; until netstat -ltn 2>/dev/null | grep -q ":$1 "; do
        i=$((i + 1)); [ $i -le 300 ] || return 1; sleep 0.1
    done
}
newport() { PORT=$((PORT + 1)); }
# Every system's client on CPU 0, its server on CPU 1 (BENCH_RXE_PIN=0: unpinned): two
# busy pollers left to the scheduler share one vCPU in some runs, and a round trip then
# waits for time slices (measured: 64 B busy round trips of libexs 24 ms on one vCPU, 0.13-
# 6.7 ms on two, spec/rxe-vm.md "Pinning"). Threads a process starts stay on its CPU.
CL=; SV=
if [ "${BENCH_RXE_PIN:-1}" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    CL="taskset -c 0"; SV="taskset -c 1"
fi

# ---- libexs: blast, one receiver for the whole run ----
export EXS_PROVIDER=verbs
blast_json() {  # fig size args...: runs blast, prints its JSON
    LD_PRELOAD=$VS timeout 300 $CL ./blast -c $A -p 7471 --json --quiet "$@" 2>/tmp/blast.err
}
jget() {  # key: the first number after "key": in stdin
    sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p" | head -n 1
}
jlat() { tr ',' '\n' | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1; }
# blast makes lat_iters / 10 warm-up round trips before the measured ones (blast/exs_xfer.c):
# its per-message counters divide by 2 x (n + n / 10) messages
sys_libexs() {
    for s in $SIZES; do
        n=$(iters $s)
        out=$(blast_json --type seqpacket --lat-only --lat-size $s --lat-iters $n --poll --poll-recv)
        v=$(echo "$out" | jlat); [ -n "$v" ] && emit libexs rtt_busy $s $v || fail libexs rtt_busy $s "$(tail -n 2 /tmp/blast.err)"
        vstat_flush "libexs/rtt_busy/$s/$R/msgs=$((2 * (n + n / 10)))"
        out=$(blast_json --type seqpacket --lat-only --lat-size $s --lat-iters $n)
        v=$(echo "$out" | jlat); [ -n "$v" ] && emit libexs rtt_block $s $v || fail libexs rtt_block $s "$(tail -n 2 /tmp/blast.err)"
        vstat_flush "libexs/rtt_block/$s/$R/msgs=$((2 * (n + n / 10)))"
        # the blocking run above waits as the library's queues do by default (a spin,
        # then sleep: EXS_QWAIT_SPIN_US 10 us learning up to EXS_QWAIT_SPIN_MAX_US by the
        # queue's waits, as rsockets' blocking calls spin polling_time first); every wait
        # sleeping at once, for comparison:
        [ $s -le 4096 ] || continue
        out=$(blast_json --type seqpacket --lat-only --lat-size $s --lat-iters $n --wait-notify)
        v=$(echo "$out" | jlat); [ -n "$v" ] && emit libexs_notify rtt_block $s $v || fail libexs_notify rtt_block $s "$(tail -n 2 /tmp/blast.err)"
        vstat_flush "libexs_notify/rtt_block/$s/$R/msgs=$((2 * (n + n / 10)))"
    done
    out=$(blast_json --type stream --size 64 --sends 16 --recvs 16 --time $BT --runs 1 --no-latency)
    v=$(echo "$out" | jget messages_per_sec); m=$(echo "$out" | tr ',' '\n' | jget messages)
    [ -n "$v" ] && emit libexs msgs 64 $v || fail libexs msgs 64 "$(tail -n 2 /tmp/blast.err)"
    vstat_flush "libexs/msgs/64/$R/msgs=${m:-0}"
    # STREAM: as the library waits by default (its receiver sleeps between messages, and
    # each arrival's completion event is a tasklet and a wake-up on the sender's vCPU, where
    # rxe does both ends' work), and with both ends busy-polling as ib_write_bw's client
    # and server and rstream -T n do (libexs_poll: blast --poll --poll-recv)
    for s in 65536 1048576; do
        for v in libexs libexs_poll; do
            p=; [ $v = libexs_poll ] && p="--poll --poll-recv"
            out=$(blast_json --type stream --size $s --mode direct --time $BT --runs 1 --no-latency $p)
            g=$(echo "$out" | jget throughput_gbps)
            [ -n "$g" ] && emit $v gbps $s $g || fail $v gbps $s "$(tail -n 2 /tmp/blast.err)"
            vstat_flush "$v/gbps/$s/$R/msgs=0"
        done
    done
}

# ---- rsockets: rstream (and riostream) client and server per test ----
# usec/xfer of rstream is half a round trip (elapsed / iterations / (transfers x 2)).
rs_run() {  # prog opts...: server then client; prints the client's result line
    prog=$1; shift
    newport
    LD_PRELOAD=$VS VSTAT_TAG=srv timeout 300 $SV $prog -p $PORT "$@" >/tmp/rs-srv.out 2>&1 &
    sp=$!
    sleep 1
    LD_PRELOAD=$VS timeout 300 $CL $prog -s $A -p $PORT "$@" >/tmp/rs.out 2>&1
    rc=$?
    wait $sp
    [ $rc -eq 0 ] || { tail -n 2 /tmp/rs.out; return 1; }
    awk 'NF >= 7 && $1 != "name" {line = $0} END {print line}' /tmp/rs.out
}
sys_rsockets() {
    for s in $SIZES; do
        n=$(iters $s)
        for t in n b; do
            fig=rtt_busy; [ $t = b ] && fig=rtt_block
            if r=$(rs_run rstream -S $s -C 1 -I $n -T $t); then
                emit rsockets $fig $s "$(echo "$r" | awk '{printf "%.2f", 2 * $NF}')"
            else fail rsockets $fig $s "$r"; fi
            vstat_flush "rsockets/$fig/$s/$R/msgs=$((2 * n))"
        done
    done
    n=$((20000 / (1 + 3 * QUICK)))
    if r=$(rs_run rstream -S 64 -C 16 -I $((n / 16)) -T n); then
        emit rsockets msgs 64 "$(echo "$r" | awk '{printf "%.0f", 1e6 / $NF}')"
    else fail rsockets msgs 64 "$r"; fi
    vstat_flush "rsockets/msgs/64/$R/msgs=$((2 * (n / 16) * 16))"
    for prog in rstream riostream; do
        for s in 65536 1048576; do
            c=$((s == 65536 ? 400 : 25)); [ "$QUICK" = 1 ] && c=$((c / 4))
            if r=$(rs_run $prog -S $s -C $c -I 1 -T n); then
                emit $prog gbps $s "$(echo "$r" | awk '{print $(NF - 1)}')"
            else fail $prog gbps $s "$r"; fi
            vstat_flush "$prog/gbps/$s/$R/msgs=0"
        done
    done
}

# ---- perftest: latencies are half round trips (t_typical); doubled here ----
pt_run() {  # prog opts...
    prog=$1; shift
    newport
    LD_PRELOAD=$VS VSTAT_TAG=srv timeout 300 $SV $prog -R -d rxe0 -F -p $PORT "$@" >/tmp/pt-srv.out 2>&1 &
    sp=$!
    sleep 1  # -R: the server listens through rdma_cm, not on a TCP port
    LD_PRELOAD=$VS timeout 300 $CL $prog -R -d rxe0 -F -p $PORT "$@" $A >/tmp/pt.out 2>&1
    rc=$?
    wait $sp
    [ $rc -eq 0 ] || { grep -v '^ *$' /tmp/pt.out | tail -n 2; return 1; }
    # The result row: the first line that starts with the message size.
    awk -v s="$PT_SIZE" '$1 == s {print; exit}' /tmp/pt.out
}
sys_perftest() {
    for s in $SIZES; do
        n=$(iters $s); PT_SIZE=$s
        for prog in ib_send_lat ib_write_lat; do
            if r=$(pt_run $prog -s $s -n $n); then
                emit $prog rtt_busy $s "$(echo "$r" | awk '{printf "%.2f", 2 * $5}')"
            else fail $prog rtt_busy $s "$r"; fi
            vstat_flush "$prog/rtt_busy/$s/$R/msgs=$((2 * n))"
        done
        if r=$(pt_run ib_send_lat -e -s $s -n $n); then
            emit ib_send_lat rtt_block $s "$(echo "$r" | awk '{printf "%.2f", 2 * $5}')"
        else fail ib_send_lat rtt_block $s "$r"; fi
        vstat_flush "ib_send_lat/rtt_block/$s/$R/msgs=$((2 * n))"
    done
    PT_SIZE=64
    if r=$(pt_run ib_send_bw -s 64 -t 16 -D $BT --report_gbits); then
        emit ib_send_bw msgs 64 "$(echo "$r" | awk '{printf "%.0f", $NF * 1e6}')"
    else fail ib_send_bw msgs 64 "$r"; fi
    vstat_flush "ib_send_bw/msgs/64/$R/msgs=0"
    for s in 65536 1048576; do
        PT_SIZE=$s
        # Duration mode (-D t) counts the completions it polls in its sample window, t - 2
        # x (t / 4) s (margins of t / 4 s, integer seconds). 1 MiB: 6 s (a 4 s window) with
        # a send queue 16 deep (-t 16; blast keeps 8 sends outstanding): at perftest's
        # default 128, the first 128 MiB of writes are posted before the first poll, and
        # rxe runs the requester (and the loopback's responder) inside the posting
        # thread's ibv_post_send, for ~5 s at TCG's rate: no completion was polled in the
        # window and the row read 0 iterations (0 of 3 s and of 8 s at depth 128; 32-56 of
        # 8 s at depth 8 or 16; spec/rxe-vm.md, "ib_write_bw at 1 MiB"). 10 s there (a 6 s
        # window): it counts completions 16 at a time, and one step of 16 MiB is 8-9% of a
        # 4 s window's count, 5-6% of a 6 s one's (rxe_results.py prints the grain).
        t=$BT; dep=
        [ $s -ge 1048576 ] && { t=$((BT < 10 ? 10 : BT)); dep="-t 16"; }
        w=$((t - 2 * (t / 4)))
        if r=$(pt_run ib_write_bw -s $s -D $t $dep --report_gbits); then
            # from the row's completed iterations over the window (its BW columns read 0
            # under TCG's coarse timing): #bytes #iterations BW-peak BW-average MsgRate
            echo "BRRAW ib_write_bw $s: $r"
            if [ "$(echo "$r" | awk '{print $2 + 0}')" -gt 0 ]; then
                emit ib_write_bw gbps $s "$(echo "$r" | awk -v w=$w -v s=$s '{printf "%.4f", $2 * s * 8 / w / 1e9}')"
                # the count's grain (rxe_results.py: its steps, as a share of the rate)
                echo "BRPT round=$R size=$s iters=$(echo "$r" | awk '{print $2 + 0}') window=$w"
            else fail ib_write_bw gbps $s "no completion polled in its $w s window: $r"; fi
        else fail ib_write_bw gbps $s "$r"; fi
        vstat_flush "ib_write_bw/gbps/$s/$R/msgs=0"
    done
}

# ---- UCX over rc_verbs: tag_lat prints half a round trip (typical); doubled here ----
ucx_run() {  # opts...
    newport
    timeout 300 $SV ucx_perftest -p $PORT >/tmp/ucx-srv.out 2>&1 &
    sp=$!
    wait_port $PORT || sleep 1
    timeout 300 $CL ucx_perftest $A -p $PORT "$@" >/tmp/ucx.out 2>&1
    rc=$?
    # a client that failed leaves its server waiting for a peer until its own timeout
    # (300 s of a round under TCG when UCX's wire-up fails): it is ended here
    [ $rc -eq 0 ] || kill $sp 2>/dev/null
    wait $sp
    [ $rc -eq 0 ] || { grep -m 4 -E 'ERROR|Assert|assert|Fatal|failed|unreachable' /tmp/ucx.out /tmp/ucx-srv.out | tr '\n' ' '; return 1; }
    grep 'Final:' /tmp/ucx.out | tail -n 1
}
UCX_OK=1
sys_ucx() {
    [ $UCX_OK = 1 ] || return 0
    for s in $SIZES; do
        n=$(iters $s)
        if r=$(ucx_run -t tag_lat -s $s -n $n -w 10); then
            # Final: iterations, latency typical, average, overall (us), bandwidth..., msgrate
            emit ucx_tag_lat rtt_busy $s "$(echo "$r" | awk '{printf "%.2f", 2 * $3}')"
        else
            fail ucx_tag_lat rtt_busy $s "$r"; UCX_OK=0; return 0
        fi
        if r=$(ucx_run -t tag_lat -s $s -n $n -w 10 -E sleep); then
            emit ucx_tag_lat rtt_block $s "$(echo "$r" | awk '{printf "%.2f", 2 * $3}')"
        else fail ucx_tag_lat rtt_block $s "$r"; fi
    done
    if r=$(ucx_run -t tag_bw -s 64 -n $((20000 / (1 + 3 * QUICK))) -O 16); then
        emit ucx_tag_bw msgs 64 "$(echo "$r" | awk '{print $(NF)}')"
    else fail ucx_tag_bw msgs 64 "$r"; fi
    for s in 65536 1048576; do
        n=$((s == 65536 ? 400 : 25))
        if r=$(ucx_run -t tag_bw -s $s -n $n); then
            # MB/s (typical, average, overall): the overall one, in Gbit/s
            emit ucx_tag_bw gbps $s "$(echo "$r" | awk '{printf "%.4f", $(NF - 1) * 8 * 1.048576 / 1000}')"
        else fail ucx_tag_bw gbps $s "$r"; fi
    done
}

echo "BRINFO uname=$(uname -r) cpus=$(nproc) rounds=$ROUNDS quick=$QUICK"
echo "BRINFO clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) pin=$([ -n "$CL" ] && echo "client cpu 0, server cpu 1" || echo none)"
ibv_devinfo -d rxe0 | grep -E 'fw_ver|active_mtu|max_mtu' | sed 's/^/BRINFO /'
$SV ./blast -s -p 7471 >/tmp/blast-srv.log 2>&1 &
BLAST_SRV=$!
wait_port 7471 || echo "BRFAIL blast receiver never listened"
SYSTEMS="libexs rsockets perftest ucx"
R=1
while [ $R -le $ROUNDS ]; do
    set -- $SYSTEMS
    k=$(((R - 1) % $#)); i=0
    while [ $i -lt $k ]; do s1=$1; shift; set -- "$@" $s1; i=$((i + 1)); done
    echo "BRINFO round $R order: $* (uptime $(cut -d' ' -f1 /proc/uptime))"
    for s in "$@"; do sys_$s; done
    R=$((R + 1))
done

# ---- profile pass: system calls and where the time goes, 64 B round trips ----
R=0
n=$(iters 64)
# name pre cmd...: strace -c, then perf record, of one client run each; pre (a function
# or true) runs before each of the two (rstream's server serves one client).
prof() {
    name=$1; pre=$2; shift 2
    if command -v strace >/dev/null; then
        $pre
        strace -f -c -o /tmp/strace.txt "$@" >/dev/null 2>&1
        tot=$(awk '$NF == "total" {print $4}' /tmp/strace.txt)
        m=$((2 * n)); case $name in libexs*) m=$((2 * (n + n / 10))) ;; esac  # blast's warm-up
        echo "BRSYS name=$name msgs=$m syscalls=${tot:-?}"
        grep -E '^ +[0-9]' /tmp/strace.txt | sort -k4 -nr | head -n 6 |
            awk -v nm=$name '{print "BRSYSTOP name=" nm " call=" $NF " count=" $4}'
        pre_wait
    fi
    if command -v perf >/dev/null; then
        $pre
        perf record -q -F 2000 -e cpu-clock -o /tmp/perf.data "$@" >/dev/null 2>/tmp/perf.err
        perf report -q -i /tmp/perf.data --stdio --sort dso 2>/dev/null |
            awk -v nm=$name 'NF >= 2 && $1 ~ /%$/ {print "BRPERF name=" nm " share=" $1 " dso=" $2}' | head -n 8
        pre_wait
    fi
}
# The server a pre started (rs_srv), if any: a plain wait would wait for the blast
# receiver too, which serves until it is killed.
pre_wait() {
    [ -n "${PRE_PID:-}" ] && wait "$PRE_PID"
    PRE_PID=
}
export VSTAT_OUT=/dev/null
prof libexs_busy true $CL ./blast -c $A -p 7471 --quiet --type seqpacket --lat-only --lat-size 64 --lat-iters $n --poll --poll-recv
prof libexs_block true $CL ./blast -c $A -p 7471 --quiet --type seqpacket --lat-only --lat-size 64 --lat-iters $n
prof libexs_notify true $CL ./blast -c $A -p 7471 --quiet --type seqpacket --lat-only --lat-size 64 --lat-iters $n --wait-notify
rs_srv() { newport; export PORT; timeout 300 $SV rstream -p $PORT -S 64 -C 1 -I $n -T $T >/dev/null 2>&1 & PRE_PID=$!; sleep 1; }
for T in n b; do
    export A n T CL
    prof rstream_$T rs_srv sh -c 'exec $CL rstream -s $A -p $PORT -S 64 -C 1 -I $n -T $T'
done
kill $BLAST_SRV 2>/dev/null
echo "BRINFO done (uptime $(cut -d' ' -f1 /proc/uptime))"
