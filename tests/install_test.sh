#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make install into a temporary DESTDIR: the exact list of files, the soname links, a
# program outside the tree built with pkg-config against that copy (shared, then static)
# and run over loopback on the tcp provider; then make uninstall leaves no file behind.
#   [SANFLAGS=-fsanitize=...] tests/install_test.sh [build-dir]
# A sanitizer build's library needs the program built with the same SANFLAGS.
set -u
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/exs-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
prefix=/opt/exs
root=$dest$prefix
ver=$(sed -n 's/^VERSION *:= *//p' "$top/GNUmakefile")
major=${ver%%.*}
export EXS_PROVIDER=tcp
fail() {
    echo "install_test: FAIL: $*" >&2
    exit 1
}
mk() { make -s --no-print-directory -C "$top" BUILD="$build" PREFIX="$prefix" DESTDIR="$dest" "$@"; }

mk install >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "make install"; }

# 1. exactly these files and links
want=$( (
    printf '%s\n' bin/blast bin/exsctl include/exs.h include/sys/exs.h lib/libexs.a \
        lib/libexs.so "lib/libexs.so.$major" "lib/libexs.so.$ver" lib/pkgconfig/exs.pc
    for p in "$top"/man/man1/*.1; do [ -e "$p" ] && echo "share/man/man1/${p##*/}"; done
    for p in "$top"/man/man3/*.3; do [ -e "$p" ] && echo "share/man/man3/${p##*/}"; done
    for p in "$top"/man/man7/*.7; do [ -e "$p" ] && echo "share/man/man7/${p##*/}"; done
) | sort)
got=$(cd "$root" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)
extra=$(find "$dest" \( -type f -o -type l \) ! -path "$root/*" | sort)
[ "$got" = "$want" ] && [ -z "$extra" ] ||
    fail "installed files differ (< wanted, > installed): $(diff <(echo "$want") <(echo "$got"; echo "$extra"))"
[ "$(ls "$top"/man/man3/*.3 2>/dev/null | wc -l)" -gt 0 ] || fail "no man3 page to install"
[ -x "$root/bin/exsctl" ] && [ -x "$root/bin/blast" ] || fail "tools not executable"
"$root/bin/exsctl" params >/dev/null || fail "installed exsctl does not run"

# 2. soname and links
[ "$(readlink "$root/lib/libexs.so")" = "libexs.so.$major" ] || fail "libexs.so -> $(readlink "$root/lib/libexs.so")"
[ "$(readlink "$root/lib/libexs.so.$major")" = "libexs.so.$ver" ] || fail "libexs.so.$major -> $(readlink "$root/lib/libexs.so.$major")"
[ -f "$root/lib/libexs.so.$ver" ] && [ ! -L "$root/lib/libexs.so.$ver" ] || fail "libexs.so.$ver is not a file"
soname=$(readelf -d "$root/lib/libexs.so.$ver" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libexs.so.$major" ] || fail "soname '$soname'"
grep -q "^prefix=$prefix\$" "$root/lib/pkgconfig/exs.pc" || fail "exs.pc does not name prefix $prefix"

# 3. an outside program, built with pkg-config against the DESTDIR copy (sysroot)
export PKG_CONFIG_PATH=$root/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_LIBDIR=$root/lib/pkgconfig
pkg-config --exists exs || fail "pkg-config does not find exs"
cflags=$(pkg-config --cflags exs) libs=$(pkg-config --libs exs)
cflags=${cflags% }
[ "$cflags" = "-I$root/include" ] || fail "pkg-config --cflags: '$cflags'"
mkdir "$tmp/prog" && cp "$top/tests/install/outside.c" "$tmp/prog/prog.c"
cd "$tmp/prog" || fail "cd"
# shellcheck disable=SC2086
cc -Wall -Werror ${SANFLAGS:-} prog.c $cflags $libs -o prog-shared 2>"$tmp/cc.log" || { cat "$tmp/cc.log" >&2; fail "shared build: cc prog.c $cflags $libs"; }
readelf -d prog-shared | grep -q "NEEDED.*\\[libexs\\.so\\.$major\\]" || fail "prog-shared does not need libexs.so.$major"
out=$(LD_LIBRARY_PATH=$root/lib timeout 60 ./prog-shared 2>&1) || fail "prog-shared: $out"
echo "$out" | grep -qx "outside: 'hello from outside' echoed; exs_init from $root/lib/libexs.so.$major" ||
    fail "prog-shared ran with another library: $out"
# static: the archive by name, its dependencies from Libs.private
slibs=$(pkg-config --static --libs exs)
slibs=${slibs/-lexs/-l:libexs.a}
# shellcheck disable=SC2086
cc -Wall -Werror ${SANFLAGS:-} prog.c $cflags $slibs -o prog-static 2>"$tmp/cc.log" || { cat "$tmp/cc.log" >&2; fail "static build: cc prog.c $cflags $slibs"; }
! readelf -d prog-static | grep -q 'NEEDED.*libexs' || fail "prog-static needs libexs.so"
out=$(timeout 60 ./prog-static 2>&1) || fail "prog-static: $out"
echo "$out" | grep -qx "outside: 'hello from outside' echoed; exs_init from .*prog-static" ||
    fail "prog-static: $out"
cd "$top" || fail "cd"

# 4. uninstall removes every file it installed
mk uninstall >"$tmp/uninstall.log" 2>&1 || { cat "$tmp/uninstall.log" >&2; fail "make uninstall"; }
left=$(find "$dest" \( -type f -o -type l \))
[ -z "$left" ] || fail "left after make uninstall: $left"
echo "install_test: $(wc -l <<<"$want") files installed under DESTDIR$prefix, soname links ok," \
    "outside program built with pkg-config (shared and static) ran, uninstall left nothing"
