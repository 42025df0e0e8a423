/* The probe's hint text and its --json document (docs/json-schema.md, "## probe"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "internal.h"
#include "probe_internal.h"

/* ---- hint ------------------------------------------------------------------------------- */

typedef struct text {
    char  *p;
    size_t cap, len;
} text;

static void add(text *t, const char *fmt, ...) FP4D_PRINTF(2, 3);
static void add(text *t, const char *fmt, ...)
{
    if (t->len + 1 >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n > 0) t->len = t->len + (size_t)n < t->cap ? t->len + (size_t)n : t->cap - 1;
}

/* "NAN_STOP x12, DEGENERATE x3" for the classes selected by `want` (fault or not) over the
 * phases in mask (bit 0 phase 1, bit 1 phase 2). */
static void add_classes(text *t, const fp4d_probe_report *r, unsigned mask, int want_fault)
{
    bool first = true;
    for (int k = 1; k < FP4D_PROBE_CLASS_COUNT; k++) {
        if (want_fault >= 0 && fp4d_probe_class_is_fault((fp4d_probe_class)k) != (want_fault != 0)) continue;
        unsigned n = 0;
        for (int ph = 0; ph < 2; ph++)
            if (mask & (1u << ph)) n += r->phases[ph].counts[k];
        if (!n) continue;
        add(t, "%s%s x%u", first ? "" : ", ", fp4d_probe_class_name((fp4d_probe_class)k), n);
        first = false;
    }
}

static unsigned total(const fp4d_probe_report *r, unsigned mask, fp4d_probe_class k)
{
    unsigned n = 0;
    for (int ph = 0; ph < 2; ph++)
        if (mask & (1u << ph)) n += r->phases[ph].counts[k];
    return n;
}

/* Completed responses of `phase` (1 or 2) with HTTP status `status`. */
static unsigned status_count(const fp4d_probe_report *r, unsigned phase, int status)
{
    unsigned n = 0;
    for (size_t i = 0; i < r->n_records; i++)
        if (r->records[i].phase == phase && r->records[i].http_status == status) n++;
    return n;
}

