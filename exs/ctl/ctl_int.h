/* SPDX-License-Identifier: MIT */
/* Inside the control endpoint: a client, and the replies (ctl_reply.c) the server (ctl.c)
 * answers requests with. Everything here runs under the progress lock. */
#ifndef EXS_CTL_CTL_INT_H
#define EXS_CTL_CTL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "exs/ctl/ctl.h"
#include "exs/engine/engine.h"
#include "exs/util/json.h"
#include "exs/util/list.h"

struct api_sock;

/* One connected client (progress lock). */
struct ctl_client {
    struct exs_eng_io io;
    int fd;
    int events; /* EV_* watched now */
    char in[EXS_CTL_LINE_MAX];
    size_t in_len;
    struct exs_jbuf out;    /* reply or trace records not yet written */
    size_t out_off;         /* bytes of out already written */
    int trace;              /* subscribed to log records */
    int closing;            /* close once out is written */
    uint64_t dropped;       /* trace records lost for this client (its queue was full) */
    uint64_t active_ns;     /* last request or write progress */
    struct api_sock **walk; /* a stat in progress: the sockets, each referenced */
    int walk_n, walk_i;     /* their count; the next to report */
    struct exs_list link;
};

/* Milliseconds since the endpoint started. */
uint64_t exs__ctl_uptime_ms(void);

/* A reply {"ok":false,"error":"E...","message":msg} line. */
void exs__ctl_reply_error(struct exs_jbuf *b, int err, const char *msg);
/* The head every reply starts with ({"ok":true,"pid",...}, the object left open). */
void exs__ctl_reply_head(struct exs_jbuf *b);
/* "log_level": the current level, as a key of the open object. */
void exs__ctl_kv_log_level(struct exs_jbuf *b);
/* stat: the head and the socket list now (c->walk), the sockets in parts by
 * exs__ctl_stat_step each time the previous part is written; exs__ctl_stat_walk_end drops
 * the references of a walk not finished. */
void exs__ctl_req_stat(struct ctl_client *c);
void exs__ctl_stat_step(struct ctl_client *c);
void exs__ctl_stat_walk_end(struct ctl_client *c);
/* params, and set NAME VALUE. */
void exs__ctl_req_params(struct exs_jbuf *b);
void exs__ctl_req_set(struct exs_jbuf *b, const char *name, const char *value);

#endif
