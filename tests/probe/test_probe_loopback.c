/*
 * The whole probe (fp4d_probe_run) against real HTTP over loopback: a libmicrohttpd server
 * (fake_server.c) on an ephemeral 127.0.0.1 port plays back healthy and broken servers, and
 * each test checks the class counts of each phase, the verdict, the request bound and the
 * time it takes to give up on a hung server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_server.h"
#include "fp4doctor/probe.h"
#include "test_util.h"

typedef struct run_result {
    fp4d_probe_report *r;
    fake_stats         st;
    double             seconds;
} run_result;

/* Starts a server with `cfg`, probes it with `o` (url filled in), stops the server. */
static run_result probe(const fake_config *cfg, fp4d_probe_options *o)
{
    fake_server *s = fake_server_start(cfg);
    assert_non_null(s);
    o->url = fake_server_url(s);
    run_result res = {0};
    double t0 = tu_now_s();
    fp4d_status st = fp4d_probe_run(o, &res.r);
    res.seconds = tu_now_s() - t0;
    if (st != FP4D_STATUS_OK) fail_msg("fp4d_probe_run: %s", fp4d_last_error());
    res.st = fake_server_stats(s);
    fake_server_stop(s);
    return res;
}

static void small_options(fp4d_probe_options *o, unsigned concurrency, unsigned rounds)
{
    fp4d_probe_options_init(o);
    o->concurrency = concurrency;
    o->rounds = rounds;
    o->timeout_s = 20;
}

/* Every generation request the probe reports must have reached the server, and the total
 * must respect the documented bound. */
static void check_bound(const run_result *res, unsigned c, unsigned r, bool model_given)
{
    assert_int_equal(res->st.posts, res->r->generation_requests);
    assert_true(res->st.posts <= c * r);
    unsigned gets = res->st.health_gets + res->st.models_gets + res->st.other_gets;
    assert_int_equal(gets, res->r->discovery_requests);
    assert_true(gets <= (model_given ? 1u : 2u));
    assert_true(res->st.posts + gets <= res->r->request_bound);
}

static unsigned bad_count(const fp4d_probe_phase *ph) { return ph->completed - ph->counts[FP4D_PROBE_OK]; }

/* ---- healthy servers ---------------------------------------------------------------------- */

static void test_healthy_chat(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY, .delay_ms = 30};
    fp4d_probe_options o;
    small_options(&o, 4, 3);
    run_result res = probe(&cfg, &o);
    fp4d_probe_report *r = res.r;
    unsigned n1, n2;
    fp4d_probe_plan(4, 3, &n1, &n2);
    assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_int_equal(fp4d_probe_exit_code(r), 0);
    assert_int_equal(r->phases[0].counts[FP4D_PROBE_OK], n1);
    assert_int_equal(r->phases[1].counts[FP4D_PROBE_OK], n2);
    assert_true(r->phases[0].healthy && r->phases[1].healthy);
    assert_int_equal(r->phases[0].max_in_flight, 1);
    assert_int_equal(r->phases[1].max_in_flight, 4);
    /* The server really saw concurrent requests, and the discovered model name. */
    assert_true(res.st.max_in_flight >= 2);
    assert_string_equal(r->model, "fake-model");
    assert_string_equal(res.st.last_model, "fake-model");
    assert_string_equal(r->model_source, "/v1/models");
    assert_int_equal(r->health_status, 200);
    assert_int_equal(res.st.posts, 12);
    check_bound(&res, 4, 3, false);
    assert_true(r->phases[0].p50_ms > 0 && r->phases[0].p50_ms <= r->phases[0].p90_ms &&
                r->phases[0].p90_ms <= r->phases[0].p99_ms && r->phases[0].p99_ms <= r->phases[0].max_ms);
    assert_false(r->phases[0].first_offending.present);
    assert_int_equal(r->n_records, 12);
    fp4d_probe_report_free(r);
}

