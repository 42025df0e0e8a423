/*
 * The probe's client: libcurl's multi interface drives every transfer from this one thread
 * (discovery, phase 1 one at a time, phase 2 with `concurrency` in flight).
 *
 * Bounds, by construction:
 * - requests: discovery sends GET /health and, without --model, GET /v1/models (at most 2);
 *   generation requests are planned up front by fp4d_probe_plan and never retried, so their
 *   total is at most concurrency x rounds;
 * - time: every transfer has CURLOPT_TIMEOUT_MS = --timeout, and the first TIMEOUT stops
 *   the probe (in-flight transfers are dropped), so a hung server costs at most one
 *   --timeout after it hangs; --deadline and a cancel flag (Ctrl-C) stop it the same way,
 *   checked every 100 ms.
 */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/resource.h>

#include <curl/curl.h>
#include <jansson.h>

#include "clock.h"
#include "internal.h"
#include "probe_internal.h"

/* A response larger than this is not an answer to a short prompt: stop reading it. */
#define PROBE_MAX_BODY (8u << 20)
#define PROBE_POLL_MS  100

static const char *const verdict_names[] = {
#define FP4D_PROBE_VERDICT_NAME_(name, str) str,
    FP4D_PROBE_VERDICT_LIST(FP4D_PROBE_VERDICT_NAME_)
#undef FP4D_PROBE_VERDICT_NAME_
};

const char *fp4d_probe_verdict_name(fp4d_probe_verdict v)
{
    return (unsigned)v < FP4D_PROBE_VERDICT_COUNT ? verdict_names[v] : "unknown";
}

void fp4d_probe_options_init(fp4d_probe_options *o)
{
    memset(o, 0, sizeof *o);
    o->concurrency = 16;
    o->rounds = 3;
    o->timeout_s = 60.0;
    o->deadline_s = 1800.0;
    o->max_tokens = 512;
    o->api = FP4D_PROBE_API_CHAT;
}

void fp4d_probe_plan(unsigned concurrency, unsigned rounds, unsigned *phase1, unsigned *phase2)
{
    unsigned long long budget = (unsigned long long)concurrency * rounds;
    /* The counts are unsigned and callers add them: past UINT_MAX, phase 2 would wrap
     * ((unsigned)(budget - p1)) and plan far fewer requests than the budget, or the sum would
     * overflow. Cap the budget instead; fp4d_probe_run's limits stay far below it. */
    if (budget > UINT_MAX) budget = UINT_MAX;
    unsigned long long p1 = 0;
    if (budget > 0) {
        unsigned long long rest = budget > concurrency ? budget - concurrency : 0;
        p1 = rest > 1 ? rest : 1;
        size_t prompts = fp4d_probe_prompt_count();
        if (p1 > prompts) p1 = prompts;
    }
    if (phase1) *phase1 = (unsigned)p1;
    if (phase2) *phase2 = (unsigned)(budget - p1);
}

int fp4d_probe_exit_code(const fp4d_probe_report *r)
{
    if (!r) return FP4D_EXIT_INTERNAL;
    if (r->verdict == FP4D_PROBE_VERDICT_UNREACHABLE) return FP4D_EXIT_INPUT;
    if (r->verdict == FP4D_PROBE_VERDICT_HEALTHY && !r->stopped_early) return FP4D_EXIT_OK;
    return FP4D_EXIT_FAILED;
}

void fp4d_probe_report_free(fp4d_probe_report *r)
{
    if (!r) return;
    free(r->records);
    free(r);
}

/* ---- transfers ---------------------------------------------------------------------------- */

typedef struct xfer {
    CURL     *easy;
    fp4d_buf  body;
    bool      too_big;
    bool      nomem;
    unsigned  request_index;
    size_t    prompt_index;
    char     *request_json;
    char      errbuf[CURL_ERROR_SIZE];
} xfer;

typedef struct probe_ctx {
    const fp4d_probe_options *o;
    fp4d_probe_report        *r;
    char                     *base;      /* scheme://[user@]host[:port][/prefix], no trailing / */
    struct curl_slist        *headers;   /* JSON content type and the API key */
    double                    t0;
    size_t                    records_cap;
    bool                      nomem;
    /* Fluent answers (OK or WRONG_ANSWER) seen so far: does every prompt get the same text? */
    unsigned                  answers_seen;
    uint64_t                  first_answer_hash;
    size_t                    first_answer_prompt;
    bool                      answers_vary, prompts_vary;
} probe_ctx;

