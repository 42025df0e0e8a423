/* fp4doctor env: GPUs, compute capability, driver, CUDA runtime, cuBLASLt, cuDNN, built archs. */
#include <string.h>

#include "cli.h"
#include "fp4doctor/doctor.h"

int cmd_env(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fp4doctor env [--json]\n\n"
                   "Prints what fp4doctor sees: CPU model and features, GPUs with compute capability,\n"
                   "driver, CUDA runtime, cuBLASLt and cuDNN versions, the architectures this build\n"
                   "carries native code for, and warnings (docs/cli.md, docs/json-schema.md).\n");
            return FP4D_EXIT_OK;
        } else {
            return cli_fail(FP4D_EXIT_USAGE, "env", "unknown option '%s' (see fp4doctor env --help)", argv[i]);
        }
    }
    fp4d_status st = json ? fp4d_env_write_json(stdout) : fp4d_env_write_text(stdout);
    if (st != FP4D_STATUS_OK) return cli_fail(FP4D_EXIT_INTERNAL, "env", "%s", fp4d_last_error());
    return FP4D_EXIT_OK;
}
