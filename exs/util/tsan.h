/* SPDX-License-Identifier: MIT */
/* ThreadSanitizer annotations for an order TSan cannot see: a release at one end and an
 * acquire at the other of something it does not intercept (raw system calls, a mapping
 * seen at two addresses). Over-synchronizes under TSan only; nothing in other builds. */
#ifndef EXS_UTIL_TSAN_H
#define EXS_UTIL_TSAN_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define EXS_TSAN_RELEASE(_token) __tsan_release(_token)
#define EXS_TSAN_ACQUIRE(_token) __tsan_acquire(_token)
#else
#define EXS_TSAN_RELEASE(_token) ((void)0)
#define EXS_TSAN_ACQUIRE(_token) ((void)0)
#endif

#endif
