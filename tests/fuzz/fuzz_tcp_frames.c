/* SPDX-License-Identifier: MIT */
/* Fuzz target: bytes a raw peer sends to a real tcp provider context (in-process, loopback). */
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "tests/fuzz/fuzz_net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Input: one control byte, then the bytes the peer sends.
 *   bit 0  prefix a valid CONN_REQ (a well-formed hello) so later frames reach the
 *          established connection's parser; without it the bytes are the handshake itself
 *   bit 1  the listener is SOCK_STREAM (else SOCK_SEQPACKET)
 *   bit 2  reset the connection right after the bytes (else shut down our side and wait
 *          until the server ends the connection)
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int stream, fd;

    if (size < 1)
        return 0;
    stream = data[0] & 2;
    fd = raw_tcp_connect(fuzz_server_port(stream ? SOCK_STREAM : SOCK_SEQPACKET));
    if (fd < 0)
        return 0;
    if (data[0] & 1) {
        struct exs_wire_hello h;

        raw_hello_default(&h, stream ? EXS_WIRE_SOCK_STREAM : EXS_WIRE_SOCK_SEQPACKET);
        (void)raw_send_conn_req(fd, &h, sizeof(h));
    }
    if (data[0] & 4)
        fuzz_reset(fd, data + 1, size - 1);
    else
        fuzz_finish(fd, data + 1, size - 1);
    return 0;
}
