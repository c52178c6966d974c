/* SPDX-License-Identifier: MIT */
/* Names of the wire's values and the control-record walker (wire_names.h). */
#include "exs/proto/wire_names.h"

#include <endian.h>
#include <string.h>

static const char *const wire_type_names[EXS_CTRL_TYPE_MAX + 1] = {
    [EXS_CTRL_ACK] = "ACK",
    [EXS_CTRL_ADVERT] = "ADVERT",
    [EXS_CTRL_ANNOUNCE] = "ANNOUNCE",
    [EXS_CTRL_READ_DONE] = "READ_DONE",
    [EXS_CTRL_SHUTDOWN] = "SHUTDOWN",
    [EXS_CTRL_NOP] = "NOP",
    [EXS_CTRL_RING] = "RING",
    [EXS_CTRL_DRAIN] = "DRAIN",
    [EXS_CTRL_TRACE] = "TRACE",
    [EXS_CTRL_RESIZE] = "RESIZE",
    [EXS_CTRL_SESSION] = "SESSION",
    [EXS_CTRL_RESUME] = "RESUME",
    [EXS_CTRL_AUTH] = "AUTH",
    [EXS_CTRL_SHM_OFFER] = "SHM_OFFER",
    [EXS_CTRL_SHM_SWITCH] = "SHM_SWITCH",
};

const char *exs__wire_type_name(unsigned type)
{
    if (type > EXS_CTRL_TYPE_MAX || !wire_type_names[type])
        return "unknown";
    return wire_type_names[type];
}

int exs__wire_walk(const uint8_t *buf, uint32_t len, exs_wire_rec_fn *fn, void *arg)
{
    uint32_t off = 0;

    while (off < len) {
        struct exs_wire_ctrl_hdr h;
        uint32_t rlen;
        int ret;

        if (len - off < EXS_WIRE_CTRL_HDR_LEN)
            return -1;
        memcpy(&h, buf + off, sizeof(h));
        rlen = be16toh(h.len);
        if (rlen < EXS_WIRE_CTRL_HDR_LEN || rlen > len - off)
            return -1;
        ret = fn(arg, &h, buf + off, rlen);
        if (ret)
            return ret;
        off += rlen;
    }
    return 0;
}
