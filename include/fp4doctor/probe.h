/*
 * probe.h - probe a running OpenAI-compatible server (SGLang, vLLM, ...) for the output
 * signatures of broken FP4 kernels: SGLang's "NaN happened" stop, `!!!!!!!!` garbage,
 * reasoning-only answers, wrong answers, and faults that appear only under concurrency.
 *
 * The probe sends a built-in set of prompts with mechanically checkable answers at
 * temperature 0, first one at a time (phase 1), then with up to `concurrency` requests in
 * flight (phase 2), classifies every response and gives a verdict with a hint.
 *
 * Request bound: the probe sends at most concurrency x rounds generation requests in total
 * (phase 1 and phase 2 together, see fp4d_probe_plan) plus at most two discovery requests
 * (GET /health, and GET /v1/models when no model is given). It never retries.
 *
 * Available only when the library was built with libcurl (FP4D_USE_PROBE defined).
 * See docs/probe.md.
 */
#ifndef FP4DOCTOR_PROBE_H
#define FP4DOCTOR_PROBE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "fp4doctor/fp4doctor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the `fp4doctor probe --json` document (docs/json-schema.md, "## probe"). */
#define FP4D_PROBE_SCHEMA_VERSION 1
/* The first offending response of each phase is quoted up to this many bytes. */
#define FP4D_PROBE_QUOTE_MAX 2048
/* Discovery requests at most: GET /health and GET /v1/models. */
#define FP4D_PROBE_MAX_DISCOVERY_REQUESTS 2

/*
 * Per-response classes. Names are stable (people grep for them). After OK, the list is in
 * the order the classes are tested, so a response gets the first one that applies.
 * X(name, fault, description): fault = 1 for the signatures of a broken engine (the
 * verdict calls a phase "broken"), 0 for degraded answers.
 */
#define FP4D_PROBE_CLASS_LIST(X)                                                              \
    X(OK,             0, "the expected answer, well formed")                                   \
    X(HTTP_ERROR,     1, "HTTP status other than 2xx, an error object, or no connection")      \
    X(TIMEOUT,        1, "no complete response within --timeout")                              \
    X(MALFORMED,      1, "unparseable JSON body or SSE stream, or a field of the wrong type")  \
    X(NAN_STOP,       1, "matched_stop \"NaN happened\" or a finish reason reporting NaN")     \
    X(DEGENERATE,     1, "one character or short n-gram repeated, or near-zero entropy")       \
    X(EMPTY,          1, "no content and no reasoning")                                        \
    X(REASONING_ONLY, 0, "reasoning text but no content, not cut by the length limit")         \
    X(TRUNCATED,      0, "finish_reason length before the answer appeared")                    \
    X(WRONG_ANSWER,   0, "fluent content without the expected answer")

typedef enum fp4d_probe_class {
#define FP4D_PROBE_CLASS_ENUM_(name, fault, desc) FP4D_PROBE_##name,
    FP4D_PROBE_CLASS_LIST(FP4D_PROBE_CLASS_ENUM_)
#undef FP4D_PROBE_CLASS_ENUM_
    FP4D_PROBE_CLASS_COUNT
} fp4d_probe_class;

/* "OK", "NAN_STOP", ...; "UNKNOWN" for an out-of-range value. */
const char *fp4d_probe_class_name(fp4d_probe_class c);
const char *fp4d_probe_class_description(fp4d_probe_class c);
/* True for the classes that mark a phase as broken (see FP4D_PROBE_CLASS_LIST). */
bool fp4d_probe_class_is_fault(fp4d_probe_class c);

typedef enum fp4d_probe_api {
    FP4D_PROBE_API_CHAT = 0,    /* POST /v1/chat/completions */
    FP4D_PROBE_API_COMPLETIONS  /* POST /v1/completions */
} fp4d_probe_api;

/* ---- the built-in prompt set ----------------------------------------------------------- */

/*
 * One prompt. `text` is the user message (chat API); the completions API sends
 * `text` followed by FP4D_PROBE_COMPLETION_SUFFIX. `answers` lists accepted answers,
 * canonical first, NULL-terminated; a response is correct when its content contains one of
 * them as a whole token (case-insensitive; see fp4d_probe_answer_matches).
 * `padding_words` > 0 marks a padding prompt: filler text of about that many words in front
 * of the question, so that concurrent batches mix very different lengths.
 */
typedef struct fp4d_probe_prompt {
    const char *id;
    const char *text;
    const char *answers[4];
    unsigned    padding_words;
} fp4d_probe_prompt;

#define FP4D_PROBE_COMPLETION_SUFFIX "\nAnswer:"

