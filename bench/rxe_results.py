#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_results.py LOG [--meta K=V ...]: bench/results-rxe.md from the output of one make
bench-rxe guest run (bench/rxe-bench.sh: BR, BRFAIL, BRINFO, BRSYS, BRPERF and vstat lines).
Medians over the rounds; each round's value beside them."""
import math
import re
import statistics
import sys
from collections import defaultdict

SIZE_NAME = {64: "64 B", 4096: "4 KiB", 65536: "64 KiB", 1048576: "1 MiB"}
SYS_NAME = {
    "libexs": "libexs verbs (blast)",
    "rsockets": "rsockets (rstream)",
    "rstream": "rsockets (rstream)",
    "riostream": "rsockets iomap (riostream)",
    "ib_send_lat": "perftest ib_send_lat",
    "ib_write_lat": "perftest ib_write_lat",
    "ib_send_bw": "perftest ib_send_bw (-t 16)",
    "ib_write_bw": "perftest ib_write_bw",
    "libexs_notify": "libexs verbs (blast --wait-notify: every wait sleeps at once)",
    "libexs_poll": "libexs verbs (blast --poll --poll-recv: both ends busy-poll)",
    "ucx_tag_lat": "UCX rc_verbs tag_lat",
    "ucx_tag_bw": "UCX rc_verbs tag_bw",
}


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


# A figure measured while the host's tasks waited for a CPU this share of the time or more
# (bench/rxe_hostload.py's hostcpu=) is marked: its round trips likely waited for the host.
HOST_BUSY = 0.3


def parse(path):
    res = defaultdict(dict)  # (sys, fig, size) -> {round: value}
    host = defaultdict(dict)  # (sys, fig, size) -> {round: hostcpu}
    fails, info, sysc, systop, perf, vstat, pt = [], [], [], [], [], [], []
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\n")
        line = re.sub(r"^\S+\| ", "", line)
        if line.startswith("BR "):
            d = kv(line)
            try:
                key = (d["sys"], d["fig"], int(d["size"]))
                res[key][int(d["round"])] = float(d["value"])
                if "hostcpu" in d:
                    host[key][int(d["round"])] = float(d["hostcpu"])
            except (KeyError, ValueError):
                fails.append(line)
        elif line.startswith("BRFAIL"):
            fails.append(line[7:])
        elif line.startswith("BRINFO"):
            info.append(line[7:])
        elif line.startswith("BRSYSTOP"):
            systop.append(kv(line))
        elif line.startswith("BRSYS "):
            sysc.append(kv(line))
        elif line.startswith("BRPERF"):
            perf.append(kv(line))
        elif line.startswith("BRPT "):
            pt.append(kv(line))
        if "vstat pid=" in line:  # may follow another line's text without a newline
            vstat.append(kv(line[line.index("vstat pid="):]))
    return res, fails, info, sysc, systop, perf, vstat, host, pt


def pt_grain(pt):
    """ib_write_bw's duration mode reports the completions it polled in its window, and
    under rxe they come in batches: per size, the greatest common divisor of the rounds'
    iteration counts (the observed step), that step in Gbit/s over the window, and the
    step as a share of the median count. {size: (step, gbps, share)}."""
    by = defaultdict(list)
    for d in pt:
        try:
            n, s, win = int(d["iters"]), int(d["size"]), float(d["window"])
        except (KeyError, ValueError):
            continue
        if n > 0 and win > 0:
            by[(s, win)].append(n)
    out = {}
    for (s, win), ns in sorted(by.items()):
        g = 0
        for n in ns:
            g = math.gcd(g, n)
        out[s] = (g, g * s * 8 / win / 1e9, g / statistics.median(ns))
    return out


def med(d):
    return statistics.median(d.values()) if d else None


def fmt(v, fig):
    if v is None:
        return "-"
    if fig == "msgs":
        return f"{v:,.0f}"
    if fig == "gbps":
        return f"{v:.3f}"
    return f"{v:.1f}"


def rounds(d, fig, h=None):
    """Each round's value; "*" after one measured on a busy host (hostcpu >= HOST_BUSY)."""
    h = h or {}
    return ", ".join(fmt(d[r], fig) + ("*" if h.get(r, 0) >= HOST_BUSY else "")
                     for r in sorted(d))


