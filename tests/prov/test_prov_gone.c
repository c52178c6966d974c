/* SPDX-License-Identifier: MIT */
/* The device removed under a live connection (spec/provider.md, "Device removal"; verbs
 * only, in a guest that may delete and add back its Soft-RoCE device): both ends hear
 * DISCONNECTED with -ENODEV, what was outstanding completes flushed, and the provider lets
 * go of the device, so that `rdma link delete` returns while the process still holds its
 * contexts, endpoints and registrations. Run by make check-rxe with
 * EXS_TEST_RXE_REMOVE=DEVICE:NETDEV (the device is added back on NETDEV at the end). */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"
#include "tests/skip.h"

extern char **environ;

static pid_t gone_spawn(char *const argv[])
{
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);

    ck_assert_msg(rc == 0, "cannot run %s: %s", argv[0], strerror(rc));
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

static int gone_scale(void)
{
    const char *m = getenv("CK_TIMEOUT_MULTIPLIER");
    int v = m ? atoi(m) : 1;

    return v > 0 ? v : 1;
}

/* Add the device back and wait until a ctx opens on it (its port ACTIVE). */
static void gone_restore(char *dev, char *netdev)
{
    char *add[] = {"rdma", "link", "add", dev, "type", "rxe", "netdev", netdev, NULL};
    struct exs_prov_ctx *ctx = NULL;
    double end;

    ck_assert_int_eq(gone_reap(gone_spawn(add), 30000 * gone_scale()), 0);
    end = pt_now_ms() + 30000.0 * gone_scale();
    while (pt_ctx_open(NULL, &ctx) != 0) {
        ck_assert_msg(pt_now_ms() < end, "%s not usable again after rdma link add", dev);
        pt_sleep_ms(100);
    }
    pt_ctx_close(ctx);
}

START_TEST(gone_rdma_link_delete)
{
    const char *spec = getenv("EXS_TEST_RXE_REMOVE");
    char dev[64], netdev[64], *colon;
    struct exs_prov_cm_event ev;
    struct exs_prov_cqe cqe;
    struct exs_prov_ep *extra;
    struct exs_prov_mr *mr;
    struct pt_buf *ba, *bb;
    struct pt_pair p;
    int seen_a = 0, seen_b = 0, st;
    pid_t pid;

    if (strcmp(pt_name, "verbs") != 0) {
        test_skip("gone_rdma_link_delete", "the verbs provider's device removal");
        return;
    }
    if (!spec || !(colon = strchr(spec, ':')) || (size_t)(colon - spec) >= sizeof(dev) ||
        strlen(colon + 1) >= sizeof(netdev)) {
        test_skip("gone_rdma_link_delete",
                  "deletes the RDMA device: EXS_TEST_RXE_REMOVE=DEVICE:NETDEV (make check-rxe)");
        return;
    }
    memcpy(dev, spec, (size_t)(colon - spec));
    dev[colon - spec] = 0;
    strcpy(netdev, colon + 1);

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
    /* both ends: DISCONNECTED, -ENODEV */
    while (!seen_a || !seen_b) {
        struct pt_host *h = !seen_a ? &p.a : &p.b;

        pt_wait_cm(h, EXS_PROV_CM_DISCONNECTED, 30000 * gone_scale(), &ev);
        ck_assert_int_eq(ev.status, -ENODEV);
        ck_assert_ptr_eq(ev.ep, h == &p.a ? p.ea : p.eb);
        if (h == &p.a)
            seen_a = 1;
        else
            seen_b = 1;
    }
    pt_expect_cqe(&p.a, 3, EXS_PROV_WC_WR_FLUSH_ERR, EXS_PROV_WC_RECV, &cqe);
    /* the kernel's removal completes with this process alive and holding everything */
    st = gone_reap(pid, 60000 * gone_scale());
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
    /* the objects of the gone device are released as usual */
    pt_pair_close(&p);
    gone_restore(dev, netdev);
}
END_TEST

Suite *prov_gone_suite(void)
{
    Suite *s = suite_create("prov_gone");
    TCase *tc = pt_tcase("gone");

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, gone_rdma_link_delete);
    suite_add_tcase(s, tc);
    return s;
}
