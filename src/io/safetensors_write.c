/*
 * safetensors_write.c - the safetensors writer (spec §7d.1).
 *
 * Lays tensors out the way the reference library's `prepare` does: sorted by dtype in
 * descending enum order (which is descending alignment, so every tensor stays aligned to its
 * element size when the header is padded to 8) and then by name, offsets contiguous from 0,
 * the header padded with spaces to a multiple of 8 bytes and "__metadata__" first.
 * The file is written to a temporary file in the destination folder and renamed over the
 * destination, so a reader never sees half a file and an interrupted run leaves the old
 * file (or none) rather than a truncated one.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "fp4doctor/io.h"
#include "internal.h"
#include "replace_file.h"

typedef struct st_write_entry {
    char         *name;
    fp4d_st_dtype dtype;
    int32_t       ndim;
    int64_t       shape[FP4D_ST_MAX_DIMS];
    const void   *data;
    uint64_t      nbytes;
} st_write_entry;

struct fp4d_st_writer {
    st_write_entry *entries;
    size_t          count, cap;
    json_t         *metadata; /* object of strings, in insertion order */
    json_t         *names;    /* the tensor names added, as keys: a hashed duplicate check, since
                               * comparing with every earlier name made quantizing a MoE shard of
                               * 20,000 tensors (60,000 written) take 20 s */
};

fp4d_st_writer *fp4d_st_writer_new(void)
{
    fp4d_st_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->metadata = json_object();
    w->names = json_object();
    if (!w->metadata || !w->names) {
        json_decref(w->metadata);
        json_decref(w->names);
        free(w);
        return NULL;
    }
    return w;
}

void fp4d_st_writer_free(fp4d_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->count; i++) free(w->entries[i].name);
    free(w->entries);
    json_decref(w->metadata);
    json_decref(w->names);
    free(w);
}

fp4d_status fp4d_st_writer_add(fp4d_st_writer *w, const char *name, fp4d_st_dtype dtype, int32_t ndim,
                               const int64_t *shape, const void *data, uint64_t nbytes)
{
    FP4D_RETURN_ERROR_IF(!w || !name, INVALID_ARG, "safetensors writer: NULL writer or name");
    FP4D_RETURN_ERROR_IF(!strcmp(name, "__metadata__"), INVALID_ARG,
                         "safetensors writer: '__metadata__' is reserved and cannot name a tensor");
    FP4D_RETURN_ERROR_IF((unsigned)dtype >= FP4D_ST_DTYPE_COUNT, INVALID_ARG,
                         "safetensors writer: tensor '%s' has an invalid dtype %d", name, (int)dtype);
    FP4D_RETURN_ERROR_IF(ndim < 0 || ndim > FP4D_ST_MAX_DIMS || (ndim > 0 && !shape), INVALID_ARG,
                         "safetensors writer: tensor '%s' has %d dimensions", name, (int)ndim);
    FP4D_RETURN_ERROR_IF(nbytes > 0 && !data, INVALID_ARG, "safetensors writer: tensor '%s' has no data",
                         name);
    FP4D_RETURN_ERROR_IF(json_object_get(w->names, name) != NULL, INVALID_ARG,
                         "safetensors writer: duplicate tensor name '%s'", name);

    uint64_t nelem = 1;
    for (int32_t d = 0; d < ndim; d++) {
        FP4D_RETURN_ERROR_IF(shape[d] < 0, INVALID_ARG, "safetensors writer: tensor '%s' has shape[%d] = %lld",
                             name, (int)d, (long long)shape[d]);
        uint64_t dim = (uint64_t)shape[d];
        FP4D_RETURN_ERROR_IF(dim != 0 && nelem > UINT64_MAX / 64 / dim, INVALID_ARG,
                             "safetensors writer: tensor '%s': shape product overflows", name);
        nelem *= dim;
    }
    uint64_t nbits = nelem * fp4d_st_dtype_bits(dtype);
    FP4D_RETURN_ERROR_IF(nbits % 8 != 0, INVALID_ARG,
                         "safetensors writer: tensor '%s': %llu elements of %s are not whole bytes", name,
                         (unsigned long long)nelem, fp4d_st_dtype_name(dtype));
    FP4D_RETURN_ERROR_IF(nbits / 8 != nbytes, INVALID_ARG,
                         "safetensors writer: tensor '%s': %s with %llu elements needs %llu bytes, got %llu",
                         name, fp4d_st_dtype_name(dtype), (unsigned long long)nelem,
                         (unsigned long long)(nbits / 8), (unsigned long long)nbytes);

    if (w->count == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        st_write_entry *e = realloc(w->entries, cap * sizeof *e);
        FP4D_RETURN_ERROR_IF(!e, NOMEM, "safetensors writer: out of memory");
        w->entries = e;
        w->cap = cap;
    }
    st_write_entry *e = &w->entries[w->count];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    FP4D_RETURN_ERROR_IF(!e->name, NOMEM, "safetensors writer: out of memory");
    /* _nocheck: a name that is not UTF-8 is still refused where it always was, at save */
    if (json_object_set_new_nocheck(w->names, name, json_true()) != 0) {
        free(e->name);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "safetensors writer: out of memory");
    }
    e->dtype = dtype;
    e->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->data = data;
    e->nbytes = nbytes;
    w->count++;
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_st_writer_set_metadata(fp4d_st_writer *w, const char *key, const char *value)
{
    FP4D_RETURN_ERROR_IF(!w || !key || !value, INVALID_ARG, "safetensors writer: NULL metadata key or value");
    json_t *s = json_string(value);
    FP4D_RETURN_ERROR_IF(!s, INVALID_ARG, "safetensors writer: metadata value of '%s' is not valid UTF-8", key);
    FP4D_RETURN_ERROR_IF(json_object_set_new(w->metadata, key, s) != 0, INVALID_ARG,
                         "safetensors writer: metadata key '%s' is not valid UTF-8", key);
    return FP4D_STATUS_OK;
}

