/*
 * quant_config.c - which modules of a checkpoint are FP4-quantized, from hf_quant_config.json
 * (ModelOpt) or config.json's "quantization_config" (ModelOpt, compressed-tensors, gpt-oss
 * "mxfp4"). Spec §7a-7c. Input is untrusted (fuzzed by fuzz/fuzz_quant_config.c).
 */
#include <ctype.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fp4doctor/scan.h"
#include "internal.h"
#include "scan/scan_internal.h"

/* One exclusion rule: an fnmatch pattern, or a compiled "re:" regex (compressed-tensors). */
typedef struct qc_pattern {
    char   *text;
    bool    is_regex;
    bool    regex_ok;
    regex_t regex;
} qc_pattern;

struct fp4d_quant_config {
    fp4d_ckpt_format format;
    bool             mixed;           /* ModelOpt MIXED_PRECISION: only quantized_layers are FP4 */
    bool             format_known;    /* the config named an FP4 format we understand */
    bool             input_scales;    /* static activation scales expected (W4A4) */
    char            *algo;            /* quant_algo / format string as written, or NULL */
    qc_pattern      *exclude;
    size_t           num_exclude;
    qc_pattern      *quantized;       /* MIXED_PRECISION quantized_layers with an FP4 algo */
    size_t           num_quantized;
};

static bool qc_is_fp4_algo(const char *algo)
{
    if (!algo) return false;
    /* "NVFP4", "NVFP4_AWQ", "W4A16_NVFP4", "W4A8_NVFP4_FP8", "MXFP4", "W4A8_MXFP4_FP8" */
    char up[64];
    size_t n = strlen(algo);
    if (n >= sizeof up) n = sizeof up - 1;
    for (size_t i = 0; i < n; i++) up[i] = (char)toupper((unsigned char)algo[i]);
    up[n] = '\0';
    return strstr(up, "FP4") != NULL;
}

static bool qc_is_mx_algo(const char *algo)
{
    if (!algo) return false;
    for (const char *p = algo; *p; p++)
        if ((p[0] == 'M' || p[0] == 'm') && (p[1] == 'X' || p[1] == 'x')) return true;
    return false;
}

/* Python's re syntax for the few escapes compressed-tensors configs use, in POSIX ERE. */
static char *qc_regex_to_posix(const char *py)
{
    size_t n = strlen(py);
    char  *out = malloc(n * 6 + 2);
    if (!out) return NULL;
    size_t o = 0;
    out[o++] = '^'; /* re.match anchors at the start */
    for (size_t i = 0; i < n; i++) {
        if (py[i] == '\\' && i + 1 < n) {
            const char *rep = NULL;
            switch (py[i + 1]) {
            case 'd': rep = "[0-9]"; break;
            case 'w': rep = "[A-Za-z0-9_]"; break;
            case 's': rep = "[ \t]"; break;
            default: break;
            }
            if (rep) {
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
                i++;
                continue;
            }
            out[o++] = py[i++];
            out[o++] = py[i];
            continue;
        }
        out[o++] = py[i];
    }
    out[o] = '\0';
    return out;
}

/* Whether glibc's regcomp can compile a pattern in reasonable time and memory: short, no
 * bounded repetition, at most 8 repetition operators and never two in a row ("a++",
 * "(a*)*"-style nesting expands exponentially; found by fuzzing). No back-references either:
 * glibc's regexec backtracks over them, and "(.*)(.*)(.*)(.*)\1\2\3\4x" took 12 s on one
 * 100-byte module name and over 20 s on 300 bytes - per tensor name, which the same untrusted
 * checkpoint chooses (the fuzz target's short names hid it; it now matches a long one too).
 * No ignore list written by a quantizer uses them. */
static bool qc_regex_is_tame(const char *re)
{
    size_t n = strlen(re), reps = 0;
    if (n > 128) return false;
    bool prev_rep = false;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '\\') {
            if (re[i + 1] >= '1' && re[i + 1] <= '9') return false; /* \1..\9: a back-reference */
            i++;
            prev_rep = false;
            continue;
        }
        bool rep = re[i] == '*' || re[i] == '+' || re[i] == '?';
        if (re[i] == '{' || (rep && prev_rep)) return false;
        if (rep && i > 0 && re[i - 1] == ')' && i >= 2 && (re[i - 2] == '*' || re[i - 2] == '+')) return false;
        reps += rep;
        prev_rep = rep;
    }
    return reps <= 8;
}