def host_by_round(host):
    """Mean hostcpu of each round's figures: 'round 1 0.12, round 2 0.40', or None."""
    by = defaultdict(list)
    for per in host.values():
        for r, v in per.items():
            by[r].append(v)
    return ", ".join(f"round {r} {statistics.mean(v):.2f}" for r, v in sorted(by.items())) or None


def main():
    path = sys.argv[1]
    meta = [a.split("=", 1) for a in sys.argv[2:] if "=" in a]
    res, fails, info, sysc, systop, perf, vstat, host, pt = parse(path)
    out = []
    w = out.append
    w("# libexs verbs benchmarks on Soft-RoCE (make bench-rxe)\n")
    w("Written by `make bench-rxe` (bench/rxe-bench.sh in a scripts/rxe-vm.sh guest, "
      "bench/rxe_results.py); do not edit by hand.\n")
    w("| run | |\n| --- | --- |")
    for k, v in meta:
        w(f"| {k} | {v} |")
    for i in info:
        w(f"| guest | {i} |")
    hr = host_by_round(host)
    if hr:
        w(f"| host CPU pressure (mean per figure) | {hr} |")
    w("")
    if hr:
        w("Host CPU pressure: the share of each figure's wall time in which some task on the "
          "host waited for a CPU (/proc/pressure/cpu, bench/rxe_hostload.py). The guest's "
          "vCPUs are host threads; a busy-polling round trip needs both on a core at once, "
          "and while the host's other work holds the cores it waits for the host's "
          "scheduler, whatever the system measured (spec/rxe-vm.md, \"Host load\"). A "
          f"round's value measured at {HOST_BUSY} or more carries a `*`.\n")
    w("Everything runs in ONE qemu guest under TCG (software CPU emulation) on device rxe0: "
      "both ends, the rxe driver and the emulated CPUs share the host's cores. Absolute "
      "figures say little; the ratios between systems measured in the same rounds are the "
      "point. Medians over the rounds (each round runs every system once, the order "
      "rotating); each round's value is given beside the median.\n")
    w("libexs before and after a change, on the same device in the same rounds, with its "
      "counters per message: bench/results-rxe-ab.md (make bench-rxe-ab).\n")

    def get(s, f, z):
        return med(res.get((s, f, z), {}))

    w("## Targets (issue 26, \"Done when\")\n")
    w("| figure | libexs | peer | libexs/peer | target | |\n| --- | --- | --- | --- | --- | --- |")
    targets = [
        ("64 B round trip p50, busy polling vs rsockets nonblocking", "rtt_busy", 64,
         "rsockets", "<=", 1.0),
        ("64 B round trip p50, blocking vs rsockets -T b (both as they block by default: a "
         "spin, then sleep; rsockets 10 us, libexs 10 us learning up to 100)", "rtt_block", 64,
         "rsockets", "<=", 1.2),
        ("64 B round trip p50, blocking with every wait sleeping at once (blast --wait-notify) "
         "vs rsockets -T b", "rtt_block", 64, "rsockets", "<=", 1.2, "libexs_notify"),
        ("64 B messages/s, 16 outstanding vs rsockets", "msgs", 64, "rsockets", ">=", 1.0),
        ("64 KiB STREAM Gbit/s (direct), both ends busy-polling as ib_write_bw's do (blast "
         "--poll --poll-recv) vs ib_write_bw", "gbps", 65536, "ib_write_bw", ">=", 0.95,
         "libexs_poll"),
        ("1 MiB STREAM Gbit/s (direct), both ends busy-polling vs ib_write_bw", "gbps",
         1048576, "ib_write_bw", ">=", 0.95, "libexs_poll"),
        ("64 KiB STREAM Gbit/s (direct), the library's default waits vs ib_write_bw", "gbps",
         65536, "ib_write_bw", ">=", 0.95),
        ("1 MiB STREAM Gbit/s (direct), the library's default waits vs ib_write_bw", "gbps",
         1048576, "ib_write_bw", ">=", 0.95),
    ]
    for name, fig, size, peer, op, tgt, *ours in targets:
        a, b = get(ours[0] if ours else "libexs", fig, size), get(peer, fig, size)
        if a is None or b is None or b == 0:
            w(f"| {name} | {fmt(a, fig)} | {fmt(b, fig)} | - | {op} {tgt} | not measured |")
            continue
        r = a / b
        ok = r <= tgt if op == "<=" else r >= tgt
        w(f"| {name} | {fmt(a, fig)} | {fmt(b, fig)} | {r:.2f} | {op} {tgt} | "
          f"{'met' if ok else '**not met**'} |")
    w("")

    for fig, title, unit in [("rtt_busy", "Round trip p50, busy polling", "us"),
                             ("rtt_block", "Round trip p50, blocking waits", "us")]:
        w(f"## {title} ({unit})\n")
        w("libexs: blast `--type seqpacket --lat-only` (p50 of the round trip; busy: `--poll "
          "--poll-recv`; blocking: the library's default wait, a spin and then sleep "
          "(EXS_QWAIT_SPIN_US 10 us, learning up to EXS_QWAIT_SPIN_MAX_US 100 us by the "
          "queue's waits: spec/api.md, \"Wait modes\"), and `--wait-notify`, every wait sleeping at once). rstream: `-C 1 -T n` (busy) / `-T b` (blocking), 2 x its usec/xfer "
          "(a mean). perftest: 2 x t_typical (busy; `-e` for blocking). UCX: 2 x tag_lat's "
          "typical (`-E sleep` for blocking).\n")
        w("| size | system | p50 | / rsockets | each round |\n| --- | --- | --- | --- | --- |")
        for size in sorted({k[2] for k in res if k[1] == fig}):
            base = get("rsockets", fig, size)
            for s in ["libexs", "libexs_notify", "rsockets", "ib_send_lat", "ib_write_lat",
                      "ucx_tag_lat"]:
                d = res.get((s, fig, size))
                if not d:
                    continue
                v = med(d)
                rel = f"{v / base:.2f}" if base else "-"
                w(f"| {SIZE_NAME.get(size, size)} | {SYS_NAME[s]} | {fmt(v, fig)} | {rel} | "
                  f"{rounds(d, fig, host.get((s, fig, size)))} |")
        w("")
    w("## 64 B messages/s, 16 outstanding\n")
    w("libexs: blast `--type stream --size 64 --sends 16 --recvs 16`; rstream `-S 64 -C 16 -T "
      "n` (1 / usec/xfer: a ping-pong of 16-message batches); ib_send_bw `-s 64 -t 16`; UCX "
      "tag_bw `-O 16`.\n")
    w("| system | msg/s | / rsockets | each round |\n| --- | --- | --- | --- |")
    base = get("rsockets", "msgs", 64)
    for s in ["libexs", "rsockets", "ib_send_bw", "ucx_tag_bw"]:
        d = res.get((s, "msgs", 64))
        if d:
            v = med(d)
            w(f"| {SYS_NAME[s]} | {fmt(v, 'msgs')} | {f'{v / base:.2f}' if base else '-'} | "
              f"{rounds(d, 'msgs', host.get((s, 'msgs', 64)))} |")
    w("")
    w("## STREAM throughput (Gbit/s)\n")
    w("libexs: blast `--type stream --mode direct` (8/8), the library's default waits and "
      "`--poll --poll-recv` (both ends busy-poll, as ib_write_bw and rstream -T n do); rstream/riostream `-C N -I 1 -T n` "
      "(Gb/sec); ib_write_bw `-D`: the iterations it counts in its sample window over that "
      "window (its own BW columns read 0 under TCG); UCX tag_bw (overall MB/s).\n")
    w("| size | system | Gbit/s | / ib_write_bw | each round |\n| --- | --- | --- | --- | --- |")
    for size in (65536, 1048576):
        base = get("ib_write_bw", "gbps", size)
        for s in ["libexs", "libexs_poll", "rstream", "riostream", "ib_write_bw", "ucx_tag_bw"]:
            d = res.get((s, "gbps", size))
            if d:
                v = med(d)
                each = rounds(d, "gbps", host.get((s, "gbps", size)))
                w(f"| {SIZE_NAME[size]} | {SYS_NAME[s]} | {fmt(v, 'gbps')} | "
                  f"{f'{v / base:.2f}' if base else '-'} | {each} |")
    w("")
    grain = pt_grain(pt)
    if grain:
        w("The grain of ib_write_bw's figure: its iteration counts in these rounds are all "
          "multiples of a step (it counts the completions it polls, which rxe hands over in "
          "batches), so a round's value can be off by up to one step: " +
          "; ".join(f"{SIZE_NAME[s]}: {g} iterations, {gb:.4f} Gbit/s, {sh:.1%} of its "
                    f"median count" for s, (g, gb, sh) in grain.items()) +
          ". A ratio to ib_write_bw is no finer than that share.\n")

    # Per message: vstat counters summed over the rounds of one (system, figure, size), per
    # message of that run (both directions of a ping-pong count).
    w("## Per message (libibverbs calls seen by bench/rxe-vstat.so)\n")
    w("Counted in the client process (and in the per-test server, where it has one: rstream, "
      "perftest), summed over the rounds, divided by the messages the process sent plus "
      "received. blast's receiver runs for the whole benchmark and is not counted. \"in "
      "verbs\": time inside post_send/post_recv/poll_cq/req_notify_cq (libibverbs, the rxe "
      "provider and the system calls under them; one call in 64 timed, scaled) as a share "
      "of the process's CPU time; "
      "blocking waits in ibv_get_cq_event are not CPU and not included. Locks: "
      "pthread mutex/rwlock/spin acquisitions through the PLT.\n")
    w("| run | side | sends posted | signaled | recvs posted | polls | completions | empty "
      "polls | notify req | CQ events | locks | in verbs (% CPU) |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    agg = defaultdict(lambda: defaultdict(float))
    for v in vstat:
        tag = v.get("tag", "-")
        m = re.match(r"(\w+)/(\w+)/(\d+)/\d+/msgs=(\d+)(/server)?$", tag)
        if not m:
            continue
        side = "server" if m.group(5) else "client"
        key = (m.group(1), m.group(2), int(m.group(3)), side)
        a = agg[key]
        a["msgs"] += int(m.group(4))
        for f in ("send_wrs", "send_signaled", "recv_wrs", "poll_calls", "polled_cqes",
                  "empty_polls", "req_notify", "cq_events", "locks", "verbs_ns", "cpu_ns"):
            a[f] += float(v.get(f, 0))
    for key in sorted(agg):
        a = agg[key]
        if a["msgs"] <= 0:
            continue
        n = a["msgs"]
        share = 100.0 * a["verbs_ns"] / a["cpu_ns"] if a["cpu_ns"] else 0
        w(f"| {key[0]} {key[1]} {SIZE_NAME.get(key[2], key[2])} | {key[3]} | "
          f"{a['send_wrs'] / n:.2f} | {a['send_signaled'] / n:.2f} | {a['recv_wrs'] / n:.2f} | "
          f"{a['poll_calls'] / n:.1f} | {a['polled_cqes'] / n:.2f} | {a['empty_polls'] / n:.1f} | "
          f"{a['req_notify'] / n:.2f} | {a['cq_events'] / n:.2f} | {a['locks'] / n:.1f} | "
          f"{share:.0f} |")
    w("")
    if sysc:
        w("## System calls per message (strace -c -f, one client run, 64 B round trips)\n")
        w("| run | messages | system calls | per message | most frequent |\n| --- | --- | --- | --- | --- |")
        for s in sysc:
            top = ", ".join(f"{t['call']} {t['count']}" for t in systop if t.get("name") == s["name"])
            try:
                per = f"{int(s['syscalls']) / int(s['msgs']):.1f}"
            except (ValueError, ZeroDivisionError):
                per = "-"
            w(f"| {s['name']} | {s['msgs']} | {s['syscalls']} | {per} | {top} |")
        w("")
    if perf:
        w("## Where the time goes (perf record -e cpu-clock, by shared object)\n")
        w("| run | shares |\n| --- | --- |")
        names = []
        for p in perf:
            if p["name"] not in names:
                names.append(p["name"])
        for n in names:
            w(f"| {n} | " + ", ".join(f"{p['dso']} {p['share']}" for p in perf if p["name"] == n)
              + " |")
        w("")
    if fails:
        w("## Runs that failed\n")
        for f in fails:
            w(f"- `{f}`")
        w("")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
