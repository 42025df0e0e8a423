/*
 * Classification of one OpenAI-compatible response (chat or completions, JSON or SSE) into
 * the probe's classes (probe.h). Everything here works on bytes already received, so the
 * unit tests can feed canned bodies without a server.
 */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "internal.h"
#include "probe_internal.h"

/* ---- small helpers ------------------------------------------------------------------------ */

bool fp4d_buf_append(fp4d_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

void fp4d_buf_free(fp4d_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void fp4d_probe_copy(char *dst, size_t cap, const char *s)
{
    if (!cap) return;
    if (!s) s = "";
    size_t n = strlen(s);
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

char *fp4d_probe_utf8_sanitize(const char *s, size_t n)
{
    /* Each invalid byte becomes the 3-byte U+FFFD: at most 3x growth. */
    char *out = malloc(3 * n + 1);
    if (!out) return NULL;
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] ? fp4d_utf8_seq_len(u + i, n - i) : 0;
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            if (u[i] == 0) out[o++] = ' '; /* a NUL would cut the string short */
            else { memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; }
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

/* ---- names -------------------------------------------------------------------------------- */

static const char *const class_names[] = {
#define FP4D_PROBE_CLASS_NAME_(name, fault, desc) #name,
    FP4D_PROBE_CLASS_LIST(FP4D_PROBE_CLASS_NAME_)
#undef FP4D_PROBE_CLASS_NAME_
};
static const char *const class_descs[] = {
#define FP4D_PROBE_CLASS_DESC_(name, fault, desc) desc,
    FP4D_PROBE_CLASS_LIST(FP4D_PROBE_CLASS_DESC_)
#undef FP4D_PROBE_CLASS_DESC_
};
static const bool class_faults[] = {
#define FP4D_PROBE_CLASS_FAULT_(name, fault, desc) fault,
    FP4D_PROBE_CLASS_LIST(FP4D_PROBE_CLASS_FAULT_)
#undef FP4D_PROBE_CLASS_FAULT_
};

const char *fp4d_probe_class_name(fp4d_probe_class c)
{
    return (unsigned)c < FP4D_PROBE_CLASS_COUNT ? class_names[c] : "UNKNOWN";
}

const char *fp4d_probe_class_description(fp4d_probe_class c)
{
    return (unsigned)c < FP4D_PROBE_CLASS_COUNT ? class_descs[c] : "unknown class";
}

bool fp4d_probe_class_is_fault(fp4d_probe_class c)
{
    return (unsigned)c < FP4D_PROBE_CLASS_COUNT && class_faults[c];
}

/* ---- degenerate text ------------------------------------------------------------------------ */

#define DEGENERATE_MIN_LEN      8
#define DEGENERATE_MAX_PERIOD   16
#define DEGENERATE_ENTROPY_LEN  24
#define DEGENERATE_ENTROPY_BITS 1.5

static void trim(const char **s, size_t *n)
{
    while (*n && isspace((unsigned char)(*s)[0])) { (*s)++; (*n)--; }
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* Token salad: a model whose logits are garbage but finite samples random tokens of its whole
 * vocabulary, which a byte-level BPE tokenizer decodes to fluent-looking text that mixes
 * writing systems ("ylvania Bened 若 Kü внимание peri الت"), with the byte entropy of prose.
 * An answer to one of the probe's English prompts uses one script, two where it quotes a
 * name; four scripts of two letters or more in 32 bytes are not an answer. */
#define SALAD_MIN_LEN     32
#define SALAD_MIN_SCRIPTS 4

enum { SCRIPT_NONE, SCRIPT_LATIN, SCRIPT_GREEK, SCRIPT_CYRILLIC, SCRIPT_ARMENIAN_HEBREW, SCRIPT_ARABIC,
       SCRIPT_INDIC, SCRIPT_THAI, SCRIPT_HANGUL, SCRIPT_KANA, SCRIPT_HAN, SCRIPT_COUNT };

static const char *const script_names[SCRIPT_COUNT] = {
    "", "Latin", "Greek", "Cyrillic", "Armenian/Hebrew", "Arabic", "Indic", "Thai", "Hangul", "Kana", "Han",
};

/* The writing system of a letter's code point; SCRIPT_NONE for digits, punctuation, symbols,
 * spaces and whatever is not listed. */
static int script_of(uint32_t cp)
{
    if (cp < 0x80) return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') ? SCRIPT_LATIN : SCRIPT_NONE;
    if (cp >= 0xC0 && cp <= 0x24F) return cp == 0xD7 || cp == 0xF7 ? SCRIPT_NONE : SCRIPT_LATIN;
    if (cp >= 0x370 && cp <= 0x3FF) return SCRIPT_GREEK;
    if (cp >= 0x400 && cp <= 0x52F) return SCRIPT_CYRILLIC;
    if (cp >= 0x531 && cp <= 0x5FF) return SCRIPT_ARMENIAN_HEBREW;
    if ((cp >= 0x600 && cp <= 0x6FF) || (cp >= 0x750 && cp <= 0x77F)) return SCRIPT_ARABIC;
    if (cp >= 0x900 && cp <= 0xDFF) return SCRIPT_INDIC;
    if (cp >= 0xE00 && cp <= 0xE7F) return SCRIPT_THAI;
    if ((cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xAC00 && cp <= 0xD7AF)) return SCRIPT_HANGUL;
    if (cp >= 0x3040 && cp <= 0x30FF) return SCRIPT_KANA;
    if ((cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF)) return SCRIPT_HAN;
    return SCRIPT_NONE;
}

/* The next code point of s[*i..n) (well-formed UTF-8 of 1-4 bytes; a malformed byte is
 * U+FFFD and one byte long), advancing *i. */
static uint32_t next_code_point(const unsigned char *s, size_t n, size_t *i)
{
    const unsigned char c = s[*i];
    const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || *i + len > n) {
        (*i)++;
        return 0xFFFD;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t k = 1; k < len; k++) {
        if ((s[*i + k] & 0xC0) != 0x80) {
            (*i)++;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[*i + k] & 0x3Fu);
    }
    *i += len;
    return cp;
}

static bool is_token_salad(const char *s, size_t n, char *why, size_t why_len)
{
    if (n < SALAD_MIN_LEN) return false;
    size_t letters[SCRIPT_COUNT] = {0};
    for (size_t i = 0; i < n;) letters[script_of(next_code_point((const unsigned char *)s, n, &i))]++;
    int scripts = 0;
    char list[96] = "";
    for (int k = SCRIPT_NONE + 1; k < SCRIPT_COUNT; k++)
        if (letters[k] >= 2) {
            scripts++;
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "", script_names[k]);
        }
    if (scripts < SALAD_MIN_SCRIPTS) return false;
    if (why) snprintf(why, why_len, "%d writing systems mixed over %zu bytes (%s): random tokens", scripts, n, list);
    return true;
}

bool fp4d_probe_text_is_degenerate(const char *s, size_t n, char *why, size_t why_len)
{
    if (why && why_len) why[0] = '\0';
    if (!s) return false;
    trim(&s, &n);
    if (n < DEGENERATE_MIN_LEN) return false;

    /* Longest stretch with period p: s[i] == s[i+p] for a run of positions means the
     * stretch of run+p bytes repeats one p-byte unit ("!!!!", "multmultmult", "'s's's"). */
    for (size_t p = 1; p <= DEGENERATE_MAX_PERIOD && p < n; p++) {
        size_t run = 0, best = 0, best_end = 0;
        for (size_t i = 0; i + p < n; i++) {
            if (s[i] == s[i + p]) {
                if (++run > best) { best = run; best_end = i + p + 1; }
            } else {
                run = 0;
            }
        }
        if (best == 0) continue;
        size_t covered = best + p;
        size_t min_cover = p == 1 ? 8 : 4 * p;
        if (covered >= min_cover && 2 * covered >= n) {
            if (why) {
                size_t start = best_end - covered;
                char unit[3 * DEGENERATE_MAX_PERIOD + 1];
                size_t u = 0;
                for (size_t k = 0; k < p; k++) {
                    unsigned char c = (unsigned char)s[start + k];
                    if (c == '\n') { unit[u++] = '\\'; unit[u++] = 'n'; }
                    else unit[u++] = (c < 0x20 || c == 0x7F) ? '?' : (char)c;
                }
                unit[u] = '\0';
                snprintf(why, why_len, "'%s' repeated over %zu of %zu bytes", unit, covered, n);
            }
            return true;
        }
    }

    if (n >= DEGENERATE_ENTROPY_LEN) {
        size_t hist[256] = {0};
        for (size_t i = 0; i < n; i++) hist[(unsigned char)s[i]]++;
        double h = 0.0;
        for (int c = 0; c < 256; c++)
            if (hist[c]) {
                double q = (double)hist[c] / (double)n;
                h -= q * log2(q);
            }
        if (h < DEGENERATE_ENTROPY_BITS) {
            if (why) snprintf(why, why_len, "character entropy %.2f bits over %zu bytes", h, n);
            return true;
        }
    }
    return is_token_salad(s, n, why, why_len);
}

/* ---- parsing ------------------------------------------------------------------------------- */

typedef struct parsed {
    fp4d_buf content, reasoning;
    bool     content_present, reasoning_present;
    bool     has_choice;
    char     finish_reason[32];
    char     matched_stop[64];
    char     error[160];
    bool     has_error;
    char     bad_type[96]; /* the first field of a type no server sends ("choices[0].message.content
                            * is a number"): a protocol bug, not the model's empty answer */
    bool     nomem;
} parsed;

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Notes the first field whose type is wrong: `what` is the field's path, `v` its value. */
static void bad_type(parsed *p, const char *what, const json_t *v, const char *expected)
{
    if (!p->bad_type[0])
        snprintf(p->bad_type, sizeof p->bad_type, "%s is %s, not %s", what, json_type_name(v), expected);
}

static void append_json_text(parsed *p, fp4d_buf *dst, bool *present, json_t *v, const char *what)
{
    if (!v || json_is_null(v)) return;
    if (!json_is_string(v) && !json_is_array(v)) {
        bad_type(p, what, v, "a string");
        return;
    }
    if (json_is_string(v)) {
        *present = true;
        if (!fp4d_buf_append(dst, json_string_value(v), json_string_length(v))) p->nomem = true;
    } else if (json_is_array(v)) {
        /* Content given as parts: [{"type": "text", "text": "..."}]. */
        size_t i;
        json_t *part;
        json_array_foreach(v, i, part) {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) {
                *present = true;
                if (!fp4d_buf_append(dst, json_string_value(t), json_string_length(t))) p->nomem = true;
            }
        }
    }
}

static void read_stop_fields(parsed *p, json_t *choice)
{
    json_t *fr = json_object_get(choice, "finish_reason");
    if (json_is_string(fr)) {
        fp4d_probe_copy(p->finish_reason, sizeof p->finish_reason, json_string_value(fr));
    } else if (json_is_object(fr)) {
        /* SGLang's native form: {"type": "stop", "matched": "NaN happened"}. */
        json_t *type = json_object_get(fr, "type"), *matched = json_object_get(fr, "matched");
        if (json_is_string(type))
            fp4d_probe_copy(p->finish_reason, sizeof p->finish_reason, json_string_value(type));
        if (json_is_string(matched))
            fp4d_probe_copy(p->matched_stop, sizeof p->matched_stop, json_string_value(matched));
    }
    json_t *ms = json_object_get(choice, "matched_stop");
    if (json_is_string(ms))
        fp4d_probe_copy(p->matched_stop, sizeof p->matched_stop, json_string_value(ms));
    else if (json_is_integer(ms))
        snprintf(p->matched_stop, sizeof p->matched_stop, "%lld", (long long)json_integer_value(ms));
}

static void read_error_object(parsed *p, json_t *root)
{
    json_t *err = json_object_get(root, "error");
    /* vLLM's and SGLang's OpenAI-style ErrorResponse is flat: {"object": "error", "message":
     * ..., "type": ..., "code": 500}, with no "error" member. */
    json_t *object = json_object_get(root, "object");
    if ((!err || json_is_null(err)) && json_is_string(object) && strcmp(json_string_value(object), "error") == 0)
        err = root;
    if (!err || json_is_null(err)) return;
    p->has_error = true;
    json_t *msg = json_is_object(err) ? json_object_get(err, "message") : err;
    fp4d_probe_copy(p->error, sizeof p->error,
                    json_is_string(msg) ? json_string_value(msg) : "error object in the response");
}

/* One JSON object: a whole response (stream = false) or one SSE chunk (stream = true). */
static void read_object(parsed *p, json_t *root, fp4d_probe_api api, bool stream)
{
    read_error_object(p, root);
    json_t *choices = json_object_get(root, "choices");
    if (choices && !json_is_null(choices) && !json_is_array(choices)) {
        bad_type(p, "choices", choices, "an array");
        return;
    }
    json_t *choice = json_array_get(choices, 0);
    if (choice && !json_is_object(choice)) {
        bad_type(p, "choices[0]", choice, "an object");
        return;
    }
    if (!choice) return;
    p->has_choice = true;
    const char *msg_name = stream ? "delta" : "message";
    json_t *msg = NULL;
    if (api == FP4D_PROBE_API_CHAT) {
        msg = json_object_get(choice, msg_name);
        if (msg && !json_is_null(msg) && !json_is_object(msg)) {
            char what[32];
            snprintf(what, sizeof what, "choices[0].%s", msg_name);
            bad_type(p, what, msg, "an object");
        }
    }
    if (api == FP4D_PROBE_API_COMPLETIONS || !json_is_object(msg)) msg = choice;
    /* Field paths for the messages about a wrong type. */
    char where[64], field[96];
    snprintf(where, sizeof where, "choices[0]%s%s", msg == choice ? "" : ".", msg == choice ? "" : msg_name);
    if (api == FP4D_PROBE_API_COMPLETIONS) {
        append_json_text(p, &p->content, &p->content_present, json_object_get(choice, "text"), "choices[0].text");
    } else {
        snprintf(field, sizeof field, "%s.content", where);
        append_json_text(p, &p->content, &p->content_present, json_object_get(msg, "content"), field);
    }
    /* Reasoning parsers use either name (SGLang/vLLM: reasoning_content; newer vLLM and
     * others: reasoning). */
    snprintf(field, sizeof field, "%s.reasoning_content", where);
    append_json_text(p, &p->reasoning, &p->reasoning_present, json_object_get(msg, "reasoning_content"), field);
    snprintf(field, sizeof field, "%s.reasoning", where);
    append_json_text(p, &p->reasoning, &p->reasoning_present, json_object_get(msg, "reasoning"), field);
    read_stop_fields(p, choice);
}

/* Returns false with `why` set when the body cannot be parsed. */
static bool parse_json_body(parsed *p, const char *body, size_t len, fp4d_probe_api api,
                            char *why, size_t why_len)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
    if (!root) {
        snprintf(why, why_len, "body is not JSON (%s at byte %d)", jerr.text, jerr.position);
        return false;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        snprintf(why, why_len, "body is JSON but not an object");
        return false;
    }
    read_object(p, root, api, false);
    json_decref(root);
    return true;
}

