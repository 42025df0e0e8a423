/* The fp4doctor command-line tool: one function per subcommand (cli/cmd_<name>.c). */
#ifndef FP4D_CLI_H
#define FP4D_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "fp4doctor/fp4doctor.h"
#include "fp4doctor/io.h"

/* Every subcommand: argv[0] is the subcommand's name. Returns an exit code (enum fp4d_exit). */
typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_check(int argc, char **argv);
int cmd_child(int argc, char **argv);   /* hidden: the doctor's isolated child process */
int cmd_backends(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
int cmd_gemm(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_scan(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* The path of the running executable (for re-executing ourselves), set by main(). */
extern const char *cli_self_path;

/* Prints "fp4doctor <cmd>: <message>" to stderr and returns code. */
int cli_fail(int code, const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* True when colour may be used on f: a TTY and NO_COLOR unset. */
bool cli_use_color(FILE *f);

/* Splits "file.safetensors:tensor" at the LAST ':' into path and name (name may be NULL
 * when there is no ':'). Returns false when the spec is empty. Caller frees *path. */
bool cli_split_tensor_spec(const char *spec, char **path, char **name);

/* Reports a safetensors file that fp4d_st_open could not open: exit 4 where the process ran out
 * of memory or descriptors (FP4D_ST_ERR_RESOURCE), else 3; returns that exit code. */
int cli_open_failed(const char *cmd, const fp4d_st_open_result *res);

/* s copied into buf (size bytes, cut if longer) as shown on a terminal: untrusted text (a
 * plugin's or a server's words) without control characters, whole UTF-8. Returns buf. */
const char *cli_shown(const char *s, char *buf, size_t size);

/* a followed by b in a new string (malloc'd; NULL when out of memory). Tensor names have no
 * length limit short of the header's, so names built from them are never cut to a buffer. */
char *cli_joined(const char *a, const char *b);

/* A whole decimal number for an option's value: digits only (no sign, space, empty string or
 * trailing characters) and within uint64_t. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* Option parsing for a subcommand whose only option is -h/--help: scans argv from index 1 with
 * getopt_long. Returns -1 when parsing succeeded and the positional arguments start at optind;
 * otherwise the exit code to return at once: FP4D_EXIT_OK after printing usage to stdout for
 * --help, FP4D_EXIT_USAGE after a one-line error naming an unknown option. */
int cli_parse_help_only(int argc, char **argv, void (*usage)(FILE *));

/* Long runs that stop cleanly on Ctrl-C (bench, probe): the first SIGINT calls `handler`, which
 * sets the command's flag; the run stops at its next check and reports what it has. The
 * handler is reset as it fires (SA_RESETHAND), so a second Ctrl-C kills as usual. *old gets
 * the previous action, to put back with sigaction(SIGINT, old, NULL). */
void cli_catch_sigint(void (*handler)(int), struct sigaction *old);

/* Whether two output paths ("-" is stdout) name one destination: the same text, one existing
 * file under two names (links, "./x", /dev/stdout for "-"), or one name yet to be made in one
 * folder. Two reports written there lost the first in silence. */
bool cli_same_destination(const char *a, const char *b);

/* A usage error (message printed, FP4D_EXIT_USAGE returned) when report path `path` of option
 * `opt` is one of the plugin libraries this run loads (`plugins`, then FP4DOCTOR_PLUGINS): the
 * report would replace the library. FP4D_EXIT_OK otherwise. */
int cli_refuse_plugin_output(const char *cmd, const char *opt, const char *path, const char *const *plugins,
                             size_t num_plugins);

/* After fp4d_registry_init returned `st` (a plugin that cannot be loaded, from --plugin or
 * FP4DOCTOR_PLUGINS): prints its message and returns the exit code, FP4D_EXIT_INPUT (an input
 * that could not be read) but FP4D_EXIT_INTERNAL when out of memory or internal. */
int cli_registry_failed(const char *cmd, fp4d_status st);

/* Report files of --json FILE|- style options. cli_open_output: "-" is stdout; a new file or a
 * plain one (one link) is written to a temporary file beside it, anything else in place (see
 * cli_util.c); NULL on failure (message printed).
 * cli_close_output puts the report in place (renames it over FILE) and returns FP4D_EXIT_OK or,
 * after a message, FP4D_EXIT_INPUT; cli_discard_output drops it and leaves a previous FILE as it
 * was - for runs that fail before their report is complete. */
FILE *cli_open_output(const char *cmd, const char *path);
/* The exit code for a cli_open_output that returned NULL: FP4D_EXIT_USAGE for an empty name,
 * FP4D_EXIT_INPUT for a file that cannot be written. */
int   cli_output_failure(void);
/* "-", or a path naming the file or pipe standard output already is (/dev/stdout,
 * /proc/self/fd/1, the file it was redirected to): cli_open_output returns stdout for it, so
 * the text report must go elsewhere; opened by name, its second descriptor wrote over the text
 * from offset 0. */
bool  cli_path_is_stdout(const char *path);
int   cli_close_output(FILE *f);
void  cli_discard_output(FILE *f);

#endif
