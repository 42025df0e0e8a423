/*
 * scan.h - the checkpoint doctor: findings about an NVFP4/MXFP4 Hugging Face checkpoint
 * (`fp4doctor scan`), the quant-config parser it uses, and a generator of tiny test
 * checkpoints with chosen defects planted (used by the tests and the benchmark).
 *
 * Formats recognised (spec §7): ModelOpt NVFP4 (incl. MIXED_PRECISION) and MXFP4,
 * compressed-tensors nvfp4-pack-quantized / mxfp4-pack-quantized, gpt-oss MXFP4 (*_blocks /
 * *_scales) and plain bf16/fp16/f32/fp8 tensors. docs/scan.md defines every finding code, its
 * severity and what its count counts.
 */
#ifndef FP4DOCTOR_SCAN_H
#define FP4DOCTOR_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fp4doctor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* JSON report version (docs/json-schema.md, "## scan"). Bumped on incompatible changes. */
#define FP4D_SCAN_SCHEMA_VERSION 1

typedef enum fp4d_scan_severity {
    FP4D_SCAN_INFO    = 0,
    FP4D_SCAN_WARNING = 1,
    FP4D_SCAN_ERROR   = 2
} fp4d_scan_severity;

const char *fp4d_scan_severity_name(fp4d_scan_severity s); /* "info", "warning", "error" */

/*
 * Finding codes. Names are stable (people grep for them); numbers are append-only.
 * X(name, number)
 */
#define FP4D_FINDING_LIST(X)              \
    X(HEADER_INVALID, 0)                  \
    X(FILE_TRUNCATED, 1)                  \
    X(INDEX_MISSING_TENSOR, 2)            \
    X(INDEX_WRONG_FILE, 3)                \
    X(INDEX_MISSING_FILE, 4)              \
    X(DUPLICATE_TENSOR, 5)                \
    X(DTYPE_MISMATCH, 6)                  \
    X(SHAPE_MISMATCH, 7)                  \
    X(MISSING_COMPANION, 8)               \
    X(ORPHAN_SCALE, 9)                    \
    X(SCALE_NAN, 10)                      \
    X(SCALE_NEGATIVE, 11)                 \
    X(SCALE_ZERO_NONZERO_DATA, 12)        \
    X(GLOBAL_SCALE_NONFINITE, 13)         \
    X(GLOBAL_SCALE_NONPOSITIVE, 14)       \
    X(GLOBAL_SCALE_CONVENTION, 15)        \
    X(FUSED_SCALE_MISMATCH, 16)           \
    X(NONFINITE_VALUES, 17)               \
    X(SCALE_OUTLIER, 18)                  \
    X(EXCLUDED_BUT_QUANTIZED, 19)         \
    X(QUANTIZED_BUT_EXCLUDED, 20)         \
    X(TP_SHARD, 21)                       \
    X(FILE_HASH_MISMATCH, 22)

typedef enum fp4d_finding_code {
#define FP4D_FINDING_ENUM_(name, num) FP4D_FINDING_##name = num,
    FP4D_FINDING_LIST(FP4D_FINDING_ENUM_)
#undef FP4D_FINDING_ENUM_
    FP4D_FINDING_COUNT_
} fp4d_finding_code;

const char *fp4d_finding_code_name(fp4d_finding_code c);            /* "SCALE_NAN"; never NULL */
bool        fp4d_finding_code_from_name(const char *s, fp4d_finding_code *out);

/* One expert's share of a finding on a fused-expert tensor ([E, ...] on disk). */
typedef struct fp4d_expert_count {
    int64_t  expert;
    uint64_t count;
} fp4d_expert_count;

