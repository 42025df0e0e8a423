/* Small helpers shared by the subcommands. */
#include <errno.h>
#include <getopt.h>
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
