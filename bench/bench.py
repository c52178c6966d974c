#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""make bench: libexs (blast, tcp provider) against kernel TCP and UCX over TCP, interleaved.

Runs every workload of issue 11's "Done when" round-robin across the systems (one
measurement of each system per round, medians over the rounds), then instructions per
message with callgrind, and writes results.json, results.md and results.png. With a base
blast (BENCH_BASE_BLAST: another build of the tree, e.g. request tracing compiled out), every
libexs system is measured a second time with it in the same rounds, and results give
ours / base per figure.
Configuration comes from the environment (bench/run.sh documents it).
"""
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [64, 4096, 65536, 1048576]
SENDS, RECVS = 16, 32


def size_name(s):
    if s >= 1 << 20 and s % (1 << 20) == 0:
        return "%d MiB" % (s >> 20)
    if s >= 1024 and s % 1024 == 0:
        return "%d KiB" % (s >> 10)
    return "%d B" % s


# --- the systems -------------------------------------------------------------------------

LAT_SYSTEMS = [
    ("exs_notify", "libexs, blocking waits (--wait-notify: every wait sleeps)"),
    ("exs_poll", "libexs, busy polling at both ends (--poll --poll-recv)"),
    ("exs_poll_send", "libexs, busy polling at the sender only (--poll)"),
    ("kernel_tcp", "kernel TCP (blast --transport tcp)"),
    ("kernel_tcp_poll", "kernel TCP, busy polling at both ends (--poll --poll-recv: "
     "non-blocking reads in a loop)"),
    ("ucx_tag_lat", "UCX over TCP, tag_lat"),
    # same host at memory speed (issue 28): the shm provider against UCX's shared memory
    ("exs_shm_poll", "libexs over the shm provider (EXS_PROVIDER=shm), busy polling at both "
     "ends"),
    ("ucx_sm_tag_lat", "UCX shared memory (UCX_TLS=sm,self), tag_lat"),
]
BW_SYSTEMS = [
    ("exs", "libexs (dynamic < 64 KiB, direct >= 64 KiB)"),
    ("kernel_tcp", "kernel TCP (blast --transport tcp: 16 send and 32 receive buffers used in "
     "turn, as libexs's run)"),
    ("kernel_tcp_1buf", "kernel TCP, one buffer per side reused (--tcp-one-buffer: cache-hot)"),
    ("ucx_stream_bw", "UCX over TCP, stream_bw"),
    ("ucx_tag_bw", "UCX over TCP, tag_bw"),
    ("exs_shm", "libexs over the shm provider (EXS_PROVIDER=shm; dynamic < 64 KiB, direct "
     ">= 64 KiB)"),
    ("exs_shm_1buf", "libexs over shm, one buffer per side reused (--one-buffer: cache-hot, "
     "as ucx_perftest's)"),
    ("ucx_sm_stream_bw", "UCX shared memory (UCX_TLS=sm,self), stream_bw"),
]


# The same-host systems (issue 28), left out of the self test's tiny run.
SHM_SYSTEMS = ("exs_shm_poll", "ucx_sm_tag_lat", "exs_shm", "exs_shm_1buf", "ucx_sm_stream_bw")

# The libexs systems a base build is measured as too: "base_" + name, the base's blast.
BASE_PREFIX = "base_"
BASE_LAT = ("exs_notify", "exs_poll", "exs_poll_send")
BASE_BW = ("exs",)
# The base comparison's figures: (workload, system, figure, lower is better).
BASE_FIGURES = [("lat", n, k, True) for n in BASE_LAT for k in ("p50_us", "p99_us", "mean_us")] \
    + [("bw", n, k, False) for n in BASE_BW for k in ("msgs_per_sec", "gbps")]


def with_base(systems, names, base_name):
    """systems with a base entry right after each of names (None: no base)."""
    out = []
    for n, d in systems:
        out.append((n, d))
        if base_name is not None and n in names:
            out.append((BASE_PREFIX + n, "base (%s): %s" % (base_name, d)))
    return out


def round_order(systems, rnd):
    """The order of round rnd (0, 1, ...): in rounds 1, 3, ... each base entry goes before
    its own system, so that neither build is always measured first (a drift of the load
    favours neither)."""
    out = list(systems)
    if rnd % 2:
        for i in range(1, len(out)):
            if out[i][0] == BASE_PREFIX + out[i - 1][0]:
                out[i - 1], out[i] = out[i], out[i - 1]
    return out


def exs_mode(size):
    """The issue's workload: direct-only from 64 KiB up, the default protocol below."""
    return "direct" if size >= 65536 else "dynamic"


