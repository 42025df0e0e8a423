/* Small helpers shared by the subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cli_fail(int code, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fp4doctor %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
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

FILE *cli_open_output(const char *cmd, const char *path)
{
    if (!strcmp(path, "-")) return stdout;
    FILE *f = fopen(path, "w");
    if (!f) {
        cli_fail(FP4D_EXIT_INPUT, cmd, "cannot write '%s': %s", path, strerror(errno));
        return NULL;
    }
    return f;
}

void cli_close_output(FILE *f)
{
    if (f && f != stdout) fclose(f);
    else if (f) fflush(f);
}
