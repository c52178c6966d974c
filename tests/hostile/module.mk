# SPDX-License-Identifier: MIT
# tests/hostile: raw peers play the attacks of issue 10 against a forked library echo server
# (tcp provider, loopback), one Check test per attack; run by make check.
HOSTILE_SRCS := tests/hostile/main.c tests/hostile/raw.c tests/hostile/server.c
HOSTILE_BIN  := $(BUILD)/tests/hostile/exs_hostile_test
TEST_BINS    += $(HOSTILE_BIN)
CHECK_RUNS   += $(HOSTILE_BIN)

$(HOSTILE_BIN): $(HOSTILE_SRCS:%.c=$(BUILD)/%.o) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CHECK_LIBS) $(LIBS_ALL)
