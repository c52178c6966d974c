/* SPDX-License-Identifier: MIT */
/* fork and exit like a socket library (spec/api.md section 2, "fork" and "Exit"): a forked
 * child cannot touch the parent's connections, its own exs_init works; connections still
 * open at exit end gracefully, a killed process still resets them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "integ.h"
#include "tests/skip.h"

#define FK_MSG 1000 /* bytes of each message the parent exchanges */

/* The parent's two live connections, one of each type. */
struct fk_conns {
    struct it_pair st, sp;
    struct it_buf *sb, *rb;
};

static void fk_open(struct fk_conns *c)
{
    it_init();
    it_pair_open(&c->st, SOCK_STREAM, 64, 64);
    it_pair_open(&c->sp, SOCK_SEQPACKET, 64, 64);
    c->sb = it_buf_new(FK_MSG, 1);
    c->rb = it_buf_new(FK_MSG, 1);
}

/* One message each way on p (seed: the pattern), every byte checked, no error. */
static void fk_exchange(struct fk_conns *c, struct it_pair *p, uint32_t seed)
{
    for (int dir = 0; dir < 2; dir++) {
        int from = dir ? p->sfd : p->cfd, to = dir ? p->cfd : p->sfd;
        exs_qhandle_t fq = dir ? p->sq : p->cq, tq = dir ? p->cq : p->sq;
        size_t got = 0;
        exs_event_t ev;

        it_fill(c->sb->p, FK_MSG, seed + (uint32_t)dir);
        IT_POST_SEND(from, c->sb->p, FK_MSG, fq, IT_AH(1), c->sb->mh);
        while (got < FK_MSG) {
            IT_POST_RECV(to, c->rb->p + got, FK_MSG - got, tq, IT_AH(2), c->rb->mh);
            it_wait_event(tq, EXS_EVT_RECV, to, &ev);
            ck_assert_msg(ev.exs_evt_errno == 0 && ev.exs_evt_u.exs_evt_xfer.exs_evt_result > 0,
                          "%s: receive errno %d result %zd",
                          p->type == SOCK_STREAM ? "STREAM" : "SEQPACKET", ev.exs_evt_errno,
                          ev.exs_evt_u.exs_evt_xfer.exs_evt_result);
            got += (size_t)ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        }
        ck_assert_int_eq(got, FK_MSG);
        ck_assert_int_lt(it_check(c->rb->p, FK_MSG, seed + (uint32_t)dir), 0);
        it_expect_send(fq, from, IT_AH(1), FK_MSG);
    }
}

static void fk_close(struct fk_conns *c)
{
    it_buf_free(c->sb);
    it_buf_free(c->rb);
    it_pair_close(&c->st);
    it_pair_close(&c->sp);
    it_fini();
}

/* Child side: exit code step when cond fails. */
#define FK_CHECK(cond, step)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child step %d: %s (errno %d %s)\n", (step), #cond, errno,             \
                    strerror(errno));                                                              \
            _exit(step);                                                                           \
        }                                                                                          \
    } while (0)

/* The number of socket descriptors this process holds. */
static int fk_count_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;

    if (!d)
        return -1;
    while ((de = readdir(d))) {
        struct stat st;
        int fd = atoi(de->d_name);

        if (de->d_name[0] != '.' && fd != dirfd(d) && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
            n++;
    }
    closedir(d);
    return n;
}

/* In the child: a listener (it_listen without Check: the child of a process whose other
 * threads assert may inherit Check's lock held). */
static int fk_child_listen(struct sockaddr_in *a)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(*a);
    int fd = exs_socket(AF_INET, SOCK_STREAM, 0);

    sin.sin_addr = it_listen_in();
    FK_CHECK(fd >= 0, 10);
    FK_CHECK(exs_bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0, 11);
    FK_CHECK(exs_listen(fd, 128) == 0, 12);
    memset(a, 0, sizeof(*a));
    FK_CHECK(exs_getsockname(fd, (struct sockaddr *)a, &len) == 0 && len == sizeof(*a), 13);
    return fd;
}

