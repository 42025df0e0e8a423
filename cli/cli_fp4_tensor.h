/*
 * Quantized tensors in safetensors files, ModelOpt naming (DESIGN.md §6, docs/cli.md):
 * X (U8 [rows, K/2] packed e2m1), X_scale (block scales) and, for NVFP4, X_scale_2 (F32
 * scalar decode scale). Shared by quantize/dequantize (cmd_quantize.c) and gemm/verify
 * (cmd_gemm.c).
 */
#ifndef FP4D_CLI_FP4_TENSOR_H
#define FP4D_CLI_FP4_TENSOR_H

#include <stdbool.h>
#include <stddef.h>

#include "fp4doctor/gemm.h"
#include "fp4doctor/io.h"

/* Metadata keys fp4doctor writes next to a quantized tensor X ("<prefix>X"). */
#define CLI_META_FORMAT       "fp4doctor.format."       /* "nvfp4" | "mxfp4" */
#define CLI_META_SCALE_LAYOUT "fp4doctor.scale_layout." /* "linear" | "swizzled" | "swizzled8x4" */
#define CLI_META_CONVENTION   "fp4doctor.convention."   /* quantizer convention name */

/* A GEMM operand loaded from a file. m points into the file's mapping or into owned copies. */
typedef struct cli_operand {
    fp4d_matrix m;
    float       scale_2;     /* X_scale_2, 1 when absent or plain */
    bool        has_scale_2;
    void       *owned_data;  /* aligned copy of plain data (NULL otherwise) */
} cli_operand;

/* Whether tensor X looks quantized: U8 X with a companion X_scale. */
bool cli_is_quantized(const fp4d_st_file *f, const char *name);

/*
 * Loads X as an operand. Plain F32/BF16/F16 2-D tensors are accepted when allow_plain.
 * On failure returns false with a one-line reason in msg (naming the tensor); the caller
 * exits with FP4D_EXIT_INPUT.
 */
bool cli_load_operand(const fp4d_st_file *f, const char *name, bool allow_plain, cli_operand *op,
                      char *msg, size_t msg_len);
void cli_operand_free(cli_operand *op);

/* True when both paths name the same existing file (same device and inode). */
bool cli_same_file(const char *a, const char *b);

/* safetensors dtype of a plain fp4d_dtype (F32/BF16/F16), and back. */
fp4d_st_dtype cli_st_dtype_of(fp4d_dtype t);
bool          cli_plain_dtype_of(fp4d_st_dtype t, fp4d_dtype *out);

#endif