static void test_healthy_stream_and_completions(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    for (int variant = 0; variant < 3; variant++) {
        fp4d_probe_options o;
        small_options(&o, 3, 2);
        o.stream = variant != 1;
        o.api = variant >= 1 ? FP4D_PROBE_API_COMPLETIONS : FP4D_PROBE_API_CHAT;
        run_result res = probe(&cfg, &o);
        if (res.r->verdict != FP4D_PROBE_VERDICT_HEALTHY)
            fail_msg("variant %d: %s (%s)", variant, fp4d_probe_verdict_name(res.r->verdict), res.r->hint);
        assert_int_equal(res.r->phases[0].counts[FP4D_PROBE_OK] + res.r->phases[1].counts[FP4D_PROBE_OK], 6);
        check_bound(&res, 3, 2, false);
        fp4d_probe_report_free(res.r);
    }
}

static void test_no_health_no_models(void **state)
{
    (void)state;
    /* A minimal server: no /health (404 is "no endpoint", not an error), no /v1/models. */
    fake_config cfg = {.behavior = FAKE_HEALTHY, .no_health = true, .no_models = true};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_int_equal(res.r->health_status, 404);
    assert_string_equal(res.r->model_source, "fallback");
    assert_string_equal(res.st.last_model, "default");
    assert_true(strlen(res.r->note) > 0);
    check_bound(&res, 2, 2, false);
    fp4d_probe_report_free(res.r);

    /* With --model there is no GET /v1/models at all. */
    small_options(&o, 2, 2);
    o.model = "my-model";
    res = probe(&cfg, &o);
    assert_int_equal(res.st.models_gets, 0);
    assert_string_equal(res.st.last_model, "my-model");
    check_bound(&res, 2, 2, true);
    fp4d_probe_report_free(res.r);
}

static void test_pasted_endpoint_url(void **state)
{
    (void)state;
    /* People paste the OpenAI base URL or the endpoint itself. */
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    const char *suffixes[] = {"/v1", "/v1/", "/v1/chat/completions"};
    for (size_t i = 0; i < 3; i++) {
        fake_server *s = fake_server_start(&cfg);
        assert_non_null(s);
        char url[128], base[64];
        snprintf(base, sizeof base, "%s", fake_server_url(s));
        snprintf(url, sizeof url, "%s%s", base, suffixes[i]);
        fp4d_probe_options o;
        small_options(&o, 2, 1);
        o.url = url;
        fp4d_probe_report *r = NULL;
        assert_int_equal(fp4d_probe_run(&o, &r), FP4D_STATUS_OK);
        fake_stats st = fake_server_stats(s);
        fake_server_stop(s);
        assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
        assert_int_equal(st.health_gets, 1);
        assert_int_equal(st.other_gets, 0);
        assert_string_equal(r->url, base); /* shown without the suffix */
        fp4d_probe_report_free(r);
    }
}

static void test_request_bound(void **state)
{
    (void)state;
    static const unsigned grid[][2] = {{1, 1}, {3, 1}, {5, 2}, {2, 9}, {16, 3}, {20, 1}};
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) {
        fp4d_probe_options o;
        small_options(&o, grid[i][0], grid[i][1]);
        run_result res = probe(&cfg, &o);
        check_bound(&res, grid[i][0], grid[i][1], false);
        /* A healthy server gets the whole budget, no more. */
        assert_int_equal(res.st.posts, grid[i][0] * grid[i][1]);
        assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
        fp4d_probe_report_free(res.r);
    }
}

/* ---- broken at concurrency 1 ---------------------------------------------------------------- */

