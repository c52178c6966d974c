# SPDX-License-Identifier: MIT
# rxe-probe-kern-guest.sh: guest side of bench/rxe-probe-kern.sh (busybox sh, rxe0 on
# 10.0.2.15): what the guest's kernel does per 64 B busy round trip, libexs (blast --lat-only
# --poll --poll-recv against one long-lived receiver, as bench/rxe-bench.sh) against rstream
# (-S 64 -C 1 -T n, a server per run), clients on CPU 0, servers on CPU 1.
# Every figure is measured at two run lengths, N1 and N2 round trips: the difference over
# N2 - N1 is one round trip's with start-up and teardown taken out (bench/rxe_probe_kern.py).
# Passes (environment): C cycles (3) of pass "cnt" (counters only, the two systems in
# alternating order): /proc/interrupts, /proc/softirqs, rdma statistic, /proc/stat, vmstat,
# perf stat of each client process (and of rstream's server), the blast receiver's threads
# (/proc/PID/task/*/sched); then one cycle each of "sched" (perf record -a of sched_switch,
# sched_wakeup, sched_migrate_task, counted per CPU and thread), "ftrace" (function tracer
# on rxe's entry points: which CPU, which context, which thread runs them), "strace"
# (strace -c -f of the client) and "prof" (perf record -a -e cpu-clock, by CPU, thread and
# symbol). Lines: "K pass cyc sys n key value", "INFO ...", "HB ..." (a heartbeat: what runs,
# every 30 s). MODE=knobs and MODE=recs: see below ("KN ...", "RC ..." lines).
A=10.0.2.15
export PATH=/guest:$PATH EXS_PROVIDER=verbs EXS_CTL_DIR=/tmp/ctl
mkdir -p /tmp/ctl
CL="taskset -c 0"; SV="taskset -c 1"
C=${C:-3}; N1=${N1:-1000}; N2=${N2:-5000}; PORT=7600
# KN_WAIT=block (MODE=knobs): blocking waits, blast without --poll --poll-recv, rstream -T b
LWAIT="--poll --poll-recv"; RT=n
[ "${KN_WAIT:-}" = block ] && { LWAIT=; RT=b; }
T=/sys/kernel/tracing
mount -t tracefs nodev $T 2>/dev/null
mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
echo 0 >/proc/sys/kernel/kptr_restrict
echo -1 >/proc/sys/kernel/perf_event_paranoid
echo "INFO uname=$(uname -r) clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) tracers=$(cat $T/available_tracers 2>/dev/null | tr ' ' ,)"
$SV ./blast -s -p 7471 >/tmp/blast-srv.log 2>&1 &
BS=$!
i=0; until netstat -ltn 2>/dev/null | grep -q ":7471 "; do i=$((i + 1)); [ $i -le 300 ] || break; sleep 0.1; done
echo "INFO blast receiver pid $BS threads: $(for t in /proc/$BS/task/*; do printf '%s:%s ' ${t##*/} "$(cat $t/comm)"; done)"

