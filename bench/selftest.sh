#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Self test of make bench's tooling, run by make check: bench/test_bench.py (parsing, ratios,
# verdicts, error recording), then bench/bench.py end to end on a tiny configuration
# (BENCH_TINY: one round of 0.1 s runs, 64 B callgrind) whose results.json, results.md and
# results.png are checked, then once more with a base (BENCH_BASE_BLAST: the same blast, two
# rounds), whose comparison (ours / base per figure, the base's callgrind) is checked.
# Last, make bench-floor's script (bench/floor/floor.sh) on a tiny run.
# Prints Check's summary line for tests/run-checks.sh; the end-to-end tests are reported as
# skipped without ucx_perftest (scripts/deps.sh --bench installs it).
#   bench/selftest.sh [path/to/blast]
set -u
B=${1:-build/blast/blast}
cd "$(dirname "$0")/.."
T=$(mktemp -d /tmp/exs-bench-selftest.XXXXXX)
trap 'rm -rf "$T"' EXIT
checks=0; fails=0
t0=$(date +%s)

checks=$((checks + 1))
if python3 bench/test_bench.py >"$T/unit" 2>&1; then
    echo "  ok    bench/test_bench.py"
else
    fails=$((fails + 1)); echo "  FAIL  bench/test_bench.py"; sed 's/^/        /' "$T/unit"
fi

checks=$((checks + 1))
cg=1
# valgrind cannot run a sanitizer build: the end-to-end test runs without callgrind there
if ldd "$B" 2>/dev/null | grep -q -e libasan -e libtsan -e libubsan; then cg=0; fi
st=$cg
# strace needs ptrace: without it (some containers) the end-to-end test runs without strace
if [ $st = 1 ] && ! strace -f -o /dev/null true >/dev/null 2>&1; then st=0; fi
# a safety net, not a speed bound: the tiny runs take a minute on a quiet host and several
# on one loaded many times over
limit=${BENCH_SELFTEST_TIMEOUT:-1800}
if ! command -v ucx_perftest >/dev/null; then
    echo "SKIP bench_end_to_end: ucx_perftest not installed (scripts/deps.sh --bench)"
elif [ $cg = 1 ] && ! command -v valgrind >/dev/null; then
    echo "SKIP bench_end_to_end: valgrind not installed (scripts/deps.sh --bench)"
elif ! BENCH_TINY=1 BENCH_ROUNDS=1 BENCH_CALLGRIND=$cg BENCH_STRACE=$st BENCH_QUIET=1 BENCH_OUT="$T" \
        BENCH_BLAST="$B" EXS_PROVIDER=tcp timeout "$limit" python3 bench/bench.py >"$T/log" 2>&1; then
    fails=$((fails + 1)); echo "  FAIL  bench end to end: bench.py failed or ran past $limit s"
    sed 's/^/        /' "$T/log"
    [ -f "$T/results.md" ] && sed -n '/## Errors/,$p' "$T/results.md" | sed 's/^/        /'
elif python3 - "$T" "$cg" "$st" >"$T/check" 2>&1 <<'PYEOF'; then
import json, os, sys
d, cg, st = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
r = json.load(open(os.path.join(d, "results.json")))
assert r["errors"] == [], r["errors"]
sizes = [64, 4096, 65536, 1048576]
assert r["sizes"] == sizes
for system in ("exs_notify", "exs_poll", "exs_poll_send", "kernel_tcp", "kernel_tcp_poll",
               "ucx_tag_lat"):
    for z in sizes:
        f = r["summary"]["latency"][system]["sizes"][str(z)]
        assert f["p50_us"] > 0 and f["p99_us"] > 0 and f["mean_us"] > 0, (system, z, f)
        # UCX's p99 comes from a second run (-R 99): only one run's percentiles are ordered
        if system != "ucx_tag_lat":
            assert f["p99_us"] >= f["p50_us"], (system, z, f)
        assert len(f["runs"]) == 1 and f["runs"][0]["iters"] > 0, (system, z, f)
        assert f["p50_us"] == f["runs"][0]["p50_us"], (system, z, f)
for system in ("exs", "kernel_tcp", "kernel_tcp_1buf", "ucx_stream_bw", "ucx_tag_bw"):
    for z in sizes:
        f = r["summary"]["stream"][system]["sizes"][str(z)]
        assert f["msgs_per_sec"] > 0 and f["gbps"] > 0, (system, z, f)
        assert abs(f["gbps"] - f["msgs_per_sec"] * z * 8 / 1e9) / f["gbps"] < 0.05, (system, z, f)
assert len(r["targets"]) == 8 and len(r["other_targets"]) == 3
for t in r["targets"] + r["other_targets"]:
    assert t["ratio"] > 0 and abs(t["ratio"] - t["ours_value"] / t["peer_value"]) < 1e-9, t
    assert t["met"] in (True, False), t
if cg:
    c = r["callgrind"]["65536"]
    assert c["ir_per_msg_sender"] > 100 and c["ir_per_msg_receiver"] > 100, c
    assert c["hotspots"] and all(0 < h["share"] <= 1 for h in c["hotspots"]), c
    assert any(h["function"].startswith(("exs", "st_", "conn")) or "exs" in h["function"]
               for h in c["hotspots"]), "no libexs function among the hot spots: %s" % c
if st:
    c = r["syscalls"]["65536"]
    assert c["per_msg_total"] > 0 and c["per_msg"], c
md = open(os.path.join(d, "results.md")).read()
for t in r["targets"] + r["other_targets"]:
    assert "| " + t["what"] + " |" in md, t["what"]
