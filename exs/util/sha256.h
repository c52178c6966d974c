/* SPDX-License-Identifier: MIT */
/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the resume proof (spec/protocol.md §9.2). */
#ifndef EXS_UTIL_SHA256_H
#define EXS_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define EXS_SHA256_LEN   32u /* bytes of a digest */
#define EXS_SHA256_BLOCK 64u /* bytes of a block (and of the longest HMAC key used as is) */

/* An incremental hash: init, update any number of times, final. */
struct exs_sha256 {
    uint32_t h[8];                 /* the chaining state */
    uint64_t len;                  /* bytes hashed so far */
    uint8_t buf[EXS_SHA256_BLOCK]; /* a partial block */
    uint32_t n;                    /* bytes in buf */
};

void exs__sha256_init(struct exs_sha256 *s);
void exs__sha256_update(struct exs_sha256 *s, const void *data, size_t len);
/* The digest into out; s is wiped. */
void exs__sha256_final(struct exs_sha256 *s, uint8_t out[EXS_SHA256_LEN]);
/* One call: out = SHA-256(data). */
void exs__sha256(const void *data, size_t len, uint8_t out[EXS_SHA256_LEN]);

/* out = HMAC-SHA256(key, the n parts msg[i] of len[i] bytes one after the other). */
void exs__hmac_sha256(const void *key, size_t key_len, size_t n, const void *const msg[],
                      const size_t len[], uint8_t out[EXS_SHA256_LEN]);

/* 1 when the len bytes at a and b are equal; the time taken does not depend on where
 * they differ (for MACs). */
int exs__mem_equal_ct(const void *a, const void *b, size_t len);

#endif
