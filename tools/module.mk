# SPDX-License-Identifier: MIT
# Command-line tools: each tools/<name>.c is one program.
TOOL_SRCS := $(wildcard tools/*.c)
TOOL_BINS += $(TOOL_SRCS:%.c=$(BUILD)/%)

$(BUILD)/tools/%: $(BUILD)/tools/%.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)
