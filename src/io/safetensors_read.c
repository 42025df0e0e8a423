/*
 * safetensors_read.c - a strict, mmap-based safetensors reader (spec §7d).
 *
 * The file is mapped read-only, so nothing we do can modify the user's checkpoint. The
 * header is parsed by jansson (duplicate keys rejected, UTF-8 checked) and then walked as
 * a guard chain: every rule of the reference library's validation (§7d.2) plus the
 * stricter ones the README asks for has its own fp4d_st_error code and a message that
 * names the tensor and the numbers involved, because the checkpoint scanner turns these
 * codes into findings a user reads.
 *
 * Decisions where the reference library is lax (docs/safetensors.md):
 *   - a header that does not begin with '{' is rejected (HEADER_NOT_OBJECT);
 *   - a duplicate key anywhere in the header is rejected (DUPLICATE_KEY);
 *   - an unknown field inside a tensor entry is rejected (HEADER_JSON): the library's own
 *     writer never emits one, so its presence means a foreign or corrupted writer;
 *   - "__metadata__": null is rejected (METADATA): it must be a string->string object.
 *   - more than FP4D_ST_MAX_DIMS dimensions is rejected (HEADER_JSON): no checkpoint
 *     format we know of uses more than 4.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "fp4doctor/io.h"
#include "internal.h"

/* The reference library's MAX_HEADER_SIZE. */
#define ST_MAX_HEADER_SIZE 100000000ull

/* ---- dtypes ---------------------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t    bits;
} st_dtypes[FP4D_ST_DTYPE_COUNT] = {
    [FP4D_ST_BOOL]        = {"BOOL", 8},
    [FP4D_ST_F4]          = {"F4", 4},
    [FP4D_ST_F6_E2M3]     = {"F6_E2M3", 6},
    [FP4D_ST_F6_E3M2]     = {"F6_E3M2", 6},
    [FP4D_ST_U8]          = {"U8", 8},
    [FP4D_ST_I8]          = {"I8", 8},
    [FP4D_ST_F8_E5M2]     = {"F8_E5M2", 8},
    [FP4D_ST_F8_E4M3]     = {"F8_E4M3", 8},
    [FP4D_ST_F8_E8M0]     = {"F8_E8M0", 8},
    [FP4D_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [FP4D_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [FP4D_ST_I16]         = {"I16", 16},
    [FP4D_ST_U16]         = {"U16", 16},
    [FP4D_ST_F16]         = {"F16", 16},
    [FP4D_ST_BF16]        = {"BF16", 16},
    [FP4D_ST_I32]         = {"I32", 32},
    [FP4D_ST_U32]         = {"U32", 32},
    [FP4D_ST_F32]         = {"F32", 32},
    [FP4D_ST_C64]         = {"C64", 64},
    [FP4D_ST_F64]         = {"F64", 64},
    [FP4D_ST_I64]         = {"I64", 64},
    [FP4D_ST_U64]         = {"U64", 64},
};

const char *fp4d_st_dtype_name(fp4d_st_dtype t)
{
    if ((unsigned)t >= FP4D_ST_DTYPE_COUNT) return "?";
    return st_dtypes[t].name;
}

bool fp4d_st_dtype_from_name(const char *s, fp4d_st_dtype *out)
{
    if (!s) return false;
    for (int i = 0; i < FP4D_ST_DTYPE_COUNT; i++)
        if (!strcmp(s, st_dtypes[i].name)) {
            if (out) *out = (fp4d_st_dtype)i;
            return true;
        }
    return false;
}

uint32_t fp4d_st_dtype_bits(fp4d_st_dtype t)
{
    if ((unsigned)t >= FP4D_ST_DTYPE_COUNT) return 0;
    return st_dtypes[t].bits;
}

static const char *const st_error_names[FP4D_ST_ERR_COUNT] = {
    [FP4D_ST_OK]                   = "OK",
    [FP4D_ST_ERR_OPEN]             = "OPEN",
    [FP4D_ST_ERR_RESOURCE]         = "RESOURCE",
    [FP4D_ST_ERR_HEADER_TOO_SMALL] = "HEADER_TOO_SMALL",
    [FP4D_ST_ERR_HEADER_TOO_LARGE] = "HEADER_TOO_LARGE",
    [FP4D_ST_ERR_HEADER_LENGTH]    = "HEADER_LENGTH",
    [FP4D_ST_ERR_HEADER_NOT_OBJECT] = "HEADER_NOT_OBJECT",
    [FP4D_ST_ERR_HEADER_UTF8]      = "HEADER_UTF8",
    [FP4D_ST_ERR_HEADER_JSON]      = "HEADER_JSON",
    [FP4D_ST_ERR_DUPLICATE_KEY]    = "DUPLICATE_KEY",
    [FP4D_ST_ERR_UNKNOWN_DTYPE]    = "UNKNOWN_DTYPE",
    [FP4D_ST_ERR_METADATA]         = "METADATA",
    [FP4D_ST_ERR_SHAPE_OVERFLOW]   = "SHAPE_OVERFLOW",
    [FP4D_ST_ERR_MISALIGNED]       = "MISALIGNED",
    [FP4D_ST_ERR_OFFSETS]          = "OFFSETS",
    [FP4D_ST_ERR_SIZE_MISMATCH]    = "SIZE_MISMATCH",
    [FP4D_ST_ERR_TRUNCATED]        = "TRUNCATED",
    [FP4D_ST_ERR_TRAILING_BYTES]   = "TRAILING_BYTES",
    [FP4D_ST_ERR_LFS_POINTER]      = "LFS_POINTER",
};

const char *fp4d_st_error_name(fp4d_st_error e)
{
    if ((unsigned)e >= FP4D_ST_ERR_COUNT) return "UNKNOWN";
    return st_error_names[e];
}

/* ---- the handle ------------------------------------------------------------------------ */

