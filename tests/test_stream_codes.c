/*
 * The stream layout of FP4 weight codes (src/formats/stream_codes.h): every pair the
 * weight-streaming kernel decodes from a re-encoded word must be the bf16x2 pattern of the
 * original elements' e2m1 values times 2^-126.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "fp4doctor/formats.h"
#include "formats/stream_codes.h"

/* The value of one bf16 bit pattern (low 16 bits). */
static double bf16_value(uint32_t bits)
{
    const uint32_t f = (bits & 0xFFFFu) << 16;
    float x;
    memcpy(&x, &f, sizeof x);
    return (double)x;
}

/* The natural pairs are the e2m1 values: all 256 (lo, hi) element pairs at every position. */
static void test_natural_pairs_are_e2m1_values(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        for (uint32_t lo = 0; lo < 16; lo++)
            for (uint32_t hi = 0; hi < 16; hi++) {
                const uint32_t word = (lo << (4 * i)) | (hi << (4 * (i + 4))); /* other elements zero */
                const uint32_t pair = fp4d_natural_pair(word, i);
                assert_true(ldexp(bf16_value(pair), 126) == (double)fp4d_e2m1_to_f32((uint8_t)lo));
                assert_true(ldexp(bf16_value(pair >> 16), 126) == (double)fp4d_e2m1_to_f32((uint8_t)hi));
                assert_int_equal(signbit(bf16_value(pair)) != 0, (lo & 8u) != 0);
                assert_int_equal(signbit(bf16_value(pair >> 16)) != 0, (hi & 8u) != 0);
                /* and the other elements do not leak in */
                const uint32_t noisy = word | (0xFFFFFFFFu & ~((0xFu << (4 * i)) | (0xFu << (4 * (i + 4)))));
                assert_int_equal(fp4d_natural_pair(noisy, i), pair);
            }
}

/* Encode then decode gives the natural pairs. Both sides are linear over GF(2) in the word,
 * so agreement on the 32 unit words proves it for all 2^32; random words check the encoder's
 * XOR accumulation as well. */
static void test_stream_round_trip(void **state)
{
    (void)state;
    for (int q = 0; q < 32; q++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(fp4d_stream_decode_pair(fp4d_stream_encode_word(1u << q), i), fp4d_natural_pair(1u << q, i));
    uint32_t x = 0x12345678u;
    for (int n = 0; n < 1 << 20; n++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        const uint32_t s = fp4d_stream_encode_word(x);
        for (int i = 0; i < 4; i++) assert_int_equal(fp4d_stream_decode_pair(s, i), fp4d_natural_pair(x, i));
    }
    assert_int_equal(fp4d_stream_encode_word(0), 0);
}

/* A bijection: the 32 masks are linearly independent (distinct words stay distinct). */
static void test_stream_encode_is_invertible(void **state)
{
    (void)state;
    uint32_t basis[32] = {0};
    const uint32_t *m = fp4d_stream_encode_masks();
    for (int q = 0; q < 32; q++) {
        uint32_t v = m[q];
        for (int b = 31; b >= 0 && v; b--) {
            if (!((v >> b) & 1u)) continue;
            if (!basis[b]) {
                basis[b] = v;
                break;
            }
            v ^= basis[b];
        }
        assert_int_not_equal(v, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_natural_pairs_are_e2m1_values),
        cmocka_unit_test(test_stream_round_trip),
        cmocka_unit_test(test_stream_encode_is_invertible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
