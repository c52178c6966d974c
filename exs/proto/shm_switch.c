/* SPDX-License-Identifier: MIT */
/* Shared memory chosen by itself (spec/provider-shm.md, Chosen by itself; spec/protocol.md
 * §9.2): over the primary path both sides say where they run (SHM_OFFER); when the offers
 * name one host, name space and user, the passive side agrees (SHM_SWITCH) and the
 * active side, once the peer's shm listener showed the credentials of the process the
 * peer claimed to be, cuts the connection over to the shm context with the cut-over of
 * §9.2 (a planned one: nothing failed). Otherwise the connection stays where it is, and
 * why is kept (EXS_SO_PATH, exsctl stat). Layer 4 of spec/proto-layout.md. */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exs/proto/proto_int.h"
#include "exs/proto/shm_switch.h"
#include "exs/util/counters.h"
#include "exs/util/log.h"
#include "exs/util/nocancel.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

struct exs_shmsw_counters {
    uint64_t shm_offers;
    uint64_t shm_switches;
    uint64_t shm_declined_peer;
    uint64_t shm_declined_host;
    uint64_t shm_declined_user;
    uint64_t shm_declined_listener;
    uint64_t shm_declined_at_peer;
};

static struct exs_shmsw_counters shmsw_cnt;

static const struct exs_counter_desc shmsw_counter_desc[] = {
    EXS_COUNTER(struct exs_shmsw_counters, shm_offers, "SHM_OFFER records taken from peers"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_switches,
                "connections whose cut-over to shm began (each end counts)"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_declined_peer,
                "connections kept on the primary: the peer has no shm (or its policy is off)"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_declined_host,
                "... the peer runs on another host or network name space"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_declined_user, "... the peer runs as another user"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_declined_listener,
                "... the peer's shm listener was not found, or is not the process it claimed "
                "(active side)"),
    EXS_COUNTER(struct exs_shmsw_counters, shm_declined_at_peer,
                "... the active side declined our SHM_SWITCH (passive side)"),
};

static struct exs_counter_set shmsw_cset = {
    .name = "shm_path",
    .desc = shmsw_counter_desc,
    .count = sizeof(shmsw_counter_desc) / sizeof(shmsw_counter_desc[0]),
    .base = &shmsw_cnt,
};

void exs__shmsw_cset_register(void)
{
    exs__counters_register(&shmsw_cset);
}

/* ---- where this process runs ---- */

static struct {
    uint8_t host_id[16]; /* all 0: unknown, never matches */
    uint64_t netns;
} shmsw_here;
static pthread_once_t shmsw_here_once = PTHREAD_ONCE_INIT;

static void shmsw_here_init(void)
{
    char text[64];
    struct stat st;
    ssize_t n = 0;
    int fd = exs__nc_open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    unsigned got = 0;
    uint8_t id[16];

    if (fd >= 0) {
        n = exs__nc_read(fd, text, sizeof(text) - 1);
        exs__nc_close(fd);
    }
    /* a UUID's 32 hex digits, dashes skipped */
    for (ssize_t i = 0; i < n && got < 32; i++) {
        int v = exs__hex_digit(text[i]);

        if (v < 0)
            continue;
        if (got % 2 == 0)
            id[got / 2] = (uint8_t)(v << 4);
        else
            id[got / 2] |= (uint8_t)v;
        got++;
    }
    if (got == 32)
        memcpy(shmsw_here.host_id, id, sizeof(id));
    else
        EXS_INFO(PROTO, "shm: no boot id (/proc/sys/kernel/random/boot_id): no peer is taken "
                        "for this host's");
    if (stat("/proc/self/ns/net", &st) == 0)
        shmsw_here.netns = (uint64_t)st.st_ino;
}

static void shmsw_offer_make(struct exs_wire_shm_offer *o)
{
    uint64_t pid = exs__params.test_shm_pid ? exs__params.test_shm_pid : (uint64_t)getpid();

    pthread_once(&shmsw_here_once, shmsw_here_init);
    memset(o, 0, sizeof(*o));
    o->hdr.type = EXS_CTRL_SHM_OFFER;
    o->hdr.len = htobe16(EXS_WIRE_SHM_OFFER_LEN);
    memcpy(o->host_id, shmsw_here.host_id, sizeof(o->host_id));
    o->netns = htobe64(shmsw_here.netns);
    o->uid = htobe32((uint32_t)geteuid());
    o->pid = htobe32((uint32_t)pid);
}

