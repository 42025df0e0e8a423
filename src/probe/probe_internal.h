/* Internal helpers of the endpoint probe (src/probe/). Not part of the API. */
#ifndef FP4D_PROBE_INTERNAL_H
#define FP4D_PROBE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "fp4doctor/probe.h"

/* A growable byte buffer, always NUL-terminated when p != NULL. */
typedef struct fp4d_buf {
    char  *p;
    size_t len, cap;
} fp4d_buf;

/* Appends n bytes; false when out of memory. */
bool fp4d_buf_append(fp4d_buf *b, const char *s, size_t n);
void fp4d_buf_free(fp4d_buf *b);

/* Copies s into dst[cap] (truncating, always terminated). */
void fp4d_probe_copy(char *dst, size_t cap, const char *s);

/* A malloc'd copy of s[0..n) with invalid UTF-8 replaced by U+FFFD, so that jansson accepts
 * it (model garbage and a quote cut at a byte limit are not always valid UTF-8). */
char *fp4d_probe_utf8_sanitize(const char *s, size_t n);

/* The hint for a finished report (verdict already set). */
void fp4d_probe_write_hint(fp4d_probe_report *r);

#endif
