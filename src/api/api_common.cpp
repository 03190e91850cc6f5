// extern "C" boundary: version, status and enum names, errors, logging and
// runtime information.
#include <climits>
#include <cstdio>
#include <cstring>

#include "common/error.hpp"
#include "cpu/dispatch.hpp"
#include "cuda/device_info.hpp"

namespace {

// Name tables indexed by enum value; a value outside the table gets the fallback.
template <std::size_t N>
const char *name_of(const char *const (&table)[N], int value, const char *fallback) {
    return value >= 0 && static_cast<std::size_t>(value) < N ? table[value] : fallback;
}

const char *const kStatusNames[] = {
    "IKV_OK",         "IKV_E_INVALID",   "IKV_E_NULL",       "IKV_E_RANGE",   "IKV_E_NOMEM",
    "IKV_E_BUDGET",   "IKV_E_OVERLAP",   "IKV_E_UNSUPPORTED", "IKV_E_NO_DEVICE", "IKV_E_DEVICE",
    "IKV_E_SHARED",   "IKV_E_EVICTED",   "IKV_E_NOT_FOUND",  "IKV_E_STATE",   "IKV_E_INTERNAL"};
const char *const kFormatNames[] = {"f16", "bf16", "fp8_e4m3", "int8", "int4"};
const char *const kKindNames[] = {"system_prompt", "memory_summary", "retrieved_doc", "tool_output",
                                  "scratchpad",    "conversation",   "reasoning",     "other"};
const char *const kPolicyNames[] = {"ALWAYS", "ATTEND", "SKIP", "RECENT", "GLOBAL"};
const char *const kReasonNames[] = {"always",          "global",          "recent_window",
                                    "score",           "policy_skip",     "below_threshold",
                                    "budget_exhausted", "outside_window", "over_budget_kept"};

static_assert(sizeof kFormatNames / sizeof *kFormatNames == IKV_FMT_COUNT, "format names");
static_assert(sizeof kKindNames / sizeof *kKindNames == IKV_KIND_COUNT, "kind names");
static_assert(sizeof kPolicyNames / sizeof *kPolicyNames == IKV_POLICY_COUNT, "policy names");
static_assert(sizeof kReasonNames / sizeof *kReasonNames == IKV_REASON_COUNT, "reason names");

}  // namespace

extern "C" {

IKV_API unsigned ikv_version(void) { return IKV_VERSION_NUMBER; }

IKV_API const char *ikv_version_string(void) { return IKV_VERSION_STRING; }

IKV_API const char *ikv_status_name(ikv_status status) {
    // Codes are 0 and negative; a positive one (or INT_MIN, whose negation overflows int) is unknown.
    const int code = static_cast<int>(status);
    return code > 0 || code == INT_MIN ? "IKV_UNKNOWN_STATUS" : name_of(kStatusNames, -code, "IKV_UNKNOWN_STATUS");
}

IKV_API const char *ikv_format_name(ikv_format format) {
    if (format == IKV_FMT_AUTO) return "auto";
    return name_of(kFormatNames, static_cast<int>(format), "?");
}

IKV_API const char *ikv_block_kind_name(ikv_block_kind kind) { return name_of(kKindNames, kind, "?"); }
IKV_API const char *ikv_policy_name(ikv_policy policy) { return name_of(kPolicyNames, policy, "?"); }
IKV_API const char *ikv_reason_name(ikv_reason reason) { return name_of(kReasonNames, reason, "?"); }

IKV_API const char *ikv_last_error(void) { return ikv::last_error(); }

IKV_API void ikv_set_log_callback(ikv_log_fn fn, void *user, ikv_log_level min_level) {
    ikv::set_log_sink(fn, user, min_level);
}

IKV_API ikv_status ikv_runtime_info_get(ikv_runtime_info *info) {
    IKV_CHECK_NULL(info, "ikv_runtime_info_get");
    IKV_CHECK_STRUCT(info, sizeof(ikv_runtime_info), "ikv_runtime_info_get");
    std::memset(info, 0, sizeof *info);  // struct_size >= sizeof: all of it is written
    info->struct_size = sizeof *info;
    info->version = ikv_version();
    ikv::cuda_fill_runtime_info(info);
    std::snprintf(info->cpu_isa, sizeof info->cpu_isa, "%s", ikv::isa_name(ikv::active_isa()));
    ikv::isa_available(info->cpu_isa_available, sizeof info->cpu_isa_available);
    return IKV_OK;
}

}  // extern "C"
