#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Porting step 1 end to end: the ported client (exs_send on its kernel socket, stopped by
# SIGALRM) against the plain blocking server; nonzero unless both report every byte intact.
set -eu
build=${1:-build}
tmp=$(mktemp -d)
spid=
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# the log exists before the server starts: the background job opens it only when it runs,
# and a sed on a missing file would end this script (set -e) with sed's status 2
: >"$tmp/server.log"
timeout 120 "$build/samples/port_step1_server" >"$tmp/server.log" 2>&1 &
spid=$!
port=
for _ in $(seq 200); do
    port=$(sed -n 's/^listening \([0-9]*\)$/\1/p' "$tmp/server.log" 2>/dev/null)
    [ -n "$port" ] && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.05
done
if [ -z "$port" ]; then
    echo "port_step1: the server did not start" >&2
    cat "$tmp/server.log" >&2
    exit 1
fi
rc=0
timeout 120 "$build/samples/port_step1_client" -p "$port" -t 500 || rc=$?
wait "$spid" || rc=$?
spid=
cat "$tmp/server.log"
if [ "$rc" != 0 ]; then
    echo "port_step1: FAILED" >&2
    exit 1
fi
echo "port_step1: passed"
