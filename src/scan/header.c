/*
 * header.c - a forgiving reader of safetensors headers, used only after the strict reader
 * (src/io/) has rejected a file: it recovers the tensor names, finds the entry that broke
 * a rule, counts duplicate keys (which a JSON library folds away), and tells a header cut
 * short by truncation from a header whose length field is simply wrong.
 *
 * Input is untrusted: every read is bounded by the length given (fuzz/fuzz_st_header.c).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "internal.h"
#include "scan/scan_internal.h"

/* ---- a minimal walker over the top-level object's keys ---------------------------------- */

typedef struct hdr_walk {
    const uint8_t *p, *end;
} hdr_walk;

static void walk_ws(hdr_walk *w)
{
    while (w->p < w->end && (*w->p == ' ' || *w->p == '\t' || *w->p == '\n' || *w->p == '\r')) w->p++;
}

/* Skips a JSON string starting at '"'; returns false if it does not end in the bytes. */
static bool walk_string(hdr_walk *w, const uint8_t **start, size_t *len)
{
    if (w->p >= w->end || *w->p != '"') return false;
    w->p++;
    const uint8_t *s = w->p;
    while (w->p < w->end) {
        if (*w->p == '\\') {
            w->p += 2;
            continue;
        }
        if (*w->p == '"') {
            if (start) *start = s;
            if (len) *len = (size_t)(w->p - s);
            w->p++;
            return true;
        }
        w->p++;
    }
    w->p = w->end;
    return false;
}

/* Skips one value of any kind, tracking nesting with a counter (no recursion). */
static bool walk_value(hdr_walk *w)
{
    walk_ws(w);
    if (w->p >= w->end) return false;
    if (*w->p == '"') return walk_string(w, NULL, NULL);
    if (*w->p != '{' && *w->p != '[') {
        while (w->p < w->end && *w->p != ',' && *w->p != '}' && *w->p != ']') w->p++;
        return w->p < w->end;
    }
    size_t depth = 0;
    while (w->p < w->end) {
        uint8_t c = *w->p;
        if (c == '"') {
            if (!walk_string(w, NULL, NULL)) return false;
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0) return false;
            depth--;
            if (depth == 0) {
                w->p++;
                return true;
            }
        }
        w->p++;
    }
    return false;
}

typedef struct key_ref {
    const uint8_t *s;
    size_t         n;
} key_ref;

static int key_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* Walks the top-level keys: sets object_complete and the duplicate list. */
static fp4d_status hdr_walk_keys(const uint8_t *hdr, size_t len, scan_hdr *h)
{
    hdr_walk w = {hdr, hdr + len};
    walk_ws(&w);
    if (w.p >= w.end || *w.p != '{') return FP4D_STATUS_OK;
    w.p++;
    key_ref *keys = NULL;
    size_t nkeys = 0, cap = 0;
    for (;;) {
        walk_ws(&w);
        if (w.p >= w.end) break;
        if (*w.p == '}') {
            h->object_complete = true;
            break;
        }
        key_ref k;
        if (!walk_string(&w, &k.s, &k.n)) break;
        if (nkeys == cap) {
            cap = cap ? cap * 2 : 64;
            key_ref *g = realloc(keys, cap * sizeof *keys);
            if (!g) {
                free(keys);
                return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            }
            keys = g;
        }
        keys[nkeys++] = k;
        walk_ws(&w);
        if (w.p >= w.end || *w.p != ':') break;
        w.p++;
        if (!walk_value(&w)) break;
        walk_ws(&w);
        if (w.p < w.end && *w.p == ',') {
            w.p++;
            continue;
        }
        if (w.p < w.end && *w.p == '}') {
            h->object_complete = true;
        }
        break;
    }
    if (nkeys > 1) qsort(keys, nkeys, sizeof *keys, key_cmp);
    for (size_t i = 0; i < nkeys;) {
        size_t j = i + 1;
        while (j < nkeys && key_cmp(&keys[i], &keys[j]) == 0) j++;
        if (j - i > 1) {
            char **gn = realloc(h->dup_names, (h->num_dups + 1) * sizeof *gn);
            if (gn) h->dup_names = gn;
            uint64_t *gc = realloc(h->dup_counts, (h->num_dups + 1) * sizeof *gc);
            if (gc) h->dup_counts = gc;
            char *name = malloc(keys[i].n + 1);
            if (!gn || !gc || !name) {
                free(name);
                free(keys);
                return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            }
            memcpy(name, keys[i].s, keys[i].n);
            name[keys[i].n] = '\0';
            h->dup_names[h->num_dups]  = name;
            h->dup_counts[h->num_dups] = j - i;
            h->num_dups++;
        }
        i = j;
    }
    free(keys);
    return FP4D_STATUS_OK;
}

