#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_probe_bw.py LOG: one line per run of bench/rxe-probe.sh bw's output, per work request
the sender posted (one 64 KiB RDMA WRITE each): packets on rxe0, rxe's requester retries
(timeouts) and the responder's duplicates, tasklet softirqs on CPU 0 and 1, completion
channel events and CPU time of the client and the server (rxe-vstat.so)."""
import re
import sys


def parse(path):
    runs = []
    for raw in open(path, errors="replace"):
        line = re.sub(r"^\d+\.\d+ ", "", raw.rstrip("\n"))  # the host's time stamp
        d = dict(re.findall(r"(\w+)=(\S+)", line))
        if line.startswith("BW "):
            runs.append({"tag": d.get("tag"), "cyc": d.get("cyc"),
                         "gbps": float(d.get("gbps") or 0)})
        elif line.startswith("BWV") and runs:
            runs[-1]["srv" if d.get("tag") == "srv" else "cli"] = d
        elif line.startswith("BWD") and runs:
            f = line.split()
            if len(f) < 5 or f[1] != "tag=" + runs[-1]["tag"]:
                continue
            if f[2] == "rdma":
                runs[-1][f[3]] = int(f[4])
            elif f[2] == "softirq" and f[3] == "TASKLET:" and len(f) > 5:
                runs[-1]["tl0"], runs[-1]["tl1"] = int(f[4]), int(f[5])
    return runs


def main():
    for r in parse(sys.argv[1]):
        c, s = r.get("cli"), r.get("srv", {})
        if r["cyc"] == "0" or not c or not int(c.get("send_wrs", 0)):
            continue
        n = int(c["send_wrs"])

        def per(d, k, scale=1.0):
            return int(d.get(k, 0)) / n / scale

        print(f"{r['tag']:24} gbps={r['gbps']:.3f} wrs={n} "
              f"pkts/wr={r.get('sent_pkts', 0) / n:.2f} retries={r.get('completer_retry_err', 0)} "
              f"dup={r.get('duplicate_request', 0)} "
              f"tasklets/wr={r.get('tl0', 0) / n:.2f},{r.get('tl1', 0) / n:.2f} | "
              f"client events/wr={per(c, 'cq_events'):.2f} cpu_ms/wr={per(c, 'cpu_ns', 1e6):.2f} | "
              f"server events/wr={per(s, 'cq_events'):.2f} wrs/wr={per(s, 'send_wrs'):.2f} "
              f"cpu_ms/wr={per(s, 'cpu_ns', 1e6):.2f}")


if __name__ == "__main__":
    main()
