// The layout handle: semantic blocks of one context, kept sorted by start so
// that overlap checks, token lookups and routing walk them in O(log n) / O(n).
// Ids are handed out in increasing order and never reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "intentkv.h"
#include "common/host_memory.hpp"

struct ikv_layout {
    using IdMap = std::unordered_map<uint32_t, uint32_t, std::hash<uint32_t>, std::equal_to<uint32_t>,
                                     ikv::host_allocator<std::pair<const uint32_t, uint32_t>>>;

    ikv::host_vector<ikv_block_info> blocks;  // ascending start, pairwise disjoint
    IdMap start_of_id;                        // id -> start (starts are unique: blocks are non-empty and disjoint)
    uint32_t next_id = 0;
};

namespace ikv {

// Id value reserved for unlabeled gaps in plan decisions.
constexpr uint32_t kGapBlockId = UINT32_MAX;

// Check a caller's description (name, enums, score, range) under add's rules.
// `fn` names the public call in the error sentence. Does not check overlap.
ikv_status check_block_desc(const ikv_block_desc &desc, const char *fn);

// Index of the first block whose start is >= token (blocks.size() if none).
std::size_t layout_lower_index(const ikv_layout &layout, uint32_t token);

// Index of the block with this id, or SIZE_MAX.
std::size_t layout_index_of(const ikv_layout &layout, uint32_t id);

// The block (other than skip_id) that [start, end) would overlap, or nullptr.
const ikv_block_info *layout_find_overlap(const ikv_layout &layout, uint32_t start, uint32_t end,
                                          uint32_t skip_id);

// Mutations. The description must have passed check_block_desc. Each either
// succeeds or leaves the layout unchanged (and throws std::bad_alloc only
// before changing anything).
ikv_status layout_add(ikv_layout &layout, const ikv_block_desc &desc, uint32_t *id_out, const char *fn);
ikv_status layout_update(ikv_layout &layout, uint32_t id, const ikv_block_desc &desc, const char *fn);
ikv_status layout_remove(ikv_layout &layout, uint32_t id, const char *fn);

}  // namespace ikv
