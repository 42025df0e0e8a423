/*
 * ckpt_gen.c - writes tiny (or, for the benchmark, multi-GB) Hugging Face checkpoints in each
 * FP4 format, clean or with chosen defects planted (scan.h). Test checkpoints are generated,
 * never committed.
 *
 * It writes safetensors itself instead of using io.h's writer: the benchmark's checkpoints
 * are larger than memory allows holding at once (data is produced while writing), and
 * several planted defects are malformed files no proper writer would produce.
 *
 * Weights are Gaussian (sigma 0.02, some blocks all zero) quantized the way each writer does
 * (spec §4.5 ModelOpt, §4.7 compressed-tensors, §3.4 ceil-pow2 MXFP4), with the writer's
 * zero-block scale byte and fused q/k/v and gate/up sharing one global and one input scale.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <jansson.h>

#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"
#include "fp4doctor/scan.h"
#include "internal.h"
#include "scan/scan_internal.h"

/* ---- defect names ------------------------------------------------------------------------ */

static const char *const defect_names[FP4D_DEFECT_COUNT] = {
    [FP4D_DEFECT_SCALE_NAN] = "scale-nan",
    [FP4D_DEFECT_SCALE_NEGATIVE] = "scale-negative",
    [FP4D_DEFECT_SCALE_ZERO] = "scale-zero",
    [FP4D_DEFECT_SCALE_OUTLIER] = "scale-outlier",
    [FP4D_DEFECT_GLOBAL_NAN] = "global-nan",
    [FP4D_DEFECT_GLOBAL_ZERO] = "global-zero",
    [FP4D_DEFECT_GLOBAL_RECIPROCAL] = "global-reciprocal",
    [FP4D_DEFECT_FUSED_MISMATCH] = "fused-mismatch",
    [FP4D_DEFECT_NONFINITE] = "nonfinite",
    [FP4D_DEFECT_DROP_TENSOR] = "drop-tensor",
    [FP4D_DEFECT_ADD_ORPHAN] = "add-orphan",
    [FP4D_DEFECT_WRONG_DTYPE] = "wrong-dtype",
    [FP4D_DEFECT_WRONG_SHAPE] = "wrong-shape",
    [FP4D_DEFECT_DUPLICATE] = "duplicate",
    [FP4D_DEFECT_INDEX_OMIT] = "index-omit",
    [FP4D_DEFECT_INDEX_WRONG_FILE] = "index-wrong-file",
    [FP4D_DEFECT_DELETE_SHARD] = "delete-shard",
    [FP4D_DEFECT_TRUNCATE_SHARD] = "truncate-shard",
    [FP4D_DEFECT_HEADER_GARBAGE] = "header-garbage",
    [FP4D_DEFECT_HEADER_LENGTH] = "header-length",
    [FP4D_DEFECT_EXCLUDE_QUANTIZED] = "exclude-quantized",
    [FP4D_DEFECT_UNQUANTIZE] = "unquantize",
};

const char *fp4d_ckpt_defect_name(fp4d_ckpt_defect d)
{
    return (unsigned)d < FP4D_DEFECT_COUNT ? defect_names[d] : "unknown";
}

bool fp4d_ckpt_defect_from_name(const char *s, fp4d_ckpt_defect *out)
{
    for (int i = 0; s && i < FP4D_DEFECT_COUNT; i++)
        if (!strcmp(s, defect_names[i])) {
            *out = (fp4d_ckpt_defect)i;
            return true;
        }
    return false;
}

/* ---- the plan: tensors, shards, configs ---------------------------------------------------- */

typedef enum gen_fill { FILL_DATA, FILL_RANDOM_CODES, FILL_RANDOM_NVSCALES, FILL_RANDOM_MXSCALES, FILL_RANDOM_BF16 } gen_fill;

typedef struct gen_tensor {
    char         *name;
    fp4d_st_dtype dtype;
    int32_t       ndim;
    int64_t       shape[4];
    uint8_t      *data;       /* FILL_DATA */
    uint64_t      nbytes;
    gen_fill      fill;
    uint64_t      seed;
    int32_t       shard;
    int32_t       dup_shard;  /* also written here (-1: no) */
    int32_t       index_shard; /* what the index says (-1: omitted) */
    bool          dropped;
} gen_tensor;

typedef struct gen_plan {
    const fp4d_ckpt_gen_params *p;
    gen_tensor *t;
    size_t      n, cap;
    uint64_t    rng;
    json_t     *config;        /* config.json */
    json_t     *hf_quant;      /* hf_quant_config.json or NULL */
    json_t     *exclude_lists[2]; /* arrays to append exclusions to (borrowed) */
    bool       *shard_deleted;
    uint64_t   *shard_cut;     /* truncate to this many bytes (0: no) */
    char      **shard_cut_tensor;
    int32_t    *shard_header_defect; /* 0 none, 1 garbage, 2 length */
    bool        sizing;        /* plan shapes only: no data, no quantizing (fp4d_ckpt_generate) */
    uint64_t    total_bytes;   /* bytes of tensor data planned */
    const char *too_big;       /* first tensor whose size overflows what a file can hold */
} gen_plan;

/* No tensor data is produced while planning: random-fill fills while writing, and the sizing
 * pass only adds up bytes. */
static bool plan_no_data(const gen_plan *g) { return g->p->random_fill || g->sizing; }

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static double rng_uniform(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) * 0x1p-53; }

static float rng_gauss(uint64_t *s, float sigma)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    return (float)(sigma * sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v));
}

static gen_tensor *plan_add(gen_plan *g, const char *name, fp4d_st_dtype dt, int32_t ndim, const int64_t *shape,
                            int32_t shard)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 128;
        gen_tensor *t = realloc(g->t, cap * sizeof *t);
        if (!t) return NULL;
        g->t = t;
        g->cap = cap;
    }
    gen_tensor *t = &g->t[g->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    /* Sizes past 2^63 bytes cannot be offsets in a file (or a safetensors header): they are
     * refused before anything is written, rather than wrapped into a corrupt file. */
    uint64_t elems = 1, bits = 0;
    bool over = false;
    for (int32_t i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        over |= __builtin_mul_overflow(elems, (uint64_t)shape[i], &elems);
    }
    over |= __builtin_mul_overflow(elems, (uint64_t)fp4d_st_dtype_bits(dt), &bits);
    t->nbytes = bits / 8;
    over |= t->nbytes > (uint64_t)INT64_MAX || __builtin_add_overflow(g->total_bytes, t->nbytes, &g->total_bytes) ||
            g->total_bytes > (uint64_t)INT64_MAX;
    if (over) {
        if (!g->too_big) g->too_big = t->name; /* owned by the table; kept until it is freed */
        g->n++;
        return NULL;
    }
    t->shard = shard;
    t->dup_shard = -1;
    t->index_shard = shard;
    t->seed = rng_next(&g->rng);
    if (!plan_no_data(g)) {
        t->data = calloc(t->nbytes ? t->nbytes : 1, 1);
        if (!t->data) return NULL;
    }
    g->n++;
    return t;
}

