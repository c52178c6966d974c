# SPDX-License-Identifier: MIT
# rxe-probe-arms-guest.sh: guest side of bench/rxe-probe-arms.sh (busybox sh, rxe0 on 10.0.2.15).
# 64 KiB STREAM direct, blast builds X (this tree) and B (the base), default and --poll (Xp, Bp),
# interleaved, and ib_write_bw; the engine and provider counters of both ends (exsctl metrics)
# and their threads' context switches, 1.5 s and 3 s into each T s run; /proc/interrupts.
A=10.0.2.15
export PATH=/guest:$PATH EXS_PROVIDER=verbs EXS_CTL_DIR=/tmp/ctl
mkdir -p /tmp/ctl
CL="taskset -c 0"; SV="taskset -c 1"
C=${C:-3}; T=${T:-4}; PORT=7600
snapm() { # pid tag
  ./exsctl metrics $1 2>/dev/null | grep -E '^exs_(engine|prov|process_bytes_sent|process_bytes_received)' | sed "s/^/M tag=$2 /"
  for t in /proc/$1/task/*; do echo "M tag=$2 thr_$(cat $t/comm | tr -c 'a-zA-Z0-9\n' _)_vcs $(awk '/^voluntary_ctxt/ {print $2}' $t/status)"; echo "M tag=$2 thr_$(cat $t/comm | tr -c 'a-zA-Z0-9\n' _)_ivcs $(awk '/^nonvoluntary_ctxt/ {print $2}' $t/status)"; done
}
blastrun() { # tag binary extra...
  tag=$1; bin=$2; shift 2
  PORT=$((PORT + 1))
  $SV ./$bin -s -p $PORT --once >/tmp/srv.log 2>&1 &
  sp=$!; sleep 1
  $CL ./$bin -c $A -p $PORT --json --quiet --type stream --size 65536 --mode direct --time $T --runs 1 --no-latency "$@" >/tmp/out.json 2>/tmp/blast.err &
  cp=$!
  sleep 1.5; snapm $cp c0; snapm $sp s0; grep -E 'CPU|rxe|virtio' /proc/interrupts | tr -s ' ' | sed 's/^/I0 /'
  sleep 1.5; snapm $cp c1; snapm $sp s1; grep -E 'rxe|virtio' /proc/interrupts | tr -s ' ' | sed 's/^/I1 /'
  wait $cp; wait $sp
  g=$(sed -n 's/.*"throughput_gbps": *\([0-9.e+-]*\).*/\1/p' /tmp/out.json | head -n 1)
  m=$(tr ',' '\n' </tmp/out.json | sed -n 's/.*"messages": *\([0-9.e+-]*\).*/\1/p' | head -n 1)
  echo "BW cyc=$c tag=$tag gbps=$g msgs=$m"
  tail -n 2 /tmp/blast.err | sed "s/^/ERR tag=$tag /"
}
ptrun() {
  PORT=$((PORT + 1))
  $SV ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits >/tmp/pt-srv.out 2>&1 &
  sp=$!; sleep 1
  $CL ib_write_bw -R -d rxe0 -F -p $PORT -s 65536 -D $T --report_gbits $A >/tmp/pt.out 2>&1
  wait $sp
  r=$(awk '$1 == 65536 {print; exit}' /tmp/pt.out)
  echo "BW cyc=$c tag=ibwb gbps=$(echo "$r" | awk -v t=$T '{printf "%.4f", $2 * 65536 * 8 / t / 1e9}') msgs=$(echo "$r" | awk '{print $2}')"
}
c=0
blastrun warm blastX
c=1
while [ $c -le $C ]; do
  for v in ${VARIANTS:-X B Xp Bp}; do
    case $v in
      X) blastrun X blastX ;; B) blastrun B blastB ;;
      Xp) blastrun Xp blastX --poll ;; Bp) blastrun Bp blastB --poll ;;
      Bl) EXS_LEASE_US=3000 blastrun Bl blastB ;; Blp) EXS_LEASE_US=3000 blastrun Blp blastB --poll ;;
    esac
  done
  ptrun
  c=$((c + 1))
done
echo DONE
