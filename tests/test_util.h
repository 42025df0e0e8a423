/*
 * Helpers shared by the test programs: reading a whole file, running a shell command and
 * capturing its stdout, a monotonic clock, and counting the files of a folder by name. Header-only so that every test program can use
 * it without a library of its own.
 */
#ifndef FP4D_TEST_UTIL_H
#define FP4D_TEST_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

/* Everything left to read on f, NUL-terminated; *len (when len is not NULL) gets its length.
 * Returns a malloc'd buffer the caller frees, or NULL when out of memory. Does not close f. */
static inline char *tu_read_stream(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0, got;
    char  *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
        }
    }
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* The whole of the file at path, NUL-terminated; *len (when len is not NULL) gets its length.
 * Returns a malloc'd buffer the caller frees, or NULL when the file cannot be opened or read. */
static inline char *tu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = tu_read_stream(f, len);
    fclose(f);
    return buf;
}

/* tu_slurp, but "" (still malloc'd) for a file that is missing, so callers may strstr() it. */
static inline char *tu_slurp_or_empty(const char *path)
{
    char *s = tu_slurp(path, NULL);
    return s ? s : strdup("");
}

/* Runs cmd through the shell and returns its exit code (-1 when it did not exit normally);
 * *out gets its whole stdout, malloc'd and NUL-terminated, which the caller frees. */
static inline int tu_run_capture(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    *out = NULL;
    if (!p) return -1;
    *out = tu_read_stream(p, NULL);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Seconds on the monotonic clock: only differences mean anything. */
static inline double tu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Entries of folder `dir` whose names start with `prefix` (e.g. temporary files left
 * behind); -1 if the folder cannot be read. */
static inline int tu_count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

#endif