static void expect_broken_alone(fake_behavior b, bool stream, fp4d_probe_class cls)
{
    fake_config cfg = {.behavior = b};
    fp4d_probe_options o;
    small_options(&o, 3, 2);
    o.stream = stream;
    run_result res = probe(&cfg, &o);
    fp4d_probe_report *r = res.r;
    unsigned n1, n2;
    fp4d_probe_plan(3, 2, &n1, &n2);
    if (r->phases[0].counts[cls] != n1)
        fail_msg("behavior %d: phase 1 has %u %s of %u (first: %s %s)", (int)b, r->phases[0].counts[cls],
                 fp4d_probe_class_name(cls), n1, fp4d_probe_class_name(r->phases[0].first_offending.cls),
                 r->phases[0].first_offending.detail);
    assert_int_equal(r->phases[1].counts[cls], n2);
    assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_BROKEN_AT_CONCURRENCY_1);
    assert_int_equal(fp4d_probe_exit_code(r), 1);
    assert_false(r->phases[0].healthy);
    assert_true(r->phases[0].first_offending.present);
    assert_int_equal(r->phases[0].first_offending.cls, cls);
    assert_true(strlen(r->phases[0].first_offending.body) > 0);
    check_bound(&res, 3, 2, false);
    fp4d_probe_report_free(r);
}

static void test_nan_stop(void **state)
{
    (void)state;
    expect_broken_alone(FAKE_NAN_STOP, false, FP4D_PROBE_NAN_STOP);
    expect_broken_alone(FAKE_NAN_STOP, true, FP4D_PROBE_NAN_STOP);
    /* The quote shows SGLang's fields. */
    fake_config cfg = {.behavior = FAKE_NAN_STOP};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    assert_string_equal(res.r->phases[0].first_offending.matched_stop, "NaN happened");
    assert_string_equal(res.r->phases[0].first_offending.finish_reason, "stop");
    assert_non_null(strstr(res.r->phases[0].first_offending.body, "NaN happened"));
    assert_non_null(strstr(res.r->hint, "fp4doctor scan"));
    assert_non_null(strstr(res.r->hint, "fp4doctor check"));
    fp4d_probe_report_free(res.r);
}

static void test_bang_reasoning(void **state)
{
    (void)state;
    expect_broken_alone(FAKE_BANG_REASONING, false, FP4D_PROBE_DEGENERATE);
    expect_broken_alone(FAKE_BANG_REASONING, true, FP4D_PROBE_DEGENERATE);
    /* The quote records that the garbage came as reasoning with no content. */
    fake_config cfg = {.behavior = FAKE_BANG_REASONING};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    assert_true(res.r->phases[0].first_offending.reasoning_only);
    assert_non_null(strstr(res.r->phases[0].first_offending.body, "\"reasoning_content\":\"!!!!"));
    assert_non_null(strstr(res.r->phases[0].first_offending.detail, "reasoning only"));
    fp4d_probe_report_free(res.r);
}

static void test_server_errors(void **state)
{
    (void)state;
    expect_broken_alone(FAKE_HTTP_500, false, FP4D_PROBE_HTTP_ERROR);
    expect_broken_alone(FAKE_MALFORMED_JSON, false, FP4D_PROBE_MALFORMED);
    expect_broken_alone(FAKE_SSE_BAD_EVENT, true, FP4D_PROBE_MALFORMED);
    expect_broken_alone(FAKE_SSE_DROP, true, FP4D_PROBE_MALFORMED);

    fake_config cfg = {.behavior = FAKE_HTTP_500};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    assert_int_equal(res.r->phases[0].first_offending.http_status, 500);
    assert_non_null(strstr(res.r->phases[0].first_offending.detail, "illegal memory access"));
    fp4d_probe_report_free(res.r);
}

static void test_redirect_not_followed(void **state)
{
    (void)state;
    /* A redirect is an HTTP_ERROR and is not followed (check_bound: every request the server
     * saw was planned); the detail names the target, which used to be missing ("HTTP 307"). */
    expect_broken_alone(FAKE_REDIRECT, false, FP4D_PROBE_HTTP_ERROR);
    fake_config cfg = {.behavior = FAKE_REDIRECT};
    fp4d_probe_options o;
    small_options(&o, 1, 1);
    run_result res = probe(&cfg, &o);
    const fp4d_probe_quote *q = &res.r->phases[0].first_offending;
    assert_int_equal(q->http_status, 307);
    if (!strstr(q->detail, "redirect to http://127.0.0.1:1/moved/v1/chat/completions") ||
        !strstr(q->detail, "not followed"))
        fail_msg("detail: %s", q->detail);
    assert_int_equal(res.st.posts, 1);
    fp4d_probe_report_free(res.r);
}