/* Descending dtype (the library's alignment order), then name bytewise. */
static int st_cmp_write_order(const void *pa, const void *pb)
{
    const st_write_entry *a = *(const st_write_entry *const *)pa;
    const st_write_entry *b = *(const st_write_entry *const *)pb;
    if (a->dtype != b->dtype) return a->dtype > b->dtype ? -1 : 1;
    return strcmp(a->name, b->name);
}

static bool st_write_all(int fd, const void *buf, uint64_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t k = write(fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += k;
        len -= (uint64_t)k;
    }
    return true;
}

/* Builds the padded header; *out_len is a multiple of 8. Caller frees. */
static fp4d_status st_build_header(fp4d_st_writer *w, st_write_entry **order, char **out, size_t *out_len)
{
    json_t *root = json_object();
    FP4D_RETURN_ERROR_IF(!root, NOMEM, "safetensors writer: out of memory");
    if (json_object_size(w->metadata) > 0) json_object_set(root, "__metadata__", w->metadata);
    uint64_t offset = 0;
    for (size_t i = 0; i < w->count; i++) {
        st_write_entry *e = order[i];
        json_t *shape = json_array();
        for (int32_t d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", fp4d_st_dtype_name(e->dtype), "shape", shape,
                                  "data_offsets", (json_int_t)offset, (json_int_t)(offset + e->nbytes));
        if (!entry || json_object_set_new(root, e->name, entry) != 0) {
            json_decref(root);
            return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                                  "safetensors writer: cannot encode tensor '%s' (name not valid UTF-8?)", e->name);
        }
        offset += e->nbytes;
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    FP4D_RETURN_ERROR_IF(!text, NOMEM, "safetensors writer: cannot serialise the header");
    size_t len = strlen(text);
    size_t padded = (len + 7) / 8 * 8;
    char *buf = malloc(padded ? padded : 8);
    if (!buf) {
        free(text);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "safetensors writer: out of memory");
    }
    memcpy(buf, text, len);
    memset(buf + len, ' ', padded - len);
    free(text);
    *out = buf;
    *out_len = padded;
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_st_writer_save(fp4d_st_writer *w, const char *path)
{
    FP4D_RETURN_ERROR_IF(!w || !path || !path[0], INVALID_ARG, "safetensors writer: NULL writer or empty path");
    /* The file is made beside path and renamed over it, which would replace whatever path is
     * with a regular file: a symbolic link (not its target), a FIFO its reader waits on, a
     * device node (/dev/null, as root). Only a new path or a regular file is written. */
    struct stat old;
    const bool exists = lstat(path, &old) == 0;
    FP4D_RETURN_ERROR_IF(exists && !S_ISREG(old.st_mode), IO,
                         "cannot write '%s': not a regular file (a link, FIFO, device or directory); "
                         "name a new or regular file", path);
    /* The CLI's report files' rules (cli_open_output): an output the user made read-only stays
     * so (renaming over it needs only the folder to be writable, so without this check a 0444
     * file, even someone else's, was replaced); an existing file keeps its permissions (an
     * 0600 output became 0644, readable by all); a new one gets 0666 less the umask, as
     * fopen() would give it (fp4d_replace_mode). */
    FP4D_RETURN_ERROR_IF(exists && access(path, W_OK) != 0, IO, "cannot write '%s': %s (an existing output is "
                         "replaced only where it may be written)", path, strerror(errno));
    const mode_t mode = fp4d_replace_mode(exists ? &old : NULL);

    st_write_entry **order = malloc((w->count ? w->count : 1) * sizeof *order);
    FP4D_RETURN_ERROR_IF(!order, NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->count; i++) order[i] = &w->entries[i];
    qsort(order, w->count, sizeof *order, st_cmp_write_order);

    char *header = NULL;
    size_t header_len = 0;
    fp4d_status s = st_build_header(w, order, &header, &header_len);
    if (s != FP4D_STATUS_OK) {
        free(order);
        return s;
    }

    char *tmp = NULL;
    const int fd = fp4d_replace_begin(path, mode, &tmp);
    if (fd < 0) {
        s = fp4d_set_error(FP4D_STATUS_IO, "cannot create a temporary file next to '%s': %s", path,
                           strerror(errno));
        free(order);
        free(header);
        return s;
    }

    uint8_t len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)header_len >> (8 * i));
    bool ok = st_write_all(fd, len_le, 8) && st_write_all(fd, header, header_len);
    for (size_t i = 0; ok && i < w->count; i++) ok = st_write_all(fd, order[i]->data, order[i]->nbytes);
    int err = errno;
    if (!ok) fp4d_replace_abort(fd, tmp);
    else err = fp4d_replace_commit(fd, tmp, path, true);
    if (!ok || err) s = fp4d_set_error(FP4D_STATUS_IO, "cannot write '%s': %s", path, strerror(err ? err : EIO));
    free(order);
    free(header);
    return s;
}
