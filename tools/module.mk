# SPDX-License-Identifier: MIT
# Command-line tools: each tools/<name>.c is one program, except tools/exsctl_*.c: parts of exsctl.
TOOL_SRCS := $(filter-out tools/exsctl_%.c,$(wildcard tools/*.c))
TOOL_BINS += $(TOOL_SRCS:%.c=$(BUILD)/%)

$(BUILD)/tools/%: $(BUILD)/tools/%.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# exsctl's subcommands in other files (the library comes last on the link line).
EXSCTL_PARTS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/exsctl_*.c))
$(BUILD)/tools/exsctl: $(BUILD)/tools/exsctl.o $(EXSCTL_PARTS) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# exsctl reports the version of the tree it was built from.
CHECK_CFLAGS_tools = -DEXSCTL_VERSION='"$(VERSION)"'
$(BUILD)/tools/exsctl.o: GNUmakefile

# spec/params.md is the output of "exsctl params --markdown": regenerate, and catch drift.
EXSCTL := $(BUILD)/tools/exsctl

spec-params: $(EXSCTL)
	$(Q)$(EXSCTL) params --markdown > spec/params.md

check-params: $(EXSCTL)
	$(Q)$(EXSCTL) params --markdown | diff -u spec/params.md - || \
	    { echo "spec/params.md is stale: run make spec-params" >&2; exit 1; }

check: check-params

# exsctl serve / ping / perf against each other over the tcp provider on 127.0.0.1.
check-probe: $(EXSCTL)
	$(Q)bash tools/probe_test.sh $(EXSCTL)

check: check-probe

.PHONY: spec-params check-params check-probe

# exsctl against live processes (blast, the echo server): tools/ctl_test.sh.
CHECK_RUNS += "bash tools/ctl_test.sh $(BUILD)"

# request tracing against live blast runs: tools/trace_test.sh.
CHECK_RUNS += "bash tools/trace_test.sh $(BUILD)"

# exsctl metrics against live processes, checked by promtool: tools/metrics_test.sh.
CHECK_RUNS += "bash tools/metrics_test.sh $(BUILD)"
