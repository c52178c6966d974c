#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Symbol hygiene of the built libraries: libexs.so exports only public exs_* names (no
# exs__ internals), and libexs.a defines no global symbol outside the exs_/exs__ prefixes.
#   scripts/check-symbols.sh [build-dir]
set -u
build=${1:-build}
so=$build/libexs.so
a=$build/libexs.a
fail=0
for f in "$so" "$a"; do
    [ -e "$f" ] || { echo "check-symbols: $f missing (run make)" >&2; exit 1; }
done

# Dynamic table: defined symbols except the version node (type A, EXS_0).
dyn=$(nm -D --defined-only "$so" | awk 'NF == 3 && $2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
if ! grep -qx exs_init <<<"$dyn"; then
    echo "check-symbols: $so does not export exs_init: nm -D found nothing usable" >&2
    exit 1
fi
bad_dyn=$(grep -Ev '^exs_[a-z0-9]' <<<"$dyn" || true)
if [ -n "$bad_dyn" ]; then
    echo "check-symbols: $so exports names outside the public exs_* set:" >&2
    sed 's/^/    /' <<<"$bad_dyn" >&2
    fail=1
fi

# Static archive: global defined symbols of every member. Sanitizer builds add their own
# globals (__odr_asan.*, __asan_*, __ubsan_*, __tsan_*): those are the compiler's.
stat=$(nm -g --defined-only "$a" | awk 'NF == 3 { print $3 }' | sort -u)
if ! grep -qx exs_init <<<"$stat"; then
    echo "check-symbols: $a does not define exs_init: nm found nothing usable" >&2
    exit 1
fi
bad_stat=$(grep -Ev '^exs_|^__(odr_asan|asan|ubsan|tsan)' <<<"$stat" || true)
if [ -n "$bad_stat" ]; then
    n=$(wc -l <<<"$bad_stat")
    echo "check-symbols: $a defines $n global symbols outside exs_/exs__ (clashes with the" >&2
    echo "programs that link it; scripts/rename-internal.sh renames them):" >&2
    sed 's/^/    /' <<<"$bad_stat" >&2
    fail=1
fi
[ $fail -eq 0 ] || exit 1
echo "check-symbols: $(wc -l <<<"$dyn") exported names, all exs_*; libexs.a: $(wc -l <<<"$stat") globals, all exs_/exs__"
