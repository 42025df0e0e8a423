/*
 * The machine-readable outputs against their documents (docs/json-schema.md, docs/cli.md):
 * check's --json / --junit / --html and bench --json, as CI reporters, browsers and scripts
 * read them. hostile.so (hostile_plugin.c) puts markup, quotes and multi-byte text into the
 * reasons it gives and answers bench() with 0 us.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp4doctor/doctor.h"
#include "fp4doctor/io.h"
#include "test_util.h"

static const char *bin(void)
{
    const char *b = getenv("FP4DOCTOR_BIN");
    if (!b) skip();
    return b;
}

/* A scratch folder for one test's files; dir is a template, filled in. */
static void scratch(char *dir) { assert_non_null(mkdtemp(dir)); }

static void drop(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Runs a shell command line (stdout and stderr discarded) and returns its exit code. */
static int run(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char *out;
    const int rc = tu_run_capture(cmd, &out);
    free(out);
    return rc;
}

/* dir/name holds one JSON document; fails naming `what` (the command that wrote it) if not. */
static void assert_json_file(const char *dir, const char *name, const char *what)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("%s: stdout is not the JSON report: %s", what, err.text);
    json_decref(j);
}

/* How many times needle occurs in [from, to). */
static size_t count_between(const char *from, const char *to, const char *needle)
{
    size_t n = 0, len = strlen(needle);
    for (const char *p = from; (p = strstr(p, needle)) && p < to; p += len) n++;
    return n;
}

/* The value of attribute name="..." in the tag starting at tag, as a number. */
static long attr_num(const char *tag, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *end = strchr(tag, '>'), *p = strstr(tag, key);
    assert_non_null(p);
    assert_true(p < end);
    return strtol(p + strlen(key), NULL, 10);
}

/* --device all: each device of one backend is its own row in the matrix, and the HTML names
 * them so everywhere (the per-backend sections, the plots) and lists the devices that disagree,
 * as the text report does. Before, the sections read "faulty-zeros: PASS" and "faulty-zeros:
 * ZEROS" with no device, and the disagreement was missing from the page. */
static void test_html_names_devices_and_disagreements(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cd '%s' && FP4DOCTOR_SIMULATE_DEVICES=2 FP4DOCTOR_FAULTY_DEVICE=1 '%s' check --suite quick "
                         "--include-faulty --backend faulty-zeros --device all --case m1.n192 --no-cache --html r.html "
                         ">r.txt 2>&1",
                         dir, bin()),
                     1);
    char path[600];
    snprintf(path, sizeof path, "%s/r.html", dir);
    char *h = tu_slurp(path, NULL);
    assert_non_null(h);
    assert_non_null(strstr(h, "<summary>faulty-zeros@0: PASS</summary>"));
    assert_non_null(strstr(h, "<summary>faulty-zeros@1: ZEROS</summary>"));
    assert_null(strstr(h, "<summary>faulty-zeros: "));
    assert_non_null(strstr(h, "<title>faulty-zeros@1 M=1: ZEROS</title>")); /* heatmap */
    assert_non_null(strstr(h, ">faulty-zeros@1</text>"));                   /* error plot legend */
    const char *notes = strstr(h, "<ul id=\"device-notes\">");
    assert_non_null(notes);
    assert_non_null(strstr(notes, "<li>faulty-zeros on device 1 differs from device 0"));
    free(h);
    drop(dir);
}

/* Cases --case left out are "-" in the matrix (not run); the heatmap showed them as n/a
 * (UNSUPPORTED: the backend declining them), a different verdict for the same cells. */
static void test_html_heatmap_leaves_unselected_cases_blank(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --html r.html >/dev/null 2>&1",
                         dir, bin()),
                     0);
    char path[600];
    snprintf(path, sizeof path, "%s/r.html", dir);
    char *h = tu_slurp(path, NULL);
    assert_non_null(h);
    const char *map = strstr(h, "<svg id=\"heatmap\""), *map_end = map ? strstr(map, "</svg>") : NULL;
    assert_non_null(map_end);
    assert_int_equal(count_between(map, map_end, "<title>ref M=1: PASS</title>"), 1);
    assert_int_equal(count_between(map, map_end, "<rect"), 1); /* the one case that ran */
    assert_int_equal(count_between(map, map_end, "UNSUPPORTED"), 0);
    free(h);
    drop(dir);
}

