/* SPDX-License-Identifier: MIT */
/* Unit tests of exs/util/sha256.c: the FIPS 180-4 / NIST SHA-256 examples, the RFC 4231
 * HMAC-SHA256 test cases, and the constant-time comparison. */
#include <stdio.h>
#include <string.h>

#include "exs/util/sha256.h"
#include "tests/unit/unit.h"

/* The hex of len bytes into a static buffer. */
static const char *hex(const uint8_t *p, size_t len)
{
    static char s[2 * EXS_SHA256_LEN + 1];

    for (size_t i = 0; i < len; i++)
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    return s;
}

static void expect_sha(const void *msg, size_t len, const char *want)
{
    uint8_t d[EXS_SHA256_LEN];

    exs__sha256(msg, len, d);
    ck_assert_str_eq(hex(d, sizeof(d)), want);
}

/* NIST's examples for SHA-256 (FIPS 180-4 publishes them with the standard): "abc" (one
 * block), the empty message, the 448-bit message (padding spills into a second block),
 * and a million 'a' fed in uneven pieces (the incremental path). */
START_TEST(sha_vectors)
{
    static uint8_t a[1000];
    struct exs_sha256 s;
    uint8_t d[EXS_SHA256_LEN];
    size_t done = 0, step = 1;

    expect_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    memset(a, 'a', sizeof(a));
    exs__sha256_init(&s);
    while (done < 1000000) {
        size_t n = step < 1000000 - done ? step : 1000000 - done;

        exs__sha256_update(&s, a, n);
        done += n;
        step = step * 7 % 997 + 1;
    }
    exs__sha256_final(&s, d);
    ck_assert_str_eq(hex(d, sizeof(d)),
                     "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

static void expect_hmac(const void *key, size_t klen, const void *msg, size_t mlen,
                        const char *want)
{
    const void *parts[1] = {msg};
    size_t lens[1] = {mlen};
    uint8_t d[EXS_SHA256_LEN];

    exs__hmac_sha256(key, klen, 1, parts, lens, d);
    ck_assert_str_eq(hex(d, strlen(want) / 2), want);
}

/* RFC 4231 §4.2-4.8: test cases 1 to 7 (case 5 truncated to 128 bits, as the RFC gives
 * it; 6 and 7 with a key longer than a block, hashed first). */
START_TEST(hmac_rfc4231)
{
    uint8_t k[131], m[50];

    memset(k, 0x0b, 20);
    expect_hmac(k, 20, "Hi There", 8,
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    expect_hmac("Jefe", 4, "what do ya want for nothing?", 28,
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(m, 0xdd, 50);
    expect_hmac(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++)
        k[i] = (uint8_t)(i + 1);
    memset(m, 0xcd, 50);
    expect_hmac(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0x0c, 20);
    expect_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b");
    memset(k, 0xaa, 131);
    expect_hmac(k, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54,
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    expect_hmac(k, 131,
                "This is a test using a larger than block-size key and a larger than block-size "
                "data. The key needs to be hashed before being used by the HMAC algorithm.",
                152, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}
END_TEST

/* A message given in parts is the parts one after the other; a 64-byte key (the resume
 * proof's K_A || K_B) is used as is. */
START_TEST(hmac_parts)
{
    static const char msg[] = "what do ya want for nothing?";
    const void *parts[3] = {msg, msg + 4, msg + 9};
    size_t lens[3] = {4, 5, sizeof(msg) - 1 - 9};
    const void *whole[1] = {msg};
    size_t wlen[1] = {sizeof(msg) - 1};
    uint8_t key[EXS_SHA256_BLOCK], d1[EXS_SHA256_LEN], d2[EXS_SHA256_LEN];

    for (unsigned i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)(i * 37);
    exs__hmac_sha256(key, sizeof(key), 3, parts, lens, d1);
    exs__hmac_sha256(key, sizeof(key), 1, whole, wlen, d2);
    ck_assert(exs__mem_equal_ct(d1, d2, sizeof(d1)));
    key[63] ^= 1;
    exs__hmac_sha256(key, sizeof(key), 1, whole, wlen, d2);
    ck_assert(!exs__mem_equal_ct(d1, d2, sizeof(d1)));
}
END_TEST

/* Equal, and unequal at the first, a middle and the last byte. */
START_TEST(mem_equal_ct)
{
    uint8_t a[32], b[32];

    for (unsigned i = 0; i < sizeof(a); i++)
        a[i] = b[i] = (uint8_t)i;
    ck_assert(exs__mem_equal_ct(a, b, sizeof(a)));
    ck_assert(exs__mem_equal_ct(a, b, 0));
    for (unsigned at = 0; at < sizeof(a); at += 15) {
        b[at] ^= 0x80;
        ck_assert(!exs__mem_equal_ct(a, b, sizeof(a)));
        b[at] ^= 0x80;
    }
    b[31] ^= 1;
    ck_assert(!exs__mem_equal_ct(a, b, sizeof(a)));
}
END_TEST

Suite *util_sha256_suite(void)
{
    Suite *s = suite_create("util_sha256");
    TCase *tc = tcase_create("sha256");

    tcase_add_test(tc, sha_vectors);
    tcase_add_test(tc, hmac_rfc4231);
    tcase_add_test(tc, hmac_parts);
    tcase_add_test(tc, mem_equal_ct);
    suite_add_tcase(s, tc);
    return s;
}
