/* Stable names of verdicts, causes, suites and input kinds (DESIGN.md §5). */
#include <string.h>

#include "fp4doctor/doctor.h"

static const char *const verdict_names[FP4D_VERDICT_COUNT] = {
    [FP4D_VERDICT_CRASH] = "CRASH",
    [FP4D_VERDICT_TIMEOUT] = "TIMEOUT",
    [FP4D_VERDICT_OOB_WRITE] = "OOB_WRITE",
    [FP4D_VERDICT_UNWRITTEN] = "UNWRITTEN",
    [FP4D_VERDICT_NAN] = "NAN",
    [FP4D_VERDICT_INF] = "INF",
    [FP4D_VERDICT_ZEROS] = "ZEROS",
    [FP4D_VERDICT_WRONG] = "WRONG",
    [FP4D_VERDICT_ERROR] = "ERROR",
    [FP4D_VERDICT_NONDETERMINISTIC] = "NONDETERMINISTIC",
    [FP4D_VERDICT_INACCURATE] = "INACCURATE",
    [FP4D_VERDICT_PASS] = "PASS",
    [FP4D_VERDICT_UNSUPPORTED] = "UNSUPPORTED",
};

static const char *const cause_names[FP4D_CAUSE_COUNT] = {
    [FP4D_CAUSE_NONE] = "",
    [FP4D_CAUSE_SCALE_LAYOUT_LINEAR] = "scale_layout_linear",
    [FP4D_CAUSE_SCALE_LAYOUT_SWIZZLED] = "scale_layout_swizzled",
    [FP4D_CAUSE_NIBBLE_SWAP] = "nibble_swap",
    [FP4D_CAUSE_GLOBAL_SCALE_INVERTED] = "global_scale_inverted",
    [FP4D_CAUSE_GLOBAL_SCALE_MISSING] = "global_scale_missing",
    [FP4D_CAUSE_SCALE_DECODED_AS_UE8M0] = "scale_decoded_as_ue8m0",
    [FP4D_CAUSE_BLOCK_SIZE_32] = "block_size_32",
    [FP4D_CAUSE_B_TRANSPOSED] = "b_transposed",
    [FP4D_CAUSE_TILE_ROWS_MISSING] = "tile_rows_missing",
    [FP4D_CAUSE_M_DEPENDENT] = "m_dependent",
    [FP4D_CAUSE_LOW_PRECISION_ACCUMULATION] = "low_precision_accumulation",
    [FP4D_CAUSE_UNKNOWN] = "unknown",
    [FP4D_CAUSE_CONCURRENCY] = "concurrency",
};

static const char *const suite_names[FP4D_SUITE_COUNT] = {"quick", "default", "full"};

static const char *const input_names[FP4D_INPUT_COUNT] = {
    [FP4D_INPUT_GRID] = "grid",
    [FP4D_INPUT_GAUSSIAN] = "gaussian",
    [FP4D_INPUT_HEAVY_TAILED] = "heavy",
    [FP4D_INPUT_ZERO_BLOCKS] = "zeroblocks",
    [FP4D_INPUT_ALL_ZERO] = "allzero",
    [FP4D_INPUT_SATURATING] = "saturating",
    [FP4D_INPUT_UNDERFLOW] = "underflow",
    [FP4D_INPUT_NONFINITE] = "nonfinite",
};

const char *fp4d_verdict_name(fp4d_verdict v)
{
    return (unsigned)v < FP4D_VERDICT_COUNT ? verdict_names[v] : "?";
}

bool fp4d_verdict_from_name(const char *name, fp4d_verdict *out)
{
    for (int i = 0; name && i < FP4D_VERDICT_COUNT; i++)
        if (!strcmp(name, verdict_names[i])) {
            *out = (fp4d_verdict)i;
            return true;
        }
    return false;
}

fp4d_verdict fp4d_verdict_worst(fp4d_verdict a, fp4d_verdict b) { return a < b ? a : b; }

bool fp4d_verdict_is_failure(fp4d_verdict v)
{
    return v != FP4D_VERDICT_PASS && v != FP4D_VERDICT_UNSUPPORTED;
}

const char *fp4d_cause_name(fp4d_cause c)
{
    return (unsigned)c < FP4D_CAUSE_COUNT ? cause_names[c] : "unknown";
}

bool fp4d_cause_from_name(const char *name, fp4d_cause *out)
{
    for (int i = 0; name && i < FP4D_CAUSE_COUNT; i++)
        if (!strcmp(name, cause_names[i])) {
            *out = (fp4d_cause)i;
            return true;
        }
    return false;
}

const char *fp4d_suite_name(fp4d_suite s)
{
    return (unsigned)s < FP4D_SUITE_COUNT ? suite_names[s] : "?";
}

bool fp4d_suite_from_name(const char *name, fp4d_suite *out)
{
    for (int i = 0; name && i < FP4D_SUITE_COUNT; i++)
        if (!strcmp(name, suite_names[i])) {
            *out = (fp4d_suite)i;
            return true;
        }
    return false;
}

const char *fp4d_input_kind_name(fp4d_input_kind k)
{
    return (unsigned)k < FP4D_INPUT_COUNT ? input_names[k] : "?";
}
