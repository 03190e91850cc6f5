#include "feedback/page_feedback.hpp"

#include <algorithm>

const std::vector<float> *ikv_page_feedback::averages(ikv_seq_id seq, uint32_t layer, uint32_t head) const {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return nullptr;
    const std::vector<float> &a = it->second[uint64_t(layer) * n_kv_heads + head];
    return a.empty() ? nullptr : &a;
}

void ikv_page_feedback::add_step(ikv_seq_id seq, uint32_t layer, uint32_t head, const uint32_t *pages,
                                 const float *share, uint32_t n) {
    std::vector<std::vector<float>> &s = seqs[seq];
    if (s.empty()) s.resize(uint64_t(n_layers) * n_kv_heads);
    std::vector<float> &a = s[uint64_t(layer) * n_kv_heads + head];
    uint32_t top = 0;
    for (uint32_t i = 0; i < n; ++i) top = std::max(top, pages[i] + 1);
    if (a.size() < top) a.resize(top, 0.0f);
    for (uint32_t i = 0; i < n; ++i) a[pages[i]] = (1.0f - rate) * a[pages[i]] + rate * share[i];
}
