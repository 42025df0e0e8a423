/*
 * Fuzz target: a safetensors file given as bytes, through the strict reader
 * (fp4d_st_open_memory) and the scanner's forgiving header reader (src/scan/header.c).
 * Both must reject or accept without reading out of bounds; whatever the strict reader
 * accepts must describe tensors that lie inside the buffer.
 */
#include <stdlib.h>
#include <string.h>

#include "fp4doctor/io.h"
#include "fuzz.h"
#include "scan/scan_internal.h"

int fp4d_fuzz_st_header(const uint8_t *data, size_t size)
{
    fp4d_st_open_result res;
    fp4d_st_file *f = fp4d_st_open_memory(data, size, &res);
    if (f) {
        uint64_t hdr = fp4d_st_header_size(f);
        for (size_t i = 0; i < fp4d_st_count(f); i++) {
            const fp4d_st_tensor *t = fp4d_st_get(f, i);
            /* An accepted file's tensors lie inside the buffer: touch their first and last bytes. */
            if (8 + hdr + t->end > size || t->end < t->begin) abort();
            if (t->nbytes) {
                volatile uint8_t x = t->data[0];
                x ^= t->data[t->nbytes - 1];
                (void)x;
            }
            if (fp4d_st_find(f, t->name) == NULL) abort();
        }
        fp4d_st_close(f);
    }
    /* The forgiving reader, given the bytes after the length field. */
    if (size >= 8) {
        scan_hdr h;
        if (scan_hdr_parse(data + 8, size - 8, size - 8, &h) == FP4D_STATUS_OK) scan_hdr_free(&h);
    }
    return 0;
}

#ifdef FP4D_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fp4d_fuzz_st_header(data, size); }
#endif
