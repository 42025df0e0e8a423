/*
 * fp4doctor bench - time backends on decode and prefill shapes, against cublas-bf16
 * measured in the same run.
 *
 * GPU backends time device-resident data with CUDA events in their own bench() slot
 * (weights rotated through several copies so that decode shapes are not served from L2,
 * median of repeated batches). Backends without a bench() slot are timed around gemm() with
 * the host clock, on host data, and only on shapes small enough for that to finish.
 * Figures: median microseconds of one call, TFLOP/s (2*M*N*K / t), GB/s of the weight bytes
 * the backend reads (packed FP4 + scales; bf16 for cublas-bf16), and speed-up over
 * cublas-bf16 (its time / this time) for the same shape.
 */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/gpu_info.h"
#include "cli.h"
#include "clock.h"
#include "fp4doctor/backend.h"
#include "internal.h"
#include "fp4doctor/formats.h"
#ifdef FP4D_USE_CUDA
#include "backend/cuda/cuda_backends.h"
#endif

#define MAX_LIST 32
#define MAX_ROUNDS 16
#define LIST_BYTES 4096 /* room for MAX_LIST items of up to 127 characters */

/* Ctrl-C: the configuration being timed is given up, the rows measured so far are reported
 * (table and JSON) and the run exits 1. Without it the process died with nothing printed and
 * left the JSON report's temporary file (FILE.tmp-XXXXXX) beside the user's FILE. */
static volatile sig_atomic_t bench_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    bench_interrupted = 1; /* SA_RESETHAND: a second Ctrl-C kills as usual */
}

typedef struct bench_opts {
    const char *backends[MAX_LIST];
    int         num_backends;
    int64_t     nk[MAX_LIST][2];
    int         num_nk;
    int64_t     ms[MAX_LIST];
    int         num_ms;
    int64_t     tokens[MAX_LIST];
    int         num_tokens;
    int         repeats;
    int         rounds;       /* the repeats shared out over this many rounds, backends taking turns */
    int         device;       /* -1 = all */
    bool        moe, quantize, dense;
    const char *json_path;
} bench_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor bench [--backend LIST] [--device N|all] [--json FILE|-]\n"
            "                       [--shapes NxK,...] [--m LIST] [--tokens LIST] [--repeats R]\n"
            "                       [--rounds N] [--no-dense] [--no-moe] [--no-quantize] [--quick]\n\n"
            "Times FP4 GEMM backends on N x K weight shapes for each M (W4A16: bf16 activations,\n"
            "W4A4: NVFP4 activations, NVFP4 weights with swizzled scales, bf16 output), a grouped\n"
            "MoE GEMM (128 experts of 2048 x 7168, top-8 routing, --tokens tokens), and the cuda\n"
            "quantize kernel (bf16 -> NVFP4 swizzled) against device copy bandwidth.\n"
            "Ratios are against cublas-bf16 measured in the same run: each configuration's repeats\n"
            "are shared out over --rounds rounds, the backends taking turns (forward, then backward), and\n"
            "a backend's figure is the median of its rounds' medians (--rounds 1: one backend's\n"
            "repeats all at once, then the next backend's; at most R rounds).\n\n"
            "--quick: 4096x4096 at --m 1,16,128, MoE at --tokens 1,16, at most 5 repeats.\n\n"
            "defaults: --backend cuda,cublas-bf16 --shapes 4096x4096,14336x4096,4096x14336,7168x18432\n"
            "          --m 1,4,16,64,128,1024,8192 --tokens 1,4,16,64,256,1024,4096 --repeats 20\n"
            "          --rounds 4; without a GPU (and --backend) cpu on 4096x4096 at M = 1, 16\n");
}

/* Splits a comma-separated list in place: the number of items, or -1 for an empty item
 * ("1,,2", a trailing comma) or more than max items - mistakes to report, not to drop. */
static int split_list(char *s, const char **out, int max)
{
    int n = 0;
    for (char *t = s;; t++) {
        char *comma = strchr(t, ',');
        if (comma) *comma = '\0';
        if (!*t || n == max) return -1;
        out[n++] = t;
        if (!comma) return n;
        t = comma;
    }
}

/* A copy of an option's list to split; false when it does not fit (never cut short). */
static bool copy_list(char *buf, size_t size, const char *s)
{
    return (size_t)snprintf(buf, size, "%s", s) < size;
}

/* s as a whole number of decimal digits only (no sign, spaces or junk), or -1. */
static long whole_number(const char *s)
{
    if (!isdigit((unsigned char)s[0])) return -1;
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    return *end || errno ? -1 : v;
}

/* The largest M, token count, N or K the lists take: far past any model's layer, and small
 * enough that sizes in elements cannot overflow on the way to an allocation that fails. */
#define MAX_DIM (1L << 20)

/* Sets bad (a message suffix) to ", not 'item'". */
static void quote_bad(char *bad, size_t bad_size, const char *item)
{
    snprintf(bad, bad_size, ", not '%s'", item);
}

/* A comma-separated list of whole numbers in 1..MAX_DIM into out[]; false on a bad list, with
 * bad set to the message suffix that quotes the refused item (empty where the list as a whole
 * is wrong: an empty item, too many items). */
