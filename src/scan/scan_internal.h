/* Internal to src/scan/: the forgiving header reader, name helpers, config accessors. */
#ifndef FP4D_SCAN_INTERNAL_H
#define FP4D_SCAN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fp4doctor/io.h"
#include "fp4doctor/scan.h"

/* ---- scan.c: the shard index, as scan and replay both read it (docs/scan.md, "Shards") ---- */
#define SCAN_INDEX_NAME "model.safetensors.index.json"

typedef enum scan_index_state {
    SCAN_INDEX_ABSENT,     /* no such file: every .safetensors file of the folder is read */
    SCAN_INDEX_VALID,      /* *weight_map is the index's weight_map */
    SCAN_INDEX_UNREADABLE, /* there but cannot be read (no permission, a link loop, a directory, ...) */
    SCAN_INDEX_INVALID,    /* read, but not JSON, or no "weight_map" of plain shard file names */
} scan_index_state;

/* Reads dir/model.safetensors.index.json. A usable index is a regular file of at most 256 MiB
 * holding an object whose "weight_map" maps each tensor to a plain file name inside dir ("..",
 * absolute and empty names would lead outside the folder or nowhere: never followed). On
 * SCAN_INDEX_VALID *weight_map is set (the caller json_decref()s it); otherwise it is NULL and,
 * for UNREADABLE and INVALID, why says what is wrong (the strerror text, "not a regular file",
 * the JSON parser's message, ...). Fails (NOMEM) only on a limit of this process: out of memory
 * or descriptors. */
fp4d_status scan_index_load(const char *dir, scan_index_state *state, json_t **weight_map, char *why,
                            size_t why_len);

/* ---- quant_config.c ---- */
bool        scan_qc_format_known(const fp4d_quant_config *c);
bool        scan_qc_input_scales(const fp4d_quant_config *c);
bool        scan_qc_is_mx(const fp4d_quant_config *c);
const char *scan_qc_algo(const fp4d_quant_config *c);

/* ---- header.c: a forgiving safetensors header reader ----
 * The strict reader (io.h) says whether a file is valid. When it is not, the scanner still
 * wants the tensor names (so one bad shard does not turn into hundreds of "missing"
 * findings elsewhere) and the name of the tensor that broke the rule. */
typedef struct scan_hdr_entry {
    char         *name;
    bool          dtype_known;
    fp4d_st_dtype dtype;
    int32_t       ndim;
    int64_t       shape[FP4D_ST_MAX_DIMS];
    uint64_t      begin, end;
    bool          entry_ok;   /* dtype, shape, offsets and byte size consistent on its own */
} scan_hdr_entry;

typedef struct scan_hdr {
    scan_hdr_entry *entries;
    size_t          count;
    bool            parsed;           /* JSON parsed into entries */
    bool            object_complete;  /* a whole top-level JSON object lies in the bytes given */
    const char     *first_bad;        /* entry breaking a rule, if any (points into entries) */
    char          **dup_names;        /* top-level keys seen more than once */
    uint64_t       *dup_counts;
    size_t          num_dups;
} scan_hdr;

/* hdr: the header bytes available (may be cut short); data_len: bytes of the file after the
 * header (for the truncation rule). Never reads past hdr_len. Returns NOMEM only. */
fp4d_status scan_hdr_parse(const uint8_t *hdr, size_t hdr_len, uint64_t data_len, scan_hdr *out);
void        scan_hdr_free(scan_hdr *h);

/* ---- names ---- */
/* Layer and expert numbers from "layers.<L>." / "h.<L>." / "block.<L>." and "experts.<E>.";
 * -1 when absent. */
int64_t scan_name_layer(const char *name);
int64_t scan_name_expert(const char *name);

/* The module a tensor belongs to: name without its quantization suffix (".weight",
 * ".weight_packed", ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_global_scale",
 * ".input_global_scale", "_blocks", "_scales"), or the whole name when it has none.
 * Returns a malloc'd string the caller frees, or NULL when out of memory. */
char *scan_name_module(const char *name);
/* The last component of a module name: "model.layers.0.mlp.down_proj" -> "down_proj". */
const char *scan_name_leaf(const char *module);

/* ---- tensor parallelism (names.c) ----
 * How engines shard a linear at TP degree tp: down_proj, o_proj, out_proj, dense_4h_to_h, w2,
 * wo and fc2 are row-parallel (split along K: their input is the sharded activation); every
 * other linear is column-parallel (split along its output rows N). module: the module name
 * (its last component decides). */
bool scan_tp_row_parallel(const char *module);

typedef enum scan_tp_problem {
    SCAN_TP_OK,
    SCAN_TP_UNEVEN,        /* the split dimension is not a multiple of tp: engines refuse it */
    SCAN_TP_HEADS,         /* an attention head count tp cannot share out: engines refuse it */
    SCAN_TP_SPLIT_BLOCK,   /* K / tp splits a scale block between two ranks: engines refuse it */
    SCAN_TP_PADDED_SCALES, /* NVFP4 K / tp not a multiple of 32: each rank's scale rows end in a
                            * padded column (vLLM #48898); runs, but some kernels misread it */
} scan_tp_problem;

/* What SCAN_TP_PADDED_SCALES does, in the words scan's TP_SHARD warning and replay's note share. */
#define SCAN_TP_PADDED_SCALES_WHY                                                                   \
    "block-scale rows end in a padded column; FlashInfer's CUTLASS and cuDNN NVFP4 linear kernels " \
    "read stale memory there under torch.compile (vLLM #48898: garbage at TP 8, Marlin correct)"

