/* SPDX-License-Identifier: MIT */
/* Porting, step 1: a blocking TCP client ported to asynchronous ES-API calls on its same kernel
 * socket. */
/*
 * usage: port_step1_client -p PORT [-t MS] [-l LEN]
 *
 * The original program opened a kernel TCP socket with socket()/connect() and wrote two
 * buffers in turn with blocking send() until a SIGALRM told it to stop. The port keeps
 * that socket and its set-up; only the data path changes:
 *
 *   - the two buffers are registered once (exs_mregister) and shared by every send;
 *   - 16 exs_send calls stay outstanding on the kernel descriptor, completed through an
 *     event queue (exs_qdequeue with a negative threshold, -(pending / 2): wake when half
 *     of them are done; no timeout);
 *   - a SIGALRM (handler installed with sa_flags 0, so no SA_RESTART) ends the wait with
 *     EINTR, as it ended the blocking send() before.
 *
 * Then the program goes back to plain kernel calls on the same descriptor, which must
 * behave as if libexs had never touched it: its flags are unchanged (no O_NONBLOCK), a
 * blocking recv() blocks (a short alarm interrupts it with EINTR, never EAGAIN), and
 * shutdown(), recv() of the server's verdict and close() work as usual.
 *
 * Exit status 0 when every check passed and the server got every byte intact.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "samples/port_step1.h"

#define OUTSTANDING 16

static volatile sig_atomic_t alarms; /* SIGALRMs handled */

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* One-shot SIGALRM in ms (0: disarm). */
static void arm(int ms)
{
    struct itimerval it = {.it_value = {ms / 1000, (ms % 1000) * 1000}};

    setitimer(ITIMER_REAL, &it, NULL);
}

static int fail(const char *what)
{
    fprintf(stderr, "port_step1_client: %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    struct sigaction sa = {.sa_handler = on_alarm};
    static exs_event_t ev[OUTSTANDING];
    unsigned long long sent = 0, server_got = 0;
    size_t len = PORT1_LEN;
    unsigned char *buf[2];
    exs_mhandle_t mh[2];
    exs_qhandle_t q;
    char reply[64] = "";
    size_t rlen = 0;
    int opt, port = 0, ms = 1000, fd, pending = 0, eintr = 0, missed = 0, next = 0;
    ssize_t r;

    while ((opt = getopt(argc, argv, "p:t:l:")) != -1) {
        if (opt == 'p')
            port = atoi(optarg);
        else if (opt == 't')
            ms = atoi(optarg);
        else if (opt == 'l')
            len = strtoul(optarg, NULL, 0);
        else
            return fail("usage: port_step1_client -p PORT [-t MS] [-l LEN]");
    }
    if (port <= 0 || ms <= 0 || !len)
        return fail("usage: port_step1_client -p PORT [-t MS] [-l LEN]");

    /* ---- unchanged from the blocking program: a kernel TCP socket ---- */
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = htons((uint16_t)port);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)))
        return fail("socket/connect failed");
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a signal interrupts the wait */
    sigaction(SIGALRM, &sa, NULL);

    /* ---- the port: asynchronous sends on the same descriptor ---- */
    if (exs_init(EXS_VERSION) != EXS_VERSION)
        return fail("exs_init failed");
    q = exs_qcreate(OUTSTANDING);
    for (int i = 0; i < 2; i++) {
        buf[i] = malloc(len);
        if (!buf[i])
            return fail("out of memory");
        for (size_t j = 0; j < len; j++)
            buf[i][j] = port1_pattern(i, j);
        mh[i] = exs_mregister(buf[i], len, 0);
        if (mh[i] == EXS_MHANDLE_INVALID)
            return fail("exs_mregister failed");
    }
    /* The stream is A B A B ...: sends complete, and leave, in posting order, so each
     * new send takes the buffer after the previous one's. The ahandle says which. */
    for (; pending < OUTSTANDING; pending++, next ^= 1)
        if (exs_send(fd, buf[next], len, 0, q, (exs_ahandle_t)(intptr_t)next, mh[next]))
            return fail("exs_send failed");
    arm(ms);
    while (!eintr) {
        int n = exs_qdequeue(q, ev, -(pending / 2), NULL);

        if (n < 0 && errno == EINTR) {
            eintr = 1; /* the alarm: stop sending */
            break;
        }
        if (n < 0)
            return fail("exs_qdequeue failed");
        for (int i = 0; i < n; i++) {
            if (ev[i].exs_evt_type != EXS_EVT_SEND || ev[i].exs_evt_errno ||
                ev[i].exs_evt_u.exs_evt_xfer.exs_evt_result != (ssize_t)len)
                return fail("a send failed");
            sent += len;
            pending--;
            if (exs_send(fd, buf[next], len, 0, q, (exs_ahandle_t)(intptr_t)next, mh[next]))
                return fail("exs_send failed");
            pending++;
            next ^= 1;
        }
        if (alarms) {
            /* The alarm came while this thread was not asleep in the library (it was
             * moving data): like a signal between two blocking send() calls, it
             * interrupted nothing. Ask again shortly. */
            missed++;
            alarms = 0;
            arm(20);
        }
    }
    arm(0);
    /* The sends still outstanding complete; wait for them (no more alarms). */
    while (pending > 0) {
        int n = exs_qdequeue(q, ev, -pending, NULL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail("exs_qdequeue failed");
        for (int i = 0; i < n; i++) {
            if (ev[i].exs_evt_errno || ev[i].exs_evt_u.exs_evt_xfer.exs_evt_result != (ssize_t)len)
                return fail("a send failed");
            sent += len;
        }
        pending -= n;
    }
    printf("client: %llu bytes in %llu sends of %zu, %d outstanding; stopped by EINTR "
           "(%d alarms came outside a sleep)\n",
           sent, sent / len, len, OUTSTANDING, missed);

    /* ---- back to the kernel: the descriptor is as it was ---- */
    if (fcntl(fd, F_GETFL) & O_NONBLOCK)
        return fail("the descriptor was left with O_NONBLOCK");
    /* The server says nothing before the end of the stream: a blocking recv() blocks
     * until the alarm interrupts it. */
    alarms = 0;
    arm(100);
    r = recv(fd, reply, sizeof(reply), 0);
    arm(0);
    if (r != -1 || errno != EINTR) {
        fprintf(stderr, "port_step1_client: blocking recv returned %zd (%s), expected EINTR\n", r,
                r < 0 ? strerror(errno) : "data");
        return 1;
    }
    if (shutdown(fd, SHUT_WR))
        return fail("shutdown failed");
    for (;;) { /* the verdict, up to the server's close */
        r = recv(fd, reply + rlen, sizeof(reply) - 1 - rlen, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        rlen += (size_t)r;
    }
    if (r < 0)
        return fail("recv of the verdict failed");
    reply[rlen] = 0;
    if (close(fd))
        return fail("close failed");
    if (sscanf(reply, "OK %llu", &server_got) != 1 || server_got != sent) {
        fprintf(stderr, "port_step1_client: sent %llu bytes, server says: %s\n", sent, reply);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        exs_mderegister(mh[i]);
        free(buf[i]);
    }
    exs_qdelete(q);
    exs_fini();
    printf("client: server got %llu bytes intact; kernel shutdown, blocking recv and close "
           "behaved as before\n",
           server_got);
    return 0;
}
