/* Untrusted text made safe to print and to embed: see internal.h. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

size_t fp4d_utf8_seq_len(const unsigned char *s, size_t n)
{
    const unsigned char c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

void fp4d_text_clean(char *s)
{
    if (!s) return;
    unsigned char *u = (unsigned char *)s;
    size_t n = 0;
    while (u[n]) n++;
    for (size_t i = 0; i < n;) {
        const size_t k = fp4d_utf8_seq_len(u + i, n - i);
        /* C0 controls and DEL (escape sequences start with ESC), C1 controls U+0080..U+009F
         * (0x9B is a one-byte CSI to some terminals), and U+FFFE / U+FFFF (which XML forbids) */
        const bool control = k == 1 ? u[i] < 0x20 || u[i] == 0x7F
                                    : (k == 2 && u[i] == 0xC2 && u[i + 1] <= 0x9F) ||
                                          (k == 3 && u[i] == 0xEF && u[i + 1] == 0xBF && u[i + 2] >= 0xBE);
        if (k == 0 || control) {
            for (size_t j = 0; j < (k ? k : 1); j++) u[i + j] = '?';
            i += k ? k : 1;
        } else {
            i += k;
        }
    }
}

long fp4d_env_digits(const char *text, long max)
{
    if (!text || !*text) return -1;
    long v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        /* v * 10 + digit would pass max (the first test alone: (max - digit) / 10 rounds a
         * negative quotient up to 0, which let "5" through for max 1) */
        if (*p - '0' > max || v > (max - (*p - '0')) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}
