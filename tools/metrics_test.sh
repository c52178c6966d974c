#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# exsctl metrics against live processes (a blast run, the echo server under a name that
# needs escaping): promtool check metrics, every counter of every socket and every set
# exported once, totals, labels, the textfile mode's atomic file; exsctl stat lists the
# listener (Check-style summary).
. "$(dirname "$0")/exsctl_test_lib.sh" metrics_test "parsing the exposition" "${1:-build}"

# the echo server under a program name with a quote and a backslash (its comm: a label)
odd='ex"s\srv'
cp "$build/samples/seqpacket_echo_server" "$work/$odd"
"$work/$odd" 0 >"$work/srv.out" 2>"$work/srv.err" &
srv=$!; pids+=($srv)
wait_for 10 grep -q . "$work/srv.out" || { fail start "echo server did not start"; summary; exit 1; }
port=$(head -n 1 "$work/srv.out" | sed 's/.*://')
$build/samples/seqpacket_echo_client "$port" 100000000 64 >/dev/null 2>&1 &
pids+=($!)
$build/blast/blast --loopback --conns 3 --size 16384 --time $((30 * mult)) --quiet \
    >"$work/blast.out" 2>&1 &
blast=$!; pids+=($blast)

# every process moving bytes: the server's connection and blast's two ends
moving() {
    "$exsctl" stat --json >"$work/st.json" 2>/dev/null || return 1
    [ "$(jq_py "$work/st.json" "sum(1 for p in j['processes'] if any(c['bytes_sent'] for c in p['conns']))")" -ge 3 ]
}
wait_for 20 moving || fail moving "not 3 processes with bytes: $(head -c 600 "$work/st.json")"

# ---- exsctl stat lists the listener (an exs listener told from a plain TCP one) ----
"$exsctl" stat "$srv" >"$work/table.txt" 2>&1
if grep -E " LISTENING +[0-9.]+:$port " "$work/table.txt" >/dev/null; then pass stat_lists_listener
else fail stat_lists_listener "no LISTENING row for port $port: $(cat "$work/table.txt")"; fi

# ---- the exposition of every process ----
"$exsctl" metrics >"$work/m.prom" 2>"$work/m.err"
rc=$?
if [ $rc -eq 0 ] && [ -s "$work/m.prom" ]; then pass metrics_runs
else fail metrics_runs "exit $rc: $(cat "$work/m.err")"; fi
# promtool_check NAME FILE: promtool check metrics passes on FILE (skipped without promtool)
promtool_check() {
    if ! command -v promtool >/dev/null; then
        echo "SKIP $1: no promtool (Debian package prometheus: scripts/deps.sh)"
        pass "$1"
    elif promtool check metrics <"$2" >"$work/$1.out" 2>&1; then pass "$1"
    else fail "$1" "$(head -20 "$work/$1.out")"; fi
}
promtool_check promtool_check_metrics "$work/m.prom"
"$exsctl" stat --json >"$work/st.json"

# parse the exposition ourselves (strictly) and compare it with a stat taken after it:
# every numeric member of every socket and every set counter is there, once
python3 - "$work/m.prom" "$work/st.json" "$srv" "$odd" >"$work/check.out" 2>&1 <<'PY'
import json, re, sys
prom, st, srv, odd = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
ok = True
def bad(msg):
    global ok
    ok = False
    print("BAD", msg)
help_, type_, series = {}, {}, {}
lab = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
for line in open(prom):
    line = line.rstrip("\n")
    m = re.match(r'# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$', line)
    if m:
        (help_ if m[1] == "HELP" else type_)[m[2]] = m[3]
        continue
    m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', line)
    if not m:
        bad("unparsed line: %r" % line); continue
    labels, rest = {}, m[2] or ""
    while rest:
        l = lab.match(rest)
        if not l:
            bad("bad labels: %r" % line); break
        labels[l[1]] = re.sub(r'\\(.)', lambda x: {"n": "\n"}.get(x[1], x[1]), l[2])
        rest = rest[l.end():]
    key = (m[1], tuple(sorted(labels.items())))
    if key in series: bad("duplicate series %r" % (key,))
    series[key] = float(m[3])
    if m[1] not in help_ or m[1] not in type_: bad("no HELP/TYPE before %s" % m[1])
    if type_.get(m[1]) == "counter" and not m[1].endswith("_total"): bad("counter %s" % m[1])
def conn_value(name, pid, fd):
    for (n, ls), v in series.items():
        d = dict(ls)
        if n == name and d.get("pid") == str(pid) and d.get("fd") == str(fd): return v, d
    return None, None
procs = {str(p["pid"]): p for p in st["processes"]}
nconn = nset = 0
for pid, p in procs.items():
    for c in p["conns"]:
        for k, v in c.items():
            if not isinstance(v, int) or isinstance(v, bool) or k == "fd": continue
            name = "exs_conn_" + re.sub(r'_(us|ms)$', '_seconds', k)
            found = [n for n in (name, name + "_total") if conn_value(n, pid, c["fd"])[0] is not None]
            if len(found) != 1:
                # a socket opened between the two stats: not in the exposition at all
                if conn_value("exs_conn_info", pid, c["fd"])[0] is not None:
                    bad("pid %s fd %s: %s exported %d times" % (pid, c["fd"], k, len(found)))
                continue
            nconn += 1
        v, d = conn_value("exs_conn_info", pid, c["fd"])
        if v is not None:
            for want in ("type", "provider", "local", "peer", "state"):
                if d.get(want) != c[want]: bad("conn_info %s: %r, stat %r" % (want, d.get(want), c[want]))
    for s in p["counters"]:
        name = "exs_" + re.sub(r'[^a-zA-Z0-9_]', '_', s["set"] + "_" + s["name"])
        name = re.sub(r'_(us|ms)$', '_seconds', name)
        hits = [k for k in series if k[0] in (name, name + "_total") and dict(k[1]).get("pid") == pid]
        if len(hits) != 1: bad("pid %s set counter %s.%s: %d series" % (pid, s["set"], s["name"], len(hits)))
        nset += 1
