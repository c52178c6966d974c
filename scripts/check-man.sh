#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The man pages: every page renders without a single warning (man -l and groff -ww), every
# .so link page points to a page naming it, every function exported by libexs.so and every
# type of <sys/exs.h> has a page, cross references name existing pages, and the tunables
# of exs(7) are those of "exsctl params" (scripts/man-params.sh).
#   scripts/check-man.sh [build-dir]
set -u
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top/man" || exit 1
export LC_ALL=C.UTF-8 MANWIDTH=80
fail=0
bad() {
    echo "check-man: $*" >&2
    fail=1
}
# render PAGE: print every warning of both renderers (empty: clean)
render() {
    { man --warnings -E UTF-8 -l "$1" >/dev/null; } 2>&1
    groff -man -ww -z "$1" 2>&1
}

# The renderers must report a broken page, or this check would pass anything.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '.TH BROKEN 3\n.SH NAME\nbroken \\- x\n.XY undefined macro\n' >"$tmp/broken.3"
[ -n "$(render "$tmp/broken.3")" ] || { echo "check-man: man/groff report no warning for a broken page" >&2; exit 1; }

pages=$(ls man1/*.1 man3/*.3 man7/*.7 2>/dev/null)
[ -n "$pages" ] || { echo "check-man: no pages under man/" >&2; exit 1; }
for p in $pages; do
    stem=$(basename "$p"); stem=${stem%.*}
    first=$(head -n 1 "$p")
    if [[ $first == .so\ * ]]; then
        target=${first#.so }
        [ "$(wc -l <"$p")" -eq 1 ] || bad "$p: a .so link page holds one line"
        [ -f "$target" ] || { bad "$p: links to missing $target"; continue; }
        sed -n '/^\.SH NAME/,/^\.SH/p' "$target" | grep -qw -- "$stem" ||
            bad "$p: $target does not name $stem in its NAME section"
    else
        grep -q "^\.TH ${stem^^} " "$p" || bad "$p: .TH does not name ${stem^^}"
        sed -n '/^\.SH NAME/,/^\.SH/p' "$p" | grep -qw -- "$stem" || bad "$p: NAME does not list $stem"
    fi
    w=$(render "$p")
    [ -z "$w" ] || bad "$p: rendering warnings:"$'\n'"$w"
    # every exs_* page named in a cross reference exists
    for ref in $(grep -o '^\.BR exs[a-z_]* ([37])' "$p" | sed -E 's/^\.BR ([a-z_]+) \(([37])\)/man\2\/\1.\2/'); do
        [ -f "$ref" ] || bad "$p: refers to missing page $ref"
    done
done

# every exported function has a page
so=$top/$build/libexs.so
[ -f "$so" ] || so=$build/libexs.so
funcs=$(nm -D --defined-only "$so" | awk '$2 == "T" { print $3 }' | sed 's/@.*//' | sort -u)
[ -n "$funcs" ] || bad "no function exported by $so"
for f in $funcs; do
    [ -f "man3/$f.3" ] || bad "exported function $f has no page man/man3/$f.3"
done
# every public type has a page
types=$(sed -nE 's/^\} *(exs_[a-z_]+_t);.*/\1/p; s/^typedef .*[ *](exs_[a-z_]+_t);.*/\1/p; s/^struct (exs_[a-z_]+) \{.*/\1/p' \
    "$top/include/sys/exs.h" | sort -u)
[ -n "$types" ] || bad "no type found in include/sys/exs.h"
for t in $types; do
    [ -f "man3/$t.3" ] || bad "public type $t has no page man/man3/$t.3"
done

# the tunables of exs(7)
(cd "$top" && bash scripts/man-params.sh "$build/tools/exsctl" --check >/dev/null) ||
    bad "man/man7/exs.7: tunables differ from exsctl params (run make man-params)"

[ $fail -eq 0 ] || exit 1
echo "check-man: $(wc -w <<<"$pages") pages render without warnings; $(wc -w <<<"$funcs") functions and $(wc -w <<<"$types") types documented; exs(7) tunables current"