static bool parse_sse_body(parsed *p, const char *body, size_t len, fp4d_probe_api api,
                           char *why, size_t why_len)
{
    bool done = false;
    unsigned events = 0;
    size_t pos = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && body[end] != '\n') end++;
        bool complete_line = end < len;
        size_t n = end - pos;
        const char *line = body + pos;
        pos = end + 1;
        if (n && line[n - 1] == '\r') n--;
        if (n == 0 || line[0] == ':') continue; /* event separator or comment */
        if (n < 5 || strncmp(line, "data:", 5) != 0) continue; /* event:, id:, retry: */
        const char *data = line + 5;
        size_t dn = n - 5;
        if (dn && data[0] == ' ') { data++; dn--; }
        if (done) {
            snprintf(why, why_len, "SSE data after [DONE]");
            return false;
        }
        if (dn == 6 && !memcmp(data, "[DONE]", 6)) {
            done = true;
            continue;
        }
        if (!complete_line) {
            snprintf(why, why_len, "SSE stream cut inside event %u", events + 1);
            return false;
        }
        json_error_t jerr;
        json_t *chunk = json_loadb(data, dn, JSON_ALLOW_NUL, &jerr);
        if (!json_is_object(chunk)) {
            json_decref(chunk);
            snprintf(why, why_len, "SSE event %u is not a JSON object (%s)", events + 1,
                     chunk ? "not an object" : jerr.text);
            return false;
        }
        events++;
        read_object(p, chunk, api, true);
        json_decref(chunk);
    }
    if (events == 0 && !p->has_error) {
        snprintf(why, why_len, done ? "SSE stream with [DONE] but no events" : "no SSE events in the body");
        return false;
    }
    if (!done && !p->finish_reason[0] && !p->has_error) {
        snprintf(why, why_len, "SSE stream ended after %u events without a finish_reason or [DONE]", events);
        return false;
    }
    return true;
}