def brief(text):
    """The head (the error) and the tail (the end of the output) of a failed run's stderr."""
    lines = [l for l in text.strip().splitlines() if l.strip()]
    if len(lines) > 5:
        lines = lines[:2] + ["..."] + lines[-3:]
    return " / ".join(lines)[:600]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blast_has_option(blast, option):
    """Whether this blast's --help names option (a base build may predate it)."""
    try:
        p = subprocess.run([blast, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return option.encode() in p.stdout


class Bench:
    def __init__(self, cfg):
        self.cfg = cfg
        self.blast = cfg["blast"]
        self.base_blast = cfg.get("base_blast")
        base = cfg.get("base_name") if self.base_blast else None
        # a base built with --wait-notify (2026-11-30 on) waits as ours does in exs_notify;
        # one built before it has no such option and sleeps at once by default
        self.base_wait_notify = bool(self.base_blast) and blast_has_option(self.base_blast,
                                                                           "--wait-notify")
        self.lat_systems = with_base(LAT_SYSTEMS, BASE_LAT, base)
        self.bw_systems = with_base(BW_SYSTEMS, BASE_BW, base)
        if cfg["tiny"]:  # the self test checks the tooling: the same-host columns stay out
            self.lat_systems = [x for x in self.lat_systems if x[0] not in SHM_SYSTEMS]
            self.bw_systems = [x for x in self.bw_systems if x[0] not in SHM_SYSTEMS]
        self.env = dict(os.environ, EXS_PROVIDER="tcp")
        self.ucx_env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
        self.shm_env = dict(os.environ, EXS_PROVIDER="shm")
        self.ucx_sm_env = dict(os.environ, UCX_TLS="sm,self")
        self.errors = []
        self.have_ucx = shutil.which("ucx_perftest") is not None
        # Iteration counts follow the previous round so that each run lasts about run_secs.
        self.iters = {}

    def log(self, msg):
        if not self.cfg["quiet"]:
            print("bench: " + msg, file=sys.stderr, flush=True)

    def run(self, argv, env, timeout):
        try:
            p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, "timed out after %d s: %s" % (timeout, " ".join(argv))
        if p.returncode != 0:
            return None, "exit %d: %s: %s" % (p.returncode, " ".join(argv),
                                               brief(p.stderr))
        return p.stdout, None

    def blast_json(self, args, blast=None, env=None):
        argv = [blast or self.blast, "--loopback", "--json", "--quiet"] + args
        out, err = self.run(argv, env or self.env, self.cfg["timeout"])
        if err:
            return None, err
        try:
            return json.loads(out)["results"][0], None
        except (ValueError, KeyError, IndexError) as e:
            return None, "bad JSON from %s: %s" % (" ".join(argv), e)

    def ucx(self, test, size, n, outstanding, extra=(), env=None):
        """One ucx_perftest run, server and client on loopback; the CSV line as a dict."""
        env = env or self.ucx_env
        if not self.have_ucx:
            return None, "ucx_perftest not installed"
        last = None
        for _attempt in range(3):
            port = free_port()
            srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                argv = ["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s",
                        str(size), "-n", str(n), "-w", str(max(n // 10, 10)), "-f", "-v"]
                if outstanding:
                    argv += ["-O", str(outstanding)]
                argv += list(extra)
                out = None
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and srv.poll() is None:
                    out, last = self.run(argv, env, self.cfg["timeout"])
                    if out is not None:
                        break
                    time.sleep(0.05)  # the server may not listen yet
                if out is not None:
                    lines = [l for l in out.splitlines() if l.strip()]
                    hdr = [l for l in lines if l.startswith("iterations,")]
                    if not hdr:
                        return None, "no CSV header from %s" % " ".join(argv)
                    keys = hdr[-1].split(",")
                    vals = lines[-1].split(",")
                    try:
                        return dict(zip(keys, (float(v) for v in vals))), None
                    except ValueError:
                        return None, "bad CSV line from %s: %s" % (" ".join(argv), lines[-1])
            finally:
                if srv.poll() is None:
                    srv.terminate()
                try:
                    srv.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait()
        return None, last or "ucx_perftest server exited"

    # --- one measurement of one system ---------------------------------------------------

    def next_iters(self, key, guess):
        return self.iters.get(key, guess)

    def learn_iters(self, key, seconds_per_iter, lo, hi):
        if seconds_per_iter and seconds_per_iter > 0:
            n = int(self.cfg["run_secs"] / seconds_per_iter)
            self.iters[key] = max(lo, min(hi, n))

    def lat_once(self, system, size):
        """Round trip p50/p99/mean in microseconds."""
        key = ("lat", system, size)
        blast = self.blast
        if system.startswith(BASE_PREFIX):  # the same run with the base's blast
            system, blast = system[len(BASE_PREFIX):], self.base_blast
        lo, hi = self.cfg["lat_iters_min"], 2000000
        guess = self.cfg["lat_iters_guess"]
        if size > 4096:  # large messages: fewer round trips in the first round
            guess = guess * 4096 // size
        n = self.next_iters(key, max(lo, guess))
        if system.startswith("exs") or system.startswith("kernel_tcp"):
            args = ["--type", "seqpacket", "--lat-only", "--lat-size", str(size),
                    "--lat-iters", str(n)]
            if system.startswith("kernel_tcp"):
                args += ["--transport", "tcp"]
            if system in ("exs_poll", "kernel_tcp_poll", "exs_shm_poll"):
                args += ["--poll", "--poll-recv"]
            elif system == "exs_poll_send":
                args += ["--poll"]
            elif system == "exs_notify" and (blast is self.blast or self.base_wait_notify):
                # every wait sleeps, as kernel TCP's blocking recv() does (the library's
                # default wait spins 10 us first; a base built before it has no option
                # and sleeps at once by default)
                args += ["--wait-notify"]
            r, err = self.blast_json(args, blast,
                                     self.shm_env if system == "exs_shm_poll" else None)
            if err:
                return None, err
            lat = r.get("latency_us")
            if not lat or not lat.get("count"):
                return None, "no latency in blast's JSON (%s)" % " ".join(args)
            self.learn_iters(key, lat["mean"] * 1e-6, lo, hi)
            return {"p50_us": lat["p50"], "p99_us": lat["p99"], "mean_us": lat["mean"],
                    "iters": n}, None
        # ucx_perftest prints one-way latency (half the ping-pong round trip): doubled here.
        # It prints one percentile per run (-R): a second run gives the 99th.
        env = self.ucx_sm_env if system.startswith("ucx_sm") else None
        r, err = self.ucx("tag_lat", size, n, 0, env=env)
        if not err:
            r99, err = self.ucx("tag_lat", size, n, 0, ("-R", "99"), env=env)
        if err:
            return None, err
        try:
            p50 = 2 * r["50.0_percentile_lat"]
            p99 = 2 * r99["99.0_percentile_lat"]
            mean = 2 * r["overall_lat"]
        except KeyError as e:
            return None, "ucx_perftest tag_lat: no column %s in its CSV output" % e
        self.learn_iters(key, mean * 1e-6, lo, hi)
        return {"p50_us": p50, "p99_us": p99, "mean_us": mean, "iters": n}, None

    def bw_once(self, system, size):
        """Messages/s and Gbit/s (10^9 bits/s) of SOCK_STREAM sends, 16 sends outstanding."""
        blast = self.blast
        if system.startswith(BASE_PREFIX):
            system, blast = system[len(BASE_PREFIX):], self.base_blast
        if system in ("exs", "kernel_tcp", "kernel_tcp_1buf", "exs_shm", "exs_shm_1buf"):
            args = ["--type", "stream", "--sends", str(SENDS), "--recvs", str(RECVS), "--size",
                    str(size), "--runs", "1", "--time", "%g" % self.cfg["run_secs"],
                    "--no-latency"]
            if system in ("exs", "exs_shm", "exs_shm_1buf"):
                args += ["--mode", exs_mode(size)]
                if system == "exs_shm_1buf":
                    args += ["--one-buffer"]
            else:
                args += ["--transport", "tcp"]
                if system == "kernel_tcp_1buf":
                    args += ["--tcp-one-buffer"]
            r, err = self.blast_json(args, blast,
                                     self.shm_env if system.startswith("exs_shm") else None)
            if err:
                return None, err
            return {"msgs_per_sec": r["messages_per_sec"], "gbps": r["throughput_gbps"],
                    "cpu_send_pct": r["cpu_send_pct"], "cpu_recv_pct": r["cpu_recv_pct"],
                    "direct_ratio": r["direct_ratio"]}, None
        key = ("bw", system, size)
        lo, hi = self.cfg["bw_iters_min"], 20000000
        n = self.next_iters(key, max(lo, int(self.cfg["bw_bytes_guess"] / size)))
        if system.startswith("ucx_sm_"):
            r, err = self.ucx(system[len("ucx_sm_"):], size, n, SENDS, env=self.ucx_sm_env)
        else:
            r, err = self.ucx(system[4:], size, n, SENDS)
        if err:
            return None, err
        mr = r.get("overall_mr", 0)
        self.learn_iters(key, 1.0 / mr if mr > 0 else 0, lo, hi)
        return {"msgs_per_sec": mr, "gbps": mr * size * 8 / 1e9, "iters": n}, None

    # --- the interleaved run -------------------------------------------------------------

    def measure(self):
        lat = {s: {z: [] for z in SIZES} for s, _ in self.lat_systems}
        bw = {s: {z: [] for z in SIZES} for s, _ in self.bw_systems}
        rounds = self.cfg["rounds"]
        for rnd in range(rounds):
            for size in SIZES:
                for system, _ in round_order(self.lat_systems, rnd):
                    self.log("round %d/%d: ping-pong %s, %s" % (rnd + 1, rounds,
                                                                 size_name(size), system))
                    v, err = self.lat_once(system, size)
                    if err:
                        self.errors.append("latency %s %s: %s" % (system, size_name(size), err))
                    lat[system][size].append(v)
                for system, _ in round_order(self.bw_systems, rnd):
                    self.log("round %d/%d: stream %s, %s" % (rnd + 1, rounds, size_name(size),
                                                              system))
                    v, err = self.bw_once(system, size)
                    if err:
                        self.errors.append("stream %s %s: %s" % (system, size_name(size), err))
                    bw[system][size].append(v)
        return lat, bw

    # --- callgrind -----------------------------------------------------------------------

    def callgrind_run(self, size, count, outdir, blast=None):
        """blast --loopback under callgrind: exactly `count` messages of `size` bytes.
        Returns {side: {"total": Ir, "fns": {function: Ir}}} for sender and receiver."""
        tag = "%d-%d" % (size, count)
        pattern = os.path.join(outdir, "cg.%s.%%p" % tag)
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + pattern,
                blast or self.blast, "--loopback", "--type", "stream", "--mode", exs_mode(size),
                "--sends", str(SENDS), "--recvs", str(RECVS), "--size", str(size), "--bytes",
                str(size * count), "--runs", "1", "--no-latency", "--quiet"]
        p = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            _, errout = p.communicate(timeout=self.cfg["callgrind_timeout"])
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return None, "callgrind run timed out: %s" % " ".join(argv)
        if p.returncode != 0:
            return None, "exit %d: %s: %s" % (p.returncode, " ".join(argv), brief(errout))
        sides = {}
        for f in os.listdir(outdir):
            if not f.startswith("cg.%s." % tag):
                continue
            pid = int(f.rsplit(".", 1)[1])
            # The sender is the process started here; the receiver is its forked child.
            side = "sender" if pid == p.pid else "receiver"
            sides[side] = annotate(os.path.join(outdir, f))
        if set(sides) != {"sender", "receiver"}:
            return None, "callgrind: expected a sender and a receiver profile, got %s" % sorted(
                sides)
        return sides, None

    def strace_run(self, size, count, outdir):
        """System calls of blast --loopback (both processes, every thread) for `count`
        messages of `size` bytes: {syscall: calls}."""
        out = os.path.join(outdir, "st.%d-%d" % (size, count))
        argv = ["strace", "-f", "-c", "-o", out, self.blast, "--loopback", "--type", "stream",
                "--mode", exs_mode(size), "--sends", str(SENDS), "--recvs", str(RECVS),
                "--size", str(size), "--bytes", str(size * count), "--runs", "1",
                "--no-latency", "--quiet"]
        _, err = self.run(argv, self.env, self.cfg["callgrind_timeout"])
        if err:
            return None, err
        with open(out) as f:
            return parse_strace(f.read()), None

    def syscalls(self):
        if not shutil.which("strace"):
            self.errors.append("system calls: strace not installed")
            return None
        out = {}
        with tempfile.TemporaryDirectory(prefix="exs-bench-st.") as tmp:
            for size, (n1, n2) in self.cfg["cg_counts"].items():
                self.log("strace: %s x %d and x %d" % (size_name(size), n1, n2))
                a, err = self.strace_run(size, n1, tmp)
                if not err:
                    b, err = self.strace_run(size, n2, tmp)
                if err:
                    self.errors.append("system calls %s: %s" % (size_name(size), err))
                    continue
                out[size] = syscalls_per_message(a, b, n2 - n1)
                out[size].update({"mode": exs_mode(size), "counts": [n1, n2]})
        return out

    def callgrind(self, base=False):
        """Ir per message of ours (or, base: of the base's blast) at each cg_counts size."""
        blast, what = (self.base_blast, "callgrind (base)") if base else (self.blast, "callgrind")
        if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
            self.errors.append("%s: valgrind not installed" % what)
            return None
        out = {}
        tmp = tempfile.mkdtemp(prefix="exs-bench-cg.")
        try:
            for size, (n1, n2) in self.cfg["cg_counts"].items():
                self.log("%s: %s x %d and x %d" % (what, size_name(size), n1, n2))
                a, err = self.callgrind_run(size, n1, tmp, blast)
                if not err:
                    b, err = self.callgrind_run(size, n2, tmp, blast)
                if err:
                    self.errors.append("%s %s: %s" % (what, size_name(size), err))
                    continue
                out[size] = ir_per_message(a, b, n2 - n1, self.cfg["hotspots"])
                out[size].update({"mode": exs_mode(size), "counts": [n1, n2]})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out


# --- callgrind parsing (pure functions: bench/selftest.sh tests them) -------------------

ANN_LINE = re.compile(r"^\s*([0-9][0-9,]*)\s+(?:\([^)]*\)\s+)?(\S.*?)\s*$")


def parse_annotate(text):
    """callgrind_annotate --inclusive=no output: (total Ir, {function: self Ir})."""
    total, fns, in_fns = None, {}, False
    for line in text.splitlines():
        if total is None:
            m = re.match(r"^\s*([0-9][0-9,]*)\s+(?:\([^)]*\)\s+)?PROGRAM TOTALS", line)
            if m:
                total = int(m.group(1).replace(",", ""))
            continue
        if re.match(r"^\s*Ir\s+file:function", line):
            in_fns = True
            continue
        if in_fns:
            if line.startswith("--") and fns:
                break
            m = ANN_LINE.match(line)
            if m:
                name = m.group(2)
                # "file:function [object]" -> "function"; unknown files keep "???:addr".
                name = re.sub(r"\s+\[[^\]]*\]$", "", name)
                if ":" in name:
                    name = name.split(":", 1)[1]
                fns[name] = fns.get(name, 0) + int(m.group(1).replace(",", ""))
    if total is None:
        raise ValueError("no PROGRAM TOTALS line in callgrind_annotate output")
    return total, fns


def parse_strace(text):
    """strace -c's table: {syscall: calls}."""
    calls = {}
    for line in text.splitlines():
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) in (5, 6) and f[3].isdigit() and not f[-1] == "total":
            try:
                float(f[0])
            except ValueError:
                continue
            calls[f[-1]] = calls.get(f[-1], 0) + int(f[3])
    return calls


def syscalls_per_message(a, b, dn):
    per = {k: (b.get(k, 0) - a.get(k, 0)) / dn for k in set(a) | set(b)}
    per = {k: v for k, v in per.items() if v > 0.005}
    return {"per_msg_total": sum(per.values()),
            "per_msg": dict(sorted(per.items(), key=lambda kv: -kv[1]))}


def annotate(path):
    p = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    total, fns = parse_annotate(p.stdout)
    return {"total": total, "fns": fns}


def ir_per_message(a, b, dn, nhot):
    """Marginal instructions per message between two runs of dn messages apart (the fixed
    cost of start-up, connection and teardown cancels out), per side and per function."""
    res = {}
    both = {}
    for side in ("sender", "receiver"):
        res["ir_per_msg_" + side] = (b[side]["total"] - a[side]["total"]) / dn
        for fn in set(a[side]["fns"]) | set(b[side]["fns"]):
            d = b[side]["fns"].get(fn, 0) - a[side]["fns"].get(fn, 0)
            both[fn] = both.get(fn, 0) + d
    tot = res["ir_per_msg_sender"] + res["ir_per_msg_receiver"]
    res["ir_per_msg_total"] = tot
    hot = sorted(both.items(), key=lambda kv: -kv[1])[:nhot]
    res["hotspots"] = [{"function": fn, "ir_per_msg": d / dn,
                        "share": (d / dn) / tot if tot > 0 else 0} for fn, d in hot]
    return res


# --- summaries and targets --------------------------------------------------------------

def median(vals, key):
    xs = [v[key] for v in vals if v and v.get(key) is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


# The "Done when" (issue 11). kind "max": ours/peer must be <= target; "min": >=.
TARGETS = [
    ("lat", 64, "exs_poll", "kernel_tcp", "p50_us", "max", 1.0,
     "64 B ping-pong p50, busy polling (both ends) vs kernel TCP"),
    ("lat", 64, "exs_poll", "ucx_tag_lat", "p50_us", "max", 2.0,
     "64 B ping-pong p50, busy polling (both ends) vs UCX tag_lat"),
    ("lat", 64, "exs_notify", "kernel_tcp", "p50_us", "max", 1.5,
     "64 B ping-pong p50, blocking waits vs kernel TCP"),
    ("bw", 64, "exs", "ucx_stream_bw", "msgs_per_sec", "min", 2.0,
     "64 B stream msg/s vs UCX stream_bw"),
    ("bw", 64, "exs", "kernel_tcp", "msgs_per_sec", "min", 0.5,
     "64 B stream msg/s vs kernel TCP"),
    ("bw", 4096, "exs", "kernel_tcp", "gbps", "min", 0.9,
     "4 KiB stream Gbit/s vs kernel TCP"),
    ("bw", 65536, "exs", "kernel_tcp", "gbps", "min", 0.95,
     "64 KiB stream Gbit/s (direct) vs kernel TCP"),
    ("bw", 1048576, "exs", "kernel_tcp", "gbps", "min", 0.95,
     "1 MiB stream Gbit/s (direct) vs kernel TCP"),
]
# Beside the targets, the same comparisons against the other kernel baselines:
# busy polling against kernel TCP busy polling, the large sizes against kernel TCP reusing one
# cache-hot buffer (blast's kernel baseline before 2026-11-24).
OTHER_TARGETS = [
    ("lat", 64, "exs_poll", "kernel_tcp_poll", "p50_us", "max", 1.0,
     "64 B ping-pong p50, busy polling (both ends) vs kernel TCP busy polling"),
    ("bw", 65536, "exs", "kernel_tcp_1buf", "gbps", "min", 0.95,
     "64 KiB stream Gbit/s (direct) vs kernel TCP, one buffer"),
    ("bw", 1048576, "exs", "kernel_tcp_1buf", "gbps", "min", 0.95,
     "1 MiB stream Gbit/s (direct) vs kernel TCP, one buffer"),
]

# Issue 28's "Done when": the shm provider against UCX's shared memory.
SHM_TARGETS = [
    ("lat", 64, "exs_shm_poll", "ucx_sm_tag_lat", "p50_us", "max", 1.5,
     "shm: 64 B SEQPACKET ping-pong p50, busy polling vs UCX sm tag_lat"),
    ("bw", 64, "exs_shm", "ucx_sm_stream_bw", "msgs_per_sec", "min", 1.0,
     "shm: 64 B stream msg/s vs UCX sm stream_bw"),
    # like for like (session 26, h69): ucx_perftest's stream_bw reuses one buffer at each
    # end (cache-hot), so libexs's does too (--one-buffer); the row after it keeps blast's
    # own workload (16 sources, 32 destinations: 48 MiB, cache-cold) against the same UCX
    ("bw", 1048576, "exs_shm_1buf", "ucx_sm_stream_bw", "gbps", "min", 0.9,
     "shm: 1 MiB stream Gbit/s, one buffer per side as UCX's, vs UCX sm stream_bw"),
    ("bw", 1048576, "exs_shm", "ucx_sm_stream_bw", "gbps", "min", 0.9,
     "shm: 1 MiB stream Gbit/s, 16 send and 32 receive buffers (cache-cold), vs UCX sm "
     "stream_bw (one buffer per side)"),
]


def fi_pingpong(size, iters, timeout):
    """libfabric's shm provider (fi_pingpong -p shm -e rdm, libfabric-bin): its mean round
    trip in microseconds (it prints no percentiles), or None and why."""
    if not shutil.which("fi_pingpong"):
        return None, "fi_pingpong not installed (libfabric-bin)"
    port = free_port()
    base = ["fi_pingpong", "-p", "shm", "-e", "rdm", "-S", str(size), "-I", str(iters)]
    srv = subprocess.Popen(base + ["-B", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # the server's control socket
        p = subprocess.run(base + ["-P", str(port), "127.0.0.1"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        rows = [l.split() for l in p.stdout.splitlines() if l.split()[:1] == [str(size)]]
        if p.returncode or not rows:
            return None, "fi_pingpong exit %d: %s" % (p.returncode, brief(p.stderr))
        return {"mean_us": 2 * float(rows[-1][6]), "iters": iters}, None  # usec/xfer: one way
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return None, "fi_pingpong: %s" % e
    finally:
        srv.kill()
        srv.wait()


def target_met(kind, r, target):
    if r is None:
        return None
    return r <= target if kind == "max" else r >= target


def summarize(lat, bw, lat_systems=LAT_SYSTEMS, bw_systems=BW_SYSTEMS):
    s = {"latency": {}, "stream": {}}
    for system, desc in lat_systems:
        s["latency"][system] = {"description": desc, "sizes": {}}
        for size in SIZES:
            runs = lat[system][size]
            s["latency"][system]["sizes"][str(size)] = {
                "p50_us": median(runs, "p50_us"), "p99_us": median(runs, "p99_us"),
                "mean_us": median(runs, "mean_us"),
                "runs": [None if v is None else {k: v[k] for k in ("p50_us", "p99_us",
                                                                    "mean_us", "iters")}
                         for v in runs]}
    for system, desc in bw_systems:
        s["stream"][system] = {"description": desc, "sizes": {}}
        for size in SIZES:
            runs = bw[system][size]
            s["stream"][system]["sizes"][str(size)] = {
                "msgs_per_sec": median(runs, "msgs_per_sec"), "gbps": median(runs, "gbps"),
                "runs": runs}
    return s


def figure(summary, kind, size, system, key):
    sect = summary["latency" if kind == "lat" else "stream"]
    return sect[system]["sizes"][str(size)][key]


def round_ratios(summary, kind, size, ours, peer, key):
    """ours / peer in each round (None where either failed): the two ran one after the other
    in that round, so a change of the host between rounds (spec/provider-shm.md, the host's
    two CPU-placement speeds) moves both. Shown beside the ratio of the medians, which is
    what a target is judged by."""
    sect = summary["latency" if kind == "lat" else "stream"]
    ra = sect[ours]["sizes"][str(size)]["runs"]
    rb = sect[peer]["sizes"][str(size)]["runs"]
    return [ratio(x.get(key), y.get(key)) if x and y else None for x, y in zip(ra, rb)]


def targets(summary, table=None):
    out = []
    for kind, size, ours, peer, key, sense, tgt, what in (TARGETS if table is None else table):
        a, b = figure(summary, kind, size, ours, key), figure(summary, kind, size, peer, key)
        r = ratio(a, b)
        out.append({"what": what, "size": size, "ours": ours, "peer": peer, "figure": key,
                    "ours_value": a, "peer_value": b, "ratio": r,
                    "round_ratios": round_ratios(summary, kind, size, ours, peer, key),
                    "target": ("<= " if sense == "max" else ">= ") + "%g" % tgt,
                    "met": target_met(sense, r, tgt)})
    return out


def ratios(summary):
    """Every figure of ours against every peer's, per size (the tables' ratio columns)."""
    out = []
    for size in SIZES:
        for ours in ("exs_notify", "exs_poll", "exs_poll_send"):
            for peer in ("kernel_tcp", "kernel_tcp_poll", "ucx_tag_lat"):
                out.append({"workload": "latency", "size": size, "ours": ours, "peer": peer,
                            "figure": "p50_us",
                            "ratio": ratio(figure(summary, "lat", size, ours, "p50_us"),
                                           figure(summary, "lat", size, peer, "p50_us"))})
        for peer in ("kernel_tcp", "kernel_tcp_1buf", "ucx_stream_bw", "ucx_tag_bw"):
            out.append({"workload": "stream", "size": size, "ours": "exs", "peer": peer,
                        "figure": "msgs_per_sec",
                        "ratio": ratio(figure(summary, "bw", size, "exs", "msgs_per_sec"),
                                       figure(summary, "bw", size, peer, "msgs_per_sec"))})
    return out


def spread(runs, key):
    """The noise of one system's figure: (largest - smallest) / median over the rounds;
    None with fewer than two measured rounds."""
    xs = [v[key] for v in runs if v and v.get(key) is not None]
    if len(xs) < 2 or not statistics.median(xs):
        return None
    return (max(xs) - min(xs)) / statistics.median(xs)


def base_verdict(r, noise, lower_better):
    """ours / base against the noise: "within noise" when |ratio - 1| <= the larger
    spread of the two systems' rounds, else "ours better" or "ours worse"."""
    if r is None or noise is None:
        return None
    if abs(r - 1) <= noise:
        return "within noise"
    return "ours better" if (r < 1) == lower_better else "ours worse"


def base_compare(summary, cg=None, cg_base=None):
    """Every libexs figure of ours against the same figure of the base build, per size:
    medians, ratio, noise (spread of rounds) and verdict; callgrind Ir per message too."""
    out = []
    for kind, system, key, lower in BASE_FIGURES:
        sect = summary["latency" if kind == "lat" else "stream"]
        if BASE_PREFIX + system not in sect:
            continue
        for size in SIZES:
            o = sect[system]["sizes"][str(size)]
            b = sect[BASE_PREFIX + system]["sizes"][str(size)]
            r = ratio(o[key], b[key])
            sp = [spread(o["runs"], key), spread(b["runs"], key)]
            noise = None if None in sp else max(sp)
            out.append({"workload": "latency" if kind == "lat" else "stream", "size": size,
                        "system": system, "figure": key, "ours": o[key], "base": b[key],
                        "ratio": r, "noise": noise,
                        "verdict": base_verdict(r, noise, lower)})
    for size in sorted(set(cg or {}) & set(cg_base or {}), key=int):
        for side in ("sender", "receiver", "total"):
            k = "ir_per_msg_" + side
            r = ratio(cg[size][k], cg_base[size][k])
            # instruction counts do not depend on the load: any difference is the code's
            out.append({"workload": "callgrind", "size": int(size), "system": side,
                        "figure": k, "ours": cg[size][k], "base": cg_base[size][k],
                        "ratio": r, "noise": None, "verdict": None})
    return out


# --- machine -----------------------------------------------------------------------------

def sh(argv):
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine(root):
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    rev = sh(["git", "-C", root, "rev-parse", "--short=12", "HEAD"])
    lib = sh(["git", "-C", root, "log", "-1", "--format=%h %cs %s", "--", "exs", "include"])
    if sh(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"]):
        rev += " (with uncommitted changes)"
    ucx = sh(["ucx_info", "-v"]).splitlines()
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "os": sh(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "git": rev, "library": lib,
            "branch": sh(["git", "-C", root, "rev-parse", "--abbrev-ref", "HEAD"]),
            "ucx": ucx[0].lstrip("# ") if ucx else "not installed",
            "loadavg_start": os.getloadavg()[0]}


# --- output ------------------------------------------------------------------------------

def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return "{:,.0f}".format(v)
    return "%.*f" % (digits, v)


def fmt_ratio(r):
    return "n/a" if r is None else "%.2f" % r


def each_round(runs, key, digits):
    return ", ".join("failed" if v is None else fmt(v[key], digits) for v in runs)


def met_str(m):
    return "n/a" if m is None else ("met" if m else "**not met**")


def target_table(res, key="targets"):
    L = ["| figure | ours | peer | ours/peer | each round | target | |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in res.get(key) or []:
        unit = {"p50_us": " us", "msgs_per_sec": " msg/s", "gbps": " Gbit/s"}[t["figure"]]
        digits = {"p50_us": 2, "msgs_per_sec": 0, "gbps": 2}[t["figure"]]
        L.append("| %s | %s%s | %s%s | %s | %s | %s | %s |" % (
            t["what"], fmt(t["ours_value"], digits), unit, fmt(t["peer_value"], digits), unit,
            fmt_ratio(t["ratio"]), ", ".join(fmt_ratio(x) for x in t.get("round_ratios") or []),
            t["target"], met_str(t["met"])))
    return L


README_BEGIN = "<!-- make bench: begin (written by bench/bench.py) -->"
README_END = "<!-- make bench: end -->"


def update_readme(path, res):
    """Replace the block between the README's markers with this run's summary."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "README not found: " + path
    b, e = text.find(README_BEGIN), text.find(README_END)
    if b < 0 or e < b:
        return "no make bench markers in " + path
    m, cfg = res["machine"], res["config"]
    L = [README_BEGIN, "",
         "Latest run: %s, git %s; %s, %s cores, %s, kernel %s; load average %.2f at start; "
         "%s, %d rounds (medians) of %g s runs. ours = libexs over the tcp provider; "
         "peers: kernel TCP (blast `--transport tcp`) and UCX %s over TCP (`ucx_perftest`)." % (
             m["date"], m["git"], m["cpu"], m["cores"], m["os"], m["kernel"],
             m["loadavg_start"], "BENCH_QUICK" if cfg["quick"] else "full run", cfg["rounds"],
             cfg["run_secs"], m["ucx"].replace("Version ", "")), ""]
    L += target_table(res)
    if res.get("other_targets"):
        L += ["", "The same against the other kernel baselines (not the issue's; see "
              "`bench/results.md`):", ""] + target_table(res, "other_targets")
    cg = res.get("callgrind") or {}
    if cg:
        L += ["", "Instructions per message (callgrind, both processes): " + "; ".join(
            "%s %s Ir" % (size_name(int(z)), fmt(cg[z]["ir_per_msg_total"], 0))
            for z in sorted(cg, key=int)) + "."]
    sc = res.get("syscalls") or {}
    if sc:
        L += ["", "System calls per message (strace, both processes): " + "; ".join(
            "%s %.1f (futex %.1f)" % (size_name(int(z)), sc[z]["per_msg_total"],
                                      sc[z]["per_msg"].get("futex", 0))
            for z in sorted(sc, key=int)) + "."]
    if res.get("base"):
        L += ["", "Against the base build %s (`make bench BENCH_BASE=...`: the same tree, "
              "measured in the same rounds): %s." % (res["base"]["name"],
                                                      base_tally(res["base"]["figures"]))]
    L += ["", "Every size, each round's value (the machine is shared and noisy: check them before "
          "reading a ratio), the hot spots and the commands: `bench/results.md`.", "",
          README_END]
    with open(path, "w") as f:
        f.write(text[:b] + "\n".join(L) + text[e + len(README_END):])
    return None


def systems_of(summary, kind):
    """The systems of a summary in table order: the fixed ones, then the base's."""
    sect, fixed = (summary["latency"], LAT_SYSTEMS) if kind == "lat" else (summary["stream"],
                                                                          BW_SYSTEMS)
    names = [n for n, _ in fixed]
    names += [BASE_PREFIX + n for n in names if BASE_PREFIX + n in sect]
    return [(n, sect[n]["description"]) for n in names if n in sect]


def base_ratio(summary, kind, size, system, key):
    """ours / base of a figure for a libexs system measured with the base too, else None."""
    sect = summary["latency" if kind == "lat" else "stream"]
    if system.startswith(BASE_PREFIX) or BASE_PREFIX + system not in sect:
        return None
    return ratio(figure(summary, kind, size, system, key),
                 figure(summary, kind, size, BASE_PREFIX + system, key))


def base_tally(figs):
    """One line: how many of the measured figures are within noise, and the others."""
    judged = [f for f in figs if f["verdict"]]
    inside = [f for f in judged if f["verdict"] == "within noise"]
    if judged:
        out = ["%d of %d figures within noise" % (len(inside), len(judged))]
    else:
        out = ["no verdicts (the noise of a figure needs two rounds or more)"]
    for f in judged:
        if f["verdict"] != "within noise":
            out.append("%s %s %s %s: %s (ratio %s, noise %s)" % (
                f["workload"], size_name(f["size"]), f["system"], f["figure"], f["verdict"],
                fmt_ratio(f["ratio"]), fmt_pct(f["noise"])))
    cg = [f for f in figs if f["workload"] == "callgrind" and f["system"] == "total"]
    for f in cg:
        out.append("callgrind %s Ir/msg ours/base %s" % (size_name(f["size"]),
                                                        fmt_ratio(f["ratio"])))
    return "; ".join(out)


def fmt_pct(v):
    return "n/a" if v is None else "%.0f%%" % (100 * v)


def base_section(res):
    """results.md's comparison with the base build (ours / base per figure)."""
    base, s = res["base"], res["summary"]
    L = ["## Against the base build (%s)" % base["name"], "",
         "The base is `%s`, measured as one more system in the same rounds, next to ours "
         "(after it in odd rounds, before it in even ones; rows `base (...)` of the tables "
         "above). ours / base per figure; noise = the "
         "larger (largest - smallest) / median of the two systems' rounds; \"within noise\" "
         "when |ours / base - 1| <= noise. Latency: lower is better; msg/s and Gbit/s: "
         "higher is better. Summary: %s." % (base["blast"], base_tally(base["figures"])), "",
         "| workload | size | system | figure | ours | base | ours / base | noise | verdict "
         "| ours each round | base each round |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in base["figures"]:
        if f["workload"] == "callgrind":
            continue
        kind = "lat" if f["workload"] == "latency" else "bw"
        sect = s["latency" if kind == "lat" else "stream"]
        digits = 0 if f["figure"] == "msgs_per_sec" else 2 if f["figure"] == "gbps" else 1
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            f["workload"], size_name(f["size"]), f["system"], f["figure"],
            fmt(f["ours"], digits), fmt(f["base"], digits), fmt_ratio(f["ratio"]),
            fmt_pct(f["noise"]), f["verdict"] or "n/a",
            each_round(sect[f["system"]]["sizes"][str(f["size"])]["runs"], f["figure"], digits),
            each_round(sect[BASE_PREFIX + f["system"]]["sizes"][str(f["size"])]["runs"],
                       f["figure"], digits)))
    cg = [f for f in base["figures"] if f["workload"] == "callgrind"]
    L.append("")
    if cg:
        L.append("Instructions per message (callgrind, measured as in the section below, for "
                 "both builds): they do not move with the machine's load, so a difference here "
                 "is the code's (up to the idle loops of the library's threads).")
        L.append("")
        L.append("| size | side | ours Ir/msg | base Ir/msg | ours / base |")
        L.append("| --- | --- | --- | --- | --- |")
        for f in cg:
            L.append("| %s | %s | %s | %s | %s |" % (size_name(f["size"]), f["system"],
                                                   fmt(f["ours"], 0), fmt(f["base"], 0),
                                                   fmt_ratio(f["ratio"])))
    else:
        L.append("Instructions per message of the base: not measured in this run.")
    L.append("")
    return L


def write_md(path, res):
    m, cfg, s = res["machine"], res["config"], res["summary"]
    has_base = bool(res.get("base"))
    L = []
    L.append("# libexs benchmarks")
    L.append("")
    L.append("Written by `make bench` (bench/bench.py); do not edit by hand. The README quotes "
             "the summary.")
    L.append("")
    L.append("| machine | |")
    L.append("| --- | --- |")
    L.append("| CPU | %s, %s cores |" % (m["cpu"], m["cores"]))
    L.append("| system | %s, kernel %s |" % (m["os"], m["kernel"]))
    L.append("| date | %s |" % m["date"])
    L.append("| git | %s (%s) |" % (m["git"], m["branch"]))
    L.append("| library | last change to exs/ and include/: %s |" % m.get("library", "?"))
    L.append("| UCX | %s |" % m["ucx"])
    L.append("| load average (1 min) | %.2f at start, %.2f at end |" % (m["loadavg_start"],
                                                                        m["loadavg_end"]))
    L.append("| run | %s: %d rounds, round-robin across the systems, medians; runs of about "
             "%g s; %d s in all |" % ("BENCH_QUICK" if cfg["quick"] else "full",
                                      cfg["rounds"], cfg["run_secs"], res["elapsed_s"]))
    L.append("")
    L.append("Everything runs on loopback on this machine: both ends, the library's threads and "
             "the kernel share the cores, so figures move with the machine's load (above); the "
             "tables give each round's value next to the median. Blocking ping-pongs were seen "
             "to be bimodal on this machine (kernel TCP at 64 B: about 5 us in some runs, "
             "about 60 us in others of the same make bench, with other jobs running).")
    L.append("")
    L.append("## Targets (issue 11, \"Done when\")")
    L.append("")
    L += target_table(res)
    L.append("")
    L.append("The issue's kernel TCP baseline is blast `--transport tcp`. Its stream runs use as "
             "many buffers as libexs's run has operations outstanding (16 send buffers, 32 "
             "receive buffers, each message or read into the next), so both touch the same "
             "memory; until 2026-11-24 blast reused one buffer per side, which stays in the "
             "CPU cache at 64 KiB and 1 MiB. Its ping-pong blocks in `read`. The same "
             "comparisons against kernel TCP reusing one buffer, and against kernel TCP "
             "busy-polling (non-blocking reads in a loop at both ends), which is slower than "
             "blocking on this virtual machine:")
    L.append("")
    L += target_table(res, "other_targets")
    if res.get("shm_targets"):
        L += ["", "Same host (issue 28): the shm provider against UCX's shared memory "
              "(`UCX_TLS=sm,self`). `ucx_perftest -t stream_bw` sends from one buffer and "
              "receives into one, the same at every message (cache-hot); the 1 MiB target "
              "compares libexs doing the same (blast `--one-buffer`, since session 26); the "
              "row after it is blast's own workload (16 send and 32 receive buffers in turn, "
              "48 MiB, more than the 32 MiB L3: cache-cold), the figure compared before:",
              ""] + target_table(res, "shm_targets")
    fi = res.get("libfabric_shm")
    if fi:
        L += ["", "libfabric shm (`fi_pingpong -p shm -e rdm -S 64 -I 200`): " + (
            "mean round trip %.1f us (no percentiles)" % fi["mean_us"] if "mean_us" in fi
            else fi.get("error", "not measured"))]
    L.append("")
    L.append("## SOCK_SEQPACKET ping-pong round trip (us)")
    L.append("")
    L.append("One connection, one message each way; p50 / p99 / mean of the round trip, median "
             "over the rounds. UCX's `tag_lat` prints half the round trip; it is doubled here "
             "(its p99 comes from a second run with `-R 99`).")
    L.append("")
    L.append("| size | system | p50 | p99 | mean | p50 / kernel TCP | p50 / UCX tag_lat "
             + ("| p50 / base " if has_base else "") + "| p50 of each round |")
    L.append("| --- " * (9 if has_base else 8) + "|")
    for size in SIZES:
        k = figure(s, "lat", size, "kernel_tcp", "p50_us")
        u = figure(s, "lat", size, "ucx_tag_lat", "p50_us")
        for system, desc in systems_of(s, "lat"):
            f = s["latency"][system]["sizes"][str(size)]
            br = base_ratio(s, "lat", size, system, "p50_us")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s%s |" % (
                size_name(size), desc, fmt(f["p50_us"]), fmt(f["p99_us"]), fmt(f["mean_us"]),
                fmt_ratio(ratio(f["p50_us"], k)), fmt_ratio(ratio(f["p50_us"], u)),
                (fmt_ratio(br) + " | ") if has_base else "",
                each_round(f["runs"], "p50_us", 1)))
    L.append("")
    L.append("## SOCK_STREAM sends, %d outstanding (%d receives)" % (SENDS, RECVS))
    L.append("")
    L.append("Messages/s and Gbit/s (10^9 bit/s) at the sender, median over the rounds. libexs "
             "runs the dynamic protocol below 64 KiB and direct-only (`--mode direct`) from "
             "64 KiB. UCX: `-O %d` outstanding sends." % SENDS)
    L.append("")
    L.append("| size | system | msg/s | Gbit/s | / kernel TCP | / UCX stream_bw | / UCX tag_bw "
             + ("| / base " if has_base else "") + "| msg/s of each round |")
    L.append("| --- " * (9 if has_base else 8) + "|")
    for size in SIZES:
        peers = [figure(s, "bw", size, p, "msgs_per_sec")
                 for p in ("kernel_tcp", "ucx_stream_bw", "ucx_tag_bw")]
        for system, desc in systems_of(s, "bw"):
            f = s["stream"][system]["sizes"][str(size)]
            br = base_ratio(s, "bw", size, system, "msgs_per_sec")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s%s |" % (
                size_name(size), desc, fmt(f["msgs_per_sec"]), fmt(f["gbps"], 2),
                *[fmt_ratio(ratio(f["msgs_per_sec"], p)) for p in peers],
                (fmt_ratio(br) + " | ") if has_base else "",
                each_round(f["runs"], "msgs_per_sec", 0)))
    L.append("")
    if has_base:
        L += base_section(res)
    L.append("## Instructions per message (callgrind)")
    L.append("")
    cg = res.get("callgrind")
    if not cg:
        L.append("Not measured in this run (%s)." % (
            "BENCH_CALLGRIND=0" if not cfg["callgrind"] else "see the errors below"))
    else:
        L.append("`blast --loopback` over the tcp provider under `valgrind --tool=callgrind`, "
                 "SOCK_STREAM, %d sends / %d receives outstanding, run twice with a fixed "
                 "message count (`--bytes`); Ir per message = the difference of the two runs' "
                 "instruction counts / the difference of their message counts (start-up, "
                 "connection and teardown cancel out). Every thread of each process counts "
                 "(the provider's and the engine's threads too); the count does not depend on "
                 "timing except for the idle loops of those threads. User space only: the "
                 "kernel's share (system calls, the loopback copies) is not in these counts."
                 % (SENDS, RECVS))
        L.append("")
        L.append("| size | mode | messages | Ir/msg sender | Ir/msg receiver | Ir/msg both |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for size in sorted(cg, key=int):
            c = cg[size]
            L.append("| %s | %s | %d, %d | %s | %s | %s |" % (
                size_name(int(size)), c["mode"], c["counts"][0], c["counts"][1],
                fmt(c["ir_per_msg_sender"], 0), fmt(c["ir_per_msg_receiver"], 0),
                fmt(c["ir_per_msg_total"], 0)))
        for size in sorted(cg, key=int):
            c = cg[size]
            L.append("")
            L.append("Hot spots, %s (self Ir per message, both processes; share of the total):"
                     % size_name(int(size)))
            L.append("")
            L.append("| function | Ir/msg | share |")
            L.append("| --- | --- | --- |")
            for h in c["hotspots"]:
                L.append("| `%s` | %s | %.1f%% |" % (h["function"], fmt(h["ir_per_msg"], 0),
                                                    100 * h["share"]))
    sc = res.get("syscalls")
    if sc:
        L.append("")
        L.append("## System calls per message (strace)")
        L.append("")
        L.append("The same two runs under `strace -f -c` (both processes, every thread): the "
                 "difference of the calls / the difference of the messages. strace slows "
                 "every call down, which changes how much each wake-up finds to do: the counts "
                 "show the mechanism (wake-ups, event notifications, polls), not exact rates.")
        L.append("")
        L.append("| size | mode | messages | calls/msg | per system call |")
        L.append("| --- | --- | --- | --- | --- |")
        for size in sorted(sc, key=int):
            c = sc[size]
            L.append("| %s | %s | %d, %d | %.2f | %s |" % (
                size_name(int(size)), c["mode"], c["counts"][0], c["counts"][1],
                c["per_msg_total"], ", ".join("%s %.2f" % (k, v)
                                               for k, v in list(c["per_msg"].items())[:10])))
    if res["errors"]:
        L.append("")
        L.append("## Errors")
        L.append("")
        for e in res["errors"]:
            L.append("- " + e.replace("\n", " "))
    L.append("")
    L.append("## How")
    L.append("")
    L.append("`make bench` (bench/run.sh; `BENCH_QUICK=1` for the short version, "
             "`BENCH_CALLGRIND=0` without callgrind). Each round measures every size and "
             "every system once, in this order; the figures are the medians of the rounds "
             "(`results.json` keeps each round's value). Commands (EXS_PROVIDER=tcp; "
             "UCX_TLS=tcp UCX_NET_DEVICES=lo):")
    L.append("")
    L.append("- libexs ping-pong: `blast --loopback --type seqpacket --lat-only --lat-size S "
             "--lat-iters N [--poll [--poll-recv]]`; the targets' busy-polling figure is "
             "both ends polling (`--poll --poll-recv`), as UCX's `tag_lat` does")
    L.append("- kernel TCP ping-pong: the same with `--transport tcp`")
    L.append("- UCX ping-pong: `ucx_perftest 127.0.0.1 -t tag_lat -s S -n N` (server: "
             "`ucx_perftest`)")
    L.append("- libexs stream: `blast --loopback --type stream --sends 16 --recvs 32 --size S "
             "--mode dynamic|direct --runs 1 --time T`")
    L.append("- kernel TCP stream: the same with `--transport tcp` (`--tcp-one-buffer`: one "
             "buffer per side)")
    L.append("- UCX stream: `ucx_perftest 127.0.0.1 -t stream_bw|tag_bw -s S -n N -O 16`")
    L.append("- same host: the libexs commands with `EXS_PROVIDER=shm` (`exs_shm_1buf`: "
             "`--one-buffer`, one send and one receive buffer reused, as `ucx_perftest`'s), "
             "UCX's with `UCX_TLS=sm,self`")
    if res.get("base"):
        L.append("- base (`make bench BENCH_BASE=...`): the libexs commands above with `%s`"
                 % res["base"]["blast"])
    L.append("")
    L.append("N is chosen from the previous round so that each run lasts about T seconds.")
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


PLOT_NAMES = {"exs": "libexs", "kernel_tcp": "kernel TCP", "ucx_stream_bw": "UCX stream_bw",
              "ucx_tag_bw": "UCX tag_bw", "exs_notify": "libexs, blocking",
              "exs_poll": "libexs, --poll --poll-recv",
              "exs_poll_send": "libexs, --poll (sender)", "ucx_tag_lat": "UCX tag_lat",
              "kernel_tcp_poll": "kernel TCP, busy polling",
              "kernel_tcp_1buf": "kernel TCP, one buffer", "exs_shm": "libexs over shm",
              "exs_shm_1buf": "libexs over shm, one buffer",
              "exs_shm_poll": "libexs over shm, --poll --poll-recv",
              "ucx_sm_tag_lat": "UCX sm tag_lat", "ucx_sm_stream_bw": "UCX sm stream_bw"}


def yrange(vals):
    """A log axis that shows every bar: from half the smallest value to twice the largest."""
    vals = [v for v in vals if v]
    return "[%g:%g]" % (min(vals) / 2, max(vals) * 2) if vals else "[*:*]"


def write_plot(path, res, tmpdir):
    if not shutil.which("gnuplot"):
        return "gnuplot not installed"
    s = res["summary"]
    # the systems measured (the self test's tiny run leaves the same-host ones out)
    bw_all = [(n, d) for n, d in BW_SYSTEMS if n in s["stream"]]
    lat_all = [(n, d) for n, d in LAT_SYSTEMS if n in s["latency"]]
    bw_r = yrange([figure(s, "bw", z, n, "gbps") for z in SIZES for n, _ in bw_all])
    lat_r = yrange([figure(s, "lat", z, n, "p50_us") for z in SIZES for n, _ in lat_all])
    # gnuplot refuses a histogram column without a single number: such systems are left out
    bw_sys = [n for n, _ in bw_all if any(figure(s, "bw", z, n, "gbps") for z in SIZES)]
    lat_sys = [n for n, _ in lat_all
               if any(figure(s, "lat", z, n, "p50_us") for z in SIZES)]
    if not bw_sys or not lat_sys:
        return "nothing measured to plot"
    bwdat = os.path.join(tmpdir, "bw.dat")
    latdat = os.path.join(tmpdir, "lat.dat")
    with open(bwdat, "w") as f:
        f.write("size " + " ".join('"%s"' % PLOT_NAMES[n] for n in bw_sys) + "\n")
        for size in SIZES:
            vals = [figure(s, "bw", size, n, "gbps") for n in bw_sys]
            f.write('"%s" ' % size_name(size) +
                    " ".join("%g" % v if v else "NaN" for v in vals) + "\n")
    with open(latdat, "w") as f:
        f.write("size " + " ".join('"%s"' % PLOT_NAMES[n] for n in lat_sys) + "\n")
        for size in SIZES:
            vals = [figure(s, "lat", size, n, "p50_us") for n in lat_sys]
            f.write('"%s" ' % size_name(size) +
                    " ".join("%g" % v if v else "NaN" for v in vals) + "\n")
    gp = """set terminal pngcairo size 1400,560 font ",10" noenhanced
set output '%s'
set multiplot layout 1,2 title "libexs vs kernel TCP vs UCX over TCP (loopback, %s, %s)"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top left
set grid ytics
set logscale y
set title "SOCK_STREAM throughput, 16 sends outstanding (median)"
set ylabel "Gbit/s"
set yrange %s
plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)
set title "ping-pong round trip p50 (median)"
set ylabel "microseconds"
set yrange %s
plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)
unset multiplot
""" % (path, res["machine"]["date"], res["machine"]["git"], bw_r, len(bw_sys) + 1, bwdat,
       lat_r, len(lat_sys) + 1, latdat)
    p = subprocess.run(["gnuplot"], input=gp, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if p.returncode != 0:
        return "gnuplot failed: " + p.stderr.strip()[-300:]
    return None


def config_from_env():
    e = os.environ
    quick = e.get("BENCH_QUICK", "0") not in ("", "0")
    tiny = e.get("BENCH_TINY", "0") not in ("", "0")
    cfg = {
        "quick": quick or tiny, "tiny": tiny,
        "rounds": int(e.get("BENCH_ROUNDS", "3")),
        "run_secs": float(e.get("BENCH_SECS", "0.1" if tiny else "0.3" if quick else "2")),
        "callgrind": e.get("BENCH_CALLGRIND", "1") not in ("", "0"),
        "strace": e.get("BENCH_STRACE", "1") not in ("", "0"),
        "blast": e.get("BENCH_BLAST", "build/blast/blast"),
        "base_blast": e.get("BENCH_BASE_BLAST") or None,
        "out": e.get("BENCH_OUT", "bench"),
        "quiet": e.get("BENCH_QUIET", "0") not in ("", "0"),
        "timeout": 120, "callgrind_timeout": 600, "hotspots": 12,
        "lat_iters_guess": 200 if tiny else 1000, "lat_iters_min": 50 if tiny else 200,
        "bw_bytes_guess": (16 if tiny else 64) << 20, "bw_iters_min": 100 if tiny else 1000,
    }
    cfg["base_name"] = (e.get("BENCH_BASE_NAME") or cfg["base_blast"]) if cfg["base_blast"] \
        else None
    if tiny:
        # 64 KiB: each message makes system calls and runs the library's per-message
        # path, so the marginal figures of a tiny run stand above its time-driven noise
        # (at 64 B the send buffer gathers hundreds of messages per system call)
        cfg["cg_counts"] = {65536: (20, 220)}
    elif quick:
        cfg["cg_counts"] = {64: (500, 1500), 65536: (50, 150)}
    else:
        cfg["cg_counts"] = {64: (2000, 8000), 65536: (200, 800)}
    return cfg


def render(out):
    """Rewrite results.md, results.png (and the README block for bench/) from results.json."""
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    with tempfile.TemporaryDirectory(prefix="exs-bench-plot.") as tmp:
        err = write_plot(os.path.join(out, "results.png"), res, tmp)
    if err:
        print("bench: " + err, file=sys.stderr)
    write_md(os.path.join(out, "results.md"), res)
    if os.path.abspath(out) == os.path.abspath("bench") and not res["config"].get("tiny"):
        err = update_readme("README.md", res) or err
        if err:
            print("bench: " + err, file=sys.stderr)
    return 1 if err else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        return render(sys.argv[2])
    if len(sys.argv) > 1:
        print("usage: bench.py                 measure (configured by the environment: see "
              "bench/run.sh)\n"
              "       bench.py --render DIR    rewrite DIR/results.md and results.png from "
              "DIR/results.json", file=sys.stderr)
        return 2
    cfg = config_from_env()
    root = os.getcwd()
    for k in ("blast", "base_blast"):
        if cfg[k] and not os.access(cfg[k], os.X_OK):
            print("bench: no blast binary at %s (run make first)" % cfg[k], file=sys.stderr)
            return 1
    b = Bench(cfg)
    t0 = time.monotonic()
    res = {"tool": "libexs make bench", "version": 1, "machine": machine(root),
           "config": {k: v for k, v in cfg.items() if k != "cg_counts"},
           "sizes": SIZES, "sends": SENDS, "recvs": RECVS}
    lat, bw = b.measure()
    res["summary"] = summarize(lat, bw, b.lat_systems, b.bw_systems)
    res["targets"] = targets(res["summary"])
    res["other_targets"] = targets(res["summary"], OTHER_TARGETS)
    if "exs_shm" in res["summary"]["stream"]:
        res["shm_targets"] = targets(res["summary"], SHM_TARGETS)
    # libfabric's shm beside them, one figure (not in the rounds: fi_pingpong gives only a
    # mean, and here takes milliseconds per transfer); its failure is a note, not an error
    if not cfg["tiny"]:
        v, err = fi_pingpong(64, 200, 60)
        res["libfabric_shm"] = v if v else {"error": err}
    res["ratios"] = ratios(res["summary"])
    res["callgrind"] = {str(k): v for k, v in (b.callgrind() or {}).items()} \
        if cfg["callgrind"] else None
    if cfg["base_blast"]:
        cgb = {str(k): v for k, v in (b.callgrind(base=True) or {}).items()} \
            if cfg["callgrind"] else None
        res["base"] = {"name": cfg["base_name"], "blast": cfg["base_blast"],
                       "callgrind": cgb,
                       "figures": base_compare(res["summary"], res["callgrind"], cgb)}
    res["syscalls"] = {str(k): v for k, v in (b.syscalls() or {}).items()} \
        if cfg["strace"] else None
    res["machine"]["loadavg_end"] = os.getloadavg()[0]
    res["elapsed_s"] = int(time.monotonic() - t0)
    res["errors"] = b.errors
    os.makedirs(cfg["out"], exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exs-bench-plot.") as tmp:
        err = write_plot(os.path.join(cfg["out"], "results.png"), res, tmp)
    if err:
        res["errors"].append("plot: " + err)
    with open(os.path.join(cfg["out"], "results.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    write_md(os.path.join(cfg["out"], "results.md"), res)
    if os.path.abspath(cfg["out"]) == os.path.abspath("bench") and not cfg["tiny"]:
        err = update_readme("README.md", res)  # the committed results: the README quotes them
        if err:
            print("bench: " + err, file=sys.stderr)
    for t in res["targets"]:
        print("bench: %-52s ours/peer %-6s target %-6s %s" % (
            t["what"], fmt_ratio(t["ratio"]), t["target"], met_str(t["met"]).strip("*")))
    if res.get("base"):
        print("bench: against the base (%s): %s" % (res["base"]["name"],
                                                    base_tally(res["base"]["figures"])))
    print("bench: %s/results.md, results.json, results.png (%d s)%s" % (
        cfg["out"], res["elapsed_s"],
        "; %d error(s): see results.md" % len(b.errors) if b.errors else ""))
    return 1 if b.errors else 0


if __name__ == "__main__":
    sys.exit(main())
