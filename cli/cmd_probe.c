/* fp4doctor probe URL: classify what a running OpenAI-compatible server answers (docs/probe.md). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char probe_usage[] =
    "usage: fp4doctor probe URL [OPTIONS]\n"
    "\n"
    "Probes an OpenAI-compatible server (SGLang, vLLM, ...) for the signatures of broken FP4\n"
    "kernels: SGLang's \"NaN happened\" stop, `!!!!!!!!` garbage, reasoning-only, empty and wrong\n"
    "answers. Phase 1 sends the built-in prompts one at a time; phase 2 sends more with up to\n"
    "--concurrency requests in flight, so batches mix very different lengths.\n"
    "\n"
    "  URL                    http(s)://HOST:PORT (a trailing /v1 or /v1/chat/completions is fine)\n"
    "  --model NAME           model name to request (default: the first of GET /v1/models)\n"
    "  --concurrency N        phase 2 requests in flight (default 16)\n"
    "  --rounds R             budget of N x R generation requests for both phases (default 3)\n"
    "  --timeout S            per request, seconds (default 60); the first timeout stops the probe\n"
    "  --deadline S           whole probe, seconds (default 1800; 0 = none)\n"
    "  --stream               use server-sent events (stream: true)\n"
    "  --api chat|completions POST /v1/chat/completions (default) or /v1/completions\n"
    "  --max-tokens N         max_tokens per request (default 512)\n"
    "  --api-key-env VAR      send the API key held in environment variable VAR\n"
    "  --insecure             do not verify the TLS certificate\n"
    "  --no-answer-check      only failure signatures count (no WRONG_ANSWER)\n"
    "  --strict-answers       count wrong answers even when the server answers no checkable\n"
    "                         prompt right (by default such answers are noted as unverifiable)\n"
    "  --json FILE|-          write the report as JSON (docs/json-schema.md); with -, the text\n"
    "                         report goes to stderr\n"
    "  -q, --quiet            no progress display\n"
    "\n"
    "Requests: at most N x R generation requests plus 2 discovery requests (GET /health, and\n"
    "GET /v1/models without --model); nothing is retried. Ctrl-C stops with a partial report.\n"
    "Classes: OK NAN_STOP DEGENERATE EMPTY REASONING_ONLY WRONG_ANSWER TRUNCATED HTTP_ERROR\n"
    "TIMEOUT MALFORMED. Verdicts: healthy, broken_at_concurrency_1, broken_under_concurrency,\n"
    "degraded, unreachable, inconclusive.\n"
    "Exit: 0 healthy, 1 not healthy / interrupted / inconclusive, 2 usage, 3 server unreachable,\n"
    "4 internal error (or built without libcurl).\n";

#ifndef FP4D_USE_PROBE

int cmd_probe(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(probe_usage, stdout);
            return FP4D_EXIT_OK;
        }
    return cli_fail(FP4D_EXIT_INTERNAL, argv[0],
                    "this fp4doctor was built without libcurl, so it cannot probe servers "
                    "(install libcurl4-openssl-dev and rebuild)");
}

#else

#include "fp4doctor/probe.h"
#include "internal.h"

static volatile sig_atomic_t probe_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    probe_interrupted = 1; /* SA_RESETHAND: a second Ctrl-C kills as usual */
}

static bool parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
    uint64_t v; /* digits only: strtoul took " 2" */
    if (!cli_parse_u64(s, &v) || v < min || v > max) return false;
    *out = (unsigned)v;
    return true;
}

static bool parse_seconds(const char *s, bool allow_zero, double *out)
{
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0 || (!allow_zero && v == 0) || v > 86400) return false;
    *out = v;
    return true;
}

typedef struct progress {
    bool     enabled;
    unsigned last_phase;
} progress;

