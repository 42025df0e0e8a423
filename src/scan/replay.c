/*
 * replay.c - `fp4doctor replay CHECKPOINT --layer NAME`: one quantized layer's real weights
 * through every backend, judged against the exact reference with the verdict names of
 * `fp4doctor check` (doctor.h).
 *
 * The doctor's own runner builds synthetic operands from a case description, so replay
 * drives the backends itself: each backend runs in a forked child writing into shared
 * memory (a crash or a hang costs one verdict, as in check), the parent compares a sample
 * of output elements (all of them for small layers) with fp4d_ref_gemm_element.
 *
 * Activations: NVFP4 layers with a static input scale get activations whose amax is the
 * one that scale implies (amax = 2688 x decode input scale), quantized to NVFP4 with that
 * scale as engines do; weight-only layers (MXFP4, W4A16) get bf16 N(0,1) activations.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <jansson.h>

#include "fp4doctor/backend.h"
#include "fp4doctor/doctor.h"
#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"
#include "fp4doctor/ref.h"
#include "clock.h"
#include "doctor/doctor_internal.h"
#include "internal.h"
#include "scan/replay.h"
#include "scan/scan_internal.h"

#define REPLAY_MAX_SAMPLES 4096
#define REPLAY_TIMEOUT_S   120 /* the floor of a backend's limit: process start, device context */
#define REPLAY_POISON      0x7FC1u /* a bf16 NaN no arithmetic produces: "never written" */

/* ---- the checkpoint's files ------------------------------------------------------------------- */

/* The files a loader reads, under scan's rules (docs/scan.md, "Shards"): with a valid index,
 * the shards its weight_map names, and each tensor only in the shard the index names for it;
 * without one, every .safetensors file of the folder (or the one file given). Opening every
 * file and taking the first holder in directory order let a stale consolidated.safetensors
 * next to an indexed checkpoint decide the verdict, and a shard that could not be read was
 * dropped in silence, its layer then reported as not existing. */
typedef struct replay_shards {
    fp4d_st_file **files;
    char         **names;      /* sorted; as the index or the folder names them, for messages */
    size_t         count;
    json_t        *weight_map; /* tensor -> shard name; NULL without a valid index */
    char           problem[1024]; /* the first lookup no loader would answer (see shards_find) */
} replay_shards;

