/* SPDX-License-Identifier: MIT */
/* Event queues: the objects behind exs_qhandle_t, with reserved slots so no event is dropped. */
#ifndef EXS_API_EVQ_H
#define EXS_API_EVQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/exs.h>

/*
 * Lifetime: exs_qcreate makes a queue and returns its handle (a small int, never 0..2
 * collisions matter; handles are reused only after a long cycle so a stale handle is
 * EINVAL, not another queue). Internally a queue is reached by handle with
 * exs__evq_get() which takes a reference; exs__evq_put() drops it. exs_qdelete marks the
 * queue dead (later gets fail) and frees it when the last reference goes.
 *
 * Reservation: every operation accepted by a posting call owns one reserved slot in its
 * queue from the posting call until its event is delivered. exs__evq_reserve() fails with
 * -EAGAIN when depth slots are already taken (queued + reserved). exs__evq_post() then
 * always succeeds; exs__evq_unreserve() returns a slot when the post is abandoned.
 *
 * Thread safety: all calls from any thread; post may run on the progress thread while
 * another thread is blocked in exs_qdequeue on the same queue.
 */

struct exs_evq;

/* Look up a queue by handle and take a reference. -EINVAL: no such live queue. */
int exs__evq_get(exs_qhandle_t q, struct exs_evq **evq_p);
/* exs__evq_get's second step (no lock): evq, read from q's slot at some moment, with a
 * reference when it is still q's live queue: 0, or -EINVAL (nothing held) when it is
 * parked or serves another handle now. */
int exs__evq_hold(exs_qhandle_t q, struct exs_evq *evq, struct exs_evq **evq_p);
void exs__evq_put(struct exs_evq *evq);
/* The handle of a queue. */
exs_qhandle_t exs__evq_handle(const struct exs_evq *evq);

/* Reserve one slot (one CAS, no lock). -EAGAIN: the queue is full (queued + reserved ==
 * depth); -EINVAL: the queue is being deleted. A reserved slot pins the queue until the
 * matching post or unreserve (exs_qdelete says EBUSY; exs_fini's kill leaves the queue's
 * memory to the last slot): it takes no reference. */
int exs__evq_reserve(struct exs_evq *evq);
/* Look q up (without the table's lock) and reserve one slot in it, which pins *evq_p:
 * 0, or the errno for the application (EINVAL, EAGAIN). */
int exs__evq_reserve_handle(exs_qhandle_t q, struct exs_evq **evq_p);
/* Free what exs__evq_reserve_alloc (evq_int.h) allocated (size: the same as given to it). Blocks of
 * operation size go back to a small per-thread cache instead of malloc. */
void exs__evq_op_free(void *mem, size_t size);
/* Largest block the cache keeps: every operation of the api (xfer.c asserts it). */
#define EXS_EVQ_OP_BLOCK 384
/* Release the calling thread's cache of operation blocks (exs_fini; threads release theirs
 * when they exit). */
void exs__evq_op_cache_flush(void);
void exs__evq_unreserve(struct exs_evq *evq);
/* Queue an event into a slot reserved earlier; wakes waiters and makes exs_qfd readable. */
void exs__evq_post(struct exs_evq *evq, const exs_event_t *ev);
/* The same for a successful transfer's event (errno 0, flags 0), written in place in the
 * ring: the header and exs_evt_xfer are written whole; the rest of the union (which a
 * transfer's event does not use) keeps what the ring entry held. */
void exs__evq_post_xfer(struct exs_evq *evq, int type, int fd, exs_ahandle_t ah, void *buf,
                        size_t len, ssize_t result);

/* Number of live application queues (leak checks in tests); a thread's synchronous-call
 * queue is not one of them: exs__evq_private_live_count counts those. */
int exs__evq_live_count(void);
int exs__evq_private_live_count(void);
/* Operations outstanding (leak checks in tests): the slots reserved in the queues in the
 * table (private ones too) whose events are not queued yet. Read by walking the queues:
 * the posting and completing paths keep no count of their own (evq.c). */
int exs__evq_ops_live(void);
/* A queue for one thread's synchronous calls (exs_qcreate otherwise; errno on failure). */
exs_qhandle_t exs__evq_create_private(int depth);
/* Make q ready for another synchronous call: discard queued events. -EBUSY: an
 * operation still holds a slot (the queue must not be reused); -EINVAL: no such queue. */
int exs__evq_clean(exs_qhandle_t q);
/* Free every queue (exs_fini). */
void exs__evq_destroy_all(void);
/* fork(2) (fork.c; phase: enum exs_fork_phase): the handle table's lock held across it;
 * in the child every queue of the parent is gone (EINVAL) and its descriptors closed. */
void exs__evq_fork(int phase);

/* A busy wait's spin reads the clock every n turns, n = exs__evq_spin_every(time per turn
 * last measured (0: unknown), time left to its end): a quarter of the time left at that
 * speed, between EVQ_SPIN_EVERY_MIN and EVQ_SPIN_EVERY_MAX turns. */
#define EVQ_SPIN_EVERY_MIN 16u
#define EVQ_SPIN_EVERY_MAX 1024u
uint32_t exs__evq_spin_every(uint64_t spin_ns, uint64_t left_ns);

/* The learned spin of a queue that waits as the library's default (spec/api.md, "Wait
 * modes"): exs__evq_spin_limit gives a wait's spin from the queue's average seen (ns),
 * the floor (EXS_QWAIT_SPIN_US) and the ceiling (EXS_QWAIT_SPIN_MAX_US): twice the
 * average, within them, while the average is below three quarters of the ceiling; past
 * that the floor, and the ceiling for a probe (every EVQ_LEARN_PROBE_EVERY-th wait), so a
 * queue whose waits became short again finds out. A ceiling at or below the floor: the
 * floor. *sample: whether the wait's outcome is learned (not that of a wait held to the
 * floor past three quarters, which would only say again that it slept). Then
 * exs__evq_spin_learn moves the average an eighth of the way to the wait's sample: the
 * time its spin took to find the events, or the ceiling for a wait that slept. */
#define EVQ_LEARN_PROBE_EVERY 8u
/* A queue learns while it waits as a new queue does (EXS_WAIT_ADAPTIVE with the spin
 * EXS_QWAIT_SPIN_US, not 0): set back to that (a program that read the mode and spin and
 * sets them again), it learns again; any other setting is the application's, fixed. */
int exs__evq_wait_is_default(int mode, int spin_us);
uint64_t exs__evq_spin_limit(uint64_t seen_ns, uint64_t floor_ns, uint64_t ceil_ns, int probe,
                             int *sample);
uint64_t exs__evq_spin_learn(uint64_t seen_ns, uint64_t sample_ns);

#endif
