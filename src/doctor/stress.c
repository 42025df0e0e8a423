/*
 * Stress cases: one batch of GEMMs, or of grouped MoE GEMMs, on several instances of a
 * backend at once.
 *
 * Some FP4 kernels are right on every input and still wrong in production: a missing
 * wait between two kernels, a workspace shared by two streams, a cache keyed on something
 * two callers share. They fail only while other calls run (failures.md #3 and #4: NaN in
 * 128-row output tiles under 64 concurrent requests, clean when the batch is replayed
 * alone), so the cases that run one call at a time cannot see them.
 *
 * A stress case makes one GEMM per M of fp4d_stress_m (a batch of mixed sizes, in and out
 * of the 64- and 128-row tiles and on each of the cuda backend's M paths), runs each one
 * alone twice on the child's instance, and keeps that output. Then it opens `threads`
 * further instances (backend.h: one instance per thread), releases their threads
 * together, and each runs the batch `rounds` times in an order of its own, so that
 * different M run side by side. Every output made beside the others must be the one made
 * alone, bit for bit. One that is not is judged against the exact result: beyond the
 * practical tolerance it is a failure with the cause `concurrency`; within it, the backend
 * is NONDETERMINISTIC under concurrency, as check calls two different runs anywhere.
 *
 * A MoE stress case (num_experts > 0) does the same with grouped GEMMs of fp4d_stress_moe_rows
 * rows in all, routed over the experts as the suite's MoE cases route them: an engine serving
 * many requests runs its MoE layer's grouped GEMM from several streams at once, and the
 * per-expert tile bookkeeping of such kernels (FI PR #3533) is what a race would corrupt.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"
#include "clock.h"
#include "internal.h"
#include "out_elem.h"

/* The batch: one row (decoding), the small-M paths, both sides of 64 and 128 rows, and
 * rows past a second 128-row tile. */
const int64_t fp4d_stress_m[] = {1, 7, 17, 64, 128, 129, 200, 300};
const size_t  fp4d_stress_m_count = sizeof fp4d_stress_m / sizeof fp4d_stress_m[0];

/* The MoE batch, rows over all experts. With the suite's routing over 8 experts (inputs.c,
 * moe_offsets) they give three empty experts, single rows, experts of a few rows (the small-M
 * paths), of 24 and of 65 rows (one past 64), and at 600 rows experts of 54 to 193 rows: past a
 * 128-row tile. */
const int64_t fp4d_stress_moe_rows[] = {1, 9, 70, 200, 600};
const size_t  fp4d_stress_moe_rows_count = sizeof fp4d_stress_moe_rows / sizeof fp4d_stress_moe_rows[0];

/* Outputs that differ from the solo run are copied and judged exactly after the threads
 * end; past this many (a backend wrong everywhere) the rest are only counted. */
#define STRESS_JUDGE_MAX 16

typedef struct stress_gemm {
    fp4d_case                 sub;  /* the plain or grouped case whose data this is (its name seeds it) */
    fp4d_case_data            d;
    bool                      made; /* d holds data to free */
    fp4d_gemm_problem         p;    /* plain (sub.op == FP4D_CASE_GEMM); out is set per call */
    fp4d_grouped_gemm_problem gp;   /* grouped; out is set per call */
    fp4d_matrix              *experts; /* gp.b */
    int64_t                   rows, cols; /* of the output */
    fp4d_dtype                out_type;
    uint8_t                  *solo_raw, *solo; /* the output made alone, framed by sentinels */
    size_t                    bytes;
} stress_gemm;

typedef struct stress_copy {
    size_t   gemm;
    int      worker, round;
    uint8_t *out;
} stress_copy;

typedef struct stress_batch stress_batch;

typedef struct stress_worker {
    stress_batch  *batch;
    fp4d_backend_t b;
    int            index;
    uint8_t      **raw;     /* per GEMM: its output, framed by sentinels */
    uint8_t      **rows;    /* per GEMM: rows that ever differed from the solo output */
    fp4d_status    failed;  /* OK, or the status of the call that failed */
    char           error[300];
    int64_t        outputs, differ, nan_rows, unwritten;
} stress_worker;

struct stress_batch {
    const fp4d_case  *c;
    stress_gemm      *g;
    size_t            ng;
    pthread_mutex_t   lock;    /* guards go, abandon and copies */
    pthread_cond_t    go_cond; /* the threads start together when go is set */
    bool              go, abandon;
    stress_copy       copies[STRESS_JUDGE_MAX];
    size_t            ncopies;
};