static fp4d_status qc_add_pattern(qc_pattern **arr, size_t *count, const char *text)
{
    qc_pattern *grown = realloc(*arr, (*count + 1) * sizeof **arr);
    if (!grown) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    *arr = grown;
    qc_pattern *p = &grown[*count];
    memset(p, 0, sizeof *p);
    p->text = strdup(text);
    if (!p->text) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    (*count)++;
    if (!strncmp(text, "re:", 3)) {
        p->is_regex = true;
        char *posix = qc_regex_to_posix(text + 3);
        if (!posix) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        /* An unparsable or untamed regex (see above) excludes nothing rather than failing
         * the whole scan; no real ignore list needs what is refused. */
        p->regex_ok = qc_regex_is_tame(posix) && regcomp(&p->regex, posix, REG_EXTENDED | REG_NOSUB) == 0;
        free(posix);
    }
    return FP4D_STATUS_OK;
}

static fp4d_status qc_add_string_list(qc_pattern **arr, size_t *count, json_t *list)
{
    if (!json_is_array(list)) return FP4D_STATUS_OK;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        if (json_is_string(v)) FP4D_FORWARD_IF_ERROR(qc_add_pattern(arr, count, json_string_value(v)));
    }
    return FP4D_STATUS_OK;
}

static const char *qc_get_string(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static fp4d_status qc_set_algo(fp4d_quant_config *c, const char *algo)
{
    free(c->algo);
    c->algo = algo ? strdup(algo) : NULL;
    if (algo && !c->algo) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    return FP4D_STATUS_OK;
}

/* ModelOpt's "quantization" object (hf_quant_config.json) or its flat config.json form. */
static fp4d_status qc_parse_modelopt(fp4d_quant_config *c, json_t *q)
{
    const char *algo = qc_get_string(q, "quant_algo");
    FP4D_FORWARD_IF_ERROR(qc_set_algo(c, algo));
    FP4D_FORWARD_IF_ERROR(qc_add_string_list(&c->exclude, &c->num_exclude, json_object_get(q, "exclude_modules")));
    FP4D_FORWARD_IF_ERROR(qc_add_string_list(&c->exclude, &c->num_exclude, json_object_get(q, "ignore")));
    if (algo && !strcmp(algo, "MIXED_PRECISION")) {
        c->mixed = true;
        json_t *layers = json_object_get(q, "quantized_layers");
        const char *name;
        json_t *v;
        bool any_mx = false, any_nv = false;
        json_object_foreach(layers, name, v) {
            const char *la = json_is_object(v) ? qc_get_string(v, "quant_algo") : NULL;
            if (!qc_is_fp4_algo(la)) continue;
            FP4D_FORWARD_IF_ERROR(qc_add_pattern(&c->quantized, &c->num_quantized, name));
            if (qc_is_mx_algo(la)) any_mx = true;
            else any_nv = true;
            if (!strcmp(la, "NVFP4")) c->input_scales = true;
        }
        if (any_nv || any_mx) {
            c->format       = FP4D_CKPT_MODELOPT_NVFP4;
            c->format_known = true;
        }
        (void)any_mx;
        return FP4D_STATUS_OK;
    }
    if (qc_is_fp4_algo(algo)) {
        /* ModelOpt MXFP4 algos (W4A8_MXFP4_FP8) share the names; block size tells them apart. */
        c->format       = FP4D_CKPT_MODELOPT_NVFP4;
        c->format_known = true;
        char up[32] = {0};
        for (size_t i = 0; algo[i] && i + 1 < sizeof up; i++) up[i] = (char)toupper((unsigned char)algo[i]);
        c->input_scales = !strcmp(up, "NVFP4") || !strcmp(up, "NVFP4_AWQ") || strstr(up, "W4A8") != NULL;
    }
    return FP4D_STATUS_OK;
}

static fp4d_status qc_parse_compressed_tensors(fp4d_quant_config *c, json_t *q)
{
    const char *fmt = qc_get_string(q, "format");
    json_t *groups = json_object_get(q, "config_groups");
    const char *gname;
    json_t *g;
    json_object_foreach(groups, gname, g) {
        const char *gfmt = qc_get_string(g, "format");
        if (!fmt || !strcmp(fmt, "mixed-precision")) {
            if (gfmt) fmt = gfmt;
        }
        json_t *ia = json_object_get(g, "input_activations");
        if (json_is_object(ia)) {
            json_t *dyn = json_object_get(ia, "dynamic");
            /* dynamic false or "local": a stored input_global_scale (spec §7b). */
            if (json_is_false(dyn) || (json_is_string(dyn) && !strcmp(json_string_value(dyn), "local")))
                c->input_scales = true;
        }
    }
    FP4D_FORWARD_IF_ERROR(qc_set_algo(c, fmt));
    if (fmt && !strcmp(fmt, "nvfp4-pack-quantized")) {
        c->format = FP4D_CKPT_CT_NVFP4;
        c->format_known = true;
    } else if (fmt && !strcmp(fmt, "mxfp4-pack-quantized")) {
        c->format = FP4D_CKPT_CT_MXFP4;
        c->format_known = true;
        c->input_scales = false;
    }
    return qc_add_string_list(&c->exclude, &c->num_exclude, json_object_get(q, "ignore"));
}

static fp4d_status qc_parse_object(fp4d_quant_config *c, json_t *root, const char *source)
{
    json_t *q = root;
    bool from_hf_quant = source && strstr(source, "hf_quant_config") != NULL;
    if (!from_hf_quant) {
        json_t *qc = json_object_get(root, "quantization_config");
        if (json_is_object(qc)) q = qc;
        else if (!json_object_get(root, "quant_method") && !json_object_get(root, "quantization"))
            return FP4D_STATUS_OK; /* a plain model config: unquantized */
    }
    const char *method = qc_get_string(q, "quant_method");
    json_t *nested = json_object_get(q, "quantization");
    if (json_is_object(nested)) return qc_parse_modelopt(c, nested); /* hf_quant_config / old nested form */
    if (method && !strncmp(method, "modelopt", 8)) return qc_parse_modelopt(c, q);
    if (method && !strcmp(method, "compressed-tensors")) return qc_parse_compressed_tensors(c, q);
    if (method && !strcmp(method, "mxfp4")) {
        c->format       = FP4D_CKPT_GPTOSS_MXFP4;
        c->format_known = true;
        FP4D_FORWARD_IF_ERROR(qc_set_algo(c, method));
        return qc_add_string_list(&c->exclude, &c->num_exclude, json_object_get(q, "modules_to_not_convert"));
    }
    if (json_object_get(q, "quant_algo")) return qc_parse_modelopt(c, q); /* missing quant_method */
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_quant_config_parse(const char *text, size_t len, const char *source, fp4d_quant_config **out)
{
    FP4D_RETURN_ERROR_IF(!out, INVALID_ARG, "fp4d_quant_config_parse: out is NULL");
    *out = NULL;
    FP4D_RETURN_ERROR_IF(!text && len, INVALID_ARG, "fp4d_quant_config_parse: NULL text");
    json_error_t err;
    json_t *root = json_loadb(text ? text : "", len, 0, &err);
    FP4D_RETURN_ERROR_IF(!root, PARSE, "%s: line %d: %s", source ? source : "config", err.line, err.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return fp4d_set_error(FP4D_STATUS_PARSE, "%s: not a JSON object", source ? source : "config");
    }
    fp4d_quant_config *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(root);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    fp4d_status st = qc_parse_object(c, root, source);
    json_decref(root);
    if (st != FP4D_STATUS_OK) {
        fp4d_quant_config_free(c);
        return st;
    }
    *out = c;
    return FP4D_STATUS_OK;
}

static void qc_free_patterns(qc_pattern *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i].is_regex && p[i].regex_ok) regfree(&p[i].regex);
        free(p[i].text);
    }
    free(p);
}

