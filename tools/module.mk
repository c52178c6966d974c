# SPDX-License-Identifier: MIT
# Command-line tools: each tools/<name>.c is one program.
TOOL_SRCS := $(wildcard tools/*.c)
TOOL_BINS += $(TOOL_SRCS:%.c=$(BUILD)/%)

$(BUILD)/tools/%: $(BUILD)/tools/%.o $(LIB_A)
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

.PHONY: spec-params check-params

# exsctl against live processes (blast, the echo server): tools/ctl_test.sh.
CHECK_RUNS += "bash tools/ctl_test.sh $(BUILD)"
