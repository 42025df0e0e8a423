/*
 * scan.c - the checkpoint doctor (spec §7, docs/scan.md).
 *
 * Phases, in order:
 *   1. the checkpoint model: configs, the index, every shard's header (strict reader first;
 *      the forgiving one in header.c only to recover names from a rejected file);
 *   2. structure: index consistency, duplicates, quantized linears grouped by companion
 *      names, dtypes, shapes, orphans, the quant config's exclusions;
 *   3. values: global/input scales (tiny, read directly), then block scales and packed
 *      codes (and unquantized tensors) read in bounded chunks by all threads;
 *   4. the writer fingerprint, per-layer and per-expert counts.
 *
 * Data is read with pread() into a few MiB per thread rather than mapped: mapped pages of
 * a 200 GB checkpoint would all count as resident, and the memory held must stay bounded.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fp4doctor/formats.h"
#include "fp4doctor/io.h"
#include "fp4doctor/scan.h"
#include "internal.h"
#include "scan/scan_internal.h"

#define SCAN_CHUNK_BYTES     (1u << 20) /* per read: stays in L2 between the copy and the checks */
#define SCAN_MAX_GLOBAL_ELEMS (1u << 20)
#define SCAN_OUTLIER_OCTAVES 10.0       /* docs/scan.md: 1024x away from the median */
#define SCAN_OUTLIER_MIN_SCALES 32

/* ---- names of things ------------------------------------------------------------------- */

static const char *const finding_names[FP4D_FINDING_COUNT_] = {
#define FP4D_FINDING_NAME_(name, num) [num] = #name,
    FP4D_FINDING_LIST(FP4D_FINDING_NAME_)
#undef FP4D_FINDING_NAME_
};

const char *fp4d_finding_code_name(fp4d_finding_code c)
{
    if ((unsigned)c >= FP4D_FINDING_COUNT_) return "UNKNOWN";
    return finding_names[c];
}

bool fp4d_finding_code_from_name(const char *s, fp4d_finding_code *out)
{
    for (int i = 0; s && i < FP4D_FINDING_COUNT_; i++)
        if (!strcmp(s, finding_names[i])) {
            if (out) *out = (fp4d_finding_code)i;
            return true;
        }
    return false;
}

const char *fp4d_scan_severity_name(fp4d_scan_severity s)
{
    switch (s) {
    case FP4D_SCAN_INFO: return "info";
    case FP4D_SCAN_WARNING: return "warning";
    case FP4D_SCAN_ERROR: return "error";
    }
    return "unknown";
}

static const char *const format_names[FP4D_CKPT_FORMAT_COUNT] = {
    [FP4D_CKPT_UNQUANTIZED]    = "unquantized",
    [FP4D_CKPT_MODELOPT_NVFP4] = "modelopt-nvfp4",
    [FP4D_CKPT_CT_NVFP4]       = "compressed-tensors-nvfp4",
    [FP4D_CKPT_CT_MXFP4]       = "compressed-tensors-mxfp4",
    [FP4D_CKPT_GPTOSS_MXFP4]   = "gpt-oss-mxfp4",
};

/* ---- the model --------------------------------------------------------------------------- */

typedef enum file_state {
    FILE_OK,          /* header valid: every tensor trusted */
    FILE_PARTIAL,     /* header valid, data cut short: tensors before the cut are readable */
    FILE_NAMES_ONLY,  /* header rejected but parsed: names known, nothing else trusted */
    FILE_UNREADABLE,  /* nothing usable */
    FILE_MISSING      /* referenced by the index, not on disk */
} file_state;

typedef struct scan_file {
    char      *rel;          /* as named by the index / directory listing */
    char      *path;
    int        fd;
    uint64_t   size;
    uint64_t   data_start;   /* 8 + header length */
    file_state state;
    uint64_t   index_tensors; /* weight_map entries naming this file */
} scan_file;

typedef struct scan_tensor {
    char         *name;
    int32_t       file;
    fp4d_st_dtype dtype;
    int32_t       ndim;
    int64_t       shape[FP4D_ST_MAX_DIMS];
    uint64_t      begin, end;
    bool          in_shard;  /* named by a shard's header (not only by the index) */
    bool          trusted;   /* dtype, shape and offsets come from a valid header */
    bool          readable;  /* trusted and its bytes lie inside the file */
    bool          claimed;   /* part of a quantized linear */
} scan_tensor;

typedef enum unit_kind {
    UNIT_MO_NVFP4,   /* X.weight, X.weight_scale, X.weight_scale_2, X.input_scale */
    UNIT_MO_MXFP4,   /* X.weight, X.weight_scale (ue8m0), X.input_scale optional */
    UNIT_CT_NVFP4,   /* X.weight_packed, X.weight_scale, X.weight_global_scale, X.input_global_scale */
    UNIT_CT_MXFP4,   /* X.weight_packed, X.weight_scale (ue8m0) */
    UNIT_GPTOSS      /* X_blocks [.., G, 16], X_scales [.., G] */
} unit_kind;

typedef struct scan_unit {
    unit_kind kind;
    char     *module;      /* X */
    int64_t   weight, scale, global, input; /* tensor indices, -1 when absent */
    bool      is_mx;
    bool      format_untold; /* ModelOpt X.weight with no scale, nothing saying NVFP4 or MXFP4 */
    int64_t   block;       /* 16 or 32 elements per scale */
    bool      joint_ok;    /* weight and scale shapes agree: codes can be checked per block */
    int64_t   rows, scale_cols, block_bytes;
    int64_t   num_experts, rows_per_expert; /* fused experts along dim 0, else 0 */
    pthread_mutex_t lock;
    bool      scanned;     /* scale bytes were read */
    bool      data_scanned;
    uint64_t  hist[256];       /* every block-scale byte */
    uint64_t  zero_hist[256];  /* scale bytes of blocks whose codes are all +-0 */
    uint64_t  znz_blocks;      /* zero scale over non-zero codes */
    uint64_t  znz_unexplained; /* ... whose codes are not the +-6 underflow pattern */
    uint64_t *exp_nan, *exp_neg, *exp_znz;
} scan_unit;

typedef struct plain_target {
    int64_t   tensor;
    uint64_t  nonfinite;
    int64_t   num_experts, elems_per_expert;
    uint64_t *exp_nonfinite;
    pthread_mutex_t lock;
} plain_target;

typedef enum job_kind { JOB_UNIT, JOB_PLAIN } job_kind;
typedef struct scan_job {
    job_kind kind;
    int64_t  target;
    uint64_t first, count; /* unit: rows; plain: elements */
} scan_job;

typedef struct finding_rec {
    fp4d_scan_finding pub;
    char             *tensor, *file, *message;
    fp4d_expert_count *experts;
} finding_rec;

struct fp4d_scan_report {
    char             *path;
    fp4d_ckpt_format  format;
    bool              mixed;
    bool              modelopt_mxfp4; /* format is FP4D_CKPT_MODELOPT_NVFP4, the layers MXFP4 */
    bool              mxfp4_only;     /* every quantized linear is MXFP4: no global scales */
    bool              scales_only;
    char             *writer;
    char             *writer_confidence;
    int               zero_block_byte;   /* -1 unknown */
    uint64_t          zero_block_count;
    const char       *convention;        /* "decode", "encode" or NULL */
    char            **notes;
    size_t            num_notes;
    finding_rec      *findings;
    size_t            num_findings, cap_findings;
    uint64_t          files, tensors, units, bytes_scanned, bytes_total;
};

typedef struct scan_ctx {
    const char          *root;      /* directory, or NULL for a single file */
    fp4d_scan_options    opt;
    fp4d_scan_report    *rep;
    fp4d_quant_config   *qc;
    fp4d_ckpt_format     format;
    bool                 have_config;
    scan_heads           heads;     /* config.json's attention heads (--tp cuts attention by head) */
    /* index */
    bool                 have_index;
    json_t              *weight_map;
    char               **unindexed;   /* shard-named files in the folder the index does not name */
    size_t               num_unindexed;
    /* model */
    scan_file           *files;
    size_t               num_files, cap_files;
    json_t              *file_ids;  /* rel -> index into files: an index may name 100,000s of shards */
    scan_tensor         *tensors;
    size_t               num_tensors, cap_tensors;
    int64_t             *map;      /* open addressing: tensor index + 1, 0 = empty */
    size_t               map_cap;
    scan_unit           *units;
    size_t               num_units;
    plain_target        *plains;
    size_t               num_plains;
    scan_job            *jobs;
    size_t               num_jobs;
    atomic_size_t        next_job;
    atomic_uint_fast64_t bytes_done;
    atomic_int           workers_left;
    pthread_mutex_t      done_lock;
    pthread_cond_t       done_cond;
    atomic_bool          io_failed;
    int                  fingerprint_byte; /* for scales-only outlier exclusion */
} scan_ctx;

/* ---- findings -------------------------------------------------------------------------- */

static char *scan_strdup(const char *s) { return s ? strdup(s) : NULL; }

FP4D_PRINTF(7, 8)
static fp4d_status add_finding(scan_ctx *c, fp4d_finding_code code, fp4d_scan_severity sev, const char *tensor,
                               const char *file, uint64_t count, const char *fmt, ...)
{
    fp4d_scan_report *r = c->rep;
    if (r->num_findings == r->cap_findings) {
        size_t cap = r->cap_findings ? r->cap_findings * 2 : 32;
        finding_rec *g = realloc(r->findings, cap * sizeof *g);
        if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        r->findings = g;
        r->cap_findings = cap;
    }
    finding_rec *f = &r->findings[r->num_findings];
    memset(f, 0, sizeof *f);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* names from the checkpoint inside: no terminal escapes, and whole UTF-8 (a cut sequence
     * at the end made the JSON writer drop the message) */
    fp4d_text_clean(msg);
    f->tensor  = scan_strdup(tensor);
    f->file    = scan_strdup(file);
    f->message = strdup(msg);
    if ((tensor && !f->tensor) || (file && !f->file) || !f->message) {
        free(f->tensor);
        free(f->file);
        free(f->message);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    f->pub.code     = code;
    f->pub.severity = sev;
    f->pub.count    = count;
    f->pub.layer    = tensor ? scan_name_layer(tensor) : -1;
    f->pub.expert   = tensor ? scan_name_expert(tensor) : -1;
    r->num_findings++;
    return FP4D_STATUS_OK;
}

/* Attaches a per-expert split to the finding just added. */
static void finding_set_experts(scan_ctx *c, const uint64_t *per_expert, int64_t n)
{
    if (!per_expert || n <= 0 || !c->rep->num_findings) return;
    finding_rec *f = &c->rep->findings[c->rep->num_findings - 1];
    size_t k = 0;
    for (int64_t e = 0; e < n; e++) k += per_expert[e] != 0;
    if (!k) return;
    f->experts = calloc(k, sizeof *f->experts);
    if (!f->experts) return;
    k = 0;
    for (int64_t e = 0; e < n; e++)
        if (per_expert[e]) f->experts[k++] = (fp4d_expert_count){e, per_expert[e]};
    f->pub.num_experts = k;
}

static fp4d_status add_note(scan_ctx *c, const char *text)
{
    fp4d_scan_report *r = c->rep;
    for (size_t i = 0; i < r->num_notes; i++)
        if (!strcmp(r->notes[i], text)) return FP4D_STATUS_OK;
    char **g = realloc(r->notes, (r->num_notes + 1) * sizeof *g);
    if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    r->notes = g;
    r->notes[r->num_notes] = strdup(text);
    if (!r->notes[r->num_notes]) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    r->num_notes++;
    return FP4D_STATUS_OK;
}

/* ---- tensor table with a name map ------------------------------------------------------------- */

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

static int64_t find_tensor(const scan_ctx *c, const char *name)
{
    if (!c->map_cap || !name) return -1;
    size_t mask = c->map_cap - 1;
    for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
        int64_t v = c->map[i];
        if (!v) return -1;
        if (!strcmp(c->tensors[v - 1].name, name)) return v - 1;
    }
}

static fp4d_status map_insert(scan_ctx *c, int64_t idx)
{
    if ((c->num_tensors + 1) * 2 > c->map_cap) {
        size_t cap = c->map_cap ? c->map_cap * 2 : 1024;
        while (cap < (c->num_tensors + 1) * 2) cap *= 2;
        int64_t *m = calloc(cap, sizeof *m);
        if (!m) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        for (size_t i = 0; i < c->map_cap; i++) {
            if (!c->map[i]) continue;
            size_t j = (size_t)name_hash(c->tensors[c->map[i] - 1].name) & (cap - 1);
            while (m[j]) j = (j + 1) & (cap - 1);
            m[j] = c->map[i];
        }
        free(c->map);
        c->map = m;
        c->map_cap = cap;
    }
    size_t j = (size_t)name_hash(c->tensors[idx].name) & (c->map_cap - 1);
    while (c->map[j]) j = (j + 1) & (c->map_cap - 1);
    c->map[j] = idx + 1;
    return FP4D_STATUS_OK;
}

/* Adds a tensor; the name map keeps the first of duplicates. */
static fp4d_status add_tensor(scan_ctx *c, const scan_tensor *t)
{
    if (c->num_tensors == c->cap_tensors) {
        size_t cap = c->cap_tensors ? c->cap_tensors * 2 : 256;
        scan_tensor *g = realloc(c->tensors, cap * sizeof *g);
        if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        c->tensors = g;
        c->cap_tensors = cap;
    }
    c->tensors[c->num_tensors] = *t;
    c->tensors[c->num_tensors].name = strdup(t->name);
    if (!c->tensors[c->num_tensors].name) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    int64_t idx = (int64_t)c->num_tensors++;
    if (find_tensor(c, t->name) < 0) return map_insert(c, idx);
    return FP4D_STATUS_OK;
}

static uint64_t tensor_elems(const scan_tensor *t)
{
    uint64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static const char *file_rel(const scan_ctx *c, int32_t f) { return f >= 0 ? c->files[f].rel : NULL; }

/* ---- phase 1: reading the checkpoint's files -------------------------------------------------- */

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* read_small_file: see scan_internal.h. */
fp4d_status scan_read_small_file(const char *path, char **text, size_t *len_out, small_file_state *state, char *why,
                                 size_t why_len)
{
    *text = NULL;
    *len_out = 0;
    *state = SMALL_FILE_UNREADABLE;
    why[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block: refused below */
    if (fd < 0) {
        const int err = errno;
        if (fp4d_st_resource_errno(err))
            return fp4d_set_error(FP4D_STATUS_NOMEM, "cannot open %s: %s (a limit of this process: raise `ulimit -n` "
                                  "or memory)", path, strerror(err));
        struct stat ls;
        if (err == ENOENT && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
            snprintf(why, why_len, "a symbolic link to a missing file");
        else if (err == ENOENT || err == ENOTDIR)
            *state = SMALL_FILE_ABSENT;
        else
            snprintf(why, why_len, "%s", strerror(err));
        return FP4D_STATUS_OK;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) snprintf(why, why_len, "%s", strerror(errno));
    else if (!S_ISREG(st.st_mode)) snprintf(why, why_len, "not a regular file");
    else if (st.st_size > (256 << 20)) snprintf(why, why_len, "%lld bytes, over the 256 MiB limit", (long long)st.st_size);
    if (why[0]) {
        close(fd);
        return FP4D_STATUS_OK;
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, buf + got, len - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(why, why_len, "%s", strerror(errno));
            close(fd);
            free(buf);
            return FP4D_STATUS_OK;
        }
        if (n == 0) break; /* cut while we read: what is there is parsed */
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *text = buf;
    *len_out = got;
    *state = SMALL_FILE_READ;
    return FP4D_STATUS_OK;
}

static fp4d_status load_configs(scan_ctx *c)
{
    const char *names[] = {"hf_quant_config.json", "config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *p = path_join(c->root, names[i]);
        if (!p) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        size_t len = 0;
        char *text = NULL, why[160];
        small_file_state state;
        fp4d_status st = scan_read_small_file(p, &text, &len, &state, why, sizeof why);
        free(p);
        FP4D_FORWARD_IF_ERROR(st);
        if (state == SMALL_FILE_ABSENT) continue;
        if (state == SMALL_FILE_UNREADABLE) {
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, names[i], 1,
                                              "cannot read %s: %s; scanning without it", names[i], why));
            continue;
        }
        fp4d_quant_config *qc = NULL;
        st = fp4d_quant_config_parse(text, len, names[i], &qc);
        if (i == 1) scan_heads_parse(text, len, &c->heads);
        free(text);
        if (st == FP4D_STATUS_NOMEM) return st;
        if (st != FP4D_STATUS_OK) {
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, names[i], 1,
                                              "%s cannot be parsed: %s", names[i], fp4d_last_error()));
            continue;
        }
        /* hf_quant_config.json wins when both describe the quantization (ModelOpt writes both). */
        if (!c->qc || (!scan_qc_format_known(c->qc) && scan_qc_format_known(qc))) {
            fp4d_quant_config_free(c->qc);
            c->qc = qc;
            c->have_config = true;
        } else {
            fp4d_quant_config_free(qc);
        }
    }
    return FP4D_STATUS_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Files are found by name through a hash (file_ids): a linear search made an index naming
 * 20,000 shard files take 5.8 s before any file was read, and an index may be 100 MB. */
