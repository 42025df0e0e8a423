/*
 * The stream layout of FP4 weight codes: each 32-bit word of e2m1 codes (eight nibbles,
 * element i in bits 4i..4i+3) re-encoded, once, by a fixed invertible bit transform, so that
 * the cuda backend's weight-streaming kernel turns the word into its four bf16x2 operand
 * pairs with four shifts and four LOP3s in all, instead of two shifts and two or three logic
 * operations per pair. Same size, same word positions: only the bits inside a word move.
 *
 * Pair i of a natural word is elements (i, i + 4) as the bf16x2 pattern of their e2m1
 * values times 2^-126 - sign to bits 15 / 31, magnitude (e1 e0 m) to bits 6..8 / 22..24,
 * everything else zero - which the kernel then multiplies by a folded block scale. From a
 * stream word w:
 *     pair 0 = w                     & 0x81C081C0
 *     pair 1 = (w << 6)              & 0x81C081C0
 *     pair 2 = rotl(w, 12)           & 0x81C081C0
 *     pair 3 = ((w << 2) ^ (w >> 6)) & 0x81C081C0
 * Each output bit is the XOR of at most two word bits, so the decode is linear over GF(2),
 * and these four shifts make the 32 x 32 system invertible. No three shifts or rotations do:
 * each copy of w brings at most 8 of its bits to the mask's positions, so w and three copies
 * would have to tile the 32 bits with rotations of the mask, and none do (searched; the
 * first version of this layout needed five shifts). The encoder is its inverse. Not part of
 * the API; fp4d_stream_decode_pair is the host twin of the kernel's decode (kernels.cu),
 * checked against the natural decode in the tests.
 */
#ifndef FP4D_STREAM_CODES_H
#define FP4D_STREAM_CODES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4D_STREAM_PAIR_MASK 0x81C081C0u

/* masks[q]: the stream-word bits that natural bit q flips (encode = XOR of the masks of the
 * set bits). Computed once by inverting the decode; thread-safe after the first call. */
const uint32_t *fp4d_stream_encode_masks(void);

/* A natural code word in the stream layout. */
uint32_t fp4d_stream_encode_word(uint32_t natural);

/* Pair i (0..3) of a stream word, as the kernel decodes it. */
uint32_t fp4d_stream_decode_pair(uint32_t stream_word, int i);

/* Pair i (0..3) of a natural word: the same bits taken directly from elements i and i + 4. */
uint32_t fp4d_natural_pair(uint32_t natural, int i);

#ifdef __cplusplus
}
#endif
#endif
