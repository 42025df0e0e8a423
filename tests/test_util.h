/*
 * Helpers shared by the test programs: reading a whole file, running a shell command and
 * capturing its stdout, a monotonic clock, counting the files of a folder by name, and running
 * the fp4doctor binary in a scratch folder (CLI tests). Header-only so that every test program can use
 * it without a library of its own.
 */
#ifndef FP4D_TEST_UTIL_H
#define FP4D_TEST_UTIL_H

/* 1 in an AddressSanitizer build (gcc or clang): such builds run 10-50x slower, need far more
 * address space than any `ulimit -v` or `-d` a test sets, and report a NULL store through
 * UBSan's abort (SIGABRT) rather than SIGSEGV. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_SANITIZED 1
#endif
#endif
#ifndef TU_SANITIZED
#define TU_SANITIZED 0
#endif

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* ---- CLI tests: the binary run through the shell, its output in files of a scratch folder ---- */

/* The fp4doctor binary under test: FP4DOCTOR_BIN (ctest sets it), else the build's. */
static inline const char *tu_cli_binary(void)
{
    const char *b = getenv("FP4DOCTOR_BIN");
    return b ? b : FP4D_TEST_BINARY_DIR "/fp4doctor";
}

/* Removes path and, for a folder, everything below it (a test's scratch folder). */
static inline void tu_remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            const size_t n = strlen(path) + strlen(de->d_name) + 2;
            char *sub = malloc(n);
            if (!sub) break;
            snprintf(sub, n, "%s/%s", path, de->d_name);
            tu_remove_tree(sub);
            free(sub);
        }
    closedir(d);
    rmdir(path);
}

/* dir/name, in one of eight rotating buffers (so that a call can take several paths). */
static inline const char *tu_path_in(const char *dir, const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* Runs "prefix 'bin' args" through the shell, args printf-formatted and already shell-quoted
 * by the caller (prefix: "" or e.g. a ulimit), stdout and stderr to dir/stdout.txt and
 * dir/stderr.txt. Returns the exit code, or 128 + the signal that killed it. */
static inline int tu_run_cli_v(const char *bin, const char *dir, const char *prefix, const char *fmt, va_list ap)
{
    char args[2048], cmd[4096];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(cmd, sizeof cmd, "%s '%s' %s >'%s/stdout.txt' 2>'%s/stderr.txt'", prefix, bin, args, dir, dir);
    const int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static inline int tu_run_cli(const char *bin, const char *dir, const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int rc = tu_run_cli_v(bin, dir, prefix, fmt, ap);
    va_end(ap);
    return rc;
}

/* Whether dir/which contains needle; says what it holds instead when not. */
static inline bool tu_output_contains(const char *dir, const char *which, const char *needle)
{
    char *s = tu_slurp(tu_path_in(dir, which), NULL);
    const bool ok = s && strstr(s, needle);
    if (!ok) fprintf(stderr, "%s lacks '%s': %s\n", which, needle, s ? s : "(missing)");
    free(s);
    return ok;
}

#endif
