/* Fuzz entry points (libFuzzer style). Each target file defines one; built with
 * -DFP4D_LIBFUZZER it also defines LLVMFuzzerTestOneInput for libFuzzer, and
 * regression_driver.c replays the committed corpus through them as an ordinary test. */
#ifndef FP4D_FUZZ_H
#define FP4D_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int fp4d_fuzz_st_header(const uint8_t *data, size_t size);
int fp4d_fuzz_quant_config(const uint8_t *data, size_t size);
int fp4d_fuzz_names(const uint8_t *data, size_t size);
int fp4d_fuzz_probe_classify(const uint8_t *data, size_t size); /* a no-op without libcurl */
int fp4d_fuzz_ckpt_index(const uint8_t *data, size_t size);

#endif
