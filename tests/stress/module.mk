# SPDX-License-Identifier: MIT
# tests/stress: connection stress against samples/seqpacket_echo_server (one Check binary).
# make check runs it with small counts; tests/stress/run-full.sh runs the issue's numbers.
STRESS_SRCS := $(wildcard tests/stress/*.c)
STRESS_RAW  := tests/hostile/raw.c # resume_churn's raw peers
STRESS_BIN  := $(BUILD)/tests/stress/exs_stress_test
TEST_BINS   += $(if $(STRESS_SRCS),$(STRESS_BIN))
CHECK_RUNS  += $(if $(STRESS_SRCS),$(STRESS_BIN))

$(STRESS_BIN): $(STRESS_SRCS:%.c=$(BUILD)/%.o) $(STRESS_RAW:%.c=$(BUILD)/%.o) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CHECK_LIBS) $(LIBS_ALL)

# The summary line of tests/run-checks.sh counts SKIP lines as skipped, not passed.
.PHONY: check-run-checks
check-run-checks:
	$(Q)bash tests/run-checks.sh --self-test
check: check-run-checks
