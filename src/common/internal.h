/* Internal helpers shared by the library's modules. Not part of the API. */
#ifndef FP4D_INTERNAL_H
#define FP4D_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "fp4doctor/formats.h"
#include "fp4doctor/fp4doctor.h"
#include "env_knob.h"

#if defined(__GNUC__)
#define FP4D_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FP4D_PRINTF(a, b)
#endif

/* Sets fp4d_last_error() and returns s, so guards read `return fp4d_set_error(...)`. */
fp4d_status fp4d_set_error(fp4d_status s, const char *fmt, ...) FP4D_PRINTF(2, 3);
void        fp4d_clear_error(void);

/* Guard chain in the zstd style: RETURN_ERROR_IF(cond, INVALID_ARG, "k=%d", k). */
#define FP4D_RETURN_ERROR_IF(cond, status, ...)                                   \
    do {                                                                          \
        if (cond) return fp4d_set_error(FP4D_STATUS_##status, __VA_ARGS__);       \
    } while (0)

#define FP4D_FORWARD_IF_ERROR(expr)                                               \
    do {                                                                          \
        fp4d_status fp4d_fwd_ = (expr);                                           \
        if (fp4d_fwd_ != FP4D_STATUS_OK) return fp4d_fwd_;                        \
    } while (0)

#define FP4D_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Length of the valid UTF-8 sequence at s (at most n bytes; no overlong form, surrogate or
 * code point past U+10FFFF), 0 when it is not one. */
size_t fp4d_utf8_seq_len(const unsigned char *s, size_t n);

/* Makes untrusted text (a plugin's reason, a checkpoint's tensor name inside a message) safe
 * to print on a terminal and to embed in JSON or XML, in place, keeping its length: every byte
 * of an invalid UTF-8 sequence, C0 and C1 control characters (terminal escape sequences), DEL
 * and U+FFFE/U+FFFF become '?'. Tabs and newlines too: such text is one line. */
void fp4d_text_clean(char *s);

/* fp4d_quantize's argument checks (formats/quantize.c), for callers that hand the problem to
 * another quantizer (fp4d_backend_quantize): OK, or INVALID_ARG with the reason. */
fp4d_status fp4d_quantize_check(const fp4d_quantize_params *p, fp4d_dtype src_type, const void *src, int64_t rows,
                                int64_t cols, const uint8_t *codes, const uint8_t *scales);

/* A number in an environment variable read as decimal digits only - no sign, spaces or
 * trailing text - at most max; -1 for anything else, empty included. atoi() read "abc" as 0
 * and "1x" as 1, so a typo in a test switch silently meant some device. */
long fp4d_env_digits(const char *text, long max);

/* In a child just forked from parent: has it killed (SIGKILL) when the parent exits, so that
 * a `check` or `replay` killed by a signal leaves no child running on - a hung one would
 * otherwise never end, as only the parent's time limit stops it. False when that cannot be
 * set up or the parent is already gone: the child should _exit then. Async-signal-safe. */
bool fp4d_child_dies_with_parent(pid_t parent);

#endif
