# SPDX-License-Identifier: MIT
# Each samples/<name>.c is one program linked against the static library.
SAMPLE_SRCS := $(wildcard samples/*.c)
SAMPLE_BINS += $(SAMPLE_SRCS:%.c=$(BUILD)/%)

$(BUILD)/samples/%: $(BUILD)/samples/%.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# make check runs every sample: the stream file-transfer pair end to end (checksums and
# cmp), and the others over loopback (samples_smoke.sh: exit status and output).
.PHONY: check-samples
check-samples: $(SAMPLE_BINS)
	$(Q)bash samples/stream_smoke.sh $(BUILD)
	$(Q)bash samples/samples_smoke.sh $(BUILD)
check: check-samples

# Porting step 1 (issue 15's Done-when): the ported client on its kernel socket against the
# plain blocking server.
.PHONY: check-port-step1
check-port-step1: $(SAMPLE_BINS)
	$(Q)bash samples/port_step1.sh $(BUILD)
check: check-port-step1
