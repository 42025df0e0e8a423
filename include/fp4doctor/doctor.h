/*
 * doctor.h - the doctor: suites of cases, running a backend against the exact reference,
 * verdicts and causes, isolated runs in child processes, reports.
 *
 * Layers (DESIGN.md §2): a suite is a list of fp4d_case descriptions (cheap, no data);
 * fp4d_doctor_run_case() builds a case's operands deterministically from (case, seed),
 * runs one backend in THIS process and judges its output; fp4d_doctor_run() runs every
 * selected backend's cases in child processes (the executable re-runs itself with the
 * hidden `__child` subcommand) so that a crash or a hang costs one verdict, then fills a
 * fp4d_report; the fp4d_report_write_*() functions print it.
 *
 * Verdict and cause names are stable (people grep for them): never rename them.
 */
#ifndef FP4DOCTOR_DOCTOR_H
#define FP4DOCTOR_DOCTOR_H

#include <stdbool.h>
#include <stdio.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Verdicts and causes (DESIGN.md §5)
 * ------------------------------------------------------------------------------------- */

/* Ordered worst first: a smaller value is a worse verdict. UNSUPPORTED ranks after PASS
 * (an honest "cannot" is not a failure) and ERROR (the backend returned an error status,
 * or the case could not be run) ranks between WRONG and NONDETERMINISTIC. */
typedef enum fp4d_verdict {
    FP4D_VERDICT_CRASH = 0,        /* signal in the child */
    FP4D_VERDICT_TIMEOUT,          /* killed after the case's time limit */
    FP4D_VERDICT_OOB_WRITE,        /* sentinel bytes around the output changed */
    FP4D_VERDICT_UNWRITTEN,        /* NaN-poisoned output elements left untouched */
    FP4D_VERDICT_NAN,              /* NaN where the reference is finite */
    FP4D_VERDICT_INF,              /* Inf where the reference is finite */
    FP4D_VERDICT_ZEROS,            /* all-zero output where the reference is not */
    FP4D_VERDICT_WRONG,            /* beyond the practical tolerance */
    FP4D_VERDICT_ERROR,            /* the backend failed the call, or the case did not run */
    FP4D_VERDICT_NONDETERMINISTIC, /* two runs on identical inputs differ in some bit */
    FP4D_VERDICT_INACCURATE,       /* beyond the fp32-accumulation bound, within practical */
    FP4D_VERDICT_PASS,
    FP4D_VERDICT_UNSUPPORTED,      /* the backend says it cannot, and why */
    FP4D_VERDICT_COUNT
} fp4d_verdict;

const char *fp4d_verdict_name(fp4d_verdict v);                 /* "CRASH", ... ; "?" if invalid */
bool        fp4d_verdict_from_name(const char *name, fp4d_verdict *out);
/* The worse of two verdicts. */
fp4d_verdict fp4d_verdict_worst(fp4d_verdict a, fp4d_verdict b);
/* true for everything but PASS and UNSUPPORTED. */
bool         fp4d_verdict_is_failure(fp4d_verdict v);

typedef enum fp4d_cause {
    FP4D_CAUSE_NONE = 0,                 /* no cause (PASS, or a verdict needing none) */
    FP4D_CAUSE_SCALE_LAYOUT_LINEAR,      /* read 128x4-swizzled block scales as linear */
    FP4D_CAUSE_SCALE_LAYOUT_SWIZZLED,    /* read linear block scales as 128x4-swizzled */
    FP4D_CAUSE_NIBBLE_SWAP,              /* high/low FP4 code of each byte swapped */
    FP4D_CAUSE_GLOBAL_SCALE_INVERTED,    /* encode scale (2688/amax) used as decode scale */
    FP4D_CAUSE_GLOBAL_SCALE_MISSING,     /* alpha / per-tensor scale not applied */
    FP4D_CAUSE_SCALE_DECODED_AS_UE8M0,   /* NVFP4 e4m3 block scales decoded as ue8m0 */
    FP4D_CAUSE_BLOCK_SIZE_32,            /* NVFP4 data read with 32-element blocks */
    FP4D_CAUSE_B_TRANSPOSED,             /* B read as [K, N] instead of [N, K] */
    FP4D_CAUSE_TILE_ROWS_MISSING,        /* whole row ranges of output tiles not written */
    FP4D_CAUSE_M_DEPENDENT,              /* fails for some M, passes for others */
    FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, /* error pattern of bf16/fp16 accumulation */
    FP4D_CAUSE_UNKNOWN,                  /* failed, and no known mistake explains it */
    FP4D_CAUSE_CONCURRENCY,              /* right alone, wrong while other instances run at once */
    FP4D_CAUSE_COUNT
} fp4d_cause;