# snap FILE: system-wide counters and the blast receiver's threads, one "key value" a line
snap() {
    {
        awk 'NR == 1 {n = NF; next} $1 ~ /^(RES|CAL|TLB|LOC|IWI|PMI|NMI):$/ {
                 for (i = 2; i <= n + 1; i++) print "irq." substr($1, 1, length($1) - 1) ".cpu" i - 2, $i }
             /virtio/ {for (i = 2; i <= n + 1; i++) v[i] += $i}
             END {for (i = 2; i <= n + 1; i++) print "irq.virtio.cpu" i - 2, v[i]}' /proc/interrupts
        awk 'NR > 1 {k = substr($1, 1, length($1) - 1); for (i = 2; i <= NF; i++) print "softirq." k ".cpu" i - 2, $i}' /proc/softirqs
        rdma statistic show link rxe0/1 2>/dev/null | tr ' ' '\n' | awk 'NF' | tail -n +3 | paste - - | sed 's/^/rxe./'
        awk '/^cpu[0-9]/ {print "stat." $1 ".user", $2 + $3; print "stat." $1 ".sys", $4; print "stat." $1 ".idle", $5; print "stat." $1 ".irq", $7 + $8}
             /^ctxt/ {print "stat.ctxt", $2}' /proc/stat
        awk '$1 ~ /^(pgfault|pgmajfault|nr_tlb_remote_flush|nr_tlb_remote_flush_received|nr_tlb_local_flush_all|nr_tlb_local_flush_one)$/ {print "vm." $1, $2}' /proc/vmstat
        for t in /proc/$BS/task/*; do
            n=srv.$(tr -c 'a-zA-Z0-9\n' _ <$t/comm)
            awk -v n=$n '$1 ~ /^(nr_switches|nr_voluntary_switches|nr_involuntary_switches|se.nr_migrations|nr_wakeups)$/ {print n "." $1, $3}' $t/sched
            awk -v n=$n '{print n ".minflt", $10}' $t/stat
        done
        # the receiver's engine and provider counters (exsctl metrics)
        [ -x ./exsctl ] && ./exsctl metrics $BS 2>/dev/null |
            awk '$1 ~ /^exs_(engine|prov)_/ && $NF ~ /^[0-9]+$/ {k = $1; gsub(/[{}=",]/, "_", k); print "srvm." k, $NF}'
    } >$1
}
# delta PASS SYS N: the difference of /tmp/s1 and /tmp/s0, as K lines
delta() {
    awk -v p="$1" -v s="$2" -v n="$3" -v c="$c" 'NR == FNR {a[$1] = $2; next}
        ($1 in a) {print "K", p, c, s, n, $1, $2 - a[$1]}' /tmp/s0 /tmp/s1
}
# perfstat PASS SYS N ROLE FILE: perf stat -x, output as K lines
perfstat() {
    awk -F, -v p="$1" -v s="$2" -v n="$3" -v r="$4" -v c="$c" '$3 != "" && $1 ~ /^[0-9.]+$/ {print "K", p, c, s, n, r "." $3, $1}' "$5"
}
EV=task-clock,context-switches,cpu-migrations,page-faults
# system calls, counted by tracepoints (strace stops the threads at each call: under it a
# busy poller's round trip takes ~10 times longer and the counts of the timer-driven
# threads with it)
EV=$EV,raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_write,syscalls:sys_enter_ioctl,syscalls:sys_enter_read,syscalls:sys_enter_sched_yield
# client SYS N [wrapper...]: one client run of SYS (L: blast, R: rstream) with N round trips
client() {
    sys=$1; n=$2; shift 2
    if [ $sys = L ]; then
        "$@" timeout -s KILL 120 $CL ./blast -c $A -p 7471 --json --quiet --type seqpacket --lat-only --lat-size 64 \
            --lat-iters $n $LWAIT >/tmp/out.json 2>/tmp/cl.err
    else
        "$@" timeout -s KILL 120 $CL rstream -s $A -p $PORT -S 64 -C 1 -I $n -T $RT >/tmp/out.json 2>/tmp/cl.err
    fi
    CRC=$?
}
# rs_srv N [wrapper...]: rstream's server for one run (the client's PORT), in the background
rs_srv() {
    n=$1; shift
    PORT=$((PORT + 1))
    "$@" timeout -s KILL 120 $SV rstream -p $PORT -S 64 -C 1 -I $n -T $RT >/tmp/srv.out 2>&1 &
    SP=$!
    sleep 2  # rsockets' port is not in netstat
}
# srv_wait: waits for rstream's server; ends it if the client failed (it would wait for a peer)
srv_wait() {
    if [ -n "$SP" ]; then
        [ "$CRC" = 0 ] || kill $SP 2>/dev/null
        wait $SP
    fi
    [ "$CRC" = 0 ] || echo "FAIL pass=$1 sys=$2 n=$3 rc=$CRC: $(tail -n 2 /tmp/cl.err /tmp/out.json | tr '\n' ' ')"
}
lat() { # the run's p50 (us) from blast's JSON or rstream's usec/xfer (half a round trip)
    if [ $1 = L ]; then tr ',' '\n' </tmp/out.json | sed -n 's/.*"p50": *\([0-9.e+-]*\).*/\1/p' | head -n 1
    else awk 'NF >= 7 && $1 != "name" {l = $NF} END {printf "%.2f", 2 * l}' /tmp/out.json; fi
}
cnt() { # SYS N
    SP=
    [ $1 = R ] && rs_srv $2 perf stat -x, -o /tmp/pss.txt -e $EV --
    snap /tmp/s0
    # the blast receiver's threads, attached for the client's run
    [ $1 = L ] && { perf stat -x, -o /tmp/psb.txt --per-thread -p $BS -e $EV >/dev/null 2>&1 & PB=$!; sleep 1; }
    client $1 $2 perf stat -x, -o /tmp/psc.txt -e $EV --
    [ $1 = L ] && { kill -INT $PB; wait $PB; }
    snap /tmp/s1
    srv_wait cnt $1 $2
    delta cnt $1 $2
    perfstat cnt $1 $2 cli /tmp/psc.txt
    [ $1 = R ] && perfstat cnt $1 $2 srv /tmp/pss.txt
    # --per-thread: "comm-tid,count,unit,event,..."
    [ $1 = L ] && awk -F, -v s=$1 -v n=$2 -v c=$c '$2 ~ /^[0-9.]+$/ && $4 != "" {t = $1; sub(/-[0-9]+$/, "", t); gsub(/[^a-zA-Z0-9]/, "_", t); m["srvt." t "." $4] += $2}
        END {for (k in m) print "K cnt", c, s, n, k, m[k]}' /tmp/psb.txt
    echo "K cnt $c $1 $2 p50 $(lat $1)"
}
sched() { # SYS N: every sched_switch, sched_wakeup, sched_migrate_task and softirq in the run
    SP=
    [ $1 = R ] && rs_srv $2
    perf record -q -a -o /tmp/sched.data -e sched:sched_switch,sched:sched_wakeup,sched:sched_migrate_task,irq:softirq_entry \
        -- sh -c "$(client_cmd $1 $2)" >/dev/null 2>/tmp/perf.err
    CRC=$?
    srv_wait sched $1 $2
    # "comm tid [cpu] event: fields"
    perf script -i /tmp/sched.data -F comm,tid,cpu,event,trace 2>/dev/null | awk -v s=$1 -v n=$2 -v c=$c '
        {ci = 0; for (i = 2; i <= NF; i++) if ($i ~ /^\[[0-9]+\]$/) {ci = i; break}
         if (!ci) next
         cpu = $ci; gsub(/[^0-9]/, "", cpu); cpu += 0
         comm = $1; for (j = 2; j < ci - 1; j++) comm = comm "_" $j
         gsub(/[^a-zA-Z0-9]/, "_", comm)
         ev = $(ci + 1); sub(/:$/, "", ev)
         if (ev == "sched:sched_switch") {
             st = "R"; for (k = ci; k <= NF; k++) if ($k ~ /^prev_state=/) st = substr($k, 12)
             if (st ~ /^R/) st = "preempt"; else st = "sleep"
             m["switch." st ".cpu" cpu "." comm]++
         } else if (ev == "sched:sched_wakeup") {
             t = ""; tc = ""; for (k = ci; k <= NF; k++) { if ($k ~ /^comm=/) t = substr($k, 6); if ($k ~ /^target_cpu=/) tc = substr($k, 12) + 0 }
             gsub(/[^a-zA-Z0-9]/, "_", t)
             m["wakeup.by_cpu" cpu "." comm ".of." t ".on_cpu" tc]++
         } else if (ev == "sched:sched_migrate_task") {
             t = ""; for (k = ci; k <= NF; k++) if ($k ~ /^comm=/) t = substr($k, 6)
             gsub(/[^a-zA-Z0-9]/, "_", t)
             m["migrate." t]++
         } else if (ev == "irq:softirq_entry") {
             a = ""; for (k = ci; k <= NF; k++) if ($k ~ /action=/) {a = $k; sub(/^.*action=/, "", a); gsub(/[^A-Z_]/, "", a)}
             m["softirq." a ".cpu" cpu "." comm]++
         }}
        END {for (k in m) print "K sched", c, s, n, k, m[k]}'
}
wake() { # SYS N: the kernel stacks of the wake-ups of the client's and server's threads
    SP=
    [ $1 = R ] && rs_srv $2
    perf record -q -a -g -o /tmp/wake.data -e sched:sched_wakeup -- sh -c "$(client_cmd $1 $2)" >/dev/null 2>/tmp/perf.err
    CRC=$?
    srv_wait wake $1 $2
    # an event line "comm tid [cpu] ts: sched:sched_wakeup: comm=T ...", then its frames, a
    # blank line: counted by waker, wakee and the frames from the system call down
    perf script -i /tmp/wake.data -F comm,tid,cpu,event,trace,ip,sym 2>/dev/null | awk -v s=$1 -v n=$2 -v c=$c '
        function flush() { if (key != "") m[key "." sig]++; key = ""; sig = "" }
        /sched:sched_wakeup/ { flush(); t = ""; for (k = 1; k <= NF; k++) if ($k ~ /^comm=/) t = substr($k, 6)
            w = $1; gsub(/[^a-zA-Z0-9]/, "_", w); gsub(/[^a-zA-Z0-9]/, "_", t)
            if (w ~ /^(blast|rstream|exs_)/ || t ~ /^(blast|rstream|exs_)/) { key = w ".wakes." t; nf = 0 } ; next }
        NF == 0 { flush(); next }
        key != "" && nf < 12 { f = $2; sub(/\+.*$/, "", f)
            if (f !~ /^(ttwu|try_to_wake_up|wake_up|__wake_up|default_wake|autoremove|pollwake|ep_poll_callback|_raw_spin|__x64_sys|do_syscall|entry_SYSCALL|\[unknown\])/ && nf < 4) { sig = sig (sig == "" ? "" : "<") f; nf++ } }
        END {flush(); for (k in m) print "K wake", c, s, n, k, m[k]}'
}
client_cmd() { # SYS N: the client's command line, for sh -c
    if [ $1 = L ]; then
        echo "timeout -s KILL 120 $CL ./blast -c $A -p 7471 --json --quiet --type seqpacket --lat-only --lat-size 64 --lat-iters $2 --poll --poll-recv >/tmp/out.json 2>/tmp/cl.err"
    else
        echo "timeout -s KILL 120 $CL rstream -s $A -p $PORT -S 64 -C 1 -I $2 -T n >/tmp/out.json 2>/tmp/cl.err"
    fi
}
# rxe's entry points the function tracer follows (those this kernel has)
FT=
for f in rxe_requester rxe_responder rxe_completer rxe_rcv rxe_xmit_packet rxe_loopback rxe_post_send \
         rxe_cq_post rxe_req_notify_cq rxe_do_task rxe_run_task rxe_sched_task rxe_comp_queue_pkt \
         rxe_resp_queue_pkt rxe_send rxe_udp_encap_recv; do
    grep -q "^$f\( \|$\)" $T/available_filter_functions 2>/dev/null && FT="$FT $f"
