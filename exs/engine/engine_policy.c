/* SPDX-License-Identifier: MIT */
/* The engine's pure rules, kept apart from its state (engine.c): which extra provider
 * context a primary gets (fallback tcp, or shm beside tcp), and the hysteresis of the
 * progress hand-off (spec/threading.md §4). */
#include <string.h>

#include "exs/engine/engine.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

uint64_t exs__engine_hyst_ns(uint64_t remembered_ns, uint64_t lease_ns)
{
    uint64_t h = EXS_MIN(2 * remembered_ns, (uint64_t)EXS_ENG_HYST_LEASES * lease_ns);

    return EXS_MAX(h, lease_ns);
}

unsigned exs__engine_lease_grow(unsigned mult)
{
    return mult >= EXS_ENG_LEASE_GROW / 2 ? EXS_ENG_LEASE_GROW : EXS_MAX(2 * mult, 1u);
}

uint64_t exs__engine_lease_after(uint64_t hyst_left_ns, uint64_t lease_ns)
{
    uint64_t a = EXS_MIN(hyst_left_ns, (uint64_t)EXS_ENG_HYST_LEASES * lease_ns);

    return EXS_MAX(a, lease_ns);
}

/* The fallback policy for primary provider name (spec/provider.md, Fallback). */
int exs__engine_fb_policy_for(const char *primary)
{
    const char *p = exs__params.fallback;

    if (strcmp(primary, "tcp") == 0 || strcmp(p, "off") == 0)
        return EXS_ENG_FB_OFF;
    if (strcmp(p, "connect") == 0)
        return EXS_ENG_FB_CONNECT;
    if (strcmp(p, "any") == 0)
        return EXS_ENG_FB_ANY;
    /* auto: a real RDMA primary only; fault:verbs is a test set-up whose injected
     * connect failures must reach the application (tests/integ/test_integ_fault.c) */
    return strcmp(primary, "verbs") == 0 ? EXS_ENG_FB_CONNECT : EXS_ENG_FB_OFF;
}

/* The shm provider beside primary (spec/provider-shm.md, Chosen by itself): EXS_SHM on,
 * or auto with tcp chosen by default (an explicit EXS_PROVIDER=tcp asks for tcp) and no
 * link emulation (the emulated link is tcp's); only beside tcp. */
int exs__engine_shm_wanted(const char *primary)
{
    const char *p = exs__params.shm;

    if (strcmp(primary, "tcp") != 0 || strcmp(p, "off") == 0 || strcmp(p, "0") == 0)
        return 0;
    if (strcmp(p, "on") == 0 || strcmp(p, "1") == 0)
        return 1;
    return !exs__params.provider[0] && !exs__params.emu_delay_us && !exs__params.emu_rate_mbps &&
           !exs__params.emu_blackhole;
}