/* In the child: a loopback pair of its own carries one message each way. */
static void fk_child_own_pair(void)
{
    struct sockaddr_in a;
    char out[64] = "from the child's own connection", in[64] = {0};
    int lfd, cfd, sfd;

    lfd = fk_child_listen(&a);
    cfd = exs_socket(AF_INET, SOCK_STREAM, 0);
    FK_CHECK(cfd >= 0, 20);
    /* the synchronous accept needs the connect going: the connect goes async */
    exs_qhandle_t q = exs_qcreate(8);
    FK_CHECK(q != EXS_QHANDLE_INVALID, 21);
    FK_CHECK(exs_connect(cfd, (struct sockaddr *)&a, sizeof(a), q, IT_AH(1)) == 0, 22);
    sfd = exs_accept(lfd, EXS_QHANDLE_INVALID, NULL);
    FK_CHECK(sfd >= 0, 23);
    exs_event_t ev;
    FK_CHECK(exs_qdequeue(q, &ev, 1, NULL) == 1 && ev.exs_evt_errno == 0, 24);
    FK_CHECK(exs_send(cfd, out, sizeof(out), 0, EXS_QHANDLE_INVALID, NULL,
                      EXS_MHANDLE_UNREGISTERED) == (int)sizeof(out),
             25);
    FK_CHECK(exs_recv(sfd, in, sizeof(in), MSG_WAITALL, EXS_QHANDLE_INVALID, NULL,
                      EXS_MHANDLE_UNREGISTERED) == (int)sizeof(in),
             26);
    FK_CHECK(memcmp(in, out, sizeof(in)) == 0, 27);
    /* left open: exit ends them (the child's own, not the parent's) */
}

/*
 * The parent has a STREAM and a SEQPACKET connection (both ends), with data moving. The
 * child: every call on an inherited descriptor fails at once with ESTALE (send, receive,
 * close, on both types, before and after exs_init), an inherited queue handle is
 * EINVAL, it holds no socket descriptor at all (the provider's sockets and the control
 * endpoint are closed in it), then exs_init works and a connection of its own carries
 * data, and it exits with it open. Both parent connections then carry data, checked.
 * Before the fork handlers, the child's exs_send was accepted and wrote the parent's TCP
 * socket ("ack for an unknown sequence" at the peer), and it hung in the wait.
 */
/* ThreadSanitizer cannot follow a child of a threaded process that starts threads of its
 * own (it dies, or trips over the parent's thread ids: "dup thread with used id"), so
 * under it the child stops before its exs_init: the handlers around the fork and the
 * parent's connections afterwards are what it checks there. */
#if defined(__SANITIZE_THREAD__)
#define FK_CHILD_INIT 0
#else
#define FK_CHILD_INIT 1
#endif

