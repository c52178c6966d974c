#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Unit tests of bench/bench.py's pure parts: callgrind parsing, Ir per message, medians,
target verdicts, and that failed measurements are recorded as errors, not as figures."""
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

ANNOTATE = """--------------------------------------------------------------------------------
Profile data file 'cg.1' (creator: callgrind-3.19.0)
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                file:function
--------------------------------------------------------------------------------
400,000 (40.00%)  ./nptl/pthread_mutex_lock.c:pthread_mutex_lock@@GLIBC_2.2.5 [/lib/libc.so.6]
 90,000 ( 9.00%)  exs/proto/stream.c:st_send_progress_locked [/x/blast]
 10,000 ( 1.00%)  ./elf/other.h:st_send_progress_locked
  5,000 ( 0.50%)  ???:0x000000000001f2a0 [/lib/libev.so.4]

--------------------------------------------------------------------------------
-- Auto-annotated source: exs/proto/stream.c
--------------------------------------------------------------------------------
123,456  int x;
"""



def rxe_results_of(lines):
    """bench/rxe_results.py's output for a log of these lines."""
    import subprocess

    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write("".join(ln + "\n" for ln in lines))
    try:
        return subprocess.run([sys.executable, os.path.join(os.path.dirname(
                               os.path.abspath(__file__)), "rxe_results.py"), f.name],
                              check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)

class Parse(unittest.TestCase):
    def test_annotate(self):
        total, fns = bench.parse_annotate(ANNOTATE)
        self.assertEqual(total, 1000000)
        self.assertEqual(fns["pthread_mutex_lock@@GLIBC_2.2.5"], 400000)
        # the same function from two files is one entry; source annotation is not a function
        self.assertEqual(fns["st_send_progress_locked"], 100000)
        self.assertIn("0x000000000001f2a0", fns)
        self.assertEqual(len(fns), 3)

    def test_annotate_without_totals(self):
        with self.assertRaises(ValueError):
            bench.parse_annotate("nothing here\n")

    def test_ir_per_message(self):
        a = {"sender": {"total": 1000, "fns": {"f": 600, "g": 400}},
             "receiver": {"total": 500, "fns": {"f": 500}}}
        b = {"sender": {"total": 3000, "fns": {"f": 1600, "g": 1400}},
             "receiver": {"total": 1500, "fns": {"f": 1000, "h": 500}}}
        r = bench.ir_per_message(a, b, 10, 2)
        self.assertEqual(r["ir_per_msg_sender"], 200)
        self.assertEqual(r["ir_per_msg_receiver"], 100)
        self.assertEqual(r["ir_per_msg_total"], 300)
        # f: (1000 + 500) / 10 = 150 per message, half the total; then g: 100
        self.assertEqual([h["function"] for h in r["hotspots"]], ["f", "g"])
        self.assertEqual(r["hotspots"][0]["ir_per_msg"], 150)
        self.assertAlmostEqual(r["hotspots"][0]["share"], 0.5)


STRACE = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 27.07    0.110376          16      6609      1057 futex
 17.47    0.071206          39      1802           epoll_wait
  5.48    0.022323          11      1936           write
------ ----------- ----------- --------- --------- ----------------
100.00    0.407704          23     10347      1057 total
"""


class Strace(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(bench.parse_strace(STRACE),
                         {"futex": 6609, "epoll_wait": 1802, "write": 1936})

    def test_per_message(self):
        a = {"futex": 100, "write": 50, "close": 10}
        b = {"futex": 1100, "write": 550, "close": 10, "readv": 2000}
        r = bench.syscalls_per_message(a, b, 1000)
        # sorted by calls per message; what did not grow with the messages is left out
        self.assertEqual(list(r["per_msg"].items()),
                         [("readv", 2.0), ("futex", 1.0), ("write", 0.5)])
        self.assertEqual(r["per_msg_total"], 3.5)


def results_md(d, cfg, summary, errors, **extra):
    """results.md written into d for a run's summary (no callgrind); its text."""
    res = {"machine": bench.machine(d), "config": cfg, "summary": summary,
           "targets": bench.targets(summary), "callgrind": None, "errors": errors,
           "elapsed_s": 0}
    res.update(extra)
    res["machine"]["loadavg_end"] = 0.0
    bench.write_md(os.path.join(d, "results.md"), res)
    with open(os.path.join(d, "results.md")) as fh:
        return fh.read()