static void on_response(void *user, const fp4d_probe_record *rec, unsigned done, unsigned planned)
{
    progress *p = user;
    if (!p->enabled) return;
    fprintf(stderr, "\r  phase %u: %u/%u responses", rec->phase, done, planned);
    if (rec->cls != FP4D_PROBE_OK) fprintf(stderr, " (last: %s)      ", fp4d_probe_class_name(rec->cls));
    else fputs("                  ", stderr);
    p->last_phase = rec->phase;
}

/* Prints s line by line, each line prefixed and cleaned as cli_shown does - so control characters, C1 ones and
 * invalid UTF-8 (a raw 0x9B is a CSI to some terminals) appear as '?'. */
static void print_quoted(FILE *f, const char *s, const char *prefix)
{
    char line[FP4D_PROBE_QUOTE_MAX + 1];
    while (*s) {
        size_t n = strcspn(s, "\n");
        if (n > FP4D_PROBE_QUOTE_MAX) n = FP4D_PROBE_QUOTE_MAX;
        memcpy(line, s, n);
        line[n] = '\0';
        if (n && line[n - 1] == '\r') line[n - 1] = '\0';
        fp4d_text_clean(line);
        fprintf(f, "%s%s\n", prefix, line);
        s += n;
        if (*s == '\n') s++;
    }
}

static void print_phase(FILE *f, const fp4d_probe_phase *ph, unsigned number, bool color)
{
    if (ph->skipped) {
        fprintf(f, "phase %u  %-20s skipped (%u planned)\n", number,
                number == 1 ? "one at a time" : "concurrent", ph->planned);
        return;
    }
    char conc[40];
    if (number == 1) snprintf(conc, sizeof conc, "one at a time");
    else snprintf(conc, sizeof conc, "up to %u in flight", ph->max_in_flight);
    fprintf(f, "phase %u  %-20s %u/%u responses ", number, conc, ph->completed, ph->planned);
    for (int k = 0; k < FP4D_PROBE_CLASS_COUNT; k++)
        if (ph->counts[k]) fprintf(f, " %s %u", fp4d_probe_class_name((fp4d_probe_class)k), ph->counts[k]);
    if (ph->aborted) fprintf(f, "  (%u dropped)", ph->aborted);
    if (ph->completed)
        fprintf(f, "  p50 %.0f ms  p90 %.0f ms  p99 %.0f ms", ph->p50_ms, ph->p90_ms, ph->p99_ms);
    const char *state = ph->healthy ? "healthy" : "NOT HEALTHY";
    if (color) fprintf(f, "  \033[%sm%s\033[0m\n", ph->healthy ? "32" : "1;31", state);
    else fprintf(f, "  %s\n", state);
}

static void print_quote(FILE *f, const fp4d_probe_quote *q, unsigned number)
{
    if (!q->present) return;
    const fp4d_probe_prompt *p = fp4d_probe_prompt_at(q->prompt_index);
    fprintf(f, "\nfirst offending response, phase %u (request %u, prompt \"%s\", expected \"%s\"):\n", number,
            q->request_index + 1, p ? p->id : "?", p ? p->answers[0] : "?");
    fprintf(f, "  %s  HTTP %d  %.0f ms", fp4d_probe_class_name(q->cls), q->http_status, q->latency_ms);
    char buf[256];
    if (q->finish_reason[0]) fprintf(f, "  finish_reason \"%s\"", cli_shown(q->finish_reason, buf, sizeof buf));
    if (q->matched_stop[0]) fprintf(f, "  matched_stop \"%s\"", cli_shown(q->matched_stop, buf, sizeof buf));
    fprintf(f, "\n  %s\n", cli_shown(q->detail, buf, sizeof buf));
    if (q->body[0]) {
        fprintf(f, "  body%s:\n", q->body_truncated ? " (first 2048 bytes)" : "");
        print_quoted(f, q->body, "  | ");
    }
}

