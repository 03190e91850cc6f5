// Routing: layout + config + seq_len -> plan. See docs/ROUTING.md for the rules.
#pragma once

#include "intentkv.h"

namespace ikv {

// Route with a snapshot of the router's config (pressure included). Sets the
// error sentence on failure (naming `fn`); throws std::bad_alloc.
ikv_status route_layout(const ikv_router_config &config, const ikv_layout &layout, uint32_t seq_len,
                        ikv_plan **plan_out, const char *fn);

}  // namespace ikv
