/*
 * Reports of a check: the terminal matrix, --json (docs/json-schema.md), --junit, --html.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_internal.h"
#include "internal.h"

#define FP4D_REPORT_SCHEMA_VERSION 1

/* ---- shared helpers ---- */

static const char *short_verdict(fp4d_verdict v)
{
    switch (v) {
    case FP4D_VERDICT_INACCURATE: return "INACC";
    case FP4D_VERDICT_UNWRITTEN: return "UNWRIT";
    case FP4D_VERDICT_OOB_WRITE: return "OOB";
    case FP4D_VERDICT_NONDETERMINISTIC: return "NONDET";
    case FP4D_VERDICT_UNSUPPORTED: return "n/a";
    default: return fp4d_verdict_name(v);
    }
}

/* Colours: green pass, yellow "works but", red broken, grey not applicable. */
static const char *ansi_for(fp4d_verdict v)
{
    if (v == FP4D_VERDICT_PASS) return "\033[32m";
    if (v == FP4D_VERDICT_INACCURATE || v == FP4D_VERDICT_NONDETERMINISTIC) return "\033[33m";
    if (v == FP4D_VERDICT_UNSUPPORTED) return "\033[90m";
    return "\033[1;31m";
}

static const char *html_color(fp4d_verdict v)
{
    if (v == FP4D_VERDICT_PASS) return "#2e9d4a";
    if (v == FP4D_VERDICT_INACCURATE) return "#e0b020";
    if (v == FP4D_VERDICT_NONDETERMINISTIC) return "#e08020";
    if (v == FP4D_VERDICT_UNSUPPORTED) return "#c8c8c8";
    if (v == FP4D_VERDICT_ERROR) return "#8a5a9e";
    if (v == FP4D_VERDICT_CRASH || v == FP4D_VERDICT_TIMEOUT) return "#5a1010";
    return "#d03030";
}

/* Distinct groups in case order. */
static size_t groups_of(const fp4d_report *rep, const char **groups, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < rep->num_cases; i++) {
        bool seen = false;
        for (size_t g = 0; g < n && !seen; g++) seen = !strcmp(groups[g], rep->cases[i].group);
        if (!seen && n < cap) groups[n++] = rep->cases[i].group;
    }
    return n;
}

/* A case that --case left out: it has no verdict to show, only the placeholder the runner
 * fills every result with. */
static bool not_selected(const fp4d_case_result *r)
{
    return r->verdict == FP4D_VERDICT_UNSUPPORTED && !strcmp(r->detail, "not selected");
}

/* Worst verdict of backend b over the cases of a group; COUNT when the group has no case
 * that was selected. */
static fp4d_verdict group_verdict(const fp4d_report *rep, const fp4d_backend_report *br, const char *group)
{
    fp4d_verdict w = FP4D_VERDICT_COUNT;
    for (size_t i = 0; i < rep->num_cases; i++) {
        if (strcmp(rep->cases[i].group, group)) continue;
        if (not_selected(&br->results[i])) continue;
        w = w == FP4D_VERDICT_COUNT ? br->results[i].verdict : fp4d_verdict_worst(w, br->results[i].verdict);
    }
    return w;
}

static void backend_label(const fp4d_backend_report *br, char *out, size_t size)
{
    if (br->device >= 0) snprintf(out, size, "%s@%d", br->name, br->device);
    else snprintf(out, size, "%s", br->name);
}

/* ---- terminal ---- */

/* Distinct GPU devices among the report's rows, in order of first appearance. */
static size_t devices_of(const fp4d_report *rep, int *devs, size_t cap)
{
    size_t nd = 0;
    for (size_t b = 0; b < rep->num_backends; b++) {
        int d = rep->backends[b].device;
        if (d < 0) continue;
        bool seen = false;
        for (size_t i = 0; i < nd; i++) seen |= devs[i] == d;
        if (!seen && nd < cap) devs[nd++] = d;
    }
    return nd;
}

