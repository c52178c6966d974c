# SPDX-License-Identifier: MIT
# The library: every .c under exs/ (verbs only when rdma-core is there).
LIB_SRCS += $(wildcard exs/util/*.c exs/prov/*.c exs/prov/tcp/*.c exs/prov/shm/*.c \
                       exs/prov/fault/*.c exs/prov/soft/*.c exs/proto/*.c exs/engine/*.c exs/api/*.c exs/ctl/*.c)
ifneq ($(HAVE_VERBS),)
LIB_SRCS += $(wildcard exs/prov/verbs/*.c)
endif