class BaseOptions(unittest.TestCase):
    def test_blast_has_option(self):
        """A base blast is asked for --wait-notify only when its --help names it (the
        exs_notify row compared a base's spinning default with ours sleeping otherwise)."""
        with tempfile.TemporaryDirectory() as d:
            for name, text, want in (("new", "  --wait-notify  every wait sleeps", True),
                                     ("old", "  --poll  busy polling", False)):
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write("#!/bin/sh\necho '%s'\n" % text)
                os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
                self.assertEqual(bench.blast_has_option(path, "--wait-notify"), want)
            self.assertFalse(bench.blast_has_option(os.path.join(d, "missing"), "--wait-notify"))


class Verdicts(unittest.TestCase):
    def test_median_skips_failed_runs(self):
        self.assertEqual(bench.median([{"x": 3}, None, {"x": 1}, {"x": 2}], "x"), 2)
        self.assertEqual(bench.median([{"x": 1}, {"x": 4}], "x"), 2.5)
        self.assertIsNone(bench.median([None, None], "x"))

    def test_target_sense(self):
        self.assertTrue(bench.target_met("max", 1.0, 1.0))
        self.assertFalse(bench.target_met("max", 1.01, 1.0))
        self.assertTrue(bench.target_met("min", 2.0, 2.0))
        self.assertFalse(bench.target_met("min", 1.99, 2.0))
        self.assertIsNone(bench.target_met("min", None, 2.0))

    def summary(self, f):
        lat = {s: {z: [f(s, z, "lat")] for z in bench.SIZES} for s, _ in bench.LAT_SYSTEMS}
        bw = {s: {z: [f(s, z, "bw")] for z in bench.SIZES} for s, _ in bench.BW_SYSTEMS}
        return bench.summarize(lat, bw)

    def test_targets(self):
        def f(system, size, kind):
            if kind == "lat":
                p50 = {"exs_notify": 30, "exs_poll": 10, "exs_poll_send": 15, "kernel_tcp": 20,
                       "kernel_tcp_poll": 8, "ucx_tag_lat": 4, "exs_shm_poll": 3,
                       "ucx_sm_tag_lat": 1}
                return {"p50_us": p50[system], "p99_us": 1, "mean_us": 1, "iters": 1}
            mps = {"exs": 100, "kernel_tcp": 1000, "kernel_tcp_1buf": 80, "ucx_stream_bw": 50,
                   "ucx_tag_bw": 60, "exs_shm": 200, "exs_shm_1buf": 85, "ucx_sm_stream_bw": 100}
            return {"msgs_per_sec": mps[system], "gbps": mps[system] / 100.0}
        t = {x["what"]: x for x in bench.targets(self.summary(f))}
        poll_k = t["64 B ping-pong p50, busy polling (both ends) vs kernel TCP"]
        self.assertEqual((poll_k["ratio"], poll_k["met"]), (0.5, True))
        poll_u = t["64 B ping-pong p50, busy polling (both ends) vs UCX tag_lat"]
        self.assertEqual((poll_u["ratio"], poll_u["met"]), (2.5, False))
        notify = t["64 B ping-pong p50, blocking waits vs kernel TCP"]
        self.assertEqual((notify["ratio"], notify["met"]), (1.5, True))
        ucx = t["64 B stream msg/s vs UCX stream_bw"]
        self.assertEqual((ucx["ratio"], ucx["met"]), (2.0, True))
        kern = t["64 B stream msg/s vs kernel TCP"]
        self.assertEqual((kern["ratio"], kern["met"]), (0.1, False))
        self.assertEqual(len(t), len(bench.TARGETS))
        o = {x["what"]: x for x in bench.targets(self.summary(f), bench.OTHER_TARGETS)}
        self.assertEqual(len(o), len(bench.OTHER_TARGETS))
        busy = o["64 B ping-pong p50, busy polling (both ends) vs kernel TCP busy polling"]
        self.assertEqual((busy["ratio"], busy["met"]), (1.25, False))
        hot = o["1 MiB stream Gbit/s (direct) vs kernel TCP, one buffer"]
        self.assertEqual((hot["ratio"], hot["met"]), (1.25, True))
        # shm at 1 MiB: the target like for like (one buffer per side, as ucx_perftest's),
        # blast's cache-cold workload against the same UCX figure in the row after it
        m = [x for x in bench.targets(self.summary(f), bench.SHM_TARGETS) if x["size"] == 1048576]
        self.assertEqual([(x["ours"], x["peer"]) for x in m],
                         [("exs_shm_1buf", "ucx_sm_stream_bw"), ("exs_shm", "ucx_sm_stream_bw")])
        self.assertEqual([(x["ratio"], x["met"]) for x in m], [(0.85, False), (2.0, True)])

    def test_round_ratios(self):
        """Each round's ours / peer pairs the two runs of that round (not the medians), a
        failed run gives None in its round, and the target table shows them beside the
        ratio of the medians, which alone judges the target."""
        lat = {s: {z: [None] * 3 for z in bench.SIZES} for s, _ in bench.LAT_SYSTEMS}
        bw = {s: {z: [None] * 3 for z in bench.SIZES} for s, _ in bench.BW_SYSTEMS}
        run = lambda p50: {"p50_us": p50, "p99_us": 1, "mean_us": 1, "iters": 1}
        lat["exs_shm_poll"][64] = [run(0.6), run(1.3), run(0.7)]
        lat["ucx_sm_tag_lat"][64] = [run(0.3), run(1.3), None]
        s = bench.summarize(lat, bw)
        t = [x for x in bench.targets(s, bench.SHM_TARGETS) if x["ours"] == "exs_shm_poll"][0]
        self.assertEqual(t["round_ratios"], [2.0, 1.0, None])
        self.assertAlmostEqual(t["ratio"], 0.7 / 0.8)  # the medians: 0.7 and 0.8
        row = [l for l in bench.target_table({"t": [t]}, "t") if "vs UCX sm" in l][0]
        self.assertIn("| 0.87 | 2.00, 1.00, n/a |", row)

    def test_failed_measurements_are_errors(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "blast")
            with open(fake, "w") as fh:
                fh.write("#!/bin/sh\necho 'blast: simulated failure' >&2\nexit 1\n")
            os.chmod(fake, stat.S_IRWXU)
            cfg = bench.config_from_env()
            cfg.update({"blast": fake, "rounds": 1, "quiet": True, "out": d})
            b = bench.Bench(cfg)
            b.have_ucx = False
            lat, bw = b.measure()
            n = len(bench.SIZES) * (len(bench.LAT_SYSTEMS) + len(bench.BW_SYSTEMS))
            self.assertEqual(len(b.errors), n)
            self.assertTrue(any("simulated failure" in e for e in b.errors))
            s = bench.summarize(lat, bw)
            self.assertTrue(all(t["ratio"] is None and t["met"] is None
                                for t in bench.targets(s)))
            md = results_md(d, cfg, s, b.errors)
            self.assertIn("## Errors", md)
            self.assertIn("| n/a |", md)