void fp4d_probe_write_hint(fp4d_probe_report *r)
{
    text t = {r->hint, sizeof r->hint, 0};
    r->hint[0] = '\0';
    const fp4d_probe_phase *p2 = &r->phases[1];
    /* Phase 2 counts as concurrency-1 evidence when it never had two requests in flight. */
    unsigned alone = p2->max_in_flight > 1 ? 1u : 3u;
    bool health_ok = r->health_status >= 200 && r->health_status < 300;

    switch (r->verdict) {
    case FP4D_PROBE_VERDICT_HEALTHY:
        add(&t, "No NaN stop, garbage or %s in %u responses at concurrency 1 and %u with up to %u in flight.",
            !r->answer_check      ? "empty answer (answers not checked)"
            : r->answers_unverified ? "empty answer (the answers could not be verified: see the note)"
                                    : "wrong answer",
            r->phases[0].completed, p2->completed, p2->max_in_flight);
        if (p2->max_in_flight < 2)
            add(&t, " Phase 2 never had two requests in flight, so mixed batches were not tested: "
                    "use --concurrency 2 or more and --rounds 2 or more.");
        break;
    case FP4D_PROBE_VERDICT_BROKEN_AT_CONCURRENCY_1: {
        unsigned engine = total(r, alone, FP4D_PROBE_NAN_STOP) + total(r, alone, FP4D_PROBE_DEGENERATE) +
                          total(r, alone, FP4D_PROBE_EMPTY);
        add(&t, "Broken with one request in flight (");
        add_classes(&t, r, alone, 1);
        add(&t, "). ");
        if (engine)
            add(&t, "The fault does not need a mixed batch: it is in a kernel or in the weights. "
                    "Run `fp4doctor scan CHECKPOINT` on the checkpoint (NaN or 0x7F scale bytes, bad shards) "
                    "and `fp4doctor check` on this GPU (every FP4 GEMM backend against the exact reference).");
        else
            add(&t, "The server fails requests even one at a time (HTTP errors, timeouts or malformed "
                    "responses), so the answers themselves could not be checked: read the server log "
                    "(an engine that hit a CUDA error often keeps its HTTP front end up and fails or hangs "
                    "every request), then run `fp4doctor check` on this GPU.");
        break;
    }
    case FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY: {
        add(&t, "No NaN or garbage one request at a time, but with up to %u requests in flight: ",
            p2->max_in_flight);
        add_classes(&t, r, 2u, -1);
        add(&t, ". ");
        unsigned transport = p2->counts[FP4D_PROBE_HTTP_ERROR] + p2->counts[FP4D_PROBE_TIMEOUT] +
                             p2->counts[FP4D_PROBE_MALFORMED];
        if (transport == p2->completed - p2->counts[FP4D_PROBE_OK]) {
            /* No answer came back wrong, some did not come back: a rate limit, a full queue or
             * a timeout too short for the queueing is as likely as a kernel, so say which. */
            unsigned busy = status_count(r, 2, 429), unavailable = status_count(r, 2, 503);
            add(&t, "The server fails requests only under load (HTTP errors, timeouts or malformed responses, "
                    "no wrong or garbage answer), which is not by itself a kernel fault.");
            if (busy)
                add(&t, " HTTP 429 (x%u) is a rate limit or a full request queue: probe with a --concurrency the "
                        "server admits (SGLang --max-running-requests, vLLM --max-num-seqs) or raise its limit.",
                    busy);
            if (unavailable)
                add(&t, " HTTP 503 (x%u): the server is overloaded or not ready; lower --concurrency.", unavailable);
            if (p2->counts[FP4D_PROBE_TIMEOUT])
                add(&t, " A timeout under load can be queueing: raise --timeout or lower --concurrency.");
            add(&t, " Read the server log: if the engine hit a CUDA error under load (which a batch-dependent "
                    "FP4 kernel fault can cause), try another FP4 GEMM/MoE backend and run `fp4doctor check` "
                    "on this GPU.");
            break;
        }
        add(&t, "A batch-composition-dependent kernel fault (a race, or a tile choice that depends on "
                "the number of rows, as in FlashInfer #2708 and SGLang #20043). Try another FP4 GEMM/MoE "
                "backend: SGLang --fp4-gemm-backend (e.g. flashinfer_cudnn) and --moe-runner-backend; vLLM "
                "--linear-backend and --moe-backend (e.g. marlin). Wipe the FlashInfer JIT cache after "
                "changing versions, then run `fp4doctor check` on this GPU.");
        break;
    }
    case FP4D_PROBE_VERDICT_DEGRADED: {
        add(&t, "No NaN and no garbage, but degraded answers (");
        add_classes(&t, r, 3u, 0);
        add(&t, ").");
        if (total(r, 3u, FP4D_PROBE_REASONING_ONLY))
            add(&t, " Reasoning-only answers (content null, the text in reasoning_content/reasoning) point at "
                    "a reasoning-parser mismatch: check the server's --reasoning-parser for this model.");
        if (total(r, 3u, FP4D_PROBE_WRONG_ANSWER))
            add(&t, " Fluent but wrong answers point at a wrong-but-finite kernel (e.g. scales read in the "
                    "wrong layout): run `fp4doctor check` on this GPU and compare with another backend "
                    "(Marlin is the usual known-good one).");
        if (total(r, 3u, FP4D_PROBE_TRUNCATED))
            add(&t, " Truncated answers: raise --max-tokens (reasoning models think before they answer).");
        break;
    }
    case FP4D_PROBE_VERDICT_UNREACHABLE:
        add(&t, "Could not get an answer from the server: %s. Check the URL and port, that the server is "
                "up (its log), and TLS (--insecure for a self-signed certificate).", r->error);
        break;
    case FP4D_PROBE_VERDICT_INCONCLUSIVE:
        add(&t, "Stopped (%s) after %u responses, none of them bad: run the probe to completion for a verdict.",
            r->stopped_early ? r->stopped_early : "no response", r->phases[0].completed + p2->completed);
        break;
    default:
        break;
    }
    if (health_ok && r->verdict != FP4D_PROBE_VERDICT_HEALTHY && r->verdict != FP4D_PROBE_VERDICT_UNREACHABLE &&
        r->verdict != FP4D_PROBE_VERDICT_INCONCLUSIVE)
        add(&t, " (GET /health answered %d all the same: health checks do not see this.)", r->health_status);
    if (r->stopped_early && r->verdict != FP4D_PROBE_VERDICT_INCONCLUSIVE &&
        r->verdict != FP4D_PROBE_VERDICT_UNREACHABLE) {
        if (!strcmp(r->stopped_early, "timeout"))
            add(&t, " The probe stopped at the first timeout (no answer within %g s); the rest was not sent.",
                r->timeout_s);
        else
            add(&t, " Partial report: the probe was stopped (%s).", r->stopped_early);
    }
}