/* How many built-in prompts there are (0 when they could not be prepared). */
size_t fp4d_probe_prompt_count(void);
/* Prompt i, static storage owned by the library (do not free); NULL when i is out of range.
 * Prompts are ordered so that consecutive ones differ in length. */
const fp4d_probe_prompt *fp4d_probe_prompt_at(size_t i);
/*
 * The prompt whose text starts `sent` (the chat message content or the completions prompt
 * as the probe sent it), or NULL. Meant for test servers that answer the probe correctly.
 */
const fp4d_probe_prompt *fp4d_probe_prompt_find(const char *sent);
/* True when `content` contains one of p's answers as a whole token (case-insensitive). */
bool fp4d_probe_answer_matches(const fp4d_probe_prompt *p, const char *content);

/*
 * Degenerate-text test: true when at least 8 characters of non-blank text are dominated by
 * a repetition (a period of 1..16 characters covering >= 50% of the text with >= 4 repeats,
 * 8 for a single character), the character entropy is below 1.5 bits over >= 24
 * characters, or >= 32 bytes mix letters of four or more writing systems, two or more each
 * (random tokens of a multilingual vocabulary: not an answer to an English prompt). `why`
 * (may be NULL) receives a one-line explanation.
 */
bool fp4d_probe_text_is_degenerate(const char *s, size_t n, char *why, size_t why_len);

/* ---- classification of one response ----------------------------------------------------- */

typedef struct fp4d_probe_outcome {
    fp4d_probe_class cls;
    int              http_status;        /* 0: no HTTP response */
    char             finish_reason[32];  /* "" when absent */
    char             matched_stop[64];   /* "" when absent; numbers are written as decimals */
    char            *content;            /* malloc'd, NULL when absent or null */
    char            *reasoning;          /* reasoning_content or reasoning; NULL when absent */
    char             detail[200];        /* why this class, one line */
} fp4d_probe_outcome;

/*
 * Classifies a complete HTTP response body (JSON, or an SSE stream when `stream`) for the
 * prompt `p` (NULL: no answer check; fluent content counts as OK). Transport failures
 * (timeouts, refused connections) are classified by the runner, not here.
 * Returns OK (the class is in out->cls) or NOMEM. Free with fp4d_probe_outcome_free.
 */
fp4d_status fp4d_probe_classify(const char *body, size_t len, int http_status, bool stream,
                                fp4d_probe_api api, const fp4d_probe_prompt *p,
                                fp4d_probe_outcome *out);
void fp4d_probe_outcome_free(fp4d_probe_outcome *out);

/* ---- running a probe --------------------------------------------------------------------- */

struct fp4d_probe_record;

typedef struct fp4d_probe_options {
    const char    *url;          /* http(s)://host:port[/prefix]; a trailing /v1[/chat/completions] is accepted */
    const char    *model;        /* NULL: discover through GET /v1/models */
    unsigned       concurrency;  /* phase 2 requests in flight, default 16 */
    unsigned       rounds;       /* default 3; the budget is concurrency x rounds */
    double         timeout_s;    /* per request, default 60 */
    double         deadline_s;   /* whole probe, default 1800; 0 = none */
    unsigned       max_tokens;   /* default 512 */
    bool           stream;       /* SSE */
    fp4d_probe_api api;
    bool           insecure;     /* skip TLS verification (default: libcurl's verification) */
    bool           no_answer_check; /* only failure signatures count; WRONG_ANSWER never set */
    bool           strict_answers;  /* wrong answers count even when NO checkable prompt was
                                     * answered right (default: then the answers are treated as
                                     * unverifiable, e.g. a mock server, and only noted) */
    const char    *api_key;      /* sent as "Authorization: Bearer ..."; never printed or stored */
    /* Set to non-zero (e.g. from a SIGINT handler) to stop: in-flight requests are dropped
     * and the report covers what completed. May be NULL. */
    volatile sig_atomic_t *cancel;
    /* Called after each generation response is classified (progress display). May be NULL. */
    void (*on_response)(void *user, const struct fp4d_probe_record *rec, unsigned done,
                        unsigned planned);
    void *user;
} fp4d_probe_options;

void fp4d_probe_options_init(fp4d_probe_options *o);

/*
 * How the budget concurrency x rounds is split: phase 1 sends
 * min(prompt count, max(1, budget - concurrency)) prompts one at a time, phase 2 sends the
 * rest (budget - phase 1) with `concurrency` in flight. So phase 2 always gets at least one
 * full window when rounds >= 2, and the total never exceeds the budget. A budget above
 * UINT_MAX (any unsigned inputs are accepted) counts as UINT_MAX, so *phase1 + *phase2 never
 * overflows an unsigned.
 */
void fp4d_probe_plan(unsigned concurrency, unsigned rounds, unsigned *phase1, unsigned *phase2);

