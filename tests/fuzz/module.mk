# SPDX-License-Identifier: MIT
# tests/fuzz: libFuzzer targets, built by `make fuzz` with clang (ASan + UBSan + fuzzer) into
# build-fuzz/ from the library sources; `make check` runs each briefly when clang is present.
#   fuzz_tcp_frames  bytes a raw peer sends to a tcp provider context (handshake and frames)
#   fuzz_hello       exs__conn_hello_check
#   fuzz_ctrl        control records and data immediates after a real handshake
#   fuzz_imm         the immediate-data encoding of wire.h
FUZZ_TARGETS := fuzz_tcp_frames fuzz_hello fuzz_ctrl fuzz_imm
FUZZ_BUILD   := build-fuzz
FUZZ_SECS    ?= 10
FUZZ_CFLAGS  := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
                -Wno-gnu-variable-sized-type-not-at-end
FUZZ_LDFLAGS := -fsanitize=address,undefined
FUZZ_NET     := tests/fuzz/fuzz_net.c tests/hostile/raw.c
HAVE_CLANG   := $(shell command -v clang >/dev/null 2>&1 && echo 1)

ifeq ($(FUZZ_INNER),1)
# Inside the clang build: BUILD is build-fuzz.
FUZZ_BINS := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/%)
fuzz-bins: $(FUZZ_BINS)
$(BUILD)/tests/fuzz/fuzz_tcp_frames $(BUILD)/tests/fuzz/fuzz_ctrl: $(FUZZ_NET:%.c=$(BUILD)/%.o)
$(FUZZ_BINS): $(BUILD)/tests/fuzz/%: $(BUILD)/tests/fuzz/%.o $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -fsanitize=fuzzer -o $@ $(filter %.o,$^) $(LIB_A) $(LIBS_ALL)
.PHONY: fuzz-bins
else
fuzz:
	$(Q)bash scripts/deps.sh --fuzz
	$(Q)$(MAKE) --no-print-directory FUZZ_INNER=1 BUILD=$(FUZZ_BUILD) CC=clang SAN= OPT="-O1 -g" \
	    CFLAGS="$(FUZZ_CFLAGS)" LDFLAGS="$(FUZZ_LDFLAGS)" WITH_VERBS=no fuzz-bins

# make check: every target runs FUZZ_SECS from its checked-in seeds (tests/fuzz/run.sh, one
# line of run-checks.sh); the clang build happens before. Skipped, and said so, without clang
# and in sanitizer builds (the fuzz build already runs under ASan and UBSan).
ifeq ($(HAVE_CLANG)$(SAN),1)
CHECK_RUNS += "tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECS) $(FUZZ_TARGETS)"
check-fuzz-build:
	$(Q)$(MAKE) --no-print-directory fuzz
else
check-fuzz-build:
	@echo "fuzz targets: skipped ($(if $(SAN),sanitizer build,clang not found))"
endif
check: check-fuzz-build
.PHONY: fuzz check-fuzz-build
endif