static void result_set(fp4d_case_result *r, fp4d_verdict v, fp4d_cause c, const char *fmt, ...)
    FP4D_PRINTF(4, 5);
static void result_set(fp4d_case_result *r, fp4d_verdict v, fp4d_cause c, const char *fmt, ...)
{
    va_list ap;
    r->verdict = v;
    r->cause = c;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
}

static bool stress_grouped(const stress_gemm *g) { return g->sub.op == FP4D_CASE_GROUPED; }

/* One call of the batch's GEMM g into out. */
static fp4d_status stress_call(fp4d_backend_t b, const stress_gemm *g, void *out, fp4d_reason *why)
{
    fp4d_clear_error();
    if (stress_grouped(g)) {
        fp4d_grouped_gemm_problem gp = g->gp;
        gp.out = out;
        return fp4d_backend_grouped_gemm(b, &gp, why);
    }
    fp4d_gemm_problem p = g->p;
    p.out = out;
    return fp4d_backend_gemm(b, &p, why);
}

/* "M = 300" or, for a grouped GEMM, "M = 600 over 8 experts": how messages name g. */
static const char *stress_name(const stress_gemm *g, char *buf, size_t size)
{
    if (stress_grouped(g))
        snprintf(buf, size, "M = %lld over %d experts", (long long)g->rows, (int)g->sub.num_experts);
    else
        snprintf(buf, size, "M = %lld", (long long)g->rows);
    return buf;
}
#define STRESS_NAME(g) stress_name((g), (char[48]){0}, 48)

/* Judges an output of g against the exact result. A grouped output is judged expert by
 * expert (each one's rows against its own weights); the worst element reported is the first
 * expert's NaN mismatch, else the first expert's worst beyond the practical bound, else any. */
static fp4d_status stress_judge(const stress_gemm *g, const uint8_t *out, fp4d_output_judgement *oj)
{
    if (!stress_grouped(g)) return fp4d_judge_gemm_output(&g->p, out, oj);
    memset(oj, 0, sizeof *oj);
    oj->worst = -1;
    const size_t row_bytes = (size_t)g->cols * fp4d_out_elem_size(g->out_type);
    int worst_rank = 0; /* 3: a NaN mismatch, 2: beyond practical, 1: any difference */
    for (int32_t e = 0; e < g->d.num_b; e++) {
        fp4d_gemm_problem p;
        int64_t row0, rows;
        fp4d_case_canon_problem(&g->d, e, &p, &row0, &rows);
        if (rows == 0) continue;
        fp4d_output_judgement one;
        FP4D_FORWARD_IF_ERROR(fp4d_judge_gemm_output(&p, out + (size_t)row0 * row_bytes, &one));
        oj->elements += one.elements;
        oj->beyond_fp32 += one.beyond_fp32;
        oj->beyond_practical += one.beyond_practical;
        oj->nan_mismatch += one.nan_mismatch;
        int rank = one.worst < 0 ? 0 : one.nan_mismatch ? 3 : one.beyond_practical ? 2 : 1;
        if (rank > worst_rank) {
            worst_rank = rank;
            oj->worst = row0 * g->cols + one.worst;
            oj->worst_got = one.worst_got, oj->worst_exact = one.worst_exact;
            oj->worst_bound_fp32 = one.worst_bound_fp32, oj->worst_bound_practical = one.worst_bound_practical;
        }
    }
    return FP4D_STATUS_OK;
}

/* Compares one output made beside the others with the solo one; records what differs. */
static void note_output(stress_worker *w, size_t gi, int round, const uint8_t *out)
{
    stress_batch *sb = w->batch;
    const stress_gemm *g = &sb->g[gi];
    w->outputs++;
    if (memcmp(out, g->solo, g->bytes) == 0) return;
    w->differ++;
    const fp4d_dtype t = g->out_type;
    const int64_t M = g->rows, N = g->cols;
    const size_t row_bytes = (size_t)N * fp4d_out_elem_size(t);
    for (int64_t m = 0; m < M; m++) {
        if (memcmp(out + (size_t)m * row_bytes, g->solo + (size_t)m * row_bytes, row_bytes) == 0) continue;
        w->rows[gi][m] = 1;
        bool row_nan = false;
        for (int64_t i = m * N; i < (m + 1) * N; i++) {
            if (fp4d_is_poison(t, out, i)) w->unwritten++;
            if (isnan(fp4d_out_elem_get(t, out, i)) && !isnan(fp4d_out_elem_get(t, g->solo, i))) row_nan = true;
        }
        w->nan_rows += row_nan;
    }
    pthread_mutex_lock(&sb->lock);
    if (sb->ncopies < STRESS_JUDGE_MAX) {
        uint8_t *copy = malloc(g->bytes);
        if (copy) {
            memcpy(copy, out, g->bytes);
            sb->copies[sb->ncopies++] = (stress_copy){gi, w->index, round, copy};
        }
    }
    pthread_mutex_unlock(&sb->lock);
}