#define FP4D_PROBE_VERDICT_LIST(X)                                                            \
    X(HEALTHY,                  "healthy")                                                     \
    X(BROKEN_AT_CONCURRENCY_1,  "broken_at_concurrency_1")                                     \
    X(BROKEN_UNDER_CONCURRENCY, "broken_under_concurrency")                                    \
    X(DEGRADED,                 "degraded")                                                    \
    X(UNREACHABLE,              "unreachable")                                                 \
    X(INCONCLUSIVE,             "inconclusive")

typedef enum fp4d_probe_verdict {
#define FP4D_PROBE_VERDICT_ENUM_(name, str) FP4D_PROBE_VERDICT_##name,
    FP4D_PROBE_VERDICT_LIST(FP4D_PROBE_VERDICT_ENUM_)
#undef FP4D_PROBE_VERDICT_ENUM_
    FP4D_PROBE_VERDICT_COUNT
} fp4d_probe_verdict;

const char *fp4d_probe_verdict_name(fp4d_probe_verdict v);

/* A response quoted in full (body bounded to FP4D_PROBE_QUOTE_MAX bytes). */
typedef struct fp4d_probe_quote {
    bool             present;
    unsigned         request_index;   /* within its phase */
    size_t           prompt_index;
    fp4d_probe_class cls;
    int              http_status;
    double           latency_ms;
    char             finish_reason[32];
    char             matched_stop[64];
    char             detail[200];
    bool             reasoning_only;  /* content empty, reasoning present (any class) */
    char             body[FP4D_PROBE_QUOTE_MAX + 1];
    bool             body_truncated;
} fp4d_probe_quote;

typedef struct fp4d_probe_phase {
    bool             skipped;         /* planned 0 requests, or stopped before it began */
    bool             healthy;         /* every completed response OK (and one completed) */
    unsigned         concurrency;
    unsigned         planned, sent, completed, aborted; /* aborted: dropped by a stop */
    unsigned         max_in_flight;
    unsigned         counts[FP4D_PROBE_CLASS_COUNT];
    double           p50_ms, p90_ms, p99_ms, max_ms;  /* over completed responses */
    fp4d_probe_quote first_offending;
} fp4d_probe_phase;

/* One line per completed response. */
typedef struct fp4d_probe_record {
    unsigned         phase;           /* 1 or 2 */
    size_t           prompt_index;
    fp4d_probe_class cls;
    int              http_status;
    double           latency_ms;
} fp4d_probe_record;

typedef struct fp4d_probe_report {
    char               url[1024];     /* as given, user:password removed */
    char               model[256];
    const char        *model_source;  /* "option", "/v1/models" or "fallback" */
    int                health_status; /* HTTP status of GET /health; 0 no answer; 404 = none */
    unsigned           concurrency, rounds, max_tokens;
    double             timeout_s;
    bool               stream;
    fp4d_probe_api     api;
    bool               answer_check;
    bool               answers_unverified; /* no checkable prompt answered right anywhere:
                                            * WRONG_ANSWER noted, not held against the server */
    unsigned           discovery_requests, generation_requests, request_bound;
    fp4d_probe_phase   phases[2];
    fp4d_probe_record *records;
    size_t             n_records;
    fp4d_probe_verdict verdict;
    char               hint[1536];
    const char        *stopped_early; /* NULL, "interrupted", "timeout" or "deadline" */
    char               error[512];    /* why unreachable; "" otherwise */
    char               note[512];     /* discovery remarks (no /v1/models, ...); "" if none */
    double             elapsed_s;
} fp4d_probe_report;

/*
 * Runs the probe. Returns OK whenever a report was produced, healthy or not (unreachable
 * servers included: verdict UNREACHABLE); INVALID_ARG for bad options; NOMEM.
 * Time bound: each request gets timeout_s; the first TIMEOUT, the deadline or *cancel stops
 * the probe (in-flight requests dropped, report partial, stopped_early set), so a hung
 * server costs at most one timeout_s. One thread drives every transfer (libcurl multi);
 * it calls curl_global_init, so do not run two probes at once in one process.
 * Free the report with fp4d_probe_report_free.
 */
fp4d_status fp4d_probe_run(const fp4d_probe_options *o, fp4d_probe_report **out);
void        fp4d_probe_report_free(fp4d_probe_report *r); /* NULL is a no-op */

/* The `--json` document (malloc'd, NUL-terminated, caller frees); NULL when out of memory. */
char *fp4d_probe_report_json(const fp4d_probe_report *r);

/* 0 healthy, 3 unreachable, 1 otherwise (unhealthy, inconclusive or interrupted). */
int fp4d_probe_exit_code(const fp4d_probe_report *r);

#ifdef __cplusplus
}
#endif
#endif
