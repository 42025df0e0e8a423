/* names.c - layer and expert numbers and module names from Hugging Face tensor names. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "scan/scan_internal.h"

/* The number right after "<component>." where component is one of keys, at a component
 * boundary: "model.layers.12.mlp" -> 12. */
static int64_t name_number_after(const char *name, const char *const *keys, size_t nkeys)
{
    for (const char *p = name; *p; p++) {
        if (p != name && p[-1] != '.') continue;
        for (size_t k = 0; k < nkeys; k++) {
            size_t n = strlen(keys[k]);
            if (strncmp(p, keys[k], n) || p[n] != '.' || !isdigit((unsigned char)p[n + 1])) continue;
            const char *d = p + n + 1;
            int64_t v = 0;
            while (isdigit((unsigned char)*d) && v < 1000000000) v = v * 10 + (*d++ - '0');
            if (*d == '.' || *d == '\0') return v;
        }
    }
    return -1;
}

int64_t scan_name_layer(const char *name)
{
    static const char *const keys[] = {"layers", "h", "block", "blocks", "layer"};
    return name_number_after(name, keys, sizeof keys / sizeof keys[0]);
}

int64_t scan_name_expert(const char *name)
{
    static const char *const keys[] = {"experts"};
    return name_number_after(name, keys, 1);
}

char *scan_name_module(const char *name)
{
    /* Longest first where one suffix ends another (".weight_scale_2" before ".weight_scale"). */
    static const char *const sfx[] = {".weight_packed", ".weight_scale_2", ".weight_global_scale",
                                      ".input_global_scale", ".weight_scale", ".input_scale", ".weight",
                                      "_blocks", "_scales"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        size_t k = strlen(sfx[i]);
        if (n > k && !strcmp(name + n - k, sfx[i])) return strndup(name, n - k);
    }
    return strdup(name);
}

bool scan_tp_row_parallel(const char *module)
{
    static const char *const names[] = {"down_proj", "o_proj", "out_proj", "dense_4h_to_h", "w2", "wo", "fc2"};
    const char *dot = strrchr(module, '.');
    const char *leaf = dot ? dot + 1 : module;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(leaf, names[i])) return true;
    return false;
}

scan_tp_problem scan_tp_shard(int64_t n, int64_t k, int64_t block, bool is_mx, bool row_parallel, int tp)
{
    const int64_t split = row_parallel ? k : n;
    if (tp <= 1 || split <= 0) return SCAN_TP_OK;
    if (split % tp) return SCAN_TP_UNEVEN;
    if (!row_parallel) return SCAN_TP_OK;
    const int64_t per_rank = k / tp;
    if (per_rank % block) return SCAN_TP_SPLIT_BLOCK;
    return !is_mx && per_rank % 32 ? SCAN_TP_PADDED_SCALES : SCAN_TP_OK;
}