/* Matrix rows of the backends on device `device` (-1: host backends). */
static void write_matrix_rows(const fp4d_report *rep, FILE *f, bool color, int device, const char **groups,
                              size_t ng, size_t namew)
{
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        if (br->device != device) continue;
        char l[96];
        backend_label(br, l, sizeof l);
        fprintf(f, "%-*s ", (int)namew, l);
        for (size_t g = 0; g < ng; g++) {
            fp4d_verdict v = group_verdict(rep, br, groups[g]);
            const char *txt = v == FP4D_VERDICT_COUNT ? "-" : short_verdict(v);
            if (color && v != FP4D_VERDICT_COUNT) fprintf(f, " %s%-7s\033[0m", ansi_for(v), txt);
            else fprintf(f, " %-7s", txt);
        }
        const char *vn = fp4d_verdict_name(br->verdict);
        if (color) fprintf(f, "  %s%-16s\033[0m %s\n", ansi_for(br->verdict), vn, fp4d_cause_name(br->cause));
        else fprintf(f, "  %-16s %s\n", vn, fp4d_cause_name(br->cause));
    }
}

fp4d_status fp4d_report_write_text(const fp4d_report *rep, FILE *f, bool color)
{
    const char *groups[64];
    size_t ng = groups_of(rep, groups, 64);
    size_t namew = 8;
    for (size_t b = 0; b < rep->num_backends; b++) {
        char l[96];
        backend_label(&rep->backends[b], l, sizeof l);
        if (strlen(l) > namew) namew = strlen(l);
    }
    fprintf(f, "fp4doctor check: suite %s, %zu cases x %zu backends, seed %llu, %.1f s\n\n",
            fp4d_suite_name(rep->suite), rep->num_cases, rep->num_backends,
            (unsigned long long)rep->seed, rep->wall_s);
    fprintf(f, "%-*s ", (int)namew, "backend");
    for (size_t g = 0; g < ng; g++) fprintf(f, " %-7s", groups[g]);
    fprintf(f, "  %-16s %s\n", "verdict", "cause");
    /* Host backends first, then one matrix per GPU device (--device all), so that a device
     * whose verdicts differ from its siblings' stands out row for row. */
    int devs[FP4D_MAX_REPORT_DEVICES];
    size_t nd = devices_of(rep, devs, FP4D_MAX_REPORT_DEVICES);
    write_matrix_rows(rep, f, color, -1, groups, ng, namew);
    for (size_t d = 0; d < nd; d++) {
        if (nd > 1) fprintf(f, "-- device %d --\n", devs[d]);
        write_matrix_rows(rep, f, color, devs[d], groups, ng, namew);
    }
    fprintf(f, "\n");
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        char l[96];
        backend_label(br, l, sizeof l);
        fprintf(f, "%-*s %s\n", (int)namew, l, br->summary);
    }
    bool any_diff = false;
    for (size_t b = 0; b < rep->num_backends; b++) any_diff |= rep->backends[b].device_note[0] != '\0';
    if (any_diff) {
        fprintf(f, "\ndevices that disagree:\n");
        for (size_t b = 0; b < rep->num_backends; b++)
            if (rep->backends[b].device_note[0]) fprintf(f, "  %s\n", rep->backends[b].device_note);
    }
    fprintf(f, "\nrecommended: %s\n", rep->recommendation);
    return FP4D_STATUS_OK;
}

/* ---- JSON ---- */

/* JSON has no Inf/NaN, and jansson's json_real() answers NULL for them, which
 * json_object_set_new() drops: the field would vanish instead of reading null (as the
 * results' numbers do, json.c). */