/* A report of n backends on one GEMM case, in memory; free with free_report(). */
static fp4d_report *make_report(size_t n)
{
    fp4d_report *rep = calloc(1, sizeof *rep);
    assert_non_null(rep);
    rep->suite = FP4D_SUITE_QUICK;
    rep->seed = 1;
    rep->num_cases = 1;
    rep->cases = calloc(1, sizeof *rep->cases);
    assert_non_null(rep->cases);
    snprintf(rep->cases[0].name, sizeof rep->cases[0].name, "nvfp4.case.m16.n64.k256");
    snprintf(rep->cases[0].group, sizeof rep->cases[0].group, "nvfp4");
    rep->cases[0].op = FP4D_CASE_GEMM;
    rep->cases[0].m = 16, rep->cases[0].n = 64, rep->cases[0].k = 256;
    rep->cases[0].a_type = rep->cases[0].b_type = FP4D_DTYPE_NVFP4;
    rep->cases[0].out_type = FP4D_DTYPE_F32;
    rep->num_backends = n;
    rep->backends = calloc(n, sizeof *rep->backends);
    assert_non_null(rep->backends);
    for (size_t b = 0; b < n; b++) {
        fp4d_backend_report *br = &rep->backends[b];
        snprintf(br->name, sizeof br->name, "plugin:p%02zu", b);
        br->kind = FP4D_BACKEND_KIND_PLUGIN;
        br->device = -1;
        br->verdict = FP4D_VERDICT_PASS;
        snprintf(br->summary, sizeof br->summary, "passed all 1 cases it supports");
        br->results = calloc(1, sizeof *br->results);
        assert_non_null(br->results);
        br->results[0].verdict = FP4D_VERDICT_PASS;
        br->results[0].ran = true;
        br->results[0].elements_checked = 64;
        br->results[0].max_err_ratio = 0.5;
        br->results[0].time_ms = 0.25;
    }
    snprintf(rep->recommendation, sizeof rep->recommendation, "plugin:p00");
    return rep;
}

static void free_report(fp4d_report *rep)
{
    for (size_t b = 0; b < rep->num_backends; b++) free(rep->backends[b].results);
    free(rep->backends);
    free(rep->cases);
    free(rep);
}

/* Writes rep with writer into a string (malloc'd). Not inlined: inlined, gcc 12 took the
 * string open_memstream allocates for a pointer to the local `buf` (-Wdangling-pointer). */
__attribute__((noinline)) static char *written(const fp4d_report *rep, fp4d_status (*writer)(const fp4d_report *, FILE *))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(writer(rep, f), FP4D_STATUS_OK);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* The error plot's legend has a line per backend, 16 px apart; with 30 backends (plugins,
 * --device all) the picture was 380 px tall and the last ten entries were cut off. */
static void test_html_error_plot_holds_its_legend(void **state)
{
    (void)state;
    fp4d_report *rep = make_report(30);
    char *h = written(rep, fp4d_report_write_html);
    const char *svg = strstr(h, "<svg id=\"errplot\"");
    assert_non_null(svg);
    const long height = attr_num(svg, "height");
    const char *last = strstr(svg, ">plugin:p29</text>");
    assert_non_null(last);
    const char *tag = last;
    while (tag > svg && strncmp(tag, "<text", 5)) tag--;
    assert_true(attr_num(tag, "y") < height);
    free(h);
    free_report(rep);
}

/* Numbers that are not finite are null (docs/json-schema.md): json_real() refuses them and
 * json_object_set_new() then dropped "wall_s" and "best_gflops" from the document. */
static void test_json_non_finite_numbers_are_null(void **state)
{
    (void)state;
    fp4d_report *rep = make_report(2);
    rep->wall_s = NAN;
    rep->backends[0].best_gflops = INFINITY;
    rep->backends[1].best_gflops = 2.5;
    rep->backends[1].results[0].gflops = NAN;
    char *s = written(rep, fp4d_report_write_json);
    json_error_t err;
    json_t *j = json_loads(s, 0, &err);
    if (!j) fail_msg("report JSON does not parse: %s", err.text);
    assert_true(json_is_null(json_object_get(j, "wall_s")));
    json_t *backends = json_object_get(j, "backends");
    assert_true(json_is_null(json_object_get(json_array_get(backends, 0), "best_gflops")));
    assert_true(json_real_value(json_object_get(json_array_get(backends, 1), "best_gflops")) == 2.5);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "results"), 1), "gflops")));
    json_decref(j);
    free(s);
    free_report(rep);
}

/* The JUnit counts match the children, every testcase has name/classname/time, and words from
 * a plugin (markup, quotes, ampersands, an escape sequence, UTF-8) come out escaped in the
 * XML and the HTML and intact in the JSON. */
