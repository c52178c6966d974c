#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rxe-vm.sh: run a command inside a throw-away qemu guest that has a real Soft-RoCE device.
#
#   scripts/rxe-vm.sh DIR COMMAND [ARG...]
#
# The guest boots Debian's own kernel (package linux-image-amd64, which ships rdma_rxe.ko)
# under qemu-system-x86_64 with TCG (no KVM needed), from an initramfs made of the host's
# Debian userspace: busybox-static, iproute2's `rdma`, ibverbs-utils, rdmacm-utils,
# libibverbs with its rxe provider, and the shared libraries all of them need. Its /init
# loads the modules, puts eth0 on 10.0.2.15/24 (qemu user networking), creates rxe0 on it,
# waits until rxe0's port is ACTIVE, prints `rdma link` and `ibv_devinfo -d rxe0`, then runs
# COMMAND in a copy of DIR ('-' for none) at /guest. COMMAND's stdout and stderr are
# streamed here while it runs; this script exits with COMMAND's status.
#
# A single COMMAND word containing spaces is run as a shell command line (busybox sh);
# several words are run as one command with those arguments.
#
# Exit status: COMMAND's own, or
#   2    usage error, missing packages (as non-root), unusable host setup
#   3    the guest failed before COMMAND ran: boot failure, rxe0 never ACTIVE, panic
#   124  the time limit (RXE_VM_TIMEOUT) ran out
#
# Environment:
#   BUILD=build            the base initramfs is cached in $BUILD/rxe-vm/ (rebuilt when
#                          this script, the kernel or any host file put into it changes)
#   RXE_VM_TIMEOUT=2700    hard limit in seconds for the whole run (install, build, boot,
#                          command); the guest kills COMMAND a little before it
#   RXE_VM_MEM=2G  RXE_VM_SMP=2  guest memory and CPUs
#   RXE_VM_KVER=<version>  kernel under /lib/modules (default: newest with rdma_rxe.ko)
#   RXE_VM_BINS="gdb ..."  more host programs (with their libraries) for the guest
#   RXE_VM_QEMU_ARGS="..." more qemu arguments (word-split), e.g. a second NIC on a link to
#                          another guest (scripts/rxe-2host.sh)
#   RXE_VM_APPEND="..."    more guest kernel arguments, e.g. "clocksource=tsc tsc=reliable"
#                          (the benchmarks' clock: spec/rxe-vm.md, "The guest's clock")
#   RXE_VM_CONSOLE=1       also stream the guest kernel console to stderr
#   RXE_VM_NO_INSTALL=1    never apt-get install (default: install missing packages as root)
#
# Facts this relies on (see spec/rxe-vm.md): rxe's ICRC needs the crc32 crypto module and
# the guest has no modprobe to request it, so crc32_generic is loaded first; glibc dlopen()s
# libgcc_s.so.1 for pthread_exit/pthread_cancel and ldd does not list it; rdma_cm between
# two processes in the guest must use 10.0.2.15 (127.0.0.1 fails route resolution, ENODEV).
set -euo pipefail

me=rxe-vm
say() { echo "$me: $*" >&2; }
die() { say "$*"; exit 2; }
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }

