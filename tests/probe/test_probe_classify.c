/* Classification of canned response bodies, the prompt set, the degenerate-text test and
 * the request plan of the endpoint probe (no network). */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "fp4doctor/probe.h"

static const fp4d_probe_prompt *prompt_by_id(const char *id)
{
    for (size_t i = 0; i < fp4d_probe_prompt_count(); i++)
        if (!strcmp(fp4d_probe_prompt_at(i)->id, id)) return fp4d_probe_prompt_at(i);
    fail_msg("no prompt '%s'", id);
    return NULL;
}

/* Classifies a chat body for the "add" prompt (expected answer 42). */
static fp4d_probe_outcome classify(const char *body, int status, bool stream)
{
    fp4d_probe_outcome o;
    assert_int_equal(fp4d_probe_classify(body, strlen(body), status, stream, FP4D_PROBE_API_CHAT,
                                         prompt_by_id("add"), &o),
                     FP4D_STATUS_OK);
    return o;
}

static void expect_class(const char *body, int status, bool stream, fp4d_probe_class want)
{
    fp4d_probe_outcome o = classify(body, status, stream);
    if (o.cls != want)
        fail_msg("expected %s, got %s (%s) for body: %s", fp4d_probe_class_name(want),
                 fp4d_probe_class_name(o.cls), o.detail, body);
    fp4d_probe_outcome_free(&o);
}

/* ---- JSON bodies ---------------------------------------------------------------------- */

static void test_healthy_and_wrong(void **state)
{
    (void)state;
    expect_class("{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"The answer is 42.\"},"
                 "\"finish_reason\":\"stop\"}]}", 200, false, FP4D_PROBE_OK);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"**42**\"},\"finish_reason\":\"stop\"}]}", 200, false,
                 FP4D_PROBE_OK);
    /* A reasoning model that thinks first and answers in content. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\",\"reasoning_content\":\"17 plus 25 is 42.\"},"
                 "\"finish_reason\":\"stop\"}]}", 200, false, FP4D_PROBE_OK);
    /* Whole-token match: 142 and 420 are not 42. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"It is 142, or maybe 420.\"},\"finish_reason\":\"stop\"}]}",
                 200, false, FP4D_PROBE_WRONG_ANSWER);
    fp4d_probe_outcome o = classify("{\"choices\":[{\"message\":{\"content\":\"The answer is 41.\"},"
                                    "\"finish_reason\":\"stop\"}]}", 200, false);
    assert_int_equal(o.cls, FP4D_PROBE_WRONG_ANSWER);
    assert_non_null(strstr(o.detail, "42"));
    assert_non_null(strstr(o.detail, "41"));
    fp4d_probe_outcome_free(&o);
    /* Without a prompt there is no answer to check: fluent content is OK. */
    const char *b = "{\"choices\":[{\"message\":{\"content\":\"Hello there.\"},\"finish_reason\":\"stop\"}]}";
    assert_int_equal(fp4d_probe_classify(b, strlen(b), 200, false, FP4D_PROBE_API_CHAT, NULL, &o), FP4D_STATUS_OK);
    assert_int_equal(o.cls, FP4D_PROBE_OK);
    fp4d_probe_outcome_free(&o);
}

static void test_sglang_nan_stop(void **state)
{
    (void)state;
    /* SGLang's OpenAI-compatible form (spec section 8). */
    fp4d_probe_outcome o = classify("{\"id\":\"x\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                                    "\"content\":\"The\",\"reasoning_content\":null},\"finish_reason\":\"stop\","
                                    "\"matched_stop\":\"NaN happened\"}]}", 200, false);
    assert_int_equal(o.cls, FP4D_PROBE_NAN_STOP);
    assert_string_equal(o.finish_reason, "stop");
    assert_string_equal(o.matched_stop, "NaN happened");
    fp4d_probe_outcome_free(&o);
    /* Even when the content happens to hold the right answer, the NaN stop wins. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\"},\"finish_reason\":\"stop\","
                 "\"matched_stop\":\"NaN happened\"}]}", 200, false, FP4D_PROBE_NAN_STOP);
    /* SGLang's native finish reason object, and a finish reason that names NaN. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"\"},\"finish_reason\":{\"type\":\"stop\","
                 "\"matched\":\"NaN happened\"}}]}", 200, false, FP4D_PROBE_NAN_STOP);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"x\"},\"finish_reason\":\"nan\"}]}", 200, false,
                 FP4D_PROBE_NAN_STOP);
    /* A token-id matched_stop (an ordinary EOS) is not a NaN stop; "finance" is not "nan". */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\"},\"finish_reason\":\"stop\","
                 "\"matched_stop\":151645}]}", 200, false, FP4D_PROBE_OK);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\"},\"finish_reason\":\"stop\","
                 "\"matched_stop\":\"financed\"}]}", 200, false, FP4D_PROBE_OK);
}