static fp4d_status add_file(scan_ctx *c, const char *rel)
{
    if (!c->file_ids && !(c->file_ids = json_object())) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    if (json_object_get(c->file_ids, rel)) return FP4D_STATUS_OK;
    if (c->num_files == c->cap_files) {
        const size_t cap = c->cap_files ? 2 * c->cap_files : 16;
        scan_file *g = realloc(c->files, cap * sizeof *g);
        if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        c->files = g;
        c->cap_files = cap;
    }
    scan_file *f = &c->files[c->num_files];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->rel = strdup(rel);
    f->path = c->root ? path_join(c->root, rel) : strdup(rel);
    /* _nocheck: a file name need not be UTF-8 (readdir), and jansson's checked setter
     * refuses such keys */
    if (!f->rel || !f->path ||
        json_object_set_new_nocheck(c->file_ids, rel, json_integer((json_int_t)c->num_files)) != 0) {
        free(f->rel);
        free(f->path);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    c->num_files++;
    return FP4D_STATUS_OK;
}

static int64_t file_by_rel(const scan_ctx *c, const char *rel)
{
    const json_t *id = c->file_ids && rel ? json_object_get(c->file_ids, rel) : NULL;
    return id ? (int64_t)json_integer_value(id) : -1;
}

static fp4d_status list_dir_shards(scan_ctx *c)
{
    DIR *d = opendir(c->root);
    if (!d) return fp4d_set_error(FP4D_STATUS_IO, "cannot read directory '%s': %s", c->root, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        char **g = realloc(names, (n + 1) * sizeof *g);
        if (!g || !(g[n] = strdup(e->d_name))) {
            free(g ? g : names);
            closedir(d);
            return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        }
        names = g;
        n++;
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, cmp_str);
    fp4d_status st = FP4D_STATUS_OK;
    for (size_t i = 0; i < n; i++) {
        if (st == FP4D_STATUS_OK) st = add_file(c, names[i]);
        free(names[i]);
    }
    free(names);
    return st;
}

/* "<prefix>-<digits>-of-<digits>.safetensors": how transformers and huggingface_hub name the
 * shards of one checkpoint. */
static bool shard_named(const char *name)
{
    size_t n = strlen(name);
    if (n <= 12 || strcmp(name + n - 12, ".safetensors")) return false;
    const char *end = name + n - 12, *p = end;
    while (p > name && p[-1] >= '0' && p[-1] <= '9') p--;
    if (p == end || p - name < 4 || strncmp(p - 4, "-of-", 4)) return false;
    end = p - 4;
    p = end;
    while (p > name && p[-1] >= '0' && p[-1] <= '9') p--;
    return p != end && p > name && p[-1] == '-';
}

/* Shard-named files the index does not name. Other .safetensors files in the folder (a
 * consolidated.safetensors next to the shards) stay ignored; a shard of the checkpoint's own
 * naming that the index forgot holds tensors no loader reads, and the scan must say so
 * (check_unindexed_shards). */
static fp4d_status list_unindexed_shards(scan_ctx *c)
{
    DIR *d = opendir(c->root);
    if (!d) return FP4D_STATUS_OK; /* the shards named by the index are still scanned */
    struct dirent *e;
    fp4d_status st = FP4D_STATUS_OK;
    while (st == FP4D_STATUS_OK && (e = readdir(d))) {
        if (!shard_named(e->d_name) || file_by_rel(c, e->d_name) >= 0) continue;
        char **g = realloc(c->unindexed, (c->num_unindexed + 1) * sizeof *g);
        if (!g || !(g[c->num_unindexed] = strdup(e->d_name))) {
            if (g) c->unindexed = g;
            st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            break;
        }
        c->unindexed = g;
        c->num_unindexed++;
    }
    closedir(d);
    if (c->num_unindexed > 1) qsort(c->unindexed, c->num_unindexed, sizeof *c->unindexed, cmp_str);
    return st;
}

fp4d_status scan_index_load(const char *dir, scan_index_state *state, json_t **weight_map, char *why,
                            size_t why_len)
{
    *weight_map = NULL;
    *state = SCAN_INDEX_UNREADABLE;
    char *p = path_join(dir, SCAN_INDEX_NAME);
    if (!p) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    size_t len = 0;
    char *text = NULL;
    small_file_state fs;
    fp4d_status rs = scan_read_small_file(p, &text, &len, &fs, why, why_len);
    free(p);
    FP4D_FORWARD_IF_ERROR(rs);
    if (fs == SMALL_FILE_ABSENT) *state = SCAN_INDEX_ABSENT;
    if (fs != SMALL_FILE_READ) return FP4D_STATUS_OK;
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    free(text);
    json_t *wm = json_object_get(root, "weight_map");
    bool ok = json_is_object(wm);
    const char *k;
    json_t *v;
    if (!root)
        snprintf(why, why_len, "not JSON: %s at line %d, column %d", err.text, err.line, err.column);
    else if (!ok)
        snprintf(why, why_len, "needs a \"weight_map\" of tensor -> shard file name; it has %s",
                 wm ? "a \"weight_map\" that is not an object" : "no \"weight_map\"");
    else
        json_object_foreach(wm, k, v) {
            const char *s = json_is_string(v) ? json_string_value(v) : NULL;
            /* Shard names are plain file names; anything else (.., absolute, empty) is refused
             * rather than followed outside the checkpoint. The first such entry is named. */
            if (!s || !s[0] || s[0] == '/' || strstr(s, "..")) {
                snprintf(why, why_len, "needs a \"weight_map\" of tensor -> shard file name; \"%.80s\" maps to %s%.80s%s",
                         k, s ? "\"" : "", s ? s : "a non-string", s ? "\", not a file name in the folder" : "");
                ok = false;
                break;
            }
        }
    if (!ok) {
        json_decref(root);
        *state = SCAN_INDEX_INVALID;
        return FP4D_STATUS_OK;
    }
    *weight_map = json_incref(wm);
    json_decref(root);
    *state = SCAN_INDEX_VALID;
    return FP4D_STATUS_OK;
}

static fp4d_status load_index(scan_ctx *c)
{
    char why[256];
    scan_index_state state;
    json_t *wm = NULL;
    FP4D_FORWARD_IF_ERROR(scan_index_load(c->root, &state, &wm, why, sizeof why));
    if (state == SCAN_INDEX_ABSENT) return list_dir_shards(c);
    if (state == SCAN_INDEX_UNREADABLE) {
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, SCAN_INDEX_NAME, 1,
                                          "cannot read %s: %s; scanning every .safetensors file instead",
                                          SCAN_INDEX_NAME, why));
        return list_dir_shards(c);
    }
    if (state == SCAN_INDEX_INVALID) {
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, SCAN_INDEX_NAME, 1,
                                          "%s is not a valid index (%s); scanning every .safetensors file "
                                          "instead", SCAN_INDEX_NAME, why));
        return list_dir_shards(c);
    }
    c->have_index = true;
    c->weight_map = wm;
    /* Shards in sorted order, so reports are stable. */
    const char *k;
    json_t *v;
    size_t n = json_object_size(wm), i = 0;
    char **names = calloc(n ? n : 1, sizeof *names);
    if (!names) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    json_object_foreach(wm, k, v) names[i++] = (char *)json_string_value(v);
    qsort(names, n, sizeof *names, cmp_str);
    fp4d_status st = FP4D_STATUS_OK;
    for (i = 0; i < n && st == FP4D_STATUS_OK; i++)
        if (i == 0 || strcmp(names[i], names[i - 1])) st = add_file(c, names[i]);
    free(names);
    FP4D_FORWARD_IF_ERROR(st);
    json_object_foreach(wm, k, v) {
        int64_t f = file_by_rel(c, json_string_value(v));
        if (f >= 0) c->files[f].index_tensors++;
    }
    return list_unindexed_shards(c);
}

static fp4d_status add_tensors_from_st(scan_ctx *c, int32_t fi, const fp4d_st_file *st)
{
    size_t n = fp4d_st_count(st);
    for (size_t i = 0; i < n; i++) {
        const fp4d_st_tensor *s = fp4d_st_get(st, i);
        scan_tensor t = {0};
        t.name = (char *)s->name;
        t.file = fi;
        t.dtype = s->dtype;
        t.ndim = s->ndim;
        memcpy(t.shape, s->shape, sizeof t.shape);
        t.begin = s->begin;
        t.end = s->end;
        t.in_shard = t.trusted = t.readable = true;
        FP4D_FORWARD_IF_ERROR(add_tensor(c, &t));
    }
    return FP4D_STATUS_OK;
}

/* A shard the strict reader rejected: classify the failure, recover what can be recovered. */
static fp4d_status handle_bad_shard(scan_ctx *c, int32_t fi, const fp4d_st_open_result *res)
{
    scan_file *f = &c->files[fi];
    uint8_t lenbuf[8];
    uint64_t hlen = 0;
    bool have_len = f->size >= 8 && pread(f->fd, lenbuf, 8, 0) == 8;
    if (have_len)
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    size_t avail = 0;
    uint8_t *hdr = NULL;
    if (have_len && f->size > 8) {
        uint64_t a = f->size - 8;
        if (hlen < a) a = hlen;
        if (a > 100000000ull) a = 100000000ull;
        avail = (size_t)a;
        hdr = malloc(avail ? avail : 1);
        if (!hdr) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        size_t got = 0;
        while (got < avail) {
            ssize_t r = pread(f->fd, hdr + got, avail - got, (off_t)(8 + got));
            if (r <= 0) break;
            got += (size_t)r;
        }
        avail = got;
    }
    uint64_t data_len = have_len && f->size >= 8 + hlen ? f->size - 8 - hlen : 0;
    scan_hdr h;
    fp4d_status st = scan_hdr_parse(hdr ? hdr : (const uint8_t *)"", avail, data_len, &h);
    free(hdr);
    FP4D_FORWARD_IF_ERROR(st);
    f->data_start = 8 + hlen;

    fp4d_st_error e = res->error;
    bool truncated = e == FP4D_ST_ERR_TRUNCATED || e == FP4D_ST_ERR_HEADER_TOO_SMALL ||
                     (e == FP4D_ST_ERR_HEADER_LENGTH && hlen <= 100000000ull && !h.object_complete);
    if (e == FP4D_ST_ERR_TRUNCATED && h.parsed) {
        /* Header intact: the tensors before the cut are still worth scanning. */
        f->state = FILE_PARTIAL;
        const char *first_cut = NULL;
        uint64_t first_begin = UINT64_MAX, cut = 0;
        for (size_t i = 0; i < h.count; i++) {
            scan_hdr_entry *he = &h.entries[i];
            scan_tensor t = {0};
            t.name = he->name;
            t.file = fi;
            t.dtype = he->dtype;
            t.ndim = he->ndim;
            memcpy(t.shape, he->shape, sizeof t.shape);
            t.begin = he->begin;
            t.end = he->end;
            t.in_shard = true;
            t.trusted = he->entry_ok;
            t.readable = he->entry_ok && he->end <= data_len;
            if (he->end > data_len) {
                cut++;
                if (he->begin < first_begin) {
                    first_begin = he->begin;
                    first_cut = he->name;
                }
            }
            if ((st = add_tensor(c, &t)) != FP4D_STATUS_OK) break;
        }
        if (st == FP4D_STATUS_OK)
            st = add_finding(c, FP4D_FINDING_FILE_TRUNCATED, FP4D_SCAN_ERROR, first_cut, f->rel, cut,
                             "%s is %llu bytes, shorter than its header says: %llu tensor(s) lost, from %s on",
                             f->rel, (unsigned long long)f->size, (unsigned long long)cut,
                             first_cut ? first_cut : "?");
        scan_hdr_free(&h);
        return st;
    }
    if (truncated) {
        f->state = FILE_UNREADABLE;
        st = add_finding(c, FP4D_FINDING_FILE_TRUNCATED, FP4D_SCAN_ERROR, NULL, f->rel, f->index_tensors,
                         "%s is cut short inside its header (%llu bytes): none of its tensors can be read (%s)",
                         f->rel, (unsigned long long)f->size, res->message);
        scan_hdr_free(&h);
        return st;
    }
    if (e == FP4D_ST_ERR_DUPLICATE_KEY && h.num_dups) {
        for (size_t i = 0; i < h.num_dups && st == FP4D_STATUS_OK; i++)
            st = add_finding(c, FP4D_FINDING_DUPLICATE_TENSOR, FP4D_SCAN_ERROR, h.dup_names[i], f->rel,
                             h.dup_counts[i], "%s appears %llu times in the header of %s; loaders keep one",
                             h.dup_names[i], (unsigned long long)h.dup_counts[i], f->rel);
    } else if (e != FP4D_ST_ERR_OPEN) {
        /* Name the tensor only for rules about one entry; the others concern the whole file. */
        bool entry_rule = e == FP4D_ST_ERR_UNKNOWN_DTYPE || e == FP4D_ST_ERR_SHAPE_OVERFLOW ||
                          e == FP4D_ST_ERR_MISALIGNED || e == FP4D_ST_ERR_OFFSETS || e == FP4D_ST_ERR_SIZE_MISMATCH ||
                          e == FP4D_ST_ERR_HEADER_JSON;
        st = add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, entry_rule ? h.first_bad : NULL, f->rel, 1,
                         "%s: %s (%s)",
                         f->rel, fp4d_st_error_name(e), res->message);
    } else {
        st = add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, f->rel, 1, "%s", res->message);
    }
    f->state = h.parsed ? FILE_NAMES_ONLY : FILE_UNREADABLE;
    for (size_t i = 0; i < h.count && st == FP4D_STATUS_OK; i++) {
        scan_tensor t = {0};
        t.name = h.entries[i].name;
        t.file = fi;
        t.in_shard = true;
        st = add_tensor(c, &t);
    }
    scan_hdr_free(&h);
    return st;
}

static fp4d_status load_shards(scan_ctx *c)
{
    for (size_t i = 0; i < c->num_files; i++) {
        scan_file *f = &c->files[i];
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block: refused below */
        /* out of descriptors (more shards than `ulimit -n`) or memory: a limit of this process,
         * not a fault of the checkpoint - the scan stops (exit 4) rather than report the shard */
        if (f->fd < 0 && fp4d_st_resource_errno(errno))
            return fp4d_set_error(FP4D_STATUS_NOMEM, "cannot open %s: %s (a limit of this process: raise `ulimit -n` or "
                                  "memory)", f->rel, strerror(errno));
        if (f->fd < 0) {
            if (errno == ENOENT) {
                f->state = FILE_MISSING;
                if (c->have_index)
                    FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_INDEX_MISSING_FILE, FP4D_SCAN_ERROR, NULL,
                                                      f->rel, f->index_tensors,
                                                      "the index maps %llu tensor(s) to %s, which does not exist",
                                                      (unsigned long long)f->index_tensors, f->rel));
            } else {
                f->state = FILE_UNREADABLE;
                FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, f->rel, 1,
                                                  "cannot open %s: %s", f->rel, strerror(errno)));
            }
            continue;
        }
        struct stat sb;
        if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            f->state = FILE_UNREADABLE;
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, f->rel, 1,
                                              "%s is not a regular file", f->rel));
            continue;
        }
        f->size = (uint64_t)sb.st_size;
        fp4d_st_open_result res;
        fp4d_st_file *st = fp4d_st_open(f->path, &res);
        if (!st && res.error == FP4D_ST_ERR_RESOURCE) return FP4D_STATUS_NOMEM; /* fp4d_last_error says why */
        if (st) {
            f->state = FILE_OK;
            f->data_start = 8 + fp4d_st_header_size(st);
            fp4d_status s = add_tensors_from_st(c, (int32_t)i, st);
            fp4d_st_close(st);
            FP4D_FORWARD_IF_ERROR(s);
        } else {
            FP4D_FORWARD_IF_ERROR(handle_bad_shard(c, (int32_t)i, &res));
        }
    }
    return FP4D_STATUS_OK;
}

/* ---- phase 2a: the index and duplicates ---------------------------------------------------- */

/* A shard the index does not name is never opened by a loader: its tensors that the index
 * does not list either are missing from the loaded model (transformers initialises them at
 * random, with a warning). Tensors the index does list live elsewhere; this file's copies
 * are stale leftovers loaders never see, so they are not duplicates. Only the header is
 * read; a file the strict reader rejects is passed over (no loader reads it either). */
static fp4d_status check_unindexed_shards(scan_ctx *c)
{
    for (size_t i = 0; i < c->num_unindexed; i++) {
        char *path = path_join(c->root, c->unindexed[i]);
        if (!path) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        fp4d_st_open_result res;
        fp4d_st_file *st = fp4d_st_open(path, &res);
        free(path);
        if (!st && res.error == FP4D_ST_ERR_RESOURCE) return FP4D_STATUS_NOMEM; /* fp4d_last_error says why */
        if (!st) continue;
        fp4d_status s = FP4D_STATUS_OK;
        for (size_t k = 0; k < fp4d_st_count(st) && s == FP4D_STATUS_OK; k++) {
            const char *name = fp4d_st_get(st, k)->name;
            if (json_object_get(c->weight_map, name)) continue;
            s = add_finding(c, FP4D_FINDING_INDEX_MISSING_TENSOR, FP4D_SCAN_ERROR, name, c->unindexed[i], 1,
                            "%s is in %s, a shard the index does not name: loaders never read it", name,
                            c->unindexed[i]);
        }
        fp4d_st_close(st);
        FP4D_FORWARD_IF_ERROR(s);
    }
    return FP4D_STATUS_OK;
}