static void *worker_main(void *arg)
{
    stress_worker *w = arg;
    stress_batch *sb = w->batch;
    pthread_mutex_lock(&sb->lock);
    while (!sb->go) pthread_cond_wait(&sb->go_cond, &sb->lock);
    bool abandon = sb->abandon;
    pthread_mutex_unlock(&sb->lock);
    if (abandon) return NULL;
    for (int r = 0; r < sb->c->rounds && w->failed == FP4D_STATUS_OK; r++) {
        for (size_t i = 0; i < sb->ng; i++) {
            /* Each instance walks the batch from its own starting point, odd ones backwards,
             * and the start moves every round: different M run side by side. */
            size_t step = (i + (size_t)w->index * 3 + (size_t)r) % sb->ng;
            size_t gi = w->index % 2 ? sb->ng - 1 - step : step;
            stress_gemm *g = &sb->g[gi];
            uint8_t *out = w->raw[gi] + fp4d_guard_size(g->bytes);
            fp4d_poison_fill(g->out_type, out, g->rows * g->cols);
            fp4d_reason why = {{0}};
            fp4d_status st = stress_call(w->b, g, out, &why);
            if (st != FP4D_STATUS_OK) {
                w->failed = st;
                snprintf(w->error, sizeof w->error, "round %d, %s: %s: %s", r, STRESS_NAME(g),
                         fp4d_status_name(st), why.text[0] ? why.text : fp4d_last_error());
                break;
            }
            int64_t after, before;
            int64_t changed = fp4d_guard_check(w->raw[gi], g->bytes, &after, &before);
            if (changed) {
                /* an overrun of a neighbour's buffer, say; not the case's to diagnose twice */
                w->failed = FP4D_STATUS_INTERNAL;
                snprintf(w->error, sizeof w->error, "round %d, %s: wrote %lld sentinel bytes outside its output",
                         r, STRESS_NAME(g), (long long)changed);
                break;
            }
            note_output(w, gi, r, out);
        }
    }
    return NULL;
}

const int64_t *fp4d_stress_batch(int32_t num_experts, size_t *count)
{
    *count = num_experts > 0 ? fp4d_stress_moe_rows_count : fp4d_stress_m_count;
    return num_experts > 0 ? fp4d_stress_moe_rows : fp4d_stress_m;
}

/* Builds the batch's GEMMs and keeps those the backend supports; *reason says why not
 * when it supports none. */
