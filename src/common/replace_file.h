/*
 * Files replaced whole. The new contents go to a temporary file beside the destination - the
 * same directory, so the same file system, where rename() is atomic - that is renamed over it
 * only once complete: a reader (another process, or the user after a failed run) sees the old
 * file or the new one, never part of either, and a write that fails leaves the old file as it
 * was. The safetensors writer, the verdict cache and the CLI's report files use it.
 */
#ifndef FP4D_REPLACE_FILE_H
#define FP4D_REPLACE_FILE_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/* The permission bits a replaced file gets: the old file's (old, as lstat() gave it), or, for a
 * new file (old NULL), 0666 less the process's umask, as fopen() would give it. Set-id and
 * sticky bits are not carried to the new file. The umask is read without being changed, so
 * another thread creating a file meanwhile is not affected. The safetensors writer and the
 * CLI's report files both use it, so an output's permissions follow one rule. */
mode_t fp4d_replace_mode(const struct stat *old);

/* Creates the temporary file for `path` ("PATH.tmp-XXXXXX", permissions `mode`, as given:
 * no umask) and returns its descriptor, with its name in *tmp (malloc'd); -1 with errno set
 * and *tmp NULL where it cannot be made. */
int fp4d_replace_begin(const char *path, mode_t mode, char **tmp);

/* Puts the temporary file in path's place: its data flushed to the disk first where `sync`,
 * then closed (fd < 0: the caller has closed it, e.g. by fclose) and renamed over path. Where
 * a step fails the temporary file is removed instead. Frees tmp. Returns 0, or the errno of
 * the failed step. */
int fp4d_replace_commit(int fd, char *tmp, const char *path, bool sync);

/* Gives the replacement up: closes fd (unless < 0), removes the temporary file, frees tmp. */
void fp4d_replace_abort(int fd, char *tmp);

#endif
