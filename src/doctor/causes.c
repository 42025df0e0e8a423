/*
 * Cause matching: when a backend is wrong, recompute the sampled elements under each known
 * mistake (DESIGN.md §5) and report the mistake whose result the backend reproduces.
 *
 * A hypothesis is a mistake on A, on B or on both (decoding: scale layout, nibble order,
 * scale codec, block size, transposed B), a different alpha (global scale inverted or
 * missing, for both operands or one), or a lower-precision accumulation. It matches an
 * element when the backend's value lies within the f32-accumulation bound of the
 * hypothesis' value. It explains the failure when it matches at least 90% of the samples
 * AND differs visibly from the truth on a quarter of them (a hypothesis that changes
 * nothing on this data explains nothing).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"

typedef enum accum_mode { ACC_EXACT = 0, ACC_BF16, ACC_F16, ACC_BF16_BLOCKS } accum_mode;

typedef enum alpha_mode {
    ALPHA_AS_GIVEN = 0,
    ALPHA_INVERTED,     /* 1/alpha: both encode scales used as decode scales */
    ALPHA_INVERTED_A,   /* A's encode scale where its decode scale belongs */
    ALPHA_INVERTED_B,
    ALPHA_ONE,          /* alpha never applied */
    ALPHA_MISSING_A,    /* A's per-tensor scale dropped */
    ALPHA_MISSING_B
} alpha_mode;

typedef struct hypothesis {
    fp4d_cause   cause;
    const char  *which;  /* "A and B", "B", ... for the explanation */
    fp4d_mistake a, b;
    alpha_mode   alpha;
    accum_mode   acc;
    int64_t      tile;   /* ACC_BF16_BLOCKS: elements summed in f32 before each bf16 add */
} hypothesis;

static const char *const advice[FP4D_CAUSE_COUNT] = {
    [FP4D_CAUSE_SCALE_LAYOUT_LINEAR] =
        "the kernel reads the 128x4-swizzled block scales as linear (row-major): swizzle "
        "nothing, or tell the kernel the layout",
    [FP4D_CAUSE_SCALE_LAYOUT_SWIZZLED] =
        "the kernel reads linear (checkpoint-order) block scales as 128x4-swizzled: swizzle "
        "the scales before the call",
    [FP4D_CAUSE_NIBBLE_SWAP] =
        "the two FP4 codes of each byte are swapped: element 2j belongs in the LOW nibble",
    [FP4D_CAUSE_GLOBAL_SCALE_INVERTED] =
        "the per-tensor encode scale (2688/amax) is used where the decode scale (amax/2688) "
        "belongs: pass alpha = input_scale * weight_scale_2, or invert the global scale",
    [FP4D_CAUSE_GLOBAL_SCALE_MISSING] =
        "the per-tensor scale (alpha) is not applied: multiply by alpha = scale_2(A) * "
        "scale_2(B) in the epilogue",
    [FP4D_CAUSE_SCALE_DECODED_AS_UE8M0] =
        "NVFP4 e4m3 block scales are decoded as MX ue8m0 (2^(b-127)): select the "
        "VEC16_UE4M3 scale mode, not VEC32_UE8M0",
    [FP4D_CAUSE_BLOCK_SIZE_32] =
        "NVFP4 data is read with 32-element blocks: NVFP4 has one scale per 16 elements",
    [FP4D_CAUSE_B_TRANSPOSED] =
        "B is read as [K, N] instead of [N, K] (K-contiguous): fix the transpose flag / layout",
    [FP4D_CAUSE_TILE_ROWS_MISSING] =
        "whole rows of the output tiles are never written: the kernel's row-tile count or "
        "bound is wrong for this M",
    [FP4D_CAUSE_M_DEPENDENT] =
        "the result depends on M (the number of tokens): a tile/tactic chosen for some M is "
        "broken; pin a tactic that passes, or use another backend",
    [FP4D_CAUSE_LOW_PRECISION_ACCUMULATION] =
        "the error matches accumulation in bf16/fp16: accumulate in f32",
    [FP4D_CAUSE_UNKNOWN] = "no known mistake reproduces this output",
    [FP4D_CAUSE_CONCURRENCY] =
        "right when called alone, wrong while other instances run: a race or a missing wait "
        "between kernels (FI #2708: PDL without griddepcontrol.wait), or state the instances "
        "share (a workspace, a cache); do not run this backend from several streams or threads",
};