static gen_tensor *plan_find(gen_plan *g, const char *name)
{
    for (size_t i = 0; i < g->n; i++)
        if (!strcmp(g->t[i].name, name) && !g->t[i].dropped) return &g->t[i];
    return NULL;
}

static void put_bf16(uint8_t *p, float v)
{
    uint16_t h = fp4d_bf16_from_f32(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void put_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }

/* An unquantized bf16 tensor of small Gaussian values (norm weights near 1). */
static int add_bf16(gen_plan *g, const char *name, int32_t ndim, const int64_t *shape, int32_t shard, float mean)
{
    gen_tensor *t = plan_add(g, name, FP4D_ST_BF16, ndim, shape, shard);
    if (!t) return -1;
    if (!t->data) {
        t->fill = FILL_RANDOM_BF16;
        return 0;
    }
    for (uint64_t i = 0; i < t->nbytes / 2; i++) put_bf16(t->data + 2 * i, mean + rng_gauss(&g->rng, 0.02f));
    return 0;
}

/* ---- quantization, per writer ----------------------------------------------------------------- */

typedef enum gen_writer { W_MODELOPT, W_CT_NV, W_CT_MX, W_GPTOSS } gen_writer;

static int zero_byte_of(const fp4d_ckpt_gen_params *p, gen_writer w)
{
    if (p->zero_block_byte >= 0) return p->zero_block_byte & 0xFF;
    return w == W_MODELOPT ? 0x38 : w == W_CT_NV ? 0x30 : 0x00;
}

/* NVFP4 of a row-major [rows, K] matrix: codes [rows, K/2], e4m3 scales [rows, K/16].
 * decode_scale = amax/2688 (ModelOpt's weight_scale_2; compressed-tensors stores 1/it). */
static void quantize_nvfp4(const float *w, int64_t rows, int64_t K, float decode_scale, int zero_byte, bool ct,
                           uint8_t *codes, uint8_t *scales)
{
    float gs = 1.0f / decode_scale;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < K / 16; b++) {
            const float *x = w + r * K + b * 16;
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[i]));
            uint8_t sf;
            if (amax == 0) sf = (uint8_t)zero_byte;
            else if (ct) sf = fp4d_e4m3_from_f32(gs * (amax / 6.0f), FP4D_SATFINITE);
            else sf = fp4d_e4m3_from_f32(amax / (6.0f * decode_scale), FP4D_SATFINITE);
            scales[r * (K / 16) + b] = sf;
            float denom = fp4d_e4m3_to_f32(sf) * decode_scale;
            for (int i = 0; i < 16; i += 2) {
                uint8_t lo = amax == 0 ? 0 : fp4d_e2m1_from_f32(x[i] / denom);
                uint8_t hi = amax == 0 ? 0 : fp4d_e2m1_from_f32(x[i + 1] / denom);
                codes[r * (K / 2) + b * 8 + i / 2] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            }
        }
}

/* MXFP4: ceil-pow2 ue8m0 scale of amax/6 (spec §3.4), 32-element blocks. */
static void quantize_mxfp4(const float *w, int64_t rows, int64_t K, int zero_byte, uint8_t *codes, uint8_t *scales)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < K / 32; b++) {
            const float *x = w + r * K + b * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            int S = zero_byte;
            if (amax > 0) {
                S = (int)ceil(log2((double)amax / 6.0)) + 127;
                if (S < 1) S = 1;
                if (S > 254) S = 254;
            }
            scales[r * (K / 32) + b] = (uint8_t)S;
            float denom = ldexpf(1.0f, S - 127);
            for (int i = 0; i < 32; i += 2) {
                uint8_t lo = amax == 0 ? 0 : fp4d_e2m1_from_f32(x[i] / denom);
                uint8_t hi = amax == 0 ? 0 : fp4d_e2m1_from_f32(x[i + 1] / denom);
                codes[r * (K / 2) + b * 16 + i / 2] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            }
        }
}

static float *gauss_matrix(gen_plan *g, int64_t rows, int64_t K, int block, float *amax_io)
{
    float *w = malloc((size_t)(rows * K) * sizeof *w);
    if (!w) return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < K / block; b++) {
            bool zero = rng_uniform(&g->rng) < g->p->zero_block_fraction;
            for (int i = 0; i < block; i++) {
                float v = zero ? 0.0f : rng_gauss(&g->rng, 0.02f);
                w[r * K + b * block + i] = v;
                *amax_io = fmaxf(*amax_io, fabsf(v));
            }
        }
    return w;
}

static int32_t shard_of_layer(const fp4d_ckpt_gen_params *p, int32_t layer)
{
    return (int32_t)((int64_t)layer * p->shards / (p->layers > 0 ? p->layers : 1));
}

/* A fusion group (or a single linear) of one writer: members share the global and input
 * scales, as ModelOpt's preprocess_linear_fusion and llm-compressor do. */
