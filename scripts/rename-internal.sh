#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Give every global symbol of libexs.a outside the exs_/exs__ prefixes the internal exs__
# prefix (issue 15: the static library must link into any program without clashes).
# The names are read from the archive just built, so the script also catches names added
# since it was written. It rewrites whole words in the tracked text files of exs/, tests/,
# tools/, blast/, samples/ and spec/ (never include/: the public header has none of them;
# never bench/: results and fixtures of past runs; never tests/install/: its outside program
# defines the old names on purpose), then rebuilds and runs
# scripts/check-symbols.sh. The renamed lines (only those) are then clang-formatted, as
# longer names may push them past the column limit. Run it on a tree without uncommitted
# changes to tracked files, and commit its output alone.
#   scripts/rename-internal.sh [build-dir]
set -eu
build=${1:-build}
cd "$(git rev-parse --show-toplevel)"
if ! git diff --quiet HEAD --; then
    echo "rename-internal: commit or stash the changes first (the rename must be a commit of its own)" >&2
    exit 1
fi
make -s -j2 BUILD="$build" "$build/libexs.a"
names=$(nm -g --defined-only "$build/libexs.a" | awk 'NF == 3 { print $3 }' |
    grep -Ev '^exs_|^__(odr_asan|asan|ubsan|tsan)' | sort -u || true)
if [ -z "$names" ]; then
    echo "rename-internal: nothing to rename"
    exit 0
fi
pat=$(tr '\n' '|' <<<"$names" | sed 's/|$//')
# A new name must not exist already (two symbols would merge into one).
clash=$(for n in $names; do git grep -qw "exs__$n" && echo "$n"; done || true)
if [ -n "$clash" ]; then
    echo "rename-internal: exs__<name> already exists for:" $clash >&2
    exit 1
fi
if git grep -qwE "$pat" -- include; then
    echo "rename-internal: the public headers use an internal name:" >&2
    git grep -nwE "$pat" -- include >&2
    exit 1
fi
files=$(git grep -IlwE "$pat" -- exs tests tools blast samples spec ":!tests/install" || true)
# shellcheck disable=SC2086
sed -i -E "s/\\b($pat)\\b/exs__\\1/g" $files
if command -v git-clang-format >/dev/null; then
    # git clang-format formats the lines changed in the index; it stages nothing itself
    # shellcheck disable=SC2086
    git add -- $files
    git clang-format -q --extensions c,h >/dev/null
fi
echo "rename-internal: $(wc -l <<<"$names") names in $(wc -w <<<"$files") files:" $names
make -s -j2 BUILD="$build" "$build/libexs.a" "$build/libexs.so"
bash scripts/check-symbols.sh "$build"
