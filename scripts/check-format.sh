#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The tree formatted by .clang-format (docs/CodeStyle.md, Formatting): clang-format
# --dry-run --Werror over the tracked C sources, listing every file it would change.
#   scripts/check-format.sh [PATH...]   PATHs: files or directories (default: every tracked
#                                       *.c and *.h, the set `make format` rewrites)
#   scripts/check-format.sh --diff F    what clang-format would change in F
# make check runs it (CHECK_FORMAT=0 skips it); the tree was formatted once by `make format`.
# Needs clang-format (Debian 12: 14; `bash scripts/deps.sh --format`).
set -u
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
    echo "check-format: $cf not found (bash scripts/deps.sh --format)"
    echo "check-format: 0 passed, 1 failed"
    exit 1
fi
# every key of .clang-format must be one this clang-format knows (else it formats nothing)
if ! err=$("$cf" --style=file --dump-config 2>&1 >/dev/null) || [ -n "$err" ]; then
    echo "check-format: .clang-format is not accepted by $("$cf" --version):"
    echo "$err"
    echo "check-format: 0 passed, 1 failed"
    exit 1
fi
if [ "${1:-}" = --diff ]; then
    shift
    for f in "$@"; do "$cf" --style=file "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" -; done
    exit 0
fi
if [ $# -eq 0 ]; then
    mapfile -t files < <(git ls-files '*.c' '*.h')
else
    mapfile -t files < <(git ls-files -- "$@" | grep -E '\.[ch]$')
fi
bad=()
for f in "${files[@]}"; do
    "$cf" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -ne 0 ]; then
    echo "check-format: ${#bad[@]} of ${#files[@]} files not formatted by .clang-format" \
         "(make format rewrites them; scripts/check-format.sh --diff FILE shows how):"
    printf '    %s\n' "${bad[@]}"
    echo "check-format: 0 passed, 1 failed"
    exit 1
fi
echo "check-format: ${#files[@]} files formatted"
echo "check-format: 1 passed, 0 failed"