static void test_hostile_plugin_words_stay_text(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cd '%s' && '%s' check --suite quick --plugin '%s' --backend ref,plugin:hostile,plugin:hostile-down "
                         "--no-cache --json r.json --junit r.xml --html r.html >r.txt 2>&1",
                         dir, bin(), FP4D_HOSTILE_PLUGIN),
                     1);
    char path[600];
    snprintf(path, sizeof path, "%s/r.xml", dir);
    char *x = tu_slurp(path, NULL);
    assert_non_null(x);
    for (const unsigned char *p = (const unsigned char *)x; *p; p++)
        if (*p < 0x20 && *p != '\n') fail_msg("control character 0x%02x in the JUnit XML", *p);
    assert_null(strstr(x, "<script"));
    assert_null(strstr(x, "<img"));
    assert_non_null(strstr(x, "no MXFP4: &lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt; &apos;q&apos; \xc3\xa9\xe2\x82\xac"));
    long total[4] = {0};
    size_t suites = 0;
    for (const char *ts = x; (ts = strstr(ts, "<testsuite ")); ts++, suites++) {
        const char *end = strstr(ts, "</testsuite>");
        assert_non_null(end);
        const long tests = attr_num(ts, "tests"), failures = attr_num(ts, "failures"), errors = attr_num(ts, "errors"),
                   skipped = attr_num(ts, "skipped");
        assert_int_equal(tests, (long)count_between(ts, end, "<testcase "));
        assert_int_equal(failures, (long)count_between(ts, end, "<failure "));
        assert_int_equal(errors, (long)count_between(ts, end, "<error "));
        assert_int_equal(skipped, (long)count_between(ts, end, "<skipped "));
        for (const char *tc = ts; (tc = strstr(tc, "<testcase ")) && tc < end; tc++) {
            const char *close = strchr(tc, '>');
            for (const char *a = "name=\"", *const *k = (const char *const[]){"classname=\"", "time=\"", NULL}; a;
                 a = *k ? *k++ : NULL) {
                const char *at = strstr(tc, a);
                assert_true(at && at < close);
            }
        }
        total[0] += tests, total[1] += failures, total[2] += errors, total[3] += skipped;
    }
    assert_int_equal(suites, 3);
    assert_int_equal(attr_num(strstr(x, "<testsuites"), "tests"), total[0]);
    assert_int_equal(attr_num(strstr(x, "<testsuites"), "failures"), total[1]);
    assert_int_equal(attr_num(strstr(x, "<testsuites"), "errors"), total[2]);
    assert_int_equal(attr_num(strstr(x, "<testsuites"), "skipped"), total[3]);
    free(x);

    snprintf(path, sizeof path, "%s/r.html", dir);
    char *h = tu_slurp(path, NULL);
    assert_non_null(h);
    assert_null(strstr(h, "<script"));
    assert_null(strstr(h, "<img"));
    assert_null(strstr(h, "\033"));
    assert_non_null(strstr(h, "down: &lt;img src=x onerror=alert(1)&gt; &amp; &quot;"));
    free(h);

    snprintf(path, sizeof path, "%s/r.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("report JSON does not parse: %s", err.text);
    json_t *b = json_array_get(json_object_get(j, "backends"), 2);
    assert_string_equal(json_string_value(json_object_get(b, "name")), "plugin:hostile-down");
    assert_false(json_is_true(json_object_get(b, "available")));
    assert_non_null(strstr(json_string_value(json_object_get(b, "unavailable_reason")), "<img src=x onerror=alert(1)>"));
    json_decref(j);
    drop(dir);
}

/* bench --json: a backend whose bench() answers 0 us has infinite TFLOP/s and GB/s; the row
 * lost "tflops" and "weight_gbps" (json_real() refuses Inf), though an OK row has them all.
 * They are null now. */
static void test_bench_json_non_finite_numbers_are_null(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cd '%s' && FP4DOCTOR_PLUGINS='%s' '%s' bench --backend plugin:hostile --shapes 64x64 --m 1 "
                         "--no-moe --no-quantize --repeats 2 --json b.json >/dev/null 2>&1",
                         dir, FP4D_HOSTILE_PLUGIN, bin()),
                     0);
    char path[600];
    snprintf(path, sizeof path, "%s/b.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fail_msg("bench JSON does not parse: %s", err.text);
    json_t *rows = json_object_get(j, "results");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(rows, i);
        assert_string_equal(json_string_value(json_object_get(r, "status")), "OK");
        assert_true(json_real_value(json_object_get(r, "median_us")) == 0.0);
        assert_non_null(json_object_get(r, "tflops"));
        assert_true(json_is_null(json_object_get(r, "tflops")));
        assert_non_null(json_object_get(r, "weight_gbps"));
        assert_true(json_is_null(json_object_get(r, "weight_gbps")));
        assert_int_equal(json_array_size(json_object_get(r, "round_median_us")), 2);
    }
    json_decref(j);
    drop(dir);
}