const char *fp4d_cause_advice(fp4d_cause c)
{
    return (unsigned)c < FP4D_CAUSE_COUNT && advice[c] ? advice[c] : "";
}

#define MAX_HYPOTHESES 40

static int add(hypothesis *h, int n, fp4d_cause cause, const char *which, fp4d_mistake a,
               fp4d_mistake b, alpha_mode alpha, accum_mode acc)
{
    if (n >= MAX_HYPOTHESES) return n;
    h[n].cause = cause, h[n].which = which, h[n].a = a, h[n].b = b, h[n].alpha = alpha, h[n].acc = acc;
    h[n].tile = 16;
    return n + 1;
}

/* The three placements of one operand mistake: both operands first (the usual bug is in a
 * shared decode path), then B only, then A only. */
static int add_both(hypothesis *h, int n, fp4d_cause cause, fp4d_mistake mk, bool a_ok, bool b_ok)
{
    fp4d_mistake none = {0};
    if (a_ok && b_ok) n = add(h, n, cause, "A and B", mk, mk, ALPHA_AS_GIVEN, ACC_EXACT);
    if (b_ok) n = add(h, n, cause, "B (weights)", none, mk, ALPHA_AS_GIVEN, ACC_EXACT);
    if (a_ok) n = add(h, n, cause, "A (activations)", mk, none, ALPHA_AS_GIVEN, ACC_EXACT);
    return n;
}

