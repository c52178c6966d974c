#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the Debian packages (libexs0, libexs-dev, exs-tools) with dpkg-buildpackage -us -uc
# -b from a copy of the tree in a temporary directory (dpkg-buildpackage writes the .debs
# to the parent of the tree it builds), put them in OUT (default build-deb/), and run
# lintian on them: any error or warning fails. With --install: install them (apt-get install ./*.deb,
# as root), build the README example outside the tree with pkg-config against the
# installed package and run it, run the installed exsctl and find its man page; then
# remove the packages again (unless --keep).
#   scripts/deb.sh [--install [--keep]] [OUT]
# Needs dpkg-dev, debhelper and lintian (scripts/deps.sh --deb).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
install=0 keep=0 out=$top/build-deb
for a in "$@"; do
    case $a in
    --install) install=1 ;;
    --keep) keep=1 ;;
    -*) echo "usage: scripts/deb.sh [--install [--keep]] [OUT]" >&2; exit 2 ;;
    *) out=$(mkdir -p "$a" && cd "$a" && pwd) ;;
    esac
done
tmp=$(mktemp -d /tmp/exs-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)

# the tree as git sees it (tracked and new files, not the build directories)
mkdir "$tmp/libexs"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$top" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$tmp/libexs"
else # an unpacked tarball: everything but the build directories
    (cd "$top" && tar --exclude='./build' --exclude='./build-*' -cf - .) | tar -xf - -C "$tmp/libexs"
fi
echo "=== dpkg-buildpackage -us -uc -b (in $tmp/libexs)"
(cd "$tmp/libexs" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc 2>/dev/null || echo 2)" \
    dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1 || {
    tail -n 60 "$tmp/build.log" >&2
    echo "deb.sh: dpkg-buildpackage failed (log above)" >&2
    exit 1
}
mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo
mv "$tmp"/*.deb "$tmp"/*.changes "$tmp"/*.buildinfo "$out"/
ls -l "$out"
t1=$(date +%s)

echo "=== lintian"
# errors and warnings fail (none is accepted; lintian -I -E --pedantic shows the rest)
lintian --fail-on error,warning --info "$out"/*.changes | tee "$tmp/lintian.out"
t2=$(date +%s)
echo "deb.sh: packages built in $((t1 - t0)) s, lintian $((t2 - t1)) s"
[ "$install" -eq 1 ] || exit 0

echo "=== install the packages and build an outside program against them"
[ "$(id -u)" -eq 0 ] || { echo "deb.sh: --install needs root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "$out"/*.deb >"$tmp/apt.log" 2>&1 || {
    cat "$tmp/apt.log" >&2; exit 1; }
mkdir "$tmp/outside"
# the README's example, extracted as tests/readme_example.sh does
sed -n '/^<!-- README example: begin/,/^<!-- README example: end/p' "$top/README.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' >"$tmp/outside/prog.c"
[ -s "$tmp/outside/prog.c" ] || { echo "deb.sh: no README example found" >&2; exit 1; }
(cd "$tmp/outside" && cc -o prog prog.c $(pkg-config --cflags --libs exs))
# it runs on the packaged library: the file the loader finds belongs to libexs0
so=$(ldd "$tmp/outside/prog" | sed -n 's/.*libexs\.so\.0 => \([^ ]*\).*/\1/p')
owner=$(dpkg -S "$(readlink -f "${so:-/nonexistent}")" 2>/dev/null | cut -d: -f1)
[ "$owner" = libexs0 ] || {
    ldd "$tmp/outside/prog" >&2; echo "deb.sh: prog does not use libexs0's library ($so)" >&2; exit 1; }
out_run=$(cd "$tmp/outside" && EXS_PROVIDER=tcp EXS_CTL_ENABLE=0 timeout 60 ./prog)
[ "$out_run" = "received: hello over exs" ] || { echo "deb.sh: prog printed: $out_run" >&2; exit 1; }
echo "outside program: $out_run"
exsctl version
man -w exsctl >/dev/null && man -w exs_send >/dev/null && man -w 7 exs >/dev/null
t3=$(date +%s)
echo "deb.sh: install and outside program $((t3 - t2)) s; total $((t3 - t0)) s"
if [ "$keep" -eq 0 ]; then
    apt-get remove -y -qq libexs0 libexs-dev exs-tools >"$tmp/apt.log" 2>&1 || {
        cat "$tmp/apt.log" >&2; exit 1; }
fi