typedef struct name_ref {
    const char *name;
    int32_t     file;
} name_ref;

static int name_ref_cmp(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return (x->file > y->file) - (x->file < y->file);
}

static bool file_lists_names(const scan_file *f)
{
    return f->state == FILE_OK || f->state == FILE_PARTIAL || f->state == FILE_NAMES_ONLY;
}

static fp4d_status check_index_and_duplicates(scan_ctx *c)
{
    /* Cross-shard duplicates: sort the names, then look at runs of equal names. */
    size_t n = c->num_tensors;
    name_ref *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (c->tensors[i].in_shard) order[m++] = (name_ref){c->tensors[i].name, c->tensors[i].file};
    qsort(order, m, sizeof *order, name_ref_cmp);
    fp4d_status st = FP4D_STATUS_OK;
    for (size_t i = 0; i < m && st == FP4D_STATUS_OK;) {
        size_t j = i + 1;
        size_t files = 1; /* equal names are sorted by file: count distinct files */
        while (j < m && !strcmp(order[i].name, order[j].name)) {
            files += order[j].file != order[j - 1].file;
            j++;
        }
        /* Copies within one file were reported from that file's header already. */
        if (files > 1) {
            const char *f1 = file_rel(c, order[i].file), *f2 = NULL;
            for (size_t a = i + 1; a < j && !f2; a++)
                if (order[a].file != order[i].file) f2 = file_rel(c, order[a].file);
            st = add_finding(c, FP4D_FINDING_DUPLICATE_TENSOR, FP4D_SCAN_ERROR, order[i].name, f2, files,
                             "%s is stored in %zu shards (%s, %s%s); which copy a loader uses is undefined",
                             order[i].name, files, f1, f2, files > 2 ? ", ..." : "");
        }
        i = j;
    }
    free(order);
    FP4D_FORWARD_IF_ERROR(st);
    if (!c->have_index) return FP4D_STATUS_OK;
    FP4D_FORWARD_IF_ERROR(check_unindexed_shards(c));

    /* Tensors in shards vs the index. */
    for (size_t i = 0; i < c->num_tensors; i++) {
        scan_tensor *t = &c->tensors[i];
        if (!t->in_shard) continue;
        json_t *v = json_object_get(c->weight_map, t->name);
        const char *mapped = json_string_value(v);
        if (!mapped) {
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_INDEX_MISSING_TENSOR, FP4D_SCAN_ERROR, t->name,
                                              file_rel(c, t->file), 1,
                                              "%s is in %s but not in the index: loaders will not load it",
                                              t->name, file_rel(c, t->file)));
            continue;
        }
        if (!strcmp(mapped, file_rel(c, t->file))) continue;
        /* Mapped elsewhere: fine if that shard holds a copy too (a duplicate, reported above). */
        int64_t mf = file_by_rel(c, mapped);
        bool other_has = false;
        if (mf >= 0 && !file_lists_names(&c->files[mf])) other_has = true; /* cannot tell: say nothing */
        for (size_t j = 0; j < c->num_tensors && !other_has; j++)
            if (c->tensors[j].in_shard && c->tensors[j].file == mf && !strcmp(c->tensors[j].name, t->name))
                other_has = true;
        if (!other_has)
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_INDEX_WRONG_FILE, FP4D_SCAN_ERROR, t->name,
                                              file_rel(c, t->file), 1,
                                              "the index maps %s to %s, but it is stored in %s", t->name, mapped,
                                              file_rel(c, t->file)));
    }
    /* Index entries no shard holds; placeholders for entries in shards we cannot read. */
    const char *k;
    json_t *v;
    json_object_foreach(c->weight_map, k, v) {
        int64_t t = find_tensor(c, k);
        int64_t mf = file_by_rel(c, json_string_value(v));
        if (t >= 0 && c->tensors[t].in_shard) continue;
        if (mf >= 0 && file_lists_names(&c->files[mf])) {
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_INDEX_MISSING_TENSOR, FP4D_SCAN_ERROR, k,
                                              json_string_value(v), 1,
                                              "the index lists %s in %s, but no shard holds it", k,
                                              json_string_value(v)));
            continue;
        }
        if (t >= 0) continue;
        /* In a missing or unreadable shard: it exists as far as we can tell. */
        scan_tensor ph = {0};
        ph.name = (char *)k;
        ph.file = (int32_t)mf;
        FP4D_FORWARD_IF_ERROR(add_tensor(c, &ph));
    }
    return FP4D_STATUS_OK;
}

/* ---- phase 2b: quantized linears ------------------------------------------------------------ */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The tensor named the first a bytes of module, then suffix. */
static int64_t find_companion_n(const scan_ctx *c, const char *module, size_t a, const char *suffix)
{
    size_t b = strlen(suffix);
    char stackbuf[512];
    char *name = a + b + 1 <= sizeof stackbuf ? stackbuf : malloc(a + b + 1);
    if (!name) return -1;
    memcpy(name, module, a);
    memcpy(name + a, suffix, b + 1);
    int64_t t = find_tensor(c, name);
    if (name != stackbuf) free(name);
    return t;
}

static int64_t find_companion(const scan_ctx *c, const char *module, const char *suffix)
{
    return find_companion_n(c, module, strlen(module), suffix);
}

static bool is_float_dtype(fp4d_st_dtype d)
{
    return d == FP4D_ST_BF16 || d == FP4D_ST_F16 || d == FP4D_ST_F32 || d == FP4D_ST_F64;
}

static bool is_fp8_dtype(fp4d_st_dtype d)
{
    return d == FP4D_ST_F8_E4M3 || d == FP4D_ST_F8_E5M2 || d == FP4D_ST_F8_E4M3FNUZ || d == FP4D_ST_F8_E5M2FNUZ;
}

static bool is_first(const scan_ctx *c, size_t i) { return find_tensor(c, c->tensors[i].name) == (int64_t)i; }

/* Whether a U8 `X.weight` and its `X.weight_scale` (index s) are ModelOpt packed FP4 by
 * themselves, with no `X.weight_scale_2` and no config to say so: an F8_E4M3 scale is NVFP4's
 * (whose global scale is then missing: MISSING_COMPANION, not "unquantized"); a U8/F8_E8M0
 * scale is MXFP4's, which has no global scale. A U8 scale must also have MXFP4's shape
 * [.., K/32]: U8 next to U8 alone says nothing about FP4. */
static bool fp4_scale_pair(const scan_ctx *c, const scan_tensor *w, int64_t s)
{
    if (s < 0 || !w->trusted || w->dtype != FP4D_ST_U8) return false;
    const scan_tensor *sc = &c->tensors[s];
    if (!sc->trusted) return false;
    if (sc->dtype == FP4D_ST_F8_E4M3 || sc->dtype == FP4D_ST_F8_E8M0) return true;
    if (sc->dtype != FP4D_ST_U8 || w->ndim < 2 || sc->ndim != w->ndim) return false;
    for (int32_t i = 0; i + 1 < w->ndim; i++)
        if (sc->shape[i] != w->shape[i]) return false;
    const int64_t half_k = w->shape[w->ndim - 1];
    return half_k > 0 && half_k % 16 == 0 && sc->shape[sc->ndim - 1] == half_k / 16;
}

static fp4d_ckpt_format detect_format(const scan_ctx *c)
{
    if (c->qc && scan_qc_format_known(c->qc)) return fp4d_quant_config_format(c->qc);
    bool ct = false, ct_nv = false, gptoss = false, mo = false, mo_pair = false;
    for (size_t i = 0; i < c->num_tensors; i++) {
        const char *n = c->tensors[i].name;
        if (ends_with(n, ".weight_packed")) ct = true;
        else if (ends_with(n, ".weight_global_scale")) ct_nv = true;
        else if (ends_with(n, ".weight_scale_2")) mo = true;
        else if (ends_with(n, "_blocks")) gptoss = true;
        else if (!mo_pair && ends_with(n, ".weight") && c->tensors[i].trusted && c->tensors[i].dtype == FP4D_ST_U8)
            mo_pair = fp4_scale_pair(c, &c->tensors[i], find_companion_n(c, n, strlen(n) - 7, ".weight_scale"));
    }
    if (ct) return ct_nv ? FP4D_CKPT_CT_NVFP4 : FP4D_CKPT_CT_MXFP4;
    if (mo) return FP4D_CKPT_MODELOPT_NVFP4;
    if (gptoss) return FP4D_CKPT_GPTOSS_MXFP4;
    /* ModelOpt by its packed weights and block scales alone: every weight_scale_2 missing, or
     * MXFP4 (W4A8_MXFP4_FP8), which has none, with no config */
    if (mo_pair) return FP4D_CKPT_MODELOPT_NVFP4;
    return FP4D_CKPT_UNQUANTIZED;
}

static fp4d_status add_unit(scan_ctx *c, unit_kind kind, const char *module, int64_t weight)
{
    scan_unit *g = realloc(c->units, (c->num_units + 1) * sizeof *g);
    if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    c->units = g;
    scan_unit *u = &g[c->num_units];
    memset(u, 0, sizeof *u);
    u->module = strdup(module);
    if (!u->module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    u->kind = kind;
    u->weight = weight;
    u->is_mx = kind == UNIT_MO_MXFP4 || kind == UNIT_CT_MXFP4 || kind == UNIT_GPTOSS;
    u->block = u->is_mx ? 32 : 16;
    const char *scale_sfx = kind == UNIT_GPTOSS ? "_scales" : ".weight_scale";
    u->scale = find_companion(c, module, scale_sfx);
    u->global = kind == UNIT_MO_NVFP4 ? find_companion(c, module, ".weight_scale_2")
              : kind == UNIT_CT_NVFP4 ? find_companion(c, module, ".weight_global_scale") : -1;
    u->input = (kind == UNIT_MO_NVFP4 || kind == UNIT_MO_MXFP4) ? find_companion(c, module, ".input_scale")
             : kind == UNIT_CT_NVFP4 ? find_companion(c, module, ".input_global_scale") : -1;
    pthread_mutex_init(&u->lock, NULL);
    c->tensors[weight].claimed = true;
    if (u->scale >= 0) c->tensors[u->scale].claimed = true;
    if (u->global >= 0) c->tensors[u->global].claimed = true;
    if (u->input >= 0) c->tensors[u->input].claimed = true;
    c->num_units++;
    return FP4D_STATUS_OK;
}

/* What a ModelOpt packed X.weight with no scale of its own (neither X.weight_scale nor
 * X.weight_scale_2), or with only an X.weight_scale of unknown dtype, is: what the config
 * names, else what the checkpoint's other packed weights are - a weight_scale_2 or an F8_E4M3
 * block scale is NVFP4's, a U8/F8_E8M0 one MXFP4's. Neither, or both: it cannot be told, and MISSING_COMPANION names only the block
 * scale, which both need; it named NVFP4's weight_scale_2 too, in an MXFP4 checkpoint. */
typedef enum mo_told { MO_TOLD_UNKNOWN, MO_TOLD_NVFP4, MO_TOLD_MXFP4 } mo_told;

static mo_told modelopt_format_told(const scan_ctx *c)
{
    if (c->qc && scan_qc_format_known(c->qc)) return scan_qc_is_mx(c->qc) ? MO_TOLD_MXFP4 : MO_TOLD_NVFP4;
    bool nv = false, mx = false;
    for (size_t i = 0; i < c->num_tensors && !(nv && mx); i++) {
        const scan_tensor *t = &c->tensors[i];
        const size_t len = strlen(t->name);
        if (!ends_with(t->name, ".weight") || !t->trusted || t->dtype != FP4D_ST_U8) continue;
        const int64_t s = find_companion_n(c, t->name, len - 7, ".weight_scale");
        if (find_companion_n(c, t->name, len - 7, ".weight_scale_2") >= 0) nv = true;
        else if (fp4_scale_pair(c, t, s) && c->tensors[s].dtype == FP4D_ST_F8_E4M3) nv = true;
        else if (fp4_scale_pair(c, t, s)) mx = true;
    }
    return nv == mx ? MO_TOLD_UNKNOWN : nv ? MO_TOLD_NVFP4 : MO_TOLD_MXFP4;
}

/* Whether a ModelOpt checkpoint is MXFP4 (W4A8_MXFP4_FP8) rather than NVFP4. The layers
 * decide - every layer whose format shows is MXFP4 (one NVFP4 layer leaves it NVFP4) - and the
 * config only where no layer shows one (MIXED_PRECISION stays "modelopt-mixed"): the label
 * says what the tensors are, and a config naming the other format is a finding of its own
 * (check_config_agrees). fp4d_ckpt_format has one value for both (a new one would change
 * FP4D_CKPT_FORMAT_COUNT and the generator's API), so the report keeps this beside the
 * format and fp4d_scan_report_format names it. */
static bool modelopt_is_mxfp4(const scan_ctx *c)
{
    if (c->format != FP4D_CKPT_MODELOPT_NVFP4 || fp4d_quant_config_is_mixed(c->qc)) return false;
    size_t mx = 0, nv = 0;
    for (size_t i = 0; i < c->num_units; i++) {
        mx += c->units[i].kind == UNIT_MO_MXFP4;
        nv += c->units[i].kind == UNIT_MO_NVFP4 && !c->units[i].format_untold;
    }
    return mx || nv ? nv == 0 : scan_qc_is_mx(c->qc);
}

static fp4d_status build_units(scan_ctx *c)
{
    bool mo_mx_config = c->qc && scan_qc_is_mx(c->qc) && c->format == FP4D_CKPT_MODELOPT_NVFP4;
    bool told_known = false; /* modelopt_format_told, worked out at the first weight that needs it */
    mo_told told = MO_TOLD_UNKNOWN;
    for (size_t i = 0; i < c->num_tensors; i++) {
        if (!is_first(c, i)) continue;
        scan_tensor *t = &c->tensors[i];
        const char *n = t->name;
        size_t len = strlen(n);
        char *module = NULL;
        unit_kind kind;
        bool untold = false;
        if (ends_with(n, ".weight_packed")) {
            module = strndup(n, len - 14);
            if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            bool has_global = find_companion(c, module, ".weight_global_scale") >= 0;
            kind = c->format == FP4D_CKPT_CT_MXFP4 || (c->format != FP4D_CKPT_CT_NVFP4 && !has_global)
                       ? UNIT_CT_MXFP4 : UNIT_CT_NVFP4;
        } else if (ends_with(n, "_blocks") && len > 7) {
            module = strndup(n, len - 7);
            if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            kind = UNIT_GPTOSS;
        } else if (ends_with(n, ".weight") && len > 7) {
            module = strndup(n, len - 7);
            if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            int64_t s2 = find_companion(c, module, ".weight_scale_2");
            int64_t s = find_companion(c, module, ".weight_scale");
            bool packed = t->trusted ? t->dtype == FP4D_ST_U8 : (s2 >= 0);
            bool quantized_ckpt = c->format == FP4D_CKPT_MODELOPT_NVFP4;
            if (!(s2 >= 0 || (packed && (quantized_ckpt || fp4_scale_pair(c, t, s))))) {
                free(module);
                continue;
            }
            /* A ue8m0 scale with no scale_2 is ModelOpt's MXFP4; NVFP4 otherwise. With no scale
             * at all, or one whose dtype is not known (its shard's header was rejected), what
             * the config or the other layers say (modelopt_format_told): such a layer of an
             * MXFP4 checkpoint was NVFP4, missing a weight_scale_2, with a decode convention. */
            const bool scale_typed = s >= 0 && c->tensors[s].trusted;
            bool mx = s2 < 0 && (mo_mx_config || (scale_typed && (c->tensors[s].dtype == FP4D_ST_U8 ||
                                                                  c->tensors[s].dtype == FP4D_ST_F8_E8M0)));
            if (s2 < 0 && !scale_typed && !told_known) {
                told = modelopt_format_told(c);
                told_known = true;
            }
            untold = s2 < 0 && !scale_typed && told == MO_TOLD_UNKNOWN;
            if (s2 < 0 && !scale_typed && told == MO_TOLD_MXFP4) mx = true;
            kind = mx ? UNIT_MO_MXFP4 : UNIT_MO_NVFP4;
        } else {
            continue;
        }
        fp4d_status st = add_unit(c, kind, module, (int64_t)i);
        free(module);
        FP4D_FORWARD_IF_ERROR(st);
        c->units[c->num_units - 1].format_untold = untold;
    }
    return FP4D_STATUS_OK;
}

static int64_t shape_product(const int64_t *shape, int32_t n)
{
    int64_t p = 1;
    for (int32_t i = 0; i < n; i++) p *= shape[i];
    return p;
}

static const char *dtype_str(fp4d_st_dtype d) { return fp4d_st_dtype_name(d); }

static void dims_str(const int64_t *d, int32_t ndim, char *buf, size_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static void shape_str(const scan_tensor *t, char *buf, size_t n) { dims_str(t->shape, t->ndim, buf, n); }

/* Whether scales of shape s are the 128x4-swizzled layout of the linear scales `want` (spec
 * §6): the last two dims padded to a multiple of 128 rows and 4 columns, or that buffer
 * flattened. Checkpoints store linear scales (§7); a swizzled buffer is a kernel's layout
 * dumped as is, and every loader swizzles again at load. Only a padded shape tells. */
static bool swizzled_shape(const scan_tensor *s, const int64_t *want, int32_t nwant, int64_t *rp, int64_t *cp)
{
    if (nwant < 2 || want[nwant - 2] <= 0 || want[nwant - 1] <= 0) return false;
    *rp = (want[nwant - 2] + 127) / 128 * 128;
    *cp = (want[nwant - 1] + 3) / 4 * 4;
    if (*rp == want[nwant - 2] && *cp == want[nwant - 1]) return false; /* no padding: same shape as linear */
    if (s->ndim == nwant) {
        for (int32_t i = 0; i + 2 < nwant; i++)
            if (s->shape[i] != want[i]) return false;
        return s->shape[nwant - 2] == *rp && s->shape[nwant - 1] == *cp;
    }
    uint64_t batch = 1, elems = 1;
    for (int32_t i = 0; i + 2 < nwant; i++) batch *= (uint64_t)want[i];
    for (int32_t i = 0; i < s->ndim; i++) elems *= (uint64_t)s->shape[i];
    return s->ndim >= 1 && s->ndim < nwant && elems == batch * (uint64_t)*rp * (uint64_t)*cp;
}

/* Dtype of a global or input scale: F32 expected; another float type loses nothing a
 * loader cares about (warning); anything else cannot be a scale (error, values skipped). */
static fp4d_status check_scalar_dtype(scan_ctx *c, int64_t ti, bool *values_ok)
{
    scan_tensor *t = &c->tensors[ti];
    *values_ok = t->readable;
    if (!t->trusted || t->dtype == FP4D_ST_F32) return FP4D_STATUS_OK;
    if (is_float_dtype(t->dtype))
        return add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_WARNING, t->name, file_rel(c, t->file), 1,
                           "%s is %s; F32 expected", t->name, dtype_str(t->dtype));
    *values_ok = false;
    return add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_ERROR, t->name, file_rel(c, t->file), 1,
                       "%s is %s; F32 expected for a global/input scale", t->name, dtype_str(t->dtype));
}

