/* Internal: the doctor's pieces (case data, judging, causes, env, JSON). Not part of the API. */
#ifndef FP4D_DOCTOR_INTERNAL_H
#define FP4D_DOCTOR_INTERNAL_H

#include <jansson.h>

#include "fp4doctor/doctor.h"
#include "fp4doctor/formats.h"
#include "fp4doctor/gemm.h"

/* ---- deterministic randomness (splitmix64): the same (seed, case) gives the same bytes
 * in the parent, in every child and on every machine ---- */
typedef struct fp4d_rng {
    uint64_t state;
} fp4d_rng;

uint64_t fp4d_rng_next(fp4d_rng *r);
double   fp4d_rng_uniform(fp4d_rng *r);      /* [0, 1) */
double   fp4d_rng_gaussian(fp4d_rng *r);     /* N(0, 1) */
fp4d_rng fp4d_rng_for(uint64_t seed, const char *name, uint64_t stream);

/* ---- one operand as the doctor keeps it ---- */
typedef struct fp4d_operand {
    fp4d_matrix mat;           /* what the backend gets (scales in the case's layout) */
    fp4d_matrix canon;         /* the same values with LINEAR scales (for the reference) */
    void       *data;          /* owned buffers behind mat/canon */
    uint8_t    *scales;        /* mat.scales */
    uint8_t    *canon_scales;  /* canon.scales */
    size_t      data_bytes, scales_bytes;
    double      decode_scale;  /* NVFP4: the per-tensor decode scale folded into alpha; else 1 */
} fp4d_operand;

/* The operands of a case. Plain GEMM: a, b[0], alpha[0]. Grouped: a, b[e], alpha[e],
 * offsets. Quantize: src (the f32 input, a.rows x a.cols). */
typedef struct fp4d_case_data {
    const fp4d_case *c;
    fp4d_operand     a;
    fp4d_operand    *b;          /* num_b operands */
    int32_t          num_b;
    float           *alpha;      /* num_b values */
    int64_t         *offsets;    /* grouped: num_b + 1 row offsets */
    float           *src;        /* quantize: rows*cols f32 */
    float            static_encode_scale; /* quantize/saturating: the gs given to the quantizer */
} fp4d_case_data;

fp4d_status fp4d_case_data_make(const fp4d_case *c, uint64_t seed, fp4d_case_data *d);
void        fp4d_case_data_free(fp4d_case_data *d);

/* The problem a backend is given for d's case, its out left NULL: a plain one, or a grouped one
 * over `experts` (d->num_b entries the caller provides, filled here). */
fp4d_gemm_problem         fp4d_case_gemm_problem(const fp4d_case_data *d);
fp4d_grouped_gemm_problem fp4d_case_grouped_problem(const fp4d_case_data *d, fp4d_matrix *experts);

/* The plain problem of expert e (plain GEMM: e = 0) over its rows, with linear scales:
 * what the exact reference is computed on. rows of expert e start at row0. */
void fp4d_case_canon_problem(const fp4d_case_data *d, int32_t e, fp4d_gemm_problem *p,
                             int64_t *row0, int64_t *rows);
/* The expert that owns output row m (0 for plain GEMMs). */
int32_t fp4d_case_expert_of_row(const fp4d_case_data *d, int64_t m);

/* ---- decoding operands, optionally under a mistake (cause matching) ---- */
typedef struct fp4d_mistake {
    bool misread_layout; /* scales read with the other layout (linear <-> 128x4 swizzled) */
    bool nibble_swap;    /* high and low code of each byte exchanged */
    bool ue8m0_scales;   /* e4m3 scale bytes decoded as ue8m0 */
    bool block32;        /* NVFP4 read with 32-element blocks (scale column = k / 32) */
    bool block32_stride16; /* with block32: the scale matrix keeps its true K/16 columns
                              (only the kernel's block constant is 32; the host passed the
                              right stride) instead of K/32 */
    bool transposed;     /* the [rows, K] memory read as [K, rows] */
    bool transposed_codes_only; /* with transposed: scales still read at (row, k / block) */
} fp4d_mistake;

/* Decodes row r of op (as given to the backend, without the per-tensor scale) into
 * dst[0..K) in double. */
void fp4d_operand_decode_row(const fp4d_operand *op, int64_t r, const fp4d_mistake *mk, double *dst);

/* ---- error model (docs/tolerance.md) ---- */
typedef struct fp4d_tolerance {
    double gamma;      /* gamma_{K+1} for f32 accumulation plus the alpha multiply */
    double u_out;      /* unit roundoff of the output type */
    double tiny_out;   /* half the smallest subnormal of the output type */
    double practical;  /* relative practical tolerance (of S) for INACCURATE vs WRONG */
} fp4d_tolerance;

fp4d_tolerance fp4d_tolerance_for(int64_t k, fp4d_dtype out_type);
/* Bound for |out - exact| at one element: exact value v, S = |alpha| sum |a||b|. */
double fp4d_bound_fp32(const fp4d_tolerance *t, double v, double s);
double fp4d_bound_practical(const fp4d_tolerance *t, double v, double s);