/* The AddressSanitizer of Debian 12's gcc (libasan8, LLVM before 17) does not lock its
 * allocator around fork: a child forked while another thread of the parent refills or
 * drains its allocator cache inherits that size class's lock taken and blocks forever in
 * its first malloc of that class (seen: the child's new progress thread, 1 run in 31 of
 * test_fork_while_busy; the child then dies by its alarm, and the parent's failed assert
 * exits through LeakSanitizer with the workers running, which ends in SIGKILL). glibc's
 * malloc has its own fork handlers. So under ASan the busy test's children stop after
 * the inherited-descriptor checks, which allocate nothing; the quiet fork tests, whose
 * parent's threads are all idle at the fork, keep the child's exs_init. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define FK_BUSY_CHILD_INIT 0
#else
#define FK_BUSY_CHILD_INIT 1
#endif

static void fk_run(int child_mode)
{
    struct fk_conns c;
    int status;
    pid_t pid;

    fk_open(&c);
    fk_exchange(&c, &c.st, 1);
    fk_exchange(&c, &c.sp, 3);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char b[16] = "child";
        int fds[] = {c.st.cfd, c.st.sfd, c.sp.cfd, c.sp.sfd};

        /* over verbs the kernel refuses the parent's devices to the child: its exs_init
         * fails (spec/api.md section 2), the rest holds */
        int verbs = strstr(it_provider, "verbs") != NULL;

        alarm(60); /* a hang fails the test (status: SIGALRM) */
        if (child_mode == 1)
            _exit(0);
        if (child_mode == 2)
            exit(0);
        /* the verbs provider's own descriptors (rdma_cm, its UDP socket) are not closed */
        FK_CHECK(verbs || fk_count_sockets() == 0, 2);
        for (int round = 0; round < 2; round++) {
            for (int i = 0; i < 4; i++) {
                errno = 0;
                FK_CHECK(exs_send(fds[i], b, sizeof(b), 0, c.st.cq, NULL,
                                  EXS_MHANDLE_UNREGISTERED) == -1 &&
                             errno == ESTALE,
                         3);
                errno = 0;
                FK_CHECK(exs_recv(fds[i], b, sizeof(b), 0, EXS_QHANDLE_INVALID, NULL,
                                  EXS_MHANDLE_UNREGISTERED) == -1 &&
                             errno == ESTALE,
                         4);
                errno = 0;
                FK_CHECK(exs_shutdown(fds[i], SHUT_WR, EXS_QHANDLE_INVALID, NULL) == -1 &&
                             errno == ESTALE,
                         5);
            }
            errno = 0;
            FK_CHECK(exs_qdequeue(c.st.cq, NULL, 0, NULL) == -1 && errno == EINVAL, 6);
            if (round == 0 && !FK_CHILD_INIT)
                _exit(0);
            if (round == 0 && verbs)
                FK_CHECK(exs_init(EXS_VERSION) == -1 && errno == EOPNOTSUPP, 7);
            else if (round == 0)
                FK_CHECK(exs_init(EXS_VERSION) == EXS_VERSION, 7);
        }
        /* exs_close fails too, and takes the child's copy of the number */
        for (int i = 0; i < 4; i++) {
            errno = 0;
            FK_CHECK(exs_close(fds[i], EXS_QHANDLE_INVALID, NULL) == -1 && errno == ESTALE, 8);
            errno = 0;
            FK_CHECK(exs_close(fds[i], EXS_QHANDLE_INVALID, NULL) == -1 &&
                         (errno == EBADF || errno == ENOTSOCK),
                     9);
        }
        if (!verbs)
            fk_child_own_pair();
        exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child status %#x (exit code: the step that failed)", (unsigned)status);
    for (int i = 0; i < 3; i++) {
        fk_exchange(&c, &c.st, 10 + 2 * (uint32_t)i);
        fk_exchange(&c, &c.sp, 20 + 2 * (uint32_t)i);
    }
    it_expect_no_event(c.st.cq, 0);
    it_expect_no_event(c.st.sq, 0);
    it_expect_no_event(c.sp.cq, 0);
    it_expect_no_event(c.sp.sq, 0);
    fk_close(&c);
}

START_TEST(test_fork_child_inherited)
{
    if (!FK_CHILD_INIT)
        test_skip("test_fork_child_inherited (the child's exs_init and connection)",
                  "ThreadSanitizer cannot follow threads started in a forked child");
    fk_run(0);
}
END_TEST

START_TEST(test_fork_child_exits)
{
    fk_run(1); /* _exit */
    fk_run(2); /* exit: the exit handler must not run for the parent's library */
}
END_TEST

/* ---- fork while other threads are inside the library ---- */

#define FB_FORKS 20

struct fb_worker {
    struct fk_conns bufs; /* its own buffers (sb, rb) */
    struct it_pair *p;
    int mode;
    int stop;      /* atomic */
    unsigned done; /* atomic: exchanges */
};

/* Exchanges on its pair without pause, its queues in its wait mode: it takes and gives
 * the progress lock, its connection's and its queues' locks at any instant of a fork. */
