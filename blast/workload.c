/* SPDX-License-Identifier: MIT */
/* blast: workload helpers: clocks, message sizes, the data pattern, statistics, parsing. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "blast/blast.h"

double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* User plus system CPU seconds of the whole process (all threads, the library's too). */
double cpu_now(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

void rusage_pair(double *cpu)
{
    cpu[0] = cpu_now();
    cpu[1] = now_sec();
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

void sg_seed(struct sizegen *g, uint64_t seed)
{
    g->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

/* Next size of an exponential generator: -mean*ln(U) cut to [1, max]. */
uint64_t sg_next_exp(struct sizegen *g)
{
    double u = (double)(xorshift(&g->rng) >> 11) / 9007199254740992.0; /* [0,1) */
    double v = -(double)g->mean * log(1.0 - u);
    uint64_t n = (uint64_t)v;

    if (n < 1)
        n = 1;
    if (n > g->max)
        n = g->max;
    return n;
}

/* The byte at stream offset o is byte (o % 8) of the word W(o / 8). */
static inline uint64_t pat_word(uint64_t w)
{
    return (w + 1) * 0x9e3779b97f4a7c15ull;
}

static inline unsigned char pat_byte(uint64_t o)
{
    return (unsigned char)(pat_word(o >> 3) >> (8 * (o & 7)));
}

void pattern_fill(unsigned char *p, size_t len, uint64_t off)
{
    size_t i = 0;

    while (i < len && ((off + i) & 7))
        p[i] = pat_byte(off + i), i++;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pat_word((off + i) >> 3); /* little-endian byte order, as pat_byte */

        memcpy(p + i, &w, 8);
    }
    for (; i < len; i++)
        p[i] = pat_byte(off + i);
}

/* Returns the index of the first wrong byte, or len when all are right. */
size_t pattern_check(const unsigned char *p, size_t len, uint64_t off)
{
    size_t i = 0;

    while (i < len && ((off + i) & 7)) {
        if (p[i] != pat_byte(off + i))
            return i;
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pat_word((off + i) >> 3);

        if (memcmp(p + i, &w, 8)) {
            for (size_t j = 0; j < 8; j++)
                if (p[i + j] != pat_byte(off + i + j))
                    return i + j;
        }
    }
    for (; i < len; i++)
        if (p[i] != pat_byte(off + i))
            return i;
    return len;
}

/* Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom. */
static const double t975[] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                              2.306, 2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
                              2.120, 2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
                              2.064, 2.060,  2.056, 2.052, 2.048, 2.045, 2.042};

/* Mean and half-width of the 95% confidence interval (t distribution, n-1 d.o.f.). */
void mean_ci95(const double *v, int n, double *mean, double *ci)
{
    double s = 0, ss = 0;

    *mean = 0;
    *ci = 0;
    if (n <= 0)
        return;
    for (int i = 0; i < n; i++)
        s += v[i];
    *mean = s / n;
    if (n < 2)
        return;
    for (int i = 0; i < n; i++)
        ss += (v[i] - *mean) * (v[i] - *mean);
    double sd = sqrt(ss / (n - 1));
    int df = n - 1;
    double t = df <= 30 ? t975[df] : (df <= 60 ? 2.000 : (df <= 120 ? 1.980 : 1.960));

    *ci = t * sd / sqrt((double)n);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* p in [0,100]: nearest-rank percentile; sorts v. */
double percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    size_t k = (size_t)ceil(p / 100.0 * (double)n);

    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

/* "4096", "64K", "4M", "1G" (binary multiples), "1e6". */
int parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        end++;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* "BYTES" or "exp:MEAN[:MAX]" (MAX defaults to 4 x MEAN). */
int parse_sizegen(const char *s, struct sizegen *g)
{
    memset(g, 0, sizeof(*g));
    if (!strncmp(s, "exp:", 4)) {
        char buf[64], *colon;

        snprintf(buf, sizeof(buf), "%s", s + 4);
        colon = strchr(buf, ':');
        if (colon)
            *colon++ = 0;
        if (parse_size(buf, &g->mean) || g->mean < 1)
            return -1;
        g->max = 4 * g->mean;
        if (colon && (parse_size(colon, &g->max) || g->max < 1))
            return -1;
        g->exp = 1;
        return 0;
    }
    if (parse_size(s, &g->mean) || g->mean < 1)
        return -1;
    g->max = g->mean;
    return 0;
}

static int prog_shown;
int progress_off;

/* A progress line on stderr, only when stderr is a terminal. */
void progress(const char *fmt, ...)
{
    va_list ap;
    char line[200];

    if (progress_off || !isatty(2))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "\r%-79.79s", line);
    fflush(stderr);
    prog_shown = 1;
}

void progress_end(void)
{
    if (prog_shown && isatty(2)) {
        fprintf(stderr, "\r%79s\r", "");
        fflush(stderr);
    }
    prog_shown = 0;
}

void set_err(struct side_result *r, int code, const char *fmt, ...)
{
    va_list ap;

    if (r->status)
        return; /* keep the first error */
    r->status = code ? code : EIO;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    va_end(ap);
}

int write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int read_full(int fd, void *buf, size_t len)
{
    return read_full_spin(fd, buf, len, 0);
}

int read_full_spin(int fd, void *buf, size_t len, int spin)
{
    char *p = buf;

    while (len) {
        ssize_t n = spin ? recv(fd, p, len, MSG_DONTWAIT) : read(fd, p, len);

        if (n < 0 && (errno == EINTR || (spin && errno == EAGAIN)))
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = ECONNRESET;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void flows_results(struct side_result *res, const struct flow_view *v, int n, int classes)
{
    double first = 0, last = 0;

    for (int i = 0; i < n; i++) {
        if (v[i].t_first && (!first || v[i].t_first < first))
            first = v[i].t_first;
        if (v[i].t_last > last)
            last = v[i].t_last;
    }
    res->seconds = last > first ? last - first : 0;
    for (int k = 0; classes && k < 2; k++) {
        double cf = 0, cl = 0, *all = NULL;
        size_t na = 0;

        for (int i = 0; i < n; i++) {
            if (v[i].cls != k)
                continue;
            res->cls_bytes[k] += v[i].bytes;
            res->cls_msgs[k] += v[i].msgs;
            if (v[i].t_first && (!cf || v[i].t_first < cf))
                cf = v[i].t_first;
            if (v[i].t_last > cl)
                cl = v[i].t_last;
            all = realloc(all, (na + v[i].nlat + 1) * sizeof(double));
            memcpy(all + na, v[i].lat, v[i].nlat * sizeof(double));
            na += v[i].nlat;
        }
        res->cls_seconds[k] = cl > cf ? cl - cf : 0;
        res->cls_p50_us[k] = percentile(all, na, 50);
        res->cls_p99_us[k] = percentile(all, na, 99);
        free(all);
    }
}
