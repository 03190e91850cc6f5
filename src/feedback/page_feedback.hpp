// The attention-feedback handle (ikv_page_feedback, include/intentkv.h): per
// sequence, layer, kv-head and page, an exponential moving average of the
// share of the softmax the page received in the decodes that read it.
// decode/cpu_decode.cpp measures the shares and calls add_step.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "intentkv.h"

struct ikv_page_feedback {
    const ikv_pool *pool;
    uint32_t n_layers, n_kv_heads;
    float rate;
    // seq -> [layer][kv_head] -> per-page average (grown to the highest page fed back)
    std::unordered_map<ikv_seq_id, std::vector<std::vector<float>>> seqs;

    // The averages of (seq, layer, head), or nullptr when nothing was fed back there.
    const std::vector<float> *averages(ikv_seq_id seq, uint32_t layer, uint32_t head) const;
    // One step's shares of (seq, layer, head): pages[i] received share[i]
    // (pages listed once each): ema = (1 - rate) * ema + rate * share.
    void add_step(ikv_seq_id seq, uint32_t layer, uint32_t head, const uint32_t *pages, const float *share, uint32_t n);
};
