/*
 * io.h - safetensors files (spec §7d): a strict, mmap-based reader and a writer.
 *
 * The reader maps the file read-only, so the user's file is never modified, and validates
 * every rule of the safetensors library plus stricter ones (duplicate keys, header not
 * starting with '{', unknown dtype strings, shape-product overflow). Each rule has its
 * own error code so the checkpoint scanner can turn it into a finding.
 */
#ifndef FP4DOCTOR_IO_H
#define FP4DOCTOR_IO_H

#include <stdbool.h>

#include "fp4doctor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* safetensors dtype strings, in the library's enum order (§7d.1). */
typedef enum fp4d_st_dtype {
    FP4D_ST_BOOL, FP4D_ST_F4, FP4D_ST_F6_E2M3, FP4D_ST_F6_E3M2, FP4D_ST_U8, FP4D_ST_I8,
    FP4D_ST_F8_E5M2, FP4D_ST_F8_E4M3, FP4D_ST_F8_E8M0, FP4D_ST_F8_E4M3FNUZ, FP4D_ST_F8_E5M2FNUZ,
    FP4D_ST_I16, FP4D_ST_U16, FP4D_ST_F16, FP4D_ST_BF16, FP4D_ST_I32, FP4D_ST_U32, FP4D_ST_F32,
    FP4D_ST_C64, FP4D_ST_F64, FP4D_ST_I64, FP4D_ST_U64,
    FP4D_ST_DTYPE_COUNT
} fp4d_st_dtype;

const char *fp4d_st_dtype_name(fp4d_st_dtype t);          /* "F8_E4M3" etc. */
bool        fp4d_st_dtype_from_name(const char *s, fp4d_st_dtype *out);
uint32_t    fp4d_st_dtype_bits(fp4d_st_dtype t);          /* 4, 6, 8, 16, 32, 64 */

/* Why a file was rejected: one code per rule, stable names (the scanner prints them). */
typedef enum fp4d_st_error {
    FP4D_ST_OK = 0,
    FP4D_ST_ERR_OPEN,                /* cannot open / stat / map */
    FP4D_ST_ERR_HEADER_TOO_SMALL,    /* file shorter than 8 bytes */
    FP4D_ST_ERR_HEADER_TOO_LARGE,    /* N > 100,000,000 */
    FP4D_ST_ERR_HEADER_LENGTH,       /* 8 + N past end of file */
    FP4D_ST_ERR_HEADER_NOT_OBJECT,   /* header does not start with '{' (stricter than the library) */
    FP4D_ST_ERR_HEADER_UTF8,         /* invalid UTF-8 */
    FP4D_ST_ERR_HEADER_JSON,         /* not JSON, or not the expected structure */
    FP4D_ST_ERR_DUPLICATE_KEY,       /* a tensor name appears twice (stricter) */
    FP4D_ST_ERR_UNKNOWN_DTYPE,       /* dtype string not in the list */
    FP4D_ST_ERR_METADATA,            /* __metadata__ not a string->string map */
    FP4D_ST_ERR_SHAPE_OVERFLOW,      /* product of dims overflows */
    FP4D_ST_ERR_MISALIGNED,          /* element count * bits not a whole number of bytes */
    FP4D_ST_ERR_OFFSETS,             /* gap, overlap, begin > end (InvalidOffset) */
    FP4D_ST_ERR_SIZE_MISMATCH,       /* end - begin != bytes implied by dtype and shape */
    FP4D_ST_ERR_TRUNCATED,           /* buffer shorter than the last tensor's end */
    FP4D_ST_ERR_TRAILING_BYTES,      /* buffer longer than the last tensor's end */
    FP4D_ST_ERR_RESOURCE,            /* the process ran out of memory or file descriptors opening
                                        or mapping it: a limit here, not a fault of the file */
    FP4D_ST_ERR_LFS_POINTER,         /* a Git LFS pointer file, not the data: never downloaded (the
                                        library: HeaderTooLarge, as its text read as a length is) */
    FP4D_ST_ERR_COUNT
} fp4d_st_error;

const char *fp4d_st_error_name(fp4d_st_error e);
/* Whether an errno from open/mmap is a limit of the process (ENOMEM, EMFILE, ENFILE, EAGAIN),
 * reported as FP4D_ST_ERR_RESOURCE rather than as a fault of the file. */
bool fp4d_st_resource_errno(int err); /* "HEADER_TOO_LARGE", ... */

#define FP4D_ST_MAX_DIMS 8

typedef struct fp4d_st_tensor {
    const char   *name;
    fp4d_st_dtype dtype;
    int32_t       ndim;
    int64_t       shape[FP4D_ST_MAX_DIMS];
    uint64_t      begin, end;        /* relative to the start of the byte buffer */
    const uint8_t *data;             /* points into the mapping; nbytes = end - begin */
    uint64_t      nbytes;
} fp4d_st_tensor;

typedef struct fp4d_st_file fp4d_st_file;

typedef struct fp4d_st_open_result {
    fp4d_st_error error;     /* FP4D_ST_OK on success */
    char          message[512]; /* names the tensor and the numbers involved */
} fp4d_st_open_result;

/*
 * Opens and validates a file. On any error returns NULL with *res describing the first
 * rule broken (res may be NULL). The mapping stays valid until fp4d_st_close.
 */
fp4d_st_file *fp4d_st_open(const char *path, fp4d_st_open_result *res);
/* Same, over a caller-owned buffer (fuzzing, tests); buf must outlive the handle. */
fp4d_st_file *fp4d_st_open_memory(const uint8_t *buf, size_t len, fp4d_st_open_result *res);
void          fp4d_st_close(fp4d_st_file *f); /* NULL is a no-op */

size_t                fp4d_st_count(const fp4d_st_file *f);
const fp4d_st_tensor *fp4d_st_get(const fp4d_st_file *f, size_t i);      /* in file-offset order */
const fp4d_st_tensor *fp4d_st_find(const fp4d_st_file *f, const char *name);
/* __metadata__ value, or NULL. */
const char           *fp4d_st_metadata(const fp4d_st_file *f, const char *key);
/* __metadata__ entries in key order, for copying them: count, then key i (NULL if out of
 * range); the value is fp4d_st_metadata(f, key). */
size_t                fp4d_st_metadata_count(const fp4d_st_file *f);
const char           *fp4d_st_metadata_key(const fp4d_st_file *f, size_t i);
uint64_t              fp4d_st_header_size(const fp4d_st_file *f);
uint64_t              fp4d_st_file_size(const fp4d_st_file *f);
uint64_t              fp4d_st_element_count(const fp4d_st_tensor *t);

/* ---- writer ---- */

typedef struct fp4d_st_writer fp4d_st_writer;

fp4d_st_writer *fp4d_st_writer_new(void);
/* Copies name and shape; data is referenced until fp4d_st_writer_save returns.
 * Returns INVALID_ARG on a duplicate name or a size that does not match dtype and shape. */
fp4d_status fp4d_st_writer_add(fp4d_st_writer *w, const char *name, fp4d_st_dtype dtype,
                               int32_t ndim, const int64_t *shape, const void *data, uint64_t nbytes);
fp4d_status fp4d_st_writer_set_metadata(fp4d_st_writer *w, const char *key, const char *value);
/* Writes tensors sorted by dtype alignment then name, header padded with spaces to a
 * multiple of 8, to a temporary file in the same folder that is renamed over path, so an
 * interrupted write never leaves a half file. */
fp4d_status fp4d_st_writer_save(fp4d_st_writer *w, const char *path);
void        fp4d_st_writer_free(fp4d_st_writer *w); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif
