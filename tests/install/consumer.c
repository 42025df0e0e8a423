/*
 * A program outside the fp4doctor tree, built against an installed copy through pkg-config
 * (install_consumer.sh): the public headers must compile on their own, and the static library
 * must link with what `pkg-config --static --libs fp4doctor` names. It quantizes values that
 * MXFP4 represents exactly (e2m1 codes times a power of two) and expects them back bit for bit,
 * and opens the backend registry, which links every backend (the CUDA ones where built).
 */
#include <stdio.h>
#include <string.h>

#include <fp4doctor/backend.h>
#include <fp4doctor/fp4doctor.h>
#include <fp4doctor/formats.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer EXPECTED_VERSION\n");
        return 2;
    }
    if (strcmp(fp4d_version_string(), argv[1]) != 0) {
        fprintf(stderr, "version %s, expected %s\n", fp4d_version_string(), argv[1]);
        return 1;
    }
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float src[64], back[64];
    for (int i = 0; i < 64; i++) src[i] = (i & 8 ? -4.0f : 4.0f) * e2m1[i & 7];
    uint8_t codes[32], scales[64];
    const fp4d_quantize_params qp = {FP4D_DTYPE_MXFP4, FP4D_CONV_OCP, FP4D_LAYOUT_LINEAR, 0.0f};
    fp4d_quantize_result qr;
    if (fp4d_quantize(&qp, FP4D_DTYPE_F32, src, 1, 64, codes, scales, &qr) != FP4D_STATUS_OK ||
        fp4d_dequantize(FP4D_DTYPE_MXFP4, FP4D_LAYOUT_LINEAR, codes, scales, 1.0f, 1, 64, back) != FP4D_STATUS_OK) {
        fprintf(stderr, "quantize/dequantize failed: %s\n", fp4d_last_error());
        return 1;
    }
    if (memcmp(src, back, sizeof src) != 0) {
        fprintf(stderr, "the round trip changed exactly representable values\n");
        return 1;
    }
    if (fp4d_registry_init(NULL) != FP4D_STATUS_OK || !fp4d_registry_find("ref") || !fp4d_registry_find("cpu")) {
        fprintf(stderr, "the backend registry has no ref and cpu: %s\n", fp4d_last_error());
        return 1;
    }
    printf("fp4doctor %s: round trip exact, %zu backends\n", fp4d_version_string(), fp4d_registry_count());
    return 0;
}
