#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run the SOCK_SEQPACKET echo server and client over loopback through the ES-API:
# small (eager), medium and large (zero-copy) messages, every byte checked.
set -eu
build=${1:-build}
log=$(mktemp)
# port 0: the server takes an ephemeral port and names it on its first line
"$build/samples/seqpacket_echo_server" 0 3 >"$log" &
srv=$!
trap 'kill $srv 2>/dev/null || true; rm -f "$log"' EXIT
port=
for _ in $(seq 200); do
    port=$(sed -n 's/^echo server on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 $srv 2>/dev/null || { echo "run-echo: the server exited" >&2; exit 1; }
    sleep 0.05
done
[ -n "$port" ] || { echo "run-echo: the server did not start" >&2; exit 1; }
for size in 64 4000 65536; do
    timeout 60 "$build/samples/seqpacket_echo_client" "$port" 2000 "$size"
done
wait $srv
trap - EXIT
rm -f "$log"
