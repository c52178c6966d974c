/* SPDX-License-Identifier: MIT */
/* The control endpoint's directory: where the sockets are, and whom to trust there
 * (spec/observability.md §2). Shared by the library and exsctl. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "exs/ctl/ctl.h"
#include "exs/util/log.h"
#include "exs/util/params.h"
#include "exs/util/nocancel.h"
#include "exs/util/util.h"

/* ---- directory ---- */

int exs__ctl_dir(char *buf, size_t len, int create)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    uid_t uid = geteuid();
    int n;

    exs__params_load();
    if (exs__params.ctl_dir[0])
        n = snprintf(buf, len, "%s", exs__params.ctl_dir);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, len, "%s/exs", xdg);
    else if (uid == 0)
        n = snprintf(buf, len, "/run/exs/0");
    else
        n = snprintf(buf, len, "/tmp/exs-%u", (unsigned)uid);
    if (n < 0 || (size_t)n >= len)
        return -ENAMETOOLONG;
    if (!create)
        return 0;
    if (!exs__params.ctl_dir[0] && !(xdg && xdg[0] == '/') && uid == 0 &&
        mkdir("/run/exs", 0755) < 0 && errno != EEXIST) {
        EXS_WARN(API, "control endpoint: mkdir /run/exs: %m");
        return -errno;
    }
    /* made private; one that exists is checked as it is, never changed (ctl_dir_open) */
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) {
        EXS_WARN(API, "control endpoint: mkdir %s: %m", buf);
        return -errno;
    }
    return 0;
}

int exs__ctl_uid_ok(uid_t owner, uid_t uid, uid_t also)
{
    return owner == uid || owner == 0 || also == EXS_CTL_UID_ANY ||
           (also != EXS_CTL_UID_NONE && owner == also);
}

int exs__ctl_dir_trust(const struct stat *st, uid_t uid, uid_t also, char *why, size_t size)
{
    unsigned mode = (unsigned)st->st_mode & 07777;
    int shared = (mode & S_ISVTX) && (mode & 022);
    /* the library (also: EXS_CTL_UID_LIB): its own directory, or a shared one of root's or
     * its own; exsctl: its own, root's, or the one also names */
    int owner_ok = also == EXS_CTL_UID_LIB ? st->st_uid == uid || (shared && st->st_uid == 0)
                                           : exs__ctl_uid_ok(st->st_uid, uid, also);

    if (!S_ISDIR(st->st_mode)) {
        snprintf(why, size, "is not a directory");
        return -EPERM;
    }
    if (!owner_ok) {
        char other[48] = "", self[24] = "root";

        if (also != EXS_CTL_UID_LIB && also != EXS_CTL_UID_NONE && also != uid && also != 0)
            snprintf(other, sizeof(other), " or uid %u (the process's)", (unsigned)also);
        else if (uid && (also != EXS_CTL_UID_LIB || shared))
            snprintf(other, sizeof(other), " or root");
        if (uid)
            snprintf(self, sizeof(self), "uid %u", (unsigned)uid);
        snprintf(why, size, "belongs to uid %u (mode %04o), not to %s%s", (unsigned)st->st_uid,
                 mode, self, other);
        return -EPERM;
    }
    if ((mode & 022) && !shared) {
        snprintf(why, size, "has mode %04o: others may write in it and it is not sticky", mode);
        return -EPERM;
    }
    return shared;
}

int exs__ctl_dir_open(const char *dir, uid_t also, int *shared_p, char *why, size_t size)
{
    int fd = exs__nc_open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), ret;
    struct stat st;

    if (fd < 0) {
        ret = -errno;
        snprintf(why, size, "%s", ret == -ELOOP ? "is a symbolic link" : strerror(-ret));
        return ret;
    }
    /* what the descriptor holds is what is used: no name is looked up twice */
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        snprintf(why, size, "fstat: %s", strerror(-ret));
        exs__nc_close(fd);
        return ret;
    }
    ret = exs__ctl_dir_trust(&st, geteuid(), also, why, size);
    if (ret < 0) {
        exs__nc_close(fd);
        return ret;
    }
    *shared_p = ret;
    return fd;
}

void exs__ctl_sockaddr_at(int dfd, const char *name, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", dfd, name);
}
