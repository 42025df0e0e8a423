/* Results and cases as JSON: the child protocol and the --json report share these. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "doctor_internal.h"

static const char *dtype_name(fp4d_dtype t)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    return tr ? tr->name : "?";
}

static const char *op_name(fp4d_case_op op)
{
    return op == FP4D_CASE_GROUPED ? "grouped_gemm" : op == FP4D_CASE_QUANTIZE ? "quantize"
           : op == FP4D_CASE_STRESS ? "stress" : "gemm";
}

/* JSON has no Inf/NaN: such numbers are written as null. */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *fp4d_result_to_json(const fp4d_case_result *r)
{
    json_t *j = json_object();
    json_object_set_new(j, "verdict", json_string(fp4d_verdict_name(r->verdict)));
    json_object_set_new(j, "cause", r->cause == FP4D_CAUSE_NONE ? json_null()
                                                                : json_string(fp4d_cause_name(r->cause)));
    json_object_set_new(j, "detail", json_string(r->detail));
    json_object_set_new(j, "max_err_ratio", num(r->max_err_ratio));
    json_object_set_new(j, "max_abs_err", num(r->max_abs_err));
    json_object_set_new(j, "time_ms", num(r->time_ms));
    json_object_set_new(j, "gflops", num(r->gflops));
    json_object_set_new(j, "elements_checked", json_integer(r->elements_checked));
    json_object_set_new(j, "bad_elements", json_integer(r->bad_elements));
    json_object_set_new(j, "off_by_one_codes", json_integer(r->off_by_one_codes));
    json_object_set_new(j, "signal", r->signal ? json_integer(r->signal) : json_null());
    json_object_set_new(j, "ran", json_boolean(r->ran));
    return j;
}

void fp4d_result_from_json(const json_t *j, fp4d_case_result *r)
{
    memset(r, 0, sizeof *r);
    r->verdict = FP4D_VERDICT_ERROR;
    if (!fp4d_verdict_from_name(json_string_value(json_object_get(j, "verdict")), &r->verdict))
        r->verdict = FP4D_VERDICT_ERROR;
    const char *cause = json_string_value(json_object_get(j, "cause"));
    if (!cause || !fp4d_cause_from_name(cause, &r->cause)) r->cause = FP4D_CAUSE_NONE;
    const char *detail = json_string_value(json_object_get(j, "detail"));
    snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
    r->max_err_ratio = json_number_value(json_object_get(j, "max_err_ratio"));
    r->max_abs_err = json_number_value(json_object_get(j, "max_abs_err"));
    r->time_ms = json_number_value(json_object_get(j, "time_ms"));
    r->gflops = json_number_value(json_object_get(j, "gflops"));
    r->elements_checked = json_integer_value(json_object_get(j, "elements_checked"));
    r->bad_elements = json_integer_value(json_object_get(j, "bad_elements"));
    r->off_by_one_codes = json_integer_value(json_object_get(j, "off_by_one_codes"));
    r->signal = (int32_t)json_integer_value(json_object_get(j, "signal"));
    r->ran = json_is_true(json_object_get(j, "ran"));
}

json_t *fp4d_case_to_json(const fp4d_case *c)
{
    json_t *j = json_object();
    json_object_set_new(j, "index", json_integer(c->index));
    json_object_set_new(j, "name", json_string(c->name));
    json_object_set_new(j, "group", json_string(c->group));
    json_object_set_new(j, "op", json_string(op_name(c->op)));
    json_object_set_new(j, "m", json_integer(c->m));
    json_object_set_new(j, "n", json_integer(c->n));
    json_object_set_new(j, "k", json_integer(c->k));
    if (c->op == FP4D_CASE_QUANTIZE) {
        json_object_set_new(j, "source_type", json_string(dtype_name(c->a_type)));
        json_object_set_new(j, "format", json_string(dtype_name(c->b_type)));
        json_object_set_new(j, "convention", json_string(fp4d_convention_name(c->convention)));
        json_object_set_new(j, "scale_layout", json_string(fp4d_scale_layout_name(c->a_layout)));
    } else {
        json_object_set_new(j, "a_type", json_string(dtype_name(c->a_type)));
        json_object_set_new(j, "b_type", json_string(dtype_name(c->b_type)));
        json_object_set_new(j, "out_type", json_string(dtype_name(c->out_type)));
        json_object_set_new(j, "scale_layout", json_string(fp4d_scale_layout_name(c->b_layout)));
        json_object_set_new(j, "num_experts", json_integer(c->num_experts));
    }
    if (c->op == FP4D_CASE_STRESS) {
        json_object_set_new(j, "threads", json_integer(c->threads));
        json_object_set_new(j, "rounds", json_integer(c->rounds));
    }
    json_object_set_new(j, "input", json_string(fp4d_input_kind_name(c->input)));
    return j;
}