void fp4d_quant_config_free(fp4d_quant_config *c)
{
    if (!c) return;
    qc_free_patterns(c->exclude, c->num_exclude);
    qc_free_patterns(c->quantized, c->num_quantized);
    free(c->algo);
    free(c);
}

fp4d_ckpt_format fp4d_quant_config_format(const fp4d_quant_config *c)
{
    return c ? c->format : FP4D_CKPT_UNQUANTIZED;
}

bool fp4d_quant_config_is_mixed(const fp4d_quant_config *c) { return c && c->mixed; }

bool scan_qc_format_known(const fp4d_quant_config *c) { return c && c->format_known; }
bool scan_qc_input_scales(const fp4d_quant_config *c) { return c && c->input_scales; }
const char *scan_qc_algo(const fp4d_quant_config *c) { return c ? c->algo : NULL; }
bool scan_qc_is_mx(const fp4d_quant_config *c)
{
    return c && (c->format == FP4D_CKPT_CT_MXFP4 || c->format == FP4D_CKPT_GPTOSS_MXFP4 ||
                 (c->format == FP4D_CKPT_MODELOPT_NVFP4 && !c->mixed && qc_is_mx_algo(c->algo)));
}

/* One bracket expression "[...]" at p (after '['); sets *matched, returns the position
 * after ']' or NULL when unterminated (then '[' is literal, as in fnmatch). */
