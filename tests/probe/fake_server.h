/*
 * A small OpenAI-compatible HTTP server for the probe's tests (libmicrohttpd, loopback only,
 * ephemeral port). It plays back the behaviours of broken and healthy servers. One thread
 * per connection, so "requests in flight" is a real, countable quantity.
 */
#ifndef FP4D_TEST_FAKE_SERVER_H
#define FP4D_TEST_FAKE_SERVER_H

#include <stdbool.h>

typedef enum fake_behavior {
    FAKE_HEALTHY,               /* correct answers (looked up with fp4d_probe_prompt_find) */
    FAKE_NAN_STOP,              /* SGLang: finish_reason "stop", matched_stop "NaN happened" */
    FAKE_BANG_REASONING,        /* content null, reasoning_content "!!!!!!!!..." */
    FAKE_REASONING_ONLY,        /* content null, fluent reasoning, finish_reason "stop" */
    FAKE_WRONG_ANSWER,          /* fluent, finite, wrong */
    FAKE_CANNED,                /* one fixed reply to every prompt, right for one of them */
    FAKE_GARBAGE_WHEN_CONCURRENT, /* healthy alone; `!!!!` garbage when > 1 request in flight */
    FAKE_NAN_WHEN_CONCURRENT,   /* healthy alone; NaN stop when > 1 request in flight */
    FAKE_WRONG_WHEN_CONCURRENT, /* healthy alone; fluent wrong answers when > 1 in flight */
    FAKE_BUSY_WHEN_CONCURRENT,  /* healthy alone; HTTP 429 (error object) when > 1 in flight:
                                   a rate limit, not a kernel fault */
    FAKE_REDIRECT,              /* completions: 307 to http://127.0.0.1:1/moved/v1/... */
    FAKE_HTTP_500,              /* HTTP 500 with an OpenAI error object */
    FAKE_MALFORMED_JSON,        /* 200 with a body cut in the middle of the JSON */
    FAKE_SSE_BAD_EVENT,         /* stream: one good event, then "data: {not json" */
    FAKE_SSE_DROP,              /* stream: one good event, then the connection is dropped */
    FAKE_HANG,                  /* /health and /v1/models answer; completions never do */
    FAKE_HANG_ALL,              /* nothing ever answers */
    FAKE_HOSTILE_TEXT,          /* a NaN stop whose content, finish_reason and matched_stop
                                   carry terminal escapes (ESC, C1 CSI) */
    FAKE_HOSTILE_RAW            /* a body (not JSON) of raw ESC, 0x9B, 0xFF and a NUL byte with
                                   text after it */
} fake_behavior;

typedef struct fake_config {
    fake_behavior behavior;
    unsigned      delay_ms;      /* every completion waits this long (in-flight overlap) */
    bool          no_health;     /* GET /health -> 404 */
    bool          no_models;     /* GET /v1/models -> 404 */
    const char   *required_key;  /* when set, completions need "Authorization: Bearer KEY" */
    const char   *model_id;      /* the id GET /v1/models names; NULL: "fake-model" */
    const char   *tls_cert_pem;  /* when both are set, HTTPS (url starts with https://) */
    const char   *tls_key_pem;
} fake_config;

typedef struct fake_stats {
    unsigned health_gets, models_gets, other_gets, posts;
    unsigned max_in_flight;      /* completions being handled at once */
    unsigned auth_ok, auth_bad;
    unsigned garbage_answers;    /* answers made bad because of concurrency */
    char     last_model[128];    /* "model" of the last completion request */
} fake_stats;

typedef struct fake_server fake_server;

/* NULL on failure (message on stderr). */
fake_server   *fake_server_start(const fake_config *cfg);
unsigned short fake_server_port(const fake_server *s);
/* "http://127.0.0.1:PORT" */
const char    *fake_server_url(const fake_server *s);
fake_stats     fake_server_stats(fake_server *s);
/* Wakes hung handlers and stops; the struct is freed. */
void           fake_server_stop(fake_server *s);

#endif