typedef struct fp4d_scan_finding {
    fp4d_finding_code  code;
    fp4d_scan_severity severity;
    const char        *tensor;      /* tensor concerned; NULL for a finding about a whole file */
    const char        *file;        /* shard (path relative to the checkpoint); NULL if none */
    int64_t            layer;       /* from "layers.<L>." in the name; -1 if none */
    int64_t            expert;      /* from "experts.<E>." in the name; -1 if none or fused */
    uint64_t           count;       /* what it counts depends on the code (docs/scan.md) */
    const char        *message;     /* one line for humans */
    const fp4d_expert_count *experts; /* per-expert split for fused-expert tensors, else NULL */
    size_t             num_experts;
} fp4d_scan_finding;

/* Progress callback: bytes read so far and in total. Called from the scanning thread
 * that drives the workers, about ten times a second. */
typedef void (*fp4d_scan_progress_fn)(void *user, uint64_t done_bytes, uint64_t total_bytes);

typedef struct fp4d_scan_options {
    bool                  scales_only; /* read only block-scale and global-scale tensors */
    int                   threads;     /* 0 = one per online CPU */
    fp4d_scan_progress_fn progress;    /* may be NULL */
    void                 *progress_user;
    int                   tensor_parallel; /* > 1: judge each quantized linear's shard at this
                                            * tensor-parallel degree (TP_SHARD); 0 or 1: none */
    bool                  verify_hashes;   /* sha256 of each file against its Hugging Face cache
                                            * blob name or a SHA256SUMS file (FILE_HASH_MISMATCH) */
} fp4d_scan_options;

/* Whether this build can hash files (verify_hashes needs OpenSSL's libcrypto). */
bool fp4d_scan_hashes_available(void);

typedef struct fp4d_scan_report fp4d_scan_report;

/*
 * Scans a checkpoint directory or a single .safetensors file. A broken checkpoint is not
 * an error of this function: it returns OK and the report holds the findings. Returns
 * NOT_FOUND / IO when the path cannot be read at all (missing, not a directory or
 * .safetensors file, no .safetensors files in it), NOMEM on allocation failure. A regular
 * file counts as a .safetensors file when it is named so or begins like one (8-byte header
 * length up to 100 MB, then '{'); anything else (a README, config.json, a GGUF or pickle
 * file) is IO, "not a safetensors file", since it is no checkpoint at all rather than a
 * damaged one.
 * Memory held stays bounded (a few buffers per thread) whatever the checkpoint size.
 */
fp4d_status fp4d_scan_path(const char *path, const fp4d_scan_options *opt, fp4d_scan_report **out);
void        fp4d_scan_report_free(fp4d_scan_report *r); /* NULL is a no-op */

size_t                   fp4d_scan_report_count(const fp4d_scan_report *r);
const fp4d_scan_finding *fp4d_scan_report_get(const fp4d_scan_report *r, size_t i);
/* Number of findings with severity >= s. */
size_t      fp4d_scan_report_count_at_least(const fp4d_scan_report *r, fp4d_scan_severity s);
/* "modelopt-nvfp4", "modelopt-mxfp4", "modelopt-mixed", "compressed-tensors-nvfp4",
 * "compressed-tensors-mxfp4", "gpt-oss-mxfp4", "unquantized". The ModelOpt ones all have
 * fp4d_ckpt_format FP4D_CKPT_MODELOPT_NVFP4: "modelopt-mxfp4" where every ModelOpt layer whose
 * format shows is MXFP4 (ue8m0 block scales, no weight_scale_2) or, where none shows, the config
 * names an MXFP4 algorithm (W4A8_MXFP4_FP8); "modelopt-mixed" for MIXED_PRECISION. */
const char *fp4d_scan_report_format(const fp4d_scan_report *r);
/* Most likely quantizer ("modelopt", "compressed-tensors", "trtllm-or-flashinfer",
 * "torchao", "unknown") from the zero-block scale byte and the global-scale convention. */
const char *fp4d_scan_report_writer(const fp4d_scan_report *r);
/* Writes the full report (findings, per-layer and per-expert counts, fingerprint) as
 * JSON text, schema FP4D_SCAN_SCHEMA_VERSION. *json is malloc'ed; free() it. */