static fp4d_status make_batch(fp4d_backend_t b, const fp4d_case *c, uint64_t seed, stress_batch *sb,
                              char *reason, size_t reason_size)
{
    size_t count;
    const int64_t *sizes = fp4d_stress_batch(c->num_experts, &count);
    sb->g = calloc(count, sizeof *sb->g);
    FP4D_RETURN_ERROR_IF(!sb->g, NOMEM, "out of memory");
    reason[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        stress_gemm *g = &sb->g[sb->ng];
        g->sub = *c;
        g->sub.op = c->num_experts > 0 ? FP4D_CASE_GROUPED : FP4D_CASE_GEMM;
        g->sub.m = sizes[i];
        g->sub.threads = g->sub.rounds = 0;
        snprintf(g->sub.name, sizeof g->sub.name, "%.80s.m%lld", c->name, (long long)g->sub.m);
        fp4d_status st = fp4d_case_data_make(&g->sub, seed, &g->d);
        if (st != FP4D_STATUS_OK) return st;
        g->made = true;
        g->rows = g->sub.m, g->cols = c->n;
        g->out_type = c->out_type;
        fp4d_gemm_desc desc;
        if (stress_grouped(g)) {
            g->experts = malloc((size_t)g->d.num_b * sizeof *g->experts);
            FP4D_RETURN_ERROR_IF(!g->experts, NOMEM, "out of memory");
            g->gp = fp4d_case_grouped_problem(&g->d, g->experts);
            fp4d_grouped_gemm_describe(&g->gp, &desc);
        } else {
            g->p = fp4d_case_gemm_problem(&g->d);
            fp4d_gemm_describe(&g->p, &desc);
        }
        fp4d_reason why = {{0}};
        if (!fp4d_backend_supports(b, &desc, &why)) {
            if (!reason[0]) snprintf(reason, reason_size, "%s: %s", STRESS_NAME(g), why.text);
            fp4d_case_data_free(&g->d);
            free(g->experts);
            memset(g, 0, sizeof *g);
            continue;
        }
        g->bytes = (size_t)(g->rows * g->cols) * fp4d_out_elem_size(c->out_type);
        g->solo_raw = fp4d_guarded_alloc(g->bytes);
        FP4D_RETURN_ERROR_IF(!g->solo_raw, NOMEM, "out of memory");
        g->solo = g->solo_raw + fp4d_guard_size(g->bytes);
        sb->ng++;
    }
    return FP4D_STATUS_OK;
}

static void free_batch(stress_batch *sb)
{
    size_t count;
    fp4d_stress_batch(sb->c->num_experts, &count);
    for (size_t i = 0; i < count && sb->g; i++) {
        if (sb->g[i].made) fp4d_case_data_free(&sb->g[i].d);
        free(sb->g[i].experts);
        free(sb->g[i].solo_raw);
    }
    free(sb->g);
    for (size_t i = 0; i < sb->ncopies; i++) free(sb->copies[i].out);
}

/* A GEMM of the batch that fails alone: the plain case of that M, judged as every other
 * case is (sentinels, poison, exact samples, cause matching), says how. The failure is
 * the backend's, not concurrency's. */
static fp4d_status explain_alone(fp4d_backend_t b, stress_gemm *g, uint64_t seed, fp4d_verdict seen,
                                 const char *what, fp4d_case_result *r)
{
    fp4d_case_result sub;
    fp4d_status st = fp4d_doctor_run_case(b, &g->sub, seed, &sub);
    if (st != FP4D_STATUS_OK) return st;
    if (sub.verdict == FP4D_VERDICT_PASS) {
        /* right on the second look: say what the batch saw */
        result_set(r, seen, FP4D_CAUSE_UNKNOWN, "alone, %s %s (a second run was right)", STRESS_NAME(g), what);
        return FP4D_STATUS_OK;
    }
    char detail[sizeof r->detail];
    snprintf(detail, sizeof detail, "alone, before any concurrency, %s: %.420s", STRESS_NAME(g), sub.detail);
    *r = sub;
    memcpy(r->detail, detail, sizeof detail);
    return FP4D_STATUS_OK;
}

/* The batch alone, twice, on the child's instance: the outputs the others must equal.
 * *go_on is false when there is nothing to compare with (r then says why). */
static fp4d_status run_alone(fp4d_backend_t b, stress_batch *sb, uint64_t seed, fp4d_case_result *r, bool *go_on)
{
    *go_on = false;
    for (size_t gi = 0; gi < sb->ng; gi++) {
        stress_gemm *g = &sb->g[gi];
        uint8_t *again_raw = fp4d_guarded_alloc(g->bytes);
        FP4D_RETURN_ERROR_IF(!again_raw, NOMEM, "out of memory");
        const size_t guard = fp4d_guard_size(g->bytes);
        fp4d_status call = FP4D_STATUS_OK;
        fp4d_reason why = {{0}};
        int64_t changed = 0, after, before;
        for (int run = 0; run < 2 && call == FP4D_STATUS_OK && !changed; run++) {
            uint8_t *raw = run ? again_raw : g->solo_raw;
            fp4d_poison_fill(g->out_type, raw + guard, g->rows * g->cols);
            call = stress_call(b, g, raw + guard, &why);
            if (call == FP4D_STATUS_OK) changed = fp4d_guard_check(raw, g->bytes, &after, &before);
        }
        bool same = call == FP4D_STATUS_OK && !changed && memcmp(again_raw + guard, g->solo, g->bytes) == 0;
        free(again_raw);
        if (call != FP4D_STATUS_OK) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "alone, %s: the backend returned %s%s%s",
                       STRESS_NAME(g), fp4d_status_name(call), why.text[0] || fp4d_last_error()[0] ? ": " : "",
                       why.text[0] ? why.text : fp4d_last_error());
            return FP4D_STATUS_OK;
        }
        if (changed) return explain_alone(b, g, seed, FP4D_VERDICT_OOB_WRITE, "wrote outside its output", r);
        if (!same) {
            result_set(r, FP4D_VERDICT_NONDETERMINISTIC, FP4D_CAUSE_NONE,
                       "alone, two runs of %s differ: concurrency cannot be judged against a result "
                       "that changes by itself", STRESS_NAME(g));
            return FP4D_STATUS_OK;
        }
    }
    *go_on = true;
    return FP4D_STATUS_OK;
}

