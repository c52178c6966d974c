#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rxe_hostload.py: a filter between scripts/rxe-vm.sh and the log of make bench-rxe. Every
line passes through unchanged, at once; a figure's line (one starting "BR ", after an
optional "name| " prefix) gets " hostcpu=F" appended: the share of
the wall time since the previous figure's line in which some task on the host waited for a
CPU (Linux's pressure stall information, /proc/pressure/cpu "some"). The guest's vCPUs are
host threads: a busy-polling round trip needs both of them on a core at once, and when the
host's other work takes the cores, each round trip waits for the host's scheduler (p50 from
27 us to milliseconds, spec/rxe-vm.md "Host load"). Without /proc/pressure/cpu the lines
pass unchanged."""
import re
import sys
import time

PSI = "/proc/pressure/cpu"
FIG = re.compile(r"^(\S+\| )?BR ")


def psi_total(path=PSI):
    """Microseconds some task waited for a CPU since boot, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some"):
                    return int(re.search(r"total=(\d+)", line).group(1))
    except (OSError, AttributeError, ValueError):
        pass
    return None


def annotate(lines, read_psi=psi_total, now=time.monotonic):
    """Yields each line, a figure's line with hostcpu= (the stall share since the last)."""
    t0, p0 = now(), read_psi()
    for line in lines:
        if FIG.match(line):
            t1, p1 = now(), read_psi()
            if p0 is not None and p1 is not None and t1 > t0:
                line = line.rstrip("\n") + f" hostcpu={max(0.0, (p1 - p0) / 1e6 / (t1 - t0)):.2f}\n"
            t0, p0 = t1, p1
        yield line


def main():
    for line in annotate(iter(sys.stdin.readline, "")):
        sys.stdout.write(line)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
