#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run every sample over loopback on the tcp provider and check exit status and output:
# the porting steps (a server and two clients each), the fork-per-client server ported
# three ways, the libev + exs_qfd application,
# 1000 connections on one queue, the exs_sendfile file transfer, the SOCK_SEQPACKET echo
# pair and the provider demo.
# (stream_send/stream_recv have their own script, stream_smoke.sh.)
#   samples/samples_smoke.sh [build-dir]
set -u
build=${1:-build}
S=$build/samples
export EXS_PROVIDER=tcp
tmp=$(mktemp -d /tmp/exs-samples.XXXXXX)
spid=
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "samples_smoke: FAIL: $*" >&2
    for f in "$tmp"/*.log; do [ -s "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
    exit 1
}
# expect LOG REGEX: the log has a line matching REGEX
expect() { grep -Eq "$2" "$1" || fail "no line /$2/ in $(basename "$1")"; }

# start_server NAME CMD...: run a server printing "... on 127.0.0.1:PORT"; sets port and spid
start_server() {
    local name=$1 log=$tmp/$1.log
    shift
    : >"$log"
    timeout 120 "$@" >"$log" 2>&1 &
    spid=$!
    port=
    for _ in $(seq 400); do
        port=$(sed -n 's/^.* on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$log")
        [ -n "$port" ] && return 0
        kill -0 "$spid" 2>/dev/null || fail "$name exited before listening"
        sleep 0.05
    done
    fail "$name did not start"
}
# wait_server NAME: the server must exit 0
wait_server() {
    local rc=0
    wait "$spid" || rc=$?
    spid=
    [ "$rc" -eq 0 ] || fail "$1 exited $rc"
}

# Porting steps 0 and 2 (step 1, port_step1_*, is run by its own lines in module.mk): each
# server serves two clients (small and large messages), then exits.
for step in 0 2; do
    start_server "step${step}_server" "$S/port_step${step}_server" 0 2
    timeout 60 "$S/port_step${step}_client" "$port" 200 1000 >"$tmp/step${step}_c1.log" 2>&1 ||
        fail "port_step${step}_client (200 x 1000 B)"
    timeout 60 "$S/port_step${step}_client" "$port" 20 200000 >"$tmp/step${step}_c2.log" 2>&1 ||
        fail "port_step${step}_client (20 x 200000 B)"
    wait_server "port_step${step}_server"
    expect "$tmp/step${step}_c1.log" '^200 messages of 1000 bytes echoed and verified$'
    expect "$tmp/step${step}_c2.log" '^20 messages of 200000 bytes echoed and verified$'
    expect "$tmp/step${step}_server.log" '^served 2 connection\(s\)$'
    echo "samples_smoke: port_step${step}: 2 clients echoed and verified"
done

# The fork-per-client server (kernel sockets) and its three ports (samples/README.md,
# section 1b): each serves two clients at once, small and large messages.
# two_clients NAME CLIENT PORT1 PORT2: both clients at once, each must verify its echoes
two_clients() {
    local name=$1 client=$2 c1 c2
    timeout 60 "$S/$client" "$3" 200 1000 >"$tmp/${name}_c1.log" 2>&1 &
    c1=$!
    timeout 60 "$S/$client" "$4" 20 200000 >"$tmp/${name}_c2.log" 2>&1 &
    c2=$!
    wait "$c1" || fail "$name: $client (200 x 1000 B)"
    wait "$c2" || fail "$name: $client (20 x 200000 B)"
    expect "$tmp/${name}_c1.log" '^200 messages of 1000 bytes echoed and verified$'
    expect "$tmp/${name}_c2.log" '^20 messages of 200000 bytes echoed and verified$'
}
for way in fork0_server:port_step0_client fork_threads:port_step2_client \
    fork_exec:port_step0_client; do
    name=${way%%:*}
    start_server "$name" "$S/port_$name" 0 2
    two_clients "$name" "${way#*:}" "$port" "$port"
    wait_server "port_$name"
    expect "$tmp/$name.log" '^served 2 connection\(s\), 0 failed$'
done
expect "$tmp/fork_threads.log" '^thread: client 127\.0\.0\.1:[1-9][0-9]*$'
: >"$tmp/prefork.log"
timeout 120 "$S/port_fork_prefork" 2 1 >"$tmp/prefork.log" 2>&1 &
spid=$!
for _ in $(seq 400); do
    [ "$(grep -c '^worker [01] on ' "$tmp/prefork.log")" -eq 2 ] && break
    kill -0 "$spid" 2>/dev/null || fail "port_fork_prefork exited before listening"
    sleep 0.05
done
ports=$(sed -n 's/^worker [01] on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$tmp/prefork.log")
[ "$(echo "$ports" | wc -w)" -eq 2 ] || fail "port_fork_prefork: no two worker ports"
two_clients prefork port_step2_client $ports
wait_server port_fork_prefork
expect "$tmp/prefork.log" '^2 worker\(s\) served 1 connection\(s\) each, 0 failed$'
echo "samples_smoke: fork-per-client server and its ports (threads, exec, prefork): 2 clients each"

timeout 120 "$S/qfd_libev" 1000 >"$tmp/qfd.log" 2>&1 || fail "qfd_libev"
expect "$tmp/qfd.log" '^qfd_libev: 1000 messages echoed through a libev loop watching exs_qfd'
echo "samples_smoke: qfd_libev: 1000 messages through exs_qfd"

n=${SAMPLES_CONNS:-1000}
start_server many_server "$S/many_conns" server 0 "$n"
timeout 120 "$S/many_conns" client "$port" "$n" >"$tmp/many_client.log" 2>&1 || fail "many_conns client"
wait_server "many_conns server"
expect "$tmp/many_client.log" "^many_conns client: $n connections open, every echo verified$"
expect "$tmp/many_client.log" "^many_conns client: $n connections closed$"
expect "$tmp/many_server.log" "^many_conns server: $n connections served, $n open at once at the peak, 0 failed$"
echo "samples_smoke: many_conns: $n connections open at once on one queue"

bash samples/run-echo.sh "$build" >"$tmp/echo.log" 2>&1 || fail "run-echo.sh"
expect "$tmp/echo.log" '^2000 messages of 65536 bytes echoed and verified$'
echo "samples_smoke: seqpacket echo: 3 clients"

# file_xfer: a file of 5 MiB and an odd tail sent with exs_sendfile, written out by the
# receiver, compared byte for byte and by checksum
head -c $((5 * 1024 * 1024 + 4321)) /dev/urandom >"$tmp/xfer.in"
start_server file_xfer_recv "$S/file_xfer" recv "$tmp/xfer.out"
timeout 60 "$S/file_xfer" send "$port" "$tmp/xfer.in" >"$tmp/file_xfer_send.log" 2>&1 ||
    fail "file_xfer send"
wait_server "file_xfer recv"
cmp -s "$tmp/xfer.in" "$tmp/xfer.out" || fail "file_xfer: the received file differs"
[ "$(sha256sum <"$tmp/xfer.in")" = "$(sha256sum <"$tmp/xfer.out")" ] || fail "file_xfer: checksums differ"
expect "$tmp/file_xfer_send.log" "^file_xfer sender: $((5 * 1024 * 1024 + 4321)) bytes of .* sent$"
expect "$tmp/file_xfer_recv.log" "^file_xfer receiver: $((5 * 1024 * 1024 + 4321)) bytes written to "
echo "samples_smoke: file_xfer: 5 MiB sent with exs_sendfile, checksums equal"

timeout 120 "$S/prov_demo" -p tcp >"$tmp/prov.log" 2>&1 || fail "prov_demo"
expect "$tmp/prov.log" '^teardown .*both sides disconnected'
echo "samples_smoke: prov_demo"
echo "samples_smoke: every sample ran"