static void *fb_worker_main(void *arg)
{
    struct fb_worker *w = arg;

    ck_assert_int_eq(exs_qsetwait(w->p->cq, w->mode, 0), 0);
    ck_assert_int_eq(exs_qsetwait(w->p->sq, w->mode, 0), 0);
    for (uint32_t seed = 100; !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE); seed += 2) {
        fk_exchange(&w->bufs, w->p, seed);
        __atomic_add_fetch(&w->done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* Stops both workers and joins them. */
static void fb_stop(struct fb_worker *w, pthread_t *th)
{
    for (int i = 0; i < 2; i++)
        __atomic_store_n(&w[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
}

/* Waits (deadline IT_TIMEOUT_MS) until w made n more exchanges. */
static void fb_wait_progress(struct fb_worker *w, unsigned n, const char *what)
{
    unsigned from = __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
    double end = it_now_ms() + IT_TIMEOUT_MS;

    while (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE) - from < n) {
        ck_assert_msg(it_now_ms() < end, "%s: the %s worker made no progress", what,
                      w->mode == EXS_WAIT_POLL ? "POLL" : "NOTIFY");
        it_sleep_ms(1);
    }
}

/*
 * FB_FORKS forks while two threads of the parent exchange without pause, one with its
 * queues in POLL (a busy poller: the progress lock taken by trylock at every turn) and
 * one in NOTIFY (arms, sleeps), so that the fork finds the progress lock, connections'
 * and queues' locks (futex locks since this session) taken or waited for at any instant.
 * Each child: an inherited descriptor answers ESTALE, then (not under TSan or ASan) its own
 * exs_init and a connection of its own carry data, and it exits 0 within 60 s (a lock
 * the child inherited held and takes again hangs it: SIGALRM). The parent's threads go
 * on exchanging after every fork (their data checked), and the fork itself returns (its
 * prepare handler waits for the progress lock against the busy poller).
 */
START_TEST(test_fork_while_busy)
{
    struct fk_conns c;
    struct fb_worker w[2];
    pthread_t th[2];

    fk_open(&c);
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].bufs.sb = it_buf_new(FK_MSG, 1);
        w[i].bufs.rb = it_buf_new(FK_MSG, 1);
        w[i].p = i ? &c.st : &c.sp;
        w[i].mode = i ? EXS_WAIT_NOTIFY : EXS_WAIT_POLL;
        ck_assert_int_eq(pthread_create(&th[i], NULL, fb_worker_main, &w[i]), 0);
    }
    for (int f = 0; f < FB_FORKS; f++) {
        int status;
        pid_t pid;

        fb_wait_progress(&w[0], 1, "before a fork");
        pid = fork();
        if (pid == 0) {
            /* no Check call here: a worker may have held its lock at the fork */
            char b[16] = "child";

            alarm(60);
            errno = 0;
            FK_CHECK(exs_send(c.sp.cfd, b, sizeof(b), 0, c.sp.cq, NULL, EXS_MHANDLE_UNREGISTERED) ==
                             -1 &&
                         errno == ESTALE,
                     3);
            if (!FK_BUSY_CHILD_INIT || strstr(it_provider, "verbs"))
                _exit(0);
            FK_CHECK(exs_init(EXS_VERSION) == EXS_VERSION, 7);
            fk_child_own_pair();
            /* _exit: under ASan, exit's leak check would report what the parent's
             * threads held (Check's records of their asserts) */
            _exit(0);
        }
        ck_assert_int_gt(pid, 0);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            /* the workers stopped first: a failed assert exits the process, and
             * LeakSanitizer's exit pass with them running can end it by SIGKILL, which
             * Check would report instead of this message */
            fb_stop(w, th);
            ck_abort_msg("fork %d: child status %#x (exit code: the step that failed)", f,
                         (unsigned)status);
        }
        for (int i = 0; i < 2; i++)
            fb_wait_progress(&w[i], 2, "after a fork");
    }
    fb_stop(w, th);
    for (int i = 0; i < 2; i++) {
        it_buf_free(w[i].bufs.sb);
        it_buf_free(w[i].bufs.rb);
    }
    fk_close(&c);
}
END_TEST

/* ---- exit ---- */

#define FX_CHUNK (64u << 10)

/* A child (forked before this process initializes the library) connects to port,
 * posts nsend sends of FX_CHUNK (pattern seed 7) without waiting for any, and then:
 * how 0: exit(0); 1: SIGKILL itself; 2: SO_LINGER {1, 0}, then exit(0); 3: exit(0) with
 * EXS_EXIT_LINGER_MS=300 (the parent reads nothing until the child is gone). */
