/*
 * Helpers shared by the scan tests (test_scan.c, test_scan_malformed.c). Header-only, like
 * tests/test_util.h.
 */
#ifndef FP4D_SCAN_TEST_UTIL_H
#define FP4D_SCAN_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "fp4doctor/scan.h"

/* The text report of r (fp4d_scan_report_print, no colour) as a malloc'd string the caller
 * frees; NULL when it cannot be made. */
static inline char *scan_report_text(const fp4d_scan_report *r)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fp4d_scan_report_print(r, f, false);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

#endif