typedef struct st_meta_entry {
    char *key, *value;
} st_meta_entry;

struct fp4d_st_file {
    const uint8_t  *base;        /* whole file (mapping or caller's buffer) */
    size_t          len;
    bool            owns_mapping;
    uint64_t        header_size; /* N */
    fp4d_st_tensor *tensors;     /* sorted by file offset */
    size_t          count;
    size_t         *by_name;     /* indices into tensors, sorted by name (binary search) */
    st_meta_entry  *meta;        /* sorted by key */
    size_t          meta_count;
};

bool fp4d_st_resource_errno(int err) { return err == ENOMEM || err == EMFILE || err == ENFILE || err == EAGAIN; }

/* Fills res (if any) and the thread's last error, and returns NULL, so every guard reads
 * `return st_fail(...)`. */
static fp4d_st_file *st_failv(fp4d_st_open_result *res, fp4d_st_error e, const char *fmt, va_list ap)
{
    char msg[sizeof res->message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (res) {
        res->error = e;
        memcpy(res->message, msg, sizeof msg);
    }
    fp4d_set_error(e == FP4D_ST_ERR_OPEN       ? FP4D_STATUS_IO
                   : e == FP4D_ST_ERR_RESOURCE ? FP4D_STATUS_NOMEM
                                               : FP4D_STATUS_PARSE,
                   "%s", msg);
    return NULL;
}

static fp4d_st_file *st_fail(fp4d_st_open_result *res, fp4d_st_error e, const char *fmt, ...)
    FP4D_PRINTF(3, 4);
static fp4d_st_file *st_fail(fp4d_st_open_result *res, fp4d_st_error e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st_failv(res, e, fmt, ap);
    va_end(ap);
    return NULL;
}

static bool st_fail_bool(fp4d_st_open_result *res, fp4d_st_error e, const char *fmt, ...)
    FP4D_PRINTF(3, 4);
static bool st_fail_bool(fp4d_st_open_result *res, fp4d_st_error e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st_failv(res, e, fmt, ap);
    va_end(ap);
    return false;
}

void fp4d_st_close(fp4d_st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
    for (size_t i = 0; i < f->meta_count; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    if (f->owns_mapping && f->len > 0) munmap((void *)f->base, f->len);
    free(f);
}

/* ---- header validation ----------------------------------------------------------------- */

/* Parses one tensor entry's JSON into t (name already set). False with res set on error. */
static bool st_parse_entry(fp4d_st_open_result *res, const char *name, json_t *entry, fp4d_st_tensor *t)
{
    if (!json_is_object(entry))
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON, "tensor '%s': entry is not a JSON object", name);

    const char *field;
    json_t *value;
    json_object_foreach(entry, field, value) {
        if (strcmp(field, "dtype") && strcmp(field, "shape") && strcmp(field, "data_offsets"))
            return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON,
                           "tensor '%s': unknown field '%s' (only dtype, shape, data_offsets are allowed)",
                           name, field);
    }

    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offs  = json_object_get(entry, "data_offsets");
    if (!dtype || !shape || !offs)
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON, "tensor '%s': missing field '%s'", name,
                       !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!json_is_string(dtype))
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON, "tensor '%s': dtype is not a string", name);
    if (!fp4d_st_dtype_from_name(json_string_value(dtype), &t->dtype))
        return st_fail_bool(res, FP4D_ST_ERR_UNKNOWN_DTYPE, "tensor '%s': unknown dtype '%s'", name,
                       json_string_value(dtype));

    if (!json_is_array(shape))
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON, "tensor '%s': shape is not an array", name);
    size_t ndim = json_array_size(shape);
    if (ndim > FP4D_ST_MAX_DIMS)
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON, "tensor '%s': %zu dimensions (at most %d supported)",
                       name, ndim, FP4D_ST_MAX_DIMS);
    t->ndim = (int32_t)ndim;
    for (size_t d = 0; d < ndim; d++) {
        json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON,
                           "tensor '%s': shape[%zu] is not a non-negative integer", name, d);
        t->shape[d] = (int64_t)json_integer_value(dim);
    }

    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)) || json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0)
        return st_fail_bool(res, FP4D_ST_ERR_HEADER_JSON,
                       "tensor '%s': data_offsets is not a pair of non-negative integers", name);
    t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    t->end   = (uint64_t)json_integer_value(json_array_get(offs, 1));

    /* Element count and byte size, with every multiplication checked (the library's
     * ValidationOverflow; a crafted shape must not wrap around to a small size). */
    uint64_t nelem = 1;
    for (int32_t d = 0; d < t->ndim; d++) {
        uint64_t dim = (uint64_t)t->shape[d];
        if (dim != 0 && nelem > UINT64_MAX / dim)
            return st_fail_bool(res, FP4D_ST_ERR_SHAPE_OVERFLOW,
                           "tensor '%s': the product of the shape overflows 64 bits (at dimension %d = %llu)",
                           name, (int)d, (unsigned long long)dim);
        nelem *= dim;
    }
    uint64_t bits = fp4d_st_dtype_bits(t->dtype);
    if (nelem > UINT64_MAX / bits)
        return st_fail_bool(res, FP4D_ST_ERR_SHAPE_OVERFLOW,
                       "tensor '%s': %llu elements of %s overflow 64 bits of size", name,
                       (unsigned long long)nelem, fp4d_st_dtype_name(t->dtype));
    uint64_t nbits = nelem * bits;
    if (nbits % 8 != 0)
        return st_fail_bool(res, FP4D_ST_ERR_MISALIGNED,
                       "tensor '%s': %llu elements of %s are not a whole number of bytes", name,
                       (unsigned long long)nelem, fp4d_st_dtype_name(t->dtype));
    t->nbytes = nbits / 8;
    return true;
}