static int build_hypotheses(const fp4d_case_data *d, hypothesis *h)
{
    const fp4d_case *c = d->c;
    const fp4d_dtype_traits *ta = fp4d_dtype_get(c->a_type), *tb = fp4d_dtype_get(c->b_type);
    bool a_fp4 = ta && ta->is_block_fp4, b_fp4 = tb && tb->is_block_fp4;
    bool a_nv = c->a_type == FP4D_DTYPE_NVFP4, b_nv = c->b_type == FP4D_DTYPE_NVFP4;
    fp4d_mistake none = {0}, mk;
    int n = 0;
    /* Layout: the cause names the layout the kernel wrongly assumed. */
    mk = none, mk.misread_layout = true;
    if (b_fp4) {
        fp4d_cause lc = c->b_layout == FP4D_LAYOUT_LINEAR ? FP4D_CAUSE_SCALE_LAYOUT_SWIZZLED
                                                          : FP4D_CAUSE_SCALE_LAYOUT_LINEAR;
        n = add_both(h, n, lc, mk, a_fp4 && c->a_layout == c->b_layout, true);
    }
    if (a_fp4 && c->a_layout != c->b_layout) {
        fp4d_cause lc = c->a_layout == FP4D_LAYOUT_LINEAR ? FP4D_CAUSE_SCALE_LAYOUT_SWIZZLED
                                                          : FP4D_CAUSE_SCALE_LAYOUT_LINEAR;
        n = add_both(h, n, lc, mk, true, false);
    }
    mk = none, mk.nibble_swap = true;
    n = add_both(h, n, FP4D_CAUSE_NIBBLE_SWAP, mk, a_fp4, b_fp4);
    mk = none, mk.ue8m0_scales = true;
    n = add_both(h, n, FP4D_CAUSE_SCALE_DECODED_AS_UE8M0, mk, a_nv, b_nv);
    mk = none, mk.block32 = true;
    if (c->k % 32 == 0) n = add_both(h, n, FP4D_CAUSE_BLOCK_SIZE_32, mk, a_nv, b_nv);
    /* The same mistake in a kernel whose host code passes the true K/16 scale stride. */
    mk.block32_stride16 = true;
    n = add_both(h, n, FP4D_CAUSE_BLOCK_SIZE_32, mk, a_nv, b_nv);
    mk = none, mk.transposed = true;
    n = add(h, n, FP4D_CAUSE_B_TRANSPOSED, "B", none, mk, ALPHA_AS_GIVEN, ACC_EXACT);
    mk.transposed_codes_only = true;
    n = add(h, n, FP4D_CAUSE_B_TRANSPOSED, "B (codes; scales read in place)", none, mk, ALPHA_AS_GIVEN, ACC_EXACT);
    bool alpha_not_one = false;
    for (int32_t e = 0; e < d->num_b; e++) alpha_not_one |= d->alpha[e] != 1.0f;
    if (alpha_not_one) {
        n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_INVERTED, "A and B", none, none, ALPHA_INVERTED, ACC_EXACT);
        if (a_nv && d->a.decode_scale != 1.0)
            n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_INVERTED, "A (activations)", none, none, ALPHA_INVERTED_A, ACC_EXACT);
        if (b_nv)
            n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_INVERTED, "B (weights)", none, none, ALPHA_INVERTED_B, ACC_EXACT);
        n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_MISSING, "A and B", none, none, ALPHA_ONE, ACC_EXACT);
        if (a_nv && d->a.decode_scale != 1.0)
            n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_MISSING, "A (activations)", none, none, ALPHA_MISSING_A, ACC_EXACT);
        if (b_nv)
            n = add(h, n, FP4D_CAUSE_GLOBAL_SCALE_MISSING, "B (weights)", none, none, ALPHA_MISSING_B, ACC_EXACT);
    }
    n = add(h, n, FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, "bf16 accumulator", none, none, ALPHA_AS_GIVEN, ACC_BF16);
    n = add(h, n, FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, "fp16 accumulator", none, none, ALPHA_AS_GIVEN, ACC_F16);
    n = add(h, n, FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, "bf16 partial sums per block", none, none, ALPHA_AS_GIVEN, ACC_BF16_BLOCKS);
    /* The usual form of this bug in a tiled kernel: the MMA sums one K tile in f32 and the
     * bf16 accumulator takes the tile sums (a Triton kernel with a bf16 `acc`). Without
     * these, such a kernel was WRONG with cause "unknown". Only with at least 4 tiles: with
     * fewer, the hypothesis is (close to) one extra bf16 rounding of the f32 sum, which is
     * what a correct kernel that applies alpha after the conversion (torchao) produces. */
    static const int64_t tiles[] = {64, 128, 256};
    static const char *const tile_names[] = {"bf16 accumulator of f32 sums per 64-element K tile",
                                             "bf16 accumulator of f32 sums per 128-element K tile",
                                             "bf16 accumulator of f32 sums per 256-element K tile"};
    for (int t = 0; t < 3; t++) {
        if (c->k < 4 * tiles[t]) break;
        int m = add(h, n, FP4D_CAUSE_LOW_PRECISION_ACCUMULATION, tile_names[t], none, none, ALPHA_AS_GIVEN,
                    ACC_BF16_BLOCKS);
        if (m > n) h[n].tile = tiles[t];
        n = m;
    }
    return n;
}

static double hyp_alpha(const fp4d_case_data *d, int32_t e, alpha_mode m)
{
    double alpha = d->alpha[e], ga = d->a.decode_scale, gb = d->b[e].decode_scale;
    switch (m) {
    case ALPHA_INVERTED:   return 1.0 / alpha;
    case ALPHA_INVERTED_A: return alpha / (ga * ga);
    case ALPHA_INVERTED_B: return alpha / (gb * gb);
    case ALPHA_ONE:        return 1.0;
    case ALPHA_MISSING_A:  return alpha / ga;
    case ALPHA_MISSING_B:  return alpha / gb;
    default:               return alpha;
    }
}

static float round_acc(accum_mode m, float x)
{
    if (m == ACC_F16) return fp4d_f16_to_f32(fp4d_f16_from_f32(x));
    return fp4d_bf16_to_f32(fp4d_bf16_from_f32(x));
}