fp4d_status fp4d_scan_report_json(const fp4d_scan_report *r, char **json);
/* Writes the human-readable report. color: ANSI colours. */
void        fp4d_scan_report_print(const fp4d_scan_report *r, FILE *f, bool color);

/* Which linear modules of a checkpoint are quantized, and how. Used by the scanner and
 * by replay; also fuzzed (fuzz/fuzz_quant_config.c). */
typedef enum fp4d_ckpt_format {
    FP4D_CKPT_UNQUANTIZED    = 0,
    FP4D_CKPT_MODELOPT_NVFP4 = 1, /* incl. MIXED_PRECISION and ModelOpt MXFP4 */
    FP4D_CKPT_CT_NVFP4       = 2,
    FP4D_CKPT_CT_MXFP4       = 3,
    FP4D_CKPT_GPTOSS_MXFP4   = 4,
    FP4D_CKPT_FORMAT_COUNT
} fp4d_ckpt_format;

typedef struct fp4d_quant_config fp4d_quant_config;

/*
 * Parses hf_quant_config.json text (source "hf_quant_config.json") or config.json text
 * (source "config.json", reads its "quantization_config"). Never reads past len; accepts
 * any bytes. Returns PARSE with fp4d_last_error() on malformed JSON; a config without a
 * quantization section yields FP4D_CKPT_UNQUANTIZED.
 */
fp4d_status fp4d_quant_config_parse(const char *text, size_t len, const char *source,
                                    fp4d_quant_config **out);
void        fp4d_quant_config_free(fp4d_quant_config *c); /* NULL is a no-op */
fp4d_ckpt_format fp4d_quant_config_format(const fp4d_quant_config *c);
bool        fp4d_quant_config_is_mixed(const fp4d_quant_config *c);
/* Whether the config says module (e.g. "model.layers.0.mlp.gate") stays unquantized:
 * exclude_modules / ignore / modules_to_not_convert (fnmatch wildcards, "re:" regexes),
 * or, for MIXED_PRECISION, not listed in quantized_layers. */
bool        fp4d_quant_config_is_excluded(const fp4d_quant_config *c, const char *module);

/* ---------------------------------------------------------------------------------------
 * Test-checkpoint generator (tests, bench, tools/gen-checkpoint)
 * ------------------------------------------------------------------------------------- */

/* Defects the generator can plant. Each names the finding the scanner must report. */
typedef enum fp4d_ckpt_defect {
    FP4D_DEFECT_SCALE_NAN,           /* count block-scale bytes -> 0x7F (ue8m0: 0xFF) */
    FP4D_DEFECT_SCALE_NEGATIVE,      /* count e4m3 block-scale bytes get the sign bit */
    FP4D_DEFECT_SCALE_ZERO,          /* count blocks with non-zero codes get scale 0x00 */
    FP4D_DEFECT_SCALE_OUTLIER,       /* count block scales -> smallest subnormal (0x01 / 2^-127+) */
    FP4D_DEFECT_GLOBAL_NAN,          /* a global/input scale -> NaN */
    FP4D_DEFECT_GLOBAL_ZERO,         /* a global/input scale -> 0 */
    FP4D_DEFECT_GLOBAL_RECIPROCAL,   /* a global/input scale -> its reciprocal (other convention) */
    FP4D_DEFECT_FUSED_MISMATCH,      /* a fused sibling's global/input scale x 2 */
    FP4D_DEFECT_NONFINITE,           /* count elements of an unquantized tensor -> NaN/Inf */
    FP4D_DEFECT_DROP_TENSOR,         /* tensor left out of the shards and the index */
    FP4D_DEFECT_ADD_ORPHAN,          /* an extra tensor named `tensor` (a scale with no weight) */
    FP4D_DEFECT_WRONG_DTYPE,         /* tensor stored with another dtype of the same size */
    FP4D_DEFECT_WRONG_SHAPE,         /* block-scale tensor with half its columns */
    FP4D_DEFECT_DUPLICATE,           /* tensor also written into a second shard */
    FP4D_DEFECT_INDEX_OMIT,          /* tensor left out of the index weight_map */
    FP4D_DEFECT_INDEX_WRONG_FILE,    /* index maps tensor to another shard */
    FP4D_DEFECT_DELETE_SHARD,        /* the shard holding tensor is not written */
    FP4D_DEFECT_TRUNCATE_SHARD,      /* the shard holding tensor is cut inside its data */
    FP4D_DEFECT_HEADER_GARBAGE,      /* the shard holding tensor gets invalid UTF-8 in its header */
    FP4D_DEFECT_HEADER_LENGTH,       /* the shard holding tensor gets a header length past EOF */
    FP4D_DEFECT_EXCLUDE_QUANTIZED,   /* module of tensor added to the exclude list */
    FP4D_DEFECT_UNQUANTIZE,          /* module of tensor stored bf16 (no scales), not excluded */
    FP4D_DEFECT_COUNT
} fp4d_ckpt_defect;