/* FNV-1a: enough to tell whether two answers are the same text. */
static uint64_t text_hash(const char *t)
{
    uint64_t h = 1469598103934665603ull;
    for (; *t; t++) h = (h ^ (unsigned char)*t) * 1099511628211ull;
    return h;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *user)
{
    xfer *x = user;
    size_t n = size * nmemb;
    if (x->body.len + n > PROBE_MAX_BODY) {
        x->too_big = true;
        return 0; /* makes curl fail the transfer with CURLE_WRITE_ERROR */
    }
    if (!fp4d_buf_append(&x->body, data, n)) {
        x->nomem = true;
        return 0;
    }
    return n;
}

static void xfer_free(xfer *x)
{
    if (!x) return;
    if (x->easy) curl_easy_cleanup(x->easy);
    fp4d_buf_free(&x->body);
    free(x->request_json);
    free(x);
}

static xfer *xfer_new(probe_ctx *c, const char *path, const char *post_json)
{
    xfer *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->easy = curl_easy_init();
    size_t ulen = strlen(c->base) + strlen(path) + 1;
    char *url = malloc(ulen);
    if (!x->easy || !url) {
        free(url);
        xfer_free(x);
        return NULL;
    }
    snprintf(url, ulen, "%s%s", c->base, path);
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    free(url); /* curl keeps its own copy */
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)ceil(c->o->timeout_s * 1000.0));
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect would be a request we did not plan */
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "fp4doctor-probe/" FP4D_VERSION_STRING);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    if (c->o->insecure) {
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (post_json) {
        x->request_json = strdup(post_json);
        if (!x->request_json) {
            xfer_free(x);
            return NULL;
        }
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->request_json);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(x->request_json));
    }
    return x;
}

/* Why the probe must stop now, or NULL. */
static const char *stop_reason(probe_ctx *c)
{
    if (c->o->cancel && *c->o->cancel) return "interrupted";
    if (c->o->deadline_s > 0 && fp4d_now_s() - c->t0 >= c->o->deadline_s) return "deadline";
    return NULL;
}

/* ---- one window of transfers -------------------------------------------------------------- */

/* Creates transfer i of a batch; NULL when out of memory. */
typedef xfer *(*make_fn)(probe_ctx *c, unsigned i, void *arg);
/* Consumes a finished transfer; returns a stop reason ("timeout") or NULL to go on. */
typedef const char *(*done_fn)(probe_ctx *c, xfer *x, CURLcode rc, void *arg);

typedef struct window_stats {
    unsigned sent, finished, aborted, max_in_flight;
    const char *stopped; /* NULL when every planned transfer finished */
} window_stats;

static window_stats run_window(probe_ctx *c, unsigned n, unsigned concurrency, make_fn make,
                               done_fn done, void *arg)
{
    window_stats s = {0};
    CURLM *m = curl_multi_init();
    xfer **active = calloc(concurrency ? concurrency : 1, sizeof *active);
    if (!m || !active) {
        c->nomem = true;
        s.stopped = "out of memory";
        goto out;
    }
    unsigned in_flight = 0;
    for (;;) {
        if (!s.stopped) s.stopped = stop_reason(c);
        while (!s.stopped && in_flight < concurrency && s.sent < n) {
            xfer *x = make(c, s.sent, arg);
            if (!x) {
                c->nomem = true;
                s.stopped = "out of memory";
                break;
            }
            for (unsigned k = 0; k < concurrency; k++)
                if (!active[k]) { active[k] = x; break; }
            curl_multi_add_handle(m, x->easy);
            s.sent++;
            in_flight++;
        }
        if (in_flight > s.max_in_flight) s.max_in_flight = in_flight;
        if (s.stopped) {
            /* Drop whatever is still in flight: the report covers what completed. */
            for (unsigned k = 0; k < concurrency; k++)
                if (active[k]) {
                    curl_multi_remove_handle(m, active[k]->easy);
                    xfer_free(active[k]);
                    active[k] = NULL;
                    s.aborted++;
                }
            break;
        }
        if (in_flight == 0) break;

        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            char *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            xfer *x = (xfer *)priv;
            CURLcode rc = msg->data.result;
            curl_multi_remove_handle(m, x->easy);
            for (unsigned k = 0; k < concurrency; k++)
                if (active[k] == x) active[k] = NULL;
            in_flight--;
            s.finished++;
            const char *why = done(c, x, rc, arg);
            if (why && !s.stopped) s.stopped = why;
            xfer_free(x);
        }
        if (!s.stopped && in_flight > 0) curl_multi_poll(m, NULL, 0, PROBE_POLL_MS, NULL);
    }
out:
    free(active);
    if (m) curl_multi_cleanup(m);
    return s;
}

/* ---- discovery ----------------------------------------------------------------------------- */

typedef struct get_result {
    CURLcode rc;
    long     status;
    fp4d_buf body;
    char     err[CURL_ERROR_SIZE];
} get_result;

static xfer *make_get(probe_ctx *c, unsigned i, void *arg)
{
    (void)i;
    const void *const *pair = arg; /* {path, get_result} */
    return xfer_new(c, pair[0], NULL);
}