/* A ModelOpt layer whose tensors are one FP4 format while the (single-format) quant config
 * names the other: engines build the layer from the config, so they read the block-scale
 * bytes in the wrong encoding (ue8m0 as e4m3, or the reverse) with the wrong block size, or
 * fail to load. The scan itself follows the tensors, which are self-consistent (the scale's
 * dtype agrees with the layer's format), so nothing else would say so. */
static fp4d_status check_config_agrees(scan_ctx *c, const scan_unit *u, const scan_tensor *s)
{
    if ((u->kind != UNIT_MO_NVFP4 && u->kind != UNIT_MO_MXFP4) || u->format_untold || !c->have_config ||
        !scan_qc_format_known(c->qc) || fp4d_quant_config_is_mixed(c->qc) ||
        fp4d_quant_config_format(c->qc) != FP4D_CKPT_MODELOPT_NVFP4 || scan_qc_is_mx(c->qc) == u->is_mx)
        return FP4D_STATUS_OK;
    const char *algo = scan_qc_algo(c->qc) ? scan_qc_algo(c->qc) : "?";
    if (u->is_mx)
        return add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_ERROR, s->name, file_rel(c, s->file), 1,
                           "%s is %s: MXFP4 block scales (ue8m0, one per 32, no %s.weight_scale_2), but the quant "
                           "config's quant_algo is %s (NVFP4: F8_E4M3 scales, one per 16, and a global scale); an "
                           "engine that follows the config reads these bytes as e4m3 or cannot load the layer",
                           s->name, dtype_str(s->dtype), u->module, algo);
    return add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_ERROR, s->name, file_rel(c, s->file), 1,
                       "%s is %s: NVFP4 block scales (e4m3, one per 16, with %s.weight_scale_2), but the quant "
                       "config's quant_algo is %s (MXFP4: ue8m0 scales, one per 32); an engine that follows the "
                       "config reads these bytes as ue8m0 or cannot load the layer",
                       s->name, dtype_str(s->dtype), u->module, algo);
}

static fp4d_status check_unit_structure(scan_ctx *c, scan_unit *u)
{
    scan_tensor *w = &c->tensors[u->weight];
    const char *wfile = file_rel(c, w->file);
    /* Companions. */
    const char *missing[3];
    size_t nmissing = 0;
    bool want_input = scan_qc_input_scales(c->qc) && u->kind != UNIT_CT_MXFP4 && u->kind != UNIT_GPTOSS;
    if (u->scale < 0) missing[nmissing++] = u->kind == UNIT_GPTOSS ? "_scales" : ".weight_scale";
    if (u->global < 0 && (u->kind == UNIT_MO_NVFP4 || u->kind == UNIT_CT_NVFP4) && !u->format_untold)
        missing[nmissing++] = u->kind == UNIT_MO_NVFP4 ? ".weight_scale_2" : ".weight_global_scale";
    if (u->input < 0 && want_input)
        missing[nmissing++] = u->kind == UNIT_CT_NVFP4 ? ".input_global_scale" : ".input_scale";
    if (nmissing) {
        char list[512] = "";
        for (size_t i = 0; i < nmissing; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s%s", i ? ", " : "", u->module, missing[i]);
        /* The input scale is last in the list; alone, the weights still dequantize, but the
         * config's static activation scale is missing, which engines need to load the layer. */
        const bool input_only = nmissing == 1 && u->input < 0 && want_input;
        const char *why = input_only ? "the config quantizes activations with a static scale (W4A4/W4A8), "
                                       "which engines need to load the layer"
                          : u->input < 0 && want_input ? "the layer cannot be dequantized, and the config's "
                                                         "static activation scale is missing too"
                                                       : "the layer cannot be dequantized";
        if (u->format_untold)
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_MISSING_COMPANION, FP4D_SCAN_ERROR, w->name, wfile,
                                              nmissing, "%s has no %s: %s (no config or other layer tells NVFP4 "
                                              "from MXFP4; NVFP4 would also need %s.weight_scale_2)", w->name,
                                              list, why, u->module));
        else
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_MISSING_COMPANION, FP4D_SCAN_ERROR, w->name, wfile,
                                              nmissing, "%s has no %s: %s", w->name, list, why));
    }
    /* Exclusions. */
    if (c->have_config && fp4d_quant_config_is_excluded(c->qc, u->module))
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_EXCLUDED_BUT_QUANTIZED, FP4D_SCAN_ERROR, w->name, wfile, 1,
                                          "%s is stored quantized, but the quant config excludes %s: engines "
                                          "build it unquantized and cannot load it",
                                          w->name, u->module));
    /* Dtypes. */
    if (w->trusted && w->dtype != FP4D_ST_U8)
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_ERROR, w->name, wfile, 1,
                                          "%s is %s; packed FP4 must be U8", w->name, dtype_str(w->dtype)));
    bool scale_bytes_ok = false;
    if (u->scale >= 0) {
        scan_tensor *s = &c->tensors[u->scale];
        bool ok = !s->trusted || (u->is_mx ? (s->dtype == FP4D_ST_U8 || s->dtype == FP4D_ST_F8_E8M0)
                                           : s->dtype == FP4D_ST_F8_E4M3);
        if (!ok)
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_DTYPE_MISMATCH, FP4D_SCAN_ERROR, s->name,
                                              file_rel(c, s->file), 1, "%s is %s; %s expected", s->name,
                                              dtype_str(s->dtype), u->is_mx ? "U8 (ue8m0)" : "F8_E4M3"));
        else if (s->trusted)
            FP4D_FORWARD_IF_ERROR(check_config_agrees(c, u, s));
        scale_bytes_ok = s->readable && fp4d_st_dtype_bits(s->dtype) == 8;
    }
    /* Shapes: packed [.., K/2] against scales [.., K/block] (gpt-oss: [.., G, 16] vs [.., G]). */
    if (u->scale >= 0 && c->tensors[u->scale].trusted && w->trusted) {
        scan_tensor *s = &c->tensors[u->scale];
        char ws[160], ss[160];
        shape_str(w, ws, sizeof ws);
        shape_str(s, ss, sizeof ss);
        bool wok, sok;
        int64_t K = 0, G = 0;
        /* The scale shape the packed weight implies: its leading dims and G blocks per row. */
        int64_t want[FP4D_ST_MAX_DIMS];
        int32_t nwant = 0;
        if (u->kind == UNIT_GPTOSS) {
            wok = w->ndim >= 2 && w->shape[w->ndim - 1] == 16;
            G = wok ? w->shape[w->ndim - 2] : 0;
            nwant = wok ? w->ndim - 1 : 0;
        } else {
            K = w->ndim >= 1 ? 2 * w->shape[w->ndim - 1] : 0;
            wok = w->ndim >= 2 && K > 0 && K % u->block == 0;
            G = wok ? K / u->block : 0;
            nwant = wok ? w->ndim : 0;
        }
        for (int32_t i = 0; i < nwant; i++) want[i] = w->shape[i];
        if (nwant) want[nwant - 1] = G;
        sok = wok && s->ndim == nwant;
        for (int32_t i = 0; sok && i < nwant; i++) sok = s->shape[i] == want[i];
        if (!wok)
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SHAPE_MISMATCH, FP4D_SCAN_ERROR, w->name, wfile, 1,
                                              "%s has shape %s: %s", w->name, ws,
                                              u->kind == UNIT_GPTOSS ? "expected [.., G, 16]"
                                              : w->ndim < 2         ? "expected [.., rows, K/2]"
                                                                    : "K = 2 x last dim must be a multiple of the block size"));
        else if (!sok) {
            /* Name the whole expected shape: the rows may be what differs (the message used to
             * speak of columns only, also when the columns were right). */
            char es[160];
            int64_t rp = 0, cp = 0;
            dims_str(want, nwant, es, sizeof es);
            if (swizzled_shape(s, want, nwant, &rp, &cp))
                FP4D_FORWARD_IF_ERROR(add_finding(
                    c, FP4D_FINDING_SHAPE_MISMATCH, FP4D_SCAN_ERROR, s->name, file_rel(c, s->file), 1,
                    "%s has shape %s: the 128x4-swizzled layout, padded to %lld rows x %lld columns (spec §6); "
                    "packed %s %s implies linear scales %s. Checkpoints store scales linear and engines swizzle "
                    "them at load: a kernel's buffer saved as is, which loaders reject or swizzle twice",
                    s->name, ss, (long long)rp, (long long)cp, w->name, ws, es));
            else
                FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SHAPE_MISMATCH, FP4D_SCAN_ERROR, s->name,
                                                  file_rel(c, s->file), 1,
                                                  "%s has shape %s; packed %s %s implies %s (one scale per %lld "
                                                  "elements of a row)",
                                                  s->name, ss, w->name, ws, es, (long long)u->block));
        }
        u->joint_ok = wok && sok;
    }
    if (scale_bytes_ok) {
        scan_tensor *s = &c->tensors[u->scale];
        if (u->joint_ok) {
            u->scale_cols = s->shape[s->ndim - 1];
            u->rows = shape_product(s->shape, s->ndim - 1);
            u->block_bytes = u->block / 2;
        } else {
            /* Shapes disagree: still look at every scale byte, as one flat row per last dim. */
            u->scale_cols = s->ndim ? s->shape[s->ndim - 1] : 1;
            u->rows = s->ndim ? shape_product(s->shape, s->ndim - 1) : 1;
        }
        if (u->scale_cols <= 0 || u->rows <= 0) u->rows = u->scale_cols = 0;
        if (s->ndim >= 3 && strstr(u->module, "experts") && scan_name_expert(u->module) < 0 && s->shape[0] > 0) {
            u->num_experts = s->shape[0];
            u->rows_per_expert = u->rows / s->shape[0];
        }
    }
    /* Global and input scales: one value (or one per fused expert). */
    int64_t comp[2] = {u->global, u->input};
    for (int k = 0; k < 2; k++) {
        if (comp[k] < 0 || !c->tensors[comp[k]].trusted) continue;
        scan_tensor *g = &c->tensors[comp[k]];
        uint64_t n = tensor_elems(g);
        bool ok = n == 1 || (w->trusted && w->ndim >= 3 && (int64_t)n == w->shape[0]);
        if (!ok) {
            char gs[160];
            shape_str(g, gs, sizeof gs);
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SHAPE_MISMATCH, FP4D_SCAN_ERROR, g->name,
                                              file_rel(c, g->file), 1,
                                              "%s has shape %s; one value (or one per expert) expected", g->name, gs));
        }
    }
    return FP4D_STATUS_OK;
}

static bool is_scale_suffix(const scan_ctx *c, const char *n, const char **module_end_sfx)
{
    static const char *const sfx[] = {".weight_scale_2", ".weight_global_scale", ".input_global_scale",
                                      ".weight_scale", ".input_scale"};
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (ends_with(n, sfx[i])) {
            *module_end_sfx = sfx[i];
            return true;
        }
    if (ends_with(n, "_scales") && (c->format == FP4D_CKPT_GPTOSS_MXFP4 || strstr(n, "experts"))) {
        *module_end_sfx = "_scales";
        return true;
    }
    return false;
}

static fp4d_status check_orphans(scan_ctx *c)
{
    for (size_t i = 0; i < c->num_tensors; i++) {
        scan_tensor *t = &c->tensors[i];
        const char *sfx;
        if (t->claimed || !is_first(c, i) || !is_scale_suffix(c, t->name, &sfx)) continue;
        size_t mlen = strlen(t->name) - strlen(sfx);
        char *module = strndup(t->name, mlen);
        if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        int64_t w = find_companion(c, module, ".weight");
        free(module);
        /* Scales of an FP8 linear are that linear's, and a stray input_scale next to an
         * unquantized weight is harmless: neither is an FP4 orphan. */
        if (w >= 0 && (!c->tensors[w].trusted || is_fp8_dtype(c->tensors[w].dtype))) continue;
        if (w >= 0 && !strcmp(sfx, ".input_scale")) continue;
        /* "unquantized" only where it is: a U8 weight here is packed, but not as FP4 with this
         * scale (a U8 weight with F8_E4M3 scales and no weight_scale_2 was called unquantized) */
        char why[160] = "";
        if (w >= 0 && is_float_dtype(c->tensors[w].dtype))
            snprintf(why, sizeof why, " (the weight is stored unquantized, %s)", dtype_str(c->tensors[w].dtype));
        else if (w >= 0)
            snprintf(why, sizeof why, " (the weight is %s, not packed FP4 with this scale)",
                     dtype_str(c->tensors[w].dtype));
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_ORPHAN_SCALE, FP4D_SCAN_ERROR, t->name, file_rel(c, t->file), 1,
                                          "%s has no packed FP4 weight next to it%s", t->name, why));
    }
    return FP4D_STATUS_OK;
}

static fp4d_status check_quantized_but_excluded(scan_ctx *c)
{
    if (!c->have_config || c->format == FP4D_CKPT_UNQUANTIZED || !c->num_units) return FP4D_STATUS_OK;
    for (size_t i = 0; i < c->num_tensors; i++) {
        scan_tensor *t = &c->tensors[i];
        if (t->claimed || !t->trusted || !is_first(c, i) || !is_float_dtype(t->dtype) || t->ndim < 2) continue;
        size_t len = strlen(t->name);
        char *module = ends_with(t->name, ".weight") ? strndup(t->name, len - 7) : strdup(t->name);
        if (!module) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        /* Compared with modules of the same kind that are quantized elsewhere in the checkpoint:
         * every unlisted router or embedding would otherwise be flagged. */
        bool same_kind = false;
        const char *leaf = scan_name_leaf(module);
        for (size_t u = 0; u < c->num_units && !same_kind; u++) same_kind = !strcmp(scan_name_leaf(c->units[u].module), leaf);
        bool flag = same_kind && !fp4d_quant_config_is_excluded(c->qc, module);
        fp4d_status st = FP4D_STATUS_OK;
        if (flag)
            st = add_finding(c, FP4D_FINDING_QUANTIZED_BUT_EXCLUDED, FP4D_SCAN_ERROR, t->name, file_rel(c, t->file), 1,
                             "%s is stored %s, but the quant config quantizes %s (it is not excluded): engines "
                             "expect packed FP4 and its scales",
                             t->name, dtype_str(t->dtype), module);
        free(module);
        FP4D_FORWARD_IF_ERROR(st);
    }
    return FP4D_STATUS_OK;
}

/* Threads for `items` pieces of work: --threads, else one per online CPU; at most 256 and at
 * most one per piece, at least one. */
static int scan_threads(const scan_ctx *c, size_t items)
{
    long n = c->opt.threads > 0 ? c->opt.threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (n > 256) n = 256;
    if ((size_t)n > items) n = (long)items;
    return n < 1 ? 1 : (int)n;
}

/* ---- file digests (--verify-hashes) ------------------------------------------------------ */