static pid_t fx_child(int type, int nsend, int how, int *pipe_w_p)
{
    int pfd[2];
    pid_t pid;

    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        uint16_t port;
        /* static: still referenced at exit (the sends own it until then), not a leak */
        static uint8_t *buf;
        exs_qhandle_t q;
        int fd;

        alarm(60);
        close(pfd[1]);
        buf = malloc((size_t)nsend * FX_CHUNK);
        FK_CHECK(read(pfd[0], &port, sizeof(port)) == (ssize_t)sizeof(port), 30);
        FK_CHECK(buf != NULL, 31);
        if (how == 3)
            setenv("EXS_EXIT_LINGER_MS", "300", 1);
        FK_CHECK(exs_init(EXS_VERSION) == EXS_VERSION, 32);
        a.sin_addr = it_listen_in(); /* the parent's it_listen */
        a.sin_port = port;
        fd = exs_socket(AF_INET, type, 0);
        FK_CHECK(fd >= 0, 33);
        FK_CHECK(exs_connect(fd, (struct sockaddr *)&a, sizeof(a), EXS_QHANDLE_INVALID, NULL) == 0,
                 34);
        q = exs_qcreate(nsend + 1);
        FK_CHECK(q != EXS_QHANDLE_INVALID, 35);
        it_fill(buf, (size_t)nsend * FX_CHUNK, 7);
        for (int i = 0; i < nsend; i++)
            FK_CHECK(exs_send(fd, buf + (size_t)i * FX_CHUNK, FX_CHUNK, 0, q, NULL,
                              EXS_MHANDLE_UNREGISTERED) == 0,
                     36);
        if (how == 1)
            kill(getpid(), SIGKILL);
        if (how == 2) {
            struct linger l = {.l_onoff = 1, .l_linger = 0};

            FK_CHECK(exs_setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) == 0, 37);
        }
        exit(0); /* no exs_close, no exs_fini: the library ends the connection */
    }
    close(pfd[0]);
    *pipe_w_p = pfd[1];
    return pid;
}

/* The parent's side: accept the child's connection (type), read until the end, checking
 * every byte; returns the errno of the end (0: orderly end of stream / of messages) and
 * the bytes read in *got_p. */
static int fx_run(int type, int nsend, int how, size_t *got_p)
{
    struct sockaddr_in a;
    struct it_buf *rb;
    exs_qhandle_t q;
    exs_event_t ev;
    size_t got = 0;
    int lfd, fd, pw, status, end = -1;
    uint8_t *want = malloc((size_t)nsend * FX_CHUNK);
    pid_t pid;

    ck_assert_ptr_nonnull(want);
    it_fill(want, (size_t)nsend * FX_CHUNK, 7);
    /* the child is forked before this process starts threads (it_init below) */
    pid = fx_child(type, nsend, how, &pw);
    it_init();
    q = it_qcreate(16);
    rb = it_buf_new(FX_CHUNK, 1);
    lfd = it_listen(type, &a);
    IT_EXPECT_OK(exs_accept(lfd, q, IT_AH(0xACC)));
    ck_assert_int_eq(write(pw, &a.sin_port, sizeof(a.sin_port)), (ssize_t)sizeof(a.sin_port));
    close(pw);
    it_expect_err_at(q, EXS_EVT_ACCEPT, lfd, IT_AH(0xACC), 0, &ev, __FILE__, __LINE__);
    fd = ev.exs_evt_u.exs_evt_accept.exs_evt_newfd;
    if (how == 3) /* a peer that reads nothing: the child's exit must end by its linger */
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_ge(fd, 0);
    while (end < 0) {
        ssize_t r;

        IT_POST_RECV(fd, rb->p, FX_CHUNK, q, IT_AH(2), rb->mh);
        it_wait_event(q, EXS_EVT_RECV, fd, &ev);
        r = ev.exs_evt_u.exs_evt_xfer.exs_evt_result;
        if (ev.exs_evt_errno || r <= 0) {
            end = ev.exs_evt_errno;
            break;
        }
        ck_assert_msg(got + (size_t)r <= (size_t)nsend * FX_CHUNK, "more bytes than were sent");
        /* the pattern of seed 7 over the whole volume, at offset got */
        ck_assert_msg(memcmp(rb->p, want + got, (size_t)r) == 0, "bytes differ at offset %zu", got);
        got += (size_t)r;
    }
    if (how != 3)
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (how == 1)
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x",
                      (unsigned)status);
    else
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "child status %#x (exit code: the step that failed)", (unsigned)status);
    free(want);
    it_buf_free(rb);
    it_close(fd, q);
    it_close(lfd, q);
    it_qdelete(q);
    it_fini();
    *got_p = got;
    return end;
}

/* exit(0) with the sends still queued (more than the ring holds): every byte, then end
 * of stream (result 0, errno 0). Before, the peer got ECONNRESET. */
