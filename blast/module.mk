# SPDX-License-Identifier: MIT
# blast: the throughput tool (blast/*.c, one program) and its smoke test.
BLAST_SRCS := $(wildcard blast/*.c)
BLAST_OBJS := $(BLAST_SRCS:%.c=$(BUILD)/%.o)
BLAST      := $(BUILD)/blast/blast
TOOL_BINS  += $(BLAST)

$(BLAST): $(BLAST_OBJS) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# Short runs of every option: exit codes, JSON keys, CSV header, PNG magic.
check-blast: $(BLAST)
	$(Q)bash blast/smoke.sh $(BLAST)

check: check-blast

.PHONY: check-blast
