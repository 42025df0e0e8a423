/*
 * The faulty backends: deliberately broken GEMMs, each reproducing one failure class that
 * people hit in production (shared/research/failures.md §1.1 and §1.3), so that the doctor
 * can be shown to diagnose it. Registered only with --include-faulty or
 * FP4DOCTOR_INCLUDE_FAULTY=1, never chosen by `auto`.
 *
 * All of them run the CPU engine (correct and fast) with one twist: how an operand is read
 * (scale layout, nibble order, scale decoding), what alpha is, how the sum is accumulated,
 * or what happens to the output afterwards. Every fault is deterministic, except that
 * faulty-racy alternates between a correct and a perturbed result on repeated calls, and
 * faulty-concurrent is wrong exactly when its calls overlap another's.
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_internal.h"
#include "backend/cpu/cpu_internal.h"
#include "internal.h"
#include "out_elem.h"

typedef enum faulty_kind {
    FAULTY_ZEROS,
    FAULTY_M_WINDOW,
    FAULTY_TILE_ROWS,
    FAULTY_NAN_TILE,
    FAULTY_LINEAR_SCALES,
    FAULTY_NIBBLE_SWAP,
    FAULTY_GLOBAL_INVERTED,
    FAULTY_UE8M0,
    FAULTY_BF16_ACCUM,
    FAULTY_RACY,
    FAULTY_CONCURRENT,
    FAULTY_OOB,
    FAULTY_SEGV,
    FAULTY_HANG,
    FAULTY_COUNT,
    /* Not a backend: the kind an instance takes when FP4DOCTOR_FAULTY_DEVICE pins the fault
     * to another device (doctor.h): it then computes correctly. */
    FAULTY_DORMANT
} faulty_kind;

/* The windows and tiles the table in issue 3 (docs/backends.md) promises. */
enum {
    M_WINDOW_LO = 32, M_WINDOW_HI = 1536,   /* FI #3398: zeros for M = 32..1536 */
    TILE_ROWS   = 128, TILE_ROWS_LOST = 64, /* FI PR #3533: rows 64..127 of each tile */
    NAN_TILE    = 128,                      /* FI #2708: a 128x128 output tile */
    SEGV_MIN_K  = 4096,
    HANG_N_MOD  = 256
};

typedef struct faulty_ctx {
    faulty_kind   kind;
    faulty_kind   origin; /* the backend's own kind, also when the instance is dormant */
    fp4d_cpu_isa  isa;
    int           threads;
    unsigned long calls; /* gemm calls on this instance (faulty-racy) */
} faulty_ctx;

static fp4d_status faulty_init(void *user_data, int device, void **ctx, fp4d_reason *why)
{
    const char *pin = getenv("FP4DOCTOR_FAULTY_DEVICE");
    /* digits only (fp4d_env_digits): a typo must not pin the fault to some device */
    int pinned = pin && *pin ? (int)fp4d_env_digits(pin, 1000000) : -1;
    if (pin && *pin && pinned < 0) {
        snprintf(why->text, sizeof why->text,
                 "FP4DOCTOR_FAULTY_DEVICE='%.40s' is not a device number (a non-negative integer)", pin);
        return FP4D_STATUS_INVALID_ARG;
    }
    faulty_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(why->text, sizeof why->text, "out of memory");
        return FP4D_STATUS_NOMEM;
    }
    c->kind    = (faulty_kind)(intptr_t)user_data;
    c->origin  = c->kind;
    if (pinned >= 0 && device >= 0 && pinned != device) c->kind = FAULTY_DORMANT;
    c->isa     = fp4d_cpu_isa_detect();
    c->threads = fp4d_cpu_default_threads();
    *ctx       = c;
    return FP4D_STATUS_OK;
}

static void faulty_free(void *ctx) { free(ctx); }

