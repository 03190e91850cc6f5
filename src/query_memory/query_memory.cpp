#include "query_memory/query_memory.hpp"

#include "cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace {

// cos(a, b) in double; 0 when either is zero.
double cosine(const float *a, const float *b, uint32_t n) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (uint32_t i = 0; i < n; ++i) {
        ab += double(a[i]) * b[i];
        aa += double(a[i]) * a[i];
        bb += double(b[i]) * b[i];
    }
    return aa > 0.0 && bb > 0.0 ? ab / std::sqrt(aa * bb) : 0.0;
}

}  // namespace

void ikv_query_memory::remember(ikv_seq_id seq, uint32_t layer, const float *q, uint32_t n) {
    const uint64_t row = uint64_t(n_q_heads) * head_dim, all = row * n_layers;
    auto it = seqs.find(seq);
    if (it == seqs.end()) {  // first use: built whole aside, then moved in (a bad_alloc leaves nothing behind)
        ikv::SeqQueryMemory fresh;
        fresh.m.assign(all * slots(), 0.0f);
        fresh.weight.assign(n_layers, 0.0f);
        fresh.filled.assign(n_layers, 0);
        fresh.next.assign(n_layers, 0);
        fresh.turn_sum.assign(all, 0.0);
        fresh.turn_n.assign(n_layers, 0);
        it = seqs.emplace(seq, std::move(fresh)).first;
    }
    ikv::SeqQueryMemory &s = it->second;
    double *sum = s.turn_sum.data() + layer * row;
    for (uint32_t t = 0; t < n; ++t)
        for (uint64_t e = 0; e < row; ++e) sum[e] += q[t * row + e];
    s.turn_n[layer] += n;
}

void ikv_query_memory::end_turn(ikv_seq_id seq) {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return;
    ikv::SeqQueryMemory &s = it->second;
    const uint64_t row = uint64_t(n_q_heads) * head_dim;
    for (uint32_t l = 0; l < n_layers; ++l) {
        if (s.turn_n[l] == 0) continue;
        const double inv_n = 1.0 / s.turn_n[l];
        double *sum = s.turn_sum.data() + l * row;
        if (turns == 0) {
            // m = (mean + decay * W * m) / (1 + decay * W): the turns' means weighted decay^age.
            const double old = double(decay) * s.weight[l];
            float *m = s.m.data() + l * row;
            for (uint64_t e = 0; e < row; ++e) m[e] = float((sum[e] * inv_n + old * m[e]) / (1.0 + old));
            s.weight[l] = float(1.0 + old);
        } else {  // the turn's mean takes the ring's next slot (the oldest once full)
            float *m = s.m.data() + (uint64_t(l) * turns + s.next[l]) * row;
            for (uint64_t e = 0; e < row; ++e) m[e] = float(sum[e] * inv_n);
            s.next[l] = (s.next[l] + 1) % turns;
            s.filled[l] = std::min(s.filled[l] + 1, turns);
        }
        std::fill(sum, sum + row, 0.0);
        s.turn_n[l] = 0;
    }
}

bool ikv_query_memory::recall(ikv_seq_id seq, uint32_t layer, uint32_t head0, uint32_t n, const float *q,
                              float *out) const {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return false;
    const ikv::SeqQueryMemory &s = it->second;
    const uint64_t row = uint64_t(n_q_heads) * head_dim, D = head_dim;
    if (turns == 0) {
        if (s.weight[layer] == 0.0f) return false;
        const float *m = s.m.data() + layer * row + head0 * D;
        std::copy(m, m + n * D, out);
        return true;
    }
    const uint32_t filled = s.filled[layer];
    if (filled == 0) return false;
    for (uint32_t g = 0; g < n; ++g) {
        // Newest first; a later (older) turn wins only when strictly more similar.
        const float *best = nullptr;
        double best_cos = 0.0;
        for (uint32_t age = 0; age < filled; ++age) {
            const uint32_t slot = (s.next[layer] + turns - 1 - age) % turns;
            const float *m = s.m.data() + (uint64_t(layer) * turns + slot) * row + (head0 + g) * D;
            const double c = cosine(q + g * D, m, head_dim);
            if (best == nullptr || c > best_cos) best = m, best_cos = c;
        }
        std::copy(best, best + D, out + g * D);
    }
    return true;
}

ikv_query_memory::~ikv_query_memory() { forget(nullptr); }

ikv_status ikv_query_memory::end_turn_everywhere(ikv_seq_id seq, const char *fn) {
    auto it = seqs.find(seq);
    if (it == seqs.end()) return IKV_OK;
    if (device < 0) {
        end_turn(seq);
        return IKV_OK;
    }
    // Everything that can fail for want of memory comes first: then nothing changed.
    ikv_status st = ikv::cuda_query_memory_reserve(*this, it->second, fn);
    if (st != IKV_OK) return st;
    end_turn(seq);
    return ikv::cuda_query_memory_upload(*this, it->second, fn);
}

void ikv_query_memory::forget(const ikv_seq_id *seq) {
    if (seq != nullptr) {
        auto it = seqs.find(*seq);
        if (it == seqs.end()) return;
        ikv::cuda_query_memory_free(*this, it->second);
        seqs.erase(it);
        return;
    }
    for (auto &kv : seqs) ikv::cuda_query_memory_free(*this, kv.second);
    seqs.clear();
}
