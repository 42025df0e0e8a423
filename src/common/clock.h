/* Monotonic wall-clock seconds, for timeouts, durations and progress rates. Not part of the API. */
#ifndef FP4D_CLOCK_H
#define FP4D_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC): only differences mean anything. */
static inline double fp4d_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