FAKE_BLAST = """#!/bin/sh
# a blast that answers every run with the same figures: p50 %(p50)s us, %(mps)s msg/s
echo '{"results": [{"latency_us": {"p50": %(p50)s, "p99": %(p50)s, "mean": %(p50)s, "count": 1},
  "messages_per_sec": %(mps)s, "throughput_gbps": 1, "cpu_send_pct": 0, "cpu_recv_pct": 0,
  "direct_ratio": 0}]}'
"""


class Base(unittest.TestCase):
    def test_systems_and_order(self):
        lat = bench.with_base(bench.LAT_SYSTEMS, bench.BASE_LAT, "B")
        names = [n for n, _ in lat]
        self.assertEqual(names, ["exs_notify", "base_exs_notify", "exs_poll", "base_exs_poll",
                                 "exs_poll_send", "base_exs_poll_send", "kernel_tcp",
                                 "kernel_tcp_poll", "ucx_tag_lat", "exs_shm_poll",
                                 "ucx_sm_tag_lat"])
        self.assertEqual(dict(lat)["base_exs_poll"],
                         "base (B): libexs, busy polling at both ends (--poll --poll-recv)")
        self.assertEqual(bench.with_base(bench.BW_SYSTEMS, bench.BASE_BW, None),
                         bench.BW_SYSTEMS)
        self.assertEqual(bench.round_order(lat, 0), lat)
        odd = [n for n, _ in bench.round_order(lat, 1)]
        self.assertEqual(odd, ["base_exs_notify", "exs_notify", "base_exs_poll", "exs_poll",
                               "base_exs_poll_send", "exs_poll_send", "kernel_tcp",
                               "kernel_tcp_poll", "ucx_tag_lat", "exs_shm_poll",
                               "ucx_sm_tag_lat"])

    def summary(self, ours, base):
        """Two rounds; ours(size, rnd) / base(size, rnd) give p50 and msg/s."""
        lsys = bench.with_base(bench.LAT_SYSTEMS, bench.BASE_LAT, "B")
        bsys = bench.with_base(bench.BW_SYSTEMS, bench.BASE_BW, "B")

        def f(system, size, rnd, kind):
            v = (base if system.startswith("base_") else ours)(size, rnd)
            if v is None:
                return None  # a failed run
            if kind == "lat":
                return {"p50_us": v, "p99_us": v, "mean_us": v, "iters": 1}
            return {"msgs_per_sec": v, "gbps": v / 1000.0}
        lat = {s: {z: [f(s, z, r, "lat") for r in (0, 1)] for z in bench.SIZES}
               for s, _ in lsys}
        bw = {s: {z: [f(s, z, r, "bw") for r in (0, 1)] for z in bench.SIZES} for s, _ in bsys}
        return bench.summarize(lat, bw, lsys, bsys)

    def test_compare(self):
        # ours: 100 and 110 in the two rounds (median 105, spread 10/105); base: 100 at 64 B
        # (within noise), 50 at 4 KiB (ours twice as large), 200 at 64 KiB, None at 1 MiB
        base_v = {64: 100, 4096: 50, 65536: 200, 1048576: None}
        s = self.summary(lambda z, r: 100 + 10 * r, lambda z, r: base_v[z])
        cg = {"64": {"ir_per_msg_sender": 1100, "ir_per_msg_receiver": 900,
                     "ir_per_msg_total": 2000}}
        cgb = {"64": {"ir_per_msg_sender": 1000, "ir_per_msg_receiver": 1000,
                      "ir_per_msg_total": 2000}}
        figs = bench.base_compare(s, cg, cgb)
        self.assertEqual(len(figs), len(bench.SIZES) * len(bench.BASE_FIGURES) + 3)
        by = {(f["workload"], f["size"], f["system"], f["figure"]): f for f in figs}
        f = by[("latency", 64, "exs_poll", "p50_us")]
        self.assertEqual((f["ours"], f["base"], f["ratio"]), (105, 100, 1.05))
        self.assertAlmostEqual(f["noise"], 10 / 105)
        self.assertEqual(f["verdict"], "within noise")
        # latency: lower is better; ours 105 against 50 is worse, against 200 better
        self.assertEqual(by[("latency", 4096, "exs_notify", "mean_us")]["verdict"], "ours worse")
        self.assertEqual(by[("latency", 65536, "exs_poll_send", "p99_us")]["verdict"],
                         "ours better")
        # msg/s: higher is better
        self.assertEqual(by[("stream", 4096, "exs", "msgs_per_sec")]["verdict"], "ours better")
        self.assertEqual(by[("stream", 65536, "exs", "gbps")]["verdict"], "ours worse")
        nobase = by[("stream", 1048576, "exs", "msgs_per_sec")]
        self.assertEqual((nobase["ratio"], nobase["verdict"]), (None, None))
        c = by[("callgrind", 64, "sender", "ir_per_msg_sender")]
        self.assertEqual((c["ours"], c["base"], c["ratio"]), (1100, 1000, 1.1))
        self.assertEqual(by[("callgrind", 64, "total", "ir_per_msg_total")]["ratio"], 1.0)
        tally = bench.base_tally(figs)
        self.assertTrue(tally.startswith("%d of %d figures within noise" % (
            len([x for x in figs if x["verdict"] == "within noise"]),
            len([x for x in figs if x["verdict"]]))), tally)
        self.assertIn("latency 4 KiB exs_notify mean_us: ours worse (ratio 2.10", tally)
        self.assertIn("callgrind 64 B Ir/msg ours/base 1.00", tally)
        # one round: no noise, no verdict
        self.assertIsNone(bench.spread([{"x": 1}, None], "x"))
        self.assertIsNone(bench.base_verdict(1.5, None, True))

    def test_base_blast_measured(self):
        """The base systems run the base's blast, ours run ours, in the same rounds; the
        tables and the comparison section show both and their ratio."""
        with tempfile.TemporaryDirectory() as d:
            blasts = {}
            for name, p50, mps in (("ours", 10, 1000), ("base", 20, 500)):
                blasts[name] = os.path.join(d, name)
                with open(blasts[name], "w") as fh:
                    fh.write(FAKE_BLAST % {"p50": p50, "mps": mps})
                os.chmod(blasts[name], stat.S_IRWXU)
            cfg = bench.config_from_env()
            cfg.update({"blast": blasts["ours"], "base_blast": blasts["base"],
                        "base_name": "TRACE=0", "rounds": 2, "quiet": True, "out": d})
            b = bench.Bench(cfg)
            b.have_ucx = False
            lat, bw = b.measure()
            for z in bench.SIZES:
                self.assertEqual([v["p50_us"] for v in lat["exs_poll"][z]], [10, 10])
                self.assertEqual([v["p50_us"] for v in lat["base_exs_poll"][z]], [20, 20])
                self.assertEqual([v["p50_us"] for v in lat["kernel_tcp"][z]], [10, 10])
                self.assertEqual([v["msgs_per_sec"] for v in bw["base_exs"][z]], [500, 500])
            self.assertNotIn("base_kernel_tcp", lat)
            # UCX is not installed here: those are the only errors
            self.assertTrue(b.errors and all("UCX" in e or "ucx" in e for e in b.errors))
            s = bench.summarize(lat, bw, b.lat_systems, b.bw_systems)
            figs = bench.base_compare(s)
            # the fake blasts print the same Gbit/s: equal, and within (no) noise
            self.assertTrue(all(f["ratio"] == (0.5 if f["workload"] == "latency" else 2.0)
                                and f["verdict"] == "ours better"
                                for f in figs if f["figure"] != "gbps"))
            gb = [f for f in figs if f["figure"] == "gbps"]
            self.assertEqual(len(gb), len(bench.SIZES))
            self.assertTrue(all(f["ratio"] == 1 and f["verdict"] == "within noise" for f in gb))
            md = results_md(d, cfg, s, b.errors, base={
                "name": "TRACE=0", "blast": blasts["base"], "callgrind": None, "figures": figs})
            self.assertIn("## Against the base build (TRACE=0)", md)
            self.assertIn("| p50 / base |", md)
            self.assertIn("| 64 B | base (TRACE=0): libexs, busy polling at both ends "
                          "(--poll --poll-recv) | 20.0 |", md)
            self.assertIn("| latency | 64 B | exs_poll | p50_us | 10.0 | 20.0 | 0.50 | 0% "
                          "| ours better | 10.0, 10.0 | 20.0, 20.0 |", md)
            self.assertIn("| 64 B | libexs (dynamic < 64 KiB, direct >= 64 KiB) | 1,000 |", md)
            self.assertIn("Summary: %d of %d figures within noise" % (len(gb), len(figs)), md)


