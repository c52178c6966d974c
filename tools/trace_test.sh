#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Request tracing against live blast runs: exsctl trace --chrome, the JSON records, mask 0, EXS_TRACE_FILE.
. "$(dirname "$0")/exsctl_test_lib.sh" trace_test "the JSON checks" "${1:-build}"

# blast processes of a run: the parent (its pid) and the receiver it forks (--loopback)
run_pids() { pgrep -P "$1" blast; echo "$1"; }
have_sockets() { for p in $(run_pids "$1"); do [ -S "$EXS_CTL_DIR/$p.sock" ] || return 1; done; [ "$(run_pids "$1" | wc -l)" -ge 2 ]; }

blast_run() { # MASK ITERS OUT [ENV=VALUE...]: a SEQPACKET ping-pong of 1 KiB in the background
    local mask=$1 n=$2 out=$3; shift 3
    env EXS_TRACE_SAMPLE_MASK="$mask" "$@" "$build/blast/blast" --loopback --type seqpacket \
        --lat-only --lat-iters "$n" --lat-size 1024 --quiet >"$out" 2>&1 &
}

# two long runs (killed at the end) and a short one writing EXS_TRACE_FILE
blast_run 63 10000000 "$work/on.out"
on=$!; pids+=($on)
blast_run 0 10000000 "$work/off.out"
off=$!; pids+=($off)
blast_run 255 20000 "$work/file.out" EXS_TRACE_FILE="$work/traces.jsonl"
file=$!; pids+=($file)
# STREAM: a ping-pong of 1 KiB sends, one in 256 traced, to a file (spec/protocol.md §5.1)
EXS_TRACE_SAMPLE_MASK=255 EXS_TRACE_FILE="$work/stream.jsonl" "$build/blast/blast" --loopback \
    --type stream --lat-only --lat-iters 20000 --lat-size 1024 --quiet >"$work/st.out" 2>&1 &
st=$!; pids+=($st)

# ---- exsctl trace --chrome against the run with mask 63 ----
if wait_for 20 have_sockets "$on"; then
    tracers=()
    for p in $(run_pids "$on"); do
        "$exsctl" trace "$p" --chrome "$work/chrome.$p.json" --count 5 --timeout $((10 * mult)) \
            2>"$work/chrome.$p.err" &
        tracers+=($!)
    done
    wait "${tracers[@]}" 2>/dev/null
    python3 - "$work" $(run_pids "$on") >"$work/chrome.res" 2>&1 <<'EOF'