static int add_linear_group(gen_plan *g, gen_writer wr, const char *parent, const char *const *leaves,
                            const int64_t *outs, int n, int64_t K, int32_t shard)
{
    const fp4d_ckpt_gen_params *p = g->p;
    bool mx = wr == W_CT_MX;
    int block = mx ? 32 : 16;
    float amax = 0;
    float *w[3] = {0};
    if (!plan_no_data(g))
        for (int i = 0; i < n; i++)
            if (!(w[i] = gauss_matrix(g, outs[i], K, block, &amax))) return -1;
    if (amax == 0) amax = 1.0f;
    float decode = amax / 2688.0f, input_decode = 4.0f / 2688.0f; /* activations of amax 4 */
    int rc = 0;
    char name[512];
    for (int i = 0; i < n && !rc; i++) {
        const char *packed_sfx = wr == W_MODELOPT ? "weight" : "weight_packed";
        int64_t shp[2] = {outs[i], K / 2}, sshp[2] = {outs[i], K / block}, one[1] = {1};
        snprintf(name, sizeof name, "%s.%s.%s", parent, leaves[i], packed_sfx);
        /* plan_add may move the table: take pointers only after both adds. */
        gen_tensor *codes = plan_add(g, name, FP4D_ST_U8, 2, shp, shard);
        snprintf(name, sizeof name, "%s.%s.weight_scale", parent, leaves[i]);
        gen_tensor *scales = codes ? plan_add(g, name, mx ? FP4D_ST_U8 : FP4D_ST_F8_E4M3, 2, sshp, shard) : NULL;
        if (!scales) {
            rc = -1;
            break;
        }
        codes = scales - 1;
        if (plan_no_data(g)) {
            codes->fill = FILL_RANDOM_CODES;
            scales->fill = mx ? FILL_RANDOM_MXSCALES : FILL_RANDOM_NVSCALES;
        } else if (mx) {
            quantize_mxfp4(w[i], outs[i], K, zero_byte_of(p, wr), codes->data, scales->data);
        } else {
            quantize_nvfp4(w[i], outs[i], K, decode, zero_byte_of(p, wr), wr == W_CT_NV, codes->data, scales->data);
        }
        if (mx) continue;
        gen_tensor *gsc, *isc;
        if (wr == W_MODELOPT) {
            snprintf(name, sizeof name, "%s.%s.weight_scale_2", parent, leaves[i]);
            gsc = plan_add(g, name, FP4D_ST_F32, 0, one, shard);
            snprintf(name, sizeof name, "%s.%s.input_scale", parent, leaves[i]);
            isc = gsc ? plan_add(g, name, FP4D_ST_F32, 0, one, shard) : NULL;
            gsc = isc ? isc - 1 : NULL;
        } else {
            snprintf(name, sizeof name, "%s.%s.weight_global_scale", parent, leaves[i]);
            gsc = plan_add(g, name, FP4D_ST_F32, 1, one, shard);
            snprintf(name, sizeof name, "%s.%s.input_global_scale", parent, leaves[i]);
            isc = gsc ? plan_add(g, name, FP4D_ST_F32, 1, one, shard) : NULL;
            gsc = isc ? isc - 1 : NULL;
        }
        if (!isc) {
            rc = -1;
            break;
        }
        /* Small tensors always carry real bytes, even in random-fill mode. */
        if (!gsc->data && !(gsc->data = calloc(4, 1))) rc = -1;
        if (!isc->data && !(isc->data = calloc(4, 1))) rc = -1;
        if (rc) break;
        gsc->fill = isc->fill = FILL_DATA;
        put_f32(gsc->data, wr == W_MODELOPT ? decode : 1.0f / decode);
        put_f32(isc->data, wr == W_MODELOPT ? input_decode : 1.0f / input_decode);
    }
    for (int i = 0; i < n; i++) free(w[i]);
    return rc;
}

/* gpt-oss fused experts: X_blocks [E, out, K/32, 16], X_scales [E, out, K/32], X_bias [E, out]. */
static int add_gptoss_experts(gen_plan *g, const char *prefix, int64_t E, int64_t out, int64_t K, int32_t shard)
{
    char name[512];
    int64_t bshape[4] = {E, out, K / 32, 16}, sshape[3] = {E, out, K / 32}, bias[2] = {E, out};
    snprintf(name, sizeof name, "%s_blocks", prefix);
    gen_tensor *blocks = plan_add(g, name, FP4D_ST_U8, 4, bshape, shard);
    snprintf(name, sizeof name, "%s_scales", prefix);
    gen_tensor *scales = blocks ? plan_add(g, name, FP4D_ST_U8, 3, sshape, shard) : NULL;
    if (!scales) return -1;
    blocks = scales - 1; /* plan_add may have moved the table */
    if (plan_no_data(g)) {
        blocks->fill = FILL_RANDOM_CODES;
        scales->fill = FILL_RANDOM_MXSCALES;
    } else {
        for (int64_t e = 0; e < E; e++) {
            float amax = 0;
            float *w = gauss_matrix(g, out, K, 32, &amax);
            if (!w) return -1;
            quantize_mxfp4(w, out, K, zero_byte_of(g->p, W_GPTOSS), blocks->data + e * out * K / 2,
                           scales->data + e * out * K / 32);
            free(w);
        }
    }
    snprintf(name, sizeof name, "%s_bias", prefix);
    return add_bf16(g, name, 2, bias, shard, 0.0f);
}

/* ---- configs ------------------------------------------------------------------------------- */

