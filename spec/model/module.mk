# SPDX-License-Identifier: MIT
# The Promela model of the SOCK_STREAM algorithm (spec/protocol.md section 7),
# checked exhaustively by Spin: see spec/model/README.md.
check-model:
	$(Q)bash spec/model/run.sh

# The model does not depend on the C build: run it with the plain check only, not again
# for each sanitizer build.
ifeq ($(SAN),)
check: check-model
endif

.PHONY: check-model
