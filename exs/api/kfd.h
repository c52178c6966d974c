/* SPDX-License-Identifier: MIT */
/* Asynchronous ES-API operations on kernel stream sockets (descriptors made by socket()/accept()).
 */
#ifndef EXS_API_KFD_H
#define EXS_API_KFD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/exs.h>

/*
 * The exs_* calls reach these when the descriptor is not a libexs socket (exs__api_sock_get
 * said ENOTSOCK). Each checks that fd is a kernel SOCK_STREAM socket (ENOTSOCK
 * otherwise), and returns as the ES-API call does: 0 (or the synchronous result), or -1
 * with errno. Operations complete through the same event queues as on libexs sockets,
 * in posting order per descriptor and direction (spec/api.md, "Kernel sockets").
 */
struct api_bounce;
/* b != NULL: exs_sendmsg / exs_recvmsg / exs_sendfile through b's buffer (buf, len and
 * mh are ignored; b is taken in any case). */
int exs__api_kfd_xfer(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
                      exs_mhandle_t mh, int recv, struct api_bounce *b);
/* exs_send: first an asynchronous send on a kernel socket already checked that can
 * complete at once (kfd.c, before anything else); anything else goes on to
 * exs__api_send_slow (xfer.c), the whole way. Both return as exs_send. */
int exs__api_kfd_send_fast(int fd, const void *buf, size_t len, int flags, exs_qhandle_t q,
                           exs_ahandle_t ah, exs_mhandle_t mh);
int exs__api_send_slow(int fd, const void *buf, size_t len, int flags, exs_qhandle_t q,
                       exs_ahandle_t ah, exs_mhandle_t mh);
int exs__api_kfd_shutdown(int fd, int how, exs_qhandle_t q, exs_ahandle_t ah);
int exs__api_kfd_close(int fd, exs_qhandle_t q, exs_ahandle_t ah);
int exs__api_kfd_cancel(int fd, exs_ahandle_t ah, int flags);
/* SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT (kept for the socket until exs_close, until
 * both are 0 with nothing pending, or until the number names another socket) and
 * SO_ASYNC_RECV_ORDERED; other options: ENOPROTOOPT. */
/* exs_sendfile of want (<= count) bytes on fd: when fd is a kernel stream socket the
 * application made non-blocking (O_NONBLOCK) and in_fd a regular file, the bytes go with
 * sendfile(2) from the posting thread, and what the socket cannot take at once is read
 * into a buffer and queued first (*taken_p = 1; returns as exs_sendfile). Otherwise, or
 * when sendfile(2) refuses the file before moving a byte, *taken_p = 0: nothing was
 * posted, the caller uses the copying path. */
ssize_t exs__api_kfd_sendfile(int fd, int in_fd, off_t offset, size_t count, size_t want,
                              exs_qhandle_t q, exs_ahandle_t ah, int *taken_p);
int exs__api_kfd_setsockopt(int fd, int level, int optname, const void *optval, socklen_t optlen);
int exs__api_kfd_getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen);
/* exs_qdequeue's sleep (evq.c): the epoll set of the kernel sockets whose operations
 * wait (-1: none yet), which a sleeping thread watches too, and the run of the queues
 * of its ready descriptors (what the progress thread does; any thread may), so that a
 * thread waiting for a kernel socket's event is woken by the socket itself. */
int exs__api_kfd_wait_fd(void);
void exs__api_kfd_run_ready(void);
/* A spinning waiter (evq.c), which never sleeps on kfd_ep: how many kernel sockets wait
 * for readiness now (an atomic load, no system call); while any does, the spinner runs
 * exs__api_kfd_run_ready itself now and then rather than count on the progress thread,
 * which needs the progress lock the spinner takes at every turn. */
int exs__api_kfd_waiting(void);
/* exs_fini: drop every pending operation without an event (before the registrations
 * and the engine go). */
void exs__api_kfd_close_all(void);
/* In a forked child (fork.c): forget the parent's kernel-socket state. */
void exs__api_kfd_fork_child(void);

/* Registrations used by kernel-socket operations (xfer.c): the registration mh when it
 * covers [buf, buf + len), held busy (exs_mderegister says EBUSY) until released.
 * -EINVAL: no such registration, or it does not cover the buffer. */
struct api_mreg;
int exs__api_mreg_hold(exs_mhandle_t mh, const void *buf, size_t len, struct api_mreg **m_p);
void exs__api_mreg_release(struct api_mreg *m);

/* Process exit (exit.c): the descriptors with a kfd (malloc'd array, count or -1), and a
 * flush mark queued behind fd's pending sends whose EXS_EVT_SHUTDOWN event on q says they
 * are all in the kernel (0; ENOENT: none pending; or an errno). */
int exs__api_kfd_fds(int **fds_p);
int exs__api_kfd_flush(int fd, exs_qhandle_t q, exs_ahandle_t ah);

#endif
