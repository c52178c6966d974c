# SPDX-License-Identifier: MIT
# man/: section 1 (exsctl, blast), section 3 (every exs_* function and type) and section 7 (exs.7), installed by
# make install. make check renders each one and checks the coverage (scripts/check-man.sh);
# make man-params rewrites the tunables list of exs.7 from exsctl (as spec-params does).
.PHONY: check-man man-params
check-man: $(LIB_SO) $(BUILD)/tools/exsctl
	$(Q)bash scripts/check-man.sh $(BUILD)

man-params: $(BUILD)/tools/exsctl
	$(Q)bash scripts/man-params.sh $(BUILD)/tools/exsctl --update

check: check-man
