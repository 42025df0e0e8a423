/*
 * test_scan.c - the checkpoint doctor on generated checkpoints: clean ones of every format
 * yield no finding at all, and each planted defect yields exactly the expected findings
 * (code, tensor, count) and nothing else. Expected counts are what was planted, or are
 * computed here from the clean files (shard headers, the index), not taken from the scanner.
 */
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "fp4doctor/io.h"
#include "fp4doctor/scan.h"
#include "scan_test_util.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static char *make_tmpdir(void)
{
    char tmpl[] = "/tmp/fp4d-test-scan-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

/* A new temporary folder holding the generator's default ModelOpt NVFP4 checkpoint. */
static char *default_checkpoint_dir(void)
{
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    return dir;
}

static void rm_tree(char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

typedef struct expect {
    fp4d_finding_code code;
    const char       *tensor; /* NULL: a finding about a whole file */
    uint64_t          count;
} expect;

static void print_findings(const fp4d_scan_report *r)
{
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        print_message("  found %s %s count=%llu (%s)\n", fp4d_finding_code_name(f->code), f->tensor ? f->tensor : "-",
                      (unsigned long long)f->count, f->message);
    }
}

/* Every finding is expected and every expectation is found exactly once. */
static void assert_findings(const fp4d_scan_report *r, const expect *e, size_t n)
{
    size_t got = fp4d_scan_report_count(r);
    bool ok = got == n;
    for (size_t k = 0; k < n && ok; k++) {
        size_t matches = 0;
        for (size_t i = 0; i < got; i++) {
            const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
            bool same_tensor = (!e[k].tensor && !f->tensor) || (e[k].tensor && f->tensor && !strcmp(e[k].tensor, f->tensor));
            matches += f->code == e[k].code && same_tensor && f->count == e[k].count;
        }
        ok = matches == 1;
    }
    if (!ok) {
        print_message("expected %zu finding(s):\n", n);
        for (size_t k = 0; k < n; k++)
            print_message("  want  %s %s count=%llu\n", fp4d_finding_code_name(e[k].code), e[k].tensor ? e[k].tensor : "-",
                          (unsigned long long)e[k].count);
        print_findings(r);
    }
    assert_true(ok);
}

static fp4d_scan_report *scan(const char *path, bool scales_only)
{
    fp4d_scan_options opt = {0};
    opt.scales_only = scales_only;
    opt.threads = 2;
    fp4d_scan_report *r = NULL;
    fp4d_status st = fp4d_scan_path(path, &opt, &r);
    if (st != FP4D_STATUS_OK) print_message("scan failed: %s\n", fp4d_last_error());
    assert_int_equal(st, FP4D_STATUS_OK);
    return r;
}

/* Generates a checkpoint with at most one plant and checks the findings. */
static void check_plant(fp4d_ckpt_format fmt, int experts, fp4d_ckpt_defect d, const char *tensor, uint64_t count,
                        const expect *e, size_t n)
{
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, fmt);
    if (experts >= 0) p.experts = experts;
    fp4d_ckpt_plant pl = {d, tensor, count};
    p.plants = &pl;
    p.num_plants = tensor ? 1 : 0;
    fp4d_status st = fp4d_ckpt_generate(dir, &p);
    if (st != FP4D_STATUS_OK) print_message("generate: %s\n", fp4d_last_error());
    assert_int_equal(st, FP4D_STATUS_OK);
    fp4d_scan_report *r = scan(dir, false);
    assert_findings(r, e, n);
    fp4d_scan_report_free(r);
    rm_tree(dir);
}

/* ---- clean checkpoints ------------------------------------------------------------------------- */

static void clean_case(fp4d_ckpt_format fmt, int experts, const char *format_name, const char *writer)
{
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, fmt);
    if (experts >= 0) p.experts = experts;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    for (int scales_only = 0; scales_only < 2; scales_only++) {
        fp4d_scan_report *r = scan(dir, scales_only);
        assert_findings(r, NULL, 0);
        assert_string_equal(fp4d_scan_report_format(r), format_name);
        if (writer && !scales_only) assert_string_equal(fp4d_scan_report_writer(r), writer);
        fp4d_scan_report_free(r);
    }
    rm_tree(dir);
}

static void test_clean_modelopt(void **s) { (void)s; clean_case(FP4D_CKPT_MODELOPT_NVFP4, 0, "modelopt-nvfp4", "modelopt"); }
static void test_clean_modelopt_moe(void **s) { (void)s; clean_case(FP4D_CKPT_MODELOPT_NVFP4, 4, "modelopt-nvfp4", "modelopt"); }
static void test_clean_ct_nvfp4(void **s) { (void)s; clean_case(FP4D_CKPT_CT_NVFP4, 0, "compressed-tensors-nvfp4", "compressed-tensors"); }
static void test_clean_ct_mxfp4(void **s) { (void)s; clean_case(FP4D_CKPT_CT_MXFP4, 0, "compressed-tensors-mxfp4", NULL); }
static void test_clean_gptoss(void **s) { (void)s; clean_case(FP4D_CKPT_GPTOSS_MXFP4, -1, "gpt-oss-mxfp4", NULL); }
static void test_clean_plain(void **s) { (void)s; clean_case(FP4D_CKPT_UNQUANTIZED, 0, "unquantized", NULL); }

/* Zero-block bytes of other writers are legitimate too (spec §4.8): 0x00 and 0x08. */
static void test_clean_other_zero_bytes(void **s)
{
    (void)s;
    static const struct { int byte; const char *writer; } cases[] = {{0x00, "trtllm-or-flashinfer"}, {0x08, "torchao"}};
    for (size_t i = 0; i < 2; i++) {
        char *dir = make_tmpdir();
        fp4d_ckpt_gen_params p;
        fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
        p.zero_block_byte = cases[i].byte;
        p.zero_block_fraction = 0.2;
        assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
        fp4d_scan_report *r = scan(dir, false);
        assert_findings(r, NULL, 0);
        assert_string_equal(fp4d_scan_report_writer(r), cases[i].writer);
        fp4d_scan_report_free(r);
        r = scan(dir, true);
        assert_int_equal(fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR), 0);
        fp4d_scan_report_free(r);
        rm_tree(dir);
    }
}

/* ---- block scales --------------------------------------------------------------------------------- */

#define L0 "model.layers.0."
#define L1 "model.layers.1."

static void test_scale_nan(void **s)
{
    (void)s;
    expect e[] = {{FP4D_FINDING_SCALE_NAN, L1 "mlp.down_proj.weight_scale", 7}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_SCALE_NAN, e[0].tensor, 7, e, 1);
    expect c[] = {{FP4D_FINDING_SCALE_NAN, L0 "self_attn.q_proj.weight_scale", 3}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_SCALE_NAN, c[0].tensor, 3, c, 1);
    expect m[] = {{FP4D_FINDING_SCALE_NAN, L0 "mlp.up_proj.weight_scale", 5}};
    check_plant(FP4D_CKPT_CT_MXFP4, 0, FP4D_DEFECT_SCALE_NAN, m[0].tensor, 5, m, 1);
    expect g[] = {{FP4D_FINDING_SCALE_NAN, L1 "mlp.experts.down_proj_scales", 9}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_SCALE_NAN, g[0].tensor, 9, g, 1);
}