/* ---- entries via jansson (last duplicate wins), each checked on its own ------------------ */

static bool hdr_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static void hdr_fill_entry(scan_hdr_entry *e, json_t *v)
{
    e->entry_ok = false;
    if (!json_is_object(v)) return;
    json_t *dt = json_object_get(v, "dtype");
    if (json_is_string(dt)) e->dtype_known = fp4d_st_dtype_from_name(json_string_value(dt), &e->dtype);
    json_t *shape = json_object_get(v, "shape");
    json_t *offs  = json_object_get(v, "data_offsets");
    bool ok = e->dtype_known && json_is_array(shape) && json_array_size(shape) <= FP4D_ST_MAX_DIMS &&
              json_is_array(offs) && json_array_size(offs) == 2;
    uint64_t elems = 1;
    if (json_is_array(shape)) {
        size_t nd = json_array_size(shape);
        e->ndim = nd <= FP4D_ST_MAX_DIMS ? (int32_t)nd : 0;
        for (size_t i = 0; i < nd && i < FP4D_ST_MAX_DIMS; i++) {
            uint64_t d;
            if (!hdr_u64(json_array_get(shape, i), &d) || d > (uint64_t)INT64_MAX) {
                ok = false;
                continue;
            }
            e->shape[i] = (int64_t)d;
            if (d && elems > UINT64_MAX / d) ok = false; /* product overflows */
            else elems *= d;
        }
    }
    if (json_is_array(offs) && json_array_size(offs) == 2) {
        if (!hdr_u64(json_array_get(offs, 0), &e->begin) || !hdr_u64(json_array_get(offs, 1), &e->end) ||
            e->end < e->begin)
            ok = false;
    }
    if (ok) {
        uint32_t bits = fp4d_st_dtype_bits(e->dtype);
        if (bits && elems > UINT64_MAX / bits) ok = false;
        else if ((elems * bits) % 8 != 0 || e->end - e->begin != elems * bits / 8) ok = false;
    }
    e->entry_ok = ok;
}

static int entry_cmp_begin(const void *a, const void *b)
{
    const scan_hdr_entry *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin) return (*x)->begin < (*y)->begin ? -1 : 1;
    return (*x)->end < (*y)->end ? -1 : (*x)->end > (*y)->end;
}

fp4d_status scan_hdr_parse(const uint8_t *hdr, size_t hdr_len, uint64_t data_len, scan_hdr *h)
{
    memset(h, 0, sizeof *h);
    FP4D_FORWARD_IF_ERROR(hdr_walk_keys(hdr, hdr_len, h));

    json_error_t err;
    json_t *root = hdr_len ? json_loadb((const char *)hdr, hdr_len, JSON_DISABLE_EOF_CHECK, &err) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        return FP4D_STATUS_OK;
    }
    size_t n = json_object_size(root);
    h->entries = calloc(n ? n : 1, sizeof *h->entries);
    if (!h->entries) {
        json_decref(root);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        scan_hdr_entry *e = &h->entries[h->count];
        e->name = strdup(key);
        if (!e->name) {
            json_decref(root);
            return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        }
        hdr_fill_entry(e, v);
        h->count++;
    }
    json_decref(root);
    h->parsed = true;

    /* The first rule broken, in the strict reader's order: an entry on its own, then the
     * offset walk (gaps, overlaps), then data running past the end of the file. */
    for (size_t i = 0; i < h->count && !h->first_bad; i++)
        if (!h->entries[i].entry_ok) h->first_bad = h->entries[i].name;
    if (!h->first_bad && h->count) {
        scan_hdr_entry **order = malloc(h->count * sizeof *order);
        if (!order) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        for (size_t i = 0; i < h->count; i++) order[i] = &h->entries[i];
        qsort(order, h->count, sizeof *order, entry_cmp_begin);
        uint64_t start = 0;
        for (size_t i = 0; i < h->count; i++) {
            if (order[i]->begin != start) {
                h->first_bad = order[i]->name;
                break;
            }
            start = order[i]->end;
        }
        if (!h->first_bad)
            for (size_t i = 0; i < h->count; i++)
                if (order[i]->end > data_len) {
                    h->first_bad = order[i]->name;
                    break;
                }
        free(order);
    }
    return FP4D_STATUS_OK;
}

void scan_hdr_free(scan_hdr *h)
{
    if (!h) return;
    for (size_t i = 0; i < h->count; i++) free(h->entries[i].name);
    free(h->entries);
    for (size_t i = 0; i < h->num_dups; i++) free(h->dup_names[i]);
    free(h->dup_names);
    free(h->dup_counts);
    memset(h, 0, sizeof *h);
}