/* Judges the solo outputs exactly: a backend already wrong alone is reported as such, not
 * blamed on concurrency. */
static fp4d_status judge_alone(fp4d_backend_t b, stress_batch *sb, uint64_t seed, fp4d_case_result *r, bool *go_on)
{
    *go_on = true;
    for (size_t gi = 0; gi < sb->ng; gi++) {
        stress_gemm *g = &sb->g[gi];
        fp4d_output_judgement oj;
        fp4d_status st = stress_judge(g, g->solo, &oj);
        if (st == FP4D_STATUS_NOMEM) return st;
        if (st != FP4D_STATUS_OK) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "could not judge %s: %s", STRESS_NAME(g),
                       fp4d_last_error());
            *go_on = false;
            return FP4D_STATUS_OK;
        }
        r->elements_checked += oj.elements;
        int64_t unwritten = 0;
        for (int64_t i = 0; i < oj.elements; i++) unwritten += fp4d_is_poison(g->out_type, g->solo, i);
        if (unwritten || oj.beyond_practical) {
            *go_on = false;
            fp4d_verdict v = unwritten ? FP4D_VERDICT_UNWRITTEN : oj.nan_mismatch ? FP4D_VERDICT_NAN : FP4D_VERDICT_WRONG;
            return explain_alone(b, g, seed, v, "is wrong", r);
        }
        if (oj.beyond_fp32 && r->verdict == FP4D_VERDICT_PASS)
            result_set(r, FP4D_VERDICT_INACCURATE, FP4D_CAUSE_NONE,
                       "alone, %s: %lld elements beyond the f32-accumulation bound, within the practical "
                       "tolerance", STRESS_NAME(g), (long long)oj.beyond_fp32);
    }
    return FP4D_STATUS_OK;
}

/* "M = 300: rows 256..299; M = 200: rows 128..199; ..." for the GEMMs whose rows differed
 * (grouped: "M = 600 over 8 experts: rows ... (expert 2 ...)", rows named per expert). */
static void describe_differing_rows(const stress_batch *sb, stress_worker *w, int nw, char *out, size_t size)
{
    static const char more[] = "; ...";
    size_t len = 0, named = 0;
    out[0] = '\0';
    /* largest M first: that is where whole 128-row tiles show */
    for (size_t gi = sb->ng; gi-- > 0;) {
        const stress_gemm *g = &sb->g[gi];
        const int64_t M = g->rows;
        uint8_t *flag = calloc((size_t)(M ? M : 1), 1);
        if (!flag) return;
        bool any = false;
        for (int t = 0; t < nw; t++)
            for (int64_t m = 0; m < M; m++)
                if (w[t].rows[gi][m]) flag[m] = 1, any = true;
        char rows[200], entry[300];
        if (any) {
            bool grouped = stress_grouped(g) && g->d.num_b > 1;
            fp4d_describe_rows(flag, M, grouped ? g->d.offsets : NULL, grouped ? g->d.num_b : 0, rows, sizeof rows);
            snprintf(entry, sizeof entry, "%s%s: rows %s", named ? "; " : "", STRESS_NAME(g), rows);
        }
        free(flag);
        if (!any) continue;
        /* whole entries only, and room kept for saying there are more */
        if (named == 3 || len + strlen(entry) + sizeof more > size) {
            if (named && len + sizeof more <= size) memcpy(out + len, more, sizeof more);
            return;
        }
        memcpy(out + len, entry, strlen(entry) + 1);
        len += strlen(entry);
        named++;
    }
}

