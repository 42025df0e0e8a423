/* Files replaced whole (src/common/replace_file.h): the new file appears under the
 * destination's name only once complete, with the permissions asked for; a replacement given up
 * or failing leaves the old file as it was; no temporary file is ever left behind. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "replace_file.h"
#include "test_util.h"

static char dir[] = "/tmp/fp4d_replace_XXXXXX";

static void path_in_dir(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The whole file as a string (the tests' files are small), or NULL if it cannot be read. */
static char *read_text(const char *path)
{
    static char buf[256];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Temporary files left beside dir/name (named name.tmp-XXXXXX while they are one). */
static int leftovers(const char *name)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.tmp", name);
    return tu_count_prefixed(dir, prefix);
}

/* The replacement of `path` begun, `text` written to it; its descriptor. */
static int begin_writing(const char *path, mode_t mode, const char *text, char **tmp)
{
    const int fd = fp4d_replace_begin(path, mode, tmp);
    assert_true(fd >= 0);
    assert_non_null(*tmp);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

static void test_commit_replaces_with_the_mode_asked_for(void **state)
{
    (void)state;
    char path[600];
    path_in_dir(path, sizeof path, "a.json");
    write_text(path, "old");
    char *tmp = NULL;
    const int fd = begin_writing(path, 0640, "new", &tmp);
    assert_int_equal(strncmp(tmp, path, strlen(path)), 0); /* beside it: same directory */
    assert_string_equal(read_text(path), "old"); /* not yet */
    assert_int_equal(fp4d_replace_commit(fd, tmp, path, true), 0);
    assert_string_equal(read_text(path), "new");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(leftovers("a.json"), 0);

    /* a new file, closed by its writer (as fclose does for the CLI's reports) */
    path_in_dir(path, sizeof path, "b.json");
    const int fd2 = begin_writing(path, 0604, "b", &tmp);
    assert_int_equal(close(fd2), 0);
    assert_int_equal(fp4d_replace_commit(-1, tmp, path, false), 0);
    assert_string_equal(read_text(path), "b");
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0604);
    assert_int_equal(leftovers("b.json"), 0);
    unlink(path);
    path_in_dir(path, sizeof path, "a.json");
    unlink(path);
}

static void test_abort_keeps_the_old_file(void **state)
{
    (void)state;
    char path[600];
    path_in_dir(path, sizeof path, "keep.txt");
    write_text(path, "precious");
    char *tmp = NULL;
    const int fd = begin_writing(path, 0644, "half a wri", &tmp);
    fp4d_replace_abort(fd, tmp);
    assert_string_equal(read_text(path), "precious");
    assert_int_equal(leftovers("keep.txt"), 0);
    unlink(path);
}

static void test_failures_are_errors_and_leave_nothing(void **state)
{
    (void)state;
    /* no directory to put the temporary file in */
    char path[600];
    path_in_dir(path, sizeof path, "missing/x.json");
    char *tmp = (char *)"unchanged";
    assert_int_equal(fp4d_replace_begin(path, 0644, &tmp), -1);
    assert_int_equal(errno, ENOENT);
    assert_null(tmp);

    /* the destination is a non-empty directory: rename fails, the directory stays */
    char sub[600], inner[700];
    path_in_dir(sub, sizeof sub, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(inner, sizeof inner, "%s/f", sub);
    write_text(inner, "inside");
    const int fd = begin_writing(sub, 0644, "data", &tmp);
    assert_int_not_equal(fp4d_replace_commit(fd, tmp, sub, true), 0);
    assert_string_equal(read_text(inner), "inside");
    assert_int_equal(leftovers("sub"), 0);
    unlink(inner);
    rmdir(sub);
}

/* One rule for a replacement's permissions: a new file gets 0666 less the umask (what fopen
 * would give it), an existing one keeps its own permission bits but not set-id or sticky ones,
 * and reading the umask leaves it as it was (umask() to read it sets it, for a moment, for
 * every thread). */
static void test_mode_follows_the_old_file_or_the_umask(void **state)
{
    (void)state;
    const mode_t saved = umask(027);
    assert_int_equal(fp4d_replace_mode(NULL), 0640);
    assert_int_equal(umask(027), 027); /* unchanged by the call */
    umask(077);
    assert_int_equal(fp4d_replace_mode(NULL), 0600);
    assert_int_equal(umask(077), 077);

    char path[600];
    path_in_dir(path, sizeof path, "m.bin");
    write_text(path, "m");
    struct stat st;
    assert_int_equal(chmod(path, 0604), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(fp4d_replace_mode(&st), 0604); /* its own, whatever the umask */
    assert_int_equal(chmod(path, 04755), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 04755);
    assert_int_equal(fp4d_replace_mode(&st), 0755);
    assert_int_equal(umask(saved), 077);
    unlink(path);
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_replaces_with_the_mode_asked_for),
        cmocka_unit_test(test_abort_keeps_the_old_file),
        cmocka_unit_test(test_failures_are_errors_and_leave_nothing),
        cmocka_unit_test(test_mode_follows_the_old_file_or_the_umask),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