static const char *done_get(probe_ctx *c, xfer *x, CURLcode rc, void *arg)
{
    (void)c;
    const void *const *pair = arg;
    get_result *g = (get_result *)pair[1];
    g->rc = rc;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &g->status);
    g->body = x->body;
    x->body = (fp4d_buf){0};
    fp4d_probe_copy(g->err, sizeof g->err, x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    return NULL;
}

/* GET base+path; false when the probe was stopped before it finished. */
static bool discovery_get(probe_ctx *c, const char *path, get_result *g)
{
    memset(g, 0, sizeof *g);
    const void *arg[2] = {path, g};
    window_stats s = run_window(c, 1, 1, make_get, done_get, (void *)arg);
    c->r->discovery_requests += s.sent;
    if (s.stopped && !c->r->stopped_early) c->r->stopped_early = s.stopped;
    return s.finished == 1;
}

/* The server answered nothing at all: no connection, TLS failure, DNS. */
static bool no_http_answer(const get_result *g)
{
    return g->rc != CURLE_OK && g->status == 0 && g->rc != CURLE_OPERATION_TIMEDOUT;
}

static void discover(probe_ctx *c)
{
    fp4d_probe_report *r = c->r;
    get_result g;
    if (!discovery_get(c, "/health", &g)) return;
    if (no_http_answer(&g)) {
        r->verdict = FP4D_PROBE_VERDICT_UNREACHABLE;
        snprintf(r->error, sizeof r->error, "GET /health: %s", g.err);
        fp4d_buf_free(&g.body);
        return;
    }
    if (g.rc == CURLE_OPERATION_TIMEDOUT) {
        /* The socket accepts but nothing answers: hung, and the same as unreachable to a
         * user; stop here rather than spend --timeout on every prompt. */
        r->verdict = FP4D_PROBE_VERDICT_UNREACHABLE;
        r->stopped_early = "timeout";
        snprintf(r->error, sizeof r->error,
                 "GET /health: no answer within %g s (the server accepts connections but does not respond)",
                 c->o->timeout_s);
        fp4d_buf_free(&g.body);
        return;
    }
    r->health_status = (int)g.status;
    fp4d_buf_free(&g.body);

    if (c->o->model) {
        fp4d_probe_copy(r->model, sizeof r->model, c->o->model);
        r->model_source = "option";
        return;
    }
    if (!discovery_get(c, "/v1/models", &g)) return;
    if (g.rc == CURLE_OPERATION_TIMEDOUT) {
        r->verdict = FP4D_PROBE_VERDICT_UNREACHABLE;
        r->stopped_early = "timeout";
        snprintf(r->error, sizeof r->error, "GET /v1/models: no answer within %g s", c->o->timeout_s);
        fp4d_buf_free(&g.body);
        return;
    }
    const char *id = NULL;
    json_t *root = NULL;
    size_t too_long = 0; /* an id the report cannot hold whole: sent cut, it names another model */
    if (g.rc == CURLE_OK && g.status == 200 && g.body.p) {
        root = json_loadb(g.body.p, g.body.len, 0, NULL);
        json_t *data = json_object_get(root, "data");
        json_t *first = json_is_array(data) ? json_array_get(data, 0) : NULL;
        json_t *jid = json_object_get(first, "id");
        if (json_is_string(jid) && json_string_length(jid) >= sizeof r->model) too_long = json_string_length(jid);
        else if (json_is_string(jid) && json_string_length(jid) > 0) id = json_string_value(jid);
    }
    if (id) {
        fp4d_probe_copy(r->model, sizeof r->model, id);
        r->model_source = "/v1/models";
    } else {
        /* Not fatal: many servers serve one model whatever the name; if this one insists,
         * the generation requests fail with HTTP errors that the report shows. */
        fp4d_probe_copy(r->model, sizeof r->model, "default");
        r->model_source = "fallback";
        if (too_long)
            snprintf(r->note, sizeof r->note,
                     "GET /v1/models named a model of %zu bytes, more than %zu; sent model \"default\" (use --model "
                     "with a shorter name the server accepts)", too_long, sizeof r->model - 1);
        else if (g.rc != CURLE_OK)
            snprintf(r->note, sizeof r->note, "GET /v1/models failed (%s); sent model \"default\" (use --model)", g.err);
        else
            snprintf(r->note, sizeof r->note,
                     "GET /v1/models gave HTTP %ld without a model id; sent model \"default\" (use --model)",
                     g.status);
    }
    json_decref(root);
    fp4d_buf_free(&g.body);
}

/* ---- generation phases ---------------------------------------------------------------------- */

typedef struct phase_arg {
    unsigned          phase;          /* 1 or 2 */
    unsigned          prompt_offset;  /* request i uses prompt (offset + i) mod count */
    fp4d_probe_phase *ph;
} phase_arg;

