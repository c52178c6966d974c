#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_cg_locks.py LOG DIR: locked instructions per 64 B round trip of each client of a
make bench-rxe-cg run made with BENCH_CG_LOCKS=1 (callgrind --dump-instr=yes in the guest),
by function. Each executed instruction's address is matched against objdump -d of its
object (lock-prefixed, or xchg with memory: implicitly locked); an object is looked up by
its name in DIR (the run's directory: blast-this, blast-base, rstream), then in the host's
library directories (the guest runs the host's libc, libibverbs, librxe and librdmacm).
Under TCG a locked instruction costs as much as 60-110 plain ones (spec/rxe-vm.md)."""
import base64
import gzip
import os
import re
import subprocess
import sys
from collections import defaultdict

LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
           "/usr/lib/x86_64-linux-gnu/libibverbs")


def lock_addrs(objdump_text):
    """Addresses of the locked instructions in objdump -d output."""
    out = set()
    for line in objdump_text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )*\s*(\S.*)$", line)
        if not m:
            continue
        ins = m.group(2)
        if ins.startswith("lock ") or (ins.startswith("xchg") and "(" in ins):
            out.add(int(m.group(1), 16))
    return out


def count_locked(text, locks_of):
    """Executions of locked instructions per (object, function) in one callgrind file
    dumped with --dump-instr=yes (positions: instr [line]); locks_of(object) gives the
    object's locked addresses. A call's inclusive cost line is not counted."""
    names = {"ob": {}, "fn": {}}
    ob = fn = "?"
    locks, addr, skip = set(), 0, False
    per_fn = defaultdict(int)
    for line in text.splitlines():
        if not line:
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            a = parts[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] == "+":
                addr += int(a[1:])
            elif a[0] == "-":
                addr -= int(a[1:])
            elif a != "*":
                addr = int(a)
            if skip:
                skip = False
                continue
            if addr in locks and len(parts) >= 2:
                per_fn[(ob, fn)] += int(parts[-1])
            continue
        m = re.match(r"^(ob|fn|cob|cfn)=(?:\((\d+)\))?\s*(.*)$", line)
        if m:
            kind, ident, name = m.groups()
            table = names["ob" if kind in ("ob", "cob") else "fn"]
            if ident and name:
                table[ident] = name
            val = table.get(ident, name) if ident else name
            if kind == "ob":
                ob = val
                locks = locks_of(ob)
            elif kind == "fn":
                fn = val
        elif line.startswith("calls="):
            skip = True
    return per_fn


def main():
    log, objdir = sys.argv[1], sys.argv[2]
    cache = {}

    def locks_of(ob):
        if ob not in cache:
            base = ob.rsplit("/", 1)[-1]
            path = next((p for p in [os.path.join(objdir, base)] +
                         [os.path.join(d, base) for d in LIBDIRS] if os.path.isfile(p)), None)
            cache[ob] = lock_addrs(subprocess.run(
                ["objdump", "-d", path], capture_output=True, text=True).stdout) if path else set()
        return cache[ob]

    runs = defaultdict(dict)  # (label, rep) -> n -> per_fn
    cur, buf = None, []
    for raw in open(log, errors="replace"):
        line = re.sub(r"^\S+\| ", "", raw.rstrip("\n"))
        if line.startswith("@@CG BEGIN"):
            f = line.split()
            cur, buf = (f[2], f[4] if len(f) > 4 else "1", int(f[3])), []
        elif line.startswith("@@CG END") and cur:
            text = gzip.decompress(base64.b64decode("".join(buf))).decode(errors="replace")
            runs[cur[:2]][cur[2]] = count_locked(text, locks_of)
            cur = None
        elif cur:
            buf.append(line.strip())
    print("## Locked instructions per round trip (callgrind --dump-instr=yes, objdump)\n")
    for (label, rep), d in sorted(runs.items()):
        if len(d) < 2:
            continue
        (n1, a), (n2, b) = sorted(d.items())[:2]
        # blast makes n / 10 warm-up round trips besides the measured ones
        rts = (n2 - n1) * (1.0 if label.startswith("rsockets") else 1.1)
        fns = {k: (b.get(k, 0) - a.get(k, 0)) / rts for k in set(a) | set(b)}
        print(f"### {label} (pair {rep}): {sum(fns.values()):.1f}\n")
        print("| function | object | locked |\n| --- | --- | --- |")
        for (ob, fn), v in sorted(fns.items(), key=lambda kv: -kv[1]):
            if v >= 0.05:
                print(f"| `{fn}` | {ob.rsplit('/', 1)[-1]} | {v:.2f} |")
        print("")


if __name__ == "__main__":
    main()