static void test_bang_reasoning_only(void **state)
{
    (void)state;
    /* The `!!!!` answer: garbage that a reasoning parser captured, content null. */
    fp4d_probe_outcome o = classify("{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null,"
                                    "\"reasoning_content\":\"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\"},"
                                    "\"finish_reason\":\"length\"}]}", 200, false);
    assert_int_equal(o.cls, FP4D_PROBE_DEGENERATE);
    assert_null(o.content);
    assert_non_null(o.reasoning);
    assert_int_equal(strlen(o.reasoning), 40);
    assert_non_null(strstr(o.detail, "reasoning only"));
    fp4d_probe_outcome_free(&o);
    /* Same with finish_reason stop, and with the newer "reasoning" field name. */
    expect_class("{\"choices\":[{\"message\":{\"content\":null,\"reasoning\":\"!!!!!!!!!!!!!!!!\"},"
                 "\"finish_reason\":\"stop\"}]}", 200, false, FP4D_PROBE_DEGENERATE);
}

static void test_reasoning_only_and_truncated(void **state)
{
    (void)state;
    fp4d_probe_outcome o = classify("{\"choices\":[{\"message\":{\"content\":null,\"reasoning\":\"Seventeen plus "
                                    "twenty-five makes forty-two.\"},\"finish_reason\":\"stop\"}]}", 200, false);
    assert_int_equal(o.cls, FP4D_PROBE_REASONING_ONLY);
    assert_string_equal(o.reasoning, "Seventeen plus twenty-five makes forty-two.");
    fp4d_probe_outcome_free(&o);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"\",\"reasoning_content\":\"Let me think about "
                 "this.\"},\"finish_reason\":\"stop\"}]}", 200, false, FP4D_PROBE_REASONING_ONLY);
    /* Cut by the length limit while still reasoning: not REASONING_ONLY. */
    expect_class("{\"choices\":[{\"message\":{\"content\":null,\"reasoning_content\":\"Let me think about "
                 "this.\"},\"finish_reason\":\"length\"}]}", 200, false, FP4D_PROBE_TRUNCATED);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"Let me think step by step about\"},"
                 "\"finish_reason\":\"length\"}]}", 200, false, FP4D_PROBE_TRUNCATED);
    /* The answer arrived before the cut: OK. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42. Now let me explain why\"},"
                 "\"finish_reason\":\"length\"}]}", 200, false, FP4D_PROBE_OK);
}

static void test_empty_and_degenerate_content(void **state)
{
    (void)state;
    expect_class("{\"choices\":[{\"message\":{\"content\":\"\"},\"finish_reason\":\"stop\"}]}", 200, false,
                 FP4D_PROBE_EMPTY);
    expect_class("{\"choices\":[{\"message\":{\"content\":null},\"finish_reason\":\"stop\"}]}", 200, false,
                 FP4D_PROBE_EMPTY);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"  \\n \"},\"finish_reason\":\"stop\"}]}", 200, false,
                 FP4D_PROBE_EMPTY);
    /* Seen in the wild (research/failures.md section 1.1). */
    expect_class("{\"choices\":[{\"message\":{\"content\":\" , , (!!!!!!!!!!!!!!!!!!!!!!!!\"},"
                 "\"finish_reason\":\"length\"}]}", 200, false, FP4D_PROBE_DEGENERATE);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"multmultmultmultmultmult\"},\"finish_reason\":\"length\"}]}",
                 200, false, FP4D_PROBE_DEGENERATE);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"'s's's's's's's't\"},\"finish_reason\":\"length\"}]}",
                 200, false, FP4D_PROBE_DEGENERATE);
    /* A NUL inside the text does not hide the garbage after it (the checks stopped at it). */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"ok\\u0000!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\"},"
                 "\"finish_reason\":\"length\"}]}", 200, false, FP4D_PROBE_DEGENERATE);
    /* Garbage in the reasoning with a right answer is still garbage. */
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\",\"reasoning_content\":\"??????????????\"},"
                 "\"finish_reason\":\"stop\"}]}", 200, false, FP4D_PROBE_DEGENERATE);
}