/* The hypothesis' value of one element (in the output type, as double), and its S. */
static double hyp_value(const fp4d_case_data *d, const hypothesis *h, const double *ra,
                        const double *rb, int32_t e, double *s_out)
{
    int64_t K = d->c->k;
    double alpha = hyp_alpha(d, e, h->alpha), s = 0.0, v;
    for (int64_t k = 0; k < K; k++) s += fabs(ra[k] * rb[k]);
    if (h->acc == ACC_EXACT) {
        v = 0.0;
        for (int64_t k = 0; k < K; k++) v += ra[k] * rb[k];
        v *= alpha;
    } else {
        /* Sequential accumulation in k order, rounded after every add (or after every
         * block of h->tile elements for ACC_BF16_BLOCKS, whose partial sums are f32). */
        float acc = 0.0f, part = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float prod = (float)(ra[k] * rb[k]);
            if (h->acc == ACC_BF16_BLOCKS) {
                part += prod;
                if ((k + 1) % h->tile == 0 || k + 1 == K) {
                    acc = round_acc(ACC_BF16, acc + part);
                    part = 0.0f;
                }
            } else {
                acc = round_acc(h->acc, acc + prod);
            }
        }
        v = (double)((float)alpha * acc);
    }
    *s_out = s * fabs(alpha);
    return fp4d_out_round(d->c->out_type, v);
}

fp4d_cause fp4d_match_cause(const fp4d_case_data *d, const fp4d_sample *samples, size_t count,
                            char *why, size_t why_size)
{
    why[0] = '\0';
    if (count == 0 || d->c->op == FP4D_CASE_QUANTIZE) return FP4D_CAUSE_UNKNOWN;
    hypothesis hyps[MAX_HYPOTHESES];
    int nh = build_hypotheses(d, hyps);
    int64_t K = d->c->k;
    double *ra = malloc((size_t)K * sizeof *ra), *rb = malloc((size_t)K * sizeof *rb);
    if (!ra || !rb) {
        free(ra), free(rb);
        return FP4D_CAUSE_UNKNOWN;
    }
    fp4d_tolerance tol = fp4d_tolerance_for(K, d->c->out_type);
    int best = -1;
    size_t best_match = 0;
    for (int hi = 0; hi < nh; hi++) {
        const hypothesis *h = &hyps[hi];
        size_t match = 0, differs = 0;
        for (size_t i = 0; i < count; i++) {
            const fp4d_sample *s = &samples[i];
            int32_t e = fp4d_case_expert_of_row(d, s->m);
            fp4d_operand_decode_row(&d->a, s->m, &h->a, ra);
            fp4d_operand_decode_row(&d->b[e], s->n, &h->b, rb);
            double sh;
            double hv = hyp_value(d, h, ra, rb, e, &sh);
            bool ok;
            if (isnan(hv) || isnan(s->y)) ok = isnan(hv) && isnan(s->y);
            else if (isinf(hv) || isinf(s->y)) ok = hv == s->y;
            else ok = fabs(s->y - hv) <= fp4d_bound_fp32(&tol, hv, sh) + tol.u_out * fabs(hv);
            if (ok) match++;
            /* "Differs" at the resolution of the match above (the f32 bound plus half an
             * ulp of the output): a hypothesis within one output ulp of the truth cannot
             * be told apart from a mere output-rounding error (bf16 by truncation would
             * otherwise "match" fp16 accumulation on bf16 outputs). */
            if (!(fabs(hv - s->exact) <= fp4d_bound_fp32(&tol, s->exact, s->s) + tol.u_out * fabs(s->exact)))
                differs++;
            /* Give up early once 10% of the samples disagree. */
            if ((i + 1 - match) * 10 > count) break;
        }
        if (match * 10 >= count * 9 && differs * 4 >= count && match > best_match) {
            best = hi;
            best_match = match;
        }
    }
    free(ra);
    free(rb);
    if (best < 0) return FP4D_CAUSE_UNKNOWN;
    const hypothesis *h = &hyps[best];
    const char *which = h->which;
    /* Both codes of a byte share one block scale, so swapping the nibbles of A alone or of
     * B alone gives the same products when both are FP4: do not name an operand we cannot
     * tell apart (the W4A16 cases can). */
    const fp4d_dtype_traits *ta = fp4d_dtype_get(d->c->a_type), *tb = fp4d_dtype_get(d->c->b_type);
    if (h->cause == FP4D_CAUSE_NIBBLE_SWAP && ta && tb && ta->is_block_fp4 && tb->is_block_fp4 &&
        (h->a.nibble_swap != h->b.nibble_swap))
        which = "A or B (one of them; the two give identical products when both are FP4)";
    snprintf(why, why_size, "output matches the reference recomputed with this mistake on %s "
             "(%zu/%zu samples): %s", which, best_match, count, fp4d_cause_advice(h->cause));
    return h->cause;
}

