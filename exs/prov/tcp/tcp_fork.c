/* SPDX-License-Identifier: MIT */
/* fork(2) and the tcp provider: the child closes its copies of the context's sockets. */
#include <unistd.h>

#include "exs/prov/tcp/tcp.h"
#include "exs/util/util.h"

/* fork (prov.h, ctx_fork). Every socket of the context is made and put on its list with
 * nic_lock held (a NIC turn accepts, a command connects or listens), so holding it across
 * the fork gives the child complete lists. The child closes its copies only: the parent's
 * connections and listeners stay as they are (a socket ends when its last copy closes,
 * and no FIN or RST leaves while the parent holds its own). */
void exs__tcp_ctx_fork(struct exs_prov_ctx *c, int phase)
{
    struct tcp_ctx *ctx = tcp_ctx_of(c);
    struct exs_list *l;
    int *fds[] = {&ctx->epfd, &ctx->wakefd, &ctx->timerfd, &ctx->evfd};

    if (exs__prov_fork_lock(&ctx->nic_lock, phase))
        return;
    exs_list_for_each(l, &ctx->conns)
    {
        struct tcp_conn *conn = exs_list_entry(l, struct tcp_conn, link);

        exs__prov_fork_close((int *const[]){&conn->fd}, 1);
    }
    exs_list_for_each(l, &ctx->listeners)
    {
        struct tcp_listener *lis = exs_list_entry(l, struct tcp_listener, link);

        exs__prov_fork_close((int *const[]){&lis->fd}, 1);
    }
    exs__prov_fork_close(fds, EXS_ARRAY_SIZE(fds));
    exs__counters_unregister(&ctx->cset);
}
