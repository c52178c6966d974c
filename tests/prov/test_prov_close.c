/* SPDX-License-Identifier: MIT */
/* Why a connection ended (spec/provider.md): a DISCONNECTED says EXS_PROV_CM_F_PEER_CLOSED
 * when the peer closed its endpoint (ep_destroy, its socket closed), never for its
 * disconnect or a reset. The cut-over of spec/protocol.md §9.2 relies on it. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/prov/prov_test.h"

/* a ends its side with end (ep_destroy or disconnect); b's DISCONNECTED. */
static void end_a(struct pt_pair *p, int destroy, struct exs_prov_cm_event *ev)
{
    pt_pair_setup(p, NULL, NULL);
    if (destroy) {
        pt_ops->ep_destroy(p->ea);
        p->ea = NULL;
        p->a_up = 0;
    } else {
        ck_assert_int_eq(pt_ops->disconnect(p->ea), 0);
    }
    pt_wait_cm(&p->b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, ev);
    ck_assert_ptr_eq(ev->ep, p->eb);
}

/* ep_destroy of a connected ep: the peer hears that it closed. */
START_TEST(close_destroy_says_closed)
{
    struct exs_prov_cm_event ev;
    struct pt_pair p;

    end_a(&p, 1, &ev);
    ck_assert_uint_eq(ev.flags & EXS_PROV_CM_F_PEER_CLOSED, EXS_PROV_CM_F_PEER_CLOSED);
    pt_pair_close(&p);
}
END_TEST

/* disconnect: an end of the path, not a close (the side may resume over another). */
START_TEST(close_disconnect_is_not_closed)
{
    struct exs_prov_cm_event ev;
    struct pt_pair p;

    end_a(&p, 0, &ev);
    ck_assert_uint_eq(ev.flags & EXS_PROV_CM_F_PEER_CLOSED, 0);
    pt_pair_close(&p);
}
END_TEST

/* tcp: a raw peer's socket closed (EOF: its process ended) is a close; a reset (SO_LINGER
 * 0) is not, nor is a frame with flag CLOSED other than DISCONNECT (a protocol error). _i:
 * 0 EOF, 1 reset, 2 DISCONNECT with CLOSED, 3 ACK with CLOSED. */
START_TEST(close_raw_peer)
{
    static const char *const what[] = {"eof", "reset", "disconnect_closed", "ack_closed"};
    struct exs_prov_cm_event ev;
    struct pt_pair p;
    int fd;

    if (pt_skip_unless_tcp(what[_i]))
        return;
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    if (_i == 1) {
        struct linger l = {.l_onoff = 1, .l_linger = 0};

        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)), 0);
    } else if (_i >= 2) {
        struct tcp_wire_hdr h = pt_raw_hdr(_i == 2 ? TCP_WIRE_DISCONNECT : TCP_WIRE_ACK,
                                           TCP_WIRE_F_CLOSED, 0, 0, 0, 0, 0);

        ck_assert_int_eq(pt_raw_send(fd, &h, sizeof(h)), 0);
        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    }
    if (_i < 2) {
        close(fd);
        pt_wait_cm(&p.b, EXS_PROV_CM_DISCONNECTED, PT_TIMEOUT_MS, &ev);
    }
    ck_assert_ptr_eq(ev.ep, p.eb);
    ck_assert_uint_eq(ev.flags & EXS_PROV_CM_F_PEER_CLOSED,
                      _i == 0 || _i == 2 ? EXS_PROV_CM_F_PEER_CLOSED : 0);
    ck_assert_int_eq(ev.status, _i == 0 || _i == 1 ? -ECONNRESET : _i == 2 ? 0 : -EPROTO);
    if (_i >= 2)
        close(fd);
    pt_pair_close(&p);
}
END_TEST

/* tcp: an endpoint cut mid-frame (a disconnect while a large SEND is half written: the
 * cut-over's planned disconnect under load) ends its socket with a reset, never with the
 * EOF that tells the peer the endpoint closed for good (the peer would then refuse the
 * cut-over, spec/protocol.md §9.2). The raw peer reads nothing until the disconnect, so
 * the frame cannot have been written whole. */
START_TEST(close_cut_mid_frame_is_reset)
{
    enum { LEN = 32 << 20 };
    struct pt_pair p;
    struct pt_buf *b;
    struct pollfd pfd;
    int fd, small = 65536, end;

    if (pt_skip_unless_tcp("cut_mid_frame"))
        return;
    pt_pair_open(&p, NULL, NULL);
    fd = pt_raw_establish(&p);
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    b = pt_pair_buf(&p, 'b', LEN, EXS_PROV_ACCESS_LOCAL_WRITE, 0x6B);
    ck_assert_int_eq(
        pt_post_send(p.eb, 1, EXS_PROV_WR_SEND, EXS_PROV_SEND_SIGNALED, b, 0, LEN, 0, 0, 0), 0);
    /* the frame's first bytes are here: it is being written, and cannot be whole */
    pfd = (struct pollfd){.fd = fd, .events = POLLIN};
    while (poll(&pfd, 1, 100) == 0)
        pt_drive_all();
    ck_assert_int_eq(pt_ops->disconnect(p.eb), 0);
    pt_drive_all();
    /* read to the end: the bytes already written may take a while through a 64 KiB
     * window on a loaded machine, so the bound is on a stall, not on the whole */
    for (end = -1;;) {
        static char sink[1 << 16];
        ssize_t n;

        pfd = (struct pollfd){.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, PT_TIMEOUT_MS) <= 0)
            break;
        n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
            end = n == 0 ? 0 : errno;
            break;
        }
    }
    ck_assert_msg(end == ECONNRESET, "the socket ended with %s, not a reset",
                  end == 0  ? "an EOF (a close for good)"
                  : end < 0 ? "nothing"
                            : strerror(end));
    close(fd);
    pt_pair_close(&p);
}
END_TEST

Suite *prov_close_suite(void)
{
    Suite *s = suite_create("prov_close");
    TCase *tc = pt_tcase("close");

    tcase_add_test(tc, close_destroy_says_closed);
    tcase_add_test(tc, close_disconnect_is_not_closed);
    tcase_add_loop_test(tc, close_raw_peer, 0, 4);
    tcase_add_test(tc, close_cut_mid_frame_is_reset);
    suite_add_tcase(s, tc);
    return s;
}