static json_t *finite_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *report_to_json(const fp4d_report *rep)
{
    json_t *j = json_object();
    json_object_set_new(j, "schema_version", json_integer(FP4D_REPORT_SCHEMA_VERSION));
    json_object_set_new(j, "tool", json_string("fp4doctor"));
    json_object_set_new(j, "version", json_string(fp4d_version_string()));
    json_object_set_new(j, "command", json_string("check"));
    json_object_set_new(j, "suite", json_string(fp4d_suite_name(rep->suite)));
    json_object_set_new(j, "seed", json_integer((json_int_t)rep->seed));
    json_object_set_new(j, "wall_s", finite_or_null(rep->wall_s));
    json_object_set_new(j, "env", fp4d_env_to_json());
    json_t *cases = json_array();
    for (size_t i = 0; i < rep->num_cases; i++) json_array_append_new(cases, fp4d_case_to_json(&rep->cases[i]));
    json_object_set_new(j, "cases", cases);
    json_t *backends = json_array(), *results = json_array();
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        json_t *bj = json_object();
        json_object_set_new(bj, "name", json_string(br->name));
        json_object_set_new(bj, "description", json_string(br->description));
        json_object_set_new(bj, "kind", json_string(fp4d_backend_kind_name(br->kind)));
        json_object_set_new(bj, "device", br->device >= 0 ? json_integer(br->device) : json_null());
        json_object_set_new(bj, "device_differs", json_boolean(br->device_note[0] != '\0'));
        json_object_set_new(bj, "device_note", br->device_note[0] ? json_string(br->device_note) : json_null());
        json_object_set_new(bj, "available", json_boolean(br->unavailable[0] == '\0'));
        json_object_set_new(bj, "unavailable_reason", br->unavailable[0] ? json_string(br->unavailable) : json_null());
        json_object_set_new(bj, "verdict", json_string(fp4d_verdict_name(br->verdict)));
        json_object_set_new(bj, "cause", br->cause == FP4D_CAUSE_NONE ? json_null() : json_string(fp4d_cause_name(br->cause)));
        json_object_set_new(bj, "summary", json_string(br->summary));
        json_object_set_new(bj, "best_gflops", finite_or_null(br->best_gflops));
        json_array_append_new(backends, bj);
        for (size_t i = 0; i < rep->num_cases; i++) {
            json_t *rj = fp4d_result_to_json(&br->results[i]);
            json_object_set_new(rj, "backend", json_string(br->name));
            json_object_set_new(rj, "device", br->device >= 0 ? json_integer(br->device) : json_null());
            json_object_set_new(rj, "case", json_string(rep->cases[i].name));
            json_object_set_new(rj, "group", json_string(rep->cases[i].group));
            json_array_append_new(results, rj);
        }
    }
    json_object_set_new(j, "backends", backends);
    json_object_set_new(j, "results", results);
    json_object_set_new(j, "recommended", rep->recommended[0] ? json_string(rep->recommended) : json_null());
    json_object_set_new(j, "recommendation", json_string(rep->recommendation));
    json_object_set_new(j, "exit_code", json_integer(fp4d_report_exit_code(rep)));
    return j;
}

fp4d_status fp4d_report_write_json(const fp4d_report *rep, FILE *f)
{
    json_t *j = report_to_json(rep);
    FP4D_RETURN_ERROR_IF(!j, NOMEM, "out of memory");
    int rc = json_dumpf(j, f, JSON_INDENT(2));
    json_decref(j);
    fputc('\n', f);
    FP4D_RETURN_ERROR_IF(rc != 0, IO, "cannot write the JSON report");
    return FP4D_STATUS_OK;
}

/* ---- XML/HTML escaping ---- */

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            /* Control characters are not allowed in XML 1.0. */
            if ((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t') fputc(' ', f);
            else fputc(*s, f);
        }
    }
}

/* ---- JUnit ---- */

