/* SPDX-License-Identifier: MIT */
/* Names of the wire's values (exs/proto/wire.h), for logs, violations and test walkers. */
#ifndef EXS_PROTO_WIRE_NAMES_H
#define EXS_PROTO_WIRE_NAMES_H

#include <stdint.h>

#include "exs/proto/wire.h"

/* A control record type by name ("ACK", "ADVERT", ..., "AUTH"); "unknown" for any other
 * value. The one decoder: logs, violations and the tests' record walkers use it. */
const char *exs__wire_type_name(unsigned type);

/*
 * The records of a control SEND (§5), in order: fn(arg, hdr, rec, rlen) for each, rec
 * pointing at its first byte (the header) and rlen its length from the header, checked
 * to be at least the header and within the SEND. A nonzero return of fn stops the walk
 * and is returned. Otherwise 0 when the records fill len exactly, -1 when one is
 * malformed (a header cut short, a length below the header or past the end: the walk
 * stops before it). Hosts no protocol rule beyond that framing: the library's own
 * receive path checks more (conn.c); test walkers and tools use this one.
 */
typedef int exs_wire_rec_fn(void *arg, const struct exs_wire_ctrl_hdr *hdr, const uint8_t *rec,
                            uint32_t rlen);
int exs__wire_walk(const uint8_t *buf, uint32_t len, exs_wire_rec_fn *fn, void *arg);

#endif
