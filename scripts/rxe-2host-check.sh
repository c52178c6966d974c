# SPDX-License-Identifier: MIT
# rxe-2host-check.sh: the scenario of `make check-rxe-2host` (scripts/rxe-2host.sh runs it
# in both guests; busybox sh). Arguments VAR=VALUE are exported first (limits, Check's
# knobs). a runs, against b's blast receiver (10.0.3.2): a verified blast transfer on the
# plain link, then with 1% loss on a's egress; then the integration suite in one process on
# a with its pairs' connections hairpinned through b (EXS_TEST_LISTEN_ADDR=10.0.4.1, see
# 2host.sh; not with RXE_2HOST_INTEG=0; the blast runs not with RXE_2HOST_BLAST=0, e.g. in
# RXE_2HOST_ENV). Each run's verdict line carries rxe1's packet
# counters.
for kv in "$@"; do export "$kv"; done
. ./2host.sh
export EXS_PROVIDER=verbs CK_LOG_FILE_NAME=-
: "${RXE_TEST_TIMEOUT:=1800}" "${BLAST_PORT:=7471}"
if ON b; then
    setsid ./blast -s -p $BLAST_PORT >blast-server.log 2>&1 &
    srv=$!
    i=0
    until netstat -ltn | grep -q ":$BLAST_PORT "; do
        i=$((i + 1)); [ $i -le 600 ] || { say2 "blast receiver never listened"; break; }
        sleep 0.2
    done
fi
barrier "blast receiver up"
if ON a && [ "${RXE_2HOST_BLAST:-1}" = 1 ]; then
    run blast-link 300 ./blast -c $B -p $BLAST_PORT --transport both --time 2 --runs 1 --verify --quiet
    netem loss 1%
    run blast-loss1pct 300 ./blast -c $B -p $BLAST_PORT --time 2 --runs 1 --verify --quiet
    netem_off
fi
if ON a; then
    if [ "${RXE_2HOST_INTEG:-1}" = 1 ]; then
        # RXE_2HOST_HAIRPIN=0 (a check of the check): 127.0.0.1, looped back on a: must FAIL
        run exs_integ_test "$RXE_TEST_TIMEOUT" env \
            EXS_TEST_LISTEN_ADDR=$([ "${RXE_2HOST_HAIRPIN:-1}" = 1 ] && echo $HAIRPIN) \
            EXS_TEST_ADDR=$A ./exs_integ_test -p verbs ||
            say2 "known (spec/rxe-vm.md, 'The seven, decided'): transfers ending ECONNRESET" \
                "under retransmission are rxe's REM_INV_REQ on a retried multi-packet WRITE" \
                "(open); EXS_LOG_LEVEL=dbg EXS_LOG_SUBSYS=prov in RXE_2HOST_ENV shows the status"
    else
        say2 "integration suite not run (RXE_2HOST_INTEG=0)"
    fi
fi
barrier "a done"
if ON b; then
    kill $srv 2>/dev/null
    echo "--- blast receiver output:"; cat blast-server.log
fi
finish
