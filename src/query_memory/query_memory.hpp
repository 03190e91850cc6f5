// The query-memory handle (ikv_query_memory, include/intentkv.h): per
// sequence, layer and query head, what earlier turns asked, and the sums of
// the turn in progress. Two forms (ikv_query_memory_config.turns):
//   turns == 0: one query, the decayed mean of every ended turn's mean;
//   turns >= 1: the last `turns` turns' means kept apart; each query head
//     recalls the one most similar (cosine) to its current query.
// Query-aware selection scores pages with the recalled queries too
// (decode/cpu_decode.cpp).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "intentkv.h"

namespace ikv {

struct SeqQueryMemory {
    // [layers][slots][q_heads][head_dim]: slots = max(turns, 1); the decayed
    // mean (turns == 0) or a ring of the last turns' means
    std::vector<float> m;
    std::vector<float> weight;    // [layers]: W of the header's fold (turns == 0); 0 = nothing remembered yet
    std::vector<uint32_t> filled; // [layers]: remembered turns (turns >= 1), at most `turns`
    std::vector<uint32_t> next;   // [layers]: the ring slot the next ended turn takes (turns >= 1)
    std::vector<double> turn_sum; // [layers][q_heads][head_dim]: this turn's queries summed
    std::vector<uint32_t> turn_n; // [layers]: query tokens summed this turn
    // A CUDA pool's memory: the device copy of the ended turns (m and, per
    // layer, how many are kept and where the next goes) that decodes read,
    // written at each end_turn (src/cuda/cuda_query_memory.cpp); nullptr
    // until the sequence's first ended turn.
    void *device = nullptr;
    std::vector<uint32_t> device_header;  // host scratch of its {filled, next} per layer, sized with it
};

}  // namespace ikv

struct ikv_query_memory {
    const ikv_pool *pool;
    uint32_t n_layers, n_q_heads, head_dim;
    float decay;
    uint32_t turns;  // 0: the decayed mean; else the turns kept apart
    int device = -1; // the CUDA pool's device (its sequences have device copies), or -1
    std::unordered_map<ikv_seq_id, ikv::SeqQueryMemory> seqs;

    ~ikv_query_memory();
    // The ring slots kept per layer: max(turns, 1).
    uint32_t slots() const { return turns > 0 ? turns : 1; }
    // Ends seq's turn (end_turn) and, on a CUDA pool, writes its device copy
    // (allocated first: on IKV_E_NOMEM nothing changed).
    ikv_status end_turn_everywhere(ikv_seq_id seq, const char *fn);
    // Forgets seq (all of them: seq == nullptr) with their device copies.
    void forget(const ikv_seq_id *seq);

    // Adds n query tokens (fp32, [t][q_head][head_dim]) to seq's current turn at layer.
    void remember(ikv_seq_id seq, uint32_t layer, const float *q, uint32_t n);
    // Folds seq's current turn into its memory (the header's formula).
    void end_turn(ikv_seq_id seq);
    // The remembered queries of query heads [head0, head0 + n) of seq at
    // layer into out ([n][head_dim]), given those heads' current queries q
    // ([n][head_dim], any positive scale): the mean, or per head the most
    // similar remembered turn. false (out untouched) when seq has nothing
    // remembered at layer.
    bool recall(ikv_seq_id seq, uint32_t layer, uint32_t head0, uint32_t n, const float *q, float *out) const;
};
