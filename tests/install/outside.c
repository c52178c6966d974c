/* SPDX-License-Identifier: MIT */
/* A program outside the tree, built against an installed libexs: one SOCK_STREAM
 * connection over loopback, one message each way, checked; prints the library it ran with.
 * It also defines globals named like libexs internals once were, so a static link fails
 * if the archive still defines them. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/exs.h>

int api_sock_get(void);
int conn_kick_locked(void);
int sp_slot_len;
int api_sock_get(void)
{
    return 1;
}
int conn_kick_locked(void)
{
    return 2;
}

static int fail(const char *what)
{
    perror(what);
    return 1;
}

int main(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    char out[] = "hello from outside", in[sizeof(out)] = "";
    exs_event_t ev;
    Dl_info dli;

    if (exs_init(EXS_VERSION) < 0)
        return fail("exs_init");
    exs_qhandle_t q = exs_qcreate(8);
    int lfd = exs_socket(AF_INET, SOCK_STREAM, 0), cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    if (q == EXS_QHANDLE_INVALID || lfd < 0 || cfd < 0)
        return fail("exs_qcreate/exs_socket");
    if (exs_bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || exs_listen(lfd, 4) < 0 ||
        exs_getsockname(lfd, (struct sockaddr *)&sin, &len) < 0)
        return fail("exs_bind/exs_listen");
    if (exs_accept(lfd, q, NULL) < 0 ||
        exs_connect(cfd, (struct sockaddr *)&sin, sizeof(sin), q, NULL) < 0)
        return fail("exs_accept/exs_connect");
    int afd = -1;
    for (int got = 0; got < 2;) {
        if (exs_qdequeue(q, &ev, 1, NULL) != 1)
            return fail("exs_qdequeue");
        if (ev.exs_evt_errno) {
            fprintf(stderr, "event %d: %s\n", ev.exs_evt_type, strerror(ev.exs_evt_errno));
            return 1;
        }
        if (ev.exs_evt_type == EXS_EVT_ACCEPT)
            afd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
        got++;
    }
    if (exs_send(cfd, out, sizeof(out), 0, EXS_QHANDLE_INVALID, NULL, EXS_MHANDLE_UNREGISTERED) !=
            (int)sizeof(out) ||
        exs_recv(afd, in, sizeof(in), MSG_WAITALL, EXS_QHANDLE_INVALID, NULL,
                 EXS_MHANDLE_UNREGISTERED) != (int)sizeof(in))
        return fail("exs_send/exs_recv");
    if (memcmp(in, out, sizeof(out))) {
        fprintf(stderr, "received '%s', sent '%s'\n", in, out);
        return 1;
    }
    if (exs_close(afd, EXS_QHANDLE_INVALID, NULL) < 0 ||
        exs_close(cfd, EXS_QHANDLE_INVALID, NULL) < 0 ||
        exs_close(lfd, EXS_QHANDLE_INVALID, NULL) < 0 || exs_qdelete(q) < 0)
        return fail("exs_close/exs_qdelete");
    exs_fini();
    if (!dladdr((void *)exs_init, &dli) || !dli.dli_fname)
        return fail("dladdr");
    printf("outside: '%s' echoed; exs_init from %s\n", in, dli.dli_fname);
    return api_sock_get() + conn_kick_locked() + sp_slot_len == 3 ? 0 : 1;
}