static void shards_free(replay_shards *s)
{
    for (size_t i = 0; i < s->count; i++) {
        if (s->files) fp4d_st_close(s->files[i]); /* NULL when listing the names ran out of memory */
        free(s->names[i]);
    }
    free(s->files);
    free(s->names);
    json_decref(s->weight_map);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends name (malloc'd, taken over); false when out of memory. */
static bool shards_add_name(replay_shards *s, char *name)
{
    char **g = name ? realloc(s->names, (s->count + 1) * sizeof *g) : NULL;
    if (!g) {
        free(name);
        return false;
    }
    s->names = g;
    s->names[s->count++] = name;
    return true;
}

/* The shard names of the index, each once. Sorted first: an index names each shard for
 * thousands of tensors, and may name thousands of shards. */
static bool shards_add_indexed(replay_shards *s)
{
    size_t n = json_object_size(s->weight_map), i = 0;
    const char **all = malloc((n ? n : 1) * sizeof *all);
    if (!all) return false;
    const char *tensor;
    json_t *shard;
    json_object_foreach(s->weight_map, tensor, shard) all[i++] = json_string_value(shard);
    qsort(all, n, sizeof *all, cmp_name);
    bool ok = true;
    for (i = 0; i < n && ok; i++)
        if (i == 0 || strcmp(all[i], all[i - 1])) ok = shards_add_name(s, strdup(all[i]));
    free(all);
    return ok;
}

/* Opens every listed file under dir (NULL: names[0] is the path itself). Returns an exit code:
 * a file that cannot be opened or parsed could hold the layer, or decide which copy of it a
 * loader reads, so it stops the replay with the file and the reason (4 when the process ran
 * out of memory or descriptors, as for other commands' inputs). */
static int shards_open_all(replay_shards *s, const char *dir, char *why, size_t why_n)
{
    if (s->count > 1) qsort(s->names, s->count, sizeof *s->names, cmp_name);
    if (!(s->files = calloc(s->count ? s->count : 1, sizeof *s->files))) return FP4D_EXIT_INTERNAL;
    for (size_t i = 0; i < s->count; i++) {
        size_t n = (dir ? strlen(dir) + 1 : 0) + strlen(s->names[i]) + 1;
        char *path = malloc(n);
        if (!path) return FP4D_EXIT_INTERNAL;
        snprintf(path, n, "%s%s%s", dir ? dir : "", dir ? "/" : "", s->names[i]);
        fp4d_st_open_result res;
        s->files[i] = fp4d_st_open(path, &res);
        free(path);
        if (!s->files[i]) {
            if (s->weight_map)
                snprintf(why, why_n, "a shard %s names cannot be read: %s [%s] (run fp4doctor scan)",
                         SCAN_INDEX_NAME, res.message, fp4d_st_error_name(res.error));
            else if (dir)
                snprintf(why, why_n, "%s [%s]; with no %s, any .safetensors file in the folder may hold the layer "
                         "(run fp4doctor scan)", res.message, fp4d_st_error_name(res.error), SCAN_INDEX_NAME);
            else
                snprintf(why, why_n, "%s [%s] (run fp4doctor scan)", res.message, fp4d_st_error_name(res.error));
            return res.error == FP4D_ST_ERR_RESOURCE ? FP4D_EXIT_INTERNAL : FP4D_EXIT_INPUT;
        }
    }
    return FP4D_EXIT_OK;
}

/* Finds the files of checkpoint ckpt (a folder or one file) and opens them; an exit code, with
 * why said when it is not OK. */
static int shards_open(replay_shards *s, const char *ckpt, char *why, size_t why_n)
{
    memset(s, 0, sizeof *s);
    DIR *d = opendir(ckpt);
    if (!d) {
        if (!shards_add_name(s, strdup(ckpt))) return FP4D_EXIT_INTERNAL;
        return shards_open_all(s, NULL, why, why_n);
    }
    /* the index as scan reads it (scan_index_load): one that is there but unusable is said, and
     * every .safetensors file read instead, as scan does */
    char invalid_index[256];
    scan_index_state index_state;
    if (scan_index_load(ckpt, &index_state, &s->weight_map, invalid_index, sizeof invalid_index) != FP4D_STATUS_OK) {
        closedir(d);
        snprintf(why, why_n, "%s", fp4d_last_error());
        return FP4D_EXIT_INTERNAL;
    }
    if (index_state == SCAN_INDEX_UNREADABLE || index_state == SCAN_INDEX_INVALID)
        fprintf(stderr, "fp4doctor replay: cannot use %s (%s); reading every .safetensors file instead "
                        "(run fp4doctor scan)\n", SCAN_INDEX_NAME, invalid_index);
    bool listed = true;
    if (s->weight_map) {
        listed = shards_add_indexed(s);
    } else {
        struct dirent *e;
        while (listed && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) listed = shards_add_name(s, strdup(e->d_name));
        }
    }
    closedir(d);
    if (!listed) return FP4D_EXIT_INTERNAL;
    if (!s->count) {
        snprintf(why, why_n, s->weight_map ? "'%s': %s maps no tensor to a shard (run fp4doctor scan)"
                                           : "no .safetensors file in '%s' (run fp4doctor scan)",
                 ckpt, SCAN_INDEX_NAME);
        return FP4D_EXIT_INPUT;
    }
    return shards_open_all(s, ckpt, why, why_n);
}

/* The tensor a loader reads under name, or NULL. NULL also when the checkpoint cannot say
 * which (s->problem then says why, and the replay stops on it): the index maps the name to a
 * shard that does not hold it, a shard holds it but the index does not list it (no loader
 * reads it), or, with no index, two files hold it. */
static const fp4d_st_tensor *shards_find(replay_shards *s, const char *name)
{
    if (s->weight_map) {
        const char *shard = json_string_value(json_object_get(s->weight_map, name));
        for (size_t i = 0; !shard && i < s->count && !s->problem[0]; i++)
            if (fp4d_st_find(s->files[i], name))
                snprintf(s->problem, sizeof s->problem, "%s is in %s but not in %s: loaders do not read it "
                         "(run fp4doctor scan)", name, s->names[i], SCAN_INDEX_NAME);
        if (!shard) return NULL;
        char **at = bsearch(&shard, s->names, s->count, sizeof *s->names, cmp_name);
        const fp4d_st_tensor *t = at ? fp4d_st_find(s->files[at - s->names], name) : NULL;
        if (!t && !s->problem[0])
            snprintf(s->problem, sizeof s->problem, "%s maps %s to %s, which does not hold it (run fp4doctor scan)",
                     SCAN_INDEX_NAME, name, shard);
        return t;
    }
    const fp4d_st_tensor *found = NULL;
    size_t holder = 0;
    for (size_t i = 0; i < s->count; i++) {
        const fp4d_st_tensor *t = fp4d_st_find(s->files[i], name);
        if (!t) continue;
        if (found) {
            if (!s->problem[0])
                snprintf(s->problem, sizeof s->problem, "%s is in both %s and %s, and there is no %s to say which "
                         "one a loader reads; remove the stale file or replay one file (run fp4doctor scan)",
                         name, s->names[holder], s->names[i], SCAN_INDEX_NAME);
            return NULL;
        }
        found = t;
        holder = i;
    }
    return found;
}

static const fp4d_st_tensor *find2(replay_shards *s, const char *module, const char *suffix)
{
    size_t n = strlen(module) + strlen(suffix) + 1;
    char *name = malloc(n);
    if (!name) return NULL;
    snprintf(name, n, "%s%s", module, suffix);
    const fp4d_st_tensor *t = shards_find(s, name);
    free(name);
    return t;
}

/* A one-element float tensor's value; NAN for anything else (a [4] or [2,2] tensor is not a
 * per-tensor scale, and is not read as one). */
static double scalar_of(const fp4d_st_tensor *t)
{
    if (!t || t->nbytes * 8 != fp4d_st_dtype_bits(t->dtype)) return NAN;
    if (t->dtype == FP4D_ST_F32) {
        float f;
        memcpy(&f, t->data, 4);
        return f;
    }
    uint16_t h = (uint16_t)(t->data[0] | t->data[1] << 8);
    if (t->dtype == FP4D_ST_BF16) return fp4d_bf16_to_f32(h);
    if (t->dtype == FP4D_ST_F16) return fp4d_f16_to_f32(h);
    return NAN;
}

/* The layer as a GEMM operand B [N, K] with everything replay needs around it. */
typedef struct replay_layer {
    fp4d_dtype format;
    int64_t    n, k;
    uint8_t   *codes, *scales;
    double     weight_decode;  /* NVFP4 per-tensor decode scale (1 for MXFP4) */
    double     input_decode;   /* 0 when the layer has no static input scale */
    uint64_t   nan_scales;     /* block scales that are NaN codes (e4m3 0x7F/0xFF, e8m0 0xFF) */
    uint64_t   num_scales;
    char       module[256];    /* its module name: how tensor parallelism cuts it (scan_tp_plan) */
    char       desc[256];
    char       shard[256];     /* which rank's shard of the layer this is; empty for all of it */
} replay_layer;

/* Appends to why the quantized layers whose module names contain query (a partial name such
 * as "layers.3.mlp.down_proj" or "down_proj"), so that a name that is not one still leads
 * somewhere. */
static void suggest_layers(const replay_shards *s, const char *query, char *why, size_t why_n)
{
    if (!query[0]) return;
    size_t shown = 0, more = 0;
    for (size_t f = 0; f < s->count; f++)
        for (size_t i = 0; i < fp4d_st_count(s->files[f]); i++) {
            const fp4d_st_tensor *t = fp4d_st_get(s->files[f], i);
            size_t n = strlen(t->name);
            bool quantized = (n > 14 && !strcmp(t->name + n - 14, ".weight_packed")) ||
                             (n > 7 && !strcmp(t->name + n - 7, "_blocks")) ||
                             (n > 7 && !strcmp(t->name + n - 7, ".weight") && t->dtype == FP4D_ST_U8);
            if (!quantized) continue;
            char *module = scan_name_module(t->name);
            if (module && strstr(module, query)) {
                size_t used = strlen(why);
                if (shown < 4 && used + strlen(module) + 40 < why_n) {
                    snprintf(why + used, why_n - used, "%s%s", shown ? ", " : "; layers whose names contain it: ",
                             module);
                    shown++;
                } else {
                    more++;
                }
            }
            free(module);
        }
    size_t used = strlen(why);
    if (more && used + 24 < why_n) snprintf(why + used, why_n - used, " and %zu more", more);
}

static int64_t layer_block(const replay_layer *L) { return L->format == FP4D_DTYPE_MXFP4 ? 32 : 16; }

static void count_nan_scales(replay_layer *L)
{
    const bool mx = L->format == FP4D_DTYPE_MXFP4;
    L->num_scales = (uint64_t)L->n * (uint64_t)(L->k / layer_block(L));
    L->nan_scales = 0;
    for (uint64_t i = 0; i < L->num_scales; i++)
        L->nan_scales += mx ? L->scales[i] == 0xFF : (L->scales[i] & 0x7F) == 0x7F;
}

static bool layer_load(replay_shards *s, const char *name, replay_layer *L, char *why, size_t why_n)
{
    memset(L, 0, sizeof *L);
    char *module = scan_name_module(name);
    if (!module) return false;
    const fp4d_st_tensor *w = NULL, *sc = NULL;
    int64_t expert = -1;
    bool ct = false, gptoss = false;
    if ((w = find2(s, module, ".weight")) && w->dtype == FP4D_ST_U8) {
        sc = find2(s, module, ".weight_scale");
    } else if ((w = find2(s, module, ".weight_packed"))) {
        ct = true;
        sc = find2(s, module, ".weight_scale");
    } else if ((w = find2(s, module, "_blocks"))) {
        gptoss = true;
        sc = find2(s, module, "_scales");
    } else {
        /* "...experts.17.down_proj" inside a fused gpt-oss tensor "...experts.down_proj_blocks". */
        const char *p = strstr(module, ".experts.");
        char *end = NULL;
        /* digits only: "experts.-1." or "experts. 3." is no expert number (strtoll would take
         * them, and -1 then stood for expert 0 of a one-expert tensor) */
        if (p && p[9] >= '0' && p[9] <= '9') expert = strtoll(p + 9, &end, 10);
        if (p && end && *end == '.') {
            char fused[1024];
            snprintf(fused, sizeof fused, "%.*s.experts.%s", (int)(p - module), module, end + 1);
            w = find2(s, fused, "_blocks");
            sc = find2(s, fused, "_scales");
            gptoss = w != NULL;
        }
    }
    if (!w || !sc) {
        const fp4d_st_tensor *plain = find2(s, module, ".weight");
        if (plain && !sc && plain->dtype != FP4D_ST_U8)
            /* an excluded (unquantized) layer: say so rather than that it does not exist */
            snprintf(why, why_n, "'%s' is not quantized: %s is %s (replay runs FP4 layers)", name, plain->name,
                     fp4d_st_dtype_name(plain->dtype));
        else
            snprintf(why, why_n, "no quantized layer '%s' (looked for %s.weight/.weight_packed/_blocks and its scales)",
                     name, module);
        if (!w) suggest_layers(s, module, why, why_n);
        free(module);
        return false;
    }
    /* one byte per element, as the copies below read them: two codes per byte, one scale per byte
     * (F4 codes or F32 scales would be read past their ends, or reinterpreted) */
    if (fp4d_st_dtype_bits(w->dtype) != 8 || fp4d_st_dtype_bits(sc->dtype) != 8 || w->dtype == FP4D_ST_BOOL ||
        sc->dtype == FP4D_ST_BOOL) {
        snprintf(why, why_n, "%s: %s is %s and %s is %s; replay reads packed codes and scales of one byte each "
                 "(run fp4doctor scan)", module, w->name, fp4d_st_dtype_name(w->dtype), sc->name,
                 fp4d_st_dtype_name(sc->dtype));
        free(module);
        return false;
    }
    bool mx = gptoss || sc->dtype == FP4D_ST_U8 || sc->dtype == FP4D_ST_F8_E8M0;
    L->format = mx ? FP4D_DTYPE_MXFP4 : FP4D_DTYPE_NVFP4;
    int64_t block = mx ? 32 : 16;
    const uint8_t *codes = w->data, *scales = sc->data;
    if (gptoss) {
        if (w->ndim != 4 || sc->ndim != 3 || w->shape[3] != 16) goto bad_shape;
        int64_t E = w->shape[0];
        if (expert < 0 && E == 1) expert = 0;
        if (expert < 0 || expert >= E) {
            const int stem = (int)(strstr(module, ".experts") ? strstr(module, ".experts") - module : (long)strlen(module));
            if (expert >= E) /* named, but past the end: say so, not just "name one" */
                snprintf(why, why_n, "%s holds %lld fused experts (0..%lld): there is no expert %lld", w->name,
                         (long long)E, (long long)E - 1, (long long)expert);
            else
                snprintf(why, why_n, "%s holds %lld fused experts: name one, e.g. %.*s.experts.0.<proj>", w->name,
                         (long long)E, stem, module);
            free(module);
            return false;
        }
        L->n = w->shape[1];
        L->k = w->shape[2] * 32;
        codes += (uint64_t)expert * (uint64_t)(L->n * L->k / 2);
        scales += (uint64_t)expert * (uint64_t)(L->n * L->k / 32);
    } else {
        if (w->ndim != 2 || sc->ndim != 2) goto bad_shape;
        L->n = w->shape[0];
        L->k = 2 * w->shape[1];
    }
    /* the chosen expert's codes and scales inside their tensors (gpt-oss: expert e's bytes start
     * e matrices in; a scales tensor with fewer experts than the blocks' is too short) */
    const uint64_t experts_in = (uint64_t)(expert > 0 ? expert : 0) + 1;
    if (L->n <= 0 || L->k <= 0 || L->k % block ||
        experts_in * ((uint64_t)L->n * (uint64_t)L->k / 2) > w->nbytes ||
        experts_in * ((uint64_t)L->n * (uint64_t)(L->k / block)) > sc->nbytes ||
        (!gptoss && (sc->shape[0] != L->n || sc->shape[1] != L->k / block)))
        goto bad_shape;
    L->codes = malloc((size_t)(L->n * L->k / 2));
    L->scales = malloc((size_t)(L->n * (L->k / block)));
    if (!L->codes || !L->scales) {
        free(module);
        return false;
    }
    memcpy(L->codes, codes, (size_t)(L->n * L->k / 2));
    memcpy(L->scales, scales, (size_t)(L->n * (L->k / block)));
    /* NaN block scales make the outputs that touch them NaN (ue8m0 0xFF: Inf or 2^128, by
     * engine) whatever the backend: those elements cannot judge one, and the layer is broken */
    count_nan_scales(L);
    L->weight_decode = 1.0;
    if (!mx) {
        if (ct) {
            double g = scalar_of(find2(s, module, ".weight_global_scale"));
            double i = scalar_of(find2(s, module, ".input_global_scale"));
            L->weight_decode = 1.0 / g;
            L->input_decode = isfinite(i) && i > 0 ? 1.0 / i : 0;
        } else {
            L->weight_decode = scalar_of(find2(s, module, ".weight_scale_2"));
            double i = scalar_of(find2(s, module, ".input_scale"));
            L->input_decode = isfinite(i) && i > 0 ? i : 0;
        }
        if (!isfinite(L->weight_decode) || L->weight_decode <= 0) {
            snprintf(why, why_n, "%s: its global scale is missing, non-finite or not positive (run fp4doctor scan)",
                     module);
            free(module);
            return false;
        }
    }
    snprintf(L->module, sizeof L->module, "%s", module);
    snprintf(L->desc, sizeof L->desc, "%s%s%lld: %s [%lld x %lld]", module, expert >= 0 && gptoss ? " expert " : "",
             (long long)(expert >= 0 && gptoss ? expert : 0), mx ? "mxfp4" : "nvfp4", (long long)L->n, (long long)L->k);
    if (!(expert >= 0 && gptoss))
        snprintf(L->desc, sizeof L->desc, "%s: %s [%lld x %lld]", module, mx ? "mxfp4" : "nvfp4", (long long)L->n,
                 (long long)L->k);
    free(module);
    return true;
bad_shape:
    snprintf(why, why_n, "%s: shapes of %s and %s do not form a packed FP4 matrix and its scales (run fp4doctor scan)",
             module, w->name, sc->name);
    free(module);
    return false;
}

/* ---- one tensor-parallel rank's shard ------------------------------------------------------- */

/* Replaces L's matrix by rank's shard at TP degree tp, as engines cut it (scan_tp_plan):
 * row-parallel layers keep every row and the rank's K / tp columns with their scale columns,
 * the others the rank's N / tp contiguous rows; k_proj and v_proj with fewer KV heads than
 * ranks, the one whole head the rank shares with tp / num_key_value_heads others, and a fused
 * qkv_proj or gate_up_proj the rank's rows of each part (h: config.json's heads, zero when
 * unknown). The global
 * scales are per tensor, the same on every rank. A shard engines refuse is a usage error, said
 * in why; note gets the padded-scale warning scan gives (empty when none). */
static int layer_shard(replay_layer *L, const scan_heads *h, int tp, int rank, char *why, size_t why_n, char *note,
                       size_t note_n)
{
    note[0] = '\0';
    if (tp <= 1) return FP4D_EXIT_OK;
    const int64_t block = layer_block(L), n = L->n, k = L->k;
    const bool mx = L->format == FP4D_DTYPE_MXFP4;
    const scan_tp_cut cut = scan_tp_plan(L->module, n, k, block, mx, h, tp);
    const bool split_k = cut.split_k;
    const char *how = split_k ? "along K, row-parallel" : "along its output rows N, column-parallel";
    if (cut.problem == SCAN_TP_HEADS) {
        snprintf(why, why_n, "%.200s: %s; engines refuse it at --tp %d (fp4doctor scan --tp %d lists every such layer)",
                 L->desc, scan_tp_heads_why(&cut, L->module, tp, (char[400]){0}, 400), tp, tp);
        return FP4D_EXIT_USAGE;
    }
    if (cut.problem == SCAN_TP_UNEVEN && cut.num_parts) {
        snprintf(why, why_n, "%.200s: " SCAN_TP_GATE_UP_UNEVEN "; engines refuse it at --tp %d (fp4doctor scan --tp %d "
                 "lists every such layer)", L->desc, (long long)cut.parts[0].all, tp, tp, tp);
        return FP4D_EXIT_USAGE;
    }
    if (cut.problem == SCAN_TP_UNEVEN) {
        snprintf(why, why_n, "%.200s: %s = %lld cannot be split evenly between %d tensor-parallel ranks (split %s); "
                 "engines refuse it at --tp %d (fp4doctor scan --tp %d lists every such layer)", L->desc,
                 split_k ? "K" : "N", (long long)(split_k ? k : n), tp, how, tp, tp);
        return FP4D_EXIT_USAGE;
    }
    if (cut.problem == SCAN_TP_SPLIT_BLOCK) {
        snprintf(why, why_n, "%.200s: at --tp %d each rank holds K = %lld, which splits a %lld-element scale block "
                 "between two ranks; engines refuse it (fp4doctor scan --tp %d lists every such layer)", L->desc, tp,
                 (long long)cut.per_rank, (long long)block, tp);
        return FP4D_EXIT_USAGE;
    }
    const int slice = rank / cut.replicas;
    const int64_t rn = split_k ? n : cut.per_rank, rk = split_k ? cut.per_rank : k;
    const int64_t k0 = split_k ? (int64_t)slice * rk : 0;
    uint8_t *codes = malloc((size_t)(rn * rk / 2)), *scales = malloc((size_t)(rn * (rk / block)));
    if (!codes || !scales) {
        free(codes);
        free(scales);
        snprintf(why, why_n, "out of memory");
        return FP4D_EXIT_INTERNAL;
    }
    for (int64_t r = 0; r < rn; r++) {
        const int64_t src = split_k ? r : scan_tp_source_row(&cut, rank, r);
        memcpy(codes + r * (rk / 2), L->codes + src * (k / 2) + k0 / 2, (size_t)(rk / 2));
        memcpy(scales + r * (rk / block), L->scales + src * (k / block) + k0 / block, (size_t)(rk / block));
    }
    free(L->codes);
    free(L->scales);
    L->codes = codes;
    L->scales = scales;
    L->n = rn;
    L->k = rk;
    count_nan_scales(L);
    const int64_t row0 = split_k ? 0 : scan_tp_source_row(&cut, rank, 0);
    if (cut.num_parts) {
        /* "q rows 80..95, k rows 144..159, v rows 176..191" */
        char parts[200] = "";
        size_t used = 0;
        int64_t r = 0;
        bool shared = false;
        for (int i = 0; i < cut.num_parts && used < sizeof parts; i++) {
            const scan_tp_part *p = &cut.parts[i];
            const int64_t first = scan_tp_source_row(&cut, rank, r);
            used += (size_t)snprintf(parts + used, sizeof parts - used, "%s%s rows %lld..%lld", i ? ", " : "", p->name,
                                     (long long)first, (long long)(first + p->per_rank - 1));
            r += p->per_rank;
            shared = shared || p->replicas > 1;
        }
        snprintf(L->shard, sizeof L->shard, "rank %d of --tp %d: [%lld x %lld], by %s: %s%s", rank, tp, (long long)rn,
                 (long long)rk, cut.by_heads ? "heads" : "parts", parts,
                 shared ? " (one KV head, held alike by several ranks)" : "");
    } else if (cut.replicas > 1)
        snprintf(L->shard, sizeof L->shard, "rank %d of --tp %d: [%lld x %lld], KV head %d of %lld (rows %lld..%lld), "
                 "held alike by ranks %d..%d (fewer KV heads than ranks)", rank, tp, (long long)rn, (long long)rk,
                 slice, (long long)(tp / cut.replicas), (long long)row0, (long long)(row0 + rn - 1),
                 slice * cut.replicas, (slice + 1) * cut.replicas - 1);
    else
        snprintf(L->shard, sizeof L->shard, "rank %d of --tp %d: [%lld x %lld], split %s", rank, tp, (long long)rn,
                 (long long)rk, how);
    if (cut.problem == SCAN_TP_PADDED_SCALES)
        snprintf(note, note_n, "each rank's K = %lld is not a multiple of 32, so its " SCAN_TP_PADDED_SCALES_WHY,
                 (long long)rk);
    return FP4D_EXIT_OK;
}

/* ---- activations ------------------------------------------------------------------------------ */

static double gauss(uint64_t *s)
{
    uint64_t a = (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11;
    uint64_t b = (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11;
    double u = ((double)a + 0.5) * 0x1p-53, v = ((double)b + 0.5) * 0x1p-53;
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

typedef struct replay_act {
    fp4d_matrix a;
    void       *data;
    uint8_t    *scales;
    float      *deq;   /* [M, K] dequantized, for the error bound */
    float       alpha;
} replay_act;

static bool make_activations(const replay_layer *L, int64_t M, uint64_t seed, replay_act *A)
{
    memset(A, 0, sizeof *A);
    int64_t K = L->k;
    float *x = malloc((size_t)(M * K) * sizeof *x);
    A->deq = malloc((size_t)(M * K) * sizeof *A->deq);
    if (!x || !A->deq) {
        free(x);
        return false;
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    bool static_nvfp4 = L->format == FP4D_DTYPE_NVFP4 && L->input_decode > 0;
    double amax = static_nvfp4 ? L->input_decode * 2688.0 : 4.0;
    for (int64_t i = 0; i < M * K; i++) {
        double v = gauss(&s) * amax / 4.0;
        x[i] = (float)fmax(-amax, fmin(amax, v));
    }
    A->a.rows = M;
    A->a.cols = K;
    if (static_nvfp4) {
        fp4d_quantize_params qp = {FP4D_DTYPE_NVFP4, FP4D_CONV_FLASHINFER_EXACT, FP4D_LAYOUT_LINEAR,
                                   (float)(1.0 / L->input_decode)};
        fp4d_quantize_result qr;
        A->data = malloc((size_t)(M * K / 2));
        A->scales = malloc((size_t)(M * K / 16));
        if (!A->data || !A->scales ||
            fp4d_quantize(&qp, FP4D_DTYPE_F32, x, M, K, A->data, A->scales, &qr) != FP4D_STATUS_OK) {
            free(x);
            return false;
        }
        A->a.dtype = FP4D_DTYPE_NVFP4;
        A->a.scales = A->scales;
        A->a.scale_layout = FP4D_LAYOUT_LINEAR;
        fp4d_dequantize(FP4D_DTYPE_NVFP4, FP4D_LAYOUT_LINEAR, A->data, A->scales, 1.0f, M, K, A->deq);
        A->alpha = (float)(L->input_decode * L->weight_decode);
    } else {
        A->data = malloc((size_t)(M * K) * 2);
        if (!A->data) {
            free(x);
            return false;
        }
        fp4d_from_f32(FP4D_DTYPE_BF16, x, (size_t)(M * K), A->data);
        fp4d_to_f32(FP4D_DTYPE_BF16, A->data, (size_t)(M * K), A->deq);
        A->a.dtype = FP4D_DTYPE_BF16;
        A->alpha = (float)L->weight_decode;
    }
    A->a.data = A->data;
    free(x);
    return true;
}

/* ---- one backend in a child ---------------------------------------------------------------- */

double fp4d_replay_call_timeout(bool slow, int64_t m, int64_t n, int64_t k)
{
    /* Both calls at check's pessimistic speeds (tolerance.c: 20 M multiply-adds per second for
     * the exact reference and plugins, 100 M for the rest, 4x margin) on top of the fixed floor:
     * a fixed 120 s called the exact reference a hang on real layers at a few hundred rows
     * (2048 x 8192 at --rows 2048 needs ~4 minutes for its two exact GEMMs here). */
    const double macs = (double)m * (double)n * (double)k;
    return (REPLAY_TIMEOUT_S + 4.0 * 2.0 * macs / (slow ? 2e7 : 1e8)) * fp4d_timeout_scale();
}

typedef struct replay_shared {
    int32_t status;      /* fp4d_status of the run, or -1 unavailable, -2 unsupported */
    char    reason[FP4D_REASON_MAX];
} replay_shared;

static fp4d_verdict run_backend(const char *name, double limit_s, const fp4d_gemm_problem *proto, size_t out_bytes,
                                uint16_t *out1, uint16_t *out2, char *detail, size_t detail_n)
{
    replay_shared *sh = mmap(NULL, sizeof *sh + 2 * out_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        snprintf(detail, detail_n, "cannot map shared memory: %s", strerror(errno));
        return FP4D_VERDICT_ERROR;
    }
    uint16_t *o1 = (uint16_t *)(sh + 1), *o2 = o1 + out_bytes / 2;
    for (size_t i = 0; i < out_bytes / 2; i++) o1[i] = o2[i] = REPLAY_POISON;
    sh->status = FP4D_STATUS_INTERNAL;
    fflush(NULL);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (!fp4d_child_dies_with_parent(parent)) _exit(0); /* status stays INTERNAL */
        fp4d_backend_t b = NULL;
        fp4d_reason why = {{0}};
        if (fp4d_backend_open(name, -1, &b, &why) != FP4D_STATUS_OK) {
            sh->status = -1;
            memcpy(sh->reason, why.text, sizeof sh->reason);
            _exit(0);
        }
        fp4d_gemm_problem p = *proto;
        p.out = o1;
        fp4d_status st = fp4d_backend_gemm(b, &p, &why);
        if (st == FP4D_STATUS_OK) {
            p.out = o2;
            st = fp4d_backend_gemm(b, &p, &why);
        }
        sh->status = st == FP4D_STATUS_UNSUPPORTED ? -2 : (int32_t)st;
        snprintf(sh->reason, sizeof sh->reason, "%s", st == FP4D_STATUS_OK ? "" : why.text[0] ? why.text : fp4d_last_error());
        fp4d_backend_close(b);
        _exit(0);
    }
    fp4d_verdict v = FP4D_VERDICT_PASS;
    if (pid < 0) {
        snprintf(detail, detail_n, "fork failed: %s", strerror(errno));
        v = FP4D_VERDICT_ERROR;
    } else {
        int wst = 0;
        double t0 = fp4d_now_s();
        for (;;) {
            pid_t r = waitpid(pid, &wst, WNOHANG);
            if (r == pid) break;
            if (fp4d_now_s() - t0 > limit_s) {
                kill(pid, SIGKILL);
                waitpid(pid, &wst, 0);
                v = FP4D_VERDICT_TIMEOUT;
                snprintf(detail, detail_n, "no answer after %.0f s", limit_s);
                break;
            }
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (v == FP4D_VERDICT_PASS && WIFSIGNALED(wst)) {
            v = FP4D_VERDICT_CRASH;
            snprintf(detail, detail_n, "killed by signal %d (%s)", WTERMSIG(wst), strsignal(WTERMSIG(wst)));
        } else if (v == FP4D_VERDICT_PASS && sh->status == -1) {
            v = FP4D_VERDICT_COUNT; /* unavailable here: not a verdict */
            snprintf(detail, detail_n, "%s", sh->reason);
        } else if (v == FP4D_VERDICT_PASS && sh->status == -2) {
            v = FP4D_VERDICT_UNSUPPORTED;
            snprintf(detail, detail_n, "%s", sh->reason);
        } else if (v == FP4D_VERDICT_PASS && sh->status != FP4D_STATUS_OK) {
            v = FP4D_VERDICT_ERROR;
            snprintf(detail, detail_n, "%s: %s", fp4d_status_name((fp4d_status)sh->status), sh->reason);
        }
    }
    memcpy(out1, o1, out_bytes);
    memcpy(out2, o2, out_bytes);
    munmap(sh, sizeof *sh + 2 * out_bytes);
    return v;
}

/* ---- judging ----------------------------------------------------------------------------------- */

typedef struct sample {
    int64_t m, n;
    double  exact;     /* exact value rounded to double */
    double  bound;     /* |alpha| * sum_k |a||b|: scale of the rounding errors */
    float   ref_bf16;  /* the exact value rounded once to bf16 */
} sample;

static fp4d_verdict judge(const sample *smp, size_t ns, const uint16_t *o1, const uint16_t *o2, int64_t M, int64_t N,
                          int64_t K, double *worst_ratio, char *detail, size_t detail_n)
{
    size_t total = (size_t)(M * N);
    for (size_t i = 0; i < total; i++)
        if (o1[i] == REPLAY_POISON) {
            snprintf(detail, detail_n, "output element (%zu, %zu) never written", i / (size_t)N, i % (size_t)N);
            return FP4D_VERDICT_UNWRITTEN;
        }
    bool all_zero = true, exact_zero = true;
    for (size_t i = 0; i < total; i++) all_zero &= (o1[i] & 0x7FFF) == 0;
    fp4d_verdict v = FP4D_VERDICT_PASS;
    *worst_ratio = 0;
    for (size_t i = 0; i < ns; i++) {
        const sample *s = &smp[i];
        double got = fp4d_bf16_to_f32(o1[s->m * N + s->n]);
        exact_zero &= s->exact == 0;
        if (!isfinite(s->exact)) continue;
        if (isnan(got)) {
            snprintf(detail, detail_n, "NaN at (%lld, %lld), exact %.6g", (long long)s->m, (long long)s->n, s->exact);
            return FP4D_VERDICT_NAN;
        }
        if (isinf(got)) {
            snprintf(detail, detail_n, "Inf at (%lld, %lld), exact %.6g", (long long)s->m, (long long)s->n, s->exact);
            return FP4D_VERDICT_INF;
        }
        /* fp32 accumulation of K products, then one bf16 rounding; the practical tolerance is
         * what users of bf16 outputs accept (2^-7 of the magnitude of the sum). */
        double ulp = fabs(s->ref_bf16) > 0 ? ldexp(1.0, ilogb(s->ref_bf16) - 7) : 0x1p-133;
        double strict = (double)K * 0x1p-23 * s->bound + ulp;
        double practical = 0x1p-7 * s->bound + 2 * ulp;
        double err = fabs(got - s->exact);
        if (strict > 0 && err / strict > *worst_ratio) *worst_ratio = err / strict;
        if (err > practical && v != FP4D_VERDICT_WRONG) {
            v = FP4D_VERDICT_WRONG;
            snprintf(detail, detail_n, "(%lld, %lld) = %.6g, exact %.6g", (long long)s->m, (long long)s->n, got, s->exact);
        } else if (err > strict && v == FP4D_VERDICT_PASS) {
            v = FP4D_VERDICT_INACCURATE;
            snprintf(detail, detail_n, "(%lld, %lld) = %.6g, exact %.6g (beyond the fp32 bound, within practical)",
                     (long long)s->m, (long long)s->n, got, s->exact);
        }
    }
    if (all_zero && !exact_zero) {
        snprintf(detail, detail_n, "every output element is 0");
        return FP4D_VERDICT_ZEROS;
    }
    if (v == FP4D_VERDICT_PASS && memcmp(o1, o2, total * 2)) {
        snprintf(detail, detail_n, "two runs on the same inputs differ");
        return FP4D_VERDICT_NONDETERMINISTIC;
    }
    return v;
}

static bool name_selected(const char *list, const char *name)
{
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        size_t k = c ? (size_t)(c - p) : strlen(p);
        if (k == n && !strncmp(p, name, n)) return true;
        p += k + (c ? 1 : 0);
    }
    return false;
}

/* The --backend list checked against the registry: an empty item or a name no backend has is
 * a usage error, said before the layer is loaded and the reference computed (unknown names
 * were dropped in silence: "cpu,cuda-typo" ran cpu alone and passed). */
static bool backends_valid(const char *list)
{
    if (!list) return true;
    for (const char *p = list;;) {
        const char *c = strchr(p, ',');
        size_t k = c ? (size_t)(c - p) : strlen(p);
        char name[128];
        if (!k) {
            fprintf(stderr, "fp4doctor replay: --backend: empty name in '%s'\n", list);
            return false;
        }
        snprintf(name, sizeof name, "%.*s", (int)k, p);
        if (k >= sizeof name || !fp4d_registry_find(name)) {
            fprintf(stderr, "fp4doctor replay: --backend: unknown backend '%s' (see fp4doctor backends)\n", name);
            return false;
        }
        /* each name once, as check and bench take them (the second was dropped in silence) */
        for (const char *q = list; q < p;) {
            const char *qc = strchr(q, ',');
            if ((size_t)(qc - q) == k && !strncmp(q, p, k)) {
                fprintf(stderr, "fp4doctor replay: --backend names '%s' twice\n", name);
                return false;
            }
            q = qc + 1;
        }
        if (!c) return true;
        p = c + 1;
    }
}

int fp4d_replay_run(const fp4d_replay_options *opt, FILE *out, bool color)
{
    if (!opt->layer[0]) {
        fprintf(stderr, "fp4doctor replay: --layer needs a NAME, not ''\n");
        return FP4D_EXIT_USAGE;
    }
    if (opt->tp > 1 && (opt->rank < 0 || opt->rank >= opt->tp)) {
        fprintf(stderr, "fp4doctor replay: --rank %d is not a rank of --tp %d (0..%d)\n", opt->rank, opt->tp,
                opt->tp - 1);
        return FP4D_EXIT_USAGE;
    }
    fp4d_registry_options ro = {0};
    ro.include_faulty = opt->backends && strstr(opt->backends, "faulty") != NULL;
    const fp4d_status registry = fp4d_registry_init(&ro);
    if (registry != FP4D_STATUS_OK) {
        /* mapped as cli_registry_failed maps it for backends and check (the CLI's helper is
         * not the library's to call): a plugin that cannot be loaded (FP4DOCTOR_PLUGINS) is an
         * input we could not read, 3; only the process failing is 4 */
        fprintf(stderr, "fp4doctor replay: backend registry: %s\n", fp4d_last_error());
        return registry == FP4D_STATUS_NOMEM || registry == FP4D_STATUS_INTERNAL ? FP4D_EXIT_INTERNAL
                                                                                  : FP4D_EXIT_INPUT;
    }
    if (!backends_valid(opt->backends)) return FP4D_EXIT_USAGE;
    char why[1024] = "";
    replay_shards s;
    const int opened = shards_open(&s, opt->checkpoint, why, sizeof why);
    if (opened != FP4D_EXIT_OK) {
        shards_free(&s);
        fprintf(stderr, "fp4doctor replay: %s\n", why[0] ? why : "out of memory");
        return opened;
    }
    replay_layer L;
    const bool loaded = layer_load(&s, opt->layer, &L, why, sizeof why);
    /* a lookup the checkpoint cannot answer (a shard without the tensor its index names, two
     * un-indexed copies) outranks what layer_load made of it: "no layer" would be misleading,
     * and a layer read from either copy could be the one no loader reads */
    if (!loaded || s.problem[0]) {
        fprintf(stderr, "fp4doctor replay: %s\n", s.problem[0] ? s.problem : why[0] ? why : "out of memory");
        shards_free(&s);
        free(L.codes);
        free(L.scales);
        return FP4D_EXIT_INPUT;
    }
    shards_free(&s);
    char note[512];
    /* attention projections are cut by head: the head counts come from config.json */
    scan_heads heads = {0};
    struct stat ckpt_st;
    if (opt->tp > 1 && stat(opt->checkpoint, &ckpt_st) == 0 && S_ISDIR(ckpt_st.st_mode)) {
        bool found = false;
        char cfg_why[256];
        if (scan_heads_load(opt->checkpoint, &heads, &found, cfg_why, sizeof cfg_why) != FP4D_STATUS_OK) {
            fprintf(stderr, "fp4doctor replay: %s\n", fp4d_last_error());
            free(L.codes);
            free(L.scales);
            return FP4D_EXIT_INTERNAL;
        }
        if (cfg_why[0])
            fprintf(stderr, "fp4doctor replay: cannot use config.json (%s); attention projections are cut by rows, "
                    "not by heads (run fp4doctor scan)\n", cfg_why);
    }
    const int sharded = layer_shard(&L, &heads, opt->tp, opt->rank, why, sizeof why, note, sizeof note);
    if (sharded != FP4D_EXIT_OK) {
        fprintf(stderr, "fp4doctor replay: %s\n", why);
        free(L.codes);
        free(L.scales);
        return sharded;
    }
    int64_t M = opt->rows > 0 ? opt->rows : 16, N = L.n, K = L.k;
    replay_act A;
    int rc = FP4D_EXIT_OK;
    if (!make_activations(&L, M, opt->seed, &A)) {
        fprintf(stderr, "fp4doctor replay: cannot build activations: %s\n", fp4d_last_error());
        free(L.codes);
        free(L.scales);
        return FP4D_EXIT_INTERNAL;
    }
    fp4d_gemm_problem p = {0};
    p.a = A.a;
    p.b = (fp4d_matrix){L.format, N, K, L.codes, L.scales, FP4D_LAYOUT_LINEAR};
    p.alpha = A.alpha;
    p.out_type = FP4D_DTYPE_BF16;
    /* The exact reference on a sample of elements (all of them when few). */
    size_t ns = (size_t)(M * N) <= REPLAY_MAX_SAMPLES ? (size_t)(M * N) : REPLAY_MAX_SAMPLES;
    sample *smp = calloc(ns, sizeof *smp);
    float *bdeq = malloc((size_t)K * sizeof *bdeq);
    size_t out_bytes = (size_t)(M * N) * 2;
    uint16_t *o1 = malloc(out_bytes), *o2 = malloc(out_bytes);
    if (!smp || !bdeq || !o1 || !o2) {
        rc = FP4D_EXIT_INTERNAL;
        goto done;
    }
    size_t nonfinite = 0; /* sampled elements whose exact value is NaN/Inf: not judged */
    uint64_t rs = opt->seed + 99;
    int64_t block = L.format == FP4D_DTYPE_NVFP4 ? 16 : 32;
    for (size_t i = 0; i < ns; i++) {
        sample *q = &smp[i];
        if (ns == (size_t)(M * N)) {
            q->m = (int64_t)i / N;
            q->n = (int64_t)i % N;
        } else {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            q->m = (int64_t)((rs >> 33) % (uint64_t)M);
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            q->n = (int64_t)((rs >> 33) % (uint64_t)N);
        }
        uint16_t r16;
        if (fp4d_ref_gemm_element(&p, q->m, q->n, &r16, &q->exact) != FP4D_STATUS_OK) {
            fprintf(stderr, "fp4doctor replay: reference failed: %s\n", fp4d_last_error());
            rc = FP4D_EXIT_INTERNAL;
            goto done;
        }
        q->ref_bf16 = fp4d_bf16_to_f32(r16);
        nonfinite += !isfinite(q->exact);
        fp4d_dequantize(L.format, FP4D_LAYOUT_LINEAR, L.codes + q->n * K / 2, L.scales + q->n * (K / block), 1.0f, 1,
                        K, bdeq);
        double sum = 0;
        for (int64_t k = 0; k < K; k++) sum += fabs((double)A.deq[q->m * K + k] * bdeq[k]);
        q->bound = fabs((double)p.alpha) * sum;
    }
    const char *bold = color ? "\033[1m" : "", *red = color ? "\033[31;1m" : "", *green = color ? "\033[32m" : "",
               *dim = color ? "\033[2m" : "", *reset = color ? "\033[0m" : "";
    fprintf(out, "%sfp4doctor replay%s %s\n  layer %s%s%s\n  alpha %.6g, activations %s [%lld x %lld]%s, %zu elements "
                 "checked exactly\n\n",
            bold, reset, opt->checkpoint, L.desc, L.shard[0] ? "\n  shard " : "", L.shard, (double)p.alpha, A.a.dtype == FP4D_DTYPE_NVFP4 ? "nvfp4" : "bf16",
            (long long)M, (long long)K, L.input_decode > 0 && L.format == FP4D_DTYPE_NVFP4 ? " at its input scale" : "",
            ns);
    if (note[0]) fprintf(out, "  note: %s\n\n", note);
    size_t ran = 0;
    for (size_t i = 0; i < fp4d_registry_count(); i++) {
        const fp4d_backend_iface *bi = fp4d_registry_get(i);
        if (!bi || !name_selected(opt->backends, bi->name)) continue;
        if (!opt->backends && bi->kind == FP4D_BACKEND_KIND_FAULTY) continue;
        char detail[FP4D_DETAIL_MAX] = "";
        double ratio = 0;
        const double limit = fp4d_replay_call_timeout(
            bi->kind == FP4D_BACKEND_KIND_REFERENCE || bi->kind == FP4D_BACKEND_KIND_PLUGIN, M, N, K);
        fp4d_verdict v = run_backend(bi->name, limit, &p, out_bytes, o1, o2, detail, sizeof detail);
        if (v == FP4D_VERDICT_COUNT) {
            fprintf(out, "  %-16s %sunavailable%s  %s\n", bi->name, dim, reset, detail);
            continue;
        }
        if (v == FP4D_VERDICT_PASS) v = judge(smp, ns, o1, o2, M, N, K, &ratio, detail, sizeof detail);
        ran++;
        bool bad = fp4d_verdict_is_failure(v);
        if (bad) rc = FP4D_EXIT_FAILED;
        fprintf(out, "  %-16s %s%-16s%s", bi->name, bad ? red : green, fp4d_verdict_name(v), reset);
        if (v == FP4D_VERDICT_PASS || v == FP4D_VERDICT_INACCURATE) fprintf(out, " max err %.2f x fp32 bound", ratio);
        if (detail[0]) fprintf(out, " %s", detail);
        fputc('\n', out);
    }
    if (!ran) {
        fprintf(stderr, "fp4doctor replay: no backend ran (names: see fp4doctor backends)\n");
        if (rc == FP4D_EXIT_OK) rc = opt->backends ? FP4D_EXIT_USAGE : FP4D_EXIT_FAILED;
    }
    /* The backends are judged on the finite elements only; a layer whose own exact outputs are
     * NaN/Inf is broken in every engine, which scan calls an error: it was PASS and exit 0. */
    if (L.nan_scales || nonfinite) {
        fprintf(out, "\n  %sthe layer itself is broken%s: ", red, reset);
        if (L.nan_scales)
            fprintf(out, "%llu of %llu block scales are NaN codes, so the outputs touching them are NaN (some engines: "
                         "huge) whatever the backend",
                    (unsigned long long)L.nan_scales, (unsigned long long)L.num_scales);
        else
            fprintf(out, "%zu of the %zu elements checked are NaN/Inf in the exact result", nonfinite, ns);
        fprintf(out, "; those elements are not judged (run fp4doctor scan)\n");
        if (rc == FP4D_EXIT_OK) rc = FP4D_EXIT_FAILED;
    }
done:
    free(smp);
    free(bdeq);
    free(o1);
    free(o2);
    free(A.data);
    free(A.scales);
    free(A.deq);
    free(L.codes);
    free(L.scales);
    return rc;
}