/* ---- broken only under concurrency ----------------------------------------------------------- */

static void expect_broken_under_load(fake_behavior b, fp4d_probe_class cls)
{
    /* The server decides after 60 ms whether another request is in flight. */
    fake_config cfg = {.behavior = b, .delay_ms = 60};
    fp4d_probe_options o;
    small_options(&o, 4, 3);
    run_result res = probe(&cfg, &o);
    fp4d_probe_report *r = res.r;
    assert_true(r->phases[0].healthy);
    assert_int_equal(bad_count(&r->phases[0]), 0);
    assert_true(res.st.garbage_answers >= 1);
    /* Every answer the server spoiled is seen, with the right class. */
    assert_int_equal(r->phases[1].counts[cls], res.st.garbage_answers);
    assert_int_equal(bad_count(&r->phases[1]), res.st.garbage_answers);
    assert_false(r->phases[1].healthy);
    assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY);
    assert_int_equal(fp4d_probe_exit_code(r), 1);
    assert_true(r->phases[1].first_offending.present);
    assert_non_null(strstr(r->hint, "backend"));
    check_bound(&res, 4, 3, false);
    fp4d_probe_report_free(r);
}

static void test_garbage_under_concurrency(void **state)
{
    (void)state;
    expect_broken_under_load(FAKE_GARBAGE_WHEN_CONCURRENT, FP4D_PROBE_DEGENERATE);
    expect_broken_under_load(FAKE_NAN_WHEN_CONCURRENT, FP4D_PROBE_NAN_STOP);
    /* Fluent but wrong only in batches: still a batch-dependent fault, not "degraded". */
    expect_broken_under_load(FAKE_WRONG_WHEN_CONCURRENT, FP4D_PROBE_WRONG_ANSWER);
}

/* A server that refuses requests under load (HTTP 429) fails phase 2, but the hint must not
 * send the user after FP4 kernels: it used to call every phase-2-only fault "a
 * batch-composition-dependent kernel fault" and recommend other GEMM/MoE backends. */
static void test_rate_limited_under_concurrency(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_BUSY_WHEN_CONCURRENT, .delay_ms = 60};
    fp4d_probe_options o;
    small_options(&o, 4, 3);
    run_result res = probe(&cfg, &o);
    fp4d_probe_report *r = res.r;
    assert_true(r->phases[0].healthy);
    assert_true(res.st.garbage_answers >= 1);
    assert_int_equal(r->phases[1].counts[FP4D_PROBE_HTTP_ERROR], res.st.garbage_answers);
    assert_int_equal(r->phases[1].first_offending.http_status, 429);
    /* The verdict follows the documented rule (a fault only in phase 2)... */
    assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY);
    assert_int_equal(fp4d_probe_exit_code(r), 1);
    /* ...but the hint names the rate limit and the way around it, not a kernel fault. */
    if (strstr(r->hint, "batch-composition-dependent kernel fault") || !strstr(r->hint, "HTTP 429") ||
        !strstr(r->hint, "--concurrency"))
        fail_msg("hint: %s", r->hint);
    check_bound(&res, 4, 3, false);
    fp4d_probe_report_free(r);

    /* Garbage under load keeps the kernel hint. */
    cfg.behavior = FAKE_GARBAGE_WHEN_CONCURRENT;
    small_options(&o, 4, 3);
    res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY);
    assert_non_null(strstr(res.r->hint, "batch-composition-dependent kernel fault"));
    fp4d_probe_report_free(res.r);
}

