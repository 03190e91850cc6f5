#include "common/error.hpp"
#include "common/raw_enum.hpp"
#include "router/router.hpp"

namespace ikv {
namespace {

bool valid_format(const ikv_format &f) { return enum_below(f, IKV_FMT_COUNT); }

}  // namespace

ikv_status check_unit_interval(float v, const char *field, const char *fn) {
    if (!(v >= 0.0f && v <= 1.0f))  // NaN fails both comparisons
        return fail(IKV_E_INVALID, "%s: %s is %.9g, expected a finite value in [0, 1]", fn, field,
                    static_cast<double>(v));
    return IKV_OK;
}

ikv_status check_router_config(const ikv_router_config &c, const char *fn) {
    if (c.page_size < 8 || c.page_size > 128 || (c.page_size & (c.page_size - 1)) != 0)
        return fail(IKV_E_INVALID, "%s: config->page_size is %u, expected a power of two in [8, 128]", fn,
                    c.page_size);
    if (!enum_below(c.over_budget, IKV_OVER_BUDGET_KEEP + 1))
        return fail(IKV_E_INVALID, "%s: config->over_budget is %d, expected IKV_OVER_BUDGET_FAIL or _KEEP", fn,
                    raw_enum(c.over_budget));
    const ikv_precision_policy &p = c.precision;
    const struct {
        float value;
        const char *field;
    } unit_fields[] = {
        {c.memory_pressure, "config->memory_pressure"},
        {c.attend_threshold, "config->attend_threshold"},
        {c.unlabeled_score, "config->unlabeled_score"},
        {p.attend_high_score, "config->precision.attend_high_score"},
        {p.attend_mid_score, "config->precision.attend_mid_score"},
        {p.demote1_pressure, "config->precision.demote1_pressure"},
        {p.demote2_pressure, "config->precision.demote2_pressure"},
    };
    for (const auto &f : unit_fields)
        if (ikv_status s = check_unit_interval(f.value, f.field, fn)) return s;
    const struct {
        const ikv_format &value;
        const char *field;
    } format_fields[] = {
        {p.always_format, "config->precision.always_format"}, {p.global_format, "config->precision.global_format"},
        {p.recent_format, "config->precision.recent_format"}, {p.attend_high, "config->precision.attend_high"},
        {p.attend_mid, "config->precision.attend_mid"},       {p.attend_low, "config->precision.attend_low"},
    };
    for (const auto &f : format_fields)
        if (!valid_format(f.value))
            return fail(IKV_E_INVALID, "%s: %s is %d, expected a storage format 0..%d (not AUTO)", fn, f.field,
                        raw_enum(f.value), IKV_FMT_COUNT - 1);
    if (p.attend_mid_score > p.attend_high_score)
        return fail(IKV_E_INVALID, "%s: config->precision.attend_mid_score %.9g exceeds attend_high_score %.9g", fn,
                    static_cast<double>(p.attend_mid_score), static_cast<double>(p.attend_high_score));
    if (p.demote1_pressure > p.demote2_pressure)
        return fail(IKV_E_INVALID, "%s: config->precision.demote1_pressure %.9g exceeds demote2_pressure %.9g", fn,
                    static_cast<double>(p.demote1_pressure), static_cast<double>(p.demote2_pressure));
    return IKV_OK;
}

}  // namespace ikv
