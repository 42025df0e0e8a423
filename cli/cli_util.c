/* Small helpers shared by the subcommands. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "internal.h"
#include "replace_file.h"

int cli_fail(int code, const char *cmd, const char *fmt, ...)
{
    /* messages quote tensor names, metadata and server text: shown without control characters
     * (a hostile file's name must not drive the terminal); long ones are cut at 4 KB */
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fp4d_text_clean(msg);
    fprintf(stderr, "fp4doctor %s: %s\n", cmd, msg);
    return code;
}

int cli_open_failed(const char *cmd, const fp4d_st_open_result *res)
{
    return cli_fail(res->error == FP4D_ST_ERR_RESOURCE ? FP4D_EXIT_INTERNAL : FP4D_EXIT_INPUT, cmd, "%s [%s]",
                    res->message, fp4d_st_error_name(res->error));
}

const char *cli_shown(const char *s, char *buf, size_t size)
{
    snprintf(buf, size, "%s", s ? s : "");
    fp4d_text_clean(buf);
    return buf;
}

char *cli_joined(const char *a, const char *b)
{
    const size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) {
        memcpy(s, a, na);
        memcpy(s + na, b, nb + 1);
    }
    return s;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    if (!s || s[0] < '0' || s[0] > '9') return false; /* strtoull would take "", " 5", "-1" */
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool cli_use_color(FILE *f)
{
    const char *nc = getenv("NO_COLOR");
    if (nc && nc[0]) return false;
    return isatty(fileno(f)) != 0;
}

bool cli_split_tensor_spec(const char *spec, char **path, char **name)
{
    *path = NULL;
    *name = NULL;
    if (!spec || !spec[0]) return false;
    const char *colon = strrchr(spec, ':');
    if (!colon) {
        *path = strdup(spec);
        return *path != NULL;
    }
    *path = strndup(spec, (size_t)(colon - spec));
    *name = colon[1] ? strdup(colon + 1) : NULL;
    return *path != NULL && (*path)[0] != '\0';
}

int cli_parse_help_only(int argc, char **argv, void (*usage)(FILE *))
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return FP4D_EXIT_OK;
        }
        /* optopt names an unknown short option; for an unknown long one it is 0 and getopt has
         * already stepped past it. */
        if (optopt) return cli_fail(FP4D_EXIT_USAGE, argv[0], "unknown option '-%c' (see fp4doctor %s --help)",
                                    optopt, argv[0]);
        return cli_fail(FP4D_EXIT_USAGE, argv[0], "unknown option '%s' (see fp4doctor %s --help)", argv[optind - 1],
                        argv[0]);
    }
    return -1;
}

/* Report files are written to a temporary file beside the target and renamed over it when
 * complete, so that a run that fails half-way - a checkpoint that cannot be read, a URL that
 * cannot be probed - leaves the user's previous report as it was instead of empty or gone.
 * Devices, pipes and symbolic links are written in place (renaming over a link would replace
 * the link, not the file it names). */
typedef struct pending_output {
    FILE *f;
    char *tmp;  /* NULL: written in place (a device, pipe or link, a directory we may not write) */
    char *path;
    char  cmd[32];
} pending_output;
static pending_output pending[8];
static char stdout_cmd[32] = "report"; /* the command that last opened "-", for its messages */

static pending_output *find_pending(FILE *f)
{
    for (size_t i = 0; i < sizeof pending / sizeof pending[0]; i++)
        if (pending[i].f == f) return &pending[i];
    return NULL;
}

static void forget_pending(pending_output *p)
{
    free(p->tmp);
    free(p->path);
    memset(p, 0, sizeof *p);
}

/* The identity of an output path: an existing file's device and inode (stdout's for "-"), or -
 * for a name not made yet - its folder's, with *leaf set to the name in that folder. */
static bool destination_identity(const char *path, struct stat *id, const char **leaf)
{
    *leaf = NULL;
    if (!strcmp(path, "-")) return fstat(STDOUT_FILENO, id) == 0;
    if (stat(path, id) == 0) return true;
    if (errno != ENOENT) return false;
    const char *slash = strrchr(path, '/');
    if (slash && !slash[1]) return false; /* "dir/" of a missing dir: no file will be made there */
    char *folder = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    const bool ok = folder && stat(folder, id) == 0;
    free(folder);
    *leaf = slash ? slash + 1 : path;
    return ok;
}

bool cli_same_destination(const char *a, const char *b)
{
    if (!strcmp(a, b)) return true;
    struct stat ia, ib;
    const char *leaf_a, *leaf_b;
    if (!destination_identity(a, &ia, &leaf_a) || !destination_identity(b, &ib, &leaf_b)) return false;
    if (ia.st_dev != ib.st_dev || ia.st_ino != ib.st_ino) return false;
    if (!leaf_a && !leaf_b) return true;
    return leaf_a && leaf_b && !strcmp(leaf_a, leaf_b);
}

