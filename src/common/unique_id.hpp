// Process-wide unique, never-reused 64-bit ids. Decoders key the page lists
// they keep between calls on them (decode/step_key.hpp): a sequence's block
// table generation and a plan's identity. A pointer or a sequence id could be
// reused by a new object; these values cannot (2^64 at any rate of change).
#pragma once

#include <atomic>
#include <cstdint>

namespace ikv {

inline uint64_t next_unique_id() {
    static std::atomic<uint64_t> next{1};  // 0 means "none" (a NULL plan)
    return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ikv
