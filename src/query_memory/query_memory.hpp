// The query-memory handle (ikv_query_memory, include/intentkv.h): per
// sequence, layer and query head, the decayed mean of earlier turns' queries,
// and the sums of the turn in progress. Query-aware selection scores pages
// with these queries too (decode/cpu_decode.cpp).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "intentkv.h"

namespace ikv {

struct SeqQueryMemory {
    std::vector<float> m;         // [layers][q_heads][head_dim]: the remembered query
    std::vector<float> weight;    // [layers]: W of the header's fold; 0 = nothing remembered yet
    std::vector<double> turn_sum; // [layers][q_heads][head_dim]: this turn's queries summed
    std::vector<uint32_t> turn_n; // [layers]: query tokens summed this turn
};

}  // namespace ikv

struct ikv_query_memory {
    const ikv_pool *pool;
    uint32_t n_layers, n_q_heads, head_dim;
    float decay;
    std::unordered_map<ikv_seq_id, ikv::SeqQueryMemory> seqs;

    // Adds n query tokens (fp32, [t][q_head][head_dim]) to seq's current turn at layer.
    void remember(ikv_seq_id seq, uint32_t layer, const float *q, uint32_t n);
    // Folds seq's current turn into its memory (the header's formula).
    void end_turn(ikv_seq_id seq);
    // seq's remembered queries at layer ([q_heads][head_dim]), or nullptr when none.
    const float *queries(ikv_seq_id seq, uint32_t layer) const;
};