/* After the threads: the verdict from what they saw. */
static fp4d_status judge_together(stress_batch *sb, stress_worker *w, int nw, fp4d_case_result *r)
{
    int64_t outputs = 0, differ = 0, nan_rows = 0, unwritten = 0;
    for (int t = 0; t < nw; t++) {
        outputs += w[t].outputs, differ += w[t].differ, nan_rows += w[t].nan_rows, unwritten += w[t].unwritten;
        if (w[t].failed != FP4D_STATUS_OK) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_CONCURRENCY,
                       "with %d instances at once, instance %d failed a call that passes alone (%s)", nw, t + 1,
                       w[t].error);
            return FP4D_STATUS_OK;
        }
    }
    if (differ == 0) return FP4D_STATUS_OK;

    /* The copies, judged exactly: which differences are wrong and which only rounding. */
    int64_t judged_wrong = 0, judged_within = 0;
    char first[200] = "";
    for (size_t i = 0; i < sb->ncopies; i++) {
        const stress_copy *cp = &sb->copies[i];
        const stress_gemm *g = &sb->g[cp->gemm];
        fp4d_output_judgement oj;
        fp4d_status st = stress_judge(g, cp->out, &oj);
        if (st == FP4D_STATUS_NOMEM) return st;
        if (st != FP4D_STATUS_OK) continue;
        if (oj.beyond_practical == 0) {
            judged_within++;
            continue;
        }
        if (judged_wrong++ == 0 && oj.worst >= 0) {
            const int64_t N = g->cols;
            snprintf(first, sizeof first, "; first: instance %d, round %d, %s, [%lld, %lld] = %g where alone %g",
                     cp->worker + 1, cp->round + 1, STRESS_NAME(g), (long long)(oj.worst / N),
                     (long long)(oj.worst % N), oj.worst_got,
                     (double)fp4d_out_elem_get(g->out_type, g->solo, oj.worst));
        }
    }
    char rows[320];
    describe_differing_rows(sb, w, nw, rows, sizeof rows);
    fp4d_verdict v = unwritten ? FP4D_VERDICT_UNWRITTEN
                     : nan_rows ? FP4D_VERDICT_NAN
                     : judged_wrong ? FP4D_VERDICT_WRONG
                                    : FP4D_VERDICT_NONDETERMINISTIC;
    if (v == FP4D_VERDICT_NONDETERMINISTIC) {
        result_set(r, v, FP4D_CAUSE_CONCURRENCY,
                   "with %d instances at once, %lld of %lld outputs differ in some bit from the same call made alone, "
                   "all %lld judged within the practical tolerance (the result depends on what runs beside it): %s",
                   nw, (long long)differ, (long long)outputs, (long long)judged_within, rows);
        return FP4D_STATUS_OK;
    }
    char what[96] = "";
    if (unwritten) snprintf(what, sizeof what, ", %lld elements never written", (long long)unwritten);
    else if (nan_rows) snprintf(what, sizeof what, ", NaN in %lld rows", (long long)nan_rows);
    result_set(r, v, FP4D_CAUSE_CONCURRENCY,
               "right alone, wrong with %d instances at once: %lld of %lld outputs differ from the same call made "
               "alone%s; %s%s",
               nw, (long long)differ, (long long)outputs, what, rows, first);
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_run_stress_case(fp4d_backend_t b, const fp4d_case *c, uint64_t seed, fp4d_case_result *r)
{
    FP4D_RETURN_ERROR_IF(!b || !c || !r || c->op != FP4D_CASE_STRESS || c->threads < 1 || c->rounds < 1,
                         INVALID_ARG, "not a stress case");
    stress_batch sb = {.c = c};
    char reason[FP4D_REASON_MAX];
    fp4d_status st = make_batch(b, c, seed, &sb, reason, sizeof reason);
    if (st == FP4D_STATUS_NOMEM) {
        free_batch(&sb);
        return st;
    }
    if (st != FP4D_STATUS_OK) {
        result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "could not build the inputs: %s", fp4d_last_error());
        free_batch(&sb);
        return FP4D_STATUS_OK;
    }
    if (sb.ng == 0) {
        result_set(r, FP4D_VERDICT_UNSUPPORTED, FP4D_CAUSE_NONE, "%s", reason);
        free_batch(&sb);
        return FP4D_STATUS_OK;
    }

    const int nw = c->threads;
    stress_worker *w = calloc((size_t)nw, sizeof *w);
    bool ok = w != NULL;
    for (int t = 0; ok && t < nw; t++) {
        w[t].batch = &sb;
        w[t].index = t;
        w[t].raw = calloc(sb.ng, sizeof *w[t].raw);
        w[t].rows = calloc(sb.ng, sizeof *w[t].rows);
        ok = w[t].raw && w[t].rows;
        for (size_t gi = 0; ok && gi < sb.ng; gi++)
            ok = (w[t].rows[gi] = calloc((size_t)(sb.g[gi].rows ? sb.g[gi].rows : 1), 1)) != NULL &&
                 (w[t].raw[gi] = fp4d_guarded_alloc(sb.g[gi].bytes)) != NULL;
    }
    if (!ok) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        goto done;
    }

    fp4d_doctor_call_hook_fire(); /* "call": the backend's time limit starts */
    bool go_on = false;
    int opened = 0, started = 0;
    st = run_alone(b, &sb, seed, r, &go_on);
    bool sync_made = false;
    if (go_on) {
        const fp4d_backend_iface *bi = fp4d_backend_iface_of(b);
        for (; opened < nw; opened++) {
            fp4d_reason why = {{0}};
            if (fp4d_backend_open(bi->name, fp4d_backend_device(b), &w[opened].b, &why) != FP4D_STATUS_OK) {
                result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE,
                           "could not open instance %d of %d (backend.h allows one per thread): %s", opened + 1, nw,
                           why.text[0] ? why.text : fp4d_last_error());
                go_on = false;
                break;
            }
        }
    }
    if (go_on) {
        sync_made = pthread_mutex_init(&sb.lock, NULL) == 0;
        if (sync_made && pthread_cond_init(&sb.go_cond, NULL) != 0) {
            pthread_mutex_destroy(&sb.lock);
            sync_made = false;
        }
        if (!sync_made) {
            result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "could not make the threads' start gate");
            go_on = false;
        }
    }
    pthread_t *tid = go_on ? calloc((size_t)nw, sizeof *tid) : NULL;
    if (go_on && !tid) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        go_on = false;
    }
    for (; go_on && started < nw; started++)
        if (pthread_create(&tid[started], NULL, worker_main, &w[started]) != 0) break;
    if (go_on && started < nw) {
        result_set(r, FP4D_VERDICT_ERROR, FP4D_CAUSE_NONE, "could not start thread %d of %d", started + 1, nw);
        go_on = false;
    }
    double t0 = fp4d_now_s();
    if (sync_made) {
        /* all threads are there (or some could not start: then those that did leave) */
        pthread_mutex_lock(&sb.lock);
        sb.go = true;
        sb.abandon = !go_on;
        pthread_cond_broadcast(&sb.go_cond);
        pthread_mutex_unlock(&sb.lock);
    }
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    double dt = fp4d_now_s() - t0;
    fp4d_doctor_call_hook_fire(); /* "called": judging */
    if (go_on) {
        r->time_ms = dt * 1e3;
        double flops = 0;
        for (int t = 0; t < nw; t++)
            for (size_t gi = 0; gi < sb.ng; gi++)
                flops += 2.0 * (double)sb.g[gi].rows * (double)sb.g[gi].cols * (double)c->k;
        if (dt > 0) r->gflops = flops * c->rounds / dt * 1e-9;
    }
    if (go_on) {
        st = judge_alone(b, &sb, seed, r, &go_on);
        if (st == FP4D_STATUS_OK && go_on) {
            fp4d_case_result alone = *r;
            st = judge_together(&sb, w, nw, r);
            /* an INACCURATE solo result stands when concurrency changed nothing */
            if (st == FP4D_STATUS_OK && r->verdict == FP4D_VERDICT_PASS) *r = alone;
        }
    }
    free(tid);
    if (sync_made) {
        pthread_cond_destroy(&sb.go_cond);
        pthread_mutex_destroy(&sb.lock);
    }
    for (int t = 0; t < opened; t++) fp4d_backend_close(w[t].b);
done:
    for (int t = 0; w && t < nw; t++) {
        for (size_t gi = 0; gi < sb.ng; gi++) {
            if (w[t].rows) free(w[t].rows[gi]);
            if (w[t].raw) free(w[t].raw[gi]);
        }
        free(w[t].rows);
        free(w[t].raw);
    }
    free(w);
    free_batch(&sb);
    return st;
}
