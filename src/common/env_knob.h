/* Tuning and test switches read from the environment (FP4DOCTOR_CUDA_*, FP4DOCTOR_REF_THREADS,
 * ...). Internal; usable from C and from the CUDA host code. */
#ifndef FP4D_ENV_KNOB_H
#define FP4D_ENV_KNOB_H

#ifdef __cplusplus
extern "C" {
#endif

/* The value of environment variable `name` read as decimal digits only, within [lo, hi]
 * (0 <= lo <= hi); `fallback` when it is unset or empty. Anything else - "abc", "-1", "1x",
 * " 2", a number out of range - gives `fallback` too, with one line on stderr per variable
 * and process naming the variable and the range: atoi() read "abc" as 0, so a typo turned a
 * kernel path off, or forced a split count, without a word. A fallback outside [lo, hi] (a
 * caller's "not set" marker, such as -1) is named "the default" in that line. Fork-safe: no
 * lock is taken. */
long fp4d_env_knob(const char *name, long lo, long hi, long fallback);

/* A positive real number (digits with an optional point and exponent: "60", "0.5", "1e3")
 * at most `hi`, read as strictly as fp4d_env_knob: anything else gives `fallback` and the one
 * warning. For multipliers such as FP4DOCTOR_TIMEOUT_SCALE. */
double fp4d_env_positive(const char *name, double hi, double fallback);

/* An on/off switch for A/B timing and tests (FP4DOCTOR_CUDA_WA, ...): on unless the variable
 * is 0. Read by fp4d_env_knob over [0, 1], so "off" or "2" keeps it on, with the warning. */
int fp4d_env_switch(const char *name);

/* Puts the names warned about so far into FP4DOCTOR_INTERNAL_WARNED_KNOBS, which the knob
 * readers of processes started after it take as warned already: `check` re-executes itself
 * once per backend, and each child read FP4DOCTOR_INCLUDE_FAULTY=off again and said so again.
 * setenv(): call it while no other thread reads the environment. */
void fp4d_env_knob_pass_warnings(void);

#ifdef __cplusplus
}
#endif

#endif
