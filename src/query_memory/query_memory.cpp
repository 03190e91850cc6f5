#include "query_memory/query_memory.hpp"

#include <algorithm>
#include <utility>

void ikv_query_memory::remember(ikv_seq_id seq, uint32_t layer, const float *q, uint32_t n) {
    const uint64_t row = uint64_t(n_q_heads) * head_dim, all = row * n_layers;
    auto it = seqs.find(seq);
    if (it == seqs.end()) {  // first use: built whole aside, then moved in (a bad_alloc leaves nothing behind)
        ikv::SeqQueryMemory fresh;
        fresh.m.assign(all, 0.0f);
        fresh.weight.assign(n_layers, 0.0f);
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
        // m = (mean + decay * W * m) / (1 + decay * W): the turns' means weighted decay^age.
        const double old = double(decay) * s.weight[l], inv_n = 1.0 / s.turn_n[l];
        float *m = s.m.data() + l * row;
        double *sum = s.turn_sum.data() + l * row;
        for (uint64_t e = 0; e < row; ++e) {
            m[e] = float((sum[e] * inv_n + old * m[e]) / (1.0 + old));
            sum[e] = 0.0;
        }
        s.weight[l] = float(1.0 + old);
        s.turn_n[l] = 0;
    }
}

const float *ikv_query_memory::queries(ikv_seq_id seq, uint32_t layer) const {
    auto it = seqs.find(seq);
    if (it == seqs.end() || it->second.weight.empty() || it->second.weight[layer] == 0.0f) return nullptr;
    return it->second.m.data() + uint64_t(layer) * n_q_heads * head_dim;
}
