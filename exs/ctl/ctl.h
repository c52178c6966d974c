/* SPDX-License-Identifier: MIT */
/* The control endpoint: a Unix socket per process through which exsctl reads statistics,
 * reads and sets tunables and streams log records (spec/observability.md). */
#ifndef EXS_CTL_CTL_H
#define EXS_CTL_CTL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

struct sockaddr_un;

/* Longest request line, reply and queued trace output of one client. */
#define EXS_CTL_LINE_MAX    1024
#define EXS_CTL_REPLY_MAX   (8u << 20)
#define EXS_CTL_TRACE_MAX   (1u << 20)
/* Clients served at once; more are told "busy" and closed. */
#define EXS_CTL_CLIENTS_MAX 16

/* The directory of control sockets for this user into buf: EXS_CTL_DIR, else
 * $XDG_RUNTIME_DIR/exs, else /run/exs/0 for root, else /tmp/exs-<uid>. With create, it is
 * made (mkdir, mode 0700) when missing; an existing one is left as it is (exs__ctl_dir_open
 * checks it). Errors: -ENAMETOOLONG, mkdir errors. */
int exs__ctl_dir(char *buf, size_t len, int create);

/* Owners exsctl may trust besides its own uid and root (the "also" arguments): none, any
 * (a root caller listing a directory), or the library's own rule (exs__ctl_dir_trust). */
#define EXS_CTL_UID_NONE ((uid_t)-1)
#define EXS_CTL_UID_ANY  ((uid_t)-2)
#define EXS_CTL_UID_LIB  ((uid_t)-3)

/* exsctl's rule for an owner (of the directory, the socket file, the serving process): uid
 * (the caller), root, or also (a root caller's target: the uid of the process asked for). */
int exs__ctl_uid_ok(uid_t owner, uid_t uid, uid_t also);
/* May a process of uid use the control directory st describes (also EXS_CTL_UID_LIB: the
 * library, to put its socket there) or trust it (exsctl: owner per exs__ctl_uid_ok)?
 * spec/observability.md §2: 0 a private directory, 1 a shared one (sticky, writable by
 * others), -EPERM when neither, with the reason in why ("belongs to uid 65534 ...", for
 * a message "directory <dir> <why>"). */
int exs__ctl_dir_trust(const struct stat *st, uid_t uid, uid_t also, char *why, size_t size);
/* Open dir (O_DIRECTORY | O_NOFOLLOW) and check what was opened (fstat, exs__ctl_dir_trust
 * for geteuid()): the descriptor, *shared_p set; or -errno (-ENOENT, -ELOOP a symbolic link,
 * -EPERM refused, ...) with the reason in why. */
int exs__ctl_dir_open(const char *dir, uid_t also, int *shared_p, char *why, size_t size);
/* The address of name inside the opened directory dfd (/proc/self/fd/<dfd>/<name>): a
 * bind or connect to it resolves no directory name again. */
void exs__ctl_sockaddr_at(int dfd, const char *name, struct sockaddr_un *sa);

/* Every field of EXS_SO_STATS (struct exs_sock_stats, in its order), as exsctl stat shows
 * it (ctl_reply.c) and exsctl metrics exports it: X(name, kind, help), kind 'c' a counter
 * (only grows), 'g' a gauge that adds up over sockets, 'v' one that does not. A field
 * appended to the struct is appended here (a static assertion in ctl_reply.c fails
 * otherwise). */
#define EXS_CTL_STAT_FIELDS(X)                                                                     \
    X(bytes_sent, 'c', "bytes sent (payload)")                                                     \
    X(bytes_received, 'c', "bytes received (payload)")                                             \
    X(direct_xfers, 'c', "transfers written straight into an advertised user buffer")              \
    X(indirect_xfers, 'c', "transfers written into the hidden receive ring")                       \
    X(mode_switches, 'c', "direct/indirect phase changes seen by the sender")                      \
    X(adverts_sent, 'c', "ADVERTs of receive buffers sent")                                        \
    X(adverts_received, 'c', "ADVERTs of the peer's receive buffers received")                     \
    X(adverts_discarded, 'c', "stale ADVERTs dropped by the sender")                               \
    X(credit_stalls, 'c', "sends that waited for credits")                                         \
    X(keepalive_probes, 'c', "keepalive probes sent")                                              \
    X(batches_sent, 'c', "ring writes that carried several sends")                                 \
    X(msgs_batched, 'c', "sends that left inside a batch")                                         \
    X(batch_thresh, 'v', "the elastic batch threshold now, bytes (0: batching off)")               \
    X(direct_time_us, 'c', "time the sender spent in direct phases, microseconds")                 \
    X(indirect_time_us, 'c', "time the sender spent in indirect phases, microseconds")             \
    X(drain_requests, 'c', "return-to-direct requests sent (receiver) and honoured (sender)")      \
    X(ring_resizes, 'c', "receive ring size changes (autotuning)")                                 \
    X(ring_size, 'g', "receive ring size now, bytes")                                              \
    X(ring_fill, 'g', "bytes waiting in the receive ring now")                                     \
    X(rnr_events, 'c', "receiver-not-ready events (must stay 0)")                                  \
    X(fragments, 'c', "work requests that carried part of a larger transfer")                      \
    X(wr_queued, 'c', "work requests that waited behind the per-connection cap")                   \
    X(nops_sent, 'c', "NOPs that broke a full-window deadlock")                                    \
    X(keepalive_timeouts, 'c', "1 once keepalive declared the peer dead")                          \
    X(srtt_us, 'v', "smoothed round-trip time, microseconds (0: not measured yet)")                \
    X(ring_grow_refused, 'c', "ring grows refused by the process's ring budget")                   \
    X(sends_copied, 'c', "STREAM sends copied into the send buffer and completed at once")         \
    X(keepalive_answers, 'c', "keepalive PINGs of the peer answered")

/* exs_init, after the engine started (when ctl_enable): create the socket and serve it
 * from the progress loop. A failure is logged and leaves the library without endpoint. */
int exs__ctl_start(void);
/* exs_fini, before the engine stops: drop the clients and remove the socket file. */
void exs__ctl_stop(void);

#endif
