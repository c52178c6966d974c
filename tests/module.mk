# SPDX-License-Identifier: MIT
# tests/unit:  Check unit tests of every module (one binary, suites listed in main.c).
# tests/prov:  provider conformance tests (one binary, run per provider with -p).
# tests/mock:  the mock provider shared by protocol unit tests.
UNIT_SRCS := $(wildcard tests/unit/*.c tests/mock/*.c)
PROV_SRCS := $(wildcard tests/prov/*.c)
UNIT_BIN  := $(BUILD)/tests/unit/exs_unit
PROV_BIN  := $(BUILD)/tests/prov/exs_prov_test
TEST_BINS += $(if $(UNIT_SRCS),$(UNIT_BIN)) $(if $(PROV_SRCS),$(PROV_BIN))
CHECK_RUNS += $(if $(UNIT_SRCS),$(UNIT_BIN)) $(if $(PROV_SRCS),"$(PROV_BIN) -p tcp")
# the same conformance suite with EXS_PROV_ATTR_MANUAL_PROGRESS (no NIC thread)
CHECK_RUNS += $(if $(PROV_SRCS),"$(PROV_BIN) -p tcp --manual")
# the same suite through the fault-injection wrapper with no fault configured (transparent)
CHECK_RUNS += $(if $(PROV_SRCS),"$(PROV_BIN) -p fault:tcp" "$(PROV_BIN) -p fault:tcp --manual")

$(UNIT_BIN): $(UNIT_SRCS:%.c=$(BUILD)/%.o) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CHECK_LIBS) $(LIBS_ALL)

$(PROV_BIN): $(PROV_SRCS:%.c=$(BUILD)/%.o) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CHECK_LIBS) $(LIBS_ALL)

# tests/integ: ES-API integration tests (public API only), one binary run per provider.
INTEG_SRCS := $(wildcard tests/integ/*.c)
INTEG_BIN  := $(BUILD)/tests/integ/exs_integ_test
TEST_BINS  += $(if $(INTEG_SRCS),$(INTEG_BIN))
CHECK_RUNS += $(if $(INTEG_SRCS),"$(INTEG_BIN) -p tcp")
# the shared-memory provider (spec/provider-shm.md): conformance in both progress modes and
# through the fault wrapper, and the ES-API integration tests over it
CHECK_RUNS += $(if $(PROV_SRCS),"$(PROV_BIN) -p shm" "$(PROV_BIN) -p shm --manual")
CHECK_RUNS += $(if $(PROV_SRCS),"$(PROV_BIN) -p fault:shm")
CHECK_RUNS += $(if $(INTEG_SRCS),"$(INTEG_BIN) -p shm")

$(INTEG_BIN): $(INTEG_SRCS:%.c=$(BUILD)/%.o) $(LIB_A)
	$(call say,LINK,$@)$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CHECK_LIBS) $(LIBS_ALL)

# hostile-peer tests and fuzz targets (their own fragments)
include tests/hostile/module.mk
-include tests/fuzz/module.mk
# tests/stress: connection stress (many at once, mass resets, half-open peers).
include tests/stress/module.mk
