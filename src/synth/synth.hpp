// Synthetic agentic sessions: a deterministic layout generator for demos,
// tests and benchmarks.
#pragma once

#include "intentkv.h"

namespace ikv {

// Build the layout for a validated config into an empty layout. Throws std::bad_alloc.
void synth_fill(const ikv_synth_config &config, ikv_layout &layout);

// Blocks synth_fill makes for a config: system, memory, documents, tool
// outputs, scratchpad and turns.
inline uint64_t synth_block_count(const ikv_synth_config &c) {
    return 3ull + c.n_documents + c.n_tool_outputs + c.n_turns;
}

}  // namespace ikv
