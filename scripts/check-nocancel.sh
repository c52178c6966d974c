#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# No cancellation point inside the library (spec/threading.md, "Thread cancellation"):
# exs/ makes its system calls through exs/util/nocancel.h (syscall(2), no cancellation
# point), never through the libc calls that are cancellation points, nor rdma-core's
# posts except through the verbs provider's wrappers. A line allowed to make one says so
# in a comment on it ("nocancel: ok": the wait's sleep, a call with cancellation off, a
# library thread of its own). Prints each offending line.
#   scripts/check-nocancel.sh [dir]      (default exs)
#   scripts/check-nocancel.sh --self-test (the check fails on a copy given a raw read() and
#                                          a raw ibv_dereg_mr(), and only on those)
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --self-test ]; then
    t=$(mktemp -d)
    trap 'rm -rf "$t"' EXIT
    cp -r exs "$t/"
    printf '\nstatic void selftest(int fd)\n{\n    char c;\n\n    (void)read(fd, &c, 1); /* read( in a comment */\n    (void)"close(fd)";\n}\n' \
        >>"$t/exs/prov/tcp/tcp_ctx.c"
    printf '\nstatic void selftest(void)\n{\n    (void)ibv_dereg_mr(NULL);\n    (void)VRB_NC(ibv_dealloc_mw(NULL));\n}\n' \
        >>"$t/exs/prov/verbs/vrb_mr.c"
    bash "$0" "$t/exs" >"$t/out" 2>&1 && { echo "check-nocancel: self-test: passed a bad tree"; exit 1; }
    if ! grep -q 'tcp_ctx.c:[0-9]*: *(void)read(fd' "$t/out" || grep -q '"close(fd)"' "$t/out" ||
        ! grep -q 'vrb_mr.c:[0-9]*: *(void)ibv_dereg_mr(NULL)' "$t/out" || grep -q 'ibv_dealloc_mw' "$t/out"; then
        echo "check-nocancel: self-test: wrong lines in:"; cat "$t/out"; exit 1
    fi
    echo "check-nocancel: self-test: 1 passed, 0 failed"
    exit 0
fi
dir=${1:-exs}
names='read|write|close|readv|writev|pread|pwrite|pread64|pwrite64|recv|recvfrom|recvmsg|recvmmsg'
names+='|send|sendto|sendmsg|sendmmsg|accept|accept4|connect|open|openat|creat|epoll_wait'
names+='|epoll_pwait|ppoll|poll|select|pselect|nanosleep|clock_nanosleep|usleep|sleep|pause'
names+='|sigwait|sigsuspend|sigtimedwait|waitpid|wait|fsync|fdatasync|msync|sem_wait'
names+='|sem_timedwait|pthread_cond_wait|pthread_cond_timedwait|pthread_join|tcdrain|lockf'
names+='|ibv_post_send|ibv_post_recv|ibv_get_cq_event|ibv_req_notify_cq'
# rdma-core's commands to the kernel: only inside VRB_NC( / VRB_NCV( (exs/prov/verbs/vrb.h)
rdma='ibv_reg_mr|ibv_dereg_mr|ibv_alloc_mw|ibv_dealloc_mw|ibv_create_qp|ibv_modify_qp'
rdma+='|ibv_destroy_qp|ibv_create_cq|ibv_destroy_cq|ibv_resize_cq|ibv_alloc_pd|ibv_dealloc_pd'
rdma+='|ibv_create_comp_channel|ibv_destroy_comp_channel|ibv_open_device|ibv_close_device'
rdma+='|ibv_get_device_list|ibv_query_device|ibv_query_port|ibv_query_gid|ibv_fork_init'
rdma+='|rdma_create_id|rdma_destroy_id|rdma_bind_addr|rdma_listen|rdma_resolve_addr'
rdma+='|rdma_resolve_route|rdma_connect|rdma_accept|rdma_reject|rdma_disconnect|rdma_establish'
rdma+='|rdma_init_qp_attr|rdma_ack_cm_event|rdma_get_devices|rdma_create_event_channel'
rdma+='|rdma_destroy_event_channel'
# comments and string literals blanked (newlines kept), then each call not preceded by an
# identifier character, "->" or "." (a member, a field)
bad=$(find "$dir" -name '*.[ch]' ! -name nocancel.h -print0 | sort -z |
    xargs -0 perl -e '
        my $re = qr/(?<![\w>.])(?:'"$names"')\s*\(|(?<![\w>.])(?<!VRB_NC\()(?<!VRB_NCV\()(?:'"$rdma"')\s*\(/;
        for my $f (@ARGV) {
            open(my $h, "<", $f) or die "$f: $!";
            local $/; my $src = <$h>; close($h);
            (my $code = $src) =~ s{(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\x27(?:\\.|[^\x27\\\n])*\x27)}
                { (my $x = $1) =~ s/[^\n]/ /g; $x }gse;
            my @c = split /\n/, $code, -1; my @s = split /\n/, $src, -1;
            for my $i (0 .. $#c) {
                next unless $c[$i] =~ $re;
                next if $s[$i] =~ /nocancel: ok/;
                print "$f:", $i + 1, ": $s[$i]\n";
            }
        }')
if [ -n "$bad" ]; then
    echo "check-nocancel: a cancellation point inside the library (use exs/util/nocancel.h, or"
    echo "say why the line is safe: \"nocancel: ok\"):"
    echo "$bad"
    echo "check-nocancel: 0 passed, 1 failed"
    exit 1
fi
echo "check-nocancel: 1 passed, 0 failed"
