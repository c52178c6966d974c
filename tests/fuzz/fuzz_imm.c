/* SPDX-License-Identifier: MIT */
/* Fuzz target: the immediate-data encoding of wire.h (decode, re-encode, compare). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exs/proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t imm;
    unsigned kind, credits, tag, flags;

    if (size < 4)
        return 0;
    memcpy(&imm, data, 4);
    kind = exs_imm_kind(imm);
    credits = exs_imm_credits(imm);
    tag = exs_imm_tag(imm);
    flags = imm & (EXS_IMM_EOM | EXS_IMM_TRUNC);
    /* every field in range, and the fields are the whole word */
    if (kind > EXS_IMM_KIND_MASK || credits > EXS_IMM_CREDITS_MAX || tag > EXS_IMM_TAG_MASK)
        abort();
    if (exs_imm_make(kind, flags, credits, tag) != imm)
        abort();
    /* encoding any values keeps each field to its bits */
    if (size >= 10) {
        unsigned k = data[4], c = (unsigned)data[5] << 8 | data[6],
                 t = (unsigned)data[7] << 8 | data[8];
        uint32_t m = exs_imm_make(k, data[9] & 1 ? EXS_IMM_EOM : 0, c, t);

        if (exs_imm_kind(m) != (k & EXS_IMM_KIND_MASK) ||
            exs_imm_credits(m) != (c & EXS_IMM_CREDITS_MAX) || exs_imm_tag(m) != t ||
            !(m & EXS_IMM_EOM) != !(data[9] & 1) || (m & EXS_IMM_TRUNC))
            abort();
    }
    return 0;
}