/* A small text file (a config, the index): read, absent, or there but unreadable. */
typedef enum small_file_state { SMALL_FILE_READ, SMALL_FILE_ABSENT, SMALL_FILE_UNREADABLE } small_file_state;

/* Reads a small text file whole (configs, the index) into *text (NUL-terminated; the caller
 * frees). Only "nothing is there" (ENOENT, ENOTDIR) counts as absent; a file that is there but
 * cannot be read - no permission, a symbolic-link loop or a link to a missing file, a
 * directory, a FIFO (never waited on), a read error, more than 256 MiB - is
 * SMALL_FILE_UNREADABLE with the reason in why: taking it for absent made a scan with an
 * unreadable index list the folder without a word, and report every stale shard's tensors as
 * duplicates. Fails (NOMEM) only on a limit of this process: out of memory or descriptors. */
fp4d_status scan_read_small_file(const char *path, char **text, size_t *len_out, small_file_state *state, char *why,
                                 size_t why_len);

/* The attention heads config.json gives (0: not given). Engines cut q_proj, k_proj, v_proj and
 * o_proj by whole heads, so the head counts, not the row counts, say which TP degrees load. */
typedef struct scan_heads {
    int64_t q, kv, head_dim; /* num_attention_heads, num_key_value_heads, head_dim (each < 2^24) */
} scan_heads;

/* From config.json text (or the text_config / llm_config / language_config inside it, for
 * multimodal models); false, *h zeroed, when it gives no head count. head_dim defaults to
 * hidden_size / num_attention_heads, num_key_value_heads to num_attention_heads. A count of
 * 2^24 or more is taken as not given (no real model has one, and products of such numbers
 * would overflow). */
bool scan_heads_parse(const char *text, size_t len, scan_heads *h);
/* The same from dir/config.json, read as scan reads it (regular files only, never waiting on
 * a FIFO). false when it gives no head count; *why then says why when config.json is there but
 * cannot be read or parsed (empty when it is absent or simply has no heads). NOMEM only on a
 * limit of this process. */
fp4d_status scan_heads_load(const char *dir, scan_heads *h, bool *found, char *why, size_t why_len);

/* How one rank's shard of an n x k matrix of `block`-element scale blocks is cut at TP degree
 * tp. Attention projections whose shape matches the heads (h may be NULL) are cut by head, as
 * vLLM's QKVParallelLinear does: num_attention_heads must be a multiple of tp; with fewer KV
 * heads than ranks, tp must be a multiple of num_key_value_heads and each rank holds one whole
 * KV head, replicated on tp / num_key_value_heads ranks (rank r holds head r / replicas). A
 * projection whose shape does not match (a vision tower's, MLA's) is cut by rows. A fused
 * projection is cut part by part, as vLLM cuts it: a qkv_proj ([q | k | v] rows) that matches
 * the heads into each part's heads, a dense gate_up_proj ([gate | up] rows, two halves) into
 * each half's N / 2 / tp rows. */
typedef struct scan_tp_part {
    const char *name;     /* "q", "k", "v", "gate", "up" */
    int64_t     all;      /* the part's rows in the whole matrix */
    int64_t     per_rank; /* a rank's rows of it */
    int         replicas; /* ranks holding the same rows of it: rank r holds slice r / replicas */
} scan_tp_part;

typedef struct scan_tp_cut {
    scan_tp_problem problem;
    bool            split_k;  /* K is split (row-parallel), else N */
    int64_t         dim;      /* the split dimension, whole */
    int64_t         per_rank; /* its length on one rank (when problem is OK or PADDED_SCALES) */
    int             replicas; /* ranks that hold the same slice: rank r holds slice r / replicas */
    int             num_parts; /* a fused projection cut part by part (0: one contiguous slice) */
    scan_tp_part    parts[3];  /* ... in row order; a rank's shard is its rows of each, in turn */
    bool            by_heads;  /* the cut follows config.json's heads */
    int64_t         heads;    /* SCAN_TP_HEADS: the head count tp cannot share out ... */
    bool            kv_heads; /* ... and whether it is num_key_value_heads */
} scan_tp_cut;

scan_tp_cut scan_tp_plan(const char *module, int64_t n, int64_t k, int64_t block, bool is_mx, const scan_heads *h,
                         int tp);
/* Why a fused gate_up_proj's cut is SCAN_TP_UNEVEN, for printf with the half's rows (long
 * long) and tp (int). */
#define SCAN_TP_GATE_UP_UNEVEN                                                                    \
    "a fused gate_up_proj, whose gate and up halves of %lld rows each cannot be split evenly "    \
    "between %d tensor-parallel ranks (each rank takes its share of both halves)"

/* The row of the whole matrix that row r of rank's shard is, for an N-split cut (a K-split
 * keeps every row). */
int64_t scan_tp_source_row(const scan_tp_cut *cut, int rank, int64_t r);
/* Why a SCAN_TP_HEADS cut of module is refused, in the words scan's TP_SHARD error and replay
 * share; returns out. */
const char *scan_tp_heads_why(const scan_tp_cut *cut, const char *module, int tp, char *out, size_t size);

/* digest.c: SHA-256 of the first `size` bytes of fd (pread: the file position is untouched) as
 * 64 lowercase hex digits in hex; false with the reason in why where it cannot be read or this
 * build has no libcrypto (scan_hashes_available). */
bool scan_hashes_available(void);
bool scan_sha256_fd(int fd, uint64_t size, char hex[65], char *why, size_t why_len);

#endif