class Plot(unittest.TestCase):
    def test_system_without_figures(self):
        if not bench.shutil.which("gnuplot"):
            self.skipTest("gnuplot not installed")

        def f(system, size, kind):
            if system.startswith("ucx"):
                return None  # UCX failed everywhere: its bars are left out, not an error
            if kind == "lat":
                return {"p50_us": 10, "p99_us": 1, "mean_us": 1, "iters": 1}
            return {"msgs_per_sec": 10, "gbps": 1}
        res = {"summary": Verdicts().summary(f), "machine": {"date": "D", "git": "G"}}
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "r.png")
            self.assertIsNone(bench.write_plot(png, res, d))
            with open(png, "rb") as fh:
                self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
            res["summary"] = Verdicts().summary(lambda *a: None)
            self.assertEqual(bench.write_plot(png, res, d), "nothing measured to plot")


class Readme(unittest.TestCase):
    def test_block_replaced(self):
        s = Verdicts().summary(lambda system, size, kind: (
            {"p50_us": 10, "p99_us": 1, "mean_us": 1, "iters": 1} if kind == "lat"
            else {"msgs_per_sec": 10, "gbps": 1}))
        res = {"machine": {"date": "D", "git": "G", "cpu": "C", "cores": 2, "os": "O",
                           "kernel": "K", "loadavg_start": 1.0, "ucx": "Version 1.13.1"},
               "config": {"quick": False, "rounds": 3, "run_secs": 2},
               "targets": bench.targets(s), "callgrind": None}
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "README.md")
            with open(p, "w") as fh:
                fh.write("head\n%s\nold table\n%s\ntail\n" % (bench.README_BEGIN,
                                                               bench.README_END))
            self.assertIsNone(bench.update_readme(p, res))
            with open(p) as fh:
                text = fh.read()
            self.assertTrue(text.startswith("head\n" + bench.README_BEGIN))
            self.assertTrue(text.endswith(bench.README_END + "\ntail\n"))
            self.assertNotIn("old table", text)
            self.assertIn("| 64 B stream msg/s vs kernel TCP | 10 msg/s | 10 msg/s | 1.00 |", text)
            self.assertNotIn("Against the base build", text)
            res["base"] = {"name": "TRACE=0", "figures": [
                {"workload": "latency", "size": 64, "system": "exs_poll", "figure": "p50_us",
                 "ratio": 1.01, "noise": 0.05, "verdict": "within noise"}]}
            with open(p, "w") as fh:
                fh.write("%s\n%s\n" % (bench.README_BEGIN, bench.README_END))
            self.assertIsNone(bench.update_readme(p, res))
            with open(p) as fh:
                self.assertIn("Against the base build TRACE=0 (`make bench BENCH_BASE=...`: the "
                              "same tree, measured in the same rounds): 1 of 1 figures within "
                              "noise.", fh.read())
            with open(p, "w") as fh:
                fh.write("no markers\n")
            self.assertIsNotNone(bench.update_readme(p, res))