static bool is_sha256_hex(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return false;
    return n == 64;
}

/* The digest SHA256SUMS (sha256sum's format: "HEX  NAME" or "HEX *NAME") gives rel, if any. */
static bool sums_digest(const char *sums, const char *rel, char hex[65])
{
    for (const char *line = sums; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > 66 && (line[64] == ' ' || line[64] == '\t')) {
            const char *name = line + 65;
            if (*name == ' ' || *name == '*') name++;
            size_t nl = len - (size_t)(name - line);
            while (nl && (name[nl - 1] == '\r' || name[nl - 1] == ' ')) nl--;
            if (name[0] == '.' && name[1] == '/') name += 2, nl = nl >= 2 ? nl - 2 : 0;
            if (nl == strlen(rel) && !memcmp(name, rel, nl)) {
                memcpy(hex, line, 64);
                hex[64] = '\0';
                for (int i = 0; i < 64; i++) hex[i] = (char)tolower((unsigned char)hex[i]);
                if (is_sha256_hex(hex)) return true;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return false;
}

/* What a file's digest should be, and who says so: a Hugging Face cache names each LFS file
 * (safetensors are) blobs/SHA256, the snapshot holding a link to it; else SHA256SUMS. */
static const char *expected_digest(const scan_file *f, const char *sums, bool single_file, char hex[65])
{
    char target[4096];
    const ssize_t n = readlink(f->path, target, sizeof target - 1);
    const char *name = f->path;
    if (n > 0) {
        target[n] = '\0';
        name = target;
    }
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    if (is_sha256_hex(base)) {
        memcpy(hex, base, 65);
        return "its Hugging Face cache blob name";
    }
    /* a single file is listed in the SHA256SUMS beside it by its name alone */
    const char *listed = f->rel;
    const char *rel_slash = strrchr(f->rel, '/');
    if (single_file && rel_slash) listed = rel_slash + 1;
    if (sums && sums_digest(sums, listed, hex)) return "SHA256SUMS";
    return NULL;
}

typedef struct digest_job {
    scan_ctx         *c;
    const char       *sums;
    char            (*want)[65], (*got)[65], (*why)[160];
    const char      **source;
    atomic_size_t     next;
} digest_job;

static void *digest_worker(void *arg)
{
    digest_job *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->c->num_files;) {
        const scan_file *f = &j->c->files[i];
        if (f->fd < 0 || f->state == FILE_UNREADABLE ||
            !(j->source[i] = expected_digest(f, j->sums, !j->c->root, j->want[i])))
            continue;
        if (!scan_sha256_fd(f->fd, f->size, j->got[i], j->why[i], sizeof j->why[i])) j->got[i][0] = '\0';
    }
    return NULL;
}

/* Hashes every file that has a digest to check, one file per thread at a time, and reports
 * each that differs (or cannot be read), with a note of how many were checked. */
static fp4d_status check_file_digests(scan_ctx *c)
{
    if (!c->opt.verify_hashes || !c->num_files) return FP4D_STATUS_OK;
    FP4D_RETURN_ERROR_IF(!scan_hashes_available(), UNSUPPORTED,
                         "--verify-hashes: this fp4doctor was built without OpenSSL's libcrypto (libssl-dev)");
    char *sums = NULL;
    size_t sums_len = 0;
    small_file_state state = SMALL_FILE_ABSENT;
    char why[160];
    {
        /* beside the shards, or beside the one file scanned */
        const char *file0 = c->files[0].path, *slash = strrchr(file0, '/');
        char *dir = c->root ? strdup(c->root) : slash ? strndup(file0, (size_t)(slash - file0)) : strdup(".");
        char *p = dir ? path_join(dir, "SHA256SUMS") : NULL;
        free(dir);
        if (!p) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        fp4d_status st = scan_read_small_file(p, &sums, &sums_len, &state, why, sizeof why);
        free(p);
        FP4D_FORWARD_IF_ERROR(st);
        if (state == SMALL_FILE_UNREADABLE)
            FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_HEADER_INVALID, FP4D_SCAN_ERROR, NULL, "SHA256SUMS", 1,
                                              "cannot read SHA256SUMS: %s; its digests are not checked", why));
    }
    digest_job j = {.c = c, .sums = sums};
    j.want = calloc(c->num_files, sizeof *j.want);
    j.got = calloc(c->num_files, sizeof *j.got);
    j.why = calloc(c->num_files, sizeof *j.why);
    j.source = calloc(c->num_files, sizeof *j.source);
    atomic_init(&j.next, 0);
    fp4d_status st = FP4D_STATUS_OK;
    if (!j.want || !j.got || !j.why || !j.source) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    const size_t nthreads = (size_t)scan_threads(c, c->num_files);
    pthread_t *tids = st == FP4D_STATUS_OK ? calloc(nthreads, sizeof *tids) : NULL;
    size_t started = 0;
    if (st == FP4D_STATUS_OK && !tids) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    for (; st == FP4D_STATUS_OK && started < nthreads; started++)
        if (pthread_create(&tids[started], NULL, digest_worker, &j) != 0) break;
    if (st == FP4D_STATUS_OK && started == 0) digest_worker(&j); /* no thread to be had: this one */
    for (size_t t = 0; t < started; t++) pthread_join(tids[t], NULL);
    size_t checked = 0, without = 0;
    for (size_t i = 0; st == FP4D_STATUS_OK && i < c->num_files; i++) {
        const scan_file *f = &c->files[i];
        if (f->fd < 0 || f->state == FILE_UNREADABLE) continue;
        if (!j.source[i]) {
            without++;
            continue;
        }
        checked++;
        if (!j.got[i][0])
            st = add_finding(c, FP4D_FINDING_FILE_HASH_MISMATCH, FP4D_SCAN_ERROR, NULL, f->rel, 1,
                             "cannot hash %s: %s", f->rel, j.why[i]);
        else if (strcmp(j.got[i], j.want[i]))
            st = add_finding(c, FP4D_FINDING_FILE_HASH_MISMATCH, FP4D_SCAN_ERROR, NULL, f->rel, 1,
                             "%s has sha256 %.16s..., but %s says %.16s...: the file is corrupt or was changed after "
                             "it was downloaded; download it again", f->rel, j.got[i], j.source[i], j.want[i]);
    }
    if (st == FP4D_STATUS_OK) {
        char note[200];
        snprintf(note, sizeof note, "sha256 checked for %zu of %zu file(s)%s", checked, checked + without,
                 without ? " (the others have no Hugging Face cache blob name or SHA256SUMS entry)" : "");
        st = add_note(c, note);
    }
    free(tids);
    free(j.source);
    free(j.why);
    free(j.got);
    free(j.want);
    free(sums);
    return st;
}

bool fp4d_scan_hashes_available(void) { return scan_hashes_available(); }

/* ---- tensor-parallel shards (--tp) ------------------------------------------------------ */

/* How one rank's shard of a unit is cut at this TP degree (scan_tp_plan). */
static scan_tp_cut shard_cut(const scan_ctx *c, const scan_unit *u, int tp)
{
    const scan_tensor *w = &c->tensors[u->weight];
    const scan_tp_cut none = {.problem = SCAN_TP_OK, .replicas = 1};
    int64_t n, k;
    if (!w->trusted) return none;
    if (u->kind == UNIT_GPTOSS) {
        if (w->ndim < 3) return none;
        n = w->shape[w->ndim - 3];
        k = w->shape[w->ndim - 2] * 32;
    } else {
        if (w->ndim < 2) return none;
        n = w->shape[w->ndim - 2];
        k = 2 * w->shape[w->ndim - 1];
    }
    return scan_tp_plan(u->module, n, k, u->block, u->is_mx, &c->heads, tp);
}

/* One finding per weight, as for every other finding: the per-layer table then says which
 * layers a TP degree breaks. */
static fp4d_status check_tp_shards(scan_ctx *c)
{
    const int tp = c->opt.tensor_parallel;
    for (size_t i = 0; tp > 1 && i < c->num_units; i++) {
        const scan_unit *u = &c->units[i];
        const scan_tp_cut cut = shard_cut(c, u, tp);
        const scan_tp_problem problem = cut.problem;
        if (problem == SCAN_TP_OK) continue;
        const scan_tensor *w = &c->tensors[u->weight];
        const char *leaf = scan_name_leaf(u->module);
        const bool split_k = cut.split_k;
        const long long d = (long long)cut.dim, per = (long long)cut.per_rank;
        fp4d_status st;
        if (problem == SCAN_TP_HEADS)
            st = add_finding(c, FP4D_FINDING_TP_SHARD, FP4D_SCAN_ERROR, w->name, file_rel(c, w->file), 1,
                             "%s: %s: engines refuse it at --tp %d", w->name,
                             scan_tp_heads_why(&cut, u->module, tp, (char[400]){0}, 400), tp);
        else if (problem == SCAN_TP_UNEVEN && cut.num_parts)
            st = add_finding(c, FP4D_FINDING_TP_SHARD, FP4D_SCAN_ERROR, w->name, file_rel(c, w->file), 1,
                             "%s: " SCAN_TP_GATE_UP_UNEVEN ": engines refuse it at --tp %d", w->name,
                             (long long)cut.parts[0].all, tp, tp);
        else if (problem == SCAN_TP_UNEVEN)
            st = add_finding(c, FP4D_FINDING_TP_SHARD, FP4D_SCAN_ERROR, w->name, file_rel(c, w->file), 1,
                             "%s has %s = %lld, which %d tensor-parallel ranks cannot split evenly (%s is split %s): "
                             "engines refuse it at --tp %d", w->name, split_k ? "K" : "N", d, tp, leaf,
                             split_k ? "along K, row-parallel" : "along its output rows, column-parallel", tp);
        else if (problem == SCAN_TP_SPLIT_BLOCK)
            st = add_finding(c, FP4D_FINDING_TP_SHARD, FP4D_SCAN_ERROR, w->name, file_rel(c, w->file), 1,
                             "%s has K = %lld: at --tp %d each rank holds K = %lld, which splits a %lld-element "
                             "scale block between two ranks", w->name, d, tp, per, (long long)u->block);
        else
            st = add_finding(c, FP4D_FINDING_TP_SHARD, FP4D_SCAN_WARNING, w->name, file_rel(c, w->file), 1,
                             "%s has K = %lld: at --tp %d each rank holds K = %lld, not a multiple of 32, so each "
                             "rank's " SCAN_TP_PADDED_SCALES_WHY ". Prefer a Marlin linear backend at this TP degree, or one that "
                             "keeps K / tp a multiple of 32", w->name, d, tp, per);
        FP4D_FORWARD_IF_ERROR(st);
    }
    return FP4D_STATUS_OK;
}

/* ---- phase 3a: global and input scales --------------------------------------------------- */

static bool read_exact(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return true;
}

/* Reads a small float tensor as doubles. NULL when it cannot be read. */
static double *read_scalars(scan_ctx *c, int64_t ti, uint64_t *n_out)
{
    scan_tensor *t = &c->tensors[ti];
    uint64_t n = tensor_elems(t);
    *n_out = 0;
    if (!t->readable || !is_float_dtype(t->dtype) || n == 0 || n > SCAN_MAX_GLOBAL_ELEMS) return NULL;
    size_t esz = fp4d_st_dtype_bits(t->dtype) / 8;
    uint8_t *raw = malloc(n * esz);
    double *v = malloc(n * sizeof *v);
    if (!raw || !v || !read_exact(c->files[t->file].fd, raw, n * esz, c->files[t->file].data_start + t->begin)) {
        free(raw);
        free(v);
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = raw + i * esz;
        switch (t->dtype) {
        case FP4D_ST_F32: { float f; memcpy(&f, p, 4); v[i] = f; break; }
        case FP4D_ST_F64: { double d; memcpy(&d, p, 8); v[i] = d; break; }
        case FP4D_ST_BF16: v[i] = fp4d_bf16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
        case FP4D_ST_F16: v[i] = fp4d_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
        default: v[i] = NAN; break;
        }
    }
    free(raw);
    c->rep->bytes_scanned += n * esz;
    *n_out = n;
    return v;
}

typedef struct scalar_values {
    double  *v;
    uint64_t n;
} scalar_values;

/* is_input: activation scale; encode: compressed-tensors' 2688/amax convention. */
static fp4d_status check_scalar_values(scan_ctx *c, int64_t ti, const scalar_values *sv, bool is_input, bool encode)
{
    scan_tensor *t = &c->tensors[ti];
    const char *f = file_rel(c, t->file);
    uint64_t nonfinite = 0, nonpos = 0, convention = 0;
    double first_nonfinite = 0, first_nonpos = 0, first_conv = 0;
    /* Decode scales are amax/2688: a weight scale_2 >= 1 means |w| >= 2688 and an input
     * scale >= 16 means activations >= 43,008, both implausible, while their reciprocals
     * are ordinary encode scales. Encode scales mirror that (docs/scan.md). */
    double limit = is_input ? 16.0 : 1.0;
    for (uint64_t i = 0; i < sv->n; i++) {
        double x = sv->v[i];
        if (!isfinite(x)) {
            if (!nonfinite++) first_nonfinite = x;
        } else if (x <= 0) {
            if (!nonpos++) first_nonpos = x;
        } else if (encode ? x <= 1.0 / limit : x >= limit) {
            if (!convention++) first_conv = x;
        }
    }
    if (nonfinite)
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_GLOBAL_SCALE_NONFINITE, FP4D_SCAN_ERROR, t->name, f, nonfinite,
                                          "%s holds %g: every output of this layer becomes NaN/Inf", t->name,
                                          first_nonfinite));
    if (nonpos)
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_GLOBAL_SCALE_NONPOSITIVE, FP4D_SCAN_ERROR, t->name, f, nonpos,
                                          "%s holds %g: a %s scale must be > 0", t->name, first_nonpos,
                                          encode ? "global" : "decode"));
    if (convention)
        FP4D_FORWARD_IF_ERROR(add_finding(
            c, FP4D_FINDING_GLOBAL_SCALE_CONVENTION, FP4D_SCAN_ERROR, t->name, f, convention,
            "%s = %g only makes sense as %s scale (%s); this format stores %s scales (%s): the reciprocal "
            "was probably written",
            t->name, first_conv, encode ? "a decode" : "an encode", encode ? "amax/2688" : "2688/amax",
            encode ? "encode" : "decode", encode ? "2688/amax, compressed-tensors" : "amax/2688, ModelOpt"));
    return FP4D_STATUS_OK;
}

/* Fusion groups: q/k/v and gate/up (w1/w3) of one parent share one weight global scale and
 * one input scale in ModelOpt and llm-compressor exports (spec §4.5, §7a). */
static int fusion_group_of(const char *leaf)
{
    if (!strcmp(leaf, "q_proj") || !strcmp(leaf, "k_proj") || !strcmp(leaf, "v_proj")) return 1;
    if (!strcmp(leaf, "gate_proj") || !strcmp(leaf, "up_proj")) return 2;
    if (!strcmp(leaf, "w1") || !strcmp(leaf, "w3")) return 3;
    return 0;
}

static int fusion_rank(const char *leaf)
{
    static const char *const order[] = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(leaf, order[i])) return i;
    return 99;
}

typedef struct fused_member {
    size_t      unit;
    const char *parent; /* owned by the caller's array */
    size_t      parent_len;
    int         group, rank;
} fused_member;

static int fused_cmp(const void *a, const void *b)
{
    const fused_member *x = a, *y = b;
    size_t n = x->parent_len < y->parent_len ? x->parent_len : y->parent_len;
    int c = memcmp(x->parent, y->parent, n);
    if (c) return c;
    if (x->parent_len != y->parent_len) return x->parent_len < y->parent_len ? -1 : 1;
    if (x->group != y->group) return x->group - y->group;
    return x->rank - y->rank;
}

static bool values_equal(const scalar_values *a, const scalar_values *b)
{
    if (!a->v || !b->v || a->n != b->n) return true; /* unknown: do not accuse */
    for (uint64_t i = 0; i < a->n; i++)
        if (a->v[i] != b->v[i] && !(isnan(a->v[i]) && isnan(b->v[i]))) return false;
    return true;
}

static fp4d_status check_fused_group(scan_ctx *c, const fused_member *m, size_t n, scalar_values *vals, int which)
{
    /* The odd ones out are those that differ from the most common value; with no majority
     * (a pair) the first member in q,k,v / gate,up order is taken as the reference. */
    size_t best = 0, best_votes = 0;
    for (size_t i = 0; i < n; i++) {
        size_t votes = 0;
        for (size_t j = 0; j < n; j++) votes += values_equal(&vals[i * 2 + which], &vals[j * 2 + which]);
        if (votes > best_votes) {
            best_votes = votes;
            best = i;
        }
    }
    size_t odd = 0, first_odd = 0;
    for (size_t i = 0; i < n; i++)
        if (!values_equal(&vals[i * 2 + which], &vals[best * 2 + which]))
            if (!odd++) first_odd = i;
    if (!odd) return FP4D_STATUS_OK;
    scan_unit *u = &c->units[m[first_odd].unit], *ref = &c->units[m[best].unit];
    int64_t ti = which == 0 ? u->global : u->input;
    int64_t ri = which == 0 ? ref->global : ref->input;
    scan_tensor *t = &c->tensors[ti];
    /* A weight scale that differs breaks the fused GEMM (engines use one alpha: the max);
     * an input scale that differs only coarsens activation quantization. MoE experts: vLLM
     * reconciles w1/w3 weight scales itself, so a warning there. */
    bool expert = scan_name_expert(u->module) >= 0;
    fp4d_scan_severity sev = which == 0 && !expert ? FP4D_SCAN_ERROR : FP4D_SCAN_WARNING;
    return add_finding(c, FP4D_FINDING_FUSED_SCALE_MISMATCH, sev, t->name, file_rel(c, t->file), odd,
                       "%s = %g but %s = %g: fused siblings must share one %s scale (engines take the max)",
                       t->name, vals[first_odd * 2 + which].v[0], c->tensors[ri].name, vals[best * 2 + which].v[0],
                       which == 0 ? "weight global" : "input");
}

