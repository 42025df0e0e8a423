/*
 * The probe's built-in prompt set: questions whose answers a correct model gets right at
 * temperature 0 and a program can check (arithmetic, well-known facts, counting, copying a
 * string), plus padding prompts that put filler text of very different lengths in front of
 * a question, so that a batch of concurrent requests mixes short and long sequences (the
 * batch composition that exposed SGLang #20043 and FlashInfer #2708).
 */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "probe_internal.h"

/* Padding prompts get their text at first use; the other texts are literals. */
static fp4d_probe_prompt prompts[] = {
    {"add",          "What is 17 + 25? Reply with only the number.",
     {"42", "forty-two", "forty two", NULL}, 0},
    {"pad-600-copy", NULL, {"KESTREL-2291", NULL}, 600},
    {"capital",      "What is the capital of France? Reply with one word.",
     {"Paris", NULL}, 0},
    {"copy",         "Copy this string exactly, with nothing else: QZX-4417-VOLT",
     {"QZX-4417-VOLT", NULL}, 0},
    {"multiply",     "What is 9 times 8? Reply with only the number.",
     {"72", "seventy-two", "seventy two", NULL}, 0},
    {"pad-40-add",   NULL, {"13", "thirteen", NULL}, 40},
    {"spider",       "How many legs does a spider have? Reply with only the number.",
     {"8", "eight", NULL}, 0},
    {"red-planet",   "Which planet in our solar system is known as the Red Planet? Reply with one word.",
     {"Mars", NULL}, 0},
    {"count",        "How many fruits are in this list: apple, pear, plum, fig, kiwi? Reply with only the number.",
     {"5", "five", NULL}, 0},
    {"pad-1200-count", NULL, {"3", "three", NULL}, 1200},
    {"subtract",     "What is 100 minus 37? Reply with only the number.",
     {"63", "sixty-three", "sixty three", NULL}, 0},
    {"gold",         "What is the chemical symbol for gold? Reply with only the symbol.",
     {"Au", NULL}, 0},
    {"copy-2",       "Repeat exactly, with nothing else: mango-delta-7193",
     {"mango-delta-7193", NULL}, 0},
    {"pad-200-fact", NULL, {"Tokyo", NULL}, 200},
    {"week",         "How many days are in one week? Reply with only the number.",
     {"7", "seven", NULL}, 0},
    {"ocean",        "What is the largest ocean on Earth? Reply with one word.",
     {"Pacific", NULL}, 0},
};

/* The question at the end of each padding prompt, in the order of the padded entries. */
static const struct {
    const char *id;
    const char *question;
} padded_questions[] = {
    {"pad-600-copy",   "Copy this string exactly, with nothing else: KESTREL-2291"},
    {"pad-40-add",     "What is 6 + 7? Reply with only the number."},
    {"pad-1200-count", "How many sides does a triangle have? Reply with only the number."},
    {"pad-200-fact",   "What is the capital of Japan? Reply with one word."},
};

/* Filler sentences: no digits and none of the answers, so an echo of the filler cannot pass
 * as a correct answer. */
static const char *const filler[] = {
    "The old lighthouse keeper walked along the shore each evening.",
    "Gulls circled above the harbor while the fishing boats came home.",
    "A gentle wind carried the smell of salt across the quiet village.",
    "Children played near the market stalls until the lamps were lit.",
    "The baker set out fresh loaves on the long wooden counter.",
    "Rain clouds gathered over the hills but never reached the town.",
    "An old dog slept in the warm sun beside the chapel steps.",
    "The river bent slowly around a meadow full of wild flowers.",
};


#define PROBE_PROMPT_COUNT (sizeof prompts / sizeof prompts[0])

static pthread_once_t padding_once = PTHREAD_ONCE_INIT;
static bool padding_ok;

/* Builds "filler ... question" for one padding prompt: whole sentences until at least
 * `words` words, so lengths differ by orders of magnitude between padding prompts. */
static char *build_padded(unsigned words, const char *question)
{
    static const char intro[] =
        "The following paragraph is filler text; ignore it and answer the question after it.\n\n";
    fp4d_buf b = {0};
    bool ok = fp4d_buf_append(&b, intro, sizeof intro - 1);
    unsigned have = 0;
    for (size_t i = 0; ok && have < words; i++) {
        const char *s = filler[i % (sizeof filler / sizeof filler[0])];
        if (i > 0) ok = fp4d_buf_append(&b, " ", 1);
        ok = ok && fp4d_buf_append(&b, s, strlen(s));
        for (const char *c = s; *c; c++)
            if (*c == ' ') have++;
        have++;
    }
    ok = ok && fp4d_buf_append(&b, "\n\nQuestion: ", 12) &&
         fp4d_buf_append(&b, question, strlen(question));
    if (!ok) {
        fp4d_buf_free(&b);
        return NULL;
    }
    return b.p;
}

static void build_padding_prompts(void)
{
    padding_ok = true;
    for (size_t q = 0; q < sizeof padded_questions / sizeof padded_questions[0]; q++)
        for (size_t i = 0; i < PROBE_PROMPT_COUNT; i++)
            if (!strcmp(prompts[i].id, padded_questions[q].id)) {
                /* Lives until exit: the prompt set is process-wide and read-only after this. */
                char *t = build_padded(prompts[i].padding_words, padded_questions[q].question);
                if (!t) padding_ok = false;
                prompts[i].text = t;
            }
}

static bool prompts_ready(void)
{
    pthread_once(&padding_once, build_padding_prompts);
    return padding_ok;
}

size_t fp4d_probe_prompt_count(void) { return prompts_ready() ? PROBE_PROMPT_COUNT : 0; }

const fp4d_probe_prompt *fp4d_probe_prompt_at(size_t i)
{
    if (!prompts_ready() || i >= PROBE_PROMPT_COUNT) return NULL;
    return &prompts[i];
}

const fp4d_probe_prompt *fp4d_probe_prompt_find(const char *sent)
{
    if (!sent || !prompts_ready()) return NULL;
    const fp4d_probe_prompt *best = NULL;
    size_t best_len = 0;
    for (size_t i = 0; i < PROBE_PROMPT_COUNT; i++) {
        size_t n = strlen(prompts[i].text);
        if (n > best_len && !strncmp(sent, prompts[i].text, n)) {
            best = &prompts[i];
            best_len = n;
        }
    }
    return best;
}

static bool is_word_char(unsigned char c) { return isalnum(c) || c >= 0x80; }

bool fp4d_probe_answer_matches(const fp4d_probe_prompt *p, const char *content)
{
    if (!p || !content) return false;
    size_t n = strlen(content);
    for (int a = 0; a < 4 && p->answers[a]; a++) {
        size_t m = strlen(p->answers[a]);
        if (m == 0 || m > n) continue;
        for (size_t i = 0; i + m <= n; i++) {
            if (strncasecmp(content + i, p->answers[a], m) != 0) continue;
            /* Whole token: "42" must not match inside "142" or "420". */
            bool left_ok = i == 0 || !is_word_char((unsigned char)content[i - 1]);
            bool right_ok = i + m == n || !is_word_char((unsigned char)content[i + m]);
            if (left_ok && right_ok) return true;
        }
    }
    return false;
}