static void print_report(FILE *f, const fp4d_probe_report *r, bool color)
{
    char buf[600];
    fprintf(f, "fp4doctor probe %s\n", r->url);
    if (r->model[0])
        fprintf(f, "  model     %s (%s)\n", cli_shown(r->model, buf, sizeof buf),
                !strcmp(r->model_source, "option") ? "--model" : !strcmp(r->model_source, "/v1/models")
                                                                     ? "from GET /v1/models"
                                                                     : "fallback");
    if (r->health_status == 404) fprintf(f, "  health    no /health endpoint (404)\n");
    else if (r->health_status) fprintf(f, "  health    GET /health %d\n", r->health_status);
    fprintf(f, "  requests  %s, %s, temperature 0, max_tokens %u, timeout %g s%s\n",
            r->api == FP4D_PROBE_API_CHAT ? "/v1/chat/completions" : "/v1/completions",
            r->stream ? "streamed (SSE)" : "not streamed", r->max_tokens, r->timeout_s,
            r->answer_check ? "" : ", answers not checked");
    if (r->note[0]) fprintf(f, "  note      %s\n", cli_shown(r->note, buf, sizeof buf));
    fputc('\n', f);
    for (unsigned i = 0; i < 2; i++) print_phase(f, &r->phases[i], i + 1, color);
    for (unsigned i = 0; i < 2; i++) print_quote(f, &r->phases[i].first_offending, i + 1);
    const char *v = fp4d_probe_verdict_name(r->verdict);
    bool good = r->verdict == FP4D_PROBE_VERDICT_HEALTHY;
    if (color) fprintf(f, "\nverdict   \033[%sm%s\033[0m\n", good ? "1;32" : "1;31", v);
    else fprintf(f, "\nverdict   %s\n", v);
    fprintf(f, "hint      %s\n", r->hint);
    fprintf(f, "requests  %u discovery + %u generation (bound %u = %u x %u + discovery)",
            r->discovery_requests, r->generation_requests, r->request_bound, r->concurrency, r->rounds);
    if (r->stopped_early) fprintf(f, "; stopped early: %s", r->stopped_early);
    fprintf(f, "; %.1f s\n", r->elapsed_s);
}