/* ---- JSON --------------------------------------------------------------------------------- */

/* A JSON string from bytes that may not be valid UTF-8; json_null() when s is NULL. */
static json_t *jstr(const char *s)
{
    if (!s) return json_null();
    char *clean = fp4d_probe_utf8_sanitize(s, strlen(s));
    if (!clean) return NULL;
    json_t *v = json_string(clean);
    free(clean);
    return v;
}

static json_t *jstr_or_null(const char *s) { return s && s[0] ? jstr(s) : json_null(); }

static json_t *counts_json(const fp4d_probe_phase *ph)
{
    json_t *o = json_object();
    for (int k = 0; o && k < FP4D_PROBE_CLASS_COUNT; k++)
        json_object_set_new(o, fp4d_probe_class_name((fp4d_probe_class)k), json_integer(ph->counts[k]));
    return o;
}

static json_t *quote_json(const fp4d_probe_quote *q)
{
    if (!q->present) return json_null();
    const fp4d_probe_prompt *p = fp4d_probe_prompt_at(q->prompt_index);
    json_t *o = json_object();
    json_object_set_new(o, "request_index", json_integer(q->request_index));
    json_object_set_new(o, "prompt_id", jstr(p ? p->id : NULL));
    json_object_set_new(o, "expected", jstr(p ? p->answers[0] : NULL));
    json_object_set_new(o, "class", json_string(fp4d_probe_class_name(q->cls)));
    json_object_set_new(o, "http_status", json_integer(q->http_status));
    json_object_set_new(o, "latency_ms", json_real(q->latency_ms));
    json_object_set_new(o, "finish_reason", jstr_or_null(q->finish_reason));
    json_object_set_new(o, "matched_stop", jstr_or_null(q->matched_stop));
    json_object_set_new(o, "detail", jstr(q->detail));
    json_object_set_new(o, "reasoning_only", json_boolean(q->reasoning_only));
    json_object_set_new(o, "body", jstr(q->body));
    json_object_set_new(o, "body_truncated", json_boolean(q->body_truncated));
    return o;
}

