/*
 * Internal: what a build's list of CUDA architectures can run. Pure string logic, built
 * with or without CUDA, so that the rules are tested on machines without a GPU.
 */
#ifndef FP4D_ARCH_LIST_H
#define FP4D_ARCH_LIST_H

#include <stdbool.h>
#include <stddef.h>

/* CMake's list "80-real;90a-real;90-virtual" (or comma-separated) as
 * "sm_80,sm_90a,compute_90": SASS as sm_, PTX as compute_. An entry without -real/-virtual
 * gives both, as CMake builds them; an entry that is no architecture number (CMake's "native",
 * "all", "all-major") is copied as it is. When out is too small, whole entries and then "...". */
void fp4d_arch_list_describe(const char *cmake_list, char *out, size_t cap);

typedef enum fp4d_arch_code {
    FP4D_ARCH_CODE_NONE = 0, /* nothing in the build runs there: kernel launches fail */
    FP4D_ARCH_CODE_PTX,      /* only PTX the driver JIT-compiles when the module is first used */
    FP4D_ARCH_CODE_NATIVE,   /* SASS the GPU runs as built */
    FP4D_ARCH_CODE_UNKNOWN   /* no entry applies, but some entry is no number ("native", "all") */
} fp4d_arch_code;

/*
 * What a list of architectures - CMake's form ("90a-real;90-virtual", "90a") or the described
 * one ("sm_90a,compute_90") - offers a GPU of compute capability major.minor.
 *
 * SASS: a plain sm_XY runs on XY and later minors of the same major, sm_XYf on the same family
 * (later minors of the same major), sm_XYa only on XY. On an integrated (Tegra) GPU SASS runs
 * only where it was built for exactly that version: CUDA's binary compatibility between minor
 * versions is for discrete GPUs only (CUDA C++ Programming Guide, "Binary Compatibility").
 * PTX: a plain compute_XY JIT-compiles for any XY or newer, compute_XYf within the family,
 * compute_XYa only for XY.
 */
fp4d_arch_code fp4d_arch_list_code_for(const char *archs, int major, int minor, bool integrated);

#endif
