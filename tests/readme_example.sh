#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The example of README.md compiles without a warning against the built library and runs:
# the C block between the "README example" markers is extracted, built, run over loopback
# on the tcp provider, and must print its message.
#   [SANFLAGS=-fsanitize=...] tests/readme_example.sh [build-dir]
set -u
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/exs-readme.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "readme_example: FAIL: $*" >&2
    exit 1
}
sed -n '/^<!-- README example: begin/,/^<!-- README example: end/p' "$top/README.md" |
    sed -n '/^```c$/,/^```$/p' | sed '1d;$d' >"$tmp/example.c"
lines=$(wc -l <"$tmp/example.c")
[ "$lines" -gt 10 ] || fail "no example between the markers of README.md ($lines lines)"
cc -std=gnu11 -Wall -Wextra -Werror ${SANFLAGS:-} -I"$top/include" "$tmp/example.c" -L"$top/$build" -lexs \
    -Wl,-rpath,"$top/$build" -o "$tmp/example" 2>"$tmp/cc.log" || { cat "$tmp/cc.log" >&2; fail "the example does not compile"; }
out=$(EXS_PROVIDER=tcp timeout 60 "$tmp/example" 2>&1) || fail "the example exited nonzero: $out"
[ "$out" = "received: hello over exs" ] || fail "the example printed: $out"
echo "readme_example: the README example ($lines lines) compiles and runs"