START_TEST(test_exit_stream_delivers)
{
    size_t got;
    int end = fx_run(SOCK_STREAM, 64, 0, &got);

    ck_assert_msg(end == 0 && got == 64 * FX_CHUNK,
                  "end errno %d (%s) after %zu of %u bytes: expected every byte then end of "
                  "stream",
                  end, strerror(end), got, 64 * FX_CHUNK);
}
END_TEST

/* The same for SEQPACKET messages (eager and announced): every message, then the end of
 * messages (a receive with result 0). */
START_TEST(test_exit_seqpacket_delivers)
{
    size_t got;
    int end = fx_run(SOCK_SEQPACKET, 16, 0, &got);

    ck_assert_msg(end == 0 && got == 16 * FX_CHUNK,
                  "end errno %d (%s) after %zu of %u bytes: expected every message then the end",
                  end, strerror(end), got, 16 * FX_CHUNK);
}
END_TEST

/* Killed: the peer sees a reset, as with a kernel socket. */
START_TEST(test_exit_killed_resets)
{
    size_t got;
    int end = fx_run(SOCK_STREAM, 64, 1, &got);

    ck_assert_msg(end == ECONNRESET, "end errno %d (%s) after %zu bytes: expected ECONNRESET", end,
                  strerror(end), got);
}
END_TEST

/* SO_LINGER {1, 0}: exit resets the connection at once, like close() would. */
START_TEST(test_exit_linger_zero_resets)
{
    size_t got;
    int end = fx_run(SOCK_STREAM, 64, 2, &got);

    ck_assert_msg(end == ECONNRESET, "end errno %d (%s) after %zu bytes: expected ECONNRESET", end,
                  strerror(end), got);
}
END_TEST

/* The linger bounds the exit: a peer that reads nothing cannot keep the process alive
 * (its alarm would kill it after 60 s); past EXS_EXIT_LINGER_MS the connection is reset. */
START_TEST(test_exit_linger_bounded)
{
    size_t got;
    int end = fx_run(SOCK_STREAM, 64, 3, &got);

    ck_assert_msg(end == ECONNRESET && got < 64 * FX_CHUNK,
                  "end errno %d (%s) after %zu bytes: expected ECONNRESET before the end", end,
                  strerror(end), got);
}
END_TEST

/* A kernel TCP socket with exs_send operations still queued in the library at exit(0)
 * (small socket buffers, a peer that reads only once the child has posted them all): the
 * library writes them to the kernel before the process ends, so the peer reads every byte
 * and then end of stream, as after plain send() calls. Before, exs_fini dropped them and
 * the peer saw the stream cut short. */