class RxeAb(unittest.TestCase):
    """bench/rxe_ab_results.py: medians, ratios to the first build, counters per message."""

    LOG = """rxe-vm| AB round=1 label=base fig=busy value=100
AB round=1 label=this fig=busy value=50
AB round=2 label=this fig=busy value=70
AB round=2 label=base fig=busy value=300
ABFAIL round=2 label=this fig=msgs: boom
ABVS label=base fig=busy round=1 vstat pid=1 send_wrs=22 locks=440
ABVS label=this fig=busy round=1 vstat pid=2 send_wrs=22 locks=110
ABSYS label=this fig=busy msgs=22 total=55
ABSYSTOP label=this fig=busy call=futex count=7
AB done
"""

    def test_table(self):
        import subprocess
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(self.LOG)
        try:
            out = subprocess.run([sys.executable, os.path.join(os.path.dirname(
                os.path.abspath(__file__)), "rxe_ab_results.py"), f.name, "10", "k=v"],
                check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(f.name)
        self.assertIn("| k | v |", out)
        self.assertIn("| base | 200.0 | 1.00 | 100.0, 300.0 |", out)
        self.assertIn("| this | 60.0 | 0.30 | 50.0, 70.0 |", out)
        # 22 messages per run (2 x (10 + 1): blast's warm-up round trip counts too): sends
        # 1.00, locks 20.00 and 5.00
        self.assertIn("| busy | base | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 20.00 |", out)
        self.assertIn("| busy | this | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 5.00 |", out)
        self.assertIn("| busy | this | 22 | 55 | 2.5 | futex 7 |", out)
        self.assertIn("ABFAIL round=2 label=this fig=msgs: boom", out)

    ST_LOG = """AB round=1 label=base fig=gbps65536 value=0.2 msgs=100
AB round=1 label=ib_write_bw fig=gbps65536 value=0.4 msgs=200
AB round=1 label=this fig=gbps65536 value=0.3 msgs=100
AB round=2 label=this fig=gbps65536 value=0.5 msgs=300
AB round=2 label=ib_write_bw fig=gbps65536 value=0.4 msgs=250
AB round=2 label=base fig=gbps65536 value=0.4 msgs=300
ABVS label=this fig=gbps65536 round=1 vstat pid=3 post_send_calls=100 send_wrs=100 send_signaled=100
ABVS label=this fig=gbps65536 round=1 side=server vstat pid=4 post_send_calls=200 send_wrs=400
ABVS label=this fig=gbps65536 round=2 vstat pid=5 post_send_calls=300 send_wrs=300 send_signaled=30
ABVS label=ib_write_bw fig=gbps65536 round=1 vstat pid=6 post_send_calls=500 send_wrs=500 polled_cqes=50
ABFAIL round=2 label=ib_write_bw fig=gbps1048576: rc 0, row '1048576 0 0 0 0'
"""

    def test_stream_table(self):
        import subprocess
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(self.ST_LOG)
        try:
            out = subprocess.run([sys.executable, os.path.join(os.path.dirname(
                os.path.abspath(__file__)), "rxe_ab_results.py"), f.name, "10"],
                check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(f.name)
        self.assertIn("## 64 KiB STREAM throughput, direct (Gbit/s)", out)
        # medians 0.3 / 0.4 / 0.4; this/base per round 1.5 and 1.25: median 1.38 (1.375)
        self.assertIn("| base | 0.300 | 1.00 | - | 0.75 | 0.200, 0.400 |", out)
        self.assertIn("| this | 0.400 | 1.33 | 1.38 | 1.00 | 0.300, 0.500 |", out)
        self.assertIn("| ib_write_bw | 0.400 | 1.33 | 1.50 | 1.00 | 0.400, 0.400 |", out)
        # this: 400 messages (100 + 300), client 400 doorbells, 130 signaled; the server's
        # 200 doorbells and 400 sends over the same 400 messages; ib_write_bw per client WR
        self.assertIn("| this | client | 1.00 | 1.00 | 0.33 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |", out)
        self.assertIn("| this | server | 0.50 | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |", out)
        self.assertIn("| ib_write_bw | client | 1.00 | 1.00 | 0.00 | 0.00 | 0.00 | 0.10 | 0.00 | 0.00 |", out)
        self.assertIn("fig=gbps1048576: rc 0", out)

    def test_rxe_cg(self):
        """bench/rxe_cg_results.py: self costs per object from callgrind's compressed
        names (a call's inclusive cost line is not counted), per round trip from two runs; a
        run where blast's sort (percentile, cmp_double) was counted is named."""
        import base64
        import gzip
        import subprocess

        import rxe_cg_results as cg

        def cgfile(k, sort=""):
            return ("events: Ir\nob=(1) /guest/blast-this\nfl=(1) x.c\nfn=(1) exs_send\n"
                    f"10 {1100 * k}\ncob=(2) /lib/libc.so.6\ncfn=(2) memcpy\ncalls=1 0\n"
                    f"10 {999 * k}\nob=(2)\nfl=(2) y.c\nfn=(2)\n+2 {110 * k}\n"
                    + (f"ob=(1)\nfn=(3) {sort}\n5 {7 * k}\n" if sort else ""))

        per_ob, per_fn = cg.parse_cg(cgfile(1))
        self.assertEqual(per_ob, {"/guest/blast-this": 1100, "/lib/libc.so.6": 110})
        self.assertEqual(per_fn[("/lib/libc.so.6", "memcpy")], 110)
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            for n, k in ((100, 1), (1100, 11)):  # 1000 more round trips, x1.1 warm-up
                blob = base64.b64encode(gzip.compress(cgfile(k).encode())).decode()
                f.write(f"a| @@CG BEGIN libexs {n}\na| {blob}\na| @@CG END\n")
                for label, fn in (("sorted", "cmp_double"), ("sorted2", "percentile")):
                    blob = base64.b64encode(gzip.compress(cgfile(k, fn).encode())).decode()
                    f.write(f"a| @@CG BEGIN {label} {n}\na| {blob}\na| @@CG END\n")
            f.write("a| CGFAIL label=rsockets n=100: boom\n")
        try:
            out = subprocess.run([sys.executable, os.path.join(os.path.dirname(
                                  os.path.abspath(__file__)), "rxe_cg_results.py"),
                                  f.name, "k=v"], check=True, capture_output=True,
                                 text=True).stdout
        finally:
            os.unlink(f.name)
        # 1,000 more round trips (1,100 with blast's warm-up): 10 + 1 Ir per round trip
        self.assertIn("| client | Ir per round trip | libc | program (libexs is linked into "
                      "blast) | each pair |", out)
        self.assertIn("| libexs | 11 | 1 | 10 | 11 |", out)
        self.assertIn("| `exs_send` | blast-this | 10 |", out)
        self.assertIn("CGFAIL label=rsockets n=100: boom", out)
        self.assertIn("`percentile` or `cmp_double` has a cost in sorted (pair 1), sorted2 "
                      "(pair 1): their figures include blast's sort", out)


class RxeCgLocks(unittest.TestCase):
    def test_lock_addrs(self):
        """bench/rxe_cg_locks.py: lock-prefixed instructions and xchg with memory are
        locked; an xchg of two registers and a plain cmpxchg are not."""
        import rxe_cg_locks as lk

        text = ("0000000000001000 <f>:\n"
                "    1000:\tf0 0f b1 16          \tlock cmpxchg %edx,(%rsi)\n"
                "    1004:\t87 07                \txchg   %eax,(%rdi)\n"
                "    1006:\t87 c2                \txchg   %eax,%edx\n"
                "    1008:\t0f b1 16             \tcmpxchg %edx,(%rsi)\n"
                "    100b:\tf0 48 0f c1 07       \tlock xadd %rax,(%rdi)\n")
        self.assertEqual(lk.lock_addrs(text), {0x1000, 0x1004, 0x100b})

    def test_count_locked(self):
        """Executions of the locked addresses per (object, function), with callgrind's
        relative addresses and compressed names; a call's inclusive line is skipped."""
        import rxe_cg_locks as lk

        cg = ("positions: instr line\nevents: Ir\nob=(1) /guest/blast-this\nfl=(1) a.c\n"
              "fn=(1) f\n0x1000 3 7\n+4 4 7\n+2 5 7\ncob=(2) /lib/libc.so.6\ncfn=(2) g\n"
              "calls=7 0x2000\n+5 6 700\n* * 7\nob=(2)\nfn=(2)\n0x2000 0 9\n")
        locks = {"/guest/blast-this": {0x1000, 0x1004, 0x100b}, "/lib/libc.so.6": {0x2000}}
        got = lk.count_locked(cg, lambda ob: locks.get(ob, set()))
        # f: 0x1000 and 0x1004 (7 each), 0x100b after the call's line (7); g: 0x2000 (9)
        self.assertEqual(dict(got), {("/guest/blast-this", "f"): 21,
                                     ("/lib/libc.so.6", "g"): 9})


class HostLoad(unittest.TestCase):
    def test_annotate(self):
        """bench/rxe_hostload.py: a figure's line gets the host's CPU stall share since the
        previous figure's line; other lines pass unchanged; no PSI, no change."""
        import rxe_hostload

        psi = iter([0, 500000, 500000, 2500000])  # microseconds stalled, at each read
        clock = iter([0.0, 1.0, 3.0, 5.0])
        lines = ["BRINFO x\n", "BR round=1 sys=a fig=f size=1 value=2\n", "vstat pid=1\n",
                 "g| BR round=1 sys=b fig=f size=1 value=3\n", "BRFAIL round=1 sys=c\n",
                 "BR round=2 sys=a fig=f size=1 value=4\n"]
        out = list(rxe_hostload.annotate(lines, lambda: next(psi), lambda: next(clock)))
        self.assertEqual(out[0], lines[0])
        self.assertEqual(out[1], "BR round=1 sys=a fig=f size=1 value=2 hostcpu=0.50\n")
        self.assertEqual(out[2], lines[2])
        self.assertEqual(out[3], "g| BR round=1 sys=b fig=f size=1 value=3 hostcpu=0.00\n")
        self.assertEqual(out[4], lines[4])
        self.assertEqual(out[5], "BR round=2 sys=a fig=f size=1 value=4 hostcpu=1.00\n")
        self.assertEqual(list(rxe_hostload.annotate(lines[1:2], lambda: None)), lines[1:2])

    def test_results_mark_busy_rounds(self):
        """bench/rxe_results.py: a round measured on a busy host carries a *, and the mean
        pressure of each round is in the run table."""
        lines = []
        for r, v, h in ((1, 27.0, 0.1), (2, 34.0, 0.6), (3, 28.0, 0.2)):
            lines.append(f"BR round={r} sys=libexs fig=rtt_busy size=64 value={v} hostcpu={h}")
            lines.append(f"BR round={r} sys=rsockets fig=rtt_busy size=64 value=26 "
                         f"hostcpu={h + 0.1}")
        out = rxe_results_of(lines)
        self.assertIn("| 64 B | libexs verbs (blast) | 28.0 | 1.08 | 27.0, 34.0*, 28.0 |", out)
        self.assertIn("| 64 B | rsockets (rstream) | 26.0 | 1.00 | 26.0, 26.0*, 26.0* |", out)
        self.assertIn("| host CPU pressure (mean per figure) | round 1 0.15, round 2 0.65, "
                      "round 3 0.25 |", out)

    def test_results_stream_targets(self):
        """bench/rxe_results.py: the STREAM targets judge blast with both ends busy-polling
        (libexs_poll) as ib_write_bw's do, and show the library's default waits beside."""
        lines = []
        for r in (1, 2, 3):
            lines.append(f"BR round={r} sys=libexs fig=gbps size=65536 value=0.36")
            lines.append(f"BR round={r} sys=libexs_poll fig=gbps size=65536 value=0.39")
            lines.append(f"BR round={r} sys=ib_write_bw fig=gbps size=65536 value=0.40")
        out = rxe_results_of(lines)
        rows = [ln for ln in out.splitlines() if ln.startswith("| 64 KiB STREAM")]
        self.assertEqual(len(rows), 2)
        self.assertIn("busy-polling", rows[0])
        self.assertIn("| 0.390 | 0.400 | 0.97 | >= 0.95 | met |", rows[0])
        self.assertIn("default waits", rows[1])
        self.assertIn("| 0.360 | 0.400 | 0.90 | >= 0.95 | **not met** |", rows[1])
        self.assertIn("| 64 KiB | libexs verbs (blast --poll --poll-recv: both ends busy-poll) "
                      "| 0.390 | 0.97 |", out)

    def test_results_ib_write_bw_grain(self):
        """bench/rxe_results.py: ib_write_bw's iteration counts come in steps; the report
        gives the step (the counts' gcd) and its share of the median count per size."""
        lines = []
        for r, n in ((1, 176), (2, 192), (3, 208)):
            lines.append(f"BR round={r} sys=ib_write_bw fig=gbps size=1048576 value=0.4")
            lines.append(f"BRPT round={r} size=1048576 iters={n} window=4")
        for r, n in ((1, 1504), (2, 1552), (3, 1488)):
            lines.append(f"BRPT round={r} size=65536 iters={n} window=2")
        lines.append("BRPT round=4 size=65536 iters=0 window=2")  # a failed run: no count
        out = rxe_results_of(lines)
        grain = [ln for ln in out.splitlines() if ln.startswith("The grain of ib_write_bw")]
        self.assertEqual(len(grain), 1)
        # 64 KiB: gcd 16 of a median 1504 (1.1%), 16 x 64 KiB x 8 / 2 s = 0.0042 Gbit/s;
        # 1 MiB: gcd 16 of 192 (8.3%), 16 x 1 MiB x 8 / 4 s = 0.0336 Gbit/s
        self.assertIn("64 KiB: 16 iterations, 0.0042 Gbit/s, 1.1% of its median count", grain[0])
        self.assertIn("1 MiB: 16 iterations, 0.0336 Gbit/s, 8.3% of its median count", grain[0])
        self.assertNotIn("grain", rxe_results_of(lines[:1]))


if __name__ == "__main__":
    unittest.main()
