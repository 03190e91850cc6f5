#include "layout/layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "common/raw_enum.hpp"

namespace ikv {
namespace {

bool valid_hint(const ikv_format &f) { return raw_enum(f) == IKV_FMT_AUTO || enum_below(f, IKV_FMT_COUNT); }

ikv_block_info make_info(uint32_t id, const ikv_block_desc &d) {
    ikv_block_info b;
    std::memset(&b, 0, sizeof b);
    b.id = id;
    std::memcpy(b.name, d.name, std::strlen(d.name));  // length checked: <= IKV_NAME_MAX
    b.kind = d.kind;
    b.start = d.start;
    b.end = d.end;
    b.policy = d.policy;
    b.score = d.score;
    b.precision_hint = d.precision_hint;
    b.turn = d.turn;
    return b;
}

}  // namespace

ikv_status check_block_desc(const ikv_block_desc &d, const char *fn) {
    if (d.name == nullptr) return fail(IKV_E_NULL, "%s: block->name is NULL", fn);
    const std::size_t len = strnlen(d.name, IKV_NAME_MAX + 1);
    if (len == 0) return fail(IKV_E_INVALID, "%s: block->name is empty; names need 1..%d bytes", fn, IKV_NAME_MAX);
    if (len > IKV_NAME_MAX)
        return fail(IKV_E_INVALID, "%s: block->name '%.20s...' is longer than IKV_NAME_MAX (%d bytes)", fn, d.name,
                    IKV_NAME_MAX);
    if (!enum_below(d.kind, IKV_KIND_COUNT))
        return fail(IKV_E_INVALID, "%s: block '%s' has kind %d, expected 0..%d", fn, d.name, raw_enum(d.kind),
                    IKV_KIND_COUNT - 1);
    if (!enum_below(d.policy, IKV_POLICY_COUNT))
        return fail(IKV_E_INVALID, "%s: block '%s' has policy %d, expected 0..%d", fn, d.name, raw_enum(d.policy),
                    IKV_POLICY_COUNT - 1);
    if (!valid_hint(d.precision_hint))
        return fail(IKV_E_INVALID, "%s: block '%s' has precision_hint %d, expected IKV_FMT_AUTO or 0..%d", fn, d.name,
                    raw_enum(d.precision_hint), IKV_FMT_COUNT - 1);
    if (!std::isfinite(d.score) || d.score < 0.0f || d.score > 1.0f)
        return fail(IKV_E_INVALID, "%s: block '%s' has score %.9g, expected a finite value in [0, 1]", fn, d.name,
                    static_cast<double>(d.score));
    if (d.end <= d.start)
        return fail(IKV_E_RANGE, "%s: block '%s' [%u, %u) has end at or before start", fn, d.name, d.start, d.end);
    return IKV_OK;
}

std::size_t layout_lower_index(const ikv_layout &layout, uint32_t token) {
    auto it = std::lower_bound(layout.blocks.begin(), layout.blocks.end(), token,
                               [](const ikv_block_info &b, uint32_t t) { return b.start < t; });
    return static_cast<std::size_t>(it - layout.blocks.begin());
}

std::size_t layout_index_of(const ikv_layout &layout, uint32_t id) {
    auto it = layout.start_of_id.find(id);
    if (it == layout.start_of_id.end()) return SIZE_MAX;
    return layout_lower_index(layout, it->second);
}

const ikv_block_info *layout_find_overlap(const ikv_layout &layout, uint32_t start, uint32_t end, uint32_t skip_id) {
    // Blocks are disjoint and sorted, so only the nearest neighbours that are
    // not skip_id can overlap: the last one starting before `start` and the
    // first one starting at or after it.
    const auto &v = layout.blocks;
    std::size_t i = layout_lower_index(layout, start);
    std::size_t after = i;
    if (after < v.size() && v[after].id == skip_id) ++after;
    if (after < v.size() && v[after].start < end) return &v[after];
    std::size_t before = i;
    if (before > 0 && v[before - 1].id == skip_id) --before;
    if (before > 0 && v[before - 1].end > start) return &v[before - 1];
    return nullptr;
}

namespace {

ikv_status overlap_error(const ikv_block_desc &d, const ikv_block_info &o, const char *fn) {
    return fail(IKV_E_OVERLAP, "%s: block '%s' [%u, %u) overlaps block '%s' (id %u) [%u, %u)", fn, d.name, d.start,
                d.end, o.name, o.id, o.start, o.end);
}

}  // namespace

ikv_status layout_add(ikv_layout &layout, const ikv_block_desc &d, uint32_t *id_out, const char *fn) {
    if (const ikv_block_info *o = layout_find_overlap(layout, d.start, d.end, kGapBlockId))
        return overlap_error(d, *o, fn);
    if (layout.next_id == kGapBlockId)
        return fail(IKV_E_RANGE, "%s: this layout has used all %u block ids", fn, kGapBlockId);
    const uint32_t id = layout.next_id;
    layout.blocks.reserve(layout.blocks.size() + 1);  // may throw: nothing changed yet
    layout.start_of_id.emplace(id, d.start);           // may throw: nothing changed yet
    const std::size_t at = layout_lower_index(layout, d.start);
    layout.blocks.insert(layout.blocks.begin() + static_cast<std::ptrdiff_t>(at), make_info(id, d));  // no realloc
    layout.next_id = id + 1;
    if (id_out != nullptr) *id_out = id;
    return IKV_OK;
}

ikv_status layout_update(ikv_layout &layout, uint32_t id, const ikv_block_desc &d, const char *fn) {
    const std::size_t i = layout_index_of(layout, id);
    if (i == SIZE_MAX) return fail(IKV_E_NOT_FOUND, "%s: no block with id %u", fn, id);
    if (const ikv_block_info *o = layout_find_overlap(layout, d.start, d.end, id)) return overlap_error(d, *o, fn);
    const ikv_block_info info = make_info(id, d);
    auto &v = layout.blocks;
    if (v[i].start == d.start) {
        v[i] = info;
    } else {
        v.reserve(v.size() + 1);  // may throw: nothing changed yet; erase + insert below never reallocate
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
        const std::size_t at = layout_lower_index(layout, d.start);
        v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), info);
        layout.start_of_id[id] = d.start;  // existing key: no allocation
    }
    return IKV_OK;
}

ikv_status layout_remove(ikv_layout &layout, uint32_t id, const char *fn) {
    const std::size_t i = layout_index_of(layout, id);
    if (i == SIZE_MAX) return fail(IKV_E_NOT_FOUND, "%s: no block with id %u", fn, id);
    layout.blocks.erase(layout.blocks.begin() + static_cast<std::ptrdiff_t>(i));
    layout.start_of_id.erase(id);
    return IKV_OK;
}

}  // namespace ikv