static bool parse_int_list(const char *s, int64_t *out, int *n, char *bad, size_t bad_size)
{
    char buf[LIST_BYTES];
    const char *items[MAX_LIST];
    const int c = copy_list(buf, sizeof buf, s) ? split_list(buf, items, MAX_LIST) : -1;
    bad[0] = '\0';
    for (int i = 0; i < c; i++) {
        const long v = whole_number(items[i]);
        if (v < 1 || v > MAX_DIM) {
            quote_bad(bad, bad_size, items[i]);
            return false;
        }
        out[i] = v;
    }
    if (c <= 0) return false;
    *n = c;
    return true;
}

/* NxK,... with N and K whole numbers in 1..MAX_DIM and K a multiple of 32; bad as above. */
static bool parse_shapes(const char *s, bench_opts *o, char *bad, size_t bad_size)
{
    char buf[LIST_BYTES];
    const char *items[MAX_LIST];
    const int c = copy_list(buf, sizeof buf, s) ? split_list(buf, items, MAX_LIST) : -1;
    bad[0] = '\0';
    for (int i = 0; i < c; i++) {
        char item[128];
        snprintf(item, sizeof item, "%s", items[i]);
        char *x = strchr(item, 'x');
        if (x) *x = '\0';
        const long n = whole_number(item), k = x ? whole_number(x + 1) : -1;
        if (n < 1 || n > MAX_DIM || k < 1 || k > MAX_DIM || k % 32) {
            quote_bad(bad, bad_size, items[i]);
            return false;
        }
        o->nk[i][0] = n;
        o->nk[i][1] = k;
    }
    if (c <= 0) return false;
    o->num_nk = c;
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Host-clock timing of gemm() for backends without bench(): random FP4/bf16 operands, after one
 * untimed call when warm_up is set. */
static fp4d_status host_time(const fp4d_backend_iface *it, void *ctx, const fp4d_gemm_desc *d, int repeats,
                             bool warm_up, fp4d_bench_result *out)
{
    const fp4d_dtype_traits *at = fp4d_dtype_get(d->a_type), *bt = fp4d_dtype_get(d->b_type);
    const size_t a_bytes = fp4d_dtype_data_bytes(d->a_type, d->m, d->k), b_bytes = fp4d_dtype_data_bytes(d->b_type, d->n, d->k);
    const size_t as = at->is_block_fp4 ? fp4d_scale_buffer_size(d->a_layout, d->m, d->k / at->block_size) : 0;
    const size_t bs = fp4d_scale_buffer_size(d->b_layout, d->n, d->k / bt->block_size);
    uint8_t *a = calloc(a_bytes + 1, 1), *b = calloc(b_bytes + 1, 1), *sa = calloc(as + 1, 1), *sb = calloc(bs + 1, 1);
    void *o = calloc((size_t)(d->m * d->n), 4);
    double *t = calloc((size_t)repeats, sizeof *t);
    fp4d_status st = a && b && sa && sb && o && t ? FP4D_STATUS_OK : FP4D_STATUS_NOMEM;
    if (st == FP4D_STATUS_NOMEM) /* else the row read "ERROR: NOMEM: " and whatever came before */
        fp4d_set_error(st, "out of memory for the %lldx%lldx%lld operands", (long long)d->m, (long long)d->n,
                       (long long)d->k);
    if (st == FP4D_STATUS_OK) {
        for (size_t i = 0; i < b_bytes; i++) b[i] = (uint8_t)(i * 2654435761u >> 13);
        memset(sb, d->b_type == FP4D_DTYPE_NVFP4 ? 0x38 : 127, bs);
        if (at->is_block_fp4) {
            for (size_t i = 0; i < a_bytes; i++) a[i] = (uint8_t)(i * 40503u >> 7);
            memset(sa, d->a_type == FP4D_DTYPE_NVFP4 ? 0x38 : 127, as);
        } else {
            float one = 0.5f;
            for (size_t i = 0; i < (size_t)(d->m * d->k); i++) fp4d_from_f32(d->a_type, &one, 1, a + i * (at->element_bits / 8));
        }
        fp4d_gemm_problem p = {{d->a_type, d->m, d->k, a, at->is_block_fp4 ? sa : NULL, d->a_layout},
                               {d->b_type, d->n, d->k, b, sb, d->b_layout}, 1.0f, d->out_type, o};
        if (warm_up) st = it->gemm(ctx, &p);
        for (int r = 0; st == FP4D_STATUS_OK && r < repeats; r++) {
            double t0 = 1e6 * fp4d_now_s();
            st = it->gemm(ctx, &p);
            t[r] = 1e6 * fp4d_now_s() - t0;
        }
        if (st == FP4D_STATUS_OK) {
            qsort(t, (size_t)repeats, sizeof *t, cmp_double);
            out->median_us = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
            out->min_us = t[0];
            out->repeats = repeats;
        }
    }
    free(a), free(b), free(sa), free(sb), free(o), free(t);
    return st;
}

typedef struct row {
    char    backend[48], mode[16];
    int     device;
    int64_t m, n, k, experts, tokens;
    double  us, min_us, tflops, gbps;
    double  speedup; /* NAN when there is no anchor */
    int     order;   /* position in the order of measurement, within a configuration that of its first
                        round (rows are reported grouped by backend) */
    char    status[320];
    double  round_us[MAX_ROUNDS], round_min_us[MAX_ROUNDS]; /* each round's median and minimum */
    int     rounds;
} row;

typedef struct rows {
    row   *v;
    size_t n, cap;
} rows;

static row *add_row(rows *r)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        row *v = realloc(r->v, cap * sizeof *v);
        if (!v) return NULL;
        r->v = v;
        r->cap = cap;
    }
    row *x = &r->v[r->n];
    memset(x, 0, sizeof *x);
    x->speedup = NAN;
    x->order = (int)r->n++;
    return x;
}

