/* Tuning and test switches from the environment: see env_knob.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_knob.h"
#include "internal.h"

/* Variables already warned about (their names, as passed: callers use string literals). A
 * knob is read on every launch plan, so one warning per variable, not per read; past the
 * table's end every read warns, which is noisy but still says what is wrong. Slots are claimed
 * by compare-and-swap rather than under a lock: `replay` forks without exec, and a lock held by
 * another thread at the fork would never be released in the child. */
#define WARNED_MAX 32
static const char *warned[WARNED_MAX];

#define WARNED_ENV "FP4DOCTOR_INTERNAL_WARNED_KNOBS"

/* Whether the process that started this one warned about name already (a comma-separated
 * list in WARNED_ENV). */
static int warned_by_parent(const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = getenv(WARNED_ENV); p && *p;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        p += len + (comma != NULL);
    }
    return 0;
}

static int first_warning(const char *name)
{
    if (warned_by_parent(name)) return 0;
    for (int i = 0; i < WARNED_MAX; i++) {
        const char *seen = __atomic_load_n(&warned[i], __ATOMIC_ACQUIRE);
        if (!seen) {
            const char *expected = NULL;
            if (__atomic_compare_exchange_n(&warned[i], &expected, name, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return 1;
            seen = expected; /* another thread took the slot first */
        }
        if (strcmp(seen, name) == 0) return 0;
    }
    return 1;
}

/* The one warning per variable: `expected` says what would have been taken, `using` what is */
static void warn_ignored(const char *name, const char *text, const char *expected, const char *using)
{
    if (!first_warning(name)) return;
    /* the value is the user's own text: printed cleaned and cut short, never as is */
    char shown[40];
    snprintf(shown, sizeof shown, "%s", text);
    fp4d_text_clean(shown);
    fprintf(stderr, "fp4doctor: ignoring %s=%s%s (expected %s); %s\n", name, shown,
            strlen(text) >= sizeof shown ? "..." : "", expected, using);
}

long fp4d_env_knob(const char *name, long lo, long hi, long fallback)
{
    const char *text = getenv(name);
    if (!text || !*text) return fallback;
    const long v = fp4d_env_digits(text, hi);
    if (v >= lo && v <= hi) return v;
    char expected[80], using[48];
    snprintf(expected, sizeof expected, "a whole number from %ld to %ld", lo, hi);
    /* a fallback outside the range is a "decide for me" marker, not a value to name */
    if (fallback >= lo && fallback <= hi) snprintf(using, sizeof using, "using %ld", fallback);
    else snprintf(using, sizeof using, "using the default");
    warn_ignored(name, text, expected, using);
    return fallback;
}

double fp4d_env_positive(const char *name, double hi, double fallback)
{
    const char *text = getenv(name);
    if (!text || !*text) return fallback;
    /* strtod alone took " 2", "2x" (as 2) and "nan"; a number starts with a digit or a point */
    char *end;
    const double v = (text[0] >= '0' && text[0] <= '9') || text[0] == '.' ? strtod(text, &end) : -1.0;
    if (v > 0.0 && v <= hi && *end == '\0') return v;
    char expected[80], using[48];
    snprintf(expected, sizeof expected, "a number above 0, at most %g", hi);
    snprintf(using, sizeof using, "using %g", fallback);
    warn_ignored(name, text, expected, using);
    return fallback;
}

int fp4d_env_switch(const char *name)
{
    return fp4d_env_knob(name, 0, 1, 1) != 0;
}

void fp4d_env_knob_pass_warnings(void)
{
    char list[1024];
    size_t len = 0;
    const char *inherited = getenv(WARNED_ENV);
    if (inherited) len = (size_t)snprintf(list, sizeof list, "%s", inherited);
    if (len >= sizeof list) return; /* an inherited list too long to extend: keep it as it is */
    for (int i = 0; i < WARNED_MAX; i++) {
        const char *name = __atomic_load_n(&warned[i], __ATOMIC_ACQUIRE);
        if (!name) break;
        const size_t n = strlen(name);
        if (len + n + 2 > sizeof list) break; /* the rest warn once per child, as before */
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? "," : "", name);
    }
    if (len) setenv(WARNED_ENV, list, 1);
}