fp4d_status fp4d_report_write_junit(const fp4d_report *rep, FILE *f)
{
    size_t tests = 0, failures = 0, errors = 0, skipped = 0;
    for (size_t b = 0; b < rep->num_backends; b++)
        for (size_t i = 0; i < rep->num_cases; i++) {
            fp4d_verdict v = rep->backends[b].results[i].verdict;
            tests++;
            if (v == FP4D_VERDICT_UNSUPPORTED) skipped++;
            else if (v == FP4D_VERDICT_CRASH || v == FP4D_VERDICT_TIMEOUT || v == FP4D_VERDICT_ERROR) errors++;
            else if (v != FP4D_VERDICT_PASS) failures++;
        }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<testsuites name=\"fp4doctor\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" time=\"%.3f\">\n",
            tests, failures, errors, skipped, rep->wall_s);
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        char label[96];
        backend_label(br, label, sizeof label);
        size_t bf = 0, be = 0, bs = 0;
        double bt = 0;
        for (size_t i = 0; i < rep->num_cases; i++) {
            fp4d_verdict v = br->results[i].verdict;
            bt += br->results[i].time_ms * 1e-3;
            if (v == FP4D_VERDICT_UNSUPPORTED) bs++;
            else if (v == FP4D_VERDICT_CRASH || v == FP4D_VERDICT_TIMEOUT || v == FP4D_VERDICT_ERROR) be++;
            else if (v != FP4D_VERDICT_PASS) bf++;
        }
        fprintf(f, "  <testsuite name=\"fp4doctor.");
        esc(f, label);
        fprintf(f, "\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" time=\"%.3f\">\n",
                rep->num_cases, bf, be, bs, bt);
        for (size_t i = 0; i < rep->num_cases; i++) {
            const fp4d_case_result *r = &br->results[i];
            fprintf(f, "    <testcase classname=\"fp4doctor.");
            esc(f, label);
            fprintf(f, "\" name=\"");
            esc(f, rep->cases[i].name);
            fprintf(f, "\" time=\"%.6f\"", r->time_ms * 1e-3);
            if (r->verdict == FP4D_VERDICT_PASS) {
                fprintf(f, "/>\n");
                continue;
            }
            const char *tag = r->verdict == FP4D_VERDICT_UNSUPPORTED ? "skipped"
                              : (r->verdict == FP4D_VERDICT_CRASH || r->verdict == FP4D_VERDICT_TIMEOUT ||
                                 r->verdict == FP4D_VERDICT_ERROR) ? "error" : "failure";
            fprintf(f, ">\n      <%s message=\"%s%s%s: ", tag, fp4d_verdict_name(r->verdict),
                    r->cause != FP4D_CAUSE_NONE ? " / " : "", fp4d_cause_name(r->cause));
            esc(f, r->detail);
            fprintf(f, "\"");
            if (strcmp(tag, "skipped")) fprintf(f, " type=\"%s\"", fp4d_verdict_name(r->verdict));
            fprintf(f, "/>\n    </testcase>\n");
        }
        fprintf(f, "  </testsuite>\n");
    }
    fprintf(f, "</testsuites>\n");
    return FP4D_STATUS_OK;
}

/* ---- HTML ---- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                      "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

static void html_heatmap(const fp4d_report *rep, FILE *f)
{
    int64_t ms[256];
    size_t nm = 0;
    for (size_t i = 0; i < rep->num_cases; i++) {
        if (!fp4d_case_has_m(&rep->cases[i])) continue;
        bool seen = false;
        for (size_t t = 0; t < nm && !seen; t++) seen = ms[t] == rep->cases[i].m;
        if (!seen && nm < 256) ms[nm++] = rep->cases[i].m;
    }
    qsort(ms, nm, sizeof *ms, cmp_i64);
    const int left = 190, top = 40, cw = 44, ch = 24;
    int width = left + (int)nm * cw + 20, height = top + (int)rep->num_backends * ch + 20;
    fprintf(f, "<svg id=\"heatmap\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", width, height);
    fprintf(f, "<text x=\"%d\" y=\"14\" font-weight=\"bold\">worst verdict per backend and M (all GEMM cases with that M)</text>\n", left);
    for (size_t t = 0; t < nm; t++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%lld</text>\n", left + (int)t * cw + cw / 2,
                top - 6, (long long)ms[t]);
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        char label[96];
        backend_label(br, label, sizeof label);
        int y = top + (int)b * ch;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", left - 8, y + ch / 2 + 4);
        esc(f, label);
        fprintf(f, "</text>\n");
        for (size_t t = 0; t < nm; t++) {
            /* cases --case left out are blank here as in the matrix ("-"), not "n/a": they were
             * not run, which is not the backend declining them */
            fp4d_verdict w = FP4D_VERDICT_COUNT;
            for (size_t i = 0; i < rep->num_cases; i++)
                if (fp4d_case_has_m(&rep->cases[i]) && rep->cases[i].m == ms[t] && !not_selected(&br->results[i]))
                    w = w == FP4D_VERDICT_COUNT ? br->results[i].verdict : fp4d_verdict_worst(w, br->results[i].verdict);
            if (w == FP4D_VERDICT_COUNT) continue;
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#fff\"><title>",
                    left + (int)t * cw, y, cw, ch, html_color(w));
            esc(f, label);
            fprintf(f, " M=%lld: %s</title></rect>\n", (long long)ms[t], fp4d_verdict_name(w));
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"8\" fill=\"#fff\">%s</text>\n",
                    left + (int)t * cw + cw / 2, y + ch / 2 + 3, short_verdict(w));
        }
    }
    fprintf(f, "</svg>\n");
}