const char *fp4d_cause_name(fp4d_cause c); /* "" for NONE, "scale_layout_linear", ... */
bool        fp4d_cause_from_name(const char *name, fp4d_cause *out);

/* ---------------------------------------------------------------------------------------
 * Suites and cases
 * ------------------------------------------------------------------------------------- */

typedef enum fp4d_suite {
    FP4D_SUITE_QUICK   = 0, /* seconds on a CPU; still catches every faulty backend */
    FP4D_SUITE_DEFAULT = 1, /* what bare `fp4doctor` runs; LLM shapes with small M */
    FP4D_SUITE_FULL    = 2, /* everything, large M on LLM shapes */
    FP4D_SUITE_COUNT
} fp4d_suite;

const char *fp4d_suite_name(fp4d_suite s);
bool        fp4d_suite_from_name(const char *name, fp4d_suite *out);

typedef enum fp4d_case_op {
    FP4D_CASE_GEMM     = 0,
    FP4D_CASE_GROUPED  = 1, /* grouped MoE GEMM */
    FP4D_CASE_QUANTIZE = 2, /* quantize, judged bit-exactly against the convention */
    FP4D_CASE_STRESS   = 3  /* a batch of GEMMs of mixed M on several instances at once */
} fp4d_case_op;

/* How a case's inputs are made (docs/tolerance.md says why each one is there). */
typedef enum fp4d_input_kind {
    FP4D_INPUT_GRID = 0,        /* random FP4 codes and block scales: inputs on the FP4 grid */
    FP4D_INPUT_GAUSSIAN,        /* N(0,1) quantized with the default convention */
    FP4D_INPUT_HEAVY_TAILED,    /* Student-t-like with rare 100x outliers */
    FP4D_INPUT_ZERO_BLOCKS,     /* Gaussian with a third of the blocks all zero */
    FP4D_INPUT_ALL_ZERO,        /* the whole A is zero (the output must be zero) */
    FP4D_INPUT_SATURATING,      /* static global scale so large blocks saturate at 448 */
    FP4D_INPUT_UNDERFLOW,       /* tiny blocks whose scales underflow e4m3 */
    FP4D_INPUT_NONFINITE,       /* quantize only: NaN and Inf in the input */
    FP4D_INPUT_COUNT
} fp4d_input_kind;

const char *fp4d_input_kind_name(fp4d_input_kind k);

#define FP4D_CASE_NAME_MAX 96

typedef struct fp4d_case {
    int32_t           index;                    /* position in its suite */
    char              name[FP4D_CASE_NAME_MAX]; /* unique in the suite, e.g. "nvfp4.sw.grid.m48.n256.k256" */
    char              group[32];                /* terminal-matrix column, e.g. "nvfp4", "moe" */
    fp4d_case_op      op;
    int64_t           m, n, k;                  /* grouped: m = total rows; quantize: rows, cols = k;
                                                   stress: rows of one round of one instance */
    fp4d_dtype        a_type, b_type, out_type; /* quantize: a_type = source, b_type = format */
    fp4d_scale_layout a_layout, b_layout;
    fp4d_input_kind   input;
    int32_t           num_experts;              /* grouped only */
    fp4d_convention   convention;               /* quantize only */
    int32_t           threads, rounds;          /* stress only: instances at once, rounds each */
} fp4d_case;

