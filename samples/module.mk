# SPDX-License-Identifier: MIT
# Each samples/<name>.c is one program linked against the static library.
SAMPLE_SRCS := $(wildcard samples/*.c)
SAMPLE_BINS += $(SAMPLE_SRCS:%.c=$(BUILD)/%)

$(BUILD)/samples/%: $(BUILD)/samples/%.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)
