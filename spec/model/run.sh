#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Exhaustively check spec/model/stream.pml (and ring.pml: configurations ring_*) in every
# configuration.
# Correct configurations must verify with "errors: 0"; broken ones must make
# Spin report an error. One line per configuration, then "N passed, M failed".
set -u

here=$(cd "$(dirname "$0")" && pwd)
model=$here/stream.pml

if ! command -v spin >/dev/null 2>&1; then
    echo "run.sh: spin (the model checker) is not installed; scripts/deps.sh installs it" >&2
    exit 1
fi
cc=${CC:-cc}
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "run.sh: no C compiler ($cc) to build the Spin verifier" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/exs-model.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# name | expect (pass = no error, fail = Spin must find one) | spin -D flags
configs=(
  "plain|pass|"
  "waitall_mix|pass|-DWAIT0=1 -DWAIT2=1"
  "waitall_all|pass|-DWAIT0=1 -DWAIT1=1 -DWAIT2=1 -DRECV1=2"
  "sends_2_1_2|pass|-DSEND0=2 -DSEND1=1 -DSEND2=2 -DWAIT1=1 -DRECV1=2"
  "ring3|pass|-DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=1 -DWAIT2=1"
  "ring3_6bytes|pass|-DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DWAIT1=1 -DRECV1=2 -DXLEN=1"
  "resync_fix|pass|-DRESYNC -DWAIT2=1"
  "resync_fig5|pass|-DRESYNC_FIG5 -DCHECK_RESYNC -DWAIT0=1"
  "relaxed_advert_while_ring_nonempty|pass|-DBROKEN_ADVERT_WHILE_RING_NONEMPTY -DWAIT2=1"
  "drift_sec7|fail|-DCHECK_RESYNC"
  "drift_sec7_stays_indirect|pass|-DDRIFT_PROBE -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DXLEN=1"
  "drift_resync_fix_recovers|fail|-DDRIFT_PROBE -DRESYNC"
  "broken_ignore_prior_adverts|fail|-DBROKEN_IGNORE_PRIOR_ADVERTS -DNO_EXACT_CHECK"
  "broken_ignore_unadvertised|fail|-DBROKEN_IGNORE_UNADVERTISED -DNO_EXACT_CHECK"
  "broken_no_phase_jump|fail|-DBROKEN_NO_PHASE_JUMP -DNO_EXACT_CHECK"
  # the advertising rule of the C code (exs/proto/stream.c st_advertise_locked)
  "impl_plain|pass|-DIMPL_RULE"
  "impl_waitall_mix|pass|-DIMPL_RULE -DWAIT0=1 -DWAIT2=1"
  "impl_waitall_all|pass|-DIMPL_RULE -DWAIT0=1 -DWAIT1=1 -DWAIT2=1 -DRECV1=2"
  "impl_sends_2_1_2|pass|-DIMPL_RULE -DSEND0=2 -DSEND1=1 -DSEND2=2 -DWAIT1=1 -DRECV1=2"
  "impl_ring3|pass|-DIMPL_RULE -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=1 -DWAIT2=1"
  "impl_ring3_6bytes|pass|-DIMPL_RULE -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DWAIT1=1 -DRECV1=2 -DXLEN=1"
  "impl_lazy_plain|pass|-DIMPL_RULE -DIMPL_LAZY"
  "impl_lazy_waitall_all|pass|-DIMPL_RULE -DIMPL_LAZY -DWAIT0=1 -DWAIT1=1 -DWAIT2=1 -DRECV1=2"
  "impl_lazy_ring3_6bytes|pass|-DIMPL_RULE -DIMPL_LAZY -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DWAIT1=1 -DRECV1=2 -DXLEN=1"
  "impl_drift_recovers|fail|-DIMPL_RULE -DDRIFT_PROBE"
  "impl_late_advert_used|fail|-DIMPL_RULE -DLATE_ADVERT_PROBE"
  # transfer modes other than dynamic (published rule and the C rule)
  "tx_direct_only|pass|-DTX_DIRECT_ONLY -DWAIT1=1"
  "rx_indirect_only|pass|-DRX_INDIRECT_ONLY -DWAIT1=1"
  "tx_direct_rx_indirect|pass|-DTX_DIRECT_ONLY -DRX_INDIRECT_ONLY"
  "impl_tx_direct_only|pass|-DIMPL_RULE -DTX_DIRECT_ONLY -DWAIT0=1 -DWAIT1=1 -DWAIT2=1 -DRECV1=2"
  # the return to direct of section 7.2 (DRAIN) on the C rule, every mode pairing
  "drain_plain|pass|-DIMPL_RULE -DDRAIN"
  "drain_waitall_mix|pass|-DIMPL_RULE -DDRAIN -DWAIT0=1 -DWAIT2=1"
  "drain_waitall_all|pass|-DIMPL_RULE -DDRAIN -DWAIT0=1 -DWAIT1=1 -DWAIT2=1 -DRECV1=2"
  "drain_ring3_6bytes|pass|-DIMPL_RULE -DDRAIN -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DWAIT1=1 -DRECV1=2 -DXLEN=1"
  "drain_lazy|pass|-DIMPL_RULE -DDRAIN -DIMPL_LAZY"
  "drain_tx_direct_only|pass|-DIMPL_RULE -DDRAIN -DTX_DIRECT_ONLY -DWAIT1=1"
  "drain_rx_indirect_only|pass|-DIMPL_RULE -DDRAIN -DRX_INDIRECT_ONLY -DWAIT1=1"
  "drain_tx_direct_rx_indirect|pass|-DIMPL_RULE -DDRAIN -DTX_DIRECT_ONLY -DRX_INDIRECT_ONLY"
  "drain_witness_back_to_direct|fail|-DIMPL_RULE -DDRAIN -DDRAIN_WITNESS"
  # small receives stay indirect (section 7.3): receives of 1 byte are small here
  "small_plain|pass|-DIMPL_RULE -DADVERT_MIN=2"
  "small_waitall_all|pass|-DIMPL_RULE -DADVERT_MIN=2 -DWAIT0=1 -DWAIT1=1 -DWAIT2=1"
  "small_ring3_6bytes|pass|-DIMPL_RULE -DADVERT_MIN=2 -DRING=3 -DSEND0=2 -DSEND1=2 -DSEND2=2 -DWAIT1=1 -DXLEN=1"
  "small_drain|pass|-DIMPL_RULE -DDRAIN -DADVERT_MIN=2"
  "small_drain_waitall_mix|pass|-DIMPL_RULE -DDRAIN -DADVERT_MIN=2 -DWAIT0=1 -DWAIT2=1"
  "small_drain_lazy|pass|-DIMPL_RULE -DDRAIN -DIMPL_LAZY -DADVERT_MIN=2"
  "small_tx_direct_only|pass|-DIMPL_RULE -DDRAIN -DTX_DIRECT_ONLY -DADVERT_MIN=2 -DWAIT1=1"
  "small_rx_indirect_only|pass|-DIMPL_RULE -DDRAIN -DRX_INDIRECT_ONLY -DADVERT_MIN=2"
  "broken_small_after_drain|fail|-DIMPL_RULE -DDRAIN -DADVERT_MIN=2 -DBROKEN_SMALL_AFTER_DRAIN"
  "broken_small_direct_peer|fail|-DIMPL_RULE -DTX_DIRECT_ONLY -DADVERT_MIN=2 -DBROKEN_SMALL_DIRECT_PEER"
  "broken_drain_no_readvertise|fail|-DIMPL_RULE -DDRAIN -DBROKEN_DRAIN_NO_READVERT"
  "broken_drain_no_hold|fail|-DIMPL_RULE -DDRAIN -DBROKEN_DRAIN_NO_HOLD"
  # ring autotuning's switch (section 7.4): ring.pml, configurations named ring_*
  "ring_plain|pass|"
  "ring_ring1|pass|-DRING0=1 -DN=5"
  "ring_n7_ring3_3switches|pass|-DN=7 -DRING0=3 -DSWITCHES=3"
  "ring_broken_free_early|fail|-DBROKEN_FREE_EARLY"
  "ring_broken_answer_late|fail|-DBROKEN_ANSWER_LATE"
  "ring_broken_room_new_only|fail|-DBROKEN_ROOM_NEW_ONLY"
  "ring_broken_no_answer|fail|-DBROKEN_NO_ANSWER"
)

