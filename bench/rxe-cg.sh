# SPDX-License-Identifier: MIT
# rxe-cg.sh: the guest side of make bench-rxe-cg (busybox sh, in scripts/rxe-vm.sh's guest,
# device rxe0 on 10.0.2.15). Usage: sh rxe-cg.sh N1 N2 LABEL=COMMAND...
#
# Instructions per round trip in user space, counted by callgrind in the guest: the one
# figure of the verbs path that the host's load cannot move (the guest's clock can: its
# vCPUs are host threads). Each client runs twice under callgrind, N1 and N2 round trips
# of 64 B, against a server of its own outside callgrind; (Ir(N2) - Ir(N1)) / (N2 - N1) is
# the cost of one round trip with start-up and teardown taken out; REPS such pairs (the
# report takes their median: a wait that finds its completion there costs less than one
# that sleeps, and which one a round trip meets depends on timing). Every wait sleeps at
# once (blast --wait-notify; rsockets with polling_time 0), so no spin adds turns whose
# number depends on timing. The callgrind files go to stdout (gzip, base64) between
# "@@CG BEGIN label n" and "@@CG END" for bench/rxe_cg_results.py.
#   libexs: blast --type seqpacket --lat-only --lat-size 64 --wait-notify; its sort of the
#     round trips' times for the percentiles (n log n: it would add to the difference) is
#     not collected (callgrind --toggle-collect=percentile)
#   pblast:BINARY: the same busy-polling (--poll --poll-recv): the count then holds the empty
#     turns of the spin, their number set by timing (per turn: divide by the calls of a
#     function called once per turn, e.g. the provider's poll)
#   rsockets: rstream -S 64 -C 1 -T b (one process per run, server outside callgrind)
# CG_OPTS (environment): more callgrind options for every client, e.g. --dump-instr=yes for
# bench/rxe_cg_locks.py's locked instructions per round trip (spec/rxe-vm.md)
N1=$1
N2=$2
shift 2
A=10.0.2.15
export EXS_PROVIDER=verbs VALGRIND_LIB=/guest/vglib
# Under callgrind in the TCG guest a 64 B round trip takes milliseconds, longer than the
# progress thread's lease (EXS_LEASE_US, 1 ms): each wait would outlive a lease, and the
# progress thread's libev loop would wake twice per round trip to end and restart it, work
# a round trip of native length (tens of us) never meets. A lease of 1 s keeps the count to
# what a round trip costs at native speed (CG_LEASE_US overrides it).
export EXS_LEASE_US=${CG_LEASE_US:-1000000}
CL=; SV=
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    CL="taskset -c 0"; SV="taskset -c 1"
fi
# rsockets' blocking calls spin polling_time microseconds (default 10) before they sleep
mkdir -p /etc/rdma/rsocket && echo 0 >/etc/rdma/rsocket/polling_time
PORT=7600
cg() { # label n [callgrind options] command...: one client under callgrind, its file to stdout
    label=$1; n=$2; shift 2
    $CL /guest/valgrind.bin --tool=callgrind --callgrind-out-file=/tmp/cg.out $CG_OPTS "$@" \
        >/tmp/cg-client.log 2>&1 || { echo "CGFAIL label=$label n=$n: $(tail -n 2 /tmp/cg-client.log)"; return 1; }
    echo "@@CG BEGIN $label $n $rep"
    gzip -c /tmp/cg.out | base64
    echo "@@CG END"
}
rep=1
while [ $rep -le "${REPS:-3}" ]; do
for x in "$@"; do
    label=${x%%=*}; what=${x#*=}
    for n in $N1 $N2; do
        PORT=$((PORT + 1))
        case $what in
        blast:* | pblast:*)
            b=${what#*blast:} wait=--wait-notify
            case $what in pblast:*) wait="--poll --poll-recv" ;; esac
            $SV ./$b -s -p $PORT --once >/tmp/cg-srv.log 2>&1 &
            sp=$!
            sleep 2
            # blast's percentile() sorts the round trips' times (qsort, n log n): not
            # collected (in the thread that calls it; the option after --toggle-collect,
            # which sets --collect-atstart=no)
            cg $label $n --toggle-collect=percentile --collect-atstart=yes \
                ./$b -c $A -p $PORT --quiet --type seqpacket --lat-only --lat-size 64 \
                --lat-iters $n $wait
            kill $sp 2>/dev/null; wait $sp 2>/dev/null ;;
        rstream)
            $SV ./rstream -p $PORT -S 64 -C 1 -I $n -T b >/tmp/cg-srv.log 2>&1 &
            sp=$!
            sleep 2
            cg $label $n ./rstream -s $A -p $PORT -S 64 -C 1 -I $n -T b
            wait $sp 2>/dev/null ;;
        esac
    done
done
rep=$((rep + 1))
done
echo "CGINFO done"
