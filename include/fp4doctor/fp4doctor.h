/*
 * fp4doctor.h - version, status codes and error reporting shared by every module.
 *
 * If a function, type or constant is not declared in a header under include/fp4doctor/,
 * it is not part of the published API.
 */
#ifndef FP4DOCTOR_FP4DOCTOR_H
#define FP4DOCTOR_FP4DOCTOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4D_VERSION_MAJOR 0
#define FP4D_VERSION_MINOR 1
#define FP4D_VERSION_PATCH 0
#define FP4D_VERSION_STRING "0.1.0"
#define FP4D_VERSION_NUMBER (FP4D_VERSION_MAJOR * 10000 + FP4D_VERSION_MINOR * 100 + FP4D_VERSION_PATCH)

/* Run-time version; compare with FP4D_VERSION_NUMBER to detect a header/library mismatch. */
unsigned    fp4d_version_number(void);
const char *fp4d_version_string(void);

/*
 * Status codes. Numbers are stable and append-only: never renumber, never remove.
 * X(name, number, description)
 */
#define FP4D_STATUS_LIST(X)                                                            \
    X(OK,          0, "success")                                                       \
    X(INVALID_ARG, 1, "invalid argument")                                              \
    X(UNSUPPORTED, 2, "operation not supported by this backend or build")              \
    X(NOMEM,       3, "out of memory")                                                 \
    X(IO,          4, "input/output error")                                            \
    X(PARSE,       5, "malformed input")                                               \
    X(NOT_FOUND,   6, "not found")                                                     \
    X(DEVICE,      7, "device error")                                                  \
    X(INTERNAL,    8, "internal error")                                                \
    X(TIMEOUT,     9, "timed out")                                                     \
    X(INTERRUPTED, 10, "interrupted")

typedef enum fp4d_status {
#define FP4D_STATUS_ENUM_(name, num, desc) FP4D_STATUS_##name = num,
    FP4D_STATUS_LIST(FP4D_STATUS_ENUM_)
#undef FP4D_STATUS_ENUM_
    FP4D_STATUS_COUNT_
} fp4d_status;

/* "invalid argument" etc.; never NULL. */
const char *fp4d_status_str(fp4d_status s);
/* "INVALID_ARG" etc.; never NULL. */
const char *fp4d_status_name(fp4d_status s);

/*
 * A thread-local message describing the most recent failure in this thread, with the
 * details a user needs (tensor name, offset, expected vs found). Functions that return
 * a non-OK status set it; successful calls leave it alone. Never NULL ("" when unset).
 */
const char *fp4d_last_error(void);

/* Process exit codes of the fp4doctor CLI (docs/exit-codes.md). */
enum fp4d_exit {
    FP4D_EXIT_OK       = 0, /* every check passed */
    FP4D_EXIT_FAILED   = 1, /* a backend failed, a finding of severity error, an unhealthy probe */
    FP4D_EXIT_USAGE    = 2, /* bad command line */
    FP4D_EXIT_INPUT    = 3, /* an input could not be read or parsed */
    FP4D_EXIT_INTERNAL = 4  /* a bug or an environment failure in fp4doctor itself */
};

#ifdef __cplusplus
}
#endif
#endif