assert ("Hot spots, 64 KiB" in md) == cg
assert ("## System calls per message" in md) == st
assert open(os.path.join(d, "results.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
PYEOF
    what="results.json, results.md, results.png$([ $cg = 1 ] && echo ', callgrind')$([ $st = 1 ] && echo ', strace')"
    echo "  ok    bench end to end (tiny: $what)"
else
    fails=$((fails + 1)); echo "  FAIL  bench end to end: results"; sed 's/^/        /' "$T/check"
fi

checks=$((checks + 1))
if ! command -v ucx_perftest >/dev/null || { [ $cg = 1 ] && ! command -v valgrind >/dev/null; }; then
    echo "SKIP bench_base_end_to_end: ucx_perftest or valgrind not installed"
elif ! BENCH_TINY=1 BENCH_ROUNDS=2 BENCH_CALLGRIND=$cg BENCH_STRACE=0 BENCH_QUIET=1 \
        BENCH_OUT="$T/base" BENCH_BLAST="$B" BENCH_BASE_BLAST="$B" BENCH_BASE_NAME=selftest \
        EXS_PROVIDER=tcp timeout "$limit" python3 bench/bench.py >"$T/log" 2>&1; then
    fails=$((fails + 1)); echo "  FAIL  bench base end to end: bench.py failed or ran past $limit s"
    sed 's/^/        /' "$T/log"
    [ -f "$T/base/results.md" ] && sed -n '/## Errors/,$p' "$T/base/results.md" | sed 's/^/        /'
elif python3 - "$T/base" "$cg" "$B" >"$T/check" 2>&1 <<'PYEOF'; then
import json, os, sys
d, cg, blast = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
r = json.load(open(os.path.join(d, "results.json")))
assert r["errors"] == [], r["errors"]
sizes = [64, 4096, 65536, 1048576]
for system in ("exs_notify", "exs_poll", "exs_poll_send"):
    for z in sizes:
        o = r["summary"]["latency"][system]["sizes"][str(z)]
        b = r["summary"]["latency"]["base_" + system]["sizes"][str(z)]
        assert len(o["runs"]) == 2 and len(b["runs"]) == 2, (system, z)
        assert b["p50_us"] > 0 and b["p99_us"] >= b["p50_us"], (system, z, b)
for z in sizes:
    b = r["summary"]["stream"]["base_exs"]["sizes"][str(z)]
    assert b["msgs_per_sec"] > 0 and len(b["runs"]) == 2, (z, b)
assert "base_kernel_tcp" not in r["summary"]["latency"]
base = r["base"]
assert base["name"] == "selftest" and base["blast"] == blast, base
figs = [f for f in base["figures"] if f["workload"] != "callgrind"]
assert len(figs) == 4 * (3 * 3 + 2), len(figs)
for f in figs:
    assert f["ours"] > 0 and f["base"] > 0, f
    assert abs(f["ratio"] - f["ours"] / f["base"]) < 1e-9, f
    assert f["noise"] is not None and f["noise"] >= 0, f
    assert f["verdict"] in ("within noise", "ours better", "ours worse"), f
    assert (f["verdict"] == "within noise") == (abs(f["ratio"] - 1) <= f["noise"]), f
cgf = [f for f in base["figures"] if f["workload"] == "callgrind"]
if cg:
    assert [f["system"] for f in cgf] == ["sender", "receiver", "total"], cgf
    assert all(abs(f["ratio"] - f["ours"] / f["base"]) < 1e-9 for f in cgf), cgf
    # the sender's count is the send path's; the receiver's (its threads' idle loops count
    # too) moves with the machine's load at these tiny message counts: not bounded here
    assert cgf[0]["base"] > 100 and cgf[2]["base"] > 100, cgf
    assert base["callgrind"]["65536"]["ir_per_msg_total"] == cgf[2]["base"]
else:
    assert not cgf and base["callgrind"] is None, base
md = open(os.path.join(d, "results.md")).read()
assert "## Against the base build (selftest)" in md
assert "| p50 / base |" in md and "| / base |" in md
assert "| 64 B | base (selftest): libexs, blocking waits (--wait-notify: every wait sleeps) |" in md
assert ("ours Ir/msg | base Ir/msg" in md) == cg
PYEOF
    echo "  ok    bench base end to end (tiny, 2 rounds: ours / base per figure$([ $cg = 1 ] && echo ', callgrind'))"
else
    fails=$((fails + 1)); echo "  FAIL  bench base end to end: results"; sed 's/^/        /' "$T/check"
fi

# make bench-floor's script on a tiny run: a table with a positive median for each layer
checks=$((checks + 1))
bdir=$(dirname "$(dirname "$B")")
if ! timeout "$limit" bash bench/floor/floor.sh "$bdir" --rounds 1 --iters 2000 >"$T/floor" 2>&1; then
    fails=$((fails + 1)); echo "  FAIL  bench floor: floor.sh failed"; sed 's/^/        /' "$T/floor"
elif [ "$(grep -cE '^\| (line|prov|api) \| [0-9.]*[1-9][0-9.]* \|' "$T/floor")" -ne 3 ]; then
    fails=$((fails + 1)); echo "  FAIL  bench floor: no line, prov and api rows"; sed 's/^/        /' "$T/floor"
else
    echo "  ok    bench floor (tiny: line, prov and api rows$(grep -q '^| ucx ' "$T/floor" && echo ', ucx'))"
fi

echo "bench self test: $(( $(date +%s) - t0 )) s"
echo "$(( (checks - fails) * 100 / checks ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