void fp4d_describe_rows(const uint8_t *flag, int64_t m, const int64_t *offsets, int32_t num_experts, char *out,
                        size_t size)
{
    int32_t groups = offsets && num_experts > 1 ? num_experts : 1;
    int len = 0, ranges = 0;
    out[0] = '\0';
    for (int32_t e = 0; e < groups; e++) {
        int64_t r0 = groups > 1 ? offsets[e] : 0, r1 = groups > 1 ? offsets[e + 1] : m;
        bool named = false;
        for (int64_t r = r0; r < r1;) {
            if (!flag[r]) {
                r++;
                continue;
            }
            int64_t s = r;
            while (r < r1 && flag[r]) r++;
            if (len < 0 || (size_t)len >= size) return;
            if (ranges == 6) {
                snprintf(out + len, size - (size_t)len, ", ...");
                return;
            }
            if (groups > 1 && !named)
                len += snprintf(out + len, size - (size_t)len, "%sexpert %d: ", ranges ? "; " : "", (int)e);
            else if (ranges)
                len += snprintf(out + len, size - (size_t)len, ", ");
            if (len < 0 || (size_t)len >= size) return;
            len += snprintf(out + len, size - (size_t)len, "%lld..%lld", (long long)(s - r0), (long long)(r - 1 - r0));
            named = true;
            ranges++;
        }
        if (groups > 1 && named && len >= 0 && (size_t)len < size)
            len += snprintf(out + len, size - (size_t)len, " (of %lld)", (long long)(r1 - r0));
    }
}

fp4d_cause fp4d_match_unwritten(const int64_t *poison_per_row, int64_t m, int64_t n, const int64_t *offsets,
                                int32_t num_experts, char *why, size_t why_size)
{
    int64_t full = 0, partial = 0;
    for (int64_t r = 0; r < m; r++) {
        if (poison_per_row[r] == n) full++;
        else if (poison_per_row[r] > 0) partial++;
    }
    why[0] = '\0';
    if (full == m) {
        snprintf(why, why_size, "not one element was written (did the kernel run at all?)");
        return FP4D_CAUSE_UNKNOWN;
    }
    if (full == 0 || partial > 0) {
        snprintf(why, why_size, "%lld rows partly unwritten, %lld rows entirely", (long long)partial,
                 (long long)full);
        return FP4D_CAUSE_UNKNOWN;
    }
    uint8_t *flag = malloc((size_t)m);
    char rows[FP4D_DETAIL_MAX];
    if (flag) {
        for (int64_t r = 0; r < m; r++) flag[r] = poison_per_row[r] == n;
        fp4d_describe_rows(flag, m, offsets, num_experts, rows, sizeof rows);
        free(flag);
    } else {
        snprintf(rows, sizeof rows, "%lld", (long long)full);
    }
    if (offsets && num_experts > 1)
        snprintf(why, why_size, "whole rows, numbered within each expert, %s: %s", rows,
                 fp4d_cause_advice(FP4D_CAUSE_TILE_ROWS_MISSING));
    else
        snprintf(why, why_size, "whole rows %s (of %lld): %s", rows, (long long)m,
                 fp4d_cause_advice(FP4D_CAUSE_TILE_ROWS_MISSING));
    return FP4D_CAUSE_TILE_ROWS_MISSING;
}