double fp4d_out_round(fp4d_dtype out_type, double v); /* to f32, then to out_type, as double */

/* ---- cause matching on sampled elements ---- */
typedef struct fp4d_sample {
    int64_t m, n;
    double  y;       /* backend output */
    double  exact;   /* exact value (double) */
    double  s;       /* |alpha| * sum |a||b| */
} fp4d_sample;

/* Finds the known mistake that best explains the backend's values at the samples.
 * Returns FP4D_CAUSE_UNKNOWN when none does; fills why with a one-line explanation. */
fp4d_cause fp4d_match_cause(const fp4d_case_data *d, const fp4d_sample *samples, size_t count,
                            char *why, size_t why_size);
/* Describes the unwritten (still poisoned) elements; returns TILE_ROWS_MISSING when they
 * are whole rows, else UNKNOWN. A grouped GEMM (offsets of num_experts > 1; else NULL/0)
 * has its rows numbered within each expert. */
fp4d_cause fp4d_match_unwritten(const int64_t *poison_per_row, int64_t m, int64_t n, const int64_t *offsets,
                                int32_t num_experts, char *why, size_t why_size);
/* The rows with flag[r] set as ranges ("64..127, 192..255", at most six). With offsets of
 * num_experts > 1, numbered within each expert, whose tiles are what a per-expert kernel
 * gets wrong: "expert 0: 64..84 (of 85); expert 2: 64..127 (of 151)". */
void fp4d_describe_rows(const uint8_t *flag, int64_t m, const int64_t *offsets, int32_t num_experts, char *out,
                        size_t size);

/* The NaN poison an output is filled with before a call (judge.c): a payload no arithmetic
 * produces, so that an element still holding it was never written. */
void fp4d_poison_fill(fp4d_dtype out_type, uint8_t *out, int64_t count);
bool fp4d_is_poison(fp4d_dtype out_type, const uint8_t *out, int64_t i);
/* An output buffer of `bytes` framed on both sides by fp4d_guard_size(bytes) bytes of
 * sentinel; the buffer starts at raw + fp4d_guard_size(bytes). fp4d_guard_check returns how
 * many sentinel bytes changed (*before of them before the buffer; *first_after the offset
 * of the first changed one after it, or -1). */
size_t   fp4d_guard_size(size_t bytes);
uint8_t *fp4d_guarded_alloc(size_t bytes);
int64_t  fp4d_guard_check(const uint8_t *raw, size_t bytes, int64_t *first_after, int64_t *before);

/* A stress case (FP4D_CASE_STRESS) on an opened backend (stress.c). */
fp4d_status fp4d_run_stress_case(fp4d_backend_t b, const fp4d_case *c, uint64_t seed, fp4d_case_result *r);
/* The M of the GEMMs a stress case runs on each instance in each round, and how many. */
extern const int64_t fp4d_stress_m[];
extern const size_t  fp4d_stress_m_count;
/* The same for a MoE stress case (num_experts > 0): rows of each grouped GEMM, all experts. */
extern const int64_t fp4d_stress_moe_rows[];
extern const size_t  fp4d_stress_moe_rows_count;
/* The batch of a stress case with num_experts experts (0: plain GEMMs): one of the two above. */
const int64_t *fp4d_stress_batch(int32_t num_experts, size_t *count);

/* Cases with one M that the M analyses, plots and speed comparisons may use. */
static inline bool fp4d_case_has_m(const fp4d_case *c)
{
    return c->op == FP4D_CASE_GEMM || c->op == FP4D_CASE_GROUPED;
}

/* One-line advice for a cause. */
const char *fp4d_cause_advice(fp4d_cause c);

/* ---- hooks for the child (runner.c): called after the backend returned ---- */
typedef void (*fp4d_call_hook)(void *user);
void fp4d_doctor_set_call_hook(fp4d_call_hook hook, void *user);
void fp4d_doctor_call_hook_fire(void);

/* ---- results and env as JSON (shared by the child protocol and the reports) ---- */
json_t *fp4d_result_to_json(const fp4d_case_result *r);
void    fp4d_result_from_json(const json_t *j, fp4d_case_result *r);
json_t *fp4d_case_to_json(const fp4d_case *c);
json_t *fp4d_env_to_json(void);

/* After every result is in (runner.c): each backend's verdict, cause and summary, which M
 * fail, the devices that disagree and the recommendation. Exposed for tests. */
void fp4d_report_finish(fp4d_report *rep);

/* Per-case time limit for the backend calls, seconds (FP4DOCTOR_TIMEOUT_SCALE applied). */
double fp4d_case_call_timeout(const fp4d_case *c, fp4d_backend_kind kind, bool needs_device,
                              bool first_in_child);
double fp4d_timeout_scale(void);

/* Key of a case without its M: cases with equal keys differ only in M (m_dependent). */
void fp4d_case_shape_key(const fp4d_case *c, char *key, size_t size);

#endif