/* Bytes of weights a backend reads per call. */
static double weight_bytes(const char *backend, const fp4d_gemm_desc *d, int64_t experts_touched)
{
    const double per = !strcmp(backend, "cublas-bf16") ? 2.0 * (double)d->n * (double)d->k
                                                       : (double)d->n * (double)d->k * (0.5 + 1.0 / 16.0);
    return per * (double)(experts_touched > 0 ? experts_touched : 1);
}

static int64_t experts_touched(int64_t tokens, int experts)
{
    /* the bench routing (cuda_common.c) gives each token 8 distinct experts, spread by 37 */
    bool *hit = calloc((size_t)experts, 1);
    int64_t n = 0;
    for (int64_t t = 0; hit && t < tokens; t++)
        for (int i = 0; i < 8; i++) {
            int64_t e = (37 * t + (int64_t)i * (experts / 8)) % experts;
            if (!hit[e]) hit[e] = true, n++;
        }
    free(hit);
    return n;
}

/* Host memory that timing d with the host clock takes: host_time's operands (the output as f32,
 * the widest out type) plus what a CPU kernel adds (activations and output converted to f32,
 * cpu_engine.c). */
static double host_timing_bytes(const fp4d_gemm_desc *d)
{
    const fp4d_dtype_traits *at = fp4d_dtype_get(d->a_type), *bt = fp4d_dtype_get(d->b_type);
    const double m = (double)d->m, n = (double)d->n, k = (double)d->k;
    const double a = m * k * at->element_bits / 8.0 + (at->is_block_fp4 ? m * k / at->block_size + 128.0 * k : 0);
    const double b = n * k * bt->element_bits / 8.0 + (bt->is_block_fp4 ? n * k / bt->block_size + 128.0 * k : 0);
    return a + b + 2.0 * m * n * 4.0 + m * k * 4.0;
}

/* The most host timing may take: a quarter of physical memory, at most 4 GiB. The work limit
 * alone (4e9 multiply-adds) let 30000 x 1 x 131072 through: 8 GB of bf16 activations and 16 GB
 * more inside the cpu kernel, allocated until the machine ran out. */
static double host_timing_budget(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double cap = 4.0 * 1024 * 1024 * 1024, phys = pages > 0 && page > 0 ? (double)pages * (double)page : cap;
    return phys / 4 < cap ? phys / 4 : cap;
}

/* A row for one backend on configuration d: its status stays "" while it is being timed. */
static row *start_row(const fp4d_backend_iface *it, void *ctx, int device, const char *mode, const fp4d_gemm_desc *d,
                      int64_t tokens, rows *out)
{
    row *r = add_row(out);
    if (!r) return NULL;
    snprintf(r->backend, sizeof r->backend, "%s", it->name);
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    r->device = device;
    r->m = d->m, r->n = d->n, r->k = d->k, r->experts = d->num_experts, r->tokens = tokens;
    fp4d_reason why = {{0}};
    if (!it->supports(ctx, d, &why)) snprintf(r->status, sizeof r->status, "UNSUPPORTED: %s", why.text);
    else if (!it->bench && (d->num_experts != 0 || (double)d->m * (double)d->n * (double)d->k > 4e9))
        snprintf(r->status, sizeof r->status, "SKIPPED: no device timing and too large for host timing");
    else if (!it->bench && host_timing_bytes(d) > host_timing_budget())
        snprintf(r->status, sizeof r->status, "SKIPPED: host timing would take %.1f GiB of memory, more than %.1f GiB",
                 host_timing_bytes(d) / 0x1p30, host_timing_budget() / 0x1p30);
    return r;
}

/* One round of repeats for a row still being timed; an error ends the row's timing. */
static void time_round(const fp4d_backend_iface *it, void *ctx, const fp4d_gemm_desc *d, int repeats, row *r)
{
    if (r->status[0] || r->rounds == MAX_ROUNDS) return;
    fp4d_bench_result res = {0};
    const fp4d_status st =
        it->bench ? it->bench(ctx, d, repeats, &res) : host_time(it, ctx, d, repeats, r->rounds == 0, &res);
    if (st != FP4D_STATUS_OK) {
        snprintf(r->status, sizeof r->status, "ERROR: %s: %s", fp4d_status_name(st), fp4d_last_error());
        return;
    }
    r->round_us[r->rounds] = res.median_us;
    r->round_min_us[r->rounds] = res.min_us;
    r->rounds++;
}

