/* SPDX-License-Identifier: MIT */
/* Verbs provider: the private-data header of REP and REJ, and the goodbye datagrams that
 * tell an orderly end from a dead peer (spec/provider.md, the verbs provider). */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exs/prov/verbs/vrb.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- private data: REQ carries the length in retry_count / rnr_retry_count (3 + 3 bits),
 * so all 56 bytes of the REQ are the user's; REP and REJ carry a 4-byte header ---- */

void exs__vrb_pd_hdr(uint8_t *buf, const void *pd, uint32_t len, uint16_t port_be, uint64_t tok)
{
    buf[0] = (uint8_t)(VRB_PD_MAGIC >> 8);
    buf[1] = (uint8_t)VRB_PD_MAGIC;
    buf[2] = 0;
    buf[3] = (uint8_t)len;
    memcpy(buf + 4, &port_be, 2);
    for (int i = 0; i < 8; i++)
        buf[6 + i] = (uint8_t)(tok >> (56 - 8 * i));
    if (len)
        memcpy(buf + VRB_PD_HDR, pd, len);
}

/* 1 and the user's bytes in ev (and the goodbye port / token) when the peer's data has our
 * header. */
int exs__vrb_pd_parse(const void *data, uint32_t dlen, struct exs_prov_cm_event *ev,
                      uint16_t *port_be_p, uint64_t *tok_p)
{
    const uint8_t *b = data;
    uint32_t len;
    uint64_t tok = 0;

    if (!b || dlen < VRB_PD_HDR || b[0] != (uint8_t)(VRB_PD_MAGIC >> 8) ||
        b[1] != (uint8_t)VRB_PD_MAGIC || b[2] != 0)
        return 0;
    len = b[3];
    if (len > VRB_PD_MAX || len > dlen - VRB_PD_HDR)
        return 0;
    memcpy(ev->private_data, b + VRB_PD_HDR, len);
    ev->private_data_len = len;
    for (int i = 0; i < 8; i++)
        tok = tok << 8 | b[6 + i];
    if (port_be_p)
        memcpy(port_be_p, b + 4, 2);
    if (tok_p)
        *tok_p = tok;
    return 1;
}

/* ---- goodbye datagrams: HELLO (active -> passive, after the REP) tells the passive side
 * where to say goodbye; BYE precedes an orderly DREQ (CLOSED: the DREQ of an endpoint
 * destroyed, closed for good). A DREQ without BYE is a dead peer. */

#define VRB_DG_MAGIC  0x45585342u /* "EXSB" */
#define VRB_DG_HELLO  1u
#define VRB_DG_BYE    2u
#define VRB_DG_CLOSED 3u
#define VRB_DG_LEN    26

static void vrb_dg_send(struct vrb_ctx *ctx, const struct sockaddr_in *to, uint32_t type,
                        uint64_t dst_tok, uint64_t src_tok)
{
    uint8_t b[VRB_DG_LEN];
    uint32_t w;

    w = htonl(VRB_DG_MAGIC);
    memcpy(b, &w, 4);
    w = htonl(type);
    memcpy(b + 4, &w, 4);
    for (int i = 0; i < 8; i++) {
        b[8 + i] = (uint8_t)(dst_tok >> (56 - 8 * i));
        b[16 + i] = (uint8_t)(src_tok >> (56 - 8 * i));
    }
    memcpy(b + 24, &ctx->udp_port, 2);
    if (exs__nc_sendto(ctx->udpfd, b, sizeof(b), MSG_DONTWAIT, (const struct sockaddr *)to,
                       sizeof(*to)) < 0)
        EXS_DBG(PROV, "ctx %p: goodbye datagram: %m", (void *)ctx);
}

static struct vrb_ep *vrb_ep_by_tok(struct vrb_ctx *ctx, uint64_t tok)
{
    struct exs_list *pos;
    struct vrb_ep *found = NULL;

    if (!tok)
        return NULL;
    exs__lite_lock_st(&ctx->lock);
    exs_list_for_each(pos, &ctx->eps)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, link);

        if (ep->tok == tok) {
            found = ep;
            break;
        }
    }
    exs__lite_unlock_st(&ctx->lock);
    return found;
}

void exs__vrb_say_bye(struct vrb_ep *ep, int closed)
{
    if (ep->bye_ok && ep->up)
        vrb_dg_send(ep->ctx, &ep->peer_bye, closed ? VRB_DG_CLOSED : VRB_DG_BYE, ep->peer_tok,
                    ep->tok);
}

void exs__vrb_say_hello(struct vrb_ep *ep)
{
    vrb_dg_send(ep->ctx, &ep->peer_bye, VRB_DG_HELLO, ep->peer_tok, ep->tok);
}

static void vrb_disc_release(struct vrb_ep *ep, int status)
{
    struct exs_prov_cm_event ev;

    exs_list_del(&ep->disc_link);
    ep->disc_at = 0;
    memset(&ev, 0, sizeof(ev));
    ev.type = EXS_PROV_CM_DISCONNECTED;
    ev.ep = &ep->base;
    ev.status = status;
    if (ep->peer_closed)
        ev.flags = EXS_PROV_CM_F_PEER_CLOSED;
    exs__vrb_cm_push(ep->ctx, &ev);
}

void exs__vrb_udp_input(struct vrb_ctx *ctx)
{
    uint8_t b[64];
    struct sockaddr_in from;

    for (;;) {
        socklen_t fl = sizeof(from);
        ssize_t n =
            exs__nc_recvfrom(ctx->udpfd, b, sizeof(b), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        uint32_t magic, type;
        uint64_t dst = 0, src = 0;
        struct vrb_ep *ep;

        if (n < 0)
            return;
        if (n != VRB_DG_LEN || from.sin_family != AF_INET)
            continue;
        memcpy(&magic, b, 4);
        memcpy(&type, b + 4, 4);
        if (ntohl(magic) != VRB_DG_MAGIC)
            continue;
        for (int i = 0; i < 8; i++) {
            dst = dst << 8 | b[8 + i];
            src = src << 8 | b[16 + i];
        }
        ep = vrb_ep_by_tok(ctx, dst);
        if (!ep)
            continue;
        if (ntohl(type) == VRB_DG_HELLO && !ep->active) {
            ep->peer_tok = src;
            ep->peer_bye = from;
            memcpy(&ep->peer_bye.sin_port, b + 24, 2);
            ep->bye_ok = 1;
        } else if ((ntohl(type) == VRB_DG_BYE || ntohl(type) == VRB_DG_CLOSED) &&
                   src == ep->peer_tok) {
            ep->got_bye = 1;
            ep->peer_closed = ntohl(type) == VRB_DG_CLOSED;
            if (ep->disc_at)
                vrb_disc_release(ep, 0);
        }
    }
}

uint64_t exs__vrb_disc_due(struct vrb_ctx *ctx, uint64_t now_ns)
{
    struct exs_list *pos, *tmp;
    uint64_t next = 0;

    exs_list_for_each_safe(pos, tmp, &ctx->disc_wait)
    {
        struct vrb_ep *ep = exs_list_entry(pos, struct vrb_ep, disc_link);

        if (ep->disc_at <= now_ns) {
            EXS_DBG(PROV, "ep %p: DREQ without goodbye: the peer died", (void *)ep);
            vrb_disc_release(ep, -ECONNRESET);
        } else if (!next || ep->disc_at < next) {
            next = ep->disc_at;
        }
    }
    return next;
}