done
echo "INFO ftrace functions:$FT"
# The function tracer is switched on once, before the first traced run, and never off: under
# TCG the guest froze (twice, in the next run's set-up) when it was switched off and on again
# (code patching); between runs only tracing_on changes.
FT_ON=
ftr() { # SYS N: every call of $FT: CPU, context (process, softirq, hardirq), thread, caller
    SP=
    if [ -z "$FT_ON" ]; then
        echo 0 >$T/tracing_on
        echo "$FT" | tr ' ' '\n' | awk 'NF' >$T/set_ftrace_filter
        echo 65536 >$T/buffer_size_kb
        echo function >$T/current_tracer
        echo 0 >$T/tracing_on
        FT_ON=1
    fi
    [ $1 = R ] && rs_srv $2
    echo >$T/trace
    echo 1 >$T/tracing_on
    client $1 $2
    echo 0 >$T/tracing_on
    srv_wait ftrace $1 $2
    echo "K ftrace $c $1 $2 entries $(awk '/entries-in-buffer/ {print $3}' $T/trace | head -n 1)"
    # "comm-pid [cpu] flags ts: func <-parent"; flags' third character: s softirq, h hardirq
    awk -v s=$1 -v n=$2 -v c=$c '!/^#/ && NF >= 5 {
            cpu = $0; sub(/^.*\[/, "", cpu); sub(/\].*$/, "", cpu); cpu += 0
            rest = $0; sub(/^.*\] /, "", rest); split(rest, w, " "); fl = w[1]
            cx = substr(fl, 3, 1); ctx = (cx == "s" || cx == "S") ? "softirq" : (cx == "h" || cx == "H") ? "hardirq" : "task"
            comm = $0; sub(/^ */, "", comm); sub(/-[0-9]+ +\[.*$/, "", comm); gsub(/[^a-zA-Z0-9]/, "_", comm)
            fn = w[3]; par = w[4]; sub(/^<-/, "", par); sub(/\+.*$/, "", par)
            m[fn ".cpu" cpu "." ctx "." comm]++; p[fn ".from." par]++ }
        END {for (k in m) print "K ftrace", c, s, n, k, m[k]; for (k in p) print "K ftrace", c, s, n, k, p[k]}' $T/trace
}
str() { # SYS N: strace -c -f of the client
    SP=
    [ $1 = R ] && rs_srv $2
    client $1 $2 strace -f -c -o /tmp/st.txt
    srv_wait strace $1 $2
    awk -v s=$1 -v n=$2 -v c=$c '$1 ~ /^[0-9.]+$/ && NF >= 5 {print "K strace", c, s, n, "sys." $NF, $4}' /tmp/st.txt
}
prof() { # SYS N: perf record -a -e cpu-clock (4 kHz): samples by CPU, thread and object, and by symbol
    SP=
    [ $1 = R ] && rs_srv $2
    perf record -q -a -F 4000 -e cpu-clock -o /tmp/prof.data -- sh -c "$(client_cmd $1 $2)" >/dev/null 2>/tmp/perf.err
    CRC=$?
    srv_wait prof $1 $2
    # "comm tid [cpu] ip sym (dso)"
    perf script -i /tmp/prof.data -F comm,tid,cpu,ip,sym,dso 2>/dev/null | awk -v s=$1 -v n=$2 -v c=$c '
        {ci = 0; for (i = 2; i <= NF; i++) if ($i ~ /^\[[0-9]+\]$/) {ci = i; break}
         if (!ci) next
         cpu = $ci; gsub(/[^0-9]/, "", cpu)
         comm = $1; for (j = 2; j < ci - 1; j++) comm = comm "_" $j
         gsub(/[^a-zA-Z0-9]/, "_", comm)
         dso = $NF; gsub(/[()]/, "", dso); sub(/^.*\//, "", dso); sub(/\.so.*$/, "", dso)
         sym = (NF > ci + 2) ? $(ci + 2) : "?"
         if (dso ~ /kallsyms|^rdma_rxe|^ib_|^rdma_|\.ko/ || dso == "[unknown]" && sym ~ /^[a-z_]/) cls = "kernel"; else cls = "user"
         m["cpu" cpu "." comm "." cls]++; m["all." cls]++
         m["sym." cls "." dso "." sym]++ }
        END {for (k in m) print "K prof", c, s, n, k, m[k]}'
}
# a heartbeat: what runs, every 30 s (a stuck run shows here)
(while :; do sleep 30; echo "HB $(cut -d' ' -f1 /proc/uptime) $(ps -o pid,stat,args | grep -E 'blast|rstream|perf|strace' | grep -v grep | tr -s ' ' | tr '\n' ';')"; done) &
HB=$!
# MODE=knobs: do the progress thread's wake-ups and the idle fallback context's epoll_wait
# set the p50? libexs as is (L), with EXS_FALLBACK=off (Lf: no tcp context to look at),
# EXS_LEASE_US=100000 (Ll: the lease fires a hundredth as often) or both (Lfl), and rstream,
# interleaved, C cycles of N2 round trips; each libexs variant against a receiver with the
# same setting (ports 7472...); the client's context switches and system calls by perf stat.
# KNOBS="TAG=VAR=VALUE[,VAR=VALUE...] ..." replaces the variants (Lf, Ll, Lfl by default).
if [ "${MODE:-}" = knobs ]; then
    KNOBS=${KNOBS:-"Lf=EXS_FALLBACK=off Ll=EXS_LEASE_US=100000 Lfl=EXS_FALLBACK=off,EXS_LEASE_US=100000"}
    port=7472
    for k in $KNOBS; do
        env $(echo "${k#*=}" | tr , ' ') $SV ./blast -s -p $port >/tmp/blast-srv-$port.log 2>&1 &
        BS="$BS $!"
        port=$((port + 1))
    done
    sleep 3
    kn() { # TAG PORT ENV...
        tag=$1; p=$2; shift 2
        if [ $tag = R ]; then
            rs_srv $N2
            client R $N2 perf stat -x, -o /tmp/psc.txt -e $EV --
            srv_wait knobs R $N2
        else
            env "$@" perf stat -x, -o /tmp/psc.txt -e $EV -- timeout -s KILL 120 $CL ./blast -c $A -p $p --json --quiet \
                --type seqpacket --lat-only --lat-size 64 --lat-iters $N2 $LWAIT >/tmp/out.json 2>/tmp/cl.err
        fi
        v=$(lat $([ $tag = R ] && echo R || echo L))
        echo "KN cyc=$c tag=$tag p50=$v $(awk -F, '$1 ~ /^[0-9.]+$/ {printf "%s=%s ", $3, $1}' /tmp/psc.txt)"
    }
    c=1
    while [ $c -le $C ]; do
        kn L 7471
        port=7472
        for k in $KNOBS; do
            kn "${k%%=*}" $port $(echo "${k#*=}" | tr , ' ')
            port=$((port + 1))
        done
        kn R 0
        c=$((c + 1))
    done
    kill $BS $HB 2>/dev/null
    echo "INFO done (uptime $(cut -d' ' -f1 /proc/uptime))"
    exit 0
fi
# MODE=recs: which records go per message: every counter of a libexs client (exsctl metrics,
# per connection and in total) that moved between two looks 2 s apart in a long run
if [ "${MODE:-}" = recs ]; then
    c=1
    while [ $c -le $C ]; do
        timeout -s KILL 120 $CL ./blast -c $A -p 7471 --json --quiet --type seqpacket --lat-only --lat-size 64 \
            --lat-iters 200000 --poll --poll-recv >/tmp/out.json 2>/tmp/cl.err &
        cp=$!
        sleep 4
        ./exsctl metrics $cp 2>/dev/null | grep -v '^#' >/tmp/m0
        ./exsctl metrics $BS 2>/dev/null | grep -v '^#' | sed 's/^/srv_/' >>/tmp/m0
        sleep 2
        ./exsctl metrics $cp 2>/dev/null | grep -v '^#' >/tmp/m1
        ./exsctl metrics $BS 2>/dev/null | grep -v '^#' | sed 's/^/srv_/' >>/tmp/m1
        kill -9 $cp; wait $cp
        awk -v c=$c 'NR == FNR {a[$1] = $NF; next} ($1 in a) && $NF != a[$1] {print "RC cyc=" c, $1, $NF - a[$1]}' /tmp/m0 /tmp/m1
        c=$((c + 1))
    done
    kill $BS $HB 2>/dev/null
    echo "INFO done (uptime $(cut -d' ' -f1 /proc/uptime))"
    exit 0
fi
c=0
cnt L 200; cnt R 200   # warm-up: first connections, page cache
c=1
while [ $c -le $C ]; do
    if [ $((c % 2)) = 1 ]; then set -- L R; else set -- R L; fi
    for s in "$@"; do cnt $s $N1; cnt $s $N2; done
    c=$((c + 1))
done
c=1
for p in sched wake str prof ftr; do
    for s in L R; do $p $s $N1; $p $s $N2; done
done
kill $BS $HB 2>/dev/null
echo "INFO done (uptime $(cut -d' ' -f1 /proc/uptime))"
