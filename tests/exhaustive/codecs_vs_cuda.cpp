/*
 * Every scalar encoder of formats.h against CUDA 13's own host-side conversions, over all
 * 2^32 float bit patterns, bit for bit; every decoder over all of its codes.
 *
 * CUDA's header functions are compiled here by the host C++ compiler, so they take their
 * software paths (the ones spec §1.2/§2.2/§3.2 describe; the PTX paths agree with them per
 * spec M2). One pass over the inputs evaluates all encoders, split over the machine's
 * cores (FP4D_EXHAUSTIVE_THREADS overrides the count).
 */
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#include "fp4doctor/formats.h"

namespace {

enum Codec {
    E2M1_RN, E2M1_RZ, E4M3_SAT, E4M3_NOSAT, UE4M3,
    E8M0_RZ_SAT, E8M0_RZ_NOSAT, E8M0_RP_SAT, E8M0_RP_NOSAT, BF16_RN, F16_RN, CODEC_COUNT
};

const char *const codec_names[CODEC_COUNT] = {
    "e2m1 RN (cudaRoundNearest)", "e2m1 RZ (cudaRoundZero)", "e4m3 SATFINITE", "e4m3 NOSAT",
    "ue4m3 (e4m3 SATFINITE of |x|)", "ue8m0 RZ SATFINITE", "ue8m0 RZ NOSAT",
    "ue8m0 RP SATFINITE", "ue8m0 RP NOSAT", "bf16 RN (__float2bfloat16_rn)",
    "f16 RN (__float2half_rn)",
};

struct Tally {
    uint64_t mismatches[CODEC_COUNT] = {};
    uint32_t first_input[CODEC_COUNT] = {};
    uint32_t ours[CODEC_COUNT] = {};
    uint32_t cudas[CODEC_COUNT] = {};
};

inline float float_of(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

inline uint16_t bits_of(__nv_bfloat16 h)
{
    __nv_bfloat16_raw r = h;
    return r.x;
}

inline uint16_t bits_of(__half h)
{
    __half_raw r = h;
    return r.x;
}

inline void record(Tally &t, Codec c, uint32_t input, uint32_t ours, uint32_t cuda)
{
    if (ours == cuda) return;
    if (t.mismatches[c]++ == 0) {
        t.first_input[c] = input;
        t.ours[c] = ours;
        t.cudas[c] = cuda;
    }
}

void sweep(uint64_t begin, uint64_t end, Tally *t)
{
    for (uint64_t i = begin; i < end; i++) {
        const uint32_t b = (uint32_t)i;
        const float x = float_of(b);
        const float ax = float_of(b & 0x7FFFFFFFu);
        record(*t, E2M1_RN, b, fp4d_e2m1_from_f32(x), __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest));
        record(*t, E2M1_RZ, b, fp4d_e2m1_from_f32_rz(x), __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundZero));
        record(*t, E4M3_SAT, b, fp4d_e4m3_from_f32(x, FP4D_SATFINITE), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
        record(*t, E4M3_NOSAT, b, fp4d_e4m3_from_f32(x, FP4D_NOSAT), __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3));
        record(*t, UE4M3, b, fp4d_ue4m3_from_f32(x), __nv_cvt_float_to_fp8(ax, __NV_SATFINITE, __NV_E4M3));
        record(*t, E8M0_RZ_SAT, b, fp4d_ue8m0_from_f32(x, FP4D_ROUND_TOWARD_ZERO, FP4D_SATFINITE),
               __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero));
        record(*t, E8M0_RZ_NOSAT, b, fp4d_ue8m0_from_f32(x, FP4D_ROUND_TOWARD_ZERO, FP4D_NOSAT),
               __nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundZero));
        record(*t, E8M0_RP_SAT, b, fp4d_ue8m0_from_f32(x, FP4D_ROUND_UP, FP4D_SATFINITE),
               __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf));
        record(*t, E8M0_RP_NOSAT, b, fp4d_ue8m0_from_f32(x, FP4D_ROUND_UP, FP4D_NOSAT),
               __nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundPosInf));
        record(*t, BF16_RN, b, fp4d_bf16_from_f32(x), bits_of(__float2bfloat16_rn(x)));
        record(*t, F16_RN, b, fp4d_f16_from_f32(x), bits_of(__float2half_rn(x)));
    }
}

