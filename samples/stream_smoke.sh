#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Send a random 20 MiB file through stream_send -> stream_recv over loopback in each transfer
# mode (EXS_XFER_MODE), compare the end-to-end checksums and the files; nonzero on mismatch.
set -eu
build=${1:-build}
tmp=$(mktemp -d)
rpid=
cleanup() {
    [ -n "$rpid" ] && kill "$rpid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
head -c $((20 << 20)) /dev/urandom >"$tmp/in"

# Start the receiver on a random port; retry with another one if it cannot listen.
start_recv() {
    local tries log=$tmp/recv.log
    for tries in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 20000))
        rm -f "$tmp/out" "$log"
        timeout 120 "$build/samples/stream_recv" -p "$port" "$tmp/out" >"$log" 2>&1 &
        rpid=$!
        for _ in $(seq 100); do
            grep -q '^listening' "$log" 2>/dev/null && return 0
            kill -0 "$rpid" 2>/dev/null || break
            sleep 0.05
        done
        kill "$rpid" 2>/dev/null || true
        wait "$rpid" 2>/dev/null || true
        rpid=
    done
    echo "stream_smoke: stream_recv did not start:" >&2
    cat "$log" >&2
    return 1
}

for mode in dynamic direct indirect; do
    export EXS_XFER_MODE=$mode
    start_recv
    if ! timeout 120 "$build/samples/stream_send" -p "$port" -h 127.0.0.1 "$tmp/in" >"$tmp/send.log" 2>&1; then
        echo "stream_smoke ($mode): stream_send failed:" >&2
        cat "$tmp/send.log" >&2
        exit 1
    fi
    rc=0
    wait "$rpid" || rc=$?
    rpid=
    if [ "$rc" -ne 0 ]; then
        echo "stream_smoke ($mode): stream_recv exited $rc:" >&2
        cat "$tmp/recv.log" >&2
        exit 1
    fi
    sum_s=$(sed -n 's/^sent \([0-9]*\) bytes fnv1a64 \([0-9a-f]*\)$/\1 \2/p' "$tmp/send.log")
    sum_r=$(sed -n 's/^received \([0-9]*\) bytes fnv1a64 \([0-9a-f]*\)$/\1 \2/p' "$tmp/recv.log")
    if [ -z "$sum_s" ] || [ "$sum_s" != "$sum_r" ]; then
        echo "stream_smoke ($mode): checksum mismatch: sent '$sum_s', received '$sum_r'" >&2
        exit 1
    fi
    if ! cmp "$tmp/in" "$tmp/out"; then
        echo "stream_smoke ($mode): the received file differs" >&2
        exit 1
    fi
    echo "stream_smoke ($mode): 20 MiB, bytes and fnv1a64 $sum_s match, files identical"
done
