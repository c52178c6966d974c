#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run the SOCK_SEQPACKET echo server and client over loopback through the ES-API:
# small (eager), medium and large (zero-copy) messages, every byte checked.
set -eu
build=${1:-build}
port=$((20000 + RANDOM % 20000))
"$build/samples/seqpacket_echo_server" "$port" 3 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 0.3
for size in 64 4000 65536; do
    timeout 60 "$build/samples/seqpacket_echo_client" "$port" 2000 "$size"
done
wait $srv
trap - EXIT