static void test_scale_negative_and_zero(void **s)
{
    (void)s;
    expect n[] = {{FP4D_FINDING_SCALE_NEGATIVE, L0 "self_attn.o_proj.weight_scale", 4}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_SCALE_NEGATIVE, n[0].tensor, 4, n, 1);
    expect z[] = {{FP4D_FINDING_SCALE_ZERO_NONZERO_DATA, L0 "mlp.gate_proj.weight_scale", 6}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_SCALE_ZERO, z[0].tensor, 6, z, 1);
    expect o[] = {{FP4D_FINDING_SCALE_OUTLIER, L1 "self_attn.k_proj.weight_scale", 2}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_SCALE_OUTLIER, o[0].tensor, 2, o, 1);
    expect og[] = {{FP4D_FINDING_SCALE_OUTLIER, L0 "mlp.experts.gate_up_proj_scales", 3}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_SCALE_OUTLIER, og[0].tensor, 3, og, 1);
}

/* A fused gpt-oss expert tensor: the per-expert split adds up and names the right experts. */
static void test_per_expert_counts(void **s)
{
    (void)s;
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_GPTOSS_MXFP4);
    /* 4 experts x 2*128 rows x 2 blocks = 2048 scales; 8 NaNs spread evenly land 2 per expert. */
    fp4d_ckpt_plant pl = {FP4D_DEFECT_SCALE_NAN, L0 "mlp.experts.gate_up_proj_scales", 8};
    p.plants = &pl;
    p.num_plants = 1;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    fp4d_scan_report *r = scan(dir, false);
    assert_int_equal(fp4d_scan_report_count(r), 1);
    const fp4d_scan_finding *f = fp4d_scan_report_get(r, 0);
    assert_int_equal(f->layer, 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < f->num_experts; i++) {
        assert_in_range(f->experts[i].expert, 0, 3);
        sum += f->experts[i].count;
    }
    assert_int_equal(sum, 8);
    assert_true(f->num_experts >= 2);
    char *json = NULL;
    assert_int_equal(fp4d_scan_report_json(r, &json), FP4D_STATUS_OK);
    json_t *root = json_loads(json, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "schema_version")), FP4D_SCAN_SCHEMA_VERSION);
    json_t *experts = json_object_get(root, "experts");
    assert_int_equal(json_array_size(experts), f->num_experts);
    json_t *layers = json_object_get(root, "layers");
    assert_int_equal(json_array_size(layers), 1);
    json_t *c = json_object_get(json_object_get(json_array_get(layers, 0), "counts"), "SCALE_NAN");
    assert_int_equal(json_integer_value(c), 8);
    json_decref(root);
    free(json);
    fp4d_scan_report_free(r);
    rm_tree(dir);
}

/* ---- global and input scales ---------------------------------------------------------------------- */