static void test_errors_and_malformed(void **state)
{
    (void)state;
    fp4d_probe_outcome o = classify("{\"error\":{\"message\":\"CUDA error: illegal memory access\",\"code\":500}}",
                                    500, false);
    assert_int_equal(o.cls, FP4D_PROBE_HTTP_ERROR);
    assert_int_equal(o.http_status, 500);
    assert_non_null(strstr(o.detail, "500"));
    assert_non_null(strstr(o.detail, "illegal memory access"));
    fp4d_probe_outcome_free(&o);
    expect_class("<html>Bad Gateway</html>", 502, false, FP4D_PROBE_HTTP_ERROR);
    /* An error object in a 200 response. */
    expect_class("{\"error\":{\"message\":\"overloaded\"}}", 200, false, FP4D_PROBE_HTTP_ERROR);
    /* vLLM's and SGLang's flat ErrorResponse: the message is the detail */
    o = classify("{\"object\":\"error\",\"message\":\"KV cache is full\",\"type\":\"InternalServerError\","
                 "\"code\":503}", 503, false);
    assert_int_equal(o.cls, FP4D_PROBE_HTTP_ERROR);
    assert_non_null(strstr(o.detail, "HTTP 503: KV cache is full"));
    fp4d_probe_outcome_free(&o);
    /* A server error naming NaN is the NaN fault (the sampler refused NaN logits: SGLang
     * #20043), in either error form and in a 2xx error object; a 4xx is the request's. */
    const char *torch_nan = "probability tensor contains either `inf`, `nan` or element < 0";
    char body[256];
    snprintf(body, sizeof body, "{\"object\":\"error\",\"message\":\"%s\",\"code\":500}", torch_nan);
    o = classify(body, 500, false);
    assert_int_equal(o.cls, FP4D_PROBE_NAN_STOP);
    assert_non_null(strstr(o.detail, "HTTP 500, an error naming NaN: probability tensor"));
    fp4d_probe_outcome_free(&o);
    snprintf(body, sizeof body, "{\"error\":{\"message\":\"%s\"}}", torch_nan);
    expect_class(body, 500, false, FP4D_PROBE_NAN_STOP);
    expect_class(body, 200, false, FP4D_PROBE_NAN_STOP);
    expect_class(body, 400, false, FP4D_PROBE_HTTP_ERROR);
    expect_class("{\"error\":{\"message\":\"NaN detected in hidden states\"}}", 500, false, FP4D_PROBE_NAN_STOP);
    expect_class("{\"error\":{\"message\":\"Nanjing model not loaded\"}}", 500, false, FP4D_PROBE_HTTP_ERROR);
    expect_class("{\"choices\":[{\"index\":0,\"message\":{\"content\":\"The answ", 200, false, FP4D_PROBE_MALFORMED);
    expect_class("<html>ok</html>", 200, false, FP4D_PROBE_MALFORMED);
    expect_class("[1,2,3]", 200, false, FP4D_PROBE_MALFORMED);
    expect_class("{\"object\":\"chat.completion\"}", 200, false, FP4D_PROBE_MALFORMED);
    expect_class("{\"choices\":[]}", 200, false, FP4D_PROBE_MALFORMED);
    expect_class("", 200, false, FP4D_PROBE_MALFORMED);
}

/* Fields of the wrong JSON type are a malformed response, not the model's empty answer: EMPTY
 * sends the user to the kernels and the weights, while a content of 42 (a number) or a message
 * that is a string is the server's protocol bug. They used to be EMPTY. Null stays EMPTY. */
static void expect_malformed_type(const char *body, bool stream, fp4d_probe_api api, const char *field)
{
    fp4d_probe_outcome o;
    assert_int_equal(fp4d_probe_classify(body, strlen(body), 200, stream, api, NULL, &o), FP4D_STATUS_OK);
    if (o.cls != FP4D_PROBE_MALFORMED || !strstr(o.detail, field))
        fail_msg("expected MALFORMED naming %s, got %s (%s) for body: %s", field, fp4d_probe_class_name(o.cls),
                 o.detail, body);
    fp4d_probe_outcome_free(&o);
}

