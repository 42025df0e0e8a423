/*
 * Internal: the CPU GEMM engine behind the `cpu` backend and the faulty backends.
 *
 * The engine multiplies two operands described by fp4d_cpu_operand. Each operand knows how
 * to turn its rows into exact f32 values (e2m1 * block scale is exact in f32, spec §5), so
 * every output element is an f32 dot product of exact inputs: the classic gamma_K bound
 * holds whatever the summation order. The faulty backends reuse the same engine with a
 * "twist" in how an operand is read (scale layout, nibble order, scale decoding) or how
 * the sum is accumulated (bf16), which keeps each of them a few lines long.
 *
 * Kernels come in ISA flavours chosen at run time (BLIS-style: a portable reference first,
 * then per-CPU overrides): generic C, AVX2+FMA and AVX-512 (F+BW).
 */
#ifndef FP4D_CPU_INTERNAL_H
#define FP4D_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fp4doctor/backend.h"

typedef enum fp4d_cpu_isa {
    FP4D_CPU_ISA_GENERIC = 0,
    FP4D_CPU_ISA_AVX2    = 1, /* AVX2 + FMA */
    FP4D_CPU_ISA_AVX512  = 2, /* AVX-512 F + BW (+ AVX2/FMA) */
    FP4D_CPU_ISA_COUNT
} fp4d_cpu_isa;

const char  *fp4d_cpu_isa_name(fp4d_cpu_isa isa);  /* "generic", "avx2", "avx512" */
/* The best ISA this CPU runs, lowered by FP4DOCTOR_CPU_ISA=generic|avx2|avx512. */
fp4d_cpu_isa fp4d_cpu_isa_detect(void);
/* Whether this CPU can run isa at all. */
bool         fp4d_cpu_isa_available(fp4d_cpu_isa isa);
/* Threads to use: FP4DOCTOR_THREADS when set, else the number of online CPUs. */
int          fp4d_cpu_default_threads(void);

/* How the engine reads one operand (a row range of an fp4d_matrix). */
typedef struct fp4d_cpu_operand {
    fp4d_dtype        dtype;
    int64_t           rows, cols;        /* this operand's rows; cols = K */
    const void       *data;              /* row 0 of this operand */
    /* Block-scaled operands only: */
    const uint8_t    *scales;            /* the whole scale buffer */
    fp4d_scale_layout read_layout;       /* layout used to locate scales (a twist may lie) */
    int64_t           scale_row_offset;  /* this operand's row 0 within the scale matrix */
    int64_t           scale_rows;        /* rows of the scale matrix (layout padding) */
    int64_t           scale_cols;        /* K / block size */
    uint32_t          block_size;        /* 16 or 32 */
    size_t            scale_bytes;       /* bytes readable at scales; reads past it give 0x00 */
    float             scale_lut[256];    /* scale byte -> value */
    float             scale_half_lut[256]; /* scale byte -> value / 2 (exact), for 2*e2m1 codes */
    bool              nibble_swap;       /* twist: high nibble is the even element */
} fp4d_cpu_operand;

/*
 * Describes rows [row_offset, row_offset + rows) of matrix x (whose scale matrix has
 * scale_rows rows) as an operand read the honest way.
 */
void fp4d_cpu_operand_init(fp4d_cpu_operand *op, const fp4d_matrix *x, int64_t row_offset,
                           int64_t rows, int64_t scale_rows);