/* The cases of a suite, in a fixed order. *cases is malloc'd: free() it. */
fp4d_status fp4d_suite_cases(fp4d_suite suite, fp4d_case **cases, size_t *count);

/* ---------------------------------------------------------------------------------------
 * One case on one backend, in this process
 * ------------------------------------------------------------------------------------- */

#define FP4D_DETAIL_MAX 512

typedef struct fp4d_case_result {
    fp4d_verdict verdict;
    fp4d_cause   cause;
    char         detail[FP4D_DETAIL_MAX]; /* one line a user can act on ("" for PASS) */
    double       max_err_ratio;  /* max |out - exact| / fp32-accumulation bound over checked
                                    elements; <= 1 is PASS. 0 when not measured. */
    double       max_abs_err;    /* max |out - exact| over checked finite elements */
    double       time_ms;        /* wall time of the backend's first call */
    double       gflops;         /* 2*M*N*K / time, 0 when not a GEMM */
    int64_t      elements_checked; /* compared exactly against the reference */
    int64_t      bad_elements;   /* of those: beyond the practical tolerance */
    int64_t      off_by_one_codes; /* quantize: codes one step from the convention's */
    int32_t      signal;         /* CRASH: the signal number */
    bool         ran;            /* false: not run (e.g. the backend timed out twice) */
} fp4d_case_result;

/* Runs c on an opened backend and judges it (poisoned output, sentinels, a rerun, sampled
 * exact reference, projection check, cause matching). Returns OK with the verdict in *r
 * (UNSUPPORTED and ERROR are verdicts too); non-OK only when the doctor itself failed
 * (out of memory). */
fp4d_status fp4d_doctor_run_case(fp4d_backend_t backend, const fp4d_case *c, uint64_t seed,
                                 fp4d_case_result *r);

/* An output made anywhere (an engine's kernel, dumped to a file) judged against the exact
 * result with check's error model (docs/tolerance.md §2), element by element. */
typedef struct fp4d_output_judgement {
    int64_t elements;
    int64_t beyond_fp32;      /* outside the f32-accumulation bound (INACCURATE or worse) */
    int64_t beyond_practical; /* outside the practical tolerance too (WRONG), NaN mismatches included */
    int64_t nan_mismatch;     /* NaN on one side only; an infinity where the exact value is finite counts
                               * as beyond both bounds */
    int64_t worst;            /* flat index (m * N + n) of the worst element: the first NaN mismatch,
                               * else the largest error / f32 bound; -1 when every element is exact */
    double  worst_got, worst_exact, worst_bound_fp32, worst_bound_practical;
} fp4d_output_judgement;

/* Judges got (p->a.rows x p->b.rows elements of p->out_type, row-major; p->out is not read) against
 * the exact result of p. O(M N K); the exact reference runs on every element. */
fp4d_status fp4d_judge_gemm_output(const fp4d_gemm_problem *p, const void *got, fp4d_output_judgement *r);

/* ---------------------------------------------------------------------------------------
 * The whole check: isolated children, report
 * ------------------------------------------------------------------------------------- */

typedef struct fp4d_backend_report {
    char              name[64];
    char              description[160];
    fp4d_backend_kind kind;
    int               device;         /* -1: host */
    fp4d_verdict      verdict;        /* worst over its cases (UNSUPPORTED if all are) */
    fp4d_cause        cause;          /* of the worst case */
    char              summary[800];   /* one line: the worst case, its cause, which M fail */
    char              unavailable[FP4D_REASON_MAX]; /* why it could not be opened, else "" */
    double            best_gflops;    /* fastest passing GEMM case (for the recommendation) */
    /* --device all: set when this backend's verdicts on this device differ from the same
     * backend's on the other devices (names the cases and verdicts), else "". */
    char              device_note[400];
    fp4d_case_result *results;        /* one per case of the report, in case order */
} fp4d_backend_report;

typedef struct fp4d_report {
    fp4d_suite           suite;
    uint64_t             seed;
    fp4d_case           *cases;
    size_t               num_cases;
    fp4d_backend_report *backends;
    size_t               num_backends;
    char                 recommended[64]; /* "" when nothing passed */
    char                 recommendation[256];
    double               wall_s;
    bool                 case_filtered;   /* only the cases named by case filters ran */
} fp4d_report;