static int st_cmp_offsets(const void *pa, const void *pb)
{
    const fp4d_st_tensor *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return strcmp(a->name, b->name); /* deterministic order for equal offsets */
}

typedef struct st_name_index {
    const char *name;
    size_t      index;
} st_name_index;

static int st_cmp_name_index(const void *pa, const void *pb)
{
    const st_name_index *a = pa, *b = pb;
    return strcmp(a->name, b->name);
}

static int st_cmp_meta(const void *pa, const void *pb)
{
    const st_meta_entry *a = pa, *b = pb;
    return strcmp(a->key, b->key);
}

static bool st_parse_metadata(fp4d_st_open_result *res, fp4d_st_file *f, json_t *meta)
{
    if (!json_is_object(meta))
        return st_fail_bool(res, FP4D_ST_ERR_METADATA, "__metadata__ is not an object of strings");
    size_t n = json_object_size(meta);
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (!f->meta) return st_fail_bool(res, FP4D_ST_ERR_OPEN, "out of memory reading __metadata__");
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value) {
        if (!json_is_string(value))
            return st_fail_bool(res, FP4D_ST_ERR_METADATA, "__metadata__ value of '%s' is not a string", key);
        st_meta_entry *m = &f->meta[f->meta_count];
        m->key   = strdup(key);
        m->value = strdup(json_string_value(value));
        if (!m->key || !m->value) {
            free(m->key);
            free(m->value);
            return st_fail_bool(res, FP4D_ST_ERR_OPEN, "out of memory reading __metadata__");
        }
        f->meta_count++;
    }
    qsort(f->meta, f->meta_count, sizeof *f->meta, st_cmp_meta);
    return true;
}