int cmd_probe(int argc, char **argv)
{
    const char *cmd = argv[0];
    fp4d_probe_options o;
    fp4d_probe_options_init(&o);
    const char *json_path = NULL, *key_env = NULL;
    bool quiet = false;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(probe_usage, stdout);
            return FP4D_EXIT_OK;
        }
        if (a[0] != '-' || !strcmp(a, "-")) {
            if (o.url) return cli_fail(FP4D_EXIT_USAGE, cmd, "more than one URL ('%s', '%s')", o.url, a);
            o.url = a;
            continue;
        }
        /* --opt=value and --opt value */
        char name[32];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see --help)", a);
        memcpy(name, a, nl);
        name[nl] = '\0';
        static const char *const flags[] = {"--stream", "--insecure", "--no-answer-check", "--strict-answers", "--quiet", "-q"};
        bool is_flag = false;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (!strcmp(name, flags[k])) is_flag = true;
        if (is_flag) {
            if (eq) return cli_fail(FP4D_EXIT_USAGE, cmd, "%s takes no value", name);
            if (!strcmp(name, "--stream")) o.stream = true;
            else if (!strcmp(name, "--insecure")) o.insecure = true;
            else if (!strcmp(name, "--no-answer-check")) o.no_answer_check = true;
            else if (!strcmp(name, "--strict-answers")) o.strict_answers = true;
            else quiet = true;
            continue;
        }
        static const char *const valued[] = {"--model", "--concurrency", "--rounds", "--timeout", "--deadline",
                                             "--api", "--max-tokens", "--api-key-env", "--json"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            if (!strcmp(name, valued[k])) known = true;
        if (!known) return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see --help)", name);
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return cli_fail(FP4D_EXIT_USAGE, cmd, "%s needs a value", name);

        if (!strcmp(name, "--model")) {
            if (!val[0]) return cli_fail(FP4D_EXIT_USAGE, cmd, "--model needs a non-empty name");
            /* the report holds the name it sends; a longer one would be sent cut */
            if (strlen(val) >= sizeof(((fp4d_probe_report *)0)->model))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--model takes a name of at most %zu bytes",
                                sizeof(((fp4d_probe_report *)0)->model) - 1);
            o.model = val;
        } else if (!strcmp(name, "--concurrency")) {
            if (!parse_uint(val, 1, 4096, &o.concurrency))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--concurrency must be an integer 1..4096, not '%s'", val);
        } else if (!strcmp(name, "--rounds")) {
            if (!parse_uint(val, 1, 100000, &o.rounds))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--rounds must be an integer 1..100000, not '%s'", val);
        } else if (!strcmp(name, "--max-tokens")) {
            if (!parse_uint(val, 1, 1000000, &o.max_tokens))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--max-tokens must be an integer 1..1000000, not '%s'", val);
        } else if (!strcmp(name, "--timeout")) {
            if (!parse_seconds(val, false, &o.timeout_s))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--timeout must be seconds > 0 (at most 86400), not '%s'", val);
        } else if (!strcmp(name, "--deadline")) {
            if (!parse_seconds(val, true, &o.deadline_s))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--deadline must be seconds >= 0 (at most 86400), not '%s'", val);
        } else if (!strcmp(name, "--api")) {
            if (!strcmp(val, "chat")) o.api = FP4D_PROBE_API_CHAT;
            else if (!strcmp(val, "completions")) o.api = FP4D_PROBE_API_COMPLETIONS;
            else return cli_fail(FP4D_EXIT_USAGE, cmd, "--api must be chat or completions, not '%s'", val);
        } else if (!strcmp(name, "--api-key-env")) {
            key_env = val;
        } else if (!strcmp(name, "--json")) {
            json_path = val;
        }
    }
    if (!o.url) return cli_fail(FP4D_EXIT_USAGE, cmd, "missing URL (e.g. fp4doctor probe http://127.0.0.1:30000)");
    if (key_env) {
        /* The key itself never appears on the command line, in output or in the JSON. */
        const char *key = getenv(key_env);
        if (!key || !key[0])
            return cli_fail(FP4D_EXIT_USAGE, cmd, "--api-key-env: environment variable %s is not set or empty",
                            key_env);
        o.api_key = key;
    }

    FILE *json_out = NULL;
    if (json_path) {
        json_out = cli_open_output(cmd, json_path);
        if (!json_out) return cli_output_failure();
    }
    FILE *text_out = json_out == stdout ? stderr : stdout;

    progress prog = {.enabled = !quiet && isatty(STDERR_FILENO)};
    o.on_response = on_response;
    o.user = &prog;
    probe_interrupted = 0;
    o.cancel = &probe_interrupted;
    struct sigaction old_sa;
    cli_catch_sigint(on_sigint, &old_sa);

    fp4d_probe_report *r = NULL;
    fp4d_status st = fp4d_probe_run(&o, &r);
    sigaction(SIGINT, &old_sa, NULL);
    if (prog.enabled && prog.last_phase) fputs("\r\033[K", stderr);

    if (st != FP4D_STATUS_OK) {
        cli_discard_output(json_out); /* a previous report stays as it was */
        return cli_fail(st == FP4D_STATUS_INVALID_ARG ? FP4D_EXIT_USAGE : FP4D_EXIT_INTERNAL, cmd, "%s",
                        fp4d_last_error());
    }
    print_report(text_out, r, cli_use_color(text_out));
    int rc = fp4d_probe_exit_code(r);
    if (json_out) {
        char *doc = fp4d_probe_report_json(r);
        if (!doc) {
            cli_discard_output(json_out); /* a previous report stays as it was */
            rc = cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory writing the JSON report");
        } else {
            fputs(doc, json_out);
            fputc('\n', json_out);
            free(doc);
            if (cli_close_output(json_out) != FP4D_EXIT_OK && rc == FP4D_EXIT_OK) rc = FP4D_EXIT_INPUT;
        }
    }
    fp4d_probe_report_free(r);
    return rc;
}

#endif