static char *request_json(probe_ctx *c, const fp4d_probe_prompt *p)
{
    const fp4d_probe_options *o = c->o;
    json_t *req;
    if (o->api == FP4D_PROBE_API_CHAT) {
        req = json_pack("{s:s, s:[{s:s, s:s}], s:f, s:I, s:b}", "model", c->r->model, "messages",
                        "role", "user", "content", p->text, "temperature", 0.0, "max_tokens",
                        (json_int_t)o->max_tokens, "stream", o->stream);
    } else {
        size_t n = strlen(p->text) + sizeof FP4D_PROBE_COMPLETION_SUFFIX;
        char *prompt = malloc(n);
        if (!prompt) return NULL;
        snprintf(prompt, n, "%s%s", p->text, FP4D_PROBE_COMPLETION_SUFFIX);
        req = json_pack("{s:s, s:s, s:f, s:I, s:b}", "model", c->r->model, "prompt", prompt,
                        "temperature", 0.0, "max_tokens", (json_int_t)o->max_tokens, "stream", o->stream);
        free(prompt);
    }
    if (!req) return NULL;
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s;
}

static xfer *make_generation(probe_ctx *c, unsigned i, void *varg)
{
    phase_arg *a = varg;
    size_t np = fp4d_probe_prompt_count();
    size_t pi = (a->prompt_offset + i) % np;
    char *body = request_json(c, fp4d_probe_prompt_at(pi));
    if (!body) return NULL;
    const char *path = c->o->api == FP4D_PROBE_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    xfer *x = xfer_new(c, path, body);
    free(body);
    if (!x) return NULL;
    x->request_index = i;
    x->prompt_index = pi;
    c->r->generation_requests++;
    return x;
}

static void quote(fp4d_probe_quote *q, const xfer *x, const fp4d_probe_outcome *oc, double ms)
{
    q->present = true;
    q->request_index = x->request_index;
    q->prompt_index = x->prompt_index;
    q->cls = oc->cls;
    q->http_status = oc->http_status;
    q->latency_ms = ms;
    fp4d_probe_copy(q->finish_reason, sizeof q->finish_reason, oc->finish_reason);
    fp4d_probe_copy(q->matched_stop, sizeof q->matched_stop, oc->matched_stop);
    fp4d_probe_copy(q->detail, sizeof q->detail, oc->detail);
    bool has_content = false, has_reasoning = false;
    for (const char *c = oc->content; c && *c && !has_content; c++) has_content = !isspace((unsigned char)*c);
    for (const char *c = oc->reasoning; c && *c && !has_reasoning; c++) has_reasoning = !isspace((unsigned char)*c);
    q->reasoning_only = has_reasoning && !has_content;
    size_t n = x->body.len < FP4D_PROBE_QUOTE_MAX ? x->body.len : FP4D_PROBE_QUOTE_MAX;
    if (n) memcpy(q->body, x->body.p, n);
    for (size_t i = 0; i < n; i++)
        if (!q->body[i]) q->body[i] = ' '; /* a NUL byte would end the quote there, unmarked */
    q->body[n] = '\0';
    q->body_truncated = x->body.len > FP4D_PROBE_QUOTE_MAX;
}

