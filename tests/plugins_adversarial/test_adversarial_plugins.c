/*
 * test_adversarial_plugins.c - the doctor against plugins written by an "outsider" from
 * plugin.h alone, each with one published-style bug (adv_gemm_plugin.c) or one misuse of
 * the plugin interface (adv_abuse_plugin.c).
 *
 * Everything goes through the real CLI, as a user would run it: one `fp4doctor check
 * --suite quick --json` with every adv-* plugin loaded by repeated --plugin flags (the
 * children run in parallel), then one check per verdict and cause expected. The abuse
 * plugins must each be refused with a one-line reason and exit code 3, never a crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "test_util.h"

#ifndef FP4D_ADV_DIR
#error "FP4D_ADV_DIR (where the plugins are built) must be defined"
#endif

static char tmpdir[256];
static json_t *report;  /* the JSON report of the big run */
static int report_rc;   /* its exit code */

/* ---- running the CLI ---- */

typedef struct run_result {
    int  rc;    /* exit code, or 128 + signal */
    char *out;  /* stdout, malloc'd */
    char *err;  /* stderr, malloc'd */
} run_result;

/* Runs `fp4doctor ARGS` through the shell (every path here is ours, without quotes). */
static run_result run_cli(const char *env, const char *fmt, ...)
{
    char args[8192], cmd[9200], out[300], err[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const char *bin = getenv("FP4DOCTOR_BIN");
    snprintf(out, sizeof out, "%s/out.txt", tmpdir);
    snprintf(err, sizeof err, "%s/err.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s XDG_CACHE_HOME=%s NO_COLOR=1 '%s' %s >%s 2>%s", env ? env : "", tmpdir,
             bin ? bin : "fp4doctor", args, out, err);
    int st = system(cmd);
    run_result r = {0, tu_slurp_or_empty(out), tu_slurp_or_empty(err)};
    if (WIFEXITED(st)) r.rc = WEXITSTATUS(st);
    else if (WIFSIGNALED(st)) r.rc = 128 + WTERMSIG(st);
    else r.rc = -1;
    return r;
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

/* ---- the report ---- */

static json_t *backend_record(const char *name)
{
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(report, "backends"), i, b)
    {
        if (!strcmp(json_string_value(json_object_get(b, "name")), name)) return b;
    }
    return NULL;
}

static const char *str_or_empty(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Verdict, cause ("" = none; NULL = any) and a substring of the summary (NULL = any). */
static void expect(const char *name, const char *verdict, const char *cause, const char *summary_has)
{
    assert_non_null(report);
    json_t *b = backend_record(name);
    if (!b) fail_msg("%s is missing from the report", name);
    const char *v = str_or_empty(b, "verdict"), *c = str_or_empty(b, "cause"), *s = str_or_empty(b, "summary");
    if (strcmp(v, verdict) != 0 || (cause && strcmp(c, cause) != 0) || (summary_has && !strstr(s, summary_has)))
        fail_msg("%s: expected %s / %s%s%s, got %s / %s (%s)", name, verdict, cause ? (cause[0] ? cause : "(none)") : "*",
                 summary_has ? " with summary containing " : "", summary_has ? summary_has : "", v,
                 c[0] ? c : "(none)", s);
}

/* Number of cases of `name` with verdict v, and (if detail_has) whose detail contains it. */
static int count_cases(const char *name, const char *v, const char *detail_has)
{
    size_t i;
    json_t *r;
    int n = 0;
    json_array_foreach(json_object_get(report, "results"), i, r)
    {
        if (strcmp(str_or_empty(r, "backend"), name) || strcmp(str_or_empty(r, "verdict"), v)) continue;
        if (detail_has && !strstr(str_or_empty(r, "detail"), detail_has)) continue;
        n++;
    }
    return n;
}

/* ---- setup: one check over every adv-* plugin ---- */

static const char *const adv_plugins[] = {
    "adv_correct",       "adv_alpha_ignored",  "adv_alpha_inverted",  "adv_always_linear", "adv_always_swizzled",
    "adv_b_transposed",  "adv_block32",        "adv_nibble_a",        "adv_ue8m0",         "adv_fp16_accum",
    "adv_m_window",      "adv_nan_rows",       "adv_zero_half_tile",  "adv_skip_half_tile", "adv_stale_k64",
    "adv_oob_row",       "adv_clobber_input",  "adv_gemm_unsupported", "adv_no_mxfp4",     "adv_abort",
    "adv_hang",          "adv_racy",           "adv_pad_stride",      "adv_swz_perm",      "adv_k_tail",
    "adv_moe_empty",     "adv_n_tail",         "adv_bf16_trunc",      "adv_linear_a",      "adv_ue8m0_b",
    "adv_block32_b",     "adv_block32_stride",
};

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fp4d_adv_XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    char args[8192] = "check --suite quick --no-cache --json ";
    size_t len = strlen(args);
    len += (size_t)snprintf(args + len, sizeof args - len, "%s/report.json --backend ", tmpdir);
    for (size_t i = 0; i < sizeof adv_plugins / sizeof *adv_plugins; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s", adv_plugins[i]);
        for (char *p = name; *p; p++)
            if (*p == '_') *p = '-';
        len += (size_t)snprintf(args + len, sizeof args - len, "%splugin:%s", i ? "," : "", name);
    }
    for (size_t i = 0; i < sizeof adv_plugins / sizeof *adv_plugins; i++)
        len += (size_t)snprintf(args + len, sizeof args - len, " --plugin %s/%s.so", FP4D_ADV_DIR, adv_plugins[i]);
    run_result r = run_cli(NULL, "%s", args);
    report_rc = r.rc;
    char path[300];
    snprintf(path, sizeof path, "%s/report.json", tmpdir);
    json_error_t e;
    report = json_load_file(path, 0, &e);
    if (!report) fprintf(stderr, "no JSON report (rc %d): %s\n%s\n", r.rc, e.text, r.err);
    run_free(&r);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(report);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- the bugs: verdict and cause ---- */

static void test_report_and_exit_code(void **state)
{
    (void)state;
    assert_non_null(report);
    assert_int_equal(report_rc, 1); /* some backend failed */
    assert_int_equal(json_integer_value(json_object_get(report, "exit_code")), 1);
    /* A correct kernel (the control, or the one that honestly skips MXFP4) is recommended,
     * never a broken one. */
    const char *rec = str_or_empty(report, "recommended");
    if (strcmp(rec, "plugin:adv-correct") && strcmp(rec, "plugin:adv-no-mxfp4"))
        fail_msg("recommended '%s'", rec);
}

static void test_correct_control(void **state)
{
    (void)state;
    expect("plugin:adv-correct", "PASS", "", NULL);
    assert_int_equal(count_cases("plugin:adv-correct", "UNSUPPORTED", "no quantizer"), 3);
}

static void test_decoding_mistakes(void **state)
{
    (void)state;
    expect("plugin:adv-alpha-ignored", "WRONG", "global_scale_missing", NULL);
    expect("plugin:adv-alpha-inverted", "WRONG", "global_scale_inverted", NULL);
    expect("plugin:adv-always-linear", "WRONG", "scale_layout_linear", NULL);
    expect("plugin:adv-always-swizzled", "WRONG", "scale_layout_swizzled", NULL);
    expect("plugin:adv-b-transposed", "WRONG", "b_transposed", NULL);
    expect("plugin:adv-block32", "WRONG", "block_size_32", NULL);
    expect("plugin:adv-ue8m0", "WRONG", "scale_decoded_as_ue8m0", NULL);
    /* A-only nibble swap: on FP4 x FP4 it cannot be told from a B-only one; the doctor
     * must not pretend it can. */
    expect("plugin:adv-nibble-a", "WRONG", "nibble_swap", "A or B");
    /* One operand only: the doctor names it. */
    expect("plugin:adv-linear-a", "WRONG", "scale_layout_linear", "on A (activations)");
    expect("plugin:adv-ue8m0-b", "WRONG", "scale_decoded_as_ue8m0", "on B (weights)");
    expect("plugin:adv-block32-b", "WRONG", "block_size_32", "on B (weights)");
    /* 32-wide blocks in the kernel, the true K/16 scale stride from the host. */
    expect("plugin:adv-block32-stride", "WRONG", "block_size_32", NULL);
    /* ... and every failing case is explained, not just the ones where both agree. */
    assert_int_equal(count_cases("plugin:adv-block32-stride", "WRONG", "32-element blocks"),
                     count_cases("plugin:adv-block32-stride", "WRONG", NULL));
}

static void test_accumulation_and_rounding(void **state)
{
    (void)state;
    /* fp16 accumulation overflows to Inf on grid inputs (|products| up to 2688^2). */
    expect("plugin:adv-fp16-accum", "INF", "low_precision_accumulation", NULL);
    /* bf16 output by truncation: inaccurate, but not an accumulation problem. */
    json_t *b = backend_record("plugin:adv-bf16-trunc");
    assert_non_null(b);
    assert_string_equal(str_or_empty(b, "verdict"), "INACCURATE");
    assert_string_not_equal(str_or_empty(b, "cause"), "low_precision_accumulation");
    assert_true(count_cases("plugin:adv-bf16-trunc", "INACCURATE", "round to nearest even") >= 3);
}

static void test_row_and_m_patterns(void **state)
{
    (void)state;
    expect("plugin:adv-m-window", "ZEROS", "m_dependent", "fails for M in 129..257");
    expect("plugin:adv-nan-rows", "NAN", NULL, NULL);
    expect("plugin:adv-zero-half-tile", "WRONG", "tile_rows_missing", "whole rows 64..");
    expect("plugin:adv-skip-half-tile", "UNWRITTEN", "tile_rows_missing", "whole rows 64..");
    expect("plugin:adv-stale-k64", "UNWRITTEN", NULL, "not one element was written");
    assert_int_equal(count_cases("plugin:adv-stale-k64", "UNWRITTEN", NULL), 2); /* K = 272, 160 */
}

static void test_memory_and_process_failures(void **state)
{
    (void)state;
    expect("plugin:adv-oob-row", "OOB_WRITE", "", "sentinel bytes");
    expect("plugin:adv-clobber-input", "OOB_WRITE", "", "wrote into its input");
    expect("plugin:adv-abort", "CRASH", "", "signal 6");
    assert_int_equal(count_cases("plugin:adv-abort", "CRASH", NULL), 1); /* only K = 4096 */
    assert_true(count_cases("plugin:adv-abort", "PASS", NULL) >= 15);  /* the run went on */
    expect("plugin:adv-hang", "TIMEOUT", "", "m7.");
    assert_true(count_cases("plugin:adv-hang", "PASS", NULL) >= 15);
    expect("plugin:adv-racy", "NONDETERMINISTIC", "", NULL);
}

static void test_interface_answers(void **state)
{
    (void)state;
    /* supports() said yes, gemm() said UNSUPPORTED: a broken promise, not an answer. */
    expect("plugin:adv-gemm-unsupported", "ERROR", "", "supports() accepted this case");
    /* An honest no, with its reason shown on each MXFP4 case. */
    expect("plugin:adv-no-mxfp4", "PASS", "", NULL);
    assert_int_equal(count_cases("plugin:adv-no-mxfp4", "UNSUPPORTED", "no ue8m0 scale path"), 2);
}

static void test_bugs_without_a_cause_code(void **state)
{
    (void)state;
    /* Not one of DESIGN.md's causes: the verdict must be right and no wrong cause named. */
    expect("plugin:adv-pad-stride", "WRONG", "unknown", "lin.");
    expect("plugin:adv-swz-perm", "WRONG", "unknown", NULL);
    expect("plugin:adv-k-tail", "WRONG", "unknown", NULL);
    expect("plugin:adv-moe-empty", "WRONG", "unknown", "moe.");
    expect("plugin:adv-n-tail", "WRONG", NULL, NULL);
}

/* ---- plugin loading ---- */

/* Loading `plugin` must fail with exit code 3 and a message containing `needle`. */
static void expect_refused(const char *plugin, const char *needle)
{
    run_result r = run_cli(NULL, "check --suite quick --no-cache --plugin %s/%s.so", FP4D_ADV_DIR, plugin);
    if (r.rc != 3 || !strstr(r.err, needle))
        fail_msg("%s: expected exit 3 and '%s', got %d: %s", plugin, needle, r.rc, r.err);
    /* One line of reason from fp4doctor itself, naming the file. */
    assert_non_null(strstr(r.err, plugin));
    run_free(&r);
}

static void test_abuse_refused(void **state)
{
    (void)state;
    expect_refused("abuse_api99", "api_version 99");
    expect_refused("abuse_api0", "api_version 0");
    expect_refused("abuse_null_gemm", "gemm");
    expect_refused("abuse_empty_name", "name ''");
    expect_refused("abuse_space_name", "'my kernel'");
    expect_refused("abuse_dup_name", "already registered");
    expect_refused("abuse_init_refuses", "refused to load");
    expect_refused("abuse_null_name", "name");
    expect_refused("abuse_null_iface", "NULL");
    /* The plugin's own log line comes first. */
    run_result r = run_cli(NULL, "check --no-cache --plugin %s/abuse_init_refuses.so", FP4D_ADV_DIR);
    assert_non_null(strstr(r.err, "needs libfoo.so.3"));
    run_free(&r);
}

static void test_bad_files_refused(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/not_a_plugin.so", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("this is not an ELF file\n", f);
    fclose(f);
    run_result r = run_cli(NULL, "check --no-cache --plugin %s", path);
    assert_int_equal(r.rc, 3);
    assert_non_null(strstr(r.err, "cannot load it as a shared library"));
    run_free(&r);
    r = run_cli(NULL, "check --no-cache --plugin %s/does_not_exist.so", tmpdir);
    assert_int_equal(r.rc, 3);
    assert_non_null(strstr(r.err, "does_not_exist.so"));
    run_free(&r);
}

static void test_name_clash_between_plugins(void **state)
{
    (void)state;
    run_result r = run_cli(NULL, "check --no-cache --plugin %s/adv_correct.so --plugin %s/abuse_clash.so", FP4D_ADV_DIR,
                           FP4D_ADV_DIR);
    assert_int_equal(r.rc, 3);
    assert_non_null(strstr(r.err, "'plugin:adv-correct' is already registered"));
    run_free(&r);
}

static void test_env_var_and_flags(void **state)
{
    (void)state;
    /* FP4DOCTOR_PLUGINS (colon-separated) and --plugin together. */
    char env[1200];
    snprintf(env, sizeof env, "FP4DOCTOR_PLUGINS=%s/adv_correct.so:%s/adv_block32.so", FP4D_ADV_DIR, FP4D_ADV_DIR);
    run_result r = run_cli(env, "backends --json --plugin %s/abuse_prefixed.so", FP4D_ADV_DIR);
    assert_int_equal(r.rc, 0);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    assert_non_null(j);
    int seen = 0;
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(j, "backends"), i, b)
    {
        const char *n = str_or_empty(b, "name");
        /* The prefix a plugin spelled itself is not doubled. */
        if (!strcmp(n, "plugin:adv-correct") || !strcmp(n, "plugin:adv-block32") || !strcmp(n, "plugin:adv-prefixed"))
            seen++;
        assert_null(strstr(n, "plugin:plugin:"));
    }
    assert_int_equal(seen, 3);
    json_decref(j);
    run_free(&r);

    /* The env var reaches the children too: a check of one case by a plugin from it. */
    r = run_cli(env, "check --no-cache --suite quick --case m7.n192 --backend plugin:adv-block32 --json -");
    assert_int_equal(r.rc, 1);
    j = json_loads(r.out, 0, &e);
    assert_non_null(j);
    json_t *rec = json_array_get(json_object_get(j, "backends"), 0);
    assert_string_equal(str_or_empty(rec, "verdict"), "WRONG");
    assert_string_equal(str_or_empty(rec, "cause"), "block_size_32");
    json_decref(j);
    run_free(&r);

    /* The same library under two spellings of its path (--plugin and the env var) is
     * loaded once, not refused as a duplicate. */
    snprintf(env, sizeof env, "FP4DOCTOR_PLUGINS=%s/../so/adv_correct.so", FP4D_ADV_DIR);
    r = run_cli(env, "backends --json --plugin %s/adv_correct.so", FP4D_ADV_DIR);
    assert_int_equal(r.rc, 0);
    j = json_loads(r.out, 0, &e);
    assert_non_null(j);
    seen = 0;
    json_array_foreach(json_object_get(j, "backends"), i, b) seen += !strcmp(str_or_empty(b, "name"), "plugin:adv-correct");
    assert_int_equal(seen, 1);
    json_decref(j);
    run_free(&r);

    /* A bad plugin in the env var is refused like one on the command line. */
    snprintf(env, sizeof env, "FP4DOCTOR_PLUGINS=%s/abuse_api99.so", FP4D_ADV_DIR);
    r = run_cli(env, "check --no-cache");
    assert_int_equal(r.rc, 3);
    assert_non_null(strstr(r.err, "api_version 99"));
    run_free(&r);
}

static void test_unavailable_backend(void **state)
{
    (void)state;
    /* init() says UNSUPPORTED with a reason: reported, not a failure (exit 0). */
    run_result r = run_cli(NULL, "check --no-cache --suite quick --plugin %s/abuse_unavailable.so --backend "
                                 "plugin:adv-unavailable --json -",
                           FP4D_ADV_DIR);
    assert_int_equal(r.rc, 0);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    assert_non_null(j);
    json_t *rec = json_array_get(json_object_get(j, "backends"), 0);
    assert_string_equal(str_or_empty(rec, "verdict"), "UNSUPPORTED");
    assert_non_null(strstr(str_or_empty(rec, "summary"), "needs an SM120 GPU"));
    json_decref(j);
    run_free(&r);
}

/* A child that retires (its CUDA context lost; simulated here for every case by the test
 * switch) closes its backend first, and a close that crashes must not cost the cases it never
 * started: the runner took a retired child's crash between cases for a crash of the backend
 * and marked every remaining case CRASH. */
static void test_retired_child_crashing_in_close(void **state)
{
    (void)state;
    run_result r = run_cli("FP4DOCTOR_CHILD_RETIRE_AFTER=1",
                           "check --no-cache --suite quick --plugin %s/adv_free_crash.so --backend "
                           "plugin:adv-free-crash --case nvfp4xnvfp4.swz.grid --json -",
                           FP4D_ADV_DIR);
    assert_int_equal(r.rc, 0);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    assert_non_null(j);
    json_t *rec = json_array_get(json_object_get(j, "backends"), 0);
    assert_string_equal(str_or_empty(rec, "verdict"), "PASS");
    json_decref(j);
    run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_and_exit_code),
        cmocka_unit_test(test_correct_control),
        cmocka_unit_test(test_decoding_mistakes),
        cmocka_unit_test(test_accumulation_and_rounding),
        cmocka_unit_test(test_row_and_m_patterns),
        cmocka_unit_test(test_memory_and_process_failures),
        cmocka_unit_test(test_interface_answers),
        cmocka_unit_test(test_bugs_without_a_cause_code),
        cmocka_unit_test(test_abuse_refused),
        cmocka_unit_test(test_bad_files_refused),
        cmocka_unit_test(test_name_clash_between_plugins),
        cmocka_unit_test(test_env_var_and_flags),
        cmocka_unit_test(test_unavailable_backend),
        cmocka_unit_test(test_retired_child_crashing_in_close),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