/* The row's figures from its rounds: the median of the rounds' medians, the least minimum. */
static void finish_row(const fp4d_gemm_desc *d, row *r)
{
    if (r->status[0]) return;
    double t[MAX_ROUNDS];
    memcpy(t, r->round_us, (size_t)r->rounds * sizeof *t);
    qsort(t, (size_t)r->rounds, sizeof *t, cmp_double);
    const int n = r->rounds;
    r->us = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    r->min_us = r->round_min_us[0];
    for (int i = 1; i < n; i++)
        if (r->round_min_us[i] < r->min_us) r->min_us = r->round_min_us[i];
    snprintf(r->status, sizeof r->status, "OK");
    r->tflops = 2.0 * (double)d->m * (double)d->n * (double)d->k / (r->us * 1e-6) / 1e12;
    const int64_t touched = d->num_experts ? experts_touched(r->tokens, (int)d->num_experts) : 0;
    r->gbps = weight_bytes(r->backend, d, touched) / (r->us * 1e-6) / 1e9;
}

/*
 * Times configuration d on every backend: `rounds` rounds (at most `repeats`) sharing out the
 * repeats, the backends taking turns, forward in even rounds and backward in odd ones. A power-
 * capped GPU changes its clocks over tenths of a second: on an H200 the same W4A4 GEMM at
 * M = 8192 ran 14% slower when its 20 batches happened to fall in a clock dip (kernel by kernel,
 * all three of its kernels 12-14% slower), and cublas-bf16's likewise in other runs, so timed
 * whole one after the other the two sides of a ratio could see different clocks. In turns,
 * both sample the same stretch of time.
 */
static void bench_config(const fp4d_backend_iface *const *its, void *const *ctxs, int num_backends, int device,
                         const char *mode, const fp4d_gemm_desc *d, int64_t tokens, int repeats, int rounds, rows *out)
{
    /* rows by index: adding one may move them all */
    size_t at[MAX_LIST];
    for (int b = 0; b < num_backends; b++)
        at[b] = its[b] && start_row(its[b], ctxs[b], device, mode, d, tokens, out) ? out->n - 1 : SIZE_MAX;
    if (rounds > repeats) rounds = repeats; /* each round at least one repeat */
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    /* host timing (seconds per call on large shapes) keeps to 5 timed calls in all, in as
     * many of the rounds as that allows */
    const int host_repeats = repeats < 5 ? repeats : 5, host_rounds = rounds < host_repeats ? rounds : host_repeats;
    for (int round = 0; round < rounds && !bench_interrupted; round++)
        for (int i = 0; i < num_backends && !bench_interrupted; i++) {
            const int b = round % 2 ? num_backends - 1 - i : i;
            if (at[b] == SIZE_MAX) continue;
            /* the repeats shared out, the first rounds taking one more where they do not divide */
            const int n = its[b]->bench ? rounds : host_rounds, total = its[b]->bench ? repeats : host_repeats;
            if (round < n) time_round(its[b], ctxs[b], d, total / n + (round < total % n), &out->v[at[b]]);
        }
    for (int b = 0; b < num_backends; b++) {
        if (at[b] == SIZE_MAX) continue;
        row *r = &out->v[at[b]];
        /* a configuration cut short is not reported: its backends' rounds are no longer paired */
        if (bench_interrupted && !r->status[0]) snprintf(r->status, sizeof r->status, "SKIPPED: interrupted (Ctrl-C)");
        finish_row(d, r);
    }
}

static void fill_speedups(rows *rs)
{
    for (size_t i = 0; i < rs->n; i++) {
        row *r = &rs->v[i];
        if (strcmp(r->status, "OK")) continue;
        for (size_t j = 0; j < rs->n; j++) {
            const row *a = &rs->v[j];
            if (!strcmp(a->backend, "cublas-bf16") && !strcmp(a->status, "OK") && !strcmp(a->mode, r->mode) &&
                a->device == r->device && a->m == r->m && a->n == r->n && a->k == r->k && a->experts == r->experts)
                r->speedup = a->us / r->us;
        }
    }
}

/* Rows were measured device by device and, on each, configuration by configuration with every
 * backend in turn; reported per device one backend after the other in the order they were
 * asked for (names: the backends' registry names, in --backend order), each in measurement
 * order. */
static void group_by_backend(rows *rs, const char *const *names, int num_names)
{
    row *sorted = rs->n ? malloc(rs->n * sizeof *sorted) : NULL;
    if (!sorted) return; /* out of memory: reported in measurement order */
    size_t out = 0;
    for (size_t i = 0; i < rs->n; i++) {
        bool device_seen = false;
        for (size_t j = 0; j < i && !device_seen; j++) device_seen = rs->v[j].device == rs->v[i].device;
        if (device_seen) continue;
        for (int b = 0; b < num_names; b++) {
            bool named_before = false; /* --backend cpu,cpu: one group */
            for (int a = 0; a < b && !named_before; a++) named_before = !strcmp(names[a], names[b]);
            for (size_t j = i; !named_before && j < rs->n && out < rs->n; j++)
                if (rs->v[j].device == rs->v[i].device && !strcmp(rs->v[j].backend, names[b])) sorted[out++] = rs->v[j];
        }
    }
    if (out != rs->n) { /* a row of a backend not in the list: measurement order, as a whole */
        free(sorted);
        return;
    }
    memcpy(rs->v, sorted, rs->n * sizeof *sorted);
    free(sorted);
}