/* Two reports into one destination: `--json - --junit -` printed JSON and XML interleaved on
 * stdout (neither parses) with exit 0; `--json F --html F` kept whichever was renamed last.
 * Now a usage error, before anything runs or is written. */
static void test_two_reports_one_destination_is_a_usage_error(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --json - --junit - "
                         ">out.txt 2>err.txt",
                         dir, bin()),
                     2);
    assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --json r --html r "
                         ">/dev/null 2>&1",
                         dir, bin()),
                     2);
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/r", dir);
    assert_int_not_equal(stat(path, &st), 0);
    snprintf(path, sizeof path, "%s/err.txt", dir);
    char *e = tu_slurp(path, NULL);
    assert_non_null(e);
    assert_non_null(strstr(e, "--json '-' and --junit '-' are one file"));
    free(e);
    /* one file under two names: by text these differed, and the second report replaced the
     * first with exit 0 (a file not made yet, one that exists, a link to it, stdout) */
    const char *same_pairs[][2] = {{"r.json", "./r.json"}, {"-", "/proc/self/fd/1"}};
    for (size_t i = 0; i < sizeof same_pairs / sizeof same_pairs[0]; i++)
        assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --json '%s' "
                             "--junit '%s' >out.txt 2>/dev/null",
                             dir, bin(), same_pairs[i][0], same_pairs[i][1]),
                         2);
    snprintf(path, sizeof path, "%s/r.json", dir);
    assert_int_not_equal(stat(path, &st), 0);
    assert_int_equal(run("cd '%s' && echo old >kept.json && ln -s kept.json link.json && '%s' check --suite quick "
                         "--backend ref --case m1.n192 --no-cache --json link.json --html kept.json >/dev/null 2>&1",
                         dir, bin()),
                     2);
    snprintf(path, sizeof path, "%s/kept.json", dir);
    e = tu_slurp(path, NULL);
    assert_non_null(e);
    assert_string_equal(e, "old\n");
    free(e);
    /* distinct files still work, the JSON on stdout alone */
    assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --json - --junit r.xml "
                         ">out.json 2>/dev/null",
                         dir, bin()),
                     0);
    assert_json_file(dir, "out.json", "check --json - --junit r.xml");
    drop(dir);
}

/* --json /dev/stdout (or /proc/self/fd/1) with stdout redirected to a file opened a second
 * descriptor at offset 0 and wrote the JSON over the text report: a file that was neither, exit
 * 0. It is stdout now, as "-" is (the text goes to stderr). An empty report name was found
 * out only after the whole run; now it is a usage error before anything runs. */
static void test_report_on_stdout_by_any_name(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    const char *names[] = {"/dev/stdout", "/proc/self/fd/1"};
    char path[600];
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(run("cd '%s' && '%s' check --suite quick --backend ref --case m1.n192 --no-cache --json %s "
                             ">out.json 2>err.txt",
                             dir, bin(), names[i]),
                         0);
        assert_json_file(dir, "out.json", names[i]);
        snprintf(path, sizeof path, "%s/err.txt", dir);
        char *e = tu_slurp(path, NULL);
        assert_non_null(e);
        assert_non_null(strstr(e, "recommended:")); /* the text report, on stderr */
        free(e);
    }
    assert_int_equal(run("cd '%s' && '%s' bench --backend cpu --shapes 256x256 --m 1 --repeats 1 --no-moe --no-quantize "
                         "--json /dev/stdout >bench.json 2>/dev/null",
                         dir, bin()),
                     0);
    assert_json_file(dir, "bench.json", "bench --json /dev/stdout");
    /* an empty name: refused before the run, nothing on stdout */
    const char *empty[] = {"check --suite quick --backend ref --case m1.n192 --no-cache --json ''",
                           "check --suite quick --backend ref --case m1.n192 --no-cache --html=",
                           "bench --backend cpu --shapes 256x256 --m 1 --repeats 1 --no-moe --no-quantize --json ''"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(run("cd '%s' && '%s' %s >out.txt 2>err.txt", dir, bin(), empty[i]), 2);
        snprintf(path, sizeof path, "%s/out.txt", dir);
        size_t len = 1;
        free(tu_slurp(path, &len));
        assert_int_equal(len, 0);
        snprintf(path, sizeof path, "%s/err.txt", dir);
        char *e = tu_slurp(path, NULL);
        assert_non_null(strstr(e, "cannot be an empty name"));
        free(e);
    }
    drop(dir);
}

