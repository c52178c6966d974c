/* SPDX-License-Identifier: MIT */
/* Porting, step 1: the byte pattern both ends of the port_step1 samples agree on. */
#ifndef SAMPLES_PORT_STEP1_H
#define SAMPLES_PORT_STEP1_H

#define PORT1_LEN (64 * 1024) /* default length of each of the two buffers */

/* Byte j of buffer A (which 0) or B (which 1). */
static inline unsigned char port1_pattern(int which, unsigned long long j)
{
    return which ? (unsigned char)(j * 13u + 5u + (j >> 11)) : (unsigned char)(j * 7u + 1u);
}

/* Byte i of the stream A B A B ... with buffers of len bytes. */
static inline unsigned char port1_byte(unsigned long long i, unsigned long long len)
{
    return port1_pattern((int)((i / len) & 1), i % len);
}

#endif
