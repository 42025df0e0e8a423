/* The stream layout of FP4 weight codes (stream_codes.h): the decode's 32 x 32 GF(2) matrix,
 * inverted once into per-bit encode masks. */
#include "stream_codes.h"

#include <pthread.h>

/* Bit position inside a pair's bf16x2 of element bit b (0..3 = m0 m1 m2 s) of its low (hi = 0)
 * or high (hi = 1) element. */
static int pair_bit(int b, int hi) { return (b < 3 ? 6 + b : 15) + 16 * hi; }

uint32_t fp4d_natural_pair(uint32_t natural, int i)
{
    uint32_t out = 0;
    for (int hi = 0; hi < 2; hi++)
        for (int b = 0; b < 4; b++)
            out |= ((natural >> (4 * (i + 4 * hi) + b)) & 1u) << pair_bit(b, hi);
    return out;
}

uint32_t fp4d_stream_decode_pair(uint32_t w, int i)
{
    switch (i) {
    case 0: return w & FP4D_STREAM_PAIR_MASK;
    case 1: return (w << 6) & FP4D_STREAM_PAIR_MASK;
    case 2: return ((w << 12) | (w >> 20)) & FP4D_STREAM_PAIR_MASK;
    default: return ((w << 2) ^ (w >> 6)) & FP4D_STREAM_PAIR_MASK;
    }
}

static uint32_t encode_masks[32];
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

/* The decode is linear: output bit j of pair i is row(i, j) . w over GF(2), where row is the
 * decode of the unit words. Equation (i, j) must yield natural bit q(i, j); Gauss-Jordan on
 * the 32 equations, carrying which natural bit each combination stands for, leaves for every
 * stream bit the set of natural bits it equals - transposed, the encode masks. */
static void build_encode_masks(void)
{
    uint32_t row[32], rhs[32]; /* rhs: natural bits (as a mask) the row's XOR must equal */
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int hi = 0; hi < 2; hi++)
            for (int b = 0; b < 4; b++) {
                const int pos = pair_bit(b, hi);
                uint32_t r = 0;
                for (int s = 0; s < 32; s++)
                    if ((fp4d_stream_decode_pair(1u << s, i) >> pos) & 1u) r |= 1u << s;
                row[n] = r;
                rhs[n] = 1u << (4 * (i + 4 * hi) + b);
                n++;
            }
    for (int col = 0; col < 32; col++) {
        int piv = col;
        while (piv < 32 && !((row[piv] >> col) & 1u)) piv++;
        if (piv == 32) return; /* singular: cannot happen for the shifts above (tested) */
        uint32_t t = row[piv]; row[piv] = row[col]; row[col] = t;
        t = rhs[piv]; rhs[piv] = rhs[col]; rhs[col] = t;
        for (int r = 0; r < 32; r++)
            if (r != col && ((row[r] >> col) & 1u)) {
                row[r] ^= row[col];
                rhs[r] ^= rhs[col];
            }
    }
    /* now stream bit s = XOR of the natural bits in rhs[s] */
    for (int s = 0; s < 32; s++)
        for (int q = 0; q < 32; q++)
            if ((rhs[s] >> q) & 1u) encode_masks[q] |= 1u << s;
}

const uint32_t *fp4d_stream_encode_masks(void)
{
    pthread_once(&encode_once, build_encode_masks);
    return encode_masks;
}

uint32_t fp4d_stream_encode_word(uint32_t natural)
{
    const uint32_t *m = fp4d_stream_encode_masks();
    uint32_t w = 0;
    for (int q = 0; q < 32; q++)
        if ((natural >> q) & 1u) w ^= m[q];
    return w;
}
