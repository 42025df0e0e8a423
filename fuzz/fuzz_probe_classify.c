/*
 * Fuzz target: a server's response body through the probe's classifier (src/probe/
 * probe_classify.c), both as a whole JSON body and as an SSE stream, for chat and completions.
 * The first byte picks the API, the prompt whose answer is checked (or none) and the HTTP
 * status; the rest is the body. The body is also checked as model text (degenerate-text test,
 * the UTF-8 sanitizer the report uses before handing quotes to jansson).
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#ifdef FP4D_USE_PROBE
#include "fp4doctor/probe.h"
#include "probe/probe_internal.h"

static void check_outcome(const fp4d_probe_outcome *o)
{
    if ((unsigned)o->cls >= FP4D_PROBE_CLASS_COUNT) abort();
    if (!memchr(o->detail, '\0', sizeof o->detail) || !memchr(o->finish_reason, '\0', sizeof o->finish_reason) ||
        !memchr(o->matched_stop, '\0', sizeof o->matched_stop))
        abort();
    if (o->content) (void)strlen(o->content);
    if (o->reasoning) (void)strlen(o->reasoning);
}

int fp4d_fuzz_probe_classify(const uint8_t *data, size_t size)
{
    static const int statuses[] = {200, 200, 429, 500};
    unsigned sel = size ? data[0] : 0;
    const char *body = size ? (const char *)data + 1 : "";
    size_t len = size ? size - 1 : 0;
    fp4d_probe_api api = (sel & 1) ? FP4D_PROBE_API_COMPLETIONS : FP4D_PROBE_API_CHAT;
    size_t np = fp4d_probe_prompt_count(), pi = (sel >> 1) & 0x1F;
    const fp4d_probe_prompt *prompt = pi < np ? fp4d_probe_prompt_at(pi) : NULL;
    int status = statuses[(sel >> 6) & 3];

    /* A copy of exactly len bytes (not NUL-terminated), so ASan sees any read past the end. */
    char *copy = malloc(len ? len : 1);
    if (!copy) return 0;
    memcpy(copy, body, len);
    for (int stream = 0; stream < 2; stream++) {
        fp4d_probe_outcome o;
        if (fp4d_probe_classify(copy, len, status, stream, api, prompt, &o) == FP4D_STATUS_OK) check_outcome(&o);
        fp4d_probe_outcome_free(&o);
    }

    char why[120];
    (void)fp4d_probe_text_is_degenerate(copy, len, why, sizeof why);
    if (!memchr(why, '\0', sizeof why)) abort();
    char *clean = fp4d_probe_utf8_sanitize(copy, len);
    if (clean) {
        if (prompt) (void)fp4d_probe_answer_matches(prompt, clean);
        free(clean);
    }
    free(copy);
    return 0;
}
#else
/* Built without libcurl: no probe, nothing to fuzz. */
int fp4d_fuzz_probe_classify(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}
#endif

#ifdef FP4D_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fp4d_fuzz_probe_classify(data, size); }
#endif
