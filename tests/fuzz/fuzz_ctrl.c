/* SPDX-License-Identifier: MIT */
/* Fuzz target: control records and data immediates sent to a library server after a real handshake.
 */
#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tests/fuzz/fuzz_net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * conn_on_ctrl_locked (exs/proto/conn.c) is static and needs a live connection, so the
 * smallest existing entry point is the network: a raw peer completes the handshake with
 * a well-formed hello, then the input becomes frames on that connection:
 *   byte 0: bit 0 STREAM (else SEQPACKET)
 *   then records: one kind byte;
 *     kind odd:  a SEND of control records: 2 length bytes (mod 513), then that payload
 *     kind even: a WRITE WITH IMMEDIATE into the server's ring with the ring key:
 *                4 bytes imm, 4 bytes ring offset, 2 length bytes (mod 8193), payload
 *                (input bytes, zero-padded)
 * Frames carry correct sequence numbers; whatever the server sends is acknowledged.
 */
static uint32_t take(const uint8_t **p, const uint8_t *end, unsigned n)
{
    uint32_t v = 0;

    for (unsigned i = 0; i < n; i++)
        v = v << 8 | (*p < end ? *(*p)++ : 0);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct raw_peer p;
    static uint8_t payload[8192];
    const uint8_t *q = data + 1, *end = data + size;
    struct exs_wire_hello h;
    int stream;

    if (size < 1)
        return 0;
    stream = data[0] & 1;
    raw_hello_default(&h, stream ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET);
    int err = raw_open(&p, fuzz_server_port(stream ? SOCK_STREAM : SOCK_SEQPACKET), &h, 10000);

    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_ctrl: handshake %d\n", err);
    if (err) {
        if (p.fd >= 0)
            fuzz_finish(p.fd, NULL, 0);
        return 0;
    }
    raw_wait_ring(&p, 1000); /* v2: the server's key comes in its RING record */
    while (q < end && !p.closed) {
        unsigned kind = take(&q, end, 1);
        uint32_t psn, len;

        if (kind & 1) {
            len = take(&q, end, 2) % (EXS_WIRE_CTRL_MAX + 1);
            memset(payload, 0, len);
            memcpy(payload, q, (size_t)(end - q) < len ? (size_t)(end - q) : len);
            q += (size_t)(end - q) < len ? (size_t)(end - q) : len;
            if (raw_send_ctrl(&p, payload, len, &psn))
                break;
        } else {
            uint32_t imm = take(&q, end, 4), off = take(&q, end, 4);
            uint32_t ring = be32toh(p.peer.ring_size);

            len = take(&q, end, 2) % 8193;
            memset(payload, 0, len);
            memcpy(payload, q, (size_t)(end - q) < len ? (size_t)(end - q) : len);
            q += (size_t)(end - q) < len ? (size_t)(end - q) : len;
            off = ring ? off % ring : off;
            if (raw_write(&p, be64toh(p.peer.ring_addr) + off, p.ring_rkey, 1, imm, payload, len,
                          &psn))
                break;
        }
        raw_pump(&p, 0);
    }
    /* let the server answer (ACKs, echoes, its own control records) before the end */
    if (p.tx_psn && !p.closed && raw_wait_psn(&p, p.tx_psn - 1, 20) == 0)
        raw_pump(&p, 0);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_ctrl: %u frames sent, acked %u, closed %d, nak %d, %u data msgs\n",
                p.tx_psn, p.acked, p.closed, p.naked, p.data_msgs);
    fuzz_finish(p.fd, NULL, 0);
    return 0;
}
