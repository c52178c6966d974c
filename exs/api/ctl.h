/* SPDX-License-Identifier: MIT */
/* The control endpoint: a Unix socket per process through which exsctl reads statistics,
 * reads and sets tunables and streams log records (spec/observability.md). */
#ifndef EXS_API_CTL_H
#define EXS_API_CTL_H

#include <stddef.h>

/* Longest request line, reply and queued trace output of one client. */
#define EXS_CTL_LINE_MAX    1024
#define EXS_CTL_REPLY_MAX   (8u << 20)
#define EXS_CTL_TRACE_MAX   (1u << 20)
/* Clients served at once; more are told "busy" and closed. */
#define EXS_CTL_CLIENTS_MAX 16

/* The directory of control sockets for this user into buf: EXS_CTL_DIR, else
 * $XDG_RUNTIME_DIR/exs, else /run/exs/<uid> for root, else /tmp/exs-<uid>. With create,
 * it is made (mode 0700) and checked: a directory of this uid that nobody else may use.
 * Errors: -ENAMETOOLONG, -EPERM (exists with another owner or mode, or not a directory),
 * mkdir errors. */
int exs__ctl_dir(char *buf, size_t len, int create);

/* exs_init, after the engine started (when ctl_enable): create the socket and serve it
 * from the progress loop. A failure is logged and leaves the library without endpoint. */
int exs__ctl_start(void);
/* exs_fini, before the engine stops: drop the clients and remove the socket file. */
void exs__ctl_stop(void);

#endif