passed=0
failed=0
printf '%-36s %10s %7s %7s  %s\n' configuration states errors secs result
for c in "${configs[@]}"; do
    IFS='|' read -r name expect flags <<<"$c"
    d=$tmp/$name
    mkdir -p "$d"
    case $name in
    ring_*) cp "$here/ring.pml" "$d/stream.pml" ;; # the ring switch (section 7.4)
    *) cp "$model" "$d/stream.pml" ;;
    esac
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    if ! (cd "$d" && spin -a $flags stream.pml >spin.out 2>&1 &&
          "$cc" ${PAN_CFLAGS:--O1} -w -DSAFETY -o pan pan.c >cc.out 2>&1); then
        printf '%-36s %10s %7s %7s  %s\n' "$name" - - - "FAIL (build)"
        cat "$d/spin.out" "$d/cc.out" 2>/dev/null | head -5 >&2
        failed=$((failed + 1))
        continue
    fi
    (cd "$d" && ./pan -m200000 -w21 >pan.out 2>&1)
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    states=$(awk '/states, stored/ { print $1; exit }' "$d/pan.out")
    errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$d/pan.out" | head -1)
    [ -n "$errors" ] || errors=unknown
    ok=0
    if [ "$expect" = pass ] && [ "$errors" = 0 ] &&
       ! grep -q 'max search depth too small' "$d/pan.out"; then
        ok=1
    elif [ "$expect" = fail ] && [ "$errors" != unknown ] && [ "$errors" -gt 0 ] &&
         ! grep -q 'assertion violated.*q_full' "$d/pan.out"; then
        # (a full channel would be a flaw of the model, not the expected error)
        ok=1
    fi
    if [ $ok = 1 ]; then
        result=PASS
        passed=$((passed + 1))
    else
        result=FAIL
        failed=$((failed + 1))
    fi
    what=
    if [ "$errors" != 0 ] && [ "$errors" != unknown ]; then
        what=$(grep -m1 -E 'assertion violated|invalid end state' "$d/pan.out" |
               sed 's/^pan:[0-9]*: *//; s/ (at depth.*//')
        what=" [$what]"
    fi
    printf '%-36s %10s %7s %7s  %s (expected %s)%s\n' "$name" "${states:-?}" \
        "$errors" "$secs" "$result" "$expect" "$what"
    if [ "${MODEL_TRAILS:-0}" = 1 ] && [ -f "$d/stream.pml.trail" ]; then
        # shellcheck disable=SC2086
        (cd "$d" && spin -t $flags stream.pml | grep -E 'MSC:|assert|violated' |
            sed 's/^ *//' | tail -40) || true
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
