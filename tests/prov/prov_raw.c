/* SPDX-License-Identifier: MIT */
/* Raw TCP peers for tcp-only tests: sockets speaking tcp_wire.h by hand. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exs/util/counters.h"
#include "tests/prov/prov_test.h"

int pt_raw_connect(const struct pt_pair *p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (const struct sockaddr *)&p->addr, p->addrlen), 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int pt_raw_send(int fd, const void *buf, size_t len)
{
    const char *q = buf;

    while (len) {
        ssize_t n = send(fd, q, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        q += n;
        len -= (size_t)n;
    }
    return 0;
}

int pt_raw_recv(int fd, void *buf, size_t len, int ms)
{
    char *q = buf;
    double deadline = pt_now_ms() + ms;

    while (len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - pt_now_ms());
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return -1;
        n = recv(fd, q, len, 0);
        if (n <= 0)
            return -1;
        q += n;
        len -= (size_t)n;
        deadline = pt_now_ms() + ms; /* progress: ms bounds a stall, not the whole read */
    }
    return 0;
}

int pt_raw_end_within(int fd, int ms)
{
    double deadline = pt_now_ms() + ms;
    char buf[512];

    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - pt_now_ms());
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return -1;
        n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0)
            return 0;
        if (n < 0 && errno != EINTR && errno != EAGAIN)
            return errno;
    }
}

int pt_raw_closed_within(int fd, int ms)
{
    return pt_raw_end_within(fd, ms) >= 0;
}

struct tcp_wire_hdr pt_raw_hdr(uint8_t type, uint8_t flags, uint32_t len, uint32_t psn,
                               uint64_t raddr, uint32_t rkey, uint32_t imm)
{
    struct tcp_wire_hdr h;

    memset(&h, 0, sizeof(h));
    h.magic = htonl(TCP_WIRE_MAGIC);
    h.version = TCP_WIRE_VERSION;
    h.type = type;
    h.flags = flags;
    h.len = htonl(len);
    h.psn = htonl(psn);
    h.raddr = htobe64(raddr);
    h.rkey = htonl(rkey);
    h.imm = htonl(imm);
    return h;
}

int pt_raw_establish(struct pt_pair *p)
{
    struct tcp_wire_hdr h = pt_raw_hdr(TCP_WIRE_CONN_REQ, 0, TCP_WIRE_CONN_LEN, 0, 0, 0, 0);
    struct tcp_wire_conn cb = {.rnr_retry = 7, .rnr_timer_ms = 0};
    uint8_t buf[TCP_WIRE_HDR_LEN + TCP_WIRE_CONN_LEN];
    uint8_t pd[TCP_WIRE_CONN_LEN + TCP_WIRE_PD_MAX];
    struct tcp_wire_hdr ah;
    struct exs_prov_cm_event ev;
    int fd;

    memcpy(buf, &h, sizeof(h));
    memcpy(buf + TCP_WIRE_HDR_LEN, &cb, sizeof(cb));
    fd = pt_raw_connect(p);
    ck_assert_int_eq(pt_raw_send(fd, buf, sizeof(buf)), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_CONNECT_REQUEST, PT_TIMEOUT_MS, &ev);
    ck_assert_int_eq(pt_ops->accept(ev.req, p->eb, NULL, 0), 0);
    ck_assert_msg(pt_raw_recv(fd, &ah, sizeof(ah), PT_TIMEOUT_MS) == 0, "no CONN_ACCEPT frame");
    ck_assert_uint_eq(ah.type, TCP_WIRE_CONN_ACCEPT);
    ck_assert_uint_ge(ntohl(ah.len), TCP_WIRE_CONN_LEN);
    ck_assert_uint_le(ntohl(ah.len), sizeof(pd));
    ck_assert_int_eq(pt_raw_recv(fd, pd, ntohl(ah.len), PT_TIMEOUT_MS), 0);
    pt_wait_cm(&p->b, EXS_PROV_CM_ESTABLISHED, PT_TIMEOUT_MS, &ev);
    ck_assert_ptr_eq(ev.ep, p->eb);
    p->b_up = 1;
    return fd;
}

uint64_t pt_raw_rx_bytes(void)
{
    uint64_t v = 0;

    ck_assert_msg(exs__counters_lookup("prov.tcp", "bytes_rx", &v) == 0,
                  "counter prov.tcp.bytes_rx not registered");
    return v;
}

void pt_raw_rx_settle(struct pt_host *h, uint64_t base, uint64_t n)
{
    double deadline = pt_now_ms() + PT_TIMEOUT_MS;
    struct sockaddr_storage addr;
    socklen_t addrlen;

    while (pt_raw_rx_bytes() - base < n && pt_now_ms() < deadline) {
        if (!pt_drive_all()) /* ctxs without a driver thread (pt_self_drive) */
            pt_sleep_ms(1);
    }
    ck_assert_msg(pt_raw_rx_bytes() - base >= n, "the provider read %llu of %llu bytes",
                  (unsigned long long)(pt_raw_rx_bytes() - base), (unsigned long long)n);
    pt_ops->listener_destroy(pt_listen(h, &addr, &addrlen));
}
