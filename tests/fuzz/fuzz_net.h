/* SPDX-License-Identifier: MIT */
/* In-process echo servers on the public ES-API and a raw peer's session for network fuzz targets.
 */
#ifndef EXS_TESTS_FUZZ_FUZZ_NET_H
#define EXS_TESTS_FUZZ_FUZZ_NET_H

#include <stddef.h>
#include <stdint.h>

#include "tests/hostile/raw.h"

/* Start (once) a SEQPACKET and a STREAM echo server on loopback in this process.
 * Returns the port of the one for sock_type (SOCK_SEQPACKET or SOCK_STREAM). */
int fuzz_server_port(int sock_type);
/* Send bytes, shut our side, read until the server ends the connection (abort if it
 * never does: a hang is a finding), then reset. fd is consumed. */
void fuzz_finish(int fd, const uint8_t *bytes, size_t len);
/* Send bytes and reset the connection at once (SO_LINGER 0). fd is consumed. */
void fuzz_reset(int fd, const uint8_t *bytes, size_t len);

#endif
