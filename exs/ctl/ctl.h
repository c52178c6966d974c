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

/* exs_init, after the engine started (when ctl_enable): create the socket and serve it
 * from the progress loop. A failure is logged and leaves the library without endpoint. */
int exs__ctl_start(void);
/* exs_fini, before the engine stops: drop the clients and remove the socket file. */
void exs__ctl_stop(void);
/* In a forked child (exs/api/fork.c): close the child's copies of the parent's endpoint. */
void exs__ctl_fork_child(void);

#endif
