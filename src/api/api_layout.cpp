// extern "C" boundary of layouts: argument checks and error sentences; the
// block bookkeeping lives in src/layout/.
#include <cstring>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/guard.hpp"
#include "layout/layout.hpp"

namespace {

// The caller's description with the fields an older header lacks defaulted.
ikv_status read_desc(const ikv_block_desc *block, const char *fn, ikv_block_desc *out) {
    if (block == nullptr) return ikv::fail(IKV_E_NULL, "%s: block is NULL", fn);
    IKV_CHECK_STRUCT(block, sizeof(ikv_block_desc), fn);
    *out = ikv::read_config(*block, ikv_block_desc_default());
    return ikv::check_block_desc(*out, fn);
}

}  // namespace

extern "C" {

IKV_API ikv_block_desc ikv_block_desc_default(void) {
    ikv_block_desc d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.kind = IKV_KIND_OTHER;
    d.policy = IKV_POLICY_ATTEND;
    d.score = 0.5f;
    d.precision_hint = IKV_FMT_AUTO;
    return d;
}

IKV_API ikv_status ikv_layout_create(ikv_layout **out) {
    IKV_CHECK_NULL(out, "ikv_layout_create");
    ikv_layout *l = ikv::new_handle<ikv_layout>();
    if (l == nullptr) return ikv::fail(IKV_E_NOMEM, "ikv_layout_create: out of host memory");
    *out = l;
    return IKV_OK;
}

IKV_API void ikv_layout_destroy(ikv_layout *layout) { ikv::delete_handle(layout); }

IKV_API ikv_status ikv_layout_clone(const ikv_layout *layout, ikv_layout **out) {
    IKV_CHECK_NULL(layout, "ikv_layout_clone");
    IKV_CHECK_NULL(out, "ikv_layout_clone");
    ikv_layout *l = ikv::new_handle<ikv_layout>(*layout);
    if (l == nullptr) return ikv::fail(IKV_E_NOMEM, "ikv_layout_clone: out of host memory");
    *out = l;
    return IKV_OK;
}

IKV_API ikv_status ikv_layout_add(ikv_layout *layout, const ikv_block_desc *block, uint32_t *id_out) {
    const char *fn = "ikv_layout_add";
    IKV_CHECK_NULL(layout, fn);
    ikv_block_desc d;
    if (ikv_status s = read_desc(block, fn, &d)) return s;
    return ikv::guarded(fn, [&] { return ikv::layout_add(*layout, d, id_out, fn); });
}

IKV_API ikv_status ikv_layout_update(ikv_layout *layout, uint32_t id, const ikv_block_desc *block) {
    const char *fn = "ikv_layout_update";
    IKV_CHECK_NULL(layout, fn);
    ikv_block_desc d;
    if (ikv_status s = read_desc(block, fn, &d)) return s;
    return ikv::guarded(fn, [&] { return ikv::layout_update(*layout, id, d, fn); });
}

IKV_API ikv_status ikv_layout_set_score(ikv_layout *layout, uint32_t id, float score) {
    const char *fn = "ikv_layout_set_score";
    IKV_CHECK_NULL(layout, fn);
    const std::size_t i = ikv::layout_index_of(*layout, id);
    if (i == SIZE_MAX) return ikv::fail(IKV_E_NOT_FOUND, "%s: no block with id %u", fn, id);
    if (!(score >= 0.0f && score <= 1.0f))  // also rejects NaN
        return ikv::fail(IKV_E_INVALID, "%s: score %.9g for block %u is not a finite value in [0, 1]", fn,
                         static_cast<double>(score), id);
    layout->blocks[i].score = score;
    return IKV_OK;
}

IKV_API ikv_status ikv_layout_remove(ikv_layout *layout, uint32_t id) {
    const char *fn = "ikv_layout_remove";
    IKV_CHECK_NULL(layout, fn);
    return ikv::layout_remove(*layout, id, fn);
}

IKV_API size_t ikv_layout_count(const ikv_layout *layout) { return layout == nullptr ? 0 : layout->blocks.size(); }

IKV_API ikv_status ikv_layout_at(const ikv_layout *layout, size_t index, ikv_block_info *out) {
    const char *fn = "ikv_layout_at";
    IKV_CHECK_NULL(layout, fn);
    IKV_CHECK_NULL(out, fn);
    if (index >= layout->blocks.size())
        return ikv::fail(IKV_E_RANGE, "%s: index %zu is out of range; the layout has %zu blocks", fn, index,
                         layout->blocks.size());
    *out = layout->blocks[index];
    return IKV_OK;
}

IKV_API ikv_status ikv_layout_get(const ikv_layout *layout, uint32_t id, ikv_block_info *out) {
    const char *fn = "ikv_layout_get";
    IKV_CHECK_NULL(layout, fn);
    IKV_CHECK_NULL(out, fn);
    const std::size_t i = ikv::layout_index_of(*layout, id);
    if (i == SIZE_MAX) return ikv::fail(IKV_E_NOT_FOUND, "%s: no block with id %u", fn, id);
    *out = layout->blocks[i];
    return IKV_OK;
}

IKV_API ikv_status ikv_layout_find_token(const ikv_layout *layout, uint32_t token, uint32_t *id_out) {
    const char *fn = "ikv_layout_find_token";
    IKV_CHECK_NULL(layout, fn);
    IKV_CHECK_NULL(id_out, fn);
    // The candidate is the last block starting at or before token.
    const std::size_t i = ikv::layout_lower_index(*layout, token == UINT32_MAX ? token : token + 1);
    if (i == 0 || layout->blocks[i - 1].end <= token)
        return ikv::fail(IKV_E_NOT_FOUND, "%s: token %u lies in no block", fn, token);
    *id_out = layout->blocks[i - 1].id;
    return IKV_OK;
}

IKV_API ikv_status ikv_layout_validate(const ikv_layout *layout, uint32_t seq_len) {
    const char *fn = "ikv_layout_validate";
    IKV_CHECK_NULL(layout, fn);
    // In start order, so the sentence names the first block past seq_len.
    for (const ikv_block_info &b : layout->blocks)
        if (b.end > seq_len)
            return ikv::fail(IKV_E_RANGE, "%s: block '%s' (id %u) [%u, %u) ends after seq_len %u", fn, b.name, b.id,
                             b.start, b.end, seq_len);
    return IKV_OK;
}

}  // extern "C"