static json_t *model_config(const fp4d_ckpt_gen_params *p, const char *arch)
{
    json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:s}", "architectures", arch, "model_type",
                          "fp4doctor-gen", "hidden_size", p->hidden, "intermediate_size", p->intermediate,
                          "num_hidden_layers", p->layers, "num_local_experts", p->experts, "vocab_size", 32,
                          "torch_dtype", "bfloat16");
    /* the heads the attention shapes hold: q_proj is [hidden, hidden], k_proj and v_proj
     * [hidden / 2, hidden] */
    if (c && p->head_dim > 0 &&
        (json_object_set_new(c, "head_dim", json_integer(p->head_dim)) ||
         json_object_set_new(c, "num_attention_heads", json_integer(p->hidden / p->head_dim)) ||
         json_object_set_new(c, "num_key_value_heads", json_integer(p->hidden / 2 / p->head_dim)))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

static int build_configs(gen_plan *g)
{
    const fp4d_ckpt_gen_params *p = g->p;
    switch (p->format) {
    case FP4D_CKPT_MODELOPT_NVFP4: {
        g->config = model_config(p, "LlamaForCausalLM");
        json_t *excl = json_pack("[s, s]", "lm_head", "model.layers.*.mlp.gate");
        g->hf_quant = json_pack("{s:{s:s, s:s}, s:{s:s, s:n, s:i, s:O}}", "producer", "name", "modelopt", "version",
                                "0.0.0+fp4doctor-gen", "quantization", "quant_algo", "NVFP4", "kv_cache_quant_algo",
                                "group_size", 16, "exclude_modules", excl);
        json_t *qc = json_pack("{s:{s:{s:{s:b, s:i, s:s, s:i}, s:{s:b, s:i, s:s, s:i}, s:[s]}}, s:O, s:s, s:s}",
                               "config_groups", "group_0", "input_activations", "dynamic", 0, "num_bits", 4, "type",
                               "float", "group_size", 16, "weights", "dynamic", 0, "num_bits", 4, "type", "float",
                               "group_size", 16, "targets", "Linear", "ignore", excl, "quant_algo", "NVFP4",
                               "quant_method", "modelopt");
        if (!g->config || !g->hf_quant || !qc || !excl) return -1;
        json_object_set_new(g->config, "quantization_config", qc);
        /* The same list object is shared, so a planted exclusion lands in both files. */
        g->exclude_lists[0] = excl;
        json_decref(excl);
        return 0;
    }
    case FP4D_CKPT_CT_NVFP4:
    case FP4D_CKPT_CT_MXFP4: {
        bool nv = p->format == FP4D_CKPT_CT_NVFP4;
        const char *fmt = nv ? "nvfp4-pack-quantized" : "mxfp4-pack-quantized";
        g->config = model_config(p, "LlamaForCausalLM");
        json_t *ignore = json_pack("[s, s]", "lm_head", "re:.*mlp.gate$");
        json_t *weights = json_pack("{s:i, s:s, s:s, s:i, s:b, s:b}", "num_bits", 4, "type", "float", "strategy",
                                    nv ? "tensor_group" : "group", "group_size", nv ? 16 : 32, "symmetric", 1,
                                    "dynamic", 0);
        json_t *group = json_pack("{s:[s], s:o, s:s}", "targets", "Linear", "weights", weights, "format", fmt);
        if (nv)
            json_object_set_new(group, "input_activations",
                                json_pack("{s:i, s:s, s:s, s:i, s:b, s:s}", "num_bits", 4, "type", "float", "strategy",
                                          "tensor_group", "group_size", 16, "symmetric", 1, "dynamic", "local"));
        json_t *qc = json_pack("{s:s, s:s, s:s, s:{s:o}, s:O, s:n}", "quant_method", "compressed-tensors", "format",
                               fmt, "quantization_status", "compressed", "config_groups", "group_0", group, "ignore",
                               ignore, "kv_cache_scheme");
        if (!g->config || !qc || !ignore) return -1;
        json_object_set_new(g->config, "quantization_config", qc);
        g->exclude_lists[0] = ignore;
        json_decref(ignore);
        return 0;
    }
    case FP4D_CKPT_GPTOSS_MXFP4: {
        g->config = model_config(p, "GptOssForCausalLM");
        json_t *skip = json_pack("[s, s, s, s]", "model.layers.*.self_attn", "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head");
        json_t *qc = json_pack("{s:s, s:O}", "quant_method", "mxfp4", "modules_to_not_convert", skip);
        if (!g->config || !qc || !skip) return -1;
        json_object_set_new(g->config, "quantization_config", qc);
        g->exclude_lists[0] = skip;
        json_decref(skip);
        return 0;
    }
    default:
        g->config = model_config(p, "LlamaForCausalLM");
        return g->config ? 0 : -1;
    }
}

/* ---- the model ------------------------------------------------------------------------------- */

static int build_model(gen_plan *g)
{
    const fp4d_ckpt_gen_params *p = g->p;
    int64_t H = p->hidden, I = p->intermediate, V = 32, E = p->experts;
    int32_t last = p->shards - 1;
    char name[512], parent[256];
    int64_t emb[2] = {V, H}, vec[1] = {H};
    if (add_bf16(g, "model.embed_tokens.weight", 2, emb, 0, 0.0f)) return -1;
    gen_writer wr = p->format == FP4D_CKPT_MODELOPT_NVFP4 ? W_MODELOPT
                  : p->format == FP4D_CKPT_CT_NVFP4       ? W_CT_NV
                  : p->format == FP4D_CKPT_CT_MXFP4       ? W_CT_MX : W_GPTOSS;
    for (int32_t L = 0; L < p->layers; L++) {
        int32_t s = shard_of_layer(p, L);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", L);
        if (add_bf16(g, name, 1, vec, s, 1.0f)) return -1;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", L);
        if (add_bf16(g, name, 1, vec, s, 1.0f)) return -1;
        static const char *const qkv[] = {"q_proj", "k_proj", "v_proj"}, *const o[] = {"o_proj"},
                                 *const gu[] = {"gate_proj", "up_proj"}, *const dn[] = {"down_proj"};
        int64_t qkv_out[3] = {H, H / 2, H / 2}, h_out[1] = {H}, gu_out[2] = {I, I};
        snprintf(parent, sizeof parent, "model.layers.%d.self_attn", L);
        if (p->format == FP4D_CKPT_UNQUANTIZED || p->format == FP4D_CKPT_GPTOSS_MXFP4) {
            for (int i = 0; i < 4; i++) {
                const char *leaf = i < 3 ? qkv[i] : "o_proj";
                int64_t shp[2] = {i < 3 ? qkv_out[i] : H, H};
                snprintf(name, sizeof name, "%s.%s.weight", parent, leaf);
                if (add_bf16(g, name, 2, shp, s, 0.0f)) return -1;
                if (p->format == FP4D_CKPT_GPTOSS_MXFP4) {
                    snprintf(name, sizeof name, "%s.%s.bias", parent, leaf);
                    if (add_bf16(g, name, 1, shp, s, 0.0f)) return -1;
                }
            }
        } else {
            if (add_linear_group(g, wr, parent, qkv, qkv_out, 3, H, s)) return -1;
            if (add_linear_group(g, wr, parent, o, h_out, 1, H, s)) return -1;
        }
        if (p->format == FP4D_CKPT_GPTOSS_MXFP4) {
            int64_t rshape[2] = {E, H}, rb[1] = {E};
            snprintf(name, sizeof name, "model.layers.%d.mlp.router.weight", L);
            if (add_bf16(g, name, 2, rshape, s, 0.0f)) return -1;
            snprintf(name, sizeof name, "model.layers.%d.mlp.router.bias", L);
            if (add_bf16(g, name, 1, rb, s, 0.0f)) return -1;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", L);
            if (add_gptoss_experts(g, name, E, 2 * I, H, s)) return -1;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", L);
            if (add_gptoss_experts(g, name, E, H, I, s)) return -1;
            continue;
        }
        if (p->format == FP4D_CKPT_UNQUANTIZED) {
            int64_t up[2] = {I, H}, down[2] = {H, I};
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.%s.weight", L, i < 2 ? gu[i] : "down_proj");
                if (add_bf16(g, name, 2, i < 2 ? up : down, s, 0.0f)) return -1;
            }
            continue;
        }
        if (E > 0) {
            int64_t rshape[2] = {E, H};
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", L);
            if (add_bf16(g, name, 2, rshape, s, 0.0f)) return -1;
            for (int64_t e = 0; e < E; e++) {
                snprintf(parent, sizeof parent, "model.layers.%d.mlp.experts.%lld", L, (long long)e);
                if (add_linear_group(g, wr, parent, gu, gu_out, 2, H, s)) return -1;
                if (add_linear_group(g, wr, parent, dn, h_out, 1, I, s)) return -1;
            }
        } else {
            snprintf(parent, sizeof parent, "model.layers.%d.mlp", L);
            if (add_linear_group(g, wr, parent, gu, gu_out, 2, H, s)) return -1;
            if (add_linear_group(g, wr, parent, dn, h_out, 1, I, s)) return -1;
        }
    }
    if (add_bf16(g, "model.norm.weight", 1, vec, last, 1.0f)) return -1;
    return add_bf16(g, "lm_head.weight", 2, emb, last, 0.0f);
}