int cli_refuse_plugin_output(const char *cmd, const char *opt, const char *path, const char *const *plugins,
                             size_t num_plugins)
{
    if (!strcmp(path, "-")) return FP4D_EXIT_OK;
    for (size_t i = 0; i < num_plugins; i++)
        if (cli_same_destination(path, plugins[i]))
            return cli_fail(FP4D_EXIT_USAGE, cmd, "%s '%s' is the plugin '%s': the report would replace it", opt, path,
                            plugins[i]);
    const char *env = getenv("FP4DOCTOR_PLUGINS");
    char *list = env && *env ? strdup(env) : NULL;
    int rc = FP4D_EXIT_OK;
    for (char *save = NULL, *p = list ? strtok_r(list, ":", &save) : NULL; p && rc == FP4D_EXIT_OK;
         p = strtok_r(NULL, ":", &save))
        if (cli_same_destination(path, p))
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "%s '%s' is the plugin '%s' (FP4DOCTOR_PLUGINS): the report would replace it",
                          opt, path, p);
    free(list);
    return rc;
}

int cli_registry_failed(const char *cmd, fp4d_status st)
{
    return cli_fail(st == FP4D_STATUS_NOMEM || st == FP4D_STATUS_INTERNAL ? FP4D_EXIT_INTERNAL : FP4D_EXIT_INPUT, cmd,
                    "%s", fp4d_last_error());
}

bool cli_path_is_stdout(const char *path)
{
    if (!strcmp(path, "-")) return true;
    struct stat named, out;
    if (stat(path, &named) != 0 || fstat(STDOUT_FILENO, &out) != 0) return false;
    /* a terminal or /dev/null takes a second writer without harm: only files, pipes and
     * sockets, where the second descriptor overwrote or interleaved the text */
    const bool shared = S_ISREG(out.st_mode) || S_ISFIFO(out.st_mode) || S_ISSOCK(out.st_mode);
    return shared && named.st_dev == out.st_dev && named.st_ino == out.st_ino;
}

static int open_failure = FP4D_EXIT_INPUT;

int cli_output_failure(void) { return open_failure; }

FILE *cli_open_output(const char *cmd, const char *path)
{
    open_failure = FP4D_EXIT_INPUT;
    if (!path[0]) {
        /* fopen("") fails, but the temporary file beside it did not, so the run went ahead and
         * only its last step said the report could not be written */
        open_failure = cli_fail(FP4D_EXIT_USAGE, cmd, "a report FILE cannot be an empty name (- is standard output)");
        return NULL;
    }
    if (cli_path_is_stdout(path)) {
        snprintf(stdout_cmd, sizeof stdout_cmd, "%s", cmd);
        return stdout;
    }
    struct stat st; /* lstat: a symbolic link is written through, in place, not replaced */
    const bool exists = lstat(path, &st) == 0;
    /* a report the user made read-only stays so, as it did when it was opened in place */
    if (exists && access(path, W_OK) != 0) {
        cli_fail(FP4D_EXIT_INPUT, cmd, "cannot write '%s': %s", path, strerror(errno));
        return NULL;
    }
    pending_output *slot = find_pending(NULL);
    char *tmp = NULL, *final_path = slot ? strdup(path) : NULL;
    int fd = -1;
    /* beside a regular file of one link, or a new one; else - or where no temporary file can be
     * made (a directory we may not write, a name at the length limit) - in place, as before */
    if (final_path && (!exists || (S_ISREG(st.st_mode) && st.st_nlink == 1))) {
        /* the old file's permission bits, or those fopen would give a new one */
        fd = fp4d_replace_begin(path, fp4d_replace_mode(exists ? &st : NULL), &tmp);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : fopen(path, "w");
    if (!f) {
        const int err = errno;
        if (fd >= 0) fp4d_replace_abort(fd, tmp);
        free(final_path);
        cli_fail(FP4D_EXIT_INPUT, cmd, "cannot write '%s': %s", path, strerror(err));
        return NULL;
    }
    if (final_path) {
        slot->f = f;
        slot->tmp = tmp;
        slot->path = final_path;
        snprintf(slot->cmd, sizeof slot->cmd, "%s", cmd);
    }
    return f;
}

int cli_close_output(FILE *f)
{
    if (!f) return FP4D_EXIT_OK;
    pending_output *p = f == stdout ? NULL : find_pending(f);
    errno = 0;
    bool ok = fflush(f) == 0 && !ferror(f);
    int err = ok ? 0 : (errno ? errno : EIO);
    if (f != stdout && fclose(f) != 0 && ok) ok = false, err = errno;
    if (p && p->tmp) { /* fclose above has closed the temporary file */
        if (ok) {
            err = fp4d_replace_commit(-1, p->tmp, p->path, false);
            ok = err == 0;
        } else {
            fp4d_replace_abort(-1, p->tmp);
        }
        p->tmp = NULL;
    }
    int rc = FP4D_EXIT_OK;
    if (!ok && p) rc = cli_fail(FP4D_EXIT_INPUT, p->cmd, "cannot write '%s': %s", p->path, strerror(err));
    else if (!ok) rc = cli_fail(FP4D_EXIT_INPUT, stdout_cmd, "cannot write %s: %s", f == stdout ? "standard output" : "a report",
                                strerror(err));
    if (!ok && f == stdout) clearerr(stdout); /* said here: main's last check must not say it again */
    if (p) forget_pending(p);
    return rc;
}

void cli_discard_output(FILE *f)
{
    if (!f || f == stdout) {
        if (f) fflush(f);
        return;
    }
    pending_output *p = find_pending(f);
    fclose(f);
    if (p && p->tmp) {
        fp4d_replace_abort(-1, p->tmp);
        p->tmp = NULL;
    }
    if (p) forget_pending(p);
}

void cli_catch_sigint(void (*handler)(int), struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old);
}
