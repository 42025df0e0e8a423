/* names.c - layer and expert numbers and module names from Hugging Face tensor names. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "internal.h"
#include "scan/scan_internal.h"

/* The number right after "<component>." where component is one of keys, at a component
 * boundary: "model.layers.12.mlp" -> 12. */
static int64_t name_number_after(const char *name, const char *const *keys, size_t nkeys)
{
    for (const char *p = name; *p; p++) {
        if (p != name && p[-1] != '.') continue;
        for (size_t k = 0; k < nkeys; k++) {
            size_t n = strlen(keys[k]);
            if (strncmp(p, keys[k], n) || p[n] != '.' || !isdigit((unsigned char)p[n + 1])) continue;
            const char *d = p + n + 1;
            int64_t v = 0;
            while (isdigit((unsigned char)*d) && v < 1000000000) v = v * 10 + (*d++ - '0');
            if (*d == '.' || *d == '\0') return v;
        }
    }
    return -1;
}

int64_t scan_name_layer(const char *name)
{
    static const char *const keys[] = {"layers", "h", "block", "blocks", "layer"};
    return name_number_after(name, keys, sizeof keys / sizeof keys[0]);
}

int64_t scan_name_expert(const char *name)
{
    static const char *const keys[] = {"experts"};
    return name_number_after(name, keys, 1);
}

char *scan_name_module(const char *name)
{
    /* Longest first where one suffix ends another (".weight_scale_2" before ".weight_scale"). */
    static const char *const sfx[] = {".weight_packed", ".weight_scale_2", ".weight_global_scale",
                                      ".input_global_scale", ".weight_scale", ".input_scale", ".weight",
                                      "_blocks", "_scales"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        size_t k = strlen(sfx[i]);
        if (n > k && !strcmp(name + n - k, sfx[i])) return strndup(name, n - k);
    }
    return strdup(name);
}

const char *scan_name_leaf(const char *module)
{
    const char *dot = strrchr(module, '.');
    return dot ? dot + 1 : module;
}

bool scan_tp_row_parallel(const char *module)
{
    static const char *const names[] = {"down_proj", "o_proj", "out_proj", "dense_4h_to_h", "w2", "wo", "fc2"};
    const char *leaf = scan_name_leaf(module);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(leaf, names[i])) return true;
    return false;
}

/* ---- attention heads --------------------------------------------------------------------- */

/* A head count or size: positive and below 2^24, else 0 (not given). */
static int64_t positive_int(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 24)
               ? (int64_t)json_integer_value(v)
               : 0;
}

static bool heads_of(const json_t *root, scan_heads *h)
{
    memset(h, 0, sizeof *h);
    if (!json_is_object(root)) return false;
    /* a multimodal model keeps its language model's numbers in a nested config */
    static const char *const nested[] = {"text_config", "llm_config", "language_config"};
    const json_t *cfg = root;
    for (size_t i = 0; !positive_int(cfg, "num_attention_heads") && i < sizeof nested / sizeof nested[0]; i++)
        if (json_is_object(json_object_get(root, nested[i]))) cfg = json_object_get(root, nested[i]);
    h->q = positive_int(cfg, "num_attention_heads");
    if (!h->q) return false;
    h->kv = positive_int(cfg, "num_key_value_heads");
    if (!h->kv) h->kv = h->q; /* multi-head attention */
    h->head_dim = positive_int(cfg, "head_dim");
    const int64_t hidden = positive_int(cfg, "hidden_size");
    if (!h->head_dim && hidden % h->q == 0) h->head_dim = hidden / h->q;
    return true;
}

/* scan_heads_parse, saying in why (when not NULL) why text is no config: not JSON, or not an
 * object. */
static bool heads_from_text(const char *text, size_t len, scan_heads *h, char *why, size_t why_len)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    if (why && !root) snprintf(why, why_len, "%s (line %d, column %d)", err.text, err.line, err.column);
    else if (why && !json_is_object(root)) snprintf(why, why_len, "not a JSON object");
    const bool ok = heads_of(root, h);
    json_decref(root);
    return ok;
}

bool scan_heads_parse(const char *text, size_t len, scan_heads *h)
{
    return heads_from_text(text, len, h, NULL, 0);
}

fp4d_status scan_heads_load(const char *dir, scan_heads *h, bool *found, char *why, size_t why_len)
{
    memset(h, 0, sizeof *h);
    *found = false;
    why[0] = '\0';
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    FP4D_RETURN_ERROR_IF(!path, NOMEM, "out of memory");
    snprintf(path, n, "%s/config.json", dir);
    char *text = NULL;
    size_t len = 0;
    small_file_state state;
    const fp4d_status st = scan_read_small_file(path, &text, &len, &state, why, why_len);
    free(path);
    FP4D_FORWARD_IF_ERROR(st);
    if (state == SMALL_FILE_READ) *found = heads_from_text(text, len, h, why, why_len);
    free(text);
    return FP4D_STATUS_OK;
}

typedef enum attn_role { ATTN_NONE, ATTN_Q, ATTN_KV, ATTN_QKV, ATTN_O } attn_role;

static attn_role attn_role_of(const char *module)
{
    const char *leaf = scan_name_leaf(module);
    if (!strcmp(leaf, "q_proj")) return ATTN_Q;
    if (!strcmp(leaf, "k_proj") || !strcmp(leaf, "v_proj")) return ATTN_KV;
    if (!strcmp(leaf, "qkv_proj")) return ATTN_QKV; /* q, k and v rows in one tensor (Phi-3, Phi-4) */
    if (!strcmp(leaf, "o_proj")) return ATTN_O;
    return ATTN_NONE;
}

