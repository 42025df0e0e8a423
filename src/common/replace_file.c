#include "replace_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The process's umask, read without changing it: umask() sets it too, and for that moment
 * another thread's new files would get the wrong permissions. /proc/self/status has it since
 * Linux 4.7; elsewhere, umask() twice. */
static mode_t replace_current_umask(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (f) {
        char line[256];
        unsigned int m;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "Umask: %o", &m) == 1) {
                fclose(f);
                return (mode_t)(m & 0777);
            }
        fclose(f);
    }
    const mode_t m = umask(022);
    umask(m);
    return m;
}

mode_t fp4d_replace_mode(const struct stat *old)
{
    return old ? (old->st_mode & 0777) : (0666 & ~replace_current_umask());
}

int fp4d_replace_begin(const char *path, mode_t mode, char **tmp)
{
    *tmp = NULL;
    const size_t n = strlen(path) + sizeof ".tmp-XXXXXX";
    char *name = malloc(n);
    if (!name) {
        errno = ENOMEM;
        return -1;
    }
    snprintf(name, n, "%s.tmp-XXXXXX", path);
    /* O_EXCL and mode 0600: nobody else's file is ever reused; O_CLOEXEC: the check's children
     * (fork + exec) do not inherit it */
    const int fd = mkostemp(name, O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        free(name);
        errno = err;
        return -1;
    }
    (void)fchmod(fd, mode); /* mkstemp's 0600 is for the name's lifetime, not the file's */
    *tmp = name;
    return fd;
}

int fp4d_replace_commit(int fd, char *tmp, const char *path, bool sync)
{
    int err = 0;
    if (fd >= 0 && sync && fsync(fd) != 0) err = errno;
    if (fd >= 0 && close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) unlink(tmp);
    free(tmp);
    return err;
}

void fp4d_replace_abort(int fd, char *tmp)
{
    if (fd >= 0) close(fd);
    if (tmp) unlink(tmp);
    free(tmp);
}
