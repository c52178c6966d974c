/* SPDX-License-Identifier: MIT */
/* The control endpoint seen from inside a process: its socket and directory, stat against
 * EXS_SO_STATS, removal at exs_fini, and the slow-poller and slow-pass reports in the trace. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/engine/engine.h"
#include "exs/util/json.h"
#include "exs/util/log.h"
#include "tests/integ/integ.h"
#include "tests/integ/integ_ctl.h"
#include "tests/skip.h"

/* The socket and its directory exist with their modes while the library runs; stat
 * names this process and shows the pair's bytes as EXS_SO_STATS does; exs_fini removes
 * the socket. */
START_TEST(test_ctl_stat_matches_sockopt)
{
    struct it_pair p;
    struct it_buf *b, *r;
    struct exs_sock_stats st;
    socklen_t len = sizeof(st);
    struct stat sb;
    char path[128], req[32];
    struct exs_json *j;
    const struct exs_json *conns;
    int fd, found = 0;

    it_ctl_setup("ctl");
    it_init();
    b = it_buf_new(4096, 1);
    r = it_buf_new(4096, 1);
    it_ctl_path(path, sizeof(path));
    ck_assert_int_eq(stat(it_ctl_dir(), &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 0777, 0700);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert(S_ISSOCK(sb.st_mode));
    ck_assert_uint_eq(sb.st_mode & 0777, 0600);

    it_pair_open(&p, SOCK_STREAM, 16, 16);
    IT_EXPECT_OK(exs_recv(p.sfd, r->p, 4096, MSG_WAITALL, p.sq, IT_AH(1), r->mh));
    IT_EXPECT_OK(exs_send(p.cfd, b->p, 4096, 0, p.cq, IT_AH(2), b->mh));
    it_expect_send(p.cq, p.cfd, IT_AH(2), 4096);
    it_expect_recv(p.sq, p.sfd, IT_AH(1), 4096, 0);
    ck_assert_int_eq(exs_getsockopt(p.cfd, SOL_EXS, EXS_SO_STATS, &st, &len), 0);
    ck_assert_uint_eq(st.bytes_sent, 4096);

    fd = it_ctl_open();
    j = it_ctl_req(fd, "stat\n");
    ck_assert_uint_eq(exs__json_get_u64(j, "pid"), (uint64_t)getpid());
    ck_assert_str_eq(exs__json_get_str(j, "provider"), exs__prov_name(exs__engine_ctx()));
    conns = exs__json_get(j, "conns");
    ck_assert_ptr_nonnull(conns);
    for (const struct exs_json *c = conns->child; c; c = c->next) {
        if (exs__json_get_u64(c, "fd") == (uint64_t)p.cfd) {
            found |= 1;
            ck_assert_str_eq(exs__json_get_str(c, "state"), "CONNECTED");
            ck_assert_str_eq(exs__json_get_str(c, "type"), "stream");
            ck_assert_uint_eq(exs__json_get_u64(c, "bytes_sent"), st.bytes_sent);
            {
                /* the listener's address (across hosts EXS_TEST_LISTEN_ADDR), some port */
                char want[INET_ADDRSTRLEN + 1];
                struct in_addr la = it_listen_in();

                ck_assert_ptr_nonnull(inet_ntop(AF_INET, &la, want, INET_ADDRSTRLEN));
                strcat(want, ":");
                ck_assert_ptr_nonnull(strstr(exs__json_get_str(c, "peer"), want));
            }
            /* what it runs on: "tcp" on tcp (fault:tcp too), "shm" on shm (fault:shm too),
             * "<device>:<port>" on verbs */
            const char *dev = exs__json_get_str(c, "device");
            if (strstr(exs__json_get_str(c, "provider"), "tcp")) {
                ck_assert_str_eq(dev, "tcp");
            } else if (strstr(exs__json_get_str(c, "provider"), "shm")) {
                ck_assert_str_eq(dev, "shm");
            } else {
                const char *colon = strrchr(dev, ':');

                ck_assert_msg(colon && colon > dev && atoi(colon + 1) >= 1, "device %s", dev);
            }
        }
        if (exs__json_get_u64(c, "fd") == (uint64_t)p.sfd) {
            found |= 2;
            ck_assert_uint_eq(exs__json_get_u64(c, "bytes_received"), 4096);
        }
        if (exs__json_get_u64(c, "fd") == (uint64_t)p.lfd) {
            found |= 4;
            ck_assert_str_eq(exs__json_get_str(c, "state"), "LISTENING");
        }
    }
    ck_assert_int_eq(found, 7);
    exs__json_free(j);
    snprintf(req, sizeof(req), "hello\n");
    exs__json_free(it_ctl_req(fd, req));
    close(fd);
    it_pair_close(&p);
    it_buf_free(b);
    it_buf_free(r);
    it_fini();
    ck_assert_int_eq(stat(path, &sb), -1);
    ck_assert_int_eq(errno, ENOENT);
    rmdir(it_ctl_dir());
}
END_TEST

/* A thread that drives progress, stops polling for longer than polling_warn_cycle_us
 * without waiting in the library, then drives again is reported; with the threshold set
 * to 0 online, the same gap is not. */
START_TEST(test_ctl_slow_poller_reported)
{
    exs_qhandle_t q;
    struct exs_json *j;
    int tfd, cfd;

    it_ctl_setup("ctl");
    it_setenv("EXS_POLLING_WARN_CYCLE_US", "20000");
    it_init();
    q = it_qcreate(8);
    tfd = it_ctl_open();
    cfd = it_ctl_open();
    exs__json_free(it_ctl_req(tfd, "trace\n"));

    ck_assert_int_eq(exs_qdequeue(q, NULL, 0, NULL), 0); /* drives */
    it_sleep_ms(100);                                    /* the application is busy */
    ck_assert_int_eq(exs_qdequeue(q, NULL, 0, NULL), 0); /* drives again: reported */
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "slow poller", NULL, NULL) == IT_CTL_WANT,
                  "no slow-poller record in the trace");

    j = it_ctl_req(cfd, "set polling_warn_cycle_us 0\n");
    ck_assert_str_eq(exs__json_get_str(j, "value"), "0");
    exs__json_free(j);
    ck_assert_int_eq(exs_qdequeue(q, NULL, 0, NULL), 0);
    it_sleep_ms(100);
    ck_assert_int_eq(exs_qdequeue(q, NULL, 0, NULL), 0); /* off: not reported */
    /* a marker after the gap: records arrive in order, so none may precede it */
    exs__json_free(it_ctl_req(cfd, "set log_level info\n"));
    exs__json_free(it_ctl_req(cfd, "set qspin_us 51\n"));
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "qspin_us changed", "slow poller", NULL) ==
                      IT_CTL_WANT,
                  "no marker record in the trace");
    close(tfd);
    close(cfd);
    it_qdelete(q);
    it_fini();
    rmdir(it_ctl_dir());
}
END_TEST

