/*
 * gen-checkpoint: writes a tiny test checkpoint (or a multi-GB one with --random-fill) in one
 * of the FP4 formats, clean or with defects planted. Checkpoints are generated, never
 * committed; tests, the benchmark and people trying `fp4doctor scan` use this.
 *
 *   gen-checkpoint DIR --format modelopt|ct-nvfp4|ct-mxfp4|gpt-oss|plain
 *                  [--layers N] [--hidden H] [--head-dim D] [--intermediate I] [--experts E]
 *                  [--shards S] [--seed S] [--zero-byte B] [--zero-fraction F] [--random-fill]
 *                  [--plant DEFECT:TENSOR[:COUNT]]...
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/scan.h"

static const struct {
    const char      *name;
    fp4d_ckpt_format format;
} formats[] = {
    {"modelopt", FP4D_CKPT_MODELOPT_NVFP4}, {"ct-nvfp4", FP4D_CKPT_CT_NVFP4}, {"ct-mxfp4", FP4D_CKPT_CT_MXFP4},
    {"gpt-oss", FP4D_CKPT_GPTOSS_MXFP4},    {"plain", FP4D_CKPT_UNQUANTIZED},
};

static int usage(void)
{
    fprintf(stderr, "usage: gen-checkpoint DIR --format modelopt|ct-nvfp4|ct-mxfp4|gpt-oss|plain [--layers N]\n"
                    "       [--hidden H] [--head-dim D] [--intermediate I] [--experts E] [--shards S] [--seed S]\n"
                    "       [--zero-byte B]"
                    " [--zero-fraction F] [--random-fill] [--plant DEFECT:TENSOR[:COUNT]]...\n"
                    "defects:");
    for (int d = 0; d < FP4D_DEFECT_COUNT; d++) fprintf(stderr, " %s", fp4d_ckpt_defect_name((fp4d_ckpt_defect)d));
    fputc('\n', stderr);
    return 2;
}

/* A whole decimal number in 0..INT32_MAX: atoi took "x" as 0 and wrapped 99999999999, so a
 * typo reached the generator as some other size. */
static bool parse_count(const char *opt, const char *v, int32_t *out)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > INT32_MAX) {
        fprintf(stderr, "gen-checkpoint: %s '%s' is not a number in 0..%d\n", opt, v, INT32_MAX);
        return false;
    }
    *out = (int32_t)n;
    return true;
}

/* The --plant specs the plants' tensor names point into: freed at exit (they were never freed). */
static char *specs[64];
static size_t num_specs;

static void free_specs(void)
{
    for (size_t i = 0; i < num_specs; i++) free(specs[i]);
    num_specs = 0;
}

static int run(int argc, char **argv)
{
    const char *dir = NULL;
    int format = -1;
    fp4d_ckpt_plant plants[64];
    size_t np = 0;
    /* Parse the format first: defaults depend on it. */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--format"))
            for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
                if (!strcmp(argv[i + 1], formats[f].name)) format = (int)formats[f].format;
    if (format < 0) return usage();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, (fp4d_ckpt_format)format);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--random-fill")) p.random_fill = true;
        else if (a[0] != '-') {
            if (dir) return usage();
            dir = a;
        } else if (!v) return usage();
        else {
            i++;
            if (!strcmp(a, "--format")) continue;
            else if (!strcmp(a, "--layers")) { if (!parse_count(a, v, &p.layers)) return 2; }
            else if (!strcmp(a, "--hidden")) { if (!parse_count(a, v, &p.hidden)) return 2; }
            else if (!strcmp(a, "--head-dim")) { if (!parse_count(a, v, &p.head_dim)) return 2; }
            else if (!strcmp(a, "--intermediate")) { if (!parse_count(a, v, &p.intermediate)) return 2; }
            else if (!strcmp(a, "--experts")) { if (!parse_count(a, v, &p.experts)) return 2; }
            else if (!strcmp(a, "--shards")) { if (!parse_count(a, v, &p.shards)) return 2; }
            else if (!strcmp(a, "--seed")) p.seed = strtoull(v, NULL, 0);
            else if (!strcmp(a, "--zero-byte")) p.zero_block_byte = (int)strtol(v, NULL, 0);
            else if (!strcmp(a, "--zero-fraction")) p.zero_block_fraction = atof(v);
            else if (!strcmp(a, "--plant")) {
                if (np == sizeof plants / sizeof plants[0]) return usage();
                char *spec = strdup(v), *c1 = spec ? strchr(spec, ':') : NULL;
                if (spec) specs[num_specs++] = spec; /* np < 64, so num_specs < 64 too */
                if (!c1) return usage();
                *c1 = '\0';
                if (!fp4d_ckpt_defect_from_name(spec, &plants[np].defect)) return usage();
                char *tensor = c1 + 1, *c2 = strrchr(tensor, ':');
                plants[np].count = 0;
                if (c2) {
                    *c2 = '\0';
                    plants[np].count = strtoull(c2 + 1, NULL, 10);
                }
                plants[np].tensor = tensor;
                np++;
            } else return usage();
        }
    }
    if (!dir) return usage();
    p.plants = plants;
    p.num_plants = np;
    fp4d_status st = fp4d_ckpt_generate(dir, &p);
    if (st != FP4D_STATUS_OK) {
        fprintf(stderr, "gen-checkpoint: %s\n", fp4d_last_error());
        return st == FP4D_STATUS_INVALID_ARG ? 2 : 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const int rc = run(argc, argv);
    free_specs();
    return rc;
}
