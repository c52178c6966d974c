/* SPDX-License-Identifier: MIT */
/* A client of the test process's own control endpoint, shared by the ctl and trace suites. */
#ifndef EXS_TESTS_INTEG_CTL_H
#define EXS_TESTS_INTEG_CTL_H

#include "exs/util/json.h"

/* The control directory of this test process, /tmp/exs-integ-<tag>-<pid>, set as
 * EXS_CTL_DIR (call before it_init; the library makes the directory). */
const char *it_ctl_setup(const char *tag);
/* The directory it_ctl_setup chose, for checks of it (removed by the caller: rmdir). */
const char *it_ctl_dir(void);
/* The path of this process's endpoint socket. */
void it_ctl_path(char *buf, size_t len);
/* A connected client of the endpoint (asserted). */
int it_ctl_open(void);
/* One line from fd within ms, its newline cut (NULL on timeout); the caller frees it. */
char *it_ctl_line(int fd, int ms);
/* Send req (one line), read and parse the reply; "ok" asserted. The caller frees it. */
struct exs_json *it_ctl_req(int fd, const char *req);

/* Read trace-stream records of fd (each asserted to be JSON) for up to ms:
 * - a record whose text contains forbid (when not NULL) fails the test;
 * - with req not NULL, a request-trace record ("req") ends the wait: *req gets it
 *   (the caller frees it), returns IT_CTL_REQ;
 * - a record whose text contains want (when not NULL) ends the wait: IT_CTL_WANT;
 * - 0 when ms passed first. Other records are skipped. */
enum { IT_CTL_WANT = 1, IT_CTL_REQ = 2 };
int it_ctl_trace_next(int fd, int ms, const char *want, const char *forbid, struct exs_json **req);

#endif
