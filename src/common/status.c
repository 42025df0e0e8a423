/* Status strings, version and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "fp4doctor/fp4doctor.h"
#include "internal.h"

static const char *const status_desc[] = {
#define FP4D_STATUS_DESC_(name, num, desc) [num] = desc,
    FP4D_STATUS_LIST(FP4D_STATUS_DESC_)
#undef FP4D_STATUS_DESC_
};

static const char *const status_names[] = {
#define FP4D_STATUS_NAME_(name, num, desc) [num] = #name,
    FP4D_STATUS_LIST(FP4D_STATUS_NAME_)
#undef FP4D_STATUS_NAME_
};

const char *fp4d_status_str(fp4d_status s)
{
    if ((unsigned)s >= FP4D_STATUS_COUNT_ || !status_desc[s]) return "unknown status";
    return status_desc[s];
}

const char *fp4d_status_name(fp4d_status s)
{
    if ((unsigned)s >= FP4D_STATUS_COUNT_ || !status_names[s]) return "UNKNOWN";
    return status_names[s];
}

unsigned fp4d_version_number(void) { return FP4D_VERSION_NUMBER; }
const char *fp4d_version_string(void) { return FP4D_VERSION_STRING; }

/* One buffer per thread: the CPU backend and the probe run threads of their own. */
static _Thread_local char last_error[1024];

const char *fp4d_last_error(void) { return last_error; }

fp4d_status fp4d_set_error(fp4d_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

void fp4d_clear_error(void) { last_error[0] = '\0'; }