static bool faulty_supports(void *ctx, const fp4d_gemm_desc *d, fp4d_reason *why)
{
    const faulty_ctx *c = ctx;
    if (d->num_experts > 0 && c->origin != FAULTY_TILE_ROWS && c->origin != FAULTY_CONCURRENT) {
        snprintf(why->text, sizeof why->text, "this faulty backend reproduces a plain-GEMM failure only");
        return false;
    }
    return fp4d_host_backend_supports(d, why);
}

/* ---- twists ------------------------------------------------------------------------------ */

static void read_layout_flipped(fp4d_cpu_operand *op)
{
    if (op->dtype != FP4D_DTYPE_NVFP4 && op->dtype != FP4D_DTYPE_MXFP4) return;
    /* Swizzled buffers are read as if they were linear and linear ones as if they were
     * 128x4-swizzled (the mismatch between checkpoint layout and kernel layout). */
    op->read_layout = op->read_layout == FP4D_LAYOUT_LINEAR ? FP4D_LAYOUT_SWIZZLED_128X4 : FP4D_LAYOUT_LINEAR;
}

static void scales_as_ue8m0(fp4d_cpu_operand *op)
{
    if (op->dtype != FP4D_DTYPE_NVFP4) return; /* MXFP4 scales are ue8m0 anyway */
    for (int b = 0; b < 256; b++) {
        op->scale_lut[b]      = fp4d_ue8m0_to_f32((uint8_t)b);
        op->scale_half_lut[b] = op->scale_lut[b] * 0.5f;
    }
}

/* faulty-concurrent: calls in this process now, and calls ever begun. A call that sees
 * another in flight when it starts, or a later one begun before it ends, overlapped: its
 * instances share one workspace (as kernels share stale global memory when the next one
 * starts before the last wrote it, FI #2708), and it gets NaN in its last 128-row output
 * tile. Alone it is right. */
static atomic_int   concurrent_in_flight;
static atomic_ulong concurrent_begun;

typedef struct concurrent_call {
    unsigned long begun;
    bool          overlapped;
} concurrent_call;

static void concurrent_enter(concurrent_call *cc)
{
    cc->begun = atomic_fetch_add(&concurrent_begun, 1) + 1;
    cc->overlapped = atomic_fetch_add(&concurrent_in_flight, 1) > 0;
}

static void concurrent_leave(concurrent_call *cc)
{
    cc->overlapped = cc->overlapped || atomic_load(&concurrent_begun) != cc->begun;
    atomic_fetch_sub(&concurrent_in_flight, 1);
}

/* NaN over the last 128-row tile of the `rows` output rows that start at row0. */
static void nan_last_tile(fp4d_dtype t, void *out, int64_t row0, int64_t rows, int64_t n)
{
    for (int64_t r = rows > 0 ? (rows - 1) / NAN_TILE * NAN_TILE : 0; r < rows; r++)
        for (int64_t col = 0; col < n; col++) fp4d_out_elem_set(t, out, (row0 + r) * n + col, NAN);
}

/* faulty-racy: a few elements move by a relative 1e-2, as a missing synchronisation
 * would let a neighbouring tile's partial sums leak in. */
static void perturb_a_few(fp4d_dtype t, void *out, int64_t count)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        float v = fabsf(fp4d_out_elem_get(t, out, i));
        if (v > amax && isfinite(v)) amax = v;
    }
    const int picks = 4;
    for (int q = 0; q < picks; q++) {
        int64_t i = count * q / picks + (count > picks ? count / (2 * picks) : 0);
        if (i >= count) break;
        float v     = fp4d_out_elem_get(t, out, i);
        float delta = 1e-2f * (v != 0.0f ? fabsf(v) : (amax > 0.0f ? amax : 1.0f));
        fp4d_out_elem_set(t, out, i, v + delta);
    }
}

