#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian packages libexs needs to build and test, when missing.
# As root: installs them with apt-get. Otherwise: prints the exact command and fails.
# Extra packages for optional jobs can be passed as arguments; --fuzz adds clang and the
# libFuzzer runtime of its version (libclang-rt-N-dev, only recommended by clang in Debian).
# --bench adds what make bench runs besides the library: UCX's ucx_perftest (ucx-utils),
# libfabric's fi_pingpong (libfabric-bin: its shm beside the shm provider), valgrind
# (callgrind), strace (system calls per message) and python3 (bench/bench.py);
# --bench-rxe adds what make bench-rxe runs in its guest: perftest, ucx-utils, rdmacm-utils
# (rstream, riostream), strace and linux-perf;
# (--format, kept for older callers: clang-format is always installed, make check runs
# scripts/check-format.sh);
# gnuplot-nox is always installed, and groff-base and man-db (make check renders the man
# pages with man -l), strace (make check counts exs_send's system calls, bench/kfd). prometheus (its promtool checks exsctl metrics in make check) is
# always installed, and valgrind (make check counts exs_send's instructions with callgrind,
# bench/kfd/instr.sh). --deb adds what scripts/deb.sh runs: dpkg-dev, debhelper, lintian.
set -eu
extra=()
for a in "$@"; do
    if [ "$a" = --deb ]; then
        extra+=(dpkg-dev debhelper lintian)
    elif [ "$a" = --bench ]; then
        extra+=(ucx-utils libfabric-bin valgrind strace python3)
    elif [ "$a" = --format ]; then
        extra+=(clang-format)
    elif [ "$a" = --bench-rxe ]; then
        extra+=(perftest ucx-utils rdmacm-utils strace linux-perf python3)
    elif [ "$a" = --fuzz ]; then
        v=$(clang --version 2>/dev/null | sed -nE 's/.*clang version ([0-9]+).*/\1/p' | head -n 1)
        [ -n "$v" ] || v=$(apt-cache depends clang 2>/dev/null | sed -nE 's/.*Depends: clang-([0-9]+)$/\1/p' | head -n 1)
        extra+=(clang ${v:+libclang-rt-$v-dev})
    else
        extra+=("$a")
    fi
done
pkgs=(gcc make pkg-config libev-dev check libsubunit-dev libibverbs-dev librdmacm-dev spin gnuplot-nox
      groff-base man-db prometheus strace valgrind clang-format ${extra[@]+"${extra[@]}"})
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
line="apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "libexs: missing Debian packages: ${missing[*]}" >&2
    echo "libexs: run as root:  apt-get update && $line" >&2
    exit 1
fi
echo "libexs: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