/* ---- planting defects ------------------------------------------------------------------------ */

/* The packed weight next to a block-scale tensor, and the geometry of its blocks. */
static gen_tensor *packed_of(gen_plan *g, const gen_tensor *scale, int64_t *block_bytes)
{
    char *module = scan_name_module(scale->name);
    if (!module) return NULL;
    size_t n = strlen(module);
    char *name = malloc(n + 16);
    gen_tensor *w = NULL;
    bool gptoss = strlen(scale->name) > 7 && !strcmp(scale->name + strlen(scale->name) - 7, "_scales");
    static const char *const cands[] = {".weight", ".weight_packed", "_blocks"};
    for (int i = 0; name && i < 3 && !w; i++) {
        if (gptoss != (i == 2)) continue;
        snprintf(name, n + 16, "%s%s", module, cands[i]);
        w = plan_find(g, name);
    }
    free(name);
    free(module);
    if (w && scale->nbytes) *block_bytes = (int64_t)(w->nbytes / scale->nbytes);
    return w;
}

static bool codes_nonzero(const uint8_t *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (p[i] & 0x77) return true;
    return false;
}

static bool codes_underflow_pattern(const uint8_t *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int lo = p[i] & 7, hi = (p[i] >> 4) & 7;
        if ((lo && lo != 7) || (hi && hi != 7)) return false;
    }
    return true;
}

static fp4d_status plant_scale(gen_plan *g, gen_tensor *s, fp4d_ckpt_defect d, uint64_t count)
{
    int64_t bb = 0;
    gen_tensor *w = packed_of(g, s, &bb);
    FP4D_RETURN_ERROR_IF(!w || bb <= 0, INVALID_ARG, "plant %s: %s is not a block-scale tensor with a packed weight",
                         fp4d_ckpt_defect_name(d), s->name);
    bool mx = bb == 16;
    FP4D_RETURN_ERROR_IF(mx && (d == FP4D_DEFECT_SCALE_NEGATIVE || d == FP4D_DEFECT_SCALE_ZERO), INVALID_ARG,
                         "plant %s: ue8m0 scales have no sign and no zero", fp4d_ckpt_defect_name(d));
    uint64_t nblocks = s->nbytes, ncand = 0;
    uint64_t *cand = malloc((nblocks ? nblocks : 1) * sizeof *cand);
    if (!cand) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    for (uint64_t k = 0; k < nblocks; k++) {
        const uint8_t *blk = w->data + k * (uint64_t)bb;
        uint8_t b = s->data[k];
        if (!codes_nonzero(blk, bb)) continue;
        if (d == FP4D_DEFECT_SCALE_ZERO && (b == 0 || codes_underflow_pattern(blk, bb))) continue;
        if (d == FP4D_DEFECT_SCALE_NEGATIVE && (b == 0 || b == 0x7F)) continue;
        cand[ncand++] = k;
    }
    if (ncand < count) {
        free(cand);
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "plant %s: %s has only %llu suitable blocks",
                              fp4d_ckpt_defect_name(d), s->name, (unsigned long long)ncand);
    }
    for (uint64_t i = 0; i < count; i++) {
        uint64_t k = cand[i * ncand / count];
        uint8_t *b = &s->data[k];
        switch (d) {
        case FP4D_DEFECT_SCALE_NAN: *b = mx ? 0xFF : 0x7F; break;
        case FP4D_DEFECT_SCALE_NEGATIVE: *b |= 0x80; break;
        case FP4D_DEFECT_SCALE_ZERO: *b = 0x00; break;
        default: *b = 0x01; break; /* outlier: the smallest scale, 2^-9 (e4m3) or 2^-126 (ue8m0) */
        }
    }
    free(cand);
    return FP4D_STATUS_OK;
}

static fp4d_status plant_unquantize(gen_plan *g, const char *tensor)
{
    char *module = scan_name_module(tensor);
    if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    size_t n = strlen(module);
    char name[1024];
    gen_tensor *packed = NULL;
    bool gptoss = false;
    static const char *const cands[] = {".weight", ".weight_packed", "_blocks"};
    for (int i = 0; i < 3 && !packed; i++) {
        snprintf(name, sizeof name, "%s%s", module, cands[i]);
        packed = plan_find(g, name);
        gptoss = i == 2;
    }
    if (!packed || packed->dtype != FP4D_ST_U8 || n + 32 > sizeof name) {
        free(module);
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "plant unquantize: no packed weight for %s", tensor);
    }
    int64_t shape[4];
    int32_t ndim = packed->ndim - (gptoss ? 1 : 0);
    memcpy(shape, packed->shape, sizeof shape);
    if (gptoss) shape[ndim - 1] = packed->shape[ndim - 1] * 32;
    else shape[ndim - 1] = packed->shape[ndim - 1] * 2;
    int32_t shard = packed->shard;
    static const char *const drop[] = {".weight", ".weight_packed", "_blocks", ".weight_scale", ".weight_scale_2",
                                       ".input_scale", ".weight_global_scale", ".input_global_scale", "_scales"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) {
        snprintf(name, sizeof name, "%s%s", module, drop[i]);
        gen_tensor *t = plan_find(g, name);
        if (t) t->dropped = true;
    }
    snprintf(name, sizeof name, gptoss ? "%s" : "%s.weight", module);
    free(module);
    return add_bf16(g, name, ndim, shape, shard, 0.0f) ? fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory")
                                                       : FP4D_STATUS_OK;
}

