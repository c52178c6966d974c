# SPDX-License-Identifier: MIT
# make bench: libexs (blast over the tcp provider) against kernel TCP and UCX over TCP, and
# callgrind instructions per message; writes bench/results.{md,json,png} (bench/run.sh).
#   make bench BENCH_QUICK=1      the < 2 minute version
#   make bench BENCH_CALLGRIND=0  without callgrind (BENCH_STRACE=0: without strace)
#   make bench BENCH_BASE=TRACE=0 also measures a build of the same tree with request tracing
#                                 compiled out (built here, in $(BUILD)-notrace/), interleaved
#                                 in the same rounds: results.md gives ours / base per figure
#   make bench BENCH_BASE=DIR     the same against DIR/blast/blast (any build directory)
# check-bench: the bench tooling on a tiny configuration (bench/selftest.sh), in make check.
#
# TRACE=0 (GNUmakefile, exs/proto/reqtrace.h) is a build for this comparison only: make check
# refuses it. The tracing tests (wire golden hello features, the hostile TRACE cases, the trace
# integration suite, exsctl trace) test what TRACE=0 removes, and making each of them skip
# would add a second configuration to maintain for a build nobody ships.
BENCH_QUICK     ?= 0
BENCH_CALLGRIND ?= 1
BENCH_STRACE    ?= 1
BENCH_BASE      ?=

ifeq ($(BENCH_BASE),TRACE=0)
BENCH_BASE_DIR := $(BUILD)-notrace
bench: bench-base
bench-base:
	$(Q)$(MAKE) --no-print-directory TRACE=0 BUILD=$(BENCH_BASE_DIR) $(BENCH_BASE_DIR)/blast/blast
.PHONY: bench-base
else
BENCH_BASE_DIR := $(BENCH_BASE)
endif

bench: $(BLAST)
	$(Q)BENCH_QUICK=$(BENCH_QUICK) BENCH_CALLGRIND=$(BENCH_CALLGRIND) BENCH_STRACE=$(BENCH_STRACE) \
		BENCH_BASE='$(BENCH_BASE_DIR)' BENCH_BASE_NAME='$(BENCH_BASE)' bash bench/run.sh $(BUILD)

ifeq ($(TRACE),0)
ifneq ($(filter check check-%,$(MAKECMDGOALS)),)
$(error TRACE=0 is a build for make bench BENCH_BASE=TRACE=0 only: make check needs tracing (bench/module.mk))
endif
endif

CHECK_RUNS += "bash bench/selftest.sh $(BLAST)"

.PHONY: bench

# make bench-kfd: the ES-API calls on a kernel TCP socket against plain send() (issue 27),
# 64 B to 1 MiB, median of 5 interleaved rounds (bench/kfd/kfd_bench.c; KFD_BENCH_ARGS adds
# options, e.g. --rounds 9 --bytes 256M).
KFD_BENCH := $(BUILD)/bench/kfd/kfd_bench
TOOL_BINS += $(KFD_BENCH)

$(KFD_BENCH): $(BUILD)/bench/kfd/kfd_bench.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

bench-kfd: $(KFD_BENCH)
	$(Q)$(KFD_BENCH) $(KFD_BENCH_ARGS)

.PHONY: bench-kfd

# make check: no system call of the library's own per exs_send on a kernel socket (strace).
CHECK_RUNS += "bash bench/kfd/syscalls.sh $(KFD_BENCH)"
# make check: the library's instructions per exs_send on a kernel socket and its event
# (callgrind; a SKIP without valgrind or in a sanitizer build).
CHECK_RUNS += "bash bench/kfd/instr.sh $(KFD_BENCH)"

# make bench-floor: the floors under the shm round trip (issue 28): the cores' cache-line
# round trip, the provider alone through prov.h, and blast through the whole library, p50
# of each, interleaved rounds (bench/floor/floor.sh; FLOOR_ARGS e.g. --rounds 9).
FLOOR := $(BUILD)/bench/floor/floor
TOOL_BINS += $(FLOOR)

$(FLOOR): $(BUILD)/bench/floor/floor.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

bench-floor: $(FLOOR) $(BLAST)
	$(Q)bash bench/floor/floor.sh $(BUILD) $(FLOOR_ARGS)

.PHONY: bench-floor
