/* SPDX-License-Identifier: MIT */
/* The control endpoint's replies: hello, stat (streamed in parts), params and set, each a
 * JSON line (spec/observability.md). Progress lock held. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/api/api_int.h"
#include "exs/ctl/ctl.h"
#include "exs/ctl/ctl_fields.h"
#include "exs/ctl/ctl_int.h"
#include "exs/util/counters.h"
#include "exs/util/json.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/util.h"

#ifndef EXS_CTL_VERSION
#define EXS_CTL_VERSION "1"
#endif

#define CTL_STAT_BATCH 64 /* sockets a stat reports per hold of the progress lock */

/* ---- replies ---- */

static const char *errno_name(int err)
{
    switch (err) {
    case EACCES:
        return "EACCES";
    case EPERM:
        return "EPERM";
    case ENOENT:
        return "ENOENT";
    case EINVAL:
        return "EINVAL";
    case EBUSY:
        return "EBUSY";
    case ENOMEM:
        return "ENOMEM";
    case E2BIG:
        return "E2BIG";
    default:
        return "EIO";
    }
}

void exs__ctl_reply_error(struct exs_jbuf *b, int err, const char *msg)
{
    exs__jbuf_obj_begin(b);
    exs__jbuf_key(b, "ok");
    exs__jbuf_bool(b, 0);
    exs__jbuf_kv_str(b, "error", errno_name(err));
    exs__jbuf_kv_str(b, "message", msg);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

void exs__ctl_reply_head(struct exs_jbuf *b)
{
    char prog[64] = "";
    FILE *f = fopen("/proc/self/comm", "re");

    if (f) {
        if (fgets(prog, sizeof(prog), f))
            prog[strcspn(prog, "\n")] = '\0';
        fclose(f);
    }
    exs__jbuf_obj_begin(b);
    exs__jbuf_key(b, "ok");
    exs__jbuf_bool(b, 1);
    exs__jbuf_kv_u64(b, "pid", (uint64_t)getpid());
    exs__jbuf_kv_str(b, "prog", prog);
    exs__jbuf_kv_u64(b, "uid", (uint64_t)geteuid());
    exs__jbuf_kv_str(b, "version", EXS_CTL_VERSION);
    exs__jbuf_kv_str(b, "provider", exs__prov_name(exs__engine_ctx()));
    exs__jbuf_kv_u64(b, "uptime_ms", exs__ctl_uptime_ms());
}

static void addr_str(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t size)
{
    char host[INET6_ADDRSTRLEN] = "";

    buf[0] = '\0';
    if (len >= sizeof(struct sockaddr_in) && ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ss;

        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(buf, size, "%s:%u", host, ntohs(a->sin_port));
    } else if (len >= sizeof(struct sockaddr_in6) && ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;

        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(buf, size, "[%s]:%u", host, ntohs(a->sin6_port));
    }
}

#define STAT_FIELD(_f, _kind, _help) {#_f, offsetof(struct exs_sock_stats, _f)},
static const struct {
    const char *name;
    size_t off;
} stat_fields[] = {EXS_CTL_STAT_FIELDS(STAT_FIELD)};
#undef STAT_FIELD
_Static_assert(sizeof(stat_fields) / sizeof(stat_fields[0]) * sizeof(uint64_t) ==
                   sizeof(struct exs_sock_stats),
               "exsctl stat lists every EXS_SO_STATS field");

static const char *xfer_mode_name(int m)
{
    return m == EXS_XFER_DIRECT_ONLY     ? "direct"
           : m == EXS_XFER_INDIRECT_ONLY ? "indirect"
                                         : "dynamic";
}

/* One socket's row (progress lock held; the walk holds a reference to s). */
static void stat_sock(struct api_sock *s, void *arg)
{
    struct exs_jbuf *b = arg;
    struct exs_conn_info info;
    struct exs_conn *conn;
    char local[80], peer[80], id[32], why[EXS_ERROR_REASON_MAX] = "", path[EXS_PATH_MAX] = "";
    int type, mode, n_send, n_recv;
    enum api_sock_state state;

    api_sock_lock(s);
    conn = s->conn;
    type = s->type;
    mode = s->xfer_mode;
    state = s->state;
    n_send = exs__api_sock_outstanding(s, 0); /* counted without the lock (xfer.c) */
    n_recv = exs__api_sock_outstanding(s, 1);
    addr_str(&s->local, s->local_len, local, sizeof(local));
    addr_str(&s->peer, s->peer_len, peer, sizeof(peer));
    api_sock_unlock(s);
    memset(&info, 0, sizeof(info));
    if (conn)
        exs__conn_info(conn, &info); /* conn locks come without the socket's */
    exs__jbuf_obj_begin(b);
    exs__jbuf_kv_u64(b, "fd", (uint64_t)s->fd);
    snprintf(id, sizeof(id), "%p", (void *)conn);
    exs__jbuf_kv_str(b, "conn", conn ? id : "");
    exs__jbuf_kv_str(b, "type", type == SOCK_STREAM ? "stream" : "seqpacket");
    exs__jbuf_kv_str(b, "state", exs__api_sock_state_name(state));
    exs__jbuf_kv_str(b, "conn_state", conn ? info.state : "");
    exs__jbuf_kv_str(b, "local", local);
    exs__jbuf_kv_str(b, "peer", peer);
    /* the context the connection runs on: the primary or the fallback (tcp) */
    exs__jbuf_kv_str(
        b, "provider", /* a cut-over (§9.2) changes it under the conn lock */
        exs__prov_name(conn ? __atomic_load_n(&conn->ctx, __ATOMIC_RELAXED) : exs__engine_ctx()));
    /* and why it is there (spec/provider-shm.md, Chosen by itself) */
    if (conn)
        exs__conn_path(conn, path, sizeof(path));
    exs__jbuf_kv_str(b, "path", path);
    /* and its device and port ("tcp" on tcp) */
    exs__jbuf_kv_str(b, "device", conn ? info.device : exs__prov_device(exs__engine_ctx()));
    exs__jbuf_kv_str(b, "mode", xfer_mode_name(mode));
    exs__jbuf_kv_str(b, "phase", conn ? info.phase : "");
    exs__jbuf_kv_u64(b, "credits", info.credits);
    exs__jbuf_kv_u64(b, "peer_credits", info.peer_credits);
    exs__jbuf_kv_u64(b, "sends_out", (uint64_t)n_send);
    exs__jbuf_kv_u64(b, "recvs_out", (uint64_t)n_recv);
    exs__jbuf_kv_u64(b, "wr_out", info.wr_out);
    exs__jbuf_kv_u64(b, "pending", info.pending);
    exs__jbuf_kv_u64(b, "adverts_held", info.adverts_held);
    exs__jbuf_kv_u64(b, "wrq_depth", info.wr_queued);
    exs__jbuf_kv_u64(b, "age_ms", info.age_ms);
    if (conn) /* the peer's protocol violation, "" for none (spec/protocol.md §10) */
        exs__pv_reason(conn, why, sizeof(why));
    exs__jbuf_kv_str(b, "violation", why);
    for (size_t i = 0; i < EXS_ARRAY_SIZE(stat_fields); i++)
        exs__jbuf_kv_u64(b, stat_fields[i].name,
                         *(const uint64_t *)((const char *)&info.stats + stat_fields[i].off));
    exs__jbuf_obj_end(b);
}

static void counter_row(const char *set, const struct exs_counter_desc *d, uint64_t value,
                        void *arg)
{
    struct exs_jbuf *b = arg;

    exs__jbuf_obj_begin(b);
    exs__jbuf_kv_str(b, "set", set);
    exs__jbuf_kv_str(b, "name", d->name);
    exs__jbuf_kv_u64(b, "value", value);
    exs__jbuf_kv_str(b, "help", d->help ? d->help : "");
    exs__jbuf_obj_end(b);
}

/* The registered counter sets, as [{"set","name","value","help"}] (a help ending in
 * "(gauge)" marks a gauge: exsctl metrics). */
static void stat_counters(struct exs_jbuf *b)
{
    exs__jbuf_key(b, "counters");
    exs__jbuf_arr_begin(b);
    exs__counters_each(counter_row, b);
    exs__jbuf_arr_end(b);
}

/* The log level as text (through the params lock: a concurrent set rewrites the string). */
void exs__ctl_kv_log_level(struct exs_jbuf *b)
{
    char level[EXS_PARAM_STR_MAX];

    if (exs__params_get("log_level", level, sizeof(level)) < 0)
        level[0] = '\0';
    exs__jbuf_kv_str(b, "log_level", level);
}

/* A stat streams: the head now, then CTL_STAT_BATCH sockets each time the previous part
 * is written (exs__ctl_stat_step), so the progress lock is never held for all connections at once.
 */
void exs__ctl_req_stat(struct ctl_client *c)
{
    struct exs_jbuf *b = &c->out;

    if (exs__api_sock_list(&c->walk, &c->walk_n) < 0) {
        c->walk = NULL;
        exs__ctl_reply_error(b, ENOMEM, "no memory for the socket list");
        return;
    }
    c->walk_i = 0;
    exs__ctl_reply_head(b);
    exs__ctl_kv_log_level(b);
    exs__jbuf_kv_u64(b, "log_suppressed", exs__log_suppressed_total());
    exs__jbuf_key(b, "conns");
    exs__jbuf_arr_begin(b);
}

void exs__ctl_stat_walk_end(struct ctl_client *c)
{
    while (c->walk_i < c->walk_n)
        exs__api_sock_put(c->walk[c->walk_i++]);
    free(c->walk);
    c->walk = NULL;
}

/* The next sockets of a stat in progress; its end once all are there. */
void exs__ctl_stat_step(struct ctl_client *c)
{
    struct exs_jbuf *b = &c->out;

    for (int k = 0; k < CTL_STAT_BATCH && c->walk_i < c->walk_n; k++) {
        struct api_sock *s = c->walk[c->walk_i++];

        stat_sock(s, b);
        exs__api_sock_put(s);
    }
    if (c->walk_i < c->walk_n)
        return;
    exs__ctl_stat_walk_end(c);
    exs__jbuf_arr_end(b);
    stat_counters(b);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

void exs__ctl_req_params(struct exs_jbuf *b)
{
    size_t count;
    const struct exs_param_def *t = exs__params_table(&count);
    char val[EXS_PARAM_STR_MAX + 32];

    exs__ctl_reply_head(b);
    exs__jbuf_key(b, "params");
    exs__jbuf_arr_begin(b);
    for (size_t i = 0; i < count; i++) {
        if (exs__params_get(t[i].name, val, sizeof(val)) < 0)
            strcpy(val, "?");
        exs__jbuf_obj_begin(b);
        exs__jbuf_kv_str(b, "name", t[i].name);
        exs__jbuf_kv_str(b, "env", t[i].env);
        exs__jbuf_kv_str(b, "value", val);
        exs__jbuf_kv_str(b, "default", t[i].defval);
        exs__jbuf_kv_str(b, "mode", t[i].online ? "online" : "offline");
        exs__jbuf_kv_str(b, "help", t[i].help);
        exs__jbuf_obj_end(b);
    }
    exs__jbuf_arr_end(b);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}

void exs__ctl_req_set(struct exs_jbuf *b, const char *name, const char *value)
{
    const struct exs_param_def *d = exs__params_find(name);
    char old[EXS_PARAM_STR_MAX + 32], now[EXS_PARAM_STR_MAX + 32];
    char msg[256];
    int ret;

    if (!d) {
        snprintf(msg, sizeof(msg), "no tunable named %s (exsctl params lists them)", name);
        exs__ctl_reply_error(b, ENOENT, msg);
        return;
    }
    if (!d->online) {
        snprintf(msg, sizeof(msg),
                 "%s is offline: read once at start; set %s in the environment and restart", name,
                 d->env);
        exs__ctl_reply_error(b, EPERM, msg);
        return;
    }
    if (exs__params_get(name, old, sizeof(old)) < 0)
        old[0] = '\0';
    ret = exs__params_set(name, value);
    if (ret < 0) {
        snprintf(msg, sizeof(msg), "%s: invalid value \"%s\" (%s)", name, value, d->help);
        exs__ctl_reply_error(b, -ret, msg);
        return;
    }
    if (exs__params_get(name, now, sizeof(now)) < 0)
        now[0] = '\0';
    EXS_INFO(API, "control endpoint: %s changed from \"%s\" to \"%s\"", name, old, now);
    exs__ctl_reply_head(b);
    exs__jbuf_kv_str(b, "name", name);
    exs__jbuf_kv_str(b, "old", old);
    exs__jbuf_kv_str(b, "value", now);
    exs__jbuf_obj_end(b);
    exs__jbuf_raw(b, "\n", 1);
}
