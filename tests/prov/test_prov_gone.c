/* SPDX-License-Identifier: MIT */
/* The device removed under a live connection (spec/provider.md, "Device removal"; verbs
 * only, in a guest that may delete and add back its Soft-RoCE device): both ends hear
 * DISCONNECTED with -ENODEV, what was outstanding completes flushed, and the provider lets
 * go of the device, so that `rdma link delete` returns while the process still holds its
 * contexts, endpoints and registrations. Run by make check-rxe with
 * EXS_TEST_RXE_REMOVE=DEVICE:NETDEV (the device is added back on NETDEV at the end). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

/* Run argv in a child with only stdin, stdout and stderr: a descriptor of the device
 * inherited (libibverbs' asynchronous event fd has no close-on-exec) would make the
 * child itself hold the device it is deleting. */
static pid_t gone_spawn(char *const argv[])
{
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        long max = sysconf(_SC_OPEN_MAX);

        for (int fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
            close(fd);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* The exit status of pid within ms, or -1 (still running: then it is killed). */
static int gone_reap(pid_t pid, int ms)
{
    double end = pt_now_ms() + ms;
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        if (pt_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        pt_sleep_ms(50);
    }
}

/* EXS_TEST_RXE_REMOVE=DEVICE:NETDEV split; 0 when unset or malformed. */
static int gone_spec(char *dev, size_t dlen, char *netdev, size_t nlen)
{
    const char *spec = getenv("EXS_TEST_RXE_REMOVE");
    const char *colon = spec ? strchr(spec, ':') : NULL;

    if (!colon || colon == spec || (size_t)(colon - spec) >= dlen || !colon[1] ||
        strlen(colon + 1) >= nlen)
        return 0;
    memcpy(dev, spec, (size_t)(colon - spec));
    dev[colon - spec] = 0;
    strcpy(netdev, colon + 1);
    return 1;
}

static int gone_port_active(const char *dev)
{
    char path[128], state[64] = "";
    FILE *f;

    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", dev);
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(state, sizeof(state), f))
        state[0] = 0;
    fclose(f);
    return strstr(state, "ACTIVE") != NULL;
}

/* Unchecked teardown (the runner's process, whatever the test's outcome; it never opens
 * the device): add the device back when it is missing, wait until its port is ACTIVE. */
static void gone_restore(void)
{
    char dev[64], netdev[64], path[128];
    double end;

    if (strcmp(pt_name, "verbs") != 0 || !gone_spec(dev, sizeof(dev), netdev, sizeof(netdev)))
        return;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s", dev);
    if (access(path, F_OK) != 0) {
        char *add[] = {"rdma", "link", "add", dev, "type", "rxe", "netdev", netdev, NULL};

        if (gone_reap(gone_spawn(add), 30000 * pt_time_scale()) != 0)
            fprintf(stderr, "prov_gone: rdma link add %s netdev %s failed\n", dev, netdev);
    }
    end = pt_now_ms() + 30000.0 * pt_time_scale();
    while (!gone_port_active(dev) && pt_now_ms() < end)
        pt_sleep_ms(100);
    if (!gone_port_active(dev))
        fprintf(stderr, "prov_gone: %s not ACTIVE again\n", dev);
}

START_TEST(gone_rdma_link_delete)
{
    char dev[64], netdev[64];
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe;
    struct exs_prov_ep *extra;
    struct exs_prov_mr *mr;
    struct pt_buf *ba, *bb;
    struct pt_pair p;
    int seen_a = 0, seen_b = 0, enodev = 0, st;
    pid_t pid;

    if (strcmp(pt_name, "verbs") != 0) {
        test_skip("gone_rdma_link_delete", "the verbs provider's device removal");
        return;
    }
    if (!gone_spec(dev, sizeof(dev), netdev, sizeof(netdev))) {
        test_skip("gone_rdma_link_delete",
                  "deletes the RDMA device: EXS_TEST_RXE_REMOVE=DEVICE:NETDEV (make check-rxe)");
        return;
    }
    pt_pair_setup(&p, NULL, NULL);
    ba = pt_pair_buf(&p, 'a', 4096, EXS_PROV_ACCESS_LOCAL_WRITE, 1);
    bb = pt_pair_buf(&p, 'b', 4096, EXS_PROV_ACCESS_LOCAL_WRITE | EXS_PROV_ACCESS_REMOTE_WRITE, 0);
    /* the connection works, and a receive of a stays outstanding across the removal */
    ck_assert_int_eq(pt_post_recv(p.eb, 1, bb, 0, 4096), 0);
    ck_assert_int_eq(
        pt_post_send(p.ea, 2, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, ba, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 2, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_SEND, NULL);
    pt_expect_cqe(&p.b, 1, EXS_PROV_WC_SUCCESS, EXS_PROV_WC_RECV, NULL);
    ck_assert_int_eq(pt_post_recv(p.ea, 3, ba, 0, 4096), 0);

    {
        char *del[] = {"rdma", "link", "delete", dev, NULL};

        pid = gone_spawn(del);
    }
    /* both ends end: with -ENODEV, or (the other ctx's removal ran first and its end
     * reached this one as a peer's) -ECONNRESET; at least one of them -ENODEV */
    while (!seen_a || !seen_b) {
        struct pt_host *h = !seen_a ? &p.a : &p.b;

        pt_wait_cm(h, EXS_PROV_CM_DISCONNECTED, 30000 * pt_time_scale(), &ev);
        ck_assert_msg(ev.status == -ENODEV || ev.status == -ECONNRESET,
                      "DISCONNECTED status %d (%s)", ev.status, strerror(-ev.status));
        enodev += ev.status == -ENODEV;
        ck_assert_ptr_eq(ev.ep, h == &p.a ? p.ea : p.eb);
        if (h == &p.a)
            seen_a = 1;
        else
            seen_b = 1;
    }
    ck_assert_int_ge(enodev, 1);
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_WR_FLUSH_ERR, EXS_PROV_WC_RECV, &cqe);
    /* the kernel's removal completes with this process alive and holding everything */
    st = gone_reap(pid, 60000 * pt_time_scale());
    ck_assert_msg(st == 0, "rdma link delete %s: %s", dev,
                  st < 0 ? "still blocked: the process holds the device" : "failed");
    {
        char path[128];

        snprintf(path, sizeof(path), "/sys/class/infiniband/%s", dev);
        ck_assert_msg(access(path, F_OK) != 0, "%s still there", path);
    }
    /* what is posted now completes flushed; nothing new is made on the ctx */
    ck_assert_int_eq(
        pt_post_send(p.ea, 4, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, ba, 0, 64, 0, 0, 0), 0);
    pt_expect_cqe(&p.a, 4, EXS_PROV_WC_WR_FLUSH_ERR, EXS_PROV_WC_SEND, NULL);
    ck_assert_int_eq(pt_ops->mr_reg(p.a.ctx, ba->p, 64, EXS_PROV_ACCESS_LOCAL_WRITE, &mr), -ENODEV);
    {
        struct exs_prov_ep_attr attr = pt_default_attr();

        ck_assert_int_eq(pt_ops->ep_create(p.a.ctx, &attr, &extra), -ENODEV);
    }
    /* the objects of the gone device are released as usual (the device comes back in
     * gone_restore) */
    pt_pair_close(&p);
}
END_TEST

Suite *prov_gone_suite(void)
{
    Suite *s = suite_create("prov_gone");
    TCase *tc = pt_tcase("gone");

    tcase_set_timeout(tc, 240);
    tcase_add_unchecked_fixture(tc, NULL, gone_restore);
    tcase_add_test(tc, gone_rdma_link_delete);
    suite_add_tcase(s, tc);
    return s;
}
