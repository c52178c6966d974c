/* SPDX-License-Identifier: MIT */
/* Fuzz target: exs__conn_hello_check on arbitrary connect / accept private data. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include <sys/socket.h>

#include "exs/proto/proto.h"
#include "exs/proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Input: one byte choosing the local socket type (bit 0: STREAM), then the private data
 * (copied to an exactly sized heap buffer so ASan sees any read past it). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int type;
    uint8_t *pd;
    struct exs_wire_hello h;

    if (size < 1 || size > 1 + 256)
        return 0;
    type = data[0] & 1 ? SOCK_STREAM : SOCK_SEQPACKET;
    pd = malloc(size - 1 ? size - 1 : 1);
    if (!pd)
        abort();
    memcpy(pd, data + 1, size - 1);
    if (exs__conn_hello_check(pd, (uint32_t)(size - 1), type) == 0) {
        /* what every later use of an accepted hello relies on */
        if (size - 1 < EXS_WIRE_HELLO_LEN)
            abort();
        memcpy(&h, pd, sizeof(h));
        if (be16toh(h.magic) != EXS_WIRE_MAGIC || h.version != EXS_WIRE_VERSION ||
            h.sock_type != (type == SOCK_STREAM ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET))
            abort();
        if (be32toh(h.ring_size) % EXS_RING_SLOT || be16toh(h.credits) < 3 ||
            be16toh(h.credits) > EXS_IMM_CREDITS_MAX || be32toh(h.ctrl_size) < EXS_WIRE_CTRL_MAX)
            abort();
#ifdef EXS_WIRE_RING_SIZE_MAX
        /* since the hello is checked field by field (issue 10, finding 6) */
        uint32_t ring = be32toh(h.ring_size), eager = be32toh(h.eager_max);
        uint64_t addr = be64toh(h.ring_addr);

        if (ring > EXS_WIRE_RING_SIZE_MAX || eager > ring || (!ring && type == SOCK_STREAM) ||
            (ring && (!addr || addr % EXS_RING_SLOT || addr + ring < addr)))
            abort();
#endif
    }
    free(pd);
    return 0;
}