import json, sys
work, pids = sys.argv[1], sys.argv[2:]
best = None
for p in pids:
    j = json.load(open(f"{work}/chrome.{p}.json"))     # every file parses
    ev = j["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    if x:
        best = (p, ev, x)
assert best, "no process wrote request traces"
p, ev, x = best
names = {e["name"] for e in x}
assert names == {"request", "send", "queued", "network", "delivery"}, names
assert len(x) == 5 * 5, len(x)
for e in x:
    assert e["pid"] == int(p) and e["tid"] in (1, 2, 3), e
    assert e["dur"] >= 0 and e["ts"] > 0, e
    assert e["dur"] < 10e6, e
    a = e["args"]
    assert a["conn"].startswith("0x") and a["bytes"] == 1024 and a["seq"] % 64 == 0, e
tracks = {e["args"]["name"] for e in ev if e.get("ph") == "M"}
assert tracks == {"sender", "network", "receiver"}, tracks
print(p)
EOF
    if [ $? -eq 0 ]; then
        sender=$(tail -n 1 "$work/chrome.res")
        pass "chrome_json_parses_with_events (pid $sender)"
    else
        fail chrome_json "$(cat "$work/chrome.res"; cat "$work"/chrome.*.err)"
        sender=
    fi
else
    fail chrome "no control sockets for the blast run: $(ls "$EXS_CTL_DIR"; cat "$work/on.out")"
    sender=
fi

# ---- the JSON records of the trace stream: ordered and bounded ----
if [ -n "$sender" ]; then
    "$exsctl" trace "$sender" --json --count 40 --timeout $((10 * mult)) >"$work/stream.json" 2>&1
    python3 - "$work/stream.json" >"$work/stream.res" 2>&1 <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
reqs = [json.loads(l)["req"] for l in lines[1:] if '"req"' in l]
assert json.loads(lines[0])["trace"] is True
assert len(reqs) >= 5, len(reqs)
for r in reqs:
    err = r["offset_err_ns"]
    assert r["seq"] % 64 == 0 and r["bytes"] == 1024, r
    assert r["post_ns"] <= r["wire_ns"] <= r["done_ns"], r
    assert r["arrival_ns"] <= r["delivery_ns"], r
    assert r["arrival_ns"] + err >= r["wire_ns"], r
    assert r["delivery_ns"] <= r["answer_ns"] + err, r
    # one host, but the receiver sent its times on its trace clock (a random epoch per
    # connection, spec/protocol.md 5.1), not its CLOCK_MONOTONIC: the offset is that
    # epoch's, years away; the bounds above check that it converts the times right
    assert abs(r["offset_ns"]) > 365 * 86400e9, r
    assert r["answer_ns"] - r["post_ns"] < 10e9, r
print(len(reqs))
EOF
    if [ $? -eq 0 ]; then pass "stream_records_ordered ($(tail -n 1 "$work/stream.res") records)"
    else fail stream_records_ordered "$(cat "$work/stream.res")"; fi
fi

# ---- mask 0: the run moves data and its trace stream carries no request record ----
moved() { # bytes sent by a process of run $1
    local p
    for p in $(run_pids "$1"); do
        "$exsctl" stat "$p" --json 2>/dev/null
    done >"$work/off.stat"
    python3 -c "
import json,sys
n=0
for l in open(sys.argv[1]):
    for p in json.loads(l)['processes']:
        n+=sum(c.get('bytes_sent',0) for c in p['conns'])
sys.exit(0 if n>0 else 1)" "$work/off.stat" 2>/dev/null
}
if wait_for 20 have_sockets "$off" && wait_for 20 moved "$off"; then
    ok=1
    for p in $(run_pids "$off"); do
        "$exsctl" trace "$p" --json >"$work/off.$p.json" 2>&1 &
        tr=$!
        wait_for 10 grep -qs '"trace":true' "$work/off.$p.json"
        # a marker: records arrive in order, so a request record would come before it
        "$exsctl" set "$p" log_level=info >/dev/null
        "$exsctl" set "$p" qspin_us=55 >/dev/null
        if ! wait_for 20 grep -qs 'qspin_us changed' "$work/off.$p.json"; then
            ok=0; fail mask0_marker "pid $p: $(cat "$work/off.$p.json")"
        elif grep -q '"req"' "$work/off.$p.json"; then
            ok=0; fail mask0_no_records "pid $p: $(grep '"req"' "$work/off.$p.json" | head -3)"
        fi
        kill "$tr" 2>/dev/null; wait "$tr" 2>/dev/null
    done
    [ $ok -eq 1 ] && pass mask0_no_request_records
else
    fail mask0 "the mask-0 run did not start or move data: $(cat "$work/off.out")"
fi

# ---- EXS_TRACE_FILE, converted by exsctl trace --chrome --from ----
wait "$file" 2>/dev/null
if [ -s "$work/traces.jsonl" ] &&
    "$exsctl" trace --chrome "$work/from.json" --from "$work/traces.jsonl" 2>"$work/from.err" &&
    python3 -c "
import json,sys
n=sum(1 for l in open(sys.argv[1]) if json.loads(l)['seq']%256==0)
ev=[e for e in json.load(open(sys.argv[2]))['traceEvents'] if e['ph']=='X']
assert n>0 and len(ev)==5*n, (n,len(ev))" "$work/traces.jsonl" "$work/from.json"; then
    pass "trace_file_converted ($(wc -l <"$work/traces.jsonl") records)"
else
    fail trace_file "$(head -3 "$work/traces.jsonl" 2>&1; cat "$work/from.err" "$work/file.out" 2>&1)"
fi

# ---- STREAM: records name the offset past the traced send's last byte ----
wait "$st" 2>/dev/null
if [ -s "$work/stream.jsonl" ] && python3 - "$work/stream.jsonl" >"$work/st.res" 2>&1 <<'EOF2'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) >= 2 * 70, len(recs)   # both ends send 20000 times (and warm up): 1 in 256
for r in recs:
    err = r["offset_err_ns"]
    # send n of 1 KiB ends at (n + 1) KiB; n = 0, 256, 512, ... are traced
    assert r["bytes"] == 1024 and r["seq"] % (256 * 1024) == 1024, r
    assert r["post_ns"] <= r["wire_ns"] <= r["done_ns"], r
    assert r["arrival_ns"] <= r["delivery_ns"], r
    assert r["arrival_ns"] + err >= r["wire_ns"], r
    assert r["delivery_ns"] <= r["answer_ns"] + err, r
    assert abs(r["offset_ns"]) > 365 * 86400e9, r   # the receiver's trace clock
    assert r["answer_ns"] - r["post_ns"] < 10e9, r
print(len(recs))
EOF2
then pass "stream_trace_records ($(tail -n 1 "$work/st.res") records)"
else fail stream_trace_records "$(cat "$work/st.res" "$work/st.out" 2>&1 | head -20)"; fi

kill "$on" "$off" 2>/dev/null; wait 2>/dev/null
if grep -qE 'Sanitizer|runtime error' "$work/on.out" "$work/off.out" "$work/file.out" "$work/st.out"; then
    fail traced_processes_sanitizer_clean "$(grep -hE -A30 'Sanitizer|runtime error' "$work"/*.out | head -60)"
else pass traced_processes_sanitizer_clean; fi
summary