static void print_rows(const rows *rs)
{
    printf("%-12s %-6s %3s %6s %6s %6s %4s %11s %9s %9s %8s\n", "backend", "mode", "dev", "M", "N", "K", "E", "median_us",
           "TFLOP/s", "wGB/s", "vs_bf16");
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->v[i];
        if (strcmp(r->status, "OK")) {
            printf("%-12s %-6s %3d %6lld %6lld %6lld %4lld  %s\n", r->backend, r->mode, r->device, (long long)r->m,
                   (long long)r->n, (long long)r->k, (long long)r->experts, r->status);
            continue;
        }
        char sp[16] = "-";
        if (!isnan(r->speedup)) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
        /* three significant digits below 100: host-timed rows (0.002 TFLOP/s, 0.13 GB/s) all
         * printed 0.0 and 0 with the fixed GPU-sized precision */
        char tf[16], gb[16];
        snprintf(tf, sizeof tf, r->tflops < 100 ? "%.3g" : "%.1f", r->tflops);
        snprintf(gb, sizeof gb, r->gbps < 100 ? "%.3g" : "%.0f", r->gbps);
        printf("%-12s %-6s %3d %6lld %6lld %6lld %4lld %11.2f %9s %9s %8s\n", r->backend, r->mode, r->device,
               (long long)r->m, (long long)r->n, (long long)r->k, (long long)r->experts, r->us, tf, gb, sp);
    }
    /* which anchor the ratios are against, or why there are none (a column of "-" said neither) */
    bool anchored = false, anchor_ran = false;
    for (size_t i = 0; i < rs->n; i++) {
        anchored |= !isnan(rs->v[i].speedup);
        anchor_ran |= !strcmp(rs->v[i].backend, "cublas-bf16") && !strcmp(rs->v[i].status, "OK");
    }
    if (anchored)
        printf("# vs_bf16: cublas-bf16's median_us over the row's, same configuration and device, measured in this run\n");
    else if (rs->n)
        printf("# vs_bf16: none, %s\n", anchor_ran ? "cublas-bf16 timed no configuration that another row has"
                                                    : "cublas-bf16 was not timed in this run (add it to --backend)");
}

/* JSON has no Inf/NaN, and jansson's json_real() answers NULL for them, which
 * json_object_set_new() drops: a plugin's bench() that answers 0 us (a clock too coarse for
 * the call) made TFLOP/s and GB/s infinite and the row lost its "tflops" and "weight_gbps".
 * Written as null instead, as check's report does. */
static json_t *finite_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *rows_json(const rows *rs)
{
    json_t *a = json_array();
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->v[i];
        json_t *o = json_pack("{s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:s}", "backend", r->backend, "mode", r->mode,
                              "device", r->device, "m", (json_int_t)r->m, "n", (json_int_t)r->n, "k", (json_int_t)r->k,
                              "experts", (json_int_t)r->experts, "tokens", (json_int_t)r->tokens, "status", r->status);
        json_object_set_new(o, "measured_order", json_integer(r->order));
        if (!strcmp(r->status, "OK")) {
            json_object_set_new(o, "median_us", finite_or_null(r->us));
            json_object_set_new(o, "min_us", finite_or_null(r->min_us));
            json_object_set_new(o, "tflops", finite_or_null(r->tflops));
            json_object_set_new(o, "weight_gbps", finite_or_null(r->gbps));
            json_object_set_new(o, "speedup_vs_cublas_bf16", finite_or_null(r->speedup));
            json_t *rounds = json_array();
            for (int k = 0; k < r->rounds; k++) json_array_append_new(rounds, finite_or_null(r->round_us[k]));
            json_object_set_new(o, "round_median_us", rounds);
        }
        json_array_append_new(a, o);
    }
    return a;
}

