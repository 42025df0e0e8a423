/* fp4doctor: entry point and subcommand dispatch. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fp4doctor/fp4doctor.h"

const char *cli_self_path = "fp4doctor";

typedef struct cli_command {
    const char     *name;
    cli_command_fn  fn;
    const char     *summary;
    bool            hidden;
} cli_command;

/* Sorted by name, as `fp4doctor --help` lists them. */
static const cli_command commands[] = {
    {"__child",    cmd_child,      "internal: run one backend's cases in isolation", true},
    {"backends",   cmd_backends,   "list every backend, available or not and why", false},
    {"bench",      cmd_bench,      "time backends against the same-run anchor", false},
    {"check",      cmd_check,      "check every FP4 GEMM backend against the exact reference (default)", false},
    {"dequantize", cmd_dequantize, "dequantize NVFP4/MXFP4 tensors of a safetensors file to f32", false},
    {"env",        cmd_env,        "GPUs, driver, CUDA runtime, cuBLASLt, cuDNN, built architectures", false},
    {"gemm",       cmd_gemm,       "run one FP4 GEMM on tensors from safetensors files", false},
    {"probe",      cmd_probe,      "probe an OpenAI-compatible server for NaN stops and garbage", false},
    {"quantize",   cmd_quantize,   "quantize tensors of a safetensors file to NVFP4/MXFP4", false},
    {"replay",     cmd_replay,     "run one checkpoint layer's real weights through every backend", false},
    {"scan",       cmd_scan,       "check an NVFP4/MXFP4 checkpoint for bad scales, shapes, shards", false},
    {"verify",     cmd_verify,     "compare a GEMM output file with the exact reference", false},
};

static void print_usage(FILE *f)
{
    fprintf(f,
            "fp4doctor %s - why does my FP4 model emit NaN or garbage?\n\n"
            "usage: fp4doctor [COMMAND] [OPTIONS]\n"
            "       fp4doctor COMMAND --help\n\n"
            "With no command, runs `fp4doctor check`.\n\ncommands:\n",
            fp4d_version_string());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!commands[i].hidden) fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit codes: 0 all passed, 1 something failed, 2 usage error, 3 unreadable input,\n"
               "4 internal error (docs/exit-codes.md)\n");
}

static int dispatch(int argc, char **argv)
{
    if (argc >= 2) {
        const char *a = argv[1];
        if (!strcmp(a, "--version") || !strcmp(a, "-V")) {
            printf("fp4doctor %s\n", fp4d_version_string());
            return FP4D_EXIT_OK;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help")) {
            if (!strcmp(a, "help") && argc >= 3) {
                for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                    if (!strcmp(commands[i].name, argv[2])) {
                        char *sub[] = {argv[2], "--help", NULL};
                        return commands[i].fn(2, sub);
                    }
                fprintf(stderr, "fp4doctor help: unknown command '%s' (see fp4doctor --help)\n", argv[2]);
                return FP4D_EXIT_USAGE;
            }
            print_usage(stdout);
            return FP4D_EXIT_OK;
        }
        if (a[0] != '-') {
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (!strcmp(commands[i].name, a)) return commands[i].fn(argc - 1, argv + 1);
            fprintf(stderr, "fp4doctor: unknown command '%s' (see fp4doctor --help)\n", a);
            return FP4D_EXIT_USAGE;
        }
    }
    /* No command, or only options: the doctor. argv[0] stands in for "check". */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return FP4D_EXIT_INTERNAL;
    args[0] = "check";
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    int rc = cmd_check(argc, args);
    free(args);
    return rc;
}

/* What a command printed must have reached standard output: into a closed pipe or a full disk
 * it did not, and a report not written completely is exit 3, as for report files (docs/cli.md).
 * The loss is said whatever the exit code (a run that failed - exit 1 - lost its verdicts in
 * silence); a command that already failed keeps its exit code. */
static int stdout_written(int rc, const char *cmd /* NULL: none */)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    const int err = errno ? errno : EIO;
    fprintf(stderr, "fp4doctor%s%s: cannot write standard output: %s\n", cmd ? " " : "", cmd ? cmd : "", strerror(err));
    return rc != FP4D_EXIT_OK ? rc : FP4D_EXIT_INPUT;
}

int main(int argc, char **argv)
{
    cli_self_path = argv[0];
    /* A reader that goes away (`fp4doctor backends --json | head -c 10`) must not kill a
     * command mid-report: the write fails instead, and stdout_written (or the command itself)
     * says so. The children re-executed by `check` inherit this; they report on fd 3, and
     * their standard output is the parent's standard error, so they are left out below. */
    signal(SIGPIPE, SIG_IGN);
    const char *a = argc >= 2 ? argv[1] : "";
    const bool about = !strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "help") || !strcmp(a, "--version") ||
                       !strcmp(a, "-V");
    const char *cmd = about ? NULL : a[0] && a[0] != '-' ? a : "check";
    const int rc = dispatch(argc, argv);
    return cmd && strcmp(cmd, "__child") == 0 ? rc : stdout_written(rc, cmd);
}
