/* SPDX-License-Identifier: MIT */
/* Convenience header: the ES-API. */
#ifndef EXS_H
#define EXS_H
#include <sys/exs.h>
#endif