/* ---- the decision ---- */

/* Active side that stays after the passive side's SHM_SWITCH: tell it (SHM_SWITCH with
 * DECLINED), so that it gives up the cut-over too and a later failure of the path ends
 * its end at once rather than after connect_timeout_ms of waiting for our resume. */
static void shmsw_decline_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr no = {.type = EXS_CTRL_SHM_SWITCH,
                                   .flags = EXS_WIRE_SHM_SWITCH_DECLINED,
                                   .len = htobe16(EXS_WIRE_SHM_SWITCH_LEN)};

    if (!conn->active || !conn->shmsw.sw || conn->shmsw.declined)
        return;
    conn->shmsw.declined = 1;
    if (!exs__conn_ctrl_room_locked(conn, sizeof(no)))
        (void)exs__conn_ctrl_flush_locked(conn);
    if (!exs__conn_ctrl_room_locked(conn, sizeof(no))) {
        EXS_INFO(PROTO,
                 "conn %p: no room to decline the peer's SHM_SWITCH: a failure of the "
                 "path leaves the peer waiting for a resume",
                 (void *)conn);
        return;
    }
    exs__conn_ctrl_append_locked(conn, &no, sizeof(no));
}

/* A connection that stays on its path: the cut-over only shm made possible (the session
 * of a connection whose fallback is the shm context) is given up, so that a later failure
 * of the path ends it as before rather than waiting for a shm path that cannot come. */
static void shmsw_stay_locked(struct exs_conn *conn, int reason, uint64_t *cnt)
{
    if (conn->shmsw.reason == reason)
        return;
    conn->shmsw.reason = reason;
    exs__resume_give_up_locked(conn); /* and its copies go (a tcp conn keeps its path) */
    conn->resume_noted = 1;
    if (cnt)
        EXS_CNT_INC(*cnt);
    shmsw_decline_locked(conn);
    if (strcmp(exs__params.shm, "on") == 0 || strcmp(exs__params.shm, "1") == 0) {
        char why[EXS_PATH_MAX];

        exs__shmsw_path_locked(conn, why, sizeof(why));
        EXS_INFO(PROTO, "conn %p: stays on its path: %s", (void *)conn, why);
    }
}

/* Active side: is the peer's shm listener (the port the cut-over connects to) the process
 * the peer's offer named, of our user? */
static int shmsw_listener_is_peer_locked(struct exs_conn *conn)
{
    struct exs_prov_ctx *ctx = NULL;
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    uint32_t pid = 0, uid = 0;
    int ret;

    ret = conn->cb->resume_addr ? conn->cb->resume_addr(conn, &ctx, &addr, &len) : -EOPNOTSUPP;
    if (!ret)
        ret = exs__prov_shm_peer(ctx, (struct sockaddr *)&addr, len, &pid, &uid);
    if (ret) {
        conn->shmsw.err = -ret;
        shmsw_stay_locked(conn, EXS_SHMSW_NO_LISTENER, &shmsw_cnt.shm_declined_listener);
        return 0;
    }
    if (pid != conn->shmsw.peer_pid || uid != (uint32_t)geteuid()) {
        EXS_INFO(PROTO,
                 "conn %p: the shm listener of the peer's port is pid %u uid %u, the peer "
                 "claimed pid %u: not switched",
                 (void *)conn, pid, uid, conn->shmsw.peer_pid);
        shmsw_stay_locked(conn, EXS_SHMSW_NOT_PEER, &shmsw_cnt.shm_declined_listener);
        return 0;
    }
    return 1;
}