static fp4d_status check_global_scales(scan_ctx *c)
{
    scalar_values *vals = calloc(c->num_units * 2 + 1, sizeof *vals);
    fused_member *members = calloc(c->num_units + 1, sizeof *members);
    if (!vals || !members) {
        free(vals);
        free(members);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    fp4d_status st = FP4D_STATUS_OK;
    size_t nm = 0;
    for (size_t i = 0; i < c->num_units && st == FP4D_STATUS_OK; i++) {
        scan_unit *u = &c->units[i];
        int64_t comp[2] = {u->global, u->input};
        for (int k = 0; k < 2 && st == FP4D_STATUS_OK; k++) {
            if (comp[k] < 0) continue;
            bool values_ok;
            st = check_scalar_dtype(c, comp[k], &values_ok);
            if (st != FP4D_STATUS_OK || !values_ok) continue;
            vals[i * 2 + k].v = read_scalars(c, comp[k], &vals[i * 2 + k].n);
            if (vals[i * 2 + k].v)
                st = check_scalar_values(c, comp[k], &vals[i * 2 + k], k == 1, u->kind == UNIT_CT_NVFP4);
        }
        const char *leaf = scan_name_leaf(u->module);
        int g = fusion_group_of(leaf);
        if (g && leaf != u->module)
            members[nm++] = (fused_member){i, u->module, (size_t)(leaf - 1 - u->module), g, fusion_rank(leaf)};
    }
    if (nm > 1) qsort(members, nm, sizeof *members, fused_cmp);
    for (size_t a = 0; a < nm && st == FP4D_STATUS_OK;) {
        size_t b = a + 1;
        while (b < nm && members[b].group == members[a].group && members[b].parent_len == members[a].parent_len &&
               !memcmp(members[b].parent, members[a].parent, members[a].parent_len))
            b++;
        if (b - a > 1) {
            /* Values of this group, packed as [member][global, input]. */
            scalar_values *gv = calloc((b - a) * 2, sizeof *gv);
            if (!gv) {
                st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
                break;
            }
            for (size_t i = a; i < b; i++) {
                gv[(i - a) * 2]     = vals[members[i].unit * 2];
                gv[(i - a) * 2 + 1] = vals[members[i].unit * 2 + 1];
            }
            for (int which = 0; which < 2 && st == FP4D_STATUS_OK; which++)
                st = check_fused_group(c, members + a, b - a, gv, which);
            free(gv);
        }
        a = b;
    }
    for (size_t i = 0; i < c->num_units * 2; i++) free(vals[i].v);
    free(vals);
    free(members);
    return st;
}

/* ---- phase 3b: block scales, packed codes and unquantized values, in chunks ---------------- */

/* The pattern TensorRT-LLM/FlashInfer leave when a block scale underflows to 0: every code
 * is +-0 or +-6 (spec §4.8, last row). Such blocks were ~0 anyway. */
static bool block_underflow_pattern(const uint8_t *p, int64_t nbytes)
{
    for (int64_t i = 0; i < nbytes; i++) {
        uint8_t lo = p[i] & 7, hi = (p[i] >> 4) & 7;
        if ((lo != 0 && lo != 7) || (hi != 0 && hi != 7)) return false;
    }
    return true;
}

#define NIBBLE_MAGNITUDES 0x7777777777777777ull /* every code without its sign bit */

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* One block (bb = 8 or 16 bytes of codes): non-zero if any code is not +-0. */
static inline uint64_t block_bits(const uint8_t *p, int64_t bb)
{
    return (bb == 8 ? load64(p) : load64(p) | load64(p + 8)) & NIBBLE_MAGNITUDES;
}

typedef struct unit_tally {
    uint64_t hist[4][256]; /* four tables: consecutive equal bytes do not wait on each other */
    uint64_t zhist[256];
    uint64_t znz, unexplained;
} unit_tally;

/* Rows [r0, r0 + nrows) of one unit, with the scale bytes sb and (if db) the codes db. */
static void tally_rows(const scan_unit *u, const uint8_t *sb, const uint8_t *db, uint64_t nrows, unit_tally *t)
{
    int64_t C = u->scale_cols, bb = u->block_bytes;
    bool nv = !u->is_mx;
    uint64_t n = nrows * (uint64_t)C, k = 0;
    for (; k + 4 <= n; k += 4) {
        t->hist[0][sb[k]]++;
        t->hist[1][sb[k + 1]]++;
        t->hist[2][sb[k + 2]]++;
        t->hist[3][sb[k + 3]]++;
    }
    for (; k < n; k++) t->hist[0][sb[k]]++;
    if (!db) return;
    for (uint64_t r = 0; r < nrows; r++) {
        const uint8_t *srow = sb + r * (uint64_t)C, *drow = db + r * (uint64_t)C * (uint64_t)bb;
        int64_t c = 0;
        /* Eight blocks at a time: skip them when every one holds data under a non-zero scale,
         * which is nearly always; look at them one by one otherwise. */
        for (; c + 8 <= C; c += 8) {
            uint64_t sw = load64(srow + c);
            uint64_t zero_scale = nv ? ((sw - 0x0101010101010101ull) & ~sw & 0x8080808080808080ull) : 0;
            uint64_t zero_block = 0;
            for (int i = 0; i < 8; i++) zero_block |= block_bits(drow + (c + i) * bb, bb) == 0;
            if (!(zero_block | zero_scale)) continue;
            for (int64_t i = c; i < c + 8; i++) {
                bool data = block_bits(drow + i * bb, bb) != 0;
                if (!data) t->zhist[srow[i]]++;
                else if (nv && srow[i] == 0) {
                    t->znz++;
                    t->unexplained += !block_underflow_pattern(drow + i * bb, bb);
                }
            }
        }
        for (; c < C; c++) {
            bool data = block_bits(drow + c * bb, bb) != 0;
            if (!data) t->zhist[srow[c]]++;
            else if (nv && srow[c] == 0) {
                t->znz++;
                t->unexplained += !block_underflow_pattern(drow + c * bb, bb);
            }
        }
    }
}

static void run_unit_job(scan_ctx *c, const scan_job *j, uint8_t *buf)
{
    scan_unit *u = &c->units[j->target];
    scan_tensor *s = &c->tensors[u->scale];
    bool with_data = u->data_scanned;
    int64_t C = u->scale_cols, bb = u->block_bytes;
    uint64_t sbytes = j->count * (uint64_t)C, dbytes = with_data ? sbytes * (uint64_t)bb : 0;
    uint8_t *sb = buf, *db = buf + sbytes;
    if (!read_exact(c->files[s->file].fd, sb, sbytes, c->files[s->file].data_start + s->begin + j->first * (uint64_t)C)) {
        atomic_store(&c->io_failed, true);
        return;
    }
    if (with_data) {
        scan_tensor *w = &c->tensors[u->weight];
        if (!read_exact(c->files[w->file].fd, db, dbytes,
                        c->files[w->file].data_start + w->begin + j->first * (uint64_t)C * (uint64_t)bb)) {
            atomic_store(&c->io_failed, true);
            return;
        }
    }
    unit_tally *t = calloc(1, sizeof *t);
    if (!t) {
        atomic_store(&c->io_failed, true);
        return;
    }
    /* Fused experts: one tally per expert's rows, so NaN/sign/zero counts split by expert. */
    uint64_t r = 0;
    while (r < j->count) {
        uint64_t end = j->count;
        int64_t e = -1;
        if (u->num_experts) {
            uint64_t g = j->first + r;
            e = (int64_t)(g / (uint64_t)u->rows_per_expert);
            if (e >= u->num_experts) e = u->num_experts - 1;
            uint64_t e_end = (uint64_t)(e + 1) * (uint64_t)u->rows_per_expert - j->first;
            if (e == u->num_experts - 1) e_end = j->count;
            if (e_end < end) end = e_end;
        }
        uint64_t before_znz = t->znz;
        uint64_t h[256];
        if (e >= 0)
            for (int b = 0; b < 256; b++) h[b] = t->hist[0][b] + t->hist[1][b] + t->hist[2][b] + t->hist[3][b];
        tally_rows(u, sb + r * (uint64_t)C, with_data ? db + r * (uint64_t)C * (uint64_t)bb : NULL, end - r, t);
        if (e >= 0) {
            uint64_t nan = 0, neg = 0;
            for (int b = 0; b < 256; b++) {
                uint64_t d = t->hist[0][b] + t->hist[1][b] + t->hist[2][b] + t->hist[3][b] - h[b];
                if (u->is_mx ? b == 0xFF : (b & 0x7F) == 0x7F) nan += d;
                else if (!u->is_mx && (b & 0x80)) neg += d;
            }
            if (nan || neg || t->znz != before_znz) {
                pthread_mutex_lock(&u->lock);
                u->exp_nan[e] += nan;
                u->exp_neg[e] += neg;
                u->exp_znz[e] += t->znz - before_znz;
                pthread_mutex_unlock(&u->lock);
            }
        }
        r = end;
    }
    pthread_mutex_lock(&u->lock);
    for (int b = 0; b < 256; b++) {
        u->hist[b] += t->hist[0][b] + t->hist[1][b] + t->hist[2][b] + t->hist[3][b];
        u->zero_hist[b] += t->zhist[b];
    }
    u->znz_blocks += t->znz;
    u->znz_unexplained += t->unexplained;
    pthread_mutex_unlock(&u->lock);
    free(t);
    atomic_fetch_add(&c->bytes_done, sbytes + dbytes);
}

static uint64_t count_nonfinite(fp4d_st_dtype d, const uint8_t *p, uint64_t n)
{
    uint64_t bad = 0;
    switch (d) {
    case FP4D_ST_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            bad += (v & 0x7F80u) == 0x7F80u;
        }
        break;
    case FP4D_ST_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            bad += (v & 0x7C00u) == 0x7C00u;
        }
        break;
    case FP4D_ST_F32:
        for (uint64_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            bad += (v & 0x7F800000u) == 0x7F800000u;
        }
        break;
    case FP4D_ST_F64:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t v;
            memcpy(&v, p + 8 * i, 8);
            bad += (v & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
        }
        break;
    case FP4D_ST_F8_E4M3: /* e4m3fn: NaN is S.1111.111, no Inf */
        for (uint64_t i = 0; i < n; i++) bad += (p[i] & 0x7F) == 0x7F;
        break;
    case FP4D_ST_F8_E5M2: /* IEEE-like: exponent all ones is Inf/NaN */
        for (uint64_t i = 0; i < n; i++) bad += (p[i] & 0x7C) == 0x7C;
        break;
    case FP4D_ST_F8_E4M3FNUZ:
    case FP4D_ST_F8_E5M2FNUZ: /* FNUZ: the only NaN is 0x80 */
        for (uint64_t i = 0; i < n; i++) bad += p[i] == 0x80;
        break;
    default: break;
    }
    return bad;
}

static bool plain_dtype_checked(fp4d_st_dtype d)
{
    return is_float_dtype(d) || is_fp8_dtype(d);
}

static void run_plain_job(scan_ctx *c, const scan_job *j, uint8_t *buf)
{
    plain_target *pt = &c->plains[j->target];
    scan_tensor *t = &c->tensors[pt->tensor];
    uint64_t esz = fp4d_st_dtype_bits(t->dtype) / 8;
    if (!read_exact(c->files[t->file].fd, buf, j->count * esz, c->files[t->file].data_start + t->begin + j->first * esz)) {
        atomic_store(&c->io_failed, true);
        return;
    }
    uint64_t total = 0;
    if (pt->num_experts) {
        /* Split at expert boundaries so each expert gets its own count. */
        uint64_t i = 0;
        while (i < j->count) {
            uint64_t g = j->first + i;
            uint64_t e = g / (uint64_t)pt->elems_per_expert;
            uint64_t end = (e + 1) * (uint64_t)pt->elems_per_expert - j->first;
            if (end > j->count) end = j->count;
            uint64_t bad = count_nonfinite(t->dtype, buf + i * esz, end - i);
            if (bad) {
                if (e >= (uint64_t)pt->num_experts) e = (uint64_t)pt->num_experts - 1;
                pthread_mutex_lock(&pt->lock);
                pt->exp_nonfinite[e] += bad;
                pthread_mutex_unlock(&pt->lock);
            }
            total += bad;
            i = end;
        }
    } else {
        total = count_nonfinite(t->dtype, buf, j->count);
    }
    if (total) {
        pthread_mutex_lock(&pt->lock);
        pt->nonfinite += total;
        pthread_mutex_unlock(&pt->lock);
    }
    atomic_fetch_add(&c->bytes_done, j->count * esz);
}

static fp4d_status add_job(scan_ctx *c, size_t *cap, job_kind kind, int64_t target, uint64_t first, uint64_t count)
{
    if (c->num_jobs == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        scan_job *g = realloc(c->jobs, nc * sizeof *g);
        if (!g) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        c->jobs = g;
        *cap = nc;
    }
    c->jobs[c->num_jobs++] = (scan_job){kind, target, first, count};
    return FP4D_STATUS_OK;
}

static fp4d_status plan_jobs(scan_ctx *c, size_t *max_job_bytes)
{
    size_t cap = 0;
    *max_job_bytes = 0;
    for (size_t i = 0; i < c->num_units; i++) {
        scan_unit *u = &c->units[i];
        if (u->scale < 0 || !u->rows || !u->scale_cols) continue;
        scan_tensor *s = &c->tensors[u->scale];
        if (!s->readable || fp4d_st_dtype_bits(s->dtype) != 8 || (uint64_t)(u->rows * u->scale_cols) != tensor_elems(s))
            continue;
        u->scanned = true;
        /* the codes are read as bytes, block_bytes per scale: only where the tensor holds exactly
         * those (codes typed F4 hold half of them and were read past their end; DTYPE_MISMATCH
         * says why their values go unread) */
        const scan_tensor *w = &c->tensors[u->weight];
        u->data_scanned = u->joint_ok && !c->opt.scales_only && w->readable && fp4d_st_dtype_bits(w->dtype) == 8 &&
                          tensor_elems(w) == (uint64_t)u->rows * (uint64_t)u->scale_cols * (uint64_t)u->block_bytes;
        if (u->num_experts) {
            u->exp_nan = calloc((size_t)u->num_experts, sizeof *u->exp_nan);
            u->exp_neg = calloc((size_t)u->num_experts, sizeof *u->exp_neg);
            u->exp_znz = calloc((size_t)u->num_experts, sizeof *u->exp_znz);
            if (!u->exp_nan || !u->exp_neg || !u->exp_znz) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        }
        uint64_t row_bytes = (uint64_t)u->scale_cols * (1 + (u->data_scanned ? (uint64_t)u->block_bytes : 0));
        uint64_t rows_per_job = row_bytes >= SCAN_CHUNK_BYTES ? 1 : SCAN_CHUNK_BYTES / row_bytes;
        for (uint64_t r = 0; r < (uint64_t)u->rows; r += rows_per_job) {
            uint64_t n = (uint64_t)u->rows - r < rows_per_job ? (uint64_t)u->rows - r : rows_per_job;
            FP4D_FORWARD_IF_ERROR(add_job(c, &cap, JOB_UNIT, (int64_t)i, r, n));
            /* + one flag byte per block of a row (tally_rows) */
            if (n * row_bytes + (uint64_t)u->scale_cols > *max_job_bytes)
                *max_job_bytes = (size_t)(n * row_bytes + (uint64_t)u->scale_cols);
            c->rep->bytes_total += n * row_bytes;
        }
    }
    if (c->opt.scales_only) return FP4D_STATUS_OK;
    size_t np = 0;
    for (size_t i = 0; i < c->num_tensors; i++) {
        scan_tensor *t = &c->tensors[i];
        np += !t->claimed && t->readable && is_first(c, i) && plain_dtype_checked(t->dtype) && tensor_elems(t);
    }
    c->plains = calloc(np + 1, sizeof *c->plains);
    if (!c->plains) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    for (size_t i = 0; i < c->num_tensors; i++) {
        scan_tensor *t = &c->tensors[i];
        if (t->claimed || !t->readable || !is_first(c, i) || !plain_dtype_checked(t->dtype) || !tensor_elems(t)) continue;
        plain_target *pt = &c->plains[c->num_plains];
        pt->tensor = (int64_t)i;
        pthread_mutex_init(&pt->lock, NULL);
        uint64_t n = tensor_elems(t);
        if (t->ndim >= 2 && strstr(t->name, "experts") && scan_name_expert(t->name) < 0 && t->shape[0] > 1) {
            pt->num_experts = t->shape[0];
            pt->elems_per_expert = (int64_t)(n / (uint64_t)t->shape[0]);
            pt->exp_nonfinite = calloc((size_t)pt->num_experts, sizeof *pt->exp_nonfinite);
            if (!pt->exp_nonfinite) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        }
        int64_t target = (int64_t)c->num_plains++;
        uint64_t esz = fp4d_st_dtype_bits(t->dtype) / 8;
        uint64_t per_job = SCAN_CHUNK_BYTES / esz;
        for (uint64_t e = 0; e < n; e += per_job) {
            uint64_t k = n - e < per_job ? n - e : per_job;
            FP4D_FORWARD_IF_ERROR(add_job(c, &cap, JOB_PLAIN, target, e, k));
            if (k * esz > *max_job_bytes) *max_job_bytes = (size_t)(k * esz);
            c->rep->bytes_total += k * esz;
        }
    }
    return FP4D_STATUS_OK;
}