unsigned thread_count()
{
    if (const char *env = std::getenv("FP4D_EXHAUSTIVE_THREADS")) {
        int n = std::atoi(env);
        if (n > 0) return (unsigned)n;
    }
    unsigned n = std::thread::hardware_concurrency();
    return n ? n : 2;
}

/* All 2^32 inputs in chunks handed out dynamically, so a busy core does not hold the
 * others back. */
void test_all_encoders_all_floats(void **state)
{
    (void)state;
    const uint64_t total = 1ull << 32, chunk = 1ull << 22;
    std::atomic<uint64_t> next{0};
    const unsigned n = thread_count();
    std::vector<Tally> tallies(n);
    std::vector<std::thread> threads;
    for (unsigned k = 0; k < n; k++) {
        threads.emplace_back([&, k] {
            for (;;) {
                uint64_t begin = next.fetch_add(chunk);
                if (begin >= total) break;
                sweep(begin, begin + chunk, &tallies[k]);
            }
        });
    }
    for (auto &th : threads) th.join();

    uint64_t bad = 0;
    for (int c = 0; c < CODEC_COUNT; c++) {
        uint64_t m = 0;
        const Tally *first = nullptr;
        for (const Tally &t : tallies) {
            if (t.mismatches[c] && (!first || t.first_input[c] < first->first_input[c])) first = &t;
            m += t.mismatches[c];
        }
        std::printf("%-32s %llu mismatches over 2^32 inputs\n", codec_names[c], (unsigned long long)m);
        if (first) {
            std::printf("  e.g. input 0x%08X: ours 0x%X, CUDA 0x%X\n", first->first_input[c],
                        first->ours[c], first->cudas[c]);
        }
        bad += m;
    }
    assert_int_equal(bad, 0);
}

inline bool half_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu); }

void test_all_decoders_all_codes(void **state)
{
    (void)state;
    for (unsigned c = 0; c < 16; c++) { /* fp4 -> half */
        __half_raw cuda = __nv_cvt_fp4_to_halfraw((__nv_fp4_storage_t)c, __NV_E2M1);
        assert_int_equal(fp4d_f16_from_f32(fp4d_e2m1_to_f32((uint8_t)c)), cuda.x);
    }
    for (unsigned b = 0; b < 256; b++) { /* e4m3 -> half: exact widening, NaN stays NaN */
        __half_raw cuda = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
        const float ours = fp4d_e4m3_to_f32((uint8_t)b);
        if (half_is_nan(cuda.x)) {
            assert_true(ours != ours);
            assert_true(b == 0x7F || b == 0xFF);
        } else {
            assert_int_equal(fp4d_f16_from_f32(ours), cuda.x);
            /* and the value survives the round trip through half exactly */
            assert_true(fp4d_f16_to_f32(cuda.x) == ours || (ours == 0.0f && fp4d_f16_to_f32(cuda.x) == 0.0f));
        }
        /* ue4m3: same as e4m3 for bytes without the sign bit, NaN otherwise */
        const float u = fp4d_ue4m3_to_f32((uint8_t)b);
        if (b & 0x80) assert_true(u != u);
        else if (ours == ours) assert_true(u == ours);
    }
    for (unsigned b = 0; b < 256; b++) { /* e8m0 -> bf16 */
        __nv_bfloat16_raw cuda = __nv_cvt_e8m0_to_bf16raw((__nv_fp8_storage_t)b);
        assert_int_equal(fp4d_bf16_from_f32(fp4d_ue8m0_to_f32((uint8_t)b)), cuda.x);
    }
    for (unsigned h = 0; h < 65536; h++) { /* widening bf16/f16 -> f32, bit exact */
        __nv_bfloat16_raw braw;
        braw.x = (unsigned short)h;
        const float cb = __bfloat162float(__nv_bfloat16(braw));
        const float ob = fp4d_bf16_to_f32((uint16_t)h);
        __half_raw hraw;
        hraw.x = (unsigned short)h;
        const float ch = __half2float(__half(hraw));
        const float oh = fp4d_f16_to_f32((uint16_t)h);
        uint32_t a, bb;
        std::memcpy(&a, &cb, 4);
        std::memcpy(&bb, &ob, 4);
        assert_int_equal(a, bb);
        if (ch == ch) {
            std::memcpy(&a, &ch, 4);
            std::memcpy(&bb, &oh, 4);
            assert_int_equal(a, bb);
        } else {
            assert_true(oh != oh);
        }
    }
}

} // namespace

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_decoders_all_codes),
        cmocka_unit_test(test_all_encoders_all_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