/* A report path naming a plugin library the run loads (--plugin, FP4DOCTOR_PLUGINS) replaced the
 * library with the report, exit 0. Now a usage error, and the library is left as it was. */
static void test_report_never_replaces_a_plugin(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    assert_int_equal(run("cp '%s' '%s/p.so'", FP4D_HOSTILE_PLUGIN, dir), 0);
    const char *report_opts[] = {"--json", "--junit", "--html"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(run("cd '%s' && '%s' check --suite quick --plugin ./p.so --backend ref --case m1.n192 --no-cache "
                             "%s p.so >/dev/null 2>err.txt",
                             dir, bin(), report_opts[i]),
                         2);
    assert_int_equal(run("cd '%s' && FP4DOCTOR_PLUGINS=\"$PWD/p.so\" '%s' check --suite quick --backend ref --case m1.n192 "
                         "--no-cache --json ./p.so >/dev/null 2>err.txt",
                         dir, bin()),
                     2);
    assert_int_equal(run("cd '%s' && FP4DOCTOR_PLUGINS=\"$PWD/p.so\" '%s' bench --backend cpu --shapes 64x64 --m 1 "
                         "--no-moe --no-quantize --repeats 1 --json p.so >/dev/null 2>err.txt",
                         dir, bin()),
                     2);
    assert_true(tu_output_contains(dir, "err.txt", "the report would replace it"));
    assert_int_equal(run("cmp '%s' '%s/p.so'", FP4D_HOSTILE_PLUGIN, dir), 0);
    drop(dir);
}

/* A plugin that cannot be loaded is an unreadable input (exit 3) for every command that loads
 * plugins; gemm ran on a built-in backend with exit 0, bench said "internal error" (4). */
static void test_unloadable_plugin_is_unreadable_input(void **state)
{
    (void)state;
    char dir[] = "/tmp/fp4d_reportsXXXXXX";
    scratch(dir);
    /* operands for gemm: a [2, 32] f32 tensor, and it quantized */
    float a[2 * 32];
    for (int i = 0; i < 2 * 32; i++) a[i] = (float)(i % 7) - 3.0f;
    fp4d_st_writer *w = fp4d_st_writer_new();
    assert_non_null(w);
    const int64_t shape[2] = {2, 32};
    assert_int_equal(fp4d_st_writer_add(w, "a", FP4D_ST_F32, 2, shape, a, sizeof a), FP4D_STATUS_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/in.safetensors", dir);
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    assert_int_equal(run("cd '%s' && '%s' quantize in.safetensors q.safetensors", dir, bin()), 0);
    const char *gemm = "gemm --backend cpu in.safetensors:a q.safetensors:a out.safetensors";
    assert_int_equal(run("cd '%s' && '%s' %s", dir, bin(), gemm), 0);
    const char *commands[] = {
        "backends",
        "check --suite quick --backend ref --case m1.n192 --no-cache",
        "bench --backend cpu --shapes 64x64 --m 1 --no-moe --no-quantize --repeats 1",
        gemm,
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        assert_int_equal(run("cd '%s' && FP4DOCTOR_PLUGINS=/nonexistent/p.so '%s' %s >/dev/null 2>err.txt", dir, bin(),
                             commands[i]),
                         3);
    assert_true(tu_output_contains(dir, "err.txt", "/nonexistent/p.so"));
    drop(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_html_names_devices_and_disagreements),
        cmocka_unit_test(test_html_heatmap_leaves_unselected_cases_blank),
        cmocka_unit_test(test_html_error_plot_holds_its_legend),
        cmocka_unit_test(test_json_non_finite_numbers_are_null),
        cmocka_unit_test(test_hostile_plugin_words_stay_text),
        cmocka_unit_test(test_bench_json_non_finite_numbers_are_null),
        cmocka_unit_test(test_two_reports_one_destination_is_a_usage_error),
        cmocka_unit_test(test_report_on_stdout_by_any_name),
        cmocka_unit_test(test_report_never_replaces_a_plugin),
        cmocka_unit_test(test_unloadable_plugin_is_unreadable_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