/* A dense gate_up_proj: gate and up rows in one tensor, one half each (Phi-3, Phi-4-mini).
 * Not a MoE's experts tensor: gpt-oss interleaves gate and up rows there, and a rank's
 * contiguous rows hold its share of both. */
static bool is_fused_gate_up(const char *module)
{
    return !strcmp(scan_name_leaf(module), "gate_up_proj") && !strstr(module, "experts");
}

int64_t scan_tp_source_row(const scan_tp_cut *cut, int rank, int64_t r)
{
    if (!cut->num_parts) return (int64_t)(rank / cut->replicas) * cut->per_rank + r;
    int64_t base = 0;
    for (int i = 0; i < cut->num_parts; i++) {
        const scan_tp_part *p = &cut->parts[i];
        if (r < p->per_rank) return base + (int64_t)(rank / p->replicas) * p->per_rank + r;
        r -= p->per_rank;
        base += p->all;
    }
    return -1; /* r is past the shard */
}

const char *scan_tp_heads_why(const scan_tp_cut *cut, const char *module, int tp, char *out, size_t size)
{
    snprintf(out, size,
             "config.json gives %s = %lld, which %d tensor-parallel ranks cannot share out (%s is cut by whole "
             "heads; %s)", cut->kv_heads ? "num_key_value_heads" : "num_attention_heads", (long long)cut->heads, tp,
             scan_name_leaf(module),
             cut->kv_heads ? "the KV heads must be a multiple of the TP degree, or the TP degree a multiple of "
                             "them, each rank then holding one KV head"
                           : "the query heads must be a multiple of the TP degree");
    return out;
}

scan_tp_cut scan_tp_plan(const char *module, int64_t n, int64_t k, int64_t block, bool is_mx, const scan_heads *h,
                         int tp)
{
    scan_tp_cut cut = {.problem = SCAN_TP_OK, .split_k = scan_tp_row_parallel(module), .replicas = 1};
    cut.dim = cut.split_k ? k : n;
    cut.per_rank = cut.dim;
    if (tp <= 1 || cut.dim <= 0) return cut;
    const attn_role role = attn_role_of(module);
    if (h && h->q > 0 && h->head_dim > 0 && role != ATTN_NONE) {
        /* the counts are below 2^24 (heads_of), so these products cannot overflow */
        const int64_t d = h->head_dim, kv = h->kv > 0 ? h->kv : h->q;
        const bool by_heads = role == ATTN_Q     ? n == h->q * d
                              : role == ATTN_O   ? k == h->q * d
                              : role == ATTN_QKV ? n == (h->q + 2 * kv) * d
                                                 : n == kv * d;
        /* q, k and v are one layer to the engine (QKVParallelLinear): its query heads must
         * share out for k_proj and v_proj to load at all */
        if (by_heads && h->q % tp) {
            cut.problem = SCAN_TP_HEADS, cut.heads = h->q;
            return cut;
        }
        if (by_heads && (role == ATTN_KV || role == ATTN_QKV)) {
            if (tp >= kv ? tp % kv != 0 : kv % tp != 0) {
                /* kv != q here: config.json gave num_key_value_heads (kv = q when it does not,
                 * and q % tp == 0 above makes that share out) */
                cut.problem = SCAN_TP_HEADS, cut.heads = kv, cut.kv_heads = true;
                return cut;
            }
            const int64_t kv_rows = tp >= kv ? d : kv / tp * d;
            const int replicas = tp >= kv ? (int)(tp / kv) : 1; /* one whole KV head per rank, on tp / kv ranks */
            cut.by_heads = true;
            if (role == ATTN_QKV) { /* the rank's query heads, then its k and its v rows */
                cut.num_parts = 3;
                cut.parts[0] = (scan_tp_part){"q", h->q * d, h->q / tp * d, 1};
                cut.parts[1] = (scan_tp_part){"k", kv * d, kv_rows, replicas};
                cut.parts[2] = (scan_tp_part){"v", kv * d, kv_rows, replicas};
                cut.per_rank = cut.parts[0].per_rank + 2 * kv_rows;
                return cut;
            }
            cut.replicas = replicas;
            if (tp >= kv) {
                cut.per_rank = d;
                return cut;
            }
        }
    }
    if (!cut.split_k && is_fused_gate_up(module) && n % 2 == 0) {
        /* [gate | up] rows: vLLM's MergedColumnParallelLinear gives each rank its N / 2 / tp
         * rows of gate and the same of up (contiguous N / tp rows would give rank 0 gate rows
         * alone at --tp 2), so each half must share out */
        cut.num_parts = 2;
        cut.parts[0] = (scan_tp_part){"gate", n / 2, n / 2 / tp, 1};
        cut.parts[1] = (scan_tp_part){"up", n / 2, n / 2 / tp, 1};
        if ((n / 2) % tp) cut.problem = SCAN_TP_UNEVEN;
        else cut.per_rank = n / tp;
        return cut;
    }
    if (cut.dim % tp) {
        cut.problem = SCAN_TP_UNEVEN;
        return cut;
    }
    cut.per_rank = cut.dim / tp;
    if (!cut.split_k) return cut;
    if (cut.per_rank % block) cut.problem = SCAN_TP_SPLIT_BLOCK;
    else if (!is_mx && cut.per_rank % 32) cut.problem = SCAN_TP_PADDED_SCALES;
    return cut;
}
