/*
 * Fuzz target: a tensor name (src/scan/names.c: layer and expert numbers, the module a tensor
 * belongs to), then fp4d_text_clean, which makes such a name (or a plugin's string) safe to
 * print and to embed in JSON. The input is the name; a NUL inside it ends the name, as it
 * would in a header key.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "internal.h"
#include "scan/scan_internal.h"

int fp4d_fuzz_names(const uint8_t *data, size_t size)
{
    char *name = malloc(size + 1);
    if (!name) return 0;
    memcpy(name, data, size);
    name[size] = '\0';
    size_t n = strlen(name);

    int64_t layer = scan_name_layer(name), expert = scan_name_expert(name);
    if (layer < -1 || expert < -1) abort();
    /* The module is the name or a prefix of it (a suffix removed), never longer. */
    char *module = scan_name_module(name);
    if (module) {
        size_t m = strlen(module);
        if (m > n || memcmp(module, name, m)) abort();
        (void)scan_name_layer(module);
        (void)scan_name_expert(module);
        free(module);
    }

    /* Cleaning keeps the length and leaves no control character (C0, DEL) behind. */
    fp4d_text_clean(name);
    if (strlen(name) != n) abort();
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7F) abort();
    /* ...and only valid UTF-8. */
    for (size_t i = 0; i < n;) {
        size_t k = fp4d_utf8_seq_len((const unsigned char *)name + i, n - i);
        if (!k) abort();
        i += k;
    }
    free(name);
    return 0;
}

#ifdef FP4D_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fp4d_fuzz_names(data, size); }
#endif
