# SPDX-License-Identifier: MIT
# make bench: libexs (blast over the tcp provider) against kernel TCP and UCX over TCP, and
# callgrind instructions per message; writes bench/results.{md,json,png} (bench/run.sh).
#   make bench BENCH_QUICK=1      the < 2 minute version
#   make bench BENCH_CALLGRIND=0  without callgrind (BENCH_STRACE=0: without strace)
# check-bench: the bench tooling on a tiny configuration (bench/selftest.sh), in make check.
BENCH_QUICK     ?= 0
BENCH_CALLGRIND ?= 1
BENCH_STRACE    ?= 1

bench: $(BLAST)
	$(Q)BENCH_QUICK=$(BENCH_QUICK) BENCH_CALLGRIND=$(BENCH_CALLGRIND) BENCH_STRACE=$(BENCH_STRACE) \
		bash bench/run.sh $(BUILD)

CHECK_RUNS += "bash bench/selftest.sh $(BLAST)"

.PHONY: bench