/* True when s contains "nan" as a word of its own (any case): "NaN happened", "nan". */
static bool mentions_nan(const char *s)
{
    for (const char *c = s; *c; c++) {
        if (strncasecmp(c, "nan", 3) != 0) continue;
        bool left = c == s || !isalpha((unsigned char)c[-1]);
        bool right = !isalpha((unsigned char)c[3]);
        if (left && right) return true;
    }
    return false;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return false;
    return true;
}

static void excerpt(char *dst, size_t cap, const char *s, size_t n)
{
    size_t k = n < cap - 1 ? n : cap - 1;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[i] = (c < 0x20 || c == 0x7F) ? ' ' : (char)c;
    }
    dst[k] = '\0';
}

static fp4d_probe_class set_class(fp4d_probe_outcome *o, fp4d_probe_class c, const char *fmt, const char *arg)
{
    o->cls = c;
    snprintf(o->detail, sizeof o->detail, fmt, arg ? arg : "");
    return c;
}

/* b's text as a NUL-terminated string the caller owns (b no longer holds it): each NUL inside
 * becomes '?'; "" when b holds nothing. */
static char *taken_text(fp4d_buf *b)
{
    for (size_t i = 0; b->p && i < b->len; i++)
        if (!b->p[i]) b->p[i] = '?';
    char *t = b->p ? b->p : strdup("");
    b->p = NULL;
    return t;
}