[ $# -ge 2 ] || die "usage: $0 DIR|- COMMAND [ARG...]"
guest_dir=$1
shift
[ "$guest_dir" = - ] || [ -d "$guest_dir" ] || die "not a directory: $guest_dir"

limit=${RXE_VM_TIMEOUT:-2700}
mem=${RXE_VM_MEM:-2G}
smp=${RXE_VM_SMP:-2}
cache=${BUILD:-build}/rxe-vm
# Sets L to the seconds left before the hard limit (exits 124 when none are): every
# blocking step below is bounded by it.
left() {
    L=$((limit - $(elapsed)))
    [ $L -gt 0 ] || { say "time limit of ${limit}s reached"; exit 124; }
}

# ---- host packages ---------------------------------------------------------------------
pkgs=(qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-utils
      ibverbs-providers rdmacm-utils iproute2 cpio kmod)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    line="apt-get install -y --no-install-recommends ${missing[*]}"
    if [ "$(id -u)" -ne 0 ] || [ -n "${RXE_VM_NO_INSTALL:-}" ]; then
        say "missing Debian packages: ${missing[*]}"
        say "run as root:  apt-get update && $line"
        exit 2
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    left; timeout "$L" apt-get update -qq >&2 || die "apt-get update failed"
    left; timeout "$L" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        die "apt-get install failed"
fi

# ---- the guest kernel --------------------------------------------------------------------
# The newest /lib/modules/<v> that has rdma_rxe.ko and a /boot/vmlinuz-<v> (version sort).
kver=${RXE_VM_KVER:-}
if [ -z "$kver" ]; then
    for v in $(find /lib/modules -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V); do
        d=/lib/modules/$v
        [ -e "/boot/vmlinuz-$v" ] && [ -n "$(find "$d" -name 'rdma_rxe.ko*' -print -quit)" ] && kver=$v
    done
fi
[ -n "$kver" ] || die "no Debian kernel with rdma_rxe.ko (apt-get install linux-image-amd64)"
kernel=/boot/vmlinuz-$kver
[ -r "$kernel" ] || die "$kernel is not readable (run as root, or make it readable)"

# ---- what goes into the base initramfs ---------------------------------------------------
# files[guest path]=host path. Binaries and their libraries keep their host paths, so
# libibverbs finds /etc/libibverbs.d and its compiled-in provider directory as on the host.
declare -A files=()
add() { files[${2:-$1}]=$1; }
# Every library an ELF file loads, by ldd (transitive). Unresolved ones are reported.
add_libs() {
    local out
    out=$(ldd "$1" 2>/dev/null) || return 0  # static executables: nothing to add
    grep -q 'not found' <<<"$out" && say "warning: $1: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
    while read -r lib; do add "$lib"; done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}
                                                      $1 ~ /^\//                {print $1}' <<<"$out")
}
bb=$(command -v busybox) || die "busybox not found (apt-get install busybox-static)"
ldd "$bb" >/dev/null 2>&1 && die "$bb is dynamically linked: install busybox-static"
add "$bb" /bin/busybox
for b in rdma ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rping ucmatose udaddy \
         ${RXE_VM_BINS:-}; do
    p=$(command -v "$b") || die "$b not found on the host"
    add "$p"
    add_libs "$p"
done
# libibverbs dlopen()s a provider named by /etc/libibverbs.d/<name>.driver ("driver rxe")
# from its compiled-in directory: ldd sees neither, so both are added explicitly.
add /etc/libibverbs.d/rxe.driver
prov=$(find /usr/lib /lib -name 'librxe-rdmav*.so' -print -quit 2>/dev/null)
[ -n "$prov" ] || die "librxe-rdmav*.so not found (apt-get install ibverbs-providers)"
add "$prov"
add_libs "$prov"
# glibc loads libgcc_s.so.1 at run time (pthread_exit, pthread_cancel, C++ unwinding).
# (awk reads all of ldconfig's output: an early exit would SIGPIPE it under pipefail.)
gcc_s=$(ldconfig -p | awk '/libgcc_s\.so\.1 .*x86-64/ && !f {f = $NF} END {print f}')
[ -n "$gcc_s" ] || die "libgcc_s.so.1 not found"
add "$gcc_s"
# Kernel modules, dependencies first (kmod resolves modules.dep for the guest's version).
# crc32_generic: rxe computes its ICRC with the crypto "crc32" algorithm, normally loaded
# on demand through modprobe, which the guest does not have. rdma_ucm gives
# /dev/infiniband/rdma_cm (librdmacm); ib_uverbs gives /dev/infiniband/uverbs0.
mods=()
for m in crc32_generic virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm; do
    deps=$(modprobe -S "$kver" --show-depends "$m") || die "module $m not found for $kver"
    while read -r verb path; do
        [ "$verb" = insmod ] || continue
        case " ${mods[*]-} " in *" $path "*) ;; *) mods+=("$path") ;; esac
    done <<<"$deps"
done
for m in "${mods[@]}"; do add "$m" "/modules/$(basename "$m")"; done