static void test_concurrency_one_cannot_blame_batches(void **state)
{
    (void)state;
    /* With --concurrency 1 nothing is ever concurrent, so the garbage server looks healthy,
     * and the hint says that mixed batches were not tested. */
    fake_config cfg = {.behavior = FAKE_GARBAGE_WHEN_CONCURRENT, .delay_ms = 10};
    fp4d_probe_options o;
    small_options(&o, 1, 4);
    run_result res = probe(&cfg, &o);
    assert_int_equal(res.st.max_in_flight, 1);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_non_null(strstr(res.r->hint, "not tested"));
    fp4d_probe_report_free(res.r);
}

/* ---- degraded ------------------------------------------------------------------------------- */

static void test_degraded(void **state)
{
    (void)state;
    fake_behavior bs[] = {FAKE_WRONG_ANSWER, FAKE_REASONING_ONLY};
    fp4d_probe_class cs[] = {FP4D_PROBE_WRONG_ANSWER, FP4D_PROBE_REASONING_ONLY};
    const char *words[] = {"wrong-but-finite", "reasoning-parser"};
    for (int i = 0; i < 2; i++) {
        fake_config cfg = {.behavior = bs[i]};
        fp4d_probe_options o;
        small_options(&o, 3, 2);
        o.stream = i == 1;
        /* A server that gets every checkable prompt wrong is held to it only with
         * --strict-answers (by default it looks like a canned/mock server: see below). */
        o.strict_answers = i == 0;
        run_result res = probe(&cfg, &o);
        assert_int_equal(res.r->phases[0].counts[cs[i]], res.r->phases[0].completed);
        assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_DEGRADED);
        assert_non_null(strstr(res.r->hint, words[i]));
        assert_int_equal(fp4d_probe_exit_code(res.r), 1);
        fp4d_probe_report_free(res.r);
    }
    /* Default: no prompt answered right anywhere = answers unverifiable (a canned server),
     * noted but not a failure. */
    {
        fake_config cfg = {.behavior = FAKE_WRONG_ANSWER};
        fp4d_probe_options o;
        small_options(&o, 3, 2);
        run_result res = probe(&cfg, &o);
        assert_true(res.r->answers_unverified);
        assert_true(res.r->phases[0].counts[FP4D_PROBE_WRONG_ANSWER] > 0);
        assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
        assert_non_null(strstr(res.r->note, "unverifiable"));
        /* the summary does not claim that no answer was wrong */
        assert_null(strstr(res.r->hint, "wrong answer"));
        assert_non_null(strstr(res.r->hint, "the answers could not be verified"));
        assert_int_equal(fp4d_probe_exit_code(res.r), 0);
        fp4d_probe_report_free(res.r);
    }
    /* A canned server whose one fixed reply happens to be right for one prompt ("7"): the
     * same text for every prompt marks the answers unverifiable too. */
    {
        fake_config cfg = {.behavior = FAKE_CANNED};
        fp4d_probe_options o;
        small_options(&o, 4, 6);
        run_result res = probe(&cfg, &o);
        assert_true(res.r->phases[0].counts[FP4D_PROBE_OK] + res.r->phases[1].counts[FP4D_PROBE_OK] > 0);
        assert_true(res.r->answers_unverified);
        assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
        assert_non_null(strstr(res.r->note, "same answer text"));
        fp4d_probe_report_free(res.r);
        o.strict_answers = true;
        res = probe(&cfg, &o);
        assert_int_not_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
        fp4d_probe_report_free(res.r);
    }
    /* --no-answer-check: wrong answers are not judged. */
    fake_config cfg = {.behavior = FAKE_WRONG_ANSWER};
    fp4d_probe_options o;
    small_options(&o, 3, 2);
    o.no_answer_check = true;
    run_result res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    fp4d_probe_report_free(res.r);
}

/* ---- hung and unreachable servers ------------------------------------------------------------ */

