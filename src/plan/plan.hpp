// The plan handle: the router's output and decode's input. Immutable once
// built; every accessor is O(1) (they hand out pointers into these arrays).
// Other areas (pool, decode) read plans only through the public accessors
// ikv_plan_pages / ikv_plan_page_format / ikv_plan_get_summary.
#pragma once

#include <cstdint>

#include "intentkv.h"
#include "common/host_memory.hpp"
#include "common/unique_id.hpp"

struct ikv_plan {
    ikv_plan_summary summary{};
    ikv::host_vector<ikv_plan_page> pages;            // sorted by (page, token_begin), disjoint
    ikv::host_vector<uint32_t> skipped;               // pages with no selected token, ascending
    ikv::host_vector<uint32_t> prefetch;              // most likely first
    ikv::host_vector<ikv_block_decision> decisions;   // layout blocks and gaps in start order
    ikv::host_vector<uint8_t> page_formats;           // ikv_format of every page, pages_total entries
    // Never reused, unlike the address: decoders key the page lists they keep
    // between calls on it (decode/step_key.hpp).
    uint64_t uid = ikv::next_unique_id();
};

namespace ikv {

// A run of selected tokens; all its tokens are mandatory or none is.
struct TokenRun {
    uint32_t begin, end;
    bool mandatory;
};

// Fill plan.pages, plan.skipped and the token/page counts of plan.summary from
// runs sorted by begin and pairwise disjoint (touching is fine). Needs
// summary.seq_len, summary.page_size and page_formats set. Touching runs in
// one page become one entry (IKV_PAGE_MANDATORY when any of its tokens is
// mandatory); IKV_PAGE_PARTIAL when the entry is not the whole page
// [page*P, (page+1)*P). Throws std::bad_alloc.
void plan_fill_pages(ikv_plan &plan, const host_vector<TokenRun> &runs);

// A plan's identity for decoders; 0 for no plan (dense).
inline uint64_t plan_uid(const ikv_plan *plan) { return plan != nullptr ? plan->uid : 0; }

inline uint32_t pages_for(uint32_t seq_len, uint32_t page_size) {
    return static_cast<uint32_t>((uint64_t(seq_len) + page_size - 1) / page_size);
}

}  // namespace ikv