static fp4d_status faulty_gemm(void *ctx, const fp4d_gemm_problem *p)
{
    faulty_ctx   *c    = ctx;
    const int64_t m    = p->a.rows, n = p->b.rows, k = p->a.cols;
    const size_t  esz  = fp4d_out_elem_size(p->out_type);
    c->calls++;

    switch (c->kind) {
    case FAULTY_SEGV:
        if (k >= SEGV_MIN_K) {
            /* A field of a workspace that the large-K path forgot to allocate: NULL->count,
             * i.e. a store to a small address in the unmapped first page. Spelled as an
             * address so that UBSan builds crash the same way instead of reporting UB. */
            typedef struct workspace {
                void *buffer;
                long  bytes;
                int   count;
            } workspace;
            volatile int *volatile count = (volatile int *)(uintptr_t)offsetof(workspace, count);
            *count                       = (int)k;
        }
        break;
    case FAULTY_HANG:
        if (n % HANG_N_MOD == 0 && m > 1) {
            /* A spin-wait on a flag no one sets, except that it sleeps, so a hung child
             * costs the machine nothing while the doctor's timeout runs out. */
            for (;;) {
                struct timespec ts = {0, 50 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
        break;
    case FAULTY_ZEROS:
        memset(p->out, 0, (size_t)(m * n) * esz);
        return FP4D_STATUS_OK;
    case FAULTY_M_WINDOW:
        if (m >= M_WINDOW_LO && m <= M_WINDOW_HI) {
            memset(p->out, 0, (size_t)(m * n) * esz);
            return FP4D_STATUS_OK;
        }
        break;
    default: break;
    }

    fp4d_cpu_gemm g;
    memset(&g, 0, sizeof g);
    fp4d_cpu_operand_init(&g.a, &p->a, 0, m, m);
    fp4d_cpu_operand_init(&g.b, &p->b, 0, n, n);
    g.m        = m;
    g.n        = n;
    g.k        = k;
    g.alpha    = p->alpha;
    g.out_type = p->out_type;
    g.out      = p->out;

    switch (c->kind) {
    case FAULTY_LINEAR_SCALES:
        read_layout_flipped(&g.a);
        read_layout_flipped(&g.b);
        break;
    case FAULTY_NIBBLE_SWAP:
        /* The weight unpacker takes the high nibble first. (Swapping both operands would
         * permute the terms of every dot product and be invisible.) */
        g.b.nibble_swap = true;
        break;
    case FAULTY_GLOBAL_INVERTED:
        /* alpha is the product of the decode scales (amax/2688 each); this kernel was
         * handed the encode scales (2688/amax) instead, i.e. 1/alpha. */
        g.alpha = 1.0f / p->alpha;
        break;
    case FAULTY_UE8M0:
        scales_as_ue8m0(&g.a);
        scales_as_ue8m0(&g.b);
        break;
    case FAULTY_BF16_ACCUM: g.bf16_accumulate = true; break;
    default: break;
    }

    /* faulty-tile-rows computes into a scratch buffer and copies back only the rows its
     * broken tile loop covers; the rest of the caller's output stays as it was. */
    void *scratch = NULL;
    if (c->kind == FAULTY_TILE_ROWS && m > TILE_ROWS_LOST) {
        scratch = malloc((size_t)(m * n) * esz);
        FP4D_RETURN_ERROR_IF(!scratch, NOMEM, "%s: out of memory", "faulty-tile-rows");
        g.out = scratch;
    }
    concurrent_call cc = {0};
    if (c->kind == FAULTY_CONCURRENT) concurrent_enter(&cc);
    fp4d_status st = fp4d_cpu_gemm_run(&g, c->isa, c->threads);
    if (c->kind == FAULTY_CONCURRENT) concurrent_leave(&cc);
    if (st != FP4D_STATUS_OK) {
        free(scratch);
        return st;
    }

    switch (c->kind) {
    case FAULTY_TILE_ROWS:
        if (scratch) {
            for (int64_t r = 0; r < m; r++)
                if (r % TILE_ROWS < TILE_ROWS_LOST)
                    memcpy((uint8_t *)p->out + (size_t)(r * n) * esz, (uint8_t *)scratch + (size_t)(r * n) * esz,
                           (size_t)n * esz);
            free(scratch);
        }
        break;
    case FAULTY_NAN_TILE:
        if (m >= NAN_TILE)
            for (int64_t r = 0; r < NAN_TILE; r++)
                for (int64_t col = 0; col < n && col < NAN_TILE; col++) fp4d_out_elem_set(p->out_type, p->out, r * n + col, NAN);
        break;
    case FAULTY_RACY:
        if (c->calls % 2 == 0) perturb_a_few(p->out_type, p->out, m * n);
        break;
    case FAULTY_CONCURRENT:
        if (cc.overlapped) nan_last_tile(p->out_type, p->out, 0, m, n);
        break;
    case FAULTY_OOB:
        /* An epilogue loop running to <= the end: the last value lands once more, one
         * element past the output. */
        memcpy((uint8_t *)p->out + (size_t)(m * n) * esz, (uint8_t *)p->out + (size_t)(m * n - 1) * esz, esz);
        break;
    default: break;
    }
    return FP4D_STATUS_OK;
}

/* faulty-tile-rows in a grouped (MoE) GEMM, where FI PR #3533 was found: an expert routed more
 * than 64 rows gets rows 64..127 of each of its 128-row tiles unwritten (the SM120 MoE kernels
 * counted its M tiles wrong). Rows are numbered within each expert, as the kernel tiles them. */
static fp4d_status faulty_grouped_gemm(void *ctx, const fp4d_grouped_gemm_problem *p)
{
    faulty_ctx *c = ctx;
    if (c->kind == FAULTY_CONCURRENT) {
        /* as in its gemm(), per expert: each expert's last 128-row tile of its own rows */
        concurrent_call cc = {0};
        concurrent_enter(&cc);
        fp4d_status st = fp4d_cpu_run_grouped(p, c->isa, c->threads);
        concurrent_leave(&cc);
        for (int32_t e = 0; st == FP4D_STATUS_OK && cc.overlapped && e < p->num_experts; e++)
            nan_last_tile(p->out_type, p->out, p->expert_offsets[e], p->expert_offsets[e + 1] - p->expert_offsets[e],
                          p->b[0].rows);
        return st;
    }
    if (c->kind != FAULTY_TILE_ROWS) return fp4d_cpu_run_grouped(p, c->isa, c->threads); /* dormant */
    const int64_t rows = p->expert_offsets[p->num_experts], n = p->b[0].rows;
    const size_t  row_bytes = (size_t)n * fp4d_out_elem_size(p->out_type);
    void         *scratch   = malloc(rows > 0 ? (size_t)rows * row_bytes : 1);
    FP4D_RETURN_ERROR_IF(!scratch, NOMEM, "%s: out of memory", "faulty-tile-rows");
    fp4d_grouped_gemm_problem q = *p;
    q.out = scratch;
    fp4d_status st = fp4d_cpu_run_grouped(&q, c->isa, c->threads);
    for (int32_t e = 0; st == FP4D_STATUS_OK && e < p->num_experts; e++) {
        const int64_t first = p->expert_offsets[e], count = p->expert_offsets[e + 1] - first;
        for (int64_t r = 0; r < count; r++)
            if (count <= TILE_ROWS_LOST || r % TILE_ROWS < TILE_ROWS_LOST)
                memcpy((uint8_t *)p->out + (size_t)(first + r) * row_bytes,
                       (uint8_t *)scratch + (size_t)(first + r) * row_bytes, row_bytes);
    }
    free(scratch);
    return st;
}

/* ---- the table ----------------------------------------------------------------------------- */

#define FAULTY_IFACE(kind_, name_, desc_)                                                          \
    {                                                                                              \
        .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface),        \
        .name = name_, .description = desc_, .kind = FP4D_BACKEND_KIND_FAULTY,                     \
        .caps = FP4D_CAP_GEMM, .user_data = (void *)(intptr_t)(kind_), .init = faulty_init,        \
        .free = faulty_free, .supports = faulty_supports, .gemm = faulty_gemm,                     \
        .grouped_gemm = NULL, .quantize = NULL, .score = NULL, .bench = NULL,                      \
    }

/* ... and the one that reproduces its failure in grouped GEMMs too. */
#define FAULTY_IFACE_GROUPED(kind_, name_, desc_)                                                  \
    {                                                                                              \
        .api_version = FP4D_BACKEND_API_VERSION, .struct_size = sizeof(fp4d_backend_iface),        \
        .name = name_, .description = desc_, .kind = FP4D_BACKEND_KIND_FAULTY,                     \
        .caps = FP4D_CAP_GEMM | FP4D_CAP_GROUPED_GEMM, .user_data = (void *)(intptr_t)(kind_),     \
        .init = faulty_init, .free = faulty_free, .supports = faulty_supports, .gemm = faulty_gemm, \
        .grouped_gemm = faulty_grouped_gemm, .quantize = NULL, .score = NULL, .bench = NULL,       \
    }

static const fp4d_backend_iface faulty_ifaces[FAULTY_COUNT] = {
    FAULTY_IFACE(FAULTY_ZEROS, "faulty-zeros",
                 "writes all zeros (FI #2577 cutlass on SM120, FI #2952)"),
    FAULTY_IFACE(FAULTY_M_WINDOW, "faulty-m-window",
                 "correct, except all zeros when 32 <= M <= 1536 (FI #3398 tile selection)"),
    FAULTY_IFACE_GROUPED(FAULTY_TILE_ROWS, "faulty-tile-rows",
                         "leaves rows 64..127 of every 128-row tile unwritten when M > 64, per expert in "
                         "grouped MoE GEMMs (FI PR #3533)"),
    FAULTY_IFACE(FAULTY_NAN_TILE, "faulty-nan-tile",
                 "writes NaN over one 128x128 output tile when M >= 128 (FI #2708 missing PDL sync)"),
    FAULTY_IFACE(FAULTY_LINEAR_SCALES, "faulty-linear-scales",
                 "reads 128x4-swizzled block scales as linear and linear ones as swizzled (vLLM #30260, #48898)"),
    FAULTY_IFACE(FAULTY_NIBBLE_SWAP, "faulty-nibble-swap",
                 "swaps the two FP4 codes of every weight byte (high nibble taken as the even element)"),
    FAULTY_IFACE(FAULTY_GLOBAL_INVERTED, "faulty-global-inverted",
                 "uses the encode scales where the decode scales belong: alpha becomes 1/alpha"),
    FAULTY_IFACE(FAULTY_UE8M0, "faulty-ue8m0",
                 "decodes NVFP4 e4m3 block scales as ue8m0 (SGLang DEEPGEMM_SCALE_UE8M0 on Blackwell)"),
    FAULTY_IFACE(FAULTY_BF16_ACCUM, "faulty-bf16-accum",
                 "accumulates the dot products in bf16 instead of f32"),
    FAULTY_IFACE(FAULTY_RACY, "faulty-racy",
                 "every second call on an instance perturbs a few elements by 1e-2 (race, FI #2708 / SGLang #20047)"),
    FAULTY_IFACE_GROUPED(FAULTY_CONCURRENT, "faulty-concurrent",
                         "right alone; while another instance's call runs, NaN in the last 128-row output tile "
                         "(per expert in grouped MoE GEMMs; FI #2708 / SGLang #20047: only under concurrency)"),
    FAULTY_IFACE(FAULTY_OOB, "faulty-oob",
                 "writes one element past the end of the output (vLLM #55456 scale writes past the allocation)"),
    FAULTY_IFACE(FAULTY_SEGV, "faulty-segv",
                 "dereferences NULL when K >= 4096 (crash, as wrong-arch kernels do)"),
    FAULTY_IFACE(FAULTY_HANG, "faulty-hang",
                 "never returns when N % 256 == 0 and M > 1 (a deadlocked kernel)"),
};

size_t fp4d_faulty_backend_count(void) { return FAULTY_COUNT; }

const fp4d_backend_iface *fp4d_faulty_backend_iface(size_t index)
{
    return index < FAULTY_COUNT ? &faulty_ifaces[index] : NULL;
}