/* A Git LFS pointer (a clone without git-lfs, a download that stopped at the pointers) is a
 * few lines of text where the data should be: "version https://git-lfs.github.com/spec/v1",
 * "oid sha256:...", "size N". Its first 8 bytes read as a header length of ~2.3e18, which said
 * HEADER_TOO_LARGE and left the user to guess. */
static bool st_lfs_pointer(const uint8_t *buf, size_t len, fp4d_st_open_result *res)
{
    static const char sig[] = "version https://git-lfs.github.com/spec/";
    if (len < sizeof sig - 1 || len > 1024 || memcmp(buf, sig, sizeof sig - 1) != 0) return false;
    char text[1025];
    memcpy(text, buf, len);
    text[len] = '\0';
    char oid[17] = "", size[24] = "";
    const char *o = strstr(text, "\noid sha256:"), *z = strstr(text, "\nsize ");
    if (o) sscanf(o + 12, "%16[0-9a-f]", oid);
    if (z) sscanf(z + 6, "%23[0-9]", size);
    char detail[64] = "";
    if (oid[0] && size[0]) snprintf(detail, sizeof detail, " (sha256 %s..., %s bytes)", oid, size);
    else if (oid[0]) snprintf(detail, sizeof detail, " (sha256 %s...)", oid);
    else if (size[0]) snprintf(detail, sizeof detail, " (%s bytes)", size);
    st_fail(res, FP4D_ST_ERR_LFS_POINTER,
            "a Git LFS pointer%s, not the tensor data: the file was never downloaded; fetch it (`git lfs pull`, "
            "or `huggingface-cli download`)", detail);
    return true;
}