int cmd_bench(int argc, char **argv)
{
    const char *cmd = argv[0];
    bench_opts o = {.repeats = 20, .rounds = 4, .device = 0, .moe = true, .quantize = true, .dense = true};
    char backend_buf[LIST_BYTES] = "";
    bool quick = false, backends_given = false;
    char bad[160]; /* ", not '<item of up to 127 characters>'" */
    parse_shapes("4096x4096,14336x4096,4096x14336,7168x18432", &o, bad, sizeof bad);
    parse_int_list("1,4,16,64,128,1024,8192", o.ms, &o.num_ms, bad, sizeof bad);
    parse_int_list("1,4,16,64,256,1024,4096", o.tokens, &o.num_tokens, bad, sizeof bad);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return FP4D_EXIT_OK;
        } else if (!strcmp(a, "--backend") && v) {
            if (!copy_list(backend_buf, sizeof backend_buf, v))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--backend: list too long");
            backends_given = true;
            i++;
        } else if (!strcmp(a, "--device") && v) {
            if (!strcmp(v, "all")) o.device = -1;
            else {
                uint64_t d;
                if (!cli_parse_u64(v, &d) || d >= 1024)
                    return cli_fail(FP4D_EXIT_USAGE, cmd, "--device takes a GPU index or 'all', not '%s'", v);
                o.device = (int)d;
            }
            i++;
        } else if (!strcmp(a, "--json") && v) {
            o.json_path = v;
            i++;
        } else if (!strcmp(a, "--shapes") && v) {
            if (!parse_shapes(v, &o, bad, sizeof bad))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--shapes takes up to %d of NxK,... (N, K in 1..%ld, K a multiple of 32)%s",
                                MAX_LIST, MAX_DIM, bad);
            i++;
        } else if ((!strcmp(a, "--m") || !strcmp(a, "--tokens")) && v) {
            const bool m = !strcmp(a, "--m");
            if (!parse_int_list(v, m ? o.ms : o.tokens, m ? &o.num_ms : &o.num_tokens, bad, sizeof bad))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "%s takes up to %d comma-separated whole numbers in 1..%ld%s", a,
                                MAX_LIST, MAX_DIM, bad);
            i++;
        } else if (!strcmp(a, "--repeats") && v) {
            const long r = whole_number(v);
            if (r < 1 || r > 10000) return cli_fail(FP4D_EXIT_USAGE, cmd, "--repeats takes 1..10000, not '%s'", v);
            o.repeats = (int)r;
            i++;
        } else if (!strcmp(a, "--rounds") && v) {
            const long r = whole_number(v);
            if (r < 1 || r > MAX_ROUNDS) return cli_fail(FP4D_EXIT_USAGE, cmd, "--rounds takes 1..%d, not '%s'", MAX_ROUNDS, v);
            o.rounds = (int)r;
            i++;
        } else if (!strcmp(a, "--no-moe")) {
            o.moe = false;
        } else if (!strcmp(a, "--no-quantize")) {
            o.quantize = false;
        } else if (!strcmp(a, "--no-dense")) {
            o.dense = false;
        } else if (!strcmp(a, "--quick")) {
            quick = true;
        } else {
            return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown or incomplete option '%s' (see fp4doctor bench --help)", a);
        }
    }
    /* all three off printed an empty table with exit 0, which a script reads as "timed" */
    if (!o.dense && !o.moe && !o.quantize)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "--no-dense, --no-moe and --no-quantize together leave nothing to time");
    if (quick) {
        parse_shapes("4096x4096", &o, bad, sizeof bad);
        parse_int_list("1,16,128", o.ms, &o.num_ms, bad, sizeof bad);
        parse_int_list("1,16", o.tokens, &o.num_tokens, bad, sizeof bad);
        if (o.repeats > 5) o.repeats = 5;
    }
    const fp4d_status registry_status = fp4d_registry_init(NULL);
    if (registry_status != FP4D_STATUS_OK) return cli_registry_failed(cmd, registry_status);

    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    if (!backends_given) snprintf(backend_buf, sizeof backend_buf, "%s", ci.device_count > 0 ? "cuda,cublas-bf16" : "cpu");
    o.num_backends = split_list(backend_buf, o.backends, MAX_LIST);
    if (o.num_backends < 0)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "--backend takes up to %d comma-separated backend names", MAX_LIST);
    for (int b = 0; b < o.num_backends; b++) {
        if (!fp4d_registry_find(o.backends[b])) return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown backend '%s' (see fp4doctor backends)", o.backends[b]);
        for (int prev = 0; prev < b; prev++)
            if (!strcmp(o.backends[prev], o.backends[b]))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--backend names '%s' twice", o.backends[b]);
    }
    if (!backends_given && ci.device_count == 0) {
        fprintf(stderr, "fp4doctor bench: no GPU (%s); timing the cpu backend on decode shapes only\n", ci.error);
        parse_shapes("4096x4096", &o, bad, sizeof bad);
        parse_int_list("1,16", o.ms, &o.num_ms, bad, sizeof bad);
        o.moe = o.quantize = false;
        if (!o.dense) return cli_fail(FP4D_EXIT_USAGE, cmd, "with no GPU only dense GEMMs are timed, and --no-dense leaves them out");
    }
    int dev_first = o.device < 0 ? 0 : o.device, dev_last = o.device < 0 ? ci.device_count - 1 : o.device;
    if (o.device < 0 && ci.device_count == 0) dev_first = dev_last = -1; /* host only */
    if (o.device >= 0 && ci.device_count > 0 && o.device >= ci.device_count)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "GPU %d does not exist (this machine has %d)", o.device, ci.device_count);

    /* before the report's temporary file exists, so that no Ctrl-C can leave it behind */
    bench_interrupted = 0;
    struct sigaction old_sa;
    cli_catch_sigint(on_sigint, &old_sa);
    FILE *jf = NULL;
    if (o.json_path) {
        const int refused = cli_refuse_plugin_output(cmd, "--json", o.json_path, NULL, 0);
        if (refused != FP4D_EXIT_OK) {
            sigaction(SIGINT, &old_sa, NULL);
            return refused;
        }
    }
    if (o.json_path && !(jf = cli_open_output(cmd, o.json_path))) {
        sigaction(SIGINT, &old_sa, NULL);
        return cli_output_failure();
    }
    /* human table to stdout, unless the JSON goes there */
    const bool table = jf != stdout;
    rows rs = {0};
    json_t *extra = json_array();
    int failures = 0;

    for (int dev = dev_first; dev <= dev_last && !bench_interrupted; dev++) {
        if (dev >= 0 && dev < ci.device_count && table)
            fprintf(stdout, "# GPU %d: %s (compute capability %d.%d, %d SMs, %.0f MB L2)\n", dev, ci.gpus[dev].name,
                    ci.gpus[dev].cc_major, ci.gpus[dev].cc_minor, ci.gpus[dev].sm_count,
                    (double)ci.gpus[dev].l2_bytes / 1e6);
        /* every backend's context first, then each configuration timed on all of them back to
         * back, so that the two sides of a ratio are measured seconds apart under the same
         * clocks and power state. Timed one backend after the other, they were minutes apart:
         * a full run on an H200 spends most of its time at the 700 W power cap, with SM clocks
         * anywhere from 1575 to 1980 MHz (docs/performance.md). */
        const fp4d_backend_iface *its[MAX_LIST] = {0};
        void *ctxs[MAX_LIST] = {0};
        for (int b = 0; b < o.num_backends; b++) {
            const fp4d_backend_iface *it = fp4d_registry_find(o.backends[b]);
            fp4d_reason why = {{0}};
            const int use_dev = (it->caps & FP4D_CAP_NEEDS_DEVICE) ? (dev < 0 ? 0 : dev) : -1;
            if (it->init(it->user_data, use_dev, &ctxs[b], &why) != FP4D_STATUS_OK) {
                row *r = add_row(&rs);
                if (r) {
                    snprintf(r->backend, sizeof r->backend, "%s", it->name);
                    snprintf(r->mode, sizeof r->mode, "-");
                    r->device = dev;
                    snprintf(r->status, sizeof r->status, "UNSUPPORTED: %s", why.text);
                }
                continue;
            }
            its[b] = it;
        }
        for (int s = 0; o.dense && s < o.num_nk && !bench_interrupted; s++)
            for (int mi = 0; mi < o.num_ms && !bench_interrupted; mi++)
                for (int mode = 0; mode < 2 && !bench_interrupted; mode++) {
                    fp4d_gemm_desc d = {o.ms[mi], o.nk[s][0], o.nk[s][1],
                                        mode ? FP4D_DTYPE_NVFP4 : FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_DTYPE_BF16,
                                        FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_128X4, 0};
                    bench_config(its, ctxs, o.num_backends, dev, mode ? "W4A4" : "W4A16", &d, 0, o.repeats, o.rounds, &rs);
                }
        for (int ti = 0; o.moe && ti < o.num_tokens && !bench_interrupted; ti++) {
            fp4d_gemm_desc d = {o.tokens[ti] * 8, 2048, 7168, FP4D_DTYPE_BF16, FP4D_DTYPE_NVFP4, FP4D_DTYPE_BF16,
                                FP4D_LAYOUT_SWIZZLED_128X4, FP4D_LAYOUT_SWIZZLED_128X4, 128};
            bench_config(its, ctxs, o.num_backends, dev, "MoE", &d, o.tokens[ti], o.repeats < 10 ? o.repeats : 10, o.rounds,
                         &rs);
        }
        for (int b = 0; b < o.num_backends; b++)
            if (its[b]) its[b]->free(ctxs[b]);
#ifdef FP4D_USE_CUDA
        /* per shape, the time to merely read its NVFP4 codes + scales once: no kernel that
         * streams the weights can beat it, so cublas-bf16's decode time over it bounds the
         * speedup any FP4 kernel can show at M <= 16 on this GPU, in this timing. Twice: reads
         * that overlap the previous read's drain (the bound for weights known not to change),
         * and reads that wait for the kernel before them, as a GEMM's must (that kernel may
         * have written its operands) */
        for (int s = 0; o.dense && dev >= 0 && dev < ci.device_count && s < o.num_nk && !bench_interrupted; s++) {
            const int64_t n = o.nk[s][0], k = o.nk[s][1];
            const size_t bytes = (size_t)(n * k / 2 + n * k / 16);
            fp4d_bench_result f = {0}, fd = {0};
            if (fp4d_cuda_bench_read(dev, bytes, false, o.repeats, &f) != FP4D_STATUS_OK ||
                fp4d_cuda_bench_read(dev, bytes, true, o.repeats, &fd) != FP4D_STATUS_OK) {
                if (table) printf("# weight read floor %lldx%lld: %s\n", (long long)n, (long long)k, fp4d_last_error());
                failures++;
                continue;
            }
            const double gbps = (double)bytes / (f.median_us * 1e-6) / 1e9;
            const double dep_gbps = (double)bytes / (fd.median_us * 1e-6) / 1e9;
            const row *anchor = NULL; /* cublas-bf16 W4A16 at the smallest M <= 16 measured */
            for (size_t i = 0; i < rs.n; i++) {
                const row *r = &rs.v[i];
                if (!strcmp(r->backend, "cublas-bf16") && !strcmp(r->mode, "W4A16") && !strcmp(r->status, "OK") &&
                    r->device == dev && r->n == n && r->k == k && r->m <= 16 && (!anchor || r->m < anchor->m))
                    anchor = r;
            }
            if (table) {
                printf("# weight read floor %lldx%lld on GPU %d: %.2f us (%.0f GB/s of NVFP4 codes + scales), %.2f us "
                       "(%.0f GB/s) waiting for the kernel before",
                       (long long)n, (long long)k, dev, f.median_us, gbps, fd.median_us, dep_gbps);
                if (anchor)
                    printf("; cublas-bf16 W4A16 M=%lld %.2f us: at most %.2fx / %.2fx at M <= 16", (long long)anchor->m,
                           anchor->us, anchor->us / f.median_us, anchor->us / fd.median_us);
                printf("\n");
            }
            json_t *j = json_pack("{s:s, s:i, s:I, s:I, s:I, s:f, s:f}", "what", "weight_read_floor", "device", dev, "n",
                                  (json_int_t)n, "k", (json_int_t)k, "bytes", (json_int_t)bytes, "median_us", f.median_us,
                                  "gbps", gbps);
            if (j) {
                json_object_set_new(j, "dependent_median_us", json_real(fd.median_us));
                json_object_set_new(j, "dependent_gbps", json_real(dep_gbps));
            }
            if (j && anchor) {
                json_object_set_new(j, "max_speedup_m16", json_real(anchor->us / f.median_us));
                json_object_set_new(j, "max_speedup_m16_dependent", json_real(anchor->us / fd.median_us));
            }
            json_array_append_new(extra, j);
        }
        if (o.quantize && dev >= 0 && dev < ci.device_count) {
            const int64_t sizes[2] = {8192, 16384};
            for (int si = 0; si < 2 && !bench_interrupted; si++) {
                const int64_t n = sizes[si];
                fp4d_bench_result q = {0}, c = {0};
                const double moved = (double)n * (double)n * (2.0 + 0.5 + 1.0 / 16.0);
                fp4d_status st = fp4d_cuda_bench_quantize(dev, FP4D_DTYPE_BF16, n, n, FP4D_LAYOUT_SWIZZLED_128X4,
                                                          o.repeats, &q);
                if (st == FP4D_STATUS_OK) st = fp4d_cuda_bench_copy(dev, (size_t)(n * n * 2), o.repeats, &c);
                if (st != FP4D_STATUS_OK) {
                    if (table) printf("# quantize %lldx%lld: %s\n", (long long)n, (long long)n, fp4d_last_error());
                    failures++;
                    continue;
                }
                const double qbw = moved / (q.median_us * 1e-6) / 1e9;
                const double cbw = 2.0 * (double)(n * n * 2) / (c.median_us * 1e-6) / 1e9;
                if (table)
                    printf("# quantize bf16->nvfp4 swizzled %lldx%lld on GPU %d: %.1f us, %.0f GB/s moved; "
                           "copy %.0f GB/s; %.0f%% of copy bandwidth\n",
                           (long long)n, (long long)n, dev, q.median_us, qbw, cbw, 100.0 * qbw / cbw);
                json_array_append_new(extra, json_pack("{s:s, s:i, s:I, s:I, s:f, s:f, s:f, s:f}", "what",
                                                       "quantize_bf16_nvfp4_swizzled", "device", dev, "rows",
                                                       (json_int_t)n, "cols", (json_int_t)n, "median_us", q.median_us,
                                                       "gbps", qbw, "copy_gbps", cbw, "fraction_of_copy", qbw / cbw));
            }
        }
#endif
    }
    sigaction(SIGINT, &old_sa, NULL);
    fill_speedups(&rs);
    const char *names[MAX_LIST];
    for (int b = 0; b < o.num_backends; b++) names[b] = fp4d_registry_find(o.backends[b])->name;
    group_by_backend(&rs, names, o.num_backends);
    if (table) print_rows(&rs);
    for (size_t i = 0; i < rs.n; i++)
        if (!strncmp(rs.v[i].status, "ERROR", 5)) failures++;
    bool written = true;
    if (jf) {
        json_t *root = json_pack("{s:i, s:s, s:o, s:o}", "schema_version", 1, "command", "bench", "results", rows_json(&rs),
                                 "quantize", extra);
        json_dumpf(root, jf, JSON_INDENT(2));
        fputc('\n', jf);
        json_decref(root);
        if (cli_close_output(jf) != FP4D_EXIT_OK) written = false;
    } else {
        json_decref(extra);
    }
    free(rs.v);
    if (bench_interrupted) {
        fprintf(stderr, "fp4doctor bench: interrupted (Ctrl-C): only the rows measured so far are reported\n");
        failures++; /* a run stopped early is not a complete benchmark: exit 1, as probe's */
    }
    /* as in the other commands: a report that could not be written fails a run that passed */
    return failures ? FP4D_EXIT_FAILED : written ? FP4D_EXIT_OK : FP4D_EXIT_INPUT;
}
