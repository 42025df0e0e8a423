/*
 * fp4doctor check: every FP4 GEMM backend against the exact reference (doctor.h), and the
 * hidden `__child` subcommand the doctor re-runs itself with.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/gpu_info.h"
#include "backend/verdict_cache.h"
#include "cli.h"
#include "fp4doctor/doctor.h"
#include "internal.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor check [OPTIONS]\n\n"
            "Runs every FP4 GEMM backend on a suite of cases in child processes, compares each\n"
            "output with the exact reference and prints a backend x case-group matrix, a verdict\n"
            "and a cause per backend, and the recommended backend.\n\n"
            "  --backend LIST     comma-separated backends (default: all; see fp4doctor backends)\n"
            "  --suite NAME       quick | default | full (default: default)\n"
            "  --device all|N     GPU backends: every device, or device N (default: 0)\n"
            "  --include-faulty   also check the deliberately broken faulty-* backends\n"
            "  --plugin LIB.so    load a backend plugin (repeatable; also FP4DOCTOR_PLUGINS)\n"
            "  --json FILE|-      write the JSON report (docs/json-schema.md); '-' = stdout\n"
            "  --junit FILE       write a JUnit XML report\n"
            "  --html FILE        write a self-contained HTML report\n"
            "  --no-cache         do not record verdicts in the verdict cache\n"
            "  --seed N           input seed (default 1)\n"
            "  --jobs N           child processes at once (default: number of CPUs)\n"
            "  --case TEXT        only cases whose name contains TEXT (repeatable)\n"
            "  --list-cases       print the suite's cases (those --case selects) and exit\n\n"
            "Environment: FP4DOCTOR_TIMEOUT_SCALE multiplies every time limit (default 1);\n"
            "NO_COLOR disables colour.\n"
            "Exit: 0 every checked backend passed (or is unsupported here), 1 a backend failed,\n"
            "2 usage error, 3 a plugin could not be loaded or a report could not be written,\n"
            "4 internal error.\n");
}

/* --opt VALUE or --opt=VALUE. Returns the value or NULL (and *i advanced past it). */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

typedef struct progress_state {
    bool enabled;
} progress_state;

static void on_progress(void *user, const char *backend, int device, size_t done, size_t total)
{
    progress_state *p = user;
    if (!p->enabled) return;
    fprintf(stderr, "\r\033[K[%zu/%zu] %s%s", done, total, backend, device >= 0 ? " (GPU)" : "");
    fflush(stderr);
}

