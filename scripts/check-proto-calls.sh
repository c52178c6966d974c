#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The protocol layer's call graph (issue 25, spec/proto-layout.md): every file of
# exs/proto/ has a layer, given in the table of spec/proto-layout.md; a file calls only
# files of its own layer or lower ones, and no two files call each other, directly or
# through others. The graph is GCC's own (-fcallgraph-info at -O0: every direct call of
# the source, none inlined away); calls through a function pointer (the data-path table,
# the state table's rows) are not edges, which is the point of those tables. Also:
# conn_is_stream() only in the file that chooses the data-path table.
# Prints each offending call with its file and line.
#   scripts/check-proto-calls.sh [proto-dir]   (default exs/proto)
#   scripts/check-proto-calls.sh --self-test   (the check fails on a copy of exs/proto
#                                               given a call up, a cycle and a stray
#                                               conn_is_stream)
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --self-test ]; then
    t=$(mktemp -d)
    trap 'rm -rf "$t"' EXIT
    mkdir -p "$t/tree/exs"
    cp -r include "$t/tree/" && cp -r exs/proto exs/prov exs/util "$t/tree/exs/"
    # mem.c (layer 0) calls the core up; conn.c and mem.c then call each other
    printf '\nvoid exs__mem_selftest(struct exs_conn *c)\n{\n    exs__conn_kick_locked(c);\n}\n' \
        >>"$t/tree/exs/proto/mem.c"
    sed -i '1a #include "exs/proto/conn.h"' "$t/tree/exs/proto/mem.c"
    printf '\nstatic inline int conn_is_stream(const struct exs_conn *c) { return c->p.sock_type; }\n' \
        >>"$t/tree/exs/proto/dispatch.c"
    bash "$0" "$t/tree/exs/proto" >"$t/out" 2>&1 && { echo "check-proto-calls: self-test: passed a bad tree"; exit 1; }
    for want in "call up: mem.c (layer 0) calls exs__conn_kick_locked() of conn.c" \
                "conn.c -> mem.c:" "mem.c -> conn.c: exs__conn_kick_locked()" \
                "dispatch.c:"; do
        if ! grep -qF "$want" "$t/out"; then
            echo "check-proto-calls: self-test: no \"$want\" in:"; cat "$t/out"; exit 1
        fi
    done
    echo "check-proto-calls: self-test: 1 passed, 0 failed"
    exit 0
fi
dir=${1:-exs/proto}
spec=spec/proto-layout.md
cc=gcc # -fcallgraph-info is GCC's (whatever CC builds the tree)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
root=$(cd "$dir/../.." && pwd) # the tree dir belongs to: its headers

# the layer table: rows "| `file.c` | N | ..." of spec/proto-layout.md
sed -nE 's/^\| `([a-z_0-9]+\.c)` +\| +([0-9]+) +\|.*/\1 \2/p' "$spec" >"$tmp/layers"
for f in "$dir"/*.c; do
    b=$(basename "$f")
    if ! grep -q "^$b " "$tmp/layers"; then
        echo "check-proto-calls: $dir/$b has no layer in $spec"
        fail=1
    fi
    # the call graph of one file: GCC writes <dumpbase>.ci next to the object
    if ! "$cc" -D_GNU_SOURCE -I"$root/include" -I"$root" -std=gnu11 -O0 -pthread -fcallgraph-info \
        -c -o "$tmp/${b%.c}.o" "$f" 2>"$tmp/${b%.c}.err"; then
        echo "check-proto-calls: $f does not compile:"
        cat "$tmp/${b%.c}.err"
        exit 1
    fi
done

# "name file" for every function defined with external linkage, then "src-file dst-name
# where" for every call to a name not defined static in the calling file
for ci in "$tmp"/*.ci; do
    awk -v base="$(basename "${ci%.ci}").c" '
        /^node:/ && !/shape : ellipse/ {
            t = $0; sub(/.*title: "/, "", t); sub(/".*/, "", t)
            if (t !~ /:/) print "def", t, base
        }
        /^edge:/ {
            d = $0; sub(/.*targetname: "/, "", d); sub(/".*/, "", d)
            w = $0; sub(/.*label: "/, "", w); sub(/".*/, "", w)
            if (d !~ /:/) print "call", base, d, w
        }' "$ci"
done >"$tmp/graph"

awk -v layers="$tmp/layers" '
    BEGIN { while ((getline l < layers) > 0) { split(l, a, " "); layer[a[1]] = a[2] } }
    $1 == "def" { home[$2] = $3; next }
    $1 == "call" { calls[++n] = $2 " " $3 " " $4 }
    END {
        bad = 0
        for (i = 1; i <= n; i++) {
            split(calls[i], c, " ")
            src = c[1]; fn = c[2]; where = c[3]
            if (!(fn in home)) continue          # outside proto
            dst = home[fn]
            if (dst == src) continue
            print src, dst > "/dev/stderr"        # the file graph, for the cycle check
            if (layer[src] != "" && layer[dst] != "" && layer[src] + 0 < layer[dst] + 0) {
                printf "check-proto-calls: call up: %s (layer %s) calls %s() of %s (layer %s) at %s\n",
                       src, layer[src], fn, dst, layer[dst], where
                bad = 1
            }
        }
        exit bad
    }' "$tmp/graph" 2>"$tmp/edges" || fail=1

# a cycle between files (of one layer: calls up are reported above): each pair of
# files that call each other, with the calls both ways
if ! sort -u "$tmp/edges" | tsort >/dev/null 2>"$tmp/tsort"; then
    echo "check-proto-calls: files of $dir call each other (a cycle):"
    awk 'NR == FNR { if ($1 == "def") home[$2] = $3; next }
         $1 == "call" && ($3 in home) && home[$3] != $2 {
             k = $2 " -> " home[$3]
             if (!((k, $3) in seen)) { seen[k, $3] = 1; f[k] = f[k] " " $3 "()" }
             e[$2, home[$3]] = 1
         }
         END { for (k in f) { split(k, a, " -> "); if ((a[2], a[1]) in e) print "  " k ":" f[k] } }' \
        "$tmp/graph" "$tmp/graph" | sort
    fail=1
fi

# the data path is chosen once: conn_is_stream only where the table is chosen
chooser=$(sed -nE 's/^The data-path table is chosen in `([a-z_0-9]+\.[ch])`.*/\1/p' "$spec")
stray=$(grep -nw conn_is_stream "$dir"/*.c "$dir"/*.h | grep -v "^$dir/${chooser:-none}:")
if [ -n "$stray" ]; then
    echo "check-proto-calls: conn_is_stream outside ${chooser:-the chooser} (use the data-path table):"
    echo "$stray"
    fail=1
fi

if [ "$fail" != 0 ]; then
    echo "check-proto-calls: 0 passed, 1 failed"
    exit 1
fi
echo "check-proto-calls: 1 passed, 0 failed"