static json_t *phase_json(const fp4d_probe_phase *ph, unsigned number)
{
    json_t *o = json_object();
    json_object_set_new(o, "phase", json_integer(number));
    json_object_set_new(o, "concurrency", json_integer(ph->concurrency));
    json_object_set_new(o, "skipped", json_boolean(ph->skipped));
    json_object_set_new(o, "healthy", ph->skipped ? json_null() : json_boolean(ph->healthy));
    json_object_set_new(o, "planned", json_integer(ph->planned));
    json_object_set_new(o, "sent", json_integer(ph->sent));
    json_object_set_new(o, "completed", json_integer(ph->completed));
    json_object_set_new(o, "aborted", json_integer(ph->aborted));
    json_object_set_new(o, "max_in_flight", json_integer(ph->max_in_flight));
    json_object_set_new(o, "counts", counts_json(ph));
    json_t *lat = json_object();
    json_object_set_new(lat, "p50", json_real(ph->p50_ms));
    json_object_set_new(lat, "p90", json_real(ph->p90_ms));
    json_object_set_new(lat, "p99", json_real(ph->p99_ms));
    json_object_set_new(lat, "max", json_real(ph->max_ms));
    json_object_set_new(o, "latency_ms", ph->completed ? lat : (json_decref(lat), json_null()));
    json_object_set_new(o, "first_offending", quote_json(&ph->first_offending));
    return o;
}

char *fp4d_probe_report_json(const fp4d_probe_report *r)
{
    if (!r) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "schema_version", json_integer(FP4D_PROBE_SCHEMA_VERSION));
    json_object_set_new(o, "tool", json_string("fp4doctor"));
    json_object_set_new(o, "version", json_string(fp4d_version_string()));
    json_object_set_new(o, "command", json_string("probe"));
    json_object_set_new(o, "url", jstr(r->url));
    json_object_set_new(o, "model", jstr_or_null(r->model));
    json_object_set_new(o, "model_source", jstr_or_null(r->model[0] ? r->model_source : NULL));
    json_object_set_new(o, "health_status", r->health_status ? json_integer(r->health_status) : json_null());
    json_object_set_new(o, "api", json_string(r->api == FP4D_PROBE_API_CHAT ? "chat" : "completions"));
    json_object_set_new(o, "stream", json_boolean(r->stream));
    json_object_set_new(o, "answer_check", json_boolean(r->answer_check));
    json_object_set_new(o, "answers_unverified", json_boolean(r->answers_unverified));
    json_object_set_new(o, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(o, "timeout_s", json_real(r->timeout_s));
    json_object_set_new(o, "concurrency", json_integer(r->concurrency));
    json_object_set_new(o, "rounds", json_integer(r->rounds));

    json_t *req = json_object();
    json_object_set_new(req, "discovery", json_integer(r->discovery_requests));
    json_object_set_new(req, "generation", json_integer(r->generation_requests));
    json_object_set_new(req, "bound", json_integer(r->request_bound));
    json_object_set_new(o, "requests", req);

    json_t *phases = json_array();
    for (unsigned i = 0; i < 2; i++) json_array_append_new(phases, phase_json(&r->phases[i], i + 1));
    json_object_set_new(o, "phases", phases);

    json_t *recs = json_array();
    for (size_t i = 0; i < r->n_records; i++) {
        const fp4d_probe_record *rec = &r->records[i];
        const fp4d_probe_prompt *p = fp4d_probe_prompt_at(rec->prompt_index);
        json_t *e = json_object();
        json_object_set_new(e, "phase", json_integer(rec->phase));
        json_object_set_new(e, "prompt_id", jstr(p ? p->id : NULL));
        json_object_set_new(e, "class", json_string(fp4d_probe_class_name(rec->cls)));
        json_object_set_new(e, "http_status", json_integer(rec->http_status));
        json_object_set_new(e, "latency_ms", json_real(rec->latency_ms));
        json_array_append_new(recs, e);
    }
    json_object_set_new(o, "responses", recs);

    json_object_set_new(o, "verdict", json_string(fp4d_probe_verdict_name(r->verdict)));
    json_object_set_new(o, "hint", jstr(r->hint));
    json_object_set_new(o, "stopped_early", jstr_or_null(r->stopped_early));
    json_object_set_new(o, "error", jstr_or_null(r->error));
    json_object_set_new(o, "note", jstr_or_null(r->note));
    json_object_set_new(o, "elapsed_s", json_real(r->elapsed_s));
    json_object_set_new(o, "exit_code", json_integer(fp4d_probe_exit_code(r)));

    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    return s;
}