# ---- build (or reuse) the base initramfs ---------------------------------------------------
# The cache key covers this script, the kernel, the module order and every host file's
# path, size and mtime: a package upgrade or an edit here rebuilds it.
mkdir -p "$cache"
key=$( {
    sha256sum "$0" "$kernel"
    printf '%s\n' "${mods[@]}"
    for g in "${!files[@]}"; do stat -L -c "$g %n %s %Y" "${files[$g]}"; done | sort
} | sha256sum | cut -d' ' -f1)
base=$cache/base.cpio
if [ "$(cat "$cache/base.key" 2>/dev/null)" != "$key" ] || [ ! -s "$base" ]; then
    say "building the base initramfs in $cache (kernel $kver)"
    root=$(mktemp -d "$cache/root.XXXXXX")
    # Debian 12's merged /usr: /bin, /sbin, /lib, /lib64 are links into /usr.
    mkdir -p "$root"/usr/{bin,sbin,lib,lib64} "$root"/{etc,proc,sys,dev,tmp,run,root,guest,modules}
    for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
    for g in "${!files[@]}"; do
        dst=$root${g/#\/bin\//\/usr\/bin\/}  # keep merged-/usr links intact
        [[ $g == /lib/* || $g == /lib64/* || $g == /sbin/* ]] && dst=$root/usr$g
        [[ $g == /modules/* ]] && dst=$root$g
        mkdir -p "$(dirname "$dst")"
        case ${files[$g]} in     # busybox insmod wants an uncompressed module
            *.ko.xz) xz -dc "${files[$g]}" >"${dst%.xz}" ;;
            *.ko.zst) zstd -qdc "${files[$g]}" >"${dst%.zst}" ;;
            *) cp -L "${files[$g]}" "$dst" ;;
        esac
    done
    for m in "${mods[@]}"; do basename "${m%.xz}" | sed 's/\.zst$//'; done >"$root/modules/order"
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
    printf '127.0.0.1 localhost\n10.0.2.15 rxe-vm\n' >"$root/etc/hosts"
    # The guest's PID 1. It reports on ttyS2 ("active N", "status N": never mixed with the
    # command's output on ttyS1); the kernel console is ttyS0.
    cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s   # applets as links; never replaces the real programs copied in
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
stty -F /dev/ttyS1 raw -echo; stty -F /dev/ttyS2 raw -echo   # no \n -> \r\n on the way out
report() { echo "$*" >/dev/ttyS2; }
# Fatal setup errors: show why on the output stream, then power off with status 3.
fail() {
    { echo "rxe-vm guest: $*"; dmesg | tail -n 25; } >/dev/ttyS1 2>&1
    report "status 3"; sync; poweroff -f
}
# IPv6 duplicate address detection would hold back the link-local GID for a second or two.
echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad
for m in $(cat /modules/order); do insmod /modules/$m || fail "insmod $m failed"; done
i=0; while [ ! -e /sys/class/net/eth0 ]; do
    i=$((i + 1)); [ $i -le 100 ] || fail "no eth0"; sleep 0.1
done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up || fail "cannot configure eth0"
ip route add default via 10.0.2.2
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"
i=0; until ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; do
    i=$((i + 1)); [ $i -le 300 ] || fail "rxe0 never became ACTIVE"; sleep 0.1
done
report "active $(cut -d' ' -f1 /proc/uptime)"
ulimit -l unlimited
cmd_timeout=$(cat /rxe-vm/timeout)
{
    echo "=== rxe-vm: rdma link"; rdma link
    echo "=== rxe-vm: ibv_devinfo -d rxe0"; ibv_devinfo -d rxe0
    echo "=== rxe-vm: running in /guest (limit ${cmd_timeout}s): $(cat /rxe-vm/cmd)"
} >/dev/ttyS1 2>&1
cd /guest
# In its own session: a killpg(0, ...) in the command cannot reach this script.
timeout -s KILL "$cmd_timeout" setsid sh /rxe-vm/cmd </dev/null >/dev/ttyS1 2>&1
rc=$?
[ $rc -eq 137 ] && { echo "rxe-vm guest: command killed after ${cmd_timeout}s" >/dev/ttyS1; rc=124; }
sync
report "status $rc"
poweroff -f
INIT
    chmod 755 "$root/init"
    # Uncompressed: under TCG, decompressing in the guest costs more than qemu loading it.
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$base.tmp"
    mv "$base.tmp" "$base"
    echo "$key" >"$cache/base.key"
    rm -rf "$root"
    say "base initramfs: $(du -h "$base" | cut -f1) in $(elapsed)s"
fi

# ---- the per-run part: DIR, its libraries and the command ------------------------------
run=$(mktemp -d "$cache/run.XXXXXX")
qemu_pid=
# Never leave qemu behind: kill it (pidfile, written by qemu itself) on any exit.
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local p
    for p in "$(cat "$run/qemu.pid" 2>/dev/null)" "$qemu_pid"; do
        if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null || true; fi
    done
    rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
mkdir -p "$run/root/guest" "$run/root/rxe-vm"
if [ "$guest_dir" != - ]; then
    cp -a "$guest_dir"/. "$run/root/guest/"
    # Libraries the caller's programs load, at their host paths, unless the base has them.
    declare -A have=()
    while read -r f; do [ -z "$f" ] || have[$f]=1; done < <(cpio -it --quiet <"$base" | sed 's|^\.||')
    while IFS= read -r -d '' f; do
        [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
        files=()
        add_libs "$f"
        for lib in "${!files[@]}"; do
            g=$lib
            [[ $g == /lib/* || $g == /lib64/* ]] && g=/usr$g
            [ -n "${have[$g]:-}" ] && continue
            mkdir -p "$run/root$(dirname "$g")"
            cp -L "$lib" "$run/root$g"
        done
    done < <(find "$guest_dir" -type f -print0)
fi
# The command: one word is a shell command line; several are quoted one by one.
if [ $# -eq 1 ]; then
    printf '%s\n' "$1" >"$run/root/rxe-vm/cmd"
else
    for a in "$@"; do printf "'%s' " "${a//\'/\'\\\'\'}"; done >"$run/root/rxe-vm/cmd"
    echo >>"$run/root/rxe-vm/cmd"
fi
# The guest kills the command early enough for the guest to report and power off.
left
echo $((L > 240 ? L - 60 : L * 3 / 4)) >"$run/root/rxe-vm/timeout"
# The kernel unpacks concatenated cpio archives in order: the base, then this run's files.
(cd "$run/root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$run/run.cpio"
cat "$base" "$run/run.cpio" >"$run/initrd"
rm -rf "$run/root"

# ---- boot ---------------------------------------------------------------------------------
: >"$run/console"; : >"$run/out"; : >"$run/report"
boot=$(date +%s)
left
say "booting $kver (tcg, -smp $smp -m $mem, ${L}s left)"
timeout -k 5 "$L" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -M q35 \
    -m "$mem" -smp "$smp" -nodefaults -nographic -no-reboot \
    -kernel "$kernel" -initrd "$run/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check rdinit=/init${RXE_VM_APPEND:+ $RXE_VM_APPEND}" \
    -serial "file:$run/console" -serial "file:$run/out" -serial "file:$run/report" \
    -netdev user,id=net0 -device virtio-net-pci,netdev=net0,romfile= ${RXE_VM_QEMU_ARGS:-} \
    -pidfile "$run/qemu.pid" </dev/null >"$run/qemu.log" 2>&1 &
qemu_pid=$!
[ -n "${RXE_VM_CONSOLE:-}" ] && tail -s 0.2 -f --pid=$qemu_pid "$run/console" >&2 &
tail -s 0.2 -f --pid=$qemu_pid "$run/out"   # the command's output, live
qrc=0
wait $qemu_pid || qrc=$?
qemu_pid=
wait || true   # the console tail

active=$(sed -n 's/^active //p' "$run/report" | tr -d '\r')
status=$(sed -n 's/^status //p' "$run/report" | tr -d '\r' | tail -n 1)
when=${active:+at ${active}s guest uptime}
say "kernel $kver: rxe0 ACTIVE ${when:-never}, qemu $(($(date +%s) - boot))s, total $(elapsed)s"
if [ -z "$status" ]; then
    [ $qrc -eq 124 ] && { say "time limit of ${limit}s reached: qemu killed"; exit 124; }
    say "the guest reported no status (qemu exit $qrc); console and qemu log:"
    tail -n 40 "$run/console" "$run/qemu.log" >&2 || true
    exit 3
fi
[ "$status" -eq 3 ] && [ -z "$active" ] && say "guest setup failed before the command ran"
exit "$status"