static void test_hung_server_stops_within_timeout(void **state)
{
    (void)state;
    /* Completions hang: the first one times out after --timeout and the probe stops. */
    fake_config cfg = {.behavior = FAKE_HANG};
    fp4d_probe_options o;
    small_options(&o, 8, 4);
    o.timeout_s = 1.0;
    run_result res = probe(&cfg, &o);
    /* Generous: on a loaded 2-core machine the stop may lag; a probe that kept sending would
     * take 1 s per request (14+ s). */
    assert_true(res.seconds < o.timeout_s + 2.0);
    assert_int_equal(res.r->phases[0].counts[FP4D_PROBE_TIMEOUT], 1);
    assert_string_equal(res.r->stopped_early, "timeout");
    assert_true(res.r->phases[1].skipped);
    assert_int_equal(res.st.posts, 1);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_BROKEN_AT_CONCURRENCY_1);
    assert_int_equal(fp4d_probe_exit_code(res.r), 1);
    fp4d_probe_report_free(res.r);

    /* Nothing answers, not even /health. */
    fake_config all = {.behavior = FAKE_HANG_ALL};
    small_options(&o, 8, 4);
    o.timeout_s = 1.0;
    res = probe(&all, &o);
    assert_true(res.seconds < o.timeout_s + 2.0);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_UNREACHABLE);
    assert_int_equal(res.st.posts, 0);
    assert_int_equal(fp4d_probe_exit_code(res.r), 3);
    fp4d_probe_report_free(res.r);
}

static void test_unreachable(void **state)
{
    (void)state;
    /* A port that was just listening and is now closed. */
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    fake_server *s = fake_server_start(&cfg);
    assert_non_null(s);
    char url[64];
    snprintf(url, sizeof url, "%s", fake_server_url(s));
    fake_server_stop(s);
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    o.url = url;
    o.timeout_s = 5;
    fp4d_probe_report *r = NULL;
    assert_int_equal(fp4d_probe_run(&o, &r), FP4D_STATUS_OK);
    assert_int_equal(r->verdict, FP4D_PROBE_VERDICT_UNREACHABLE);
    assert_int_equal(fp4d_probe_exit_code(r), 3);
    assert_true(strlen(r->error) > 0);
    assert_int_equal(r->generation_requests, 0);
    fp4d_probe_report_free(r);

    /* Bad options are errors, not reports. */
    fp4d_probe_options_init(&o);
    o.url = "ftp://127.0.0.1:1/";
    assert_int_equal(fp4d_probe_run(&o, &r), FP4D_STATUS_INVALID_ARG);
    assert_null(r);
    o.url = url;
    o.concurrency = 0;
    assert_int_equal(fp4d_probe_run(&o, &r), FP4D_STATUS_INVALID_ARG);
}

/* ---- API key and cancellation --------------------------------------------------------------- */

static void test_api_key(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY, .required_key = "sk-test-5150"};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    /* Without the key every request is refused: 401 is an HTTP_ERROR. */
    assert_int_equal(res.r->phases[0].counts[FP4D_PROBE_HTTP_ERROR], res.r->phases[0].completed);
    assert_int_equal(res.r->phases[0].first_offending.http_status, 401);
    fp4d_probe_report_free(res.r);

    small_options(&o, 2, 2);
    o.api_key = "sk-test-5150";
    res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_int_equal(res.st.auth_ok, 4);
    assert_int_equal(res.st.auth_bad, 0);
    char *json = fp4d_probe_report_json(res.r);
    assert_non_null(json);
    assert_null(strstr(json, "sk-test-5150"));
    free(json);
    fp4d_probe_report_free(res.r);
}

static volatile sig_atomic_t cancel_flag;

static void cancel_after_three(void *user, const fp4d_probe_record *rec, unsigned done, unsigned planned)
{
    (void)user;
    (void)rec;
    (void)planned;
    if (done == 3) cancel_flag = 1;
}

