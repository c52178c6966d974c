#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make check: exs_send on a kernel TCP socket makes no system call of the library's own
# (issue 27): strace -c -f of kfd_bench --only exs (N sends of 64 B, one outstanding)
# must count N sends (sendto: send(); sendmsg: the queued sends written together) and, of
# the calls the library used to make per send and dequeue
# (fcntl, getsockopt and fstat to check the descriptor, epoll_wait to drive progress
# before taking an event already queued), fewer than N/4 for the whole run (a few per
# wait for a full socket buffer are fine; one per send is not). Prints a Check
# summary line (tests/run-checks.sh); a SKIP when strace cannot trace here.
set -u
bench=$1
n=${2:-3000}
if ! command -v strace >/dev/null 2>&1 || ! strace -f -o /dev/null true 2>/dev/null; then
    echo "SKIP kfd_syscalls: strace is missing or cannot trace here"
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# LeakSanitizer cannot run under ptrace: an AddressSanitizer build is traced without it
if ! ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
    strace -f -c -o "$out" "$bench" --only exs --size 64 --count "$n"; then
    echo "kfd_syscalls: kfd_bench failed"
    echo "0%: Checks: 1, Failures: 1, Errors: 0"
    exit 1
fi
count() { awk -v c="$1" '$NF == c { print ($4 ~ /^[0-9]+$/) ? $4 : $5 }' "$out" | head -n 1; }
st=$(count sendto)
sm=$(count sendmsg)
sends=$((${st:-0} + ${sm:-0}))
checks=0
for c in fcntl getsockopt fstat newfstatat statx epoll_wait ppoll; do
    v=$(count $c)
    echo "kfd_syscalls: $c ${v:-0}"
    checks=$((checks + ${v:-0}))
done
limit=$((n / 4))
echo "kfd_syscalls: $n exs_send: sendto + sendmsg ${sends:-0}, other calls of the library $checks (fewer than $limit allowed)"
if [ "${sends:-0}" -ge "$n" ] && [ "$checks" -lt "$limit" ]; then
    echo "100%: Checks: 1, Failures: 0, Errors: 0"
    exit 0
fi
cat "$out"
echo "0%: Checks: 1, Failures: 1, Errors: 0"
exit 1
