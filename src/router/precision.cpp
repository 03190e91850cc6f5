#include "router/precision.hpp"

namespace ikv {

int pressure_steps(const ikv_precision_policy &p, float pressure) {
    if (pressure >= p.demote2_pressure) return 2;
    if (pressure >= p.demote1_pressure) return 1;
    return 0;
}

ikv_format demote(ikv_format f, int steps) {
    // Rungs: 0 = F16 or BF16 (both 16-bit), 1 = FP8, 2 = INT8, 3 = INT4.
    static const ikv_format kRungFormat[] = {IKV_FMT_F16, IKV_FMT_FP8_E4M3, IKV_FMT_INT8, IKV_FMT_INT4};
    const int rung = f == IKV_FMT_F16 || f == IKV_FMT_BF16 ? 0 : static_cast<int>(f) - 1;
    if (steps <= 0) return f;
    const int to = rung + steps > 3 ? 3 : rung + steps;
    return kRungFormat[to];
}

ikv_format block_format(const ikv_precision_policy &p, float pressure, FormatRole role, float score,
                        ikv_format hint) {
    if (hint != IKV_FMT_AUTO) return hint;
    ikv_format base = p.attend_low;
    switch (role) {
        case FormatRole::Always: return p.always_format;
        case FormatRole::Global: base = p.global_format; break;
        case FormatRole::Recent: base = p.recent_format; break;
        case FormatRole::Attend:
            base = score >= p.attend_high_score ? p.attend_high
                 : score >= p.attend_mid_score  ? p.attend_mid
                                                : p.attend_low;
            break;
        case FormatRole::Skip: base = p.attend_low; break;
    }
    return demote(base, pressure_steps(p, pressure));
}

}  // namespace ikv
