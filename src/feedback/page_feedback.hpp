// The attention-feedback handle (ikv_page_feedback, include/intentkv.h): per
// sequence, layer, kv-head and page, an exponential moving average of the
// share of the softmax the page received in the decodes that read it.
// decode/cpu_decode.cpp measures the shares: it calls reserve before the
// step's kernels (all allocation happens there) and add_step after them.
// A CUDA decode (cuda/cuda_feedback.cpp) leaves its shares on their way back
// to the host and returns; whoever next uses the averages settles them first.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "intentkv.h"

namespace ikv {

// One (sequence, layer, kv-head)'s averages.
struct PageAverages {
    std::vector<float> avg;    // per page; room may run ahead of what was fed back
    std::vector<uint8_t> fed;  // per page: 1 once a decode fed it back (its average may still be 0)
    uint32_t n_fed = 0;        // highest page fed back + 1
};

// One decode's shares still in flight from a device (CUDA pools): the decode
// enqueued their copy into host memory and returned without waiting, so a
// step's feedback costs no host synchronization; they join the averages at
// the next call that uses them (ikv_page_feedback::settle).
struct PendingShares {
    virtual ~PendingShares() = default;  // waits for a copy in flight (its memory is freed)
    virtual bool in_flight() const = 0;
    // Wait for the copy and add its shares (add_step); nothing is in flight
    // after, also on error (IKV_E_DEVICE: the copy failed, its shares are lost).
    virtual ikv_status fold(ikv_page_feedback &fb) = 0;
};

}  // namespace ikv

struct ikv_page_feedback {
    const ikv_pool *pool;
    uint32_t n_layers, n_kv_heads;
    float rate;
    std::unordered_map<ikv_seq_id, std::vector<ikv::PageAverages>> seqs;  // seq -> [layer][kv_head]
    std::unique_ptr<ikv::PendingShares> device_shares;  // CUDA pools: created by the first decode

    // Fold the shares of a decode still in flight (CUDA pools), so that the
    // averages hold every decode before this call. Logically const: what a
    // reader sees is what the decodes it follows wrote.
    ikv_status settle() const;

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
