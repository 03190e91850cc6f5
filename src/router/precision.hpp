// The precision table (IntentQuantizer): which storage format a block's pages
// get from its policy, score, the memory pressure and its precision hint.
#pragma once

#include "intentkv.h"

namespace ikv {

// Why a block's tokens are read decides which row of the table applies.
enum class FormatRole {
    Always,     // policy ALWAYS: always_format, never demoted
    Global,     // policy GLOBAL: global_format
    Recent,     // policy RECENT, or an ATTEND/gap block read only through the recent window: recent_format
    Attend,     // ATTEND by score: attend_high / attend_mid / attend_low
    Skip,       // policy SKIP (pages never read; the format only matters for storage): attend_low
};

// Demotion steps for a pressure: 0, 1 (>= demote1_pressure) or 2 (>= demote2_pressure).
int pressure_steps(const ikv_precision_policy &p, float pressure);

// Move f down `steps` rungs of F16/BF16 -> FP8 -> INT8 -> INT4 (INT4 stays INT4).
ikv_format demote(ikv_format f, int steps);

// The format of a block: the hint when it is not AUTO, else the table row for
// its role (by score for Attend) demoted by the pressure (except Always).
ikv_format block_format(const ikv_precision_policy &p, float pressure, FormatRole role, float score,
                        ikv_format hint);

// F16 > BF16 > FP8 > INT8 > INT4 is the enum order: the higher precision of two is the smaller value.
inline ikv_format higher_precision(ikv_format a, ikv_format b) { return a < b ? a : b; }
inline ikv_format lower_precision(ikv_format a, ikv_format b) { return a > b ? a : b; }

}  // namespace ikv