START_TEST(test_exit_kfd_delivers)
{
    enum { N = 64 };
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof(a);
    int lfd, fd, pfd[2], small = 16 << 10, status;
    size_t got = 0, total = (size_t)N * FX_CHUNK;
    uint8_t *want = malloc(total), *rb;
    char note;
    pid_t pid;

    ck_assert_ptr_nonnull(want);
    it_fill(want, total, 7);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(lfd, 0);
    ck_assert_int_eq(setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    ck_assert_int_eq(listen(lfd, 1), 0);
    ck_assert_int_eq(pipe(pfd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* static: the queued sends hold it until the exit flush wrote them, not a leak */
        static uint8_t *held;
        exs_qhandle_t q;
        int c;

        alarm(60);
        held = want;
        close(pfd[0]);
        c = socket(AF_INET, SOCK_STREAM, 0);
        FK_CHECK(c >= 0, 40);
        FK_CHECK(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0, 41);
        FK_CHECK(connect(c, (struct sockaddr *)&a, sizeof(a)) == 0, 42);
        FK_CHECK(exs_init(EXS_VERSION) == EXS_VERSION, 43);
        q = exs_qcreate(N + 1);
        FK_CHECK(q != EXS_QHANDLE_INVALID, 44);
        for (int i = 0; i < N; i++)
            FK_CHECK(exs_send(c, held + (size_t)i * FX_CHUNK, FX_CHUNK, 0, q, NULL,
                              EXS_MHANDLE_UNREGISTERED) == 0,
                     45);
        FK_CHECK(write(pfd[1], "p", 1) == 1, 46);
        exit(0); /* no exs_close, no exs_fini, sends still queued */
    }
    close(pfd[1]);
    rb = malloc(FX_CHUNK); /* the parent's only: the child's copy would leak at its exit */
    ck_assert_ptr_nonnull(rb);
    fd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    /* nothing is read until every send is posted: most of them wait in the library */
    ck_assert_int_eq(read(pfd[0], &note, 1), 1);
    for (;;) {
        ssize_t r = recv(fd, rb, FX_CHUNK, 0);

        ck_assert_msg(r >= 0, "recv: %s", strerror(errno));
        if (r == 0)
            break;
        ck_assert_msg(got + (size_t)r <= total, "more bytes than were sent");
        ck_assert_msg(memcmp(rb, want + got, (size_t)r) == 0, "bytes differ at offset %zu", got);
        got += (size_t)r;
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child status %#x (exit code: the step that failed)", (unsigned)status);
    ck_assert_msg(got == total, "end of stream after %zu of %zu bytes: sends queued at exit lost",
                  got, total);
    close(pfd[0]);
    close(fd);
    close(lfd);
    free(rb);
    free(want);
}
END_TEST

/* exit(0) while other threads of the process are still inside calls (sends on a libexs
 * socket and on a kernel socket, with a registration; dequeues; accepts): the library's
 * exs_fini at exit must not free what their lock-free looks read (the socket, kernel-socket,
 * queue and registration tables, parked objects). Under ASan such a read was a
 * heap-use-after-free (found by fuzz_tcp_frames, whose threads run on at its exit); the
 * child must end with status 0. */
static volatile int exit_racers_go;

static void *exit_racer(void *arg)
{
    int *fds = arg; /* libexs socket, kernel socket, registration handle, queue */
    char b[8] = "racer";
    exs_event_t ev;

    while (exit_racers_go) {
        (void)exs_send(fds[0], b, 1, 0, fds[3], NULL, fds[2]);
        (void)exs_send(fds[1], b, 1, 0, fds[3], NULL, EXS_MHANDLE_UNREGISTERED);
        (void)exs_qdequeue(fds[3], &ev, 1, &(struct timespec){0, 0});
        (void)exs_accept(fds[0], EXS_QHANDLE_INVALID, NULL);
    }
    return NULL;
}

START_TEST(test_exit_with_callers)
{
    for (int round = 0; round < 6; round++) { /* a race: six children, six chances */
        int status;
        pid_t pid;

        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            static char buf[4096];
            static int fds[4];
            pthread_t t[2];
            int sv[2];

            alarm(60);
            if (exs_init(EXS_VERSION) != EXS_VERSION)
                _exit(2);
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
                _exit(3);
            fds[0] = exs_socket(AF_INET, SOCK_STREAM, 0);
            fds[1] = sv[0];
            fds[2] = exs_mregister(buf, sizeof(buf), 0);
            fds[3] = exs_qcreate(64);
            if (fds[0] < 0 || fds[2] == EXS_MHANDLE_INVALID || fds[3] == EXS_QHANDLE_INVALID)
                _exit(4);
            exit_racers_go = 1;
            for (int i = 0; i < 2; i++)
                if (pthread_create(&t[i], NULL, exit_racer, fds))
                    _exit(5);
            usleep(20000); /* the racers run (their calls, not this pause, are the point) */
            exit(0);       /* they are still calling */
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "child %d: status %#x (a sanitizer report, or the step that failed)", round,
                      (unsigned)status);
    }
}
END_TEST

Suite *integ_fork_suite(void)
{
    Suite *s = suite_create("integ_fork");
    TCase *tc = it_tcase("fork", 120);

    tcase_add_test(tc, test_fork_child_inherited);
    tcase_add_test(tc, test_fork_child_exits);
    tcase_add_test(tc, test_fork_while_busy);
    suite_add_tcase(s, tc);
    tc = it_tcase("exit", 120);
    tcase_add_test(tc, test_exit_stream_delivers);
    tcase_add_test(tc, test_exit_seqpacket_delivers);
    tcase_add_test(tc, test_exit_killed_resets);
    tcase_add_test(tc, test_exit_linger_zero_resets);
    tcase_add_test(tc, test_exit_linger_bounded);
    tcase_add_test(tc, test_exit_kfd_delivers);
    tcase_add_test(tc, test_exit_with_callers);
    suite_add_tcase(s, tc);
    return s;
}