static void test_global_scales(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_GLOBAL_SCALE_NONFINITE, L0 "mlp.down_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_GLOBAL_NAN, a[0].tensor, 0, a, 1);
    expect b[] = {{FP4D_FINDING_GLOBAL_SCALE_NONPOSITIVE, L1 "self_attn.o_proj.input_global_scale", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_GLOBAL_ZERO, b[0].tensor, 0, b, 1);
    expect c[] = {{FP4D_FINDING_GLOBAL_SCALE_CONVENTION, L0 "self_attn.o_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_GLOBAL_RECIPROCAL, c[0].tensor, 0, c, 1);
    expect d[] = {{FP4D_FINDING_GLOBAL_SCALE_CONVENTION, L1 "mlp.down_proj.weight_global_scale", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_GLOBAL_RECIPROCAL, d[0].tensor, 0, d, 1);
    expect i[] = {{FP4D_FINDING_GLOBAL_SCALE_CONVENTION, L0 "self_attn.o_proj.input_scale", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_GLOBAL_RECIPROCAL, i[0].tensor, 0, i, 1);
}

static void test_fused_mismatch(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_FUSED_SCALE_MISMATCH, L0 "self_attn.k_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_FUSED_MISMATCH, a[0].tensor, 0, a, 1);
    expect b[] = {{FP4D_FINDING_FUSED_SCALE_MISMATCH, L1 "mlp.up_proj.input_global_scale", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_FUSED_MISMATCH, b[0].tensor, 0, b, 1);
    /* q is the odd one out of three: the majority decides, not the order. */
    expect c[] = {{FP4D_FINDING_FUSED_SCALE_MISMATCH, L1 "self_attn.q_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_FUSED_MISMATCH, c[0].tensor, 0, c, 1);
    /* Experts: a warning, still the same finding. */
    expect d[] = {{FP4D_FINDING_FUSED_SCALE_MISMATCH, L0 "mlp.experts.2.up_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 4, FP4D_DEFECT_FUSED_MISMATCH, d[0].tensor, 0, d, 1);
}

/* ---- structure ------------------------------------------------------------------------------------ */

static void test_companions_and_orphans(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_MISSING_COMPANION, L0 "self_attn.v_proj.weight", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_DROP_TENSOR, L0 "self_attn.v_proj.weight_scale_2", 0, a, 1);
    expect b[] = {{FP4D_FINDING_MISSING_COMPANION, L1 "mlp.experts.down_proj_blocks", 1}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_DROP_TENSOR, L1 "mlp.experts.down_proj_scales", 0, b, 1);
    expect c[] = {{FP4D_FINDING_ORPHAN_SCALE, L0 "mlp.down_proj.weight_scale", 1},
                  {FP4D_FINDING_ORPHAN_SCALE, L0 "mlp.down_proj.weight_global_scale", 1},
                  {FP4D_FINDING_ORPHAN_SCALE, L0 "mlp.down_proj.input_global_scale", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_DROP_TENSOR, L0 "mlp.down_proj.weight_packed", 0, c, 3);
    expect d[] = {{FP4D_FINDING_ORPHAN_SCALE, L1 "mlp.fc9.weight_scale", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_ADD_ORPHAN, d[0].tensor, 0, d, 1);
}

static void test_dtype_and_shape(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_DTYPE_MISMATCH, L0 "self_attn.q_proj.weight_scale", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_WRONG_DTYPE, a[0].tensor, 0, a, 1);
    expect b[] = {{FP4D_FINDING_DTYPE_MISMATCH, L1 "mlp.gate_proj.weight_packed", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_WRONG_DTYPE, b[0].tensor, 0, b, 1);
    expect c[] = {{FP4D_FINDING_DTYPE_MISMATCH, L0 "mlp.up_proj.weight_scale_2", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_WRONG_DTYPE, c[0].tensor, 0, c, 1);
    expect d[] = {{FP4D_FINDING_SHAPE_MISMATCH, L1 "self_attn.o_proj.weight_scale", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_WRONG_SHAPE, d[0].tensor, 0, d, 1);
    expect e[] = {{FP4D_FINDING_SHAPE_MISMATCH, L0 "mlp.experts.down_proj_scales", 1}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_WRONG_SHAPE, e[0].tensor, 0, e, 1);
}

static void test_nonfinite(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_NONFINITE_VALUES, L1 "post_attention_layernorm.weight", 3}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_NONFINITE, a[0].tensor, 3, a, 1);
    expect b[] = {{FP4D_FINDING_NONFINITE_VALUES, "model.embed_tokens.weight", 11}};
    check_plant(FP4D_CKPT_UNQUANTIZED, 0, FP4D_DEFECT_NONFINITE, b[0].tensor, 11, b, 1);
    expect c[] = {{FP4D_FINDING_NONFINITE_VALUES, L0 "mlp.experts.gate_up_proj_bias", 4}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_NONFINITE, c[0].tensor, 4, c, 1);
}

static void test_exclusions(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_EXCLUDED_BUT_QUANTIZED, L1 "mlp.up_proj.weight", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_EXCLUDE_QUANTIZED, a[0].tensor, 0, a, 1);
    expect b[] = {{FP4D_FINDING_EXCLUDED_BUT_QUANTIZED, L0 "mlp.experts.down_proj_blocks", 1}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_EXCLUDE_QUANTIZED, b[0].tensor, 0, b, 1);
    expect c[] = {{FP4D_FINDING_QUANTIZED_BUT_EXCLUDED, L1 "self_attn.o_proj.weight", 1}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_UNQUANTIZE, L1 "self_attn.o_proj.weight_packed", 0, c, 1);
    expect d[] = {{FP4D_FINDING_QUANTIZED_BUT_EXCLUDED, L0 "mlp.experts.gate_up_proj", 1}};
    check_plant(FP4D_CKPT_GPTOSS_MXFP4, -1, FP4D_DEFECT_UNQUANTIZE, L0 "mlp.experts.gate_up_proj_blocks", 0, d, 1);
}

/* ---- shards and the index ------------------------------------------------------------------------- */

static void test_index(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_INDEX_MISSING_TENSOR, L0 "mlp.down_proj.weight", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_INDEX_OMIT, a[0].tensor, 0, a, 1);
    expect b[] = {{FP4D_FINDING_INDEX_WRONG_FILE, L1 "input_layernorm.weight", 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_INDEX_WRONG_FILE, b[0].tensor, 0, b, 1);
    expect c[] = {{FP4D_FINDING_DUPLICATE_TENSOR, L0 "self_attn.q_proj.weight_scale", 2}};
    check_plant(FP4D_CKPT_CT_NVFP4, 0, FP4D_DEFECT_DUPLICATE, c[0].tensor, 0, c, 1);
}

/* Tensors the index maps to one shard, counted from the index file itself. */
static uint64_t index_count_for(const char *dir, const char *shard)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    const char *k;
    json_t *v;
    uint64_t n = 0;
    json_object_foreach(json_object_get(root, "weight_map"), k, v) n += !strcmp(json_string_value(v), shard);
    json_decref(root);
    return n;
}

static void test_missing_and_truncated_shards(void **s)
{
    (void)s;
    const char *shard1 = "model-00002-of-00002.safetensors";
    /* A deleted shard: one finding, counting the index entries that point at it. */
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    fp4d_ckpt_plant pl = {FP4D_DEFECT_DELETE_SHARD, L1 "mlp.up_proj.weight", 0};
    p.plants = &pl;
    p.num_plants = 1;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    fp4d_scan_report *r = scan(dir, false);
    expect e[] = {{FP4D_FINDING_INDEX_MISSING_FILE, NULL, index_count_for(dir, shard1)}};
    assert_true(e[0].count > 10);
    assert_findings(r, e, 1);
    fp4d_scan_report_free(r);
    rm_tree(dir);

    /* A shard cut inside one tensor: that tensor and every later one (in file order) are lost.
     * The clean shard's header says which ones come later. */
    const char *cut = L1 "mlp.down_proj.weight";
    dir = make_tmpdir();
    p.num_plants = 0;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, shard1);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path, &res);
    assert_non_null(f);
    const fp4d_st_tensor *ct = fp4d_st_find(f, cut);
    assert_non_null(ct);
    uint64_t later = 0;
    for (size_t i = 0; i < fp4d_st_count(f); i++) later += fp4d_st_get(f, i)->begin >= ct->begin && fp4d_st_get(f, i)->nbytes;
    fp4d_st_close(f);
    pl = (fp4d_ckpt_plant){FP4D_DEFECT_TRUNCATE_SHARD, cut, 0};
    p.num_plants = 1;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    r = scan(dir, false);
    expect t[] = {{FP4D_FINDING_FILE_TRUNCATED, cut, later}};
    assert_findings(r, t, 1);
    fp4d_scan_report_free(r);
    rm_tree(dir);
}

/* Copies a file byte for byte. */
static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

/* A shard of the checkpoint's own naming that the index does not name: loaders never open it,
 * so its tensors the index lacks are missing from the model. The scan used to ignore the file
 * and call the checkpoint clean. Stale copies of indexed tensors, and a differently named file
 * (consolidated.safetensors), stay quiet. */
/* Shard names come from readdir and need not be UTF-8: the lookup of files by name (a JSON
 * object used as a hash) refused such a name, and `scan` stopped with "out of memory" (exit
 * 4) on a folder that held one. */
static void test_shard_name_not_utf8(void **s)
{
    (void)s;
    char *dir = default_checkpoint_dir();
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/model.safetensors.index.json", dir);
    assert_int_equal(unlink(from), 0); /* no index: every *.safetensors in the folder */
    snprintf(from, sizeof from, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(to, sizeof to, "%s/model-\xe9.safetensors", dir);
    assert_int_equal(rename(from, to), 0);
    fp4d_scan_report *r = scan(dir, false);
    assert_findings(r, NULL, 0);
    char *json = NULL;
    assert_int_equal(fp4d_scan_report_json(r, &json), FP4D_STATUS_OK);
    assert_non_null(strstr(json, "\"files\": 2")); /* both shards scanned */
    free(json);
    fp4d_scan_report_free(r);
    rm_tree(dir);
}

static void test_shard_not_in_index(void **s)
{
    (void)s;
    const char *shard2 = "model-00002-of-00002.safetensors";
    char *dir = default_checkpoint_dir();
    char path[4096], path2[4096];

    /* A leftover of an earlier export: copies of indexed tensors, and a consolidated file. */
    snprintf(path, sizeof path, "%s/%s", dir, shard2);
    snprintf(path2, sizeof path2, "%s/model-00003-of-00003.safetensors", dir);
    copy_file(path, path2);
    snprintf(path2, sizeof path2, "%s/consolidated.safetensors", dir);
    copy_file(path, path2);
    fp4d_scan_report *r = scan(dir, false);
    assert_findings(r, NULL, 0);
    fp4d_scan_report_free(r);
    snprintf(path2, sizeof path2, "%s/model-00003-of-00003.safetensors", dir);
    assert_int_equal(unlink(path2), 0);

    /* The index forgets shard 2: every tensor in it is reported, naming the shard. */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    json_t *wm = json_object_get(root, "weight_map");
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(wm, tmp, k, v) if (!strcmp(json_string_value(v), shard2)) json_object_del(wm, k);
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
    snprintf(path, sizeof path, "%s/%s", dir, shard2);
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open(path, &res);
    assert_non_null(f);
    size_t n = fp4d_st_count(f);
    assert_true(n > 10);
    expect *e = calloc(n, sizeof *e);
    assert_non_null(e);
    for (size_t i = 0; i < n; i++) e[i] = (expect){FP4D_FINDING_INDEX_MISSING_TENSOR, fp4d_st_get(f, i)->name, 1};
    r = scan(dir, false);
    assert_findings(r, e, n);
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *fd = fp4d_scan_report_get(r, i);
        assert_string_equal(fd->file, shard2);
        assert_int_equal(fd->severity, FP4D_SCAN_ERROR);
    }
    fp4d_scan_report_free(r);
    fp4d_st_close(f);
    free(e);
    rm_tree(dir);
}

static void test_bad_headers(void **s)
{
    (void)s;
    expect a[] = {{FP4D_FINDING_HEADER_INVALID, NULL, 1}};
    check_plant(FP4D_CKPT_MODELOPT_NVFP4, 0, FP4D_DEFECT_HEADER_GARBAGE, L0 "mlp.up_proj.weight_scale", 0, a, 1);
    check_plant(FP4D_CKPT_CT_MXFP4, 0, FP4D_DEFECT_HEADER_LENGTH, L1 "mlp.up_proj.weight_scale", 0, a, 1);
}

/* A shard that is a Git LFS pointer (a clone without git-lfs) is said to be one, with the fix,
 * rather than as a header 2.3e18 bytes long. */
static void test_lfs_pointer_shard(void **s)
{
    (void)s;
    char *dir = default_checkpoint_dir();
    char shard[1024];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00002.safetensors", dir);
    FILE *f = fopen(shard, "w");
    assert_non_null(f);
    fputs("version https://git-lfs.github.com/spec/v1\noid sha256:"
          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nsize 123456\n", f);
    assert_int_equal(fclose(f), 0);
    fp4d_scan_report *r = scan(dir, false);
    size_t said = 0;
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *x = fp4d_scan_report_get(r, i);
        said += x->code == FP4D_FINDING_HEADER_INVALID && strstr(x->message, "LFS_POINTER") &&
                strstr(x->message, "a Git LFS pointer (sha256 0123456789abcdef..., 123456 bytes)") &&
                strstr(x->message, "git lfs pull");
    }
    if (said != 1) print_findings(r);
    assert_int_equal(said, 1);
    fp4d_scan_report_free(r);
    rm_tree(dir);
}

/* ---- configs ---------------------------------------------------------------------------------------- */

static void test_quant_config(void **s)
{
    (void)s;
    const char *mo = "{\"producer\":{\"name\":\"modelopt\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
                     "\"exclude_modules\":[\"lm_head\",\"model.layers.0.mlp*\",\"*.router\"]}}";
    fp4d_quant_config *c = NULL;
    assert_int_equal(fp4d_quant_config_parse(mo, strlen(mo), "hf_quant_config.json", &c), FP4D_STATUS_OK);
    assert_int_equal(fp4d_quant_config_format(c), FP4D_CKPT_MODELOPT_NVFP4);
    assert_true(fp4d_quant_config_is_excluded(c, "lm_head"));
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.0.mlp.down_proj"));
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.7.mlp.router"));
    assert_false(fp4d_quant_config_is_excluded(c, "model.layers.1.mlp.down_proj"));
    assert_false(fp4d_quant_config_is_excluded(c, "model.layers.0.self_attn.q_proj"));
    fp4d_quant_config_free(c);

    const char *mixed = "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{"
                        "\"model.layers.0.mlp.down_proj\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
                        "\"model.layers.0.self_attn.q_proj\":{\"quant_algo\":\"FP8\"}}}}";
    assert_int_equal(fp4d_quant_config_parse(mixed, strlen(mixed), "hf_quant_config.json", &c), FP4D_STATUS_OK);
    assert_true(fp4d_quant_config_is_mixed(c));
    assert_false(fp4d_quant_config_is_excluded(c, "model.layers.0.mlp.down_proj"));
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.0.self_attn.q_proj")); /* FP8, not FP4 */
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.1.mlp.down_proj"));
    fp4d_quant_config_free(c);

    const char *ct = "{\"hidden_size\":8,\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
                     "\"format\":\"nvfp4-pack-quantized\",\"ignore\":[\"lm_head\",\"re:.*mlp\\\\.gate$\","
                     "\"re:model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.o_proj\"]}}";
    assert_int_equal(fp4d_quant_config_parse(ct, strlen(ct), "config.json", &c), FP4D_STATUS_OK);
    assert_int_equal(fp4d_quant_config_format(c), FP4D_CKPT_CT_NVFP4);
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.3.mlp.gate"));
    assert_false(fp4d_quant_config_is_excluded(c, "model.layers.3.mlp.gate_proj"));
    assert_true(fp4d_quant_config_is_excluded(c, "model.layers.12.self_attn.o_proj"));
    assert_false(fp4d_quant_config_is_excluded(c, "model.layers.12.self_attn.q_proj"));
    fp4d_quant_config_free(c);

    const char *plain = "{\"hidden_size\":8}";
    assert_int_equal(fp4d_quant_config_parse(plain, strlen(plain), "config.json", &c), FP4D_STATUS_OK);
    assert_int_equal(fp4d_quant_config_format(c), FP4D_CKPT_UNQUANTIZED);
    fp4d_quant_config_free(c);
    assert_int_equal(fp4d_quant_config_parse("{\"a\":", 5, "config.json", &c), FP4D_STATUS_PARSE);
    assert_null(c);
}

/* ---- the generator ---------------------------------------------------------------------------------- */

/* Sizes the generator cannot write are refused up front with the numbers, and nothing is
 * written: it used to write random-fill tensors until the disk was full (or wrap overflowing
 * sizes into a corrupt header). */
static void test_generator_refuses_huge_sizes(void **s)
{
    (void)s;
    char *parent = make_tmpdir();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ck", parent);
    static const struct {
        fp4d_ckpt_format format;
        int32_t          hidden, experts, layers;
        bool             random_fill;
        fp4d_status      st;
        const char      *says;
    } cases[] = {
        /* 2^30 x 2^30 bf16/packed tensors: exabytes, more than any disk has free */
        {FP4D_CKPT_MODELOPT_NVFP4, 1 << 30, 0, 1, true, FP4D_STATUS_IO, "GB free"},
        /* the same quantized in memory: more than the machine holds */
        {FP4D_CKPT_MODELOPT_NVFP4, 1 << 30, 0, 1, false, FP4D_STATUS_INVALID_ARG, "random fill"},
        /* sizes past 2^63 bytes: not even a file offset */
        {FP4D_CKPT_GPTOSS_MXFP4, 2147483616, 60000, 1, true, FP4D_STATUS_INVALID_ARG, "2^63"},
        /* more tensors than a plan holds */
        {FP4D_CKPT_GPTOSS_MXFP4, 64, 1000000, 10, true, FP4D_STATUS_INVALID_ARG, "tensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fp4d_ckpt_gen_params p;
        fp4d_ckpt_gen_defaults(&p, cases[i].format);
        p.hidden = p.intermediate = cases[i].hidden;
        if (cases[i].experts) p.experts = cases[i].experts;
        p.layers = cases[i].layers;
        p.shards = 1;
        p.random_fill = cases[i].random_fill;
        fp4d_status st = fp4d_ckpt_generate(dir, &p);
        print_message("case %zu: %s\n", i, st ? fp4d_last_error() : "generated");
        assert_int_equal(st, cases[i].st);
        assert_non_null(strstr(fp4d_last_error(), cases[i].says));
        struct stat sb;
        assert_int_not_equal(stat(dir, &sb), 0); /* nothing written, not even the folder */
    }
    rm_tree(parent);
}

/* ---- the CLI ---------------------------------------------------------------------------------------- */

static int run_cli(const char *args)
{
    const char *bin = getenv("FP4DOCTOR_BIN");
    if (!bin) return -1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", bin, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_cli_exit_codes(void **s)
{
    (void)s;
    if (!getenv("FP4DOCTOR_BIN")) skip();
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    char args[4096];
    snprintf(args, sizeof args, "scan %s --threads 2", dir);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "scan %s --scales-only --json %s/report.json", dir, dir);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "%s/report.json", dir);
    json_t *root = json_load_file(args, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "schema_version")), FP4D_SCAN_SCHEMA_VERSION);
    assert_string_equal(json_string_value(json_object_get(root, "format")), "modelopt-nvfp4");
    json_decref(root);
    fp4d_ckpt_plant pl = {FP4D_DEFECT_SCALE_NAN, L0 "mlp.up_proj.weight_scale", 2};
    p.plants = &pl;
    p.num_plants = 1;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    snprintf(args, sizeof args, "scan %s", dir);
    assert_int_equal(run_cli(args), 1);
    snprintf(args, sizeof args, "scan %s/does-not-exist", dir);
    assert_int_equal(run_cli(args), 3);
    /* replay: real weights through the backends; a faulty one must fail, an unknown layer is
     * unreadable input. */
    snprintf(args, sizeof args, "replay %s --layer " L1 "mlp.down_proj --backend ref,cpu", dir);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "replay %s --layer " L0 "self_attn.q_proj.weight --backend faulty-nibble-swap", dir);
    assert_int_equal(run_cli(args), 1);
    snprintf(args, sizeof args, "replay %s --layer model.layers.9.mlp.nothing", dir);
    assert_int_equal(run_cli(args), 3);
    assert_int_equal(run_cli("replay /tmp"), 2);
    assert_int_equal(run_cli("scan"), 2);
    assert_int_equal(run_cli("scan --threads x /tmp"), 2);
    rm_tree(dir);
}

/* One safetensors file of the given tensors (name, dtype, shape; bytes of a repeating pattern). */
typedef struct gen_tensor {
    const char   *name;
    fp4d_st_dtype dtype;
    int           ndim;
    int64_t       shape[4];
} gen_tensor;

static void write_tensors(const char *path, const gen_tensor *t, size_t n)
{
    fp4d_st_writer *w = fp4d_st_writer_new();
    assert_non_null(w);
    uint8_t *bufs[8] = {0};
    for (size_t i = 0; i < n; i++) {
        uint64_t bits = fp4d_st_dtype_bits(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) bits *= (uint64_t)t[i].shape[d];
        const size_t bytes = (size_t)(bits / 8);
        bufs[i] = malloc(bytes ? bytes : 1);
        assert_non_null(bufs[i]);
        for (size_t b = 0; b < bytes; b++) bufs[i][b] = (uint8_t)(0x31 + b % 7); /* small finite codes and scales */
        if (t[i].dtype == FP4D_ST_F32 && bytes == 4) {
            const float one = 1.0f;
            memcpy(bufs[i], &one, 4);
        }
        assert_int_equal(fp4d_st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, bufs[i], bytes), FP4D_STATUS_OK);
    }
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
}

/* Writes the tensors as DIR/FILE and runs `replay` of layer on it with the ref backend. */
static int replay_exit(const char *dir, const char *file, const gen_tensor *t, size_t n, const char *layer)
{
    char path[1024], args[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_tensors(path, t, n);
    snprintf(args, sizeof args, "replay %s --layer %s --backend ref", path, layer);
    return run_cli(args);
}

/* replay on layers whose tensors do not hold what their names promise: unreadable input (exit 3),
 * never a read past a tensor's end (these crashed with SIGSEGV, or read stray bytes). */
static void test_cli_replay_refuses_malformed_layers(void **s)
{
    (void)s;
    if (!getenv("FP4DOCTOR_BIN")) skip();
    char *dir = make_tmpdir();
    const char *down = "model.layers.0.mlp.down_proj";
    /* gpt-oss: 64 fused experts of blocks, scales for one */
    const gen_tensor gptoss[] = {
        {"model.layers.0.mlp.experts.down_proj_blocks", FP4D_ST_U8, 4, {64, 64, 32, 16}},
        {"model.layers.0.mlp.experts.down_proj_scales", FP4D_ST_U8, 3, {1, 64, 32}},
    };
    assert_int_equal(replay_exit(dir, "gptoss.safetensors", gptoss, 2, "model.layers.0.mlp.experts.63.down_proj"), 3);
    /* the one expert the scales cover */
    assert_int_equal(replay_exit(dir, "gptoss.safetensors", gptoss, 2, "model.layers.0.mlp.experts.0.down_proj"), 0);
    /* compressed-tensors codes typed F4: half the bytes of the U8 [64, 128] they stand for */
    const gen_tensor ct_f4[] = {
        {"model.layers.0.mlp.down_proj.weight_scale", FP4D_ST_F8_E4M3, 2, {64, 16}},
        {"model.layers.0.mlp.down_proj.weight_global_scale", FP4D_ST_F32, 0, {0}},
        {"model.layers.0.mlp.down_proj.weight_packed", FP4D_ST_F4, 2, {64, 128}},
    };
    assert_int_equal(replay_exit(dir, "ct_f4.safetensors", ct_f4, 3, down), 3);
    /* ModelOpt: F32 block scales, and a per-tensor scale of four elements */
    const gen_tensor mo_f32[] = {
        {"model.layers.0.mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 128}},
        {"model.layers.0.mlp.down_proj.weight_scale", FP4D_ST_F32, 2, {64, 16}},
        {"model.layers.0.mlp.down_proj.weight_scale_2", FP4D_ST_F32, 0, {0}},
    };
    assert_int_equal(replay_exit(dir, "mo_f32.safetensors", mo_f32, 3, down), 3);
    const gen_tensor mo_s2[] = {
        {"model.layers.0.mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 128}},
        {"model.layers.0.mlp.down_proj.weight_scale", FP4D_ST_F8_E4M3, 2, {64, 16}},
        {"model.layers.0.mlp.down_proj.weight_scale_2", FP4D_ST_F32, 1, {4}},
    };
    assert_int_equal(replay_exit(dir, "mo_s2.safetensors", mo_s2, 3, down), 3);
    rm_tree(dir);
}

/* ---- ModelOpt MXFP4 ----------------------------------------------------------------------------- */

static void write_text_file(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Scans dir and checks the format, the global-scale part of the writer line and the JSON's
 * format and convention; returns the number of findings. */
static size_t check_modelopt_format(const char *dir, const char *format, const char *globals, const char *convention)
{
    fp4d_scan_report *r = scan(dir, false);
    assert_string_equal(fp4d_scan_report_format(r), format);
    char *text = scan_report_text(r);
    assert_non_null(text);
    if (!strstr(text, globals)) fail_msg("no '%s' in:\n%s", globals, text);
    if (!convention && strstr(text, "global scales ")) fail_msg("a global-scale convention claimed:\n%s", text);
    free(text);
    char *js = NULL;
    assert_int_equal(fp4d_scan_report_json(r, &js), FP4D_STATUS_OK);
    json_t *root = json_loads(js, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "format")), format);
    json_t *conv = json_object_get(json_object_get(root, "fingerprint"), "global_scale_convention");
    if (convention) assert_string_equal(json_string_value(conv), convention);
    else assert_true(json_is_null(conv));
    json_decref(root);
    free(js);
    const size_t n = fp4d_scan_report_count(r);
    print_findings(r);
    fp4d_scan_report_free(r);
    return n;
}

/* Two ModelOpt MXFP4 layers (W4A8_MXFP4_FP8), their ue8m0 block scales typed U8 and F8_E8M0. */
static const gen_tensor modelopt_mx_layers[] = {
    {L0 "mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 32}},
    {L0 "mlp.down_proj.weight_scale", FP4D_ST_U8, 2, {64, 2}},
    {L0 "mlp.down_proj.input_scale", FP4D_ST_F32, 0, {0}},
    {L0 "mlp.up_proj.weight", FP4D_ST_U8, 2, {64, 32}},
    {L0 "mlp.up_proj.weight_scale", FP4D_ST_F8_E8M0, 2, {64, 2}},
    {L0 "mlp.up_proj.input_scale", FP4D_ST_F32, 0, {0}},
};

/* A new folder holding modelopt_mx_layers as model.safetensors, whose path goes to path. */
static char *modelopt_mx_dir(char *path, size_t size)
{
    char *dir = make_tmpdir();
    snprintf(path, size, "%s/model.safetensors", dir);
    write_tensors(path, modelopt_mx_layers, sizeof modelopt_mx_layers / sizeof modelopt_mx_layers[0]);
    return dir;
}

/* A ModelOpt MXFP4 checkpoint (W4A8_MXFP4_FP8: X.weight, X.weight_scale ue8m0, no
 * weight_scale_2) shares fp4d_ckpt_format with NVFP4 and was reported as "modelopt-nvfp4";
 * it is "modelopt-mxfp4", by its layers or by its config, and its writer line says that MXFP4
 * has no global scale rather than naming a convention. One NVFP4 layer without a config, or a
 * MIXED_PRECISION config, keep the old names; NVFP4 still has ModelOpt's decode convention. */
static void test_modelopt_mxfp4(void **s)
{
    (void)s;
    char path[1024];
    char *dir = modelopt_mx_dir(path, sizeof path);
    const char *no_global = "(no all-zero blocks seen, MXFP4 has no global scale; confidence none)";
    assert_int_equal(check_modelopt_format(dir, "modelopt-mxfp4", no_global, NULL), 0);

    /* the config naming an MXFP4 algorithm says so too; under MIXED_PRECISION it stays mixed */
    write_text_file(dir, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"W4A8_MXFP4_FP8\"}}");
    assert_int_equal(check_modelopt_format(dir, "modelopt-mxfp4", no_global, NULL), 0);
    write_text_file(dir, "hf_quant_config.json",
                    "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{"
                    "\"" L0 "mlp.down_proj\":{\"quant_algo\":\"W4A8_MXFP4_FP8\"},"
                    "\"" L0 "mlp.up_proj\":{\"quant_algo\":\"W4A8_MXFP4_FP8\"}}}}");
    assert_int_equal(check_modelopt_format(dir, "modelopt-mixed", no_global, NULL), 0);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    assert_int_equal(unlink(path), 0);

    /* one NVFP4 layer among them: "modelopt-nvfp4", and its global scale is ModelOpt's decode one */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const gen_tensor mixed[] = {
        {L0 "mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 32}},
        {L0 "mlp.down_proj.weight_scale", FP4D_ST_U8, 2, {64, 2}},
        {L1 "mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 32}},
        {L1 "mlp.down_proj.weight_scale", FP4D_ST_F8_E4M3, 2, {64, 4}},
        {L1 "mlp.down_proj.weight_scale_2", FP4D_ST_F32, 0, {0}},
    };
    write_tensors(path, mixed, 5);
    check_modelopt_format(dir, "modelopt-nvfp4", "global scales decode; confidence", "decode");
    rm_tree(dir);

    /* a generated ModelOpt NVFP4 checkpoint is unchanged */
    dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    assert_int_equal(check_modelopt_format(dir, "modelopt-nvfp4", "global scales decode; confidence high", "decode"), 0);
    rm_tree(dir);
}

/* Counts dir's error findings of `code` whose message holds `text`, after checking the format. */
static size_t errors_saying(const char *dir, const char *format, fp4d_finding_code code, const char *text)
{
    fp4d_scan_report *r = scan(dir, false);
    assert_string_equal(fp4d_scan_report_format(r), format);
    size_t n = 0;
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        if (f->code == code && strstr(f->message, text)) {
            assert_int_equal(f->severity, FP4D_SCAN_ERROR);
            n++;
        }
    }
    print_findings(r);
    fp4d_scan_report_free(r);
    return n;
}

static size_t config_mismatches(const char *dir, const char *format, const char *text)
{
    return errors_saying(dir, format, FP4D_FINDING_DTYPE_MISMATCH, text);
}

/* A single-format config naming the other FP4 format than the layers hold: engines build the
 * layers from the config and read ue8m0 scale bytes as e4m3 (or the reverse). Each layer's
 * block scale is an error naming the config's algorithm; agreeing configs and MIXED_PRECISION
 * (whose per-layer algorithms the layers follow) give none. A missing static input scale alone
 * is not "cannot be dequantized" (the weights can be), but a layer engines cannot load. */
static void test_modelopt_config_names_the_other_format(void **s)
{
    (void)s;
    char path[1024];
    char *dir = modelopt_mx_dir(path, sizeof path);
    const char *nv_config = "quant_algo is NVFP4 (NVFP4:";
    assert_int_equal(config_mismatches(dir, "modelopt-mxfp4", nv_config), 0);
    write_text_file(dir, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"W4A8_MXFP4_FP8\"}}");
    assert_int_equal(config_mismatches(dir, "modelopt-mxfp4", "quant_algo is"), 0);
    write_text_file(dir, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"group_size\":16}}");
    assert_int_equal(config_mismatches(dir, "modelopt-mxfp4", nv_config), 2);
    /* config.json's quantization_config says the same when it is the only config */
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    assert_int_equal(unlink(path), 0);
    write_text_file(dir, "config.json",
                    "{\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\"}}");
    assert_int_equal(config_mismatches(dir, "modelopt-mxfp4", nv_config), 2);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(unlink(path), 0);

    /* NVFP4 layers under an MXFP4 config */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const gen_tensor nv[] = {
        {L0 "mlp.down_proj.weight", FP4D_ST_U8, 2, {64, 32}},
        {L0 "mlp.down_proj.weight_scale", FP4D_ST_F8_E4M3, 2, {64, 4}},
        {L0 "mlp.down_proj.weight_scale_2", FP4D_ST_F32, 0, {0}},
        {L0 "mlp.down_proj.input_scale", FP4D_ST_F32, 0, {0}},
    };
    write_tensors(path, nv, 4);
    const char *mx_config = "quant_algo is W4A8_MXFP4_FP8 (MXFP4:";
    assert_int_equal(config_mismatches(dir, "modelopt-nvfp4", mx_config), 0);
    write_text_file(dir, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"W4A8_MXFP4_FP8\"}}");
    assert_int_equal(config_mismatches(dir, "modelopt-nvfp4", mx_config), 1);
    write_text_file(dir, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"NVFP4\"}}");
    assert_int_equal(config_mismatches(dir, "modelopt-nvfp4", "quant_algo is"), 0);
    /* NVFP4's static activation scale missing: the weights dequantize, the layer does not load */
    write_tensors(path, nv, 3);
    const char *input_only = "down_proj.input_scale: the config quantizes activations with a static scale";
    assert_int_equal(errors_saying(dir, "modelopt-nvfp4", FP4D_FINDING_MISSING_COMPANION, input_only), 1);
    assert_int_equal(errors_saying(dir, "modelopt-nvfp4", FP4D_FINDING_MISSING_COMPANION, "dequantized"), 0);
    write_tensors(path, nv, 2);
    assert_int_equal(errors_saying(dir, "modelopt-nvfp4", FP4D_FINDING_MISSING_COMPANION,
                                   "down_proj.weight_scale_2, " L0 "mlp.down_proj.input_scale: the layer cannot be "
                                   "dequantized, and the config's static activation scale is missing too"),
                     1);
    write_tensors(path, nv, 4);
    write_text_file(dir, "hf_quant_config.json",
                    "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{"
                    "\"" L0 "mlp.down_proj\":{\"quant_algo\":\"NVFP4\"}}}}");
    assert_int_equal(config_mismatches(dir, "modelopt-mixed", "quant_algo is"), 0);
    rm_tree(dir);
}

/* The findings of code `code` and severity `sev` whose tensor ends in `suffix`. */
static size_t count_code(const fp4d_scan_report *r, fp4d_finding_code code, fp4d_scan_severity sev, const char *suffix)
{
    size_t n = 0;
    const size_t ls = strlen(suffix);
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        const size_t lt = f->tensor ? strlen(f->tensor) : 0;
        n += f->code == code && f->severity == sev && lt >= ls && !strcmp(f->tensor + lt - ls, suffix);
    }
    return n;
}

/* --tp: a K or N the ranks cannot split, a K per rank that splits a scale block (errors), and
 * an NVFP4 K per rank that is not a multiple of 32 (vLLM #48898; a warning), one finding per
 * weight. Two layers, hidden 256 (q 256 rows, k/v 128, o K 256), intermediate 384 (gate/up 384
 * rows, down K 384). */
static void test_tensor_parallel_shards(void **s)
{
    (void)s;
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    p.layers = 2;
    p.hidden = 256;
    p.intermediate = 384;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    const fp4d_finding_code tp = FP4D_FINDING_TP_SHARD;
    const fp4d_scan_severity err = FP4D_SCAN_ERROR, warn = FP4D_SCAN_WARNING;
    static const int degrees[] = {0, 1, 2, 3, 8, 16};
    for (size_t d = 0; d < sizeof degrees / sizeof degrees[0]; d++) {
        fp4d_scan_options opt = {0};
        opt.threads = 2;
        opt.tensor_parallel = degrees[d];
        fp4d_scan_report *r = NULL;
        assert_int_equal(fp4d_scan_path(dir, &opt, &r), FP4D_STATUS_OK);
        size_t all = 0;
        for (size_t i = 0; i < fp4d_scan_report_count(r); i++) all += fp4d_scan_report_get(r, i)->code == tp;
        switch (degrees[d]) {
        case 3: /* 256 and 128 do not divide by 3; 384 does, and down's 128 per rank is fine */
            assert_int_equal(count_code(r, tp, err, "q_proj.weight"), 2);
            assert_int_equal(count_code(r, tp, err, "k_proj.weight"), 2);
            assert_int_equal(count_code(r, tp, err, "v_proj.weight"), 2);
            assert_int_equal(count_code(r, tp, err, "o_proj.weight"), 2);
            assert_int_equal(all, 8);
            break;
        case 8: /* down: 48 per rank, a multiple of 16 but not of 32 */
            assert_int_equal(count_code(r, tp, warn, "down_proj.weight"), 2);
            assert_int_equal(all, 2);
            break;
        case 16: /* down: 24 per rank splits a block; o: 16 per rank, not a multiple of 32 */
            assert_int_equal(count_code(r, tp, err, "down_proj.weight"), 2);
            assert_int_equal(count_code(r, tp, warn, "o_proj.weight"), 2);
            assert_int_equal(all, 4);
            break;
        default: /* none asked for, or every shard is fine (2) */
            assert_int_equal(all, 0);
        }
        print_findings(r);
        fp4d_scan_report_free(r);
    }
    rm_tree(dir);
}

/* Counts TP_SHARD errors of dir at tp, per attention projection (q, k, v, o). */
static void tp_head_errors(const char *dir, int tp, size_t out[4])
{
    fp4d_scan_options opt = {0};
    opt.threads = 2;
    opt.tensor_parallel = tp;
    fp4d_scan_report *r = NULL;
    assert_int_equal(fp4d_scan_path(dir, &opt, &r), FP4D_STATUS_OK);
    static const char *const leaf[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"};
    for (int i = 0; i < 4; i++) out[i] = count_code(r, FP4D_FINDING_TP_SHARD, FP4D_SCAN_ERROR, leaf[i]);
    fp4d_scan_report_free(r);
}

/* --tp with the heads config.json gives: attention projections are cut by whole heads. hidden
 * 96, head_dim 16: 6 query heads (q_proj 96 rows, o_proj K 96), 3 KV heads (k_proj and
 * v_proj 48 rows). At --tp 4 every row count divides, but 6 heads do not and 3 KV heads are
 * neither a multiple of 4 nor 4 of 3: all four are refused. At --tp 6 the KV heads are
 * replicated (one per rank, each on two ranks) and all is well. The multimodal layout
 * (text_config) and a config without head_dim (hidden_size / num_attention_heads) read alike;
 * a config without heads falls back to rows. */
static void test_tensor_parallel_heads(void **s)
{
    (void)s;
    char *dir = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    p.layers = 1, p.hidden = 96, p.head_dim = 16, p.intermediate = 96;
    assert_int_equal(fp4d_ckpt_generate(dir, &p), FP4D_STATUS_OK);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    json_error_t e;
    json_t *root = json_load_file(cfg, 0, &e);
    assert_non_null(root);
    for (int variant = 0; variant < 4; variant++) {
        json_t *c = json_deep_copy(root);
        if (variant == 1) { /* nested, as multimodal models write it */
            json_t *text = json_object();
            static const char *const keys[] = {"num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size"};
            for (int i = 0; i < 4; i++) {
                json_object_set(text, keys[i], json_object_get(c, keys[i]));
                json_object_del(c, keys[i]);
            }
            json_object_set_new(c, "text_config", text);
        }
        if (variant == 2) json_object_del(c, "head_dim"); /* 96 / 6 = 16 */
        if (variant == 3) json_object_del(c, "num_attention_heads"); /* no heads: rows */
        assert_int_equal(json_dump_file(c, cfg, 0), 0);
        json_decref(c);
        size_t at4[4], at6[4];
        tp_head_errors(dir, 4, at4);
        tp_head_errors(dir, 6, at6);
        for (int i = 0; i < 4; i++) {
            /* by rows, only o_proj's 24 columns per rank are refused: they split a scale block */
            if (at4[i] != (variant == 3 && i < 3 ? 0u : 1u)) fail_msg("variant %d, --tp 4, projection %d: %zu", variant, i, at4[i]);
            /* by rows at --tp 6: k and v's 48 rows divide, 8 per rank; by heads, 3 KV heads on 6 ranks */
            if (at6[i] != 0) fail_msg("variant %d, --tp 6, projection %d: %zu", variant, i, at6[i]);
        }
    }
    json_decref(root);
    rm_tree(dir);
}

/* The sha256 of path as 64 hex digits, by coreutils' sha256sum (independent of the library). */
static void sha256_of(const char *path, char hex[65])
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_int_equal(fscanf(p, "%64s", hex), 1);
    assert_int_equal(pclose(p), 0);
}

/* Scans dir with verify_hashes; returns the FILE_HASH_MISMATCH findings and checks the note. */
static size_t hash_mismatches(const char *dir, bool verify, const char *note)
{
    fp4d_scan_options opt = {0};
    opt.threads = 2;
    opt.verify_hashes = verify;
    fp4d_scan_report *r = NULL;
    assert_int_equal(fp4d_scan_path(dir, &opt, &r), FP4D_STATUS_OK);
    size_t n = 0;
    for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
        const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
        if (f->code != FP4D_FINDING_FILE_HASH_MISMATCH) continue;
        assert_int_equal(f->severity, FP4D_SCAN_ERROR);
        assert_string_equal(f->file, "model-00001-of-00002.safetensors");
        n++;
    }
    char *text = scan_report_text(r);
    assert_non_null(text);
    if (note && !strstr(text, note)) fail_msg("no note '%s' in:\n%s", note, text);
    if (!verify && strstr(text, "sha256")) fail_msg("hashes checked without being asked:\n%s", text);
    free(text);
    print_findings(r);
    fp4d_scan_report_free(r);
    return n;
}

/* --verify-hashes: a Hugging Face cache snapshot (links to blobs named by their sha256) and a
 * folder with SHA256SUMS. A byte changed in the data section is invisible to every other check
 * and is a FILE_HASH_MISMATCH naming the file; files with no digest to check are counted. */
static void test_verify_hashes(void **s)
{
    (void)s;
    if (!fp4d_scan_hashes_available()) skip();
    char *src = make_tmpdir(), *hf = make_tmpdir();
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    p.layers = 1;
    assert_int_equal(fp4d_ckpt_generate(src, &p), FP4D_STATUS_OK);
    static const char *const shards[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char path[1024], blob[1024], snap[1024], link[2100], hex[2][65];
    snprintf(path, sizeof path, "%s/blobs", hf);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(snap, sizeof snap, "%s/snapshots", hf);
    assert_int_equal(mkdir(snap, 0755), 0);
    snprintf(snap, sizeof snap, "%s/snapshots/rev", hf);
    assert_int_equal(mkdir(snap, 0755), 0);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", src, shards[i]);
        sha256_of(path, hex[i]);
        snprintf(blob, sizeof blob, "%s/blobs/%s", hf, hex[i]);
        copy_file(path, blob);
        snprintf(link, sizeof link, "%s/%s", snap, shards[i]);
        snprintf(blob, sizeof blob, "../../blobs/%s", hex[i]);
        assert_int_equal(symlink(blob, link), 0);
    }
    assert_int_equal(hash_mismatches(snap, true, "sha256 checked for 2 of 2 file(s)"), 0);
    assert_int_equal(hash_mismatches(src, true, "sha256 checked for 0 of 2 file(s) (the others have no"), 0);

    /* one byte of the first blob's last tensor changed */
    snprintf(blob, sizeof blob, "%s/blobs/%s", hf, hex[0]);
    FILE *f = fopen(blob, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    const int c = fgetc(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    assert_int_equal(fputc(c ^ 0x10, f), c ^ 0x10);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(hash_mismatches(snap, false, NULL), 0);
    assert_int_equal(hash_mismatches(snap, true, "sha256 checked for 2 of 2 file(s)"), 1);

    /* SHA256SUMS: right for both, then wrong for the first */
    snprintf(path, sizeof path, "%s/SHA256SUMS", src);
    for (int wrong = 0; wrong < 2; wrong++) {
        f = fopen(path, "w");
        assert_non_null(f);
        if (wrong) hex[0][0] = hex[0][0] == '0' ? '1' : '0';
        fprintf(f, "%s  %s\n%s *./%s\n", hex[0], shards[0], hex[1], shards[1]);
        assert_int_equal(fclose(f), 0);
        assert_int_equal(hash_mismatches(src, true, "sha256 checked for 2 of 2 file(s)"), (size_t)wrong);
    }
    rm_tree(src);
    rm_tree(hf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_modelopt),
        cmocka_unit_test(test_modelopt_config_names_the_other_format),
        cmocka_unit_test(test_tensor_parallel_shards),
        cmocka_unit_test(test_tensor_parallel_heads),
        cmocka_unit_test(test_verify_hashes),
        cmocka_unit_test(test_cli_replay_refuses_malformed_layers),
        cmocka_unit_test(test_clean_modelopt_moe),
        cmocka_unit_test(test_clean_ct_nvfp4),
        cmocka_unit_test(test_clean_ct_mxfp4),
        cmocka_unit_test(test_clean_gptoss),
        cmocka_unit_test(test_clean_plain),
        cmocka_unit_test(test_clean_other_zero_bytes),
        cmocka_unit_test(test_scale_nan),
        cmocka_unit_test(test_scale_negative_and_zero),
        cmocka_unit_test(test_per_expert_counts),
        cmocka_unit_test(test_global_scales),
        cmocka_unit_test(test_fused_mismatch),
        cmocka_unit_test(test_companions_and_orphans),
        cmocka_unit_test(test_dtype_and_shape),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_exclusions),
        cmocka_unit_test(test_index),
        cmocka_unit_test(test_missing_and_truncated_shards),
        cmocka_unit_test(test_shard_not_in_index),
        cmocka_unit_test(test_shard_name_not_utf8),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_lfs_pointer_shard),
        cmocka_unit_test(test_quant_config),
        cmocka_unit_test(test_generator_refuses_huge_sizes),
        cmocka_unit_test(test_cli_exit_codes),
        cmocka_unit_test(test_modelopt_mxfp4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