static const char *glob_bracket(const char *p, char c, bool *matched)
{
    bool negate = *p == '!' || *p == '^';
    if (negate) p++;
    bool hit = false;
    const char *start = p;
    while (*p && (*p != ']' || p == start)) {
        char lo = *p, hi = lo;
        if (p[1] == '-' && p[2] && p[2] != ']') {
            hi = p[2];
            p += 3;
        } else {
            p++;
        }
        if (c >= lo && c <= hi) hit = true;
    }
    if (*p != ']') return NULL;
    *matched = hit != negate;
    return p + 1;
}

/* fnmatch(3) without flags ('*', '?', '[...]', '\\'), in O(len(pattern) x len(name)): glibc's
 * recursive fnmatch is exponential on patterns with many stars, and configs are untrusted. */
static bool glob_match(const char *pat, const char *s)
{
    const char *star_p = NULL, *star_s = NULL;
    while (*s) {
        const char *next = NULL;
        if (*pat == '*') {
            star_p = ++pat;
            star_s = s;
            continue;
        }
        if (*pat == '?') next = pat + 1;
        else if (*pat == '[') {
            bool m = false;
            const char *after = glob_bracket(pat + 1, *s, &m);
            if (!after) next = *s == '[' ? pat + 1 : NULL;
            else if (m) next = after;
        } else if (*pat == '\\' && pat[1]) {
            if (pat[1] == *s) next = pat + 2;
        } else if (*pat && *pat == *s) {
            next = pat + 1;
        }
        if (next) {
            pat = next;
            s++;
        } else if (star_p) {
            pat = star_p;
            s = ++star_s;
        } else {
            return false;
        }
    }
    while (*pat == '*') pat++;
    return *pat == '\0';
}

/* A pattern matches a module itself or any module below it ("model.layers.*.self_attn"
 * excludes model.layers.0.self_attn.q_proj, as transformers' modules_to_not_convert does). */
static bool qc_pattern_matches(const qc_pattern *p, const char *module)
{
    if (p->is_regex) return p->regex_ok && regexec(&p->regex, module, 0, NULL, 0) == 0;
    if (glob_match(p->text, module)) return true;
    /* Below it: some prefix ending just before a '.' matches the whole pattern. */
    size_t n = strlen(module);
    char *prefix = malloc(n + 1);
    if (!prefix) return false;
    bool m = false;
    for (size_t i = 0; i < n && !m; i++) {
        if (module[i] != '.') continue;
        memcpy(prefix, module, i);
        prefix[i] = '\0';
        m = glob_match(p->text, prefix);
    }
    free(prefix);
    return m;
}

bool fp4d_quant_config_is_excluded(const fp4d_quant_config *c, const char *module)
{
    if (!c || !module) return false;
    for (size_t i = 0; i < c->num_exclude; i++)
        if (qc_pattern_matches(&c->exclude[i], module)) return true;
    if (c->mixed) {
        for (size_t i = 0; i < c->num_quantized; i++)
            if (qc_pattern_matches(&c->quantized[i], module)) return false;
        return true;
    }
    return false;
}
