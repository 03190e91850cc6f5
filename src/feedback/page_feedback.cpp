#include "feedback/page_feedback.hpp"

#include <algorithm>

ikv_status ikv_page_feedback::settle() const {
    if (device_shares == nullptr || !device_shares->in_flight()) return IKV_OK;
    // The handle is never created const (ikv_page_feedback_create): casting the qualifier away is defined.
    return device_shares->fold(const_cast<ikv_page_feedback &>(*this));
}

const ikv::PageAverages *ikv_page_feedback::averages(ikv_seq_id seq, uint32_t layer, uint32_t head) const {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return nullptr;
    const ikv::PageAverages &a = it->second[uint64_t(layer) * n_kv_heads + head];
    return a.n_fed == 0 ? nullptr : &a;
}

void ikv_page_feedback::reserve(ikv_seq_id seq, uint32_t layer, uint32_t head, uint32_t n_pages) {
    auto it = seqs.find(seq);
    if (it == seqs.end())  // sized aside, then moved in
        it = seqs.emplace(seq, std::vector<ikv::PageAverages>(uint64_t(n_layers) * n_kv_heads)).first;
    ikv::PageAverages &a = it->second[uint64_t(layer) * n_kv_heads + head];
    if (a.avg.size() < n_pages) a.avg.resize(n_pages, 0.0f);
    if (a.fed.size() < n_pages) a.fed.resize(n_pages, 0);
}

void ikv_page_feedback::add_step(ikv_seq_id seq, uint32_t layer, uint32_t head, const uint32_t *pages,
                                 const float *share, uint32_t n) {
    ikv::PageAverages &a = seqs.find(seq)->second[uint64_t(layer) * n_kv_heads + head];
    for (uint32_t i = 0; i < n; ++i) {
        a.avg[pages[i]] = (1.0f - rate) * a.avg[pages[i]] + rate * share[i];
        a.fed[pages[i]] = 1;
        a.n_fed = std::max(a.n_fed, pages[i] + 1);
    }
}