static void slow_job(void *arg)
{
    (void)arg;
    usleep(60 * 1000);
}

static void quick_job(void *arg)
{
    (void)arg;
}

/* A progress pass that holds the progress lock past slow_threshold_us is reported with
 * its slowest job; a quick one is not. */
START_TEST(test_ctl_slow_pass_reported)
{
    int tfd, cfd;

    it_ctl_setup("ctl");
    it_setenv("EXS_SLOW_THRESHOLD_US", "30000");
    it_init();
    tfd = it_ctl_open();
    cfd = it_ctl_open();
    exs__json_free(it_ctl_req(tfd, "trace\n"));
    exs__engine_call(quick_job, NULL);
    exs__json_free(it_ctl_req(cfd, "set log_level info\n"));
    exs__json_free(it_ctl_req(cfd, "set qspin_us 52\n"));
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "qspin_us changed", "slow progress pass",
                                    NULL) == IT_CTL_WANT,
                  "no marker record in the trace");
    exs__engine_call(slow_job, NULL);
    ck_assert_msg(it_ctl_trace_next(tfd, IT_TIMEOUT_MS, "slow progress pass", NULL, NULL) ==
                      IT_CTL_WANT,
                  "no slow-pass record in the trace");
    close(tfd);
    close(cfd);
    it_fini();
    rmdir(it_ctl_dir());
}
END_TEST

/* The control directory as the library finds it (spec/observability.md §2): _i 0, one
 * others may write in (0777, not sticky), _i 2, one of another uid (as root: 65534's),
 * are refused with one warn line saying why, and left as they were; _i 1, a shared sticky
 * one (01777), gets the socket and keeps its mode, also after exs_fini. */
START_TEST(test_ctl_dir_modes)
{
    static const mode_t modes[] = {0777, 01777, 0700};
    char path[128], *log = NULL;
    size_t loglen = 0;
    struct stat sb;
    FILE *f;
    const char *dir;

    if (_i == 2 && geteuid() != 0) {
        test_skip("test_ctl_dir_modes:2", "a directory of another uid needs root");
        return;
    }
    dir = it_ctl_setup("dir");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chmod(dir, modes[_i]), 0); /* not through the umask */
    if (_i == 2)
        ck_assert_int_eq(chown(dir, 65534, 65534), 0);
    f = open_memstream(&log, &loglen);
    ck_assert_ptr_nonnull(f);
    exs__log_set_stream(f);
    it_init();
    exs__log_set_stream(NULL);
    fclose(f);
    it_ctl_path(path, sizeof(path));
    ck_assert_int_eq(stat(dir, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 07777, modes[_i]);
    if (_i == 1) {
        ck_assert_msg(!strstr(log, "warn"), "%s", log);
        ck_assert_int_eq(stat(path, &sb), 0);
        ck_assert(S_ISSOCK(sb.st_mode));
        ck_assert_uint_eq(sb.st_mode & 0777, 0600);
        ck_assert_uint_eq(sb.st_uid, geteuid());
        close(it_ctl_open());
    } else {
        const char *w = strstr(log, "warn");

        ck_assert_msg(w && strstr(w, "control endpoint: directory") &&
                          strstr(w, _i ? "belongs to uid 65534" : "has mode 0777") &&
                          strstr(w, "not used"),
                      "no warning: %s", log);
        ck_assert_msg(!strstr(w + 1, "warn"), "more than one warning: %s", log);
        ck_assert_int_eq(stat(path, &sb), -1);
        ck_assert_int_eq(errno, ENOENT);
    }
    free(log);
    it_fini();
    ck_assert_int_eq(stat(dir, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 07777, modes[_i]);
    ck_assert_int_eq(stat(path, &sb), -1); /* removed at exs_fini (or never made) */
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

Suite *integ_ctl_suite(void)
{
    Suite *s = suite_create("integ_ctl");

    it_suite_add(s, "ctl", IT_CASE_TIMEOUT, 1,
                 (const TTest *const[]){test_ctl_stat_matches_sockopt,
                                        test_ctl_slow_poller_reported, test_ctl_slow_pass_reported,
                                        NULL});
    it_suite_add(s, "ctl_dir", IT_CASE_TIMEOUT, 3,
                 (const TTest *const[]){test_ctl_dir_modes, NULL});
    return s;
}
