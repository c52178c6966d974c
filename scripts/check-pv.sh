#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every protocol violation named (issue 25, spec/protocol.md §10): in exs/proto, -EPROTO comes
# only from exs__proto_violation (violation.c). An EPROTO anywhere else in proto's code is a
# bypass: the connection would reset with no reason recorded. A site that only forwards a
# callee's error returns it as it is (`return ret`: the callee recorded); a local failure
# (memory, the budget) returns its own errno, never EPROTO. The check fails on any bypass.
#   scripts/check-pv.sh              check
#   scripts/check-pv.sh --list       the bypasses now, one "file:line function" each
#   scripts/check-pv.sh --self-test  plant a bypass in a copy of exs/proto: the check must fail
set -u
cd "$(dirname "$0")/.."

# "file:line function" per EPROTO token in code (comments and strings stripped) of every
# source of the proto directory $1 but violation.c. A function starts at a column-0 line
# naming one.
sites() {
    for f in "$1"/*.c "$1"/*.h; do
        case $f in */violation.[ch]) continue ;; esac
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

# The check of the proto directory $1: 0 when no bypass, else the sites and 1.
check_dir() {
    local now
    now=$(sites "$1")
    [ -z "$now" ] && return 0
    echo "check-pv: $(wc -l <<<"$now") -EPROTO bypassing exs__proto_violation:"
    sed 's/^/    /' <<<"$now"
    echo "check-pv: a -EPROTO in exs/proto must be 'return exs__proto_violation(conn, EXS_PV_<rule>," \
         "<record>, \"...\")' (exs/proto/violation.h), or pass on a callee's return"
    return 1
}

case ${1:-} in
--list) sites exs/proto; exit 0 ;;
--self-test)
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
    cp exs/proto/*.[ch] "$tmp"/
    check_dir "$tmp" >/dev/null || { echo "check-pv: self-test: the tree has bypasses already"; exit 1; }
    # a bypass planted in a handler, and one in a comment and a string (not bypasses)
    printf '%s\n' '/* return -EPROTO; */' 'static int pv_planted(int x)' '{' \
        '    const char *s = "EPROTO";' '    (void)s;' '    return x ? -EPROTO : 0;' '}' >>"$tmp/dispatch.c"
    out=$(check_dir "$tmp") && { echo "check-pv: self-test: a planted bypass was not found"; exit 1; }
    if [ "$(grep -c ' pv_planted$' <<<"$out")" != 1 ] || [ "$(grep -c '^    ' <<<"$out")" != 1 ]; then
        echo "check-pv: self-test: the planted bypass reported wrong:"; echo "$out"; exit 1
    fi
    echo "check-pv: self-test: a planted bypass fails the check"
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

if ! check_dir exs/proto; then
    echo "check-pv: 0 passed, 1 failed"
    exit 1
fi
echo "check-pv: no -EPROTO in exs/proto bypasses exs__proto_violation"
echo "check-pv: 1 passed, 0 failed"