typedef struct worker_arg {
    scan_ctx *c;
    size_t    buf_bytes;
} worker_arg;

static void *scan_worker(void *arg)
{
    worker_arg *wa = arg;
    scan_ctx *c = wa->c;
    uint8_t *buf = malloc(wa->buf_bytes ? wa->buf_bytes : 1);
    if (!buf) atomic_store(&c->io_failed, true);
    for (; buf;) {
        size_t j = atomic_fetch_add(&c->next_job, 1);
        if (j >= c->num_jobs) break;
        if (c->jobs[j].kind == JOB_UNIT) run_unit_job(c, &c->jobs[j], buf);
        else run_plain_job(c, &c->jobs[j], buf);
    }
    free(buf);
    pthread_mutex_lock(&c->done_lock);
    atomic_fetch_sub(&c->workers_left, 1);
    pthread_cond_signal(&c->done_cond);
    pthread_mutex_unlock(&c->done_lock);
    return NULL;
}

static fp4d_status run_jobs(scan_ctx *c, size_t buf_bytes)
{
    if (!c->num_jobs) return FP4D_STATUS_OK;
    const int nthreads = scan_threads(c, c->num_jobs);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    if (!th) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    worker_arg wa = {c, buf_bytes};
    atomic_store(&c->workers_left, nthreads);
    pthread_mutex_init(&c->done_lock, NULL);
    pthread_cond_init(&c->done_cond, NULL);
    int started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, scan_worker, &wa) != 0) break;
    if (!started) {
        free(th);
        return fp4d_set_error(FP4D_STATUS_INTERNAL, "cannot start scan threads");
    }
    pthread_mutex_lock(&c->done_lock);
    atomic_fetch_sub(&c->workers_left, nthreads - started);
    pthread_mutex_unlock(&c->done_lock);
    /* Wake every 100 ms for the progress callback, at once when the last worker ends. */
    pthread_mutex_lock(&c->done_lock);
    while (atomic_load(&c->workers_left) > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->done_cond, &c->done_lock, &ts);
        if (c->opt.progress && atomic_load(&c->workers_left) > 0) {
            pthread_mutex_unlock(&c->done_lock);
            c->opt.progress(c->opt.progress_user, atomic_load(&c->bytes_done), c->rep->bytes_total);
            pthread_mutex_lock(&c->done_lock);
        }
    }
    pthread_mutex_unlock(&c->done_lock);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_cond_destroy(&c->done_cond);
    pthread_mutex_destroy(&c->done_lock);
    free(th);
    if (c->opt.progress) c->opt.progress(c->opt.progress_user, atomic_load(&c->bytes_done), c->rep->bytes_total);
    c->rep->bytes_scanned += atomic_load(&c->bytes_done);
    return FP4D_STATUS_OK;
}

/* ---- phase 4: findings from the values, the writer fingerprint ------------------------------- */

static double scale_log2(bool mx, int b)
{
    if (mx) return (double)b - 127.0;
    return log2((double)fp4d_e4m3_to_f32((uint8_t)b));
}

/* Block scales more than 2^10 away from the tensor's median scale, ignoring all-zero
 * blocks (or, without the codes, the writer's zero-block byte), zero and NaN scales. */
static uint64_t count_outliers(const scan_ctx *c, const scan_unit *u)
{
    uint64_t cnt[256] = {0}, total = 0;
    int lo = 1, hi = u->is_mx ? 0xFE : 0x7E;
    for (int b = lo; b <= hi; b++) {
        cnt[b] = u->hist[b] - (u->data_scanned ? u->zero_hist[b] : 0);
        if (!u->data_scanned && b == c->fingerprint_byte) cnt[b] = 0;
        total += cnt[b];
    }
    if (total < SCAN_OUTLIER_MIN_SCALES) return 0;
    /* Byte order is value order for positive e4m3 and for ue8m0. */
    uint64_t acc = 0;
    int median = lo;
    for (int b = lo; b <= hi; b++) {
        acc += cnt[b];
        if (acc * 2 >= total) {
            median = b;
            break;
        }
    }
    double m = scale_log2(u->is_mx, median);
    uint64_t out = 0;
    for (int b = lo; b <= hi; b++)
        if (cnt[b] && fabs(scale_log2(u->is_mx, b) - m) > SCAN_OUTLIER_OCTAVES) out += cnt[b];
    return out;
}

static fp4d_status unit_value_findings(scan_ctx *c, scan_unit *u)
{
    if (!u->scanned) return FP4D_STATUS_OK;
    scan_tensor *s = &c->tensors[u->scale];
    const char *f = file_rel(c, s->file);
    uint64_t nan = u->is_mx ? u->hist[0xFF] : u->hist[0x7F] + u->hist[0xFF];
    uint64_t neg = 0;
    if (!u->is_mx)
        for (int b = 0x80; b < 0xFF; b++) neg += u->hist[b];
    uint64_t total = (uint64_t)u->rows * (uint64_t)u->scale_cols;
    if (nan) {
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SCALE_NAN, FP4D_SCAN_ERROR, s->name, f, nan,
                                          "%s: %llu of %llu block scales are NaN (%s): every output that touches "
                                          "those blocks is NaN%s",
                                          s->name, (unsigned long long)nan, (unsigned long long)total,
                                          u->is_mx ? "ue8m0 0xFF" : "e4m3 0x7F/0xFF",
                                          u->is_mx ? " (FlashInfer/Triton decode 0xFF as +inf, transformers as 2^128)" : ""));
        finding_set_experts(c, u->exp_nan, u->num_experts);
    }
    if (neg) {
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SCALE_NEGATIVE, FP4D_SCAN_ERROR, s->name, f, neg,
                                          "%s: %llu block scales have the sign bit set; NVFP4 scales are unsigned "
                                          "(UE4M3) and engines read them differently",
                                          s->name, (unsigned long long)neg));
        finding_set_experts(c, u->exp_neg, u->num_experts);
    }
    if (u->znz_blocks) {
        scan_tensor *w = &c->tensors[u->weight];
        bool explained = u->znz_unexplained == 0;
        FP4D_FORWARD_IF_ERROR(add_finding(
            c, FP4D_FINDING_SCALE_ZERO_NONZERO_DATA, explained ? FP4D_SCAN_WARNING : FP4D_SCAN_ERROR, s->name, f,
            u->znz_blocks,
            explained ? "%s: %llu blocks have scale 0 over +-6 codes: the underflow pattern of TensorRT-LLM/FlashInfer "
                        "quantizers (weights ~0), they dequantize to 0 (%s)"
                      : "%s: %llu blocks have scale 0 over non-zero codes: those weights are lost (%s)",
            s->name, (unsigned long long)u->znz_blocks, w->name));
        finding_set_experts(c, u->exp_znz, u->num_experts);
    }
    uint64_t outliers = count_outliers(c, u);
    if (outliers)
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_SCALE_OUTLIER, FP4D_SCAN_WARNING, s->name, f, outliers,
                                          "%s: %llu block scales lie more than 2^10 away from the tensor's median scale",
                                          s->name, (unsigned long long)outliers));
    return FP4D_STATUS_OK;
}

static const char *writer_of_byte(int b)
{
    switch (b) {
    case 0x38: return "modelopt";
    case 0x30: return "compressed-tensors";
    case 0x08: return "torchao";
    case 0x00: return "trtllm-or-flashinfer";
    default: return "unknown";
    }
}

/* The zero-block scale byte (spec §4.8, §9 item 5): from all-zero blocks when the codes were
 * read; with --scales-only, from a spike at one of the known bytes in the scale histogram. */
static fp4d_status fingerprint(scan_ctx *c)
{
    uint64_t zsum[256] = {0}, hsum[256] = {0}, mx_zero[256] = {0};
    bool any_nv = false, data = false, any_encode = false, any_decode = false, any_mx_data = false;
    bool mx_only = c->num_units > 0;
    for (size_t i = 0; i < c->num_units; i++) {
        scan_unit *u = &c->units[i];
        if (!u->is_mx) mx_only = false;
        if (u->kind == UNIT_CT_NVFP4) any_encode = true;
        if (u->kind == UNIT_MO_NVFP4 && !u->format_untold) any_decode = true; /* untold: no convention known */
        if (!u->scanned) continue;
        if (u->is_mx) {
            any_mx_data |= u->data_scanned;
            for (int b = 0; b < 256; b++) mx_zero[b] += u->zero_hist[b];
            continue;
        }
        any_nv = true;
        data |= u->data_scanned;
        for (int b = 0; b < 256; b++) {
            zsum[b] += u->zero_hist[b];
            hsum[b] += u->hist[b];
        }
    }
    fp4d_scan_report *r = c->rep;
    r->mxfp4_only = mx_only;
    r->convention = any_decode && !any_encode ? "decode" : any_encode && !any_decode ? "encode" : NULL;
    int byte = -1;
    uint64_t count = 0;
    const char *confidence = "none";
    if (any_nv && data) {
        for (int b = 0; b < 256; b++)
            if (zsum[b] > count) {
                count = zsum[b];
                byte = b;
            }
        confidence = byte >= 0 ? "high" : "none";
    } else if (any_nv) {
        static const int candidates[] = {0x00, 0x08, 0x30, 0x38};
        for (size_t k = 0; k < 4; k++) {
            int b = candidates[k];
            uint64_t left = b > 0 ? hsum[b - 1] : 0, right = hsum[b + 1];
            uint64_t nb = left > right ? left : right;
            if (hsum[b] >= 16 && hsum[b] > 8 * nb && hsum[b] > count) {
                count = hsum[b];
                byte = b;
            }
        }
        confidence = byte >= 0 ? "medium" : "none";
    }
    r->zero_block_byte = byte;
    r->zero_block_count = count;
    const char *writer = byte >= 0 ? writer_of_byte(byte) : "unknown";
    if (byte < 0 && r->convention) {
        writer = !strcmp(r->convention, "decode") ? "modelopt" : "compressed-tensors";
        confidence = "low";
    }
    r->writer = strdup(writer);
    r->writer_confidence = strdup(confidence);
    if (!r->writer || !r->writer_confidence) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    c->fingerprint_byte = data ? -1 : byte;

    /* Where an engine reads this checkpoint differently from its writer. */
    char note[512];
    if (byte == 0x30 && r->convention && !strcmp(r->convention, "decode"))
        FP4D_FORWARD_IF_ERROR(add_note(c, "zero blocks carry 0x30 (compressed-tensors' fp8 eps 0.125) but the global "
                                          "scales follow ModelOpt's decode convention: a converted checkpoint; the "
                                          "converter must store weight_scale_2 = 1/weight_global_scale (spec §7b)"));
    if (byte == 0x38 && r->convention && !strcmp(r->convention, "encode"))
        FP4D_FORWARD_IF_ERROR(add_note(c, "zero blocks carry 0x38 (ModelOpt's 1.0) but the global scales follow "
                                          "compressed-tensors' encode convention: a converted checkpoint; the converter "
                                          "must store weight_global_scale = 1/weight_scale_2 (spec §7b)"));
    if (byte == 0x08)
        FP4D_FORWARD_IF_ERROR(add_note(c, "torchao-style scales (never below 2^-6): torchao applies the per-tensor "
                                          "scale after the bf16 output, other engines in the fp32 epilogue (spec §9 "
                                          "item 11); expect last-bit differences between engines"));
    if (c->have_config && scan_qc_format_known(c->qc)) {
        fp4d_ckpt_format cf = fp4d_quant_config_format(c->qc);
        if ((cf == FP4D_CKPT_MODELOPT_NVFP4 && any_encode) || (cf == FP4D_CKPT_CT_NVFP4 && any_decode)) {
            snprintf(note, sizeof note,
                     "the config declares %s but tensors follow %s naming: an engine that trusts the config "
                     "reads the global scales with the reciprocal convention",
                     format_names[cf], any_encode ? "compressed-tensors" : "ModelOpt");
            FP4D_FORWARD_IF_ERROR(add_note(c, note));
        }
    }
    if (any_mx_data && mx_zero[0x00])
        FP4D_FORWARD_IF_ERROR(add_note(c, "MXFP4 all-zero blocks carry ue8m0 0x00: CUDA decodes it as 2^-127, "
                                          "FlashInfer/Triton as 0 (harmless: the codes are zero)"));
    return FP4D_STATUS_OK;
}

static fp4d_status plain_findings(scan_ctx *c)
{
    for (size_t i = 0; i < c->num_plains; i++) {
        plain_target *pt = &c->plains[i];
        if (!pt->nonfinite) continue;
        scan_tensor *t = &c->tensors[pt->tensor];
        FP4D_FORWARD_IF_ERROR(add_finding(c, FP4D_FINDING_NONFINITE_VALUES, FP4D_SCAN_ERROR, t->name, file_rel(c, t->file),
                                          pt->nonfinite, "%s (%s): %llu of %llu values are NaN or Inf", t->name,
                                          dtype_str(t->dtype), (unsigned long long)pt->nonfinite,
                                          (unsigned long long)tensor_elems(t)));
        finding_set_experts(c, pt->exp_nonfinite, pt->num_experts);
    }
    return FP4D_STATUS_OK;
}

/* ---- driver ------------------------------------------------------------------------------- */

static int finding_cmp(const void *a, const void *b)
{
    const finding_rec *x = a, *y = b;
    if (x->pub.code != y->pub.code) return (int)x->pub.code - (int)y->pub.code;
    int c = strcmp(x->tensor ? x->tensor : "", y->tensor ? y->tensor : "");
    if (c) return c;
    return strcmp(x->file ? x->file : "", y->file ? y->file : "");
}

static void ctx_free(scan_ctx *c)
{
    for (size_t i = 0; i < c->num_files; i++) {
        if (c->files[i].fd >= 0) close(c->files[i].fd);
        free(c->files[i].rel);
        free(c->files[i].path);
    }
    free(c->files);
    json_decref(c->file_ids);
    for (size_t i = 0; i < c->num_tensors; i++) free(c->tensors[i].name);
    free(c->tensors);
    free(c->map);
    for (size_t i = 0; i < c->num_units; i++) {
        pthread_mutex_destroy(&c->units[i].lock);
        free(c->units[i].module);
        free(c->units[i].exp_nan);
        free(c->units[i].exp_neg);
        free(c->units[i].exp_znz);
    }
    free(c->units);
    for (size_t i = 0; i < c->num_plains; i++) {
        pthread_mutex_destroy(&c->plains[i].lock);
        free(c->plains[i].exp_nonfinite);
    }
    free(c->plains);
    free(c->jobs);
    json_decref(c->weight_map);
    for (size_t i = 0; i < c->num_unindexed; i++) free(c->unindexed[i]);
    free(c->unindexed);
    fp4d_quant_config_free(c->qc);
}

static fp4d_status scan_run(scan_ctx *c)
{
    if (c->root) {
        FP4D_FORWARD_IF_ERROR(load_configs(c));
        FP4D_FORWARD_IF_ERROR(load_index(c));
        if (!c->num_files && !c->have_index)
            return fp4d_set_error(FP4D_STATUS_NOT_FOUND, "no .safetensors files in '%s'", c->root);
    }
    FP4D_FORWARD_IF_ERROR(load_shards(c));
    FP4D_FORWARD_IF_ERROR(check_index_and_duplicates(c));
    c->format = detect_format(c);
    c->rep->format = c->format;
    c->rep->mixed = fp4d_quant_config_is_mixed(c->qc);
    FP4D_FORWARD_IF_ERROR(build_units(c));
    c->rep->modelopt_mxfp4 = modelopt_is_mxfp4(c);
    for (size_t i = 0; i < c->num_units; i++) FP4D_FORWARD_IF_ERROR(check_unit_structure(c, &c->units[i]));
    FP4D_FORWARD_IF_ERROR(check_orphans(c));
    FP4D_FORWARD_IF_ERROR(check_quantized_but_excluded(c));
    FP4D_FORWARD_IF_ERROR(check_tp_shards(c));
    FP4D_FORWARD_IF_ERROR(check_global_scales(c));
    size_t buf_bytes = 0;
    FP4D_FORWARD_IF_ERROR(plan_jobs(c, &buf_bytes));
    FP4D_FORWARD_IF_ERROR(run_jobs(c, buf_bytes));
    FP4D_FORWARD_IF_ERROR(check_file_digests(c));
    FP4D_RETURN_ERROR_IF(atomic_load(&c->io_failed), IO, "read error while scanning '%s' (was a file changed or cut "
                                                         "during the scan?)", c->rep->path);
    FP4D_FORWARD_IF_ERROR(fingerprint(c));
    for (size_t i = 0; i < c->num_units; i++) FP4D_FORWARD_IF_ERROR(unit_value_findings(c, &c->units[i]));
    FP4D_FORWARD_IF_ERROR(plain_findings(c));
    fp4d_scan_report *r = c->rep;
    if (r->num_findings > 1) qsort(r->findings, r->num_findings, sizeof *r->findings, finding_cmp);
    for (size_t i = 0; i < r->num_findings; i++) {
        finding_rec *f = &r->findings[i];
        f->pub.tensor = f->tensor;
        f->pub.file = f->file;
        f->pub.message = f->message;
        f->pub.experts = f->experts;
    }
    r->files = c->num_files;
    for (size_t i = 0; i < c->num_tensors; i++) r->tensors += c->tensors[i].in_shard;
    r->units = c->num_units;
    return FP4D_STATUS_OK;
}

