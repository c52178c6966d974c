/* SPDX-License-Identifier: MIT */
/* A client of the test process's own control endpoint: its directory, lines, requests, trace
 * records. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/integ/integ.h"
#include "tests/integ/integ_ctl.h"

static char ctl_dir[64];

const char *it_ctl_setup(const char *tag)
{
    snprintf(ctl_dir, sizeof(ctl_dir), "/tmp/exs-integ-%s-%d", tag, (int)getpid());
    it_setenv("EXS_CTL_DIR", ctl_dir);
    return ctl_dir;
}

const char *it_ctl_dir(void)
{
    return ctl_dir;
}

void it_ctl_path(char *buf, size_t len)
{
    snprintf(buf, len, "%s/%d.sock", ctl_dir, (int)getpid());
}

int it_ctl_open(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    it_ctl_path(sa.sun_path, sizeof(sa.sun_path));
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s",
                  sa.sun_path, strerror(errno));
    return fd;
}

char *it_ctl_line(int fd, int ms)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    double end = it_now_ms() + ms;

    ck_assert_ptr_nonnull(buf);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        double left = end - it_now_ms();

        if (len && buf[len - 1] == '\n') {
            buf[len - 1] = '\0';
            return buf;
        }
        if (left <= 0 || poll(&pfd, 1, (int)left + 1) == 0) {
            free(buf);
            return NULL;
        }
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        ck_assert_int_eq(recv(fd, buf + len, 1, 0), 1); /* one byte: never read past the line */
        len++;
    }
}

struct exs_json *it_ctl_req(int fd, const char *req)
{
    struct exs_json *j;
    char *line;

    ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    line = it_ctl_line(fd, IT_TIMEOUT_MS);
    ck_assert_msg(line != NULL, "no reply to %s", req);
    ck_assert_msg(exs__json_parse(line, strlen(line), &j) == 0, "not JSON: %s", line);
    ck_assert_msg(exs__json_get_bool(j, "ok"), "%s: %s", req, line);
    free(line);
    return j;
}

int it_ctl_trace_next(int fd, int ms, const char *want, const char *forbid, struct exs_json **req)
{
    double end = it_now_ms() + ms;

    while (it_now_ms() < end) {
        char *line = it_ctl_line(fd, (int)(end - it_now_ms()) + 1);
        struct exs_json *j;
        int ret = 0;

        if (!line)
            return 0;
        ck_assert_msg(exs__json_parse(line, strlen(line), &j) == 0, "not JSON: %s", line);
        ck_assert_msg(!forbid || !strstr(line, forbid), "unexpected record: %s", line);
        if (req && exs__json_get(j, "req")) {
            *req = j;
            j = NULL;
            ret = IT_CTL_REQ;
        } else if (want && strstr(line, want)) {
            ret = IT_CTL_WANT;
        }
        free(line);
        exs__json_free(j);
        if (ret)
            return ret;
    }
    return 0;
}
