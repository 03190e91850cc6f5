// Attention feedback of CUDA decodes without a host wait: the decode's
// kernels write each list entry's share into the decoder's device workspace
// (kernels/attention_feedback.cu), and this copies them into pinned host
// memory on the decode's stream and records an event. The shares join the
// averages (ikv_page_feedback) at the next call that uses the feedback, which
// waits for that event: in an engine's loop the previous step's copy has
// long finished, so the step never waits for its own kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "feedback/page_feedback.hpp"
#include "ikv_kernels.h"

namespace ikv {

class CudaPendingShares final : public PendingShares {
public:
    CudaPendingShares() = default;
    ~CudaPendingShares() override;
    CudaPendingShares(const CudaPendingShares &) = delete;
    CudaPendingShares &operator=(const CudaPendingShares &) = delete;

    // Room for a decode of n_seqs sequences x n_kv_heads lists of `stride`
    // entries: settles fb first when the buffers must grow while a copy reads
    // into them. Before any kernel is enqueued (an error leaves nothing).
    ikv_status reserve(ikv_page_feedback &fb, uint32_t n_seqs, uint32_t n_kv_heads, uint32_t stride, const char *fn);
    // After the decode's feedback kernel: settle fb (the previous decode's
    // shares), then enqueue the copies of o's counts, shares and pages (sized
    // by reserve) on `stream` and note whose they are.
    ikv_status enqueue(ikv_page_feedback &fb, const cuda::FeedbackOut &o, const ikv_seq_id *seqs, uint32_t n_seqs,
                       uint32_t n_kv_heads, uint32_t layer, cudaStream_t stream, const char *fn);

    bool in_flight() const override { return in_flight_; }
    ikv_status fold(ikv_page_feedback &fb) override;

private:
    // Pinned: counts[BH] | shares[BH * stride] | pages[BH * stride]
    uint8_t *pinned_ = nullptr;
    uint64_t capacity_ = 0;  // list entries (BH * stride) the buffer holds
    uint32_t capacity_lists_ = 0;
    cudaEvent_t copied_ = nullptr;
    bool in_flight_ = false;
    // The decode the copy belongs to.
    std::vector<ikv_seq_id> seqs_;
    uint32_t n_kv_heads_ = 0, layer_ = 0, stride_ = 0, n_lists_ = 0;
    // One list's entries merged per page (a page's entries summed).
    std::vector<uint32_t> run_pages_;
    std::vector<float> run_shares_;
};

}  // namespace ikv