static fp4d_status plant(gen_plan *g, const fp4d_ckpt_plant *pl)
{
    const fp4d_ckpt_gen_params *p = g->p;
    uint64_t count = pl->count ? pl->count : 1;
    FP4D_RETURN_ERROR_IF(!pl->tensor, INVALID_ARG, "plant %s: no tensor named", fp4d_ckpt_defect_name(pl->defect));
    if (pl->defect == FP4D_DEFECT_ADD_ORPHAN) {
        FP4D_RETURN_ERROR_IF(plan_find(g, pl->tensor), INVALID_ARG, "plant add-orphan: %s exists", pl->tensor);
        size_t n = strlen(pl->tensor);
        bool scalar = (n > 8 && !strcmp(pl->tensor + n - 8, "_scale_2")) ||
                      (n > 12 && !strcmp(pl->tensor + n - 12, "global_scale")) ||
                      (n > 11 && !strcmp(pl->tensor + n - 11, "input_scale"));
        int64_t shp[2] = {4, 4};
        gen_tensor *t = plan_add(g, pl->tensor, scalar ? FP4D_ST_F32 : FP4D_ST_F8_E4M3, scalar ? 0 : 2, shp, 0);
        if (!t) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        if (scalar) put_f32(t->data, 0.001f);
        else memset(t->data, 0x38, t->nbytes);
        return FP4D_STATUS_OK;
    }
    if (pl->defect == FP4D_DEFECT_UNQUANTIZE) return plant_unquantize(g, pl->tensor);
    if (pl->defect == FP4D_DEFECT_EXCLUDE_QUANTIZED) {
        FP4D_RETURN_ERROR_IF(!g->exclude_lists[0], INVALID_ARG, "plant exclude-quantized: this format has no config");
        char *module = scan_name_module(pl->tensor);
        if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        json_array_append_new(g->exclude_lists[0], json_string(module));
        free(module);
        return FP4D_STATUS_OK;
    }
    gen_tensor *t = plan_find(g, pl->tensor);
    FP4D_RETURN_ERROR_IF(!t, INVALID_ARG, "plant %s: no tensor %s in this checkpoint", fp4d_ckpt_defect_name(pl->defect),
                         pl->tensor);
    bool two_shards = p->shards >= 2;
    switch (pl->defect) {
    case FP4D_DEFECT_SCALE_NAN:
    case FP4D_DEFECT_SCALE_NEGATIVE:
    case FP4D_DEFECT_SCALE_ZERO:
    case FP4D_DEFECT_SCALE_OUTLIER:
        return plant_scale(g, t, pl->defect, count);
    case FP4D_DEFECT_GLOBAL_NAN:
    case FP4D_DEFECT_GLOBAL_ZERO:
    case FP4D_DEFECT_GLOBAL_RECIPROCAL:
    case FP4D_DEFECT_FUSED_MISMATCH:
        FP4D_RETURN_ERROR_IF(t->dtype != FP4D_ST_F32, INVALID_ARG, "plant %s: %s is not F32",
                             fp4d_ckpt_defect_name(pl->defect), t->name);
        for (uint64_t i = 0; i < t->nbytes / 4; i++) {
            float v;
            memcpy(&v, t->data + 4 * i, 4);
            v = pl->defect == FP4D_DEFECT_GLOBAL_NAN ? NAN
              : pl->defect == FP4D_DEFECT_GLOBAL_ZERO ? 0.0f
              : pl->defect == FP4D_DEFECT_GLOBAL_RECIPROCAL ? 1.0f / v : 2.0f * v;
            put_f32(t->data + 4 * i, v);
        }
        return FP4D_STATUS_OK;
    case FP4D_DEFECT_NONFINITE: {
        uint64_t esz = fp4d_st_dtype_bits(t->dtype) / 8, n = esz ? t->nbytes / esz : 0;
        FP4D_RETURN_ERROR_IF((t->dtype != FP4D_ST_BF16 && t->dtype != FP4D_ST_F32) || n < count, INVALID_ARG,
                             "plant nonfinite: %s is not a bf16/f32 tensor of >= %llu values", t->name,
                             (unsigned long long)count);
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = i * n / count;
            if (esz == 2) put_bf16(t->data + 2 * k, (i & 1) ? INFINITY : NAN);
            else put_f32(t->data + 4 * k, (i & 1) ? INFINITY : NAN);
        }
        return FP4D_STATUS_OK;
    }
    case FP4D_DEFECT_DROP_TENSOR: t->dropped = true; return FP4D_STATUS_OK;
    case FP4D_DEFECT_WRONG_DTYPE:
        t->dtype = t->dtype == FP4D_ST_U8 ? FP4D_ST_I8
                 : t->dtype == FP4D_ST_F8_E4M3 ? FP4D_ST_U8
                 : t->dtype == FP4D_ST_F32 ? FP4D_ST_I32
                 : t->dtype == FP4D_ST_BF16 ? FP4D_ST_F16 : FP4D_ST_U8;
        return FP4D_STATUS_OK;
    case FP4D_DEFECT_WRONG_SHAPE: {
        FP4D_RETURN_ERROR_IF(t->ndim < 1 || t->shape[t->ndim - 1] < 2 || fp4d_st_dtype_bits(t->dtype) != 8, INVALID_ARG,
                             "plant wrong-shape: %s is not a byte matrix", t->name);
        int64_t C = t->shape[t->ndim - 1], half = C / 2, rows = (int64_t)t->nbytes / C;
        for (int64_t r = 0; r < rows; r++) memmove(t->data + r * half, t->data + r * C, (size_t)half);
        t->shape[t->ndim - 1] = half;
        t->nbytes = (uint64_t)(rows * half);
        return FP4D_STATUS_OK;
    }
    case FP4D_DEFECT_DUPLICATE:
        FP4D_RETURN_ERROR_IF(!two_shards, INVALID_ARG, "plant duplicate: needs >= 2 shards");
        t->dup_shard = (t->shard + 1) % p->shards;
        return FP4D_STATUS_OK;
    case FP4D_DEFECT_INDEX_OMIT: t->index_shard = -1; return FP4D_STATUS_OK;
    case FP4D_DEFECT_INDEX_WRONG_FILE:
        FP4D_RETURN_ERROR_IF(!two_shards, INVALID_ARG, "plant index-wrong-file: needs >= 2 shards");
        t->index_shard = (t->shard + 1) % p->shards;
        return FP4D_STATUS_OK;
    case FP4D_DEFECT_DELETE_SHARD: g->shard_deleted[t->shard] = true; return FP4D_STATUS_OK;
    case FP4D_DEFECT_TRUNCATE_SHARD:
        FP4D_RETURN_ERROR_IF(t->nbytes < 2, INVALID_ARG, "plant truncate-shard: %s is too small to cut", t->name);
        free(g->shard_cut_tensor[t->shard]);
        g->shard_cut_tensor[t->shard] = strdup(t->name);
        return g->shard_cut_tensor[t->shard] ? FP4D_STATUS_OK : fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    case FP4D_DEFECT_HEADER_GARBAGE:
    case FP4D_DEFECT_HEADER_LENGTH:
        g->shard_header_defect[t->shard] = pl->defect == FP4D_DEFECT_HEADER_GARBAGE ? 1 : 2;
        free(g->shard_cut_tensor[t->shard]);
        g->shard_cut_tensor[t->shard] = strdup(t->name); /* garbage goes into this tensor's name */
        return FP4D_STATUS_OK;
    default: break;
    }
    return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "unknown defect %d", (int)pl->defect);
}

/* ---- writing ---------------------------------------------------------------------------------- */

typedef struct strbuf {
    char  *s;
    size_t n, cap;
} strbuf;