/* Validates everything and fills f; returns false with res set on the first broken rule. */
static bool st_validate(fp4d_st_file *f, fp4d_st_open_result *res)
{
    const uint8_t *buf = f->base;
    size_t len = f->len;
    if (st_lfs_pointer(buf, len, res)) return false;

    if (len < 8) {
        st_fail(res, FP4D_ST_ERR_HEADER_TOO_SMALL, "file is %zu bytes, shorter than the 8-byte header length",
                len);
        return false;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i]; /* little-endian, whatever the host */
    if (n > ST_MAX_HEADER_SIZE) {
        st_fail(res, FP4D_ST_ERR_HEADER_TOO_LARGE, "header length %llu exceeds the limit of %llu bytes",
                (unsigned long long)n, ST_MAX_HEADER_SIZE);
        return false;
    }
    if (8 + n > len) {
        st_fail(res, FP4D_ST_ERR_HEADER_LENGTH, "header length %llu runs past the end of the %zu-byte file",
                (unsigned long long)n, len);
        return false;
    }
    f->header_size = n;
    const char *hdr = (const char *)buf + 8;
    if (n == 0 || hdr[0] != '{') {
        st_fail(res, FP4D_ST_ERR_HEADER_NOT_OBJECT, "header does not begin with '{' (first byte %s0x%02x)",
                n == 0 ? "missing, " : "", n == 0 ? 0u : (unsigned)(uint8_t)hdr[0]);
        return false;
    }

    json_error_t jerr;
    json_t *root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        enum json_error_code code = json_error_code(&jerr);
        fp4d_st_error e = code == json_error_invalid_utf8    ? FP4D_ST_ERR_HEADER_UTF8
                        : code == json_error_duplicate_key   ? FP4D_ST_ERR_DUPLICATE_KEY
                                                             : FP4D_ST_ERR_HEADER_JSON;
        st_fail(res, e, "header: %s (at byte %d of the header)", jerr.text, jerr.position);
        return false;
    }
    if (!json_is_object(root)) { /* cannot happen after the '{' check, kept for safety */
        json_decref(root);
        st_fail(res, FP4D_ST_ERR_HEADER_JSON, "header is not a JSON object");
        return false;
    }

    size_t nkeys = json_object_size(root);
    f->tensors = calloc(nkeys ? nkeys : 1, sizeof *f->tensors);
    if (!f->tensors) {
        json_decref(root);
        st_fail(res, FP4D_ST_ERR_OPEN, "out of memory for %zu header entries", nkeys);
        return false;
    }

    const char *key;
    json_t *value;
    bool ok = true;
    json_object_foreach(root, key, value) {
        if (!strcmp(key, "__metadata__")) {
            if (!st_parse_metadata(res, f, value)) { ok = false; break; }
            continue;
        }
        fp4d_st_tensor *t = &f->tensors[f->count];
        t->name = strdup(key);
        if (!t->name) {
            st_fail(res, FP4D_ST_ERR_OPEN, "out of memory");
            ok = false;
            break;
        }
        f->count++;
        if (!st_parse_entry(res, key, value, t)) { ok = false; break; }
    }
    json_decref(root);
    if (!ok) return false;

    /* The byte buffer must be covered exactly: sorted by offsets, each tensor begins where
     * the previous one ended (no gap, no overlap) and has the size its dtype and shape imply. */
    qsort(f->tensors, f->count, sizeof *f->tensors, st_cmp_offsets);
    uint64_t start = 0;
    for (size_t i = 0; i < f->count; i++) {
        fp4d_st_tensor *t = &f->tensors[i];
        if (t->begin != start || t->end < t->begin) {
            st_fail(res, FP4D_ST_ERR_OFFSETS,
                    "tensor '%s': data_offsets [%llu, %llu] but the previous tensor ends at %llu "
                    "(gap, overlap or reversed range)",
                    t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)start);
            return false;
        }
        if (t->end - t->begin != t->nbytes) {
            char shape[160];
            int used = 0;
            shape[0] = '\0';
            for (int32_t d = 0; d < t->ndim && used < (int)sizeof shape - 24; d++)
                used += snprintf(shape + used, sizeof shape - (size_t)used, "%s%lld", d ? "," : "",
                                 (long long)t->shape[d]);
            st_fail(res, FP4D_ST_ERR_SIZE_MISMATCH,
                    "tensor '%s': %s [%s] needs %llu bytes but data_offsets span %llu", t->name,
                    fp4d_st_dtype_name(t->dtype), shape, (unsigned long long)t->nbytes,
                    (unsigned long long)(t->end - t->begin));
            return false;
        }
        start = t->end;
    }
    uint64_t buffer_len = (uint64_t)len - 8 - n;
    if (start > buffer_len) {
        st_fail(res, FP4D_ST_ERR_TRUNCATED,
                "file is truncated: tensors need %llu data bytes, the file holds %llu%s%s%s",
                (unsigned long long)start, (unsigned long long)buffer_len,
                f->count ? " (last tensor '" : "", f->count ? f->tensors[f->count - 1].name : "",
                f->count ? "')" : "");
        return false;
    }
    if (start < buffer_len) {
        st_fail(res, FP4D_ST_ERR_TRAILING_BYTES,
                "%llu bytes after the end of the last tensor (data ends at %llu, file holds %llu)",
                (unsigned long long)(buffer_len - start), (unsigned long long)start,
                (unsigned long long)buffer_len);
        return false;
    }

    const uint8_t *data = buf + 8 + n;
    for (size_t i = 0; i < f->count; i++) f->tensors[i].data = data + f->tensors[i].begin;

    /* Name index for O(log n) lookups: checkpoints of MoE models hold tens of thousands of
     * tensors per shard and the scanner looks up companions (X_scale, X_scale_2) of each. */
    st_name_index *idx = calloc(f->count ? f->count : 1, sizeof *idx);
    f->by_name = calloc(f->count ? f->count : 1, sizeof *f->by_name);
    if (!idx || !f->by_name) {
        free(idx);
        st_fail(res, FP4D_ST_ERR_OPEN, "out of memory");
        return false;
    }
    for (size_t i = 0; i < f->count; i++) idx[i] = (st_name_index){f->tensors[i].name, i};
    qsort(idx, f->count, sizeof *idx, st_cmp_name_index);
    for (size_t i = 0; i < f->count; i++) f->by_name[i] = idx[i].index;
    free(idx);
    return true;
}