static void test_cancel(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    fp4d_probe_options o;
    small_options(&o, 4, 5);
    cancel_flag = 0;
    o.cancel = &cancel_flag;
    o.on_response = cancel_after_three;
    run_result res = probe(&cfg, &o);
    assert_string_equal(res.r->stopped_early, "interrupted");
    assert_int_equal(res.r->phases[0].completed, 3);
    assert_int_equal(res.st.posts, 3);
    assert_true(res.r->phases[1].skipped);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_INCONCLUSIVE);
    assert_int_equal(fp4d_probe_exit_code(res.r), 1);
    fp4d_probe_report_free(res.r);
}

/* ---- TLS, slow answers, deadline ------------------------------------------------------------ */

static void test_tls(void **state)
{
    (void)state;
    /* A throwaway self-signed certificate, made now rather than kept in the tree. */
    char dir[] = "/tmp/fp4d_probe_tls_XXXXXX";
    if (!mkdtemp(dir)) skip();
    char cmd[512], cert_path[128], key_path[128];
    snprintf(cert_path, sizeof cert_path, "%s/cert.pem", dir);
    snprintf(key_path, sizeof key_path, "%s/key.pem", dir);
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
             "-subj /CN=127.0.0.1 -keyout %s -out %s >/dev/null 2>&1", key_path, cert_path);
    int rc = system(cmd);
    char *cert = tu_slurp(cert_path, NULL), *key = tu_slurp(key_path, NULL);
    unlink(cert_path);
    unlink(key_path);
    rmdir(dir);
    if (rc != 0 || !cert || !key || !cert[0] || !key[0]) {
        free(cert);
        free(key);
        skip(); /* no openssl command here */
    }
    fake_config cfg = {.behavior = FAKE_HEALTHY, .tls_cert_pem = cert, .tls_key_pem = key};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    run_result res = probe(&cfg, &o);
    /* libcurl's default verification refuses a self-signed certificate. */
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_UNREACHABLE);
    assert_int_equal(res.st.posts, 0);
    assert_non_null(strstr(res.r->url, "https://"));
    fp4d_probe_report_free(res.r);

    small_options(&o, 2, 2);
    o.insecure = true;
    res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_int_equal(res.st.posts, 4);
    fp4d_probe_report_free(res.r);
    free(cert);
    free(key);
}

static void test_slow_answers_and_deadline(void **state)
{
    (void)state;
    /* Slow but within --timeout: OK, and the latency percentiles show the wait. */
    fake_config cfg = {.behavior = FAKE_HEALTHY, .delay_ms = 250};
    fp4d_probe_options o;
    small_options(&o, 2, 2);
    o.timeout_s = 10;
    run_result res = probe(&cfg, &o);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_HEALTHY);
    assert_true(res.r->phases[0].p50_ms >= 250.0);
    assert_true(res.r->phases[1].p50_ms >= 250.0);
    fp4d_probe_report_free(res.r);

    /* --deadline ends the probe like Ctrl-C does. */
    small_options(&o, 1, 40);
    o.deadline_s = 0.6;
    res = probe(&cfg, &o);
    assert_string_equal(res.r->stopped_early, "deadline");
    assert_true(res.st.posts < 40);
    assert_int_equal(res.r->verdict, FP4D_PROBE_VERDICT_INCONCLUSIVE);
    assert_int_equal(fp4d_probe_exit_code(res.r), 1);
    fp4d_probe_report_free(res.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy_chat),
        cmocka_unit_test(test_healthy_stream_and_completions),
        cmocka_unit_test(test_no_health_no_models),
        cmocka_unit_test(test_pasted_endpoint_url),
        cmocka_unit_test(test_request_bound),
        cmocka_unit_test(test_nan_stop),
        cmocka_unit_test(test_bang_reasoning),
        cmocka_unit_test(test_server_errors),
        cmocka_unit_test(test_redirect_not_followed),
        cmocka_unit_test(test_garbage_under_concurrency),
        cmocka_unit_test(test_rate_limited_under_concurrency),
        cmocka_unit_test(test_concurrency_one_cannot_blame_batches),
        cmocka_unit_test(test_degraded),
        cmocka_unit_test(test_hung_server_stops_within_timeout),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_api_key),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_slow_answers_and_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