const char *fp4d_ckpt_defect_name(fp4d_ckpt_defect d); /* "scale-nan", ... */
bool        fp4d_ckpt_defect_from_name(const char *s, fp4d_ckpt_defect *out);

typedef struct fp4d_ckpt_plant {
    fp4d_ckpt_defect defect;
    const char      *tensor; /* full tensor name the defect is planted in */
    uint64_t         count;  /* elements / bytes / blocks where that applies; 0 = 1 */
} fp4d_ckpt_plant;

typedef struct fp4d_ckpt_gen_params {
    fp4d_ckpt_format format;     /* UNQUANTIZED writes a plain bf16 checkpoint */
    int32_t  layers;             /* default 2 */
    int32_t  hidden;             /* K of the attention projections; multiple of 32; default 64 */
    int32_t  head_dim;           /* > 0: config.json gives head_dim and num_attention_heads = hidden /
                                    head_dim (q_proj and o_proj), num_key_value_heads = hidden / 2 /
                                    head_dim (k_proj and v_proj); must divide hidden / 2. 0 (default):
                                    no head counts */
    int32_t  intermediate;       /* multiple of 32; default 128 */
    int32_t  experts;            /* 0 = dense MLP; gpt-oss needs >= 1 (default 4 there) */
    int32_t  shards;             /* default 2; 1 still writes an index */
    uint64_t seed;
    int32_t  zero_block_byte;    /* -1 = the writer's own (MO 0x38, CT 0x30, gpt-oss 0x00) */
    double   zero_block_fraction; /* share of all-zero blocks per quantized tensor (0..0.5) */
    bool     random_fill;        /* bench: random codes and plausible scales, no quantizing;
                                    lets multi-GB checkpoints be written quickly */
    const fp4d_ckpt_plant *plants;
    size_t   num_plants;
} fp4d_ckpt_gen_params;

/* Fills p with the defaults above for a format. */
void        fp4d_ckpt_gen_defaults(fp4d_ckpt_gen_params *p, fp4d_ckpt_format format);
/* Writes the checkpoint into dir (created if missing; files in it are overwritten).
 * Returns INVALID_ARG when a plant names a tensor the checkpoint does not have. Sizes are
 * checked before anything is written: INVALID_ARG when a tensor or the whole checkpoint
 * would exceed 2^63 bytes, when it would have more than 1,000,000 tensors, or when a
 * quantized (not random_fill) checkpoint would take more than half of physical memory; IO
 * when it is larger than the space free where dir is. */
fp4d_status fp4d_ckpt_generate(const char *dir, const fp4d_ckpt_gen_params *p);

#ifdef __cplusplus
}
#endif
#endif