/* Progress callback: called in the parent after each finished case. */
typedef void (*fp4d_progress_fn)(void *user, const char *backend, int device, size_t done,
                                 size_t total);

typedef struct fp4d_doctor_options {
    fp4d_suite        suite;
    uint64_t          seed;
    const char      **backends;      /* names to check; NULL = every registered backend */
    size_t            num_backends;
    int               device;        /* -1 = default device; FP4D_DEVICE_ALL = every GPU */
    bool              include_faulty;
    const char      **plugins;       /* shared libraries, also passed to the children */
    size_t            num_plugins;
    const char       *self_exe;      /* executable to re-run as `__child`; NULL = /proc/self/exe */
    int               jobs;          /* children at once; 0 = number of online CPUs */
    const char      **case_filter;   /* only cases whose name contains one of these; NULL = all */
    size_t            num_case_filters;
    fp4d_progress_fn  progress;
    void             *progress_user;
} fp4d_doctor_options;

/* Whether the options' case filters select c (true when there are none). */
bool fp4d_case_selected(const fp4d_doctor_options *opt, const fp4d_case *c);

#define FP4D_DEVICE_ALL (-2)
#define FP4D_MAX_REPORT_DEVICES 64

/*
 * --device all runs one child per (GPU backend, device). Two environment variables let a
 * single-GPU (or GPU-less) machine exercise that path:
 *   FP4DOCTOR_SIMULATE_DEVICES=N  `all` means N logical devices; logical device d runs on
 *                                 physical device d % (real count) (on the same GPU when
 *                                 there is one).
 *   FP4DOCTOR_FAULTY_DEVICE=D     with --device all, faulty-* backends run once per device
 *                                 and misbehave only on device D (a device-side fault
 *                                 injected into one device's child).
 *   FP4DOCTOR_CHILD_RETIRE_AFTER=N  every child ends itself after N results, as one does
 *                                 when a failed case left its CUDA context lost (a sticky
 *                                 error), and a fresh child runs the remaining cases.
 */

/* Per-case time limits are multiplied by FP4DOCTOR_TIMEOUT_SCALE (a positive number,
 * default 1): raise it on slow or shared machines. */
fp4d_status fp4d_doctor_run(const fp4d_doctor_options *opt, fp4d_report *report);
void        fp4d_report_free(fp4d_report *report);

/* Writes every backend's worst verdict into the verdict cache (unless disabled). A run narrowed
 * by case filters writes only failures: a failure in any case is one of the backend, but a
 * PASS (or UNSUPPORTED) on some cases says nothing of the others, nor does their speed. */
fp4d_status fp4d_report_update_cache(const fp4d_report *report);

/* Exit code of `fp4doctor check` for this report (docs/cli.md): 0 when every checked
 * backend PASSes or is UNSUPPORTED/unavailable, 1 when any fails. */
int fp4d_report_exit_code(const fp4d_report *report);

/* Reports. The JSON schema is docs/json-schema.md (## check); every report embeds the
 * environment (fp4doctor env). */
fp4d_status fp4d_report_write_text(const fp4d_report *report, FILE *f, bool color);
fp4d_status fp4d_report_write_json(const fp4d_report *report, FILE *f);
fp4d_status fp4d_report_write_junit(const fp4d_report *report, FILE *f);
fp4d_status fp4d_report_write_html(const fp4d_report *report, FILE *f);

/* `fp4doctor env`: the environment as text or JSON. */
fp4d_status fp4d_env_write_text(FILE *f);
fp4d_status fp4d_env_write_json(FILE *f);

/* The child side of fp4d_doctor_run (the hidden `__child` subcommand): runs the cases
 * named in argv of one backend and writes one JSON line per event to out_fd. Returns an
 * exit code. Not for direct use. */
int fp4d_doctor_child_main(int argc, char **argv, int out_fd);

#ifdef __cplusplus
}
#endif
#endif
