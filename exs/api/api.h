/* SPDX-License-Identifier: MIT */
/* Internal entry points of the api layer used by tests and tools. */
#ifndef EXS_API_API_H
#define EXS_API_API_H

/* Live library objects (sockets, connections, queues, memory handles, pending
 * operations); 0 after everything was closed. Tests assert it at the end. */
int exs__debug_live_objects(void);
/* Kernel-socket state (api/kfd.c): descriptors with operations pending, plus their
 * operations (a thread still inside a call on a descriptor may hold it a moment after
 * its last event). */
int exs__debug_kfd_live(void);
/* Every kernel descriptor the library has a cache entry for, busy or not (0 after exs_fini). */
int exs__debug_kfd_cached(void);
/* exs_poll requests (api/poll.c) not yet freed. */
int exs__debug_poll_live(void);
/* Bytes exs_sendfile moved with sendfile(2) on kernel sockets (api/kfd.c). */
unsigned long long exs__debug_kfd_sendfile_bytes(void);

#endif