fp4d_st_file *fp4d_st_open_memory(const uint8_t *buf, size_t len, fp4d_st_open_result *res)
{
    if (res) {
        res->error = FP4D_ST_OK;
        res->message[0] = '\0';
    }
    if (!buf && len > 0) return st_fail(res, FP4D_ST_ERR_OPEN, "NULL buffer of %zu bytes", len);
    fp4d_st_file *f = calloc(1, sizeof *f);
    if (!f) return st_fail(res, FP4D_ST_ERR_OPEN, "out of memory");
    f->base = buf;
    f->len  = len;
    /* A local result lets st_validate test for errors even when the caller passed NULL. */
    fp4d_st_open_result local;
    local.error = FP4D_ST_OK;
    local.message[0] = '\0';
    if (!st_validate(f, &local)) {
        if (res) *res = local;
        fp4d_st_close(f);
        return NULL;
    }
    return f;
}

fp4d_st_file *fp4d_st_open(const char *path, fp4d_st_open_result *res)
{
    if (res) {
        res->error = FP4D_ST_OK;
        res->message[0] = '\0';
    }
    if (!path) return st_fail(res, FP4D_ST_ERR_OPEN, "no path given");
    /* O_NONBLOCK: a FIFO (or a device) given as a checkpoint must not block the open until a
     * writer comes - it is refused below as not a regular file; regular files ignore the flag */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return st_fail(res, fp4d_st_resource_errno(errno) ? FP4D_ST_ERR_RESOURCE : FP4D_ST_ERR_OPEN,
                       "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return st_fail(res, FP4D_ST_ERR_OPEN, "cannot stat '%s': %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(res, FP4D_ST_ERR_OPEN, "'%s' is not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    const uint8_t *base = NULL;
    if (len > 0) {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int err = errno;
            close(fd);
            return st_fail(res, fp4d_st_resource_errno(err) ? FP4D_ST_ERR_RESOURCE : FP4D_ST_ERR_OPEN,
                           "cannot map '%s': %s", path, strerror(err));
        }
        base = m;
    }
    close(fd); /* the mapping keeps the file alive */

    fp4d_st_open_result local;
    fp4d_st_file *f = fp4d_st_open_memory(base ? base : (const uint8_t *)"", len, &local);
    if (!f) {
        if (len > 0) munmap((void *)base, len);
        /* Prefix the path so a message about shard 17 of 40 says which file it is. */
        char msg[sizeof local.message + 4096];
        snprintf(msg, sizeof msg, "%s: %s", path, local.message);
        if (res) {
            size_t n = strlen(msg);
            if (n >= sizeof res->message) n = sizeof res->message - 1;
            res->error = local.error;
            memcpy(res->message, msg, n);
            res->message[n] = '\0';
        }
        fp4d_set_error(local.error == FP4D_ST_ERR_OPEN ? FP4D_STATUS_IO : FP4D_STATUS_PARSE, "%s", msg);
        return NULL;
    }
    f->owns_mapping = len > 0;
    return f;
}

/* ---- accessors -------------------------------------------------------------------------- */

size_t fp4d_st_count(const fp4d_st_file *f) { return f ? f->count : 0; }

const fp4d_st_tensor *fp4d_st_get(const fp4d_st_file *f, size_t i)
{
    if (!f || i >= f->count) return NULL;
    return &f->tensors[i];
}

const fp4d_st_tensor *fp4d_st_find(const fp4d_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const fp4d_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *fp4d_st_metadata(const fp4d_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    size_t lo = 0, hi = f->meta_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(key, f->meta[mid].key);
        if (c == 0) return f->meta[mid].value;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

size_t fp4d_st_metadata_count(const fp4d_st_file *f) { return f ? f->meta_count : 0; }

const char *fp4d_st_metadata_key(const fp4d_st_file *f, size_t i)
{
    if (!f || i >= f->meta_count) return NULL;
    return f->meta[i].key;
}

uint64_t fp4d_st_header_size(const fp4d_st_file *f) { return f ? f->header_size : 0; }
uint64_t fp4d_st_file_size(const fp4d_st_file *f) { return f ? (uint64_t)f->len : 0; }

uint64_t fp4d_st_element_count(const fp4d_st_tensor *t)
{
    if (!t) return 0;
    uint64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d]; /* validated: no overflow */
    return n;
}