static void html_error_plot(const fp4d_report *rep, FILE *f)
{
    /* x: log2 K, y: log10 of the max error as a multiple of the f32 bound (1 = the bound). */
    const int left = 60, top = 30, w = 640, h = 300;
    double kmin = 1e300, kmax = 0;
    for (size_t i = 0; i < rep->num_cases; i++)
        if (fp4d_case_has_m(&rep->cases[i])) {
            double k = (double)rep->cases[i].k;
            if (k < kmin) kmin = k;
            if (k > kmax) kmax = k;
        }
    if (kmin > kmax) kmin = 16, kmax = 32;
    double x0 = log2(kmin) - 0.5, x1 = log2(kmax) + 0.5, y0 = -4, y1 = 8;
    /* tall enough for the legend too (16 px a backend): with more than about 20 backends
     * (plugins, --device all) its tail fell outside the picture */
    int height = top + h + 50, legend_end = top + 20 + (int)rep->num_backends * 16;
    if (legend_end > height) height = legend_end;
    fprintf(f, "<svg id=\"errplot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", left + w + 200, height);
    fprintf(f, "<text x=\"%d\" y=\"16\" font-weight=\"bold\">max error / f32-accumulation bound vs K (log scales; "
               "above the dashed line = beyond the bound)</text>\n", left);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", left, top, w, h);
    for (int e = (int)y0; e <= (int)y1; e += 2) {
        double y = top + h - (e - y0) / (y1 - y0) * h;
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", left - 4, y + 4, e);
    }
    double ybound = top + h - (0 - y0) / (y1 - y0) * h;
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d03030\" stroke-dasharray=\"5,4\"/>\n",
            left, left + w, ybound, ybound);
    for (int e = (int)ceil(x0); e <= (int)floor(x1); e++) {
        double x = left + (e - x0) / (x1 - x0) * w;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x, top + h + 14, 1 << e);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">K</text>\n", left + w / 2, top + h + 32);
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        const char *col = palette[b % FP4D_ARRAY_LEN(palette)];
        char label[96];
        backend_label(br, label, sizeof label);
        for (size_t i = 0; i < rep->num_cases; i++) {
            const fp4d_case_result *r = &br->results[i];
            if (!fp4d_case_has_m(&rep->cases[i]) || r->elements_checked == 0) continue;
            double ratio = r->max_err_ratio > 1e-4 ? r->max_err_ratio : 1e-4;
            double ly = log10(ratio);
            if (ly > y1) ly = y1;
            double x = left + (log2((double)rep->cases[i].k) - x0) / (x1 - x0) * w + ((double)b - rep->num_backends / 2.0) * 2.0;
            double y = top + h - (ly - y0) / (y1 - y0) * h;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" fill-opacity=\"0.75\"><title>", x, y, col);
            esc(f, label);
            fputc(' ', f);
            esc(f, rep->cases[i].name);
            fprintf(f, ": %.3g x bound</title></circle>\n", r->max_err_ratio);
        }
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">",
                left + w + 14, top + 4 + (int)b * 16, col, left + w + 30, top + 13 + (int)b * 16);
        esc(f, label);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
}