static void test_unexpected_types(void **state)
{
    (void)state;
    const fp4d_probe_api chat = FP4D_PROBE_API_CHAT, compl = FP4D_PROBE_API_COMPLETIONS;
    expect_malformed_type("{\"choices\":[{\"message\":{\"content\":42},\"finish_reason\":\"stop\"}]}", false, chat,
                          "content");
    expect_malformed_type("{\"choices\":[{\"message\":{\"content\":{\"text\":\"42\"}},\"finish_reason\":\"stop\"}]}",
                          false, chat, "content");
    expect_malformed_type("{\"choices\":[{\"message\":{\"content\":true,\"reasoning_content\":null}}]}", false,
                          chat, "content");
    expect_malformed_type("{\"choices\":[{\"message\":{\"content\":null,\"reasoning_content\":7}}]}", false, chat,
                          "reasoning_content");
    expect_malformed_type("{\"choices\":[{\"message\":\"The answer is 42.\",\"finish_reason\":\"stop\"}]}", false,
                          chat, "message");
    expect_malformed_type("{\"choices\":{\"0\":{\"message\":{\"content\":\"42\"}}}}", false, chat, "choices");
    expect_malformed_type("{\"choices\":[\"42\"]}", false, chat, "choices[0]");
    expect_malformed_type("{\"choices\":[{\"text\":42,\"finish_reason\":\"stop\"}]}", false, compl, "text");
    expect_malformed_type("data: {\"choices\":[{\"delta\":{\"content\":\"The \"}}]}\n\n"
                          "data: {\"choices\":[{\"delta\":{\"content\":42}}]}\n\n"
                          "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                          true, chat, "content");
    expect_malformed_type("data: {\"choices\":[{\"delta\":\"42\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                          true, chat, "delta");

    /* What servers really send stays as it was: null content is EMPTY (or the reasoning-only
     * case), a missing delta on the final chunk is fine, usage-only chunks are skipped,
     * unexpected types in fields the probe does not judge are ignored. */
    expect_class("{\"choices\":[{\"message\":{\"content\":null},\"finish_reason\":\"stop\"}]}", 200, false,
                 FP4D_PROBE_EMPTY);
    expect_class("{\"choices\":[{\"message\":{\"content\":\"42\",\"tool_calls\":null},\"finish_reason\":7,"
                 "\"matched_stop\":[1]}],\"usage\":\"n/a\"}", 200, false, FP4D_PROBE_OK);
    expect_class("data: {\"choices\":[{\"delta\":{\"content\":\"42\"}}]}\n\n"
                 "data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\n"
                 "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n", 200, true,
                 FP4D_PROBE_OK);
    /* An error object still comes first (HTTP_ERROR precedes MALFORMED). */
    expect_class("{\"error\":{\"message\":\"boom\"},\"choices\":5}", 200, false, FP4D_PROBE_HTTP_ERROR);
}

static void test_completions_api(void **state)
{
    (void)state;
    const fp4d_probe_prompt *p = prompt_by_id("capital");
    const char *ok = "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" Paris\","
                     "\"finish_reason\":\"stop\"}]}";
    const char *nan = "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\",\"matched_stop\":\"NaN happened\"}]}";
    fp4d_probe_outcome o;
    assert_int_equal(fp4d_probe_classify(ok, strlen(ok), 200, false, FP4D_PROBE_API_COMPLETIONS, p, &o), 0);
    assert_int_equal(o.cls, FP4D_PROBE_OK);
    assert_string_equal(o.content, " Paris");
    fp4d_probe_outcome_free(&o);
    assert_int_equal(fp4d_probe_classify(nan, strlen(nan), 200, false, FP4D_PROBE_API_COMPLETIONS, p, &o), 0);
    assert_int_equal(o.cls, FP4D_PROBE_NAN_STOP);
    fp4d_probe_outcome_free(&o);
}

/* ---- SSE streams ------------------------------------------------------------------------ */

#define EV(json) "data: " json "\n\n"

static void test_sse(void **state)
{
    (void)state;
    const char *healthy = EV("{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}")
        EV("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The answer \"},\"finish_reason\":null}]}")
        EV("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is 42.\"},\"finish_reason\":null}]}")
        ": keep-alive comment\n\n"
        EV("{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}")
        EV("{\"choices\":[],\"usage\":{\"completion_tokens\":5}}")
        "data: [DONE]\n\n";
    fp4d_probe_outcome o = classify(healthy, 200, true);
    assert_int_equal(o.cls, FP4D_PROBE_OK);
    assert_string_equal(o.content, "The answer is 42.");
    assert_string_equal(o.finish_reason, "stop");
    fp4d_probe_outcome_free(&o);

    /* CRLF line ends are fine too. */
    expect_class("data: {\"choices\":[{\"delta\":{\"content\":\"42\"},\"finish_reason\":\"stop\"}]}\r\n\r\n"
                 "data: [DONE]\r\n\r\n", 200, true, FP4D_PROBE_OK);

    expect_class(EV("{\"choices\":[{\"delta\":{\"content\":\"The\"}}]}")
                 EV("{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"matched_stop\":\"NaN happened\"}]}")
                 "data: [DONE]\n\n", 200, true, FP4D_PROBE_NAN_STOP);

    expect_class(EV("{\"choices\":[{\"delta\":{\"reasoning_content\":\"!!!!!!!!\"}}]}")
                 EV("{\"choices\":[{\"delta\":{\"reasoning_content\":\"!!!!!!!!\"}}]}")
                 EV("{\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}")
                 "data: [DONE]\n\n", 200, true, FP4D_PROBE_DEGENERATE);

    expect_class(EV("{\"choices\":[{\"delta\":{\"reasoning\":\"The sum is forty-two.\"}}]}")
                 EV("{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}")
                 "data: [DONE]\n\n", 200, true, FP4D_PROBE_REASONING_ONLY);

    /* Broken streams. */
    expect_class(EV("{\"choices\":[{\"delta\":{\"content\":\"The \"}}]}") "data: {not json\n\ndata: [DONE]\n\n", 200,
                 true, FP4D_PROBE_MALFORMED);
    expect_class(EV("{\"choices\":[{\"delta\":{\"content\":\"The \"}}]}")
                 EV("{\"choices\":[{\"delta\":{\"content\":\"answer\"}}]}"), 200, true, FP4D_PROBE_MALFORMED);
    expect_class(EV("{\"choices\":[{\"delta\":{\"content\":\"The \"}}]}") "data: {\"choices\":[{\"del", 200, true,
                 FP4D_PROBE_MALFORMED);
    expect_class("data: [DONE]\n\n", 200, true, FP4D_PROBE_MALFORMED);
    expect_class("event: ping\n\n", 200, true, FP4D_PROBE_MALFORMED);
    /* An error sent as JSON to a streaming request. */
    expect_class("{\"error\":{\"message\":\"model not found\"}}", 404, true, FP4D_PROBE_HTTP_ERROR);
}

/* ---- degenerate text ------------------------------------------------------------------------ */

static void test_degenerate_text(void **state)
{
    (void)state;
    char why[128];
    const char *garbage[] = {"!!!!!!!!", "abababab", "the the the the the the ", "\xe7\x9a\x84\xe7\x9a\x84\xe7\x9a"
                             "\x84\xe7\x9a\x84\xe7\x9a\x84", "Sure!!!!!!!!!!!!!!"};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        assert_true(fp4d_probe_text_is_degenerate(garbage[i], strlen(garbage[i]), why, sizeof why));
        assert_non_null(strstr(why, "repeated"));
    }
    const char *fine[] = {
        "42", "Paris", "!!!!!!!", /* too short to judge */
        "The answer is 42.", "QZX-4417-VOLT",
        "Paris is the capital and most populous city of France, with an estimated population of "
        "about two million residents.",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
        /* a name quoted in its own script (two or three writing systems) is no token salad (below);
         * nor are malformed UTF-8 bytes, which belong to no writing system */
        "The capital of Japan is Tokyo (\xe6\x9d\xb1\xe4\xba\xac, Toukyou), a city of many millions.",
        "\xe6\xb3\x95\xe5\x9b\xbd\xe7\x9a\x84\xe9\xa6\x96\xe9\x83\xbd\xe6\x98\xaf\xe5\xb7\xb4"
        "\xe9\xbb\x8e\xe3\x80\x82 The capital of France is Paris (\xd0\x9f\xd0\xb0\xd1\x80\xd0\xb8\xd0\xb6).",
        "The answer is 42 \xff\xfe\xc3 and nothing else matters here at all.",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        if (fp4d_probe_text_is_degenerate(fine[i], strlen(fine[i]), why, sizeof why))
            fail_msg("'%s' judged degenerate: %s", fine[i], why);

    /* Low entropy without a short period: a pseudo-random mix of two characters. Its entropy
     * is computed here independently and must be below the 1.5-bit threshold. */
    char mix[97];
    uint32_t x = 12345;
    unsigned bangs = 0;
    for (int i = 0; i < 96; i++) {
        x = x * 1103515245u + 12345u;
        mix[i] = ((x >> 16) % 4) ? '!' : '?';
        bangs += mix[i] == '!';
    }
    mix[96] = '\0';
    double q = bangs / 96.0, h = -(q * log2(q) + (1 - q) * log2(1 - q));
    assert_true(h < 1.5);
    assert_true(fp4d_probe_text_is_degenerate(mix, 96, why, sizeof why));

    /* Token salad: random tokens of a multilingual vocabulary, decoded. Prose-like entropy and
     * no period, but four or more writing systems in one answer to an English prompt. */
    const char *salad = "ylvania Bened \xe8\x8b\xa5\xe5\xb9\xb2 K\xc3\xbc \xd0\xb2\xd0\xbd\xd0\xb8\xd0\xbc\xd0"
                        "\xb0\xd0\xbd\xd0\xb8\xd0\xb5 peri \xd8\xa7\xd9\x84\xd8\xaa \xce\xb1\xce\xb2 ments";
    assert_true(fp4d_probe_text_is_degenerate(salad, strlen(salad), why, sizeof why));
    if (!strstr(why, "5 writing systems") || !strstr(why, "Latin, Greek, Cyrillic, Arabic, Han"))
        fail_msg("salad explained as: %s", why);
    /* As a response: DEGENERATE, not a WRONG_ANSWER that an unverifiable server excuses */
    char body[512];
    snprintf(body, sizeof body, "{\"choices\":[{\"message\":{\"content\":\"%s\"},\"finish_reason\":\"stop\"}]}",
             salad);
    expect_class(body, 200, false, FP4D_PROBE_DEGENERATE);
}

/* ---- prompt set and plan -------------------------------------------------------------------- */

static void test_prompt_set(void **state)
{
    (void)state;
    size_t n = fp4d_probe_prompt_count();
    assert_true(n >= 8);
    unsigned shortest = ~0u, longest = 0, padded = 0;
    for (size_t i = 0; i < n; i++) {
        const fp4d_probe_prompt *p = fp4d_probe_prompt_at(i);
        assert_non_null(p->text);
        assert_non_null(p->answers[0]);
        /* The prompt's own canonical answer passes; the other prompts' answers do not
         * (apart from answers that really are the same). */
        char reply[128];
        snprintf(reply, sizeof reply, "The answer is %s.", p->answers[0]);
        assert_true(fp4d_probe_answer_matches(p, reply));
        for (size_t j = 0; j < n; j++) {
            const fp4d_probe_prompt *q = fp4d_probe_prompt_at(j);
            if (j != i && strcasecmp(q->answers[0], p->answers[0]) != 0) {
                snprintf(reply, sizeof reply, "The answer is %s.", q->answers[0]);
                if (fp4d_probe_answer_matches(p, reply)) fail_msg("'%s' accepted for prompt %s", reply, p->id);
            }
        }
        /* A server can find the prompt from what the probe sends, for either API. */
        assert_ptr_equal(fp4d_probe_prompt_find(p->text), p);
        char *with_suffix = malloc(strlen(p->text) + sizeof FP4D_PROBE_COMPLETION_SUFFIX);
        strcpy(with_suffix, p->text);
        strcat(with_suffix, FP4D_PROBE_COMPLETION_SUFFIX);
        assert_ptr_equal(fp4d_probe_prompt_find(with_suffix), p);
        free(with_suffix);
        unsigned words = 1;
        for (const char *c = p->text; *c; c++) words += *c == ' ';
        if (words < shortest) shortest = words;
        if (words > longest) longest = words;
        if (p->padding_words) {
            padded++;
            assert_true(words >= p->padding_words);
            /* The filler must not contain the answer, or an echo would pass. */
            const char *question = strstr(p->text, "Question:");
            assert_non_null(question);
            char *filler = strndup(p->text, (size_t)(question - p->text));
            assert_false(fp4d_probe_answer_matches(p, filler));
            free(filler);
        }
    }
    assert_true(padded >= 3);
    /* "Very different lengths": at least two orders of magnitude between prompts. */
    assert_true(longest >= 100 * shortest);
    assert_null(fp4d_probe_prompt_at(n));
    assert_null(fp4d_probe_prompt_find("What is the meaning of life?"));
}

static void test_plan_bound(void **state)
{
    (void)state;
    unsigned np = (unsigned)fp4d_probe_prompt_count();
    for (unsigned c = 1; c <= 40; c++)
        for (unsigned r = 1; r <= 10; r++) {
            unsigned n1, n2;
            fp4d_probe_plan(c, r, &n1, &n2);
            assert_int_equal(n1 + n2, c * r); /* never more than concurrency x rounds */
            assert_true(n1 >= 1 && n1 <= np);
            if (r >= 2) assert_true(n2 >= c); /* at least one full concurrent window */
        }
    unsigned n1, n2;
    fp4d_probe_plan(16, 3, &n1, &n2);
    assert_int_equal(n1, np < 32 ? np : 32);
    assert_int_equal(n2, 48 - n1);
}

/* fp4d_probe_run caps its inputs, but the planner is public: a budget past UINT_MAX must not
 * wrap phase 2 (65536 x 65537 once planned 65520 phase-2 requests instead of ~2^32). */
static void test_plan_huge_budget(void **state)
{
    (void)state;
    unsigned np = (unsigned)fp4d_probe_prompt_count();
    static const unsigned grid[][2] = {{UINT_MAX, UINT_MAX}, {65536, 65537}, {UINT_MAX, 2}, {2, UINT_MAX},
                                       {65536, 65536}, {UINT_MAX, 1}};
    for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) {
        unsigned c = grid[i][0], r = grid[i][1];
        unsigned long long budget = (unsigned long long)c * r;
        unsigned long long want = budget < UINT_MAX ? budget : UINT_MAX;
        unsigned n1 = 0, n2 = 0;
        fp4d_probe_plan(c, r, &n1, &n2);
        if ((unsigned long long)n1 + n2 != want)
            fail_msg("plan(%u, %u): %u + %u, expected a total of %llu", c, r, n1, n2, want);
        /* Phase 1 as documented, over the capped budget: min(P, max(1, B - C)). */
        unsigned long long rest = want > c ? want - c : 0;
        assert_int_equal(n1, rest < 1 ? 1 : rest < np ? rest : np);
        /* Still at least one full window for phase 2 when it can hold one. */
        if (r >= 2 && (unsigned long long)c + np <= want) assert_true(n2 >= c);
    }
    /* A budget of 0 plans nothing. */
    unsigned n1 = 7, n2 = 7;
    fp4d_probe_plan(0, UINT_MAX, &n1, &n2);
    assert_int_equal(n1 + n2, 0);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(fp4d_probe_class_name(FP4D_PROBE_NAN_STOP), "NAN_STOP");
    assert_string_equal(fp4d_probe_class_name(FP4D_PROBE_REASONING_ONLY), "REASONING_ONLY");
    assert_string_equal(fp4d_probe_class_name(FP4D_PROBE_CLASS_COUNT), "UNKNOWN");
    assert_string_equal(fp4d_probe_verdict_name(FP4D_PROBE_VERDICT_BROKEN_UNDER_CONCURRENCY),
                        "broken_under_concurrency");
    assert_true(fp4d_probe_class_is_fault(FP4D_PROBE_NAN_STOP));
    assert_true(fp4d_probe_class_is_fault(FP4D_PROBE_DEGENERATE));
    assert_false(fp4d_probe_class_is_fault(FP4D_PROBE_WRONG_ANSWER));
    assert_false(fp4d_probe_class_is_fault(FP4D_PROBE_OK));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy_and_wrong),
        cmocka_unit_test(test_sglang_nan_stop),
        cmocka_unit_test(test_bang_reasoning_only),
        cmocka_unit_test(test_reasoning_only_and_truncated),
        cmocka_unit_test(test_empty_and_degenerate_content),
        cmocka_unit_test(test_errors_and_malformed),
        cmocka_unit_test(test_unexpected_types),
        cmocka_unit_test(test_completions_api),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_degenerate_text),
        cmocka_unit_test(test_prompt_set),
        cmocka_unit_test(test_plan_bound),
        cmocka_unit_test(test_plan_huge_budget),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