/* Byte offset of logical scale (r, c) in layout l, like fp4d_scale_offset but inlinable. */
static inline size_t fp4d_cpu_scale_offset(fp4d_scale_layout l, int64_t rows, int64_t cols,
                                           int64_t r, int64_t c)
{
    int64_t cp = (cols + 3) / 4 * 4;
    switch (l) {
    case FP4D_LAYOUT_SWIZZLED_128X4:
        return (size_t)((r / 128) * (128 * cp) + (c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + (c % 4));
    case FP4D_LAYOUT_SWIZZLED_8X4:
        return (size_t)((r / 8) * (8 * cp) + (c / 4) * 32 + (r % 8) * 4 + (c % 4));
    default:
        (void)rows;
        return (size_t)(r * cols + c);
    }
}

typedef struct fp4d_cpu_gemm {
    fp4d_cpu_operand a, b;          /* a: [m, k], b: [n, k] */
    int64_t          m, n, k;
    float            alpha;
    fp4d_dtype       out_type;
    void            *out;           /* row-major [m, n] */
    bool             bf16_accumulate; /* twist: round the running sum to bf16 after each add */
} fp4d_cpu_gemm;

/* Runs g with up to `threads` threads using kernels for isa. */
fp4d_status fp4d_cpu_gemm_run(const fp4d_cpu_gemm *g, fp4d_cpu_isa isa, int threads);

/* A plain or grouped problem, read honestly, on the engine. */
fp4d_status fp4d_cpu_run_problem(const fp4d_gemm_problem *p, fp4d_cpu_isa isa, int threads);
fp4d_status fp4d_cpu_run_grouped(const fp4d_grouped_gemm_problem *p, fp4d_cpu_isa isa, int threads);

/* ---- per-ISA kernels (cpu_kernels_*.c) ---- */

/* Decodes nblk16 groups of 16 FP4 codes (8 bytes each) into dst, multiplying the group g
 * codes by scale16[g]. Exact. */
typedef void (*fp4d_cpu_decode_fn)(const uint8_t *codes, const float *scale16, int64_t nblk16,
                                   bool nibble_swap, float *dst);
/* Small-M product against FP4 weights, for rows n in [n0, n1) of b:
 * acc[i * ld + (n - n0)] = sum_k a[i * k + kk] * B^[n, kk] for i < mrows (1..4).
 * scratch holds k/16 floats (kernels may use it as scale_cols bytes). */
typedef void (*fp4d_cpu_smallm_fn)(const float *a, int mrows, int64_t k, const fp4d_cpu_operand *b,
                                   int64_t n0, int64_t n1, float *scale16, float *acc, int64_t ld);
/* C[mr x nr] (+)= Ap[kc][MR] * Bp[kc][NR]; c row stride ldc. accumulate=false overwrites.
 * mr <= MR and nr <= NR (edge tiles). */
typedef void (*fp4d_cpu_ukernel_fn)(int64_t kc, const float *ap, const float *bp, float *c,
                                    int64_t ldc, bool accumulate, int mr, int nr);

/* (optional) Dot-product tile for large M without packing: for i < mr, j < nr,
 * c[i * ldc + j] (+)= sum_{kk < kc} a[i][kk] * b[j][kk] over dot_mr activation rows and
 * dot_nr decoded weight rows (both at most 4; pointers past mr/nr are valid duplicates),
 * all K-contiguous, kc a multiple of 16. accumulate = false overwrites. */
typedef void (*fp4d_cpu_dot4x4_fn)(const float *const a[4], const float *const b[4], int64_t kc, float *c,
                                   int64_t ldc, bool accumulate, int mr, int nr);

typedef struct fp4d_cpu_kernels {
    fp4d_cpu_isa        isa;
    int                 mr, nr;      /* packed micro-tile (ukernel) */
    int64_t             mc, kc, nc;  /* packed cache blocking (kc a multiple of 32) */
    fp4d_cpu_decode_fn  decode;
    fp4d_cpu_smallm_fn  smallm;
    fp4d_cpu_ukernel_fn ukernel;     /* large M without dot4x4: packed panels */
    fp4d_cpu_dot4x4_fn  dot4x4;      /* when set, large M runs on it (blocked by dot_kc x dot_nc) */
    int                 dot_mr, dot_nr;
    int64_t             dot_kc, dot_nc;
} fp4d_cpu_kernels;

/*
 * The scale bytes of row r (operand-relative): scale (r, c) is at
 * row[(c >> 2 << quad_shift) + (c & 3)] in every layout. When a twisted read would leave
 * the buffer, the row is first copied (reading 0x00 outside) into scratch, which must hold
 * scale_cols bytes.
 */
const uint8_t *fp4d_cpu_scale_row(const fp4d_cpu_operand *op, int64_t r, uint8_t *scratch, int *quad_shift);

/* Gathers the block scales of row r (operand-relative) for K groups [g0, g1) of 16. */
void fp4d_cpu_gather_scales16(const fp4d_cpu_operand *op, int64_t r, int64_t g0, int64_t g1,
                              float *scale16);

const fp4d_cpu_kernels *fp4d_cpu_kernels_generic(void);
const fp4d_cpu_kernels *fp4d_cpu_kernels_avx2(void);   /* NULL when not compiled for x86-64 */
const fp4d_cpu_kernels *fp4d_cpu_kernels_avx512(void); /* NULL when not compiled for x86-64 */
const fp4d_cpu_kernels *fp4d_cpu_kernels_for(fp4d_cpu_isa isa);

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX2 kernels the AVX-512 table reuses (vector-ALU bound either way). */
void fp4d_cpu_decode_avx2(const uint8_t *codes, const float *scale16, int64_t nblk16, bool nibble_swap, float *dst);
void fp4d_cpu_smallm_avx2(const float *a, int mrows, int64_t k, const fp4d_cpu_operand *b, int64_t n0, int64_t n1,
                          float *scratch, float *acc, int64_t ld);
#endif

/* The e2m1 value table (code -> value). */
extern const float fp4d_cpu_e2m1_values[16];

#endif
