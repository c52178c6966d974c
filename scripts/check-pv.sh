#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every protocol violation named (issue 25, spec/protocol.md §10): in exs/proto, -EPROTO comes
# only from exs__proto_violation (violation.c). An EPROTO anywhere else in proto's code is a
# bypass: the connection would reset with no reason recorded. Sites not converted yet are
# listed in scripts/pv-baseline.txt ("function count", by function so that moving a function
# to another file does not matter); the check fails when a function has more bypasses than
# its line allows (a new one), and says when a line allows more than are left (lower it:
# the list only shrinks, to empty).
#   scripts/check-pv.sh            check
#   scripts/check-pv.sh --list     the bypasses now, one "file:line function" each
#   scripts/check-pv.sh --update   rewrite the baseline's counts from the tree (after a
#                                  restructure renamed functions; review the diff)
set -u
cd "$(dirname "$0")/.."
base=scripts/pv-baseline.txt

# "file:line function" per EPROTO token in code (comments and strings stripped) of every
# exs/proto source but violation.c. A function starts at a column-0 line naming one.
sites() {
    for f in exs/proto/*.c exs/proto/*.h; do
        case $f in exs/proto/violation.[ch]) continue ;; esac
        awk -v file="$f" '
        {
            line = $0; code = ""
            while (length(line)) {
                if (incom) {
                    e = index(line, "*/"); if (!e) { line = ""; break }
                    line = substr(line, e + 2); incom = 0; continue
                }
                s = index(line, "/*"); d = index(line, "//")
                if (d && (!s || d < s)) { code = code substr(line, 1, d - 1); break }
                if (!s) { code = code line; break }
                code = code substr(line, 1, s - 1); line = substr(line, s + 2); incom = 1
            }
            gsub(/"([^"\\]|\\.)*"/, "\"\"", code)
            if (code ~ /^[A-Za-z_][A-Za-z0-9_ \t*]*\(/ && code !~ /;[ \t]*$/ && code !~ /^(if|for|while|switch|return)\b/) {
                fn = code; sub(/\(.*/, "", fn); n = split(fn, w, /[ \t*]+/); func_ = w[n]
            }
            t = code
            while (match(t, /(^|[^A-Za-z0-9_])EPROTO([^A-Za-z0-9_]|$)/)) {
                print file ":" FNR " " (func_ == "" ? "(file scope)" : func_)
                t = substr(t, RSTART + RLENGTH)
            }
        }' "$f"
    done
}

counts() { sites | awk '{ n[$2]++ } END { for (f in n) print f, n[f] }' | sort; }

case ${1:-} in
--list) sites; exit 0 ;;
--update)
    { sed -n '/^#/p' "$base"; counts; } >"$base.new" && mv "$base.new" "$base"
    echo "check-pv: $base rewritten ($(counts | awk '{ s += $2 } END { print s + 0 }') bypasses)"
    exit 0 ;;
esac

# The rule table of violation.h and the one of spec/protocol.md §10 name the same rules in
# the same order.
code_rules=$(grep -oE '^ *X\([A-Z_]+, "[a-z-]+"' exs/proto/violation.h | sed 's/.*"\(.*\)"/\1/')
spec_rules=$(sed -n '/^## 10\. Protocol violations/,/^## /p' spec/protocol.md |
             grep -oE '^\| `[a-z-]+` \|' | sed 's/| `\(.*\)` |/\1/')
if [ "$code_rules" != "$spec_rules" ] || [ -z "$code_rules" ]; then
    echo "check-pv: the rules of exs/proto/violation.h and spec/protocol.md §10 differ:"
    diff <(echo "$code_rules") <(echo "$spec_rules")
    echo "check-pv: 0 passed, 1 failed"
    exit 1
fi

now=$(counts)
allowed=$(grep -v '^#' "$base" | awk 'NF == 2')
fail=0 stale=
while read -r fn n; do
    [ -n "$fn" ] || continue
    a=$(awk -v f="$fn" '$1 == f { print $2 }' <<<"$allowed")
    if [ -z "$a" ] || [ "$n" -gt "$a" ]; then
        echo "check-pv: $fn: $n -EPROTO bypassing exs__proto_violation (allowed ${a:-0}):"
        sites | awk -v f="$fn" '$2 == f { print "    " $1 }'
        fail=1
    fi
done <<<"$now"
while read -r fn a; do
    [ -n "$fn" ] || continue
    n=$(awk -v f="$fn" '$1 == f { print $2 }' <<<"$now")
    if [ "${n:-0}" -lt "$a" ]; then
        echo "check-pv: note: $fn has ${n:-0} bypasses left, $base allows $a: lower it"
        stale=1
    fi
done <<<"$allowed"
total=$(awk '{ s += $2 } END { print s + 0 }' <<<"$now")
if [ $fail -ne 0 ]; then
    echo "check-pv: a -EPROTO in exs/proto must be 'return exs__proto_violation(conn, EXS_PV_<rule>," \
         "<record>, \"...\")' (exs/proto/violation.h), or pass on a callee's return"
    echo "check-pv: 0 passed, 1 failed"
    exit 1
fi
echo "check-pv: $total bypasses left, all in $base${stale:+ (some lines may be lowered)}"
echo "check-pv: 1 passed, 0 failed"
