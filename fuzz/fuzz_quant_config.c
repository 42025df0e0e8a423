/*
 * Fuzz target: hf_quant_config.json / config.json text through fp4d_quant_config_parse, then
 * exclusion lookups (fnmatch wildcards, "re:" regexes) on a few module names. One name is long,
 * so that a pattern whose matching time explodes with the name's length runs into libFuzzer's
 * -timeout (and the regression test's) rather than passing on short names.
 */
#include <stdlib.h>

#include "fp4doctor/scan.h"
#include "fuzz.h"

int fp4d_fuzz_quant_config(const uint8_t *data, size_t size)
{
    /* 160 repeats of one letter: the worst case for a backtracking matcher (a checkpoint
     * chooses its tensor names), and longer than real names get. */
    static const char long_name[] = "model.layers.7.mlp."
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    static const char *const modules[] = {"lm_head", "model.layers.0.mlp.gate", "model.layers.12.self_attn.q_proj",
                                          "model.layers.3.mlp.experts.17.down_proj", "", long_name};
    static const char *const sources[] = {"hf_quant_config.json", "config.json"};
    for (int s = 0; s < 2; s++) {
        fp4d_quant_config *c = NULL;
        if (fp4d_quant_config_parse((const char *)data, size, sources[s], &c) != FP4D_STATUS_OK) continue;
        if ((unsigned)fp4d_quant_config_format(c) >= FP4D_CKPT_FORMAT_COUNT) abort();
        for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++) (void)fp4d_quant_config_is_excluded(c, modules[i]);
        fp4d_quant_config_free(c);
    }
    return 0;
}

#ifdef FP4D_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fp4d_fuzz_quant_config(data, size); }
#endif