static int sb_printf(strbuf *b, const char *fmt, ...) FP4D_PRINTF(2, 3);
static int sb_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return 0;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *g = realloc(b->s, cap);
        if (!g) return -1;
        b->s = g;
        b->cap = cap;
    }
}

static void fill_random(gen_fill f, uint64_t *seed, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = rng_next(seed);
        size_t k = n - i < 8 ? n - i : 8;
        for (size_t j = 0; j < k; j++) {
            uint8_t b = (uint8_t)(r >> (8 * j));
            switch (f) {
            case FILL_RANDOM_NVSCALES: b = (uint8_t)(0x60 + b % 0x1F); break; /* 0x60..0x7E: 32..448 */
            case FILL_RANDOM_MXSCALES: b = (uint8_t)(0x74 + b % 8); break;   /* 2^-11..2^-4 */
            case FILL_RANDOM_BF16: if (j & 1) b = (uint8_t)(0x3C + (b & 1)); break; /* |x| < 0.25ish, finite */
            default: break;
            }
            p[i + j] = b;
        }
    }
}

static fp4d_status write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return fp4d_set_error(FP4D_STATUS_IO, "write failed: %s", strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return FP4D_STATUS_OK;
}

static void shard_name(char *buf, size_t n, int32_t s, int32_t total)
{
    snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, total);
}

static fp4d_status write_shard(gen_plan *g, const char *dir, int32_t s, uint64_t *total_size)
{
    const fp4d_ckpt_gen_params *p = g->p;
    char fname[64], *path;
    shard_name(fname, sizeof fname, s, p->shards);
    size_t dl = strlen(dir);
    path = malloc(dl + sizeof fname + 2);
    if (!path) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    snprintf(path, dl + sizeof fname + 2, "%s/%s", dir, fname);
    if (g->shard_deleted[s]) {
        unlink(path); /* a stale copy from an earlier run would hide the defect */
        free(path);
        return FP4D_STATUS_OK;
    }
    strbuf h = {0};
    uint64_t off = 0, cut_at = 0;
    bool cut_found = false;
    int rc = sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < g->n && !rc; i++) {
        gen_tensor *t = &g->t[i];
        if (t->dropped || (t->shard != s && t->dup_shard != s)) continue;
        rc |= sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, fp4d_st_dtype_name(t->dtype));
        for (int32_t d = 0; d < t->ndim; d++) rc |= sb_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        rc |= sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                        (unsigned long long)(off + t->nbytes));
        if (g->shard_cut_tensor[s] && !strcmp(g->shard_cut_tensor[s], t->name)) {
            cut_at = off + t->nbytes / 2;
            cut_found = true;
        }
        off += t->nbytes;
        if (t->shard == s) *total_size += t->nbytes;
    }
    rc |= sb_printf(&h, "}");
    while (!rc && h.n % 8) rc |= sb_printf(&h, " ");
    if (rc) {
        free(h.s);
        free(path);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    uint64_t hlen = h.n;
    if (g->shard_header_defect[s] == 1 && g->shard_cut_tensor[s]) {
        /* Invalid UTF-8 inside the named tensor's key. */
        char key[600];
        snprintf(key, sizeof key, "\"%s\"", g->shard_cut_tensor[s]);
        char *at = strstr(h.s, key);
        if (at) at[1] = (char)0xFF;
    }
    uint64_t len_field = g->shard_header_defect[s] == 2 ? hlen + off + 4096 : hlen;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(h.s);
        fp4d_status st = fp4d_set_error(FP4D_STATUS_IO, "cannot write '%s': %s", path, strerror(errno));
        free(path);
        return st;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(len_field >> (8 * i));
    fp4d_status st = write_all(fd, lenb, 8);
    if (st == FP4D_STATUS_OK) st = write_all(fd, h.s, h.n);
    free(h.s);
    uint8_t *chunk = NULL;
    for (size_t i = 0; i < g->n && st == FP4D_STATUS_OK; i++) {
        gen_tensor *t = &g->t[i];
        if (t->dropped || (t->shard != s && t->dup_shard != s)) continue;
        if (t->data || t->fill == FILL_DATA) {
            st = write_all(fd, t->data, t->nbytes);
            continue;
        }
        if (!chunk && !(chunk = malloc(1 << 20))) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        uint64_t seed = t->seed | 1;
        for (uint64_t o = 0; o < t->nbytes && st == FP4D_STATUS_OK; o += 1 << 20) {
            size_t k = t->nbytes - o < (1u << 20) ? (size_t)(t->nbytes - o) : (1u << 20);
            fill_random(t->fill, &seed, chunk, k);
            st = write_all(fd, chunk, k);
        }
    }
    free(chunk);
    if (st == FP4D_STATUS_OK && cut_found && g->shard_header_defect[s] == 0 &&
        ftruncate(fd, (off_t)(8 + hlen + cut_at)) != 0)
        st = fp4d_set_error(FP4D_STATUS_IO, "cannot truncate '%s': %s", path, strerror(errno));
    close(fd);
    free(path);
    return st;
}

static fp4d_status write_json(const char *dir, const char *name, json_t *j)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    snprintf(path, n, "%s/%s", dir, name);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    fp4d_status st = rc ? fp4d_set_error(FP4D_STATUS_IO, "cannot write '%s'", path) : FP4D_STATUS_OK;
    free(path);
    return st;
}

static void plan_free(gen_plan *g)
{
    for (size_t i = 0; i < g->n; i++) {
        free(g->t[i].name);
        free(g->t[i].data);
    }
    free(g->t);
    for (int32_t s = 0; g->shard_cut_tensor && s < g->p->shards; s++) free(g->shard_cut_tensor[s]);
    free(g->shard_cut_tensor);
    free(g->shard_deleted);
    free(g->shard_header_defect);
    json_decref(g->config);
    json_decref(g->hf_quant);
}

/* Tensor entries a checkpoint of these parameters has at most: 2 norms, 4 attention linears
 * and router tensors per layer, 4 tensors per linear, 3 linears per expert (or dense MLP). */
static uint64_t max_tensors(const fp4d_ckpt_gen_params *p)
{
    return (uint64_t)p->layers * (40 + 12 * (uint64_t)(p->experts > 0 ? p->experts : 1)) + 8;
}

#define GEN_MAX_TENSORS 1000000u /* the plan holds one entry per tensor, the header its name */

/* Sizes the checkpoint from its plan before anything is written: a size a file cannot hold,
 * more than the destination has free, or (quantized checkpoints are built in memory) more
 * than half of this machine's memory is refused with the numbers, where the generator used
 * to fill the disk, wrap sizes into a corrupt file or die of memory halfway. */
