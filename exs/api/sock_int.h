/* SPDX-License-Identifier: MIT */
/* Private to the socket files (sock.c, sock_listen.c): what one needs of the other. */
#ifndef EXS_API_SOCK_INT_H
#define EXS_API_SOCK_INT_H

#include "exs/api/api_int.h"

/* sock.c: the descriptor table, the state machine, connections, close */
void exs__api_sock_ref(struct api_sock *s);
/* Put s in the descriptor table (a reference of its own): 0 or -ENOMEM. */
int exs__api_sock_tab_insert(struct api_sock *s);
struct api_sock *exs__api_sock_new(int domain, int type);
void exs__api_sock_set_state(struct api_sock *s, enum api_sock_state st, const char *why);
int exs__api_sock_conn_new(struct api_sock *s, struct exs_prov_ctx *ctx);
void exs__api_sock_conn_timer_kick(struct api_sock *s);
void exs__api_sock_close(struct api_sock *s, struct api_op *op, int abort_);

/* sock_listen.c: the listener's queues */
void exs__api_sock_defer_kick_locked(struct api_sock *lis);
void exs__api_sock_defer_take_locked(struct api_sock *lis, struct exs_list *out, int all);
void exs__api_sock_defer_refuse(struct api_sock *lis, struct exs_list *list, int reason);
void exs__api_sock_deliver_accepts_locked(struct api_sock *lis);

#endif