# totals: each process's sum is the sum of its sockets' (the same exposition)
for pid in procs:
    conns = sum(v for (n, ls), v in series.items() if n == "exs_conn_bytes_sent_total" and dict(ls)["pid"] == pid)
    tot = [v for (n, ls), v in series.items() if n == "exs_process_bytes_sent_total" and dict(ls)["pid"] == pid]
    if tot != [conns]: bad("pid %s: total %r, sockets %r" % (pid, tot, conns))
progs = {dict(ls)["prog"] for (n, ls) in series if n == "exs_process_info" and dict(ls)["pid"] == srv}
if progs != {odd}: bad("prog label %r, wanted %r" % (progs, odd))
listen = [dict(ls) for (n, ls) in series if n == "exs_conn_info" and dict(ls)["pid"] == srv and dict(ls)["state"] == "LISTENING"]
if len(listen) != 1: bad("listener rows: %r" % listen)
if nconn < 3 * 20: bad("only %d socket values checked" % nconn)
if nset < 10: bad("only %d set counters checked" % nset)
print("checked %d socket values, %d set counters" % (nconn, nset))
print("ok" if ok else "FAILED")
PY
if tail -n 1 "$work/check.out" | grep -qx ok; then pass "metrics_every_counter_once ($(tail -n 2 "$work/check.out" | head -n 1))"
else fail metrics_every_counter_once "$(head -30 "$work/check.out")"; fi

# PID: that process only; a PID without an endpoint fails
"$exsctl" metrics "$srv" >"$work/one.prom" 2>&1
if [ "$(grep -c '^exs_process_info{' "$work/one.prom")" -eq 1 ] &&
    grep -q "^exs_process_info{pid=\"$srv\"," "$work/one.prom"; then pass metrics_pid
else fail metrics_pid "$(grep '^exs_process' "$work/one.prom" | head)"; fi
sh -c 'exit 0' & dead=$!; wait $dead
if "$exsctl" metrics "$dead" >/dev/null 2>"$work/dead.err"; then fail metrics_dead_pid "exit 0"
else pass metrics_dead_pid; fi

# ---- the textfile collector's file: replaced whole, never seen half written ----
mkdir "$work/tf"
"$exsctl" metrics --textfile "$work/tf" --interval 0.02 --count 100 2>"$work/tf.err" &
tfw=$!; pids+=($tfw)
python3 - "$work/tf/exs.prom" "$tfw" >"$work/tf.out" 2>&1 <<'PY'
import os, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
reads = torn = 0
def alive():
    try: os.kill(pid, 0); return True
    except ProcessLookupError: return False
while alive() or reads == 0:
    time.sleep(0.002)
    try: data = open(path).read()
    except FileNotFoundError: continue
    reads += 1
    # whole: ends with a newline, starts with the first family, has the last set counter
    if not (data.endswith("\n") and data.startswith("# HELP exs_processes ") and "exs_conn_info" in data):
        torn += 1
print("reads", reads, "torn", torn)
print("ok" if reads >= 10 and torn == 0 else "FAILED")
PY
wait $tfw; rc=$?
if [ $rc -eq 0 ] && tail -n 1 "$work/tf.out" | grep -qx ok; then pass "textfile_whole ($(head -n 1 "$work/tf.out"))"
else fail textfile_whole "exit $rc: $(cat "$work/tf.out" "$work/tf.err")"; fi
if [ "$(ls -A "$work/tf")" = exs.prom ]; then pass textfile_no_temporary_left
else fail textfile_no_temporary_left "$(ls -A "$work/tf")"; fi
promtool_check textfile_promtool "$work/tf/exs.prom"
# until killed: SIGTERM ends it between rounds, nothing left behind
rm -f "$work/tf/exs.prom"
"$exsctl" metrics --textfile "$work/tf" --interval 30 2>"$work/tf2.err" &
tfw=$!; pids+=($tfw)
wait_for 10 test -e "$work/tf/exs.prom"
kill -TERM $tfw; wait $tfw; rc=$?
if [ $rc -eq 0 ] && [ "$(ls -A "$work/tf")" = exs.prom ]; then pass textfile_sigterm
else fail textfile_sigterm "exit $rc: $(ls -A "$work/tf"; cat "$work/tf2.err")"; fi
if "$exsctl" metrics --textfile "$work/nosuchdir" --count 1 2>"$work/nd.err"; then
    fail textfile_bad_dir "exit 0"
elif grep -q nosuchdir "$work/nd.err"; then pass textfile_bad_dir
else fail textfile_bad_dir "$(cat "$work/nd.err")"; fi
if "$exsctl" metrics --interval 0 --textfile "$work/tf" 2>/dev/null; then fail metrics_usage "--interval 0 taken"
else pass metrics_usage; fi

kill "$blast" 2>/dev/null; wait "$blast" 2>/dev/null
if grep -qE 'Sanitizer|runtime error' "$work/srv.err" "$work/blast.out"; then
    fail inspected_processes_sanitizer_clean "$(grep -hE -A30 'Sanitizer|runtime error' "$work/srv.err" "$work/blast.out" | head -60)"
else pass inspected_processes_sanitizer_clean; fi
summary
