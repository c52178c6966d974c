#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Smoke test of blast: short runs of every option, checking exit codes and output formats.
#   blast/smoke.sh [path/to/blast]
set -u
B=${1:-build/blast/blast}
T=$(mktemp -d /tmp/blast-smoke.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
export EXS_PROVIDER=${EXS_PROVIDER:-tcp}
TO=${BLAST_SMOKE_TIMEOUT:-60}
KEYS=throughput_gbps,throughput_ci95_gbps,bytes,messages,seconds,direct_xfers,indirect_xfers,direct_ratio,mode_switches,cpu_send_pct,cpu_recv_pct,type,transport,mode,sends,recvs,size,conns,runs,direct_time_ms,indirect_time_ms,drain_requests_sent,drain_requests_honoured,ring_resizes,ring_size
Q="--quiet"
t0=$(date +%s)

ok()  { pass=$((pass + 1)); printf '  ok    %s\n' "$1"; }
bad() {
    fail=$((fail + 1)); printf '  FAIL  %s\n' "$1"
    # a sanitizer report first (its head names the bug), then the end of the output
    grep -A 24 -m 1 'ERROR: .*Sanitizer' "$T/err" | sed 's/^/        /'
    sed 's/^/        /' "$T/err" | tail -n 8
}

# run NAME EXPECT(0|nonzero) ARGS...: output in $T/out, stderr in $T/err
run() {
    local name=$1 expect=$2; shift 2
    timeout "$TO" "$B" "$@" > "$T/out" 2> "$T/err"
    local rc=$?
    if { [ "$expect" = 0 ] && [ $rc -eq 0 ]; } || { [ "$expect" != 0 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ]; }; then
        return 0
    fi
    echo "exit status $rc (wanted $expect): $B $*" >> "$T/err"
    return 1
}

# json_ok FILE [extra keys]: valid JSON, every result has the required keys
json_ok() {
    python3 -m json.tool "$1" > /dev/null 2>> "$T/err" || return 1
    python3 - "$1" "$KEYS${2:+,$2}" <<'EOF' 2>> "$T/err"
import json, sys
d = json.load(open(sys.argv[1]))
keys = sys.argv[2].split(",")
assert d["results"], "no results"
for r in d["results"]:
    missing = [k for k in keys if "." not in k and k not in r]
    for k in keys:
        if "." in k:
            o = r
            for part in k.split("."):
                o = o[part]
    assert not missing, "missing keys %s" % missing
    assert r["throughput_gbps"] > 0, "zero throughput"
EOF
}

t() { # t NAME ARGS...: a run that must succeed and print a table row
    local name=$1; shift
    if run "$name" 0 "$@" $Q && grep -q '^ exs\|^ tcp' "$T/out"; then ok "$name"; else bad "$name"; fi
}

echo "blast smoke test: $B"
if run "--help" 0 --help && grep -q -- '--sweep' "$T/out"; then ok "--help"; else bad "--help"; fi
if run "bad option" 2 --loopback --sends 0; then ok "rejects --sends 0"; else bad "rejects --sends 0"; fi
if run "no role" 2 --time 1; then ok "rejects a missing role"; else bad "rejects a missing role"; fi

# seqpacket: works on every libexs of this tree
t "seqpacket --bytes --verify (latency auto)" --loopback --type seqpacket --bytes 4M --runs 2 --verify --lat-iters 200
if grep -q 'lat_p50' "$T/out"; then ok "seqpacket prints latency percentiles"; else bad "seqpacket prints latency percentiles"; fi
t "seqpacket --no-latency --size fixed" --loopback --type seqpacket --bytes 4M --runs 1 --no-latency --size 100000 --verify
t "seqpacket --size exp:MEAN (no MAX)" --loopback --type seqpacket --bytes 4M --runs 1 --no-latency --size exp:64K --verify
t "seqpacket --sweep size --mode list" --loopback --type seqpacket --bytes 2M --runs 1 --no-latency --sweep size=4K,64K,1M --mode dynamic,indirect --verify

# stream (the default type)
t "stream default --time" --loopback --time 0.3 --runs 2 --verify
t "stream --mode all" --loopback --bytes 8M --runs 1 --mode all --verify
t "stream --waitall" --loopback --bytes 8M --runs 1 --waitall --verify --size 256K
t "stream --sends/--recvs" --loopback --bytes 8M --runs 1 --sends 2 --recvs 4 --verify
t "stream --rcvbuf" --loopback --bytes 8M --runs 1 --rcvbuf 256K --mode indirect --verify
t "stream --conns" --loopback --bytes 8M --runs 1 --conns 3 --verify
t "stream --poll --seed" --loopback --bytes 8M --runs 1 --poll --seed 99 --verify
t "stream --latency --lat-size" --loopback --bytes 4M --runs 1 --latency --lat-iters 200 --lat-size 1K --verify
t "stream --delay-ms --rate-mbps" --loopback --bytes 4M --runs 1 --delay-ms 2 --rate-mbps 4000 --verify --sends 4 --recvs 4
if grep -q 'emulated link' "$T/out"; then ok "emulation noted in the table"; else bad "emulation noted in the table"; fi
t "--transport tcp" --loopback --bytes 8M --runs 2 --transport tcp --verify
t "--transport tcp --type seqpacket --latency" --loopback --bytes 4M --runs 1 --transport tcp --type seqpacket --lat-iters 200 --verify
t "--transport tcp --tcp-one-buffer" --loopback --bytes 8M --runs 1 --transport tcp --tcp-one-buffer --sends 4 --recvs 8 --verify
t "--one-buffer (libexs, direct)" --loopback --bytes 8M --runs 1 --one-buffer --sends 4 --recvs 8 --size 256K --mode direct
if run "one-buffer verify" 2 --loopback --one-buffer --verify; then ok "rejects --one-buffer --verify (libexs)"; else bad "rejects --one-buffer --verify (libexs)"; fi
t "--transport tcp --lat-only --poll --poll-recv" --loopback --transport tcp --type seqpacket --lat-only --lat-iters 200 --poll --poll-recv

# JSON, CSV, plot, output file
if run "json" 0 --loopback --bytes 8M --runs 2 --transport both --mode all --verify --json $Q && cp "$T/out" "$T/j" && json_ok "$T/j" \
   && [ "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["results"]))' "$T/j")" = 4 ]; then
    ok "--json --transport both --mode all (4 results, keys)"; else bad "--json --transport both --mode all"; fi
if run "mix" 0 --loopback --time 0.3 --runs 1 --mix elephants=2,mice=4,mice-size=2K,mice-sends=2 --verify --json $Q && cp "$T/out" "$T/j" \
   && json_ok "$T/j" classes.elephants.throughput_gbps,classes.mice.send_p99_us; then
    ok "--mix elephants/mice --json (per-class keys)"; else bad "--mix elephants/mice --json"; fi
if run "mix table" 0 --loopback --bytes 8M --runs 1 --mix elephants=1,mice=2 --verify $Q && grep -q 'mice' "$T/out"; then
    ok "--mix --bytes table"; else bad "--mix --bytes table"; fi
if run "seqpacket json latency" 0 --loopback --type seqpacket --bytes 2M --runs 1 --lat-iters 100 --json $Q && cp "$T/out" "$T/j" \
   && json_ok "$T/j" latency_us.p50,latency_us.p99,latency_us.p999; then
    ok "seqpacket --json latency keys"; else bad "seqpacket --json latency keys"; fi
# --lat-only (make bench): no throughput run, one ping-pong of exactly --lat-iters round
# trips per transport; --poll --poll-recv: both ends busy-poll
if run "lat-only" 0 --loopback --type seqpacket --lat-only --poll --poll-recv --lat-iters 150 --lat-size 4K --transport both --json $Q \
   && python3 - "$T/out" <<'EOF' 2>> "$T/err"; then
import json, sys
r = json.load(open(sys.argv[1]))["results"]
assert [x["transport"] for x in r] == ["exs", "tcp"], r
for x in r:
    assert x["runs"] == 0 and x["messages"] == 0 and x["bytes"] == 0, x
    assert x["latency_us"]["count"] == 150 and x["latency_us"]["p50"] > 0, x
EOF
    ok "--lat-only --poll --poll-recv --transport both: latency only, exact count"; else bad "--lat-only --poll --poll-recv"; fi
t "stream --poll-recv (receiver polls alone)" --loopback --bytes 8M --runs 1 --poll-recv --verify
if run "lat-only no-latency" 2 --loopback --lat-only --no-latency; then ok "rejects --lat-only --no-latency"; else bad "rejects --lat-only --no-latency"; fi
if run "csv" 0 --loopback --bytes 4M --runs 1 --sweep recvs=1,2 --csv --verify $Q && head -1 "$T/out" | grep -q '^type,transport,mode,.*throughput_gbps' \
   && [ "$(wc -l < "$T/out")" -eq 3 ]; then ok "--csv header + rows (--sweep recvs)"; else bad "--csv"; fi
rm -f "$T/p.png"
if run "plot" 0 --loopback --bytes 4M --runs 2 --sweep sends=1,2 --recv-ratio 2 --mode all --plot "$T/p.png" --verify $Q \
   && [ "$(head -c 8 "$T/p.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
    ok "--plot PNG (--sweep sends --recv-ratio --mode all)"; else bad "--plot PNG"; fi
if run "depth sweep + output" 0 --loopback --bytes 4M --runs 1 --sweep depth=1-4*2 --output "$T/o.txt" --verify $Q \
   && [ "$(grep -c '^ exs' "$T/o.txt")" -eq 3 ]; then ok "--sweep depth=1-4*2 --output FILE"; else bad "--sweep depth --output"; fi

# the algorithm's EXS_SO_STATS fields are columns of the table
if run "stats columns" 0 --loopback --bytes 4M --runs 1 $Q && grep -q '^#xprt .* dir_ms  *ind_ms  *drains  *ring_K  *resized' "$T/out" \
   && [ "$(grep '^ exs' "$T/out" | awk '{print NF}')" -eq 20 ]; then
    ok "table has dir_ms/ind_ms/drains/ring_K/resized"; else bad "table stats columns"; fi

# presets: the paper's figures, a tiny sweep (--points) each
if run "preset list" 0 --preset list && [ "$(grep -c '^  fig' "$T/out")" -eq 5 ]; then ok "--preset list"; else bad "--preset list"; fi
if run "preset alias" 0 --loopback --preset fig10b --points 1 --bytes 4M $Q && grep -q '^# blast --preset fig9b:' "$T/out"; then
    ok "--preset fig10b runs fig9b (Fig. 10 = its receiver CPU)"; else bad "--preset fig10b"; fi
if run "preset unknown" 2 --loopback --preset fig99 && grep -q 'fig9a' "$T/err"; then
    ok "rejects an unknown preset, names the presets"; else bad "rejects an unknown preset"; fi
if run "points without preset" 2 --loopback --points 2; then ok "rejects --points without --preset"; else bad "rejects --points without --preset"; fi
if run "preset sweep conflict" 2 --loopback --preset fig9a --sweep depth=1,2; then ok "rejects --preset with --sweep"; else bad "rejects --preset with --sweep"; fi
# text: a '# paper' line, the header, exactly the first 2 points of Fig. 9b, three positive
# Gbit/s figures, a dyn/best ratio and Table III's value on each line, and the summary
if run "preset fig9b" 0 --loopback --preset fig9b --points 2 --time 0.2 --verify $Q \
   && grep -q '^# paper' "$T/out" && grep -q '^# ours: 1 run(s) of 0.2 s per mode' "$T/out" \
   && grep -q '^#sends/recvs .*direct .*indirect .*dynamic .*dyn/best' "$T/out" \
   && [ "$(grep -v '^#' "$T/out" | awk '{print $1}' | tr '\n' ' ')" = "1/2 2/4 " ] \
   && [ "$(grep -v '^#' "$T/out" | awk '$3 > 0 && $4 > 0 && $5 > 0 && $6 > 0 && /Table III/' | wc -l)" -eq 2 ] \
   && grep -q '^# dynamic >= 0.9 x the better fixed mode at [0-2] of 2 points; dynamic direct ratio >= 0.9 at [0-2] of 2; direct time >= 0.9 at [0-2] of 2$' "$T/out"; then
    ok "--preset fig9b --points 2: table shape"; else bad "--preset fig9b --points 2"; cat "$T/out"; fi
# Markdown: a header, a separator and one row of 13 cells per point
if run "preset markdown" 0 --loopback --preset fig12 --points 2 --bytes 4M --markdown --verify $Q \
   && [ "$(grep -c '^| ' "$T/out")" -eq 3 ] && [ "$(grep -c '^|---' "$T/out")" -eq 1 ] \
   && grep -q '^`blast --loopback --preset fig12` (1 run(s) of 4194304 bytes per mode' "$T/out" \
   && [ "$(grep '^| [0-9]' "$T/out" | awk -F'|' '{print NF - 2}' | sort -u)" = 13 ] \
   && grep -q '^| 2/4 | 4K |' "$T/out" && grep -q '^| 2/4 | 16K |' "$T/out"; then
    ok "--preset fig12 --markdown: table shape"; else bad "--preset fig12 --markdown"; cat "$T/out"; fi
# JSON: one result per mode and point, the preset's keys, the paper's Table III ratio
if run "preset json" 0 --loopback --preset fig9a --points 1 --bytes 4M --json $Q && cp "$T/out" "$T/j" \
   && json_ok "$T/j" preset,point,paper,paper_direct_ratio && python3 - "$T/j" <<'EOF' 2>> "$T/err"; then
import json, sys
d = json.load(open(sys.argv[1]))
assert d["preset"] == "fig9a" and d["paper"], d
r = d["results"]
assert [x["mode"] for x in r] == ["direct", "indirect", "dynamic"], r
assert all(x["sends"] == 1 and x["recvs"] == 1 and x["point"] == 0 for x in r), r
assert abs(r[0]["paper_direct_ratio"] - 0.0011) < 1e-9, r[0]
assert r[0]["direct_ratio"] == 1 and r[1]["direct_ratio"] == 0, r
EOF
    ok "--preset fig9a --json: three modes, preset keys"; else bad "--preset fig9a --json"; fi
# --rounds (the presets' default is 3): each mode ran 3 times and keeps its median round
if run "preset rounds" 0 --loopback --preset fig9b --points 1 --bytes 4M --rounds 3 --json $Q && cp "$T/out" "$T/j" \
   && json_ok "$T/j" rounds,round_throughputs_gbps && python3 - "$T/j" <<'EOF' 2>> "$T/err"; then
import json, sys
r = json.load(open(sys.argv[1]))["results"]
assert [x["mode"] for x in r] == ["direct", "indirect", "dynamic"], r
for x in r:
    t = x["round_throughputs_gbps"]
    assert x["rounds"] == 3 and len(t) == 3 and min(t) > 0, x
    assert abs(x["throughput_gbps"] - sorted(t)[1]) < 1e-6, x
EOF
    ok "--preset --rounds 3: each mode's median round"; else bad "--preset --rounds 3"; fi
if run "rounds bad" 2 --loopback --preset fig9b --rounds 17; then ok "rejects --rounds 17"; else bad "rejects --rounds 17"; fi
# --transport both: the kernel-TCP baseline as one more column (14 cells in Markdown)
if run "preset tcp" 0 --loopback --preset fig9a --points 1 --bytes 4M --transport both --markdown $Q \
   && grep -q '| kernel TCP Gbit/s | paper |$' "$T/out" \
   && [ "$(grep '^| 1/1' "$T/out" | awk -F'|' '{print NF - 2}')" = 14 ] \
   && [ "$(grep '^| 1/1' "$T/out" | awk -F'|' '{print ($14 > 0)}')" = 1 ]; then
    ok "--preset --transport both: a kernel TCP column"; else bad "--preset --transport both"; cat "$T/out"; fi
rm -f "$T/p.png"
if run "preset plot" 0 --loopback --preset fig11 --points 2 --bytes 2M --plot "$T/p.png" $Q \
   && [ "$(head -c 8 "$T/p.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
    ok "--preset fig11 --plot PNG"; else bad "--preset fig11 --plot"; fi
# Fig. 13 sets the long link itself (48 ms round trip, 10 Gbit/s)
if run "preset fig13" 0 --loopback --preset fig13 --points 1 --time 0.3 $Q \
   && grep -q 'one-way delay 24 ms, rate 10000' "$T/out" && [ "$(grep -vc '^#' "$T/out")" -eq 1 ]; then
    ok "--preset fig13: emulated 48 ms link"; else bad "--preset fig13"; cat "$T/out"; fi

# separate roles: -s and -c. Fixed ports below the kernel's ephemeral range (32768+), so
# other tests' connections cannot hold them; a port in use still gets another try.
sc_ok=0
for attempt in 1 2 3; do
    port=$((10000 + RANDOM % 20000))
    timeout "$TO" "$B" -s -p $port --once > "$T/srv" 2>&1 &
    spid=$!
    # wait until the receiver listens (sanitizer builds start slowly): /proc/net/tcp, 0A
    hexport=$(printf '%04X' "$port")
    for _ in $(seq 1 100); do
        grep -q ":$hexport [0-9A-F:]* 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
        sleep 0.1
    done
    if run "-c" 0 -c 127.0.0.1 -p $port --bytes 4M --runs 1 --verify --transport both $Q && wait $spid; then
        sc_ok=1; break
    fi
    kill $spid 2>/dev/null; wait $spid 2>/dev/null
    grep -q -e 'could not listen' -e 'cannot reach' -e 'in use' "$T/err" "$T/srv" || break
done
if [ $sc_ok = 1 ]; then ok "-s --once / -c HOST -p PORT (exs and tcp)"; else bad "-s / -c"; fi

# failures must be loud and nonzero
if run "no receiver" 1 -c 127.0.0.1 -p 9 --bytes 1M && grep -q 'cannot reach' "$T/err"; then
    ok "no receiver: clear error, nonzero"; else bad "no receiver"; fi
# 100,000 batched SOCK_SEQPACKET messages with receives advertised ahead: the sender drops
# stale ADVERTs as they come (they once piled up past 65,536 and the honest receiver was
# taken for a hostile one: "peer broke the protocol")
if run "sp many" 0 --loopback --type seqpacket --size 1024 --bytes $((1024 * 100000)) --runs 1 \
    --no-latency --verify $Q; then
    ok "seqpacket: 100,000 batched messages with ADVERTs ahead"
else bad "seqpacket: 100,000 batched messages with ADVERTs ahead"; fi
if run "inject" 1 --loopback --bytes 4M --runs 1 --inject-error $Q && grep -q 'DATA ERROR' "$T/err"; then
    ok "--inject-error (stream): DATA ERROR, nonzero"; else bad "--inject-error (stream)"; fi
if run "inject sp" 1 --loopback --type seqpacket --bytes 4M --runs 1 --no-latency --inject-error $Q && grep -q 'DATA ERROR' "$T/err"; then
    ok "--inject-error (seqpacket): DATA ERROR, nonzero"; else bad "--inject-error (seqpacket)"; fi
if run "inject tcp" 1 --loopback --transport tcp --bytes 4M --runs 1 --inject-error $Q && grep -q 'DATA ERROR' "$T/err"; then
    ok "--inject-error (tcp): DATA ERROR, nonzero"; else bad "--inject-error (tcp)"; fi

echo "blast smoke: $(( $(date +%s) - t0 )) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