static const char *done_generation(probe_ctx *c, xfer *x, CURLcode rc, void *varg)
{
    phase_arg *a = varg;
    fp4d_probe_report *r = c->r;
    long status = 0;
    curl_off_t us = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(x->easy, CURLINFO_TOTAL_TIME_T, &us);
    double ms = (double)us / 1000.0;
    const fp4d_probe_prompt *p = fp4d_probe_prompt_at(x->prompt_index);
    const char *stop = NULL;

    fp4d_probe_outcome oc;
    memset(&oc, 0, sizeof oc);
    oc.http_status = (int)status;
    if (x->nomem) {
        c->nomem = true;
        return "out of memory";
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        oc.cls = FP4D_PROBE_TIMEOUT;
        snprintf(oc.detail, sizeof oc.detail, "no complete response within %g s (%zu bytes received)",
                 c->o->timeout_s, x->body.len);
        stop = "timeout";
    } else if (x->too_big) {
        oc.cls = FP4D_PROBE_MALFORMED;
        snprintf(oc.detail, sizeof oc.detail, "response larger than %u bytes", PROBE_MAX_BODY);
    } else if (rc != CURLE_OK && status == 0 && x->body.len == 0) {
        oc.cls = FP4D_PROBE_HTTP_ERROR;
        snprintf(oc.detail, sizeof oc.detail, "no HTTP response: %.150s",
                 x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    } else if (rc != CURLE_OK) {
        /* Headers (and maybe part of the body) came, then the connection broke. */
        oc.cls = FP4D_PROBE_MALFORMED;
        snprintf(oc.detail, sizeof oc.detail, "%s cut after %zu bytes: %.120s",
                 c->o->stream ? "SSE stream" : "body", x->body.len,
                 x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    } else {
        const fp4d_probe_prompt *check = c->o->no_answer_check ? NULL : p;
        if (fp4d_probe_classify(x->body.p, x->body.len, (int)status, c->o->stream, c->o->api, check,
                                &oc) != FP4D_STATUS_OK) {
            c->nomem = true;
            return "out of memory";
        }
    }

    char *location = NULL;
    if (oc.cls == FP4D_PROBE_HTTP_ERROR && status >= 300 && status < 400 &&
        curl_easy_getinfo(x->easy, CURLINFO_REDIRECT_URL, &location) == CURLE_OK && location) {
        /* Redirects are not followed (each would be a request outside the bound); "HTTP 307"
         * alone does not tell the user that the URL is what needs changing. */
        char msg[sizeof oc.detail];
        snprintf(msg, sizeof msg, "HTTP %ld: redirect to %.110s (not followed: probe that URL)", status, location);
        fp4d_probe_copy(oc.detail, sizeof oc.detail, msg);
    }

    if ((oc.cls == FP4D_PROBE_OK || oc.cls == FP4D_PROBE_WRONG_ANSWER) && oc.content) {
        uint64_t h = text_hash(oc.content);
        if (c->answers_seen++ == 0) {
            c->first_answer_hash   = h;
            c->first_answer_prompt = x->prompt_index;
        } else {
            c->answers_vary |= h != c->first_answer_hash;
            c->prompts_vary |= x->prompt_index != c->first_answer_prompt;
        }
    }
    fp4d_probe_phase *ph = a->ph;
    ph->counts[oc.cls]++;
    ph->completed++;
    if (oc.cls != FP4D_PROBE_OK && !ph->first_offending.present) quote(&ph->first_offending, x, &oc, ms);

    fp4d_probe_record rec = {a->phase, x->prompt_index, oc.cls, (int)status, ms};
    if (r->n_records == c->records_cap) {
        size_t cap = c->records_cap ? 2 * c->records_cap : 64;
        fp4d_probe_record *grown = realloc(r->records, cap * sizeof *grown);
        if (grown) {
            r->records = grown;
            c->records_cap = cap;
        }
    }
    if (r->n_records < c->records_cap) {
        r->records[r->n_records++] = rec;
    } else {
        c->nomem = true;
        stop = "out of memory";
    }
    fp4d_probe_outcome_free(&oc);
    if (c->o->on_response) c->o->on_response(c->o->user, &rec, ph->completed, ph->planned);
    return stop;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, unsigned n, double q)
{
    if (n == 0) return 0.0;
    double rank = ceil(q * n);
    unsigned i = rank < 1 ? 0 : (unsigned)rank - 1;
    return v[i < n ? i : n - 1];
}

static void run_phase(probe_ctx *c, unsigned phase, unsigned n, unsigned concurrency, unsigned offset)
{
    fp4d_probe_phase *ph = &c->r->phases[phase - 1];
    ph->planned = n;
    ph->concurrency = concurrency;
    if (n == 0 || c->r->stopped_early) {
        ph->skipped = true;
        return;
    }
    phase_arg a = {phase, offset, ph};
    window_stats s = run_window(c, n, concurrency, make_generation, done_generation, &a);
    ph->sent = s.sent;
    ph->aborted = s.aborted;
    ph->max_in_flight = s.max_in_flight;
    if (s.stopped && !c->r->stopped_early) c->r->stopped_early = s.stopped;
    /* Latencies of this phase, from its records. */
    double *lat = ph->completed ? malloc(ph->completed * sizeof *lat) : NULL;
    unsigned nl = 0;
    for (size_t i = 0; lat && i < c->r->n_records && nl < ph->completed; i++)
        if (c->r->records[i].phase == phase) lat[nl++] = c->r->records[i].latency_ms;
    if (ph->completed && !lat) c->nomem = true;
    if (nl) qsort(lat, nl, sizeof *lat, cmp_double);
    ph->p50_ms = percentile(lat, nl, 0.50);
    ph->p90_ms = percentile(lat, nl, 0.90);
    ph->p99_ms = percentile(lat, nl, 0.99);
    ph->max_ms = nl ? lat[nl - 1] : 0.0;
    free(lat);
    ph->healthy = ph->completed > 0 && ph->counts[FP4D_PROBE_OK] == ph->completed && ph->completed == n;
}

/* ---- verdict ------------------------------------------------------------------------------ */

static unsigned count_where(const fp4d_probe_phase *ph, bool fault)
{
    unsigned n = 0;
    for (int k = 0; k < FP4D_PROBE_CLASS_COUNT; k++)
        if (k != FP4D_PROBE_OK && fp4d_probe_class_is_fault((fp4d_probe_class)k) == fault) n += ph->counts[k];
    return n;
}

/*
 * A server that answers NONE of the checkable prompts right, alone or in a batch, does not
 * know them at all (a mock or canned server, a model that ignores instructions); its wrong
 * answers then say nothing about the kernels, while a kernel fault that is batch-dependent
 * still shows as right-alone / wrong-in-a-batch. Unless --strict-answers, such answers are
 * noted, not held against the server.
 */
static bool answers_unverifiable(const fp4d_probe_report *r, bool strict, bool canned)
{
    const fp4d_probe_phase *p1 = &r->phases[0], *p2 = &r->phases[1];
    unsigned wrong = p1->counts[FP4D_PROBE_WRONG_ANSWER] + p2->counts[FP4D_PROBE_WRONG_ANSWER];
    bool none_right = p1->counts[FP4D_PROBE_OK] == 0 && p2->counts[FP4D_PROBE_OK] == 0;
    return r->answer_check && !strict && wrong > 0 && (none_right || canned);
}

/* canned: at least three fluent answers, to different prompts, all the very same text (a
 * mock server's fixed reply may happen to contain one prompt's answer). */
static void decide(fp4d_probe_report *r, bool strict_answers, bool canned)
{
    if (r->verdict == FP4D_PROBE_VERDICT_UNREACHABLE) return;
    fp4d_probe_phase *p1 = &r->phases[0], *p2 = &r->phases[1];
    unsigned fault1 = count_where(p1, true), soft1 = count_where(p1, false);
    unsigned fault2 = count_where(p2, true), soft2 = count_where(p2, false);
    if (answers_unverifiable(r, strict_answers, canned)) {
        r->answers_unverified = true;
        soft1 -= p1->counts[FP4D_PROBE_WRONG_ANSWER];
        soft2 -= p2->counts[FP4D_PROBE_WRONG_ANSWER];
        for (int i = 0; i < 2; i++) {
            fp4d_probe_phase *ph = &r->phases[i];
            ph->healthy = ph->completed > 0 && ph->completed == ph->planned &&
                          ph->counts[FP4D_PROBE_OK] + ph->counts[FP4D_PROBE_WRONG_ANSWER] == ph->completed;
        }
        size_t len = strlen(r->note);
        snprintf(r->note + len, sizeof r->note - len,
                 canned ? "%severy prompt got the same answer text (a canned or mock server): answers treated as "
                          "unverifiable (--strict-answers counts them)"
                        : "%sno checkable prompt was answered right, alone or in a batch: answers treated as "
                 "unverifiable (a mock server or a model that ignores the prompts; a fluent-but-wrong "
                 "kernel looks the same: --strict-answers counts them)",
                 len ? "; " : "");
    }
    /* Phase 2 is only "under concurrency" when more than one request was in flight. */
    bool concurrent = p2->max_in_flight > 1;
    if (!concurrent) {
        fault1 += fault2;
        soft1 += soft2;
        fault2 = soft2 = 0;
    }
    if (fault1) r->verdict = FP4D_PROBE_VERDICT_BROKEN_AT_CONCURRENCY_1;
    else if (fault2) r->verdict = FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY;
    /* Right alone, wrong in a batch: the answers depend on batch composition. */
    else if (soft2 && !soft1 && p1->completed > 0) r->verdict = FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY;
    else if (soft1 || soft2) r->verdict = FP4D_PROBE_VERDICT_DEGRADED;
    else if (p1->completed + p2->completed == 0 || r->stopped_early) r->verdict = FP4D_PROBE_VERDICT_INCONCLUSIVE;
    else r->verdict = FP4D_PROBE_VERDICT_HEALTHY;
}

/* ---- entry point ---------------------------------------------------------------------------- */

/* curl's reason for refusing a URL (curl_url_strerror is 7.80 or newer). */
static const char *url_error(CURLUcode uc)
{
#if LIBCURL_VERSION_NUM >= 0x075000
    return curl_url_strerror(uc);
#else
    (void)uc;
    return "not a valid URL";
#endif
}

/* The URL as given for an error message, without its user:password@ (everything up to the
 * last '@' of the authority): a URL that fails to parse must not put the password on the
 * terminal or in a log either. `out` gets a truncated copy when it is too small. */
static void url_for_message(char *out, size_t cap, const char *url)
{
    const char *sep = strstr(url, "://");
    size_t start = sep ? (size_t)(sep - url) + 3 : 0;
    size_t end = start + strcspn(url + start, "/?#");
    size_t at = 0;
    for (size_t i = start; i < end; i++)
        if (url[i] == '@') at = i + 1;
    if (!at) {
        fp4d_probe_copy(out, cap, url);
        return;
    }
    snprintf(out, cap, "%.*s%s", (int)start, url, url + at);
}

/* Base URL for requests, and a copy for display without user:password. */
static fp4d_status parse_url(probe_ctx *c, const char *url)
{
    CURLU *u = curl_url();
    FP4D_RETURN_ERROR_IF(!u, NOMEM, "out of memory");
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *full = NULL, *shown = NULL;
    char said[512];
    url_for_message(said, sizeof said, url);
    fp4d_status st = FP4D_STATUS_OK;
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
    if (uc == CURLUE_BAD_PORT_NUMBER) {
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s': the port must be a number in 1..65535", said);
        goto out;
    }
    if (uc != CURLUE_OK && !strstr(url, "://")) {
        /* "localhost:30000" reads to curl as the scheme "localhost": say what is missing. */
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s' is not a URL: put http:// or https:// in front of it",
                            said);
        goto out;
    }
    if (uc != CURLUE_OK) {
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s' is not a URL: %s (expected http://HOST:PORT)", said,
                            url_error(uc));
        goto out;
    }
    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
    curl_url_get(u, CURLUPART_HOST, &host, 0);
    if (!scheme || (strcmp(scheme, "http") && strcmp(scheme, "https")) || !host) {
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s': only http:// and https:// URLs can be probed", said);
        goto out;
    }
    /* curl accepts port 0, which no server listens on: a typo, not an unreachable server. */
    if (curl_url_get(u, CURLUPART_PORT, &port, 0) == CURLUE_OK && port && strtoul(port, NULL, 10) == 0) {
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s': the port must be a number in 1..65535", said);
        goto out;
    }
    /* Drop query and fragment; strip trailing '/' and a final "/v1" (people paste the
     * OpenAI base URL). */
    curl_url_set(u, CURLUPART_QUERY, NULL, 0);
    curl_url_set(u, CURLUPART_FRAGMENT, NULL, 0);
    curl_url_get(u, CURLUPART_PATH, &path, 0);
    size_t pl = path ? strlen(path) : 0;
    while (pl && path[pl - 1] == '/') path[--pl] = '\0';
    /* A pasted endpoint (".../v1/chat/completions") names the same server. */
    static const char *const tails[] = {"/chat/completions", "/completions", "/models", "/v1"};
    for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++) {
        size_t tl = strlen(tails[t]);
        if (pl >= tl && !strcmp(path + pl - tl, tails[t])) path[pl -= tl] = '\0';
    }
    curl_url_set(u, CURLUPART_PATH, pl ? path : "/", 0);
    if (curl_url_get(u, CURLUPART_URL, &full, 0) != CURLUE_OK) {
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "'%s' is not a usable URL", said);
        goto out;
    }
    size_t fl = strlen(full);
    while (fl && full[fl - 1] == '/') full[--fl] = '\0';
    c->base = strdup(full);
    curl_url_set(u, CURLUPART_USER, NULL, 0);
    curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
    if (curl_url_get(u, CURLUPART_URL, &shown, 0) == CURLUE_OK) {
        size_t sl = strlen(shown);
        while (sl && shown[sl - 1] == '/') shown[--sl] = '\0';
        fp4d_probe_copy(c->r->url, sizeof c->r->url, shown);
    }
    if (!c->base) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(full);
    curl_free(shown);
    curl_url_cleanup(u);
    return st;
}

