// Plans not made by the router, and the cost model.
#pragma once

#include <cstddef>

#include "intentkv.h"

namespace ikv {

// A plan reading exactly `ranges` (validated here; sentence names `fn`). All
// pages take `format`; no token is mandatory; no prefetch hints; no decisions.
// Throws std::bad_alloc.
ikv_status plan_from_ranges(const ikv_token_range *ranges, std::size_t n_ranges, uint32_t seq_len,
                            uint32_t page_size, ikv_format format, ikv_plan **plan_out, const char *fn);

// Bytes and FLOPs of one decode step under a plan (shape already validated).
// The plan's cost for a shape into *out; false (nothing written) when a figure passes 64 bits.
bool plan_cost(const ikv_plan &plan, const ikv_model_shape &shape, ikv_plan_cost *out);

}  // namespace ikv
