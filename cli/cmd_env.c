/* STUB: replaced by the owner of this command. */
#include "cli.h"
int cmd_env(int argc, char **argv) { (void)argc; return cli_fail(FP4D_EXIT_INTERNAL, argv[0], "not built yet"); }