/* Both offers known: the passive side agrees, the active side switches. */
static void shmsw_decide_locked(struct exs_conn *conn)
{
    struct exs_wire_ctrl_hdr sw = {.type = EXS_CTRL_SHM_SWITCH,
                                   .len = htobe16(EXS_WIRE_SHM_SWITCH_LEN)};

    if (!conn->shmsw.sent || !conn->shmsw.got || conn->state != EXS_CONN_CONNECTED ||
        conn->shmsw.reason != EXS_SHMSW_DECIDING)
        return;
    if (!conn->shmsw.match)
        return; /* noted when the offer came */
    if (conn->txshut != EXS_TXSHUT_OPEN || conn->peer_shut || !conn->sess_token ||
        conn->resume.over) {
        shmsw_stay_locked(conn, EXS_SHMSW_ENDING, NULL);
        return;
    }
    if (!conn->active) {
        if (conn->shmsw.sw)
            return;
        if (!exs__conn_ctrl_room_locked(conn, sizeof(sw)))
            (void)exs__conn_ctrl_flush_locked(conn);
        if (!exs__conn_ctrl_room_locked(conn, sizeof(sw))) {
            shmsw_stay_locked(conn, EXS_SHMSW_NO_ROOM, NULL);
            return;
        }
        exs__conn_ctrl_append_locked(conn, &sw, sizeof(sw));
        conn->shmsw.sw = 1;
        conn->shmsw.reason = EXS_SHMSW_SWITCHING; /* the active side cuts over */
        EXS_CNT_INC(shmsw_cnt.shm_switches);
        return;
    }
    if (!conn->shmsw.sw || conn->shmsw.started || !shmsw_listener_is_peer_locked(conn))
        return;
    conn->shmsw.started = 1;
    conn->shmsw.reason = EXS_SHMSW_SWITCHING;
    EXS_CNT_INC(shmsw_cnt.shm_switches);
    EXS_INFO(PROTO, "conn %p: the peer (pid %u) is on this host: cut over to shm", (void *)conn,
             conn->shmsw.peer_pid);
    (void)exs__resume_begin_locked(conn, "switch to shm (same host)", 0, 0);
}

void exs__shmsw_established_locked(struct exs_conn *conn)
{
    struct exs_wire_shm_offer o;

    if (conn->state != EXS_CONN_CONNECTED || conn->shmsw.sent)
        return;
    if (!conn->p.shm) {
        conn->shmsw.reason = EXS_SHMSW_OFF;
        return;
    }
    if (!(conn->peer.features & EXS_WIRE_FEAT_SHM) || !exs__resume_negotiated(conn)) {
        if (conn->shmsw.got) { /* the peer's offer overtook our event: its hello lacks the bit */
            (void)exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_SHM_OFFER,
                                       "the peer's hello lacks bit 10");
            exs__conn_fail_locked(conn, ECONNRESET, "peer broke the protocol");
            return;
        }
        shmsw_stay_locked(conn, EXS_SHMSW_PEER_NO, &shmsw_cnt.shm_declined_peer);
        return;
    }
    shmsw_offer_make(&o);
    exs__conn_ctrl_append_locked(conn, &o, sizeof(o));
    conn->shmsw.sent = 1;
    if (conn->shmsw.reason == EXS_SHMSW_OFF)
        conn->shmsw.reason = EXS_SHMSW_DECIDING;
    shmsw_decide_locked(conn);
}

int exs__shmsw_on_offer(struct exs_conn *conn, const uint8_t *rec,
                        const struct exs_wire_ctrl_hdr *h)
{
    struct exs_wire_shm_offer o, mine;
    static const uint8_t zero[16];

    memcpy(&o, rec, sizeof(o));
    /* before the active side's ESTABLISHED event the peer's hello is not adopted yet: its
     * bit is checked then (exs__shmsw_established_locked) */
    if (!conn->p.shm ||
        (conn->peer.magic == EXS_WIRE_MAGIC && !(conn->peer.features & EXS_WIRE_FEAT_SHM)))
        return exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_SHM_OFFER,
                                    "feature SHM (bit 10) not negotiated");
    if (conn->shmsw.got)
        return exs__proto_violation(conn, EXS_PV_SHM, EXS_CTRL_SHM_OFFER, "a second one");
    if (h->flags || memcmp(o.rsvd, zero, sizeof(o.rsvd)))
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_SHM_OFFER,
                                    "flags %#x or reserved bytes set", h->flags);
    EXS_CNT_INC(shmsw_cnt.shm_offers);
    conn->shmsw.got = 1;
    conn->shmsw.peer_pid = be32toh(o.pid);
    shmsw_offer_make(&mine);
    conn->shmsw.reason = EXS_SHMSW_DECIDING;
    if (!memcmp(o.host_id, zero, sizeof(zero)) ||
        memcmp(o.host_id, mine.host_id, sizeof(o.host_id)))
        shmsw_stay_locked(conn, EXS_SHMSW_OTHER_HOST, &shmsw_cnt.shm_declined_host);
    else if (o.netns != mine.netns)
        shmsw_stay_locked(conn, EXS_SHMSW_OTHER_NETNS, &shmsw_cnt.shm_declined_host);
    else if (o.uid != mine.uid)
        shmsw_stay_locked(conn, EXS_SHMSW_OTHER_USER, &shmsw_cnt.shm_declined_user);
    else
        conn->shmsw.match = 1;
    shmsw_decide_locked(conn);
    return 0;
}