static fp4d_status check_size(const fp4d_ckpt_gen_params *p, uint64_t *bytes)
{
    FP4D_RETURN_ERROR_IF(max_tensors(p) > GEN_MAX_TENSORS, INVALID_ARG,
                         "fp4d_ckpt_generate: %d layers x %d experts is up to %llu tensors; at most %u are generated",
                         p->layers, p->experts, (unsigned long long)max_tensors(p), GEN_MAX_TENSORS);
    gen_plan g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.sizing = true;
    fp4d_status st = FP4D_STATUS_OK;
    if (build_configs(&g) || build_model(&g)) {
        if (g.too_big) {
            const gen_tensor *t = &g.t[g.n - 1];
            char shape[160] = "";
            for (int32_t i = 0; i < t->ndim; i++)
                snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", i ? ", " : "",
                         (long long)t->shape[i]);
            st = fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                                "fp4d_ckpt_generate: %s [%s] (%s) and the tensors before it come to more than 2^63 "
                                "bytes, more than a file can hold; choose smaller hidden/intermediate/experts/layers",
                                g.too_big, shape, fp4d_st_dtype_name(t->dtype));
        } else {
            st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory planning the checkpoint");
        }
    }
    *bytes = g.total_bytes;
    plan_free(&g);
    FP4D_FORWARD_IF_ERROR(st);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t mem = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    FP4D_RETURN_ERROR_IF(!p->random_fill && mem && *bytes > mem / 2, INVALID_ARG,
                         "fp4d_ckpt_generate: the checkpoint would be %.2f GB, built in memory while quantized: more "
                         "than half of this machine's %.2f GB; use random fill (gen-checkpoint --random-fill) for "
                         "checkpoints this large",
                         (double)*bytes / 1e9, (double)mem / 1e9);
    return FP4D_STATUS_OK;
}

void fp4d_ckpt_gen_defaults(fp4d_ckpt_gen_params *p, fp4d_ckpt_format format)
{
    memset(p, 0, sizeof *p);
    p->format = format;
    p->layers = 2;
    p->hidden = 64;
    p->intermediate = 128;
    p->experts = format == FP4D_CKPT_GPTOSS_MXFP4 ? 4 : 0;
    p->shards = 2;
    p->seed = 0x5eed;
    p->zero_block_byte = -1;
    p->zero_block_fraction = 0.05;
}

fp4d_status fp4d_ckpt_generate(const char *dir, const fp4d_ckpt_gen_params *p)
{
    FP4D_RETURN_ERROR_IF(!dir || !p, INVALID_ARG, "fp4d_ckpt_generate: NULL argument");
    FP4D_RETURN_ERROR_IF(p->layers < 1 || p->shards < 1 || p->shards > p->layers + 1 || p->hidden < 32 ||
                             p->hidden % 32 || p->intermediate < 32 || p->intermediate % 32 || p->experts < 0 ||
                             (unsigned)p->format >= FP4D_CKPT_FORMAT_COUNT ||
                             (p->format == FP4D_CKPT_GPTOSS_MXFP4 && p->experts < 1),
                         INVALID_ARG, "fp4d_ckpt_generate: bad parameters (hidden/intermediate multiples of 32, "
                                      "1 <= shards <= layers + 1, gpt-oss needs experts)");
    FP4D_RETURN_ERROR_IF(p->head_dim < 0 || (p->head_dim > 0 && (p->hidden / 2) % p->head_dim), INVALID_ARG,
                         "fp4d_ckpt_generate: head_dim %d does not divide hidden / 2 = %d (k_proj's rows)",
                         (int)p->head_dim, (int)(p->hidden / 2));
    FP4D_RETURN_ERROR_IF(p->random_fill && p->num_plants, INVALID_ARG,
                         "fp4d_ckpt_generate: defects cannot be planted in random-fill checkpoints");
    uint64_t bytes = 0;
    FP4D_FORWARD_IF_ERROR(check_size(p, &bytes));
    bool created = mkdir(dir, 0755) == 0;
    if (!created && errno != EEXIST)
        return fp4d_set_error(FP4D_STATUS_IO, "cannot create '%s': %s", dir, strerror(errno));
    /* Files it replaces free their space, but not before the new ones are written in full. */
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0 && bytes > (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize) {
        if (created) rmdir(dir);
        return fp4d_set_error(FP4D_STATUS_IO,
                              "fp4d_ckpt_generate: the checkpoint would be %.2f GB, but '%s' has %.2f GB free",
                              (double)bytes / 1e9, dir,
                              (double)((uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize) / 1e9);
    }
    gen_plan g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.rng = p->seed * 0x9E3779B97F4A7C15ull + 1;
    g.shard_deleted = calloc((size_t)p->shards, sizeof *g.shard_deleted);
    g.shard_cut_tensor = calloc((size_t)p->shards, sizeof *g.shard_cut_tensor);
    g.shard_header_defect = calloc((size_t)p->shards, sizeof *g.shard_header_defect);
    fp4d_status st = FP4D_STATUS_OK;
    if (!g.shard_deleted || !g.shard_cut_tensor || !g.shard_header_defect || build_configs(&g) || build_model(&g))
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory building the checkpoint");
    for (size_t i = 0; i < p->num_plants && st == FP4D_STATUS_OK; i++) st = plant(&g, &p->plants[i]);
    uint64_t total = 0;
    for (int32_t s = 0; s < p->shards && st == FP4D_STATUS_OK; s++) st = write_shard(&g, dir, s, &total);
    if (st == FP4D_STATUS_OK) {
        json_t *wm = json_object();
        for (size_t i = 0; i < g.n; i++) {
            gen_tensor *t = &g.t[i];
            if (t->dropped || t->index_shard < 0) continue;
            char fname[64];
            shard_name(fname, sizeof fname, t->index_shard, p->shards);
            json_object_set_new(wm, t->name, json_string(fname));
        }
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
        st = idx ? write_json(dir, "model.safetensors.index.json", idx)
                 : fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        json_decref(idx);
    }
    if (st == FP4D_STATUS_OK) st = write_json(dir, "config.json", g.config);
    if (st == FP4D_STATUS_OK && g.hf_quant) st = write_json(dir, "hf_quant_config.json", g.hf_quant);
    if (st == FP4D_STATUS_OK && !g.hf_quant) {
        /* A stale one from an earlier run would change the checkpoint's format. */
        size_t n = strlen(dir) + 32;
        char *stale = malloc(n);
        if (stale) {
            snprintf(stale, n, "%s/hf_quant_config.json", dir);
            unlink(stale);
            free(stale);
        }
    }
    plan_free(&g);
    return st;
}
