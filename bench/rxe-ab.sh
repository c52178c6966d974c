# SPDX-License-Identifier: MIT
# rxe-ab.sh: the guest side of make bench-rxe-ab (busybox sh, in scripts/rxe-vm.sh's guest,
# device rxe0 on 10.0.2.15). Usage: sh rxe-ab.sh ROUNDS ITERS LABEL=BINARY[,VAR=VALUE]...
#
# Two (or more) builds of blast on the same rxe0, in the same rounds, the order alternating:
# 64 B (AB_SIZE) SEQPACKET round trips busy-polling and blocking (ITERS each) and 64 B STREAM
# messages/s with 16 outstanding (1 s), each client with rxe-vstat.so and against a receiver
# of its own build (client on CPU 0, receivers on CPU 1; BENCH_RXE_PIN=0: unpinned, as
# bench/rxe-bench.sh); then one strace -c of each build's 64 B round trips. VAR=VALUE
# (optional) goes into that build's environment (EXS_LEASE_US=10000). Output lines: "AB
# round=R label=L fig=F value=V", "ABVS label=L fig=F round=R <vstat pairs>", "ABSYS
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
