/* Tuning and test switches from the environment: see env_knob.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_knob.h"
#include "internal.h"

/* Variables already warned about (their names, as passed: callers use string literals). A
 * knob is read on every launch plan, so one warning per variable, not per read; past the
 * table's end every read warns, which is noisy but still says what is wrong. */
#define WARNED_MAX 32
static const char     *warned[WARNED_MAX];
static int             warned_count;
static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;

static int first_warning(const char *name)
{
    int first = 1;
    pthread_mutex_lock(&warned_lock);
    for (int i = 0; i < warned_count && first; i++)
        if (strcmp(warned[i], name) == 0) first = 0;
    if (first && warned_count < WARNED_MAX) warned[warned_count++] = name;
    pthread_mutex_unlock(&warned_lock);
    return first;
}

long fp4d_env_knob(const char *name, long lo, long hi, long fallback)
{
    const char *text = getenv(name);
    if (!text || !*text) return fallback;
    const long v = fp4d_env_digits(text, hi);
    if (v >= lo) return v;
    if (first_warning(name)) {
        /* the value is the user's own text: printed cleaned and cut short, never as is */
        char shown[40];
        snprintf(shown, sizeof shown, "%s", text);
        fp4d_text_clean(shown);
        fprintf(stderr, "fp4doctor: ignoring %s=%s%s (expected a whole number from %ld to %ld); using %ld\n", name,
                shown, strlen(text) >= sizeof shown ? "..." : "", lo, hi, fallback);
    }
    return fallback;
}