fp4d_status fp4d_probe_classify(const char *body, size_t len, int http_status, bool stream,
                                fp4d_probe_api api, const fp4d_probe_prompt *prompt,
                                fp4d_probe_outcome *o)
{
    FP4D_RETURN_ERROR_IF(!o, INVALID_ARG, "fp4d_probe_classify: NULL outcome");
    memset(o, 0, sizeof *o);
    o->http_status = http_status;
    if (!body) len = 0;

    parsed p = {0};
    char why[200] = "";
    bool parsed_ok = false;
    if (len > 0) {
        /* An error body is JSON even for a streaming request. */
        bool looks_json = false;
        for (size_t i = 0; i < len; i++)
            if (!isspace((unsigned char)body[i])) { looks_json = body[i] == '{'; break; }
        parsed_ok = (stream && !looks_json) ? parse_sse_body(&p, body, len, api, why, sizeof why)
                                            : parse_json_body(&p, body, len, api, why, sizeof why);
    } else {
        snprintf(why, sizeof why, "empty body");
    }
    if (p.nomem) {
        fp4d_buf_free(&p.content);
        fp4d_buf_free(&p.reasoning);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory while reading a response");
    }
    fp4d_probe_copy(o->finish_reason, sizeof o->finish_reason, p.finish_reason);
    fp4d_probe_copy(o->matched_stop, sizeof o->matched_stop, p.matched_stop);

    /* A server error that names NaN is the NaN fault seen from another side: the sampler
     * refusing NaN/Inf logits (PyTorch's "probability tensor contains either `inf`, `nan` or
     * element < 0", SGLang #20043) rather than a stop on them. A 4xx is the request's fault. */
    const bool nan_error = p.has_error && (http_status >= 500 || (http_status >= 200 && http_status <= 299)) &&
                           mentions_nan(p.error);
    if (nan_error) {
        char msg[200];
        snprintf(msg, sizeof msg, "HTTP %d, an error naming NaN: %s", http_status, p.error);
        set_class(o, FP4D_PROBE_NAN_STOP, "%s", msg);
        goto out;
    }
    if (http_status < 200 || http_status > 299) {
        char msg[200];
        snprintf(msg, sizeof msg, "HTTP %d%s%s", http_status, p.has_error ? ": " : "",
                 p.has_error ? p.error : "");
        set_class(o, FP4D_PROBE_HTTP_ERROR, "%s", msg);
        goto out;
    }
    if (p.has_error) {
        set_class(o, FP4D_PROBE_HTTP_ERROR, "error object in a 2xx response: %s", p.error);
        goto out;
    }
    if (!parsed_ok) {
        set_class(o, FP4D_PROBE_MALFORMED, "%s", why);
        goto out;
    }
    if (p.bad_type[0]) {
        set_class(o, FP4D_PROBE_MALFORMED, "%s", p.bad_type);
        goto out;
    }
    if (!p.has_choice) {
        set_class(o, FP4D_PROBE_MALFORMED, "%s", "no choices[0] in the response");
        goto out;
    }

    /* Keep the text before any verdict on it: the report quotes it. A NUL inside it ("\u0000")
     * becomes '?': the outcome's strings are NUL-terminated, and the checks below would otherwise
     * stop at it and miss whatever garbage follows. */
    if (p.content_present) o->content = taken_text(&p.content);
    if (p.reasoning_present) o->reasoning = taken_text(&p.reasoning);
    if ((p.content_present && !o->content) || (p.reasoning_present && !o->reasoning)) {
        fp4d_probe_outcome_free(o);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory while reading a response");
    }

    if (mentions_nan(o->matched_stop) || mentions_nan(o->finish_reason)) {
        char msg[128];
        snprintf(msg, sizeof msg, "finish_reason \"%s\", matched_stop \"%s\"", o->finish_reason,
                 o->matched_stop);
        set_class(o, FP4D_PROBE_NAN_STOP, "%s", msg);
        goto out;
    }

    size_t cn = o->content ? strlen(o->content) : 0, rn = o->reasoning ? strlen(o->reasoning) : 0;
    char dwhy[120];
    if (fp4d_probe_text_is_degenerate(o->content, cn, dwhy, sizeof dwhy)) {
        set_class(o, FP4D_PROBE_DEGENERATE, "content: %s", dwhy);
        goto out;
    }
    if (fp4d_probe_text_is_degenerate(o->reasoning, rn, dwhy, sizeof dwhy)) {
        /* The `!!!!` answer: garbage that a reasoning parser captured as reasoning. */
        char msg[190];
        snprintf(msg, sizeof msg, "reasoning: %s%s", dwhy,
                 is_blank(o->content ? o->content : "", cn) ? " (content empty: reasoning only)" : "");
        set_class(o, FP4D_PROBE_DEGENERATE, "%s", msg);
        goto out;
    }
    bool no_content = is_blank(o->content ? o->content : "", cn);
    bool no_reasoning = is_blank(o->reasoning ? o->reasoning : "", rn);
    bool cut = !strcmp(o->finish_reason, "length");
    if (no_content && no_reasoning) {
        set_class(o, FP4D_PROBE_EMPTY, "no content and no reasoning (finish_reason \"%s\")", o->finish_reason);
        goto out;
    }
    if (no_content) {
        if (cut)
            set_class(o, FP4D_PROBE_TRUNCATED, "%s", "cut by the length limit while reasoning, no content yet");
        else
            set_class(o, FP4D_PROBE_REASONING_ONLY, "reasoning but no content (finish_reason \"%s\")",
                      o->finish_reason);
        goto out;
    }
    if (!prompt || fp4d_probe_answer_matches(prompt, o->content)) {
        set_class(o, FP4D_PROBE_OK, "%s", prompt ? "expected answer found" : "content present");
        goto out;
    }
    char ex[64];
    excerpt(ex, sizeof ex, o->content, cn);
    if (cut) {
        char msg[190];
        snprintf(msg, sizeof msg, "cut by the length limit before \"%s\" appeared", prompt->answers[0]);
        set_class(o, FP4D_PROBE_TRUNCATED, "%s", msg);
    } else {
        char msg[190];
        snprintf(msg, sizeof msg, "expected \"%s\", got \"%s\"", prompt->answers[0], ex);
        set_class(o, FP4D_PROBE_WRONG_ANSWER, "%s", msg);
    }

out:
    fp4d_buf_free(&p.content);
    fp4d_buf_free(&p.reasoning);
    return FP4D_STATUS_OK;
}

void fp4d_probe_outcome_free(fp4d_probe_outcome *o)
{
    if (!o) return;
    free(o->content);
    free(o->reasoning);
    o->content = o->reasoning = NULL;
}
