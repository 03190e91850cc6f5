// The attention-feedback handle (ikv_page_feedback, include/intentkv.h): per
// sequence, layer, kv-head and page, an exponential moving average of the
// share of the softmax the page received in the decodes that read it.
// decode/cpu_decode.cpp measures the shares: it calls reserve before the
// step's kernels (all allocation happens there) and add_step after them.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "intentkv.h"

namespace ikv {

// One (sequence, layer, kv-head)'s averages.
struct PageAverages {
    std::vector<float> avg;  // per page; room may run ahead of what was fed back
    uint32_t n_fed = 0;      // highest page fed back + 1
};

}  // namespace ikv

struct ikv_page_feedback {
    const ikv_pool *pool;
    uint32_t n_layers, n_kv_heads;
    float rate;
    std::unordered_map<ikv_seq_id, std::vector<ikv::PageAverages>> seqs;  // seq -> [layer][kv_head]

    // The averages of (seq, layer, head), or nullptr when nothing was fed back there.
    const ikv::PageAverages *averages(ikv_seq_id seq, uint32_t layer, uint32_t head) const;
    // Room for pages [0, n_pages) of (seq, layer, head); may throw std::bad_alloc
    // (what it added is invisible: no page counts as fed back).
    void reserve(ikv_seq_id seq, uint32_t layer, uint32_t head, uint32_t n_pages);
    // One step's shares of (seq, layer, head), whose room was reserved: pages[i]
    // received share[i] (pages listed once each): ema = (1 - rate) * ema + rate * share.
    // No allocation.
    void add_step(ikv_seq_id seq, uint32_t layer, uint32_t head, const uint32_t *pages, const float *share, uint32_t n);
};
