#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The tunables list of exs(7), generated from "exsctl params --markdown" (the table of
# exs/util/params.c, as spec/params.md): print it, check man/man7/exs.7 holds it, or write
# it there between the "exsctl params" marker comments.
#   scripts/man-params.sh EXSCTL [--check|--update]
set -eu
exsctl=$1
mode=${2:-}
page=man/man7/exs.7
begin='.\" exsctl params: begin (scripts/man-params.sh writes this list; do not edit)'
end='.\" exsctl params: end'

block() {
    echo "$begin"
    "$exsctl" params --markdown | awk -F' [|] ' '
        /^\| `/ {
            var = $2; def = $3; when = $4; desc = $5
            gsub(/`/, "", var); gsub(/`/, "", def)
            sub(/ \|$/, "", desc); gsub(/`/, "", desc)
            if (def == "(empty)") def = "empty"
            gsub(/\\/, "\\e", desc); gsub(/-/, "\\-", desc); gsub(/-/, "\\-", def)
            sub(/^[.\047]/, "\\\\\\&&", desc)
            print ".TP"
            print ".B " var
            print desc
            print "(default " def "; " (when == "online" ? "changeable at run time" : "read once, at start") ")"
        }'
    echo "$end"
}

case $mode in
'')
    block
    ;;
--check | --update)
    new=$(mktemp)
    trap 'rm -f "$new"' EXIT
    BLK=$(block) B=$begin E=$end awk '
        $0 == ENVIRON["B"] { print ENVIRON["BLK"]; skip = 1; found++; next }
        $0 == ENVIRON["E"] { skip = 0; next }
        !skip { print }
        END { if (found != 1) exit 3 }' "$page" >"$new" || {
        echo "man-params: $page lacks one pair of marker lines" >&2
        exit 1
    }
    if [ "$mode" = --update ]; then
        cat "$new" >"$page"
    elif ! diff -u "$page" "$new"; then
        echo "man-params: the tunables of $page are stale: run make man-params" >&2
        exit 1
    fi
    ;;
*)
    echo "usage: scripts/man-params.sh EXSCTL [--check|--update]" >&2
    exit 2
    ;;
esac