int cmd_check(int argc, char **argv)
{
    const char *cmd = "check";
    fp4d_doctor_options opt;
    memset(&opt, 0, sizeof opt);
    opt.suite = FP4D_SUITE_DEFAULT;
    opt.seed = 1;
    opt.device = -1;
    const char *json_path = NULL, *junit_path = NULL, *html_path = NULL, *backend_list = NULL;
    bool no_cache = false, list_cases = false;
    const char **plugins = calloc((size_t)argc + 1, sizeof *plugins);
    const char **filters = calloc((size_t)argc + 1, sizeof *filters);
    char **names = NULL;
    int rc = FP4D_EXIT_OK;
    if (!plugins || !filters) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        bool missing = false;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            goto out;
        } else if (!strcmp(a, "--include-faulty")) {
            opt.include_faulty = true;
        } else if (!strcmp(a, "--no-cache")) {
            no_cache = true;
        } else if (!strcmp(a, "--list-cases")) {
            list_cases = true;
        } else if ((v = opt_value(argc, argv, &i, "--backend", &missing))) {
            backend_list = v;
        } else if ((v = opt_value(argc, argv, &i, "--suite", &missing))) {
            if (!fp4d_suite_from_name(v, &opt.suite)) {
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "unknown suite '%s' (quick, default or full)", v);
                goto out;
            }
        } else if ((v = opt_value(argc, argv, &i, "--device", &missing))) {
            uint64_t d;
            if (!strcmp(v, "all")) opt.device = FP4D_DEVICE_ALL;
            else if (cli_parse_u64(v, &d) && d < 1024) opt.device = (int)d;
            else {
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--device takes 'all' or a device number, not '%s'", v);
                goto out;
            }
        } else if ((v = opt_value(argc, argv, &i, "--plugin", &missing))) {
            plugins[opt.num_plugins++] = v;
        } else if ((v = opt_value(argc, argv, &i, "--json", &missing))) {
            json_path = v;
        } else if ((v = opt_value(argc, argv, &i, "--junit", &missing))) {
            junit_path = v;
        } else if ((v = opt_value(argc, argv, &i, "--html", &missing))) {
            html_path = v;
        } else if ((v = opt_value(argc, argv, &i, "--seed", &missing))) {
            /* within int64: the JSON report writes the seed as an integer, signed in jansson */
            if (!cli_parse_u64(v, &opt.seed) || opt.seed > (uint64_t)INT64_MAX) {
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--seed takes an integer in 0..%lld, not '%s'", (long long)INT64_MAX, v);
                goto out;
            }
        } else if ((v = opt_value(argc, argv, &i, "--jobs", &missing))) {
            uint64_t j;
            if (!cli_parse_u64(v, &j) || j == 0 || j > 1024) {
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--jobs takes a number from 1 to 1024, not '%s'", v);
                goto out;
            }
            opt.jobs = (int)j;
        } else if ((v = opt_value(argc, argv, &i, "--case", &missing))) {
            filters[opt.num_case_filters++] = v;
        } else if (missing) {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "%s needs a value", a);
            goto out;
        } else {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see fp4doctor check --help)", a);
            goto out;
        }
    }
    /* --list-cases runs nothing, so it writes no report: a --json beside it was dropped in
     * silence, and a script waiting for the file found none */
    if (list_cases && (json_path || junit_path || html_path)) {
        rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--list-cases prints the cases and runs nothing: %s has no report to write",
                      json_path ? "--json" : junit_path ? "--junit" : "--html");
        goto out;
    }
    /* Two reports into one destination: on stdout ("-") they came out interleaved, neither
     * valid JSON nor XML, with exit 0; into one file the last rename won in silence. By file,
     * not by text: "r.json" and "./r.json", "-" and /dev/stdout are one destination. */
    const char *report_opt[3] = {"--json", "--junit", "--html"}, *report_path[3] = {json_path, junit_path, html_path};
    for (int a = 0; a < 3; a++) {
        if (!report_path[a]) continue;
        for (int b = a + 1; b < 3; b++)
            if (report_path[b] && cli_same_destination(report_path[a], report_path[b])) {
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "%s '%s' and %s '%s' are one file: give each report its own file",
                              report_opt[a], report_path[a], report_opt[b], report_path[b]);
                goto out;
            }
        rc = cli_refuse_plugin_output(cmd, report_opt[a], report_path[a], plugins, opt.num_plugins);
        if (rc != FP4D_EXIT_OK) goto out;
    }
    opt.plugins = plugins;
    opt.case_filter = filters;
    opt.self_exe = "/proc/self/exe";

    if (list_cases) {
        fp4d_case *cases;
        size_t n;
        if (fp4d_suite_cases(opt.suite, &cases, &n) != FP4D_STATUS_OK) {
            rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "%s", fp4d_last_error());
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            if (fp4d_case_selected(&opt, &cases[i])) printf("%-8s %s\n", cases[i].group, cases[i].name);
        free(cases);
        goto out;
    }

    /* A GPU that is not there is a usage error, as in `bench`: every GPU backend would be
     * UNSUPPORTED ("GPU 3 does not exist") and the run exit 0, a false green in CI. With no
     * GPU at all the GPU backends are UNSUPPORTED for that reason instead. */
    if (opt.device >= 0 && fp4d_env_knob("FP4DOCTOR_SIMULATE_DEVICES", 0, 1000000, 0) <= 0) {
        fp4d_cuda_info ci;
        fp4d_cuda_query(&ci);
        if (ci.device_count > 0 && opt.device >= ci.device_count) {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "GPU %d does not exist (this machine has %d)", opt.device,
                          ci.device_count);
            goto out;
        }
    }

    /* Load plugins and check backend names here, so that a typo is a usage error. */
    fp4d_registry_options ro = {opt.include_faulty, plugins, opt.num_plugins};
    const fp4d_status registry_status = fp4d_registry_init(&ro);
    if (registry_status != FP4D_STATUS_OK) {
        rc = cli_registry_failed(cmd, registry_status);
        goto out;
    }
    if (backend_list) {
        /* an empty item is a mistake to report, not to drop (as `bench` does) */
        const size_t len = strlen(backend_list);
        if (len == 0 || backend_list[0] == ',' || backend_list[len - 1] == ',' || strstr(backend_list, ",,")) {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--backend takes comma-separated names with no empty item, not '%s'",
                          backend_list);
            goto out;
        }
        size_t count = 1;
        for (const char *p = backend_list; *p; p++) count += *p == ',';
        names = calloc(count + 1, sizeof *names);
        char *copy = strdup(backend_list);
        if (!names || !copy) {
            free(copy);
            rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
            goto out;
        }
        size_t n = 0;
        for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (!fp4d_registry_find(tok)) {
                bool faulty = !strncmp(tok, "faulty-", 7) && !opt.include_faulty;
                rc = cli_fail(FP4D_EXIT_USAGE, cmd, "unknown backend '%s'%s (see fp4doctor backends)", tok,
                              faulty ? "; faulty backends need --include-faulty" : "");
                free(copy);
                goto out;
            }
            /* each backend once: a name given twice ran its cases twice and printed two rows */
            for (size_t k = 0; k < n; k++)
                if (!strcmp(names[k], tok)) {
                    rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--backend names '%s' twice", tok);
                    free(copy);
                    goto out;
                }
            names[n++] = strdup(tok);
        }
        free(copy);
        opt.backends = (const char **)names;
        opt.num_backends = n;
        if (n == 0) {
            rc = cli_fail(FP4D_EXIT_USAGE, cmd, "--backend needs at least one name");
            goto out;
        }
    }

    FILE *json_f = NULL, *junit_f = NULL, *html_f = NULL;
    if (json_path && !(json_f = cli_open_output(cmd, json_path))) { rc = cli_output_failure(); goto out; }
    if (junit_path && !(junit_f = cli_open_output(cmd, junit_path))) { cli_discard_output(json_f); rc = cli_output_failure(); goto out; }
    if (html_path && !(html_f = cli_open_output(cmd, html_path))) {
        cli_discard_output(json_f), cli_discard_output(junit_f);
        rc = cli_output_failure();
        goto out;
    }

    progress_state ps = {isatty(STDERR_FILENO) != 0};
    opt.progress = on_progress;
    opt.progress_user = &ps;
    fp4d_verdict_cache_disable(no_cache);

    fp4d_report rep;
    if (fp4d_doctor_run(&opt, &rep) != FP4D_STATUS_OK) {
        if (ps.enabled) fprintf(stderr, "\r\033[K");
        rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "%s", fp4d_last_error());
        cli_discard_output(json_f), cli_discard_output(junit_f), cli_discard_output(html_f);
        goto out;
    }
    if (ps.enabled) fprintf(stderr, "\r\033[K");
    FILE *text_out = (json_f == stdout || junit_f == stdout || html_f == stdout) ? stderr : stdout;
    fp4d_report_write_text(&rep, text_out, cli_use_color(text_out));
    if (json_f) fp4d_report_write_json(&rep, json_f);
    if (junit_f) fp4d_report_write_junit(&rep, junit_f);
    if (html_f) fp4d_report_write_html(&rep, html_f);
    const int written = cli_close_output(json_f) | cli_close_output(junit_f) | cli_close_output(html_f);
    if (!no_cache && fp4d_report_update_cache(&rep) != FP4D_STATUS_OK)
        fprintf(stderr, "fp4doctor check: warning: %s\n", fp4d_last_error());
    rc = fp4d_report_exit_code(&rep);
    if (written != FP4D_EXIT_OK && rc == FP4D_EXIT_OK) rc = FP4D_EXIT_INPUT; /* a report not written */
    fp4d_report_free(&rep);
out:
    if (names)
        for (size_t k = 0; names[k]; k++) free(names[k]);
    free(names);
    free(plugins);
    free(filters);
    return rc;
}

int cmd_child(int argc, char **argv) { return fp4d_doctor_child_main(argc, argv, 3); }