int exs__shmsw_on_switch(struct exs_conn *conn, const uint8_t *rec,
                         const struct exs_wire_ctrl_hdr *h)
{
    (void)rec;
    if (!conn->p.shm)
        return exs__proto_violation(conn, EXS_PV_FEATURE, EXS_CTRL_SHM_SWITCH,
                                    "feature SHM (bit 10) not negotiated");
    if (h->flags & ~EXS_WIRE_SHM_SWITCH_DECLINED)
        return exs__proto_violation(conn, EXS_PV_RESERVED, EXS_CTRL_SHM_SWITCH, "flags %#x set",
                                    h->flags);
    if (h->flags & EXS_WIRE_SHM_SWITCH_DECLINED) {
        if (conn->active || !conn->shmsw.sw || conn->shmsw.declined)
            return exs__proto_violation(conn, EXS_PV_SHM, EXS_CTRL_SHM_SWITCH, "%s",
                                        conn->active           ? "DECLINED from the passive side"
                                        : conn->shmsw.declined ? "a second DECLINED"
                                                               : "DECLINED before our SHM_SWITCH");
        conn->shmsw.declined = 1;
        /* unless we stay already (shutting down): the session's cut-over is given up */
        if (conn->shmsw.reason == EXS_SHMSW_SWITCHING)
            shmsw_stay_locked(conn, EXS_SHMSW_DECLINED, &shmsw_cnt.shm_declined_at_peer);
        return 0;
    }
    if (!conn->active)
        return exs__proto_violation(conn, EXS_PV_SHM, EXS_CTRL_SHM_SWITCH, "from the active side");
    if (!conn->shmsw.got || conn->shmsw.sw)
        return exs__proto_violation(conn, EXS_PV_SHM, EXS_CTRL_SHM_SWITCH, "%s",
                                    conn->shmsw.sw ? "a second one"
                                                   : "before the peer's SHM_OFFER");
    conn->shmsw.sw = 1;
    /* a passive side whose offer did not match ours never sends one */
    if (!conn->shmsw.match)
        return exs__proto_violation(conn, EXS_PV_SHM, EXS_CTRL_SHM_SWITCH,
                                    "after offers that do not match");
    shmsw_decide_locked(conn);
    return 0;
}

/* ---- what shows ---- */

void exs__shmsw_path_locked(const struct exs_conn *conn, char *buf, size_t len)
{
    const char *prov = exs__prov_name(conn->ctx);
    const char *why = "";
    char tmp[96];

    switch (conn->shmsw.reason) {
    case EXS_SHMSW_OFF: /* no switch here: a conn made on shm itself was chosen so */
        why = strcmp(prov, "shm") == 0 ? "provider chosen" : "shm off here";
        break;
    case EXS_SHMSW_PEER_NO:
        why = "peer has no shm";
        break;
    case EXS_SHMSW_DECIDING:
        why = "deciding";
        break;
    case EXS_SHMSW_OTHER_HOST:
        why = "other host";
        break;
    case EXS_SHMSW_OTHER_NETNS:
        why = "other network namespace";
        break;
    case EXS_SHMSW_OTHER_USER:
        why = "other user";
        break;
    case EXS_SHMSW_NO_LISTENER:
        snprintf(tmp, sizeof(tmp), "peer's shm listener not found (%s)", strerror(conn->shmsw.err));
        why = tmp;
        break;
    case EXS_SHMSW_NOT_PEER:
        why = "peer's shm listener is another process";
        break;
    case EXS_SHMSW_NO_ROOM:
        why = "no room for SHM_SWITCH";
        break;
    case EXS_SHMSW_ENDING:
        why = "shut down before the switch";
        break;
    case EXS_SHMSW_DECLINED:
        why = "peer declined the switch";
        break;
    case EXS_SHMSW_SWITCHING:
        why = conn->resume.over && strcmp(prov, "shm") == 0 ? "same host" : "switching";
        break;
    default:
        break;
    }
    snprintf(buf, len, "%s: %s", prov, why);
}

int exs__conn_path(struct exs_conn *conn, char *buf, size_t len)
{
    EXS_LITE_LOCK(&conn->lock, EXS_LOCK_CONN);
    exs__shmsw_path_locked(conn, buf, len);
    EXS_LITE_UNLOCK(&conn->lock, EXS_LOCK_CONN);
    return (int)strlen(buf) + 1;
}