/* Whether a file begins like a safetensors file: an 8-byte header length of 2..100,000,000
 * bytes, then (after optional spaces) '{'. A damaged checkpoint file keeps this beginning
 * unless the damage is in its first bytes; a README, a config, a GGUF or a pickle does not. */
static bool begins_like_safetensors(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    uint8_t b[8 + 64];
    ssize_t n = pread(fd, b, sizeof b, 0);
    close(fd);
    if (n < 9) return false;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen < 2 || hlen > 100000000ull) return false;
    for (ssize_t i = 8; i < n && (uint64_t)(i - 8) < hlen; i++) {
        if (b[i] == '{') return true;
        if (b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r') return false;
    }
    return false;
}

fp4d_status fp4d_scan_path(const char *path, const fp4d_scan_options *opt, fp4d_scan_report **out)
{
    FP4D_RETURN_ERROR_IF(!path || !out, INVALID_ARG, "fp4d_scan_path: NULL argument");
    *out = NULL;
    struct stat sb;
    FP4D_RETURN_ERROR_IF(stat(path, &sb) != 0, NOT_FOUND, "cannot read '%s': %s", path, strerror(errno));
    FP4D_RETURN_ERROR_IF(!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode), IO,
                         "'%s' is neither a directory nor a .safetensors file", path);
    /* A file that is not a checkpoint at all (a README, config.json, a GGUF or .bin given by
     * mistake) is unreadable input, not a damaged checkpoint: reporting HEADER_INVALID on it
     * and exiting 1 blamed the user's weights for a wrong path (docs/cli.md). A file named
     * *.safetensors, or one that begins like one, is scanned and its damage reported. */
    if (S_ISREG(sb.st_mode)) {
        /* A file given alone that cannot be opened is input we could not read (3), said with
         * the system's reason: it was a HEADER_INVALID finding (exit 1) when named .safetensors,
         * and "not a safetensors file" otherwise. */
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        FP4D_RETURN_ERROR_IF(fd < 0, IO, "cannot read '%s': %s", path, strerror(errno));
        close(fd);
        size_t len = strlen(path);
        bool named = len >= 12 && !strcmp(path + len - 12, ".safetensors");
        FP4D_RETURN_ERROR_IF(!named && !begins_like_safetensors(path), IO,
                             "'%s' is not a safetensors file (it does not begin with an 8-byte header length and "
                             "a JSON header); give a checkpoint directory or a .safetensors file", path);
    }
    scan_ctx c;
    memset(&c, 0, sizeof c);
    if (opt) c.opt = *opt;
    c.fingerprint_byte = -1;
    c.rep = calloc(1, sizeof *c.rep);
    if (!c.rep) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    c.rep->path = strdup(path);
    c.rep->scales_only = c.opt.scales_only;
    c.rep->zero_block_byte = -1;
    fp4d_status st = c.rep->path ? FP4D_STATUS_OK : fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    if (st == FP4D_STATUS_OK) {
        if (S_ISDIR(sb.st_mode)) c.root = path;
        else st = add_file(&c, path);
    }
    if (st == FP4D_STATUS_OK) st = scan_run(&c);
    ctx_free(&c);
    if (st != FP4D_STATUS_OK) {
        fp4d_scan_report_free(c.rep);
        return st;
    }
    *out = c.rep;
    return FP4D_STATUS_OK;
}

void fp4d_scan_report_free(fp4d_scan_report *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->num_findings; i++) {
        free(r->findings[i].tensor);
        free(r->findings[i].file);
        free(r->findings[i].message);
        free(r->findings[i].experts);
    }
    free(r->findings);
    for (size_t i = 0; i < r->num_notes; i++) free(r->notes[i]);
    free(r->notes);
    free(r->writer);
    free(r->writer_confidence);
    free(r->path);
    free(r);
}

size_t fp4d_scan_report_count(const fp4d_scan_report *r) { return r ? r->num_findings : 0; }

const fp4d_scan_finding *fp4d_scan_report_get(const fp4d_scan_report *r, size_t i)
{
    return r && i < r->num_findings ? &r->findings[i].pub : NULL;
}

size_t fp4d_scan_report_count_at_least(const fp4d_scan_report *r, fp4d_scan_severity s)
{
    size_t n = 0;
    for (size_t i = 0; r && i < r->num_findings; i++) n += r->findings[i].pub.severity >= s;
    return n;
}

const char *fp4d_scan_report_format(const fp4d_scan_report *r)
{
    if (!r) return "unknown";
    if (r->modelopt_mxfp4) return "modelopt-mxfp4";
    if (r->mixed && r->format == FP4D_CKPT_MODELOPT_NVFP4) return "modelopt-mixed";
    return format_names[r->format];
}

const char *fp4d_scan_report_writer(const fp4d_scan_report *r) { return r && r->writer ? r->writer : "unknown"; }

/* ---- output ------------------------------------------------------------------------------- */

typedef struct tally {
    int64_t  layer, expert;
    int      code;
    uint64_t count;
    int      severity;
} tally;

static int tally_cmp(const void *a, const void *b)
{
    const tally *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return x->code - y->code;
}

/* Per-layer (expert = -1) or per-expert tallies of the findings, sorted. */
static tally *collect_tallies(const fp4d_scan_report *r, bool experts, size_t *n_out)
{
    size_t cap = 16, n = 0;
    tally *t = malloc(cap * sizeof *t);
    for (size_t i = 0; t && i < r->num_findings; i++) {
        const fp4d_scan_finding *f = &r->findings[i].pub;
        if (f->layer < 0 && !(experts && f->num_experts)) continue;
        size_t add = experts ? (f->num_experts ? f->num_experts : (f->expert >= 0)) : 1;
        if (n + add > cap) {
            while (n + add > cap) cap *= 2;
            tally *g = realloc(t, cap * sizeof *t);
            if (!g) {
                free(t);
                return NULL;
            }
            t = g;
        }
        if (!experts) t[n++] = (tally){f->layer, -1, f->code, f->count, f->severity};
        else if (f->num_experts)
            for (size_t e = 0; e < f->num_experts; e++)
                t[n++] = (tally){f->layer, f->experts[e].expert, f->code, f->experts[e].count, f->severity};
        else if (f->expert >= 0)
            t[n++] = (tally){f->layer, f->expert, f->code, f->count, f->severity};
    }
    if (t && n > 1) qsort(t, n, sizeof *t, tally_cmp);
    *n_out = n;
    return t;
}

static json_t *tallies_json(const tally *t, size_t n, bool experts)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n;) {
        size_t j = i;
        json_t *counts = json_object();
        uint64_t errors = 0, warnings = 0;
        while (j < n && t[j].layer == t[i].layer && t[j].expert == t[i].expert) {
            const char *name = fp4d_finding_code_name((fp4d_finding_code)t[j].code);
            json_t *prev = json_object_get(counts, name);
            json_int_t v = (prev ? json_integer_value(prev) : 0) + (json_int_t)t[j].count;
            json_object_set_new(counts, name, json_integer(v));
            errors += t[j].severity == FP4D_SCAN_ERROR;
            warnings += t[j].severity == FP4D_SCAN_WARNING;
            j++;
        }
        json_t *o = json_object();
        json_object_set_new(o, "layer", t[i].layer >= 0 ? json_integer(t[i].layer) : json_null());
        if (experts) json_object_set_new(o, "expert", json_integer(t[i].expert));
        json_object_set_new(o, "errors", json_integer((json_int_t)errors));
        json_object_set_new(o, "warnings", json_integer((json_int_t)warnings));
        json_object_set_new(o, "counts", counts);
        json_array_append_new(arr, o);
        i = j;
    }
    return arr;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

fp4d_status fp4d_scan_report_json(const fp4d_scan_report *r, char **out)
{
    FP4D_RETURN_ERROR_IF(!r || !out, INVALID_ARG, "fp4d_scan_report_json: NULL argument");
    *out = NULL;
    json_t *root = json_object();
    json_object_set_new(root, "schema_version", json_integer(FP4D_SCAN_SCHEMA_VERSION));
    json_object_set_new(root, "tool", json_string("fp4doctor"));
    json_object_set_new(root, "version", json_string(fp4d_version_string()));
    json_object_set_new(root, "command", json_string("scan"));
    json_object_set_new(root, "path", json_string(r->path));
    json_object_set_new(root, "format", json_string(fp4d_scan_report_format(r)));
    json_object_set_new(root, "scales_only", json_boolean(r->scales_only));

    json_t *sum = json_object();
    json_object_set_new(sum, "files", json_integer((json_int_t)r->files));
    json_object_set_new(sum, "tensors", json_integer((json_int_t)r->tensors));
    json_object_set_new(sum, "quantized_linears", json_integer((json_int_t)r->units));
    json_object_set_new(sum, "bytes_scanned", json_integer((json_int_t)r->bytes_scanned));
    json_object_set_new(sum, "errors", json_integer((json_int_t)fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR)));
    json_object_set_new(sum, "warnings",
                        json_integer((json_int_t)(fp4d_scan_report_count_at_least(r, FP4D_SCAN_WARNING) -
                                                  fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR))));
    json_object_set_new(sum, "infos", json_integer((json_int_t)(r->num_findings -
                                                                fp4d_scan_report_count_at_least(r, FP4D_SCAN_WARNING))));
    json_object_set_new(root, "summary", sum);

    json_t *fp = json_object();
    json_object_set_new(fp, "writer", json_string(fp4d_scan_report_writer(r)));
    json_object_set_new(fp, "confidence", str_or_null(r->writer_confidence));
    char hex[8];
    snprintf(hex, sizeof hex, "0x%02x", r->zero_block_byte & 0xFF);
    json_object_set_new(fp, "zero_block_scale_byte", r->zero_block_byte >= 0 ? json_string(hex) : json_null());
    json_object_set_new(fp, "zero_block_count", json_integer((json_int_t)r->zero_block_count));
    json_object_set_new(fp, "global_scale_convention", str_or_null(r->convention));
    json_t *notes = json_array();
    for (size_t i = 0; i < r->num_notes; i++) json_array_append_new(notes, json_string(r->notes[i]));
    json_object_set_new(fp, "notes", notes);
    json_object_set_new(root, "fingerprint", fp);

    json_t *arr = json_array();
    for (size_t i = 0; i < r->num_findings; i++) {
        const fp4d_scan_finding *f = &r->findings[i].pub;
        json_t *o = json_object();
        json_object_set_new(o, "code", json_string(fp4d_finding_code_name(f->code)));
        json_object_set_new(o, "severity", json_string(fp4d_scan_severity_name(f->severity)));
        json_object_set_new(o, "tensor", str_or_null(f->tensor));
        json_object_set_new(o, "file", str_or_null(f->file));
        json_object_set_new(o, "layer", f->layer >= 0 ? json_integer(f->layer) : json_null());
        json_object_set_new(o, "expert", f->expert >= 0 ? json_integer(f->expert) : json_null());
        json_object_set_new(o, "count", json_integer((json_int_t)f->count));
        json_object_set_new(o, "message", json_string(f->message));
        if (f->num_experts) {
            json_t *ex = json_array();
            for (size_t e = 0; e < f->num_experts; e++) {
                json_t *eo = json_object();
                json_object_set_new(eo, "expert", json_integer(f->experts[e].expert));
                json_object_set_new(eo, "count", json_integer((json_int_t)f->experts[e].count));
                json_array_append_new(ex, eo);
            }
            json_object_set_new(o, "experts", ex);
        }
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "findings", arr);
    size_t n;
    tally *t = collect_tallies(r, false, &n);
    json_object_set_new(root, "layers", t ? tallies_json(t, n, false) : json_array());
    free(t);
    t = collect_tallies(r, true, &n);
    json_object_set_new(root, "experts", t ? tallies_json(t, n, true) : json_array());
    free(t);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    FP4D_RETURN_ERROR_IF(!s, NOMEM, "out of memory writing the scan report");
    *out = s;
    return FP4D_STATUS_OK;
}

void fp4d_scan_report_print(const fp4d_scan_report *r, FILE *out, bool color)
{
    if (!r || !out) return;
    const char *red = color ? "\033[31;1m" : "", *yellow = color ? "\033[33m" : "", *dim = color ? "\033[2m" : "",
               *bold = color ? "\033[1m" : "", *reset = color ? "\033[0m" : "";
    fprintf(out, "%sfp4doctor scan%s %s\n", bold, reset, r->path);
    fprintf(out, "  format %s, %llu file(s), %llu tensors, %llu quantized linear(s), %.1f MB read%s\n",
            fp4d_scan_report_format(r), (unsigned long long)r->files, (unsigned long long)r->tensors,
            (unsigned long long)r->units, (double)r->bytes_scanned / 1e6, r->scales_only ? " (scales only)" : "");
    fprintf(out, "  writer %s", fp4d_scan_report_writer(r));
    if (r->zero_block_byte >= 0)
        fprintf(out, " (zero-block scale byte 0x%02x on %llu blocks", r->zero_block_byte,
                (unsigned long long)r->zero_block_count);
    else
        fprintf(out, " (no all-zero blocks seen");
    /* the global-scale convention, or, where every layer is MXFP4, that there is none to have one
     * (MXFP4's ue8m0 block scales are the whole scale) */
    if (r->convention) fprintf(out, ", global scales %s", r->convention);
    else if (r->mxfp4_only) fprintf(out, ", MXFP4 has no global scale");
    fprintf(out, "; confidence %s)\n", r->writer_confidence ? r->writer_confidence : "none");
    for (size_t i = 0; i < r->num_notes; i++) fprintf(out, "  %snote%s %s\n", yellow, reset, r->notes[i]);
    if (r->num_findings) fputc('\n', out);
    for (size_t i = 0; i < r->num_findings; i++) {
        const fp4d_scan_finding *f = &r->findings[i].pub;
        const char *c = f->severity == FP4D_SCAN_ERROR ? red : f->severity == FP4D_SCAN_WARNING ? yellow : dim;
        /* the checkpoint's own name for it, shown without its control characters (the JSON
         * report keeps it exact) */
        char *shown = strdup(f->tensor ? f->tensor : (f->file ? f->file : "-"));
        fp4d_text_clean(shown);
        fprintf(out, "%s%-7s%s %-24s %s  count=%llu\n", c, fp4d_scan_severity_name(f->severity), reset,
                fp4d_finding_code_name(f->code), shown ? shown : "-", (unsigned long long)f->count);
        free(shown);
        fprintf(out, "        %s%s%s\n", dim, f->message, reset);
        if (f->num_experts) {
            fprintf(out, "        %sper expert:", dim);
            for (size_t e = 0; e < f->num_experts && e < 16; e++)
                fprintf(out, " %lld:%llu", (long long)f->experts[e].expert, (unsigned long long)f->experts[e].count);
            fprintf(out, "%s%s\n", f->num_experts > 16 ? " ..." : "", reset);
        }
    }
    size_t n;
    tally *t = collect_tallies(r, false, &n);
    if (t && n) {
        fprintf(out, "\nper layer:\n");
        for (size_t i = 0; i < n;) {
            fprintf(out, "  layer %-4lld", (long long)t[i].layer);
            size_t j = i;
            while (j < n && t[j].layer == t[i].layer) {
                /* one entry per code, as in the JSON's counts (sorted, so a code's tallies are adjacent) */
                uint64_t count = 0;
                const int code = t[j].code;
                for (; j < n && t[j].layer == t[i].layer && t[j].code == code; j++) count += t[j].count;
                fprintf(out, " %s=%llu", fp4d_finding_code_name((fp4d_finding_code)code), (unsigned long long)count);
            }
            fputc('\n', out);
            i = j;
        }
    }
    free(t);
    size_t errors = fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR);
    size_t warnings = fp4d_scan_report_count_at_least(r, FP4D_SCAN_WARNING) - errors;
    fprintf(out, "\n%s%zu error(s)%s, %zu warning(s), %zu info\n", errors ? red : "", errors, reset, warnings,
            r->num_findings - errors - warnings);
}
