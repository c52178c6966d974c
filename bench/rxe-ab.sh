# SPDX-License-Identifier: MIT
# rxe-ab.sh: the guest side of make bench-rxe-ab (busybox sh, in scripts/rxe-vm.sh's guest,
# device rxe0 on 10.0.2.15). Usage: sh rxe-ab.sh ROUNDS ITERS LABEL=BINARY[,VAR=VALUE]...
#
# Two (or more) builds of blast on the same rxe0, in the same rounds, the order alternating:
# 64 B (AB_SIZE) SEQPACKET round trips busy-polling and blocking (ITERS each), 64 B STREAM
# messages/s with 16 outstanding (1 s), each client with rxe-vstat.so and against a receiver
# of its own build (client on CPU 0, receivers on CPU 1; BENCH_RXE_PIN=0: unpinned, as
# bench/rxe-bench.sh), and STREAM throughput: blast --type stream --mode direct of each size
# in AB_STREAM ("65536 1048576"; "" for none), AB_STREAM_TIME s (3) each, against a receiver
# of the same build started for that run (--once), both ends with rxe-vstat.so, and, when
# ./ib_write_bw is there, ib_write_bw of the same size in every round (the issue's peer;
# AB_STREAM_PT, see pt_bw); then one strace -c of each build's 64 B round trips. VAR=VALUE
# (optional) goes into that build's environment (EXS_LEASE_US=10000). Output lines: "AB
# round=R label=L fig=F value=V [msgs=M]" (F: busy, block, msgs, gbps<SIZE>), "ABVS
# label=L fig=F round=R [side=server] <vstat pairs>", "ABSYS
# label=L fig=F msgs=M total=T" (M: the messages of ITERS round trips and of blast's ITERS / 10
# warm-up ones), "ABSYSTOP label=L fig=F call=C count=N";
# bench/rxe_ab_results.py makes bench/results-rxe-ab.md of them.
. ./rxe-guest-lib.sh
ROUNDS=$1
N=$2
shift 2
S=${AB_SIZE:-64} # the round trips' size (make bench-rxe-ab BENCH_AB_SIZE=4096)
A=10.0.2.15
export EXS_PROVIDER=verbs
export PATH=/guest:$PATH
VS=/guest/rxe-vstat.so
CL=; SV=
if [ "${BENCH_RXE_PIN:-1}" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    CL="taskset -c 0"; SV="taskset -c 1"
fi
echo "ABINFO clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) pin=$([ -n "$CL" ] && echo "client cpu 0, server cpu 1" || echo none)"
# Each build talks to a receiver of its own build (port 7471, 7472, ...), so that a change
# on either side of the round trip shows: receiver i serves the i-th LABEL.
SRVS=
port=7471
for x in "$@"; do
    b=${x#*=}
    e=
    case $b in *,*) e=${b#*,}; b=${b%%,*} ;; esac
    env $e $SV ./$b -s -p $port >/tmp/ab-srv-$port.log 2>&1 &
    SRVS="$SRVS $!"
    wait_listen $port ABFAIL
    port=$((port + 1))
done
# one run of label's build: run LABEL BIN ENV FIG blast-args...
run() {
    l=$1; b=$2; e=$3; f=$4; shift 4
    out=$(env $e VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS timeout 300 $CL ./$b -c $A -p $P --json \
        --quiet "$@" 2>/tmp/ab-err.txt)
    if [ $f = msgs ]; then
        v=$(echo "$out" | sed -n 's/.*"messages_per_sec": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    else
        v=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    fi
    if [ -n "$v" ]; then echo "AB round=$R label=$l fig=$f value=$v"; else
        echo "ABFAIL round=$R label=$l fig=$f: $(tail -n 2 /tmp/ab-err.txt | tr '\n' ' ')"; fi
    [ -s /tmp/vs.txt ] && sed "s/^/ABVS label=$l fig=$f round=$R /" /tmp/vs.txt
    rm -f /tmp/vs.txt
}
one() {  # LABEL=BIN[,ENV]: sets l b e, and P (its receiver's port)
    l=${1%%=*}; b=${1#*=}; e=
    case $b in *,*) e=${b#*,}; b=${b%%,*} ;; esac
    P=7471
    for y in $ALL; do
        [ "$y" = "$1" ] && break
        P=$((P + 1))
    done
}
# STREAM throughput of one build: stream LABEL BIN ENV SIZE (its own receiver, --once, so that
# both ends' vstat lines are written at their exit)
SP=7600
stream() {
    l=$1; b=$2; e=$3; sz=$4
    SP=$((SP + 1))
    rm -f /tmp/vs.txt /tmp/vs-srv.txt
    env $e VSTAT_OUT=/tmp/vs-srv.txt LD_PRELOAD=$VS timeout 300 $SV ./$b -s -p $SP --once \
        >/tmp/ab-st-srv.log 2>&1 &
    sp=$!
    wait_listen $SP ABFAIL
    out=$(env $e VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS timeout 300 $CL ./$b -c $A -p $SP --json \
        --quiet --type stream --size $sz --mode direct --time $ST_T --runs 1 --no-latency \
        2>/tmp/ab-err.txt)
    wait $sp
    v=$(echo "$out" | sed -n 's/.*"throughput_gbps": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    m=$(echo "$out" | tr ',' '\n' | sed -n 's/.*"messages": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
    if [ -n "$v" ]; then echo "AB round=$R label=$l fig=gbps$sz value=$v msgs=${m:-0}"; else
        echo "ABFAIL round=$R label=$l fig=gbps$sz: $(tail -n 2 /tmp/ab-err.txt | tr '\n' ' ')"; fi
    [ -s /tmp/vs.txt ] && sed "s/^/ABVS label=$l fig=gbps$sz round=$R /" /tmp/vs.txt
    [ -s /tmp/vs-srv.txt ] && sed "s/^/ABVS label=$l fig=gbps$sz round=$R side=server /" /tmp/vs-srv.txt
    rm -f /tmp/vs.txt /tmp/vs-srv.txt
}
# ib_write_bw of SIZE (label ib_write_bw), perftest's duration mode: it counts the completions
# polled in its sample window, D - 2 x (D / 4) s of a -D D run (D / 4 s margins, integer
# seconds). Its send queue is AB_STREAM_PT_DEPTH deep (16): at its default 128, 1 MiB writes
# keep the posting thread inside ibv_post_send for the whole window (rxe runs the requester
# in the caller, and 128 MiB take ~5 s at TCG's rate), and it polled no completion in it:
# 0 iterations (spec/rxe-vm.md, "ib_write_bw at 1 MiB").
pt_bw() {
    sz=$1
    SP=$((SP + 1))
    d=$ST_PT_D
    rm -f /tmp/vs.txt /tmp/vs-srv.txt
    VSTAT_OUT=/tmp/vs-srv.txt LD_PRELOAD=$VS timeout 300 $SV ./ib_write_bw -R -d rxe0 -F -p $SP -s $sz \
        -D $d -t $ST_PT_DEPTH --report_gbits >/tmp/pt-srv.out 2>&1 &
    sp=$!
    sleep 1 # -R: the server listens through rdma_cm, not on a TCP port
    VSTAT_OUT=/tmp/vs.txt LD_PRELOAD=$VS timeout 300 $CL ./ib_write_bw -R -d rxe0 -F -p $SP -s $sz -D $d \
        -t $ST_PT_DEPTH --report_gbits $A >/tmp/pt.out 2>&1
    rc=$?
    wait $sp
    r=$(awk -v s=$sz '$1 == s {print; exit}' /tmp/pt.out)
    it=$(echo "$r" | awk '{print $2}')
    w=$((d - 2 * (d / 4)))
    if [ $rc = 0 ] && [ -n "$it" ] && [ "$it" != 0 ]; then
        echo "AB round=$R label=ib_write_bw fig=gbps$sz value=$(echo "$it" | awk -v s=$sz -v w=$w '{printf "%.4f", $1 * s * 8 / w / 1e9}') msgs=$it"
    else
        echo "ABFAIL round=$R label=ib_write_bw fig=gbps$sz: rc $rc, row '$r' $(grep -v '^ *$' /tmp/pt.out | tail -n 2 | tr '\n' ' ')"
    fi
    [ -s /tmp/vs.txt ] && sed "s/^/ABVS label=ib_write_bw fig=gbps$sz round=$R /" /tmp/vs.txt
    [ -s /tmp/vs-srv.txt ] && sed "s/^/ABVS label=ib_write_bw fig=gbps$sz round=$R side=server /" /tmp/vs-srv.txt
    rm -f /tmp/vs.txt /tmp/vs-srv.txt
}
ST_SIZES=${AB_STREAM-65536 1048576}
ST_T=${AB_STREAM_TIME:-3}
ST_PT_D=${AB_STREAM_PT_D:-6}
ST_PT_DEPTH=${AB_STREAM_PT_DEPTH:-16}
ST_PT=0
[ -x ./ib_write_bw ] && [ "${AB_STREAM_PT:-1}" = 1 ] && ST_PT=1
ALL="$*"
R=1
while [ $R -le $ROUNDS ]; do
    order=
    for x in "$@"; do
        if [ $((R % 2)) = 0 ]; then order="$x $order"; else order="$order $x"; fi
    done
    for x in $order; do
        one $x
        run $l $b "$e" busy --type seqpacket --lat-only --lat-size $S --lat-iters $N --poll --poll-recv
        run $l $b "$e" block --type seqpacket --lat-only --lat-size $S --lat-iters $N
        run $l $b "$e" msgs --type stream --size 64 --sends 16 --recvs 16 --time 1 --runs 1 --no-latency
    done
    # STREAM throughput: the builds in the same alternating order, each size; the peer in
    # the middle of the round
    for sz in $ST_SIZES; do
        k=0
        for x in $order; do
            one $x
            stream $l $b "$e" $sz
            k=$((k + 1))
            [ $k = 1 ] && [ $ST_PT = 1 ] && pt_bw $sz
        done
    done
    R=$((R + 1))
done
for x in "$@"; do
    one $x
    for f in busy block; do
        p=; [ $f = busy ] && p="--poll --poll-recv"
        env $e strace -f -c -o /tmp/st.txt $CL ./$b -c $A -p $P --quiet --type seqpacket --lat-only \
            --lat-size $S --lat-iters $N $p >/dev/null 2>&1
        echo "ABSYS label=$l fig=$f msgs=$((2 * (N + N / 10))) total=$(awk '$NF == "total" {print $4}' /tmp/st.txt)"
        grep -E '^ +[0-9]' /tmp/st.txt | sort -k4 -nr | head -n 6 |
            awk -v l=$l -v f=$f '{print "ABSYSTOP label=" l " fig=" f " call=" $NF " count=" $4}'
    done
done
kill $SRVS 2>/dev/null
echo "ABINFO done (uptime $(cut -d' ' -f1 /proc/uptime))"