fp4d_status fp4d_report_write_html(const fp4d_report *rep, FILE *f)
{
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<title>fp4doctor check report</title>\n<style>\n"
               "body{font-family:sans-serif;margin:24px;color:#222}"
               "table{border-collapse:collapse;margin:12px 0}"
               "td,th{border:1px solid #ccc;padding:3px 8px;font-size:12px;text-align:left}"
               "th{background:#f0f0f0}.v{color:#fff;font-weight:bold;text-align:center}"
               "details{margin:6px 0}code{font-size:11px}td.s{max-width:560px;font-size:11px}\n</style></head><body>\n");
    fprintf(f, "<h1>fp4doctor check</h1>\n<p>suite <b>%s</b>, %zu cases &times; %zu backends, seed %llu, %.1f s. "
               "fp4doctor %s.</p>\n", fp4d_suite_name(rep->suite), rep->num_cases, rep->num_backends,
            (unsigned long long)rep->seed, rep->wall_s, fp4d_version_string());
    fprintf(f, "<p><b>Recommended:</b> ");
    esc(f, rep->recommendation);
    fprintf(f, "</p>\n<h2>Compatibility matrix</h2>\n<table id=\"matrix\"><tr><th>backend</th>");
    const char *groups[64];
    size_t ng = groups_of(rep, groups, 64);
    for (size_t g = 0; g < ng; g++) {
        fprintf(f, "<th>");
        esc(f, groups[g]);
        fprintf(f, "</th>");
    }
    fprintf(f, "<th>verdict</th><th>cause</th><th>summary</th></tr>\n");
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        char label[96];
        backend_label(br, label, sizeof label);
        fprintf(f, "<tr><td>");
        esc(f, label);
        fprintf(f, "</td>");
        for (size_t g = 0; g < ng; g++) {
            fp4d_verdict v = group_verdict(rep, br, groups[g]);
            if (v == FP4D_VERDICT_COUNT) fprintf(f, "<td>-</td>");
            else fprintf(f, "<td class=\"v\" style=\"background:%s\" title=\"%s\">%s</td>", html_color(v),
                         fp4d_verdict_name(v), short_verdict(v));
        }
        fprintf(f, "<td class=\"v\" style=\"background:%s\">%s</td><td>%s</td><td class=\"s\">", html_color(br->verdict),
                fp4d_verdict_name(br->verdict), fp4d_cause_name(br->cause));
        esc(f, br->summary);
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</table>\n");
    /* as the text report lists them: a backend whose verdicts differ between GPUs */
    bool any_diff = false;
    for (size_t b = 0; b < rep->num_backends; b++) any_diff |= rep->backends[b].device_note[0] != '\0';
    if (any_diff) {
        fprintf(f, "<h2>Devices that disagree</h2>\n<ul id=\"device-notes\">\n");
        for (size_t b = 0; b < rep->num_backends; b++) {
            if (!rep->backends[b].device_note[0]) continue;
            fprintf(f, "<li>");
            esc(f, rep->backends[b].device_note);
            fprintf(f, "</li>\n");
        }
        fprintf(f, "</ul>\n");
    }
    fprintf(f, "<h2>Backend &times; M</h2>\n");
    html_heatmap(rep, f);
    fprintf(f, "<h2>Error against K</h2>\n");
    html_error_plot(rep, f);
    fprintf(f, "<h2>Every case</h2>\n");
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        char label[96];
        backend_label(br, label, sizeof label); /* --device all: one section per device */
        fprintf(f, "<details><summary>");
        esc(f, label);
        fprintf(f, ": %s</summary><table><tr><th>case</th><th>verdict</th><th>cause</th><th>error/bound</th>"
                   "<th>ms</th><th>detail</th></tr>\n", fp4d_verdict_name(br->verdict));
        for (size_t i = 0; i < rep->num_cases; i++) {
            const fp4d_case_result *r = &br->results[i];
            fprintf(f, "<tr><td><code>");
            esc(f, rep->cases[i].name);
            fprintf(f, "</code></td><td class=\"v\" style=\"background:%s\">%s</td><td>%s</td><td>%.3g</td><td>%.3f</td><td>",
                    html_color(r->verdict), fp4d_verdict_name(r->verdict), fp4d_cause_name(r->cause),
                    r->max_err_ratio, r->time_ms);
            esc(f, r->detail);
            fprintf(f, "</td></tr>\n");
        }
        fprintf(f, "</table></details>\n");
    }
    fprintf(f, "<h2>Environment</h2>\n<pre>");
    json_t *env = fp4d_env_to_json();
    char *s = env ? json_dumps(env, JSON_INDENT(2)) : NULL;
    esc(f, s ? s : "");
    free(s);
    json_decref(env);
    fprintf(f, "</pre>\n</body></html>\n");
    return FP4D_STATUS_OK;
}