/*
 * Every transfer in flight holds a socket, and while its host name resolves also curl's
 * resolver socket pair. Under the common soft limit of 1024 open files, --concurrency 2000
 * made hundreds of connects fail inside this process ("Couldn't connect to server"), which
 * the report then blamed on the server as a batch-dependent fault. So: raise the soft limit
 * toward what the window needs (up to the hard limit), and refuse a window that even the hard
 * limit cannot hold. The raised limit stays: putting it back after the probe pulled it from
 * under another probe still running in the same process (which had found it high enough),
 * and a higher soft limit harms nothing.
 */
static fp4d_status ensure_open_files(unsigned concurrency)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return FP4D_STATUS_OK; /* unknown: let curl try */
    rlim_t want = 2 * (rlim_t)concurrency + 64, need = (rlim_t)concurrency + 32;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return FP4D_STATUS_OK;
    rlim_t to = (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want) ? want : rl.rlim_max;
    if (to > rl.rlim_cur) {
        struct rlimit more = {to, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &more) == 0) rl.rlim_cur = to;
    }
    if (rl.rlim_cur < need)
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                              "--concurrency %u needs at least %llu open files, but this process may open only %llu "
                              "(hard limit %llu): lower --concurrency, or raise the limit (ulimit -n)",
                              concurrency, (unsigned long long)need, (unsigned long long)rl.rlim_cur,
                              (unsigned long long)rl.rlim_max);
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_probe_run(const fp4d_probe_options *o, fp4d_probe_report **out)
{
    FP4D_RETURN_ERROR_IF(!o || !out, INVALID_ARG, "fp4d_probe_run: NULL argument");
    *out = NULL;
    FP4D_RETURN_ERROR_IF(!o->url || !o->url[0], INVALID_ARG, "no URL to probe");
    FP4D_RETURN_ERROR_IF(o->concurrency < 1 || o->concurrency > 4096, INVALID_ARG,
                         "--concurrency must be 1..4096, not %u", o->concurrency);
    FP4D_RETURN_ERROR_IF(o->rounds < 1 || o->rounds > 100000, INVALID_ARG,
                         "--rounds must be 1..100000, not %u", o->rounds);
    FP4D_RETURN_ERROR_IF(!(o->timeout_s > 0) || o->timeout_s > 86400, INVALID_ARG,
                         "--timeout must be > 0 and <= 86400 seconds");
    FP4D_RETURN_ERROR_IF(!(o->deadline_s >= 0), INVALID_ARG, "--deadline must be >= 0");
    FP4D_RETURN_ERROR_IF(o->max_tokens < 1, INVALID_ARG, "--max-tokens must be >= 1");
    FP4D_RETURN_ERROR_IF(o->api != FP4D_PROBE_API_CHAT && o->api != FP4D_PROBE_API_COMPLETIONS,
                         INVALID_ARG, "unknown API");
    FP4D_RETURN_ERROR_IF(fp4d_probe_prompt_count() == 0, NOMEM, "out of memory building the prompt set");
    FP4D_FORWARD_IF_ERROR(ensure_open_files(o->concurrency));
    FP4D_RETURN_ERROR_IF(curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK, INTERNAL, "libcurl failed to initialise");

    fp4d_probe_report *r = calloc(1, sizeof *r);
    probe_ctx c = {.o = o, .r = r, .t0 = fp4d_now_s()};
    fp4d_status st = FP4D_STATUS_OK;
    if (!r) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        goto done;
    }
    r->concurrency = o->concurrency;
    r->rounds = o->rounds;
    r->max_tokens = o->max_tokens;
    r->timeout_s = o->timeout_s;
    r->stream = o->stream;
    r->api = o->api;
    r->answer_check = !o->no_answer_check;
    r->request_bound = o->concurrency * o->rounds + (o->model ? 1 : 2);
    r->model_source = "option";
    if ((st = parse_url(&c, o->url)) != FP4D_STATUS_OK) goto done;

    c.headers = curl_slist_append(NULL, "Content-Type: application/json");
    /* No "Expect: 100-continue" for the long padding prompts: a server that ignores it would
     * add curl's 1 s wait to every long request and skew the latencies. */
    if (c.headers) {
        struct curl_slist *grown = curl_slist_append(c.headers, "Expect:");
        if (grown) c.headers = grown;
    }
    if (c.headers && o->api_key && o->api_key[0]) {
        size_t n = strlen(o->api_key) + 32;
        char *h = malloc(n);
        if (h) {
            snprintf(h, n, "Authorization: Bearer %s", o->api_key);
            struct curl_slist *grown = curl_slist_append(c.headers, h);
            memset(h, 0, n); /* the key lives on only inside curl's header list */
            free(h);
            if (grown) c.headers = grown;
            else {
                curl_slist_free_all(c.headers);
                c.headers = NULL;
            }
        } else {
            curl_slist_free_all(c.headers);
            c.headers = NULL;
        }
    }
    if (!c.headers) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        goto done;
    }

    unsigned n1, n2;
    fp4d_probe_plan(o->concurrency, o->rounds, &n1, &n2);
    r->phases[0].planned = n1;
    r->phases[0].concurrency = 1;
    r->phases[1].planned = n2;
    r->phases[1].concurrency = o->concurrency;

    discover(&c);
    if (r->verdict == FP4D_PROBE_VERDICT_UNREACHABLE || r->stopped_early || c.nomem) {
        r->phases[0].skipped = r->phases[1].skipped = true;
    } else {
        run_phase(&c, 1, n1, 1, 0);
        if (!c.nomem) run_phase(&c, 2, n2, o->concurrency, n1);
    }
    if (c.nomem) {
        st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory during the probe");
        goto done;
    }
    decide(r, o->strict_answers, c.answers_seen >= 3 && c.prompts_vary && !c.answers_vary);
    fp4d_probe_write_hint(r);
    r->elapsed_s = fp4d_now_s() - c.t0;

done:
    if (c.headers) curl_slist_free_all(c.headers);
    free(c.base);
    curl_global_cleanup();
    /* Every socket of the probe is closed by now: the caller's limit holds again. */
    if (st != FP4D_STATUS_OK) {
        fp4d_probe_report_free(r);
        return st;
    }
    *out = r;
    return FP4D_STATUS_OK;
}
